"""Oracles for the fp8 and packed int4/uint4 code formats (issue 19).

Three independent statements of the contract, for tests/test_formats_oracle.py:

* onnxruntime, opset 21 QuantizeLinear/DequantizeLinear on the CPU. Its Python
  binding cannot return int4 or fp8 arrays, nor take them as inputs, so every
  graph converts inside itself: codes leave through a ``Cast`` to int8/uint8
  (int4/uint4: exact) or to float (fp8: exact, signed zeros and Inf kept, NaN
  stays NaN but its bits are the Cast's), and enter the same way (int8 codes
  and zero points ``Cast`` to INT4/UINT4; fp8 values as float32 ``Cast`` with
  ``saturate=0`` to fp8, exact for every fp8 value incl. Inf/NaN).
* onnx.reference (``ReferenceEvaluator``) on the bare QuantizeLinear /
  DequantizeLinear node: it takes and returns ml_dtypes arrays, so its fp8
  codes are compared bit for bit.
* a naive NumPy + ml_dtypes statement (like tests/reference.py): the quotient
  in float32 (float64 for float64 input, then rounded to float32 once for fp8),
  ``np.rint`` + int64 zero point + clip for int4, ml_dtypes' cast (to nearest
  even, NaN/Inf as ml_dtypes) with an explicit clip for ``saturate=True``.
  Nibble packing is stated here naively and cross-checked with
  ``onnx.numpy_helper.from_array`` (ONNX's raw_data).

What each oracle is NOT good for (measured with onnxruntime 1.32 / onnx 1.23):

* onnxruntime, ``saturate=False``: every float32 quotient with |t| in
  [480, 496) gives +-448 for e4m3fn (should be NaN), and every |t| in
  [61440, 65536) gives NaN for e5m2 (should be +-Inf): see
  :func:`ort_saturate_false_wrong`. No float64 QuantizeLinear/DequantizeLinear,
  no CPU bfloat16 QuantizeLinear/DequantizeLinear; float16 only with float16
  scales (it divides in float32, as gpuq). int4/uint4 NaN gives -8 / 0 (gpuq:
  the zero point, a documented choice).
* onnx.reference: int4/uint4 of NaN, +-Inf and quotients beyond the int32
  range come out wrong (it casts to int before clipping: NaN, Inf and 1e300
  give -8): :func:`ref_int4_unreliable`. float16 (and bfloat16) input is
  divided in float16 (bfloat16) arithmetic, not widened to float32 first, so
  it is an oracle for those inputs only through their exactly widened float32
  values. Its fp8 NaN codes are the canonical ones (e4m3fn sign|0x7f, e5m2
  sign|0x7e), as ml_dtypes'; float64 quotients go to fp8 through float32, as
  ml_dtypes arrays do (and the contract says).
* ONNX has no multi-axis scheme: :func:`naive_quantize` / :func:`naive_dequantize`
  (with ``reference.expand``) are the statement there.
"""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
from reference import expand, param_shape

FP8 = {"float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
       "float8_e5m2": np.dtype(ml_dtypes.float8_e5m2)}
FP8_MAX = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}
INT4 = {"int4": (-8, 7), "uint4": (0, 15)}
INT4_ML = {"int4": np.dtype(ml_dtypes.int4), "uint4": np.dtype(ml_dtypes.uint4)}
#: The unpacked code dtype gpuq.unpack gives (and the ORT graphs' Cast targets).
INT4_UNPACKED = {"int4": np.dtype(np.int8), "uint4": np.dtype(np.uint8)}
BF16 = np.dtype(ml_dtypes.bfloat16)
#: Unsigned view of each float type, for bit comparisons.
UINT_OF = {np.dtype(np.float16): np.uint16, BF16: np.uint16, np.dtype(np.float32): np.uint32,
           np.dtype(np.float64): np.uint64}
for _d in FP8.values():
    UINT_OF[_d] = np.uint8

#: e4m3fn: [480, 496) -> +-448 instead of NaN; e5m2: [61440, 65536) -> NaN instead of +-Inf.
ORT_SATURATE_FALSE_WRONG = {"float8_e4m3fn": (480.0, 496.0), "float8_e5m2": (61440.0, 65536.0)}


