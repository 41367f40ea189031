"""Long CPU-bound work started once the session's tests are known, run beside them.

Most of the suite is single-threaded Python, so on a 2-core CI machine one core
idles while it runs, and three long jobs used to run each at its own test, in
series: the host builds of the kernels for the CPU execution (74 g++ modules,
~110 s of one core cold), the UBSan sweep in its child process (its representatives' builds
sanitized, then the sweep), and the NVRTC builds of every instantiation (~4 min
of one core). Here they start at the end of collection and run beside the
suite; their tests wait for the results they would otherwise have made, and
check them exactly as before. A session that selects none of their tests
starts nothing (``pytest tests/test_cli.py``), one of sweep cases only builds their
modules (``pytest tests/test_cuda_sweep.py -k fp4``).

A test module takes part by defining ``start_background(items)`` (its selected
items); :func:`on_exit` registers what stops its work if the session ends first.
"""

from __future__ import annotations

import concurrent.futures
import os

_stoppers = []


def on_exit(stop) -> None:
    """Call ``stop()`` when the session ends (work not waited for is abandoned)."""
    _stoppers.append(stop)


def start(items, cuda_mode: str) -> None:
    """Start the background work of the selected ``items`` (from ``pytest_collection_finish``)."""
    if cuda_mode == "sim" and any("cuda" in item.nodeid for item in items):
        _prebuild_kernels(_kernel_names(items))
    by_module = {}
    for item in items:
        module = getattr(item, "module", None)
        if module is not None and hasattr(module, "start_background"):
            by_module.setdefault(module, []).append(item)
    for module, selected in by_module.items():
        module.start_background(selected)


def stop() -> None:
    """End the background work (from ``pytest_sessionfinish``)."""
    while _stoppers:
        try:
            _stoppers.pop()()
        except Exception:  # noqa: BLE001 - best effort at the end of the session
            pass


def _kernel_names(items):
    """The name expressions the selected CUDA tests launch, where every one of their modules
    says (``kernel_names_of(item)``, tests/test_cuda_sweep.py); None (every kernel) otherwise."""
    names = set()
    for item in items:
        if "cuda" not in item.nodeid:
            continue
        of = getattr(getattr(item, "module", None), "kernel_names_of", None)
        if of is None:
            return None
        names |= of(item)
    return names


def _prebuild_kernels(names=None) -> concurrent.futures.Executor:
    """Every module the CUDA backend can ask the CPU execution for (or those holding one of
    ``names``), built on background threads (each build is a g++ process), longest first; as
    the backend would build them (same source text, names, sanitizer setting and macros), so its
    requests find them built, or wait on the build in progress. A failed build is left for
    the test that needs it to report."""
    import cupy
    from cudasim import hostbuild

    from gpuq.backends.cuda import registry

    sanitize, defines = cupy._sim.sanitize(), cupy._sim.build_defines()
    units = [u for u in registry.compile_units() if names is None or names.intersection(u[1])]
    units.sort(key=lambda u: u[0] != "formats.cu")
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1,
                                                 thread_name_prefix="gpuq-prebuild")
    for source, names in units:
        pool.submit(hostbuild.build, registry.source_text(source), list(names), sanitize=sanitize,
                    defines=defines)
    pool.shutdown(wait=False)
    on_exit(lambda: pool.shutdown(wait=False, cancel_futures=True))
    return pool
