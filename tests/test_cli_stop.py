"""A run that is stopped or fails leaves OUT exactly as it was (issue 26, point 3).

Real processes, real signals: ``gpuq`` runs in a child process (through a
small script, :data:`SLOW_GPUQ`, that makes each tensor write take a while
and drops a marker file at a chosen point, so the signal lands mid-run, not
by timing luck), and the test sends SIGTERM (what ``kill``, ``timeout``,
SLURM, ``docker stop`` and systemd send) or SIGINT (Ctrl-C: to the whole
process group, as a terminal sends it). ``--workers 2`` starts a real
``distributed.LocalCluster``; its worker processes import the script too
(multiprocessing's spawn runs the parent's main file), so they write slowly
as well. Every case: the exit status (143 for SIGTERM, 130 for SIGINT, 2 for
an error), exactly one line on stderr (no traceback from any process), and
OUT as it was, bytes and listing: no hidden temporary or staged file.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from test_cli_sharded import OPTIONS, file_bytes, gpuq_main, make_sharded, shard_name

REPO = Path(__file__).resolve().parents[1]

#: ``python SLOW_GPUQ gpuq-args...`` with $SLOW_MARKER, $SLOW_WHEN, $SLOW_DELAY: each tensor
#: write sleeps DELAY seconds; MARKER is created at the first write (WHEN "write", in
#: whichever process gets there first) or while the local Dask cluster starts ("cluster":
#: when a worker process, spawned, runs this file as its ``__mp_main__``).
SLOW_GPUQ = '''
import os, sys, time
from gpuq.checkpoints import files

MARKER, WHEN = os.environ["SLOW_MARKER"], os.environ["SLOW_WHEN"]
DELAY = float(os.environ["SLOW_DELAY"])
_write = files._SafetensorsWriter._write


def mark():
    open(MARKER, "a").close()


def write(self, name, arr):
    _write(self, name, arr)
    if WHEN == "write":
        mark()
    time.sleep(DELAY)


files._SafetensorsWriter._write = write
if WHEN == "cluster" and __name__ == "__mp_main__":  # a worker process being started
    mark()
if __name__ == "__main__":
    from gpuq.cli import main

    sys.exit(main(sys.argv[1:]))
'''


def start_slow(tmp_path, args, *, when="write", delay=0.5):
    """Start ``gpuq ARGS`` slowed down, in its own process group; wait for the marker."""
    script, marker = tmp_path / "slow_gpuq.py", tmp_path / "marker"
    script.write_text(SLOW_GPUQ)
    env = dict(os.environ, PYTHONPATH=str(REPO), SLOW_MARKER=str(marker), SLOW_WHEN=when,
               SLOW_DELAY=str(delay))
    proc = subprocess.Popen([sys.executable, str(script), *map(str, args)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, cwd=tmp_path)
    deadline = time.monotonic() + 90
    while not marker.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"no marker (exit {proc.returncode}): {err[-3000:]}")
        time.sleep(0.02)
    return proc


def finish(proc):
    try:
        return proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise


def poison(shard: Path, value) -> None:
    """Put ``value`` in the shard's bfloat16 tensor, the last one its file holds (the float32
    ones come first in the library's layout), so the shard fails after some writes."""
    from safetensors.numpy import load_file, save_file

    t = load_file(str(shard))
    name = next(n for n in t if n.endswith("attn.weight"))
    t[name][1, 2] = value
    save_file(t, str(shard))


def listing(folder: Path) -> dict:
    """Every file of ``folder`` (hidden ones too) with its bytes; None when it does not exist."""
    return file_bytes(folder) if folder.exists() else None


def one_line(err: str, text: str):
    assert err.splitlines() == [text], err


# -- SIGTERM here ---------------------------------------------------------------------------

