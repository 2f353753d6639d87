"""Step: train to the target accuracy, with progress, TensorBoard and per-epoch checkpoints."""

from __future__ import annotations

from typing import Any

from dlscope.checkpoint import CheckpointObserver, load_checkpoint
from dlscope.console import console
from dlscope.observe.progress import ProgressObserver
from dlscope.observe.tensorboard import TensorBoardObserver
from dlscope.phases import mark_begin, mark_end
from dlscope.report import plots
from dlscope.report.blocks import Block, Figure, Findings, Para, Table
from dlscope.steps.base import LabContext, LabStep
from dlscope.train import EpochResult, LogPoint, Observer, StopAtAccuracy, TrainConfig, Trainer


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


def run(ctx: LabContext) -> dict[str, Any]:
    assert ctx.data is not None, "the dataset step runs first"
    config = ctx.config
    resume_state = None
    if ctx.options.resume:
        resume_state = load_checkpoint(ctx.options.resume)
        config = ctx.config = TrainConfig.from_dict(resume_state["config"])
        console.print(f"resuming [path]{ctx.options.resume}[/] after epoch {resume_state['epoch']}")
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
    final = result.final
    if final is not None:
        reached = result.target_reached_epoch
        verdict = (
            f"[good]target {config.target_acc}% reached[/] at step {result.target_reached_step} (epoch {reached}) "
            f"in {result.time_to_target_s:.1f}s"
            if reached
            else (f"[bad]target {config.target_acc}% not reached[/]" if config.target_acc else "")
        )
        console.print(
            f"test accuracy [good]{final.test_acc:.2f}%[/] after {final.epoch} epoch(s), "
            f"{result.train_seconds:.1f}s training, {section['samples_per_s']:,.0f} samples/s. {verdict}"
        )
    if result.autotune:
        console.print(f"autotune: {autotune_verdict(section)}")
    return section


def autotune_verdict(section: dict[str, Any]) -> str:
    """ "chose …: A against B samples/s …": the decision in one sentence, with its evidence and cost."""
    tune = section["autotune"]
    if "skipped" in tune:
        return f"kept {tune['chosen']}: {tune['skipped']}."
    run_s = section["wall_seconds"]
    verdict = (
        f"chose {tune['chosen']}: {tune['chosen_samples_per_s']:,.0f} against {tune['default_samples_per_s']:,.0f} "
        f"samples/s for {tune['default']}, measured over {tune['timed_steps_per_candidate']} steps each"
        if tune["chosen"] != tune["default"]
        else f"kept {tune['chosen']} ({tune['chosen_samples_per_s']:,.0f} samples/s): no candidate was "
        f"{100 * tune['margin']:.0f}% faster over {tune['timed_steps_per_candidate']} steps each"
    )
    return (
        f"{verdict}. Measuring took {tune['steps']} real training steps and cost {tune['cost_s']:.1f} s "
        f"beyond the chosen layout's pace ({100 * tune['cost_s'] / run_s:.1f}% of the run)."
    )


def autotune_blocks(section: dict[str, Any]) -> list[Block]:
    tune = section.get("autotune")
    if not tune:
        return []
    blocks: list[Block] = [Findings([("info", "Autotune: " + autotune_verdict(section))])]
    if "stages" in tune:
        rows = [
            [stage["stage"], c["name"], c["samples_per_s"], c["step_ms"], c["cold_ms"], c["name"] == stage["chosen"]]
            for stage in tune["stages"]
            for c in stage["candidates"]
        ]
        blocks.append(
            Table(
                ["stage", "candidate", "samples/s", "step ms", "cold ms", "kept"],
                rows,
                "autotune: median of each candidate's timed steps, interleaved; torch.compile: "
                + tune["compile"]["reason"],
            )
        )
    return blocks


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
    evals = section.get("evaluations") or [
        {"epoch": e["epoch"], "test_loss": e["test_loss"], "test_acc": e["test_acc"]} for e in epochs
    ]
    ex = [e["epoch"] for e in evals]
    loss_ax.plot(ex, [e["test_loss"] for e in evals], "o-", label="test (full set)", color="#d9480f")
    acc_ax.plot(ex, [e["test_acc"] for e in evals], "o-", label="test (full set)", color="#d9480f")
    target = section["config"].get("target_acc")
    if target:
        acc_ax.axhline(target, ls="--", color="#12805c", lw=1, label=f"target {target}%")
    loss_ax.set(xlabel="epoch", ylabel="cross-entropy loss", title="Loss", yscale="log")
    lo = min([e["test_acc"] for e in evals] + [p["accuracy"] for p in log[len(log) // 4 :]] or [90])
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
                    f"Reached the {target}% target at step {section.get('target_reached_step')} "
                    f"(epoch {section['target_reached_epoch']}) "
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
            "evaluated in full after every epoch"
            + (f" and every {config['eval_every']} steps." if config.get("eval_every") else ".")
        ),
        Findings(items),
        *autotune_blocks(section),
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
