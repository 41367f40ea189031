"""Checkpoint files for the ``gpuq`` command: read and write .safetensors/.npz/.npy, tensor by tensor.

============  =====================================  ===============================================
format        tensors                                 where the gpuq scheme is stored
============  =====================================  ===============================================
.safetensors  bool, (u)int8-64, float16/32/64,        header metadata key ``"gpuq"`` (JSON text)
              bfloat16 and float8 (``ml_dtypes``),
              complex64
.npz          NumPy arrays (no pickled objects)       member ``__gpuq__``: a 0-d str array (JSON)
.npy          one array, named ``arr_0`` (NumPy's     (read only: the quantized output is an .npz)
              name for an unnamed array in an .npz)
============  =====================================  ===============================================

Reading. :class:`Checkpoint` parses and checks the whole index when it opens
a file (names, dtypes, shapes, where each tensor's bytes are) without reading
any tensor data, so every check runs before any work. A safetensors header is
held to the format's rules, as the safetensors library reads them: an 8-byte
little-endian length of at most 100 MB, a UTF-8 JSON object (no duplicate
keys, no NaN literals), ``__metadata__`` a string-to-string map, every tensor's
``data_offsets`` matching its dtype and shape, the tensors tiling the data
section with no gap, no overlap and nothing after it. An .npz member's or an
.npy file's size must be exactly its header plus its data. Then
:meth:`Checkpoint.load` reads one tensor at its offset into a fresh array
(positioned reads, no memory map: pages of a whole-file mapping that stay
resident would count toward the process's memory), so reading a checkpoint
costs one tensor at a time.

Writing. :func:`checkpoint_writer` takes every output tensor's name, shape
and dtype up front, so the safetensors header (with the offsets) is written
before any data; tensors then go to their offsets one by one, in any order,
and nothing is held in memory. The layout is the safetensors library's (data
sorted by dtype alignment, then name; the header padded with spaces to 8
bytes, so every tensor is aligned); the metadata keys are sorted, so the same
input gives the same bytes. .npz members are streamed into the zip file.
Every output goes through :func:`atomic_output`: a temporary file created
with mode ``0o666`` less the umask (as any tool's), renamed over OUT only
when complete; any error (a full disk, a bad tensor, Ctrl-C) removes it, so
no partial OUT is ever left behind, and a write error is one ``CliError``.

Both sides assume a little-endian host (x86-64, aarch64), as safetensors does.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import secrets
import sys
import zipfile

import numpy as np

#: The member/metadata key holding gpuq's JSON description of a quantized file.
META_KEY = "gpuq"
NPZ_META = "__gpuq__"
#: The name a lone .npy array gets (as in ``np.savez(f, x)``).
NPY_NAME = "arr_0"
FORMATS = {".safetensors": "safetensors", ".npz": "npz", ".npy": "npy"}
#: The safetensors library refuses longer headers (``MAX_HEADER_SIZE``).
MAX_HEADER = 100_000_000
#: NumPy's limit on the number of dimensions (32 before NumPy 2).
MAX_RANK = 32
#: The first bytes of every .npy array (``np.lib.format.MAGIC_PREFIX``).
_NPY_MAGIC = b"\x93NUMPY"


class CliError(ValueError):
    """A user-facing error (bad input or options): a ValueError whose text is one line.

    The command prints it as one ``gpuq: error: ...`` line and exits 2; a library caller
    (:mod:`gpuq.checkpoints`) gets it as it is, before anything was written or with what the
    run wrote removed.
    """


#: The library's name for it.
CheckpointError = CliError


def file_format(path: str, role: str) -> str:
    """The format named by ``path``'s extension.

    >>> file_format("model.safetensors", "IN")
    'safetensors'
    >>> file_format("model.bin", "OUT")
    Traceback (most recent call last):
    ...
    gpuq.checkpoints.files.CliError: OUT 'model.bin' has an unknown extension '.bin': expected .safetensors, .npz or .npy
    >>> file_format("/nonexistent/model", "IN")       # a missing IN: that first
    Traceback (most recent call last):
    ...
    gpuq.checkpoints.files.CliError: cannot read IN '/nonexistent/model': it does not exist
    """
    ext = os.path.splitext(path)[1].lower()
    if ext not in FORMATS and role == "IN" and not os.path.lexists(path):
        raise CliError(f"cannot read IN {path!r}: it does not exist")
    if ext not in FORMATS:
        raise CliError(
            f"{role} {path!r} has an unknown extension {ext!r}: expected .safetensors, .npz or .npy"
        )
    return FORMATS[ext]


def _import_ml_dtypes():
    # ml_dtypes registers bfloat16 and the float8 types with NumPy.
    try:
        import ml_dtypes
    except ImportError:
        return None
    return ml_dtypes


#: safetensors dtype codes in the library's order (``Dtype``: increasing alignment); the
#: data section is laid out by this order, descending, then by name.
_ST_ORDER = ("BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16", "I32",
             "U32", "F32", "C64", "F64", "I64", "U64")
_ST_NUMPY = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16",
             "I32": "int32", "U32": "uint32", "I64": "int64", "U64": "uint64",
             "F16": "float16", "F32": "float32", "F64": "float64", "C64": "complex64",
             "BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}


def _safetensors_dtypes() -> dict:
    """safetensors code -> NumPy dtype, for the codes this NumPy can hold."""
    ml = _import_ml_dtypes()
    out = {}
    for code, name in _ST_NUMPY.items():
        if hasattr(np, name):
            out[code] = np.dtype(name)
        elif ml is not None and hasattr(ml, name):
            out[code] = np.dtype(getattr(ml, name))
    return out


_ST_DTYPES = _safetensors_dtypes()
_ST_CODES = {dt: code for code, dt in _ST_DTYPES.items()}


def safetensors_code(dtype) -> str:
    """The safetensors dtype code of a NumPy dtype.

    >>> safetensors_code(np.dtype("float32")), safetensors_code(np.dtype("uint8"))
    ('F32', 'U8')
    """
    dtype = np.dtype(dtype)
    code = _ST_CODES.get(dtype)  # native byte order only ('>f4' is not F32's bytes)
    if code is None:
        raise CliError(f"a .safetensors file cannot hold dtype {dtype}")
    return code


def _check_little_endian(path, role):
    if sys.byteorder != "little":
        raise CliError(f"{role} {path!r}: safetensors files are little-endian and this host "
                       f"is not; gpuq reads and writes them on little-endian hosts only")


class Checkpoint:
    """A checkpoint opened for reading: ``names``, ``spec(name)``, ``load(name)``, ``meta``.

    ``meta`` is the gpuq description (a dict, parsed but not checked: see
    :mod:`gpuq.checkpoints.quantized`) for files written by ``gpuq quantize`` and
    ``None`` otherwise; ``extra_metadata`` holds any other safetensors
    metadata, passed through unchanged. ``names`` are in file order (data
    order for .safetensors, member order for .npz), so reading them in turn
    reads the file front to back.

    >>> import tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "a.safetensors")
    >>> write_checkpoint(path, "safetensors", {"w": np.arange(6, dtype=np.int8).reshape(2, 3)}, None)
    >>> with Checkpoint(path) as ckpt:
    ...     ckpt.names, ckpt.spec("w"), ckpt.load("w")
    (['w'], ((2, 3), dtype('int8')), array([[0, 1, 2],
           [3, 4, 5]], dtype=int8))
    """

    def __init__(self, path: str):
        self.path = path
        self.format = file_format(path, "IN")
        if not os.path.exists(path):
            raise CliError(f"cannot read IN {path!r}: no such file")
        if os.path.isdir(path):
            raise CliError(f"cannot read IN {path!r}: it is a directory")
        self.extra_metadata = {}
        self.meta = None
        self._entries = {}  # name -> _Entry
        self._stack = contextlib.ExitStack()
        try:
            self._fh = self._stack.enter_context(open(path, "rb", buffering=0))
            self._size = os.fstat(self._fh.fileno()).st_size
            if self.format == "safetensors":
                self._open_safetensors()
            elif self.format == "npz":
                self._open_npz()
            else:
                self._open_npy()
        except CliError:
            self.close()
            raise
        except Exception as exc:  # zipfile, NumPy's header parser: each has its own error types
            self.close()
            raise CliError(f"cannot read IN {path!r}: {_one_line(exc)}") from exc

    def _bad(self, why: str) -> CliError:
        return CliError(f"cannot read IN {self.path!r}: {why}")

    # -- opening -------------------------------------------------------------
    def _open_safetensors(self):
        _check_little_endian(self.path, "IN")
        if self._size < 8:
            raise self._bad(f"{self._size} bytes is too short for a safetensors file")
        n = int.from_bytes(self._read_at(0, 8), "little")
        if n > MAX_HEADER:
            raise self._bad(f"header length {n} is over the {MAX_HEADER} bytes safetensors "
                            f"allows: not a safetensors file, or a damaged one")
        if 8 + n > self._size:
            raise self._bad(f"header length {n} runs past the end of the file "
                            f"({self._size} bytes): truncated or damaged")
        raw = self._read_at(8, n)
        if not raw.startswith(b"{"):
            raise self._bad("the header is not a JSON object (it does not start with '{')")
        try:
            header = json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_keys,
                                parse_constant=_no_constant)
        except (UnicodeDecodeError, ValueError) as exc:
            raise self._bad(f"the header is not valid UTF-8 JSON ({_one_line(exc)})") from None
        if not isinstance(header, dict):
            raise self._bad("the header is not a JSON object")
        metadata = header.pop("__metadata__", None)
        if metadata is not None:
            if not isinstance(metadata, dict) or not all(
                    isinstance(v, str) for v in metadata.values()):
                raise self._bad("'__metadata__' in the header is not a map of strings")
            for key, value in metadata.items():
                _utf8(key, self._bad, "a metadata key")
                _utf8(value, self._bad, f"metadata {key!r}")
        data_start, data_size = 8 + n, self._size - 8 - n
        spans = []
        for name, info in header.items():
            _utf8(name, self._bad, "a tensor name")
            shape, dtype, begin, end = self._st_tensor(name, info)
            nbytes = math.prod(shape) * dtype.itemsize
            if end - begin != nbytes:
                raise self._bad(f"tensor {name!r}: data_offsets [{begin}, {end}] span "
                                f"{end - begin} bytes but {_st_code(info)} {list(shape)} "
                                f"needs {nbytes}")
            spans.append((begin, end, name))
            self._entries[name] = _Entry(shape, dtype, data_start + begin, nbytes)
        # The tensors must tile the data section exactly, as the library demands: a
        # gap, an overlap or bytes past the last tensor mean a damaged file.
        spans.sort()
        at = 0
        for begin, end, name in spans:
            if begin != at:
                what = "overlaps the tensor before it" if begin < at else "leaves a gap before it"
                raise self._bad(f"tensor {name!r}: data_offsets [{begin}, {end}] {what} "
                                f"(expected to start at {at})")
            at = end
        if at != data_size:
            raise self._bad(f"the tensors cover {at} bytes of data but the file holds "
                            f"{data_size} after its header: truncated or damaged")
        self._entries = {name: self._entries[name] for _, _, name in spans}
        metadata = dict(metadata or {})
        if META_KEY in metadata:
            self.meta = _parse_meta(metadata.pop(META_KEY), self.path)
        self.extra_metadata = metadata

    def _st_tensor(self, name, info):
        if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= set(info):
            raise self._bad(f"tensor {name!r}: its header entry needs dtype, shape and "
                            f"data_offsets")
        code, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if not isinstance(code, str) or code not in _ST_ORDER:
            raise self._bad(f"tensor {name!r}: {code!r} is not a safetensors dtype gpuq reads "
                            f"({', '.join(_ST_ORDER)})")
        if code not in _ST_DTYPES:
            raise self._bad(f"tensor {name!r} is {code}: reading it needs ml_dtypes "
                            f"(pip install 'gpuq[cli]')")
        if (not isinstance(shape, list) or len(shape) > MAX_RANK
                or not all(_is_size(d) for d in shape)):
            raise self._bad(f"tensor {name!r}: shape {shape!r} is not a list of at most "
                            f"{MAX_RANK} sizes")
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(_is_size(o) for o in offsets) or offsets[0] > offsets[1]):
            raise self._bad(f"tensor {name!r}: data_offsets {offsets!r} is not [begin, end] "
                            f"with 0 <= begin <= end")
        return tuple(shape), _ST_DTYPES[code], offsets[0], offsets[1]

    def _open_npz(self):
        zf = self._stack.enter_context(zipfile.ZipFile(self._fh))
        self._zip = zf
        for info in zf.infolist():
            member = info.filename
            if not member.endswith(".npy"):
                raise self._bad(f"member {member!r} is not an .npy array")
            name = member[:-4]
            if name in self._entries:
                raise self._bad(f"member {member!r} is in the archive twice")
            with zf.open(info) as fh:
                shape, fortran, dtype = _npy_header(fh, self._bad, f"member {member!r}")
                offset = fh.tell()
            self._check_size(f"member {member!r}", info.file_size - offset, shape, dtype)
            self._entries[name] = _Entry(shape, dtype, offset, info.file_size - offset,
                                         fortran, info)
        if NPZ_META in self._entries:
            meta = self.load(NPZ_META)
            if meta.shape != () or meta.dtype.kind != "U":
                raise self._bad(f"member {NPZ_META!r} is not a gpuq metadata string")
            self.meta = _parse_meta(str(meta), self.path)
            del self._entries[NPZ_META]

    def _open_npy(self):
        shape, fortran, dtype = _npy_header(self._fh, self._bad, "the file")
        offset = self._fh.tell()
        self._check_size("the array", self._size - offset, shape, dtype)
        self._entries[NPY_NAME] = _Entry(shape, dtype, offset, self._size - offset, fortran)

    def _check_size(self, what, have, shape, dtype):
        need = math.prod(shape) * dtype.itemsize
        if have != need:
            raise self._bad(f"{what}: its header says {dtype} {shape}, {need} bytes, but "
                            f"{have} bytes follow it: truncated, damaged or mis-typed")

    # -- access --------------------------------------------------------------
    @property
    def names(self) -> list:
        """Tensor names in file order."""
        return list(self._entries)

    def spec(self, name: str):
        """``(shape, dtype)`` of a tensor without loading it (dtype as a NumPy dtype)."""
        e = self._entries[name]
        return e.shape, e.dtype

    def nbytes(self, name: str) -> int:
        """The size of a tensor's data in bytes."""
        return self._entries[name].nbytes

    def load(self, name: str, out: np.ndarray | None = None) -> np.ndarray:
        """The tensor as a fresh NumPy array (bit for bit what the file holds).

        Only this tensor's bytes are read (into the array itself for .safetensors
        and .npy); the array is the caller's, writable, and nothing keeps it alive.
        ``out`` (.safetensors only): a C-order array of the tensor's shape and dtype to read
        into instead (a buffer reused from tensor to tensor), returned.
        """
        e = self._entries[name]
        if out is not None:
            if self.format != "safetensors" or out.shape != e.shape or out.dtype != e.dtype \
                    or not out.flags.c_contiguous:
                raise ValueError(f"out must be a C-order {e.dtype} {e.shape} array for a .safetensors IN, "
                                 f"got {out.dtype} {out.shape} for a .{self.format}")
        try:
            if self.format == "npz":
                # Read the header again rather than seek past it: a seek into a stored
                # member turns off zipfile's CRC check (Python >= 3.12), which reading
                # the member to its end otherwise does.
                with self._zip.open(e.zinfo) as fh:
                    if _npy_header(fh, self._bad, f"member {name!r}") != (
                            e.shape, e.fortran, e.dtype):
                        raise self._bad(f"member {name!r} changed while gpuq read it")
                    arr = _read_array(fh, e)
                    if fh.read(1):  # also makes zipfile reach the end: the CRC check
                        raise self._bad(f"member {name!r} is longer than its header says")
            else:
                self._fh.seek(e.offset)
                arr = _read_array(self._fh, e, out)
        except CliError:
            raise
        except Exception as exc:
            raise CliError(f"cannot read tensor {name!r} of IN {self.path!r}: "
                           f"{_one_line(exc)}") from exc
        return arr

    def mapped(self, name: str) -> np.ndarray:
        """Tensor ``name`` as a read-only array over the file's own pages: a memory map of its
        bytes alone, with no copy into the process, unmapped when the array (and every view of
        it) is dropped, so it holds one tensor's memory as :meth:`load`'s array does. Where no
        map can be made (an .npz or .npy, an empty tensor, a file system without memory maps)
        it is :meth:`load`'s fresh array.

        A warm file is read with no copy at all, where :meth:`load` copies every byte once. A
        file truncated by another process while it is mapped makes the process fail (SIGBUS),
        as any reader that maps it (the safetensors library) would.

        >>> import tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "a.safetensors")
        >>> write_checkpoint(path, "safetensors", {"w": np.arange(6, dtype=np.int8).reshape(2, 3)}, None)
        >>> w = Checkpoint(path).mapped("w")
        >>> w.tolist(), w.flags.writeable
        ([[0, 1, 2], [3, 4, 5]], False)
        """
        e = self._entries[name]
        if self.format != "safetensors" or not e.nbytes:
            return self.load(name)
        import mmap

        start = e.offset - e.offset % mmap.ALLOCATIONGRANULARITY
        try:
            m = mmap.mmap(self._fh.fileno(), e.offset + e.nbytes - start, access=mmap.ACCESS_READ, offset=start)
        except (OSError, ValueError):  # no memory maps here: read it
            return self.load(name)
        # The array holds the map; the map closes (munmap) when the last view of it goes.
        return np.frombuffer(m, e.dtype, math.prod(e.shape), e.offset - start).reshape(e.shape)

    def file_span(self, name: str):
        """``(fd, offset, nbytes)`` of tensor ``name``'s bytes in the open file, where they lie
        there as they are stored (.safetensors); None otherwise (.npz, .npy)."""
        e = self._entries[name]
        if self.format != "safetensors":
            return None
        return self._fh.fileno(), e.offset, e.nbytes

    def load_rows(self, name: str, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` of a tensor along its first dimension, as a fresh array: only
        their bytes are read (.safetensors and C-ordered .npy; the others load the tensor and
        slice it). For tensors read piece by piece (an expert at a time) in bounded memory.

        >>> import tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "a.safetensors")
        >>> write_checkpoint(path, "safetensors", {"w": np.arange(6, dtype=np.int8).reshape(3, 2)}, None)
        >>> Checkpoint(path).load_rows("w", 1, 3)
        array([[2, 3],
               [4, 5]], dtype=int8)
        """
        e = self._entries[name]
        if not e.shape or not 0 <= start <= stop <= e.shape[0]:
            raise ValueError(f"rows [{start}, {stop}) of tensor {name!r} {list(e.shape)}: not a range of "
                             f"its first dimension")
        if self.format == "npz" or e.fortran:
            return np.ascontiguousarray(self.load(name)[start:stop])
        row = e.nbytes // e.shape[0] if e.shape[0] else 0
        part = _Entry((stop - start,) + e.shape[1:], e.dtype, e.offset + start * row, (stop - start) * row)
        try:
            self._fh.seek(part.offset)
            return _read_array(self._fh, part)
        except CliError:
            raise
        except Exception as exc:
            raise CliError(f"cannot read tensor {name!r} of IN {self.path!r}: {_one_line(exc)}") from exc

    def _read_at(self, offset, n):
        self._fh.seek(offset)
        data = self._fh.read(n)
        if len(data) != n:
            raise self._bad(f"the file ends early (wanted {n} bytes at offset {offset})")
        return data

    def close(self):
        self._stack.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _Entry:
    """Where a tensor is: shape, dtype, the offset of its data (in the file or the
    zip member), its size, its memory order, and for .npz its zip member."""

    __slots__ = ("dtype", "fortran", "nbytes", "offset", "shape", "zinfo")

    def __init__(self, shape, dtype, offset, nbytes, fortran=False, zinfo=None):
        self.shape, self.dtype, self.offset, self.nbytes = shape, dtype, offset, nbytes
        self.fortran, self.zinfo = fortran, zinfo


def _read_array(fh, e, arr=None) -> np.ndarray:
    # Straight into the array's own memory: no intermediate bytes object.
    if arr is None:
        arr = np.empty(e.shape[::-1] if e.fortran else e.shape, e.dtype)
    view = memoryview(arr.reshape(-1).view(np.uint8)) if arr.size else memoryview(b"")
    done = 0
    while done < len(view):
        got = fh.readinto(view[done:])
        if not got:
            raise CliError(f"the file ends {len(view) - done} bytes early")
        done += got
    return arr.T if e.fortran else arr


def _npy_header(fh, bad, what):
    # The magic by hand, not read_magic: its error names no member, and a seek back
    # would turn off zipfile's CRC check (see Checkpoint.load).
    start = fh.read(len(_NPY_MAGIC) + 2)
    if len(start) < len(_NPY_MAGIC) + 2 or not start.startswith(_NPY_MAGIC):
        kind = " (it is a Python pickle, which gpuq does not load)" if start[:1] == b"\x80" else ""
        raise bad(f"{what} is not an .npy array: it does not start with NumPy's magic "
                  f"{_NPY_MAGIC!r}{kind}")
    version = (start[-2], start[-1])
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
    elif version in ((2, 0), (3, 0)):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
    else:
        raise bad(f"{what}: .npy format version {version} is unknown")
    if dtype.hasobject:
        raise bad(f"{what} holds Python objects (pickle), which gpuq does not load")
    if len(shape) > MAX_RANK:
        raise bad(f"{what}: {len(shape)} dimensions, more than {MAX_RANK}")
    return tuple(shape), fortran, dtype


def _is_size(v) -> bool:
    # JSON integers only (not true/false, not 2.0), below 2^63 as in the library's usize.
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**63


def _st_code(info):
    return info.get("dtype") if isinstance(info, dict) else None


def _utf8(text, bad, what):
    # JSON's \ud800 escapes give strings that UTF-8 cannot hold (the library refuses them).
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise bad(f"{what} is not valid Unicode: {text!r}") from None


def _unique_keys(pairs):
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        dup = next(k for k in keys if keys.count(k) > 1)
        raise ValueError(f"the key {dup!r} appears twice")
    return dict(pairs)


def _no_constant(name):
    raise ValueError(f"{name} is not JSON")


def _parse_meta(text, path):
    try:
        meta = json.loads(text, parse_constant=_no_constant)
        if not isinstance(meta, dict) or not isinstance(meta.get("tensors"), dict):
            raise ValueError("no 'tensors' table")
    except ValueError as exc:
        raise CliError(f"cannot read IN {path!r}: its gpuq metadata is not valid: {exc}") from None
    return meta


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if type(exc).__name__ not in text else text


# -- writing -------------------------------------------------------------------

def check_output(path: str, fmt: str, in_path: str) -> None:
    """Refuse, before any work, an OUT that cannot be written or would clobber IN."""
    if os.path.exists(path) and os.path.samefile(path, in_path):
        raise CliError(f"OUT {path!r} is the input file; write to a new file")
    if os.path.isdir(path):
        raise CliError(f"cannot write OUT {path!r}: it is a directory")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        what = "is not a directory" if os.path.exists(parent) else "does not exist"
        raise CliError(f"cannot write OUT {path!r}: directory {parent!r} {what}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise CliError(f"cannot write OUT {path!r}: directory {parent!r} is not writable")


@contextlib.contextmanager
def atomic_output(path: str):
    """Yield a temporary path beside ``path``; rename it to ``path`` only on success.

    Any exception, KeyboardInterrupt included, removes the temporary file, so
    a failed run never leaves a partial OUT (and never touches an existing one).
    """
    parent = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(parent, f".{os.path.basename(path)}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        # Not tempfile.mkstemp: its 0600 mode would stick to OUT; 0666 honours the umask.
        # Every writer below writes into this file as created (none replaces it).
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    except OSError as exc:
        raise CliError(f"cannot write OUT {path!r}: {_one_line(exc)}") from exc
    try:
        yield tmp
        os.replace(tmp, path)
    except OSError as exc:
        _remove(tmp)
        raise CliError(f"cannot write OUT {path!r}: {_one_line(exc)}") from exc
    except BaseException:
        _remove(tmp)
        raise


def _remove(path):
    with contextlib.suppress(OSError):
        os.unlink(path)


@contextlib.contextmanager
def checkpoint_writer(path: str, fmt: str, entries: dict, meta: dict | None = None,
                      extra_metadata: dict | None = None):
    """Write a checkpoint tensor by tensor: yields a writer with ``write(name, array)``.

    ``entries`` maps every output name to ``(shape, dtype)``, in output order
    (.npz member order; a .safetensors file orders its data by alignment and
    name). Each name must then be written exactly once, with that shape and
    dtype, in any order; the file appears at ``path`` when the block ends
    without an error, and not at all otherwise. ``meta`` is gpuq's
    description of a quantized file (stored under ``"gpuq"``); ``extra_metadata``
    other safetensors metadata.

    >>> import tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "a.safetensors")
    >>> entries = {"b": ((2,), np.dtype("int8")), "a": ((3,), np.dtype("float32"))}
    >>> with checkpoint_writer(path, "safetensors", entries) as w:
    ...     w.write("b", np.array([1, 2], np.int8))     # data in any order
    ...     w.write("a", np.zeros(3, np.float32))
    >>> with Checkpoint(path) as ckpt:
    ...     ckpt.load("b")
    array([1, 2], dtype=int8)
    """
    entries = {name: (tuple(shape), np.dtype(dtype)) for name, (shape, dtype) in entries.items()}
    if fmt == "npy" and len(entries) != 1:
        raise ValueError(f"an .npy file holds one array, not {len(entries)}")
    with atomic_output(path) as tmp:
        writer = _WRITERS[fmt](path, tmp, entries, meta, extra_metadata)
        try:
            writer.guard(writer.start)
            yield writer
            missing = [n for n in entries if n not in writer.written]
            if missing:
                raise RuntimeError(f"tensors declared but never written: {missing[:5]}")
            writer.guard(writer.finish)
        finally:
            writer.close()


def write_checkpoint(path: str, fmt: str, tensors: dict, meta: dict | None,
                     extra_metadata: dict | None = None) -> None:
    """Write ``tensors`` (name -> array) to ``path`` atomically, with gpuq ``meta`` if given.

    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> write_checkpoint(os.path.join(d, "a.npz"), "npz", {"w": np.ones(2, np.int8)}, None)
    >>> Checkpoint(os.path.join(d, "a.npz")).load("w")
    array([1, 1], dtype=int8)
    """
    entries = {name: (np.shape(a), np.asarray(a).dtype) for name, a in tensors.items()}
    with checkpoint_writer(path, fmt, entries, meta, extra_metadata) as w:
        for name, arr in tensors.items():
            w.write(name, arr)


class _Writer:
    """Checks every write against the declared entries; turns OSError into one CliError."""

    def __init__(self, path, tmp, entries, meta, extra_metadata):
        self.path, self.tmp, self.entries = path, tmp, entries
        self.meta, self.extra_metadata = meta, dict(extra_metadata or {})
        self.written = set()
        self._rows = {}  # name -> the (start, stop) row ranges write_rows wrote

    def guard(self, fn, *args):
        try:
            return fn(*args)
        except OSError as exc:
            raise CliError(f"cannot write OUT {self.path!r}: {_one_line(exc)}") from exc

    def write(self, name: str, arr) -> None:
        """Write tensor ``name`` (declared up front; once)."""
        arr = np.asarray(arr)
        if name not in self.entries or name in self.written or name in self._rows:
            raise RuntimeError(f"tensor {name!r} was not declared, or is written twice")
        shape, dtype = self.entries[name]
        if arr.shape != shape or arr.dtype != dtype:
            raise RuntimeError(f"tensor {name!r}: declared {dtype} {shape}, got "
                               f"{arr.dtype} {arr.shape}")
        self.guard(self._write, name, arr)
        self.written.add(name)

    def write_rows(self, name: str, arr, start: int) -> None:
        """Write rows ``[start, start + len(arr))`` of tensor ``name`` (its first dimension; a
        .safetensors file only): the tensor counts as written once every row is, each once.
        For tensors made piece by piece (an expert at a time) in bounded memory."""
        arr = np.asarray(arr)
        if name not in self.entries or name in self.written or self.fmt != "safetensors":
            raise RuntimeError(f"tensor {name!r} was not declared, is written already, or OUT is "
                               f"not a .safetensors file")
        shape, dtype = self.entries[name]
        stop = start + (arr.shape[0] if arr.ndim else 0)
        done = self._rows.setdefault(name, [])
        if (arr.dtype != dtype or arr.shape[1:] != shape[1:] or not 0 <= start < stop <= shape[0]
                or any(a < stop and start < b for a, b in done)):
            raise RuntimeError(f"tensor {name!r}: rows [{start}, {stop}) of {dtype} {arr.shape[1:]} do not "
                               f"fit the declared {dtype} {shape}, or overlap rows written before")
        row = math.prod(shape[1:]) * dtype.itemsize
        self.guard(_pwrite_all, self.fd, _bytes_of(arr), self.data_start + self.offsets[name] + start * row)
        done.append((start, stop))
        if sum(b - a for a, b in done) == shape[0]:
            self.written.add(name)

    def copy_from(self, name: str, ckpt: "Checkpoint", src: str | None = None) -> None:
        """Write tensor ``name`` as tensor ``src`` (default ``name``) of the open checkpoint
        ``ckpt``, which has the declared shape and dtype: bit for bit what ``write(name,
        ckpt.load(src))`` writes. A .safetensors OUT copies the bytes file to file in the
        kernel (``copy_file_range``) where IN is a .safetensors file too, with no copy through
        the process's memory."""
        src = name if src is None else src
        if ckpt.spec(src) != self.entries.get(name):
            raise RuntimeError(f"tensor {name!r}: declared {self.entries.get(name)}, the source is "
                               f"{ckpt.spec(src)}")
        self.write(name, ckpt.load(src))

    def start(self):
        pass

    def finish(self):
        pass


def safetensors_layout(entries: dict, meta: dict | None = None,
                       extra_metadata: dict | None = None) -> tuple:
    """``(header, offsets, data_size)`` of a .safetensors file holding ``entries``
    (name -> (shape, dtype)): the header bytes as written after the 8-byte length,
    each tensor's offset in the data section, and that section's size.

    The library's layout: descending alignment, then name, so every offset is a
    multiple of its dtype's size (the header is padded with spaces to 8 bytes).

    >>> header, offsets, size = safetensors_layout({"a": ((3,), np.dtype("int8")),
    ...                                             "b": ((2,), np.dtype("float32"))})
    >>> len(header) % 8, header[:54], offsets, size
    (0, b'{"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},', {'b': 0, 'a': 8}, 11)
    """
    codes = {name: safetensors_code(dt) for name, (_, dt) in entries.items()}
    order = sorted(entries, key=lambda n: (-_ST_ORDER.index(codes[n]), n))
    header, offsets, at = {}, {}, 0
    metadata = dict(extra_metadata or {})
    if meta is not None:
        metadata[META_KEY] = json.dumps(meta, sort_keys=True)
    if metadata:
        header["__metadata__"] = {k: metadata[k] for k in sorted(metadata)}
    for name in order:
        shape, dtype = entries[name]
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        header[name] = {"dtype": codes[name], "shape": list(shape),
                        "data_offsets": [at, at + nbytes]}
        offsets[name] = at
        at += nbytes
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return text + b" " * (-len(text) % 8), offsets, at


def check_header_size(path: str, header: bytes, entries: dict) -> None:
    """Refuse a .safetensors OUT whose header is over :data:`MAX_HEADER` (which no safetensors
    reader, gpuq's included, would open), before anything is written.

    >>> check_header_size("o.safetensors", b" " * (MAX_HEADER + 8), {"w": None})
    Traceback (most recent call last):
    ...
    gpuq.checkpoints.files.CliError: cannot write OUT 'o.safetensors': its safetensors header would be 100,000,008 bytes, over the 100,000,000 the format allows (1 tensor and the metadata), so no safetensors reader could open it; write fewer tensors or less metadata per file (a sharded checkpoint)
    """
    if len(header) > MAX_HEADER:
        n = len(entries)
        raise CliError(f"cannot write OUT {path!r}: its safetensors header would be "
                       f"{len(header):,} bytes, over the {MAX_HEADER:,} the format allows "
                       f"({n:,} tensor{'s' if n != 1 else ''} and the metadata), so no "
                       f"safetensors reader could open it; write fewer tensors or less "
                       f"metadata per file (a sharded checkpoint)")


class _SafetensorsWriter(_Writer):
    fmt = "safetensors"

    def start(self):
        _check_little_endian(self.path, "OUT")
        text, self.offsets, at = safetensors_layout(self.entries, self.meta, self.extra_metadata)
        check_header_size(self.path, text, self.entries)
        self.data_start = 8 + len(text)
        self.fd = os.open(self.tmp, os.O_WRONLY)
        _preallocate(self.fd, self.data_start + at)
        _pwrite_all(self.fd, len(text).to_bytes(8, "little") + text, 0)

    def _write(self, name, arr):
        _pwrite_all(self.fd, _bytes_of(arr), self.data_start + self.offsets[name])

    def copy_from(self, name, ckpt, src=None):
        src = name if src is None else src
        span = ckpt.file_span(src)
        if span is None or not hasattr(os, "copy_file_range") or name in self.written or \
                ckpt.spec(src) != self.entries.get(name):
            super().copy_from(name, ckpt, src)
            return
        fd, offset, nbytes = span
        if self.guard(_copy_range, fd, offset, self.fd, self.data_start + self.offsets[name], nbytes):
            self.written.add(name)
        else:  # this kernel or file system copies no ranges between these files: through memory
            super().copy_from(name, ckpt, src)

    def close(self):
        if getattr(self, "fd", None) is not None:
            os.close(self.fd)
            self.fd = None


class _NpzWriter(_Writer):
    fmt = "npz"

    def start(self):
        # The file atomic_output created, opened for writing (its mode stays).
        self.zf = zipfile.ZipFile(self.tmp, "w", zipfile.ZIP_STORED, allowZip64=True)

    def _write(self, name, arr):
        _write_member(self.zf, name, arr)

    def finish(self):
        if self.meta is not None:
            _write_member(self.zf, NPZ_META, np.array(json.dumps(self.meta, sort_keys=True)))
        zf, self.zf = self.zf, None
        zf.close()  # the central directory: a write that can fail too

    def close(self):
        if getattr(self, "zf", None) is not None:
            with contextlib.suppress(OSError):  # on the error path: the file goes anyway
                self.zf.close()
            self.zf = None


def _write_member(zf, name, arr):
    # np.savez takes the arrays as keyword arguments, so a tensor named "file" or
    # "allow_pickle" would collide; write the members the way savez does (a str
    # name gets zipfile's fixed 1980 date, so the bytes do not depend on the time).
    with zf.open(name + ".npy", "w", force_zip64=True) as fh:
        np.lib.format.write_array(fh, np.asanyarray(arr), allow_pickle=False)


class _NpyWriter(_Writer):
    fmt = "npy"

    def start(self):
        self.fh = open(self.tmp, "r+b")

    def _write(self, name, arr):
        np.lib.format.write_array(self.fh, arr, allow_pickle=False)

    def finish(self):
        fh, self.fh = self.fh, None
        fh.close()

    def close(self):
        if getattr(self, "fh", None) is not None:
            with contextlib.suppress(OSError):
                self.fh.close()
            self.fh = None


_WRITERS = {"safetensors": _SafetensorsWriter, "npz": _NpzWriter, "npy": _NpyWriter}


def _bytes_of(arr) -> memoryview:
    arr = np.require(arr, requirements="C")  # a copy only when not C-contiguous already
    if arr.size == 0:
        return memoryview(b"")
    return memoryview(arr.reshape(-1).view(np.uint8))


def _pwrite_all(fd, data, offset):
    view = memoryview(data)
    while len(view):
        chunk = view[: 1 << 30]  # Linux writes at most ~2 GiB per call
        if hasattr(os, "pwrite"):
            n = os.pwrite(fd, chunk, offset)
        else:  # Windows: no positioned write
            os.lseek(fd, offset, os.SEEK_SET)
            n = os.write(fd, chunk)
        view, offset = view[n:], offset + n


def _copy_range(src_fd, src_offset, dst_fd, dst_offset, nbytes) -> bool:
    """Copy ``nbytes`` from ``src_fd`` at ``src_offset`` to ``dst_fd`` at ``dst_offset`` in the
    kernel; False (nothing copied) where it cannot copy between these two files."""
    done = 0
    while done < nbytes:
        try:
            n = os.copy_file_range(src_fd, dst_fd, min(nbytes - done, 1 << 30), src_offset + done,
                                   dst_offset + done)
        except OSError as exc:
            if done == 0 and exc.errno in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP,
                                           errno.EBADF):
                return False
            raise
        if n == 0:  # IN is shorter than its header said: it changed under us
            raise OSError(errno.EIO, f"the input ends {nbytes - done} bytes early")
        done += n
    return True


def _preallocate(fd, size):
    # Reserve the whole file before any work: a full disk (or a file size limit) is
    # reported at once, not after minutes of quantizing. Filesystems that cannot
    # preallocate just skip it; their writes still fail cleanly.
    if size <= 0 or not hasattr(os, "posix_fallocate"):
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            raise
