"""Device memory of the simulator: host memory with guard bytes, and a pointer registry.

Every allocation (:class:`Allocation`) belongs to one device and is real host
memory, so kernels built for the host can dereference its pointer. Like
CuPy's memory pool the start is aligned to :data:`ALIGN` (256) bytes. Guard
bytes (:data:`GUARD` of them, a fixed pseudo-random pattern) sit immediately
before the start and immediately after the last requested byte (not after a
rounded-up size, so a write one element past the end is caught, which a GPU's
pool padding would hide). :func:`check_guards` compares them after every
kernel launch. New memory is filled with 0xFF bytes (NaN for every float
dtype, -1/255 for integers) so that reading memory nobody wrote shows.

The registry maps addresses back to live allocations (:func:`find`) for the
launch checks and for ``__cuda_array_interface__`` imports. It holds weak
references: an allocation lives as long as an array (or queued work) refers
to it, and leaves the registry when it dies. A zero-byte allocation has
pointer 0 (like CuPy's) and is not registered.
"""

from __future__ import annotations

import bisect
import threading
import weakref

import numpy as np

ALIGN = 256
GUARD = 256
POISON = 0xFF

# A fixed pattern (xorshift bytes, no long runs of one value), so that a kernel
# writing zeros, 0xFF or a small repeated value past the end is always caught.
_pattern = bytearray()
_state = 0x2545F491
while len(_pattern) < GUARD:
    _state ^= (_state << 13) & 0xFFFFFFFF
    _state ^= _state >> 17
    _state ^= (_state << 5) & 0xFFFFFFFF
    _pattern.append(_state & 0xFF)
PATTERN = bytes(_pattern)
_PATTERN_ARR = np.frombuffer(PATTERN, np.uint8)

_lock = threading.RLock()
_starts: list = []  # sorted start addresses of live allocations
_by_start: dict = {}  # start -> weakref to Allocation
_serial = iter(range(1, 1 << 62))


class Allocation:
    """``nbytes`` of device memory on ``device_id``: ``ptr`` is its (256-aligned) address,
    ``buf`` a NumPy uint8 view of exactly those bytes."""

    __slots__ = ("__weakref__", "_head", "_raw", "_tail", "buf", "device_id", "nbytes", "ptr", "serial")

    def __init__(self, nbytes: int, device_id: int):
        nbytes = int(nbytes)
        if nbytes < 0:
            raise ValueError(f"negative allocation size {nbytes}")
        self.nbytes = nbytes
        self.device_id = device_id
        self.serial = next(_serial)
        if nbytes == 0:
            self.ptr = 0
            self._raw = self.buf = np.empty(0, np.uint8)
            self._head = self._tail = None
            return
        raw = np.empty(GUARD + nbytes + GUARD + ALIGN, np.uint8)
        base = raw.ctypes.data
        start = -(-(base + GUARD) // ALIGN) * ALIGN
        lo = start - base
        self._raw = raw
        self.ptr = start
        self.buf = raw[lo:lo + nbytes]
        self.buf.fill(POISON)
        self._head = raw[lo - GUARD:lo]
        self._tail = raw[lo + nbytes:lo + nbytes + GUARD]
        self._head[:] = _PATTERN_ARR
        self._tail[:] = _PATTERN_ARR
        with _lock:
            bisect.insort(_starts, start)
            _by_start[start] = weakref.ref(self)
        weakref.finalize(self, _unregister, start)

    def __repr__(self):
        return f"<Allocation #{self.serial} 0x{self.ptr:x} {self.nbytes} B on device {self.device_id}>"

    def guard_damage(self):
        """``None`` if both guards are intact, else a description of the changed bytes.

        The guards are restored afterwards, so one bad write is reported once.
        """
        if self._head is None:
            return None
        parts = []
        for side, view in (("before", self._head), ("after", self._tail)):
            if view.tobytes() != PATTERN:
                bad = np.flatnonzero(view != _PATTERN_ARR)
                if side == "before":  # offsets relative to the start: negative
                    lo, hi = int(bad[0]) - GUARD, int(bad[-1]) - GUARD
                else:  # offsets relative to the start: nbytes and beyond
                    lo, hi = self.nbytes + int(bad[0]), self.nbytes + int(bad[-1])
                parts.append(f"{bad.size} byte(s) {side} it changed, at byte offsets {lo}..{hi}")
                view[:] = _PATTERN_ARR
        return "; ".join(parts) or None


def _unregister(start):
    with _lock:
        i = bisect.bisect_left(_starts, start)
        if i < len(_starts) and _starts[i] == start:
            del _starts[i]
        _by_start.pop(start, None)


def find(ptr: int, inclusive_end: bool = False):
    """The live allocation containing address ``ptr`` (``[ptr, ptr + nbytes)``, or up to and
    including the end with ``inclusive_end``), else None."""
    with _lock:
        i = bisect.bisect_right(_starts, ptr) - 1
        # .get: a finalizer may run (garbage collection) between the two lookups
        ref = _by_start.get(_starts[i]) if 0 <= i < len(_starts) else None
    alloc = ref() if ref is not None else None
    if alloc is None:
        return None
    end = alloc.ptr + alloc.nbytes
    if ptr < end or (inclusive_end and ptr == end):
        return alloc
    return None


def live():
    """Every live allocation (a snapshot)."""
    with _lock:
        refs = list(_by_start.values())
    return [a for a in (r() for r in refs) if a is not None]


def live_count(device_id=None) -> int:
    return sum(1 for a in live() if device_id is None or a.device_id == device_id)


def check_guards():
    """``[(allocation, description)]`` for every live allocation whose guards changed."""
    bad = []
    for alloc in live():
        damage = alloc.guard_damage()
        if damage:
            bad.append((alloc, damage))
    return bad
