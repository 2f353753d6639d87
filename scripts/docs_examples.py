"""Run the commands the docs show and write their real output (see scripts/make-docs-examples).

Each example runs its commands in bash, in a scratch directory (build/docs-examples/), with the
project's .venv first on PATH (so `dlscope` and `python` are the project's) at COLUMNS=80, and
writes docs/examples/<name>.txt: a header line saying where it came from, then each command as
`$ command` followed by its output. A view keeps some of the report's sections of a long output
(the rest becomes `…`). The README's blocks between `<!-- example: NAME -->` and
`<!-- end example -->` are replaced by the example file NAME, so the README's samples are real too.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "docs" / "examples"
SCRATCH = ROOT / "build" / "docs-examples"
HEADER = "# made by scripts/make-docs-examples"
RULE = re.compile(r"^(\S.*?) ─{3,}$")


@dataclass(frozen=True)
class Example:
    name: str
    commands: tuple[str, ...]
    setup: str = ""  # hidden shell run first (files the commands need)
    views: dict[str, tuple[str, ...]] = field(default_factory=dict)  # view name -> section titles kept
    max_section_lines: int = 0  # 0: whole sections; else each kept section is cut after this many lines
    views_only: bool = False  # only the views are written: the whole output holds the job's own long lines


def keep_sections(text: str, titles: tuple[str, ...], max_lines: int) -> str:
    """Each command's lines before its first section, and the sections whose rule title starts with one of titles."""
    out: list[str] = []
    keeping, kept_in_section = True, 0
    for line in text.splitlines():
        match = RULE.match(line)
        if match or line.startswith("$ "):
            keeping, kept_in_section = (match.group(1).startswith(titles) if match else True), 0
        if keeping and (not max_lines or kept_in_section < max_lines):
            out.append(line)
            kept_in_section += 1
        elif not out or out[-1] != "…":
            out.append("…")
    return "\n".join(out) + "\n"


CKPT_SETUP = (
    "[ -f runs/small/checkpoints/final.pt ] || dlscope train --epochs 1 --train-subset 2000 "
    "--test-subset 1000 --out runs/small >/dev/null"
)
PICKLES = r"""python - <<'EOF'
import os, pickle, struct, numpy as np, torch
def system(cmd):
    cmd = cmd.encode()
    return b"\x80\x02cos\nsystem\nX" + struct.pack("<I", len(cmd)) + cmd + b"\x85R"
open("evil.pkl", "wb").write(system("touch /tmp/pwned") + b"0h\x03.")
open("two.pkl", "wb").write(pickle.dumps([1, 2, 3], protocol=2) + system("touch /tmp/pwned") + b".")
open("cut.pkl", "wb").write(pickle.dumps([1, 2], protocol=2)[:-1])
np.savez("weights.npz", w=np.ones((4, 4), np.float32))
class Payload:
    def __reduce__(self):
        return (os.system, ("echo pwned",))
torch.save({"weight": torch.ones(2), "extra": Payload()}, "evil.pt")
EOF
cp runs/small/checkpoints/final.pt final.pt"""
TRAIN_IO = r"""cat > train_io.py <<'EOF'
"""
TRAIN_IO_SCRIPT = '''"""Reads a dataset file in 64 KiB chunks, then writes a checkpoint atomically."""
import os
import sys

import dlscope

with dlscope.phase("data_load"):
    with open(sys.argv[1], "rb") as f:
        while f.read(65536):
            pass
with dlscope.phase("checkpoint_save"):
    with open("model.pt.tmp", "wb") as out:
        out.write(os.urandom(1_000_000))
        out.flush()
        os.fsync(out.fileno())
    os.replace("model.pt.tmp", "model.pt")
'''
HTA_SCRIPT = '''"""Meta's HolisticTraceAnalysis on a `dlscope run` of a torchrun job: what each analysis gives."""
import sys

from hta.trace_analysis import TraceAnalysis

ta = TraceAnalysis(trace_dir=sys.argv[1])
print(">>> sorted(ta.t.get_ranks())")
print(sorted(ta.t.get_ranks()))
for call in ("get_comm_comp_overlap(visualize=False)", "get_temporal_breakdown(visualize=False)",
             "get_potential_stragglers()"):
    print(">>> ta." + call)
    try:
        print(eval("ta." + call))
    except Exception as error:  # the point: which analyses fail on a CPU/gloo job
        print(f"{type(error).__name__}: {error}")
'''
DIST = "--train-subset 2048 --test-subset 1000 --epochs 2"
NODES_SETUP = r"""PORT=$(python -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')
T="torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:$PORT --rdzv-id nodes"
OMP_NUM_THREADS=1 dlscope run --out runs/nodes/a -- $T ddp_nodes.py >/dev/null 2>&1 &
OMP_NUM_THREADS=1 dlscope run --out runs/nodes/b -- $T ddp_nodes.py --slow-local-rank 1 --slow-ms 60 >/dev/null 2>&1
wait"""

