"""The one-pass quantization of model-folder weights on ``--device cuda`` (issue 40, point 1).

The GPU counterpart of :mod:`gpuq.checkpoints.fused`: the kernel
(:mod:`gpuq.backends.cuda.weight_pass`, ``kernels/weight_pass.cu``) reads the stored bits,
chooses the scales (or takes given ones: the MSE search's, MX's e8m0), writes the codes in the
format's final layout and reduces the report's figures in one launch; the codes and scales are
the host pass's, bit for bit. The microscaling layouts (fp4/fp6 codes under MX or NVFP4 scales
chosen in the kernel) take ``weight_micro`` the same way (:func:`quantize_micro`; their results
are the scale bytes and NVFP4's global scale).

:class:`Pipeline` is the run loop's machinery: two slots, each with its own CUDA stream, a
pinned (page-locked) host buffer the tensor is read into, pinned buffers the results come back
to, and the device buffers, all reused from weight to weight. :func:`quantize_stream` runs a
sequence of weights through it so that the file read of one weight overlaps the upload, the
kernel and the download of the one before (on the other slot's stream), and the upload of one
overlaps the download of the other. :func:`gpuq.checkpoints.fused_stream.shard_weights` is the command's shard loop on it
(the weights read from the file straight into the pinned buffers, the other tensors handed back
in their turn). :func:`quantize_rows` is the one-weight call behind
:func:`gpuq.checkpoints.fused.quantize_weight` (the same interface as the host pass's).

Without a GPU the tests run this module on the CPU execution of the kernels (tests/cudasim),
whose streams are ordered queues that run only at synchronisation points and whose uploads from
pinned memory read it when the queue runs, as a GPU's asynchronous copy does: a buffer reused
too early shows as wrong bytes there.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .._dtypes import is_bfloat16


def device_covers(x, scheme, method: str) -> bool:
    """Whether the GPU pass takes weight ``x`` in ``scheme`` on top of what the layout takes
    (:func:`gpuq.checkpoints.fused.covers` checks the rest): ``--calibrate minmax`` or ``mse``
    (the search's scales given to the pass), weights stored as bfloat16, float16 or float32,
    and int4/int8 or fp8 codes.

    >>> from gpuq.checkpoints.serving.formats import WeightScheme, int_code
    >>> from gpuq.checkpoints.formats.compressed_tensors import PACK
    >>> s = WeightScheme(int_code(4), "group", True, "bfloat16", PACK, group_size=128)
    >>> device_covers(np.zeros((2, 256), np.float32), s, "minmax"), device_covers(np.zeros((2, 256)), s, "minmax")
    (True, False)
    """
    code = scheme.code
    if method not in ("minmax", "mse") or not isinstance(x, np.ndarray):
        return False
    if not (is_bfloat16(x.dtype) or x.dtype in (np.float16, np.float32)):
        return False
    return code.codec == "float8" or (code.codec == "affine" and code.bits in (4, 8) and code.qmin < 0)


def _dtype_name(dtype) -> str:
    return "bfloat16" if is_bfloat16(dtype) else np.dtype(dtype).name


class Result(NamedTuple):
    """One weight's results in its slot's pinned buffers (valid until that slot's next submit)."""

    codes: np.ndarray          # the plan's out_shape and out_dtype
    scales: np.ndarray         # float32, plan.slots
    zps: np.ndarray | None     # int32, plan.slots, or None (symmetric)
    figures: tuple             # (signal, error, max_abs_error)
    counts: dict               # NaN, +Inf, -Inf
    failed: bool               # a scale the scale dtype cannot hold: nothing to trust
    x: np.ndarray              # the weight as uploaded (the slot's input; the multi-pass path's, on failure)
    global_scale: object = None  # NVFP4's float32 global scale (microscaling: scales are the scale bytes)


class _Slot:
    """A stream, pinned host buffers and device buffers, grown to the largest weight asked for."""

    def __init__(self, cupy):
        self.cupy = cupy
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.event = cupy.cuda.Event(disable_timing=True)
        self.host = {}    # name -> pinned uint8 NumPy array
        self.dev = {}     # name -> device uint8 array
        self.pending = None

    def pinned(self, key: str, nbytes: int) -> np.ndarray:
        buf = self.host.get(key)
        if buf is None or buf.size < nbytes:
            mem = self.cupy.cuda.alloc_pinned_memory(max(nbytes, 1))
            buf = self.host[key] = np.frombuffer(mem, np.uint8, max(nbytes, 1))
        return buf[:nbytes]

    def device(self, key: str, nbytes: int):
        buf = self.dev.get(key)
        if buf is None or buf.size < nbytes:
            buf = self.dev[key] = self.cupy.empty(max(nbytes, 8), self.cupy.uint8)
        return buf[:nbytes]


def _view(buf, dtype, count):
    return buf[:count * np.dtype(dtype).itemsize].view(dtype)


class Pipeline:
    """Two slots taken in turn; see the module docstring.

    >>> pipe = Pipeline()                                    # doctest: +SKIP
    >>> buf = pipe.input((2, 128), np.float32); buf[...] = 1 # doctest: +SKIP
    >>> r = pipe.result(pipe.submit(buf, p))                 # doctest: +SKIP
    """

    def __init__(self):
        import cupy

        self.cupy = cupy
        self.slots = [_Slot(cupy), _Slot(cupy)]
        self.turn = 0

    def input(self, shape, dtype) -> np.ndarray:
        """The pinned buffer the next :meth:`submit` uploads from, as ``shape`` and ``dtype``
        (its slot's last result must have been taken)."""
        slot = self.slots[self.turn]
        if slot.pending is not None:
            raise RuntimeError("the slot's last weight was submitted and its result not taken")
        dtype = np.dtype(dtype)
        return slot.pinned("in", math.prod(shape) * dtype.itemsize).view(dtype).reshape(shape)

    def submit(self, x: np.ndarray, p, given=None) -> _Slot:
        """Queue weight ``x`` (C order, :meth:`input`'s buffer or any array, then copied into
        it) under plan ``p`` (:func:`gpuq.backends.cuda.weight_pass.plan`) on the next slot's
        stream: upload, kernels, downloads, an event; ``given`` ``(scales, zps)`` (host arrays,
        one a group or one; zps None for symmetric signed codes) under ``p.given``: uploaded
        with the weight. Returns the slot for :meth:`result`."""
        from ..backends.cuda import weight_pass

        buf = self.input(x.shape, x.dtype)
        if buf.ctypes.data != x.ctypes.data:
            buf[...] = x
        slot = self.slots[self.turn]
        self.turn ^= 1
        nin, nout = buf.nbytes, math.prod(p.out_shape) * p.out_dtype.itemsize
        host_out = slot.pinned("out", nout)
        host_par = slot.pinned("params", p.params_bytes)
        host_fig = slot.pinned("figures", 48 * weight_pass.MAX_BLOCKS + 4)
        micro = p.kind == weight_pass.MICRO
        if micro:  # MX's rule table, NVFP4's given global scale: up before the kernel
            host_par[:weight_pass.MICRO_HEAD] = p.micro[2]
        elif p.given:  # into the parameters' pinned buffer: up before the kernel, back after it
            _view(host_par, np.float32, p.slots)[...] = np.asarray(given[0], np.float32).reshape(-1)
            if not (p.symmetric and p.qmin < 0):
                host_par[4 * p.slots:].view(np.int32)[...] = np.asarray(given[1]).reshape(-1)
        with slot.stream:
            dev_in = slot.device("in", nin)
            dev_in.set(buf.reshape(-1).view(np.uint8), stream=slot.stream)
            dev_out = slot.device("out", nout)
            dev_par = slot.device("params", p.params_bytes)
            if micro:
                dev_par[:weight_pass.MICRO_HEAD].set(host_par[:weight_pass.MICRO_HEAD], stream=slot.stream)
            elif p.given:
                dev_par.set(host_par, stream=slot.stream)
            dev_fig = slot.device("figures", 48 * weight_pass.MAX_BLOCKS + 4)
            dev_keys = slot.device("keys", 8)
            # microscaling: the whole parameters' buffer (rule table, global scale, scale bytes)
            scales = dev_par if micro else _view(dev_par, np.float32, p.slots)
            zps = None if micro or (p.symmetric and p.qmin < 0) else dev_par[4 * p.slots:].view(np.int32)
            sums = _view(dev_fig, np.float64, 3 * weight_pass.MAX_BLOCKS)
            counts = dev_fig[24 * weight_pass.MAX_BLOCKS:48 * weight_pass.MAX_BLOCKS].view(np.int64)
            flag = dev_fig[48 * weight_pass.MAX_BLOCKS:].view(np.int32)
            weight_pass.enqueue(dev_in, p, dev_out, scales, zps, sums, counts, flag, dev_keys.view(np.uint32))
            # The downloads: the codes, the parameters, the partials and the flag, one each.
            dev_out.get(stream=slot.stream, out=host_out, blocking=False)
            dev_par.get(stream=slot.stream, out=host_par, blocking=False)
            dev_fig.get(stream=slot.stream, out=host_fig, blocking=False)
            slot.event.record(slot.stream)
        slot.pending = (p, buf)
        return slot

    def result(self, slot: _Slot) -> Result:
        """Wait for ``slot``'s weight and read its results (see :class:`Result`)."""
        from ..backends.cuda import weight_pass

        (p, x), slot.pending = slot.pending, None
        slot.event.synchronize()
        nout = math.prod(p.out_shape) * p.out_dtype.itemsize
        codes = slot.host["out"][:nout].view(p.out_dtype).reshape(p.out_shape)
        par = slot.host["params"]
        fig = slot.host["figures"]
        m = weight_pass.MAX_BLOCKS
        figures, counts = weight_pass.figures(_view(fig, np.float64, 3 * m),
                                              fig[24 * m:48 * m].view(np.int64), p.blocks)
        failed = bool(fig[48 * m:48 * m + 4].view(np.int32)[0] & 2)
        if p.kind == weight_pass.MICRO:  # the scale bytes, NVFP4's global scale
            sbytes, gs = weight_pass.micro_results(par, p)
            return Result(codes, sbytes, None, figures, counts, failed, x, gs)
        scales = _view(par, np.float32, p.slots)
        if p.block is not None:  # the block grid, as the host's block pass gives it
            scales = scales.reshape(-(-p.rows // p.block[0]), -1)
        zps = None if p.symmetric and p.qmin < 0 else par[4 * p.slots:8 * p.slots].view(np.int32)
        return Result(codes, scales, zps, figures, counts, failed, x)

    def drain(self) -> None:
        """Wait for the weights in flight and drop their results (a run that stops early leaves
        its slots free for the next one)."""
        for slot in self.slots:
            if slot.pending is not None:
                self.result(slot)


class Job(NamedTuple):
    """One weight of :func:`quantize_stream`: ``fill(buf)`` writes its data into ``buf`` (a pinned
    array of ``shape`` and ``dtype``; e.g. ``lambda buf: ckpt.load(name, out=buf)``); ``plan``
    None: a weight the GPU's pass does not take (the caller's, in its turn); ``choose(buf)``
    under ``plan.given``: its ``(scales, zps)`` once it is read, or None where they are refused
    (the weight is then the caller's, as without a plan)."""

    key: object
    shape: tuple
    dtype: object
    fill: object
    plan: object
    choose: object = None


def quantize_stream(jobs, pipeline: Pipeline | None = None, role: str = "rows"):
    """``(key, Result)`` for each :class:`Job`, in order; ``(key, None)`` for a job without a
    plan (or whose ``choose`` refused): the caller's. Each job is handed back once the next
    one is read and queued, so the read (``fill``) of each weight, and the caller's work on the
    job before it, run while the GPU works; a result is valid until the next one is asked for.
    A stream closed early (an error in the caller's loop) waits for the weights in flight.
    ``pipeline``: the device's for ``role`` (:func:`_pipeline`) by default, taken at the first
    weight with a plan (a stream of none needs no GPU).

    >>> for key, r in quantize_stream(jobs):                 # doctest: +SKIP
    ...     write(key, r.codes, r.scales)
    """
    pipe, prev = pipeline, None
    try:
        for job in jobs:
            slot = None
            if job.plan is not None:
                pipe = pipe or _pipeline(role)
                buf = pipe.input(job.shape, job.dtype)
                job.fill(buf)  # the host's part, while the GPU has the previous weight
                given = job.choose(buf) if job.plan.given else None
                if not job.plan.given or given is not None:  # else refused: the caller's path says why
                    slot = pipe.submit(buf, job.plan, given)
            done, prev = prev, (job.key, slot)
            if done is not None:
                yield done[0], None if done[1] is None else pipe.result(done[1])
        if prev is not None:
            done, prev = prev, None
            yield done[0], None if done[1] is None else pipe.result(done[1])
    finally:
        if pipe is not None:
            pipe.drain()


_PIPELINES = {}


def _pipeline(role: str = "rows") -> Pipeline:
    """The current device's pipeline for ``role`` (``"rows"``: :func:`quantize_rows`,
    ``"stream"``: :func:`gpuq.checkpoints.fused_stream.shard_weights`), made once: its pinned buffers serve every
    later run. Two roles, so that a one-weight call (the multi-pass fallback of a weight the
    stream refused) never takes a slot the stream holds."""
    import cupy

    key = (cupy.cuda.Device().id, role)
    if key not in _PIPELINES:
        _PIPELINES[key] = Pipeline()
    return _PIPELINES[key]


def quantize_rows(x, code, symmetric, eps, scale_dtype, g, tensor, out, given=None):
    """:func:`gpuq.backends.host.weight_pass.quantize_rows` on the GPU: the same arguments (``x``
    and ``out`` host arrays; ``packing`` "words"; ``given`` the scales and zps chosen already),
    the same results (codes and scales bit for bit; the figures' sums in the kernel's order),
    or None where a scale falls out of the scale dtype.

    >>> from gpuq._codetypes import code_type                # doctest: +SKIP
    >>> out = np.empty((1, 1), np.uint32)                     # doctest: +SKIP
    >>> quantize_rows(np.float32([[7.0, -3.5]]), code_type("int4"), True, np.float32(1e-38),
    ...               "float32", 2, False, out)[2]           # doctest: +SKIP
    (61.25, 0.25, 0.5)
    """
    from ..backends.cuda import weight_pass

    p = weight_pass.plan(x.shape, _dtype_name(x.dtype), code, symmetric, eps, scale_dtype, g, tensor,
                         given is not None)
    pipe = _pipeline()
    r = pipe.result(pipe.submit(np.ascontiguousarray(x), p, given))
    if r.failed:
        return None
    out.reshape(-1).view(np.uint8)[...] = r.codes.reshape(-1).view(np.uint8)
    return r.scales.copy(), None if r.zps is None else r.zps.copy(), r.figures, r.counts


def quantize_blocks(x, code, symmetric, eps, scale_dtype, block, out):
    """:func:`gpuq.backends.host.weight_pass.quantize_blocks` on the GPU (fine-grained fp8: one
    scale a ``block``): the same arguments (``x`` and ``out`` host arrays) and results (codes
    and the scale grid bit for bit; the figures' sums in the kernel's order), or None where a
    scale falls out of the scale dtype.

    >>> from gpuq._codetypes import code_type                # doctest: +SKIP
    >>> out = np.empty((1, 3), np.uint8)                      # doctest: +SKIP
    >>> quantize_blocks(np.float32([[448.0, -1.0, 3.0]]), code_type("float8_e4m3fn"), True,
    ...                 np.float32(1e-38), "float32", (2, 2), out)[0].tolist()   # doctest: +SKIP
    [[1.0, 0.0066964286379516125]]
    """
    from ..backends.cuda import weight_pass

    p = weight_pass.plan_blocks(x.shape, _dtype_name(x.dtype), code, symmetric, eps, scale_dtype, block)
    pipe = _pipeline()
    r = pipe.result(pipe.submit(np.ascontiguousarray(x), p))
    if r.failed:
        return None
    out.reshape(-1)[...] = r.codes.reshape(-1)
    return r.scales.copy(), r.figures, r.counts


def quantize_micro(x, code, g, out, *, mx_table=None, global_scale=None, nvfp4=False):
    """:func:`gpuq.backends.host.weight_pass.quantize_micro` on the GPU (fp4/fp6 codes under MX
    or NVFP4 scales chosen in the kernel): the same arguments (``x`` and ``out`` host arrays),
    and ``nvfp4`` True with ``global_scale`` None: the weight's own global scale, computed on
    the GPU. Returns ``(scale_bytes, figures, counts, global_scale)`` (None for MX): the codes
    and scale bytes bit for bit the host pass's, the figures' sums in the kernel's order.

    >>> from gpuq._codetypes import code_type               # doctest: +SKIP
    >>> from gpuq._mx import mx_rule_table                    # doctest: +SKIP
    >>> out = np.empty((1, 16), np.uint8)                     # doctest: +SKIP
    >>> quantize_micro(np.float32([[6.0, -0.5] + [0.0] * 30]), code_type("float4_e2m1fn"), 32, out,
    ...                mx_table=mx_rule_table("float4_e2m1fn", "even"))[0].tolist()   # doctest: +SKIP
    [[127]]
    """
    from ..backends.cuda import weight_pass

    nvfp4 = nvfp4 or global_scale is not None
    p = weight_pass.plan_micro(x.shape, _dtype_name(x.dtype), code, g, mx_table=mx_table, global_scale=global_scale,
                               nvfp4=nvfp4)
    pipe = _pipeline()
    r = pipe.result(pipe.submit(np.ascontiguousarray(x), p))
    out.reshape(-1)[...] = r.codes.reshape(-1)
    return r.scales.copy(), r.figures, r.counts, None if r.global_scale is None else np.float32(r.global_scale)
