"""The host CUDA engine (tests/cudasim): PTX helpers, fibers, faults, schedules, real kernels.

Everything here runs without a GPU: kernels are built with g++ by
``cudasim.hostbuild`` and run as fibers on the host. Expected values come
from NumPy statements (or plain arithmetic), never from the engine itself.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
import warnings

import gpuq
import ml_dtypes
import numpy as np
import pytest
from cudasim import hostbuild, ptx
from cudasim.hostbuild import KernelFault

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the host CUDA engine is Linux-only (g++, ELF)")

I32_MIN, I32_MAX = -(2**31), 2**31 - 1
I64_MIN, I64_MAX = -(2**63), 2**63 - 1
CANON32 = 0x7FFFFFFF
CANON16 = 0x7FFF


def ptr(a: np.ndarray) -> bytes:
    return a.ctypes.data.to_bytes(8, "little")


def i64(v) -> bytes:
    return np.int64(v).tobytes()


def i32(v) -> bytes:
    return np.int32(v).tobytes()


def f32bits(values) -> np.ndarray:
    return np.asarray(values, np.float32).view(np.uint32)


def u32(b) -> np.ndarray:
    return np.asarray(b, np.uint32)


# --- PTX helpers at their boundaries ------------------------------------------------------------

@pytest.fixture(scope="module")
def helpers():
    return hostbuild.build_ptx_helpers()


def test_the_twenty_one_forms_are_known_and_exported(helpers):
    assert sorted(ptx.FORMS) == sorted([
        "div.rn.f32", "mul.rn.f32", "sub.rn.f32", "fma.rn.f32", "min.f32", "max.f32",
        "cvt.rni.sat.s8.f32", "cvt.rni.sat.u8.f32", "cvt.rn.satfinite.e4m3x2.f32", "cvt.rn.satfinite.e5m2x2.f32",
        "cvt.rn.f16x2.e4m3x2",
        "cvt.rni.s32.f32", "cvt.rni.s32.f64", "cvt.rni.s64.f32", "cvt.rni.s64.f64",
        "cvt.rn.f32.s64", "cvt.rn.f64.s64", "cvt.rn.f32.f64", "cvt.f64.f32", "cvt.f32.f16", "cvt.rn.f16.f32"])
    for form in ptx.FORMS.values():
        assert callable(getattr(helpers, f"cudasim_ptx_{form.helper}"))


# Special float32 operands: zeros, subnormals, normal edges, ties-making values, infinities, NaNs with payloads.
SPECIAL32 = np.array([
    0x00000000, 0x80000000,              # +-0
    0x00000001, 0x80000001, 0x007FFFFF,  # smallest subnormals, largest subnormal
    0x00800000, 0x80800000, 0x00800001,  # smallest normals
    0x3F800000, 0xBF800000, 0x40400000,  # 1, -1, 3
    0x3F000000, 0x3FC00000, 0x40200000,  # 0.5, 1.5, 2.5
    0x4B000001, 0x33800000,              # 2^23 + 1, 2^-24
    0x7F7FFFFF, 0xFF7FFFFF,              # +-max
    0x7F800000, 0xFF800000,              # +-inf
    0x7FC00000, 0xFFC00000, 0x7FC00001, 0x7F800001, 0xFFBFFFFF,  # NaNs: quiet, negative, payload, signalling
], dtype=np.uint32)


def _is_nan32(b):
    return (np.asarray(b, np.uint32) & 0x7FFFFFFF) > 0x7F800000


def _expected_f32(result_f32: np.ndarray) -> np.ndarray:
    bits = result_f32.astype(np.float32).view(np.uint32).copy()
    bits[_is_nan32(bits)] = CANON32  # CUDA Programming Guide 20.3: single-precision NaN results are 0x7fffffff
    return bits


@pytest.mark.parametrize("name, op", [("div_rn_f32", np.divide), ("mul_rn_f32", np.multiply),
                                      ("sub_rn_f32", np.subtract)])
def test_f32_arithmetic_keeps_subnormals_and_gives_the_canonical_nan(helpers, name, op):
    fn = getattr(helpers, f"cudasim_ptx_{name}")
    a, b = np.meshgrid(SPECIAL32, SPECIAL32, indexing="ij")
    a, b = a.ravel(), b.ravel()
    with np.errstate(all="ignore"):
        want = _expected_f32(op(a.view(np.float32), b.view(np.float32)))
    got = u32([fn(int(x), int(y)) for x, y in zip(a, b)])
    np.testing.assert_array_equal(got, want)
    # A subnormal result is kept (no flush to zero): 2^-126 * 0.5, 2^-126 / 4, 2^-126 - 1.5 * 2^-126.
    assert fn is not None
    if name == "mul_rn_f32":
        assert helpers.cudasim_ptx_mul_rn_f32(0x00800000, 0x3F000000) == 0x00400000
    if name == "div_rn_f32":
        assert helpers.cudasim_ptx_div_rn_f32(0x00800000, 0x40800000) == 0x00200000
        assert helpers.cudasim_ptx_div_rn_f32(0x3F800000, 0x40400000) == int(f32bits(np.float32(1) / np.float32(3))[()])
    if name == "sub_rn_f32":
        assert helpers.cudasim_ptx_sub_rn_f32(0x00800001, 0x00800000) == 0x00000001


def _round_f32(sign: int, mag) -> int:
    """The bits of (-1)**sign * mag (an exact nonzero Fraction) rounded to nearest even into
    float32, subnormals kept, overflow to infinity: a plain statement of IEEE rounding."""
    from fractions import Fraction
    e = mag.numerator.bit_length() - mag.denominator.bit_length()
    if Fraction(2) ** e > mag:
        e -= 1  # now 2**e <= mag < 2**(e + 1)
    q = max(e, -126) - 23  # the exponent of one ulp
    n, rem = divmod(mag / Fraction(2) ** q, 1)
    n = int(n)
    if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and n % 2 == 1):
        n += 1
    value = n * 2.0**q  # n < 2**25: exact in float64
    if value >= 2.0**128:
        return (sign << 31) | 0x7F800000
    return (sign << 31) | int(np.float32(value).view(np.uint32))


def _fma_reference(a: int, b: int, c: int) -> int:
    """fusedMultiplyAdd (IEEE 754) of three float32 bit patterns: specials by the standard's rules,
    finite operands by exact rational arithmetic and one rounding."""
    from fractions import Fraction
    fa, fb, fc = (float(np.uint32(v).view(np.float32)) for v in (a, b, c))
    if any(math.isnan(v) for v in (fa, fb, fc)):
        return CANON32
    if math.isinf(fa) or math.isinf(fb):
        if fa == 0 or fb == 0:
            return CANON32  # Inf * 0
        prod_sign = (a ^ b) >> 31
        if math.isinf(fc) and (c >> 31) != prod_sign:
            return CANON32  # Inf - Inf
        return (prod_sign << 31) | 0x7F800000
    if math.isinf(fc):
        return int(c)
    exact = Fraction(fa) * Fraction(fb) + Fraction(fc)
    if exact == 0:
        prod_sign = (a ^ b) >> 31
        # An exact zero sum is +0 under round to nearest, unless both addends are -0.
        both_neg_zero = fa * fb == 0 and fc == 0 and prod_sign == 1 and (c >> 31) == 1
        return 0x80000000 if both_neg_zero else 0
    return _round_f32(int(exact < 0), abs(exact))


def test_fma_rounds_once_like_exact_arithmetic(helpers):
    fn = helpers.cudasim_ptx_fma_rn_f32
    # Rounded once: (1 + 2^-23)(1 - 2^-23) - 1 = -2^-46 exactly (a multiply then an add gives 0).
    assert fn(0x3F800001, 0x3F7FFFFE, 0xBF800000) == int(f32bits(-(2.0**-46))[()])
    # A subnormal result is kept: 2^-126 * 0.75 - 2^-127 = 2^-128.
    assert fn(0x00800000, 0x3F400000, 0x80400000) == 0x00200000
    triples = [(int(a), int(b), int(c)) for a in SPECIAL32 for b in SPECIAL32 for c in SPECIAL32[::3]]
    rng = np.random.default_rng(38)
    # Random operands over every exponent (subnormal, overflowing and cancelling sums), and
    # c = -RN(a * b): the exact residual the division from a reciprocal relies on.
    ab = rng.integers(0, 2**32, size=(3000, 2), dtype=np.uint64).astype(np.uint32)
    ab = ab[~_is_nan32(ab).any(axis=1) & ((ab & 0x7F800000) != 0x7F800000).all(axis=1)]
    for a, b in ab:
        with np.errstate(all="ignore"):
            p = np.float32(a.view(np.float32)) * np.float32(b.view(np.float32))
        c_near = int((-p).view(np.uint32))
        triples += [(int(a), int(b), int(rng.integers(0, 2**32))), (int(a), int(b), c_near)]
    got = [fn(a, b, c) for a, b, c in triples]
    want = [_fma_reference(a, b, c) for a, b, c in triples]
    bad = [(hex(a), hex(b), hex(c), hex(g), hex(w)) for (a, b, c), g, w in zip(triples, got, want) if g != w]
    assert not bad, bad[:5]


@pytest.mark.parametrize("name, npfn, zero_bits", [("min_f32", np.fmin, 0x80000000), ("max_f32", np.fmax, 0x00000000)])
def test_min_max_skip_nan_and_order_signed_zeros(helpers, name, npfn, zero_bits):
    fn = getattr(helpers, f"cudasim_ptx_{name}")
    assert fn(0x80000000, 0x00000000) == zero_bits and fn(0x00000000, 0x80000000) == zero_bits
    for x in SPECIAL32:
        for y in SPECIAL32:
            got = fn(int(x), int(y))
            nx, ny = bool(_is_nan32(x)), bool(_is_nan32(y))
            if nx and ny:
                want = CANON32
            elif nx:
                want = int(y)  # the other operand, bit for bit (subnormals kept)
            elif ny:
                want = int(x)
            elif (int(x) | int(y)) & 0x7FFFFFFF == 0:  # PTX: -0.0 < +0.0
                want = (int(x) | int(y)) if name == "min_f32" else (int(x) & int(y))
            else:
                want = int(f32bits(npfn(np.uint32(x).view(np.float32), np.uint32(y).view(np.float32)))[()])
            assert got == want, (name, hex(x), hex(y), hex(got), hex(want))


def _rni_expected(values: np.ndarray, lo: int, hi: int, nan_value: int) -> list[int]:
    out = []
    with np.errstate(invalid="ignore"):  # signalling NaNs
        wide = values.astype(np.float64)  # float32 values are exact in float64
    for v in wide:
        if np.isnan(v):
            out.append(nan_value)
        elif np.isinf(v):
            out.append(hi if v > 0 else lo)
        else:
            r = int(np.rint(v))  # numpy rint: nearest, ties to even, exact for float64
            out.append(min(max(r, lo), hi))
    return out


def _rni_inputs32() -> np.ndarray:
    specials = SPECIAL32.view(np.float32)
    edges = np.array([0.49999997, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, 4.5, 8388607.5, -8388607.5,
                      2147483520.0, 2147483648.0, -2147483648.0, -2147483904.0, 4294967296.0,
                      9223371487098961920.0, 9223372036854775808.0, -9223372036854775808.0,
                      -9223373136366403584.0, 1.7e38, -1.7e38], np.float32)
    rng = np.random.default_rng(7)
    random_bits = rng.integers(0, 2**32, 4000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    near = (rng.integers(-(2**40), 2**40, 2000) / 4.0).astype(np.float32)  # many exact halves
    return np.concatenate([specials, edges, random_bits, near])


def _rni_inputs64() -> np.ndarray:
    edges = np.array([0.5, 1.5, 2.5, -0.5, -2.5, 0.49999999999999994, 5e-324, -5e-324,
                      2147483647.0, 2147483647.4, 2147483647.5, 2147483646.5, 2147483648.0,
                      -2147483648.0, -2147483648.5, -2147483648.6, -2147483649.0,
                      4503599627370495.5, -4503599627370495.5,
                      9223372036854774784.0, 9223372036854775808.0, -9223372036854775808.0,
                      -9223372036854777856.0, 1e300, -1e300, np.inf, -np.inf, np.nan, -np.nan], np.float64)
    nan_payload = np.array([0x7FF0000000000001, 0xFFF8000000000123], np.uint64).view(np.float64)
    rng = np.random.default_rng(8)
    random_bits = rng.integers(0, 2**63, 4000, dtype=np.uint64).view(np.float64)
    random_bits = np.concatenate([random_bits, -random_bits])
    near = rng.integers(-(2**52), 2**52, 2000) / 2.0
    return np.concatenate([edges, nan_payload, random_bits, near])


@pytest.mark.parametrize("name, src, lo, hi, nan_value", [
    ("cvt_rni_s32_f32", "f32", I32_MIN, I32_MAX, 0),          # NaN -> 0 (source not f64, destination not s64)
    ("cvt_rni_s32_f64", "f64", I32_MIN, I32_MAX, I32_MIN),    # NaN -> MININT (source f64)
    ("cvt_rni_s64_f32", "f32", I64_MIN, I64_MAX, I64_MIN),    # NaN -> MININT (destination s64)
    ("cvt_rni_s64_f64", "f64", I64_MIN, I64_MAX, I64_MIN),
])
def test_cvt_rni_rounds_half_even_saturates_and_maps_nan_per_the_isa(helpers, name, src, lo, hi, nan_value):
    fn = getattr(helpers, f"cudasim_ptx_{name}")
    values = _rni_inputs32() if src == "f32" else _rni_inputs64()
    bits = values.view(np.uint32 if src == "f32" else np.uint64)
    width = 32 if hi == I32_MAX else 64
    got = [int(fn(int(b))) for b in bits]
    got = [g - (1 << width) if g >= 1 << (width - 1) else g for g in got]  # raw bits -> signed
    want = _rni_expected(values, lo, hi, nan_value)
    bad = [(v, g, w) for v, g, w in zip(values, got, want) if g != w]
    assert not bad, bad[:10]
    # The edges spelled out (just inside and just beyond the integer range, ties).
    if name == "cvt_rni_s32_f64":
        f = lambda v: int(np.int32(np.uint32(fn(int(np.float64(v).view(np.uint64))))))
        assert [f(2147483647.4), f(2147483647.5), f(2147483646.5), f(-2147483648.5), f(-2147483648.6)] == \
               [I32_MAX, I32_MAX, 2147483646, I32_MIN, I32_MIN]


@pytest.mark.parametrize("name, dtype", [("cvt_rni_sat_s8_f32", "int8"), ("cvt_rni_sat_u8_f32", "uint8")])
def test_cvt_rni_sat_8bit_is_the_host_backends_symmetric_code(helpers, name, dtype):
    # The symmetric contract after the division (scale 1: the quotient is x itself) against the host
    # backend, on every float32 whose low 16 bits are zero (every exponent, sign, NaN and Inf), the
    # rint edge cases, and every quarter in [-260, 260] (ties, both saturation edges). The 32-bit
    # register holds the code sign-extended (.s8) or zero-extended (.u8), as the ISA's cvt says.
    fn = getattr(helpers, f"cudasim_ptx_{name}")
    every_exponent = (np.arange(2**16, dtype=np.uint32) << 16).view(np.float32)
    quarters = (np.arange(-1040, 1041) / 4).astype(np.float32)
    values = np.concatenate([every_exponent, _rni_inputs32(), quarters])
    got = np.array([fn(int(b)) for b in values.view(np.uint32)], np.uint32)
    want = gpuq.quantize(values, np.float32(1), dtype=dtype, check_values=False)
    assert want.dtype == np.dtype(dtype)
    extended = want.astype(np.int32).view(np.uint32)  # int8 sign-extends, uint8 zero-extends
    bad = np.flatnonzero(got != extended)
    assert bad.size == 0, [(values[i], got[i], want[i]) for i in bad[:10]]


@pytest.mark.parametrize("name, dtype", [("cvt_rn_satfinite_e4m3x2_f32", "float8_e4m3fn"),
                                         ("cvt_rn_satfinite_e5m2x2_f32", "float8_e5m2")])
def test_cvt_satfinite_fp8x2_is_the_host_backends_saturating_cast(helpers, name, dtype):
    # The host backend's saturating fp8 cast (scale 1) on every float32 whose low 16 bits are zero
    # (every exponent: subnormal fp8, both saturations, Inf), every 2**-12 step of [-2**9, 2**9]
    # in e4m3's binades (ties at every code), random bits; `d, a, b` puts cvt(a) in the high byte.
    fn = getattr(helpers, f"cudasim_ptx_{name}")
    rng = np.random.default_rng(11)
    every_exponent = (np.arange(2**16, dtype=np.uint32) << 16).view(np.float32)
    steps = (np.arange(-(2**21), 2**21 + 1, 97) / 2.0**12).astype(np.float32)
    random_bits = rng.integers(0, 2**32, 20000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    ties = np.array([464, -464, 472, 57344, 61440, -61440, 65536, 2.0**-10, 3 * 2.0**-10, 2.0**-17,
                     3 * 2.0**-17, 1.0625, 1.1875, 1.125, 1.375], np.float32)
    values = np.concatenate([every_exponent, steps, random_bits, ties])
    values = values[~np.isnan(values)]  # the kernels branch on NaN before the instruction
    partner = np.roll(values, 1)
    bits, pbits = values.view(np.uint32), partner.view(np.uint32)
    got = np.array([fn(int(a), int(b)) for a, b in zip(pbits, bits)], np.uint16)
    want = gpuq.quantize(values, np.float32(1), dtype=dtype, check_values=False, saturate=True).view(np.uint8)
    want_hi = np.roll(want, 1)
    assert np.array_equal(got & 0xFF, want), values[np.flatnonzero((got & 0xFF) != want)[:10]]
    assert np.array_equal(got >> 8, want_hi)
    # NaN: NaN of the format with the input's sign (the kernels never rely on it).
    assert fn(0x7FC00000, 0xFFC00001) == 0x7F << 8 | 0xFF


def test_cvt_f16x2_e4m3x2_is_the_host_backends_decode_on_every_pair(helpers):
    # All 2**16 code pairs: each half of d is the float16 of the host backend's decode (scale 1;
    # every e4m3 value is a float16), the low byte's in the low half; NaN codes give 0x7fff.
    fn = helpers.cudasim_ptx_cvt_rn_f16x2_e4m3x2
    pairs = np.arange(2**16, dtype=np.uint32)
    got = np.array([fn(int(p)) for p in pairs], np.uint32)
    codes = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)
    decoded = gpuq.dequantize(codes, np.float32(1), dtype="float32")
    want = decoded.astype(np.float16).view(np.uint16).astype(np.uint32)
    want[np.isnan(decoded)] = 0x7FFF
    assert np.array_equal(decoded.astype(np.float16).astype(np.float32), decoded, equal_nan=True)  # exact
    assert np.array_equal(got & 0xFFFF, want[pairs & 0xFF])
    assert np.array_equal(got >> 16, want[pairs >> 8])


def test_cvt_int64_to_float_rounds_once_to_nearest_even(helpers):
    vals = [0, 1, -1, 2**24, 2**24 + 1, 2**24 + 3, -(2**24 + 1), 2**53, 2**53 + 1, 2**53 + 3, -(2**53 + 1),
            2**62 + 2**38, 2**63 - 1, -(2**63), -(2**63) + 1, 12345678901234567]
    rng = np.random.default_rng(9)
    vals += [int(v) for v in rng.integers(I64_MIN, I64_MAX, 3000, dtype=np.int64)]
    vals += [int(v) >> s for v, s in zip(rng.integers(I64_MIN, I64_MAX, 3000, dtype=np.int64), rng.integers(0, 63, 3000))]
    arr = np.array(vals, np.int64)
    want32 = arr.astype(np.float32).view(np.uint32)
    want64 = arr.astype(np.float64).view(np.uint64)
    got32 = u32([helpers.cudasim_ptx_cvt_rn_f32_s64(int(v) & (2**64 - 1)) for v in vals])
    got64 = np.array([helpers.cudasim_ptx_cvt_rn_f64_s64(int(v) & (2**64 - 1)) for v in vals], np.uint64)
    np.testing.assert_array_equal(got32, want32)
    np.testing.assert_array_equal(got64, want64)
    assert got32[vals.index(2**24 + 1)] == f32bits(np.float32(2**24))  # tie to even, down
    assert got32[vals.index(2**24 + 3)] == f32bits(np.float32(2**24 + 4))  # tie to even, up


def test_cvt_f64_to_f32_keeps_subnormals_overflows_to_inf_and_canonicalises_nan(helpers):
    edges = np.array([0.0, -0.0, 2.0**-149, 2.0**-150, 3 * 2.0**-151, 2.0**-150 * 1.0000001, 1e-40, -1e-45,
                      2.0**-126, 2.0**-126 * (1 - 2.0**-30), 3.4028234663852886e38, 3.4028235677973362e38,
                      3.4028235677973366e38, -3.4028235677973366e38, 1e39, np.inf, -np.inf, 1.0 / 3, 0.1],
                     np.float64)
    rng = np.random.default_rng(10)
    random_bits = rng.integers(0x3600000000000000, 0x4800000000000000, 20000, dtype=np.uint64).view(np.float64)
    values = np.concatenate([edges, random_bits, -random_bits])
    with np.errstate(over="ignore"):
        want = values.astype(np.float32).view(np.uint32)
    got = u32([helpers.cudasim_ptx_cvt_rn_f32_f64(int(b)) for b in values.view(np.uint64)])
    np.testing.assert_array_equal(got, want)
    assert got[3] == 0x00000000 and got[4] == 0x00000001  # 2^-150: tie to even 0; 0.75 * 2^-149 up to 2^-149
    for nan in (0x7FF8000000000000, 0xFFF8000000000000, 0x7FF0000000000001, 0x7FFFFFFFFFFFFFFF):
        assert helpers.cudasim_ptx_cvt_rn_f32_f64(nan) == CANON32


def test_cvt_f32_to_f64_is_exact_and_keeps_nan_payloads(helpers):
    rng = np.random.default_rng(11)
    bits = np.concatenate([SPECIAL32, rng.integers(0, 2**32, 20000, dtype=np.uint64).astype(np.uint32)])
    got = np.array([helpers.cudasim_ptx_cvt_f64_f32(int(b)) for b in bits], np.uint64)
    with np.errstate(invalid="ignore"):  # signalling NaNs
        want = bits.view(np.float32).astype(np.float64).view(np.uint64)  # IEEE widening (x86: payload kept, quieted)
    np.testing.assert_array_equal(got, want)
    assert helpers.cudasim_ptx_cvt_f64_f32(0x7F800001) == 0x7FF8000020000000  # signalling NaN quieted
    assert helpers.cudasim_ptx_cvt_f64_f32(0x00000001) == np.float64(2.0**-149).view(np.uint64)


def test_cvt_f16_to_f32_every_pattern(helpers):
    bits = np.arange(65536, dtype=np.uint32)
    got = u32([helpers.cudasim_ptx_cvt_f32_f16(int(b)) for b in bits])
    want = bits.astype(np.uint16).view(np.float16).astype(np.float32).view(np.uint32).copy()
    want[_is_nan32(want)] = CANON32  # NaN -> 0x7fffffff (cuda_fp16.hpp's emulation drops the sign too)
    np.testing.assert_array_equal(got, want)


def test_cvt_f32_to_f16_rounds_half_even_keeps_subnormals_and_overflows_at_65520(helpers):
    fn = helpers.cudasim_ptx_cvt_rn_f16_f32
    edges = np.array([65504.0, 65519.996, 65520.0, -65520.0, 65536.0, 1e10, 2.0**-14, 2.0**-24, -(2.0**-24),
                      2.0**-25, 2.0**-25 * 1.0000001, 3 * 2.0**-26, 2.0**-14 - 2.0**-25, 1.0 + 2.0**-11,
                      1.0 + 3 * 2.0**-11, 2049.0, 2051.0, 0.0, -0.0, np.inf, -np.inf], np.float32)
    rng = np.random.default_rng(12)
    random_bits = rng.integers(0, 2**32, 60000, dtype=np.uint64).astype(np.uint32)
    values = np.concatenate([edges.view(np.uint32), SPECIAL32, random_bits])
    with np.errstate(over="ignore"):
        want = values.view(np.float32).astype(np.float16).view(np.uint16).astype(np.uint32)
    want[(want & 0x7FFF) > 0x7C00] = CANON16  # NaN -> 0x7fff
    got = u32([fn(int(b)) for b in values])
    np.testing.assert_array_equal(got, want)
    spelled = [fn(int(b)) for b in edges.view(np.uint32)[:12]]
    assert spelled == [0x7BFF, 0x7BFF, 0x7C00, 0xFC00, 0x7C00, 0x7C00, 0x0400, 0x0001, 0x8001, 0x0000, 0x0001,
                       0x0001]  # ..., 2^-25: tie to 0, just above: 2^-24, 0.75 * 2^-24: up to 2^-24


# --- the translator --------------------------------------------------------------------------------

def test_every_asm_of_gpuq_sources_translates():
    reg = hostbuild.kernel_registry()
    seen = set()
    for name in reg.SOURCES:
        stmts = ptx.find_asm(reg.source_text(name))
        assert stmts
        for s in stmts:
            assert "::cudasim::ptx::" in ptx.translate_statement(s)
            seen.add(s.instruction.split()[0])
    assert seen == set(ptx.FORMS)


@pytest.mark.parametrize("bad, match", [
    ('asm("add.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));', "unknown PTX instruction 'add.rn.f32'"),
    ('asm("min.f32 %0, %1, %2; min.f32 %0, %0, %2;" : "=f"(r) : "f"(a), "f"(b));', "exactly one instruction"),
    ('asm("min.f32 %0, %1, %2;" : "=r"(r) : "f"(a), "f"(b));', "constraint '=f'"),
    ('asm("min.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "d"(b));', "constraint 'f'"),
    ('asm("min.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b) : "memory");', "clobbers"),
    ('asm("min.f32 %0, %1, 0f3F800000;" : "=f"(r) : "f"(a));', "not a %N reference"),
    ('asm("min.f32 %[r], %1, %2;" : [r] "=f"(r) : "f"(a), "f"(b));', "symbolic"),
    ('asm volatile("bar.sync 0;");', "unknown PTX instruction 'bar.sync'"),
])
def test_unknown_or_malformed_asm_fails_the_build_loudly(bad, match):
    src = f'#line 7 "bad.cu"\n__global__ void k(float* p) {{ float r, a = p[0], b = p[1];\n {bad}\n p[0] = r; }}\n'
    with pytest.raises(hostbuild.BuildError, match=match) as info:
        hostbuild.build(src, ["k"])
    assert "bad.cu:8" in str(info.value)


def test_asm_in_comments_and_strings_is_not_code_and_operand_types_are_checked():
    ok = ('__global__ void k(float* p) { // asm("nonsense");\n const char* s = "asm(x)"; (void)s;\n'
          ' float r; asm volatile ("max.f32 %0, %1, %2;" : "=f"(r) : "f"(p[0]), "f"(p[1])); p[2] = r; }\n')
    k = hostbuild.build(ok, ["k"]).kernel("k")
    p = np.array([np.nan, 2.0, 0.0], np.float32)
    k.launch((1,), (1,), [ptr(p)])
    assert p[2] == 2.0
    # An operand of the wrong C++ type for its constraint is a compile error, as with NVRTC.
    wrong = '__global__ void k(double* p) { float r; asm("max.f32 %0, %1, %2;" : "=f"(r) : "f"(p[0]), "f"(p[1])); }\n'
    with pytest.raises(hostbuild.BuildError, match="does not suit its constraint"):
        hostbuild.build(wrong, ["k"])


def test_bad_name_expressions():
    src = "__global__ void k(int* p) { p[0] = 1; }\nvoid host_fn(int* p) {}\n"
    with pytest.raises(hostbuild.BuildError, match="does not name a __global__"):
        hostbuild.build(src, ["host_fn"])
    with pytest.raises(hostbuild.BuildError, match="g\\+\\+ failed"):
        hostbuild.build(src, ["k<int>"])  # not a template: g++ says so
    mod = hostbuild.build(src, ["k"])
    with pytest.raises(KeyError, match="not one of this module's name expressions"):
        mod.kernel("k2")


# --- fibers: barriers, shared memory, shuffles, atomics, indices -------------------------------------

ENGINE_SRC = r"""
#line 1 "engine_test.cu"
__global__ void __launch_bounds__(256) reverse_block(const int* in, int* out) {
    __shared__ int s[1024];
    const unsigned t = threadIdx.x, base = blockIdx.x * blockDim.x;
    s[t] = in[base + t];
    __syncthreads();
    out[base + t] = s[blockDim.x - 1 - t];
}

