"""NVFP4's two-level scales (``gpuq.global_scale``, ``scale_dtype="float8_e4m3fn"`` with
``global_scale=``) against compressed-tensors 0.20 (``generate_gparam``, ``calculate_qparams``,
``NVFP4PackedCompressor``): global scale, e4m3 scale bytes and packed codes for float32, bfloat16
and float16 weights, all-zero blocks and tensors; the documented differences as documented.
"""

from __future__ import annotations

import numpy as np
import pytest

import gpuq

ml_dtypes = pytest.importorskip("ml_dtypes", minversion="0.5")
E4M3 = "float8_e4m3fn"


def _ct():
    pytest.importorskip("compressed_tensors")
    torch = pytest.importorskip("torch")
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.quantization import QuantizationScheme
    from compressed_tensors.quantization.quant_scheme import NVFP4A16
    from compressed_tensors.quantization.utils.helpers import calculate_qparams, generate_gparam

    sch = QuantizationScheme(targets=["Linear"], **NVFP4A16)

    def compress(W):
        gs = generate_gparam(W.min(), W.max())
        Wg = W.reshape(W.shape[0], -1, 16)
        s, _ = calculate_qparams(Wg.amin(-1), Wg.amax(-1), sch.weights, global_scale=gs)
        data = {"weight": W, "weight_scale": s.to(W.dtype), "weight_global_scale": gs}
        out = NVFP4PackedCompressor.compress(data, sch)
        return gs, out, NVFP4PackedCompressor.decompress(out, sch)["weight"]

    return torch, compress


def _numpy_of(torch, W):
    return W.view(torch.int16).numpy().view(ml_dtypes.bfloat16) if W.dtype == torch.bfloat16 else W.numpy()


@pytest.mark.parametrize("wdtype", ["float32", "bfloat16", "float16"])
def test_equals_compressed_tensors(wdtype):
    torch, compress = _ct()
    g = torch.Generator().manual_seed(16)
    for trial, mag in enumerate((0.5, 3.0, 40.0, 1e3)):
        W = (torch.randn(12, 96, generator=g) * mag)
        W[0, :16] = 0  # an all-zero block: scale byte 0x20 (0.125)
        W[1, 16:32] *= 1e-4
        W = W.to(getattr(torch, wdtype))
        gs, out, restored = compress(W)
        x = _numpy_of(torch, W)
        before = x.copy()
        gg = gpuq.global_scale(x)
        assert gg.dtype == np.float32 and float(gg) == float(gs), (trial, gg, gs)
        sb, z = gpuq.choose_qparams(x, axis=1, group_size=16, dtype="float4_e2m1fn", scale_dtype=E4M3, global_scale=gg)
        assert z is None and sb.dtype == np.float32
        np.testing.assert_array_equal(sb.astype(ml_dtypes.float8_e4m3fn).view(np.uint8),
                                      out["weight_scale"].view(torch.uint8).numpy())
        q, sb2, _ = gpuq.quantize_dynamic(x, axis=1, group_size=16, dtype="float4_e2m1fn", scale_dtype=E4M3,
                                          global_scale=gg)
        np.testing.assert_array_equal(sb2, sb)
        np.testing.assert_array_equal(q.data.reshape(12, 48), out["weight_packed"].numpy())
        # given the block scales and gs, quantize gives the same codes as with float32(s_b / gs)
        q2 = gpuq.quantize(x, sb, axis=1, group_size=16, dtype="float4_e2m1fn", global_scale=gg)
        q3 = gpuq.quantize(x, (sb / gg).astype(np.float32), axis=1, group_size=16, dtype="float4_e2m1fn")
        np.testing.assert_array_equal(q2.data, q.data)
        np.testing.assert_array_equal(q3.data, q.data)
        y = gpuq.dequantize(q, sb, axis=1, group_size=16, global_scale=gg, dtype="bfloat16")
        np.testing.assert_array_equal(y.view(np.uint16), restored.view(torch.int16).numpy().view(np.uint16))
        np.testing.assert_array_equal(x.view(np.uint8), before.view(np.uint8))


