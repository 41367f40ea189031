"""Per-group (block) quantization: ONNX ``block_size`` semantics and oneDNN ``per_group`` ops.

``gpuq.quantize/dequantize(..., axis=k, group_size=g)`` against
``onnx.reference`` QuantizeLinear/DequantizeLinear with ``block_size``
(opset 21), ragged last groups included; the op objects' ``group_shape``
against a naive expansion of the parameters. Codes are compared exactly.
"""

from __future__ import annotations

import numpy as np
import pytest

import gpuq

RNG = np.random.default_rng(21)
_ONNX_Q = {"int8": 3, "uint8": 2}  # onnx.TensorProto.INT8 / UINT8


def _onnx_run(op, x, scale, zp, axis, block_size, out_type=None):
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    names = ["x", "s"] + (["z"] if zp is not None else [])
    attrs = dict(axis=axis, block_size=block_size)
    if out_type is not None:
        attrs["output_dtype"] = out_type
    node = helper.make_node(op, names, ["y"], **attrs)
    feeds = {"x": x, "s": scale}
    if zp is not None:
        feeds["z"] = zp
    inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
              for n, v in feeds.items()]
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", 0, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    return ReferenceEvaluator(model).run(None, feeds)[0]


def _pshape(shape, axis, g):
    k = axis % len(shape)
    return shape[:k] + (-(-shape[k] // g),) + shape[k + 1:]


def _data(shape):
    # Ties (k + 0.5) mixed in, all well inside int32 after division (onnx.reference casts to int32).
    x = RNG.normal(0, 200, size=shape)
    flat = x.reshape(-1)
    pick = RNG.random(flat.size) < 0.3
    flat[pick] = RNG.integers(-300, 300, size=int(pick.sum())) + 0.5
    return x.astype(np.float32)


GROUPS = [
    ((1, 1), 1, 1), ((17,), 0, 4), ((4, 17), 1, 4), ((4, 17), 1, 17), ((4, 17), 1, 32),
    ((4, 1025), -1, 128), ((17, 6), 0, 5), ((3, 10, 7), 1, 3), ((2, 9, 3), 1, 2), ((6, 7), 0, 1),
    ((5, 1025), 0, 2), ((2, 3, 33), 2, 8),
]


def _gid(case):
    shape, axis, g = case
    return f"{'x'.join(map(str, shape))}-axis{axis}-g{g}"


@pytest.mark.parametrize("case", GROUPS, ids=_gid)
@pytest.mark.parametrize("qdtype", ["int8", "uint8"])
@pytest.mark.parametrize("with_zp", [True, False], ids=["zp", "nozp"])
def test_blocked_quantize_matches_onnx(backend, case, qdtype, with_zp):
    shape, axis, g = case
    x = _data(shape)
    ps = _pshape(shape, axis, g)
    s = RNG.uniform(0.5, 4.0, size=ps).astype(np.float32)
    lo, hi = (-20, 20) if qdtype == "int8" else (100, 156)
    z = RNG.integers(lo, hi, size=ps).astype(qdtype) if with_zp else None
    want = _onnx_run("QuantizeLinear", x, s, z, axis, g, None if with_zp else _ONNX_Q[qdtype])
    got = gpuq.quantize(backend.put(x), s, z, axis=axis, group_size=g, dtype=qdtype)
    got = backend.get(got)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("case", GROUPS, ids=_gid)
@pytest.mark.parametrize("qdtype", ["int8", "uint8"])
def test_blocked_dequantize_matches_onnx(backend, case, qdtype):
    shape, axis, g = case
    info = np.iinfo(qdtype)
    q = RNG.integers(info.min, info.max + 1, size=shape).astype(qdtype)
    ps = _pshape(shape, axis, g)
    s = RNG.uniform(0.01, 4.0, size=ps).astype(np.float32)
    z = RNG.integers(info.min, info.max + 1, size=ps).astype(qdtype)
    want = _onnx_run("DequantizeLinear", q, s, z, axis, g)
    got = backend.get(gpuq.dequantize(backend.put(q), s, z, axis=axis, group_size=g))
    np.testing.assert_array_equal(got.view(np.uint32), want.astype(np.float32).view(np.uint32))


def test_dynamic_group_roundtrip_matches_onnx(backend):
    # choose_qparams per group, then ONNX's blocked QuantizeLinear with those parameters.
    x = _data((6, 70))
    q, s, z = gpuq.quantize_dynamic(backend.put(x), axis=1, group_size=16, dtype="uint8")
    s, z = backend.get(s), backend.get(z)
    assert s.shape == (6, 5) and z.shape == (6, 5)
    want = _onnx_run("QuantizeLinear", x, s, z.astype(np.uint8), 1, 16)
    np.testing.assert_array_equal(backend.get(q), want)


# --- oneDNN per_group op objects ------------------------------------------------------------------

def _expand(p, group_shape, shape=None):
    for k, g in enumerate(group_shape):
        p = np.repeat(p, g, axis=k)
    return p if shape is None else p[tuple(slice(0, n) for n in shape)]  # ragged last blocks cut


def _naive_quantize(x, s, z, group_shape, qdtype):
    s, z = _expand(s, group_shape, x.shape), _expand(z, group_shape, x.shape).astype(np.int64)
    r = np.rint(x / s).astype(np.int64) + z
    info = np.iinfo(qdtype)
    return np.clip(r, info.min, info.max).astype(qdtype)


PER_GROUP = [((4, 64), [1, 32]), ((64, 4), [32, 1]), ((4, 6), [2, 3]), ((6, 4, 8), [3, 1, 4]),
             ((5, 7), [1, 1]), ((2, 3, 4), [2, 3, 4]), ((9,), [3]),
             ((5, 7), [2, 3]), ((7, 66), [3, 32]), ((10,), [4])]  # ragged last blocks (issue 28)


@pytest.mark.parametrize("shape,group_shape", PER_GROUP, ids=lambda v: "x".join(map(str, v)))
def test_per_group_ops(backend, shape, group_shape):
    x = _data(shape)
    pshape = tuple(-(-d // g) for d, g in zip(shape, group_shape))
    s = RNG.uniform(0.5, 4.0, size=pshape).astype(np.float32)
    z = RNG.integers(-20, 20, size=pshape).astype(np.int32)
    want = _naive_quantize(x, s, z, group_shape, np.int8)
    qop = gpuq.DynamicQuantize(qtype="per_group", group_shape=group_shape)
    q = qop(backend.put(x), backend.put(s), backend.put(z))
    np.testing.assert_array_equal(backend.get(q), want)
    out = backend.put(np.zeros(shape, np.int8))
    assert qop(backend.put(x), s, z, out=out) is out
    np.testing.assert_array_equal(backend.get(out), want)
    dop = gpuq.DynamicDequantize(qtype="per_group", group_shape=group_shape)
    y = backend.get(dop(backend.put(want), s, z))
    y_want = ((want.astype(np.int64) - _expand(z, group_shape, shape)).astype(np.float32)
              * _expand(s, group_shape, shape))
    np.testing.assert_array_equal(y.view(np.uint32), y_want.view(np.uint32))


def test_per_group_op_equals_axis_group_size(backend):
    x = _data((8, 256))
    s, z = gpuq.choose_qparams(backend.put(x), axis=1, group_size=64, dtype="uint8")
    a = gpuq.quantize(backend.put(x), s, z, axis=1, group_size=64, dtype="uint8")
    b = gpuq.DynamicQuantize(qtype="per_group", group_shape=[1, 64], dtype="u8")(backend.put(x), s, z)
    np.testing.assert_array_equal(backend.get(a), backend.get(b))


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(qtype="per_group"), TypeError, "group_shape must be a list of positive integers for qtype='per_group', got None"),
    (dict(qtype="per_group", group_shape=[0, 2]), ValueError, r"group_shape must be a list of positive integers, got \[0, 2\]"),
    (dict(qtype="per_group", group_shape=[1.5, 2]), TypeError, r"group_shape must be a list of positive integers, got \[1.5, 2\]"),
    (dict(qtype="per_tensor", group_shape=[1, 2]), ValueError, "group_shape is only used with qtype='per_group'"),
    (dict(qtype="per_block"), ValueError, "qtype must be one of per_tensor, per_channel, per_group, got 'per_block'"),
])
@pytest.mark.parametrize("op", [gpuq.DynamicQuantize, gpuq.DynamicDequantize])
def test_per_group_construction_errors(op, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        op(**kwargs)


@pytest.mark.parametrize("group_shape,scale_shape,match", [
    # Issue 28: a ragged last block is allowed (gpuq's block_size): ceil(src shape / group_shape).
    ([1, 5], (4, 1), r"scales must have shape \(4, 2\) \(src shape \(4, 6\) / group_shape \[1, 5\], rounded up\), got shape \(4, 1\)"),
    ([3, 1], (1, 6), r"scales must have shape \(2, 6\) \(src shape \(4, 6\) / group_shape \[3, 1\], rounded up\), got shape \(1, 6\)"),
    ([2], (2,), r"group_shape must have one entry per dim of src: src shape \(4, 6\), got group_shape \[2\]"),
    ([1, 2], (4, 2), r"scales must have shape \(4, 3\) \(src shape \(4, 6\) / group_shape \[1, 2\], rounded up\), got shape \(4, 2\)"),
    ([2, 3], (2, 3), r"scales must have shape \(2, 2\) \(src shape \(4, 6\) / group_shape \[2, 3\], rounded up\), got shape \(2, 3\)"),
])
@pytest.mark.parametrize("which", ["quantize", "dequantize"])
def test_per_group_call_errors(backend, group_shape, scale_shape, match, which):
    if which == "quantize":
        op, src = gpuq.DynamicQuantize(qtype="per_group", group_shape=group_shape), _data((4, 6))
    else:
        op, src = gpuq.DynamicDequantize(qtype="per_group", group_shape=group_shape), np.zeros((4, 6), np.int8)
    with pytest.raises(ValueError, match=match):
        op(backend.put(src), np.ones(scale_shape, np.float32))


def test_per_group_zps_shape_error(backend):
    op = gpuq.DynamicQuantize(qtype="per_group", group_shape=[2, 3])
    with pytest.raises(ValueError, match=r"zps must have shape \(2, 2\) .*got shape \(2,\)"):
        op(backend.put(_data((4, 6))), np.ones((2, 2), np.float32), np.zeros(2, np.int32))
