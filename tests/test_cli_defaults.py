"""The CLI's default schemes (issue 26, point 7) and the format version 3 that records them.

With none of ``--axis``, ``--per-tensor``, ``--group-size``, ``gpuq quantize``
takes one table (stated here independently, :func:`default_for`):

================  ==============================  ===================================
code type         rank 2                          rank >= 3
================  ==============================  ===================================
int8, uint8, fp8  one scale per output channel    one scale per row of the last
                  (axis 0)                        dimension (every leading axis)
int4, uint4       groups of 128 along the last dimension at every rank (one group per row
                  where that dimension is shorter than 128)
================  ==============================  ===================================

Checked for every code type on rank 2, 3 and 4 tensors: the recorded scheme,
the codes and parameters bit for bit :func:`gpuq.quantize` with
:func:`gpuq.choose_qparams`' parameters for that scheme, the format version
(3 only where a multi-axis tensor is in the file), ``gpuq dequantize``
against a naive dequantization of the stored bytes, ``--help``, the report,
and ``gpuq compare``. ``tests/data/format_v3/`` (written by the first
version-3 gpuq) must read the same forever.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import gpuq
from gpuq import cli

ml_dtypes = pytest.importorskip("ml_dtypes")
from test_cli_formats import (FORMATS, api_codes_bytes, fixture_reads_the_same,  # noqa: E402
                              naive_dequantize, quantized_file, read, refused_after_edit, same_bits,
                              st_write)

HERE = Path(__file__).resolve().parent
V3 = HERE / "data" / "format_v3"
CODES = ["int8", "uint8", "int4", "uint4", "float8_e4m3fn", "float8_e5m2"]
FP8 = ("float8_e4m3fn", "float8_e5m2")


def default_for(dtype, ndim):
    """The table above: ``(axis, group_size)``, a tuple of axes for the multi-axis scheme."""
    if dtype in ("int4", "uint4"):
        return ndim - 1, 128
    return (0 if ndim == 2 else tuple(range(ndim - 1))), None


def run(*args):
    return cli.main([str(a) for a in args])


def source(fmt, seed=26):
    """Rank 2 (the last dimension 200: groups of 128 and 72), an MoE-like rank 3 (last
    dimension 100 < 128: one group per row) whose experts and rows differ in size, a rank 4."""
    rng = np.random.default_rng(seed)
    size = np.array([0.01, 0.1, 1, 10]).reshape(4, 1, 1) * np.array(
        [1, 0.01, 0.02, 0.05, 0.1, 0.2]).reshape(1, 6, 1)
    experts = rng.standard_normal((4, 6, 100)) * size
    return {"model.dense.weight": (rng.standard_normal((33, 200)) * 0.05).astype(np.float32),
            "model.experts.weight": experts.astype(
                ml_dtypes.bfloat16 if fmt == "safetensors" else np.float64),
            "model.conv.weight": (rng.standard_normal((2, 3, 4, 24)) * 0.5).astype(np.float16),
            "model.norm": rng.standard_normal(100).astype(np.float32)}


def write_source(path, fmt):
    t = source(fmt)
    if fmt == "safetensors":
        st_write(path, t, {"format": "pt"})
    else:
        np.savez(path, **t)
    return t


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", CODES)
def test_defaults_table_on_every_rank_and_code_type(tmp_path, capsys, dtype, fmt):
    src, out, back = tmp_path / f"in.{fmt}", tmp_path / f"q.{fmt}", tmp_path / f"b.{fmt}"
    x_all = write_source(src, fmt)
    assert run("quantize", src, "-o", out, "--dtype", dtype, "--min-size", "64",
               "--device", "cpu", "-q", "--json") == 0, capsys.readouterr().err
    report = json.loads(capsys.readouterr().out)
    tensors, meta, _ = read(out)
    packed = dtype in ("int4", "uint4")
    assert meta["format_version"] == (2 if packed else 3)  # 3: the multi-axis tensors
    quantized = ["model.conv.weight", "model.dense.weight", "model.experts.weight"]
    assert sorted(meta["tensors"]) == quantized
    rows = {r["name"]: r for r in report["tensors"]}
    for name in quantized:
        x, s = x_all[name], meta["tensors"][name]
        axis, group = default_for(dtype, x.ndim)
        assert s["axis"] == (list(axis) if isinstance(axis, tuple) else axis), name
        assert s["group_size"] == group and rows[name]["scheme"]["axis"] == s["axis"]
        scales, zps = gpuq.choose_qparams(x, axis=axis, group_size=group, dtype=dtype,
                                          symmetric=dtype in FP8)
        q = gpuq.quantize(x, scales, zps, axis=axis, group_size=group, dtype=dtype)
        assert tensors[name].tobytes() == api_codes_bytes(q), name
        assert same_bits(tensors[name + ".scales"], np.asarray(scales, np.float32))
        if zps is not None:
            assert np.array_equal(tensors[name + ".zps"].astype(np.int64), zps)
    # One scale per (expert, output row): 4 x 6 of them, or 4 x 6 x 1 groups of 128 for int4.
    assert tensors["model.experts.weight.scales"].shape == ((4, 6, 1) if packed else (4, 6))
    assert tensors["model.dense.weight.scales"].shape == ((33, 2) if packed else (33,))
    assert report["default_scheme"].startswith(dtype + ":")
    # gpuq dequantize reads it: the naive dequantization of the stored bytes.
    assert run("dequantize", out, "-o", back, "--dtype", "float32", "--device", "cpu",
               "-q") == 0, capsys.readouterr().err
    got, _, _ = read(back)
    for name in quantized:
        assert same_bits(got[name], naive_dequantize(tensors, name, meta["tensors"][name], fmt))
    assert same_bits(got["model.norm"], x_all["model.norm"])


def test_defaults_keep_each_row_of_each_expert_on_its_own_scale(tmp_path, capsys):
    """The quality the defaults are for: an expert's rows differ in size (up to 100x). One
    scale per expert (the old default, axis 0) spends its levels on the largest row."""
    src = tmp_path / "in.safetensors"
    write_source(src, "safetensors")
    sqnr = {}
    for flags in ([], ["--axis", "0"]):
        assert run("quantize", src, "-o", tmp_path / "q.safetensors", "--min-size", "64",
                   "--include", "model.experts.*", "--device", "cpu", "-q", "--json",
                   *flags) == 0
        rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["tensors"]}
        sqnr[tuple(flags)] = rows["model.experts.weight"]["sqnr_db"]
    assert sqnr[()] > sqnr[("--axis", "0")] + 5


@pytest.mark.parametrize("flags,axis,group", [
    (["--axis", "0"], {2: 0, 3: 0, 4: 0}, None),
    (["--group-size", "32"], {2: 1, 3: 2, 4: 3}, 32),
    (["--per-tensor"], {2: None, 3: None, 4: None}, None),
])
def test_flags_turn_the_defaults_off(tmp_path, capsys, flags, axis, group):
    src = tmp_path / "in.npz"
    write_source(src, "npz")
    for dtype in ("int8", "int4"):
        out = tmp_path / f"q-{dtype}.npz"
        assert run("quantize", src, "-o", out, "--dtype", dtype, "--min-size", "64",
                   "--device", "cpu", "-q", "--json", *flags) == 0
        report = json.loads(capsys.readouterr().out)
        _, meta, _ = read(out)
        assert meta["format_version"] == (1 if dtype == "int8" else 2)
        assert report["default_scheme"] is None
        for name, s in meta["tensors"].items():
            assert (s["axis"], s["group_size"]) == (axis[len(source("npz")[name].shape)], group)


def test_help_and_report_state_the_defaults(tmp_path, capsys):
    proc = subprocess.run([sys.executable, "-m", "gpuq", "quantize", "--help"],
                          capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(HERE.parent), COLUMNS="100"))
    assert proc.returncode == 0
    help_text = " ".join(proc.stdout.split())
    for words in ("With none of them, each tensor gets the default of its code type",
                  "int8, uint8, fp8 one scale per output channel one scale per row of the last",
                  "int4, uint4 groups of 128 along the last dimension, at every rank"):
        assert words in help_text, words
    src = tmp_path / "in.safetensors"
    write_source(src, "safetensors")
    assert run("quantize", src, "-o", tmp_path / "q.safetensors", "--min-size", "64",
               "--device", "cpu") == 0
    table = capsys.readouterr().out
    row = next(line.split() for line in table.splitlines() if line.startswith("model.experts"))
    assert row[1:5] == ["4x6x100", "int8", "asym", "axis=(0,1)"]
    assert ("note: default scheme (no --axis, --per-tensor, --group-size) for int8: one scale "
            "per output channel at rank 2, per row of the last dimension at rank >= 3") in table


def test_compare_uses_the_same_defaults(tmp_path, capsys):
    src = tmp_path / "in.safetensors"
    write_source(src, "safetensors")
    assert run("compare", src, "--min-size", "64", "--device", "cpu", "--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert [s["text"] for s in report["schemes"]] == [
        "int8 asym axis=(0,1,2) | axis=0 | axis=(0,1)", "int4 asym axis=-1 g=128",
        "float8_e4m3fn axis=(0,1,2) | axis=0 | axis=(0,1)"]
    for k, dtype in enumerate(("int8", "int4", "float8_e4m3fn")):
        assert run("quantize", src, "-o", tmp_path / f"q{k}.safetensors", "--min-size", "64",
                   "--dtype", dtype, "--device", "cpu", "-q", "--json") == 0
        q = json.loads(capsys.readouterr().out)
        assert {r["name"]: r["sqnr_db"][k] for r in report["tensors"]} == {
            r["name"]: r["sqnr_db"] for r in q["tensors"] if r["quantized"]}


# -- format version 3: what is refused --------------------------------------------------------

@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("edit,message", [
    ({"format_version": 2}, "axis [0, 1] (several axes) needs format version 3, but the file "
                            "says version 2"),
    ({"format_version": 1}, "needs format version 3, but the file says version 1"),
    ({"axis": [1, 0]}, "axis [1, 0] is not a list of two or more increasing integers >= 0"),
    ({"axis": [0]}, "axis [0] is not a list of two or more"),
    ({"axis": [0, 0]}, "is not a list of two or more increasing"),
    ({"axis": [0, True]}, "is not a list of two or more increasing"),
    ({"axis": [0, 1], "group_size": 2}, "group_size 2 with several axes [0, 1]: groups run "
                                        "along one axis"),
    ({"axis": [0, 3]}, "the gpuq metadata says axis [0, 3], but the codes have shape [4, 6, 100]"),
    ({"axis": [0, 2]}, "its scales 'model.experts.weight.scales' have shape [4, 6], but int8 "
                       "asymmetric axes [0, 2] of shape [4, 6, 100] needs [4, 100]"),
])
def test_version_3_damage_is_refused(tmp_path, capsys, fmt, edit, message):
    base = quantized_file(tmp_path, fmt, write_source, "--min-size", "64", "--include", "model.experts.*")
    assert base[1]["format_version"] == 3
    refused_after_edit(tmp_path, capsys, fmt, base, "model.experts.weight", edit, message)


# -- the version-3 fixture --------------------------------------------------------------------

V3_VARIANTS = {"rows_asym_int8": [], "rows_sym_uint8": ["--symmetric", "--dtype", "uint8"],
               "rows_e4m3fn": ["--dtype", "float8_e4m3fn"]}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("variant", sorted(V3_VARIANTS))
def test_version_3_fixture_reads_the_same(tmp_path, capsys, variant, fmt):
    meta = fixture_reads_the_same(V3, variant, fmt, 3, tmp_path, capsys)
    assert [meta["tensors"][n]["axis"] for n in sorted(meta["tensors"])] == [
        [0, 1, 2], 0, [0, 1]]


def test_fixture_v3_matches_todays_writer(tmp_path, capsys):
    """Today's quantize writes the fixture's bytes (a change of layout must be a new version)."""
    for variant, flags in V3_VARIANTS.items():
        for fmt in FORMATS:
            out = tmp_path / f"{variant}.{fmt}"
            assert run("quantize", V3 / f"source.{fmt}", "-o", out, "--min-size", "64",
                       "--device", "cpu", "-q", *flags) == 0
            assert out.read_bytes() == (V3 / out.name).read_bytes(), (variant, fmt)
