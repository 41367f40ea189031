"""fp8 (e4m3fn, e5m2) and packed int4/uint4 codes through the public API, on every backend.

The references are independent of gpuq: the int4 formula as tests/reference.py
states int8's (float quotient, rint, int64 + zp, clip) packed by plain slicing,
and fp8 as ml_dtypes casts the float32 quotient (clipped to +-max first where
saturating, ONNX's rule). The oracle tests against onnxruntime and
onnx.reference are in test_formats_oracle.py.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

import gpuq
from gpuq._codes import Codes
from gpuq.backends.host import formats

import reference

ml_dtypes = pytest.importorskip("ml_dtypes")

FP8 = {"float8_e4m3fn": (ml_dtypes.float8_e4m3fn, 448.0), "float8_e5m2": (ml_dtypes.float8_e5m2, 57344.0)}
INT4 = {"int4": (-8, 7), "uint4": (0, 15)}
SCHEMES = [  # (shape, axis, group_size)
    ((1,), None, None),
    ((17,), None, None),
    ((1025,), None, None),
    ((5, 7), 0, None),
    ((5, 7), 1, None),
    ((3, 301), 1, 128),   # ragged last group along the last axis
    ((7, 4, 3), 0, 3),    # groups along axis 0, ragged, with an inner dim
    ((3, 4, 5), (0, 2), None),  # multi-axis on non-adjacent axes
    ((6, 64), 1, 32),     # full groups along the last axis
]


def _data(shape, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    flat = x.reshape(-1)
    specials = np.array([0.5, 1.5, 2.5, -0.5, -2.5, np.nan, np.inf, -np.inf, 1e30, -1e30, 0.0, -0.0,
                         1e-40, 7.5, -8.5], np.float32)
    flat[: min(flat.size, specials.size)] = specials[: flat.size]
    with np.errstate(over="ignore"):  # 1e30 -> inf in float16: one more special value
        return x.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)


def _params(shape, axis, group_size, seed=1, zp_range=None):
    if axis is None:
        pshape = ()
    elif group_size is not None:
        pshape = tuple(-(-d // group_size) if i == axis else d for i, d in enumerate(shape))
    else:
        axes = (axis,) if isinstance(axis, int) else axis
        pshape = tuple(shape[a] for a in sorted(axes))
    rng = np.random.default_rng(seed)
    scales = rng.uniform(0.05, 2.0, pshape).astype(np.float32)
    zps = None if zp_range is None else rng.integers(zp_range[0], zp_range[1] + 1, pshape).astype(np.int32)
    return scales, zps


def _ref_int4(x, scales, zps, axis, group_size, name):
    """Packed reference bytes: the int8 reference with int4's range, then nibbles by slicing."""
    lo, hi = INT4[name]
    ct = np.float64 if x.dtype == np.float64 else np.float32
    s = reference.expand(np.asarray(scales, ct), x.shape, axis, group_size)
    with np.errstate(invalid="ignore", over="ignore"):
        r = np.rint(x.astype(ct) / s)
    r = np.clip(np.where(np.isnan(r), 0, r), -(2.0**40), 2.0**40).astype(np.int64)
    if zps is not None:
        r = r + reference.expand(np.asarray(zps, np.int64), x.shape, axis, group_size)
    codes = np.clip(r, lo, hi).reshape(-1)
    nib = (codes & 0xF).astype(np.uint8)
    if nib.size % 2:
        nib = np.append(nib, np.uint8(0))
    return nib[0::2] | (nib[1::2] << 4), codes


def _ref_fp8(x, scales, axis, group_size, name, saturate):
    dt, mx = FP8[name]
    ct = np.float64 if x.dtype == np.float64 else np.float32
    s = reference.expand(np.asarray(scales, ct), x.shape, axis, group_size)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        t = (x.astype(ct) / s).astype(np.float32)
        if saturate:
            t = np.where(np.isnan(t), t, np.clip(t, -mx, mx))
        return t.astype(dt).view(np.uint8)