// Sum of a block: shared-memory tree. SYNC_FIRST=false deletes the barrier
// between writing s[] and the first read of another thread's element.
template <bool SYNC_FIRST>
__global__ void __launch_bounds__(256) block_sum(const int* in, int* out) {
    __shared__ int s[256];
    const unsigned t = threadIdx.x;
    s[t] = in[blockIdx.x * blockDim.x + t];
    if (SYNC_FIRST) __syncthreads();
    for (unsigned stride = blockDim.x / 2; stride > 0; stride >>= 1) {
        if (t < stride) s[t] += s[t + stride];
        __syncthreads();
    }
    if (t == 0) out[blockIdx.x] = s[0];
}

// Per-warp totals through shared memory reused for several segments; REUSE_SYNC
// is the barrier that keeps a fast warp from overwriting the slots before the
// slow warps have read them (qparams.cu's team_minmax has it).
template <bool REUSE_SYNC>
__global__ void __launch_bounds__(256) segment_sums(const int* in, int* out, int segments) {
    __shared__ int s[32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    for (int seg = 0; seg < segments; ++seg) {
        int v = in[seg * blockDim.x + threadIdx.x];
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (REUSE_SYNC) __syncthreads();
        if (lane == 0) s[warp] = v;
        __syncthreads();
        int w = lane < warps ? s[lane] : 0;
        for (int o = 16; o > 0; o >>= 1) w += __shfl_xor_sync(0xffffffffu, w, o);
        if (threadIdx.x == 0) out[seg] = w;
    }
}

__global__ void shuffles(const float* in, float* xor_sum, float* down_sum, float* bcast, float* up,
                         double* dsum, float* seg16) {
    const unsigned t = threadIdx.x;
    float v = in[t];
    float x = v, d = v;
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    for (int o = 16; o > 0; o >>= 1) d += __shfl_down_sync(0xffffffffu, d, o);
    double w = static_cast<double>(v) * 0.5;
    for (int o = 16; o > 0; o >>= 1) w += __shfl_xor_sync(0xffffffffu, w, o);
    xor_sum[t] = x;
    down_sum[t] = d;
    bcast[t] = __shfl_sync(0xffffffffu, v, 7);
    up[t] = __shfl_up_sync(0xffffffffu, v, 3);
    dsum[t] = w;
    float h = v;
    for (int o = 8; o > 0; o >>= 1) h += __shfl_xor_sync(0xffffffffu, h, o, 16);
    seg16[t] = h;
}

__global__ void votes(const int* in, unsigned* ballot, int* all, int* any) {
    const int p = in[threadIdx.x];
    __syncwarp();
    ballot[threadIdx.x] = __ballot_sync(0xffffffffu, p);
    all[threadIdx.x] = __all_sync(0xffffffffu, p);
    any[threadIdx.x] = __any_sync(0xffffffffu, p);
}

__global__ void atomics(unsigned* counter, int* maxv, unsigned long long* cas_winner, int* ticket) {
    const int gid = blockIdx.x * blockDim.x + threadIdx.x;
    atomicAdd(counter, 1u);
    atomicMax(maxv, gid);
    atomicCAS(cas_winner, 0ull, static_cast<unsigned long long>(gid) + 1);
    ticket[gid] = atomicAdd(counter + 1, 1u);
}

__global__ void indices(int* out) {
    const int bx = blockIdx.x, by = blockIdx.y, bz = blockIdx.z;
    const int tx = threadIdx.x, ty = threadIdx.y, tz = threadIdx.z;
    const int block = bx + gridDim.x * (by + gridDim.y * bz);
    const int thread = tx + blockDim.x * (ty + blockDim.y * tz);
    const int n = blockDim.x * blockDim.y * blockDim.z;
    out[block * n + thread] = ((bz * 8 + by) * 8 + bx) * 4096 + (tz * 16 + ty) * 16 + tx;
}

__global__ void barrier_count(const int* in, int* out) {
    const int c = __syncthreads_count(in[threadIdx.x]);
    const int a = __syncthreads_and(in[threadIdx.x]);
    const int o = __syncthreads_or(in[threadIdx.x]);
    if (threadIdx.x == 0) { out[0] = c; out[1] = a; out[2] = o; }
}

__global__ void dynamic_shared(const int* in, int* out) {
    extern __shared__ __align__(16) int dyn[];
    dyn[threadIdx.x] = in[threadIdx.x] * 2;
    __syncthreads();
    out[threadIdx.x] = dyn[blockDim.x - 1 - threadIdx.x];
}

__global__ void subnormals(const float* in, float* out, double* dout) {
    float r;
    asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(in[0]), "f"(in[1]));
    out[0] = r;                  // 2^-126 * 0.5: a subnormal result
    out[1] = in[2] * 1.0f;       // a subnormal operand (DAZ would zero it)
    out[2] = in[3] + in[4];      // host float add: nearest (round-up mode would differ)
    dout[0] = __ddiv_rn(1.0, 3.0);
}

