"""`from dlscope.observe.script.records import StepFile`, as earlier releases documented it: the
reader of a process's step rows is dlscope.analysis.stepfile now (the layout, dlscope.contract.records)."""

from dlscope.analysis.stepfile import StepFile, read_records, step_files

__all__ = ["StepFile", "read_records", "step_files"]
