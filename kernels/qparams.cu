// Quantization parameters from data: min/max reductions, the scale/zero-point
// formula, and a fused one-pass dynamic quantize for contiguous rows.
//
// The formula (gpuq/qparams.py; gpuq/backends/numpy_qparams.py `finalize` is
// the same, bit for bit), per block of elements with smallest number lo and
// largest hi, in float32:
//
//   asymmetric:  lo' = min(lo, 0), hi' = max(hi, 0)
//                scale = max((hi' - lo') / (qmax - qmin), eps)
//                zp = clamp(qmin - rint(lo' / scale), qmin, qmax)
//   symmetric:   scale = max(max(|lo|, |hi|) / ((qmax - qmin) / 2), eps): / 127 for 8-bit
//                codes, / 7 for 4-bit, / max_finite for fp8; zp = 0 (signed) or (qmax + 1) / 2
//   full range:  (symmetric == 2, scale_rule="full", integer codes) the same with
//                / ((qmax - qmin) / 2) exactly: / 127.5 for 8-bit codes, / 7.5 for 4-bit
//
// With a scale dtype (scale_fmt 1 bfloat16, 2 float16; 0 float32 leaves it), the scale
// is rounded to nearest even in it before the zero point is derived from it
// (round_scale); a scale that rounds to 0 or to +inf there sets flag bit 2.
//
// NaN is skipped by the reductions (PTX min/max return the other operand), a
// block with no number keeps (+inf, -inf) and comes out as an all-zero block,
// and +/-Inf in the data sets a flag that the host turns into a ValueError.
//
// Partial results meet through atomics on order-preserving 32-bit keys of the
// float32 value (key(a) < key(b) iff a < b, with -0 < +0), so min/max are
// plain unsigned atomicMin/atomicMax. float64 data is reduced in float64 and
// rounded to float32 once: rounding is monotonic, so that is the min/max of
// the rounded values, as on the host.
//
// Every float32 operation is PTX without `.ftz` (contract.cuh explains why:
// CuPy forces -ftz=true on NVRTC, and a flushed subnormal would change a
// range). Comparisons are on bits.
//
// 64-bit indices throughout: a tensor on an 80 GB card can pass 2^31 elements.
//
// Instantiated by name from Python (gpuq/backends/cuda_qparams.py), e.g.
//   gpuq::minmax_segments<float, true>
//   gpuq::dynamic_quantize_segments<__half, signed char, false>
//   gpuq::dynamic_quantize_units<float, signed char, 256, 4>
//   gpuq::dynamic_quantize_staged<gpuq_bf16, unsigned char>
//   gpuq::minmax_columns<gpuq_bf16>
//   gpuq::qparams_tiles<float>
#include "contract.cuh"
#include "elementwise.cuh"

