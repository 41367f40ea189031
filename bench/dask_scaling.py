"""Dask scaling: quantize a float32 Dask array on a LocalCluster of 1 and 2 worker processes.

    python bench/dask_scaling.py [--gb 4] [--chunk-mb 64] [--repeat 3]

Per-channel int8 quantization (scales given, one per row: the data-bound
case) of a ``--gb`` float32 array made and persisted in the workers
(``da.random``: nothing travels from the client). Each chunk's codes are
reduced to their byte count, so what is timed is the quantize graph, not a
transfer of results. Reported: throughput of the quantize (GB/s of float32 input),
speed-up over the in-memory call on one chunk-sized array at the same thread
count, and the Dask overhead at 1 worker (workers x threads = the machine's
cores, gpuq's thread count matched to the worker's threads).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np


def _best(fn, repeat):
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def _set_threads(n):
    import gpuq

    gpuq.set_num_threads(n)
    return n


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--gb", type=float, default=4.0)
    p.add_argument("--chunk-mb", type=float, default=64.0)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--keep-malloc-trim", action="store_true",
                   help="start workers with the nanny's MALLOC_TRIM_THRESHOLD_ (the default cluster)")
    args = p.parse_args(argv)
    import dask
    import dask.array as da
    import distributed

    import gpuq

    cores = os.cpu_count()
    cols = 4096
    rows_per_chunk = max(1, int(args.chunk_mb * 2**20 / 4 / cols))
    rows = max(rows_per_chunk, int(args.gb * 1e9 / 4 / cols) // rows_per_chunk * rows_per_chunk)
    nbytes = rows * cols * 4
    scales = np.full(rows, 0.02, np.float32)
    print(f"array {rows}x{cols} float32 = {nbytes / 1e9:.2f} GB, chunks {rows_per_chunk}x{cols} "
          f"= {rows_per_chunk * cols * 4 / 2**20:.0f} MiB, {cores} cores, gpuq {gpuq.get_host_kernels()}")

    # In-memory reference: the whole array in this process, gpuq at the machine's cores.
    gpuq.set_num_threads(cores)
    full = np.random.default_rng(0).standard_normal((rows, cols), np.float32)
    gpuq.quantize(full[:rows_per_chunk], scales[:rows_per_chunk], axis=0)  # compile / warm
    t_mem = _best(lambda: gpuq.quantize(full, scales, axis=0), args.repeat)
    del full
    mem_gbs = nbytes / t_mem / 1e9
    print(f"in-memory quantize, {cores} threads: {t_mem:.3f} s, {mem_gbs:.2f} GB/s")

    results = []
    environ = dict(dask.config.get("distributed.nanny.pre-spawn-environ", {}))
    if not args.keep_malloc_trim:
        # The nanny's MALLOC_TRIM_THRESHOLD_=65536 hands every freed chunk-sized buffer back to
        # the OS, so each chunk's output is fresh pages (page faults): see bench/NOTES.md.
        environ.pop("MALLOC_TRIM_THRESHOLD_", None)
    print(f"worker environment: MALLOC_TRIM_THRESHOLD_={environ.get('MALLOC_TRIM_THRESHOLD_', 'unset')}")
    for workers in (1, 2):
        threads = max(1, cores // workers)
        with dask.config.set({"distributed.nanny.pre-spawn-environ": environ}), distributed.LocalCluster(n_workers=workers, threads_per_worker=threads, processes=True,
                                      dashboard_address=None, memory_limit=0) as cluster, \
                distributed.Client(cluster) as client:
            client.run(_set_threads, threads)
            # The data lives in the workers (persisted): what is timed is the quantize graph.
            x = da.random.default_rng(1).standard_normal((rows, cols), chunks=(rows_per_chunk, cols),
                                                         dtype=np.float32).persist()
            distributed.wait(x)
            s = da.from_array(scales, chunks=(rows_per_chunk,)).persist()
            q = gpuq.quantize(x, s, axis=0)
            # Each chunk's codes reduced to their byte count: no transfer of results is timed.
            work = q.map_blocks(lambda b: np.array([b.nbytes]), dtype=np.int64, chunks=(1,), drop_axis=1)
            assert int(work.sum().compute()) == rows * cols  # warm: compile the loops in every worker
            t = _best(lambda: work.sum().compute(), args.repeat)
            gbs = nbytes / t / 1e9
            results.append((workers, threads, t, gbs))
            print(f"{workers} worker(s) x {threads} thread(s): {t:.3f} s, {gbs:.2f} GB/s, "
                  f"speed-up over in-memory {t_mem / t:.2f}x (overhead {t / t_mem:.2f}x)")
    return results


if __name__ == "__main__":
    main()
