"""Steps that a stop must not cut in the middle, and the record of a complete OUT.

The library installs no signal handlers. :func:`held_signals` only *blocks*
SIGINT and SIGTERM in the calling thread over a step that must be whole (the
start of a local Dask cluster, whose worker processes inherit them blocked;
the final renames of a folder run); a signal that arrives meanwhile is
delivered when the block ends, to whatever handler the process has (Python's
own raises :class:`KeyboardInterrupt` for SIGINT). The ``gpuq`` command's
handlers (:mod:`gpuq.cli.signals`) record such a signal in :data:`_state` and
act on it through ``_state["on_pending"]`` when the outermost block ends.

:func:`complete` records that this run's OUT is complete (its last rename
made), so the command's stop line can say so.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading

#: The signals held over a step.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

#: ``held``: how many :func:`held_signals` blocks are open; ``pending``: the first signal
#: that came meanwhile (recorded by the command's handler); ``on_pending``: what the command
#: does with it when the outermost block ends (None in a library use); ``complete``: the OUT
#: this run has completed (see :func:`complete`), else None.
_state = {"held": 0, "pending": None, "on_pending": None, "complete": None}


def complete(out: str) -> None:
    """Record that OUT ``out`` is complete (its last rename made): a stop from here on says so.

    Call it inside the commit's :func:`held_signals` block, after the last rename, so a signal
    that came during the commit is acted on after this.

    >>> complete("q.safetensors"); _state["complete"]
    'q.safetensors'
    >>> _state["complete"] = None
    """
    _state["complete"] = out
    entry = sys.modules.get("_gpuq_entry")  # the console script's module: absent in a library use
    if entry is not None:
        entry.signal_at("commit")  # the tests' hook


def _in_main_thread() -> bool:
    # Python runs signal handlers in the main thread only.
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def held_signals():
    """Hold SIGINT and SIGTERM for the block; one that came is acted on when it ends.

    In this thread they are blocked, so the threads and processes started
    inside inherit them blocked (Dask's worker processes never see a Ctrl-C
    meant for the caller). No handler is installed.

    >>> with held_signals():
    ...     pass
    """
    if not _in_main_thread():
        yield
        return
    _state["held"] += 1
    blocking = hasattr(signal, "pthread_sigmask")  # not on Windows: recorded only
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS) if blocking else None
    try:
        yield
    finally:
        # A signal pending in this thread is delivered here, while still held: recorded
        # by the command's handler, or raised by Python's own.
        if blocking:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        _state["held"] -= 1
        signum = _state["pending"]
        if not _state["held"] and signum is not None:
            _state["pending"] = None
            if _state["on_pending"] is not None:
                _state["on_pending"](signum)
