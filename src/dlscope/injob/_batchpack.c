/* The batch x-ray's pending records in C (batches.py): what the training process pays per batch
   beyond its clock reads.

   `Records` is the record file's buffer of records not yet written. `built(...)` packs a batch's
   built record (BUILT, then its sample indices as int64, then its samples' end times as float64
   where they were timed) and, given the taken record's values, its taken record (TAKEN), straight
   into the buffer. The x-ray calls the two forms that read a fetcher's Built tuple in C:
   `built_by` (a worker's batch, or any batch written where it was built) and `built_and_taken`
   (num_workers=0: built and taken in one call, the iterator's counter moved on). `append` adds a
   record packed elsewhere. Each says whether a flush is due (FLUSH_BYTES pending, or
   FLUSH_SECONDS since the oldest); `take` hands the bytes over and empties the buffer.

   batches.PyRecords is the same class in Python, the definition: there the pack is a
   struct.Struct per batch size called with ~80 arguments and each record a bytes object joined
   at the flush (~23,600 instructions a batch of 64 for the x-ray against ~13,800 with this:
   BENCHMARKS.md). An index that is not an integer in int64's range is written -1, as in Python
   (tests/test_batchpack.py runs both on the same calls and compares the bytes).

   `Stamps` is a batch's samples' end times, noted as a worker fetches them (batches.PyStamps, the
   definition): `stamp(sample)` reads a tick counter and returns the sample, so the fetch stays
   one list comprehension (3.11 inlines a Python `__getitem__` called there) with one C call a
   sample. The ticks are the CPU's time-stamp counter where it is invariant (no vDSO clock read,
   no float made a sample), else CLOCK_MONOTONIC's ns; they are mapped to time.time()'s seconds
   linearly between two (time.time(), ticks) pairs read at its creation and at its first read.

   `DataQueue` (at the end) is a worker's data-queue wrapper, batches.PyDataQueue in C: each batch
   the worker puts is written through the same packing, in one call.

   Each method runs under the GIL without letting it go once it touches the buffer: what may run
   Python (an index's __index__, a time's __float__) is read first, so another thread's record
   cannot land inside this one. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <structmember.h>
#include <time.h>
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <x86intrin.h>
#define HAVE_TSC 1
#endif

#define BUILT_BYTES 56 /* struct "<IBBhIIIIdddd" */
#define TAKEN_BYTES 60 /* struct "<IBxhIIIIIIdddf" */
#define TAKEN_FIELDS 13
#define KIND_BUILT 0
#define KIND_TAKEN 1
#define SAMPLE_TIMES 1 /* batches.SAMPLE_TIMES: the built flag of samples timed one by one */
#define KEPT_BYTES (1 << 20) /* a buffer grown past this (a huge batch) is let go at the next take */

typedef struct {
    PyObject_HEAD
    char *data;
    Py_ssize_t used, capacity;
    Py_ssize_t flush_bytes;
    double flush_seconds;
    double oldest; /* when the oldest pending record was added; 0: none pending */
} Records;

/* ---- Stamps ------------------------------------------------------------------------------- */