def ort_saturate_false_wrong(t, fmt):
    """Where onnxruntime 1.32's saturate=False is wrong, for float32 quotients ``t``."""
    lo, hi = ORT_SATURATE_FALSE_WRONG[fmt]
    a = np.abs(np.asarray(t, np.float32))
    return (a >= lo) & (a < hi)


def ref_int4_unreliable(t):
    """Where onnx.reference's int4/uint4 QuantizeLinear is wrong, for quotients ``t``."""
    t = np.asarray(t, np.float64)
    return ~(np.abs(t) < 2.0**31)


def bits(a):
    """The bits of a float array (any of float16/bfloat16/float32/float64/fp8) as unsigned ints."""
    a = np.asarray(a)
    return a.view(UINT_OF[a.dtype])


def all_fp8(fmt):
    """Every bit pattern of ``fmt``, 0..255, as an ml_dtypes array."""
    return np.arange(256, dtype=np.uint8).view(FP8[fmt])


def fp8_values(fmt, finite=True):
    """The distinct fp8 values as sorted float64 (finite only by default; -0 left out)."""
    v = all_fp8(fmt).astype(np.float64)
    v = v[np.isfinite(v)] if finite else v[~np.isnan(v)]
    return np.unique(v)


# --------------------------------------------------------------------------------------------
# naive statement of the contract


def quotient(x, scales, axis=None, group_size=None, block_size=None):
    """x / s in the compute type (float32; float64 for float64 x), s expanded to x's shape."""
    x = np.asarray(x)
    ct = np.float64 if x.dtype == np.float64 else np.float32
    s = expand(np.asarray(scales, ct), x.shape, axis, group_size, block_size)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return x.astype(ct) / s


def fp8_from_float32(t, fmt, saturate=True):
    """ml_dtypes' cast of float32 ``t`` to ``fmt`` (RNE), with ONNX's saturation if asked."""
    t = np.asarray(t, np.float32)
    if saturate:
        m = np.float32(FP8_MAX[fmt])
        t = np.where(np.isnan(t), t, np.clip(t, -m, m))
    return t.astype(FP8[fmt])


def naive_quantize(x, scales, zps=None, *, axis=None, group_size=None, block_size=None, dtype, saturate=True):
    """Codes as arrays: ml_dtypes fp8 (fp8), int8/uint8 unpacked values (int4/uint4)."""
    t = quotient(x, scales, axis, group_size, block_size)
    if dtype in FP8:
        with np.errstate(over="ignore"):
            t32 = t.astype(np.float32)  # float64: the quotient rounded to float32 once
        return fp8_from_float32(t32, dtype, saturate)
    qmin, qmax = INT4[dtype]
    r = np.rint(t)
    r = np.where(np.isnan(r), 0, r)
    r = np.clip(r, -(2.0**40), 2.0**40).astype(np.int64)
    if zps is not None:
        r = r + expand(np.asarray(zps, np.int64), t.shape, axis, group_size, block_size)
    return np.clip(r, qmin, qmax).astype(INT4_UNPACKED[dtype])


def naive_dequantize(q, scales, zps=None, *, axis=None, group_size=None, block_size=None, out_dtype=np.float32):
    """(q - zp) * s, or widen(fp8) * s, in float32 (float64 for float64 output), then narrowed."""
    q = np.asarray(q)
    out_dtype = np.dtype(out_dtype)
    ct = np.float64 if out_dtype == np.float64 else np.float32
    s = expand(np.asarray(scales, ct), q.shape, axis, group_size, block_size)
    if q.dtype in FP8.values():
        d = q.astype(ct)  # exact
    else:
        d = q.astype(np.int64)
        if zps is not None:
            d = d - expand(np.asarray(zps, np.int64), q.shape, axis, group_size, block_size)
        d = d.astype(ct)
    with np.errstate(over="ignore", invalid="ignore"):
        return (d * s).astype(out_dtype)


