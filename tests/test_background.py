"""The session's prebuild (tests/_background.py) builds the very modules the CPU execution's
RawModule asks for: same source text, names, sanitizer setting and macros (the compute
capability's ``__CUDA_ARCH__``), so the tests find them built instead of compiling them again."""

from __future__ import annotations

import pytest

import _background
from conftest import CUDA_MODE
from gpuq.backends.cuda import registry

pytestmark = pytest.mark.skipif(CUDA_MODE != "sim", reason="the prebuild serves the CPU execution of the kernels")


@pytest.fixture
def requests(monkeypatch):
    """Every hostbuild.build call, recorded instead of compiled: (text, names, sanitize, defines)."""
    from cudasim import hostbuild

    seen = []

    def record(source_text, name_expressions, *, sanitize=False, defines=()):
        seen.append((source_text, tuple(name_expressions), bool(sanitize), tuple(defines)))
        raise RuntimeError("recorded, not built")

    monkeypatch.setattr(hostbuild, "build", record)
    return seen


@pytest.mark.parametrize("cc", ["90", "80"])
def test_prebuild_is_what_the_raw_module_builds(requests, cc):
    import cupy

    source, names = next(u for u in registry.compile_units() if u[0] == "quantize.cu")
    with cupy._sim.compute_capability(cc):
        _background._prebuild_kernels(set(names[:1])).shutdown(wait=True)
        module = cupy.RawModule(code=registry.source_text(source), options=registry.OPTIONS,
                                name_expressions=list(names))
    prebuilt = list(requests)
    assert len(prebuilt) == 1  # only the unit holding the selected name
    with pytest.raises(RuntimeError, match="recorded"):
        module.compile()
    assert requests[-1] == prebuilt[0]
    assert prebuilt[0][3] == (f"__CUDA_ARCH__={int(cc) * 10}",)


def test_prebuild_of_every_unit_without_a_selection(requests):
    _background._prebuild_kernels(None).shutdown(wait=True)
    assert sorted(r[1] for r in requests) == sorted(tuple(u[1]) for u in registry.compile_units())