static int tsc_invariant; /* the CPU's time-stamp counter ticks at one rate in every state (CPUID) */

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts); /* time.time()'s clock */
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t ticks(int tsc) {
#ifdef HAVE_TSC
    if (tsc) return __rdtsc();
#endif
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

typedef struct {
    PyObject_HEAD
    uint64_t *ticks;
    Py_ssize_t n, capacity;
    int tsc;    /* ticks read from the TSC (else CLOCK_MONOTONIC's ns) */
    int mapped; /* the second pair read: the mapping fixed */
    uint64_t tick0, tick1;
    double wall0, wall1;
} Stamps;

static PyTypeObject StampsType;

static PyObject *Stamps_stamp(Stamps *self, PyObject *value) {
    uint64_t now = ticks(self->tsc);
    if (self->n == self->capacity) { /* more samples than it was made for (an iterable's stream) */
        Py_ssize_t capacity = self->capacity ? 2 * self->capacity : 64;
        uint64_t *grown = PyMem_Realloc(self->ticks, sizeof(uint64_t) * capacity);
        if (grown == NULL) return PyErr_NoMemory();
        self->ticks = grown, self->capacity = capacity;
    }
    self->ticks[self->n++] = now;
    Py_INCREF(value);
    return value;
}

/* the end time of sample i in time.time()'s seconds (0 <= i < n); the mapping fixed at the first
   read. A counter that did not move forward between the two pairs (a clock set back, a TSC that
   jumped): every end reads as the second pair's time. */
static double stamps_end(Stamps *self, Py_ssize_t i) {
    if (!self->mapped) {
        self->tick1 = ticks(self->tsc);
        self->wall1 = now_seconds();
        self->mapped = 1;
    }
    if (self->tick1 <= self->tick0 || self->wall1 < self->wall0) return self->wall1;
    double rate = (self->wall1 - self->wall0) / (double)(self->tick1 - self->tick0);
    return self->wall0 + (double)(int64_t)(self->ticks[i] - self->tick0) * rate;
}

static Py_ssize_t Stamps_len(Stamps *self) { return self->n; }

static PyObject *Stamps_item(Stamps *self, Py_ssize_t i) {
    if (i < 0 || i >= self->n) {
        PyErr_SetString(PyExc_IndexError, "Stamps index out of range");
        return NULL;
    }
    return PyFloat_FromDouble(stamps_end(self, i));
}

static int Stamps_init(Stamps *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"capacity", "tsc", NULL};
    Py_ssize_t capacity;
    int tsc = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "n|p", names, &capacity, &tsc)) return -1;
    if (capacity < 0) {
        PyErr_SetString(PyExc_ValueError, "Stamps: capacity must be at least 0");
        return -1;
    }
    uint64_t *buffer = PyMem_Realloc(self->ticks, sizeof(uint64_t) * (capacity ? capacity : 1));
    if (buffer == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->ticks = buffer, self->capacity = capacity ? capacity : 1, self->n = 0, self->mapped = 0;
    self->tsc = tsc && tsc_invariant;
    self->wall0 = now_seconds();
    self->tick0 = ticks(self->tsc);
    return 0;
}

