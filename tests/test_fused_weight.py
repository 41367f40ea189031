"""The one-pass quantization of a model-folder weight (issue 40, point 1: ``gpuq.checkpoints.fused``).

It must write what the multi-pass path writes, byte for byte (odd widths, bfloat16/float16/
float32, NaN/Inf, all-zero and all-NaN rows, zero points, every scale dtype), and its counts and
figures must be a plain NumPy computation's (the sums in another order: within 1e-12).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

pytest.importorskip("numba")

import gpuq  # noqa: E402
from gpuq.checkpoints import fused  # noqa: E402
from gpuq.checkpoints.env import HostDevice  # noqa: E402
from gpuq.checkpoints.files import Checkpoint, CliError, write_checkpoint  # noqa: E402
from gpuq.checkpoints.formats.compressed_tensors import NAIVE, PACK  # noqa: E402
from gpuq.checkpoints.formats.fp8_blocks import FP8_BLOCKS  # noqa: E402
from gpuq.checkpoints.serving import quantize as serving  # noqa: E402
from gpuq.checkpoints.serving.formats import WeightScheme, fp8_code, int_code  # noqa: E402
from gpuq.checkpoints.serving.packing import unpack_rows  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [BF16, np.dtype(np.float16), np.dtype(np.float32)]
SCHEMES = {
    "int4-g128-sym-bf16": WeightScheme(int_code(4), "group", True, "bfloat16", PACK, group_size=128),
    "int4-g32-asym-bf16": WeightScheme(int_code(4), "group", False, "bfloat16", PACK, group_size=32),
    "int4-channel-sym-f32": WeightScheme(int_code(4), "channel", True, "float32", PACK),
    "int4-channel-asym-f16": WeightScheme(int_code(4), "channel", False, "float16", PACK),
    "int8-channel-sym-f16": WeightScheme(int_code(8), "channel", True, "float16", PACK),
    "int8-channel-asym-bf16": WeightScheme(int_code(8), "channel", False, "bfloat16", PACK),
    "int8-g64-sym-f32": WeightScheme(int_code(8), "group", True, "float32", PACK, group_size=64),
    "fp8-channel-bf16": WeightScheme(fp8_code(), "channel", True, "bfloat16", NAIVE),
    "fp8-channel-f32": WeightScheme(fp8_code(), "channel", True, "float32", NAIVE),
    "fp8-tensor-bf16": WeightScheme(fp8_code(), "tensor", True, "bfloat16", NAIVE),
    "fp8-tensor-f16": WeightScheme(fp8_code(), "tensor", True, "float16", NAIVE),
}
SHAPES = [(1, 128), (3, 256), (5, 77), (17, 384), (4, 130)]


def weight(shape, dtype, seed=0, special=True):
    """Gaussian weights with NaN, +-Inf, an all-zero row, an all-NaN row, an all-Inf row, -0 and
    a subnormal where the shape allows."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 0.02).astype(np.float32)
    x[0, :: max(1, shape[1] // 5)] *= 40  # a few outliers: codes at the ends of the range
    if special and shape[0] >= 3:
        x[0, 1] = np.nan
        x[1, 2], x[1, 3] = np.inf, -np.inf
        x[2] = 0.0
    if special and shape[0] >= 4:
        x[3] = np.nan
        x[0, 2], x[1, 4] = -0.0, -1e-40  # a negative zero, a subnormal (float32 and bfloat16)
    if special and shape[0] >= 5:
        x[4, ::2], x[4, 1::2] = np.inf, -np.inf  # a row with no finite value
    return x.astype(dtype)


def multi_pass(x, scheme, monkeypatch):
    """The multi-pass path's answer (the fused pass turned off)."""
    with monkeypatch.context() as m:
        m.setattr(fused, "covers", lambda *a: False)
        return serving.quantize_weight(x, scheme, HostDevice(), "m.weight", nonfinite="allow")


def one_pass(x, scheme, buffers=None):
    assert fused.covers(x, scheme, HostDevice(), "minmax")
    return serving.quantize_weight(x, scheme, HostDevice(), "m.weight", nonfinite="allow", buffers=buffers)


def assert_same(a, b):
    ta, sa, ca = a
    tb, sb, cb = b
    assert list(ta) == list(tb)
    for k in ta:
        assert ta[k].dtype == tb[k].dtype and ta[k].shape == tb[k].shape, k
        assert ta[k].tobytes() == tb[k].tobytes(), k
    assert ca == cb
    if np.isnan(sa["signal"]):
        assert all(np.isnan(v) for v in sb.values())
        return
    assert sa["max_abs_error"] == sb["max_abs_error"]
    for k in ("signal", "error"):  # the float64 sums, in another order
        assert sb[k] == pytest.approx(sa[k], rel=1e-12, abs=0.0)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("name", list(SCHEMES))
def test_one_pass_writes_the_multi_pass_bytes(name, dtype, monkeypatch):
    scheme = SCHEMES[name]
    for shape in SHAPES:
        if scheme.strategy == "group" and shape[1] % scheme.group_size:
            continue
        x = weight(shape, dtype)
        before = x.tobytes()
        got = one_pass(x, scheme)
        assert x.tobytes() == before  # the input is read, never written
        assert_same(multi_pass(x, scheme, monkeypatch), got)


def numpy_figures(x, tensors, scheme):
    """Counts and figures by plain NumPy from what was stored: the codes decoded (int words by
    ``unpack_rows``, fp8 by ml_dtypes), dequantized in float32, compared in float64."""
    x32 = x.astype(np.float32)
    if scheme.code.codec == "float8":
        codes = tensors["m.weight"].astype(np.float32)
        zps = 0.0
    else:
        codes = unpack_rows(tensors["m.weight_packed"], scheme.code.bits, x.shape[1]).astype(np.float32)
        zps = 0.0
        if not scheme.symmetric:
            zp = tensors["m.weight_zero_point"]
            zps = unpack_rows(np.ascontiguousarray(zp.T), scheme.code.bits, x.shape[0]).T.astype(np.float32)
    scales = tensors["m.weight_scale"].astype(np.float32).reshape(-1, tensors["m.weight_scale"].shape[-1])
    g = x.shape[1] // scales.shape[1]
    s = np.repeat(scales, g, axis=1)
    z = np.repeat(zps, g, axis=1) if np.ndim(zps) else zps
    x_hat = (codes - z) * s
    keep = np.isfinite(x32)
    a = x32[keep].astype(np.float64)
    d = a - x_hat[keep].astype(np.float64)
    counts = {"nan": int(np.isnan(x32).sum()), "posinf": int((x32 == np.inf).sum()),
              "neginf": int((x32 == -np.inf).sum())}
    return counts, float((a * a).sum()), float((d * d).sum()), float(np.abs(d).max())


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("name", ["int4-g128-sym-bf16", "int4-channel-asym-f16", "fp8-channel-bf16",
                                  "fp8-tensor-bf16"])
def test_counts_and_figures_are_numpys(name, dtype):
    scheme = SCHEMES[name]
    x = weight((6, 256), dtype, seed=1)
    tensors, stats, counts = one_pass(x, scheme)
    want_counts, signal, error, max_err = numpy_figures(x, tensors, scheme)
    assert counts == want_counts == {"nan": 257, "posinf": 129, "neginf": 129}
    assert stats["max_abs_error"] == max_err
    assert stats["signal"] == pytest.approx(signal, rel=1e-12, abs=0.0)
    assert stats["error"] == pytest.approx(error, rel=1e-12, abs=0.0)


def test_an_all_nan_weight_has_no_figures(monkeypatch):
    x = np.full((2, 128), np.nan, np.float32)
    got = one_pass(x, SCHEMES["int4-g128-sym-bf16"])
    assert got[2] == {"nan": 256, "posinf": 0, "neginf": 0}
    assert all(np.isnan(v) for v in got[1].values())
    assert_same(multi_pass(x, SCHEMES["int4-g128-sym-bf16"], monkeypatch), got)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("bits", [4, 8])
def test_full_range_rule_is_choose_qparams_and_quantize(bits, dtype):
    """``scale_rule="full"`` (what the command's int4 default passes): the scales are
    choose_qparams', the codes gpuq.quantize's, packed as compressed-tensors packs them."""
    from gpuq.checkpoints.serving.packing import pack_rows

    scheme = WeightScheme(int_code(bits), "group", True, "bfloat16", PACK, group_size=32)
    x = weight((5, 96), dtype, seed=2, special=False)
    x[1, 0] = -((1 << bits) - 1) / 2 / 256  # a group of max|x| = 7.5 (127.5) * 2**-8: -7.5 -> -8 (-128)
    x[1, 1:32] = 0
    tensors, _, _ = fused.quantize_weight(x, scheme, "m", scale_rule="full")
    s, _ = gpuq.choose_qparams(x, dtype=f"int{bits}", symmetric=True, axis=1, group_size=32,
                               scale_dtype="bfloat16", scale_rule="full")
    q = gpuq.quantize(x, s, dtype=f"int{bits}", axis=1, group_size=32)
    q = gpuq.unpack(q) if isinstance(q, gpuq.Codes) else q
    assert tensors["m.weight_scale"].astype(np.float32).tobytes() == np.asarray(s).tobytes()
    assert tensors["m.weight_packed"].tobytes() == pack_rows(q, bits).tobytes()
    assert (q == -(1 << (bits - 1))).any()  # the rule reaches the lowest code


def test_reused_buffers_hold_nothing_of_the_last_weight(monkeypatch):
    """Padding words of a row and codes come out the same after a larger weight filled the
    buffers (with all-ones bits here)."""
    buffers = fused.Buffers()
    buffers.array("codes", (1 << 16,), np.uint8)[:] = 0xFF
    for name, shape in [("int4-channel-sym-f32", (5, 77)), ("int8-channel-asym-bf16", (3, 130)),
                        ("fp8-channel-bf16", (4, 130))]:
        x = weight(shape, BF16, seed=3)
        assert_same(multi_pass(x, SCHEMES[name], monkeypatch), one_pass(x, SCHEMES[name], buffers))


def test_a_scale_the_scale_dtype_cannot_hold_takes_the_multi_pass_words(monkeypatch):
    """float16 scales of a weight near float32's largest: the pass declines, and the command
    says what the multi-pass path says."""
    scheme = SCHEMES["int8-channel-sym-f16"]
    x = np.full((2, 64), 1e30, np.float32)
    assert fused.quantize_weight(x, scheme, "m") is None
    with pytest.raises(CliError) as fast:
        serving.quantize_weight(x, scheme, HostDevice(), "m.weight")
    with pytest.raises(CliError) as slow:
        multi_pass(x, scheme, monkeypatch)
    assert str(fast.value) == str(slow.value)


def test_nonfinite_error_refuses_the_weight():
    x = weight((3, 128), np.float32)
    with pytest.raises(CliError, match="has 3 non-finite values"):
        serving.quantize_weight(x, SCHEMES["int4-g128-sym-bf16"], HostDevice(), "m.weight", nonfinite="error")
    lines = []
    serving.quantize_weight(x, SCHEMES["int4-g128-sym-bf16"], HostDevice(), "m.weight", warn=lines.append)
    assert len(lines) == 1 and "has 3 non-finite values" in lines[0]


def test_covers_only_its_cases():
    x = np.zeros((4, 256), np.float32)
    host, s = HostDevice(), SCHEMES["int4-g128-sym-bf16"]
    assert fused.covers(x, s, host, "minmax")
    assert fused.covers(x, s, host, "mse")  # the search's scales, then the pass
    assert not fused.covers(x, s, host, "percentile")
    assert not fused.covers(x.astype(np.float64), s, host, "minmax")
    assert not fused.covers(x[:, ::2], SCHEMES["int8-channel-sym-f16"], host, "minmax")  # not C-order
    assert not fused.covers(x, WeightScheme(fp8_code(), "block", True, "float32", NAIVE, block=(128, 128)),
                            host, "minmax")
    assert not fused.covers(x, WeightScheme(int_code(4), "group", True, "bfloat16", PACK, group_size=4),
                            host, "minmax")  # a group that starts inside a word
    gpu = type("Gpu", (), {"name": "cuda"})()
    # a GPU: the GPU's pass (gpuq.checkpoints.fused_cuda, tests/test_fused_cuda.py): min/max, or the
    # search's scales given to it; not float64 weights
    assert fused.covers(x, s, gpu, "minmax") and fused.covers(x, s, gpu, "mse")
    assert not fused.covers(x.astype(np.float64), s, gpu, "minmax")
    previous = gpuq.set_host_kernels("numpy")
    try:
        assert not fused.covers(x, s, host, "minmax")
    finally:
        gpuq.set_host_kernels(previous)


def test_load_into_a_buffer(tmp_path):
    path = str(tmp_path / "w.safetensors")
    w = weight((3, 40), BF16, special=False)
    write_checkpoint(path, "safetensors", {"w": w}, None)
    with Checkpoint(path) as ckpt:
        b = fused.Buffers()
        assert ckpt.load("w", out=b.array("in", (3, 40), BF16)).tobytes() == w.tobytes()
        assert ckpt.mapped("w").tobytes() == w.tobytes()
        with pytest.raises(ValueError, match="out must be a C-order bfloat16"):
            ckpt.load("w", out=np.empty((3, 41), BF16))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("options", [("--dtype", "int4"), ("--dtype", "int8", "--asymmetric"),
                                     ("--dtype", "float8_e4m3fn"), ("--dtype", "float8_e4m3fn", "--per-tensor")],
                         ids=["int4", "int8-asym", "fp8", "fp8-tensor"])
def test_the_command_writes_the_same_folder(tmp_path, capsys, monkeypatch, dtype, options):
    """``gpuq quantize --format compressed-tensors`` end to end, with and without the one pass:
    the same files byte for byte, the same report within its printed digits."""
    import json
    import os
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent / "serving"))
    from _serving import gpuq_main, make_model, tree

    make_model(tmp_path / "m", dtype=dtype, inter=256, extra=False)
    reports, calls = [], []
    real = fused.quantize_weight
    for name, fused_on in (("one", True), ("multi", False)):
        with monkeypatch.context() as m:
            m.setattr(fused, "quantize_weight", lambda *a, **k: calls.append(name) or real(*a, **k))
            if not fused_on:
                m.setattr(fused, "covers", lambda *a: False)
            assert gpuq_main("quantize", tmp_path / "m", "-o", tmp_path / name, "--format", "compressed-tensors",
                             "--device", "cpu", "-q", "--json", *options) == 0
        reports.append(json.loads(capsys.readouterr().out))
    assert calls == ["one"] * 7  # every Linear weight took the one pass, then none did
    assert tree(tmp_path / "one") == tree(tmp_path / "multi")
    assert os.listdir(tmp_path / "one")
    one, multi = ({r["name"]: r for r in rep["tensors"]} for rep in reports)
    assert sum(r["quantized"] for r in one.values()) == 7
    for n, r in one.items():
        if r["quantized"]:
            assert r["max_abs_error"] == multi[n]["max_abs_error"]
            assert round(r["sqnr_db"], 2) == round(multi[n]["sqnr_db"], 2)


