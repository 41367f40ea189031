"""The CUDA kernels, checked without a GPU.

1. NVRTC (the ``nvidia-cuda-nvrtc`` wheel, driven by ctypes) compiles every
   instantiation the dispatcher can request, for PTX compute_80 and SASS
   sm_80 (sm_90 too for the kernels whose code branches on the architecture),
   with the contract's options: any error or warning fails.
2. The PTX is the same with ``-ftz=true`` (what CuPy appends) as with
   ``-ftz=false``: subnormal handling does not depend on the flag (the
   ``-ftz=true`` PTX is the one of the CuPy option list's sm_80 build).
3. The traversal (kernels/elementwise.cuh: units, vector head/tail, the
   scheme index maps) and the host-side lowering (Scheme.index_map) are run
   on the CPU with a C++ compiler, emulating a small grid, and every element's
   scale index is compared with NumPy's broadcasting of the same scheme.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import textwrap
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from gpuq._scheme import Scheme
from gpuq.backends.cuda import nvrtc_check, registry
from gpuq.backends.cuda.launch import device_map_params, fast_divisor

_LIB = nvrtc_check.find_libnvrtc()
needs_nvrtc = pytest.mark.skipif(
    _LIB is None, reason="libnvrtc not found: pip install nvidia-cuda-nvrtc (the 'test' extra)"
)


@pytest.fixture(scope="module")
def nvrtc():
    return nvrtc_check.Nvrtc(_LIB)


def _build(job):
    """One NVRTC job in a worker process (its own libnvrtc handle): ``("target", source,
    target)`` or ``("cupy", source, arch)``."""
    kind, source, arg = job
    nv = nvrtc_check.Nvrtc(nvrtc_check.find_libnvrtc())
    if kind == "target":
        return nvrtc_check.compile_source(nv, source, arg)
    if kind == "ftz90":
        base = nvrtc_check.compile_source(nv, source, "compute_90", names=_SM89_PATHS)
        return base, nvrtc_check.ftz_independent(nv, source, base, "compute_90", _SM89_PATHS)
    return nvrtc_check.compile_as_cupy(nv, source, arg, _cupy_names(source, arg))


#: The kernels whose text branches on the architecture (``#if __CUDA_ARCH__ >= 890`` in formats.cu,
#: pinned by tests/test_cuda_sweep.py test_only_formats_cu_branches_on_the_architecture): the
#: saturating fp8 casts and the e4m3 decode. compute_80 PTX never holds their sm_89+ path, so the
#: flush-to-zero check runs them again for compute_90 (they alone, with one packed int4 kernel,
#: which uses the file's packed-vector constant: NVRTC warns of an unused one; a whole
#: formats.cu build for compute_90 takes minutes here).
_SM89_PATHS = (registry.quantize_fp8_name("float32", "float8_e4m3fn", "tensor"),
               registry.quantize_fp8_name("float64", "float8_e5m2", "tensor"),
               registry.dequantize_fp8_name("float8_e4m3fn", "float32", "tensor"),
               registry.quantize_int4_name("float32", True, False, "tensor"))


def _start_builds():
    """Submit every NVRTC build of this module to worker processes; returns what waits for
    them (formats.cu alone takes ~30 s a build on a 2-vCPU machine; the builds are
    independent)."""
    import concurrent.futures
    import multiprocessing

    import _background

    # No -ftz=true build of its own for the whole sources: the flush-to-zero check compares the
    # compute_80 PTX with the PTX of CuPy's sm_80 build (-ftz=true last): one build in four less,
    # ~15% of the NVRTC CPU time (formats.cu's -ftz=true build alone took 149 s of one core here).
    # The sm_89+ paths (a few kernels) keep their own pair of compute_90 builds.
    jobs = [("target", s, t) for s in registry.SOURCES for t in _SUITE_TARGETS] + [("ftz90", "formats.cu", None)]
    jobs += [("cupy", s, a) for s, a in _CUPY_BUILDS]
    jobs.sort(key=lambda j: j[1] != "formats.cu")  # the longest first
    workers = max(1, min(len(os.sched_getaffinity(0)), 4))
    ctx = multiprocessing.get_context("spawn")  # no fork of a process that holds threads
    pool = concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx)
    futures = {job: pool.submit(_build, job) for job in jobs}
    pool.shutdown(wait=False)
    _background.on_exit(lambda: pool.shutdown(wait=False, cancel_futures=True))

    def results():
        out = {}
        for (kind, source, arg), future in futures.items():
            res = future.result()
            if kind == "ftz90":
                out["target", source, "compute_90"], out["ftz", source, "compute_90"] = res
            else:
                out[kind, source, arg] = res
        for source in registry.SOURCES:
            out["ftz", source, None] = nvrtc_check.ftz_independent_of(out["target", source, "compute_80"],
                                                                       out["cupy", source, "80"])
        return out

    return results


_pending_builds = None


def start_background(items):
    """Started at collection (tests/_background.py) where a test of this module needs them."""
    global _pending_builds
    if _LIB is not None and any("builds" in getattr(item, "fixturenames", ()) for item in items):
        _pending_builds = _start_builds()


@pytest.fixture(scope="module")
def builds():
    """Every NVRTC build of this module, made once (started at collection, else here)."""
    global _pending_builds
    pending, _pending_builds = _pending_builds or _start_builds(), None
    return pending()


@pytest.fixture(scope="module")
def compiled(builds):
    """(source, target) -> Result."""
    return lambda source, target: builds["target", source, target]


#: The PTX target with gpuq's own options; the machine code for sm_80 and sm_90 is built by
#: test_compiles_with_cupys_real_option_list with CuPy's option list (gpuq's options plus
#: CuPy's), which is what a GPU compiles, so the suite builds each SASS target once
#: (formats.cu alone takes ~30 s per build on a 2-vCPU machine). ``python -m
#: gpuq.backends.cuda.nvrtc_check`` still builds every target of nvrtc_check.TARGETS.
_SUITE_TARGETS = ("compute_80",)


@needs_nvrtc
@pytest.mark.parametrize("target", _SUITE_TARGETS)
@pytest.mark.parametrize("source", sorted(registry.SOURCES))
def test_every_instantiation_compiles_cleanly(compiled, source, target):
    res = compiled(source, target)
    assert res.ok, res.describe()
    assert sorted(res.lowered) == sorted(registry.SOURCES[source]())
    assert res.code


_CUPY_ARCHS = ("80", "90")

def _branches_on_the_architecture(text: str) -> bool:
    """Whether ``text`` names an architecture macro (``__CUDA_ARCH__``, ``__CUDA_ARCH_FEAT_SM90_ALL``,
    ``__CUDA_ARCH_SPECIFIC__``, ...): the only way a source's text can differ between targets."""
    return "__CUDA_ARCH" in text


