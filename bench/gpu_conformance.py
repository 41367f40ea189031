#!/usr/bin/env python3
"""The hardware conversions the kernels use, against the software paths they replace (issue 38).

On the GPU every float32 bit pattern (``--log2-count``, default all 2**32) goes through each PTX
form the kernels now emit and through the integer/float path the kernels used before, which the
CPU execution (tests/cudasim) proves against the host backend bit for bit; a mismatch prints the
form, the count and the first bit patterns, and the exit status is 1.

* ``cvt.rni.sat.s8.f32`` / ``cvt.rni.sat.u8.f32``: the whole 32-bit register against
  ``NaN ? 0 : clamp(cvt.rni.s32.f32(x))`` extended by the code's signedness.
* ``cvt.rn.f16x2.e4m3x2`` (sm_89+): both halves, widened by ``cvt.f32.f16``, against the software
  decode ``e4m3_to_f32_soft`` on every code pair but the NaN codes.
* ``cvt.rn.satfinite.e4m3x2.f32`` / ``e5m2x2`` (sm_89+), ``d, a, b``: the low byte (``b = x``)
  and the high byte (``a``, a second non-NaN float made from x's bits) against the software
  saturating cast ``f32_to_fp8<FMT, true>``; a NaN x must give a NaN code of the format (the
  kernels branch before the instruction, so this is reported, not relied on).

* The exact division from a reciprocal (kernels/contract.cuh ``Divisor``, issue 38 point 2)
  against ``div.rn.f32``: (a) significand pairs x, s in [1, 2) (scale-invariant while nothing
  leaves the normal range: every quotient of the guarded scales' normal range), the kernels'
  two-step form must give ``div.rn``'s bits; the one-step form's mismatches are reported (it
  would replace the two-step form once this count is 0 over all 2**46 pairs); ``--division-log2-s``
  K checks every 2**K-th s significand (default 2: a quarter, about 15 s on an H200; 0: all);
  (b) every x of the pattern range at s = 2**-64, 2**64, 1/127, 1/448: the quotient equal to
  ``div.rn``'s but where both are below 2**-24 or both at least 2**100 (no code tells them apart),
  and the int8, e4m3 and e5m2 codes equal everywhere.

* Every PTX form the CPU execution of the kernels replaces by a host helper
  (tests/cudasim/shim/cudasim_ptx.h), the hardware against a device port of that very helper
  (its text compiled for the GPU, mechanical substitutions only: :func:`port_text`), so that what
  the CPU proves about the kernels holds on the GPU: ``cvt.rni.sat.{s8,u8}.f32``,
  ``cvt.rni.s32.f32``, ``cvt.rn.f16.f32``, ``cvt.f32.f16``, ``cvt.rn.satfinite.{e4m3,e5m2}x2.f32``
  (both bytes), ``cvt.rn.f16x2.e4m3x2``, ``mul.hi.u32``, ``clz.b32``, over every pattern; what the
  ISA leaves open and the kernels never pass (a NaN's bits) is reported, not failed.
* The index maps' FastDivmod (kernels/elementwise.cuh: ``mul.hi.u32`` and ``clz.b32``) with the
  host's multiplier (gpuq/backends/cuda/launch.py ``fast_divisor``) against the device's integer
  ``/`` and ``%``: every divisor below 2**16 and 2,000 sampled above with every power of two and
  its neighbours, each on tests/test_kernels_compile.py's grid of dividends (the ends, two either
  side of the multiples of d nearest 0, 2**30 and 2**31 - 1, and pseudo-random ones).

    python3 bench/gpu_conformance.py                      # on the GPU: all 2**32, a few seconds
    python3 bench/gpu_conformance.py --log2-count 16 --sim  # dry run on the CPU execution

``--sim`` (no GPU) uses tests/cudasim's CuPy stand-in and builds for its compute capability
(9.0), the same source; ``--log2-count`` patterns are then spread over the whole 32-bit range.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

FORMS = ("cvt.rni.sat.s8.f32", "cvt.rni.sat.u8.f32", "cvt.rn.satfinite.e4m3x2.f32",
         "cvt.rn.satfinite.e5m2x2.f32", "e4m3x2 NaN in -> NaN code", "e5m2x2 NaN in -> NaN code",
         "cvt.rn.f16x2.e4m3x2", "division at 2^-64, 2^64, 1/127, 1/448")
#: The significand-pair check of the division: the kernels' form, and the one-step form (reported only).
DIVISION_FORMS = ("division, significand pairs", "division one-step, significand pairs (report only)")
#: The scales of the all-x division check (float32 bits): the guard ends, 1/127, 1/448.
DIVISION_SCALES = (0x1F800000, 0x5F800000, 0x3C010204, 0x3B124925)

# Pattern i of a launch is base + i * stride (mod 2**32). bad[f] counts form f's mismatches and
# first[f] keeps the smallest mismatching pattern.
_KERNEL = r"""
namespace gpuq {
__device__ __forceinline__ void conformance_miss(int form, unsigned p, unsigned long long* bad, unsigned* first) {
    atomicAdd(bad + form, 1ULL);
    atomicMin(first + form, p);
}

// The launch's patterns, grid-stride: check(p, x) for p = base + i * stride, i < n, x = p's float.
template <class Check>
__device__ __forceinline__ void for_each_pattern(unsigned base, unsigned stride, unsigned n, Check&& check) {
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const unsigned p = base + i * stride;
        check(p, __uint_as_float(p));
    }
}

