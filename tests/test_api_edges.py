"""The Python API at its edges (issue 17): ndarray subclasses, byte order, the op objects'
scale rule, and no stray warnings from validation.

Decisions (README "The Python API at its edges", gpuq/api.py's module docstring):

* ndarray subclasses (np.matrix, np.memmap, any other) are read as their base
  ndarray, a view without a copy, by every entry point and on both host loops;
  results are plain ndarrays, and ``out=`` returns the caller's object.
  Masked arrays raise TypeError: gpuq would drop the mask.
* Byte order is storage, not type: ``>f4`` src/scales/zps hold float32 values
  and are read as such; a ``>f4`` out is written correctly. A ``dtype``
  argument names the type only (``">f4"`` is a TypeError, as in NumPy's ufuncs).
* The op objects use scales as the functional API does: float32, float64 for
  float64 data, each given value rounded once to the compute type.
* Validation converts quietly: a bad scale gives its ValueError and no warning.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import gpuq
import reference as ref

X = np.array([[0.5, -1.5, 2.5, 3.25], [100.0, -7.75, 0.0, np.nan], [1e-3, 40.0, -300.0, 6.5]], np.float32)
SCALES = np.array([0.5, 0.25, 2.0], np.float32)
ZPS = np.array([3, -2, 100], np.int32)
Q = ref.quantize(X, SCALES, ZPS, axis=0)


def _same(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    if got.dtype.kind == "f":
        got, want = got.view(f"u{got.itemsize}"), want.view(f"u{want.itemsize}")
    np.testing.assert_array_equal(got, want)


def _matrix(a):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PendingDeprecationWarning)
        return np.asmatrix(a)


class Tagged(np.ndarray):
    """A user's ndarray subclass that carries nothing gpuq needs."""


# --- ndarray subclasses --------------------------------------------------------------------------

def _subclass_views(a, tmp_path):
    """``a`` as np.matrix, np.memmap and a user subclass (same values)."""
    mm = np.memmap(tmp_path / f"{a.dtype.name}.bin", dtype=a.dtype, mode="w+", shape=a.shape)
    mm[...] = a
    return {"matrix": _matrix(a), "memmap": mm, "tagged": a.copy().view(Tagged)}


@pytest.mark.parametrize("kind", ["matrix", "memmap", "tagged"])
def test_ndarray_subclasses_are_read_as_their_base_array(host_loops, tmp_path, kind):
    """Every entry point, both host loops: the bits of the plain ndarray call, in a plain ndarray."""
    x, q = _subclass_views(X, tmp_path)[kind], _subclass_views(Q, tmp_path)[kind]
    calls = {
        "quantize": (lambda a: gpuq.quantize(a, SCALES, ZPS, axis=0), x, X),
        "quantize per-tensor": (lambda a: gpuq.quantize(a, 0.5, 3, dtype="u8"), x, X),
        "dequantize": (lambda a: gpuq.dequantize(a, SCALES, ZPS, axis=0, dtype="f64"), q, Q),
        "choose_qparams": (lambda a: gpuq.choose_qparams(a, axis=0), x, X),
        "choose_qparams per-tensor": (lambda a: gpuq.choose_qparams(a, symmetric=True), x, X),
        "choose_qparams groups": (lambda a: gpuq.choose_qparams(a, axis=1, group_size=3), x, X),
        "quantize_dynamic": (lambda a: gpuq.quantize_dynamic(a, axis=0), x, X),
        "quantize_dynamic per-tensor": (lambda a: gpuq.quantize_dynamic(a, dtype="u8"), x, X),
        "Quantize": (lambda a: gpuq.Quantize(SCALES.tolist(), ZPS.tolist(), "per_channel", 0)(a), x, X),
        "Dequantize": (lambda a: gpuq.Dequantize([0.5], [3])(a), q, Q),
        "DynamicQuantize": (lambda a: gpuq.DynamicQuantize("per_group", group_shape=[3, 2])(
            a, np.ones((1, 2), np.float32)), x, X),
        "DynamicDequantize": (lambda a: gpuq.DynamicDequantize("per_channel", axis=1)(a, [1.0, 2.0, 0.5, 4.0]), q, Q),
    }
    for name, (call, sub, plain) in calls.items():
        got, want = call(sub), call(plain)
        for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            if w is None:
                assert g is None, name
                continue
            assert type(g) is np.ndarray, (name, type(g))
            _same(g, w)


