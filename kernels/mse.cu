// The MSE search for scales (choose_qparams(..., method="mse"); the rule is gpuq/qparams.py's
// module docstring, the host's statement gpuq/backends/host/mse.py):
//
//   per block, candidate i = 0 .. 19:  p_i = float32((100 - i) / 100)   (i = 0: min/max)
//     range (p_i * lo, p_i * hi), each end a float32 product, -> finalize_one (qparams.cu:
//     the min/max rule, eps and the scale dtype's rounding included)
//     err_i = sum over the block's numbers, in C order, of d * d in float64,
//             d = float64(x) - float64(dequantize(quantize(x)))   (compute type; fp8 saturating)
//   the smallest err_i wins, the smaller i on a tie; a candidate whose scale rounds to 0 in
//   the scale dtype is left out (candidate 0's failures set the flag, as finalize does).
//
// One warp per block, lane i the candidate i (lanes 20..31 repeat candidate 19 and lose its
// ties by their index). Every lane walks the block's elements in C order, all lanes reading
// the same element (one broadcast load), and keeps its own running sum: one float64 addition
// per element in the contract's order, so the sums are the host's, bit for bit. The warp then
// picks the winner with shuffles on (error bits, index): non-negative doubles order as their
// bits. Every operation of the error is an explicitly rounded intrinsic or PTX (mul.rn,
// __dsub_rn, __dmul_rn, __dadd_rn): NVRTC contracts a * b + c into an FMA by default, which
// would round once where the contract rounds twice. The quotient x / s is contract.cuh's
// Divisor: the correctly rounded quotient, on float32 from the candidate's reciprocal and
// fused multiply-adds proven to give it (no fused operation anywhere else).
//
// Blocks of any scheme are described as the strided map's merged dims (dims = [shape,
// pstride, block] of nd dims, kernels/elementwise.cuh); the slot numbers are the parameter
// grid's C order, which is every scheme's parameter order.
//
// Instantiated by name from Python (gpuq/backends/cuda/registry.py, mse_name), e.g.
//   gpuq::mse_search<float, 0>      int8/uint8/int4/uint4 (qmin, qmax at launch)
//   gpuq::mse_search<__half, 1>     fp8 e4m3fn (2: e5m2)
//   gpuq::mse_search<float, 3>      fp4 e2m1 (4: fp6 e2m3, 5: fp6 e3m2)
#include "qparams.cu"
#include "formats.cu"