def _bytes(backend, result):
    """The result's stored bytes on the host: packed int4 bytes or fp8 bits."""
    if isinstance(result, Codes):
        return backend.get(result.data).reshape(-1)
    return np.asarray(result).view(np.uint8).reshape(-1)


# -- quantize: every scheme, input dtype and format, bit for bit --------------------------------

@pytest.mark.parametrize("shape,axis,group_size", SCHEMES)
@pytest.mark.parametrize("name", list(INT4))
@pytest.mark.parametrize("with_zp", [False, True])
def test_int4_quantize_matches_reference(backend, shape, axis, group_size, name, with_zp):
    x = _data(shape)
    zr = None if not with_zp else ((-5, 4) if name == "int4" else (0, 15))
    scales, zps = _params(shape, axis, group_size, zp_range=zr)
    got = gpuq.quantize(backend.put(x), scales, zps, axis=axis, group_size=group_size, dtype=name)
    assert isinstance(got, Codes) and got.shape == shape and got.dtype == name
    want, codes = _ref_int4(x, scales, zps, axis, group_size, name)
    assert np.array_equal(_bytes(backend, got), want)
    y = gpuq.dequantize(got, scales, zps, axis=axis, group_size=group_size)
    z = np.zeros(()) if zps is None else reference.expand(zps, shape, axis, group_size)
    s = reference.expand(scales, shape, axis, group_size)
    want_y = ((codes.reshape(shape) - z).astype(np.float32) * s).astype(np.float32)
    assert np.array_equal(backend.get(y), want_y)


@pytest.mark.parametrize("shape,axis,group_size", SCHEMES)
@pytest.mark.parametrize("name", list(FP8))
@pytest.mark.parametrize("saturate", [True, False])
def test_fp8_quantize_matches_ml_dtypes(backend, shape, axis, group_size, name, saturate):
    x = _data(shape, seed=2)
    scales, _ = _params(shape, axis, group_size)
    got = gpuq.quantize(backend.put(x), scales, axis=axis, group_size=group_size, dtype=name,
                        saturate=saturate)
    assert np.array_equal(_bytes(backend, got), _ref_fp8(x, scales, axis, group_size, name, saturate).reshape(-1))
    if backend.name != "cuda":
        assert got.dtype == np.dtype(FP8[name][0]) and got.shape == shape


@pytest.mark.parametrize("src_dtype", [np.float16, np.float64, "bfloat16"])
@pytest.mark.parametrize("name", ["int4", "uint4", "float8_e4m3fn", "float8_e5m2"])
def test_other_input_dtypes(backend, src_dtype, name):
    x = _data((9, 33), seed=3, dtype=src_dtype)
    scales, zps = _params((9, 33), 1, 16, zp_range=(0, 3) if name in INT4 else None)
    got = gpuq.quantize(backend.put(x), scales, zps, axis=1, group_size=16, dtype=name)
    xf = x.astype(np.float32) if src_dtype != np.float64 else x
    if name in INT4:
        want, _ = _ref_int4(xf, scales, zps, 1, 16, name)
    else:
        want = _ref_fp8(xf, scales, 1, 16, name, True).reshape(-1)
    assert np.array_equal(_bytes(backend, got), want)


def test_float64_fp8_goes_through_float32():
    """float64 divides in float64, then rounds to float32 once and to fp8 once (as ml_dtypes)."""
    # 1 + 2**-4 + 2**-30 is above e4m3fn's tie 1 + 2**-4 (between 1 and 1.125), but its float32
    # rounding is exactly the tie, which rounds to 1.0 (even): the documented double rounding.
    x = np.array([1 + 2.0**-4 + 2.0**-30], np.float64)
    got = gpuq.quantize(x, 1.0, dtype="float8_e4m3fn")
    assert got.view(np.uint8)[0] == 0x38 == np.float32(x[0]).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)


