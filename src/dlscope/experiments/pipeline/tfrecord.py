"""TFRecord framing, written and read with an explicit read buffer and every CRC checked.

One record on disk (TensorFlow's `tf.io.TFRecordWriter` layout, so `tf.data.TFRecordDataset`
reads these files):

    uint64  length                 little-endian
    uint32  masked CRC32C(length)  of the 8 length bytes
    bytes   data[length]
    uint32  masked CRC32C(data)

mask(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8  (mod 2**32)

The reader issues one `os.read(fd, read_buffer)` at a time and parses records out of what it has;
it reads until a read returns nothing, so a file of F bytes costs ceil(F / read_buffer) + 1 read
calls — 3 for a 550-byte file and a 275-byte buffer, 2 with 550 bytes or more (seed 003's
arithmetic: 3,000,000 reads for a million files).
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import BinaryIO

import crc32c

from dlscope.errors import DatasetError

MASK_DELTA = 0xA282EAD8
HEADER = struct.Struct("<QI")  # length, masked CRC of the length
FOOTER = struct.Struct("<I")  # masked CRC of the data
OVERHEAD = HEADER.size + FOOTER.size  # 16 bytes of framing per record


class TFRecordError(DatasetError):
    """A TFRecord file is truncated or fails a CRC check (the message names the byte offset)."""


def mask(crc: int) -> int:
    """TF's masked CRC32C (records, and a checkpoint bundle's tensors): rotated, plus a constant."""
    return (((crc >> 15) | (crc << 17)) + MASK_DELTA) & 0xFFFFFFFF


def masked_crc(data: bytes | bytearray | memoryview) -> int:
    return mask(crc32c.crc32c(data))


def frame(payload: bytes) -> bytes:
    """One record, framed: what `TFRecordWriter.write(payload)` appends to a file."""
    length = struct.pack("<Q", len(payload))
    return length + struct.pack("<I", masked_crc(length)) + payload + FOOTER.pack(masked_crc(payload))


def write_records(f: BinaryIO, payloads: list[bytes]) -> int:
    """Append framed records to an open file; returns the bytes written."""
    data = b"".join(frame(p) for p in payloads)
    f.write(data)
    return len(data)


@dataclass
class IOCounters:
    """What a reader did, summed: system calls, bytes and the seconds spent inside them.

    `read_seconds` covers open, read and close (seed 003 counts the directory look-up of a small
    file as read time); `disk_bytes` is the kernel's `read_bytes` from /proc/self/io — bytes that
    came from the device rather than the page cache (None where /proc is not readable). None for
    opens and read_seconds: not observable (tf.data opens and reads in its own C++ threads).
    """

    opens: int | None = 0
    reads: int = 0
    bytes: int = 0
    read_seconds: float | None = 0.0
    disk_bytes: int | None = 0

    def __sub__(self, other: IOCounters) -> IOCounters:
        return IOCounters(*(_minus(getattr(self, f.name), getattr(other, f.name)) for f in fields(self)))

    def __add__(self, other: IOCounters) -> IOCounters:
        return IOCounters(*(_plus(getattr(self, f.name), getattr(other, f.name)) for f in fields(self)))

    def copy(self) -> IOCounters:
        return IOCounters(*(getattr(self, f.name) for f in fields(self)))


def _minus(a, b):
    return None if a is None or b is None else a - b


def _plus(a, b):
    return None if a is None or b is None else a + b


def read_records(path: str | Path, read_buffer: int, io: IOCounters) -> Iterator[bytes]:
    """The payloads of one TFRecord file, in order, every CRC verified; counts into `io`."""
    start = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    io.opens += 1
    io.read_seconds += time.perf_counter() - start
    try:
        buf = bytearray()
        pos = 0  # where the next record starts in buf
        base = 0  # file offset of buf[0]
        eof = False
        while True:
            while len(buf) - pos < HEADER.size and not eof:
                if pos:
                    del buf[:pos]
                    base, pos = base + pos, 0
                eof = not _read_into(fd, buf, read_buffer, io)
            if len(buf) == pos:
                return
            offset = base + pos
            if len(buf) - pos < HEADER.size:
                raise TFRecordError(
                    f"truncated record at offset {offset}: {len(buf) - pos} of the 12 header bytes", path
                )
            length, length_crc = HEADER.unpack_from(buf, pos)
            if masked_crc(memoryview(buf)[pos : pos + 8]) != length_crc:
                raise TFRecordError(f"length CRC32C mismatch in the record header at offset {offset}", path)
            end = pos + HEADER.size + length + FOOTER.size
            while len(buf) < end and not eof:
                eof = not _read_into(fd, buf, read_buffer, io)
            if len(buf) < end:
                raise TFRecordError(
                    f"truncated record at offset {offset}: header says {length} data bytes, "
                    f"the file ends {end - len(buf)} bytes short",
                    path,
                )
            payload = bytes(buf[pos + HEADER.size : end - FOOTER.size])
            if masked_crc(payload) != FOOTER.unpack_from(buf, end - FOOTER.size)[0]:
                raise TFRecordError(f"data CRC32C mismatch in the record at offset {offset}", path)
            pos = end
            yield payload
    finally:
        start = time.perf_counter()
        os.close(fd)
        io.read_seconds += time.perf_counter() - start


def _read_into(fd: int, buf: bytearray, read_buffer: int, io: IOCounters) -> bool:
    """One read system call of up to `read_buffer` bytes, appended to buf; False at end of file."""
    start = time.perf_counter()
    chunk = os.read(fd, read_buffer)
    io.read_seconds += time.perf_counter() - start
    io.reads += 1
    io.bytes += len(chunk)
    buf += chunk
    return bool(chunk)
