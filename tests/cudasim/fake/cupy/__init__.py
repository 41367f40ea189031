"""A NumPy-backed stand-in for the part of CuPy that gpuq, its tests and bench use (tests only).

Put ``tests/cudasim/fake`` first on ``sys.path`` (``tests/cudasim/install.py``
does it when no real CuPy with a device is usable) and ``import cupy`` gets
this package. gpuq then runs unchanged: API -> dispatch -> CudaBackend ->
compile -> :class:`RawModule` -> launch, with the kernels compiled for the host
and run by the engine in ``tests/cudasim/hostbuild.py``.

It is strict where a GPU punishes: device memory has guard bytes checked after
every launch, kernel arguments are checked against the kernel's signature and
pointers against the launch's device, streams are ordered queues that only run
at synchronisation points (so a missing synchronisation reads stale data), and
asynchronous errors surface at the synchronisation that runs the failing work.
See :mod:`.cuda._streams` (the stream model), :mod:`._memory`, :mod:`._core`,
:mod:`._raw`, and :mod:`._sim` (records and switches for tests).

What exists: ``ndarray``; ``array``, ``asarray``, ``ascontiguousarray``,
``asnumpy``, ``empty``, ``zeros``, ``ones``, ``full`` and their ``*_like``,
``arange``, ``linspace``, ``broadcast_to``, ``copyto``, ``may_share_memory``,
``from_dlpack``; NumPy's dtype names; ``RawModule``, ``RawKernel``;
``cuda.Device``, ``cuda.Stream``, ``cuda.ExternalStream``, ``cuda.Event``,
``cuda.get_current_stream``, ``cuda.alloc_pinned_memory`` (:mod:`.cuda._pinned`),
``cuda.runtime``, ``cuda.driver``; ``_sim``.
Anything else is absent (``AttributeError``), e.g. ``cupy.random``,
``ElementwiseKernel``, memory pools, ``cuda.get_elapsed_time``: tests that
need them should skip on the stand-in.
"""

import numpy as _np

from . import _sim, cuda  # noqa: F401
from ._core import (  # noqa: F401
                    MemoryPointer,
                    arange,
                    array,
                    asarray,
                    ascontiguousarray,
                    asnumpy,
                    broadcast_to,
                    copyto,
                    empty,
                    empty_like,
                    from_dlpack,
                    full,
                    full_like,
                    linspace,
                    may_share_memory,
                    ndarray,
                    ones,
                    ones_like,
                    zeros,
                    zeros_like,
)
from ._raw import RawKernel, RawModule  # noqa: F401

#: Says what this is wherever a version is printed (gpuq's environment report, bench stamps).
__version__ = "0.0.0+gpuq.cudasim"

bool_ = _np.bool_
int8, int16, int32, int64 = _np.int8, _np.int16, _np.int32, _np.int64
uint8, uint16, uint32, uint64 = _np.uint8, _np.uint16, _np.uint32, _np.uint64
float16, float32, float64 = _np.float16, _np.float32, _np.float64
complex64, complex128 = _np.complex64, _np.complex128
intp, uintp = _np.intp, _np.uintp
dtype = _np.dtype
inf, nan, newaxis = _np.inf, _np.nan, None
cuda.MemoryPointer = MemoryPointer  # cupy.cuda.MemoryPointer
