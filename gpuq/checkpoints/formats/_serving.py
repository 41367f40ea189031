"""The serving formats' shared steps: quantize and dequantize a model folder through
:mod:`gpuq.checkpoints.serving` (compressed-tensors and fine-grained fp8 differ in the
``format`` the request names)."""

from __future__ import annotations

from ..env import pick_device
from ..serving import dequantize as _dequantize
from ..serving import quantize as _quantize


def check(opts) -> None:
    """Refuse options the format cannot write, before anything is read."""
    _quantize.check_local(opts)
    _quantize.Request(opts.format, dtype=opts.dtype, axis=opts.axis, per_tensor=opts.per_tensor,
                      group_size=opts.group_size, symmetric=opts.symmetric,
                      asymmetric=opts.asymmetric, block=opts.block)


def quantize(opts, *, warn, progress) -> dict:
    return _quantize.run(opts, warn=warn, progress=progress, device=pick_device(opts.device))


def dequantize(opts, *, warn, progress) -> dict:
    return _dequantize.run(opts.input, opts.output, dtype=opts.dtype, device=pick_device(opts.device),
                           progress=progress, nonfinite=opts.nonfinite, warn=warn)
