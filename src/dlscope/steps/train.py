"""Step: train to the target accuracy, with progress, TensorBoard and per-epoch checkpoints."""

from __future__ import annotations

import dataclasses
from typing import Any

from dlscope.checkpoint import CheckpointObserver, load_checkpoint
from dlscope.console import console, safe
from dlscope.observe.progress import ProgressObserver
from dlscope.observe.tensorboard import TensorBoardObserver
from dlscope.phases import mark_begin, mark_end
from dlscope.report import plots
from dlscope.report.blocks import Block, Figure, Findings, Para, Table
from dlscope.steps.base import LabContext, LabStep
from dlscope.train import EpochResult, LogPoint, Observer, StopAtAccuracy, TrainConfig, Trainer, evaluate


class PhaseMarker(Observer):
    """Phase markers per epoch: train-epoch-N, then evaluate-epoch-N (see dlscope.phases)."""

    def on_epoch_begin(self, trainer: Trainer, epoch: int) -> None:
        mark_begin(f"train-epoch-{epoch}")

    def on_evaluate_begin(self, trainer: Trainer, epoch: int) -> None:
        mark_end(f"train-epoch-{epoch}")
        mark_begin(f"evaluate-epoch-{epoch}")

    def on_epoch_end(self, trainer: Trainer, epoch: EpochResult) -> None:
        mark_end(f"evaluate-epoch-{epoch.epoch}")


class LogRecorder(Observer):
    """Keeps the logged training points for results.json (the report's curves)."""

    def __init__(self) -> None:
        self.points: list[dict[str, float]] = []

    def on_log(self, trainer: Trainer, point: LogPoint) -> None:
        self.points.append(vars(point).copy())


def resumed_config(ctx: LabContext, state: dict[str, Any]) -> TrainConfig:
    """The checkpoint's config (what the run computes), with --epochs as the new total when given."""
    config = TrainConfig.from_dict(state["config"])
    if ctx.options.resume_epochs is not None:
        config = dataclasses.replace(config, epochs=ctx.options.resume_epochs)
    return config


def run(ctx: LabContext) -> dict[str, Any]:
    assert ctx.data is not None, "the dataset step runs first"
    config = ctx.config
    resume_state = None
    if ctx.options.resume:
        resume_state = load_checkpoint(ctx.options.resume)
        config = ctx.config = resumed_config(ctx, resume_state)
        console.print(f"resuming [path]{safe(ctx.options.resume)}[/] after epoch {resume_state['epoch']}")
    recorder = LogRecorder()
    # PhaseMarker first: its evaluate phase ends before other observers write checkpoints and logs
    observers: list[Observer] = [PhaseMarker(), recorder, ProgressObserver(ctx.options.progress)]
    if ctx.options.tensorboard:
        observers.append(TensorBoardObserver(ctx.run.sub("tensorboard")))
    if config.target_acc is not None:
        observers.append(StopAtAccuracy(config.target_acc))
    checkpoints = CheckpointObserver(ctx.run.sub("checkpoints"))
    observers.append(checkpoints)
    trainer = ctx.trainer = Trainer(config, ctx.data, observers)
    if resume_state is not None:
        trainer.load_state_dict(resume_state)
    result = trainer.fit()
    section = result.to_dict()
    section["log"] = recorder.points
    section["steps_per_epoch"] = trainer.steps_per_epoch
    section["peak_lr"] = config.peak_lr
    section["train_samples"] = trainer.batches.num_samples
    section["test_samples"] = len(trainer.test_labels)
    section["checkpoint"] = ctx.run.rel(checkpoints.path)
    section["tensorboard"] = ctx.run.rel(ctx.run.path / "tensorboard") if ctx.options.tensorboard else None
    section["schedule_restarted"] = resume_state is not None and trainer.restarts_schedule(resume_state)
    final = result.final
    if resume_state is not None and trainer.global_step == resume_state["global_step"] and final is not None:
        # nothing left to train: the later steps verify and report the state as it was saved
        trainer.last_predictions = evaluate(
            trainer.model, trainer.test_images, trainer.test_labels, config.test_batch_size
        )["predictions"]
        console.print(
            f"the checkpoint is already at epoch {resume_state['epoch']} of {config.epochs}: recorded test "
            f"accuracy [good]{final.test_acc:.2f}%[/]; nothing to train (raise --epochs to train more)"
        )
    elif final is not None:
        reached = result.target_reached_epoch
        verdict = (
            f"[good]target {config.target_acc}% reached[/] at epoch {reached} in {result.time_to_target_s:.1f}s"
            if reached
            else (f"[bad]target {config.target_acc}% not reached[/]" if config.target_acc else "")
        )
        console.print(
            f"test accuracy [good]{final.test_acc:.2f}%[/] after {final.epoch} epoch(s), "
            f"{result.train_seconds:.1f}s training, {section['samples_per_s']:,.0f} samples/s. {verdict}"
        )
    return section


