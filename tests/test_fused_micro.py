"""The one pass for compressed-tensors' microscaling layouts (issue 40, point 1): NVFP4, MXFP4,
MXFP6 and MXFP8, the scales chosen in the pass (``weight_pass.micro_rows``).

Every stored byte must be the multi-pass path's (``gpuq.choose_qparams`` + ``gpuq.quantize``,
then the layout's packing): odd row counts, widths of a few groups, bfloat16/float16/float32,
NaN/Inf, all-zero and all-NaN groups, subnormal and saturating groups, every MX rule, NVFP4's
own and shared global scales. The counts and figures are a plain NumPy computation's from the
stored bytes (ml_dtypes decodes the codes).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

pytest.importorskip("numba")

import gpuq  # noqa: E402
from gpuq import _mx  # noqa: E402
from gpuq._codetypes import CODE_TYPES  # noqa: E402
from gpuq.backends.host import weight_pass  # noqa: E402
from gpuq.checkpoints import fused  # noqa: E402
from gpuq.checkpoints.env import HostDevice  # noqa: E402
from gpuq.checkpoints.formats.ct_microscaling import MX, NVFP4, scheme_for, unpack_fp6  # noqa: E402
from gpuq.checkpoints.serving import quantize as serving  # noqa: E402
from test_fused_weight import BF16, DTYPES, assert_same, multi_pass, one_pass, weight  # noqa: E402

FP4, FP6, FP8 = (CODE_TYPES[n] for n in ("float4_e2m1fn", "float6_e2m3fn", "float8_e4m3fn"))
SCHEMES = {"nvfp4": scheme_for(FP4, "nvfp4"), "mxfp4": scheme_for(FP4, "mx"), "mxfp6": scheme_for(FP6, "mx"),
           "mxfp8": scheme_for(FP8, "mx")}


def micro_weight(shape, dtype, seed):
    """:func:`test_fused_weight.weight` (NaN, +-Inf, zero, all-NaN and all-Inf rows, -0, a
    subnormal) with, where the shape allows, a group of subnormals, a group whose amax makes
    the MX rules round it past the element's largest value (saturated codes), and ties."""
    x = weight(shape, dtype, seed=seed).astype(np.float32)
    if shape[0] >= 7:
        x[5, :16] = 3e-39 if dtype != np.float16 else 1e-7  # a subnormal amax
        x[6, :32] = np.linspace(-1.0, 1.0, 32) * 7.9  # 7.9 = 1.975 * 4: "even" and ceil scale up, floor saturates
        x[6, 32:] = np.resize([0.25, 0.75, 2.5, -5.0, 1.25, -3.5], shape[1] - 32)  # e2m1 ties at scale 1
    return x.astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("name", list(SCHEMES))
def test_one_pass_writes_the_multi_pass_bytes(name, dtype, monkeypatch):
    scheme = SCHEMES[name]
    assert fused.covers(micro_weight((7, 96), dtype, 0), scheme, HostDevice(), "minmax")
    for shape in [(1, 32), (7, 96), (17, 160)] if scheme.group_size == 32 else [(1, 16), (7, 48), (17, 80)]:
        x = micro_weight(shape, dtype, seed=shape[0])
        before = x.tobytes()
        got = one_pass(x, scheme)
        assert x.tobytes() == before  # read, never written
        assert_same(multi_pass(x, scheme, monkeypatch), got)


@pytest.mark.parametrize("rule", ["floor", "ceil", "rceil"])
@pytest.mark.parametrize("name", ["mxfp4", "mxfp6", "mxfp8"])
def test_every_mx_rule(name, rule, monkeypatch):
    scheme = scheme_for(SCHEMES[name].code, "mx", scale_rule=rule)
    for dtype in (BF16, np.dtype(np.float32)):
        x = micro_weight((9, 96), dtype, seed=3)
        assert_same(multi_pass(x, scheme, monkeypatch), one_pass(x, scheme))
    if rule == "floor":  # the group of amax 7.9 = 1.975 * 4: floor's scale leaves it past the
        x = micro_weight((9, 96), np.float32, seed=3)  # largest code (6, 7.5, 448): saturated
        tensors, _, _ = one_pass(x, scheme)
        codes = decoded_codes(tensors, scheme, x.shape)
        assert np.abs(codes[6, :32]).max() == SCHEMES[name].code.qmax