namespace gpuq {

// ---------------------------------------------------------------------------
// float32 helpers without flush-to-zero

__device__ __forceinline__ float min_keep(float a, float b) {  // NaN-skipping, like np.fmin
    float r;
    asm("min.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
__device__ __forceinline__ float max_keep(float a, float b) {  // NaN-skipping, like np.fmax
    float r;
    asm("max.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
__device__ __forceinline__ float sub_rn(float a, float b) {
    float r;
    asm("sub.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
__device__ __forceinline__ float f64_to_f32_rn(double d) {
    float r;
    asm("cvt.rn.f32.f64 %0, %1;" : "=f"(r) : "d"(d));
    return r;
}
__device__ __forceinline__ double f32_to_f64(float f) {  // exact; no .ftz, subnormals kept
    double r;
    asm("cvt.f64.f32 %0, %1;" : "=d"(r) : "f"(f));
    return r;
}
__device__ __forceinline__ float neg(float a) { return __uint_as_float(__float_as_uint(a) ^ 0x80000000u); }

constexpr unsigned kBitsPosInf = 0x7f800000u;
constexpr unsigned kBitsNegInf = 0xff800000u;

// (Non-template helpers: the host pass of nvcc sees no declaration of the
// device intrinsics inside templates.)
__device__ __forceinline__ float pos_inf32() { return __uint_as_float(kBitsPosInf); }
__device__ __forceinline__ float neg_inf32() { return __uint_as_float(kBitsNegInf); }
__device__ __forceinline__ double pos_inf64() { return __longlong_as_double(0x7ff0000000000000ll); }
__device__ __forceinline__ double neg_inf64() { return __longlong_as_double(static_cast<long long>(0xfff0000000000000ull)); }

// Order-preserving keys: negative floats reversed below the positive ones.
__device__ __forceinline__ unsigned key_of(float f) {
    const unsigned b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float float_of(unsigned k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// The compute type of quantize (contract.cuh): float64 for float64 data, else float32.
template <typename T> struct ComputeOf { using type = float; };
template <> struct ComputeOf<double> { using type = double; };

// ---------------------------------------------------------------------------
// Running min/max of one thread: in float32 (float16 and bfloat16 widen exactly), or in
// float64 for float64 data (rounded to float32 when it leaves the thread).

template <typename T> struct Acc {
    float lo, hi;
    __device__ Acc() : lo(pos_inf32()), hi(neg_inf32()) {}
    __device__ __forceinline__ void add(T v) {
        const float f = widen<float>(v);
        lo = min_keep(lo, f);
        hi = max_keep(hi, f);
    }
    __device__ __forceinline__ float lo32() const { return lo; }
    __device__ __forceinline__ float hi32() const { return hi; }
};
template <> struct Acc<double> {
    double lo, hi;
    __device__ Acc() : lo(pos_inf64()), hi(neg_inf64()) {}
    __device__ __forceinline__ void add(double v) {
        lo = fmin(lo, v);  // float64 has no flush mode; fmin skips NaN
        hi = fmax(hi, v);
    }
    __device__ __forceinline__ float lo32() const { return f64_to_f32_rn(lo); }
    __device__ __forceinline__ float hi32() const { return f64_to_f32_rn(hi); }
};

// Accumulate x[begin, begin + len) with `lanes` threads of a team, lane `lane`.
template <typename T>
__device__ __forceinline__ void accumulate(Acc<T>& acc, const T* __restrict__ x, long long begin, long long len,
                                           int lane, int lanes) {
    const T* p = x + begin;
    long long i = lane;
    // Four independent loads in flight per thread.
    for (; i + 3LL * lanes < len; i += 4LL * lanes) {
        const T a = p[i], b = p[i + lanes], c = p[i + 2LL * lanes], d = p[i + 3LL * lanes];
        acc.add(a);
        acc.add(b);
        acc.add(c);
        acc.add(d);
    }
    for (; i < len; i += lanes) acc.add(p[i]);
}

__device__ __forceinline__ void warp_minmax(float& lo, float& hi) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        lo = min_keep(lo, __shfl_xor_sync(0xffffffffu, lo, o));
        hi = max_keep(hi, __shfl_xor_sync(0xffffffffu, hi, o));
    }
}

// Min/max over a team, the result in every lane. A team is one warp, or the
// whole block (blockDim.x a multiple of 32, at most 1024).
template <bool WARP>
__device__ __forceinline__ void team_minmax(float& lo, float& hi) {
    warp_minmax(lo, hi);
    if constexpr (!WARP) {
        __shared__ float s_lo[32], s_hi[32];
        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
        __syncthreads();  // the previous segment's readers are done with s_lo/s_hi
        if (lane == 0) {
            s_lo[warp] = lo;
            s_hi[warp] = hi;
        }
        __syncthreads();
        lo = lane < warps ? s_lo[lane] : pos_inf32();
        hi = lane < warps ? s_hi[lane] : neg_inf32();
        warp_minmax(lo, hi);
    }
}

template <bool WARP> __device__ __forceinline__ int team_lane() { return WARP ? (threadIdx.x & 31) : threadIdx.x; }
template <bool WARP> __device__ __forceinline__ int team_size() { return WARP ? 32 : blockDim.x; }
template <bool WARP> __device__ __forceinline__ long long team_id() {
    return WARP ? (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5 : blockIdx.x;
}
template <bool WARP> __device__ __forceinline__ long long team_count() {
    return WARP ? (static_cast<long long>(gridDim.x) * blockDim.x) >> 5 : gridDim.x;
}

__device__ __forceinline__ void flush(unsigned* lo, unsigned* hi, long long p, float l, float h) {
    atomicMin(lo + p, key_of(l));
    atomicMax(hi + p, key_of(h));
}

// ---------------------------------------------------------------------------
// Reductions. lo/hi hold keys, initialised by the host to key(+inf)/key(-inf).

// Segments: x as `rows` contiguous rows of n, each cut into pieces of g
// (G = ceil(n / g), the last piece may be short). Piece (r, j) goes to slot
//   p = (r % pmod) * (jstride ? G : 1) + j * jstride.
// Per-tensor: rows = 1, g = a chunk, pmod = 1, jstride = 0. Per-row (long rows
// in chunks): pmod = rows, jstride = 0. Per-group along the last axis:
// pmod = rows, jstride = 1. Per-channel on a middle axis (rows = outer * C of
// length inner): pmod = C, jstride = 0. One team (warp or block) per piece.
template <typename T, bool WARP>
__global__ void __launch_bounds__(256)
minmax_segments(const T* __restrict__ x, long long rows, long long n, long long g, long long pmod, int jstride,
                unsigned* __restrict__ lo, unsigned* __restrict__ hi) {
    const long long groups = (n + g - 1) / g;
    const long long pieces = rows * groups;
    for (long long s = team_id<WARP>(); s < pieces; s += team_count<WARP>()) {
        const long long r = s / groups, j = s - r * groups;
        const long long begin = j * g, len = min(g, n - begin);
        Acc<T> acc;
        accumulate(acc, x, r * n + begin, len, team_lane<WARP>(), team_size<WARP>());
        float l = acc.lo32(), h = acc.hi32();
        team_minmax<WARP>(l, h);
        if (team_lane<WARP>() == 0) flush(lo, hi, (r % pmod) * (jstride ? groups : 1) + j * jstride, l, h);
    }
}

// Columns: x as [outer, n, inner], slots [outer, G, inner] with G = ceil(n / g):
// the thread of slot t = (o * G + j) * inner + i walks its column down the
// group's rows, threads side by side along inner (coalesced). blockIdx.y
// takes `rows_per_y` rows of each group, so a tall group spreads over the grid.
// Per-channel on the last axis: [1, rows, C] with g = rows.
template <typename T>
__global__ void __launch_bounds__(256)
minmax_columns(const T* __restrict__ x, long long outer, long long n, long long inner, long long g,
               long long rows_per_y, unsigned* __restrict__ lo, unsigned* __restrict__ hi) {
    const long long groups = (n + g - 1) / g;
    const long long slots = outer * groups * inner;
    const long long t = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t >= slots) return;
    const long long row_of_slot = t / inner, i = t - row_of_slot * inner;
    const long long o = row_of_slot / groups, j = row_of_slot - o * groups;
    const long long c0 = j * g + static_cast<long long>(blockIdx.y) * rows_per_y;
    const long long c1 = min(min(j * g + g, n), c0 + rows_per_y);
    if (c0 >= c1) return;
    Acc<T> acc;
    const T* p = x + (o * n + c0) * inner + i;
    for (long long c = c0; c < c1; ++c, p += inner) acc.add(*p);
    flush(lo, hi, t, acc.lo32(), acc.hi32());
}

// Slot s of a block grid (dims as minmax_blocks takes them; the MSE search walks the same):
// the offset of its block's first element, and for each merged dim the block's extent (ragged
// at the ends) and C-order stride; *param is the slot's parameter index sum_d blk_d * pstride_d.
__device__ __forceinline__ long long block_of_slot(long long s, int nd, const long long* __restrict__ dims,
                                                   long long* extent, long long* step, long long* param) {
    long long rest = s, origin = 0, stride = 1, p = 0;
#pragma unroll 1
    for (int d = nd - 1; d >= 0; --d) {
        const long long n = dims[d], ps = dims[nd + d], b = dims[2 * nd + d];
        long long blk = 0;
        if (ps != 0) {  // a dim the parameters follow: its block index is part of the slot
            long long count, unused, above;
            divmod(n + b - 1, b, count, unused);
            divmod(rest, count, above, blk);
            rest = above;
            p += blk * ps;
        }
        origin += blk * b * stride;
        extent[d] = min(b, n - blk * b);
        step[d] = stride;
        stride *= n;
    }
    *param = p;
    return origin;
}

// The offset of the element with C-order index r over dims 0..last of a block at origin.
__device__ __forceinline__ long long block_offset(long long r, long long origin, int last,
                                                  const long long* extent, const long long* step) {
    long long off = origin;
#pragma unroll 1
    for (int d = last; d >= 0; --d) {
        long long q, c;
        divmod(r, extent[d], q, c);
        off += c * step[d];
        r = q;
    }
    return off;
}

// Blocks of any shape: x C-contiguous as merged dims (nd <= kMaxBlockDims), dims =
// [shape[0..nd), pstride[0..nd), block[0..nd)] (the strided map's, kernels/elementwise.cuh):
// the slot of coordinates c is sum_d (c_d / block_d) * pstride_d (pstride 0 where a block
// covers its dim). One thread block per slot: its threads walk the block's elements in C
// order, a warp per row of the last dim where rows hold 32 or more (a 128x128 tile of float32
// is 128 rows of 512 bytes), one element per thread otherwise, reduce them together and flush
// once. Slots are numbered in the param grid, C order.
constexpr int kMaxBlockDims = 16;  // MAX_BLOCK_DIMS in gpuq/backends/cuda/qparams.py
template <typename T>
__global__ void __launch_bounds__(256)
minmax_blocks(const T* __restrict__ x, int nd, const long long* __restrict__ dims, long long slots,
              unsigned* __restrict__ lo, unsigned* __restrict__ hi) {
    for (long long s = blockIdx.x; s < slots; s += gridDim.x) {
        long long extent[kMaxBlockDims], step[kMaxBlockDims], p;
        const long long origin = block_of_slot(s, nd, dims, extent, step, &p);
        long long volume = 1;
        for (int d = 0; d < nd; ++d) volume *= extent[d];
        Acc<T> acc;
        const long long inner = extent[nd - 1];  // contiguous: step[nd - 1] == 1
        if (inner >= 32) {
            // Rows of the block's last dim, a warp per row: the divisions locate a row (once
            // per inner elements), not an element; an index division per element made the
            // walk integer-bound (14% of the copy bandwidth on an H200 for 128x128 tiles).
            const long long rows = volume / inner;
            const int lane = threadIdx.x % 32, warps = blockDim.x / 32;
            for (long long row = threadIdx.x / 32; row < rows; row += warps) {
                const long long off = block_offset(row, origin, nd - 2, extent, step);
                for (long long j = lane; j < inner; j += 32) acc.add(x[off + j]);
            }
        } else {
            for (long long e = threadIdx.x; e < volume; e += blockDim.x)
                acc.add(x[block_offset(e, origin, nd - 1, extent, step)]);
        }
        float l = acc.lo32(), h = acc.hi32();
        team_minmax<false>(l, h);
        if (threadIdx.x == 0) flush(lo, hi, p, l, h);
    }
}

// ---------------------------------------------------------------------------
// The formula (see the top of this file), one slot.

struct QParams {
    float scale;
    int zp;
    bool inf;    // the block held +/-Inf
    bool range;  // the scale rounded to 0 or +inf in the scale dtype
};

// A positive float32 scale rounded to nearest even in the scale dtype `fmt` (0 float32: as it
// is, 1 bfloat16, 2 float16), widened back exactly (gpuq/backends/host/qparams.py SCALE_FORMATS).
__device__ __forceinline__ float round_scale(float s, int fmt) {
    if (fmt == 1) return bf16_to_f32_exact(f32_to_bf16_rn(s));
    if (fmt == 2) return f16_to_f32_exact(f32_to_f16_rn(s));
    return s;
}

__device__ __forceinline__ bool scale_out_of_range(float s) {
    const unsigned b = __float_as_uint(s);
    return b == 0u || b == kBitsPosInf;  // a rounded positive scale: +0 or +inf
}

__device__ __forceinline__ QParams finalize_one(float lo, float hi, int qmin, int qmax, int symmetric, float eps,
                                                int fmt) {
    QParams q;
    q.inf = __float_as_uint(lo) == kBitsNegInf || __float_as_uint(hi) == kBitsPosInf;
    if (symmetric) {
        const float amax = max_keep(max_keep(hi, neg(lo)), 0.0f);
        // Half the code range: 127 (8-bit codes), 7 (4-bit), max_finite (fp8: qmin = -qmax);
        // symmetric == 2 (scale_rule="full"): the whole range, 127.5 and 7.5 (exact in float32;
        // halved by its exponent field: a float product or conversion from double would become
        // .ftz under -ftz=true, and the range is a normal float32 >= 15).
        const float half = symmetric == 2
            ? __uint_as_float(__float_as_uint(static_cast<float>(qmax - qmin)) - 0x00800000u)
            : static_cast<float>((qmax - qmin) / 2);
        q.scale = round_scale(max_keep(div_rn(amax, half), eps), fmt);
        q.range = scale_out_of_range(q.scale);
        q.zp = qmin < 0 ? 0 : (qmax + 1) / 2;
        return q;
    }
    const float lo0 = min_keep(lo, 0.0f), hi0 = max_keep(hi, 0.0f);
    const float span = sub_rn(hi0, lo0);
    float s;
    if (__float_as_uint(span) == kBitsPosInf) {
        // hi' - lo' overflows float32: the same quotient in float64, rounded once.
        s = f64_to_f32_rn(__ddiv_rn(__dsub_rn(f32_to_f64(hi0), f32_to_f64(lo0)), static_cast<double>(qmax - qmin)));
    } else {
        s = div_rn(span, static_cast<float>(qmax - qmin));
    }
    q.scale = round_scale(max_keep(s, eps), fmt);
    q.range = scale_out_of_range(q.scale);
    if (q.range) {  // the flag fails the call; no 0 / 0 below
        q.zp = 0;
        return q;
    }
    // |lo' / scale| <= qmax - qmin (+ the scale's rounding), so int32 holds it.
    const int r = rint_to_i32_sat(div_rn(lo0, q.scale));
    q.zp = min(max(qmin - r, qmin), qmax);
    return q;
}

// The flag bits of a failed block: +/-Inf in the data (1), a scale the scale dtype cannot hold (2).
// A null flag: the call is unchecked (check_values=False), the parameters stand as computed
// (scale +Inf for a block with +/-Inf, 0 or +Inf where the scale dtype cannot hold it; zp 0).
__device__ __forceinline__ void flag_failures(const QParams& q, int* flag) {
    if (!flag) return;
    if (q.inf) atomicOr(flag, 1);
    if (q.range) atomicOr(flag, 2);
}

// Slot s's parameters as every kernel here writes them: the scale, the zero point where the
// codes have one (zps null: symmetric signed codes), the failure flag's bits.
__device__ __forceinline__ void publish(const QParams& q, long long s, float* __restrict__ scales,
                                       int* __restrict__ zps, int* flag) {
    scales[s] = q.scale;
    if (zps) zps[s] = q.zp;
    flag_failures(q, flag);
}

// choose_qparams for blocks (br, bc) of a 2-D (merged) x of `cols` columns, the 128x128
// case: one thread block per tile (slot s = block row * ceil(cols / bc) + block column, the
// param grid in C order), a warp per tile row reading it in 16-byte vectors where the row
// starts 16-byte aligned (a 128-wide float32 row: one LDG.128 a lane), the first vectors of
// four rows in flight before any is reduced; then the tile's min/max over the block, and its
// thread 0 applies the formula and writes the slot's scale and zero point: no keys, no
// atomics (but the flag's, on failure), no finalize launch. Slots are walked grid-stride.
template <typename T>
__global__ void __launch_bounds__(256)
qparams_tiles(const T* __restrict__ x, long long rows, long long cols, long long br, long long bc,
              long long slots, int qmin, int qmax, int symmetric, float eps, int scale_fmt,
              float* __restrict__ scales, int* __restrict__ zps, int* __restrict__ flag) {
    constexpr int V = 16 / sizeof(T);  // elements a 16-byte vector
    const long long ncb = (cols + bc - 1) / bc;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    for (long long s = blockIdx.x; s < slots; s += gridDim.x) {
        const long long rb = s / ncb, cb = s - rb * ncb;
        const long long r0 = rb * br, c0 = cb * bc;
        const long long h = min(br, rows - r0), w = min(bc, cols - c0);
        const long long wv = w / V * V;  // the vector part of an aligned row
        Acc<T> acc;
        for (long long r = warp; r < h; r += 4LL * warps) {
            uint4 raw[4];
            bool have[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const long long rr = r + static_cast<long long>(u) * warps;
                const T* row = x + (r0 + rr) * cols + c0;
                const bool aligned = (reinterpret_cast<unsigned long long>(row) & 15u) == 0;
                have[u] = rr < h && aligned && static_cast<long long>(lane) * V < wv;
                if (have[u]) raw[u] = __ldg(reinterpret_cast<const uint4*>(row + lane * V));
            }
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                if (!have[u]) continue;
                T v[V];
                memcpy(v, &raw[u], sizeof(v));
#pragma unroll
                for (int k = 0; k < V; ++k) acc.add(v[k]);
            }
#pragma unroll 1
            for (int u = 0; u < 4; ++u) {
                const long long rr = r + static_cast<long long>(u) * warps;
                if (rr >= h) break;
                const T* row = x + (r0 + rr) * cols + c0;
                long long tail = 0;  // where the scalar part starts
                if ((reinterpret_cast<unsigned long long>(row) & 15u) == 0) {
                    for (long long j = static_cast<long long>(lane) * V + 32 * V; j < wv; j += 32 * V) {
                        T v[V];
                        const uint4 more = __ldg(reinterpret_cast<const uint4*>(row + j));
                        memcpy(v, &more, sizeof(v));
#pragma unroll
                        for (int k = 0; k < V; ++k) acc.add(v[k]);
                    }
                    tail = wv;
                }
                for (long long j = tail + lane; j < w; j += 32) acc.add(row[j]);
            }
        }
        float l = acc.lo32(), hv = acc.hi32();
        team_minmax<false>(l, hv);
        if (threadIdx.x == 0) publish(finalize_one(l, hv, qmin, qmax, symmetric, eps, scale_fmt), s, scales, zps, flag);
    }
}

// Scales and zero points of `slots` slots from the reduction's keys; zps may be
// null (symmetric int8); flag[0] collects flag_failures' bits (null: unchecked).
__global__ void __launch_bounds__(256)
finalize(const unsigned* __restrict__ lo, const unsigned* __restrict__ hi, long long slots, int qmin, int qmax,
         int symmetric, float eps, int scale_fmt, float* __restrict__ scales, int* __restrict__ zps,
         int* __restrict__ flag) {
    const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
    for (long long p = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; p < slots; p += stride) {
        publish(finalize_one(float_of(lo[p]), float_of(hi[p]), qmin, qmax, symmetric, eps, scale_fmt), p, scales,
                zps, flag);
    }
}

// A float32 scale in the compute type (exact; float64 quantizes with the same scale widened).
__device__ __forceinline__ void widen_scale(float s, float& out) { out = s; }
__device__ __forceinline__ void widen_scale(float s, double& out) { out = f32_to_f64(s); }

// ---------------------------------------------------------------------------
// Fused dynamic quantize: x as `rows` contiguous rows of n, each cut into blocks of g (the last
// may be short), one scale per block (slot r * G + j, G = ceil(n / g)). A team of threads takes
// one block: it reduces the block, computes the parameters and quantizes the block. The codes
// are those of gpuq.quantize with the same parameters (contract.cuh quantize_rn_zp), so this
// equals choose_qparams followed by quantize. Three kernels, by where the block waits between
// its reduction and its quantization:
//   dynamic_quantize_units   registers (aligned whole 16-element units, blocks <= 16384 elements)
//   dynamic_quantize_staged  dynamic shared memory (longer blocks of float16/bfloat16/float32)
//   dynamic_quantize_segments nowhere: the block is read again (every other case)
// The first two read x from global memory once.

// Block s's first element and length.
__device__ __forceinline__ void piece_extent(long long s, long long n, long long g, long long groups,
                                             long long& begin, long long& len) {
    const long long r = s / groups, j = s - r * groups;
    begin = r * n + j * g;
    len = min(g, n - j * g);
}

// What quantizes one block's elements: its divisor (the reciprocal formed once) and zero point.
template <typename TQ, typename TC>
struct BlockQuantizer {
    Divisor<TC> div;
    ZeroPoint<TQ> zp;
    __device__ __forceinline__ TQ operator()(TC x) const { return quantize_rn_zp<TQ>(x, div, zp); }
};

// The parameters of block s from its min/max, which every thread of the team holds (so each
// derives the same parameters and no second exchange follows); `writer` publishes them.
struct DynamicOut {
    int symmetric;
    float eps;
    int scale_fmt;
    float* scales;
    int* zps;
    int* flag;
};
template <typename TQ, typename TC>
__device__ __forceinline__ BlockQuantizer<TQ, TC> block_quantizer(float lo, float hi, bool writer, long long s,
                                                                   const DynamicOut& o) {
    const QParams qp = finalize_one(lo, hi, CodeRange<TQ>::lo, CodeRange<TQ>::hi, o.symmetric, o.eps, o.scale_fmt);
    if (writer) publish(qp, s, o.scales, o.zps, o.flag);
    TC sc;
    widen_scale(qp.scale, sc);
    return {divisor(sc), zero_point<TQ>(qp.zp)};
}

// The block read twice: a team (warp for short blocks, thread block for long ones, as vLLM's
// dynamic per-token kernel) reduces it, then quantizes it; the second read is served from
// L1/L2 while the blocks in flight fit there.
template <typename T, typename TQ, bool WARP>
__global__ void __launch_bounds__(256)
dynamic_quantize_segments(const T* __restrict__ x, TQ* __restrict__ q, long long rows, long long n, long long g,
                          int symmetric, float eps, int scale_fmt, float* __restrict__ scales,
                          int* __restrict__ zps, int* __restrict__ flag) {
    using TC = typename ComputeOf<T>::type;
    const DynamicOut out{symmetric, eps, scale_fmt, scales, zps, flag};
    const long long groups = (n + g - 1) / g;
    const long long pieces = rows * groups;
    const int lane = team_lane<WARP>(), lanes = team_size<WARP>();
    for (long long s = team_id<WARP>(); s < pieces; s += team_count<WARP>()) {
        long long begin, len;
        piece_extent(s, n, g, groups, begin, len);
        Acc<T> acc;
        accumulate(acc, x, begin, len, lane, lanes);
        float l = acc.lo32(), h = acc.hi32();
        team_minmax<WARP>(l, h);
        const BlockQuantizer<TQ, TC> quant = block_quantizer<TQ, TC>(l, h, lane == 0, s, out);
        for (long long i = lane; i < len; i += lanes) q[begin + i] = quant(widen<TC>(x[begin + i]));
    }
}

// Each block read once, in registers (issue 38): n a multiple of 16, g a multiple of 16 or >= n,
// and x 16-byte aligned, so that every block starts on a 16-element unit whose 16 codes are one
// aligned 16-byte store; every block holds at most LANES * UNITS units. A team of LANES threads
// (8, 16 or 32 lanes of a warp, or the whole 256-thread block) takes one block: lane l loads
// units l, l + LANES, ... with 16-byte loads into registers before anything else, reduces them
// (warp shuffles, a block team one exchange through shared memory), computes the parameters and
// quantizes from the registers. DRAM sees x once, as a stream, where dynamic_quantize_segments
// reads each block twice (the second time from DRAM once the blocks in flight outgrow L2).
template <int LANES>
__device__ __forceinline__ void lanes_minmax(float& lo, float& hi) {
    if constexpr (LANES > 32) {
        team_minmax<false>(lo, hi);
    } else {
#pragma unroll
        for (int o = LANES / 2; o > 0; o >>= 1) {  // within aligned groups of LANES lanes
            lo = min_keep(lo, __shfl_xor_sync(0xffffffffu, lo, o));
            hi = max_keep(hi, __shfl_xor_sync(0xffffffffu, hi, o));
        }
    }
}

template <typename T, typename TQ, int LANES, int UNITS>
__global__ void __launch_bounds__(256)
dynamic_quantize_units(const T* __restrict__ x, TQ* __restrict__ q, long long rows, long long n, long long g,
                       int symmetric, float eps, int scale_fmt, float* __restrict__ scales,
                       int* __restrict__ zps, int* __restrict__ flag) {
    static_assert(sizeof(T) <= 4 && sizeof(TQ) == 1, "float16, bfloat16 or float32 in, one-byte codes out");
    static_assert(LANES == 8 || LANES == 16 || LANES == 32 || LANES == 256, "a part of a warp, a warp or the block");
    using TC = typename ComputeOf<T>::type;
    const DynamicOut out{symmetric, eps, scale_fmt, scales, zps, flag};
    constexpr int kTeams = LANES > 32 ? 1 : 256 / LANES;  // teams per thread block
    const long long groups = (n + g - 1) / g;
    const long long pieces = rows * groups;
    const int lane = threadIdx.x % LANES, team = threadIdx.x / LANES;
    // Rounds of kTeams blocks per thread block: every lane of a warp takes every round (the
    // shuffles take the whole warp), a team past the end with an empty block.
    for (long long first = static_cast<long long>(blockIdx.x) * kTeams; first < pieces;
         first += static_cast<long long>(gridDim.x) * kTeams) {
        const long long s = first + team;
        long long begin = 0, len = 0;
        if (s < pieces) piece_extent(s, n, g, groups, begin, len);
        T v[UNITS][kUnit];
        Acc<T> acc;
#pragma unroll
        for (int k = 0; k < UNITS; ++k) {
            const long long at = static_cast<long long>(lane + k * LANES) * kUnit;
            if (at < len) {
                load_unit_vec(v[k], x + begin + at);
#pragma unroll
                for (int e = 0; e < kUnit; ++e) acc.add(v[k][e]);
            }
        }
        float l = acc.lo32(), h = acc.hi32();
        lanes_minmax<LANES>(l, h);
        if (s >= pieces) continue;  // (no barrier follows: the block team never gets here)
        const BlockQuantizer<TQ, TC> quant = block_quantizer<TQ, TC>(l, h, lane == 0, s, out);
#pragma unroll
        for (int k = 0; k < UNITS; ++k) {
            const long long at = static_cast<long long>(lane + k * LANES) * kUnit;
            if (at < len) {
                TQ c[kUnit];
#pragma unroll
                for (int e = 0; e < kUnit; ++e) c[e] = quant(widen<TC>(v[k][e]));
                store_unit_vec(q + begin + at, c);
            }
        }
    }
}

// Each block read once, staged in dynamic shared memory (issue 38): blocks too long for the
// registers (more than 16384 elements) of float16/bfloat16/float32, any length and alignment.
// One 512-thread block per block (grid-stride). Element i of the block goes to shared slot
// kVec + sx + i, where sx = the block's start modulo 16 bytes (in elements): a 16-byte aligned
// vector of x lands on a 16-byte aligned slot, so the 16-byte loads (four in flight a thread)
// are stored as they came, and the head and tail before and after the aligned vectors are
// scalar. The min/max is taken on the way in; after the block's exchange (whose barriers also
// publish the staged row) every thread quantizes quads of 4 codes aligned in q: one 4-byte
// store each (a warp writes 128 contiguous bytes), the quad's 4 elements taken from the two
// aligned 4-element chunks of shared memory that hold them (consecutive threads read
// consecutive chunks: no bank conflict); only the first and last quad of a block, which share
// their word with a neighbouring block, store byte by byte. Shared memory needed, in bytes:
// (g + 32) * sizeof(T) (gpuq/backends/cuda/qparams.py staged_bytes), above the 48 KB every
// kernel gets by default for blocks over 12256 float32 (the host raises the kernel's
// MaxDynamicSharedMemorySize once, to the device's opt-in maximum less 1 KB).
constexpr int kStagedThreads = 512;  // STAGED_THREADS in gpuq/backends/cuda/qparams.py
template <int BYTES> struct RawOf;
template <> struct RawOf<8> { using type = uint2; };
template <> struct RawOf<16> { using type = uint4; };

template <typename T, typename TQ>
__global__ void __launch_bounds__(kStagedThreads, 2)
dynamic_quantize_staged(const T* __restrict__ x, TQ* __restrict__ q, long long rows, long long n, long long g,
                        int symmetric, float eps, int scale_fmt, float* __restrict__ scales,
                        int* __restrict__ zps, int* __restrict__ flag) {
    static_assert(sizeof(T) <= 4 && sizeof(TQ) == 1, "float16, bfloat16 or float32 in, one-byte codes out");
    using TC = typename ComputeOf<T>::type;
    using Chunk = typename RawOf<4 * sizeof(T)>::type;  // 4 elements
    constexpr int kVec = 16 / static_cast<int>(sizeof(T));  // elements a 16-byte vector
    extern __shared__ __align__(16) unsigned char staged_raw[];
    T* const staged = reinterpret_cast<T*>(staged_raw);
    const DynamicOut out{symmetric, eps, scale_fmt, scales, zps, flag};
    const long long groups = (n + g - 1) / g;
    const long long pieces = rows * groups;
    const int t = threadIdx.x;
    for (long long s = blockIdx.x; s < pieces; s += gridDim.x) {
        long long begin, len;
        piece_extent(s, n, g, groups, begin, len);
        const T* xb = x + begin;
        const int sx = static_cast<int>((reinterpret_cast<unsigned long long>(xb) & 15u) / sizeof(T));
        const long long head = min(len, static_cast<long long>((kVec - sx) % kVec));
        const long long vecs = (len - head) / kVec;
        const long long tail = head + vecs * kVec;
        T* const row = staged + kVec + sx;  // row[i]: element i
        Acc<T> acc;
        for (long long i = t; i < head; i += kStagedThreads) {
            row[i] = xb[i];
            acc.add(row[i]);
        }
        const uint4* src = reinterpret_cast<const uint4*>(xb + head);
        uint4* dst = reinterpret_cast<uint4*>(row + head);  // 16-byte aligned: kVec + sx + head = 0 mod kVec
        for (long long j = t; j < vecs; j += 4LL * kStagedThreads) {
            uint4 raw[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const long long jj = j + static_cast<long long>(u) * kStagedThreads;
                if (jj < vecs) raw[u] = __ldg(src + jj);
            }
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const long long jj = j + static_cast<long long>(u) * kStagedThreads;
                if (jj >= vecs) break;
                dst[jj] = raw[u];
                T v[kVec];
                memcpy(v, &raw[u], sizeof(v));
#pragma unroll
                for (int e = 0; e < kVec; ++e) acc.add(v[e]);
            }
        }
        for (long long i = tail + t; i < len; i += kStagedThreads) {
            row[i] = xb[i];
            acc.add(row[i]);
        }
        float l = acc.lo32(), h = acc.hi32();
        team_minmax<false>(l, h);  // its barriers also make the staged row visible to every thread
        const BlockQuantizer<TQ, TC> quant = block_quantizer<TQ, TC>(l, h, t == 0, s, out);
        // Quad k: codes at positions 4k - aq .. 4k - aq + 3 (aq: q + begin modulo 4 bytes), whose
        // elements start at slot off + 4k, inside chunks c0 + k and c0 + k + 1 from element d.
        TQ* qb = q + begin;
        const int aq = static_cast<int>(reinterpret_cast<unsigned long long>(qb) & 3u);
        const int off = kVec + sx - aq;  // >= 1
        const int c0 = off >> 2, d = off & 3;
        const Chunk* chunks = reinterpret_cast<const Chunk*>(staged);
        const long long quads = (len + aq + 3) / 4;
        for (long long k = t; k < quads; k += kStagedThreads) {
            T both[8];
            const Chunk a = chunks[c0 + k], b = chunks[c0 + k + 1];
            memcpy(both, &a, sizeof(a));
            memcpy(both + 4, &b, sizeof(b));
            const long long p0 = 4 * k - aq;
            unsigned word = 0;
#pragma unroll
            for (int m = 0; m < 4; ++m) {
                // d is the same for every quad of the block: selects, not a local array.
                const T e = d == 0 ? both[m] : d == 1 ? both[m + 1] : d == 2 ? both[m + 2] : both[m + 3];
                const TQ c = quant(widen<TC>(e));
                unsigned char byte;
                memcpy(&byte, &c, 1);
                word |= static_cast<unsigned>(byte) << (8 * m);
            }
            if (p0 >= 0 && p0 + 4 <= len) {
                *reinterpret_cast<unsigned*>(qb + p0) = word;
            } else {
#pragma unroll
                for (int m = 0; m < 4; ++m) {
                    if (p0 + m >= 0 && p0 + m < len) {
                        const unsigned char byte = static_cast<unsigned char>(word >> (8 * m));
                        memcpy(qb + p0 + m, &byte, 1);
                    }
                }
            }
        }
        __syncthreads();  // every read of this block's stage before the next block's writes
    }
}

}  // namespace gpuq
