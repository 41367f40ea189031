"""quantize/dequantize against the naive reference, on every backend, codes compared exactly."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import gpuq
import reference as ref

RNG = np.random.default_rng(20261122)
QDTYPES = ["int8", "uint8"]
FDTYPES = ["float16", "float32", "float64"]


def _data(shape, dtype, rng=RNG, spread=300.0):
    """Values over and beyond the code range, with exact ties mixed in."""
    x = rng.normal(0, spread, size=shape)
    flat = x.reshape(-1)
    if flat.size:
        ties = rng.integers(-200, 200, size=flat.size) + 0.5
        pick = rng.random(flat.size) < 0.3
        flat[pick] = ties[pick]
    return x.astype(dtype)


def _scales(n, dtype=np.float32, rng=RNG):
    return (rng.uniform(0.25, 4.0, size=n)).astype(dtype)


def _zps(n, qdtype, rng=RNG):
    lo, hi = (-20, 20) if qdtype == "int8" else (100, 156)
    return rng.integers(lo, hi, size=n).astype(np.int32)


def _assert_same(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape
    if got.dtype.kind == "f":
        np.testing.assert_array_equal(got.view(f"u{got.itemsize}"), want.view(f"u{want.itemsize}"))
    else:
        np.testing.assert_array_equal(got, want)


# --- golden vectors -------------------------------------------------------------------------

def test_onnx_golden_vector(backend):
    x = np.array([0, 2, 3, 1000, -254, -1000], np.float32)
    q = gpuq.quantize(backend.put(x), 2.0, 128, dtype="uint8")
    np.testing.assert_array_equal(backend.get(q), np.array([128, 129, 130, 255, 1, 0], np.uint8))


def test_ngraph_golden_vector(backend):
    q = np.array([0, 3, 128, 255], np.uint8)
    y = gpuq.dequantize(backend.put(q), 2.0, 128)
    np.testing.assert_array_equal(backend.get(y), np.array([-256, -250, 0, 254], np.float32))


# --- per-tensor / per-channel / multi-axis on odd shapes ------------------------------------

SHAPES_AXES = [
    ((), None),
    ((1,), None),
    ((17,), None),
    ((1025,), 0),
    ((4097,), -1),
    ((3, 17, 5), 0),
    ((3, 17, 5), 1),
    ((3, 17, 5), -1),
    ((3, 17, 5), (0, 2)),
    ((2, 3, 4, 5), (1, 3)),
    ((2, 1025), 1),
    ((1025, 3), -1),
    ((4, 600, 7), 1),
]


def _nparams(shape, axis):
    if axis is None:
        return ()
    axes = (axis,) if isinstance(axis, int) else axis
    return tuple(shape[a] for a in axes)


@pytest.mark.parametrize("shape,axis", SHAPES_AXES, ids=str)
@pytest.mark.parametrize("fdtype", FDTYPES)
@pytest.mark.parametrize("qdtype", QDTYPES)
@pytest.mark.parametrize("with_zp", [True, False], ids=["zp", "sym"])
def test_quantize_matches_reference(backend, shape, axis, fdtype, qdtype, with_zp):
    x = _data(shape, fdtype)
    n = _nparams(shape, axis)
    ct = np.float64 if fdtype == "float64" else np.float32
    s = _scales(n, ct)
    z = _zps(n, qdtype) if with_zp else None
    got = gpuq.quantize(backend.put(x), s, z, axis=axis, dtype=qdtype)
    _assert_same(backend.get(got), ref.quantize(x, s, z, axis=axis, dtype=qdtype))


@pytest.mark.parametrize("shape,axis", SHAPES_AXES, ids=str)
@pytest.mark.parametrize("fdtype", FDTYPES)
@pytest.mark.parametrize("qdtype", QDTYPES)
@pytest.mark.parametrize("with_zp", [True, False], ids=["zp", "sym"])
def test_dequantize_matches_reference(backend, shape, axis, fdtype, qdtype, with_zp):
    lo, hi = (-128, 128) if qdtype == "int8" else (0, 256)
    q = RNG.integers(lo, hi, size=shape).astype(qdtype)
    n = _nparams(shape, axis)
    ct = np.float64 if fdtype == "float64" else np.float32
    s = _scales(n, ct)
    z = _zps(n, qdtype) if with_zp else None
    got = gpuq.dequantize(backend.put(q), s, z, axis=axis, dtype=fdtype)
    _assert_same(backend.get(got), ref.dequantize(q, s, z, axis=axis, dtype=fdtype))


# --- every block layout of the NumPy engine (and big enough to use threads) -----------------

# (shape, axis): per-tensor flat, rows longer than a block, rows of a few hundred,
# short rows with a short period, short rows with many channels, n-d broadcast.
LAYOUTS = [
    ((300_001,), None),
    ((3, 70_001), 0),
    ((257, 1_031), 0),
    ((1_031, 257), 1),
    ((43_691, 3), 1),
    ((9, 4_099, 5), 1),
    ((70_001, 2), 0),
    ((50, 7, 41, 13), (0, 2)),
]


@pytest.mark.parametrize("shape,axis", LAYOUTS, ids=str)
@pytest.mark.parametrize("with_zp", [True, False], ids=["zp", "sym"])
def test_block_layouts(backend, shape, axis, with_zp):
    x = _data(shape, np.float32)
    n = _nparams(shape, axis)
    s = _scales(n)
    z = _zps(n, "uint8") if with_zp else None
    got = gpuq.quantize(backend.put(x), s, z, axis=axis, dtype="uint8")
    want = ref.quantize(x, s, z, axis=axis, dtype="uint8")
    _assert_same(backend.get(got), want)
    back = gpuq.dequantize(got, s, z, axis=axis)
    _assert_same(backend.get(back), ref.dequantize(want, s, z, axis=axis))


def test_threads_do_not_change_results(backend):
    x = _data((5, 131_073), np.float32)
    s, z = _scales(5), _zps(5, "int8")
    before = gpuq.get_num_threads()
    try:
        results = []
        for n in (1, 2, 3):
            gpuq.set_num_threads(n)
            results.append(backend.get(gpuq.quantize(backend.put(x), s, z, axis=0)))
    finally:
        gpuq.set_num_threads(before)
    for r in results[1:]:
        _assert_same(r, results[0])
    _assert_same(results[0], ref.quantize(x, s, z, axis=0))


# --- ties, special values, saturation, zero-point extremes ----------------------------------

@pytest.mark.parametrize("fdtype", ["float32", "float64"])
def test_exact_and_near_ties(backend, fdtype):
    s = np.array(0.1, fdtype)  # not a power of two: ties only where x / s rounds onto k + 0.5
    k = np.arange(-130, 130, dtype=fdtype) + 0.5
    x = (k * s).astype(fdtype)
    x = np.concatenate([x, np.nextafter(x, np.inf), np.nextafter(x, -np.inf)])
    for qdtype, zp in (("int8", None), ("int8", 3), ("uint8", 128), ("uint8", 7)):
        got = backend.get(gpuq.quantize(backend.put(x), s, zp, dtype=qdtype))
        _assert_same(got, ref.quantize(x, s, zp, dtype=qdtype))


def test_ties_made_by_the_float32_division(backend):
    """x / s lands on k + 0.5 only after rounding to float32: the tie must be broken to even.

    A backend that divides in float64 and rounds that quotient (no float32
    rounding in between) gets these wrong; the data holds hundreds of them.
    """
    rng = np.random.default_rng(5)
    s = rng.uniform(0.01, 1, 20000).astype(np.float32)
    k = rng.integers(-128, 128, 20000).astype(np.float32) + np.float32(0.5)
    x = k * s  # float32 product, rounded: the exact quotient is near k + 0.5, rarely on it
    made_ties = (x / s == k) & (x.astype(np.float64) / s.astype(np.float64) != k)
    assert made_ties.sum() > 100
    got = backend.get(gpuq.quantize(backend.put(x), s, axis=0))
    _assert_same(got, ref.quantize(x, s, axis=0))


def test_power_of_two_ties_round_half_even(backend):
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, 127.5, -127.5, -128.5], np.float32)
    got = backend.get(gpuq.quantize(backend.put(x), 1.0))
    np.testing.assert_array_equal(got, np.array([0, 2, 2, 0, -2, -2, 126, 127, -128, -128], np.int8))


def test_odd_zero_point_tie_uses_onnx_order(backend):
    # rint(2.5) + 1 = 3 (ONNX: round, then add); oneDNN's rint(2.5 + 1) would give 4.
    got = backend.get(gpuq.quantize(backend.put(np.array([2.5], np.float32)), 1.0, 1))
    np.testing.assert_array_equal(got, [3])


@pytest.mark.parametrize("qdtype,zp", [("int8", None), ("int8", -5), ("uint8", 128), ("uint8", 300)])
def test_nan_inf_and_saturation(backend, qdtype, zp):
    f32 = np.finfo(np.float32)
    x = np.array([np.nan, np.inf, -np.inf, f32.max, -f32.max, 1e30, -1e30, 3e9, -3e9, 0.0, -0.0],
                 np.float32)
    got = backend.get(gpuq.quantize(backend.put(x), 0.5, zp, dtype=qdtype))
    want = ref.quantize(x, 0.5, zp, dtype=qdtype)
    _assert_same(got, want)
    qmin, qmax = ref.QRANGE[np.dtype(qdtype)]
    z = 0 if zp is None else zp
    assert got[0] == np.clip(z, qmin, qmax)  # NaN -> zero point
    assert got[1] == qmax and got[2] == qmin


def test_nan_in_every_layout_block(backend):
    x = _data((2, 70_001), np.float32)
    x[0, ::997] = np.nan
    x[1, 5] = np.nan
    z = np.array([3, -7], np.int32)
    got = backend.get(gpuq.quantize(backend.put(x), [1.0, 2.0], z, axis=0))
    _assert_same(got, ref.quantize(x, [1.0, 2.0], z, axis=0))
    assert (got[0, ::997] == 3).all() and got[1, 5] == -7


def test_subnormals_are_numbers(backend):
    tiny = np.finfo(np.float32).smallest_subnormal
    x = np.array([tiny, 3 * tiny, -5 * tiny, 1e-39], np.float32)
    got = backend.get(gpuq.quantize(backend.put(x), tiny))
    np.testing.assert_array_equal(got, [1, 3, -5, 127])
    y = backend.get(gpuq.dequantize(backend.put(np.array([1, -3], np.int8)), tiny))
    np.testing.assert_array_equal(y, np.array([tiny, -3 * tiny], np.float32))


def test_float16_input_and_output(backend):
    x = np.array([65504, -65504, 0.000061, 6e-8, np.nan, 1.5, 2.5], np.float16)
    got = backend.get(gpuq.quantize(backend.put(x), 0.01, 3))
    _assert_same(got, ref.quantize(x, 0.01, 3))
    y = backend.get(gpuq.dequantize(backend.put(np.array([127, -128, 1], np.int8)), 1000.0, dtype="f16"))
    _assert_same(y, ref.dequantize(np.array([127, -128, 1], np.int8), 1000.0, dtype=np.float16))
    assert np.isinf(y[0]) and np.isinf(y[1])  # overflow of the float16 range is Inf, like a cast


# +-2**30 and one beyond: the CUDA kernels' int32 bounds hold up to |zp| = 2**30, 64-bit ones beyond.
ZP_EXTREMES = [-(2**31), 2**31 - 1, 2**23, 2**23 + 1, -(2**23) - 1, 2**24 + 3, -(2**30), 2**30, 2**30 + 1,
               -(2**30) - 1]


@pytest.mark.parametrize("zp", ZP_EXTREMES)
@pytest.mark.parametrize("qdtype", QDTYPES)
def test_zero_point_extremes_quantize(backend, zp, qdtype):
    s = np.float32(1.0)
    near = np.array([-zp - 130, -zp - 128, -zp - 1, -zp, -zp + 1, -zp + 127, -zp + 255, -zp + 300],
                    np.float64)
    x = np.concatenate([near, [0.0, 1e12, -1e12, np.inf, -np.inf, np.nan, 2.0**31, -(2.0**32)]])
    x = x.astype(np.float32)
    got = backend.get(gpuq.quantize(backend.put(x), s, zp, dtype=qdtype))
    _assert_same(got, ref.quantize(x, s, zp, dtype=qdtype))


@pytest.mark.parametrize("zp", ZP_EXTREMES)
@pytest.mark.parametrize("fdtype", FDTYPES)
def test_zero_point_extremes_dequantize(backend, zp, fdtype):
    q = np.array([-128, -1, 0, 1, 127], np.int8)
    got = backend.get(gpuq.dequantize(backend.put(q), 0.75, zp, dtype=fdtype))
    _assert_same(got, ref.dequantize(q, 0.75, zp, dtype=fdtype))


def test_mixed_narrow_and_wide_zero_points_per_channel(backend):
    x = _data((4, 1000), np.float32)
    z = np.array([0, 2**31 - 1, -5, -(2**31)], np.int32)
    s = _scales(4)
    got = backend.get(gpuq.quantize(backend.put(x), s, z, axis=0, dtype="uint8"))
    _assert_same(got, ref.quantize(x, s, z, axis=0, dtype="uint8"))
    z = np.array([2**30, -(2**30) - 1, 2**30 + 1, -(2**30)], np.int32)  # both sides of the int32 path's edge
    got = backend.get(gpuq.quantize(backend.put(x * 2e9), s, z, axis=0, dtype="int8"))
    _assert_same(got, ref.quantize(x * 2e9, s, z, axis=0, dtype="int8"))


# --- views, out=, no mutation, empty --------------------------------------------------------

VIEWS = {
    "transposed": lambda a: a.T,
    "strided": lambda a: a[::2, 1::3],
    "reversed": lambda a: a[::-1, ::-1],
    "offset": lambda a: a[1:, 3:],
    "column": lambda a: a[:, 7],
}


@pytest.mark.parametrize("view", VIEWS, ids=str)
@pytest.mark.parametrize("axis", [None, 0, -1])
def test_non_contiguous_inputs(backend, view, axis):
    base = _data((41, 1025), np.float32)
    x = VIEWS[view](base)
    n = _nparams(x.shape, axis)
    s, z = _scales(n), _zps(n, "int8")
    dev = VIEWS[view](backend.put(base))
    got = gpuq.quantize(dev, s, z, axis=axis)
    want = ref.quantize(np.ascontiguousarray(x), s, z, axis=axis)
    _assert_same(backend.get(got), want)
    qbase = backend.put(ref.quantize(base, 1.0))
    qv = VIEWS[view](qbase)
    y = gpuq.dequantize(qv, s, z, axis=axis)
    _assert_same(backend.get(y), ref.dequantize(backend.get(qv), s, z, axis=axis))


def test_out_is_written_and_returned(backend):
    x = _data((17, 33), np.float32)
    out = backend.put(np.zeros((17, 33), np.uint8))
    res = gpuq.quantize(backend.put(x), 0.5, 100, out=out)
    assert res is out
    _assert_same(backend.get(out), ref.quantize(x, 0.5, 100, dtype=np.uint8))
    yout = backend.put(np.zeros((17, 33), np.float64))
    res = gpuq.dequantize(out, 0.5, 100, out=yout)
    assert res is yout
    _assert_same(backend.get(yout), ref.dequantize(backend.get(out), 0.5, 100, dtype=np.float64))


def test_non_contiguous_out(backend):
    x = _data((40, 50), np.float32)
    big = backend.put(np.full((40, 100), 7, np.int8))
    out = big[:, ::2]
    gpuq.quantize(backend.put(x), 2.0, out=out)
    full = backend.get(big)
    _assert_same(full[:, ::2], ref.quantize(x, 2.0))
    assert (full[:, 1::2] == 7).all()  # untouched between the strided elements


def test_inputs_are_not_modified(backend):
    x = _data((5, 300), np.float32)
    x[0, 0] = np.nan
    s, z = _scales(5), _zps(5, "int8")
    xs, ss, zs = x.copy(), s.copy(), z.copy()
    dev = backend.put(x)
    q1 = backend.get(gpuq.quantize(dev, s, z, axis=0))
    q2 = backend.get(gpuq.quantize(dev, s, z, axis=0))
    _assert_same(q1, q2)  # idempotent
    _assert_same(backend.get(dev), xs)
    _assert_same(s, ss)
    _assert_same(z, zs)
    qdev = backend.put(q1)
    gpuq.dequantize(qdev, s, z, axis=0)
    _assert_same(backend.get(qdev), q1)


@pytest.mark.parametrize("shape,axis", [((0,), None), ((0, 5), 1), ((3, 0), 0), ((2, 0, 4), (0, 2))])
def test_empty_tensors(backend, shape, axis):
    n = _nparams(shape, axis)
    s = np.ones(n, np.float32)
    q = gpuq.quantize(backend.put(np.zeros(shape, np.float32)), s, axis=axis, dtype="u8")
    assert q.shape == shape and q.dtype == np.uint8
    y = gpuq.dequantize(q, s, axis=axis, dtype="f64")
    assert y.shape == shape and y.dtype == np.float64


def test_scalar_and_list_parameters(backend):
    x = _data((3, 4), np.float32)
    a = backend.get(gpuq.quantize(backend.put(x), 0.5, 3))
    b = backend.get(gpuq.quantize(backend.put(x), [0.5], [3]))
    c = backend.get(gpuq.quantize(backend.put(x), np.array([0.5], np.float32), np.array([3], np.uint8)))
    d = backend.get(gpuq.quantize(backend.put(x), [0.5, 0.5, 0.5, 0.5], [3, 3, 3, 3], axis=1))
    for r in (b, c, d):
        _assert_same(r, a)


def test_float64_scales_round_to_float32_for_float32_src(backend):
    # Scales are float32 for float32 src: a float64 scale is rounded once, like ONNX's y_scale.
    x = np.array([1.0, 2.0, 3.0], np.float32)
    s64 = 1.0 / 3.0
    got = backend.get(gpuq.quantize(backend.put(x), s64))
    _assert_same(got, ref.quantize(x, np.float32(s64)))


def test_dtype_names(backend):
    x = _data((9,), np.float32)
    for name in ("int8", "s8", np.int8, np.dtype("int8")):
        assert gpuq.quantize(backend.put(x), 1.0, dtype=name).dtype == np.int8
    for name in ("uint8", "u8", "U8", np.uint8):
        assert gpuq.quantize(backend.put(x), 1.0, dtype=name).dtype == np.uint8
    q = gpuq.quantize(backend.put(x), 1.0)
    for name, want in (("f32", np.float32), ("f16", np.float16), ("float64", np.float64)):
        assert gpuq.dequantize(q, 1.0, dtype=name).dtype == want


def test_dtype_follows_out(backend):
    x = _data((9,), np.float32)
    out = backend.put(np.empty(9, np.uint8))
    assert gpuq.quantize(backend.put(x), 1.0, 128, out=out).dtype == np.uint8


@pytest.mark.parametrize("qdtype,zp", [("int8", None), ("uint8", 128), ("int8", -3)])
def test_every_float16_bit_pattern(backend, qdtype, zp):
    x = np.arange(2**16, dtype=np.uint16).view(np.float16)  # NaNs, Infs, subnormals, both zeros
    for s in (np.float32(0.01), np.float32(3.0)):
        got = backend.get(gpuq.quantize(backend.put(x), s, zp, dtype=qdtype))
        _assert_same(got, ref.quantize(x, s, zp, dtype=qdtype))
    view = x.reshape(256, 256)[::3, ::-2]
    got = backend.get(gpuq.quantize(backend.put(x).reshape(256, 256)[::3, ::-2], 0.5, zp, dtype=qdtype))
    _assert_same(got, ref.quantize(np.ascontiguousarray(view), 0.5, zp, dtype=qdtype))


def _threads_of_one_call(x, s, z):
    """The threads that ran blocks of one host quantize call, and its codes."""
    from gpuq.backends.host import threads as host

    seen = set()
    real = host.run_range

    def recording(work, block_fn):
        seen.add(threading.get_ident())
        real(work, block_fn)

    host.run_range = recording
    try:
        q = gpuq.quantize(x, s, z, axis=0)
    finally:
        host.run_range = real
    return len(seen), q


def test_thread_share_caps_a_call_and_the_pool_stays_the_process_size():
    """``thread_share(n)``: calls on that thread use at most n threads (the Dask chunk tasks'
    share); the pool, even when a capped call creates it, serves uncapped calls in full."""
    from gpuq.backends.host import threads as host

    x = _data((4, 4 * 131_072 + 17), np.float32)
    s, z = _scales(4), _zps(4, "int8")
    want = ref.quantize(x, s, z, axis=0)
    before = gpuq.get_num_threads()
    try:
        gpuq.set_num_threads(4)  # also drops the pool: the capped call below creates it
        for share, most in ((1, 1), (2, 2), (9, 4)):
            with host.thread_share(share):
                assert gpuq.get_num_threads() == most
                used, q = _threads_of_one_call(x, s, z)
            assert 1 <= used <= most
            _assert_same(q, want)
        assert gpuq.get_num_threads() == 4
        # A pool sized by its first (capped) caller would serve 2 threads at most.
        assert host.executor()._max_workers == 3
        with host.thread_share(2), host.thread_share(3):  # nested: the smaller share
            assert gpuq.get_num_threads() == 2
        _assert_same(gpuq.quantize(x, s, z, axis=0), want)
    finally:
        gpuq.set_num_threads(before)
