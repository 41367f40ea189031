// cudasim: the execution engine of a host-built CUDA module (tests only).
//
// Included once per generated translation unit, after the kernel source.
// Every CUDA thread of a block is a fiber with its own stack; a fiber runs
// until it exits or reaches a barrier or a warp collective, and only there
// does control go back to the scheduler. So shared memory, __syncthreads and
// full-warp shuffles behave as on a GPU, and the order in which fibers run
// (the schedule) is the only freedom: "inorder", "reversed", "interleaved"
// (a fixed seeded permutation). The scheduler always resumes the runnable
// fiber of lowest rank in the schedule, so a warp that finishes a collective
// runs ahead of the warps behind it: a missing barrier shows as a wrong result.
//
// Blocks run one after another on the calling OS thread (static __shared__
// storage is then per block). A launch runs under a reset floating-point
// environment (round to nearest even, no FTZ/DAZ, exceptions clear) and puts
// the caller's back afterwards.
//
// Faults: anything a GPU would punish (misaligned vector access, a barrier
// that only part of a block reaches, a collective with a lane missing, an
// assert, a bad address, a fiber stack overflow, an integer division by zero)
// records a message and abandons the launch: cudasim_launch returns 1 and
// hostbuild.py raises KernelFault. Signals (SIGSEGV/SIGBUS/SIGFPE/SIGILL)
// are caught only on the launching thread while a fiber runs; any other
// signal goes to the handler that was there before.
#pragma once

#include <algorithm>
#include <array>
#include <cfenv>
#include <csetjmp>
#include <csignal>
#include <cstdarg>
#include <cstdlib>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif
#if defined(CUDASIM_UCONTEXT) || !defined(__x86_64__)
#define CUDASIM_USE_UCONTEXT 1
#include <ucontext.h>
#endif

#define CUDASIM_EXPORT extern "C" __attribute__((visibility("default")))

namespace cudasim {

// ---------------------------------------------------------------------------
// Floating-point environment of a launch.

struct FpEnvGuard {
    std::fenv_t saved;
#if defined(__x86_64__)
    unsigned int mxcsr;
#elif defined(__aarch64__)
    unsigned long fpcr;
#endif
    FpEnvGuard() {
        std::fegetenv(&saved);
#if defined(__x86_64__)
        mxcsr = _mm_getcsr();
#elif defined(__aarch64__)
        __asm__ volatile("mrs %0, fpcr" : "=r"(fpcr));
#endif
        std::fesetenv(FE_DFL_ENV);
#if defined(__x86_64__)
        _mm_setcsr(0x1f80u);  // all exceptions masked, flags clear, nearest, no FTZ (bit 15), no DAZ (bit 6)
#elif defined(__aarch64__)
        __asm__ volatile("msr fpcr, %0" : : "r"(0ul));  // nearest, no flush-to-zero
#else
#error "cudasim: unsupported host architecture (x86-64 and AArch64 only)"
#endif
    }
    ~FpEnvGuard() {
        std::fesetenv(&saved);
#if defined(__x86_64__)
        _mm_setcsr(mxcsr);
#elif defined(__aarch64__)
        __asm__ volatile("msr fpcr, %0" : : "r"(fpcr));
#endif
    }
    FpEnvGuard(const FpEnvGuard&) = delete;
    FpEnvGuard& operator=(const FpEnvGuard&) = delete;
};

// ---------------------------------------------------------------------------
// Fiber stacks: allocated once, reused; a guard page below each one.

constexpr std::size_t kStackBytes = 64 * 1024;

struct Stack {
    unsigned char* base;  // the guard page starts here
    std::size_t guard;
    unsigned char* lo;  // usable [lo, hi)
    unsigned char* hi;
#ifdef CUDASIM_USE_UCONTEXT
    ucontext_t uc;
#endif
};

inline std::vector<Stack*> g_free_stacks;
inline std::vector<Stack*> g_all_stacks;

inline Stack* acquire_stack() {
    if (!g_free_stacks.empty()) {
        Stack* s = g_free_stacks.back();
        g_free_stacks.pop_back();
        return s;
    }
    const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    void* mem = mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                     -1, 0);
    if (mem == MAP_FAILED) return nullptr;
    if (mprotect(mem, page, PROT_NONE) != 0) {
        munmap(mem, kStackBytes + page);
        return nullptr;
    }
    auto* s = new Stack;
    s->base = static_cast<unsigned char*>(mem);
    s->guard = page;
    s->lo = s->base + page;
    s->hi = s->lo + kStackBytes;
    g_all_stacks.push_back(s);
    return s;
}

inline void release_stack(Stack* s) { g_free_stacks.push_back(s); }

// Deepest use of any fiber stack so far (fresh pages are zero; the lowest
// non-zero byte bounds the use from below). For reports, not for decisions.
inline std::size_t stack_high_water() {
    std::size_t most = 0;
    for (const Stack* s : g_all_stacks) {
        const unsigned char* p = s->lo;
        while (p < s->hi && *p == 0) ++p;
        most = std::max(most, static_cast<std::size_t>(s->hi - p));
    }
    return most;
}

