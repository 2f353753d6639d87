"""Blocks on the terminal: the same tables as the report, readable at 80 columns, more at 120."""

from __future__ import annotations

import io
import os
import time
from pathlib import Path

from rich.console import Console

from dlscope.report.blocks import Code, Findings, Para, Table
from dlscope.report.terminal import print_blocks

OPS = Table(
    ["operator", "calls", "self ms", "self %", "total ms", "µs/call", "MFLOP"],
    [
        ["convolution_backward", 2, 205.9, 31.78, 206.1, 103019.0, None],
        ["max_pool2d_with_indices_backward", 2, 29.78, 4.6, 60.3, 30195.0, None],
        ["mm", 2, 62.55, 9.65, 62.6, 31277.0, 8.03],
    ],
    "top 10 operators per training step",
    legend="self: time in the operator itself; total: with the operators it calls.",
    optional=("total ms", "MFLOP"),
)


def render(blocks, width: int) -> list[str]:
    out = io.StringIO()
    print_blocks(blocks, Console(file=out, width=width, color_system=None, theme=None))
    return out.getvalue().splitlines()


def test_no_line_is_wider_than_the_terminal_and_no_cell_is_cut():
    for width in (60, 80, 120):
        lines = render([OPS], width)
        assert max(len(line) for line in lines) <= width, (width, lines)
        text = "\n".join(lines)
        for cell in ("convolution_backward", "205.9", "103,019", "31.78"):
            assert cell in text, (width, cell, text)
        assert "…" not in text


def test_narrow_terminals_leave_out_optional_columns_and_say_so():
    narrow = "\n".join(render([OPS], 80))
    wide = "\n".join(render([OPS], 120))
    assert "total ms" not in narrow.splitlines()[1] and "total ms" in wide.splitlines()[1]
    assert "not shown at 80 columns: total ms" in narrow
    assert "not shown" not in wide


def test_a_table_too_wide_for_any_layout_becomes_rows_of_label_and_value():
    table = Table([f"column {i}" for i in range(12)], [[f"value-{i}" for i in range(12)]])
    lines = render([table], 50)
    assert max(len(line) for line in lines) <= 50
    assert any(line.startswith("column 11") and "value-11" in line for line in lines)


def test_a_path_too_long_for_its_column_keeps_its_end_on_one_line():
    """A file table at 80 columns: each path keeps its file name, one row a line, not folded
    over lines (or, narrower still, wrapped whole: never cut to a stub)."""
    paths = [
        f"/home/student/project/.venv/lib/python3.11/site-packages/pkg/sub/module_{i}.cpython-311.pyc" for i in range(3)
    ]
    table = Table(
        ["path", "category", "reads", "bytes read", "ms", "phases"],
        [[p, "python module", 2, 517_168, 0.3, "startup → train_steps"] for p in paths],
        optional=("phases",),
        paths=("path",),
    )
    lines = [line for line in render([table], 80) if line]
    assert max(len(line) for line in lines) <= 80
    assert len(lines) == 1 + len(paths) + 1  # header, a line a path, what was not shown
    for line, path in zip(lines[1:], paths, strict=False):
        kept = line.split("  ")[0]
        assert kept.startswith("…") and path.endswith(kept[1:]) and kept.endswith(".cpython-311.pyc")
        assert len(kept) >= 24
    whole = "\n".join(render([table], 200))
    assert all(p in whole for p in paths) and "…" not in whole
    narrow = "".join(line.strip() for line in render([table], 40))  # too narrow to keep a path's end
    assert all(p in narrow for p in paths)


def test_untrusted_text_is_printed_literally():
    hostile = "[/x]markup[bold] \x1b]0;owned\x07 \x1b[2J"
    lines = render([Para(hostile), Findings([("bad", hostile)]), Code(hostile), Table(["name"], [[hostile]])], 80)
    text = "\n".join(lines)
    assert "[/x]markup[bold]" in text and "\x1b" not in text and "\\x1b]0;owned\\x07" in text


def test_numbers_are_right_aligned():
    lines = render([Table(["name", "bytes"], [["a", 5], ["b", 123456]])], 80)
    rows = [line for line in lines if line.startswith(("a ", "b "))]
    assert rows[0].rstrip().endswith("5") and rows[1].rstrip().endswith("123,456")
    assert len(rows[0].rstrip()) == len(rows[1].rstrip())


