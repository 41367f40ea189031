"""fp4 (float4_e2m1fn, packed two per byte) and fp6 (float6_e2m3fn, float6_e3m2fn) codes with
float32 scales, against independent references: ml_dtypes' round-to-nearest-even saturating
casts of the quotient (NaN: the +0 code, gpuq's rule, where ml_dtypes gives 0x8/0x20) and
onnx.reference's opset-23/24 QuantizeLinear/DequantizeLinear for fp4 with float32 and e8m0
(FLOAT8E8M0, MX) block scales; the op objects and Dask with these codes.

Every half-way point of each grid and its float32 neighbours, saturation, +-0, NaN, +-Inf,
subnormal scales; odd sizes, views, per-tensor/channel/group/block schemes; both host loops
and the CUDA kernels (the ``backend`` fixture: on the CPU execution of the kernels here).
"""

from __future__ import annotations

import numpy as np
import pytest

import gpuq

ml_dtypes = pytest.importorskip("ml_dtypes", minversion="0.5")

RNG = np.random.default_rng(37)
NAMES = ("float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn")
MAX = {"float4_e2m1fn": 6.0, "float6_e2m3fn": 7.5, "float6_e3m2fn": 28.0}
SIGN = {"float4_e2m1fn": 0x8, "float6_e2m3fn": 0x20, "float6_e3m2fn": 0x20}


def _ml(name):
    return np.dtype(getattr(ml_dtypes, name))


def _grid_points(name):
    """Every code's value, every half-way point between neighbours, and the float32 values
    either side of each, both signs, plus saturation and the specials."""
    codes = np.arange(SIGN[name], dtype=np.uint8)  # the non-negative codes
    values = np.sort(codes.view(_ml(name)).astype(np.float32))
    mids = (values[:-1] + values[1:]) / np.float32(2)  # exact: one more bit than the grid
    pts = np.concatenate([values, mids, np.nextafter(mids, np.float32(0)), np.nextafter(mids, np.float32(np.inf)),
                          np.float32([MAX[name] * 1.0625, MAX[name] * 2, 1e30, np.inf, 1e-40, 2.0 ** -149])])
    return np.concatenate([pts, -pts, np.float32([np.nan, -np.nan])]).astype(np.float32)


def _ref_bits(t, name):
    """The codes of float32 quotients ``t``: ml_dtypes' cast, NaN -> 0x0 (gpuq's rule)."""
    bits = t.astype(np.float32).astype(_ml(name)).view(np.uint8).copy()
    bits[np.isnan(t)] = 0
    return bits


def _bits(q, name, backend=None):
    """One code per byte (uint8, on the host) of a result: fp4 Codes unpacked, fp6 arrays
    viewed; device results (Codes of bits, packed or not) brought back."""
    if isinstance(q, gpuq.Codes):
        u = gpuq.unpack(q)
        if backend is not None and backend.name == "cuda":
            return backend.get(u).view(np.uint8)
        assert u.dtype == _ml(name)
        return np.asarray(u).view(np.uint8)
    assert q.dtype == _ml(name)
    return q.view(np.uint8)


def _repeat_groups(s, g, n, axis):
    return np.repeat(s, g, axis=axis).take(np.arange(n), axis=axis)


@pytest.mark.parametrize("name", NAMES)
def test_every_tie_and_special_at_scale_one_and_subnormal_scales(backend, name):
    x = _grid_points(name)
    q_of = lambda v, s: _bits(gpuq.quantize(backend.put(v), s, dtype=name), name, backend)
    for s in (1.0, 0.5, 2.0 ** -130, 3.0):  # 2**-130: a float32 subnormal scale
        s32 = np.float32(s)
        with np.errstate(over="ignore", invalid="ignore"):
            t = x / s32
        np.testing.assert_array_equal(q_of(x, s), _ref_bits(t, name), err_msg=f"scale {s}")
    got = q_of(np.float32([-0.0, 0.0, np.nan, -np.nan, np.inf, -np.inf]), 1.0)
    m = SIGN[name] - 1  # the largest magnitude's code
    assert got.tolist() == [SIGN[name], 0, 0, 0, m, SIGN[name] | m]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("n", [1, 17, 1025])
