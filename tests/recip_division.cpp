// The exact float32 division from a reciprocal computed once per scale (issue 38, point 2),
// checked against IEEE division. Built by tests/test_recip_division.py with
// -ffp-contract=off -fno-fast-math -fno-tree-vectorize: every operation below rounds on its own,
// as PTX's mul.rn / fma.rn do (a contracted or vectorised rewrite lost -0's sign once).
//
//   y  = RN(1/s), ns = -s            once per scale
//   q0 = RN(x*y)
//   e  = fma(ns, q, x)               the residual x - s*q, exact (Markstein) where q is faithful
//   q  = fma(e, y, q)                from q = q0: once (the one-step form), twice (the two-step
//                                    form, which Markstein's theorem covers)
//   q  = NaN ? q0 : q, then the sign of x (s > 0: so -0 stays -0)
// This is kernels/contract.cuh's Divisor<float> operation for operation.
//
// A result "differs" when its bits differ from RN(x/s). Allowed, because no code can tell:
//   tiny: |x/s| < 2^-24 and |q| < 2^-24: every int8, int4 and fp8 code of both is a (signed)
//         zero (e5m2's smallest subnormal is 2^-16). Found here: x subnormal (the residual is
//         inexact) and quotients near 2^-126.
//   huge: x*y or the quotient overflows and both |q|, |x/s| >= 2^100 (every code saturates, a
//         non-saturating fp8 cast gives NaN/Inf for both).
// Anything else is "bad". The int8 code (NaN -> 0, rint half-even, saturate) is compared too.
//
//   recip_division pairs N SEED   N random (x, s): s in [2^-64, 2^64], x any bit pattern
//   recip_division all SBITS [STRIDE]  every STRIDE-th float32 x (default 1: all 2^32) at the
//                                      scale with bits SBITS (hex)
// Output, one line: checked N one_bad B1 two_bad B2 int8_one C1 int8_two C2 tiny T huge H
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

static float f_of(uint32_t b) { float f; std::memcpy(&f, &b, 4); return f; }
static uint32_t b_of(float f) { uint32_t b; std::memcpy(&b, &f, 4); return b; }

// contract.cuh's Divisor<float>::operator() for 2^-64 <= s <= 2^64, with `steps` corrections.
static float recip_div(float x, float s, float y, int steps) {
    const float ns = -s;
    const float q0 = x * y;
    float q = q0;
    for (int k = 0; k < steps; ++k) q = fmaf(fmaf(ns, q, x), y, q);
    if (std::isnan(q)) q = q0;  // x = +/-Inf, or x*y overflowed: q0 carries the answer
    return std::copysign(q, x);
}

struct Quotients { float one, two; };

static Quotients recip_div(float x, float s, float y) { return {recip_div(x, s, y, 1), recip_div(x, s, y, 2)}; }

static int int8_code(float v) {
    if (std::isnan(v)) return 0;
    const float r = std::nearbyint(v);  // the default rounding mode: half to even
    return r < -128.0f ? -128 : (r > 127.0f ? 127 : static_cast<int>(r));
}

struct Tally { uint64_t n = 0, one_bad = 0, two_bad = 0, int8_one = 0, int8_two = 0, tiny = 0, huge = 0; };

// 0: same bits; 1: differs in an allowed way (tiny/huge counted); 2: bad.
static int classify(float q, float want, Tally& t) {
    if (b_of(q) == b_of(want) || (std::isnan(q) && std::isnan(want))) return 0;
    const float aq = std::fabs(q), aw = std::fabs(want);
    if (aw < 0x1p-24f && aq < 0x1p-24f) { ++t.tiny; return 1; }
    if (aw >= 0x1p100f && aq >= 0x1p100f) { ++t.huge; return 1; }
    return 2;
}

static void check(float x, float s, float y, Tally& t) {
    const float want = x / s;
    const Quotients q = recip_div(x, s, y);
    ++t.n;
    if (classify(q.one, want, t) == 2) {
        if (++t.one_bad <= 5)
            std::fprintf(stderr, "one-step: x=%a s=%a got %a want %a\n", x, s, q.one, want);
    }
    if (classify(q.two, want, t) == 2) {
        if (++t.two_bad <= 5)
            std::fprintf(stderr, "two-step: x=%a s=%a got %a want %a\n", x, s, q.two, want);
    }
    const int code = int8_code(want);
    t.int8_one += int8_code(q.one) != code;
    t.int8_two += int8_code(q.two) != code;
}

static uint64_t splitmix(uint64_t& state) {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

int main(int argc, char** argv) {
    Tally t;
    if (argc == 4 && std::strcmp(argv[1], "pairs") == 0) {
        const uint64_t n = std::strtoull(argv[2], nullptr, 10);
        uint64_t state = std::strtoull(argv[3], nullptr, 10);
        for (uint64_t i = 0; i < n;) {
            // A scale: exponent in [-64, 63], any significand; 64 x values per scale.
            const uint64_t r = splitmix(state);
            const uint32_t exp_field = 127u - 64u + static_cast<uint32_t>(r % 128u);
            const float s = f_of((exp_field << 23) | static_cast<uint32_t>((r >> 8) & 0x7fffffu));
            const float y = 1.0f / s;
            for (int k = 0; k < 64 && i < n; ++k, ++i) check(f_of(static_cast<uint32_t>(splitmix(state))), s, y, t);
        }
    } else if ((argc == 3 || argc == 4) && std::strcmp(argv[1], "all") == 0) {
        const float s = f_of(static_cast<uint32_t>(std::strtoul(argv[2], nullptr, 16)));
        const uint64_t stride = argc == 4 ? std::strtoull(argv[3], nullptr, 10) : 1;
        const float y = 1.0f / s;
        for (uint64_t b = 0; b < (uint64_t{1} << 32); b += stride) check(f_of(static_cast<uint32_t>(b)), s, y, t);
    } else {
        std::fprintf(stderr, "usage: recip_division pairs N SEED | all SBITS [STRIDE]\n");
        return 2;
    }
    std::printf("checked %" PRIu64 " one_bad %" PRIu64 " two_bad %" PRIu64 " int8_one %" PRIu64
                " int8_two %" PRIu64 " tiny %" PRIu64 " huge %" PRIu64 "\n",
                t.n, t.one_bad, t.two_bad, t.int8_one, t.int8_two, t.tiny, t.huge);
    return 0;
}
