"""OCP MX power-of-two scales (``scale_dtype="float8_e8m0fnu"``, ``scale_rule``) and the e8m0
byte conversions, against compressed-tensors 0.20 (MXFP4, MXFP6-e2m3, MXFP8-e4m3: scale bytes
and codes, float32 and bfloat16 weights) and a naive statement of each rule in Python integers
(``math.frexp``), on every backend.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import gpuq

ml_dtypes = pytest.importorskip("ml_dtypes", minversion="0.5")

RNG = np.random.default_rng(3737)
MX_CODES = ("float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn", "float8_e4m3fn", "float8_e5m2")
E8M0 = "float8_e8m0fnu"


def _naive_k(amax: float, code: str, rule: str) -> int:
    """The issue's table, one block at a time in exact arithmetic (Python floats hold float32)."""
    emax = {"float4_e2m1fn": 2, "float6_e2m3fn": 2, "float6_e3m2fn": 4, "float8_e4m3fn": 8, "float8_e5m2": 15}[code]
    m = {"float4_e2m1fn": 1, "float8_e4m3fn": 1, "float6_e2m3fn": 3, "float6_e3m2fn": 2, "float8_e5m2": 2}[code]
    top = {"float4_e2m1fn": 6.0, "float6_e2m3fn": 7.5, "float6_e3m2fn": 28.0, "float8_e4m3fn": 448.0,
           "float8_e5m2": 57344.0}[code]
    if amax == 0:
        return -127
    mant, ex = math.frexp(amax)
    e, f = ex - 1, 2 * mant - 1
    if rule == "floor":
        k = e - emax
    elif rule == "even":
        k = e + (f >= 1 - 2.0 ** -(m + 1)) - emax
    elif rule == "ceil":
        k = math.ceil(math.log2(amax)) if f else e
        k -= emax
    else:
        r = float(np.float32(np.float32(amax) / np.float32(top)))
        if r == 0:  # log2(0) = -inf
            return -127
        mq, eq = math.frexp(r)
        k = eq - 1 + (mq != 0.5)
    return min(max(k, -127), 127)


def _amax_grid():
    """Block maxima at and around every rule's threshold, powers of two, subnormals, 0."""
    vals = [0.0, 2.0 ** -149, 2.0 ** -127, 2.0 ** -126, 1e-38, 3.4e38, 2.0 ** 127]
    for k in (-130, -20, -3, 0, 1, 5, 9, 16, 100):
        for one_f in (1.0, 1.5, 1.75, 1.875, 1.9375, 1.96875, 1.5 + 2 ** -23, 2 - 2 ** -23):
            v = np.float32(one_f * 2.0 ** k)
            vals += [float(v), float(np.nextafter(v, np.float32(0))), float(np.nextafter(v, np.float32(np.inf)))]
    for top in (6.0, 7.5, 28.0, 448.0, 57344.0):
        for k in (-10, 0, 3):
            v = np.float32(top * 2.0 ** k)
            vals += [float(v), float(np.nextafter(v, np.float32(0))), float(np.nextafter(v, np.float32(np.inf)))]
    return np.float32(vals)


@pytest.mark.parametrize("code", MX_CODES)
@pytest.mark.parametrize("rule", ["floor", "even", "ceil", "rceil"])
def test_each_rule_against_its_statement(backend, code, rule):
    amax = _amax_grid()
    x = np.zeros((amax.size, 32), np.float32)
    x[:, 5] = amax
    x[:, 7] = -amax / 3
    x[::2, 9] = np.nan  # skipped
    s, z = gpuq.choose_qparams(backend.put(x), axis=1, group_size=32, dtype=code, scale_dtype=E8M0,
                               scale_rule=rule)
    assert z is None
    got = backend.get(s).reshape(-1)
    want = np.float32([2.0 ** _naive_k(float(a), code, rule) for a in amax])
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    assert got.dtype == np.float32
    q, s2, z2 = gpuq.quantize_dynamic(backend.put(x), axis=1, group_size=32, dtype=code, scale_dtype=E8M0,
                                      scale_rule=rule)
    np.testing.assert_array_equal(backend.get(s2), backend.get(s))
    assert z2 is None
    qq = gpuq.quantize(backend.put(x), s, axis=1, group_size=32, dtype=code)
    a, b = (q.data, qq.data) if isinstance(q, gpuq.Codes) else (q, qq)
    np.testing.assert_array_equal(backend.get(a).view(np.uint8), backend.get(b).view(np.uint8))


