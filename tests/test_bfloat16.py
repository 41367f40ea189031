"""bfloat16 (ml_dtypes') end to end on every backend, against an independent oracle.

The contract (DESIGN.md section 1): bfloat16 input is widened to float32
exactly, then the float32 formula; bfloat16 output is the float32 result
rounded to nearest even. The oracle here is ml_dtypes' own conversions
(bf16 -> f32 exact, f32 -> bf16 to nearest even) around tests/reference.py's
naive float32 formulas; codes and bits are compared exactly. Special values
are bfloat16 bit patterns: its subnormals (below 2**-126, down to 2**-133),
NaN payloads, +/-Inf, the largest finite value, ties of x / s.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest

import gpuq
import reference
from conftest import require_numba
from gpuq._dtypes import FLOAT_DTYPES, as_dtype, is_bfloat16

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.dtype(np.float32)

#: bfloat16 bit patterns: +/-0, the smallest/largest subnormals, the smallest normal, the
#: largest finite, +/-Inf, NaNs (quiet, with payload, negative, signalling), ties at scale 1.
_SPECIAL_BITS = [0x0000, 0x8000, 0x0001, 0x8001, 0x007F, 0x807F, 0x0080, 0x7F7F, 0xFF7F,
                 0x7F80, 0xFF80, 0x7FC0, 0x7FFF, 0xFFC1, 0x7F81]
_TIES = [0.5, -0.5, 1.5, 2.5, -2.5, 126.5, 127.5, -127.5, 100.5, -100.5]


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint16)


def _special():
    return np.concatenate([np.array(_SPECIAL_BITS, np.uint16).view(BF16), np.array(_TIES, BF16)])


def _data(shape, seed):
    """Normal values times 40, a quarter of the elements random bit patterns (every class of
    bfloat16: subnormals, NaNs, Inf), the special values first."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    x = (rng.standard_normal(n) * 40).astype(BF16)
    pick = rng.random(n) < 0.25
    x[pick] = rng.integers(0, 2**16, int(pick.sum()), dtype=np.uint16).view(BF16)
    sp = _special()
    k = min(n, sp.size)
    x[:k] = sp[:k]
    return x.reshape(shape)


def _widened(x):
    """The oracle's float32 of bfloat16 ``x``: ml_dtypes' cast (exact), checked exact here."""
    f = x.astype(F32)
    # Exactness of the oracle itself: the float32 bits are the bfloat16 bits shifted up.
    assert np.array_equal(f.view(np.uint32), x.view(np.uint16).astype(np.uint32) << 16)
    return f


def _params(pshape, qdtype, has_zp, seed):
    rng = np.random.default_rng(seed + 1000)
    s = rng.uniform(0.05, 3.0, pshape).astype(F32)
    s.reshape(-1)[:1] = 1.0  # the ties above stay ties
    z = None
    if has_zp:
        lo, hi = (-100, 100) if np.dtype(qdtype) == np.int8 else (0, 255)
        z = rng.integers(lo, hi, pshape).astype(np.int32)
        if z.size > 2:
            z.reshape(-1)[-2:] = (2**31 - 1, -(2**31))  # the widest zero points
    return s, z


SCHEMES = [  # (shape, axis, group_size)
    ((1,), None, None), ((17,), None, None), ((1025,), None, None), ((4097,), None, None),
    ((3, 17, 5), 1, None), ((17, 6), 0, None), ((4, 1025), -1, None),
    ((3, 4, 5), (0, 2), None), ((2, 3, 4), (1, 2), None),
    ((10, 5), 0, 3), ((4, 17), 1, 4), ((5, 1025), 1, 128), ((4097,), 0, 100), ((17, 3), 0, 17),
]


def _sid(case):
    shape, axis, g = case
    return f"{'x'.join(map(str, shape))}-ax{axis}-g{g}"


