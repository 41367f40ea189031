"""``cupy.cuda`` of the stand-in: devices, streams, events (model: :mod:`._streams`), pinned host
memory (:mod:`._pinned`)."""

from . import driver, runtime
from ._pinned import PinnedMemoryPointer, alloc_pinned_memory
from ._streams import Device, Event, ExternalStream, Stream, get_current_stream

__all__ = ["Device", "Event", "ExternalStream", "PinnedMemoryPointer", "Stream", "alloc_pinned_memory", "driver",
           "get_current_stream", "runtime"]
