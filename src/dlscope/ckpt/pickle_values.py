"""What a simulated pickle holds instead of Python objects: names (`Global`), the results of calls
(`Opaque`, `TensorRef`), leaves left in the file (`Blob`), and the `Event`s that record each time the
pickle reaches code. Built from names and numbers only: nothing here imports what a pickle names."""

from __future__ import annotations

import _compat_pickle
from dataclasses import dataclass, field
from typing import Any

# legacy storage classes → the dtype their elements have, and its size in bytes
STORAGE_DTYPES = {
    "DoubleStorage": ("float64", 8),
    "FloatStorage": ("float32", 4),
    "HalfStorage": ("float16", 2),
    "BFloat16Storage": ("bfloat16", 2),
    "ComplexDoubleStorage": ("complex128", 16),
    "ComplexFloatStorage": ("complex64", 8),
    "LongStorage": ("int64", 8),
    "IntStorage": ("int32", 4),
    "ShortStorage": ("int16", 2),
    "CharStorage": ("int8", 1),
    "ByteStorage": ("uint8", 1),
    "BoolStorage": ("bool", 1),
    "QInt8Storage": ("qint8", 1),
    "QUInt8Storage": ("quint8", 1),
    "QInt32Storage": ("qint32", 4),
    "QUInt4x2Storage": ("quint4x2", 1),
    "QUInt2x4Storage": ("quint2x4", 1),
}
# the other dtypes a pickle can name, by element size
OTHER_DTYPES = {
    1: ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu", "bits8"),
    2: ("uint16", "bits16"),
    4: ("complex32", "uint32"),
    8: ("uint64",),
}
ITEMSIZE = {
    **{name: size for name, size in STORAGE_DTYPES.values()},
    **{name: size for size, names in OTHER_DTYPES.items() for name in names},
}
TENSOR_REBUILDS = {"torch._utils._rebuild_tensor", "torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_tensor_v3"}
PARAMETER_REBUILDS = {
    "torch._utils._rebuild_parameter",
    "torch._utils._rebuild_parameter_with_state",
    "torch.nn.parameter.Parameter",
}


class DType(str):
    """A torch dtype named in a pickle (`torch.float32`), kept as its name."""

    @property
    def itemsize(self) -> int:
        return ITEMSIZE.get(self.removeprefix("torch."), 0)


@dataclass(frozen=True, repr=False)
class Global:
    """What GLOBAL and its relatives push: the name, never the object."""

    name: str
    allowed: bool

    def __repr__(self) -> str:
        return self.name


@dataclass
class Blob:
    """A leaf too long to copy: where its bytes are in the pickle."""

    kind: str
    offset: int
    length: int

    def __repr__(self) -> str:
        return f"<{self.kind} of {self.length:,} bytes @ {self.offset}>"


@dataclass
class Opaque:
    """What calling or instantiating `qualname` would have returned: its arguments, state and entries."""

    qualname: str
    args: Any = ()
    state: Any = None
    items: list = field(default_factory=list)
    allowed: bool = False

    def __repr__(self) -> str:
        return f"<{self.qualname}({short_repr(self.args)[1:-1]})>" if self.args else f"<{self.qualname}>"


@dataclass(frozen=True, eq=False)
class ObjectKey:
    """A dict key that is an instance of a class (DCP's MetadataIndex, a frozen dataclass, keys its
    storage map): pickle.load hashes it as its class does; kept here by identity."""

    value: Opaque


class Elided:
    """A container built past MAX_CONTAINERS: simulated, not kept."""

    def __repr__(self) -> str:
        return "<elided>"


ELIDED = Elided()


@dataclass
class StorageRef:
    """A tensor storage named by a persistent id: the bytes live elsewhere (a zip member, a file offset)."""

    key: str
    dtype: DType
    location: str
    numel: int  # elements, as the persistent id states them


@dataclass
class TensorRef:
    """A tensor as the pickle describes it: a view (offset, shape, stride) into a storage."""

    storage: StorageRef
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]

    @property
    def dtype(self) -> DType:
        return self.storage.dtype

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass
class Event:
    """A moment the pickle reaches Python code: an import, or a call of what was imported."""

    name: str  # module.qualname
    opcode: str
    position: int  # byte offset of the opcode in the file
    allowed: bool
    call: bool  # False: only imported (which runs the module's import-time code)
    detail: str = ""  # the call's arguments, shortened: evidence, not code
    subject: str = ""  # the imported name this uses (`X` for `X.__setstate__`, `X(…)`); default: name

    def __post_init__(self) -> None:
        self.subject = self.subject or self.name


@dataclass
class PickleScan:
    start: int  # offset of the first opcode
    end: int = 0  # offset just past STOP, or of the opcode that broke the stream
    protocol: int = 0
    opcodes: int = 0
    events: list[Event] = field(default_factory=list)
    root: Any = None
    error: str | None = None  # why the stream breaks at `end`, if it does
    elided: bool = False  # the tree outgrew MAX_CONTAINERS

    @property
    def imports(self) -> list[Event]:
        return [e for e in self.events if not e.call]

    @property
    def unsafe_events(self) -> list[Event]:
        return [e for e in self.events if not e.allowed]

    @property
    def nbytes(self) -> int:
        return self.end - self.start


