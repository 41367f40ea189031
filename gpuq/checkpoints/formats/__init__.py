"""Checkpoint formats: one :class:`Format` protocol, one module per format, one registry.

A format module says whether it reads an input (:func:`reads`), quantizes a
checkpoint into its layout (``quantize``), reads its layout back to floats
(``dequantize``) and describes an input without reading the weights
(``describe``, behind :func:`gpuq.checkpoints.inspect`). :data:`FORMATS` maps
each ``--format`` name to its module; :func:`for_output` and :func:`for_input`
are the only places that choose one, so nothing outside this package (and the
serving engine it drives) branches on a format's name.

Adding a format: a module here implementing :class:`Format`, and its row in
:data:`FORMATS` (README, "Where to add"). A model-folder format (what serving engines
load) also implements :class:`~._serving.ServingFormat` and takes its ``check``,
``quantize`` and ``dequantize`` from :func:`._serving.steps`: the folder layer
(:mod:`gpuq.checkpoints.serving`) calls its hooks and its
:class:`~gpuq.checkpoints.serving.formats.Layout` (how one weight is stored and read
back) and never names a format. The per-tensor work is one function a format calls
per weight: :func:`gpuq.checkpoints.convert.quantize_tensor` for gpuq's files,
:func:`gpuq.checkpoints.serving.quantize.quantize_weight` for the model-folder
formats; a fused one-pass quantizer replaces that function.

May import: the rest of :mod:`gpuq.checkpoints` below :mod:`gpuq.checkpoints.api`
(files, selection, convert, sharded runs, the serving engine) and :mod:`gpuq`'s public API.
"""

from __future__ import annotations

from typing import Callable, Protocol

from . import compressed_tensors, fp8_blocks, gpt_oss, gpuq_files


class Format(Protocol):
    """What a checkpoint format module provides (module-level names).

    ``opts`` is the options namespace of :func:`gpuq.checkpoints.quantize` /
    ``dequantize`` (one attribute per command flag, dashes as underscores, plus
    ``input`` and ``output``); ``warn(text)`` reports a warning; ``progress`` is
    False, True or a callable ``(done, total, name)``.
    """

    name: str

    def reads(self, src: str) -> bool:
        """True when ``src`` is a checkpoint of this format that its ``dequantize`` reads."""

    def check(self, opts) -> None:
        """Raise ValueError naming the option for options this format refuses (nothing read)."""

    def quantize(self, opts, *, warn: Callable, progress) -> dict:
        """Write ``opts.output`` from ``opts.input``, all or nothing; return the report."""

    def dequantize(self, opts, *, warn: Callable, progress) -> dict:
        """Write the float checkpoint of ``opts.input`` to ``opts.output``; return the report."""

    def describe(self, src: str) -> dict:
        """What ``src`` holds (see :func:`gpuq.checkpoints.inspect`), weights not read."""


#: ``--format`` name -> its module. The first is the default; :func:`for_input` asks the
#: others first and falls back to it.
FORMATS = {m.name: m for m in (gpuq_files, compressed_tensors, fp8_blocks, gpt_oss)}
DEFAULT = "gpuq"


def for_output(name) -> Format:
    """The format that writes ``name`` (``format=`` of quantize).

    >>> for_output("fp8-blocks").name
    'fp8-blocks'
    >>> for_output("gguf")
    Traceback (most recent call last):
    ...
    ValueError: format must be one of gpuq, compressed-tensors, fp8-blocks, gpt-oss-mxfp4, got 'gguf'
    """
    if not isinstance(name, str) or name not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {name!r}")
    return FORMATS[name]


def for_input(src: str) -> Format:
    """The format that reads ``src`` (the default one when no other claims it).

    >>> for_input("/nonexistent/x.safetensors").name
    'gpuq'
    """
    for fmt in FORMATS.values():
        if fmt.name != DEFAULT and fmt.reads(src):
            return fmt
    return FORMATS[DEFAULT]
