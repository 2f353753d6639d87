/* The step machine's common step in C: dlscope's always-on cost per training step.

   A step of the loop most jobs run once they are going — one training forward (or none: a loss
   computed without a module), one backward(), one optimizer step, nothing else between two step
   ends — reaches StepMachine
   (stepmachine.py) as six events. In Python their bookkeeping, the row and the live file cost
   ~20,000 instructions a step: more than half of dlscope's cost on a tiny step. Here they are
   taken in C: while the machine stands as a step end leaves it, each event is logged (its time);
   at the optimizer step's end the step is finished as StepMachine.end_step would finish it —
   the same arithmetic, in the same order, on the same objects (the machine's totals and
   counters, the step's start), the same row into the record file's mapped window, the same
   live-file call.

   The state the common step touches lives here, in StepCore and StepPartsCore: the bases of
   StepMachine and StepParts, whose fields are these structs' (Python reads and writes them as
   attributes, specialised by the interpreter as slots are); C reads them with no attribute
   lookup, which costs more in C (~250 instructions) than the specialised bytecode does.

   Anything else — another event, an event out of that order, a step end with work due (memory,
   the profiler), a window full, another thread — settles first: the logged events are replayed
   through StepMachine's own methods, in order, with their own times, and the event goes there
   too. So the Python machine stays the one definition of what a step is: this file only skips
   its work where the result is known to be the same (tests/test_fastpath.py plays random event
   sequences through both and compares records, rows and state).

   Python calls into the machine other than the six events settle first (`unsettled` says a
   step is part-logged here). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

enum { EV_FB, EV_FE, EV_BB, EV_BE, EV_OB, EV_OE, EV_N };
static const char *EVENT_NAMES[EV_N] = {"forward_begin", "forward_end", "backward_begin",
                                        "backward_end", "optimizer_begin", "optimizer_end"};

/* the row of records.STEP_ROW, little-endian, packed (60 bytes) */
#define ROW_FORMAT "<IIdffffffIIIHHBBBB"
#define ROW_BYTES 60
#define NONE_U4 0xFFFFFFFFu

/* StepMachine's fields kept here (each a Python object, as Python sets it) */
enum {
    F_PART, F_SINCE, F_IDLE, F_UNWORKED, F_ATTENTION, F_IN_EVAL, F_OPTIMIZER_STEPPED, F_OPTIMIZER_DEPTH,
    F_OUTER, F_LIVE, F_COUNTS, F_TOTALS, F_FORWARDS, F_BACKWARDS, F_BATCHES, F_QUIET_FORWARDS, F_NEXT_WORK,
    F_NEXT_PROFILED, F_EVAL_MODE_CHECK, F_ON_STEP, F_SINK, F_THREAD_ID, F_STEP_THREAD, F_UNSETTLED, F_N
};
static const char *FIELD_NAMES[F_N] = {
    "part", "since", "idle", "unworked", "attention", "in_eval", "optimizer_stepped", "optimizer_depth",
    "outer", "live", "counts", "totals", "forwards", "backwards", "batches", "quiet_forwards", "next_work",
    "next_profiled", "eval_mode_check", "on_step", "sink", "thread_id", "step_thread", "unsettled"};

/* StepParts' fields */
enum { P_START, P_TOTALS, P_BACKWARDS, P_FORWARDS, P_BATCHES, P_FIRST_WORK, P_FRESH, P_N };
static const char *PART_NAMES[P_N] = {"start", "totals", "backwards", "forwards", "batches", "first_work", "fresh"};

typedef struct {
    PyObject_HEAD
    PyObject *f[P_N];
} PartsCore;

typedef struct {
    PyObject_HEAD
    PyObject *f[F_N];
    PyObject *methods[EV_N];    /* the class's six event functions (unbound): the replay's */
    PyObject *not_profiled;     /* stepmachine.NOT_PROFILED */
    PyObject *native_tid;       /* stepmachine.native_thread_id: the thread id cached per thread here */
    int direct_rows;            /* the sink's rows may be packed into its mapped window here */
    int logged;                 /* the event logged next (0: none logged yet) */
    int first;                  /* the step's first event logged: its forward, or its backward (none) */
    double times[EV_N];
    unsigned long thread;       /* the thread that logged them */
    uint64_t tid_thread;        /* the thread state whose thread's id is `tid` (0: none cached) */
    long tid;
    long taken;                 /* steps finished here */
    PyObject *live_func;        /* hang.live.LiveStatus.step_ended, once an on_step bound to it is seen */
    Py_ssize_t live_at;         /* where it packs (count int64, now float64) into its `map` */
} Core;

static PyTypeObject PartsCoreType;
static PyObject *S_PACKS_STEP_AT, *S_MAP;
static PyObject *S_OPTIMIZER, *S_GAP, *S_STEPS_MAP, *S_STEPS_POS, *S_STEPS_ROOM, *S_WRITE_STEP;

/* ---- helpers -------------------------------------------------------------------------------- */

static int set_field(PyObject **slot, PyObject *value) { /* steals `value` */
    if (value == NULL) return -1;
    Py_XSETREF(*slot, value);
    return 0;
}

static int set_long(PyObject **slot, long v) { return set_field(slot, PyLong_FromLong(v)); }
static int set_double(PyObject **slot, double v) { return set_field(slot, PyFloat_FromDouble(v)); }

