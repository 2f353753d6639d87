"""The train step in several ranks: torchrun (`python -m torch.distributed.run`) starts the workers.

    python -m torch.distributed.run --standalone --nproc-per-node N -m dlscope.distributed.worker PLAN_JSON
    (several nodes: --nnodes M --node-rank R --rdzv-backend c10d --rdzv-endpoint HOST:PORT instead of --standalone)

torchrun's own output goes to ranks/launch.log; the workers' one-line messages reach the terminal.
A failed rank becomes one line naming the rank and how it ended; no worker outlives the launch.
After the ranks finish, this process loads the last checkpoint, so the steps after train (profile,
checkpoint, …) see the trained model as they do in one process.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from dlscope.distributed.iorank import rank_pids
from dlscope.errors import DlscopeError
from dlscope.fsutil import make_dirs
from dlscope.options import DistOptions
from dlscope.steps.base import Context

if TYPE_CHECKING:
    from dlscope.runner import Plan

LOG = "launch.log"
WORKER_MODULE = "dlscope.distributed.worker"
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
    return [*command, "-m", WORKER_MODULE, plan_json]


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


def launch(ctx: Context) -> int:
    """Run the train step in the ranks; torchrun's exit status."""
    from dlscope.runner import Plan

    threads = threads_per_rank(ctx.config.threads, ctx.steps.dist.nproc_per_node)
    config = dataclasses.replace(ctx.config, threads=threads)
    plan = Plan(ctx.run.results["run"]["command"], ["train"], config, ctx.options, ctx.steps, argv=[])
    return run_torchrun(plan, ctx.run.path)


def run_torchrun(plan: Plan, run: Path, echo: bool = True) -> int:
    """The plan's train step in torchrun's workers, writing into the run directory `run` (ranks/ and
    what rank 0 writes); plan.config.threads per rank. torchrun's exit status."""
    from dlscope.runner import plan_to_json

    options = plan.step_options.dist
    shutil.rmtree(run / "ranks", ignore_errors=True)  # an --out used before: none of its records
    ranks = make_dirs(run / "ranks")
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


def train_in_ranks(ctx: Context) -> dict[str, Any]:
    """The train step's section from the ranks' records; ctx.trainer holds the trained model."""
    from dlscope.checkpoint import load_checkpoint
    from dlscope.data.mnist import load_mnist
    from dlscope.train import TrainConfig, Trainer, evaluate

    options = ctx.steps.dist
    with ctx.task(f"training in {options.world_size} ranks (torchrun)"):
        status = launch(ctx)
    ranks = ctx.run.path / "ranks"
    if status != 0:
        last = last_checkpoint(ctx.run.path, options.ckpt_format)
        kept = f"; the last checkpoint is intact: {last.relative_to(ctx.run.path)}" if last.exists() else ""
        cause = failure_line((ranks / LOG).read_text(errors="replace"), status)
        raise DlscopeError(f"{cause}; torchrun stopped the job (log: {ctx.run.rel(ranks / LOG)}){kept}", ctx.run.path)
    section_file = ranks / "train.json"
    if not section_file.is_file():
        raise DlscopeError("the ranks finished but no rank wrote ranks/train.json", ctx.run.path)
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
    trainer.load_state_dict(load_checkpoint(last_checkpoint(ctx.run.path, options.ckpt_format)))
    trainer.last_predictions = evaluate(trainer.model, trainer.test_images, trainer.test_labels)["predictions"]
    return section


def last_checkpoint(run: Path, ckpt_format: str) -> Path:
    """Where the ranks' per-epoch checkpoint is: the one a failed job keeps and a restart resumes."""
    return run / "checkpoints" / ("last.dcp" if ckpt_format == "dcp" else "last.pt")