def test_odd_sizes_and_float_inputs(backend, name, n):
    q_of = lambda v, s: _bits(gpuq.quantize(backend.put(v), s, dtype=name), name, backend)
    x = (RNG.standard_normal(n) * 5).astype(np.float32)
    s = np.float32(0.37)
    np.testing.assert_array_equal(q_of(x, s), _ref_bits(x / s, name))
    x64 = RNG.standard_normal(n) * 5
    ref64 = _ref_bits((x64 / 0.37).astype(np.float32), name)  # float64 quotient, then float32 once
    np.testing.assert_array_equal(q_of(x64, 0.37), ref64)
    for dt in ("float16", "bfloat16"):
        xh = x.astype(_ml(dt) if dt == "bfloat16" else np.float16)
        want = _ref_bits(xh.astype(np.float32) / s, name)
        np.testing.assert_array_equal(q_of(xh, s), want)


@pytest.mark.parametrize("name", NAMES)
def test_schemes_and_views(backend, name):
    def q_of(v, s, **kw):
        return _bits(gpuq.quantize(backend.put(v), backend.put(s), dtype=name, **kw), name, backend).reshape(v.shape)

    x = (RNG.standard_normal((9, 70)) * 4).astype(np.float32)
    # groups of 32 along the last axis (MX's layout), ragged at 70
    s = RNG.uniform(0.05, 2, (9, 3)).astype(np.float32)
    want = _ref_bits(x / _repeat_groups(s, 32, 70, 1), name)
    np.testing.assert_array_equal(q_of(x, s, axis=1, group_size=32), want)
    # 2-D blocks, per-channel on axis 0, a transposed and a strided view
    sb = RNG.uniform(0.05, 2, (3, 5)).astype(np.float32)
    full = _repeat_groups(_repeat_groups(sb, 4, 9, 0), 16, 70, 1)
    np.testing.assert_array_equal(q_of(x, sb, block_size=(4, 16)), _ref_bits(x / full, name))
    sc = RNG.uniform(0.05, 2, 9).astype(np.float32)
    np.testing.assert_array_equal(q_of(x, sc, axis=0), _ref_bits(x / sc[:, None], name))
    xd = backend.put(x)
    before = backend.get(xd).copy()
    view = xd.T[::3]
    got = _bits(gpuq.quantize(view, 0.25, dtype=name), name, backend).reshape(view.shape)
    np.testing.assert_array_equal(got, _ref_bits(x.T[::3] / np.float32(0.25), name))
    np.testing.assert_array_equal(backend.get(xd), before)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("out", ["float32", "float64", "float16", "bfloat16"])
def test_dequantize_one_product_rounded_once(backend, name, out):
    codes = np.arange(2 * SIGN[name], dtype=np.uint8)  # every code
    x = np.tile(codes, 3)[:, None].repeat(5, 1)  # (3 * ncodes, 5)
    vals = x.view(_ml(name)).astype(np.float32)
    s = RNG.uniform(0.01, 3, 5).astype(np.float32)
    s[0] = np.float32(2.0 ** -140)  # subnormal scale
    if name == "float4_e2m1fn":
        src = gpuq.pack(backend.put(x) if backend.name == "cuda" else x.view(_ml(name)), name)
    elif backend.name == "cuda":  # CuPy has no fp6 dtype: a Codes of the bits
        src = gpuq.Codes(backend.put(x), x.shape, name)
    else:
        src = x.view(_ml(name))
    got = backend.get(gpuq.dequantize(src, backend.put(s), axis=1, dtype=out))
    ct = np.float64 if out == "float64" else np.float32
    want = (vals.astype(ct) * s.astype(ct)).astype(_ml(out) if out == "bfloat16" else out)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got.view(f"u{got.dtype.itemsize}"), want.view(f"u{want.dtype.itemsize}"))


@pytest.mark.parametrize("name", NAMES)
def test_choose_qparams_and_quantize_dynamic(host_loops, name):
    x = (RNG.standard_normal((5, 40)) * 3).astype(np.float32)
    x[1, 3] = np.nan
    x[2] = 0
    s, z = gpuq.choose_qparams(x, axis=1, group_size=32, dtype=name)
    assert z is None
    blocks = np.pad(x, ((0, 0), (0, 24))).reshape(5, 2, 32)
    amax = np.nanmax(np.abs(blocks), axis=2)
    want = np.maximum(amax / np.float32(MAX[name]), np.finfo(np.float32).tiny).astype(np.float32)
    np.testing.assert_array_equal(s, want)
    q, s2, z2 = gpuq.quantize_dynamic(x, axis=1, group_size=32, dtype=name)
    np.testing.assert_array_equal(s2, s)
    np.testing.assert_array_equal(_bits(q, name), _bits(gpuq.quantize(x, s, axis=1, group_size=32, dtype=name), name))
    assert z2 is None
    s3, _ = gpuq.choose_qparams(x, axis=1, group_size=32, dtype=name, method="mse")
    assert s3.shape == s.shape and np.all(s3 <= s)


