#!/usr/bin/env python3
"""The GPU users' checks that need real torch tensors on a real GPU (issue 16).

Run in the GPU session (``bash bench/gpu_session.sh torch``); each check prints
one line ``ok <name>`` or ``FAIL <name>: why``, and the exit status is the number
of failures. Without a GPU the CPU execution of the kernels covers the same
rules with a stand-in for torch (tests/test_interop.py); this is the real thing:

* torch in, torch out, zero copy, on the tensor's device; bfloat16 tensors (DLPack);
* the work runs on torch's current stream: a side stream whose producer kernel
  is still running when gpuq is called (a spin in front of the write);
* ``nn.Parameter`` (requires_grad) is accepted and left untouched;
* device parameters with ``check_values=False`` inside ``torch.cuda.graph``
  capture, replayed;
* a second GPU, when there is one: src on device 1 while device 0 is current;
* gpuq's registered torch ops (issue 31, ``gpuq.torch``) on CUDA tensors: the
  eager call's and the host's bits (block scales too); captured in a CUDA graph and replayed;
  ``torch.compile(fullgraph=True)`` over the public functions (one graph, no
  break), on torch's current stream; ``opcheck``; ``torch.export``; and, last,
  ``torch.compile(mode="reduce-overhead")`` (inductor's CUDA graphs).

The checks print as they finish, most important first: a step killed at its time
limit keeps every line before it.
"""

from __future__ import annotations

import sys
import traceback

import numpy as np

import gpuq

_failures = 0


def check(fn):
    global _failures
    try:
        fn()
        print(f"ok   {fn.__name__}", flush=True)
    except Exception:  # noqa: BLE001  (report every check, then exit with the count)
        _failures += 1
        print(f"FAIL {fn.__name__}: {traceback.format_exc(limit=3)}", flush=True)
    return fn


def _bits(a):
    """Type, dtype name, shape and raw bytes of a torch tensor (any device), a NumPy array or a
    gpuq.Codes: equal exactly when the bits are (no tolerance)."""
    import torch

    if isinstance(a, gpuq.Codes):
        return ("codes", a.dtype, tuple(a.shape), _bits(a.data)[3])
    if isinstance(a, torch.Tensor):
        t = a.detach().cpu().contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes()
        return ("array", str(t.dtype).rpartition(".")[2], tuple(t.shape), raw)
    a = np.asarray(a)
    return ("array", a.dtype.name, a.shape, a.tobytes())


def _same(got, want):
    if isinstance(want, (tuple, list)):
        assert len(got) == len(want), (len(got), len(want))
        for g, w in zip(got, want):
            _same(g, w)
    elif want is None:
        assert got is None
    else:
        assert _bits(got) == _bits(want), (_bits(got)[:3], _bits(want)[:3])


def _to_host(r):
    """A result on the GPU as the NumPy call gives it (bfloat16/fp8 as ml_dtypes arrays)."""
    import torch

    if isinstance(r, (tuple, list)):
        return type(r)(_to_host(x) for x in r)
    if isinstance(r, gpuq.Codes):
        return gpuq.Codes(r.data.cpu().numpy(), r.shape, r.dtype)
    if r is None:
        return None
    name = str(r.dtype).rpartition(".")[2]
    t = r.detach().cpu()
    if name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        import ml_dtypes

        bits = t.view(torch.int16 if name == "bfloat16" else torch.uint8).numpy()
        return bits.view(getattr(ml_dtypes, name))
    return t.numpy()


