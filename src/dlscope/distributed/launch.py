"""The train step in several ranks: torchrun (`python -m torch.distributed.run`) starts the workers.

    python -m torch.distributed.run --standalone --nproc-per-node N -m dlscope.runner --rank PLAN_JSON
    (several nodes: --nnodes M --node-rank R --rdzv-backend c10d --rdzv-endpoint HOST:PORT instead of --standalone)

torchrun's own output goes to ranks/launch.log; the workers' one-line messages reach the terminal.
A failed rank becomes one line naming the rank and how it ended; no worker outlives the launch.
(What the train step makes of the ranks' records: dlscope.stages.train.train_in_ranks.)
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING

from dlscope.distributed.iorank import rank_pids
from dlscope.fsutil import make_dirs
from dlscope.options import DistOptions
from dlscope.rundir import ranks_dir

if TYPE_CHECKING:
    from dlscope.plan import Plan

LOG = "launch.log"
WORKER_MODULE = "dlscope.runner"  # its rank mode (dlscope.distributed.worker)
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def threads_per_rank(threads: int | None, nproc_per_node: int) -> int:
    """--threads as given, else this machine's cores shared out: ranks × threads ≤ cores."""
    return threads or max(1, (os.cpu_count() or 1) // nproc_per_node)


def torchrun_command(options: DistOptions, plan_json: str) -> list[str]:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(options.nproc_per_node)]
    command += ["--max-restarts", str(options.max_restarts)]
    if options.nnodes == 1:
        command += ["--standalone"]
    else:
        assert options.rdzv_endpoint is not None  # DistOptions checked it
        command += ["--nnodes", str(options.nnodes), "--node-rank", str(options.node_rank)]
        command += ["--rdzv-backend", "c10d", "--rdzv-endpoint", options.rdzv_endpoint, "--rdzv-id", "dlscope"]
    return [*command, "-m", WORKER_MODULE, "--rank", plan_json]


def worker_env(options: DistOptions, threads: int) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    # A store of its own for each attempt: torchrun's shared one keeps the last attempt's keys, and a
    # restarted rank can read its peer's old gloo address (pytorch/pytorch#135712): connection refused.
    env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    local = options.nnodes == 1 or (options.rdzv_endpoint or "").rpartition(":")[0] in LOOPBACK
    if local:  # gloo would pick the interface of the host name, which may not route to itself
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return env


WORKER_ERROR = b"dlscope: error: "  # a worker's one-line error: the launcher's own error line quotes it


def pump(stream: IO[bytes], log: IO[bytes], echo: bool = True) -> None:
    """Everything to the log; with echo, the workers' own `dlscope:` lines (not their errors) to the terminal too."""
    for line in iter(stream.readline, b""):
        log.write(line)
        log.flush()
        said = line[line.find(b"dlscope: ") :]  # after any unterminated line of torch's
        if echo and said.startswith(b"dlscope: ") and not said.startswith(WORKER_ERROR):
            sys.stderr.buffer.write(said)
            sys.stderr.flush()


ROOT_CAUSE = re.compile(r"Root Cause.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+) \(pid: (\d+)\)", re.DOTALL)


def failure_line(log_text: str, status: int) -> str:
    """torchrun's root cause in our words: which rank ended, how, and the rank's own error if it said one."""
    found = ROOT_CAUSE.search(log_text)
    if found is None:
        return f"torchrun exited with status {status}"
    rank, code, pid = int(found[1]), int(found[2]), found[3]
    how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
    said = re.search(rf"^{WORKER_ERROR.decode()}rank {rank}: (.*)$", log_text, re.MULTILINE)
    return f"rank {rank} (pid {pid}) {how}" + (f" ({said[1]})" if said else "")


def end_leftover_workers(ranks: Path) -> list[int]:
    """SIGKILL any worker still alive after torchrun ended (the pids the workers wrote first thing)."""
    ended = []
    for pid in rank_pids(ranks.parent):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if WORKER_MODULE.encode() in cmdline:  # not a new process that reuses the pid
            os.kill(pid, signal.SIGKILL)
            ended.append(pid)
    return ended


def run_torchrun(plan: Plan, run: Path, echo: bool = True, started: Callable[[int], None] | None = None) -> int:
    """The plan's train step in torchrun's workers, writing into the run directory `run` (ranks/ and
    what rank 0 writes); plan.config.threads per rank; `started` is told torchrun's pid (the hang
    watchdog follows the job from it). torchrun's exit status."""
    from dlscope.plan import plan_to_json

    options = plan.step_options.dist
    shutil.rmtree(ranks_dir(run), ignore_errors=True)  # an --out used before: none of its records
    ranks = make_dirs(ranks_dir(run))
    assert plan.config.threads is not None  # the launcher always sets the threads per rank
    command = torchrun_command(options, plan_to_json(plan, str(run)))
    with open(ranks / LOG, "wb") as log:
        process = subprocess.Popen(
            command,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=worker_env(options, plan.config.threads),
            start_new_session=True,  # the user's Ctrl-C reaches us; we hand torchrun a SIGTERM
        )
        assert process.stderr is not None
        if started is not None:
            started(process.pid)
        reader = threading.Thread(target=pump, args=(process.stderr, log, echo), daemon=True)
        reader.start()
        try:
            status = process.wait()
        except BaseException:
            process.send_signal(signal.SIGTERM)  # torchrun passes it to every worker
            process.wait()
            raise
        finally:
            reader.join()
            end_leftover_workers(ranks)
    return status