// ---------------------------------------------------------------------------
// Context switch. x86-64: callee-saved registers on the old stack, swap
// stack pointers (the floating-point control state is the same for every
// fiber of a launch, so it is not saved). Elsewhere, or with
// -DCUDASIM_UCONTEXT: ucontext.

#ifndef CUDASIM_USE_UCONTEXT
extern "C" __attribute__((visibility("hidden"))) void cudasim_switch_context(void** save_sp, void* new_sp);
__asm__(R"(
    .text
    .p2align 4
    .hidden cudasim_switch_context
    .type cudasim_switch_context, @function
cudasim_switch_context:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size cudasim_switch_context, .-cudasim_switch_context
)");
#endif

// ---------------------------------------------------------------------------
// Kernel entries (filled by the generated table, read by hostbuild.py).

enum ParamKind : int { kPointer = 0, kInt = 1, kUint = 2, kFloat = 3, kBool = 4 };

struct ParamDesc {
    int kind;
    unsigned size, align, offset;
    const char* ctype;
};

struct EntryDesc {
    const char* name;
    int nparams;
    const ParamDesc* params;
    unsigned argbuf_size;
    long long max_threads;
    void (*invoke)(const unsigned char* args);
};

// ---------------------------------------------------------------------------
// Launch state.

enum Schedule : int { kInOrder = 0, kReversed = 1, kInterleaved = 2 };

struct LaunchState {
    const EntryDesc* entry = nullptr;
    const unsigned char* args = nullptr;
    unsigned nthreads = 0;
    std::vector<Fiber> fibers;
    std::vector<unsigned> order;  // order[k]: the fiber of rank k
    std::vector<unsigned> rank;   // rank[i]: the rank of fiber i
    unsigned cursor = 0;          // no runnable fiber has a rank below this
    unsigned wake_rank = ~0u;     // lowest rank woken while a fiber ran
    unsigned live = 0, exited = 0;
    std::array<unsigned, 32> warp_arrived{};  // lanes waiting at a collective, per warp
    bool faulted = false;
    std::unordered_map<std::uintptr_t, unsigned long long> store_owner;  // byte -> writer (record_store)
    char msg[2048];
#ifdef CUDASIM_USE_UCONTEXT
    ucontext_t sched_uc;
#else
    void* sched_sp = nullptr;
#endif
    sigjmp_buf jmp;
    volatile bool jmp_armed = false;
    pthread_t thread;
};

inline LaunchState g_launch;
inline std::mutex g_launch_mutex;

// "kernel K, block (x,y,z), thread (x,y,z): " (thread omitted outside a fiber).
inline int fault_prefix(char* out, std::size_t n) {
    const LaunchState& L = g_launch;
    if (g_cur != nullptr) {
        return std::snprintf(out, n, "%s, block (%u,%u,%u), thread (%u,%u,%u): ", L.entry ? L.entry->name : "?",
                             g_block_idx.x, g_block_idx.y, g_block_idx.z, g_cur->tid.x, g_cur->tid.y, g_cur->tid.z);
    }
    return std::snprintf(out, n, "%s, block (%u,%u,%u): ", L.entry ? L.entry->name : "?", g_block_idx.x,
                         g_block_idx.y, g_block_idx.z);
}

inline void record_fault_v(const char* fmt, va_list ap) {
    LaunchState& L = g_launch;
    if (L.faulted) return;  // the first fault is the one reported
    int k = fault_prefix(L.msg, sizeof(L.msg));
    if (k < 0) k = 0;
    if (static_cast<std::size_t>(k) < sizeof(L.msg)) std::vsnprintf(L.msg + k, sizeof(L.msg) - k, fmt, ap);
    L.faulted = true;
}

