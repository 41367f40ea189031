// Shared traversal of the (de)quantize kernels: which scale an element uses
// (the scheme's index map) and how a thread walks its elements (16-element
// units, 16-byte vector loads/stores, scalar head and tail, grid-stride loop).
//
// 64-bit indices everywhere an element is counted: a tensor on an 80 GB card
// can hold more than 2^31 elements, and a 32-bit offset would wrap silently.
// Only per-unit lane counters (0..15) are int.
#pragma once

namespace gpuq {

// The exact divisor of a scale (contract.cuh, which the kernels include first; the traversal
// harness of tests/test_kernels_compile.py includes this file alone and never quantizes).
template <typename TC> struct Divisor;

// The scale (and zero point) of the element being processed, reloaded by
// for_each_unit only when the map says the parameter index changed. Shared by
// the quantize and dequantize ops, which add their operator().
template <typename TS, bool HAS_ZP>
struct ParamCursor {
    const TS* __restrict__ scales;
    const int* __restrict__ zps;
    TS s;
    int z;
    __device__ void reload(long long p) {
        s = __ldg(scales + p);
        if constexpr (HAS_ZP) z = __ldg(zps + p);
    }
    __device__ void assign(TS scale, int zp) {  // kMapValue: the parameter by value, once per thread
        s = scale;
        z = zp;
    }
};

// The cursor of the quantize ops: the scale with its Divisor (contract.cuh: the reciprocal
// of the exact division), formed at each (re)load, not per element.
template <typename TS, bool HAS_ZP>
struct QuantCursor : ParamCursor<TS, HAS_ZP> {
    Divisor<TS> d;
    __device__ void reload(long long p) {
        ParamCursor<TS, HAS_ZP>::reload(p);
        d = divisor(this->s);
    }
    __device__ void assign(TS scale, int zp) {
        ParamCursor<TS, HAS_ZP>::assign(scale, zp);
        d = divisor(scale);
    }
};

// The scale of kMapValue, passed by value in a 64-bit kernel argument: float's
// bits in the low 32 (little-endian, as on every CUDA device), double's in all 64.
template <typename TS>
__device__ __forceinline__ TS scale_from_bits(long long bits) {
    TS s;
    memcpy(&s, &bits, sizeof(TS));
    return s;
}

// Elements per unit of work: 16 one-byte codes are one 16-byte vector, and the
// float side is 2 (float16), 4 (float32) or 8 (float64) 16-byte vectors.
constexpr int kUnit = 16;

// Scheme index maps, the template argument MAP of every kernel. The Python
// side (gpuq/backends/_kernels.py, MAPS) uses the same numbers.
constexpr int kMapTensor = 0;   // one scale
constexpr int kMapChannel = 1;  // [outer, C, inner]: p = (i / inner) % C
constexpr int kMapGroup = 2;    // [outer, n, inner], scales [outer, ceil(n/g), inner]
constexpr int kMapStrided = 3;  // general: p = sum_d coord_d * pstride_d
constexpr int kMapValue = 4;    // one scale and zero point passed by value (m0, m1): nothing to load

// a / b and a % b for 0 <= a, 0 < b. Most tensors have fewer than 2^32
// elements, and a 32-bit division is several times cheaper than the 64-bit
// routine; the choice is uniform across a warp in practice.
__device__ __forceinline__ void divmod(long long a, long long b, long long& q, long long& r) {
    if (((static_cast<unsigned long long>(a) | static_cast<unsigned long long>(b)) >> 32) == 0) {
        const unsigned int qa = static_cast<unsigned int>(a) / static_cast<unsigned int>(b);
        q = qa;
        r = static_cast<unsigned int>(a) - qa * static_cast<unsigned int>(b);
    } else {
        q = a / b;
        r = a - q * b;
    }
}

// a / b and a % b without a division instruction (Granlund-Montgomery, as PyTorch's
// IntegerDivider and CUTLASS's FastDivmod): for 1 <= d < 2^31 and 0 <= a < 2^31,
// a / d = (umulhi(a, mult) + a) >> shift with shift = ceil(log2 d) and
// mult = floor(2^32 (2^shift - d) / d) + 1 < 2^32 (the sum stays below 2^32). A 32-bit
// divide is ~15-20 instructions (I2F, MUFU.RCP, F2I, fix-ups); this is IMAD.HI, IADD, SHF.
// The host computes mult (gpuq/backends/cuda/launch.py, fast_divisor) and passes it in the
// map's 64-bit argument as a negative number: bit 63 set, mult in bits 62..31, d in 30..0.
// It does so only when the tensor has fewer than 2^31 elements (every divisor and index is
// then below 2^31); larger tensors get the plain divisors (non-negative) and divmod above.
struct FastDivmod {
    unsigned d, mult, shift;
    __device__ FastDivmod() : d(1), mult(1), shift(0) {}
    __device__ explicit FastDivmod(long long packed)
        : d(static_cast<unsigned>(packed) & 0x7fffffffu),
          mult(static_cast<unsigned>(static_cast<unsigned long long>(packed) >> 31)),
          shift(static_cast<unsigned>(32 - __clz(static_cast<int>(d - 1)))) {}
    __device__ __forceinline__ unsigned div(unsigned a) const { return (__umulhi(a, mult) + a) >> shift; }
    __device__ __forceinline__ void operator()(unsigned a, unsigned& q, unsigned& r) const {
        q = div(a);
        r = a - q * d;
    }
};

// Whether a map argument carries a FastDivmod (the host packed every divisor of the launch).
__device__ __forceinline__ bool packed_divisor(long long m) { return m < 0; }
__device__ __forceinline__ long long plain_divisor(long long m) {
    return packed_divisor(m) ? static_cast<long long>(m & 0x7fffffff) : m;
}

// Each map is a cursor: seek(i) once per unit (a few divisions), then next()
// per element (no division); next() returns whether the index changed, so a
// scale is reloaded only when it may differ. uniform() after seek(i) says that
// all of [i, i + kUnit) uses one parameter: the unit then skips next() and its
// per-lane checks. m0..m2 and dims are the kernel arguments described at each map.

// Per-tensor: every element uses scales[0].
struct TensorMap {
    __device__ TensorMap(long long, long long, long long, const long long*) {}
    __device__ void seek(long long) {}
    __device__ bool uniform() const { return true; }
    __device__ bool next() { return false; }
    __device__ long long index() const { return 0; }
};

// One parameter that arrived by value (a host scalar: no upload before the
// launch); the kernel assigns it once and for_each_unit never reloads it.
struct ValueMap : TensorMap {
    using TensorMap::TensorMap;
};
template <typename Map> constexpr bool kLoadsParams = true;
template <> constexpr bool kLoadsParams<ValueMap> = false;

// Per-channel on any axis as [outer, C, inner] (m0 = C, m1 = inner): one
// launch for all channels; also a multi-axis scheme whose axes merge into one
// run and per-group along the last axis with full groups (C = n / g, inner = g).
struct ChannelMap {
    long long channels, inner, c, r;
    bool fast;
    FastDivmod by_inner, by_channels;
    __device__ ChannelMap(long long m0, long long m1, long long, const long long*)
        : channels(plain_divisor(m0)), inner(plain_divisor(m1)), c(0), r(0), fast(packed_divisor(m0)) {
        if (fast) {
            by_channels = FastDivmod(m0);
            by_inner = FastDivmod(m1);
        }
    }
    __device__ void seek(long long i) {
        if (fast) {
            unsigned row, ri, unused, ci;
            by_inner(static_cast<unsigned>(i), row, ri);
            by_channels(row, unused, ci);
            r = ri;
            c = ci;
            return;
        }
        long long row;
        divmod(i, inner, row, r);
        long long unused;
        divmod(row, channels, unused, c);
    }
    __device__ bool uniform() const { return r + kUnit <= inner; }
    __device__ bool next() {
        if (++r < inner) return false;
        r = 0;
        if (++c == channels) c = 0;
        return true;
    }
    __device__ long long index() const { return c; }
};

// Per-group with ONNX block semantics along one axis: src as [outer, n, inner]
// (m0 = n, m1 = inner, m2 = g), scales as [outer, G, inner] with
// G = ceil(n / g); the last group may be shorter (ragged).
struct GroupMap {
    long long n, inner, g, groups;
    long long t, j, jr, p;  // position in the row, along the axis, within the group; scale index
    bool fast;
    FastDivmod by_inner, by_n, by_g;
    __device__ GroupMap(long long m0, long long m1, long long m2, const long long*)
        : n(plain_divisor(m0)), inner(plain_divisor(m1)), g(plain_divisor(m2)),
          groups(0), t(0), j(0), jr(0), p(0), fast(packed_divisor(m0)) {
        if (fast) {
            by_n = FastDivmod(m0);
            by_inner = FastDivmod(m1);
            by_g = FastDivmod(m2);
            unsigned q, rest;
            by_g(static_cast<unsigned>(n), q, rest);
            groups = q + (rest != 0);
        } else {
            groups = (n + g - 1) / g;
        }
    }
    __device__ void seek(long long i) {
        if (fast) {
            unsigned row, ti, o, ji, gq, jri;
            by_inner(static_cast<unsigned>(i), row, ti);
            by_n(row, o, ji);
            by_g(ji, gq, jri);
            t = ti;
            j = ji;
            jr = jri;
            p = (static_cast<long long>(o) * groups + gq) * inner + t;
            return;
        }
        long long row, o, gq;
        divmod(i, inner, row, t);
        divmod(row, n, o, j);
        divmod(j, g, gq, jr);
        p = (o * groups + gq) * inner + t;
    }
    // Only rows of one element (inner == 1) keep a scale from one element to the next.
    __device__ bool uniform() const { return inner == 1 && jr + kUnit <= g && j + kUnit <= n; }
    __device__ bool next() {
        if (++t < inner) {
            ++p;
            return true;
        }
        t = 0;
        p -= inner - 1;  // back to the start of this scale row
        if (++j == n) {  // next outer slice: its first group row follows the last one
            j = 0;
            jr = 0;
            p += inner;
            return true;
        }
        if (++jr == g) {  // next group along the axis
            jr = 0;
            p += inner;
            return true;
        }
        return inner != 1;
    }
    __device__ long long index() const { return p; }
};

// The general map (multi-axis on non-adjacent axes, blocks of any shape): src as merged dims
// (m0 = nd <= kMaxDims), dims = [shape[0..nd), pstride[0..nd), block[0..nd)] in device memory;
// the parameter of coordinates c is sum_d (c_d / block_d) * pstride_d (pstride 0 along a dim a
// block covers: its block is the dim). An odometer over the coordinates and their offsets
// inside their blocks: no division per element, a new parameter only where a block ends.
constexpr int kMaxDims = 8;
struct StridedMap {
    int nd;
    const long long* dims;
    long long coord[kMaxDims];
    long long rem[kMaxDims];  // coord[d] % block[d]
    long long p;
    __device__ StridedMap(long long m0, long long, long long, const long long* d)
        : nd(static_cast<int>(m0)), dims(d), p(0) {}
    // The dims loops stay loops (no unrolling): coord[] and rem[] live in local memory.
    __device__ void seek(long long i) {
        p = 0;
#pragma unroll 1
        for (int d = nd - 1; d >= 0; --d) {
            long long q, blk;
            divmod(i, dims[d], q, coord[d]);
            divmod(coord[d], dims[2 * nd + d], blk, rem[d]);
            p += blk * dims[nd + d];
            i = q;
        }
    }
    // The unit's 16 elements in one block of the last dim (and one row of it).
    __device__ bool uniform() const {
        const int l = nd - 1;
        return rem[l] + kUnit <= dims[2 * nd + l] && coord[l] + kUnit <= dims[l];
    }
    __device__ bool next() {
        const long long before = p;
#pragma unroll 1
        for (int d = nd - 1; d >= 0; --d) {
            const long long ps = dims[nd + d], b = dims[2 * nd + d];
            if (++coord[d] < dims[d]) {
                if (++rem[d] == b) {
                    rem[d] = 0;
                    p += ps;
                }
                return p != before;
            }
            // Carry: back to the dim's first block, on to the next coordinate of the dim above.
            long long last, unused;
            divmod(dims[d] - 1, b, last, unused);
            p -= last * ps;
            coord[d] = 0;
            rem[d] = 0;
        }
        return p != before;
    }
    __device__ long long index() const { return p; }
};

// Blocks of (br, bc) on a 2-D (merged) tensor of C columns, 128x128 the common case: the
// strided map's launches whose m0 is negative (the host packed m0 = br, m1 = C, m2 = bc for
// FastDivmod; launch.py, device_map_params) walk this map instead (HasBlock2D below), a walker
// of its own, so that no local array of StridedMap is near it. The parameter of element i is
// (row / br) * ceil(C / bc) + col / bc with row, col = divmod(i, C): three magic divisions a
// unit, registers only, no dims loads.
struct Block2DMap {
    FastDivmod by_br, by_cols, by_bc;
    unsigned ncb, col, col_rem, row_rem;  // column blocks; the column, its offset in its block, the row's
    long long p;
    __device__ Block2DMap(long long m0, long long m1, long long m2, const long long*)
        : by_br(m0), by_cols(m1), by_bc(m2), ncb(0), col(0), col_rem(0), row_rem(0), p(0) {
        unsigned q, r;
        by_bc(by_cols.d, q, r);
        ncb = q + (r != 0);
    }
    __device__ void seek(long long i) {
        unsigned row, rb, cb;
        by_cols(static_cast<unsigned>(i), row, col);
        by_br(row, rb, row_rem);
        by_bc(col, cb, col_rem);
        p = static_cast<long long>(rb) * ncb + cb;
    }
    __device__ bool uniform() const { return col_rem + kUnit <= by_bc.d && col + kUnit <= by_cols.d; }
    __device__ bool next() {
        if (++col < by_cols.d) {
            if (++col_rem < by_bc.d) return false;
            col_rem = 0;
            ++p;
            return true;
        }
        // The next row: back to the first column block, on to the next block row at its end.
        col = 0;
        col_rem = 0;
        p -= ncb - 1;
        if (++row_rem == by_br.d) {
            row_rem = 0;
            p += ncb;
        } else if (ncb == 1) {
            return false;  // one column block and still in the block row: the same parameter
        }
        return true;
    }
    __device__ long long index() const { return p; }
};

// Whether a map's launches may carry the 2-D block map's packed arguments (m0 < 0): the
// walkers then take Block2DMap instead (both are compiled into a strided kernel).
template <typename Map> struct HasBlock2D { static constexpr bool value = false; };
template <> struct HasBlock2D<StridedMap> { static constexpr bool value = true; };

template <int MAP> struct MapOf;
template <> struct MapOf<kMapTensor> { using type = TensorMap; };
template <> struct MapOf<kMapChannel> { using type = ChannelMap; };
template <> struct MapOf<kMapGroup> { using type = GroupMap; };
template <> struct MapOf<kMapStrided> { using type = StridedMap; };
template <> struct MapOf<kMapValue> { using type = ValueMap; };

// ---------------------------------------------------------------------------
// Units: unit 0 is the scalar head [0, head) (head < 16, chosen on the host so
// that the float side is 16-byte aligned from `head` on), unit k >= 1 is
// [head + 16 (k - 1), head + 16 k) clipped to n; only the last may be short.

__host__ __device__ __forceinline__ long long unit_count(long long n, long long head) {
    return 1 + (n - head + kUnit - 1) / kUnit;
}

__device__ __forceinline__ void unit_bounds(long long u, long long n, long long head, long long& begin,
                                            int& len) {
    if (u == 0) {
        begin = 0;
        len = static_cast<int>(head);
        return;
    }
    begin = head + (u - 1) * kUnit;
    const long long rest = n - begin;
    len = rest < kUnit ? static_cast<int>(rest) : kUnit;
}

// 16 elements through 16-byte vectors (p must be 16-byte aligned).
template <typename T>
__device__ __forceinline__ void load_unit_vec(T (&v)[kUnit], const T* __restrict__ p) {
    constexpr int kVecs = kUnit * sizeof(T) / 16;
    uint4 raw[kVecs];
    const uint4* src = reinterpret_cast<const uint4*>(p);
#pragma unroll
    for (int k = 0; k < kVecs; ++k) raw[k] = __ldg(src + k);
    memcpy(v, raw, sizeof(raw));
}

template <typename T>
__device__ __forceinline__ void store_unit_vec(T* __restrict__ p, const T (&v)[kUnit]) {
    constexpr int kVecs = kUnit * sizeof(T) / 16;
    uint4 raw[kVecs];
    memcpy(raw, v, sizeof(raw));
    uint4* dst = reinterpret_cast<uint4*>(p);
#pragma unroll
    for (int k = 0; k < kVecs; ++k) dst[k] = raw[k];
}

// Threads per block of every kernel here (their __launch_bounds__(256)).
constexpr int kThreads = 256;

// A warp's full units of a float output (2 to 8 16-byte vectors each: float16/bfloat16,
// float32, float64) stored so that every store instruction writes one contiguous span.
// Stored per thread, each instruction of the warp would write 16 bytes every 32/64/128
// bytes, every 32-byte sector in pieces: measured on an H200, a float32 output at 43% of
// the copy bandwidth, 93% through this (bench/NOTES.md, the device check). The units go
// through shared memory: each lane writes its vectors there (XOR-swizzled, so that no two
// lanes of a quarter-warp hit one bank), then vector j of the warp's span is stored by lane
// j % 32. Lanes whose unit is not full (`ok` false) store their own elements, elsewhere.
// Called by all 32 lanes of the warp (convergent); `lane_begin(L)` is the first element of
// lane L's unit: warp_begin + L * kUnit.
template <typename T>
__device__ __forceinline__ void store_units_coalesced(T* __restrict__ out, long long warp_begin,
                                                      const T (&y)[kUnit], bool ok) {
    constexpr int kVecs = kUnit * sizeof(T) / 16;  // 16-byte vectors a unit
    static_assert(kVecs == 2 || kVecs == 4 || kVecs == 8, "float16, bfloat16, float32 or float64 units");
    constexpr int kLanesPerRow = 8 / kVecs;  // lanes whose units share one 128-byte row of banks
    __shared__ uint4 stage[kThreads / 32][32 * kVecs];
    const int lane = threadIdx.x & 31;
    uint4* mine = stage[threadIdx.x >> 5];
    uint4 raw[kVecs];
    memcpy(raw, y, sizeof(raw));
#pragma unroll
    for (int v = 0; v < kVecs; ++v) mine[lane * kVecs + (v ^ ((lane / kLanesPerRow) % kVecs))] = raw[v];
    const unsigned full = __ballot_sync(0xffffffffu, ok);
    __syncwarp();
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
        const int j = 32 * k + lane;  // the warp's vector j: lane L's vector v
        const int L = j / kVecs, v = j % kVecs;
        if ((full >> L) & 1u) {
            uint4* dst = reinterpret_cast<uint4*>(out + warp_begin + static_cast<long long>(L) * kUnit) + v;
            *dst = mine[L * kVecs + (v ^ ((L / kLanesPerRow) % kVecs))];
        }
    }
    __syncwarp();  // the stage is rewritten by the next unit
}

