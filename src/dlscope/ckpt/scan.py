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

from dlscope.ckpt import zipdir
from dlscope.ckpt.allowlist import DCP_METADATA, NUMPY_ARRAY, TORCH_WEIGHTS_ONLY
from dlscope.ckpt.pickle_scan import scan_pickle
from dlscope.ckpt.pickle_values import PickleScan, StorageRef, TensorRef
from dlscope.ckpt.sniff import NPY_MAGIC, sniff
from dlscope.errors import CheckpointError

EXIT_CODES = {"safe": 0, "dangerous": 1, "damaged": 2, "skipped": 0}
MAX_PICKLE_BYTES = 256 << 20  # a state dict's pickle is kilobytes to a few MB; more is scanned up to here
NPY_MAX_HEADER = 10_000  # numpy's own max_header_size
SAFETENSORS_MAX_HEADER = 100 << 20
# a walked file with one of these names is a model file even when it is broken: damaged, never skipped
MODEL_SUFFIXES = {".pkl", ".pickle", ".pt", ".pth", ".bin", ".ckpt", ".joblib", ".model", ".tar", ".safetensors"}
MODEL_SUFFIXES |= {".npy", ".npz", ".h5", ".hdf5", ".keras", ".index", ".distcp"}


@dataclass
class Finding:
    level: str  # bad: makes the file damaged; warn, info: worth knowing, verdict unchanged
    what: str
    where: str = ""


@dataclass
class ScannedPickle:
    where: str  # the file, a zip member, a legacy record
    scan: PickleScan

    def to_dict(self) -> dict[str, Any]:
        s = self.scan
        return {
            "where": self.where,
            "start": s.start,
            "end": s.end,
            "protocol": s.protocol,
            "opcodes": s.opcodes,
            "error": s.error,
            "elided": s.elided,
            "events": [e.__dict__ for e in s.events],
        }


@dataclass
class ScanReport:
    path: str
    format: str
    file_bytes: int
    findings: list[Finding] = field(default_factory=list)
    pickles: list[ScannedPickle] = field(default_factory=list)
    skipped: str = ""  # why a file found in a directory is no model file

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

    def summary(self) -> str:
        """The verdict in one line, with the evidence: the first dangerous call, or the first fault."""
        verdict = self.verdict
        if verdict == "dangerous":
            where, event, broken = next(
                (p.where, e, p.scan)
                for p in sorted(self.pickles, key=lambda p: not any(not e.allowed and e.call for e in p.scan.events))
                for e in sorted(p.scan.events, key=lambda e: not e.call)
                if not e.allowed
            )
            others = len(self.unsafe_names() - {event.subject})
            action = "called by" if event.call else "imported by"
            line = f"DANGEROUS: {event.name} {action} {event.opcode} @ {event.position}"
            line += f" in {where}" if where != "pickle" else ""
            if broken.error:
                line += f", before the stream breaks @ {broken.end} ({broken.error})"
            return line + (f"; {others:,} more name{'s' * (others != 1)} off the allow-list" if others else "")
        if verdict == "skipped":
            return f"SKIPPED: not a model file: {self.skipped}"
        if verdict == "damaged":
            bad = next(f for f in self.findings if f.level == "bad")
            return f"DAMAGED: {bad.what}" + (f" ({bad.where})" if bad.where else "")
        if not self.pickles:
            return f"SAFE: {self.format}, no pickle: data only, nothing in it can run"
        names = {e.name for p in self.pickles for e in p.scan.events}
        n = len(self.pickles)
        return f"SAFE: {n} pickle{'s' * (n != 1)}, all {len(names)} globals on the allow-list"

    def unsafe_names(self) -> set[str]:
        """Names off the allow-list, each once (`X.__setstate__` and `X(…)` are uses of X)."""
        return {e.subject for p in self.pickles for e in p.scan.events if not e.allowed}

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "format": self.format,
            "file_bytes": self.file_bytes,
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "summary": self.summary(),
            "findings": [f.__dict__ for f in self.findings],
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