def test_sigterm_one_file_leaves_no_temporary_file(tmp_path):
    make_sharded(tmp_path / "in", n_shards=1)
    work = tmp_path / "work"
    work.mkdir()
    out = work / "q.safetensors"
    out.write_bytes(b"an earlier OUT")
    before = listing(work)
    proc = start_slow(tmp_path, ["quantize", tmp_path / "in" / shard_name(0, 1), "-o", out,
                                 *OPTIONS])
    proc.send_signal(signal.SIGTERM)
    stdout, err = finish(proc)
    assert proc.returncode == 143 and stdout == ""  # no report
    one_line(err, "gpuq: terminated (SIGTERM)")
    assert listing(work) == before  # no hidden .q.safetensors.PID.HEX.tmp, OUT untouched


def test_sigterm_sharded_leaves_out_as_it_was(tmp_path):
    make_sharded(tmp_path / "in", n_shards=3)
    out = tmp_path / "out"
    assert gpuq_main("quantize", tmp_path / "in", "-o", out, *OPTIONS) == 0  # an earlier run
    before = listing(out)
    proc = start_slow(tmp_path, ["quantize", tmp_path / "in", "-o", out, *OPTIONS,
                                 "--symmetric"], delay=0.2)
    time.sleep(0.5)  # the first shard complete, the second under way
    proc.send_signal(signal.SIGTERM)
    _, err = finish(proc)
    assert proc.returncode == 143
    one_line(err, "gpuq: terminated (SIGTERM)")
    assert listing(out) == before


# -- on a local Dask cluster: --workers 2 ---------------------------------------------------

@pytest.mark.parametrize("sig, status, line, when", [
    (signal.SIGTERM, 143, "gpuq: terminated (SIGTERM)", "write"),  # workers mid-shard
    (signal.SIGINT, 130, "gpuq: interrupted", "cluster"),  # Ctrl-C while the cluster starts
])
def test_signal_to_the_process_group_with_workers(tmp_path, sig, status, line, when):
    pytest.importorskip("distributed")
    make_sharded(tmp_path / "in", n_shards=4)
    out = tmp_path / "out"
    proc = start_slow(tmp_path, ["quantize", tmp_path / "in", "-o", out, *OPTIONS,
                                 "--workers", "2"], when=when, delay=0.2)
    os.killpg(proc.pid, sig)  # the client and its workers, as a terminal or `timeout` does
    _, err = finish(proc)
    assert proc.returncode == status
    one_line(err, line)  # no traceback from the workers, nor from a cluster half started
    assert not out.exists()


def test_failing_shard_with_workers_leaves_out_as_it_was(tmp_path):
    """One shard has a NaN under --nonfinite error in its last tensor and fails there, while
    the other worker is still writing its shard: that shard must not land in OUT after the
    cleanup."""
    pytest.importorskip("distributed")
    make_sharded(tmp_path / "in", n_shards=3)
    poison(tmp_path / "in" / shard_name(0, 3), np.nan)
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("kept")
    before = listing(out)
    proc = start_slow(tmp_path, ["quantize", tmp_path / "in", "-o", out, *OPTIONS,
                                 "--workers", "2", "--nonfinite", "error"], delay=0.2)
    _, err = finish(proc)
    assert proc.returncode == 2
    one_line(err, "gpuq: error: tensor 'model.layers.0.attn.weight' has 1 non-finite value "
                  "(1 NaN); --nonfinite warn or allow quantizes it with parameters from its "
                  "finite values")
    assert listing(out) == before  # the cluster, its workers included, ended with the command


def test_a_signal_while_held_is_acted_on_after_and_once():
    """held_signals (a cluster's start, the final renames): the block runs to its end, the
    signal is raised after it; then later signals are ignored while the cleanup runs."""
    from gpuq.cli.signals import Terminated, held_signals, stop_signals

    before = signal.getsignal(signal.SIGTERM)
    done = []
    with stop_signals():
        with pytest.raises(Terminated):
            with held_signals():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.05)
                done.append("held block finished")
        assert done == ["held block finished"]
        os.kill(os.getpid(), signal.SIGTERM)  # a second one: ignored, no exception
        time.sleep(0.05)
    assert signal.getsignal(signal.SIGTERM) == before