#: (source, arch) of CuPy's builds: sm_80 for every source (also the -ftz=true partner of the
#: flush-to-zero check), sm_90 only for the sources whose text branches on the architecture. A
#: source without a branch is the same text for both, and its compute_80 PTX is what the driver
#: JITs for any later GPU, so an sm_90 build of it proves nothing new (quantize.cu, dequantize.cu
#: and qparams.cu: ~100 s of one core here); test_sources_built_for_sm80_alone_have_no_arch_branch
#: keeps the reason true.
_CUPY_BUILDS = [(s, a) for s in sorted(registry.SOURCES) for a in _CUPY_ARCHS
                if a == _CUPY_ARCHS[0] or _branches_on_the_architecture(registry.source_text(s))]


def _cupy_names(source, arch):
    """The name expressions of CuPy's build of ``source`` for ``arch``: every one for sm_80; for a
    later architecture, the kernels whose code can differ from sm_80's (``cudasim.source.
    arch_dependent``: they name, through any chain of declarations, one that branches on an
    architecture macro), for the same reason as above, kernel by kernel: formats.cu's sm_90 build
    holds its 80 fp8 kernels, not 360 (217 -> 69 s of one core here). The packed int4 kernel of
    _SM89_PATHS comes along where it belongs to the source: it reads the file's packed-vector
    constant, which NVRTC otherwise warns is unused (a warning fails the build)."""
    names = registry.SOURCES[source]()
    if arch == _CUPY_ARCHS[0]:
        return names
    from cudasim.source import arch_dependent

    branching = arch_dependent(registry.source_text(source))
    return [n for n in names if _template_name(n) in branching or n in _SM89_PATHS]


def _template_name(name):
    """``"gpuq::quantize_fp8<float, 0, float, 2>"`` -> ``"quantize_fp8"``."""
    return re.match(r"(?:\w+::)*(\w+)", name).group(1)


