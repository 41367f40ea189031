// The code formats beyond int8/uint8 (../shared/DESIGN.md section 1): fp8 (e4m3fn, e5m2),
// packed int4/uint4, fp6 and packed fp4 (at the end), quantize and dequantize, every scheme in
// one launch.
//
//   fp8:   q = fp8(x / s)          round to nearest even; saturating or ONNX's
//                                  non-saturating cast; NaN -> NaN; float64: the float64
//                                  quotient rounded to float32 once, then to fp8
//          y = widen(q) * s        exact widening, one multiplication
//   int4:  the int8 formula (contract.cuh) with ranges [-8, 7] / [0, 15], two codes per
//          byte: element 2k in the low nibble of byte k, 2k + 1 in the high one.
//
// The fp8 conversion is integer operations on the float32 bits (plus one exact scaling
// for fp8 subnormals), so every architecture gives the same bits; on sm_89+ the
// saturating cast is PTX's cvt.rn.satfinite.{e4m3,e5m2}x2.f32 instead, which gives
// those same bits for every non-NaN quotient (tests/cudasim proves the kernels at
// both __CUDA_ARCH__ 800 and 900 against the host backend; the GPU check compares
// the instruction with its host helper on every float32). gpuq/backends/host/formats.py
// states the same algorithm for the host and says why it rounds correctly.
//
// Packed int4: a thread owns units of 16 elements starting at an even element, so it
// writes whole bytes (8 per unit) and no byte has two writers; the CPU execution of
// the kernels checks that (tests/cudasim, store records).
//
// Instantiated by name from Python (gpuq/backends/cuda/registry.py), e.g.
//   gpuq::quantize_fp8<float, 0, float, 1>           e4m3fn, per-channel
//   gpuq::quantize_int4<__half, true, float, true, 2> int4 with zero points, per-group
#include "contract.cuh"
#include "elementwise.cuh"

// The CPU execution of the kernels (tests/cudasim) defines this hook to check that no
// two threads of a launch write the same packed byte; on a GPU it is nothing.
#ifndef GPUQ_RECORD_STORE
#define GPUQ_RECORD_STORE(ptr, nbytes)
#endif

