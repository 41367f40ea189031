"""fp4 and MX scales on the host (issue 37): ratios against packed int4 with the same block.

Cases, float32 ``(4096, 4096)``, groups of 32 along the last axis (``axis=1, group_size=32``):

* ``quantize`` and ``dequantize`` with given float32 scales: ``float4_e2m1fn`` against ``int4``
  (symmetric, no zero points), both packed two codes a byte;
* ``choose_qparams``: MX (``dtype="float4_e2m1fn", scale_dtype="float8_e8m0fnu"``, each rule)
  and NVFP4 (``gpuq.global_scale`` plus g16 ``scale_dtype="float8_e4m3fn"``) against min/max
  ``int4`` symmetric g32.

Calls are interleaved round by round so the machine's drift falls on all alike; the median of
``--reps`` rounds is reported with the ratio. Issue 37's targets: fp4 quantize/dequantize within
1.3x of int4; MX choose_qparams within 1.5x of min/max int4 g32; NVFP4 within 2.5x of it.

    python -m bench.fp4                    # 2 threads (~30 s on 2 cores)
    python -m bench.fp4 --shape 1024x1024 --reps 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gpuq  # noqa: E402

TARGETS = {"quantize": 1.3, "dequantize": 1.3, "choose_qparams": 1.5, "nvfp4": 2.5}
G = dict(axis=1, group_size=32)


def cases(x):
    """``{op: {name: zero-argument callable}}``; the first name of each op is the baseline."""
    s4, _ = gpuq.choose_qparams(x, dtype="int4", symmetric=True, **G)
    s_fp4, _ = gpuq.choose_qparams(x, dtype="float4_e2m1fn", **G)
    q4 = gpuq.quantize(x, s4, dtype="int4", **G)
    qf = gpuq.quantize(x, s_fp4, dtype="float4_e2m1fn", **G)
    out = {
        "quantize": {"int4": lambda: gpuq.quantize(x, s4, dtype="int4", **G),
                     "fp4": lambda: gpuq.quantize(x, s_fp4, dtype="float4_e2m1fn", **G)},
        "dequantize": {"int4": lambda: gpuq.dequantize(q4, s4, **G),
                       "fp4": lambda: gpuq.dequantize(qf, s_fp4, **G)},
        "choose_qparams": {"int4": lambda: gpuq.choose_qparams(x, dtype="int4", symmetric=True, **G)},
    }
    for rule in ("floor", "even", "ceil", "rceil"):
        out["choose_qparams"][f"mx-{rule}"] = (
            lambda r=rule: gpuq.choose_qparams(x, dtype="float4_e2m1fn", scale_dtype="float8_e8m0fnu",
                                               scale_rule=r, **G))
    # NVFP4: two passes (the tensor's amax for the global scale, then the g16 blocks).
    out["choose_qparams"]["nvfp4"] = lambda: gpuq.choose_qparams(
        x, dtype="float4_e2m1fn", axis=1, group_size=16, scale_dtype="float8_e4m3fn",
        global_scale=gpuq.global_scale(x))
    return out


def run(shape, reps, threads):
    """Median seconds of each case and its ratio to the op's baseline, printed as a table."""
    gpuq.set_num_threads(threads)
    x = (np.random.default_rng(0).standard_normal(shape) * 2).astype(np.float32)
    table = cases(x)
    rows = []
    for op, fns in table.items():
        for fn in fns.values():
            fn()  # compile and warm
        times = {name: [] for name in fns}
        for _ in range(reps):
            for name, fn in fns.items():
                t = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t)
        base = statistics.median(times[next(iter(fns))])
        for name, ts in times.items():
            med = statistics.median(ts)
            rows.append((op, name, med * 1e3, med / base))
    print(f"shape {shape[0]}x{shape[1]} float32, g32 along the last axis, {threads} threads, median of {reps}")
    print(f"{'op':16} {'case':10} {'ms':>9} {'ratio':>6}  target")
    for op, name, ms, ratio in rows:
        print(f"{op:16} {name:10} {ms:9.2f} {ratio:6.2f}  {'<= %.1f' % TARGETS.get(name, TARGETS[op]) if ratio != 1 else 'base'}")
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="4096x4096")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)
    run(tuple(int(v) for v in a.shape.split("x")), a.reps, a.threads)


if __name__ == "__main__":
    main()
