"""``cupy.cuda`` of the stand-in: devices, streams, events (model: :mod:`._streams`)."""

from . import driver, runtime
from ._streams import Device, Event, ExternalStream, Stream, get_current_stream

__all__ = ["Device", "Event", "ExternalStream", "Stream", "driver", "get_current_stream", "runtime"]