namespace gpuq {

// ---------------------------------------------------------------------------
// fp8 layouts: FMT 0 = e4m3fn (no Inf; 0x7f NaN), 1 = e5m2 (IEEE-like).

template <int FMT> struct Fp8;
template <> struct Fp8<0> {
    static constexpr int bits = 8, mbits = 3, bias = 7;
    static constexpr unsigned min_normal = 0x3c800000u;  // 2^-6 as float32 bits
    static constexpr unsigned max_bits = 0x43e00000u;    // 448
    static constexpr unsigned max_code = 0x7e;
    // Non-saturating overflow: above 464 (halfway to NaN's slot; 464 itself rounds to 448).
    static constexpr unsigned over_bits = 0x43e80000u, over_code = 0x7f;
    static constexpr bool over_inclusive = false;
    static constexpr unsigned nan_code = 0x7f;
    static constexpr float sub_scale = 512.0f;  // 2^9: fp8 subnormal step 2^-9
};
template <> struct Fp8<1> {
    static constexpr int bits = 8, mbits = 2, bias = 15;
    static constexpr unsigned min_normal = 0x38800000u;  // 2^-14
    static constexpr unsigned max_bits = 0x47600000u;    // 57344
    static constexpr unsigned max_code = 0x7b;
    // From 61440 (the tie between 57344 and 65536 rounds to Inf's even mantissa): Inf.
    static constexpr unsigned over_bits = 0x47700000u, over_code = 0x7c;
    static constexpr bool over_inclusive = true;
    static constexpr unsigned nan_code = 0x7e;
    static constexpr float sub_scale = 65536.0f;  // 2^16
};

// The sign bit of an input, read from its own bits (widening a float16 NaN in PTX gives the
// canonical NaN, whose sign is not the input's).
__device__ __forceinline__ bool sign_bit(float v) { return (__float_as_uint(v) >> 31) != 0; }
__device__ __forceinline__ bool sign_bit(double v) { return __double_as_longlong(v) < 0; }
__device__ __forceinline__ bool sign_bit(gpuq_bf16 v) { return (v.bits & 0x8000u) != 0; }
__device__ __forceinline__ bool sign_bit(__half v) {
    unsigned short b;
    memcpy(&b, &v, sizeof(b));
    return (b & 0x8000u) != 0;
}

__device__ __forceinline__ float to_f32_rn(float v) { return v; }
__device__ __forceinline__ float to_f32_rn(double v) {  // no .ftz: float32 subnormals kept
    float r;
    asm("cvt.rn.f32.f64 %0, %1;" : "=f"(r) : "d"(v));
    return r;
}

// float32 -> fp8 bits, round to nearest even.
template <int FMT, bool SAT>
__device__ __forceinline__ unsigned char f32_to_fp8(float t) {
    using F = Fp8<FMT>;
    constexpr int shift = 23 - F::mbits;
    const unsigned u = __float_as_uint(t);
    const unsigned a = u & 0x7fffffffu;
    unsigned r;
    if (a > 0x7f800000u) {
        r = F::nan_code;
    } else if (SAT && a > F::max_bits) {
        r = F::max_code;  // beyond the largest finite value, +/-Inf included
    } else if (!SAT && (F::over_inclusive ? a >= F::over_bits : a > F::over_bits)) {
        r = F::over_code;
    } else if (a >= F::min_normal) {
        // Round half to even on the dropped bits, then rebase the exponent (127 -> bias);
        // a carry out of the mantissa raises the exponent, which is correct rounding too.
        r = ((a + (1u << (shift - 1)) - 1u + ((a >> shift) & 1u)) >> shift) - ((127u - F::bias) << F::mbits);
    } else {
        // Subnormal fp8: |t| times 2^(bias - 1 + mbits) is exact (a power of two, no
        // underflow), its rint the mantissa (8 / 4 = the smallest normal: also right).
        r = static_cast<unsigned>(rint_to_i32_sat(mul_rn(__uint_as_float(a), F::sub_scale)));
    }
    return static_cast<unsigned char>(r | ((u >> 24) & 0x80u));
}

#if __CUDA_ARCH__ >= 890
// float32 -> fp8 bits by cvt.rn.satfinite.{e4m3,e5m2}x2.f32 (sm_89+): round to nearest even,
// |t| > MAX_NORM (Inf included) -> +/-MAX_NORM, zeros and every finite value keep their sign:
// f32_to_fp8<FMT, true> for every non-NaN t. `d, a, b` puts cvt(a) in the high byte; t goes in
// b, the low byte, and a is 0.
template <int FMT>
__device__ __forceinline__ unsigned char f32_to_fp8_satfinite(float t) {
    unsigned short d;
    const float zero = 0.0f;
    if constexpr (FMT == 0) {
        asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(d) : "f"(zero), "f"(t));
    } else {
        asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(d) : "f"(zero), "f"(t));
    }
    return static_cast<unsigned char>(d & 0xffu);
}
#endif

// Sign-magnitude float bits of format F (fp8's e4m3, fp4/fp6; no NaN or Inf code among the
// bits given) -> float32 in integer operations, exactly; the bits above F::bits are not read.
template <typename F>
__device__ __forceinline__ float sign_magnitude_to_f32(unsigned b) {
    constexpr unsigned top = 1u << (F::bits - 1);
    const unsigned sign = (b & top) ? 0x80000000u : 0u;
    const unsigned e = (b & (top - 1u)) >> F::mbits;
    const unsigned m = b & ((1u << F::mbits) - 1u);
    if (e != 0) return __uint_as_float(sign | ((e + 127u - F::bias) << 23) | (m << (23 - F::mbits)));
    // Subnormal (or zero): m times the step, both exact in float32.
    float v;
    to_compute_rn(static_cast<long long>(m), v);
    v = mul_rn(v, 1.0f / F::sub_scale);
    return __uint_as_float(__float_as_uint(v) | sign);
}

