"""The shards of a sharded checkpoint as tasks on a Dask cluster (``--scheduler``/``--workers``).

:func:`run_on_cluster` submits one task per shard (:func:`shard_task`, with
``retries=``: a task that raises is run again, and Dask reschedules the tasks
of a worker that dies). A task opens its input shard, quantizes whole tensors
on its worker (``--device auto``: that worker's GPU when it has one) and
writes its output shard itself, under the run's staged name in OUT
(:class:`gpuq.checkpoints.sharded.OutputFolder`): IN and OUT must be on a filesystem
that the client and every worker see at the same paths (the local disk, for
``--workers``). Workers must be able to import gpuq (the same version: a task
checks). A user error on a worker (a NaN tensor under ``--nonfinite error``)
comes back as a value, not an exception, so Dask does not retry what would
fail the same way again. The task returns its report rows; the client
gathers them into the one report table. Progress crosses processes through a
``distributed.Queue``: a task puts each tensor's name when it is written, the
client advances one bar over all tensors (a retried shard's tensors are
counted once).

**Stopping.** On the first failure, or on SIGINT/SIGTERM in the client, the
client sets the run's ``distributed.Event``; every task checks it when it
starts and after each tensor, and stops there (its temporary file removed).
The client waits for the tasks to end (at most :data:`STOP_WAIT` seconds;
for ``--workers`` it then closes its cluster, which ends any worker still
busy) before the run's files are removed, so no task writes into OUT after
the cleanup. ``--workers`` starts its worker processes with SIGINT and
SIGTERM blocked (:func:`gpuq.checkpoints.stops.held_signals`): a Ctrl-C to the
terminal's process group, or a SIGTERM to the whole job, reaches the client
alone, which stops the workers in order, and there are no tracebacks from
workers that were interrupted.
"""

from __future__ import annotations

import contextlib
import os
import time

from .files import CliError, _one_line
from .sharded import run_shard
from .stops import held_signals

#: What ``pip`` needs for ``--scheduler``/``--workers``.
DASK_HINT = "pip install 'gpuq[dask]'"
#: How often a task that raises (not a user error) is run again.
RETRIES = 2
#: How long a stopped run waits for its running tasks to end (each checks after every tensor).
STOP_WAIT = 60.0


def import_distributed():
    """``distributed``, or the one-line error that says how to install it."""
    try:
        import dask  # noqa: F401
        import distributed
    except ImportError:
        raise CliError(f"--scheduler/--workers run on a Dask cluster, and Dask is not "
                       f"installed: {DASK_HINT}") from None
    return distributed


class _Stopped(Exception):
    """The run was stopped: the task ends where it is (atomic_output removes its file)."""


def shard_task(job: dict) -> dict:
    """A shard as a Dask task: :func:`gpuq.checkpoints.sharded.run_shard` on the worker, user errors
    as a value.

    A CliError (bad data, ``--device cuda`` on a worker without a GPU) would
    fail again on a retry, so it is returned as ``{"error": text}``; a task
    of a stopped run returns ``{"stopped": True}``; anything else (a crash,
    an I/O error) raises, and Dask retries it.
    """
    from .. import __version__, set_num_threads

    if job.get("gpuq_version") not in (None, __version__):
        return {"error": f"a worker has gpuq {__version__}, the client {job['gpuq_version']}: "
                         f"install the same gpuq on every worker"}
    if job.get("threads"):
        set_num_threads(job["threads"])
    stop = queue = None
    if job.get("stop") or job.get("queue"):
        import distributed

        stop = distributed.Event(job["stop"]) if job.get("stop") else None
        queue = distributed.Queue(job["queue"]) if job.get("queue") else None

    def tick(name):
        if queue is not None:
            queue.put([job["shard"], name])
        if stop is not None and stop.is_set():
            raise _Stopped()

    try:
        if stop is not None and stop.is_set():  # started after the run failed: write nothing
            raise _Stopped()
        return run_shard(job, tick=tick)
    except CliError as exc:
        return {"error": str(exc)}
    except _Stopped:
        return {"stopped": True}


