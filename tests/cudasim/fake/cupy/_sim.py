"""The simulator's own surface for tests: records, schedule, faults, configuration.

Nothing here exists in real CuPy; tests reach it as ``cupy._sim`` (and must
check that it exists, or that the stand-in is active, before using it).

Records (plain lists: read them, ``.clear()`` them):

* :data:`launches`: one :class:`LaunchRecord` per kernel launch accepted by
  ``RawKernel.__call__`` (recorded at the call, before the work runs).
* :data:`syncs`: one :class:`SyncRecord` per host synchronisation: stream,
  device and event synchronize, stream/event queries, and every host read
  (``get``, ``asnumpy``, ``bool``, ``int``, ``float``, ``item``, ``repr``, the
  ``__cuda_array_interface__`` import's stream synchronisation).
* :data:`modules`: one :class:`ModuleRecord` per ``RawModule``/``RawKernel``
  constructed (compile options, name expressions, a digest of the source).

Configuration (environment, read when the stand-in is imported or at use):

* ``GPUQ_SIM_DEVICES``: number of devices (default 2).
* ``GPUQ_SIM_SCHEDULE``: the engine's fiber schedule for launches (default
  ``inorder``); :func:`set_schedule` / :func:`schedule` change it in-process.
  A launch uses the schedule in force when it is *issued*, not when it runs.
* ``GPUQ_SIM_SANITIZE=1``: build kernels with ``sanitize=True`` (UBSan).
* ``GPUQ_SIM_CC``: the compute capability every device reports (default ``90``);
  kernels are built with ``__CUDA_ARCH__`` = 10 x it (``900``), so the paths of
  that architecture run. :func:`compute_capability` changes it in-process.
* ``CUPY_CUDA_ARRAY_INTERFACE_SYNC=0``: like CuPy, do not synchronise the
  producer's stream when importing a ``__cuda_array_interface__`` (v3).

Faults: an error in enqueued work (a kernel fault, guard bytes changed) is
raised at the synchronisation point that ran it, and the device stays faulted:
every later call on it raises ``DeviceFaulted`` until :func:`clear_fault`.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

from ._errors import (
    AsyncFault,
    DeviceFaulted,
    KernelFault,
    LaunchArgumentError,
    LaunchConfigError,
    LaunchError,
    OutOfBoundsWrite,
    PointerError,
    SimulatorError,
)

#: The engine's fiber schedules (hostbuild.SCHEDULES; checked against it at launch).
SCHEDULES = ("inorder", "reversed", "interleaved")


def _env_devices() -> int:
    raw = os.environ.get("GPUQ_SIM_DEVICES", "2")
    try:
        n = int(raw)
    except ValueError:
        raise ValueError(f"GPUQ_SIM_DEVICES must be an integer >= 0, got {raw!r}") from None
    if n < 0:
        raise ValueError(f"GPUQ_SIM_DEVICES must be an integer >= 0, got {raw!r}")
    return n


#: Number of simulated devices, fixed at import (CUDA's device count does not change either).
DEVICE_COUNT = _env_devices()
def _check_cc(cc) -> str:
    if not (isinstance(cc, str) and cc.isdigit() and len(cc) in (2, 3) and int(cc) >= 50):
        raise ValueError(f"compute capability must be a string of 2-3 digits >= 50 (as CuPy's '90'), got {cc!r}")
    return cc


#: Compute capability every simulated device reports (``Device.compute_capability``); a
#: ``RawModule`` built while it holds is built with ``__CUDA_ARCH__`` = 10 x this.
COMPUTE_CAPABILITY = _check_cc(os.environ.get("GPUQ_SIM_CC", "90"))


def set_compute_capability(cc: str) -> str:
    """Make every device report ``cc`` (modules made from now on build for it); returns the previous one."""
    global COMPUTE_CAPABILITY
    previous, COMPUTE_CAPABILITY = COMPUTE_CAPABILITY, _check_cc(cc)
    return previous


@contextlib.contextmanager
def compute_capability(cc: str):
    """Inside the block the devices report ``cc`` and new modules build with ``__CUDA_ARCH__`` = 10 x cc."""
    previous = set_compute_capability(cc)
    try:
        yield cc
    finally:
        set_compute_capability(previous)


#: Dynamic shared memory one thread block may opt in to (cudaDevAttrMaxSharedMemoryPerBlockOptin),
#: by compute capability: the CUDA C++ Programming Guide's technical specifications (227 KB on
#: 9.0 and 10.0, 163 KB on 8.0 and 8.7, 99 KB on 8.6, 8.9 and 12.x, 96 KB on 7.0 and 7.2, 64 KB
#: on 7.5); 48 KB before Volta. The engine's dynamic shared memory holds the largest.
_SHARED_OPTIN_KB = {"90": 227, "100": 227, "80": 163, "87": 163, "86": 99, "89": 99, "120": 99, "121": 99,
                    "70": 96, "72": 96, "75": 64}


def shared_optin(cc: str) -> int:
    """``sharedMemPerBlockOptin`` in bytes of a device of compute capability ``cc``."""
    return _SHARED_OPTIN_KB.get(_check_cc(cc), 48) << 10


def build_defines(cc: str | None = None) -> tuple:
    """The macros a ``RawModule`` made for ``cc`` (default: the current compute capability) is
    built with; a prebuild must pass the same, or its modules are other cache entries."""
    return (f"__CUDA_ARCH__={int(_check_cc(cc or COMPUTE_CAPABILITY)) * 10}",)


def _check_schedule(name) -> str:
    if name not in SCHEDULES:
        raise ValueError(f"unknown schedule {name!r}; expected one of {SCHEDULES}")
    return name


_schedule = _check_schedule(os.environ.get("GPUQ_SIM_SCHEDULE", "inorder"))


def get_schedule() -> str:
    """The fiber schedule new launches get."""
    return _schedule


def set_schedule(name: str) -> str:
    """Make ``name`` the schedule of launches issued from now on; returns the previous one."""
    global _schedule
    previous, _schedule = _schedule, _check_schedule(name)
    return previous


@contextlib.contextmanager
def schedule(name: str):
    """Launches issued inside the block use the fiber schedule ``name``."""
    previous = set_schedule(name)
    try:
        yield name
    finally:
        set_schedule(previous)


def sanitize() -> bool:
    """Whether kernels are built with the engine's sanitizers (``GPUQ_SIM_SANITIZE=1``)."""
    return os.environ.get("GPUQ_SIM_SANITIZE", "") == "1"


