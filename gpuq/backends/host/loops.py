"""Compiled host kernels: DESIGN.md section 1 as one fused loop per block (numba).

The NumPy backend spends 4-5 ufunc passes per block and hands the GIL back and
forth between them; these kernels read every element once, write its result
once and hold no GIL while they run, so a block costs what its memory traffic
costs. They are optional: the NumPy backend uses them when numba is importable
(the ``fast`` extra) and ``GPUQ_HOST_KERNELS`` is not ``numpy`` (``choice``),
for every block in the flat form of ``blocks.Runs``, and returns the same bits
either way (the test suite runs every host test on both).

Why the arithmetic is the contract's, bit for bit (zero points arrive as
integral floats of the compute type, ``|zp| <= 2**21``; wider ones stay on the
ufunc path, ``backend._quantize_wide``):

* numba types ``a / b`` and ``a * b`` of two float32 values as float32: one
  IEEE operation (float64 input and output compute in float64).
* Quantize is ``clamp(rint(x / s) + zp, qmin, qmax)`` in the compute type,
  NaN taken as 0 first. ``np.rint`` rounds half to even. ``rint(x / s)`` and
  ``zp`` are integers (or infinite): if their exact sum lies in [qmin, qmax]
  it is representable, and one IEEE addition returns it; if not, rounding is
  monotonic and qmin/qmax are representable, so the rounded sum stays on the
  same side and the clamp saturates it as the integer sum would.
* Dequantize converts ``q`` exactly and subtracts ``zp`` exactly
  (``|q - zp| < 2**22``), then multiplies once.
* float16 input is widened by a table lookup (exact); float16 output is
  rounded to nearest even by :func:`float16_bits` (equal to NumPy's cast on
  every non-NaN float32, all 2**32 patterns checked once; a NaN becomes the
  quiet NaN 0x7e00 with its sign, where NumPy keeps payload bits: dequantize
  never makes a NaN). fastmath is off: no reassociation, no flush of
  subnormals.
* bfloat16 travels as int16 bits (float16 as uint16 bits): widened exactly by
  shifting them into a float32's top half (:func:`bf16_to_f32`), narrowed by
  :func:`bfloat16_bits` (round to nearest even on the dropped 16 bits; equal
  to ml_dtypes' cast on every non-NaN float32, NaN -> the quiet 0x7fc0 with
  its sign, as ml_dtypes gives it).

Every kernel takes a flat block and ``run``: element ``i`` uses parameter
``(i // run) % nparams`` (``blocks.Runs``). A per-tensor block is one run,
rows of a per-channel block are runs, and ``run == 1`` (one parameter per
element, a pattern repeating every ``nparams``) is its own loop over whole
patterns. Inner loops must be long to vectorize, so the plans widen short
runs and tile short patterns first (``blocks.RUN_MIN``, ``PERIOD_MIN``).

Blocks of contiguous rows at a stride (``blocks.Rows``: the whole groups of a
ragged tensor, a view of a wider array) go to the ``*_rows`` wrappers, which
run the same flat kernel on each row with that row's parameters: the
arithmetic stays in one place, and a call per row costs nothing at Python level.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import overload

_JIT = dict(nogil=True, cache=True, boundscheck=False, error_model="numpy")
#: The compile options of the host loops (the one-pass weight loop, weight_pass.py, takes the same).
JIT = _JIT
#: The helpers' options: the loops' arithmetic (numpy's error model: a division by zero gives
#: inf/nan, no exception path to stop a loop vectorizing). Most helpers are plain calls, which
#: LLVM inlines once the caller is linked where they are small (the packed int4/fp4 walk, ``_q4``
#: and ``_dq4``, stays a call per sub-range of ``INT4_SUB`` elements): numba's own inlining
#: (``inline="always"``) retypes a helper at every call site, and was most of a kernel's cold
#: compile (tests/test_fused_weight.py: 248 -> 134 s of CPU). Kept ``inline="always"``, where a
#: plain call measured slower: the per-element fp8 encode (``fp8_one``/``fp8_of``: fp8 per channel
#: 14% slower compiled apart: the loop's vectorized code differs) and the per-group
#: ``finalize_one``, ``round_scale`` and ``run_keys`` (LLVM leaves those bodies a real call).
HELPER = dict(nogil=True, boundscheck=False, error_model="numpy")


def to_compute(value, like):
    """``value`` as float32 where ``like`` is float32; unchanged otherwise (float64 compute:
    integers there meet float64 operands and are promoted exactly)."""


@overload(to_compute, jit_options=HELPER)
def _to_compute(value, like):
    if like == types.float32:
        return lambda value, like: np.float32(value)
    return lambda value, like: value


def load(x, i, table):
    """Element ``i`` of ``x`` in the compute type: ``table[x[i]]`` for float16 bits, the
    shifted bits for bfloat16 (an int16 ``x``)."""


@overload(load, jit_options=HELPER)
def _load(x, i, table):
    if not isinstance(table, types.NoneType):
        return lambda x, i, table: table[x[i]]
    if x.dtype == types.int16:
        return lambda x, i, table: bf16_to_f32(x[i])
    return lambda x, i, table: x[i]


@njit(**HELPER)
def bf16_to_f32(b):
    """The float32 of bfloat16 bits ``b`` (int16): exact, the bits are the float32's top half."""
    return np.uint32(np.uint32(np.uint16(b)) << np.uint32(16)).view(np.float32)