def test_fp6_e3m2_codes_take_the_pass(monkeypatch):
    """compressed-tensors stores e2m3 fp6; the pass packs e3m2 the same way (gpuq's own rows)."""
    scheme = scheme_for(CODE_TYPES["float6_e3m2fn"], "mx")
    x = micro_weight((7, 64), np.float32, seed=4)
    assert_same(multi_pass(x, scheme, monkeypatch), one_pass(x, scheme))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_nvfp4_shared_global_scale(dtype, monkeypatch):
    """A merged layer's shared global scale (``shared_global_scales``) is the one stored and used."""
    x = micro_weight((5, 64), dtype, seed=5)
    gs = gpuq.global_scale(amax=40.0, float_dtype=dtype)
    with monkeypatch.context() as m:
        m.setattr(fused, "covers", lambda *a: False)
        want = serving.quantize_weight(x, SCHEMES["nvfp4"], HostDevice(), "m.weight", "allow", global_scale=gs)
    got = serving.quantize_weight(x, SCHEMES["nvfp4"], HostDevice(), "m.weight", "allow", global_scale=gs)
    assert_same(want, got)
    assert got[0]["m.weight_global_scale"].tolist() == [gs]


@pytest.mark.parametrize("dtype", [BF16, np.dtype(np.float16)], ids=lambda d: d.name)
def test_nvfp4_block_scale_rounds_amax_over_6_in_the_weights_dtype(dtype, monkeypatch):
    """``s_b = e4m3(gs * D(amax / 6))``: groups whose amax gives another e4m3 byte without the
    rounding to the weight's dtype ``D`` (found by ml_dtypes here) store the rounded rule's."""
    top = np.float32(np.float32(0.7).astype(dtype))  # the weight's amax, in row 0
    gs = gpuq.global_scale(amax=top, float_dtype=dtype)
    amax = (top * (np.arange(1, 4096) / 4096)).astype(np.float32).astype(dtype).astype(np.float32)

    def e4m3(t):
        return np.minimum(t, np.float32(448)).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)

    rounded = e4m3(gs * (amax / np.float32(6)).astype(dtype).astype(np.float32))
    differs = rounded != e4m3(gs * (amax / np.float32(6)))
    assert differs.sum() >= 4
    x = np.zeros((5, 16), np.float32)
    x[0, 0], x[1:, 3] = top, -amax[differs][:4]
    tensors, _, _ = got = one_pass(x.astype(dtype), SCHEMES["nvfp4"])
    assert tensors["m.weight_scale"].view(np.uint8)[1:, 0].tolist() == rounded[differs][:4].tolist()
    assert_same(multi_pass(x.astype(dtype), SCHEMES["nvfp4"], monkeypatch), got)


def test_nvfp4_float16_global_scale_past_float16(monkeypatch):
    """float16 weights of a tiny amax: ``D(1 / amax) * 2688`` overflows float16, and the global
    scale is the float32 rule's (``gpuq._nvfp4``); the block scales then saturate at 448."""
    x = (np.random.default_rng(6).standard_normal((3, 32)) * 1e-4).astype(np.float16)
    got = one_pass(x, SCHEMES["nvfp4"])
    assert got[0]["m.weight_global_scale"][0] > 65504
    assert_same(multi_pass(x, SCHEMES["nvfp4"], monkeypatch), got)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_finite_amax_is_numpys(dtype):
    """The merged layers' shared global scale reads ``max |x|`` of the finite values through
    ``fused.finite_amax``: NumPy's on the float32 values; 0 where none is finite."""
    for shape in [(1, 16), (7, 96), (17, 80)]:
        x = micro_weight(shape, dtype, seed=10)
        x32 = x.astype(np.float32)
        got = fused.finite_amax(x)
        assert got.dtype == np.float32 and got == np.abs(x32[np.isfinite(x32)]).max()
    assert fused.finite_amax(np.full((2, 16), np.nan, dtype)) == 0
    assert fused.finite_amax(np.zeros((4, 6), dtype)[:, ::2]) is None  # not C-order: the caller's NumPy
    previous = gpuq.set_host_kernels("numpy")
    try:
        assert fused.finite_amax(np.ones((2, 16), dtype)) is None
    finally:
        gpuq.set_host_kernels(previous)


