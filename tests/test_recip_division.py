"""The exact division from a reciprocal computed once per scale (issue 38, point 2), on the host.

``tests/recip_division.cpp`` states the per-element sequence the kernels use
(kernels/contract.cuh's ``Divisor``: ``y = RN(1/s)`` once per scale; ``q0 = RN(x*y);
e = fma(-s, q, x); q = fma(e, y, q)`` from ``q = q0``, once or twice) and counts where its
result differs from IEEE ``x / s``, built with ``-ffp-contract=off`` so every operation rounds
on its own as PTX's ``mul.rn`` / ``fma.rn`` do. A quotient may differ only where no code can tell (both below 2**-24, or
both above 2**100); the int8 codes (NaN -> 0, half-even, saturating) must all be equal.

CI: 2e7 random pairs with scales over the guarded range [2**-64, 2**64] and every 251st
float32 at five scales (about 10 s of one core). ``GPUQ_SLOW=1``: 1e10 pairs and all 2**32 float32
inputs at the guard ends, 1/127, 1/448 and 1/7 (about 20 minutes of one core; results in
bench/NOTES.md).
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest

_CXX = shutil.which("g++") or shutil.which("clang++")
_SOURCE = os.path.join(os.path.dirname(__file__), "recip_division.cpp")
_SLOW = pytest.mark.skipif(os.environ.get("GPUQ_SLOW") != "1", reason="a long proof run by hand: GPUQ_SLOW=1")

#: The guard ends, the symmetric int8 scale of a unit range, fp8 e4m3's 1/448 and a 1/7.
SCALES = {"2**-64": 2.0**-64, "2**64": 2.0**64, "1/127": 1 / 127, "1/448": 1 / 448, "1/7": 1 / 7}


@pytest.fixture(scope="module")
def prover(tmp_path_factory):
    if _CXX is None or sys.platform != "linux":
        pytest.skip("needs a host C++ compiler (g++/clang++) on Linux")
    exe = tmp_path_factory.mktemp("recip") / "recip_division"
    subprocess.run([_CXX, "-std=c++17", "-O2", "-ffp-contract=off", "-fno-fast-math", "-fno-tree-vectorize",
                    _SOURCE, "-o", str(exe)], check=True, capture_output=True)
    return exe


def _run(exe, *args) -> dict:
    out = subprocess.run([str(exe), *map(str, args)], check=True, capture_output=True, text=True)
    words = out.stdout.split()
    tally = {k: int(v) for k, v in zip(words[::2], words[1::2])}
    assert tally["one_bad"] == 0 and tally["two_bad"] == 0, out.stderr
    assert tally["int8_one"] == 0 and tally["int8_two"] == 0, tally
    return tally


def _bits(scale: float) -> str:
    s = np.float32(scale)
    assert np.isfinite(s) and s > 0
    return format(struct.unpack("<I", struct.pack("<f", s))[0], "08x")


def test_random_pairs_over_the_guarded_scale_range(prover):
    tally = _run(prover, "pairs", 20_000_000, 38)
    assert tally["checked"] == 20_000_000
    assert tally["tiny"] > 0  # subnormal x are among the pairs: the allowed class is reached


@pytest.mark.parametrize("name", SCALES)
def test_every_251st_float32_at_a_scale(prover, name):
    # A prime stride: every significand bit and exponent varies (a power of two left the low bits 0).
    tally = _run(prover, "all", _bits(SCALES[name]), 251)
    assert tally["checked"] == -(-(2**32) // 251)


def test_the_prover_sees_a_wrong_quotient(tmp_path):
    # The same program with the correction step left out (q = RN(x * RN(1/s)), torch.compile's
    # division) must report wrong quotients: the counts can fail.
    if _CXX is None or sys.platform != "linux":
        pytest.skip("needs a host C++ compiler")
    src = open(_SOURCE).read().replace("for (int k = 0; k < steps; ++k)", "for (int k = 0; k < 0 * steps; ++k)")
    assert src != open(_SOURCE).read()
    (tmp_path / "bad.cpp").write_text(src)
    subprocess.run([_CXX, "-std=c++17", "-O2", "-ffp-contract=off", "-fno-tree-vectorize", str(tmp_path / "bad.cpp"),
                    "-o", str(tmp_path / "bad")], check=True, capture_output=True)
    out = subprocess.run([str(tmp_path / "bad"), "all", _bits(1 / 127), "251"], capture_output=True, text=True).stdout
    words = out.split()
    tally = {k: int(v) for k, v in zip(words[::2], words[1::2])}
    assert tally["one_bad"] > 0 and tally["two_bad"] > 0, tally


@_SLOW
def test_ten_billion_pairs(prover):
    _run(prover, "pairs", 10_000_000_000, 2038)


@_SLOW
@pytest.mark.parametrize("name", SCALES)
def test_all_float32_at_a_scale(prover, name):
    assert _run(prover, "all", _bits(SCALES[name]))["checked"] == 2**32