static int get_long(PyObject *v, long *out) { /* 1: an int that fits; 0: not; -1: error */
    if (v == NULL || !PyLong_CheckExact(v)) return 0;
    *out = PyLong_AsLong(v);
    if (*out == -1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return -1;
        PyErr_Clear();
        return 0;
    }
    return 1;
}

static PyObject *call_event(Core *self, int ev, double now, int with_true) {
    PyObject *t = PyFloat_FromDouble(now);
    if (t == NULL) return NULL;
    PyObject *args[3] = {(PyObject *)self, t, Py_True};
    PyObject *r = PyObject_Vectorcall(self->methods[ev], args, with_true ? 3 : 2, NULL);
    Py_DECREF(t);
    return r;
}

/* the logged events replayed through the Python machine, in order; nothing logged after */
static int settle(Core *self) {
    int n = self->logged;
    if (!n) return 0;
    self->logged = 0;
    if (set_field(&self->f[F_UNSETTLED], Py_NewRef(Py_False)) < 0) return -1;
    if (n > EV_OB && set_long(&self->f[F_OPTIMIZER_DEPTH], 0) < 0) return -1; /* set at its begin, below */
    for (int ev = self->first; ev < n; ev++) {
        PyObject *r = call_event(self, ev, self->times[ev], ev == EV_FB);
        if (r == NULL) return -1;
        Py_DECREF(r);
    }
    return 0;
}

/* the event taken by the Python machine (after what was logged) */
static PyObject *pass_on(Core *self, int ev, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    if (settle(self) < 0) return NULL;
    PyObject *stack[4];
    Py_ssize_t n = nargs + (kwnames ? PyTuple_GET_SIZE(kwnames) : 0);
    if (n > 3) {
        PyErr_SetString(PyExc_TypeError, "too many arguments");
        return NULL;
    }
    stack[0] = (PyObject *)self;
    for (Py_ssize_t i = 0; i < n; i++) stack[i + 1] = args[i];
    return PyObject_Vectorcall(self->methods[ev], stack, nargs + 1, kwnames);
}

/* Does the machine stand as a step end leaves it, so that a training forward starts a step's
   work here? (StepMachine._open's "most steps" branch, with one live step, the optimizer's.) */
static int at_step_end(Core *self) {
    PyObject **f = self->f;
    if (f[F_IDLE] != Py_True || f[F_UNWORKED] != Py_True || f[F_ATTENTION] != Py_True ||
        f[F_OPTIMIZER_STEPPED] != Py_True || f[F_IN_EVAL] != Py_False || f[F_PART] != Py_None)
        return 0;
    PyObject *outer = f[F_OUTER], *depth = f[F_OPTIMIZER_DEPTH], *live = f[F_LIVE];
    if (!PyList_CheckExact(outer) || PyList_GET_SIZE(outer) != 0) return 0;
    long d;
    if (get_long(depth, &d) != 1 || d != 0) return 0;
    return PyList_CheckExact(live) && PyList_GET_SIZE(live) == 1 &&
           PyObject_TypeCheck(PyList_GET_ITEM(live, 0), &PartsCoreType);
}

/* ---- the events ------------------------------------------------------------------------------ */

/* (now, flag): the event's time (a float), and its flag (`training`, `ends_step`) if given, by
   position or by name; 0: any other call (the Python machine takes it, and says what is wrong) */
static int parse_event(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, const char *flag_name,
                       double *now, PyObject **flag) {
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    *flag = NULL;
    if (nargs < 1 || nargs + nkw > (flag_name ? 2 : 1) || !PyFloat_CheckExact(args[0])) return 0;
    if (nkw && PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), flag_name) != 0) return 0;
    *now = PyFloat_AS_DOUBLE(args[0]);
    if (nargs + nkw == 2) *flag = args[1];
    return 1;
}

/* the step's first event, logged: a training forward, or a backward() with no forward before it
   (a loss computed without a module: a hand-written model, a functional update) */
static PyObject *first_event(Core *self, int ev, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                             const char *flag_name) {
    double now;
    PyObject *flag;
    if (self->logged || !parse_event(args, nargs, kwnames, flag_name, &now, &flag) ||
        (flag_name != NULL && flag != Py_True) || !at_step_end(self))
        return pass_on(self, ev, args, nargs, kwnames);
    if (set_field(&self->f[F_UNSETTLED], Py_NewRef(Py_True)) < 0) return NULL;
    self->times[ev] = now;
    self->thread = PyThread_get_thread_ident();
    self->first = ev;
    self->logged = ev + 1;
    Py_RETURN_NONE;
}

static PyObject *fast_forward_begin(Core *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    return first_event(self, EV_FB, args, nargs, kwnames, "training");
}

/* an event logged when it comes next, in the step's thread, with a float time (and no more) */
static PyObject *next_event(Core *self, int ev, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                            const char *flag_name) {
    double now;
    PyObject *flag;
    if (self->logged != ev || !parse_event(args, nargs, kwnames, flag_name, &now, &flag) ||
        (flag != NULL && flag != Py_True) || self->thread != PyThread_get_thread_ident())
        return pass_on(self, ev, args, nargs, kwnames);
    /* what the torch layer reads meanwhile (a GradScaler's nested step) */
    if (ev == EV_OB && set_long(&self->f[F_OPTIMIZER_DEPTH], 1) < 0) return NULL;
    self->times[ev] = now;
    self->logged = ev + 1;
    Py_RETURN_NONE;
}

