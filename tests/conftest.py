"""One test body, every backend: the ``backend`` fixture moves arrays there and back.

The CUDA parameter skips cleanly where CuPy or a GPU is missing.
"""

from __future__ import annotations

import numpy as np
import pytest


def _cuda_skip_reason():
    try:
        import cupy
    except Exception as exc:  # ImportError, or a broken CUDA install
        return f"CuPy not importable: {exc.__class__.__name__}"
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "no CUDA device"
    except Exception as exc:
        return f"no CUDA device: {exc}"
    return None


class NumpyBackend:
    name = "numpy"

    @staticmethod
    def put(a):
        return np.asarray(a)

    @staticmethod
    def get(a):
        return np.asarray(a)


class CupyBackend:
    name = "cuda"

    @staticmethod
    def put(a):
        import cupy

        return cupy.asarray(a)

    @staticmethod
    def get(a):
        import cupy

        return cupy.asnumpy(a)


@pytest.fixture(params=["numpy", "cuda"])
def backend(request):
    """Array mover for one backend: ``put`` a NumPy array there, ``get`` it back."""
    if request.param == "cuda":
        reason = _cuda_skip_reason()
        if reason:
            pytest.skip(reason)
        return CupyBackend
    return NumpyBackend
