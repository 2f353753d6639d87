"""A zip's members as they lie in the file: header and data offsets, sizes, alignment, CRC32.

`zipfile` reads the central directory; the data offset needs the local header too (its name and
extra-field lengths can differ from the central copy — torch pads the extra field to align data).
"""

from __future__ import annotations

import struct
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from dlscope.errors import CheckpointError

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


def check_crc(f: BinaryIO, member: Member, chunk: int = 1 << 22) -> bool:
    """CRC32 of a stored member's bytes, streamed (bounded memory), against the directory's."""
    f.seek(member.data_offset)
    crc, left = 0, member.compressed_size
    while left:
        block = f.read(min(chunk, left))
        if not block:
            return False
        crc = zlib.crc32(block, crc)
        left -= len(block)
    return crc == member.crc32