# -- dequantize -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(FP8))
@pytest.mark.parametrize("out_dtype", ["float32", "float16", "float64", "bfloat16"])
def test_every_fp8_pattern_dequantizes(backend, name, out_dtype):
    dt = FP8[name][0]
    bits = np.arange(256, dtype=np.uint8)
    codes = bits.view(dt)
    src = codes if backend.name != "cuda" else Codes(backend.put(bits), (256,), name)
    y = backend.get(gpuq.dequantize(src, 0.75, dtype=out_dtype))
    ct = np.float64 if out_dtype == "float64" else np.float32
    want = (codes.astype(ct) * ct(0.75))
    want = want.astype(ml_dtypes.bfloat16 if out_dtype == "bfloat16" else out_dtype)
    nan = np.isnan(want.astype(np.float64))
    assert np.array_equal(np.isnan(y.astype(np.float64)), nan)
    assert np.array_equal(y[~nan].view(f"u{y.itemsize}"), want[~nan].view(f"u{y.itemsize}"))
    # NaN codes give the default quiet NaN of the output type with the code's sign.
    quiet = {"float32": 0x7FC00000, "float16": 0x7E00, "float64": 0x7FF8000000000000, "bfloat16": 0x7FC0}
    sign = 1 << (8 * y.itemsize - 1)
    got_nan = y[nan].view(f"u{y.itemsize}").astype(np.uint64)
    # uint64 scalars: NumPy 2.5 refuses a Python int above the int64 range here (float64's NaN).
    want_nan = np.where(bits[nan] & 0x80, np.uint64(sign | quiet[out_dtype]), np.uint64(quiet[out_dtype]))
    assert np.array_equal(got_nan, want_nan)


def test_fp8_bits_random_float32_patterns():
    """The host conversion against ml_dtypes on random bit patterns (every class of float32)."""
    u = np.random.default_rng(5).integers(0, 2**32, 1 << 18, dtype=np.uint64).astype(np.uint32)
    t = u.view(np.float32)
    for name, (dt, mx) in FP8.items():
        fmt = name.split("_")[1]
        for saturate in (True, False):
            got = np.empty(t.shape, np.uint8)
            formats.fp8_bits(t, fmt, saturate, got)
            ref = np.where(np.isnan(t), t, np.clip(t, -mx, mx)) if saturate else t
            with np.errstate(invalid="ignore", over="ignore"):
                assert np.array_equal(got, ref.astype(dt).view(np.uint8)), (name, saturate)


# -- arrays: views, out=, Codes, pack/unpack --------------------------------------------------------

@pytest.mark.parametrize("name", ["int4", "float8_e4m3fn"])
def test_views_and_non_contiguous_src(backend, name):
    x = _data((11, 40), seed=7)
    scales, _ = _params((11, 40), 0, None)
    for view, axis in ((x[:, 1:], 0), (x[:, ::3], 0), (x.T, 1)):
        got = gpuq.quantize(backend.put(view), scales, axis=axis, dtype=name)
        want = gpuq.quantize(np.ascontiguousarray(view), scales, axis=axis, dtype=name)
        assert np.array_equal(_bytes(backend, got), _bytes(gpuq_host, want))


class gpuq_host:  # the _bytes reader for NumPy results
    name = "numpy"

    @staticmethod
    def get(a):
        return np.asarray(a)


def test_inputs_not_modified(backend):
    x = _data((5, 33), seed=8)
    keep = x.copy()
    scales = np.full(5, 0.5, np.float32)
    xs = backend.put(x)
    for name in ("int4", "uint4", "float8_e5m2"):
        q = gpuq.quantize(xs, scales, axis=0, dtype=name)
        gpuq.dequantize(q, scales, axis=0)
    assert np.array_equal(backend.get(xs).view(np.uint32), keep.view(np.uint32))


