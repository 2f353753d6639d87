"""Section train: train to the target accuracy, with progress, TensorBoard and per-epoch checkpoints."""

from __future__ import annotations

from functools import partial
from typing import Any

from dlscope.report.blocks import Block, Figure, Findings, Para, Table

TITLE = "Training"


def curves(section: dict[str, Any]) -> bytes:
    from dlscope.report import plots  # matplotlib: only when a report draws

    fig, (loss_ax, acc_ax) = plots.subplots(2)
    log = section.get("log") or []
    spe = section["steps_per_epoch"]
    epochs = section["epochs"]
    if log:
        x = [p["step"] / spe for p in log]
        loss_ax.plot(x, [p["loss"] for p in log], label="train (window mean)", color="#2f5bd3")
        acc_ax.plot(x, [p["accuracy"] for p in log], label="train (window mean)", color="#2f5bd3")
    # every evaluation, those on the --eval-every schedule inside an epoch included
    evals = section.get("evaluations") or [
        {"epoch": e["epoch"], "test_loss": e["test_loss"], "test_acc": e["test_acc"]} for e in epochs
    ]
    ex = [e["epoch"] for e in evals]
    loss_ax.plot(ex, [e["test_loss"] for e in evals], "o-", label="test (full set)", color="#d9480f")
    acc_ax.plot(ex, [e["test_acc"] for e in evals], "o-", label="test (full set)", color="#d9480f")
    target = section["config"].get("target_acc")
    if target:
        acc_ax.axhline(target, ls="--", color="#12805c", lw=1, label=f"target {target}%")
    plots.log_axis(loss_ax, "y")
    loss_ax.set(xlabel="epoch", ylabel="cross-entropy loss", title="Loss")
    lo = min([e["test_acc"] for e in evals] + [p["accuracy"] for p in log[len(log) // 4 :]] or [90])
    acc_ax.set(xlabel="epoch", ylabel="accuracy (%)", title="Accuracy", ylim=(max(lo - 1, 0), 100.2))
    loss_ax.legend()
    acc_ax.legend(loc="lower right")
    return plots.png(fig)


def autotune_verdict(section: dict[str, Any]) -> str:
    """ "chose …: A against B samples/s …": the decision in one sentence, with its evidence and cost."""
    tune = section["autotune"]
    if "skipped" in tune:
        return f"kept {tune['chosen']}: {tune['skipped']}."
    steps = tune["timed_steps_per_candidate"]
    verdict = (
        f"chose {tune['chosen']}: {tune['chosen_samples_per_s']:,.0f} against {tune['default_samples_per_s']:,.0f} "
        f"samples/s for {tune['default']}, measured over {steps} steps each"
        if tune["chosen"] != tune["default"]
        else f"kept {tune['chosen']} ({tune['chosen_samples_per_s']:,.0f} samples/s): no candidate was "
        f"{100 * tune['margin']:.0f}% faster over {steps} steps each"
    )
    dropped = sum(c.get("dropped_after") is not None for stage in tune["stages"] for c in stage["candidates"])
    return (
        f"{verdict}. Measuring took {tune['steps']} of the run's training steps"
        + (f" ({dropped} candidates stopped early, over {tune['drop_above']:g}× the fastest)" if dropped else "")
        + f"; they trained the model, so the cost is their time beyond each stage's choice: {tune['cost_s']:.1f} s "
        f"({100 * tune['cost_s'] / section['wall_seconds']:.1f}% of the run)."
    )


def candidate_verdict(stage: dict[str, Any], candidate: dict[str, Any]) -> str:
    if candidate["name"] == stage["chosen"]:
        return "kept"
    dropped = candidate.get("dropped_after")
    if dropped is None:
        return ""
    return "dropped at warm-up" if dropped == 0 else f"dropped after round {dropped}"


def autotune_blocks(section: dict[str, Any]) -> list[Block]:
    """--autotune: the decision, and every candidate's timing as evidence."""
    tune = section.get("autotune")
    if not tune:
        return []
    blocks: list[Block] = [Findings([("info", "Autotune " + autotune_verdict(section))])]
    if "stages" in tune:
        rows = [
            [stage["stage"], c["name"], c["samples_per_s"], c["step_ms"], c["cold_ms"], candidate_verdict(stage, c)]
            for stage in tune["stages"]
            for c in stage["candidates"]
        ]
        blocks.append(
            Table(
                ["stage", "candidate", "smp/s", "step ms", "cold ms", "verdict"],
                rows,
                "Autotune: each stage's candidates, timed interleaved on real training steps",
                legend="step ms: median of the candidate's timed steps (of its warm-up step if dropped then); "
                "cold ms: its first step, not counted; kept: the stage's choice (a candidate must be "
                f"{100 * tune['margin']:.0f}% faster to replace the incumbent); dropped: stopped early, over "
                f"{tune['drop_above']:g}× the fastest median. torch.compile: {tune['compile']['reason']}.",
                optional=("cold ms",),
            )
        )
    return blocks


def render(section: dict[str, Any]) -> list[Block]:
    config = section["config"]
    final_acc = section.get("final_test_acc")
    target = config.get("target_acc")
    items: list[tuple[str, str]] = []
    after = f"{final_acc:.2f}% after {len(section['epochs'])} epoch(s)" if final_acc is not None else ""
    if target is not None and final_acc is not None and section.get("target_reached_epoch"):
        reached = (
            f"Reached the {target}% target at step {section.get('target_reached_step')} (epoch "
            f"{section['target_reached_epoch']}) in {section['time_to_target_s']:.1f} s (training and evaluation)."
        )
        items.append(("good", reached))
    elif target is not None and final_acc is not None:
        items.append(("bad", f"Did not reach the {target}% target: {after}."))
    if final_acc is not None and target is None:
        items.append(("info", f"Test accuracy {after}."))
    if section.get("already_finished"):
        text = f"The checkpoint was already at epoch {section['resumed_from_epoch']}: nothing left to train."
        items.append(("info", text))
    elif section.get("resumed_from_epoch"):
        items.append(("info", f"Resumed from a checkpoint after epoch {section['resumed_from_epoch']}."))
    if section.get("schedule_restarted"):
        items.append(("info", "--epochs changed on resume: a new one-cycle schedule ran over the epochs still to run."))
    keys = ("epoch", "train_loss", "train_acc", "test_loss", "test_acc", "lr", "samples_per_s", "train_seconds")
    rows = [[*(e[k] for k in keys), e["eval_seconds"]] for e in section["epochs"]]
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
            "evaluated in full after every epoch"
            + (f" and every {config['eval_every']} steps near the target." if config.get("eval_every") else ".")
        ),
        Findings(items),
        *autotune_blocks(section),
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
        text = (
            f"TensorBoard logs: {section['tensorboard']} — view with "
            f"`dlscope tensorboard <run>`; checkpoint: {section['checkpoint']}."
        )
        blocks.append(Para(text))
    return blocks
