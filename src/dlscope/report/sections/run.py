"""Section run: the command `dlscope run` observed — its exit status, its processes, the timeline."""

from __future__ import annotations

import os
from typing import Any

from dlscope.findings import Finding
from dlscope.report.blocks import Block, Para, Table, fmt
from dlscope.report.wording import worded

TITLE = "The observed command"
NOT_OBSERVED = {  # no training step was seen: why, from the processes' own records
    True: "No training step was observed: torch was imported, but in no process did an optimizer "
    "step, a backward() run, or an autograd.grad whose gradients are not kept differentiable (an "
    "inference-only script, or steps dlscope cannot see: torch.func.grad's, which keeps them "
    "differentiable; a training loop in compiled code). "
    "The run is marked failed: there is nothing to explain.",
    False: "No training step was observed: no process imported torch (dlscope's hooks wait for "
    "torch's import). The run is marked failed: there is nothing to explain.",
    None: "No training step was observed, and no process reported what it saw (killed before "
    "exit, or no Python process reached). The run is marked failed.",
}
ENDED_FIRST = {  # no step, and how the command ended (a run that ends otherwise is explained above)
    "error": lambda v: "No training step ran before the error that ended the command. The run is marked failed.",
    "status": lambda v: (
        f"No training step ran before the command ended with status {v['code']} (its own output says why). "
        "The run is marked failed."
    ),
}


def no_steps(v: dict[str, Any]) -> str:
    ended = ENDED_FIRST.get(v.get("ended") or "")
    return ended(v) if ended is not None else NOT_OBSERVED[v["torch_attached"]]


MESSAGE_SHOWN = 160  # characters of an error's message in the summary (the report has its first line)


def sentence_end(text: str) -> str:
    """`text` ended as a sentence: a full stop unless it ends with one (or ?, !, …)."""
    return text if text.endswith((".", "?", "!", "…")) else text + "."


def shortened(message: str) -> str:
    return message if len(message) <= MESSAGE_SHOWN else message[: MESSAGE_SHOWN - 1].rstrip() + "…"


def machine_shared(v: dict[str, Any]) -> str:
    """Other processes took a material share of the job's cores while its steps ran (analysis/machine.py)."""
    cores = v["cores"]
    text = (
        f"The machine was shared: while the steps ran ({fmt(v['seconds'])} s), other processes took "
        f"{fmt(v['others_cores'])} of the job's {cores} cores ({v['others_pct']:.0f}% of their time), leaving it "
        f"{fmt(v['free_cores'])}; the job's processes used {fmt(v['job_cores'])}"
    )
    if v.get("waited_pct") is not None:
        text += f", and its threads waited for a core {v['waited_pct']:.0f}% of the time they were ready to run"
    text += "."
    if v["threads_outnumber"]:
        text += (
            f" Its training processes ran {v['threads']} intra-op thread{'s' if v['threads'] != 1 else ''} "
            f"(torch.get_num_threads) on the {fmt(v['free_cores'])} cores left to them: a thread that waits for a "
            "core stalls its whole "
            "parallel region, and the others spin meanwhile (their CPU time grows with the machine's load, not "
            "with the script's work)."
        )
    return text + (
        " Every time below is this machine's at that load, not the script's alone — the step anatomy's shares, "
        "the step times and their changes, a subnormal census's CPU time: measure again on a quiet machine, or "
        "on cores of its own (taskset), before acting on them."
    )


# what a script needs to make its ranks data-parallel, by the framework it trained through (ranks_apart)
DATA_PARALLEL = {
    "torch": "call torch.distributed.init_process_group() (gloo on CPU, nccl on GPUs) before building the "
    "model, wrap the model in torch.nn.parallel.DistributedDataParallel, and give its DataLoader a "
    "DistributedSampler so that each rank reads its own share of the data; a script with a switch of its own "
    "for distributed training (a --distributed flag, its own launcher) wants that switch",
    "transformers": "the Hugging Face Trainer makes each process a DDP rank itself when torchrun or `accelerate "
    "launch --num_processes N` starts it, inside Trainer.train(); a loop of the script's own needs "
    "accelerate's `accelerator.prepare(model, optimizer, dataloader)`, which wraps the model in DDP and "
    "shards the DataLoader",
    "accelerate": "pass the model, the optimizer and the DataLoader through `accelerator.prepare(...)` (it "
    "wraps the model in DDP and shards the DataLoader), and launch with `accelerate launch --num_processes N` "
    "or torchrun",
    "lightning": 'Lightning starts and wires its DDP ranks itself: Trainer(devices=N, strategy="ddp"), with '
    "the script run alone; under torchrun, devices must equal --nproc-per-node (with devices=1 each of "
    "torchrun's processes trains alone, as rank 0)",
}


DATA_PARALLEL_SHORT = {  # the same, in the summary's one line
    "torch": "init_process_group, DistributedDataParallel and a DistributedSampler",
    "transformers": "Trainer.train() under torchrun or `accelerate launch`, or accelerator.prepare(...)",
    "accelerate": "accelerator.prepare(model, optimizer, dataloader)",
    "lightning": 'Trainer(devices=N, strategy="ddp") (under torchrun, devices = --nproc-per-node)',
}