static void Stamps_dealloc(Stamps *self) {
    PyMem_Free(self->ticks);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Stamps_get_tsc(Stamps *self, void *unused) { return PyBool_FromLong(self->tsc); }

static PyMethodDef Stamps_methods[] = {
    {"stamp", (PyCFunction)Stamps_stamp, METH_O, "stamp(sample) -> sample: its end time noted."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Stamps_getset[] = {
    {"tsc", (getter)Stamps_get_tsc, NULL, "ticks read from the CPU's invariant time-stamp counter", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PySequenceMethods Stamps_sequence = {.sq_length = (lenfunc)Stamps_len, .sq_item = (ssizeargfunc)Stamps_item};

static PyTypeObject StampsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dlscope.injob._batchpack.Stamps",
    .tp_basicsize = sizeof(Stamps),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Stamps(capacity, tsc=True): a batch's samples' end times, in time.time()'s seconds "
              "(batches.PyStamps); tsc=False: CLOCK_MONOTONIC's ticks even where the TSC is invariant.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Stamps_init,
    .tp_dealloc = (destructor)Stamps_dealloc,
    .tp_methods = Stamps_methods,
    .tp_getset = Stamps_getset,
    .tp_as_sequence = &Stamps_sequence,
};

/* ---- Records ------------------------------------------------------------------------------ */

static void put_u32(char **at, uint32_t v) { memcpy(*at, &v, 4), *at += 4; }
static void put_f64(char **at, double v) { memcpy(*at, &v, 8), *at += 8; }

/* an integer field of a record's fixed part, in [lo, hi]: -1 and an exception otherwise */
static int field(PyObject *value, long long lo, long long hi, long long *out) {
    long long v = PyLong_AsLongLong(value);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (v < lo || v > hi) {
        PyErr_Format(PyExc_OverflowError, "record field %lld out of range", v);
        return -1;
    }
    *out = v;
    return 0;
}

/* a sample index that is not an exact int, as batches.PyRecords writes it: its __index__'s
   value, -1 where it has none or it is outside int64 */
static int64_t other_index(PyObject *item) {
    PyObject *number = PyNumber_Index(item);
    if (number == NULL) {
        PyErr_Clear();
        return -1;
    }
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(number, &overflow);
    Py_DECREF(number);
    if (v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    return overflow ? -1 : (int64_t)v;
}

/* room for `size` more bytes */
static int reserve(Records *self, Py_ssize_t size) {
    if (self->used + size <= self->capacity) return 0;
    Py_ssize_t capacity = self->capacity ? self->capacity : 4096;
    while (capacity < self->used + size) capacity *= 2;
    char *data = PyMem_Realloc(self->data, capacity);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->data = data, self->capacity = capacity;
    return 0;
}

static PyObject *added(Records *self, double now) {
    if (self->oldest == 0.0) self->oldest = now;
    return PyBool_FromLong(self->used >= self->flush_bytes || now - self->oldest >= self->flush_seconds);
}

/* a batch's built record (and its taken one, where `taken_ints` is not NULL) added: `head` is
   flags, worker_id, generation, idx, tid; `times` start, fetched, collated, ready; `ends` NULL
   where the samples were not timed one by one. Everything that may run Python (an index's
   __index__, a time's __float__) is read before the buffer is touched. */
static PyObject *add_built(Records *self, const long long head[5], const double times[4], PyObject *indices,
                           PyObject *ends, const long long *taken_ints, const double *taken_times) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(indices);
    Py_ssize_t words = n * (ends != NULL ? 2 : 1);
    Py_ssize_t built_bytes = BUILT_BYTES + 8 * words;
    if (built_bytes > UINT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "built: record too long");
        return NULL;
    }
    int64_t stack[512];
    int64_t *values = stack;
    PyObject *result = NULL;
    if (words > 512 && (values = PyMem_Malloc(sizeof(int64_t) * words)) == NULL) return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++) {
        /* the list may shrink under an __index__ that runs Python: its length read at each item */
        PyObject *item = i < PySequence_Fast_GET_SIZE(indices) ? PySequence_Fast_GET_ITEM(indices, i) : NULL;
        if (item != NULL && PyLong_CheckExact(item)) {
#if PY_VERSION_HEX < 0x030C0000
            /* an int of one digit (|i| < 2**30, a sample index nearly always): read as 3.11 lays it out */
            Py_ssize_t size = Py_SIZE(item);
            if (size >= -1 && size <= 1) {
                values[i] = (int64_t)size * (int64_t)((PyLongObject *)item)->ob_digit[0];
                continue;
            }
#endif
            int overflow;
            long long v = PyLong_AsLongLongAndOverflow(item, &overflow);
            values[i] = overflow ? -1 : (int64_t)v;
        } else if (item != NULL) {
            Py_INCREF(item);
            values[i] = other_index(item);
            Py_DECREF(item);
        } else {
            values[i] = -1;
        }
    }
    if (ends != NULL && Py_IS_TYPE(ends, &StampsType)) {
        for (Py_ssize_t i = 0; i < n; i++) {
            double end = stamps_end((Stamps *)ends, i);
            memcpy(&values[n + i], &end, 8);
        }
    } else if (ends != NULL) {
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *item = i < PySequence_Fast_GET_SIZE(ends) ? PySequence_Fast_GET_ITEM(ends, i) : NULL;
            double end = item != NULL ? PyFloat_AsDouble(item) : -1.0;
            if (item != NULL && end == -1.0 && PyErr_Occurred()) goto done;
            memcpy(&values[n + i], &end, 8);
        }
    }
    if (reserve(self, built_bytes + (taken_ints != NULL ? TAKEN_BYTES : 0)) < 0) goto done;
    char *at = self->data + self->used;
    put_u32(&at, (uint32_t)built_bytes);
    *at++ = KIND_BUILT;
    *at++ = (char)(uint8_t)head[0];
    int16_t worker = (int16_t)head[1];
    memcpy(at, &worker, 2), at += 2;
    put_u32(&at, (uint32_t)head[2]);
    put_u32(&at, (uint32_t)head[3]);
    put_u32(&at, (uint32_t)n);
    put_u32(&at, (uint32_t)head[4]);
    for (int i = 0; i < 4; i++) put_f64(&at, times[i]);
    memcpy(at, values, 8 * words), at += 8 * words;
    if (taken_ints != NULL) {
        put_u32(&at, (uint32_t)taken_ints[0]);
        *at++ = (char)(uint8_t)taken_ints[1];
        *at++ = 0; /* the pad byte */
        int16_t taker = (int16_t)taken_ints[2];
        memcpy(at, &taker, 2), at += 2;
        for (int i = 3; i < 9; i++) put_u32(&at, (uint32_t)taken_ints[i]);
        for (int i = 0; i < 3; i++) put_f64(&at, taken_times[i]);
        float pin = (float)taken_times[3];
        memcpy(at, &pin, 4), at += 4;
    }
    self->used = at - self->data;
    result = added(self, times[3]);
done:
    if (values != stack) PyMem_Free(values);
    return result;
}

static const long long HEAD_LO[5] = {0, INT16_MIN, 0, 0, 0};
static const long long HEAD_HI[5] = {255, INT16_MAX, UINT32_MAX, UINT32_MAX, UINT32_MAX};
/* TAKEN's integer fields: length, kind, worker_id, worker_pid, generation, idx, loader, pass, tid */
static const long long TAKEN_LO[9] = {0, 0, INT16_MIN, 0, 0, 0, 0, 0, 0};
static const long long TAKEN_HI[9] = {UINT32_MAX, 255, INT16_MAX, UINT32_MAX, UINT32_MAX,
                                      UINT32_MAX, UINT32_MAX, UINT32_MAX, UINT32_MAX};

static int read_times(PyObject *const *items, int count, double *out) {
    for (int i = 0; i < count; i++) {
        out[i] = PyFloat_AsDouble(items[i]);
        if (out[i] == -1.0 && PyErr_Occurred()) return -1;
    }
    return 0;
}

/* the sequences a record reads: indices, and ends where not None (NULL); 0, or -1 and an error */
static int read_sequences(PyObject *indices_arg, PyObject *ends_arg, PyObject **indices, PyObject **ends) {
    *ends = NULL;
    *indices = PySequence_Fast(indices_arg, "built: indices must be a sequence");
    if (*indices == NULL) return -1;
    if (ends_arg == Py_None) return 0;
    Py_ssize_t n_ends;
    if (Py_IS_TYPE(ends_arg, &StampsType)) { /* read as they are, no list made */
        *ends = Py_NewRef(ends_arg);
        n_ends = ((Stamps *)ends_arg)->n;
    } else {
        *ends = PySequence_Fast(ends_arg, "built: ends must be a sequence");
        n_ends = *ends != NULL ? PySequence_Fast_GET_SIZE(*ends) : -1;
    }
    if (n_ends == PySequence_Fast_GET_SIZE(*indices)) return 0;
    if (*ends != NULL) PyErr_SetString(PyExc_ValueError, "built: one end time per sample");
    Py_CLEAR(*indices);
    Py_CLEAR(*ends);
    return -1;
}

static PyObject *Records_built(Records *self, PyObject *const *args, Py_ssize_t nargs) {
    /* flags, worker_id, generation, idx, tid, start, fetched, collated, ready, indices, ends
       (None: not timed one by one), taken (None, or TAKEN's 13 values) */
    if (nargs != 12) {
        PyErr_SetString(PyExc_TypeError, "built takes 12 arguments");
        return NULL;
    }
    long long head[5], taken_ints[9];
    double times[4], taken_times[4];
    for (int i = 0; i < 5; i++)
        if (field(args[i], HEAD_LO[i], HEAD_HI[i], &head[i])) return NULL;
    if (read_times(args + 5, 4, times)) return NULL;
    PyObject *taken = args[11];
    if (taken != Py_None) {
        if (!PyTuple_Check(taken) || PyTuple_GET_SIZE(taken) != TAKEN_FIELDS) {
            PyErr_SetString(PyExc_TypeError, "built: taken must be a tuple of TAKEN's 13 values");
            return NULL;
        }
        for (int i = 0; i < 9; i++)
            if (field(PyTuple_GET_ITEM(taken, i), TAKEN_LO[i], TAKEN_HI[i], &taken_ints[i])) return NULL;
        if (read_times(&PyTuple_GET_ITEM(taken, 9), 4, taken_times)) return NULL;
    }
    PyObject *indices, *ends;
    if (read_sequences(args[9], args[10], &indices, &ends)) return NULL;
    PyObject *result = add_built(self, head, times, indices, ends, taken != Py_None ? taken_ints : NULL, taken_times);
    Py_DECREF(indices);
    Py_XDECREF(ends);
    return result;
}

/* a Built tuple's fields as the records read them: flags and times[0..2], with its indices and ends
   (NULL: not timed one by one; also where not one end per sample, its flag then cleared) */
static int read_built(PyObject *built, long long *flags, double times[3], PyObject **indices, PyObject **ends) {
    if (!PyTuple_Check(built) || PyTuple_GET_SIZE(built) != 6) {
        PyErr_SetString(PyExc_TypeError, "a Built tuple: flags, start, fetched, collated, indices, ends");
        return -1;
    }
    if (field(PyTuple_GET_ITEM(built, 0), 0, 255, flags) || read_times(&PyTuple_GET_ITEM(built, 1), 3, times)) return -1;
    PyObject *ends_arg = PyTuple_GET_ITEM(built, 5);
    if (ends_arg != Py_None) { /* (never from batches.py's fetchers) not one end per sample: not timed after all */
        Py_ssize_t n_ends = PyObject_Length(ends_arg), n = PyObject_Length(PyTuple_GET_ITEM(built, 4));
        if (n_ends < 0 || n < 0) return -1;
        if (n_ends != n) ends_arg = Py_None, *flags &= ~SAMPLE_TIMES;
    }
    return read_sequences(PyTuple_GET_ITEM(built, 4), ends_arg, indices, ends);
}

static PyObject *Records_built_by(Records *self, PyObject *const *args, Py_ssize_t nargs) {
    /* built (a Built tuple), worker_id, generation, idx, tid, ready */
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "built_by takes 6 arguments");
        return NULL;
    }
    long long head[5];
    double times[4];
    PyObject *indices, *ends;
    if (field(args[1], INT16_MIN, INT16_MAX, &head[1]) || field(args[2], 0, UINT32_MAX, &head[2]) ||
        field(args[3], 0, UINT32_MAX, &head[3]) || field(args[4], 0, UINT32_MAX, &head[4]) ||
        read_times(args + 5, 1, times + 3) || read_built(args[0], &head[0], times, &indices, &ends))
        return NULL;
    PyObject *result = add_built(self, head, times, indices, ends, NULL, NULL);
    Py_DECREF(indices);
    Py_XDECREF(ends);
    return result;
}

