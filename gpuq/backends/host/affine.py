"""The affine codes (int8/uint8; int4/uint4 share the block functions) on the host: the contract of
DESIGN.md section 1 in cache-sized blocks.

Blocks (``blocks``) are shared among a small thread pool and run one of two
loops, which return the same bits:

* the compiled kernels (``loops``, numba, where ``choice`` says they
  serve host arrays): one fused pass per block, GIL released;
* NumPy ufuncs with ``out=`` into per-thread scratch of ``blocks.BLOCK``
  elements (this module): 4-5 passes per block. They serve where numba is
  missing, float32 zero points beyond ``NARROW_ZP``, and blocks the kernels cannot take
  as flat runs or as rows at a stride (rows not contiguous or shorter than
  ``blocks.ROW_MIN``, parameters on non-adjacent dims of one contiguous block).

Either way the extra memory of a call is bounded (scratch of a few hundred
KiB per thread plus parameter-sized arrays), never a multiple of the input.

Why each ufunc step is exact (float32 compute; float64 is the same with more room):

* ``x / s`` is one IEEE division. Clamping it to ``[qmin - zp, qmax - zp]``
  before rounding equals clamping after (the bounds are integers).
* Rounding is the magic-number trick: ``t + 1.5 * 2**23`` has an ulp of 1 for
  ``|t| < 2**22``, so the hardware rounds half to even and the integer lands in
  the low bits; its low byte is ``rint(t) mod 256``. Adding ``zp mod 256`` in
  bytes gives ``(rint(t) + zp) mod 256``, the code itself, because the clamp
  already put ``rint(t) + zp`` inside [qmin, qmax]. That is four cheap passes
  instead of rint + add + clamp + a slow saturating cast.
* Zero points beyond 2**21 (float32) take the "wide" path: round, clamp to
  +/-2**32 (so that any int32 zp keeps the side), then int64 arithmetic.
* Dequantize ``(q - zp)`` is exact in float32 for ``|zp| <= 2**21``; beyond,
  the difference is formed in int64 and rounded to float32 once.
* bfloat16 (ml_dtypes') is the top half of a float32: a block is widened
  exactly into the float32 scratch (by the dtype's cast where it is checked to be
  that shift on every pattern, else by shifting the bits), and narrowed by
  rounding the float32 result's bits to nearest even (:func:`bf16_bits`),
  so no float32 copy of the whole tensor is ever made.
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import numpy as np

from ..._dtypes import is_bfloat16
from . import blocks, choice
from .threads import run_blocks, scratch

#: Largest |zero point| of the float32 fast path: clamped values then stay below
#: 2**22 in magnitude, where the magic-number rounding is exact.
NARROW_ZP = 2**21
#: Adding 1.5 * 2**(mantissa bits) rounds to an integer, half to even, and leaves
#: that integer in the low bits of the sum.
_MAGIC = {np.dtype(np.float32): np.float32(1.5 * 2**23), np.dtype(np.float64): np.float64(1.5 * 2**52)}
_INT_OF = {np.dtype(np.float32): np.dtype(np.int32), np.dtype(np.float64): np.dtype(np.int64)}
#: Rounded values are clamped here before int64 arithmetic in the wide path.
WIDE_CLAMP = float(2**32)

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_I64 = np.dtype(np.int64)
_U16 = np.dtype(np.uint16)
_U32 = np.dtype(np.uint32)


def extremes(arr):
    """``(min, max)`` of a host array, NaN propagating; ``(inf, -inf)`` when empty.

    One element (every per-tensor parameter) is read directly: two reductions
    cost more than the rest of a small call's validation.

    >>> [int(v) for v in extremes(np.array([3, -1, 2]))]
    [-1, 3]
    """
    if arr.size == 1:
        v = arr.reshape(-1)[0]
        return v, v
    if arr.size == 0:
        return np.inf, -np.inf
    return arr.min(), arr.max()


@functools.cache
def float16_table():
    """float32 value of every float16 bit pattern: a gather widens twice as fast as a cast.
    Made once, read-only (it is shared, and the compiled loops take inputs read-only: :func:`readonly`)."""
    table = np.arange(2**16, dtype=np.uint16).view(np.float16).astype(np.float32)
    table.flags.writeable = False
    return table


def readonly(a):
    """``a`` as the compiled loops take an input array: a read-only view (None stays None).

    numba compiles a loop once per argument type, and a read-only array (a memory-mapped
    file's, a broadcast) is another type than a writable one: with every input handed over
    read-only, a caller's arrays of either kind share one compiled loop (the suite compiled
    ~100 loops twice over before).

    >>> readonly(np.zeros(3)).flags.writeable, readonly(None)
    (False, None)
    """
    if a is None or not a.flags.writeable:
        return a
    view = a.view()
    view.flags.writeable = False
    return view


def bf16_bits(t, out_bits, scratch):
    """``out_bits`` (uint16, any strides) = the bfloat16 bits of float32 ``t``, rounded to nearest even.

    ``(u + 0x7fff + lsb) >> 16`` with ``lsb`` the lowest kept bit: the carry
    reaches the kept bits exactly when the dropped half is above half, or half
    with an odd kept part (kernels/contract.cuh ``f32_to_bf16_rn``, which also
    maps NaN to the quiet 0x7fc0 with its sign; dequantize, the one caller,
    cannot make a NaN: a finite scale times an integer).
    """
    u = t.view(_U32)
    r = scratch.like("bits", _U32, t)
    np.right_shift(u, 16, out=r)
    np.bitwise_and(r, 1, out=r)
    np.add(r, u, out=r)
    np.add(r, 0x7FFF, out=r)
    np.right_shift(r, 16, out=out_bits, casting="unsafe")


@functools.lru_cache(maxsize=4)
def bf16_cast_is_shift(dtype) -> bool:
    """Whether ``dtype``'s (ml_dtypes bfloat16) cast to float32 is the exact widening, bit for
    bit on all 2**16 patterns, NaN payloads and signs included: checked once per dtype.

    The cast is one pass; the shift of the bits into a float32's top half takes two
    (a widening copy, then the shift: NumPy buffers a shift that casts, 2x slower),
    which made bfloat16 quantize on the ufunc loops cost 1.5x float32's (issue 16).
    """
    bits = np.arange(1 << 16, dtype=np.uint32).astype(_U16)
    try:
        with np.errstate(all="ignore"):
            got = bits.view(dtype).astype(np.float32)
    except Exception:  # pragma: no cover - an ml_dtypes without the cast
        return False
    return bool(np.array_equal(got.view(_U32), bits.astype(_U32) << np.uint32(16)))


def quotient(xb, s, scratch):
    """``x / s`` of a block in its compute type (float32; float64 for float64 ``xb``), in
    scratch: float16 and bfloat16 widened exactly first, then one IEEE division."""
    t = scratch.like("t", _F64 if xb.dtype == _F64 else _F32, xb)
    if xb.dtype == np.float16:
        np.take(float16_table(), xb.view(np.uint16), out=t)  # exact widening
        np.divide(t, s, out=t)
    elif is_bfloat16(xb.dtype):
        if bf16_cast_is_shift(xb.dtype):
            np.copyto(t, xb, casting="unsafe")  # the dtype's own cast: one pass, checked exact
        else:  # the bits shifted into the float32's top half, in place (a casting shift is buffered)
            tu = t.view(_U32)
            np.copyto(tu, xb.view(_U16))
            np.left_shift(tu, 16, out=tu)
        np.divide(t, s, out=t)
    else:
        np.divide(xb, s, out=t)
    return t


def scaled_out(t, s, ob, scratch):
    """``ob = t * s``, one multiplication in ``t``'s compute type, narrowed to ``ob``'s dtype
    (float16 by NumPy's cast, bfloat16 by :func:`bf16_bits`: both to nearest even)."""
    if is_bfloat16(ob.dtype):
        np.multiply(t, s, out=t)
        bf16_bits(t, ob.view(_U16), scratch)
    else:
        np.multiply(t, s, out=ob)


def quantize_block(xb, ob, params, scratch, *, qmin, qmax, ct, wide):
    t = quotient(xb, params[0], scratch)
    has_nan = np.isnan(t.min())  # one cheap reduction finds the rare block with a NaN
    if wide:
        _quantize_wide(t, ob, params[1], scratch, qmin, qmax, has_nan)
        return
    lo, hi, zp_byte = (params[1], params[2], params[3]) if len(params) > 1 else (qmin, qmax, None)
    # Clamping before rounding equals clamping after it (the bounds are integers), and
    # keeps |r| < 2**22 for the magic-number rounding below.
    if np.ndim(lo) == 0:
        np.clip(t, lo, hi, out=t)
    else:  # np.clip is ~5x slower than maximum + minimum with array bounds
        np.maximum(t, lo, out=t)
        np.minimum(t, hi, out=t)
    magic = _MAGIC[ct]
    np.add(t, magic, out=t)  # rint, half to even: the sum's ulp is 1
    if has_nan:
        # NaN is taken as 0: its code is clamp(0 + zp) = clamp(0, lo, hi) + zp.
        zero = np.clip(np.zeros((), ct), lo, hi) + magic
        np.copyto(t, zero, where=np.isnan(t))
    # The low byte of the sum's bits is rint(x / s) mod 256; adding zp mod 256 in
    # bytes gives (r + zp) mod 256, which is the code since r + zp is in [qmin, qmax].
    out_bytes = ob.view(np.uint8)
    np.copyto(out_bytes, t.view(_INT_OF[ct]), casting="unsafe")
    if zp_byte is not None:
        np.add(out_bytes, zp_byte, out=out_bytes)


def _quantize_wide(t, ob, zp, scratch, qmin, qmax, has_nan):
    """Zero points beyond NARROW_ZP: the rounded value in int64, then + zp, then clamp."""
    np.rint(t, out=t)
    np.clip(t, -WIDE_CLAMP, WIDE_CLAMP, out=t)
    if has_nan:
        np.copyto(t, 0, where=np.isnan(t))
    w = scratch.like("w", _I64, t)
    np.copyto(w, t, casting="unsafe")
    np.add(w, zp, out=w)
    np.clip(w, qmin, qmax, out=ob, casting="unsafe")


def dequantize_block(qb, ob, params, scratch, *, ct, wide):
    s = params[0]
    t = scratch.like("t", ct, qb)
    if wide:
        w = scratch.like("w", _I64, qb)
        np.subtract(qb, params[1], out=w)
        np.copyto(t, w, casting="unsafe")  # one rounding to the compute type
    else:
        np.copyto(t, qb)
        if len(params) > 1:
            np.subtract(t, params[1], out=t)  # exact: |q - zp| < 2**24
    scaled_out(t, s, ob, scratch)


def plans(src, out, scheme, params, expand=True):
    plans = []
    for piece in scheme.pieces():
        x = blocks.view(src[piece.src_index], piece.view_shape)
        o = blocks.view(out[piece.src_index], piece.view_shape)
        ps = [p.reshape(scheme.param_shape)[piece.param_index].reshape(piece.param_view_shape)
              for p in params]
        plans.append(blocks.plan(x, o, ps, expand))
    return plans


def zero_point_params(zps, ct, code, wide):
    """The zero points as the ufunc block functions take them.

    Dequantize (``code=None``) takes ``[zp]``; quantize takes the clamp bounds
    ``qmin - zp``, ``qmax - zp`` and ``zp mod 256`` as a byte; the wide path
    takes ``[zp]`` in int64.
    """
    if zps is None:
        return []
    if wide:
        return [zps.astype(_I64)]
    if code is None:
        return [zps.astype(ct)]
    return clamp_params(zps, ct, code.qmin, code.qmax)


def needs_wide(zps, ct) -> bool:
    """Whether the zero points need the wide path: float32 compute with some |zp| > NARROW_ZP.

    In float64, ``rint(x / s) + zp`` is exact for every int32 zp wherever the
    clamp does not decide the code anyway, so float64 never needs it.
    """
    if ct != _F32 or zps is None:
        return False
    lo, hi = extremes(zps)
    return lo < -NARROW_ZP or hi > NARROW_ZP


def clamp_params(zps, ct, qmin, qmax):
    """The ufunc quantize's zero-point parameters: clamp bounds ``qmin - zp``, ``qmax - zp``
    in ``ct`` and ``zp mod 256`` as a byte."""
    z = np.asarray(zps).astype(_I64)
    return [(qmin - z).astype(ct), (qmax - z).astype(ct), (z % 256).astype(np.uint8)]


def kernel_form(xb, ob, params):
    """``(x, o, Runs, rows)`` for the compiled kernels: ``rows`` is the layout of a block of
    rows at a stride (``blocks.Rows``; ``x`` and ``o`` are then flat spans), None for a flat
    block (FlatPlan blocks come that way, others via ``blocks.runs``). None where a block has
    no such form (rows not contiguous, parameters on non-adjacent dims of one block)."""
    if isinstance(params, blocks.Rows):
        return xb, ob, params.runs, params.layout
    if isinstance(params, blocks.Runs):
        return xb, ob, params, None
    flat = blocks.runs(xb, ob, params)
    return None if flat is None else (*flat, None)


def launch(flat, each_row, rows, *args) -> None:
    """``flat(*args)`` on a flat block, ``each_row(rows, *args)`` (the kernel's ``*_rows``
    wrapper) on a block of rows at a stride."""
    if rows is None:
        flat(*args)
    else:
        each_row(rows, *args)


def kernel_input(x):
    """``(x, table)`` as the compiled kernels read floats, read-only (:func:`readonly`): float16
    as uint16 bits and the widening table, bfloat16 as int16 bits (``loops.load``: widened by a
    shift), others as they are."""
    x = readonly(x)
    if x.dtype == np.float16:
        return x.view(np.uint16), float16_table()
    if is_bfloat16(x.dtype):
        return x.view(np.int16), None
    return x, None


def kernel_output(o):
    """``o`` as the compiled kernels write it (``loops.store``): float16 as uint16 bits,
    bfloat16 as int16 bits."""
    if o.dtype == np.float16:
        return o.view(np.uint16)
    if is_bfloat16(o.dtype):
        return o.view(np.int16)
    return o


def quantize_block_compiled(xb, ob, params, scratch, *, kernels, qmin, qmax, ct):
    """One block through the compiled kernel; params are ``[scales]`` or ``[scales, zps]`` (both ``ct``)."""
    form = kernel_form(xb, ob, params)
    if form is None:  # a strided or multi-axis block: the ufunc loop, the same bits
        zparams = clamp_params(params[1], ct, qmin, qmax) if len(params) > 1 else []
        quantize_block(xb, ob, [params[0]] + zparams, scratch, qmin=qmin, qmax=qmax, ct=ct, wide=False)
        return
    x, o, (run, (s, *z)), rows = form
    x, table = kernel_input(x)
    launch(kernels.quantize, kernels.quantize_rows, rows, x, table, o, run, readonly(s),
           readonly(z[0]) if z else None, qmin, qmax)


def dequantize_block_compiled(qb, ob, params, scratch, *, kernels, ct):
    """One block through the compiled kernel; params are ``[scales]`` or ``[scales, zps]`` (both ``ct``)."""
    form = kernel_form(qb, ob, params)
    if form is None:  # the ufunc loop takes the same params
        dequantize_block(qb, ob, params, scratch, ct=ct, wide=False)
        return
    q, o, (run, (s, *z)), rows = form
    launch(kernels.dequantize, kernels.dequantize_rows, rows, readonly(q), kernel_output(o), run, readonly(s),
           readonly(z[0]) if z else None)


def small_call(src, scheme, scales, zps, out, loop) -> bool:
    """Run a small call as one block without plans, where it can; False where it cannot.

    A tensor of at most ``blocks.SMALL`` elements is one block anyway; when it
    is contiguous and its parameters follow one flat run (per-tensor,
    per-channel, adjacent axes, full groups along the last axis), the block is
    ``(rows, count, run)`` with parameter ``c`` on ``[:, c, :]``: the compiled
    kernels take it as :class:`blocks.Runs`, the ufuncs as broadcast columns.
    Per-call overhead is what small tensors pay for.
    """
    if src.size > blocks.SMALL or not (src.flags.c_contiguous and out.flags.c_contiguous):
        return False
    name, m0, m1, _, _ = scheme.index_map
    if name not in ("tensor", "channel"):
        return False
    count, run = (1, src.size) if name == "tensor" else (m0, m1)
    params = [p.reshape(-1) for p in [scales] + loop.zparams(zps)]
    x, o = src.reshape(-1), out.reshape(-1)
    if not loop.expand:
        loop.block(x, o, blocks.Runs(run, params), scratch)
        return True
    shape = (-1, count, run)
    with np.errstate(over="ignore", invalid="ignore"):  # as in _run_range
        loop.block(x.reshape(shape), o.reshape(shape),
                   [p.reshape(count, 1) if count > 1 else p.reshape(()) for p in params], scratch)
    return True


class Loop(NamedTuple):
    """How one call runs its blocks: the block function, the zero-point parameters it
    takes (``zparams(zps)``, after the scales), and whether plans expand short rows."""

    block: Callable
    zparams: Callable
    expand: bool


def block_loop(zps, ct, code=None) -> Loop:
    """The compiled kernels where they serve host arrays and the zps fit them (not wide),
    else ufuncs; for quantize to the affine ``code`` (a code type's row: its range), or for
    dequantize where ``code`` is None."""
    wide = needs_wide(zps, ct)  # one reduction of the zps per call
    return _loop(ct, code, wide, None if wide else choice.kernels())


@functools.lru_cache(maxsize=64)
def _loop(ct, code, wide, kernels) -> Loop:
    if kernels is not None:
        compiled = quantize_block_compiled if code is not None else dequantize_block_compiled
        extra = dict(qmin=code.qmin, qmax=code.qmax) if code is not None else {}
        fn = functools.partial(compiled, kernels=kernels, ct=ct, **extra)
        return Loop(fn, lambda z: zero_point_params(z, ct, None, False), False)
    if code is None:
        fn = functools.partial(dequantize_block, ct=ct, wide=wide)
    else:
        fn = functools.partial(quantize_block, qmin=code.qmin, qmax=code.qmax, ct=ct, wide=wide)
    return Loop(fn, lambda z: zero_point_params(z, ct, code, wide), True)


def run_call(src, scheme, scales, zps, out, loop) -> None:
    """One call through ``loop``: small calls in one block, the rest planned into blocks."""
    if not small_call(src, scheme, scales, zps, out, loop):
        run_blocks(plans(src, out, scheme, [scales] + loop.zparams(zps), loop.expand), loop.block)
