"""`dlscope ckpt scan`: every pickle in a file is read, what it would run is reported with its byte offset
even when the stream breaks afterwards, and a canary file proves nothing ran. Three verdicts, three exit
codes: safe 0, dangerous 1, damaged 2."""

from __future__ import annotations

import io
import json
import os
import pickle
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlscope.ckpt.allowlist import TORCH_WEIGHTS_ONLY
from dlscope.ckpt.scan import scan_file
from dlscope.cli import main
from dlscope.report.sections.ckpt_scan import summary


class Call:
    """Pickles as `func(*args)`: what an attacker's __reduce__ returns."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


class Estimator:
    """A scikit-learn style model: a class of its own holding numpy arrays and hyperparameters."""

    def __init__(self):
        self.coef_ = np.arange(6, dtype=np.float64).reshape(2, 3)
        self.classes_ = np.array(["a", "b"], dtype=object)
        self.C = 1.0


def system_call(canary: Path) -> bytes:
    """GLOBAL os system; the command; TUPLE1; REDUCE — protocol 2, no STOP: callers add the ending."""
    cmd = f"touch {canary}".encode()
    return b"\x80\x02cos\nsystem\nX" + struct.pack("<I", len(cmd)) + cmd + b"\x85R"


def write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def scan_cli(capsys, *args: str) -> tuple[int, str]:
    code = main(["ckpt", "scan", *args])
    return code, capsys.readouterr().out


def test_allow_list_is_torch_weights_only_allow_list():
    from torch._weights_only_unpickler import _get_allowed_globals

    assert set(_get_allowed_globals()) == TORCH_WEIGHTS_ONLY


def test_scanning_imports_no_torch(tmp_path):
    good = tmp_path / "good.pt"
    torch.save({"w": torch.ones(2)}, good)
    np.save(tmp_path / "a.npy", np.arange(3))
    code = (
        "import sys; from dlscope.cli import main; "
        f"rc = main(['ckpt', 'scan', {str(tmp_path)!r}]); "
        "print(rc, sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip().splitlines()[-1] == "0 []"


def test_second_pickle_in_a_stream_is_read(tmp_path, capsys):
    canary = tmp_path / "CANARY"
    first = pickle.dumps([1, 2, 3], protocol=2)
    path = write(tmp_path, "two.pkl", first + system_call(canary) + b".")
    report = scan_file(path)
    assert report.verdict == "dangerous" and report.exit_code == 1
    reduce = next(e for p in report.pickles for e in p.scan.events if e.opcode == "REDUCE")
    assert reduce.name == "os.system" and path.read_bytes()[reduce.position : reduce.position + 1] == b"R"
    assert report.pickles[1].where == "pickle #2" and report.pickles[1].scan.start == len(first)
    code, out = scan_cli(capsys, str(path))
    assert code == 1 and "os.system called by REDUCE" in out and "pickle #2" in out
    assert not canary.exists()


def test_trailing_bytes_that_are_no_pickle_are_a_finding(tmp_path):
    data = pickle.dumps({"a": 1}, protocol=2)
    report = scan_file(write(tmp_path, "tail.pkl", data + b"\xff\xfe junk"))
    assert report.verdict == "safe"
    (tail,) = [f for f in report.findings if f.key == "scan.after_stop"]
    assert tail.values == {"bytes": 7, "where": f"pickle @ {len(data)}"}


BREAKS = {
    "broken memo reference": (b"0h\x03.", "memo 3 never stored"),
    "invalid opcode": (b"0\xff.", "invalid opcode 0xff"),
    "STACK_GLOBAL on an int": (b"K\x01K\x02\x93.", "STACK_GLOBAL on a int and a int"),
    "truncated string": (b"X\x00\x00\x01\x00abc", "truncated"),
}


@pytest.mark.parametrize("name", list(BREAKS))
def test_payload_before_a_break_is_dangerous_with_the_evidence(tmp_path, capsys, name):
    canary = tmp_path / "CANARY"
    head = system_call(canary)
    tail, reason = BREAKS[name]
    path = write(tmp_path, "evil.pkl", head + tail)
    report = scan_file(path)
    assert report.verdict == "dangerous"
    line = summary(report.evidence())
    assert line.startswith(f"DANGEROUS: os.system called by REDUCE @ {len(head) - 1}, before the stream breaks @ ")
    assert reason in line
    code, out = scan_cli(capsys, str(path))
    assert code == 1 and "os.system" in out
    inspected = main(["ckpt", "inspect", str(path)])
    assert inspected == 1 and "os.system called by REDUCE" in capsys.readouterr().out
    assert not canary.exists()


def test_payload_before_a_break_really_runs_under_pickle_load(tmp_path):
    """The corpus is no strawman: plain pickle.load runs the command, then fails on the broken memo."""
    canary = tmp_path / "CANARY"
    path = write(tmp_path, "evil.pkl", system_call(canary) + b"0h\x03.")
    child = subprocess.run(
        [sys.executable, "-c", f"import pickle; pickle.load(open({str(path)!r}, 'rb'))"],
        capture_output=True,
        timeout=60,
    )
    assert child.returncode != 0 and b"Memo value not found" in child.stderr
    assert canary.exists()


def test_build_that_rewrites_a_module_is_dangerous(tmp_path):
    # torch._utils (on no allow-list) fetched as a global, then BUILD with builtins' dict as its state
    data = b"\x80\x02ctorch\n_utils\n}X\x04\x00\x00\x00evalcbuiltins\neval\nsb."
    report = scan_file(write(tmp_path, "build.pkl", data))
    assert report.verdict == "dangerous"
    events = [(e.name, e.opcode) for p in report.pickles for e in p.scan.events]
    assert ("torch._utils", "GLOBAL") in events and ("torch._utils", "BUILD") in events


def test_build_on_an_allowed_function_is_dangerous(tmp_path):
    # the global itself is allowed, but BUILD would overwrite its attributes
    data = b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n}X\x01\x00\x00\x00aK\x01sb."
    report = scan_file(write(tmp_path, "build.pkl", data))
    (event,) = [e for p in report.pickles for e in p.scan.events if not e.allowed]
    assert report.verdict == "dangerous" and (event.opcode, event.position) == ("BUILD", len(data) - 2)


def opcode_paths(canary: Path) -> dict[str, tuple[bytes, str]]:
    """Each opcode that reaches Python code, as a payload: (pickle, the opcode recorded for the call)."""
    cmd = f"touch {canary}".encode()
    s = b"X" + struct.pack("<I", len(cmd)) + cmd
    return {
        "INST": (b"(S'" + cmd + b"'\nios\nsystem\n.", "INST"),
        "OBJ": (b"(cos\nsystem\n" + s + b"o.", "OBJ"),
        "NEWOBJ": (b"\x80\x02cos\nsystem\n" + s + b"\x85\x81.", "NEWOBJ"),
        "NEWOBJ_EX": (b"\x80\x04\x8c\x02os\x8c\x06system\x93" + s + b"\x85}\x92.", "NEWOBJ_EX"),
        "STACK_GLOBAL from memo": (
            b"\x80\x04\x8c\x02os\x94\x8c\x06system\x9400h\x00h\x01\x93" + s + b"\x85R.",
            "REDUCE",
        ),
        "EXT1": (b"\x80\x02\x82\x07" + s + b"\x85R.", "REDUCE"),
        "REDUCE of a REDUCE": (
            b"\x80\x02cbuiltins\ngetattr\ncbuiltins\n__import__\nX\x02\x00\x00\x00os\x85RX\x06\x00\x00\x00system\x86R"
            + s
            + b"\x85R.",
            "REDUCE",
        ),
    }


@pytest.mark.parametrize(
    "name", ["INST", "OBJ", "NEWOBJ", "NEWOBJ_EX", "STACK_GLOBAL from memo", "EXT1", "REDUCE of a REDUCE"]
)
def test_every_opcode_that_reaches_code_is_recorded(tmp_path, name):
    canary = tmp_path / "CANARY"
    data, opcode = opcode_paths(canary)[name]
    report = scan_file(write(tmp_path, "evil.pkl", data))
    assert report.verdict == "dangerous", report.evidence()
    calls = [e for p in report.pickles for e in p.scan.events if e.call and not e.allowed]
    assert calls and calls[-1].opcode == opcode
    assert data[calls[-1].position : calls[-1].position + 1] == getattr(pickle, opcode)
    assert not canary.exists()


@pytest.mark.parametrize("protocol", range(6))
def test_every_protocol_names_the_global_at_its_offset(tmp_path, protocol):
    canary = tmp_path / "CANARY"
    data = pickle.dumps({"w": [1.0], "x": Call(os.system, f"touch {canary}")}, protocol=protocol)
    report = scan_file(write(tmp_path, "evil.pkl", data))
    (imported,) = [e for e in report.pickles[0].scan.events if not e.call]
    assert imported.name == "posix.system" and report.exit_code == 1
    assert data[imported.position : imported.position + 1] == (b"c" if protocol < 4 else b"\x93")
    assert not canary.exists()


def torch_zip_bytes(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def test_duplicate_member_first_malicious_is_dangerous(tmp_path):
    canary = tmp_path / "CANARY"
    benign = zipfile.ZipFile(io.BytesIO(torch_zip_bytes({"w": torch.ones(2)})))
    path = tmp_path / "dup.pt"
    with zipfile.ZipFile(path, "w") as out, pytest.warns(UserWarning, match="Duplicate name"):
        for info in benign.infolist():
            if info.filename.endswith("/data.pkl"):
                out.writestr(info.filename, system_call(canary) + b".")
            out.writestr(info.filename, benign.read(info.filename))
    report = scan_file(path)
    assert report.verdict == "dangerous"
    assert any(f.key == "zip.duplicate" and f.level == "bad" for f in report.findings)
    assert [p.where for p in report.pickles] == ["archive/data.pkl", "archive/data.pkl"]
    assert not canary.exists()


def patched(data: bytes, offset: int, fmt: str, value: int) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


def test_zip_findings_have_offsets(tmp_path):
    data = torch_zip_bytes({"w": torch.ones(4)})
    zf = zipfile.ZipFile(io.BytesIO(data))
    storage = next(i for i in zf.infolist() if "/data/0" in i.filename)
    # a flipped byte in a storage: the CRC no longer matches (torch.load would not notice)
    name_len, extra_len = struct.unpack_from("<HH", data, storage.header_offset + 26)  # the local header's own
    data_offset = storage.header_offset + 30 + name_len + extra_len
    crc = scan_file(write(tmp_path, "crc.pt", patched(data, data_offset, "<B", data[data_offset] ^ 0xFF)))
    assert crc.verdict == "damaged" and crc.exit_code == 2
    assert any(f.key == "zip.crc" and f.values["where"] == f"@ {data_offset}" for f in crc.findings)
    # the local header's CRC disagrees with the central directory's (torch writes none: it uses data descriptors)
    local = scan_file(write(tmp_path, "local.zip", patched(zip_with_gap(b""), 14, "<I", 0)))
    said = summary(local.evidence())
    assert said.startswith("DAMAGED: ") and "local header says CRC 00000000" in said and local.verdict == "damaged"
    # the encryption flag set in both headers: the member cannot be read
    entry = data.index(b"PK\x01\x02" + data[zf.start_dir + 4 : zf.start_dir + 6], zf.start_dir)
    while data[entry + 46 : entry + 46 + len(storage.filename)] != storage.filename.encode():
        entry = data.index(b"PK\x01\x02", entry + 4)
    flagged = patched(patched(data, storage.header_offset + 6, "<H", 1), entry + 8, "<H", 1)
    encrypted = scan_file(write(tmp_path, "enc.pt", flagged))
    assert any(f.key == "zip.encrypted" for f in encrypted.findings) and encrypted.verdict == "damaged"
    # bytes appended between the last member and the central directory
    after = scan_file(write(tmp_path, "after.zip", zip_with_gap(b"\x00" * 100)))
    assert any(f.key == "zip.after_last" and f.values == {"bytes": 100, "where": "@ 57"} for f in after.findings)
    appended = scan_file(write(tmp_path, "appended.zip", zip_with_gap(b"") + b"\x00" * 7))
    assert any(f.key == "zip.after_directory" and f.values["bytes"] == 7 for f in appended.findings)


def zip_with_gap(gap: bytes) -> bytes:
    """A one-member zip with `gap` between the member and the central directory, which owns no member."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        z.writestr("a/data.pkl", pickle.dumps({"a": 1}, protocol=2))
    data, directory = buffer.getvalue(), zipfile.ZipFile(buffer).start_dir
    moved = data[:directory] + gap + data[directory:]
    return patched(moved, len(moved) - 22 + 16, "<I", directory + len(gap))  # the end record's directory offset