static PyObject *Records_built_and_taken(Records *self, PyObject *const *args, Py_ssize_t nargs) {
    /* built (a batches.Built as a plain tuple: flags, start, fetched, collated, indices, ends),
       single (the iterator's [serial, batches taken, loader, pass]: its count is moved on here),
       worker_id, pid, tid, next_start, next_end, pin */
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "built_and_taken takes 8 arguments");
        return NULL;
    }
    PyObject *built = args[0], *single = args[1], *indices, *ends;
    if (!PyList_Check(single) || PyList_GET_SIZE(single) != 4) {
        PyErr_SetString(PyExc_TypeError, "built_and_taken: the iterator's [serial, batches taken, loader, pass]");
        return NULL;
    }
    long long flags, worker_id, pid, tid, serial, idx, loader, passes;
    double times[4];       /* start, fetched, collated, ready (= next_end: handed on as it was taken) */
    double taken_times[4]; /* next_start, next_end, taken (= next_end), pin seconds */
    if (field(args[2], INT16_MIN, INT16_MAX, &worker_id) || field(args[3], 0, UINT32_MAX, &pid) ||
        field(args[4], 0, UINT32_MAX, &tid) || field(PyList_GET_ITEM(single, 0), 0, UINT32_MAX, &serial) ||
        field(PyList_GET_ITEM(single, 1), 0, UINT32_MAX - 1, &idx) ||
        field(PyList_GET_ITEM(single, 2), 0, UINT32_MAX, &loader) ||
        field(PyList_GET_ITEM(single, 3), 0, UINT32_MAX, &passes) || read_times(args + 5, 2, taken_times) ||
        read_times(args + 7, 1, taken_times + 3) || read_built(built, &flags, times, &indices, &ends))
        return NULL;
    times[3] = taken_times[2] = taken_times[1];
    PyObject *count = PyLong_FromLongLong(idx + 1);
    if (count == NULL) {
        Py_DECREF(indices);
        Py_XDECREF(ends);
        return NULL;
    }
    long long head[5] = {flags, worker_id, serial, idx, tid};
    /* the taken record's worker -1: a batch of no worker's */
    long long taken_ints[9] = {TAKEN_BYTES, KIND_TAKEN, -1, pid, serial, idx, loader, passes, tid};
    PyObject *result = add_built(self, head, times, indices, ends, taken_ints, taken_times);
    Py_DECREF(indices);
    Py_XDECREF(ends);
    if (result == NULL) {
        Py_DECREF(count);
        return NULL;
    }
    if (PyList_SetItem(single, 1, count) < 0) { /* (steals count) a list an __index__ emptied meanwhile */
        Py_DECREF(result);
        return NULL;
    }
    return result;
}

