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
* a second GPU, when there is one: src on device 1 while device 0 is current.
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
