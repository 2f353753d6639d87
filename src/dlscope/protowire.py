"""The protobuf wire format, by hand: enough to read TF's BundleEntryProto and object graph and to
read and write `tf.train.Example` without importing TensorFlow or protobuf.

A message is a sequence of (tag, value) with tag = field_number << 3 | wire_type; wire types used
by these messages: 0 varint, 1 fixed64, 2 length-delimited (bytes, strings, sub-messages, packed
repeated scalars), 5 fixed32.
"""

from __future__ import annotations

from typing import Any


class FormatError(ValueError):
    """A fault inside a protobuf message (or a structure that holds one)."""


def varint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """The varint at `pos` and the position after it. Non-minimal encodings (up to 10 bytes) are valid."""
    value = shift = 0
    for _ in range(10):
        if pos >= len(buf):
            raise FormatError("varint runs past the end of its block")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
    raise FormatError("varint longer than 10 bytes")


def signed64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def proto_fields(buf: bytes | memoryview) -> list[tuple[int, Any]]:
    """(field number, value) of a protobuf message: ints for varint/fixed, bytes for length-delimited."""
    out, pos = [], 0
    while pos < len(buf):
        tag, pos = varint(buf, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, pos = varint(buf, pos)
        elif wire == 1:
            if pos + 8 > len(buf):
                raise FormatError("fixed64 field cut short")
            value, pos = int.from_bytes(buf[pos : pos + 8], "little"), pos + 8
        elif wire == 5:
            if pos + 4 > len(buf):
                raise FormatError("fixed32 field cut short")
            value, pos = int.from_bytes(buf[pos : pos + 4], "little"), pos + 4
        elif wire == 2:
            n, pos = varint(buf, pos)
            if pos + n > len(buf):
                raise FormatError("length-delimited field runs past its message")
            value, pos = bytes(buf[pos : pos + n]), pos + n
        else:
            raise FormatError(f"protobuf wire type {wire}")
        out.append((number, value))
    return out


def packed_varints(buf: bytes) -> list[int]:
    out, pos = [], 0
    while pos < len(buf):
        value, pos = varint(buf, pos)
        out.append(value)
    return out


def encode_varint(value: int, width: int = 0) -> bytes:
    """Minimal varint, or padded to `width` bytes with continuation bits (a fixed-size encoding
    every protobuf parser accepts), for records whose size must not depend on their values."""
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value or len(out) + 1 < width:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def length_delimited(number: int, payload: bytes) -> bytes:
    return encode_varint(number << 3 | 2) + encode_varint(len(payload)) + payload