static PyObject *Records_append(Records *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "append takes 2 arguments (record, now)");
        return NULL;
    }
    double now = PyFloat_AsDouble(args[1]);
    if (now == -1.0 && PyErr_Occurred()) return NULL;
    if (!PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "append: a record is bytes");
        return NULL;
    }
    Py_ssize_t size = PyBytes_GET_SIZE(args[0]);
    if (reserve(self, size) < 0) return NULL;
    memcpy(self->data + self->used, PyBytes_AS_STRING(args[0]), size);
    self->used += size;
    return added(self, now);
}

static PyObject *Records_take(Records *self, PyObject *unused) {
    PyObject *data = PyBytes_FromStringAndSize(self->data, self->used);
    if (data == NULL) return NULL;
    self->used = 0, self->oldest = 0.0;
    if (self->capacity > KEPT_BYTES) {
        PyMem_Free(self->data);
        self->data = NULL, self->capacity = 0;
    }
    return data;
}

static Py_ssize_t Records_len(Records *self) { return self->used; }

static int Records_init(Records *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"flush_bytes", "flush_seconds", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "nd", names, &self->flush_bytes, &self->flush_seconds)) return -1;
    self->used = 0, self->oldest = 0.0;
    return 0;
}

static void Records_dealloc(Records *self) {
    PyMem_Free(self->data);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Records_methods[] = {
    {"built", (PyCFunction)(void (*)(void))Records_built, METH_FASTCALL,
     "built(flags, worker_id, generation, idx, tid, start, fetched, collated, ready, indices, ends, taken) -> "
     "flush due: a batch's built record (and its taken one) added, as batches.PyRecords.built adds it."},
    {"built_and_taken", (PyCFunction)(void (*)(void))Records_built_and_taken, METH_FASTCALL,
     "built_and_taken(built, single, worker_id, pid, tid, next_start, next_end, pin) -> flush due: a batch built "
     "and taken in this thread (num_workers=0), as batches.PyRecords.built_and_taken adds it."},
    {"built_by", (PyCFunction)(void (*)(void))Records_built_by, METH_FASTCALL,
     "built_by(built, worker_id, generation, idx, tid, ready) -> flush due: a Built tuple's record, as "
     "batches.PyRecords.built_by adds it."},
    {"append", (PyCFunction)(void (*)(void))Records_append, METH_FASTCALL,
     "append(record, now) -> flush due: a packed record added at `now`."},
    {"take", (PyCFunction)Records_take, METH_NOARGS, "The pending bytes, handed over; none left pending."},
    {NULL, NULL, 0, NULL}};

static PySequenceMethods Records_sequence = {.sq_length = (lenfunc)Records_len};

static PyTypeObject RecordsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dlscope.injob._batchpack.Records",
    .tp_basicsize = sizeof(Records),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Records(flush_bytes, flush_seconds): the batch x-ray's records not yet written (batches.PyRecords).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Records_init,
    .tp_dealloc = (destructor)Records_dealloc,
    .tp_methods = Records_methods,
    .tp_as_sequence = &Records_sequence,
};

