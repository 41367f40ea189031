"""The command's stream of a shard through the GPU's one pass (issue 40, point 1), above both
passes: :func:`shard_weights` asks :func:`gpuq.checkpoints.fused.covers` which weights the GPU
takes (from their file specs, nothing read), forms their plans with the host pass's arguments
(:func:`gpuq.checkpoints.fused.pass_args`, :func:`~gpuq.checkpoints.fused.block_args`) and runs
them through :mod:`gpuq.checkpoints.fused_cuda`'s pipeline; :func:`weight_outputs` gives a
result's stored tensors and figures as :func:`gpuq.checkpoints.fused.quantize_weight` does.
(fused_cuda itself imports nothing of fused: fused dispatches to it.)
"""

from __future__ import annotations

import math

import numpy as np

from . import fused, fused_cuda


def plan_weight(shape, dtype, scheme, device, method: str, global_scale=None):
    """The GPU pass's :class:`~gpuq.backends.cuda.weight_pass.Plan` for a ``[out, in]`` weight
    of ``shape`` and ``dtype`` (its file's spec: nothing is read) in ``scheme`` on ``device``,
    or None where :func:`gpuq.checkpoints.fused.covers` says the pass does not take it;
    ``global_scale``: NVFP4's shared one (a merged layer's), None for the weight's own
    (computed on the GPU).

    >>> from gpuq.checkpoints.env import HostDevice
    >>> plan_weight((2, 256), np.float32, None, HostDevice(), "minmax") is None   # not a GPU
    True
    """
    from ..backends.cuda import weight_pass

    if getattr(device, "name", None) != "cuda" or len(shape) != 2:
        return None
    stand_in = np.empty(shape, dtype)  # covers reads the shape, dtype and order only (pages never touched)
    if not fused.covers(stand_in, scheme, device, method):
        return None
    if scheme.strategy == "block":
        code, symmetric, eps, sdt = fused.block_args(shape, dtype, scheme)
        return weight_pass.plan_blocks(shape, fused_cuda._dtype_name(dtype), code, symmetric, eps, sdt, tuple(scheme.block))
    if fused.micro_kernel(scheme):  # fp4/fp6 under MX or NVFP4 scales: the microscaling kernel
        table = fused.mx_table_of(scheme)
        return weight_pass.plan_micro(shape, fused_cuda._dtype_name(dtype), scheme.code, scheme.group_size,
                                      mx_table=table, global_scale=global_scale, nvfp4=table is None)
    g = fused.group_of(shape, scheme)
    code, symmetric, eps, sdt = fused.pass_args(shape, dtype, scheme.code.name, scheme.symmetric,
                                                scheme.scale_dtype, scheme.strategy, g, fused.scheme_rule(scheme))
    return weight_pass.plan(shape, fused_cuda._dtype_name(dtype), code, symmetric, eps, sdt, g, scheme.strategy == "tensor",
                            fused.scales_given(scheme, method))


def weight_outputs(r: "fused_cuda.Result", scheme, module: str, shape) -> tuple:
    """``(tensors, stats, counts)`` of a weight's :class:`~gpuq.checkpoints.fused_cuda.Result` (not failed), as
    :func:`gpuq.checkpoints.fused.quantize_weight` gives them: the codes straight from the
    slot's pinned buffer (valid until the stream's next weight), the scales in the scheme's
    dtype."""
    signal, error, max_err = r.figures
    stats = fused._figures(signal, error, max_err, r.counts, math.prod(shape))
    if fused.micro_kernel(scheme):  # the scale bytes (and NVFP4's global scale)
        two_level = {} if r.global_scale is None else {"global_scale": np.float32(r.global_scale)}
        return scheme.layout.encode_bytes(module, shape, scheme, r.codes, r.scales, **two_level), stats, r.counts
    return fused.encode(scheme, module, shape, r.codes, r.scales, r.zps), stats, r.counts


def shard_weights(ckpt, chosen: dict, device, method: str, shared=None):
    """``(name, Result or None)`` for every tensor of the open checkpoint ``ckpt``, in file order:
    the weights of ``chosen`` (name -> scheme) the GPU's pass takes are read straight into the
    stream's pinned buffers (``ckpt.load(name, out=...)``: the bytes at the file's offsets), the
    next one's read overlapping the GPU's work on the one before (:func:`gpuq.checkpoints.fused_cuda.quantize_stream`);
    every other tensor comes as ``(name, None)``, in its turn, for the caller's own path;
    ``shared``: NVFP4's shared global scales by weight name (the others' are computed on the GPU). Close
    it (``contextlib.closing``) where the loop may stop early.

    >>> for name, r in shard_weights(ckpt, chosen, device, "minmax"):   # doctest: +SKIP
    ...     print(name, r is not None and r.counts)
    """
    def jobs():
        for name in ckpt.names:
            shape, dtype = ckpt.spec(name)
            scheme = chosen.get(name)
            plan = None
            if scheme is not None and ckpt.format == "safetensors":
                plan = plan_weight(shape, dtype, scheme, device, method, (shared or {}).get(name))
            yield fused_cuda.Job(name, shape, dtype, lambda buf, name=name: ckpt.load(name, out=buf), plan,
                      lambda buf, scheme=scheme: fused.chosen_for(buf, scheme, method, fused.scheme_rule(scheme), device))

    return fused_cuda.quantize_stream(jobs(), role="stream")
