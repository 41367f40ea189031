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


def test_dynamic_rows(quick_run):
    rows = _load(quick_run)["stamp"]["dynamic"]
    assert {(r["scheme"], r["way"]) for r in rows} == {
        (s, w) for s in ("tensor", "row4096", "group128") for w in ("static", "qparams", "dynamic")}
    for r in rows:
        assert r["median_s"] > 0 and r["ratio_to_static"] > 0
        if r["way"] == "dynamic":
            assert r["mismatches"] == 0  # quantize_dynamic == choose_qparams then quantize
        if r["way"] == "static":
            assert r["ratio_to_static"] == 1.0


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
