#!/usr/bin/env python3
"""Issue 19 on the GPU: fp8 e4m3fn activations and int4 g128 weights on torch CUDA tensors.

**Written, never run: no task so far had a GPU.** Run in a GPU session
(``bash bench/gpu_session.sh formats``, or ``python -m bench.gpu_formats [--quick]``).

The cases are ``bench.cases.format_cases`` (int4/uint4 per-group 128 weights
``(n / 4096, 4096)`` incl. the ``(4096, 4096)`` one; fp8 e4m3fn per-tensor
``(n / 1024, 1024)`` and per-row ``(T, 4096)`` activations; quantize and
dequantize), at ``--sizes`` (default 16M and 256M: the issue's weight and the
>= 64M targets of shared/DESIGN.md section 6). Every contender reads and writes
torch CUDA tensors:

* ``gpuq`` / ``gpuq out=``: ``gpuq.quantize``/``dequantize`` on the torch tensors
  (fp8 results are torch fp8 tensors, int4 a ``gpuq.Codes`` of a torch uint8
  tensor); per-tensor scales as a Python float, other scales/zps as device
  tensors with ``check_values=False`` (as the main GPU run does);
* ``torch eager``: the issue's ``x.div(s).to(torch.float8_e4m3fn)`` and
  ``q.to(torch.float32).mul(s)``; for int4 ``clamp(round(x / s) + zp)`` and
  nibble packing ``(q[0::2] & 15) | (q[1::2] << 4)`` (unpack, sign-extend,
  ``(q - zp) * s`` back);
* ``torch compile``: the same functions under ``torch.compile`` (Triton; its fp32
  division may be approximate and its fp8 cast saturating: mismatches are
  reported, not hidden);
* ``torchao`` where installed: ``_quantize_affine_float8`` /
  ``_dequantize_affine_float8`` for fp8, ``quantize_affine`` /
  ``dequantize_affine`` (unpacked int8, then the same packing) for int4;
  ``n/a`` with the reason where the installed version lacks them.

Timing, rotation past L2 and the spin that hides Python's dispatch are the
main GPU run's (``bench.timing.time_gpu`` with torch events); the copy limit is a
1 GiB ``Tensor.copy_``. Every output is compared bit for bit (``data.as_bits``)
with gpuq's result on the host backend for the same input, so the ``gpuq`` rows
also check that the CUDA kernels and the host loops agree. Results go where the
main run's go (``--out``, default ``$OUT`` or bench/results): ``bench_cuda_*``
JSON/table/PNG with ``"suite": "formats"`` in the stamp.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import numpy as np

if __package__ in (None, ""):  # run as a script: python bench/gpu_formats.py
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    __package__ = "bench"

from . import cases as C  # noqa: E402
from . import data, report  # noqa: E402
from .contenders import NotApplicable, Prepared  # noqa: E402
from .peers_cpu import pack_nibbles  # noqa: E402,F401  (the host form of the packing below)
from .runner import GPU_ROTATE_BYTES, MAX_BUFFERS, log_stderr, run_case  # noqa: E402


def _torch():
    import torch

    return torch


def torch_fp8(torch, name):
    return {"float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}[name]


def to_device(case, host, torch, dev):
    """A host input of ``case`` (``data.host_input``) as torch on ``dev``: floats, a torch fp8
    tensor, or a ``gpuq.Codes`` holding a torch uint8 tensor (int4/uint4)."""
    import gpuq

    if case.op == "quantize":
        return torch.from_numpy(np.ascontiguousarray(host)).to(dev)
    if case.qdtype in C.INT4_TYPES:
        return gpuq.Codes(torch.from_numpy(host.data).to(dev), host.shape, host.dtype)
    return torch.from_numpy(host.view(np.uint8)).to(dev).view(torch_fp8(torch, case.qdtype))


def _to_host(t):
    return t.cpu().numpy() if hasattr(t, "cpu") else np.asarray(t)


def _fetch(r):
    return data.as_bits(r, _to_host)


def _params(case, scales, zps, torch, dev, python_scalars=True):
    """(s, z) for the torch expressions: per-tensor as Python numbers, else device tensors
    broadcastable against ``case.view_shape()``."""
    if case.scheme == "tensor" and python_scalars:
        return float(scales.reshape(-1)[0]), (None if zps is None else int(zps.reshape(-1)[0]))
    s = torch.from_numpy(scales.reshape(case.bcast_shape())).to(dev)
    z = None if zps is None else torch.from_numpy(zps.astype(np.float32).reshape(case.bcast_shape())).to(dev)
    return s, z


class GpuqTorch:
    """gpuq on torch CUDA tensors (fresh output, or ``out=`` preallocated and written once)."""

    is_peer = False
    timer = "torch"

    def __init__(self, out=False):
        self.use_out = out
        self.name = "gpuq out=" if out else "gpuq"

    def prepare(self, case, inputs, scales, zps):
        import gpuq

        torch = _torch()
        dev = inputs[0].data.device if isinstance(inputs[0], gpuq.Codes) else inputs[0].device
        fn = data.gpuq_fn(case)
        kw = data.gpuq_kwargs(case)
        if case.scheme == "tensor":
            s, z = float(scales.reshape(-1)[0]), (None if zps is None else int(zps.reshape(-1)[0]))
        else:
            s = torch.from_numpy(scales).to(dev)
            z = None if zps is None else torch.from_numpy(zps).to(dev)
            kw["check_values"] = False
        if self.use_out:
            if case.op == "dequantize":
                out = torch.ones(case.shape(), dtype=getattr(torch, case.fdtype), device=dev)
            elif case.qdtype in C.INT4_TYPES:
                out = gpuq.Codes(torch.ones(case.code_nbytes(), dtype=torch.uint8, device=dev),
                                 case.shape(), case.qdtype)
            else:
                out = torch.ones(case.shape(), dtype=torch.float32, device=dev).to(torch_fp8(torch, case.qdtype))
            kw["out"] = out
        return Prepared(lambda i: fn(inputs[i % len(inputs)], s, z, **kw), _fetch)


def _int4_funcs(case, torch):
    """Eager torch int4: quantize + pack, unpack + dequantize (flattened C order, ONNX nibbles)."""
    signed = case.qdtype == "int4"
    qmin, qmax = (-8, 7) if signed else (0, 15)
    view, n = case.view_shape(), case.numel()

    def quantize(x, s, z):
        t = torch.round(x.view(view) / s)
        if z is not None:
            t = t + z
        q = torch.clamp(t, qmin, qmax).to(torch.int8 if signed else torch.uint8).view(torch.uint8).reshape(-1)
        if n % 2:
            q = torch.cat([q, q.new_zeros(1)])
        return (q[0::2] & 15) | (q[1::2] << 4)

    def dequantize(b, s, z):
        v = torch.stack([b & 15, b >> 4], dim=-1).reshape(-1)[:n]
        v = ((v.view(torch.int8) ^ 8) - 8) if signed else v
        t = v.to(torch.float32).view(view)
        if z is not None:
            t = t - z
        return (t * s).reshape(case.shape())

    return quantize, dequantize


def _fp8_funcs(case, torch):
    f8 = torch_fp8(torch, case.qdtype)
    view = case.view_shape()

    def quantize(x, s, z):
        return x.view(view).div(s).to(f8)  # the expression (non-saturating; inputs stay in range)

    def dequantize(q, s, z):
        return q.view(view).to(torch.float32).mul(s)

    return quantize, dequantize


class TorchFormats:
    """The torch expressions of the module docstring, eager or under ``torch.compile``."""

    is_peer = True
    timer = "torch"

    def __init__(self, compiled=False):
        self.torch = _torch()
        self.compiled = compiled
        self.name = "torch compile" if compiled else "torch eager"
        self._cache = {}

    def prepare(self, case, inputs, scales, zps):
        import gpuq

        torch = self.torch
        q_fn, dq_fn = (_int4_funcs if case.qdtype in C.INT4_TYPES else _fp8_funcs)(case, torch)
        fn = q_fn if case.op == "quantize" else dq_fn
        if self.compiled:
            fn = torch.compile(fn, dynamic=False)
        xs = [x.data if isinstance(x, gpuq.Codes) else x for x in inputs]
        s, z = _params(case, scales, zps, torch, xs[0].device, python_scalars=not self.compiled)
        return Prepared(lambda i: fn(xs[i % len(xs)], s, z), _fetch)


class TorchAO:
    """torchao's primitives (where installed): fp8 affine float8, int4 ``quantize_affine`` + packing."""

    name = "torchao"
    is_peer = True
    timer = "torch"

    def __init__(self):
        self.torch = _torch()
        import torchao.quantization.quant_primitives as qp

        self.qp = qp

    def prepare(self, case, inputs, scales, zps):
        import gpuq

        torch, qp = self.torch, self.qp
        xs = [x.data if isinstance(x, gpuq.Codes) else x for x in inputs]
        dev = xs[0].device
        shape = case.shape()
        if case.qdtype in C.FP8_TYPES:
            names = ("_quantize_affine_float8", "_dequantize_affine_float8")
            if not all(hasattr(qp, n) for n in names):
                raise NotApplicable("this torchao has no _quantize_affine_float8/_dequantize_affine_float8")
            f8 = torch_fp8(torch, case.qdtype)
            # one scale per tensor, or per row: (T, 1) for (T, 4096) with axis 0
            s = torch.from_numpy(scales.reshape(case.bcast_shape())).to(dev)
            if case.op == "quantize":
                run = lambda i: qp._quantize_affine_float8(xs[i % len(xs)], s, f8)  # noqa: E731
            else:
                run = lambda i: qp._dequantize_affine_float8(xs[i % len(xs)], s, torch.float32)  # noqa: E731
            return Prepared(run, _fetch)
        if not hasattr(qp, "quantize_affine"):
            raise NotApplicable("this torchao has no quantize_affine")
        signed = case.qdtype == "int4"
        qmin, qmax = (-8, 7) if signed else (0, 15)
        block = (1, C.GROUP)
        s = torch.from_numpy(scales).to(dev)
        z = torch.from_numpy(zps if zps is not None else np.zeros(scales.shape, np.int32)).to(dev)
        qdt = torch.int8 if signed else torch.uint8
        if case.op == "quantize":
            def run(i):
                q = qp.quantize_affine(xs[i % len(xs)], block, s, z, qdt, qmin, qmax)
                f = q.view(torch.uint8).reshape(-1)
                return (f[0::2] & 15) | (f[1::2] << 4)
        else:
            n = case.numel()

            def run(i):
                b = xs[i % len(xs)]
                v = torch.stack([b & 15, b >> 4], dim=-1).reshape(-1)[:n]
                v = (((v.view(torch.int8) ^ 8) - 8) if signed else v).view(shape)
                return qp.dequantize_affine(v, block, s, z, qdt, qmin, qmax, output_dtype=torch.float32)
        return Prepared(run, _fetch)


