"""The one pass over a tensor of gpuq's own files (issue 40, point 1: ``fused.quantize_file_tensor``).

It must store what the multi-pass path (``convert.quantize_tensor``) stores, byte for byte: int8/
uint8 bytes, int4/uint4 nibbles, fp8 bytes in both file formats, per tensor, per channel, the
multi-axis scheme and groups, both int rules; odd widths, bfloat16/float16/float32, NaN/Inf,
all-zero and all-NaN rows. Its counts and figures are a plain NumPy computation's, the command's
files the same with the pass on or off, locally and shard by shard (what ``--workers`` runs).
"""

from __future__ import annotations

import contextlib
import json
import os

import ml_dtypes
import numpy as np
import pytest

pytest.importorskip("numba")

from gpuq.checkpoints import convert, fused  # noqa: E402
from gpuq.checkpoints.env import HostDevice  # noqa: E402
from gpuq.checkpoints.files import Checkpoint, CliError, write_checkpoint  # noqa: E402
from gpuq.checkpoints.quantized import param_shape, scheme_for  # noqa: E402
from gpuq.checkpoints.selection import Plan  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [BF16, np.dtype(np.float16), np.dtype(np.float32)]


def scheme(dtype, symmetric, axis, group=None, shape=(2, 2), rule=None):
    s = scheme_for(dtype, symmetric, axis, group, shape)
    return {**s, "scale_rule": "full"} if rule else s


#: name -> (scheme maker of a shape, shapes)
CASES = {
    "int8-channel-sym": (lambda sh: scheme("int8", True, 0), [(1, 128), (5, 77), (17, 384)]),
    "int8-channel-asym": (lambda sh: scheme("int8", False, 0), [(3, 256), (5, 77)]),
    "uint8-channel-sym": (lambda sh: scheme("uint8", True, 0), [(5, 77), (4, 130)]),
    "uint8-tensor-asym": (lambda sh: scheme("uint8", False, None), [(5, 77), (17, 384)]),
    "int8-g64-full": (lambda sh: scheme("int8", True, 1, 64, rule="full"), [(3, 256), (5, 64)]),
    "int4-g128-full": (lambda sh: scheme("int4", True, len(sh) - 1, 128, sh, "full"), [(3, 256), (2, 3, 128)]),
    "int4-g128-narrow": (lambda sh: scheme("int4", True, 1, 128, sh), [(17, 384), (1, 128)]),
    "int4-g32-asym": (lambda sh: scheme("int4", False, 1, 32, sh), [(5, 96), (4, 128)]),
    "uint4-channel-sym": (lambda sh: scheme("uint4", True, 0, None, sh), [(5, 78), (4, 130)]),
    "int4-tensor-asym": (lambda sh: scheme("int4", False, None, None, sh), [(5, 78), (1, 2)]),
    "int8-multi-axis": (lambda sh: scheme("int8", False, [0, 1]), [(2, 3, 77), (4, 5, 64)]),
    "e4m3-channel": (lambda sh: scheme("float8_e4m3fn", True, 0), [(1, 128), (5, 77), (17, 384)]),
    "e5m2-tensor": (lambda sh: scheme("float8_e5m2", True, None), [(5, 77), (4, 130)]),
    "e4m3-g32": (lambda sh: scheme("float8_e4m3fn", True, 1, 32), [(5, 96)]),
}


def tensor(shape, dtype, seed=0, special=True):
    """Gaussian values with a few outliers and, where the shape allows, NaN, +-Inf, an all-zero
    row, an all-NaN row, -0, a subnormal and a row with no finite value."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 0.02).astype(np.float32)
    m = x.reshape(-1, shape[-1])
    m[0, :: max(1, shape[-1] // 5)] *= 40
    if special and m.shape[0] >= 3 and shape[-1] >= 5:
        m[0, 1] = np.nan
        m[1, 2], m[1, 3] = np.inf, -np.inf
        m[2] = 0.0
    if special and m.shape[0] >= 4 and shape[-1] >= 5:
        m[3] = np.nan
        m[0, 2], m[1, 4] = -0.0, -1e-40
    if special and m.shape[0] >= 5:
        m[4, ::2], m[4, 1::2] = np.inf, -np.inf
    return x.astype(dtype)


def multi_pass(x, s, fmt):
    """The multi-pass path's stored arrays: ``convert.quantize_tensor``, its codes as stored."""
    q, scales, zps, stats, counts = convert.quantize_tensor(x, s, HostDevice(), nonfinite="allow")
    return convert.stored_codes(q, s, fmt), scales, zps, stats, counts


