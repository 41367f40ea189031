"""NVFP4's two-level scales: e2m1 codes, an e4m3 scale per block of 16, a float32 global scale.

compressed-tensors 0.20's rule (its functions are the oracle). D is x's float dtype (float32,
bfloat16, float16); each ``D(...)`` is the float32 operation rounded once to D (as torch computes
bf16/f16 on the CPU); ``amax' = max(amax_tensor, finfo(D).tiny)``::

    gs  = float32(D(D(1 / amax') * 2688))      # 2688 = 448 * 6; float16 overflow: the float32 rule
    gs  = 1.0 if gs is not finite               # all-zero tensors (float32, bfloat16)
    s_b = e4m3_RNE(clamp(gs * float32(D(amax_block / 6)), -448, 448))   # product in float32
    s_b = 0.125 if s_b == 0                     # byte 0x20
    q   = e2m1_RNE_sat(float32(x) / float32(s_b / gs))
    y   = float32(e2m1(q)) * float32(s_b / gs)

Where compressed-tensors differs gpuq does not copy it (README says so): NaN in the tensor (it
sets gs = 1.0; gpuq skips NaN), +-Inf (gpuq raises), float16 tensors whose ``D(1/amax') * 2688``
overflows float16 (it uses gs = 1.0; gpuq the float32 rule ``float32(float32(1/amax') * 2688)``).

>>> import numpy as np, gpuq
>>> gpuq.global_scale(amax=6.0, float_dtype="float32")
np.float32(448.0)
"""

from __future__ import annotations

import contextlib

import numpy as np

from ._mx import _device_round_trip

__all__ = ["global_scale", "nvfp4_scales", "block_scales"]

_F32 = np.dtype(np.float32)
_NVFP4_DTYPES = ("float32", "bfloat16", "float16")


def _round_to(v, dname):
    """float32 ``v`` rounded once to dtype ``dname`` (nearest even) and widened back exactly."""
    if dname == "float32":
        return np.asarray(v, _F32)
    from ._dtypes import bfloat16

    dt = bfloat16() if dname == "bfloat16" else np.dtype(np.float16)
    with np.errstate(over="ignore"):
        return np.asarray(v, _F32).astype(dt).astype(_F32)


def _tiny(dname):
    return np.float32(2.0 ** -14) if dname == "float16" else np.float32(np.finfo(np.float32).tiny)


def _gs_of_amax(amax, dname) -> np.float32:
    a = np.maximum(np.float32(amax), _tiny(dname))
    with np.errstate(over="ignore", divide="ignore"):
        gs = _round_to(_round_to(np.float32(1) / a, dname) * np.float32(2688), dname)
        if dname == "float16" and not np.isfinite(gs):  # gpuq's float32 rule (README)
            gs = np.float32(np.float32(1) / a) * np.float32(2688)
    gs = np.float32(gs)
    return gs if np.isfinite(gs) else np.float32(1.0)


