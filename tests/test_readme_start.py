"""README's first screen (issue 35, points 8 and 10): what gpuq is, the install-and-run command
and the test command in its first 60 lines; ``.ci/run`` runs that test command verbatim; the
first run's files are ignored by git; the first-run compile time and the signals' early entry
are said."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
FIRST = "\n".join(README.splitlines()[:60])


def bash_blocks(text: str) -> list:
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", text, re.S)]


def test_the_first_screen_has_what_gpuq_is_and_both_commands():
    assert "## Quick start" in FIRST
    assert re.search(r"^gpuq quantizes and dequantizes tensors and model checkpoints", FIRST, re.M)
    blocks = bash_blocks(FIRST)
    install = [b for b in blocks if "pip install '.[cli" in b and "gpuq quantize" in b]
    tests = [b for b in blocks if "pytest" in b]
    assert len(install) == 1 and len(tests) == 1, blocks
    # each command said once: the later sections point here instead of repeating it
    assert README.count(install[0]) == 1 and README.count(tests[0]) == 1


def test_ci_runs_the_readme_test_command_verbatim():
    (command,) = [b for b in bash_blocks(FIRST) if "pytest" in b]
    ci = [ln for ln in (ROOT / ".ci" / "run").read_text().splitlines() if ln and not ln.startswith("#")]
    assert ci[-1] == command


def test_the_first_run_leaves_no_untracked_file():
    (install,) = [b for b in bash_blocks(FIRST) if "gpuq quantize" in b]
    written = set(re.findall(r"[\w.-]+\.safetensors", install))
    assert written >= {"tiny.safetensors", "tiny-int8.safetensors"}
    patterns = [ln.strip() for ln in (ROOT / ".gitignore").read_text().splitlines()
                if ln.strip() and not ln.startswith("#")]
    for name in written:
        assert any(fnmatch.fnmatch(name, p.lstrip("/")) for p in patterns), (name, patterns)


def test_the_first_run_compile_time_is_said():
    text = " ".join(FIRST.split())
    assert "compiles one host loop per dtype combination" in text
    assert re.search(r"int4 --group-size 128` took \d+(\.\d)? s and \d+(\.\d)? s warm", text), text


def test_the_signals_early_entry_and_the_interpreter_start_are_said():
    text = " ".join(README.split())
    assert "The console script's first statements (`_gpuq_entry`" in text
    assert re.search(r"the interpreter's own start, measured at [\d.-]+ s", text)
    assert "was complete (written whole; only the report is cut short)" in text
