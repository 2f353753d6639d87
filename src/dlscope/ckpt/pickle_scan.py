"""Read a pickle without running it: the pickle machine simulated opcode by opcode, importing nothing.

Every way a pickle reaches Python code (GLOBAL, STACK_GLOBAL, INST, OBJ, EXT1/2/4, REDUCE, NEWOBJ,
NEWOBJ_EX, BUILD on anything but a container) is recorded as an `Event` with its byte offset the
moment it happens, so a stream that breaks later still reports what `pickle.load` would already
have run. Names on the allow-list become inert stand-ins (a tensor rebuild gives a `TensorRef`);
every other name becomes an `Opaque` that only remembers how it was called.

Bounded by design: one loop, no recursion (1,000,000 nested lists are 1,000,000 iterations); no
allocation is ever sized by a number read from the file (a bytes leaf over `BIG_LEAF` stays a
`Blob` pointing into the buffer, a declared `bytearray(10**12)` is never built); past
`MAX_CONTAINERS` containers the tree is elided but every opcode is still simulated. Memory is
the pickle's bytes plus at most 16 bytes per pickle byte (stack, memo, marks, short strings) plus
the tree budget (~64 MiB): tests/test_ckpt_scan.py checks that bound on hostile files.
"""

from __future__ import annotations

import codecs
import struct
from array import array
from typing import Any

from dlscope.ckpt.allowlist import TORCH_WEIGHTS_ONLY
from dlscope.ckpt.pickle_values import (
    ELIDED,
    Blob,
    Elided,
    Event,
    Global,
    ObjectKey,
    Opaque,
    PickleScan,
    ScanError,
    TensorRef,
    all_ints,
    global_name,
    hashable_set,
    numpy_itemsize,
    short_repr,
    stand_in,
    storage_ref,
)

BIG_LEAF = 4096  # strings, bytes and longs longer than this stay in the file (a Blob), never copied
MAX_CONTAINERS = 500_000  # lists, dicts, tuples, sets, objects built for the tree; past it they are elided
LONG_INT_BYTES = 16  # LONG1/LONG4 wider than this are leaves, not ints (no huge-integer arithmetic later)
STOP = ord(".")
JOBLIB_WRAPPER = "joblib.numpy_pickle.NumpyArrayWrapper"


