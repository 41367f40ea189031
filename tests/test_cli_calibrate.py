"""``gpuq quantize --calibrate mse`` and ``gpuq compare --calibrate`` (issue 30).

The file holds ordinary scales (no new metadata: the same format version and keys as a min/max
run); they are ``gpuq.choose_qparams(..., method="mse")`` of each tensor, bit for bit, on one
file and on a sharded checkpoint; a tensor with NaN/Inf gets the search over its finite values;
the report's JSON records the method; compare puts a column per method beside each scheme.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import gpuq
from gpuq import cli

ml_dtypes = pytest.importorskip("ml_dtypes")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

INDEX = "model.safetensors.index.json"


def _main(*args):
    return cli.main([str(a) for a in args])


def _load(path):
    """Every tensor (gpuq's reader: safetensors' NumPy loader has no fp8) and the gpuq metadata."""
    from gpuq.checkpoints.files import Checkpoint

    with Checkpoint(str(path)) as ckpt:
        return {n: ckpt.load(n) for n in ckpt.names}, ckpt.meta


def _weights(seed=0):
    rng = np.random.default_rng(seed)
    w = (rng.standard_t(4, (48, 256)) * 0.02).astype(np.float32)
    e = (rng.standard_normal((3, 16, 256)) * 0.05).astype(ml_dtypes.bfloat16)
    return {"w": w, "experts": e, "bias": rng.standard_normal(48).astype(np.float32)}


@pytest.mark.parametrize("dtype", ["int4", "float8_e4m3fn"])
def test_quantize_mse_writes_the_searched_scales(tmp_path, capsys, dtype):
    src = tmp_path / "in.safetensors"
    tensors = _weights()
    safetensors_numpy.save_file(tensors, str(src))
    outs = {}
    for method in ("minmax", "mse"):
        out = tmp_path / f"{method}.safetensors"
        assert _main("quantize", src, "-o", out, "--dtype", dtype, "--device", "cpu", "-q", "--json",
                     "--calibrate", method) == 0
        outs[method] = (json.loads(capsys.readouterr().out), *_load(out))
    report, got, meta = outs["mse"]
    assert report["calibrate"] == "mse" and outs["minmax"][0]["calibrate"] == "minmax"
    assert meta == outs["minmax"][2]  # nothing new in the file: the same metadata
    for name, row in ((r["name"], r) for r in report["tensors"] if r["quantized"]):
        scheme = meta["tensors"][name]
        kw = dict(axis=scheme["axis"] if not isinstance(scheme["axis"], list) else tuple(scheme["axis"]),
                  group_size=scheme["group_size"], dtype=dtype, symmetric=scheme["symmetric"])
        s, _ = gpuq.choose_qparams(tensors[name], method="mse", **kw)
        assert got[name + ".scales"].reshape(s.shape).tobytes() == s.tobytes()
        minmax_row = next(r for r in outs["minmax"][0]["tensors"] if r["name"] == name)
        assert row["sqnr_db"] >= minmax_row["sqnr_db"] - 1e-9
    table_out = tmp_path / "t.safetensors"
    assert _main("quantize", src, "-o", table_out, "--dtype", dtype, "--device", "cpu", "-q",
                 "--calibrate", "mse") == 0
    assert "note: scales by the MSE search (--calibrate mse)" in capsys.readouterr().out
    assert _main("dequantize", out, "-o", tmp_path / "back.safetensors", "--device", "cpu", "-q") == 0


def test_nonfinite_values_are_left_out_of_the_search(tmp_path, capsys):
    x = (np.random.default_rng(1).standard_t(3, (8, 256)) * 0.1).astype(np.float32)
    x[0, :5] = [np.nan, np.inf, -np.inf, np.nan, 3.0]
    x[3, 100] = np.inf
    src = tmp_path / "in.safetensors"
    safetensors_numpy.save_file({"w": x}, str(src))
    out = tmp_path / "out.safetensors"
    assert _main("quantize", src, "-o", out, "--dtype", "uint4", "--device", "cpu", "-q",
                 "--nonfinite", "allow", "--calibrate", "mse") == 0
    finite_only = np.where(np.isfinite(x), x, np.float32(np.nan))  # NaN: not a number of the block
    s, z = gpuq.choose_qparams(finite_only, axis=1, group_size=128, dtype="uint4", method="mse")
    got, _ = _load(out)
    assert got["w.scales"].tobytes() == s.tobytes() and got["w.zps"].astype(np.int32).tolist() == z.tolist()


def test_sharded_mse_is_the_one_file_run(tmp_path, capsys):
    folder = tmp_path / "in"
    folder.mkdir()
    weight_map = {}
    for i in range(2):
        shard = f"model-{i + 1:05d}-of-00002.safetensors"
        t = {f"layer{i}.weight": _weights(i)["w"]}
        safetensors_numpy.save_file(t, str(folder / shard))
        weight_map.update({k: shard for k in t})
    (folder / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    assert _main("quantize", folder, "-o", tmp_path / "out", "--dtype", "int4", "--device", "cpu", "-q",
                 "--calibrate", "mse", "--json") == 0
    assert json.loads(capsys.readouterr().out)["calibrate"] == "mse"
    for shard in sorted(set(weight_map.values())):
        assert _main("quantize", folder / shard, "-o", tmp_path / shard, "--dtype", "int4", "--device", "cpu",
                     "-q", "--calibrate", "mse") == 0
        assert (tmp_path / "out" / shard).read_bytes() == (tmp_path / shard).read_bytes()


def test_compare_puts_a_column_per_method(tmp_path, capsys):
    src = tmp_path / "in.safetensors"
    safetensors_numpy.save_file(_weights(), str(src))
    assert _main("compare", src, "--scheme", "int4:sym", "--scheme", "int8", "--calibrate", "minmax",
                 "--calibrate", "mse", "--device", "cpu", "--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["calibrate"] == ["minmax", "mse"]
    assert [(s["scheme"], s["calibrate"]) for s in report["schemes"]] == [
        ("int4:sym", "minmax"), ("int4:sym", "mse"), ("int8", "minmax"), ("int8", "mse")]
    assert report["schemes"][1]["text"].endswith(" mse")
    for row in report["tensors"]:
        assert row["sqnr_db"][1] > row["sqnr_db"][0] and row["sqnr_db"][3] >= row["sqnr_db"][2] - 1e-9
    assert _main("compare", src, "--device", "cpu") == 0  # the default: min/max, titles as before
    assert " mse" not in capsys.readouterr().out
    assert _main("compare", src, "--calibrate", "l2") == 2
    assert "invalid choice: 'l2'" in capsys.readouterr().err