// e4m3 bits other than NaN -> float32: the decode before sm_89 and the reference
// bench/gpu_conformance.py holds the hardware's decode to.
__device__ __forceinline__ float e4m3_to_f32_soft(unsigned char b) {
    return sign_magnitude_to_f32<Fp8<0>>(b);
}

#if __CUDA_ARCH__ >= 890
// e4m3 bits other than NaN -> float32 by the hardware (sm_89+): every e4m3 value is a float16, and
// cvt.rn.f16x2.e4m3x2 puts the low byte's float16 in the low half; then one exact widening.
__device__ __forceinline__ float e4m3_to_f32_hw(unsigned char b) {
    unsigned d;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(d) : "h"(static_cast<unsigned short>(b)));
    const unsigned short h = static_cast<unsigned short>(d & 0xffffu);
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
#endif

// fp8 bits -> float32, exactly; a NaN code gives the default quiet NaN with its sign.
template <int FMT>
__device__ __forceinline__ float fp8_to_f32(unsigned char b) {
    using F = Fp8<FMT>;
    const unsigned e = (b & 0x7fu) >> F::mbits;
    const unsigned m = b & ((1u << F::mbits) - 1u);
    constexpr unsigned emax = (0x80u >> F::mbits) - 1u;
    const bool nan = FMT == 0 ? (b & 0x7fu) == 0x7fu : (e == emax && m != 0);
    if (nan) return __uint_as_float((static_cast<unsigned>(b & 0x80u) << 24) | 0x7fc00000u);
    if constexpr (FMT == 1) {
        // e5m2 is float16's upper byte (same exponent field and bias): one exact widening
        // covers zeros, subnormals, normals and Inf on every architecture.
        const unsigned short h = static_cast<unsigned short>(b) << 8;
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
        return f;
    } else {
#if __CUDA_ARCH__ >= 890
        return e4m3_to_f32_hw(b);
#else
        return e4m3_to_f32_soft(b);
#endif
    }
}

__device__ __forceinline__ void widen_fp8_to(float f, float& out) { out = f; }
__device__ __forceinline__ void widen_fp8_to(float f, double& out) {  // exact; no .ftz
    asm("cvt.f64.f32 %0, %1;" : "=d"(out) : "f"(f));
}

// NaN out of the multiplication must be the output type's default NaN with the code's
// sign (the GPU's mul gives its canonical NaN, the host keeps the operand's payload).
__device__ __forceinline__ float default_nan_like(float v, float) {
    return __uint_as_float((__float_as_uint(v) & 0x80000000u) | 0x7fc00000u);
}
__device__ __forceinline__ double default_nan_like(double, float code) {
    const unsigned long long s = static_cast<unsigned long long>(__float_as_uint(code) & 0x80000000u) << 32;
    return __longlong_as_double(static_cast<long long>(s | 0x7ff8000000000000ull));
}

// Output narrowing where the value may be NaN: float16 gives the quiet 0x7e00 with the
// NaN's sign, as NumPy's cast does (the hardware's cvt gives its canonical NaN).
template <typename TOut> __device__ __forceinline__ TOut narrow_nan_kept(float y) { return narrow_rn<TOut>(y); }
template <typename TOut> __device__ __forceinline__ TOut narrow_nan_kept(double y) { return narrow_rn<TOut>(y); }
template <> __device__ __forceinline__ __half narrow_nan_kept<__half>(float y) {
    if (!is_nan(y)) return narrow_rn<__half>(y);
    const unsigned short b = static_cast<unsigned short>(((__float_as_uint(y) >> 16) & 0x8000u) | 0x7e00u);
    __half h;
    memcpy(&h, &b, sizeof(b));
    return h;
}

