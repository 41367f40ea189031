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
