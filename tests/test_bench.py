"""The benchmark's quick mode on the CPU: it runs, and its JSON says what it should.

Runs ``bench.main(["--quick", ...])`` into a temporary folder (a few seconds).
The PNG is checked only where matplotlib is installed; without it the run
must still succeed and say why no PNG was written.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

bench = pytest.importorskip("bench")

ROW_FIELDS = {
    "case", "op", "scheme", "shape", "numel", "bytes", "contender", "peer", "status",
    "median_s", "gbps", "pct_copy", "ratio_to_best_peer", "mismatches", "copy_gbps",
}
STAMP_FIELDS = {"device", "device_name", "date", "commit", "threads", "copy", "versions"}


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    assert bench.main(["--quick", "--device", "cpu", "--threads", "1", "--out", str(out)]) == 0
    return out


def _load(out):
    (path,) = list(out.glob("*.json"))
    with open(path) as f:
        return json.load(f)


def test_json_has_stamp_and_rows(quick_run):
    doc = _load(quick_run)
    st = doc["stamp"]
    assert STAMP_FIELDS <= set(st)
    assert st["device"] == "cpu" and st["threads"] == 1 and st["commit"]
    assert st["copy"]["gbps"] > 0
    rows = doc["rows"]
    assert rows
    gpuq_rows = [r for r in rows if r["contender"] in ("gpuq", "gpuq out=")]
    assert gpuq_rows and all(r["status"] == "ok" for r in gpuq_rows)
    for r in rows:
        if r["status"] == "ok":
            assert ROW_FIELDS <= set(r), sorted(ROW_FIELDS - set(r))
            assert r["median_s"] > 0 and r["gbps"] > 0
        else:
            assert r["status"].startswith(("n/a", "error"))
    assert any(r["latency"] for r in rows)


def test_mismatch_counts_reported(quick_run):
    rows = _load(quick_run)["rows"]
    for r in rows:
        if r["status"] != "ok":
            continue
        assert isinstance(r["mismatches"], int) and r["mismatches"] >= 0
        if not r["peer"]:
            assert r["mismatches"] == 0  # gpuq against itself: fresh and out= agree exactly
    # The naive NumPy peer needs nothing beyond NumPy, so it is always there.
    assert any(r["contender"] == "numpy naive" and r["status"] == "ok" for r in rows)


def test_offset_view_case(quick_run):
    """``q/tensor+1``: the input is a view one element into its allocation, and every
    contender that ran agrees with gpuq (the naive NumPy peer exactly)."""
    from bench import cases, data

    case = cases.Case("quantize", "tensor", 4096, offset=1)
    x = data.host_input(case)
    assert x.shape == case.shape() and x.base is not None
    assert x.__array_interface__["data"][0] - x.base.__array_interface__["data"][0] == x.itemsize
    rows = [r for r in _load(quick_run)["rows"] if r["case"].startswith("q/tensor+1/")]
    assert {r["contender"] for r in rows} >= {"gpuq", "gpuq out=", "numpy naive"}
    for r in rows:
        assert r["status"] == "ok", r
        if r["contender"] in ("gpuq", "gpuq out=", "numpy naive"):
            assert r["mismatches"] == 0


def test_dynamic_rows(quick_run):
    """Issue 5's cases: quantize_dynamic / choose_qparams beside a static quantize of the same tensor."""
    doc = _load(quick_run)
    rows = [r for r in doc["rows"] if r.get("dynamic")]
    cases = {r["case"] for r in rows}
    assert {c.split("/")[0] + "/" + c.split("/")[1] for c in cases} == {
        "dyn/tensor", "dyn/row4096", "dyn/group128", "qp/row4096"}
    for case in cases:
        cs = {r["contender"]: r for r in rows if r["case"] == case}
        static, g = cs["gpuq static"], cs["gpuq"]
        assert static["status"] == "ok" and g["status"] == "ok"
        assert static["ratio_to_static"] == 1.0 and g["ratio_to_static"] > 0
        assert "gpuq out=" not in cs  # quantize_dynamic has no out=: the static row replaces it
        # quantize_dynamic == choose_qparams then quantize, codes and parameters alike.
        assert static["mismatches"] == 0 and g["mismatches"] == 0
        assert set(static["mismatch_parts"]) == {"q", "scales", "zps"}
        # Bytes are the quantize's (x read, codes + params written) on every row of the case.
        assert len({r["bytes"] for r in cs.values()}) == 1 and g["bytes"] > g["numel"] * 5
        assert cs["numpy naive"]["status"] == "ok" and cs["numpy naive"]["mismatches"] == 0
    targets = {r["case"].split("/")[1]: r["target"] for r in rows
               if r["contender"] == "gpuq" and r["op"] == "dynamic"}
    assert targets["tensor"] == 2.2 and targets["row4096"] == 1.3 and targets["group128"] is None
    # onnxruntime's DynamicQuantizeLinear covers uint8 per-tensor only; elsewhere an n/a row says so.
    ort = [r for r in rows if r["contender"] == "onnxruntime"]
    for r in ort:
        if r["case"].startswith("dyn/tensor/f32>u8"):
            assert r["status"] == "ok" and r["mismatches"] == 0
        else:
            assert r["status"].startswith("n/a")
    txt = next(quick_run.glob("*.txt")).read_text()
    assert "qparams from data (issue 5)" in txt and "quantize_dynamic" in txt