template <typename TIn, int FMT, typename TS>
struct QuantizeFp8Op : QuantCursor<TS, false> {
    using QuantCursor<TS, false>::d;
    bool saturate;  // uniform over the launch: a branch, not a second instantiation
    __device__ unsigned char operator()(TIn x) const {
        const TS w = widen<TS>(x);
        // A NaN keeps its sign (the host's division does; the GPU's gives its canonical NaN).
        if (is_nan(w)) return static_cast<unsigned char>(Fp8<FMT>::nan_code | (sign_bit(x) ? 0x80u : 0u));
        const float t = to_f32_rn(d(w));
        // A NaN quotient of a number (Inf / Inf, 0 / 0: unchecked scales) takes x's sign too, as
        // on the host (the GPU's division gives its positive canonical NaN, x86 a negative one).
        if (is_nan(t)) return static_cast<unsigned char>(Fp8<FMT>::nan_code | (sign_bit(x) ? 0x80u : 0u));
#if __CUDA_ARCH__ >= 890
        // The hardware conversion is the saturating cast (t is no NaN here).
        if (saturate) return f32_to_fp8_satfinite<FMT>(t);
#endif
        return saturate ? f32_to_fp8<FMT, true>(t) : f32_to_fp8<FMT, false>(t);
    }
};

template <int FMT, typename TOut, typename TS>
struct DequantizeFp8Op : ParamCursor<TS, false> {
    using ParamCursor<TS, false>::s;
    __device__ TOut operator()(unsigned char q) const {
        const float f = fp8_to_f32<FMT>(q);
        TS w;
        widen_fp8_to(f, w);
        TS y = mul_rn(w, s);
        if (is_nan(w)) y = default_nan_like(w, f);
        return narrow_nan_kept<TOut>(y);
    }
};

// x: n contiguous inputs; q: n contiguous fp8 codes (bits); the rest as gpuq::quantize
// (quantize.cu): head/vec, the map arguments, scales in the compute type TS; saturate:
// 1 for ONNX's saturate=True, 0 for the non-saturating cast.
template <typename TIn, int FMT, typename TS, int MAP>
__global__ void __launch_bounds__(256)
quantize_fp8(const TIn* __restrict__ x, unsigned char* __restrict__ q, const TS* __restrict__ scales,
             const int* __restrict__ zps, long long n, long long head, int vec, long long m0, long long m1,
             long long m2, const long long* __restrict__ dims, int saturate) {
    QuantizeFp8Op<TIn, FMT, TS> op{{{scales, zps, TS(0), 0}, {}}, saturate != 0};
    if constexpr (MAP == kMapValue) op.assign(scale_from_bits<TS>(m0), 0);
    for_each_unit<typename MapOf<MAP>::type, TIn, unsigned char, true>(x, q, n, head, vec, m0, m1, m2, dims, op);
}

template <int FMT, typename TOut, typename TS, int MAP>
__global__ void __launch_bounds__(256)
dequantize_fp8(const unsigned char* __restrict__ q, TOut* __restrict__ y, const TS* __restrict__ scales,
               const int* __restrict__ zps, long long n, long long head, int vec, long long m0, long long m1,
               long long m2, const long long* __restrict__ dims) {
    DequantizeFp8Op<FMT, TOut, TS> op{{scales, zps, TS(0), 0}};
    if constexpr (MAP == kMapValue) op.assign(scale_from_bits<TS>(m0), 0);
    for_each_unit<typename MapOf<MAP>::type, unsigned char, TOut, false>(q, y, n, head, vec, m0, m1, m2, dims, op);
}

// ---------------------------------------------------------------------------
// Packed int4/uint4

template <bool SIGNED> struct Int4Range;
template <> struct Int4Range<true> { static constexpr int lo = -8, hi = 7; };
template <> struct Int4Range<false> { static constexpr int lo = 0, hi = 15; };

template <typename TIn, bool SIGNED, typename TS, bool HAS_ZP>
struct QuantizeInt4Op : QuantCursor<TS, HAS_ZP> {
    using Cursor = QuantCursor<TS, HAS_ZP>;
    using Cursor::d;
    using Cursor::z;
    long long lo, hi, zpl;  // the zero point's clamp bounds (contract.cuh ZeroPoint), formed per reload
    __device__ void bounds() {
        if constexpr (HAS_ZP) {
            zpl = z;
            lo = Int4Range<SIGNED>::lo - zpl;
            hi = Int4Range<SIGNED>::hi - zpl;
        }
    }
    __device__ void reload(long long p) {
        Cursor::reload(p);
        bounds();
    }
    __device__ void assign(TS scale, int zp) {
        Cursor::assign(scale, zp);
        bounds();
    }
    // The code's nibble (two's complement for int4).
    __device__ unsigned operator()(TIn x) const {
        const TS v = d(widen<TS>(x));
        if constexpr (HAS_ZP) {
            const long long r = is_nan(v) ? 0LL : rint_to_i64_sat(v);
            return static_cast<unsigned>(min(max(r, lo), hi) + zpl) & 0xfu;
        } else {
            const int r = is_nan(v) ? 0 : rint_to_i32_sat(v);
            return static_cast<unsigned>(min(max(r, Int4Range<SIGNED>::lo), Int4Range<SIGNED>::hi)) & 0xfu;
        }
    }
};

