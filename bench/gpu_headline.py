#!/usr/bin/env python3
"""The device check's headline benchmark: the single-pass cases at 256M elements on torch CUDA
tensors, gpuq against the measured device-to-device copy and against torch eager / torch.compile.

Cases (issue 25): f32->s8 per-tensor, per-channel, group 128; s8->f32; bf16->s8 per-row;
f32->int4 group 128 (packed); f32->fp8 e4m3 per-row; ``quantize_dynamic`` per-row (the fused
path; issue 38: unchecked, bf16, and rows of 2 x cols, staged in shared memory); issue 28's fp8 e4m3 with 128x128 block scales (quantize, dequantize, ``choose_qparams``);
issue 30's MSE search (``choose_qparams(..., method="mse")``, int4 g128 on a (4096, 4096) weight). Static cases take device-resident scales with ``check_values=False`` (no host
synchronisation: what a serving loop does), per-tensor a Python float (passed by value).

For each case, before any timing:

* **bits**: gpuq on the device against gpuq on the host (the NumPy backend, the contract's
  reference) over the first rows; any mismatch marks the case ``bits: FAIL`` and it is not timed;
* **peers**: the torch eager expression of the same formula (and its torch.compile'd form);
  their mismatches against gpuq over the whole tensor are reported, not hidden (torch rounds
  its own way in places: a scalar division by a reciprocal, a different zero-range rule).

Timing: CUDA events around a loop of back-to-back calls (``--reps``), repeated ``--rounds``
times, the median of the per-call means. Effective GB/s counts the bytes each case must read
and write once (scales included); ``pct_copy`` is that over the copy bandwidth measured in the
same run (``dst.copy_(src)``, bytes read + written). torch.compile peers run after every eager
row, each only while ``--deadline`` (seconds since the start) leaves room for its compile.

Rows stream to ``--json`` (rewritten after each) and a table goes to stdout.

    python3 bench/gpu_headline.py --json $OUT/bench.json              # the GPU: 256M elements
    python3 bench/gpu_headline.py --device cpu --rows 64 --cols 4096  # a dry run on CPU torch
    ncu --clock-control none -k regex:gpuq python3 bench/gpu_headline.py --profile --rows 4096
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

T0 = time.perf_counter()


def _elapsed() -> float:
    return time.perf_counter() - T0


class Timer:
    """Per-call mean time (s) of ``fn`` over ``reps`` back-to-back calls, median of ``rounds``."""

    def __init__(self, torch, device, reps, rounds):
        self.torch, self.device, self.reps, self.rounds = torch, device, reps, rounds

    def __call__(self, fn):
        torch = self.torch
        for _ in range(2):
            fn()
        means = []
        for _ in range(self.rounds):
            if self.device == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                start.record()
                for _ in range(self.reps):
                    fn()
                end.record()
                end.synchronize()
                means.append(start.elapsed_time(end) / 1e3 / self.reps)
            else:
                t = time.perf_counter()
                for _ in range(self.reps):
                    fn()
                means.append((time.perf_counter() - t) / self.reps)
        return statistics.median(means)


def _host(t):
    """A torch tensor as a NumPy array (fp8 and bfloat16 through their bits)."""
    torch = sys.modules["torch"]
    t = t.detach().cpu()
    if t.dtype in (torch.bfloat16,):
        import ml_dtypes

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        import ml_dtypes  # as the fp8 codes they are (dequantize reads them so)

        return t.view(torch.uint8).numpy().view(getattr(ml_dtypes, str(t.dtype)[6:]))
    return t.numpy()


def _bits(a) -> np.ndarray:
    """Codes as comparable raw bytes: Codes' packed data, fp8 bits, int8 values."""
    if isinstance(a, gpuq.Codes):
        a = a.data
    if hasattr(a, "detach"):
        a = _host(a)
    a = np.asarray(a)
    return a.view(np.uint8) if a.dtype.itemsize == 1 else a


def _mismatches(torch, a, b) -> int:
    """Elements (bytes for packed codes) where two device results differ (NaN == NaN)."""
    if isinstance(a, gpuq.Codes):
        a = a.data
    if isinstance(b, gpuq.Codes):
        b = b.data
    if a.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        a = a.view(torch.uint8)
    if b.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        b = b.view(torch.uint8)
    a, b = a.reshape(-1), b.reshape(-1)
    if a.numel() != b.numel():
        return max(a.numel(), b.numel())
    if a.dtype != b.dtype:
        b = b.to(a.dtype)
    diff = a != b
    if a.is_floating_point():
        diff &= ~(torch.isnan(a) & torch.isnan(b))
    return int(diff.sum())


