"""The NumPy backend: the contract of DESIGN.md section 1 in cache-sized blocks.

Each block runs a handful of ufuncs with ``out=`` into per-thread scratch of
``_blocks.BLOCK`` elements, so the extra memory of a call is bounded (a few
hundred KiB per thread plus parameter-sized arrays), never a multiple of the
input. Blocks are shared among a small thread pool: NumPy ufuncs release the
GIL, so two cores quantize about twice as fast as one.

Why each step is exact (float32 compute; float64 is the same with more room):

* ``rint(x / s)`` is one IEEE division and round-half-to-even.
* Adding the zero point in float32 is exact while ``|zp| <= 2**23``: a sum
  below 2**24 in magnitude is an exact integer, and a larger one saturates on
  the same side whatever its rounding. Zero points beyond 2**23 take the
  "wide" path: clamp to +/-2**32 (so that any int32 zp keeps the side), then
  int64 arithmetic.
* Dequantize ``(q - zp)`` is exact in float32 for ``|zp| <= 2**23``; beyond,
  the difference is formed in int64 and rounded to float32 once.
"""

from __future__ import annotations

import functools
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .._dtypes import QUANT_RANGE
from . import _blocks

#: Tensors smaller than this run on the calling thread only.
PARALLEL_MIN = 1 << 17
#: Largest |zero point| whose float32 arithmetic is exact (see module docstring).
NARROW_ZP = 2**23
#: Rounded values are clamped here before int64 arithmetic in the wide path.
WIDE_CLAMP = float(2**32)

_F32 = np.dtype(np.float32)
_I64 = np.dtype(np.int64)


class _Scratch(threading.local):
    """Per-thread block buffers, allocated once per (key, dtype)."""

    def __init__(self):
        self.buffers = {}

    def buffer(self, key, dtype):
        buf = self.buffers.get((key, dtype))
        if buf is None:
            buf = self.buffers[(key, dtype)] = np.empty(_blocks.BLOCK, dtype)
        return buf

    def like(self, key, dtype, block):
        """A scratch view of ``dtype`` with the shape of ``block``."""
        return self.buffer(key, dtype)[: block.size].reshape(block.shape)


_scratch = _Scratch()
_pool_lock = threading.Lock()
_pool = None
_num_threads = None


def get_num_threads() -> int:
    """Threads the NumPy backend uses (default: the CPUs this process may use).

    >>> import gpuq
    >>> gpuq.get_num_threads() >= 1
    True
    """
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


def _executor(workers: int) -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gpuq")
        return _pool


def _run(plans, block_fn) -> None:
    work = [(p, b) for p in plans for b in range(p.nblocks)]
    threads = min(get_num_threads(), len(work))
    total = sum(p.size for p in plans)
    if threads <= 1 or total < PARALLEL_MIN:
        _run_range(work, block_fn)
        return
    bounds = [len(work) * i // threads for i in range(threads + 1)]
    pool = _executor(threads - 1)
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


def _quantize_block(xb, ob, params, scratch, *, qmin, qmax, ct, wide):
    s = params[0]
    z = params[1] if len(params) > 1 else None
    t = scratch.like("t", ct, xb)
    np.divide(xb, s, out=t)
    np.rint(t, out=t)
    if wide:
        np.clip(t, -WIDE_CLAMP, WIDE_CLAMP, out=t)
        _replace_nan(t, 0)
        w = scratch.like("w", _I64, xb)
        np.copyto(w, t, casting="unsafe")
        np.add(w, z, out=w)
        np.clip(w, qmin, qmax, out=ob, casting="unsafe")
        return
    if z is not None:
        np.add(t, z, out=t)
    _replace_nan(t, 0 if z is None else z)
    np.clip(t, qmin, qmax, out=ob, casting="unsafe")


def _replace_nan(t, value) -> None:
    # NaN quantizes to the zero point; one cheap reduction finds the rare block that has one.
    if np.isnan(t.min()):
        np.copyto(t, value, where=np.isnan(t))


def _dequantize_block(qb, ob, params, scratch, *, ct, wide):
    s = params[0]
    if len(params) == 1:
        np.multiply(qb, s, out=ob, dtype=ct)
        return
    z = params[1]
    t = scratch.like("t", ct, qb)
    if wide:
        w = scratch.like("w", _I64, qb)
        np.subtract(qb, z, out=w)
        np.copyto(t, w, casting="unsafe")
    else:
        np.subtract(qb, z, out=t, dtype=ct)
    np.multiply(t, s, out=ob)


def _plans(src, out, scheme, params):
    plans = []
    for piece in scheme.pieces():
        x = _split_view(src[piece.src_index], piece.view_shape)
        o = _split_view(out[piece.src_index], piece.view_shape)
        ps = [p.reshape(scheme.param_shape)[piece.param_index].reshape(piece.param_view_shape)
              for p in params]
        plans.append(_blocks.plan(x, o, ps))
    return plans


def _split_view(a, shape):
    """``a`` with one dim split in two (or unchanged): always a view, never a copy."""
    if a.shape == tuple(shape):
        return a
    k = next(i for i, (d, e) in enumerate(zip(a.shape, shape)) if d != e)
    strides = a.strides[:k] + (a.strides[k] * shape[k + 1], a.strides[k]) + a.strides[k + 1:]
    return np.lib.stride_tricks.as_strided(a, shape, strides, writeable=a.flags.writeable)


def _zero_point_params(zps, ct):
    """The zero points as the block functions take them, and whether the wide path is needed."""
    if zps is None:
        return [], False
    wide = ct == _F32 and zps.size > 0 and (int(zps.min()) < -NARROW_ZP or int(zps.max()) > NARROW_ZP)
    return [zps.astype(_I64 if wide else ct)], wide


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
        ct = scales.dtype
        qmin, qmax = QUANT_RANGE[out.dtype]
        zparams, wide = _zero_point_params(zps, ct)
        fn = functools.partial(_quantize_block, qmin=qmin, qmax=qmax, ct=ct, wide=wide)
        _run(_plans(src, out, scheme, [scales] + zparams), fn)

    @staticmethod
    def dequantize(src, scheme, scales, zps, out) -> None:
        ct = scales.dtype
        zparams, wide = _zero_point_params(zps, ct)
        fn = functools.partial(_dequantize_block, ct=ct, wide=wide)
        _run(_plans(src, out, scheme, [scales] + zparams), fn)
