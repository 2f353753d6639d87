"""Text from a traced program, a file name or a checkpoint is printed as text: rich markup in it
cannot crash the printer and ESC sequences cannot reach the terminal or the reports."""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import dlscope as dlscope_package
from dlscope.supervise.iotrace.tracer import availability

MARKUP = "[/x]markup[bold].bin"  # a file `x]markup[bold].bin` in a directory named `[`
ESCAPES = "esc\x1b[31mred\x1b]0;title\x07.bin"  # colour, then an OSC that retitles the terminal
WRITER = textwrap.dedent(
    f"""
    import os
    os.makedirs("[", exist_ok=True)
    for name in {[MARKUP, ESCAPES]!r}:
        with open(name, "wb") as f:  # large, so a tracer that counts bytes ranks them first
            f.write(b"x" * 300_000)
    """
)


def dlscope(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    # run elsewhere, the child must still import this dlscope, not whichever one is installed
    source = str(Path(dlscope_package.__file__).resolve().parents[1])
    env = {
        **os.environ,
        "COLUMNS": "80",
        "PYTHONPATH": os.pathsep.join(filter(None, [source, os.environ.get("PYTHONPATH")])),
    }
    return subprocess.run(
        [sys.executable, "-m", "dlscope.cli", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300
    )


def assert_printed_as_text(proc: subprocess.CompletedProcess, code: int, run: Path | None = None) -> None:
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr and "MarkupError" not in proc.stderr
    assert "\x1b" not in proc.stdout + proc.stderr
    # at most 80 columns, but for a run's own path, which is printed whole however long
    lines = [line for line in proc.stdout.splitlines() if not (run and str(run) in line)]
    assert all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]


@pytest.mark.parametrize("backend", ["proc", "strace"])
def test_trace_prints_file_names_with_markup_and_escapes_as_text(tmp_path, backend):
    why = availability()[backend]
    if why is not None:
        pytest.skip(f"{backend}: {why}")
    (tmp_path / "writer.py").write_text(WRITER)
    run = tmp_path / "run"
    proc = dlscope("trace", "--backend", backend, "--out", str(run), "--", sys.executable, "writer.py", cwd=tmp_path)
    assert_printed_as_text(proc, 0, run)
    if backend == "strace":  # it counts bytes per file: the two files top the terminal's table
        unfolded = re.sub(r"\s*\n\s*", "", proc.stdout)  # long paths fold at 80 columns
        assert "markup[bold].bin" in unfolded and "esc\\x1b[31mred" in unfolded
    for report in ("report.md", "report.html"):
        text = (run / report).read_text()
        assert "\x1b" not in text and "\x07" not in text
        assert "markup[bold].bin" in text and "esc\\x1b[31mred\\x1b]0;title\\x07.bin" in text


UNDECODABLE = b"raw-\xff\xfe.bin"  # a file name that is no UTF-8: Linux allows any bytes but / and NUL
TRAINS_ON_IT = textwrap.dedent(
    f"""
    import torch
    with open({UNDECODABLE!r}, "wb") as f:
        f.write(b"x" * 1000)
    open({UNDECODABLE!r}, "rb").read()
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        optimizer.zero_grad()
        model(torch.randn(2, 4)).sum().backward()
        optimizer.step()
    """
)


@pytest.mark.parametrize("backend", ["ebpf", "proc"])
def test_run_trace_io_keeps_a_file_name_that_is_no_utf8_byte_for_byte(tmp_path, backend):
    """The run's timeline carries the traced calls' paths: one not in UTF-8 is written as \\udcXX
    escapes (json.loads and os.fsencode give its bytes back), where it once ended the run in a
    UnicodeEncodeError."""
    why = availability()[backend]
    if why is not None:
        pytest.skip(f"{backend}: {why}")
    (tmp_path / "train.py").write_text(TRAINS_ON_IT)
    run = tmp_path / "run"
    argv = ["run", "--trace-io", "--trace-backend", backend, "--out", str(run), "--", sys.executable, "train.py"]
    assert_printed_as_text(dlscope(*argv, cwd=tmp_path), 0, run)
    timeline = json.loads((run / "timeline.json").read_text(encoding="utf-8"))
    paths = {e["args"]["path"] for e in timeline["traceEvents"] if "path" in e.get("args", {})}
    # the script gave it relative: every backend joins it to the working directory
    assert os.fsencode(str(tmp_path)) + b"/" + UNDECODABLE in {os.fsencode(p) for p in paths}


def test_ckpt_inspect_prints_pickle_keys_and_values_as_text(tmp_path):
    state = {"[/bold]key\x1b[2J": "[/bold]value\x1b]0;pwned\x07", "[/x]weights": [1.0, 2.0]}
    path = tmp_path / "state.pkl"
    path.write_bytes(pickle.dumps(state, protocol=2))
    proc = dlscope("ckpt", "inspect", str(path), cwd=tmp_path)
    assert_printed_as_text(proc, 0)
    assert "[/bold]key\\x1b[2J" in proc.stdout
