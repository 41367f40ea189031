"""A model folder, as ``save_pretrained`` writes it: read, and written all or nothing.

A model folder holds ``config.json``, its weights (one ``model.safetensors``, the name
transformers and compressed-tensors look for, or shards named by a
``*.safetensors.index.json``) and other files (tokenizer, generation config, chat template).

Reading (:class:`ModelFolder`): the config must be a JSON object; the weights are checked as
every gpuq input is (:class:`gpuq.checkpoints.sharded.ShardedCheckpoint` for an index and its shards,
:class:`gpuq.checkpoints.files.Checkpoint` for one file), before any work. Other plain files at the top
are carried over as they are; so are the module folders a sentence-transformers
``modules.json`` names (``1_Pooling/``, ``2_Normalize/``, ``2_Dense/``: copied bit for bit, their
weights never quantized, listed in the report). Other folders and weight files of other formats
(``*.bin``, ``*.pt``, ``*.gguf``, ...) are not (a quantized folder must not hold a second, dense
copy of the model), and the report lists what was left out.

Writing (:class:`ModelOutput`): OUT is a new or existing folder. Every output shard and copied
file is staged under a hidden name of the run (``.gpuq-RUN.NAME``, as a sharded run stages its
shards); only when all are complete does the commit, with SIGINT/SIGTERM held, remove the old
``config.json`` and index, rename the staged files into place and write the index and then
``config.json`` last. A run that fails or is stopped before the commit removes what it made, so
OUT is as it was. An existing OUT may hold only hidden files and the names this run writes or
copies (so a re-run into the same OUT works); anything else (another model's weights, tokenizer
or folders) is refused before any work.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil

from ..files import Checkpoint, CliError, _one_line, atomic_output
from ..sharded import (INDEX_SUFFIX, OutputFolder, ShardedCheckpoint, prepare_folder,
                       refuse_folders_in_the_way, write_index)
from ..stops import complete, held_signals

CONFIG = "config.json"
#: sentence-transformers' list of modules; the ones with a ``path`` live in that subfolder.
MODULES = "modules.json"
#: The one-file model's name (transformers' SAFE_WEIGHTS_NAME).
SINGLE = "model.safetensors"
#: Weight files of other formats, never carried into OUT (a dense copy beside the new weights).
#: The dtypes a model's config.json may name: transformers' names of the floating torch dtypes.
_CONFIG_DTYPES = ("bfloat16", "float16", "float32", "float64")
_OTHER_WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf",
                  ".onnx", ".index.json")


class ModelFolder:
    """A model folder opened for reading; no tensor data is read.

    ``config`` (the parsed config.json), ``shards`` (weight file names, natural order),
    ``tensors`` (shard -> tensor names, file order), ``specs`` (name -> (shape, dtype)),
    ``weight_map`` (name -> shard), ``index_name`` (None for one ``model.safetensors``),
    ``metadata`` (the index's), ``extra`` (shard -> its safetensors metadata), ``metas``
    (shard -> its gpuq metadata or None), ``others`` (files and module folders carried over),
    ``modules`` (the module folders among them) and ``left_out`` (what is not).

    >>> import tempfile, numpy as np
    >>> from gpuq.checkpoints.files import write_checkpoint
    >>> d = tempfile.mkdtemp()
    >>> write_checkpoint(os.path.join(d, SINGLE), "safetensors", {"w": np.ones((2, 2), np.float32)}, None)
    >>> write_json(os.path.join(d, CONFIG), {"model_type": "llama"})
    >>> m = ModelFolder(d); m.shards, m.index_name, m.specs["w"][0]
    (['model.safetensors'], None, (2, 2))
    """

    def __init__(self, path: str):
        if not os.path.isdir(path):
            what = "does not exist" if not os.path.exists(path) else "is a file"
            raise CliError(f"IN {path!r} must be a model folder (config.json and the safetensors "
                           f"weights), but it {what}")
        self.path = path
        self.config = read_json(os.path.join(path, CONFIG), f"IN {path!r} is not a model folder")
        for key in ("dtype", "torch_dtype"):
            named = self.config.get(key)
            if named is not None and named not in _CONFIG_DTYPES:
                raise CliError(f"IN {path!r}: config.json's {key!r} is {named!r}, not a dtype a model's "
                               f"weights come in ({', '.join(_CONFIG_DTYPES)})")
        indexes = sorted(f for f in os.listdir(path) if f.endswith(INDEX_SUFFIX))
        single = os.path.join(path, SINGLE)
        if indexes:
            src = ShardedCheckpoint(path)  # exactly one index, its shards checked against it
            if os.path.exists(single) and SINGLE not in src.shards:
                raise CliError(f"IN {path!r} holds both {SINGLE} and {src.index_name}, which does "
                               f"not name it: which are the model's weights? Remove one")
            self.index_name, self.metadata = src.index_name, src.metadata
            self.shards, self.tensors, self.specs = src.shards, src.tensors, src.specs
            self.extra, self.metas = src.extra, src.metas
        elif os.path.isfile(single):
            with Checkpoint(single) as ckpt:
                self.tensors = {SINGLE: ckpt.names}
                self.specs = {n: ckpt.spec(n) for n in ckpt.names}
                self.extra, self.metas = {SINGLE: ckpt.extra_metadata}, {SINGLE: ckpt.meta}
            self.index_name, self.metadata, self.shards = None, {}, [SINGLE]
        else:
            raise CliError(f"IN {path!r} has no {SINGLE} and no *{INDEX_SUFFIX}: gpuq reads model "
                           f"folders with safetensors weights")
        self.weight_map = {n: s for s, names in self.tensors.items() for n in names}
        weights = set(self.shards) | {self.index_name, CONFIG}
        self.modules = module_folders(path)
        self.others, self.left_out = list(self.modules), []
        for f in sorted(os.listdir(path)):
            full = os.path.join(path, f)
            if f in weights or f in self.modules:
                continue
            # hidden files (.gitattributes, a hub download's .cache/) are named, not copied
            if os.path.isfile(full) and not f.endswith(_OTHER_WEIGHTS) and not f.startswith("."):
                self.others.append(f)
            else:
                self.left_out.append(f + ("/" if os.path.isdir(full) else ""))

    # what sharded.OutputFolder and write_index read of a source
    @property
    def folder(self) -> str:
        return self.path

    def shard_path(self, shard: str) -> str:
        return os.path.join(self.path, shard)


class Tensors:
    """Tensors of a model folder by name, from whichever shard holds them (a scale may sit in
    another shard than its weight); each shard opened once, closed with the block.

    >>> import tempfile, numpy as np
    >>> from gpuq.checkpoints.files import write_checkpoint
    >>> d = tempfile.mkdtemp()
    >>> write_checkpoint(os.path.join(d, SINGLE), "safetensors", {"w": np.ones(2, np.int8)}, None)
    >>> write_json(os.path.join(d, CONFIG), {})
    >>> with Tensors(ModelFolder(d)) as t:
    ...     t.load("w")
    array([1, 1], dtype=int8)
    """

    def __init__(self, model: ModelFolder):
        self.model, self._open = model, {}

    def _holder(self, name: str) -> Checkpoint:
        shard = self.model.weight_map[name]
        if shard not in self._open:
            self._open[shard] = Checkpoint(self.model.shard_path(shard))
        return self._open[shard]

    def load(self, name: str):
        return self._holder(name).load(name)

    def load_rows(self, name: str, start: int, stop: int):
        """Rows ``[start, stop)`` of a tensor (:meth:`gpuq.checkpoints.files.Checkpoint.load_rows`)."""
        return self._holder(name).load_rows(name, start, stop)

    def close(self):
        for ckpt in self._open.values():
            ckpt.close()
        self._open.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class ModelOutput(OutputFolder):
    """OUT of a model-folder run: checked (created if missing) at once, written all or nothing.

    ``names`` are the files the run writes (shards, index, config.json, copied files): OUT may
    hold those (they are replaced), but no other weight file. ``staged(name)`` is where a file
    is written first; :meth:`commit` puts everything in place; :meth:`remove_own` (inherited)
    removes the run's files and OUT if the run made it.

    >>> import tempfile
    >>> class Src:
    ...     path, folder, shards = "/nonexistent", "/nonexistent", ["model.safetensors"]
    >>> out = ModelOutput(os.path.join(tempfile.mkdtemp(), "out"), Src(), ["model.safetensors"])
    >>> out.remove_own(); os.path.exists(out.path)
    False
    """

    def __init__(self, path: str, src, names):
        self.path, self.src, self.names = path, src, set(names)
        #: The module folders (sentence-transformers') among ``names``.
        self.dirs = set(getattr(src, "modules", ())) & self.names
        self.run = secrets.token_hex(6)
        self.created = _prepare(path, src, self.names, self.dirs)

    def copy_others(self, src: ModelFolder) -> None:
        """Stage a copy of every file and module folder of ``src`` carried over as it is."""
        for f in src.others:
            try:
                if f in self.dirs:
                    shutil.copytree(os.path.join(src.path, f), self.staged(f))
                else:
                    shutil.copyfile(os.path.join(src.path, f), self.staged(f))
            except (OSError, shutil.Error) as exc:
                raise CliError(f"cannot copy {f!r} into OUT {self.path!r}: {_one_line(exc)}") from exc

    def remove_own(self) -> None:
        """As :meth:`OutputFolder.remove_own`, staged module folders included."""
        with contextlib.suppress(OSError):
            for f in os.listdir(self.path):
                full = os.path.join(self.path, f)
                if f".gpuq-{self.run}." in f and os.path.isdir(full) and not os.path.islink(full):
                    shutil.rmtree(full, ignore_errors=True)
        super().remove_own()

    def commit(self, staged: list, index_src, shard_entries: dict | None, config: dict) -> None:
        """Rename the ``staged`` files into place, write the index (when ``index_src``, a source
        with ``index_name`` and ``metadata``, is given: see :func:`gpuq.checkpoints.sharded.write_index`,
        from ``{shard: {name: nbytes}}``) and then ``config.json``."""
        with held_signals():
            # an earlier run's module folder is moved aside (a rename cannot replace a folder),
            # and back if the renames fail before any is made
            refuse_folders_in_the_way(self.path, set(staged) - self.dirs)
            aside = [f for f in sorted(self.dirs & set(staged)) if os.path.isdir(os.path.join(self.path, f))]
            for f in aside:
                os.replace(os.path.join(self.path, f), self.staged(f"old.{f}"))
            try:
                # config.json goes first and comes back last: a half-committed OUT is no model folder
                self.put_in_place([CONFIG] + sorted(n for n in self.names if n.endswith(INDEX_SUFFIX)), staged)
            except BaseException:
                for f in aside:
                    if not os.path.lexists(os.path.join(self.path, f)):
                        os.replace(self.staged(f"old.{f}"), os.path.join(self.path, f))
                raise
            if index_src is not None:
                write_index(self.path, index_src, shard_entries)
            write_json(os.path.join(self.path, CONFIG), config)
            for f in aside:
                shutil.rmtree(self.staged(f"old.{f}"), ignore_errors=True)
            complete(self.path)


def _prepare(out: str, src, names, dirs=()) -> bool:
    """Check OUT (a folder for a model), create it if missing; True if created here. An existing
    OUT may hold hidden files and ``names`` (replaced at the commit; ``dirs``, the module
    folders among them, as folders), nothing else."""
    if prepare_folder(out, src.path, "for a model (config.json and the weights go there)",
                      "a model folder is written to a folder"):
        return True
    refuse_folders_in_the_way(out, set(names) - set(dirs))
    for d in sorted(dirs):
        full = os.path.join(out, d)
        if os.path.lexists(full) and (os.path.islink(full) or not os.path.isdir(full)):
            raise CliError(f"cannot write OUT {out!r}: {d!r} there is not a folder, and this run "
                           f"copies the module folder of that name; remove it or write to a new folder")
    stale = sorted(f for f in os.listdir(out) if f not in names and not f.startswith("."))
    if stale:
        what = "weights of another model" if stale[0].endswith(_OTHER_WEIGHTS) else "files of another model"
        raise CliError(f"OUT {out!r} holds {stale[0]!r}, which this run would not replace (the {what} "
                       f"would sit beside the new ones); remove it or write to a new folder")
    return False


def module_folders(path: str) -> list:
    """The subfolders of the model folder ``path`` that its sentence-transformers ``modules.json``
    names (its modules' ``path``: ``1_Pooling``, ...); [] without that file. A path that is not
    a plain subfolder of ``path`` (nested, absolute, hidden, a link, missing) is not one.

    >>> import tempfile
    >>> d = tempfile.mkdtemp(); os.mkdir(os.path.join(d, "1_Pooling"))
    >>> with open(os.path.join(d, MODULES), "w") as fh:
    ...     _ = fh.write('[{"idx": 0, "path": ""}, {"idx": 1, "path": "1_Pooling"}, {"idx": 2, "path": "../x"}]')
    >>> module_folders(d)
    ['1_Pooling']
    """
    listed = os.path.join(path, MODULES)
    if not os.path.isfile(listed):
        return []
    try:
        with open(listed, "rb") as fh:
            modules = json.loads(fh.read().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CliError(f"cannot read {listed!r}: not a UTF-8 JSON file ({_one_line(exc)})") from None
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise CliError(f"cannot read {listed!r}: sentence-transformers' modules.json is a list of "
                       f"objects, it holds {type(modules).__name__}")
    found = []
    for m in modules:
        name = m.get("path")
        full = os.path.join(path, name) if isinstance(name, str) else ""
        if (isinstance(name, str) and name and name == os.path.basename(name) and not name.startswith(".")
                and os.path.isdir(full) and not os.path.islink(full) and name not in found):
            found.append(name)
    return sorted(found)


def module_notes(model: ModelFolder) -> list:
    """The report's note on the module folders copied as they are (none without them).

    >>> class M:
    ...     modules = ["1_Pooling", "2_Normalize"]
    >>> module_notes(M())
    ['note: copied bit for bit: 1_Pooling/, 2_Normalize/ (the module folders modules.json names; their weights are not quantized or dequantized)']
    """
    if not model.modules:
        return []
    return [f"note: copied bit for bit: {', '.join(m + '/' for m in model.modules)} (the module "
            f"folders modules.json names; their weights are not quantized or dequantized)"]


def read_json(path: str, what: str) -> dict:
    """A JSON object from ``path``, or one CliError starting with ``what``.

    >>> read_json("/nonexistent/config.json", "IN 'x' is not a model folder")
    Traceback (most recent call last):
    ...
    gpuq.checkpoints.files.CliError: IN 'x' is not a model folder: no /nonexistent/config.json
    """
    if not os.path.isfile(path):
        raise CliError(f"{what}: no {path}")
    try:
        with open(path, "rb") as fh:
            obj = json.loads(fh.read().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CliError(f"cannot read {path!r}: not a UTF-8 JSON file ({_one_line(exc)})") from None
    if not isinstance(obj, dict):
        raise CliError(f"cannot read {path!r}: it holds a JSON {type(obj).__name__}, not an object")
    return obj


def write_json(path: str, obj: dict) -> None:
    """``obj`` as transformers writes a config: indented, keys sorted, a final newline; atomic.

    >>> import tempfile
    >>> p = os.path.join(tempfile.mkdtemp(), "config.json")
    >>> write_json(p, {"b": 1, "a": [2]}); print(open(p).read(), end="")
    {
      "a": [
        2
      ],
      "b": 1
    }
    """
    with atomic_output(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(obj, indent=2, sort_keys=True) + "\n")


@contextlib.contextmanager
def model_output(out: str, src: ModelFolder, names):
    """A :class:`ModelOutput` whose run's files are removed on the way out, whatever happens
    (after a commit only what a failed step left).

    >>> import tempfile
    >>> class Src:
    ...     path, folder = "/nonexistent", "/nonexistent"
    >>> out = os.path.join(tempfile.mkdtemp(), "out")
    >>> with model_output(out, Src(), ["model.safetensors"]) as folder:
    ...     open(folder.staged("model.safetensors"), "w").close()       # a run that never commits
    >>> os.path.exists(out)
    False
    """
    folder = ModelOutput(out, src, names)
    try:
        yield folder
    finally:
        folder.remove_own()