@needs_nvrtc
@pytest.mark.parametrize("source, arch", _CUPY_BUILDS)
def test_compiles_with_cupys_real_option_list(builds, source, arch):
    """CuPy 14 appends -ftz=true, -arch=sm_XX and --device-as-default-execution-space after
    gpuq's options: every kernel still compiles, with no warning but the known -ftz override."""
    res = builds["cupy", source, arch]
    assert res.options[-3:] == ("-ftz=true", f"-arch=sm_{arch}", "--device-as-default-execution-space")
    assert res.ok, res.describe()
    assert res.overridden, "NVRTC no longer reports the -ftz override: check CuPy's option list"
    assert sorted(res.lowered) == sorted(_cupy_names(source, arch)) and res.code


def test_sm90_builds_hold_the_kernels_that_branch_on_the_architecture():
    """formats.cu's sm_90 build holds its fp8 kernels (the saturating casts and the e4m3 decode
    of ``#if __CUDA_ARCH__ >= 890``) and the one int4 kernel, nothing else; the sources that
    include formats.cu keep every kernel that reaches an fp8 op; a new branch in another kernel's
    code brings that kernel in."""
    formats = _cupy_names("formats.cu", "90")
    fp8 = [n for n in registry.SOURCES["formats.cu"]() if _template_name(n) in ("quantize_fp8", "dequantize_fp8")]
    assert len(fp8) == 80 and sorted(formats) == sorted(fp8 + [_SM89_PATHS[-1]])
    assert len(_cupy_names("weight_pass.cu", "90")) >= 45 and len(_cupy_names("mse.cu", "90")) == 24
    from cudasim.source import arch_dependent

    text = registry.source_text("formats.cu")
    head = "struct QuantizeMiniOp"
    assert text.count(head) == 1 and "quantize_fp6" not in arch_dependent(text)
    branched = text.replace(head, "#if __CUDA_ARCH__ >= 1000\n#endif\n" + head)
    assert {"QuantizeMiniOp", "quantize_fp6", "quantize_fp4"} <= arch_dependent(branched)


def test_sources_built_for_sm80_alone_have_no_arch_branch():
    """A source is built by CuPy for every architecture of _CUPY_ARCHS unless its text (includes
    expanded: the kernels include no header NVRTC would expand per target) names no
    architecture macro; formats.cu's ``#if __CUDA_ARCH__ >= 890`` paths (and mse.cu's and
    weight_pass.cu's, which include it) keep their sm_90 build."""
    for source in registry.SOURCES:
        text = registry.source_text(source)
        archs = {a for s, a in _CUPY_BUILDS if s == source}
        assert _CUPY_ARCHS[0] in archs, source
        if archs != set(_CUPY_ARCHS):
            assert "__CUDA_ARCH" not in text and "#include" not in text, source
    assert {s for s, a in _CUPY_BUILDS if a == "90"} == {"formats.cu", "mse.cu", "weight_pass.cu"}
    for branch in ("#if __CUDA_ARCH__ >= 890", "#ifdef __CUDA_ARCH_FEAT_SM90_ALL", "#if defined(__CUDA_ARCH_SPECIFIC__)"):
        assert _branches_on_the_architecture("int x;\n" + branch + "\n#endif\n")
    assert not _branches_on_the_architecture("// no branch here: GPUQ_CUDA_ARCHIVE\n")


def test_only_the_ftz_override_is_tolerated():
    known = 'nvrtc: warning: "--ftz(-ftz)=false" followed by "--ftz(-ftz)=true"'
    assert nvrtc_check.FTZ_OVERRIDE.match(known)
    assert not nvrtc_check.FTZ_OVERRIDE.match('nvrtc: warning: "--fmad(-fmad)=false" followed by "--fmad(-fmad)=true"')
    assert not nvrtc_check.FTZ_OVERRIDE.match("quantize.cu(3): warning #177-D: variable was declared but never referenced")


@needs_nvrtc
@pytest.mark.parametrize("source", sorted(registry.SOURCES))
def test_ptx_does_not_depend_on_ftz(builds, source):
    res = builds["ftz", source, None]
    assert res.ok, res.describe()


@needs_nvrtc
def test_ptx_of_the_sm89_paths_does_not_depend_on_ftz(builds):
    """The hardware conversions' paths (sm_89+) give the same PTX with -ftz=true as without."""
    base, res = builds["target", "formats.cu", "compute_90"], builds["ftz", "formats.cu", "compute_90"]
    assert base.ok and res.ok, base.describe() + res.describe()
    ptx = base.code.decode()
    assert all(f in ptx for f in ("cvt.rn.satfinite.e4m3x2.f32", "cvt.rn.satfinite.e5m2x2.f32",
                                  "cvt.rn.f16x2.e4m3x2")), "the sm_89+ paths were not compiled"