template <int FMT>
__device__ __forceinline__ void fp8_conformance(float x, float partner, unsigned p, unsigned long long* bad,
                                                unsigned* first) {
#if __CUDA_ARCH__ >= 890
    unsigned short d;
    if constexpr (FMT == 0) {
        asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(d) : "f"(partner), "f"(x));
    } else {
        asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(d) : "f"(partner), "f"(x));
    }
    const unsigned lo = d & 0xffu, hi = d >> 8;
    if (hi != f32_to_fp8<FMT, true>(partner)) conformance_miss(2 + FMT, p, bad, first);
    if (is_nan(x)) {
        const bool nan_code = FMT == 0 ? (lo & 0x7fu) == 0x7fu : (lo & 0x7fu) > 0x7cu;
        if (!nan_code) conformance_miss(4 + FMT, p, bad, first);
    } else if (lo != f32_to_fp8<FMT, true>(x)) {
        conformance_miss(2 + FMT, p, bad, first);
    }
#endif
}
}  // namespace gpuq

extern "C" __global__ void gpuq_conformance(unsigned base, unsigned stride, unsigned n,
                                            unsigned long long* bad, unsigned* first) {
    using namespace gpuq;
    for_each_pattern(base, stride, n, [&](unsigned p, float x) {
        int s8, u8;
        asm("cvt.rni.sat.s8.f32 %0, %1;" : "=r"(s8) : "f"(x));
        asm("cvt.rni.sat.u8.f32 %0, %1;" : "=r"(u8) : "f"(x));
        const int r = is_nan(x) ? 0 : rint_to_i32_sat(x);
        if (s8 != min(max(r, -128), 127)) conformance_miss(0, p, bad, first);
        if (u8 != min(max(r, 0), 255)) conformance_miss(1, p, bad, first);
        // The high byte's input: x's bits with the halves swapped (every exponent again), not NaN.
        float partner = __uint_as_float((p << 16) | (p >> 16));
        if (is_nan(partner)) partner = 0.0f;
        fp8_conformance<0>(x, partner, p, bad, first);
        fp8_conformance<1>(x, partner, p, bad, first);
#if __CUDA_ARCH__ >= 890
        // A code pair from both halves of p (every pair 2**16 times over the full range, every pair
        // once at --log2-count 16): both halves against the software decode; NaN codes (which the
        // kernels branch on first) are left out.
        const unsigned short pair = static_cast<unsigned short>(p ^ (p >> 16));
        unsigned d;
        asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(d) : "h"(pair));
        for (int half = 0; half < 2; ++half) {
            const unsigned char c = static_cast<unsigned char>(pair >> (8 * half));
            const unsigned short h = static_cast<unsigned short>(d >> (16 * half));
            float f;
            asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
            if ((c & 0x7fu) != 0x7fu && __float_as_uint(f) != __float_as_uint(e4m3_to_f32_soft(c)))
                conformance_miss(6, p, bad, first);
        }
#endif
        // The division at the guard ends and two code scales: quotient bits where a code can tell
        // them apart, and the codes themselves everywhere.
        for (int k = 0; k < 4; ++k) {
            const unsigned scales[4] = {DIVISION_SCALES};
            const float s = __uint_as_float(scales[k]);
            const float q = divisor(s)(x), w = div_rn(x, s);
            const unsigned aq = __float_as_uint(q) & 0x7fffffffu, aw = __float_as_uint(w) & 0x7fffffffu;
            // Magnitudes order as their bits: 0x33800000 is 2^-24, 0x71800000 2^100.
            const bool same = __float_as_uint(q) == __float_as_uint(w) || (is_nan(q) && is_nan(w)) ||
                              (aq < 0x33800000u && aw < 0x33800000u) || (aq >= 0x71800000u && aw >= 0x71800000u);
            if (!same || rint_to_code_sat<signed char>(q) != rint_to_code_sat<signed char>(w) ||
                (!is_nan(w) && (f32_to_fp8<0, true>(q) != f32_to_fp8<0, true>(w) ||
                                f32_to_fp8<1, true>(q) != f32_to_fp8<1, true>(w))))
                conformance_miss(7, p, bad, first);
        }
    });
}

