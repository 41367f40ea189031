// One pass over a checkpoint weight on the GPU (issue 40, point 1): the counterpart of
// gpuq/backends/host/weight_pass.py (the numba loop). For a C-order [rows, n] weight in its
// stored dtype (bfloat16, float16, float32), groups of g along a row (g == n: per channel),
// one launch:
//
//   1. a team (WARP: a warp, for groups of at most weight_pass.py's WARP_GROUP elements;
//      otherwise the thread block) takes one group: the min and max of its finite elements
//      with 0 among them (NaN and +/-Inf
//      skipped: the command's parameters come from the finite values, and 0 is in every range
//      finalize_one forms, so this gives the host's parameters), and counts NaN, +Inf, -Inf;
//   2. finalize_one (qparams.cu): scale (rounded to the scale dtype) and zero point; per
//      tensor (TENSOR), the one range comes from weight_range's keys, reduced before; or
//      (`given`) the caller's scales and zero points, as they are (step 1 skipped);
//   3. every element's code by the contract's element functions (contract.cuh's Divisor and
//      quantize_rn_zp; formats.cu's QuantizeFp8Op for fp8), written in the final layout:
//      compressed-tensors' int32 words (offset-binary fields q + 2^(bits - 1), element k of a
//      word at bit bits * k, each group starting on a word, a row's last word zero-padded) or
//      fp8 bytes; its dequantized value as gpuq.dequantize forms it ((q - zp) * s, or
//      fp8(q) * s, float32), and in float64 (explicitly rounded: no contraction) the value's
//      square, the round-trip error's square and its magnitude, of the finite elements;
//   4. each thread keeps its running sums over its groups; the block reduces them in a fixed
//      tree and writes one partial per block (sum x^2, sum err^2, max |err|; NaN, +Inf, -Inf
//      counts), which the host adds in block order: the same bits on every run and every GPU
//      of a grid, but not the host's bits (another summation order: the report's SQNR may
//      differ in its last printed digit, README's rule). Codes and scales are the host's.
//
// A scale the scale dtype cannot hold sets flag bit 2 (the caller then takes the multi-pass
// path, which says which tensor). Words of 8 consecutive int4 (4 int8) elements are formed by
// a shuffle OR across the lanes that hold them, so every lane takes one element.
//
// Instantiated by name from Python (gpuq/backends/cuda/registry.py, weight_pass_names), e.g.
//   gpuq::weight_pass<gpuq_bf16, 0, true, false>   int words, warp teams, per group/channel
//   gpuq::weight_pass<__half, 1, false, true>      fp8 e4m3fn, block teams, per tensor
//   gpuq::weight_range<float>                      the per-tensor range, before the pass
//   gpuq::weight_blocks<gpuq_bf16, 1>               fine-grained fp8: 128 x 128 block scales
#include "qparams.cu"
#include "formats.cu"

namespace gpuq {

// Element j's value and whether it is a finite number, from the stored bits.
template <typename T>
__device__ __forceinline__ float load_finite(const T* __restrict__ x, long long i, bool& finite) {
    const float v = widen<float>(x[i]);
    finite = (__float_as_uint(v) & 0x7f800000u) != 0x7f800000u;
    return v;
}

// One thread's running figures: float64 sums of x^2 and err^2, max |err|, NaN/+Inf/-Inf counts.
struct Figures {
    double sx, se, me;
    long long nan, pos, neg;
    __device__ Figures() : sx(0.0), se(0.0), me(0.0), nan(0), pos(0), neg(0) {}
    // A finite element v and its dequantized value y (both float32).
    __device__ __forceinline__ void add(float v, float y) {
        const double a = f32_to_f64(v);
        const double e = __dsub_rn(a, f32_to_f64(y));
        sx = __dadd_rn(sx, __dmul_rn(a, a));
        se = __dadd_rn(se, __dmul_rn(e, e));
        me = fmax(me, __longlong_as_double(__double_as_longlong(e) & 0x7fffffffffffffffll));  // |e|
    }
    __device__ __forceinline__ void count(float v) {  // a non-finite element
        if (is_nan(v)) ++nan;
        else if (__float_as_uint(v) >> 31) ++neg;
        else ++pos;
    }
};

// Element i's fp8 byte (op: the contract's saturating cast at the scale) into out[i], and its
// figures: the dequantized value as gpuq.dequantize forms it (fp8(q) * s, float32).
template <typename T, int FMT>
__device__ __forceinline__ void fp8_element(const T* __restrict__ x, long long i, const QuantizeFp8Op<T, FMT, float>& op,
                                            float scale, unsigned char* __restrict__ out, Figures& fig) {
    bool finite;
    const float v = load_finite(x, i, finite);
    const unsigned char b = op(x[i]);
    out[i] = b;
    if (finite) fig.add(v, mul_rn(fp8_to_f32<FMT>(b), scale));
    else fig.count(v);
}

// The finite range (0 included) of x[base, base + len) over a team.
template <typename T, bool WARP>
__device__ __forceinline__ void finite_range(const T* __restrict__ x, long long base, long long len, float& lo,
                                             float& hi) {
    lo = 0.0f;
    hi = 0.0f;
    for (long long j = team_lane<WARP>(); j < len; j += team_size<WARP>()) {
        bool finite;
        const float v = load_finite(x, base + j, finite);
        if (finite) {
            lo = min_keep(lo, v);
            hi = max_keep(hi, v);
        }
    }
    team_minmax<WARP>(lo, hi);
}

// The per-tensor range: keys of the finite min and max (0 included) of x[0, size), into lo/hi
// (initialised by the host to key(+inf)/key(-inf)).
template <typename T>
__global__ void __launch_bounds__(256)
weight_range(const T* __restrict__ x, long long size, unsigned* __restrict__ lo, unsigned* __restrict__ hi) {
    float l = 0.0f, h = 0.0f;
    const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
    for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < size; i += stride) {
        bool finite;
        const float v = load_finite(x, i, finite);
        if (finite) {
            l = min_keep(l, v);
            h = max_keep(h, v);
        }
    }
    team_minmax<false>(l, h);
    if (threadIdx.x == 0) flush(lo, hi, 0, l, h);
}