def test_pickle_in_front_of_a_zip_is_read(tmp_path):
    canary = tmp_path / "CANARY"
    data = system_call(canary) + b"." + torch_zip_bytes({"w": torch.ones(2)})
    report = scan_file(write(tmp_path, "polyglot.pt", data))
    assert report.verdict == "dangerous" and report.pickles[0].where == "bytes before the first member"
    assert any(f.key == "zip.before_first" for f in report.findings)
    assert not canary.exists()


def test_benign_checkpoints_are_safe(tmp_path, capsys):
    from safetensors.numpy import save_file

    state = {"w": torch.ones(3), "opt": {"lr": 0.1}, "meta": __import__("collections").OrderedDict(a=1)}
    torch.save(state, tmp_path / "zip.pt")
    torch.save(state, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    save_file({"w": np.ones(3, dtype=np.float32)}, str(tmp_path / "w.safetensors"))
    np.savez(tmp_path / "numbers.npz", a=np.arange(3), b=np.ones((2, 2)))
    np.savez_compressed(tmp_path / "packed.npz", a=np.arange(3))
    np.save(tmp_path / "strings.npy", np.array(["a", None, 3], dtype=object), allow_pickle=True)
    code, out = scan_cli(capsys, str(tmp_path))
    assert code == 0, out
    assert "6 files: 6 safe, 0 dangerous, 0 damaged" in out
    assert (
        scan_file(tmp_path / "legacy.pt").format.startswith("legacy")
        and len(scan_file(tmp_path / "legacy.pt").pickles) == 5
    )


def test_npy_header_and_object_array_payload(tmp_path):
    canary = tmp_path / "CANARY"
    np.save(tmp_path / "evil.npy", np.array([1, Call(os.system, f"touch {canary}")], dtype=object), allow_pickle=True)
    report = scan_file(tmp_path / "evil.npy")
    assert report.verdict == "dangerous" and "posix.system called by REDUCE" in summary(report.evidence())
    np.save(tmp_path / "m.npy", np.zeros((2, 3), dtype="<f4", order="F"))
    header = next(f for f in scan_file(tmp_path / "m.npy").findings if f.key == "scan.npy_array")
    assert header.values == {"dtype": "'<f4'", "shape": "(2, 3)", "fortran": "True", "at": 128, "where": "array"}
    np.save(tmp_path / "fields.npy", np.zeros(3, dtype=[("Oxygen", "<f4"), ("n", "<i2", (2,))]))
    assert scan_file(tmp_path / "fields.npy").verdict == "safe"  # a field named O… is no object field
    cut = write(tmp_path, "cut.npy", (tmp_path / "m.npy").read_bytes()[:-4])
    assert scan_file(cut).verdict == "damaged"
    with zipfile.ZipFile(tmp_path / "evil.npz", "w") as z:
        z.write(tmp_path / "evil.npy", "x.npy")
    assert scan_file(tmp_path / "evil.npz").verdict == "dangerous"
    assert not canary.exists()


def test_sklearn_style_pickle_and_joblib_classes_are_findings(tmp_path):
    joblib = pytest.importorskip("joblib")
    write(tmp_path, "model.pkl", pickle.dumps(Estimator()))
    joblib.dump(Estimator(), tmp_path / "model.joblib")
    for name in ("model.pkl", "model.joblib"):
        report = scan_file(tmp_path / name)
        assert report.verdict == "dangerous" and not any(p.scan.error for p in report.pickles), report.evidence()
        assert f"{__name__}.Estimator" in report.unsafe_names()
    assert "joblib.numpy_pickle.NumpyArrayWrapper" in scan_file(tmp_path / "model.joblib").unsafe_names()


def test_allow_adds_a_name(tmp_path, capsys):
    path = write(tmp_path, "ns.pkl", pickle.dumps(__import__("argparse").Namespace(lr=0.1), protocol=2))
    assert scan_cli(capsys, str(path))[0] == 1
    assert scan_cli(capsys, str(path), "--allow", "argparse.Namespace")[0] == 0


def test_json_lists_every_event_and_the_worst_verdict(tmp_path, capsys):
    canary = tmp_path / "CANARY"
    write(tmp_path, "evil.pkl", system_call(canary) + b".")
    write(tmp_path, "junk.bin", b"\x00\x01\x02 not a checkpoint")
    code, out = scan_cli(capsys, "--json", str(tmp_path))
    result = json.loads(out)
    assert code == 1 and result["verdict"] == "dangerous"
    by_name = {Path(f["path"]).name: f for f in result["files"]}
    assert by_name["junk.bin"]["verdict"] == "damaged" and by_name["junk.bin"]["exit_code"] == 2
    assert [e["opcode"] for e in by_name["evil.pkl"]["pickles"][0]["events"]] == ["GLOBAL", "REDUCE"]


def test_pickle_without_a_usual_first_opcode_is_still_read(tmp_path):
    canary = tmp_path / "CANARY"
    # a bytes leaf first (no PROTO): pickle.load accepts it, then runs the call
    data = b"C\x01x0" + system_call(canary)[2:] + b"."
    report = scan_file(write(tmp_path, "odd.bin", data))
    assert report.verdict == "dangerous" and "os.system called by REDUCE" in summary(report.evidence())
    assert scan_file(write(tmp_path, "notes.txt", b"C\x01x0 plain text")).verdict == "damaged"
    assert not canary.exists()


def test_damaged_and_missing_files_exit_2(tmp_path, capsys):
    assert scan_cli(capsys, str(write(tmp_path, "cut.pkl", pickle.dumps([1, 2], protocol=2)[:-1])))[0] == 2
    assert main(["ckpt", "scan", str(tmp_path / "nope.pt")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_markup_in_keys_and_names_prints_as_text(tmp_path, capsys):
    data = pickle.dumps({"[/x]": "[bold]v[/]", "k": Call(os.system, "[/red]")}, protocol=2)
    data = data.replace(b"posix\nsystem", b"[/x]\n[bold]y")
    code, out = scan_cli(capsys, str(write(tmp_path, "markup.pkl", data)))
    assert code == 1 and "[/x].[bold]y" in out


# hostile files: each is scanned in a child process that reports its peak memory; none may raise or hang
BOUND_EXTRA_MIB = 64  # the stated bound: the file's bytes + 16 × the pickle's bytes + 64 MiB


def hostile_files(tmp_path: Path, deepest: int = 1_000_000) -> dict[str, Path]:
    n = deepest
    files = {
        "nested-lists": b"\x80\x04" + b"]\x94" * n + b"a" * (n - 1) + b".",
        "100k-globals": b"\x80\x02" + b"".join(b"cmod%d\nname\n" % i for i in range(100_000)) + b".",
        "bytearray-2GB": b"\x80\x02c__builtin__\nbytearray\nJ\xff\xff\xff\x7f\x85R.",
        "sparse-memo": b"\x80\x02N" + b"".join(b"r" + struct.pack("<I", 10**9 + i) for i in range(n)) + b".",
        "long4-1GB": b"\x80\x02\x8b\x00\x00\x00\x40.",
    }
    paths = {name: write(tmp_path, f"{name}.pkl", data) for name, data in files.items()}
    bomb = io.BytesIO()
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("archive/data.pkl", b"\x80\x02" + b"N0" * 100_000_000 + b"N.")
    info = zipfile.ZipFile(bomb).infolist()[0]
    raw = patched(bomb.getvalue(), info.header_offset + 22, "<I", 10)  # declared 10 bytes, inflates to 200 MB
    paths["inflates-200MB"] = write(tmp_path, "bomb.pt", patched(raw, zipfile.ZipFile(bomb).start_dir + 24, "<I", 10))
    lzma = io.BytesIO()
    with zipfile.ZipFile(lzma, "w", zipfile.ZIP_LZMA) as z:
        z.writestr("archive/data.pkl", pickle.dumps(list(range(1000)), protocol=2))
    member = zipfile.ZipFile(lzma).infolist()[0]
    start = member.header_offset + 30 + len(member.filename) + 9
    paths["corrupt-lzma"] = write(tmp_path, "lzma.pt", patched(lzma.getvalue(), start, "<I", 0xDEADBEEF))
    return paths


def peak_scan(path: Path) -> dict:
    code = (
        "import json, resource, sys; from dlscope.ckpt.scan import scan_file; "
        "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss; r = scan_file(sys.argv[1]); "
        "print(json.dumps({'verdict': r.verdict, 'base': base, "
        "'peak': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))"
    )
    child = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120)
    assert child.returncode == 0 and not child.stderr, child.stderr
    return json.loads(child.stdout)


EXPECTED = {
    "nested-lists": "safe",
    "100k-globals": "dangerous",
    "bytearray-2GB": "safe",  # on torch's allow-list; never allocated here
    "sparse-memo": "safe",
    "long4-1GB": "damaged",
    "inflates-200MB": "damaged",
    "corrupt-lzma": "damaged",
}


@pytest.mark.slow
def test_hostile_files_stay_within_the_memory_bound(tmp_path):
    for name, path in hostile_files(tmp_path).items():
        result = peak_scan(path)
        size = path.stat().st_size
        extra_kib = result["peak"] - result["base"]
        assert result["verdict"] == EXPECTED[name], name
        assert extra_kib * 1024 <= size + 16 * size + (BOUND_EXTRA_MIB << 20), (name, extra_kib)


@pytest.mark.slow
def test_200MB_bytes_leaf_is_not_copied(tmp_path):
    path = tmp_path / "leaf.pkl"
    with open(path, "wb") as f:
        f.write(b"\x80\x03B" + struct.pack("<I", 200_000_000))
        f.write(b"\x00" * 200_000_000)
        f.write(b".")
    result = peak_scan(path)
    assert result["verdict"] == "safe"
    assert (result["peak"] - result["base"]) * 1024 <= path.stat().st_size + (BOUND_EXTRA_MIB << 20)


MALICIOUS = [pickle.dumps(Call(os.system, "touch /nonexistent/CANARY"), protocol=p) for p in range(6)] + [
    pickle.dumps({"a": [1, 2], "b": Call(eval, "1")}, protocol=2)
]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    which=st.integers(0, len(MALICIOUS) - 1),
    edits=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255), st.sampled_from("rid")), max_size=4),
    cut=st.integers(0, 10**6),
)
def test_mutations_after_the_import_never_make_a_payload_safe(tmp_path, which, edits, cut):
    """Flip, insert or delete bytes anywhere after the first off-list import, or cut the file there:
    the import has been seen before anything breaks, so the verdict stays dangerous."""
    data = MALICIOUS[which]
    first = scan_file(write(tmp_path, "m.pkl", data)).pickles[0].scan
    at = next(e.position for e in first.events if not e.allowed)
    # past the import's operands: GLOBAL's two lines, or nothing after STACK_GLOBAL's own byte
    after = data.index(b"\n", data.index(b"\n", at) + 1) + 1 if data[at : at + 1] == b"c" else at + 1
    body = bytearray(data)
    for at, value, how in edits:
        i = after + at % max(1, len(body) - after)
        if how == "r" and i < len(body):
            body[i] = value
        elif how == "i":
            body.insert(i, value)
        elif how == "d" and i < len(body):
            del body[i]
    body = body[: max(after, cut % (len(body) + 1))]
    report = scan_file(write(tmp_path, "m.pkl", bytes(body)))
    assert report.verdict == "dangerous", report.evidence()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(which=st.integers(0, len(MALICIOUS) - 1), at=st.integers(0, 10**6), value=st.integers(0, 255))