class Machine:
    """One pickle, from `start` to STOP, in one loop. `joblib` honours NumpyArrayWrapper's inline arrays."""

    def __init__(self, data: bytes, start: int, allowed: frozenset[str], joblib: bool = False):
        self.data, self.allowed, self.joblib = data, allowed, joblib
        self.scan = PickleScan(start)
        self.stack: list[Any] = []
        self.marks = array("q")
        self.memo: list[Any] = []  # dense memo (MEMOIZE, PUT n in order); sparse indices go to memo_sparse
        self.memo_sparse: dict[int, Any] = {}
        self.containers = 0
        self.pos = start
        self.op_pos = start

    # reading arguments: every length is checked against the bytes that remain before it is used
    def take(self, n: int) -> bytes:
        if n < 0:
            raise ScanError(f"negative length {n}", self.op_pos)
        end = self.pos + n
        if end > len(self.data):
            raise ScanError(f"truncated: needs {n:,} bytes, {len(self.data) - self.pos:,} remain", self.op_pos)
        chunk = bytes(self.data[self.pos : end])
        self.pos = end
        return chunk

    def skip(self, n: int) -> int:
        """Step over n bytes without copying them; where they start."""
        start = self.pos
        if n < 0 or start + n > len(self.data):
            raise ScanError(f"truncated: needs {n:,} bytes, {len(self.data) - start:,} remain", self.op_pos)
        self.pos = start + n
        return start

    def take_leaf(self, n: int, kind: str) -> Any:
        if n > BIG_LEAF:
            return Blob(kind, self.skip(n), n)
        raw = bytes(self.take(n))
        if kind == "str":
            try:
                return raw.decode("utf-8", "surrogatepass")
            except UnicodeDecodeError as e:
                raise ScanError(f"invalid UTF-8 in a string: {e.reason}", self.op_pos) from None
        return raw

    def line(self) -> bytes:
        end = self.data.find(b"\n", self.pos)
        if end < 0:
            raise ScanError("truncated: a text argument has no newline", self.op_pos)
        raw = bytes(self.data[self.pos : end])
        self.pos = end + 1
        return raw

    def uint(self, n: int) -> int:
        return int.from_bytes(self.take(n), "little")

    # the machine's state
    def pop(self) -> Any:
        if len(self.stack) <= (self.marks[-1] if self.marks else 0):
            raise ScanError("stack underflow", self.op_pos)
        return self.stack.pop()

    def top(self) -> Any:
        if len(self.stack) <= (self.marks[-1] if self.marks else 0):
            raise ScanError("stack underflow", self.op_pos)
        return self.stack[-1]

    def pop_mark(self) -> list[Any]:
        if not self.marks:
            raise ScanError("no MARK to pop to", self.op_pos)
        i = self.marks.pop()
        items = self.stack[i:]
        del self.stack[i:]
        return items

    def container(self, value: Any) -> Any:
        self.containers += 1
        if self.containers > MAX_CONTAINERS:
            self.scan.elided = True
            return ELIDED
        return value

    def put(self, index: int) -> None:
        value = self.top()
        if index == len(self.memo):
            self.memo.append(value)
        elif index < len(self.memo):
            self.memo[index] = value
        else:
            self.memo_sparse[index] = value

    def get(self, index: int) -> None:
        if index < len(self.memo):
            self.stack.append(self.memo[index])
        elif index in self.memo_sparse:
            self.stack.append(self.memo_sparse[index])
        else:
            raise ScanError(f"memo {index} never stored", self.op_pos)

    # reaching Python code
    def import_(self, name: str, opcode: str) -> Global:
        ok = name in self.allowed
        self.scan.events.append(Event(name, opcode, self.op_pos, ok, call=False))
        return Global(name, ok)

    def call(self, callee: Any, args: Any, opcode: str, kwargs: Any = None) -> Any:
        if isinstance(callee, Global):
            name, ok = callee.name, callee.allowed
        elif isinstance(callee, Opaque):
            name, ok = f"{callee.qualname}(…)", False  # calling what a call returned: code of its class
        else:
            raise ScanError(f"{opcode} calls a {type(callee).__name__}, which is not callable", self.op_pos)
        if not isinstance(args, tuple | Elided):
            raise ScanError(f"{opcode} arguments are a {type(args).__name__}, not a tuple", self.op_pos)
        args = () if isinstance(args, Elided) else args
        self.scan.events.append(
            Event(name, opcode, self.op_pos, ok, True, short_repr(args), getattr(callee, "qualname", ""))
        )
        if ok:
            result = stand_in(name, args)
            return self.container(result) if isinstance(result, Opaque) else result
        return self.container(Opaque(name, args if kwargs is None else (*args, kwargs)))

    def build(self) -> None:
        state = self.pop()
        inst = self.top()
        if isinstance(inst, dict | TensorRef | Elided):
            return  # a state_dict's _metadata, a legacy tensor's set_(): attributes, no code
        if isinstance(inst, Global):
            # BUILD on a class, function or module rewrites its attributes (torch._utils made into builtins)
            self.scan.events.append(Event(inst.name, "BUILD", self.op_pos, False, True, f"state {short_repr(state)}"))
            return
        if not isinstance(inst, Opaque):
            raise ScanError(f"BUILD on a {type(inst).__name__}, which has no __setstate__", self.op_pos)
        self.scan.events.append(
            Event(f"{inst.qualname}.__setstate__", "BUILD", self.op_pos, inst.allowed, True, "", inst.qualname)
        )
        inst.state = state
        if self.joblib and inst.qualname == JOBLIB_WRAPPER:
            self.skip_joblib_array(inst)

    def skip_joblib_array(self, wrapper: Opaque) -> None:
        """joblib writes an array's bytes right after its wrapper's BUILD; its own load reads them there."""
        state = wrapper.state if isinstance(wrapper.state, dict) else {}
        itemsize = numpy_itemsize(state.get("dtype"))
        shape = state.get("shape")
        if itemsize is None or not all_ints(shape):
            raise ScanError("joblib array wrapper without a readable dtype and shape", self.op_pos)
        if itemsize == 0:  # an object array: a whole pickle of its own follows, loaded by plain pickle.load
            inner = Machine(self.data, self.pos, self.allowed).run()
            self.scan.events.extend(inner.events)
            if inner.error:
                raise ScanError(f"object array pickle: {inner.error}", inner.end)
            self.pos = inner.end
        else:
            if "numpy_array_alignment_bytes" in state:
                self.skip(self.uint(1))  # a padding-length byte, then that many bytes of padding
            nbytes = itemsize
            for d in shape:
                nbytes *= d
                if nbytes > len(self.data):
                    break  # checked below: never multiplied past the file's size
            self.skip(nbytes)

    def run(self) -> PickleScan:
        scan = self.scan
        try:
            while True:
                self.op_pos = self.pos
                if self.pos >= len(self.data):
                    raise ScanError("truncated: the stream ends before STOP", self.pos)
                op = self.data[self.pos]
                self.pos += 1
                scan.opcodes += 1
                handler = DISPATCH.get(op)
                if handler is None:
                    raise ScanError(f"invalid opcode 0x{op:02x}", self.op_pos)
                handler(self)
                if op == STOP:
                    break
        except ScanError as e:
            scan.error = str(e)
            scan.end = e.position if e.position >= 0 else self.op_pos
            return scan
        except (ValueError, OverflowError, struct.error, UnicodeDecodeError) as e:
            scan.error = f"{type(e).__name__}: {str(e)[:120]}"
            scan.end = self.op_pos
            return scan
        scan.end = self.pos
        return scan


