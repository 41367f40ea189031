"""Validation of scales, zero points, the code type and ``out``: one helper each, for every
entry point and every code type (the rules come from the row of :mod:`gpuq._codetypes`).

Nothing here touches ``src``: the helpers take what they check and the backend it will run on
(:func:`gpuq._dispatch.backend_for`), and the caller places the checked parameters for src
(``backend.to_param``) and allocates results where src lives (``backend.empty``). Host values
(Python scalars, lists, NumPy arrays) are checked on the host, through the host backend's
checks; device arrays are checked for dtype and shape on the host and for values on their
device (one reduction and a synchronisation; ``check_values=False`` skips it in hot loops).

Host parameters may be in either byte order (``>f4`` scales hold float32 values) and ndarray
subclasses are read as their base ndarray; masked arrays are refused (``TypeError``), as for
src (``_dispatch.host_base``). Converting values to the compute type is part of validation and
warns about nothing: a scale that overflows float32 is reported by the ``ValueError`` alone.

>>> import numpy as np
>>> from gpuq._scheme import Scheme
>>> from gpuq.backends.host.backend import NumpyBackend
>>> scales_param([0.5, 2.0], Scheme.build((2, 3), 0), np.dtype(np.float32), NumpyBackend)
array([0.5, 2. ], dtype=float32)
"""

from __future__ import annotations

import math

import numpy as np

from ._codes import Codes
from ._codetypes import as_code_type, code_type
from ._dispatch import backend_for, host_backend, host_base, is_device_array
from ._dtypes import INT32_MAX, INT32_MIN, as_dtype, native

#: Python floats below this in magnitude fit float32 without overflow (errstate costs ~0.7 us).
_NO_OVERFLOW = 3.4e38


# -- the code type ------------------------------------------------------------------------------

def quantize_code(dtype, out):
    """The row quantize writes: ``dtype``'s, else ``out``'s (an int8/uint8/fp8 array or a
    Codes), else int8. Errors name every code dtype."""
    if dtype is not None:
        return as_code_type(dtype)
    if out is None:
        return as_code_type("int8")
    if isinstance(out, Codes):
        return as_code_type(out.dtype)
    out_dtype = _array_dtype(out)
    if out_dtype is None:  # not an array: codes_out says what out must be
        return as_code_type("int8")
    code = code_type(out_dtype)
    if code is not None and code.storage == "packed":
        raise TypeError(f"out must be a gpuq.Codes for {code.name} codes (packed two per byte), "
                        f"got an unpacked ml_dtypes {code.name} array: pass out=gpuq.Codes(<uint8 "
                        f"array of ceil(n / 2) bytes>, shape, {code.name!r})")
    if code is None:
        as_code_type(out_dtype, "out.dtype")  # its TypeError names what came
    return code


def check_saturate(saturate, code) -> None:
    """``saturate`` is a bool, and False only where the row has ONNX's saturate option (fp8)."""
    if not isinstance(saturate, (bool, np.bool_)):
        raise TypeError(f"saturate must be True or False, got {saturate!r}")
    if not saturate and not code.saturate_option:
        name = code.name if code.codec != "affine" else "integer"
        raise ValueError(f"saturate=False applies to fp8 codes only (ONNX; fp4 and fp6 always saturate), got it with {name} codes")


def float_dtype(dtype, out, allowed, default):
    """A float dtype argument, else ``out``'s dtype (any byte order), else ``default``."""
    if dtype is None:
        out_dtype = None if out is None else _array_dtype(out)
        if out_dtype is not None:
            return as_dtype(out_dtype, "out.dtype", allowed, any_byte_order=True)
        return np.dtype(default)
    return as_dtype(dtype, "dtype", allowed)


def _array_dtype(a):
    """The NumPy dtype of ``a``, a CUDA array of another library (torch) included; None if it has none."""
    dt = getattr(a, "dtype", None)
    if dt is None:
        return None
    try:
        return np.dtype(dt)
    except TypeError:  # torch.uint8 and the like: ask the backend's zero-copy view
        if is_device_array(a):
            backend, arr = backend_for(a, "out")
            return arr.dtype
        return None


# -- scales and zero points ------------------------------------------------------------------------

