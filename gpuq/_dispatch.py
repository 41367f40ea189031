"""Which backend serves an array, decided without importing CuPy.

A NumPy array goes to the NumPy backend. A CuPy array, or any object that
exposes ``__cuda_array_interface__`` or a CUDA ``__dlpack__`` (PyTorch, JAX,
Numba arrays), goes to the CUDA backend, which is imported only then.
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


def backend_for(src, argname: str = "src"):
    """The backend for ``src`` and ``src`` as that backend's array type."""
    if isinstance(src, np.ndarray):
        from .backends.host.backend import NumpyBackend

        return NumpyBackend, src
    if isinstance(src, np.generic):
        from .backends.host.backend import NumpyBackend

        return NumpyBackend, np.asarray(src)
    if is_device_array(src):
        from .backends.cuda import backend

        return backend.CudaBackend, backend.as_cupy(src)
    raise TypeError(
        f"{argname} must be a NumPy array or a CUDA array (CuPy, or an object exposing "
        f"__cuda_array_interface__ or a CUDA __dlpack__), got {type(src).__module__}."
        f"{type(src).__qualname__}"
    )