def param(p, i, default):
    """``p[i]``, or ``default`` where there is no parameter array (symmetric)."""


@overload(param, jit_options=HELPER)
def _param(p, i, default):
    if isinstance(p, types.NoneType):
        return lambda p, i, default: default
    return lambda p, i, default: p[i]


def part(p, start, count):
    """``p[start:start + count]``, or None where there is no parameter array (symmetric)."""


@overload(part, jit_options=HELPER)
def _part(p, start, count):
    if isinstance(p, types.NoneType):
        return lambda p, start, count: None
    return lambda p, start, count: p[start:start + count]


@njit(**HELPER)
def row_starts(r, shape, strides):
    """Where row ``r`` of a ``blocks.Rows`` layout starts in the src span, the out span and the
    parameters: ``r`` as C-order coordinates of ``shape``, dotted with ``strides`` (k, 3)."""
    a = b = p = 0
    for d in range(shape.size - 1, -1, -1):
        r, c = divmod(r, shape[d])
        a += c * strides[d, 0]
        b += c * strides[d, 1]
        p += c * strides[d, 2]
    return a, b, p


def store(out, i, value):
    """``out[i] = value``; a uint16 ``out`` holds float16 bits, an int16 one bfloat16 bits."""


@overload(store)
def _store(out, i, value):
    if out.dtype == types.uint16:
        def store_half(out, i, value):
            out[i] = float16_bits(np.float32(value))
        return store_half
    if out.dtype == types.int16:
        def store_bf16(out, i, value):
            out[i] = np.int16(bfloat16_bits(np.float32(value)))
        return store_bf16

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


