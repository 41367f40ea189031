"""The full-range scale rule of torchao, compressed-tensors and GPTQ, pinned as a reference.

``scale = max|x| / ((qmax - qmin) / 2)`` (int4: ``/ 7.5``, int8: ``/ 127.5``; uint codes
by their range), one float32 division, clamped below by ``eps``. A naive NumPy statement of
the rule (:func:`full_range_scales`) against torchao 0.18's ``choose_qparams_affine``
(``MappingType.SYMMETRIC``) on fixtures made offline by
``tests/data/full_range/make_fixtures.py``, and against compressed-tensors 0.20.0's
``calculate_qparams`` called here: bit for bit. It is the reference gpuq's
``scale_rule="full"`` (issue 40, point 2) is to meet.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "full_range",
                        "torchao_scales.npz")
CODES = {"int8": (-128, 127), "int4": (-8, 7), "uint8": (0, 255), "uint4": (0, 15)}
TINY = np.finfo(np.float32).tiny


def full_range_scales(x, block, qmin, qmax, eps=TINY):
    """The rule, one block at a time: float32 max|x| over each ``block`` of a 2-D ``x``, / the half range."""
    rows, cols = x.shape
    br, bc = block
    half = np.float32((qmax - qmin) / 2)
    out = np.empty((rows // br, -(-cols // bc)), np.float32)
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            v = x[i * br:(i + 1) * br, j * bc:(j + 1) * bc]
            amax = np.float32(np.max(np.abs(v)))
            out[i, j] = max(np.float32(amax / half), np.float32(eps))
    return out


@pytest.fixture(scope="module")
def fixtures():
    with np.load(FIXTURES) as d:
        return {k: d[k] for k in d.files}


def _bits(a):
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


@pytest.mark.parametrize("case", ["g128", "channel", "tensor"])
@pytest.mark.parametrize("code", sorted(CODES))
def test_rule_equals_torchao(fixtures, case, code):
    assert fixtures["torchao_version"] == "0.18.0"
    x, block = fixtures[f"x_{case}"], tuple(fixtures[f"block_{case}"])
    want = fixtures[f"s_{case}_{code}"]
    got = full_range_scales(x, block, *CODES[code])
    np.testing.assert_array_equal(_bits(got.reshape(want.shape)), _bits(want))


def test_fixtures_cover_the_edges(fixtures):
    """The fixtures hold what makes the rule's edges: eps, near-max, a negative max, ties."""
    s = fixtures["s_g128_int4"]
    assert s[0, 0] == TINY and s[1, 0] == TINY          # all-zero and subnormal groups: eps
    assert s[2, 0] == np.float32(np.float32(3e38) / np.float32(7.5))
    assert s[3, 0] == np.float32(1.0)                   # -7.5 / 7.5: the code -8 is reached
    assert fixtures["s_g128_int8"][3, 0] == np.float32(np.float32(7.5) / np.float32(127.5))


@pytest.mark.parametrize("bits", [8, 4])
def test_rule_equals_compressed_tensors(fixtures, bits):
    torch = pytest.importorskip("torch")
    ct = pytest.importorskip("compressed_tensors.quantization")
    from compressed_tensors.quantization.utils.helpers import calculate_qparams

    x = fixtures["x_g128"]
    g = torch.from_numpy(x).reshape(17, 8, 128)
    args = ct.QuantizationArgs(num_bits=bits, symmetric=True, strategy="group", group_size=128)
    s, z = calculate_qparams(g.amin(-1), g.amax(-1), args)
    want = full_range_scales(x, (1, 128), *CODES[f"int{bits}"])
    nonzero = want != TINY  # compressed-tensors puts its machine epsilon where the scale is 0
    got = s.numpy()
    np.testing.assert_array_equal(_bits(got[nonzero]), _bits(want[nonzero]))
    assert np.all(got[(x.reshape(17, 8, 128) == 0).all(-1)] == np.finfo(np.float32).eps)
    assert not z.any()


def test_compressed_tensors_bf16_scales_are_the_rounded_float32_rule():
    """For bfloat16 input compressed-tensors divides in bfloat16: its scale is the float32
    quotient rounded to bfloat16 (what ``scale_dtype="bfloat16"`` stores); it is its codes,
    ``x / s`` rounded to bfloat16 before ``round``, that differ from gpuq's exact division."""
    torch = pytest.importorskip("torch")
    ct = pytest.importorskip("compressed_tensors.quantization")
    ml_dtypes = pytest.importorskip("ml_dtypes")
    from compressed_tensors.quantization.utils.helpers import calculate_qparams

    rng = np.random.default_rng(7)
    x = torch.from_numpy(rng.standard_normal((33, 256), dtype=np.float32)).to(torch.bfloat16)
    g = x.reshape(33, 2, 128)
    args = ct.QuantizationArgs(num_bits=4, symmetric=True, strategy="group", group_size=128)
    s, _ = calculate_qparams(g.amin(-1), g.amax(-1), args)
    assert s.dtype == torch.bfloat16
    want = full_range_scales(x.float().numpy(), (1, 128), -8, 7).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(s.view(torch.int16).numpy(), want.view(np.int16))


