"""Dask arrays through gpuq's API (gpuq/_dask.py): lazy, chunk type kept, the in-memory bits.

Every result is compared exactly with the in-memory call on the computed array,
through the shared ``backend`` fixture: NumPy chunks through both host loops,
and CuPy chunks on the CUDA path (real CuPy, or the CPU execution of the kernels,
where CuPy chunks are gathered block by block: Dask's own CuPy concatenation needs
``cupy.concatenate``, which the stand-in does not model).
"""

from __future__ import annotations

import concurrent.futures as cf

import numpy as np
import pytest

da = pytest.importorskip("dask.array")
import dask  # noqa: E402
from dask.array.utils import assert_eq  # noqa: E402

import gpuq  # noqa: E402
from gpuq._dask import group_chunks  # noqa: E402

SCHEMES = [
    dict(axis=None),
    dict(axis=0),
    dict(axis=-1),
    dict(axis=(0, 2)),
    dict(axis=2, group_size=4),   # chunks (5, 5, 3) along it: not aligned, rechunked
    dict(axis=1, group_size=3),   # chunks (4, 3): not aligned
    dict(axis=2, group_size=5),   # aligned
    dict(block_size=(3, 2, 4)),   # blocks on every dim: rechunked to their multiples
    dict(block_size=(2, -1, 5)),  # a block covering a dim: that dim in one chunk
]
# Small chunks; one chunk; uneven chunks with an empty one along the last axis.
CHUNKS = [(3, 4, 5), (7, 7, 13), (2, (1, 6), (5, 0, 5, 3))]


def _data(shape=(7, 7, 13), dtype=np.float32, seed=0):
    x = np.random.default_rng(seed).normal(size=shape).astype(dtype)
    x.flat[::17] = np.nan
    return x


@pytest.fixture(autouse=True, scope="module")
def _dask_concatenates_stand_in_chunks():
    """On the CPU execution of the kernels only: Dask's rechunk joins CuPy chunks with
    ``cupy.concatenate``, which the stand-in does not model; join them through the host here
    (a test harness for the stand-in: real CuPy's own concatenate serves on a GPU)."""
    from conftest import CUDA_MODE

    if CUDA_MODE != "sim":
        yield
        return
    import cupy
    from dask.array.dispatch import concatenate_lookup

    def concatenate(arrays, axis=0):
        return cupy.asarray(np.concatenate([cupy.asnumpy(a) for a in arrays], axis=axis))

    concatenate_lookup.register(cupy.ndarray, concatenate)
    yield


def _lazy(x, chunks, backend):
    d = da.from_array(x, chunks=chunks)
    if backend.name != "cuda":
        return d
    import cupy

    return d.map_blocks(cupy.asarray, dtype=d.dtype, meta=cupy.empty((0,) * d.ndim, d.dtype))


def _compute(arr, backend):
    """A Dask array's value as NumPy, its chunk type checked."""
    if arr is None:
        return None
    if backend.name != "cuda":
        assert type(arr._meta) is np.ndarray
        return arr.compute(scheduler="threads")
    import cupy

    assert type(arr._meta) is cupy.ndarray
    blocks = arr.to_delayed()
    values = dask.compute(*blocks.ravel().tolist(), scheduler="sync")
    assert all(type(v) is cupy.ndarray for v in values)
    grid = np.empty(blocks.shape, object)
    for i, v in zip(np.ndindex(blocks.shape), values):
        grid[i] = cupy.asnumpy(v)
    return np.block(grid.tolist()) if grid.ndim else grid[()]


def _same(got, want):
    if want is None:
        assert got is None
        return
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.array_equal(np.asarray(got).tobytes(), np.asarray(want).tobytes())