def _pack_int4(torch, q):
    """int8 codes in [-8, 7] -> ONNX's nibble order (element 2k low, 2k+1 high), uint8."""
    q = q.reshape(-1).to(torch.uint8) & 0xF
    return q[0::2] | (q[1::2] << 4)


def build_cases(torch, device, rows, cols):
    """Every headline case: name, bytes moved, gpuq call, torch eager peer, host bits check."""
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(rows, cols, generator=gen, device=device, dtype=torch.float32) * 3
    x16 = x.to(torch.bfloat16)
    n = rows * cols
    rowmax = x.abs().amax(dim=1)
    s_row = (rowmax / 127).contiguous()                                    # (rows,)
    s_row_bf = (x16.float().abs().amax(dim=1) / 127).contiguous()
    s_fp8 = (rowmax / 448).contiguous()
    g = 128
    s_g = (x.reshape(rows, cols // g, g).abs().amax(dim=2) / 127).contiguous()  # (rows, cols/g)
    s_g4 = (x.reshape(rows, cols // g, g).abs().amax(dim=2) / 7).contiguous()
    s_t = float(x.abs().max()) / 127
    s_t_dev = torch.tensor(s_t, device=device, dtype=torch.float32)
    q8 = gpuq.quantize(x, s_t)                                             # dequantize's input
    b = 128  # DeepSeek's fine-grained fp8 layout: one scale per 128x128 block (issue 28)
    if rows % b == 0:  # the peers' 4-D view needs whole blocks (gpuq does not)
        tiles = x.reshape(rows // b, b, cols // b, b)
        s_blk = (tiles.abs().amax(dim=(1, 3)) / 448).contiguous()         # (rows/128, cols/128)
        q_blk = gpuq.quantize(x, s_blk, block_size=(b, b), dtype="float8_e4m3fn")
    flat = x.reshape(-1)
    x2 = x.reshape(-1, 2 * cols) if rows % 2 == 0 else x  # rows of 2 x cols
    xm = x[:4096, :4096].contiguous()  # the MSE case's weight: (4096, 4096) where x is that large

    def eager_q(v, s, lo=-128, hi=127, dt=torch.int8):
        return torch.clamp(torch.round(v / s), lo, hi).to(dt)

    cases = [
        dict(name="f32->s8 per-tensor", bytes=5 * n,
             gpuq=lambda: gpuq.quantize(flat, s_t),
             eager=lambda: eager_q(flat, s_t_dev),
             host=lambda k: gpuq.quantize(_host(flat[:k * cols]), s_t), rows_of=lambda r, k: r[:k * cols]),
        dict(name="f32->s8 per-channel", bytes=5 * n + 4 * rows,
             gpuq=lambda: gpuq.quantize(x, s_row, axis=0, check_values=False),
             eager=lambda: eager_q(x, s_row[:, None]),
             host=lambda k: gpuq.quantize(_host(x[:k]), _host(s_row[:k]), axis=0)),
        dict(name="f32->s8 group128", bytes=5 * n + 4 * s_g.numel(),
             gpuq=lambda: gpuq.quantize(x, s_g, axis=1, group_size=g, check_values=False),
             eager=lambda: eager_q(x.reshape(rows, cols // g, g), s_g[..., None]).reshape(rows, cols),
             host=lambda k: gpuq.quantize(_host(x[:k]), _host(s_g[:k]), axis=1, group_size=g)),
        dict(name="s8->f32 per-tensor", bytes=5 * n,
             gpuq=lambda: gpuq.dequantize(q8, s_t),
             eager=lambda: q8.float() * s_t_dev,
             host=lambda k: gpuq.dequantize(_host(q8[:k]), s_t)),
        dict(name="bf16->s8 per-row", bytes=3 * n + 4 * rows,
             gpuq=lambda: gpuq.quantize(x16, s_row_bf, axis=0, check_values=False),
             eager=lambda: eager_q(x16.float(), s_row_bf[:, None]),
             host=lambda k: gpuq.quantize(_host(x16[:k]), _host(s_row_bf[:k]), axis=0)),
        dict(name="f32->int4 group128", bytes=4 * n + n // 2 + 4 * s_g4.numel(),
             gpuq=lambda: gpuq.quantize(x, s_g4, axis=1, group_size=g, dtype="int4", check_values=False),
             eager=lambda: _pack_int4(torch, eager_q(x.reshape(rows, cols // g, g), s_g4[..., None], -8, 7)),
             host=lambda k: gpuq.quantize(_host(x[:k]), _host(s_g4[:k]), axis=1, group_size=g, dtype="int4"),
             rows_of=lambda r, k: r[:k * cols // 2]),
        dict(name="f32->fp8e4m3 per-row", bytes=5 * n + 4 * rows,
             gpuq=lambda: gpuq.quantize(x, s_fp8, axis=0, dtype="float8_e4m3fn", check_values=False),
             eager=lambda: torch.clamp(x / s_fp8[:, None], -448, 448).to(torch.float8_e4m3fn),
             host=lambda k: gpuq.quantize(_host(x[:k]), _host(s_fp8[:k]), axis=0, dtype="float8_e4m3fn")),
        dict(name="dynamic f32->s8 per-row", bytes=5 * n + 4 * rows,
             gpuq=lambda: gpuq.quantize_dynamic(x, axis=0, symmetric=True),
             eager=lambda: _eager_dynamic(torch, x),
             host=lambda k: gpuq.quantize_dynamic(_host(x[:k]), axis=0, symmetric=True)),
        # Issue 38: the same call unchecked (no flag read-back, no host synchronisation: the
        # kernel alone, as a serving loop runs it), and bf16 rows (the read-once kernel's
        # 16-byte loads of 8 elements).
        dict(name="dynamic f32->s8 per-row unchecked", bytes=5 * n + 4 * rows,
             gpuq=lambda: gpuq.quantize_dynamic(x, axis=0, symmetric=True, check_values=False),
             eager=lambda: _eager_dynamic(torch, x),
             host=lambda k: gpuq.quantize_dynamic(_host(x[:k]), axis=0, symmetric=True)),
        dict(name="dynamic bf16->s8 per-row unchecked", bytes=3 * n + 4 * rows,
             gpuq=lambda: gpuq.quantize_dynamic(x16, axis=0, symmetric=True, check_values=False),
             eager=lambda: _eager_dynamic(torch, x16.float()),
             host=lambda k: gpuq.quantize_dynamic(_host(x16[:k]), axis=0, symmetric=True)),
        # Rows twice as long (the same bytes): above the registers' 16384 elements, each row
        # staged in shared memory (dynamic_quantize_staged) where the device's opt-in allows.
        dict(name="dynamic f32->s8 per-row x2 long unchecked", bytes=5 * n + 4 * (n // (2 * cols)),
             gpuq=lambda: gpuq.quantize_dynamic(x2, axis=0, symmetric=True, check_values=False),
             eager=lambda: _eager_dynamic(torch, x2),
             host=lambda k: gpuq.quantize_dynamic(_host(x2[:k]), axis=0, symmetric=True),
             rows_of=lambda r, k: r[:k * x2.shape[1]]),
        # Issue 30: the MSE search for int4 g128 scales on a (4096, 4096) weight (target:
        # >= 10 GB/s of input on an H100). The peer is the search written in torch eager
        # (20 fake-quantizations, sums by torch's reduction: not gpuq's order, so its choice
        # may differ on near ties; the mismatches are reported).
        dict(name="choose_qparams int4 g128 mse", bytes=4 * xm.numel(),
             gpuq=lambda: gpuq.choose_qparams(xm, axis=1, group_size=g, dtype="int4", method="mse"),
             eager=lambda: _eager_mse(torch, xm, g),
             host=lambda k: gpuq.choose_qparams(_host(xm[:k]), axis=1, group_size=g, dtype="int4",
                                                method="mse"),
             rows_of=lambda r, k: r[:k * (xm.shape[1] // g)]),
    ]
    if rows % b:
        return cases
    return cases + [
        dict(name="f32->fp8e4m3 block128x128", bytes=5 * n + 4 * s_blk.numel(),
             gpuq=lambda: gpuq.quantize(x, s_blk, block_size=(b, b), dtype="float8_e4m3fn",
                                        check_values=False),
             eager=lambda: torch.clamp(tiles / s_blk[:, None, :, None], -448, 448).to(
                 torch.float8_e4m3fn).reshape(rows, cols),
             host=lambda k: gpuq.quantize(_host(x[:k]), _host(s_blk[:-(-k // b)]), block_size=(b, b),
                                          dtype="float8_e4m3fn")),
        dict(name="fp8e4m3->f32 block128x128", bytes=5 * n + 4 * s_blk.numel(),
             gpuq=lambda: gpuq.dequantize(q_blk, s_blk, block_size=(b, b), check_values=False),
             eager=lambda: (q_blk.float().reshape(rows // b, b, cols // b, b)
                            * s_blk[:, None, :, None]).reshape(rows, cols),
             host=lambda k: gpuq.dequantize(_host(q_blk[:k]), _host(s_blk[:-(-k // b)]),
                                            block_size=(b, b))),
        dict(name="choose_qparams fp8 block128x128", bytes=4 * n,
             gpuq=lambda: gpuq.choose_qparams(x, block_size=(b, b), dtype="float8_e4m3fn"),
             eager=lambda: tiles.abs().amax(dim=(1, 3)) / 448,
             host=lambda k: gpuq.choose_qparams(_host(x[:b]), block_size=(b, b),
                                                dtype="float8_e4m3fn"),
             rows_of=lambda r, k: r[:cols // b]),
    ]


def _eager_dynamic(torch, x):
    s = torch.clamp_min(x.abs().amax(dim=1) / 127, float(np.finfo(np.float32).tiny))
    return torch.clamp(torch.round(x / s[:, None]), -128, 127).to(torch.int8), s


def _eager_mse(torch, x, g):
    """The MSE search in torch eager: asymmetric int4 per group of ``g``, 20 shrunken ranges,
    the first smallest error per group; the chosen scales."""
    t = x.reshape(-1, g)
    lo0, hi0 = t.amin(dim=1), t.amax(dim=1)
    best_s = best_err = None
    tiny = float(np.finfo(np.float32).tiny)
    for i in range(20):
        p = float(np.float32((100 - i) / 100))
        lo, hi = torch.clamp(lo0 * p, max=0), torch.clamp(hi0 * p, min=0)
        s = torch.clamp_min((hi - lo) / 15, tiny)
        zp = torch.clamp(-8 - torch.round(lo / s), -8, 7)
        q = torch.clamp(torch.round(t / s[:, None]) + zp[:, None], -8, 7)
        err = ((t - (q - zp[:, None]) * s[:, None]).double() ** 2).sum(dim=1)
        if best_s is None:
            best_s, best_err = s, err
        else:
            better = err < best_err
            best_s, best_err = torch.where(better, s, best_s), torch.where(better, err, best_err)
    return best_s.reshape(x.shape[0], -1)


def _first(result):
    return result[0] if isinstance(result, tuple) else result


def check_bits(case, check_rows, cols) -> str:
    """gpuq on the device against gpuq on the host over the first rows: "ok" or what differs."""
    got = case["gpuq"]()
    want = case["host"](check_rows)
    parts = list(zip(got, want)) if isinstance(got, tuple) else [(got, want)]
    for i, (g, w) in enumerate(parts):
        if g is None and w is None:
            continue
        gb, wb = _bits(g).reshape(-1), _bits(w).reshape(-1)
        if i == 0:
            gb = case.get("rows_of", lambda r, k: r[:k * cols])(gb, check_rows)
        else:
            gb = gb[:wb.size]
        if gb.shape != wb.shape or not np.array_equal(gb.view(np.uint8), wb.view(np.uint8)):
            bad = np.count_nonzero(gb != wb) if gb.shape == wb.shape else f"shape {gb.shape} vs {wb.shape}"
            return f"FAIL (part {i}: {bad} differ)"
    return "ok"


def select(cases, wanted: str) -> list:
    """The cases whose name holds one of the comma-separated parts of ``wanted`` (all if empty);
    a part that matches nothing is a ValueError (a typo must not shrink the check silently).

    >>> [c["name"] for c in select([dict(name="a b"), dict(name="c")], "b")]
    ['a b']
    """
    parts = [p.strip() for p in wanted.split(",") if p.strip()]
    if not parts:
        return list(cases)
    unknown = [p for p in parts if not any(p in c["name"] for c in cases)]
    if unknown:
        raise ValueError(f"--cases: no case name holds {unknown}; the cases: {[c['name'] for c in cases]}")
    return [c for c in cases if any(p in c["name"] for p in parts)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--rows", type=int, default=16384)
    ap.add_argument("--cols", type=int, default=16384, help="a multiple of 128")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--check-rows", type=int, default=64)
    ap.add_argument("--deadline", type=float, default=80.0, help="seconds from start: no compile after")
    ap.add_argument("--compile-cost", type=float, default=20.0, help="seconds one torch.compile may take")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--cases", default="",
                    help="comma-separated parts of case names: only the cases whose name holds one")
    ap.add_argument("--profile", action="store_true",
                    help="each case's gpuq call once, nothing timed or checked (under ncu)")
    args = ap.parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"no GPU: torch {torch.__version__} sees no CUDA device", file=sys.stderr)
        return 1
    if args.profile:
        for case in select(build_cases(torch, args.device, args.rows, args.cols), args.cases):
            case["gpuq"]()
            if args.device == "cuda":
                torch.cuda.synchronize()
            print("ran", case["name"], flush=True)
        return 0
    timer = Timer(torch, args.device, args.reps, args.rounds)
    n = args.rows * args.cols
    meta = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
            "torch": torch.__version__, "gpuq": gpuq.__version__, "numel": n,
            "shape": [args.rows, args.cols], "reps": args.reps, "rounds": args.rounds}
    src = torch.empty(n, dtype=torch.float32, device=args.device).uniform_()
    dst = torch.empty_like(src)
    t_copy = timer(lambda: dst.copy_(src))
    meta["copy_gbps"] = copy_gbps = 8 * n / t_copy / 1e9
    del src, dst
    print(f"# {meta['device']}, {n} elements ({args.rows}x{args.cols}), copy {copy_gbps:.0f} GB/s "
          f"(bytes read + written), torch {torch.__version__}", flush=True)
    rows = []

    def save():
        if args.json:
            args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")

    cases = select(build_cases(torch, args.device, args.rows, args.cols), args.cases)
    for case in cases:
        row = {"case": case["name"], "bytes": case["bytes"]}
        rows.append(row)
        try:
            row["bits"] = check_bits(case, args.check_rows, args.cols)
            ref = _first(case["gpuq"]())
            row["eager_mismatches"] = _mismatches(torch, ref, _first(case["eager"]()))
            if row["bits"] == "ok":
                for who in ("gpuq", "eager"):
                    t = timer(case[who])
                    row[f"{who}_ms"] = t * 1e3
                    row[f"{who}_gbps"] = case["bytes"] / t / 1e9
                row["pct_copy"] = 100 * row["gpuq_gbps"] / copy_gbps
                row["vs_eager"] = row["eager_ms"] / row["gpuq_ms"]
        except Exception as exc:  # noqa: BLE001 - one broken case must not cost the others
            row["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        print(_line(row), flush=True)
        save()
    if not args.no_compile:
        for case, row in zip(cases, rows):
            if "gpuq_ms" not in row:
                continue
            if _elapsed() + args.compile_cost > args.deadline:
                row["compiled"] = "skipped: deadline"
                continue
            try:
                fn = torch.compile(case["eager"], dynamic=False)
                t = time.perf_counter()
                out = _first(fn())
                row["compile_s"] = time.perf_counter() - t
                row["compiled_mismatches"] = _mismatches(torch, _first(case["gpuq"]()), out)
                tc = timer(fn)
                row["compiled_ms"] = tc * 1e3
                row["vs_compiled"] = tc * 1e3 / row["gpuq_ms"]
            except Exception as exc:  # noqa: BLE001
                row["compiled"] = f"error: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
            print(f"  compiled {row['case']}: {row.get('compiled_ms', float('nan')):.3f} ms "
                  f"(x{row.get('vs_compiled', float('nan')):.2f} gpuq; compile "
                  f"{row.get('compile_s', float('nan')):.1f} s) {row.get('compiled', '')}", flush=True)
            save()
    print(table(meta, rows))
    save()
    return 0 if all(r.get("bits") == "ok" and "error" not in r for r in rows) else 1


def _line(row) -> str:
    if "error" in row:
        return f"{row['case']:<26} ERROR {row['error']}"
    if "gpuq_ms" not in row:
        return f"{row['case']:<26} bits {row.get('bits')}: not timed"
    return (f"{row['case']:<26} bits {row['bits']}  gpuq {row['gpuq_ms']:.3f} ms {row['gpuq_gbps']:.0f} GB/s "
            f"({row['pct_copy']:.0f}% copy)  eager {row['eager_ms']:.3f} ms (x{row['vs_eager']:.2f}), "
            f"eager mismatches {row['eager_mismatches']}")


def table(meta, rows) -> str:
    """The Markdown table bench/NOTES.md keeps."""
    out = [f"{meta['device']}, {meta['numel']} elements, copy {meta['copy_gbps']:.0f} GB/s",
           "", "| case | bits | gpuq ms | GB/s | % copy | eager ms | compiled ms | eager/gpuq | compiled/gpuq |",
           "|---|---|---|---|---|---|---|---|---|"]
    f = lambda v, p=3: "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{p}f}"  # noqa: E731
    for r in rows:
        out.append(f"| {r['case']} | {r.get('bits', r.get('error', '?'))} | {f(r.get('gpuq_ms'))} | "
                   f"{f(r.get('gpuq_gbps'), 0)} | {f(r.get('pct_copy'), 0)} | {f(r.get('eager_ms'))} | "
                   f"{f(r.get('compiled_ms'))} | {f(r.get('vs_eager'), 2)} | {f(r.get('vs_compiled'), 2)} |")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