# -- gpuq's scale_rule="full" against the reference, every backend --------------------------------

import gpuq  # noqa: E402

ZPS = {"int8": None, "int4": None, "uint8": 128, "uint4": 8}


def _naive_codes(x, s, zp, code, axis, group_size):
    """The contract's codes, by exact float32 division: clamp(rint(x / s) + zp, qmin, qmax), NaN -> zp."""
    s = np.asarray(s, np.float32)
    if axis is None:
        full = np.broadcast_to(s, x.shape)
    elif group_size:
        full = np.repeat(s, group_size, axis=axis)[:, :x.shape[1]] if axis == 1 else None
    else:
        full = np.expand_dims(s, 1 - axis)
    r = np.rint(x.astype(np.float32) / full)
    r = np.where(np.isnan(r), 0, r) + (zp or 0)
    return np.clip(r, *CODES[code]).astype(np.int64)


def _as_ints(backend, q):
    """Codes as int64 host values (packed int4/uint4 unpacked by gpuq.unpack)."""
    return np.asarray(backend.get(gpuq.unpack(q) if isinstance(q, gpuq.Codes) else q)).astype(np.int64)


@pytest.mark.parametrize("case", ["g128", "channel", "tensor"])
@pytest.mark.parametrize("code", sorted(CODES))
def test_gpuq_full_rule_equals_torchao(backend, fixtures, case, code):
    x, block = fixtures[f"x_{case}"], tuple(fixtures[f"block_{case}"])
    want = fixtures[f"s_{case}_{code}"]
    kw = {"g128": dict(axis=1, group_size=128), "channel": dict(axis=0), "tensor": {}}[case]
    s, z = gpuq.choose_qparams(backend.put(x), dtype=code, symmetric=True, scale_rule="full", **kw)
    s = backend.get(s)
    np.testing.assert_array_equal(_bits(s.reshape(want.shape)), _bits(want))
    if ZPS[code] is None:
        assert z is None
    else:
        assert np.all(backend.get(z) == ZPS[code])
    if code.endswith("4"):
        return  # packed codes: the same scales, the codes are checked in test_quantize_dynamic_full
    q, s2, _ = gpuq.quantize_dynamic(backend.put(x), dtype=code, symmetric=True, scale_rule="full", **kw)
    np.testing.assert_array_equal(_bits(backend.get(s2)), _bits(s))
    np.testing.assert_array_equal(_as_ints(backend, q), _naive_codes(x, s, ZPS[code], code, kw.get("axis"),
                                                                         kw.get("group_size")))


@pytest.mark.parametrize("code", sorted(CODES))
@pytest.mark.parametrize("shape,kw", [((17, 1025), dict(axis=1, group_size=128)), ((1, 17), dict(axis=0)),
                                      ((33, 256), dict(axis=1, group_size=128)), ((5, 3), dict(axis=0))])
def test_quantize_dynamic_full(backend, code, shape, kw):
    """Codes of the full-range rule against the naive statement: the negative max reaches qmin."""
    rng = np.random.default_rng(3)
    lo, hi = CODES[code]
    x = (rng.standard_normal(shape) * 0.2).astype(np.float32)
    bottom = -0.25 * (hi - lo) / 2  # the block's max|x|: scale 0.25, x / s = -7.5 (-127.5), a tie
    x[0, :3] = [bottom, 1.0, np.nan][:shape[1]]  # a NaN is skipped
    x[-1, -1] = 0.0
    q, s, z = gpuq.quantize_dynamic(backend.put(x), dtype=code, symmetric=True, scale_rule="full", **kw)
    want_s = full_range_scales(np.nan_to_num(x), (1, kw.get("group_size") or shape[1]), lo, hi)
    s = backend.get(s)
    np.testing.assert_array_equal(_bits(s.reshape(want_s.shape)), _bits(want_s))
    codes = _as_ints(backend, q)
    want_q = _naive_codes(x, s.reshape(want_s.shape) if kw["axis"] == 1 else s, ZPS[code], code, kw["axis"],
                          kw.get("group_size"))
    np.testing.assert_array_equal(codes, want_q)
    assert codes.reshape(shape)[0, 0] == lo  # the tie goes to the even bottom code, -8 (-128)


def test_full_rule_sqnr_beats_the_default_int4():
    """The point of the rule (issue 40): int4 g128 on Gaussian weights, a higher SQNR."""
    x = np.random.default_rng(0).standard_normal((256, 1024)).astype(np.float32)

    def sqnr(**kw):
        q, s, _ = gpuq.quantize_dynamic(x, axis=1, group_size=128, dtype="int4", symmetric=True, **kw)
        y = gpuq.dequantize(q, s, axis=1, group_size=128)
        return 10 * np.log10((x.astype(np.float64) ** 2).sum() / ((x - y).astype(np.float64) ** 2).sum())

    assert sqnr(scale_rule="full") > sqnr() + 0.3


