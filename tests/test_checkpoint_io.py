"""The checkpoint files' fast paths (issue 40's speed target): a tensor read through a memory map
(``Checkpoint.mapped``) and a kept tensor copied file to file in the kernel (``copy_from``). Each
must give the bytes the plain path gives (``load``, ``write``), and refuse what it cannot do.
"""

import errno
import gc
import os

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

from gpuq.checkpoints.files import Checkpoint, checkpoint_writer

# Odd sizes and every itemsize the pass reads, plus an empty tensor and one past a page boundary.
TENSORS = {
    "a.bf16": np.arange(17 * 33, dtype=np.float32).reshape(17, 33).astype(ml_dtypes.bfloat16),
    "b.f16": np.linspace(-3, 3, 1025, dtype=np.float16),
    "c.f32": np.random.default_rng(0).standard_normal((5, 1031)).astype(np.float32),
    "d.i8": np.arange(-7, 6, dtype=np.int8),
    "e.empty": np.zeros((0, 4), np.float32),
}


@pytest.fixture
def src(tmp_path):
    path = tmp_path / "in.safetensors"
    save_file(TENSORS, str(path))
    return path


def _maps(path):
    with open("/proc/self/maps") as f:
        return sum(str(path) in line for line in f)


def test_mapped_equals_load_and_is_read_only(src):
    with Checkpoint(str(src)) as ckpt:
        for name, want in TENSORS.items():
            got = ckpt.mapped(name)
            assert got.dtype == want.dtype and got.shape == want.shape
            assert got.tobytes() == want.tobytes() == ckpt.load(name).tobytes()
            if got.size:
                assert not got.flags.writeable
                with pytest.raises(ValueError):
                    got[(0,) * got.ndim] = 0  # the input is never written


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc/self/maps")
def test_mapped_is_unmapped_when_dropped(src):
    """The memory is one tensor's: the map goes with the array (and its views)."""
    with Checkpoint(str(src)) as ckpt:
        before = _maps(src)
        x = ckpt.mapped("c.f32")
        view = x[1:3]
        assert _maps(src) == before + 1
        del x
        gc.collect()
        assert _maps(src) == before + 1  # a view keeps it
        del view
        gc.collect()
        assert _maps(src) == before


def _written(path, fill):
    entries = {n: (t.shape, t.dtype) for n, t in TENSORS.items()}
    with Checkpoint(str(path.parent / "in.safetensors")) as ckpt, \
            checkpoint_writer(str(path), "safetensors", entries) as w:
        fill(w, ckpt)
    return path.read_bytes()


def test_copy_from_gives_the_bytes_of_write(src, tmp_path):
    plain = _written(tmp_path / "plain.safetensors",
                     lambda w, ckpt: [w.write(n, ckpt.load(n)) for n in TENSORS])
    copied = _written(tmp_path / "copied.safetensors", lambda w, ckpt: [w.copy_from(n, ckpt) for n in TENSORS])
    assert plain == copied
    with Checkpoint(str(tmp_path / "copied.safetensors")) as out:
        assert all(out.load(n).tobytes() == t.tobytes() for n, t in TENSORS.items())


def test_copy_from_falls_back_where_the_kernel_cannot(src, tmp_path, monkeypatch):
    def refuse(*args):
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))

    monkeypatch.setattr(os, "copy_file_range", refuse, raising=False)
    got = _written(tmp_path / "o.safetensors", lambda w, ckpt: [w.copy_from(n, ckpt) for n in TENSORS])
    with Checkpoint(str(tmp_path / "o.safetensors")) as out:
        assert all(out.load(n).tobytes() == t.tobytes() for n, t in TENSORS.items())
    assert got == (tmp_path / "o.safetensors").read_bytes()


def test_copy_from_refuses_another_shape(src, tmp_path):
    entries = {"a.bf16": ((33, 17), TENSORS["a.bf16"].dtype)}
    with Checkpoint(str(src)) as ckpt, pytest.raises(RuntimeError, match="declared"):
        with checkpoint_writer(str(tmp_path / "o.safetensors"), "safetensors", entries) as w:
            w.copy_from("a.bf16", ckpt)
    assert not (tmp_path / "o.safetensors").exists()