// The figures of a block in a fixed tree (deterministic), written by thread 0 to slot blockIdx.x.
__device__ __forceinline__ void flush_figures(const Figures& f, double* __restrict__ sums,
                                              long long* __restrict__ counts) {
    __shared__ double s_d[3][256];
    __shared__ long long s_c[3][256];
    const int t = threadIdx.x;
    s_d[0][t] = f.sx;
    s_d[1][t] = f.se;
    s_d[2][t] = f.me;
    s_c[0][t] = f.nan;
    s_c[1][t] = f.pos;
    s_c[2][t] = f.neg;
    __syncthreads();
    for (int o = blockDim.x / 2; o > 0; o >>= 1) {
        if (t < o) {
            s_d[0][t] = __dadd_rn(s_d[0][t], s_d[0][t + o]);
            s_d[1][t] = __dadd_rn(s_d[1][t], s_d[1][t + o]);
            s_d[2][t] = fmax(s_d[2][t], s_d[2][t + o]);
            for (int k = 0; k < 3; ++k) s_c[k][t] += s_c[k][t + o];
        }
        __syncthreads();
    }
    if (t == 0) {
        for (int k = 0; k < 3; ++k) {
            sums[3LL * blockIdx.x + k] = s_d[k][0];
            counts[3LL * blockIdx.x + k] = s_c[k][0];
        }
    }
}

