// gpuq's numerical contract as scalar device helpers (../shared/DESIGN.md section 1).
//
//   quantize:    q = clamp(rint(x / s) + zp, qmin, qmax)
//   dequantize:  y = (q - zp) * s
//
// The correctly rounded IEEE quotient x / s (on float32 computed from a reciprocal and
// fused multiply-adds, proven equal: Divisor below), round half to even, the zero
// point added after rounding in integer arithmetic that cannot overflow, then
// saturation; NaN quantizes to the zero point, +/-Inf saturate. Dequantize forms
// (q - zp) in 64-bit integers, converts it once (round to nearest even) and
// multiplies once. The arithmetic is bit-identical to gpuq/backends/numpy_backend.py.
//
// Why the float32 operations are PTX: CuPy appends "-ftz=true" AFTER the
// caller's NVRTC options and NVRTC honours the last occurrence, so passing
// "-ftz=false" does not stop a CuPy compile from flushing subnormals. Every
// float32 instruction whose result a flush could change is therefore written
// below without the `.ftz` modifier (float64 has no flush mode), and
// tests/test_kernels_compile.py checks that the PTX of every kernel is the same
// under -ftz=true and -ftz=false. No float comparisons are used either: NaN is
// recognised from its bits.
//
// float16 is only storage here (widened exactly to float32, narrowed round to
// nearest even), so the kernels do not need <cuda_fp16.h>: NVRTC has no builtin
// copy (checked with NVRTC 13.5) and CuPy finds one only where a CUDA toolkit or
// the nvidia-cuda-runtime headers are installed. A translation unit that needs
// the real header must include it BEFORE this one.
//
// bfloat16 is storage too, gpuq's own type below (not cuda_bf16.h's
// __nv_bfloat16: no header, and the same text whatever the toolkit): the top
// 16 bits of a float32, so widening is a shift and narrowing the round to
// nearest even on the low 16 bits, plain integer operations.
#pragma once

#ifndef __CUDA_FP16_H__
struct __align__(2) __half {
    unsigned short bits;
};
#endif

// bfloat16 storage (ml_dtypes.bfloat16's bits): sign, 8 exponent bits, 7 mantissa bits.
struct __align__(2) gpuq_bf16 {
    unsigned short bits;
};

namespace gpuq {

// ---------------------------------------------------------------------------
// Types

// Code ranges, saturating targets of quantize.
template <typename TQ> struct CodeRange;
template <> struct CodeRange<signed char> {
    static constexpr int lo = -128, hi = 127;
};
template <> struct CodeRange<unsigned char> {
    static constexpr int lo = 0, hi = 255;
};

// ---------------------------------------------------------------------------
// float16 <-> float32 (bit copies keep this independent of how __half is declared)

__device__ __forceinline__ float f16_to_f32_exact(__half h) {
    unsigned short b;
    memcpy(&b, &h, sizeof(b));
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(b));
    return f;
}

__device__ __forceinline__ __half f32_to_f16_rn(float f) {
    unsigned short b;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(b) : "f"(f));
    __half h;
    memcpy(&h, &b, sizeof(b));
    return h;
}

// ---------------------------------------------------------------------------
// bfloat16 <-> float32, integer operations only (no PTX, no flush: the bits are moved)

// Exact: a bfloat16 is the float32 with the same top 16 bits (subnormals, NaN payloads included).
__device__ __forceinline__ float bf16_to_f32_exact(gpuq_bf16 h) {
    return __uint_as_float(static_cast<unsigned>(h.bits) << 16);
}

