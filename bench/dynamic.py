"""Qparams from data: ``choose_qparams`` and ``quantize_dynamic`` against a static quantize.

Issue 5's speed targets are ratios to a static ``gpuq.quantize`` of the same
tensor with the same scheme (its qparams computed beforehand):
``quantize_dynamic`` per-tensor <= 2.2x, per-row (per-token) <= 1.3x. Each
scheme is timed three ways in one run, on the same input:

* ``static``: ``quantize(x, s, z, ...)`` with ``s, z`` from ``choose_qparams``;
* ``qparams``: ``choose_qparams(x, ...)`` alone;
* ``dynamic``: ``quantize_dynamic(x, ...)``, whose codes must equal static's.

GB/s counts the bytes of a quantize (float read + codes written) for all
three, so the column compares directly with the main table.
"""

from __future__ import annotations

import numpy as np

from .timing import CupyEvents, time_cpu, time_gpu

#: (label, shape for n elements, axis, group_size, target ratio of dynamic to static)
SCHEMES = (
    ("tensor", lambda n: (max(1, n // 1024), 1024), None, None, 2.2),
    ("row4096", lambda n: (max(1, n // 4096), 4096), 0, None, 1.3),
    ("group128", lambda n: (max(1, n // 4096), 4096), -1, 128, None),
)


def run_dynamic(size, *, device="cpu", reps=5, dtype="int8", log=print):
    """One row per (scheme, way); see the module docstring."""
    import gpuq

    rows = []
    for label, shape_of, axis, group, target in SCHEMES:
        shape = shape_of(size)
        x = np.random.default_rng(0).standard_normal(size=shape, dtype=np.float32)
        if device == "cuda":
            import cupy as cp

            x = cp.asarray(x)
            events = CupyEvents(cp)
            timer = lambda run: time_gpu(run, events, reps=reps)  # noqa: E731
            to_host = cp.asnumpy
        else:
            timer = lambda run: time_cpu(run, reps=reps, warmup=1)  # noqa: E731
            to_host = np.asarray
        kw = {"axis": axis, "group_size": group, "dtype": dtype}
        s, z = gpuq.choose_qparams(x, **kw)
        ways = {
            "static": lambda i: gpuq.quantize(x, s, z, check_values=False, **kw),
            "qparams": lambda i: gpuq.choose_qparams(x, **kw),
            "dynamic": lambda i: gpuq.quantize_dynamic(x, **kw),
        }
        static_codes = to_host(ways["static"](0))
        dynamic_codes = to_host(ways["dynamic"](0)[0])
        mismatches = int(np.count_nonzero(static_codes != dynamic_codes))
        times = {way: timer(run) for way, run in ways.items()}
        nbytes = x.size * (4 + 1)
        for way, t in times.items():
            ratio = t["median_s"] / times["static"]["median_s"]
            row = {"scheme": label, "way": way, "shape": list(shape), "numel": int(x.size),
                   "median_s": t["median_s"], "min_s": t["min_s"], "max_s": t["max_s"],
                   "gbps": nbytes / t["median_s"] / 1e9, "ratio_to_static": ratio,
                   "target": target if way == "dynamic" else None,
                   "mismatches": mismatches if way == "dynamic" else None}
            rows.append(row)
            log(f"  dyn/{label:<9} {way:<8} {t['median_s'] * 1e3:9.3f} ms  x{ratio:.2f} of static")
    return rows


def table(rows) -> str:
    """A terminal table of :func:`run_dynamic`'s rows."""
    lines = ["", "qparams from data (ratio = time / static quantize of the same tensor)",
             f"{'scheme':<10} {'way':<8} {'ms':>9} {'GB/s':>7} {'ratio':>6} {'target':>7} {'mism':>5}"]
    for r in rows:
        target = f"<={r['target']}" if r["target"] else ""
        mism = "" if r["mismatches"] is None else str(r["mismatches"])
        lines.append(f"{r['scheme']:<10} {r['way']:<8} {r['median_s'] * 1e3:9.3f} {r['gbps']:7.2f} "
                     f"{r['ratio_to_static']:6.2f} {target:>7} {mism:>5}")
    return "\n".join(lines)
