"""Read a pickle without running it: a restricted unpickler that imports nothing.

Every GLOBAL / STACK_GLOBAL / INST / EXT opcode goes through `find_class` or `get_extension`
here, and neither imports a module. Names on the allow-list (tensor rebuilds, dtypes, storage
types, plain containers) become inert stand-ins that build a `TensorRef`; every other name becomes
an `Opaque` class that records how it was called (REDUCE, NEWOBJ, BUILD) and does nothing else.
So a pickle that says `os.system("…")` produces `Opaque('os.system')('…')` and a finding with the
byte offset of the opcode that named it — never a call.
"""

from __future__ import annotations

import collections
import io
import pickle
import pickletools
import reprlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

# dtype names as torch spells them in pickles (`torch.float32`) and the legacy storage classes
DTYPES: dict[str, torch.dtype] = {
    name: getattr(torch, name)
    for name in [
        "float64",
        "float32",
        "float16",
        "bfloat16",
        "complex128",
        "complex64",
        "int64",
        "int32",
        "int16",
        "int8",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "bool",
        "float8_e4m3fn",
        "float8_e5m2",
    ]
}
STORAGE_DTYPES: dict[str, torch.dtype] = {
    "DoubleStorage": torch.float64,
    "FloatStorage": torch.float32,
    "HalfStorage": torch.float16,
    "BFloat16Storage": torch.bfloat16,
    "ComplexDoubleStorage": torch.complex128,
    "ComplexFloatStorage": torch.complex64,
    "LongStorage": torch.int64,
    "IntStorage": torch.int32,
    "ShortStorage": torch.int16,
    "CharStorage": torch.int8,
    "ByteStorage": torch.uint8,
    "BoolStorage": torch.bool,
}
TENSOR_REBUILDS = {
    "torch._utils._rebuild_tensor",
    "torch._utils._rebuild_tensor_v2",
    "torch._utils._rebuild_parameter",
    "torch._utils._rebuild_parameter_with_state",
}
# what this module materialises; every name is also on torch's own weights_only allow-list
ALLOWED = (
    TENSOR_REBUILDS
    | {f"torch.{name}" for name in (*DTYPES, *STORAGE_DTYPES)}
    | {
        "torch.storage.UntypedStorage",
        "torch.Size",
        "torch.device",
        "collections.OrderedDict",
        "builtins.set",
        "builtins.bytearray",
        "builtins.complex",
        "_codecs.encode",
    }
)
# names whose only use in a pickle is to run code or touch the system: a finding at level "bad"
DANGEROUS_MODULES = {
    "os",
    "posix",
    "nt",
    "subprocess",
    "sys",
    "runpy",
    "importlib",
    "pickle",
    "_pickle",
    "shutil",
    "socket",
    "code",
    "codeop",
    "pty",
    "ctypes",
    "webbrowser",
    "commands",
    "multiprocessing",
    "pdb",
    "marshal",
    "types",
    "asyncio",
    "requests",
    "urllib",
    "http",
    "ftplib",
    "tempfile",
    "pathlib",
    "io",
    "shelve",
    "dill",
    "joblib",
    "torch.hub",
    "torch.jit",
    "torch.ops",
}
DANGEROUS_NAMES = {
    f"builtins.{name}"
    for name in [
        "eval",
        "exec",
        "compile",
        "__import__",
        "open",
        "getattr",
        "setattr",
        "delattr",
        "globals",
        "locals",
        "vars",
        "input",
        "breakpoint",
        "exit",
        "quit",
        "help",
        "memoryview",
        "type",
        "object",
        "super",
        "classmethod",
        "staticmethod",
        "property",
    ]
} | {"operator.attrgetter", "operator.methodcaller", "operator.itemgetter", "functools.partial", "functools.reduce"}
# Python 2 module names that protocol ≤ 2 pickles use
PY2_MODULES = {"__builtin__": "builtins", "copy_reg": "copyreg", "exceptions": "builtins"}


@dataclass
class StorageRef:
    """A tensor storage named by a persistent id: the bytes live elsewhere (a zip member, a file offset)."""

    key: str
    dtype: torch.dtype
    location: str
    numel: int  # elements, as the persistent id states them


@dataclass
class TensorRef:
    """A tensor as the pickle describes it: a view (offset, shape, stride) into a storage."""

    storage: StorageRef
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    parameter: bool = False

    @property
    def dtype(self) -> torch.dtype:
        return self.storage.dtype

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