def _stop(m: Machine) -> None:
    m.scan.root = m.pop()


def _proto(m: Machine) -> None:
    version = m.uint(1)
    if version > 5:
        raise ScanError(f"unsupported pickle protocol {version}", m.op_pos)
    m.scan.protocol = version


def _push(value: Any):
    return lambda m: m.stack.append(value)


def _text_int(m: Machine) -> None:
    raw = m.line()
    m.stack.append(False if raw == b"00" else True if raw == b"01" else int(raw, 0))


def _text_long(m: Machine) -> None:
    raw = m.line().rstrip(b"L")
    m.stack.append(int(raw, 0) if len(raw) <= LONG_INT_BYTES * 3 else Blob("long", m.op_pos + 1, len(raw)))


def _long(width: int):
    def load(m: Machine) -> None:
        n = int.from_bytes(m.take(width), "little", signed=width == 4)
        if n < 0:
            raise ScanError("LONG4 with a negative byte count", m.op_pos)
        if n > LONG_INT_BYTES:
            m.stack.append(Blob("long", m.skip(n), n))
        else:
            m.stack.append(int.from_bytes(m.take(n), "little", signed=True))

    return load


def _quoted_string(m: Machine) -> None:
    raw = m.line()
    if len(raw) < 2 or raw[0] != raw[-1] or raw[:1] not in (b"'", b'"'):
        raise ScanError("the STRING argument is not quoted", m.op_pos)
    m.stack.append(codecs.escape_decode(raw[1:-1])[0].decode("latin-1"))


def _sized(width: int, kind: str, signed: bool = False):
    def load(m: Machine) -> None:
        n = int.from_bytes(m.take(width), "little", signed=signed)
        value = m.take_leaf(n, "bytes" if kind == "latin1" else kind)
        m.stack.append(value.decode("latin-1") if kind == "latin1" and isinstance(value, bytes) else value)

    return load


def _text_unicode(m: Machine) -> None:
    m.stack.append(m.line().decode("raw-unicode-escape"))


def _line_global(m: Machine, opcode: str) -> Any:
    """GLOBAL's and INST's argument: module and name, a line each."""
    module = m.line().decode("utf-8", "backslashreplace")
    name = m.line().decode("utf-8", "backslashreplace")
    return m.import_(global_name(module, name), opcode)


def _stack_global(m: Machine) -> None:
    name = m.pop()
    module = m.pop()
    if not isinstance(name, str | Blob) or not isinstance(module, str | Blob):
        raise ScanError(f"STACK_GLOBAL on a {type(module).__name__} and a {type(name).__name__}, not strings", m.op_pos)
    m.stack.append(m.import_(global_name(str(module), str(name)), "STACK_GLOBAL"))


def _inst(m: Machine) -> None:
    cls = _line_global(m, "INST")
    m.stack.append(m.call(cls, tuple(m.pop_mark()), "INST"))


