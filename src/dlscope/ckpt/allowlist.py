"""The globals `torch.load(weights_only=True)` accepts in torch 2.13, as names: the scanner judges a pickle
by them without importing torch (tests/test_ckpt_scan.py compares this list with torch's own)."""

from __future__ import annotations

# torch's legacy typed tensor and storage classes, by element type
TYPED = ("BFloat16", "Bool", "Byte", "Char", "Double", "Float", "Half", "Int", "Long", "Short")
COMPLEX = ("ComplexDouble", "ComplexFloat")  # storages only
QUANTISED = ("QInt32", "QInt8", "QUInt2x4", "QUInt4x2", "QUInt8")  # CPU storages; lower-cased, dtypes too
FLOAT_DTYPES = ("bfloat16", "float16", "float32", "float64", "complex32", "complex64", "complex128")
FLOAT8_DTYPES = ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu")
INT_DTYPES = tuple(f"{u}int{bits}" for u in ("", "u") for bits in (*range(1, 9), 16, 32, 64))  # int1 … uint64
BITS_DTYPES = ("bool", "bits8", "bits16", "bits1x8", "bits2x4", "bits4x2")

TORCH_WEIGHTS_ONLY: frozenset[str] = frozenset(
    {
        "_codecs.encode",
        "builtins.bytearray",
        "builtins.complex",
        "builtins.set",
        "collections.Counter",
        "collections.OrderedDict",
        "torch.Size",
        "torch.Tensor",
        "torch.device",
        "torch.nn.parameter.Parameter",
        "torch._tensor._rebuild_from_type_v2",
        "torch.serialization._get_layout",
        "torch.storage.TypedStorage",
        "torch.storage.UntypedStorage",
        "torch._utils._rebuild_device_tensor_from_cpu_tensor",
        "torch._utils._rebuild_device_tensor_from_numpy",
        "torch._utils._rebuild_meta_tensor_no_storage",
        "torch._utils._rebuild_nested_tensor",
        "torch._utils._rebuild_parameter",
        "torch._utils._rebuild_parameter_with_state",
        "torch._utils._rebuild_qtensor",
        "torch._utils._rebuild_sparse_tensor",
        "torch._utils._rebuild_tensor",
        "torch._utils._rebuild_tensor_v2",
        "torch._utils._rebuild_tensor_v3",
        "torch._utils._rebuild_wrapper_subclass",
        *(f"torch.{t}Storage" for t in (*TYPED, *COMPLEX, *QUANTISED)),
        *(f"torch.cuda.{t}Storage" for t in (*TYPED, *COMPLEX)),
        *(f"torch.{where}{t}Tensor" for where in ("", "cuda.") for t in TYPED),
        *(f"torch.{where}sparse.{t}Tensor" for where in ("", "cuda.") for t in TYPED if t != "Bool"),
        *(f"torch.{d}" for d in (*FLOAT_DTYPES, *FLOAT8_DTYPES, *INT_DTYPES, *BITS_DTYPES)),
        "torch.float4_e2m1fn_x2",
        *(f"torch.{q.lower()}" for q in QUANTISED),
        *(f"torch.per_{of}_{kind}" for of in ("channel", "tensor") for kind in ("affine", "symmetric")),
        "torch.per_channel_affine_float_qparams",  # the quantisation schemes
    }
)

# what np.save writes for an object array (np.load(allow_pickle=True)): the array, its dtype, its scalars;
# inert constructors, allowed only inside .npy / .npz / joblib files
NUMPY_ARRAY: frozenset[str] = frozenset(
    {
        "numpy._core.multiarray._reconstruct",
        "numpy._core.multiarray.scalar",
        "numpy.core.multiarray._reconstruct",
        "numpy.core.multiarray.scalar",
        "numpy.dtype",
        "numpy.ndarray",
    }
)

# what torch.distributed.checkpoint's `.metadata` pickle names (torch 2.13): its own dataclasses, torch.Size,
# dtypes and layouts, the checkpoint id's path; inert constructors, allowed only in a DCP `.metadata`
DCP_METADATA: frozenset[str] = frozenset(
    {
        "pathlib.PosixPath",
        "pathlib.WindowsPath",
        "torch.distributed.checkpoint.filesystem._StorageInfo",
        "torch.distributed.checkpoint.metadata.BytesStorageMetadata",
        "torch.distributed.checkpoint.metadata.ChunkStorageMetadata",
        "torch.distributed.checkpoint.metadata.Metadata",
        "torch.distributed.checkpoint.metadata.MetadataIndex",
        "torch.distributed.checkpoint.metadata.StorageMeta",
        "torch.distributed.checkpoint.metadata.TensorProperties",
        "torch.distributed.checkpoint.metadata.TensorStorageMetadata",
        "torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING",
        "torch.serialization._get_layout",
    }
)
