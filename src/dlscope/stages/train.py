"""Step: train to the target accuracy, with progress, TensorBoard and per-epoch checkpoints —
in this process, or in torchrun's ranks (each rank: dlscope.distributed.worker) — under the hang
watchdog (dlscope.supervise.watchdog): every training process keeps its live file (the Trainer's step
ends, the phase markers), and the watchdog, here, captures them all when steps stop.

The Trainer itself is built and run by dlscope.fit, in this process and in a rank alike.
"""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any

from dlscope.distributed.launch import LOG, failure_line, run_torchrun, threads_per_rank, torchrun_command
from dlscope.errors import DlscopeError, HungJobError
from dlscope.fit import fit, resumed_config, starting_state, train_section
from dlscope.injob import hangagent as agent
from dlscope.plan import Plan
from dlscope.restore import resume
from dlscope.rundir import PROCESSES, last_checkpoint, processes_dir, ranks_dir, ranks_section
from dlscope.stages.base import Context, Step
from dlscope.supervise.watchdog import Watchdog
from dlscope.train import TrainConfig, Trainer, evaluate

if TYPE_CHECKING:
    pass


def record_hang(ctx: Context, watchdog: Watchdog) -> None:
    """The hang section, when the watchdog captured the job (also when the training then failed)."""
    section = watchdog.section()
    if section is not None:
        ctx.run.record("hang", section)


def end_if_hung(ctx: Context, watchdog: Watchdog) -> None:
    """HungJobError when the watchdog ended the job (--on-hang end)."""
    if watchdog.ended:
        last = watchdog.captures[-1]
        raise HungJobError(
            f"the training hung: no step ended for {last['verdict']['idle_seconds']:.0f} s (threshold "
            f"{last['threshold_seconds']:.0f} s); every process captured in {last['file']}, then the job was "
            "ended (--on-hang end)",
            ctx.run.path,
        )


def run(ctx: Context) -> dict[str, Any]:
    if ctx.steps.dist.launched:
        return train_in_ranks(ctx)
    assert ctx.data is not None
    config = ctx.config
    resume_state = starting_state(ctx.steps, ctx.run.path)
    if resume_state is not None:
        config = ctx.config = resumed_config(resume_state, ctx.steps.train.epochs, ctx.config.threads)
    watchdog = Watchdog(ctx.run.fresh_sub(PROCESSES), ctx.run.path, ctx.steps.train.hang, ctx.say)
    agent.install(str(processes_dir(ctx.run.path)), follow_markers=True)
    try:
        with watchdog.in_this_process():
            trainer, watched = fit(config, ctx.data, ctx.run.path, ctx.options, ctx.steps, resume_state)
    finally:
        agent.uninstall()
        record_hang(ctx, watchdog)
    end_if_hung(ctx, watchdog)
    ctx.trainer = trainer
    section = train_section(trainer, watched, resume_state, ctx.run.path, ctx.options.tensorboard)
    if section["already_finished"]:
        # nothing left to train: the later steps verify and report the state as it was saved
        test = evaluate(trainer.model, trainer.test_images, trainer.test_labels, config.test_batch_size)
        trainer.last_predictions = test["predictions"]
        ctx.say(
            f"the checkpoint is already at epoch {resume_state['epoch']} of {config.epochs}: recorded test "
            f"accuracy {section['final_test_acc']:.2f}%; nothing to train (raise --epochs to train more)"
        )
    return section


def launch(ctx: Context) -> int:
    """Run the train step in the ranks, under the watchdog; torchrun's exit status."""
    threads = threads_per_rank(ctx.config.threads, ctx.steps.dist.nproc_per_node)
    config = dataclasses.replace(ctx.config, threads=threads)
    plan = Plan(ctx.run.results["run"]["command"], ["train"], config, ctx.options, ctx.steps, argv=[])
    watchdog = Watchdog(ctx.run.fresh_sub(PROCESSES), ctx.run.path, ctx.steps.train.hang, ctx.say)
    try:
        status = run_torchrun(plan, ctx.run.path, started=watchdog.start)
    finally:
        watchdog.stop()
        record_hang(ctx, watchdog)
    end_if_hung(ctx, watchdog)
    return status


def train_in_ranks(ctx: Context) -> dict[str, Any]:
    """The train step's section from the ranks' records; ctx.trainer holds the trained model."""
    from dlscope.data.mnist import load_mnist

    options = ctx.steps.dist
    with ctx.task(f"training in {options.world_size} ranks (torchrun)"):
        status = launch(ctx)
    ranks = ranks_dir(ctx.run.path)
    if status != 0:
        last = last_checkpoint(ctx.run.path, options.ckpt_format)
        cause = failure_line((ranks / LOG).read_text(errors="replace"), status)
        raise DlscopeError(
            f"{cause}; torchrun stopped the job (log: {ctx.run.rel(ranks / LOG)})"
            + (f"; the last checkpoint is intact: {last.relative_to(ctx.run.path)}" if last.exists() else ""),
            ctx.run.path,
        )
    section_file = ranks_section(ctx.run.path)
    if not section_file.is_file():
        raise DlscopeError(f"the ranks finished but no rank wrote {ctx.run.rel(section_file)}", ctx.run.path)
    section = json.loads(section_file.read_text())
    section["launch"] = {
        **dataclasses.asdict(options),
        "world_size": options.world_size,
        "threads_per_rank": threads_per_rank(ctx.config.threads, options.nproc_per_node),
        "command": "torchrun " + " ".join(torchrun_command(options, "PLAN_JSON")[3:]),
        "log": ctx.run.rel(ranks / LOG),
    }
    # the steps after this one see the trained model, read back from the ranks' last checkpoint
    # (with this process's threads: the later steps have the machine to themselves)
    config = ctx.config = dataclasses.replace(TrainConfig.from_dict(section["config"]), threads=ctx.config.threads)
    if ctx.data is None:
        ctx.data = load_mnist(ctx.options.data_dir)
    trainer = ctx.trainer = Trainer(config, ctx.data)
    resume(trainer, last_checkpoint(ctx.run.path, options.ckpt_format))
    trainer.last_predictions = evaluate(trainer.model, trainer.test_images, trainer.test_labels)["predictions"]
    return section


STEP = Step("train", run, needs=("dataset",), also=("hang",))