@pytest.mark.parametrize("qdtype", ["int8", "uint8"])
@pytest.mark.parametrize("has_zp", [False, True])
@pytest.mark.parametrize("case", SCHEMES, ids=_sid)
def test_quantize_matches_oracle(backend, case, has_zp, qdtype):
    shape, axis, g = case
    seed = SCHEMES.index(case)
    x = _data(shape, seed)
    s, z = _params(reference.param_shape(shape, axis, g), qdtype, has_zp, seed)
    expected = reference.quantize(_widened(x), s, z, axis=axis, group_size=g, dtype=qdtype)
    put = backend.put
    q = gpuq.quantize(put(x), put(s), None if z is None else put(z), axis=axis, group_size=g,
                      dtype=qdtype)
    got = backend.get(q)
    assert got.dtype == np.dtype(qdtype) and got.shape == shape
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("out_name", ["bfloat16", "bf16", "BF16", "type", "dtype"])
@pytest.mark.parametrize("has_zp", [False, True])
@pytest.mark.parametrize("case", SCHEMES, ids=_sid)
def test_dequantize_bfloat16_output_matches_oracle(backend, case, has_zp, out_name):
    shape, axis, g = case
    seed = SCHEMES.index(case)
    rng = np.random.default_rng(seed)
    qdtype = np.dtype(np.uint8 if seed % 2 else np.int8)
    lo, hi = reference.QRANGE[qdtype]
    q = rng.integers(lo, hi + 1, shape).astype(qdtype)
    q.reshape(-1)[:2] = (lo, hi)[:q.size]
    s, z = _params(reference.param_shape(shape, axis, g), qdtype, has_zp, seed)
    dtype = {"type": ml_dtypes.bfloat16, "dtype": BF16}.get(out_name, out_name)
    expected = reference.dequantize(q, s, z, axis=axis, group_size=g, dtype=F32).astype(BF16)
    put = backend.put
    y = backend.get(gpuq.dequantize(put(q), put(s), None if z is None else put(z), axis=axis,
                                    group_size=g, dtype=dtype))
    assert y.dtype == BF16 and y.shape == shape
    np.testing.assert_array_equal(_bits(y), _bits(expected))


@pytest.mark.parametrize("scale", [
    1 + 2**-8,          # (q - zp) * s halfway between bfloat16 neighbours: ties to even
    3 + 2**-6 + 2**-7,  # more mantissa bits than bfloat16 keeps, rounding both ways
    3.4e38,             # the product rounds up to +/-Inf in bfloat16 (finite in float32)
    3.3e38,             # beyond float32 for |q - zp| > 1: +/-Inf already in float32
    2.0**-140,          # float32 subnormal products: bfloat16 subnormals, rounded
    2.0**-133,          # the smallest bfloat16 subnormal times the integer: exact
    1.2e-38,            # around the smallest normal
])
def test_dequantize_rounding_edges(backend, scale):
    q = np.arange(-128, 128, dtype=np.int8)
    s = np.float32(scale)
    for zp in (None, 3):
        expected = reference.dequantize(q, s, zp, dtype=F32).astype(BF16)
        y = backend.get(gpuq.dequantize(backend.put(q), s, zp, dtype="bfloat16"))
        np.testing.assert_array_equal(_bits(y), _bits(expected))
    assert np.isinf(y.astype(F32)).any() == (scale > 3.39e38 / 128)


def test_subnormal_inputs_are_numbers(backend):
    """bfloat16 subnormals k * 2**-133 divided by 2**-133 are the integers k: nothing is flushed."""
    k = np.arange(-127, 128)
    x = (k * 2.0**-133).astype(BF16)
    assert np.array_equal(x.astype(np.float64) / 2.0**-133, k)  # exact in bfloat16
    q = backend.get(gpuq.quantize(backend.put(x), np.float32(2.0**-133)))
    np.testing.assert_array_equal(q, k.astype(np.int8))
    # and back out: (q * 2**-133) is a bfloat16 subnormal again, exactly
    y = backend.get(gpuq.dequantize(backend.put(q), np.float32(2.0**-133), dtype="bf16"))
    np.testing.assert_array_equal(_bits(y), _bits(x))


def test_nan_inf_saturation(backend):
    x = np.array([np.nan, -np.nan, np.inf, -np.inf, 3.389e38, -3.389e38, 0x7F81, 0], np.float32)
    x = x.astype(BF16)
    x.view(np.uint16)[6] = 0x7F81  # a signalling NaN pattern
    q = backend.get(gpuq.quantize(backend.put(x), np.float32(0.5), 7, dtype="uint8"))
    np.testing.assert_array_equal(q, [7, 7, 255, 0, 255, 0, 7, 7])
    q = backend.get(gpuq.quantize(backend.put(x), np.float32(1e-30)))
    np.testing.assert_array_equal(q, [0, 0, 127, -128, 127, -128, 0, 0])