def pack_nibbles(codes):
    """ONNX's packing, naively: element 2k low nibble, 2k+1 high nibble, odd count pads 0."""
    flat = (np.asarray(codes).reshape(-1).astype(np.int64) & 0xF).astype(np.uint8)
    if flat.size % 2:
        flat = np.concatenate([flat, np.zeros(1, np.uint8)])
    return (flat[0::2] | (flat[1::2] << 4)).astype(np.uint8)


def onnx_packed(codes, dtype):
    """The bytes ONNX stores for int4/uint4 ``codes`` (numpy_helper.from_array's raw_data)."""
    from onnx import numpy_helper

    t = numpy_helper.from_array(np.asarray(codes).astype(INT4_ML[dtype]))
    return np.frombuffer(t.raw_data, np.uint8)


# --------------------------------------------------------------------------------------------
# ONNX graphs

def _onnx():
    import onnx
    from onnx import TensorProto

    qt = {"int4": TensorProto.INT4, "uint4": TensorProto.UINT4,
          "float8_e4m3fn": TensorProto.FLOAT8E4M3FN, "float8_e5m2": TensorProto.FLOAT8E5M2}
    ft = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16,
          np.dtype(np.float64): TensorProto.DOUBLE, BF16: TensorProto.BFLOAT16,
          np.dtype(np.int8): TensorProto.INT8, np.dtype(np.uint8): TensorProto.UINT8}
    return onnx, TensorProto, qt, ft


def _model(nodes, inputs, outputs):
    onnx, _, _, _ = _onnx()
    h = onnx.helper
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info(n, t, None) for n, t in inputs],
                         [h.make_tensor_value_info(n, t, None) for n, t in outputs])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 21)])
    model.ir_version = 10
    return model


def _attrs(axis, block_size, dtype, saturate=None):
    a = {}
    if axis is not None:
        a["axis"] = axis
    if block_size is not None:
        a["block_size"] = block_size
    if saturate is not None and dtype in FP8:
        a["saturate"] = int(saturate)
    return a


@functools.cache
def _session(model_bytes):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(model_bytes, opts, providers=["CPUExecutionProvider"])


@functools.cache
def _ort_q_model(xdtype, dtype, axis, block_size, saturate, with_zp):
    onnx, TP, qt, ft = _onnx()
    h = onnx.helper
    nodes, inputs = [], [("x", ft[xdtype]), ("s", ft[xdtype])]
    attrs = _attrs(axis, block_size, dtype, saturate)
    names = ["x", "s"]
    if with_zp:
        inputs.append(("zi", ft[INT4_UNPACKED[dtype]]))
        nodes.append(h.make_node("Cast", ["zi"], ["z"], to=qt[dtype]))
        names.append("z")
    else:
        attrs["output_dtype"] = qt[dtype]
    nodes.append(h.make_node("QuantizeLinear", names, ["q"], **attrs))
    out = TP.FLOAT if dtype in FP8 else ft[INT4_UNPACKED[dtype]]
    nodes.append(h.make_node("Cast", ["q"], ["y"], to=out))
    return _model(nodes, inputs, [("y", out)]).SerializeToString()


def ort_quantize(x, scales, zps=None, *, axis=None, block_size=None, dtype, saturate=True):
    """onnxruntime's codes: int8/uint8 values (int4/uint4) or float32 values (fp8).

    ``x`` float32 or float16 (then ``scales`` are rounded to float16: pass
    float16-representable ones)."""
    x = np.asarray(x)
    sess = _session(_ort_q_model(x.dtype, dtype, axis, block_size, bool(saturate), zps is not None))
    feeds = {"x": x, "s": np.asarray(scales, x.dtype)}
    if zps is not None:
        feeds["zi"] = np.asarray(zps).astype(INT4_UNPACKED[dtype])
    return sess.run(None, feeds)[0]


