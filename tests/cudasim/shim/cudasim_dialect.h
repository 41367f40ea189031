// cudasim: the CUDA dialect for a host C++17 compiler (tests only).
//
// Included at the top of every translation unit that hostbuild.py generates
// from a kernel source (the same text NVRTC compiles, with its inline asm
// already rewritten by ptx.py). It provides what NVRTC provides implicitly
// and nothing more: the execution-space keywords, the built-in index
// variables (per CUDA thread: each thread is a fiber, cudasim_runtime.h),
// vector types, __ldg, atomics, barriers, warp collectives, bit casts, the
// double intrinsics with an explicit rounding mode and CUDA's min/max/fmin/fmax.
//
// Deliberately absent: <math.h> and every math function (glibc's results are
// not the GPU's bits), __constant__, textures, float atomicAdd (its flush mode
// depends on the memory space). Using one is a compile error, never a silent
// host substitute.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <type_traits>

#include "cudasim_ptx.h"

#define __CUDACC__ 1
#define __CUDACC_RTC__ 1
#ifndef __CUDA_ARCH__  // the fake CuPy passes -D__CUDA_ARCH__=<10 x its compute capability>
#define __CUDA_ARCH__ 800
#endif
#define __CUDASIM__ 1

// Execution spaces and qualifiers. __shared__ variables are static storage:
// blocks run one after another on one OS thread, so each block sees them alone.
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static
#define __launch_bounds__(...)  // read from the source text by hostbuild.py