// Significand pairs: s = 1 + (s_first + blockIdx.y * s_step) * 2^-23, x = 1 + j * x_step * 2^-23 for
// j in [0, 2^23 / x_step). Form 0: the kernels' Divisor against div.rn; form 1: the one-step form.
// first[] holds the pair's s index << 23 | x index (the smallest on a tie of atomicMin).
extern "C" __global__ void gpuq_division_pairs(unsigned s_first, unsigned s_step, unsigned x_step,
                                               unsigned long long* bad, unsigned long long* first) {
    using namespace gpuq;
    const unsigned si = s_first + blockIdx.y * s_step;
    const float s = __uint_as_float(0x3f800000u | si);
    const Divisor<float> d = divisor(s);
    const unsigned xs = (1u << 23) / x_step;
    for (unsigned j = blockIdx.x * blockDim.x + threadIdx.x; j < xs; j += gridDim.x * blockDim.x) {
        const unsigned xi = j * x_step;
        const float x = __uint_as_float(0x3f800000u | xi);
        const unsigned w = __float_as_uint(div_rn(x, s));
        const float q0 = mul_rn(x, d.y);
        const unsigned one = __float_as_uint(fma_rn(fma_rn(d.ns, q0, x), d.y, q0));
        const unsigned long long where = (static_cast<unsigned long long>(si) << 23) | xi;
        if (__float_as_uint(d(x)) != w) {
            atomicAdd(bad, 1ULL);
            atomicMin(first, where);
        }
        if (one != w) {
            atomicAdd(bad + 1, 1ULL);
            atomicMin(first + 1, where);
        }
    }
}
"""


#: The hardware forms against the device port of the CPU execution's helpers; "(report only)"
#: forms are inputs whose result the ISA leaves open and the kernels never produce or use.
HELPER_FORMS = ("cvt.rni.sat.s8.f32", "cvt.rni.sat.u8.f32", "cvt.rni.s32.f32", "cvt.rn.f16.f32",
                "cvt.f32.f16", "cvt.rn.satfinite.e4m3x2.f32", "cvt.rn.satfinite.e5m2x2.f32",
                "cvt.rn.f16x2.e4m3x2", "mul.hi.u32", "clz.b32", "NaN in: f16 and fp8 NaN bits (report only)")
_HELPERS = ROOT / "tests" / "cudasim" / "shim" / "cudasim_ptx.h"


def port_text() -> str:
    """The numeric part of tests/cudasim/shim/cudasim_ptx.h (everything before its operand glue)
    as device code, in namespace ``gpuq_port``: its functions made ``__device__``, ``std::memcpy``
    the global one, ``__builtin_clzll`` through CUDA's ``__clz`` (twice), the fixed-width integer
    names and limits defined here (NVRTC has no <cstdint>), the four f32 arithmetic one-liners
    left out (the host's float operations; the division check covers those forms). The same text
    builds for the CPU execution, where ``__device__`` is empty."""
    import re

    text = _HELPERS.read_text()
    body = text[text.index("namespace ptx {") + len("namespace ptx {"):text.index("// Operand glue")]
    body = re.sub(r"(?m)^inline ", "__device__ inline ", body)
    body = body.replace("std::memcpy", "memcpy").replace("__builtin_clzll(", "port_clzll(")
    # The f32 arithmetic forms (host IEEE operations there) are the division check's business.
    body = re.sub(r"(?m)^__device__ inline float (div|mul|sub|fma)_rn_f32\(.*\n", "", body)
    return ("#ifndef INT32_MIN\n#define INT32_MIN (-2147483647 - 1)\n#endif\n"
            "#ifndef INT64_MIN\n#define INT64_MIN (-9223372036854775807LL - 1)\n#endif\n"
            "namespace gpuq_port {\n"
            "using uint16_t = unsigned short; using uint32_t = unsigned int; using uint64_t = unsigned long long;\n"
            "using int32_t = int; using int64_t = long long;\n"
            "__device__ inline int port_clzll(uint64_t x) {\n"
            "    const unsigned hi = static_cast<unsigned>(x >> 32);\n"
            "    return hi ? __clz(static_cast<int>(hi)) : 32 + __clz(static_cast<int>(static_cast<unsigned>(x)));\n"
            "}\n" + body + "}  // namespace gpuq_port\n")


_HELPER_KERNEL = r"""
namespace gpuq {
__device__ __forceinline__ void helper_miss(bool bad_, int form, unsigned p, unsigned long long* bad,
                                            unsigned* first) {
    if (bad_) conformance_miss(form, p, bad, first);
}
}  // namespace gpuq

// Pattern p = base + i * stride: x = p's float, partner = its halves swapped (every exponent
// again), h = p's low 16 bits, pair = p's two halves XOR-ed (every pair 2**16 times over).
extern "C" __global__ void gpuq_helper_conformance(unsigned base, unsigned stride, unsigned n,
                                                   unsigned long long* bad, unsigned* first) {
    using namespace gpuq;
    for_each_pattern(base, stride, n, [&](unsigned p, float x) {
        const unsigned q = (p << 16) | (p >> 16);
        const float partner = __uint_as_float(q);
        const unsigned short h = static_cast<unsigned short>(p);
        const bool nan_x = is_nan(x), nan_h = (h & 0x7c00u) == 0x7c00u && (h & 0x03ffu);
        int r;
        asm("cvt.rni.sat.s8.f32 %0, %1;" : "=r"(r) : "f"(x));
        helper_miss(r != gpuq_port::cvt_rni_sat_s8_f32(x), 0, p, bad, first);
        asm("cvt.rni.sat.u8.f32 %0, %1;" : "=r"(r) : "f"(x));
        helper_miss(r != gpuq_port::cvt_rni_sat_u8_f32(x), 1, p, bad, first);
        asm("cvt.rni.s32.f32 %0, %1;" : "=r"(r) : "f"(x));
        helper_miss(r != gpuq_port::cvt_rni_s32_f32(x), 2, p, bad, first);
        unsigned short hw16;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(hw16) : "f"(x));
        helper_miss(hw16 != gpuq_port::cvt_rn_f16_f32(x), nan_x ? 10 : 3, p, bad, first);
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
        helper_miss(__float_as_uint(f) != gpuq_port::bits_of(gpuq_port::cvt_f32_f16(h)), nan_h ? 10 : 4, p, bad,
                    first);
#if __CUDA_ARCH__ >= 890
        const bool nan_any = nan_x || is_nan(partner);
        asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(hw16) : "f"(partner), "f"(x));
        helper_miss(hw16 != gpuq_port::cvt_rn_satfinite_e4m3x2_f32(partner, x), nan_any ? 10 : 5, p, bad, first);
        asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(hw16) : "f"(partner), "f"(x));
        helper_miss(hw16 != gpuq_port::cvt_rn_satfinite_e5m2x2_f32(partner, x), nan_any ? 10 : 6, p, bad, first);
        const unsigned short pair = static_cast<unsigned short>(p ^ (p >> 16));
        unsigned d;
        asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(d) : "h"(pair));
        const bool nan_pair = (pair & 0x7fu) == 0x7fu || ((pair >> 8) & 0x7fu) == 0x7fu;
        helper_miss(d != gpuq_port::cvt_rn_f16x2_e4m3x2(pair), nan_pair ? 10 : 7, p, bad, first);
