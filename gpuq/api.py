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

Host arrays at the edges, the same in every entry point (:func:`quantize`,
:func:`dequantize`, :func:`gpuq.choose_qparams`, :func:`gpuq.quantize_dynamic`
and the op objects), with the compiled and the NumPy loops alike:

* ndarray subclasses (``np.matrix``, ``np.memmap``, ...) as src, scales, zps
  or ``out`` are read as their base ``np.ndarray`` (a view, no copy); results
  are plain ndarrays (``out=`` returns the caller's object, written in place).
  Masked arrays (``numpy.ma``) raise ``TypeError``: gpuq cannot honour a mask.
* Any byte order: a ``>f4`` src holds float32 values and is read as such
  (converted to native order first: one copy); scales and zps likewise; an
  ``out`` in non-native order is written correctly (through a native
  temporary). A ``dtype`` argument selects the type, not the byte order:
  results are native, and ``dtype=">f4"`` is a ``TypeError`` (NumPy's
  ufuncs refuse it too); pass ``out=`` for another order.
* Scales are used in the compute type: float32, or float64 with float64 src
  (quantize) or float64 output (dequantize). A Python float or float64 scale
  is rounded to float32 once where the compute type is float32, and kept as
  it is for float64; float32 scales are widened exactly. Validation converts
  quietly: a scale beyond float32 (``1e39``) raises ``ValueError`` without a
  ``RuntimeWarning`` first.
"""

from __future__ import annotations

import math

import numpy as np

from ._codes import Codes
from ._dispatch import backend_for, source_codes
from ._dtypes import FLOAT_DTYPES, compute_dtype, native
from ._interop import callers_type
from ._params import (check_saturate, codes_out, float_dtype, floats_out, quantize_code, scales_param,
                      zps_param)
from ._scheme import Scheme

__all__ = ["quantize", "dequantize"]


@callers_type
def quantize(src, scales, zps=None, *, axis=None, group_size=None, block_size=None, dtype=None,
             out=None, check_values=True, saturate=True, global_scale=None):
    """Quantize floats to codes: ``q = clamp(rint(src / s) + zp, qmin, qmax)``, or fp8(src / s).

    One IEEE division in float32 (float64 for float64 ``src``; float16 and
    bfloat16 are widened exactly), round half to even, the zero point added after rounding
    without overflow, saturation to the code range. NaN gives the zero point,
    +/-Inf saturate. Bit-identical on the NumPy and CUDA backends.

    Parameters
    ----------
    src : float16/float32/float64/bfloat16 array (NumPy, or a CUDA array)
        bfloat16 is ``ml_dtypes.bfloat16`` (recognised by name: gpuq does not
        import ml_dtypes to read it).
        Not modified. Any shape, strides, offset or byte order; 0-d and empty
        included. ndarray subclasses are read as their base ndarray, masked
        arrays refused (module docstring).
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
    dtype : ``"int8"`` (default), ``"uint8"``, ``"int4"``, ``"uint4"``, ``"float8_e4m3fn"``, ``"float8_e5m2"``
        Code dtype (oneDNN's ``s8``, ``u8``, ``s4``, ``u4``, ``f8_e4m3``,
        ``f8_e5m2`` too, or a NumPy/ml_dtypes dtype); defaults to ``out``'s
        when ``out`` is given.
        int4/uint4: ranges [-8, 7] and [0, 15], the result a :class:`gpuq.Codes`
        of packed bytes (two codes per byte, ONNX's order).
        fp4/fp6 (``float4_e2m1fn``, ``float6_e2m3fn``, ``float6_e3m2fn``): the same, always
        saturating, NaN -> the +0 code (README, "Code dtypes").
        fp8: ``fp8(src / s)`` rounded to nearest even (float64 ``src``: its
        quotient via float32), no zero point (``zps`` None or zeros), NaN
        stays NaN; an ml_dtypes fp8 array for NumPy ``src``, a torch fp8
        tensor for torch, a :class:`gpuq.Codes` of the bits for CuPy.
    out : array, optional
        Written in place and returned (same object); a host ``out`` may be
        in either byte order. A :class:`gpuq.Codes` for int4/uint4 (and CuPy fp8).
    check_values : bool
        For device-resident scales/zps: check their values on the device (one
        reduction and a synchronisation). Host values are always checked.
    saturate : bool
        fp8 only (ONNX's attribute): True (default) maps values beyond the
        largest finite code, +/-Inf included, to it; False gives ml_dtypes' and
        ONNX's non-saturating cast (e4m3fn: NaN, e5m2: +/-Inf).
    global_scale : float, optional
        NVFP4 (float4_e2m1fn codes only): ``scales`` are e4m3 block scales ``s_b`` and each
        block uses ``float32(s_b / global_scale)`` (:func:`gpuq.global_scale`).

    Examples
    --------
    >>> import numpy as np, gpuq
    >>> x = np.array([0, 2, 3, 1000, -254, -1000], np.float32)
    >>> gpuq.quantize(x, 2.0, 128, dtype="uint8")
    array([128, 129, 130, 255,   1,   0], dtype=uint8)
    >>> gpuq.quantize(np.array([[1., -3.], [4., 6.]], np.float32), [1.0, 2.0], axis=1)
    array([[ 1, -2],
           [ 4,  3]], dtype=int8)
    >>> gpuq.quantize(np.array([1.0, 500.0, -0.3], np.float32), 1.0, dtype="float8_e4m3fn")
    array([1, 448, -0.3125], dtype='float8_e4m3fn')
    """
    backend, x = backend_for(src)
    fdtype = native(x.dtype)  # >f4 holds float32 values
    if fdtype not in FLOAT_DTYPES:
        raise TypeError(f"src must be float16, float32, float64 or bfloat16 to quantize, got {x.dtype}")
    code = quantize_code(dtype, out)
    check_saturate(saturate, code)
    scheme = Scheme.build(x.shape, axis, group_size, block_size)
    s = _nvfp4_scales(scales_param(scales, scheme, compute_dtype(fdtype), backend, check_values=check_values),
                      global_scale, code)
    z = zps_param(zps, code, scheme, backend, check_values=check_values)
    return encode(backend, x, scheme, code, s, z, out, saturate)


def encode(backend, x, scheme, code, s, z, out=None, saturate=True):
    """The codes of ``x`` (a ``backend`` array) from parameters in the compute type and
    ``scheme.param_shape`` (``z`` int32 or None), checked by :func:`quantize` or computed by
    gpuq itself (``quantize_dynamic(..., check_values=False)`` hands on a scale +Inf as it
    is): into ``out`` (checked here) or a new array, a :class:`Codes` where the backend keeps
    codes as bits.

    >>> from gpuq._dispatch import backend_for
    >>> from gpuq._codetypes import as_code_type
    >>> backend, x = backend_for(np.float32([1.0, np.inf, -2.0]))
    >>> encode(backend, x, Scheme.build(x.shape), as_code_type("int8"), np.float32(np.inf), None)
    array([0, 0, 0], dtype=int8)
    """
    target = codes_out(out, code, x.shape, backend)
    if target is None:
        stored, in_codes = backend.code_storage(code)
        shape = (code.packed_size(x.size),) if code.storage == "packed" else x.shape
        target = backend.empty(x, shape, stored)
        result = Codes(target, x.shape, code.name) if in_codes else target
    else:
        backend.check_out(target, x)
        result = out
    if x.size:
        backend.quantize(code, x, scheme, backend.to_param(s, x), backend.to_param(z, x), target,
                         bool(saturate))
    return result


@callers_type
def dequantize(src, scales, zps=None, *, axis=None, group_size=None, block_size=None, dtype=None,
               out=None, check_values=True, global_scale=None):
    """Dequantize int8/uint8 codes: ``y = (q - zp) * s``.

    ``q - zp`` in integer arithmetic (any int32 zp), converted once to the
    compute type (float32; float64 for float64 output), then one
    multiplication; float16 and bfloat16 output is the float32 result rounded
    to nearest even (bfloat16: bit-identical to ml_dtypes' cast of it). Bit-identical on the NumPy and CUDA backends.

    Parameters
    ----------
    src : int8/uint8 array (NumPy, or a CUDA array), an fp8 array or a :class:`gpuq.Codes`
        Not modified. fp8 codes (ml_dtypes' on the host, torch's) are widened
        exactly; a NaN code gives the output type's default quiet NaN with the
        code's sign (the same bits on both backends), e5m2's Inf gives Inf.
        Codes carry their shape (packed int4/uint4, CuPy fp8 bits).
    scales, zps, axis, group_size, out, check_values
        As in :func:`quantize`; scales are float64 for float64 output.
    dtype : ``"float32"`` (default), ``"float16"``, ``"float64"``, ``"bfloat16"`` (or ``f32``, ``bf16``...)
        Output dtype; defaults to ``out.dtype`` when ``out`` is given. Naming
        bfloat16 imports ``ml_dtypes`` (``ImportError`` where it is missing).

    Examples
    --------
    >>> import numpy as np, gpuq
    >>> gpuq.dequantize(np.array([0, 3, 128, 255], np.uint8), 2.0, 128)
    array([-256., -250.,    0.,  254.], dtype=float32)
    >>> gpuq.dequantize(np.array([1, 3, 127], np.int8), 0.1, dtype="bf16")  # doctest: +SKIP
    array([0.100098, 0.300781, 12.6875], dtype=bfloat16)
    """
    backend, code, data, shape = source_codes(src)
    fdtype = float_dtype(dtype, out, FLOAT_DTYPES, np.float32)
    scheme = Scheme.build(shape, axis, group_size, block_size)
    s = _nvfp4_scales(scales_param(scales, scheme, compute_dtype(fdtype), backend, check_values=check_values),
                      global_scale, code)
    z = zps_param(zps, code, scheme, backend, check_values=check_values)
    target, copy_to = floats_out(out, fdtype, shape, backend)
    if out is not None:
        backend.check_out(target if copy_to is None else copy_to, data)
    if target is None:  # no out, or a host out in another byte order: computed natively first
        target = backend.empty(data, shape, fdtype)
    if math.prod(shape):
        backend.dequantize(code, data, scheme, backend.to_param(s, data), backend.to_param(z, data), target)
    if copy_to is not None:
        np.copyto(copy_to, target)
    return out if out is not None else target


def _nvfp4_scales(s, global_scale, code):
    """NVFP4's block scale ``float32(s_b / gs)`` where ``global_scale`` is given (fp4 only)."""
    if global_scale is None:
        return s
    from . import _nvfp4

    if not code.takes_global_scale:
        raise ValueError(f"global_scale applies to float4_e2m1fn codes (NVFP4) only, got {code.name} codes")
    return _nvfp4.block_scales(s, _nvfp4.check_global_scale(global_scale)).astype(s.dtype)