static PyObject *fast_forward_end(Core *self, PyObject *const *a, Py_ssize_t n, PyObject *k) {
    return next_event(self, EV_FE, a, n, k, NULL);
}
static PyObject *fast_backward_begin(Core *self, PyObject *const *a, Py_ssize_t n, PyObject *k) {
    if (!self->logged) return first_event(self, EV_BB, a, n, k, NULL);
    return next_event(self, EV_BB, a, n, k, NULL);
}
static PyObject *fast_backward_end(Core *self, PyObject *const *a, Py_ssize_t n, PyObject *k) {
    return next_event(self, EV_BE, a, n, k, "ends_step");
}
static PyObject *fast_optimizer_begin(Core *self, PyObject *const *a, Py_ssize_t n, PyObject *k) {
    return next_event(self, EV_OB, a, n, k, NULL);
}

/* struct's "f": a double that overflows a float is an error there: the Python path raises it */
static int fits_f32(double v) { return !(isinf((float)v) && !isinf(v)); }

static void put_u4(char *p, unsigned long v) { uint32_t x = (uint32_t)v; memcpy(p, &x, 4); }
static void put_u2(char *p, unsigned long v) { uint16_t x = (uint16_t)v; memcpy(p, &x, 2); }
static void put_f4(char *p, double v) { float x = (float)v; memcpy(p, &x, 4); }
static void put_f8(char *p, double v) { memcpy(p, &v, 8); }

static long sink_long(PyObject *sink, PyObject *name, int *ok) {
    PyObject *v = PyObject_GetAttr(sink, name);
    long r = 0;
    *ok = v == NULL ? -1 : get_long(v, &r);
    Py_XDECREF(v);
    return r;
}

/* The row packed into the sink's mapped window (records.RecordFile.write_step's pack_into, on a
   little-endian machine); 0: it does not fit the window (the Python path moves it on). */
static int pack_row(PyObject *sink, long index, long tid, double start, double end, double data, double forward,
                    double backward, double optimizer, long backwards, long forwards) {
    int ok;
    long pos = sink_long(sink, S_STEPS_POS, &ok);
    if (ok <= 0) return ok;
    long room = sink_long(sink, S_STEPS_ROOM, &ok);
    if (ok <= 0) return ok;
    if (pos > room || pos < 0) return 0;
    PyObject *map = PyObject_GetAttr(sink, S_STEPS_MAP);
    if (map == NULL) return -1;
    if (map == Py_None) {
        Py_DECREF(map);
        return 0;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(map, &view, PyBUF_WRITABLE) < 0) {
        Py_DECREF(map);
        return -1;
    }
    int r = 0;
    if (pos + ROW_BYTES <= view.len) {
        char *p = (char *)view.buf + pos;
        put_u4(p, (unsigned long)index);
        put_u4(p + 4, (unsigned long)tid);
        put_f8(p + 8, start);
        put_f4(p + 16, end - start);
        put_f4(p + 20, data);
        put_f4(p + 24, forward);
        put_f4(p + 28, backward);
        put_f4(p + 32, optimizer);
        put_f4(p + 36, 0.0);     /* profiler_seconds: no work after the step */
        put_u4(p + 40, NONE_U4); /* peak_rss_kib: not read at this step */
        put_u4(p + 44, NONE_U4); /* peak_cuda_kib */
        put_u4(p + 48, NONE_U4); /* profiler_step */
        put_u2(p + 52, backwards < 0xFFFF ? (unsigned long)backwards : 0xFFFF);
        put_u2(p + 54, forwards < 0xFFFF ? (unsigned long)forwards : 0xFFFF);
        memset(p + 56, 0, 4); /* src optimizer, data_source gap, profiled none, flags */
        r = 1;
    }
    PyBuffer_Release(&view);
    Py_DECREF(map);
    if (r) {
        PyObject *next = PyLong_FromLong(pos + ROW_BYTES);
        if (next == NULL) return -1;
        int e = PyObject_SetAttr(sink, S_STEPS_POS, next);
        Py_DECREF(next);
        if (e < 0) return -1;
    }
    return r;
}

/* sink.write_step(...) with STEP_ARGS's values, as the Python machine calls it */
static int write_step_call(PyObject *sink, long index, PyObject *tid, double start, double end, double data,
                           double forward, double backward, double optimizer, long backwards, long forwards) {
    PyObject *write = PyObject_GetAttr(sink, S_WRITE_STEP);
    if (write == NULL) return -1;
    PyObject *v[17] = {
        PyLong_FromLong(index), S_OPTIMIZER, PyFloat_FromDouble(start), PyFloat_FromDouble(end),
        PyFloat_FromDouble(data), S_GAP, PyFloat_FromDouble(forward), PyFloat_FromDouble(backward),
        PyFloat_FromDouble(optimizer), PyLong_FromLong(backwards), PyLong_FromLong(forwards),
        Py_None, Py_None, Py_None, Py_None, PyFloat_FromDouble(0.0), tid};
    static const int owned[17] = {1, 0, 1, 1, 1, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 1, 0};
    PyObject *r = NULL;
    int missing = 0;
    for (int i = 0; i < 17; i++) missing |= v[i] == NULL;
    if (!missing) r = PyObject_Vectorcall(write, v, 17, NULL);
    for (int i = 0; i < 17; i++)
        if (owned[i]) Py_XDECREF(v[i]);
    Py_DECREF(write);
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 0;
}