@pytest.mark.parametrize("name", NAMES)
def test_refusals(name):
    x = np.float32([1.0, 2.0])
    with pytest.raises(ValueError, match=f"saturate=False applies to fp8 codes only.*got it with {name} codes"):
        gpuq.quantize(x, 1.0, dtype=name, saturate=False)
    with pytest.raises(ValueError, match=f"symmetric must be True for {name} codes"):
        gpuq.choose_qparams(x, dtype=name, symmetric=False)
    with pytest.raises(ValueError, match="must be None or all 0"):
        gpuq.quantize(x, 1.0, 1, dtype=name)


def test_fp4_is_packed_as_int4():
    x = np.float32([0.5, -6.0, 1.5, 100.0, -0.0])
    q = gpuq.quantize(x, 1.0, dtype="f4_e2m1")
    assert isinstance(q, gpuq.Codes) and q.dtype == "float4_e2m1fn" and q.shape == (5,)
    # codes 1, 0xF, 3, 7, 8: element 2i in the low nibble
    assert q.data.tolist() == [0xF1, 0x73, 0x08]
    np.testing.assert_array_equal(gpuq.pack(gpuq.unpack(q)).data, q.data)
    np.testing.assert_array_equal(gpuq.pack(np.uint8([1, 15, 3, 7, 8]), "float4_e2m1fn").data, q.data)
    with pytest.raises(ValueError, match=r"codes must lie in \[0, 15\] for float4_e2m1fn"):
        gpuq.pack(np.uint8([16]), "float4_e2m1fn")
    with pytest.raises(TypeError, match="out must be a gpuq.Codes for float4_e2m1fn"):
        gpuq.quantize(x, 1.0, out=np.zeros(5, _ml("float4_e2m1fn")))


