"""gpuq on a real ``distributed.LocalCluster`` with two worker processes: the in-memory bits.

Workers are separate processes that import gpuq themselves (the graph holds
gpuq's functions by reference), so this checks pickling, import and the
per-process caches, not only the threaded scheduler.
"""

from __future__ import annotations

import numpy as np
import pytest

da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")

import gpuq  # noqa: E402


@pytest.fixture(scope="module")
def client():
    with distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1,
                                  dashboard_address=None, worker_dashboard_address=None) as cluster:
        with distributed.Client(cluster) as c:
            yield c


def test_two_worker_processes_give_the_in_memory_bits(client):
    assert len(client.scheduler_info()["workers"]) == 2
    x = np.random.default_rng(3).normal(size=(96, 200)).astype(np.float32)
    x[5, 7] = np.nan
    d = da.from_array(x, chunks=(32, 64))
    lazy = {
        "dyn_channel": gpuq.quantize_dynamic(d, axis=0),            # tree over chunks of axis 1
        "dyn_tensor": gpuq.quantize_dynamic(d, dtype="uint8"),      # tree over all chunks
        "dyn_group": gpuq.quantize_dynamic(d, axis=1, group_size=48),  # rechunked: 64 -> 48-aligned
    }
    s, z = gpuq.choose_qparams(d, axis=1, symmetric=True, dtype="uint8")
    q = gpuq.quantize(d, s, z, axis=1, dtype="uint8")
    y = gpuq.dequantize(q, s, z, axis=1)
    got = client.compute([lazy, q, y], sync=True)
    want = {
        "dyn_channel": gpuq.quantize_dynamic(x, axis=0),
        "dyn_tensor": gpuq.quantize_dynamic(x, dtype="uint8"),
        "dyn_group": gpuq.quantize_dynamic(x, axis=1, group_size=48),
    }
    for key, results in want.items():
        for g, w in zip(got[0][key], results):
            assert (g is None) == (w is None)
            if w is not None:
                assert g.dtype == w.dtype and g.tobytes() == w.tobytes(), key
    s0, z0 = gpuq.choose_qparams(x, axis=1, symmetric=True, dtype="uint8")
    q0 = gpuq.quantize(x, s0, z0, axis=1, dtype="uint8")
    assert got[1].tobytes() == q0.tobytes()
    assert got[2].tobytes() == gpuq.dequantize(q0, s0, z0, axis=1).tobytes()
    # The work ran in the workers' processes, not here.
    ran = client.run(lambda: __import__("sys").modules.get("gpuq") is not None)
    assert len(ran) == 2 and all(ran.values())


def _chunk_threads():
    from gpuq import _dask

    with _dask._threads_shared():
        return gpuq.get_num_threads(), _dask._worker_threads()


def test_chunk_tasks_take_at_most_their_workers_threads(client):
    """A worker of 1 thread runs gpuq's chunk calls on 1 thread, whatever the cores (two such
    workers on 2 cores: 1 each, not 2 each); outside a worker, the process's threads."""
    got = client.submit(_chunk_threads, pure=False).result()
    assert got == (1, 1)
    before = gpuq.get_num_threads()
    gpuq.set_num_threads(3)
    try:
        assert _chunk_threads() == (3, None)
    finally:
        gpuq.set_num_threads(before)