inline void record_fault(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
inline void record_fault(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    record_fault_v(fmt, ap);
    va_end(ap);
}

// GPUQ_RECORD_STORE: remember which thread of the launch wrote each byte; a byte
// written by two threads is a fault naming both (the result would depend on the order).
inline void record_store(const void* p, std::size_t nbytes) {
    if (g_cur == nullptr) return;
    LaunchState& L = g_launch;
    const unsigned long long block = (static_cast<unsigned long long>(g_block_idx.z) * g_grid_dim.y + g_block_idx.y) *
                                         g_grid_dim.x + g_block_idx.x;
    const unsigned long long me =
        block * 1024ull + (g_cur->tid.z * g_block_dim.y + g_cur->tid.y) * g_block_dim.x + g_cur->tid.x;
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    for (std::size_t k = 0; k < nbytes; ++k) {
        auto [it, fresh] = L.store_owner.emplace(a + k, me);
        if (!fresh && it->second != me) {
            fault("byte %p written by two threads of one launch (global thread %llu, then %llu)",
                  reinterpret_cast<void*>(a + k), it->second, me);
        }
    }
}

// From a fiber: back to the scheduler. Returns when the scheduler resumes it.
inline void yield_to_scheduler() {
    Fiber* f = g_cur;
#ifdef CUDASIM_USE_UCONTEXT
    swapcontext(&f->stack->uc, &g_launch.sched_uc);
#else
    cudasim_switch_context(&f->sp, g_launch.sched_sp);
#endif
}

[[noreturn]] inline void fault(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (g_cur == nullptr) {  // kernel code called outside a launch: nothing to abandon
        std::fprintf(stderr, "cudasim: fault outside a CUDA thread: ");
        std::vfprintf(stderr, fmt, ap);
        std::fprintf(stderr, "\n");
        std::abort();
    }
    record_fault_v(fmt, ap);
    va_end(ap);
    yield_to_scheduler();  // the scheduler abandons the launch and never resumes this fiber
    __builtin_unreachable();
}

// ---------------------------------------------------------------------------
// Barriers.

inline const char* barrier_name(int kind) {
    switch (kind) {
        case kBarCount: return "__syncthreads_count";
        case kBarAnd: return "__syncthreads_and";
        case kBarOr: return "__syncthreads_or";
        default: return "__syncthreads";
    }
}

inline int barrier(const char* file, int line, int kind, int pred) {
    Fiber* f = g_cur;
    if (f == nullptr) fault("%s outside a CUDA thread", barrier_name(kind));
    f->bar_file = file;
    f->bar_line = line;
    f->bar_kind = kind;
    f->bar_pred = pred;
    f->state = kBarrier;
    yield_to_scheduler();
    return f->bar_result;
}

// ---------------------------------------------------------------------------
// Warp collectives.

inline const char* warp_kind_name(int kind) {
    switch (kind) {
        case kShflUp: return "__shfl_up_sync";
        case kShflDown: return "__shfl_down_sync";
        case kShflBfly: return "__shfl_xor_sync";
        case kShflIdx: return "__shfl_sync";
        case kSyncWarp: return "__syncwarp";
        case kBallot: return "__ballot_sync";
        case kAll: return "__all_sync";
        default: return "__any_sync";
    }
}

// All lanes of f's mask have arrived at the same collective: exchange.
inline void perform_collective(LaunchState& L, const Fiber* f) {
    const unsigned base = f->warp * 32, mask = f->wmask;
    if (f->wkind <= kShflIdx) {
        // PTX shfl.sync with CUDA's c operand: segmask = 32 - width, clamp 0x1f (0 for up).
        const unsigned segmask = static_cast<unsigned>(32 - f->wwidth) & 0x1fu;
        const unsigned clamp = f->wkind == kShflUp ? 0u : 0x1fu;
        for (unsigned l = 0; l < 32; ++l) {
            if (!((mask >> l) & 1u)) continue;
            Fiber& g = L.fibers[base + l];
            const int b = static_cast<int>(g.warg & 0x1fu);
            const int lane = static_cast<int>(l);
            const int max_lane = static_cast<int>((l & segmask) | (clamp & ~segmask));
            const int min_lane = static_cast<int>(l & segmask);
            int j = lane;
            bool pval = false;
            switch (g.wkind) {
                case kShflUp: j = lane - b; pval = j >= max_lane; break;
                case kShflDown: j = lane + b; pval = j <= max_lane; break;
                case kShflBfly: j = lane ^ b; pval = j <= max_lane; break;
                default: j = min_lane | (b & ~static_cast<int>(segmask)); pval = j <= max_lane; break;
            }
            if (!pval) j = lane;
            if (!((mask >> j) & 1u)) {
                g_cur = &g;
                fault("%s(mask=0x%08x): lane %d reads lane %d, which is not in the mask", warp_kind_name(g.wkind),
                      mask, lane, j);
            }
            g.wout = L.fibers[base + static_cast<unsigned>(j)].win;
        }
        return;
    }
    unsigned ballot = 0;
    for (unsigned l = 0; l < 32; ++l)
        if (((mask >> l) & 1u) && L.fibers[base + l].warg) ballot |= 1u << l;
    unsigned long long result = 0;
    if (f->wkind == kBallot) result = ballot;
    else if (f->wkind == kAll) result = ballot == mask ? 1 : 0;
    else if (f->wkind == kAny) result = ballot != 0 ? 1 : 0;
    for (unsigned l = 0; l < 32; ++l)
        if ((mask >> l) & 1u) L.fibers[base + l].wout = result;
}

inline void try_complete(LaunchState& L, Fiber* f) {
    const unsigned base = f->warp * 32, mask = f->wmask;
    for (unsigned l = 0; l < 32; ++l) {
        if (!((mask >> l) & 1u)) continue;
        if (base + l >= L.nthreads) {
            fault("%s(mask=0x%08x): lane %u of warp %u does not exist (the block has %u threads)", f->wname, mask, l,
                  f->warp, L.nthreads);
        }
        const Fiber& g = L.fibers[base + l];
        if (g.state == kDone) fault("%s(mask=0x%08x): lane %u has exited", f->wname, mask, l);
        if (g.state != kWarp) return;  // still on its way (or stuck elsewhere: the stall check reports it)
        if (g.wkind != f->wkind || g.wmask != mask || g.wwidth != f->wwidth || g.wsize != f->wsize) {
            fault("%s(mask=0x%08x, width %d) meets lane %u at %s(mask=0x%08x, width %d)", f->wname, mask, f->wwidth,
                  l, g.wname, g.wmask, g.wwidth);
        }
    }
    perform_collective(L, f);
    L.warp_arrived[f->warp] -= static_cast<unsigned>(__builtin_popcount(mask));
    for (unsigned l = 0; l < 32; ++l) {
        if (!((mask >> l) & 1u)) continue;
        L.fibers[base + l].state = kRunnable;
        L.wake_rank = std::min(L.wake_rank, L.rank[base + l]);
    }
}

inline unsigned long long warp_collective(int kind, unsigned mask, int width, unsigned size, unsigned long long value,
                                          unsigned arg, const char* name) {
    Fiber* f = g_cur;
    if (f == nullptr) fault("%s outside a CUDA thread", name);
    if (!((mask >> f->lane) & 1u)) fault("%s(mask=0x%08x) called by lane %u, which is not in the mask", name, mask, f->lane);
    if (width < 1 || width > 32 || (width & (width - 1)) != 0) {
        fault("%s: width %d is not a power of two in [1, 32]", name, width);
    }
    LaunchState& L = g_launch;
    f->wkind = kind;
    f->wmask = mask;
    f->wwidth = width;
    f->wsize = size;
    f->win = value;
    f->warg = arg;
    f->wname = name;
    f->state = kWarp;
    if (++L.warp_arrived[f->warp] >= static_cast<unsigned>(__builtin_popcount(mask))) try_complete(L, f);
    // Yield even when this lane completed the collective: the lanes resume in schedule order.
    yield_to_scheduler();
    return f->wout;
}

// ---------------------------------------------------------------------------
// Fibers.

[[noreturn]] inline void fiber_main() {
    g_launch.entry->invoke(g_launch.args);
    g_cur->state = kDone;
    yield_to_scheduler();
    __builtin_unreachable();
}

#ifdef CUDASIM_USE_UCONTEXT
inline void fiber_main_uc() { fiber_main(); }
#endif

inline bool start_fiber(LaunchState& L, Fiber* f) {
    f->stack = acquire_stack();
    if (f->stack == nullptr) {
        record_fault("cannot allocate a %zu-byte fiber stack", kStackBytes);
        return false;
    }
#ifdef CUDASIM_USE_UCONTEXT
    Stack* s = f->stack;
    getcontext(&s->uc);
    s->uc.uc_stack.ss_sp = s->lo;
    s->uc.uc_stack.ss_size = kStackBytes;
    s->uc.uc_link = nullptr;
    makecontext(&s->uc, fiber_main_uc, 0);
#else
    // Initial frame for cudasim_switch_context: six callee-saved registers, then
    // fiber_main as the return address, then a null "return address" of
    // fiber_main, which therefore starts with rsp + 8 16-byte aligned as the ABI wants.
    void** top = reinterpret_cast<void**>(f->stack->hi);
    *--top = nullptr;
    *--top = reinterpret_cast<void*>(&fiber_main);
    for (int i = 0; i < 6; ++i) *--top = nullptr;
    f->sp = top;
#endif
    f->started = true;
    (void)L;
    return true;
}

inline void switch_to_fiber(LaunchState& L, Fiber* f) {
    g_cur = f;
#ifdef CUDASIM_USE_UCONTEXT
    swapcontext(&L.sched_uc, &f->stack->uc);
#else
    cudasim_switch_context(&L.sched_sp, f->sp);
#endif
    g_cur = nullptr;
}

// Give every stack back (after a block, or when a launch is abandoned).
inline void release_block(LaunchState& L) {
    for (Fiber& f : L.fibers) {
        if (f.stack != nullptr) {
            release_stack(f.stack);
            f.stack = nullptr;
        }
    }
}

// Nothing runnable but some fibers live: release a complete barrier, or fault.
inline bool resolve_stall(LaunchState& L) {
    Fiber* first_warp = nullptr;
    Fiber* first_bar = nullptr;
    unsigned at_bar = 0;
    for (Fiber& f : L.fibers) {
        if (f.state == kWarp && first_warp == nullptr) first_warp = &f;
        if (f.state == kBarrier) {
            if (first_bar == nullptr) first_bar = &f;
            ++at_bar;
        }
    }
    if (first_warp == nullptr && L.exited == 0 && at_bar == L.live) {
        int count = 0;
        for (const Fiber& f : L.fibers) {
            if (f.bar_line != first_bar->bar_line || f.bar_kind != first_bar->bar_kind ||
                std::strcmp(f.bar_file, first_bar->bar_file) != 0) {
                record_fault("threads wait at different barriers: thread (%u,%u,%u) at %s (%s:%d), thread (%u,%u,%u) "
                             "at %s (%s:%d)",
                             first_bar->tid.x, first_bar->tid.y, first_bar->tid.z, barrier_name(first_bar->bar_kind),
                             first_bar->bar_file, first_bar->bar_line, f.tid.x, f.tid.y, f.tid.z,
                             barrier_name(f.bar_kind), f.bar_file, f.bar_line);
                return false;
            }
            count += f.bar_pred;
        }
        const int n = static_cast<int>(L.nthreads);
        const int result = first_bar->bar_kind == kBarCount ? count
                           : first_bar->bar_kind == kBarAnd ? (count == n ? 1 : 0)
                           : first_bar->bar_kind == kBarOr  ? (count != 0 ? 1 : 0)
                                                            : 0;
        for (Fiber& f : L.fibers) {
            f.bar_result = result;
            f.state = kRunnable;
        }
        L.cursor = 0;
        return true;
    }
    if (first_warp != nullptr) {
        const Fiber* f = first_warp;
        const unsigned base = f->warp * 32;
        for (unsigned l = 0; l < 32; ++l) {
            if (!((f->wmask >> l) & 1u)) continue;
            if (base + l >= L.nthreads) {
                record_fault("%s(mask=0x%08x) in warp %u: lane %u does not exist (the block has %u threads)", f->wname,
                             f->wmask, f->warp, l, L.nthreads);
                return false;
            }
            const Fiber& g = L.fibers[base + l];
            if (g.state == kDone) {
                record_fault("%s(mask=0x%08x) in warp %u never completes: lane %u exited without reaching it",
                             f->wname, f->wmask, f->warp, l);
                return false;
            }
            if (g.state == kBarrier) {
                record_fault("%s(mask=0x%08x) in warp %u never completes: lane %u waits at %s (%s:%d)", f->wname,
                             f->wmask, f->warp, l, barrier_name(g.bar_kind), g.bar_file, g.bar_line);
                return false;
            }
            if (g.state == kWarp && (g.wkind != f->wkind || g.wmask != f->wmask || g.wwidth != f->wwidth)) {
                record_fault("%s(mask=0x%08x) in warp %u never completes: lane %u waits at %s(mask=0x%08x)", f->wname,
                             f->wmask, f->warp, l, g.wname, g.wmask);
                return false;
            }
        }
        record_fault("%s(mask=0x%08x) in warp %u never completes (deadlock)", f->wname, f->wmask, f->warp);
        return false;
    }
    record_fault("%s (%s:%d) reached by %u of %u threads; %u exited without reaching it (a barrier must be reached "
                 "by the whole block)",
                 barrier_name(first_bar->bar_kind), first_bar->bar_file, first_bar->bar_line, at_bar, L.nthreads,
                 L.exited);
    return false;
}

// Run the current block (g_block_idx) to completion. False on a fault.
inline bool run_block(LaunchState& L) {
    const unsigned n = L.nthreads;
    const unsigned bx = g_block_dim.x, by = g_block_dim.y;
    for (unsigned i = 0; i < n; ++i) {
        Fiber& f = L.fibers[i];
        f.tid = ::uint3{i % bx, (i / bx) % by, i / (bx * by)};
        f.linear = i;
        f.lane = i & 31u;
        f.warp = i >> 5;
        f.state = kRunnable;
        f.started = false;
        f.stack = nullptr;
    }
    L.warp_arrived.fill(0);
    L.cursor = 0;
    L.wake_rank = ~0u;
    L.live = n;
    L.exited = 0;
    for (;;) {
        while (L.cursor < n && L.fibers[L.order[L.cursor]].state != kRunnable) ++L.cursor;
        if (L.cursor < n) {
            Fiber* f = &L.fibers[L.order[L.cursor]];
            if (!f->started && !start_fiber(L, f)) return false;
            switch_to_fiber(L, f);
            if (L.faulted) return false;
            if (f->state == kDone) {
                release_stack(f->stack);
                f->stack = nullptr;
                --L.live;
                ++L.exited;
            }
            if (L.wake_rank < L.cursor) L.cursor = L.wake_rank;
            L.wake_rank = ~0u;
            continue;
        }
        if (L.live == 0) return true;
        if (!resolve_stall(L)) return false;
    }
}

// The schedule's order of n fibers.
inline void make_order(LaunchState& L, unsigned n, int schedule) {
    L.order.resize(n);
    L.rank.resize(n);
    for (unsigned k = 0; k < n; ++k) L.order[k] = schedule == kReversed ? n - 1 - k : k;
    if (schedule == kInterleaved) {
        // Fisher-Yates with a fixed splitmix64 stream: deterministic, not monotonic, warps interleaved.
        unsigned long long state = 0x9e3779b97f4a7c15ull ^ n;
        for (unsigned k = n; k > 1; --k) {
            unsigned long long z = (state += 0x9e3779b97f4a7c15ull);
            z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
            z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
            z ^= z >> 31;
            std::swap(L.order[k - 1], L.order[z % k]);
        }
    }
    for (unsigned k = 0; k < n; ++k) L.rank[L.order[k]] = k;
}

inline unsigned long long gcd_u64(unsigned long long a, unsigned long long b) {
    while (b) {
        const unsigned long long t = a % b;
        a = b;
        b = t;
    }
    return a;
}

// ---------------------------------------------------------------------------
// Signals during a launch.

constexpr int kSignals[4] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL};
inline struct sigaction g_old_actions[4];
inline stack_t g_old_altstack;
inline void* g_altstack = nullptr;
constexpr std::size_t kAltStackBytes = 64 * 1024;

