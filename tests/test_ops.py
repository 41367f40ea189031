"""The spec op objects: attributes, defaults, input order, every dtype combination of ../shared/spec/."""

from __future__ import annotations

import numpy as np
import pytest

import gpuq
import reference as ref

RNG = np.random.default_rng(3)
X = RNG.normal(0, 50, size=(2, 3, 5)).astype(np.float32)


def _eq(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got.view(f"u{got.itemsize}"), want.view(f"u{want.itemsize}"))


@pytest.mark.parametrize("dtype", ["s8", "u8"])
@pytest.mark.parametrize("zps_type", ["s8", "u8", "s32", None])
def test_dynamic_quantize_spec_table(backend, dtype, zps_type):
    # DynamicQuantize: src f32, scales f32, zps s8/u8/s32 (optional), dst s8/u8.
    scales = np.float32([0.5])
    zps = None if zps_type is None else np.array([7], {"s8": np.int8, "u8": np.uint8, "s32": np.int32}[zps_type])
    op = gpuq.DynamicQuantize(dtype=dtype)
    got = backend.get(op(backend.put(X), scales, zps))
    _eq(got, ref.quantize(X, 0.5, None if zps is None else 7, dtype=np.dtype({"s8": "int8", "u8": "uint8"}[dtype])))


@pytest.mark.parametrize("src_type", ["s8", "u8"])
@pytest.mark.parametrize("zps_type", ["s8", "u8", "s32", None])
def test_dynamic_dequantize_spec_table(backend, src_type, zps_type):
    q = RNG.integers(0, 120, size=(2, 3, 5)).astype({"s8": np.int8, "u8": np.uint8}[src_type])
    zps = None if zps_type is None else np.array([5], {"s8": np.int8, "u8": np.uint8, "s32": np.int32}[zps_type])
    got = backend.get(gpuq.DynamicDequantize()(backend.put(q), np.float32([0.25]), zps))
    _eq(got, ref.dequantize(q, 0.25, None if zps is None else 5))


def test_defaults_are_the_specs():
    for op in (gpuq.DynamicQuantize(), gpuq.DynamicDequantize()):
        assert op.qtype == "per_tensor" and op.axis == 1
    assert gpuq.DynamicQuantize().dtype == np.int8
    q = gpuq.Quantize(scales=[1.0], zps=[0])
    assert q.qtype == "per_tensor" and q.axis == 1 and q.dtype == np.int8
    assert gpuq.Dequantize(scales=[1.0], zps=[0]).dtype == np.float32


def test_per_channel_default_axis_is_1(backend):
    scales = np.float32([0.5, 1.0, 2.0])
    zps = np.int32([1, 2, 3])
    got = backend.get(gpuq.DynamicQuantize(qtype="per_channel")(backend.put(X), scales, zps))
    _eq(got, ref.quantize(X, scales, zps, axis=1))
    q = got
    back = backend.get(gpuq.DynamicDequantize(qtype="per_channel")(backend.put(q), scales, zps))
    _eq(back, ref.dequantize(q, scales, zps, axis=1))


@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3])
def test_static_ops_per_channel(backend, axis):
    n = X.shape[axis]
    scales = [0.25 * (i + 1) for i in range(n)]
    zps = [i - 2 for i in range(n)]
    qop = gpuq.Quantize(scales=scales, zps=zps, qtype="per_channel", axis=axis, dtype="s8")
    q = backend.get(qop(backend.put(X)))
    _eq(q, ref.quantize(X, np.float32(scales), zps, axis=axis))
    dop = gpuq.Dequantize(scales=scales, zps=zps, qtype="per_channel", axis=axis)
    _eq(backend.get(dop(backend.put(q))), ref.dequantize(q, np.float32(scales), zps, axis=axis))


def test_static_ops_per_tensor_u8(backend):
    qop = gpuq.Quantize(scales=[0.1], zps=[128], dtype="u8")
    q = backend.get(qop(backend.put(X)))
    _eq(q, ref.quantize(X, np.float32(0.1), 128, dtype=np.uint8))
    y = backend.get(gpuq.Dequantize(scales=[0.1], zps=[128])(backend.put(q)))
    _eq(y, ref.dequantize(q, np.float32(0.1), 128))


