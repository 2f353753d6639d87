"""Budget check for issue 6: `dlscope pipeline sweep` ≤ 180 s and the lab's pipeline step ≤ 8 s on a
2-core machine; prints the figures recorded in BENCHMARKS.md (## dlscope pipeline).

    .venv/bin/python benchmarks/pipeline_budget.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SWEEP_BUDGET_S = 180.0
LAB_STEP_BUDGET_S = 8.0


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        lab_run = Path(tmp) / "lab"
        # the lab step alone (after the dataset step, as in `dlscope lab`), in a fresh process, through the runner
        code = (
            "from dlscope.options import RunOptions\n"
            "from dlscope.plan import Plan\n"
            "from dlscope.runner import run_command\n"
            f"options = RunOptions(out={str(lab_run)!r}, tensorboard=False, progress=False)\n"
            "run_command(Plan('lab', ['dataset', 'pipeline'], options=options, argv=[]), render=False)\n"
        )
        subprocess.run([sys.executable, "-c", code], check=True, stdout=subprocess.DEVNULL)
        lab_step_s = json.loads((lab_run / "results.json").read_text())["sections"]["pipeline"]["seconds"]

        sweep_run = Path(tmp) / "sweep"
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "dlscope.cli", "pipeline", "sweep", "--out", str(sweep_run), "--no-progress"],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        sweep_s = time.perf_counter() - start
        section = json.loads((sweep_run / "results.json").read_text())["sections"]["pipeline"]

    print(f"lab pipeline step: {lab_step_s:.1f} s (budget {LAB_STEP_BUDGET_S:.0f} s)")
    print(
        f"pipeline sweep:    {sweep_s:.1f} s (budget {SWEEP_BUDGET_S:.0f} s), exactly once: {section['exactly_once']}"
    )
    for table in section["tables"]:
        print(f"\n{table['varied']} ({table['samples']:,} samples)")
        print(f"  {'row':<18} {'wall s':>7} {'runs':>20} {'wait s':>7} {'read s':>7} {'reads':>8} {'AU %':>5}  verdict")
        for r in table["rows"]:
            runs = "/".join(f"{w:.2f}" for w in r["wall_s_runs"])
            print(
                f"  {r['label']:<18} {r['wall_s']:>7.2f} {runs:>20} {r['wait_s']:>7.2f} {r['read_s']:>7.2f} "
                f"{r['reads']:>8,} {100 * r['au']:>5.0f}  {r['verdict']}"
            )
    ok = sweep_s <= SWEEP_BUDGET_S and lab_step_s <= LAB_STEP_BUDGET_S and section["exactly_once"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