// Round to nearest even on the 16 dropped bits: adding 0x7fff plus the kept
// lowest bit carries into the kept bits exactly when the dropped part is above
// half, or half with an odd kept part. A carry out of the mantissa raises the
// exponent, which is the correct rounding too (up to +/-Inf from beyond the
// largest bfloat16). Only a NaN could carry into the sign (0x7fffffff + 0x8000):
// NaN becomes the quiet NaN 0x7fc0 with its sign, as ml_dtypes' cast gives it.
__device__ __forceinline__ gpuq_bf16 f32_to_bf16_rn(float f) {
    const unsigned b = __float_as_uint(f);
    gpuq_bf16 h;
    if ((b & 0x7fffffffu) > 0x7f800000u) {
        h.bits = static_cast<unsigned short>(((b >> 16) & 0x8000u) | 0x7fc0u);
    } else {
        h.bits = static_cast<unsigned short>((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
    }
    return h;
}

// Input widening to the compute type TC (float for float16/bfloat16/float32, double for float64).
template <typename TC> __device__ __forceinline__ TC widen(__half x) { return f16_to_f32_exact(x); }
template <typename TC> __device__ __forceinline__ TC widen(gpuq_bf16 x) { return bf16_to_f32_exact(x); }
template <typename TC> __device__ __forceinline__ TC widen(float x) { return x; }
template <typename TC> __device__ __forceinline__ TC widen(double x) { return x; }

// Output narrowing from the compute type (float16, bfloat16: the float32 result rounded to nearest even).
template <typename TOut> __device__ __forceinline__ TOut narrow_rn(float y);
template <> __device__ __forceinline__ float narrow_rn<float>(float y) { return y; }
template <> __device__ __forceinline__ __half narrow_rn<__half>(float y) { return f32_to_f16_rn(y); }
template <> __device__ __forceinline__ gpuq_bf16 narrow_rn<gpuq_bf16>(float y) { return f32_to_bf16_rn(y); }
template <typename TOut> __device__ __forceinline__ TOut narrow_rn(double y);
template <> __device__ __forceinline__ double narrow_rn<double>(double y) { return y; }

// ---------------------------------------------------------------------------
// One IEEE operation each, round to nearest even, subnormals kept.

__device__ __forceinline__ float div_rn(float x, float s) {
    float r;
    asm("div.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(x), "f"(s));
    return r;
}
__device__ __forceinline__ double div_rn(double x, double s) { return __ddiv_rn(x, s); }

__device__ __forceinline__ float mul_rn(float a, float b) {
    float r;
    asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }

// fma.rn.f32: a * b + c rounded once (no .ftz). The exact division below needs the fused
// form; nothing else of the contract may use it (NVRTC would contract a * b + c into one).
__device__ __forceinline__ float fma_rn(float a, float b, float c) {
    float r;
    asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(r) : "f"(a), "f"(b), "f"(c));
    return r;
}

__device__ __forceinline__ bool is_nan(float v) {
    return (__float_as_uint(v) & 0x7fffffffu) > 0x7f800000u;
}
__device__ __forceinline__ bool is_nan(double v) {
    return (static_cast<unsigned long long>(__double_as_longlong(v)) & 0x7fffffffffffffffull) >
           0x7ff0000000000000ull;
}

// rint (round half to even) to an integer, saturating at the integer type's
// range (PTX cvt clamps float-to-integer results by default, so +/-Inf and huge
// values keep their side). NaN is handled by the callers, from the bits.
__device__ __forceinline__ int rint_to_i32_sat(float v) {
    int r;
    asm("cvt.rni.s32.f32 %0, %1;" : "=r"(r) : "f"(v));
    return r;
}
__device__ __forceinline__ int rint_to_i32_sat(double v) {
    int r;
    asm("cvt.rni.s32.f64 %0, %1;" : "=r"(r) : "d"(v));
    return r;
}
__device__ __forceinline__ long long rint_to_i64_sat(float v) {
    long long r;
    asm("cvt.rni.s64.f32 %0, %1;" : "=l"(r) : "f"(v));
    return r;
}
__device__ __forceinline__ long long rint_to_i64_sat(double v) {
    long long r;
    asm("cvt.rni.s64.f64 %0, %1;" : "=l"(r) : "d"(v));
    return r;
}

// int64 -> compute type, rounded to nearest even once.
__device__ __forceinline__ void to_compute_rn(long long d, float& out) {
    asm("cvt.rn.f32.s64 %0, %1;" : "=f"(out) : "l"(d));
}
__device__ __forceinline__ void to_compute_rn(long long d, double& out) {
    asm("cvt.rn.f64.s64 %0, %1;" : "=d"(out) : "l"(d));
}

// ---------------------------------------------------------------------------
// The contract's division x / s from a reciprocal formed once per scale (issue 38).
//
// div.rn.f32 costs about 11 issue slots per element (ptxas: MUFU.RCP, the refinement of the
// reciprocal, the quotient's correction and a slow-path check), and ptxas does not hoist the
// part that depends on s alone. With y = RN(1/s) once per scale, each element takes
//
//   q0 = RN(x * y)
//   e  = fma(-s, q, x)          the residual x - s*q, exact while q is faithful (Markstein)
//   q  = fma(e, y, q)           from q = q0, kRecipSteps times
//
// and the result is RN(x / s), the IEEE quotient: Markstein's theorem (IBM J. Res. Dev.
// 34(1), 1990) gives RN(x/s) from any faithful q with y within half an ulp of 1/s; the first
// step makes q faithful from q0 (up to 1.5 ulp off), so the second is covered. The one-step
// form is Brisebarre, Muller and Raina's "known divisor" scheme (IEEE Trans. Computers 53(8),
// 2004); it is proven here only by sampling (tests/recip_division.cpp) until the GPU check
// runs all 2^46 significand pairs, so the kernels take two steps.
//
// Where it is used: scales in [2^-64, 2^64] only (then y is a normal number and no residual
// of a quotient a code can resolve is inexact); other scales (negative, zero, NaN, tiny,
// huge) keep div.rn. Within that range the quotient equals x / s bit for bit except where no
// code can tell: |x/s| and |q| both below 2^-24 (subnormal x, quotients near 2^-126), or both
// at least 2^100 (x * y overflowed: q0 = +/-Inf is taken, every code saturates). A NaN step
// (x = +/-Inf, or the overflow) falls back to q0, and the sign is x's (s > 0), so -0 stays
// -0. tests/recip_division.cpp states this very sequence and counts those classes; the GPU
// conformance step (bench/gpu_conformance.py) checks it against div.rn on the device.
// float64 keeps __ddiv_rn.
constexpr int kRecipSteps = 2;

template <typename TC> struct Divisor;
template <> struct Divisor<float> {
    float s;    // the scale
    float ns;   // -s, the residual's multiplier
    float y;    // RN(1 / s)
    bool fast;  // 2^-64 <= s <= 2^64 (from the bits: no float compare, no .ftz question)
    __device__ __forceinline__ float operator()(float x) const {
        if (!fast) return div_rn(x, s);
        const float q0 = mul_rn(x, y);
        float q = q0;
#pragma unroll
        for (int k = 0; k < kRecipSteps; ++k) q = fma_rn(fma_rn(ns, q, x), y, q);
        if (is_nan(q)) q = q0;
        return __uint_as_float((__float_as_uint(q) & 0x7fffffffu) | (__float_as_uint(x) & 0x80000000u));
    }
};
template <> struct Divisor<double> {
    double s;
    __device__ __forceinline__ double operator()(double x) const { return __ddiv_rn(x, s); }
};

// The divisor of scale s, formed at each scale (re)load.
__device__ __forceinline__ Divisor<float> divisor(float s) {
    const unsigned b = __float_as_uint(s);
    // Positive floats order as their bits; a negative s or a NaN lands above 2^64's bits.
    const bool fast = b - 0x1f800000u <= 0x5f800000u - 0x1f800000u;  // 2^-64 .. 2^64
    return {s, __uint_as_float(b ^ 0x80000000u), div_rn(1.0f, s), fast};
}
__device__ __forceinline__ Divisor<double> divisor(double s) { return {s}; }

// ---------------------------------------------------------------------------
// The contract, one element at a time.

// rint (round half to even) straight to an 8-bit code, saturating, NaN -> 0:
// cvt.rni.sat.{s8,u8}.f32 is the whole symmetric contract after the division in
// one instruction (PTX ISA cvt: NaN converts to 0 for a non-.f64 source and a
// destination other than .s64/.u64; .sat clamps to the destination's range).
// The 32-bit register holds the code extended by the destination's signedness;
// only its low byte is kept. float64 has the same semantics through int32.
template <typename TQ> __device__ __forceinline__ TQ rint_to_code_sat(float v);
template <> __device__ __forceinline__ signed char rint_to_code_sat<signed char>(float v) {
    int r;
    asm("cvt.rni.sat.s8.f32 %0, %1;" : "=r"(r) : "f"(v));
    return static_cast<signed char>(r);
}
template <> __device__ __forceinline__ unsigned char rint_to_code_sat<unsigned char>(float v) {
    int r;
    asm("cvt.rni.sat.u8.f32 %0, %1;" : "=r"(r) : "f"(v));
    return static_cast<unsigned char>(r);
}
template <typename TQ> __device__ __forceinline__ TQ rint_to_code_sat(double v) {
    // Saturating to int32 first keeps the side, so 32-bit integers suffice.
    const int r = is_nan(v) ? 0 : rint_to_i32_sat(v);
    return static_cast<TQ>(min(max(r, CodeRange<TQ>::lo), CodeRange<TQ>::hi));
}

// A zero point with its clamp bounds. clamp(r + zp, qmin, qmax) equals
// clamp(r, qmin - zp, qmax - zp) + zp for every integer r and int32 zp, and the
// bounds depend on zp alone: kernels form them once per zero point, not per
// element (two clamps per element instead of four). While |zp| <= 2^30 the
// bounds and the sum fit int32 with room to spare, and a rint saturated to
// int32 (cvt.rni.s32.f32: NaN -> 0, so NaN gives zp) stays on its side of both
// bounds: the 32-bit form is exact there. Beyond it (zp = INT32_MIN and a
// quotient of 2^31 + 100 would wrap) the bounds are 64-bit.
template <typename TQ>
struct ZeroPoint {
    long long lo, hi;  // qmin - zp, qmax - zp
    long long zp;      // widened once here, not at every element's add
    bool narrow;       // |zp| <= 2^30: lo32/hi32/zp32 hold the same bounds in int32
    int lo32, hi32, zp32;
};
template <typename TQ>
__device__ __forceinline__ ZeroPoint<TQ> zero_point(int zp) {
    const long long lo = CodeRange<TQ>::lo - static_cast<long long>(zp);
    const long long hi = CodeRange<TQ>::hi - static_cast<long long>(zp);
    const bool narrow = zp >= -(1 << 30) && zp <= (1 << 30);
    return {lo, hi, static_cast<long long>(zp), narrow, static_cast<int>(lo), static_cast<int>(hi), zp};
}

// Quantize with a zero point: clamp(rint(x / s) + zp, qmin, qmax); NaN -> zp.
// The rint saturates: a huge |x / s| stays beyond the bounds on its side, and
// the sum of the clamped value and zp is in [qmin, qmax], so nothing overflows.
// The 64-bit path maps NaN to 0 from the bits (cvt.rni.s64 gives INT64_MIN).
template <typename TQ, typename TC>
__device__ __forceinline__ TQ quantize_rn_zp(TC x, const Divisor<TC>& s, const ZeroPoint<TQ>& zp) {
    const TC v = s(x);
    if constexpr (sizeof(TC) == 4) {
        if (zp.narrow) return static_cast<TQ>(min(max(rint_to_i32_sat(v), zp.lo32), zp.hi32) + zp.zp32);
    }
    const long long r = is_nan(v) ? 0LL : rint_to_i64_sat(v);
    return static_cast<TQ>(min(max(r, zp.lo), zp.hi) + zp.zp);
}

// Symmetric quantize (zp = 0): clamp(rint(x / s), qmin, qmax); NaN -> 0.
template <typename TQ, typename TC>
__device__ __forceinline__ TQ quantize_rn_sym(TC x, const Divisor<TC>& s) {
    return rint_to_code_sat<TQ>(s(x));
}

// Dequantize with a zero point: (q - zp) in int64 (|q - zp| can exceed int32),
// one conversion to the compute type, one multiplication.
template <typename TC, typename TQ>
__device__ __forceinline__ TC dequantize_rn_zp(TQ q, TC s, int zp) {
    TC d;
    to_compute_rn(static_cast<long long>(q) - static_cast<long long>(zp), d);
    return mul_rn(d, s);
}

// Symmetric dequantize: q * s (q converts exactly).
template <typename TC, typename TQ>
__device__ __forceinline__ TC dequantize_rn_sym(TQ q, TC s) {
    return mul_rn(static_cast<TC>(static_cast<int>(q)), s);
}

}  // namespace gpuq
