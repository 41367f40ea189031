// cudasim: host implementations of the PTX instructions that gpuq's kernels
// write as inline asm, with the semantics of the PTX ISA (and, where the ISA
// leaves a NaN's bits open, of NVIDIA's hardware as the CUDA documentation
// states it). tests/cudasim/ptx.py rewrites every one-instruction asm
// statement into a call of one of these functions at build time.
//
// Sources (checked with the `search` tool, see tests/cudasim/ptx.py):
//   * PTX ISA 9.7.9.21 cvt, "Integer Notes": float-to-integer conversions clamp
//     to the destination range by default (.sat is redundant); a NaN input gives
//     0 "if source is not .f64 and destination is not .s64/.u64", otherwise
//     1 << (BitWidth(dst) - 1), i.e. MININT for a signed destination; a
//     destination register wider than the destination format gets the result
//     sign- or zero-extended by the format (.s8 / .u8 into a .b32 register).
//   * PTX ISA 9.7.3.11/12 min/max: the non-NaN operand if exactly one is NaN,
//     NaN if both are, and -0.0 < +0.0 ("If values of both inputs are 0.0,
//     then +0.0 > -0.0").
//   * PTX ISA 9.7.3: subnormals are kept unless .ftz is written (none of
//     these forms has .ftz); "Single-precision instructions return an
//     unspecified NaN"; f64 instructions keep NaN payloads.
//   * CUDA C++ Programming Guide 20.3 (Floating-Point Standard): "The result of
//     a single-precision floating-point operation involving one or more input
//     NaNs is the quiet NaN of bit pattern 0x7fffffff." Every f32 result that
//     is NaN is therefore 0x7fffffff here.
//   * cuda_fp16.hpp's host emulation of cvt.rn.f16.f32 (__internal_float2half)
//     gives 0x7fff for any NaN, and of cvt.f32.f16 (__internal_half2float)
//     0x7fffffff (the sign of a NaN dropped).
//
// Conversions are done on the bits (one rounding routine, round_pack), so they
// do not depend on the host's floating-point environment at all. The four f32
// arithmetic forms use the host's IEEE float operations, which the launch (and
// the test wrappers) run under a reset environment: round to nearest even, no
// flush-to-zero, no denormals-are-zero (see FpEnvGuard in cudasim_runtime.h).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace cudasim {
namespace ptx {

inline uint32_t bits_of(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}
inline uint64_t bits_of(double d) {
    uint64_t u;
    std::memcpy(&u, &d, 8);
    return u;
}
inline float f32_of(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline double f64_of(uint64_t u) {
    double d;
    std::memcpy(&d, &u, 8);
    return d;
}

constexpr uint32_t kCanonicalNaN32 = 0x7fffffffu;  // CUDA Programming Guide 20.3
constexpr uint16_t kCanonicalNaN16 = 0x7fffu;      // cuda_fp16.hpp host emulation

inline bool is_nan32(uint32_t b) { return (b & 0x7fffffffu) > 0x7f800000u; }
inline bool is_nan64(uint64_t b) { return (b & 0x7fffffffffffffffull) > 0x7ff0000000000000ull; }

// Any f32 result that is a NaN becomes the GPU's one single-precision NaN.
inline float canonical32(float r) { return is_nan32(bits_of(r)) ? f32_of(kCanonicalNaN32) : r; }

// A binary floating-point format: M fraction bits, exponent bias B, exponent
// field width E.
template <int M, int B, int E>
struct Format {
    static constexpr int kFrac = M, kBias = B, kExpMax = (1 << E) - 1, kBits = 1 + E + M;
};
using F16 = Format<10, 15, 5>;
using F32 = Format<23, 127, 8>;
using F64 = Format<52, 1023, 11>;

// The value (-1)^sign * sig * 2^e2 (sig > 0) rounded to nearest, ties to even,
// into format F: subnormal results kept, overflow to infinity. Returns the bits.
template <class F>
inline uint64_t round_pack(bool sign, uint64_t sig, int e2) {
    const uint64_t s = static_cast<uint64_t>(sign) << (F::kBits - 1);
    const int top = 63 - __builtin_clzll(sig);  // sig in [2^top, 2^(top+1))
    const int e = top + e2;                      // value in [2^e, 2^(e+1))
    // The exponent of one unit in the last place of the result.
    const int q = (e + F::kBias >= 1) ? e - F::kFrac : 1 - F::kBias - F::kFrac;
    const int sh = q - e2;  // bits of sig below that unit
    uint64_t r;
    if (sh <= 0) {
        r = sig << (-sh);  // exact (the result has at most kFrac + 1 bits here)
    } else if (sh >= 128) {
        r = 0;  // below half of the smallest subnormal
    } else {
        const unsigned __int128 wide = sig;
        const unsigned __int128 keep = wide >> sh;
        const unsigned __int128 rem = wide - (keep << sh);
        const unsigned __int128 half = static_cast<unsigned __int128>(1) << (sh - 1);
        r = static_cast<uint64_t>(keep);
        if (rem > half || (rem == half && (r & 1u))) ++r;
    }
    int qq = q;
    if (r == (uint64_t{1} << (F::kFrac + 1))) {  // rounding carried into a new binade
        r >>= 1;
        ++qq;
    }
    if (r == 0) return s;  // signed zero
    if (r >= (uint64_t{1} << F::kFrac)) {  // normal
        const int field = qq + F::kFrac + F::kBias;
        if (field >= F::kExpMax) return s | (static_cast<uint64_t>(F::kExpMax) << F::kFrac);  // infinity
        return s | (static_cast<uint64_t>(field) << F::kFrac) | (r - (uint64_t{1} << F::kFrac));
    }
    return s | r;  // subnormal (field 0)
}

// Decoded finite nonzero value: (-1)^sign * sig * 2^e2.
struct Decoded {
    bool sign;
    uint64_t sig;
    int e2;
};
template <class F>
inline Decoded decode(uint64_t b) {
    const bool sign = (b >> (F::kBits - 1)) & 1u;
    const int field = static_cast<int>((b >> F::kFrac) & static_cast<uint64_t>(F::kExpMax));
    const uint64_t frac = b & ((uint64_t{1} << F::kFrac) - 1);
    if (field == 0) return {sign, frac, 1 - F::kBias - F::kFrac};
    return {sign, frac | (uint64_t{1} << F::kFrac), field - F::kBias - F::kFrac};
}

// ---------------------------------------------------------------------------
// f32 arithmetic: div.rn.f32, mul.rn.f32, sub.rn.f32 (no .ftz: subnormals kept).

inline float div_rn_f32(float a, float b) { return canonical32(a / b); }
inline float mul_rn_f32(float a, float b) { return canonical32(a * b); }
inline float sub_rn_f32(float a, float b) { return canonical32(a - b); }

// fma.rn.f32 d, a, b, c (PTX ISA 9.7.3.6): a * b + c "computed in infinite precision and then
// rounded" once to nearest even; no .ftz, so subnormals are kept. The host's fmaf is IEEE 754's
// fusedMultiplyAdd (C99 7.12.13.1: "rounded as one ternary operation"), correctly rounded in the
// launch's reset environment (glibc computes it exactly, with or without an FMA unit); the
// engine's tests hold it to exact rational arithmetic.
inline float fma_rn_f32(float a, float b, float c) { return canonical32(__builtin_fmaf(a, b, c)); }

// min.f32 / max.f32 (PTX ISA min_num/max_num; -0.0 < +0.0).
inline float min_f32(float a, float b) {
    const uint32_t ua = bits_of(a), ub = bits_of(b);
    const bool na = is_nan32(ua), nb = is_nan32(ub);
    if (na && nb) return f32_of(kCanonicalNaN32);
    if (na) return b;
    if (nb) return a;
    if (((ua | ub) & 0x7fffffffu) == 0) return (ua & 0x80000000u) ? a : b;  // both zeros
    return a < b ? a : b;
}
inline float max_f32(float a, float b) {
    const uint32_t ua = bits_of(a), ub = bits_of(b);
    const bool na = is_nan32(ua), nb = is_nan32(ub);
    if (na && nb) return f32_of(kCanonicalNaN32);
    if (na) return b;
    if (nb) return a;
    if (((ua | ub) & 0x7fffffffu) == 0) return (ua & 0x80000000u) ? b : a;
    return a > b ? a : b;
}

// ---------------------------------------------------------------------------
// cvt.rni.{s32,s64}.{f32,f64}: round to nearest integer, ties to even, clamped
// to the destination's range; NaN -> nan_value (see the ISA rule at the top).

template <class I, class F>
inline I cvt_rni(uint64_t b, I nan_value) {
    constexpr int kDigits = sizeof(I) * 8 - 1;  // 31 or 63
    constexpr uint64_t kMaxMag = (uint64_t{1} << kDigits) - 1;
    constexpr I kMax = static_cast<I>(kMaxMag);
    constexpr I kMin = static_cast<I>(-static_cast<I>(kMaxMag) - 1);
    const bool sign = (b >> (F::kBits - 1)) & 1u;
    const int field = static_cast<int>((b >> F::kFrac) & static_cast<uint64_t>(F::kExpMax));
    const uint64_t frac = b & ((uint64_t{1} << F::kFrac) - 1);
    if (field == F::kExpMax) {
        if (frac != 0) return nan_value;
        return sign ? kMin : kMax;  // +/-Inf saturate
    }
    // Few data-dependent branches: this runs once per element of every quantize.
    const int e = field - F::kBias;  // |x| in [2^e, 2^(e+1)) for normal x
    if (e >= kDigits) return sign ? kMin : kMax;  // |x| >= 2^digits (exactly -2^digits is kMin too)
    const uint64_t m = field != 0 ? frac | (uint64_t{1} << F::kFrac) : frac;  // subnormal: tiny, rounds to 0
    uint64_t mag;
    if (e >= F::kFrac) {
        mag = m << (e - F::kFrac);  // already an integer, < 2^kDigits
    } else {
        // sh >= 63 leaves keep = 0 and rem = m < half: |x| < 0.5 rounds to 0 on the same path.
        const int sh = F::kFrac - e < 63 ? F::kFrac - e : 63;
        const uint64_t keep = m >> sh;
        const uint64_t rem = m & ((uint64_t{1} << sh) - 1);
        const uint64_t half = uint64_t{1} << (sh - 1);
        mag = keep + static_cast<uint64_t>((rem > half) | ((rem == half) & static_cast<bool>(keep & 1u)));
    }
    // mag <= 2^digits here: 2^digits saturates a positive value and is exactly kMin for a negative one.
    if (mag > kMaxMag) return sign ? kMin : kMax;
    const I v = static_cast<I>(mag);
    return sign ? static_cast<I>(-v) : v;
}

inline int32_t cvt_rni_s32_f32(float x) { return cvt_rni<int32_t, F32>(bits_of(x), 0); }
// cvt.rni.sat.{s8,u8}.f32 into a 32-bit register: the 8-bit result extended by
// the destination format's signedness (ISA cvt: "If the destination register
// is wider than the destination format, the result is extended to the
// destination register width after chopping"). Clamping the int32-saturated
// rint to the 8-bit range is the same as saturating to it directly.
inline int32_t cvt_rni_sat_s8_f32(float x) {
    const int32_t r = cvt_rni<int32_t, F32>(bits_of(x), 0);
    return r < -128 ? -128 : (r > 127 ? 127 : r);
}
inline int32_t cvt_rni_sat_u8_f32(float x) {
    const int32_t r = cvt_rni<int32_t, F32>(bits_of(x), 0);
    return r < 0 ? 0 : (r > 255 ? 255 : r);
}
inline int32_t cvt_rni_s32_f64(double x) { return cvt_rni<int32_t, F64>(bits_of(x), INT32_MIN); }
inline int64_t cvt_rni_s64_f32(float x) { return cvt_rni<int64_t, F32>(bits_of(x), INT64_MIN); }
inline int64_t cvt_rni_s64_f64(double x) { return cvt_rni<int64_t, F64>(bits_of(x), INT64_MIN); }

// ---------------------------------------------------------------------------
// cvt.rn.{f32,f64}.s64: one rounding to nearest even.

template <class F>
inline uint64_t from_s64(int64_t v) {
    if (v == 0) return 0;  // +0
    const bool sign = v < 0;
    const uint64_t mag = sign ? (uint64_t{0} - static_cast<uint64_t>(v)) : static_cast<uint64_t>(v);
    return round_pack<F>(sign, mag, 0);
}
inline float cvt_rn_f32_s64(int64_t v) { return f32_of(static_cast<uint32_t>(from_s64<F32>(v))); }
inline double cvt_rn_f64_s64(int64_t v) { return f64_of(from_s64<F64>(v)); }

// ---------------------------------------------------------------------------
// Float-to-float conversions.

// cvt.rn.f32.f64: nearest even, subnormals kept, overflow to Inf; NaN -> 0x7fffffff.
inline float cvt_rn_f32_f64(double d) {
    const uint64_t b = bits_of(d);
    const bool sign = b >> 63;
    if (is_nan64(b)) return f32_of(kCanonicalNaN32);
    if ((b & 0x7fffffffffffffffull) == 0x7ff0000000000000ull) return f32_of(sign ? 0xff800000u : 0x7f800000u);
    if ((b & 0x7fffffffffffffffull) == 0) return f32_of(sign ? 0x80000000u : 0u);
    const Decoded v = decode<F64>(b);
    return f32_of(static_cast<uint32_t>(round_pack<F32>(v.sign, v.sig, v.e2)));
}

// cvt.f64.f32: exact. NaN: the ISA keeps f64 NaN payloads and says nothing
// more; IEEE 754 (6.2.3) conversion is used: payload kept, quiet bit set.
inline double cvt_f64_f32(float f) {
    const uint32_t b = bits_of(f);
    const uint64_t sign = static_cast<uint64_t>(b >> 31) << 63;
    if (is_nan32(b)) {
        return f64_of(sign | 0x7ff0000000000000ull | (static_cast<uint64_t>(b & 0x7fffffu) << 29) |
                      0x0008000000000000ull);
    }
    if ((b & 0x7fffffffu) == 0x7f800000u) return f64_of(sign | 0x7ff0000000000000ull);
    if ((b & 0x7fffffffu) == 0) return f64_of(sign);
    const Decoded v = decode<F32>(b);
    return f64_of(round_pack<F64>(v.sign, v.sig, v.e2));  // exact
}

// cvt.f32.f16: exact; NaN -> 0x7fffffff.
inline float cvt_f32_f16(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h >> 15) << 31;
    if ((h & 0x7c00u) == 0x7c00u) {
        if (h & 0x03ffu) return f32_of(kCanonicalNaN32);
        return f32_of(sign | 0x7f800000u);
    }
    if ((h & 0x7fffu) == 0) return f32_of(sign);
    const Decoded v = decode<F16>(h);
    return f32_of(static_cast<uint32_t>(round_pack<F32>(v.sign, v.sig, v.e2)));  // exact
}

// cvt.rn.f16.f32: nearest even (|x| >= 65520 -> Inf), subnormals kept; NaN -> 0x7fff.
inline uint16_t cvt_rn_f16_f32(float f) {
    const uint32_t b = bits_of(f);
    const uint16_t sign = static_cast<uint16_t>((b >> 16) & 0x8000u);
    if (is_nan32(b)) return kCanonicalNaN16;
    if ((b & 0x7fffffffu) == 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u);
    if ((b & 0x7fffffffu) == 0) return sign;
    const Decoded v = decode<F32>(b);
    return static_cast<uint16_t>(round_pack<F16>(v.sign, v.sig, v.e2));
}

// ---------------------------------------------------------------------------
// cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32 d, a, b (sm_89+): each input rounded to
// nearest even into the 8-bit format; the code of a in the upper byte of d, of b
// in the lower one (ISA cvt: "the value converted from input a is stored in the
// upper half of d"). .satfinite: "if the input value is NaN, then the result is
// NaN in the specified destination format. If the absolute value of input
// (ignoring sign) is greater than MAX_NORM of the specified destination format,
// then the result is sign-preserved MAX_NORM" (so +/-Inf give +/-MAX_NORM).
// Zeros keep their sign. The NaN code is 0x7f with the input's sign (NVIDIA's
// cuda_fp8.hpp emulation); gpuq's kernels never pass a NaN (they branch first),
// so nothing depends on it, and the GPU conformance step checks it.

// One input; M mantissa bits, bias B, MAX_NORM's code max_code, NaN code 0x7f.
template <int M, int B>
inline uint32_t to_fp8_satfinite(float f, uint32_t max_code) {
    const uint32_t b = bits_of(f);
    const uint32_t sign = (b >> 24) & 0x80u;
    if (is_nan32(b)) return sign | 0x7fu;
    if ((b & 0x7fffffffu) == 0) return sign;
    if ((b & 0x7fffffffu) == 0x7f800000u) return sign | max_code;
    const Decoded v = decode<F32>(b);
    // Round into a format with the same mantissa and bias and a wide exponent field, so
    // nothing overflows there; then anything above MAX_NORM saturates.
    const uint32_t mag = static_cast<uint32_t>(round_pack<Format<M, B, 6>>(false, v.sig, v.e2));
    return sign | (mag > max_code ? max_code : mag);
}
inline uint16_t cvt_rn_satfinite_e4m3x2_f32(float a, float b) {
    return static_cast<uint16_t>((to_fp8_satfinite<3, 7>(a, 0x7eu) << 8) | to_fp8_satfinite<3, 7>(b, 0x7eu));
}
inline uint16_t cvt_rn_satfinite_e5m2x2_f32(float a, float b) {
    return static_cast<uint16_t>((to_fp8_satfinite<2, 15>(a, 0x7bu) << 8) | to_fp8_satfinite<2, 15>(b, 0x7bu));
}

// cvt.rn.f16x2.e4m3x2 d, a (sm_89+): each byte of the .b16 a widened to float16, exactly (every
// e4m3 value is a float16 value): the lower byte's into the lower half of d, the upper byte's into
// the upper half (the same order as the other x2 forms). A NaN code (0x7f, 0xff) gives the
// canonical float16 NaN 0x7fff here; gpuq's kernels branch on NaN codes before the instruction,
// so nothing depends on it, and the GPU conformance step reports what the hardware gives.
inline uint32_t e4m3_to_f16(uint32_t c) {
    if ((c & 0x7fu) == 0x7fu) return kCanonicalNaN16;
    if ((c & 0x7fu) == 0) return (c & 0x80u) << 8;
    const Decoded v = decode<Format<3, 7, 4>>(c);
    return static_cast<uint32_t>(round_pack<F16>(v.sign, v.sig, v.e2));  // exact
}
inline uint32_t cvt_rn_f16x2_e4m3x2(uint16_t a) {
    return (e4m3_to_f16(a >> 8) << 16) | e4m3_to_f16(a & 0xffu);
}

// ---------------------------------------------------------------------------
// Integer forms of the index maps' magic-number division (kernels/elementwise.cuh, FastDivmod),
// reached through CUDA's __umulhi and __clz (cudasim_dialect.h):
//   * mul.hi.u32 d, a, b (PTX ISA 9.7.1.4 mul): "the full 2n-bit product" of the two unsigned
//     32-bit operands, of which ".hi" keeps "the upper n bits" -- here (a * b) >> 32 in 64 bits.
//   * clz.b32 d, a (PTX ISA 9.7.1.16 clz): "the number of leading zeros in a" counted from the
//     most significant bit; "for .b32 ... the number of leading zeros is between 0 and 32
//     inclusively" (a = 0 gives 32).
inline uint32_t mul_hi_u32(uint32_t a, uint32_t b) {
    return static_cast<uint32_t>((static_cast<uint64_t>(a) * b) >> 32);
}
inline uint32_t clz_b32(uint32_t a) {
    uint32_t n = 0;
    for (uint32_t bit = 0x80000000u; bit != 0 && (a & bit) == 0; bit >>= 1) ++n;
    return n;
}

// ---------------------------------------------------------------------------
// Operand glue for the translated asm statements (see tests/cudasim/ptx.py):
// in<'c', T>(x) checks that x suits register constraint c and passes its bits
// as the helper's parameter type T; out<'c'>(x) = v stores v's bits into x.
// A mismatch is a compile error, as it is for NVRTC.

template <char C, class X>
constexpr bool suits() {
    if constexpr (C == 'f') return std::is_same_v<X, float>;
    else if constexpr (C == 'd') return std::is_same_v<X, double>;
    else if constexpr (C == 'h') return std::is_integral_v<X> && !std::is_same_v<X, bool> && sizeof(X) == 2;
    else if constexpr (C == 'r') return std::is_integral_v<X> && !std::is_same_v<X, bool> && sizeof(X) == 4;
    else if constexpr (C == 'l') return std::is_integral_v<X> && !std::is_same_v<X, bool> && sizeof(X) == 8;
    else return false;
}

template <char C, class T, class X>
inline T in(const X& x) {
    static_assert(suits<C, std::remove_cv_t<X>>(), "cudasim: asm input operand type does not suit its constraint");
    static_assert(sizeof(T) == sizeof(X), "cudasim: asm input operand size mismatch");
    T t;
    std::memcpy(&t, &x, sizeof(T));
    return t;
}

template <class X>
struct Out {
    X& x;
    template <class V>
    void operator=(const V& v) {
        static_assert(sizeof(V) == sizeof(X), "cudasim: asm output operand size mismatch");
        std::memcpy(&x, &v, sizeof(X));
    }
};
template <char C, class X>
inline Out<X> out(X& x) {
    static_assert(!std::is_const_v<X>, "cudasim: asm output operand is const");
    static_assert(suits<C, X>(), "cudasim: asm output operand type does not suit its constraint");
    return Out<X>{x};
}

}  // namespace ptx
}  // namespace cudasim
