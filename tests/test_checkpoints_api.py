"""gpuq.checkpoints from Python (issue 36): the command's outputs and reports, byte for byte;
all-or-nothing OUT when the progress callback raises KeyboardInterrupt; bad arguments refused
before anything is written; warnings as GpuqWarning; inspect without reading the weights."""

from __future__ import annotations

import json
import os
import signal
import warnings
from pathlib import Path

import numpy as np
import pytest

import gpuq.checkpoints as ckpt
from gpuq import cli
from gpuq.checkpoints.files import write_checkpoint
from gpuq.checkpoints.report import to_json

pytest.importorskip("ml_dtypes")


def tree(path) -> dict:
    """``{relative path: bytes}`` of a file or a folder (hidden files included); None if absent."""
    path = Path(path)
    if not path.exists():
        return None
    if path.is_file():
        return {".": path.read_bytes()}
    return {str(p.relative_to(path)): p.read_bytes() if p.is_file() else "<dir>"
            for p in sorted(path.rglob("*"))}


def make_sharded(folder: Path) -> Path:
    """The example checkpoint as two shards and their index (no config.json)."""
    from gpuq.checkpoints.example_data import example_tensors

    t = example_tensors(0)
    folder.mkdir(parents=True)
    names = sorted(t)
    weight_map = {}
    for i, part in enumerate((names[: len(names) // 2], names[len(names) // 2:])):
        shard = f"model-{i + 1:05d}-of-00002.safetensors"
        write_checkpoint(str(folder / shard), "safetensors", {n: t[n] for n in part}, None, {"format": "pt"})
        weight_map.update({n: shard for n in part})
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    return folder


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("inputs")
    ckpt.example(str(root / "tiny.safetensors"))
    ckpt.example(model_dir=str(root / "model"))
    make_sharded(root / "sharded")
    return {"file": root / "tiny.safetensors", "folder": root / "model", "sharded": root / "sharded"}


def _flags(options: dict) -> list:
    out = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        out += [flag] if value is True else [flag, str(value)]
    return out


def _out(kind, tmp_path, name):
    return tmp_path / (f"{name}.safetensors" if kind == "file" else name)


def _command_json(capsys, *argv) -> dict:
    capsys.readouterr()
    quiet = ["-q"] if argv[0] != "compare" else []
    assert cli.main([str(a) for a in argv] + ["--json"] + quiet) == 0
    return json.loads(capsys.readouterr().out)


def _api_json(report, api_out, cmd_out) -> dict:
    return json.loads(to_json(report).replace(json.dumps(str(api_out))[1:-1], json.dumps(str(cmd_out))[1:-1]))


CASES = [
    ("file", {}),
    ("file", {"dtype": "int4", "group_size": 32, "symmetric": True}),
    ("file", {"dtype": "float8_e4m3fn", "block": "32x32", "calibrate": "mse", "exclude": "lm_head.*"}),
    ("sharded", {"dtype": "uint8", "per_tensor": True}),
    ("folder", {"format": "compressed-tensors", "dtype": "int4", "group_size": 128}),
    ("folder", {"format": "compressed-tensors"}),
    ("folder", {"format": "fp8-blocks"}),
]


@pytest.mark.parametrize("kind, options", CASES, ids=[f"{k}-{'-'.join(map(str, o.values())) or 'default'}"
                                                      for k, o in CASES])
def test_same_bytes_and_report_as_the_command(inputs, tmp_path, capsys, kind, options):
    src = inputs[kind]
    cmd_out, api_out = _out(kind, tmp_path, "cmd"), _out(kind, tmp_path, "api")
    want = _command_json(capsys, "quantize", src, "-o", cmd_out, *_flags(options))
    got = ckpt.quantize(src, api_out, **options)
    assert _api_json(got, api_out, cmd_out) == want
    assert tree(api_out) == tree(cmd_out) and tree(api_out)
    # ... and back: dequantize from the command and from Python
    cmd_back, api_back = _out(kind, tmp_path, "cmd-back"), _out(kind, tmp_path, "api-back")
    want = _command_json(capsys, "dequantize", cmd_out, "-o", cmd_back)
    got = ckpt.dequantize(cmd_out, api_back)
    assert _api_json(got, api_back, cmd_back) == want
    assert tree(api_back) == tree(cmd_back) and tree(api_back)


def test_compare_and_example_are_the_commands(inputs, tmp_path, capsys):
    want = _command_json(capsys, "compare", inputs["file"], "--scheme", "int8", "--scheme", "int4:g64")
    assert json.loads(to_json(ckpt.compare(inputs["file"], scheme=["int8", "int4:g64"]))) == want
    capsys.readouterr()
    assert cli.main(["example", str(tmp_path / "a.safetensors"), "--seed", "3"]) == 0
    ckpt.example(str(tmp_path / "b.safetensors"), seed=3)
    assert tree(tmp_path / "a.safetensors") == tree(tmp_path / "b.safetensors")


def _interrupt_at(k):
    seen = []

    def progress(done, total, name):
        seen.append((done, total, name))
        assert signal.getsignal(signal.SIGTERM) is before[signal.SIGTERM]  # the library installs none
        if done == k:
            raise KeyboardInterrupt

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    return progress, seen


INTERRUPTED = [("file", {}), ("sharded", {}), ("folder", {"format": "compressed-tensors"}),
               ("folder", {"format": "fp8-blocks"})]


@pytest.mark.parametrize("existing", [False, True], ids=["new-out", "existing-out"])
@pytest.mark.parametrize("kind, options", INTERRUPTED, ids=[k + "-" + o.get("format", "gpuq")
                                                            for k, o in INTERRUPTED])
def test_keyboard_interrupt_from_progress_leaves_out_as_it_was(inputs, tmp_path, kind, options, existing):
    out = _out(kind, tmp_path, "out")
    if existing:
        ckpt.quantize(inputs[kind], out, **options, dtype="float8_e4m3fn" if kind != "folder" else None)
    before, listing = tree(out), sorted(os.listdir(tmp_path))
    progress, seen = _interrupt_at(3)
    with pytest.raises(KeyboardInterrupt):
        ckpt.quantize(inputs[kind], out, **options, progress=progress)
    assert [d for d, _, _ in seen] == [1, 2, 3] and all(isinstance(n, str) for _, _, n in seen)
    assert tree(out) == before
    assert sorted(os.listdir(tmp_path)) == listing  # no staging file left beside OUT
    # The same interruption in dequantize
    if existing:
        back = _out(kind, tmp_path, "back")
        progress, _ = _interrupt_at(2)
        with pytest.raises(KeyboardInterrupt):
            ckpt.dequantize(out, back, progress=progress)
        assert not back.exists() and tree(out) == before


@pytest.mark.parametrize("kwargs, exc, match", [
    ({"group_size": 0}, ValueError, "--group-size must be a positive integer, got 0"),
    ({"group_size": "128"}, TypeError, "group_size must be an int"),
    ({"dtype": "int3"}, ValueError, "dtype must be one of int8"),
    ({"format": "gguf"}, ValueError, "format must be one of gpuq, compressed-tensors, fp8-blocks"),
    ({"per_tensor": True, "axis": 0}, ValueError, "per_tensor and axis"),
    ({"symmetric": True, "asymmetric": True}, ValueError, "symmetric and asymmetric"),
    ({"asymmetric": True, "dtype": "float8_e5m2"}, ValueError, "has no zero point"),
    ({"nonfinite": "ignore"}, ValueError, "nonfinite must be one of error, warn, allow"),
    ({"min_size": -1}, ValueError, "--min-size must be >= 0"),
    ({"progress": 1}, TypeError, "progress must be False, True or a callable"),
    ({"include": [1]}, TypeError, "include must be a glob"),
    ({"block": 32}, TypeError, "block must be 'AxB'"),
    ({"format": "fp8-blocks", "dtype": "int8"}, ValueError, "--format fp8-blocks has one scheme"),
    ({"workers": 2}, ValueError, "--scheduler/--workers run the shards of a sharded IN"),
])
def test_bad_arguments_raise_before_anything_is_written(inputs, tmp_path, kwargs, exc, match):
    out = tmp_path / "out" / "q.safetensors"
    (tmp_path / "out").mkdir()
    with pytest.raises(exc, match=match):
        ckpt.quantize(inputs["file"], out, **kwargs)
    assert os.listdir(tmp_path / "out") == []


def test_bad_paths_and_dequantize_arguments(inputs, tmp_path):
    with pytest.raises(TypeError, match="src must be a path"):
        ckpt.quantize(3, tmp_path / "q.safetensors")
    with pytest.raises(TypeError, match="out must be a path"):
        ckpt.dequantize(inputs["file"], None)
    with pytest.raises(ValueError, match="dtype must be one of bfloat16, float16, float32, float64"):
        ckpt.dequantize(inputs["file"], tmp_path / "d.safetensors", dtype="int8")
    with pytest.raises(ValueError, match="cannot read IN .*: no such file"):
        ckpt.quantize(tmp_path / "missing.safetensors", tmp_path / "q.safetensors")
    with pytest.raises(ValueError, match="out .* or model_dir, one of them"):
        ckpt.example()
    assert os.listdir(tmp_path) == []


def test_warnings_are_gpuq_warnings_and_nothing_is_printed(tmp_path, capsys):
    x = np.linspace(-1, 1, 64 * 64, dtype=np.float32).reshape(64, 64)
    x[3, 5] = np.nan
    write_checkpoint(str(tmp_path / "nan.safetensors"), "safetensors", {"w": x}, None)
    with pytest.warns(ckpt.GpuqWarning, match="NaN"):
        report = ckpt.quantize(tmp_path / "nan.safetensors", tmp_path / "q.safetensors")
    assert report["tensors"][0]["nonfinite"]["nan"] == 1
    assert len(report["warnings"]) == 1 and "NaN" in report["warnings"][0]
    assert capsys.readouterr() == ("", "")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ckpt.GpuqWarning)
        with pytest.raises(ckpt.GpuqWarning):
            ckpt.quantize(tmp_path / "nan.safetensors", tmp_path / "q2.safetensors")
    assert not (tmp_path / "q2.safetensors").exists()


def test_inspect_names_format_roles_and_schemes(inputs, tmp_path):
    dense = ckpt.inspect(inputs["file"])
    assert dense["format"] == "dense" and {t["role"] for t in dense["tensors"]} == {"kept"}
    ckpt.quantize(inputs["file"], tmp_path / "q.safetensors", dtype="int4", group_size=32)
    q = ckpt.inspect(tmp_path / "q.safetensors")
    roles = {t["name"]: t["role"] for t in q["tensors"]}
    assert q["format"] == "gpuq" and q["dequantize_dtype"] == ["bfloat16"]
    assert roles["lm_head.weight"] == "quantized" and roles["lm_head.weight.scales"] == "parameter"
    assert roles["model.norm.weight"] == "kept"
    lm = next(t for t in q["tensors"] if t["name"] == "lm_head.weight")
    assert lm["scheme"]["dtype"] == "int4" and lm["scheme"]["group_size"] == 32

    for fmt, method in (("compressed-tensors", "compressed-tensors"), ("fp8-blocks", "fp8")):
        out = tmp_path / fmt
        ckpt.quantize(inputs["folder"], out, format=fmt)
        info = ckpt.inspect(out)
        assert info["format"] == fmt and info["quant_method"] == method
        assert info["dequantize_dtype"] == "bfloat16" and info["shards"] == ["model.safetensors"]
        roles = {t["name"]: t["role"] for t in info["tensors"]}
        assert "quantized" in roles.values() and "parameter" in roles.values()
        assert roles["model.norm.weight"] == "kept"
    assert "config_groups" in ckpt.inspect(tmp_path / "compressed-tensors")
    assert ckpt.inspect(inputs["sharded"])["shards"] == ["model-00001-of-00002.safetensors",
                                                          "model-00002-of-00002.safetensors"]


def test_the_readme_from_python_example_runs(tmp_path, monkeypatch):
    """README's "From Python" example, as a doctest (skipped without transformers)."""
    import doctest
    import re

    pytest.importorskip("transformers")
    pytest.importorskip("compressed_tensors")
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme[readme.index("## From Python"):]
    (block,) = re.findall(r"```python\n(>>>.*?)```", section[:section.index("\n## ")], re.S)
    monkeypatch.chdir(tmp_path)
    test = doctest.DocTestParser().get_doctest(block, {}, "README From Python", "README.md", 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    runner.run(test)
    assert runner.summarize(verbose=False).failed == 0 and len(test.examples) == 6