/* four floats of a list of four */
static int four_floats(PyObject *list, double out[4]) {
    if (list == NULL || !PyList_CheckExact(list) || PyList_GET_SIZE(list) != 4) return 0;
    for (int i = 0; i < 4; i++) {
        PyObject *x = PyList_GET_ITEM(list, i);
        if (!PyFloat_CheckExact(x)) return 0;
        out[i] = PyFloat_AS_DOUBLE(x);
    }
    return 1;
}

/* `totals[i] += spent if spent > 0 else 0.0`, as the Python machine adds */
static int add_total(PyObject *totals, Py_ssize_t i, double *total, double spent) {
    *total += spent > 0.0 ? spent : 0.0;
    PyObject *f = PyFloat_FromDouble(*total);
    if (f == NULL) return -1;
    PyList_SetItem(totals, i, f); /* steals f */
    return 0;
}

/* the calling thread's id, as the machine's thread_id gives it: cached per thread state (whose
   ids are never reused, as pthread idents are) when it is stepmachine.native_thread_id, dropped
   at reset (a forked child's thread keeps its thread state); a test's fake is asked each time */
static PyObject *thread_id(Core *self) {
    PyObject *call = self->f[F_THREAD_ID];
    if (call == NULL) {
        PyErr_SetString(PyExc_AttributeError, "thread_id");
        return NULL;
    }
    if (call != self->native_tid) return PyObject_CallNoArgs(call);
    uint64_t state = PyThreadState_Get()->id + 1; /* (+1: 0 is "none cached") */
    if (self->tid_thread != state) {
        PyObject *t = PyObject_CallNoArgs(call);
        long v;
        int ok = get_long(t, &v);
        if (ok != 1) { /* not an int: the Python machine's business */
            if (ok < 0) Py_CLEAR(t);
            return t;
        }
        Py_DECREF(t);
        self->tid_thread = state;
        self->tid = v;
    }
    return PyLong_FromLong(self->tid);
}

/* on_step(count, now); for a live status file's step_ended (a method marked `packs_step_at`),
   its pack_into done here: the same 16 bytes at the same place of its map (anything else, or a
   map that cannot be written, is the Python call, which says what is wrong) */
static int step_ended(Core *self, PyObject *on_step, long count, double now) {
    if (on_step == Py_None) return 0;
    if (PyMethod_Check(on_step)) {
        PyObject *func = PyMethod_GET_FUNCTION(on_step);
        if (self->live_func == NULL) {
            PyObject *at = PyObject_GetAttr(func, S_PACKS_STEP_AT);
            if (at == NULL) {
                PyErr_Clear();
            } else {
                Py_ssize_t v = PyLong_Check(at) ? PyLong_AsSsize_t(at) : -1;
                Py_DECREF(at);
                if (v >= 0) {
                    self->live_func = Py_NewRef(func);
                    self->live_at = v;
                }
                PyErr_Clear();
            }
        }
        if (func == self->live_func) {
            PyObject *map = PyObject_GetAttr(PyMethod_GET_SELF(on_step), S_MAP);
            Py_buffer view;
            int done = 0;
            if (map != NULL && PyObject_GetBuffer(map, &view, PyBUF_WRITABLE) == 0) {
                if (self->live_at + 16 <= view.len) {
                    int64_t c = count;
                    memcpy((char *)view.buf + self->live_at, &c, 8);
                    memcpy((char *)view.buf + self->live_at + 8, &now, 8);
                    done = 1;
                }
                PyBuffer_Release(&view);
            }
            Py_XDECREF(map);
            PyErr_Clear();
            if (done) return 0;
        }
    }
    PyObject *n = PyLong_FromLong(count), *when = PyFloat_FromDouble(now);
    PyObject *res = NULL;
    if (n != NULL && when != NULL) {
        PyObject *args[2] = {n, when};
        res = PyObject_Vectorcall(on_step, args, 2, NULL);
    }
    Py_XDECREF(n);
    Py_XDECREF(when);
    if (res == NULL) return -1;
    Py_DECREF(res);
    return 0;
}

/* The step's end as StepMachine.optimizer_end and end_step make it in the common case. Returns
   0 when it is not that case, having changed nothing (the caller settles), 1 when done, -1 on an
   error. Every condition is checked before anything is changed. */
