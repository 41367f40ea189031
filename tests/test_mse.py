"""``choose_qparams(..., method="mse")``: the search for the clipping range (issue 30).

The expected parameters come from a naive statement of the rule, independent of gpuq: blocks
found by their elements' block coordinates, each block's float64 min/max rounded to float32,
the 20 candidates ``p_i = float32((100 - i) / 100)`` as float32 products, each turned into a
scale and zero point by the min/max formula in float32 NumPy scalars (rounded in the scale
dtype by ml_dtypes / NumPy casts), each candidate's error a Python float loop over the block's
numbers in C order (codes by the contract's formula; fp8 by ml_dtypes' cast of the clipped
float32 quotient), the first smallest error winning. Scales are compared bit for bit and zero
points exactly, on every backend (both host loops, the CUDA kernels: tests/cudasim runs them
without a GPU).
"""

from __future__ import annotations

import itertools
import math
import warnings

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpuq

TINY = np.finfo(np.float32).tiny
#: (qmin, qmax, divisor of a symmetric scale, symmetric zero point or None) of each code dtype.
CODES = {"int8": (-128, 127, 127, None), "uint8": (0, 255, 127, 128), "int4": (-8, 7, 7, None),
         "uint4": (0, 15, 7, 8), "float8_e4m3fn": (-448, 448, 448, None),
         "float8_e5m2": (-57344, 57344, 57344, None), "float4_e2m1fn": (-6, 6, 6, None),
         "float6_e2m3fn": (-7.5, 7.5, 7.5, None), "float6_e3m2fn": (-28, 28, 28, None)}
ROUND = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
FACTORS = [np.float32((100 - i) / 100) for i in range(20)]


def _block_shape(shape, axis, group_size, block):
    """The block shape of a scheme, from its definition (README's scheme table)."""
    if block is not None:
        return tuple(n if b == -1 else min(b, n) for b, n in zip(block, shape))
    if axis is None:
        return tuple(shape)
    axes = [a % len(shape) for a in (axis if isinstance(axis, tuple) else (axis,))]
    if group_size is not None:
        return tuple(group_size if d == axes[0] else 1 for d in range(len(shape)))
    return tuple(1 if d in axes else n for d, n in enumerate(shape))


def _candidate(lo, hi, p, dtype, symmetric, scale_dtype, eps):
    """``(scale, zp)`` of one candidate (float32 scalar arithmetic), scale 0 where it rounds to 0."""
    qmin, qmax, div, sym_zp = CODES[dtype]
    lo, hi = np.float32(p * lo), np.float32(p * hi)
    if symmetric:
        amax = np.float32(max(abs(lo), abs(hi), np.float32(0)))
        s = np.float32(max(np.float32(amax / np.float32(div)), eps))
    else:
        lo, hi = min(lo, np.float32(0)), max(hi, np.float32(0))
        s = np.float32(max(np.float32((hi - lo) / np.float32(qmax - qmin)), eps))
    s = np.float32(ROUND[scale_dtype](s))
    if s == 0:
        return s, 0
    if symmetric:
        return s, sym_zp or 0
    return s, int(np.clip(np.float32(qmin) - np.rint(np.float32(lo / s)), qmin, qmax))


def _error(values, s, z, dtype, ct):
    """The float64 sum of squared errors, one element after the other."""
    qmin, qmax, _, _ = CODES[dtype]
    v = values.astype(ct)
    sc = ct.type(s)
    if dtype.startswith("float"):  # fp8, fp6, fp4: ml_dtypes' nearest-even cast of the clipped quotient
        t = np.clip((v / sc).astype(np.float32), -qmax, qmax)
        y = t.astype(getattr(ml_dtypes, dtype)).astype(ct) * sc
    else:
        q = np.clip(np.rint(v / sc) + ct.type(z), qmin, qmax)
        y = (q - ct.type(z)) * sc
    err = 0.0
    for a, b in zip(values.astype(np.float64).tolist(), y.astype(np.float64).tolist()):
        err = err + (a - b) * (a - b)
    return err