def one_pass(x, s, fmt, buffers=None):
    assert fused.covers_file(x, s, HostDevice(), "minmax")
    return fused.quantize_file_tensor(x, s, fmt, buffers)


def same_array(a, b, shape=None):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype
    if shape is not None:
        a, b = a.reshape(shape), b.reshape(shape)
    assert a.shape == b.shape and a.tobytes() == b.tobytes()


def assert_same(x, s, want, got):
    pshape = param_shape(x.shape, s["axis"], s["group_size"])
    same_array(want[0], got[0])
    same_array(want[1], got[1], pshape)
    assert (want[2] is None) == (got[2] is None)
    if want[2] is not None:
        same_array(want[2], got[2], pshape)
    assert want[4] == got[4]
    sa, sb = want[3], got[3]
    if np.isnan(sa["signal"]):
        assert all(np.isnan(v) for v in sb.values())
        return
    assert sa["max_abs_error"] == sb["max_abs_error"]
    for k in ("signal", "error"):  # float64 sums in another order
        assert sb[k] == pytest.approx(sa[k], rel=1e-12, abs=0.0)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("name", list(CASES))
def test_one_pass_stores_the_multi_pass_bytes(name, dtype):
    make, shapes = CASES[name]
    for shape in shapes:
        s = make(shape)
        x = tensor(shape, dtype)
        before = x.tobytes()
        for fmt in ("safetensors", "npz"):
            got = one_pass(x, s, fmt)
            assert x.tobytes() == before  # read, never written
            assert_same(x, s, multi_pass(x, s, fmt), got)


def test_buffers_reused_across_tensors_hold_nothing_of_the_last():
    buffers = fused.Buffers()
    buffers.array("codes", (1 << 16,), np.uint8)[:] = 0xFF
    for name in ("int4-g32-asym", "uint4-channel-sym", "int8-channel-asym", "e4m3-channel"):
        make, shapes = CASES[name]
        x = tensor(shapes[-1], BF16, seed=4)
        s = make(x.shape)
        assert_same(x, s, multi_pass(x, s, "safetensors"), one_pass(x, s, "safetensors", buffers))


def decode(codes, s, shape):
    """The stored codes as float32 values, by plain NumPy (nibbles split by hand)."""
    dtype = s["dtype"]
    raw = np.asarray(codes)
    if dtype.startswith("float8"):
        return raw.view(np.uint8).view(getattr(ml_dtypes, dtype)).astype(np.float32).reshape(shape)
    if dtype in ("int4", "uint4"):
        b = raw.view(np.uint8).astype(np.int32)
        q = np.stack([b & 15, b >> 4], axis=1).reshape(-1)[:int(np.prod(shape))]
        if dtype == "int4":
            q = np.where(q >= 8, q - 16, q)
        return q.astype(np.float32).reshape(shape)
    return raw.astype(np.float32).reshape(shape)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("name", ["int4-g32-asym", "uint8-tensor-asym", "int8-multi-axis", "e4m3-channel"])