def test_dynamic_peer_expressions_match_gpuq():
    """The GPU peers' dynamic expressions, run here on host arrays (NumPy for CuPy's naive
    expression, torch CPU tensors for torch eager), equal gpuq exactly: the GPU rows will
    report real rounding differences only."""
    from bench import cases, data, runner
    from bench.peers_cpu import naive_dynamic

    peers = [lambda c, xs: naive_dynamic(c, xs, np, np.asarray)]
    if importlib.util.find_spec("torch") is not None:
        from bench.peers_gpu import TorchEager

        eager = TorchEager(1)
        peers.append(lambda c, xs: eager.prepare(c, xs, None, None))
    for case in cases.dynamic_cases(1 << 16):
        x = data.host_input(case)
        x[0, :6] = [0, 2, -3, -2.5, 1.34, 0.5]
        ref = data.reference(case, x, None, None)
        for make in peers:
            prep = make(case, [x])
            assert runner.compare(ref, prep.fetch(prep.run(0)))["mismatches"] == 0, case.name


def test_dynamic_cases_in_every_set():
    from bench import cases

    for cs in (cases.cpu_default_cases(1 << 26), cases.full_cases(1 << 20), cases.quick_cases()):
        assert any(c.op == "dynamic" for c in cs) and any(c.op == "qparams" for c in cs)
    names = [c.name for c in cases.dynamic_cases(1 << 26)]
    assert "dyn/row4096/f32>s8/zp/64M" in names and "qp/group128/f32>s8/zp/64M" in names
    row = cases.Case("dynamic", "row", 1 << 20, cases.TOKEN_ROW)
    assert row.shape() == (256, 4096) and row.axis() == 0 and row.param_shape() == (256,)
    # Bytes of the quantize: x (float32) read, codes (int8) + scales (f32) + zps (i32) written.
    assert row.bytes_moved() == (1 << 20) * 5 + 256 * 8


def test_table_and_plot(quick_run):
    (txt,) = list(quick_run.glob("*.txt"))
    assert "copy limit" in txt.read_text()
    pngs = list(quick_run.glob("*.png"))
    if importlib.util.find_spec("matplotlib") is None:
        assert not pngs  # the run said why on stdout; the PNG is optional
    else:
        assert len(pngs) == 1 and pngs[0].stat().st_size > 1000


def test_gpu_modules_import_without_cupy():
    import bench.peers_gpu  # noqa: F401  (cupy/torch are imported lazily)
    from bench import cases

    assert len(cases.full_cases(1 << 20)) > len(cases.cpu_default_cases(1 << 20))