def naive(x, axis=None, group_size=None, block=None, dtype="int8", symmetric=False, scale_dtype="float32",
          eps=None):
    """The search, one block at a time (see the module docstring): ``(scales, zps, errors)``,
    ``errors`` the ``(blocks, 20)`` float64 error of every candidate (NaN for a left-out one)."""
    symmetric = symmetric or dtype.startswith("float")
    eps = np.float32((2.0**-24 if scale_dtype == "float16" else TINY) if eps is None else eps)
    ct = np.dtype(np.float64) if x.dtype == np.float64 else np.dtype(np.float32)
    bshape = _block_shape(x.shape, axis, group_size, block)
    grid = tuple(-(-n // b) for n, b in zip(x.shape, bshape))
    coords = np.indices(x.shape).reshape(x.ndim, -1).T if x.ndim else np.zeros((1, 0), int)
    owner = [tuple(c // b for c, b in zip(row, bshape)) for row in coords]
    flat = x.reshape(-1)
    scales, zps, errors = [], [], []
    for cell in itertools.product(*(range(g) for g in grid)):
        values = np.array([flat[i] for i, o in enumerate(owner) if o == cell], x.dtype)  # C order
        values = values[~np.isnan(values.astype(np.float64))]
        lo = np.float32(values.astype(np.float64).min()) if values.size else np.float32(0)
        hi = np.float32(values.astype(np.float64).max()) if values.size else np.float32(0)
        cands = [_candidate(lo, hi, p, dtype, symmetric, scale_dtype, eps) for p in FACTORS]
        errs = [_error(values, s, z, dtype, ct) if s != 0 else math.nan for s, z in cands]
        best = min((e, i) for i, e in enumerate(errs) if not math.isnan(e))[1]
        scales.append(cands[best][0])
        zps.append(cands[best][1])
        errors.append(errs)
    pshape = _param_shape(x.shape, axis, group_size, block, grid)
    s = np.array(scales, np.float32).reshape(pshape)
    no_zps = dtype.startswith("float") or (symmetric and CODES[dtype][3] is None)
    return s, None if no_zps else np.array(zps, np.int32).reshape(pshape), np.array(errors)


def _param_shape(shape, axis, group_size, block, grid):
    if block is not None or group_size is not None:
        return grid
    if axis is None:
        return ()
    axes = sorted(a % len(shape) for a in (axis if isinstance(axis, tuple) else (axis,)))
    return tuple(shape[a] for a in axes)


def _same(got, want):
    s, z = (None if v is None else _host(v) for v in got)
    ws, wz = want[:2]
    assert s.dtype == np.float32 and s.shape == ws.shape, (s.dtype, s.shape, ws.shape)
    np.testing.assert_array_equal(s.view(np.uint32), ws.view(np.uint32))
    assert (z is None) == (wz is None)
    if z is not None:
        np.testing.assert_array_equal(np.asarray(z), wz)


def _host(a):
    """A result on the host (CuPy arrays brought back, NumPy ones as they are)."""
    if isinstance(a, np.ndarray):
        return a
    import cupy

    return cupy.asnumpy(a)


def _data(shape, kind, seed, dtype=np.float32):
    rng = np.random.default_rng(seed)
    if kind == "gauss":
        x = rng.normal(0.0, 1.0, shape)
    elif kind == "student":
        x = rng.standard_t(4, shape) * 0.02
    else:  # outliers, a constant block, an all-NaN block, an offset
        x = rng.normal(0.3, 0.5, shape)
        flat = x.reshape(-1)
        flat[rng.integers(0, flat.size, max(1, flat.size // 40))] *= 25.0
        flat[:8] = 1.5
        flat[8:16] = np.nan
        flat[-1] = np.nan
    return x.astype(dtype)


#: (shape, axis, group_size, block): per-tensor, per-channel on either axis, multi-axis, groups
#: with a ragged last group, blocks of one element, ragged 2-D blocks.
SCHEMES = [((37,), None, None, None), ((6, 19), 0, None, None), ((19, 6), 1, None, None),
           ((3, 4, 5), (0, 2), None, None), ((5, 40), -1, 16, None), ((5, 40), 0, 2, None),
           ((3, 5), None, None, (1, 1)), ((13, 21), None, None, (8, 16))]
DTYPES = [("int8", False), ("int8", True), ("uint8", False), ("int4", False), ("int4", True),
          ("uint4", False), ("uint4", True), ("float8_e4m3fn", True), ("float8_e5m2", True)]


@pytest.mark.parametrize("case", SCHEMES, ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}-{c[3]}".replace(" ", ""))
def test_every_scheme_and_code_type_against_the_naive_search(backend, case):
    shape, axis, g, block = case
    for k, (dtype, sym) in enumerate(DTYPES):
        x = _data(shape, ("gauss", "student", "outliers")[k % 3], k)
        kw = dict(axis=axis, group_size=g, block_size=block, dtype=dtype, symmetric=sym)
        want = naive(x, axis, g, block, dtype, sym)
        _same(gpuq.choose_qparams(backend.put(x), method="mse", **kw), want)


@pytest.mark.parametrize("fdtype", [np.float16, ml_dtypes.bfloat16, np.float64])
@pytest.mark.parametrize("scale_dtype", ["float32", "bfloat16", "float16"])
def test_float_dtypes_and_scale_dtypes(backend, fdtype, scale_dtype):
    x = _data((4, 45), "outliers", 7, fdtype)
    if scale_dtype == "float16":
        x = (x.astype(np.float64) * 1e-3).astype(fdtype)  # scales among float16's subnormals
    for dtype, sym in (("int4", False), ("uint8", True), ("float8_e4m3fn", True)):
        kw = dict(axis=1, group_size=16, dtype=dtype, symmetric=sym, scale_dtype=scale_dtype)
        want = naive(x, 1, 16, None, dtype, sym, scale_dtype)
        _same(gpuq.choose_qparams(backend.put(x), method="mse", **kw), want)


@pytest.mark.parametrize("dtype", ["float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn"])
def test_fp4_fp6_with_each_scale_dtype(backend, dtype):
    """fp4/fp6 codes (issue 37) by the same rule: symmetric candidates max|x| * p_i / max
    (e2m3: / 7.5), float32, bfloat16 and float16 scales, codes by ml_dtypes' cast; float32,
    bfloat16 and float64 data; a ragged group, a 2-D block and per channel."""
    x = _data((5, 45), "outliers", 17)
    for fdtype, scale_dtype, kw in ((np.float32, "float32", dict(axis=1, group_size=16)),
                                    (ml_dtypes.bfloat16, "bfloat16", dict(block_size=(2, 32))),
                                    (np.float64, "float16", dict(axis=0))):
        xs = x.astype(fdtype)
        if scale_dtype == "float16":
            xs = (xs * 1e-3).astype(fdtype)  # scales among float16's subnormals
        want = naive(xs, kw.get("axis"), kw.get("group_size"), kw.get("block_size"), dtype, True, scale_dtype)
        _same(gpuq.choose_qparams(backend.put(xs), method="mse", dtype=dtype, scale_dtype=scale_dtype, **kw), want)
        q, s, z = gpuq.quantize_dynamic(backend.put(xs), method="mse", dtype=dtype, scale_dtype=scale_dtype, **kw)
        ref = gpuq.quantize(xs, want[0], dtype=dtype, **kw)
        got, ref = (c.data if isinstance(c, gpuq.Codes) else c for c in (q, ref))  # CuPy's fp6: Codes
        assert z is None
        np.testing.assert_array_equal(np.asarray(backend.get(got)).view(np.uint8), np.asarray(ref).view(np.uint8))


def test_mse_with_rule_scale_dtypes_is_refused():
    """MX (e8m0) and NVFP4 (e4m3) scales come from their rules; the search is not offered there."""
    x = np.ones((2, 32), np.float32)
    with pytest.raises(ValueError, match="method='mse' with scale_dtype='float8_e8m0fnu' is not supported"):
        gpuq.choose_qparams(x, axis=1, group_size=32, dtype="float4_e2m1fn", scale_dtype="float8_e8m0fnu",
                            method="mse")
    with pytest.raises(ValueError, match="scale_dtype='float8_e4m3fn' \\(NVFP4\\) takes float4_e2m1fn codes, "
                                         "method='minmax'.*got float4_e2m1fn codes, method='mse'"):
        gpuq.quantize_dynamic(x, axis=1, group_size=16, dtype="float4_e2m1fn", scale_dtype="float8_e4m3fn",
                              global_scale=1.0, method="mse")


def test_a_candidate_whose_scale_rounds_to_zero_is_left_out(backend):
    # eps below float16's smallest subnormal: a shrunken candidate's scale rounds to 0 there
    # while min/max's does not; the search skips it (min/max alone would be fine).
    x = np.float32([[3e-8 * 7, -1e-9, 2e-8], [1.0, -1.0, 0.5]])
    kw = dict(axis=0, dtype="int4", symmetric=True, scale_dtype="float16", eps=1e-12)
    want = naive(x, 0, None, None, "int4", True, "float16", 1e-12)
    assert np.isnan(want[2][0]).any() and not np.isnan(want[2][0, 0])
    _same(gpuq.choose_qparams(backend.put(x), method="mse", **kw), want)


def test_min_max_failures_raise_as_for_min_max(backend):
    x = np.float32([[1.0, np.inf], [2.0, 3.0]])
    with pytest.raises(ValueError, match="must be finite"):
        gpuq.choose_qparams(backend.put(x), axis=0, method="mse")
    with pytest.raises(ValueError, match="scale_dtype float16 cannot hold"):
        gpuq.choose_qparams(backend.put(np.float32([1e9, -1.0])), scale_dtype="float16", method="mse")


def test_all_nan_and_empty_blocks_keep_min_max(backend):
    x = np.full((3, 4), np.nan, np.float32)
    x[1] = [0.5, -2.0, 7.0, 0.25]
    for dtype, sym in (("int8", False), ("uint4", False), ("uint4", True), ("float8_e5m2", True)):
        kw = dict(axis=0, dtype=dtype, symmetric=sym)
        got = gpuq.choose_qparams(backend.put(x), method="mse", **kw)
        _same(got, naive(x, 0, None, None, dtype, sym))
        minmax = gpuq.choose_qparams(x, **kw)
        assert backend.get(got[0])[[0, 2]].tolist() == minmax[0][[0, 2]].tolist()
    empty = np.zeros((3, 0), np.float32)
    _same(gpuq.choose_qparams(backend.put(empty), axis=0, method="mse"), gpuq.choose_qparams(empty, axis=0))


def test_quantize_dynamic_is_choose_then_quantize(backend):
    x = _data((6, 50), "student", 3)
    for dtype in ("int8", "int4", "float8_e4m3fn"):
        q, s, z = gpuq.quantize_dynamic(backend.put(x), axis=0, dtype=dtype, method="mse")
        s2, z2 = gpuq.choose_qparams(x, axis=0, dtype=dtype, method="mse")
        want = gpuq.quantize(x, s2, z2, axis=0, dtype=dtype)
        np.testing.assert_array_equal(backend.get(s), s2)
        got = q.data if isinstance(q, gpuq.Codes) else q
        ref = want.data if isinstance(want, gpuq.Codes) else want
        np.testing.assert_array_equal(np.asarray(backend.get(got)).view(np.uint8), np.asarray(ref).view(np.uint8))


def test_method_is_checked():
    x = np.ones(4, np.float32)
    with pytest.raises(ValueError, match="method must be one of 'minmax', 'mse', got 'l2'"):
        gpuq.choose_qparams(x, method="l2")
    with pytest.raises(TypeError, match="method must be a string"):
        gpuq.quantize_dynamic(x, method=None)


def test_a_long_block_chains_its_tiles(host_loops, monkeypatch):
    """A block longer than a tile is summed piece by piece, candidates shared among threads:
    the same bits as the naive one-loop sum."""
    from gpuq.backends.host import mse

    monkeypatch.setattr(mse, "UNIT", 64)
    x = _data((3, 7, 20), "outliers", 11)
    for axis, sym in ((None, False), (0, True), ((0, 1), False)):
        _same(gpuq.choose_qparams(x, axis=axis, dtype="int4", symmetric=sym, method="mse"),
              naive(x, axis, None, None, "int4", sym))
    xt = np.ascontiguousarray(x.transpose(2, 0, 1)).transpose(1, 2, 0)  # a strided view
    _same(gpuq.choose_qparams(xt, axis=1, dtype="uint8", method="mse"), naive(xt, 1, None, None, "uint8", False))


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 40), dtype=st.sampled_from([d for d, _ in DTYPES]),
       symmetric=st.booleans(), scale=st.sampled_from([1e-30, 1e-3, 1.0, 1e4]))
def test_the_chosen_error_is_never_above_min_max(seed, n, dtype, symmetric, scale):
    """Per block, the chosen candidate's error (by the naive statement) is at most candidate 0's
    (min/max), and the parameters are the naive search's."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_t(3, (3, n)) * scale).astype(np.float32)
    sym = symmetric or dtype.startswith("float8")
    s, z, errors = naive(x, 0, None, None, dtype, sym)
    chosen = errors[np.arange(3), [int(np.nonzero(errors[r] == np.nanmin(errors[r]))[0][0]) for r in range(3)]]
    assert (chosen <= errors[:, 0]).all()
    _same(gpuq.choose_qparams(x, axis=0, dtype=dtype, symmetric=sym, method="mse"), (s, z))


def test_dask_rechunks_so_every_block_is_whole():
    da = pytest.importorskip("dask.array")
    x = _data((8, 60), "outliers", 5)
    dx = da.from_array(x, chunks=(3, 25))
    for kw in (dict(axis=0), dict(axis=1, group_size=16), dict(), dict(block_size=(4, 32))):
        want = gpuq.choose_qparams(x, dtype="uint8", method="mse", **kw)
        got = gpuq.choose_qparams(dx, dtype="uint8", method="mse", **kw)
        _same(tuple(None if g is None else g.compute() for g in got), want + (None,))
    q, s, z = gpuq.quantize_dynamic(dx, axis=0, method="mse")
    q2, s2, z2 = gpuq.quantize_dynamic(x, axis=0, method="mse")
    np.testing.assert_array_equal(q.compute(), q2)
    np.testing.assert_array_equal(s.compute(), s2)
