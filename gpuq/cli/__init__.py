"""The ``gpuq`` command line (and ``python -m gpuq``): the top layer, a user of the public API.

What lives here: :mod:`.commands` (the parser, the command table, printing,
exit codes and :func:`main`) and :mod:`.signals` (the command's SIGINT/SIGTERM
handlers). The work is :mod:`gpuq.checkpoints`' (the checkpoint engine as a
library): each command parses its flags, calls it and prints its report.

May import: :mod:`gpuq.checkpoints` and :mod:`gpuq`'s public API. Nothing in the
library imports this package.

>>> from gpuq.cli import main
>>> main(["--version"])
gpuq 0.1.0
0
"""

from .commands import build_parser, main

__all__ = ["main", "build_parser"]