def test_out_codes_is_written_and_returned(backend):
    x = _data((3, 7), seed=9)
    out = gpuq.Codes(backend.put(np.full(11, 0xAA, np.uint8)), (3, 7), "int4")
    got = gpuq.quantize(backend.put(x), 0.5, dtype="int4", out=out)
    assert got is out
    assert np.array_equal(backend.get(out.data), _ref_int4(x, 0.5, None, None, None, "int4")[0])
    y = backend.put(np.empty((3, 7), np.float32))
    assert gpuq.dequantize(out, 0.5, out=y) is y
    assert np.array_equal(backend.get(y), gpuq.dequantize(gpuq.unpack(gpuq.Codes(backend.get(out.data), (3, 7),
                                                                              "int4")), 0.5))


@pytest.mark.parametrize("offset", [0, 1, 4, 8])
@pytest.mark.parametrize("n", [165, 1025])
def test_packed_bytes_at_any_address(backend, offset, n):
    """Packed codes read and written at addresses 1, 4 and 8 bytes into an allocation: the
    kernels' 8-byte packed access is for 8-byte aligned data only (the CPU execution
    faults on a misaligned vector access as a GPU does)."""
    x = _data((n,), seed=18)
    nbytes = (n + 1) // 2
    buf = backend.put(np.full(nbytes + 16, 0xAA, np.uint8))
    out = gpuq.Codes(buf[offset:offset + nbytes], (n,), "int4")
    gpuq.quantize(backend.put(x), 0.25, 1, dtype="int4", out=out)
    got = backend.get(buf)
    assert np.array_equal(got[offset:offset + nbytes], _ref_int4(x, 0.25, 1, None, None, "int4")[0])
    assert (got[:offset] == 0xAA).all() and (got[offset + nbytes:] == 0xAA).all()  # nothing outside
    y = gpuq.dequantize(out, 0.25, 1)
    assert np.array_equal(backend.get(y), gpuq.dequantize(gpuq.Codes(got[offset:offset + nbytes], (n,), "int4"),
                                                          0.25, 1))


def test_out_fp8_codes(backend):
    """fp8 codes written into a given Codes of uint8 bits, on every backend (the host too)."""
    x = _data((4, 5), seed=19)
    out = gpuq.Codes(backend.put(np.zeros((4, 5), np.uint8)), (4, 5), "float8_e4m3fn")
    assert gpuq.quantize(backend.put(x), 0.5, out=out) is out
    assert np.array_equal(backend.get(out.data).reshape(-1), _ref_fp8(x, 0.5, None, None, "float8_e4m3fn", True).reshape(-1))
    with pytest.raises(ValueError, match="out must be Codes of dtype float8_e5m2"):
        gpuq.quantize(backend.put(x), 0.5, dtype="float8_e5m2", out=out)


def test_ml_dtypes_int4_arrays_are_packed_not_misread():
    """ml_dtypes' int4 holds one nibble per byte: dequantize refuses it (its bytes are not
    packed codes) and points at gpuq.pack, which takes it."""
    codes = np.array([[1, -2, 3], [-8, 7, 0]], np.int8)
    ml = codes.astype(ml_dtypes.int4)
    with pytest.raises(TypeError, match=r"src must be a gpuq.Codes for int4.*gpuq.pack\(src\)"):
        gpuq.dequantize(ml, 0.5)
    with pytest.raises(TypeError, match="out must be a gpuq.Codes for uint4"):
        gpuq.quantize(np.ones((2, 3), np.float32), 0.5, out=np.zeros((2, 3), ml_dtypes.uint4))
    packed = gpuq.pack(ml)
    assert packed.dtype == "int4" and np.array_equal(packed.data, gpuq.pack(codes).data)
    assert np.array_equal(gpuq.dequantize(packed, 0.5), codes * np.float32(0.5))
    u = np.array([0, 15, 9], np.uint8)
    assert np.array_equal(gpuq.pack(u.astype(ml_dtypes.uint4)).data, gpuq.pack(u, "uint4").data)


