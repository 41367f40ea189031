"""Devices, streams and events of the simulator: every stream is an ordered work queue.

The model
---------
* Each device has a legacy default stream (handle 0, exported as 1 like
  ``cudaStreamLegacy``) and the streams created on it. A stream is a FIFO
  queue of operations (uploads, copies, elementwise work, reductions, kernel
  launches, event records and waits). Issuing an operation allocates its
  result at once but only *enqueues* its work on the current stream of the
  current device.
* Nothing runs by itself. Work runs at synchronisation points only: a
  stream's, device's or event's ``synchronize``, a host read (``get``,
  ``asnumpy``, ``bool``/``int``/``float``/``item``/``repr``), the import of a
  ``__cuda_array_interface__`` (v3 stream sync), and the stream/event queries
  ``done`` (a query reports the state *before* it and then lets the device
  progress to that point, so a polling loop ends but a first query of unsynced
  work says False). A synchronisation runs the queue in order up to its point,
  and before each operation, the operations that operation depends on. So a
  read that forgot a synchronisation sees the old data.
* Dependencies, fixed when an operation is enqueued: an operation on the
  legacy stream waits for everything already enqueued on the device's
  *blocking* streams; an operation on a blocking stream waits for everything
  already enqueued on the legacy stream (CUDA's implicit synchronisation of the
  legacy default stream); ``non_blocking=True`` streams wait for neither.
  ``Event.record`` enqueues a marker and remembers its position;
  ``Stream.wait_event`` enqueues a marker that waits for that position (so the
  waiting stream runs the recorded stream up to there first). An event never
  recorded is complete (CUDA's rule).
* Errors: an operation that fails while it runs (a kernel fault, guard bytes
  changed) is raised at the synchronisation point that ran it, like CUDA's
  asynchronous errors; the device's pending work is dropped and the device
  stays faulted (every later call on it raises ``DeviceFaulted``) until
  ``cupy._sim.clear_fault()``.
* The per-thread default stream (handle 2, ``Stream.ptds``) is not modelled.

The current device and the current stream of each device are per thread
(as in CUDA and CuPy); the queues are global and guarded by one lock.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections import deque

from .. import _sim
from .._errors import AsyncFault, CUDARuntimeError, DeviceFaulted

LEGACY, BLOCKING, NON_BLOCKING = "legacy", "blocking", "non-blocking"
#: cudaStreamLegacy / cudaStreamPerThread handles.
STREAM_LEGACY, STREAM_PER_THREAD = 1, 2

_lock = threading.RLock()


class _Op:
    __slots__ = ("deps", "fn", "seq", "what")

    def __init__(self, seq, fn, deps, what):
        self.seq, self.fn, self.deps, self.what = seq, fn, deps, what


class Queue:
    """The work queue of one stream: ``enqueued`` operations so far, ``done`` of them run."""

    __slots__ = ("__weakref__", "destroyed", "device_id", "done", "enqueued", "kind", "ops", "ptr")

    def __init__(self, device_id: int, ptr: int, kind: str):
        self.device_id, self.ptr, self.kind = device_id, ptr, kind
        self.ops = deque()
        self.enqueued = self.done = 0
        self.destroyed = False

    @property
    def export_ptr(self) -> int:
        """The handle other libraries see (the legacy stream is 1, never 0)."""
        return STREAM_LEGACY if self.kind == LEGACY else self.ptr

    def __repr__(self):
        return (f"<{self.kind} stream 0x{self.ptr:x} of device {self.device_id}: "
                f"{self.done}/{self.enqueued} run>")


class DeviceState:
    """One device's queues and its sticky fault."""

    def __init__(self, i: int):
        self.id = i
        self.legacy = Queue(i, 0, LEGACY)
        self.queues = [self.legacy]
        self.fault = None

    def pending(self) -> int:
        return sum(q.enqueued - q.done for q in self.queues)

    def check(self):
        if self.fault is not None:
            raise DeviceFaulted(f"device {self.id} has a sticky error from earlier asynchronous work "
                                f"({self.fault}); cupy._sim.clear_fault() resets it") from self.fault


_states = [DeviceState(i) for i in range(_sim.DEVICE_COUNT)]
_handles = itertools.count(0x5EA10000, 0x100)  # fake cudaStream_t values, never 0/1/2
_by_ptr: dict = {}  # live stream handle -> Queue


