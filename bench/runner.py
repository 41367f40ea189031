"""Run every contender on every case and collect one row per (case, contender).

A row holds the timing summary, the effective GB/s (bytes read + written
over the median time), % of the copy limit measured in the same run, the
ratio to the best peer (best peer median / this median: above 1 is faster
than every peer), and the mismatch count of the contender's output against
gpuq's (exact comparison; peers round differently, so this is reported, not
hidden).
"""

from __future__ import annotations

import gc
import math
import sys

import numpy as np

from . import data
from .contenders import GpuqFresh, GpuqOut, NotApplicable
from .timing import CupyEvents, TorchEvents, time_cpu, time_gpu, time_gpu_wall

#: GPU: rotate inputs until one rotation holds at least this many bytes (2x a 50 MB L2).
GPU_ROTATE_BYTES = 100 << 20


def compare(ref: np.ndarray, got) -> dict:
    """Exact mismatch count (NaN == NaN) and the largest absolute difference."""
    got = np.asarray(got).reshape(ref.shape)
    if got.dtype != ref.dtype:
        return {"mismatches": int(ref.size), "mismatch_max": None,
                "mismatch_note": f"dtype {got.dtype} != {ref.dtype}"}
    diff = ref != got
    if ref.dtype.kind == "f":
        diff &= ~(np.isnan(ref) & np.isnan(got))
    n = int(np.count_nonzero(diff))
    mx = float(np.max(np.abs(ref[diff].astype(np.float64) - got[diff].astype(np.float64)))) if n else 0.0
    return {"mismatches": n, "mismatch_max": mx}


def _row(case, contender, copy_gbps):
    return {
        "case": case.name, "op": case.op, "scheme": case.scheme, "channels": case.channels,
        "shape": list(case.shape()), "fdtype": case.fdtype, "qdtype": case.qdtype,
        "zps": case.zps, "latency": case.latency, "numel": case.numel(), "bytes": case.bytes_moved(),
        "contender": contender.name, "peer": contender.is_peer, "copy_gbps": copy_gbps,
    }


def _fill(row, t, case, copy_gbps):
    row.update(t)
    row["status"] = "ok"
    row["gbps"] = case.bytes_moved() / t["median_s"] / 1e9
    row["pct_copy"] = 100.0 * row["gbps"] / copy_gbps if copy_gbps else None
    row["us_per_call"] = t["median_s"] * 1e6


def _finish_case(rows):
    peers = [r for r in rows if r["peer"] and r["status"] == "ok"]
    best = min(peers, key=lambda r: r["median_s"]) if peers else None
    for r in rows:
        r["best_peer"] = best["contender"] if best else None
        ok = best is not None and r["status"] == "ok"
        r["ratio_to_best_peer"] = best["median_s"] / r["median_s"] if ok else None
    return rows


def run_case(case, contenders, inputs, scales, zps, ref, timer, copy_gbps, log):
    """Time each contender on one case; ``timer(contender, run)`` returns a summary."""
    rows = []
    for c in contenders:
        row = _row(case, c, copy_gbps)
        try:
            prep = c.prepare(case, inputs, scales, zps)
            t = timer(c, prep.run)
            _fill(row, t, case, copy_gbps)
            row.update(compare(ref, prep.fetch(prep.run(0))))
        except NotApplicable as exc:
            row.update(status=f"n/a: {exc}", mismatches=None)
        except Exception as exc:  # a peer's failure is a result, not a crash
            row.update(status=f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}",
                       mismatches=None)
        rows.append(row)
        prep = None
        gc.collect()
        log(_progress(row))
    return _finish_case(rows)


def _progress(row):
    if row["status"] != "ok":
        return f"  {row['case']:<34} {row['contender']:<17} {row['status']}"
    return (f"  {row['case']:<34} {row['contender']:<17} {row['median_s'] * 1e3:9.3f} ms "
            f"{row['gbps']:7.2f} GB/s  mism={row['mismatches']}")


def run_cpu(cases, peers, threads, copy_gbps, *, reps=5, latency_inner=200, log=print):
    """All cases on host arrays; every contender at ``threads`` threads."""
    import gpuq

    gpuq.set_num_threads(threads)
    contenders = [GpuqFresh(), GpuqOut()] + list(peers)
    rows = []
    for case in cases:
        x = data.host_input(case)
        scales, zps = data.host_params(case)
        fn = gpuq.quantize if case.op == "quantize" else gpuq.dequantize
        ref = fn(x, scales, zps, **data.gpuq_kwargs(case))
        if case.latency:
            timer = lambda c, run: time_cpu(run, reps=reps * 3, warmup=20, inner=latency_inner)  # noqa: E731
        else:
            timer = lambda c, run: time_cpu(run, reps=reps, warmup=1)  # noqa: E731
        rows += run_case(case, contenders, [x], scales, zps, ref, timer, copy_gbps, log)
        del x, ref
        gc.collect()
    return rows


def run_gpu(cases, peers, copy_gbps, *, reps=50, log=print):
    """All cases on CuPy arrays (inputs rotated past L2), CUDA-event timing."""
    import cupy as cp

    import gpuq

    cupy_ev = CupyEvents(cp)
    torch_ev = None
    if any(getattr(p, "timer", "cupy") == "torch" for p in peers):
        import torch

        torch_ev = TorchEvents(torch)
    to_host = cp.asnumpy
    contenders = [GpuqFresh(to_host=to_host, to_device=cp.asarray),
                   GpuqOut(empty=cp.empty, to_host=to_host, to_device=cp.asarray)] + list(peers)
    rows = []
    for case in cases:
        in_bytes = case.numel() * np.dtype(case.fdtype if case.op == "quantize" else case.qdtype).itemsize
        nbuf = 1 if case.latency else max(1, min(16, math.ceil(GPU_ROTATE_BYTES / max(1, in_bytes))))
        inputs = [data.device_input(case, cp, seed=k) for k in range(nbuf)]
        scales, zps = data.host_params(case)
        fn = gpuq.quantize if case.op == "quantize" else gpuq.dequantize
        ref = cp.asnumpy(fn(inputs[0], scales, zps, **data.gpuq_kwargs(case)))

        def timer(c, run, case=case):
            ev = torch_ev if getattr(c, "timer", "cupy") == "torch" else cupy_ev
            if case.latency:
                return time_gpu_wall(run, ev)
            return time_gpu(run, ev, reps=reps)

        rows += run_case(case, contenders, inputs, scales, zps, ref, timer, copy_gbps, log)
        del inputs, ref
        cp.get_default_memory_pool().free_all_blocks()
    return rows


def log_stderr(msg):
    print(msg, file=sys.stderr, flush=True)
