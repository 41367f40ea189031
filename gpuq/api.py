"""The functional API: ``quantize`` and ``dequantize``.

Granularity (``axis`` / ``group_size``) and the shape scales and zps take:

============  ===================================  ==========================================
scheme        asked for with                       scales / zps shape for ``src.shape``
============  ===================================  ==========================================
per-tensor    ``axis=None``                         one element: a scalar, ``()`` or ``(1,)``
per-channel   ``axis=k``, k in [-r, r-1]            ``(shape[k],)``
multi-axis    ``axis=(k1, k2, ...)``                ``tuple(shape[k] for k in sorted axes)``
per-group     ``axis=k, group_size=g``              ``shape`` with dim k -> ceil(shape[k] / g)
============  ===================================  ==========================================
"""

from __future__ import annotations

import numpy as np

from ._dispatch import backend_for, is_device_array
from ._dtypes import FLOAT_DTYPES, QUANT_RANGE, as_dtype, compute_dtype
from ._params import out_array, scales_param, zps_param
from ._scheme import Scheme

__all__ = ["quantize", "dequantize"]

_QUANT_DTYPES = tuple(QUANT_RANGE)


def _result_dtype(dtype, out, allowed, default):
    if dtype is None:
        out_dtype = None if out is None else _array_dtype(out)
        if out_dtype is not None:
            return as_dtype(out_dtype, "out.dtype", allowed)
        return np.dtype(default)
    return as_dtype(dtype, "dtype", allowed)


def _array_dtype(a):
    """The NumPy dtype of ``a``, a CUDA array of another library (torch) included; None if it has none."""
    dt = getattr(a, "dtype", None)
    if dt is None:
        return None
    try:
        return np.dtype(dt)
    except TypeError:  # torch.uint8 and the like: ask the zero-copy CuPy view
        if is_device_array(a):
            from .backends.cuda.backend import as_cupy

            return as_cupy(a).dtype
        return None


def quantize(src, scales, zps=None, *, axis=None, group_size=None, dtype=None, out=None,
             check_values=True):
    """Quantize floats to int8/uint8 codes: ``q = clamp(rint(src / s) + zp, qmin, qmax)``.

    One IEEE division in float32 (float64 for float64 ``src``; float16 is
    widened exactly), round half to even, the zero point added after rounding
    without overflow, saturation to the code range. NaN gives the zero point,
    +/-Inf saturate. Bit-identical on the NumPy and CUDA backends.

    Parameters
    ----------
    src : float16/float32/float64 array (NumPy, or a CUDA array)
        Not modified. Any shape, strides or offset; 0-d and empty included.
    scales : float array, list or number
        Finite and > 0; shape per the table in the module docstring. Used as
        float32 (float64 for float64 ``src``).
    zps : integer array, list or int, optional
        Zero points, any int32 value; ``None`` means symmetric (zp = 0).
    axis : None, int or tuple of ints
        ``None`` per-tensor, ``k`` per-channel, a tuple for multi-axis.
    group_size : int, optional
        With an integer ``axis``: one scale per ``group_size`` consecutive
        elements along it (the last group may be shorter).
    dtype : ``"int8"`` (default), ``"uint8"``, ``"s8"``, ``"u8"`` or a NumPy dtype
        Code dtype; defaults to ``out.dtype`` when ``out`` is given.
    out : array, optional
        Written in place and returned (same object).
    check_values : bool
        For device-resident scales/zps: check their values on the device (one
        reduction and a synchronisation). Host values are always checked.

    Examples
    --------
    >>> import numpy as np, gpuq
    >>> x = np.array([0, 2, 3, 1000, -254, -1000], np.float32)
    >>> gpuq.quantize(x, 2.0, 128, dtype="uint8")
    array([128, 129, 130, 255,   1,   0], dtype=uint8)
    >>> gpuq.quantize(np.array([[1., -3.], [4., 6.]], np.float32), [1.0, 2.0], axis=1)
    array([[ 1, -2],
           [ 4,  3]], dtype=int8)
    """
    backend, src_arr = backend_for(src)
    if src_arr.dtype not in FLOAT_DTYPES:
        raise TypeError(f"src must be float16, float32 or float64 to quantize, got {src_arr.dtype}")
    qdtype = _result_dtype(dtype, out, _QUANT_DTYPES, np.int8)
    scheme = Scheme.build(src_arr.shape, axis, group_size)
    ct = compute_dtype(src_arr.dtype)
    s = scales_param(scales, scheme, ct, backend, src_arr, check_values=check_values)
    z = zps_param(zps, scheme, backend, src_arr, check_values=check_values)
    result = out_array(out, src_arr, qdtype, backend)
    if src_arr.size:
        backend.quantize(src_arr, scheme, s, z, result)
    return out if out is not None else result


def dequantize(src, scales, zps=None, *, axis=None, group_size=None, dtype=None, out=None,
               check_values=True):
    """Dequantize int8/uint8 codes: ``y = (q - zp) * s``.

    ``q - zp`` in integer arithmetic (any int32 zp), converted once to the
    compute type (float32; float64 for float64 output), then one
    multiplication; float16 output is the float32 result rounded to nearest
    even. Bit-identical on the NumPy and CUDA backends.

    Parameters
    ----------
    src : int8/uint8 array (NumPy, or a CUDA array)
        Not modified.
    scales, zps, axis, group_size, out, check_values
        As in :func:`quantize`; scales are float64 for float64 output.
    dtype : ``"float32"`` (default), ``"float16"``, ``"float64"`` (or ``f32``...)
        Output dtype; defaults to ``out.dtype`` when ``out`` is given.

    Examples
    --------
    >>> import numpy as np, gpuq
    >>> gpuq.dequantize(np.array([0, 3, 128, 255], np.uint8), 2.0, 128)
    array([-256., -250.,    0.,  254.], dtype=float32)
    """
    backend, src_arr = backend_for(src)
    if src_arr.dtype not in _QUANT_DTYPES:
        raise TypeError(f"src must be int8 or uint8 to dequantize, got {src_arr.dtype}")
    fdtype = _result_dtype(dtype, out, FLOAT_DTYPES, np.float32)
    scheme = Scheme.build(src_arr.shape, axis, group_size)
    ct = compute_dtype(fdtype)
    s = scales_param(scales, scheme, ct, backend, src_arr, check_values=check_values)
    z = zps_param(zps, scheme, backend, src_arr, check_values=check_values)
    result = out_array(out, src_arr, fdtype, backend)
    if src_arr.size:
        backend.dequantize(src_arr, scheme, s, z, result)
    return out if out is not None else result