@pytest.mark.parametrize("chunks", CHUNKS, ids=str)
@pytest.mark.parametrize("kw", SCHEMES, ids=str)
def test_every_scheme_same_bits_as_in_memory(backend, kw, chunks):
    x = _data()
    d = _lazy(x, chunks, backend)
    dt = "uint8" if kw.get("axis") is None else "int8"
    for sym in (False, True):
        s0, z0 = gpuq.choose_qparams(x, symmetric=sym, dtype=dt, **kw)
        s, z = gpuq.choose_qparams(d, symmetric=sym, dtype=dt, **kw)
        _same(_compute(s, backend), s0)
        _same(_compute(z, backend), z0)
        q0, _, _ = gpuq.quantize_dynamic(x, symmetric=sym, dtype=dt, **kw)
        q, s, z = gpuq.quantize_dynamic(d, symmetric=sym, dtype=dt, **kw)
        _same(_compute(q, backend), q0)
        _same(_compute(s, backend), s0)
        _same(_compute(z, backend), z0)
    s0p, z0p = backend.put(s0), None if z0 is None else backend.put(z0)
    q = gpuq.quantize(d, s0p, z0p, dtype=dt, **kw)
    _same(_compute(q, backend), gpuq.quantize(x, s0, z0, dtype=dt, **kw))
    dq = _lazy(q0, chunks, backend)
    for out in ("float32", "float16", "float64"):
        y = gpuq.dequantize(dq, s0p, z0p, dtype=out, **kw)
        _same(_compute(y, backend), gpuq.dequantize(q0, s0, z0, dtype=out, **kw))


def _fp8_bits(q, backend):
    """fp8 codes of a Dask call as uint8 bits on the host: ml_dtypes chunks (NumPy), or the
    Codes of the Dask array of bits (CuPy, which has no fp8 dtype)."""
    if isinstance(q, gpuq.Codes):
        assert backend.name == "cuda" and q.data.dtype == np.uint8
        return _compute(q.data, backend)
    return _compute(q, backend).view(np.uint8)


