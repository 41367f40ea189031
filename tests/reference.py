"""A deliberately naive statement of the contract (DESIGN.md section 1).

Full-size arrays, no blocks, no threads, no cleverness: float32 division
(float64 for float64 input), ``np.rint``, int64 addition, ``np.clip``. The
parameters are broadcast to the full shape with ``np.repeat``/reshape, written
independently of gpuq's Scheme.
"""

from __future__ import annotations

import numpy as np

QRANGE = {np.dtype(np.int8): (-128, 127), np.dtype(np.uint8): (0, 255)}


def expand(param, shape, axis=None, group_size=None):
    """``param`` broadcast to ``shape`` for the given scheme."""
    param = np.asarray(param)
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
def quantize(x, scales, zps=None, *, axis=None, group_size=None, dtype=np.int8):
    dtype = np.dtype(dtype)
    ct = np.float64 if x.dtype == np.float64 else np.float32
    s = expand(np.asarray(scales, ct), x.shape, axis, group_size)
    r = np.rint(x.astype(ct) / s)
    r = np.where(np.isnan(r), 0, r)
    r = np.clip(r, -(2.0**40), 2.0**40).astype(np.int64)
    if zps is not None:
        r = r + expand(np.asarray(zps, np.int64), x.shape, axis, group_size)
    qmin, qmax = QRANGE[dtype]
    return np.clip(r, qmin, qmax).astype(dtype)


@np.errstate(over="ignore", invalid="ignore")
def dequantize(q, scales, zps=None, *, axis=None, group_size=None, dtype=np.float32):
    dtype = np.dtype(dtype)
    ct = np.float64 if dtype == np.float64 else np.float32
    d = q.astype(np.int64)
    if zps is not None:
        d = d - expand(np.asarray(zps, np.int64), q.shape, axis, group_size)
    s = expand(np.asarray(scales, ct), q.shape, axis, group_size)
    return (d.astype(ct) * s).astype(dtype)
