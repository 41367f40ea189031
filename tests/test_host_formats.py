"""fp8 and packed int4 on the host: the compiled kernels (``loops``) against the NumPy loops
(``formats``), bit for bit, where the public tests' data does not reach.

Random float bit patterns (NaN with both signs, Inf, subnormals, every fp8 rounding
boundary), exact ties, odd sizes, tensors longer than a block (chunk edges at odd
parameter offsets), ragged groups on the last and on a middle axis (one parameter per
inner element), per-tensor/channel/multi-axis maps, narrow and wide zero points.
"""

from __future__ import annotations

import numpy as np
import pytest

import gpuq
from conftest import host_kernels, require_numba
from gpuq.backends.host import affine as host_backend
from gpuq.backends.host import blocks, formats

ml_dtypes = pytest.importorskip("ml_dtypes")
require_numba(module_level=True)

RNG = np.random.default_rng(19)
FP8 = ("float8_e4m3fn", "float8_e5m2")
INT4 = ("int4", "uint4")


def _both(fn):
    """``fn()`` on the NumPy loops and on the compiled kernels."""
    with host_kernels("numpy"):
        a = fn()
    with host_kernels("numba"):
        b = fn()
    return a, b


def _bits(result):
    if isinstance(result, gpuq.Codes):
        return np.asarray(result.data).reshape(-1)
    r = np.ascontiguousarray(result)
    return r.view(np.dtype(f"u{r.dtype.itemsize}")).reshape(-1)


def _fp8_boundaries():
    """float32 patterns around every fp8 rounding boundary (both formats), plus specials and
    random patterns: the quotient at s = 1."""
    patterns = []
    for mbits in (2, 3):
        drop = 23 - mbits
        upper = np.arange(1 << (9 + mbits), dtype=np.uint32) << np.uint32(drop)
        half = np.uint32(1 << (drop - 1))
        low = np.array([0, 1, half - 1, half, half + 1, (1 << drop) - 1], np.uint32)
        patterns.append((upper[:, None] | low[None, :]).ravel())
    special = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001,
                        0xFFBFFFFF, 1, 0x007FFFFF, 0x80000001,
                        0x43E00000, 0x43E7FFFF, 0x43E80000, 0x43E80001, 0x43F00000,  # e4m3fn top
                        0x47600000, 0x476FFFFF, 0x47700000, 0x47700001, 0x477FFFFF], np.uint32)
    # fp8 subnormal ties: k/2 * 2**-9 (e4m3fn) and k/2 * 2**-16 (e5m2), and neighbours.
    ties = np.concatenate([np.arange(0, 20, dtype=np.float32) * np.float32(2.0 ** -10),
                           np.arange(0, 12, dtype=np.float32) * np.float32(2.0 ** -17)]).view(np.uint32)
    near = (ties[:, None].astype(np.int64) + np.arange(-1, 2)).clip(0).astype(np.uint32).ravel()
    rand = RNG.integers(0, 2**32, 1 << 18, dtype=np.uint64).astype(np.uint32)
    allp = np.concatenate(patterns + [special, near, near | np.uint32(0x80000000), rand])
    return allp.view(np.float32)


@pytest.mark.parametrize("name", FP8)
@pytest.mark.parametrize("saturate", [True, False])
def test_fp8_kernel_equals_fp8_bits(name, saturate):
    """``loops.quantize_fp8`` at s = 1 against ``formats.fp8_bits`` on every boundary pattern."""
    from gpuq.backends.host import loops

    fmt = name.split("_")[1]
    t = _fp8_boundaries()
    want = np.empty(t.size, np.uint8)
    with np.errstate(all="ignore"):
        formats.fp8_bits(t, fmt, saturate, want)
    got = np.empty(t.size, np.uint8)
    loops.quantize_fp8(t, None, got, t.size, np.ones(1, np.float32), formats.fp8_consts(fmt, saturate))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", FP8)
@pytest.mark.parametrize("saturate", [True, False])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("shape,axis,group_size", [((1000, 37), None, None), ((37, 1000), 0, None),
                                                   ((1000, 37), 1, None), ((6, 100, 7), 1, 16),
                                                   ((300, 33), 1, 8), ((5, 6, 7), (0, 2), None)])
