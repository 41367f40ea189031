"""The compiled loops of the MSE search (numba): the error of every candidate of every block.

:mod:`.mse` cuts the tensor into tiles of whole blocks (or pieces of one long block), each a
contiguous ``(rows, run)`` array in the blocks' C order, and computes every candidate's scale
and zero point; these loops add, for each row ``r`` and candidate ``c``, the squared errors of
the row's elements to ``errs[r, c]``, one element after the other: the float64 sum of the
contract (``gpuq.qparams``), in its order, so tiles of one long block chain exactly.

Why these are the contract's bits: the element operations are those of :mod:`.loops`
(``load``, ``to_compute``, ``fp8_one``): one IEEE division in the compute type, ``rint`` half
to even, the zero point added and the clamp on integral floats (exact), ``(q - zp) * s`` one
multiplication; then ``d = float64(x) - float64(y)``, ``d * d`` and the addition are separate
float64 operations (fastmath off: LLVM contracts nothing into a fused multiply-add, and
reassociates nothing). The loop over candidates is innermost: candidates are independent sums,
so it vectorizes without changing any sum's order (an element loop with one running sum
cannot).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .loops import fp8_one, load, to_compute

_JIT = dict(nogil=True, cache=True, boundscheck=False, error_model="numpy")


@njit(**_JIT)
def affine_errors(x, table, run, scales, zps, qmin, qmax, errs, c0, c1):
    """``errs[r, c] +=`` the squared errors of row ``r`` of flat ``x`` (rows of ``run``) under
    candidate ``c`` in ``[c0, c1)``: ``scales``/``zps`` ``(rows, candidates)`` in the compute
    type (zps integral), codes ``clamp(rint(x / s) + zp, qmin, qmax)``; NaN skipped."""
    nc = c1 - c0
    s = np.empty(nc, scales.dtype)
    z = np.empty(nc, scales.dtype)
    acc = np.empty(nc, np.float64)
    lo, hi = to_compute(qmin, scales[0, 0]), to_compute(qmax, scales[0, 0])
    for r in range(errs.shape[0]):
        for c in range(nc):
            s[c], z[c], acc[c] = scales[r, c0 + c], zps[r, c0 + c], errs[r, c0 + c]
        base = r * run
        for j in range(run):
            v = load(x, base + j, table)
            if v != v:  # NaN: not a number of the block
                continue
            vd = np.float64(v)
            for c in range(nc):
                q = min(max(np.rint(v / s[c]) + z[c], lo), hi)
                d = vd - np.float64((q - z[c]) * s[c])
                acc[c] = acc[c] + d * d
        for c in range(nc):
            errs[r, c0 + c] = acc[c]


@njit(**_JIT)
def fp8_errors(x, table, run, scales, values, f, errs, c0, c1):
    """As :func:`affine_errors` for fp8 codes: ``fp8(float32(x / s))`` saturating (``f`` is
    ``formats.fp8_consts``), dequantized as ``values[code] * s`` (``values``:
    ``formats.fp8_table`` in the compute type)."""
    nc = c1 - c0
    s = np.empty(nc, scales.dtype)
    acc = np.empty(nc, np.float64)
    for r in range(errs.shape[0]):
        for c in range(nc):
            s[c], acc[c] = scales[r, c0 + c], errs[r, c0 + c]
        base = r * run
        for j in range(run):
            v = load(x, base + j, table)
            if v != v:
                continue
            vd = np.float64(v)
            for c in range(nc):
                d = vd - np.float64(values[fp8_one(np.float32(v / s[c]), f)] * s[c])
                acc[c] = acc[c] + d * d
        for c in range(nc):
            errs[r, c0 + c] = acc[c]
