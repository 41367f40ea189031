"""The GPU's one pass for the microscaling layouts (issue 40, point 1: ``weight_micro`` in
``kernels/weight_pass.cu``): NVFP4, MXFP4, MXFP6 (compressed-tensors) and gpt-oss's MXFP4 experts
on ``--device cuda``.

Without a GPU these run on the CPU execution of the kernels (tests/cudasim). The kernel's codes,
scale bytes, NaN/Inf counts and max abs error are the host pass's
(``gpuq.backends.host.weight_pass.quantize_micro``, itself tested against the multi-pass path in
tests/test_fused_micro.py) bit for bit; NVFP4's global scale computed on the GPU is
:func:`gpuq.global_scale`'s; the figures' float64 sums (the kernel's order) within 1e-12. Shapes
stay small: the CPU execution runs a thread at a time.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba")

import gpuq  # noqa: E402
from conftest import CUDA_MODE, _cuda_skip_reason  # noqa: E402
from gpuq import _mx  # noqa: E402
from gpuq._codetypes import CODE_TYPES  # noqa: E402
from gpuq.backends.cuda import registry  # noqa: E402
from gpuq.backends.cuda import weight_pass as cuda_pass  # noqa: E402
from gpuq.backends.host import weight_pass as host_pass  # noqa: E402
from gpuq.checkpoints import fused, fused_cuda  # noqa: E402
from test_fused_micro import SCHEMES, micro_weight  # noqa: E402
from test_fused_weight import BF16, DTYPES  # noqa: E402

_REASON = _cuda_skip_reason()
pytestmark = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")
_SIM = CUDA_MODE == "sim"

FP4, E2M3, E3M2 = (CODE_TYPES[n] for n in ("float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn"))


def _both(x, code, g, *, rule=None, global_scale=None, nvfp4=False):
    """The host pass's and the kernel's results of the same weight, ``(results, codes)`` each;
    NVFP4's own global scale (``nvfp4``, no ``global_scale``): the host's from gpuq.global_scale."""
    out_h = np.full((x.shape[0], x.shape[1] * code.bits // 8), 0xAB, np.uint8)
    out_g = out_h.copy()  # not zeros: every byte must be written
    table = None if nvfp4 else _mx.mx_rule_table(code.name, rule)
    gs = global_scale
    if nvfp4 and gs is None:
        gs = gpuq.global_scale(amax=fused.finite_amax(x), float_dtype=x.dtype)
    want = host_pass.quantize_micro(x, code, g, out_h, mx_table=table, global_scale=gs)
    before = x.tobytes()
    got = fused_cuda.quantize_micro(x, code, g, out_g, mx_table=table, global_scale=global_scale, nvfp4=nvfp4)
    assert x.tobytes() == before  # read, never written
    if nvfp4:
        assert got[3].tobytes() == np.float32(gs).tobytes()  # the GPU's global scale is gpuq.global_scale's
    else:
        assert got[3] is None
    return (want, out_h), (got, out_g)


def assert_same(want, got):
    (w, wo), (g, go) = want, got
    assert wo.tobytes() == go.tobytes()  # the codes in their stored bytes
    assert w[0].tobytes() == g[0].tobytes() and g[0].shape == w[0].shape  # the scale bytes
    assert w[2] == g[2]  # NaN/Inf counts
    (ws, we, wm), (gs, ge, gm) = w[1], g[1]
    assert gm == wm
    assert gs == pytest.approx(ws, rel=1e-12, abs=0.0) and ge == pytest.approx(we, rel=1e-12, abs=0.0)


def _launched(dtype):
    import cupy

    return registry.weight_micro_name(fused_cuda._dtype_name(dtype)) in [r.name for r in cupy._sim.launches]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("kind", ["nvfp4-own", "nvfp4-shared", "mxfp4", "mxfp6"])
def test_the_kernel_is_the_host_pass(kind, dtype):
    """Rows 1/7/17 of NaN, +-Inf, all-zero, all-NaN and all-Inf rows, -0, a subnormal group, a
    saturating group and e2m1 ties (micro_weight)."""
    code = E2M3 if kind == "mxfp6" else FP4
    g = 16 if kind.startswith("nvfp4") else 32
    for rows in (1, 7, 17):
        x = micro_weight((rows, 64 if rows > 1 else g), dtype, seed=rows)  # 64: room for micro_weight's ties
        if kind.startswith("nvfp4"):
            shared = np.float32(3.5) if kind == "nvfp4-shared" else None
            assert_same(*_both(x, code, g, nvfp4=True, global_scale=shared))
        else:
            assert_same(*_both(x, code, g, rule="even"))
        if _SIM:
            assert _launched(dtype)


@pytest.mark.parametrize("rule", _mx.RULES)
def test_every_mx_rule_and_both_fp6(rule):
    for code in (FP4, E2M3, E3M2):
        x = micro_weight((9, 64), BF16 if code is FP4 else np.dtype(np.float32), seed=3)
        assert_same(*_both(x, code, 32, rule=rule))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_nvfp4_global_scale_edges(dtype):
    """An all-zero weight (amax 0: the dtype's tiny), a weight of NaN/Inf only, and a tiny amax
    (float16 past its range: the float32 rule; float32 past its range: 1)."""
    finfo = np.finfo(np.float16) if dtype == np.float16 else np.finfo(np.float32)
    for x in (np.zeros((2, 16)), np.full((1, 16), np.nan), np.r_[[np.inf, -np.inf] * 8].reshape(1, 16),
              np.full((1, 32), float(finfo.smallest_subnormal)), np.full((1, 16), 1e-3)):
        assert_same(*_both(np.asarray(x, np.float32).astype(dtype), FP4, 16, nvfp4=True))
    # given global scales whose block scales clamp at 448, and round to 0 (0.125's byte then)
    x = micro_weight((7, 64), dtype, seed=2)
    for gs in (np.float32(1e4), np.float32(1e-6)):
        assert_same(*_both(x, FP4, 16, nvfp4=True, global_scale=gs))


def test_many_warps_in_turn(monkeypatch):
    """A grid of 2 blocks over a weight of 64 warps: each warp takes several turns."""
    monkeypatch.setattr(cuda_pass, "MAX_BLOCKS", 2)
    x = micro_weight((16, 128), np.dtype(np.float32), seed=5)
    assert_same(*_both(x, FP4, 16, nvfp4=True))
    assert_same(*_both(x, E2M3, 32, rule="even"))


def test_plan_refuses_what_the_kernel_does_not_take():
    with pytest.raises(ValueError, match="group_size 64"):
        cuda_pass.plan_micro((2, 128), "float32", FP4, 64, nvfp4=True)
    with pytest.raises(ValueError, match="code must be fp4 or fp6"):
        cuda_pass.plan_micro((2, 64), "float32", CODE_TYPES["float8_e4m3fn"], 32, mx_table=(0, 0, 0))
    with pytest.raises(ValueError, match="exactly one"):
        cuda_pass.plan_micro((2, 64), "float32", FP4, 32)
    with pytest.raises(ValueError, match="dtype must be"):
        cuda_pass.plan_micro((2, 64), "float64", FP4, 16, nvfp4=True)


def _cuda_device():
    from gpuq.checkpoints.env import pick_device

    return pick_device("cuda")


@pytest.mark.parametrize("name", ["nvfp4", "mxfp4", "mxfp6"])
def test_the_command_path_takes_the_kernel(name):
    """fused.quantize_weight on a CUDA device (the one-weight path, the stream's fallback)."""
    scheme = SCHEMES[name]
    device = _cuda_device()
    x = micro_weight((7, 64), BF16, seed=1)
    assert fused.covers(x, scheme, device, "minmax")
    from gpuq.checkpoints.env import HostDevice

    want = fused.quantize_weight(x, scheme, "m")
    got = fused.quantize_weight(x, scheme, "m", device=device)
    assert sorted(want[0]) == sorted(got[0])
    for k in want[0]:
        assert np.asarray(want[0][k]).tobytes() == np.asarray(got[0][k]).tobytes(), k
    assert want[2] == got[2]
    assert fused.covers(x, scheme, HostDevice(), "minmax")
    if _SIM:
        assert _launched(BF16)


# --- the command: --device cuda against --device cpu ----------------------------------------------

def _serving():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent / "serving"))
    import _serving

    return _serving


