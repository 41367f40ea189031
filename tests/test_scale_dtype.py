"""choose_qparams / quantize_dynamic with ``scale_dtype``: scales rounded to bfloat16 / float16.

The expected values come from a naive statement of the rule, independent of gpuq: each block's
float32 scale by the formula (as in test_qparams.py), rounded to nearest even by ml_dtypes'
bfloat16 cast or NumPy's float16 cast, the zero point derived from the rounded scale, the codes
``clamp(rint(x / s) + zp)`` from ``reference.py``. Scales are compared bit for bit, zero points
and codes exactly, on every backend (both host loops, the CUDA kernels: tests/cudasim runs them
without a GPU).
"""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest

import gpuq
import reference as ref
from test_qparams import _same_bits

TINY = np.finfo(np.float32).tiny
#: (qmin, qmax, divisor of a symmetric scale, symmetric zero point) of each code dtype.
CODES = {"int8": (-128, 127, 127, None), "uint8": (0, 255, 127, 128), "int4": (-8, 7, 7, None),
         "uint4": (0, 15, 7, 8), "float8_e4m3fn": (-448, 448, 448, None)}
ROUND = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def naive(x, axis=None, group_size=None, block=None, dtype="int8", symmetric=False, scale_dtype="float32",
          eps=None):
    """The rule, one block at a time: float64 min/max rounded to float32, the float32 scale, that
    scale rounded in ``scale_dtype`` (ml_dtypes / NumPy casts), the zero point from it."""
    qmin, qmax, div, sym_zp = CODES[dtype]
    eps = np.float32((2.0**-24 if scale_dtype == "float16" else TINY) if eps is None else eps)
    lo, hi = _block_minmax(x, axis, group_size, block)
    if symmetric:
        s = np.maximum(np.maximum(np.abs(lo), np.abs(hi)) / np.float32(div), eps).astype(np.float32)
    else:
        lo, hi = np.minimum(lo, np.float32(0)), np.maximum(hi, np.float32(0))
        s = np.maximum((hi - lo) / np.float32(qmax - qmin), eps).astype(np.float32)
    s = s.astype(ROUND[scale_dtype]).astype(np.float32)
    if symmetric or dtype.startswith("float8"):
        z = None if sym_zp is None else np.full(s.shape, sym_zp, np.int32)
    else:
        z = np.clip(np.float32(qmin) - np.rint(lo / s), qmin, qmax).astype(np.int32)
    return s, z


