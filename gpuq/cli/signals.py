"""What the ``gpuq`` command does when it is told to stop: SIGINT (Ctrl-C) and SIGTERM.

SIGTERM is what ``kill``, ``timeout``, SLURM, ``docker stop`` and systemd
send. For the command's duration (:func:`stop_signals`) it is handled as
Python handles SIGINT: :class:`Terminated` is raised in the main thread, as
:class:`KeyboardInterrupt` is for SIGINT, so the same ``finally``/``except
BaseException`` paths remove what the run wrote (a temporary file, a sharded
run's staged shards) and the command prints one line and exits 143 (130 for
SIGINT). The first of these signals is the one acted on: later ones are
ignored until the command returns, so the cleanup it started runs to its end
(a SIGKILL still stops everything).

:func:`held_signals` holds both signals over a step that must not be cut in
the middle: the start of a local Dask cluster (its worker processes inherit
them blocked, so a Ctrl-C to the terminal's process group reaches only this
process, which then stops them) and the final renames of a sharded run. A
signal that arrives meanwhile is acted on when the step is over.

A signal that was ignored when the command started (``nohup``, a background
job of a non-interactive shell) stays ignored.

Before and after the command, the ``gpuq`` console script's own handlers
(``_gpuq_entry``, installed before anything is imported) print one line and exit
130/143. Once OUT is complete (its last rename made: :func:`complete`), a stop
says so: ``gpuq: interrupted after OUT 'x' was complete ...``.
"""

from __future__ import annotations

import contextlib
import signal

from ..checkpoints.stops import STOP_SIGNALS, _in_main_thread, _state, complete, held_signals

__all__ = ["EXIT_STATUS", "Terminated", "stop_signals", "stopped_line", "complete", "held_signals"]

#: The exit status of a command stopped by each stop signal (128 + the number).
EXIT_STATUS = {signal.SIGINT: 130, signal.SIGTERM: 143}


class Terminated(BaseException):
    """SIGTERM arrived: raised in the main thread (a BaseException, as KeyboardInterrupt is)."""


def _act_pending(signum):
    if signal.getsignal(signum) is _on_stop:
        _act(signum)


def stopped_line(signum) -> str:
    """The one line a stop by ``signum`` prints.

    >>> stopped_line(signal.SIGINT)
    'gpuq: interrupted'
    """
    what = "interrupted" if signum == signal.SIGINT else "terminated (SIGTERM)"
    if _state["complete"] is None:
        return f"gpuq: {what}"
    return (f"gpuq: {what} after OUT {_state['complete']!r} was complete (written whole; only the "
            f"report is cut short)")


def _act(signum):
    for s in STOP_SIGNALS:
        signal.signal(s, signal.SIG_IGN)  # the cleanup this starts must not be cut short
    raise KeyboardInterrupt() if signum == signal.SIGINT else Terminated()


def _on_stop(signum, frame):
    if _state["held"]:
        _state["pending"] = _state["pending"] or signum
        return
    _act(signum)


@contextlib.contextmanager
def stop_signals():
    """SIGINT raises KeyboardInterrupt and SIGTERM :class:`Terminated`, once, inside the block.

    The handlers in place before are restored on the way out. Outside the
    main thread this does nothing (no thread but the main one gets signals).

    >>> import os, time
    >>> with stop_signals():
    ...     try:
    ...         os.kill(os.getpid(), signal.SIGTERM)
    ...         time.sleep(5)
    ...     except Terminated:
    ...         print("terminated")
    terminated
    """
    if not _in_main_thread():
        yield
        return
    before = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    _state["complete"] = None  # this run's OUT is not complete yet
    _state["on_pending"] = _act_pending
    try:
        for s in STOP_SIGNALS:
            if before[s] != signal.SIG_IGN:
                signal.signal(s, _on_stop)
        yield
    finally:
        _state["on_pending"] = None
        for s, handler in before.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
