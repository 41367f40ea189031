"""The CUDA backend: the :class:`~gpuq.backends.protocol.Backend` of device arrays.

Device arrays are CuPy arrays, or objects exposing ``__cuda_array_interface__`` or a CUDA
``__dlpack__`` (torch, JAX, Numba), wrapped zero-copy (:func:`.launch.as_cupy`). Each method
chooses the kernels by the code type's row: the affine one-code-per-element codes (int8,
uint8) run ``kernels/quantize.cu``/``dequantize.cu`` (:mod:`.launch`), fp8 and packed int4
``kernels/formats.cu`` (:mod:`.formats`), parameters from data ``kernels/qparams.cu``
(:mod:`.qparams`). Results are CuPy arrays on the device of ``src`` (not device 0), computed on
CuPy's current stream there; CuPy has no fp8 dtype, so fp8 codes live as uint8 bits.

>>> import cupy, gpuq                                   # doctest: +SKIP
>>> gpuq.quantize(cupy.asarray([0.5, 1.5, -300.0], cupy.float32), 1.0)  # doctest: +SKIP
array([   0,    2, -128], dtype=int8)
"""

from __future__ import annotations

import numpy as np

from ..._dtypes import INT32_MAX, INT32_MIN
from . import formats, launch, mse, qparams
from .launch import StreamReaders, as_cupy, cupy_module, device_id

_U8 = np.dtype(np.uint8)


def kernel_range(code, symmetric):
    """``(qmin, qmax, symmetric)`` as the parameter kernels take them (int32 code bounds, and
    ``symmetric`` 1, or 2 for "the whole range": scale ``max|x| / ((qmax - qmin) / 2)`` exact).
    A float code whose largest value is no integer (e2m3's 7.5) is stated by bounds whose exact
    half range it is: ``(-8, 7, 2)``, ``15 / 2 = 7.5``; there is no zero point either way.

    >>> from gpuq._codetypes import CODE_TYPES
    >>> kernel_range(CODE_TYPES["float6_e2m3fn"], True), kernel_range(CODE_TYPES["float4_e2m1fn"], True)
    ((-8, 7, 2), (-6, 6, True))
    """
    if code.qmax == int(code.qmax):
        return int(code.qmin), int(code.qmax), symmetric
    return -int(code.qmax) - 1, int(code.qmax), 2


