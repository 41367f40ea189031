// Dequantize: int8/uint8 codes -> float16/bfloat16/float32/float64, every scheme in one launch.
//
//   y = (q - zp) * s      (contract.cuh)
//
// Instantiated by name from Python (gpuq/backends/_kernels.py builds the names
// from gpuq._dtypes.C_TYPES), e.g.
//   gpuq::dequantize<unsigned char, __half, float, true, 0>   per-tensor, float16 out
#include "contract.cuh"
#include "elementwise.cuh"

namespace gpuq {

template <typename TQ, typename TOut, typename TS, bool HAS_ZP>
struct DequantizeOp : ParamCursor<TS, HAS_ZP> {
    using ParamCursor<TS, HAS_ZP>::s;
    using ParamCursor<TS, HAS_ZP>::z;
    __device__ TOut operator()(TQ v) const {
        if constexpr (HAS_ZP) {
            return narrow_rn<TOut>(dequantize_rn_zp<TS>(v, s, z));
        } else {
            return narrow_rn<TOut>(dequantize_rn_sym<TS>(v, s));
        }
    }
};

// q: n contiguous codes; y: n contiguous outputs; scales/zps: the scheme's
// parameters, C-contiguous in its param_shape (zps unused without HAS_ZP);
// head, vec: see elementwise.cuh (for_each_unit); m0..m2, dims: the map's
// (kMapValue: m0 the scale's bits, m1 the zero point; no pointer is read).
// TS is the compute type: float for float16/bfloat16/float32 output, double for float64.
template <typename TQ, typename TOut, typename TS, bool HAS_ZP, int MAP>
__global__ void __launch_bounds__(256)
dequantize(const TQ* __restrict__ q, TOut* __restrict__ y, const TS* __restrict__ scales,
           const int* __restrict__ zps, long long n, long long head, int vec, long long m0, long long m1,
           long long m2, const long long* __restrict__ dims) {
    DequantizeOp<TQ, TOut, TS, HAS_ZP> op{{scales, zps, TS(0), 0}};
    if constexpr (MAP == kMapValue) op.assign(scale_from_bits<TS>(m0), static_cast<int>(m1));
    for_each_unit<typename MapOf<MAP>::type, TQ, TOut, false>(q, y, n, head, vec, m0, m1, m2, dims, op);
}

}  // namespace gpuq