def test_format_rows(quick_run):
    """Issue 19's cases (int4/uint4 g128, fp8 e4m3fn per-tensor and per-row): gpuq and every
    peer that covers them agree bit for bit; bytes count packed int4 codes as half a byte."""
    from bench import cases

    rows = [r for r in _load(quick_run)["rows"] if r["qdtype"] in cases.FORMAT_TYPES]
    names = {r["case"] for r in rows}
    assert {n.split("/")[0] + "/" + n.split("/")[1] + "/" + n.split("/")[2] for n in names} == {
        "q/group128/f32>s4", "q/group128/f32>u4", "dq/group128/s4>f32", "dq/group128/u4>f32",
        "q/tensor/f32>e4m3", "q/row4096/f32>e4m3", "dq/tensor/e4m3>f32", "dq/row4096/e4m3>f32"}
    ort = importlib.util.find_spec("onnxruntime") is not None
    for name in names:
        cs = {r["contender"]: r for r in rows if r["case"] == name}
        for who in ("gpuq", "gpuq out=", "onnxruntime" if ort else "gpuq"):
            assert cs[who]["status"] == "ok" and cs[who]["mismatches"] == 0, (name, cs[who])
        g = cs["gpuq"]
        n = g["numel"]
        if "4>" in name or ">s4" in name or ">u4" in name:
            assert g["bytes"] == n * 4 + (n + 1) // 2
            assert cs["numpy naive"]["status"] == "ok" and cs["numpy naive"]["mismatches"] == 0
            assert cs["ml_dtypes"]["status"].startswith("n/a")
        else:
            assert g["bytes"] == n * 5
            assert cs["ml_dtypes"]["status"] == "ok" and cs["ml_dtypes"]["mismatches"] == 0
            assert cs["numpy naive"]["status"].startswith("n/a")
    # ml_dtypes appears only in the format cases (no n/a row in every int8 case).
    assert not any(r["contender"] == "ml_dtypes" for r in _load(quick_run)["rows"]
                   if r["qdtype"] not in cases.FORMAT_TYPES)


def test_format_helpers():
    """The peers' nibble packing is gpuq's (odd counts pad with 0); bit views catch -0.0."""
    import gpuq
    from bench import cases, data
    from bench.peers_cpu import pack_nibbles, unpack_nibbles

    q = np.array([-8, 7, -1, 0, 3], np.int8)
    assert np.array_equal(pack_nibbles(q), gpuq.pack(q, dtype="int4").data)
    assert np.array_equal(unpack_nibbles(pack_nibbles(q), 5, True), q)
    u = np.array([15, 0, 8], np.uint8)
    assert np.array_equal(pack_nibbles(u), gpuq.pack(u, dtype="uint4").data)
    assert data.as_bits(np.array([-0.0], np.float32))[0] == 0x80000000
    c = cases.Case("dequantize", "group", 1 << 14, qdtype="int4", zps=False)
    x = data.host_input(c)
    assert isinstance(x, gpuq.Codes) and x.shape == (4, 4096) and x.data.nbytes == c.code_nbytes()
    f = data.host_input(cases.Case("dequantize", "row", 1 << 14, 4096, qdtype="float8_e4m3fn", zps=False))
    assert not np.isnan(f.astype(np.float32)).any()
    assert [c.size for c in cases.format_cases(1 << 26) if c.qdtype == "int4"] == [1 << 24] * 2 + [1 << 26] * 2
    assert (4096, 4096) in [c.shape() for c in cases.format_cases(1 << 26)]


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")
def test_gpu_format_contenders_on_cpu_torch():
    """bench.gpu_formats' torch expressions (eager) and gpuq on torch tensors, run here on CPU
    tensors, equal gpuq's host result bit for bit: the GPU rows will report real differences only."""
    import torch

    from bench import cases, data, gpu_formats, runner

    for case in cases.format_cases(1 << 14):
        h = data.host_input(case)
        s, z = data.host_params(case)
        ref = data.reference(case, h, s, z)
        xs = [gpu_formats.to_device(case, h, torch, torch.device("cpu"))]
        for c in (gpu_formats.GpuqTorch(False), gpu_formats.TorchFormats(False)):
            prep = c.prepare(case, xs, s, z)
            assert runner.compare(ref, prep.fetch(prep.run(0)))["mismatches"] == 0, (case.name, c.name)