@pytest.mark.parametrize("fmt", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("kw", [dict(axis=None), dict(axis=0), dict(axis=2, group_size=4), dict(axis=(0, 2))],
                         ids=["tensor", "axis0", "group4", "multi"])
def test_fp8_codes_with_the_in_memory_bits(backend, fmt, kw):
    """Issue 27: Dask takes fp8 through the code-type table, for all four functions: NumPy
    chunks as ml_dtypes fp8 arrays, CuPy chunks as the Codes of their bits, as in memory."""
    x = _data()
    x[2, 3, 4] = 1e6  # saturates
    d = _lazy(x, (3, 4, 5), backend)
    s0, z0 = gpuq.choose_qparams(x, dtype=fmt, **kw)
    s, z = gpuq.choose_qparams(d, dtype=fmt, **kw)
    assert z is None and z0 is None
    _same(_compute(s, backend), s0)
    q0 = gpuq.quantize(x, s0, dtype=fmt, **kw)
    q = gpuq.quantize(d, backend.put(s0), dtype=fmt, **kw)
    np.testing.assert_array_equal(_fp8_bits(q, backend), q0.view(np.uint8))
    qd, sd, zd = gpuq.quantize_dynamic(d, dtype=fmt, **kw)
    qd0, sd0, _ = gpuq.quantize_dynamic(x, dtype=fmt, **kw)
    np.testing.assert_array_equal(_fp8_bits(qd, backend), qd0.view(np.uint8))
    _same(_compute(sd, backend), sd0)
    assert zd is None
    for out in ("float32", "bfloat16"):
        y = gpuq.dequantize(q, backend.put(s0), dtype=out, **kw)
        want = gpuq.dequantize(q0, s0, dtype=out, **kw)
        np.testing.assert_array_equal(_compute(y, backend).view(np.uint8), want.view(np.uint8))


@pytest.mark.parametrize("kw", [dict(axis=None), dict(axis=0), dict(axis=1, group_size=8)],
                         ids=["tensor", "axis0", "group8"])
def test_signalling_nans_skipped_across_chunks(backend, kw):
    """Issue 26: a signalling NaN is skipped like a quiet one, in the chunks and in the tree
    reduction that joins them (chunks cut rows and groups, one chunk all NaN)."""
    import reference as ref
    from test_qparams import _with_signalling_nans

    x = _with_signalling_nans("float32")
    d = da.from_array(backend.put(x), chunks=(3, 10))
    with np.errstate(invalid="ignore"):
        want_s, want_z = ref.choose_qparams(x.astype(np.float32), **kw)
    s, z = gpuq.choose_qparams(d, **kw)
    np.testing.assert_array_equal(backend.get(s.compute()).view(np.uint32), want_s.view(np.uint32))
    np.testing.assert_array_equal(backend.get(z.compute()), want_z)


def test_assert_eq_and_laziness():
    x = _data()
    d = da.from_array(x, chunks=(3, 4, 5))
    s, z = gpuq.choose_qparams(d, axis=1)
    q = gpuq.quantize(d, s, z, axis=1)
    assert isinstance(q, da.Array) and isinstance(s, da.Array)
    assert_eq(q, gpuq.quantize(x, *gpuq.choose_qparams(x, axis=1), axis=1))
    assert_eq(gpuq.dequantize(q, s, z, axis=1),
              gpuq.dequantize(q.compute(), s.compute(), z.compute(), axis=1))


def test_group_chunks_align_as_coarsen_does():
    assert group_chunks((8, 8, 3), 4) == (8, 8, 3)
    assert group_chunks((5, 5, 5, 3), 4) == (4, 4, 4, 6)
    assert group_chunks((3, 3), 4) == (6,)
    for chunks in [(5, 5, 5, 3), (1, 2, 3, 4, 5), (9, 1, 9)]:
        new = group_chunks(chunks, 4)
        assert sum(new) == sum(chunks) and all(c % 4 == 0 for c in new[:-1])
    x = _data((4, 18))
    d = da.from_array(x, chunks=(4, (5, 5, 5, 3)))
    q, s, z = gpuq.quantize_dynamic(d, axis=1, group_size=4)
    assert q.chunks[1] == (4, 4, 4, 6) and s.chunks[1] == (1, 1, 1, 2)
    _same(q.compute(), gpuq.quantize_dynamic(x, axis=1, group_size=4)[0])


def test_parameters_with_other_chunk_sizes_are_rechunked_to_the_data():
    """Same number of chunks, other sizes: pairing blocks by position would be silently wrong."""
    x = _data((6, 10))
    s0, z0 = gpuq.choose_qparams(x, axis=1)
    d = da.from_array(x, chunks=(6, (4, 6)))
    s = da.from_array(s0, chunks=((6, 4),))
    z = da.from_array(z0, chunks=((2, 8),))
    q = gpuq.quantize(d, s, z, axis=1)
    assert q.chunks == d.chunks
    _same(q.compute(), gpuq.quantize(x, s0, z0, axis=1))
    # Per-group parameters too, against a data rechunk for the groups.
    sg, zg = gpuq.choose_qparams(x, axis=1, group_size=3)
    q = gpuq.quantize(d, da.from_array(sg, chunks=(3, 2)), da.from_array(zg, chunks=(6, 1)), axis=1,
                      group_size=3)
    _same(q.compute(), gpuq.quantize(x, sg, zg, axis=1, group_size=3))


def test_empty_arrays_and_chunks(host_loops):
    for shape, chunks in [((0, 5), (1, 2)), ((4, 0), (2, 1)), ((3, 5), ((1, 0, 2), (5,)))]:
        x = np.ones(shape, np.float32)
        d = da.from_array(x, chunks=chunks)
        for kw in (dict(axis=None), dict(axis=1), dict(axis=0), dict(axis=1, group_size=2)):
            for sym in (False, True):
                want = gpuq.quantize_dynamic(x, symmetric=sym, **kw)
                got = dask.compute(*gpuq.quantize_dynamic(d, symmetric=sym, **kw))
                for g, w in zip(got, want):
                    _same(g, w)


def test_argument_errors_at_the_call_data_errors_at_compute():
    x = _data((4, 6))
    d = da.from_array(x, chunks=2)
    with pytest.raises(ValueError, match="axis must be in"):
        gpuq.quantize(d, 1.0, axis=2)
    with pytest.raises(ValueError, match="scales must have 6 elements"):
        gpuq.quantize(d, np.ones(5, np.float32), axis=1)
    with pytest.raises(ValueError, match="scales must have 6 elements"):
        gpuq.quantize(d, da.ones(5, dtype=np.float32), axis=1)
    with pytest.raises(ValueError, match="scales must be finite"):
        gpuq.quantize(d, [1.0, 0.0, 1, 1, 1, 1], axis=1)  # host values: checked now
    with pytest.raises(TypeError, match="scales must be a floating"):
        gpuq.quantize(d, da.ones(6, dtype=np.int32), axis=1)
    with pytest.raises(TypeError, match="src must be int8 or uint8"):
        gpuq.dequantize(d, 1.0)
    with pytest.raises(ValueError, match="dtype must be one of int8, uint8"):
        gpuq.quantize(d, 1.0, dtype="int16")
    with pytest.raises(TypeError, match="out="):
        gpuq.quantize(d, 1.0, out=np.empty((4, 6), np.int8))
    with pytest.raises(TypeError, match="symmetric"):
        gpuq.choose_qparams(d, symmetric="yes")
    with pytest.raises(ValueError, match="eps"):
        gpuq.choose_qparams(d, eps=-1.0)
    with pytest.raises(ValueError, match="group_size"):
        gpuq.quantize_dynamic(d, axis=0, group_size=0)
    with pytest.raises(TypeError, match="out="):
        gpuq.Quantize(scales=[0.5])(d, out=np.empty((4, 6), np.int8))
    with pytest.raises(TypeError, match="out="):  # before the per-group reshape could fail
        gpuq.DynamicQuantize(qtype="per_group", group_shape=[2, 3])(d, np.ones((2, 2), np.float32),
                                                                     out=np.empty((3, 3), np.int8))
    with pytest.raises(TypeError, match="positional"):
        gpuq.Quantize(scales=[0.5])(d, 1.0)
    unknown = d[d[:, 0] > 0]
    with pytest.raises(ValueError, match="compute_chunk_sizes"):
        gpuq.DynamicQuantize(qtype="per_group", group_shape=[1, 3])(unknown, np.ones((2, 2), np.float32))
    with pytest.raises(TypeError, match="not supported on Dask arrays"):
        gpuq.Quantize(scales=[0.5], dtype="int4")(d)
    # Issue 26: a code dtype named by ml_dtypes' type or dtype gets the same message as its name.
    import ml_dtypes

    packed = r"codes \(packed two per byte\) are not supported on Dask arrays yet"
    for dt in ("int4", ml_dtypes.int4, np.dtype(ml_dtypes.uint4), "u4"):
        with pytest.raises(TypeError, match=packed):
            gpuq.quantize(d, 0.5, dtype=dt)
        with pytest.raises(TypeError, match=packed):
            gpuq.quantize_dynamic(d, dtype=dt)
    with pytest.raises(TypeError, match=packed):
        gpuq.dequantize(gpuq.Codes(da.zeros(4, dtype=np.uint8, chunks=2), (8,), "uint4"), 0.5)
    with pytest.raises(TypeError, match="src must be int8 or uint8"):
        gpuq.Dequantize(scales=[0.5])(d)
    # Values held in a Dask array, Inf in the data: at compute.
    bad = gpuq.quantize(d, da.from_array(np.array([1, 1, 1, 0, 1, 1], np.float32), chunks=3), axis=1)
    with pytest.raises(ValueError, match="scales must be finite"):
        bad.compute()
    xi = x.copy()
    xi[3, 4] = np.inf
    s, _ = gpuq.choose_qparams(da.from_array(xi, chunks=2), axis=1)
    with pytest.raises(ValueError, match="finite"):
        s.compute()


def test_no_kernel_runs_while_building_the_graph(monkeypatch):
    from gpuq.backends.host import qparams as host_qparams
    from gpuq.backends.host.backend import NumpyBackend

    calls = []
    real = NumpyBackend.quantize
    monkeypatch.setattr(NumpyBackend, "quantize", staticmethod(lambda *a: calls.append(a[1].shape) or real(*a)))
    real_minmax = host_qparams.minmax
    monkeypatch.setattr(host_qparams, "minmax", lambda x, s: calls.append(x.shape) or real_minmax(x, s))
    d = da.from_array(_data((8, 8)), chunks=4)
    q, s, z = gpuq.quantize_dynamic(d, axis=0)
    q2 = gpuq.quantize(d, s, z, axis=0)
    assert all(0 not in shape for shape in calls) and len(calls) <= 2  # the one-element argument probe
    calls.clear()
    q2.compute(scheduler="sync")
    assert calls and all(0 not in shape for shape in calls)


def _work(i, xp_put):
    x = _data((64, 96), seed=i % 3)
    xs = xp_put(x)
    s, z = gpuq.choose_qparams(xs, axis=0)
    q = gpuq.quantize(xs, s, z, axis=0)
    y = gpuq.dequantize(q, s, z, axis=0)
    q2, s2, z2 = gpuq.quantize_dynamic(xs, axis=1, group_size=8)
    return [np.asarray(getattr(v, "get", lambda: v)()) for v in (s, z, q, y, q2, s2, z2)]


def test_thread_safety_eight_threads_at_once(backend):
    """gpuq's caches, thread pool and kernel registry under concurrent calls (Dask's threaded scheduler)."""
    want = [_work(i, backend.put) for i in range(3)]
    with cf.ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda i: _work(i, backend.put), range(24)))
    for i, g in enumerate(got):
        for a, b in zip(g, want[i % 3]):
            _same(a, b)


