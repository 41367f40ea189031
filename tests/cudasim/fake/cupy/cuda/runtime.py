"""``cupy.cuda.runtime`` of the stand-in: the few CUDA runtime calls gpuq, its tests and bench use."""

from __future__ import annotations

from .. import _sim
from .._errors import CUDARuntimeError  # noqa: F401  (public: cupy.cuda.runtime.CUDARuntimeError)
from . import _streams

streamLegacy = _streams.STREAM_LEGACY
streamPerThread = _streams.STREAM_PER_THREAD
#: Versions reported (CUDA 13.0); nothing in the simulator depends on them.
_VERSION = 13000


def getDeviceCount() -> int:
    return _streams.device_count()


def getDevice() -> int:
    return _streams.current_device_id()


def setDevice(device: int) -> None:
    _streams.set_current_device(device)


def deviceSynchronize() -> None:
    """Run every stream of the current device to its end (a host synchronisation)."""
    _streams.sync_device(_streams.current_device_id(), "deviceSynchronize")


def runtimeGetVersion() -> int:
    return _VERSION


def driverGetVersion() -> int:
    return _VERSION


def getDeviceProperties(device: int) -> dict:
    i = _streams.check_device_id(device)
    cc = _sim.COMPUTE_CAPABILITY
    return {"name": f"gpuq CUDA simulator device {i}".encode(), "totalGlobalMem": 16 << 30,
            "major": int(cc[:-1]), "minor": int(cc[-1]), "multiProcessorCount": 4,
            "maxThreadsPerBlock": 1024, "warpSize": 32, "sharedMemPerBlock": 48 << 10,
            "sharedMemPerBlockOptin": _sim.shared_optin(cc)}


def memsetAsync(ptr: int, value: int, size: int, stream: int) -> None:
    """``cudaMemsetAsync``: ``size`` bytes from device address ``ptr`` set to ``value & 0xFF``, in
    the order of ``stream`` (a handle, as CuPy's ``Stream.ptr``); the range must lie in one live
    allocation (else ``cudaErrorInvalidValue``, as the driver reports a bad address)."""
    from .. import _memory

    size = int(size)
    alloc = _memory.find(int(ptr)) if size else None
    if size and (alloc is None or int(ptr) + size > alloc.ptr + alloc.nbytes):
        raise CUDARuntimeError("cudaErrorInvalidValue", f"memsetAsync of {size} B at 0x{int(ptr):x}: "
                                                        f"not inside one live allocation")
    q = _streams.queue_of(_Handle(stream), None if alloc is None else alloc.device_id)

    def run():
        if size:
            off = int(ptr) - alloc.ptr
            alloc.buf[off:off + size] = int(value) & 0xFF

    _streams.enqueue(q, run, "memsetAsync")


class _Handle:
    """A raw stream handle as the object with ``.ptr`` that ``_streams.queue_of`` takes."""

    def __init__(self, ptr):
        self.ptr = int(ptr)
