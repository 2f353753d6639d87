"""`dlscope doctor` on known-truth and third-party scripts: each candidate's predicted gain against
its measured one (issue 25), with the machine's load before and after each script. For the
workers candidate, "idle model" is what its prediction would be on idle cores with a free hand-over
(the model before the hand-over and the cores we get were measured), beside the basis's
hand-over CPU (worker/training thread, ms a batch) and the cores 1, 2, … busy processes got.

    .venv/bin/python benchmarks/doctor_scripts.py [--budget 120] [--only NAME ...]

Each script runs from a scratch directory of its own (build/doctor-bench/NAME); the table is
Markdown, ready for BENCHMARKS.md."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from dlscope.analysis import prescribe

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests" / "scripts"
PY = sys.executable
SCRIPTS = {
    "busy-wait decode, workers 0": [PY, str(TESTS / "doctor_target.py"), "--decode-ms", "3", "--forward-ms", "2"],
    "sleep decode, workers 0": [PY, str(TESTS / "doctor_target.py"), "--decode", "sleep", "--decode-ms", "3"],
    "compute-bound (no decode)": [PY, str(TESTS / "doctor_target.py"), "--decode-ms", "0", "--forward-ms", "8"],
    "pytorch/examples mnist": [PY, str(ROOT / "benchmarks" / "scripts" / "pytorch_examples_mnist.py"), "--epochs", "1"],
    "mnist_basic (handout style)": [
        PY,
        str(TESTS / "mnist_basic.py"),
        "--train",
        "6400",
        "--test",
        "500",
        "--epochs",
        "1",
    ],
    "Lightning fit": [PY, str(TESTS / "lightning_fit.py"), "out", "--epochs", "40"],
    "HF Trainer (GPT-2 tiny)": [PY, str(TESTS / "hf_trainer.py"), "out", "--steps", "200", "--every", "1000"],
}


def load() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--budget", type=float, default=120.0)
    parser.add_argument("--only", nargs="*", default=None)
    args = parser.parse_args()
    dlscope = Path(PY).with_name("dlscope")
    print(
        "| script | load before/after | baseline ms | data % | change | predicted × | idle model × | measured × "
        "| noise ±% | rounds | verdict | prescribed | hand-over ms | cores for 1, 2, … busy |"
    )
    print("|---|---|---:|---:|---|---:|---:|---:|---:|---:|---|---|---:|---:|")
    for name, command in SCRIPTS.items():
        if args.only and not any(o in name for o in args.only):
            continue
        work = ROOT / "build" / "doctor-bench" / name.split(" ")[0].replace("/", "-")
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        before = load()
        subprocess.run(
            [str(dlscope), "doctor", "--budget", str(args.budget), "--out", "run", "--", *command],
            cwd=work,
            env={**os.environ, "COLUMNS": "100"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
        after = load()
        section = json.loads((work / "run" / "results.json").read_text())["sections"].get("doctor", {})
        base = section.get("baseline", {})
        data = ((base.get("anatomy") or {}).get("percent") or {}).get("data")
        order = section.get("verdict", {}).get("order", [])
        rows = section.get("candidates") or [{"key": "—", "predicted": None, "measured": None}]
        for c in rows:
            m = c.get("measured") or {}
            basis = c.get("basis") or {}
            idle, handover, busy = "—", "—", "—"
            if c["key"] == "workers":
                nominal = [float(min(n, basis["cores"])) for n in range(1, len(basis["cores_busy"]) + 1)]
                free = {"thread_share": None, "cores_busy": nominal, "handover_send_ms": 0.0, "handover_recv_ms": 0.0}
                idle = f"{prescribe.workers_prediction({**basis, **free}):.2f}"
                handover = f"{basis['handover_send_ms']:.2f}/{basis['handover_recv_ms']:.2f}"
                busy = " ".join(f"{c:.2f}" for c in basis["cores_busy"])
            cells = [
                name,
                f"{before}/{after}",
                f"{base.get('median_ms') or 0:.3g}",
                "—" if data is None else f"{data:.0f}",
                c["key"],
                "—" if c["predicted"] is None else f"{c['predicted']:.2f}",
                idle,
                f"{m['gain']:.2f}" if m else "—",
                f"{m['noise_pct']:.0f}" if m else "—",
                " ".join(f"{r:.2f}" for r in m.get("rounds", [])) or "—",
                m.get("verdict", section.get("verdict", {}).get("key", "—")),
                "yes" if c["key"] in order else "",
                handover,
                busy,
            ]
            print("| " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
