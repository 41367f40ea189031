"""The host backend: the contract of DESIGN.md section 1 in cache-sized blocks.

Blocks (``blocks``) are shared among a small thread pool and run one of two
loops, which return the same bits:

* the compiled kernels (``loops``, numba, where ``choice`` says they
  serve host arrays): one fused pass per block, GIL released;
* NumPy ufuncs with ``out=`` into per-thread scratch of ``blocks.BLOCK``
  elements (this module): 4-5 passes per block. They serve where numba is
  missing, float32 zero points beyond ``NARROW_ZP``, and blocks the kernels' flat form
  cannot express (strided src/out, parameters on non-adjacent dims).

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
  rounding the float32 result's bits to nearest even (:func:`_bf16_bits`),
  so no float32 copy of the whole tensor is ever made.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, NamedTuple

import numpy as np

from ..._dtypes import QUANT_RANGE, is_bfloat16
from . import blocks, choice

#: Tensors smaller than this run on the calling thread only.
PARALLEL_MIN = 1 << 17
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


class _Scratch(threading.local):
    """Per-thread block buffers, allocated once per (key, dtype)."""

    def __init__(self):
        self.buffers = {}

    def buffer(self, key, dtype, size):
        """A flat buffer of at least ``size`` elements (grown, never shrunk)."""
        buf = self.buffers.get((key, dtype))
        if buf is None or buf.size < size:
            buf = self.buffers[(key, dtype)] = np.empty(max(size, blocks.BLOCK), dtype)
        return buf[:size]

    def like(self, key, dtype, block):
        """A scratch view of ``dtype`` with the shape of ``block``."""
        return self.buffer(key, dtype, block.size).reshape(block.shape)


_scratch = _Scratch()
_pool_lock = threading.Lock()
_pool = None
_num_threads = None


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


def get_num_threads() -> int:
    """Threads the NumPy backend uses (default: the CPUs this process may use).

    On a thread inside :func:`thread_share`, the share given there.

    >>> import gpuq
    >>> gpuq.get_num_threads() >= 1
    True
    """
    total = _process_threads()
    share = _share.n
    return total if share is None else max(1, min(share, total))


def _process_threads() -> int:
    global _num_threads
    if _num_threads is None:
        env = os.environ.get("GPUQ_NUM_THREADS")
        _num_threads = int(env) if env else len(os.sched_getaffinity(0))
    return _num_threads


def set_num_threads(n: int) -> None:
    """Set the NumPy backend's thread count (``1`` runs on the calling thread).

    >>> import gpuq
    >>> gpuq.set_num_threads(2); gpuq.get_num_threads()
    2
    """
    global _num_threads, _pool
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    with _pool_lock:
        _num_threads = int(n)
        if _pool is not None:
            _pool.shutdown(wait=True)
            _pool = None


class _Share(threading.local):
    n = None


_share = _Share()


@contextlib.contextmanager
def thread_share(n: int):
    """Calls made on this thread inside the block use at most ``n`` of the process's threads
    (nested: the smaller share).

    For callers that run several gpuq calls at once on threads of their own (a
    Dask worker's tasks): each call takes its share instead of all the threads.

    >>> import gpuq
    >>> from gpuq.backends.host.backend import thread_share
    >>> with thread_share(1):
    ...     gpuq.get_num_threads()
    1
    """
    before = _share.n
    _share.n = n if before is None else min(n, before)
    try:
        yield
    finally:
        _share.n = before


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            # Sized for the process, not for the first caller: a caller with a share uses part of it.
            _pool = ThreadPoolExecutor(max_workers=max(1, _process_threads() - 1), thread_name_prefix="gpuq")
        return _pool


def _run(plans, block_fn) -> None:
    work = [(p, b) for p in plans for b in range(p.nblocks)]
    threads = min(get_num_threads(), len(work))
    total = sum(p.size for p in plans)
    if threads <= 1 or total < PARALLEL_MIN:
        _run_range(work, block_fn)
        return
    bounds = [len(work) * i // threads for i in range(threads + 1)]
    pool = _executor()
    futures = [pool.submit(_run_range, work[bounds[i]:bounds[i + 1]], block_fn)
               for i in range(1, threads)]
    _run_range(work[bounds[0]:bounds[1]], block_fn)
    for f in futures:
        f.result()


def _run_range(work, block_fn) -> None:
    scratch = _scratch
    # Overflow to +/-Inf (a huge x / s, a float16 output out of range) is the
    # contract's answer, not an accident worth a warning.
    with np.errstate(over="ignore", invalid="ignore"):
        for plan, b in work:
            xb, ob, params = plan.block(b, scratch)
            block_fn(xb, ob, params, scratch)


@functools.cache
def _float16_table():
    """float32 value of every float16 bit pattern: a gather widens twice as fast as a cast."""
    return np.arange(2**16, dtype=np.uint16).view(np.float16).astype(np.float32)


def _bf16_bits(t, out_bits, scratch):
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
def _bf16_cast_is_shift(dtype) -> bool:
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
        np.take(_float16_table(), xb.view(np.uint16), out=t)  # exact widening
        np.divide(t, s, out=t)
    elif is_bfloat16(xb.dtype):
        if _bf16_cast_is_shift(xb.dtype):
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
    (float16 by NumPy's cast, bfloat16 by :func:`_bf16_bits`: both to nearest even)."""
    if is_bfloat16(ob.dtype):
        np.multiply(t, s, out=t)
        _bf16_bits(t, ob.view(_U16), scratch)
    else:
        np.multiply(t, s, out=ob)


def _quantize_block(xb, ob, params, scratch, *, qmin, qmax, ct, wide):
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


def _dequantize_block(qb, ob, params, scratch, *, ct, wide):
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


def _plans(src, out, scheme, params, expand=True):
    plans = []
    for piece in scheme.pieces():
        x = blocks.view(src[piece.src_index], piece.view_shape)
        o = blocks.view(out[piece.src_index], piece.view_shape)
        ps = [p.reshape(scheme.param_shape)[piece.param_index].reshape(piece.param_view_shape)
              for p in params]
        plans.append(blocks.plan(x, o, ps, expand))
    return plans


def _zero_point_params(zps, ct, qdtype, wide):
    """The zero points as the ufunc block functions take them.

    Dequantize (``qdtype=None``) takes ``[zp]``; quantize takes the clamp bounds
    ``qmin - zp``, ``qmax - zp`` and ``zp mod 256`` as a byte; the wide path
    takes ``[zp]`` in int64.
    """
    if zps is None:
        return []
    if wide:
        return [zps.astype(_I64)]
    if qdtype is None:
        return [zps.astype(ct)]
    return _clamp_params(zps, ct, qdtype)


def _wide(zps, ct) -> bool:
    """Whether the zero points need the wide path: float32 compute with some |zp| > NARROW_ZP.

    In float64, ``rint(x / s) + zp`` is exact for every int32 zp wherever the
    clamp does not decide the code anyway, so float64 never needs it.
    """
    if ct != _F32 or zps is None:
        return False
    lo, hi = extremes(zps)
    return lo < -NARROW_ZP or hi > NARROW_ZP


def _clamp_params(zps, ct, qdtype):
    qmin, qmax = QUANT_RANGE[qdtype]
    z = np.asarray(zps).astype(_I64)
    return [(qmin - z).astype(ct), (qmax - z).astype(ct), (z % 256).astype(np.uint8)]


def _kernel_form(xb, ob, params):
    """``(x, o, Runs)`` for the compiled kernels: FlatPlan blocks come that way, others via
    ``blocks.runs``; None where a block has no such form (strided, multi-axis)."""
    if isinstance(params, blocks.Runs):
        return xb, ob, params
    return blocks.runs(xb, ob, params)


def _quantize_block_compiled(xb, ob, params, scratch, *, kernels, qmin, qmax, ct):
    """One block through the compiled kernel; params are ``[scales]`` or ``[scales, zps]`` (both ``ct``)."""
    flat = _kernel_form(xb, ob, params)
    if flat is None:  # a strided or multi-axis block: the ufunc loop, the same bits
        zparams = _clamp_params(params[1], ct, ob.dtype) if len(params) > 1 else []
        _quantize_block(xb, ob, [params[0]] + zparams, scratch, qmin=qmin, qmax=qmax, ct=ct, wide=False)
        return
    x, o, (run, (s, *z)) = flat
    table = None
    if x.dtype == np.float16:
        x, table = x.view(np.uint16), _float16_table()
    elif is_bfloat16(x.dtype):
        x = x.view(np.int16)  # bfloat16 bits: the kernels widen int16 by a shift (loops.load)
    kernels.quantize(x, table, o, run, s, z[0] if z else None, qmin, qmax)


def _dequantize_block_compiled(qb, ob, params, scratch, *, kernels, ct):
    """One block through the compiled kernel; params are ``[scales]`` or ``[scales, zps]`` (both ``ct``)."""
    flat = _kernel_form(qb, ob, params)
    if flat is None:  # the ufunc loop takes the same params
        _dequantize_block(qb, ob, params, scratch, ct=ct, wide=False)
        return
    q, o, (run, (s, *z)) = flat
    if o.dtype == np.float16:
        o = o.view(np.uint16)  # the kernel writes float16 bits
    elif is_bfloat16(o.dtype):
        o = o.view(np.int16)  # the kernel writes bfloat16 bits (loops.store)
    kernels.dequantize(q, o, run, s, z[0] if z else None)


def _small_call(src, scheme, scales, zps, out, loop) -> bool:
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
        loop.block(x, o, blocks.Runs(run, params), _scratch)
        return True
    shape = (-1, count, run)
    with np.errstate(over="ignore", invalid="ignore"):  # as in _run_range
        loop.block(x.reshape(shape), o.reshape(shape),
                   [p.reshape(count, 1) if count > 1 else p.reshape(()) for p in params], _scratch)
    return True


class Loop(NamedTuple):
    """How one call runs its blocks: the block function, the zero-point parameters it
    takes (``zparams(zps)``, after the scales), and whether plans expand short rows."""

    block: Callable
    zparams: Callable
    expand: bool


def block_loop(zps, ct, qdtype=None) -> Loop:
    """The compiled kernels where they serve host arrays and the zps fit them (not wide),
    else ufuncs; for quantize to ``qdtype``, or for dequantize where ``qdtype`` is None."""
    wide = _wide(zps, ct)  # one reduction of the zps per call
    return _loop(ct, qdtype, wide, None if wide else choice.kernels())


@functools.lru_cache(maxsize=64)
def _loop(ct, qdtype, wide, kernels) -> Loop:
    if kernels is not None:
        compiled = _quantize_block_compiled if qdtype is not None else _dequantize_block_compiled
        extra = dict(qmin=QUANT_RANGE[qdtype][0], qmax=QUANT_RANGE[qdtype][1]) if qdtype is not None else {}
        fn = functools.partial(compiled, kernels=kernels, ct=ct, **extra)
        return Loop(fn, lambda z: _zero_point_params(z, ct, None, False), False)
    if qdtype is None:
        fn = functools.partial(_dequantize_block, ct=ct, wide=wide)
    else:
        qmin, qmax = QUANT_RANGE[qdtype]
        fn = functools.partial(_quantize_block, qmin=qmin, qmax=qmax, ct=ct, wide=wide)
    return Loop(fn, lambda z: _zero_point_params(z, ct, qdtype, wide), True)


class NumpyBackend:
    """Host arrays; see the module docstring."""

    name = "numpy"

    @staticmethod
    def empty(src, shape, dtype):
        return np.empty(shape, dtype)

    @staticmethod
    def to_param(arr, src):
        return arr

    @staticmethod
    def check_out(out, src) -> None:
        if not out.flags.writeable:
            raise ValueError("out must be writeable, got a read-only array")
        if np.may_share_memory(out, src):
            raise ValueError("out must not overlap src, got a view of the same memory")

    @staticmethod
    def quantize(src, scheme, scales, zps, out) -> None:
        _call(src, scheme, scales, zps, out, block_loop(zps, scales.dtype, out.dtype))

    @staticmethod
    def dequantize(src, scheme, scales, zps, out) -> None:
        _call(src, scheme, scales, zps, out, block_loop(zps, scales.dtype))


def _call(src, scheme, scales, zps, out, loop) -> None:
    """One call through ``loop``: small calls in one block, the rest planned into blocks."""
    if not _small_call(src, scheme, scales, zps, out, loop):
        _run(_plans(src, out, scheme, [scales] + loop.zparams(zps), loop.expand), loop.block)
