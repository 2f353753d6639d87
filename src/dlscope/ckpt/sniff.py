"""What kind of file a checkpoint is, from its first and last bytes: the one format sniffer
(ckpt inspect, ckpt scan and the checkpoint loader ask it)."""

from __future__ import annotations

ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")  # a local file header, or the end record of an empty zip
HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
NPY_MAGIC = b"\x93NUMPY"
TF_TABLE_MAGIC = bytes.fromhex("57fb808b247547db")  # the footer of a TF checkpoint's .index (a leveldb table)
LEGACY_MAGIC = 0x1950A86A20F9469CFC6C  # torch.serialization.MAGIC_NUMBER
LEGACY_PREFIX = b"\x80\x02\x8a\x0a" + LEGACY_MAGIC.to_bytes(10, "little")  # torch.save < 1.6
PICKLE_PROTO = 0x80  # protocol 2+ pickles (and the legacy torch.save format) start with the PROTO opcode
# first bytes of a protocol 0/1 pickle: MARK, GLOBAL, EMPTY_DICT/LIST/TUPLE, INT, STRING, UNICODE …
PICKLE_0_STARTS = set(b"(c}])IFLSVNJKMGXTU")


def sniff(head: bytes, tail: bytes = b"") -> str:
    """One of npy, zip, torch-legacy, hdf5, safetensors, tf-index, pickle, unknown. `head`: at least
    the first 16 bytes; `tail`: the last 8 (a TF index is known by its footer only)."""
    if head.startswith(NPY_MAGIC):
        return "npy"
    if head[:4] in ZIP_MAGICS:
        return "zip"
    if head.startswith(LEGACY_PREFIX):
        return "torch-legacy"
    if head.startswith(HDF5_MAGIC):
        return "hdf5"
    if len(head) >= 9 and head[8:9] == b"{":  # an 8-byte header length, then the JSON header
        return "safetensors"
    if tail == TF_TABLE_MAGIC:
        return "tf-index"
    if (len(head) >= 2 and head[0] == PICKLE_PROTO and 2 <= head[1] <= 5) or (head and head[0] in PICKLE_0_STARTS):
        return "pickle"
    return "unknown"