def test_counts_and_figures_are_numpys(name, dtype):
    make, shapes = CASES[name]
    shape = (6, 128) if len(shapes[0]) == 2 else (2, 3, 128)
    x = tensor(shape, dtype, seed=1)
    s = make(shape)
    codes, scales, zps, stats, counts = one_pass(x, s, "safetensors")
    rows, n, strategy, g = fused.file_geometry(shape, s)
    q = decode(codes, s, shape).reshape(rows, n)

    def per_element(p):  # one parameter a tensor, a row or a group, spread over the elements
        p = np.asarray(p, np.float32)
        return np.full((rows, n), p.ravel()[0]) if strategy == "tensor" else np.repeat(p.reshape(rows, -1), g, axis=1)

    z = 0.0 if zps is None else per_element(zps)
    x_hat = (q - z) * per_element(scales)
    x32 = x.astype(np.float32).reshape(rows, n)
    keep = np.isfinite(x32)
    a = x32[keep].astype(np.float64)
    d = a - x_hat[keep].astype(np.float64)
    want = {"nan": int(np.isnan(x32).sum()), "posinf": int((x32 == np.inf).sum()),
            "neginf": int((x32 == -np.inf).sum())}
    assert counts == want and want["nan"] >= 129
    assert stats["max_abs_error"] == float(np.abs(d).max())
    assert stats["signal"] == pytest.approx(float((a * a).sum()), rel=1e-12, abs=0.0)
    assert stats["error"] == pytest.approx(float((d * d).sum()), rel=1e-12, abs=0.0)


@pytest.mark.parametrize("shape, s", [
    ((4, 77), scheme("int4", True, 1, None, (4, 77))),  # per column: axis 1
    ((5, 77), scheme("int4", True, 0, None, (5, 77))),  # nibbles of an odd row
    ((4, 96), scheme("int4", True, 1, 3, (4, 96))),     # groups of an odd size
    ((4, 100), scheme("int8", True, 1, 64)),            # a partial last group
    ((4, 128), {**scheme("int8", True, None), "block_size": [2, 64]}),
    ((4, 128), {**scheme("float4_e2m1fn", True, 1, 32, (4, 128)), "scale_dtype": "float8_e8m0fnu",
                "scale_rule": "floor"}),
    ((2, 3, 64), scheme("int8", True, 0)),              # per channel of axis 0 of a rank-3 tensor
])
def test_other_schemes_keep_the_multi_pass_path(shape, s):
    x = tensor(shape, np.float32)
    assert not fused.covers_file(x, s, HostDevice(), "minmax")
    assert not fused.covers_file(tensor((4, 128), np.float64), scheme("int8", True, 0), HostDevice(), "minmax")
    assert not fused.covers_file(tensor((4, 128), np.float32), scheme("int8", True, 0), HostDevice(), "percentile")


def write_input(path, fmt, dtype):
    tensors = {"a.weight": tensor((6, 256), dtype, seed=5), "b.weight": tensor((3, 2, 128), dtype, seed=6),
               "c.weight": tensor((5, 77), dtype, seed=7, special=False), "norm": np.ones(16, np.float32)}
    write_checkpoint(path, fmt, tensors, None)


@contextlib.contextmanager
def one_pass_or_not(monkeypatch, fast, calls):
    """The one pass, each call of it appended to ``calls`` (``fast``), or the multi-pass path."""
    with monkeypatch.context() as m:
        if fast:
            real = fused.quantize_file_tensor
            m.setattr(fused, "quantize_file_tensor", lambda *a, **k: calls.append(1) or real(*a, **k))
        else:
            m.setattr(fused, "covers_file", lambda *a: False)
        yield


def run(tmp_path, fmt, dtype, plan, tag, monkeypatch, fast=True):
    src = os.path.join(tmp_path, f"in.{fmt}")
    if not os.path.exists(src):
        write_input(src, fmt, dtype)
    out = os.path.join(tmp_path, f"{tag}.{fmt}")
    calls = []
    with one_pass_or_not(monkeypatch, fast, calls):
        report = convert.run_quantize(src, out, plan, min_size=64, device=HostDevice(), progress=False,
                                      nonfinite="allow")
    return out, report, len(calls)


def same_report(a, b):
    for ra, rb in zip(a["tensors"], b["tensors"]):
        assert {k: v for k, v in ra.items() if k not in ("sqnr_db", "max_abs_error")} == \
            {k: v for k, v in rb.items() if k not in ("sqnr_db", "max_abs_error")}
        if ra["sqnr_db"] is not None:
            assert round(ra["sqnr_db"], 2) == round(rb["sqnr_db"], 2)
            assert ra["max_abs_error"] == rb["max_abs_error"]
    assert round(a["total"]["sqnr_db"], 2) == round(b["total"]["sqnr_db"], 2)


