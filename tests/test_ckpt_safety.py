"""Malicious pickles — bare and inside torch zips, protocols 0–5, every opcode that reaches a global —
are flagged with their byte offsets, and a canary file proves that inspecting them ran nothing."""

from __future__ import annotations

import copyreg
import io
import os
import pickle
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from dlscope.ckpt.inspect import inspect_checkpoint


class Call:
    """Pickles as `func(*args)`: what an attacker's __reduce__ returns."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def touch_command(canary: Path) -> str:
    return f"touch {canary}"


def by_reduce(canary: Path, protocol: int) -> bytes:
    return pickle.dumps({"weights": [1.0, 2.0], "x": Call(os.system, touch_command(canary))}, protocol=protocol)


def by_eval(canary: Path, protocol: int) -> bytes:
    return pickle.dumps(Call(eval, f"open({str(canary)!r}, 'w').close()"), protocol=protocol)


def by_nested_reduce(canary: Path) -> bytes:
    # getattr(__import__('os'), 'system')('touch …'): three REDUCEs, the callee itself built by one
    return (
        b"\x80\x02cbuiltins\ngetattr\ncbuiltins\n__import__\nX\x02\x00\x00\x00os\x85R"
        b"X\x06\x00\x00\x00system\x86R"
        + b"X"
        + len(touch_command(canary)).to_bytes(4, "little")
        + touch_command(canary).encode()
        + b"\x85R."
    )


def by_stack_global_from_memo(canary: Path) -> bytes:
    # protocol 4: the module and name are memoised, popped, and fetched back with BINGET before STACK_GLOBAL
    cmd = touch_command(canary).encode()
    return b"\x80\x04\x8c\x02os\x94\x8c\x06system\x9400h\x00h\x01\x93" + b"\x8c" + bytes([len(cmd)]) + cmd + b"\x85R."


def by_inst(canary: Path) -> bytes:
    # protocol 0 INST: the class is named inline and called with the marked arguments
    return b"(S'" + touch_command(canary).encode() + b"'\nios\nsystem\n."


def by_obj(canary: Path) -> bytes:
    # protocol 1 OBJ: the callable comes off the stack after MARK
    cmd = touch_command(canary).encode()
    return b"(cos\nsystem\nU" + bytes([len(cmd)]) + cmd + b"o."


def by_subprocess(canary: Path) -> bytes:
    return pickle.dumps(Call(subprocess.check_call, ["touch", str(canary)]), protocol=2)


def by_extension_registry(canary: Path) -> bytes:
    copyreg.add_extension("os", "system", 0xBEEF)
    try:
        return pickle.dumps(Call(os.system, touch_command(canary)), protocol=2)
    finally:
        copyreg.remove_extension("os", "system", 0xBEEF)


def in_torch_zip(canary: Path) -> bytes:
    """A real torch.save file whose pickle also calls os.system (posix.system on Linux)."""
    buffer = io.BytesIO()
    torch.save({"weight": torch.ones(3), "payload": Call(os.system, touch_command(canary))}, buffer)
    return buffer.getvalue()


CORPUS = {
    **{f"reduce-os.system-protocol-{p}": (lambda c, p=p: by_reduce(c, p)) for p in range(6)},
    **{f"eval-protocol-{p}": (lambda c, p=p: by_eval(c, p)) for p in range(6)},
    "nested-reduce-getattr-import": by_nested_reduce,
    "stack-global-from-memo": by_stack_global_from_memo,
    "inst-protocol-0": by_inst,
    "obj-protocol-1": by_obj,
    "subprocess-check-call": by_subprocess,
    "copyreg-extension": by_extension_registry,
    "torch-zip-os.system": in_torch_zip,
}


@pytest.mark.parametrize("name", list(CORPUS))
def test_malicious_pickle_is_flagged_and_nothing_runs(tmp_path, name):
    canary = tmp_path / "CANARY"
    path = tmp_path / f"{name}.pt"
    path.write_bytes(CORPUS[name](canary))
    anatomy = inspect_checkpoint(path, stats=True)
    assert not anatomy.safe_to_load
    bad = [f for f in anatomy.findings if f.level in ("bad", "warn")]
    assert bad, anatomy.findings
    if name != "copyreg-extension":  # an extension code names no module; it is a finding of its own
        assert any(f.level == "bad" for f in bad)
    assert not canary.exists(), "inspecting the file ran its payload"


def test_payloads_are_live(tmp_path):
    """The corpus is not a strawman: plain pickle.loads really runs a payload (in a child process)."""
    canary = tmp_path / "CANARY"
    path = tmp_path / "evil.pkl"
    path.write_bytes(by_stack_global_from_memo(canary))
    subprocess.run([sys.executable, "-c", f"import pickle; pickle.loads(open({str(path)!r}, 'rb').read())"], check=True)
    assert canary.exists()


def test_finding_names_global_and_its_byte_offset(tmp_path):
    canary = tmp_path / "CANARY"
    data = by_reduce(canary, 2)
    path = tmp_path / "evil.pkl"
    path.write_bytes(data)
    anatomy = inspect_checkpoint(path)
    (finding,) = [f.values for f in anatomy.findings if "system" in f.values["name"]]
    assert finding["opcode"] == "GLOBAL" and finding["name"] in ("posix.system", "os.system")
    offset = int(finding["where"].rsplit("byte ", 1)[1])
    assert data[offset : offset + 1] == b"c"  # the GLOBAL opcode itself
    assert data[offset + 1 :].startswith(finding["name"].rsplit(".", 1)[0].encode())


def test_torch_zip_payload_agrees_with_torch_weights_only(tmp_path):
    canary = tmp_path / "CANARY"
    path = tmp_path / "evil.pt"
    path.write_bytes(in_torch_zip(canary))
    anatomy = inspect_checkpoint(path)
    assert [t.name for t in anatomy.tensors] == ["weight"]  # the tensors are still listed
    found = [f.values for f in anatomy.findings]
    assert any("system" in f["name"] and f["where"].startswith("archive/data.pkl @ byte") for f in found)
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path, weights_only=True)
    assert not canary.exists()


def test_unknown_but_harmless_global_is_a_finding(tmp_path):
    import argparse

    path = tmp_path / "namespace.pt"
    torch.save({"w": torch.zeros(2), "args": argparse.Namespace(lr=0.1)}, path)
    anatomy = inspect_checkpoint(path)
    assert not anatomy.safe_to_load
    assert [(f.level, f.values["name"]) for f in anatomy.findings] == [("bad", "argparse.Namespace")]
    assert anatomy.metadata["args.<argparse.Namespace>.lr"] == 0.1  # its state is shown, inert


@pytest.mark.slow
def test_cli_exit_status_says_whether_safe(tmp_path):
    canary = tmp_path / "CANARY"
    evil, good = tmp_path / "evil.pt", tmp_path / "good.pt"
    evil.write_bytes(in_torch_zip(canary))
    torch.save({"w": torch.ones(2)}, good)
    run = [sys.executable, "-m", "dlscope.cli", "ckpt", "inspect"]
    flagged = subprocess.run([*run, str(evil)], capture_output=True, text=True, timeout=60)
    assert flagged.returncode == 1 and "NOT safe to torch.load" in flagged.stdout
    assert "system" in flagged.stdout
    assert subprocess.run([*run, str(good)], capture_output=True, timeout=60).returncode == 0
    assert not canary.exists()


def test_zip_member_named_data_pkl_elsewhere_is_not_trusted(tmp_path):
    # a zip with data.pkl but a payload: detection by content, the pickle still goes through the scan
    path = tmp_path / "fake.pt"
    canary = tmp_path / "CANARY"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", by_reduce(canary, 2))
    anatomy = inspect_checkpoint(path)
    assert not anatomy.safe_to_load and not canary.exists()
