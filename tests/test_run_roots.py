"""The forward of a step is timed on the modules called at top level: found while torch's global
module hooks run (until the next step ends), then timed by a call of their own, so submodules
never reach dlscope. In-process, on a scratch observer (as the calibration drives it)."""

from __future__ import annotations

import copy
import io
import os
import pickle
import time

import torch
from torch import nn
from torch.nn.modules import module as torch_module

from dlscope.analysis.stepfile import StepFile
from dlscope.injob.hooks import TorchHooks
from dlscope.injob.recorder import RecordFile

SLOW_LOSS_S = 0.02


class SlowLoss(nn.Module):
    """A loss module that takes at least SLOW_LOSS_S: its time is the step's forward."""

    def forward(self, output: torch.Tensor) -> torch.Tensor:
        time.sleep(SLOW_LOSS_S)
        return output.sum()


def global_module_hooks() -> int:
    return len(torch_module._global_forward_pre_hooks) + len(torch_module._global_forward_hooks)


def observed(tmp_path):
    hooks = TorchHooks(RecordFile(str(tmp_path)), (1, 0, 0, 0))
    hooks.torch, hooks.is_compiling = torch, torch.compiler.is_compiling
    remove = hooks.step_hooks(torch)
    torch.optim.SGD([nn.Parameter(torch.zeros(1))])  # torch wraps SGD.step at a first instance
    hooks.time_optimizer(torch.optim.SGD)  # as an optimizer's creation does in a job
    return hooks, remove


def timed(module: nn.Module) -> bool:
    return type(module).__call__ is not nn.Module.__call__


def steps_of(hooks: TorchHooks, tmp_path) -> list:
    """The optimizer's steps (the first backward() also ends a step of the backward stream)."""
    hooks.records.close_steps()
    return [row for row in StepFile(tmp_path / f"{os.getpid()}.steps").read() if row["src"] == 0]


def test_top_level_modules_are_timed_on_their_own_after_the_first_step(tmp_path):
    before = global_module_hooks()
    hooks, remove = observed(tmp_path)
    try:
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        loss_fn = SlowLoss()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        seen: list[nn.Module] = []
        original = hooks.forward_pre

        def spy(module, args):
            seen.append(module)
            return original(module, args)

        hooks.forward_pre = spy  # type: ignore[method-assign]
        hooks._discovered_all()
        hooks.discover()  # again, with the spy as torch's global hook
        for step in range(4):
            if step == 1:
                assert global_module_hooks() == before  # discovery ended with the first step
                assert timed(model) and timed(loss_fn) and not timed(model[0])
                seen.clear()
            optimizer.zero_grad()
            loss_fn(model(torch.ones(3, 4))).backward()
            optimizer.step()
        assert seen == []  # no module call, submodules included, went through torch's global hooks
    finally:
        remove()
    assert not timed(model) and not timed(loss_fn) and global_module_hooks() == before
    rows = steps_of(hooks, tmp_path)
    assert len(rows) == 4 and all(row["forward"] >= SLOW_LOSS_S for row in rows)  # the loss is forward


def test_a_module_first_called_later_is_found_at_the_next_discovery(tmp_path):
    hooks, remove = observed(tmp_path)
    try:
        model, other = nn.Linear(4, 2), SlowLoss()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        for step in range(4):
            if step == 2:
                hooks.discover()  # as Module.train()/eval() or a new optimizer calls it
            optimizer.zero_grad()
            output = model(torch.ones(3, 4))
            (other(output) if step >= 1 else output.sum()).backward()
            optimizer.step()
        assert timed(other)
    finally:
        remove()
    forward = [row["forward"] for row in steps_of(hooks, tmp_path)]
    assert forward[1] < SLOW_LOSS_S  # called after the discovery ended: untimed (the step's "other")
    assert forward[2] >= SLOW_LOSS_S and forward[3] >= SLOW_LOSS_S