def test_out_fp8_host():
    x = _data((4, 5), seed=10)
    out = np.empty((4, 5), ml_dtypes.float8_e5m2)
    assert gpuq.quantize(x, 0.5, out=out) is out  # dtype taken from out
    assert np.array_equal(out.view(np.uint8), _ref_fp8(x, 0.5, None, None, "float8_e5m2", True))
    strided = np.empty((4, 10), ml_dtypes.float8_e5m2)[:, ::2]
    gpuq.quantize(x, 0.5, out=strided)
    assert np.array_equal(strided.view(np.uint8), out.view(np.uint8))


def test_pack_unpack_round_trip():
    rng = np.random.default_rng(11)
    for n in (0, 1, 2, 17, 1025):
        c = rng.integers(-8, 8, n).astype(np.int8)
        p = gpuq.pack(c)
        assert p.nbytes == (n + 1) // 2 and np.array_equal(gpuq.unpack(p), c)
        u = rng.integers(0, 16, n).astype(np.uint8)
        assert np.array_equal(gpuq.unpack(gpuq.pack(u, "uint4")), u)
    assert gpuq.pack(np.array([1, -2, 3], np.int8)).data.tolist() == [0xE1, 0x03]  # ONNX order


def test_empty_tensors(backend):
    for name in ("int4", "float8_e4m3fn"):
        q = gpuq.quantize(backend.put(np.zeros((0, 3), np.float32)), 1.0, dtype=name)
        y = gpuq.dequantize(q, 1.0)
        assert backend.get(y).shape == (0, 3)


# -- errors -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("call,exc,match", [
    (lambda x: gpuq.quantize(x, 1.0, 3, dtype="float8_e4m3fn"), ValueError, "zps must be None or all 0 for fp8"),
    (lambda x: gpuq.quantize(x, 1.0, dtype="int4", saturate=False), ValueError, "saturate=False applies to fp8"),
    (lambda x: gpuq.quantize(x, 1.0, saturate=False), ValueError, "saturate=False applies to fp8"),
    (lambda x: gpuq.quantize(x, 1.0, dtype="float8_e5m2", saturate="no"), TypeError, "saturate must be True or False"),
    (lambda x: gpuq.quantize(x, 1.0, dtype="int4", out=np.empty(3, np.uint8)), TypeError, "out must be a gpuq.Codes"),
    (lambda x: gpuq.quantize(x, 1.0, dtype="int4", out=gpuq.Codes(np.zeros(2, np.uint8), (4,), "int4")),
     ValueError, "out must be Codes of dtype int4 and shape"),
    (lambda x: gpuq.dequantize(gpuq.Codes(np.zeros(2, np.uint8), (3,), "int4"), [1.0, 2.0]), ValueError, "scales"),
    (lambda x: gpuq.dequantize(np.zeros(3, ml_dtypes.float8_e4m3fn), [1.0] * 3, [0, 1, 0], axis=0), ValueError,
     "zps must be None or all 0"),
])
def test_errors(call, exc, match):
    x = np.ones(3, np.float32)
    with pytest.raises(exc, match=match):
        call(x)