template <bool SIGNED, typename TOut, typename TS, bool HAS_ZP>
struct DequantizeInt4Op : ParamCursor<TS, HAS_ZP> {
    using ParamCursor<TS, HAS_ZP>::s;
    using ParamCursor<TS, HAS_ZP>::z;
    __device__ TOut operator()(unsigned nibble) const {
        const int q = SIGNED ? static_cast<int>(nibble ^ 8u) - 8 : static_cast<int>(nibble);
        if constexpr (HAS_ZP) {
            return narrow_rn<TOut>(dequantize_rn_zp<TS>(q, s, z));
        } else {
            return narrow_rn<TOut>(dequantize_rn_sym<TS>(q, s));
        }
    }
};

// Bit flags of the int4 kernels' `vec`: the float side may use 16-byte vectors (as
// kVecFloat), the packed side 8-byte stores/loads.
constexpr int kVecPacked = 2;

// Units of 16 elements from element 16u: 8 packed bytes, the last unit shorter
// (ceil(len / 2) bytes, an odd count's last high nibble 0).
template <typename Map, typename TIn, typename Op>
__device__ __forceinline__ void for_each_packed_unit(const TIn* __restrict__ in, unsigned char* __restrict__ out,
                                                     long long n, int vec, long long m0, long long m1,
                                                     long long m2, const long long* dims, Op op) {
    if constexpr (HasBlock2D<Map>::value) {  // the 2-D block map's launch (elementwise.cuh)
        if (packed_divisor(m0)) {
            for_each_packed_unit<Block2DMap, TIn>(in, out, n, vec, m0, m1, m2, dims, op);
            return;
        }
    }
    const long long units = (n + kUnit - 1) / kUnit;
    const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
    Map map(m0, m1, m2, dims);
    for (long long u = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; u < units; u += stride) {
        const long long begin = u * kUnit;
        const long long rest = n - begin;
        const int len = rest < kUnit ? static_cast<int>(rest) : kUnit;
        TIn x[kUnit];
        if (len == kUnit && (vec & kVecFloat)) {
            load_unit_vec(x, in + begin);
        } else {
#pragma unroll
            for (int l = 0; l < kUnit; ++l)
                if (l < len) x[l] = in[begin + l];
        }
        map.seek(begin);
        if constexpr (kLoadsParams<Map>) op.reload(map.index());
        // The 16 nibbles go straight into two 32-bit words (element l at bit 4 (l % 8) of word
        // l / 8): little-endian, byte k of the pair is then elements 2k (low nibble) and 2k + 1.
        // One shift-or per element at constant shifts, where a byte array took byte inserts.
        unsigned words[2] = {0u, 0u};
        const bool uniform = len == kUnit && map.uniform();
#pragma unroll
        for (int l = 0; l < kUnit; ++l) {
            if (l < len) {
                if (!uniform && l > 0 && map.next()) op.reload(map.index());
                words[l / 8] |= static_cast<unsigned>(op(x[l])) << (4 * (l % 8));
            }
        }
        unsigned char* dst = out + begin / 2;
        GPUQ_RECORD_STORE(dst, (len + 1) / 2);
        if (len == kUnit && (vec & kVecPacked)) {
            // A vector type, not a plain 8-byte integer: the CPU execution of the kernels
            // checks a vector store's alignment as a GPU enforces it (kVecPacked's promise).
            *reinterpret_cast<uint2*>(dst) = make_uint2(words[0], words[1]);
        } else {
            const int nbytes = (len + 1) / 2;
#pragma unroll
            for (int k = 0; k < kUnit / 2; ++k)
                if (k < nbytes) dst[k] = static_cast<unsigned char>(words[k / 4] >> (8 * (k % 4)));
        }
    }
}

