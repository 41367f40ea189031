"""Which kernel ``quantize_dynamic`` launches on a device array, and its codes bit for bit
against the host backend: the read-once kernel (``dynamic_quantize_units``: the block in
registers) where the rows are aligned whole 16-element units, today's two-pass kernel
(``dynamic_quantize_segments``) elsewhere. tests/test_cuda_sweep.py runs every instantiation
of both under every fiber schedule; this file checks the choice and the edges."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import gpuq
from conftest import _cuda_skip_reason

pytestmark = pytest.mark.skipif(_cuda_skip_reason() is not None, reason=_cuda_skip_reason() or "")


@pytest.fixture
def cp():
    import cupy

    if not hasattr(cupy, "_sim"):
        pytest.skip("the launch records need the CPU execution of the kernels")
    return cupy


def _x(shape, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 40).astype(np.float32)
    flat = x.reshape(-1)
    special = np.float32([0.5, -0.5, 1.5, np.nan, -0.0, 2.5])  # ties, NaN, -0
    flat[:special.size] = special[:flat.size]
    return x.astype(dtype)


def _families(cp):
    return {r.name.partition("<")[0].removeprefix("gpuq::") for r in cp._sim.launches}


def _same(cp, host, dev):
    for h, d in zip(host, dev):
        assert (h is None) == (d is None)
        if h is not None:
            d = cp.asnumpy(d)
            assert h.dtype == d.dtype and h.shape == d.shape
            np.testing.assert_array_equal(h.view(f"u{h.dtype.itemsize}"), d.view(f"u{d.dtype.itemsize}"))


@pytest.mark.parametrize("shape, kw, kernel", [
    ((4, 32), dict(axis=0), "dynamic_quantize_units"),                       # 32 elements: 8 lanes
    ((3, 1040), dict(axis=0, dtype="uint8"), "dynamic_quantize_units"),      # the block team
    ((2, 48), dict(axis=1, group_size=32), "dynamic_quantize_units"),        # a ragged last group of 16
    ((1, 16), dict(axis=0, symmetric=True), "dynamic_quantize_units"),       # one unit
    ((4, 17), dict(axis=0), "dynamic_quantize_segments"),                    # rows of part units
    ((3, 1025), dict(axis=0), "dynamic_quantize_segments"),
    ((2, 40), dict(axis=1, group_size=20), "dynamic_quantize_segments"),     # groups off the units
    ((5, 1), dict(axis=0), "dynamic_quantize_segments"),                     # one-element rows
    ((2, 16400), dict(axis=0), "dynamic_quantize_staged"),                   # above 16384: shared memory
])
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_kernel_choice_and_bits(cp, shape, kw, kernel, dtype):
    x = _x(shape, dtype)
    cp._sim.launches.clear()
    dev = gpuq.quantize_dynamic(cp.asarray(x), **kw)
    _same(cp, gpuq.quantize_dynamic(x, **kw), dev)
    assert kernel in _families(cp)


def test_unaligned_view_takes_the_two_pass_kernel(cp):
    """A view one element into its allocation: 16-byte loads would fault, so the old kernel."""
    x = _x((3, 64))
    flat = cp.asarray(np.concatenate([np.zeros(1, np.float32), x.ravel()]))
    view = flat[1:].reshape(3, 64)
    cp._sim.launches.clear()
    _same(cp, gpuq.quantize_dynamic(x, axis=0), gpuq.quantize_dynamic(view, axis=0))
    assert "dynamic_quantize_segments" in _families(cp)


def test_float64_and_float16(cp):
    """float64 keeps the two-pass kernel (its float64 accumulator); float16 takes the new one."""
    for dtype, kernel in ((np.float64, "dynamic_quantize_segments"), (np.float16, "dynamic_quantize_units")):
        x = _x((3, 64), dtype)
        cp._sim.launches.clear()
        _same(cp, gpuq.quantize_dynamic(x, axis=0, dtype="uint8"), gpuq.quantize_dynamic(cp.asarray(x), axis=0,
                                                                                         dtype="uint8"))
        assert kernel in _families(cp)