inline void restore_signal(int sig) {
    for (int i = 0; i < 4; ++i)
        if (kSignals[i] == sig) sigaction(sig, &g_old_actions[i], nullptr);
}

inline void on_signal(int sig, siginfo_t* info, void*) {
    LaunchState& L = g_launch;
    if (!L.jmp_armed || !pthread_equal(pthread_self(), L.thread) || g_cur == nullptr) {
        // Not a kernel's fault: the previous disposition handles the re-executed instruction.
        restore_signal(sig);
        return;
    }
    const Stack* s = g_cur->stack;
    const auto addr = reinterpret_cast<unsigned char*>(info->si_addr);
    if (sig == SIGSEGV && s != nullptr && addr >= s->base && addr < s->lo) {
        record_fault("fiber stack overflow (%zu bytes per CUDA thread)", kStackBytes);
    } else if (sig == SIGSEGV) {
        record_fault("illegal memory access at address %p (SIGSEGV)", info->si_addr);
    } else if (sig == SIGBUS) {
        record_fault("bus error at address %p (SIGBUS)", info->si_addr);
    } else if (sig == SIGFPE) {
        record_fault("%s (SIGFPE)", info->si_code == FPE_INTDIV   ? "integer division by zero"
                                    : info->si_code == FPE_INTOVF ? "integer division overflow"
                                                                  : "arithmetic exception");
    } else {
        record_fault("illegal instruction (SIGILL)");
    }
    siglongjmp(L.jmp, 1);
}