static int finish_step(Core *self, double now) {
    PyObject **f = self->f;
    PyObject *tid_obj = NULL;
    int r = 0;
    long index, batches, forwards, backwards, step_batches, step_forwards, step_backwards, tid;
    double next_work, start, tot[4], step_tot[4];

    if (f[F_NEXT_WORK] == NULL || !PyFloat_CheckExact(f[F_NEXT_WORK])) return 0;
    next_work = PyFloat_AS_DOUBLE(f[F_NEXT_WORK]);
    if (now >= next_work) return 0; /* memory or the profiler to look at: end_step's own work */
    if (f[F_EVAL_MODE_CHECK] != Py_None || f[F_NEXT_PROFILED] != self->not_profiled) return 0;
    if (f[F_COUNTS] == NULL || !PyDict_CheckExact(f[F_COUNTS])) return 0;
    PyObject *index_obj = PyDict_GetItemWithError(f[F_COUNTS], S_OPTIMIZER); /* borrowed */
    if (index_obj == NULL) return PyErr_Occurred() ? -1 : 0;
    if ((r = get_long(index_obj, &index)) != 1) return r;
    if (index < 1 || index >= (long)NONE_U4) return 0; /* the first step ends a phase: Python's */
    if (f[F_LIVE] == NULL || !PyList_CheckExact(f[F_LIVE]) || PyList_GET_SIZE(f[F_LIVE]) != 1) return 0;
    PyObject *step_obj = PyList_GET_ITEM(f[F_LIVE], 0);
    if (!PyObject_TypeCheck(step_obj, &PartsCoreType)) return 0;
    PyObject **p = ((PartsCore *)step_obj)->f;
    if ((r = get_long(f[F_BATCHES], &batches)) != 1 || (r = get_long(p[P_BATCHES], &step_batches)) != 1 ||
        (r = get_long(f[F_FORWARDS], &forwards)) != 1 || (r = get_long(f[F_BACKWARDS], &backwards)) != 1 ||
        (r = get_long(p[P_FORWARDS], &step_forwards)) != 1 || (r = get_long(p[P_BACKWARDS], &step_backwards)) != 1)
        return r;
    if (batches != step_batches) return 0; /* a batch drawn: the step's data is the loader's */
    if (p[P_START] == NULL || !PyFloat_CheckExact(p[P_START])) return 0;
    start = PyFloat_AS_DOUBLE(p[P_START]);
    PyObject *first_work = p[P_FIRST_WORK];
    if (first_work == NULL || (first_work != Py_None && !PyFloat_CheckExact(first_work))) return 0;
    if (!four_floats(f[F_TOTALS], tot) || !four_floats(p[P_TOTALS], step_tot)) return 0;
    if (f[F_SINK] == NULL || f[F_ON_STEP] == NULL || f[F_STEP_THREAD] == NULL) return 0;
    if ((tid_obj = thread_id(self)) == NULL) return -1;
    r = get_long(tid_obj, &tid);
    if (r == 1) {
        int same = PyObject_RichCompareBool(tid_obj, f[F_STEP_THREAD], Py_EQ);
        r = same < 0 ? -1 : same; /* another thread ends this step: Python's */
    }
    if (r != 1) {
        Py_DECREF(tid_obj);
        return r;
    }
    r = -1;
    PyObject *sink = Py_NewRef(f[F_SINK]), *on_step = Py_NewRef(f[F_ON_STEP]);
    Py_INCREF(step_obj);
    PyObject *totals = f[F_TOTALS];
    double *times = self->times;

    /* the step is ours: the Python machine's changes, in its order. forward_begin: forwards + 1
       (its first work: the gap below); forward_end; backward_end (no forward with no grad since
       counts towards an evaluation; `row` is 0 already: a batch drawn ends the standing above) */
    if (self->first == EV_FB) {
        forwards += 1;
        if (add_total(totals, 1, &tot[1], times[EV_FE] - times[EV_FB]) < 0) goto out;
    }
    backwards += 1;
    if (add_total(totals, 2, &tot[2], times[EV_BE] - times[EV_BB]) < 0 || set_long(&f[F_FORWARDS], forwards) < 0 ||
        set_long(&f[F_BACKWARDS], backwards) < 0 || set_long(&f[F_QUIET_FORWARDS], 0) < 0)
        goto out;
    /* optimizer_end (the part it closes leaves `since` where the optimizer began) */
    if (set_long(&f[F_OPTIMIZER_DEPTH], 0) < 0 || set_double(&f[F_SINCE], times[EV_OB]) < 0 ||
        add_total(totals, 3, &tot[3], now - times[EV_OB]) < 0)
        goto out;
    /* end_step */
    {
        PyObject *next = PyLong_FromLong(index + 1);
        if (next == NULL) goto out;
        int e = PyDict_SetItem(f[F_COUNTS], S_OPTIMIZER, next);
        Py_DECREF(next);
        if (e < 0 || step_ended(self, on_step, index + 1, now) < 0) goto out;
    }
    double gap = (first_work == Py_None ? times[self->first] : PyFloat_AS_DOUBLE(first_work)) - start;
    double data = gap > 0.0 ? gap : 0.0;
    double forward = tot[1] - step_tot[1], backward = tot[2] - step_tot[2], optimizer = tot[3] - step_tot[3];
    long row_backwards = backwards - step_backwards, row_forwards = forwards - step_forwards;
    int packed = 0;
    if (self->direct_rows && tid >= 0 && tid < (long)NONE_U4 && row_backwards >= 0 && row_forwards >= 0 &&
        fits_f32(now - start) && fits_f32(data) && fits_f32(forward) && fits_f32(backward) && fits_f32(optimizer)) {
        packed = pack_row(sink, index, tid, start, now, data, forward, backward, optimizer, row_backwards,
                          row_forwards);
        if (packed < 0) goto out;
    }
    if (!packed && write_step_call(sink, index, tid_obj, start, now, data, forward, backward, optimizer,
                                   row_backwards, row_forwards) < 0)
        goto out;
    /* the next step, in the same object */
    p = ((PartsCore *)step_obj)->f;
    if (set_double(&p[P_START], now) < 0 || set_field(&p[P_TOTALS], PyList_GetSlice(totals, 0, 4)) < 0 ||
        set_long(&p[P_BACKWARDS], backwards) < 0 || set_long(&p[P_FORWARDS], forwards) < 0 ||
        set_field(&p[P_FIRST_WORK], Py_NewRef(Py_None)) < 0 || set_field(&p[P_FRESH], Py_NewRef(Py_True)) < 0)
        goto out;
    r = 1;
out:
    Py_DECREF(tid_obj);
    Py_DECREF(sink);
    Py_DECREF(on_step);
    Py_DECREF(step_obj);
    return r;
}