def curves(section: dict[str, Any]) -> bytes:
    fig, axes = plots.subplots(2)
    loss_ax, acc_ax = axes[0]
    log = section.get("log") or []
    spe = section["steps_per_epoch"]
    epochs = section["epochs"]
    if log:
        x = [p["step"] / spe for p in log]
        loss_ax.plot(x, [p["loss"] for p in log], label="train (window mean)", color="#2f5bd3")
        acc_ax.plot(x, [p["accuracy"] for p in log], label="train (window mean)", color="#2f5bd3")
    ex = [e["epoch"] for e in epochs]
    loss_ax.plot(ex, [e["test_loss"] for e in epochs], "o-", label="test (full set)", color="#d9480f")
    acc_ax.plot(ex, [e["test_acc"] for e in epochs], "o-", label="test (full set)", color="#d9480f")
    target = section["config"].get("target_acc")
    if target:
        acc_ax.axhline(target, ls="--", color="#12805c", lw=1, label=f"target {target}%")
    loss_ax.set(xlabel="epoch", ylabel="cross-entropy loss", title="Loss", yscale="log")
    lo = min([e["test_acc"] for e in epochs] + [p["accuracy"] for p in log[len(log) // 4 :]] or [90])
    acc_ax.set(xlabel="epoch", ylabel="accuracy (%)", title="Accuracy", ylim=(max(lo - 1, 0), 100.2))
    loss_ax.legend()
    acc_ax.legend(loc="lower right")
    return plots.png(fig)


def render(section: dict[str, Any]) -> list[Block]:
    config = section["config"]
    final_acc = section.get("final_test_acc")
    target = config.get("target_acc")
    items: list[tuple[str, str]] = []
    if target is not None and final_acc is not None:
        if section.get("target_reached_epoch"):
            items.append(
                (
                    "good",
                    f"Reached the {target}% target at epoch {section['target_reached_epoch']} "
                    f"in {section['time_to_target_s']:.1f} s (training and evaluation).",
                )
            )
        else:
            items.append(
                (
                    "bad",
                    f"Did not reach the {target}% target: {final_acc:.2f}% after {len(section['epochs'])} epoch(s).",
                )
            )
    if section.get("resumed_from_epoch"):
        items.append(("info", f"Resumed from a checkpoint after epoch {section['resumed_from_epoch']}."))
    if section.get("schedule_restarted"):
        items.append(("info", "--epochs changed on resume: a new one-cycle schedule ran over the added epochs."))
    rows = [
        [
            e["epoch"],
            e["train_loss"],
            e["train_acc"],
            e["test_loss"],
            e["test_acc"],
            e["lr"],
            e["samples_per_s"],
            e["train_seconds"],
            e["eval_seconds"],
        ]
        for e in section["epochs"]
    ]
    cfg_rows = [[k, v] for k, v in config.items() if v is not None]
    lr = section.get("peak_lr") or config["lr"] or "default"
    blocks: list[Block] = [
        Para(
            f"{config['model']} trained with {config['optimizer']} (lr {lr}, "
            f"{config['schedule']} schedule), batch {config['batch_size']}, "
            f"seed {config['seed']}, on {section['device']}: {section['steps']} steps, "
            f"{section['train_seconds']:.1f} s of training at {section['samples_per_s'] or 0:,.0f} samples/s. "
            "Training points are sample-weighted means over each logging window; the test set is "
            "evaluated in full after every epoch."
        ),
        Findings(items),
        Figure("train_curves", curves(section), "Loss and accuracy: training windows and full test set"),
        Table(
            [
                "epoch",
                "train loss",
                "train acc %",
                "test loss",
                "test acc %",
                "lr at end",
                "samples/s",
                "train s",
                "eval s",
            ],
            rows,
        ),
        Table(["setting", "value"], cfg_rows, "training configuration"),
    ]
    if section.get("tensorboard"):
        blocks.append(
            Para(
                f"TensorBoard logs: {section['tensorboard']} — view with "
                f"`dlscope tensorboard <run>`; checkpoint: {section['checkpoint']}."
            )
        )
    return blocks


STEP = LabStep("train", "Training", run, render)
