"""ortlab's compiled C kernels, for work done on every step where Python's per-call cost or numpy's passes
would show:

- `stats_kernel()`: statistics of a float32 tensor on the CPU in one pass: min, max, sum, sum of squares, zeros and
  whether there is any nan or inf. numpy needs a pass per statistic (about 0.25 ns per element here against 0.1),
  and on a small model those passes are most of what collecting activation statistics costs.
- `sums_kernel()`: the in-sync checksums of a distributed burst's ranks, every parameter's bits summed as int32
  (wrapping) in one call; a torch sum per parameter costs ~10 us of dispatch, 0.3 ms a step on the demo's 29.

The C source is compiled on first use with the system's C compiler (ortlab already needs one for ORTModule's
extensions) into ortlab's cache folder (~/.cache/ortlab, or ORTLAB_ENV_ROOT: `common.cache.cache_root`), with one
variant per instruction set chosen at run time; without a compiler both return None and their callers use numpy
or torch. It is built as a Python extension when Python's headers are there: a call through ctypes costs about
4 us (argument conversion, releasing and taking back the GIL), as much as summarizing 30,000 values, and a step of
the demo makes 52 of them. Without the headers it is loaded through ctypes."""

from __future__ import annotations

import ctypes
import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import types
from pathlib import Path

SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <string.h>
/* row = {numel, min, max, sum, sum of squares, centred sum of squares, nans, infs, zeros} and
   samples[j] = x[idx[j]]; returns 1 when there is a nan or an inf (the caller then recomputes the row over the
   finite values and counts them; nans and infs are left 0 here). Sums run in float in W lanes over blocks of
   4096 values and in double across blocks: W independent chains are what lets the compiler fill the vector
   units (one accumulator waits on the latency of each add). The largest magnitude, compared as bits, says
   whether there is a nan or inf. */
#define W 16
/* One value into lane j's sums, extremes, zero count and largest magnitude (as bits). */
#define ACCUMULATE(value, j) do {                \
        float v = (value);                       \
        int32_t b;                               \
        memcpy(&b, &v, 4);                       \
        int32_t m = b & 0x7fffffff;              \
        s[j] += v;                               \
        q[j] += v * v;                           \
        l[j] = v < l[j] ? v : l[j];              \
        h[j] = v > h[j] ? v : h[j];              \
        z[j] += m == 0;                          \
        t[j] = m > t[j] ? m : t[j];              \
    } while (0)
TARGETS
int ortlab_stats_f32(const float *x, int64_t n, const int64_t *idx, int64_t k, double *row, float *samples) {
    double sum = 0.0, sumsq = 0.0;
    float lo = INFINITY, hi = -INFINITY;
    int64_t zeros = 0;
    int32_t top = 0;
    for (int64_t start = 0; start < n; start += 4096) {
        int64_t stop = start + 4096 < n ? start + 4096 : n, i = start;
        float s[W] = {0}, q[W] = {0}, l[W], h[W];
        int32_t z[W] = {0}, t[W] = {0};
        for (int j = 0; j < W; j++) { l[j] = INFINITY; h[j] = -INFINITY; }
        for (; i + W <= stop; i += W) {
            for (int j = 0; j < W; j++) {
                ACCUMULATE(x[i + j], j);
            }
        }
        for (int j = 0; i < stop; i++, j++) {
            ACCUMULATE(x[i], j);
        }
        double bs = 0.0, bq = 0.0;
        for (int j = 0; j < W; j++) {
            bs += s[j]; bq += q[j]; zeros += z[j];
            lo = l[j] < lo ? l[j] : lo;
            hi = h[j] > hi ? h[j] : hi;
            top = t[j] > top ? t[j] : top;
        }
        sum += bs; sumsq += bq;
    }
    double css = n ? sumsq - sum * sum / (double)n : 0.0;
    if (n && top < 0x7f800000 && sum * sum / (double)n > 0.5 * sumsq) {  /* |mean| dominates: two passes */
        float mean = (float)(sum / (double)n);
        css = 0.0;
        for (int64_t i = 0; i < n; i++) { double d = x[i] - mean; css += d * d; }
    }
    row[0] = (double)n; row[1] = n ? lo : NAN; row[2] = n ? hi : NAN; row[3] = sum; row[4] = sumsq;
    row[5] = css > 0.0 ? css : 0.0; row[6] = 0.0; row[7] = 0.0; row[8] = (double)zeros;
    for (int64_t j = 0; j < k; j++) samples[j] = x[idx[j]];
    return top >= 0x7f800000;
}

/* sums[j] = the n[j] 32-bit values at address x[j] summed as unsigned (wrapping: the same as int32). */
TARGETS
void ortlab_sums_i32(const int64_t *x, const int64_t *n, int64_t count, uint32_t *sums) {
    for (int64_t j = 0; j < count; j++) {
        const uint32_t *v = (const uint32_t *)(intptr_t)x[j];
        uint32_t s = 0;
        for (int64_t i = 0; i < n[j]; i++) s += v[i];
        sums[j] = s;
    }
}

#ifdef ORTLAB_EXTENSION
#define PY_SSIZE_T_CLEAN
#include <Python.h>
/* args[0..count) into v as C integers (addresses and sizes arrive as Python ints); 0 with a TypeError naming
   `usage` when there are not `count` of them or one is not an int. */