@dataclass(frozen=True)
class LaunchRecord:
    """One accepted kernel launch.

    ``name`` is the name given to ``get_function`` (a name expression such as
    ``gpuq::quantize<float, signed char, float, true, 1>``); ``grid``/``block``
    are the 3-tuples really launched (CuPy pads with 1 and raises 0 to 1);
    ``args`` holds, per argument, the pointer (an int) or the scalar as passed
    to the kernel (a NumPy scalar); ``options`` are the module's compile options.
    """

    name: str
    grid: tuple
    block: tuple
    shared_mem: int
    stream_ptr: int
    device_id: int
    schedule: str
    args: tuple
    options: tuple


@dataclass(frozen=True)
class SyncRecord:
    """One host synchronisation: ``what`` synchronised (e.g. ``"Stream.synchronize"``,
    ``"ndarray.get"``), on which device, and which stream (None for a whole device)."""

    what: str
    device_id: int
    stream_ptr: int | None


@dataclass(frozen=True)
class ModuleRecord:
    """One ``RawModule``/``RawKernel``: its compile options as given, name expressions, source digest."""

    options: tuple
    name_expressions: tuple | None
    code_sha1: str
    kind: str  # "RawModule" | "RawKernel"


launches: list = []
syncs: list = []
modules: list = []


def clear_records() -> None:
    """Empty :data:`launches`, :data:`syncs` and :data:`modules`."""
    launches.clear()
    syncs.clear()
    modules.clear()


def fault(device_id: int | None = None):
    """The pending sticky fault of ``device_id`` (default: the current device), or None."""
    from .cuda import _streams

    return _streams.device_state(_streams.current_device_id() if device_id is None else device_id).fault


def clear_fault(device_id: int | None = None):
    """Forget the sticky fault of ``device_id`` (default: every device); returns the last one cleared.

    Use after a test that provoked a fault on purpose; on a GPU the process would be done for.
    """
    from .cuda import _streams

    ids = range(DEVICE_COUNT) if device_id is None else [device_id]
    last = None
    for i in ids:
        st = _streams.device_state(i)
        if st.fault is not None:
            last, st.fault = st.fault, None
    return last


def pending(device_id: int | None = None) -> int:
    """Operations enqueued on ``device_id`` (default: every device) that have not run yet."""
    from .cuda import _streams

    ids = range(DEVICE_COUNT) if device_id is None else [device_id]
    return sum(_streams.device_state(i).pending() for i in ids)


def live_allocations(device_id: int | None = None) -> int:
    """Live (non-empty) device allocations, on ``device_id`` or on every device."""
    from . import _memory

    return _memory.live_count(device_id)


__all__ = [
    "COMPUTE_CAPABILITY",
    "DEVICE_COUNT",
    "SCHEDULES",
    "AsyncFault",
    "DeviceFaulted",
    "KernelFault",
    "LaunchArgumentError",
    "LaunchConfigError",
    "LaunchError",
    "LaunchRecord",
    "ModuleRecord",
    "OutOfBoundsWrite",
    "PointerError",
    "SimulatorError",
    "SyncRecord",
    "clear_fault",
    "clear_records",
    "fault",
    "get_schedule",
    "launches",
    "live_allocations",
    "modules",
    "pending",
    "sanitize",
    "schedule",
    "set_schedule",
    "syncs",
]