def _obj(m: Machine) -> None:
    items = m.pop_mark()
    if not items:
        raise ScanError("OBJ without a class", m.op_pos)
    m.stack.append(m.call(items[0], tuple(items[1:]), "OBJ"))


def _ext(width: int):
    def load(m: Machine) -> None:
        code = m.uint(width)
        # copyreg's extension registry maps a number to a global; what it names depends on the loading process
        m.stack.append(m.import_(f"copyreg.extension[{code}]", f"EXT{width}"))

    return load


def _call(opcode: str):
    def load(m: Machine) -> None:
        args = m.pop()
        m.stack.append(m.call(m.pop(), args, opcode))

    return load


def _newobj_ex(m: Machine) -> None:
    kwargs = m.pop()
    args = m.pop()
    m.stack.append(m.call(m.pop(), args, "NEWOBJ_EX", kwargs))


def _persistent_text(m: Machine) -> None:
    m.stack.append(storage_ref(m.line().decode("ascii", "backslashreplace")))


def _persistent(m: Machine) -> None:
    m.stack.append(storage_ref(m.pop()))


def _mark(m: Machine) -> None:
    m.marks.append(len(m.stack))


def _tuple(m: Machine) -> None:
    m.stack.append(m.container(tuple(m.pop_mark())))


def _tuple_n(n: int):
    def load(m: Machine) -> None:
        items = [m.pop() for _ in range(n)][::-1]
        m.stack.append(m.container(tuple(items)))

    return load


def _list(m: Machine) -> None:
    m.stack.append(m.container(m.pop_mark()))


def _dict(m: Machine) -> None:
    items = m.pop_mark()
    if len(items) % 2:
        raise ScanError("DICT with an odd number of items", m.op_pos)
    target = m.container({})
    for k, v in zip(items[::2], items[1::2], strict=True):
        _setitem(m, target, k, v)
    m.stack.append(target)


def _frozenset(m: Machine) -> None:
    m.stack.append(m.container(hashable_set(m.pop_mark(), frozenset)))


def _empty(kind: type):
    return lambda m: m.stack.append(m.container(kind()))


def _setitem(m: Machine, target: Any, key: Any, value: Any) -> None:
    if isinstance(target, Elided):
        return
    if isinstance(target, dict):
        try:
            target[key] = value
        except TypeError:
            if isinstance(key, Opaque):  # an instance: hashable by identity unless its class says otherwise
                target[ObjectKey(key)] = value
                return
            target[short_repr(key)] = value  # an unhashable key would break pickle.load; keep the entry visible
            raise ScanError(f"unhashable dict key {short_repr(key)}", m.op_pos) from None
    elif isinstance(target, Opaque):
        m.scan.events.append(
            Event(f"{target.qualname}.__setitem__", "SETITEM", m.op_pos, target.allowed, True, "", target.qualname)
        )
        target.items.append((key, value))
    else:
        raise ScanError(f"SETITEM on a {type(target).__name__}", m.op_pos)


def _setitem_op(m: Machine) -> None:
    value = m.pop()
    key = m.pop()
    _setitem(m, m.top(), key, value)


def _setitems(m: Machine) -> None:
    items = m.pop_mark()
    if len(items) % 2:
        raise ScanError("SETITEMS with an odd number of items", m.op_pos)
    target = m.top()
    for k, v in zip(items[::2], items[1::2], strict=True):
        _setitem(m, target, k, v)


def _append_items(m: Machine, items: list[Any], opcode: str) -> None:
    target = m.top()
    if isinstance(target, list):
        target.extend(items)
    elif isinstance(target, Opaque):
        m.scan.events.append(
            Event(f"{target.qualname}.extend", opcode, m.op_pos, target.allowed, True, "", target.qualname)
        )
        target.items.extend(items)
    elif not isinstance(target, Elided):
        raise ScanError(f"{opcode} to a {type(target).__name__}", m.op_pos)


def _additems(m: Machine) -> None:
    items = m.pop_mark()
    target = m.top()
    if isinstance(target, set):
        try:
            target.update(items)
        except TypeError:
            raise ScanError("ADDITEMS of an unhashable item", m.op_pos) from None
    elif isinstance(target, Opaque):
        m.scan.events.append(
            Event(f"{target.qualname}.add", "ADDITEMS", m.op_pos, target.allowed, True, "", target.qualname)
        )
    elif not isinstance(target, Elided):
        raise ScanError(f"ADDITEMS to a {type(target).__name__}", m.op_pos)


