"""The checkpoint engine: what the ``gpuq`` command does to checkpoints, as a library.

>>> import gpuq.checkpoints as ckpt
>>> sorted(ckpt.__all__)
['GpuqWarning', 'compare', 'dequantize', 'example', 'inspect', 'quantize']

:mod:`.api` holds the functions (:func:`quantize`, :func:`dequantize`, :func:`inspect`,
:func:`compare`, :func:`example`); :mod:`.formats` the :class:`~.formats.Format` protocol, one
module per checkpoint format and their registry; below them :mod:`.files` (checked, streamed
reads and writes, atomic outputs), :mod:`.quantized` (gpuq's file format), :mod:`.selection`
(which tensors, which scheme), :mod:`.convert` (one tensor at a time), :mod:`.sharded`,
:mod:`.sharded_run` and :mod:`.cluster` (sharded runs, here or as Dask tasks), :mod:`.serving`
(model folders: compressed-tensors, fine-grained fp8), :mod:`.report`, :mod:`.comparison`,
:mod:`.example_data`, :mod:`.env` (device choice, ``gpuq info``) and :mod:`.stops` (steps held
whole; no signal handlers).

May import: :mod:`gpuq`'s public API (and, for ``gpuq info``, the backends'
self-descriptions); the optional ``dask``/``distributed``, tqdm, transformers. Never
:mod:`gpuq.cli`, which is above it.
"""

from .api import GpuqWarning, compare, dequantize, example, inspect, quantize

__all__ = ["GpuqWarning", "quantize", "dequantize", "inspect", "compare", "example"]
