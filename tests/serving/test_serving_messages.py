"""Messages and checks a new user met (issue 35, point 8): each one line, exit 2 and nothing
written where it is refused; the notes a model-folder report carries; the output index's totals."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from _serving import BF16, gpuq_main, load, load_folder, make_model, one_error_line, reshard

CPU = ("--device", "cpu")


def _edit_config(folder, **items):
    path = Path(folder, "config.json")
    path.write_text(json.dumps({**json.loads(path.read_text()), **items}, indent=2))


@pytest.mark.parametrize("key", ["dtype", "torch_dtype"])
def test_an_unknown_config_dtype_is_refused(tmp_path, capsys, key):
    make_model(tmp_path / "m", extra=False)
    assert gpuq_main("quantize", tmp_path / "m", "-o", tmp_path / "q", "--format", "fp8-blocks", *CPU, "-q") == 0
    capsys.readouterr()
    for folder in (tmp_path / "m", tmp_path / "q"):
        _edit_config(folder, **{key: "foo"})
    for command, src, more in (("quantize", "m", ["--format", "compressed-tensors"]), ("dequantize", "q", [])):
        assert gpuq_main(command, tmp_path / src, "-o", tmp_path / "out", *more, *CPU) == 2
        assert (f"config.json's {key!r} is 'foo', not a dtype a model's weights come in (bfloat16, float16, "
                f"float32, float64)") in one_error_line(capsys)
        assert not (tmp_path / "out").exists()


def test_a_group_size_that_divides_no_input_dimension_says_so(tmp_path, capsys):
    make_model(tmp_path / "m", extra=False, hidden=128, inter=256)
    assert gpuq_main("quantize", tmp_path / "m", "-o", tmp_path / "q", "--format", "compressed-tensors",
                     "--dtype", "int4", "--group-size", "512", *CPU) == 2
    line = one_error_line(capsys)
    # the reason that kept most weights first: the group size and each input dimension named
    assert ("(6 weights: group size 512 does not divide its input dimension 128 (compressed-tensors refuses "
            "it); 1 weight: group size 512 does not divide its input dimension 256") in line, line
    assert line.index("group size 512") < line.index("the output layer")
    assert not (tmp_path / "q").exists()


def test_a_model_folder_without_format_gets_a_hint(tmp_path, capsys):
    make_model(tmp_path / "m", extra=False)
    assert gpuq_main("quantize", tmp_path / "m", "-o", tmp_path / "q", *CPU) == 2
    line = one_error_line(capsys)
    assert "is a model folder with one model.safetensors: add --format compressed-tensors or fp8-blocks" in line
    assert f"or pass MODEL_DIR/model.safetensors ({str(tmp_path / 'm' / 'model.safetensors')!r})" in line
    assert not (tmp_path / "q").exists()


def test_compare_reads_a_model_folder(tmp_path, capsys):
    make_model(tmp_path / "m", extra=False)
    assert gpuq_main("compare", tmp_path / "m" / "model.safetensors", *CPU, "--json") == 0
    by_file = json.loads(capsys.readouterr().out)
    assert gpuq_main("compare", tmp_path / "m", *CPU, "--json") == 0
    by_folder = json.loads(capsys.readouterr().out)
    assert by_folder["tensors"] == by_file["tensors"] and len(by_file["tensors"]) == 9  # 7 linears, the embedding, lm_head


@pytest.mark.parametrize("command", ["quantize", "dequantize", "compare"])
def test_a_missing_path_without_an_extension_does_not_exist(tmp_path, capsys, command):
    out = [] if command == "compare" else ["-o", tmp_path / "o.safetensors"]
    assert gpuq_main(command, tmp_path / "nothere", *out) == 2
    assert f"IN {str(tmp_path / 'nothere')!r}: it does not exist" in one_error_line(capsys)


def test_fused_expert_tensors_kept_in_float_get_a_note(tmp_path, capsys):
    from gpuq.checkpoints.files import write_checkpoint

    t = make_model(tmp_path / "m", extra=False)
    rng = np.random.default_rng(5)
    t["model.layers.0.mlp.experts.gate_up_proj"] = rng.normal(size=(4, 128, 64)).astype(np.float32).astype(BF16)
    t["model.layers.0.mlp.experts.down_proj"] = rng.normal(size=(4, 32, 128)).astype(np.float32).astype(BF16)
    write_checkpoint(str(tmp_path / "m" / "model.safetensors"), "safetensors", t, None, {"format": "pt"})
    assert gpuq_main("quantize", tmp_path / "m", "-o", tmp_path / "q", "--format", "fp8-blocks", *CPU, "-q",
                     "--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert ("note: kept in float: 2 tensors of rank 3 or more (model.layers.0.mlp.experts.down_proj, "
            "model.layers.0.mlp.experts.gate_up_proj): fused expert weights, not a Linear module's weight, "
            "which is what --format fp8-blocks quantizes") in report["notes"]
    out = load(tmp_path / "q" / "model.safetensors")
    for name in ("model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.down_proj"):
        assert out[name].tobytes() == t[name].tobytes()


@pytest.mark.parametrize("dtype, marlin", [("int8", True), ("int4", True), ("float8_e4m3fn", False)])
def test_the_marlin_note_only_where_the_column_has_marlin_rules(tmp_path, capsys, dtype, marlin):
    make_model(tmp_path / "m", extra=False)
    assert gpuq_main("quantize", tmp_path / "m", "-o", tmp_path / "q", "--format", "compressed-tensors",
                     "--dtype", dtype, *CPU, "-q", "--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert any("Marlin" in n for n in report["notes"]) == marlin
    column = {t["vllm"] for t in report["tensors"] if t["quantized"]}
    assert (column == {"-"}) == (not marlin)


@pytest.mark.parametrize("command", ["quantize", "dequantize"])
def test_the_output_index_recomputes_its_totals(tmp_path, capsys, command):
    make_model(tmp_path / "one", extra=False, layers=2)
    reshard(tmp_path / "one", tmp_path / "m", lambda name: 0 if "layers.0." in name else 1, 2)
    index = tmp_path / "m" / "model.safetensors.index.json"
    meta = json.loads(index.read_text())
    meta["metadata"].update(total_parameters=123, total_size=456)  # what a stale index would say
    index.write_text(json.dumps(meta))
    src = tmp_path / "m"
    if command == "dequantize":
        assert gpuq_main("quantize", src, "-o", tmp_path / "q", "--format", "compressed-tensors", "--dtype",
                         "int4", *CPU, "-q") == 0
        src = tmp_path / "q"
    out = tmp_path / "out"
    args = ["--format", "compressed-tensors", "--dtype", "int4"] if command == "quantize" else []
    assert gpuq_main(command, src, "-o", out, *args, *CPU, "-q") == 0
    got = json.loads((out / "model.safetensors.index.json").read_text())["metadata"]
    tensors = load_folder(out)
    assert got["total_parameters"] == sum(math.prod(v.shape) for v in tensors.values())
    assert got["total_size"] == sum(v.nbytes for v in tensors.values())
    assert got["total_parameters"] != 123
    # an index without total_parameters gets none
    meta["metadata"].pop("total_parameters")
    index.write_text(json.dumps(meta))
    if command == "quantize":
        assert gpuq_main(command, tmp_path / "m", "-o", out, *args, *CPU, "-q") == 0
        assert "total_parameters" not in json.loads((out / "model.safetensors.index.json").read_text())["metadata"]