/* A worker's data queue (batches.PyDataQueue, the definition): `put((idx, batch))` writes the
   batch's built record, taken from the worker's thread-local Built, and sets the worker's rule for
   its next batch; `put((_ResumeIteration, None))` counts a resumed epoch; every item then goes on
   to the queue's own `put`. One C call in place of three Python frames (~10,600 instructions a
   batch of 64 in Python, BENCHMARKS.md). The worker's state stays in the recorder's attributes,
   where its loop and its fetchers read them. Other attributes are the queue's. */

typedef struct {
    PyObject_HEAD
    PyObject *queue, *put, *recorder, *local, *resume;
    long long sample_every, tid;
} DataQueue;

static PyObject *s_built, *s_fetches, *s_sample_min_s, *s_time_samples, *s_worker_id, *s_generation, *s_file,
    *s_pending, *s_flush, *s_built_by;

/* recorder.<name> as a long long; -1 with an error set where it is not an int */
static int int_attr(PyObject *owner, PyObject *name, long long *out) {
    PyObject *value = PyObject_GetAttr(owner, name);
    if (value == NULL) return -1;
    *out = PyLong_AsLongLong(value);
    Py_DECREF(value);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static int set_int_attr(PyObject *owner, PyObject *name, long long value) {
    PyObject *number = PyLong_FromLongLong(value);
    if (number == NULL) return -1;
    int failed = PyObject_SetAttr(owner, name, number);
    Py_DECREF(number);
    return failed;
}

/* the batch `built` (a Built tuple) handed on as batch `idx`: the rule for the next batch, then
   the record, then a flush where one is due */
static int worker_built(DataQueue *self, PyObject *built, PyObject *idx) {
    PyObject *recorder = self->recorder;
    if (!PyTuple_Check(built) || PyTuple_GET_SIZE(built) != 6) {
        PyErr_SetString(PyExc_TypeError, "a Built tuple: flags, start, fetched, collated, indices, ends");
        return -1;
    }
    long long fetches;
    double min_s;
    if (int_attr(recorder, s_fetches, &fetches) || set_int_attr(recorder, s_fetches, ++fetches)) return -1;
    PyObject *min_obj = PyObject_GetAttr(recorder, s_sample_min_s);
    if (min_obj == NULL) return -1;
    min_s = PyFloat_AsDouble(min_obj);
    Py_DECREF(min_obj);
    if (min_s == -1.0 && PyErr_Occurred()) return -1;
    double start = PyFloat_AsDouble(PyTuple_GET_ITEM(built, 1)), fetched = PyFloat_AsDouble(PyTuple_GET_ITEM(built, 2));
    if (PyErr_Occurred()) return -1;
    Py_ssize_t samples = PyObject_Length(PyTuple_GET_ITEM(built, 4));
    if (samples < 0) return -1;
    int timed = fetched - start >= min_s * (double)samples || fetches % self->sample_every == 0;
    if (PyObject_SetAttr(recorder, s_time_samples, timed ? Py_True : Py_False) < 0) return -1;
    PyObject *worker_id = PyObject_GetAttr(recorder, s_worker_id);
    PyObject *generation = worker_id ? PyObject_GetAttr(recorder, s_generation) : NULL;
    PyObject *file = generation ? PyObject_GetAttr(recorder, s_file) : NULL;
    PyObject *pending = file ? PyObject_GetAttr(file, s_pending) : NULL;
    PyObject *tid = pending ? PyLong_FromLongLong(self->tid) : NULL;
    PyObject *ready = tid ? PyFloat_FromDouble(now_seconds()) : NULL;
    PyObject *due = NULL;
    if (ready != NULL) {
        PyObject *args[7] = {pending, built, worker_id, generation, idx, tid, ready};
        due = Py_IS_TYPE(pending, &RecordsType)
                  ? Records_built_by((Records *)pending, args + 1, 6)
                  : PyObject_VectorcallMethod(s_built_by, args, 7, NULL);
    }
    int failed = due == NULL;
    if (!failed && PyObject_IsTrue(due)) {
        PyObject *flushed = PyObject_CallMethodNoArgs(file, s_flush);
        failed = flushed == NULL;
        Py_XDECREF(flushed);
    }
    Py_XDECREF(due);
    Py_XDECREF(ready);
    Py_XDECREF(tid);
    Py_XDECREF(pending);
    Py_XDECREF(file);
    Py_XDECREF(generation);
    Py_XDECREF(worker_id);
    return failed ? -1 : 0;
}

static PyObject *DataQueue_put(DataQueue *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (self->put == NULL) {
        PyErr_SetString(PyExc_TypeError, "DataQueue not initialised");
        return NULL;
    }
    if (nargs < 1) {
        PyErr_SetString(PyExc_TypeError, "put takes the item first");
        return NULL;
    }
    PyObject *item = args[0];
    if (PyTuple_CheckExact(item) && PyTuple_GET_SIZE(item) == 2) {
        PyObject *idx = PyTuple_GET_ITEM(item, 0);
        if (PyLong_CheckExact(idx)) {
            PyObject *built = PyObject_GetAttr(self->local, s_built);
            if (built == NULL) return NULL;
            if (built != Py_None) { /* (none: the fetch raised, and an ExceptionWrapper is sent) */
                int failed = PyObject_SetAttr(self->local, s_built, Py_None) < 0 || worker_built(self, built, idx) < 0;
                Py_DECREF(built);
                if (failed) return NULL;
            } else {
                Py_DECREF(built);
            }
        } else {
            int resumed = PyObject_IsInstance(idx, self->resume);
            if (resumed < 0) return NULL;
            long long generation;
            if (resumed && (int_attr(self->recorder, s_generation, &generation) ||
                            set_int_attr(self->recorder, s_generation, generation + 1)))
                return NULL;
        }
    }
    return PyObject_Vectorcall(self->put, args, nargs, kwnames);
}

static PyObject *DataQueue_getattro(DataQueue *self, PyObject *name) {
    PyObject *found = PyObject_GenericGetAttr((PyObject *)self, name);
    if (found != NULL || !PyErr_ExceptionMatches(PyExc_AttributeError)) return found;
    if (self->queue == NULL) return NULL; /* (not initialised: the AttributeError stands) */
    PyErr_Clear();
    return PyObject_GetAttr(self->queue, name); /* the queue's own */
}

static int DataQueue_init(DataQueue *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"queue", "recorder", "resume", "sample_every", NULL};
    PyObject *queue, *recorder, *resume;
    long long sample_every;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOL", names, &queue, &recorder, &resume, &sample_every))
        return -1;
    if (sample_every < 1) {
        PyErr_SetString(PyExc_ValueError, "sample_every must be at least 1");
        return -1;
    }
    PyObject *put = PyObject_GetAttrString(queue, "put");
    if (put == NULL) return -1;
    PyObject *local = PyObject_GetAttrString(recorder, "local"); /* kept for life by the recorder */
    if (local == NULL) {
        Py_DECREF(put);
        return -1;
    }
    Py_INCREF(queue), Py_INCREF(recorder), Py_INCREF(resume);
    Py_XSETREF(self->queue, queue);
    Py_XSETREF(self->put, put);
    Py_XSETREF(self->recorder, recorder);
    Py_XSETREF(self->local, local);
    Py_XSETREF(self->resume, resume);
    self->sample_every = sample_every;
    self->tid = (long long)PyThread_get_thread_native_id(); /* made in the worker's loop, whose thread alone puts */
    return 0;
}

