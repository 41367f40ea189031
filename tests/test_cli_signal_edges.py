"""A stop before the command runs and after OUT is complete (issue 35, point 9).

The ``gpuq`` console script is ``_gpuq_entry:main``; its module installs SIGINT/SIGTERM
handlers before anything is imported. Each case starts the console script's statements in a
child process (``import _gpuq_entry; main()``, as the generated script does) with
``GPUQ_TEST_SIGNAL_AT=POINT:SIGNAME``, the hook that makes the process send itself the signal
at a named point: ``imports`` (before NumPy or gpuq is imported), ``commit`` (inside the
output's commit, after its last rename: the signal waits for the commit's end) and ``done``
(after the command returned). No timing: the signal lands exactly there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_cli_sharded import OPTIONS, file_bytes, gpuq_main, make_sharded, shard_name

REPO = Path(__file__).resolve().parents[1]
SCRIPT = "import sys, _gpuq_entry; sys.exit(_gpuq_entry.main())"
LINE = {"SIGINT": (130, "gpuq: interrupted"), "SIGTERM": (143, "gpuq: terminated (SIGTERM)")}


def run_gpuq(tmp_path, at, *args):
    env = dict(os.environ, PYTHONPATH=str(REPO), GPUQ_TEST_SIGNAL_AT=at)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, *map(str, args)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


def test_the_console_script_is_the_early_entry():
    text = (REPO / "pyproject.toml").read_text()
    assert 'gpuq = "_gpuq_entry:main"' in text and 'py-modules = ["_gpuq_entry"]' in text
    # its handlers come before any import but the interpreter's own
    head = (REPO / "_gpuq_entry.py").read_text().split('"""')[2]
    code = [ln for ln in head.splitlines() if ln.strip() and not ln.startswith("#")]
    assert code[:3] == ["import _signal", "import os", "import sys"], code[:3]


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_stop_during_the_imports_is_one_line(tmp_path, sig):
    make_sharded(tmp_path / "in", n_shards=1)
    out = tmp_path / "q.safetensors"
    status, stdout, err = run_gpuq(tmp_path, f"imports:{sig}", "quantize", tmp_path / "in" / shard_name(0, 1),
                                   "-o", out, *OPTIONS)
    assert (status, err.splitlines(), stdout) == (LINE[sig][0], [LINE[sig][1]], "")
    assert not out.exists() and sorted(os.listdir(tmp_path)) == ["in"]


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_stop_after_the_commit_says_out_is_complete(tmp_path, sig):
    """One file, a sharded folder: the signal comes inside the commit (held to its end) or
    after the command returned; OUT is the one an unstopped run writes."""
    make_sharded(tmp_path / "in", n_shards=2)
    one = tmp_path / "in" / shard_name(0, 2)
    assert gpuq_main("quantize", one, "-o", tmp_path / "ref.safetensors", *OPTIONS) == 0
    assert gpuq_main("quantize", tmp_path / "in", "-o", tmp_path / "ref", *OPTIONS) == 0
    cases = [("commit", one, tmp_path / "a.safetensors", tmp_path / "ref.safetensors"),
             ("done", one, tmp_path / "b.safetensors", tmp_path / "ref.safetensors"),
             ("commit", tmp_path / "in", tmp_path / "c", tmp_path / "ref")]
    for point, src, out, ref in cases:
        status, stdout, err = run_gpuq(tmp_path, f"{point}:{sig}", "quantize", src, "-o", out, *OPTIONS)
        code, line = LINE[sig]
        assert status == code, (point, err)
        assert err.splitlines() == [f"{line} after OUT {str(out)!r} was complete (written whole; only the "
                                    f"report is cut short)"], (point, err)
        assert ("gpuq quantize:" in stdout) == (point == "done")  # the report, when it was printed
        if out.is_dir():
            assert file_bytes(out) == file_bytes(ref)
        else:
            assert out.read_bytes() == ref.read_bytes()


def test_a_stop_inside_a_model_folder_commit_says_out_is_complete(tmp_path):
    sys.path.insert(0, str(REPO / "tests" / "serving"))
    try:
        from _serving import make_model
    finally:
        sys.path.remove(str(REPO / "tests" / "serving"))
    make_model(tmp_path / "m", extra=False)
    status, stdout, err = run_gpuq(tmp_path, "commit:SIGTERM", "quantize", tmp_path / "m", "-o", tmp_path / "q",
                                   "--format", "fp8-blocks", "--device", "cpu")
    assert status == 143 and stdout == ""
    assert err.splitlines() == [f"gpuq: terminated (SIGTERM) after OUT {str(tmp_path / 'q')!r} was complete "
                                f"(written whole; only the report is cut short)"]
    assert "quantization_config" in json.loads((tmp_path / "q" / "config.json").read_text())
    assert not [f for f in os.listdir(tmp_path / "q") if f.startswith(".")]


def test_without_the_hook_nothing_changes(tmp_path):
    make_sharded(tmp_path / "in", n_shards=1)
    status, stdout, err = run_gpuq(tmp_path, "", "quantize", tmp_path / "in" / shard_name(0, 1), "-o",
                                   tmp_path / "q.safetensors", *OPTIONS)
    assert status == 0 and "gpuq quantize:" in stdout, err