def test_threaded_scheduler_many_chunks(host_loops):
    x = _data((64, 256))
    d = da.from_array(x, chunks=(8, 32))
    q, s, z = gpuq.quantize_dynamic(d, axis=1)
    got = dask.compute(q, s, z, scheduler="threads", num_workers=8)
    for g, w in zip(got, gpuq.quantize_dynamic(x, axis=1)):
        _same(g, w)


def test_large_chunk_outputs_in_their_own_mappings(host_loops):
    """Chunk outputs of >= HUGE_OUT_MIN bytes are written into fresh anonymous mappings (not
    malloc's heap pages) with the in-memory bits; smaller ones are gpuq's own allocation."""
    import mmap

    from gpuq import _dask

    rows = _dask.HUGE_OUT_MIN // 1024 + 3  # int8 codes of one chunk: just over the threshold
    x = _data((rows, 1024), seed=5)
    s = np.random.default_rng(6).uniform(0.01, 0.1, rows).astype(np.float32)
    big = gpuq.quantize(da.from_array(x, chunks=(rows, 1024)), s, axis=0)
    block = _first_block(big)
    assert np.array_equal(block, gpuq.quantize(x, s, axis=0))
    if _dask._HUGE_PAGES:  # Linux
        assert isinstance(_memory_owner(block), mmap.mmap)
    small = gpuq.quantize(da.from_array(x[:5], chunks=(5, 1024)), s[:5], axis=0)
    block = _first_block(small)
    assert not isinstance(_memory_owner(block), mmap.mmap)
    assert np.array_equal(block, gpuq.quantize(x[:5], s[:5], axis=0))