@functools.cache
def _ort_dq_model(dtype, out_dtype, axis, block_size, with_zp):
    onnx, TP, qt, ft = _onnx()
    h = onnx.helper
    src = TP.FLOAT if dtype in FP8 else ft[INT4_UNPACKED[dtype]]
    inputs = [("a", src), ("s", ft[out_dtype])]
    cast = {"saturate": 0} if dtype in FP8 else {}
    nodes = [h.make_node("Cast", ["a"], ["q"], to=qt[dtype], **cast)]
    names = ["q", "s"]
    if with_zp:
        inputs.append(("zi", ft[INT4_UNPACKED[dtype]]))
        nodes.append(h.make_node("Cast", ["zi"], ["z"], to=qt[dtype]))
        names.append("z")
    nodes.append(h.make_node("DequantizeLinear", names, ["y"], **_attrs(axis, block_size, dtype)))
    return _model(nodes, inputs, [("y", ft[out_dtype])]).SerializeToString()


def ort_int4_unreliable(t, dtype):
    """Where this onnxruntime's int4/uint4 QuantizeLinear is not to be trusted, for quotients ``t``.

    onnxruntime 1.32 saturates every quotient beyond the code range, +-Inf included. 1.30 (the
    GPU machines' release) does not on every path: huge values wrap (seen: +3e38 -> -8 for int4,
    +Inf -> 0 for uint4, on float32 and float16 inputs, per-tensor, per-axis and blocked). Before
    1.32 the quotients beyond the range are left to the other oracles (the naive statement and
    onnx.reference check every element)."""
    t = np.asarray(t, np.float64)
    if _ORT_VERSION >= (1, 32):
        return np.zeros(t.shape, bool)
    lo, hi = INT4[dtype]
    return ~((t >= lo - 0.5) & (t <= hi + 0.5))


def _ort_version():
    try:
        import onnxruntime
    except ImportError:
        return (0, 0)
    return tuple(int(p) for p in onnxruntime.__version__.split(".")[:2])


_ORT_VERSION = _ort_version()


def ort_dequantize(q, scales, zps=None, *, axis=None, block_size=None, dtype, out_dtype=np.float32):
    """onnxruntime's DequantizeLinear of ``q`` (fp8: an ml_dtypes array; int4: int8/uint8 values).

    ``out_dtype`` float32 or float16 (the scales are given in it)."""
    out_dtype = np.dtype(out_dtype)
    sess = _session(_ort_dq_model(dtype, out_dtype, axis, block_size, zps is not None))
    q = np.asarray(q)
    feeds = {"a": q.astype(np.float32) if dtype in FP8 else q.astype(INT4_UNPACKED[dtype]),
             "s": np.asarray(scales, out_dtype)}
    if zps is not None:
        feeds["zi"] = np.asarray(zps).astype(INT4_UNPACKED[dtype])
    return sess.run(None, feeds)[0]


@functools.cache
def _ref_q(xdtype, dtype, axis, block_size, saturate, with_zp):
    from onnx.reference import ReferenceEvaluator

    onnx, _, qt, ft = _onnx()
    attrs = _attrs(axis, block_size, dtype, saturate)
    names = ["x", "s"]
    inputs = [("x", ft[xdtype]), ("s", ft[xdtype])]
    if with_zp:
        names.append("z")
        inputs.append(("z", qt[dtype]))
    else:
        attrs["output_dtype"] = qt[dtype]
    node = onnx.helper.make_node("QuantizeLinear", names, ["q"], **attrs)
    return ReferenceEvaluator(_model([node], inputs, [("q", qt[dtype])]))


def ref_quantize(x, scales, zps=None, *, axis=None, block_size=None, dtype, saturate=True):
    """onnx.reference's codes: ml_dtypes fp8 arrays (fp8), int8/uint8 values (int4/uint4)."""
    x = np.asarray(x)
    ev = _ref_q(x.dtype, dtype, axis, block_size, bool(saturate), zps is not None)
    feeds = {"x": x, "s": np.asarray(scales, x.dtype)}
    if zps is not None:
        feeds["z"] = np.asarray(zps).astype(INT4_ML[dtype])
    with np.errstate(invalid="ignore", over="ignore"):
        q = np.asarray(ev.run(None, feeds)[0])
    if dtype in FP8:
        assert q.dtype == FP8[dtype], q.dtype
        return q
    return q.astype(INT4_UNPACKED[dtype])