// n bytes (8, 16 or 32) from v to p, in 16- or 8-byte vectors (p aligned to min(n, 16)).
template <int N>
__device__ __forceinline__ void store_bytes_vec(void* __restrict__ p, const void* v) {
    static_assert(N == 8 || N == 16 || N == 32, "8, 16 or 32 bytes");
    if constexpr (N == 8) {
        uint2 w;
        memcpy(&w, v, 8);
        *reinterpret_cast<uint2*>(p) = w;
    } else {
        uint4 w[N / 16];
        memcpy(w, v, N);
#pragma unroll
        for (int k = 0; k < N / 16; ++k) reinterpret_cast<uint4*>(p)[k] = w[k];
    }
}

// The warp-contiguous decode: a warp whose 32 units [base, base + 512) are all full takes
// them as 4 spans of 128 elements, lane L elements 4L..4L+3 of each: 4 codes in
// (fetch(begin, c)), one vector of 4 outputs out (16 bytes for float32, 8 for float16 and
// bfloat16, 32 for float64), so that every store instruction of the warp writes one
// contiguous run, without the shared-memory staging of store_units_coalesced (the traversal
// experiment's "unit4" layout, bench/NOTES.md: s8->f32 at 256M on an H200 in 0.328-0.334 ms
// against 0.348-0.352 staged). The map is sought once per 4-element run.
template <typename TCode, typename TOut, typename Map, typename Op, typename Fetch>
__device__ __forceinline__ void decode_warp_spans(Map& map, Op& op, long long base, TOut* __restrict__ out,
                                                  Fetch fetch) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const long long begin = base + 128 * k + 4 * lane;
        TCode c[4];
        fetch(begin, c);
        map.seek(begin);
        if constexpr (kLoadsParams<Map>) op.reload(map.index());
        TOut y[4];
        if (map.uniform()) {
#pragma unroll
            for (int l = 0; l < 4; ++l) y[l] = op(c[l]);
        } else {
#pragma unroll
            for (int l = 0; l < 4; ++l) {
                if (l > 0 && map.next()) op.reload(map.index());
                y[l] = op(c[l]);
            }
        }
        store_bytes_vec<4 * sizeof(TOut)>(out + begin, y);
    }
}

