#!/usr/bin/env python3
"""Where the headline cases lose bandwidth: gpuq's element operations under other traversals.

The first device check (bench/results/gpu_check_H200_2026-11-26T034259Z) measured s8->f32
dequantize at 43% of the copy bandwidth and bf16->s8 per-row quantize at 48%, where f32->s8
reaches 84-93%. Each thread of gpuq's kernels takes 16 contiguous elements
(kernels/elementwise.cuh): for a float32 output that is four 16-byte stores 64 bytes apart in
each warp instruction (every 32-byte sector written in two halves, by two instructions), and a
bfloat16 input gives each thread only 32 bytes of loads in flight. The kernels here apply
gpuq's own element operations (kernels/contract.cuh, unchanged) under other traversals; every
variant's bits are compared with gpuq's result before it is timed.

dequantize s8->f32, one scale by value:
  ``unit16``     gpuq's layout: 16 contiguous elements a thread (1 x 16-byte load, 4 x 16-byte stores)
  ``warp16``     16 elements a thread as 4 runs of 4, the runs 128 elements apart, so each warp
                 instruction covers one contiguous span (4 x 4-byte loads, 4 x 16-byte stores)
  ``unit4``      4 contiguous elements a thread (1 x 4-byte load, 1 x 16-byte store)
quantize bf16->s8, one scale a row (rows of ``cols`` elements; ``cols`` a multiple of 512):
  ``unit16``     gpuq's layout (2 x 16-byte loads 32 bytes apart, 1 x 16-byte store)
  ``warp16``     16 elements as 2 runs of 8, 256 elements apart (coalesced 16-byte loads, 8-byte stores)
  ``unit16x2``   gpuq's layout, two units a thread (twice the loads in flight)
  ``recip``      ``unit16`` with x * (1 / s) instead of the division: NOT the contract; how much
                 of the time is the division (its bits are reported, never used)

    python3 bench/traversal_experiment.py [--n 268435456] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuq.backends.cuda import registry  # noqa: E402

_KERNELS = r"""
using namespace gpuq;

__device__ __forceinline__ float deq(signed char q, float s) { return dequantize_rn_sym<float>(q, s); }
__device__ __forceinline__ signed char qnt(gpuq_bf16 x, float s) {
    return quantize_rn_sym<signed char, float>(widen<float>(x), s);
}

extern "C" __global__ void __launch_bounds__(256)
deq_unit16(const signed char* __restrict__ q, float* __restrict__ y, float s, long long n) {
    const long long u = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if ((u + 1) * 16 > n) return;
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(q) + u);
    signed char c[16];
    memcpy(c, &raw, 16);
    float4* out = reinterpret_cast<float4*>(y) + u * 4;
#pragma unroll
    for (int k = 0; k < 4; ++k)
        out[k] = make_float4(deq(c[4 * k], s), deq(c[4 * k + 1], s), deq(c[4 * k + 2], s), deq(c[4 * k + 3], s));
}

extern "C" __global__ void __launch_bounds__(256)
deq_warp16(const signed char* __restrict__ q, float* __restrict__ y, float s, long long n) {
    const long long t = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    const long long warp = t >> 5;
    const int lane = threadIdx.x & 31;
    const long long base = warp * 512;  // 32 lanes x 16 elements
    if (base + 512 > n) return;
    unsigned w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) w[k] = __ldg(reinterpret_cast<const unsigned*>(q + base + k * 128) + lane);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        signed char c[4];
        memcpy(c, &w[k], 4);
        reinterpret_cast<float4*>(y + base + k * 128)[lane] =
            make_float4(deq(c[0], s), deq(c[1], s), deq(c[2], s), deq(c[3], s));
    }
}

extern "C" __global__ void __launch_bounds__(256)
deq_unit4(const signed char* __restrict__ q, float* __restrict__ y, float s, long long n) {
    const long long u = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if ((u + 1) * 4 > n) return;
    const unsigned w = __ldg(reinterpret_cast<const unsigned*>(q) + u);
    signed char c[4];
    memcpy(c, &w, 4);
    reinterpret_cast<float4*>(y)[u] = make_float4(deq(c[0], s), deq(c[1], s), deq(c[2], s), deq(c[3], s));
}

