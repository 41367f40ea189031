"""Where the ``gpuq`` command runs: device choice and ``gpuq info``.

Nothing here imports CuPy unless asked about the GPU: ``--device cpu`` and a
machine without CuPy never touch it.
"""

from __future__ import annotations

import importlib
import importlib.util
import platform
import time

import numpy as np

from .files import CliError


def cuda_unavailable_reason() -> str | None:
    """Why gpuq cannot run on a GPU here, or ``None`` when it can (CuPy + a device + the backend)."""
    if importlib.util.find_spec("cupy") is None:
        return "CuPy is not installed (pip install 'gpuq[cuda12]' or 'gpuq[cuda13]')"
    try:
        import cupy

        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # a CUDA driver missing or broken shows up as many types
        return f"no usable CUDA device ({type(exc).__name__}: {' '.join(str(exc).split())})"
    if count < 1:
        return "no CUDA device is visible"
    if importlib.util.find_spec("gpuq.backends.cuda.backend") is None:
        return "this gpuq build has no CUDA backend (gpuq/backends/cuda/backend.py)"
    return None


class HostDevice:
    """Arrays stay NumPy: the NumPy backend does the work."""

    name = "cpu"
    xp = np

    @staticmethod
    def put(a):
        return a

    @staticmethod
    def get(a):
        return None if a is None else np.asarray(a)


class CudaDevice:
    """Arrays go to the current CUDA device as CuPy arrays; results come back to the host."""

    name = "cuda"

    def __init__(self):
        import cupy

        self.xp = cupy

    def put(self, a):
        return self.xp.asarray(a)

    def get(self, a):
        if a is None or isinstance(a, np.ndarray):
            return a
        return self.xp.asnumpy(a)


def pick_device(requested: str):
    """``"cpu"``, ``"cuda"`` (an error without a GPU) or ``"auto"`` (the GPU when there is one).

    >>> pick_device("cpu").name
    'cpu'
    """
    if requested == "cpu":
        return HostDevice()
    reason = cuda_unavailable_reason()
    if reason is None:
        return CudaDevice()
    if requested == "cuda":
        raise CliError(f"--device cuda: {reason}; use --device cpu or auto")
    return HostDevice()


# -- gpuq info -----------------------------------------------------------------

def info(compile_check: bool = True) -> dict:
    """What ``gpuq info`` reports, as a dict (``"unavailable"`` where a part is missing).

    ``compile_check`` compiles the kernels with NVRTC (a few seconds) when
    libnvrtc is there.

    >>> sorted(info(compile_check=False))[:3]
    ['backend', 'cpu_threads', 'cuda_driver']
    """
    from .. import __version__, get_num_threads

    report = {
        "gpuq": __version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "cpu_threads": get_num_threads(),
        "host_kernels": _host_kernels_info(),
        "backend": "numpy",
        "gpu": "none",
        "gpu_memory_gib": None,
        "cupy": "not installed",
        "cuda_runtime": "unavailable",
        "cuda_driver": "unavailable",
        "nvrtc": "unavailable",
        "kernels_compile": "unavailable",
        **dask_info(),
    }
    reason = cuda_unavailable_reason()
    if reason is None:
        report["backend"] = "cuda (GPU arrays; NumPy for host arrays)"
    else:
        report["gpu"] = f"none: {reason}"
    if importlib.util.find_spec("cupy") is not None:
        _cupy_info(report)
    _nvrtc_info(report, compile_check)
    return report


def dask_info() -> dict:
    """Versions of the optional Dask packages (``--scheduler``/``--workers``), or why not.

    From the installed distributions' metadata: nothing is imported (dask
    takes a second to import), so a broken install still says "installed".

    >>> sorted(dask_info())
    ['dask', 'dask_cuda', 'distributed']
    """
    from importlib import metadata

    out = {}
    for key, dist, hint in (("dask", "dask", "pip install 'gpuq[dask]'"),
                            ("distributed", "distributed", "pip install 'gpuq[dask]'"),
                            ("dask_cuda", "dask-cuda", "one worker per GPU: pip install dask-cuda")):
        try:
            out[key] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[key] = f"not installed ({hint})"
    return out


def _host_kernels_info() -> str:
    from ..backends.host import choice

    try:
        name = choice.get_host_kernels()
    except ValueError as exc:  # a bad GPUQ_HOST_KERNELS
        return f"error: {exc}"
    if name == "numba":
        import numba

        return f"numba {numba.__version__} (compiled loops)"
    if choice.available():
        return "numpy ufuncs (chosen by GPUQ_HOST_KERNELS or set_host_kernels)"
    return "numpy ufuncs (numba not installed: pip install 'gpuq[fast]')"


def _cupy_info(report):
    try:
        import cupy

        report["cupy"] = cupy.__version__
        rt = cupy.cuda.runtime
        report["cuda_runtime"] = _cuda_version(rt.runtimeGetVersion())
        report["cuda_driver"] = _cuda_version(rt.driverGetVersion())
        if rt.getDeviceCount() > 0:
            props = rt.getDeviceProperties(cupy.cuda.Device().id)
            name = props["name"]
            report["gpu"] = name.decode() if isinstance(name, bytes) else str(name)
            report["gpu_memory_gib"] = round(props["totalGlobalMem"] / 2**30, 1)
    except Exception as exc:
        report["cupy"] = report.get("cupy", "?") + f" (error: {' '.join(str(exc).split())})"


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{v % 1000 // 10}"


def _nvrtc_info(report, compile_check=True):
    # gpuq.backends.cuda.nvrtc_check drives NVRTC through ctypes (no CuPy, no GPU), so
    # "do the kernels compile here" has an answer on any machine with libnvrtc.
    # It is optional: its absence or failure is reported, never raised.
    try:
        from ..backends.cuda import nvrtc_check, registry
    except ImportError:
        return
    try:
        path = nvrtc_check.find_libnvrtc()
        if path is None:
            report["nvrtc"] = "unavailable (libnvrtc not found: pip install nvidia-cuda-nvrtc)"
            return
        nvrtc = nvrtc_check.Nvrtc(path)
        report["nvrtc"] = f"{'.'.join(map(str, nvrtc.version()))} ({path})"
        if not compile_check:
            report["kernels_compile"] = "not checked (--no-compile-check)"
            return
        # PTX for the oldest supported architecture: what every GPU's driver JITs
        # from, and seconds rather than the minute the full SASS check takes.
        start = time.perf_counter()
        results = [nvrtc_check.compile_source(nvrtc, src, "compute_80") for src in registry.SOURCES]
        took = time.perf_counter() - start
        bad = [r for r in results if not r.ok]
        kernels = sum(len(r.names) for r in results)
        if bad:
            first = " ".join(bad[0].describe().split())
            report["kernels_compile"] = f"no: {first[:300]}"
        else:
            report["kernels_compile"] = (f"yes ({kernels} kernels in {len(results)} sources, "
                                         f"compute_80 PTX, {took:.1f} s)")
    except Exception as exc:
        report["kernels_compile"] = f"unknown ({type(exc).__name__}: {' '.join(str(exc).split())})"
