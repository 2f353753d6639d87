"""`scan_file(path)`: would loading this file run code? Three verdicts, fail closed.

- safe (exit 0): every global any pickle in the file names is on torch's weights_only allow-list
  (plus `--allow` names), or the format holds no pickle at all (safetensors, HDF5, numeric .npy).
- dangerous (exit 1): some pickle imports or calls a name off the allow-list — also when the
  stream breaks afterwards: `pickle.load` has run the call before it reaches the break.
- damaged (exit 2): no dangerous name, but a stream breaks, a zip is ambiguous or corrupt, or the
  file is no checkpoint format at all.
- skipped (exit 0): found while walking a directory, and no model file (a README, a config.json, a
  LICENSE next to the weights): an unknown format, or text whose first byte only looked like a
  protocol-0 pickle — unless its name is a model file's (.pt, .bin, …: damaged), or what it would
  import is off the allow-list (dangerous).

Every pickle is read: all of a stream's pickles to EOF, every zip member by `infolist()` (duplicate
names included), the bytes before a zip's first member, the five pickles of a legacy torch.save
file and anything after its storages, the pickles of object arrays in .npy/.npz. Imports nothing
from torch. Peak memory: the file's bytes + 16 × the largest pickle's bytes + 64 MiB (one pickle
buffered at a time, at most `MAX_PICKLE_BYTES`; see pickle_scan for the simulator's share).
"""

from __future__ import annotations

import ast
import json
import os
import struct
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from dlscope.ckpt import safetensors_fmt, zipdir
from dlscope.ckpt.allowlist import DCP_METADATA, NUMPY_ARRAY, TORCH_WEIGHTS_ONLY
from dlscope.ckpt.pickle_scan import scan_pickle
from dlscope.ckpt.pickle_values import PickleScan, StorageRef, TensorRef, npy_itemsize
from dlscope.ckpt.sniff import NPY_MAGIC, sniff
from dlscope.errors import CheckpointError
from dlscope.findings import Finding, Level

EXIT_CODES = {"safe": 0, "dangerous": 1, "damaged": 2, "skipped": 0}
MAX_PICKLE_BYTES = 256 << 20  # a state dict's pickle is kilobytes to a few MB; more is scanned up to here
NPY_MAX_HEADER = 10_000  # numpy's own max_header_size
# a walked file with one of these names is a model file even when it is broken: damaged, never skipped
MODEL_SUFFIXES = {".pkl", ".pickle", ".pt", ".pth", ".bin", ".ckpt", ".joblib", ".model", ".tar", ".safetensors"}
MODEL_SUFFIXES |= {".npy", ".npz", ".h5", ".hdf5", ".keras", ".index", ".distcp"}
BEFORE_FIRST_MEMBER = "bytes before the first member"  # where a pickle in front of a zip lies


@dataclass
class ScannedPickle:
    where: str  # the file, a zip member, a legacy record
    scan: PickleScan

    def to_dict(self) -> dict[str, Any]:
        facts = {k: getattr(self.scan, k) for k in ("start", "end", "protocol", "opcodes", "error", "elided")}
        return {"where": self.where, **facts, "events": [e.__dict__ for e in self.scan.events]}


