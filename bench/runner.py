"""Run every contender on every case and collect one row per (case, contender).

A row holds the timing summary, the effective GB/s (bytes read + written
over the median time), % of the copy limit measured in the same run, the
ratio to the best peer (best peer median / this median: above 1 is faster
than every peer), and the mismatch count of the contender's output against
gpuq's (exact comparison; peers round differently, so this is reported, not
hidden).

``dynamic``/``qparams`` cases (issue 5) run ``gpuq`` (``quantize_dynamic`` or
``choose_qparams``), ``gpuq static`` (a static quantize of the same tensor,
same scheme) and the peers; every row of such a case also carries
``ratio_to_static`` (its median / the static median: the issue's ratio),
``ratio_to_static_min`` (min / min: less exposed to the page-fault lottery
of a fresh output on a noisy host) and
``target`` (the issue's bound for ``gpuq`` dynamic rows, else None). Their
outputs are dicts of parts (codes, scales, zps) compared part by part.
"""

from __future__ import annotations

import contextlib
import gc
import math
import sys

import numpy as np

from . import data
from .cases import DYNAMIC_OPS
from .contenders import GpuqFresh, GpuqOut, GpuqStatic, GpuqUfuncs, NotApplicable, OwnRows
from .timing import CupyEvents, TorchEvents, time_cpu, time_gpu, time_gpu_wall

#: GPU: rotate inputs until one rotation holds at least this many bytes (2x a 50 MB L2).
GPU_ROTATE_BYTES = 100 << 20
#: ... in at most this many buffers (1M int8 codes: 100 buffers of 1 MiB).
MAX_BUFFERS = 128


def compare(ref, got) -> dict:
    """Exact mismatch count (NaN == NaN) and the largest absolute difference.

    ``ref``/``got`` may be dicts of parts (``data.as_parts``): the parts ``got``
    has are compared, counts summed, and ``mismatch_parts`` says which differ.
    A part that one side has as None (no zps) and the other not counts whole.
    """
    if isinstance(ref, dict):
        total, mx, parts = 0, 0.0, {}
        for key, g in got.items():
            r = ref[key]
            if r is None or g is None:
                n = 0 if r is None and g is None else int(np.size(g if r is None else r))
                parts[key] = n
                total += n
                continue
            c = compare(np.asarray(r), g)
            parts[key] = c["mismatches"]
            total += c["mismatches"]
            if c.get("mismatch_max") is not None:
                mx = max(mx, c["mismatch_max"])
        return {"mismatches": total, "mismatch_max": mx, "mismatch_parts": parts}
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
        "dynamic": case.op in DYNAMIC_OPS,
        "target": case.target() if contender.name == "gpuq" else None,
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
    static = [r for r in rows if r["contender"] == GpuqStatic.name and r["status"] == "ok"]
    for r in rows:
        ok = static and r["status"] == "ok"
        r["ratio_to_static"] = r["median_s"] / static[0]["median_s"] if ok else None
        r["ratio_to_static_min"] = r["min_s"] / static[0]["min_s"] if ok else None
    return rows


def contenders_for(case, own, peers):
    """Who runs ``case``: gpuq's own rows (``contenders.OwnRows``) and the peers; issue-5 cases
    swap ``out=`` (which quantize_dynamic/choose_qparams lack) for the static quantize they are
    measured against. A peer with a ``covers(case)`` method is left out of cases it returns
    False for (ml_dtypes' fp8 casts outside the fp8 and int4 cases: no row at all, rather
    than an ``n/a`` row in every int8 case)."""
    return own.for_case(case) + [p for p in peers if getattr(p, "covers", lambda c: True)(case)]


def run_case(case, contenders, inputs, scales, zps, ref, timer, copy_gbps, log):
    """Time each contender on one case; ``timer(contender, run)`` returns a summary."""
    rows = []
    static_s = None
    for c in contenders:
        row = _row(case, c, copy_gbps)
        try:
            prep = c.prepare(case, inputs, scales, zps)
            # Checked before timing (the call doubles as a warm-up); a mismatch is reported, not hidden.
            checked = compare(ref, prep.fetch(prep.run(0)))
            t = timer(c, prep.run)
            _fill(row, t, case, copy_gbps)
            row.update(checked)
        except NotApplicable as exc:
            row.update(status=f"n/a: {exc}", mismatches=None)
        except Exception as exc:  # a peer's failure is a result, not a crash
            row.update(status=f"error: {_error_text(exc)}",
                       mismatches=None)
        rows.append(row)
        prep = None
        gc.collect()
        if row["status"] == "ok" and c.name == GpuqStatic.name:
            static_s = row["median_s"]
        if row["status"] == "ok" and static_s:
            row["ratio_to_static"] = row["median_s"] / static_s
        log(_progress(row))
    return _finish_case(rows)


