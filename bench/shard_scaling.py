"""Scaling of ``gpuq quantize`` on a sharded checkpoint: this process vs 1 and 2 Dask workers.

Run from the repository root (CPU; needs ``pip install 'gpuq[dask]'``)::

    python bench/shard_scaling.py                     # 2 GB float32 in 8 shards, ~2 min on 2 cores
    python bench/shard_scaling.py --total-mb 512      # smaller, quicker
    python bench/shard_scaling.py --workers 1 2 4 --repeat 3 --json out.json

It writes a sharded checkpoint (``model-0000i-of-0000n.safetensors`` of square
float32 matrices plus a bias each, and ``model.safetensors.index.json``) with
the safetensors library, then times, each in its own process,
``python -m gpuq quantize IN -o OUT --device cpu -q`` with no Dask (``local``)
and with ``--workers N`` (a ``distributed.LocalCluster`` of N worker processes,
each with cores/N host threads). The time is the whole command's wall time:
interpreter start, cluster start and stop, reading, quantizing, writing.
Throughput is input bytes / wall time; speed-up is the local time / this
time. Every run's output is checked byte for byte against the local run's.
The best of ``--repeat`` runs is reported (the input is in the page cache
after the first).
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import platform
import shutil
import subprocess
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INDEX = "model.safetensors.index.json"


def generate(folder: str, total_mb: float, shards: int, side: int = 4096, seed: int = 0) -> int:
    """Write a sharded float32 checkpoint of about ``total_mb`` MB; return its data bytes.

    Each shard holds ``k`` ``side x side`` matrices and a bias per matrix, ``k``
    chosen so the shards add up to ``total_mb`` (10^6 bytes).
    """
    from safetensors.numpy import save_file

    os.makedirs(folder, exist_ok=True)
    per_matrix = side * side * 4
    k = max(1, round(total_mb * 1e6 / per_matrix / shards))
    rng = np.random.default_rng(seed)
    weight_map, total = {}, 0
    for s in range(shards):
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        tensors = {}
        for j in range(k):
            layer = s * k + j
            tensors[f"model.layers.{layer}.weight"] = (
                rng.standard_normal((side, side), dtype=np.float32) * np.float32(0.02))
            tensors[f"model.layers.{layer}.bias"] = rng.standard_normal(side, dtype=np.float32)
        save_file(tensors, os.path.join(folder, name), metadata={"format": "pt"})
        total += sum(t.nbytes for t in tensors.values())
        weight_map.update({n: name for n in tensors})
    with open(os.path.join(folder, INDEX), "w") as fh:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, fh)
    return total


def run(src: str, out: str, workers: int | None) -> float:
    """Wall seconds of one ``gpuq quantize`` of ``src`` into ``out`` (removed first)."""
    shutil.rmtree(out, ignore_errors=True)
    argv = [sys.executable, "-m", "gpuq", "quantize", src, "-o", out, "--device", "cpu", "-q",
            "--json"]
    if workers is not None:
        argv += ["--workers", str(workers)]
    env = dict(os.environ, PYTHONPATH=REPO)
    start = time.perf_counter()
    proc = subprocess.run(argv, env=env, cwd=os.path.dirname(out), capture_output=True,
                          text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stderr}")
    return wall


def same_folder(a: str, b: str) -> bool:
    names = sorted(os.listdir(a))
    return names == sorted(os.listdir(b)) and all(
        filecmp.cmp(os.path.join(a, n), os.path.join(b, n), shallow=False) for n in names)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--total-mb", type=float, default=2048.0, help="checkpoint size (default 2048)")
    p.add_argument("--shards", type=int, default=8, help="number of shards (default 8)")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2],
                   help="worker counts to time (default 1 2)")
    p.add_argument("--repeat", type=int, default=2, help="runs per case, best kept (default 2)")
    p.add_argument("--dir", default="/tmp/gpuq-shard-scaling", help="where the files go")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = p.parse_args(argv)

    src = os.path.join(args.dir, f"in-{args.total_mb:g}MB-{args.shards}")
    if not os.path.exists(os.path.join(src, INDEX)):
        shutil.rmtree(src, ignore_errors=True)
        t = time.perf_counter()
        generate(src, args.total_mb, args.shards)
        print(f"generated {src} in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    with open(os.path.join(src, INDEX)) as fh:
        nbytes = json.load(fh)["metadata"]["total_size"]

    cases = [("local", None)] + [(f"{n} worker{'s' if n > 1 else ''}", n) for n in args.workers]
    results = []
    local_out = os.path.join(args.dir, "out-local")
    for label, workers in cases:
        out = local_out if workers is None else os.path.join(args.dir, f"out-{workers}")
        wall = min(run(src, out, workers) for _ in range(args.repeat))
        if workers is not None and not same_folder(out, local_out):
            raise SystemExit(f"{label}: the output differs from the local run's")
        results.append({"case": label, "workers": workers, "wall_s": round(wall, 2),
                        "mb_per_s": round(nbytes / 1e6 / wall, 1)})
    base = results[0]["wall_s"]
    for r in results:
        r["speedup"] = round(base / r["wall_s"], 2)
    info = {"bytes": nbytes, "shards": args.shards, "cpus": os.cpu_count(),
            "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
            "python": platform.python_version(), "results": results}
    print(f"{nbytes / 1e9:.2f} GB float32 in {args.shards} shards, {os.cpu_count()} CPUs, "
          f"best of {args.repeat}")
    print(f"{'case':<12} {'wall s':>8} {'MB/s':>8} {'speed-up':>9}")
    for r in results:
        print(f"{r['case']:<12} {r['wall_s']:>8.2f} {r['mb_per_s']:>8.1f} {r['speedup']:>8.2f}x")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(info, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