__global__ void math_overloads(const double* d, double* dout, long long* iout) {
    dout[0] = fmin(d[0], d[1]);   // NaN, 1.0 -> 1.0
    dout[1] = fmax(d[1], d[0]);   // 1.0, NaN -> 1.0
    dout[2] = fmin(d[2], d[3]);   // -0.0, +0.0 -> -0.0
    dout[3] = fmax(d[2], d[3]);   // -> +0.0
    dout[4] = min(d[3], d[2]);    // double min: -0.0
    iout[0] = min(static_cast<int>(d[4]), -3);                         // int
    iout[1] = max(static_cast<long long>(d[5]), 5000000000LL);         // long long
    iout[2] = min(static_cast<unsigned>(7), static_cast<int>(d[4]));   // mixed: unsigned compare, -2 -> big
    iout[3] = __float_as_uint(fminf(static_cast<float>(d[0]), static_cast<float>(d[0])));  // both NaN
}

// --- faults -----------------------------------------------------------------------------------
__global__ void atomic_misaligned(unsigned* p) {
    atomicAdd(reinterpret_cast<unsigned*>(reinterpret_cast<char*>(p) + 2), 1u);
}
__global__ void store_uint4(unsigned* p, int offset) {
    uint4* q = reinterpret_cast<uint4*>(p + offset);
    q[threadIdx.x] = make_uint4(1, 2, 3, 4);
}
__global__ void load_uint4(const unsigned* p, int offset, unsigned* out) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(p + offset));
    out[0] = v.x + v.y + v.z + v.w;
}
__global__ void copy_uint4(const unsigned* p, int offset, unsigned* out) {
    const uint4 v = *reinterpret_cast<const uint4*>(p + offset);
    out[0] = v.w;
}
__global__ void packed_stores(unsigned char* p, int shared) {
    // Thread t writes byte t / 2 when `shared` (two writers per byte), else byte t.
    unsigned char* dst = p + (shared ? threadIdx.x / 2 : threadIdx.x);
    GPUQ_RECORD_STORE(dst, 1);
    *dst = static_cast<unsigned char>(threadIdx.x);
}
__global__ void partial_barrier(int* p) {
    if (threadIdx.x < 100) __syncthreads();
    p[threadIdx.x] = 1;
}
__global__ void split_barrier(int* p) {
    if (threadIdx.x < 128) {
        __syncthreads();
    } else {
        __syncthreads();
    }
    p[threadIdx.x] = 1;
}
__global__ void shuffle_exited_lane(float* p) {
    if (threadIdx.x == 5) return;
    p[threadIdx.x] = __shfl_xor_sync(0xffffffffu, p[threadIdx.x], 1);
}
__global__ void shuffle_vs_barrier(float* p) {
    if (threadIdx.x == 3) { __syncthreads(); return; }
    p[threadIdx.x] = __shfl_down_sync(0xffffffffu, p[threadIdx.x], 1);
    __syncthreads();
}
__global__ void shuffle_partial_warp(float* p) {
    p[threadIdx.x] = __shfl_xor_sync(0xffffffffu, p[threadIdx.x], 1);
}
__global__ void shuffle_not_in_mask(float* p) {
    p[threadIdx.x] = __shfl_xor_sync(0x0000ffffu, p[threadIdx.x], 1);
}
__global__ void device_assert(const int* p) { assert(p[threadIdx.x] == 0); }
__global__ void wild_store(int* p, long long addr) { *reinterpret_cast<int*>(addr) = p[0]; }
__global__ void divide(const int* p, int* out) { out[0] = p[0] / p[1]; }
__device__ int deep(int n) {
    volatile char pad[4096];
    pad[0] = static_cast<char>(n);
    return n <= 0 ? pad[0] : deep(n - 1) + pad[0];
}
__global__ void recurse(int* p) { p[0] = deep(p[1]); }
__global__ void __launch_bounds__(64) small_bounds(int* p) { p[threadIdx.x] = 1; }
__global__ void takes_long(long long v, int* out) { out[0] = static_cast<int>(v >> 32); }
"""

ENGINE_NAMES = ["reverse_block", "block_sum<true>", "block_sum<false>", "segment_sums<true>", "segment_sums<false>",
                "shuffles", "votes", "atomics", "indices", "barrier_count", "dynamic_shared", "subnormals",
                "store_uint4", "load_uint4", "copy_uint4", "partial_barrier", "split_barrier", "shuffle_exited_lane",
                "shuffle_vs_barrier", "shuffle_partial_warp", "shuffle_not_in_mask", "device_assert", "wild_store",
                "divide", "recurse", "small_bounds", "takes_long", "math_overloads", "atomic_misaligned",
                "packed_stores"]


@pytest.fixture(scope="module")
def engine():
    return hostbuild.build(ENGINE_SRC, ENGINE_NAMES)


def test_parameters_come_from_cpp(engine):
    k = engine.kernel("shuffles")
    assert k.params == (hostbuild.Param("pointer", 8, "const float*"),) + \
        (hostbuild.Param("pointer", 8, "float*"),) * 4 + (hostbuild.Param("pointer", 8, "double*"),
                                                          hostbuild.Param("pointer", 8, "float*"))
    assert engine.kernel("takes_long").params == (hostbuild.Param("int", 8, "long long"),
                                                  hostbuild.Param("pointer", 8, "int*"))
    assert engine.kernel("store_uint4").params[1] == hostbuild.Param("int", 4, "int")
    assert engine.kernel("reverse_block").max_threads == 256
    assert engine.kernel("small_bounds").max_threads == 64
    assert engine.kernel("shuffles").max_threads == 1024
    assert engine.kernel("block_sum<false>").name == "block_sum<false>"


@pytest.mark.parametrize("schedule", hostbuild.SCHEDULES)
def test_barrier_and_shared_memory(engine, schedule):
    n = 256 * 3
    a = np.arange(n, dtype=np.int32) * 7 - 100
    out = np.zeros(n, np.int32)
    engine.kernel("reverse_block").launch((3,), (256,), [ptr(a), ptr(out)], schedule=schedule)
    np.testing.assert_array_equal(out, a.reshape(3, 256)[:, ::-1].ravel())


@pytest.mark.parametrize("schedule", hostbuild.SCHEDULES)
def test_shuffles_xor_down_idx_up_and_widths(engine, schedule):
    n = 96  # three warps
    rng = np.random.default_rng(1)
    v = rng.integers(-1000, 1000, n).astype(np.float32)  # integers: sums are exact in any order
    outs = [np.zeros(n, np.float32) for _ in range(4)] + [np.zeros(n, np.float64), np.zeros(n, np.float32)]
    engine.kernel("shuffles").launch((1,), (n,), [ptr(v)] + [ptr(o) for o in outs], schedule=schedule)
    xor_sum, down_sum, bcast, up, dsum, seg16 = outs
    w = v.reshape(3, 32)
    np.testing.assert_array_equal(xor_sum, np.repeat(w.sum(1), 32))
    assert list(down_sum[::32]) == list(w.sum(1))  # lane 0 of each warp holds the total
    lanes = np.arange(32)
    # __shfl_down_sync: lane l adds lanes l+16, l+8, ... within the warp (out of range: its own value).
    want_down = w.copy()
    for o in (16, 8, 4, 2, 1):
        src = np.where(lanes + o < 32, lanes + o, lanes)
        want_down = want_down + want_down[:, src]
    np.testing.assert_array_equal(down_sum, want_down.ravel())
    np.testing.assert_array_equal(bcast, np.repeat(w[:, 7], 32))
    np.testing.assert_array_equal(up, w[:, np.where(lanes >= 3, lanes - 3, lanes)].ravel())
    np.testing.assert_array_equal(dsum, np.repeat(w.astype(np.float64).sum(1) * 0.5, 32))
    np.testing.assert_array_equal(seg16, np.repeat(v.reshape(6, 16).sum(1), 16))


def test_votes(engine):
    p = np.zeros(64, np.int32)
    p[[0, 3, 31]] = 1
    p[32:] = 1
    ballot, all_, any_ = np.zeros(64, np.uint32), np.zeros(64, np.int32), np.zeros(64, np.int32)
    engine.kernel("votes").launch((1,), (64,), [ptr(p), ptr(ballot), ptr(all_), ptr(any_)])
    assert set(ballot[:32]) == {(1 << 0) | (1 << 3) | (1 << 31)} and set(ballot[32:]) == {0xFFFFFFFF}
    assert set(all_[:32]) == {0} and set(all_[32:]) == {1} and set(any_) == {1}


@pytest.mark.parametrize("schedule", hostbuild.SCHEDULES)
def test_atomics_across_blocks(engine, schedule):
    blocks, threads = 8, 128
    counter = np.zeros(2, np.uint32)
    maxv = np.array([-1], np.int32)
    cas = np.zeros(1, np.uint64)
    ticket = np.full(blocks * threads, -1, np.int32)
    engine.kernel("atomics").launch((blocks,), (threads,), [ptr(counter), ptr(maxv), ptr(cas), ptr(ticket)],
                                    schedule=schedule)
    assert counter[0] == blocks * threads and maxv[0] == blocks * threads - 1
    assert 1 <= cas[0] <= blocks * threads
    np.testing.assert_array_equal(np.sort(ticket), np.arange(blocks * threads))
    first = ticket.reshape(blocks, threads)
    if schedule == "inorder":
        np.testing.assert_array_equal(ticket, np.arange(blocks * threads))
    elif schedule == "reversed":
        np.testing.assert_array_equal(ticket, np.arange(blocks * threads)[::-1])
    else:  # a fixed permutation, not monotonic, threads of different warps interleaved
        order = np.argsort(first[first.min(axis=1).argmin()])
        assert not (np.all(np.diff(order) > 0) or np.all(np.diff(order) < 0))
        assert len(set(order[:32] // 32)) > 1


def test_indices_2d_3d(engine):
    grid, block = (3, 2, 2), (4, 3, 2)
    n = math.prod(grid) * math.prod(block)
    out = np.full(n, -1, np.int32)
    engine.kernel("indices").launch(grid, block, [ptr(out)])
    bz, by, bx, tz, ty, tx = np.meshgrid(*[np.arange(d) for d in (grid[2], grid[1], grid[0], block[2], block[1], block[0])],
                                         indexing="ij")
    want = ((bz * 8 + by) * 8 + bx) * 4096 + (tz * 16 + ty) * 16 + tx
    np.testing.assert_array_equal(out, want.ravel())


def test_barrier_reductions_and_dynamic_shared_memory(engine):
    p = np.zeros(64, np.int32)
    p[:10] = 1
    out = np.zeros(3, np.int32)
    engine.kernel("barrier_count").launch((1,), (64,), [ptr(p), ptr(out)])
    assert list(out) == [10, 0, 1]
    a = np.arange(100, dtype=np.int32)
    o = np.zeros(100, np.int32)
    engine.kernel("dynamic_shared").launch((1,), (100,), [ptr(a), ptr(o)], shared_mem=400)
    np.testing.assert_array_equal(o, a[::-1] * 2)


def test_cuda_min_max_fmin_fmax_overloads(engine):
    d = np.array([np.nan, 1.0, -0.0, 0.0, -2.0, 7e9], np.float64)
    dout = np.zeros(5, np.float64)
    iout = np.zeros(4, np.int64)
    engine.kernel("math_overloads").launch((1,), (1,), [ptr(d), ptr(dout), ptr(iout)])
    assert list(dout[:2]) == [1.0, 1.0]
    assert list(np.signbit(dout[2:5])) == [True, False, True] and not dout[2:5].any()
    assert list(iout[:3]) == [-3, 7000000000, 7]  # min(7u, (int)-2) compares as unsigned: 7
    assert iout[3] == CANON32


# --- schedules expose a missing barrier -------------------------------------------------------------------

def _results(kernel, make_args, schedules=hostbuild.SCHEDULES):
    out = {}
    for s in schedules:
        args, result = make_args()
        kernel.launch(*args, schedule=s)
        out[s] = result.copy()
    return out


def test_schedules_expose_a_missing_first_barrier(engine):
    rng = np.random.default_rng(3)
    data = rng.integers(1, 100, 4 * 256).astype(np.int32)
    want = data.reshape(4, 256).sum(1)

    def args(name):
        def make():
            out = np.zeros(4, np.int32)
            return ((4,), (256,), [ptr(data), ptr(out)]), out
        return make

    good = _results(engine.kernel("block_sum<true>"), args("good"))
    for s, r in good.items():
        np.testing.assert_array_equal(r, want, err_msg=s)
    racy = _results(engine.kernel("block_sum<false>"), args("racy"))
    assert any(not np.array_equal(r, want) for r in racy.values()), racy


def test_schedules_expose_shared_memory_reused_without_a_barrier(engine):
    segments = 4
    rng = np.random.default_rng(4)
    data = rng.integers(-50, 50, segments * 256).astype(np.int32)
    want = data.reshape(segments, 256).sum(1)

    def make():
        out = np.zeros(segments, np.int32)
        return ((1,), (256,), [ptr(data), ptr(out), i32(segments)]), out

    for s, r in _results(engine.kernel("segment_sums<true>"), make).items():
        np.testing.assert_array_equal(r, want, err_msg=s)
    racy = _results(engine.kernel("segment_sums<false>"), make)
    assert any(not np.array_equal(r, want) for r in racy.values()), racy


# --- faults ----------------------------------------------------------------------------------------

def test_misaligned_16_byte_vector_accesses_fault(engine):
    buf = np.zeros(64, np.uint32)
    base = buf.ctypes.data
    off = (-base // 4) % 4  # first 16-byte aligned element
    engine.kernel("store_uint4").launch((1,), (2,), [ptr(buf), i32(off)])
    assert list(buf[off:off + 8]) == [1, 2, 3, 4] * 2
    out = np.zeros(1, np.uint32)
    engine.kernel("load_uint4").launch((1,), (1,), [ptr(buf), i32(off), ptr(out)])
    assert out[0] == 10
    with pytest.raises(KernelFault, match="misaligned 16-byte vector store of uint4"):
        engine.kernel("store_uint4").launch((1,), (2,), [ptr(buf), i32(off + 1)])
    with pytest.raises(KernelFault, match="misaligned 16-byte __ldg"):
        engine.kernel("load_uint4").launch((1,), (1,), [ptr(buf), i32(off + 2), ptr(out)])
    with pytest.raises(KernelFault, match="misaligned 16-byte vector load of uint4"):
        engine.kernel("copy_uint4").launch((1,), (1,), [ptr(buf), i32(off + 3), ptr(out)])


def test_a_byte_written_by_two_threads_faults(engine):
    """GPUQ_RECORD_STORE (kernels/formats.cu's packed int4 bytes): one writer per byte and launch."""
    buf = np.zeros(64, np.uint8)
    engine.kernel("packed_stores").launch((1,), (32,), [ptr(buf), i32(0)])
    assert list(buf[:32]) == list(range(32))
    engine.kernel("packed_stores").launch((1,), (32,), [ptr(buf), i32(0)])  # a new launch: new owners
    with pytest.raises(KernelFault, match=r"written by two threads of one launch \(global thread 0, then 1\)"):
        engine.kernel("packed_stores").launch((1,), (32,), [ptr(buf), i32(1)])


@pytest.mark.parametrize("name, block, match", [
    ("partial_barrier", 256, r"__syncthreads \(engine_test.cu:\d+\) reached by 100 of 256 threads; 156 exited"),
    ("split_barrier", 256, "threads wait at different barriers"),
    ("shuffle_exited_lane", 32, r"__shfl_xor_sync\(mask=0xffffffff\) in warp 0 never completes: lane 5 exited"),
    ("shuffle_vs_barrier", 32, "lane 3 waits at __syncthreads"),
    ("shuffle_partial_warp", 48, "lane 16 does not exist"),
    ("shuffle_not_in_mask", 32, r"called by lane (1[6-9]|2\d|3[01]), which is not in the mask"),
])
@pytest.mark.parametrize("schedule", hostbuild.SCHEDULES)
def test_barrier_and_collective_misuse_faults_instead_of_hanging(engine, name, block, match, schedule):
    p = np.zeros(256, np.float32 if "shuffle" in name else np.int32)
    with pytest.raises(KernelFault, match=match):
        engine.kernel(name).launch((2,), (block,), [ptr(p)], schedule=schedule)


def test_device_faults_come_back_as_exceptions(engine):
    p = np.array([0, 0, 1, 0], np.int32)
    with pytest.raises(KernelFault, match=r"block \(0,0,0\), thread \(2,0,0\): assertion failed: p\[threadIdx.x\] == 0"):
        engine.kernel("device_assert").launch((1,), (4,), [ptr(p)])
    with pytest.raises(KernelFault, match="illegal memory access at address 0x10"):
        engine.kernel("wild_store").launch((1,), (1,), [ptr(p), i64(16)])
    with pytest.raises(KernelFault, match="integer division by zero"):
        engine.kernel("divide").launch((1,), (1,), [ptr(np.array([7, 0], np.int32)), ptr(p)])
    with pytest.raises(KernelFault, match="misaligned 4-byte atomicAdd"):
        engine.kernel("atomic_misaligned").launch((1,), (1,), [ptr(p)])
    with pytest.raises(KernelFault, match="fiber stack overflow"):
        engine.kernel("recurse").launch((1,), (1,), [ptr(np.array([0, 100], np.int32))])
    # The engine is intact afterwards.
    ok = np.array([0, 3], np.int32)
    engine.kernel("recurse").launch((1,), (1,), [ptr(ok)])
    assert ok[0] == 3 + 2 + 1 + 0
    out = np.zeros(1, np.int32)
    engine.kernel("divide").launch((1,), (1,), [ptr(np.array([7, 2], np.int32)), ptr(out)])
    assert out[0] == 3


def test_launch_configuration_and_arguments_are_checked(engine):
    k = engine.kernel("takes_long")
    out = np.zeros(1, np.int32)
    k.launch((1,), (1,), [i64(5 << 32), ptr(out)])
    assert out[0] == 5
    with pytest.raises(KernelFault, match=r"argument 0 \(long long\) is 4 bytes, the parameter takes 8"):
        k.launch((1,), (1,), [i32(5), ptr(out)])
    with pytest.raises(KernelFault, match="takes 2 arguments, got 1"):
        k.launch((1,), (1,), [ptr(out)])
    with pytest.raises(TypeError):
        k.launch((1,), (1,), [5, ptr(out)])
    s = engine.kernel("small_bounds")
    buf = np.zeros(2048, np.int32)
    s.launch((1,), (64,), [ptr(buf)])
    with pytest.raises(KernelFault, match=r"exceed its __launch_bounds__ \(64\)"):
        s.launch((1,), (65,), [ptr(buf)])
    r = engine.kernel("shuffles")
    bad = [((1,), (1025,), r"block dimension x = 1025 outside \[1, 1024\]"), ((1,), (1, 1, 65), "block dimension z = 65"),
           ((1, 65536), (1,), "grid dimension y = 65536"), ((0,), (1,), "grid dimension x = 0"),
           ((2**31,), (1,), "grid dimension x"), ((1,), (32, 33), "at most 1024")]
    for grid, block, match in bad:
        with pytest.raises(KernelFault, match=match):
            r.launch(grid, block, [ptr(buf)] * 7)
    with pytest.raises(KernelFault, match="dynamic shared memory"):
        engine.kernel("dynamic_shared").launch((1,), (1,), [ptr(buf), ptr(buf)], shared_mem=227 * 1024 + 1)
    with pytest.raises(ValueError, match="schedule"):
        s.launch((1,), (1,), [ptr(buf)], schedule="random")


# --- floating-point environment and the ucontext fallback ------------------------------------------

@pytest.mark.skipif(os.uname().machine != "x86_64", reason="MXCSR is x86-64")
def test_launch_resets_and_restores_the_floating_point_environment(engine):
    lib = engine._lib
    saved = lib.cudasim_get_mxcsr()
    hostile = 0x1F80 | 0x8000 | 0x0040 | 0x4000  # FTZ, DAZ, round up
    inp = np.array([2.0**-126, 0.5, 2.0**-140, 1.0, 2.0**-24], np.float32)
    out = np.zeros(3, np.float32)
    dout = np.zeros(1, np.float64)
    try:
        lib.cudasim_set_mxcsr(hostile)
        engine.kernel("subnormals").launch((1,), (1,), [ptr(inp), ptr(out), ptr(dout)])
        after = lib.cudasim_get_mxcsr()
    finally:
        lib.cudasim_set_mxcsr(saved)
    assert after == hostile
    assert out[0] == np.float32(2.0**-127) and out[1] == np.float32(2.0**-140)
    assert out[2] == np.float32(1.0) + np.float32(2.0**-24)  # nearest: 1.0 (round-up would give 1 + 2^-23)
    assert dout[0] == 1.0 / 3.0


def test_ucontext_fallback_runs_the_same(engine):
    mod = hostbuild.build(ENGINE_SRC, ["reverse_block", "segment_sums<true>", "partial_barrier"],
                          defines=("CUDASIM_UCONTEXT",))
    a = np.arange(512, dtype=np.int32)
    out = np.zeros(512, np.int32)
    mod.kernel("reverse_block").launch((2,), (256,), [ptr(a), ptr(out)], schedule="interleaved")
    np.testing.assert_array_equal(out, a.reshape(2, 256)[:, ::-1].ravel())
    data = np.arange(512, dtype=np.int32)
    sums = np.zeros(2, np.int32)
    mod.kernel("segment_sums<true>").launch((1,), (256,), [ptr(data), ptr(sums), i32(2)])
    np.testing.assert_array_equal(sums, data.reshape(2, 256).sum(1))
    with pytest.raises(KernelFault, match="reached by 100 of 256"):
        mod.kernel("partial_barrier").launch((1,), (256,), [ptr(out)])


# --- real gpuq kernels ----------------------------------------------------------------------------------

def _contract_values(n, dtype, rng):
    x = (rng.standard_normal(n) * 300).astype(dtype)
    special = [np.nan, np.inf, -np.inf, 0.0, -0.0, 0.25, 0.75, 1.25, -1.25, 63.75, -64.25, 1e-40, 5e4, -5e4]
    x[:len(special)] = np.array(special).astype(dtype)
    x[-3:] = np.array([2.25, -0.25, np.nan]).astype(dtype)  # more ties at the scalar tail
    return x


def _launch_elementwise(kernel, op, src, out, scales, zps, m0=0, m1=0, schedule="inorder"):
    """As gpuq/backends/cuda/backend.py launches (head, vec, 256 threads, grid of units)."""
    n = src.size
    float_arr, code_arr = (src, out) if op == "quantize" else (out, src)
    head = min(((-float_arr.ctypes.data) % 16) // float_arr.itemsize, n)
    vec = 1 | (2 if (code_arr.ctypes.data + head) % 16 == 0 else 0)
    units = 1 + -(-(n - head) // 16)
    grid = max(1, -(-units // 256))
    kernel.launch((grid,), (256,), [ptr(src), ptr(out), ptr(scales), ptr(zps), i64(n), i64(head), i32(vec),
                                    i64(m0), i64(m1), i64(0), i64(0)], schedule=schedule)


@pytest.fixture(scope="module")
def quantize_module():
    reg = hostbuild.kernel_registry()
    names = [n for f in ("float16", "float32", "float64") for n in reg.quantize_group(f, "int8")]
    names += list(reg.quantize_group("float32", "uint8"))
    return hostbuild.build(reg.source_text("quantize.cu"), names)


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
@pytest.mark.parametrize("schedule", hostbuild.SCHEDULES)
def test_quantize_kernel_matches_the_host_backend_bit_for_bit(quantize_module, dtype, schedule):
    import gpuq

    reg = hostbuild.kernel_registry()
    rng = np.random.default_rng(5)
    n = 1025
    x = _contract_values(n, dtype, rng)
    ct = np.float64 if dtype == "float64" else np.float32
    scale = np.array([0.5], ct)
    zp = np.array([3], np.int32)
    q = np.full(n, 99, np.int8)
    k = quantize_module.kernel(reg.quantize_name(dtype, "int8", True, "tensor"))
    _launch_elementwise(k, "quantize", x, q, scale, zp, schedule=schedule)
    np.testing.assert_array_equal(q, gpuq.quantize(x, scale, zp, dtype=np.int8))
    # Per-channel, [5, 205] along axis 1 of a (5, 205) view... as [outer=1, C=5, inner=205].
    xs = x.reshape(5, 205)
    scales = np.array([0.5, 0.25, 1.5, 3.0, 1e-3], ct)
    zps = np.array([0, -7, 5, 127, -128], np.int32)
    qc = np.zeros(n, np.int8)
    kc = quantize_module.kernel(reg.quantize_name(dtype, "int8", True, "channel"))
    _launch_elementwise(kc, "quantize", x, qc, scales, zps, m0=5, m1=205, schedule=schedule)
    np.testing.assert_array_equal(qc.reshape(5, 205), gpuq.quantize(xs, scales, zps, axis=0, dtype=np.int8))


def test_quantize_symmetric_uint8_and_a_misaligned_vector_flag(quantize_module):
    import gpuq

    reg = hostbuild.kernel_registry()
    rng = np.random.default_rng(6)
    x = _contract_values(1025, "float32", rng)
    scale = np.array([0.75], np.float32)
    q = np.zeros(1025, np.uint8)
    k = quantize_module.kernel(reg.quantize_name("float32", "uint8", False, "tensor"))
    _launch_elementwise(k, "quantize", x, q, scale, scale)
    np.testing.assert_array_equal(q, gpuq.quantize(x, scale, dtype=np.uint8))
    # Claiming 16-byte alignment (vec = both sides) from an element that is not aligned faults.
    buf = np.zeros(1040, np.float32)
    xm = buf[(-buf.ctypes.data // 4) % 4 + 1:][:1025]
    xm[:] = x
    with pytest.raises(KernelFault, match="misaligned 16-byte"):
        k.launch((1,), (256,), [ptr(xm), ptr(q), ptr(scale), ptr(scale), i64(1025), i64(0), i32(3),
                                i64(0), i64(0), i64(0), i64(0)])


def test_dequantize_to_float16_matches_the_host_backend():
    import gpuq

    reg = hostbuild.kernel_registry()
    names = reg.dequantize_group("int8", "float16")
    mod = hostbuild.build(reg.source_text("dequantize.cu"), names)
    q = np.arange(-128, 128, dtype=np.int8).repeat(5)[:1025]
    for scale, zp in [(np.float32(0.5), 3), (np.float32(300.0), -128), (np.float32(2.0**-20), 0)]:
        s = np.array([scale], np.float32)
        z = np.array([zp], np.int32)
        y = np.zeros(1025, np.float16)
        _launch_elementwise(mod.kernel(reg.dequantize_name("int8", "float16", True, "tensor")), "dequantize", q, y,
                            s, z)
        want = gpuq.dequantize(q, s, z, dtype=np.float16)
        np.testing.assert_array_equal(y.view(np.uint16), want.view(np.uint16))


def _key(f: np.ndarray) -> np.ndarray:
    b = np.asarray(f, np.float32).view(np.uint32)
    return np.where(b & 0x80000000, ~b, b | 0x80000000).astype(np.uint32)


@pytest.mark.parametrize("warp", [False, True])
@pytest.mark.parametrize("schedule", hostbuild.SCHEDULES)
def test_qparams_minmax_segments_block_reduction(warp, schedule):
    reg = hostbuild.kernel_registry()
    mod = hostbuild.build(reg.source_text("qparams.cu"), [reg.segments_name(np.float32, w) for w in (False, True)])
    k = mod.kernel(reg.segments_name(np.float32, warp))
    rng = np.random.default_rng(2)
    rows, n, g = 3, 3000, 1000 if not warp else 700
    x = rng.standard_normal(rows * n).astype(np.float32) * 10
    x[5] = np.nan
    x[n + 17] = 2.0**-140  # a subnormal minimum magnitude must survive
    x[2 * n: 2 * n + g] = np.nan  # a piece with no number
    x[2 * n + g + 1] = -0.0
    groups = -(-n // g)
    pieces = rows * groups
    lo = np.full(rows * groups, 0xFF800000, np.uint32)  # key(+inf)
    hi = np.full(rows * groups, 0x007FFFFF, np.uint32)  # key(-inf)
    blocks = -(-pieces // 8) if warp else pieces
    k.launch((blocks,), (256,), [ptr(x), i64(rows), i64(n), i64(g), i64(rows), i32(1), ptr(lo), ptr(hi)],
             schedule=schedule)
    xs = x.reshape(rows, n)
    want_lo, want_hi = [], []
    for r in range(rows):
        for j in range(groups):
            piece = xs[r, j * g:(j + 1) * g]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN piece
                mn, mx = np.nanmin(piece), np.nanmax(piece)
            if np.isnan(mn):
                mn, mx = np.float32(np.inf), np.float32(-np.inf)
            want_lo.append(mn)
            want_hi.append(mx)
    np.testing.assert_array_equal(lo, _key(np.array(want_lo, np.float32)))
    np.testing.assert_array_equal(hi, _key(np.array(want_hi, np.float32)))


# --- build cache and sanitizer ----------------------------------------------------------------------

def test_builds_are_cached_in_process_and_on_disk(tmp_path):
    src = "__global__ void k(int* p) { p[threadIdx.x] = static_cast<int>(threadIdx.x) * 3; }\n"
    a = hostbuild.build(src, ["k"])
    assert hostbuild.build(src, ["k"]) is a
    assert a.path.exists() and a.path.parent == hostbuild.cache_dir()
    # Two processes building one new module at once, in a fresh cache: both succeed, one library.
    code = textwrap.dedent(f"""
        import numpy as np
        from cudasim import hostbuild
        m = hostbuild.build({src!r} + "// fresh", ["k"])
        p = np.zeros(4, np.int32)
        m.kernel("k").launch((1,), (4,), [p.ctypes.data.to_bytes(8, "little")])
        assert list(p) == [0, 3, 6, 9]
        print(m.path)
    """)
    env = dict(os.environ, GPUQ_CUDASIM_CACHE=str(tmp_path),
               PYTHONPATH=os.pathsep.join([str(hostbuild.TESTS_DIR), os.environ.get("PYTHONPATH", "")]))
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    results = [p.communicate(timeout=300) + (p.returncode,) for p in procs]
    assert all(rc == 0 for _, _, rc in results), results
    assert results[0][0] == results[1][0]
    assert sorted(f.suffix for f in tmp_path.iterdir() if f.suffix == ".so") == [".so"]
    assert not [f for f in tmp_path.iterdir() if f.name.endswith(".tmp")]


UB_SRC = r"""
__global__ void shift(const int* amount, unsigned long long* out) {
    out[0] = 1ull << amount[0];   // undefined for amount >= 64
}
"""


def test_undefined_behaviour_is_caught_by_the_sanitized_build_in_a_child():
    amount = np.array([64], np.int32)
    out = np.zeros(1, np.uint64)
    # The normal build runs it without bringing this process down (the value is whatever x86 gives).
    hostbuild.build(UB_SRC, ["shift"]).kernel("shift").launch((1,), (1,), [ptr(amount), ptr(out)])
    code = textwrap.dedent(f"""
        import numpy as np
        from cudasim import hostbuild
        m = hostbuild.build({UB_SRC!r}, ["shift"], sanitize=True)
        a, o = np.array([AMOUNT], np.int32), np.zeros(1, np.uint64)
        m.kernel("shift").launch((1,), (1,), [a.ctypes.data.to_bytes(8, "little"), o.ctypes.data.to_bytes(8, "little")])
        print("value", int(o[0]))
    """)
    clean = hostbuild.run_sanitized(code.replace("AMOUNT", "3"))
    assert clean.returncode == 0 and "value 8" in clean.stdout, clean.stderr
    dirty = hostbuild.run_sanitized(code.replace("AMOUNT", "64"))
    assert dirty.returncode != 0
    assert "runtime error" in dirty.stderr and "shift exponent 64" in dirty.stderr, dirty.stderr


def test_real_kernels_are_clean_under_ubsan():
    code = textwrap.dedent("""
        import numpy as np, gpuq
        from cudasim import hostbuild
        reg = hostbuild.kernel_registry()
        m = hostbuild.build(reg.source_text("quantize.cu"), reg.quantize_group("float32", "int8"), sanitize=True)
        x = np.linspace(-300, 300, 1025).astype(np.float32); x[:3] = [np.nan, np.inf, -np.inf]
        s, z, q = np.array([0.5], np.float32), np.array([3], np.int32), np.zeros(1025, np.int8)
        P = lambda a: a.ctypes.data.to_bytes(8, "little")
        head = min(((-x.ctypes.data) % 16) // 4, 1025)
        vec = 1 | (2 if (q.ctypes.data + head) % 16 == 0 else 0)
        args = [P(x), P(q), P(s), P(z), np.int64(1025).tobytes(), np.int64(head).tobytes(), np.int32(vec).tobytes()]
        args += [np.int64(0).tobytes()] * 4
        for sched in hostbuild.SCHEDULES:
            m.kernel(reg.quantize_name("float32", "int8", True, "tensor")).launch((1,), (256,), args, schedule=sched)
            assert np.array_equal(q, gpuq.quantize(x, s, z, dtype=np.int8))
        print("ok")
    """)
    r = hostbuild.run_sanitized(code)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]