def device_count() -> int:
    return len(_states)


def check_device_id(i) -> int:
    i = int(i)
    if not 0 <= i < len(_states):
        raise CUDARuntimeError("cudaErrorInvalidDevice",
                               f"invalid device ordinal {i} (the simulator has {len(_states)} devices; "
                               f"GPUQ_SIM_DEVICES sets the count)")
    return i


def device_state(i) -> DeviceState:
    return _states[check_device_id(i)]


# --- current device and stream (per thread) -----------------------------------------------------

class _TLS(threading.local):
    def __init__(self):
        self.device = 0
        self.device_stack = []
        self.current = {}  # device id -> current stream object
        self.stack = {}  # device id -> streams pushed by `with` (CuPy's current_stream_stack)
        self.stack_devices = []  # device of each `with` push, to pop the right one


_tls = _TLS()


def current_device_id() -> int:
    return _tls.device


def set_current_device(i) -> None:
    _tls.device = check_device_id(i)


def current_stream(device_id: int | None = None):
    """The current stream object of ``device_id`` (default: the current device)."""
    dev = _tls.device if device_id is None or device_id == -1 else check_device_id(device_id)
    return _tls.current.get(dev, Stream.null)


def current_queue() -> Queue:
    dev = _tls.device
    return queue_of(current_stream(dev), dev)


def queue_of(stream, device_id: int | None = None) -> Queue:
    """The queue behind ``stream`` (any object with ``.ptr``). Handles 0 and 1 are the legacy
    stream of the stream's own device, else of ``device_id``, else of the current device."""
    ptr = int(stream.ptr)
    if ptr in (0, STREAM_LEGACY):
        dev = getattr(stream, "device_id", -1)
        if dev is None or dev < 0:
            dev = _tls.device if device_id is None else device_id
        return device_state(dev).legacy
    if ptr == STREAM_PER_THREAD:
        raise CUDARuntimeError("cudaErrorNotSupported",
                               "the per-thread default stream is not modelled by the simulator")
    q = _by_ptr.get(ptr)
    if q is None:
        raise CUDARuntimeError("cudaErrorInvalidResourceHandle", f"0x{ptr:x} is not a live stream")
    return q


def _push_stream(stream, dev):
    _tls.stack.setdefault(dev, []).append(_tls.current.get(dev, Stream.null))
    _tls.stack_devices.append(dev)
    _tls.current[dev] = stream


def _pop_stream():
    dev = _tls.stack_devices.pop()
    _tls.current[dev] = _tls.stack[dev].pop()


# --- queues --------------------------------------------------------------------------------------

def _new_queue(device_id: int, non_blocking: bool) -> Queue:
    with _lock:
        q = Queue(device_id, next(_handles), NON_BLOCKING if non_blocking else BLOCKING)
        _by_ptr[q.ptr] = q
        _states[device_id].queues.append(q)
    return q


def _destroy_queue(ptr: int) -> None:
    # cudaStreamDestroy: the handle dies at once, queued work still runs at the next sync.
    with _lock:
        q = _by_ptr.pop(ptr, None)
        if q is not None:
            q.destroyed = True
            _prune(_states[q.device_id])


def _prune(st: DeviceState) -> None:
    st.queues = [q for q in st.queues if not (q.destroyed and q.done == q.enqueued)]


def enqueue(q: Queue, fn, what: str, waits=()):
    """Append ``fn`` (None: a marker) to ``q``; returns its position ``(q, seq)``.

    ``waits``: positions it must wait for (event waits), besides the implicit ones.
    """
    with _lock:
        st = _states[q.device_id]
        st.check()
        if q.destroyed:
            raise CUDARuntimeError("cudaErrorInvalidResourceHandle", f"stream 0x{q.ptr:x} was destroyed")
        deps = [(wq, seq) for wq, seq in waits if wq.done < seq]
        if q.kind == LEGACY:
            deps += [(o, o.enqueued) for o in st.queues if o.kind == BLOCKING and o.done < o.enqueued]
        elif q.kind == BLOCKING and st.legacy.done < st.legacy.enqueued:
            deps.append((st.legacy, st.legacy.enqueued))
        q.enqueued += 1
        q.ops.append(_Op(q.enqueued, fn, tuple(deps), what))
        return q, q.enqueued


