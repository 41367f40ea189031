"""Sharded safetensors checkpoints, on this machine or as tasks on a Dask cluster.

A sharded checkpoint is a folder of ``.safetensors`` shards plus an index,
``model.safetensors.index.json`` (Hugging Face's layout)::

    {"metadata": {"total_size": 123456}, "weight_map": {"lm_head.weight": "model-00002-of-00002.safetensors", ...}}

IN is the folder (holding exactly one ``*.safetensors.index.json``) or the
index file itself. Before any work every shard's header is read and held to
the index: each shard named in the ``weight_map`` exists and is a plain file
name beside the index, each tensor is listed once, its shard holds it, and
each shard holds nothing the ``weight_map`` does not put there. A mismatch is
one ``gpuq: error:`` line, exit 2, nothing written.

**Output layout.** OUT is a folder (created if missing; its parent must
exist). Each input shard gives one output shard of the same file name, and
the index keeps the input index's file name. An output shard is byte for
byte the file that ``gpuq quantize SHARD -o OUT/SHARD`` (or ``dequantize``)
writes with the same options: the same per-file code
(:func:`gpuq.cli.convert.quantize_file`) writes it, with the tensor selection
made once over the whole model (the ``--include``/``--exclude`` patterns must
match somewhere in the model, not in every shard; a shard with no tensor to
quantize is copied, with an empty gpuq table). Every quantized shard carries
its own gpuq metadata, so it is checked and dequantized on its own too. The
index's ``weight_map`` lists every output tensor (``NAME.scales`` and
``NAME.zps`` beside their codes) sorted by name, and ``metadata`` is the
input's with ``total_size`` recomputed (the bytes of tensor data).

**Atomicity.** Each shard is written to a temporary file beside it and
renamed when complete (:func:`gpuq.cli.files.atomic_output`); the index is
written the same way, last, after every shard has succeeded. An index left
in OUT by an earlier run is removed before the first shard is written. So an
interrupted or failed run never leaves an index in OUT, and never one that
names a missing or partial shard; the shards this run completed are removed
on the way out (best effort on a cluster: a task already running when
another failed may still finish its shard afterwards, which no index names).

**On a cluster** (:func:`run_on_cluster`; ``--scheduler ADDRESS`` or
``--workers N``): one Dask task per shard, submitted with ``retries=`` so a
task that raises is run again, and Dask reschedules the tasks of a worker
that dies. A task opens its input shard, quantizes whole tensors on its
worker (``--device auto``: that worker's GPU when it has one) and writes its
output shard itself into OUT: IN and OUT must be on a filesystem that the
client and every worker see at the same paths (the local disk, for
``--workers``). Workers must be able to import gpuq (the same version: a task
checks). A user error on a worker (a NaN tensor under ``--nonfinite error``)
comes back as a value, not an exception, so Dask does not retry what would
fail the same way again. The task returns its report rows; the client
gathers them into the one report table. Progress crosses processes through a
``distributed.Queue``: a task puts each tensor's name when it is written, the
client advances one bar over all tensors (a retried shard's tensors are
counted once).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import time

from .files import Checkpoint, CliError, _one_line, _remove, atomic_output
from .report import natural_key

INDEX_SUFFIX = ".safetensors.index.json"
#: What ``pip`` needs for ``--scheduler``/``--workers``.
DASK_HINT = "pip install 'gpuq[dask]'"
#: How often a task that raises (not a user error) is run again.
RETRIES = 2


def is_sharded(path: str) -> bool:
    """Whether IN names a sharded checkpoint: a folder, or an ``*.index.json`` file.

    >>> is_sharded("model.safetensors.index.json"), is_sharded("model.safetensors")
    (True, False)
    """
    return os.path.isdir(path) or path.endswith(".index.json")


def _dup_keys(pairs):
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        dup = next(k for k in keys if keys.count(k) > 1)
        raise _Duplicate(dup)
    return dict(pairs)


class _Duplicate(ValueError):
    pass


class ShardedCheckpoint:
    """A sharded checkpoint's index, checked against the headers of its shards.

    ``folder``, ``index_name`` (the index's file name), ``metadata`` (the
    index's, a dict), ``shards`` (shard file names, sorted), ``tensors``
    (shard -> tensor names, in file order) and ``specs`` (name -> (shape,
    dtype) over the whole model). ``metas`` maps each shard to its gpuq
    metadata (``None`` when it has none). No tensor data is read.
    """

    def __init__(self, path: str):
        self.path = path
        if os.path.isdir(path):
            found = sorted(f for f in os.listdir(path) if f.endswith(INDEX_SUFFIX))
            if len(found) != 1:
                why = "none" if not found else f"{len(found)}: {', '.join(found)}"
                raise CliError(f"IN {path!r} is a folder, so it must hold exactly one "
                               f"*{INDEX_SUFFIX} ({why}); pass the index or a .safetensors file")
            self.folder, self.index_name = path, found[0]
        else:
            if not os.path.isfile(path):
                raise CliError(f"cannot read IN {path!r}: no such file")
            self.folder, self.index_name = os.path.dirname(path) or ".", os.path.basename(path)
        index_path = os.path.join(self.folder, self.index_name)
        self.index_path = index_path

        def bad(why):
            return CliError(f"cannot read index {index_path!r}: {why}")

        try:
            with open(index_path, "rb") as fh:
                index = json.loads(fh.read().decode("utf-8"), object_pairs_hook=_dup_keys)
        except _Duplicate as exc:
            raise bad(f"{exc.args[0]!r} is listed twice (a tensor may be in the weight_map "
                      f"once)") from None
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise bad(f"not a UTF-8 JSON file ({_one_line(exc)})") from None
        if not isinstance(index, dict) or not isinstance(index.get("weight_map"), dict):
            raise bad("it has no 'weight_map' object")
        weight_map = index["weight_map"]
        if not weight_map:
            raise bad("its weight_map is empty")
        metadata = index.get("metadata", {})
        if not isinstance(metadata, dict):
            raise bad(f"its 'metadata' is {type(metadata).__name__}, not an object")
        self.metadata = metadata
        for name, shard in weight_map.items():
            # Plain file names only: an output shard goes to OUT under the same name, so a
            # path ('../x', '/etc/x') would write outside OUT.
            if (not isinstance(shard, str) or not shard.endswith(".safetensors")
                    or os.path.basename(shard) != shard or shard.startswith(".")
                    or "\\" in shard):
                raise bad(f"tensor {name!r} maps to {shard!r}, not a .safetensors file name "
                          f"beside the index")
        self.shards = sorted(set(weight_map.values()), key=natural_key)
        self.tensors, self.specs, self.metas, self.extra = {}, {}, {}, {}
        for shard in self.shards:
            shard_path = os.path.join(self.folder, shard)
            if not os.path.isfile(shard_path):
                raise bad(f"shard {shard!r} named in the weight_map does not exist")
            with Checkpoint(shard_path) as ckpt:
                names = ckpt.names
                for name in names:
                    where = weight_map.get(name)
                    if where is None:
                        raise bad(f"shard {shard!r} holds tensor {name!r}, which is not in the "
                                  f"weight_map")
                    if where != shard:
                        raise bad(f"shard {shard!r} holds tensor {name!r}, which the weight_map "
                                  f"puts in {where!r}")
                    self.specs[name] = ckpt.spec(name)
                self.tensors[shard] = names
                self.metas[shard] = ckpt.meta
        missing = [n for n, s in weight_map.items() if n not in self.specs]
        if missing:
            name = sorted(missing, key=natural_key)[0]
            raise bad(f"the weight_map puts tensor {name!r} in shard {weight_map[name]!r}, "
                      f"which does not hold it")

    def shard_path(self, shard: str) -> str:
        return os.path.join(self.folder, shard)


# -- the output folder -----------------------------------------------------------------

def prepare_output(out: str, src: ShardedCheckpoint) -> bool:
    """Check OUT (a folder), create it if missing, drop a stale index; True if created here."""
    if os.path.splitext(out)[1].lower() in (".safetensors", ".npz", ".npy", ".json"):
        raise CliError(f"OUT {out!r} must be a folder for a sharded IN (its shards and "
                       f"{src.index_name} go there), not a file name")
    if os.path.exists(out) and not os.path.isdir(out):
        raise CliError(f"cannot write OUT {out!r}: it is a file; a sharded IN needs a folder")
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        raise CliError(f"cannot write OUT {out!r}: directory {parent!r} does not exist")
    created = False
    if not os.path.isdir(out):
        try:
            os.mkdir(out)
        except OSError as exc:
            raise CliError(f"cannot write OUT {out!r}: {_one_line(exc)}") from exc
        created = True
    elif os.path.samefile(out, src.folder):
        raise CliError(f"OUT {out!r} is the input folder; write to a new folder")
    if not os.access(out, os.W_OK | os.X_OK):
        raise CliError(f"cannot write OUT {out!r}: the folder is not writable")
    # An earlier run's index would name shards this run is about to replace: it goes first,
    # so a failure from here on leaves no index at all.
    stale = os.path.join(out, src.index_name)
    if os.path.lexists(stale):
        try:
            os.unlink(stale)
        except OSError as exc:
            raise CliError(f"cannot write OUT {out!r}: cannot remove the old index "
                           f"({_one_line(exc)})") from exc
    return created


def write_index(out: str, src: ShardedCheckpoint, shard_entries: dict) -> str:
    """Write OUT's index (atomically) from ``{shard: {name: nbytes}}``; return its path."""
    weight_map, total = {}, 0
    for shard, entries in shard_entries.items():
        for name, nbytes in entries.items():
            weight_map[name] = shard
            total += nbytes
    index = {"metadata": {**src.metadata, "total_size": total},
             "weight_map": {n: weight_map[n] for n in sorted(weight_map)}}
    path = os.path.join(out, src.index_name)
    with atomic_output(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(index, indent=2, ensure_ascii=False) + "\n")
    return path


def output_shard_entries(path: str) -> dict:
    """``{name: nbytes}`` of a written shard (its header only)."""
    with Checkpoint(path) as ckpt:
        return {n: ckpt.nbytes(n) for n in ckpt.names}


def _clean_up(out: str, written, created: bool) -> None:
    """After a failure: remove the shards this run completed (and OUT if it made it, empty)."""
    for shard in written:
        _remove(os.path.join(out, shard))
    if created:
        with contextlib.suppress(OSError):
            os.rmdir(out)


def _remove_orphans(out: str, shards) -> None:
    # A worker killed mid-shard cannot remove its temporary file (atomic_output names it
    # '.SHARD.PID.TOKEN.tmp'); once every shard is complete no attempt is still writing.
    wanted = {f".{s}." for s in shards}
    for f in os.listdir(out):
        if f.endswith(".tmp") and any(f.startswith(w) for w in wanted):
            _remove(os.path.join(out, f))


# -- one shard: the same work here and on a worker ---------------------------------------

def shard_job(src: ShardedCheckpoint, shard: str, out: str, command: str, **options) -> dict:
    """What a shard task needs: plain values only (it is pickled to the worker)."""
    return {"command": command, "in_path": os.path.abspath(src.shard_path(shard)),
            "out_path": os.path.abspath(os.path.join(out, shard)), "shard": shard, **options}


def run_shard(job: dict, device=None, tick=None) -> dict:
    """Convert one shard as ``job`` says; return ``{"rows", "warnings", "entries", "device"}``.

    ``device`` is picked here from ``job["device"]`` when not given (on a
    worker: that worker's GPU under ``auto``). A user error raises CliError.
    """
    from .convert import dequantize_file, quantize_file
    from .env import pick_device

    device = device or pick_device(job["device"])
    warnings = []
    with Checkpoint(job["in_path"]) as ckpt:
        if job["command"] == "quantize":
            schemes = {n: job["schemes"][n] for n in ckpt.names if n in job["schemes"]}
            rows = quantize_file(ckpt, job["out_path"], "safetensors", schemes, device=device,
                                 nonfinite=job["nonfinite"], warn=warnings.append, tick=tick)
        else:
            from .convert import check_quantized

            schemes = check_quantized(ckpt)
            rows = dequantize_file(ckpt, job["out_path"], "safetensors", schemes,
                                   dtype=job["dtype"], device=device, tick=tick)
    return {"rows": rows, "warnings": warnings, "device": device.name,
            "entries": output_shard_entries(job["out_path"])}


def shard_task(job: dict) -> dict:
    """A shard as a Dask task: :func:`run_shard` on the worker, user errors as a value.

    A CliError (bad data, ``--device cuda`` on a worker without a GPU) would
    fail again on a retry, so it is returned as ``{"error": text}``; anything
    else (a crash, an I/O error) raises, and Dask retries it.
    """
    from .. import __version__, set_num_threads

    if job.get("gpuq_version") not in (None, __version__):
        return {"error": f"a worker has gpuq {__version__}, the client {job['gpuq_version']}: "
                         f"install the same gpuq on every worker"}
    if job.get("threads"):
        set_num_threads(job["threads"])
    tick = None
    if job.get("queue"):
        from distributed import Queue

        queue = Queue(job["queue"])

        def tick(name):
            queue.put([job["shard"], name])
    try:
        return run_shard(job, tick=tick)
    except CliError as exc:
        return {"error": str(exc)}


# -- the runs --------------------------------------------------------------------------

def run_local(src: ShardedCheckpoint, out: str, jobs: list, *, device, progress, desc,
              warn=None) -> tuple:
    """The shards one after the other in this process; returns (rows, {shard: entries})."""
    from .convert import progress_bar

    created = prepare_output(out, src)
    bar = progress_bar(sum(len(src.tensors[j["shard"]]) for j in jobs), progress, desc)
    written, rows, entries = [], [], {}
    try:
        for job in jobs:
            result = run_shard(job, device=device, tick=lambda name: bar.update(1))
            written.append(job["shard"])
            rows += result["rows"]
            entries[job["shard"]] = result["entries"]
            for line in result["warnings"]:
                if warn is not None:
                    warn(line)
        write_index(out, src, entries)
    except BaseException:
        _clean_up(out, written, created)
        raise
    finally:
        bar.close()
    return rows, entries


def import_distributed():
    """``distributed``, or the one-line error that says how to install it."""
    try:
        import dask  # noqa: F401
        import distributed
    except ImportError:
        raise CliError(f"--scheduler/--workers run on a Dask cluster, and Dask is not "
                       f"installed: {DASK_HINT}") from None
    return distributed


@contextlib.contextmanager
def dask_client(scheduler: str | None, workers: int | None, device: str):
    """A ``distributed.Client``: to ``scheduler``, or to a local cluster of ``workers`` processes.

    ``--workers N`` starts ``LocalCUDACluster(n_workers=N)`` (one worker per
    GPU) when dask-cuda is installed, a GPU is visible and ``--device`` is
    not ``cpu``; otherwise ``LocalCluster(n_workers=N, processes=True,
    threads_per_worker=1)``: N worker processes, each running one shard at a
    time. Yields ``(client, threads)``: the host threads each task should use
    (the cores shared out between local workers; ``None`` for a scheduler).
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
            cluster = _local_cluster(distributed, workers, device, logging.ERROR)
            if not getattr(cluster, "gpu", False):
                threads = max(1, (os.cpu_count() or 1) // workers)
            client = distributed.Client(cluster)
        try:
            yield client, threads
        finally:
            client.close()
    finally:
        if cluster is not None:
            cluster.close()
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


def run_on_cluster(src: ShardedCheckpoint, out: str, jobs: list, *, scheduler, workers,
                   device: str, progress, desc, warn=None) -> tuple:
    """The shards as Dask tasks; returns (rows, {shard: entries}, device names).

    The client submits every shard (``retries``: :data:`RETRIES`), gathers
    each result as it completes, and writes the index once all have
    succeeded. The first failure cancels the shards not yet done, removes
    the shards already written and raises one CliError.
    """
    from .. import __version__
    from .convert import progress_bar

    distributed = import_distributed()
    created = prepare_output(out, src)
    token = secrets.token_hex(6)
    bar = progress_bar(sum(len(src.tensors[j["shard"]]) for j in jobs), progress, desc)
    written, rows, entries, devices = [], [], {}, set()
    try:
        with dask_client(scheduler, workers, device) as (client, threads):
            queue = distributed.Queue(f"gpuq-progress-{token}", client=client) if progress else None
            futures = {}
            for i, job in enumerate(jobs):
                job = {**job, "gpuq_version": __version__, "threads": threads,
                       "queue": queue.name if queue is not None else None}
                # pure=False and a run-unique key: a rerun must run again, not reuse a result.
                fut = client.submit(shard_task, job, key=f"gpuq-shard-{i}-{token}", pure=False,
                                    retries=RETRIES)
                futures[fut] = job
            seen = set()
            pending = set(futures)
            try:
                while pending:
                    done = {f for f in pending if f.done()}
                    if queue is not None:
                        # Names written so far (a retried shard's are counted once).
                        for shard, name in queue.get(batch=True):
                            if (shard, name) not in seen:
                                seen.add((shard, name))
                                bar.update(1)
                    if not done:
                        time.sleep(0.05)
                        continue
                    for fut in done:
                        pending.discard(fut)
                        shard = futures[fut]["shard"]
                        result = _result(fut, shard)
                        written.append(shard)
                        rows += result["rows"]
                        entries[shard] = result["entries"]
                        devices.add(result["device"])
                        for line in result["warnings"]:
                            if warn is not None:
                                warn(line)
                        fresh = {(shard, n) for n in src.tensors[shard]} - seen
                        seen |= fresh
                        bar.update(len(fresh))
            except BaseException:
                client.cancel(list(pending))
                raise
        _remove_orphans(out, [j["shard"] for j in jobs])
        write_index(out, src, entries)
    except BaseException:
        _clean_up(out, written, created)
        raise
    finally:
        bar.close()
    return rows, entries, devices


def _result(fut, shard) -> dict:
    try:
        result = fut.result()
    except Exception as exc:  # retries spent, or the worker died too often (KilledWorker)
        raise CliError(f"shard {shard!r} failed on the Dask cluster after {RETRIES} retries: "
                       f"{_one_line(exc)}") from None
    if "error" in result:
        raise CliError(result["error"])
    return result


# -- the commands ----------------------------------------------------------------------

def run_sharded_quantize(in_path, out, plan, *, include=(), exclude=(), min_size, device,
                         progress=True, nonfinite="warn", warn=None, scheduler=None,
                         workers=None) -> dict:
    """``gpuq quantize`` of a sharded checkpoint into the folder ``out``; returns the report.

    ``device`` is the ``--device`` text (``"auto"``, ``"cpu"``, ``"cuda"``):
    picked here for a local run, on each worker for a cluster run.
    """
    from .convert import check_nonfinite, finish_report, plan_schemes

    check_nonfinite(nonfinite)
    src = ShardedCheckpoint(in_path)
    quantized = [s for s, m in src.metas.items() if m is not None]
    if quantized:
        raise CliError(f"IN {in_path!r} is already quantized by gpuq (shard {quantized[0]!r}); "
                       f"dequantize it first")
    schemes = plan_schemes(src.specs, plan, include=include, exclude=exclude, min_size=min_size)
    jobs = [shard_job(src, shard, out, "quantize", device=device, nonfinite=nonfinite,
                      schemes={n: schemes[n] for n in src.tensors[shard] if n in schemes})
            for shard in src.shards]
    return _run("quantize", src, in_path, out, jobs, device=device, progress=progress,
                warn=warn, scheduler=scheduler, workers=workers, finish=finish_report)


def run_sharded_dequantize(in_path, out, *, dtype, device, progress=True) -> dict:
    """``gpuq dequantize`` of a sharded quantized checkpoint into the folder ``out`` (locally).

    Every shard is checked against its own gpuq metadata before anything is written.
    """
    from .convert import check_quantized, finish_report

    src = ShardedCheckpoint(in_path)
    for shard in src.shards:
        with Checkpoint(src.shard_path(shard)) as ckpt:
            check_quantized(ckpt)
    jobs = [shard_job(src, shard, out, "dequantize", device=device, dtype=dtype)
            for shard in src.shards]
    return _run("dequantize", src, in_path, out, jobs, device=device, progress=progress,
                warn=None, scheduler=None, workers=None, finish=finish_report)


def _run(command, src, in_path, out, jobs, *, device, progress, warn, scheduler, workers,
         finish) -> dict:
    if scheduler is None and workers is None:
        from .env import pick_device

        dev = pick_device(device)
        rows, _ = run_local(src, out, jobs, device=dev, progress=progress, desc=command,
                            warn=warn)
        names = {dev.name}
    else:
        rows, _, names = run_on_cluster(src, out, jobs, scheduler=scheduler, workers=workers,
                                        device=device, progress=progress, desc=command,
                                        warn=warn)
    report = finish(command, in_path, out, "+".join(sorted(names)), rows)
    report["shards"] = len(src.shards)
    if scheduler is not None or workers is not None:
        report["cluster"] = {"scheduler": scheduler, "workers": workers}
    return report

