"""What a contender is, and gpuq itself as two contenders (fresh output and ``out=``).

A contender's ``prepare(case, inputs, scales, zps)`` returns a
:class:`Prepared` (a ``run(i)`` to time, ``i`` picking the input buffer, and a
``fetch(result)`` that turns one result into a NumPy array for the
mismatch check), or raises :class:`NotApplicable` with the reason it does not
cover the case (shown in the table, never hidden).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .data import gpuq_kwargs, out_dtype


class NotApplicable(Exception):
    """The contender has no equivalent of this case."""


@dataclass
class Prepared:
    run: Callable
    fetch: Callable = np.asarray


def _device_params(to_device, scales, zps, kw):
    """On a GPU: scales/zps uploaded once (as an op object keeps them), values checked
    once here rather than by a reduction and a synchronisation on every call."""
    if to_device is None:
        return scales, zps, kw
    zps = None if zps is None else to_device(zps)
    return to_device(scales), zps, dict(kw, check_values=False)


class GpuqFresh:
    """``gpuq.quantize``/``dequantize`` returning a fresh output each call."""

    name = "gpuq"
    is_peer = False

    def __init__(self, to_host=np.asarray, to_device=None):
        self.to_host, self.to_device = to_host, to_device

    def prepare(self, case, inputs, scales, zps):
        import gpuq

        fn = gpuq.quantize if case.op == "quantize" else gpuq.dequantize
        kw = gpuq_kwargs(case)
        scales, zps, kw = _device_params(self.to_device, scales, zps, kw)
        return Prepared(lambda i: fn(inputs[i % len(inputs)], scales, zps, **kw), self.to_host)


class GpuqOut:
    """The same call writing into a preallocated, pre-faulted ``out=``."""

    name = "gpuq out="
    is_peer = False

    def __init__(self, empty=np.empty, to_host=np.asarray, to_device=None):
        self.empty, self.to_host, self.to_device = empty, to_host, to_device

    def prepare(self, case, inputs, scales, zps):
        import gpuq

        fn = gpuq.quantize if case.op == "quantize" else gpuq.dequantize
        kw = gpuq_kwargs(case)
        scales, zps, kw = _device_params(self.to_device, scales, zps, kw)
        out = self.empty(inputs[0].shape, out_dtype(case))
        out[...] = 1  # fault the pages in once: that is the point of out=
        return Prepared(lambda i: fn(inputs[i % len(inputs)], scales, zps, out=out, **kw), self.to_host)