def test_code_folds_at_the_terminal_edge_with_a_hanging_indent():
    line = "MaxPool2d(kernel_size=2, stride=2, padding=0, dilation=1, ceil_mode=False) # " + "x" * 100
    diff = "- loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers)"
    lines = [x for x in render([Code(line + "\n" + diff + "\n+ short")], 80) if x.strip()]
    # a word wider than the edge (a path) is never cut: whole, on a line of its own, for the terminal
    # to wrap, so a command copied from it still runs
    assert [x.strip() for x in lines if len(x) > 80] == ["x" * 100]
    first = lines[: next(i for i, x in enumerate(lines) if x.startswith("- loader"))]
    assert "".join(x.strip() for x in first).replace(" ", "") == line.replace(" ", "")  # nothing lost
    # each folded part reads as the same line: indented, never starting at column 0 like a line of its own
    starts = [x for x in lines if not x.startswith(" ")]
    assert starts == [lines[0], next(x for x in lines if x.startswith("- loader")), "+ short"]
    assert lines[-2].strip() == "num_workers=args.workers)" and lines[-2].startswith("    ")


def test_short_text_columns_are_not_padded_past_the_edge():
    rows = [["MaxPool2DWithIndicesBackward0", "result1", "128×32×7×7", "i64", 1605632]] * 3
    table = Table(["backward node", "saved", "shape", "dtype", "bytes"], rows)
    lines = render([table], 80)
    assert max(len(line) for line in lines) <= 80
    assert all(line.rstrip().endswith("1,605,632") for line in lines if line.startswith("MaxPool"))


def test_where_everything_is_never_folds_a_path_at_80_columns(tmp_path, monkeypatch, capsys):
    """A run named by its time (runs/lab-<date>-<time>) makes the paths too wide for a table
    with hints at 80 columns: the hint that holds the run's path (`dlscope tensorboard RUN`) must
    still come whole, on a line of its own, never folded in the middle of the path."""
    from types import SimpleNamespace

    from dlscope.console import console
    from dlscope.runner import print_locations

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(console, "width", 80)
    path = Path("runs/lab-20261125-024836")
    (path / "tensorboard").mkdir(parents=True)
    (path / "tensorboard" / "events").write_text("x")
    run = SimpleNamespace(path=path, results={"run": {"status": "ok", "wall_seconds": 1.0}}, started=time.time())
    print_locations(run, path / "report.html", path / "report.md")
    lines = capsys.readouterr().out.splitlines()
    assert any(f"dlscope tensorboard {path}" in line for line in lines)
    for whole in (path / "report.html", path / "results.json", path / "tensorboard"):
        assert any(str(whole) in line for line in lines), whole
    # each hint follows its path, so "and report.md" goes on from report.html
    report = next(i for i, line in enumerate(lines) if line.startswith("report:"))
    assert str(path / "report.html") in lines[report] and lines[report + 1].strip().startswith("and report.md")


def test_where_everything_is_lists_only_what_this_run_wrote(tmp_path, capsys):
    """An --out given again keeps an earlier run's folders (its iotrace, from --trace-io): the
    list names a folder only when this run wrote into it."""
    from types import SimpleNamespace

    from dlscope.runner import print_locations

    (tmp_path / "iotrace").mkdir()
    (tmp_path / "iotrace" / "events.jsonl").write_text("{}")
    (tmp_path / "tensorboard" / "train").mkdir(parents=True)
    earlier = time.time() - 3600
    for entry in (tmp_path / "iotrace", tmp_path / "iotrace" / "events.jsonl"):
        os.utime(entry, (earlier, earlier))
    run = SimpleNamespace(path=tmp_path, results={"run": {"status": "ok", "wall_seconds": 1.0}}, started=time.time())
    (tmp_path / "tensorboard" / "train" / "events").write_text("x")  # written by this run, one level down
    print_locations(run, tmp_path / "report.html", tmp_path / "report.md")
    printed = capsys.readouterr().out
    assert "tensorboard" in printed and "iotrace" not in printed
