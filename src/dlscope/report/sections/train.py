"""Section train: train to the target accuracy, with progress, TensorBoard and per-epoch checkpoints."""

from __future__ import annotations

from functools import partial
from typing import Any

from dlscope.report.blocks import Block, Figure, Findings, Para, Table

TITLE = "Training"


def curves(section: dict[str, Any]) -> bytes:
    from dlscope.report import plots  # matplotlib: only when a report draws

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
    if final_acc is not None and target is None:
        items.append(("info", f"Test accuracy {final_acc:.2f}% after {len(section['epochs'])} epoch(s)."))
    if section.get("already_finished"):
        items.append(
            ("info", f"The checkpoint was already at epoch {section['resumed_from_epoch']}: nothing left to train.")
        )
    elif section.get("resumed_from_epoch"):
        items.append(("info", f"Resumed from a checkpoint after epoch {section['resumed_from_epoch']}."))
    if section.get("schedule_restarted"):
        items.append(("info", "--epochs changed on resume: a new one-cycle schedule ran over the epochs still to run."))
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
    lr = section.get("peak_lr") or config["lr"]
    # the settings as they ran: the learning rate the optimizer used, the device torch chose
    ran = {**config, "lr": lr, "device": section["device"]}
    cfg_rows = [[k, v] for k, v in ran.items() if v is not None]
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
        Figure("train_curves", partial(curves, section), "Loss and accuracy: training windows and full test set"),
        Table(
            ["epoch", "loss", "acc %", "test loss", "test acc %", "lr", "smp/s", "train s", "eval s"],
            rows,
            "Per epoch",
            legend="loss, acc: training, sample-weighted over the epoch; test: the full test set after the epoch; "
            "lr: at the epoch's end; smp/s: training samples per second.",
            optional=("eval s", "lr"),
        ),
        Table(["setting", "value"], cfg_rows, "Training configuration as it ran"),
    ]
    if section.get("tensorboard"):
        blocks.append(
            Para(
                f"TensorBoard logs: {section['tensorboard']} — view with "
                f"`dlscope tensorboard <run>`; checkpoint: {section['checkpoint']}."
            )
        )
    return blocks
