"""The ``gpuq`` console script's entry point: SIGINT/SIGTERM handled from its first statements.

This module lives outside the ``gpuq`` package on purpose: importing anything inside it runs
``gpuq/__init__.py`` first (NumPy, the backends: about 0.3 s), and a Ctrl-C then would print a
traceback. Here the handlers are installed before any import but the interpreter's own (``os``
and ``sys`` are loaded at its start, ``_signal`` is built in), so from this point on a stop
prints one line and exits 130 (SIGINT) or 143 (SIGTERM). Once the command runs,
:mod:`gpuq.cli.signals` takes over (its handlers remove what the run wrote) and gives these
back when it returns; a stop then, after OUT's last rename, says that OUT is complete.

:func:`signal_at` is the tests' hook: ``GPUQ_TEST_SIGNAL_AT=POINT:SIGNAME`` makes the process
send itself that signal when it reaches the named point (``imports``: before gpuq is imported;
``commit``: inside an output's commit; ``done``: after the command returned).

>>> signal_at("imports")   # without the environment variable: nothing
"""

import _signal
import os
import sys

_STOP = (_signal.SIGINT, _signal.SIGTERM)


def _stopped(signum, frame):
    # No cleanup is needed here: nothing is written before gpuq.cli.signals' handlers are in place.
    for s in _STOP:
        _signal.signal(s, _signal.SIG_IGN)
    signals = sys.modules.get("gpuq.cli.signals")
    if signals is not None:
        line = signals.stopped_line(signum)
    else:
        line = "gpuq: interrupted" if signum == _signal.SIGINT else "gpuq: terminated (SIGTERM)"
    try:
        sys.stdout.flush()  # what the command printed (the report) goes out whole
    except Exception:  # a closed pipe: nothing more to say there
        pass
    os.write(2, (line + "\n").encode())
    os._exit(128 + signum)


for _s in _STOP:
    if _signal.getsignal(_s) != _signal.SIG_IGN:  # nohup's ignored SIGINT stays ignored
        _signal.signal(_s, _stopped)


def signal_at(point: str) -> None:
    """Send this process the signal that ``$GPUQ_TEST_SIGNAL_AT`` (``POINT:SIGNAME``) names
    when it names ``point``; nothing otherwise."""
    spec = os.environ.get("GPUQ_TEST_SIGNAL_AT", "")
    where, _, name = spec.partition(":")
    if where == point and name in ("SIGINT", "SIGTERM"):
        os.kill(os.getpid(), getattr(_signal, name))


def main() -> int:
    """The ``gpuq`` command (:func:`gpuq.cli.main`) behind the early handlers; its exit code."""
    signal_at("imports")
    from gpuq.cli import main as gpuq_main

    status = gpuq_main()
    signal_at("done")
    return status


if __name__ == "__main__":
    sys.exit(main())
