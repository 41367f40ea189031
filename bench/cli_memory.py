"""Peak memory of ``gpuq quantize`` / ``gpuq dequantize`` on a generated ~800 MB checkpoint.

Run from the repository root (no GPU needed; ``--device cpu``)::

    python bench/cli_memory.py                        # float32, ~800 MB, largest tensor 64 MiB
    python bench/cli_memory.py --dtype bfloat16       # the same bytes in bfloat16
    python bench/cli_memory.py --repo /tmp/old-gpuq   # measure another checkout (before/after)
    python bench/cli_memory.py --json out.json        # the numbers as JSON too

It writes a Llama-shaped checkpoint (an embedding and an ``lm_head`` of 64 MiB, decoder
layers of 4 attention and 3 MLP matrices plus two norms, until the file is about
``--total-mb``) with the safetensors library, then runs, each in its own process under
``/usr/bin/time -v``:

* ``baseline``: ``gpuq quantize`` of a one-tensor file of the same dtype: Python, NumPy,
  numba and the compiled loops, the fixed overhead every run pays;
* ``quantize``: the checkpoint to int8 per-channel (the defaults);
* ``dequantize``: that output back to float32.

"Maximum resident set size" is the peak RSS of the process. The bar (issue 17): under
400 MB for quantize and for dequantize, i.e. the largest tensor's input plus output plus
the fixed overhead, whatever the file size. The checkpoint is cached in ``--dir`` between
runs (delete it, or change ``--total-mb``, to regenerate).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time

import numpy as np

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.llama_folder import llama_tensors  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 2**20

#: Shapes (hidden, mlp, vocab) whose embedding is 64 MiB in each dtype.
SHAPES = {"float32": (1024, 4096, 16384), "bfloat16": (1024, 8192, 32768)}


def layout(dtype: str, total_mb: float) -> dict:
    """Tensor name -> shape for a checkpoint of about ``total_mb`` MB (10^6 bytes).

    >>> t = layout("float32", 800)
    >>> t["model.embed_tokens.weight"], len(t)
    ((16384, 1024), 93)
    """
    hidden, mlp, vocab = SHAPES[dtype]
    item = 4 if dtype == "float32" else 2
    embed = vocab * hidden * item
    per_layer = (4 * hidden * hidden + 3 * hidden * mlp + 2 * hidden) * item
    layers = max(1, round((total_mb * 1e6 - 2 * embed) / per_layer))
    return llama_tensors(hidden, mlp, vocab, layers)


def generate(path: str, dtype: str, shapes: dict, seed: int = 0) -> None:
    """Write the checkpoint with the safetensors library (independent of the code measured)."""
    import ml_dtypes
    from safetensors.numpy import save_file

    target = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(np.float32)
    rng = np.random.default_rng(seed)
    tensors = {}
    for name, shape in shapes.items():
        x = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
        tensors[name] = x.astype(target)
    save_file(tensors, path, metadata={"format": "pt"})


def peak_rss(argv: list, repo: str, cwd: str) -> dict:
    """Run ``python -m gpuq ARGV`` under ``/usr/bin/time -v``: peak RSS (MiB), wall seconds.

    ``cwd`` must not hold a ``gpuq`` package (``-m`` puts it first on ``sys.path``), so
    that the ``repo`` on ``PYTHONPATH`` is the gpuq measured.
    """
    env = dict(os.environ, PYTHONPATH=os.path.abspath(repo))
    start = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-v", sys.executable, "-m", "gpuq", *argv],
                          env=env, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"gpuq {' '.join(argv)} failed ({proc.returncode}):\n{proc.stderr}")
    kib = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr).group(1))
    return {"peak_rss_mib": round(kib / 1024, 1), "wall_s": round(wall, 2)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", choices=sorted(SHAPES), default="float32")
    p.add_argument("--total-mb", type=float, default=800.0, help="checkpoint size (default 800)")
    p.add_argument("--dir", default="/tmp/gpuq-cli-memory", help="where the files go")
    p.add_argument("--repo", default=REPO, help="the gpuq checkout to measure (PYTHONPATH)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = p.parse_args(argv)
    if not os.path.exists("/usr/bin/time"):
        raise SystemExit("needs GNU time at /usr/bin/time (apt-get install time)")

    os.makedirs(args.dir, exist_ok=True)
    shapes = layout(args.dtype, args.total_mb)
    src = os.path.join(args.dir, f"model-{args.dtype}-{args.total_mb:g}MB.safetensors")
    if not os.path.exists(src):
        generate(src, args.dtype, shapes)
    tiny = os.path.join(args.dir, f"tiny-{args.dtype}.safetensors")
    if not os.path.exists(tiny):
        generate(tiny, args.dtype, {"w": (256, 1024)})
    q = os.path.join(args.dir, "q.safetensors")
    back = os.path.join(args.dir, "back.safetensors")
    item = 4 if args.dtype == "float32" else 2
    largest = max(int(np.prod(s)) for s in shapes.values()) * item
    common = ["--device", "cpu", "-q", "--json"]
    runs = {
        "baseline": peak_rss(["quantize", tiny, "-o", os.path.join(args.dir, "tq.safetensors"),
                              *common], args.repo, args.dir),
        "quantize": peak_rss(["quantize", src, "-o", q, *common], args.repo, args.dir),
        "dequantize": peak_rss(["dequantize", q, "-o", back, *common], args.repo, args.dir),
    }
    import_check = subprocess.run(
        [sys.executable, "-c", "import gpuq, os; print(os.path.dirname(os.path.dirname(gpuq.__file__)))"],
        env=dict(os.environ, PYTHONPATH=os.path.abspath(args.repo)), cwd=args.dir,
        capture_output=True, text=True).stdout.strip()
    result = {
        "repo": import_check,
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "dtype": args.dtype,
        "input_mb": round(os.path.getsize(src) / 1e6, 1),
        "quantized_mb": round(os.path.getsize(q) / 1e6, 1),
        "dequantized_mb": round(os.path.getsize(back) / 1e6, 1),
        "tensors": len(shapes),
        "largest_tensor_mib": round(largest / MIB, 1),
        "runs": runs,
    }
    print(f"gpuq CLI peak memory: {result['input_mb']} MB {args.dtype} checkpoint, "
          f"{result['tensors']} tensors, largest {result['largest_tensor_mib']} MiB "
          f"(gpuq from {result['repo']})")
    print(f"{'run':<11} {'peak RSS MiB':>12} {'wall s':>7}")
    for name, r in runs.items():
        print(f"{name:<11} {r['peak_rss_mib']:>12.1f} {r['wall_s']:>7.2f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
