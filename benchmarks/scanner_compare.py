"""dlscope ckpt scan against picklescan, fickling and modelscan, side by side, on the same corpus.

Each scanner runs as its own process per file (what a CI step pays), in rotating order per file so a
busy machine slows them all alike. A file counts as flagged when the scanner does not call it clean:
dlscope exit 1 or 2, picklescan exit ≠ 0, fickling --check-safety exit ≠ 0, modelscan exit 1 or 2
(3 is "no supported file": not flagged). Detection rate is over the malicious files, false alarms
over the benign ones. "Whole corpus" is what a CI step pays: each scanner given the corpus's two
directories, one process each, median of 3 rotating rounds (fickling takes one file at a time).
The other scanners live in a virtualenv of their own (they pin their own packages):

    python -m venv .venv-scanners && .venv-scanners/bin/pip install picklescan fickling modelscan typing_extensions
    PYTHONPATH=src python benchmarks/scanner_compare.py --scanners-venv .venv-scanners [--corpus DIR] [--markdown]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from scanner_corpus import build

NOT_FLAGGED = {"dlscope": {0}, "picklescan": {0}, "fickling": {0}, "modelscan": {0, 3}}
ERRORS = {"dlscope": {2}, "picklescan": {2}, "fickling": set(), "modelscan": {2}}


def commands(venv: Path, report: Path) -> dict[str, list[str]]:
    bin_ = venv / "bin"
    return {
        "dlscope": [sys.executable, "-m", "dlscope.cli", "ckpt", "scan"],
        "picklescan": [str(bin_ / "picklescan"), "-p"],
        "fickling": [str(bin_ / "fickling"), "--check-safety", "--json-output", str(report)],
        "modelscan": [str(bin_ / "modelscan"), "-p"],
    }


def run(cmd: list[str], path: Path) -> tuple[int, float]:
    start = time.perf_counter()
    done = subprocess.run([*cmd, str(path)], capture_output=True, timeout=300)
    return done.returncode, time.perf_counter() - start


def dirs(corpus: Path) -> list[Path]:
    return [corpus / "malicious", corpus / "benign"]


def compare(corpus: Path, venv: Path) -> dict[str, dict]:
    files = [(p, True) for p in sorted((corpus / "malicious").iterdir())]
    files += [(p, False) for p in sorted((corpus / "benign").iterdir())]
    with tempfile.TemporaryDirectory() as tmp:
        cmds = commands(venv, Path(tmp) / "fickling.json")
        names = list(cmds)
        results = {n: {"detected": 0, "errors": 0, "false_alarms": 0, "times": [], "missed": []} for n in names}
        for i, (path, bad) in enumerate(files):
            for name in names[i % len(names) :] + names[: i % len(names)]:  # rotate who goes first
                code, seconds = run(cmds[name], path)
                r = results[name]
                r["times"].append(seconds)
                flagged = code not in NOT_FLAGGED[name]
                if bad and flagged:
                    r["detected"] += 1
                    r["errors"] += code in ERRORS[name]
                elif bad:
                    r["missed"].append(path.name)
                elif flagged:
                    r["false_alarms"] += 1
                    r["missed"].append(f"false alarm: {path.name}")
        # a CI step scans a directory in one process: the start-up is paid once (fickling takes one file)
        for rnd in range(3):
            for name in names[rnd % len(names) :] + names[: rnd % len(names)]:
                if name != "fickling":
                    results[name].setdefault("corpus_s", []).append(sum(run(cmds[name], d)[1] for d in dirs(corpus)))
    for r in results.values():
        r["malicious"] = sum(bad for _, bad in files)
        r["benign"] = len(files) - r["malicious"]
        r["median_s"] = statistics.median(r["times"])
    return results


def table(results: dict[str, dict], markdown: bool) -> str:
    head = ["scanner", "detected", "of which errors", "false alarms", "median s/file", "whole corpus s"]
    rows = [
        [
            name,
            f"{r['detected']}/{r['malicious']} ({100 * r['detected'] / r['malicious']:.0f}%)",
            str(r["errors"]),
            f"{r['false_alarms']}/{r['benign']}",
            f"{r['median_s']:.2f}",
            f"{statistics.median(r['corpus_s']):.1f}" if "corpus_s" in r else "—",
        ]
        for name, r in results.items()
    ]
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])
    widths = [max(len(x) for x in col) for col in zip(head, *rows, strict=True)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in [head, *rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--scanners-venv", type=Path, required=True, help="virtualenv with picklescan, fickling, modelscan"
    )
    parser.add_argument("--corpus", type=Path, help="an existing corpus (default: build one in a temporary directory)")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        corpus = args.corpus or Path(tmp)
        if args.corpus is None:
            build(corpus, corpus / "CANARY")
        print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start", file=sys.stderr)
        results = compare(corpus, args.scanners_venv)
        print(table(results, args.markdown))
        for name, r in results.items():
            if r["missed"]:
                print(f"{name} missed: {', '.join(r['missed'])}")
        print(f"load average {os.getloadavg()[0]:.2f} at end", file=sys.stderr)
        if (corpus / "CANARY").exists():
            raise SystemExit("a scanner ran a payload: the canary file exists")


if __name__ == "__main__":
    main()
