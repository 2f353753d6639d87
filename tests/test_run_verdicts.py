"""`dlscope run`'s verdicts against scripts that know their own truth (tests/scripts/known_truth.py
times itself): each share within ±3 percentage points of the truth, and no script without a data
source called input-bound. Each run is a few seconds: 40 steps of ~10 ms (120 where one share is
within a few ms of its bound)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from dlscope.report.sections import anatomy as anatomy_words

pytestmark = pytest.mark.timing  # each share within TOLERANCE_PP of the script's own clocks

SCRIPT = Path(__file__).parent / "scripts" / "known_truth.py"
TOLERANCE_PP = 3.0
OWN_CALLS_PP = 5.0  # "other" over the truth: dlscope's own calls, which the script's clocks hold


@pytest.fixture
def observe(tmp_path, observe_script):
    def run(*args: str) -> tuple[dict, dict]:
        truth = tmp_path / "truth.json"
        command = [sys.executable, str(SCRIPT), str(truth), *args]
        results, code = observe_script(command, tmp_path / "run", profile_steps=0)
        assert code == 0
        return results["sections"], json.loads(truth.read_text())

    return run


@pytest.mark.parametrize("workers", [0, 2])
def test_a_decoding_dataloader_gets_its_measured_share(observe, workers):
    # 120 steps: a stall of ~15 ms (a loaded machine) is then under a point of the share
    sections, truth = observe("--loader", "decode", "--decode-ms", "2", "--workers", str(workers), "--steps", "120")
    anatomy = sections["anatomy"]
    verdict = anatomy["verdict"]
    assert verdict["key"] == "input_bound" and anatomy["data_source"] == "loader"
    assert verdict["data_pct"] == pytest.approx(truth["data_pct"], abs=TOLERANCE_PP)
    if workers == 0:  # 8 ms of decoding against a 4 ms forward: input-bound by any measure
        assert verdict["level"] == "highly"
    level, text = anatomy_words.verdict(verdict)
    assert f"{verdict['data_pct']:.1f}%" in text and level == anatomy_words.LEVEL_STYLE[verdict["level"]]


@pytest.mark.parametrize("loader", ["none", "prefetched", "thread"])
def test_no_data_source_is_never_called_input_bound(observe, loader):
    """thread: the DataLoader is drawn in a prefetching thread, never in the loop's own: its time
    there is no wait of the loop's (the loop's wait is on the queue, in the gap)."""
    sections, truth = observe("--loader", loader, "--decode-ms", "1")
    anatomy = sections["anatomy"]
    verdict = anatomy["verdict"]
    assert verdict["key"] == "no_data_source" and anatomy["percent"]["data"] == 0
    assert (verdict["batches_elsewhere"] >= truth["steps"]) == (loader == "thread")
    if loader == "thread":  # the batch x-ray joins none of those batches to a step, and counts no wait
        batches = sections["batches"]
        # taken by the thread during a step: all but those it took before the first step began
        # (its queue holds 4, and a fifth waits in its put)
        assert batches["in_steps"] == 0 and batches["taken_elsewhere"] >= truth["steps"] - 5
        assert not batches["longest_waits"] and not batches["shares"]
    # the gap before the first forward: batch building in the loop (none), a list's next (prefetched)
    assert verdict["gap_pct"] == pytest.approx(truth["before_forward_pct"], abs=TOLERANCE_PP)
    level, text = anatomy_words.verdict(verdict)
    assert level == "info" and "input-bound" not in text


@pytest.mark.parametrize("loader", ["decode", "none"])
def test_a_no_grad_forward_in_each_step_is_the_steps_not_an_evaluation(observe, loader):
    """A frozen teacher's forward under no_grad at each step (distillation; DQN's target network):
    after the batch is drawn it is the step's forward; with no data source, before the model's
    forward, it is the step's gap. Never an evaluation phase per step."""
    sections, truth = observe("--loader", loader, "--decode-ms", "0.5", "--teacher-ms", "3")
    anatomy = sections["anatomy"]
    if loader == "decode":
        assert anatomy["percent"]["forward"] == pytest.approx(truth["forward_pct"], abs=TOLERANCE_PP)
        assert anatomy["percent"]["data"] == pytest.approx(truth["data_pct"], abs=TOLERANCE_PP)
    else:
        assert anatomy["verdict"]["gap_pct"] == pytest.approx(truth["before_forward_pct"], abs=TOLERANCE_PP)
    assert not [t for t in sections["phases"]["totals"] if t["phase"] == "eval"]


def test_a_sleep_in_the_loop_body_is_other_not_data(observe):
    """The sleep is "other": not data, not lost. The script's clocks also hold dlscope's own calls
    around each part (the loader hook's records, the step machine), which dlscope's clocks leave to
    "other". Measured part by part against the script's clocks on this kind of VM: 5-25 µs a call,
    and ~0.15 ms in 10-30% of calls (not system calls, page faults or the GC), +1 to +4 points of
    "other" at this ~12 ms step (CI failed at +3.3 against ±3). The allowance above is that."""
    sections, truth = observe("--loader", "decode", "--decode-ms", "0.2", "--sleep-ms", "6", "--steps", "120")
    anatomy = sections["anatomy"]
    assert anatomy["percent"]["data"] == pytest.approx(truth["data_pct"], abs=TOLERANCE_PP)
    assert truth["other_pct"] - TOLERANCE_PP <= anatomy["percent"]["other"] <= truth["other_pct"] + OWN_CALLS_PP
    assert truth["other_pct"] > 20  # the 6 ms sleep is most of it
    assert anatomy["verdict"]["level"] != "highly"


def test_a_forward_called_directly_is_timed_whole(observe):
    """`model.forward(x)` (pytorch/examples' forward-forward MNIST calls `self.forward`): past
    `__call__`, only the Linear inside was timed, and the forward's own 4 ms were "other"."""
    sections, truth = observe("--loader", "decode", "--decode-ms", "0.2", "--direct-forward", "--steps", "120")
    anatomy = sections["anatomy"]
    assert anatomy["percent"]["forward"] == pytest.approx(truth["forward_pct"], abs=TOLERANCE_PP)
    assert anatomy["percent"]["other"] == pytest.approx(truth["other_pct"], abs=TOLERANCE_PP)
