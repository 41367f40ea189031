#!/usr/bin/env python3
"""The device check's Python steps (``bench/gpu_check.sh`` runs them, each under its own limit).

``preflight``
    The GPU, driver, CUDA, CuPy/torch/numba versions, ``gpuq info`` without its compile check,
    and whether the tests will run on real CuPy (the choice ``tests/conftest.py`` makes):
    exit status 1 with one line ``no GPU: <why>`` when they would not.
``compile [--json FILE] [--threads N]``
    Every kernel module the CUDA backend compiles (``registry.compile_units()``), through
    gpuq's own compile path (``compiler.load_module``: the NVRTC builtins preload, the
    contract's options, CuPy's on-disk cache that the later steps then hit), on threads
    (NVRTC releases the GIL). Per module: seconds; per kernel: registers, local (stack and
    spill) bytes, static shared bytes. Exit status 1 if a module fails to compile.
``sanitize``
    A small case of each kernel family, for ``compute-sanitizer`` to run under (racecheck on
    the qparams reductions, memcheck on int4 and fp8): bits against the host backend.

    python3 bench/gpu_check.py preflight
    python3 bench/gpu_check.py compile --json $OUT/compile.json
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _version(module: str) -> str:
    try:
        mod = __import__(module)
        return getattr(mod, "__version__", "?")
    except Exception as exc:  # noqa: BLE001 - a report, not a requirement
        return f"not importable ({type(exc).__name__}: {' '.join(str(exc).split())[:120]})"


def tests_cuda_mode() -> tuple:
    """("real", None) when the tests' ``cuda`` parameters would run on real CuPy, else
    ("sim", why): the same choice as ``tests/conftest.py`` (tests/cudasim/install.py)."""
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        from cudasim import install
    finally:
        sys.path.remove(str(ROOT / "tests"))
    mode = install.install()
    return mode, install.not_real_reason


def preflight() -> int:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        print("no GPU: nvidia-smi not found on this machine")
        return 1
    query = subprocess.run([smi, "--query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
    print("nvidia-smi:", query.stdout.strip() or query.stderr.strip())
    print("python", platform.python_version(), "|", " | ".join(
        f"{m} {_version(m)}" for m in ("numpy", "cupy", "torch", "numba", "ml_dtypes", "triton")))
    mode, why = tests_cuda_mode()
    if mode != "real":
        print(f"no GPU: the tests would run on the CPU execution of the kernels ({why})")
        return 1
    import cupy

    from gpuq.backends.cuda import compiler
    from gpuq.checkpoints.env import info

    dev = cupy.cuda.Device()
    print(f"cupy {cupy.__version__}: device {dev.id} sm_{dev.compute_capability}, "
          f"{cupy.cuda.runtime.getDeviceCount()} device(s), CUDA runtime "
          f"{cupy.cuda.runtime.runtimeGetVersion()}, driver {cupy.cuda.runtime.driverGetVersion()}, "
          f"NVRTC {cupy.cuda.nvrtc.getVersion()}")
    print("nvrtc builtins preloaded:", [str(p) for p in compiler.prepare_nvrtc()] or "none needed/found")
    for key, value in info(compile_check=False).items():
        print(f"gpuq info: {key}: {value}")
    return 0


#: (report key, attribute of cupy.RawKernel): what the driver says of each loaded kernel.
_ATTRS = (("regs", "num_regs"), ("local_bytes", "local_size_bytes"), ("shared_bytes", "shared_size_bytes"),
          ("max_threads", "max_threads_per_block"))


def _compile_unit(unit):
    from gpuq.backends.cuda import compiler

    source, names = unit
    t = time.perf_counter()
    try:
        module = compiler.load_module(source, names)
        kernels = []
        for name in names:
            fn = module.get_function(name)
            kernels.append({"name": name, **{key: getattr(fn, attr, None) for key, attr in _ATTRS}})
        return {"source": source, "kernels": kernels, "seconds": time.perf_counter() - t}
    except Exception as exc:  # noqa: BLE001 - every unit is reported
        return {"source": source, "names": list(names), "seconds": time.perf_counter() - t,
                "error": f"{type(exc).__name__}: {str(exc)[:2000]}"}


def compile_all(json_path: Path | None, threads: int, limit: int | None = None) -> int:
    import cupy

    from gpuq.backends.cuda import compiler, registry

    compiler.prepare_nvrtc()
    units = sorted(registry.compile_units(), key=lambda u: u[0] != "formats.cu")[:limit]  # longest first
    t = time.perf_counter()
    results = []
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        for res in pool.map(_compile_unit, units):
            results.append(res)
            if "error" in res:
                print(f"FAIL {res['source']} ({len(res['names'])} kernels): {res['error'][:600]}", flush=True)
            else:
                worst = max(res["kernels"], key=lambda k: (k["local_bytes"] or 0, k["regs"] or 0))
                print(f"ok   {res['source']:<14} {len(res['kernels']):3d} kernels {res['seconds']:6.1f} s  "
                      f"max regs {worst['regs']}, local bytes {worst['local_bytes']} ({worst['name']})",
                      flush=True)
    wall = time.perf_counter() - t
    bad = [r for r in results if "error" in r]
    kernels = [k for r in results for k in r.get("kernels", ())]
    spilling = [k["name"] for k in kernels if k["local_bytes"]]  # a stack frame or spills
    print(f"{len(units) - len(bad)}/{len(units)} modules, {len(kernels)} kernels in {wall:.1f} s on "
          f"{threads} threads (sm_{cupy.cuda.Device().compute_capability}); kernels with local memory: "
          f"{len(spilling)}{' ' + str(spilling[:5]) if spilling else ''}")
    if json_path:
        json_path.write_text(json.dumps({"arch": cupy.cuda.Device().compute_capability, "wall_s": wall,
                                         "threads": threads, "units": results}, indent=1) + "\n")
    return 1 if bad else 0


def sanitize_cases() -> int:
    """Small cases of the qparams reductions, int4 and fp8, device bits against the host's."""
    import cupy
    import numpy as np

    import gpuq

    rng = np.random.default_rng(5)
    x = rng.normal(size=(37, 1029)).astype(np.float32)
    x[3, 5], x[7, 0] = np.nan, -np.nan
    d = cupy.asarray(x)
    failures = 0

    def same(name, got, want):
        nonlocal failures
        g = [got] if not isinstance(got, tuple) else list(got)
        w = [want] if not isinstance(want, tuple) else list(want)
        for a, b in zip(g, w):
            if a is None and b is None:
                continue
            a = a.data if isinstance(a, gpuq.Codes) else a
            b = b.data if isinstance(b, gpuq.Codes) else b
            a, b = cupy.asnumpy(a), np.asarray(b)
            if a.tobytes() != b.tobytes():
                failures += 1
                print(f"FAIL {name}", flush=True)
                return
        print(f"ok   {name}", flush=True)

    for axis, group in ((None, None), (0, None), (1, None), (1, 128), ((0, 1), None)):
        for sym in (False, True):
            same(f"choose_qparams axis={axis} group={group} symmetric={sym}",
                 gpuq.choose_qparams(d, axis=axis, group_size=group, symmetric=sym),
                 gpuq.choose_qparams(x, axis=axis, group_size=group, symmetric=sym))
            same(f"quantize_dynamic axis={axis} group={group} symmetric={sym}",
                 gpuq.quantize_dynamic(d, axis=axis, group_size=group, symmetric=sym),
                 gpuq.quantize_dynamic(x, axis=axis, group_size=group, symmetric=sym))
    s = (np.abs(np.nan_to_num(x)).max(axis=1) / 7).astype(np.float32)
    same("int4 quantize per-row", gpuq.quantize(d, cupy.asarray(s), axis=0, dtype="int4"),
         gpuq.quantize(x, s, axis=0, dtype="int4"))
    q4 = gpuq.quantize(x, s, axis=0, dtype="uint4", zps=np.full(37, 8, np.int32))
    q4d = gpuq.quantize(d, cupy.asarray(s), np.full(37, 8, np.int32), axis=0, dtype="uint4")
    same("uint4 dequantize per-row", gpuq.dequantize(q4d, cupy.asarray(s), np.full(37, 8, np.int32), axis=0),
         gpuq.dequantize(q4, s, np.full(37, 8, np.int32), axis=0))
    s8 = (s * 7 / 448).astype(np.float32)
    same("fp8 e4m3 quantize per-row", gpuq.quantize(d, cupy.asarray(s8), axis=0, dtype="float8_e4m3fn"),
         gpuq.quantize(x, s8, axis=0, dtype="float8_e4m3fn"))
    f8 = gpuq.quantize(x, s8, axis=0, dtype="float8_e5m2")
    same("fp8 e5m2 dequantize per-row",
         gpuq.dequantize(gpuq.quantize(d, cupy.asarray(s8), axis=0, dtype="float8_e5m2"), cupy.asarray(s8), axis=0),
         gpuq.dequantize(f8, s8, axis=0))
    cupy.cuda.runtime.deviceSynchronize()
    return 1 if failures else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sim", action="store_true",
                    help="dry run on the CPU execution of the kernels (tests/cudasim), compile and sanitize")
    sub = ap.add_subparsers(dest="step", required=True)
    sub.add_parser("preflight")
    c = sub.add_parser("compile")
    c.add_argument("--json", type=Path)
    c.add_argument("--threads", type=int, default=min(16, os.cpu_count() or 1))
    c.add_argument("--limit", type=int, help="the first N modules only (dry runs)")
    sub.add_parser("sanitize")
    args = ap.parse_args(argv)
    if args.step == "preflight":
        return preflight()
    if args.sim:
        print("dry run: the CPU execution of the kernels, not a GPU:", tests_cuda_mode())
    if args.step == "compile":
        return compile_all(args.json, args.threads, args.limit)
    return sanitize_cases()


if __name__ == "__main__":
    sys.exit(main())
