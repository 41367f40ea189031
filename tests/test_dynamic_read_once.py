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


# --- blocks above 16384 elements: staged in dynamic shared memory (dynamic_quantize_staged) ------

def _special(x):
    """Ties, NaN, -0 and a value far from the rest at the start, the end and a middle of every row."""
    rows = x.reshape(-1, x.shape[-1])
    for r, row in enumerate(rows):
        for at in (0, row.size // 2 + r, row.size - 3):
            row[at:at + 3] = np.float32([2.5 + r, np.nan, -0.0])[:row.size - at].astype(x.dtype)
    return x


@pytest.mark.parametrize("shape, kw, dtype", [
    ((3, 16385), dict(axis=0), np.float32),                           # odd rows: every start alignment
    ((2, 20001), dict(axis=0, dtype="uint8"), ml_dtypes.bfloat16),    # zero points, bfloat16
    ((2, 40000), dict(axis=1, group_size=17000), np.float16),         # groups, the last one short (6000)
    ((1, 16400), dict(axis=0, symmetric=True, dtype="uint8"), np.float32),
    ((2, 57000), dict(axis=0), np.float32),                           # 228 KB: the opt-in maximum
])
def test_staged_blocks_bit_for_bit(cp, shape, kw, dtype):
    x = _special(_x(shape, dtype, seed=shape[1]))
    cp._sim.launches.clear()
    _same(cp, gpuq.quantize_dynamic(x, **kw), gpuq.quantize_dynamic(cp.asarray(x), **kw))
    (rec,) = [r for r in cp._sim.launches if "dynamic_quantize_staged" in r.name]
    g = kw.get("group_size") or shape[1]
    assert rec.shared_mem == (g + 32) * np.dtype(dtype).itemsize and rec.block == (512, 1, 1)


def test_staged_unaligned_views_and_several_blocks_per_thread_block(cp, monkeypatch):
    """A view one element into its allocation (no 16-byte alignment anywhere), the grid capped at
    two thread blocks for five rows (each stages several rows in turn), every fiber schedule."""
    from gpuq.backends.cuda import qparams

    monkeypatch.setattr(qparams, "_MAX_BLOCKS", 2)
    x = _special(_x((5, 16403), seed=3))
    flat = cp.asarray(np.concatenate([np.zeros(1, np.float32), x.ravel()]))
    view = flat[1:].reshape(x.shape)
    want = gpuq.quantize_dynamic(x, axis=0, dtype="uint8")
    for schedule in ("inorder", "reversed", "interleaved"):
        cp._sim.launches.clear()
        with cp._sim.schedule(schedule):
            _same(cp, want, gpuq.quantize_dynamic(view, axis=0, dtype="uint8"))
        assert [r.grid for r in cp._sim.launches if "staged" in r.name] == [(2, 1, 1)]


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_staged_non_finite_rows_checked_and_unchecked(cp, dtype):
    """+-Inf in a row: the checked call raises (and writes nothing the caller sees); unchecked, that
    row's scale is +Inf and its codes its zero point, on the host and the device alike."""
    x = _x((3, 16500), seed=7)
    x[1, 9000] = np.inf
    x[2, 5] = -np.inf
    with pytest.raises(ValueError, match="finite"):
        gpuq.quantize_dynamic(cp.asarray(x), axis=0, dtype=dtype)
    host = gpuq.quantize_dynamic(x, axis=0, dtype=dtype, check_values=False)
    dev = gpuq.quantize_dynamic(cp.asarray(x), axis=0, dtype=dtype, check_values=False)
    _same(cp, host, dev)
    assert np.isinf(host[1][1:]).all() and "staged" in cp._sim.launches[-1].name


def test_staged_limit_follows_the_devices_opt_in(cp):
    """The kernel's MaxDynamicSharedMemorySize is raised to sharedMemPerBlockOptin less 1 KB; a row
    that fits sm_90's 227 KB but not sm_80's 163 KB is staged on the first and read twice on the
    second; above 65536 elements the two-pass path (reduction, then quantize) takes it."""
    from gpuq.backends.cuda import qparams, registry

    name = registry.staged_name("float32", "int8")
    x = _x((1, 50000), seed=11)
    for cc, want in (("90", "dynamic_quantize_staged"), ("80", "dynamic_quantize_segments")):
        with cp._sim.compute_capability(cc):
            limit = cp.cuda.runtime.getDeviceProperties(0)["sharedMemPerBlockOptin"] - 1024
            assert qparams.staged_limit(0) == limit
            cp._sim.launches.clear()
            _same(cp, gpuq.quantize_dynamic(x, axis=0), gpuq.quantize_dynamic(cp.asarray(x), axis=0))
            assert want in _families(cp)
    assert qparams._function(name).max_dynamic_shared_size_bytes == (227 << 10) - 1024
    cp._sim.launches.clear()
    big = _x((1, 65552), ml_dtypes.bfloat16, seed=12)
    _same(cp, gpuq.quantize_dynamic(big, axis=0), gpuq.quantize_dynamic(cp.asarray(big), axis=0))
    assert not _families(cp) & {"dynamic_quantize_staged", "dynamic_quantize_segments", "dynamic_quantize_units"}


def test_the_stand_in_refuses_shared_memory_beyond_the_kernels_limit(cp):
    """As a GPU: above 48 KB a launch needs the kernel's attribute raised, which the device's
    opt-in maximum bounds."""
    from gpuq.backends.cuda import qparams, registry

    fn = qparams._function(registry.staged_name("float16", "uint8"))
    fresh = type(fn)._bound(fn._module, fn.name, fn._kernel)  # the same kernel, its attribute unset
    assert fresh.max_dynamic_shared_size_bytes == 48 << 10
    x = cp.zeros((1, 24600), cp.float16)
    q = cp.empty(x.shape, cp.uint8)
    scales, zps = cp.empty(1, cp.float32), cp.empty(1, cp.int32)
    args = (x, q, np.int64(1), np.int64(x.size), np.int64(x.size), np.int32(0), np.float32(1e-8), np.int32(0),
            scales, zps, np.uint64(0))
    with pytest.raises(cp._sim.LaunchConfigError, match="MaxDynamicSharedMemorySize"):
        fresh((1,), (512,), args, shared_mem=qparams.staged_bytes(x.size, 2))
    with pytest.raises(cp.cuda.driver.CUDADriverError, match="sharedMemPerBlockOptin"):
        fresh.max_dynamic_shared_size_bytes = (227 << 10) + 1
    fresh.max_dynamic_shared_size_bytes = 227 << 10
    fresh((1,), (512,), args, shared_mem=qparams.staged_bytes(x.size, 2))
    assert int(cp.asnumpy(q).max()) == 0 and cp.asnumpy(zps)[0] == 0