@pytest.mark.parametrize("fmt", ["safetensors", "npz"])
@pytest.mark.parametrize("plan", [Plan(None, None, "int4", True, default=True, scale_rule="full"),
                                  Plan(None, None, "int8", False, default=True),
                                  Plan(None, None, "float8_e4m3fn", True, default=True)],
                         ids=["int4-default", "int8-asym-default", "e4m3-default"])
def test_the_command_writes_the_same_file(tmp_path, fmt, plan, monkeypatch):
    dtype = BF16 if fmt == "safetensors" else np.dtype(np.float16)  # an .npz holds no bfloat16
    fast, rf, calls = run(tmp_path, fmt, dtype, plan, "fast", monkeypatch)
    slow, rs, _ = run(tmp_path, fmt, dtype, plan, "slow", monkeypatch, fast=False)
    assert calls >= 2  # the pass took the matrices (the int4 row of 77 is the multi-pass path's)
    assert open(fast, "rb").read() == open(slow, "rb").read()
    same_report(rf, rs)


def test_nonfinite_error_refuses_in_the_one_pass(tmp_path, monkeypatch):
    src = os.path.join(tmp_path, "in.safetensors")
    write_input(src, "safetensors", np.float32)
    with pytest.raises(CliError, match="tensor 'a.weight' has .*--nonfinite warn or allow"):
        convert.run_quantize(src, os.path.join(tmp_path, "o.safetensors"), Plan(None, None, "int8", True, default=True),
                             min_size=64, device=HostDevice(), progress=False, nonfinite="error")
    assert not os.path.exists(os.path.join(tmp_path, "o.safetensors"))


def test_each_shard_takes_the_one_pass(tmp_path, monkeypatch):
    """A sharded folder (what ``--workers`` hands out, one shard a task: ``sharded.run_shard``)."""
    from gpuq.checkpoints.sharded_run import run_sharded_quantize

    src = os.path.join(tmp_path, "model")
    os.makedirs(src)
    index = {"metadata": {}, "weight_map": {}}
    for i, seed in enumerate((8, 9)):
        shard = f"model-{i + 1:05d}-of-00002.safetensors"
        write_checkpoint(os.path.join(src, shard), "safetensors",
                         {f"l{i}.weight": tensor((4, 256), BF16, seed=seed)}, None)
        index["weight_map"][f"l{i}.weight"] = shard
    with open(os.path.join(src, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f)
    plan = Plan(None, None, "int4", True, default=True, scale_rule="full")
    outs, calls = [], []
    for fast in (True, False):
        out = os.path.join(tmp_path, "fast" if fast else "slow")
        with one_pass_or_not(monkeypatch, fast, calls):
            run_sharded_quantize(src, out, plan, min_size=64, device="cpu", progress=False, nonfinite="allow")
        outs.append(out)
    assert len(calls) == 2
    for shard in sorted(os.listdir(outs[0])):
        if shard.endswith(".safetensors"):
            assert open(os.path.join(outs[0], shard), "rb").read() == open(os.path.join(outs[1], shard), "rb").read()
            with Checkpoint(os.path.join(outs[0], shard)) as ck:
                assert ck.meta is not None


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("name", ["int4-g32-asym", "uint8-channel-sym", "int8-multi-axis", "e5m2-tensor"])
def test_mse_search_scales_then_the_one_pass(name, dtype):
    """``--calibrate mse``: the search's scales (of the finite values), then the pass's codes."""
    make, shapes = CASES[name]
    x = tensor(shapes[0], dtype, seed=2)
    s = make(x.shape)
    assert fused.covers_file(x, s, HostDevice(), "mse")
    q, scales, zps, stats, counts = convert.quantize_tensor(x, s, HostDevice(), nonfinite="allow", calibrate="mse")
    want = convert.stored_codes(q, s, "safetensors"), scales, zps, stats, counts
    assert_same(x, s, want, fused.quantize_file_tensor(x, s, "safetensors", None, "mse"))