struct SignalGuard {
    SignalGuard() {
        if (g_altstack == nullptr) g_altstack = std::malloc(kAltStackBytes);
        stack_t ss{};
        ss.ss_sp = g_altstack;
        ss.ss_size = kAltStackBytes;
        ss.ss_flags = 0;
        sigaltstack(&ss, &g_old_altstack);
        struct sigaction sa {};
        sa.sa_sigaction = on_signal;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
        sigemptyset(&sa.sa_mask);
        for (int i = 0; i < 4; ++i) sigaction(kSignals[i], &sa, &g_old_actions[i]);
    }
    ~SignalGuard() {
        for (int i = 0; i < 4; ++i) sigaction(kSignals[i], &g_old_actions[i], nullptr);
        sigaltstack(&g_old_altstack, nullptr);
    }
};

// ---------------------------------------------------------------------------
// Launch.

inline int launch(const EntryDesc* entry, const unsigned* grid, const unsigned* block, const unsigned char* args,
                  unsigned long long args_len, unsigned long long shared_mem, int schedule, char* err,
                  unsigned long long errlen) {
    auto config_error = [&](const char* what) {
        std::snprintf(err, errlen, "%s: invalid launch: %s", entry->name, what);
        return 2;
    };
    const unsigned long long threads =
        static_cast<unsigned long long>(block[0]) * block[1] * block[2];
    if (args_len != entry->argbuf_size) return config_error("argument buffer size differs from the parameters'");
    if (block[0] < 1 || block[1] < 1 || block[2] < 1 || block[0] > 1024 || block[1] > 1024 || block[2] > 64)
        return config_error("block dimensions out of range");
    if (threads > 1024 || static_cast<long long>(threads) > entry->max_threads)
        return config_error("too many threads per block");
    if (grid[0] < 1 || grid[1] < 1 || grid[2] < 1 || grid[0] > 2147483647u || grid[1] > 65535u || grid[2] > 65535u)
        return config_error("grid dimensions out of range");
    if (shared_mem > sizeof(g_dynamic_smem)) return config_error("dynamic shared memory above 227 KiB");
    if (schedule < kInOrder || schedule > kInterleaved) return config_error("unknown schedule");

    std::lock_guard<std::mutex> lock(g_launch_mutex);
    LaunchState& L = g_launch;
    // The parameters in 16-byte aligned storage that outlives every fiber.
    std::vector<unsigned char> argstore(args_len + 16);
    auto* aligned = reinterpret_cast<unsigned char*>(
        (reinterpret_cast<std::uintptr_t>(argstore.data()) + 15) & ~static_cast<std::uintptr_t>(15));
    if (args_len) std::memcpy(aligned, args, args_len);
    L.entry = entry;
    L.args = aligned;
    L.nthreads = static_cast<unsigned>(threads);
    L.fibers.assign(L.nthreads, Fiber{});
    L.faulted = false;
    L.store_owner.clear();
    L.msg[0] = 0;
    L.thread = pthread_self();
    make_order(L, L.nthreads, schedule);
    g_block_dim = ::dim3(block[0], block[1], block[2]);
    g_grid_dim = ::dim3(grid[0], grid[1], grid[2]);

    const unsigned long long total = static_cast<unsigned long long>(grid[0]) * grid[1] * grid[2];
    unsigned long long step = 1;
    if (schedule == kInterleaved && total > 2) {
        step = static_cast<unsigned long long>(static_cast<double>(total) * 0.6180339887) | 1ull;
        while (gcd_u64(step, total) != 1) ++step;
    }
    bool ok = true;
    {
        FpEnvGuard fpenv;
        SignalGuard signals;
        if (sigsetjmp(L.jmp, 1) == 0) {
            L.jmp_armed = true;
            for (unsigned long long k = 0; k < total; ++k) {
                unsigned long long b = k;
                if (schedule == kReversed) b = total - 1 - k;
                if (schedule == kInterleaved) b = static_cast<unsigned long long>((static_cast<unsigned __int128>(k) * step) % total);
                g_block_idx = ::uint3{static_cast<unsigned>(b % grid[0]), static_cast<unsigned>((b / grid[0]) % grid[1]),
                                      static_cast<unsigned>(b / (static_cast<unsigned long long>(grid[0]) * grid[1]))};
                // Dynamic shared memory starts undefined on a GPU: poison it per block.
                if (shared_mem) std::memset(g_dynamic_smem, 0xa5, shared_mem);
                const bool block_ok = run_block(L);
                release_block(L);
                if (!block_ok) {
                    ok = false;
                    break;
                }
            }
        } else {  // a signal in a fiber (on_signal recorded it)
            release_block(L);
            ok = false;
        }
        L.jmp_armed = false;
    }
    g_cur = nullptr;
    L.fibers.clear();
    L.entry = nullptr;
    if (!ok) {
        std::snprintf(err, errlen, "%s", L.msg);
        return 1;
    }
    return 0;
}