def global_scale(x=None, *, amax=None, float_dtype=None, dtype="float4_e2m1fn"):
    """NVFP4's float32 global scale ``gs`` of ``x`` (or of a given ``amax`` and ``float_dtype``:
    a fused group passes the maximum amax of its tensors), by compressed-tensors 0.20's rule
    (module docstring). NaN is skipped; +-Inf is a ``ValueError``.

    >>> import numpy as np, gpuq
    >>> gpuq.global_scale(np.float32([[0.5, -3.0]])), gpuq.global_scale(np.zeros(4, np.float32))
    (np.float32(896.0), np.float32(1.0))
    """
    from ._codetypes import as_code_type
    from ._dtypes import FLOAT_DTYPES, dtype_name, native

    code = as_code_type(dtype)
    if not code.takes_global_scale:
        raise ValueError(f"dtype must be float4_e2m1fn (NVFP4's element type), got {code.name}")
    if (x is None) == (amax is None):
        raise TypeError("global_scale takes x, or amax= with float_dtype=: exactly one of x and amax")
    if x is not None:
        if float_dtype is not None:
            raise TypeError("float_dtype goes with amax=; with x it is x's dtype")
        from ._dispatch import backend_for
        from ._interop import adapt
        from ._scheme import Scheme

        adapted = adapt(x)  # torch tensors and the other array types, as the public functions read them
        with adapted.context() if adapted.context is not None else contextlib.nullcontext():
            backend, arr = backend_for(adapted.array, "x")
            if native(arr.dtype) not in FLOAT_DTYPES:
                raise TypeError(f"x must be float16, float32, float64 or bfloat16, got {arr.dtype}")
            dname = dtype_name(arr.dtype)
            lo, hi = backend.minmax(arr, Scheme.build(arr.shape, None, None, None))
            lo, hi = (np.asarray(backend_get(v), _F32) for v in (lo, hi))
        if np.isinf(lo) or np.isinf(hi):
            raise ValueError("x must be finite (and within float32) to choose quantization parameters, got +/-inf")
        a = np.fmax(np.fmax(hi, -lo), np.float32(0))
    else:
        if float_dtype is None:
            raise TypeError("amax= needs float_dtype= (the weights' dtype: float32, bfloat16 or float16)")
        dname = dtype_name(float_dtype)
        a = np.float32(amax)
        if not (np.isfinite(a) and a >= 0):
            raise ValueError(f"amax must be finite and >= 0 as a float32, got {amax!r}")
    if dname == "float64":
        dname = "float32"  # amax rounded to float32 once: the float32 rule
    if dname not in _NVFP4_DTYPES:
        raise TypeError(f"float_dtype must be one of {', '.join(_NVFP4_DTYPES)}, got {dname}")
    return _gs_of_amax(a, dname)


def backend_get(v):
    """A parameter-sized value on the host (a CuPy value copied back)."""
    get = getattr(v, "get", None)
    return get() if callable(get) and not isinstance(v, np.ndarray) else v


@_device_round_trip
def nvfp4_scales(lo, hi, gs, dname):
    """The e4m3 block scales ``s_b`` (float32 holding e4m3 values) from each block's min/max."""
    from .backends.host.formats import fp8_bits, fp8_table

    if dname == "float64":
        dname = "float32"
    lo32, hi32 = lo.astype(_F32), hi.astype(_F32)
    amax = np.fmax(np.fmax(hi32, -lo32), np.float32(0))
    if bool(np.isinf(amax).any()):
        raise ValueError("x must be finite (and within float32) to choose quantization parameters, got +/-inf")
    t = np.minimum(np.float32(gs) * _round_to(amax / np.float32(6), dname), np.float32(448)).astype(_F32)
    bits = np.empty(t.shape, np.uint8)
    fp8_bits(np.ascontiguousarray(t), "e4m3fn", True, bits)
    s = fp8_table("e4m3fn", _F32)[bits]
    return np.where(s == 0, np.float32(0.125), s).astype(_F32)


def check_global_scale(gs) -> np.float32:
    """``global_scale`` as a float32, finite and > 0."""
    if isinstance(gs, bool) or not np.ndim(gs) == 0 and np.size(gs) != 1:
        raise TypeError(f"global_scale must be a number (float32), got {gs!r}")
    try:
        with np.errstate(over="ignore"):
            g = np.float32(np.asarray(backend_get(gs)).reshape(()))
    except (TypeError, ValueError):
        raise TypeError(f"global_scale must be a number (float32), got {gs!r}") from None
    if not (np.isfinite(g) and g > 0):
        raise ValueError(f"global_scale must be finite and > 0 as a float32, got {gs!r}")
    return g


def block_scales(s, gs):
    """``float32(s_b / gs)``: the scale :func:`gpuq.quantize` and :func:`gpuq.dequantize` use with
    ``global_scale`` (``s`` float32 on its device, ``gs`` a float32)."""
    return (s.astype(_F32) / np.float32(gs)).astype(_F32)
