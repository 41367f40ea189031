"""Block scales of any shape (issue 28): ``block_size=(b_0, ..., b_{r-1})`` on every function.

Element ``(i_0, ..., i_{r-1})`` uses ``scales[i_0 // b_0, ..., i_{r-1} // b_{r-1}]``; the last
block along each dim may be shorter; ``-1`` or an entry of at least the dim covers it. Every
body runs on each backend (numpy, numba, the CUDA kernels) against a naive NumPy statement of
the contract with that map (tests/reference.py, tests/formats_reference.py: parameters repeated
over their blocks and cut, independently of gpuq's Scheme), codes and floats bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

import gpuq
import formats_reference as FR
import reference as ref

RNG = np.random.default_rng(28)

#: (shape, block_size): ragged on every dim, blocks beyond a dim, -1, 3-D, odd sizes, one element.
CASES = [
    ((37, 41), (16, 16)),
    ((300, 200), (128, 128)),
    ((33, 20), (8, -1)),
    ((5, 17, 9), (1, 4, 4)),
    ((3, 40, 25), (2, 16, 7)),
    ((40, 3), (16, 2)),
    ((7, 100), (3, 32)),
    ((17,), (5,)),
    ((1, 1), (4, 4)),
    ((6, 64), (4, 32)),
    ((4, 9), (100, 100)),
    ((9, 701), (4, 300)),  # 2-D tiles whose rows outrun a warp's 16-byte vectors (qparams_tiles)
    ((2, 3, 50), (-1, 2, 17)),
    # more alternating dims than the CUDA element maps take (8): parameters repeated per element,
    # the reductions' block walk over up to 16 merged dims
    ((3,) * 9, (2,) * 9),
    ((3, 2) * 5, (2, 1) * 5),
]
IDS = [f"{s}-{b}" for s, b in CASES]


def _data(shape, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    x.flat[::7] = rng.integers(-12, 12, x.flat[::7].size) + 0.5  # ties
    return x.astype(dtype)


def _params(shape, block, seed=1, zp_range=(-20, 20)):
    pshape = ref.param_shape(shape, block_size=block)
    rng = np.random.default_rng(seed)
    s = rng.uniform(0.02, 0.5, pshape).astype(np.float32)
    z = rng.integers(*zp_range, pshape, endpoint=True).astype(np.int32)
    return s, z


@pytest.mark.parametrize("shape,block", CASES, ids=IDS)
@pytest.mark.parametrize("qdtype,zp", [("int8", False), ("int8", True), ("uint8", True)])
def test_affine_codes_against_the_naive_block_map(backend, shape, block, qdtype, zp):
    x = _data(shape)
    s, z = _params(shape, block, zp_range=(-20, 20) if qdtype == "int8" else (100, 150))
    z = z if zp else None
    q = gpuq.quantize(backend.put(x), backend.put(s), None if z is None else backend.put(z), block_size=block,
                      dtype=qdtype)
    want = ref.quantize(x, s, z, block_size=block, dtype=qdtype)
    np.testing.assert_array_equal(backend.get(q), want)
    for out in ("float32", "float16", "float64"):
        y = gpuq.dequantize(backend.put(want), s, z, block_size=block, dtype=out)
        np.testing.assert_array_equal(backend.get(y).view(f"u{np.dtype(out).itemsize}"),
                                      ref.dequantize(want, s, z, block_size=block, dtype=out)
                                      .view(f"u{np.dtype(out).itemsize}"))


@pytest.mark.parametrize("shape,block", CASES, ids=IDS)
@pytest.mark.parametrize("dtype,symmetric", [("int8", False), ("int8", True), ("uint8", False)])
def test_choose_qparams_and_quantize_dynamic(backend, shape, block, dtype, symmetric):
    x = _data(shape, seed=3)
    x.flat[5::11] = np.nan
    want_s, want_z = ref.choose_qparams(x, block_size=block, dtype=dtype, symmetric=symmetric)
    s, z = gpuq.choose_qparams(backend.put(x), block_size=block, dtype=dtype, symmetric=symmetric)
    assert backend.get(s).shape == ref.param_shape(shape, block_size=block)
    np.testing.assert_array_equal(backend.get(s).view(np.uint32), want_s.view(np.uint32))
    if want_z is None:
        assert z is None
    else:
        np.testing.assert_array_equal(backend.get(z), want_z)
    q, s2, z2 = gpuq.quantize_dynamic(backend.put(x), block_size=block, dtype=dtype, symmetric=symmetric)
    np.testing.assert_array_equal(backend.get(s2).view(np.uint32), want_s.view(np.uint32))
    np.testing.assert_array_equal(backend.get(q), ref.quantize(x, want_s, want_z, block_size=block, dtype=dtype))


@pytest.mark.parametrize("view", ["transposed", "strided", "offset"])
def test_views_and_bfloat16(backend, view):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    base = _data((70, 90), seed=5)
    x = {"transposed": base.T, "strided": base[::2, 1::3], "offset": base[1:, 3:]}[view]
    block = (16, 32)
    s, z = _params(x.shape, block, seed=6)
    want = ref.quantize(np.ascontiguousarray(x), s, z, block_size=block)
    np.testing.assert_array_equal(backend.get(gpuq.quantize(backend.put(x), s, z, block_size=block)), want)
    xb = np.ascontiguousarray(x).astype(ml_dtypes.bfloat16)
    wantb = ref.quantize(xb.astype(np.float32), s, z, block_size=block)
    np.testing.assert_array_equal(backend.get(gpuq.quantize(backend.put(xb), s, z, block_size=block)), wantb)
    y = gpuq.dequantize(backend.put(want), s, z, block_size=block, dtype="bfloat16")
    yw = ref.dequantize(want, s, z, block_size=block, dtype=np.float32).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(backend.get(y).view(np.uint16), yw.view(np.uint16))


@pytest.mark.parametrize("shape,block", [((37, 41), (16, 16)), ((5, 17, 9), (1, 4, 3)), ((9, 7), (2, 5))],
                         ids=str)
@pytest.mark.parametrize("dtype", ["int4", "uint4"])
def test_int4_packing_across_block_edges(backend, shape, block, dtype):
    """Odd row lengths: a byte holds the last code of one block and the first of the next."""
    x = _data(shape, seed=7)
    lo, hi = FR.INT4[dtype]
    s, z = _params(shape, block, seed=8, zp_range=(lo, hi))
    got = gpuq.quantize(backend.put(x), s, z, block_size=block, dtype=dtype)
    want = FR.naive_quantize(x, s, z, block_size=block, dtype=dtype)
    np.testing.assert_array_equal(backend.get(got.data), FR.pack_nibbles(want))
    y = gpuq.dequantize(got, s, z, block_size=block)
    np.testing.assert_array_equal(backend.get(y).view(np.uint32),
                                  FR.naive_dequantize(want, s, z, block_size=block).view(np.uint32))


@pytest.mark.parametrize("shape", [(300, 200), (256, 384), (129, 127)], ids=str)
def test_fp8_deepseek_blocks(backend, shape):
    """The fine-grained fp8 layout: e4m3 codes, one float32 scale per 128x128 block (amax / 448),
    ragged edges; the scales, the codes and dequantize by the naive statement."""
    x = _data(shape, seed=9) * 50
    s, z = gpuq.choose_qparams(backend.put(x), block_size=(128, 128), dtype="float8_e4m3fn")
    assert z is None
    want_s, _ = FR.naive_choose_qparams(x, block_size=(128, 128), dtype="float8_e4m3fn")
    np.testing.assert_array_equal(backend.get(s).view(np.uint32), want_s.view(np.uint32))
    q = gpuq.quantize(backend.put(x), s, block_size=(128, 128), dtype="float8_e4m3fn")
    bits = backend.get(q.data if isinstance(q, gpuq.Codes) else q).view(np.uint8)
    want = FR.naive_quantize(x, want_s, block_size=(128, 128), dtype="float8_e4m3fn")
    np.testing.assert_array_equal(bits, want.view(np.uint8))
    y = gpuq.dequantize(q, s, block_size=(128, 128), dtype="bfloat16")
    yw = FR.naive_dequantize(want, want_s, block_size=(128, 128), out_dtype=FR.BF16)
    np.testing.assert_array_equal(backend.get(y).view(np.uint16), yw.view(np.uint16))


@pytest.mark.parametrize("dtype", ["int8", "uint4", "float8_e5m2"])
def test_block_shapes_that_are_existing_schemes_give_their_bits(backend, dtype):
    """(1, g) is axis=1 with groups of g, (1, n) per-channel on axis 0 (scales (m, 1) against
    (m,)), the whole shape per-tensor: the same codes, bit for bit."""
    x = backend.put(_data((12, 50), seed=10))
    kw = dict(dtype=dtype)  # fp8: symmetric by default
    pairs = [(dict(block_size=(1, 16)), dict(axis=1, group_size=16)),
             (dict(block_size=(1, -1)), dict(axis=0)),
             (dict(block_size=(1, 50)), dict(axis=0)),
             (dict(block_size=(12, 50)), dict()),
             (dict(block_size=(-1, 99)), dict())]
    for blocks, scheme in pairs:
        s, z = gpuq.choose_qparams(x, **blocks, **kw)
        s0, z0 = gpuq.choose_qparams(x, **scheme, **kw)
        np.testing.assert_array_equal(backend.get(s).reshape(-1), backend.get(s0).reshape(-1))
        q = gpuq.quantize(x, s, z, **blocks, dtype=dtype)
        q0 = gpuq.quantize(x, s0, z0, **scheme, dtype=dtype)
        data = (lambda c: backend.get(c.data if isinstance(c, gpuq.Codes) else c).view(np.uint8))
        np.testing.assert_array_equal(data(q), data(q0))


@pytest.mark.parametrize("call,exc,match", [
    (lambda x: gpuq.quantize(x, 1.0, block_size=16), TypeError, r"block_size must have one entry per dimension.*group_size="),
    (lambda x: gpuq.quantize(x, 1.0, block_size="16"), TypeError, "block_size must be a tuple of ints"),
    (lambda x: gpuq.quantize(x, 1.0, block_size=(16,)), ValueError, r"one entry per dimension of src \(2 for shape \(12, 50\)\), got 1"),
    (lambda x: gpuq.quantize(x, 1.0, block_size=(4, 0)), ValueError, "block_size entries must be positive, or -1"),
    (lambda x: gpuq.quantize(x, 1.0, block_size=(4, -2)), ValueError, "block_size entries must be positive, or -1"),
    (lambda x: gpuq.quantize(x, 1.0, block_size=(4, 2.0)), TypeError, "block_size must be an integer"),
    (lambda x: gpuq.quantize(x, 1.0, block_size=(4, True)), TypeError, "block_size must be an integer"),
    (lambda x: gpuq.quantize(x, [1.0], axis=0, block_size=(4, 4)), ValueError, r"block_size=\(4, 4\) and axis=0 both say"),
    (lambda x: gpuq.choose_qparams(x, axis=1, group_size=4, block_size=(4, 4)), ValueError, "and axis=1 both say"),
    (lambda x: gpuq.quantize(x, np.ones((3, 12), np.float32), block_size=(4, 4)), ValueError,
     r"scales must have shape \(3, 13\) for block_size=\(4, 4\) of shape \(12, 50\), got shape \(3, 12\)"),
    (lambda x: gpuq.dequantize(np.zeros((12, 50), np.int8), np.ones(4), block_size=(4, 4)), ValueError,
     r"scales must have shape \(3, 13\)"),
])
def test_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call(_data((12, 50)))


def test_empty_dims_give_empty_grids(backend):
    x = backend.put(np.zeros((0, 7), np.float32))
    s, z = gpuq.choose_qparams(x, block_size=(4, 4))
    assert backend.get(s).shape == (0, 2)
    assert backend.get(gpuq.quantize(x, s, z, block_size=(4, 4))).shape == (0, 7)


def test_more_alternating_dims_than_a_device_block_walk_takes(backend):
    """17 merged dims (dims of 2, alternately one parameter each and whole): quantize runs
    everywhere (parameters repeated per element on the GPU); the CUDA reductions walk at most
    16 and say so, the host loops take any number."""
    shape, block = (2,) * 17, (1, -1) * 8 + (1,)
    x = _data(shape, seed=5)
    s, z = _params(shape, block)
    q = gpuq.quantize(backend.put(x), backend.put(s), backend.put(z), block_size=block)
    np.testing.assert_array_equal(backend.get(q), ref.quantize(x, s, z, block_size=block))
    if backend.name == "cuda":
        with pytest.raises(ValueError, match=r"a block reduction on a device array takes at most 16 "
                                             r"alternating dims of blocks, got 17"):
            gpuq.choose_qparams(backend.put(x), block_size=block)
    else:
        want_s, want_z = ref.choose_qparams(x, block_size=block)
        got_s, got_z = gpuq.choose_qparams(backend.put(x), block_size=block)
        np.testing.assert_array_equal(backend.get(got_s).view(np.uint32), want_s.view(np.uint32))
        np.testing.assert_array_equal(backend.get(got_z), want_z)


def test_a_1d_array_of_sizes_is_a_block_size():
    x = _data((37, 41))
    want = gpuq.choose_qparams(x, block_size=(16, 16))
    got = gpuq.choose_qparams(x, block_size=np.array([16, 16]))
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(TypeError, match="for groups along one axis use group_size="):
        gpuq.choose_qparams(x, block_size=np.array(16))
