"""TensorFlow checkpoints: `<prefix>.index` (a LevelDB-style table of BundleEntryProto) plus
`<prefix>.data-NNNNN-of-MMMMM` shards. Read through tensorflow's own CheckpointReader when it is
importable; without it dlscope says so rather than guess."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from dlscope.ckpt.anatomy import Anatomy, TensorEntry
from dlscope.errors import CheckpointError

TABLE_MAGIC = (0xDB4775248B80FB57).to_bytes(8, "little")  # last 8 bytes of a LevelDB/TF table


def inspect_tf(index: Path, stats: bool) -> Anatomy:
    prefix = str(index).removesuffix(".index")
    try:
        import tensorflow as tf
    except ImportError:
        raise CheckpointError(
            "TensorFlow checkpoint (.index table + data shards): reading it needs tensorflow, which is not "
            "importable here (pip install tensorflow)",
            index,
        ) from None
    try:
        reader = tf.train.load_checkpoint(prefix)
        shapes = reader.get_variable_to_shape_map()
        dtypes = reader.get_variable_to_dtype_map()
    except (tf.errors.OpError, ValueError) as e:
        raise CheckpointError(f"unreadable TensorFlow checkpoint: {str(e).splitlines()[0]}", index) from None
    shards = sorted(Path(prefix).parent.glob(Path(prefix).name + ".data-*"))
    anatomy = Anatomy(str(index), "TensorFlow checkpoint", sum(p.stat().st_size for p in [index, *shards]))
    anatomy.layout["files"] = [{"path": str(p), "bytes": p.stat().st_size} for p in [index, *shards]]
    for name in sorted(shapes):
        dtype, shape = dtypes[name], list(shapes[name])
        numel = int(np.prod(shape, dtype=np.int64)) if shape else 1
        anatomy.tensors.append(
            TensorEntry(
                name=name,
                dtype=dtype.name,
                shape=shape,
                numel=numel,
                nbytes=numel * dtype.size,
                storage=name,
                storage_bytes=numel * dtype.size,
                offset=None,
                role="optimizer" if "/.OPTIMIZER_SLOT/" in name or name.startswith("optimizer/") else "parameter",
                group=name.split("/")[0],
                read=(lambda n=name: torch.from_numpy(np.asarray(reader.get_tensor(n))))
                if dtype.is_numpy_compatible
                else None,
            )
        )
    return anatomy