static PyObject *fast_optimizer_end(Core *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    double now;
    PyObject *flag;
    if (self->logged != EV_OE || !parse_event(args, nargs, kwnames, NULL, &now, &flag) ||
        self->thread != PyThread_get_thread_ident())
        return pass_on(self, EV_OE, args, nargs, kwnames);
    int done = finish_step(self, now);
    if (done < 0) return NULL;
    if (!done) return pass_on(self, EV_OE, args, nargs, kwnames);
    self->logged = 0;
    self->taken += 1;
    if (set_field(&self->f[F_UNSETTLED], Py_NewRef(Py_False)) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *settle_method(Core *self, PyObject *unused) {
    if (settle(self) < 0) return NULL;
    Py_RETURN_NONE;
}

/* the logged events dropped, the cached thread id too (the machine was reset: a forked child) */
static PyObject *drop_method(Core *self, PyObject *unused) {
    self->logged = 0;
    self->tid_thread = 0;
    Py_RETURN_NONE;
}

/* set up the fast path: the class whose methods replay, NOT_PROFILED, the native thread id
   function, and whether the sink's rows are packed here */
static PyObject *fast_setup(Core *self, PyObject *args) {
    PyObject *cls, *not_profiled, *native;
    int direct;
    if (!PyArg_ParseTuple(args, "OOOp", &cls, &not_profiled, &native, &direct)) return NULL;
    for (int ev = 0; ev < EV_N; ev++) {
        PyObject *fn = PyObject_GetAttrString(cls, EVENT_NAMES[ev]);
        if (fn == NULL) return NULL;
        Py_XSETREF(self->methods[ev], fn);
    }
    Py_XSETREF(self->not_profiled, Py_NewRef(not_profiled));
    Py_XSETREF(self->native_tid, Py_NewRef(native));
    self->direct_rows = direct;
    self->logged = 0;
    self->tid_thread = 0;
    Py_RETURN_NONE;
}

/* ---- the types ------------------------------------------------------------------------------ */

static PyObject *Core_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    Core *self = (Core *)type->tp_alloc(type, 0);
    if (self != NULL)
        for (int i = 0; i < F_N; i++) self->f[i] = Py_NewRef(Py_None);
    return (PyObject *)self;
}

static int Core_traverse(Core *self, visitproc visit, void *arg) {
    for (int i = 0; i < F_N; i++) Py_VISIT(self->f[i]);
    for (int ev = 0; ev < EV_N; ev++) Py_VISIT(self->methods[ev]);
    Py_VISIT(self->not_profiled);
    Py_VISIT(self->native_tid);
    Py_VISIT(self->live_func);
    return 0; /* (a subclass's instance visits its type in the subclass's own traverse) */
}

static int Core_clear(Core *self) {
    for (int i = 0; i < F_N; i++) Py_CLEAR(self->f[i]);
    for (int ev = 0; ev < EV_N; ev++) Py_CLEAR(self->methods[ev]);
    Py_CLEAR(self->not_profiled);
    Py_CLEAR(self->native_tid);
    Py_CLEAR(self->live_func);
    return 0;
}

static void Core_dealloc(Core *self) { /* (a subclass's dealloc drops its type) */
    PyObject_GC_UnTrack(self);
    Core_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Parts_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PartsCore *self = (PartsCore *)type->tp_alloc(type, 0);
    if (self != NULL)
        for (int i = 0; i < P_N; i++) self->f[i] = Py_NewRef(Py_None);
    return (PyObject *)self;
}

static int Parts_traverse(PartsCore *self, visitproc visit, void *arg) {
    for (int i = 0; i < P_N; i++) Py_VISIT(self->f[i]);
    return 0;
}

static int Parts_clear(PartsCore *self) {
    for (int i = 0; i < P_N; i++) Py_CLEAR(self->f[i]);
    return 0;
}

static void Parts_dealloc(PartsCore *self) {
    PyObject_GC_UnTrack(self);
    Parts_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

#define EVENT(name) {#name, (PyCFunction)(void (*)(void))name, METH_FASTCALL | METH_KEYWORDS, NULL}
static PyMethodDef Core_methods[] = {
    EVENT(fast_forward_begin),
    EVENT(fast_forward_end),
    EVENT(fast_backward_begin),
    EVENT(fast_backward_end),
    EVENT(fast_optimizer_begin),
    EVENT(fast_optimizer_end),
    {"fast_setup", (PyCFunction)fast_setup, METH_VARARGS, "The fast path set up (see StepMachine.__init__)."},
    {"settle", (PyCFunction)settle_method, METH_NOARGS, "The logged events replayed through the machine."},
    {"drop_logged", (PyCFunction)drop_method, METH_NOARGS, "The logged events dropped (the machine was reset)."},
    {NULL, NULL, 0, NULL}};

static PyMemberDef Core_members[F_N + 3];
static PyMemberDef Parts_members[P_N + 1];

static PyTypeObject CoreType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dlscope.injob._fastpath.StepCore",
    .tp_basicsize = sizeof(Core),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE,
    .tp_doc = "StepMachine's fields the common step touches, and that step taken in C.",
    .tp_new = Core_new,
    .tp_dealloc = (destructor)Core_dealloc,
    .tp_traverse = (traverseproc)Core_traverse,
    .tp_clear = (inquiry)Core_clear,
    .tp_methods = Core_methods,
    .tp_members = Core_members,
};

static PyTypeObject PartsCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dlscope.injob._fastpath.StepPartsCore",
    .tp_basicsize = sizeof(PartsCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE,
    .tp_doc = "StepParts' fields.",
    .tp_new = Parts_new,
    .tp_dealloc = (destructor)Parts_dealloc,
    .tp_traverse = (traverseproc)Parts_traverse,
    .tp_clear = (inquiry)Parts_clear,
    .tp_members = Parts_members,
};


/* ---- timed calls ---------------------------------------------------------------------------- */

/* time.time(), as CPython computes it (the same double from the same clock reading) */
static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t t = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
    if (t % 1000000000 == 0) return (double)(t / 1000000000);
    return (double)t / 1e9;
}

