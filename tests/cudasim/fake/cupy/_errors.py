"""Exception classes of the CuPy stand-in (no imports of the rest of the package).

Two families:

* The ones real CuPy has, with real CuPy's base classes, so code that catches
  them behaves the same: :class:`CUDARuntimeError` (``cupy.cuda.runtime``) and
  :class:`CUDADriverError` (``cupy.cuda.driver``).
* :class:`SimulatorError` and its subclasses, for what the simulator checks and
  a GPU would punish later or silently (a write past an allocation, a pointer
  on another device, a kernel argument of the wrong size). They are
  ``RuntimeError`` subclasses like CUDA's, never ``TypeError``/``ValueError``,
  so that no ``except TypeError`` fallback in the code under test swallows them.
"""

from __future__ import annotations


class CUDARuntimeError(RuntimeError):
    """A CUDA runtime API error (``cupy_backends.cuda.api.runtime.CUDARuntimeError``)."""

    def __init__(self, status: str, detail: str = ""):
        self.status = status
        super().__init__(f"{status}: {detail}" if detail else status)


class CUDADriverError(RuntimeError):
    """A CUDA driver API error (``cupy_backends.cuda.api.driver.CUDADriverError``)."""

    def __init__(self, status: str, detail: str = ""):
        self.status = status
        super().__init__(f"{status}: {detail}" if detail else status)


class SimulatorError(RuntimeError):
    """Base of every error that only the simulator raises (a check a GPU does not make)."""


class LaunchError(SimulatorError):
    """A kernel launch refused at the call: the arguments do not fit the kernel's signature."""


class LaunchArgumentError(LaunchError):
    """Wrong argument count, byte size or kind (an int for a float parameter, ...)."""


class PointerError(LaunchError):
    """A pointer argument that is not in a live allocation on the launch's device."""


class LaunchConfigError(LaunchError, CUDADriverError):
    """A grid/block/shared memory/stream that ``cuLaunchKernel`` itself would refuse."""

    def __init__(self, status: str, detail: str = ""):
        CUDADriverError.__init__(self, status, detail)


class AsyncFault(SimulatorError, CUDARuntimeError):
    """Work that failed while it ran on a stream, raised at the synchronisation point
    that ran it (like CUDA's asynchronous errors). The device stays faulted (every later
    call on it raises :class:`DeviceFaulted`) until ``cupy._sim.clear_fault()``."""

    def __init__(self, detail: str):
        CUDARuntimeError.__init__(self, "cudaErrorIllegalAddress", detail)


class KernelFault(AsyncFault):
    """The engine reported a fault while executing a kernel (hostbuild.KernelFault)."""


class OutOfBoundsWrite(AsyncFault):
    """A kernel changed guard bytes before or after an allocation."""


class DeviceFaulted(SimulatorError, CUDARuntimeError):
    """A call on a device after an asynchronous fault (CUDA's sticky error)."""

    def __init__(self, detail: str):
        CUDARuntimeError.__init__(self, "cudaErrorIllegalAddress", detail)
