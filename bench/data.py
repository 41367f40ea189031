"""Benchmark inputs: random, never zeros, the same recipe on host and device.

Floats are N(0, 1); scales lie in [1/80, 1/48] so that codes span most of
the int8 range and a few percent saturate; zero points are small and, for
uint8, centred on 128. Codes for dequantize are uniform over the full range.
"""

from __future__ import annotations

import numpy as np

from .cases import DYNAMIC_OPS, Case


def host_params(case: Case, seed: int = 1):
    """``(scales, zps)`` as NumPy arrays of ``case.param_shape()`` (zps ``None`` when symmetric)."""
    rng = np.random.default_rng(seed)
    pshape = case.param_shape()
    scales = rng.uniform(1 / 80, 1 / 48, size=pshape).astype(np.float32)
    if not case.zps:
        return scales, None
    lo, hi = (-8, 9) if case.qdtype == "int8" else (120, 137)
    zps = rng.integers(lo, hi, size=pshape).astype(np.int32)
    return scales, zps


def host_input(case: Case, seed: int = 0) -> np.ndarray:
    """The source tensor of ``case`` (floats for quantize, codes for dequantize)."""
    rng = np.random.default_rng(seed)
    size = case.numel() + case.offset
    if case.op != "dequantize":
        x = rng.standard_normal(size=size, dtype=np.float32).astype(case.float_dtype, copy=False)
    else:
        info = np.iinfo(case.qdtype)
        x = rng.integers(info.min, info.max + 1, size=size, dtype=case.qdtype)
    return _placed(x, case)


def device_input(case: Case, cp, seed: int = 0):
    """The source tensor of ``case`` on the current CUDA device (CuPy)."""
    rs = cp.random.RandomState(seed)
    size = case.numel() + case.offset
    if case.op != "dequantize":
        x = rs.standard_normal(size=size, dtype=cp.float32).astype(case.float_dtype, copy=False)
    else:
        info = np.iinfo(case.qdtype)
        x = rs.randint(info.min, info.max + 1, size=size, dtype=np.int32).astype(case.qdtype)
    return _placed(x, case)


def _placed(flat, case: Case):
    """``flat`` (``offset`` elements longer than the case) as the case's shape, ``offset`` in."""
    return flat[case.offset:].reshape(case.shape())


def out_dtype(case: Case):
    """The dtype gpuq writes for ``case``."""
    return case.float_dtype if case.op == "dequantize" else np.dtype(case.qdtype)


def input_dtype(case: Case):
    """The dtype of the tensor ``case`` reads."""
    return np.dtype(case.qdtype) if case.op == "dequantize" else case.float_dtype


def gpuq_kwargs(case: Case) -> dict:
    """Keyword arguments of ``gpuq.quantize``/``dequantize`` (or, for the
    issue-5 ops, ``quantize_dynamic``/``choose_qparams``) for ``case``."""
    if case.op in DYNAMIC_OPS:
        return {"axis": case.axis(), "group_size": case.group_size(), "dtype": case.qdtype,
                "symmetric": not case.zps}
    dtype = case.qdtype if case.op == "quantize" else case.fdtype
    return {"axis": case.axis(), "group_size": case.group_size(), "dtype": dtype}


def gpuq_fn(case: Case):
    """The gpuq function ``case`` times."""
    import gpuq

    return {"quantize": gpuq.quantize, "dequantize": gpuq.dequantize,
            "dynamic": gpuq.quantize_dynamic, "qparams": gpuq.choose_qparams}[case.op]


def as_parts(case: Case, result, to_host=np.asarray):
    """A gpuq result as host arrays, keyed for the mismatch check.

    quantize/dequantize: the output array itself. dynamic: ``{"q", "scales",
    "zps"}``; qparams: ``{"scales", "zps"}`` (``zps`` may be None).
    """
    if case.op == "dynamic":
        q, s, z = result
        return {"q": to_host(q), "scales": to_host(s), "zps": None if z is None else to_host(z)}
    if case.op == "qparams":
        s, z = result
        return {"scales": to_host(s), "zps": None if z is None else to_host(z)}
    return to_host(result)


def reference(case: Case, x, scales, zps, to_host=np.asarray):
    """gpuq's own output for ``case`` on ``x``, on the host: what every contender is checked against.

    For ``qparams`` cases the reference is ``quantize_dynamic``'s full result,
    so a static quantize (codes) and ``choose_qparams`` (scales, zps) are both
    checked against it, each on the parts it returns.
    """
    import gpuq

    if case.op in DYNAMIC_OPS:
        full = gpuq.quantize_dynamic(x, **gpuq_kwargs(case))
        return as_parts(case if case.op == "dynamic" else _as_dynamic(case), full, to_host)
    return to_host(gpuq_fn(case)(x, scales, zps, **gpuq_kwargs(case)))


def _as_dynamic(case):
    from dataclasses import replace

    return replace(case, op="dynamic")


def host_params_for(case: Case, seed: int = 1):
    """``host_params`` for quantize/dequantize; ``(None, None)`` where gpuq computes them."""
    if case.op in DYNAMIC_OPS:
        return None, None
    return host_params(case, seed)
