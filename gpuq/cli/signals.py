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
import sys
import threading

#: The stop signals and the exit status of a command stopped by each (128 + the number).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
EXIT_STATUS = {signal.SIGINT: 130, signal.SIGTERM: 143}


class Terminated(BaseException):
    """SIGTERM arrived: raised in the main thread (a BaseException, as KeyboardInterrupt is)."""


#: ``held``: how many :func:`held_signals` blocks are open; ``pending``: the first signal
#: that came meanwhile. One handler serves both states, so no signal falls between two.
#: ``complete``: the OUT this run has completed (see :func:`complete`), else None.
_state = {"held": 0, "pending": None, "complete": None}


def complete(out: str) -> None:
    """Record that OUT ``out`` is complete (its last rename made): a stop from here on says so.

    Call it inside the commit's :func:`held_signals` block, after the last rename, so a signal
    that came during the commit is acted on after this.

    >>> complete("q.safetensors"); stopped_line(signal.SIGTERM)
    "gpuq: terminated (SIGTERM) after OUT 'q.safetensors' was complete (written whole; only the report is cut short)"
    >>> _state["complete"] = None
    """
    _state["complete"] = out
    entry = sys.modules.get("_gpuq_entry")  # the console script's module: absent in a library use
    if entry is not None:
        entry.signal_at("commit")  # the tests' hook


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


def _in_main_thread() -> bool:
    # Python runs signal handlers in the main thread only, and only it may install them.
    return threading.current_thread() is threading.main_thread()


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
    try:
        for s in STOP_SIGNALS:
            if before[s] != signal.SIG_IGN:
                signal.signal(s, _on_stop)
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)


@contextlib.contextmanager
def held_signals():
    """Hold SIGINT and SIGTERM for the block; act on one that came when it ends.

    In this thread they are blocked, so the threads and processes started
    inside inherit them blocked (Dask's worker processes never see a Ctrl-C
    meant for the command); one that another thread receives is recorded by
    :func:`stop_signals`' handler and acted on when the outermost block ends.

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
        # A signal pending in this thread is delivered here, while still held: recorded.
        if blocking:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        _state["held"] -= 1
        signum = _state["pending"]
        if not _state["held"] and signum is not None:
            _state["pending"] = None
            if signal.getsignal(signum) is _on_stop:
                _act(signum)