@njit
def bfloat16_bits(f):
    """The bfloat16 bits (uint16) of float32 ``f``, rounded to nearest even (ml_dtypes' cast).

    Adding ``0x7fff`` plus the lowest kept bit carries into the kept 16 bits
    exactly when the dropped ones are above half, or half with an odd kept
    part; a carry out of the mantissa raises the exponent, which is right too
    (to +/-inf beyond the largest bfloat16). NaN is kept apart (it could carry
    into the sign): the quiet NaN 0x7fc0 with its sign.
    """
    b = np.uint32(np.float32(f).view(np.uint32))
    if (b & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
        return np.uint16(((b >> np.uint32(16)) & np.uint32(0x8000)) | np.uint32(0x7FC0))
    lsb = (b >> np.uint32(16)) & np.uint32(1)
    return np.uint16(np.uint32(b + np.uint32(0x7FFF) + lsb) >> np.uint32(16))


@njit(**HELPER)
def quantize_one(v, s, zp, qmin, qmax):
    """``clamp(rint(v / s) + zp, qmin, qmax)``; ``zp``, ``qmin``, ``qmax`` integral, of ``s``'s type."""
    t = v / s
    if t != t:  # NaN is taken as 0 (of s's type: qmin is finite, s may be +inf unchecked)
        t = qmin - qmin
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
    p = 0  # the parameter of run r: r % nparams, counted (a division per run costs)
    for r in range(-(-x.size // run)):
        s, zp = scales[p], param(zps, p, zero)
        p = p + 1 if p + 1 < nparams else 0
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
    p = 0
    for r in range(-(-q.size // run)):
        s, zp = scales[p], param(zps, p, zero)
        p = p + 1 if p + 1 < nparams else 0
        base = r * run
        if base + run <= q.size:
            for j in range(run):
                store(out, base + j, (to_compute(q[base + j], zero) - zp) * s)
        else:
            for j in range(q.size - base):
                store(out, base + j, (to_compute(q[base + j], zero) - zp) * s)


def inlined(kernel):
    """``kernel``'s body as a function that njit callers inline: the rows wrappers call the flat
    kernels once per row, and a real call (with its array arguments' reference counts) cost
    ~2x on rows of 16-64 elements (measured)."""
    return njit(inline="always")(kernel.py_func)


# The rows wrappers: ``rows`` is ``blocks.Rows.layout``, ``x``/``q`` and ``out`` flat spans; each
# row runs the flat kernel above on its slice with its ``count`` parameters.

_quantize, _dequantize = inlined(quantize), inlined(dequantize)


@njit(**_JIT)
def quantize_rows(rows, x, table, out, run, scales, zps, qmin, qmax):
    """:func:`quantize` on each row of a block of rows at a stride."""
    shape, strides, first, last, length, count = rows
    for r in range(first, last):
        a, b, p = row_starts(r, shape, strides)
        _quantize(x[a:a + length], table, out[b:b + length], run, scales[p:p + count], part(zps, p, count),
                  qmin, qmax)


@njit(**_JIT)
def dequantize_rows(rows, q, out, run, scales, zps):
    """:func:`dequantize` on each row of a block of rows at a stride."""
    shape, strides, first, last, length, count = rows
    for r in range(first, last):
        a, b, p = row_starts(r, shape, strides)
        _dequantize(q[a:a + length], out[b:b + length], run, scales[p:p + count], part(zps, p, count))


@njit(inline="always")
def run_keys(bits, base, n, shift, mag, inf):
    """Order keys of the smallest and largest number of ``bits[base:base + n]`` (NaN skipped):
    ``(mag, ~mag)``, the keys of NaNs, where there is none. See :func:`minmax_keys`."""
    lowest = ~mag
    a, b = mag, lowest
    for j in range(n):
        v = bits[base + j]
        key = v ^ ((v >> shift) & mag)
        nan = (v & mag) > inf
        a = min(a, mag if nan else key)
        b = max(b, lowest if nan else key)
    return a, b


@njit(**_JIT)
def minmax_keys(bits, run, kmin, kmax, shift, mag, inf):
    """The smallest and largest number of each run of ``bits`` (float bit patterns
    viewed as signed integers), NaN skipped, as order keys into ``kmin``/``kmax``.

    The key of a float is its bits with the magnitude bits flipped when the sign
    is set (``v ^ ((v >> shift) & mag)``): integer order is then float order, so
    the reduction is integer min/max, which vectorizes without reassociating
    anything (float min/max reductions do not, short of fast-math; measured:
    8.8 ms against 19-41 ms per 64M float32). A NaN (``v & mag > inf``) enters
    as the neutral key; a run with no number gets ``mag``/``~mag``, the keys of
    NaNs. The GPU's reductions order floats by keys of the same kind
    (``kernels/qparams.cu``).
    """
    for r in range(kmin.size):
        kmin[r], kmax[r] = run_keys(bits, r * run, run, shift, mag, inf)


_minmax_keys = inlined(minmax_keys)


@njit(**_JIT)
def minmax_keys_rows(rows, bits, run, kmin, kmax, shift, mag, inf):
    """:func:`minmax_keys` on each row of a block of rows at a stride (``rows`` as
    ``blocks.Rows.layout``, the src column of its strides used): row ``r`` fills the ``count``
    slots from ``(r - first) * count``. The whole groups of a ragged tensor (``x[:, :14336]`` of
    rows of 14400) reduce as fast as a contiguous tensor's."""
    shape, strides, first, last, length, count = rows
    for r in range(first, last):
        a, _, _ = row_starts(r, shape, strides)
        k = (r - first) * count
        _minmax_keys(bits[a:a + length], run, kmin[k:k + count], kmax[k:k + count], shift, mag, inf)


def float_of_key(key, bits, shift, mag, table):
    """The float (compute type) whose order key is ``key``, ``bits`` the integer view it came from."""


@overload(float_of_key, jit_options=HELPER)
def _float_of_key(key, bits, shift, mag, table):
    if not isinstance(table, types.NoneType):  # float16: its bits index the widening table
        return lambda key, bits, shift, mag, table: table[np.uint16(key ^ ((key >> shift) & mag))]
    if bits.dtype == types.int16:  # bfloat16 (the one 2-byte type without a table)
        return lambda key, bits, shift, mag, table: bf16_to_f32(key ^ ((key >> shift) & mag))
    if bits.dtype == types.int32:
        return lambda key, bits, shift, mag, table: np.int32(key ^ ((key >> shift) & mag)).view(np.float32)
    return lambda key, bits, shift, mag, table: np.int64(key ^ ((key >> shift) & mag)).view(np.float64)


@njit(**HELPER)
def fmax_keep(a, b):
    """``np.fmax``: the larger, a NaN giving way to the other operand."""
    if a != a:
        return b
    if b != b:
        return a
    return a if a > b else b


@njit(**HELPER)
def fmin_keep(a, b):
    """``np.fmin``: the smaller, a NaN giving way to the other operand."""
    if a != a:
        return b
    if b != b:
        return a
    return a if a < b else b


@njit(**HELPER)
def f16_bits_to_f32(h):
    """The float32 of float16 bits ``h`` (a positive finite value: a rounded scale): exact."""
    e = np.int32((h >> np.uint32(10)) & np.uint32(0x1F))
    m = np.float32(h & np.uint32(0x3FF))
    if e == 0:  # subnormal: m * 2**-24
        return m * np.float32(2.0**-24)
    return (np.float32(1024) + m) * np.float32(2.0 ** (e - 25))


@njit(inline="always")
def round_scale(s, fmt):
    """``s`` rounded to nearest even in the scale dtype numbered ``fmt`` (0 float32, 1 bfloat16,
    2 float16: ``qparams.SCALE_FORMATS``), as float32."""
    if fmt == 1:
        return bf16_to_f32(np.int16(bfloat16_bits(s)))
    if fmt == 2:
        h = np.uint32(float16_bits(s))
        if h == np.uint32(0x7C00):
            return np.float32(np.inf)
        return f16_bits_to_f32(h)
    return s


@njit(inline="always")
def finalize_one(lo, hi, qmin, qmax, symmetric, eps, fmt):
    """``(scale, zp, ok)`` from one slot's float32 min and max (NaN: no number).

    The formula of ``qparams.finalize`` and ``kernels/qparams.cu``
    (``finalize_one``), bit for bit (tested against the former), the scale
    rounded to the scale dtype ``fmt`` (:func:`round_scale`) before the zero
    point is derived from it; ``ok`` is False where a bound is +/-inf or the
    rounded scale is 0 or +inf (the caller raises, or with ``check_values=False`` keeps the
    parameters as computed: a bound +/-inf gives scale +inf, and a scale 0 or +inf the
    asymmetric zero point 0, as the GPU's ``finalize_one``).
    """
    zero = np.float32(0)
    finite = lo != -np.inf and hi != np.inf
    if symmetric:
        amax = fmax_keep(fmax_keep(hi, -lo), zero)
        # Half the code range: (qmax - qmin) // 2; symmetric == 2 (scale_rule="full"): / 2 exactly.
        half = np.float32((qmax - qmin) / 2) if symmetric == 2 else np.float32((qmax - qmin) // 2)
        scale = round_scale(max(amax / half, eps), fmt)
        return scale, np.int32(0 if qmin < 0 else (qmax + 1) // 2), finite and scale != zero and scale != np.inf
    lo0, hi0 = fmin_keep(lo, zero), fmax_keep(hi, zero)
    span = hi0 - lo0
    if span == np.inf:  # hi - lo overflows float32: the same quotient via float64, rounded once
        scale = np.float32((np.float64(hi0) - np.float64(lo0)) / np.float64(qmax - qmin))
    else:
        scale = span / np.float32(qmax - qmin)
    scale = round_scale(max(scale, eps), fmt)
    if scale == zero or scale == np.inf:
        return scale, np.int32(0), False
    zp = np.float32(qmin) - np.rint(lo0 / scale)
    return scale, np.int32(min(max(zp, np.float32(qmin)), np.float32(qmax))), finite


@njit(**_JIT)
def quantize_dynamic_rows(x, table, bits, run, out, scales, zps, qmin, qmax, symmetric, eps, fmt, czero,
                          shift, mag, inf, check):
    """``quantize_dynamic`` of flat ``x`` cut in runs of ``run``, one slot per run.

    Per run: min and max (order keys of ``bits``, the same memory as ``x`` viewed
    as signed integers, see :func:`minmax_keys`), :func:`finalize_one` (scales
    rounded to the scale dtype ``fmt``), then the codes, while the run is still
    in L1/L2: ``x`` is read from memory once. ``czero`` is 0 in the compute type.
    Returns the first run whose parameters fail (a +/-inf bound, a scale the
    scale dtype cannot hold; nothing after it is written), or -1; with ``check`` False
    failed runs keep :func:`finalize_one`'s parameters and -1 comes back.
    """
    lo_q, hi_q = to_compute(qmin, czero), to_compute(qmax, czero)
    for r in range(scales.size):
        base = r * run
        a, b = run_keys(bits, base, run, shift, mag, inf)
        lo = np.float32(float_of_key(a, bits, shift, mag, table))
        hi = np.float32(float_of_key(b, bits, shift, mag, table))
        scale, zp, ok = finalize_one(lo, hi, qmin, qmax, symmetric, eps, fmt)
        if check and not ok:
            return r
        scales[r] = scale
        if zps is not None:
            zps[r] = zp
        s, z = to_compute(scale, czero), to_compute(zp, czero)
        for j in range(run):
            out[base + j] = quantize_one(load(x, base + j, table), s, z, lo_q, hi_q)
    return -1


# --- fp8 and packed int4 (issue 19; the NumPy twins are in ``formats``) ---------------------------

@njit(inline="always")
def fp8_one(t, f):
    """The fp8 bits (uint8) of float32 ``t``, rounded to nearest even: ``formats.fp8_bits`` for
    one element, the same bit operations (that docstring says why they round correctly).

    ``f`` is ``formats.fp8_consts``: ``(shift, half - 1, rebase, min_normal, sub_mul,
    limit, limit_code, nan_code, sign_shift, sign_bit, nan_sign)``, uint32 except ``sub_mul``
    (float32); magnitudes above ``limit`` give ``limit_code`` (``max_bits`` and ``max_code``
    saturating, else the overflow threshold, minus 1 where it is inclusive); the sign goes to
    ``sign_bit`` (0x80, or 0x20 and 0x8 for fp6 and fp4), masked by ``nan_sign`` for NaN (fp4
    and fp6 NaN is the +0 code). Every branch is a select, and there is no runtime flag: the
    loop vectorizes.
    """
    shift, half_m1, rebase, min_normal, sub_mul, limit, limit_code, nan_code, sshift, sbit, nan_sign = f
    u = np.float32(t).view(np.uint32)
    a = u & np.uint32(0x7FFFFFFF)
    r = ((a + ((a >> shift) & np.uint32(1)) + half_m1) >> shift) - rebase
    v = abs(np.float32(t)) * sub_mul
    v = v if v < np.float32(16) else np.float32(16)  # the small ones only (NaN, huge: unused)
    sub = np.uint32(np.int32(np.rint(v)))
    r = sub if a < min_normal else r
    r = limit_code if a > limit else r
    nan = a > np.uint32(0x7F800000)
    r = nan_code if nan else r
    sign = (u >> sshift) & sbit
    sign = sign & nan_sign if nan else sign
    return np.uint8(r | sign)


@njit(inline="always")
def fp8_of(v, s, f):
    """fp8 bits of ``v / s``: one division in the compute type, a float64 quotient rounded to
    float32 once first (as ``formats._quantize_fp8_block``). A NaN quotient carries ``v``'s
    sign: a NaN ``v``'s own, and that of a number ``v`` over an unchecked scale (Inf / Inf,
    0 / 0), where x86 would give its negative default NaN and the GPU its positive one."""
    t = np.float32(v / s)
    return fp8_one(np.float32(np.copysign(t, v)) if t != t else t, f)


@njit(**HELPER)
def e2m1_of(v, s):
    """The e2m1 (fp4) code of ``v / s`` (the quotient as :func:`fp8_of` forms it): one ``rint``
    of the magnitude at the grid's step there, ``0.5`` below 2 (codes 0-4), ``1`` below 4 (4-6),
    ``2`` above (6, 7), plus the step's first code, saturating at 7; ``rint`` rounds half to
    even and each step's even multiples are the even codes, so ties go to the even code (0.25 ->
    0, 0.75 -> 1.0, 2.5 -> 2, 5 -> 4). The products are exact (powers of two) and each boundary
    falls to the coarser step with the code both steps give (1.9 -> 2.0 by either). NaN gives
    the +0 code, -0.0 the -0 code. The same bits as ``fp8_one`` with
    ``formats.fp8_consts("e2m1fn", True)``; float selects vectorize, as the bit-field rounding
    (4.9x int4's time) and a count of seven threshold compares (2.6x in a bare loop) did not."""
    t = np.float32(v / s)
    a = abs(t)
    low, mid = a < np.float32(2), a < np.float32(4)
    step = np.float32(2) if low else (np.float32(1) if mid else np.float32(0.5))
    first = np.float32(0) if low else (np.float32(2) if mid else np.float32(4))
    c = min(np.rint(a * step) + first, np.float32(7))
    c = c if a == a else np.float32(0)
    sign = np.float32(8) if np.signbit(t) and a == a else np.float32(0)
    return np.uint8(c + sign)


@njit(**HELPER)
def e2m1_value(b, like):
    """The value of e2m1 (fp4) code ``b`` in ``like``'s compute type, exactly: magnitude codes
    0-3 are ``m * 0.5``, 4 and 5 are ``m - 2`` (2, 3), 6 and 7 are ``2 * m - 8`` (4, 6); bit 3 the
    sign (code 8: -0.0). What ``formats.fp8_table("e2m1fn", ...)[b]`` holds, without a gather,
    so the dequantize loop vectorizes as int4's does."""
    m = to_compute(np.int32(b) & 7, like)
    half, two = to_compute(0.5, like), to_compute(2, like)
    v = m * half if m < to_compute(4, like) else (m - two if m < to_compute(6, like) else m * two - to_compute(8, like))
    return -v if np.int32(b) & 8 else v


@njit(**_JIT)
def quantize_fp8(x, table, out, run, scales, f):
    """fp8 bits of flat ``x / s`` into ``out`` (uint8); parameters as :func:`quantize`."""
    nparams = scales.size
    if run == 1:
        for k in range(0, x.size, nparams):
            xk, outk = x[k:k + nparams], out[k:k + nparams]
            for j in range(xk.size):
                outk[j] = fp8_of(load(xk, j, table), scales[j], f)
        return
    p = 0
    for r in range(-(-x.size // run)):
        s = scales[p]
        p = p + 1 if p + 1 < nparams else 0
        base = r * run
        if base + run <= x.size:
            for j in range(run):
                out[base + j] = fp8_of(load(x, base + j, table), s, f)
        else:
            for j in range(x.size - base):
                out[base + j] = fp8_of(load(x, base + j, table), s, f)


@njit(**_JIT)
def dequantize_fp8(q, values, out, run, scales):
    """``values[q] * s`` of flat fp8 bits ``q`` into ``out``; ``values`` is ``formats.fp8_table``
    in the compute type; parameters as :func:`dequantize`."""
    nparams = scales.size
    if run == 1:
        for k in range(0, q.size, nparams):
            qk, outk = q[k:k + nparams], out[k:k + nparams]
            for j in range(qk.size):
                store(outk, j, values[qk[j]] * scales[j])
        return
    p = 0
    for r in range(-(-q.size // run)):
        s = scales[p]
        p = p + 1 if p + 1 < nparams else 0
        base = r * run
        if base + run <= q.size:
            for j in range(run):
                store(out, base + j, values[q[base + j]] * s)
        else:
            for j in range(q.size - base):
                store(out, base + j, values[q[base + j]] * s)


_quantize_fp8, _dequantize_fp8 = inlined(quantize_fp8), inlined(dequantize_fp8)


@njit(**_JIT)
def quantize_fp8_rows(rows, x, table, out, run, scales, f):
    """:func:`quantize_fp8` on each row of a block of rows at a stride."""
    shape, strides, first, last, length, count = rows
    for r in range(first, last):
        a, b, p = row_starts(r, shape, strides)
        _quantize_fp8(x[a:a + length], table, out[b:b + length], run, scales[p:p + count], f)


@njit(**_JIT)
def dequantize_fp8_rows(rows, q, values, out, run, scales):
    """:func:`dequantize_fp8` on each row of a block of rows at a stride."""
    shape, strides, first, last, length, count = rows
    for r in range(first, last):
        a, b, p = row_starts(r, shape, strides)
        _dequantize_fp8(q[a:a + length], values, out[b:b + length], run, scales[p:p + count])


#: Elements per sub-range of the int4 kernels: codes go through an L1-sized buffer.
INT4_SUB = 4096


@njit(**HELPER)
def _geometry(T, C, gs, G, P, R, rb):
    """The int4 map as the walk carries it: ``(T, C, gs, G, P, R, rb, GR)``, ``GR = ceil(R / rb)``
    (the outer blocks per ``R`` rows)."""
    return T, C, gs, G, P, R, rb, -(-R // rb)


@njit(**HELPER)
def _walk(begin, geo):
    """The walk's state at flat element ``begin = (o * C + c) * T + t``: ``(outer, c, t, g, gend)``
    with ``g = c // gs``, ``gend`` the end of group ``g`` (``<= C``) and ``outer = (f, q, m, k)``:
    ``f`` the outer parameter row of row-set ``o`` (:func:`quantize_int4`), ``q = (o // R) % P``,
    ``m = o % R`` and ``k = m % rb`` (how far into its outer block)."""
    T, C, gs, G, P, R, rb, GR = geo
    o, rem = divmod(begin, C * T)
    c, t = divmod(rem, T)
    g = c // gs
    q, m = divmod(o, R)
    q = q % P
    return (q * GR + m // rb, q, m, m % rb), c, t, g, min((g + 1) * gs, C)


@njit(**HELPER)
def _next_outer(outer, geo):
    """``outer`` (:func:`_walk`) after row-set ``o`` ends: no division. ``f`` moves on where an
    outer block ends (``rb`` rows, or the ragged last one at ``R``)."""
    T, C, gs, G, P, R, rb, GR = geo
    f, q, m, k = outer
    m += 1
    k += 1
    if m == R:
        q = q + 1 if q + 1 < P else 0
        return q * GR, q, 0, 0
    if k == rb:
        return f + 1, q, m, 0
    return f, q, m, k


@njit(**HELPER)
def _next_row(outer, c, g, gend, geo):
    """The state after row ``c`` ends (``t`` back to 0): no division."""
    T, C, gs, G, P, R, rb, GR = geo
    c += 1
    if c == gend:
        g += 1
        gend = min(gend + gs, C)
    if c == C:
        c, g, gend = 0, 0, min(gs, C)
        outer = _next_outer(outer, geo)
    return outer, c, g, gend


@njit(**HELPER)
def _segment(state, geo, cons, left):
    """``(p, length, state)``: the first parameter and the length (at most ``left``) of the
    segment at ``state`` (:func:`_walk`), and the state after it. An element's parameter is
    ``(f * G + g) * T + t`` where ``cons`` (consecutive over a row), else ``f * G + g``
    (constant to the end of the group). ``cons`` must be a compile-time constant here (the
    kernels are split on it): a runtime branch between the two kept the inner loops from
    vectorizing (g128 quantize 2.7x slower, measured)."""
    T, C, gs, G, P, R, rb, GR = geo
    outer, c, t, g, gend = state
    row = outer[0] * G + g
    if cons:
        first = row * T + t
        length = min(T - t, left)
        t += length
        if t == T:
            t = 0
            outer, c, g, gend = _next_row(outer, c, g, gend, geo)
        return first, length, (outer, c, t, g, gend)
    full = (gend - c) * T - t
    if full <= left:
        c, t = gend - 1, 0
        outer, c, g, gend = _next_row(outer, c, g, gend, geo)
        return row, full, (outer, c, t, g, gend)
    # Stops inside the group's rows (the end of a sub-range): one division.
    t += left
    c += t // T
    t = t % T
    return row, left, (outer, c, t, g, gend)


@njit(**HELPER)
def _pack(buf, m, packed, s0):
    """Pack codes ``buf[:m]`` into ``packed`` from byte ``s0 // 2`` (ONNX order: element 2j
    in the low nibble), as uint16 pairs (little-endian: element 2j is the low byte)."""
    if m & 1:
        buf[m] = 0
    pairs = buf.view(np.uint16)
    out = packed[s0 // 2:s0 // 2 + (m + 1) // 2]
    for j in range(out.size):
        w = pairs[j]
        out[j] = np.uint8((w & np.uint16(0x0F)) | ((w >> np.uint16(4)) & np.uint16(0xF0)))


@njit(**HELPER)
def _unpack(packed, m, buf, s0, signed):
    """``buf[:m]`` = the int8 codes of ``packed`` from byte ``s0 // 2`` (int4 sign-extended)."""
    pairs = buf.view(np.uint16)
    src = packed[s0 // 2:s0 // 2 + (m + 1) // 2]
    for j in range(src.size):
        b = np.uint16(src[j])
        pairs[j] = (b & np.uint16(0x0F)) | ((b & np.uint16(0xF0)) << np.uint16(4))
    if signed:  # (v ^ 8) - 8
        for j in range(m):
            buf[j] = np.int8((np.int32(buf[j]) ^ 8) - 8)


@njit(**HELPER)
def _q4(x, table, packed, begin, geo, cons, scales, zps, qmin, qmax, f):
    """The int4 walk (:func:`quantize_int4`); with fp consts ``f`` (not None) the codes are
    fp4's (:func:`e2m1_of`), compiled apart (``f is None`` is pruned at compile time)."""
    zero, lo, hi = to_compute(0, scales[0]), to_compute(qmin, scales[0]), to_compute(qmax, scales[0])
    n = x.size
    buf = np.empty(INT4_SUB, np.int8)
    state = _walk(begin, geo)
    for s0 in range(0, n, INT4_SUB):
        m = min(INT4_SUB, n - s0)
        k = 0
        while k < m:
            p, length, state = _segment(state, geo, cons, m - k)
            xs, bs = x[s0 + k:s0 + k + length], buf[k:k + length]
            if cons:
                sc = scales[p:p + length]
                if f is not None:
                    for j in range(length):
                        bs[j] = np.int8(e2m1_of(load(xs, j, table), sc[j]))
                elif zps is None:
                    for j in range(length):
                        bs[j] = quantize_one(load(xs, j, table), sc[j], zero, lo, hi)
                else:
                    zc = zps[p:p + length]
                    for j in range(length):
                        bs[j] = quantize_one(load(xs, j, table), sc[j], zc[j], lo, hi)
            elif f is not None:
                s = scales[p]
                for j in range(length):
                    bs[j] = np.int8(e2m1_of(load(xs, j, table), s))
            else:
                s, zp = scales[p], param(zps, p, zero)
                for j in range(length):
                    bs[j] = quantize_one(load(xs, j, table), s, zp, lo, hi)
            k += length
        _pack(buf, m, packed, s0)


@njit(**HELPER)
def _dq4(packed, out, begin, geo, cons, signed, scales, zps, values):
    """The int4 walk (:func:`dequantize_int4`); with a value table ``values`` (not None) the
    codes are fp4's, ``e2m1_value(code) * s`` (``values`` only selects that path), compiled apart."""
    zero = to_compute(0, scales[0])
    n = out.size
    buf = np.empty(INT4_SUB, np.int8)
    state = _walk(begin, geo)
    for s0 in range(0, n, INT4_SUB):
        m = min(INT4_SUB, n - s0)
        _unpack(packed, m, buf, s0, signed)
        k = 0
        while k < m:
            p, length, state = _segment(state, geo, cons, m - k)
            os_, bs = out[s0 + k:s0 + k + length], buf[k:k + length]
            if cons:
                sc = scales[p:p + length]
                if values is not None:
                    for j in range(length):
                        store(os_, j, e2m1_value(bs[j], zero) * sc[j])
                elif zps is None:
                    for j in range(length):
                        store(os_, j, to_compute(bs[j], zero) * sc[j])
                else:
                    zc = zps[p:p + length]
                    for j in range(length):
                        store(os_, j, (to_compute(bs[j], zero) - zc[j]) * sc[j])
            else:
                s = scales[p]
                if values is not None:
                    for j in range(length):
                        store(os_, j, e2m1_value(bs[j], zero) * s)
                elif zps is None:
                    for j in range(length):
                        store(os_, j, to_compute(bs[j], zero) * s)
                else:
                    zp = zps[p]
                    for j in range(length):
                        store(os_, j, (to_compute(bs[j], zero) - zp) * s)
            k += length


@njit(**_JIT)
def quantize_int4(x, table, packed, begin, T, C, gs, G, P, R, rb, cons, scales, zps, qmin, qmax):
    """Packed int4/uint4 codes of flat ``x`` (elements ``begin ..`` of the tensor, ``begin``
    even) into ``packed`` (``ceil(x.size / 2)`` bytes, ONNX nibble order).

    The parameter of element ``i = (o * C + c) * T + t`` (absolute) is ``(f * G + c // gs) * T + t``
    where ``cons``, else ``f * G + c // gs``, with the outer parameter row
    ``f = ((o // R) % P) * ceil(R / rb) + (o % R) // rb`` (``formats.int4_map``: per-tensor,
    per-channel and per-group maps take ``R = rb = 1``, so ``f = o % P``; block scales and
    multi-axis maps block the row-sets too). Codes go through an L1 buffer of
    :data:`INT4_SUB`, segment by segment (long inner loops with one parameter, or consecutive
    ones, :func:`_segment`), then are packed as uint16 pairs: memory is read and written once.
    """
    geo = _geometry(T, C, gs, G, P, R, rb)
    if cons:
        _q4(x, table, packed, begin, geo, True, scales, zps, qmin, qmax, None)
    else:
        _q4(x, table, packed, begin, geo, False, scales, zps, qmin, qmax, None)


@njit(**_JIT)
def dequantize_int4(packed, out, begin, T, C, gs, G, P, R, rb, cons, signed, scales, zps):
    """``(q - zp) * s`` of the packed int4/uint4 codes of elements ``begin .. begin + out.size``
    (``begin`` even; ``packed`` starts at element ``begin``) into flat ``out``; parameters
    as :func:`quantize_int4`."""
    geo = _geometry(T, C, gs, G, P, R, rb)
    if cons:
        _dq4(packed, out, begin, geo, True, signed, scales, zps, None)
    else:
        _dq4(packed, out, begin, geo, False, signed, scales, zps, None)


@njit(**_JIT)
def quantize_fp4(x, table, packed, begin, T, C, gs, G, P, R, rb, cons, scales, f):
    """Packed fp4 (e2m1) codes of flat ``x`` into ``packed``: :func:`quantize_int4`'s walk and
    packing, each code :func:`fp8_of` with ``formats.fp8_consts("e2m1fn", True)``."""
    geo = _geometry(T, C, gs, G, P, R, rb)
    if cons:
        _q4(x, table, packed, begin, geo, True, scales, None, 0, 0, f)
    else:
        _q4(x, table, packed, begin, geo, False, scales, None, 0, 0, f)


@njit(**_JIT)
def dequantize_fp4(packed, out, begin, T, C, gs, G, P, R, rb, cons, values, scales):
    """``values[q] * s`` of packed fp4 codes into flat ``out`` (``values``: ``formats.fp8_table``
    of e2m1 in the compute type); parameters as :func:`dequantize_int4`."""
    geo = _geometry(T, C, gs, G, P, R, rb)
    if cons:
        _dq4(packed, out, begin, geo, True, False, scales, None, values)
    else:
        _dq4(packed, out, begin, geo, False, False, scales, None, values)
