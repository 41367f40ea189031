"""The one pass's float encodes (``weight_pass.float_round`` and fp4's ``e2m1_round``: the code and
its value from the same rounded bits, no table) against ``loops.fp8_one`` / ``loops.e2m1_of`` and
``formats.fp8_table``, bit for bit.

All 2**32 float32 quotients were checked once for every layout (the loop below over every
pattern, 16-25 s each on 2 cores); CI checks every 251st pattern and the edges: each layout's
rounding boundaries (the values halfway between neighbouring codes, and one float32 step either
side), its largest value and the overflow above it, subnormals, signed zeros, Inf and NaN
payloads with either sign.
"""

import numpy as np
import pytest
from numba import njit

from gpuq.backends.host import formats
from gpuq.backends.host.loops import e2m1_of, fp8_one
from gpuq.backends.host.weight_pass import e2m1_round, float_round, round_consts

FORMATS = ["e4m3fn", "e5m2", "e2m1fn", "e2m3fn", "e3m2fn"]


@njit(error_model="numpy")  # x / 0 is Inf or NaN, as in the pass (loops.JIT)
def _encode(x, s, g):
    codes = np.empty(x.size, np.uint8)
    values = np.empty(x.size, np.float32)
    for i in range(x.size):
        codes[i], values[i] = float_round(x[i], s, g)
    return codes, values


@njit(error_model="numpy")  # x / 0 is Inf or NaN, as in the pass (loops.JIT)
def _reference(x, s, f):
    codes = np.empty(x.size, np.uint8)
    for i in range(x.size):
        v = x[i]
        t = np.float32(v / s)
        codes[i] = fp8_one(np.float32(np.copysign(t, v)) if t != t else t, f)
    return codes


def _edges(fmt):
    """Every code's value, the midpoints between neighbours, and one float32 step either side of
    each, with both signs; zeros, float32 subnormals, the largest finite float32, Inf, NaNs."""
    table = formats.fp8_table(fmt, np.float64)
    mags = np.unique(np.abs(table[np.isfinite(table)]))
    points = np.concatenate([mags, (mags[1:] + mags[:-1]) / 2, [mags[-1] * 1.03, mags[-1] * 1.1]])
    p32 = points.astype(np.float32)
    near = np.concatenate([p32, np.nextafter(p32, np.float32(np.inf)), np.nextafter(p32, np.float32(0))])
    u = near.view(np.uint32)
    specials = np.array([0, 1, 0x007FFFFF, 0x00800000, 0x7F7FFFFF, 0x7F800000, 0x7F800001, 0x7FC00000,
                         0x7FFFFFFF, 0x3F800000], np.uint32)
    u = np.concatenate([u, specials])
    return np.concatenate([u, u | np.uint32(0x80000000)])


@pytest.mark.parametrize("fmt", FORMATS)
def test_float_round_matches_fp8_one_and_table(fmt):
    u = np.concatenate([np.arange(0, 1 << 32, 251, dtype=np.uint64).astype(np.uint32), _edges(fmt)])
    codes, values = _encode(u.view(np.float32), np.float32(1), round_consts(fmt))
    want = _reference(u.view(np.float32), np.float32(1), formats.fp8_consts(fmt, True))
    np.testing.assert_array_equal(codes, want)
    np.testing.assert_array_equal(values.view(np.uint32), formats.fp8_table(fmt, np.float32)[want].view(np.uint32))


@pytest.mark.parametrize("fmt", ["e4m3fn", "e2m3fn"])
def test_float_round_divides_as_fp8_of(fmt):
    # The quotient is v / s in float32 (a scale that is not a power of two rounds it), and a NaN
    # quotient of numbers (0 / 0, Inf / Inf) takes v's sign, as loops.fp8_of gives it.
    rng = np.random.default_rng(7)
    u = np.concatenate([rng.integers(0, 1 << 32, 200_000, dtype=np.uint64).astype(np.uint32),
                        np.float32([0.0, -0.0, np.inf, -np.inf]).view(np.uint32)])
    for s in (np.float32(0.3), np.float32(1e-3), np.float32(0), np.float32(np.inf)):
        codes, values = _encode(u.view(np.float32), s, round_consts(fmt))
        want = _reference(u.view(np.float32), s, formats.fp8_consts(fmt, True))
        np.testing.assert_array_equal(codes, want)
        np.testing.assert_array_equal(values.view(np.uint32),
                                      formats.fp8_table(fmt, np.float32)[want].view(np.uint32))


def test_round_consts_refuses_unknown_layout():
    with pytest.raises(KeyError):
        round_consts("e8m0")


@njit(error_model="numpy")
def _e2m1_pairs(x, s):
    codes, values, want = np.empty(x.size, np.uint8), np.empty(x.size, np.float32), np.empty(x.size, np.uint8)
    for i in range(x.size):
        codes[i], values[i] = e2m1_round(x[i], s)
        want[i] = e2m1_of(x[i], s)
    return codes, values, want


@pytest.mark.parametrize("s", [np.float32(1), np.float32(0.37), np.float32(0), np.float32(np.inf)])
def test_e2m1_round_matches_e2m1_of_and_table(s):
    u = np.concatenate([np.arange(0, 1 << 32, 251, dtype=np.uint64).astype(np.uint32), _edges("e2m1fn")])
    if s != 1:
        u = u[::16]
    codes, values, want = _e2m1_pairs(u.view(np.float32), s)
    np.testing.assert_array_equal(codes, want)
    np.testing.assert_array_equal(values.view(np.uint32), formats.fp8_table("e2m1fn", np.float32)[want].view(np.uint32))
