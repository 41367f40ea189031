"""Plant known bugs in a copy of the tree and check that the test suite catches each one.

    python tests/planted_bugs.py            # every bug: a table, exit 1 if one goes unnoticed
    python tests/planted_bugs.py head+1     # one (or more) by name

Each bug is one exact text replacement (it must match exactly once, so the list
cannot rot silently when the code moves). The copy is the working tree
(tracked and untracked files that git does not ignore); its kernels are found
through ``GPUQ_KERNELS_DIR`` and rebuilt by the CPU execution, whose cache is
keyed by the source text. The suite run is the one CI runs on the ``[cuda]``
parameter and the sweep, stopping at the first failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: name -> (file, text, replacement, why the suite must notice)
BUGS = {
    "reciprocal": (
        "kernels/contract.cuh",
        "constexpr int kRecipSteps = 2;",
        "constexpr int kRecipSteps = 0;",
        "x * (1/s) without the fused corrections differs from x / s in the last bit: ties flip",
    ),
    "reciprocal-guard": (
        "kernels/contract.cuh",
        "const bool fast = b - 0x1f800000u <= 0x5f800000u - 0x1f800000u;",
        "const bool fast = b - 0x00800000u <= 0x7f000000u - 0x00800000u;",
        "every normal scale takes the reciprocal: 2^70's is subnormal, the residual inexact",
    ),
    "nan-check": (
        "kernels/contract.cuh",
        "const long long r = is_nan(v) ? 0LL : rint_to_i64_sat(v);",
        "const long long r = rint_to_i64_sat(v);",
        "cvt.rni.s64 of NaN is not 0: NaN must give the zero point",
    ),
    "tail+1": (
        "kernels/elementwise.cuh",
        "                if (l < len) out[begin + l] = y[l];",
        "                if (l <= len) out[begin + l] = y[l];",
        "the scalar tail stores one element past the end",
    ),
    "channel-off-by-one": (
        "kernels/elementwise.cuh",
        "by_channels(row, unused, ci);",
        "by_channels(row + 1, unused, ci);",
        "every element reads its neighbour channel's scale",
    ),
    "warp-offset-8": (
        "kernels/qparams.cu",
        "for (int o = 16; o > 0; o >>= 1) {",
        "for (int o = 8; o > 0; o >>= 1) {",
        "the warp reduction misses half of the warp",
    ),
    "head+1": (
        "gpuq/backends/cuda/launch.py",
        "np.int64(n), np.int64(head),",
        "np.int64(n), np.int64(head + 1),",
        "the launch path's head is one too far",
    ),
    "int32-for-long-long": (
        "gpuq/backends/cuda/launch.py",
        "args = (src, out, scales, scales if not has_zp else zps, np.int64(n),",
        "args = (src, out, scales, scales if not has_zp else zps, np.int32(n),",
        "an int32 argument for a long long parameter",
    ),
    "no-first-syncthreads": (
        "kernels/qparams.cu",
        "__syncthreads();  // the previous segment's readers are done with s_lo/s_hi",
        "// (removed) the previous segment's readers are done with s_lo/s_hi",
        "a fast warp overwrites the shared partials before the others have read them",
    ),
    "warp-store-swizzle": (
        "kernels/elementwise.cuh",
        "*dst = mine[L * kVecs + (v ^ ((L / kLanesPerRow) % kVecs))];",
        "*dst = mine[L * kVecs + v];",
        "the warp-wide store of float outputs reads the staged vectors unswizzled",
    ),
    "warp-store-lane": (
        "kernels/elementwise.cuh",
        "store_units_coalesced(out, head + (u - lane - 1) * kUnit, y, full && vec_out);",
        "store_units_coalesced(out, head + (u - lane) * kUnit, y, full && vec_out);",
        "the warp's span starts one unit late",
    ),
    "packed-align-4": (
        "gpuq/backends/cuda/formats.py",
        "if packed.data.ptr % 8 == 0:",
        "if packed.data.ptr % 4 == 0:",
        "8-byte packed int4 stores at addresses that are only 4-byte aligned",
    ),
    "block-row-short": (
        "kernels/qparams.cu",
        "for (long long j = lane; j < inner; j += 32) acc.add(x[off + j]);",
        "for (long long j = lane; j < inner - 1; j += 32) acc.add(x[off + j]);",
        "the block reduction's row walk misses the last element of each row of a block",
    ),
}

#: What runs against each copy: the [cuda] parameter of the shared bodies and the sweep.
SUITE = ["-k", "cuda or sweep", "tests/test_quantize.py", "tests/test_group.py", "tests/test_qparams.py",
         "tests/test_ops.py", "tests/test_cuda_backend.py", "tests/test_cuda_sweep.py", "tests/test_formats.py",
         "tests/test_block_scales.py"]


def _files():
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    return [Path(p) for p in out.splitlines() if (ROOT / p).is_file()]


def _copy(dest: Path):
    for rel in _files():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dest / rel)


def plant(tree: Path, name: str) -> None:
    path, old, new, _ = BUGS[name]
    text = (tree / path).read_text()
    if text.count(old) != 1:
        raise SystemExit(f"{name}: expected exactly one {old!r} in {path}, found {text.count(old)}")
    (tree / path).write_text(text.replace(old, new))


def run(name: str) -> tuple:
    """``(caught, seconds, last line)`` for one planted bug."""
    with tempfile.TemporaryDirectory(prefix=f"gpuq-bug-{name}-") as tmp:
        tree = Path(tmp)
        _copy(tree)
        plant(tree, name)
        env = dict(os.environ, PYTHONPATH=str(tree), GPUQ_KERNELS_DIR=str(tree / "kernels"))
        t = time.perf_counter()
        res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *SUITE],
                             cwd=tree, env=env, capture_output=True, text=True)
        lines = [line for line in res.stdout.splitlines() if line.strip()]
        failed = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
        return res.returncode != 0, time.perf_counter() - t, (failed or lines[-1:] or ["(no output)"])[0]


def main(argv) -> int:
    names = argv or list(BUGS)
    unknown = [n for n in names if n not in BUGS]
    if unknown:
        raise SystemExit(f"unknown bug(s) {unknown}; known: {', '.join(BUGS)}")
    missed = []
    for name in names:
        caught, secs, line = run(name)
        print(f"{name:22s} {'caught' if caught else 'MISSED':7s} {secs:6.1f} s  {line[:150]}", flush=True)
        if not caught:
            missed.append(name)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
