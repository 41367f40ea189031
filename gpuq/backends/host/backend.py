"""The host backend: the :class:`~gpuq.backends.protocol.Backend` of NumPy arrays.

Work runs in cache-sized blocks over a small thread pool (:mod:`.threads`, :mod:`.blocks`),
through the compiled loops (:mod:`.loops`, numba) where :mod:`.choice` says they serve, else
NumPy ufuncs; both give the same bits. Each method chooses the element operation by the code
type's row: the affine one-code-per-element codes (int8, uint8) in :mod:`.affine`, fp8 and packed
int4 in :mod:`.formats`, parameters from data in :mod:`.qparams`. Host arrays in non-native byte
order (``>f4``) hold the same values: src is converted once here.

>>> import numpy as np
>>> from gpuq._codetypes import CODE_TYPES
>>> NumpyBackend.code_storage(CODE_TYPES["int4"]), NumpyBackend.code_storage(CODE_TYPES["uint8"])
((dtype('uint8'), True), (dtype('uint8'), False))
"""

from __future__ import annotations

import numpy as np

from ..._dtypes import INT32_MAX, INT32_MIN
from . import affine, formats, mse, qparams

_U8 = np.dtype(np.uint8)


def _native(a):
    """``a`` in native byte order: itself, or a converted copy (``>f4`` -> ``float32``)."""
    return a if a.dtype.isnative else a.astype(a.dtype.newbyteorder("="))


class _NoReads:
    """Host parameters are read by the calling thread only: nothing to keep alive."""

    def note_read(self) -> None:
        pass

    def release(self) -> None:
        pass


class NumpyBackend:
    """Host arrays; see the module docstring and :mod:`gpuq.backends.protocol`."""

    name = "numpy"
    arrays = "a NumPy"

    @staticmethod
    def as_array(obj, dtype=None):
        arr = obj if isinstance(obj, np.ndarray) else np.asarray(obj)
        return arr if dtype is None else arr.astype(dtype, copy=False)

    @staticmethod
    def empty(like, shape, dtype):
        return np.empty(shape, dtype)

    @staticmethod
    def code_storage(code):
        if code.storage == "packed":
            return _U8, True
        return code.host_array_dtype(), False  # int8/uint8, or ml_dtypes' fp8 dtype

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
    def device_key(arr):
        return ("host",)

    @staticmethod
    def settle() -> None:
        pass

    @staticmethod
    def track_reads(arrays):
        return _NoReads()

    @staticmethod
    def check_scales(arr, argname) -> None:
        lo, hi = affine.extremes(arr)
        if lo > 0 and hi < np.inf:  # NaN fails both (min and max propagate it)
            return
        bad = ~(np.isfinite(arr) & (arr > 0))
        i = np.unravel_index(int(np.argmax(bad)), arr.shape)
        where = f" at index {tuple(int(j) for j in i)}" if arr.ndim else ""
        raise ValueError(f"{argname} must be finite and > 0 in {arr.dtype.name}, got {arr[i]}{where}")

    @staticmethod
    def check_int32(arr, argname) -> None:
        if not arr.size:
            return
        lo, hi = (int(v) for v in affine.extremes(arr))
        if lo < INT32_MIN or hi > INT32_MAX:
            raise ValueError(f"{argname} must fit int32 [{INT32_MIN}, {INT32_MAX}], "
                             f"got {lo if lo < INT32_MIN else hi}")

    @staticmethod
    def check_zero(arr, argname, code) -> None:
        bad = arr != 0
        if bool(bad.any()):
            value = int(arr.reshape(-1)[int(bad.reshape(-1).argmax())])
            raise ValueError(f"{argname} must be None or all 0 for fp8 codes (ONNX: fp8 has no "
                             f"zero point), got a zero point of {value}")

    @staticmethod
    def quantize(code, src, scheme, scales, zps, out, saturate) -> None:
        src = _native(src)
        if code.codec == "float8" and code.storage == "packed":  # fp4
            formats.quantize_fp4(src, scheme, scales, out)
        elif code.codec == "float8":
            formats.quantize_fp8(src, scheme, scales, out.view(_U8), code.fp8, saturate)
        elif code.storage == "packed":
            formats.quantize_int4(src, scheme, scales, zps, out, code.signed)
        else:
            affine.run_call(src, scheme, scales, zps, out, affine.block_loop(zps, scales.dtype, code))

    @staticmethod
    def dequantize(code, src, scheme, scales, zps, out) -> None:
        if code.codec == "float8" and code.storage == "packed":  # fp4
            formats.dequantize_fp4(src, scheme, scales, out)
        elif code.codec == "float8":
            formats.dequantize_fp8(src.view(_U8), scheme, scales, out, code.fp8)
        elif code.storage == "packed":
            formats.dequantize_int4(src, scheme, scales, zps, out, code.signed)
        else:
            affine.run_call(src, scheme, scales, zps, out, affine.block_loop(zps, scales.dtype))

    @staticmethod
    def minmax(x, scheme):
        return qparams.minmax(_native(x), scheme)

    @staticmethod
    def choose_qparams(code, x, scheme, symmetric, eps, scale_dtype, method, check=True):
        if method == "mse":
            return mse.choose_qparams(_native(x), scheme, code, symmetric, eps, scale_dtype)
        return qparams.choose_qparams(_native(x), scheme, code.qmin, code.qmax, symmetric, eps, scale_dtype,
                                      check)

    @staticmethod
    def quantize_dynamic(code, x, scheme, symmetric, eps, scale_dtype, check=True):
        if code.codec != "affine" or code.storage != "element":  # the fused loops: int8/uint8
            return None
        return qparams.quantize_dynamic(_native(x), scheme, code, symmetric, eps, scale_dtype, check)