# Cheap ones first: a run of some of them (`make-docs-examples help- env`) takes seconds.
EXAMPLES_TO_MAKE: list[Example] = [
    Example("env", ("dlscope env",)),
    Example("models", ("dlscope models",)),
    Example("data-verify", ("dlscope data verify",)),
    Example(
        "trace-demo",
        (
            "dlscope trace --out runs/trace-demo -- python train_io.py "
            "$(python -c 'import dlscope.data, pathlib; print(next(pathlib.Path(dlscope.data.__file__)"
            '.parent.rglob("train-images-idx3-ubyte.gz")))\')',
        ),
        setup=f"rm -rf runs/trace-demo; cat > train_io.py <<'EOF'\n{TRAIN_IO_SCRIPT}EOF",
        views={"head": ("File data flow",)},  # the section's first tables; the whole is in the report
        max_section_lines=60,
    ),
    Example(
        "ckpt-inspect",
        ("dlscope ckpt inspect runs/small/checkpoints/final.pt --stats --limit 6",),
        setup=CKPT_SETUP,
    ),
    Example(
        "ckpt-diff",
        (
            "dlscope ckpt diff runs/small/checkpoints/final.pt runs/small/checkpoints/reloaded.pt",
            "head -c 300000 runs/small/checkpoints/final.pt > cut.pt; dlscope ckpt inspect cut.pt",
        ),
        setup=CKPT_SETUP,
    ),
    Example("ckpt-evil", ("dlscope ckpt inspect evil.pt",), setup=CKPT_SETUP + "\n" + PICKLES),
    Example(
        "ckpt-scan",
        ("dlscope ckpt scan evil.pkl two.pkl cut.pkl final.pt weights.npz", "echo $?"),
        setup=CKPT_SETUP + "\n" + PICKLES,
    ),
    Example(
        "ckpt-keras-h5",
        ("dlscope ckpt inspect runs/keras/keras/model.h5 --limit 8",),
        setup="[ -f runs/keras/keras/model.h5 ] || "
        "dlscope ckpt seed003 --epochs 1 --train-subset 2000 --out runs/keras >/dev/null",
    ),
    Example(
        "misbehaves",
        (
            "dlscope train --resume runs/a/checkpoints/final.pt",
            "dlscope train --epochs 1 --lr nope",
        ),
        setup="rm -rf runs/a; dlscope train --epochs 1 --train-subset 1000 --test-subset 1000 --out runs/a >/dev/null",
        views={"short": ("Training",)},
        max_section_lines=4,
    ),
    Example("ops-conv", ("dlscope ops conv --threads 1",), views={"section": ("Operators",)}),
    Example("ops-memory", ("dlscope ops memory",), views={"section": ("Operators",)}),
    Example(
        "pipeline",
        (
            "dlscope pipeline prepare --out data/mnist-5k --samples 5000",
            "dlscope pipeline run data/mnist-5k --format files --read-buffer 431 --shuffle-buffer 1000",
        ),
        setup="rm -rf data/mnist-5k",
    ),
    Example(
        "sweep",
        ("dlscope sweep --threads 1,2 --out runs/sweep",),
        setup="rm -rf runs/sweep",
        views={"section": ("Batch size",)},
    ),
    Example(
        "run-mnist",
        (
            "dlscope run --out runs/mnist -- python mnist_basic.py --train 960 --test 500 --epochs 1 "
            "--workers 1 --save-model",
        ),
        setup=f"rm -rf runs/mnist; cp {ROOT}/tests/scripts/mnist_basic.py .",
    ),
    Example(
        "run-batches",
        (
            "dlscope run --verbose --trace-io --trace-backend strace --profile-steps 0 --out runs/batches -- "
            "python batch_files.py truth.json data --workers 2",
        ),
        # 40 files of 512 KiB, file 033 50x larger: in batch 8, built by worker 0
        setup=f'rm -rf runs/batches data; cp {ROOT}/tests/scripts/batch_files.py .; mkdir data; python -c "'
        "[open(f'data/{i:03d}.bin', 'wb').write(bytes(524288 * (50 if i == 33 else 1))) for i in range(40)]\"",
        views={"section": ("Batches",)},
    ),
    Example(
        "diff",
        (
            "dlscope run --out runs/w0 -- python known_truth.py truth.json --read-ms 2 --decode-ms 1 --forward-waits "
            "--workers 0 --steps 100 > /dev/null",
            "dlscope run --out runs/w2 -- python known_truth.py truth.json --read-ms 2 --decode-ms 1 --forward-waits "
            "--workers 2 --steps 100 > /dev/null",
            "dlscope diff runs/w0 runs/w2",
            "echo $?",
        ),
        setup=f"rm -rf runs/w0 runs/w2; cp {ROOT}/tests/scripts/known_truth.py .",
    ),
    Example(
        "diff-io",
        (
            "dlscope run --trace-io --out runs/io0 -- python known_truth.py truth.json --read-ms 2 --decode-ms 1 "
            "--forward-waits --workers 0 --steps 100 > /dev/null",
            "dlscope run --trace-io --out runs/io2 -- python known_truth.py truth.json --read-ms 2 --decode-ms 1 "
            "--forward-waits --workers 2 --steps 100 > /dev/null",
            "dlscope diff runs/io0 runs/io2 --limit 6",
        ),
        setup=f"rm -rf runs/io0 runs/io2; cp {ROOT}/tests/scripts/known_truth.py .",
    ),
    Example(
        "doctor",
        (
            "dlscope doctor --budget 90 --out runs/doctor -- python doctor_target.py --decode sleep --decode-ms 3 "
            "--forward-ms 2 --workers 0",
        ),
        setup=f"rm -rf runs/doctor; cp {ROOT}/tests/scripts/doctor_target.py .",
    ),
    Example(
        "run-hang",
        (
            "dlscope run --verbose --out runs/hang --profile-steps 0 --hang-after 3 --on-hang end -- "
            "torchrun --standalone --nproc-per-node 2 hang_ddp.py --stop-rank 1",
        ),
        setup=f"rm -rf runs/hang; cp {ROOT}/tests/scripts/hang_ddp.py .",
        views={"verdict": ("Summary", "Hung job")},
        views_only=True,  # torchrun's own log lines and traceback (it is SIGTERMed) are wider than 80
    ),
    Example(
        "attach-watch",
        (
            "dlscope watch runs/slows --once",
            "touch slow; dlscope attach runs/slows --profile-steps 3",
            "touch stop; while [ ! -f runs/slows/report.html ]; do sleep 0.5; done; dlscope watch runs/slows",
            "echo $?",
        ),
        # a job that runs until `stop` exists, its step a big matmul once `slow` exists, started in the background
        setup=f"rm -rf runs/slows slow stop; cp {ROOT}/tests/scripts/slows_on_flag.py .; "
        "(dlscope run --out runs/slows --hang-after off -- python slows_on_flag.py slow stop >/dev/null 2>&1 &); "
        'until [ -n "$(ls runs/slows/processes/*.steps 2>/dev/null)" ]; do sleep 0.2; done; sleep 2',
    ),
    Example(
        "lab",
        (
            # reduced (12,000 training images, one epoch) so the generator stays within minutes on 2 shared cores
            "dlscope lab --train-subset 12000 --epochs 1 --target-acc 96 --out runs/lab",
        ),
        setup="rm -rf runs/lab",
        views={
            "tour": ("Training", "Profiler"),
        },
    ),
    Example(
        "train-fast",
        ("dlscope train --recipe fast --out runs/fast",),
        setup="rm -rf runs/fast",
        views={"training": ("Training",)},
    ),
    Example(
        "graph",
        ("dlscope graph --no-compile --out runs/graph",),
        setup="rm -rf runs/graph",
        views={"section": ("Framework",)},
    ),
    Example(
        "pipeline-sweep",
        ("dlscope pipeline sweep --samples 1000 --small-files 1000 --repeats 1 --out runs/pipeline-sweep",),
        setup="rm -rf runs/pipeline-sweep",
        views={"section": ("Input pipeline",)},
    ),
    Example(
        "train-ranks",
        (f"dlscope train --nproc-per-node 2 {DIST} --out runs/ranks",),
        setup="rm -rf runs/ranks",
        views={"ranks": ("Ranks", "Distributed")},
    ),
    Example(
        "train-rank-hung",
        (
            f"DLSCOPE_TEST_HANG_RANK=1:5 dlscope train --nproc-per-node 2 {DIST} --target-acc 100 "
            "--no-progress --hang-after 3 --on-hang end --out runs/h1",
            "echo $?",
        ),
        setup="rm -rf runs/h1",
        views={"verdict": ("Hung job",)},
        views_only=True,  # torchrun's own lines (it is SIGTERMed) are wider than 80
    ),
    Example(
        "train-rank-killed",
        (
            f"DLSCOPE_TEST_KILL_RANK=1:20 dlscope train --nproc-per-node 2 --ckpt-format dcp {DIST} "
            "--target-acc 100 --out runs/f1",
            "echo $?",
            "ls runs/f1/checkpoints/",
            "dlscope train --resume runs/f1/checkpoints/last.dcp --target-acc 100 --out runs/f2",
        ),
        setup="rm -rf runs/f1 runs/f2",
        views={"short": ("Training",)},
        max_section_lines=12,
    ),
    Example(
        "run-ddp",
        (
            # OMP_NUM_THREADS set as torchrun would: otherwise it prints a banner wider than 80 columns
            "OMP_NUM_THREADS=1 dlscope run --verbose --out runs/ddp -- torchrun --standalone --nproc-per-node 2 "
            "ddp_mnist.py --slow-rank 1 --slow-ms 30",
        ),
        setup=f"rm -rf runs/ddp; cp {ROOT}/tests/scripts/ddp_mnist.py .",
        views={"distributed": ("Summary", "Distributed")},
    ),
    Example(
        # two launchers of one job on this machine (c10d on 127.0.0.1), each under its own dlscope run;
        # the second one's local rank 1 sleeps 60 ms before each backward
        "merge-nodes",
        ("dlscope merge runs/nodes/a runs/nodes/b --out runs/nodes/merged",),
        setup=f"rm -rf runs/nodes; cp {ROOT}/tests/scripts/ddp_nodes.py .\n" + NODES_SETUP,
    ),
    Example(
        "ckpt-dcp",
        (
            "torchrun --standalone --nproc-per-node 2 dcp_save.py runs/dcp > /dev/null 2>&1",
            "dlscope ckpt inspect runs/dcp",
        ),
        setup=f"rm -rf runs/dcp; cp {ROOT}/tests/scripts/dcp_save.py .",
    ),
    Example(
        "lab-ranks-io",
        (f"dlscope lab --steps train --trace-io --nproc-per-node 2 {DIST} --out runs/ranks-io",),
        setup="rm -rf runs/ranks-io",
    ),
    Example(
        # the per-rank I/O tables are in the report (the terminal shows the lab's other sections)
        "lab-ranks-io-tables",
        ("sed -n '/^[*]Per rank and phase/,/^procs:/p' runs/ranks-io/report.md",),
        setup="[ -f runs/ranks-io/report.md ] || dlscope lab --steps train --trace-io --nproc-per-node 2 "
        f"{DIST} --out runs/ranks-io >/dev/null 2>&1",
    ),
    Example(
        "lab-scaling",
        (
            "dlscope lab --steps train,scaling --nproc-per-node 2 --epochs 1 --train-subset 2048 "
            "--test-subset 1000 --no-tensorboard --out runs/scaling",
        ),
        setup="rm -rf runs/scaling",
        views={"scaling": ("Scaling",)},
    ),
    Example(
        "pipeline-tfdata",
        ("dlscope pipeline run data/mnist-5k --engine tfdata --shuffle-buffer 500 --workers 2",),
        setup="[ -d data/mnist-5k ] || dlscope pipeline prepare --out data/mnist-5k --samples 5000 >/dev/null",
    ),
    Example(
        "pipeline-sweep-tfdata",
        (
            "dlscope pipeline sweep --engines dlscope,tfdata --samples 1000 --small-files 1000 --repeats 1 "
            "--out runs/pipeline-sweep-tf",
        ),
        setup="rm -rf runs/pipeline-sweep-tf",
        views={"section": ("Input pipeline",)},
    ),
    Example(
        "ckpt-tf-bundle",
        ("dlscope ckpt verify bundle/ckpt-1", "echo $?", "dlscope ckpt inspect tests/fixtures/tf/bundle/ckpt-1"),
        # one bit flipped in the last tensor's bytes of a copy of the TF fixture
        setup="rm -rf bundle tests; mkdir -p tests/fixtures/tf; "
        f"cp -r {ROOT}/tests/fixtures/tf/bundle tests/fixtures/tf/; "
        "cp -r tests/fixtures/tf/bundle bundle; python -c \"import pathlib; p = next(pathlib.Path('bundle')"
        ".glob('ckpt-1.data-*')); b = bytearray(p.read_bytes()); b[-5] ^= 1; p.write_bytes(bytes(b))\"",
    ),
    Example(
        "seed003-tf",
        ("dlscope ckpt seed003 --backend tensorflow --epochs 1 --train-subset 10000 --out runs/seed003-tf",),
        setup="rm -rf runs/seed003-tf",
    ),
    Example(
        "seed003-torch",
        ("dlscope ckpt seed003 --backend torch --epochs 1 --train-subset 10000 --out runs/seed003-torch",),
        setup="rm -rf runs/seed003-torch",
    ),
    # HTA logs its parsing and numpy's warnings on stderr: left out
    Example(
        "hta",
        ("python hta_check.py runs/ddp/processes 2>/dev/null",),
        setup=f"cat > hta_check.py <<'EOF'\n{HTA_SCRIPT}EOF",
    ),
]