@pytest.mark.parametrize("kind", ["matrix", "memmap", "tagged"])
def test_subclass_out_is_written_and_returned(host_loops, tmp_path, kind):
    out = _subclass_views(np.zeros(X.shape, np.int8), tmp_path)[kind]
    assert gpuq.quantize(X, SCALES, ZPS, axis=0, out=out) is out
    _same(np.asarray(out), Q)
    fout = _subclass_views(np.zeros(X.shape, np.float32), tmp_path)[kind]
    assert gpuq.dequantize(Q, 0.5, 3, out=fout) is fout
    _same(np.asarray(fout), ref.dequantize(Q, 0.5, 3))
    out[...] = 0
    # A dim split in two (per_group on two dims) reshapes out: np.matrix cannot, its base can.
    op = gpuq.DynamicQuantize("per_group", group_shape=[3, 2])
    assert op(X, np.array([[0.5, 0.25]], np.float32), out=out) is out
    _same(np.asarray(out), ref.quantize(X, [0.5, 0.5, 0.25, 0.25], axis=1))


def test_subclass_scales_and_zps(host_loops):
    s2 = np.full((3, 4), 0.5, np.float32)
    got = gpuq.quantize(X, _matrix(s2), _matrix(np.full((3, 4), 7, np.int32)), axis=(0, 1))
    _same(got, ref.quantize(X, 0.5, 7))
    op = gpuq.DynamicDequantize("per_group", group_shape=[3, 1])
    _same(op(Q, _matrix(np.full((1, 4), 0.5, np.float32))), ref.dequantize(Q, 0.5))


def test_masked_arrays_are_refused_everywhere(host_loops):
    """A masked array's values under the mask are not data: gpuq refuses rather than drop the mask."""
    mx = np.ma.array(X, mask=np.isnan(X))
    mq = np.ma.array(Q, mask=Q == 0)
    match = r"must not be a masked array \(numpy.ma\): gpuq cannot honour a mask"
    for call in (
        lambda: gpuq.quantize(mx, 0.5),
        lambda: gpuq.dequantize(mq, 0.5),
        lambda: gpuq.choose_qparams(mx),
        lambda: gpuq.quantize_dynamic(mx, axis=0),
        lambda: gpuq.Quantize([0.5])(mx),
        lambda: gpuq.DynamicDequantize()(mq, [0.5]),
        lambda: gpuq.quantize(X, np.ma.array(SCALES, mask=[0, 1, 0]), axis=0),
        lambda: gpuq.quantize(X, SCALES, np.ma.array(ZPS), axis=0),
        lambda: gpuq.Dequantize(np.ma.array([0.5]))(Q),
    ):
        with pytest.raises(TypeError, match=match):
            call()
    out = np.ma.zeros(X.shape, np.int8)
    with pytest.raises(TypeError, match=r"out must not be a masked array"):
        gpuq.quantize(X, 0.5, out=out)
    assert not out.data.any()


# --- byte order ----------------------------------------------------------------------------------

