"""The device check's CPU side (issue 25): what must hold before a GPU window is spent.

* ``bench/gpu_check.sh`` on a machine without a GPU stops at its preflight, in seconds, with
  one ``no GPU: ...`` line and exit status 1;
* ``GPUQ_REQUIRE_GPU=1`` makes a pytest session without a real GPU stop at once, saying why,
  and pytest's header names the mode the CUDA tests run in;
* a missing or broken numba costs the numba tests only: the doctests of ``gpuq/`` still
  collect (``conftest.py`` at the root);
* NVRTC's builtins library is loaded before the first kernel compile (CuPy's own compile
  path fails without it where libnvrtc has no run path: torch's nvrtc 13.0 wheel);
* the check's Python steps run (on the CPU execution of the kernels, as a dry run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import CUDA_MODE

REPO = Path(__file__).resolve().parents[1]
no_gpu_here = pytest.mark.skipif(CUDA_MODE == "real", reason="this machine has a GPU: the check would run")


def _run(cmd, env=None, timeout=300):
    """``cmd`` in the repository, with this environment less GPUQ_REQUIRE_GPU, plus ``env``."""
    full = {k: v for k, v in os.environ.items() if k != "GPUQ_REQUIRE_GPU"}
    full.update(env or {})
    return subprocess.run(cmd, cwd=REPO, env=full, capture_output=True, text=True, timeout=timeout)


@no_gpu_here
def test_the_check_stops_at_once_without_a_gpu(tmp_path):
    env = dict(os.environ, OUT=str(tmp_path), PATH="/usr/bin:/bin")  # no nvidia-smi there
    start = time.perf_counter()
    proc = subprocess.run(["bash", "bench/gpu_check.sh"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60)
    took = time.perf_counter() - start
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert took < 10, took
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("no GPU: "), proc.stdout
    log = (tmp_path / "check.log").read_text()
    assert "step preflight: rc 1" in log and last in log
    assert sorted(p.name for p in tmp_path.iterdir()) == ["check.log", "preflight.txt"]


@no_gpu_here
def test_require_gpu_stops_the_session_at_once():
    start = time.perf_counter()
    proc = _run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "addopts=",
                 "tests/test_errors.py"], env={"GPUQ_REQUIRE_GPU": "1"})
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]  # pytest's usage error
    assert "GPUQ_REQUIRE_GPU=1 but the CUDA tests would run on the CPU execution" in proc.stderr
    assert "passed" not in proc.stdout
    assert time.perf_counter() - start < 60


def test_the_report_header_names_the_cuda_mode():
    proc = _run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "addopts=", "--co",
                 "tests/test_errors.py"], env={"GPUQ_REQUIRE_GPU": "0"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    want = "gpuq cuda tests: real GPU (" if CUDA_MODE == "real" else \
        "gpuq cuda tests: CPU execution of the kernels (tests/cudasim): "
    assert want in proc.stdout, proc.stdout[:2000]


@pytest.mark.parametrize("failure", ["ImportError('simulated: no numba')",
                                     "RuntimeError('simulated: a broken numba')"])
def test_a_missing_or_broken_numba_costs_the_numba_tests_only(tmp_path, failure):
    fake = tmp_path / "numba"
    fake.mkdir()
    (fake / "__init__.py").write_text(f"raise {failure}\n")
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}", "GPUQ_HOST_KERNELS": "",
           "PYTHONWARNINGS": "ignore::RuntimeWarning"}
    proc = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
                 "gpuq/backends/host", "tests/test_host_formats.py", "tests/test_host_kernels.py"], env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "error" not in out.lower().split("short test summary")[0].splitlines()[-1], out[-3000:]
    assert "passed" in out and "numba is not installed or does not load here" in out, out[-3000:]


def test_nvrtc_builtins_are_loaded_before_the_first_compile(monkeypatch):
    import cupy

    from gpuq.backends.cuda import compiler, nvrtc_check, registry

    events = []
    monkeypatch.setattr(nvrtc_check, "preload_builtins", lambda lib: events.append("preload") or [])
    monkeypatch.setattr(nvrtc_check, "find_libnvrtc", lambda: Path("/nowhere/libnvrtc.so.13"))
    real = cupy.RawModule

    def recording(**kwargs):
        events.append("RawModule")
        return real(**kwargs)

    monkeypatch.setattr(cupy, "RawModule", recording)
    caches = (compiler.prepare_nvrtc, compiler._module, compiler._function)
    for cache in caches:
        cache.cache_clear()
    try:
        names = registry.quantize_group("float32", "int8")
        compiler.get_function("quantize.cu", names, names[0])
    finally:
        for cache in caches:
            cache.cache_clear()
    assert events[:1] == ["preload"] and "RawModule" in events, events


def test_mapped_libraries_reads_this_process():
    from gpuq.backends.cuda import compiler

    if not Path("/proc/self/maps").exists():
        assert compiler._mapped_libraries("libc") == []
        return
    found = compiler._mapped_libraries("libc")
    assert found and all(p.name.startswith("libc") and p.is_absolute() for p in found)


@no_gpu_here
def test_the_compile_step_runs_on_the_cpu_execution(tmp_path):
    out = tmp_path / "compile.json"
    proc = _run([sys.executable, "bench/gpu_check.py", "--sim", "compile", "--limit", "2", "--threads", "2",
                 "--json", str(out)], timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(out.read_text())
    assert len(report["units"]) == 2 and all(u["kernels"] for u in report["units"])
    assert "2/2 modules" in proc.stdout


def test_the_headline_benchmark_runs_on_cpu_torch(tmp_path):
    pytest.importorskip("torch")
    sys.path.insert(0, str(REPO))
    try:
        from bench import gpu_headline
    finally:
        sys.path.remove(str(REPO))
    out = tmp_path / "bench.json"
    assert gpu_headline.main(["--device", "cpu", "--rows", "8", "--cols", "256", "--reps", "1", "--rounds", "1",
                              "--check-rows", "4", "--no-compile", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 12 and all(r["bits"] == "ok" and "gpuq_ms" in r for r in rows), rows


@pytest.mark.skipif(CUDA_MODE != "sim", reason="the dry run is for the CPU execution of the kernels")
def test_conformance_step_dry_runs_on_the_cpu_execution_and_reports_a_mismatch(monkeypatch):
    # bench/gpu_conformance.py, the device check's conformance step, on 2**12 patterns spread over
    # the 32-bit range (the device runs all 2**32): every form agrees with the software path; a
    # planted wrong reference (the int8 clamp at -127) is reported with its count and first pattern.
    import cupy

    from bench import gpu_conformance as conf

    got = conf.run(cupy, 1 << 12)
    assert list(got) == list(conf.FORMS)
    assert all(n == 0 and first is None for n, first in got.values()), got
    planted = conf._KERNEL.replace("min(max(r, -128), 127)", "min(max(r, -127), 127)")
    assert planted != conf._KERNEL
    monkeypatch.setattr(conf, "_KERNEL", planted)
    got = conf.run(cupy, 1 << 12)
    n, first = got["cvt.rni.sat.s8.f32"]
    assert n > 0 and first is not None and first >= 0x80000000  # a negative float saturating at -128
    assert all(v == (0, None) for k, v in got.items() if k != "cvt.rni.sat.s8.f32")
    with pytest.raises(ValueError, match="power of two"):
        conf.run(cupy, 3)


@pytest.mark.skipif(CUDA_MODE != "sim", reason="the dry run is for the CPU execution of the kernels")
def test_conformance_division_dry_runs_and_reports_a_wrong_division(monkeypatch):
    # The division's significand pairs (every 2**20-th s, every 2**12-th x on the CPU; [1, 2) each):
    # the kernels' Divisor gives div.rn's bits; with its corrections planted away (x * RN(1/s),
    # torch.compile's division) the step reports mismatches and the first pair.
    import cupy

    from bench import gpu_conformance as conf

    got = conf.run_division(cupy, 20, 12)
    assert list(got) == list(conf.DIVISION_FORMS)
    assert all(v == (0, None) for v in got.values()), got
    real = conf.source()
    planted = real.replace("constexpr int kRecipSteps = 2;", "constexpr int kRecipSteps = 0;")
    assert planted != real
    monkeypatch.setattr(conf, "source", lambda: planted)
    got = conf.run_division(cupy, 20, 12)
    n, first = got[conf.DIVISION_FORMS[0]]
    assert n > 0 and first is not None and first[1] % (1 << 12) == 0, got
    assert got[conf.DIVISION_FORMS[1]] == (0, None)  # the one-step form is written out in the check
    with pytest.raises(ValueError, match="log2 strides"):
        conf.run_division(cupy, 24)


@pytest.mark.skipif(CUDA_MODE != "sim", reason="the dry run is for the CPU execution of the kernels")
def test_helper_conformance_dry_runs_and_reports_a_wrong_helper(monkeypatch):
    # bench/gpu_conformance.py's comparison of every PTX form the CPU execution replaces by a host
    # helper with a device port of that helper (on the GPU: the hardware against the port; here
    # the helper against its port, which shows the port compiles and the comparison can fail):
    # 2**10 patterns spread over 2**32; a planted clz (one bit short) is reported for clz.b32 alone.
    import cupy

    from bench import gpu_conformance as conf

    got = conf.run_helpers(cupy, 1 << 10)
    assert list(got) == list(conf.HELPER_FORMS)
    assert all(v == (0, None) for v in got.values()), got
    real = conf.port_text
    planted = real().replace("for (uint32_t bit = 0x80000000u;", "for (uint32_t bit = 0x40000000u;")
    assert planted != real()
    monkeypatch.setattr(conf, "port_text", lambda: planted)
    got = conf.run_helpers(cupy, 1 << 10)
    n, first = got["clz.b32"]
    assert n > 0 and first is not None
    assert all(v == (0, None) for k, v in got.items() if k != "clz.b32"), got


@pytest.mark.skipif(CUDA_MODE != "sim", reason="the dry run is for the CPU execution of the kernels")
def test_fastdivmod_conformance_dry_runs_and_reports_a_wrong_multiplier(monkeypatch):
    # The index maps' FastDivmod on its dividend grid against integer division (the GPU: every
    # divisor below 2**16 and 2,000 above; here those below 2**8 and 4 above); a multiplier one
    # too small is reported with a divisor that is no power of two (their multiplier is 1, and 0
    # divides them right too).
    import cupy

    from bench import gpu_conformance as conf
    from gpuq.backends.cuda import launch

    divisors = conf.fastdivmod_divisors(4, 1 << 8)
    assert set(range(1, 256)) <= set(divisors) and {2**31 - 1, 2**30, 65537} <= set(divisors)
    assert conf.run_fastdivmod(cupy, divisors) == (0, None)
    real = launch.fast_divisor
    monkeypatch.setattr(launch, "fast_divisor", lambda d: real(d) - (1 << 31))  # mult - 1
    n, (d, j) = conf.run_fastdivmod(cupy, divisors)
    assert n > 0 and d & (d - 1) and 0 <= j < 9 + 75 + 16


@pytest.mark.skipif(CUDA_MODE != "sim", reason="the dry run is for the CPU execution of the kernels")
def test_issue38_step_dry_runs(tmp_path):
    # bench/gpu_issue38.py --sim (what bench/gpu_session.sh issue38 runs after gpu_check.sh on a
    # GPU): the conformance part on the CPU execution, the headline part on CPU torch over the
    # cases issue 38 changed, ncu skipped without the tool; every part's file and the log written.
    out = tmp_path / "issue38"
    proc = _run([sys.executable, "bench/gpu_issue38.py", "--out", str(out), "--sim"],
                env={"PATH": "/usr/bin:/bin"}, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    log = (out / "issue38.log").read_text()
    assert "part conformance: rc 0" in log and "part headline: rc 0" in log, log
    assert "part ncu: skipped (no ncu on PATH)" in log
    conformance = (out / "conformance38.txt").read_text()
    assert "MISMATCHES" not in conformance and "FastDivmod" in conformance and "helpers:" in conformance
    rows = json.loads((out / "headline38.json").read_text())["rows"]
    names = [r["case"] for r in rows]
    assert "dynamic f32->s8 per-row x2 long unchecked" in names and "f32->fp8e4m3 block128x128" in names
    assert "f32->s8 per-tensor" not in names and all(r["bits"] == "ok" for r in rows), rows