class Opaque:
    """Stand-in for a name off the allow-list, and for what calling it would have returned."""

    qualname = "?"

    def __new__(cls, *args: Any, **kwargs: Any) -> Opaque:
        obj = object.__new__(cls)
        obj.args = args
        obj.state = None
        obj.items = []
        return obj

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> Opaque:
        return opaque_class(f"{self.qualname}(…)")(*args)

    def __setstate__(self, state: Any) -> None:
        self.state = state

    # list- and dict-like subclasses (a Lightning AttributeDict) receive APPENDS / SETITEMS
    def append(self, value: Any) -> None:
        self.items.append(value)

    def extend(self, values: Any) -> None:
        self.items.extend(values)

    def __setitem__(self, key: Any, value: Any) -> None:
        self.items.append((key, value))

    def __repr__(self) -> str:
        # what the call would have been, bounded: arguments of a payload are evidence, not code
        args = ", ".join(SHORT_REPR.repr(a) for a in self.args[:4]) if self.args else ""
        return f"<{self.qualname}({args})>" if self.args else f"<{self.qualname}>"


class _ShortRepr(reprlib.Repr):
    """Bounded repr of a payload's arguments; a nested stand-in is named, never recursed into."""

    def repr_instance(self, obj: Any, level: int) -> str:
        if isinstance(obj, Opaque):
            return f"<{obj.qualname}(…)>"
        return super().repr_instance(obj, level)


SHORT_REPR = _ShortRepr()
SHORT_REPR.maxlevel, SHORT_REPR.maxstring, SHORT_REPR.maxother = 2, 60, 40


def opaque_class(name: str) -> type[Opaque]:
    return type(name, (Opaque,), {"qualname": name})


@dataclass
class GlobalRef:
    name: str  # module.qualname
    position: int  # byte offset of the opcode in the pickle
    opcode: str

    @property
    def allowed(self) -> bool:
        return self.name in ALLOWED

    @property
    def dangerous(self) -> bool:
        module = self.name.rsplit(".", 1)[0]
        root = module.split(".")[0]
        return self.name in DANGEROUS_NAMES or root in DANGEROUS_MODULES or module in DANGEROUS_MODULES


@dataclass
class PickleScan:
    protocol: int
    opcodes: int
    nbytes: int
    globals: list[GlobalRef] = field(default_factory=list)
    calls: Counter[str] = field(default_factory=Counter)  # REDUCE / NEWOBJ per callee
    root: Any = None
    end: int = 0  # offset just past STOP

    @property
    def unsafe_globals(self) -> list[GlobalRef]:
        return [g for g in self.globals if not g.allowed]


class ScanError(ValueError):
    """The bytes are not a well-formed pickle."""


def _rebuild_tensor(storage: Any, offset: Any, size: Any, stride: Any, *rest: Any) -> TensorRef:
    if not isinstance(storage, StorageRef):
        raise ScanError("tensor rebuild without a storage")
    return TensorRef(storage, int(offset), tuple(int(d) for d in size), tuple(int(s) for s in stride))


def _rebuild_parameter(data: Any, *rest: Any) -> Any:
    if isinstance(data, TensorRef):
        data.parameter = True
    return data


def _codecs_encode(text: Any, encoding: str = "utf-8") -> bytes:
    # protocol 2 pickles bytes as _codecs.encode(str, 'latin1'); nothing else is honoured
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1", "utf-8", "utf8"):
        raise ScanError("_codecs.encode with an unexpected argument")
    return text.encode(encoding)


class _DtypeMarker(str):
    """`torch.float32` appearing as a value: kept as its name."""


def _stand_in(name: str) -> Any:
    module, _, attr = name.rpartition(".")
    if name in TENSOR_REBUILDS:
        return _rebuild_parameter if "parameter" in name else _rebuild_tensor
    if module == "torch" and attr in STORAGE_DTYPES:
        return STORAGE_DTYPES[attr]
    if name == "torch.storage.UntypedStorage":
        return torch.uint8
    if module == "torch" and attr in DTYPES:
        return _DtypeMarker(name)
    return {
        "torch.Size": lambda dims=(): tuple(dims),
        "torch.device": lambda *a: "device(" + ":".join(str(x) for x in a) + ")",
        "collections.OrderedDict": collections.OrderedDict,
        "builtins.set": set,
        "builtins.bytearray": bytearray,
        "builtins.complex": complex,
        "_codecs.encode": _codecs_encode,
    }[name]