// Bit flags of the kernels' `vec` argument: which side may use 16-byte vectors.
constexpr int kVecFloat = 1;  // float side (src of quantize, out of dequantize) aligned from `head` on
constexpr int kVecCode = 2;   // code side (out of quantize, src of dequantize) aligned there as well

// Walk every unit of [0, n) on a grid-stride loop: load 16 inputs (vectors
// where aligned and whole, else scalars), op.reload(index) at the unit's first
// element (except under ValueMap) and wherever the map's index changes, y = op(x) for each element,
// store 16 outputs the same way.
template <typename Map, typename TIn, typename TOut, bool VecInIsFloat, typename Op>
__device__ __forceinline__ void for_each_unit(const TIn* __restrict__ in, TOut* __restrict__ out,
                                              long long n, long long head, int vec, long long m0,
                                              long long m1, long long m2, const long long* dims, Op op) {
    const bool vec_in = (vec & (VecInIsFloat ? kVecFloat : kVecCode)) != 0;
    const bool vec_out = (vec & (VecInIsFloat ? kVecCode : kVecFloat)) != 0;
    // A float output goes out a warp at a time (store_units_coalesced): every lane of a warp
    // takes every iteration (the bound is the warp's first unit), idle lanes included.
    constexpr bool kWarpStore = !VecInIsFloat && sizeof(TOut) >= 2;
    if constexpr (HasBlock2D<Map>::value) {
        if (packed_divisor(m0)) {
            for_each_unit<Block2DMap, TIn, TOut, VecInIsFloat>(in, out, n, head, vec, m0, m1, m2, dims, op);
            return;
        }
    }
    const int lane = threadIdx.x & 31;
    const long long units = unit_count(n, head);
    const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
    Map map(m0, m1, m2, dims);  // seek() sets all of its position: built once per thread
    for (long long u = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
         (kWarpStore ? u - lane : u) < units; u += stride) {
        if constexpr (kWarpStore) {
            // The warp's 32 units all full and both sides vectorised (uniform across the warp):
            // the warp-contiguous decode. Else (the head's warp, the tail's) the staged store.
            const long long u0 = u - lane;
            if (u0 >= 1 && head + (u0 + 31) * kUnit <= n && vec_in && vec_out) {
                static_assert(sizeof(TIn) == 1, "one-byte codes");
                decode_warp_spans<TIn>(map, op, head + (u0 - 1) * kUnit, out, [&](long long b, TIn (&c)[4]) {
                    const unsigned word = __ldg(reinterpret_cast<const unsigned*>(in + b));
                    memcpy(c, &word, sizeof(word));
                });
                continue;
            }
        }
        long long begin = 0;
        int len = 0;
        if (u < units) unit_bounds(u, n, head, begin, len);
        if (!kWarpStore && len == 0) continue;
        const bool full = len == kUnit && u != 0;
        TIn x[kUnit];
        if (full && vec_in) {
            load_unit_vec(x, in + begin);
        } else {
#pragma unroll
            for (int l = 0; l < kUnit; ++l)
                if (l < len) x[l] = in[begin + l];
        }
        TOut y[kUnit];
        if (len > 0) {
            map.seek(begin);
            if constexpr (kLoadsParams<Map>) op.reload(map.index());
            if (full && map.uniform()) {
#pragma unroll
                for (int l = 0; l < kUnit; ++l) y[l] = op(x[l]);
            } else {
#pragma unroll
                for (int l = 0; l < kUnit; ++l) {
                    if (l < len) {
                        if (l > 0 && map.next()) op.reload(map.index());
                        y[l] = op(x[l]);
                    }
                }
            }
        }
        if constexpr (kWarpStore) {
            // Units are consecutive across the warp's lanes: u - lane's begins at head + 16 (u - lane - 1).
            store_units_coalesced(out, head + (u - lane - 1) * kUnit, y, full && vec_out);
        } else if (full && vec_out) {
            store_unit_vec(out + begin, y);
        }
        if (!(full && vec_out)) {
#pragma unroll
            for (int l = 0; l < kUnit; ++l)
                if (l < len) out[begin + l] = y[l];
        }
    }
}

}  // namespace gpuq