def test_fp8_nonzero_zps_refused_without_value_checks(backend):
    """Host-given zps are looked at even with check_values=False (no device round trip);
    the static op objects check theirs at construction or at the call."""
    x = backend.put(_data((4, 6), seed=20))
    with pytest.raises(ValueError, match="got a zero point of 5"):
        gpuq.quantize(x, [1.0] * 4, [0, 5, 0, 0], axis=0, dtype="float8_e4m3fn", check_values=False)
    q = gpuq.quantize(x, [1.0] * 4, axis=0, dtype="float8_e5m2")
    with pytest.raises(ValueError, match="got a zero point of -1"):
        gpuq.dequantize(q, [1.0] * 4, np.array([0, 0, -1, 0], np.int8), axis=0, check_values=False)
    with pytest.raises(ValueError, match="zps must be None or all 0 for fp8"):
        gpuq.Quantize(scales=[1.0, 2.0], zps=[0, 3], qtype="per_channel", axis=0, dtype="float8_e4m3fn")
    op = gpuq.Dequantize(scales=[1.0] * 4, zps=[0, 0, 0, 2], qtype="per_channel", axis=0)
    with pytest.raises(ValueError, match="got a zero point of 2"):
        op(q)
    zero = gpuq.Quantize(scales=[1.0] * 4, zps=[0] * 4, qtype="per_channel", axis=0, dtype="float8_e5m2")
    assert np.array_equal(_bytes(backend, zero(x)), _bytes(backend, q))
    if backend.name == "cuda":  # device zps: checked with check_values (the default) only
        with pytest.raises(ValueError, match="got a zero point of 7"):
            gpuq.quantize(x, 1.0, backend.put(np.array(7, np.int32)), dtype="float8_e4m3fn")


def test_zero_zps_are_accepted_for_fp8():
    x = _data((4, 6), seed=12)
    a = gpuq.quantize(x, [1.0, 2.0, 3.0, 4.0], [0, 0, 0, 0], axis=0, dtype="float8_e4m3fn")
    b = gpuq.quantize(x, [1.0, 2.0, 3.0, 4.0], axis=0, dtype="float8_e4m3fn")
    assert np.array_equal(a.view(np.uint8), b.view(np.uint8))


@pytest.mark.parametrize("args,exc,match", [
    ((np.zeros(2, np.uint8), (3,), "int8"), ValueError, "dtype must be one of int4"),
    ((np.zeros(3, np.uint8), (3,), "int4"), ValueError, r"expected data.shape \(2,\)"),
    ((np.zeros(2, np.int8), (3,), "int4"), TypeError, "data must be a uint8 array"),
    ((np.zeros((2, 2), np.uint8)[:, 0], (3,), "int4"), ValueError, "C-contiguous"),
    ((np.zeros(2, np.uint8), (-3,), "int4"), ValueError, "non-negative"),
    ((np.zeros(2, np.uint8), (True, 3), "int4"), TypeError, r"shape must be a tuple of non-negative ints, got \(True"),
    ((np.zeros(2, np.uint8), (3,), np.dtype(np.int8)), TypeError, "dtype must be one of int4.*got dtype"),
    ((np.zeros((2, 4), np.uint8)[:, 0], (3,), "int4"), ValueError, r"got a strided view \(strides \(4,\)"),
    ((np.zeros(2, np.uint8), (2,), "float8_e4m3fn"), None, None),
])
def test_codes_validation(args, exc, match):
    if exc is None:
        assert gpuq.Codes(*args).size == 2
        return
    with pytest.raises(exc, match=match):
        gpuq.Codes(*args)


@pytest.mark.parametrize("ml_dtypes_loaded", [True, False])
def test_pack_refuses_floats_and_lists(monkeypatch, ml_dtypes_loaded):
    """Floats are never truncated into codes, whether or not ml_dtypes is imported."""
    if not ml_dtypes_loaded:
        monkeypatch.delitem(sys.modules, "ml_dtypes")
    for bad in (np.array([0.4, 7.9]), [1, -2, 3]):
        with pytest.raises(TypeError, match="codes must be an int8 array for int4"):
            gpuq.pack(bad)
    with pytest.raises(TypeError, match="codes must be a uint8 array for uint4"):
        gpuq.pack(np.array([1.7, 3.2]), "uint4")


def test_pack_refuses_out_of_range():
    with pytest.raises(ValueError, match=r"codes must lie in \[-8, 7\] for int4, got values in \[-9, 3\]"):
        gpuq.pack(np.array([-9, 3], np.int8))
    with pytest.raises(TypeError, match="codes must be a uint8 array for uint4"):
        gpuq.pack(np.array([1, 3], np.int8), "uint4")