def test_default_rule_is_even_and_other_schemes():
    x = (RNG.standard_normal((6, 40)) * 3).astype(np.float32)
    s_even, _ = gpuq.choose_qparams(x, axis=0, dtype="float4_e2m1fn", scale_dtype=E8M0, scale_rule="even")
    s_def, _ = gpuq.choose_qparams(x, axis=0, dtype="float4_e2m1fn", scale_dtype=E8M0)
    np.testing.assert_array_equal(s_def, s_even)
    amax = np.abs(x).max(1)
    np.testing.assert_array_equal(s_def, np.float32([2.0 ** _naive_k(float(a), "float4_e2m1fn", "even") for a in amax]))
    s_t, _ = gpuq.choose_qparams(x, dtype="float8_e4m3fn", scale_dtype=E8M0, scale_rule="floor")
    assert s_t.shape == () and float(s_t) == 2.0 ** _naive_k(float(np.abs(x).max()), "float8_e4m3fn", "floor")
    x64 = x.astype(np.float64) * (1 + 2.0 ** -40)  # float64 amax rounded to float32 first
    s64, _ = gpuq.choose_qparams(x64, block_size=(2, 32), dtype="float6_e3m2fn", scale_dtype=E8M0)
    want = [[2.0 ** _naive_k(float(np.float32(np.abs(x64[i:i + 2, j:j + 32]).max())), "float6_e3m2fn", "even")
             for j in (0, 32)] for i in (0, 2, 4)]
    np.testing.assert_array_equal(s64, np.float32(want))


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(dtype="int4"), ValueError, "applies to float codes \\(fp4, fp6, fp8\\), got int4 codes"),
    (dict(eps=1e-3), ValueError, "eps does not apply to scale_dtype='float8_e8m0fnu'"),
    (dict(method="mse"), ValueError, "method='mse' with scale_dtype='float8_e8m0fnu' is not supported"),
    (dict(scale_rule="nearest"), ValueError,
     "scale_rule must be one of 'floor', 'even', 'ceil', 'rceil' with scale_dtype='float8_e8m0fnu', got 'nearest'"),
    (dict(scale_dtype="float32", scale_rule="even"), ValueError,
     "scale_rule applies to scale_dtype='float8_e8m0fnu' \\(MX scales\\) only"),
])
def test_refusals(kwargs, exc, match):
    args = dict(axis=1, group_size=32, dtype="float4_e2m1fn", scale_dtype=E8M0) | kwargs
    x = np.ones((2, 32), np.float32)
    with pytest.raises(exc, match=match):
        gpuq.choose_qparams(x, **args)
    if "eps" not in kwargs:
        with pytest.raises(exc, match=match):
            gpuq.quantize_dynamic(x, **args)


def test_infinity_is_refused(backend):
    x = np.ones((2, 32), np.float32)
    x[1, 4] = -np.inf
    with pytest.raises(ValueError, match="x must be finite"):
        gpuq.choose_qparams(backend.put(x), axis=1, group_size=32, dtype="float4_e2m1fn", scale_dtype=E8M0)


def test_e8m0_bytes_and_scales():
    b = np.arange(256, dtype=np.uint8)
    s = gpuq.e8m0_scales(b)
    assert s.dtype == np.float32
    want = np.float32([2.0 ** (i - 127) for i in range(255)] + [np.nan])
    np.testing.assert_array_equal(s.view(np.uint32)[:255], want.view(np.uint32)[:255])
    assert np.isnan(s[255])
    np.testing.assert_array_equal(gpuq.e8m0_bytes(s), b)
    # ml_dtypes' decoding agrees, and its dtype is taken
    np.testing.assert_array_equal(b.view(ml_dtypes.float8_e8m0fnu).astype(np.float32)[:255], s[:255])
    np.testing.assert_array_equal(gpuq.e8m0_scales(b.view(ml_dtypes.float8_e8m0fnu))[:255], s[:255])
    for bad in (3.0, 0.0, -1.0, np.inf, 2.0 ** -128, 2.0 ** -149):
        with pytest.raises(ValueError, match="scales must be powers of two"):
            gpuq.e8m0_bytes(np.float32([1.0, bad]))
    with pytest.raises(TypeError, match="data must be a uint8"):
        gpuq.e8m0_scales(np.int8([1]))
    with pytest.raises(TypeError, match="scales must be a float array"):
        gpuq.e8m0_bytes(np.uint8([1]))
    with pytest.raises(ValueError, match="scales must be finite and > 0"):
        gpuq.dequantize(np.int8([1]).view(ml_dtypes.float8_e4m3fn), gpuq.e8m0_scales(np.uint8([255])))


