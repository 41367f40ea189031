"""Benchmark inputs: random, never zeros, the same recipe on host and device.

Floats are N(0, 1); scales lie in [1/80, 1/48] so that codes span most of
the int8 range and a few percent saturate; zero points are small and, for
uint8, centred on 128. Codes for dequantize are uniform over the full range.

Issue 19's code types (``cases.FORMAT_TYPES``): int4/uint4 scales lie in
[0.33, 0.45] (about amax / 7 of a group of 128 normals: codes span the int4
range, a few percent saturate), zps in [-1, 1] (int4) or [7, 9] (uint4);
fp8 e4m3fn scales lie in [1/64, 1/48], so ``|x / s|`` stays below ~400 < 448
even at 256M elements: nothing saturates, and a non-saturating cast (ml_dtypes',
torch's ``.to``) must give the same bits as gpuq's saturating one. Dequantize
inputs: uniform packed bytes (every nibble valid) for int4, uniform fp8 bytes
without the NaN patterns for fp8. These cases compare every output as bits
(:func:`as_bits`): codes as their bytes (int4 packed), floats as unsigned
integers of their width, so -0.0 against 0.0 counts as a mismatch.
"""

from __future__ import annotations

import numpy as np

from .cases import DYNAMIC_OPS, FP8_TYPES, INT4_TYPES, Case

#: fp8 bit patterns that are NaN (e4m3fn: S.1111.111; e5m2: S.11111.xx with xx != 0; Inf kept).
FP8_NAN = {"float8_e4m3fn": (0x7F, 0xFF), "float8_e5m2": (0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF)}


def fp8_dtype(name: str) -> np.dtype:
    """ml_dtypes' NumPy dtype for an fp8 code type name."""
    import ml_dtypes

    return np.dtype(getattr(ml_dtypes, name))


def host_params(case: Case, seed: int = 1):
    """``(scales, zps)`` as NumPy arrays of ``case.param_shape()`` (zps ``None`` when symmetric)."""
    rng = np.random.default_rng(seed)
    pshape = case.param_shape()
    lo_s, hi_s = {"int4": (0.33, 0.45), "uint4": (0.33, 0.45), "float8_e4m3fn": (1 / 64, 1 / 48),
                  "float8_e5m2": (1 / 64, 1 / 48)}.get(case.qdtype, (1 / 80, 1 / 48))
    scales = rng.uniform(lo_s, hi_s, size=pshape).astype(np.float32)
    if not case.zps:
        return scales, None
    if case.qdtype in FP8_TYPES:
        raise ValueError("fp8 has no zero point (ONNX): fp8 cases are zps=False")
    lo, hi = {"int8": (-8, 9), "uint8": (120, 137), "int4": (-1, 2), "uint4": (7, 10)}[case.qdtype]
    zps = rng.integers(lo, hi, size=pshape).astype(np.int32)
    return scales, zps


def host_input(case: Case, seed: int = 0) -> np.ndarray:
    """The source tensor of ``case`` (floats for quantize, codes for dequantize)."""
    rng = np.random.default_rng(seed)
    size = case.numel() + case.offset
    if case.op == "dequantize" and case.is_format:
        return _format_codes(case, rng)
    if case.op != "dequantize":
        x = rng.standard_normal(size=size, dtype=np.float32).astype(case.float_dtype, copy=False)
    else:
        info = np.iinfo(case.qdtype)
        x = rng.integers(info.min, info.max + 1, size=size, dtype=case.qdtype)
    return _placed(x, case)


def _format_codes(case: Case, rng):
    """Dequantize input of an issue-19 case: a ``gpuq.Codes`` of packed bytes (int4/uint4) or an
    ml_dtypes fp8 array (fp8 bytes without NaN)."""
    import gpuq

    if case.offset:
        raise ValueError("offset views are not wired for int4/fp8 codes")
    if case.qdtype in INT4_TYPES:
        data = rng.integers(0, 256, size=case.code_nbytes(), dtype=np.uint8)
        if case.numel() % 2:
            data[-1] &= 0x0F  # an odd count pads the last high nibble with 0
        return gpuq.Codes(data, case.shape(), case.qdtype)
    bits = rng.integers(0, 256, size=case.numel(), dtype=np.uint8)
    for nan in FP8_NAN[case.qdtype]:
        bits[bits == nan] = 0x38 if nan < 0x80 else 0xB8  # +-1.0 in e4m3fn, +-0.5625 in e5m2
    return bits.view(fp8_dtype(case.qdtype)).reshape(case.shape())


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
    """The dtype gpuq writes for ``case`` (fp8: ml_dtypes'; int4/uint4: packed uint8 bytes)."""
    if case.op == "dequantize":
        return case.float_dtype
    if case.qdtype in FP8_TYPES:
        return fp8_dtype(case.qdtype)
    return np.dtype(np.uint8) if case.qdtype in INT4_TYPES else np.dtype(case.qdtype)


def input_dtype(case: Case):
    """The dtype of the tensor ``case`` reads (int4/uint4 codes: uint8, half as many)."""
    if case.op != "dequantize":
        return case.float_dtype
    return np.dtype(np.uint8) if case.is_format else np.dtype(case.qdtype)


def host_out(case: Case, shape):
    """A preallocated, pre-faulted host ``out=`` for gpuq (a ``gpuq.Codes`` for int4/uint4)."""
    if case.op == "quantize" and case.qdtype in INT4_TYPES:
        import gpuq

        return gpuq.Codes(np.ones(case.code_nbytes(), np.uint8), case.shape(), case.qdtype)
    out = np.empty(shape, out_dtype(case))
    out.view(np.uint8)[...] = 1  # fault the pages in once: that is the point of out=
    return out


def as_bits(result, to_host=np.asarray) -> np.ndarray:
    """An issue-19 output as its bits on the host: ``gpuq.Codes`` -> its bytes (packed for int4),
    fp8 arrays (ml_dtypes, torch) -> uint8, floats -> unsigned ints of their width."""
    if type(result).__name__ == "Codes":
        result = result.data
    dt = getattr(result, "dtype", None)
    if dt is not None and "float8" in str(dt) and hasattr(result, "view") and not isinstance(result, np.ndarray):
        import torch  # a torch fp8 tensor: NumPy has no type for it; its bytes as uint8

        result = result.view(torch.uint8)
    a = np.asarray(to_host(result))
    if a.dtype.kind in "ui" and a.dtype.itemsize == 1:
        return a.view(np.uint8)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


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
    if case.is_format:
        return as_bits(result, to_host)
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
    return as_parts(case, gpuq_fn(case)(x, scales, zps, **gpuq_kwargs(case)), to_host)


def _as_dynamic(case):
    from dataclasses import replace

    return replace(case, op="dynamic")


def host_params_for(case: Case, seed: int = 1):
    """``host_params`` for quantize/dequantize; ``(None, None)`` where gpuq computes them."""
    if case.op in DYNAMIC_OPS:
        return None, None
    return host_params(case, seed)
