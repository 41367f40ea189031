"""What a contender is, and gpuq itself as contenders (fresh output, ``out=``, and for the
issue-5 cases the static quantize every dynamic row is measured against).

A contender's ``prepare(case, inputs, scales, zps)`` returns a
:class:`Prepared` (a ``run(i)`` to time, ``i`` picking the input buffer, and a
``fetch(result)`` that turns one result into a NumPy array for the
mismatch check; for ``dynamic``/``qparams`` cases a dict of the parts it
returns, ``{"q", "scales", "zps"}``, see ``data.as_parts``), or raises :class:`NotApplicable` with the reason it does not
cover the case (shown in the table, never hidden).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from .cases import DYNAMIC_OPS
from .data import as_parts, gpuq_fn, gpuq_kwargs, host_out, out_dtype


@dataclass
class OwnRows:
    """gpuq's own contenders in one run: fresh output, ``out=``, the static quantize of the
    issue-5 cases, and optionally rows for quantize/dequantize and for the issue-5 cases that
    only some runs have (the ufunc-loop rows)."""

    fresh: object
    out: object
    static: object
    extra: list = field(default_factory=list)
    extra_dynamic: list = field(default_factory=list)

    def for_case(self, case) -> list:
        if case.op in DYNAMIC_OPS:
            # static first: later rows log their ratio; out= does not exist for these
            return [self.static, self.fresh] + self.extra_dynamic
        return [self.fresh, self.out] + self.extra


class NotApplicable(Exception):
    """The contender has no equivalent of this case."""


@dataclass
class Prepared:
    run: Callable
    fetch: Callable = np.asarray


def _device_params(to_device, case, scales, zps, kw):
    """On a GPU: per-tensor parameters as a Python float and int, the call a user
    writes and the one torch's ``quantize_per_tensor`` row makes (they reach the
    kernel by value: no upload, checked on the host); other schemes' scales/zps
    uploaded once (as an op object keeps them), values checked once here rather
    than by a reduction and a synchronisation on every call."""
    if to_device is None:
        return scales, zps, kw
    if case.scheme == "tensor":
        return float(scales.reshape(-1)[0]), None if zps is None else int(zps.reshape(-1)[0]), kw
    zps = None if zps is None else to_device(zps)
    return to_device(scales), zps, dict(kw, check_values=False)


class GpuqFresh:
    """``gpuq.quantize``/``dequantize`` returning a fresh output each call."""

    name = "gpuq"
    is_peer = False

    def __init__(self, to_host=np.asarray, to_device=None):
        self.to_host, self.to_device = to_host, to_device

    def prepare(self, case, inputs, scales, zps):
        fn = gpuq_fn(case)
        kw = gpuq_kwargs(case)
        if case.op in DYNAMIC_OPS:
            # quantize_dynamic / choose_qparams: the qparams come from the data, every call.
            return Prepared(lambda i: fn(inputs[i % len(inputs)], **kw),
                            lambda r: as_parts(case, r, self.to_host))
        scales, zps, kw = _device_params(self.to_device, case, scales, zps, kw)
        return Prepared(lambda i: fn(inputs[i % len(inputs)], scales, zps, **kw),
                        lambda r: as_parts(case, r, self.to_host))


def _format_out(case, empty):
    """``out=`` of an issue-19 quantize on a device: a ``gpuq.Codes`` of uint8 bytes (CuPy has
    neither int4 nor fp8), packed for int4/uint4, pre-faulted."""
    import gpuq

    size = (case.code_nbytes(),) if case.qdtype in ("int4", "uint4") else case.shape()
    data = empty(size, np.uint8)
    data[...] = 1
    return gpuq.Codes(data, case.shape(), case.qdtype)


class GpuqOut:
    """The same call writing into a preallocated, pre-faulted ``out=``."""

    name = "gpuq out="
    is_peer = False

    def __init__(self, empty=np.empty, to_host=np.asarray, to_device=None):
        self.empty, self.to_host, self.to_device = empty, to_host, to_device

    def prepare(self, case, inputs, scales, zps):
        if case.op in DYNAMIC_OPS:
            raise NotApplicable("quantize_dynamic / choose_qparams take no out=")
        fn = gpuq_fn(case)
        kw = gpuq_kwargs(case)
        scales, zps, kw = _device_params(self.to_device, case, scales, zps, kw)
        if case.is_format and self.empty is np.empty:
            out = host_out(case, case.shape())  # a Codes for int4/uint4, an ml_dtypes array for fp8
        elif case.is_format and case.op == "quantize":
            out = _format_out(case, self.empty)
        else:
            out = self.empty(case.shape(), out_dtype(case))
            out[...] = 1  # fault the pages in once: that is the point of out=
        return Prepared(lambda i: fn(inputs[i % len(inputs)], scales, zps, out=out, **kw),
                        lambda r: as_parts(case, r, self.to_host))


class GpuqStatic:
    """The denominator of issue 5's ratios: a static ``gpuq.quantize`` of the same tensor, same scheme.

    Its scales/zps are ``choose_qparams`` of each input, computed once in
    ``prepare`` (not timed), passed as ``quantize`` takes them (on a GPU:
    device-resident, ``check_values=False``, as for the main table's gpuq rows).
    Only in ``dynamic``/``qparams`` cases; its output (codes, and those
    qparams) is checked against ``quantize_dynamic``'s.
    """

    name = "gpuq static"
    is_peer = False

    def __init__(self, to_host=np.asarray, device=False):
        self.to_host, self.device = to_host, device

    def prepare(self, case, inputs, scales, zps):
        import gpuq

        if case.op not in DYNAMIC_OPS:
            raise NotApplicable("only in dynamic/qparams cases")
        kw = gpuq_kwargs(case)
        sym = kw.pop("symmetric")
        params = [gpuq.choose_qparams(x, symmetric=sym, **kw) for x in inputs]
        if self.device:
            kw["check_values"] = False

        def run(i):
            s, z = params[i % len(inputs)]
            return gpuq.quantize(inputs[i % len(inputs)], s, z, **kw), s, z

        return Prepared(run, lambda r: as_parts(replace(case, op="dynamic"), r, self.to_host))


class GpuqUfuncs:
    """Contender ``base`` run on the NumPy ufunc loops instead of the compiled kernels (CPU runs
    where numba serves host arrays): what the kernels are worth, measured beside them.
    ``gpuq ufuncs out=`` (of ``GpuqOut``) for quantize/dequantize, ``gpuq ufuncs`` (of
    ``GpuqFresh``) for the issue-5 cases."""

    is_peer = False

    def __init__(self, base, name):
        self.base, self.name = base, name

    def prepare(self, case, inputs, scales, zps):
        import gpuq

        prep = self.base.prepare(case, inputs, scales, zps)

        def run(i):
            previous = gpuq.set_host_kernels("numpy")
            try:
                return prep.run(i)
            finally:
                gpuq.set_host_kernels(previous)

        return Prepared(run, prep.fetch)