def ranks_apart(v: dict[str, Any]) -> str:
    """A job started as distributed whose ranks never communicated (analysis/ranks.py)."""
    steps = ", ".join(f"rank {rank}: {n}" for rank, n in v["steps"].items())
    if not v["joined"]:
        how = "none of them joined a process group (torch.distributed.init_process_group was never called)"
    elif v["joined"] < v["ranks"]:
        how = f"{v['joined']} of them joined a process group, and none entered a collective in the whole run"
    else:
        how = "they joined a process group but none entered a collective in the whole run (no all-reduce)"
    return (
        f"The job was started as distributed (world size {v['world_size']}), but its {v['ranks']} ranks never "
        f"communicated: {how}. Each trained a model of its own on batches of its own ({steps} steps): "
        f"{v['ranks']} separate trainings of the same script, not one data-parallel training. To make it "
        f"data-parallel, {DATA_PARALLEL[v['framework']]}."
    )


def process_kind(process: dict[str, Any]) -> str:
    """python: started with its own command line; forked: a fork of another (a DataLoader worker,
    or a process that trains: hogwild, A3C)."""
    if process.get("loader_worker") is not None:
        return f"loader worker {process['loader_worker']}"
    return "forked" if process["forked"] else "python"


def summary_findings(section: dict[str, Any], sections: dict[str, Any] | None = None) -> list[Finding]:
    """How the command ended and what dlscope could see of it, as facts: first what the analysis
    found of how it ran (a shared machine), which every other finding is read in the light of."""
    found = [Finding.from_json(f) for f in section.get("findings", [])]
    if section.get("interrupted"):
        found.append(Finding("run.interrupted", "warn"))
    code = section.get("exit_code")
    if code not in (0, None):
        found.append(Finding("run.exit_status", "bad", {"code": code}))
    found += [Finding("run.uncaught", "bad", error) for error in section.get("uncaught", [])]
    if section.get("steps_seen") == 0:
        # ended by an error, or a status of its own (sys.exit, argparse's usage error): no guess at why
        ended = "error" if section.get("uncaught") else ("status" if code not in (0, None) else None)
        values = {"torch_attached": section.get("torch_attached"), "ended": ended, "code": code}
        found.append(Finding("run.no_steps", "bad", values))
    found += [Finding("run.hook_error", "bad", {"error": error}) for error in section.get("hook_errors", [])]
    killed = [p["pid"] for p in section["processes"] if not p["clean_exit"] and not p["forked"]]
    if killed:
        found.append(Finding("run.killed", "warn", {"pids": killed}))
    return found


WORDS = {
    "machine.shared": machine_shared,
    "distributed.ranks_apart": ranks_apart,
    "run.interrupted": lambda v: "Interrupted (Ctrl-C): the sections show what was recorded until then.",
    "run.exit_status": lambda v: f"The command exited with status {v['code']}; the report covers its run.",
    "run.uncaught": lambda v: (
        f"Process {v['pid']}"
        + (f" (rank {v['rank']})" if v.get("rank") is not None else "")
        + f" ended with {v['type']}"
        + (f" at {v['file']}:{v['line']} in {v['function']}" if v.get("file") else "")
        + sentence_end(f": {v['message']}" if v["message"] else "")
    ),
    "run.no_steps": no_steps,
    "run.hook_error": lambda v: f"An observer could not attach: {v['error']}.",
    "run.killed": lambda v: (
        f"Process {', '.join(map(str, v['pids']))} ended without running its exit handlers (killed, or os._exit): "
        "its last phase is closed at its last record."
    ),
}
# said before what bounds the step, in the summary: the training is not what the launch meant
FIRST = ("distributed.ranks_apart",)
HEADLINES = {  # the summary's words for the findings it shows (its first line says the exit status)
    "distributed.ranks_apart": lambda v: (
        f"The {v['ranks']} ranks never communicated: each trained a model of its own ("
        + ("no process group joined" if not v["joined"] else "no collective entered")
        + f"); to make them data-parallel, {DATA_PARALLEL_SHORT[v['framework']]} (the report says more)."
    ),
    "machine.shared": lambda v: (
        f"The machine was shared: other processes took {fmt(v['others_cores'])} of the job's {v['cores']} cores "
        f"({v['others_pct']:.0f}%) while the steps ran; every time here is that load's, not the script's alone."
    ),
    "run.interrupted": lambda v: "Interrupted (Ctrl-C): the report shows what was recorded until then.",
    "run.uncaught": lambda v: (
        (f"Rank {v['rank']}" if v.get("rank") is not None else "It")
        + f" failed with {v['type']}"
        + (f" at {os.path.basename(v['file'])}:{v['line']} ({v['function']})" if v.get("file") else "")
        + sentence_end(f": {shortened(v['message'])}" if v["message"] else "")
    ),
    "run.no_steps": lambda v: no_steps(v).split(" The run is marked")[0],
    "run.hook_error": lambda v: f"An observer could not attach: {v['error']}.",
}


def render(section: dict[str, Any]) -> list[Block]:
    command = " ".join(section.get("command", []))
    code = section.get("exit_code")
    rows = [[p["pid"], p["ppid"], process_kind(p), p["rank"], " ".join(p["argv"])[-40:]] for p in section["processes"]]
    return [
        Para(
            f"Ran `{command}` in {section.get('wall_seconds', 0):.2f} s, exit status {code}; "
            f"{len(rows)} Python process(es) observed. One timeline of all of them: {section.get('timeline')} "
            "(open it at ui.perfetto.dev or chrome://tracing)."
        ),
        worded(summary_findings(section), WORDS),
        Table(["pid", "ppid", "kind", "rank", "argv (end)"], rows, "Processes the bootstrap reached"),
    ]