// x: rows x n elements, C order; groups of g (n % g == 0). KIND 0: integer codes of cbits
// (4 or 8) bits in [qmin, qmax] into `out` as uint32 words, ceil(n * cbits / 32) a row;
// KIND 1 / 2: fp8 e4m3fn / e5m2 (saturating) bytes, n a row. scales/zps (zps null:
// symmetric) one per group, or slot 0 alone under TENSOR (range keys lo/hi from
// weight_range); `given` nonzero: they are inputs, read as they are (no range, no rounding,
// not written; the lo/hi keys unused), as the host pass's `given`. sums/counts: 3 per block.
// flag: bit 2 where a scale falls out of the scale dtype. blockDim.x is 256.
template <typename T, int KIND, bool WARP, bool TENSOR>
__global__ void __launch_bounds__(256)
weight_pass(const T* __restrict__ x, long long rows, long long n, long long g, int cbits, int qmin, int qmax,
            int symmetric, float eps, int scale_fmt, int given, const unsigned* __restrict__ lo_key,
            const unsigned* __restrict__ hi_key, unsigned char* __restrict__ out, float* __restrict__ scales,
            int* __restrict__ zps, double* __restrict__ sums, long long* __restrict__ counts,
            int* __restrict__ flag) {
    const long long groups = n / g, pieces = rows * groups;
    const int lane = team_lane<WARP>(), lanes = team_size<WARP>();
    Figures fig;
    for (long long p = team_id<WARP>(); p - team_id<WARP>() < pieces; p += team_count<WARP>()) {
        // Every team of a block takes as many turns as the block's first (team_minmax<false>
        // and the shuffles need the whole team); a team past the end takes an empty piece.
        const bool live = p < pieces;
        const long long r = live ? p / groups : 0, gi = live ? p - r * groups : 0;
        const long long base = r * n + gi * g, len = live ? g : 0;
        QParams qp;
        if (given) {  // the caller's scales (and zps): the MSE search's, or MX's e8m0 ones, as they are
            const long long slot = TENSOR ? 0 : (live ? p : 0);
            qp.scale = scales[slot];
            qp.zp = zps ? zps[slot] : 0;
            qp.inf = qp.range = false;
        } else if (TENSOR) {
            qp = finalize_one(float_of(lo_key[0]), float_of(hi_key[0]), qmin, qmax, symmetric, eps, scale_fmt);
        } else {
            float lo, hi;
            finite_range<T, WARP>(x, base, len, lo, hi);
            qp = finalize_one(lo, hi, qmin, qmax, symmetric, eps, scale_fmt);
        }
        if (!given && live && lane == 0 && (!TENSOR || p == 0)) {
            scales[TENSOR ? 0 : p] = qp.scale;
            if (zps) zps[TENSOR ? 0 : p] = qp.zp;
            if (qp.range) atomicOr(flag, 2);
        }
        const Divisor<float> div = divisor(qp.scale);
        if constexpr (KIND == 0) {
            const int per = 32 / cbits;  // elements a word
            const unsigned half = 1u << (cbits - 1), mask = (1u << cbits) - 1u;
            ZeroPoint<signed char> zb{static_cast<long long>(qmin) - qp.zp, static_cast<long long>(qmax) - qp.zp,
                                      qp.zp, true, qmin - qp.zp, qmax - qp.zp, qp.zp};
            const long long words = (len + per - 1) / per;
            const long long row_words = (n * cbits + 31) / 32;
            unsigned* w = reinterpret_cast<unsigned*>(out) + r * row_words + gi * g / per;
            // The trip count is the team's (len, words uniform), so every lane reaches the shuffles.
            for (long long j0 = 0; j0 < words * per; j0 += lanes) {
                const long long j = j0 + lane;
                unsigned field = 0u;
                if (j < len) {
                    bool finite;
                    const float v = load_finite(x, base + j, finite);
                    const int q = quantize_rn_zp<signed char>(v, div, zb);
                    field = (static_cast<unsigned>(q) + half) & mask;
                    if (finite) fig.add(v, dequantize_rn_zp<float>(q, qp.scale, qp.zp));
                    else fig.count(v);
                }
                // OR the fields of a word's `per` lanes (aligned: lanes is a multiple of per).
                unsigned word = field << (cbits * (lane % per));
                for (int o = per / 2; o > 0; o >>= 1) word |= __shfl_xor_sync(0xffffffffu, word, o);
                if (j < words * per && lane % per == 0) w[j / per] = word;
            }
        } else {
            QuantizeFp8Op<T, KIND - 1, float> op{{{nullptr, nullptr, 0.0f, 0}, {}}, true};
            op.assign(qp.scale, 0);
            for (long long j = lane; j < len; j += lanes) fp8_element<T, KIND - 1>(x, base + j, op, qp.scale, out, fig);
        }
    }
    flush_figures(fig, sums, counts);
}

// Fine-grained fp8 (KIND 1 / 2: e4m3fn / e5m2): one scale a br x bc block of the C-order
// [rows, n] weight (ragged at the bottom and right edges), in the [ceil(rows / br),
// ceil(n / bc)] grid, flat. A thread block takes one block at a time (blocks in turn, grid-
// stride: the trip count is the thread block's, so every thread reaches the reduction): the
// finite range (0 included) of its elements, finalize_one (symmetric), then every element's
// fp8 byte and figures as weight_pass forms them. flag: bit 2 where a scale falls out of the
// scale dtype. blockDim.x is 256.
template <typename T, int KIND>
__global__ void __launch_bounds__(256)
weight_blocks(const T* __restrict__ x, long long rows, long long n, long long br, long long bc, int qmin,
              int qmax, int symmetric, float eps, int scale_fmt, unsigned char* __restrict__ out,
              float* __restrict__ scales, double* __restrict__ sums, long long* __restrict__ counts,
              int* __restrict__ flag) {
    const long long cols = (n + bc - 1) / bc, pieces = (rows + br - 1) / br * cols;
    Figures fig;
    for (long long p = blockIdx.x; p < pieces; p += gridDim.x) {
        const long long bi = p / cols, r0 = bi * br, c0 = (p - bi * cols) * bc;
        const long long w = min(bc, n - c0), len = min(br, rows - r0) * w;
        float lo = 0.0f, hi = 0.0f;
        for (long long e = threadIdx.x; e < len; e += blockDim.x) {
            const long long i = e / w;
            bool finite;
            const float v = load_finite(x, (r0 + i) * n + c0 + (e - i * w), finite);
            if (finite) {
                lo = min_keep(lo, v);
                hi = max_keep(hi, v);
            }
        }
        team_minmax<false>(lo, hi);
        const QParams qp = finalize_one(lo, hi, qmin, qmax, symmetric, eps, scale_fmt);
        if (threadIdx.x == 0) {
            scales[p] = qp.scale;
            if (qp.range) atomicOr(flag, 2);
        }
        QuantizeFp8Op<T, KIND - 1, float> op{{{nullptr, nullptr, 0.0f, 0}, {}}, true};
        op.assign(qp.scale, 0);
        for (long long e = threadIdx.x; e < len; e += blockDim.x) {
            const long long i = e / w;
            fp8_element<T, KIND - 1>(x, (r0 + i) * n + c0 + (e - i * w), op, qp.scale, out, fig);
        }
    }
    flush_figures(fig, sums, counts);
}

}  // namespace gpuq