def help_examples() -> list[Example]:
    """`dlscope X --help` for every command and subcommand, from the parser itself."""
    sys.path.insert(0, str(ROOT / "src"))
    from dlscope.cli import build_parser

    def walk(parser: argparse.ArgumentParser, words: tuple[str, ...]) -> list[tuple[str, ...]]:
        found = [words]
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    found += walk(sub, (*words, name))
        return found

    return [
        Example("help-" + "-".join(words or ("dlscope",)), (" ".join(("dlscope", *words, "--help")),))
        for words in walk(build_parser(), ())
    ]


def environment() -> dict[str, str]:
    env = dict(os.environ)
    env.update(COLUMNS="80", LINES="50", NO_COLOR="1", TERM="dumb", PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="3")
    env["PATH"] = f"{ROOT / '.venv' / 'bin'}:{env['PATH']}"
    env.pop("FORCE_COLOR", None)
    return env


def run_example(example: Example, env: dict[str, str]) -> str:
    if example.setup:
        subprocess.run(["bash", "-euo", "pipefail", "-c", example.setup], cwd=SCRATCH, env=env, check=True)
    load = os.getloadavg()[0]
    parts = [f"{HEADER} at {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, load {load:.1f}"]
    started = time.monotonic()
    last_status = 0
    for command in example.commands:
        if command == "echo $?":  # each command runs in a shell of its own: answer with the previous one's status
            parts += [f"$ {command}", str(last_status)]
            continue
        proc = subprocess.run(
            ["bash", "-c", command], cwd=SCRATCH, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        shown = command.split(" > /dev/null")[0] if " > /dev/null" in command else command
        parts.append(f"$ {shown}")
        parts.append("\n".join(line.rstrip() for line in proc.stdout.rstrip("\n").splitlines()))
        last_status = proc.returncode
    text = "\n".join(p for p in parts if p) + "\n"
    print(f"{example.name}: {time.monotonic() - started:.0f} s", file=sys.stderr)
    return "\n".join(machine_free(line) for line in text.split("\n"))


def machine_free(line: str) -> str:
    """The line without this checkout's directories (paths read from the scratch directory and
    the project root). Each one taken out of a table's cell is given back as spaces at the gap
    after that cell, so the columns to its right stay where the 80-column render put them."""
    for prefix in (str(SCRATCH) + "/", str(ROOT) + "/"):
        while prefix in line:
            at = line.index(prefix)
            line = line[:at] + line[at + len(prefix) :]
            gap = line.find("  ", at)
            if gap != -1:
                line = line[:gap] + " " * len(prefix) + line[gap:]
        # a path the terminal kept to its end ("…" and its last characters): "…" and what is left
        # of the prefix go (12 characters of it at least: "…es/" may be any path), the path
        # relative to it stays
        for at in [m.start() for m in re.finditer("…", line)][::-1]:
            tails = (prefix[k:] for k in range(1, len(prefix) - 11))
            tail = next((t for t in tails if line.startswith(t, at + 1)), None)
            if tail is not None:
                line = line[:at] + line[at + 1 + len(tail) :]
                gap = line.find("  ", at)
                if gap != -1:
                    line = line[:gap] + " " * (1 + len(tail)) + line[gap:]
    return line


# TensorFlow's start-up log (absl, C++ and Python) goes to stderr whatever TF_CPP_MIN_LOG_LEVEL says when a child
# process starts TF: it is TF's noise, not dlscope's output, and is left out of the examples
TF_LOG = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\)|[IWE]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ \S+\.cc:\d+\]"
    r"|To enable the following instructions: |WARNING:absl:)"
)


