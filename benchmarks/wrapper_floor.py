"""What standing in for torch's three step calls costs in the loop, by how it is done: the floor
under dlscope's always-on cost per step (issue 23 item 1: ≤ 10 µs), measured on calibrate's tiny
step (a Linear forward, `backward()`, an optimizer's `step`), in interleaved bursts of the thread's
CPU time (calibrate's own method), the median of the pairs' differences against the bare step:

  python pass    three Python frames that only call through (a module class's `__call__`,
                 `torch.autograd.backward`, the optimizer class's `step`)
  python clock   the same frames, each with two clock reads and a sum (what a timed call needs)
  C pass         three callables of a C type (vectorcall) that only call through
  C clock        the same, each with two clock_gettime reads and a sum in a C array
  dlscope        the hooks as they are (calibrate.per_step_us: frames, step machine, row, live file)

The C type is compiled here with the system's C compiler (cc) against this Python's headers, into
a temporary directory: nothing of it is dlscope's.

    .venv/bin/python benchmarks/wrapper_floor.py [--rounds 200]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import torch

from dlscope.injob.calibrate import _burst, _Optimizer, per_step_us
from dlscope.injob.hooks import TorchHooks

C_SOURCE = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <time.h>
static double totals[3];
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}
typedef struct { PyObject_HEAD PyObject *fn; int part; vectorcallfunc vc; } Timed;
static PyObject *timed_call(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kw) {
    Timed *t = (Timed *)self;
    if (t->part < 0) return PyObject_Vectorcall(t->fn, args, nargsf, kw);
    double start = now_s();
    PyObject *result = PyObject_Vectorcall(t->fn, args, nargsf, kw);
    totals[t->part] += now_s() - start;
    return result;
}
static PyObject *timed_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    PyObject *fn; int part;
    if (!PyArg_ParseTuple(args, "Oi", &fn, &part)) return NULL;
    Timed *t = (Timed *)type->tp_alloc(type, 0);
    Py_INCREF(fn); t->fn = fn; t->part = part; t->vc = timed_call;
    return (PyObject *)t;
}
static PyObject *timed_get(PyObject *self, PyObject *obj, PyObject *type) {
    if (obj == NULL || obj == Py_None) { Py_INCREF(self); return self; }
    return PyMethod_New(self, obj);
}
static PyTypeObject TimedType = {
    PyVarObject_HEAD_INIT(NULL, 0) .tp_name = "floor.Timed", .tp_basicsize = sizeof(Timed),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_new = timed_new, .tp_vectorcall_offset = offsetof(Timed, vc), .tp_call = PyVectorcall_Call,
    .tp_descr_get = timed_get,
};
static PyObject *seconds(PyObject *self, PyObject *unused) {
    return Py_BuildValue("ddd", totals[0], totals[1], totals[2]);
}
static PyMethodDef methods[] = {{"seconds", seconds, METH_NOARGS, ""}, {0}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "floor", 0, -1, methods};
PyMODINIT_FUNC PyInit_floor(void) {
    if (PyType_Ready(&TimedType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    Py_INCREF(&TimedType);
    PyModule_AddObject(m, "Timed", (PyObject *)&TimedType);
    return m;
}
"""


def compiled(directory: Path):  # the module
    source = directory / "floor.c"
    source.write_text(C_SOURCE)
    target = directory / f"floor{sysconfig.get_config_var('EXT_SUFFIX')}"
    include = sysconfig.get_paths()["include"]
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", f"-I{include}", str(source), "-o", str(target)], check=True)
    spec = importlib.util.spec_from_file_location("floor", target)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def python_frames(call, backward, step, clock):  # (module call, backward, step) standing in
    if clock is None:

        def timed_call(m, *a, **k):
            return call(m, *a, **k)

        def timed_backward(
            tensors, grad_tensors=None, retain_graph=None, create_graph=False, grad_variables=None, inputs=None
        ):
            return backward(tensors, grad_tensors, retain_graph, create_graph, grad_variables, inputs)

        def timed_step(*a, **k):
            return step(*a, **k)

        return timed_call, timed_backward, timed_step
    totals = [0.0, 0.0, 0.0]

    def clocked_call(m, *a, **k):
        start = clock()
        try:
            return call(m, *a, **k)
        finally:
            totals[0] += clock() - start

    def clocked_backward(
        tensors, grad_tensors=None, retain_graph=None, create_graph=False, grad_variables=None, inputs=None
    ):
        start = clock()
        try:
            return backward(tensors, grad_tensors, retain_graph, create_graph, grad_variables, inputs)
        finally:
            totals[1] += clock() - start

    def clocked_step(*a, **k):
        start = clock()
        try:
            return step(*a, **k)
        finally:
            totals[2] += clock() - start

    return clocked_call, clocked_backward, clocked_step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--calibrations", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, optimizer, x = torch.nn.Linear(4, 2), _Optimizer(), torch.zeros(2, 4)

    def step() -> None:  # calibrate's tiny step
        model.zero_grad()
        model(x).sum().backward()
        optimizer.step()

    bare = (torch.nn.Module.__call__, torch.autograd.backward, _Optimizer.step)
    with tempfile.TemporaryDirectory() as tmp:
        floor = compiled(Path(tmp))
        modes = {
            "bare": bare,
            "python pass": python_frames(*bare, None),
            "python clock": python_frames(*bare, time.time),
            "C pass": tuple(floor.Timed(f, -1) for f in bare),
            "C clock": tuple(floor.Timed(f, part) for part, f in enumerate(bare)),
        }
        spent: dict[str, list[float]] = {name: [] for name in modes}

        def put(values: tuple) -> None:
            torch.nn.Linear.__call__, torch.autograd.backward, _Optimizer.step = values

        step()
        names = list(modes)
        for r in range(args.rounds):
            k = r % len(names)  # each mode in each place of the order equally often
            for name in names[k:] + names[:k]:
                put(modes[name])
                step()
                spent[name].append(_burst(step))
        put(bare)
        del torch.nn.Linear.__call__  # Linear inherits Module's again
    print(f"µs a tiny step over the bare one (median of {args.rounds} paired bursts, thread CPU time)")
    print(f"  bare step: {statistics.median(spent['bare']):.1f} µs")
    for name in names[1:]:
        cost = statistics.median(a - b for a, b in zip(spent[name], spent["bare"], strict=True))
        print(f"  {name:13} {cost:6.2f}")
    calibrated = [per_step_us(TorchHooks, torch)[0] for _ in range(args.calibrations)]
    print(
        f"  {'dlscope':13} {statistics.median(calibrated):6.2f}  (calibrate.per_step_us, median of {len(calibrated)})"
    )
    print(f"machine: {sys.platform}, Python {sys.version.split()[0]}, torch {torch.__version__}")


if __name__ == "__main__":
    main()
