"""One pass over a checkpoint weight: scales, codes in their stored layout, and the report's figures.

``gpuq quantize --format compressed-tensors`` used to run choose_qparams, quantize, unpack the
codes it had just packed, dequantize them again for the report, and repack them into
compressed-tensors' int32 words: five or six passes over every weight. :func:`weight_rows` does
it all while one group of one row is in cache, from the stored bits (bfloat16 as int16 bits,
float16 as uint16 bits through the widening table, float32 as it is):

1. the group's min and max, NaN skipped (order keys, ``loops.run_keys``; a group holding
   +/-Inf is reduced again over its finite values: the command takes parameters from the
   finite values, and 0 is in every range ``finalize_one`` forms, so replacing NaN/Inf by 0
   and skipping them give the same parameters);
2. ``loops.finalize_one``: the scale (rounded to the scale dtype) and zero point;
3. per element: the code (``loops.quantize_one`` or ``loops.fp8_of``), its dequantized value
   in float32 as ``gpuq.dequantize`` forms it (``(q - zp) * s``, or ``fp8_table[q] * s``), and
   in float64 the value and the round-trip error of the finite elements;
4. the codes packed into compressed-tensors' words (offset-binary fields, little-endian,
   ``serving.packing``) or written as fp8 bytes, and the group's sums of x^2 and of the
   error^2 and its max abs error added to the call's figures.

The per-element arithmetic is the loops' own functions (no fastmath); only the float64 sums
reassociate (:func:`_energy`: 4-wide partial sums), so the report's SQNR may differ from the
old ``einsum`` in its last digits, never a code or a scale.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .loops import _JIT, finalize_one, float_of_key, fp8_of, load, quantize_one, run_keys

_FMAX = np.float32(np.finfo(np.float32).max)


@njit(nogil=True, cache=True, boundscheck=False, fastmath={"reassoc", "nsz", "nnan"})
def _energy(a, d, n, acc):
    """``acc += (sum a^2, sum d^2)``, ``acc[2] = max(acc[2], max |d|)`` over ``a[:n]``, ``d[:n]``.

    Reassociated (vectorized) sums: the figures are float64 totals, whose order the contract
    leaves open; ``a`` and ``d`` hold no NaN (the non-finite elements are zeros here)."""
    sa = sd = m = 0.0
    for j in range(n):
        sa += a[j] * a[j]
        sd += d[j] * d[j]
        m = max(m, abs(d[j]))
    acc[0] += sa
    acc[1] += sd
    acc[2] = max(acc[2], m)


@njit(inline="always")
def _finite_range(x, table, base, g):
    """Min and max of the finite elements of ``x[base:base + g]`` with 0 among them, and the
    counts of NaN, +Inf and -Inf (the slow path of a group that holds a non-finite value)."""
    lo = hi = np.float32(0)
    nan = pos = neg = 0
    for j in range(g):
        v = np.float32(load(x, base + j, table))
        if v != v:
            nan += 1
        elif v == np.inf:
            pos += 1
        elif v == -np.inf:
            neg += 1
        else:
            lo = min(lo, v)
            hi = max(hi, v)
    return lo, hi, nan, pos, neg


@njit(**_JIT)
def weight_rows(x, table, bits, r0, r1, n, g, qmin, qmax, symmetric, eps, fmt, shift, mag, inf,
                f, values, cbits, out, scales, zps, acc, cnt, sq, sa, sd):
    """Rows ``r0:r1`` of a C-order ``[rows, n]`` weight (flat ``x``; ``bits`` its signed-integer
    view), groups of ``g`` along a row (``g == n``: per channel), in one pass.

    Int codes (``f`` None): ``out`` is uint32 words, ``ceil(n * cbits / 32)`` a row, each group
    starting on a word (``g`` a multiple of ``32 // cbits``, or one group a row). fp8 codes
    (``f`` = ``formats.fp8_consts``, ``values`` = ``formats.fp8_table``): ``out`` is the bytes,
    ``n`` a row. ``scales``/``zps`` (zps None: symmetric) get one slot per group; ``acc``
    (float64: signal, error, max abs error) and ``cnt`` (int64: NaN, +Inf, -Inf) are added to;
    ``sq``/``sa``/``sd`` are scratch of ``g`` elements. Returns the first row whose parameters
    ``finalize_one`` refuses (nothing of it written), or -1.
    """
    groups = n // g
    per = 32 // cbits
    half = np.int32(1 << (cbits - 1))
    nw = -(-n // per)
    lo_q, hi_q = np.float32(qmin), np.float32(qmax)
    for r in range(r0, r1):
        for gi in range(groups):
            base = r * n + gi * g
            ka, kb = run_keys(bits, base, g, shift, mag, inf)
            lo = np.float32(float_of_key(ka, bits, shift, mag, table))
            hi = np.float32(float_of_key(kb, bits, shift, mag, table))
            if lo == -np.inf or hi == np.inf:  # parameters of the finite values
                lo, hi, _, _, _ = _finite_range(x, table, base, g)
            scale, zp, ok = finalize_one(lo, hi, qmin, qmax, symmetric, eps, fmt)
            if not ok:
                return r
            slot = r * groups + gi
            scales[slot] = scale
            if zps is not None:
                zps[slot] = zp
            s, z = scale, np.float32(zp)
            bad = 0
            if f is None:
                for j in range(g):
                    v = load(x, base + j, table)
                    q = quantize_one(v, s, z, lo_q, hi_q)
                    sq[j] = q
                    fin = abs(v) <= _FMAX
                    a = np.float64(v)
                    sa[j] = a if fin else 0.0
                    sd[j] = a - np.float64((np.float32(q) - z) * s) if fin else 0.0
                    bad += not fin
                w0 = r * nw + gi * g // per
                for w in range(-(-g // per)):
                    word = np.uint32(0)
                    for k in range(per):
                        e = w * per + k
                        if e < g:
                            word |= np.uint32(sq[e] + half) << np.uint32(k * cbits)
                    out[w0 + w] = word
            else:
                for j in range(g):
                    v = load(x, base + j, table)
                    c = fp8_of(v, s, f)
                    out[base + j] = c
                    fin = abs(v) <= _FMAX
                    a = np.float64(v)
                    sa[j] = a if fin else 0.0
                    sd[j] = a - np.float64(values[c] * s) if fin else 0.0
                    bad += not fin
            if bad:
                _, _, nan, pos, neg = _finite_range(x, table, base, g)
                cnt[0] += nan
                cnt[1] += pos
                cnt[2] += neg
            _energy(sa, sd, g, acc)
    return -1
