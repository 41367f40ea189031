"""Benchmark inputs: random, never zeros, the same recipe on host and device.

Floats are N(0, 1); scales lie in [1/80, 1/48] so that codes span most of
the int8 range and a few percent saturate; zero points are small and, for
uint8, centred on 128. Codes for dequantize are uniform over the full range.
"""

from __future__ import annotations

import numpy as np

from .cases import Case


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
    shape = case.shape()
    if case.op == "quantize":
        x = rng.standard_normal(size=shape, dtype=np.float32)
        return x.astype(case.fdtype, copy=False)
    info = np.iinfo(case.qdtype)
    return rng.integers(info.min, info.max + 1, size=shape, dtype=case.qdtype)


def device_input(case: Case, cp, seed: int = 0):
    """The source tensor of ``case`` on the current CUDA device (CuPy)."""
    rs = cp.random.RandomState(seed)
    shape = case.shape()
    if case.op == "quantize":
        return rs.standard_normal(size=shape, dtype=cp.float32).astype(case.fdtype, copy=False)
    info = np.iinfo(case.qdtype)
    return rs.randint(info.min, info.max + 1, size=shape, dtype=np.int32).astype(case.qdtype)


def out_dtype(case: Case):
    """The dtype gpuq writes for ``case``."""
    return np.dtype(case.qdtype if case.op == "quantize" else case.fdtype)


def gpuq_kwargs(case: Case) -> dict:
    """Keyword arguments of ``gpuq.quantize``/``dequantize`` for ``case``."""
    dtype = case.qdtype if case.op == "quantize" else case.fdtype
    return {"axis": case.axis(), "group_size": case.group_size(), "dtype": dtype}