@pytest.mark.parametrize("view", ["step", "reversed", "transposed", "offset"])
def test_non_contiguous_views(backend, view):
    base = _data((34, 66), 5)
    dev = backend.put(base)
    pick = {"step": lambda a: a[::2, 1::3], "reversed": lambda a: a[::-1, ::-2],
            "transposed": lambda a: a.T, "offset": lambda a: a[1:, 1:]}[view]
    x_host, x_dev = pick(base), pick(dev)
    s = np.random.default_rng(1).uniform(0.1, 2, x_host.shape[1]).astype(F32)
    z = np.full(x_host.shape[1], 5, np.int32)
    expected = reference.quantize(_widened(np.ascontiguousarray(x_host)), s, z, axis=1, dtype="int8")
    q = backend.get(gpuq.quantize(x_dev, backend.put(s), backend.put(z), axis=1))
    np.testing.assert_array_equal(q, expected)
    # out= a non-contiguous bfloat16 view, written in place.
    out_base = backend.put(np.zeros((2 * q.shape[0], q.shape[1]), BF16))
    out = out_base[::2]
    res = gpuq.dequantize(backend.put(q), backend.put(s), backend.put(z), axis=1, out=out)
    assert res is out
    full = backend.get(out_base)
    expected_y = reference.dequantize(q, s, z, axis=1, dtype=F32).astype(BF16)
    np.testing.assert_array_equal(_bits(full[::2]), _bits(expected_y))
    assert not _bits(full[1::2]).any()  # the rows between are untouched


def test_out_bfloat16_and_dtype_from_out(backend):
    q = np.arange(-8, 9, dtype=np.int8)
    out = backend.put(np.empty(q.shape, BF16))
    res = gpuq.dequantize(backend.put(q), np.float32(0.3), out=out)  # dtype from out
    assert res is out
    expected = reference.dequantize(q, np.float32(0.3), dtype=F32).astype(BF16)
    np.testing.assert_array_equal(_bits(backend.get(out)), _bits(expected))
    with pytest.raises(TypeError, match="out must have dtype bfloat16, got float16"):
        gpuq.dequantize(backend.put(q), np.float32(0.3), dtype="bf16",
                        out=backend.put(np.empty(q.shape, np.float16)))
    # quantize: bfloat16 src into an int8 out
    x = _data((17,), 3)
    qo = backend.put(np.empty(17, np.int8))
    assert gpuq.quantize(backend.put(x), np.float32(0.25), out=qo) is qo
    np.testing.assert_array_equal(backend.get(qo), reference.quantize(_widened(x), np.float32(0.25)))


QP_SCHEMES = [((1,), None, None), ((17,), None, None), ((4097,), None, None), ((7, 33), 1, None),
              ((5, 1100), 0, None), ((3, 1100), 0, None), ((3, 4, 5), (0, 2), None),
              ((10, 5), 0, 3), ((4, 1025), 1, 128), ((6, 64), 1, 16), ((5, 33), 0, None)]


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("qdtype", ["int8", "uint8"])
@pytest.mark.parametrize("case", QP_SCHEMES, ids=_sid)
def test_choose_qparams_and_quantize_dynamic_equal_widened(backend, case, qdtype, symmetric):
    shape, axis, g = case
    x = _data(shape, QP_SCHEMES.index(case))
    bits = x.view(np.uint16)
    bits[(bits & 0x7FFF) == 0x7F80] = 0x3F80  # +/-Inf refused (tested below): 1.0 instead
    # Signalling NaNs made quiet: NumPy's float32 np.fmax/np.fmin (gpuq's float32 ufunc
    # reduction) return NaN for a signalling one, so the float32 call would not be a fair
    # reference; bfloat16 with them is checked against the naive formula below.
    nan = (bits & 0x7FFF) > 0x7F80
    bits[nan] |= 0x0040
    f = _widened(x)
    kw = dict(axis=axis, group_size=g, dtype=qdtype, symmetric=symmetric)
    want = gpuq.choose_qparams(f, **kw)  # the same call on the exactly widened data, host
    ref = reference.choose_qparams(f, **kw)  # and the naive statement of the formula
    got = gpuq.choose_qparams(backend.put(x), **kw)
    for a, b, r in zip(got, want, ref):
        assert (a is None) == (b is None) == (r is None)
        if a is not None:
            np.testing.assert_array_equal(backend.get(a), b)
            np.testing.assert_array_equal(b, r)
    q, s, z = gpuq.quantize_dynamic(backend.put(x), **kw)
    q2, s2, z2 = gpuq.quantize_dynamic(f, **kw)
    np.testing.assert_array_equal(backend.get(q), q2)
    np.testing.assert_array_equal(backend.get(s), s2)
    assert (z is None) == (z2 is None)
    if z is not None:
        np.testing.assert_array_equal(backend.get(z), z2)
    np.testing.assert_array_equal(q2, reference.quantize(f, s2, z2, axis=axis, group_size=g, dtype=qdtype))