def test_fp8_quantize_compiled_equals_ufuncs(name, saturate, dtype, shape, axis, group_size):
    n = int(np.prod(shape))
    bits = np.resize(_fp8_boundaries().view(np.uint32), n)
    x = bits.view(np.float32).reshape(shape)
    with np.errstate(over="ignore", invalid="ignore"):  # NaN/Inf patterns narrowed on purpose
        x = x.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype) if dtype != "float32" else x
    if axis is None:
        s = np.float32(RNG.uniform(0.5, 2))
    elif group_size is not None:
        ps = list(shape)
        ps[axis] = -(-shape[axis] // group_size)
        s = RNG.uniform(0.5, 2, ps).astype(np.float32)
    elif isinstance(axis, tuple):
        s = RNG.uniform(0.5, 2, [shape[a] for a in axis]).astype(np.float32)
    else:
        s = RNG.uniform(0.5, 2, shape[axis]).astype(np.float32)
    if dtype == "float64":
        s = np.asarray(s, np.float64)
    a, b = _both(lambda: gpuq.quantize(x, s, axis=axis, group_size=group_size, dtype=name,
                                       saturate=saturate))
    np.testing.assert_array_equal(_bits(b), _bits(a))


@pytest.mark.parametrize("name", FP8)
@pytest.mark.parametrize("out_dtype", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("axis", [None, 0, 1])
def test_fp8_dequantize_compiled_equals_ufuncs(name, out_dtype, axis):
    codes = np.resize(np.arange(256, dtype=np.uint8), (257, 129)).view(getattr(ml_dtypes, name))
    s = {None: np.float32(3.0e-3), 0: RNG.uniform(1e-3, 1e3, 257), 1: RNG.uniform(1e-3, 1e3, 129)}[axis]
    s = np.asarray(s, np.float64 if out_dtype == "float64" else np.float32)
    a, b = _both(lambda: gpuq.dequantize(codes, s, axis=axis, dtype=out_dtype))
    np.testing.assert_array_equal(_bits(b), _bits(a))


def _int4_cases():
    big = blocks.BLOCK * 2 + 1001  # several chunks; chunk edges inside rows and groups
    return [
        ((7,), None, None), ((1,), None, None), ((3, 5), 1, None), ((3, 5), 0, None),
        ((9, 130), 1, 64),    # ragged groups on the last axis
        ((5, 13, 3), 1, 4),   # ragged groups on a middle axis: consecutive parameters
        ((4, 6, 5), (0, 2), None),  # multi-axis: a strided map (formats._strided_map)
        ((big,), None, None), ((3, big // 3), 0, None), ((big // 129, 129), 1, None),
        ((big // 1000, 1000), 1, 128), ((big // 77, 7, 11), 1, 3),
    ]


def _params(shape, axis, group_size, zp, qmin, qmax, seed):
    rng = np.random.default_rng(seed)
    if axis is None:
        ps = ()
    elif group_size is not None:
        ps = list(shape)
        ps[axis] = -(-shape[axis] // group_size)
    elif isinstance(axis, tuple):
        ps = [shape[a] for a in axis]
    else:
        ps = (shape[axis],)
    s = rng.uniform(0.3, 3, ps).astype(np.float32)
    if zp == "none":
        return s, None
    if zp == "narrow":
        z = rng.integers(qmin - 3, qmax + 4, ps)
    else:  # beyond NARROW_ZP: the wide path (NumPy loops in both cases)
        z = rng.choice([-2**31, 2**31 - 1, 2**21 + 1, -(2**21) - 7, 3], size=ps)
    return s, np.asarray(z, np.int32)


@pytest.mark.parametrize("name", INT4)
@pytest.mark.parametrize("zp", ["none", "narrow", "wide"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("case", range(len(_int4_cases())))
def test_int4_compiled_equals_ufuncs(name, zp, dtype, case):
    shape, axis, group_size = _int4_cases()[case]
    if np.prod(shape) > 1 << 18 and dtype not in ("float32", "bfloat16"):
        pytest.skip("the large shapes once per compute path are enough")
    qmin, qmax = (-8, 7) if name == "int4" else (0, 15)
    s, z = _params(shape, axis, group_size, zp, qmin, qmax, seed=case)
    n = int(np.prod(shape))
    x = RNG.normal(0, 12, n).astype(np.float32)
    x[::7] = np.float32(0.5)  # ties at some scales, exact halves everywhere (k + 0.5) * s below
    x[3::11] = np.nan
    x[5::13] = np.inf
    x[6::17] = -np.inf
    x[8::19] = np.float32(1e-40)  # a subnormal
    x = x.reshape(shape)
    if axis is None:  # exact ties at the one scale
        x.reshape(-1)[1::9] = (np.arange(x.reshape(-1)[1::9].size) % 20 - 10 + np.float32(0.5)) * s
    x = x.astype(ml_dtypes.bfloat16) if dtype == "bfloat16" else x.astype(dtype)
    if dtype == "float64":
        s = s.astype(np.float64)
    q_a, q_b = _both(lambda: gpuq.quantize(x, s, z, axis=axis, group_size=group_size, dtype=name))
    np.testing.assert_array_equal(_bits(q_b), _bits(q_a))
    out_dtype = dtype if dtype != "float64" else "float64"
    codes = gpuq.Codes(RNG.integers(0, 256, (n + 1) // 2, dtype=np.uint8), shape, name)
    y_a, y_b = _both(lambda: gpuq.dequantize(codes, s, z, axis=axis, group_size=group_size,
                                             dtype=out_dtype))
    np.testing.assert_array_equal(_bits(y_b), _bits(y_a))


@pytest.mark.parametrize("name", INT4)
def test_int4_non_contiguous_src_and_out(name):
    x = RNG.normal(0, 10, (40, 66)).astype(np.float32)[:, ::3]
    s = RNG.uniform(0.5, 2, 22).astype(np.float32)
    q_a, q_b = _both(lambda: gpuq.quantize(x, s, axis=1, dtype=name))
    np.testing.assert_array_equal(_bits(q_b), _bits(q_a))
    out_a, out_b = np.zeros((22, 40), np.float32).T, np.zeros((22, 40), np.float32).T
    with host_kernels("numpy"):
        gpuq.dequantize(q_a, s, axis=1, out=out_a)
    with host_kernels("numba"):
        gpuq.dequantize(q_a, s, axis=1, out=out_b)
    np.testing.assert_array_equal(out_a.view(np.uint32), out_b.view(np.uint32))


def test_int4_map_equals_param_index():
    """The kernels' map (``formats.int4_map``) gives ``param_index``'s parameter everywhere, and
    covers block scales (2-D, rank-3 ``(1, b1, b2)``, ragged, odd rows) and multi-axis schemes."""
    from gpuq._scheme import Scheme

    schemes = [((7,), dict()), ((3, 5), dict(axis=1)), ((4, 3, 5), dict(axis=1)),
               ((9, 130), dict(axis=1, group_size=64)), ((5, 13, 3), dict(axis=1, group_size=4)),
               ((2, 9, 1), dict(axis=1, group_size=2)), ((6, 8), dict(axis=1, group_size=4)),
               ((4, 6, 5), dict(axis=(0, 2))), ((300, 201), dict(block_size=(128, 128))),
               ((17, 9), dict(block_size=(16, 4))), ((9, 7), dict(block_size=(2, 5))),
               ((4, 33, 17), dict(block_size=(1, 8, 16))), ((3, 1, 9, 5), dict(block_size=(1, 1, 4, 2))),
               ((6, 10, 7), dict(block_size=(-1, 4, 3))), ((6, 10, 7), dict(block_size=(2, 4, 1))),
               ((6, 10, 7), dict(block_size=(4, 1, -1))), ((5, 12), dict(block_size=(2, -1)))]
    for shape, kw in schemes:
        scheme = Scheme.build(shape, **kw)
        n = int(np.prod(shape))
        T, C, g, G, P, R, rb, cons = formats.int4_map(scheme, n)
        i = np.arange(n)
        o, rem = np.divmod(i, C * T)
        c, t = np.divmod(rem, T)
        f = ((o // R) % P) * -(-R // rb) + (o % R) // rb
        got = (f * G + c // g) * (T if cons else 1) + (t if cons else 0)
        want = formats.param_index(scheme, 0, n)
        np.testing.assert_array_equal(got, np.zeros(n, int) if want is None else want, err_msg=str((shape, kw)))
    # Three blocked levels: the per-element gather (the NumPy loops), not this map.
    assert formats.int4_map(Scheme.build((6, 10, 7), block_size=(2, 4, 3)), 420) is None


def test_bfloat16_widening_without_the_dtype_cast(monkeypatch):
    """The two-pass shift (where ml_dtypes' cast is not the exact widening) gives the same bits."""
    x = RNG.integers(0, 2**16, 70001, dtype=np.uint64).astype(np.uint16).view(ml_dtypes.bfloat16)
    s = np.float32(0.37)
    with host_kernels("numpy"):
        want = gpuq.quantize(x, s, 3)
        fp8_want = gpuq.quantize(x, s, dtype="float8_e5m2")
        monkeypatch.setattr(host_backend, "bf16_cast_is_shift", lambda dtype: False)
        got = gpuq.quantize(x, s, 3)
        fp8_got = gpuq.quantize(x, s, dtype="float8_e5m2")
    assert host_backend.bf16_cast_is_shift.__name__ == "<lambda>"
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(_bits(fp8_got), _bits(fp8_want))


def test_bfloat16_cast_check():
    assert host_backend.bf16_cast_is_shift(np.dtype(ml_dtypes.bfloat16)) in (True, False)