@pytest.mark.parametrize("dt", ["f2", "f4", "f8"])
def test_non_native_src_holds_the_same_values(host_loops, dt):
    plain = X.astype(dt)
    swapped = plain.astype(plain.dtype.newbyteorder("S"))
    assert not swapped.dtype.isnative and (swapped == plain)[~np.isnan(plain)].all()
    _same(gpuq.quantize(swapped, SCALES, ZPS, axis=0), gpuq.quantize(plain, SCALES, ZPS, axis=0))
    _same(gpuq.quantize(swapped[:, 1::2], 0.25), ref.quantize(plain[:, 1::2], 0.25))
    finite = np.nan_to_num(plain).astype(swapped.dtype)
    for got, want in zip(gpuq.choose_qparams(finite, axis=0), gpuq.choose_qparams(finite.astype(dt), axis=0)):
        _same(got, want)
    for kw in (dict(), dict(axis=0), dict(axis=1, group_size=2, symmetric=True)):
        for got, want in zip(gpuq.quantize_dynamic(finite, **kw), gpuq.quantize_dynamic(finite.astype(dt), **kw)):
            _same(got, want)
    _same(gpuq.Quantize([0.5], [3])(swapped), ref.quantize(plain, 0.5, 3))
    _same(gpuq.DynamicQuantize("per_channel", axis=0)(swapped, SCALES, ZPS), Q if dt == "f4" else
          ref.quantize(plain, SCALES, ZPS, axis=0))
    assert swapped.dtype.byteorder in "<>"  # inputs are not modified, byte order included


def test_non_native_scales_zps_and_out(host_loops):
    s, z = SCALES.astype(">f4"), ZPS.astype(">i4")
    _same(gpuq.quantize(X, s, z, axis=0), Q)
    _same(gpuq.quantize(X.astype(np.float64), SCALES.astype(">f8"), ZPS.astype(">i8"), axis=0),
          ref.quantize(X.astype(np.float64), SCALES, ZPS, axis=0))
    for dt in (">f4", ">f8", ">f2"):
        out = np.full(Q.shape, 9, dt)
        assert gpuq.dequantize(Q, s, z, axis=0, out=out) is out  # dtype taken from out: its type
        assert out.dtype.str == dt
        _same(out.astype(out.dtype.newbyteorder("=")), ref.dequantize(Q, SCALES, ZPS, axis=0, dtype=dt[1:]))
    out = np.zeros((3, 2), ">f4")[:, ::-1]
    gpuq.DynamicDequantize("per_channel", axis=1)(Q[:, :2], np.float32([0.5, 2.0]), out=out)
    _same(out.astype(np.float32), ref.dequantize(Q[:, :2], [0.5, 2.0], axis=1))


def test_dtype_argument_names_the_type_not_the_byte_order():
    with pytest.raises(TypeError, match=r"dtype selects the type, not the byte order .*got >f4; pass float32"):
        gpuq.dequantize(Q, 0.5, dtype=">f4")
    with pytest.raises(TypeError, match=r"dtype selects the type, not the byte order .*got >f8"):
        gpuq.Dequantize([0.5], dtype=np.dtype(">f8"))
    with pytest.raises(TypeError, match=r"out must have dtype float32, got >f8"):
        gpuq.dequantize(Q, 0.5, dtype="f32", out=np.zeros(Q.shape, ">f8"))
    # One-byte codes have no byte order: '>i1' is int8.
    _same(gpuq.quantize(X, 0.5, dtype=">i1"), ref.quantize(X, 0.5))


# --- the op objects' scales: the functional API's rule -------------------------------------------

def test_dequantize_op_keeps_float64_scales_for_float64_output(backend):
    q = backend.put(np.array([33, -7, 127, 0], np.int8))
    want = ref.dequantize(backend.get(q), 0.1, dtype=np.float64)
    assert want[0] == 33 * 0.1  # 3.3000000000000003, not 3.30000005 (float32 0.1)
    _same(backend.get(gpuq.Dequantize(scales=[0.1], dtype="float64")(q)), want)
    _same(backend.get(gpuq.dequantize(q, 0.1, dtype="float64")), want)
    per_channel = gpuq.Dequantize(scales=[0.1, 1 / 3], zps=[1, -1], qtype="per_channel", axis=1, dtype="f64")
    q2 = backend.put(np.array([[33, -7], [127, 0]], np.int8))
    _same(backend.get(per_channel(q2)), ref.dequantize(backend.get(q2), [0.1, 1 / 3], [1, -1], axis=1,
                                                       dtype=np.float64))
    # float32 and float16 outputs round the float64 scales to float32 once, as the functional API does.
    for dt in ("f32", "f16"):
        _same(backend.get(gpuq.Dequantize(scales=[0.1], dtype=dt)(q)), backend.get(gpuq.dequantize(q, 0.1, dtype=dt)))