template <typename Map, typename TOut, typename Op>
__device__ __forceinline__ void for_each_unpacked_unit(const unsigned char* __restrict__ in, TOut* __restrict__ out,
                                                       long long n, int vec, long long m0, long long m1,
                                                       long long m2, const long long* dims, Op op) {
    if constexpr (HasBlock2D<Map>::value) {  // the 2-D block map's launch (elementwise.cuh)
        if (packed_divisor(m0)) {
            for_each_unpacked_unit<Block2DMap, TOut>(in, out, n, vec, m0, m1, m2, dims, op);
            return;
        }
    }
    const long long units = (n + kUnit - 1) / kUnit;
    const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
    const int lane = threadIdx.x & 31;
    Map map(m0, m1, m2, dims);
    // Every lane of a warp takes every iteration: the outputs go out a warp at a time.
    for (long long u = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; u - lane < units;
         u += stride) {
        const long long u0 = u - lane;
        if ((u0 + 32) * kUnit <= n && (vec & kVecFloat) && (vec & kVecPacked)) {
            // The warp's 32 units all full: the warp-contiguous decode (elementwise.cuh), 4 codes
            // (2 bytes) in per lane and span.
            decode_warp_spans<unsigned>(map, op, u0 * kUnit, out, [&](long long b, unsigned (&c)[4]) {
                const unsigned word = __ldg(reinterpret_cast<const unsigned short*>(in + b / 2));
#pragma unroll
                for (int l = 0; l < 4; ++l) c[l] = (word >> (4 * l)) & 0xfu;
            });
            continue;
        }
        const long long begin = u * kUnit;
        const long long rest = n - begin;
        const int len = u >= units ? 0 : (rest < kUnit ? static_cast<int>(rest) : kUnit);
        const unsigned char* src = in + begin / 2;
        unsigned char bytes[kUnit / 2];
        if (len == kUnit && (vec & kVecPacked)) {
            const unsigned long long word = __ldg(reinterpret_cast<const unsigned long long*>(src));
            memcpy(bytes, &word, sizeof(word));
        } else {
            const int nbytes = (len + 1) / 2;
#pragma unroll
            for (int k = 0; k < kUnit / 2; ++k) bytes[k] = k < nbytes ? src[k] : 0;
        }
        TOut y[kUnit];
        if (len > 0) {
            map.seek(begin);
            if constexpr (kLoadsParams<Map>) op.reload(map.index());
            const bool uniform = len == kUnit && map.uniform();
#pragma unroll
            for (int l = 0; l < kUnit; ++l) {
                if (l < len) {
                    if (!uniform && l > 0 && map.next()) op.reload(map.index());
                    y[l] = op((bytes[l / 2] >> (4 * (l & 1))) & 0xfu);
                }
            }
        }
        const bool whole = len == kUnit && (vec & kVecFloat);
        store_units_coalesced(out, (u - lane) * kUnit, y, whole);
        if (!whole) {
#pragma unroll
            for (int l = 0; l < kUnit; ++l)
                if (l < len) out[begin + l] = y[l];
        }
    }
}

// x: n contiguous inputs; q: ceil(n / 2) packed bytes; scales/zps/maps as gpuq::quantize;
// vec: kVecFloat if x is 16-byte aligned, kVecPacked if q is 8-byte aligned.
template <typename TIn, bool SIGNED, typename TS, bool HAS_ZP, int MAP>
__global__ void __launch_bounds__(256)
quantize_int4(const TIn* __restrict__ x, unsigned char* __restrict__ q, const TS* __restrict__ scales,
              const int* __restrict__ zps, long long n, int vec, long long m0, long long m1, long long m2,
              const long long* __restrict__ dims) {
    QuantizeInt4Op<TIn, SIGNED, TS, HAS_ZP> op{{{scales, zps, TS(0), 0}, {}}, 0, 0, 0};
    if constexpr (MAP == kMapValue) op.assign(scale_from_bits<TS>(m0), static_cast<int>(m1));
    for_each_packed_unit<typename MapOf<MAP>::type, TIn>(x, q, n, vec, m0, m1, m2, dims, op);
}

