"""gpuq.Codes as a value (issue 26): pickled, copied, compared, refused where an array is expected.

Codes are immutable; they cross processes (a ProcessPoolExecutor, Dask's client.submit) by
pickling, rebuilt through their own checks; ``==`` compares host data by value (dtype, shape,
bytes) and refuses device data, whose comparison would synchronise (``equals`` does it on
purpose); ``np.asarray`` and ``gpuq.pack`` refuse them with a message that says what to use.
"""

from __future__ import annotations

import concurrent.futures
import copy
import multiprocessing
import pickle

import numpy as np
import pytest

import gpuq

X = np.array([[0.5, -1.0, 7.0], [2.5, -3.5, 100.0]], np.float32)


def _codes(name, backend=None):
    x = X if backend is None else backend.put(X)
    return gpuq.quantize(x, 1.0, dtype=name)


def _made_in_a_worker(values):
    """Runs in another process: its Codes come back pickled."""
    return gpuq.pack(np.asarray(values, np.int8))


@pytest.mark.parametrize("name", ["int4", "uint4"])
def test_pickle_and_copies_keep_the_codes(name):
    c = _codes(name)
    for twin in (pickle.loads(pickle.dumps(c)), copy.deepcopy(c), copy.copy(c)):
        assert isinstance(twin, gpuq.Codes) and twin == c and twin.equals(c)
        assert (twin.shape, twin.dtype) == (c.shape, c.dtype)
        np.testing.assert_array_equal(gpuq.unpack(twin), gpuq.unpack(c))
    assert copy.deepcopy(c).data is not c.data and copy.copy(c).data is c.data
    with pytest.raises(AttributeError, match="immutable"):
        pickle.loads(pickle.dumps(c)).shape = (6,)


def test_pickled_codes_are_checked_again():
    bad = pickle.dumps(_codes("int4")).replace(b"int4", b"int9")
    with pytest.raises(ValueError, match="dtype must be one of"):
        pickle.loads(bad)


def test_codes_come_back_from_a_process_pool():
    ctx = multiprocessing.get_context("spawn")  # no fork of a process holding threads
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx) as pool:
        got = pool.submit(_made_in_a_worker, [[1, -2, 3], [7, -8, 0]]).result(timeout=120)
    assert isinstance(got, gpuq.Codes) and got.shape == (2, 3)
    assert got == gpuq.pack(np.array([[1, -2, 3], [7, -8, 0]], np.int8))


def test_equality_is_by_value_on_the_host():
    a, b = _codes("int4"), _codes("int4")
    assert a == b and not (a != b) and a.data is not b.data
    assert a != _codes("uint4")  # same bytes here? never equal across code dtypes
    assert a != gpuq.quantize(X, 2.0, dtype="int4")
    assert a != gpuq.Codes(a.data, (3, 2), "int4")  # same bytes, another logical shape
    assert (a == 5) is False and (a != "int4") is True  # not Codes: not equal
    with pytest.raises(TypeError, match="not an array"):  # NumPy's reflected == asks for an array
        _ = a == a.data
    with pytest.raises(TypeError, match="unhashable"):
        hash(a)


def test_attributes_cannot_be_set_or_deleted():
    c = _codes("int4")
    for name in ("data", "shape", "dtype"):
        with pytest.raises(AttributeError, match="Codes is immutable"):
            setattr(c, name, None)
        with pytest.raises(AttributeError, match="Codes is immutable"):
            delattr(c, name)
    assert c == _codes("int4")


def test_cpu_torch_codes_compare_by_value():
    """A CPU torch tensor is host data: == compares it, as for NumPy (pickled and back too)."""
    import pickle

    torch = pytest.importorskip("torch")
    a = gpuq.quantize(torch.tensor([1.0, -2.0, 3.0]), 1.0, dtype="int4")
    assert isinstance(a.data, torch.Tensor)
    assert a == pickle.loads(pickle.dumps(a)) and a != gpuq.quantize(torch.tensor([1.0, -2.0, 4.0]), 1.0,
                                                                     dtype="int4")


def test_device_codes_compare_with_equals_only(backend):
    a, b = _codes("int4", backend), _codes("int4", backend)
    assert a.equals(b) and not a.equals(_codes("uint4", backend))
    if backend.name == "cuda":
        with pytest.raises(TypeError, match=r"== on Codes compares host data only.*a\.equals\(b\)"):
            _ = a == b
    else:
        assert a == b


@pytest.mark.parametrize("name", ["int4", "float8_e4m3fn"])
def test_asarray_and_save_refuse_codes(tmp_path, name):
    c = gpuq.Codes(_codes("int4").data, (2, 3), "int4") if name == "int4" else \
        gpuq.Codes(np.zeros((2, 3), np.uint8), (2, 3), name)
    # np.save opens its file before it converts: the refusal comes before any array is written.
    for call in (lambda: np.asarray(c), lambda: np.array(c), lambda: np.save(tmp_path / "c.npy", c)):
        with pytest.raises(TypeError, match=r"use codes\.data .*gpuq\.unpack\(codes\)"):
            call()


@pytest.mark.parametrize("ml_dtypes_loaded", [True, False])
def test_pack_refuses_codes(monkeypatch, ml_dtypes_loaded):
    import sys

    if not ml_dtypes_loaded:
        monkeypatch.delitem(sys.modules, "ml_dtypes", raising=False)
    with pytest.raises(TypeError, match=r"already packed \(a gpuq.Codes of int4\).*gpuq.unpack"):
        gpuq.pack(_codes("int4"))