def test_gpu_bf16_expressions_agree_with_gpuq_on_cpu_tensors(tmp_path):
    """bench/gpu_bf16.py (issue 16, GPU only) on CPU torch tensors: every contender's bits equal gpuq's."""
    pytest.importorskip("torch")
    from bench import gpu_bf16

    rows = gpu_bf16.run("cpu", (1 << 13,), 1, str(tmp_path), compile=False)
    assert rows and all(r.get("mismatches") == 0 for r in rows), rows
    assert {r["contender"] for r in rows} >= {"gpuq", "torch eager"}, rows


def test_blocks_bench_int4_rows_match_the_naive_peer():
    """``python -m bench.blocks --dtype int4`` on a small ragged tensor: every contender runs and
    the naive peer's packed codes and parameters equal gpuq's bit for bit."""
    from bench import blocks

    rows = blocks.run((130, 300), 1, log=lambda s: None, dtype="int4")
    assert {r["op"] for r in rows} == {"quantize", "dequantize", "choose_qparams"}
    assert all(r["dtype"] == "int4" and r["mismatches"] == 0 for r in rows)


def test_kernel_resources_names_every_registered_kernel():
    # Every name expression the library compiles gets a short name (bf16 was missing: KeyError 'gpuq_bf16').
    from bench import kernel_resources
    from gpuq.backends.cuda import registry

    names = [kernel_resources.short_name(e) for names in registry.SOURCES.values() for e in names()]
    assert len(names) == sum(len(f()) for f in registry.SOURCES.values())
    assert any(n.startswith("quantize bf16>s8 ") for n in names)
    assert not any("gpuq_bf16" in n or "__half" in n or "signed char" in n for n in names)


def test_checkpoint_bench_tiny(tmp_path, capsys):
    """bench/checkpoint.py at a tiny size: the folder is a Llama checkpoint, every figure is there."""
    import ml_dtypes
    from safetensors.numpy import load_file

    from bench import checkpoint as ck

    folder = tmp_path / "model"
    out_json = tmp_path / "figures.json"
    assert ck.main(["--scale", "64", "--layers", "1", "--scheme", "fp8", "--top", "15", "--no-warmup",
                    "--pause", "0", "--dir", str(folder), "--tmp", str(tmp_path), "--json", str(out_json)]) == 0
    with open(folder / "config.json") as f:
        cfg = json.load(f)
    assert (cfg["model_type"], cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"],
            cfg["num_hidden_layers"], cfg["dtype"]) == ("llama", 128, 128, 500, 1, "bfloat16")
    tensors = load_file(str(folder / "model.safetensors"))
    assert {k: v.shape for k, v in tensors.items()} == ck.layout(ck.dims(64), 1)
    assert all(v.dtype == ml_dtypes.bfloat16 for v in tensors.values())
    with open(out_json) as f:
        res = json.load(f)
    assert list(res["schemes"]) == ["fp8"]
    row = res["schemes"]["fp8"]
    assert row["wall_s"] > 0 and row["in_memory_s"] > 0 and row["peak_rss_mib"] > 10
    assert row["ratio_to_copy"] == pytest.approx(row["wall_s"] / res["warm_copy_s"])
    # The profile is pstats' table of the command itself, with the header and 15 rows (imports can
    # fill the first five on a loaded machine).
    lines = row["profile"].splitlines()
    assert lines[0].split()[:4] == ["ncalls", "tottime", "percall", "cumtime"] and len(lines) >= 6
    assert "gpuq" in row["profile"]
    assert "peak RSS" in capsys.readouterr().out
    # The outputs and the copy are gone: only the folder and the JSON remain.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["figures.json", "model"]


def test_checkpoint_bench_dims_refuse_bad_scale():
    from bench import checkpoint as ck

    with pytest.raises(ValueError, match="--scale"):
        ck.dims(0)