@dataclass
class ScanReport:
    path: str
    format: str
    file_bytes: int
    # bad: makes the file damaged; warn, info: worth knowing, verdict unchanged (worded in report/sections/ckpt_scan.py)
    findings: list[Finding] = field(default_factory=list)
    pickles: list[ScannedPickle] = field(default_factory=list)
    skipped: dict[str, Any] | None = None  # why a file found in a directory is no model file

    @property
    def verdict(self) -> str:
        if any(not e.allowed for p in self.pickles for e in p.scan.events):
            return "dangerous"
        if self.skipped:
            return "skipped"
        if any(f.level == "bad" for f in self.findings):
            return "damaged"
        return "safe"

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    def evidence(self) -> dict[str, Any]:
        """The verdict's evidence, as facts: the first dangerous call, why the file was skipped, its
        first fault, or what a safe file holds."""
        verdict = self.verdict
        if verdict == "dangerous":
            where, event, broken = next(
                (p.where, e, p.scan)
                for p in sorted(self.pickles, key=lambda p: not any(not e.allowed and e.call for e in p.scan.events))
                for e in sorted(p.scan.events, key=lambda e: not e.call)
                if not e.allowed
            )
            facts = {"name": event.name, "call": event.call, "opcode": event.opcode, "position": event.position}
            facts |= {"where": where, "broken_at": broken.end if broken.error else None, "error": broken.error}
            return {"verdict": verdict, **facts, "others": len(self.unsafe_names() - {event.subject})}
        if verdict == "skipped":
            return {"verdict": verdict, **(self.skipped or {})}
        if verdict == "damaged":
            return {"verdict": verdict, "finding": next(f for f in self.findings if f.level == "bad").to_json()}
        names = {e.name for p in self.pickles for e in p.scan.events}
        return {"verdict": verdict, "format": self.format, "pickles": len(self.pickles), "globals": len(names)}

    def unsafe_names(self) -> set[str]:
        """Names off the allow-list, each once (`X.__setstate__` and `X(…)` are uses of X)."""
        return {e.subject for p in self.pickles for e in p.scan.events if not e.allowed}

    def to_dict(self) -> dict[str, Any]:
        return {
            **{k: getattr(self, k) for k in ("path", "format", "file_bytes", "verdict", "exit_code")},
            "evidence": self.evidence(),
            "findings": [f.to_json() for f in self.findings],
            "pickles": [p.to_dict() for p in self.pickles],
        }


def scan_paths(paths: list[str | Path], allow: frozenset[str] = frozenset()) -> Iterator[ScanReport]:
    """Each file named, and every file under each directory named (sorted, symlinks not followed)."""
    for given in paths:
        path = Path(given)
        if path.is_dir():
            for root, dirs, files in os.walk(path):
                dirs.sort()
                for name in sorted(files):
                    if not os.path.islink(os.path.join(root, name)):
                        yield scan_file(Path(root) / name, allow, walked=True)
        else:
            yield scan_file(path, allow)