def no_model_file(report: ScanReport, path: Path) -> str:
    """Why a damaged file is no model file at all, or "" when it is one (or dangerous: never skipped)."""
    if report.verdict != "damaged" or path.suffix.lower() in MODEL_SUFFIXES:
        return ""
    if report.format == "empty file":
        return "empty"
    if report.format == "unknown":
        return report.findings[0].what.removeprefix("not a checkpoint: ")
    first = report.pickles[0].scan if len(report.pickles) == 1 else None
    guessed = report.format == "pickle" and first is not None and first.protocol == 0
    if guessed and first.error and not first.events:
        return f"text, not a pickle: it breaks @ {first.end}"
    return ""


class Scanner:
    def __init__(self, report: ScanReport, f: BinaryIO, allowed: frozenset[str], crc: bool):
        self.report, self.f, self.allowed, self.crc = report, f, allowed, crc

    def bad(self, what: str, where: str = "") -> None:
        self.report.findings.append(Finding("bad", what, where))

    def note(self, level: str, what: str, where: str = "") -> None:
        self.report.findings.append(Finding(level, what, where))

    def run(self) -> None:
        report, f = self.report, self.f
        if report.file_bytes == 0:
            report.format = "empty file"
            self.bad("empty file: not a checkpoint")
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
            self.bad(f"not a checkpoint: unknown format (first bytes {head[:8].hex(' ')})")
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
            self.bad(f"over {MAX_PICKLE_BYTES:,} bytes of pickle: only the first {MAX_PICKLE_BYTES:,} were scanned")
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
                self.note("warn", f"{len(data) - pos:,} bytes after the last STOP are not a pickle", f"{where} @ {pos}")
                return pos
            count += 1
            self.add(where if count == 1 else f"{where} #{count}", scan)
            if scan.error:
                return scan.end
            pos = scan.end
        if count == 0:
            self.bad("no pickle where one was expected", where)
        return pos

    def add(self, where: str, scan: PickleScan) -> None:
        self.report.pickles.append(ScannedPickle(where, scan))
        if scan.error:
            self.bad(f"the stream breaks @ {scan.end} ({scan.error})", where)
        if scan.elided:
            self.note("info", "over 500,000 containers: the tree was elided, every opcode still scanned", where)

    # formats
    def safetensors(self, head: bytes) -> None:
        report = self.report
        (n,) = struct.unpack("<Q", head[:8])
        report.format = "safetensors"
        if n > min(SAFETENSORS_MAX_HEADER, report.file_bytes - 8):
            self.bad(f"safetensors header of {n:,} bytes runs past the end of the file or its 100 MB limit")
            return
        self.f.seek(8)
        try:
            header = json.loads(self.f.read(n))
        except (ValueError, UnicodeDecodeError) as e:
            self.bad(f"safetensors header is not JSON: {e}")
            return
        if not isinstance(header, dict):
            self.bad("safetensors header is not a JSON object")

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
            self.bad(
                "the storage key list does not match the object's storages", f"storage keys pickle @ {scans[4].start}"
            )
            return
        for key in keys:
            if pos + 8 > len(data):
                self.bad(f"storage {key} is cut off: truncated", f"@ {pos}")
                return
            (numel,) = struct.unpack_from("<q", data, pos)
            nbytes = numel * dtypes[str(key)].itemsize
            if numel < 0 or pos + 8 + nbytes > len(data):
                self.bad(f"storage {key} ({numel:,} elements) runs past the end of the file", f"@ {pos}")
                return
            pos += 8 + nbytes
        if pos < len(data):
            self.note("warn", f"{len(data) - pos:,} bytes after the last storage", f"@ {pos}")
            self.stream(data, pos, f"after the storages @ {pos}")

    def zip(self, head: bytes) -> None:
        report, f = self.report, self.f
        try:
            zf = zipfile.ZipFile(f)
        except (zipfile.BadZipFile, OSError, ValueError, struct.error, EOFError) as e:
            report.format = "zip"
            self.bad(f"truncated or corrupt zip: {e}")
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
            for issue in issues:
                self.note(issue.level, issue.what, f"@ {issue.offset}")
            first = min((i.header_offset for i in infos), default=0)
            if first > 0:  # a pickle in front of a zip: torch.load reads the file as a legacy pickle stream
                f.seek(0)
                prefix = f.read(min(first, MAX_PICKLE_BYTES))
                if prefix[:1] == b"\x80" or prefix[:1] in (b"(", b"c", b"}", b"]"):
                    self.stream(prefix, 0, "bytes before the first member")
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
            self.bad(f"cannot decompress: {e}", name)
            return
        if len(data) < info.file_size:
            self.note("warn", f"only the first {len(data):,} of {info.file_size:,} bytes were scanned", name)
        if name.endswith(".npy"):
            self.npy(data, name)
        else:
            self.stream(data, 0, name)

    def npy(self, data: bytes, where: str) -> None:
        """A .npy array: magic, version, header dict (descr, fortran_order, shape), then the data — raw
        numbers, or for an object dtype a pickle that np.load(allow_pickle=True) runs."""
        if not data.startswith(NPY_MAGIC) or len(data) < 10:
            self.bad("not a .npy array (wrong magic)", where)
            return
        major = data[6]
        width = 2 if major == 1 else 4
        if major not in (1, 2, 3) or len(data) < 8 + width:
            self.bad(f"unknown .npy version {major}", where)
            return
        n = int.from_bytes(data[8 : 8 + width], "little")
        start = 8 + width
        if n > NPY_MAX_HEADER or start + n > len(data):
            self.bad(f".npy header of {n:,} bytes is over numpy's limit or past the end", where)
            return
        try:
            header = ast.literal_eval(data[start : start + n].decode("utf-8" if major == 3 else "latin-1"))
            descr, shape = header["descr"], header["shape"]
            fortran = header["fortran_order"]
        except (ValueError, SyntaxError, KeyError, TypeError, MemoryError, RecursionError) as e:
            self.bad(f".npy header is not a valid dict: {type(e).__name__}", where)
            return
        offset = start + n
        if not isinstance(shape, tuple) or not all(isinstance(d, int) and d >= 0 for d in shape):
            self.bad(f".npy shape {shape!r:.60} is not a tuple of sizes", where)
            return
        self.note("info", f"dtype {descr!r:.40}, shape {shape!r:.60}, fortran order {fortran}, data @ {offset}", where)
        if npy_has_objects(descr):
            self.stream(data, offset, f"{where} (object array)", allowed=self.allowed | NUMPY_ARRAY)
            return
        itemsize = npy_itemsize(descr)
        if itemsize is None:
            self.note("warn", f"dtype {descr!r:.40} not recognised: data size not checked", where)
            return
        expected = itemsize
        for d in shape:
            expected = min(expected * d, len(data) + 1)  # compared with the data's size, never allocated
        if offset + expected > len(data):
            self.bad(f"array data is {len(data) - offset:,} bytes, the header needs {expected:,}: truncated", where)
        elif offset + expected < len(data):
            self.note("warn", f"{len(data) - offset - expected:,} bytes after the array data", where)


