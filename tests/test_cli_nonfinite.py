"""NaN and +-Inf in a weight: counted, reported, and quantized by a stated policy (``--nonfinite``).

The default (``warn``) and ``allow`` quantize such a tensor with scales and zero
points computed from its finite values; the codes of the non-finite values then
follow the library's contract (NaN -> the block's zero point, +Inf -> qmax,
-Inf -> qmin); ``warn`` says so in one stderr line per tensor. ``error`` stops
with exit code 2 naming the tensor and the count. The expected parameters are
computed here block by block from the finite values alone, with
``choose_qparams`` on each block's finite elements (not by the CLI's own
replace-by-zero), and the report's numbers from float64 arithmetic here. JSON
holds numbers or ``null`` with a reason, never strings. Before issue 17 a NaN
passed without a word (SQNR ``"nan"``) and an Inf stopped the run.
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

import gpuq
from gpuq import cli

QRANGE = {"int8": (-128, 127), "uint8": (0, 255)}


def weight_with_nonfinite():
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((6, 48)) * 0.1).astype(np.float32)
    x[0, 3] = np.nan
    x[1, 7] = np.inf
    x[2, 9] = -np.inf
    x[3, :] = np.nan            # a row with no finite value
    x[4, 0], x[4, 1] = np.inf, -np.inf
    return x


COUNTS = {"nan": 1 + 48, "posinf": 2, "neginf": 2}
SCHEMES = {
    "per-channel int8": ([], dict(axis=0, group_size=None, dtype="int8", symmetric=False)),
    "per-channel uint8": (["--dtype", "uint8"], dict(axis=0, group_size=None, dtype="uint8",
                                                     symmetric=False)),
    "symmetric int8": (["--symmetric"], dict(axis=0, group_size=None, dtype="int8",
                                             symmetric=True)),
    "group 16": (["--group-size", "16"], dict(axis=1, group_size=16, dtype="int8",
                                              symmetric=False)),
    "per-tensor uint8": (["--per-tensor", "--dtype", "uint8"],
                         dict(axis=None, group_size=None, dtype="uint8", symmetric=False)),
}


def blocks(x, axis, group_size):
    """(index into the scales, boolean mask of the block's elements) for every block."""
    if axis is None:
        yield (), np.ones(x.shape, bool)
        return
    for i in range(x.shape[0]):
        if group_size is None:
            m = np.zeros(x.shape, bool)
            m[i] = True
            yield (i,), m
            continue
        for j in range(-(-x.shape[1] // group_size)):
            m = np.zeros(x.shape, bool)
            m[i, j * group_size:(j + 1) * group_size] = True
            yield (i, j), m


def expected_params(x, s):
    """Scales and zero points from each block's finite values alone (an empty block included)."""
    shape = () if s["axis"] is None else (
        (x.shape[0],) if s["group_size"] is None else (x.shape[0], -(-x.shape[1] // s["group_size"])))
    scales, zps = np.zeros(shape, np.float32), np.zeros(shape, np.int32)
    for idx, m in blocks(x, s["axis"], s["group_size"]):
        vals = x[m]
        sc, zp = gpuq.choose_qparams(vals[np.isfinite(vals)], dtype=s["dtype"],
                                     symmetric=s["symmetric"])
        scales[idx], zps[idx] = sc, 0 if zp is None else zp
    return scales, zps


def run(tmp_path, capsys, *args):
    code = cli.main([*map(str, args), "--device", "cpu", "-q"])
    out = capsys.readouterr()
    return code, out.out, out.err


def load(path):
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def strict_json(text):
    def refuse(name):
        raise AssertionError(f"{name} in the JSON")
    return json.loads(text, parse_constant=refuse)


def no_strings_for_numbers(obj):
    if isinstance(obj, dict):
        for k, v in obj.items():
            assert v not in ("nan", "inf", "-inf", "NaN", "Infinity"), (k, v)
            no_strings_for_numbers(v)
    elif isinstance(obj, list):
        for v in obj:
            no_strings_for_numbers(v)


@pytest.mark.parametrize("name", list(SCHEMES))
def test_warn_quantizes_from_the_finite_values(tmp_path, capsys, name):
    flags, s = SCHEMES[name]
    x = weight_with_nonfinite()
    clean = (np.random.default_rng(6).standard_normal((6, 48)) * 0.1).astype(np.float32)
    np.savez(tmp_path / "in.npz", w=x, clean=clean)
    code, out, err = run(tmp_path, capsys, "quantize", tmp_path / "in.npz", "-o",
                         tmp_path / "q.npz", "--min-size", "0", "--json", *flags)
    assert code == 0, err
    # One warning line, naming the tensor and the counts; nothing about the clean tensor.
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuq: warning: tensor 'w' has 53 non-finite "
                                                   "values (49 NaN, 2 +Inf, 2 -Inf)"), err
    q = load(tmp_path / "q.npz")
    scales, zps = expected_params(x, s)
    assert q["w.scales"].dtype == np.float32
    assert q["w.scales"].reshape(scales.shape).tobytes() == scales.tobytes()
    qmin, qmax = QRANGE[s["dtype"]]
    zp_full = np.zeros(x.shape, np.int64)
    for idx, m in blocks(x, s["axis"], s["group_size"]):
        zp_full[m] = zps[idx]
    if "w.zps" in q:
        assert q["w.zps"].dtype == np.dtype(s["dtype"])
        assert np.array_equal(q["w.zps"].reshape(zps.shape).astype(np.int32), zps)
    else:
        assert s["dtype"] == "int8" and s["symmetric"] and not zps.any()
    codes = q["w"].astype(np.int64)
    assert q["w"].dtype == np.dtype(s["dtype"])
    # The contract for the non-finite values, spelled out.
    assert np.array_equal(codes[np.isnan(x)], zp_full[np.isnan(x)])
    assert (codes[x == np.inf] == qmax).all() and (codes[x == -np.inf] == qmin).all()
    # The finite values: the library's quantize with those parameters, exactly.
    finite = np.isfinite(x)
    want = gpuq.quantize(np.where(finite, x, 0), scales, None if "w.zps" not in q else zps,
                         axis=s["axis"], group_size=s["group_size"], dtype=s["dtype"])
    assert np.array_equal(codes[finite], want.astype(np.int64)[finite])

    report = strict_json(out)
    no_strings_for_numbers(report)
    rows = {r["name"]: r for r in report["tensors"]}
    assert rows["w"]["nonfinite"] == COUNTS
    assert rows["clean"]["nonfinite"] == {"nan": 0, "posinf": 0, "neginf": 0}
    assert report["total"]["nonfinite"] == COUNTS
    x_hat = gpuq.dequantize(q["w"], q["w.scales"], q.get("w.zps"), axis=s["axis"],
                            group_size=s["group_size"]).astype(np.float64)
    a, d = x[finite].astype(np.float64), x[finite] - x_hat[finite]
    assert rows["w"]["sqnr_db"] == pytest.approx(10 * math.log10((a @ a) / (d @ d)), rel=1e-9)
    assert rows["w"]["max_abs_error"] == float(np.abs(d).max())
    assert isinstance(report["total"]["sqnr_db"], float)


def test_error_policy_stops_naming_the_tensor(tmp_path, capsys):
    np.savez(tmp_path / "in.npz", clean=np.ones((8, 8), np.float32), w=weight_with_nonfinite())
    before = sorted(os.listdir(tmp_path))
    code, _, err = run(tmp_path, capsys, "quantize", tmp_path / "in.npz", "-o",
                       tmp_path / "q.npz", "--min-size", "0", "--nonfinite", "error")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith("gpuq: error: tensor 'w' has 53 non-finite values "
                               "(49 NaN, 2 +Inf, 2 -Inf)")
    assert sorted(os.listdir(tmp_path)) == before


def test_error_policy_passes_finite_tensors(tmp_path, capsys):
    np.savez(tmp_path / "in.npz", w=np.ones((8, 8), np.float32))
    code, _, err = run(tmp_path, capsys, "quantize", tmp_path / "in.npz", "-o",
                       tmp_path / "q.npz", "--min-size", "0", "--nonfinite", "error")
    assert code == 0 and err == ""


def test_allow_is_warn_without_the_warning(tmp_path, capsys):
    np.savez(tmp_path / "in.npz", w=weight_with_nonfinite())
    outs = {}
    for policy in ("warn", "allow"):
        code, table, err = run(tmp_path, capsys, "quantize", tmp_path / "in.npz", "-o",
                               tmp_path / f"{policy}.npz", "--min-size", "0",
                               "--nonfinite", policy)
        assert code == 0
        assert (err == "") == (policy == "allow")
        # The table says it either way, under the total.
        assert table.splitlines()[-1] == ("note: w has 53 non-finite values (49 NaN, 2 +Inf, "
                                          "2 -Inf): scales from its finite values, SQNR and "
                                          "max abs err over those")
        outs[policy] = (tmp_path / f"{policy}.npz").read_bytes()
    assert outs["warn"] == outs["allow"]


def test_bfloat16_and_float16_nonfinite(tmp_path, capsys):
    """Non-finite values of the narrow floats are counted the same way (safetensors IN)."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    x = weight_with_nonfinite()
    safetensors_numpy.save_file({"a": x.astype(ml_dtypes.bfloat16), "b": x.astype(np.float16)},
                                str(tmp_path / "in.safetensors"))
    code, out, err = run(tmp_path, capsys, "quantize", tmp_path / "in.safetensors", "-o",
                         tmp_path / "q.safetensors", "--min-size", "0", "--json")
    assert code == 0 and len(err.strip().splitlines()) == 2
    rows = {r["name"]: r for r in strict_json(out)["tensors"]}
    assert rows["a"]["nonfinite"] == rows["b"]["nonfinite"] == COUNTS
    assert report_total(out)["nonfinite"] == {k: 2 * v for k, v in COUNTS.items()}


def report_total(text):
    return strict_json(text)["total"]


def test_json_nulls_with_reasons(tmp_path, capsys):
    """An exact round trip (SQNR +Inf) and a tensor with no finite value (NaN statistics):
    null and a reason, in the rows and in the total."""
    exact = np.tile(np.arange(-127, 128, dtype=np.float32)[:64], (4, 1))
    exact[:, 0] = 127  # every row spans 127: scale 1, every value a code
    np.savez(tmp_path / "exact.npz", w=exact)
    code, out, _ = run(tmp_path, capsys, "quantize", tmp_path / "exact.npz", "-o",
                       tmp_path / "q.npz", "--min-size", "0", "--symmetric", "--json")
    assert code == 0
    assert '"inf"' not in out
    report = strict_json(out)
    row = report["tensors"][0]
    assert row["sqnr_db"] is None and row["max_abs_error"] == 0.0
    assert row["sqnr_db_reason"] == "+Inf: exact round trip (the error is 0)"
    assert report["total"]["sqnr_db"] is None
    assert report["total"]["sqnr_db_reason"] == row["sqnr_db_reason"]

    np.savez(tmp_path / "nan.npz", w=np.full((4, 8), np.nan, np.float32),
             v=np.ones((4, 8), np.float32))
    code, out, err = run(tmp_path, capsys, "quantize", tmp_path / "nan.npz", "-o",
                         tmp_path / "q2.npz", "--min-size", "0", "--json")
    assert code == 0 and "32 non-finite values (32 NaN)" in err
    report = strict_json(out)
    no_strings_for_numbers(report)
    row = next(r for r in report["tensors"] if r["name"] == "w")
    assert row["sqnr_db"] is None and row["max_abs_error"] is None
    assert row["sqnr_db_reason"] == row["max_abs_error_reason"] == "NaN: no finite values to compare"
    # The tensor without finite values adds nothing to the totals: they are v's.
    v_row = next(r for r in report["tensors"] if r["name"] == "v")
    assert report["total"]["max_abs_error"] == v_row["max_abs_error"]
    q = load(tmp_path / "q2.npz")
    assert (q["w"] == q["w.zps"][:, None]).all()  # every NaN at its row's zero point


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_signalling_nan_raises_no_numpy_warning(tmp_path, capsys, dtype):
    """A signalling NaN (float32 bits 0x7F810000 and its narrower twins) raises the FPU's invalid
    flag in NumPy's isfinite, casts and subtractions: the CLI counts it as a NaN, quantizes with
    the finite values' parameters and prints no RuntimeWarning, under --nonfinite allow."""
    import warnings

    from gpuq.checkpoints.files import write_checkpoint
    from gpuq._dtypes import bfloat16

    x = weight_with_nonfinite()[:3].copy()
    bits = {"float32": (np.uint32, 0x7F810000), "float16": (np.uint16, 0x7C01), "bfloat16": (np.uint16, 0x7F81)}
    utype, snan = bits[dtype]
    y = x.astype(bfloat16() if dtype == "bfloat16" else dtype)
    y.view(utype)[0, 5] = snan
    y.view(utype)[2, 1] = snan | (1 << (8 * np.dtype(utype).itemsize - 1))  # negative sign
    src, out = tmp_path / "w.safetensors", tmp_path / "q.safetensors"
    write_checkpoint(str(src), "safetensors", {"w": y}, None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cli.main(["quantize", str(src), "-o", str(out), "--min-size", "1", "--nonfinite", "allow",
                         "--device", "cpu", "-q", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["tensors"][0]["nonfinite"]["nan"] == 2 + 1  # x[0, 3] and the two sNaNs