# -- choose_qparams / quantize_dynamic / op objects ----------------------------------------------------

@pytest.mark.parametrize("name,div", [("int4", 7), ("uint4", 7), ("float8_e4m3fn", 448), ("float8_e5m2", 57344)])
def test_symmetric_scales(backend, name, div):
    x = _data((6, 50), seed=13)
    x[~np.isfinite(x)] = 1.0
    x[np.abs(x) > 1e3] = 2.0
    s, z = gpuq.choose_qparams(backend.put(x), axis=0, dtype=name, symmetric=True)
    amax = np.abs(x).max(axis=1)
    assert np.array_equal(backend.get(s), (amax / np.float32(div)).astype(np.float32))
    if name == "uint4":
        assert np.array_equal(backend.get(z), np.full(6, 8, np.int32))
    else:
        assert z is None


def test_fp8_defaults_to_symmetric_and_refuses_asymmetric():
    x = _data((3, 9), seed=14)
    x[~np.isfinite(x)] = 0.0
    x[np.abs(x) > 1e3] = 0.0
    q, s, z = gpuq.quantize_dynamic(x, axis=0, dtype="float8_e4m3fn")
    assert z is None and np.array_equal(s, (np.abs(x).max(1) / np.float32(448)).astype(np.float32))
    assert np.array_equal(q.view(np.uint8), gpuq.quantize(x, s, axis=0, dtype="float8_e4m3fn").view(np.uint8))
    with pytest.raises(ValueError, match="symmetric must be True for float8_e4m3fn"):
        gpuq.choose_qparams(x, dtype="float8_e4m3fn", symmetric=False)


def test_int4_dynamic_equals_two_calls(backend):
    x = _data((4, 130), seed=15)
    x[~np.isfinite(x)] = 0.0
    x[np.abs(x) > 1e3] = 0.0
    q, s, z = gpuq.quantize_dynamic(backend.put(x), axis=1, group_size=64, dtype="uint4")
    s2, z2 = gpuq.choose_qparams(x, axis=1, group_size=64, dtype="uint4")
    assert np.array_equal(backend.get(s), s2) and np.array_equal(backend.get(z), z2)
    want, _ = _ref_int4(x, s2, z2, 1, 64, "uint4")
    assert np.array_equal(_bytes(backend, q), want)


def test_op_objects(backend):
    x = _data((4, 6), seed=16)
    scales = [0.5, 1.0, 1.5, 2.0]
    for name in ("int4", "float8_e5m2"):
        q = gpuq.Quantize(scales=scales, qtype="per_channel", axis=0, dtype=name)(backend.put(x))
        want = gpuq.quantize(x, scales, axis=0, dtype=name)
        assert np.array_equal(_bytes(backend, q), _bytes(gpuq_host, want))
        y = gpuq.Dequantize(scales=scales, qtype="per_channel", axis=0)(q)
        assert np.array_equal(backend.get(y).view(np.uint32), gpuq.dequantize(want, scales, axis=0).view(np.uint32))
    q = gpuq.DynamicQuantize(dtype="float8_e4m3fn", saturate=False)(backend.put(x), np.float32(0.01))
    assert np.array_equal(_bytes(backend, q), _ref_fp8(x, 0.01, None, None, "float8_e4m3fn", False).reshape(-1))
    with pytest.raises(ValueError, match="saturate=False applies to fp8"):
        gpuq.Quantize(scales=[1.0], dtype="int4", saturate=False)


def test_pack_unpack_on_every_backend(backend):
    rng = np.random.default_rng(17)
    for n in (1, 17, 1024):
        c = rng.integers(-8, 8, n).astype(np.int8)
        p = gpuq.pack(backend.put(c))
        assert np.array_equal(backend.get(p.data), gpuq.pack(c).data)
        assert np.array_equal(backend.get(gpuq.unpack(p)), c)
