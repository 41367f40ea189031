"""choose_qparams / quantize_dynamic: exact scales, zero points and codes on every backend.

The expected values come from a naive statement of the formula (float32
NumPy on full-size arrays, one slot at a time via ``np.fmin.at``), from the
ONNX DynamicQuantizeLinear node-test vectors and from ``onnx.reference``.
Scales are compared bit for bit, codes and zero points exactly.
"""

from __future__ import annotations

import numpy as np
import pytest

import gpuq
import reference as ref

RNG = np.random.default_rng(5)
TINY = np.finfo(np.float32).tiny
QRANGE = {"int8": (-128, 127), "uint8": (0, 255)}


# --- the formula, naively -----------------------------------------------------------------------

def _slots(shape, axis, group_size):
    """Slot index of every element (C order) and the parameter shape, without gpuq's Scheme."""
    if axis is None:
        return np.zeros(int(np.prod(shape)), np.intp), ()
    r = len(shape)
    idx = np.indices(shape).reshape(r, -1)
    if group_size is not None:
        k = axis % r
        pshape = shape[:k] + (-(-shape[k] // group_size),) + shape[k + 1:]
        idx = idx.copy()
        idx[k] //= group_size
        return np.ravel_multi_index(idx, pshape), pshape
    axes = sorted(a % r for a in ((axis,) if np.isscalar(axis) else axis))
    pshape = tuple(shape[a] for a in axes)
    return np.ravel_multi_index(idx[axes], pshape), pshape


def naive_qparams(x, axis=None, group_size=None, dtype="int8", symmetric=False, eps=None):
    qmin, qmax = QRANGE[dtype]
    eps = np.float32(TINY if eps is None else eps)
    slot, pshape = _slots(x.shape, axis, group_size)
    lo = np.full(int(np.prod(pshape)), np.nan)
    hi = lo.copy()
    np.fmin.at(lo, slot, x.reshape(-1).astype(np.float64))
    np.fmax.at(hi, slot, x.reshape(-1).astype(np.float64))
    lo = np.nan_to_num(lo, nan=0.0).astype(np.float32).reshape(pshape)
    hi = np.nan_to_num(hi, nan=0.0).astype(np.float32).reshape(pshape)
    if symmetric:
        amax = np.maximum(np.abs(lo), np.abs(hi))
        s = np.asarray(np.maximum(amax / np.float32(127), eps), np.float32)
        return s, (None if qmin < 0 else np.full(pshape, 128, np.int32))
    lo0, hi0 = np.minimum(lo, np.float32(0)), np.maximum(hi, np.float32(0))
    s = np.asarray(np.maximum((hi0 - lo0) / np.float32(qmax - qmin), eps), np.float32)
    z = np.asarray(np.clip(np.float32(qmin) - np.rint(lo0 / s), qmin, qmax), np.int32)
    return s, z


def _same_bits(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    if got.dtype.kind == "f":
        got, want = got.view(f"u{got.itemsize}"), want.view(f"u{want.itemsize}")
    np.testing.assert_array_equal(got, want)


def _check(backend, x, **kw):
    """choose_qparams and quantize_dynamic on ``backend`` against the naive formula."""
    want_s, want_z = naive_qparams(x, **{k: v for k, v in kw.items()})
    s, z = gpuq.choose_qparams(backend.put(x), **kw)
    _same_bits(backend.get(s), want_s)
    if want_z is None:
        assert z is None
    else:
        _same_bits(backend.get(z), want_z)
    if "eps" in kw:  # quantize_dynamic takes the default eps
        return
    q, s2, z2 = gpuq.quantize_dynamic(backend.put(x), **kw)
    want_q = ref.quantize(x, want_s, want_z, axis=kw.get("axis"), group_size=kw.get("group_size"),
                          dtype=kw.get("dtype", "int8"))
    _same_bits(backend.get(q), want_q)
    _same_bits(backend.get(s2), want_s)
    if want_z is None:
        assert z2 is None
    else:
        _same_bits(backend.get(z2), want_z)


def _data(shape, dtype=np.float32, rng=RNG):
    x = rng.normal(0, rng.uniform(0.5, 50), size=shape) + rng.uniform(-3, 3)
    return x.astype(dtype)


# --- ONNX DynamicQuantizeLinear -----------------------------------------------------------------

ONNX_VECTORS = [  # onnx/backend/test/case/node/dynamicquantizelinear.py: x, scale, zero point
    (np.array([0, 2, -3, -2.5, 1.34, 0.5], np.float32), 0.0196078438, 153),
    (np.array([-1.0, -2.1, -1.3, -2.5, -3.34, -4.0], np.float32), 0.0156862754, 255),
    (np.array([1, 2.1, 1.3, 2.5, 3.34, 4.0, 1.5, 2.6, 3.9, 4.0, 3.0, 2.345], np.float32).reshape(3, 4),
     0.0156862754, 0),
]


def _onnx_node_expected(x):
    # The node test's own statement of the expected outputs.
    x_min, x_max = np.minimum(0, np.min(x)), np.maximum(0, np.max(x))
    scale = np.float32((x_max - x_min) / (255 - 0))
    zp = np.clip(round((0 - x_min) / scale), 0, 255).astype(np.uint8)
    y = np.clip(np.round(x / scale) + zp, 0, 255).astype(np.uint8)
    return y, scale, zp


def _onnx_reference(x):
    import onnx
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "y_scale", "y_zero_point"])
    graph = helper.make_graph(
        [node], "dql", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", onnx.TensorProto.UINT8, None),
         helper.make_tensor_value_info("y_scale", onnx.TensorProto.FLOAT, None),
         helper.make_tensor_value_info("y_zero_point", onnx.TensorProto.UINT8, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    return ReferenceEvaluator(model).run(None, {"x": x})


@pytest.mark.parametrize("case", range(len(ONNX_VECTORS)), ids=["mixed", "max_adjusted", "min_adjusted"])
def test_onnx_dynamicquantizelinear_vectors(backend, case):
    x, scale, zp = ONNX_VECTORS[case]
    y_want, s_want, z_want = _onnx_node_expected(x)
    assert np.float32(scale) == s_want and zp == z_want
    q, s, z = gpuq.quantize_dynamic(backend.put(x), dtype="uint8")
    _same_bits(backend.get(s), np.array(s_want, np.float32))
    assert backend.get(z).shape == () and int(backend.get(z)) == zp
    _same_bits(backend.get(q), y_want)
    y_ref, s_ref, z_ref = _onnx_reference(x)
    _same_bits(backend.get(q), y_ref)
    _same_bits(backend.get(s), s_ref)
    assert int(backend.get(z)) == int(z_ref)


@pytest.mark.parametrize("n", [1, 17, 1025, 5137])
def test_onnx_reference_random(backend, n):
    rng = np.random.default_rng(n)
    x = (rng.normal(size=n) * 10 + rng.uniform(-5, 5)).astype(np.float32)
    y_ref, s_ref, z_ref = _onnx_reference(x)
    q, s, z = gpuq.quantize_dynamic(backend.put(x), dtype="uint8")
    _same_bits(backend.get(q), y_ref)
    _same_bits(backend.get(s), s_ref)
    assert int(backend.get(z)) == int(z_ref)


# --- every scheme, exact --------------------------------------------------------------------------

SCHEMES = [
    ((1,), None, None), ((17,), None, None), ((1025,), None, None), ((70001,), None, None),
    ((5, 17), 0, None), ((5, 17), 1, None), ((5, 17), -1, None), ((3, 1025), 0, None),
    ((1025, 3), 1, None), ((4, 33, 6), 1, None), ((2, 3, 4, 5), 2, None), ((1, 1025), 0, None),
    ((4, 17), 1, 4), ((4, 17), 1, 17), ((4, 17), 1, 32), ((17, 6), 0, 5), ((3, 1025, 2), 1, 128),
    ((2, 9, 3), 1, 2), ((6, 7), 0, 1),
    ((1, 1), 0, 1), ((4, 17), 1, 1),  # group_size=1: the split ends in a trailing 1
    ((5, 17), (0, 1), None), ((3, 4, 5), (0, 2), None), ((3, 4, 5), (2, 1), None),
]


def _id(case):
    shape, axis, g = case
    return f"{'x'.join(map(str, shape))}-axis{axis}" + (f"-g{g}" if g else "")


@pytest.mark.parametrize("case", SCHEMES, ids=_id)
@pytest.mark.parametrize("dtype,symmetric", [("int8", False), ("uint8", False), ("int8", True),
                                             ("uint8", True)])
def test_schemes_exact(backend, case, dtype, symmetric):
    shape, axis, g = case
    x = _data(shape)
    _check(backend, x, axis=axis, group_size=g, dtype=dtype, symmetric=symmetric)


@pytest.mark.parametrize("fdtype", ["float16", "float64"])
@pytest.mark.parametrize("case", [((1025,), None, None), ((6, 17), 0, None), ((6, 17), 1, 5),
                                  ((17, 6), 1, None)], ids=_id)
def test_float16_float64(backend, fdtype, case):
    shape, axis, g = case
    _check(backend, _data(shape, fdtype), axis=axis, group_size=g, dtype="uint8")


@pytest.mark.parametrize("view", ["step", "transpose", "reversed", "column"])
@pytest.mark.parametrize("kw", [dict(), dict(axis=0), dict(axis=1), dict(axis=1, group_size=3)],
                         ids=["tensor", "axis0", "axis1", "group3"])
def test_non_contiguous_views(backend, view, kw):
    base = _data((20, 34))
    x = {"step": base[::2, 1::3], "transpose": base.T, "reversed": base[::-1, ::-1],
         "column": base[:, 5:6]}[view]
    _check(backend, x, **kw)
    if backend.name != "cuda":  # same object on the host: also check the view itself
        before = x.copy()
        gpuq.quantize_dynamic(x, **kw)
        _same_bits(x, before)


def test_threads_and_large_rows(backend):
    # Past the NumPy backend's unit size: split units and combined partial results.
    gpuq.set_num_threads(2)
    x = _data((3, 300001))
    for kw in (dict(), dict(axis=0), dict(axis=1), dict(axis=1, group_size=100000)):
        _check(backend, x, **kw)
    _check(backend, _data((600, 700)), axis=1)
    _check(backend, _data((300001,)), symmetric=True)


# --- special blocks -----------------------------------------------------------------------------

def test_all_zero_and_constant_blocks(backend):
    x = np.array([[0, 0, 0, 0], [3, 3, 3, 3], [-2, -2, -2, -2], [0, 0, 5, 5]], np.float32)
    s, z = gpuq.choose_qparams(backend.put(x), axis=0, dtype="uint8")
    s, z = backend.get(s), backend.get(z)
    _same_bits(s, np.array([TINY, np.float32(3) / 255, np.float32(2) / 255, np.float32(5) / 255], np.float32))
    np.testing.assert_array_equal(z, [0, 0, 255, 0])
    q, _, _ = gpuq.quantize_dynamic(backend.put(x), axis=0, dtype="uint8")
    np.testing.assert_array_equal(backend.get(q), [[0] * 4, [255] * 4, [0] * 4, [0, 0, 255, 255]])
    # int8 asymmetric all-zero: zp = qmin, codes = qmin (dequantize to 0)
    q, s, z = gpuq.quantize_dynamic(backend.put(np.zeros(5, np.float32)))
    _same_bits(backend.get(s), np.array(TINY, np.float32))
    assert int(backend.get(z)) == -128
    np.testing.assert_array_equal(backend.get(q), [-128] * 5)
    q, s, z = gpuq.quantize_dynamic(backend.put(np.zeros(5, np.float32)), symmetric=True)
    assert z is None
    np.testing.assert_array_equal(backend.get(q), [0] * 5)


def test_negative_only_rows(backend):
    x = -np.abs(_data((4, 1025))) - 1
    s, z = gpuq.choose_qparams(backend.put(x), axis=0, dtype="uint8")
    np.testing.assert_array_equal(backend.get(z), [255] * 4)
    s, z = gpuq.choose_qparams(backend.put(x), axis=0, dtype="int8")
    np.testing.assert_array_equal(backend.get(z), [127] * 4)
    _check(backend, x, axis=0, dtype="int8")


def test_eps(backend):
    x = np.array([[0, 0], [1e-6, -1e-6]], np.float32)
    s, _ = gpuq.choose_qparams(backend.put(x), axis=0, eps=1e-3)
    _same_bits(backend.get(s), np.array([1e-3, 1e-3], np.float32))
    _check(backend, np.array([1e-40, -2e-40, 0], np.float32), eps=1e-45)  # subnormal scale
    _check(backend, np.array([1e-40, -2e-40, 0], np.float32))  # clamped to the smallest normal


def test_range_beyond_float32(backend):
    big = np.finfo(np.float32).max
    x = np.array([-big, big, 0], np.float32)
    s, z = gpuq.choose_qparams(backend.put(x), dtype="uint8")
    want = np.float32((np.float64(big) * 2) / 255)
    _same_bits(backend.get(s), np.array(want, np.float32))
    assert np.isfinite(backend.get(s))
    assert int(backend.get(z)) == 128  # -(-big / s) = 127.5 -> 128 (half to even)
    q, _, _ = gpuq.quantize_dynamic(backend.put(x), dtype="uint8")
    np.testing.assert_array_equal(backend.get(q), [0, 255, 128])


def test_nan_is_ignored(backend):
    x = _data((3, 40))
    x[0, ::3] = np.nan
    x[2, :] = np.nan  # a block of NaN only: treated as all zero
    s, z = gpuq.choose_qparams(backend.put(x), axis=0)
    clean_s, clean_z = gpuq.choose_qparams(np.nan_to_num(x[:2], nan=x[0, 1]), axis=0)
    _same_bits(backend.get(s)[:2], clean_s)
    _same_bits(backend.get(z)[:2], clean_z)
    _same_bits(backend.get(s)[2], np.float32(TINY))
    q, s2, z2 = gpuq.quantize_dynamic(backend.put(x), axis=0)
    q = backend.get(q)
    np.testing.assert_array_equal(q[0, ::3], backend.get(z2)[0])  # NaN -> zero point
    np.testing.assert_array_equal(q[2], [-128] * 40)
    _check(backend, x, axis=0)
    _check(backend, x, axis=1, group_size=7, symmetric=True)


#: Signalling NaNs of both signs, the smallest and a large payload (quiet bit clear), per dtype.
SNAN_BITS = {"float32": (0x7F810000, 0xFF800001, 0x7FBFFFFF), "float64": (0x7FF0000000000001, 0xFFF4000000000000,
                                                                    0x7FF7FFFFFFFFFFFF),
             "float16": (0x7C01, 0xFD00, 0x7DFF), "bfloat16": (0x7F81, 0xFF81, 0x7FBF)}


def _with_signalling_nans(fdtype):
    """(7, 37) data of ``fdtype`` with signalling NaNs at the start, middle and end of every row
    and of several columns, each right after the largest magnitude of its row (so that a
    reduction restarting after the NaN loses it), row 5 all NaN, and quiet NaNs among them."""
    dt = np.dtype(fdtype) if fdtype != "bfloat16" else np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    x = RNG.normal(size=(7, 37)).astype(np.float32)
    cols = (0, 1, 18, 19, 35, 36)
    for r in range(7):
        x[r, [17, 34]] = (-1) ** r * (12.0 + r)  # big values just before sNaN slots
    x = x.astype(dt)
    bits = x.view(f"u{dt.itemsize}")
    payloads = SNAN_BITS[fdtype]
    for r in range(7):
        for k, c in enumerate(cols):
            bits[r, c] = payloads[(r + k) % len(payloads)]
    bits[5, :] = payloads[0]  # a block of NaN only: all zero
    x[3, 2] = np.nan  # a quiet NaN among them
    with np.errstate(invalid="ignore"):  # casting a signalling NaN raises the invalid flag
        assert np.isnan(x.astype(np.float64)).sum() == 7 * len(cols) + 31 + 1
    return x


@pytest.mark.parametrize("fdtype", list(SNAN_BITS))
@pytest.mark.parametrize("kw", [dict(), dict(axis=0), dict(axis=1), dict(axis=-1, group_size=8),
                                dict(axis=0, group_size=3), dict(axis=(0, 1))],
                         ids=["tensor", "axis0", "axis1", "group8", "group3-axis0", "multi"])
@pytest.mark.parametrize("symmetric", [False, True], ids=["asym", "sym"])
def test_signalling_nan_is_skipped(backend, fdtype, kw, symmetric):
    """A signalling NaN is skipped like a quiet one: the range is that of the block's numbers
    (issue 26: NumPy's fmin/fmax restarted the running min/max after one)."""
    x = _with_signalling_nans(fdtype)
    with np.errstate(invalid="ignore"):
        x32 = x.astype(np.float32)  # the NaNs stay NaN; the reference sees values only
    want_s, want_z = ref.choose_qparams(x32, symmetric=symmetric, **kw)
    s, z = gpuq.choose_qparams(backend.put(x), symmetric=symmetric, **kw)
    _same_bits(backend.get(s), want_s)
    if want_z is None:
        assert z is None
    else:
        _same_bits(backend.get(z), want_z)
    q, s2, z2 = gpuq.quantize_dynamic(backend.put(x), symmetric=symmetric, **kw)
    _same_bits(backend.get(s2), want_s)
    want_q = ref.quantize(x32, want_s, want_z, axis=kw.get("axis"), group_size=kw.get("group_size"))
    np.testing.assert_array_equal(backend.get(q), want_q)


@pytest.mark.parametrize("bad", [np.inf, -np.inf])
@pytest.mark.parametrize("kw", [dict(), dict(axis=0), dict(axis=1, group_size=4)],
                         ids=["tensor", "axis0", "group4"])
def test_inf_raises(backend, bad, kw):
    x = _data((3, 9))
    x[1, 2] = bad
    with pytest.raises(ValueError, match="x must be finite"):
        gpuq.choose_qparams(backend.put(x), **kw)
    with pytest.raises(ValueError, match="x must be finite"):
        gpuq.quantize_dynamic(backend.put(x), **kw)


def test_float64_beyond_float32_raises(backend):
    x = np.array([1.0, 1e300], np.float64)
    with pytest.raises(ValueError, match="x must be finite"):
        gpuq.choose_qparams(backend.put(x))
    with pytest.raises(ValueError, match="x must be finite"):
        gpuq.quantize_dynamic(backend.put(x.reshape(1, 2)), axis=0)


# --- shapes, dtypes, inputs -----------------------------------------------------------------------

def test_shapes_match_quantize(backend):
    x = _data((4, 6, 5))
    for axis, g, shape in [(None, None, ()), (1, None, (6,)), ((0, 2), None, (4, 5)),
                           (1, 4, (4, 2, 5)), (-1, 2, (4, 6, 3))]:
        s, z = gpuq.choose_qparams(backend.put(x), axis=axis, group_size=g)
        assert backend.get(s).shape == shape and backend.get(s).dtype == np.float32
        assert backend.get(z).shape == shape and backend.get(z).dtype == np.int32
        gpuq.quantize(backend.put(x), s, z, axis=axis, group_size=g)  # accepted as they are


def test_empty_and_0d(backend):
    s, z = gpuq.choose_qparams(backend.put(np.zeros((0, 3), np.float32)), axis=1)
    _same_bits(backend.get(s), np.full(3, TINY, np.float32))
    np.testing.assert_array_equal(backend.get(z), [-128] * 3)
    q, s, z = gpuq.quantize_dynamic(backend.put(np.zeros((0, 3), np.float32)))
    assert backend.get(q).shape == (0, 3)
    _check(backend, np.array(2.5, np.float32))


def test_input_not_modified(backend):
    x = _data((5, 33))
    x[1, 1] = np.nan
    before = x.copy()
    xd = backend.put(x)
    gpuq.choose_qparams(xd, axis=1, group_size=4)
    gpuq.quantize_dynamic(xd, axis=0)
    _same_bits(backend.get(xd), before)


@pytest.mark.parametrize("call,exc,match", [
    (lambda x: gpuq.choose_qparams(x.astype(np.int32)), TypeError, "x must be float16, float32, float64 or bfloat16, got int32"),
    (lambda x: gpuq.choose_qparams({1.0, 2.0}), TypeError, "x must be a NumPy array or a CUDA array"),
    (lambda x: gpuq.choose_qparams(x, dtype="int3"), ValueError, "dtype must be one of int8, uint8, int4, uint4, float8_e4m3fn, float8_e5m2, float4_e2m1fn, float6_e2m3fn, float6_e3m2fn, got unknown name 'int3'"),
    (lambda x: gpuq.choose_qparams(x, dtype="float8_e4m3fn", symmetric=False), ValueError, "symmetric must be True for float8_e4m3fn"),
    (lambda x: gpuq.choose_qparams(x, axis=2), ValueError, r"axis must be in \[-2, 1\] for rank 2, got 2"),
    (lambda x: gpuq.choose_qparams(x, group_size=4), ValueError, "group_size=4 needs a single integer axis"),
    (lambda x: gpuq.choose_qparams(x, axis=1, group_size=0), ValueError, "group_size must be a positive integer, got 0"),
    (lambda x: gpuq.choose_qparams(x, eps=0.0), ValueError, "eps must be finite and > 0"),
    (lambda x: gpuq.choose_qparams(x, eps=1e-50), ValueError, "eps must be finite and > 0 .*float32: 0.0"),
    (lambda x: gpuq.choose_qparams(x, eps=float("nan")), ValueError, "eps must be finite and > 0"),
    (lambda x: gpuq.choose_qparams(x, eps="tiny"), TypeError, "eps must be a real number, got 'tiny'"),
    (lambda x: gpuq.choose_qparams(x, symmetric="yes"), TypeError, "symmetric must be True or False, got 'yes'"),
    (lambda x: gpuq.quantize_dynamic(x, dtype="float32"), ValueError, "dtype must be one of int8, uint8, int4, .*, got float32"),
])
def test_errors(backend, call, exc, match):
    x = backend.put(_data((3, 4)))
    with pytest.raises(exc, match=match):
        call(x)


def test_fused_rows_report_inf_in_whole_tensor_coordinates(monkeypatch, host_loops):
    # The one-pass NumPy quantize_dynamic works in blocks of rows; the error names the global row.
    from gpuq.backends.host import qparams as host_qparams

    monkeypatch.setattr(host_qparams, "FUSED_BLOCK", 64)
    x = np.ones((64, 16), np.float32)
    x[40, 3] = -np.inf
    with pytest.raises(ValueError, match=r"got -inf in the block of scales index \(40,\)"):
        gpuq.quantize_dynamic(x, axis=0)


def test_fused_rows_match_two_passes_across_blocks(monkeypatch, host_loops):
    from gpuq.backends.host import qparams as host_qparams

    monkeypatch.setattr(host_qparams, "FUSED_BLOCK", 64)
    rng = np.random.default_rng(5)
    x = rng.normal(0, 2, size=(37, 33)).astype(np.float32)
    x[::5, ::7] = np.nan
    x[3] = 0.0
    for kw in (dict(axis=0), dict(axis=0, symmetric=True, dtype="uint8")):
        q, s, z = gpuq.quantize_dynamic(x, **kw)
        s2, z2 = gpuq.choose_qparams(x, **kw)
        np.testing.assert_array_equal(s.view(np.uint32), s2.view(np.uint32))
        np.testing.assert_array_equal(z, z2)
        q2 = gpuq.quantize(x, s2, z2, axis=0, dtype=kw.get("dtype", "int8"))
        np.testing.assert_array_equal(q, q2)


# --- Ragged groups and blocks: rows at a stride on the compiled reduction (issue 28) -------------

def _ragged_with_nans(shape, fdtype, edge=128):
    """``shape`` data of ``fdtype`` (last dim not a multiple of ``edge``) with signalling and quiet
    NaNs at both ends of every group of ``edge`` along the last dim and of the ragged tail, each
    next to its row's largest magnitude (a reduction restarting after a NaN loses it); one row
    all NaN and one row's tail all NaN (slots with no number: all zero)."""
    dt = np.dtype(fdtype) if fdtype != "bfloat16" else np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    rng = np.random.default_rng(28)
    x = rng.normal(size=shape).astype(np.float32)
    n = shape[-1]
    ends = sorted({c for g in range(0, n, edge) for c in (g, min(g + edge, n) - 1)})
    for k, c in enumerate(ends):
        x[..., c + (1 if c % edge == 0 else -1)] = (-1) ** k * (20.0 + k)
    x = x.astype(dt)
    bits = x.view(f"u{dt.itemsize}")
    payloads = SNAN_BITS[fdtype]
    for k, c in enumerate(ends):
        bits[..., c] = payloads[k % len(payloads)]
    x[..., ends[1::4]] = np.nan  # quiet ones among them
    x[..., 1, :] = np.nan
    x[..., 2, (n // edge) * edge:] = np.nan
    return x


@pytest.mark.parametrize("fdtype", list(SNAN_BITS))
@pytest.mark.parametrize("shape,kw", [((37, 1100), dict(axis=1, group_size=128)),
                                      ((3, 11, 300), dict(axis=-1, group_size=128)),
                                      ((37, 1100), dict(block_size=(16, 128)))],
                         ids=["group128", "group128-3d", "block16x128"])
@pytest.mark.parametrize("symmetric", [False, True], ids=["asym", "sym"])
def test_ragged_groups_reduce_rows_at_a_stride(host_loops, monkeypatch, fdtype, shape, kw, symmetric):
    """Ragged groups along the last axis reduce their whole groups (``x[:, :1024]``, rows at a
    stride) and the tail on the compiled kernels (``loops.minmax_keys_rows``) with numba, in
    units on two threads, NaN skipped (quiet or signalling) at every group edge: the scales and
    zero points of the naive statement, bit for bit, on both loops (blocks, whose reduced dims
    are not trailing, reduce on NumPy: the same bits)."""
    from gpuq.backends.host import qparams as host_qparams

    monkeypatch.setattr(host_qparams, "UNIT", 2048)  # several units a piece, shared by two threads
    monkeypatch.setattr("gpuq.backends.host.threads.PARALLEL_MIN", 0)
    rows = {"calls": 0}
    if host_loops == "numba":
        from gpuq.backends.host import loops

        kernel = loops.minmax_keys_rows

        def counting(*args):
            rows["calls"] += 1
            return kernel(*args)
        monkeypatch.setattr(loops, "minmax_keys_rows", counting)
        if "group_size" in kw:
            def fail(*args):
                raise AssertionError("a NumPy reduction ran")
            monkeypatch.setattr(host_qparams, "_reduce_seq", fail)
    x = _ragged_with_nans(shape, fdtype)
    with np.errstate(invalid="ignore"):
        x32 = x.astype(np.float32)  # the NaNs stay NaN; the reference sees values only
    want_s, want_z = ref.choose_qparams(x32, symmetric=symmetric, **kw)
    s, z = gpuq.choose_qparams(x, symmetric=symmetric, **kw)
    _same_bits(s, want_s)
    if want_z is None:
        assert z is None
    else:
        _same_bits(z, want_z)
    assert rows["calls"] > 0 or host_loops == "numpy" or "block_size" in kw