def _onnx_run(node, inputs, out_type, out_shape, opset=23):
    """One ONNX node through onnx.reference (``inputs``: name -> (TensorProto type, array))."""
    pytest.importorskip("onnx", minversion="1.18")
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    g = helper.make_graph([node], "g", [helper.make_tensor_value_info(k, t, v.shape) for k, (t, v) in inputs.items()],
                          [helper.make_tensor_value_info("y", out_type, out_shape)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    with np.errstate(over="ignore"):  # its x / y_scale at the subnormal scale
        return ReferenceEvaluator(model).run(None, {k: v for k, (_, v) in inputs.items()})[0]


def test_fp4_against_onnx_reference():
    pytest.importorskip("onnx", minversion="1.18")
    from onnx import TensorProto, helper

    x = (RNG.standard_normal((6, 64)) * 4).astype(np.float32)
    x[0, :4] = [np.inf, -np.inf, -0.0, 0.0]  # NaN left out: the policies differ (module docstring)
    s = RNG.uniform(0.05, 2, (6, 4)).astype(np.float32)
    s[1, 0] = np.float32(2.0 ** -135)

    qnode = helper.make_node("QuantizeLinear", ["x", "s"], ["y"], axis=1, block_size=16,
                             output_dtype=TensorProto.FLOAT4E2M1)
    want = _onnx_run(qnode, {"x": (TensorProto.FLOAT, x), "s": (TensorProto.FLOAT, s)}, TensorProto.FLOAT4E2M1,
                     x.shape)
    q = gpuq.quantize(x, s, axis=1, group_size=16, dtype="float4_e2m1fn")
    np.testing.assert_array_equal(_bits(q, "float4_e2m1fn").reshape(x.shape), want.view(np.uint8))
    dnode = helper.make_node("DequantizeLinear", ["q", "s"], ["y"], axis=1, block_size=16,
                             output_dtype=TensorProto.FLOAT)
    ywant = _onnx_run(dnode, {"q": (TensorProto.FLOAT4E2M1, want), "s": (TensorProto.FLOAT, s)}, TensorProto.FLOAT,
                      x.shape)
    y = gpuq.dequantize(q, s, axis=1, group_size=16)
    np.testing.assert_array_equal(y.view(np.uint32), ywant.view(np.uint32))


@pytest.mark.parametrize("opset", [23, 24])
@pytest.mark.parametrize("rule", ["floor", "even", "rceil"])
def test_fp4_with_mx_scales_against_onnx_reference(opset, rule):
    """MX: e8m0 scale bytes (FLOAT8E8M0) with FLOAT4E2M1 codes, blocks of 32, onnx.reference's
    QuantizeLinear/DequantizeLinear against gpuq's scales as chosen: magnitudes from 2**-130 to
    2**60, a zero block (byte 0x00: the scale 2**-127, a float32 subnormal), +-Inf, -0.0."""
    pytest.importorskip("onnx", minversion="1.18")
    from onnx import TensorProto, helper

    x = (RNG.standard_normal((8, 96)) * 3).astype(np.float32)
    x *= np.float32(2.0) ** np.float32([-130, -100, -20, -1, 0, 3, 30, 60])[:, None]
    x[2, 32:64] = 0
    x[3, :3] = [-0.0, 0.0, 5.5]
    s, _ = gpuq.choose_qparams(x, axis=1, group_size=32, dtype="float4_e2m1fn", scale_dtype="float8_e8m0fnu",
                               scale_rule=rule)
    x[4, 5:7] = [np.inf, -np.inf]  # saturate to +-6 (choose_qparams refuses them: scales chosen before)
    e8 = gpuq.e8m0_bytes(s).view(ml_dtypes.float8_e8m0fnu)
    assert 0 in gpuq.e8m0_bytes(s)  # a 0x00 block is among them
    qnode = helper.make_node("QuantizeLinear", ["x", "s"], ["y"], axis=1, block_size=32,
                             output_dtype=TensorProto.FLOAT4E2M1)
    want = _onnx_run(qnode, {"x": (TensorProto.FLOAT, x), "s": (TensorProto.FLOAT8E8M0, e8)},
                     TensorProto.FLOAT4E2M1, x.shape, opset)
    q = gpuq.quantize(x, s, axis=1, group_size=32, dtype="float4_e2m1fn")
    np.testing.assert_array_equal(_bits(q, "float4_e2m1fn").reshape(x.shape), want.view(np.uint8))
    for out, otype in (("float32", TensorProto.FLOAT), ("bfloat16", TensorProto.BFLOAT16)):
        dnode = helper.make_node("DequantizeLinear", ["q", "s"], ["y"], axis=1, block_size=32, output_dtype=otype)
        ywant = _onnx_run(dnode, {"q": (TensorProto.FLOAT4E2M1, want), "s": (TensorProto.FLOAT8E8M0, e8)}, otype,
                          x.shape, opset)
        y = gpuq.dequantize(q, gpuq.e8m0_scales(gpuq.e8m0_bytes(s)), axis=1, group_size=32, dtype=out)
        np.testing.assert_array_equal(y.view(np.uint16 if out == "bfloat16" else np.uint32),
                                      ywant.view(np.uint16 if out == "bfloat16" else np.uint32))


@pytest.mark.parametrize("name", NAMES[1:])
def test_dask_fp6_as_fp8(name):
    da = pytest.importorskip("dask.array")
    x = (RNG.standard_normal((8, 70)) * 3).astype(np.float32)
    d = da.from_array(x, chunks=(4, 32))
    want, ws, _ = gpuq.quantize_dynamic(x, axis=1, group_size=32, dtype=name)
    q, s, z = gpuq.quantize_dynamic(d, axis=1, group_size=32, dtype=name)
    assert z is None
    np.testing.assert_array_equal(q.compute().view(np.uint8), want.view(np.uint8))
    np.testing.assert_array_equal(s.compute(), ws)
    y = gpuq.dequantize(da.from_array(want, chunks=(4, 32)), ws, axis=1, group_size=32).compute()
    np.testing.assert_array_equal(y, gpuq.dequantize(want, ws, axis=1, group_size=32))
    op = gpuq.DynamicQuantize(qtype="per_group", group_shape=[1, 32], dtype=name)  # the op objects too
    np.testing.assert_array_equal(op(d, ws).compute().view(np.uint8), want.view(np.uint8))


def test_dask_refuses_packed_fp4_as_int4():
    da = pytest.importorskip("dask.array")
    d = da.from_array(np.ones((4, 4), np.float32), chunks=2)
    with pytest.raises(TypeError, match="float4_e2m1fn codes \\(packed two per byte\\) are not supported on Dask"):
        gpuq.quantize(d, 1.0, dtype="float4_e2m1fn")


@pytest.mark.parametrize("name", NAMES)
def test_device_choose_qparams_as_the_host(backend, name):
    """The CUDA parameters equal the host's, min/max and the MSE search (e2m3's divisor 7.5 is
    handed to the kernels as the whole range of (-8, 7)); quantize_dynamic is choose_qparams
    then quantize."""
    if backend.name != "cuda":
        pytest.skip("the device path; the host's is test_choose_qparams_and_quantize_dynamic")
    x = (RNG.standard_normal((5, 40)) * 3).astype(np.float32)
    x[1, 3] = np.nan
    for method in ("minmax", "mse"):
        want, _ = gpuq.choose_qparams(x, axis=1, group_size=32, dtype=name, method=method)
        got, z = gpuq.choose_qparams(backend.put(x), axis=1, group_size=32, dtype=name, method=method)
        np.testing.assert_array_equal(backend.get(got), want)
        assert z is None
        q, s, z = gpuq.quantize_dynamic(backend.put(x), axis=1, group_size=32, dtype=name, method=method)
        np.testing.assert_array_equal(backend.get(s), want)
        assert z is None
        np.testing.assert_array_equal(_bits(q, name, backend),
                                      _bits(gpuq.quantize(x, want, axis=1, group_size=32, dtype=name), name))


@pytest.mark.parametrize("name", NAMES)
def test_torch_tensors_on_the_cpu(name):
    """torch has no fp6 or unpacked fp4: fp6 codes come back as uint8 tensors (one code per byte;
    dequantize reads them through a gpuq.Codes naming the type), fp4 as a Codes of packed bytes."""
    torch = pytest.importorskip("torch")
    x = (RNG.standard_normal((5, 33)) * 4).astype(np.float32)
    want = gpuq.quantize(x, 0.3, dtype=name)
    q = gpuq.quantize(torch.from_numpy(x), 0.3, dtype=name)
    if name == "float4_e2m1fn":
        assert isinstance(q, gpuq.Codes) and isinstance(q.data, torch.Tensor)
        np.testing.assert_array_equal(q.data.numpy(), want.data)
        codes = q
    else:
        assert isinstance(q, torch.Tensor) and q.dtype == torch.uint8
        np.testing.assert_array_equal(q.numpy(), want.view(np.uint8))
        codes = gpuq.Codes(q, tuple(q.shape), name)
    y = gpuq.dequantize(codes, 0.3)
    assert isinstance(y, torch.Tensor)
    np.testing.assert_array_equal(y.numpy(), gpuq.dequantize(want, 0.3))


@pytest.mark.parametrize("name", NAMES)
def test_op_objects_take_fp4_fp6_codes(backend, name):
    """The oneDNN-style op objects with fp4/fp6 codes and float32 scales give the functions' bits
    (per channel, per group); they refuse saturate=False and non-zero zero points as the
    functions do."""
    x = (RNG.standard_normal((3, 40)) * 4).astype(np.float32)
    x[0, :3] = [np.nan, np.inf, -0.0]
    sc = RNG.uniform(0.2, 2, 3).astype(np.float32)
    sg = RNG.uniform(0.2, 2, (3, 3)).astype(np.float32)
    q = gpuq.Quantize(scales=sc, qtype="per_channel", axis=0, dtype=name)(backend.put(x))
    want = gpuq.quantize(x, sc, axis=0, dtype=name)
    np.testing.assert_array_equal(_bits(q, name, backend), _bits(want, name))
    y = gpuq.Dequantize(scales=sc, qtype="per_channel", axis=0, dtype="bfloat16")(q)
    np.testing.assert_array_equal(backend.get(y).view(np.uint16),
                                  gpuq.dequantize(want, sc, axis=0, dtype="bfloat16").view(np.uint16))
    qg = gpuq.DynamicQuantize(qtype="per_group", group_shape=[1, 16], dtype=name)(backend.put(x), backend.put(sg))
    wantg = gpuq.quantize(x, sg, block_size=(1, 16), dtype=name)
    np.testing.assert_array_equal(_bits(qg, name, backend), _bits(wantg, name))
    yg = gpuq.DynamicDequantize(qtype="per_group", group_shape=[1, 16])(qg, backend.put(sg))
    np.testing.assert_array_equal(backend.get(yg), gpuq.dequantize(wantg, sg, block_size=(1, 16)))
    with pytest.raises(ValueError, match=f"saturate=False applies to fp8 codes only.*got it with {name} codes"):
        gpuq.Quantize(scales=[1.0], dtype=name, saturate=False)
    with pytest.raises(ValueError, match="must be None or all 0"):
        gpuq.Quantize(scales=[1.0], zps=[2], dtype=name)(backend.put(x))
