"""GPU peers: PyTorch quantized tensors, an eager torch expression, a naive CuPy
expression, and a one-pass CuPy ``ElementwiseKernel``.

Inputs are CuPy arrays; torch sees the same memory through DLPack (no copy).
CuPy and torch are imported only when a GPU run builds these peers, so this
module imports on a machine without either.

Issue-5 cases (``dynamic``/``qparams``): the eager torch expression
(``torch.aminmax`` per block, gpuq's formula in float32, then the eager
quantize), the naive CuPy expression (``x.min``/``x.max`` per block, the
same formula, the naive quantize), and ``torch.quantize_per_tensor_dynamic``
where torch accepts a CUDA tensor (otherwise an ``n/a`` row says why). The
one-pass ``ElementwiseKernel`` has no reduction: ``n/a``.
"""

from __future__ import annotations

import numpy as np

from .cases import DYNAMIC_OPS
from .contenders import NotApplicable, Prepared
from .peers_cpu import EPS, TorchQuantized, _zps_or_zero, naive_dynamic, parts, reduced_axes


def _bcast(case, a, xp):
    return xp.asarray(a).reshape(case.bcast_shape())


class TorchQuantizedCuda(TorchQuantized):
    """``torch.quantize_per_tensor``/``per_channel``/``dequantize`` on the CUDA device."""

    name = "torch"
    timer = "torch"

    def __init__(self, threads):
        super().__init__(threads, device="cuda")

    def prepare(self, case, inputs, scales, zps):
        # torch's CUDA coverage of quantized tensors is partial (e.g. float16 input,
        # _make_per_channel_quantized_tensor outside the base class's try): a refusal is n/a
        # with torch's reason, never an error row or a crash.
        try:
            return super().prepare(case, inputs, scales, zps)
        except NotApplicable:
            raise
        except Exception as exc:
            msg = str(exc).splitlines()[0][:120] if str(exc) else ""
            raise NotApplicable(f"torch refused on CUDA: {type(exc).__name__}: {msg}") from None


class TorchEager:
    """``torch.clamp(torch.round(x / s) + zp, qmin, qmax).to(q)`` and ``((q.float() - zp) * s)``."""

    name = "torch eager"
    is_peer = True
    timer = "torch"

    def __init__(self, threads):
        import torch

        self.torch = torch

    def _prepare_dynamic(self, case, inputs):
        torch = self.torch
        ax = reduced_axes(case)
        xs = [torch.from_dlpack(x.reshape(case.view_shape())) for x in inputs]
        bshape, pshape, shape = case.bcast_shape(), case.param_shape(), case.shape()
        info = np.iinfo(case.qdtype)
        qd = getattr(torch, case.qdtype)
        sym = not case.zps

        def qparams(x):
            lo, hi = torch.aminmax(x) if ax is None else torch.aminmax(x, dim=ax)
            if sym:
                amax = torch.clamp_min(torch.maximum(hi, -lo), 0.0)
                s = torch.clamp_min(amax / 127.0, EPS)
                z = None if info.min < 0 else torch.full(s.shape, 128, dtype=torch.int32, device=s.device)
            else:
                lo0, hi0 = torch.clamp_max(lo, 0.0), torch.clamp_min(hi, 0.0)
                s = torch.clamp_min((hi0 - lo0) / float(info.max - info.min), EPS)
                z = torch.clamp(info.min - torch.round(lo0 / s), info.min, info.max).to(torch.int32)
            return s.reshape(pshape), (None if z is None else z.reshape(pshape))

        if case.op == "qparams":
            run = lambda i: qparams(xs[i % len(xs)])  # noqa: E731
        else:
            def run(i):
                x = xs[i % len(xs)]
                s, z = qparams(x)
                t = torch.round(x / s.reshape(bshape))
                if z is not None:
                    t = t + z.reshape(bshape).float()
                return torch.clamp(t, info.min, info.max).to(qd).reshape(shape), s, z
        return Prepared(run, lambda r: parts(case, r, lambda t: t.cpu().numpy()))

    def prepare(self, case, inputs, scales, zps):
        torch = self.torch
        if case.op in DYNAMIC_OPS:
            return self._prepare_dynamic(case, inputs)
        xs = [torch.from_dlpack(x.reshape(case.view_shape())) for x in inputs]
        dev = xs[0].device
        s = torch.from_numpy(scales.reshape(case.bcast_shape())).to(dev)
        z = None if zps is None else torch.from_numpy(zps.astype(np.float32).reshape(case.bcast_shape())).to(dev)
        shape = case.shape()
        if case.op == "quantize":
            info = np.iinfo(case.qdtype)
            qd = getattr(torch, case.qdtype)

            def run(i):
                t = torch.round(xs[i % len(xs)].float() / s)
                if z is not None:
                    t = t + z
                return torch.clamp(t, info.min, info.max).to(qd).reshape(shape)
        else:
            fd = getattr(torch, case.fdtype)

            def run(i):
                t = xs[i % len(xs)].float()
                if z is not None:
                    t = t - z
                return (t * s).to(fd).reshape(shape)
        return Prepared(run, lambda r: r.cpu().numpy())


