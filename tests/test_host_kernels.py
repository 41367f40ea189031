"""The compiled host kernels (numba) on their own: layouts, float16 rounding, the switch.

Every shared test body also runs through them (the ``numba`` parameter of the
``backend`` fixture); these tests pin what those cannot reach directly.
"""

from __future__ import annotations

import numpy as np
import pytest

import gpuq
import formats_reference as FR
import reference as ref
from conftest import host_kernels, require_numba
from gpuq.backends.host import blocks, choice

RNG = np.random.default_rng(23)


@pytest.fixture
def kernels():
    require_numba()
    from gpuq.backends.host import loops

    return loops


def _float32_around_float16_boundaries():
    """float32 bit patterns at every place a float16 rounding can go wrong.

    Normal range: the 13 bits float16 drops, at 0, 1, just below/at/above the
    tie (0x1000) and at the top, for every sign/exponent/upper mantissa.
    Subnormal float16 range: the ties k/2 * 2**-24 and their neighbours.
    Plus zeros, infinities, NaN, float32 subnormals and random patterns.
    """
    upper = np.arange(1 << 19, dtype=np.uint32) << np.uint32(13)
    low = np.array([0, 1, 0xFFF, 0x1000, 0x1001, 0x1FFF], np.uint32)
    normal = (upper[:, None] | low[None, :]).ravel()
    halves = (np.arange(2 * 1024 + 1, dtype=np.float32) * np.float32(2.0**-25)).view(np.uint32)
    near = (halves[:, None].astype(np.int64) + np.arange(-2, 3)).clip(0).astype(np.uint32).ravel()
    near = np.concatenate([near, near | np.uint32(0x80000000)])
    special = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 1, 0x007FFFFF,
                        0x477FE000, 0x477FEFFF, 0x477FF000, 0x477FF001, 0x38800000, 0x387FFFFF], np.uint32)
    rand = RNG.integers(0, 2**32, 1 << 20, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([normal, near, special, rand]).view(np.float32)


def test_float16_rounding_equals_numpy_cast(kernels):
    """float32 -> float16, nearest even, through the dequantize kernel's store (s = 1)."""
    f = _float32_around_float16_boundaries()
    got = np.empty(f.size, np.uint16)
    _store_all(kernels, f, got)
    with np.errstate(over="ignore", invalid="ignore"):
        want = f.astype(np.float16)
    nan = np.isnan(want)
    np.testing.assert_array_equal(got[~nan], want.view(np.uint16)[~nan])
    assert np.isnan(got.view(np.float16)[nan]).all()


def _store_all(kernels, f, out_bits):
    from numba import njit

    @njit
    def store_every(values, out):
        for i in range(values.size):
            kernels.store(out, i, values[i])

    store_every(f, out_bits)


@pytest.mark.parametrize("size,run,nparams", [(1, 1, 1), (17, 1, 5), (1025, 1, 64), (4097, 7, 9),
                                              (4097, 100, 41), (4097, 4097, 1), (4097, 4000, 1)])
@pytest.mark.parametrize("with_zp", [True, False], ids=["zp", "sym"])
def test_kernel_parameter_index_is_i_div_run_mod_nparams(kernels, size, run, nparams, with_zp):
    """Partial last runs and patterns that do not divide the block, against the naive formula."""
    x = RNG.normal(0, 50, size).astype(np.float32)
    x[::13] = np.float32(2.5)  # a tie at s = 1
    x[::31] = np.nan
    s = RNG.uniform(0.5, 2, nparams).astype(np.float32)
    s[0] = 1
    z = RNG.integers(-30, 30, nparams).astype(np.int32) if with_zp else None
    idx = (np.arange(size) // run) % nparams
    q = np.empty(size, np.int8)
    zf = None if z is None else z.astype(np.float32)  # the kernels take integral floats
    kernels.quantize(x, None, q, run, s, zf, -128, 127)
    want = ref.quantize(x, s[idx], None if z is None else z[idx], axis=0)
    np.testing.assert_array_equal(q, want)
    y = np.empty(size, np.float32)
    kernels.dequantize(q, y, run, s, zf)
    np.testing.assert_array_equal(y, ref.dequantize(q, s[idx], None if z is None else z[idx], axis=0))


def _minmax_cases():
    """(rows, run) problems with NaN, signed zeros, infinities, subnormals and all-NaN rows."""
    rng = np.random.default_rng(3)
    x = rng.normal(0, 10, (9, 37)).astype(np.float32)
    x[0] = np.nan  # no number: NaN for both
    x[1, ::2] = np.nan
    x[2] = [-0.0, 0.0] * 18 + [-0.0]
    x[3, 5], x[3, 6] = np.inf, -np.inf
    x[4] = np.float32(1e-45) * np.arange(-18, 19)  # subnormals
    x[5, :] = -3.0
    x[6, 0] = -np.nan  # a NaN with the sign bit set must not win the min
    return x


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_compiled_row_minmax_equals_fmin_fmax(kernels, dtype):
    from gpuq.backends.host.qparams import row_minmax

    x = _minmax_cases().astype(dtype)
    lo, hi = row_minmax(x, kernels)
    assert lo.dtype == hi.dtype == x.dtype
    np.testing.assert_array_equal(lo, np.fmin.reduce(x, axis=1))  # NaN == NaN here; -0.0 == 0.0
    np.testing.assert_array_equal(hi, np.fmax.reduce(x, axis=1))


@pytest.mark.parametrize("scale_dtype", ["float32", "bfloat16", "float16"])
def test_finalize_one_equals_numpy_finalize(kernels, scale_dtype):
    """The compiled kernel's scalar finalize against host_qparams.finalize, bit for bit, the
    scales rounded to each scale dtype (slots whose rounded scale is 0 or +inf fail in both)."""
    from numba import njit

    from gpuq.backends.host.qparams import SCALE_FORMATS, finalize

    f32 = np.finfo(np.float32)
    rng = np.random.default_rng(9)
    edges = np.array([0.0, -0.0, f32.tiny, -f32.tiny, 1e-45, -1e-45, 1.0, -1.0, 1e30, -1e30, f32.max, -f32.max,
                      np.nan, np.inf, -np.inf], np.float32)
    lo = np.concatenate([np.repeat(edges, edges.size), rng.normal(0, 1, 20000).astype(np.float32) * 10.0 **
                         rng.integers(-40, 38, 20000).astype(np.float32)]).astype(np.float32)
    hi = np.concatenate([np.tile(edges, edges.size), rng.normal(0, 1, 20000).astype(np.float32) * 10.0 **
                         rng.integers(-40, 38, 20000).astype(np.float32)]).astype(np.float32)
    lo, hi = np.fmin(lo, hi), np.fmax(lo, hi)  # a min above its max does not occur
    fmt = SCALE_FORMATS[scale_dtype]

    @njit
    def finalize_all(lo, hi, qmin, qmax, symmetric, eps, fmt, scales, zps, ok):
        for i in range(lo.size):
            scales[i], zps[i], ok[i] = kernels.finalize_one(lo[i], hi[i], qmin, qmax, symmetric, eps, fmt)

    eps = np.float32(f32.tiny if scale_dtype != "float16" else 2.0**-24)
    for qmin, qmax in ((-128, 127), (0, 255)):
        for symmetric in (False, True):
            s, z = np.empty(lo.size, np.float32), np.empty(lo.size, np.int32)
            ok = np.empty(lo.size, np.bool_)
            finalize_all(lo, hi, qmin, qmax, symmetric, eps, fmt, s, z, ok)
            # The slots the scale dtype cannot hold fail alone, in finalize as in the loop.
            for i in np.flatnonzero(~ok)[:50]:
                with pytest.raises(ValueError, match="cannot hold the scale|must be finite"):
                    finalize(lo[i:i + 1], hi[i:i + 1], qmin, qmax, symmetric, eps, scale_dtype)
            infinite = (lo == -np.inf) | (hi == np.inf)
            # float16: 65504 at most
            assert ok.sum() > 5000 and ok[~infinite].all() == (scale_dtype != "float16")
            want_s, want_z = finalize(lo[ok], hi[ok], qmin, qmax, symmetric, eps, scale_dtype)
            np.testing.assert_array_equal(s[ok].view(np.uint32), want_s.view(np.uint32))
            if want_z is not None:
                np.testing.assert_array_equal(z[ok], want_z)
            # Unchecked (check_values=False): every slot, +/-inf bounds and failed scales included.
            all_s, all_z = finalize(lo, hi, qmin, qmax, symmetric, eps, scale_dtype, strict=False, finite=False)
            np.testing.assert_array_equal(s.view(np.uint32), all_s.view(np.uint32))
            if all_z is not None:
                np.testing.assert_array_equal(z, all_z)
            assert infinite.sum() > 20 and not ok[infinite].any() and (s[infinite] == np.inf).all()
            if not symmetric:
                assert (z[infinite] == 0).all()


def test_runs_layouts():
    x = np.zeros((100, 5, 40), np.float32)  # above blocks.SMALL: short runs get widened
    o = np.zeros((100, 5, 40), np.int8)
    # per-tensor: one run
    assert blocks.runs(x, o, [np.float32(2)])[2].run == x.size
    # per-channel on the middle axis: runs of 40, 5 parameters repeating
    _, _, (run, (p,)) = blocks.runs(x, o, [np.arange(5.0).reshape(1, 5, 1)])
    assert run == 40 and p.tolist() == [0, 1, 2, 3, 4]
    # two adjacent dims: runs of 40 over 30 parameters; fewer dims broadcast on the left
    _, _, (run, (p,)) = blocks.runs(x, o, [np.arange(500.0).reshape(100, 5, 1)])
    assert run == 40 and p.size == 500
    # runs shorter than RUN_MIN become one parameter per element; short periods are tiled
    short = np.zeros((1000, 5, 4), np.float32)
    _, _, (run, (p,)) = blocks.runs(short, short, [np.arange(5.0).reshape(1, 5, 1)])
    assert run == 1 and p.size >= blocks.PERIOD_MIN and p.size % 20 == 0
    np.testing.assert_array_equal(p[:20], np.repeat(np.arange(5.0), 4))
    # ... but not in a small block, where widening costs more than it saves
    _, _, (run, (p,)) = blocks.runs(short[:10], short[:10], [np.arange(5.0).reshape(1, 5, 1)])
    assert run == 4 and p.size == 5
    _, _, (run, (p,)) = blocks.runs(x, o, [np.arange(200.0).reshape(5, 40)])
    assert run == 1 and p.size % 200 == 0 and p.size >= blocks.PERIOD_MIN
    # not flat: parameters on two non-adjacent dims, a strided src or out
    assert blocks.runs(x, o, [np.ones((100, 1, 40))]) is None
    assert blocks.runs(x[:, ::2], o[:, ::2], [np.float32(1)]) is None
    assert blocks.runs(x, o.transpose(0, 2, 1).copy().transpose(0, 2, 1), [np.float32(1)]) is None


@pytest.mark.parametrize("shape,axis", [((50001, 3), 1), ((9999, 8), -1), ((300, 7, 2), 1), ((40, 6000, 3), 1),
                                        ((30, 500, 20), 1), ((100, 70), 0), ((3, 70001), 0), ((2, 5, 70000), 1)],
                         ids=str)
def test_short_periods_and_runs_exact(small_kernel_blocks, host_loops, shape, axis):
    """The widened layouts (tiled short patterns, expanded short runs), on blocks that cut periods."""
    x = RNG.normal(0, 60, shape).astype(np.float32)
    x.reshape(-1)[::97] = np.nan
    n = shape[axis]
    s = RNG.uniform(0.5, 2, n).astype(np.float32)
    z = RNG.integers(-20, 20, n).astype(np.int32)
    q = gpuq.quantize(x, s, z, axis=axis)
    np.testing.assert_array_equal(q, ref.quantize(x, s, z, axis=axis))
    np.testing.assert_array_equal(gpuq.dequantize(q, s, z, axis=axis), ref.dequantize(q, s, z, axis=axis))


@pytest.fixture
def small_kernel_blocks(monkeypatch):
    """Blocks of 4096 (not a multiple of most periods here) and threads on small inputs."""
    monkeypatch.setattr(blocks, "BLOCK", 4096)
    monkeypatch.setattr(blocks, "SMALL", 0)
    monkeypatch.setattr("gpuq.backends.host.threads.PARALLEL_MIN", 0)


def test_strided_and_multi_axis_blocks_fall_back_exactly(host_loops):
    """Blocks the kernels do not take go through the ufunc loop with the same bits."""
    base = RNG.normal(0, 60, (9, 40, 6)).astype(np.float32)
    for x, axis, pshape in [(base[:, ::3], 1, (14,)), (base, (0, 2), (9, 6)), (base.transpose(2, 0, 1), 0, (6,))]:
        s = RNG.uniform(0.5, 2, pshape).astype(np.float32)
        z = RNG.integers(-20, 20, pshape).astype(np.int32)
        q = gpuq.quantize(x, s, z, axis=axis)
        np.testing.assert_array_equal(q, ref.quantize(x, s, z, axis=axis))
        y = gpuq.dequantize(q, s, z, axis=axis, dtype="float16")
        np.testing.assert_array_equal(y, ref.dequantize(q, s, z, axis=axis, dtype="float16"))


def test_set_host_kernels_validates_restores_and_reports():
    before = gpuq.get_host_kernels()
    previous = gpuq.set_host_kernels("numpy")
    try:
        assert gpuq.get_host_kernels() == "numpy"
        with pytest.raises(ValueError, match=r"name must be one of auto, numba, numpy, got 'fast'"):
            gpuq.set_host_kernels("fast")
        with pytest.raises(ValueError, match="got 3"):
            gpuq.set_host_kernels(3)
        assert gpuq.get_host_kernels() == "numpy"  # a refused name changes nothing
    finally:
        assert gpuq.set_host_kernels(previous) == "numpy"
    assert gpuq.get_host_kernels() == before


def test_without_numba_auto_uses_ufuncs_and_numba_is_refused(monkeypatch):
    monkeypatch.setattr(choice, "_kernels", False)  # as if numba failed to import
    monkeypatch.setattr(choice, "_choice", "auto")
    assert gpuq.get_host_kernels() == "numpy"
    x = RNG.normal(size=1000).astype(np.float32)
    np.testing.assert_array_equal(gpuq.quantize(x, 0.01, 3), ref.quantize(x, np.float32(0.01), np.int32(3)))
    with pytest.raises(ValueError, match=r"name='numba' needs numba: pip install 'gpuq\[fast\]'"):
        gpuq.set_host_kernels("numba")


def test_kernels_that_fail_to_load_fall_back_with_a_warning(monkeypatch):
    """numba present but unusable (e.g. its cache has nowhere to go): a warning, then ufuncs."""
    def broken():
        raise RuntimeError("cannot cache function 'quantize': no locator available")

    monkeypatch.setattr(choice, "_import_kernels", broken)
    monkeypatch.setattr(choice, "_kernels", None)
    monkeypatch.setattr(choice, "_choice", "auto")
    x = RNG.normal(size=100).astype(np.float32)
    with pytest.warns(RuntimeWarning, match="compiled host kernels did not load .*no locator"):
        q = gpuq.quantize(x, 0.05)
    np.testing.assert_array_equal(q, ref.quantize(x, np.float32(0.05)))
    assert gpuq.get_host_kernels() == "numpy"


@pytest.mark.parametrize("value,want", [("numpy", "numpy"), ("", None), ("NumPy", "numpy")])
def test_environment_variable(monkeypatch, value, want):
    monkeypatch.setattr(choice, "_choice", None)
    monkeypatch.setenv("GPUQ_HOST_KERNELS", value)
    assert gpuq.get_host_kernels() == (want or ("numba" if choice.available() else "numpy"))
    monkeypatch.setattr(choice, "_choice", None)


def test_environment_variable_is_validated(monkeypatch):
    monkeypatch.setattr(choice, "_choice", None)
    monkeypatch.setenv("GPUQ_HOST_KERNELS", "cython")
    with pytest.raises(ValueError, match="GPUQ_HOST_KERNELS must be one of auto, numba, numpy, got 'cython'"):
        gpuq.quantize(np.ones(3, np.float32), 1.0)
    monkeypatch.setattr(choice, "_choice", None)


_DIRECT = [  # (shape, axis, group_size, view): small calls the kernels take without blocks or plans
    ((1,), None, None, None),
    ((4097,), None, None, None),
    ((17, 33), 0, None, None),
    ((5, 17, 9), 1, None, None),
    ((9, 1025), -1, None, None),
    ((3, 4, 5, 7), (1, 2), None, None),   # adjacent axes: one merged channel dim
    ((6, 1, 40), 2, 8, None),             # full groups along the last axis
    ((64, 64), 0, None, "rows"),          # a contiguous view at an offset
    ((17, 33), 1, None, "wide_zp"),       # zero points beyond NARROW_ZP (the ufuncs' wide path)
]
_PLANNED = [  # ... and those that still go through the block plans (the same bits)
    ((17, 33), 0, None, "strided"),
    ((5, 17, 9), (0, 2), None, None),     # parameters on non-adjacent dims
    ((6, 41), 1, 8, None),                # a ragged last group
    ((200, 100), 1, None, None),          # above blocks.SMALL
]


def _small_case(shape, axis, group_size, view):
    x = RNG.normal(0, 50, shape).astype(np.float32)
    x.reshape(-1)[::13] = np.nan
    x.reshape(-1)[1::29] = 2.5  # a tie at s = 1
    if view == "rows":
        x = x[1:]
    elif view == "strided":
        x = x[:, ::2]
    pshape = gpuq._scheme.Scheme.build(x.shape, axis, group_size).param_shape
    s = RNG.uniform(0.5, 2, pshape).astype(np.float32)
    s.reshape(-1)[:1] = 1.0
    zmax = 2**30 if view == "wide_zp" else 100
    z = RNG.integers(-zmax, zmax, pshape).astype(np.int32)
    return x, s, z


@pytest.mark.parametrize("shape,axis,group_size,view", _DIRECT + _PLANNED, ids=str)
@pytest.mark.parametrize("code,out_dtype", [("int8", "float32"), ("uint8", "float16")])
def test_small_calls_skip_the_plans_where_they_can(host_loops, monkeypatch, shape, axis, group_size, view,
                                                   code, out_dtype):
    from gpuq.backends.host import affine as host_backend

    planned = []
    plans = host_backend.plans
    monkeypatch.setattr(host_backend, "plans", lambda *a, **k: planned.append(1) or plans(*a, **k))
    x, s, z = _small_case(shape, axis, group_size, view)
    kw = {"axis": axis, "group_size": group_size}
    q = gpuq.quantize(x, s, z, dtype=code, **kw)
    y = gpuq.dequantize(q, s, z, dtype=out_dtype, **kw)
    y16 = gpuq.dequantize(q, s, None, dtype="float16", **kw)
    np.testing.assert_array_equal(q, ref.quantize(x, s, z, dtype=code, **kw))
    np.testing.assert_array_equal(y, ref.dequantize(q, s, z, dtype=out_dtype, **kw))
    np.testing.assert_array_equal(y16, ref.dequantize(q, s, None, dtype="float16", **kw))
    assert bool(planned) == ((shape, axis, group_size, view) in _PLANNED)


@pytest.mark.parametrize("shape", [(7, 1025), (40, 1000)], ids=["small", "blocks"])
def test_float64_takes_the_kernels_with_any_int32_zero_point(kernels, monkeypatch, shape):
    """float64 holds rint(x / s) + zp exactly for every int32 zp: no ufunc fallback there."""
    from gpuq.backends.host import affine as host_backend

    def no_ufuncs(*args, **kwargs):
        raise AssertionError("the ufunc loop ran")

    monkeypatch.setattr(host_backend, "quantize_block", no_ufuncs)
    monkeypatch.setattr(host_backend, "dequantize_block", no_ufuncs)
    s = RNG.uniform(0.5, 2, shape[1])
    z = RNG.choice(np.array([-(2**31), 2**31 - 1, 2**30, -(2**22) - 1, 5]), shape[1]).astype(np.int32)
    # Around -zp * s, where the codes are not all saturated: the big zps decide them.
    x = (RNG.uniform(-40, 300, shape) - z) * s
    x.reshape(-1)[::11] = np.nan
    with host_kernels("numba"):
        q = gpuq.quantize(x, s, z, axis=1, dtype="uint8")
        y = gpuq.dequantize(q, s, z, axis=1, dtype="float64")
    np.testing.assert_array_equal(q, ref.quantize(x, s, z, axis=1, dtype="uint8"))
    np.testing.assert_array_equal(y, ref.dequantize(q, s, z, axis=1, dtype="float64"))
    assert len(np.unique(q)) > 200  # mostly inside the range, not saturated


# --- Rows at a stride (issue 28's ragged groups and blocks): blocks.RowsPlan, loops.*_rows -----

def _wide(shape, extra=7, dtype=np.float32, seed=0):
    """``shape`` as a view of a wider array (its rows at a stride), values with ties and NaNs."""
    rng = np.random.default_rng(seed)
    base = (rng.standard_normal(shape[:-1] + (shape[-1] + extra,)) * 40).astype(np.float32)
    base.reshape(-1)[::13] = np.nan
    base.reshape(-1)[1::17] = rng.integers(-30, 30, base.reshape(-1)[1::17].size) + 0.5
    return base.astype(dtype)[..., :shape[-1]]


#: (shape, scheme, view): every piece's rows have >= blocks.ROW_MIN elements, so the compiled
#: path must serve every block through the rows wrappers (no ufunc block).
_ROWS = [
    ((17, 1100), dict(axis=1, group_size=128), None),        # whole groups: x[:, :1024] at stride 1100
    ((300, 200), dict(block_size=(128, 128)), None),         # ragged on both dims: 4 pieces
    ((5, 130, 100), dict(block_size=(2, 64, 64)), None),     # 3-D, ragged on every dim: 8 pieces
    ((33, 90), dict(block_size=(16, 48)), "wide"),           # a view of a wider array
    ((40, 100), dict(axis=1, group_size=64), "wide"),
    ((40, 100), dict(axis=0), "wide"),                       # per-channel on a strided view
    ((40, 100), dict(), "wide"),                             # per-tensor on a strided view
]
#: ... and odd sizes, short tails and transposed views: the same bits whichever loop serves.
_ODD = [
    ((1, 1025), dict(axis=1, group_size=128), None),
    ((3, 4097), dict(axis=1, group_size=1024), None),
    ((9, 1025), dict(block_size=(4, 128)), "wide"),
    ((17, 17), dict(block_size=(16, 16)), None),
    ((40, 100), dict(axis=1, group_size=32), "wide"),         # a tail of 4: the ufuncs' 2-D loop
    ((70, 90), dict(block_size=(16, 32)), "transposed"),
    ((70, 90), dict(axis=0, group_size=32), "transposed"),
]


def _input(shape, view, dtype=np.float32):
    if view == "transposed":
        return _wide(shape[::-1], extra=0, dtype=dtype).T
    if view == "wide":
        return _wide(shape, dtype=dtype)
    return np.ascontiguousarray(_wide(shape, dtype=dtype))


def _scheme_params(shape, scheme, zp_range=(-20, 20), seed=3):
    pshape = gpuq._scheme.Scheme.build(shape, **scheme).param_shape
    rng = np.random.default_rng(seed)
    return (rng.uniform(0.5, 2, pshape).astype(np.float32),
            rng.integers(*zp_range, pshape, endpoint=True).astype(np.int32))


@pytest.fixture
def rows_counted(monkeypatch):
    """Counts blocks through the rows wrappers; with ``no_ufuncs()``, a ufunc block fails the test."""
    from gpuq.backends.host import affine, formats

    counted = {"rows": 0}
    launch = affine.launch

    def counting(flat, each_row, rows, *args):
        counted["rows"] += rows is not None
        launch(flat, each_row, rows, *args)

    def no_ufuncs():
        def fail(*args, **kwargs):
            raise AssertionError("a ufunc block ran")
        for mod, name in ((affine, "quantize_block"), (affine, "dequantize_block"),
                          (formats, "_quantize_fp8_block"), (formats, "_dequantize_fp8_block")):
            monkeypatch.setattr(mod, name, fail)

    monkeypatch.setattr(affine, "launch", counting)
    counted["no_ufuncs"] = no_ufuncs
    return counted


@pytest.mark.parametrize("blocks_of", ["4096", "default"])
@pytest.mark.parametrize("shape,scheme,view", _ROWS + _ODD, ids=str)
def test_strided_rows_take_the_rows_wrappers_with_the_same_bits(host_loops, rows_counted, monkeypatch,
                                                                 shape, scheme, view, blocks_of):
    """int8 and uint8 with zero points, against the naive reference on both loops; with numba,
    the cases of _ROWS never reach a ufunc block and go through the rows wrappers."""
    if blocks_of == "4096":  # several blocks per piece, cut inside the rows, on two threads
        monkeypatch.setattr(blocks, "BLOCK", 4096)
        monkeypatch.setattr("gpuq.backends.host.threads.PARALLEL_MIN", 0)
    rows_only = host_loops == "numba" and (shape, scheme, view) in _ROWS
    if rows_only:
        rows_counted["no_ufuncs"]()
    x = _input(shape, view)
    for code, zp_range in (("int8", (-20, 20)), ("uint8", (100, 150))):
        s, z = _scheme_params(x.shape, scheme, zp_range)
        q = gpuq.quantize(x, s, z, dtype=code, **scheme)
        np.testing.assert_array_equal(q, ref.quantize(x, s, z, dtype=code, **scheme))
        q_t = np.ascontiguousarray(q.T).T  # a strided out as well as a strided src
        for dtype in ("float32", "float16"):
            want = ref.dequantize(q, s, z, dtype=dtype, **scheme)
            np.testing.assert_array_equal(gpuq.dequantize(q, s, z, dtype=dtype, **scheme), want)
            wide = np.empty(shape[:-1] + (shape[-1] + 5,), dtype)[..., :shape[-1]]
            gpuq.dequantize(q_t if view == "transposed" else q, s, z, dtype=dtype, out=wide, **scheme)
            np.testing.assert_array_equal(wide, want)
    assert rows_counted["rows"] > 0 or not rows_only


@pytest.mark.parametrize("shape,scheme,view", [_ROWS[1], _ROWS[2], _ROWS[3], _ODD[2]], ids=str)
def test_strided_rows_half_precision_and_fp8(host_loops, rows_counted, shape, scheme, view):
    """float16 and bfloat16 src and out, and fp8 codes, on the rows wrappers: the same bits."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    if host_loops == "numba" and (shape, scheme, view) in _ROWS:
        rows_counted["no_ufuncs"]()
    s, z = _scheme_params(shape, scheme)
    for dtype in (np.float16, ml_dtypes.bfloat16):
        x = _input(shape, view, dtype)
        x32 = x.astype(np.float32)  # exact
        q = gpuq.quantize(x, s, z, **scheme)
        np.testing.assert_array_equal(q, ref.quantize(x32, s, z, **scheme))
        want = ref.dequantize(q, s, z, dtype=np.float32, **scheme).astype(dtype)  # one rounding, to even
        out = np.empty(shape[:-1] + (shape[-1] + 3,), dtype)[..., :shape[-1]]
        gpuq.dequantize(q, s, z, dtype=np.dtype(dtype).name, out=out, **scheme)
        np.testing.assert_array_equal(out.view(np.uint16), want.view(np.uint16))
    x = _input(shape, view)
    for fmt in ("float8_e4m3fn", "float8_e5m2"):
        q = gpuq.quantize(x, s, dtype=fmt, **scheme)
        bits = np.asarray(q.data if isinstance(q, gpuq.Codes) else q).view(np.uint8)
        want = FR.naive_quantize(np.ascontiguousarray(x), s, dtype=fmt, **scheme)
        np.testing.assert_array_equal(bits, want.view(np.uint8))
        out = np.empty(shape[:-1] + (shape[-1] + 3,), np.float32)[..., :shape[-1]]
        gpuq.dequantize(q, s, dtype="float32", out=out, **scheme)
        np.testing.assert_array_equal(out.view(np.uint32),
                                      FR.naive_dequantize(want, s, **scheme).view(np.uint32))
    assert rows_counted["rows"] > 0 or not (host_loops == "numba" and (shape, scheme, view) in _ROWS)


def test_rows_plan_layouts():
    """Which problems the rows form takes, and the layout it hands the kernels."""
    big = np.zeros((6, 40, 100), np.float32)
    x, o = big[:, :, :64], np.zeros((6, 40, 64), np.int8)
    # Groups of 16 along the last dim: (6, 40) merge into 240 rows of 64 at a stride of 100,
    # 4 parameters a row (their starts 4 apart), runs of 16.
    s = np.arange(6.0 * 40 * 4).reshape(6, 40, 4, 1)
    p = blocks.plan(x.reshape(6, 40, 4, 16), o.reshape(6, 40, 4, 16), [s], expand=False)
    assert isinstance(p, blocks.RowsPlan)
    _, _, (runs, (shape, strides, first, last, length, count)) = p.block(0, None)
    assert (length, count, runs.run, first, last) == (64, 4, 16, 0, 240)
    assert shape.tolist() == [240] and strides.tolist() == [[100, 64, 4]]
    np.testing.assert_array_equal(runs.params[0], s.reshape(-1))
    # Blocks of 2 rows of dim 0: a parameter per block, the same (stride 0) along the others.
    p = blocks.plan(big[:, :4, :64].reshape(3, 2, 4, 64), np.zeros((3, 2, 4, 64), np.int8),
                    [np.arange(3.0).reshape(3, 1, 1, 1)], expand=False)
    _, _, (runs, (shape, strides, *_, length, count)) = p.block(0, None)
    assert (length, count, runs.run) == (64, 1, 64) and shape.tolist() == [3, 2, 4]
    assert strides.tolist() == [[8000, 512, 1], [4000, 256, 0], [100, 64, 0]]
    # Not rows: the ufunc plans (expand), rows shorter than ROW_MIN, rows not contiguous,
    # a negative stride.
    one = [np.ones((1, 1, 1), np.float32)]
    assert not isinstance(blocks.plan(x, o, one), blocks.RowsPlan)
    assert not isinstance(blocks.plan(big[:, :, :16], o[..., :16], one, expand=False), blocks.RowsPlan)
    assert not isinstance(blocks.plan(big[:, :, ::2], o[..., :50], one, expand=False), blocks.RowsPlan)
    assert not isinstance(blocks.plan(x.transpose(0, 2, 1), o.transpose(0, 2, 1), one, expand=False),
                          blocks.RowsPlan)
    assert not isinstance(blocks.plan(big[::-1, :, :64], o, one, expand=False), blocks.RowsPlan)


# --- int4/uint4 with block scales on the compiled int4 kernels (issue 28): formats.int4_map -----

#: (shape, block_size, view): ragged edges, odd row lengths (a byte holds the last code of one
#: row or block and the first of the next), rank-3 ``(1, b1, b2)``, sizes 1, 17, 1025, views.
_INT4_BLOCKS = [
    ((300, 201), (128, 128), None),
    ((17, 17), (16, 16), "wide"),
    ((1025, 3), (2, 2), None),
    ((1, 1025), (1, 128), None),
    ((1, 1), (4, 4), None),
    ((17,), (4,), None),
    ((4, 33, 17), (1, 8, 16), "transposed"),
    ((3, 130, 101), (1, 64, 64), "wide"),
    ((70, 91), (16, 32), "transposed"),
]


@pytest.fixture
def int4_counted(monkeypatch, host_loops):
    """Counts calls of the compiled int4 kernels; with numba, the ufunc int4 path (its per-element
    parameter gather, ``formats._gathered``) fails the test."""
    from gpuq.backends.host import formats

    counted = {"quantize_int4": 0, "dequantize_int4": 0}
    if host_loops == "numba":
        from gpuq.backends.host import loops

        for name in counted:
            def counting(*args, _kernel=getattr(loops, name), _name=name):
                counted[_name] += 1
                return _kernel(*args)
            monkeypatch.setattr(loops, name, counting)

        def fail(*args):
            raise AssertionError("the ufunc int4 path (a per-element parameter gather) ran")
        monkeypatch.setattr(formats, "_gathered", fail)
    return counted


def _check_int4_blocks(x, block, code, with_zp, out_dtype, seed):
    """Quantize and dequantize ``x`` with ``block`` scales against the naive statement, bit for
    bit (the codes as ONNX packs them; dequantize into a strided ``out`` as well)."""
    qmin, qmax = FR.INT4[code]
    s, z = _scheme_params(x.shape, dict(block_size=block), (qmin - 2, qmax + 2), seed)
    z = z if with_zp else None
    x32 = np.ascontiguousarray(x).astype(np.float32)  # exact (float16, bfloat16)
    got = gpuq.quantize(x, s, z, block_size=block, dtype=code)
    want = FR.naive_quantize(x32, s, z, block_size=block, dtype=code)
    np.testing.assert_array_equal(np.asarray(got.data), FR.pack_nibbles(want))
    y_want = FR.naive_dequantize(want, s, z, block_size=block, out_dtype=out_dtype)
    y = gpuq.dequantize(got, s, z, block_size=block, dtype=np.dtype(out_dtype).name)
    np.testing.assert_array_equal(y.view(np.uint8), y_want.view(np.uint8))
    wide = np.empty(x.shape[:-1] + (x.shape[-1] + 3,), out_dtype)[..., :x.shape[-1]]
    gpuq.dequantize(got, s, z, block_size=block, out=wide)
    np.testing.assert_array_equal(wide.view(np.uint8), y_want.view(np.uint8))


@pytest.mark.parametrize("shape,block,view", _INT4_BLOCKS, ids=str)
def test_int4_block_scales_take_the_compiled_kernels(host_loops, int4_counted, shape, block, view):
    """int4 and uint4, with and without zero points, float32 in and out: the same bits as the
    naive statement on both loops, and with numba every chunk runs the compiled int4 kernels."""
    x = _input(shape, view)
    for i, (code, with_zp) in enumerate([("int4", True), ("uint4", True), ("int4", False), ("uint4", False)]):
        _check_int4_blocks(x, block, code, with_zp, np.float32, seed=i)
    if host_loops == "numba":
        assert int4_counted["quantize_int4"] >= 4 and int4_counted["dequantize_int4"] >= 8


@pytest.mark.parametrize("shape,block,view", [_INT4_BLOCKS[0], _INT4_BLOCKS[6], _INT4_BLOCKS[8]], ids=str)
def test_int4_block_scales_half_precision(host_loops, int4_counted, shape, block, view):
    """float16 and bfloat16 src and out on the compiled int4 kernels: the same bits."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    for dtype in (np.float16, ml_dtypes.bfloat16):
        x = _input(shape, view, dtype)
        _check_int4_blocks(x, block, "int4", True, dtype, seed=5)
        _check_int4_blocks(x, block, "uint4", False, dtype, seed=6)


@pytest.mark.parametrize("shape,block", [((301, 1001), (128, 128)), ((3, 301, 333), (1, 64, 128))], ids=str)
def test_int4_block_scales_across_chunks(host_loops, int4_counted, monkeypatch, shape, block):
    """Chunks of 4096 elements (even, inside odd rows and ragged blocks) on two threads: each
    chunk starts the walk mid-row, mid-block; the same bits."""
    from gpuq.backends.host import formats

    monkeypatch.setattr(formats, "BLOCK", 4096)
    monkeypatch.setattr("gpuq.backends.host.threads.PARALLEL_MIN", 0)
    x = _input(shape, "wide")
    _check_int4_blocks(x, block, "int4", True, np.float32, seed=7)
    _check_int4_blocks(x, block, "uint4", False, np.float32, seed=8)
    if host_loops == "numba":
        assert int4_counted["quantize_int4"] >= 2 * (x.size // 4096)