@functools.cache
def _ref_dq(dtype, out_dtype, axis, block_size, with_zp):
    from onnx.reference import ReferenceEvaluator

    onnx, _, qt, ft = _onnx()
    names = ["q", "s"]
    inputs = [("q", qt[dtype]), ("s", ft[out_dtype])]
    if with_zp:
        names.append("z")
        inputs.append(("z", qt[dtype]))
    node = onnx.helper.make_node("DequantizeLinear", names, ["y"], **_attrs(axis, block_size, dtype))
    return ReferenceEvaluator(_model([node], inputs, [("y", ft[out_dtype])]))


def ref_dequantize(q, scales, zps=None, *, axis=None, block_size=None, dtype, out_dtype=np.float32):
    """onnx.reference's DequantizeLinear (any of float32/float16/bfloat16/float64 output)."""
    out_dtype = np.dtype(out_dtype)
    ev = _ref_dq(dtype, out_dtype, axis, block_size, zps is not None)
    q = np.asarray(q)
    feeds = {"q": q if dtype in FP8 else q.astype(INT4_ML[dtype]), "s": np.asarray(scales, out_dtype)}
    if zps is not None:
        feeds["z"] = np.asarray(zps).astype(INT4_ML[dtype])
    with np.errstate(invalid="ignore", over="ignore"):
        y = np.asarray(ev.run(None, feeds)[0])
    assert y.dtype == out_dtype, (y.dtype, out_dtype)
    return y


@np.errstate(over="ignore", invalid="ignore")
def naive_choose_qparams(x, *, axis=None, group_size=None, block_size=None, dtype, symmetric=None, eps=None):
    """The documented choose_qparams for the new code dtypes, one slot at a time.

    int4/uint4: as int8 (tests/reference.py) with the range [-8, 7] / [0, 15]
    and the symmetric divisor 7 (uint4 symmetric zero point 8). fp8: always
    symmetric, ``max(amax / max_finite, eps)`` in float32, no zero points.
    """
    x = np.asarray(x)
    eps = np.float32(np.finfo(np.float32).tiny if eps is None else eps)
    pshape = param_shape(x.shape, axis, group_size, block_size)
    nslots = int(np.prod(pshape, dtype=np.int64))
    slot = np.asarray(expand(np.arange(nslots).reshape(pshape), x.shape, axis, group_size,
                             block_size)).reshape(-1)
    flat = x.reshape(-1)
    scales = np.empty(nslots, np.float32)
    zps = np.empty(nslots, np.int32)
    fp8 = dtype in FP8
    if not fp8:
        qmin, qmax = INT4[dtype]
    for p in range(nslots):
        v = flat[slot == p]
        v = v[~np.isnan(v.astype(np.float32))] if v.dtype == BF16 else v[~np.isnan(v)]
        lo = np.float32(v.min()) if v.size else np.float32(0)
        hi = np.float32(v.max()) if v.size else np.float32(0)
        amax = max(abs(lo), abs(hi))
        if fp8:
            scales[p] = max(np.float32(amax / np.float32(FP8_MAX[dtype])), eps)
            continue
        if symmetric:
            scales[p] = max(np.float32(amax / np.float32((qmax - qmin) // 2)), eps)
            zps[p] = 0 if qmin < 0 else (qmax + 1) // 2
            continue
        lo0, hi0 = min(lo, np.float32(0)), max(hi, np.float32(0))
        s = max(np.float32(np.float32(hi0 - lo0) / np.float32(qmax - qmin)), eps)
        scales[p] = s
        zps[p] = int(np.clip(np.float32(qmin) - np.rint(np.float32(lo0 / s)), qmin, qmax))
    scales = scales.reshape(pshape)
    if fp8 or (symmetric and qmin < 0):
        return scales, None
    return scales, zps.reshape(pshape)


__all__ = [
    "BF16",
    "FP8",
    "FP8_MAX",
    "INT4",
    "all_fp8",
    "bits",
    "fp8_from_float32",
    "fp8_values",
    "naive_dequantize",
    "naive_quantize",
    "onnx_packed",
    "ort_dequantize",
    "ort_quantize",
    "ort_saturate_false_wrong",
    "pack_nibbles",
    "param_shape",
    "quotient",
    "ref_dequantize",
    "ref_quantize",
]