def test_a_timed_module_pickles_and_copies_and_its_copies_compute_as_themselves(tmp_path):
    _, remove = observed(tmp_path)
    try:
        model = nn.Sequential(nn.Linear(4, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        for _ in range(2):
            model(torch.ones(1, 4)).sum().backward()
            optimizer.step()
        assert timed(model)
        buffer = io.BytesIO()
        torch.save(model, buffer)
        assert b"dlscope" not in buffer.getvalue()
        clone = copy.deepcopy(model)
        assert torch.equal(clone(torch.ones(1, 4)), model(torch.ones(1, 4)))
        assert torch.equal(pickle.loads(pickle.dumps(model))(torch.ones(1, 4)), model(torch.ones(1, 4)))
        # a copy of its attributes (a DataParallel replica is made so) computes as itself
        replica = nn.Sequential.__new__(nn.Sequential)
        replica.__dict__ = model.__dict__.copy()
        replica._modules = {"0": nn.Linear(4, 2)}
        nn.init.zeros_(replica[0].weight), nn.init.zeros_(replica[0].bias)
        assert torch.equal(replica(torch.ones(1, 4)), torch.zeros(1, 2))
    finally:
        remove()


def test_a_timed_module_class_is_still_a_module_call_to_torch_fx_and_to_a_subclass(tmp_path):
    """A timed call does torch's `Module.__call__` work itself; while torch.fx traces (it patches
    `Module.__call__`), and for a subclass's instance (whose classes may hold a `__call__` after
    the timed one), it goes through the call it replaces."""
    hooks, remove = observed(tmp_path)
    try:
        model = nn.Linear(4, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)

        class SlowerLoss(SlowLoss):
            def forward(self, output: torch.Tensor) -> torch.Tensor:
                time.sleep(SLOW_LOSS_S)
                return super().forward(output)

        for step in range(4):
            optimizer.zero_grad()
            loss = SlowerLoss() if step % 2 else SlowLoss()
            loss(model(torch.ones(3, 4))).backward()
            optimizer.step()
        assert timed(model)
        calls: list[int] = []

        class Counting(nn.Module):
            def __call__(self, *args, **kwargs):
                calls.append(1)
                return super().__call__(*args, **kwargs)

        class CountedLoss(SlowLoss, Counting):  # its classes: CountedLoss, SlowLoss (timed), Counting, Module
            pass

        CountedLoss()(torch.ones(1))
        assert calls == [1]
        graph = torch.fx.symbolic_trace(nn.Sequential(nn.Linear(4, 2), nn.ReLU())).graph
        assert [n.op for n in graph.nodes] == ["placeholder", "call_module", "call_module", "output"]
    finally:
        remove()
    forward = [row["forward"] for row in steps_of(hooks, tmp_path)]
    assert forward[2] >= SLOW_LOSS_S and forward[3] >= 2 * SLOW_LOSS_S  # both losses, each once
    assert all(f < 3 * SLOW_LOSS_S for f in forward[2:])


def test_a_module_with_a_call_of_its_own_keeps_the_global_hooks(tmp_path):
    before = global_module_hooks()
    hooks, remove = observed(tmp_path)
    try:
        model = torch.jit.script(nn.Linear(4, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        for _ in range(3):
            model(torch.ones(1, 4)).sum().backward()
            optimizer.step()
        assert global_module_hooks() == before + 2  # its forward stays timed by them
    finally:
        remove()
    assert global_module_hooks() == before
    assert all(row["forward"] > 0 for row in steps_of(hooks, tmp_path))


def test_discovery_starts_again_when_train_or_eval_changes_a_mode(tmp_path):
    before = global_module_hooks()
    hooks, remove = observed(tmp_path)
    try:
        model = nn.Linear(4, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        model(torch.ones(1, 4)).sum().backward()
        optimizer.step()
        assert global_module_hooks() == before
        hooks.module_train(nn.Module.train, model, True)  # already training: the HF Trainer's every step
        assert global_module_hooks() == before
        hooks.module_train(nn.Module.train, model, False)  # an evaluation starts
        assert global_module_hooks() == before + 2
    finally:
        remove()
    assert global_module_hooks() == before