template <bool SIGNED, typename TOut, typename TS, bool HAS_ZP, int MAP>
__global__ void __launch_bounds__(256)
dequantize_int4(const unsigned char* __restrict__ q, TOut* __restrict__ y, const TS* __restrict__ scales,
                const int* __restrict__ zps, long long n, int vec, long long m0, long long m1, long long m2,
                const long long* __restrict__ dims) {
    DequantizeInt4Op<SIGNED, TOut, TS, HAS_ZP> op{{scales, zps, TS(0), 0}};
    if constexpr (MAP == kMapValue) op.assign(scale_from_bits<TS>(m0), static_cast<int>(m1));
    for_each_unpacked_unit<typename MapOf<MAP>::type, TOut>(q, y, n, vec, m0, m1, m2, dims, op);
}

// ---------------------------------------------------------------------------
// fp4 (e2m1, packed as int4) and fp6 (e2m3, e3m2, one code per byte): OCP MX's element
// types. No Inf or NaN: always saturating (+/-Inf gives +/-max), NaN gives the +0 code,
// -0.0 the -0 code. The conversion is f32_to_fp8's integer operations with these layouts
// (sm_90 has no fp4/fp6 cvt; gpuq/backends/host/formats.py states the same algorithm).
// MFMT 0 = e2m1, 1 = e2m3, 2 = e3m2 (gpuq/backends/cuda/registry.py MINI_FMT).

template <int MFMT> struct Mini;
template <> struct Mini<0> {  // e2m1: max 6, smallest normal 1, subnormal step 0.5
    static constexpr int bits = 4, mbits = 1, bias = 1;
    static constexpr unsigned min_normal = 0x3f800000u, max_bits = 0x40c00000u, max_code = 0x7u;
    static constexpr float sub_scale = 2.0f;
};
template <> struct Mini<1> {  // e2m3: max 7.5, smallest normal 1, subnormal step 0.125
    static constexpr int bits = 6, mbits = 3, bias = 1;
    static constexpr unsigned min_normal = 0x3f800000u, max_bits = 0x40f00000u, max_code = 0x1fu;
    static constexpr float sub_scale = 8.0f;
};
template <> struct Mini<2> {  // e3m2: max 28, smallest normal 0.25, subnormal step 0.0625
    static constexpr int bits = 6, mbits = 2, bias = 3;
    static constexpr unsigned min_normal = 0x3e800000u, max_bits = 0x41e00000u, max_code = 0x1fu;
    static constexpr float sub_scale = 16.0f;
};

// float32 -> fp4/fp6 bits, round to nearest even, saturating; NaN -> 0.
template <int MFMT>
__device__ __forceinline__ unsigned char f32_to_mini(float t) {
    using F = Mini<MFMT>;
    constexpr int shift = 23 - F::mbits;
    const unsigned u = __float_as_uint(t);
    const unsigned a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return 0;
    unsigned r;
    if (a > F::max_bits) {
        r = F::max_code;
    } else if (a >= F::min_normal) {
        r = ((a + (1u << (shift - 1)) - 1u + ((a >> shift) & 1u)) >> shift) - ((127u - F::bias) << F::mbits);
    } else {
        r = static_cast<unsigned>(rint_to_i32_sat(mul_rn(__uint_as_float(a), F::sub_scale)));
    }
    return static_cast<unsigned char>(r | ((u >> (32 - F::bits)) & (1u << (F::bits - 1))));
}

// fp4/fp6 bits -> float32, exactly (the bits above the code's are not read).
template <int MFMT>
__device__ __forceinline__ float mini_to_f32(unsigned b) {
    return sign_magnitude_to_f32<Mini<MFMT>>(b);
}

