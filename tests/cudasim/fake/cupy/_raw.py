"""``cupy.RawModule`` / ``cupy.RawKernel`` of the stand-in: kernels built and run by the engine.

The engine is ``tests/cudasim/hostbuild.py`` (``from cudasim import hostbuild``):
it compiles the CUDA source for the host (``build(source, name_expressions,
sanitize=...)``, cached) and runs one launch synchronously
(``kernel.launch(grid, block, args, shared_mem, schedule)``). This module adds
what CuPy and the driver do around it, strictly:

* Compilation at the first ``get_function`` (CuPy's point), errors raised
  there. Options are recorded (``cupy._sim.modules``), not interpreted.
* Arguments converted like CuPy's ``_pointer``: an ndarray -> its pointer
  (8 bytes), ``None`` -> a NULL pointer, a NumPy scalar or size-1 NumPy array
  -> its bytes, a Python ``bool`` -> 1-byte bool, ``int`` -> 8-byte long long
  (unsigned when >= 2**63), ``float`` -> 8-byte double, ``complex`` -> 16 bytes;
  anything else is CuPy's ``TypeError``.
* Then checked against the kernel's signature (which a GPU never checks: a
  mismatch is silent garbage there): the count; each byte size; a pointer
  parameter takes an array, ``None`` or an 8-byte integer (``np.uint64(0)`` for
  NULL); integer parameters take integers whose value survives the
  reinterpretation (signedness), float parameters floats, bool parameters
  bools. Errors name the argument's index: ``LaunchArgumentError``.
* Every non-NULL pointer must lie in a live allocation on the current device
  (``PointerError``), the stream must belong to the current device, and the
  grid/block/shared memory must be launchable (``LaunchConfigError``).
* The launch is recorded (``cupy._sim.launches``) and enqueued on the stream
  with the schedule in force now; when it runs, an engine fault or changed
  guard bytes of any live allocation becomes the device's asynchronous fault.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np

from . import _memory, _sim
from ._core import ndarray
from ._errors import (
    AsyncFault,
    CUDADriverError,
    KernelFault,
    LaunchArgumentError,
    LaunchConfigError,
    OutOfBoundsWrite,
    PointerError,
)
from .cuda import _streams

_DEFAULT_DYNAMIC_SHARED = 48 << 10  # a kernel's MaxDynamicSharedMemorySize until it is raised
_engine = None


def _hostbuild():
    """The engine module; ``tests/`` joins the end of ``sys.path`` if ``cudasim`` is not importable."""
    global _engine
    if _engine is None:
        try:
            from cudasim import hostbuild
        except ImportError:
            tests_dir = str(Path(__file__).resolve().parents[3])
            if tests_dir in sys.path:
                raise
            sys.path.append(tests_dir)
            from cudasim import hostbuild
        _engine = hostbuild
    return _engine


def _digest(code: str) -> str:
    return hashlib.sha1(code.encode()).hexdigest()


class RawModule:
    """``cupy.RawModule(code=..., options=(...), name_expressions=[...])``; compiled at the first
    ``get_function``."""

    def __init__(self, *, code=None, path=None, options=(), backend="nvrtc", translate_cucomplex=False,
                 enable_cooperative_groups=False, name_expressions=None, jitify=None):
        if (code is None) == (path is None):
            raise TypeError("Exactly one of `code` and `path` keyword arguments must be given.")
        if path is not None:
            raise NotImplementedError("loading cubin/ptx files is not modelled by the simulator")
        if not isinstance(code, str):
            raise TypeError(f"Argument 'code' has incorrect type (expected str, got {type(code).__name__})")
        if not isinstance(options, tuple):  # CuPy's signature is `tuple options`
            raise TypeError(f"Argument 'options' has incorrect type (expected tuple, got "
                            f"{type(options).__name__})")
        if backend != "nvrtc":
            raise NotImplementedError(f"backend {backend!r} is not modelled by the simulator (nvrtc only)")
        if translate_cucomplex or enable_cooperative_groups or jitify:
            raise NotImplementedError("translate_cucomplex, cooperative groups and jitify are not modelled")
        self.code = code
        self.options = options
        self.backend = backend
        self.name_expressions = None if name_expressions is None else tuple(name_expressions)
        self._built = {}  # name expressions given to the engine -> its module
        # The architecture of the device current at construction, as NVRTC's -arch would fix it.
        self.arch = int(_sim.COMPUTE_CAPABILITY) * 10
        self._defines = _sim.build_defines()
        _sim.modules.append(_sim.ModuleRecord(options, self.name_expressions, _digest(code), "RawModule"))

    def _build(self, names: tuple):
        mod = self._built.get(names)
        if mod is None:
            mod = _hostbuild().build(self.code, list(names), sanitize=_sim.sanitize(),
                                     defines=self._defines)
            self._built[names] = mod
        return mod

    def compile(self, log_stream=None):
        self._build(self.name_expressions or ())

    def get_function(self, name):
        if not isinstance(name, str):
            raise TypeError(f"Argument 'name' has incorrect type (expected str, got {type(name).__name__})")
        # With name expressions the module holds exactly those; a plain extern "C" name is built alone.
        names = self.name_expressions if self.name_expressions else (name,)
        try:
            kernel = self._build(names).kernel(name)
        except KeyError:
            raise CUDADriverError("CUDA_ERROR_NOT_FOUND", f"named symbol not found: {name!r} "
                                  f"(name expressions: {self.name_expressions})") from None
        return RawKernel._bound(self, name, kernel)


class RawKernel:
    """``cupy.RawKernel(code, name, options=())``, or a kernel of a :class:`RawModule`."""

    def __init__(self, code, name, options=(), backend="nvrtc", *, translate_cucomplex=False,
                 enable_cooperative_groups=False, jitify=None):
        if not isinstance(name, str):
            raise TypeError(f"Argument 'name' has incorrect type (expected str, got {type(name).__name__})")
        module = RawModule.__new__(RawModule)
        RawModule.__init__(module, code=code, options=options, backend=backend,
                           translate_cucomplex=translate_cucomplex,
                           enable_cooperative_groups=enable_cooperative_groups, jitify=jitify)
        _sim.modules[-1] = _sim.ModuleRecord(options, None, _digest(code), "RawKernel")
        self._module, self.name, self._kernel = module, name, None

    @classmethod
    def _bound(cls, module, name, kernel):
        k = cls.__new__(cls)
        k._module, k.name, k._kernel = module, name, kernel
        return k

    @property
    def code(self):
        return self._module.code

    @property
    def options(self):
        return self._module.options

    @property
    def kernel(self):
        if self._kernel is None:  # CuPy compiles a RawKernel at its first call
            self._kernel = self._module.get_function(self.name)._kernel
        return self._kernel

    @property
    def max_threads_per_block(self) -> int:
        return int(self.kernel.max_threads)

    @property
    def max_dynamic_shared_size_bytes(self) -> int:
        """CUDA's MaxDynamicSharedMemorySize of this kernel (48 KB until set); a launch may ask for
        at most this much dynamic shared memory."""
        return getattr(self, "_max_dynamic_shared", _DEFAULT_DYNAMIC_SHARED)

    @max_dynamic_shared_size_bytes.setter
    def max_dynamic_shared_size_bytes(self, value):
        # cuFuncSetAttribute: at most the device's sharedMemPerBlockOptin (CUDA_ERROR_INVALID_VALUE
        # above it). The kernel's static shared memory also counts against that limit on a GPU; the
        # engine does not know it, so a caller must leave room for it (the launch is not refused).
        optin = _sim.shared_optin(_sim.COMPUTE_CAPABILITY)
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= int(value) <= optin:
            raise CUDADriverError("CUDA_ERROR_INVALID_VALUE",
                                  f"kernel {self.name!r}: MaxDynamicSharedMemorySize {value!r} outside [0, {optin}] "
                                  f"(the device's sharedMemPerBlockOptin)")
        self.kernel  # compiled first, as CuPy's setter needs the function
        self._max_dynamic_shared = int(value)

    def __call__(self, grid, block, args, *, shared_mem=0, stream=None, enable_cooperative_groups=False):
        if enable_cooperative_groups:
            raise NotImplementedError("cooperative launches are not modelled by the simulator")
        _launch(self, grid, block, args, shared_mem, stream)

    def __repr__(self):
        return f"<RawKernel {self.name!r}>"


# --- argument conversion (CuPy's _pointer) and checks -------------------------------------------

class _Arg:
    """One converted argument: ``kind`` ("pointer" for arrays/None, else the value's dtype kind),
    its bytes, the value passed (pointer int or NumPy scalar), the array it came from."""

    __slots__ = ("array", "data", "kind", "value", "what")

    def __init__(self, kind, data, value, array, what):
        self.kind, self.data, self.value, self.array, self.what = kind, data, value, array, what


def _convert(i, x) -> _Arg:
    if x is None:
        return _Arg("pointer", np.uint64(0).tobytes(), 0, None, "None")
    if isinstance(x, ndarray):
        ptr = x.data.ptr
        return _Arg("pointer", np.uint64(ptr).tobytes(), ptr, x, f"cupy.ndarray {x.dtype}{list(x.shape)}")
    if isinstance(x, np.ndarray):
        if x.size != 1:
            raise TypeError(f"You are trying to pass a numpy.ndarray of shape {x.shape} as a kernel "
                            f"parameter. Only numpy.ndarrays of size one can be passed by value. If you "
                            f"meant to pass a pointer to __global__ memory, you need to pass a "
                            f"cupy.ndarray instead.")
        x = x.reshape(())[()]
    typ = type(x)
    if typ is bool:
        v = np.bool_(x)
    elif typ is float:
        v = np.float64(x)
    elif typ is complex:
        v = np.complex128(x)
    elif typ is int:
        if x >= 1 << 63:
            v = np.uint64(x)  # OverflowError beyond 2**64, like CuPy
        elif x < -(1 << 63):
            raise OverflowError(f"Python integer {x} out of bounds for int64")
        else:
            v = np.int64(x)
    elif isinstance(x, np.generic):
        v = x
    else:
        raise TypeError(f"Unsupported type {typ}")
    what = f"{typ.__name__} (as {v.dtype})" if typ in (bool, int, float, complex) else f"np.{v.dtype}"
    return _Arg(v.dtype.kind, v.tobytes(), v, None, what)


def _int_value_fits(arg: _Arg, param) -> bool:
    """Whether the integer keeps its value when the kernel reads its bytes as ``param``."""
    value = int(arg.value)
    bits = 8 * param.size
    if param.kind == "uint":
        return 0 <= value < (1 << bits)
    return -(1 << (bits - 1)) <= value < (1 << (bits - 1))


def _check_arg(i, arg: _Arg, param, name):
    where = f"kernel {name!r} argument {i} ({param.ctype})"
    if len(arg.data) != param.size:
        raise LaunchArgumentError(f"{where}: got {arg.what}, {len(arg.data)} bytes; the parameter has "
                                  f"{param.size} bytes")
    kind = param.kind
    if kind == "pointer":
        if arg.kind == "pointer" or arg.kind in ("i", "u"):
            return
        raise LaunchArgumentError(f"{where}: a pointer parameter needs a device array, None or an "
                                  f"integer of pointer size, got {arg.what}")
    if kind in ("int", "uint"):
        if arg.kind not in ("i", "u"):
            raise LaunchArgumentError(f"{where}: an integer parameter got {arg.what}")
        if not _int_value_fits(arg, param):
            raise LaunchArgumentError(f"{where}: {arg.what} value {int(arg.value)} changes when read as "
                                      f"{param.ctype}")
        return
    if kind == "float":
        if arg.kind != "f":
            raise LaunchArgumentError(f"{where}: a floating-point parameter got {arg.what}")
        return
    if kind == "bool":
        if arg.kind != "b":
            raise LaunchArgumentError(f"{where}: a bool parameter got {arg.what}")
        return
    raise LaunchArgumentError(f"{where}: the engine reports parameter kind {kind!r}, unknown to the stand-in")


def _check_pointer(i, arg: _Arg, param, name, device_id):
    where = f"kernel {name!r} argument {i} ({param.ctype})"
    if arg.array is not None:
        a = arg.array
        if a._device_id != device_id:
            raise PointerError(f"{where}: array on device {a._device_id}, launch on device {device_id}")
        if a.size == 0:
            return  # nothing can be dereferenced; CuPy passes the empty view's address as is
        alloc = _memory.find(a.data.ptr)
        if alloc is None or alloc is not a._mem:
            raise PointerError(f"{where}: 0x{a.data.ptr:x} is not inside the array's own allocation")
        return
    ptr = int(np.frombuffer(arg.data, np.uint64)[0])
    if ptr == 0:
        return  # NULL
    alloc = _memory.find(ptr)
    if alloc is None:
        raise PointerError(f"{where}: 0x{ptr:x} ({arg.what}) is not in any live device allocation")
    if alloc.device_id != device_id:
        raise PointerError(f"{where}: 0x{ptr:x} is in {alloc!r} on device {alloc.device_id}, launch on "
                           f"device {device_id}")


def _dims(v, what) -> tuple:
    if not isinstance(v, tuple):  # CuPy's Function.__call__ takes `tuple grid, tuple block`
        raise TypeError(f"Argument '{what}' has incorrect type (expected tuple, got {type(v).__name__})")
    v = (v + (1, 1))[:3]
    return tuple(max(1, int(d)) for d in v)  # CuPy raises 0 (and negatives) to 1


def _launch(raw: RawKernel, grid, block, args, shared_mem, stream):
    kernel = raw.kernel
    name = raw.name
    grid, block = _dims(grid, "grid"), _dims(block, "block")
    shared_mem = int(shared_mem)
    if shared_mem < 0:
        raise OverflowError("can't convert negative value to size_t")
    dev = _streams.current_device_id()
    # cuLaunchKernel's own refusals (synchronous errors).
    if grid[0] > 2**31 - 1 or grid[1] > 65535 or grid[2] > 65535:
        raise LaunchConfigError("CUDA_ERROR_INVALID_VALUE", f"kernel {name!r}: grid {grid} exceeds the limits")
    threads = block[0] * block[1] * block[2]
    if block[0] > 1024 or block[1] > 1024 or block[2] > 64 or threads > 1024:
        raise LaunchConfigError("CUDA_ERROR_INVALID_VALUE", f"kernel {name!r}: block {block} exceeds the limits")
    if threads > int(kernel.max_threads):
        raise LaunchConfigError("CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
                                f"kernel {name!r}: block of {threads} threads, the kernel allows "
                                f"{kernel.max_threads} (__launch_bounds__)")
    if shared_mem > raw.max_dynamic_shared_size_bytes:
        raise LaunchConfigError("CUDA_ERROR_INVALID_VALUE",
                                f"kernel {name!r}: {shared_mem} bytes of dynamic shared memory, more than its "
                                f"MaxDynamicSharedMemorySize {raw.max_dynamic_shared_size_bytes} (raise it with "
                                f"cudaFuncSetAttribute: RawKernel.max_dynamic_shared_size_bytes)")
    q = _streams.current_queue() if stream is None else _streams.queue_of(stream, dev)
    if q.device_id != dev:
        raise LaunchConfigError("CUDA_ERROR_INVALID_HANDLE",
                                f"kernel {name!r}: stream of device {q.device_id} while device {dev} is current")
    conv = [_convert(i, a) for i, a in enumerate(args)]
    params = tuple(kernel.params)
    if len(conv) != len(params):
        raise LaunchArgumentError(f"kernel {name!r} takes {len(params)} arguments "
                                  f"({', '.join(p.ctype for p in params)}), got {len(conv)}")
    for i, (arg, param) in enumerate(zip(conv, params)):
        _check_arg(i, arg, param, name)
        if param.kind == "pointer":
            _check_pointer(i, arg, param, name, dev)
    schedule = _sim.get_schedule()
    engine = _hostbuild()
    if schedule not in engine.SCHEDULES:
        raise ValueError(f"schedule {schedule!r} is not one of the engine's {engine.SCHEDULES}")
    _streams.device_state(dev).check()
    _sim.launches.append(_sim.LaunchRecord(name, grid, block, shared_mem, q.export_ptr, dev, schedule,
                                           tuple(a.value for a in conv), raw.options))
    data = [a.data for a in conv]
    keep = [a.array for a in conv if a.array is not None]  # the memory must outlive the queued launch
    raw_ptrs = [(i, int(np.frombuffer(a.data, np.uint64)[0])) for i, (a, p) in enumerate(zip(conv, params))
                if p.kind == "pointer" and a.array is None and a.data != bytes(8)]

    def run():
        try:
            for i, ptr in raw_ptrs:  # an integer pointer does not keep its allocation alive
                if _memory.find(ptr) is None:
                    raise AsyncFault(f"kernel {name!r} argument {i}: 0x{ptr:x} was freed before the launch ran")
            try:
                kernel.launch(grid=grid, block=block, args=data, shared_mem=shared_mem, schedule=schedule)
            except engine.KernelFault as exc:
                _check_guards(name, grid, block, dev)  # restore the guards, report the kernel's own fault
                raise KernelFault(f"kernel {name!r} grid {grid} block {block} on device {dev}: {exc}") from exc
            _check_guards(name, grid, block, dev, raise_=True)
        finally:
            keep.clear()  # only now may the arguments' memory go (their guards were checked above)

    _streams.enqueue(q, run, f"launch of {name!r}")


def _check_guards(name, grid, block, dev, raise_=False):
    bad = _memory.check_guards()
    if bad and raise_:
        lines = "; ".join(f"{alloc!r}: {damage}" for alloc, damage in bad)
        raise OutOfBoundsWrite(f"kernel {name!r} grid {grid} block {block} on device {dev} wrote outside "
                               f"an allocation: {lines}")
