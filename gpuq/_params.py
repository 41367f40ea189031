"""Validation of scales, zero points and ``out``: one helper for every entry point.

Host values (Python scalars, lists, NumPy arrays) are checked on the host and,
for a device ``src``, uploaded by the backend (except one value per parameter,
which the CUDA kernels take by value). Device arrays are checked for
dtype and shape on the host and for values on the device (one reduction and a
synchronisation; ``check_values=False`` skips it in hot loops).

Host parameters may be in either byte order (``>f4`` scales hold float32
values) and ndarray subclasses are read as their base ndarray; masked arrays
are refused (``TypeError``), as for src (``_dispatch.host_base``). Converting
values to the compute type is part of validation and warns about nothing: a
scale that overflows float32 is reported by the ``ValueError`` alone.
"""

from __future__ import annotations

import math

import numpy as np

from ._dispatch import host_base, is_device_array
from ._dtypes import INT32_MAX, INT32_MIN, native
from .backends.host.backend import extremes


#: Python floats below this in magnitude fit float32 without overflow (errstate costs ~0.7 us).
_NO_OVERFLOW = 3.4e38


def _shape_ok(shape, scheme) -> bool:
    expected = scheme.param_shape
    if tuple(shape) == expected:
        return True
    if scheme.kind == "tensor":
        return len(shape) <= 1 and math.prod(shape) == 1
    return False


def _check_shape(arr, scheme, argname):
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


def _host_array(obj, argname, backend):
    if is_device_array(obj):
        if backend.name == "numpy":
            raise TypeError(
                f"{argname} is a device (CUDA) array but src is a host NumPy array; gpuq does not "
                f"copy between host and device behind your back: pass host {argname} or a device src"
            )
        return None
    if isinstance(obj, np.ndarray):
        return host_base(obj, argname)  # np.matrix, np.memmap: the base view; masked: refused
    try:
        return np.asarray(obj)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{argname} must be an array, a list or a number, got {obj!r}") from exc


