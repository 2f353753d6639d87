"""dlscope beside the closest tools (issue 44): the same training scripts bare, under `dlscope run`,
under TraceML and under py-spy, interleaved round by round; each one's cost and what each said the
bottleneck was, against the truth the script measures itself.

The scripts: benchmarks/scripts/bottleneck.py, one bottleneck each (--kind input: a slow Dataset and
2 workers; compute: the MNIST CNN; wait: a sleep after each optimizer step, a host wait). Each times
its own steps and prints them with its shares (data / compute / other) and the largest, its truth.

The tools, each as its documentation says to start it on a plain PyTorch loop:
  bare            python bottleneck.py
  dlscope         dlscope run -- python bottleneck.py             (this checkout's dlscope)
  traceml-watch   traceml watch bottleneck.py                     (no code change)
  traceml-run     traceml run bottleneck.py --args --traceml      (the script wraps each step in
                  traceml.trace_step(model): TraceML's setup for a custom loop, a code change)
  py-spy          py-spy record --subprocesses --idle --format raw -- python bottleneck.py
                  (--idle: waits are samples too, so that the samples follow wall time)

Cost: the mean step (the script's own clock, steps after the first), the loop thread's CPU time a
step (mean, and the median step's: a loaded machine stretches a step's wall time, not its CPU time)
and the command's wall time (the whole tool: start-up, analysis, report), each a ratio against the
bare run of the same script in the same round; medians over rounds. The tools' order turns by one
each round. Each run is a session of its own: an interrupted benchmark ends the tool's helpers too.

What each said: dlscope, results.json's anatomy verdict (key, level) and its largest part (data;
compute = forward + backward + optimizer; other + gap), beside the script's own share over the
steps dlscope analysed (its steady steps, from its step file); TraceML, final_summary.json's primary
diagnosis (kind, its share) beside the script's share; py-spy, the loop's line with the most samples
of the training process (the flame graph's widest frame under the loop) and the top leaf frame under
it. Each is sorted into data / compute / other and compared with the script's largest part.

Needs the tools of requirements-bench.txt (traceml-ai, py-spy; not the tests' requirements):
    pip install -r requirements-bench.txt
    python benchmarks/side_by_side.py [--rounds 5] [--kinds input compute wait] [--tools ...] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
from dlscope.analysis.stepfile import StepFile  # noqa: E402  (this checkout's reader)

SCRIPT = ROOT / "benchmarks" / "scripts" / "bottleneck.py"
TRUTH_PREFIX = "BOTTLENECK_TRUTH "
TOOLS = ("bare", "dlscope", "traceml-watch", "traceml-run", "py-spy")
KINDS = ("input", "compute", "wait")
# TraceML's step-time diagnoses, sorted into the script's parts
TRACEML_PART = {"INPUT_BOUND": "data", "COMPUTE_BOUND": "compute", "RESIDUAL_HEAVY": "other"}
TRACEML_EVIDENCE = {"data": "input_wait", "compute": "compute", "other": "residual"}  # its evidence's *_ms
# the script's loop lines, by what they hold (read from its source: py-spy names lines)
LINE_PART = {
    "next(batches)": "data",
    "optimizer.zero_grad()": "compute",
    ".backward()": "compute",
    "optimizer.step()": "compute",
    "time.sleep(args.wait_ms": "other",
}


def executable(name: str) -> str:
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if not found:
        sys.exit(f"side_by_side: {name} is not installed (pip install -r requirements-bench.txt)")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(tool: str, kind: str, work: Path) -> list[str]:
    script = [sys.executable, str(SCRIPT), "--kind", kind]
    if tool == "bare":
        return script
    if tool == "dlscope":
        return [sys.executable, "-m", "dlscope.cli", "run", "--out", str(work / "run"), "--", *script]
    if tool.startswith("traceml"):
        mode = tool.split("-")[1]
        ports = ["--aggregator-port", str(free_port()), "--master-port", str(free_port())]
        extra = ["--traceml"] if mode == "run" else []
        return [executable("traceml"), mode, str(SCRIPT), "--logs-dir", str(work / "logs"), "--run-name", "r",
                *ports, "--args", "--kind", kind, *extra]  # fmt: skip
    if tool == "py-spy":
        return [executable("py-spy"), "record", "--subprocesses", "--idle", "--format", "raw",
                "--output", str(work / "pyspy.txt"), "--", *script]  # fmt: skip
    raise ValueError(tool)


def truth_of(texts: list[str]) -> dict[str, Any]:
    for text in texts:
        for line in text.splitlines():
            if line.startswith(TRUTH_PREFIX):
                return json.loads(line[len(TRUTH_PREFIX) :])
    raise RuntimeError("the script printed no BOTTLENECK_TRUTH line")


def own_shares(truth: dict[str, Any], steps: list[int]) -> dict[str, float]:
    """The script's own shares (its clock) over the steps given."""
    total = sum(truth["step_s"][i] for i in steps)
    shares = {part: 100 * sum(truth[f"{part}_s"][i] for i in steps) / total for part in ("data", "compute")}
    return {**shares, "other": 100 - shares["data"] - shares["compute"]}