BLOCKS = {b: WeightScheme(fp8_code(), "block", True, "float32", FP8_BLOCKS, block=b) for b in [(128, 128), (4, 32)]}


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("block", list(BLOCKS), ids=lambda b: f"{b[0]}x{b[1]}")
def test_fp8_blocks_take_one_pass_with_the_multi_pass_bytes(block, dtype, monkeypatch):
    """Fine-grained fp8: ragged edge blocks, blocks holding NaN/Inf, all-NaN and zero rows."""
    scheme = BLOCKS[block]
    shapes = [(1, 128), (130, 300)] if block == (128, 128) else [(1, 128), (5, 77), (9, 64), (17, 100)]
    for shape in shapes:
        x = weight(shape, dtype, seed=5)
        before = x.tobytes()
        got = one_pass(x, scheme)
        assert x.tobytes() == before
        assert_same(multi_pass(x, scheme, monkeypatch), got)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_fp8_block_counts_and_figures_are_numpys(dtype):
    scheme = BLOCKS[(4, 32)]
    x = weight((9, 80), dtype, seed=6)
    tensors, stats, counts = one_pass(x, scheme)
    s = np.repeat(np.repeat(tensors["m.weight_scale_inv"], 4, axis=0), 32, axis=1)[:9, :80]
    x_hat = tensors["m.weight"].astype(np.float32) * s
    x32 = x.astype(np.float32)
    keep = np.isfinite(x32)
    a = x32[keep].astype(np.float64)
    d = a - x_hat[keep].astype(np.float64)
    assert counts == {"nan": int(np.isnan(x32).sum()), "posinf": int((x32 == np.inf).sum()),
                      "neginf": int((x32 == -np.inf).sum())}
    assert counts["nan"] >= 80
    assert stats["max_abs_error"] == float(np.abs(d).max())
    assert stats["signal"] == pytest.approx(float((a * a).sum()), rel=1e-12, abs=0.0)
    assert stats["error"] == pytest.approx(float((d * d).sum()), rel=1e-12, abs=0.0)