static int DataQueue_traverse(DataQueue *self, visitproc visit, void *arg) {
    Py_VISIT(self->queue);
    Py_VISIT(self->put);
    Py_VISIT(self->recorder);
    Py_VISIT(self->local);
    Py_VISIT(self->resume);
    return 0;
}

static int DataQueue_clear(DataQueue *self) {
    Py_CLEAR(self->queue);
    Py_CLEAR(self->put);
    Py_CLEAR(self->recorder);
    Py_CLEAR(self->local);
    Py_CLEAR(self->resume);
    return 0;
}

static void DataQueue_dealloc(DataQueue *self) {
    PyObject_GC_UnTrack(self);
    DataQueue_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef DataQueue_methods[] = {
    {"put", (PyCFunction)(void (*)(void))DataQueue_put, METH_FASTCALL | METH_KEYWORDS,
     "put(item, *args, **kwargs): a batch's built record written (as batches.PyDataQueue.put writes it), then "
     "the item put on the queue."},
    {NULL, NULL, 0, NULL}};

static PyMemberDef DataQueue_members[] = {
    {"queue", T_OBJECT_EX, offsetof(DataQueue, queue), READONLY, "the queue wrapped"},
    {"recorder", T_OBJECT_EX, offsetof(DataQueue, recorder), READONLY, "the worker's BatchRecorder"},
    {NULL, 0, 0, 0, NULL}};

static PyTypeObject DataQueueType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dlscope.injob._batchpack.DataQueue",
    .tp_basicsize = sizeof(DataQueue),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "DataQueue(queue, recorder, resume, sample_every): a worker's data queue (batches.PyDataQueue).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)DataQueue_init,
    .tp_dealloc = (destructor)DataQueue_dealloc,
    .tp_traverse = (traverseproc)DataQueue_traverse,
    .tp_clear = (inquiry)DataQueue_clear,
    .tp_getattro = (getattrofunc)DataQueue_getattro,
    .tp_methods = DataQueue_methods,
    .tp_members = DataQueue_members,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_batchpack",
                                    "The batch x-ray's pending records in C.", -1, NULL, NULL, NULL, NULL, NULL};

