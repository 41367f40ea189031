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
3. per element: the code (``loops.quantize_one``, or :func:`float_round`: ``loops.fp8_of``'s
   bits), its dequantized value in float32 as ``gpuq.dequantize`` forms it (``(q - zp) * s``, or
   ``fp8_table[q] * s``, the table's value formed from the same rounded bits) into a float32
   row, and from it and the input, in float64, the sums of the finite elements (:func:`_figures`);
4. the codes packed into compressed-tensors' words (offset-binary fields, little-endian,
   ``serving.packing``) or written as fp8 bytes, and the group's sums of x^2 and of the
   error^2 and its max abs error added to the call's figures.

:func:`micro_rows` does the same for float codes under scales chosen per group by a rule (MX's
e8m0 and NVFP4's e4m3 scales: compressed-tensors' microscaling layouts, gpt-oss's experts): a
row's groups' ``max |x|`` by their magnitude bits and the rule's scale bytes first, then the
row's codes packed in their stored bytes (fp4 two a byte, fp6 four in three), the figures.

The per-element arithmetic is the loops' own functions or ones proven equal to them on every
float32 input (no fastmath); only the float64 sums reassociate (:func:`_energy`,
:func:`_energy_of`: 4-wide partial sums), so the report's SQNR may differ from the old
``einsum`` in its last digits, never a code or a scale.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import overload

from ..._dtypes import dtype_name
from . import formats, threads
from .formats import round_consts
from .affine import kernel_input, readonly
from .loops import (JIT, finalize_one, float_of_key, fp8_one, load, quantize_one, round_scale,
                    run_keys)
from .qparams import KEY_INT, SCALE_FORMATS, key_constants

_FMAX = np.float32(np.finfo(np.float32).max)


@njit(nogil=True, cache=True, boundscheck=False, fastmath={"reassoc", "nsz", "nnan"})
def _energy(a, d, n, acc):
    """``acc += (sum a^2, sum d^2)``, ``acc[2] = max(acc[2], max |d|)`` over ``a[:n]``, ``d[:n]``.

    Reassociated (vectorized) sums: the figures are float64 totals, whose order the contract
    leaves open; ``a`` and ``d`` hold no NaN (the non-finite elements are zeros here)."""
    sa = sd = 0.0
    top = np.int64(0)
    for j in range(n):
        sa += a[j] * a[j]
        sd += d[j] * d[j]
        # max |d| through its bits: non-negative floats order as integers, an integer max
        # vectorizes where a float one does not
        top = max(top, np.float64(abs(d[j])).view(np.int64))
    acc[0] += sa
    acc[1] += sd
    acc[2] = max(acc[2], np.int64(top).view(np.float64))


@njit(nogil=True, cache=True, boundscheck=False, fastmath={"reassoc", "nsz", "nnan"})
def _energy_of(xs, table, sv, n, acc):
    """:func:`_energy` of ``a = xs[:n]`` (``loops.load``, exactly widened) and ``d = a - sv[:n]``
    (the float32 dequantized values), formed in the sums' loop: no float64 scratch written and
    read again. Only for segments with no NaN or Inf (``sv`` from finite ``xs``)."""
    sa = sd = 0.0
    top = np.int64(0)
    for j in range(n):
        a = np.float64(load(xs, j, table))
        d = a - np.float64(sv[j])
        sa += a * a
        sd += d * d
        top = max(top, np.float64(abs(d)).view(np.int64))
    acc[0] += sa
    acc[1] += sd
    acc[2] = max(acc[2], np.int64(top).view(np.float64))


@njit(inline="always")
def _magnitude(b, mag):
    """The largest magnitude bits of ``b`` (integer views of floats): NaN and Inf have the
    largest ones, so the result is below Inf's exactly when every element is finite."""
    top = b[0] & mag
    for j in range(b.size):
        top = max(top, b[j] & mag)
    return top


@njit(inline="always")
def _pack_fields(sq, g, ob):
    """Offset-binary fields ``sq[:g]`` (uint8) of 4 bits into bytes ``ob``, two a byte, the
    first in the low nibble: viewed as little-endian uint32, element ``k`` of a word sits at
    bit ``4 * k``, as ``serving.packing.pack_rows`` has it. An odd ``g`` (one group a row)
    leaves its last nibble with zero bits above it, the row's padding."""
    for j in range(g // 2):
        ob[j] = sq[2 * j] | (sq[2 * j + 1] << np.uint8(4))
    if g % 2:
        ob[g // 2] = sq[g - 1]


@njit(inline="always")
def float_round(v, s, g):
    """``(code, value)`` of ``v / s`` in a saturating float code (``g`` = :func:`round_consts`):
    ``loops.fp8_of``'s code (a NaN quotient takes ``v``'s sign, as there) and the code's value
    in float32 as ``formats.fp8_table`` holds it, from the same rounded bits: no table lookup,
    32-bit lanes, so the loop over it vectorizes.

    The magnitude ``a`` is rounded to nearest even on the code's grid by a float addition:
    ``(a + M) - M`` with ``M = 2**e * mul`` (``e`` the exponent of ``a``: the sum's last bit
    is the code's last mantissa bit), at least ``low`` (the subnormal step's magic), each step
    exact but the one rounding; above ``limit`` (Inf included) the largest value. The code is
    the bits of ``r * 2**(B - 127)`` (the exponent rebased from float32's bias to the code's;
    a subnormal code's value lands on a float32 subnormal, exactly) shifted down by ``shift``.
    Equal to ``fp8_of`` and to the table on every float32 quotient (all 2**32 checked once, for
    each layout; tests/test_fp8_encode_bits.py checks a sample)."""
    mul, low, rebase, limit, shift, nan_code, sshift, sbit, nan_sign, nan_value = g
    t = np.float32(v / s)
    t = np.float32(np.copysign(t, v)) if t != t else t
    a = abs(t)
    m = np.int32(np.float32(a).view(np.int32) & np.int32(0x7F800000)).view(np.float32) * mul
    m = m if m > low else low
    r = (a + m) - m
    r = limit if a > limit else r
    u = np.float32(t).view(np.int32)
    sign = (u >> sshift) & sbit
    nan = a != a
    code = np.int32(np.float32(r * rebase).view(np.int32) >> shift)
    code = (nan_code | (sign & nan_sign)) if nan else (code | sign)
    top = u & np.int32(-0x80000000)
    value = np.int32(np.float32(r).view(np.int32) | top).view(np.float32)
    if nan:
        value = np.int32(np.float32(nan_value).view(np.int32) | (top if nan_sign else np.int32(0))).view(np.float32)
    return np.uint8(code), value


@njit(inline="always")
def e2m1_round(v, s):
    """``(code, value)`` of ``v / s`` in fp4 (e2m1): ``loops.e2m1_of``'s code and the code's
    value in float32 (``formats.fp8_table("e2m1fn", ...)``'s) from the same ``rint``: the
    magnitude's value is ``rint(a * step) / step`` (exact: ``step`` a power of two) up to 6, the
    sign the code's (NaN: the +0 code, value +0). All 2**32 quotients checked once."""
    t = np.float32(v / s)
    a = abs(t)
    low, mid = a < np.float32(2), a < np.float32(4)
    step = np.float32(2) if low else (np.float32(1) if mid else np.float32(0.5))
    inv = np.float32(0.5) if low else (np.float32(1) if mid else np.float32(2))
    first = np.float32(0) if low else (np.float32(2) if mid else np.float32(4))
    k = np.rint(a * step)
    c = min(k + first, np.float32(7))
    m = min(k * inv, np.float32(6))
    nan = a != a
    c = np.float32(0) if nan else c
    m = np.float32(0) if nan else m
    neg = np.signbit(t) and not nan
    return np.uint8(c + (np.float32(8) if neg else np.float32(0))), -m if neg else m


@njit(inline="always")
def _fp8_segment(xs, os, s, g, table, w, sv):
    """Float codes ``os`` of the ``w`` elements of ``xs`` at scale ``s`` (:func:`float_round`
    with ``g``, or fp4's :func:`e2m1_round` where ``g`` is None: the same bits, faster), and
    their dequantized values ``value * s`` in float32 as ``gpuq.dequantize`` forms them into
    ``sv`` (float32: the loop stays in 32-bit lanes, 8 an AVX2 instruction; storing float64
    there halved its width, and measured no faster than the old table lookup)."""
    if g is None:
        for j in range(w):
            q, value = e2m1_round(load(xs, j, table), s)
            os[j] = q
            sv[j] = value * s
    else:
        for j in range(w):
            q, value = float_round(load(xs, j, table), s, g)
            os[j] = q
            sv[j] = value * s


@njit(inline="always")
def _figures(xs, table, sv, w, sa, sd, bad, acc, cnt):
    """Add the figures of ``xs[:w]`` against its dequantized values ``sv[:w]`` (float32) to
    ``acc``: straight from both (:func:`_energy_of`), or, where the segment holds a NaN or
    +/-Inf (``bad``, rare), through the float64 scratch ``sa``/``sd`` with the non-finite
    elements left out and counted in ``cnt``."""
    if not bad:
        _energy_of(xs, table, sv, w, acc)
        return
    for j in range(w):
        a = np.float64(load(xs, j, table))
        sa[j] = a
        sd[j] = a - np.float64(sv[j])
    _drop_nonfinite(xs, table, w, sa, sd, cnt)
    _energy(sa, sd, w, acc)


@njit(inline="always")
def _drop_nonfinite(xs, table, w, sa, sd, cnt):
    """Leave the non-finite elements of ``xs[:w]`` out of the figures, and add their counts
    (NaN, +Inf, -Inf) to ``cnt``."""
    for j in range(w):
        if not abs(load(xs, j, table)) <= _FMAX:
            sa[j] = sd[j] = 0.0
    _, _, nan, pos, neg = _finite_range(xs, table, 0, w)
    cnt[0] += nan
    cnt[1] += pos
    cnt[2] += neg


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


@njit(**JIT)
def weight_rows(x, table, bits, r0, r1, n, g, qmin, qmax, symmetric, eps, fmt, shift, mag, inf,
                f, cbits, bias, rb, out, scales, zps, acc, cnt, sq, sv, sa, sd, tensor, given):
    """Rows ``r0:r1`` of a C-order ``[rows, n]`` weight (flat ``x``; ``bits`` its signed-integer
    view), groups of ``g`` along a row (``g == n``: per channel), in one pass.

    Int codes (``f`` None): ``out`` holds ``rb`` bytes a row, each group starting on a byte;
    a code's field is ``(q + bias) & (2**cbits - 1)``, two 4-bit fields a byte, the first in the
    low nibble. compressed-tensors' words: ``rb = 4 * ceil(n * cbits / 32)``, ``bias =
    2**(cbits - 1)`` (offset binary), the rest of a row's last word zeroed; gpuq's files:
    ``rb = n * cbits / 8``, ``bias = 0`` (two's complement, or the unsigned code). fp8 codes
    (``f`` = :func:`round_consts`): ``out`` is the bytes,
    ``n`` a row. ``scales``/``zps`` (zps None: symmetric) get one slot per group; ``acc``
    (float64: signal, error, max abs error) and ``cnt`` (int64: NaN, +Inf, -Inf) are added to;
    ``sq`` (uint8), ``sv`` (float32), ``sa``/``sd`` (float64) are scratch of ``g`` elements. ``tensor`` True:
    one scale (and zp) for the whole weight, given in ``scales[0]`` (``zps[0]``), ``g == n``;
    ``given`` True: every group's scale (and zp) is given in its slot (the MSE search's).
    Returns the first row whose parameters ``finalize_one`` refuses (nothing of it written), or -1.
    """
    groups = n // g
    mask = np.int32((1 << cbits) - 1)
    out_bytes = out.view(np.uint8)
    lo_q, hi_q = np.float32(qmin), np.float32(qmax)
    used = -(-n * cbits // 8)  # bytes of a row's fields: the rest of its last word is padding
    for r in range(r0, r1):
        if f is None:
            for k in range(r * rb + used, (r + 1) * rb):  # the buffer is reused: zero it
                out_bytes[k] = 0
        for gi in range(groups):
            base = r * n + gi * g
            # Slices, not x[base + j]: the loops over them vectorize (measured: 2-3x).
            xs, bs = x[base:base + g], bits[base:base + g]
            top = _magnitude(bs, mag)
            bad = top >= inf
            if tensor or given:  # chosen already: by tensor_range and the caller, or the search
                lo = hi = np.float32(0)
            elif bad:  # parameters of the finite values
                lo, hi, _, _, _ = _finite_range(xs, table, 0, g)
            elif symmetric:
                # max |x| (no NaN/Inf here): finalize_one forms the same amax from (-amax, amax)
                # as from the min and max (an integer max, which vectorizes).
                hi = np.float32(float_of_key(top, bits, shift, mag, table))
                lo = -hi
            else:
                ka, kb = run_keys(bs, 0, g, shift, mag, inf)
                lo = np.float32(float_of_key(ka, bits, shift, mag, table))
                hi = np.float32(float_of_key(kb, bits, shift, mag, table))
            if tensor or given:
                slot = 0 if tensor else r * groups + gi
                scale, zp = scales[slot], np.int32(0) if zps is None else zps[slot]
            else:
                scale, zp, ok = finalize_one(lo, hi, qmin, qmax, symmetric, eps, fmt)
                if not ok:
                    return r
                slot = r * groups + gi
                scales[slot] = scale
                if zps is not None:
                    zps[slot] = zp
            s, z = scale, np.float32(zp)
            if f is None:
                # The codes' fields ((q + bias) & mask) as bytes: 8-bit ones are the stored bytes
                # themselves, 4-bit ones are paired up after the loop.
                ob = out_bytes[r * rb + gi * g * cbits // 8:]
                fs = ob if cbits == 8 else sq
                for j in range(g):
                    q = quantize_one(load(xs, j, table), s, z, lo_q, hi_q)
                    fs[j] = np.uint8((q + bias) & mask)
                    sv[j] = (np.float32(q) - z) * s
                if cbits == 4:
                    _pack_fields(sq, g, ob)
            else:
                _fp8_segment(xs, out[base:base + g], s, f, table, g, sv)
            _figures(xs, table, sv, g, sa, sd, bad, acc, cnt)
    return -1


@njit(**JIT)
def tensor_range(x, table, bits, n, shift, mag, inf):
    """``(lo, hi)`` (float32) of a whole flat weight for one per-tensor scale, row by row of
    ``n``: its min and max (NaN skipped, order keys), or, where it holds a NaN or +/-Inf, the
    min and max of its finite values with 0 among them (the parameters' rule above)."""
    lo = hi = np.float32(0)
    first = True
    bad = False
    for r in range(x.size // n):
        bs = bits[r * n:(r + 1) * n]
        if _magnitude(bs, mag) >= inf:
            bad = True
            break
        ka, kb = run_keys(bs, 0, n, shift, mag, inf)
        a = np.float32(float_of_key(ka, bits, shift, mag, table))
        b = np.float32(float_of_key(kb, bits, shift, mag, table))
        lo, hi = (a, b) if first else (min(lo, a), max(hi, b))
        first = False
    if bad:
        lo, hi, _, _, _ = _finite_range(x, table, 0, x.size)
    return lo, hi


def quantize_rows(x, code, symmetric, eps, scale_dtype, g, tensor, out, packing="words", given=None):
    """One pass over a C-order 2-D weight ``x`` (bfloat16, float16 or float32): codes of
    ``code`` (a ``gpuq._codetypes`` row: int or fp8) into ``out``, groups of ``g`` along a row,
    one scale for the whole weight where ``tensor``; ``symmetric``, ``eps`` and ``scale_dtype``
    as ``gpuq._qoptions.validate`` hands them on. Rows are shared among the host threads.

    ``out`` holds fp8 bytes, or int codes as ``packing`` says (:func:`weight_rows`):
    ``"words"``, compressed-tensors' offset-binary fields in uint32 words, each row starting
    on a word; ``"bytes"``, gpuq's files: int8/uint8 bytes, or int4/uint4 nibbles packed over
    the C-order flattened weight (ONNX's order; ``n`` even, so each row starts on a byte).

    ``given`` ``(scales, zps)``: the parameters chosen already (``--calibrate mse``: the
    search's, one a group or one; zps None for symmetric signed codes), which the pass takes
    as they are (the codes and figures only).

    Returns ``(scales, zps, (signal, error, max_abs_error), counts)`` (float32 scales, one a
    group or one; int32 zps, or None for symmetric signed codes, whose zero point is 0; the
    float64 figures of the finite elements; NaN/+Inf/-Inf counts), or None where
    ``finalize_one`` refuses a scale (nothing to trust in ``out``).

    >>> from gpuq._codetypes import code_type
    >>> out = np.empty((1, 1), np.uint32)
    >>> s, z, figures, counts = quantize_rows(np.float32([[7.0, -3.5]]), code_type("int4"), True,
    ...                                       np.float32(1e-38), "float32", 2, False, out)
    >>> s.tolist(), hex(int(out[0, 0])), figures, counts
    ([1.0], '0x4f', (61.25, 0.25, 0.5), {'nan': 0, 'posinf': 0, 'neginf': 0})
    """
    rows, n = x.shape
    flat, table, bits, (shift, mag, inf) = _views(x)
    symmetric = int(symmetric)  # 0, 1, or 2 (scale_rule="full"): one compiled loop for True and 1
    fmt = 0 if given is not None else SCALE_FORMATS[scale_dtype]  # given scales are not rounded again
    if code.codec == "float8":
        f, cbits = round_consts(code.fp8), 8
    else:
        f, cbits = None, code.bits
    if packing == "words":
        rb, bias = 4 * -(-n * cbits // 32), 1 << (cbits - 1)
    elif packing == "bytes" and n * cbits % 8 == 0:
        rb, bias = n * cbits // 8, 0
    else:
        raise ValueError(f"packing must be 'words', or 'bytes' with whole bytes a row, got {packing!r} "
                         f"with {n} codes of {cbits} bits a row")
    slots = 1 if tensor else rows * (n // g)
    scales = np.empty(slots, np.float32)
    # symmetric unsigned codes have a zero point too (the middle of the range)
    zps = None if symmetric and code.qmin < 0 else np.empty(slots, np.int32)
    if given is not None:
        scales[:] = np.asarray(given[0], np.float32).reshape(-1)
        if zps is not None:
            zps[:] = np.asarray(given[1]).reshape(-1)
    elif tensor:  # the one scale first: a reduction over the whole weight
        lo, hi = tensor_range(flat, table, bits, n, shift, mag, inf)
        # float32 arguments: Python floats would compile the float64 formula
        scale, zp, ok = finalize_one(np.float32(lo), np.float32(hi), code.qmin, code.qmax, symmetric,
                                     np.float32(eps), fmt)
        if not ok:
            return None
        scales[0] = scale
        if zps is not None:
            zps[0] = zp
    chunks = _chunks(rows, n, threads.get_num_threads())
    accs = [np.zeros(3) for _ in chunks]
    cnts = [np.zeros(3, np.int64) for _ in chunks]

    def run(i):
        r0, r1 = chunks[i]
        sq, sv, sa, sd = np.empty(g, np.uint8), np.empty(g, np.float32), np.empty(g), np.empty(g)
        return weight_rows(flat, table, bits, r0, r1, n, g, code.qmin, code.qmax, symmetric, np.float32(eps),
                           fmt, shift, mag, inf, f, cbits, np.int32(bias), rb, out.reshape(-1), scales, zps,
                           accs[i], cnts[i], sq, sv, sa, sd, tensor, given is not None)

    failed = _run_chunks(run, len(chunks))
    if any(r >= 0 for r in failed):
        return None
    return scales, zps, _totals(accs), _counts(cnts)


@njit(**JIT)
def block_strips(x, table, bits, s0, s1, rows, n, br, bc, qmin, qmax, symmetric, eps, fmt, shift, mag, inf,
                 f, out, scales, acc, cnt, sv, sa, sd, tops):
    """Strips ``s0:s1`` (``br`` rows each, the last ragged) of a C-order ``[rows, n]`` weight in
    fp8 blocks of ``br`` x ``bc`` (fine-grained fp8), one strip at a time while it is in cache:

    1. each block's max magnitude, through the bits (:func:`_magnitude`); a block holding NaN or
       +/-Inf takes the range of its finite values (:func:`_finite_range`), as the rows do;
    2. ``finalize_one``: its scale, in ``scales`` (the ``[ceil(rows / br), ceil(n / bc)]`` grid, flat);
    3. the codes (``fp8_of``) into ``out`` (bytes, the weight's shape) and the figures, as
       :func:`weight_rows` forms them (the code's value times ``s`` in float32; ``acc``, ``cnt`` added to).

    ``sv`` (float32), ``sa``/``sd`` (float64) are scratch of ``bc`` elements, ``tops`` of ``ceil(n / bc)`` in ``bits``'
    type. Returns the first strip whose scale ``finalize_one`` refuses, or -1.
    """
    cols = -(-n // bc)
    for si in range(s0, s1):
        r0, r1 = si * br, min(rows, (si + 1) * br)
        for c in range(cols):
            tops[c] = 0
        for r in range(r0, r1):
            for c in range(cols):
                c0 = r * n + c * bc
                tops[c] = max(tops[c], _magnitude(bits[c0:r * n + min(n, (c + 1) * bc)], mag))
        for c in range(cols):
            w = min(n, (c + 1) * bc) - c * bc
            if tops[c] >= inf:  # the finite values' range, with 0 in it
                lo = hi = np.float32(0)
                for r in range(r0, r1):
                    a, b, _, _, _ = _finite_range(x, table, r * n + c * bc, w)
                    lo, hi = min(lo, a), max(hi, b)
            else:
                hi = np.float32(float_of_key(tops[c], bits, shift, mag, table))
                lo = -hi
            scale, _, ok = finalize_one(lo, hi, qmin, qmax, symmetric, eps, fmt)
            if not ok:
                return si
            scales[si * cols + c] = scale
        for r in range(r0, r1):
            for c in range(cols):
                c0 = r * n + c * bc
                w = min(n, (c + 1) * bc) - c * bc
                xs = x[c0:c0 + w]
                _fp8_segment(xs, out[c0:c0 + w], scales[si * cols + c], f, table, w, sv)
                _figures(xs, table, sv, w, sa, sd, tops[c] >= inf, acc, cnt)
    return -1


def quantize_blocks(x, code, symmetric, eps, scale_dtype, block, out):
    """One pass over a C-order 2-D weight ``x`` (bfloat16, float16 or float32) in fp8 ``code``
    with one scale a ``block`` (rows, columns) block (:func:`block_strips`): the codes' bytes
    into ``out`` (``x``'s shape, uint8). Strips of blocks are shared among the host threads.

    Returns ``(scales, (signal, error, max_abs_error), counts)`` (the float32 scale grid
    ``[ceil(rows / block[0]), ceil(n / block[1])]``), or None where a scale is refused.

    >>> from gpuq._codetypes import code_type
    >>> out = np.empty((1, 3), np.uint8)
    >>> s, figures, counts = quantize_blocks(np.float32([[448.0, -1.0, 3.0]]), code_type("float8_e4m3fn"),
    ...                                      True, np.float32(1e-38), "float32", (2, 2), out)
    >>> s.tolist(), out.tolist(), figures[1], counts["nan"]
    ([[1.0, 0.0066964286379516125]], [[126, 184, 126]], 0.0, 0)
    """
    rows, n = x.shape
    br, bc = (min(b, d) if b > 0 else d for b, d in zip(block, x.shape))
    flat, table, bits, (shift, mag, inf) = _views(x)
    symmetric = int(symmetric)
    f = round_consts(code.fp8)
    strips, cols = -(-rows // br), -(-n // bc)
    scales = np.empty(strips * cols, np.float32)
    chunks = _chunks(strips, br * n, threads.get_num_threads())
    accs = [np.zeros(3) for _ in chunks]
    cnts = [np.zeros(3, np.int64) for _ in chunks]

    def run(i):
        s0, s1 = chunks[i]
        return block_strips(flat, table, bits, s0, s1, rows, n, br, bc, code.qmin, code.qmax, symmetric,
                            np.float32(eps), SCALE_FORMATS[scale_dtype], shift, mag, inf, f,
                            out.reshape(-1), scales, accs[i], cnts[i], np.empty(bc, np.float32), np.empty(bc),
                            np.empty(bc), np.zeros(cols, bits.dtype))

    failed = _run_chunks(run, len(chunks))
    if any(r >= 0 for r in failed):
        return None
    return scales.reshape(strips, cols), _totals(accs), _counts(cnts)


@njit(**JIT)
def has_nonfinite(bits, mag, inf, n):
    """Whether the flat weight of integer view ``bits`` holds a NaN or +/-Inf (rows of ``n``:
    the max magnitude bits, which vectorizes): what the MSE search needs to know first."""
    for r in range(bits.size // n):
        if _magnitude(bits[r * n:(r + 1) * n], mag) >= inf:
            return True
    return False


def nonfinite_in(x) -> bool:
    """Whether the C-order 2-D ``x`` (bfloat16, float16 or float32) holds a NaN or +/-Inf.

    >>> nonfinite_in(np.float32([[1.0, np.inf]])), nonfinite_in(np.float16([[1.0, 2.0]]))
    (True, False)
    """
    _, _, bits, (_, mag, inf) = _views(x)
    return bool(has_nonfinite(bits, mag, inf, x.shape[1]))


def _run_chunks(run, k):
    """``[run(0), ..., run(k - 1)]``, all but the first on the host backend's pool."""
    if k == 1:
        return [run(0)]
    pool = threads.executor()
    futures = [pool.submit(run, i) for i in range(1, k)]
    return [run(0)] + [fu.result() for fu in futures]


def _totals(accs):
    return float(sum(a[0] for a in accs)), float(sum(a[1] for a in accs)), float(max(a[2] for a in accs))


def _counts(cnts):
    return dict(zip(("nan", "posinf", "neginf"), (int(v) for v in sum(cnts))))


#: Elements per thread below which one thread does the whole weight (a thread's start costs more).
_MIN_CHUNK = 1 << 20


def _chunks(rows: int, n: int, nthreads: int) -> list:
    """``(r0, r1)`` row ranges, one per thread, of at least ``_MIN_CHUNK`` elements each.

    >>> _chunks(10, 1 << 20, 2), _chunks(10, 16, 2)
    ([(0, 5), (5, 10)], [(0, 10)])
    """
    k = max(1, min(nthreads, rows, rows * n // _MIN_CHUNK))
    bounds = [rows * i // k for i in range(k + 1)]
    return [(bounds[i], bounds[i + 1]) for i in range(k)]


# --- fp4/fp6/fp8 codes under MX or NVFP4 scales (compressed-tensors' microscaling layouts) --------

@njit(inline="always")
def _pack_fp6(sq, g, ob):
    """6-bit fields ``sq[:g]`` (``g`` a multiple of 4) into bytes ``ob``, four in three:
    ``c0 | c1 << 6 | c2 << 12 | c3 << 18`` little-endian (``ct_microscaling.pack_fp6``)."""
    for j in range(g // 4):
        w = (np.uint32(sq[4 * j] & 0x3F) | (np.uint32(sq[4 * j + 1] & 0x3F) << np.uint32(6))
             | (np.uint32(sq[4 * j + 2] & 0x3F) << np.uint32(12)) | (np.uint32(sq[4 * j + 3] & 0x3F) << np.uint32(18)))
        ob[3 * j] = np.uint8(w & np.uint32(0xFF))
        ob[3 * j + 1] = np.uint8((w >> np.uint32(8)) & np.uint32(0xFF))
        ob[3 * j + 2] = np.uint8(w >> np.uint32(16))


def _group_scale(amax, mx, nv):
    """``(byte, scale)`` of a group of finite ``max |x|`` ``amax`` (float32): MX's where ``mx``
    is given, NVFP4's where ``nv`` is (:func:`micro_rows`); the other is None, and the choice
    is made when the loop compiles."""


@overload(_group_scale, inline="always")
def _group_scale_impl(amax, mx, nv):
    if isinstance(nv, types.NoneType):
        def mx_scale(amax, mx, nv):
            first, step, values = mx
            a = np.float32(amax).view(np.uint32)
            e = a >> np.uint32(23)
            b = np.uint8(first[e] + np.uint8(a >= step[e]))
            return b, values[b]
        return mx_scale

    def nvfp4_scale(amax, mx, nv):
        gs, qmax, fmt, e4m3, e4m3_values, zero_byte, zero_scale = nv
        b = fp8_one(min(gs * round_scale(amax / qmax, fmt), np.float32(448)), e4m3)
        sb = e4m3_values[b]
        if sb == np.float32(0):
            b, sb = zero_byte, zero_scale
        return b, np.float32(sb / gs)
    return nvfp4_scale


@njit(**JIT)
def micro_rows(x, table, bits, r0, r1, n, g, shift, mag, inf, f, cbits, out, sbytes, mx, nv,
               acc, cnt, sq, sv, sa, sd, ss):
    """Rows ``r0:r1`` of a C-order ``[rows, n]`` weight in float codes (fp4, fp6 or fp8: ``f``
    = :func:`round_consts`, None for fp4's :func:`e2m1_round`; ``cbits`` the code's width)
    with one scale a group of ``g`` along a row, chosen in the pass from the group's ``max |x|``
    (its finite values: 0 for a group of NaN/Inf only), in one pass:

    * ``mx`` ``(first, step, values)`` (:func:`mx_rule_table`): OCP MX's e8m0 scale, the byte
      ``first[e] + (bits >= step[e])`` of amax's float32 bits (``e`` their exponent field),
      the scale ``values[byte]``;
    * ``nv`` ``(gs, qmax, fmt, e4m3, e4m3_values, zero_byte, zero_scale)``: NVFP4's block scale
      under the global scale ``gs`` (``gpuq._nvfp4``): ``e4m3(min(gs * D(amax / qmax), 448))``
      (``D`` the weight's dtype, scale format ``fmt``: ``loops.round_scale``; the e4m3 byte by
      ``loops.fp8_one``), ``zero_scale`` (byte ``zero_byte``) where that is 0; the codes are
      taken at ``float32(s_b / gs)``.

    One of ``mx``, ``nv`` is None. The group's scale byte goes to ``sbytes`` (one a group), its
    codes to ``out`` (``n * cbits / 8`` bytes a row: fp8 bytes, fp4 two a byte with the first in
    the low nibble, fp6 four in three bytes), and its figures to ``acc``/``cnt`` as in
    :func:`weight_rows` (the dequantized value, the code's value times ``s`` in float32). ``sq`` (uint8),
    ``sv`` (float32), ``sa``/``sd`` (float64) are scratch of ``n`` elements (a row), ``ss``
    (float32) of ``n / g`` (a row's scales).
    """
    groups = n // g
    rb = n * cbits // 8
    for r in range(r0, r1):
        # Codes and values of the row's groups into row scratch, then packed and summed once a
        # row: calls and loops of 16 elements a group cost more than their work (NVFP4, measured).
        # Packing a row at once is packing each group: a group's codes start on a byte.
        # The row's scales first, then its codes: the scale's chain of divisions and roundings
        # of one group does not wait for the codes of the group before (measured: NVFP4 g16 1.2x).
        row_bad = False
        for gi in range(groups):
            base = r * n + gi * g
            top = _magnitude(bits[base:base + g], mag)
            bad = top >= inf
            if bad:  # the finite values' max |x| (0 where there is none)
                lo, hi, _, _, _ = _finite_range(x, table, base, g)
                amax = abs(max(hi, -lo))
            else:
                amax = np.float32(float_of_key(top, bits, shift, mag, table))
            row_bad |= bad
            b, ss[gi] = _group_scale(amax, mx, nv)
            sbytes[r * groups + gi] = b
        for gi in range(groups):
            base = r * n + gi * g
            os = out[r * rb + gi * g:] if cbits == 8 else sq[gi * g:]
            _fp8_segment(x[base:base + g], os, ss[gi], f, table, g, sv[gi * g:])
        ob = out[r * rb:]
        if cbits == 4:
            _pack_fields(sq, n, ob)
        elif cbits == 6:
            _pack_fp6(sq, n, ob)
        _figures(x[r * n:(r + 1) * n], table, sv, n, sa, sd, row_bad, acc, cnt)


def quantize_micro(x, code, g, out, *, mx_table=None, global_scale=None):
    """One pass over a C-order 2-D weight ``x`` (bfloat16, float16 or float32) in the float
    codes ``code`` (fp4, fp6 or fp8: a ``gpuq._codetypes`` row) with one scale a group of ``g``
    along a row, chosen in the pass (:func:`micro_rows`): OCP MX's e8m0 scales by ``mx_table``
    (one rule's :func:`gpuq._mx.mx_rule_table`), or NVFP4's e4m3 block scales under ``global_scale``
    (:func:`gpuq.global_scale`'s float32, fp4 only). The codes go to ``out`` (uint8
    ``[rows, n * bits / 8]``: fp8 bytes, fp4 two a byte with the first in the low nibble, fp6
    four in three little-endian bytes, compressed-tensors' layouts); rows are shared among the
    host threads. NaN and +-Inf are left out of the scales (their group's ``max |x|`` is its
    finite values') and of the figures, and counted.

    Returns ``(scale_bytes, (signal, error, max_abs_error), counts)``: the scales' stored bytes
    (uint8 ``[rows, n / g]``: e8m0's biased exponents, or the e4m3 bytes of NVFP4's ``s_b``).

    >>> from gpuq._codetypes import code_type
    >>> out = np.empty((1, 16), np.uint8)
    >>> from gpuq._mx import mx_rule_table
    >>> sb, figures, counts = quantize_micro(np.float32([[6.0, -0.5] + [0.0] * 30]), code_type("float4_e2m1fn"),
    ...                                      32, out, mx_table=mx_rule_table("float4_e2m1fn", "even"))
    >>> sb.tolist(), out[0, 0], figures
    ([[127]], np.uint8(151), (36.25, 0.0, 0.0))
    """
    rows, n = x.shape
    flat, table, bits, (shift, mag, inf) = _views(x)
    f = None if code.bits == 4 else round_consts(code.fp8)  # fp4: e2m1_round, the same bits, faster
    mx = nv = None
    if global_scale is None:
        mx = mx_table
    else:  # NVFP4 (gpuq._nvfp4): s_b rounded to e4m3 from gs * D(amax / 6); 0 -> 0.125
        zero = np.empty(1, np.uint8)
        formats.fp8_bits(np.float32([0.125]), "e4m3fn", True, zero)
        nv = (np.float32(global_scale), np.float32(code.qmax), SCALE_FORMATS[dtype_name(x.dtype)],
              formats.fp8_consts("e4m3fn", True), formats.fp8_table("e4m3fn", np.float32), zero[0],
              np.float32(0.125))
    sbytes = np.empty((rows, n // g), np.uint8)
    chunks = _chunks(rows, n, threads.get_num_threads())
    accs = [np.zeros(3) for _ in chunks]
    cnts = [np.zeros(3, np.int64) for _ in chunks]

    def run(i):
        r0, r1 = chunks[i]
        micro_rows(flat, table, bits, r0, r1, n, g, shift, mag, inf, f, code.bits, out.reshape(-1),
                   sbytes.reshape(-1), mx, nv, accs[i], cnts[i], np.empty(n, np.uint8),
                   np.empty(n, np.float32), np.empty(n), np.empty(n), np.empty(n // g, np.float32))

    _run_chunks(run, len(chunks))
    return sbytes, _totals(accs), _counts(cnts)


@njit(**JIT)
def amax_rows(x, table, bits, n, shift, mag, inf):
    """``max |x|`` (float32) of the finite values of a flat weight, row by row of ``n``: the
    largest magnitude bits (an integer max, which vectorizes), or, where a row holds a NaN or
    +/-Inf, that row's finite range (0 where nothing is finite)."""
    amax = np.float32(0)
    for r in range(x.size // n):
        bs = bits[r * n:(r + 1) * n]
        top = _magnitude(bs, mag)
        if top >= inf:
            lo, hi, _, _, _ = _finite_range(x, table, r * n, n)
            a = max(hi, -lo)
        else:
            a = np.float32(float_of_key(top, bits, shift, mag, table))
        amax = max(amax, a)
    return amax


def weight_amax(x) -> np.float32:
    """``max |x|`` (float32) of the finite values of a C-order 2-D weight ``x`` (bfloat16,
    float16 or float32): :func:`amax_rows`, rows shared among the host threads.

    >>> weight_amax(np.float32([[1.0, np.nan], [-2.0, 0.5]]))
    np.float32(2.0)
    """
    flat, table, bits, (shift, mag, inf) = _views(x)
    rows, n = x.shape
    chunks = _chunks(rows, n, threads.get_num_threads())  # rows shared among the host threads

    def run(i):
        a, b = chunks[i][0] * n, chunks[i][1] * n
        return amax_rows(flat[a:b], table, bits[a:b], n, shift, mag, inf)

    return np.float32(max(_run_chunks(run, len(chunks))))


def _views(x):
    """``(flat, table, bits, (shift, mag, inf))`` of a C-order weight as the loops read it: its
    flat elements (float16 as uint16 bits with the widening ``table``, bfloat16 as int16
    bits), their signed-integer view and its order-key constants (``qparams.key_constants``);
    the views read-only, as the compiled loops take every input (``affine.readonly``)."""
    x = readonly(x)
    flat, table = kernel_input(x.reshape(-1))
    return flat, table, x.reshape(-1).view(KEY_INT[x.dtype.itemsize]), key_constants(x.dtype)