// ---------------------------------------------------------------------------
// Parameter introspection of a kernel's function pointer type.

template <class>
constexpr bool kAlwaysFalse = false;

template <class T>
const char* pretty_type() {
    return __PRETTY_FUNCTION__;  // "... [with T = NAME]" (g++)
}

template <class T>
std::string type_name() {
    if constexpr (std::is_const_v<T>) {
        using U = std::remove_const_t<T>;
        if constexpr (std::is_pointer_v<U>) return type_name<U>() + " const";
        else return "const " + type_name<U>();
    } else if constexpr (std::is_volatile_v<T>) {
        using U = std::remove_volatile_t<T>;
        if constexpr (std::is_pointer_v<U>) return type_name<U>() + " volatile";
        else return "volatile " + type_name<U>();
    } else if constexpr (std::is_pointer_v<T>) {
        return type_name<std::remove_pointer_t<T>>() + "*";
    } else if constexpr (std::is_same_v<T, void>) return "void";
    else if constexpr (std::is_same_v<T, bool>) return "bool";
    else if constexpr (std::is_same_v<T, char>) return "char";
    else if constexpr (std::is_same_v<T, signed char>) return "signed char";
    else if constexpr (std::is_same_v<T, unsigned char>) return "unsigned char";
    else if constexpr (std::is_same_v<T, short>) return "short";
    else if constexpr (std::is_same_v<T, unsigned short>) return "unsigned short";
    else if constexpr (std::is_same_v<T, int>) return "int";
    else if constexpr (std::is_same_v<T, unsigned int>) return "unsigned int";
    else if constexpr (std::is_same_v<T, long>) return "long";
    else if constexpr (std::is_same_v<T, unsigned long>) return "unsigned long";
    else if constexpr (std::is_same_v<T, long long>) return "long long";
    else if constexpr (std::is_same_v<T, unsigned long long>) return "unsigned long long";
    else if constexpr (std::is_same_v<T, float>) return "float";
    else if constexpr (std::is_same_v<T, double>) return "double";
    else if constexpr (std::is_class_v<T> || std::is_enum_v<T> || std::is_union_v<T>) {
        const std::string p = pretty_type<T>();
        const std::size_t at = p.find("T = ");
        std::size_t end = p.find_first_of(";]", at);
        return at == std::string::npos ? p : p.substr(at + 4, end - at - 4);
    } else {
        static_assert(kAlwaysFalse<T>, "cudasim: unsupported type in a kernel parameter");
        return "";
    }
}