class CupyNaive:
    """``cp.clip(cp.rint(x / s) + zp, qmin, qmax).astype(q)``: one kernel per ufunc, full-size temporaries."""

    name = "cupy naive"
    is_peer = True
    timer = "cupy"

    def __init__(self, threads):
        import cupy

        self.cp = cupy

    def prepare(self, case, inputs, scales, zps):
        cp = self.cp
        if case.op in DYNAMIC_OPS:
            return naive_dynamic(case, inputs, cp, cp.asnumpy)
        s = _bcast(case, scales, cp)
        z = None if zps is None else _bcast(case, zps.astype(np.float32), cp)
        xs = [x.reshape(case.view_shape()) for x in inputs]
        shape = case.shape()
        if case.op == "quantize":
            info = np.iinfo(case.qdtype)

            def run(i):
                t = cp.rint(xs[i % len(xs)] / s)
                if z is not None:
                    t = t + z
                return cp.clip(t, info.min, info.max).astype(case.qdtype).reshape(shape)
        else:
            def run(i):
                t = xs[i % len(xs)].astype(cp.float32)
                if z is not None:
                    t = t - z
                return (t * s).astype(case.fdtype).reshape(shape)
        return Prepared(run, cp.asnumpy)


_Q_BODY = """
float r = rintf((float)x / s);
r = fminf(fmaxf(r, -1073741824.0f), 1073741824.0f);
long long v = (long long)r + (long long)zp;
v = v < QMIN ? QMIN : (v > QMAX ? QMAX : v);
y = (Q)v;
"""
_DQ_BODY = "y = (F)((float)((long long)q - (long long)zp) * s);"
_EW_OPTIONS = ("-ftz=false", "-prec-div=true", "-fmad=false")


class CupyElementwise:
    """One-pass ``cupy.ElementwiseKernel`` (broadcast scales): what a CuPy user would hand-write."""

    name = "cupy elementwise"
    is_peer = True
    timer = "cupy"

    def __init__(self, threads):
        import cupy

        self.cp = cupy
        self._kernels = {}

    def _kernel(self, case):
        cp = self.cp
        key = (case.op, case.fdtype, case.qdtype)
        if key not in self._kernels:
            info = np.iinfo(case.qdtype)
            # Parameter lists take NumPy dtype names (CuPy's ParameterInfo rejects C spellings
            # such as "float" or "signed char"); the body casts with C type names.
            ctype = {"int8": "signed char", "uint8": "unsigned char"}[case.qdtype]
            ftype = {"float32": "float", "float16": "float16"}[case.fdtype]
            if case.op == "quantize":
                body = (_Q_BODY.replace("QMIN", f"{info.min}LL").replace("QMAX", f"{info.max}LL")
                        .replace("(Q)", f"({ctype})"))
                k = cp.ElementwiseKernel(f"{case.fdtype} x, float32 s, int32 zp", f"{case.qdtype} y", body,
                                         f"bench_q_{case.fdtype}_{case.qdtype}", options=_EW_OPTIONS)
            else:
                body = _DQ_BODY.replace("(F)", f"({ftype})")
                k = cp.ElementwiseKernel(f"{case.qdtype} q, float32 s, int32 zp", f"{case.fdtype} y", body,
                                         f"bench_dq_{case.fdtype}_{case.qdtype}", options=_EW_OPTIONS)
            self._kernels[key] = k
        return self._kernels[key]

    def prepare(self, case, inputs, scales, zps):
        cp = self.cp
        if case.op in DYNAMIC_OPS:
            raise NotApplicable("an ElementwiseKernel has no reduction (qparams need one)")
        if case.fdtype == "float64":
            raise NotApplicable("float64 not wired in this peer")
        k = self._kernel(case)
        s = _bcast(case, scales, cp)
        z = _bcast(case, _zps_or_zero(case, zps).astype(np.int32), cp)
        xs = [x.reshape(case.view_shape()) for x in inputs]
        shape = case.shape()
        dt = case.qdtype if case.op == "quantize" else case.fdtype
        outs = [cp.empty(case.view_shape(), dt)]
        return Prepared(lambda i: k(xs[i % len(xs)], s, z, outs[0]).reshape(shape), cp.asnumpy)


def gpu_peers(threads):
    """The GPU peers that import here, and ``(name, reason)`` for those that do not."""
    peers, missing = [], []
    for cls in (TorchQuantizedCuda, TorchEager, CupyNaive, CupyElementwise):
        try:
            peer = cls(threads)
        except ImportError as exc:
            missing.append((cls.name, f"not installed ({exc.name})"))
            continue
        torch = getattr(peer, "torch", None)
        if torch is not None and not torch.cuda.is_available():
            # A CPU-only torch build: every CUDA call (from_dlpack of a CuPy array, CUDA events) fails.
            missing.append((cls.name, f"torch {torch.__version__} has no CUDA"))
            continue
        peers.append(peer)
    return peers, missing