def _shape_ok(shape, scheme) -> bool:
    expected = scheme.param_shape
    if tuple(shape) == expected:
        return True
    if scheme.kind == "tensor":
        return len(shape) <= 1 and math.prod(shape) == 1
    return False


def check_shape(arr, scheme, argname):
    """``ValueError`` unless ``arr`` has the parameter shape of ``scheme``."""
    if _shape_ok(arr.shape, scheme):
        return
    expected = scheme.param_shape
    if scheme.kind == "tensor":
        raise ValueError(
            f"{argname} must have exactly 1 element for per-tensor (de)quantization, "
            f"got shape {tuple(arr.shape)}"
        )
    if len(expected) == 1 and arr.ndim == 1:
        raise ValueError(
            f"{argname} must have {expected[0]} elements for {scheme.describe()}, got {arr.shape[0]}"
        )
    raise ValueError(
        f"{argname} must have shape {expected} for {scheme.describe()}, got shape {tuple(arr.shape)}"
    )


def _host_values(obj, argname, backend):
    """``(host_backend, host array)``, or ``(device backend, None)`` for a device array."""
    if is_device_array(obj):
        if backend is host_backend():
            raise TypeError(
                f"{argname} is a device (CUDA) array but src is a host NumPy array; gpuq does not "
                f"copy between host and device behind your back: pass host {argname} or a device src"
            )
        return backend, None
    if isinstance(obj, np.ndarray):
        arr = host_base(obj, argname)  # np.matrix, np.memmap: the base view; masked: refused
    else:
        try:
            arr = np.asarray(obj)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{argname} must be an array, a list or a number, got {obj!r}") from exc
    return host_backend(), arr


def scales_param(obj, scheme, ct, backend, *, argname="scales", check_values=True):
    """``obj`` as a ``ct`` array of ``scheme.param_shape``, checked (not yet placed for src).

    Raises ``TypeError`` for a non-floating array and ``ValueError`` for a wrong shape or a
    scale that is not finite and > 0 (after rounding to ``ct``). Device scales are checked on
    their device unless ``check_values`` is False.
    """
    if obj is None:
        raise TypeError(f"{argname} is required, got None")
    if type(obj) is float and scheme.kind == "tensor":  # the common case, without an array round trip
        if abs(obj) < _NO_OVERFLOW:
            arr = np.array(obj, ct)
        else:  # 1e39 -> inf in float32 (NaN too comes here): the ValueError below says so, alone
            with np.errstate(over="ignore"):
                arr = np.array(obj, ct)
        if not (arr > 0 and arr < np.inf):
            raise ValueError(f"{argname} must be finite and > 0 in {ct.name}, got {arr}")
        return arr
    checker, arr = _host_values(obj, argname, backend)
    if arr is None:
        dev = backend.as_array(obj)
        if dev.dtype.kind != "f":
            raise TypeError(f"{argname} must be a floating array (float32), got {dev.dtype}")
        check_shape(dev, scheme, argname)
        # Converted on its own device: placing it for src (to_param) says if that is another one.
        dev = backend.as_array(dev, ct).reshape(scheme.param_shape)
        if check_values:
            backend.check_scales(dev, argname)
        return dev
    from_array = isinstance(obj, (np.ndarray, np.generic))
    if arr.dtype.kind != "f" and (from_array or arr.dtype.kind not in "iu"):
        raise TypeError(f"{argname} must be floating (float32), got {arr.dtype}")
    check_shape(arr, scheme, argname)
    # No copy when the dtype already fits: the backends only read parameters. A value
    # beyond float32 becomes inf here, which the check below reports (no stray warning).
    if arr.dtype.kind == "f" and arr.dtype.itemsize > ct.itemsize:  # narrowing: may overflow
        with np.errstate(over="ignore"):
            arr = arr.astype(ct).reshape(scheme.param_shape)
    else:
        arr = arr.astype(ct, copy=False).reshape(scheme.param_shape)
    checker.check_scales(arr, argname)
    return arr


