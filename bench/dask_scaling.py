"""Dask scaling: quantize a float32 Dask array on a LocalCluster of 1 and 2 worker processes.

    python bench/dask_scaling.py [--gb 4] [--chunk-mb 64] [--repeat 3] [--gather]

Per-channel int8 quantization (scales given, one per row: the data-bound
case) of a ``--gb`` float32 array. The data is generated once (``da.random``
with a fixed seed) and is the same in both paths, generation timed in neither:

* in-memory: the generated chunks stored into one NumPy array in this process
  (``da.store``), then ``gpuq.quantize(full, scales, axis=0)`` at the machine's
  cores (the reference);
* Dask: the same graph persisted in the workers, then ``gpuq.quantize(x, s,
  axis=0).persist()`` and a wait: the codes exist in the workers' memory, as the
  in-memory call's codes exist in this process's. That is what "overhead of the
  Dask path" means here. Nothing travels to the client; each repetition's codes
  are released (and the scheduler polled until it forgot them) before the next,
  so every repetition computes them.

Not timed as the overhead, and why: ``.compute()`` of the codes gathers every
chunk to the client through the comm and concatenates them (``--gather`` prints it:
a transfer, not the quantize); and a per-chunk reduction written with
``map_blocks(..., drop_axis=1)`` *copies every block* (Dask concatenates the one
block along the dropped axis), which made the first version of this bench count
a 1 GB memcpy against Dask only (bench/NOTES.md).

Also printed: the in-memory call chunk by chunk in a loop (what a worker does
with no scheduler); Dask's default scheduler for arrays (``scheduler="threads"``:
one process, a pool of the machine's threads, no distributed machinery) on the
same chunks; and, for each cluster, the mean quantize task from the task stream
(``distributed.get_task_stream``) against that loop's per-chunk time, and the CPU
seconds each process spent during one persist (the client's process, which holds
the LocalCluster's scheduler, and the workers') against the in-memory call's, so
the overhead splits into time inside the tasks and Dask's own work beside them.

Workers x threads = the machine's cores; gpuq's thread count in each worker set to
the worker's threads (``client.run(gpuq.set_num_threads, n)``; ``--gpuq-threads``
sets another), shared by the chunk tasks running at once (``gpuq/_dask.py``).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np


def _best(fn, repeat, clock=time.perf_counter):
    """The least time of ``repeat`` runs of ``fn()`` on ``clock`` (wall; ``time.process_time``:
    CPU seconds of every thread of this process)."""
    times = []
    for _ in range(repeat):
        t = clock()
        fn()
        times.append(clock() - t)
    return min(times)


def _set_threads(n):
    import gpuq

    gpuq.set_num_threads(n)
    return n


def _nbytes(b):
    return np.array([b.nbytes])


def _nbytes2(b):
    return np.array([[b.nbytes]])


def _held(keys, dask_scheduler=None):
    return any(k in dask_scheduler.tasks for k in keys)


def _quantize_tasks(client, fn):
    """Run ``fn`` under a task stream; the mean duration (s) and count of gpuq quantize tasks."""
    import distributed

    with distributed.get_task_stream(client) as ts:
        fn()
    d = [ss["stop"] - ss["start"] for t in ts.data for ss in t["startstops"]
         if ss["action"] == "compute" and "gpuq-quantize" in str(t["key"])]
    return (sum(d) / len(d) if d else float("nan")), len(d)


def _process_cpu(client, fn):
    """CPU seconds of this process (client, the LocalCluster's scheduler and nannies) and of
    the worker processes together while ``fn()`` runs."""
    import psutil

    here = psutil.Process()
    workers = [psutil.Process(pid) for pid in client.run(os.getpid).values()]

    def total(p):
        t = p.cpu_times()
        return t.user + t.system

    before = [total(here), sum(total(w) for w in workers)]
    fn()
    return total(here) - before[0], sum(total(w) for w in workers) - before[1]


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--gb", type=float, default=4.0)
    p.add_argument("--chunk-mb", type=float, default=64.0)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--gpuq-threads", type=int, default=None,
                   help="gpuq's thread count in each worker process (default: the worker's threads), "
                        "shared by the chunk tasks running at once")
    p.add_argument("--gather", action="store_true",
                   help="also time .compute() of the codes (a transfer of every chunk to the client)")
    p.add_argument("--reductions", action="store_true",
                   help="also time the first version's measure (each chunk's codes reduced to their byte "
                        "count with map_blocks(drop_axis=1), which copies every block) and the same "
                        "reduction without the copy (keepdims)")
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
    nchunks = rows // rows_per_chunk
    nbytes = rows * cols * 4
    scales = np.full(rows, 0.02, np.float32)
    print(f"array {rows}x{cols} float32 = {nbytes / 1e9:.2f} GB, {nchunks} chunks {rows_per_chunk}x{cols} "
          f"= {rows_per_chunk * cols * 4 / 2**20:.0f} MiB, {cores} cores, gpuq {gpuq.get_host_kernels()}, "
          f"dask {dask.__version__}")

    def generated():
        return da.random.default_rng(1).standard_normal((rows, cols), chunks=(rows_per_chunk, cols),
                                                        dtype=np.float32)

    # In-memory reference: the same values, stored into one array here (not timed).
    full = np.empty((rows, cols), np.float32)
    da.store(generated(), full, scheduler="threads")
    gpuq.set_num_threads(cores)
    gpuq.quantize(full[:rows_per_chunk], scales[:rows_per_chunk], axis=0)  # compile / warm
    t_mem = _best(lambda: gpuq.quantize(full, scales, axis=0), args.repeat)
    mem_gbs = nbytes / t_mem / 1e9
    print(f"in-memory quantize, {cores} threads: {t_mem:.3f} s, {mem_gbs:.2f} GB/s")
    first = gpuq.quantize(full[:rows_per_chunk], scales[:rows_per_chunk], axis=0)
    per_chunk = {}
    for n in sorted({1, cores}):
        gpuq.set_num_threads(n)

        def loop():
            for i in range(nchunks):
                sl = slice(i * rows_per_chunk, (i + 1) * rows_per_chunk)
                gpuq.quantize(full[sl], scales[sl], axis=0)

        t = _best(loop, args.repeat)
        per_chunk[n] = t / nchunks
        print(f"in-memory, chunk by chunk in a loop, {n} thread(s): {t:.3f} s "
              f"({per_chunk[n] * 1e3:.2f} ms a chunk, {t / t_mem:.2f}x the whole call)")
    gpuq.set_num_threads(cores)
    cpu_mem = _best(lambda: gpuq.quantize(full, scales, axis=0), args.repeat, time.process_time)
    print(f"in-memory quantize CPU: {cpu_mem:.3f} s")
    # Dask's default scheduler for arrays: threads of this process, no distributed machinery.
    local = gpuq.quantize(da.from_array(full, chunks=(rows_per_chunk, cols)),
                          da.from_array(scales, chunks=(rows_per_chunk,)), axis=0)
    t_threads = _best(lambda: local.persist(scheduler="threads", num_workers=cores), args.repeat)
    print(f"Dask threaded scheduler, {cores} threads: persist {t_threads:.3f} s, "
          f"{nbytes / t_threads / 1e9:.2f} GB/s (overhead {t_threads / t_mem:.2f}x)")
    del full, local

    results = []
    environ = dict(dask.config.get("distributed.nanny.pre-spawn-environ", {}))
    if not args.keep_malloc_trim:
        # The nanny's MALLOC_TRIM_THRESHOLD_=65536 hands every freed chunk-sized buffer back to
        # the OS, so each chunk's output is fresh pages (page faults): see bench/NOTES.md.
        environ.pop("MALLOC_TRIM_THRESHOLD_", None)
    print(f"worker environment: MALLOC_TRIM_THRESHOLD_={environ.get('MALLOC_TRIM_THRESHOLD_', 'unset')}")
    for workers in args.workers:
        threads = max(1, cores // workers)
        gthreads = args.gpuq_threads or threads
        with dask.config.set({"distributed.nanny.pre-spawn-environ": environ}), \
                distributed.LocalCluster(n_workers=workers, threads_per_worker=threads, processes=True,
                                         dashboard_address=None, memory_limit=0) as cluster, \
                distributed.Client(cluster) as client:
            client.run(_set_threads, gthreads)
            # The data lives in the workers (persisted, not timed).
            x = generated().persist()
            s = da.from_array(scales, chunks=(rows_per_chunk,)).persist()
            distributed.wait([x, s])
            q = gpuq.quantize(x, s, axis=0)

            keys = [f.key for f in distributed.futures_of(q.persist())]  # (computes them once: warm)

            def run():
                done = q.persist()
                distributed.wait(done)
                del done  # released; wait until the scheduler forgot them, so each repetition computes
                while client.run_on_scheduler(_held, keys):
                    time.sleep(0.01)

            assert np.array_equal(q[:rows_per_chunk].compute(), first)  # same bits; warms every worker
            while client.run_on_scheduler(_held, keys):
                time.sleep(0.01)
            t = _best(run, args.repeat)
            task, ntasks = _quantize_tasks(client, run)
            cpu = _process_cpu(client, run)
            gbs = nbytes / t / 1e9
            line = (f"{workers} worker(s) x {threads} thread(s), gpuq {gthreads}: persist {t:.3f} s, "
                    f"{gbs:.2f} GB/s, speed-up over in-memory {t_mem / t:.2f}x (overhead {t / t_mem:.2f}x); "
                    f"quantize task {task * 1e3:.2f} ms (x{ntasks}) vs {per_chunk.get(gthreads, float('nan')) * 1e3:.2f} "
                    f"ms a chunk in the loop; CPU during a persist: client+scheduler {cpu[0]:.3f} s, "
                    f"workers {cpu[1]:.3f} s (the in-memory call: {cpu_mem:.3f} s)")
            tg = None
            if args.gather:
                tg = _best(lambda: q.compute(), 1)
                line += f"; .compute() to the client {tg:.3f} s ({tg / t_mem:.2f}x)"
            if args.reductions:
                old = q.map_blocks(_nbytes, dtype=np.int64, chunks=(1,), drop_axis=1).sum()
                new = q.map_blocks(_nbytes2, dtype=np.int64, chunks=(1, 1)).sum()
                for label, r in (("drop_axis (copies)", old), ("keepdims (no copy)", new)):
                    assert int(r.compute()) == rows * cols
                    tr = _best(r.compute, args.repeat)
                    line += f"; byte-count reduction, {label} {tr:.3f} s ({tr / t_mem:.2f}x)"
            results.append((workers, threads, gthreads, t, gbs, task, tg, cpu))
            print(line)
    return results


if __name__ == "__main__":
    main()