template <class T>
constexpr int param_kind() {
    if constexpr (std::is_pointer_v<T>) return kPointer;
    else if constexpr (std::is_same_v<T, bool>) return kBool;
    else if constexpr (std::is_floating_point_v<T>) return kFloat;
    else if constexpr (std::is_integral_v<T> && std::is_signed_v<T>) return kInt;
    else if constexpr (std::is_integral_v<T>) return kUint;
    else {
        static_assert(kAlwaysFalse<T>, "cudasim: kernel parameters must be pointers or arithmetic values");
        return -1;
    }
}

template <class Sig>
struct Signature {
    static_assert(kAlwaysFalse<Sig>, "cudasim: a name expression must name a function returning void (a __global__ kernel)");
};
template <class... A>
struct Signature<void (*)(A...)> {
    using Args = std::tuple<A...>;
    static constexpr std::size_t n = sizeof...(A);
};
template <class... A>
struct Signature<void (*)(A...) noexcept> : Signature<void (*)(A...)> {};

template <class T>
inline T load_param(const unsigned char* p) {
    T t;
    std::memcpy(&t, p, sizeof(T));
    return t;
}

template <auto F>
struct Kernel {
    using S = Signature<decltype(F)>;
    static constexpr std::size_t n = S::n;
    using Args = typename S::Args;