def _same_folders(a, b):
    files = sorted(p.name for p in a.iterdir())
    assert files == sorted(p.name for p in b.iterdir()) and len(files) >= 3
    for name in files:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def _micro_launches():
    import cupy

    return sum(r.name.startswith("gpuq::weight_micro<") for r in cupy._sim.launches)


@pytest.mark.parametrize("preset,dtype", [("NVFP4A16", "bfloat16"), ("MXFP4A16", "float16"),
                                          ("MXFP6A16", "float32")])
def test_the_command_on_cuda_writes_the_cpu_bytes(tmp_path, capsys, preset, dtype):
    """``gpuq quantize --format compressed-tensors --preset ...`` on both devices, NaN/+-Inf in
    one weight: the same files byte for byte (NVFP4: q/k/v and gate/up under their shared global
    scale, o and down under their own, computed on the GPU), the same report rows, every Linear
    weight through the kernel."""
    import json

    from report_rows import assert_same_rows

    sv = _serving()
    t = sv.make_model(tmp_path / "m", dtype=dtype, hidden=64, inter=128, layers=1, extra=False)
    k = next(n for n in t if n.endswith("k_proj.weight"))
    x = t[k].astype(np.float32)
    x[0, 3], x[1, :2], x[2, 5] = np.nan, np.inf, -np.inf
    t[k] = x.astype(t[k].dtype)
    from gpuq.checkpoints.files import write_checkpoint

    write_checkpoint(str(tmp_path / "m" / "model.safetensors"), "safetensors", t, None, {"format": "pt"})
    rows = {}
    for device in ("cpu", "cuda"):
        before = _micro_launches() if _SIM else 0
        assert sv.gpuq_main("quantize", tmp_path / "m", "-o", tmp_path / device, "--format", "compressed-tensors",
                            "--preset", preset, "--nonfinite", "allow", "--device", device, "-q", "--json") == 0
        rows[device] = json.loads(capsys.readouterr().out)["tensors"]
        if _SIM:
            assert _micro_launches() - before == (7 if device == "cuda" else 0)
    _same_folders(tmp_path / "cpu", tmp_path / "cuda")
    assert_same_rows(rows["cuda"], rows["cpu"])
    assert next(r for r in rows["cuda"] if r["name"] == k)["nonfinite"] == {"nan": 1, "posinf": 2, "neginf": 1}