def test_reused_buffers_hold_nothing_of_the_last_weight(monkeypatch):
    buffers = fused.Buffers()
    buffers.array("codes", (1 << 14,), np.uint8)[:] = 0xFF
    for name in SCHEMES:
        x = micro_weight((7, 96), BF16, seed=7)
        assert_same(multi_pass(x, SCHEMES[name], monkeypatch), one_pass(x, SCHEMES[name], buffers))


def decoded_codes(tensors, scheme, shape):
    """The codes' values (float32, ``[out, in]``) decoded from the stored bytes by ml_dtypes."""
    stored = tensors[f"m.{scheme.layout.params(scheme)[0]}"]
    if scheme.code.bits == 4:
        b = stored.view(np.uint8)
        nibbles = np.stack([b & 0xF, b >> 4], -1).reshape(shape)
        return nibbles.view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    if scheme.code.bits == 6:
        return unpack_fp6(stored).view(ml_dtypes.float6_e2m3fn).astype(np.float32)
    return stored.astype(np.float32)


def stored_scales(tensors, scheme):
    """The float32 scales the codes dequantize with, from the stored bytes."""
    sb = tensors["m.weight_scale"]
    if scheme.layout is NVFP4:
        gs = tensors["m.weight_global_scale"][0]
        return (sb.astype(np.float32) / gs).astype(np.float32)
    return np.ldexp(np.float32(1), sb.view(np.uint8).astype(np.int32) - 127).astype(np.float32)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("name", list(SCHEMES))
def test_counts_and_figures_are_numpys(name, dtype):
    scheme = SCHEMES[name]
    x = micro_weight((7, 96), dtype, seed=8)
    tensors, stats, counts = one_pass(x, scheme)
    x_hat = decoded_codes(tensors, scheme, x.shape) * np.repeat(stored_scales(tensors, scheme), scheme.group_size, 1)
    x32 = x.astype(np.float32)
    keep = np.isfinite(x32)
    a = x32[keep].astype(np.float64)
    d = a - x_hat[keep].astype(np.float64)
    assert counts == {"nan": int(np.isnan(x32).sum()), "posinf": int((x32 == np.inf).sum()),
                      "neginf": int((x32 == -np.inf).sum())} == {"nan": 97, "posinf": 49, "neginf": 49}
    assert stats["max_abs_error"] == float(np.abs(d).max())
    assert stats["signal"] == pytest.approx(float((a * a).sum()), rel=1e-12, abs=0.0)
    assert stats["error"] == pytest.approx(float((d * d).sum()), rel=1e-12, abs=0.0)


def test_an_all_nan_weight_has_no_figures(monkeypatch):
    x = np.full((2, 32), np.nan, np.float32)
    for name in SCHEMES:
        got = one_pass(x, SCHEMES[name])
        assert got[2] == {"nan": 64, "posinf": 0, "neginf": 0}
        assert all(np.isnan(v) for v in got[1].values())
        assert_same(multi_pass(x, SCHEMES[name], monkeypatch), got)


@pytest.mark.parametrize("rule", _mx.RULES)
@pytest.mark.parametrize("code", ["float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn", "float8_e4m3fn"])
def test_the_mx_rule_table_is_mx_exponents(code, rule):
    """The pass's table of the MX rule gives ``mx_exponents``' byte for every finite amax >= 0
    tried: random bits, each binade's ends, each step and its neighbours, subnormals, 0."""
    first, step, values = _mx.mx_rule_table(code, rule)
    steps = step[step != 0xFFFFFFFF].astype(np.int64)
    ends = (np.arange(255, dtype=np.int64) << 23)[:, None] + [0, 1, 0x7FFFFE, 0x7FFFFF]
    rand = np.random.default_rng(9).integers(0, 0x7F800000, 1 << 16)
    a = np.concatenate([rand, ends.ravel(), steps - 1, steps, steps + 1, [0, 1, 0x7FFFFF]]).astype(np.uint32)
    want = _mx.mx_exponents(a.view(np.float32), code, rule) + 127
    e = a >> 23
    got = first[e].astype(np.int64) + (a >= step[e])
    assert (got == want).all()
    assert (values[got] == _mx.mx_scales(-a.view(np.float32), a.view(np.float32), code, rule)).all()