def test_choose_qparams_skips_signalling_nan(backend):
    x = np.array([0.0, 1.0, 0.0, -0.5, 0.25, 2.0], BF16)
    x.view(np.uint16)[[0, 2]] = (0x7F81, 0xFF81)  # signalling NaN patterns, both signs
    for kw in (dict(), dict(axis=0, group_size=3), dict(symmetric=True)):
        want = reference.choose_qparams(_widened(x), **kw)
        got = gpuq.choose_qparams(backend.put(x), **kw)
        for a, r in zip(got, want):
            assert (a is None) == (r is None)
            if a is not None:
                np.testing.assert_array_equal(backend.get(a), r)


def test_choose_qparams_refuses_inf(backend):
    x = np.array([1, 2, np.inf, 3], BF16)
    with pytest.raises(ValueError, match="x must be finite"):
        gpuq.choose_qparams(backend.put(x))
    with pytest.raises(ValueError, match="x must be finite"):
        gpuq.quantize_dynamic(backend.put(x.reshape(2, 2)), axis=0)


def test_op_objects(backend):
    x = _data((4, 33), 9)
    s = np.random.default_rng(2).uniform(0.1, 2, 4).astype(F32)
    z = np.arange(4, dtype=np.int32)
    put, get = backend.put, backend.get
    want = reference.quantize(_widened(x), s, z, axis=0)
    np.testing.assert_array_equal(
        get(gpuq.Quantize(scales=s, zps=z, qtype="per_channel", axis=0)(put(x))), want)
    np.testing.assert_array_equal(
        get(gpuq.DynamicQuantize(qtype="per_channel", axis=0)(put(x), put(s), put(z))), want)
    y_want = reference.dequantize(want, s, z, axis=0, dtype=F32).astype(BF16)
    for dt in ("bf16", "bfloat16", BF16):
        y = get(gpuq.Dequantize(scales=s, zps=z, qtype="per_channel", axis=0, dtype=dt)(put(want)))
        np.testing.assert_array_equal(_bits(y), _bits(y_want))
        y = get(gpuq.DynamicDequantize(qtype="per_channel", axis=0, dtype=dt)(put(want), put(s), put(z)))
        np.testing.assert_array_equal(_bits(y), _bits(y_want))


def test_dtype_names():
    for name in ("bfloat16", "bf16", "BF16", ml_dtypes.bfloat16, BF16):
        assert as_dtype(name, "dtype", FLOAT_DTYPES) == BF16
    assert BF16 in FLOAT_DTYPES and BF16 in list(FLOAT_DTYPES)
    assert is_bfloat16(BF16) and not is_bfloat16(np.dtype("V2")) and not is_bfloat16(np.dtype(np.float16))
    with pytest.raises(ValueError, match="dtype must be one of int8, uint8, int4, uint4, float8_e4m3fn, float8_e5m2, float4_e2m1fn, float6_e2m3fn, float6_e3m2fn, got 'bf16'"):
        gpuq.quantize(np.ones(2, F32), 1.0, dtype="bf16")
    with pytest.raises(TypeError, match="got bfloat16"):
        gpuq.quantize(np.ones(2, F32), 1.0, dtype=BF16)
    with pytest.raises(TypeError, match="src must be int8 or uint8 codes, an fp8 array or gpuq.Codes to dequantize, got bfloat16"):
        gpuq.dequantize(np.ones(2, BF16), 1.0)
    with pytest.raises(TypeError, match="scales must be floating"):  # scales are float32, not bfloat16
        gpuq.quantize(np.ones(2, BF16), np.ones(1, BF16))


def _run_python(code):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout.strip()


