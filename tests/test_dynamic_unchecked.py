"""``quantize_dynamic(..., check_values=False)``: no check, no read-back, and the rule for a
block holding +/-Inf (scale +Inf, codes equal to its zero point) with the same bits on every
backend (both host loops, the CUDA kernels through the CPU execution, Dask); the GPU's failure
flag, one word per (device, stream, host thread) cleared by a memset.

The references are independent of gpuq's dynamic code: the finite rows' parameters and codes
from the checked call on those rows alone (tested against the naive formula in
tests/test_qparams.py), the Inf rows' from the rule itself (ml_dtypes for the fp8 bits of
``x / inf``).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import gpuq

F32 = np.float32


def _rows(dtype=np.float32, n=17):
    """Rows of ``n``: finite ones (ties, NaN, -0, a long tail) and rows holding +Inf, -Inf,
    both, and Inf with NaN."""
    rng = np.random.default_rng(38)
    x = (rng.standard_normal((9, n)) * 3).astype(np.float32)
    x[0, :4] = [0.5, -0.5, 1.5, np.nan]
    x[1, 3] = -0.0
    x[2, 5], x[4, 0], x[6, 1], x[6, 2] = np.inf, -np.inf, np.inf, -np.inf
    x[8, :] = np.nan
    x[8, 7] = np.inf
    return x.astype(dtype)


def _bits(q, backend=None):
    """Host codes as comparable integers: int4 unpacked, fp8 by their bytes (CuPy fp8 codes come
    as a Codes of the bytes)."""
    if isinstance(q, gpuq.Codes):
        data = q.data if backend is None else backend.get(q.data)
        if "float8" in q.dtype:
            return data.view(np.uint8).reshape(q.shape)
        return gpuq.unpack(gpuq.Codes(data, q.shape, q.dtype))
    q = np.asarray(q if backend is None else backend.get(q))
    return q.view(np.uint8) if "float8" in str(q.dtype) else q


def _want(x, kw, rows_are_blocks):
    """The expected (codes, scales, zps) of ``x`` (2-D, one block per row or per group):
    finite blocks as the checked call gives them on the finite rows alone, Inf blocks by the
    rule."""
    bad_rows = np.isinf(x.astype(np.float32)).any(axis=1)
    good = ~bad_rows
    q_ok, s_ok, z_ok = gpuq.quantize_dynamic(x[good], **kw)
    q_ok = _bits(q_ok)
    code = str(kw.get("dtype", "int8"))
    pshape = (x.shape[0],) if rows_are_blocks else (x.shape[0], s_ok.shape[1])
    s = np.empty(pshape, F32)
    s[good] = s_ok
    s[bad_rows] = np.inf
    z = None
    if z_ok is not None:
        z = np.empty(pshape, np.int32)
        z[good] = z_ok
        sym = kw.get("symmetric")
        z[bad_rows] = {"uint8": 128, "uint4": 8}[code] if sym else 0
    q = np.empty(x.shape, q_ok.dtype)
    q[good] = q_ok
    if code.startswith("float8"):
        fp8 = getattr(ml_dtypes, code)
        xb = x[bad_rows].astype(np.float32)
        with np.errstate(invalid="ignore"):  # x / Inf: +-0, and for +-Inf a NaN with x's sign
            t = np.where(np.isinf(xb), np.copysign(np.float32(np.nan), xb), xb / F32(np.inf))
        q[bad_rows] = t.astype(fp8).view(np.uint8)
    else:
        zp = 0 if z is None else z[bad_rows].reshape(-1, 1) if rows_are_blocks else z[bad_rows][:, :1]
        q[bad_rows] = zp
    return q, s, z


CASES = [
    dict(dtype="int8"),
    dict(dtype="uint8"),
    dict(dtype="uint8", symmetric=True),
    dict(dtype="int8", scale_dtype="bfloat16"),
    dict(dtype="int4", symmetric=True),
    dict(dtype="uint4"),
    dict(dtype="float8_e4m3fn"),
    dict(dtype="float8_e5m2"),
]


@pytest.mark.parametrize("kw", CASES, ids=lambda kw: "-".join(str(v) for v in kw.values()))
def test_inf_rows_per_row(backend, kw):
    """Per row (the fused one-pass kernels for int8/uint8): Inf rows get scale +Inf and codes
    equal to their zero point; the other rows what the checked call gives them."""
    x = _rows()
    kw = dict(kw, axis=0)
    q, s, z = gpuq.quantize_dynamic(backend.put(x), check_values=False, **kw)
    wq, ws, wz = _want(x, kw, True)
    np.testing.assert_array_equal(_bits(q, backend), wq)
    np.testing.assert_array_equal(backend.get(s).view(np.uint32), ws.view(np.uint32))
    if wz is None:
        assert z is None
    else:
        np.testing.assert_array_equal(backend.get(z), wz)
    with pytest.raises(ValueError, match="must be finite"):
        gpuq.quantize_dynamic(backend.put(x), **kw)  # the default still checks


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, ml_dtypes.bfloat16])
@pytest.mark.parametrize("code", ["int8", "uint8", "float8_e4m3fn"])
def test_inf_groups(backend, dtype, code):
    """Groups along the last axis (one row of groups per row), every float dtype."""
    x = _rows(dtype, n=24)
    kw = dict(axis=1, group_size=24, dtype=code)
    q, s, z = gpuq.quantize_dynamic(backend.put(x), check_values=False, **kw)
    wq, ws, wz = _want(x, kw, False)
    np.testing.assert_array_equal(_bits(q, backend), wq)
    np.testing.assert_array_equal(backend.get(s).view(np.uint32), ws.view(np.uint32))
    if wz is not None:
        np.testing.assert_array_equal(backend.get(z), wz)


def test_inf_columns_and_tensor(backend):
    """Schemes no one-pass kernel takes (per-channel along the first axis, per-tensor): the same
    rule through choose_qparams then the codes."""
    x = _rows().T.copy()  # blocks are columns now
    q, s, z = gpuq.quantize_dynamic(backend.put(x), axis=1, dtype="uint8", check_values=False)
    wq, ws, wz = _want(x.T.copy(), dict(axis=0, dtype="uint8"), True)
    np.testing.assert_array_equal(backend.get(q), wq.T)
    np.testing.assert_array_equal(backend.get(s), ws)
    np.testing.assert_array_equal(backend.get(z), wz)
    q, s, z = gpuq.quantize_dynamic(backend.put(x), dtype="int8", symmetric=True, check_values=False)
    assert backend.get(s) == np.inf and z is None and not backend.get(q).any()


def test_unheld_scale(backend):
    """A scale that scale_dtype cannot hold: checked a ValueError, unchecked +Inf (zero point 0)."""
    x = np.array([[3e7, -2.0, 3.0], [1.0, 0.5, -0.25]], np.float32)
    kw = dict(axis=0, dtype="int8", scale_dtype="float16")
    with pytest.raises(ValueError, match="cannot hold"):
        gpuq.quantize_dynamic(backend.put(x), **kw)
    q, s, z = gpuq.quantize_dynamic(backend.put(x), check_values=False, **kw)
    q1, s1, z1 = gpuq.quantize_dynamic(x[1:], **kw)
    np.testing.assert_array_equal(backend.get(s), [np.inf, s1[0]])
    np.testing.assert_array_equal(backend.get(z), [0, z1[0]])
    np.testing.assert_array_equal(backend.get(q), np.concatenate([np.zeros((1, 3), np.int8), q1]))


def test_check_values_must_be_bool():
    with pytest.raises(TypeError, match="check_values must be True or False, got 0"):
        gpuq.quantize_dynamic(np.zeros(3, np.float32), check_values=0)


def test_mse_always_checks():
    with pytest.raises(ValueError, match="must be finite"):
        gpuq.quantize_dynamic(np.float32([[1, np.inf]]), axis=0, method="mse", check_values=False)


# --- the GPU's flag: no read-back unchecked, one cleared word per stream --------------------------

@pytest.fixture
def cp():
    from conftest import _cuda_skip_reason

    reason = _cuda_skip_reason()
    if reason:
        pytest.skip(reason)
    import cupy

    if not hasattr(cupy, "_sim"):
        pytest.skip("the read-back records need the CPU execution of the kernels")
    return cupy


def test_unchecked_reads_nothing_back(cp):
    x = cp.asarray(_rows())
    cases = (dict(axis=0), dict(axis=1, group_size=17), dict(axis=1), dict(axis=0, dtype="float8_e4m3fn"))
    for kw in cases:  # the kernels built and their arguments uploaded
        gpuq.quantize_dynamic(x, check_values=False, **kw)
    cp._sim.clear_records()
    for kw in cases:
        gpuq.quantize_dynamic(x, check_values=False, **kw)
    assert cp._sim.syncs == []
    assert cp._sim.launches, "the kernels ran"
    with pytest.raises(ValueError, match="must be finite"):
        gpuq.quantize_dynamic(x, axis=0)
    assert [r.what for r in cp._sim.syncs] == ["ndarray.get"]


def test_flag_per_stream_cleared(cp):
    from gpuq.backends.cuda import qparams

    bad, good = cp.asarray(_rows()), cp.asarray(np.ones((3, 5), np.float32))
    with pytest.raises(ValueError, match="must be finite"):
        gpuq.quantize_dynamic(bad, axis=0)
    flag = qparams.failure_flag()
    assert qparams.failure_flag() is flag  # one word per stream, reused
    gpuq.quantize_dynamic(good, axis=0)  # the earlier failure was cleared
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        other = qparams.failure_flag()
        assert other is not flag and other.data.ptr != flag.data.ptr
        with pytest.raises(ValueError, match="must be finite"):
            gpuq.quantize_dynamic(bad, axis=1, group_size=17)
        q, _, _ = gpuq.quantize_dynamic(good, axis=0)
    s.synchronize()
    np.testing.assert_array_equal(cp.asnumpy(q), np.full((3, 5), 127, np.int8))


def test_flag_per_thread(cp):
    """Two host threads on one stream never share a flag (their clears would interleave)."""
    import threading

    from gpuq.backends.cuda import qparams

    mine = qparams.failure_flag()
    theirs = []
    t = threading.Thread(target=lambda: theirs.append(qparams.failure_flag()))
    t.start()
    t.join()
    assert theirs[0] is not mine


# --- Dask: the chunk path and the tree path ----------------------------------------------------------

@pytest.mark.parametrize("chunks", [(3, 17), (9, 6)], ids=["rows-in-chunks", "tree"])
def test_dask(chunks):
    da = pytest.importorskip("dask.array")
    x = _rows()
    got = gpuq.quantize_dynamic(da.from_array(x, chunks=chunks), axis=0, dtype="uint8", check_values=False)
    q, s, z = (v.compute(scheduler="sync") for v in got)
    wq, ws, wz = _want(x, dict(axis=0, dtype="uint8"), True)
    np.testing.assert_array_equal(q, wq)
    np.testing.assert_array_equal(s, ws)
    np.testing.assert_array_equal(z, wz)


def test_torch_op():
    torch = pytest.importorskip("torch")
    import gpuq.torch  # noqa: F401  (registers the ops)

    assert "bool check_values=True" in gpuq.torch.SCHEMAS["quantize_dynamic"]
    x = _rows()
    q, s, z = torch.ops.gpuq.quantize_dynamic(torch.from_numpy(x), axis=[0], dtype="uint8", check_values=False)
    wq, ws, wz = _want(x, dict(axis=0, dtype="uint8"), True)
    np.testing.assert_array_equal(q.numpy(), wq)
    np.testing.assert_array_equal(s.numpy(), ws)
    np.testing.assert_array_equal(z.numpy(), wz)
    q2, s2, z2 = gpuq.quantize_dynamic(torch.from_numpy(x), axis=0, dtype="uint8", check_values=False)
    np.testing.assert_array_equal(q2.numpy(), wq)
    with pytest.raises(TypeError, match="check_values must be True or False"):
        gpuq.quantize_dynamic(torch.from_numpy(x), axis=0, check_values="no")