def scales_param(obj, scheme, ct, backend, src, *, argname="scales", check_values=True):
    """``obj`` as a ``ct`` array of ``scheme.param_shape`` on ``src``'s backend.

    Raises ``TypeError`` for a non-floating array and ``ValueError`` for a wrong
    shape or a scale that is not finite and > 0 (after rounding to ``ct``).
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
        return backend.to_param(arr, src)
    arr = _host_array(obj, argname, backend)
    if arr is None:
        dev = backend.as_cupy(obj)
        if dev.dtype.kind != "f":
            raise TypeError(f"{argname} must be a floating array (float32), got {dev.dtype}")
        _check_shape(dev, scheme, argname)
        # The device check first (to_param), then any conversion: on src's device, never a
        # silent read of another GPU's memory.
        dev = backend.to_param(dev, src).astype(ct, copy=False).reshape(scheme.param_shape)
        if check_values:
            backend.check_scales(dev, argname)
        return dev
    from_array = isinstance(obj, (np.ndarray, np.generic))
    if arr.dtype.kind != "f" and (from_array or arr.dtype.kind not in "iu"):
        raise TypeError(f"{argname} must be floating (float32), got {arr.dtype}")
    _check_shape(arr, scheme, argname)
    # No copy when the dtype already fits: the backends only read parameters. A value
    # beyond float32 becomes inf here, which the check below reports (no stray warning).
    if arr.dtype.kind == "f" and arr.dtype.itemsize > ct.itemsize:  # narrowing: may overflow
        with np.errstate(over="ignore"):
            arr = arr.astype(ct).reshape(scheme.param_shape)
    else:
        arr = arr.astype(ct, copy=False).reshape(scheme.param_shape)
    lo, hi = extremes(arr)
    if not (lo > 0 and hi < np.inf):  # NaN fails both (min and max propagate it)
        bad = ~(np.isfinite(arr) & (arr > 0))
        i = np.unravel_index(int(np.argmax(bad)), arr.shape)
        where = f" at index {tuple(int(j) for j in i)}" if arr.ndim else ""
        raise ValueError(f"{argname} must be finite and > 0 in {ct.name}, got {arr[i]}{where}")
    return backend.to_param(arr, src)


def zps_param(obj, scheme, backend, src, *, argname="zps", check_values=True):
    """``obj`` as an int32 array of ``scheme.param_shape``, or None (symmetric).

    Raises ``TypeError`` for non-integer zero points and ``ValueError`` for a
    wrong shape or a value outside int32.
    """
    if obj is None:
        return None
    if type(obj) is int and scheme.kind == "tensor":  # the common case, without an array round trip
        if not INT32_MIN <= obj <= INT32_MAX:
            raise ValueError(f"{argname} must fit int32 [{INT32_MIN}, {INT32_MAX}], got {obj}")
        return backend.to_param(np.array(obj, np.int32), src)
    arr = _host_array(obj, argname, backend)
    if arr is None:
        dev = backend.as_cupy(obj)
        if dev.dtype.kind not in "iu":
            raise TypeError(f"{argname} must be integers (int8, uint8 or int32), got {dev.dtype}")
        _check_shape(dev, scheme, argname)
        info = np.iinfo(dev.dtype)
        if check_values and (info.max > INT32_MAX or info.min < INT32_MIN):
            backend.check_int32(dev, argname)
        return backend.to_param(dev, src).astype(np.int32, copy=False).reshape(scheme.param_shape)
    if arr.dtype.kind not in "iu":
        # An empty list holds no float (NumPy makes it float64): as many zero points as an
        # empty tensor needs. Arrays keep their dtype's word.
        if arr.size or isinstance(obj, (np.ndarray, np.generic)) or arr.dtype.kind != "f":
            raise TypeError(f"{argname} must be integers (int8, uint8 or int32), got {arr.dtype}")
        arr = arr.astype(np.int32)
    _check_shape(arr, scheme, argname)
    info = np.iinfo(arr.dtype)
    if arr.size and (info.min < INT32_MIN or info.max > INT32_MAX):  # only wider dtypes need a look at the values
        lo, hi = (int(v) for v in extremes(arr))
        if lo < INT32_MIN or hi > INT32_MAX:
            raise ValueError(f"{argname} must fit int32 [{INT32_MIN}, {INT32_MAX}], "
                             f"got {lo if lo < INT32_MIN else hi}")
    return backend.to_param(arr.astype(np.int32, copy=False).reshape(scheme.param_shape), src)


def out_array(out, src, dtype, backend, shape=None):
    """``(result, copy_to)``: the array the backend writes, and where it goes after.

    Without ``out``, a fresh ``dtype`` array and None. With ``out``, after
    checking it: ``out`` itself (its base ndarray for a subclass) and None; or,
    for a host ``out`` in non-native byte order (``>f4``: float32 values),
    a fresh native array to compute into and ``out`` to copy it to. ``shape``
    (default ``src.shape``): the result's shape, where src holds packed codes.
    """
    shape = tuple(src.shape) if shape is None else tuple(shape)
    if out is None:
        return backend.empty(src, shape, dtype), None
    if backend.name == "numpy":
        if not isinstance(out, np.ndarray):
            raise TypeError(f"out must be a NumPy array for a NumPy src, got {type(out).__name__}")
        out = host_base(out, "out")
    elif not is_device_array(out):
        raise TypeError(f"out must be a device array for a device src, got {type(out).__name__}")
    else:
        out = backend.as_cupy(out)
    if native(out.dtype) != dtype:
        raise TypeError(f"out must have dtype {dtype.name}, got {out.dtype}")
    if tuple(out.shape) != shape:
        raise ValueError(f"out must have shape {shape} (the shape of src), got {tuple(out.shape)}")
    backend.check_out(out, src)
    if not out.dtype.isnative:  # host only: device arrays are native
        return backend.empty(src, shape, dtype), out
    return out, None
