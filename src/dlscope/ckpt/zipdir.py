"""A zip's members as they lie in the file: header and data offsets, sizes, alignment, CRC32.

`zipfile` reads the central directory; the data offset needs the local header too (its name and
extra-field lengths can differ from the central copy — torch pads the extra field to align data).
"""

from __future__ import annotations

import bz2
import itertools
import lzma
import struct
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from dlscope.errors import CheckpointError
from dlscope.findings import Finding, Level

LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")  # 30 bytes, APPNOTE 4.3.7
LOCAL_MAGIC = b"PK\x03\x04"
ALIGNMENT = 64  # torch ≥ 1.6 aligns every member's data to 64 bytes (the .storage_alignment member)


@dataclass
class Member:
    name: str
    header_offset: int
    data_offset: int
    size: int  # uncompressed
    compressed_size: int
    crc32: int
    compression: str
    crc_ok: bool | None = None  # None: not checked (only --stats reads the data)

    @property
    def aligned(self) -> bool:
        return self.data_offset % ALIGNMENT == 0

    def to_dict(self) -> dict:
        return {**self.__dict__, "alignment": self.data_offset % ALIGNMENT, "crc32": f"{self.crc32:08x}"}


def open_zip(path: Path, f: BinaryIO) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(f)
    except zipfile.BadZipFile as e:
        raise CheckpointError(
            f"truncated or corrupt zip: {e} (torch.load says 'failed finding central directory')", path
        ) from None
    except (OSError, ValueError, struct.error) as e:
        raise CheckpointError(f"corrupt zip directory: {e}", path) from None


def members(path: Path, f: BinaryIO, zf: zipfile.ZipFile, file_bytes: int) -> list[Member]:
    out = []
    for info in zf.infolist():
        f.seek(info.header_offset)
        raw = f.read(LOCAL_HEADER.size)
        if len(raw) < LOCAL_HEADER.size or raw[:4] != LOCAL_MAGIC:
            raise CheckpointError(f"zip member {info.filename}: no local header at offset {info.header_offset}", path)
        fields = LOCAL_HEADER.unpack(raw)
        name_len, extra_len = fields[-2], fields[-1]
        data_offset = info.header_offset + LOCAL_HEADER.size + name_len + extra_len
        if data_offset + info.compress_size > file_bytes:
            raise CheckpointError(
                f"zip member {info.filename} runs past the end of the file "
                f"({data_offset + info.compress_size:,} > {file_bytes:,} bytes): truncated",
                path,
            )
        out.append(
            Member(
                name=info.filename,
                header_offset=info.header_offset,
                data_offset=data_offset,
                size=info.file_size,
                compressed_size=info.compress_size,
                crc32=info.CRC,
                compression="stored" if info.compress_type == zipfile.ZIP_STORED else "deflated",
            )
        )
    return out


# What a reader other than Python's zipfile could see differently: the scanner reports each as a finding.
FLAG_ENCRYPTED = 0x1
FLAG_DATA_DESCRIPTOR = 0x8
ZIP64_SIZE = 0xFFFFFFFF
CHUNK = 1 << 20
EOCD_SEARCH = 22 + 0xFFFF  # the end record and the longest comment it can carry
MAX_RATIO = 64  # a pickle or .npy deflates 2-10×; a member declared to expand more is not inflated (a zip bomb)


def inflate_limit(info: zipfile.ZipInfo) -> int:
    """The most bytes a member is inflated to: its declared size, and never more than MAX_RATIO × its
    compressed bytes + 1 MiB, so the work stays linear in the file's size."""
    if info.compress_type == zipfile.ZIP_STORED:
        return info.file_size
    return min(info.file_size, MAX_RATIO * info.compress_size + (1 << 20))


def zip_finding(key: str, level: Level, offset: int, **facts: Any) -> Finding:
    """bad: readers disagree or the bytes are corrupt; warn: bytes no member owns."""
    return Finding(f"zip.{key}", level, {**facts, "where": f"@ {offset}"})