def run_until(q: Queue, seq: int) -> None:
    """Run ``q`` up to and including operation ``seq``, with everything it depends on.

    Iterative (an explicit stack): dependencies always point at operations
    enqueued earlier, so there is no cycle. Raises the first fault met.
    """
    first = None
    with _lock:
        stack = [(q, seq)]
        while stack:
            cq, cseq = stack[-1]
            if cq.done >= cseq:
                stack.pop()
                continue
            op = cq.ops[0]
            unmet = [d for d in op.deps if d[0].done < d[1]]
            if unmet:
                stack.extend(unmet)
                continue
            cq.ops.popleft()
            cq.done = op.seq
            if op.fn is None:
                continue
            try:
                op.fn()
            except Exception as exc:  # noqa: BLE001  (any error of the work becomes the device's fault)
                fault = _fault(cq, op, exc)
                first = first or fault
        for st in _states:
            _prune(st)
    if first is not None:
        raise first


def _fault(q: Queue, op: _Op, exc: Exception) -> AsyncFault:
    st = _states[q.device_id]
    if isinstance(exc, AsyncFault):
        fault = exc
    else:
        fault = AsyncFault(f"{op.what} (operation {op.seq} of {q!r}) failed while it ran: "
                           f"{type(exc).__name__}: {exc}")
        fault.__cause__ = exc
    if st.fault is None:
        st.fault = fault
    for other in st.queues:  # CUDA aborts the context: nothing queued on it runs any more
        other.ops.clear()
        other.done = other.enqueued
    return fault


def _record_sync(what: str, device_id: int, stream_ptr):
    _sim.syncs.append(_sim.SyncRecord(what, device_id, stream_ptr))


def sync_queue(q: Queue, what: str) -> None:
    _record_sync(what, q.device_id, q.export_ptr)
    _states[q.device_id].check()
    run_until(q, q.enqueued)


def sync_device(device_id: int, what: str) -> None:
    st = device_state(device_id)
    _record_sync(what, device_id, None)
    st.check()
    for q in list(st.queues):
        run_until(q, q.enqueued)


def host_read(what: str, q: Queue, fn):
    """A blocking device-to-host read: enqueue ``fn`` on ``q``, run ``q`` up to it, return its result."""
    _record_sync(what, q.device_id, q.export_ptr)
    box = []
    pos = enqueue(q, lambda: box.append(fn()), what)
    run_until(*pos)
    return box[0]


# --- public classes (cupy.cuda.Device, Stream, ExternalStream, Event) -----------------------------

class Device:
    """``cupy.cuda.Device``: ``with Device(i):`` makes device ``i`` current for the block."""

    def __init__(self, device=None):
        self._id = _tls.device if device is None else int(device)
        self._stack = []

    @property
    def id(self) -> int:
        return self._id

    @property
    def compute_capability(self) -> str:
        check_device_id(self._id)
        return _sim.COMPUTE_CAPABILITY

    def use(self):
        set_current_device(self._id)
        return self

    def __enter__(self):
        prev = _tls.device
        set_current_device(self._id)
        _tls.device_stack.append(prev)
        return self

    def __exit__(self, *exc):
        _tls.device = _tls.device_stack.pop()

    def synchronize(self):
        sync_device(check_device_id(self._id), "Device.synchronize")

    def __int__(self):
        return self._id

    def __eq__(self, other):  # (CuPy's Device defines no __hash__ either)
        return isinstance(other, Device) and other._id == self._id

    def __repr__(self):
        return f"<CUDA Device {self._id}>"