@needs_nvrtc
def test_the_ftz_comparison_sees_a_flushing_instruction(builds):
    """The comparison of the two builds' PTX fails on one instruction that flushes, and on a
    global that only the CuPy build declares once an instruction reads it."""
    base, cupy = builds["target", "quantize.cu", "compute_80"], builds["cupy", "quantize.cu", "80"]
    assert nvrtc_check.ftz_independent_of(base, cupy).ok
    text = cupy.code.decode()
    op = next(ln for ln in text.splitlines() if re.match(r"\s*(add|sub|mul|div|max|min)(\.rn)?\.f32\s", ln))
    flushed = text.replace(op, op.replace(".f32", ".ftz.f32", 1), 1)
    assert not nvrtc_check.ftz_independent_of(base, replace(cupy, code=flushed.encode())).ok
    read = text.replace(op, op + "\n\tld.global.u8 %rs9, [gpuq_only_here];", 1)
    declared = ".global .align 1 .u8 gpuq_only_here;\n" + read
    assert not nvrtc_check.ftz_independent_of(base, replace(cupy, code=declared.encode())).ok


def test_compile_units_are_every_name_once():
    """The modules a warm-up (and the test session's prebuild) compiles hold every name
    expression of every source exactly once."""
    by_source = {}
    for source, names in registry.compile_units():
        by_source.setdefault(source, []).extend(names)
    assert by_source.keys() == registry.SOURCES.keys()
    for source, names in by_source.items():
        assert sorted(names) == sorted(registry.SOURCES[source]()) and len(set(names)) == len(names)


def test_registry_covers_every_dtype_combination():
    q = registry.quantize_names()
    d = registry.dequantize_names()
    # 4 float dtypes (float16, float32, float64, bfloat16) x 2 code dtypes x zp or not x maps.
    assert len(q) == len(set(q)) == 4 * 2 * 2 * len(registry.MAPS)
    assert len(d) == len(set(d)) == 2 * 4 * 2 * len(registry.MAPS)
    assert "gpuq::quantize<__half, unsigned char, float, false, 0>" in q
    assert "gpuq::dequantize<signed char, double, double, true, 3>" in d
    # bfloat16 computes in float32, by name: listed whether or not ml_dtypes is installed.
    assert "gpuq::quantize<gpuq_bf16, signed char, float, true, 1>" in q
    assert "gpuq::dequantize<unsigned char, gpuq_bf16, float, false, 4>" in d
    assert "gpuq::dynamic_quantize_segments<gpuq_bf16, unsigned char, true>" in registry.qparams_names()


def test_sources_expand_includes():
    text = registry.source_text("quantize.cu")
    assert "#include \"contract.cuh\"" not in text
    assert text.count("struct QuantizeOp") == 1 and "struct GroupMap" in text


# ---------------------------------------------------------------------------
# Host emulation of the traversal

