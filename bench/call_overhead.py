#!/usr/bin/env python3
"""What one gpuq call costs the host on the GPU path: the time between calls when the kernel
is too small to matter, and where it goes (cProfile).

The first device check timed f32->s8 per-channel at 256M elements at 0.373 ms a call where
the kernel alone runs 0.32 ms (ncu): back-to-back calls are held up by the host, not the GPU.
Here a small tensor (the kernel a few microseconds) is quantized many times with no
synchronisation between calls, so the mean time a call is the host's, for CuPy arrays and for
torch CUDA tensors, device scales with ``check_values=False`` (no value check: no sync), and a
host scalar; then the profile of the torch per-channel call, its top functions by own time.

    python3 bench/call_overhead.py [--calls 2000] [--top 25]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gpuq  # noqa: E402


def per_call_us(fn, calls, sync) -> float:
    for _ in range(20):
        fn()
    sync()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - t) / calls * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args(argv)
    import cupy
    import torch

    rows, cols = 64, 1024
    xt = torch.randn(rows, cols, device="cuda")
    st = xt.abs().amax(dim=1) / 127
    xc, sc = cupy.from_dlpack(xt), cupy.from_dlpack(st)
    qt = gpuq.quantize(xt, st, axis=0, check_values=False)
    qc = cupy.from_dlpack(qt)
    sync = torch.cuda.synchronize
    cases = {
        "torch quantize per-channel, device scales": lambda: gpuq.quantize(xt, st, axis=0, check_values=False),
        "torch quantize per-tensor, host scalar": lambda: gpuq.quantize(xt, 0.01),
        "torch dequantize per-channel": lambda: gpuq.dequantize(qt, st, axis=0, check_values=False),
        "torch quantize_dynamic per-row": lambda: gpuq.quantize_dynamic(xt, axis=0, symmetric=True),
        "cupy quantize per-channel, device scales": lambda: gpuq.quantize(xc, sc, axis=0, check_values=False),
        "cupy quantize per-tensor, host scalar": lambda: gpuq.quantize(xc, 0.01),
        "cupy dequantize per-channel": lambda: gpuq.dequantize(qc, sc, axis=0, check_values=False),
        "torch eager: round(x / s).clamp().to(int8)":
            lambda: torch.clamp(torch.round(xt / st[:, None]), -128, 127).to(torch.int8),
        "cupy: x * 2 (one CuPy kernel)": lambda: xc * 2,
    }
    for name, fn in cases.items():
        print(f"{per_call_us(fn, args.calls, sync):8.1f} us a call  {name}", flush=True)
    prof = cProfile.Profile()
    fn = cases["torch quantize per-channel, device scales"]
    prof.enable()
    for _ in range(args.calls):
        fn()
    prof.disable()
    sync()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(args.top)
    print(out.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