class CudaBackend:
    """Device arrays; see the module docstring and :mod:`gpuq.backends.protocol`."""

    name = "cuda"
    arrays = "a device"

    @staticmethod
    def as_array(obj, dtype=None):
        arr = as_cupy(obj)
        if dtype is None:
            return arr
        with arr.device:
            return arr.astype(dtype, copy=False)

    @staticmethod
    def empty(like, shape, dtype):
        with like.device:
            return cupy_module().empty(shape, dtype)

    @staticmethod
    def code_storage(code):
        if code.storage == "element" and code.codec == "affine":
            return np.dtype(code.host_dtype), False
        return _U8, True  # packed bytes, or fp8 bits: CuPy has no fp8 dtype

    @staticmethod
    def to_param(arr, src):
        """Host ``arr`` uploaded to src's device (C-contiguous), except one host value, which
        stays on the host and goes to the kernel by value (no upload: the common per-tensor
        call launches one kernel and nothing else); a device ``arr`` on src's device passes
        through; another device is a TypeError."""
        if arr is None:
            return None
        cupy = cupy_module()
        if isinstance(arr, (np.ndarray, np.generic)):
            if arr.size == 1:
                # Read into the launch arguments within this call (launch's by-value map).
                return np.asarray(arr)
            with src.device:
                return cupy.asarray(np.ascontiguousarray(arr))
        dev = as_cupy(arr)
        if device_id(dev) != device_id(src):
            raise TypeError(
                f"scales and zps must be on the device of src (CUDA device {device_id(src)}), "
                f"got an array on CUDA device {device_id(dev)}; gpuq does not copy between "
                f"devices behind your back"
            )
        if dev.flags.c_contiguous:
            return dev
        with src.device:
            return cupy.ascontiguousarray(dev)

    @staticmethod
    def check_out(out, src) -> None:
        if device_id(out) != device_id(src):
            raise TypeError(
                f"out must be on the device of src (CUDA device {device_id(src)}), "
                f"got an array on CUDA device {device_id(out)}"
            )
        if cupy_module().may_share_memory(out, src):
            raise ValueError("out must not overlap src, got a view of the same memory")

    @staticmethod
    def device_key(arr):
        return ("cuda", device_id(arr))

    @staticmethod
    def settle() -> None:
        """Wait once for uploads that will be read from any stream later (the op objects'
        cached parameters): their first use pays one synchronisation, later uses none."""
        cupy_module().cuda.get_current_stream().synchronize()

    @staticmethod
    def track_reads(arrays):
        return StreamReaders(arrays)

    @staticmethod
    def check_scales(arr, argname) -> None:
        """Finite and > 0, checked on the device: one reduction and one synchronisation."""
        cupy = cupy_module()
        with arr.device:
            bad = ~((arr > 0) & (arr < np.inf))  # NaN fails both comparisons
            if not bool(bad.any()):
                return
            flat = int(bad.ravel().argmax())
            value = cupy.asnumpy(arr.ravel()[flat])[()]
        where = f" at index {tuple(int(j) for j in np.unravel_index(flat, arr.shape))}" if arr.ndim else ""
        raise ValueError(f"{argname} must be finite and > 0 in {arr.dtype}, got {value}{where}")

    @staticmethod
    def check_int32(arr, argname) -> None:
        """Every value within int32, checked on the device (min and max: two small reductions)."""
        if arr.size == 0:
            return
        with arr.device:
            lo, hi = int(arr.min()), int(arr.max())
        if lo < INT32_MIN or hi > INT32_MAX:
            bad = lo if lo < INT32_MIN else hi
            raise ValueError(f"{argname} must fit int32 [{INT32_MIN}, {INT32_MAX}], got {bad}")

    @staticmethod
    def check_zero(arr, argname, code) -> None:
        """Every zero point 0, checked on the device (one reduction and a synchronisation)."""
        with arr.device:
            bad = arr != 0
            if not bool(bad.any()):
                return
            value = int(arr.reshape(-1)[int(bad.reshape(-1).argmax())])
        raise ValueError(f"{argname} must be None or all 0 for fp8 codes (ONNX: fp8 has no "
                         f"zero point), got a zero point of {value}")

    @staticmethod
    def quantize(code, src, scheme, scales, zps, out, saturate) -> None:
        if code.codec == "float8" and code.bits < 8:
            formats.quantize_mini(src, scheme, scales, out, code.name)
        elif code.codec == "float8":
            formats.quantize_fp8(src, scheme, scales, out, code.name, saturate)
        elif code.storage == "packed":
            formats.quantize_int4(src, scheme, scales, zps, out, code.signed)
        else:
            launch.run("quantize", src, scheme, scales, zps, out)

    @staticmethod
    def dequantize(code, src, scheme, scales, zps, out) -> None:
        if code.codec == "float8" and code.bits < 8:
            formats.dequantize_mini(src, scheme, scales, out, code.name)
        elif code.codec == "float8":
            formats.dequantize_fp8(src, scheme, scales, out, code.name)
        elif code.storage == "packed":
            formats.dequantize_int4(src, scheme, scales, zps, out, code.signed)
        else:
            launch.run("dequantize", src, scheme, scales, zps, out)

    @staticmethod
    def minmax(x, scheme):
        return qparams.minmax(x, scheme)

    @staticmethod
    def choose_qparams(code, x, scheme, symmetric, eps, scale_dtype, method, check=True):
        qmin, qmax, symmetric = kernel_range(code, symmetric)
        if method == "mse":
            return mse.choose_qparams(x, scheme, code, qmin, qmax, symmetric, eps, scale_dtype)
        return qparams.choose_qparams(x, scheme, qmin, qmax, symmetric, eps, scale_dtype, check)

    @staticmethod
    def quantize_dynamic(code, x, scheme, symmetric, eps, scale_dtype, check=True):
        if code.codec != "affine" or code.storage != "element":  # the fused kernel: int8/uint8
            return None
        return qparams.quantize_dynamic(x, scheme, np.dtype(code.host_dtype), symmetric, eps, scale_dtype, check)