def write(name: str, text: str) -> None:
    path = EXAMPLES / f"{name}.txt"
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(line for line in text.splitlines(keepends=True) if not TF_LOG.match(line)))
    tmp.replace(path)


def update_readme() -> None:
    readme = ROOT / "README.md"
    text = readme.read_text()

    def block(match: re.Match[str]) -> str:
        source = EXAMPLES / f"{match.group(1)}.txt"
        if not source.is_file():  # not made yet: the block stays as it is
            return match.group(0)
        body = source.read_text()
        return f"<!-- example: {match.group(1)} -->\n```text\n{body}```\n<!-- end example -->"

    readme.write_text(re.sub(r"<!-- example: (\S+) -->\n.*?<!-- end example -->", block, text, flags=re.S))


def main() -> int:
    views_only = "--views" in sys.argv  # recut the views of the outputs already written, running nothing
    wanted = [word for word in sys.argv[1:] if word != "--views"]
    EXAMPLES.mkdir(parents=True, exist_ok=True)
    SCRATCH.mkdir(parents=True, exist_ok=True)
    env = environment()
    for example in [*help_examples(), *EXAMPLES_TO_MAKE]:
        if wanted and not any(example.name == w or (w.endswith("-") and example.name.startswith(w)) for w in wanted):
            continue
        if views_only:
            if not (EXAMPLES / f"{example.name}.txt").is_file():
                continue
            text = (EXAMPLES / f"{example.name}.txt").read_text()
        else:
            text = run_example(example, env)
            if example.views_only:
                (EXAMPLES / f"{example.name}.txt").unlink(missing_ok=True)
            else:
                write(example.name, text)
        for view, titles in example.views.items():
            write(f"{example.name}-{view}", keep_sections(text, titles, example.max_section_lines))
    update_readme()
    shutil.rmtree(SCRATCH / "__pycache__", ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
