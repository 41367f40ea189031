"""Pinned (page-locked) host memory of the stand-in: ``cupy.cuda.alloc_pinned_memory``.

Added for the GPU weight pass's run loop (gpuq.checkpoints.fused_cuda), the minimum it uses:
:func:`alloc_pinned_memory` returns a :class:`PinnedMemoryPointer`, a fixed-size host buffer
with the buffer protocol (``numpy.frombuffer(mem, dtype, count)``, as with CuPy's) and ``ptr``.

What it models: on a GPU, ``ndarray.set(arr, stream)`` from pinned memory is an asynchronous
copy that reads ``arr`` when the stream gets to it, so the host must not refill the buffer
before that. :func:`is_pinned` lets ``ndarray.set`` read such an ``arr`` when its queue runs
(not at the call, as it snapshots pageable memory), so a buffer reused too early uploads the
new bytes and the test sees them. Downloads (``get(out=..., blocking=False)``) already write
``out`` when their queue runs. Not modelled: pinned-memory pools, ``PinnedMemory`` objects,
mapped or portable flags.
"""

from __future__ import annotations

import bisect
import threading
import weakref

import numpy as np

_lock = threading.Lock()
_starts: list = []   # sorted start addresses of live pinned buffers
_by_start: dict = {}  # start -> weakref to the buffer


class PinnedMemoryPointer(bytearray):
    """``size`` bytes of pinned host memory (never resized: its address stays)."""

    @property
    def ptr(self) -> int:
        return np.frombuffer(self, np.uint8).ctypes.data if len(self) else 0

    def size(self) -> int:
        return len(self)


def _forget(start):
    with _lock:
        if start in _by_start:
            del _by_start[start]
            _starts.remove(start)


def alloc_pinned_memory(size) -> PinnedMemoryPointer:
    """``cupy.cuda.alloc_pinned_memory``: ``size`` bytes (zeroed here; CuPy's are uninitialised)."""
    mem = PinnedMemoryPointer(int(size))
    start = mem.ptr
    if start:
        with _lock:
            bisect.insort(_starts, start)
            _by_start[start] = weakref.ref(mem)
        weakref.finalize(mem, _forget, start)
    return mem


def is_pinned(arr: np.ndarray) -> bool:
    """Whether NumPy ``arr``'s bytes lie in a live pinned buffer."""
    if arr.size == 0:
        return False
    lo = arr.__array_interface__["data"][0]
    with _lock:
        i = bisect.bisect_right(_starts, lo) - 1
        if i < 0:
            return False
        mem = _by_start[_starts[i]]()
    return mem is not None and lo + arr.nbytes <= _starts[i] + len(mem)