def scan_file(
    path: str | Path, allow: frozenset[str] = frozenset(), crc: bool = True, walked: bool = False
) -> ScanReport:
    """Scan one file; a missing or unreadable file raises CheckpointError, a hostile one never does.
    `crc=False` skips checking zip members' CRC32 (which reads every byte of the file); `walked`: found
    in a directory rather than named, so a file that is no model file is skipped, not damaged."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError("not a file (a directory?)" if path.exists() else "no such file", path)
    try:
        with open(path, "rb") as f:
            file_bytes = os.fstat(f.fileno()).st_size
            report = ScanReport(str(path), "unknown", file_bytes)
            dcp = path.name == ".metadata" and any(path.parent.glob("*.distcp"))  # what dcp.load unpickles
            Scanner(report, f, TORCH_WEIGHTS_ONLY | allow | (DCP_METADATA if dcp else frozenset()), crc).run()
    except OSError as e:
        raise CheckpointError(f"cannot read: {e.strerror or e}", path) from None
    if walked:
        report.skipped = no_model_file(report, path)
    return report


def no_model_file(report: ScanReport, path: Path) -> dict[str, Any] | None:
    """Why a damaged file is no model file at all, or None when it is one (or dangerous: never skipped)."""
    if report.verdict != "damaged" or path.suffix.lower() in MODEL_SUFFIXES:
        return None
    if report.format == "empty file":
        return {"reason": "empty"}
    if report.format == "unknown":
        return {"reason": "unknown format", **report.findings[0].values}
    first = report.pickles[0].scan if len(report.pickles) == 1 else None
    guessed = report.format == "pickle" and first is not None and first.protocol == 0
    if guessed and first.error and not first.events:
        return {"reason": "text", "breaks_at": first.end}
    return None


class Scanner:
    def __init__(self, report: ScanReport, f: BinaryIO, allowed: frozenset[str], crc: bool):
        self.report, self.f, self.allowed, self.crc = report, f, allowed, crc

    def bad(self, key: str, **facts: Any) -> None:
        self.report.findings.append(Finding(f"scan.{key}", "bad", facts))

    def note(self, key: str, level: Level, **facts: Any) -> None:
        self.report.findings.append(Finding(f"scan.{key}", level, facts))

    def run(self) -> None:
        report, f = self.report, self.f
        if report.file_bytes == 0:
            report.format = "empty file"
            self.bad("empty")
            return
        head = f.read(16)
        kind = sniff(head, self.tail(8))
        f.seek(0)
        if kind == "npy":
            report.format = "numpy .npy"
            self.npy(self.read_all(), "array")
        elif kind == "zip" or (head[:1] in (b"\x80", b"(") and zipfile.is_zipfile(f)):
            self.zip(head)
        elif kind == "torch-legacy":
            report.format = "legacy torch.save (< 1.6)"
            self.legacy(self.read_all())
        elif kind == "hdf5":
            report.format = "HDF5 (Keras .h5)"
        elif kind == "safetensors":
            self.safetensors(head)
        elif kind == "tf-index":
            report.format = "TensorFlow checkpoint index"
        elif kind == "pickle" or head[0] in b"dlt":  # DICT, LIST, TUPLE: a malformed protocol 0 pickle
            report.format = "pickle"
            self.stream(self.read_all(), 0, "pickle", joblib=True)
        else:
            report.format = "unknown"
            self.bad("unknown_format", first_bytes=head[:8].hex(" "))
            # pickle.load needs no PROTO first: whatever the first byte, what it would import is evidence
            scan = scan_pickle(self.read_all(), 0, self.allowed)
            if any(not e.allowed for e in scan.events):
                self.add("pickle", scan)

    def tail(self, n: int) -> bytes:
        self.f.seek(max(0, self.report.file_bytes - n))
        return self.f.read(n)

    def read_all(self) -> bytes:
        self.f.seek(0)
        data = self.f.read(MAX_PICKLE_BYTES)
        if self.report.file_bytes > MAX_PICKLE_BYTES:
            self.bad("over_limit", limit=MAX_PICKLE_BYTES)
        return data

    # pickles
    def stream(
        self, data: bytes, start: int, where: str, joblib: bool = False, allowed: frozenset[str] | None = None
    ) -> int:
        """Every pickle from `start` to the end of `data`; what follows the last STOP that is no pickle is a
        finding. Returns the offset where scanning stopped."""
        allowed = allowed or self.allowed
        pos, count = start, 0
        while pos < len(data):
            scan = scan_pickle(data, pos, allowed, joblib)
            if scan.error and count and scan.opcodes <= 1 and not scan.events:
                self.note("after_stop", "warn", bytes=len(data) - pos, where=f"{where} @ {pos}")
                return pos
            count += 1
            self.add(where if count == 1 else f"{where} #{count}", scan)
            if scan.error:
                return scan.end
            pos = scan.end
        if count == 0:
            self.bad("no_pickle", where=where)
        return pos

    def add(self, where: str, scan: PickleScan) -> None:
        self.report.pickles.append(ScannedPickle(where, scan))
        if scan.error:
            self.bad("stream_breaks", at=scan.end, error=scan.error, where=where)
        if scan.elided:
            self.note("elided", "info", where=where)

    # formats
    def safetensors(self, head: bytes) -> None:
        report = self.report
        (n,) = struct.unpack("<Q", head[:8])
        report.format = "safetensors"
        if n > min(safetensors_fmt.MAX_HEADER, report.file_bytes - 8):
            self.bad("safetensors_header_size", bytes=n)
            return
        self.f.seek(8)
        try:
            header = json.loads(self.f.read(n))
        except (ValueError, UnicodeDecodeError) as e:
            self.bad("safetensors_not_json", error=str(e))
            return
        if not isinstance(header, dict):
            self.bad("safetensors_not_object")

    def legacy(self, data: bytes) -> None:
        """Magic, protocol, sys_info, the object, the storage keys — five pickles — then each storage as an
        int64 element count and its bytes; then nothing (anything there is scanned as more pickles)."""
        pos = 0
        scans = []
        for what in ("magic number", "protocol version", "system info", "object", "storage keys"):
            scan = scan_pickle(data, pos, self.allowed)
            self.add(f"{what} pickle @ {pos}", scan)
            if scan.error:
                return
            scans.append(scan)
            pos = scan.end
        keys = scans[4].root
        dtypes = {s.key: s.dtype for s in storages_in(scans[3].root)}
        if not isinstance(keys, list) or any(str(k) not in dtypes for k in keys):
            self.bad("storage_keys", where=f"storage keys pickle @ {scans[4].start}")
            return
        for key in keys:
            if pos + 8 > len(data):
                self.bad("storage_cut", storage=str(key), where=f"@ {pos}")
                return
            (numel,) = struct.unpack_from("<q", data, pos)
            nbytes = numel * dtypes[str(key)].itemsize
            if numel < 0 or pos + 8 + nbytes > len(data):
                self.bad("storage_past_end", storage=str(key), elements=numel, where=f"@ {pos}")
                return
            pos += 8 + nbytes
        if pos < len(data):
            self.note("after_storages", "warn", bytes=len(data) - pos, where=f"@ {pos}")
            self.stream(data, pos, f"after the storages @ {pos}")

    def zip(self, head: bytes) -> None:
        report, f = self.report, self.f
        try:
            zf = zipfile.ZipFile(f)
        except (zipfile.BadZipFile, OSError, ValueError, struct.error, EOFError) as e:
            report.format = "zip"
            self.bad("zip_corrupt", error=str(e))
            return
        with zf:
            infos = zf.infolist()
            names = {i.filename for i in infos}
            if any(n.endswith(".npy") for n in names) and all(n.endswith(".npy") for n in names):
                report.format = "numpy .npz"
            elif any(n.endswith("/data.pkl") for n in names):
                report.format = "torch zip (torch.save ≥ 1.6)"
            elif "config.json" in names:
                report.format = "Keras .keras zip"
            else:
                report.format = "zip"
            issues, offsets = zipdir.audit_zip(f, zf, report.file_bytes, self.crc)
            report.findings += issues
            first = min((i.header_offset for i in infos), default=0)
            if first > 0:  # a pickle in front of a zip: torch.load reads the file as a legacy pickle stream
                f.seek(0)
                prefix = f.read(min(first, MAX_PICKLE_BYTES))
                if prefix[:1] == b"\x80" or prefix[:1] in (b"(", b"c", b"}", b"]"):
                    self.stream(prefix, 0, BEFORE_FIRST_MEMBER)
            for i, info in enumerate(infos):
                if i in offsets and not info.flag_bits & zipdir.FLAG_ENCRYPTED:
                    self.member(info, offsets[i])

    def member(self, info: zipfile.ZipInfo, data_offset: int) -> None:
        """A member that is a pickle by name (.pkl, .npy …) or by its first bytes; torch storages are skipped."""
        name = info.filename
        by_name = name.endswith((".npy", ".pkl", ".pickle", ".joblib"))
        if not by_name and "/data/" in name:
            return  # a torch storage: raw tensor bytes, never unpickled
        # a member declared to inflate past the ratio limit (already a finding): its first MiB is still read
        limit = min(
            MAX_PICKLE_BYTES, zipdir.inflate_limit(info) if zipdir.inflate_limit(info) == info.file_size else 1 << 20
        )
        try:
            head = b"".join(zipdir.member_chunks(self.f, info, data_offset, 2))
            if not (by_name or (head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"))):
                return
            data = b"".join(zipdir.member_chunks(self.f, info, data_offset, limit))
        except zipdir.MemberError as e:
            self.bad("decompress", error=str(e), where=name)
            return
        if len(data) < info.file_size:
            self.note("partly_scanned", "warn", scanned=len(data), bytes=info.file_size, where=name)
        if name.endswith(".npy"):
            self.npy(data, name)
        else:
            self.stream(data, 0, name)

    def npy(self, data: bytes, where: str) -> None:
        """A .npy array: magic, version, header dict (descr, fortran_order, shape), then the data — raw
        numbers, or for an object dtype a pickle that np.load(allow_pickle=True) runs."""
        if not data.startswith(NPY_MAGIC) or len(data) < 10:
            self.bad("npy_magic", where=where)
            return
        major = data[6]
        width = 2 if major == 1 else 4
        if major not in (1, 2, 3) or len(data) < 8 + width:
            self.bad("npy_version", version=major, where=where)
            return
        n = int.from_bytes(data[8 : 8 + width], "little")
        start = 8 + width
        if n > NPY_MAX_HEADER or start + n > len(data):
            self.bad("npy_header_size", bytes=n, where=where)
            return
        try:
            header = ast.literal_eval(data[start : start + n].decode("utf-8" if major == 3 else "latin-1"))
            descr, shape = header["descr"], header["shape"]
            fortran = header["fortran_order"]
        except (ValueError, SyntaxError, KeyError, TypeError, MemoryError, RecursionError) as e:
            self.bad("npy_header", error=type(e).__name__, where=where)
            return
        offset = start + n
        if not isinstance(shape, tuple) or not all(isinstance(d, int) and d >= 0 for d in shape):
            self.bad("npy_shape", shape=repr(shape)[:60], where=where)
            return
        self.note(
            "npy_array",
            "info",
            dtype=repr(descr)[:40],
            shape=repr(shape)[:60],
            fortran=repr(fortran),
            at=offset,
            where=where,
        )
        if npy_has_objects(descr):
            self.stream(data, offset, f"{where} (object array)", allowed=self.allowed | NUMPY_ARRAY)
            return
        itemsize = npy_itemsize(descr)
        if itemsize is None:
            self.note("npy_dtype", "warn", dtype=repr(descr)[:40], where=where)
            return
        expected = itemsize
        for d in shape:
            expected = min(expected * d, len(data) + 1)  # compared with the data's size, never allocated
        if offset + expected > len(data):
            self.bad("npy_truncated", bytes=len(data) - offset, needs=expected, where=where)
        elif offset + expected < len(data):
            self.note("npy_trailing", "warn", bytes=len(data) - offset - expected, where=where)


def npy_has_objects(descr: Any) -> bool:
    """Whether a .npy descr holds Python objects ('|O', or a structured field of kind O): a pickle follows."""
    if isinstance(descr, str):
        return descr.lstrip("<>|=")[:1] == "O"
    if isinstance(descr, list):
        return any(isinstance(f, tuple) and len(f) >= 2 and npy_has_objects(f[1]) for f in descr)
    return False


def storages_in(root: Any) -> Iterator[StorageRef]:
    """Every storage the unpickled tree's tensors view, walked without recursion, each container once."""
    stack, seen = [root], set()
    while stack:
        obj = stack.pop()
        if isinstance(obj, TensorRef):
            yield obj.storage
        elif isinstance(obj, dict | list | tuple) and id(obj) not in seen:
            seen.add(id(obj))
            stack.extend(obj.values() if isinstance(obj, dict) else obj)
        elif hasattr(obj, "qualname") and id(obj) not in seen:  # an Opaque: its arguments, state, entries
            seen.add(id(obj))
            stack.extend([obj.args, obj.state, obj.items])