_HARNESS = r"""
#include <cstdio>
#include <cstring>
#include <iostream>
#include <vector>
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__
#include <cstdlib>
#define __shared__ static
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
template <class T> T __ldg(const T* p) { return *p; }
// The warp-wide store of float outputs (dequantize direction) needs a warp: the CPU execution
// of the kernels (tests/cudasim) runs it; this one-thread-at-a-time harness walks quantize only.
inline unsigned __ballot_sync(unsigned, int) { std::abort(); }
inline void __syncwarp(unsigned = 0xffffffffu) { std::abort(); }
struct Dim { unsigned x = 0; };
static Dim gridDim, blockDim, blockIdx, threadIdx;
#include "cudasim_ptx.h"  // the CPU execution's mul.hi.u32 / clz.b32, as tests/cudasim gives them
inline unsigned __umulhi(unsigned a, unsigned b) { return cudasim::ptx::mul_hi_u32(a, b); }
inline int __clz(int x) { return static_cast<int>(cudasim::ptx::clz_b32(static_cast<uint32_t>(x))); }
#include "elementwise.cuh"
using namespace gpuq;
constexpr long long kSentinel = 12345;  // ValueMap's starting index (below 2^24)
// Output = input * 2^24 + scale index: checks both the element and its scale.
// Starts at p0: under ValueMap (no reload ever) every element must keep it.
struct IdxOp {
    long long p;
    void reload(long long q) { p = q; }
    long long operator()(long long x) const { return x * (1LL << 24) + p; }
};
template <class Map>
void run(const long long* in, long long* out, long long n, long long head, int vec, long long m0,
         long long m1, long long m2, const long long* dims, unsigned blocks, unsigned threads, long long p0) {
    gridDim.x = blocks; blockDim.x = threads;
    for (unsigned b = 0; b < blocks; ++b)
        for (unsigned t = 0; t < threads; ++t) {
            blockIdx.x = b; threadIdx.x = t;
            for_each_unit<Map, long long, long long, true>(in, out, n, head, vec, m0, m1, m2, dims, IdxOp{p0});
        }
}
// FastDivmod(packed) against the host's integer division on a grid of dividends below 2^31:
// the ends, 2 either side of the 5 multiples of d nearest 0, 2^30 and 2^31 - 1 (the magic's
// error grows with the dividend: it would show at the top first), and `randoms` pseudo-random
// ones. Returns the count of wrong quotients or remainders (the first one on stderr).
long long fast_divisor_misses(long long packed, int randoms) {
    const FastDivmod f(packed);
    const unsigned d = f.d;
    const unsigned top = 0x7fffffffu;
    std::vector<unsigned> as = {0u, 1u, 2u, top, top - 1u, top - 2u, 1u << 30, (1u << 30) - 1u, (1u << 30) + 1u};
    for (unsigned base : {0u, top / 2u, top}) {
        const long long k = base / d * d;
        for (long long m = k - 2LL * d; m <= k + 2LL * d; m += d)
            for (long long a = m - 2; a <= m + 2; ++a)
                if (a >= 0 && a <= top) as.push_back(static_cast<unsigned>(a));
    }
    unsigned long long state = 0x9e3779b97f4a7c15ull ^ d;
    for (int k = 0; k < randoms; ++k) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        as.push_back(static_cast<unsigned>(state >> 33));  // 31 bits
    }
    long long misses = 0;
    for (unsigned a : as) {
        unsigned q, r;
        f(a, q, r);
        if (q != a / d || r != a % d) {
            if (misses == 0) std::fprintf(stderr, "d=%u a=%u: %u %u\n", d, a, q, r);
            ++misses;
        }
    }
    return misses;
}
int main() {
    int map, vec, nd; long long n, head, m0, m1, m2; unsigned blocks, threads;
    while (std::cin >> map) {
        if (map == -2) {  // "-2 packed randoms": FastDivmod of a packed divisor on the dividend grid
            long long packed;
            int randoms;
            std::cin >> packed >> randoms;
            std::printf("%lld\n", fast_divisor_misses(packed, randoms));
            continue;
        }
        if (map < 0) {  // "-1 bits": the kernels' scale_from_bits, as C99 hex floats
            long long bits;
            std::cin >> bits;
            std::printf("%a %a\n", static_cast<double>(scale_from_bits<float>(bits)), scale_from_bits<double>(bits));
            continue;
        }
        std::cin >> n >> head >> vec >> m0 >> m1 >> m2 >> blocks >> threads >> nd;
        std::vector<long long> dims(3 * nd + 1);
        for (int k = 0; k < 3 * nd; ++k) std::cin >> dims[k];
        std::vector<long long> in(n), out(n, -1);
        for (long long i = 0; i < n; ++i) in[i] = i;
        const long long* d = dims.data();
        if (map == 0) run<TensorMap>(in.data(), out.data(), n, head, vec, m0, m1, m2, d, blocks, threads, -1);
        if (map == 1) run<ChannelMap>(in.data(), out.data(), n, head, vec, m0, m1, m2, d, blocks, threads, -1);
        if (map == 2) run<GroupMap>(in.data(), out.data(), n, head, vec, m0, m1, m2, d, blocks, threads, -1);
        if (map == 3) run<StridedMap>(in.data(), out.data(), n, head, vec, m0, m1, m2, d, blocks, threads, -1);
        if (map == 4) run<ValueMap>(in.data(), out.data(), n, head, vec, m0, m1, m2, d, blocks, threads, kSentinel);
        for (long long i = 0; i < n; ++i) std::cout << out[i] << ' ';
        std::cout << std::endl;
    }
}
"""