def audit_zip(
    f: BinaryIO, zf: zipfile.ZipFile, file_bytes: int, crc: bool = True
) -> tuple[list[Finding], dict[int, int]]:
    """Duplicate names, local/central header disagreement, encryption, CRC mismatches, and bytes before the
    first member or between the last member and the central directory. Also: each member's data offset,
    keyed by its position in infolist(). With `crc`, reads every member once, in chunks (bounded memory)."""
    issues: list[Finding] = []
    offsets: dict[int, int] = {}
    seen: dict[str, int] = {}
    spans: list[tuple[int, int]] = []
    for i, info in enumerate(zf.infolist()):
        member, at = info.filename, info.header_offset
        if member in seen:
            issues.append(zip_finding("duplicate", "bad", at, member=member, also_at=seen[member]))
        seen.setdefault(member, at)
        if info.flag_bits & FLAG_ENCRYPTED:
            issues.append(zip_finding("encrypted", "bad", at, member=member))
        local = _local_header(f, info, file_bytes)
        if local is None:
            issues.append(zip_finding("no_local_header", "bad", at, member=member, offset=at))
            continue
        data_offset, differences = local
        issues += [zip_finding("local_header", "bad", at, member=member, **d) for d in differences]
        offsets[i] = data_offset
        end = data_offset + info.compress_size
        if end > file_bytes:
            issues.append(zip_finding("past_end", "bad", data_offset, member=member))
            continue
        if info.flag_bits & FLAG_DATA_DESCRIPTOR:
            end += 16 if _read_at(f, end, 4) == b"PK\x07\x08" else 12
        spans.append((at, end))
        if info.flag_bits & FLAG_ENCRYPTED:
            continue
        if inflate_limit(info) < info.file_size:
            sizes = {"declared": info.file_size, "compressed": info.compress_size, "ratio": MAX_RATIO}
            issues.append(zip_finding("bomb", "bad", data_offset, member=member, **sizes))
        elif crc and not member_crc_ok(f, info, data_offset):
            issues.append(zip_finding("crc", "bad", data_offset, member=member))
    spans.sort()
    if spans and spans[0][0] > 0:
        issues.append(zip_finding("before_first", "warn", 0, bytes=spans[0][0]))
    for (_, end), (start, _) in itertools.pairwise(spans):
        if start < end:
            issues.append(zip_finding("overlap", "bad", start))
        elif start > end:
            issues.append(zip_finding("between", "warn", end, bytes=start - end))
    f.seek(max(0, file_bytes - EOCD_SEARCH))
    tail = f.read(EOCD_SEARCH)
    record = tail.rfind(b"PK\x05\x06")
    if record >= 0 and record + 22 <= len(tail):
        end = file_bytes - len(tail) + record + 22 + struct.unpack_from("<H", tail, record + 20)[0]
        if end < file_bytes:
            issues.append(zip_finding("after_directory", "warn", end, bytes=file_bytes - end))
    directory = getattr(zf, "start_dir", None)
    if spans and directory is not None and directory > max(e for _, e in spans):
        last = max(e for _, e in spans)
        issues.append(zip_finding("after_last", "warn", last, bytes=directory - last))
    return issues, offsets


def _read_at(f: BinaryIO, offset: int, n: int) -> bytes:
    f.seek(offset)
    return f.read(n)