#endif
        // CUDA's __umulhi and __clz, as FastDivmod calls them (mul.hi.u32 and clz.b32 on the GPU).
        helper_miss(__umulhi(p, q ^ 0x9e3779b9u) != gpuq_port::mul_hi_u32(p, q ^ 0x9e3779b9u), 8, p, bad, first);
        helper_miss(static_cast<unsigned>(__clz(static_cast<int>(p >> (p & 31u)))) !=
                        gpuq_port::clz_b32(p >> (p & 31u)), 9, p, bad, first);
    });
}

// FastDivmod (elementwise.cuh) of packed[blockIdx.y + y0] on dividend j of its grid (as
// tests/test_kernels_compile.py fast_divisor_misses: 9 fixed ones, then 2 either side of the 5
// multiples of d nearest 0, 2^30 - 1 and 2^31 - 1, then pseudo-random ones below 2^31), against
// the device's integer / and %. first[0] keeps the smallest (divisor index << 32 | j) that misses.
extern "C" __global__ void gpuq_fastdivmod(const long long* packed, unsigned y0, unsigned grid_size,
                                           unsigned long long* bad, unsigned long long* first) {
    using namespace gpuq;
    const unsigned idx = y0 + blockIdx.y;
    const FastDivmod f(packed[idx]);
    const unsigned d = f.d, top = 0x7fffffffu;
    for (unsigned j = blockIdx.x * blockDim.x + threadIdx.x; j < grid_size; j += gridDim.x * blockDim.x) {
        long long a;
        if (j < 9) {
            const unsigned fixed[9] = {0u, 1u, 2u, top, top - 1u, top - 2u, 1u << 30, (1u << 30) - 1u, (1u << 30) + 1u};
            a = fixed[j];
        } else if (j < 9 + 75) {
            const unsigned k = j - 9, bases[3] = {0u, top / 2u, top};
            const long long m = static_cast<long long>(bases[k / 25]) / d * d + (static_cast<long long>(k % 25 / 5) - 2) * d;
            a = m + static_cast<long long>(k % 5) - 2;
        } else {
            unsigned long long z = (static_cast<unsigned long long>(d) << 32 | j) + 0x9e3779b97f4a7c15ull;
            z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
            z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
            a = static_cast<long long>((z ^ (z >> 31)) >> 33);
        }
        if (a < 0 || a > top) continue;
        unsigned qq, rr;
        f(static_cast<unsigned>(a), qq, rr);
        if (qq != static_cast<unsigned>(a) / d || rr != static_cast<unsigned>(a) % d) {
            atomicAdd(bad, 1ULL);
            atomicMin(first, (static_cast<unsigned long long>(idx) << 32) | j);
        }
    }
}
"""


def helper_source() -> str:
    return source() + "\n" + port_text() + _HELPER_KERNEL


#: The helpers' rounding routine computes in unsigned __int128, which NVRTC takes for the device
#: with this flag (Linux).
HELPER_OPTIONS = ("--device-int128",)


def run_helpers(cp, count: int, chunk: int = 1 << 28) -> dict:
    """{form: (mismatches, first mismatching pattern or None)} of the hardware forms against the
    device port of the CPU execution's helpers, over ``count`` patterns spread over 2**32."""
    import numpy as np
    from gpuq.backends.cuda import registry

    if not 1 <= count <= 1 << 32 or (1 << 32) % count:
        raise ValueError(f"count must be a power of two in [1, 2**32], got {count}")
    stride = (1 << 32) // count
    kernel = cp.RawModule(code=helper_source(), options=registry.OPTIONS + HELPER_OPTIONS).get_function("gpuq_helper_conformance")
    bad = cp.zeros(len(HELPER_FORMS), np.uint64)
    first = cp.full(len(HELPER_FORMS), 0xFFFFFFFF, np.uint32)
    for start in range(0, count, chunk):
        n = min(chunk, count - start)
        kernel((min((n + 255) // 256, 8192),), (256,),
               (np.uint32((start * stride) & 0xFFFFFFFF), np.uint32(stride), np.uint32(n), bad, first))
    cp.cuda.Device().synchronize()
    bad, first = cp.asnumpy(bad), cp.asnumpy(first)
    return {f: (int(b), int(p) if b else None) for f, b, p in zip(HELPER_FORMS, bad, first)}


def fastdivmod_divisors(sampled: int = 2000, below: int = 1 << 16, seed: int = 38) -> list:
    """The divisors of the FastDivmod check: every one below ``below``, every power of two up to
    2**30 with its neighbours, a few extremes, and ``sampled`` pseudo-random ones in [2**16, 2**31)."""
    import numpy as np

    extremes = {2**31 - 1, 2**31 - 2, 2**30 + 1, 3, 641, 6700417, 46341, 65537}
    for k in range(1, 31):
        extremes |= {2**k - 1, 2**k, 2**k + 1}
    rng = np.random.default_rng(seed)
    return sorted(set(range(1, below)) | extremes | set(rng.integers(2**16, 2**31, sampled).tolist()))


def run_fastdivmod(cp, divisors, randoms: int = 16) -> tuple:
    """(mismatches, first (divisor, dividend index) or None) of FastDivmod on every divisor's grid."""
    import numpy as np
    from gpuq.backends.cuda import registry
    from gpuq.backends.cuda.launch import fast_divisor

    grid_size = 9 + 75 + randoms
    kernel = cp.RawModule(code=helper_source(), options=registry.OPTIONS + HELPER_OPTIONS).get_function("gpuq_fastdivmod")
    packed = cp.asarray(np.array([fast_divisor(int(d)) for d in divisors], np.int64))
    bad = cp.zeros(1, np.uint64)
    first = cp.full(1, 2**64 - 1, np.uint64)
    for y0 in range(0, len(divisors), 65535):
        ny = min(65535, len(divisors) - y0)
        kernel(((grid_size + 127) // 128, ny), (128,), (packed, np.uint32(y0), np.uint32(grid_size), bad, first))
    cp.cuda.Device().synchronize()
    n, p = int(cp.asnumpy(bad)[0]), int(cp.asnumpy(first)[0])
    return n, ((int(divisors[p >> 32]), p & 0xFFFFFFFF) if n else None)


def source() -> str:
    """formats.cu as the kernels compile it (contract.cuh and elementwise.cuh expanded) plus the check."""
    from gpuq.backends.cuda import registry

    scales = ", ".join(f"0x{b:08x}u" for b in DIVISION_SCALES)
    return registry.source_text("formats.cu") + _KERNEL.replace("{DIVISION_SCALES}", "{" + scales + "}")


def run_division(cp, log2_s: int, log2_x: int = 0, s_offset: int = 0) -> dict:
    """{form: (mismatches, first mismatching (s, x) significand pair or None)} of the division over
    every 2**log2_s-th s significand from ``s_offset`` and every 2**log2_x-th x significand in
    [1, 2)."""
    import numpy as np
    from gpuq.backends.cuda import registry

    if not (0 <= log2_s <= 23 and 0 <= log2_x <= 23):
        raise ValueError(f"log2 strides must be in [0, 23], got {log2_s}, {log2_x}")
    if not 0 <= s_offset < 1 << log2_s:
        raise ValueError(f"s_offset must be in [0, 2**{log2_s}), got {s_offset}")
    kernel = cp.RawModule(code=source(), options=registry.OPTIONS).get_function("gpuq_division_pairs")
    bad = cp.zeros(2, np.uint64)
    first = cp.full(2, 2**64 - 1, np.uint64)
    s_step, n_s = 1 << log2_s, 1 << (23 - log2_s)
    blocks_x = min(((1 << (23 - log2_x)) + 255) // 256, 64)
    for start in range(0, n_s, 65535):  # grid.y holds at most 65535 scales a launch
        ny = min(65535, n_s - start)
        kernel((blocks_x, ny), (256,), (np.uint32(start * s_step + s_offset), np.uint32(s_step),
                                        np.uint32(1 << log2_x), bad, first))
    cp.cuda.Device().synchronize()
    bad, first = cp.asnumpy(bad), cp.asnumpy(first)
    return {f: (int(b), (int(p) >> 23, int(p) & 0x7FFFFF) if b else None)
            for f, b, p in zip(DIVISION_FORMS, bad, first)}


def run(cp, count: int, chunk: int = 1 << 28) -> dict:
    """{form: (mismatches, first mismatching pattern or None)} over ``count`` patterns spread
    evenly over the 32-bit range (all of them when count is 2**32)."""
    import numpy as np
    from gpuq.backends.cuda import registry

    if not 1 <= count <= 1 << 32 or (1 << 32) % count:
        raise ValueError(f"count must be a power of two in [1, 2**32], got {count}")
    stride = (1 << 32) // count
    kernel = cp.RawModule(code=source(), options=registry.OPTIONS).get_function("gpuq_conformance")
    bad = cp.zeros(len(FORMS), np.uint64)
    first = cp.full(len(FORMS), 0xFFFFFFFF, np.uint32)
    for start in range(0, count, chunk):
        n = min(chunk, count - start)
        blocks = min((n + 255) // 256, 8192)
        kernel((blocks,), (256,), (np.uint32((start * stride) & 0xFFFFFFFF), np.uint32(stride), np.uint32(n),
                                    bad, first))
    cp.cuda.Device().synchronize()
    bad, first = cp.asnumpy(bad), cp.asnumpy(first)
    return {f: (int(b), int(p) if b else None) for f, b, p in zip(FORMS, bad, first)}


def _ports(cp, cc, count: int, sim: bool) -> bool:
    """The helpers' device port and FastDivmod, printed; whether one failed."""
    failed = False
    t0 = time.perf_counter()
    helpers = run_helpers(cp, count)
    print(f"helpers: the hardware against the device port of tests/cudasim's helpers, {count} patterns, "
          f"{time.perf_counter() - t0:.1f}s")
    for form, (n, p) in helpers.items():
        if form in HELPER_FORMS[5:8] and int(cc) < 89:
            print(f"  {form}: not on sm_{cc}")
            continue
        print(f"  {form}: {'ok' if n == 0 else f'{n} MISMATCHES, first 0x{p:08x}'}")
        failed |= n != 0 and "report only" not in form
    t0 = time.perf_counter()
    # The CPU execution takes the divisors below 2**10 and 20 above (a dry run).
    divisors = fastdivmod_divisors(20, 1 << 10) if sim else fastdivmod_divisors()
    n, where = run_fastdivmod(cp, divisors)
    print(f"FastDivmod: {len(divisors)} divisors on their dividend grids, {time.perf_counter() - t0:.1f}s: "
          + ("ok" if n == 0 else f"{n} MISMATCHES, first d={where[0]} dividend #{where[1]}"))
    return failed or n != 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--log2-count", type=int, default=32, choices=range(33), metavar="K",
                    help="check 2**K bit patterns spread over the 32-bit range (default 32: all)")
    ap.add_argument("--division-s-offset", type=int, default=0, metavar="J",
                    help="the division's s significands J, J + 2**K, ... (the issue-38 step takes the "
                         "quarter after gpu_check.sh's: 1)")
    ap.add_argument("--division-log2-s", type=int, default=2, choices=range(24), metavar="K",
                    help="the division's significand pairs: every 2**K-th s significand (default 2: a quarter)")
    ap.add_argument("--skip-ports", action="store_true",
                    help="leave out the helpers' device port and FastDivmod (gpu_check.sh's step: issue 38's "
                         "step, bench/gpu_issue38.py, runs them)")
    ap.add_argument("--sim", action="store_true", help="run on tests/cudasim's CPU execution (no GPU)")
    args = ap.parse_args(argv)
    if args.sim:
        sys.path.insert(0, str(ROOT / "tests"))
        from cudasim import install

        install.install()
    import cupy as cp

    cc = cp.cuda.Device().compute_capability
    t0 = time.perf_counter()
    count = 1 << args.log2_count
    result = run(cp, count)
    seconds = time.perf_counter() - t0
    print(f"conformance: {count} float32 patterns, compute capability {cc}, {seconds:.1f}s")
    failed = False
    for form, (n, p) in result.items():
        if form not in FORMS[:2] and int(cc) < 89:
            print(f"  {form}: not on sm_{cc}")
            continue
        print(f"  {form}: {'ok' if n == 0 else f'{n} MISMATCHES, first 0x{p:08x}'}")
        failed |= n != 0
    if not args.skip_ports:
        failed |= _ports(cp, cc, count, args.sim)
    t0 = time.perf_counter()
    # The CPU execution runs one x in 2**12 (a dry run); the GPU every x.
    log2_x = 12 if args.sim else 0
    division = run_division(cp, args.division_log2_s, log2_x, args.division_s_offset)
    pairs = (1 << (23 - args.division_log2_s)) * (1 << (23 - log2_x))
    print(f"division: {pairs} significand pairs (every 2**{args.division_log2_s}-th s from "
          f"{args.division_s_offset}, every "
          f"2**{log2_x}-th x), {time.perf_counter() - t0:.1f}s")
    for form, (n, p) in division.items():
        print(f"  {form}: {'ok' if n == 0 else f'{n} MISMATCHES, first (s, x) significands 0x{p[0]:06x}, 0x{p[1]:06x}'}")
    failed |= division[DIVISION_FORMS[0]][0] != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
