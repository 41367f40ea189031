"""Block scales on the host (issue 28): ``block_size=(128, 128)`` against the same tensor's
per-group-128 time, the divisible 4-D reshape that was the only way before, and a naive NumPy
peer, with the copy bandwidth measured in the same run.

Cases, int8 (``--dtype int4``: packed int4, two codes a byte) asymmetric with zero points, float32:

* a ragged ``(4160, 14400)`` weight (4160 = 32*128 + 64, 14400 = 112*128 + 64: the last
  blocks of both dims are half blocks), and the divisible ``(4096, 14336)`` one;
* ``quantize``, ``dequantize`` and ``choose_qparams``, each as
  ``group128`` (``axis=1, group_size=128``), ``block128x128`` (``block_size=(128, 128)``),
  ``reshape4d`` (divisible only: ``x.reshape(32, 128, 112, 128)`` with ``axis=(0, 2)``) and
  ``numpy`` (the contract written naively: the scales and zero points repeated to the full
  shape, one division, ``np.rint``; for ``choose_qparams`` the blocks' min and max by
  ``np.minimum.reduceat``/``np.maximum.reduceat`` and the parameters from them).

Every ``numpy`` result is compared with gpuq's, code for code and bit for bit (``mismatches``).
Calls are interleaved round by round (group, block, reshape, numpy, group, ...) so the
machine's drift falls on all of them alike; the median of ``--reps`` rounds is reported,
with effective GB/s (the bytes each op must read and write once) and the ratio to the copy
bandwidth and to ``group128``. Issue 28's targets, 2 threads: quantize and dequantize
``block128x128 / group128 <= 1.1`` and ``choose_qparams <= 1.2`` on the ragged tensor.

    python -m bench.blocks                   # 2 threads, both shapes (~2 min on 2 cores)
    python -m bench.blocks --threads 1 --reps 9 --json /tmp/blocks.json
    python -m bench.blocks --shape 130x300   # a quick look (the targets need the big shapes)
    python -m bench.blocks --dtype int4      # packed int4: the compiled int4 kernels' block map
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gpuq  # noqa: E402
from bench.peers_cpu import pack_nibbles, unpack_nibbles  # noqa: E402

B = 128
TARGETS = {"quantize": 1.1, "dequantize": 1.1, "choose_qparams": 1.2}
SHAPES = ((4160, 14400), (4096, 14336))
#: Code range and bytes a code of each ``--dtype``.
CODES = {"int8": (-128, 127, 1.0), "int4": (-8, 7, 0.5)}


def _repeat(p, shape):
    """Block parameters ``(ceil(m/B), ceil(n/B))`` repeated to the full ``shape``."""
    return np.repeat(np.repeat(p, B, axis=0)[:shape[0]], B, axis=1)[:, :shape[1]]


def naive_quantize(x, s, z, dtype="int8"):
    """The codes (int4: packed, as gpuq's ``Codes.data``)."""
    qmin, qmax, _ = CODES[dtype]
    q = np.rint(x / _repeat(s, x.shape)).astype(np.int64) + _repeat(z, x.shape)
    q = np.clip(q, qmin, qmax).astype(np.int8)
    return pack_nibbles(q) if dtype == "int4" else q


def naive_dequantize(q, s, z, shape, dtype="int8"):
    if dtype == "int4":
        q = unpack_nibbles(q, math.prod(shape), signed=True).reshape(shape)
    return (q.astype(np.int32) - _repeat(z, q.shape)).astype(np.float32) * _repeat(s, q.shape)


def naive_qparams(x, dtype="int8"):
    """Asymmetric parameters per block from its min and max (the range widened to hold 0;
    an empty range gives scale 1): gpuq's rule, stated here on its own."""
    qmin, qmax, _ = CODES[dtype]
    starts = [np.arange(0, d, B) for d in x.shape]
    lo = np.minimum.reduceat(np.minimum.reduceat(x, starts[0], axis=0), starts[1], axis=1)
    hi = np.maximum.reduceat(np.maximum.reduceat(x, starts[0], axis=0), starts[1], axis=1)
    lo, hi = np.minimum(lo, 0).astype(np.float32), np.maximum(hi, 0).astype(np.float32)
    s = (hi - lo) / np.float32(qmax - qmin)
    s = np.where(s == 0, np.float32(1), s).astype(np.float32)
    z = np.clip(qmin - np.rint(lo / s), qmin, qmax).astype(np.int32)
    return s, z


def _cases(x, dtype="int8"):
    """``{op: {contender: (call, bytes)}}`` for one tensor."""
    m, n = x.shape
    nb = math.ceil(m / B) * math.ceil(n / B)
    ng = m * math.ceil(n / B)
    kw = dict(dtype=dtype)
    s_g, z_g = gpuq.choose_qparams(x, axis=1, group_size=B, **kw)
    s_b, z_b = gpuq.choose_qparams(x, block_size=(B, B), **kw)
    q_g = gpuq.quantize(x, s_g, z_g, axis=1, group_size=B, **kw)
    q_b = gpuq.quantize(x, s_b, z_b, block_size=(B, B), **kw)
    q_n = naive_quantize(x, s_b, z_b, dtype)
    params = lambda k: 8 * k  # noqa: E731  float32 scale + int32 zero point
    moved = int((4 + CODES[dtype][2]) * x.size)  # float32 in, codes out (or back)
    cases = {
        "quantize": {
            "group128": (lambda: gpuq.quantize(x, s_g, z_g, axis=1, group_size=B, **kw), moved + params(ng)),
            "block128x128": (lambda: gpuq.quantize(x, s_b, z_b, block_size=(B, B), **kw), moved + params(nb)),
            "numpy": (lambda: naive_quantize(x, s_b, z_b, dtype), moved + params(nb)),
        },
        "dequantize": {
            "group128": (lambda: gpuq.dequantize(q_g, s_g, z_g, axis=1, group_size=B), moved + params(ng)),
            "block128x128": (lambda: gpuq.dequantize(q_b, s_b, z_b, block_size=(B, B)), moved + params(nb)),
            "numpy": (lambda: naive_dequantize(q_n, s_b, z_b, x.shape, dtype), moved + params(nb)),
        },
        "choose_qparams": {
            "group128": (lambda: gpuq.choose_qparams(x, axis=1, group_size=B, **kw), 4 * x.size),
            "block128x128": (lambda: gpuq.choose_qparams(x, block_size=(B, B), **kw), 4 * x.size),
            "numpy": (lambda: naive_qparams(x, dtype), 4 * x.size),
        },
    }
    if m % B == 0 and n % B == 0:  # the only way before issue 28: a 4-D view, axes (0, 2)
        x4 = x.reshape(m // B, B, n // B, B)
        q4 = gpuq.Codes(q_b.data, x4.shape, dtype) if dtype == "int4" else q_b.reshape(x4.shape)
        cases["quantize"]["reshape4d"] = (
            lambda: gpuq.quantize(x4, s_b, z_b, axis=(0, 2), **kw), moved + params(nb))
        cases["dequantize"]["reshape4d"] = (
            lambda: gpuq.dequantize(q4, s_b, z_b, axis=(0, 2)), moved + params(nb))
        cases["choose_qparams"]["reshape4d"] = (
            lambda: gpuq.choose_qparams(x4, axis=(0, 2), **kw), 4 * x.size)
    return cases


def _mismatches(a, b) -> int:
    """Elements whose bits differ, over every array of a result (a tuple: scales, zps; packed
    int4 codes: their bytes)."""
    a = a if isinstance(a, tuple) else (a,)
    b = b if isinstance(b, tuple) else (b,)
    a, b = ([u.data if isinstance(u, gpuq.Codes) else u for u in r] for r in (a, b))
    bad = 0
    for u, v in zip(a, b):
        u, v = np.asarray(u), np.asarray(v)
        if u.dtype != v.dtype:
            v = v.astype(u.dtype)
        bad += int(np.count_nonzero(u.reshape(-1).view(np.uint8 if u.itemsize == 1 else f"u{u.itemsize}")
                                    != v.reshape(-1).view(np.uint8 if v.itemsize == 1 else f"u{v.itemsize}")))
    return bad


def run(shape, reps, log=print, dtype="int8") -> list:
    rng = np.random.default_rng(28)
    x = (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)
    dst = np.empty_like(x)
    rows = []
    copy = []
    for op, contenders in _cases(x, dtype).items():
        calls = {name: fn for name, (fn, _) in contenders.items()}
        for fn in calls.values():  # warm up: compiled loops, first touch of scratch
            fn()
        times = {name: [] for name in calls}
        for _ in range(reps):
            t = time.perf_counter()
            np.copyto(dst, x)
            copy.append(time.perf_counter() - t)
            for name, fn in calls.items():
                t = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t)
        want = calls["block128x128"]()
        for name, (fn, nbytes) in contenders.items():
            med = statistics.median(times[name])
            rows.append({"shape": list(shape), "dtype": dtype, "op": op, "contender": name, "median_s": med,
                         "min_s": min(times[name]), "max_s": max(times[name]), "reps": reps,
                         "gbps": nbytes / med / 1e9, "bytes": nbytes,
                         "mismatches": _mismatches(want, fn()) if name == "numpy" else 0})
        group = statistics.median(times["group128"])
        for r in rows[-len(contenders):]:
            r["ratio_to_group128"] = r["median_s"] / group
            if r["contender"] == "block128x128":
                r["target"] = TARGETS[op]
        log(f"  {shape[0]}x{shape[1]} {op} done")
    copy_gbps = 8 * x.size / statistics.median(copy) / 1e9
    for r in rows:
        r["copy_gbps"] = copy_gbps
        r["pct_copy"] = 100 * r["gbps"] / copy_gbps
    return rows


def table(rows) -> str:
    lines = [f"{'shape':<12} {'op':<15} {'contender':<13} {'ms':>8} {'GB/s':>6} {'%copy':>6} "
             f"{'/group128':>9} {'target':>7} {'mism':>5}"]
    for r in rows:
        target = ""
        if r.get("target"):
            verdict = "met" if r["ratio_to_group128"] <= r["target"] else "MISSED"
            target = f"<={r['target']} {verdict}"
        lines.append(f"{'x'.join(map(str, r['shape'])):<12} {r['op']:<15} {r['contender']:<13} "
                     f"{r['median_s'] * 1e3:8.1f} {r['gbps']:6.2f} {r['pct_copy']:6.1f} "
                     f"{r['ratio_to_group128']:9.2f} {target:>7} {r['mismatches']:>5}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--shape", action="append", help="MxN (repeatable; default: the issue's two)")
    ap.add_argument("--dtype", choices=sorted(CODES), default="int8", help="the codes (default int8)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    gpuq.set_num_threads(args.threads)
    shapes = [tuple(int(v) for v in s.lower().split("x")) for s in args.shape] if args.shape else SHAPES
    rows = []
    for shape in shapes:
        rows += run(shape, args.reps, log=lambda s: print(s, file=sys.stderr, flush=True), dtype=args.dtype)
    meta = {"threads": args.threads, "reps": args.reps, "dtype": args.dtype, "gpuq": gpuq.__version__,
            "numpy": np.__version__, "copy_gbps": rows[0]["copy_gbps"] if rows else None,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    print(f"# block scales, {args.dtype}, {args.threads} threads, copy {meta['copy_gbps']:.1f} GB/s "
          f"(bytes read + written), median of {args.reps}")
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    bad = sum(r["mismatches"] for r in rows)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
