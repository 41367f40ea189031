"""The host backend's code formats beyond int8/uint8: fp8 (e4m3fn, e5m2) and packed int4/uint4.

fp8 is element-wise, so it runs on the same block plans as int8
(``affine.plans``): each block forms the quotient exactly as int8 does
(``affine.quotient``) and converts it with :func:`fp8_bits`; dequantize
widens through a 256-entry table (:func:`fp8_table`) and multiplies once.

int4 codes are packed two per byte over the C-order flattened tensor, so a
block must be a flat range starting at an even element: :class:`_FlatChunks`
cuts the flattened tensor into such ranges. The compiled kernels
(``loops.quantize_int4``) walk each chunk's parameters themselves by
:func:`int4_map`: per-tensor, per-channel, groups, multi-axis, and block
scales with up to two blocked dims (2-D, rank-3 ``(1, b1, b2)``, ragged, a
byte straddling two rows or blocks) cost what int4 groups cost. Otherwise
(the ufunc loop, wide zero points, maps :func:`int4_map` does not cover)
each element's parameter is gathered by its flat index (:func:`param_index`,
the kernels' index maps), the chunk is quantized into per-thread int8
scratch by the int8 block function with int4's range and packed into the
output bytes, so no unpacked copy of the tensor is ever made (dequantize
unpacks a chunk into scratch).

Why :func:`fp8_bits` rounds correctly (a = the float32 quotient's magnitude bits):

* normal fp8 results (|t| >= 2**-6 for e4m3fn, 2**-14 for e5m2): the fp8 bits
  are a's exponent and top mantissa bits with the exponent rebased; adding
  ``half - 1`` plus the lowest kept bit to ``a`` before the shift rounds to
  nearest even, and a carry out of the mantissa raises the exponent, which is
  the correct rounding too.
* subnormal results: ``|t| * 2**9`` (e4m3fn) or ``* 2**16`` (e5m2) is exact (a
  power of two, no underflow), and ``rint`` of it is the subnormal's mantissa,
  rounded half to even; 8 (4) is the smallest normal's bits, also correct.
* overflow: saturate gives +-max_finite beyond it (Inf included); otherwise
  e4m3fn gives NaN above 464 (exactly 464 rounds to 448, even), e5m2 Inf from
  61440 (the tie rounds to Inf's even mantissa) -- ml_dtypes' cast.
* NaN: sign | 0x7f (e4m3fn) or sign | 0x7e (e5m2), as ml_dtypes gives.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from . import affine, blocks, choice
from .threads import run_blocks
from .blocks import BLOCK

_U8 = np.dtype(np.uint8)
_U32 = np.dtype(np.uint32)
_I8 = np.dtype(np.int8)
_I64 = np.dtype(np.int64)
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)


#: name -> (mbits, bias, min_normal_f32_bits, max_f32_bits, max_code, overflow_above, overflow_code,
#: overflow_inclusive, nan_code)
_FP8 = {
    # e4m3fn: no Inf; 464 = halfway between 448 and 480 (NaN's slot) rounds to 448 (even).
    "e4m3fn": (3, 7, 0x3C800000, 0x43E00000, 0x7E, 0x43E80000, 0x7F, False, 0x7F),
    # e5m2: 61440 = halfway between 57344 and 65536 (Inf) rounds to Inf (even mantissa).
    "e5m2": (2, 15, 0x38800000, 0x47600000, 0x7B, 0x47700000, 0x7C, True, 0x7E),
    # fp4 and fp6 have no Inf or NaN and always saturate (the overflow entries are never used);
    # NaN gives the +0 code, sign cleared (gpuq's NaN -> 0 rule of the integer codes).
    "e2m1fn": (1, 1, 0x3F800000, 0x40C00000, 0x07, 0x40C00000, 0x07, False, 0x00),
    "e2m3fn": (3, 1, 0x3F800000, 0x40F00000, 0x1F, 0x40F00000, 0x1F, False, 0x00),
    "e3m2fn": (2, 3, 0x3E800000, 0x41E00000, 0x1F, 0x41E00000, 0x1F, False, 0x00),
}

#: The code width of each layout: the sign is its top bit.
_BITS = {"e4m3fn": 8, "e5m2": 8, "e2m1fn": 4, "e2m3fn": 6, "e3m2fn": 6}


def _nan_keeps_sign(fmt: str) -> bool:
    """fp8's NaN codes keep the sign (ml_dtypes'); fp4/fp6 NaN is the +0 code."""
    return _BITS[fmt] == 8


def fp8_bits(t, fmt: str, saturate: bool, out, scratch=None) -> None:
    """``out`` (uint8, t's shape) = the fp8 bits of float32 ``t``, rounded to nearest even.

    >>> b = np.empty(4, np.uint8)
    >>> fp8_bits(np.array([1.0, 464.0, 1e9, np.nan], np.float32), "e4m3fn", True, b); b.tolist()
    [56, 126, 126, 127]
    >>> fp8_bits(np.array([-0.0, 0.75, -7.0, -np.nan], np.float32), "e2m1fn", True, b); b.tolist()
    [8, 2, 15, 0]
    """
    mbits, bias, min_normal, max_bits, max_code, over, over_code, inclusive, nan_code = _FP8[fmt]
    shift = 23 - mbits
    like = (lambda key, dt: scratch.like(key, dt, t)) if scratch is not None else (
        lambda key, dt: np.empty(t.shape, dt))
    u = t.view(_U32)
    a = like("fp8_a", _U32)
    np.bitwise_and(u, 0x7FFFFFFF, out=a)
    r = like("fp8_r", _U32)
    # Normal: round half to even on the dropped bits, then rebase the exponent (127 -> bias).
    np.right_shift(a, shift, out=r)
    np.bitwise_and(r, 1, out=r)
    np.add(r, a, out=r)
    np.add(r, (1 << (shift - 1)) - 1, out=r)
    np.right_shift(r, shift, out=r)
    np.subtract(r, (127 - bias) << mbits, out=r)
    # Subnormal: the exact multiple of the subnormal step, rounded half to even.
    small = like("fp8_small", np.bool_)
    np.less(a, min_normal, out=small)
    if small.any():
        sub = like("fp8_sub", _F32)
        np.abs(t, out=sub)
        with np.errstate(over="ignore", invalid="ignore"):  # the large ones are not used
            np.multiply(sub, np.float32(2.0 ** (bias - 1 + mbits)), out=sub)
        np.rint(sub, out=sub)
        np.copyto(r, sub, where=small, casting="unsafe")
    if saturate:
        np.copyto(r, max_code, where=a > max_bits)
    else:
        np.copyto(r, over_code, where=(a >= over) if inclusive else (a > over))
    nan = a > 0x7F800000
    np.copyto(r, nan_code, where=nan)
    bits = _BITS[fmt]
    np.right_shift(u, 32 - bits, out=a)
    np.bitwise_and(a, 1 << (bits - 1), out=a)
    if not _nan_keeps_sign(fmt):
        np.copyto(a, 0, where=nan)
    np.bitwise_or(r, a, out=r)
    np.copyto(out, r, casting="unsafe")


@functools.cache
def fp8_table(fmt: str, ct) -> np.ndarray:
    """The value of each of the 256 fp8 bit patterns in compute type ``ct`` (exact).

    NaN patterns hold the default quiet NaN with the pattern's sign, so a NaN
    code dequantizes to the output type's default NaN on both backends.

    >>> fp8_table("e4m3fn", np.dtype(np.float32))[[0x38, 0x7e, 0x01]].tolist()
    [1.0, 448.0, 0.001953125]
    >>> fp8_table("e2m1fn", np.dtype(np.float32))[[0x1, 0x7, 0xF, 0x8]].tolist()
    [0.5, 6.0, -6.0, -0.0]
    """
    mbits, bias, bits = _FP8[fmt][0], _FP8[fmt][1], _BITS[fmt]
    b = np.arange(256) & ((1 << bits) - 1)  # fp4/fp6: the bits above the code's are not read
    top = 1 << (bits - 1)
    sign = np.where(b & top, -1.0, 1.0)
    e = (b >> mbits) & ((top >> mbits) - 1)
    m = b & ((1 << mbits) - 1)
    mag = np.where(e == 0, m * 2.0 ** (1 - bias - mbits), (1 + m / 2.0**mbits) * 2.0 ** (e - bias))
    vals = sign * mag
    emax = (top >> mbits) - 1
    if fmt == "e4m3fn":
        nan = (b & 0x7F) == 0x7F
    elif fmt == "e5m2":
        nan = (e == emax) & (m != 0)
        vals = np.where((e == emax) & (m == 0), sign * np.inf, vals)
    else:  # fp4/fp6: every pattern is a number
        nan = np.zeros(b.shape, bool)
    vals = np.where(nan, np.copysign(np.nan, sign), vals)  # the default NaN with that sign
    table = vals.astype(ct)
    table.setflags(write=False)
    return table


# --- fp8 on the block plans --------------------------------------------------------------------

def _quantize_fp8_block(xb, ob, params, scratch, *, fmt, saturate):
    t = affine.quotient(xb, params[0], scratch)
    nan = np.isnan(t)
    if nan.any():  # a NaN quotient carries x's sign (loops.fp8_of says why)
        t[nan] = np.where(np.signbit(np.asarray(xb)[nan]), -np.nan, np.nan)
    if t.dtype != _F32:  # float64: the float64 quotient rounded to float32 once, then to fp8
        t32 = scratch.like("t32", _F32, t)
        np.copyto(t32, t, casting="unsafe")
        t = t32
    if ob.flags.c_contiguous:
        fp8_bits(t, fmt, saturate, ob.view(_U8), scratch)
    else:
        bits = scratch.like("fp8_out", _U8, t)
        fp8_bits(t, fmt, saturate, bits, scratch)
        np.copyto(ob.view(_U8), bits)


def _dequantize_fp8_block(qb, ob, params, scratch, *, fmt, ct):
    t = scratch.like("t", ct, qb)
    np.take(fp8_table(fmt, ct), qb, out=t)
    affine.scaled_out(t, params[0], ob, scratch)


@functools.cache
def fp8_consts(fmt: str, saturate: bool) -> tuple:
    """:func:`fp8_bits`' constants as the compiled kernel takes them (``loops.fp8_one``)."""
    mbits, bias, min_normal, max_bits, max_code, over, over_code, inclusive, nan_code = _FP8[fmt]
    shift = 23 - mbits
    u = np.uint32
    if saturate:
        limit, code = max_bits, max_code
    else:
        limit, code = (over - 1 if inclusive else over), over_code
    bits = _BITS[fmt]
    return (u(shift), u((1 << (shift - 1)) - 1), u((127 - bias) << mbits), u(min_normal),
            np.float32(2.0 ** (bias - 1 + mbits)), u(limit), u(code), u(nan_code),
            u(32 - bits), u(1 << (bits - 1)), u(0xFF if _nan_keeps_sign(fmt) else 0))


@functools.cache
def round_consts(fmt: str) -> tuple:
    """``weight_pass.float_round``'s constants of the saturating float code ``fmt`` (this
    module's names: e4m3fn, e5m2, e2m1fn, e2m3fn, e3m2fn): ``(mul, low, rebase, limit, shift, nan_code,
    sign_shift, sign_bit, nan_sign, nan_value)``, from the layout's mantissa bits ``m`` and
    bias ``B``: ``mul = 2**(23 - m)``, ``low = 2**(24 - B - m)`` (the magic of the subnormal
    step), ``rebase = 2**(B - 127)``, ``limit`` the largest finite value, ``shift = 23 - m``;
    NaN's code, its sign rule and its value as :func:`fp8_table` holds it (fp8: the quiet
    NaN with the sign; fp4/fp6: +0).

    >>> [float(c) for c in round_consts("e4m3fn")[:2]], round_consts("e4m3fn")[3:6]
    ([1048576.0, 16384.0], (np.float32(448.0), np.int32(20), np.int32(127)))
    """
    mbits, bias, _, max_bits, max_code, _, _, _, nan_code = _FP8[fmt]
    bits = _BITS[fmt]
    keeps = _nan_keeps_sign(fmt)
    f32, i32 = np.float32, np.int32
    return (f32(2.0 ** (23 - mbits)), f32(2.0 ** (24 - bias - mbits)), f32(2.0 ** (bias - 127)),
            np.uint32(max_bits).view(f32), i32(23 - mbits), i32(nan_code), i32(32 - bits), i32(1 << (bits - 1)),
            i32(0xFF if keeps else 0), f32(np.nan) if keeps else f32(0))


def _quantize_fp8_block_compiled(xb, ob, params, scratch, *, kernels, fmt, saturate):
    form = affine.kernel_form(xb, ob, params)
    if form is None:  # a strided or multi-axis block: the ufunc loop, the same bits
        _quantize_fp8_block(xb, ob, params, scratch, fmt=fmt, saturate=saturate)
        return
    x, o, (run, (s,)), rows = form
    x, table = affine.kernel_input(x)
    affine.launch(kernels.quantize_fp8, kernels.quantize_fp8_rows, rows, x, table, o.view(_U8), run,
                  affine.readonly(s), fp8_consts(fmt, saturate))


def _dequantize_fp8_block_compiled(qb, ob, params, scratch, *, kernels, fmt, ct):
    form = affine.kernel_form(qb, ob, params)
    if form is None:
        _dequantize_fp8_block(qb, ob, params, scratch, fmt=fmt, ct=ct)
        return
    q, o, (run, (s,)), rows = form
    affine.launch(kernels.dequantize_fp8, kernels.dequantize_fp8_rows, rows, affine.readonly(q),
                  fp8_table(fmt, ct), affine.kernel_output(o), run, affine.readonly(s))


def quantize_fp8(src, scheme, scales, out_bits, fmt, saturate) -> None:
    """fp8 codes of host ``src`` into ``out_bits`` (uint8 view of the fp8 result, src's shape)."""
    kernels = choice.kernels()
    if kernels is not None:
        fn = functools.partial(_quantize_fp8_block_compiled, kernels=kernels, fmt=fmt,
                               saturate=bool(saturate))
        run_blocks(affine.plans(src, out_bits, scheme, [scales], expand=False), fn)
        return
    fn = functools.partial(_quantize_fp8_block, fmt=fmt, saturate=bool(saturate))
    run_blocks(affine.plans(src, out_bits, scheme, [scales]), fn)


def dequantize_fp8(bits, scheme, scales, out, fmt) -> None:
    """``out = widen(bits) * s`` for fp8 bits ``bits`` (uint8, out's shape)."""
    kernels = choice.kernels()
    if kernels is not None:
        fn = functools.partial(_dequantize_fp8_block_compiled, kernels=kernels, fmt=fmt, ct=scales.dtype)
        run_blocks(affine.plans(bits, out, scheme, [scales], expand=False), fn)
        return
    fn = functools.partial(_dequantize_fp8_block, fmt=fmt, ct=scales.dtype)
    run_blocks(affine.plans(bits, out, scheme, [scales]), fn)


# --- int4 on flat chunks -------------------------------------------------------------------------

def param_index(scheme, begin: int, end: int):
    """The parameter index of each flat element in ``[begin, end)`` of a C-order tensor
    (int64), or None where every element uses parameter 0.

    >>> from gpuq._scheme import Scheme
    >>> param_index(Scheme.build((2, 5), axis=1, group_size=2), 3, 8).tolist()
    [1, 2, 3, 3, 4]
    """
    name, m0, m1, m2, _ = scheme.index_map
    if name == "tensor":
        return None
    i = np.arange(begin, end, dtype=_I64)
    if name == "channel":
        return (i // m1) % m0
    if name == "group":
        row, t = np.divmod(i, m1)
        o, j = np.divmod(row, m0)
        return (o * -(-m0 // m2) + j // m2) * m1 + t
    # The general map (multi-axis, blocks): the coordinates' blocks, raveled over the grid of
    # blocks (a dim a block covers has one, so the scheme's own parameter shape is the same).
    coords = np.unravel_index(i, scheme.shape)
    grid = tuple(-(-n // b) for n, b in zip(scheme.shape, scheme.blocks))
    return np.ravel_multi_index([c // b for c, b in zip(coords, scheme.blocks)], grid)


class _FlatChunks:
    """``run_blocks``'s plan interface over even-aligned flat ranges of ``n`` elements."""

    def __init__(self, n):
        self.size = n
        self.nblocks = -(-n // BLOCK)

    def block(self, b, scratch):
        return b * BLOCK, min(self.size, (b + 1) * BLOCK), None


def _flat_reader(arr):
    """``read(a, b)``: elements [a, b) of ``arr`` in C order (a view where contiguous)."""
    if arr.flags.c_contiguous:
        flat = arr.reshape(-1)
        return lambda a, b: flat[a:b]
    return lambda a, b: arr.flat[a:b]  # a copy of that range only


def _gathered(params, scheme, a, b):
    idx = param_index(scheme, a, b)
    flat = [p.reshape(-1) for p in params]
    if idx is None:
        return [p[0] for p in flat]
    return [p[idx] for p in flat]


def _pack_into(codes, dst) -> None:
    """``dst`` (uint8, ceil(len/2)) = the nibbles of int8/uint8 ``codes``, ONNX order."""
    c = codes.view(_U8)
    n = c.size
    np.bitwise_and(c[0::2], 0x0F, out=dst)
    if n > 1:
        hi = dst[: n // 2]
        hi |= c[1::2] << 4


def _unpack_into(src, n, signed, dst) -> None:
    """``dst`` (int8, n elements) = the first n codes of packed ``src``, sign-extended for int4."""
    d = dst.view(_U8)
    np.bitwise_and(src[: (n + 1) // 2], 0x0F, out=d[0::2])
    np.right_shift(src[: n // 2], 4, out=d[1::2])
    if signed:
        np.bitwise_xor(d, 8, out=d)
        np.subtract(dst, 8, out=dst)


def int4_map(scheme, n):
    """``(T, C, gs, G, P, R, rb, cons)``: the parameter of flat element ``i = (o * C + c) * T + t``
    is ``(f * G + c // gs) * T + t`` where ``cons``, else ``f * G + c // gs``, with
    ``f = ((o // R) % P) * ceil(R / rb) + (o % R) // rb`` (``loops.quantize_int4``); None for
    the maps it does not cover (``expand``, strided maps of more levels, :func:`_strided_map`).

    >>> from gpuq._scheme import Scheme
    >>> int4_map(Scheme.build((2, 5), axis=1, group_size=2), 10)
    (1, 5, 2, 3, 10, 1, 1, False)
    >>> int4_map(Scheme.build((300, 201), block_size=(128, 128)), 60300)
    (1, 201, 128, 2, 1, 300, 128, False)
    """
    name, m0, m1, m2, dims = scheme.index_map
    big = max(n, 1)
    if name == "tensor":
        return big, 1, 1, 1, 1, 1, 1, False
    if name == "channel":
        if m1 == 1:  # one parameter per element of a row: consecutive (segments of one were 5x slower)
            return m0, 1, 1, 1, 1, 1, 1, True
        return m1, m0, 1, 1, 1, 1, 1, False
    if name == "group":
        return m1, m0, m2, -(-m0 // m2), big, 1, 1, m1 > 1
    if name == "strided":
        return _strided_map(dims, big)
    return None


def _strided_map(dims, big):
    """:func:`int4_map` of a strided index map (block scales, multi-axis), or None.

    The merged dims (``Scheme.index_map``: sizes, parameter strides, blocks; each one blocked,
    per-element or whole) are read from the last: a per-element or whole last dim is ``T``
    (``cons`` where per-element), the next ``C`` with groups of ``gs``, the next ``R`` with
    outer blocks of ``rb``, and one more per-element dim is ``P`` (a whole one does not vary):
    2-D blocks ``(b0, b1)`` and rank-3 ``(1, b1, b2)`` (ragged or not) are ``T = 1``, groups
    of ``b_last`` along ``C`` and outer blocks along ``R``. A map with more levels is None.
    """
    k = len(dims) // 3
    levels = list(zip(dims[:k], dims[2 * k:]))  # (size, block) of each merged dim
    T, cons = 1, False
    if levels[-1][1] in (1, levels[-1][0]):  # per-element (consecutive) or whole: the inner dim
        T, cons = levels[-1][0], levels[-1][1] == 1
        levels.pop()
    C, gs = levels.pop() if levels else (1, 1)
    R, rb = levels.pop() if levels else (1, 1)
    if len(levels) > 1 or (levels and 1 < levels[0][1] < levels[0][0]):  # more blocked levels
        return None
    P = big if levels and levels[0][1] == 1 else 1
    return T, C, gs, -(-C // gs), P, R, rb, cons


def _int4_kernel_args(src_or_out, scheme, zps, ct):
    """``(kernels, map)`` where the compiled int4 kernels serve this call, else None."""
    kernels = choice.kernels()
    if kernels is None or affine.needs_wide(zps, ct):
        return None
    m = int4_map(scheme, src_or_out.size)
    if m is None:
        return None
    return kernels, m


def quantize_int4(src, scheme, scales, zps, packed, signed) -> None:
    """Packed int4/uint4 codes of host ``src`` into ``packed`` (1-D uint8, ceil(n/2))."""
    qmin, qmax = (-8, 7) if signed else (0, 15)
    ct = scales.dtype
    read = _flat_reader(src)
    compiled = _int4_kernel_args(src, scheme, zps, ct)
    if compiled is not None:
        kernels, m = compiled
        s = affine.readonly(scales.reshape(-1))
        z = None if zps is None else affine.readonly(zps.reshape(-1).astype(ct))

        def kchunk(a, b, _, scratch):
            x, table = affine.kernel_input(read(a, b))
            kernels.quantize_int4(x, table, packed[a // 2:(b + 1) // 2], a, *m, s, z, qmin, qmax)

        run_blocks([_FlatChunks(src.size)], kchunk)
        return
    wide = affine.needs_wide(zps, ct)
    if zps is None:
        params = [scales]
    elif wide:
        params = [scales, zps.astype(_I64)]
    else:
        z = zps.astype(_I64)
        params = [scales, (qmin - z).astype(ct), (qmax - z).astype(ct), (z % 256).astype(_U8)]

    def chunk(a, b, _, scratch):
        got = _gathered(params, scheme, a, b)
        codes = scratch.buffer("codes4", _I8, b - a)
        affine.quantize_block(read(a, b), codes, got, scratch, qmin=qmin, qmax=qmax, ct=ct, wide=wide)
        _pack_into(codes, packed[a // 2:(b + 1) // 2])

    run_blocks([_FlatChunks(src.size)], chunk)


def dequantize_int4(packed, scheme, scales, zps, out, signed) -> None:
    """``out = (q - zp) * s`` for the packed int4/uint4 codes ``packed`` (out's shape)."""
    ct = scales.dtype
    target = out if out.flags.c_contiguous else np.empty(out.shape, out.dtype)
    flat_out = target.reshape(-1)
    compiled = _int4_kernel_args(out, scheme, zps, ct)
    if compiled is not None:
        kernels, m = compiled
        s = affine.readonly(scales.reshape(-1))
        z = None if zps is None else affine.readonly(zps.reshape(-1).astype(ct))
        packed = affine.readonly(packed)
        kout = affine.kernel_output(flat_out)

        def kchunk(a, b, _, scratch):
            kernels.dequantize_int4(packed[a // 2:(b + 1) // 2], kout[a:b], a, *m, bool(signed), s, z)

        run_blocks([_FlatChunks(out.size)], kchunk)
        if target is not out:
            np.copyto(out, target)
        return
    wide = affine.needs_wide(zps, ct)
    params = [scales] if zps is None else [scales, zps.astype(_I64 if wide else ct)]

    def chunk(a, b, _, scratch):
        codes = scratch.buffer("codes4", _I8, b - a)
        _unpack_into(packed[a // 2:], b - a, signed, codes)
        affine.dequantize_block(codes, flat_out[a:b], _gathered(params, scheme, a, b), scratch,
                             ct=ct, wide=wide)

    run_blocks([_FlatChunks(out.size)], chunk)
    if target is not out:
        np.copyto(out, target)


# --- fp4 on flat chunks (packed as int4) -----------------------------------------------------------

def quantize_fp4(src, scheme, scales, packed) -> None:
    """Packed fp4 (e2m1) codes of host ``src`` into ``packed`` (1-D uint8, ceil(n/2)): each code
    as fp8's (the quotient, float64's rounded to float32 once, then :func:`fp8_bits`), packed
    as int4 is."""
    read = _flat_reader(src)
    compiled = _int4_kernel_args(src, scheme, None, scales.dtype)
    if compiled is not None:
        kernels, m = compiled
        s, f = affine.readonly(scales.reshape(-1)), fp8_consts("e2m1fn", True)

        def kchunk(a, b, _, scratch):
            x, table = affine.kernel_input(read(a, b))
            kernels.quantize_fp4(x, table, packed[a // 2:(b + 1) // 2], a, *m, s, f)

        run_blocks([_FlatChunks(src.size)], kchunk)
        return

    def chunk(a, b, _, scratch):
        codes = scratch.buffer("codes4", _U8, b - a)
        _quantize_fp8_block(read(a, b), codes, _gathered([scales], scheme, a, b), scratch,
                            fmt="e2m1fn", saturate=True)
        _pack_into(codes, packed[a // 2:(b + 1) // 2])

    run_blocks([_FlatChunks(src.size)], chunk)


def dequantize_fp4(packed, scheme, scales, out) -> None:
    """``out = e2m1(q) * s`` for the packed fp4 codes ``packed`` (out's shape)."""
    ct = scales.dtype
    values = fp8_table("e2m1fn", ct)
    compiled = _int4_kernel_args(out, scheme, None, ct)

    def fill(flat_out):
        if compiled is not None:  # the int4 walk with e2m1's value table
            kernels, m = compiled
            s, kout = affine.readonly(scales.reshape(-1)), affine.kernel_output(flat_out)
            codes = affine.readonly(packed)

            def chunk(a, b, _, scratch):
                kernels.dequantize_fp4(codes[a // 2:(b + 1) // 2], kout[a:b], a, *m, values, s)
        else:
            def chunk(a, b, _, scratch):
                codes = scratch.buffer("codes4", _I8, b - a)
                _unpack_into(packed[a // 2:], b - a, False, codes)
                _dequantize_fp8_block(codes.view(_U8), flat_out[a:b], _gathered([scales], scheme, a, b),
                                      scratch, fmt="e2m1fn", ct=ct)

        run_blocks([_FlatChunks(out.size)], chunk)

    if out.flags.c_contiguous:
        fill(out.reshape(-1))
    else:  # written flat, then copied into the caller's strided out
        target = np.empty(out.shape, out.dtype)
        fill(target.reshape(-1))
        np.copyto(out, target)


def packed_size(shape) -> int:
    """Bytes of packed int4 codes for ``shape``: ceil(n / 2).

    >>> packed_size((3, 5))
    8
    """
    return (math.prod(shape) + 1) // 2