def _local_header(f: BinaryIO, info: zipfile.ZipInfo, file_bytes: int) -> tuple[int, list[dict[str, Any]]] | None:
    """The member's data offset and where its local header disagrees with the central directory
    (each as field, local, central); None when there is no local header."""
    raw = _read_at(f, info.header_offset, LOCAL_HEADER.size)
    if len(raw) < LOCAL_HEADER.size or raw[:4] != LOCAL_MAGIC:
        return None
    _, _, _, flags, method, _, _, crc, csize, usize, name_len, extra_len = LOCAL_HEADER.unpack(raw)
    name = _read_at(f, info.header_offset + LOCAL_HEADER.size, name_len)
    central_name = info.orig_filename.encode("utf-8" if info.flag_bits & 0x800 else "cp437", "replace")
    fields = [("name", name, central_name), ("compression", method, info.compress_type)]
    if not flags & FLAG_DATA_DESCRIPTOR:
        fields.append(("crc", crc, info.CRC))
        if csize != ZIP64_SIZE:
            fields.append(("compressed_bytes", csize, info.compress_size))
        if usize != ZIP64_SIZE:
            fields.append(("bytes", usize, info.file_size))
    differences = [
        {"field": field, "local": local, "central": central} for field, local, central in fields if local != central
    ]
    for d in differences:
        if d["field"] == "name":
            d["local"], d["central"] = name.decode("utf-8", "replace"), info.filename
    return info.header_offset + LOCAL_HEADER.size + name_len + extra_len, differences


def member_crc_ok(f: BinaryIO, info: zipfile.ZipInfo, data_offset: int) -> bool:
    """CRC32 of the member's uncompressed bytes, streamed, stopping at the declared size."""
    crc, n = 0, 0
    try:
        for block in member_chunks(f, info, data_offset, info.file_size + 1):
            crc = zlib.crc32(block, crc)
            n += len(block)
    except MemberError:
        return False
    return crc == info.CRC and n == info.file_size


class MemberError(ValueError):
    """A member's compressed bytes cannot be decoded."""


def member_chunks(f: BinaryIO, info: zipfile.ZipInfo, data_offset: int, limit: int) -> Iterator[bytes]:
    """The member's uncompressed bytes in chunks, never more than `limit` in all: a member declared as
    10 bytes that inflates to 1 GB stops at `limit`, and no chunk is sized by a number in the file."""
    pos, left, produced = data_offset, info.compress_size, 0
    method = info.compress_type
    if method == zipfile.ZIP_STORED:
        while left and produced < limit:
            raw = _read_at(f, pos, min(CHUNK, left, limit - produced))
            if not raw:
                return
            pos, left, produced = pos + len(raw), left - len(raw), produced + len(raw)
            yield raw
        return
    if method == zipfile.ZIP_DEFLATED:
        inflate = zlib.decompressobj(-15)
        decode = lambda raw, room: (inflate.decompress(raw, room), inflate.unconsumed_tail)  # noqa: E731
        feed = CHUNK
    elif method == zipfile.ZIP_BZIP2:
        unzip = bz2.BZ2Decompressor()
        decode = lambda raw, room: (unzip.decompress(raw, room), b"")  # noqa: E731
        feed = CHUNK
    elif method == zipfile.ZIP_LZMA:
        # zipfile's LZMA reader takes no output limit: feed it 1 KiB at a time (LZMA expands ~7,000× at most)
        unlzma = zipfile.LZMADecompressor()
        decode = lambda raw, room: (unlzma.decompress(raw), b"")  # noqa: E731
        feed = 1024
    else:
        raise MemberError(f"compression method {method} is not supported")
    pending = b""
    try:
        while produced < limit:
            held = method == zipfile.ZIP_BZIP2 and not unzip.needs_input and not unzip.eof
            if not pending and not held:  # (bz2 holds output back until asked again with no new input)
                if not left:
                    return
                pending = _read_at(f, pos, min(feed, left))
                if not pending:
                    return
                pos, left = pos + len(pending), left - len(pending)
            block, pending = decode(pending, min(CHUNK, limit - produced))
            if block:
                produced += len(block)
                yield block
            elif not pending and not left:
                return
    except (zlib.error, EOFError, OSError, ValueError, lzma.LZMAError) as e:
        raise MemberError(f"{type(e).__name__}: {e}") from None