def _first_block(x):
    """The first chunk as its task returns it (``compute`` may copy it while assembling)."""
    return dask.get(dict(x.__dask_graph__()), x.__dask_keys__()[0][0])


def _memory_owner(a):
    """The object at the end of an array's base chain (through a memoryview's ``obj``)."""
    while isinstance(a, np.ndarray) and a.base is not None:
        a = a.base
    return a.obj if isinstance(a, memoryview) else a


def test_chunk_tasks_share_the_process_threads():
    """Chunk tasks running at once split gpuq's threads among them (a Dask worker runs as many
    tasks at once as it has threads: without sharing, N tasks x N threads on N cores); a task
    alone, or one that starts after others ended, takes them all."""
    import threading

    from gpuq import _dask

    before = gpuq.get_num_threads()
    gpuq.set_num_threads(4)
    entered = [threading.Event() for _ in range(5)]
    release = threading.Event()
    shares = {}

    def task(i):
        if i:
            entered[i - 1].wait(10)
        with _dask._threads_shared():
            shares[i] = gpuq.get_num_threads()
            entered[i].set()
            release.wait(10)
        return gpuq.get_num_threads()

    try:
        with cf.ThreadPoolExecutor(5) as pool:
            futures = [pool.submit(task, i) for i in range(5)]
            assert entered[4].wait(10)
            release.set()
            after = [f.result() for f in futures]
        assert [shares[i] for i in range(5)] == [4, 2, 1, 1, 1]
        assert after == [4] * 5 and _dask._running == 0
        with _dask._threads_shared():
            assert gpuq.get_num_threads() == 4
    finally:
        gpuq.set_num_threads(before)