def test_checkpoint_bench_commands_of_each_format(tmp_path):
    """gpuq's own format takes the folder's file and writes one file; the serving formats write a
    folder; ``remove_output`` removes either."""
    from bench import checkpoint as ck

    argv = ck.command("/m", str(tmp_path / "out"), "gpuq-int4")
    assert argv[3:7] == ["quantize", "/m/model.safetensors", "-o", str(tmp_path / "out") + ".safetensors"]
    assert "--format" not in argv and argv[-3:] == ["--device", "cpu", "-q"]
    argv = ck.command("/m", str(tmp_path / "out"), "fp8-blocks")
    assert argv[3:8] == ["quantize", "/m", "-o", str(tmp_path / "out"), "--format"] and "fp8-blocks" in argv
    assert ck.in_memory("/nonexistent", "nvfp4") is None  # no in-memory equivalent: not timed
    (tmp_path / "out.safetensors").write_bytes(b"x")
    (tmp_path / "out").mkdir()
    ck.remove_output(str(tmp_path / "out"))
    assert list(tmp_path.iterdir()) == []


def test_checkpoint_bench_reps_and_llmcompressor(tmp_path, monkeypatch):
    """``--reps`` alternates copies and runs (medians), and ``--llmcompressor`` runs the side
    interpreter's ``model_free_ptq`` alternated with the command: here a stand-in package that
    copies the folder, so the plumbing (its argv, the time it prints, the rows) is what is tested."""
    from bench import checkpoint as ck

    fake = tmp_path / "fake" / "llmcompressor"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "import json, shutil, sys\n"
        "def model_free_ptq(src, dst, scheme, ignore, device):\n"
        "    shutil.copytree(src, dst)\n"
        "    print(json.dumps([scheme, ignore, device]))\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path / "fake"), ck.REPO]))
    folder, out_json = tmp_path / "model", tmp_path / "figures.json"
    assert ck.main(["--scale", "64", "--layers", "1", "--scheme", "int4", "--top", "0", "--no-warmup",
                    "--reps", "3", "--pause", "0", "--dir", str(folder), "--tmp", str(tmp_path),
                    "--json", str(out_json),
                    "--llmcompressor", sys.executable, "--llmc-runs", "2"]) == 0
    with open(out_json) as f:
        row = json.load(f)["schemes"]["int4"]
    assert len(row["runs"]) == len(row["copies_s"]) == 3 and row["wall_s"] == sorted(row["runs"])[1]
    assert row["ratio_to_copy"] == pytest.approx(row["wall_s"] / sorted(row["copies_s"])[1])
    assert 0 < row["cpu_s"]
    # each run after a flush (os.sync): what it found, and the dirty peak during a run
    assert row["synced"] is True and len(row["dirty_before_mib"]) == 3 and row["dirty_peak_mib"] >= 0
    cmp = row["llmcompressor"]
    assert [len(cmp["gpuq"]), len(cmp["llmcompressor"])] == [2, 2]
    assert all(r["call_s"] is not None and 0 <= r["call_s"] < r["wall_s"] for r in cmp["llmcompressor"])
    assert all(r["call_s"] is None and r["cpu_s"] > 0 for r in cmp["gpuq"])
    argv = ck.llmc_command("PY", "/m", "/o", "fp8")
    assert argv[0] == "PY" and argv[-3:] == ["/m", "/o", "FP8_DYNAMIC"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fake", "figures.json", "model"]


def test_checkpoint_bench_settle_flushes_and_waits(monkeypatch):
    """settle: os.sync then the pause where asked, nothing where not; it reports the dirty MiB."""
    from bench import checkpoint as ck

    calls = []
    monkeypatch.setattr(ck.os, "sync", lambda: calls.append("sync"))
    monkeypatch.setattr(ck.time, "sleep", lambda s: calls.append(s))
    assert ck.settle(True, 0.25) >= 0 and calls == ["sync", 0.25]
    calls.clear()
    assert ck.settle(False) >= 0 and calls == []
    assert ck.dirty_mib() >= 0