    template <std::size_t... I>
    static constexpr std::array<unsigned, n + 1> layout(std::index_sequence<I...>) {
        std::array<unsigned, n + 1> off{};
        const unsigned sizes[] = {static_cast<unsigned>(sizeof(std::tuple_element_t<I, Args>))..., 0u};
        const unsigned aligns[] = {static_cast<unsigned>(alignof(std::tuple_element_t<I, Args>))..., 1u};
        unsigned at = 0;
        for (std::size_t i = 0; i < n; ++i) {
            at = (at + aligns[i] - 1) / aligns[i] * aligns[i];
            off[i] = at;
            at += sizes[i];
        }
        off[n] = (at + 7u) / 8u * 8u;  // total, rounded to 8
        return off;
    }
    static constexpr std::array<unsigned, n + 1> kLayout = layout(std::make_index_sequence<n>{});

    template <std::size_t... I>
    static void call(const unsigned char* buf, std::index_sequence<I...>) {
        F(load_param<std::tuple_element_t<I, Args>>(buf + kLayout[I])...);
    }
    static void invoke(const unsigned char* buf) { call(buf, std::make_index_sequence<n>{}); }

    template <std::size_t... I>
    static void describe(EntryDesc* e, std::index_sequence<I...>) {
        static const std::array<std::string, n> names{type_name<std::tuple_element_t<I, Args>>()...};
        static const std::array<ParamDesc, n> params{
            ParamDesc{param_kind<std::tuple_element_t<I, Args>>(),
                      static_cast<unsigned>(sizeof(std::tuple_element_t<I, Args>)),
                      static_cast<unsigned>(alignof(std::tuple_element_t<I, Args>)), kLayout[I], names[I].c_str()}...};
        e->nparams = static_cast<int>(n);
        e->params = params.data();
        e->argbuf_size = kLayout[n];
        e->invoke = &invoke;
    }
    static void fill(EntryDesc* e) { describe(e, std::make_index_sequence<n>{}); }
};

struct EntryMaker {
    const char* name;
    void (*fill)(EntryDesc*);
    long long max_threads;
};

}  // namespace cudasim

// The exported C interface of a module, over the generated table.
#define CUDASIM_DEFINE_EXPORTS(TABLE)                                                                              \
    namespace cudasim {                                                                                            \
    inline std::vector<EntryDesc>& entries() {                                                                     \
        static std::vector<EntryDesc> all = [] {                                                                   \
            std::vector<EntryDesc> v;                                                                              \
            for (const EntryMaker& m : TABLE) {                                                                    \
                EntryDesc e{};                                                                                     \
                e.name = m.name;                                                                                   \
                e.max_threads = m.max_threads;                                                                     \
                m.fill(&e);                                                                                        \
                v.push_back(e);                                                                                    \
            }                                                                                                      \
            return v;                                                                                              \
        }();                                                                                                       \
        return all;                                                                                                \
    }                                                                                                              \
    }                                                                                                              \
    CUDASIM_EXPORT int cudasim_abi_version() { return 1; }                                                        \
    CUDASIM_EXPORT int cudasim_entry_count() { return static_cast<int>(::cudasim::entries().size()); }           \
    CUDASIM_EXPORT const ::cudasim::EntryDesc* cudasim_entry(int i) { return &::cudasim::entries().at(i); }      \
    CUDASIM_EXPORT int cudasim_launch(int i, const unsigned* grid, const unsigned* block, const unsigned char* args, \
                                      unsigned long long args_len, unsigned long long shared_mem, int schedule,   \
                                      char* err, unsigned long long errlen) {                                      \
        auto& all = ::cudasim::entries();                                                                          \
        if (i < 0 || static_cast<std::size_t>(i) >= all.size()) {                                                  \
            std::snprintf(err, errlen, "no kernel entry %d", i);                                                   \
            return 2;                                                                                              \
        }                                                                                                          \
        return ::cudasim::launch(&all[i], grid, block, args, args_len, shared_mem, schedule, err, errlen);        \
    }                                                                                                              \
    CUDASIM_EXPORT unsigned long long cudasim_stack_bytes() { return ::cudasim::kStackBytes; }                     \
    CUDASIM_EXPORT unsigned long long cudasim_stack_high_water() { return ::cudasim::stack_high_water(); }         \
    CUDASIM_EXPORT unsigned cudasim_get_mxcsr() { return CUDASIM_READ_MXCSR(); }                                    \
    CUDASIM_EXPORT void cudasim_set_mxcsr(unsigned v) { CUDASIM_WRITE_MXCSR(v); }

#if defined(__x86_64__)
#define CUDASIM_READ_MXCSR() _mm_getcsr()
#define CUDASIM_WRITE_MXCSR(v) _mm_setcsr(v)
#else
#define CUDASIM_READ_MXCSR() 0u
#define CUDASIM_WRITE_MXCSR(v) static_cast<void>(v)
#endif
