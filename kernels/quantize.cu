// Quantize: float16/bfloat16/float32/float64 -> int8/uint8 codes, every scheme in one launch.
//
//   q = clamp(rint(x / s) + zp, qmin, qmax)      (contract.cuh)
//
// Instantiated by name from Python (gpuq/backends/_kernels.py builds the names
// from gpuq._dtypes.C_TYPES), e.g.
//   gpuq::quantize<float, signed char, float, true, 1>   per-channel with zero points
#include "contract.cuh"
#include "elementwise.cuh"

namespace gpuq {

template <typename TIn, typename TQ, typename TS, bool HAS_ZP>
struct QuantizeOp : QuantCursor<TS, HAS_ZP> {
    using Cursor = QuantCursor<TS, HAS_ZP>;
    using Cursor::d;
    using Cursor::z;
    ZeroPoint<TQ> zb;  // z with its clamp bounds, formed at each reload
    __device__ void reload(long long p) {
        Cursor::reload(p);
        if constexpr (HAS_ZP) zb = zero_point<TQ>(z);
    }
    __device__ void assign(TS scale, int zp) {
        Cursor::assign(scale, zp);
        if constexpr (HAS_ZP) zb = zero_point<TQ>(z);
    }
    __device__ TQ operator()(TIn x) const {
        if constexpr (HAS_ZP) {
            return quantize_rn_zp<TQ>(widen<TS>(x), d, zb);
        } else {
            return quantize_rn_sym<TQ>(widen<TS>(x), d);
        }
    }
};

// x: n contiguous inputs; q: n contiguous codes; scales/zps: the scheme's
// parameters, C-contiguous in its param_shape (zps unused without HAS_ZP);
// head, vec: see elementwise.cuh (for_each_unit); m0..m2, dims: the map's
// (kMapValue: m0 the scale's bits, m1 the zero point; no pointer is read).
// TS is the compute type: float for float16/bfloat16/float32 input, double for float64.
template <typename TIn, typename TQ, typename TS, bool HAS_ZP, int MAP>
__global__ void __launch_bounds__(256)
quantize(const TIn* __restrict__ x, TQ* __restrict__ q, const TS* __restrict__ scales,
         const int* __restrict__ zps, long long n, long long head, int vec, long long m0, long long m1,
         long long m2, const long long* __restrict__ dims) {
    QuantizeOp<TIn, TQ, TS, HAS_ZP> op{{{scales, zps, TS(0), 0}, {}}, {}};
    if constexpr (MAP == kMapValue) op.assign(scale_from_bits<TS>(m0), static_cast<int>(m1));
    for_each_unit<typename MapOf<MAP>::type, TIn, TQ, true>(x, q, n, head, vec, m0, m1, m2, dims, op);
}

}  // namespace gpuq
