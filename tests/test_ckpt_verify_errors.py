"""`dlscope ckpt verify` of anything that is not a checkpoint: one line naming the file, exit 2 —
never torch's traceback, never its advice to retry with weights_only=False."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dlscope.checkpoint import save_checkpoint
from dlscope.cli import main
from dlscope.models import build_model


def verify(path, capsys) -> tuple[int, str]:
    code = main(["ckpt", "verify", str(path)])
    out = capsys.readouterr()
    return code, out.out + out.err


def assert_one_line(code: int, output: str, path, *fragments: str) -> None:
    assert code == 2, output
    lines = output.strip().splitlines()
    assert len(lines) == 1, output
    assert lines[0].startswith(f"dlscope: error: {path}: ")
    for torch_text in ("Traceback", "weights_only` set to `False", "add_safe_globals"):
        assert torch_text not in output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def real_checkpoint(path) -> bytes:
    state = {"model": build_model("cnn").state_dict(), "config": {"model": "cnn"}, "epoch": 1}
    save_checkpoint(path, state)
    return path.read_bytes()


@pytest.mark.parametrize(
    ("name", "make", "fragment"),
    [
        ("text.txt", lambda p: p.write_text("root:x:0:0:root:/root:/bin/bash\n"), "a text file"),
        ("empty.pt", lambda p: p.write_bytes(b""), "empty file"),
        ("noise.bin", lambda p: p.write_bytes(bytes(range(7, 256)) * 4), "unknown bytes"),
        ("numpy.pt", lambda p: torch.save({"model": np.arange(3), "config": {}}, p), "the safe loader refused"),
        ("legacy-torn.pt", lambda p: p.write_bytes(b"\x80\x02abc"), "torch.load cannot read it"),
        ("tensor.pt", lambda p: torch.save(torch.zeros(3), p), "not a dlscope checkpoint"),
    ],
)
def test_verify_of_a_non_checkpoint_is_one_line(tmp_path, capsys, name, make, fragment):
    path = tmp_path / name
    make(path)
    assert_one_line(*verify(path, capsys), path, fragment)


def test_verify_of_etc_passwd_a_directory_and_a_cut_checkpoint(tmp_path, capsys):
    assert_one_line(*verify("/etc/passwd", capsys), "/etc/passwd", "not a PyTorch checkpoint")
    assert_one_line(*verify(tmp_path, capsys), tmp_path, "is a directory")
    whole = real_checkpoint(tmp_path / "whole.pt")
    cut = tmp_path / "cut.pt"
    cut.write_bytes(whole[: len(whole) // 2])
    assert_one_line(*verify(cut, capsys), cut, "cut short")


def test_verify_of_weights_that_do_not_fit_the_model(tmp_path, capsys):
    path = tmp_path / "wrong.pt"
    fingerprint = {"samples": 10_000, "predictions_sha256": "0", "accuracy": 0.0}
    state = {"model": build_model("mlp").state_dict(), "config": {"model": "cnn"}, "fingerprint": fingerprint}
    torch.save(state, path)
    assert_one_line(*verify(path, capsys), path, "do not load into a fresh model")