def dlscope_said(work: Path, truth: dict[str, Any]) -> dict[str, Any]:
    """Its verdict and largest part, and beside it the script's own share of that part over the
    steps dlscope's anatomy used: its steady steps, not the first nor the profiler's warm-up and
    active steps (the step file's `profiled` column)."""
    results = json.loads((work / "run" / "results.json").read_text())
    anatomy = results["sections"]["anatomy"]
    verdict, pct = anatomy["verdict"], anatomy["percent"]
    parts = {
        "data": pct.get("data", 0.0),
        "compute": sum(pct.get(p, 0.0) for p in ("forward", "backward", "optimizer")),
        "other": pct.get("other", 0.0) + pct.get("gap", 0.0),
    }
    part = max(parts, key=parts.get)
    words = verdict["key"] + (f" ({verdict['level']})" if "level" in verdict else "")
    steps = StepFile(work / "run" / results["sections"]["steps"]["file"])
    profiled = steps.codes["profiled"]
    steady = [
        int(row["i"])
        for row in steps.read()
        if row["src"] == 0 and row["i"] >= 1 and profiled[row["profiled"]] not in ("warmup", "active")
    ]
    said = f"{words}; {part} {parts[part]:.0f}% (own clock {own_shares(truth, steady)[part]:.0f}%)"
    if part == "compute":
        largest = max(("forward", "backward", "optimizer"), key=lambda p: pct.get(p, 0.0))
        said += f", {largest} {pct[largest]:.0f}%"
    return {"said": said, "part": part}


def traceml_said(work: Path, truth: dict[str, Any]) -> dict[str, Any]:
    written = sorted((work / "logs").glob("*/final_summary.json"))
    if not written:
        raise RuntimeError(f"TraceML wrote no final_summary.json under {work / 'logs'}")
    summary = json.loads(written[0].read_text())
    primary = summary["primary_diagnosis"]
    evidence = primary.get("evidence", {})
    said = primary["kind"]
    part = TRACEML_PART.get(primary["kind"])
    if part and evidence.get(f"{TRACEML_EVIDENCE[part]}_ms") is not None and evidence.get("step_time_ms"):
        said += f" {100 * evidence[f'{TRACEML_EVIDENCE[part]}_ms'] / evidence['step_time_ms']:.0f}%"
        said += f" (own clock {truth['shares'][part]:.0f}%)"
    system = (summary.get("system") or {}).get("diagnosis") or {}
    if system.get("kind") not in (None, "NORMAL", "NO_DATA"):
        said += f"; system: {system['kind']}"
    return {"said": said, "part": part}


def pyspy_said(work: Path, truth: dict[str, Any]) -> dict[str, Any]:
    """The training process's samples taken inside the loop, by the loop line they passed through
    (the script's `<module>` frame), and under the widest line its top leaf frame."""
    source = SCRIPT.read_text().splitlines()
    first = next(i for i, line in enumerate(source, 1) if line.startswith("while True:"))
    last = next(i for i, line in enumerate(source, 1) if i > first and line and not line.startswith(" "))
    module = re.compile(rf"<module> \({re.escape(SCRIPT.name)}:(\d+)\)")
    by_line: Counter[int] = Counter()
    leaves: dict[int, Counter[str]] = {}
    for row in (work / "pyspy.txt").read_text().splitlines():
        stack, _, count = row.rpartition(" ")
        frames = stack.split(";")
        lines = [int(m.group(1)) for f in frames if (m := module.fullmatch(f))]
        if not lines or not first < lines[0] < last:
            continue  # start-up, or a DataLoader worker (forked at iter(), before the loop)
        by_line[lines[0]] += int(count)
        leaf = re.sub(r":\d+\)$", ")", frames[-1]) if not module.fullmatch(frames[-1]) else frames[-1]
        leaves.setdefault(lines[0], Counter())[leaf] += int(count)
    if not by_line:
        return {"said": "no sample in the loop", "part": None}
    line, samples = by_line.most_common(1)[0]
    code = source[line - 1].strip()
    part = next((p for text, p in LINE_PART.items() if text in code), None)
    leaf = leaves[line].most_common(1)[0][0]
    share = 100 * samples / sum(by_line.values())
    return {"said": f"`{code.split('  #')[0]}` {share:.0f}% (leaf {leaf})", "part": part}


SAID = {"dlscope": dlscope_said, "traceml-run": traceml_said, "traceml-watch": traceml_said, "py-spy": pyspy_said}


