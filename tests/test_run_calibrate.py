"""dlscope's own cost per step, calibrated in the observed process on a real tiny step: what it
measures goes through the hooks a real step goes through, and leaves torch as it found it."""

from __future__ import annotations

import os
import subprocess
import sys

import torch
from torch.nn.modules import module as torch_module
from torch.optim import optimizer as torch_optimizer

from dlscope.analysis.stepfile import read_records
from dlscope.injob import calibrate
from dlscope.injob.hooks import TorchHooks
from dlscope.injob.recorder import RecordFile
from dlscope.injob.stepmachine import StepMachine


def global_hooks() -> list[int]:
    return [
        len(torch_module._global_forward_pre_hooks),
        len(torch_module._global_forward_hooks),
        len(torch_optimizer._global_optimizer_pre_hooks),
        len(torch_optimizer._global_optimizer_post_hooks),
    ]


def test_calibration_runs_the_hooked_step_and_leaves_torch_as_it_was(tmp_path, monkeypatch):
    torch.optim.SGD([torch.zeros(1, requires_grad=True)])  # torch wraps SGD.step at its first instance
    torch_state = (
        global_hooks,
        lambda: torch.autograd.backward,
        lambda: torch.autograd.grad,
        lambda: torch.optim.SGD.__dict__.get("step"),
        lambda: calibrate._Optimizer.__dict__["step"],  # its optimizer's `step`, timed in the hooked bursts only
    )
    before = ([state() for state in torch_state], torch.get_num_threads(), torch.random.get_rng_state())
    machines: list[StepMachine] = []
    made = StepMachine.__init__

    def kept(self, *args, **kwargs):
        made(self, *args, **kwargs)
        machines.append(self)

    monkeypatch.setattr(StepMachine, "__init__", kept)
    step_us, loader_us = calibrate.per_step_us(TorchHooks, torch)
    # the hooked bursts ran through the hooks, each after the step that finds the module to time
    [machine] = machines  # the scratch observer's
    assert machine.counts["optimizer"] == calibrate.ROUNDS * (calibrate.STEPS + 1)
    assert step_us >= 0 and loader_us >= 0  # a cost (never negative), whatever the load
    after = ([state() for state in torch_state], torch.get_num_threads(), torch.random.get_rng_state())
    assert after[:2] == before[:2] and torch.equal(after[2], before[2])


def test_calibration_is_recorded_in_the_observers_records_only(tmp_path):
    observer = TorchHooks(RecordFile(str(tmp_path)), (1, 0, 0, 0))
    calibrate.record(observer, torch)
    [record] = read_records(tmp_path)[os.getpid()]
    assert record["k"] == "calibration" and record["per_step_us"] >= 0
    assert observer.machine.counts == {"optimizer": 0, "backward": 0}  # its steps were a scratch observer's
    assert not list(tmp_path.glob("*.steps")) and not list(tmp_path.glob("live-*"))


# a process that imports torch and is calibrated, as a script without a torch optimizer is
WITHOUT_OPTIMIZER = """
import sys
import torch
from dlscope.injob import calibrate
from dlscope.injob.hooks import TorchHooks
calibrate.per_step_us(TorchHooks, torch)
print("torch._dynamo" in sys.modules)
"""


def test_calibration_leaves_torch_dynamo_unimported():
    # torch imports torch._dynamo (1-2 s) at a torch optimizer's creation: a script with a
    # hand-written update never pays it, and must not pay it for dlscope's calibration
    out = subprocess.run([sys.executable, "-c", WITHOUT_OPTIMIZER], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False"]
