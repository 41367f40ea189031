#!/usr/bin/env python3
"""Issue 16 section 4 on the GPU: gpuq on torch bfloat16 tensors against torch eager and torch.compile.

**Written, never run on a GPU: no task so far had one.** Run in a GPU session
(``bash bench/gpu_session.sh bf16``, or ``python -m bench.gpu_bf16 [--quick]``);
``--device cpu`` runs the same cases on CPU tensors (the bit check of the
expressions; its times are not the point).

Cases (bfloat16 input, int8 codes with zero points, and back to bfloat16):
per-tensor ``(n / 4096, 4096)``, per-row (axis 0 of the same activation) and
per-group 128 along the last axis. Contenders, all on the same torch tensors:

* ``gpuq``: ``gpuq.quantize`` / ``gpuq.dequantize(dtype="bfloat16")`` (device
  scales/zps, ``check_values=False``; the work runs on torch's current stream);
* ``torch eager``: the contract in torch ops: ``x.float() / s`` (one IEEE
  division), ``torch.round`` (half to even), ``+ zp``, ``clamp``,
  ``.to(torch.int8)``; back ``((q.int() - zp).float() * s).to(torch.bfloat16)``;
* ``torch compile``: the same functions under ``torch.compile`` (Triton's fp32
  division may be approximate: a mismatch is reported, not hidden).

Every output is compared bit for bit with gpuq's host result for the same
input before timing. Times: the median of ``--reps`` runs between CUDA events
(``time.perf_counter`` on the CPU), after a warm-up; effective GB/s counts
the bytes read and written once. Prints one table and writes JSON to
``--out`` (default ``$OUT`` or bench/results) as ``bench_cuda_bf16_*.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

GROUP = 128


def _torch():
    import torch

    return torch


def make_case(torch, scheme, n, device, seed=0):
    """``(x, scales, zps, kwargs)`` for one scheme: x bfloat16 ``(n / 4096, 4096)``."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    rows = max(1, n // 4096)
    x = (torch.randn(rows, 4096, generator=g) * 3).to(torch.bfloat16).to(device)
    if scheme == "tensor":
        pshape, kw = (), dict(axis=None)
    elif scheme == "row":
        pshape, kw = (rows,), dict(axis=0)
    else:
        pshape, kw = (rows, 4096 // GROUP), dict(axis=1, group_size=GROUP)
    s = (torch.rand(pshape, generator=g) * 0.05 + 0.01).to(device)
    z = torch.randint(-20, 20, pshape, generator=g, dtype=torch.int32).to(device)
    return x, s, z, kw


def _expand(t, x_shape, kw):
    """Parameters broadcast to x's shape for the eager expressions."""
    if kw.get("axis") is None:
        return t
    if kw.get("group_size"):
        return t.repeat_interleave(GROUP, dim=1)
    return t.reshape(-1, 1)


def eager_quantize(x, s, z, kw):
    torch = _torch()
    q = torch.round(x.float() / _expand(s, x.shape, kw)) + _expand(z, x.shape, kw).float()
    return q.clamp(-128, 127).to(torch.int8)


def eager_dequantize(q, s, z, kw):
    torch = _torch()
    d = (q.int() - _expand(z, q.shape, kw)).float() * _expand(s, q.shape, kw)
    return d.to(torch.bfloat16)


def _bits(t):
    torch = _torch()
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy()
    return t.numpy()


def _timer(torch, device):
    if device == "cuda":
        def run(fn, reps):
            times = []
            for _ in range(reps):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b) * 1e-3)
            return statistics.median(times)
    else:
        def run(fn, reps):
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            return statistics.median(times)
    return run


def run(device="cuda", sizes=(16 << 20, 64 << 20), reps=20, out_dir=None, compile=True):
    """The rows; ``compile=False`` leaves the torch.compile contender out (on the CPU its
    inductor build takes a minute and proves nothing about the GPU)."""
    import gpuq

    torch = _torch()
    timer = _timer(torch, device)
    try:
        if not compile:
            raise RuntimeError("left out (compile=False)")
        compiled_q, compiled_dq = torch.compile(eager_quantize), torch.compile(eager_dequantize)
    except Exception as exc:  # no Triton / no compiler: say so in the rows
        compiled_q = compiled_dq = None
        compile_reason = f"{type(exc).__name__}: {exc}"
    rows = []
    for n in sizes:
        for scheme in ("tensor", "row", "group128"):
            x, s, z, kw = make_case(torch, scheme, n, device)
            s_host, z_host = s.cpu().numpy(), z.cpu().numpy()
            want_q = gpuq.quantize(x.cpu(), s_host, z_host, **kw)  # the host backend: the reference
            want_y = gpuq.dequantize(want_q, s_host, z_host, dtype="bfloat16", **kw)
            q_dev = gpuq.quantize(x, s, z, check_values=False, **kw)
            contenders = {
                "gpuq": (lambda: gpuq.quantize(x, s, z, check_values=False, **kw),
                         lambda: gpuq.dequantize(q_dev, s, z, dtype="bfloat16", check_values=False, **kw)),
                "torch eager": (lambda: eager_quantize(x, s, z, kw), lambda: eager_dequantize(q_dev, s, z, kw)),
            }
            if compiled_q is not None:
                contenders["torch compile"] = (lambda: compiled_q(x, s, z, kw), lambda: compiled_dq(q_dev, s, z, kw))
            nbytes = {"quantize": x.numel() * 3, "dequantize": x.numel() * 3}
            for name, (fq, fdq) in contenders.items():
                for op, fn, want in (("quantize", fq, want_q), ("dequantize", fdq, want_y)):
                    row = dict(size=n, scheme=scheme, op=op, contender=name)
                    try:
                        got = fn()
                        mism = int((_bits(got) != _bits(torch.as_tensor(want) if not isinstance(want, torch.Tensor)
                                                          else want)).sum())
                        fn()  # warm-up
                        t = timer(fn, reps)
                        row.update(ms=t * 1e3, gbps=nbytes[op] / t / 1e9, mismatches=mism)
                    except Exception as exc:
                        row.update(error=f"{type(exc).__name__}: {exc}"[:200])
                    rows.append(row)
                    print(_line(row), flush=True)
    if compiled_q is None:
        print(f"torch compile: n/a ({compile_reason})")
    stamp = dict(suite="bf16", device=device, torch=torch.__version__, gpuq=gpuq.__version__,
                 gpu=torch.cuda.get_device_name() if device == "cuda" else "cpu",
                 date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), commit=os.environ.get("GPUQ_COMMIT", ""))
    out_dir = out_dir or os.environ.get("OUT") or os.path.join(os.path.dirname(__file__), "results")
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"bench_{device}_bf16_{stamp['date'].replace(':', '')}.json")
    with open(path, "w") as f:
        json.dump(dict(stamp=stamp, rows=rows), f, indent=1)
    print("wrote", path)
    return rows


def _line(row):
    head = f"{row['op']:<10} {row['scheme']:<8} {row['size'] >> 20:>4}M  {row['contender']:<14}"
    if "error" in row:
        return f"{head} error: {row['error']}"
    return f"{head} {row['ms']:9.3f} ms {row['gbps']:8.1f} GB/s  mismatches {row['mismatches']}"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--quick", action="store_true", help="one small size, few reps (the bit check)")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    sizes = (1 << 16,) if a.quick else (16 << 20, 64 << 20)
    rows = run(a.device, sizes, 3 if a.quick else a.reps, a.out)
    bad = [r for r in rows if r["contender"] == "gpuq" and r.get("mismatches", 1) != 0]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