namespace cudasim {
[[noreturn]] void fault(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void record_store(const void* p, std::size_t nbytes);
}

// The kernels' store hook (kernels/formats.cu: packed int4 bytes): each byte of a launch
// may be written by one thread only; a second writer is a fault (empty on a GPU).
#define GPUQ_RECORD_STORE(p, nbytes) ::cudasim::record_store((p), (nbytes))

// A failed device assert traps the kernel on a GPU: here it is a KernelFault.
#undef assert
#define assert(e) \
    ((e) ? static_cast<void>(0) : ::cudasim::fault("assertion failed: %s (%s:%d)", #e, __FILE__, __LINE__))
inline void __trap() { ::cudasim::fault("__trap() called"); }

// ---------------------------------------------------------------------------
// Vector types. CUDA gives the 2- and 4-element types an alignment above their
// element's (uint4: 16 bytes); a GPU faults on a misaligned vector access, so
// these copy constructors and assignments check both addresses involved.

namespace cudasim {
inline void check_vector_align(const void* p, std::size_t align, const char* type, const char* access) {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    if (a % align != 0) {
        fault("misaligned %zu-byte vector %s of %s at %p (address %% %zu = %zu)", align, access, type, p, align,
              static_cast<std::size_t>(a % align));
    }
}
}  // namespace cudasim

#define CUDASIM_VEC1(N, T)                                                   \
    struct N {                                                               \
        T x;                                                                 \
    };                                                                       \
    inline N make_##N(T x) { return N{x}; }
#define CUDASIM_VEC3(N, T)                                                   \
    struct N {                                                               \
        T x, y, z;                                                           \
    };                                                                       \
    inline N make_##N(T x, T y, T z) { return N{x, y, z}; }
#define CUDASIM_VEC2(N, T, A)                                                                  \
    struct alignas(A) N {                                                                      \
        T x, y;                                                                                \
        N() = default;                                                                         \
        constexpr N(T a, T b) : x(a), y(b) {}                                                  \
        N(const N& o) {                                                                        \
            ::cudasim::check_vector_align(&o, A, #N, "load");                                 \
            x = o.x;                                                                           \
            y = o.y;                                                                           \
        }                                                                                      \
        N& operator=(const N& o) {                                                             \
            ::cudasim::check_vector_align(&o, A, #N, "load");                                 \
            ::cudasim::check_vector_align(this, A, #N, "store");                              \
            x = o.x;                                                                           \
            y = o.y;                                                                           \
            return *this;                                                                      \
        }                                                                                      \
    };                                                                                         \
    inline N make_##N(T x, T y) { return N(x, y); }
#define CUDASIM_VEC4(N, T, A)                                                                  \
    struct alignas(A) N {                                                                      \
        T x, y, z, w;                                                                          \
        N() = default;                                                                         \
        constexpr N(T a, T b, T c, T d) : x(a), y(b), z(c), w(d) {}                            \
        N(const N& o) {                                                                        \
            ::cudasim::check_vector_align(&o, A, #N, "load");                                 \
            x = o.x;                                                                           \
            y = o.y;                                                                           \
            z = o.z;                                                                           \
            w = o.w;                                                                           \
        }                                                                                      \
        N& operator=(const N& o) {                                                             \
            ::cudasim::check_vector_align(&o, A, #N, "load");                                 \
            ::cudasim::check_vector_align(this, A, #N, "store");                              \
            x = o.x;                                                                           \
            y = o.y;                                                                           \
            z = o.z;                                                                           \
            w = o.w;                                                                           \
            return *this;                                                                      \
        }                                                                                      \
    };                                                                                         \
    inline N make_##N(T x, T y, T z, T w) { return N(x, y, z, w); }

#define CUDASIM_VECS(P, T, A2, A4) \
    CUDASIM_VEC1(P##1, T)          \
    CUDASIM_VEC2(P##2, T, A2)      \
    CUDASIM_VEC3(P##3, T)          \
    CUDASIM_VEC4(P##4, T, A4)

CUDASIM_VECS(char, signed char, 2, 4)
CUDASIM_VECS(uchar, unsigned char, 2, 4)
CUDASIM_VECS(short, short, 4, 8)
CUDASIM_VECS(ushort, unsigned short, 4, 8)
CUDASIM_VECS(int, int, 8, 16)
CUDASIM_VECS(uint, unsigned int, 8, 16)
CUDASIM_VECS(long, long, 16, 16)
CUDASIM_VECS(ulong, unsigned long, 16, 16)
CUDASIM_VECS(longlong, long long, 16, 16)
CUDASIM_VECS(ulonglong, unsigned long long, 16, 16)
CUDASIM_VECS(float, float, 8, 16)
CUDASIM_VECS(double, double, 16, 16)

struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
};

constexpr int warpSize = 32;

// ---------------------------------------------------------------------------
// The state of a CUDA thread (a fiber). The runtime (cudasim_runtime.h)
// defines the scheduling; these declarations are what the intrinsics need.

namespace cudasim {

enum FiberState : unsigned char { kRunnable, kBarrier, kWarp, kDone };

// Warp collective kinds (PTX shfl modes first).
enum WarpKind : int { kShflUp, kShflDown, kShflBfly, kShflIdx, kSyncWarp, kBallot, kAll, kAny };
// Barrier kinds.
enum BarrierKind : int { kBarSync, kBarCount, kBarAnd, kBarOr };

struct Stack;

struct Fiber {
    ::uint3 tid;
    unsigned linear, lane, warp;
    FiberState state;
    bool started;
    void* sp;  // saved stack pointer (x86-64 switch)
    Stack* stack;
    // At a barrier: where, which kind, this thread's predicate, the result.
    const char* bar_file;
    int bar_line;
    int bar_kind;
    int bar_pred;
    int bar_result;
    // At a warp collective: kind, mask, width, bytes, this lane's value and
    // operand (lane, delta, lane mask or predicate), the result.
    int wkind;
    unsigned wmask;
    int wwidth;
    unsigned wsize;
    unsigned long long win;
    unsigned warg;
    unsigned long long wout;
    const char* wname;
};

inline Fiber* g_cur = nullptr;  // the running CUDA thread, null in the scheduler
inline ::uint3 g_block_idx{0, 0, 0};
inline ::dim3 g_block_dim{1, 1, 1};
inline ::dim3 g_grid_dim{1, 1, 1};
alignas(16) inline unsigned char g_dynamic_smem[227 * 1024];  // extern __shared__ arrays: the largest opt-in (sm_90)

inline const ::uint3& thread_idx() {
    if (g_cur == nullptr) fault("threadIdx read outside a CUDA thread");
    return g_cur->tid;
}

int barrier(const char* file, int line, int kind, int pred);
unsigned long long warp_collective(int kind, unsigned mask, int width, unsigned size, unsigned long long value,
                                   unsigned arg, const char* name);

}  // namespace cudasim

#define threadIdx (::cudasim::thread_idx())
#define blockIdx (static_cast<const ::uint3&>(::cudasim::g_block_idx))
#define blockDim (static_cast<const ::dim3&>(::cudasim::g_block_dim))
#define gridDim (static_cast<const ::dim3&>(::cudasim::g_grid_dim))

// ---------------------------------------------------------------------------
// Barriers (the call site is recorded: threads of a block that wait at
// different __syncthreads are a fault, as is one that some threads never reach).

#define __syncthreads() static_cast<void>(::cudasim::barrier(__FILE__, __LINE__, ::cudasim::kBarSync, 0))
#define __syncthreads_count(p) ::cudasim::barrier(__FILE__, __LINE__, ::cudasim::kBarCount, (p) ? 1 : 0)
#define __syncthreads_and(p) ::cudasim::barrier(__FILE__, __LINE__, ::cudasim::kBarAnd, (p) ? 1 : 0)
#define __syncthreads_or(p) ::cudasim::barrier(__FILE__, __LINE__, ::cudasim::kBarOr, (p) ? 1 : 0)

// One host thread runs a launch: memory is coherent, fences have nothing to order.
inline void __threadfence() {}
inline void __threadfence_block() {}

// ---------------------------------------------------------------------------
// Warp collectives. All lanes named in the mask must reach the same collective
// (same kind, mask and width); a missing, exited or mismatched lane is a fault.

namespace cudasim {
template <class T>
inline T shuffle(int kind, unsigned mask, T var, unsigned arg, int width, const char* name) {
    static_assert(std::is_arithmetic_v<T> && !std::is_same_v<T, bool> && (sizeof(T) == 4 || sizeof(T) == 8),
                  "cudasim: shuffles move 32- and 64-bit arithmetic values");
    unsigned long long in = 0;
    std::memcpy(&in, &var, sizeof(T));
    const unsigned long long outv = warp_collective(kind, mask, width, sizeof(T), in, arg, name);
    T r;
    std::memcpy(&r, &outv, sizeof(T));
    return r;
}
}  // namespace cudasim

template <class T>
inline T __shfl_sync(unsigned mask, T var, int srcLane, int width = warpSize) {
    return ::cudasim::shuffle(::cudasim::kShflIdx, mask, var, static_cast<unsigned>(srcLane), width, "__shfl_sync");
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T var, unsigned int delta, int width = warpSize) {
    return ::cudasim::shuffle(::cudasim::kShflUp, mask, var, delta, width, "__shfl_up_sync");
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T var, unsigned int delta, int width = warpSize) {
    return ::cudasim::shuffle(::cudasim::kShflDown, mask, var, delta, width, "__shfl_down_sync");
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T var, int laneMask, int width = warpSize) {
    return ::cudasim::shuffle(::cudasim::kShflBfly, mask, var, static_cast<unsigned>(laneMask), width,
                              "__shfl_xor_sync");
}
inline void __syncwarp(unsigned mask = 0xffffffffu) {
    ::cudasim::warp_collective(::cudasim::kSyncWarp, mask, 32, 4, 0, 0, "__syncwarp");
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
    return static_cast<unsigned>(
        ::cudasim::warp_collective(::cudasim::kBallot, mask, 32, 4, 0, pred ? 1u : 0u, "__ballot_sync"));
}
inline int __all_sync(unsigned mask, int pred) {
    return static_cast<int>(::cudasim::warp_collective(::cudasim::kAll, mask, 32, 4, 0, pred ? 1u : 0u, "__all_sync"));
}
inline int __any_sync(unsigned mask, int pred) {
    return static_cast<int>(::cudasim::warp_collective(::cudasim::kAny, mask, 32, 4, 0, pred ? 1u : 0u, "__any_sync"));
}

// ---------------------------------------------------------------------------
// __ldg: a read-only load; null and misaligned addresses fault as on a GPU.

namespace cudasim {
template <class T> struct LdgType : std::bool_constant<std::is_arithmetic_v<T> && !std::is_same_v<T, bool>> {};
#define CUDASIM_LDG_VEC(N) \
    template <> struct LdgType<N> : std::true_type {};
CUDASIM_LDG_VEC(char2) CUDASIM_LDG_VEC(char4) CUDASIM_LDG_VEC(uchar2) CUDASIM_LDG_VEC(uchar4)
CUDASIM_LDG_VEC(short2) CUDASIM_LDG_VEC(short4) CUDASIM_LDG_VEC(ushort2) CUDASIM_LDG_VEC(ushort4)
CUDASIM_LDG_VEC(int2) CUDASIM_LDG_VEC(int4) CUDASIM_LDG_VEC(uint2) CUDASIM_LDG_VEC(uint4)
CUDASIM_LDG_VEC(longlong2) CUDASIM_LDG_VEC(ulonglong2) CUDASIM_LDG_VEC(float2) CUDASIM_LDG_VEC(float4)
CUDASIM_LDG_VEC(double2)
#undef CUDASIM_LDG_VEC

inline void check_address(const void* p, std::size_t align, const char* what) {
    if (p == nullptr) fault("%s through a null pointer", what);
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    if (a % align != 0) fault("misaligned %zu-byte %s at %p", align, what, p);
}
}  // namespace cudasim

template <class T>
inline T __ldg(const T* p) {
    static_assert(::cudasim::LdgType<T>::value, "cudasim: __ldg of a type CUDA has no __ldg for");
    ::cudasim::check_address(p, alignof(T), "__ldg");
    return *p;
}

// ---------------------------------------------------------------------------
// Atomics (relaxed, on the host's atomic builtins). Null or misaligned
// addresses fault.

namespace cudasim {
template <class T>
inline T* atomic_target(T* p, const char* name) {
    check_address(p, sizeof(T), name);
    return p;
}
template <class T, class Op>
inline T atomic_update(T* p, Op op, const char* name) {
    atomic_target(p, name);
    T old;
    __atomic_load(p, &old, __ATOMIC_RELAXED);
    for (;;) {  // compares bytes: a NaN matches itself
        T desired = op(old);
        if (__atomic_compare_exchange(p, &old, &desired, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) return old;
    }
}
}  // namespace cudasim

#define CUDASIM_ATOMIC_RMW(NAME, BUILTIN, T) \
    inline T NAME(T* p, T v) { return BUILTIN(::cudasim::atomic_target(p, #NAME), v, __ATOMIC_RELAXED); }

CUDASIM_ATOMIC_RMW(atomicAdd, __atomic_fetch_add, int)
CUDASIM_ATOMIC_RMW(atomicAdd, __atomic_fetch_add, unsigned int)
CUDASIM_ATOMIC_RMW(atomicAdd, __atomic_fetch_add, unsigned long long)
CUDASIM_ATOMIC_RMW(atomicSub, __atomic_fetch_sub, int)
CUDASIM_ATOMIC_RMW(atomicSub, __atomic_fetch_sub, unsigned int)
CUDASIM_ATOMIC_RMW(atomicAnd, __atomic_fetch_and, int)
CUDASIM_ATOMIC_RMW(atomicAnd, __atomic_fetch_and, unsigned int)
CUDASIM_ATOMIC_RMW(atomicAnd, __atomic_fetch_and, unsigned long long)
CUDASIM_ATOMIC_RMW(atomicOr, __atomic_fetch_or, int)
CUDASIM_ATOMIC_RMW(atomicOr, __atomic_fetch_or, unsigned int)
CUDASIM_ATOMIC_RMW(atomicOr, __atomic_fetch_or, unsigned long long)
CUDASIM_ATOMIC_RMW(atomicXor, __atomic_fetch_xor, int)
CUDASIM_ATOMIC_RMW(atomicXor, __atomic_fetch_xor, unsigned int)
CUDASIM_ATOMIC_RMW(atomicXor, __atomic_fetch_xor, unsigned long long)
CUDASIM_ATOMIC_RMW(atomicExch, __atomic_exchange_n, int)
CUDASIM_ATOMIC_RMW(atomicExch, __atomic_exchange_n, unsigned int)
CUDASIM_ATOMIC_RMW(atomicExch, __atomic_exchange_n, unsigned long long)
#undef CUDASIM_ATOMIC_RMW

inline float atomicExch(float* p, float v) {
    return ::cudasim::atomic_update(p, [v](float) { return v; }, "atomicExch");
}
// float64 has no flush mode; one IEEE addition, round to nearest even.
inline double atomicAdd(double* p, double v) {
    return ::cudasim::atomic_update(p, [v](double o) { return o + v; }, "atomicAdd");
}
// CUDA Programming Guide 20.3: a float atomicAdd flushes subnormals on global
// memory and keeps them on shared memory; the two are not told apart here.
float atomicAdd(float* p, float v) = delete;

#define CUDASIM_ATOMIC_MINMAX(T)                                                                       \
    inline T atomicMin(T* p, T v) {                                                                    \
        return ::cudasim::atomic_update(p, [v](T o) { return v < o ? v : o; }, "atomicMin");          \
    }                                                                                                  \
    inline T atomicMax(T* p, T v) {                                                                    \
        return ::cudasim::atomic_update(p, [v](T o) { return v > o ? v : o; }, "atomicMax");          \
    }
CUDASIM_ATOMIC_MINMAX(int)
CUDASIM_ATOMIC_MINMAX(unsigned int)
CUDASIM_ATOMIC_MINMAX(long long)
CUDASIM_ATOMIC_MINMAX(unsigned long long)
#undef CUDASIM_ATOMIC_MINMAX

inline unsigned int atomicInc(unsigned int* p, unsigned int v) {
    return ::cudasim::atomic_update(p, [v](unsigned int o) { return o >= v ? 0u : o + 1u; }, "atomicInc");
}
inline unsigned int atomicDec(unsigned int* p, unsigned int v) {
    return ::cudasim::atomic_update(p, [v](unsigned int o) { return (o == 0u || o > v) ? v : o - 1u; },
                                    "atomicDec");
}

#define CUDASIM_ATOMIC_CAS(T)                                                                       \
    inline T atomicCAS(T* p, T compare, T v) {                                                      \
        ::cudasim::atomic_target(p, "atomicCAS");                                                   \
        __atomic_compare_exchange_n(p, &compare, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);    \
        return compare; /* the old value either way */                                              \
    }
CUDASIM_ATOMIC_CAS(int)
CUDASIM_ATOMIC_CAS(unsigned int)
CUDASIM_ATOMIC_CAS(unsigned long long)
CUDASIM_ATOMIC_CAS(unsigned short)
#undef CUDASIM_ATOMIC_CAS

// ---------------------------------------------------------------------------
// Integer intrinsics: the unsigned high product and the leading-zero count (the index maps' magic division).
inline unsigned int __umulhi(unsigned int a, unsigned int b) { return ::cudasim::ptx::mul_hi_u32(a, b); }
inline int __clz(int x) { return static_cast<int>(::cudasim::ptx::clz_b32(static_cast<uint32_t>(x))); }

// ---------------------------------------------------------------------------
// Bit casts.

inline unsigned int __float_as_uint(float x) { return ::cudasim::ptx::bits_of(x); }
inline int __float_as_int(float x) { return static_cast<int>(::cudasim::ptx::bits_of(x)); }
inline float __uint_as_float(unsigned int x) { return ::cudasim::ptx::f32_of(x); }
inline float __int_as_float(int x) { return ::cudasim::ptx::f32_of(static_cast<uint32_t>(x)); }
inline long long __double_as_longlong(double x) { return static_cast<long long>(::cudasim::ptx::bits_of(x)); }
inline double __longlong_as_double(long long x) { return ::cudasim::ptx::f64_of(static_cast<uint64_t>(x)); }
inline int __double2hiint(double x) { return static_cast<int>(::cudasim::ptx::bits_of(x) >> 32); }
inline int __double2loint(double x) { return static_cast<int>(::cudasim::ptx::bits_of(x) & 0xffffffffu); }
inline double __hiloint2double(int hi, int lo) {
    return ::cudasim::ptx::f64_of((static_cast<uint64_t>(static_cast<uint32_t>(hi)) << 32) | static_cast<uint32_t>(lo));
}

// ---------------------------------------------------------------------------
// float64 with an explicit rounding mode (_rn): one IEEE operation on the host
// under the launch's reset environment (round to nearest even; f64 has no
// flush mode on a GPU). NaN payloads propagate as on the host (the PTX ISA:
// "NaN payloads are supported for double-precision instructions").

inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __ddiv_rn(double a, double b) { return a / b; }

// ---------------------------------------------------------------------------
// fmin/fmax and CUDA's min/max overloads. fminf/fmaxf and float min/max are
// min.f32/max.f32; fmin/fmax and double min/max are min.f64/max.f64: NaN
// skipped, -0.0 < +0.0.

namespace cudasim {
inline double min_f64(double a, double b) {
    const uint64_t ua = ptx::bits_of(a), ub = ptx::bits_of(b);
    const bool na = ptx::is_nan64(ua), nb = ptx::is_nan64(ub);
    if (na && nb) return ptx::f64_of(ua | 0x0008000000000000ull);
    if (na) return b;
    if (nb) return a;
    if (((ua | ub) & 0x7fffffffffffffffull) == 0) return (ua >> 63) ? a : b;
    return a < b ? a : b;
}
inline double max_f64(double a, double b) {
    const uint64_t ua = ptx::bits_of(a), ub = ptx::bits_of(b);
    const bool na = ptx::is_nan64(ua), nb = ptx::is_nan64(ub);
    if (na && nb) return ptx::f64_of(ua | 0x0008000000000000ull);
    if (na) return b;
    if (nb) return a;
    if (((ua | ub) & 0x7fffffffffffffffull) == 0) return (ua >> 63) ? b : a;
    return a > b ? a : b;
}
}  // namespace cudasim

inline float fminf(float a, float b) { return ::cudasim::ptx::min_f32(a, b); }
inline float fmaxf(float a, float b) { return ::cudasim::ptx::max_f32(a, b); }
inline double fmin(double a, double b) { return ::cudasim::min_f64(a, b); }
inline double fmax(double a, double b) { return ::cudasim::max_f64(a, b); }
inline float fmin(float a, float b) { return ::cudasim::ptx::min_f32(a, b); }
inline float fmax(float a, float b) { return ::cudasim::ptx::max_f32(a, b); }
inline float min(float a, float b) { return ::cudasim::ptx::min_f32(a, b); }
inline float max(float a, float b) { return ::cudasim::ptx::max_f32(a, b); }
inline double min(double a, double b) { return ::cudasim::min_f64(a, b); }
inline double max(double a, double b) { return ::cudasim::max_f64(a, b); }

// Integer overloads as in CUDA's math_functions.hpp: one per type, and the
// mixed signed/unsigned pairs of one width computed in the unsigned type.
#define CUDASIM_MINMAX(R, A, B)                                                                  \
    inline R min(A a, B b) { return static_cast<R>(a) < static_cast<R>(b) ? static_cast<R>(a) : static_cast<R>(b); } \
    inline R max(A a, B b) { return static_cast<R>(a) > static_cast<R>(b) ? static_cast<R>(a) : static_cast<R>(b); }
CUDASIM_MINMAX(int, int, int)
CUDASIM_MINMAX(unsigned int, unsigned int, unsigned int)
CUDASIM_MINMAX(unsigned int, int, unsigned int)
CUDASIM_MINMAX(unsigned int, unsigned int, int)
CUDASIM_MINMAX(long, long, long)
CUDASIM_MINMAX(unsigned long, unsigned long, unsigned long)
CUDASIM_MINMAX(unsigned long, long, unsigned long)
CUDASIM_MINMAX(unsigned long, unsigned long, long)
CUDASIM_MINMAX(long long, long long, long long)
CUDASIM_MINMAX(unsigned long long, unsigned long long, unsigned long long)
CUDASIM_MINMAX(unsigned long long, long long, unsigned long long)
CUDASIM_MINMAX(unsigned long long, unsigned long long, long long)
#undef CUDASIM_MINMAX
