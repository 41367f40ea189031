"""Checkpoint files for the ``gpuq`` command: read .safetensors/.npz/.npy, write atomically.

============  =====================================  ===============================================
format        tensors                                 where the gpuq scheme is stored
============  =====================================  ===============================================
.safetensors  every safetensors dtype NumPy can hold  header metadata key ``"gpuq"`` (JSON text)
              (bfloat16 through ``ml_dtypes``)
.npz          NumPy arrays (no pickled objects)       member ``__gpuq__``: a 0-d str array (JSON)
.npy          one array, named ``arr_0`` (NumPy's     (read only: the quantized output is an .npz)
              name for an unnamed array in an .npz)
============  =====================================  ===============================================

Tensors are listed (name, shape, dtype) without being loaded, so every check
runs before any work; :func:`atomic_output` makes sure a failed or interrupted
run leaves no file behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import zipfile

import numpy as np

#: The member/metadata key holding gpuq's JSON description of a quantized file.
META_KEY = "gpuq"
NPZ_META = "__gpuq__"
#: The name a lone .npy array gets (as in ``np.savez(f, x)``).
NPY_NAME = "arr_0"
FORMATS = {".safetensors": "safetensors", ".npz": "npz", ".npy": "npy"}


class CliError(Exception):
    """A user-facing error: printed as one ``gpuq: error: ...`` line, exit code 2."""


def file_format(path: str, role: str) -> str:
    """The format named by ``path``'s extension.

    >>> file_format("model.safetensors", "IN")
    'safetensors'
    >>> file_format("model.bin", "IN")
    Traceback (most recent call last):
    ...
    gpuq.cli.files.CliError: IN 'model.bin' has an unknown extension '.bin': expected .safetensors, .npz or .npy
    """
    ext = os.path.splitext(path)[1].lower()
    if ext not in FORMATS:
        raise CliError(
            f"{role} {path!r} has an unknown extension {ext!r}: expected .safetensors, .npz or .npy"
        )
    return FORMATS[ext]


def _import_ml_dtypes():
    # Importing ml_dtypes registers "bfloat16" with NumPy, which is what lets
    # safetensors hand out bfloat16 arrays without torch.
    try:
        import ml_dtypes  # noqa: F401
    except ImportError:
        return False
    return True


class Checkpoint:
    """A checkpoint opened for reading: ``names``, ``spec(name)``, ``load(name)``, ``meta``.

    ``meta`` is the gpuq description (a dict) for files written by
    ``gpuq quantize`` and ``None`` otherwise; ``extra_metadata`` holds any
    other safetensors metadata, passed through unchanged.
    """

    def __init__(self, path: str):
        self.path = path
        self.format = file_format(path, "IN")
        if not os.path.exists(path):
            raise CliError(f"cannot read IN {path!r}: no such file")
        if os.path.isdir(path):
            raise CliError(f"cannot read IN {path!r}: it is a directory")
        self._stack = contextlib.ExitStack()
        try:
            self._open()
        except CliError:
            self.close()
            raise
        except Exception as exc:  # each library has its own error types for bad files
            self.close()
            raise CliError(f"cannot read IN {path!r}: {_one_line(exc)}") from exc

    # -- opening -------------------------------------------------------------
    def _open(self):
        self.extra_metadata = {}
        self.meta = None
        if self.format == "safetensors":
            self._open_safetensors()
        elif self.format == "npz":
            self._open_npz()
        else:
            arr = np.load(self.path, mmap_mode="r", allow_pickle=False)
            self._specs = {NPY_NAME: (tuple(arr.shape), arr.dtype)}
            self._arrays = {NPY_NAME: arr}

    def _open_safetensors(self):
        try:
            from safetensors import safe_open
        except ImportError:
            raise CliError(
                "reading .safetensors needs the safetensors package: pip install 'gpuq[cli]'"
            ) from None
        has_ml_dtypes = _import_ml_dtypes()
        f = self._stack.enter_context(safe_open(self.path, framework="np"))
        self._st = f
        self._specs = {}
        for name in f.keys():
            sl = f.get_slice(name)
            code = sl.get_dtype()
            if code == "BF16" and not has_ml_dtypes:
                raise CliError(
                    f"tensor {name!r} is bfloat16: reading it needs ml_dtypes "
                    f"(pip install 'gpuq[cli]')"
                )
            self._specs[name] = (tuple(sl.get_shape()), code)
        metadata = dict(f.metadata() or {})
        if META_KEY in metadata:
            self.meta = _parse_meta(metadata.pop(META_KEY), self.path)
        self.extra_metadata = metadata

    def _open_npz(self):
        zf = self._stack.enter_context(zipfile.ZipFile(self.path))
        bad = zf.testzip()  # CRC of every member: catches corruption before any work
        if bad is not None:
            raise CliError(f"cannot read IN {self.path!r}: member {bad!r} is corrupt")
        self._zip = zf
        self._specs = {}
        self._members = {}
        for member in zf.namelist():
            name = member[:-4] if member.endswith(".npy") else member
            with zf.open(member) as fh:
                version = np.lib.format.read_magic(fh)
                if version == (1, 0):
                    shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
                else:
                    shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
            if dtype.hasobject:
                raise CliError(
                    f"cannot read IN {self.path!r}: member {name!r} holds Python objects "
                    f"(pickle), which gpuq does not load"
                )
            self._members[name] = member
            self._specs[name] = (tuple(shape), dtype)
        if NPZ_META in self._specs:
            self.meta = _parse_meta(str(self._load_npz(NPZ_META)), self.path)
            del self._specs[NPZ_META]

    # -- access --------------------------------------------------------------
    @property
    def names(self) -> list:
        """Tensor names in file order."""
        return list(self._specs)

    def spec(self, name: str):
        """``(shape, dtype)`` of a tensor without loading it (dtype as a NumPy dtype)."""
        shape, dtype = self._specs[name]
        if isinstance(dtype, str):  # a safetensors dtype code
            dtype = _SAFETENSORS_DTYPES.get(dtype, dtype)
        return shape, dtype

    def load(self, name: str) -> np.ndarray:
        """The tensor as a NumPy array (bit for bit what the file holds)."""
        try:
            if self.format == "safetensors":
                return self._st.get_tensor(name)
            if self.format == "npz":
                return self._load_npz(name)
            return np.array(self._arrays[name])
        except CliError:
            raise
        except Exception as exc:
            raise CliError(f"cannot read tensor {name!r} of IN {self.path!r}: {_one_line(exc)}") from exc

    def _load_npz(self, name):
        with self._zip.open(self._members[name]) as fh:
            return np.lib.format.read_array(fh, allow_pickle=False)

    def close(self):
        self._arrays = {}
        self._stack.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _safetensors_dtypes():
    table = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
             "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8",
             "U64": "uint64", "U32": "uint32", "U16": "uint16", "U8": "uint8", "BOOL": "bool"}
    _import_ml_dtypes()
    out = {}
    for code, name in table.items():
        try:
            out[code] = np.dtype(name)
        except TypeError:  # bfloat16 without ml_dtypes: refused when the file is opened
            pass
    return out


_SAFETENSORS_DTYPES = _safetensors_dtypes()


def _parse_meta(text, path):
    try:
        meta = json.loads(text)
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


def write_checkpoint(path: str, fmt: str, tensors: dict, meta: dict | None,
                     extra_metadata: dict | None = None) -> None:
    """Write ``tensors`` (name -> array) to ``path`` atomically, with gpuq ``meta`` if given.

    >>> import tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> write_checkpoint(os.path.join(d, "a.npz"), "npz", {"w": np.ones(2, np.int8)}, None)
    >>> Checkpoint(os.path.join(d, "a.npz")).load("w")
    array([1, 1], dtype=int8)
    """
    with atomic_output(path) as tmp:
        if fmt == "safetensors":
            from safetensors.numpy import save_file

            metadata = dict(extra_metadata or {})
            if meta is not None:
                metadata[META_KEY] = json.dumps(meta, sort_keys=True)
            save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, tmp,
                      metadata=metadata or None)
        elif fmt == "npz":
            members = dict(tensors)
            if meta is not None:
                members[NPZ_META] = np.array(json.dumps(meta, sort_keys=True))
            _write_npz(tmp, members)
        else:
            (arr,) = tensors.values()
            with open(tmp, "wb") as fh:
                np.lib.format.write_array(fh, np.asanyarray(arr), allow_pickle=False)


def _write_npz(path, members):
    # np.savez takes the arrays as keyword arguments, so a tensor named "file"
    # or "allow_pickle" would collide; write the members the way savez does.
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, arr in members.items():
            with zf.open(name + ".npy", "w", force_zip64=True) as fh:
                np.lib.format.write_array(fh, np.asanyarray(arr), allow_pickle=False)
