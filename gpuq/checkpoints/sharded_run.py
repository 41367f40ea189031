"""``gpuq quantize``/``dequantize`` of a sharded checkpoint: here, or on a Dask cluster.

The checkpoint and its index are checked first (:class:`gpuq.checkpoints.sharded.ShardedCheckpoint`),
the tensor selection is made once over the whole model, and for ``quantize``
every output shard's header is held to the safetensors limit before any work.
Then the shards run one after the other in this process (:func:`run_local`)
or as tasks on a cluster (:func:`gpuq.checkpoints.cluster.run_on_cluster`), each
writing its staged output shard; when all have succeeded the output folder
is committed (:meth:`gpuq.checkpoints.sharded.OutputFolder.commit`), and when any
fails, or a signal stops the run, the run's files are removed and OUT is as
it was.
"""

from __future__ import annotations

import os

from .files import Checkpoint, CliError, check_header_size, safetensors_layout
from .sharded import OutputFolder, ShardedCheckpoint, run_shard, shard_job


def run_local(jobs: list, *, device, progress, desc, tensors: int, warn=None) -> dict:
    """The shards of ``jobs`` one after the other in this process; ``{shard: result}``."""
    from .convert import progress_bar

    bar = progress_bar(tensors, progress, desc)
    results = {}
    try:
        for job in jobs:
            result = results[job["shard"]] = run_shard(job, device=device,
                                                       tick=lambda name: bar.update(1, name))
            for line in result["warnings"]:
                if warn is not None:
                    warn(line)
    finally:
        bar.close()
    return results


def run_sharded_quantize(in_path, out, plan, *, include=(), exclude=(), min_size, device,
                         progress=True, nonfinite="warn", warn=None, scheduler=None,
                         workers=None, calibrate="minmax") -> dict:
    """``gpuq quantize`` of a sharded checkpoint into the folder ``out``; returns the report.

    ``device`` is the ``--device`` text (``"auto"``, ``"cpu"``, ``"cuda"``):
    picked here for a local run, on each worker for a cluster run.
    """
    from .convert import check_nonfinite, plan_schemes, quantize_layout

    check_nonfinite(nonfinite)
    src = ShardedCheckpoint(in_path)
    quantized = [s for s, m in src.metas.items() if m is not None]
    if quantized:
        raise CliError(f"IN {in_path!r} is already quantized by gpuq (shard {quantized[0]!r}); "
                       f"dequantize it first")
    schemes = plan_schemes(src.specs, plan, include=include, exclude=exclude, min_size=min_size)
    by_shard = {shard: {n: schemes[n] for n in src.tensors[shard] if n in schemes}
                for shard in src.shards}
    for shard, shard_schemes in by_shard.items():  # a shard no reader could open: before any work
        entries, meta = quantize_layout({n: src.specs[n] for n in src.tensors[shard]},
                                        shard_schemes, "safetensors", "safetensors")
        header = safetensors_layout(entries, meta, src.extra[shard])[0]
        check_header_size(os.path.join(out, shard), header, entries)
    return _run("quantize", src, in_path, out, device=device, progress=progress, warn=warn,
                scheduler=scheduler, workers=workers,
                job=lambda shard, folder: shard_job(src, shard, folder, "quantize",
                                                    device=device, nonfinite=nonfinite,
                                                    schemes=by_shard[shard], calibrate=calibrate))


def run_sharded_dequantize(in_path, out, *, dtype, device, progress=True, nonfinite="warn", warn=None) -> dict:
    """``gpuq dequantize`` of a sharded quantized checkpoint into the folder ``out`` (locally).

    Every shard is checked against its own gpuq metadata before anything is written.
    """
    from .convert import check_quantized

    src = ShardedCheckpoint(in_path)
    for shard in src.shards:
        with Checkpoint(src.shard_path(shard)) as ckpt:
            check_quantized(ckpt)
    return _run("dequantize", src, in_path, out, device=device, progress=progress, warn=warn,
                scheduler=None, workers=None,
                job=lambda shard, folder: shard_job(src, shard, folder, "dequantize",
                                                    device=device, dtype=dtype, nonfinite=nonfinite))


def _run(command, src, in_path, out, *, device, progress, warn, scheduler, workers,
         job) -> dict:
    from .convert import finish_report

    local = scheduler is None and workers is None
    if local:
        from .env import pick_device

        dev = pick_device(device)
    folder = OutputFolder(out, src)
    jobs = [job(shard, folder) for shard in src.shards]
    tensors = sum(len(src.tensors[s]) for s in src.shards)
    try:
        if local:
            results = run_local(jobs, device=dev, progress=progress, desc=command,
                                tensors=tensors, warn=warn)
        else:
            from .cluster import run_on_cluster

            results = run_on_cluster(jobs, run=folder.run, tensors=tensors, scheduler=scheduler,
                                     workers=workers, device=device, progress=progress,
                                     desc=command, warn=warn)
        folder.commit({shard: results[shard]["entries"] for shard in src.shards})
    finally:
        # After a success: what a killed worker left; after a failure: everything of the run.
        folder.remove_own()
    rows = [row for shard in src.shards for row in results[shard]["rows"]]
    names = {results[shard]["device"] for shard in src.shards}
    report = finish_report(command, in_path, out, "+".join(sorted(names)), rows)
    report["shards"] = len(src.shards)
    if not local:
        report["cluster"] = {"scheduler": scheduler, "workers": workers}
    return report
