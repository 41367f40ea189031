"""One test body, every backend: the ``backend`` fixture moves arrays there and back.

Host arrays run twice, through the NumPy ufunc loops (``numpy``) and through
the compiled kernels (``numba``, skipped where numba is not installed). The
``cuda`` parameter runs on real CuPy where it sees a GPU, and everywhere else
on the CPU execution of the same kernels (``tests/cudasim``: the kernel text
built for the host, a NumPy-backed stand-in for CuPy put first on
``sys.path`` before any test imports ``cupy``). :data:`CUDA_MODE` says which.
Tests that need what only real CuPy has are marked ``real_cupy`` and skip on
the stand-in.
"""

from __future__ import annotations

import contextlib
import os

import numpy as np
import pytest

import _background
from cudasim import install as _cupy_choice

#: "real" (CuPy with a GPU) or "sim" (the CPU execution of the kernels), decided once, here.
CUDA_MODE = _cupy_choice.install()

#: GPUQ_REQUIRE_GPU=1: the session stops at once unless the tests run on a real GPU (the
#: device check sets it: a broken CuPy or driver must not turn into a green CPU run).
REQUIRE_GPU = os.environ.get("GPUQ_REQUIRE_GPU", "") not in ("", "0")

# The CPU execution's own package (its tests are tests/test_cudasim_*.py) and the planted-bug
# runner are tools, not test modules: --doctest-modules must not import them a second time.
collect_ignore = ["cudasim", "planted_bugs.py", "_background.py",
                  # offline fixture scripts: they import torchao, which the project never installs
                  # (run by hand in a throwaway environment; their fixtures are committed)
                  "mx_fixtures/make_fixtures.py", "data/full_range/make_fixtures.py"]


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "real_cupy: needs a feature of real CuPy that the CPU execution does not model")
    config.addinivalue_line(
        "markers", "slow: minutes of work for hand runs, deselected by default (pytest -m slow runs them)")
    config.addinivalue_line(
        "markers", "ubsan: a representative case the sanitized sweep runs (tests/test_cuda_sweep.py)")
    if REQUIRE_GPU and CUDA_MODE != "real":
        raise pytest.UsageError(
            f"GPUQ_REQUIRE_GPU=1 but the CUDA tests would run on the CPU execution of the kernels: "
            f"{_cupy_choice.not_real_reason or 'the stand-in was installed before conftest'}")


def cuda_mode_line() -> str:
    """The report header's line: where the ``cuda`` parameters run."""
    if CUDA_MODE == "real":
        import cupy

        dev = cupy.cuda.Device()
        name = cupy.cuda.runtime.getDeviceProperties(dev.id)["name"]
        name = name.decode() if isinstance(name, bytes) else name
        return f"gpuq cuda tests: real GPU ({name}, sm_{dev.compute_capability}, CuPy {cupy.__version__})"
    return (f"gpuq cuda tests: CPU execution of the kernels (tests/cudasim): "
            f"{_cupy_choice.not_real_reason or 'stand-in chosen'}")


def pytest_report_header(config):
    return cuda_mode_line()


def pytest_collection_modifyitems(config, items):
    if CUDA_MODE != "sim":
        return
    skip = pytest.mark.skip(reason="needs real CuPy (not modelled by the CPU execution of the kernels)")
    for item in items:
        if "real_cupy" in item.keywords:
            item.add_marker(skip)


def pytest_collection_finish(session):
    # The long CPU-bound checks run beside the suite (tests/_background.py); not for --collect-only.
    if not session.config.option.collectonly:
        _background.start(session.items, CUDA_MODE)


def pytest_sessionfinish(session):
    _background.stop()


@pytest.fixture(autouse=True)
def _no_fault_left_behind():
    """On the CPU execution: every test ends with the devices idle and without a fault.

    Work still queued runs here, so an asynchronous fault of the test's own
    launches fails that test (on a GPU it would poison the process)."""
    yield
    if CUDA_MODE == "sim":
        import cupy

        try:
            for dev in range(cupy.cuda.runtime.getDeviceCount()):
                with cupy.cuda.Device(dev):
                    cupy.cuda.runtime.deviceSynchronize()
        finally:
            cupy._sim.clear_records()  # launch and sync records are per test
            fault = cupy._sim.clear_fault()  # the next test starts clean either way
        assert fault is None, f"a device fault was left behind: {fault}"


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
        yield CupyBackend
        return
    with host_kernels(request.param):
        yield NumbaBackend if request.param == "numba" else NumpyBackend


def require_numba(module_level: bool = False) -> None:
    """Skip unless gpuq's compiled host loops load (numba missing or broken: the library uses
    the ufunc loops then, and only the numba tests are lost)."""
    from gpuq.backends.host import choice

    if not choice.available():
        pytest.skip("numba is not installed or does not load here", allow_module_level=module_level)


@contextlib.contextmanager
def host_kernels(name):
    """Run host arrays through ``name`` ("numpy" ufuncs or "numba" kernels), then restore the choice."""
    import gpuq

    if name == "numba":
        require_numba()
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