class RestrictedUnpickler(pickle._Unpickler):
    """The pure-Python unpickler with every way of reaching a Python object replaced."""

    dispatch: ClassVar[dict] = dict(pickle._Unpickler.dispatch)

    def __init__(self, file: io.BufferedIOBase, global_positions: list[tuple[int, str]]) -> None:
        super().__init__(file)
        self.global_positions = global_positions
        self.globals: list[GlobalRef] = []
        self.calls: Counter[str] = Counter()
        self.names: dict[int, str] = {}  # id(stand-in) → global name, to label calls

    def find_class(self, module: str, name: str) -> Any:
        module = PY2_MODULES.get(module, module)
        full = f"{module}.{name}"
        index = len(self.globals)
        position, opcode = self.global_positions[index] if index < len(self.global_positions) else (-1, "?")
        ref = GlobalRef(full, position, opcode)
        self.globals.append(ref)
        obj = _stand_in(full) if ref.allowed else opaque_class(full)
        self.names[id(obj)] = full
        return obj

    def get_extension(self, code: int) -> None:
        # the copyreg extension registry maps a number to a global; it is empty unless code registered one
        self.globals.append(GlobalRef(f"copyreg.extension[{code}]", -1, "EXT"))
        self.append(opaque_class(f"copyreg.extension[{code}]"))

    def persistent_load(self, pid: Any) -> StorageRef:
        if not (isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage"):
            raise ScanError(f"unexpected persistent id {type(pid).__name__}")
        _, dtype, key, location, numel = pid[:5]
        if not isinstance(dtype, torch.dtype):
            raise ScanError(f"storage of unknown type {dtype!r}")
        return StorageRef(str(key), dtype, str(location), int(numel))

    def load_reduce(self) -> None:
        args = self.stack.pop()
        func = self.stack[-1]
        self.calls[self.names.get(id(func), getattr(func, "qualname", type(func).__name__))] += 1
        if not isinstance(args, tuple):
            raise ScanError("REDUCE arguments are not a tuple")
        self.stack[-1] = func(*args)

    dispatch[pickle.REDUCE[0]] = load_reduce

    def load_newobj(self) -> None:
        args = self.stack.pop()
        cls = self.stack.pop()
        if not (isinstance(cls, type) and issubclass(cls, Opaque)):
            raise ScanError(f"NEWOBJ of {getattr(cls, '__name__', type(cls).__name__)}, which is not an opaque class")
        self.calls[cls.qualname] += 1
        self.append(cls.__new__(cls, *args))

    dispatch[pickle.NEWOBJ[0]] = load_newobj

    def load_newobj_ex(self) -> None:
        kwargs = self.stack.pop()
        args = self.stack.pop()
        cls = self.stack.pop()
        if not (isinstance(cls, type) and issubclass(cls, Opaque)):
            raise ScanError("NEWOBJ_EX of a class that is not opaque")
        self.calls[cls.qualname] += 1
        self.append(cls.__new__(cls, *args, **kwargs))

    dispatch[pickle.NEWOBJ_EX[0]] = load_newobj_ex

    def load_build(self) -> None:
        state = self.stack.pop()
        inst = self.stack[-1]
        if isinstance(inst, collections.OrderedDict):
            return  # a state_dict's `_metadata` (module versions): attributes, not entries
        if not isinstance(inst, Opaque):
            raise ScanError(f"BUILD on {type(inst).__name__}")
        inst.__setstate__(state)

    dispatch[pickle.BUILD[0]] = load_build


GLOBAL_OPCODES = {"GLOBAL", "STACK_GLOBAL", "INST"}


def scan_pickle(data: bytes) -> PickleScan:
    """Opcode census, then a restricted load of the same bytes. Raises ScanError if malformed."""
    opcodes = 0
    protocol = 0
    positions: list[tuple[int, str]] = []
    end = 0
    try:
        for op, arg, pos in pickletools.genops(data):
            opcodes += 1
            if op.name == "PROTO":
                protocol = int(arg)
            elif protocol < 2:
                protocol = max(protocol, op.proto)
            if op.name in GLOBAL_OPCODES:
                positions.append((pos, op.name))
            end = pos + 1
    except (ValueError, KeyError, EOFError, OverflowError, UnicodeDecodeError) as e:
        raise ScanError(f"malformed pickle: {e}") from None
    unpickler = RestrictedUnpickler(io.BytesIO(data[:end]), positions)
    try:
        root = unpickler.load()
    except ScanError:
        raise
    except (pickle.UnpicklingError, ValueError, TypeError, KeyError, IndexError, AttributeError, EOFError) as e:
        raise ScanError(f"malformed pickle: {type(e).__name__}: {e}") from None
    except RecursionError:
        raise ScanError("malformed pickle: nesting too deep") from None
    return PickleScan(protocol, opcodes, end, unpickler.globals, unpickler.calls, root, end)
