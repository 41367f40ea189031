"""One test body, every backend: the ``backend`` fixture moves arrays there and back.

Host arrays run twice, through the NumPy ufunc loops (``numpy``) and through
the compiled kernels (``numba``, skipped where numba is not installed). The
CUDA parameter skips cleanly where CuPy or a GPU is missing.
"""

from __future__ import annotations

import contextlib

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


class NumbaBackend(NumpyBackend):
    name = "numba"


@pytest.fixture(params=["numpy", "numba", "cuda"])
def backend(request):
    """Array mover for one backend: ``put`` a NumPy array there, ``get`` it back."""
    if request.param == "cuda":
        reason = _cuda_skip_reason()
        if reason:
            pytest.skip(reason)
        return CupyBackend
    with host_kernels(request.param):
        yield NumbaBackend if request.param == "numba" else NumpyBackend


@contextlib.contextmanager
def host_kernels(name):
    """Run host arrays through ``name`` ("numpy" ufuncs or "numba" kernels), then restore the choice."""
    import gpuq

    if name == "numba":
        pytest.importorskip("numba")
    previous = gpuq.set_host_kernels(name)
    try:
        yield
    finally:
        gpuq.set_host_kernels(previous)


@pytest.fixture(params=["numpy", "numba"])
def host_loops(request):
    """For host-only tests: run them through the ufunc loops and through the compiled kernels."""
    with host_kernels(request.param):
        yield request.param