def test_all_zero_tensors_and_the_float16_difference():
    torch, compress = _ct()
    for wdtype in ("float32", "bfloat16"):
        W = torch.zeros(2, 32, dtype=getattr(torch, wdtype))
        gs, out, _ = compress(W)
        assert float(gs) == 1.0 == float(gpuq.global_scale(_numpy_of(torch, W)))
    # float16 with amax below ~0.041: compressed-tensors' 2688 / amax overflows float16 and it uses
    # gs = 1.0; gpuq computes gs by the float32 rule (README); the scale bytes then differ.
    W = (torch.full((1, 16), 0.01)).to(torch.float16)
    gs, out, _ = compress(W)
    assert float(gs) == 1.0
    gg = gpuq.global_scale(W.numpy())
    assert float(gg) == float(np.float32(np.float32(1) / np.float32(np.float16(0.01))) * np.float32(2688))


def test_global_scale_of_amax_and_fused_groups():
    a = np.float32([[0.5, -3.0]])
    b = np.float32([[7.0, 1.0]])
    fused = gpuq.global_scale(amax=max(np.abs(a).max(), np.abs(b).max()), float_dtype="float32")
    assert fused == gpuq.global_scale(np.concatenate([a, b], 1))
    x = np.float32([1.0, np.nan, -2.0])  # NaN skipped (compressed-tensors: gs = 1.0)
    assert gpuq.global_scale(x) == gpuq.global_scale(np.float32([1.0, -2.0]))
    assert gpuq.global_scale(np.float64([2.0])) == gpuq.global_scale(np.float32([2.0]))


@pytest.mark.parametrize("call, exc, match", [
    (lambda: gpuq.global_scale(np.float32([1.0, np.inf])), ValueError, "x must be finite"),
    (lambda: gpuq.global_scale(), TypeError, "exactly one of x and amax"),
    (lambda: gpuq.global_scale(amax=1.0), TypeError, "amax= needs float_dtype="),
    (lambda: gpuq.global_scale(amax=-1.0, float_dtype="float32"), ValueError, "amax must be finite and >= 0"),
    (lambda: gpuq.global_scale(np.ones(2, np.float32), dtype="int4"), ValueError, "dtype must be float4_e2m1fn"),
    (lambda: gpuq.choose_qparams(np.ones((2, 16), np.float32), axis=1, group_size=16, dtype="float4_e2m1fn",
                                 scale_dtype=E4M3), ValueError, "global_scale goes with scale_dtype='float8_e4m3fn'"),
    (lambda: gpuq.choose_qparams(np.ones((2, 16), np.float32), axis=1, group_size=16, dtype="float4_e2m1fn",
                                 global_scale=1.0), ValueError, "global_scale goes with scale_dtype='float8_e4m3fn'"),
    (lambda: gpuq.choose_qparams(np.ones((2, 16), np.float32), axis=1, group_size=16, dtype="float8_e4m3fn",
                                 scale_dtype=E4M3, global_scale=1.0), ValueError, "takes float4_e2m1fn codes"),
    (lambda: gpuq.quantize(np.ones(4, np.float32), 1.0, dtype="int4", global_scale=2.0), ValueError,
     "global_scale applies to float4_e2m1fn codes"),
    (lambda: gpuq.quantize(np.ones(4, np.float32), 1.0, dtype="float4_e2m1fn", global_scale=0.0), ValueError,
     "global_scale must be finite and > 0"),
])
def test_refusals(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_device_as_host(backend):
    x = (np.random.default_rng(4).standard_normal((6, 48)) * 5).astype(np.float32)
    gg = gpuq.global_scale(backend.put(x))
    assert gg == gpuq.global_scale(x)
    q, sb, _ = gpuq.quantize_dynamic(backend.put(x), axis=1, group_size=16, dtype="float4_e2m1fn",
                                     scale_dtype=E4M3, global_scale=gg)
    wq, wsb, _ = gpuq.quantize_dynamic(x, axis=1, group_size=16, dtype="float4_e2m1fn", scale_dtype=E4M3,
                                       global_scale=gg)
    np.testing.assert_array_equal(backend.get(sb), wsb)
    np.testing.assert_array_equal(backend.get(q.data), wq.data)
    y = gpuq.dequantize(q, sb, axis=1, group_size=16, global_scale=gg)
    np.testing.assert_array_equal(backend.get(y), gpuq.dequantize(wq, wsb, axis=1, group_size=16, global_scale=gg))