class _BaseStream:
    """A stream handle (``ptr``) and the device it was created on (-1: whichever is current)."""

    def __init__(self, ptr: int, device_id: int):
        self.ptr = ptr
        self.device_id = device_id

    def _queue(self) -> Queue:
        return queue_of(self)

    def _check_device(self) -> int:
        cur = _tls.device
        if self.device_id not in (-1, cur):
            raise RuntimeError(f"The device that the stream is created on ({self.device_id}) "
                               f"does not match with the current device ({cur})")
        return cur

    def __eq__(self, other):
        return isinstance(other, _BaseStream) and other.ptr == self.ptr

    def __hash__(self):
        return self.ptr

    def __enter__(self):
        _push_stream(self, self._check_device())
        return self

    def __exit__(self, *exc):
        _pop_stream()

    def use(self):
        _tls.current[self._check_device()] = self
        return self

    def synchronize(self):
        sync_queue(self._queue(), "Stream.synchronize")

    @property
    def done(self) -> bool:
        q = self._queue()
        was = q.done >= q.enqueued
        sync_queue(q, "Stream.done")  # the device progresses after the query (see module docstring)
        return was

    def record(self, event=None):
        if event is None:
            event = Event()
        event.record(self)
        return event

    def wait_event(self, event):
        q = self._queue()
        pos = event._pos
        enqueue(q, None, "Stream.wait_event", waits=() if pos is None else (pos,))

    def __cuda_stream__(self):
        return (0, self.ptr)

    @property
    def is_non_blocking(self) -> bool:
        return self._queue().kind == NON_BLOCKING

    def __repr__(self):
        return f"<{type(self).__name__} {self.ptr} (device {self.device_id})>"


class Stream(_BaseStream):
    """``cupy.cuda.Stream``: a new stream on the current device (``Stream.null``: the legacy one)."""

    null = None

    def __init__(self, null=False, non_blocking=False, ptds=False, priority=None):
        if ptds:
            raise NotImplementedError("the per-thread default stream is not modelled by the simulator")
        if null:
            super().__init__(0, -1)
            return
        dev = _tls.device
        device_state(dev).check()
        q = _new_queue(dev, bool(non_blocking))
        super().__init__(q.ptr, dev)
        weakref.finalize(self, _destroy_queue, q.ptr)


Stream.null = Stream(null=True)


class ExternalStream(_BaseStream):
    """``cupy.cuda.ExternalStream``: a handle made elsewhere; it must name a live stream here."""

    def __init__(self, ptr, device_id=-1):
        ptr = int(ptr)
        super().__init__(ptr, int(device_id))
        if ptr not in (0, STREAM_LEGACY):
            q = queue_of(self)  # strict: an unknown handle fails now, not at first use
            if self.device_id not in (-1, q.device_id):
                raise CUDARuntimeError("cudaErrorInvalidResourceHandle",
                                       f"stream 0x{ptr:x} belongs to device {q.device_id}, "
                                       f"not {self.device_id}")


_event_handles = itertools.count(0xE7E00000, 0x100)


class Event:
    """``cupy.cuda.Event``: a position in one stream's queue once recorded."""

    def __init__(self, block=False, disable_timing=False, interprocess=False):
        if interprocess and not disable_timing:
            raise ValueError("Timing must be disabled for interprocess events")
        if interprocess:
            raise NotImplementedError("interprocess events are not modelled by the simulator")
        self._device_id = _tls.device
        self.ptr = next(_event_handles)
        self._pos = None  # (queue, seq) of the last record

    def record(self, stream=None):
        q = current_queue() if stream is None else queue_of(stream)
        if q.device_id != self._device_id:
            raise CUDARuntimeError("cudaErrorInvalidResourceHandle",
                                   f"event created on device {self._device_id} recorded on a stream "
                                   f"of device {q.device_id}")
        self._pos = enqueue(q, None, "Event.record")

    def synchronize(self):
        pos = self._pos
        dev = self._device_id if pos is None else pos[0].device_id
        _record_sync("Event.synchronize", dev, None if pos is None else pos[0].export_ptr)
        device_state(dev).check()
        if pos is not None:
            run_until(*pos)

    @property
    def done(self) -> bool:
        pos = self._pos
        if pos is None:
            return True
        was = pos[0].done >= pos[1]
        _record_sync("Event.done", pos[0].device_id, pos[0].export_ptr)
        device_state(pos[0].device_id).check()
        run_until(*pos)  # the device progresses after the query (see module docstring)
        return was

    def __repr__(self):
        state = "never recorded" if self._pos is None else f"at {self._pos[1]} of {self._pos[0]!r}"
        return f"<Event 0x{self.ptr:x} {state}>"


def get_current_stream(device_id: int = -1):
    """``cupy.cuda.get_current_stream``: the current stream of ``device_id`` (default: current device)."""
    return current_stream(device_id)
