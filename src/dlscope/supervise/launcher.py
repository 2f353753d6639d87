"""What the observed command's launcher says about the job before it starts: the number of machines a
torchrun command spans (`--nnodes N` or `--nnodes MIN:MAX`), read from its own arguments."""

from __future__ import annotations

import os

LAUNCHERS = ("torch.distributed.run", "torch.distributed.launch")


def nodes_of(command: list[str]) -> int:
    """The most machines a torchrun command may span (1: one, or no torchrun). Its own arguments end
    at the script (a `.py` file, or the first word after `-m MODULE` of the job's own)."""
    args = _launcher_args(command)
    for k, arg in enumerate(args):
        value = None
        if arg == "--nnodes" and k + 1 < len(args):
            value = args[k + 1]
        elif arg.startswith("--nnodes="):
            value = arg.partition("=")[2]
        if value is not None:
            most = value.rpartition(":")[2]
            return int(most) if most.isdigit() else 1
    return 1


def _launcher_args(command: list[str]) -> list[str]:
    if not command:
        return []
    if os.path.basename(command[0]) == "torchrun":
        rest = command[1:]
    elif (
        "-m" in command[:3] and command.index("-m") + 1 < len(command) and command[command.index("-m") + 1] in LAUNCHERS
    ):
        rest = command[command.index("-m") + 2 :]
    else:
        return []
    script = next((k for k, arg in enumerate(rest) if arg.endswith(".py") or arg in ("-m", "--module")), len(rest))
    return rest[:script]