static int intern_names(void) {
    struct {
        PyObject **at;
        const char *text;
    } names[] = {{&s_built, "built"},         {&s_fetches, "fetches"}, {&s_sample_min_s, "sample_min_s"},
                 {&s_time_samples, "time_samples"}, {&s_worker_id, "worker_id"}, {&s_generation, "generation"},
                 {&s_file, "file"},           {&s_pending, "pending"}, {&s_flush, "flush"},
                 {&s_built_by, "built_by"}};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if ((*names[i].at = PyUnicode_InternFromString(names[i].text)) == NULL) return -1;
    return 0;
}

PyMODINIT_FUNC PyInit__batchpack(void) {
    if (PyType_Ready(&StampsType) < 0 || PyType_Ready(&RecordsType) < 0 || PyType_Ready(&DataQueueType) < 0 ||
        intern_names() < 0)
        return NULL;
#ifdef HAVE_TSC
    unsigned int eax, ebx, ecx, edx;
    tsc_invariant = __get_cpuid(0x80000007, &eax, &ebx, &ecx, &edx) && (edx & (1u << 8)); /* "Invariant TSC" */
#endif
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "Records", (PyObject *)&RecordsType) < 0 ||
        PyModule_AddObjectRef(m, "DataQueue", (PyObject *)&DataQueueType) < 0 ||
        PyModule_AddObjectRef(m, "Stamps", (PyObject *)&StampsType) < 0 ||
        PyModule_AddIntConstant(m, "TSC_INVARIANT", tsc_invariant) < 0 ||
        PyModule_AddIntConstant(m, "BUILT_BYTES", BUILT_BYTES) < 0 ||
        PyModule_AddIntConstant(m, "TAKEN_BYTES", TAKEN_BYTES) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
