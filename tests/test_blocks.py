"""The NumPy engine's block layouts, each forced with a small block size and checked exactly."""

from __future__ import annotations

import numpy as np
import pytest

import gpuq
import reference as ref
from gpuq._scheme import Scheme
from gpuq.backends.host import blocks

RNG = np.random.default_rng(11)

# (shape, axis, the layout it must take with BLOCK=1024 and INNER_MIN=16)
CASES = [
    ((5000,), None, "scalar"),
    ((3, 2500), 0, "rowchunk"),
    ((37, 100), 0, "rows"),
    ((900, 7), 1, "pattern"),
    ((6, 50, 4), 1, "pattern"),
    ((700, 5), 0, "gather"),
    ((4, 400, 3), 1, "gather"),
    ((20, 3, 30, 5), (0, 2), "nd"),
]


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(blocks, "BLOCK", 1024)
    monkeypatch.setattr(blocks, "INNER_MIN", 16)
    monkeypatch.setattr("gpuq.backends.host.threads.PARALLEL_MIN", 0)  # threads even on small input
    monkeypatch.setattr(blocks, "SMALL", 0)  # no direct kernel call for small tensors: the layouts


def _layout(x, axis):
    scheme = Scheme.build(x.shape, axis)
    (piece,) = scheme.pieces()
    p = np.ones(scheme.param_shape, np.float32).reshape(piece.param_view_shape)
    plan = blocks.plan(x, np.empty(x.shape, np.int8), [p])
    return getattr(plan, "mode", "nd")


@pytest.mark.parametrize("shape,axis,mode", CASES, ids=str)
@pytest.mark.parametrize("with_zp", [True, False], ids=["zp", "sym"])
def test_layout_is_exact(small_blocks, host_loops, shape, axis, mode, with_zp):
    x = RNG.normal(0, 100, size=shape).astype(np.float32)
    x.reshape(-1)[::101] = np.nan
    assert _layout(x, axis) == mode
    n = () if axis is None else tuple(shape[a] for a in ((axis,) if isinstance(axis, int) else axis))
    s = RNG.uniform(0.3, 3, size=n).astype(np.float32)
    z = RNG.integers(-40, 40, size=n).astype(np.int32) if with_zp else None
    q = gpuq.quantize(x, s, z, axis=axis)
    np.testing.assert_array_equal(q, ref.quantize(x, s, z, axis=axis))
    y = gpuq.dequantize(q, s, z, axis=axis)
    np.testing.assert_array_equal(y, ref.dequantize(q, s, z, axis=axis))


def test_group_pieces_with_small_blocks(small_blocks, host_loops):
    x = RNG.normal(0, 100, size=(7, 1001)).astype(np.float32)
    s = RNG.uniform(0.3, 3, size=(7, 8)).astype(np.float32)
    z = RNG.integers(-40, 40, size=(7, 8)).astype(np.int32)
    q = gpuq.quantize(x, s, z, axis=1, group_size=128)
    np.testing.assert_array_equal(q, ref.quantize(x, s, z, axis=1, group_size=128))
    y = gpuq.dequantize(q, s, z, axis=1, group_size=128)
    np.testing.assert_array_equal(y, ref.dequantize(q, s, z, axis=1, group_size=128))
