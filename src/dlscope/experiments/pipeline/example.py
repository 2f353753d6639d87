"""`tf.train.Example`, the payload TF users put in TFRecords, encoded and parsed without TensorFlow.

    Example   { Features features = 1; }
    Features  { map<string, Feature> feature = 1; }      each entry: key = 1, value = 2
    Feature   { BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list = 3; }
    BytesList { repeated bytes value = 1; }  Int64List { repeated int64 value = 1 [packed]; }

dlscope's samples carry three features: `image` (the sample's raw uint8 bytes), `label` and
`index` (int64; the index lets a consumer check that an epoch delivered every sample once).
`tf.io.parse_single_example` reads them (dlscope.experiments.pipeline.tfdata.FEATURES); `parse_example` reads them back,
from dlscope's files or TF's. dlscope writes the two integers as 5-byte varints (padded with
continuation bits, which every protobuf parser accepts), so every record of a dataset has the
same size: seed 003's 550-byte files stay 550 bytes whatever the index.
"""

from __future__ import annotations

import struct

from dlscope.protowire import FormatError, encode_varint, length_delimited, packed_varints, proto_fields, signed64

INT_WIDTH = 5  # varint bytes: indices up to 2**35


def _int64_feature(value: int) -> bytes:
    return length_delimited(3, length_delimited(1, encode_varint(value, INT_WIDTH)))


def _bytes_feature(value: bytes) -> bytes:
    return length_delimited(1, length_delimited(1, value))


def encode_example(index: int, label: int, image: bytes) -> bytes:
    """A serialized tf.train.Example with features image, label and index."""
    entries = (("image", _bytes_feature(image)), ("label", _int64_feature(label)), ("index", _int64_feature(index)))
    features = b"".join(
        length_delimited(1, length_delimited(1, key.encode()) + length_delimited(2, value)) for key, value in entries
    )
    return length_delimited(1, features)


def example_bytes(sample_bytes: int) -> int:
    """The size of one encoded sample of `sample_bytes` image bytes (the same for every index)."""
    return len(encode_example(0, 0, bytes(sample_bytes)))


def parse_features(record: bytes) -> dict[str, bytes | list[int] | list[float]]:
    """Every feature of a serialized tf.train.Example: bytes features as their first value,
    int64 and float features as lists."""
    out: dict[str, bytes | list[int] | list[float]] = {}
    for number, features in proto_fields(record):
        if number != 1:
            continue
        for entry_number, entry in proto_fields(features):
            if entry_number != 1:
                continue
            key, feature = b"", b""
            for n, v in proto_fields(entry):
                if n == 1:
                    key = v
                elif n == 2:
                    feature = v
            for kind, values in proto_fields(feature):
                fields = [v for n, v in proto_fields(values) if n == 1]
                if kind == 1:
                    out[key.decode("utf-8", "replace")] = fields[0] if fields else b""
                elif kind == 3:  # packed (proto3's default) or one varint per value
                    ints = [x for f in fields for x in (packed_varints(f) if isinstance(f, bytes) else [f])]
                    out[key.decode("utf-8", "replace")] = [signed64(x) for x in ints]
                elif kind == 2:
                    raw = b"".join(f if isinstance(f, bytes) else f.to_bytes(4, "little") for f in fields)
                    floats = list(struct.unpack(f"<{len(raw) // 4}f", raw))
                    out[key.decode("utf-8", "replace")] = floats
    return out


def parse_example(record: bytes) -> tuple[int, int, bytes]:
    """(index, label, image bytes) of one sample; FormatError names what is missing."""
    features = parse_features(record)
    try:
        image, label, index = features["image"], features["label"], features["index"]
    except KeyError as e:
        raise FormatError(f"tf.train.Example has no {e.args[0]!r} feature (has: {', '.join(features)})") from None
    if not isinstance(image, bytes) or not isinstance(label, list) or not isinstance(index, list):
        raise FormatError("tf.train.Example features image/label/index have the wrong kinds")
    if len(label) != 1 or len(index) != 1:
        raise FormatError("tf.train.Example label and index must hold one value each")
    return index[0], label[0], image
