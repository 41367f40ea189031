"""Which backend serves an array, decided without importing CuPy.

A NumPy array goes to the NumPy backend. A CuPy array, or any object that
exposes ``__cuda_array_interface__`` or a CUDA ``__dlpack__`` (PyTorch, JAX,
Numba arrays), goes to the CUDA backend, which is imported only then.

Host arrays at the edges (one rule for every entry point):

* ndarray subclasses (``np.matrix``, ``np.memmap``, ...) are read as their
  base ``np.ndarray`` (a view, no copy) and results are plain ndarrays, as
  from ``np.asarray``; a masked array (``numpy.ma``) is refused with
  ``TypeError``: its mask would be silently dropped.
* Non-native byte order (``>f4`` on a little-endian machine) holds the same
  values: :func:`host_native` converts such a src to native order (one copy).
"""

from __future__ import annotations

import sys

import numpy as np

# DLPack device types that live on a CUDA device (kDLCUDA, kDLCUDAManaged).
_DLPACK_CUDA = (2, 13)


def is_device_array(obj) -> bool:
    """True for CuPy arrays and objects exposing CUDA memory (no import of CuPy)."""
    if isinstance(obj, np.ndarray):
        return False
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(obj, cupy.ndarray):
        return True
    # On the instance: a CPU torch tensor's class has the property, which raises for it.
    if hasattr(obj, "__cuda_array_interface__"):
        return True
    dlpack_device = getattr(obj, "__dlpack_device__", None)
    if dlpack_device is not None and hasattr(obj, "__dlpack__"):
        try:
            return int(dlpack_device()[0]) in _DLPACK_CUDA
        except Exception:
            return False
    return False


def host_base(arr, argname: str):
    """Host array ``arr`` as a base ``np.ndarray`` (a view of the same memory, no copy).

    Raises ``TypeError`` for a masked array: gpuq would read the values under
    the mask and drop the mask, a silent change of meaning.

    >>> class Tagged(np.ndarray): ...
    >>> t = np.arange(3.0).view(Tagged)
    >>> type(host_base(t, "src")).__name__, np.shares_memory(host_base(t, "src"), t)
    ('ndarray', True)
    """
    if type(arr) is np.ndarray:
        return arr
    ma = sys.modules.get("numpy.ma")  # not imported: arr cannot be a masked array
    if ma is not None and isinstance(arr, ma.MaskedArray):
        raise TypeError(
            f"{argname} must not be a masked array (numpy.ma): gpuq cannot honour a mask; "
            f"pass {argname}.filled(value), or {argname}.data to ignore the mask"
        )
    return arr.view(np.ndarray)


def host_native(arr):
    """Host array ``arr`` in native byte order: itself, or a converted copy (``>f4`` -> ``float32``).

    >>> y = host_native(np.array([1.5, -2.0], ">f4"))
    >>> y.dtype == np.float32, y.dtype.isnative, y.tolist()
    (True, True, [1.5, -2.0])
    """
    if arr.dtype.isnative:
        return arr
    return arr.astype(arr.dtype.newbyteorder("="))


def host_backend():
    """The backend of host (NumPy) arrays: where host values are checked, whatever src is.

    >>> host_backend().name
    'numpy'
    """
    from .backends.host.backend import NumpyBackend

    return NumpyBackend


def source_codes(src):
    """``(backend, code, data, shape)`` of codes to dequantize: their backend, the row of their
    code type, the array of their storage there, and their logical shape.

    ``src`` is a :class:`gpuq.Codes` (packed int4/uint4, fp8 bits), an fp8 array (ml_dtypes'
    on the host), or an int8/uint8 array; anything else is a ``TypeError``, an array of
    ml_dtypes' int4/uint4 (one nibble a byte: not gpuq's packed storage) with the way to pack it.
    """
    from ._codes import Codes
    from ._codetypes import CODE_TYPES

    codes = src if isinstance(src, Codes) else None
    backend, arr = backend_for(src if codes is None else codes.data, "src" if codes is None else "src.data")
    if codes is not None:
        return backend, CODE_TYPES[codes.dtype], arr, codes.shape
    code = CODE_TYPES.get(arr.dtype.name) if arr.dtype.itemsize == 1 else None
    if code is None:
        raise TypeError(f"src must be int8 or uint8 codes, an fp8 array or gpuq.Codes to "
                        f"dequantize, got {arr.dtype}")
    if code.storage == "packed":
        raise TypeError(f"src must be a gpuq.Codes for {code.name} codes (packed two per byte), "
                        f"got an unpacked ml_dtypes {arr.dtype} array: gpuq.pack(src) packs it")
    return backend, code, arr, tuple(arr.shape)


def backend_for(src, argname: str = "src"):
    """The backend for ``src`` and ``src`` as that backend's array type (host: a base ndarray,
    see :func:`host_base`; in the byte order it has, see :func:`host_native`)."""
    if isinstance(src, np.ndarray):
        from .backends.host.backend import NumpyBackend

        return NumpyBackend, host_base(src, argname)
    if isinstance(src, np.generic):
        from .backends.host.backend import NumpyBackend

        return NumpyBackend, np.asarray(src)
    if is_device_array(src):
        from .backends.cuda.backend import CudaBackend
        from .backends.cuda.launch import as_cupy

        return CudaBackend, as_cupy(src)
    raise TypeError(
        f"{argname} must be a NumPy array or a CUDA array (CuPy, or an object exposing "
        f"__cuda_array_interface__ or a CUDA __dlpack__), got {type(src).__module__}."
        f"{type(src).__qualname__}"
    )