def torch_copy_gbps(torch, dev, nbytes=1 << 30) -> dict:
    from .timing import TorchEvents, time_gpu

    src = torch.randn(nbytes // 4, device=dev)
    dst = torch.empty_like(src)
    t = time_gpu(lambda i: dst.copy_(src), TorchEvents(torch), reps=30, warmup=3)
    return {"bytes": 2 * nbytes, "gbps": 2 * nbytes / t["median_s"] / 1e9}


def peers(torch):
    """The torch contenders here, and ``(name, reason)`` for those that are not."""
    out, missing = [TorchFormats(False), TorchFormats(True)], []
    try:
        out.append(TorchAO())
    except ImportError as exc:
        missing.append(("torchao", f"not installed ({exc.name})"))
    return out, missing


def run(argv=None, log=log_stderr) -> dict:
    p = argparse.ArgumentParser(prog="python -m bench.gpu_formats", description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="16M,256M")
    p.add_argument("--quick", action="store_true", help="1M elements, 10 repetitions")
    p.add_argument("--reps", type=int, default=None)
    p.add_argument("--cases", default=None, help="comma-separated substrings of case names")
    p.add_argument("--out", default=os.environ.get("OUT") or os.path.join(os.path.dirname(
        os.path.abspath(__file__)), "results"))
    p.add_argument("--no-plot", action="store_true")
    args = p.parse_args(argv)
    torch = _torch()
    from .timing import TorchEvents, time_gpu

    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device seen by torch")
    dev = torch.device("cuda", 0)
    sizes = [1 << 20] if args.quick else [C.parse_size(s) for s in args.sizes.split(",")]
    cs, seen = [], set()
    for n in sizes:
        for c in C.format_cases(n):
            if c.name not in seen:
                seen.add(c.name)
                cs.append(c)
    if args.cases:
        keys = [k for k in args.cases.split(",") if k]
        cs = [c for c in cs if any(k in c.name for k in keys)]
    copy = torch_copy_gbps(torch, dev)
    name = torch.cuda.get_device_name(dev)
    log(f"device copy: {copy['gbps']:.1f} GB/s on {name}")
    st = report.stamp("cuda", name, 1, {"copy": copy, "suite": "formats",
                                       "torch": torch.__version__})
    contenders_peers, missing = peers(torch)
    own = [GpuqTorch(False), GpuqTorch(True)]
    ev = TorchEvents(torch)
    reps = args.reps or (10 if args.quick else 50)
    rows = []
    for case in cs:
        in_bytes = case.numel() * case.float_dtype.itemsize if case.op == "quantize" else case.code_nbytes()
        nbuf = max(1, min(MAX_BUFFERS, math.ceil(GPU_ROTATE_BYTES / max(1, in_bytes))))
        hosts = [data.host_input(case, seed=k) for k in range(nbuf)]
        scales, zps = data.host_params(case)
        ref = data.reference(case, hosts[0], scales, zps)  # gpuq's host backend: the oracle
        inputs = [to_device(case, h, torch, dev) for h in hosts]
        del hosts
        rows += run_case(case, own + contenders_peers, inputs, scales, zps, ref,
                         lambda c, fn: time_gpu(fn, ev, reps=reps), copy["gbps"], log)
        del inputs, ref
        torch.cuda.empty_cache()
    st["missing_peers"] = missing
    st["quick"] = bool(args.quick)
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, report.file_stem(st) + "_formats")
    text = report.table(st, rows)
    with open(stem + ".txt", "w") as f:
        f.write(text + "\n")
    report.write_json(stem + ".json", st, rows)
    png_note = "--no-plot" if args.no_plot else report.write_png(stem + ".png", st, rows)
    print(text)
    print(f"\nwrote {stem}.json, .txt" + ("" if png_note else ", .png"))
    return {"rows": rows, "stamp": st, "stem": stem}


def main(argv=None) -> int:
    run(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
