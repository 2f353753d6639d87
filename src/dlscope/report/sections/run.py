"""Section run: the command `dlscope run` observed — its exit status, its processes, the timeline."""

from __future__ import annotations

from typing import Any

from dlscope.report.blocks import Block, Findings, Para, Table

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


def render(section: dict[str, Any]) -> list[Block]:
    command = " ".join(section.get("command", []))
    code = section.get("exit_code")
    items: list[tuple[str, str]] = []
    if section.get("interrupted"):
        items.append(("warn", "Interrupted (Ctrl-C): the sections show what was recorded until then."))
    if code not in (0, None):
        items.append(("bad", f"The command exited with status {code}; the report covers its run."))
    if section.get("steps_seen") == 0:
        items.append(("bad", NOT_OBSERVED[section.get("torch_attached")]))
    for error in section.get("hook_errors", []):
        items.append(("bad", f"An observer could not attach: {error}."))
    killed = [p["pid"] for p in section["processes"] if not p["clean_exit"] and not p["forked"]]
    if killed:
        ended = f"Process {', '.join(map(str, killed))} ended without running its exit handlers (killed, or os._exit)"
        items.append(("warn", f"{ended}: its last phase is closed at its last record."))
    rows = [[p["pid"], p["ppid"], process_kind(p), p["rank"], " ".join(p["argv"])[-40:]] for p in section["processes"]]
    return [
        Para(
            f"Ran `{command}` in {section.get('wall_seconds', 0):.2f} s, exit status {code}; "
            f"{len(rows)} Python process(es) observed. One timeline of all of them: {section.get('timeline')} "
            "(open it at ui.perfetto.dev or chrome://tracing)."
        ),
        Findings(items),
        Table(["pid", "ppid", "kind", "rank", "argv (end)"], rows, "Processes the bootstrap reached"),
    ]
