"""Command line: ``python -m bench`` from a repository checkout (``bench.main(argv)``)."""

from __future__ import annotations

import argparse
import os
import sys

from . import cases as C
from . import dynamic, limits, report, runner

DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
CPU_DEFAULT_SIZE = "64M"
GPU_DEFAULT_SIZES = "1M,16M,256M"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description="gpuq against the copy limit and its peers (onnxruntime, torch, NumPy/CuPy), "
                    "side by side in one run.")
    p.add_argument("--device", choices=("cpu", "cuda", "auto"), default="auto",
                   help="auto: cuda when CuPy sees a GPU, else cpu (default)")
    p.add_argument("--sizes", default=None,
                   help=f"element counts, comma-separated, K/M/G suffixes "
                        f"(default: cpu {CPU_DEFAULT_SIZE}, cuda {GPU_DEFAULT_SIZES})")
    p.add_argument("--quick", action="store_true",
                   help="a seconds-long smoke run: few cases at 256K elements, few repetitions")
    p.add_argument("--full", action="store_true",
                   help="CPU: the full case set (as on the GPU) instead of the CPU subset")
    p.add_argument("--cases", default=None,
                   help="keep only cases whose name contains one of these comma-separated strings "
                        "(e.g. 'q/tensor,dq/last')")
    p.add_argument("--out", default=DEFAULT_OUT, help="output folder (default bench/results)")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads for every contender (default: the CPUs this process may use)")
    p.add_argument("--reps", type=int, default=None, help="timed repetitions (default cpu 5, cuda 50)")
    p.add_argument("--host-kernels", choices=("auto", "numba", "numpy"), default="auto",
                   help="CPU: gpuq's host loops (auto: the compiled numba kernels when numba is "
                        "installed, else NumPy ufuncs; see gpuq.set_host_kernels)")
    p.add_argument("--no-peers", action="store_true", help="gpuq and the copy limit only")
    p.add_argument("--no-latency", action="store_true", help="skip the 4096-element latency cases")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    p.add_argument("--no-dynamic", action="store_true",
                   help="skip the issue-5 cases (dyn/..., qp/...: quantize_dynamic and choose_qparams "
                        "against a static quantize)")
    p.add_argument("--no-formats", action="store_true",
                   help="skip issue 19's cases (int4/uint4 g128 weights, fp8 e4m3fn activations)")
    return p


def _cuda_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def select_cases(args, device):
    """The case list for this run (see ``bench.cases`` for the sets)."""
    if args.quick:
        cs = C.quick_cases()
    else:
        sizes = [C.parse_size(s) for s in (args.sizes or (CPU_DEFAULT_SIZE if device == "cpu"
                                                           else GPU_DEFAULT_SIZES)).split(",")]
        cs = []
        for n in sizes:
            cs += C.full_cases(n) if (device == "cuda" or args.full) else C.cpu_default_cases(n)
        if not args.no_latency:
            cs += C.latency_cases()
    if args.no_dynamic:
        cs = [c for c in cs if c.op not in C.DYNAMIC_OPS]
    if args.no_formats or device == "cuda":
        # On a GPU issue 19's cases run on torch tensors in their own module (bench.gpu_formats).
        cs = [c for c in cs if not c.is_format]
    if args.cases:
        keys = [k for k in args.cases.split(",") if k]
        cs = [c for c in cs if any(k in c.name for k in keys)]
    return cs


def run(args, log=runner.log_stderr) -> dict:
    """Run the benchmark described by parsed ``args``; returns paths and the results."""
    device = args.device
    if device == "auto":
        device = "cuda" if _cuda_available() else "cpu"
    threads = args.threads or len(os.sched_getaffinity(0))
    cases = select_cases(args, device)
    os.makedirs(args.out, exist_ok=True)
    if device == "cpu":
        import gpuq

        from .peers_cpu import cpu_peers

        gpuq.set_host_kernels(args.host_kernels)

        peers, missing = ([], []) if args.no_peers else cpu_peers(threads)
        copy = limits.host_copy(threads, nbytes=(32 << 20) if args.quick else limits.HOST_COPY_BYTES)
        log(f"host copy: {copy['gbps']:.2f} GB/s ({threads} threads), {copy['gbps_1t']:.2f} GB/s (1 thread)")
        st = report.stamp("cpu", report.cpu_name(), threads,
                          {"copy": copy, "host_kernels": gpuq.get_host_kernels()})
        reps = args.reps or (3 if args.quick else 5)
        rows = runner.run_cpu(cases, peers, threads, copy["gbps"], reps=reps,
                              latency_inner=20 if args.quick else 200, log=log)
    else:
        import cupy as cp

        from .peers_gpu import gpu_peers

        peers, missing = ([], []) if args.no_peers else gpu_peers(threads)
        copy = limits.device_copy(cp)
        props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        log(f"device copy: {copy['gbps']:.1f} GB/s on {name}")
        st = report.stamp("cuda", name, threads, {"copy": copy})
        rows = runner.run_gpu(cases, peers, copy["gbps"], reps=args.reps or (10 if args.quick else 50), log=log)
    st["missing_peers"] = missing
    st["quick"] = bool(args.quick)
    dyn_text = dynamic.table(rows)
    stem = os.path.join(args.out, report.file_stem(st))
    text = report.table(st, rows) + dyn_text
    with open(stem + ".txt", "w") as f:
        f.write(text + "\n")
    report.write_json(stem + ".json", st, rows)
    png_note = "--no-plot" if args.no_plot else report.write_png(stem + ".png", st, rows)
    print(text)
    paths = {"json": stem + ".json", "txt": stem + ".txt", "png": None if png_note else stem + ".png"}
    print(f"\nwrote {paths['json']}\n      {paths['txt']}\n      "
          + (paths["png"] if paths["png"] else f"(no PNG: {png_note})"))
    return {"paths": paths, "stamp": st, "rows": rows, "png_note": png_note}


def main(argv=None) -> int:
    """Entry point for ``python -m bench``; returns an exit status."""
    args = build_parser().parse_args(argv)
    if args.threads is not None and args.threads < 1:
        print("--threads must be a positive integer", file=sys.stderr)
        return 2
    run(args)
    return 0