def test_chunk_calls_alone_take_every_thread_and_shared_give_the_same_bits(monkeypatch, host_loops):
    from gpuq.backends.host.backend import NumpyBackend

    threads = []
    real = NumpyBackend.quantize
    monkeypatch.setattr(NumpyBackend, "quantize",
                        staticmethod(lambda *a: threads.append(gpuq.get_num_threads()) or real(*a)))
    x = _data((64, 40))
    want = gpuq.quantize(x, 0.05)
    d = da.from_array(x, chunks=(8, 40))
    before = gpuq.get_num_threads()
    gpuq.set_num_threads(4)
    try:
        q = gpuq.quantize(d, 0.05)
        threads.clear()
        _same(q.compute(scheduler="sync"), want)
        assert threads == [4] * 8  # one task at a time: all of them
        threads.clear()
        _same(q.compute(scheduler="threads", num_workers=4), want)
        assert len(threads) == 8
    finally:
        gpuq.set_num_threads(before)


def _ops_cases(x, q8):
    """(op, in-memory inputs) pairs covering every op and qtype, on float data ``x`` (7, 7, 13)
    and its int8 codes ``q8``."""
    rng = np.random.default_rng(3)
    s7 = rng.uniform(0.01, 0.1, 7).astype(np.float32)
    z7 = rng.integers(-5, 5, 7).astype(np.int32)
    sg = rng.uniform(0.01, 0.1, (7, 7, 1)).astype(np.float32)
    sgg = rng.uniform(0.01, 0.1, (1, 7, 1)).astype(np.float32)
    return [
        (gpuq.Quantize(scales=[0.05], zps=[3], dtype="u8"), (x,)),
        (gpuq.Quantize(scales=s7, zps=z7, qtype="per_channel", axis=1), (x,)),
        (gpuq.Quantize(scales=np.float64(0.1).reshape(1)), (x.astype(np.float64),)),
        (gpuq.Dequantize(scales=s7, zps=z7, qtype="per_channel", axis=0, dtype="f16"), (q8,)),
        (gpuq.DynamicQuantize(qtype="per_channel", axis=2), (x, rng.uniform(0.01, 0.1, 13).astype(np.float32))),
        (gpuq.DynamicQuantize(qtype="per_group", group_shape=[1, 1, 13]), (x, sg)),
        (gpuq.DynamicQuantize(qtype="per_group", group_shape=[7, 1, 13]), (x, sgg)),
        (gpuq.DynamicDequantize(qtype="per_group", group_shape=[1, 1, 13]), (q8, sg)),
        (gpuq.DynamicDequantize(), (q8, np.array([0.5], np.float32), np.array([2], np.int32))),
    ]


@pytest.mark.parametrize("case", range(9))
def test_op_objects_take_dask_arrays(backend, case):
    """An op on a Dask array: lazy, the chunk type kept, the bits of the op on the computed array."""
    x = _data()
    q8 = gpuq.quantize(x, 0.02)
    op, inputs = _ops_cases(x, q8)[case]
    want = op(*(backend.put(a) for a in inputs))
    src = _lazy(inputs[0], (3, (2, 5), 6), backend)
    got = op(src, *inputs[1:])
    assert isinstance(got, da.Array)
    _same(_compute(got, backend), backend.get(want))


def test_arguments_are_checked_without_computing_on_a_stand_in():
    """A tiny eps that float16 cannot hold is fine where no block's range is 0 (in memory and on
    Dask alike: the checks compute nothing), and shape errors name the Dask array's shape."""
    x = np.random.default_rng(0).normal(size=(8, 8)).astype(np.float32)
    for method in ("minmax", "mse"):
        want = gpuq.choose_qparams(x, scale_dtype="float16", eps=1e-30, method=method)
        got = gpuq.choose_qparams(da.from_array(x, chunks=4), scale_dtype="float16", eps=1e-30, method=method)
        np.testing.assert_array_equal(got[0].compute(), want[0])
        np.testing.assert_array_equal(got[1].compute(), want[1])
    with pytest.raises(ValueError, match=r"\(2 for shape \(8, 8\)\), got 1"):
        gpuq.choose_qparams(da.from_array(x, chunks=4), block_size=(2,))
