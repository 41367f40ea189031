"""The serving formats' shared steps: a model folder quantized and read back through
:mod:`gpuq.checkpoints.serving`; each format module supplies its ``request(opts)``, the
scheme it writes, checked before anything is read."""

from __future__ import annotations

from ..env import pick_device
from ..serving import dequantize as _dequantize
from ..serving import quantize as _quantize


def steps(request):
    """``(check, quantize, dequantize)`` of a serving format whose scheme ``request(opts)`` builds."""

    def check(opts) -> None:
        _quantize.check_local(opts)
        request(opts)

    def quantize(opts, *, warn, progress) -> dict:
        check(opts)
        return _quantize.run(opts, request(opts), warn=warn, progress=progress,
                             device=pick_device(opts.device))

    return check, quantize, dequantize


def dequantize(opts, *, warn, progress) -> dict:
    """A model folder read back to floats (every format's folder: config.json says which)."""
    return _dequantize.run(opts.input, opts.output, dtype=opts.dtype, device=pick_device(opts.device),
                           progress=progress, nonfinite=opts.nonfinite, warn=warn)