namespace gpuq {

constexpr int kMseCandidates = 20;
// Blocks of at most kMaxBlockDims merged dims (kernels/qparams.cu), as minmax_blocks walks them.

__device__ __forceinline__ double as_f64(float v) { return f32_to_f64(v); }  // exact, no .ftz
__device__ __forceinline__ double as_f64(double v) { return v; }

// dequantize(quantize(v)) with one candidate, in the compute type TC. CODEC 0: the integer
// codes, (q - zp) formed as the clamped rint (the zero point's bounds zlo/zhi: zero_point()'s
// identity, contract.cuh); CODEC 1 / 2: fp8 e4m3fn / e5m2, saturating; 3 / 4 / 5: fp4 and fp6.
template <int CODEC> struct MseCodec;
template <> struct MseCodec<0> {
    template <typename TC>
    __device__ __forceinline__ static TC round_trip(TC v, const Divisor<TC>& s, long long zlo, long long zhi) {
        long long r = rint_to_i64_sat(s(v));  // v is a number and s > 0: no NaN here
        r = min(max(r, zlo), zhi);
        TC d;
        to_compute_rn(r, d);
        return mul_rn(d, s.s);
    }
};
template <int FMT> struct MseFp8 {
    template <typename TC>
    __device__ __forceinline__ static TC round_trip(TC v, const Divisor<TC>& s, long long, long long) {
        const unsigned char b = f32_to_fp8<FMT, true>(to_f32_rn(s(v)));
        TC w;
        widen_fp8_to(fp8_to_f32<FMT>(b), w);
        return mul_rn(w, s.s);
    }
};
template <> struct MseCodec<1> : MseFp8<0> {};
template <> struct MseCodec<2> : MseFp8<1> {};
// CODEC 3 / 4 / 5: fp4 e2m1, fp6 e2m3, fp6 e3m2 (always saturating), quantize_fp4/fp6's element
// operations (formats.cu): one division (Divisor), the quotient's nearest-even code, its value * s.
template <int MFMT> struct MseMini {
    template <typename TC>
    __device__ __forceinline__ static TC round_trip(TC v, const Divisor<TC>& s, long long, long long) {
        TC w;
        widen_fp8_to(mini_to_f32<MFMT>(f32_to_mini<MFMT>(to_f32_rn(s(v)))), w);
        return mul_rn(w, s.s);
    }
};
template <> struct MseCodec<3> : MseMini<0> {};
template <> struct MseCodec<4> : MseMini<1> {};
template <> struct MseCodec<5> : MseMini<2> {};

template <typename T, int CODEC>
__global__ void __launch_bounds__(256)
mse_search(const T* __restrict__ x, int nd, const long long* __restrict__ dims, long long slots,
           const unsigned* __restrict__ lo, const unsigned* __restrict__ hi, int qmin, int qmax, int symmetric,
           float eps, int scale_fmt, float* __restrict__ scales, int* __restrict__ zps, int* __restrict__ flag) {
    using TC = typename ComputeOf<T>::type;
    const int lane = threadIdx.x & 31;
    const int cand = lane < kMseCandidates ? lane : kMseCandidates - 1;
    // p_i as the contract states it: the float64 quotient (100 - i) / 100 rounded to float32.
    const float p = f64_to_f32_rn(__ddiv_rn(static_cast<double>(100 - cand), 100.0));
    const long long warps = (static_cast<long long>(gridDim.x) * blockDim.x) >> 5;
    for (long long s = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5; s < slots;
         s += warps) {
        const QParams q = finalize_one(mul_rn(p, float_of(lo[s])), mul_rn(p, float_of(hi[s])), qmin, qmax,
                                       symmetric, eps, scale_fmt);
        if (lane == 0) flag_failures(q, flag);  // min/max's own failures: the call raises
        const bool valid = !q.range;
        TC sc;
        widen_scale(valid ? q.scale : 1.0f, sc);  // a left-out candidate: any scale, never chosen
        const Divisor<TC> div = divisor(sc);  // the candidate's reciprocal, once per block
        const long long zlo = static_cast<long long>(qmin) - q.zp, zhi = static_cast<long long>(qmax) - q.zp;

        // The block's first element and extent along each dim (ragged at the ends), by
        // minmax_blocks' own block_of_slot; slot s is the parameter index (C order of the grid).
        long long extent[kMaxBlockDims], step[kMaxBlockDims], coord[kMaxBlockDims], param;
        const long long origin = block_of_slot(s, nd, dims, extent, step, &param);
        for (int d = 0; d < nd; ++d) coord[d] = 0;

        // C order: the last dim is contiguous (step 1), the others an odometer.
        double err = 0.0;
        const long long inner = extent[nd - 1];
        long long off = origin;
        for (;;) {
            const T* row = x + off;
            for (long long i = 0; i < inner; ++i) {
                const TC v = widen<TC>(row[i]);
                if (is_nan(v)) continue;  // not a number of the block (uniform across the warp)
                const double d = __dsub_rn(as_f64(v), as_f64(MseCodec<CODEC>::round_trip(v, div, zlo, zhi)));
                err = __dadd_rn(err, __dmul_rn(d, d));
            }
            int d = nd - 2;
            for (; d >= 0; --d) {
                off += step[d];
                if (++coord[d] < extent[d]) break;
                off -= extent[d] * step[d];
                coord[d] = 0;
            }
            if (d < 0) break;
        }

        // The winner: smallest (error, index); the errors are >= +0 (or +inf), so their bits
        // order as they do. Every lane ends with the same pair.
        unsigned long long key = valid ? static_cast<unsigned long long>(__double_as_longlong(err))
                                       : 0x7ff0000000000000ull;  // +inf: never below candidate 0
        int best = lane;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const unsigned long long k2 = __shfl_xor_sync(0xffffffffu, key, o);
            const int b2 = __shfl_xor_sync(0xffffffffu, best, o);
            if (k2 < key || (k2 == key && b2 < best)) {
                key = k2;
                best = b2;
            }
        }
        if (lane == best) {
            scales[s] = q.scale;
            if (zps) zps[s] = q.zp;
        }
    }
}

}  // namespace gpuq
