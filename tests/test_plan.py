"""A plan crosses into the traced child and torchrun's ranks whole: every option of every step."""

from __future__ import annotations

import dataclasses

from dlscope.config import TrainConfig
from dlscope.options import (
    AnatomyOptions,
    ConvShape,
    DistOptions,
    GraphOptions,
    OpsOptions,
    PipelineOptions,
    RunOptions,
    StepOptions,
    SweepPlan,
    TraceOptions,
    TrainOptions,
)
from dlscope.plan import Plan, plan_from_json, plan_to_json


def test_every_field_of_every_step_option_survives_the_json():
    steps = StepOptions(
        train=TrainOptions(resume="ck/last.pt", epochs=4),
        graph=GraphOptions(compile=True, repeats=3, batch_size=8),
        ckpt_anatomy=AnatomyOptions(keras_seed=True, keras_backend="tensorflow"),
        pipeline=PipelineOptions(plan=SweepPlan(workers=((1, 2),), engines=("dlscope", "tfdata")), remove_data=True),
        iotrace=TraceOptions(command=["python", "x.py"], backend="strace", repeats=2),
        dist=DistOptions(nproc_per_node=2, ckpt_format="dcp", bucket_cap_mb=1.5),
        ops=OpsOptions(parts=("conv",), shape=ConvShape(2, 3, 8, 8, 4, 3, 3, 1, 1), memory_batch_sizes=[4]),
    )
    plan = Plan("lab", ["train", "ops"], TrainConfig(epochs=3, seed=7), RunOptions(data_dir="d"), steps, ["lab"])
    back = plan_from_json(plan_to_json(plan, "runs/x"))
    assert back == dataclasses.replace(plan, options=RunOptions(out="runs/x", data_dir="d"))
    # every option class, defaults included, comes back as the same types (tuples stay tuples)
    assert plan_from_json(plan_to_json(Plan("lab", []), "o")).step_options == StepOptions()


def test_every_registered_step_is_the_one_its_name_says():
    # the registry imports a step's module only when a plan runs it; each name must lead to its step,
    # and every step a command runs must have a renderer for its section
    from dlscope.cli.lab import LAB_STEPS
    from dlscope.report.sections import SECTIONS
    from dlscope.stages.registry import STEP_MODULES, step_named

    assert set(LAB_STEPS) <= set(STEP_MODULES)
    for name in STEP_MODULES:
        assert step_named(name).name == name and name in SECTIONS