template <typename TIn, int MFMT, typename TS>
struct QuantizeMiniOp : QuantCursor<TS, false> {
    using QuantCursor<TS, false>::d;
    __device__ unsigned char operator()(TIn x) const {
        const TS w = widen<TS>(x);
        if (is_nan(w)) return 0;
        return f32_to_mini<MFMT>(to_f32_rn(d(w)));
    }
};

template <int MFMT, typename TOut, typename TS>
struct DequantizeMiniOp : ParamCursor<TS, false> {
    using ParamCursor<TS, false>::s;
    __device__ TOut operator()(unsigned q) const {
        TS w;
        widen_fp8_to(mini_to_f32<MFMT>(q), w);
        return narrow_rn<TOut>(mul_rn(w, s));
    }
};

// fp6: one code per byte, the fp8 kernels' traversal and arguments (no saturate flag).
template <int MAP, typename TS, bool QUANT, typename TIn, typename TOut, typename Op>
__device__ __forceinline__ void fp6_units(const TIn* __restrict__ in, TOut* __restrict__ out, Op op, long long n,
                                          long long head, int vec, long long m0, long long m1, long long m2,
                                          const long long* __restrict__ dims) {
    if constexpr (MAP == kMapValue) op.assign(scale_from_bits<TS>(m0), 0);
    for_each_unit<typename MapOf<MAP>::type, TIn, TOut, QUANT>(in, out, n, head, vec, m0, m1, m2, dims, op);
}

template <typename TIn, int MFMT, typename TS, int MAP>
__global__ void __launch_bounds__(256)
quantize_fp6(const TIn* __restrict__ x, unsigned char* __restrict__ q, const TS* __restrict__ scales,
             const int* __restrict__ zps, long long n, long long head, int vec, long long m0, long long m1,
             long long m2, const long long* __restrict__ dims) {
    fp6_units<MAP, TS, true>(x, q, QuantizeMiniOp<TIn, MFMT, TS>{{{scales, zps, TS(0), 0}, {}}}, n, head, vec, m0, m1,
                             m2, dims);
}

template <int MFMT, typename TOut, typename TS, int MAP>
__global__ void __launch_bounds__(256)
dequantize_fp6(const unsigned char* __restrict__ q, TOut* __restrict__ y, const TS* __restrict__ scales,
               const int* __restrict__ zps, long long n, long long head, int vec, long long m0, long long m1,
               long long m2, const long long* __restrict__ dims) {
    fp6_units<MAP, TS, false>(q, y, DequantizeMiniOp<MFMT, TOut, TS>{{scales, zps, TS(0), 0}}, n, head, vec, m0,
                              m1, m2, dims);
}

// fp4: packed as int4, the int4 kernels' traversal and arguments (zps unused).
template <typename TIn, typename TS, int MAP>
__global__ void __launch_bounds__(256)
quantize_fp4(const TIn* __restrict__ x, unsigned char* __restrict__ q, const TS* __restrict__ scales,
             const int* __restrict__ zps, long long n, int vec, long long m0, long long m1, long long m2,
             const long long* __restrict__ dims) {
    QuantizeMiniOp<TIn, 0, TS> op{{{scales, zps, TS(0), 0}, {}}};
    if constexpr (MAP == kMapValue) op.assign(scale_from_bits<TS>(m0), 0);
    for_each_packed_unit<typename MapOf<MAP>::type, TIn>(x, q, n, vec, m0, m1, m2, dims, op);
}

template <typename TOut, typename TS, int MAP>
__global__ void __launch_bounds__(256)
dequantize_fp4(const unsigned char* __restrict__ q, TOut* __restrict__ y, const TS* __restrict__ scales,
               const int* __restrict__ zps, long long n, int vec, long long m0, long long m1, long long m2,
               const long long* __restrict__ dims) {
    DequantizeMiniOp<0, TOut, TS> op{{scales, zps, TS(0), 0}};
    if constexpr (MAP == kMapValue) op.assign(scale_from_bits<TS>(m0), 0);
    for_each_unpacked_unit<typename MapOf<MAP>::type, TOut>(q, y, n, vec, m0, m1, m2, dims, op);
}

}  // namespace gpuq