template <bool RECIP>
__device__ __forceinline__ void q_unit(const gpuq_bf16* __restrict__ x, signed char* __restrict__ q,
                                       const float* __restrict__ scales, long long cols, long long u) {
    const float s = __ldg(scales + (u * 16) / cols);
    uint4 raw[2];
    raw[0] = __ldg(reinterpret_cast<const uint4*>(x) + 2 * u);
    raw[1] = __ldg(reinterpret_cast<const uint4*>(x) + 2 * u + 1);
    gpuq_bf16 v[16];
    memcpy(v, raw, 32);
    signed char c[16];
    const float r = 1.0f / s;
#pragma unroll
    for (int l = 0; l < 16; ++l) {
        if constexpr (RECIP) {
            c[l] = static_cast<signed char>(min(max(rint_to_i32_sat(widen<float>(v[l]) * r), -128), 127));
        } else {
            c[l] = qnt(v[l], s);
        }
    }
    uint4 o;
    memcpy(&o, c, 16);
    reinterpret_cast<uint4*>(q)[u] = o;
}

extern "C" __global__ void __launch_bounds__(256)
q_unit16(const gpuq_bf16* __restrict__ x, signed char* __restrict__ q, const float* __restrict__ s,
         long long cols, long long n) {
    const long long u = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if ((u + 1) * 16 <= n) q_unit<false>(x, q, s, cols, u);
}

extern "C" __global__ void __launch_bounds__(256)
q_unit16x2(const gpuq_bf16* __restrict__ x, signed char* __restrict__ q, const float* __restrict__ s,
           long long cols, long long n) {
    const long long units = n / 16;
    const long long u = static_cast<long long>(blockIdx.x) * blockDim.x * 2 + threadIdx.x;
    if (u < units) q_unit<false>(x, q, s, cols, u);
    if (u + blockDim.x < units) q_unit<false>(x, q, s, cols, u + blockDim.x);
}

extern "C" __global__ void __launch_bounds__(256)
q_recip(const gpuq_bf16* __restrict__ x, signed char* __restrict__ q, const float* __restrict__ s,
        long long cols, long long n) {
    const long long u = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if ((u + 1) * 16 <= n) q_unit<true>(x, q, s, cols, u);
}