def test_static_zps_are_s64_lists_that_fit_int32(backend):
    q = backend.get(gpuq.Quantize(scales=[1.0], zps=[2**31 - 1])(backend.put(X)))
    _eq(q, ref.quantize(X, 1.0, 2**31 - 1))
    with pytest.raises(ValueError, match=r"zps must fit int32"):
        gpuq.Quantize(scales=[1.0], zps=[2**31])


def test_op_output_dtypes_beyond_the_spec(backend):
    q = gpuq.quantize(backend.put(X), 0.5)
    y = backend.get(gpuq.DynamicDequantize(dtype="f16")(q, np.float32([0.5])))
    _eq(y, ref.dequantize(backend.get(q), 0.5, dtype=np.float16))
    y = backend.get(gpuq.Dequantize(scales=[0.5], dtype="float64")(q))
    _eq(y, ref.dequantize(backend.get(q), 0.5, dtype=np.float64))


def test_static_op_validates_at_construction():
    with pytest.raises(ValueError, match=r"qtype must be one of per_tensor, per_channel, got 'per_row'"):
        gpuq.Quantize(scales=[1.0], qtype="per_row")
    with pytest.raises(ValueError, match=r"scales must have exactly 1 element for qtype='per_tensor', got 2"):
        gpuq.Quantize(scales=[1.0, 2.0])
    with pytest.raises(ValueError, match=r"scales must be finite and > 0"):
        gpuq.Dequantize(scales=[1.0, 0.0], qtype="per_channel")
    with pytest.raises(ValueError, match=r"zps must have 2 elements like scales, got shape \(1,\)"):
        gpuq.Quantize(scales=[1.0, 2.0], zps=[1], qtype="per_channel")
    with pytest.raises(TypeError, match=r"zps must be integers"):
        gpuq.Quantize(scales=[1.0], zps=[0.5])
    with pytest.raises(ValueError, match=r"dtype must be one of int8, uint8, int4, uint4, float8_e4m3fn, float8_e5m2, float4_e2m1fn, float6_e2m3fn, float6_e3m2fn, got unknown name 'int7'"):
        gpuq.Quantize(scales=[1.0], dtype="int7")
    with pytest.raises(TypeError, match=r"axis must be an integer"):
        gpuq.DynamicQuantize(qtype="per_channel", axis="1")


def test_static_op_checks_channels_at_call(backend):
    op = gpuq.Quantize(scales=[1.0, 2.0], qtype="per_channel", axis=1)
    with pytest.raises(ValueError, match=r"scales must have 3 elements for axis=1 of shape \(2, 3, 5\), got 2"):
        op(backend.put(X))


def test_op_out_argument(backend):
    out = backend.put(np.empty(X.shape, np.uint8))
    res = gpuq.DynamicQuantize(dtype="u8")(backend.put(X), np.float32([1.0]), np.uint8([100]), out=out)
    assert res is out
    _eq(backend.get(out), ref.quantize(X, 1.0, 100, dtype=np.uint8))


def test_static_op_keeps_its_own_copy_of_scales_and_zps(backend):
    """Changing the caller's arrays after construction changes nothing (and skips no check)."""
    scales, zps = np.array([0.5, 2.0], np.float32), np.array([3, -4], np.int32)
    q_op = gpuq.Quantize(scales, zps, qtype="per_channel", axis=1)
    d_op = gpuq.Dequantize(scales, zps, qtype="per_channel", axis=1)
    x = RNG.normal(0, 20, (5, 2)).astype(np.float32)
    want_q = ref.quantize(x, [0.5, 2.0], [3, -4], axis=1)
    scales[:], zps[:] = -1.0, 10**6
    q = backend.get(q_op(backend.put(x)))
    np.testing.assert_array_equal(q, want_q)
    np.testing.assert_array_equal(backend.get(d_op(backend.put(q))),
                                  ref.dequantize(want_q, [0.5, 2.0], [3, -4], axis=1))