def test_no_ml_dtypes_import_and_a_clear_error_without_it():
    """gpuq never imports ml_dtypes for other dtypes; where ml_dtypes is missing the kernel
    table is unchanged and naming bfloat16 raises ImportError saying what to install."""
    out = _run_python(
        "import sys, numpy as np, gpuq\n"
        "x = np.linspace(-2, 2, 9, dtype=np.float32)\n"
        "q = gpuq.quantize(x, 0.1); gpuq.dequantize(q, 0.1, dtype='f16'); gpuq.quantize_dynamic(x)\n"
        "print('ml_dtypes' in sys.modules)\n")
    assert out == "False"
    out = _run_python(
        "import sys\n"
        "sys.modules['ml_dtypes'] = None  # as if not installed: importing it raises ImportError\n"
        "import numpy as np, gpuq\n"
        "from gpuq._dtypes import FLOAT_DTYPES\n"
        "from gpuq.backends.cuda import registry\n"
        "print(len(list(FLOAT_DTYPES)), sum('gpuq_bf16' in n for f in registry.SOURCES.values() for n in f()))\n"
        "try:\n"
        "    gpuq.dequantize(np.int8([1]), 0.5, dtype='bf16')\n"
        "except ImportError as e:\n"
        "    print(e)\n")
    lines = out.splitlines()
    # 20 quantize + 20 dequantize + 25 qparams.cu (8, qparams_tiles, 14 of the read-once
    # dynamic kernel: 7 schedules x int8/uint8, and 2 of the staged one) + 90 formats.cu (fp8 20,
    # int4 40, fp6 20, fp4 10) + 6 mse.cu instantiations (int, e4m3, e5m2, fp4, e2m3, e3m2)
    # + 16 weight_pass.cu (int words, e4m3, e5m2 x warp/block teams x per-tensor, the per-tensor
    # range, the e4m3/e5m2 block kernels, and the microscaling kernel weight_micro)
    assert lines[0] == "3 177"
    assert "bfloat16 needs the ml_dtypes package" in lines[1]


@pytest.mark.parametrize("loops", ["numpy", "numba"])
def test_no_full_size_float32_temporary(loops):
    """Blocks are widened/narrowed in scratch: a call allocates its output and scratch only."""
    from conftest import host_kernels

    n = 1 << 22
    x = (np.random.default_rng(0).standard_normal(n) * 30).astype(BF16)
    with host_kernels(loops):
        q = gpuq.quantize(x, np.float32(0.25))  # warm: compile, scratch, thread pool
        gpuq.dequantize(q, np.float32(0.25), dtype="bf16")
        tracemalloc.start()
        try:
            gpuq.quantize(x, np.float32(0.25))
            q_peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.reset_peak()
            gpuq.dequantize(q, np.float32(0.25), dtype="bf16")
            y_peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    # A float32 copy would be 4n bytes on top of the output (n for codes, 2n for bfloat16).
    assert q_peak < n + n, q_peak
    assert y_peak < 2 * n + n, y_peak


def test_host_narrowing_matches_ml_dtypes():
    """The numba and ufunc float32 -> bfloat16 roundings against ml_dtypes' cast on 2**22 random
    float32 patterns plus every boundary class (all 2**32 patterns were checked once: 0 mismatches)."""
    from gpuq.backends.host import affine as host

    rng = np.random.default_rng(7)
    u = rng.integers(0, 2**32, 1 << 22, dtype=np.uint64).astype(np.uint32)
    edges = np.array([0, 0x8000, 0x7FFF, 0x8001, 0x18000, 0x17FFF, 0x28000, 0x7F7F7FFF, 0x7F7F8000,
                      0x7F7FFFFF, 0x7F800000, 0x7F800001, 0x7FFFFFFF, 0xFF7F8000, 0xFFFFFFFF,
                      0x007F8000, 0x00008000, 0x00018000], np.uint32)
    u = np.concatenate([edges, u])
    f = u.view(np.float32)
    with np.errstate(invalid="ignore"):
        want = f.astype(BF16).view(np.uint16)

    class Scratch:
        @staticmethod
        def like(key, dtype, block):
            return np.empty(block.shape, dtype)

    got = np.empty(u.size, np.uint16)
    host.bf16_bits(f, got, Scratch())
    finite = ~np.isnan(f)
    np.testing.assert_array_equal(got[finite], want[finite])
    require_numba()
    from gpuq.backends.host import loops

    got_nb = np.array([loops.bfloat16_bits(v) for v in f[:4096]], np.uint16)
    np.testing.assert_array_equal(got_nb, want[:4096])  # NaN included: quiet 0x7fc0 with its sign