@contextlib.contextmanager
def dask_client(scheduler: str | None, workers: int | None, device: str):
    """A ``distributed.Client``: to ``scheduler``, or to a local cluster of ``workers`` processes.

    ``--workers N`` starts ``LocalCUDACluster(n_workers=N)`` (one worker per
    GPU) when dask-cuda is installed, a GPU is visible and ``--device`` is
    not ``cpu``; otherwise ``LocalCluster(n_workers=N, processes=True,
    threads_per_worker=1)``: N worker processes, each running one shard at a
    time, started with SIGINT/SIGTERM blocked. Yields ``(client, threads)``:
    the host threads each task should use (the cores shared out between local
    workers; ``None`` for a scheduler). On the way out the local cluster is
    closed: its worker processes have ended when this returns.
    """
    distributed = import_distributed()
    import logging

    cluster = None
    threads = None
    stack = contextlib.ExitStack()
    try:
        if scheduler is not None:
            try:
                client = distributed.Client(scheduler, timeout="10s")
            except (OSError, TimeoutError, ValueError) as exc:
                raise CliError(f"cannot reach the Dask scheduler {scheduler!r}: "
                               f"{_one_line(exc)}") from None
        else:
            import dask

            # The nanny starts workers with MALLOC_TRIM_THRESHOLD_=65536 (to give memory back
            # to the OS): every tensor-sized buffer is then fresh pages, and a shard took 3.5x
            # as long as in this process (bench/NOTES.md). Whole tensors are gpuq's unit: off.
            environ = dict(dask.config.get("distributed.nanny.pre-spawn-environ", {}))
            environ.pop("MALLOC_TRIM_THRESHOLD_", None)
            stack.enter_context(dask.config.set(
                {"distributed.nanny.pre-spawn-environ": environ}))
            # A signal during the start would leave a half-made cluster that cannot be
            # closed: it is acted on once the cluster is whole (and its processes, and the
            # threads that restart them, have the signals blocked for good). The
            # multiprocessing resource tracker starts first: starting it unblocks them.
            from multiprocessing import resource_tracker

            resource_tracker.ensure_running()
            with held_signals():
                cluster = _local_cluster(distributed, workers, device, logging.ERROR)
                stack.callback(cluster.close)
            if not getattr(cluster, "gpu", False):
                threads = max(1, (os.cpu_count() or 1) // workers)
            client = distributed.Client(cluster)
        try:
            yield client, threads
        finally:
            client.close()
    finally:
        stack.close()


def _local_cluster(distributed, workers, device, log_level):
    if device != "cpu":
        from .env import cuda_unavailable_reason

        try:
            import dask_cuda
        except ImportError:
            dask_cuda = None
        if dask_cuda is not None and cuda_unavailable_reason() is None:
            cluster = dask_cuda.LocalCUDACluster(n_workers=workers, threads_per_worker=1,
                                                 dashboard_address=_HTTP, silence_logs=log_level)
            cluster.gpu = True
            return cluster
    # The workers' own log lines (a worker restarting after a crash) would break the
    # one-line error contract: errors only.
    return distributed.LocalCluster(n_workers=workers, processes=True, threads_per_worker=1,
                                    dashboard_address=_HTTP, silence_logs=log_level)


#: The scheduler's HTTP server (and dashboard, with bokeh) on any free local port: even with
#: ``dashboard_address=None`` it would take 8787 and warn when another cluster holds it.
_HTTP = "127.0.0.1:0"


def run_on_cluster(jobs: list, *, run: str, tensors: int, scheduler, workers, device: str,
                   progress, desc, warn=None) -> dict:
    """The shards of ``jobs`` as Dask tasks; returns ``{shard: result}`` once all succeeded.

    ``run`` names the run (its Dask keys, queue and stop event); ``tensors``
    is the bar's total. The first failure (or a signal) stops the run
    (module docstring) and raises; the caller then removes the run's files.
    """
    from .. import __version__
    from .convert import progress_bar

    distributed = import_distributed()
    with dask_client(scheduler, workers, device) as (client, threads):
        stop = distributed.Event(f"gpuq-stop-{run}", client=client)
        queue = distributed.Queue(f"gpuq-progress-{run}", client=client) if progress else None
        bar = progress_bar(tensors, progress, desc)
        futures = {}
        try:
            for i, job in enumerate(jobs):
                job = {**job, "gpuq_version": __version__, "threads": threads,
                       "stop": stop.name, "queue": queue.name if queue is not None else None}
                # pure=False and a run-unique key: a rerun must run again, not reuse a result.
                fut = client.submit(shard_task, job, key=f"gpuq-shard-{i}-{run}", pure=False,
                                    retries=RETRIES)
                futures[fut] = job["shard"]
            return _gather(futures, queue, bar, warn)
        except BaseException:
            _stop(distributed, stop, [f for f in futures if not f.done()])
            raise
        finally:
            bar.close()


def _gather(futures: dict, queue, bar, warn) -> dict:
    """Each task's result as it completes (progress from the queue meanwhile)."""
    results, seen, pending = {}, set(), set(futures)
    while pending:
        done = {f for f in pending if f.done()}
        if queue is not None:
            # Names written so far (a retried shard's are counted once).
            for shard, name in queue.get(batch=True):
                if (shard, name) not in seen:
                    seen.add((shard, name))
                    bar.update(1, name)
        if not done:
            time.sleep(0.05)
            continue
        for fut in done:
            pending.discard(fut)
            shard = futures[fut]
            result = results[shard] = _result(fut, shard)
            for line in result["warnings"]:
                if warn is not None:
                    warn(line)
            fresh = {(shard, row["name"]) for row in result["rows"]} - seen
            seen |= fresh
            bar.update(len(fresh))
    return results


def _stop(distributed, stop, running) -> None:
    """Tell every task of the run to stop, and wait (a while) for the running ones to end."""
    with contextlib.suppress(Exception):  # a scheduler gone too: nothing more to tell
        stop.set()
        distributed.wait(running, timeout=STOP_WAIT)


def _result(fut, shard) -> dict:
    try:
        result = fut.result()
    except Exception as exc:  # retries spent, or the worker died too often (KilledWorker)
        raise CliError(f"shard {shard!r} failed on the Dask cluster after {RETRIES} retries: "
                       f"{_one_line(exc)}") from None
    if "error" in result:
        raise CliError(result["error"])
    return result