_CXX = shutil.which("g++") or shutil.which("clang++") or shutil.which("c++")


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    if _CXX is None:
        pytest.skip("no host C++ compiler (g++/clang++) to emulate the kernels' traversal")
    d = tmp_path_factory.mktemp("harness")
    (d / "h.cpp").write_text(textwrap.dedent(_HARNESS))
    exe = d / "h"
    shim = Path(__file__).parent / "cudasim" / "shim"
    subprocess.run([_CXX, "-std=c++17", "-O1", "-Wno-unknown-pragmas", f"-I{registry.kernels_dir()}", f"-I{shim}",
                    str(d / "h.cpp"), "-o", str(exe)], check=True, capture_output=True)
    return exe


def _expected_index(scheme):
    shape = scheme.shape
    if scheme.kind == "block":
        grid = np.indices(shape).reshape(len(shape), -1)
        blocks = np.array(scheme.blocks).reshape(-1, 1)
        return np.ravel_multi_index(tuple(grid // blocks), scheme.param_shape)
    pshape = scheme.param_shape
    size = int(np.prod(pshape)) if pshape else 1
    ids = np.arange(size).reshape(pshape if pshape else ())
    if scheme.kind == "tensor":
        return np.zeros(int(np.prod(shape)), np.int64)
    if scheme.kind == "group":
        (k,) = scheme.axes
        grid = np.indices(shape)
        grid[k] //= scheme.group_size
        return ids[tuple(grid)].ravel()
    view = tuple(d if i in scheme.axes else 1 for i, d in enumerate(shape))
    return np.broadcast_to(ids.reshape(view), shape).ravel()


_CASES = [
    ((37,), None, None),
    ((5, 7), 1, None),
    ((5, 7), 0, None),
    ((3, 1, 4, 5), 2, None),
    ((2, 3, 4, 5), 1, None),
    ((40, 3), -1, None),
    ((2, 3, 4, 5), (0, 2), None),
    ((2, 3, 4, 5), (1, 3), None),
    ((3, 4, 5), (0, 1), None),
    ((2, 1, 3, 2, 5), (0, 3), None),
    ((6, 10), 1, 4),
    ((6, 8), 1, 4),
    ((10, 6), 0, 3),
    ((7, 5, 3), 1, 2),
    ((4, 9, 2), 1, 9),
    ((4, 9, 2), 1, 20),
    ((3, 5), 1, 1),
    ((50,), 0, 7),
    # rows of >= 16 elements: units inside one row skip the walk (uniform()), others straddle
    ((3, 5, 40), 1, None),
    ((4, 100), 0, None),
    ((2, 3, 17), (0, 1), None),
    # ragged groups along the last axis (inner == 1), groups longer than a unit
    ((3, 70), 1, 20),
    ((5, 37), 1, 32),
    ((9, 37), 1, 20),  # a ragged last group longer than a unit: the row ends inside it
    ((2, 50), 1, 16),
    # groups of >= 16 along an axis with elements after it (inner > 1): never uniform
    ((2, 40, 3), 1, 20),
    ((3, 37, 2), 1, 32),
    # blocks of any shape (issue 28): ragged on every dim, a block covering a dim, -1, 3-D
    ((37, 41), None, (16, 16)),
    ((33, 20), None, (8, -1)),
    ((5, 17, 9), None, (1, 4, 4)),
    ((3, 40), None, (2, 16)),
    ((40, 3), None, (16, 2)),
    ((7, 100), None, (3, 32)),
    ((6, 64), None, (4, 32)),
    ((2, 3, 50), None, (2, 2, 17)),
    # the 2-D block map (issue 38): ragged both ways, one column block, rows of one block row
    ((130, 257), None, (128, 128)),
    ((9, 7), None, (4, 3)),
    ((17, 1025), None, (3, 128)),
    ((33, 40), None, (5, 40 - 1)),
    ((20, 5), None, (3, 5 - 2)),
]


@pytest.mark.parametrize("shape, axis, group", _CASES, ids=[f"{s}-axis{a}-g{g}" for s, a, g in _CASES])
def test_traversal_and_index_maps_on_host(harness, shape, axis, group):
    scheme = (Scheme.build(shape, block_size=group) if isinstance(group, tuple)
              else Scheme.build(shape, axis, group))
    name, m0, m1, m2, dims = scheme.index_map
    assert name != "expand"
    n = int(np.prod(shape))
    expected = _expected_index(scheme)
    lines, runs = [], []
    # The map's arguments as a launch passes them (the channel and group maps' divisors packed
    # for FastDivmod, the 2-D block map's too) and plain (what a tensor of 2^31 elements or more gets).
    forms = {device_map_params(name, m0, m1, m2, n, dims), (m0, m1, m2)}
    for head in sorted({0, 1, 3, 15, min(n, 15)}):
        head = min(head, n)
        for vec in (0, 1, 3):
            for blocks, threads in ((1, 1), (3, 5)):
                for p0, p1, p2 in forms:
                    dims_t = dims or ()
                    nd = len(dims_t) // 3
                    lines.append(" ".join(map(str, (registry.MAPS[name], n, head, vec, p0, p1, p2,
                                                    blocks, threads, nd) + tuple(dims_t))))
                    runs.append((head, vec, blocks, threads, p0 < 0))
    if name in ("channel", "group") or (name == "strided" and len(shape) == 2):
        assert any(p[0] < 0 for p in forms), "the launch packs this map's divisors"
    out = subprocess.run([str(harness)], input="\n".join(lines) + "\n", capture_output=True,
                         text=True, check=True).stdout.splitlines()
    assert len(out) == len(runs)
    for line, run in zip(out, runs):
        got = np.array(line.split(), np.int64)
        assert np.array_equal(got >> 24, np.arange(n)), f"elements misplaced for head/vec/grid {run}"
        assert np.array_equal(got & ((1 << 24) - 1), expected), (
            f"scale index wrong for head/vec/grid {run} ({name}, {m0}, {m1}, {m2}, {dims})")


def test_launch_packs_the_element_maps_divisors_below_two_to_the_31():
    assert device_map_params("channel", 3, 4, 0, 2**31 - 1) == (fast_divisor(3), fast_divisor(4), 0)
    assert device_map_params("group", 9, 2, 20, 36) == (fast_divisor(9), fast_divisor(2), fast_divisor(9))
    assert device_map_params("channel", 3, 4, 0, 2**31) == (3, 4, 0)  # today's 32/64-bit divmod
    assert device_map_params("strided", 3, 0, 0, 100, (2, 5, 10) * 3) == (3, 0, 0)  # 3-D: the odometer
    assert device_map_params("strided", 2, 0, 0, 300 * 200, (300, 200, 2, 1, 128, 128)) == (
        fast_divisor(128), fast_divisor(200), fast_divisor(128))
    with pytest.raises(ValueError, match=r"d must be in \[1, 2\*\*31\), got 2147483648"):
        fast_divisor(2**31)


def _fast_divisor_misses(harness, divisors, randoms):
    lines = [f"-2 {fast_divisor(int(d))} {randoms}" for d in divisors]
    return {int(d): int(m) for d, m in zip(divisors, _harness_lines(harness, lines), strict=True)}


def test_fast_divisor_every_divisor_below_two_to_the_16(harness):
    """The kernels' FastDivmod (the CPU execution's mul.hi.u32 and clz.b32) with the host's
    multiplier equals integer division for every divisor < 2^16, on each one's grid of
    dividends up to 2^31 - 1."""
    misses = _fast_divisor_misses(harness, range(1, 2**16), 16)
    assert not {d: m for d, m in misses.items() if m}


def test_fast_divisor_large_and_extreme_divisors(harness):
    """Sampled divisors up to 2^31 - 1 and every power of two and its neighbours."""
    rng = np.random.default_rng(38)
    extremes = {2**31 - 1, 2**31 - 2, 2**30 + 1, 3, 641, 6700417, 46341, 65537}
    for k in range(1, 31):
        extremes |= {2**k - 1, 2**k, 2**k + 1}
    divisors = sorted(extremes | set(rng.integers(2**16, 2**31, 2000).tolist()))
    misses = _fast_divisor_misses(harness, divisors, 512)
    assert not {d: m for d, m in misses.items() if m}


def test_fast_divisor_check_can_fail(harness):
    """A multiplier one too small is caught (the check is not vacuous)."""
    bad = fast_divisor(7) - (1 << 31)  # mult - 1
    (line,) = _harness_lines(harness, [f"-2 {bad} 64"])
    assert int(line) > 0


def _harness_lines(harness, lines):
    return subprocess.run([str(harness)], input="\n".join(lines) + "\n", capture_output=True,
                          text=True, check=True).stdout.splitlines()


@pytest.mark.parametrize("n", [1, 15, 16, 17, 37, 1025])
def test_value_map_never_reloads(harness, n):
    """A host scalar's launch (MAPS["value"]): the parameter the kernel assigned
    before the walk serves every element; a reload would replace it with index 0."""
    lines, runs = [], []
    for head in sorted({0, 1, min(n, 15)}):
        for vec in (0, 1, 3):
            for blocks, threads in ((1, 1), (3, 5)):
                # m0, m1 carry the scale's bits and the zero point: arbitrary values for the walk
                lines.append(f"{registry.MAPS['value']} {n} {head} {vec} 1056964608 -7 0 {blocks} {threads} 0")
                runs.append((head, vec, blocks, threads))
    for line, run in zip(_harness_lines(harness, lines), runs, strict=True):
        got = np.array(line.split(), np.int64)
        assert np.array_equal(got >> 24, np.arange(n)), f"elements misplaced for head/vec/grid {run}"
        assert np.all(got & ((1 << 24) - 1) == 12345), f"parameter reloaded for head/vec/grid {run}"


def test_scale_bits_reach_the_kernel_unchanged(harness):
    """cuda_backend._by_value's m0 decoded by the kernels' scale_from_bits (same
    little-endian layout on the host as on the device): every class of float32
    and float64 scale, subnormals and the largest finite included."""
    from gpuq.backends.cuda.launch import _by_value

    f32 = np.array([0.5, 1 / 3, 1e-40, np.finfo(np.float32).smallest_subnormal, np.finfo(np.float32).tiny,
                    np.finfo(np.float32).max, 0.0173], np.float32)
    f64 = np.array([0.5, 1 / 3, 1e-310, np.finfo(np.float64).smallest_subnormal, np.finfo(np.float64).max,
                    0.0173], np.float64)
    cases = [(np.array([v]), 0) for v in f32] + [(np.array(v), 1) for v in f64]
    bits = [_by_value(s, None)[0] for s, _ in cases]
    out = _harness_lines(harness, [f"-1 {b}" for b in bits])
    for (s, which), line in zip(cases, out, strict=True):
        got = float.fromhex(line.split()[which])
        assert got == float(s.reshape(-1)[0]), (s, line)


def test_by_value_only_for_host_values():
    from gpuq.backends.cuda.launch import _by_value

    s = np.array(0.25, np.float32)
    assert _by_value(s, np.array([-(2**31)], np.int32)) == (int(s.view(np.int32)), -(2**31))
    assert _by_value(s, None) == (int(s.view(np.int32)), 0)
    device_like = object()  # anything that is not a NumPy array stands for a device array
    assert _by_value(device_like, None) is None
    assert _by_value(s, device_like) is None
    # more than one value, or a dtype the kernels' TS never is: uploaded and read from memory
    assert _by_value(np.array([0.25, 0.5], np.float32), None) is None
    assert _by_value(s, np.array([1, 2], np.int32)) is None
    assert _by_value(np.array(0.25, np.float16), None) is None


@needs_nvrtc
def test_nvrtc_without_origin_run_path_still_compiles(tmp_path):
    """torch's nvidia-cuda-nvrtc 13.0 wheel: libnvrtc without an $ORIGIN run path. Rebuilt
    here from the installed wheel by blanking its run path in a copy (same length, so the
    ELF layout is unchanged); the builtins library sits beside it, as in that wheel."""
    import subprocess
    import sys

    data = _LIB.read_bytes()
    if data.count(b"$ORIGIN\x00") != 1:
        pytest.skip("this libnvrtc has no single $ORIGIN run path to remove")
    lib = tmp_path / _LIB.name
    lib.write_bytes(data.replace(b"$ORIGIN\x00", b"/nowher\x00"))
    for b in _LIB.parent.glob("libnvrtc-builtins.so*"):
        (tmp_path / b.name).write_bytes(b.read_bytes())
    probe = (
        "import ctypes, sys\n"
        "from gpuq.backends.cuda import nvrtc_check as n\n"
        "if sys.argv[2] == 'preload': nv = n.Nvrtc(sys.argv[1])\n"
        "else:\n"
        "    n.preload_builtins = lambda path: []  # the loader as it was\n"
        "    nv = n.Nvrtc(sys.argv[1])\n"
        "rc, log, code, _ = nv.compile('__global__ void k() {}', 'k.cu', ('--gpu-architecture=compute_80',))\n"
        "print(rc, log)\n"
    )
    runs = {mode: subprocess.run([sys.executable, "-c", probe, str(lib), mode], capture_output=True, text=True)
            for mode in ("plain", "preload")}
    # Without the preload the copy fails as torch's wheel does: the setup reproduces the bug.
    assert "builtins" in runs["plain"].stdout + runs["plain"].stderr, runs["plain"]
    assert runs["preload"].returncode == 0 and runs["preload"].stdout.split()[0] == "0", runs["preload"]
