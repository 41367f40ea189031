"""Bit-exact against onnxruntime's CPU QuantizeLinear / DequantizeLinear on finite inputs."""

from __future__ import annotations

import numpy as np
import pytest

import gpuq

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

RNG = np.random.default_rng(7)
ONNX_TYPE = {np.dtype(np.int8): TensorProto.INT8, np.dtype(np.uint8): TensorProto.UINT8,
             np.dtype(np.float32): TensorProto.FLOAT}


def _run(op, x, scale, zp, axis, out_dtype, zp_dtype):
    """One-node model: ``op(x, scale[, zp])``; ``zp=None`` leaves the input out."""
    inputs = [helper.make_tensor_value_info("x", ONNX_TYPE[x.dtype], x.shape),
              helper.make_tensor_value_info("s", TensorProto.FLOAT, scale.shape)]
    feeds = {"x": x, "s": scale}
    names = ["x", "s"]
    if zp is not None:
        inputs.append(helper.make_tensor_value_info("z", ONNX_TYPE[np.dtype(zp_dtype)], zp.shape))
        feeds["z"] = zp.astype(zp_dtype)
        names.append("z")
    attrs = {} if axis is None else {"axis": axis}
    node = helper.make_node(op, names, ["y"], **attrs)
    graph = helper.make_graph([node], "g", inputs,
                              [helper.make_tensor_value_info("y", ONNX_TYPE[np.dtype(out_dtype)], x.shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


def _inputs(shape, scale_shape):
    s = RNG.uniform(0.05, 3.0, size=scale_shape).astype(np.float32)
    x = RNG.normal(0, 200, size=shape).astype(np.float32)
    flat = x.reshape(-1)
    # Per-tensor: ties x ~ (k + 0.5) * s and their neighbours; always: far out of range.
    if s.ndim == 0:
        k = RNG.integers(-300, 300, size=flat.size // 3) + 0.5
        flat[: k.size] = (k * np.float64(s)).astype(np.float32)
        flat[k.size: 2 * k.size] = np.nextafter(flat[: k.size], np.float32(np.inf))
    flat[-5:] = [1e9, -1e9, 3.4e38, -3.4e38, 0.0]
    return x, s


CASES = [((1025,), None), ((17, 33), 0), ((5, 7, 257), 1), ((64, 3), -1), ((4097,), 0)]


@pytest.mark.parametrize("shape,axis", CASES, ids=str)
@pytest.mark.parametrize("qdtype", ["int8", "uint8"])
@pytest.mark.parametrize("with_zp", [True, False], ids=["zp", "nozp"])
def test_quantize_linear(host_loops, shape, axis, qdtype, with_zp):
    scale_shape = () if axis is None else (shape[axis],)
    x, s = _inputs(shape, scale_shape)
    lo, hi = (-128, 128) if qdtype == "int8" else (0, 256)
    zp = RNG.integers(lo, hi, size=scale_shape) if with_zp else None
    ort_zp = zp if with_zp else np.zeros(scale_shape, np.int64)  # ORT needs a zp to know the type
    want = _run("QuantizeLinear", x, s, ort_zp, axis, qdtype, qdtype)
    got = gpuq.quantize(x, s, zp, axis=axis, dtype=qdtype)
    np.testing.assert_array_equal(got, want)


def test_quantize_linear_ties_per_tensor(host_loops):
    s = np.array(0.1, np.float32)
    k = np.arange(-140, 140) + 0.5
    x = (k * np.float32(s)).astype(np.float32)
    x = np.concatenate([x, np.nextafter(x, np.float32(np.inf)), np.nextafter(x, np.float32(-np.inf))])
    for qdtype, zp in (("int8", 0), ("int8", 5), ("uint8", 128), ("uint8", 3)):
        want = _run("QuantizeLinear", x, s, np.array(zp), None, qdtype, qdtype)
        np.testing.assert_array_equal(gpuq.quantize(x, s, zp, dtype=qdtype), want)


@pytest.mark.parametrize("shape,axis", CASES, ids=str)
@pytest.mark.parametrize("qdtype", ["int8", "uint8"])
@pytest.mark.parametrize("with_zp", [True, False], ids=["zp", "nozp"])
def test_dequantize_linear(host_loops, shape, axis, qdtype, with_zp):
    scale_shape = () if axis is None else (shape[axis],)
    lo, hi = (-128, 128) if qdtype == "int8" else (0, 256)
    q = RNG.integers(lo, hi, size=shape).astype(qdtype)
    s = RNG.uniform(0.001, 3.0, size=scale_shape).astype(np.float32)
    zp = RNG.integers(lo, hi, size=scale_shape) if with_zp else None
    want = _run("DequantizeLinear", q, s, zp, axis, np.float32, qdtype)
    got = gpuq.dequantize(q, s, zp, axis=axis)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