def _pop_mark_discard(m: Machine) -> None:
    m.pop_mark()


def _text_put(m: Machine) -> None:
    index = int(m.line())
    if index < 0:
        raise ScanError("negative PUT index", m.op_pos)
    m.put(index)


def _frame(m: Machine) -> None:
    m.take(8)  # a frame's length is a read-ahead hint; the opcodes inside are read like any others


def _out_of_band(m: Machine) -> None:
    raise ScanError("out-of-band buffer: pickle.load needs buffers= to continue", m.op_pos)


DISPATCH = {
    STOP: _stop,
    0x80: _proto,
    0x95: _frame,
    ord("N"): _push(None),
    0x88: _push(True),
    0x89: _push(False),
    ord("I"): _text_int,
    ord("J"): lambda m: m.stack.append(int.from_bytes(m.take(4), "little", signed=True)),
    ord("K"): lambda m: m.stack.append(m.uint(1)),
    ord("M"): lambda m: m.stack.append(m.uint(2)),
    ord("L"): _text_long,
    0x8A: _long(1),
    0x8B: _long(4),
    ord("F"): lambda m: m.stack.append(float(m.line())),
    ord("G"): lambda m: m.stack.append(struct.unpack(">d", m.take(8))[0]),
    ord("S"): _quoted_string,
    ord("T"): _sized(4, "latin1", signed=True),
    ord("U"): _sized(1, "latin1"),
    ord("B"): _sized(4, "bytes"),
    ord("C"): _sized(1, "bytes"),
    0x8E: _sized(8, "bytes"),
    0x96: _sized(8, "bytes"),  # BYTEARRAY8: a leaf like bytes
    0x97: _out_of_band,
    0x98: _out_of_band,
    ord("V"): _text_unicode,
    ord("X"): _sized(4, "str"),
    0x8C: _sized(1, "str"),
    0x8D: _sized(8, "str"),
    ord(")"): lambda m: m.stack.append(()),
    ord("t"): _tuple,
    0x85: _tuple_n(1),
    0x86: _tuple_n(2),
    0x87: _tuple_n(3),
    ord("]"): _empty(list),
    ord("l"): _list,
    ord("}"): _empty(dict),
    ord("d"): _dict,
    0x8F: _empty(set),
    0x91: _frozenset,
    ord("c"): lambda m: m.stack.append(_line_global(m, "GLOBAL")),
    0x93: _stack_global,
    ord("i"): _inst,
    ord("o"): _obj,
    0x82: _ext(1),
    0x83: _ext(2),
    0x84: _ext(4),
    ord("R"): _call("REDUCE"),
    0x81: _call("NEWOBJ"),
    0x92: _newobj_ex,
    ord("b"): lambda m: m.build(),
    ord("P"): _persistent_text,
    ord("Q"): _persistent,
    ord("("): _mark,
    ord("0"): lambda m: m.pop(),
    ord("1"): _pop_mark_discard,
    ord("2"): lambda m: m.stack.append(m.top()),
    ord("g"): lambda m: m.get(int(m.line())),
    ord("h"): lambda m: m.get(m.uint(1)),
    ord("j"): lambda m: m.get(m.uint(4)),
    ord("p"): _text_put,
    ord("q"): lambda m: m.put(m.uint(1)),
    ord("r"): lambda m: m.put(m.uint(4)),
    0x94: lambda m: m.put(len(m.memo)),
    ord("a"): lambda m: _append_items(m, [m.pop()], "APPEND"),
    ord("e"): lambda m: _append_items(m, m.pop_mark(), "APPENDS"),
    ord("s"): _setitem_op,
    ord("u"): _setitems,
    0x90: _additems,
}


def scan_pickle(
    data: bytes, start: int = 0, allowed: frozenset[str] = TORCH_WEIGHTS_ONLY, joblib: bool = False
) -> PickleScan:
    """Simulate one pickle starting at `start`; a broken stream is reported in `.error`, never raised."""
    return Machine(data, start, allowed, joblib).run()