def _progress(row):
    if row["status"] != "ok":
        return f"  {row['case']:<34} {row['contender']:<17} {row['status']}"
    extra = ""
    if row.get("ratio_to_static") is not None:
        extra = f"  x{row['ratio_to_static']:.2f} of static"
    return (f"  {row['case']:<34} {row['contender']:<17} {row['median_s'] * 1e3:9.3f} ms "
            f"{row['gbps']:7.2f} GB/s  mism={row['mismatches']}{extra}")


@contextlib.contextmanager
def _caller_heap_set_aside():
    """The ``gc.collect()`` between contenders is for what the runs leave behind; objects
    that existed before the bench started (a test session's heap: thousands of them, 50 ms a
    collection) are set aside with ``gc.freeze`` for its duration, then handed back."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def run_cpu(cases, peers, threads, copy_gbps, *, reps=5, latency_inner=200, log=print):
    """All cases on host arrays; every contender at ``threads`` threads.

    Where the compiled host kernels serve gpuq, a ``gpuq ufuncs out=`` row
    (the NumPy ufunc loops, same bits) runs beside them.
    """
    import gpuq

    gpuq.set_num_threads(threads)
    own = OwnRows(GpuqFresh(), GpuqOut(), GpuqStatic())
    if gpuq.get_host_kernels() == "numba":
        own.extra.append(GpuqUfuncs(own.out, "gpuq ufuncs out="))
        own.extra_dynamic.append(GpuqUfuncs(own.fresh, "gpuq ufuncs"))
    rows = []
    with _caller_heap_set_aside():
        for case in cases:
            contenders = contenders_for(case, own, peers)
            x = data.host_input(case)
            scales, zps = data.host_params_for(case)
            ref = data.reference(case, x, scales, zps)
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

    cupy_ev = CupyEvents(cp)
    torch_ev = None
    if any(getattr(p, "timer", "cupy") == "torch" for p in peers):
        import torch

        torch_ev = TorchEvents(torch)
    to_host = cp.asnumpy
    own = OwnRows(GpuqFresh(to_host=to_host, to_device=cp.asarray),
                  GpuqOut(empty=cp.empty, to_host=to_host, to_device=cp.asarray),
                  GpuqStatic(to_host=to_host, device=True))
    rows = []
    for case in cases:
        contenders = contenders_for(case, own, peers)
        in_bytes = case.numel() * data.input_dtype(case).itemsize
        # Enough buffers that one rotation holds GPU_ROTATE_BYTES: 1M-element cases need ~100.
        nbuf = 1 if case.latency else max(1, min(MAX_BUFFERS, math.ceil(GPU_ROTATE_BYTES / max(1, in_bytes))))
        try:
            inputs = [data.device_input(case, cp, seed=k) for k in range(nbuf)]
            scales, zps = data.host_params_for(case)
            ref = data.reference(case, inputs[0], scales, zps, to_host)
        except Exception as exc:  # a case that cannot be set up is a result; the run goes on
            rows += [_setup_error(case, c, copy_gbps, exc) for c in contenders]
            log(_progress(rows[-1]))
            cp.get_default_memory_pool().free_all_blocks()
            continue

        def timer(c, run, case=case):
            ev = torch_ev if getattr(c, "timer", "cupy") == "torch" else cupy_ev
            if case.latency:
                return time_gpu_wall(run, ev)
            return time_gpu(run, ev, reps=reps)

        rows += run_case(case, contenders, inputs, scales, zps, ref, timer, copy_gbps, log)
        del inputs, ref
        cp.get_default_memory_pool().free_all_blocks()
    return rows


def _error_text(exc) -> str:
    first = (str(exc).splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first[:160]}"


def _setup_error(case, contender, copy_gbps, exc):
    row = _row(case, contender, copy_gbps)
    row.update(status=f"error in setup: {_error_text(exc)}",
               mismatches=None, best_peer=None, ratio_to_best_peer=None, ratio_to_static=None,
               ratio_to_static_min=None)
    return row


def log_stderr(msg):
    print(msg, file=sys.stderr, flush=True)