# --- compressed-tensors 0.20 (the bytes llm-compressor writes and vLLM serves) ------------------------

def _ct():
    pytest.importorskip("compressed_tensors")
    torch = pytest.importorskip("torch")
    from compressed_tensors.compressors import (MXFP4PackedCompressor, MXFP6PackedCompressor,
                                                MXFP8QuantizationCompressor)
    from compressed_tensors.quantization import QuantizationScheme
    from compressed_tensors.quantization.quant_scheme import MXFP4A16, MXFP6A16, MXFP8A16
    from compressed_tensors.quantization.utils.helpers import calculate_qparams

    presets = {"float4_e2m1fn": (MXFP4A16, MXFP4PackedCompressor), "float6_e2m3fn": (MXFP6A16, MXFP6PackedCompressor),
               "float8_e4m3fn": (MXFP8A16, MXFP8QuantizationCompressor)}
    return torch, QuantizationScheme, calculate_qparams, presets


def _fp6_packed(codes):
    """compressed-tensors' MXFP6 packing: four codes c0 | c1<<6 | c2<<12 | c3<<18, 3 bytes LE."""
    u = codes.reshape(codes.shape[0], -1, 4).astype(np.uint32)
    w = u[..., 0] | (u[..., 1] << 6) | (u[..., 2] << 12) | (u[..., 3] << 18)
    return np.stack([w & 0xFF, (w >> 8) & 0xFF, w >> 16], -1).astype(np.uint8).reshape(codes.shape[0], -1)


@pytest.mark.parametrize("code", ["float4_e2m1fn", "float6_e2m3fn", "float8_e4m3fn"])
@pytest.mark.parametrize("wdtype", ["float32", "bfloat16"])
def test_even_equals_compressed_tensors(code, wdtype):
    torch, QuantizationScheme, calculate_qparams, presets = _ct()
    preset, compressor = presets[code]
    g = torch.Generator().manual_seed(7)
    W = torch.randn(24, 160, generator=g) * 3
    W[0, :32] = 0  # an all-zero block: byte 0
    W[1, 32:64] *= 1e-30
    W[2] = torch.tensor([1.75, 7.0, 1.5, 6.0, 448 * 1.75, 3.5, 0.4375, 28.0]).repeat(20)  # thresholds, ties
    W = W.to(getattr(torch, wdtype))
    sch = QuantizationScheme(targets=["Linear"], **preset)
    Wg = W.reshape(W.shape[0], -1, 32)
    s, _ = calculate_qparams(Wg.amin(-1), Wg.amax(-1), sch.weights)
    out = compressor.compress({"weight": W, "weight_scale": s.to(W.dtype)}, sch)
    x = W.numpy() if wdtype == "float32" else W.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    q, scales, _ = gpuq.quantize_dynamic(x, axis=1, group_size=32, dtype=code, scale_dtype=E8M0)
    np.testing.assert_array_equal(gpuq.e8m0_bytes(scales), out["weight_scale"].numpy())
    if code == "float4_e2m1fn":
        np.testing.assert_array_equal(q.data.reshape(24, 80), out["weight_packed"].numpy())
    elif code == "float6_e2m3fn":
        np.testing.assert_array_equal(_fp6_packed(q.view(np.uint8)), out["weight_packed"].numpy())
    else:
        np.testing.assert_array_equal(q.view(np.uint8), out["weight"].view(torch.uint8).numpy())


def test_dask_as_in_memory():
    da = pytest.importorskip("dask.array")
    x = (RNG.standard_normal((8, 96)) * 3).astype(np.float32)
    for chunks, kw in (((4, 32), dict(axis=1, group_size=32)), ((3, 40), dict(axis=0))):
        d = da.from_array(x, chunks=chunks)
        q, s, z = gpuq.quantize_dynamic(d, dtype="float6_e3m2fn", scale_dtype=E8M0, scale_rule="rceil", **kw)
        wq, ws, _ = gpuq.quantize_dynamic(x, dtype="float6_e3m2fn", scale_dtype=E8M0, scale_rule="rceil", **kw)
        assert z is None
        np.testing.assert_array_equal(s.compute(), ws)
        np.testing.assert_array_equal(q.compute().view(np.uint8), wq.view(np.uint8))