def multi_pass_mse(x, scheme, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(fused, "covers", lambda *a: False)
        return serving.quantize_weight(x, scheme, HostDevice(), "m.weight", nonfinite="allow", method="mse")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("name", ["int4-g32-asym-bf16", "int8-channel-sym-f16", "fp8-channel-bf16"])
def test_mse_search_scales_then_the_one_pass(name, dtype, monkeypatch):
    """``--calibrate mse``: the search's scales (NaN/Inf rows included), then the pass's codes."""
    scheme = SCHEMES[name]
    assert fused.covers(weight((5, 96), dtype), scheme, HostDevice(), "mse")
    for shape in [(5, 96), (1, 128)]:
        x = weight(shape, dtype, seed=7)
        got = serving.quantize_weight(x, scheme, HostDevice(), "m.weight", nonfinite="allow", method="mse")
        assert_same(multi_pass_mse(x, scheme, monkeypatch), got)
    assert not fused.covers(weight((5, 96), dtype), BLOCKS[(4, 32)], HostDevice(), "mse")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("rule", ["even", "floor", "rceil"])
def test_mxfp8_takes_the_library_scales_then_the_one_pass(rule, dtype, monkeypatch):
    """compressed-tensors' mxfp8-quantized: choose_qparams' e8m0 scales, the pass's fp8 bytes."""
    from gpuq.checkpoints.formats.ct_microscaling import MX

    scheme = WeightScheme(fp8_code(), "group", True, "float8_e8m0fnu", MX[8], group_size=32, scale_rule=rule)
    for shape in [(1, 32), (5, 96), (4, 128)]:
        x = weight(shape, dtype, seed=8)
        x[-1, :32] = 3e-39 if dtype != np.float16 else 1e-7  # a group whose amax is subnormal
        assert_same(multi_pass(x, scheme, monkeypatch), one_pass(x, scheme))
    assert not fused.covers(weight((5, 96), dtype), scheme, HostDevice(), "mse")
