"""What a command runs: the plan the CLI builds and the runner executes, and its JSON.

A plan crosses a process boundary twice (the traced child of --trace-io, torchrun's ranks), so
it is serialised whole: every field of every option, read from the dataclasses themselves, so a
new option reaches the child without a list to keep up to date. Torch-free and imports nothing
of the runner's: the steps, the launcher and the CLI all read it.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from dlscope.config import TrainConfig
from dlscope.options import RunOptions, StepOptions


@dataclass
class Plan:
    command: str
    steps: list[str]
    config: TrainConfig = field(default_factory=TrainConfig)
    options: RunOptions = field(default_factory=RunOptions)
    step_options: StepOptions = field(default_factory=StepOptions)
    argv: list[str] = field(default_factory=lambda: sys.argv[1:])


def plan_to_json(plan: Plan, out: str) -> str:
    """The plan, writing into the run directory `out` (the one the parent created)."""
    return json.dumps(dataclasses.asdict(dataclasses.replace(plan, options=dataclasses.replace(plan.options, out=out))))


def plan_from_json(text: str) -> Plan:
    return decode(Plan, json.loads(text))


def decode(kind: Any, value: Any) -> Any:
    """`value` (as json.loads gives it) rebuilt as `kind`: a dataclass from its fields' hints,
    tuples and lists item by item, `X | None` as X or None."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if value is None:
        return None
    if origin in (typing.Union, types.UnionType):
        return decode(next(a for a in args if a is not type(None)), value)
    if dataclasses.is_dataclass(kind):
        hints = typing.get_type_hints(kind)
        return kind(**{f.name: decode(hints[f.name], value[f.name]) for f in dataclasses.fields(kind) if f.init})
    if origin is tuple:
        items = args[:1] * len(value) if len(args) == 2 and args[1] is Ellipsis else args
        return tuple(decode(a, v) for a, v in zip(items, value, strict=True))
    if origin is list:
        return [decode(args[0], v) for v in value]
    if origin is dict:
        return {k: decode(args[1], v) for k, v in value.items()}
    return value