class ScanError(ValueError):
    """The bytes are not a well-formed pickle; the stream breaks at `position`."""

    def __init__(self, message: str, position: int = -1):
        super().__init__(message)
        self.position = position


def short_repr(value: Any, limit: int = 80) -> str:
    """A bounded repr that never recurses into a container (a deep tree costs nothing)."""
    if isinstance(value, tuple | list):
        inner = ", ".join(_leaf_repr(v) for v in value[:4]) + (", …" if len(value) > 4 else "")
        text = f"({inner})" if isinstance(value, tuple) else f"[{inner}]"
    else:
        text = _leaf_repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _leaf_repr(value: Any) -> str:
    if isinstance(value, str | bytes):
        return repr(value[:60]) + ("…" if len(value) > 60 else "")
    if isinstance(value, dict | list | tuple | set | frozenset):
        return f"<{type(value).__name__} of {len(value)}>"
    if isinstance(value, Opaque):
        return f"<{value.qualname}(…)>"
    return repr(value)[:60]


def global_name(module: str, name: str) -> str:
    """module.name as pickle resolves it (Python 2 names mapped to Python 3 ones, as protocol ≤ 2 loads do)."""
    if (module, name) in _compat_pickle.NAME_MAPPING:
        module, name = _compat_pickle.NAME_MAPPING[(module, name)]
    elif module in _compat_pickle.IMPORT_MAPPING:
        module = _compat_pickle.IMPORT_MAPPING[module]
    return f"{module}.{name}"


def stand_in(name: str, args: tuple) -> Any:
    """What an allowed callable returns, built from names and numbers only; anything else stays Opaque."""
    if name in TENSOR_REBUILDS and len(args) >= 4 and isinstance(args[0], StorageRef):
        storage, offset, size, stride = args[:4]
        if isinstance(offset, int) and all_ints(size) and all_ints(stride):
            return TensorRef(storage, offset, tuple(size), tuple(stride))
    if name in PARAMETER_REBUILDS and args and isinstance(args[0], TensorRef):
        return args[0]  # a parameter is its tensor: the role comes from where it sits
    if name == "torch._tensor._rebuild_from_type_v2" and len(args) >= 3 and isinstance(args[0], Global):
        return stand_in(args[0].name, tuple(args[2]) if isinstance(args[2], tuple) else ())
    if name in ("collections.OrderedDict", "collections.Counter") and not args:
        return {}
    if name == "torch.Size" and len(args) == 1 and isinstance(args[0], tuple | list):
        return tuple(args[0])
    if name == "torch.device" and args and all(isinstance(a, str | int) for a in args):
        return ":".join(str(a) for a in args)
    if name == "builtins.set" and len(args) == 1 and isinstance(args[0], list | tuple):
        return hashable_set(args[0], set)
    if name == "builtins.complex" and all(isinstance(a, int | float) for a in args) and len(args) <= 2:
        return complex(*args)
    if name == "_codecs.encode" and args and isinstance(args[0], str):
        return args[0].encode("latin-1", "replace")  # protocol 2 pickles bytes as encode(str, 'latin1')
    return Opaque(name, args, allowed=True)


def all_ints(values: Any) -> bool:
    return isinstance(values, tuple | list) and all(isinstance(v, int) and not isinstance(v, bool) for v in values)


def hashable_set(items: Any, kind: type) -> Any:
    try:
        return kind(items)
    except TypeError:
        return Opaque(kind.__name__, (list(items),), allowed=True)


def storage_ref(pid: Any) -> Any:
    """torch's persistent id ('storage', StorageClass, key, location, numel) as a StorageRef."""
    if isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage" and isinstance(pid[1], Global):
        _, kind, key, location, numel = pid[:5]
        dtype = storage_dtype(kind.name)
        if dtype is not None and isinstance(numel, int):
            return StorageRef(str(key), dtype, str(location), numel)
    return Opaque("persistent_id", (pid,), allowed=True)


def numpy_itemsize(dtype: Any) -> int | None:
    """Bytes per element of a numpy dtype as joblib pickles it: numpy.dtype('f4', …); None if unknown."""
    code = dtype.args[0] if isinstance(dtype, Opaque) and dtype.args and isinstance(dtype.args[0], str) else ""
    return 0 if code.lstrip("<>|=")[:1] == "O" else npy_itemsize(code)


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


def storage_dtype(name: str) -> DType | None:
    """`torch.FloatStorage` → float32 (a legacy storage class), `torch.float32` → float32, untyped → uint8."""
    module, _, attr = name.rpartition(".")
    if module in ("torch", "torch.cuda") and attr in STORAGE_DTYPES:
        return DType(STORAGE_DTYPES[attr][0])
    if name == "torch.storage.UntypedStorage":
        return DType("uint8")
    if module == "torch" and attr in ITEMSIZE:
        return DType(attr)
    return None