def test_covers_only_its_cases():
    x, host = np.zeros((4, 64), np.float32), HostDevice()
    for name in SCHEMES:
        assert fused.covers(x, SCHEMES[name], host, "minmax")
        assert not fused.covers(x, SCHEMES[name], host, "mse")
        assert not fused.covers(x.astype(np.float64), SCHEMES[name], host, "minmax")
        assert not fused.covers(x[:, :48], SCHEMES[name], host, "minmax")  # not C-order
    assert not fused.covers(np.zeros((4, 48), np.float32), SCHEMES["mxfp4"], host, "minmax")  # 48 % 32
    gpu = type("Gpu", (), {"name": "cuda"})()
    assert fused.covers(x, SCHEMES["nvfp4"], gpu, "minmax")  # the GPU's kernel: tests/test_fused_cuda_micro.py
    assert not fused.covers(x, SCHEMES["nvfp4"], gpu, "mse")  # the multi-pass path on a GPU


def with_and_without(monkeypatch, spied, run):
    """``[run("one"), run("multi")]``, the first with the one pass, the second with it turned
    off, and the names of the runs that called ``fused.<spied>``."""
    results, calls = [], []
    real = getattr(fused, spied)
    for name, fused_on in (("one", True), ("multi", False)):
        with monkeypatch.context() as m:
            m.setattr(fused, spied, lambda *a, **k: calls.append(name) or real(*a, **k))
            if not fused_on:
                m.setattr(fused, "covers", lambda *a: False)
            results.append(run(name))
    return results, calls


@pytest.mark.parametrize("preset,dtype", [("NVFP4A16", "bfloat16"), ("NVFP4A16", "float16"),
                                          ("MXFP4A16", "bfloat16"), ("MXFP6A16", "float32"),
                                          ("MXFP8A16", "bfloat16")])
def test_the_command_writes_the_same_folder(tmp_path, capsys, monkeypatch, preset, dtype):
    """``gpuq quantize --format compressed-tensors --preset ...`` end to end, with and without
    the one pass: the same files byte for byte (q/k/v and gate/up share NVFP4's global scale),
    the same report within its printed digits."""
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent / "serving"))
    from _serving import gpuq_main, make_model, tree

    make_model(tmp_path / "m", dtype=dtype, inter=256, extra=False)
    def run(name):
        assert gpuq_main("quantize", tmp_path / "m", "-o", tmp_path / name, "--format", "compressed-tensors",
                         "--preset", preset, "--device", "cpu", "-q", "--json") == 0
        return json.loads(capsys.readouterr().out)

    reports, calls = with_and_without(monkeypatch, "quantize_weight", run)
    assert calls == ["one"] * 7  # every Linear weight took the one pass, then none did
    assert tree(tmp_path / "one") == tree(tmp_path / "multi")
    one, multi = ({r["name"]: r for r in rep["tensors"]} for rep in reports)
    for n, r in one.items():
        if r["quantized"]:
            assert r["max_abs_error"] == multi[n]["max_abs_error"]
            assert round(r["sqnr_db"], 2) == round(multi[n]["sqnr_db"], 2)


@pytest.mark.parametrize("rule", ["even", "rceil"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_gpt_oss_experts_take_the_one_pass(tmp_path, monkeypatch, dtype, rule):
    """``--format gpt-oss-mxfp4``: each expert's ``[out, in]`` weight (3-D ``[E, in, out]``
    tensors) through the pass, NaN/Inf and an all-zero group included: the same folder and
    report as the multi-pass path."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent / "serving"))
    from _serving import tree
    from test_gpt_oss import make_gpt_oss

    make_gpt_oss(tmp_path / "m", experts=2, hidden=64, inter=32, layers=1, dtype=dtype, nonfinite=True)
    reports, calls = with_and_without(monkeypatch, "micro_bytes", lambda name: gpuq.checkpoints.quantize(
        tmp_path / "m", tmp_path / name, format="gpt-oss-mxfp4", scale_rule=rule, device="cpu", nonfinite="allow"))
    assert calls == ["one"] * 4  # 2 expert tensors of 2 experts, then none
    assert tree(tmp_path / "one") == tree(tmp_path / "multi")
    one, multi = ({r["name"]: r for r in rep["tensors"]} for rep in reports)
    assert one["model.layers.0.mlp.experts.gate_up_proj"]["nonfinite"] == {"nan": 1, "posinf": 1, "neginf": 1}
    for n, r in one.items():
        if r["quantized"]:
            assert r["nonfinite"] == multi[n]["nonfinite"] and r["max_abs_error"] == multi[n]["max_abs_error"]
            assert round(r["sqnr_db"], 2) == round(multi[n]["sqnr_db"], 2)
