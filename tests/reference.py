"""A deliberately naive statement of the contract (DESIGN.md section 1).

Full-size arrays, no blocks, no threads, no cleverness: float32 division
(float64 for float64 input), ``np.rint``, int64 addition, ``np.clip``. The
parameters are broadcast to the full shape with ``np.repeat``/reshape, written
independently of gpuq's Scheme.
"""

from __future__ import annotations

import numpy as np

QRANGE = {np.dtype(np.int8): (-128, 127), np.dtype(np.uint8): (0, 255)}


def _blocks(shape, block_size):
    return tuple(n if b == -1 or b >= n else b for n, b in zip(shape, block_size))


def expand(param, shape, axis=None, group_size=None, block_size=None):
    """``param`` broadcast to ``shape`` for the given scheme (blocks: each entry repeated over
    its block along every dim, the ragged last block cut)."""
    param = np.asarray(param)
    if block_size is not None:
        full = param
        for d, b in enumerate(_blocks(shape, block_size)):
            full = np.repeat(full, max(b, 1), axis=d)
        return full[tuple(slice(0, n) for n in shape)]
    if axis is None:
        return np.broadcast_to(param.reshape(()), shape)
    if group_size is not None:
        k = axis % len(shape)
        full = np.repeat(param, group_size, axis=k)
        return full[(slice(None),) * k + (slice(0, shape[k]),)]
    axes = sorted(a % len(shape) for a in ((axis,) if np.isscalar(axis) else axis))
    view = [shape[i] if i in axes else 1 for i in range(len(shape))]
    return np.broadcast_to(param.reshape(view), shape)


@np.errstate(over="ignore", invalid="ignore")
def quantize(x, scales, zps=None, *, axis=None, group_size=None, block_size=None, dtype=np.int8):
    dtype = np.dtype(dtype)
    ct = np.float64 if x.dtype == np.float64 else np.float32
    s = expand(np.asarray(scales, ct), x.shape, axis, group_size, block_size)
    r = np.rint(x.astype(ct) / s)
    r = np.where(np.isnan(r), 0, r)
    r = np.clip(r, -(2.0**40), 2.0**40).astype(np.int64)
    if zps is not None:
        r = r + expand(np.asarray(zps, np.int64), x.shape, axis, group_size, block_size)
    qmin, qmax = QRANGE[dtype]
    return np.clip(r, qmin, qmax).astype(dtype)


@np.errstate(over="ignore", invalid="ignore")
def dequantize(q, scales, zps=None, *, axis=None, group_size=None, block_size=None, dtype=np.float32):
    dtype = np.dtype(dtype)
    ct = np.float64 if dtype == np.float64 else np.float32
    d = q.astype(np.int64)
    if zps is not None:
        d = d - expand(np.asarray(zps, np.int64), q.shape, axis, group_size, block_size)
    s = expand(np.asarray(scales, ct), q.shape, axis, group_size, block_size)
    return (d.astype(ct) * s).astype(dtype)


def param_shape(shape, axis=None, group_size=None, block_size=None):
    """The shape scales/zps take for ``shape`` and the scheme (DESIGN.md section 2)."""
    shape = tuple(shape)
    if block_size is not None:
        return tuple(-(-n // max(b, 1)) for n, b in zip(shape, _blocks(shape, block_size)))
    if axis is None:
        return ()
    if group_size is not None:
        k = axis % len(shape)
        return shape[:k] + (-(-shape[k] // group_size),) + shape[k + 1:]
    axes = sorted(a % len(shape) for a in ((axis,) if np.isscalar(axis) else axis))
    return tuple(shape[a] for a in axes)


@np.errstate(over="ignore", invalid="ignore")
def choose_qparams(x, *, axis=None, group_size=None, block_size=None, dtype=np.int8, symmetric=False, eps=None):
    """The documented choose_qparams (gpuq/qparams.py), one slot at a time with a Python loop.

    Returns ``(scales, zps)``, or raises ``ValueError`` where a block's min or
    max is +/-inf once rounded to float32 (no finite scale covers it).
    """
    dtype = np.dtype(dtype)
    qmin, qmax = QRANGE[dtype]
    eps = np.float32(np.finfo(np.float32).tiny if eps is None else eps)
    pshape = param_shape(x.shape, axis, group_size, block_size)
    nslots = int(np.prod(pshape, dtype=np.int64))
    slot = expand(np.arange(nslots).reshape(pshape), x.shape, axis, group_size, block_size)
    flat_slot = np.asarray(slot).reshape(-1)
    order = np.argsort(flat_slot, kind="stable")
    by_slot = x.reshape(-1)[order]
    bounds = np.searchsorted(flat_slot[order], np.arange(nslots + 1))
    scales = np.empty(nslots, np.float32)
    zps = np.empty(nslots, np.int32)
    for p in range(nslots):
        v = by_slot[bounds[p]:bounds[p + 1]]
        v = v[~np.isnan(v)]
        # float64 min/max rounded to float32 once; float16 widened exactly; no number: all zero.
        lo = np.float32(v.min()) if v.size else np.float32(0)
        hi = np.float32(v.max()) if v.size else np.float32(0)
        if np.isinf(lo) or np.isinf(hi):
            raise ValueError(f"slot {p}: {lo}, {hi}")
        if symmetric:
            scales[p] = max(max(abs(lo), abs(hi)) / np.float32(127), eps)
            zps[p] = 0 if qmin < 0 else 128
            continue
        lo0, hi0 = min(lo, np.float32(0)), max(hi, np.float32(0))
        span = np.float32(hi0 - lo0)
        if np.isinf(span):  # hi' - lo' overflows float32: via float64, rounded once
            s = np.float32((np.float64(hi0) - np.float64(lo0)) / np.float64(qmax - qmin))
        else:
            s = np.float32(span / np.float32(qmax - qmin))
        s = max(s, eps)
        scales[p] = s
        zps[p] = int(np.clip(np.float32(qmin) - np.rint(np.float32(lo0 / s)), qmin, qmax))
    scales = scales.reshape(pshape)
    if symmetric and qmin < 0:
        return scales, None
    return scales, zps.reshape(pshape)