def test_any_single_byte_change_is_scanned_without_raising(tmp_path, which, at, value):
    body = bytearray(MALICIOUS[which])
    body[at % len(body)] = value
    report = scan_file(write(tmp_path, "m.pkl", bytes(body)))
    assert report.verdict in ("safe", "dangerous", "damaged") and summary(report.evidence())


@pytest.mark.slow
def test_inspect_survives_the_hostile_files(tmp_path, capsys):
    """`ckpt inspect` reads the same files for their anatomy: one line or a report, never a traceback."""
    for name, path in hostile_files(tmp_path, deepest=100_000).items():
        code = main(["ckpt", "inspect", str(path), "--limit", "3"])
        assert code == {"safe": 0, "dangerous": 1, "damaged": 2}[EXPECTED[name]], name
        capsys.readouterr()


def test_inspect_exit_status_is_the_scanners_verdict(tmp_path, capsys):
    good = tmp_path / "good.pt"
    torch.save({"w": torch.ones(4)}, good)
    assert main(["ckpt", "inspect", "--json", str(good)]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"] == "safe"
    # a flipped storage byte: the anatomy still reads, --stats checks the CRCs and the verdict is damaged
    data = good.read_bytes()
    storage = next(i for i in zipfile.ZipFile(good).infolist() if "/data/0" in i.filename)
    name_len, extra_len = struct.unpack_from("<HH", data, storage.header_offset + 26)
    at = storage.header_offset + 30 + name_len + extra_len
    flipped = write(tmp_path, "flipped.pt", patched(data, at, "<B", data[at] ^ 0x01))
    assert main(["ckpt", "inspect", str(flipped)]) == 0  # without --stats no byte of tensor data is read
    assert main(["ckpt", "inspect", "--stats", str(flipped)]) == 2
    assert "DAMAGED" in capsys.readouterr().out


def test_a_model_directory_skips_its_text_files_but_not_a_hostile_one(tmp_path, capsys):
    """A downloaded model folder holds a README, a LICENSE and a config next to the weights: walking it
    skips them (exit 0); the same files named on the command line are no checkpoint (exit 2); a text
    file that is really a protocol-0 pickle calling os.system is dangerous wherever it is."""
    torch.save({"w": torch.ones(2)}, tmp_path / "model.pt")
    (tmp_path / "README.md").write_text("# a model\n")
    (tmp_path / "LICENSE").write_text("MIT License\n\nCopyright\n")  # 'M' is a protocol-0 opcode
    (tmp_path / "config.json").write_text('{"hidden": 8}\n')
    (tmp_path / "empty.txt").write_bytes(b"")
    code, out = scan_cli(capsys, str(tmp_path))
    assert code == 0, out
    assert "5 files: 1 safe, 0 dangerous, 0 damaged, 4 skipped" in " ".join(out.split())
    assert scan_cli(capsys, str(tmp_path / "LICENSE"))[0] == 2
    assert scan_cli(capsys, str(tmp_path / "README.md"))[0] == 2

    (tmp_path / "notes.txt").write_bytes(b'cos\nsystem\n(S"echo hi"\ntR.')
    code, out = scan_cli(capsys, "--json", str(tmp_path))
    verdicts = {Path(f["path"]).name: f["verdict"] for f in json.loads(out)["files"]}
    assert code == 1 and verdicts["notes.txt"] == "dangerous" and verdicts["LICENSE"] == "skipped"
    # a pickle-named file that breaks is a damaged model file, not a text file
    (tmp_path / "notes.txt").unlink()
    (tmp_path / "broken.pkl").write_bytes(b"MIT")
    code, out = scan_cli(capsys, "--json", str(tmp_path))
    verdicts = {Path(f["path"]).name: f["verdict"] for f in json.loads(out)["files"]}
    assert code == 2 and verdicts["broken.pkl"] == "damaged"