def _block_minmax(x, axis, group_size, block):
    """float32 per-block (min, max) of float data ``x``, NaN skipped (an all-NaN block: 0)."""
    v = x.astype(np.float64)
    if block is not None:  # 2-D blocks, ragged edges padded with NaN
        (m, n), (bm, bn) = x.shape, block
        pad = np.full((-(-m // bm) * bm, -(-n // bn) * bn), np.nan)
        pad[:m, :n] = v
        v = pad.reshape(pad.shape[0] // bm, bm, pad.shape[1] // bn, bn)
        red = (1, 3)
    elif axis is None:
        v, red = v.reshape(1, -1), (1,)
    elif group_size is not None:  # groups along the last axis
        n = x.shape[-1]
        pad = np.full(x.shape[:-1] + (-(-n // group_size) * group_size,), np.nan)
        pad[..., :n] = v
        v, red = pad.reshape(x.shape[:-1] + (-1, group_size)), (-1,)
    else:
        v, red = np.moveaxis(v, axis, 0).reshape(x.shape[axis], -1), (1,)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "All-NaN slice": such a block counts as 0
        lo, hi = np.nanmin(v, axis=red), np.nanmax(v, axis=red)
    lo, hi = np.nan_to_num(lo), np.nan_to_num(hi)
    if axis is None and block is None:
        lo, hi = lo.reshape(()), hi.reshape(())
    return lo.astype(np.float32), hi.astype(np.float32)


def _codes(backend, q):
    """Codes as one int8/uint8/fp8-bits array on the host (packed int4 unpacked)."""
    if isinstance(q, gpuq.Codes):
        data = backend.get(q.data)
        if q.dtype in ("int4", "uint4"):
            return gpuq.unpack(gpuq.Codes(data, q.shape, q.dtype))
        return data.reshape(q.shape)
    q = backend.get(q)
    return q.view(np.uint8) if q.dtype.itemsize == 1 and q.dtype.kind == "V" else q


def _data(shape, dtype, seed, scale=1.0):
    """Rows of very different ranges (so scales land everywhere in the dtype), with an offset."""
    rng = np.random.default_rng(seed)
    rows = rng.uniform(-6, 3, size=shape[:1] + (1,) * (len(shape) - 1))
    x = rng.normal(0, 1, size=shape) * 10.0**rows * scale + rng.uniform(-0.5, 0.5) * 10.0**rows * scale
    x.reshape(-1)[3] = np.nan
    return x.astype(dtype)


SCHEMES = [((1025,), None, None), ((37, 19), 0, None), ((19, 37), 1, None), ((9, 300), -1, 32),
           ((9, 70), -1, 64)]


@pytest.mark.parametrize("scale_dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("case", SCHEMES, ids=lambda c: f"{c[0]}-axis{c[1]}-g{c[2]}")
@pytest.mark.parametrize("dtype,symmetric", [("int8", False), ("int8", True), ("uint8", False),
                                             ("int4", False), ("int4", True), ("uint4", True),
                                             ("float8_e4m3fn", True)])
def test_rounded_scales_and_their_zero_points(backend, scale_dtype, case, dtype, symmetric):
    shape, axis, g = case
    x = _data(shape, np.float32, hash((shape, dtype)) % 1000)
    if scale_dtype == "float16":
        x = (x * np.float32(1e-3)).astype(np.float32)  # scales from float16's subnormals to its normals
    kw = dict(axis=axis, group_size=g, dtype=dtype, symmetric=symmetric, scale_dtype=scale_dtype)
    want_s, want_z = naive(x, **kw)
    s, z = gpuq.choose_qparams(backend.put(x), **kw)
    _same_bits(backend.get(s), want_s)
    assert (z is None) == (want_z is None)
    if want_z is not None:
        _same_bits(backend.get(z), want_z)
    # quantize_dynamic: the same parameters, and the codes of exactly those (fused or not).
    q, s2, z2 = gpuq.quantize_dynamic(backend.put(x), **kw)
    _same_bits(backend.get(s2), want_s)
    if want_z is not None:
        _same_bits(backend.get(z2), want_z)
    want_q = gpuq.quantize(x, want_s, want_z, axis=axis, group_size=g, dtype=dtype)
    if dtype in ("int8", "uint8"):
        _same_bits(want_q, ref.quantize(x, want_s, want_z, axis=axis, group_size=g, dtype=dtype))
    _same_bits(_codes(backend, q), _codes(backend, want_q))


def test_the_rounding_moves_codes_and_zero_points():
    """The rule is visible: bfloat16 scales differ from float32 ones, and so do the zero points
    and the codes derived from them (a test that a dropped rounding would fail)."""
    x = _data((64, 256), np.float32, 1)
    s32, z32 = gpuq.choose_qparams(x, axis=0)
    s16, z16 = gpuq.choose_qparams(x, axis=0, scale_dtype="bfloat16")
    assert (s16 != s32).mean() > 0.9 and (z16 != z32).any()
    assert (gpuq.quantize(x, s16, z16, axis=0) != gpuq.quantize(x, s32, z32, axis=0)).any()


@pytest.mark.parametrize("fdtype", ["float16", "bfloat16", "float64"])
def test_other_data_dtypes(backend, fdtype):
    dt = np.dtype(ml_dtypes.bfloat16) if fdtype == "bfloat16" else np.dtype(fdtype)
    x = _data((33, 40), np.float32, 7, scale=10.0).astype(dt)
    for scale_dtype in ("bfloat16", "float16"):
        kw = dict(axis=0, dtype="int8", scale_dtype=scale_dtype)
        want_s, want_z = naive(x, **kw)
        s, z = gpuq.choose_qparams(backend.put(x), **kw)
        _same_bits(backend.get(s), want_s)
        _same_bits(backend.get(z), want_z)


def test_block_scales(backend):
    """Ragged 2-D blocks (the fine-grained fp8 layout's shape) with rounded scales."""
    x = _data((144, 200), np.float32, 3)
    for scale_dtype in ("float32", "bfloat16"):
        kw = dict(block=(128, 128), dtype="float8_e4m3fn", symmetric=True, scale_dtype=scale_dtype)
        want_s, _ = naive(x, **kw)
        s, z = gpuq.choose_qparams(backend.put(x), block_size=(128, 128), dtype="float8_e4m3fn",
                                   scale_dtype=scale_dtype)
        assert z is None
        _same_bits(backend.get(s), want_s)
        kw = dict(block=(16, 48), dtype="int8", symmetric=False, scale_dtype=scale_dtype)
        want_s, want_z = naive(x, **kw)
        s, z = gpuq.choose_qparams(backend.put(x), block_size=(16, 48), scale_dtype=scale_dtype)
        _same_bits(backend.get(s), want_s)
        _same_bits(backend.get(z), want_z)


@pytest.mark.parametrize("scale_dtype,t,rounded", [
    # float32 scales exactly halfway between two neighbours of the scale dtype: to the even one.
    ("bfloat16", 1 + 2.0**-8, 1.0), ("bfloat16", 1 + 2.0**-7 + 2.0**-8, 1 + 2.0**-6),
    ("float16", 1 + 2.0**-11, 1.0), ("float16", 1 + 2.0**-10 + 2.0**-11, 1 + 2.0**-9),
    # float16's subnormals: 3 * 2**-25 is halfway between 2**-24 and 2**-23 -> 2**-23 (even)
    ("float16", 3 * 2.0**-25, 2.0**-23), ("float16", 2.0**-25, 0.0),
])
def test_ties_round_to_even(backend, scale_dtype, t, rounded):
    # uint8 asymmetric over [0, t * 255]: the float32 scale is exactly t (t * 255 and the
    # division are exact), so the tie reaches the rounding as it is.
    x = np.array([0.0, t * 255], np.float32)
    assert np.float32(x[1]) / np.float32(255) == np.float32(t)
    if rounded == 0.0:  # 2**-25 rounds to 0 in float16: the error, with eps below it
        with pytest.raises(ValueError, match="scale_dtype float16 cannot hold .*rounds to 0"):
            gpuq.choose_qparams(backend.put(x), dtype="uint8", scale_dtype=scale_dtype, eps=2.0**-30)
        return
    s, z = gpuq.choose_qparams(backend.put(x), dtype="uint8", scale_dtype=scale_dtype)
    assert float(backend.get(s)) == rounded and int(backend.get(z)) == 0
    q, s2, _ = gpuq.quantize_dynamic(backend.put(x), dtype="uint8", scale_dtype=scale_dtype)
    assert float(backend.get(s2)) == rounded
    assert backend.get(q).tolist() == [0, min(255, int(np.rint(np.float32(t * 255) / np.float32(rounded))))]


def test_zero_range_rule(backend):
    """An all-zero (or all-NaN) block: eps, rounded; float16's default eps is 2**-24."""
    x = np.zeros((3, 8), np.float32)
    x[1] = np.nan
    for scale_dtype, want in (("float32", TINY), ("bfloat16", TINY), ("float16", 2.0**-24)):
        s, z = gpuq.choose_qparams(backend.put(x), axis=0, scale_dtype=scale_dtype)
        assert backend.get(s).tolist() == [np.float32(want)] * 3
        assert backend.get(z).tolist() == [-128] * 3
    # an explicit eps is rounded like any scale: 1e-5 in float16 is a subnormal
    s, _ = gpuq.choose_qparams(backend.put(x), axis=0, scale_dtype="float16", eps=1e-5)
    assert backend.get(s)[0] == np.float32(np.float16(1e-5))


@pytest.mark.parametrize("op", ["choose_qparams", "quantize_dynamic"])
def test_scales_the_dtype_cannot_hold(backend, op):
    fn = getattr(gpuq, op)
    big = np.array([[1.0, 2.0], [-1e7, 3.0]], np.float32)  # 1e7 / 127 overflows float16
    with pytest.raises(ValueError, match="scale_dtype float16 cannot hold .*overflows float16"):
        fn(backend.put(big), axis=0, symmetric=True, scale_dtype="float16")
    fn(backend.put(big), axis=0, symmetric=True, scale_dtype="bfloat16")  # bfloat16 holds it


def test_scales_that_round_to_zero(backend):
    # Only an eps below the dtype's smallest value lets a scale round to 0 (quantize_dynamic
    # takes the default eps, 2**-24 for float16, which never does).
    tiny = np.full((2, 4), 1e-30, np.float32)
    with pytest.raises(ValueError, match="scale_dtype float16 cannot hold .*rounds to 0"):
        gpuq.choose_qparams(backend.put(tiny), axis=0, scale_dtype="float16", eps=1e-30)
    with pytest.raises(ValueError, match="scale_dtype bfloat16 cannot hold .*rounds to 0"):
        gpuq.choose_qparams(backend.put(tiny * 0), axis=0, scale_dtype="bfloat16", eps=1e-45)


def test_host_message_says_which_block():
    x = np.ones((3, 4), np.float32)
    x[2, 1] = 1e8
    with pytest.raises(ValueError) as err:
        gpuq.choose_qparams(x, axis=0, scale_dtype="float16")
    assert str(err.value) == ("scale_dtype float16 cannot hold the scale 392156.875 chosen for the block "
                              "of scales index (2,): it overflows float16 (largest 65504); use a wider "
                              "scale_dtype")


@pytest.mark.parametrize("value,exc,text", [
    ("float64", ValueError, "scale_dtype must be one of float32, bfloat16, float16, float8_e8m0fnu, float8_e4m3fn, got 'float64'"),
    ("half", ValueError, "got 'half'"),
    (np.float64, TypeError, "scale_dtype must be one of float32, bfloat16, float16, float8_e8m0fnu, float8_e4m3fn, got float64"),
    (None, TypeError, "scale_dtype must be a dtype or dtype name, one of float32, bfloat16, float16, float8_e8m0fnu, float8_e4m3fn; got None"),
    (3, TypeError, "got 3"),
])
def test_bad_scale_dtype(value, exc, text):
    x = np.ones(4, np.float32)
    for fn in (gpuq.choose_qparams, gpuq.quantize_dynamic):
        with pytest.raises(exc, match=text.replace("(", r"\(").replace(")", r"\)")):
            fn(x, scale_dtype=value)


@pytest.mark.parametrize("value", ["bf16", "BF16", ml_dtypes.bfloat16, np.dtype(ml_dtypes.bfloat16)])
def test_scale_dtype_names(value):
    x = _data((4, 9), np.float32, 2)
    _same_bits(gpuq.choose_qparams(x, axis=0, scale_dtype=value)[0],
               naive(x, axis=0, scale_dtype="bfloat16")[0])
    _same_bits(gpuq.choose_qparams(x, axis=0, scale_dtype="f16")[0], naive(x, axis=0, scale_dtype="float16")[0])
    _same_bits(gpuq.choose_qparams(x, axis=0, scale_dtype=np.float32)[0], naive(x, axis=0)[0])


def test_input_is_not_modified():
    x = _data((8, 16), np.float32, 4)
    before = x.copy()
    gpuq.choose_qparams(x, axis=0, scale_dtype="bfloat16")
    gpuq.quantize_dynamic(x, axis=0, scale_dtype="float16")
    _same_bits(x, before)


def test_dask_passes_scale_dtype_through():
    da = pytest.importorskip("dask.array")
    x = _data((40, 64), np.float32, 5)
    for chunks, axis in (((10, 64), 0), ((40, 16), 0), ((10, 16), None)):  # in-chunk, tree, tree
        d = da.from_array(x, chunks=chunks)
        for scale_dtype in ("bfloat16", "float16"):
            want_s, want_z = naive(x, axis=axis, scale_dtype=scale_dtype)
            s, z = gpuq.choose_qparams(d, axis=axis, scale_dtype=scale_dtype)
            _same_bits(s.compute(), want_s)
            _same_bits(z.compute(), want_z)
            q, s2, z2 = gpuq.quantize_dynamic(d, axis=axis, scale_dtype=scale_dtype)
            _same_bits(q.compute(), gpuq.quantize(x, want_s, want_z, axis=axis))
    with pytest.raises(ValueError, match="scale_dtype must be one of"):
        gpuq.choose_qparams(da.from_array(x, chunks=(10, 64)), axis=0, scale_dtype="float64")