def _every_code_type(x, xb, s10, s63, z63):
    """int8 with a zero point, fp8 per channel, int4 per group, bfloat16 in and out, dynamic
    quantization: one body for torch (eager or compiled) and NumPy arrays alike."""
    q8 = gpuq.quantize(x, 0.05, 3)
    f8 = gpuq.quantize(x, s10, axis=1, dtype="float8_e4m3fn")
    c4 = gpuq.quantize(xb, s63, z63, axis=1, group_size=4, dtype="int4", check_values=False)
    qd, sd, zd = gpuq.quantize_dynamic(x, axis=0)
    return (q8, f8, c4, qd, sd, zd, gpuq.dequantize(q8, 0.05, 3, dtype="bfloat16"),
            gpuq.dequantize(f8, s10, axis=1),
            gpuq.dequantize(c4, s63, z63, axis=1, group_size=4, dtype="f16"),
            gpuq.dequantize(qd, sd, zd, axis=0, dtype="bfloat16"))


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print("FAIL no CUDA device seen by torch")
        return 1
    dev = torch.device("cuda", 0)
    x = torch.randn(1 << 20, device=dev) * 30

    @check
    def torch_in_torch_out():
        q = gpuq.quantize(x, 0.25, 3)
        assert isinstance(q, torch.Tensor) and q.device == x.device and q.dtype == torch.int8
        assert np.array_equal(q.cpu().numpy(), gpuq.quantize(x.cpu().numpy(), 0.25, 3))
        y = gpuq.dequantize(q, 0.25, 3)
        assert isinstance(y, torch.Tensor) and y.dtype == torch.float32

    @check
    def bfloat16_tensors():
        import ml_dtypes

        xb = x.to(torch.bfloat16)
        q = gpuq.quantize(xb, 0.25, 3)
        host = xb.cpu().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        assert isinstance(q, torch.Tensor) and np.array_equal(q.cpu().numpy(), gpuq.quantize(host, 0.25, 3))
        y = gpuq.dequantize(q, 0.25, 3, dtype="bfloat16")
        assert y.dtype == torch.bfloat16
        want = gpuq.dequantize(q.cpu().numpy(), 0.25, 3, dtype="bfloat16")
        assert np.array_equal(y.cpu().view(torch.int16).numpy(), want.view(np.int16))

    @check
    def fp8_tensors_in_and_out():
        xs = x[:1001]
        want = gpuq.quantize(xs.cpu().numpy(), 0.25, dtype="float8_e4m3fn")
        q = gpuq.quantize(xs, 0.25, dtype="float8_e4m3fn")
        assert isinstance(q, torch.Tensor) and q.dtype == torch.float8_e4m3fn and q.device == xs.device
        assert np.array_equal(q.cpu().view(torch.uint8).numpy(), want.view(np.uint8))
        out = torch.empty(1001, dtype=torch.float8_e4m3fn, device=dev)  # out= of torch's fp8 type
        assert gpuq.quantize(xs, 0.25, out=out) is out
        assert np.array_equal(out.cpu().view(torch.uint8).numpy(), want.view(np.uint8))
        y = gpuq.dequantize(out, 0.25)
        assert isinstance(y, torch.Tensor) and y.dtype == torch.float32
        assert np.array_equal(y.cpu().numpy(), gpuq.dequantize(want, 0.25))

    @check
    def runs_on_torchs_current_stream():
        side = torch.cuda.Stream(device=dev)
        want = gpuq.quantize(x.cpu().numpy() * 2, 0.25)
        for _ in range(5):
            with torch.cuda.stream(side):
                torch.cuda._sleep(50_000_000)  # the producer is still busy when gpuq is called
                src = x * 2
                q = gpuq.quantize(src, 0.25)
                got = q.cpu()  # on the side stream, after gpuq's kernel
            assert np.array_equal(got.numpy(), want)

    @check
    def parameters_requiring_grad():
        w = torch.nn.Parameter(torch.randn(64, 128, device=dev))
        s, z = gpuq.choose_qparams(w, axis=0)
        q = gpuq.quantize(w, s, z, axis=0)
        assert isinstance(q, torch.Tensor) and w.grad is None and w.requires_grad
        assert np.array_equal(q.cpu().numpy(),
                              gpuq.quantize(w.detach().cpu().numpy(), s.cpu().numpy(), z.cpu().numpy(), axis=0))

    @check
    def cuda_graph_capture():
        src = torch.randn(4096, 256, device=dev)
        s = torch.rand(256, device=dev) + 0.1
        z = torch.randint(-5, 5, (256,), device=dev, dtype=torch.int32)
        out = torch.empty(4096, 256, device=dev, dtype=torch.int8)
        src3 = torch.randn(16, 32, 64, device=dev)
        s3 = torch.rand(16, 64, device=dev) + 0.1
        out3 = torch.empty(16, 32, 64, device=dev, dtype=torch.int8)
        op = gpuq.Quantize(scales=np.linspace(0.1, 1, 256, dtype=np.float32), qtype="per_channel", axis=1)
        out_op = torch.empty(4096, 256, device=dev, dtype=torch.int8)

        def calls():
            gpuq.quantize(src, s, z, axis=1, out=out, check_values=False)
            gpuq.quantize(src3, s3, axis=(0, 2), out=out3, check_values=False)  # strided: dims uploaded once
            op(src, out=out_op)  # the op's parameters uploaded once

        calls()  # warm-up outside the capture: compile, upload
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            calls()
        src.copy_(torch.randn(4096, 256, device=dev))
        src3.copy_(torch.randn(16, 32, 64, device=dev))
        g.replay()
        torch.cuda.synchronize()
        want = gpuq.quantize(src.cpu().numpy(), s.cpu().numpy(), z.cpu().numpy(), axis=1)
        assert np.array_equal(out.cpu().numpy(), want)
        assert np.array_equal(out3.cpu().numpy(), gpuq.quantize(src3.cpu().numpy(), s3.cpu().numpy(), axis=(0, 2)))
        assert np.array_equal(out_op.cpu().numpy(), op(src.cpu().numpy()))

    import gpuq.torch  # gpuq was imported before torch: register the ops now  # noqa: F401

    def _seeded(seed):
        return torch.Generator(device=dev).manual_seed(seed)

    gen = _seeded(31)
    x = torch.randn(6, 10, device=dev, generator=gen) * 3
    xb = (torch.randn(6, 10, device=dev, generator=gen) * 12).to(torch.bfloat16)
    s10 = torch.linspace(0.01, 0.1, 10, device=dev)
    s63 = torch.rand(6, 3, device=dev, generator=gen) + 0.1
    z63 = torch.randint(-3, 4, (6, 3), device=dev, dtype=torch.int32, generator=gen)
    args = (x, xb, s10, s63, z63)
    host_args = tuple(_to_host(a) for a in args)

    @check
    def ops_on_cuda_give_the_eager_and_host_bits():
        ops = torch.ops.gpuq
        c4 = ops.quantize(xb, s63, z63, axis=[1], group_size=4, dtype="int4", check_values=False)
        assert c4.device == dev and c4.dtype == torch.uint8 and c4.shape == (30,)
        eager = gpuq.quantize(xb, s63, z63, axis=1, group_size=4, dtype="int4")
        _same(c4, eager.data)
        _same(c4.cpu().numpy(), gpuq.quantize(host_args[1], host_args[3], host_args[4], axis=1, group_size=4,
                                              dtype="int4").data)
        y = ops.dequantize(c4, s63, z63, axis=[1], group_size=4, packed="int4", shape=[6, 10],
                           dtype="bfloat16")
        _same(y, gpuq.dequantize(eager, s63, z63, axis=1, group_size=4, dtype="bfloat16"))
        f8 = ops.quantize(x, s10, axis=[1], dtype="float8_e5m2")
        _same(_to_host(f8), gpuq.quantize(host_args[0], host_args[2], axis=1, dtype="float8_e5m2"))
        w = torch.randn(300, 200, device=dev, generator=gen)  # fp8 with 128x128 block scales, ragged
        fb, sb = ops.quantize_dynamic(w, block_size=[128, 128], dtype="float8_e4m3fn")
        _same(_to_host([fb, sb]), gpuq.quantize_dynamic(_to_host(w), block_size=(128, 128),
                                                        dtype="float8_e4m3fn")[:2])
        _same(ops.dequantize(fb, sb, block_size=[128, 128]), gpuq.dequantize(fb, sb, block_size=(128, 128)))
        _same(_to_host(ops.quantize_dynamic(x, axis=[0], dtype="uint8")),
              [r for r in gpuq.quantize_dynamic(host_args[0], axis=0, dtype="uint8") if r is not None])
        want = gpuq.choose_qparams(host_args[1], axis=1, group_size=4, symmetric=True)
        _same(_to_host(ops.choose_qparams(xb, axis=[1], group_size=4, symmetric=True)),
              [r for r in want if r is not None])

    @check
    def ops_captured_in_a_cuda_graph():
        src = torch.randn(4096, 256, device=dev)
        s, z = torch.rand(256, device=dev) + 0.1, torch.randint(-5, 5, (256,), device=dev, dtype=torch.int32)
        sg = torch.rand(4096, 2, device=dev) + 0.1

        def calls():  # device parameters, check_values=False: no host synchronisation
            q = torch.ops.gpuq.quantize(src, s, z, axis=[1], check_values=False)
            c = torch.ops.gpuq.quantize(src, sg, axis=[1], group_size=128, dtype="uint4", check_values=False)
            y = torch.ops.gpuq.dequantize(c, sg, axis=[1], group_size=128, packed="uint4", shape=[4096, 256],
                                          dtype="bfloat16", check_values=False)
            return q, c, y

        side = torch.cuda.Stream(device=dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):  # warm-up (kernel compiles, uploads) off the capture, as torch asks
            calls()
        torch.cuda.current_stream(dev).wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):  # outputs from torch's allocator: the graph's own pool
            static = calls()
        for seed in (1, 2):
            src.copy_(torch.randn(4096, 256, device=dev, generator=_seeded(seed)))
            g.replay()
            torch.cuda.synchronize()
            h, hs, hz, hg = (_to_host(a) for a in (src, s, z, sg))
            want_c = gpuq.quantize(h, hg, axis=1, group_size=128, dtype="uint4")
            _same(_to_host(static), (gpuq.quantize(h, hs, hz, axis=1), want_c.data,
                                     gpuq.dequantize(want_c, hg, axis=1, group_size=128, dtype="bfloat16")))

    @check
    def compile_fullgraph_one_graph_with_eagers_bits():
        explained = torch._dynamo.explain(_every_code_type)(*args)
        assert (explained.graph_count, explained.graph_break_count) == (1, 0), str(explained)
        got = torch.compile(_every_code_type, fullgraph=True, backend="aot_eager")(*args)
        _same(got, _every_code_type(*args))
        _same(_to_host(got), _every_code_type(*host_args))

    @check
    def compiled_ops_run_on_torchs_current_stream():
        side = torch.cuda.Stream(device=dev)
        fc = torch.compile(lambda t: gpuq.dequantize(gpuq.quantize(t * 2, 0.25, dtype="int4"), 0.25),
                           fullgraph=True, backend="aot_eager")
        big = torch.randn(1 << 20, device=dev)
        want = gpuq.dequantize(gpuq.quantize(big.cpu().numpy() * 2, 0.25, dtype="int4"), 0.25)
        fc(big)  # compiled before the timed producer
        torch.cuda.synchronize()
        for _ in range(3):
            with torch.cuda.stream(side):
                torch.cuda._sleep(50_000_000)  # the producer is still busy when the ops are called
                got = fc(big).cpu()  # on the side stream, after the ops
            _same(got, want)

    @check
    def opcheck_on_cuda():
        w = x.clone().requires_grad_(True)
        q = torch.ops.gpuq.quantize(x, s10, axis=[1])
        ops = torch.ops.gpuq
        for op, a, kw in ((ops.quantize, (w, s10), dict(axis=[1], dtype="uint8")),
                          (ops.quantize, (xb, s63, z63), dict(axis=[1], group_size=4, dtype="int4")),
                          (ops.dequantize, (q, s10), dict(axis=[1], dtype="bfloat16")),
                          (ops.choose_qparams, (w,), dict(axis=[0], dtype="uint8")),
                          (ops.quantize_dynamic, (xb,), dict(axis=[1], group_size=4, dtype="float8_e4m3fn"))):
            torch.library.opcheck(op.default, a, kw, atol=0, rtol=0)

    @check
    def export_on_cuda():
        class QuantizedLinear(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.weight = torch.nn.Parameter(torch.randn(64, 32, device=dev))

            def forward(self, t):
                q, s, z = gpuq.quantize_dynamic(self.weight, axis=0)
                return t @ gpuq.dequantize(q, s, z, axis=0).T

        m, t = QuantizedLinear(), torch.randn(8, 32, device=dev)
        ep = torch.export.export(m, (t,))
        targets = {str(n.target) for n in ep.graph.nodes}
        assert {"gpuq.quantize_dynamic.default", "gpuq.dequantize.default"} <= targets, targets
        _same(ep.module()(t), m(t))

    @check
    def compile_reduce_overhead_cuda_graphs():
        src = torch.randn(1024, 256, device=dev)
        s, z = torch.rand(256, device=dev) + 0.1, torch.randint(-5, 5, (256,), device=dev, dtype=torch.int32)

        def f(t, s, z):
            q = gpuq.quantize(t, s, z, axis=1, check_values=False)
            return gpuq.dequantize(q, s, z, axis=1, check_values=False) * 2

        from torch._dynamo.utils import counters

        counters.clear()
        fc = torch.compile(f, fullgraph=True, mode="reduce-overhead")
        for seed in range(4):  # warm-up runs, the recording, replays
            src.copy_(torch.randn(1024, 256, device=dev, generator=_seeded(seed)))
            _same(fc(src, s, z).clone(), f(src, s, z))
        assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])  # really captured

    if torch.cuda.device_count() > 1:
        @check
        def second_device():
            with torch.cuda.device(0):
                t = torch.randn(1001, device="cuda:1", dtype=torch.float32)
                s = torch.rand(1001, device="cuda:1", dtype=torch.float64) + 0.1  # converted on device 1
                q = gpuq.quantize(t, s, axis=0)
                assert q.device == t.device
                assert np.array_equal(q.cpu().numpy(), gpuq.quantize(t.cpu().numpy(), s.cpu().numpy(), axis=0))

    return _failures


if __name__ == "__main__":
    sys.exit(main())
