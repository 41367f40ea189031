"""The wheel carries the package and the CUDA kernel sources inside it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    pytest.importorskip("setuptools")
    src = tmp_path_factory.mktemp("src")
    for name in ("gpuq", "kernels"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "_gpuq_entry.py"):
        shutil.copy(ROOT / name, src / name)
    dist = tmp_path_factory.mktemp("dist")
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(src)]
    run = subprocess.run(cmd, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    (whl,) = dist.glob("gpuq-*.whl")
    return whl


def test_wheel_contents(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    # Every Python module of the source tree, at the same path: a subpackage missing from
    # pyproject's package list would silently be left out of the wheel.
    modules = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "gpuq").rglob("*.py")
                     if "__pycache__" not in p.parts)
    assert "gpuq/backends/cuda/backend.py" in modules
    missing = [m for m in modules if m not in names]
    assert not missing, f"modules missing from the wheel: {missing}"
    kernels = sorted(p.name for p in (ROOT / "kernels").iterdir() if p.suffix in (".cu", ".cuh"))
    assert kernels, "kernels/ holds no CUDA sources"
    for k in kernels:
        assert f"gpuq/kernels/{k}" in names, f"{k} missing from the wheel: {sorted(names)}"
    assert not any(n.startswith(("tests/", "bench/")) for n in names)


def test_wheel_metadata(wheel):
    meta = next(n for n in zipfile.ZipFile(wheel).namelist() if n.endswith("METADATA"))
    text = zipfile.ZipFile(wheel).read(meta).decode()
    assert "Requires-Dist: numpy" in text
    assert 'extra == "cuda13"' in text and 'extra == "cuda12"' in text
    # CuPy alone has no NVRTC and no CUDA headers: the GPU extras bring CuPy's toolkit extra.
    requires = [line for line in text.splitlines() if line.startswith("Requires-Dist: cupy")]
    for extra, pkg in (("cuda12", "cupy-cuda12x"), ("cuda13", "cupy-cuda13x")):
        (req,) = [r for r in requires if f'extra == "{extra}"' in r]
        assert req.startswith(f"Requires-Dist: {pkg}[ctk]"), req
    entry = next(n for n in zipfile.ZipFile(wheel).namelist() if n.endswith("entry_points.txt"))
    # the console script's module, outside the package (its handlers come before NumPy's import)
    assert "gpuq = _gpuq_entry:main" in zipfile.ZipFile(wheel).read(entry).decode()
    assert "_gpuq_entry.py" in zipfile.ZipFile(wheel).namelist()
