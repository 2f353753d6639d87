"""The CLI end to end on a tiny configuration, and one-line errors for bad input."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_lab_end_to_end_writes_every_section_and_reads_at_80_columns(lab_run, tmp_path, capsys):
    from dlscope.cli import main
    from dlscope.cli.lab import LAB_STEPS

    run, proc = lab_run  # tests/conftest.py: the lab with every step, at 80 columns
    assert "where everything is" in proc.stdout and "report.html" in proc.stdout
    # every line fits, but for the run's own paths in "where everything is": those are never cut
    lines = [line for line in proc.stdout.splitlines() if str(run) not in line]
    assert max(len(line) for line in lines) <= 80, max(lines, key=len)
    assert "convolution_backward" in proc.stdout and "…" not in proc.stdout
    results = json.loads((run / "results.json").read_text())
    expected = LAB_STEPS
    assert results["steps"] == expected and results["run"]["status"] == "ok"
    html = (run / "report.html").read_text()
    for name in expected:
        assert f'<section id="{name}">' in html
    assert "<link" not in html and 'src="http' not in html  # self-contained, offline
    assert html.count("data:image/png;base64,") >= 2  # the curves and the top-10 chart
    md = (run / "report.md").read_text()
    assert all(f'<a id="{name}"></a>' in md for name in expected)
    for link in re.findall(r"\]\((figures/[^)]+)\)", md):
        assert (run / link).is_file()
    assert results["sections"]["train"]["final_test_acc"] >= 85
    assert results["sections"]["checkpoint"]["verify"]["ok"]
    assert (run / "profile" / "trace.json").is_file() and (run / "profile" / "top10_ops.csv").is_file()
    assert list((run / "tensorboard" / "test").glob("events.out.tfevents.*"))

    # a checkpoint from the CLI verifies from the CLI, on the test subset its fingerprint records
    assert main(["ckpt", "verify", str(run / "checkpoints" / "final.pt")]) == 0
    assert "identical predictions on 1,000 test images" in capsys.readouterr().out

    # the report renders from results.json alone
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(run / "results.json", alone)
    assert main(["report", str(alone)]) == 0
    assert (alone / "report.html").read_text().count("<section id=") == len(expected)


def test_lab_steps_adds_the_steps_they_need_in_lab_order():
    """--steps checkpoint,profile: checkpoint needs a trained model, so train joins the plan, in lab
    order, and nothing else (that the runner runs exactly the plan's steps: test_iotrace's traced lab)."""
    from dlscope.cli import build_parser

    steps = build_parser().parse_args(["lab", "--steps", "checkpoint,profile"]).steps
    assert steps == ["train", "profile", "checkpoint"]


def one_line_error(capsys, *argv: str) -> str:
    """Run the CLI in-process on bad input: exit status 2 and exactly one line on stderr, no traceback."""
    from dlscope.cli import main

    try:
        code = main(list(argv))
    except SystemExit as e:  # argparse's own errors
        code = e.code
    captured = capsys.readouterr()
    assert code == 2, (captured.out, captured.err)
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    return lines[0]


def test_bad_flags_are_one_line_errors(tmp_path, capsys):
    assert "batch sizes must be ≥ 1" in one_line_error(capsys, "lab", "--batch-size", "0", "--out", str(tmp_path / "r"))
    assert not (tmp_path / "r").exists()  # validated before anything is written
    assert "unknown model 'vgg'; choose from cnn" in one_line_error(capsys, "lab", "--model", "vgg")
    assert "target accuracy" in one_line_error(capsys, "lab", "--target-acc", "101")
    assert "invalid int value" in one_line_error(capsys, "train", "--epochs", "x")


def test_bad_files_are_one_line_errors(tmp_path, capsys):
    line = one_line_error(capsys, "report", str(tmp_path))
    assert str(tmp_path) in line and "no results.json" in line
    (tmp_path / "results.json").write_text("{not json")
    assert "not valid JSON" in one_line_error(capsys, "report", str(tmp_path))
    torn = tmp_path / "torn.pt"
    torn.write_bytes(b"PK\x03\x04" + b"\x00" * 100)
    line = one_line_error(capsys, "ckpt", "verify", str(torn))
    assert str(torn) in line and "not a loadable checkpoint" in line
    assert "does not exist" in one_line_error(capsys, "data", "verify", "--data-dir", str(tmp_path / "none"))
    assert "no tensorboard/ directory" in one_line_error(capsys, "tensorboard", str(tmp_path))


def test_data_verify_and_models(capsys):
    from dlscope.cli import main

    assert main(["data", "verify"]) == 0 and "checksums verified" in capsys.readouterr().out
    assert main(["models"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in ("cnn", "net", "lenet", "mlp"))


@pytest.mark.slow
def test_train_interrupted_then_resumed_matches_uninterrupted(tmp_path):
    """Ctrl-C after epoch 1, then `--resume last.pt`: the final weights equal an uninterrupted run's."""
    import signal
    import time

    import torch

    from dlscope.cli import main

    # the uninterrupted and the resumed runs in this process, the interrupted one in its own (Ctrl-C);
    # one thread in all three, so their float sums are the same whatever the host's core count
    args = [
        "--threads",
        "1",
        "--epochs",
        "2",
        "--train-subset",
        "4000",
        "--test-subset",
        "500",
        "--batch-size",
        "100",
        "--target-acc",
        "100",
        "--no-progress",
        "--no-tensorboard",
        "--model",
        "mlp",
    ]
    assert main(["train", "--out", str(tmp_path / "straight"), *args]) == 0

    cut = tmp_path / "cut"
    proc = subprocess.Popen(
        [sys.executable, "-m", "dlscope.cli", "train", "--out", str(cut), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    last = cut / "checkpoints" / "last.pt"
    deadline = time.time() + 300
    while not last.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    if proc.returncode == 0:
        pytest.skip("the run finished before it could be interrupted (machine too fast for this test)")
    assert proc.returncode == 130 and "interrupted" in err
    assert json.loads((cut / "results.json").read_text())["run"]["status"] == "interrupted"

    resumed = ["train", "--out", str(tmp_path / "resumed"), "--resume", str(last), "--threads", "1"]
    assert main([*resumed, "--no-progress", "--no-tensorboard"]) == 0
    a = torch.load(tmp_path / "straight" / "checkpoints" / "final.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "resumed" / "checkpoints" / "final.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_tensorboard_serves_the_run_on_loopback(tmp_path):
    import socket
    import time
    import urllib.request

    from dlscope.data.mnist import load_mnist
    from dlscope.instruments.tensorboard import TensorBoardObserver
    from dlscope.train import TrainConfig, Trainer

    run = tmp_path / "run"
    trainer = Trainer(
        TrainConfig(epochs=1, train_subset=500, test_subset=100, batch_size=100, log_every=2),
        load_mnist(),
        [TensorBoardObserver(run / "tensorboard")],
    )
    trainer.fit()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "dlscope.cli", "tensorboard", str(run), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline, body = time.time() + 120, ""
        while time.time() < deadline and '"test"' not in body:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/plugin/scalars/tags", timeout=5) as r:
                    body = r.read().decode()
            except OSError:
                time.sleep(0.5)
        tags = json.loads(body)  # run → tags: train and test share the loss and accuracy charts
        assert {"loss", "accuracy"} <= set(tags["train"]) & set(tags["test"])
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_report_of_an_older_run_notes_what_it_cannot_read_but_a_renderer_bug_fails(tmp_path):
    from dlscope.report.render import render_report
    from dlscope.rundir import RunDir

    run = RunDir(tmp_path / "r", "lab", argv=["lab"])
    run.record("environment", {"unexpected": "shape"})  # a known section in a form its renderer cannot read
    run.record("from_the_future", {"x": 1})  # a section no renderer knows
    run.finish("ok")
    with pytest.raises(KeyError):  # this version wrote it: the renderer is wrong, and says so
        render_report(run.path)
    run.results["schema_version"] = 1  # an older dlscope wrote it
    run.save()
    html, _ = render_report(run.path)
    text = html.read_text()
    assert "Written by an older dlscope" in text and "No renderer for this section" in text


def test_options_are_never_abbreviated_and_lab_steps_are_checked(tmp_path, capsys):
    from dlscope.cli import main

    for bad in (["lab", "--trace-i"], ["lab", "--steps", "train,nonsense"], ["trace", "--back", "proc", "--", "true"]):
        with pytest.raises(SystemExit) as e:
            main([*bad, "--out", str(tmp_path / "run")])
        assert e.value.code == 2, bad
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "error" in err, err
    assert not (tmp_path / "run").exists()


def test_help_and_option_checks_import_no_torch():
    probe = (
        "import sys, contextlib, io\n"
        "from dlscope.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    for argv in (['--help'], ['lab', '--help'], ['ckpt', 'inspect', '--help'],\n"
        "                 ['pipeline', 'sweep', '--help']):\n"
        "        try:\n"
        "            main(argv)\n"
        "        except SystemExit:\n"
        "            pass\n"
        "print(sorted(m for m in ('torch', 'matplotlib') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_inspecting_files_that_are_not_torch_checkpoints_imports_no_torch(tmp_path):
    import struct

    fixtures = Path(__file__).parent / "fixtures" / "tf"
    safetensors = tmp_path / "model.safetensors"
    header = json.dumps({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}).encode()
    safetensors.write_bytes(struct.pack("<Q", len(header)) + header + bytes(16))
    for path in (safetensors, fixtures / "bundle" / "ckpt-1", fixtures / "model.weights.h5", fixtures / "model.keras"):
        probe = (
            "import sys, contextlib, io\n"
            "from dlscope.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    code = main(['ckpt', 'inspect', {str(path)!r}])\n"
            "print(code, sorted(m for m in ('torch', 'matplotlib', 'tensorflow') if m in sys.modules))\n"
        )
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "0 []", (path, done.stdout)