enum { TIMED_CALL, TIMED_STEP };

/* A call timed as a part of the step: begin(now), the call, end(now) even when it raises — in
   place of the Python frame hooks.py wraps it in (backward(), an optimizer's step), with the
   arguments passed on as they came. An optimizer's step also tells the torch layer when another
   optimizer instance steps (hooks.optimizer_switched), and a call with more than the optimizer
   (a closure, maybe) goes to `fallback`, hooks.py's own timed step. */
typedef struct {
    PyObject_HEAD
    PyObject *inner, *begin, *end, *hooks, *machine, *fallback, *dict;
    int kind;
    vectorcallfunc vectorcall;
} Timed;

static PyObject *S_STEPPING, *S_OPTIMIZER_SWITCHED, *S_OPTIMIZER_DEPTH;

/* the error set now, raised from the one fetched before (its __context__), as a `finally` does */
static void chain(PyObject *type, PyObject *value, PyObject *tb) {
    PyObject *type2, *value2, *tb2;
    PyErr_Fetch(&type2, &value2, &tb2);
    PyErr_NormalizeException(&type, &value, &tb);
    PyErr_NormalizeException(&type2, &value2, &tb2);
    if (tb != NULL) PyException_SetTraceback(value, tb);
    PyException_SetContext(value2, value); /* steals value */
    Py_XDECREF(type);
    Py_XDECREF(tb);
    PyErr_Restore(type2, value2, tb2);
}

static int mark(PyObject *call, double now) {
    PyObject *t = PyFloat_FromDouble(now);
    if (t == NULL) return -1;
    PyObject *r = PyObject_Vectorcall(call, &t, 1, NULL);
    Py_DECREF(t);
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 0;
}

/* a step by another optimizer instance than the one stepping, at top level: hooks.optimizer_switched */
static int step_switch(Timed *self, PyObject *optimizer) {
    PyObject *stepping = PyObject_GetAttr(self->hooks, S_STEPPING);
    if (stepping == NULL) return -1;
    Py_DECREF(stepping); /* (only its identity is compared) */
    if (stepping == optimizer) return 0;
    PyObject *depth;
    if (PyObject_TypeCheck(self->machine, &CoreType)) {
        depth = Py_NewRef(((Core *)self->machine)->f[F_OPTIMIZER_DEPTH]);
    } else if ((depth = PyObject_GetAttr(self->machine, S_OPTIMIZER_DEPTH)) == NULL) {
        return -1;
    }
    int nested = PyObject_IsTrue(depth);
    Py_DECREF(depth);
    if (nested) return nested < 0 ? -1 : 0;
    PyObject *r = PyObject_CallMethodOneArg(self->hooks, S_OPTIMIZER_SWITCHED, optimizer);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

static PyObject *Timed_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Timed *self = (Timed *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (self->kind == TIMED_STEP) {
        if (nargs != 1 || kwnames != NULL) return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
        if (step_switch(self, args[0]) < 0) return NULL;
    }
    if (mark(self->begin, now_seconds()) < 0) return NULL;
    PyObject *r = PyObject_Vectorcall(self->inner, args, nargsf, kwnames);
    double end = now_seconds();
    if (r == NULL) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        if (mark(self->end, end) < 0) {
            chain(type, value, tb);
            return NULL;
        }
        PyErr_Restore(type, value, tb);
        return NULL;
    }
    if (mark(self->end, end) < 0) {
        Py_DECREF(r);
        return NULL;
    }
    return r;
}