def run_once(tool: str, kind: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="side-by-side-") as tmp:
        work = Path(tmp)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
        start = time.perf_counter()
        # a session of its own, so that an interrupted round ends the tool's helpers too (TraceML's
        # aggregator, torchrun) by their process group
        with subprocess.Popen(
            command(tool, kind, work), cwd=work, env=env, text=True, start_new_session=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        ) as child:  # fmt: skip
            try:
                stdout, stderr = child.communicate()
            except BaseException:
                os.killpg(child.pid, signal.SIGKILL)
                raise
        wall = time.perf_counter() - start
        if child.returncode:
            raise RuntimeError(f"{tool} on --kind {kind} exited {child.returncode}:\n{(stdout + stderr)[-2000:]}")
        logged = [p.read_text() for p in work.glob("logs/*/nodes/*/training.stdout.log")]
        truth = truth_of([stdout, *logged])
        said = SAID[tool](work, truth) if tool in SAID else {"said": "", "part": None}
    return {
        "wall_s": wall,
        "step_s": statistics.mean(truth["step_s"][1:]),
        "cpu_s": statistics.mean(truth["cpu_s"][1:]),
        "cpu_median_s": statistics.median(truth["cpu_s"][1:]),
        "steps_s": truth["step_s"],
        "steps_cpu_s": truth["cpu_s"],
        "shares": truth["shares"],
        "truth": truth["truth"],
        **said,
    }


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    parser.add_argument("--tools", nargs="+", choices=TOOLS[1:], default=list(TOOLS[1:]))
    parser.add_argument("--json", type=Path, help="write every run's figures here")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds through run_once: the tool's group ended
    tools = ["bare", *args.tools]
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {(k, t): [] for k in args.kinds for t in tools}
    began, loads = time.time(), [os.getloadavg()[0]]
    print(f"load {load()} (1/5/15 min), {os.cpu_count()} CPUs", flush=True)
    for r in range(args.rounds):
        order = tools[r % len(tools) :] + tools[: r % len(tools)]
        for kind in args.kinds:
            for tool in order:
                runs[kind, tool].append(result := run_once(tool, kind))
                loads.append(os.getloadavg()[0])
                print(
                    f"round {r + 1} {kind:8} {tool:14} wall {result['wall_s']:6.1f} s  step "
                    f"{1e3 * result['step_s']:7.2f} ms, CPU {1e3 * result['cpu_s']:6.2f} ms  load {loads[-1]:4.1f}  "
                    f"said: {result['said']}",
                    flush=True,
                )
    print(f"{time.time() - began:.0f} s\n")
    print(table(runs, args.kinds, tools))
    print(
        f"\n{args.rounds} rounds, {time.strftime('%Y-%m-%d')}; 1-minute load over the runs: {min(loads):.1f}–"
        f"{max(loads):.1f}, median {statistics.median(loads):.1f}"
    )
    if args.json:
        args.json.write_text(json.dumps({f"{k} {t}": v for (k, t), v in runs.items()}, indent=1))


NAMES = {
    "dlscope": "`dlscope run`",
    "traceml-watch": "`traceml watch`",
    "traceml-run": "`traceml run` + `trace_step`",
    "py-spy": "`py-spy record`",
}


def table(runs: dict[tuple[str, str], list[dict[str, Any]]], kinds: list[str], tools: list[str]) -> str:
    """The Markdown table: per script its truth and bare figures, per tool the medians of its
    same-round ratios to bare and what it said (the last round's words; right in n of the rounds)."""
    rows = [
        "| script: its truth (own clock); bare step, its CPU, wall | tool | step × bare "
        "| step CPU × bare (median step) | wall × bare | what it said | right |",
        "|---|---|---:|---:|---:|---|---:|",
    ]
    for kind in kinds:
        bare = runs[kind, "bare"]
        shares = {p: statistics.median(r["shares"][p] for r in bare) for p in ("data", "compute", "other")}
        truth = Counter(r["truth"] for r in bare).most_common(1)[0][0]
        step, cpu, wall = (statistics.median(r[key] for r in bare) for key in ("step_s", "cpu_s", "wall_s"))
        head = f"{kind}: {truth} {shares[truth]:.0f}%; {1e3 * step:.1f} ms, {1e3 * cpu:.1f} ms, {wall:.1f} s"
        for tool in tools[1:]:
            mine = runs[kind, tool]
            step = statistics.median(m["step_s"] / b["step_s"] for m, b in zip(mine, bare, strict=True))
            cpu = statistics.median(m["cpu_s"] / b["cpu_s"] for m, b in zip(mine, bare, strict=True))
            typical = statistics.median(m["cpu_median_s"] / b["cpu_median_s"] for m, b in zip(mine, bare, strict=True))
            wall = statistics.median(m["wall_s"] / b["wall_s"] for m, b in zip(mine, bare, strict=True))
            right = sum(m["part"] == m["truth"] for m in mine)
            verdict = f"{right}/{len(mine)}" if any(m["part"] for m in mine) else "—"
            ratios = f"{step:.2f}× | {cpu:.2f}× ({typical:.2f}×) | {wall:.2f}×"
            rows.append(f"| {head} | {NAMES[tool]} | {ratios} | {mine[-1]['said']} | {verdict} |")
            head = ""
    return "\n".join(rows)


if __name__ == "__main__":
    main()
