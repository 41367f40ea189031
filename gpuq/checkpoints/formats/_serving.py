"""The serving formats' shared steps: a model folder quantized and read back through
:mod:`gpuq.checkpoints.serving`, which calls the format module's own hooks
(:class:`ServingFormat`) for everything the format decides: its scheme, how one weight is
stored and read back, its ``quantization_config`` and how it reads a folder's config back."""

from __future__ import annotations

from typing import Protocol

from ..env import pick_device
from ..serving import dequantize as _dequantize
from ..serving import quantize as _quantize


class ServingFormat(Protocol):
    """What a model-folder format module provides besides :class:`~gpuq.checkpoints.formats.Format`
    (module-level names; :func:`steps` builds its ``check``, ``quantize`` and ``dequantize``).

    Its :class:`~gpuq.checkpoints.serving.formats.Layout` objects (carried by the
    :class:`~gpuq.checkpoints.serving.quantize.Request` it builds and by the schemes
    ``read_folder`` returns) write and read one quantized weight.
    """

    name: str
    #: config.json's ``quantization_config.quant_method`` of the format.
    QUANT_METHOD: str
    #: The ``quantization_config`` key that lists the Linears kept in float.
    IGNORE_KEY: str

    def request(self, opts):
        """The :class:`~gpuq.checkpoints.serving.quantize.Request` ``opts`` ask for; CliError naming
        the flag for a scheme the format cannot hold (nothing read)."""

    def scale_dtype(self, model) -> str:
        """The dtype the scales of ``model`` (a :class:`~gpuq.checkpoints.serving.folder.ModelFolder`) are stored in."""

    def config(self, model_config: dict, scheme, ignore: list) -> dict:
        """The output's config.json: ``model_config`` with the format's ``quantization_config``."""

    def column_notes(self, request) -> list:
        """Report notes on the vLLM column of the rows."""

    def load_notes(self, chosen: dict, specs: dict, request) -> list:
        """Report notes on what will not load right where (``chosen``: ``{name: scheme}``)."""

    def read_folder(self, qc: dict, specs: dict, where: str) -> tuple:
        """``({module: scheme}, what)`` of a folder whose ``quantization_config`` is ``qc``; one
        CliError line (starting with ``where``) for anything the format does not read."""


def steps(fmt):
    """``(check, quantize, dequantize)`` of the serving format module ``fmt`` (its hooks are read
    when a step runs, so a module passes itself before defining them all)."""

    def check(opts) -> None:
        _quantize.check_local(opts)
        request = fmt.request(opts)
        _quantize.with_rule(request, opts, request.scheme("float32"))

    def quantize(opts, *, warn, progress) -> dict:
        check(opts)
        return _quantize.run(opts, fmt.request(opts), fmt, warn=warn, progress=progress,
                             device=pick_device(opts.device))

    def dequantize(opts, *, warn, progress) -> dict:
        """A model folder of this format read back to floats."""
        return _dequantize.run(opts.input, opts.output, dtype=opts.dtype, device=pick_device(opts.device),
                               progress=progress, nonfinite=opts.nonfinite, warn=warn,
                               readers={fmt.QUANT_METHOD: fmt.read_folder})

    return check, quantize, dequantize