extern "C" __global__ void __launch_bounds__(256)
q_warp16(const gpuq_bf16* __restrict__ x, signed char* __restrict__ q, const float* __restrict__ scales,
         long long cols, long long n) {
    const long long t = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    const long long base = (t >> 5) * 512;
    const int lane = threadIdx.x & 31;
    if (base + 512 > n) return;
    const float s = __ldg(scales + base / cols);  // cols % 512 == 0: one row a warp
    uint4 raw[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) raw[k] = __ldg(reinterpret_cast<const uint4*>(x + base + k * 256) + lane);
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        gpuq_bf16 v[8];
        memcpy(v, &raw[k], 16);
        signed char c[8];
#pragma unroll
        for (int l = 0; l < 8; ++l) c[l] = qnt(v[l], s);
        uint2 o;
        memcpy(&o, c, 8);
        reinterpret_cast<uint2*>(q + base + k * 256)[lane] = o;
    }
}
"""


def _module(cupy):
    src = registry._expand("contract.cuh", set()) + _KERNELS
    return cupy.RawModule(code=src, options=registry.OPTIONS)


def _time(cupy, fn, reps, rounds):
    for _ in range(2):
        fn()
    means = []
    if not hasattr(cupy.cuda, "get_elapsed_time"):  # the CPU execution (a dry run): host clock
        import time

        t = time.perf_counter()
        fn()
        cupy.cuda.runtime.deviceSynchronize()
        return (time.perf_counter() - t) * 1e3
    for _ in range(rounds):
        a, b = cupy.cuda.Event(), cupy.cuda.Event()
        a.record()
        for _ in range(reps):
            fn()
        b.record()
        b.synchronize()
        means.append(cupy.cuda.get_elapsed_time(a, b) / reps)
    return statistics.median(means)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1 << 28)
    ap.add_argument("--cols", type=int, default=16384)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--sim", action="store_true", help="dry run on the CPU execution of the kernels")
    args = ap.parse_args(argv)
    if args.sim:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from cudasim import install

        install.install()
    import cupy
    import ml_dtypes

    import gpuq

    n, cols = args.n, args.cols
    assert n % 512 == 0 and cols % 512 == 0 and n % cols == 0
    mod = _module(cupy)
    host = np.random.default_rng(0).standard_normal(n, dtype=np.float32) * 3
    rows = []

    def report(group, name, ms, nbytes, same):
        row = {"group": group, "variant": name, "ms": ms, "gbps": nbytes / ms / 1e6, "bits_equal": same}
        rows.append(row)
        print(f"{group:<22} {name:<10} {ms:7.3f} ms {row['gbps']:7.0f} GB/s  bits {'=' if same else 'DIFFER'}",
              flush=True)

    def same(got, want) -> bool:  # on the host: the CuPy calls stay few (the dry run's stand-in has few)
        got, want = cupy.asnumpy(got), cupy.asnumpy(want)
        return got.tobytes() == want.tobytes()

    src = cupy.asarray(host)
    dst = cupy.empty(n, cupy.float32)
    ms = _time(cupy, lambda: cupy.copyto(dst, src) if hasattr(cupy, "copyto") else None, args.reps, args.rounds)
    report("copy f32", "cupy", ms, 8 * n, True)
    del src, dst

    s = float(np.abs(host).max()) / 127
    q = gpuq.quantize(cupy.asarray(host), s)
    ref = gpuq.dequantize(q, s)
    poison = np.full(n, np.nan, np.float32)
    grid = lambda threads: ((threads + 255) // 256,)  # noqa: E731
    for name, threads in (("unit16", n // 16), ("warp16", n // 16), ("unit4", n // 4)):
        fn = mod.get_function(f"deq_{name}")
        y = cupy.asarray(poison)
        call = lambda fn=fn, threads=threads, y=y: fn(grid(threads), (256,), (q, y, np.float32(s), np.int64(n)))  # noqa: E731
        call()
        ok = same(y, ref)
        report("dequantize s8->f32", name, _time(cupy, call, args.reps, args.rounds), 5 * n, ok)
        del y
    report("dequantize s8->f32", "gpuq", _time(cupy, lambda: gpuq.dequantize(q, s), args.reps, args.rounds),
           5 * n, True)
    del ref, q, poison

    rows_n = n // cols
    hb = host.astype(ml_dtypes.bfloat16)
    scales_h = (np.abs(hb.astype(np.float32).reshape(rows_n, cols)).max(axis=1) / 127).astype(np.float32)
    xb, scales = cupy.asarray(hb), cupy.asarray(scales_h)
    want = gpuq.quantize(xb.reshape(rows_n, cols), scales, axis=0, check_values=False).reshape(-1)
    variants = (("unit16", n // 16), ("warp16", n // 16), ("unit16x2", n // 32), ("recip", n // 16))
    for name, threads in variants:
        fn = mod.get_function(f"q_{name}")
        out = cupy.asarray(np.full(n, 99, np.int8))
        call = lambda fn=fn, threads=threads, out=out: fn(grid(threads), (256,), (xb, out, scales, np.int64(cols), np.int64(n)))  # noqa: E731
        call()
        ok = same(out, want)
        report("quantize bf16->s8 row", name, _time(cupy, call, args.reps, args.rounds), 3 * n, ok)
        del out
    gq = lambda: gpuq.quantize(xb.reshape(rows_n, cols), scales, axis=0, check_values=False)  # noqa: E731
    report("quantize bf16->s8 row", "gpuq", _time(cupy, gq, args.reps, args.rounds), 3 * n, True)
    if args.json:
        args.json.write_text(json.dumps({"n": n, "cols": cols, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
