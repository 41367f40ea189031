"""The MSE search for scales on the host (issue 30): ``choose_qparams(..., method="mse")`` against
the min/max ``choose_qparams`` of the same tensor.

Case: a ``(4096, 4096)`` float32 weight (Student-t(4), the heavy tails the search is for), int4
groups of 128 along the last axis, asymmetric (``dtype="int4", axis=1, group_size=128``).
Issue 30's target: ``mse / minmax <= 25`` with the compiled loops (numba) on 2 threads (20
candidates, each a fake-quantization pass over data already in cache).

Calls alternate round by round (minmax, mse, minmax, ...) so the machine's drift falls on both;
the median of ``--reps`` rounds is reported, with the input GB/s and the SQNR of the int4
round trip under each method. Before timing, the numba result is compared bit for bit with the
NumPy ufunc loops' on the first ``--check-rows`` rows (``bits``).

    python -m bench.mse                        # 2 threads, (4096, 4096) (~30 s on 2 cores)
    python -m bench.mse --threads 1 --reps 5 --json /tmp/mse.json
    python -m bench.mse --shape 512x4096       # a quick look
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gpuq  # noqa: E402

TARGET = 25.0
KW = dict(axis=1, group_size=128, dtype="int4")


def sqnr_db(x, scales, zps) -> float:
    """SQNR of the int4 round trip with these parameters (float64 sums)."""
    y = gpuq.dequantize(gpuq.quantize(x, scales, zps, **KW), scales, zps, axis=1, group_size=128)
    x64 = x.astype(np.float64)
    return float(10 * np.log10((x64 ** 2).sum() / ((x64 - y) ** 2).sum()))


def check_bits(x, rows) -> str:
    """The compiled loops' parameters against the NumPy ufunc loops' on the first ``rows`` rows."""
    got = gpuq.choose_qparams(x[:rows], method="mse", **KW)
    before = gpuq.set_host_kernels("numpy")
    try:
        want = gpuq.choose_qparams(x[:rows], method="mse", **KW)
    finally:
        gpuq.set_host_kernels(before)
    same = all(np.array_equal(np.asarray(g).view(np.uint8), np.asarray(w).view(np.uint8)) for g, w in zip(got, want))
    return "ok" if same else "FAIL"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="4096x4096", help="ROWSxCOLS (COLS a multiple of 128)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--check-rows", type=int, default=32)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    rows, cols = (int(v) for v in args.shape.lower().split("x"))
    gpuq.set_num_threads(args.threads)
    x = (np.random.default_rng(0).standard_t(4, (rows, cols)) * 0.02).astype(np.float32)
    meta = {"shape": [rows, cols], "threads": args.threads, "host_loops": gpuq.get_host_kernels(),
            "reps": args.reps, "gpuq": gpuq.__version__}
    bits = check_bits(x, min(rows, args.check_rows))
    times = {"minmax": [], "mse": []}
    results = {}
    for m in times:  # warm-up: numba compiles (or loads its cache) once
        results[m] = gpuq.choose_qparams(x, method=m, **KW)
    for _ in range(args.reps):
        for m in times:
            t = time.perf_counter()
            gpuq.choose_qparams(x, method=m, **KW)
            times[m].append(time.perf_counter() - t)
    med = {m: statistics.median(v) for m, v in times.items()}
    row = {"case": f"f32 {rows}x{cols} int4 g128", "bits": bits,
           "minmax_ms": med["minmax"] * 1e3, "mse_ms": med["mse"] * 1e3,
           "minmax_gbps": x.nbytes / med["minmax"] / 1e9, "mse_gbps": x.nbytes / med["mse"] / 1e9,
           "ratio": med["mse"] / med["minmax"], "target": TARGET,
           "sqnr_minmax_db": sqnr_db(x, *results["minmax"]), "sqnr_mse_db": sqnr_db(x, *results["mse"])}
    print(f"# {meta['host_loops']} loops, {args.threads} threads, median of {args.reps} interleaved rounds")
    print(f"{row['case']}: bits {bits}; minmax {row['minmax_ms']:.1f} ms ({row['minmax_gbps']:.2f} GB/s), "
          f"mse {row['mse_ms']:.1f} ms ({row['mse_gbps']:.2f} GB/s): x{row['ratio']:.1f} "
          f"(target <= {TARGET:g}); SQNR {row['sqnr_minmax_db']:.2f} -> {row['sqnr_mse_db']:.2f} dB")
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "rows": [row]}, indent=1) + "\n")
    return 0 if bits == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