def npy_has_objects(descr: Any) -> bool:
    """Whether a .npy descr holds Python objects ('|O', or a structured field of kind O): a pickle follows."""
    if isinstance(descr, str):
        return descr.lstrip("<>|=")[:1] == "O"
    if isinstance(descr, list):
        return any(isinstance(f, tuple) and len(f) >= 2 and npy_has_objects(f[1]) for f in descr)
    return False


def npy_itemsize(descr: Any) -> int | None:
    """Bytes per element of a .npy descr: '<f4', '|b1', '<U8', or a structured list of (name, descr[, shape])."""
    if isinstance(descr, str):
        code = descr.lstrip("<>|=")
        kind, digits = code[:1], code[1:].split("[")[0]
        if kind in "biufcSVmM" and digits.isdigit():
            return int(digits)
        if kind == "U" and digits.isdigit():
            return 4 * int(digits)
        return None
    if isinstance(descr, list):
        total = 0
        for field_ in descr:
            if not (isinstance(field_, tuple) and len(field_) in (2, 3) and isinstance(field_[1], str)):
                return None
            size = npy_itemsize(field_[1])
            if size is None:
                return None
            count = 1
            for d in field_[2] if len(field_) == 3 and isinstance(field_[2], tuple) else ():
                count *= d if isinstance(d, int) else 1
            total += size * count
        return total
    return None


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
