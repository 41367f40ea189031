"""Compiled host kernels: DESIGN.md section 1 as one fused loop per block (numba).

The NumPy backend spends 4-5 ufunc passes per block and hands the GIL back and
forth between them; these kernels read every element once, write its result
once and hold no GIL while they run, so a block costs what its memory traffic
costs. They are optional: the NumPy backend uses them when numba is importable
(the ``fast`` extra) and ``GPUQ_HOST_KERNELS`` is not ``numpy``, for the block
layouts that are flat (``_blocks.runs``), and returns the same bits either
way (the test suite runs every host test on both).

Why the arithmetic is the contract's, bit for bit (zero points arrive as
integral floats of the compute type, ``|zp| <= 2**21``; wider ones stay on the
ufunc path, ``numpy_backend._quantize_wide``):

* numba types ``a / b`` and ``a * b`` of two float32 values as float32: one
  IEEE operation (float64 input and output compute in float64).
* Quantize is ``clamp(rint(x / s) + zp, qmin, qmax)`` in the compute type,
  NaN taken as 0 first. ``np.rint`` rounds half to even. The sum of two
  integers is exact while it is below 2**24 in magnitude; beyond, it is far
  outside [qmin, qmax] and rounding (monotonic) keeps it on its side, so the
  clamp saturates it as the integer sum would. Infinities saturate the same way.
* Dequantize converts ``q`` exactly and subtracts ``zp`` exactly
  (``|q - zp| < 2**22``), then multiplies once.
* float16 input is widened by a table lookup (exact); float16 output is
  rounded to nearest even by :func:`float16_bits` (equal to NumPy's cast on
  all 2**32 float32 patterns, checked once; the suite checks every rounding
  boundary). fastmath is off: no reassociation, no flush of subnormals.

Every kernel takes a flat block and ``run``: element ``i`` uses parameter
``(i // run) % nparams`` (``_blocks.runs`` finds that form). A per-tensor block
is one run, rows of a per-channel block are runs, and ``run == 1`` (one
parameter per element, the pattern repeating every ``nparams``) is its own
loop so that the compiler vectorizes it.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import overload

_JIT = dict(nogil=True, cache=True, boundscheck=False, error_model="numpy")


def to_compute(value, like):
    """``value`` (an integer or a float) converted to the dtype of ``like`` (float32 or float64)."""


@overload(to_compute, inline="always")
def _to_compute(value, like):
    if like == types.float32:
        return lambda value, like: np.float32(value)
    return lambda value, like: value


def load(x, i, table):
    """Element ``i`` of ``x`` in the compute type: ``table[x[i]]`` for float16 bits."""


@overload(load, inline="always")
def _load(x, i, table):
    if isinstance(table, types.NoneType):
        return lambda x, i, table: x[i]
    return lambda x, i, table: table[x[i]]


def param(p, i, default):
    """``p[i]``, or ``default`` where there is no parameter array (symmetric)."""


@overload(param, inline="always")
def _param(p, i, default):
    if isinstance(p, types.NoneType):
        return lambda p, i, default: default
    return lambda p, i, default: p[i]


def store(out, i, value):
    """``out[i] = value``; a uint16 ``out`` holds float16 bits."""


@overload(store)
def _store(out, i, value):
    if out.dtype == types.uint16:
        def store_half(out, i, value):
            out[i] = float16_bits(np.float32(value))
        return store_half

    def store_plain(out, i, value):
        out[i] = value
    return store_plain


@njit
def float16_bits(f):
    """The float16 bits of float32 ``f``, rounded to nearest even (NumPy's cast)."""
    b = np.uint32(np.float32(f).view(np.uint32))
    sign = np.uint32((b >> np.uint32(16)) & np.uint32(0x8000))
    a = b & np.uint32(0x7FFFFFFF)
    if a > np.uint32(0x7F800000):  # NaN: keep it quiet
        return np.uint16(sign | np.uint32(0x7E00))
    if a >= np.uint32(0x477FF000):  # >= 65520 rounds to +/-inf
        return np.uint16(sign | np.uint32(0x7C00))
    if a < np.uint32(0x38800000):  # below 2**-14: a multiple of 2**-24, exact scaling
        return np.uint16(sign | np.uint32(np.rint(abs(np.float32(f)) * np.float32(2.0**24))))
    a = a - np.uint32(0x38000000)  # rebias the exponent from 127 to 15
    a = a + np.uint32(0xFFF) + ((a >> np.uint32(13)) & np.uint32(1))  # half to even on 13 bits
    return np.uint16(sign | (a >> np.uint32(13)))


@njit(inline="always")
def quantize_one(v, s, zp, qmin, qmax):
    """``clamp(rint(v / s) + zp, qmin, qmax)``; ``zp``, ``qmin``, ``qmax`` integral, of ``s``'s type."""
    t = v / s
    if t != t:  # NaN is taken as 0
        t = s - s
    return np.int32(min(max(np.rint(t) + zp, qmin), qmax))


@njit(**_JIT)
def quantize(x, table, out, run, scales, zps, qmin, qmax):
    """Codes of flat ``x`` into ``out``; element ``i`` uses parameter ``(i // run) % scales.size``."""
    nparams = scales.size
    zero, lo, hi = to_compute(0, scales[0]), to_compute(qmin, scales[0]), to_compute(qmax, scales[0])
    if run == 1:
        for k in range(0, x.size, nparams):
            xk, outk = x[k:k + nparams], out[k:k + nparams]
            for j in range(xk.size):
                outk[j] = quantize_one(load(xk, j, table), scales[j], param(zps, j, zero), lo, hi)
        return
    for r in range(-(-x.size // run)):
        s, zp = scales[r % nparams], param(zps, r % nparams, zero)
        base = r * run
        if base + run <= x.size:
            # The loop with the trip count ``run`` vectorizes; one whose bound
            # depends on the run (the short last one, a min()) does not: 8x slower.
            for j in range(run):
                out[base + j] = quantize_one(load(x, base + j, table), s, zp, lo, hi)
        else:
            for j in range(x.size - base):
                out[base + j] = quantize_one(load(x, base + j, table), s, zp, lo, hi)


@njit(**_JIT)
def dequantize(q, out, run, scales, zps):
    """``(q - zp) * s`` of flat ``q`` into ``out``; element ``i`` uses parameter ``(i // run) % scales.size``."""
    nparams = scales.size
    zero = to_compute(0, scales[0])
    if run == 1:
        for k in range(0, q.size, nparams):
            qk, outk = q[k:k + nparams], out[k:k + nparams]
            for j in range(qk.size):
                store(outk, j, (to_compute(qk[j], zero) - param(zps, j, zero)) * scales[j])
        return
    for r in range(-(-q.size // run)):
        s, zp = scales[r % nparams], param(zps, r % nparams, zero)
        base = r * run
        if base + run <= q.size:
            for j in range(run):
                store(out, base + j, (to_compute(q[base + j], zero) - zp) * s)
        else:
            for j in range(q.size - base):
                store(out, base + j, (to_compute(q[base + j], zero) - zp) * s)