def test_quantize_op_keeps_float64_scales_for_float64_src(backend):
    # x / 0.1 and x / float32(0.1) round to different integers for the first two float64 values.
    x = np.array([10.05000001, -12.65000001, 3.3, 0.35, 1e-3], np.float64)
    want = ref.quantize(x, 0.1)
    assert (want != ref.quantize(x, np.float32(0.1))).any()
    xs = backend.put(x)
    _same(backend.get(gpuq.Quantize(scales=[0.1])(xs)), want)
    _same(backend.get(gpuq.quantize(xs, 0.1)), want)
    op = gpuq.Quantize(scales=[0.1, 0.1], zps=[0, 5], qtype="per_channel", axis=0)
    x2 = backend.put(np.stack([x, x]))
    _same(backend.get(op(x2)), ref.quantize(np.stack([x, x]), [0.1, 0.1], [0, 5], axis=0))
    # The same op on float32 data: float32(0.1), as gpuq.quantize.
    x32 = backend.put(x.astype(np.float32))
    _same(backend.get(gpuq.Quantize(scales=[0.1])(x32)), backend.get(gpuq.quantize(x32, 0.1)))
    # float32 scales are widened exactly for float64 data.
    _same(backend.get(gpuq.Quantize(scales=np.float32([0.1]))(xs)), ref.quantize(x, np.float32(0.1)))


def test_quantize_op_checks_scales_in_the_compute_type_of_the_call(backend):
    """A scale that only float64 holds is valid for float64 src, refused for float32 src, as in
    the functional API (and the same words)."""
    op = gpuq.Quantize(scales=[1e-50])
    x64 = np.array([1e-49, -3e-50], np.float64)
    _same(backend.get(op(backend.put(x64))), ref.quantize(x64, 1e-50))
    with pytest.raises(ValueError, match=r"scales must be finite and > 0 in float32, got 0.0"):
        op(backend.put(x64.astype(np.float32)))
    with pytest.raises(ValueError, match=r"scales must be finite and > 0 in float32, got 0.0"):
        gpuq.quantize(backend.put(x64.astype(np.float32)), 1e-50)
    with pytest.raises(ValueError, match=r"scales must be finite and > 0 in float32, got 0.0"):
        gpuq.Dequantize(scales=[1e-50])
    assert backend.get(gpuq.Dequantize(scales=[1e-50], dtype="f64")(backend.put(np.int8([2]))))[0] == 2e-50
    with pytest.raises(ValueError, match=r"scales must be finite and > 0 in float64, got 0.0"):
        gpuq.Quantize(scales=[0.0])


# --- no stray warnings ---------------------------------------------------------------------------

@pytest.mark.parametrize("call", [
    lambda: gpuq.quantize(X, 1e39),
    lambda: gpuq.quantize(X, [0.5, 1e39, 0.5], axis=0),
    lambda: gpuq.quantize(X, np.array([0.5, 1e300, 0.5]), axis=0),
    lambda: gpuq.dequantize(Q, 1e39),
    lambda: gpuq.dequantize(Q, np.float64(-1e39)),
    lambda: gpuq.Dequantize(scales=[1e39]),
    lambda: gpuq.Quantize(scales=[1e39])(X),
    lambda: gpuq.DynamicQuantize()(X, [1e39]),
    lambda: gpuq.choose_qparams(X, eps=1e39),
], ids=["float", "list", "f64-array", "dequantize", "np-float64", "Dequantize", "Quantize", "Dynamic", "eps"])
def test_validation_raises_without_warnings(call):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a RuntimeWarning would surface as the error instead
        with pytest.raises(ValueError, match=r"(scales|eps) must be finite and > 0"):
            call()