static int ints(PyObject *const *args, Py_ssize_t nargs, int count, long long *v, const char *usage) {
    if (nargs != count) {
        PyErr_SetString(PyExc_TypeError, usage);
        return 0;
    }
    for (int i = 0; i < count; i++) {
        v[i] = PyLong_AsLongLong(args[i]);
        if (v[i] == -1 && PyErr_Occurred()) return 0;
    }
    return 1;
}
/* stats_f32(x, n, idx, k, row, samples). The GIL stays held: a call takes microseconds, and handing the GIL to
   another thread could make it wait for that thread's switch interval. */
static PyObject *stats_f32(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long v[6];
    if (!ints(args, nargs, 6, v, "stats_f32 takes 6 ints: x, n, idx, k, row, samples")) return NULL;
    int bad = ortlab_stats_f32((const float *)(intptr_t)v[0], v[1], (const int64_t *)(intptr_t)v[2], v[3],
                               (double *)(intptr_t)v[4], (float *)(intptr_t)v[5]);
    return PyBool_FromLong(bad);
}
/* sums_i32(x, n, count, sums). */
static PyObject *sums_i32(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long v[4];
    if (!ints(args, nargs, 4, v, "sums_i32 takes 4 ints: x, n, count, sums")) return NULL;
    ortlab_sums_i32((const int64_t *)(intptr_t)v[0], (const int64_t *)(intptr_t)v[1], v[2],
                    (uint32_t *)(intptr_t)v[3]);
    Py_RETURN_NONE;
}
static PyMethodDef methods[] = {{"stats_f32", (PyCFunction)(void (*)(void))stats_f32, METH_FASTCALL, NULL},
                                {"sums_i32", (PyCFunction)(void (*)(void))sums_i32, METH_FASTCALL, NULL},
                                {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "MODULE", NULL, -1, methods};
PyMODINIT_FUNC PyInit_MODULE(void) { return PyModule_Create(&module); }
#endif
"""
# Reassociating float sums is what lets the compiler vectorize them; nothing here relies on nan/inf semantics
# of float arithmetic (the nan/inf test uses the bit patterns).
FLAGS = ["-O3", "-fPIC", "-shared", "-fno-math-errno", "-fno-trapping-math", "-fassociative-math",
         "-fno-signed-zeros"]
TARGET_CLONES = '__attribute__((target_clones("avx512f", "avx2", "default")))'

_loaded: object = None  # None: not tried yet; False: unavailable


def _cache_dir() -> Path:
    from ortlab.common.cache import cache_root

    return cache_root() / "kernels"


def _build(source: str, target: Path, flags: list[str]) -> bool:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        return False
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            src = Path(tmp) / "stats.c"
            src.write_text(source)
            out = Path(tmp) / target.name
            subprocess.run([compiler, *flags, "-o", str(out), str(src)], check=True, capture_output=True,
                           timeout=60)
            out.replace(target)  # atomic: another worker may be building the same file
    except (OSError, subprocess.SubprocessError):  # no writable cache, or the compiler refused: numpy it is
        return False
    return True


def _variants():
    """(source, flags, name, loader) to try in order: the extension, then ctypes; each with the per-instruction-set
    clones, then without (a compiler or libc without ifunc support)."""
    include = sysconfig.get_paths().get("include")
    if include and (Path(include) / "Python.h").exists():
        for targets in (TARGET_CLONES, ""):
            source = SOURCE.replace("TARGETS", targets)
            flags = [*FLAGS, "-DORTLAB_EXTENSION", f"-I{include}"]
            name = "ortlab_stats_" + _key(source, flags, sys.implementation.cache_tag)
            yield source.replace("MODULE", name), flags, name, _load_extension
    for targets in (TARGET_CLONES, ""):
        source = SOURCE.replace("TARGETS", targets)
        yield source, FLAGS, "stats-" + _key(source, FLAGS), _load_ctypes


def _key(*parts: str | list[str]) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def _load_extension(path: Path, name: str):
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    module = importlib.util.module_from_spec(importlib.util.spec_from_file_location(name, path, loader=loader))
    loader.exec_module(module)
    return module


def _load_ctypes(path: Path, name: str):
    library = ctypes.CDLL(str(path))
    stats, sums = library.ortlab_stats_f32, library.ortlab_sums_i32
    stats.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                      ctypes.c_void_p]
    stats.restype = ctypes.c_int
    sums.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
    sums.restype = None
    return types.SimpleNamespace(stats_f32=stats, sums_i32=sums)


def stats_kernel():
    """The compiled `stats_f32(x, n, idx, k, row9, samples) -> nan or inf seen` (addresses as ints), or None
    without a compiler (or with ORTLAB_STATS_KERNEL=numpy)."""
    if os.environ.get("ORTLAB_STATS_KERNEL", "c") != "c":
        return None
    compiled = _compiled()
    return compiled.stats_f32 if compiled else None


def sums_kernel():
    """The compiled `sums_i32(x, n, count, sums)` (addresses of int64 arrays of data addresses and value counts,
    the count, the address of a uint32 array), or None without a compiler."""
    compiled = _compiled()
    return compiled.sums_i32 if compiled else None


def _compiled():
    global _loaded
    if _loaded is None:
        _loaded = False
        for source, flags, name, load in _variants():
            path = _cache_dir() / f"{name}.so"
            if path.exists() or _build(source, path, flags):
                try:
                    _loaded = load(path, name)
                except (OSError, ImportError):
                    continue
                break
    return _loaded or None