def zps_param(obj, code, scheme, backend, *, argname="zps", check_values=True):
    """``obj`` as an int32 array of ``scheme.param_shape``, or None (symmetric, or a code type
    without zero points: ``code.zero_point == "none"``, where only zeros are accepted).

    Raises ``TypeError`` for non-integer zero points and ``ValueError`` for a wrong shape, a
    value outside int32, or a non-zero value where the code type has none (host values always;
    device values with ``check_values``).
    """
    if obj is None:
        return None
    if type(obj) is int and scheme.kind == "tensor":  # the common case, without an array round trip
        if not INT32_MIN <= obj <= INT32_MAX:
            raise ValueError(f"{argname} must fit int32 [{INT32_MIN}, {INT32_MAX}], got {obj}")
        if obj == 0 or code.zero_point != "none":
            return None if code.zero_point == "none" else np.array(obj, np.int32)
    checker, arr = _host_values(obj, argname, backend)
    if arr is None:
        dev = backend.as_array(obj)
        if dev.dtype.kind not in "iu":
            raise TypeError(f"{argname} must be integers (int8, uint8 or int32), got {dev.dtype}")
        check_shape(dev, scheme, argname)
        info = np.iinfo(dev.dtype)
        if check_values and (info.max > INT32_MAX or info.min < INT32_MIN):
            backend.check_int32(dev, argname)
        dev = backend.as_array(dev, np.int32).reshape(scheme.param_shape)
        if code.zero_point == "none":
            if check_values and dev.size:
                backend.check_zero(dev, argname, code)
            return None
        return dev
    if arr.dtype.kind not in "iu":
        # An empty list holds no float (NumPy makes it float64): as many zero points as an
        # empty tensor needs. Arrays keep their dtype's word.
        if arr.size or isinstance(obj, (np.ndarray, np.generic)) or arr.dtype.kind != "f":
            raise TypeError(f"{argname} must be integers (int8, uint8 or int32), got {arr.dtype}")
        arr = arr.astype(np.int32)
    check_shape(arr, scheme, argname)
    info = np.iinfo(arr.dtype)
    if arr.size and (info.min < INT32_MIN or info.max > INT32_MAX):  # only wider dtypes need a look
        checker.check_int32(arr, argname)
    arr = arr.astype(np.int32, copy=False).reshape(scheme.param_shape)
    if code.zero_point == "none":
        checker.check_zero(arr, argname, code)  # host values: always
        return None
    return arr


# -- out -------------------------------------------------------------------------------------------

def _out_array(out, dtype, shape, backend, argname="out"):
    """``out`` as the backend's array, checked for kind, dtype (native or not) and shape."""
    out_backend = None
    if isinstance(out, np.ndarray) or is_device_array(out):
        out_backend, out = backend_for(out, argname)  # a host subclass: its base ndarray; masked: refused
    if out_backend is not backend:
        raise TypeError(f"{argname} must be {backend.arrays} array for {backend.arrays} src, "
                        f"got {type(out).__name__}")
    if native(out.dtype) != dtype:
        raise TypeError(f"{argname} must have dtype {dtype.name}, got {out.dtype}")
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"{argname} must have shape {tuple(shape)} (the shape of src), got {tuple(out.shape)}")
    return out


def codes_out(out, code, shape, backend):
    """The array quantize writes for a given ``out`` (checked against the row's storage here),
    or None: then the caller allocates ``backend.code_storage(code)`` where src lives."""
    if out is None:
        return None
    dtype, in_codes = backend.code_storage(code)
    if isinstance(out, Codes) or in_codes:
        if not isinstance(out, Codes):
            raise TypeError(f"out must be a gpuq.Codes for {code.name} codes, got {type(out).__qualname__}")
        if out.dtype != code.name or out.shape != tuple(shape):
            raise ValueError(f"out must be Codes of dtype {code.name} and shape {tuple(shape)} (src's), "
                             f"got dtype {out.dtype} and shape {out.shape}")
        return _out_array(out.data, np.dtype(np.uint8), tuple(out.data.shape), backend, "out.data")
    return _out_array(out, dtype, shape, backend)


def floats_out(out, dtype, shape, backend):
    """``(array, copy_to)`` dequantize writes for a given ``out``: ``out`` itself (its base
    ndarray), or for a host ``out`` in non-native byte order None (the caller computes into a
    fresh native array) and ``out`` to copy it to; ``(None, None)`` without ``out``."""
    if out is None:
        return None, None
    arr = _out_array(out, dtype, shape, backend)
    if not arr.dtype.isnative:  # host only: device arrays are native
        return None, arr
    return arr, None
