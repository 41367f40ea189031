"""The ``gpuq`` command line (and ``python -m gpuq``): the top layer, a user of the public API.

What lives here, one module per command or concern: :mod:`.commands` (the
parser, the command table and :func:`main`), :mod:`.convert` (the work of
``quantize``/``dequantize``, one tensor at a time), :mod:`.files` (checkpoint
formats: checked, streamed reads and writes, atomic outputs), :mod:`.quantized`
(the quantized-file format and its checks), :mod:`.selection` (which tensors, which scheme),
:mod:`.report` (tables and JSON), :mod:`.env` (device choice, ``gpuq info``),
:mod:`.sharded` (sharded checkpoints: the index, the all-or-nothing output
folder, one shard's work), :mod:`.sharded_run` (a sharded run, here or on a
cluster), :mod:`.cluster` (shards as Dask tasks), :mod:`.signals` (SIGINT and
SIGTERM), :mod:`.compare` (``gpuq compare``: code types side by side) and
:mod:`.example` (the offline example checkpoint).

May import: :mod:`gpuq`'s public API (``gpuq.quantize``, ``gpuq.qparams``, ...)
and, for ``gpuq info`` only, the backends' self-descriptions
(:mod:`gpuq.backends.host.choice`, :mod:`gpuq.backends.cuda.nvrtc_check`); and,
for ``--scheduler``/``--workers`` only, the optional ``dask``/``distributed``.
Nothing in the library imports this package.

>>> from gpuq.cli import main
>>> main(["--version"])
gpuq 0.1.0
0
"""

from .commands import build_parser, main

__all__ = ["main", "build_parser"]