static PyObject *Timed_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"inner", "begin", "end", "kind", "hooks", "machine", "fallback", NULL};
    PyObject *inner, *begin, *end, *hooks = Py_None, *machine = Py_None, *fallback = Py_None;
    int kind;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOi|OOO", kwlist, &inner, &begin, &end, &kind, &hooks, &machine,
                                     &fallback))
        return NULL;
    if (kind != TIMED_CALL && (kind != TIMED_STEP || hooks == Py_None || machine == Py_None || fallback == Py_None)) {
        PyErr_SetString(PyExc_ValueError, "Timed: a step needs hooks, machine and fallback");
        return NULL;
    }
    Timed *self = (Timed *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->inner = Py_NewRef(inner);
    self->begin = Py_NewRef(begin);
    self->end = Py_NewRef(end);
    self->hooks = Py_NewRef(hooks);
    self->machine = Py_NewRef(machine);
    self->fallback = Py_NewRef(fallback);
    self->kind = kind;
    self->vectorcall = Timed_vectorcall;
    return (PyObject *)self;
}

static int Timed_traverse(Timed *self, visitproc visit, void *arg) {
    Py_VISIT(self->inner);
    Py_VISIT(self->begin);
    Py_VISIT(self->end);
    Py_VISIT(self->hooks);
    Py_VISIT(self->machine);
    Py_VISIT(self->fallback);
    Py_VISIT(self->dict);
    return 0;
}

static int Timed_clear(Timed *self) {
    Py_CLEAR(self->inner);
    Py_CLEAR(self->begin);
    Py_CLEAR(self->end);
    Py_CLEAR(self->hooks);
    Py_CLEAR(self->machine);
    Py_CLEAR(self->fallback);
    Py_CLEAR(self->dict);
    return 0;
}

static void Timed_dealloc(Timed *self) {
    PyObject_GC_UnTrack(self);
    Timed_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* set as a class's `step`, it binds as a function does */
static PyObject *Timed_get(PyObject *self, PyObject *obj, PyObject *type) {
    if (obj == NULL || obj == Py_None) return Py_NewRef(self);
    return PyMethod_New(self, obj);
}

static PyGetSetDef Timed_getset[] = {{"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
                                     {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject TimedType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dlscope.injob._fastpath.Timed",
    .tp_basicsize = sizeof(Timed),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_doc = "A call timed as a part of the step (see hooks.py).",
    .tp_new = Timed_new,
    .tp_dealloc = (destructor)Timed_dealloc,
    .tp_traverse = (traverseproc)Timed_traverse,
    .tp_clear = (inquiry)Timed_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Timed, vectorcall),
    .tp_descr_get = Timed_get,
    .tp_dictoffset = offsetof(Timed, dict),
    .tp_getset = Timed_getset,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastpath", "The step machine's common step in C.", -1,
                                    NULL};

PyMODINIT_FUNC PyInit__fastpath(void) {
    /* the fields as T_OBJECT_EX members: what the interpreter specialises as slots */
    for (int i = 0; i < F_N; i++)
        Core_members[i] = (PyMemberDef){(char *)FIELD_NAMES[i], T_OBJECT_EX, offsetof(Core, f) + i * sizeof(PyObject *),
                                        0, NULL};
    Core_members[F_N] = (PyMemberDef){"fast_logged", T_INT, offsetof(Core, logged), READONLY,
                                      "events of the step logged, not yet replayed"};
    Core_members[F_N + 1] = (PyMemberDef){"fast_taken", T_LONG, offsetof(Core, taken), READONLY,
                                          "steps finished in C"};
    for (int i = 0; i < P_N; i++)
        Parts_members[i] = (PyMemberDef){(char *)PART_NAMES[i], T_OBJECT_EX,
                                         offsetof(PartsCore, f) + i * sizeof(PyObject *), 0, NULL};
    if ((S_OPTIMIZER = PyUnicode_InternFromString("optimizer")) == NULL ||
        (S_PACKS_STEP_AT = PyUnicode_InternFromString("packs_step_at")) == NULL ||
        (S_MAP = PyUnicode_InternFromString("map")) == NULL ||
        (S_GAP = PyUnicode_InternFromString("gap")) == NULL ||
        (S_STEPS_MAP = PyUnicode_InternFromString("steps_map")) == NULL ||
        (S_STEPS_POS = PyUnicode_InternFromString("steps_pos")) == NULL ||
        (S_STEPS_ROOM = PyUnicode_InternFromString("steps_room")) == NULL ||
        (S_WRITE_STEP = PyUnicode_InternFromString("write_step")) == NULL ||
        (S_STEPPING = PyUnicode_InternFromString("stepping")) == NULL ||
        (S_OPTIMIZER_SWITCHED = PyUnicode_InternFromString("optimizer_switched")) == NULL ||
        (S_OPTIMIZER_DEPTH = PyUnicode_InternFromString("optimizer_depth")) == NULL)
        return NULL;
    if (PyType_Ready(&CoreType) < 0 || PyType_Ready(&PartsCoreType) < 0 || PyType_Ready(&TimedType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "StepCore", (PyObject *)&CoreType) < 0 ||
        PyModule_AddObjectRef(m, "StepPartsCore", (PyObject *)&PartsCoreType) < 0 ||
        PyModule_AddObjectRef(m, "Timed", (PyObject *)&TimedType) < 0 ||
        PyModule_AddIntConstant(m, "TIMED_CALL", TIMED_CALL) < 0 || PyModule_AddIntConstant(m, "TIMED_STEP", TIMED_STEP) < 0 ||
        PyModule_AddStringConstant(m, "ROW_FORMAT", ROW_FORMAT) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
