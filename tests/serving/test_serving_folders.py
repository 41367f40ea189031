"""What a model-folder run carries into OUT and what OUT may already hold (issue 35, points 3, 4).

A sentence-transformers folder (the layout ``SentenceTransformer.save`` writes: ``modules.json``
naming ``1_Pooling/``, ``2_Dense/`` with its own weights, ``2_Normalize/``) keeps every module
folder bit for bit in both directions; an OUT holding anything but hidden files and the names
the run writes is refused before anything is written.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from _serving import gpuq_main, make_model, one_error_line

FORMATS = [("compressed-tensors", "--dtype", "int8"), ("compressed-tensors", "--dtype", "float8_e4m3fn"),
           ("fp8-blocks",)]


def tree(folder: Path) -> dict:
    """Every file under ``folder`` (relative path -> bytes), hidden ones too."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def make_sentence_transformer(folder: Path) -> dict:
    """A Llama-shaped model with sentence-transformers' module folders; returns their files."""
    from gpuq.checkpoints.files import write_checkpoint

    make_model(folder, extra=False)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"},
               {"idx": 3, "name": "3", "path": "3_Normalize", "type": "sentence_transformers.models.Normalize"}]
    (folder / "modules.json").write_text(json.dumps(modules, indent=2))
    (folder / "sentence_bert_config.json").write_text('{"max_seq_length": 256, "do_lower_case": false}\n')
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text('{"word_embedding_dimension": 128, "pooling_mode_mean_tokens": true}\n')
    (folder / "2_Dense").mkdir()
    (folder / "2_Dense" / "config.json").write_text('{"in_features": 128, "out_features": 256}\n')
    dense = np.random.default_rng(1).normal(size=(256, 128)).astype(np.float32)  # big enough to be chosen
    write_checkpoint(str(folder / "2_Dense" / "model.safetensors"), "safetensors", {"linear.weight": dense}, None)
    (folder / "3_Normalize").mkdir()  # an empty module folder, as sentence-transformers writes it
    return {k: v for k, v in tree(folder).items() if k.split("/")[0][0].isdigit()}


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: " ".join(f))
def test_module_folders_are_copied_both_ways(tmp_path, capsys, fmt):
    modules = make_sentence_transformer(tmp_path / "m")
    q, d = tmp_path / "q", tmp_path / "d"
    assert gpuq_main("quantize", tmp_path / "m", "-o", q, "--format", *fmt, "--device", "cpu", "-q",
                     "--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["modules"] == ["1_Pooling", "2_Dense", "3_Normalize"]
    assert all("2_Dense" not in t["name"] for t in report["tensors"])  # its weights never quantized
    assert gpuq_main("dequantize", q, "-o", d, "--device", "cpu") == 0
    err = capsys.readouterr()
    assert "note: copied bit for bit: 1_Pooling/, 2_Dense/, 3_Normalize/" in err.out + err.err
    for out in (q, d):
        assert {k: v for k, v in tree(out).items() if k.split("/")[0][0].isdigit()} == modules
        assert (out / "3_Normalize").is_dir()
        assert (out / "modules.json").read_bytes() == (tmp_path / "m" / "modules.json").read_bytes()
    # a re-run into the same OUT replaces the module folders whole (a stale file in one goes)
    (q / "1_Pooling" / "stale.json").write_text("{}")
    assert gpuq_main("quantize", tmp_path / "m", "-o", q, "--format", *fmt, "--device", "cpu", "-q") == 0
    assert {k: v for k, v in tree(q).items() if k.split("/")[0][0].isdigit()} == modules
    assert not [f for f in os.listdir(q) if f.startswith(".")]  # nothing staged or moved aside left


def test_a_failed_commit_leaves_the_module_folders_as_they_were(tmp_path, capsys, monkeypatch):
    make_sentence_transformer(tmp_path / "m")
    q = tmp_path / "q"
    assert gpuq_main("quantize", tmp_path / "m", "-o", q, "--format", "fp8-blocks", "--device", "cpu", "-q") == 0
    (q / "1_Pooling" / "config.json").write_text("earlier")
    before = tree(q)
    from gpuq.checkpoints.files import CliError
    from gpuq.checkpoints.serving import folder

    def fail(self, stale, staged):
        raise CliError("cannot write OUT: disk full")

    monkeypatch.setattr(folder.ModelOutput, "put_in_place", fail)  # after the module folders moved aside
    assert gpuq_main("quantize", tmp_path / "m", "-o", q, "--format", "fp8-blocks", "--device", "cpu", "-q") == 2
    assert "disk full" in one_error_line(capsys)
    assert tree(q) == before


def test_module_paths_that_are_not_plain_subfolders_are_not_copied(tmp_path, capsys):
    make_model(tmp_path / "m", extra=False)
    (tmp_path / "m" / "modules.json").write_text(json.dumps(
        [{"path": ""}, {"path": "../elsewhere"}, {"path": "missing"}, {"path": "sub/inner"}, {"path": "1_Pooling"}]))
    (tmp_path / "m" / "1_Pooling").mkdir()
    (tmp_path / "m" / "sub" / "inner").mkdir(parents=True)
    assert gpuq_main("quantize", tmp_path / "m", "-o", tmp_path / "q", "--format", "fp8-blocks", "--device",
                     "cpu", "-q", "--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["modules"] == ["1_Pooling"] and report["left_out"] == ["sub/"]
    (tmp_path / "m" / "modules.json").write_text('{"not": "a list"}')
    assert gpuq_main("quantize", tmp_path / "m", "-o", tmp_path / "q2", "--format", "fp8-blocks") == 2
    assert "modules.json is a list of objects, it holds dict" in one_error_line(capsys)
    assert not (tmp_path / "q2").exists()


# -- point 4: an OUT that holds another model ---------------------------------------------------

@pytest.mark.parametrize("other", ["model.safetensors", "tokenizer.json", "pytorch_model.bin", "1_Pooling/",
                                   "notes.txt"])
@pytest.mark.parametrize("command", ["quantize", "dequantize"])
def test_an_out_holding_another_model_is_refused(tmp_path, capsys, other, command):
    """OUT holds another single-file model (its weights, tokenizer, a module folder): refused,
    nothing written; the run's own names and hidden files are allowed."""
    make_model(tmp_path / "m", extra=False)
    src = tmp_path / "m"
    if command == "dequantize":
        assert gpuq_main("quantize", src, "-o", tmp_path / "q", "--format", "fp8-blocks", "-q") == 0
        src = tmp_path / "q"
    out = tmp_path / "out"
    make_model(out, extra=False, seed=3)  # another model: config.json, model.safetensors, generation_config
    (out / ".gitattributes").write_text("*.safetensors filter=lfs\n")  # hidden: allowed
    if other.endswith("/"):
        (out / other).mkdir()
    elif other != "model.safetensors":
        (out / other).write_text("another model's")
    before = tree(out)
    status = gpuq_main(command, src, "-o", out, "--device", "cpu", "-q",
                       *(["--format", "compressed-tensors"] if command == "quantize" else []))
    if other == "model.safetensors":  # only names this run writes: replaced
        assert status == 0
        assert tree(out) != before and (out / ".gitattributes").exists()
        return
    assert status == 2
    assert f"holds {other.rstrip('/')!r}, which this run would not replace" in one_error_line(capsys)
    assert tree(out) == before and sorted(os.listdir(out)) == sorted(
        {p.split("/")[0] for p in before} | ({other.rstrip("/")} if other.endswith("/") else set()))


def test_a_rerun_into_the_same_out_works(tmp_path, capsys):
    make_model(tmp_path / "m")  # with a tokenizer (copied), a .bin and a subfolder (left out)
    for _ in range(2):
        assert gpuq_main("quantize", tmp_path / "m", "-o", tmp_path / "q", "--format", "compressed-tensors",
                         "--device", "cpu", "-q") == 0
        assert gpuq_main("dequantize", tmp_path / "q", "-o", tmp_path / "d", "--device", "cpu", "-q") == 0


def test_an_older_compression_config_is_read_as_its_quantization_config(tmp_path, capsys):
    """compressed-tensors before 0.9 wrote ``compression_config``: the format that reads the folder
    is chosen by it (its ``reads``), and the dense folder matches the new key's."""
    import gpuq.checkpoints as ckpt

    make_model(tmp_path / "m", extra=False)
    q, old = tmp_path / "q", tmp_path / "old"
    assert gpuq_main("quantize", tmp_path / "m", "-o", q, "--format", "compressed-tensors", "--dtype", "int4",
                     "--asymmetric", "--device", "cpu", "-q") == 0
    capsys.readouterr()
    old.mkdir()
    for f in q.iterdir():
        (old / f.name).write_bytes(f.read_bytes())
    config = json.loads((q / "config.json").read_text())
    config["compression_config"] = config.pop("quantization_config")
    (old / "config.json").write_text(json.dumps(config))
    reports = [ckpt.dequantize(str(src), str(tmp_path / f"d{i}"), progress=False)
               for i, src in enumerate((q, old))]
    assert [r["format"] for r in reports] == ["compressed-tensors pack-quantized"] * 2
    assert tree(tmp_path / "d0") == tree(tmp_path / "d1")