def test_gpt_oss_experts_on_cuda_write_the_cpu_bytes(tmp_path):
    """``--format gpt-oss-mxfp4``: the experts' 3-D ``[E, in, out]`` tensors, one expert's
    ``[out, in]`` weight at a time through the kernel, NaN/Inf and an all-zero group included."""
    _serving()  # tests/serving on sys.path
    from test_gpt_oss import make_gpt_oss

    make_gpt_oss(tmp_path / "m", experts=2, hidden=64, inter=32, layers=1, dtype=BF16, nonfinite=True)
    reports = {}
    for device in ("cpu", "cuda"):
        before = _micro_launches() if _SIM else 0
        reports[device] = gpuq.checkpoints.quantize(tmp_path / "m", tmp_path / device, format="gpt-oss-mxfp4",
                                                    device=device, nonfinite="allow")
        if _SIM:
            assert _micro_launches() - before == (4 if device == "cuda" else 0)  # 2 tensors x 2 experts
    _same_folders(tmp_path / "cpu", tmp_path / "cuda")
    cpu, gpu = ({r["name"]: r for r in reports[d]["tensors"]} for d in ("cpu", "cuda"))
    assert gpu["model.layers.0.mlp.experts.gate_up_proj"]["nonfinite"] == {"nan": 1, "posinf": 1, "neginf": 1}
    for n, r in gpu.items():
        assert r["quantized"] == cpu[n]["quantized"]
        if r["quantized"]:
            assert r["nonfinite"] == cpu[n]["nonfinite"] and r["max_abs_error"] == cpu[n]["max_abs_error"]
            assert r["sqnr_db"] == pytest.approx(cpu[n]["sqnr_db"], abs=1e-9)
