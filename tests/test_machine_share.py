"""The machine's share (supervise/cpushare.py read while the job runs, analysis/machine.py after):
a run beside two busy loops says, first, that the machine was shared, with the share — at least
the loops' own CPU time over the steps, as their /proc stat counts it — and qualifies the verdicts
that rest on the steps' times; a quiet run says nothing of it. The job's own share is checked
against the CPU time the script itself measured."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from dlscope.analysis.machine import MATERIAL_PCT, machine_share
from dlscope.contract.records import MACHINE_COLUMNS
from dlscope.report.blocks import fmt
from test_run_ecosystem import SCRIPTS, observe

SCRIPT = [sys.executable, str(SCRIPTS / "tiny_mlp.py"), "--seconds", "4"]
BUSY_LOOP = [sys.executable, "-c", "while 1: pass"]
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


class Loops:
    """Two busy loops, their CPU seconds read every 0.1 s (the truth the share is checked against)."""

    def __init__(self) -> None:
        self.processes = [subprocess.Popen(BUSY_LOOP) for _ in range(2)]
        self.readings: list[tuple[float, float]] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.read, daemon=True)
        self.thread.start()

    def read(self) -> None:
        while not self.done.wait(0.1):
            self.readings.append((time.time(), sum(cpu_seconds(p.pid) for p in self.processes)))

    def cores(self, begin: float, end: float) -> float:
        """The cores the loops used from `begin` to `end` (the readings nearest inside)."""
        inside = [r for r in self.readings if begin <= r[0] <= end]
        (t0, c0), (t1, c1) = inside[0], inside[-1]
        return (c1 - c0) / (t1 - t0)

    def stop(self) -> None:
        self.done.set()
        self.thread.join()
        for p in self.processes:
            p.kill()
            p.wait()


@pytest.fixture
def two_busy_loops():
    loops = Loops()
    time.sleep(0.5)  # both spinning before the job starts
    yield loops
    loops.stop()


def report_text(tmp_path) -> str:
    return " ".join((tmp_path / "run" / "report.md").read_text().split())


def steps_span(sections: dict) -> tuple[float, float]:
    from dlscope.analysis.stepfile import StepFile
    from dlscope.analysis.steptable import open_stream

    table = open_stream(StepFile(sections["steps"]["file"]))[1]
    return float(table["start"][0]), float(table["start"][-1] + table["seconds"][-1])


def check_job_share(machine: dict, truth: dict[str, str]) -> None:
    """The job's cores as dlscope read them from outside, against the script's own CPU over wall."""
    script = float(truth["cpu_ms"]) / float(truth["step_ms"])
    # (within 0.005 cores at load 9-16; a count that lost the ended workers' time was 0.07 short of 0.22)
    assert abs(machine["job_cores"] - script) <= 0.03 + 0.08 * script, (machine, truth)


def test_a_run_beside_two_busy_loops_says_the_machine_was_shared(tmp_path, capfd, two_busy_loops):
    sections, truth = observe(tmp_path, capfd, SCRIPT)
    machine = sections["run"]["machine"]
    loops = two_busy_loops.cores(*steps_span(sections))
    assert machine["shared"] and machine["others_pct"] >= MATERIAL_PCT, machine
    # others: the loops' own CPU time over the steps at least (with whatever else the machine ran)
    assert machine["others_cores"] >= 0.9 * loops - 0.05, (machine, loops)
    check_job_share(machine, truth)
    found = sections["run"]["findings"][0]
    assert (found["key"], found["level"]) == ("machine.shared", "warn")
    report = report_text(tmp_path)
    first = report.split("## Training steps")[0]  # the observed command comes first, its warning first in it
    assert (
        f"The machine was shared: while the steps ran ({fmt(machine['seconds'])} s), other processes took "
        f"{fmt(machine['others_cores'])} of the job's {machine['cores']} cores ({machine['others_pct']:.0f}% of their "
        "time)"
    ) in first
    # each verdict that rests on the steps' times says it was measured so: the summary's first
    said = f"(Measured on a shared machine: other processes took {machine['others_pct']:.0f}% of the cores.)"
    assert "bounds the step" in first and said in first
    anatomy = report.split("## Step anatomy")[1].split("## ")[0]
    assert f"Measured on a shared machine: other processes took {machine['others_pct']:.0f}%" in anatomy
    assert sections["anatomy"]["machine_shared"]["others_pct"] == machine["others_pct"]


@pytest.mark.alone  # beside another test's job the machine is shared, truly
def test_a_quiet_run_says_nothing_of_the_machine(tmp_path, capfd):
    sections, truth = observe(tmp_path, capfd, SCRIPT)
    machine = sections["run"]["machine"]
    assert not machine["shared"], machine
    check_job_share(machine, truth)
    assert "findings" not in sections["run"] and "machine_shared" not in sections["anatomy"]
    report = report_text(tmp_path)
    assert "machine was shared" not in report and "shared machine" not in report


def test_the_jobs_share_counts_the_dataloader_workers_that_ended(tmp_path, capfd):
    """Workers started again at each pass and joined after it: their CPU time stays the job's (the
    training process's cutime once it reaped them), not the others' — on any machine, loaded or not."""
    sections, truth = observe(tmp_path, capfd, [*SCRIPT[:-1], "6", "--workers", "2", "--batches", "10"])
    workers = [p for p in sections["run"]["processes"] if p["loader_worker"] is not None]
    assert len(workers) >= 4  # two passes or more, two workers each
    check_job_share(sections["run"]["machine"], truth)


def rows(*intervals: tuple[float, float, float, float, float, float]) -> dict:
    """One-second intervals from t=100: (busy, job, dlscope, ran, waited, threads ran) each."""
    return {
        "cores": [0, 1],
        "columns": list(MACHINE_COLUMNS),
        "rows": [[101.0 + n, 1.0, *values] for n, values in enumerate(intervals)],
    }


def test_the_share_is_taken_over_the_steps_and_weighed_by_their_overlap():
    # start-up (others busy) before the steps, then 2 s of steps beside 0.2 of a core of others
    data = rows((2.0, 0.2, 0.0, 0.2, 0.0, 1), (2.0, 1.8, 0.0, 1.8, 0.1, 2), (2.0, 1.8, 0.0, 1.8, 0.1, 2))
    quiet = machine_share(data, (101.0, 103.0), threads=2)
    assert (quiet["seconds"], quiet["others_cores"], quiet["shared"]) == (2.0, 0.2, False)
    # half of the first interval inside: its others' 1.8 cores weigh half
    half = machine_share(data, (100.5, 103.0), threads=2)
    assert half["seconds"] == 2.5 and half["others_cores"] == pytest.approx((0.9 + 0.4) / 2.5, abs=0.01)
    assert machine_share(data, (200.0, 210.0), threads=2) is None  # no interval over the steps


def test_threads_that_outnumber_the_cores_left_are_a_shared_machine_only_when_they_waited():
    # others took 0.6 of 2 cores (30%): material in itself
    assert machine_share(rows((2.0, 1.4, 0.0, 1.4, 0.5, 2)), (100.0, 101.0), threads=2)["shared"]
    # 0.4 of 4 cores (10%), but 4 threads outnumber the 3.6 cores left, and they waited 25% of the time
    data = rows((4.0, 3.6, 0.0, 3.6, 1.2, 4))
    data["cores"] = [0, 1, 2, 3]
    crowded = machine_share(data, (100.0, 101.0), threads=4)
    assert crowded["shared"] and crowded["threads_outnumber"]
    # the same, but the threads hardly waited: the others' time fell where the job did not run
    data["rows"][0][6] = 0.1  # waited_s
    assert not machine_share(data, (100.0, 101.0), threads=4)["shared"]
    assert not machine_share(data, (100.0, 101.0), threads=2)["shared"]  # 2 threads fit in 3.6 cores