def test_mse_candidate_zero_is_the_full_rule(host_loops):
    """method="mse" derives its 20 candidates from the rule (candidate i: the range * p_i, over
    7.5): never worse than full-range min/max, and not the default rule's search."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((8, 256)).astype(np.float32)
    kw = dict(axis=1, group_size=128, dtype="int4", symmetric=True)
    s_mm, _ = gpuq.choose_qparams(x, scale_rule="full", **kw)
    s_mse, _ = gpuq.choose_qparams(x, scale_rule="full", method="mse", **kw)
    s_old, _ = gpuq.choose_qparams(x, method="mse", **kw)
    assert not np.array_equal(s_mse, s_old)

    def err(s):
        y = gpuq.dequantize(gpuq.quantize(x, s, axis=1, group_size=128, dtype="int4"), s, axis=1, group_size=128)
        return ((x.astype(np.float64) - y) ** 2).reshape(8, 2, 128).sum(-1)

    assert np.all(err(s_mse) <= err(s_mm))
    # Each chosen scale is one of the 20 candidates of the full rule: p_i * amax / 7.5.
    amax = np.abs(x).reshape(8, 2, 128).max(-1)
    cands = [np.float32(np.float32(np.float32((100 - i) / 100) * amax) / np.float32(7.5)) for i in range(20)]
    assert np.all(np.any(np.stack(cands) == s_mse, axis=0))


def test_full_rule_scale_dtype_rounds_as_today():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = np.random.default_rng(2).standard_normal((4, 256)).astype(np.float32)
    s, _ = gpuq.choose_qparams(x, axis=1, group_size=128, dtype="int4", symmetric=True, scale_rule="full",
                               scale_dtype="bfloat16")
    want = full_range_scales(x, (1, 128), -8, 7).astype(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(_bits(s), _bits(want))


@pytest.mark.parametrize("kw,exc,match", [
    (dict(dtype="int4"), ValueError, "scale_rule='full' is for symmetric integer codes, got dtype=int4 with "
                                     "symmetric=False"),
    (dict(dtype="float8_e4m3fn"), ValueError, "got dtype=float8_e4m3fn with symmetric=True"),
    (dict(dtype="int8", symmetric=True, scale_rule="Full"), ValueError, "scale_rule must be None or one of 'full'"),
    (dict(dtype="int8", symmetric=True, scale_rule=1), TypeError, "scale_rule must be None or a string"),
])
@pytest.mark.parametrize("fn", ["choose_qparams", "quantize_dynamic"])
def test_full_rule_errors(fn, kw, exc, match):
    kw = {"scale_rule": "full", **kw}
    x = np.ones((2, 3), np.float32)
    with pytest.raises(exc, match=match):
        getattr(gpuq, fn)(x, **kw)


def test_full_rule_dask_equals_in_memory():
    da = pytest.importorskip("dask.array")
    x = np.random.default_rng(4).standard_normal((6, 40)).astype(np.float32)
    for kw in (dict(axis=0), dict(axis=None)):  # chunks inside a block, and a tree over chunks
        s, z = gpuq.choose_qparams(da.from_array(x, chunks=(3, 20)), dtype="uint8", symmetric=True,
                                   scale_rule="full", **kw)
        want_s, want_z = gpuq.choose_qparams(x, dtype="uint8", symmetric=True, scale_rule="full", **kw)
        np.testing.assert_array_equal(_bits(np.asarray(s.compute())), _bits(want_s))
        np.testing.assert_array_equal(np.asarray(z.compute()), want_z)
        q, s2, _ = gpuq.quantize_dynamic(da.from_array(x, chunks=(3, 20)), dtype="int8", symmetric=True,
                                         scale_rule="full", **kw)
        want = gpuq.quantize_dynamic(x, dtype="int8", symmetric=True, scale_rule="full", **kw)
        np.testing.assert_array_equal(np.asarray(q.compute()), want[0])
    with pytest.raises(ValueError, match="scale_rule='full' is for symmetric integer codes"):
        gpuq.choose_qparams(da.from_array(x, chunks=(3, 20)), dtype="int8", scale_rule="full")


def test_full_rule_torch():
    torch = pytest.importorskip("torch")
    import gpuq.torch  # noqa: F401 (registers torch.ops.gpuq)

    x = torch.from_numpy(np.random.default_rng(6).standard_normal((4, 256)).astype(np.float32))
    s, z = gpuq.choose_qparams(x, axis=1, group_size=128, dtype="int4", symmetric=True, scale_rule="full")
    want = full_range_scales(x.numpy(), (1, 128), -8, 7)
    np.testing.assert_array_equal(_bits(s.numpy()), _bits(want))
    (s2,) = torch.ops.gpuq.choose_qparams(x, axis=[1], group_size=128, dtype="int4", symmetric=True,
                                        scale_rule="full")  # no zero points: one tensor
    np.testing.assert_array_equal(_bits(s2.numpy()), _bits(want))
    with pytest.raises(ValueError, match="scale_rule must be None or one of 'full'"):
        gpuq.choose_qparams(x, symmetric=True, scale_rule="fool")
