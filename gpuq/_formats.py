"""``quantize``/``dequantize`` for the code formats beyond int8/uint8: fp8 and packed int4.

:mod:`gpuq.api` validates what every format shares (src, scales, scheme) and
hands the rest here: the zero points each format allows, where the codes are
stored (:mod:`gpuq._codes`) and which backend method runs.

* fp8 has no zero point (ONNX requires zp = 0): ``zps`` may be None or zeros;
  a non-zero value is a ``ValueError`` (device zps: checked with
  ``check_values``, one reduction and a synchronisation).
* Results: fp8 on the host is an ml_dtypes fp8 array, elsewhere a
  :class:`~gpuq._codes.Codes` of uint8 bits (CuPy has no fp8 dtype; the
  interop layer turns torch's into torch fp8 tensors); int4/uint4 is always a
  :class:`~gpuq._codes.Codes` of packed bytes.
"""

from __future__ import annotations

import math

import numpy as np

from ._codes import Codes
from ._dispatch import backend_for, is_device_array
from ._dtypes import code_format, fp8_dtype, native
from ._params import out_array, zps_param

_U8 = np.dtype(np.uint8)


def _impl(backend):
    """What runs the formats: each backend's ``formats`` module (it sits above the
    machinery of its backend that it reuses)."""
    if backend.name == "numpy":
        from .backends.host import formats

        return formats
    from .backends.cuda import formats

    return formats


def source_format(src, argname="src"):
    """The :class:`~gpuq._dtypes.CodeFormat` of codes ``src`` (a Codes, or an array of an fp8
    dtype, ml_dtypes' on the host), or None for int8/uint8 and anything else.

    An array of ml_dtypes' int4/uint4 (one code per byte) is a ``TypeError``: gpuq's int4
    codes are packed, and reading such an array's bytes as packed nibbles would be wrong.
    """
    if isinstance(src, Codes):
        return code_format(src.dtype)
    dt = getattr(src, "dtype", None)
    code = code_format(dt) if isinstance(dt, np.dtype) else None
    if code is not None and code.kind == "int4":
        how = ("gpuq.pack(src) packs it" if argname == "src" else
               f"pass out=gpuq.Codes(<uint8 array of ceil(n / 2) bytes>, shape, {code.name!r})")
        raise TypeError(f"{argname} must be a gpuq.Codes for {code.name} codes (packed two per byte), "
                        f"got an unpacked ml_dtypes {dt} array: {how}")
    return code


def fp8_zps(zps, scheme, backend, src, check_values):
    """Zero points of fp8 codes: None, or zeros (checked); anything else is a ValueError."""
    z = zps_param(zps, scheme, backend, src, check_values=check_values)
    if z is None or not z.size:
        return
    # Values given on the host are always checked (no device round trip); device zps
    # only with check_values, which costs a reduction and a synchronisation.
    if not is_device_array(zps):
        check_fp8_zps(np.asarray(zps))
    elif check_values:
        check_fp8_zps(z)


def check_fp8_zps(z):
    """``ValueError`` unless every zero point in ``z`` (NumPy or CuPy) is 0."""
    bad = z != 0
    if bool(bad.any()):
        v = int(z.reshape(-1)[int(bad.reshape(-1).argmax())])
        raise ValueError("zps must be None or all 0 for fp8 codes (ONNX: fp8 has no zero "
                         f"point), got a zero point of {v}")


def quantize(code, backend, src, scheme, s, zps, out, saturate, check_values):
    """Quantize ``src`` (validated, on ``backend``) to the codes of format ``code``."""
    if code.kind == "fp8":
        fp8_zps(zps, scheme, backend, src, check_values)
        result, bits = _fp8_out(code, backend, src, out)
        if src.size:
            _impl(backend).quantize_fp8(src, scheme, s, bits, code.fmt, saturate)
        return result
    z = zps_param(zps, scheme, backend, src, check_values=check_values)
    result = _int4_out(code, backend, src, out)
    if src.size:
        _impl(backend).quantize_int4(src, scheme, s, z, backend_for(result.data, "out.data")[1],
                              code.signed)
    return result


def _fp8_out(code, backend, src, out):
    """``(result, bits)``: what quantize returns, and the uint8 bits the backend writes.

    ``out`` may be the Codes of fp8 bits on either backend, or on the host an ml_dtypes
    fp8 array (1 byte: always native, never copied back)."""
    shape = tuple(src.shape)
    if backend.name == "numpy" and not isinstance(out, Codes):
        result, _ = out_array(out, src, fp8_dtype(code.name), backend)
        return (out if out is not None else result), result.view(_U8)
    if out is None:
        bits = backend.empty(src, shape, _U8)
        return Codes(bits, shape, code.name), bits
    _check_codes_out(out, code, shape)  # CuPy has no fp8 dtype: Codes only
    bits, _ = out_array(out.data, src, _U8, backend)
    return out, bits


def _int4_out(code, backend, src, out):
    shape = tuple(src.shape)
    if out is None:
        return Codes(backend.empty(src, ((math.prod(shape) + 1) // 2,), _U8), shape, code.name)
    _check_codes_out(out, code, shape)
    out_array(out.data, src, _U8, backend, shape=tuple(out.data.shape))  # world, device, overlap
    return out


def _check_codes_out(out, code, shape):
    if not isinstance(out, Codes):
        raise TypeError(f"out must be a gpuq.Codes for {code.name} codes, got {type(out).__qualname__}")
    if out.dtype != code.name or out.shape != shape:
        raise ValueError(f"out must be Codes of dtype {code.name} and shape {shape} (src's), "
                         f"got dtype {out.dtype} and shape {out.shape}")


def dequantize_codes(src):
    """``(code, backend, data, shape)`` of codes ``src``: a Codes, or an fp8 array (its bits)."""
    if isinstance(src, Codes):
        backend, data = backend_for(src.data, "src.data")
        return code_format(src.dtype), backend, data, src.shape
    backend, arr = backend_for(src)
    code = code_format(native(arr.dtype))
    return code, backend, arr.view(_U8), tuple(arr.shape)


def dequantize(code, backend, data, scheme, s, zps, result, check_values):
    """``result = (q - zp) * s`` for codes of ``code`` held in ``data`` (uint8 bits / packed)."""
    if code.kind == "fp8":
        fp8_zps(zps, scheme, backend, data, check_values)
        if result.size:
            _impl(backend).dequantize_fp8(data, scheme, s, result, code.fmt)
        return
    z = zps_param(zps, scheme, backend, data, check_values=check_values)
    if result.size:
        _impl(backend).dequantize_int4(data, scheme, s, z, result, code.signed)
