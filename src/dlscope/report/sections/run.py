"""Section run: the command `dlscope run` observed — its exit status, its processes, the timeline."""

from __future__ import annotations

from typing import Any

from dlscope.findings import Finding
from dlscope.report.blocks import Block, Para, Table
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


def process_kind(process: dict[str, Any]) -> str:
    """python: started with its own command line; forked: a fork of another (a DataLoader worker,
    or a process that trains: hogwild, A3C)."""
    if process.get("loader_worker") is not None:
        return f"loader worker {process['loader_worker']}"
    return "forked" if process["forked"] else "python"


def summary_findings(section: dict[str, Any], sections: dict[str, Any] | None = None) -> list[Finding]:
    """How the command ended and what dlscope could see of it, as facts."""
    found = []
    if section.get("interrupted"):
        found.append(Finding("run.interrupted", "warn"))
    code = section.get("exit_code")
    if code not in (0, None):
        found.append(Finding("run.exit_status", "bad", {"code": code}))
    if section.get("steps_seen") == 0:
        found.append(Finding("run.no_steps", "bad", {"torch_attached": section.get("torch_attached")}))
    found += [Finding("run.hook_error", "bad", {"error": error}) for error in section.get("hook_errors", [])]
    killed = [p["pid"] for p in section["processes"] if not p["clean_exit"] and not p["forked"]]
    if killed:
        found.append(Finding("run.killed", "warn", {"pids": killed}))
    return found


WORDS = {
    "run.interrupted": lambda v: "Interrupted (Ctrl-C): the sections show what was recorded until then.",
    "run.exit_status": lambda v: f"The command exited with status {v['code']}; the report covers its run.",
    "run.no_steps": lambda v: NOT_OBSERVED[v["torch_attached"]],
    "run.hook_error": lambda v: f"An observer could not attach: {v['error']}.",
    "run.killed": lambda v: (
        f"Process {', '.join(map(str, v['pids']))} ended without running its exit handlers (killed, or os._exit): "
        "its last phase is closed at its last record."
    ),
}
HEADLINES = {  # the summary's words for the findings it shows (its first line says the exit status)
    "run.interrupted": lambda v: "Interrupted (Ctrl-C): the report shows what was recorded until then.",
    "run.no_steps": lambda v: NOT_OBSERVED[v["torch_attached"]].split(" The run is marked")[0],
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
