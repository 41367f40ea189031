"""Sharded safetensors checkpoints: the index, the output folder, one shard's work.

A sharded checkpoint is a folder of ``.safetensors`` shards plus an index,
``model.safetensors.index.json`` (Hugging Face's layout)::

    {"metadata": {"total_size": 123456}, "weight_map": {"lm_head.weight": "model-00002-of-00002.safetensors", ...}}

IN is the folder (holding exactly one ``*.safetensors.index.json``) or the
index file itself. Before any work every shard's header is read and held to
the index (:class:`ShardedCheckpoint`): each shard named in the
``weight_map`` is a plain file name beside the index and a regular file there,
each tensor is listed once, its shard holds it, and each shard holds nothing
the ``weight_map`` does not put there. A mismatch is one ``gpuq: error:``
line, exit 2, nothing written.

**Output layout.** OUT is a folder (created if missing; its parent must
exist). Each input shard gives one output shard of the same file name, and
the index keeps the input index's file name. An output shard is byte for
byte the file that ``gpuq quantize SHARD -o OUT/SHARD`` (or ``dequantize``)
writes with the same options: the same per-file code
(:func:`gpuq.checkpoints.convert.quantize_file`) writes it, with the tensor selection
made once over the whole model (the ``--include``/``--exclude`` patterns must
match somewhere in the model, not in every shard; a shard with no tensor to
quantize is copied, with an empty gpuq table). Every quantized shard carries
its own gpuq metadata, so it is checked and dequantized on its own too. The
index's ``weight_map`` lists every output tensor (``NAME.scales`` and
``NAME.zps`` beside their codes) sorted by name, and ``metadata`` is the
input's with ``total_size`` recomputed (the bytes of tensor data).

**All or nothing** (:class:`OutputFolder`). Each shard is written (through
:func:`gpuq.checkpoints.files.atomic_output`) under a hidden staged name unique to
the run, ``.gpuq-RUN.SHARD``; nothing in OUT is replaced until every shard
has succeeded. Then the commit, with SIGINT/SIGTERM held
(:func:`gpuq.checkpoints.stops.held_signals`), removes an earlier run's index,
renames each staged shard to its name and writes the index last. A run that
fails or is stopped before the commit removes every file it made (staged
shards and the temporary files of shards in progress, its own by the run's
name, and OUT if it created it), so OUT is left exactly as it was. Where the
shards run is :mod:`gpuq.checkpoints.sharded_run` (here, or as Dask tasks:
:mod:`gpuq.checkpoints.cluster`).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets

from .files import Checkpoint, CliError, _one_line, _remove, atomic_output
from .report import natural_key
from .stops import complete, held_signals

INDEX_SUFFIX = ".safetensors.index.json"


def is_sharded(path: str) -> bool:
    """Whether IN names a sharded checkpoint: a folder, or an ``*.index.json`` file.

    >>> is_sharded("model.safetensors.index.json"), is_sharded("model.safetensors")
    (True, False)
    """
    return os.path.isdir(path) or path.endswith(".index.json")


def _dup_keys(pairs):
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        dup = next(k for k in keys if keys.count(k) > 1)
        raise _Duplicate(dup)
    return dict(pairs)


class _Duplicate(ValueError):
    pass


class ShardedCheckpoint:
    """A sharded checkpoint's index, checked against the headers of its shards.

    ``folder``, ``index_name`` (the index's file name), ``metadata`` (the
    index's, a dict), ``shards`` (shard file names, sorted), ``tensors``
    (shard -> tensor names, in file order) and ``specs`` (name -> (shape,
    dtype) over the whole model). ``metas`` maps each shard to its gpuq
    metadata (``None`` when it has none), ``extra`` to its other safetensors
    metadata. No tensor data is read.
    """

    def __init__(self, path: str):
        self.path = path
        if os.path.isdir(path):
            found = sorted(f for f in os.listdir(path) if f.endswith(INDEX_SUFFIX))
            if not found and os.path.isfile(os.path.join(path, "model.safetensors")):
                # a one-file model folder, as save_pretrained writes it
                raise CliError(f"IN {path!r} is a model folder with one model.safetensors: add --format "
                               f"compressed-tensors or fp8-blocks to write a model folder, or pass "
                               f"MODEL_DIR/model.safetensors ({os.path.join(path, 'model.safetensors')!r}) "
                               f"for gpuq's own format")
            if len(found) != 1:
                why = "none" if not found else f"{len(found)}: {', '.join(found)}"
                raise CliError(f"IN {path!r} is a folder, so it must hold exactly one "
                               f"*{INDEX_SUFFIX} ({why}); pass the index or a .safetensors file")
            self.folder, self.index_name = path, found[0]
        else:
            if not os.path.isfile(path):
                raise CliError(f"cannot read IN {path!r}: no such file")
            self.folder, self.index_name = os.path.dirname(path) or ".", os.path.basename(path)
        index_path = os.path.join(self.folder, self.index_name)
        self.index_path = index_path

        def bad(why):
            return CliError(f"cannot read index {index_path!r}: {why}")

        try:
            with open(index_path, "rb") as fh:
                index = json.loads(fh.read().decode("utf-8"), object_pairs_hook=_dup_keys)
        except _Duplicate as exc:
            raise bad(f"{exc.args[0]!r} is listed twice (a tensor may be in the weight_map "
                      f"once)") from None
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise bad(f"not a UTF-8 JSON file ({_one_line(exc)})") from None
        if not isinstance(index, dict) or not isinstance(index.get("weight_map"), dict):
            raise bad("it has no 'weight_map' object")
        weight_map = index["weight_map"]
        if not weight_map:
            raise bad("its weight_map is empty")
        metadata = index.get("metadata", {})
        if not isinstance(metadata, dict):
            raise bad(f"its 'metadata' is {type(metadata).__name__}, not an object")
        self.metadata = metadata
        for name, shard in weight_map.items():
            # Plain file names only: an output shard goes to OUT under the same name, so a
            # path ('../x', '/etc/x') would write outside OUT.
            if (not isinstance(shard, str) or not shard.endswith(".safetensors")
                    or os.path.basename(shard) != shard or shard.startswith(".")
                    or "\\" in shard):
                raise bad(f"tensor {name!r} maps to {shard!r}, not a .safetensors file name "
                          f"beside the index")
        self.shards = sorted(set(weight_map.values()), key=natural_key)
        self.tensors, self.specs, self.metas, self.extra = {}, {}, {}, {}
        for shard in self.shards:
            shard_path = os.path.join(self.folder, shard)
            if not os.path.isfile(shard_path):
                what = ("is a folder, not a file" if os.path.isdir(shard_path) else
                        "is not a regular file" if os.path.lexists(shard_path) else
                        "does not exist")
                raise bad(f"shard {shard!r} named in the weight_map {what}")
            with Checkpoint(shard_path) as ckpt:
                names = ckpt.names
                for name in names:
                    where = weight_map.get(name)
                    if where is None:
                        raise bad(f"shard {shard!r} holds tensor {name!r}, which is not in the "
                                  f"weight_map")
                    if where != shard:
                        raise bad(f"shard {shard!r} holds tensor {name!r}, which the weight_map "
                                  f"puts in {where!r}")
                    self.specs[name] = ckpt.spec(name)
                self.tensors[shard] = names
                self.metas[shard] = ckpt.meta
                self.extra[shard] = ckpt.extra_metadata
        missing = [n for n, s in weight_map.items() if n not in self.specs]
        if missing:
            name = sorted(missing, key=natural_key)[0]
            raise bad(f"the weight_map puts tensor {name!r} in shard {weight_map[name]!r}, "
                      f"which does not hold it")

    def shard_path(self, shard: str) -> str:
        return os.path.join(self.folder, shard)


# -- the output folder -----------------------------------------------------------------

class OutputFolder:
    """OUT of a sharded run: checked (and created if missing) at once, written all or nothing.

    ``staged(shard)`` is the path a shard is written to (hidden, named after
    the run); :meth:`commit` puts every staged shard in its place and writes
    the index; :meth:`remove_own` removes every file the run made (and OUT if
    the run created it), what is left after a failure being OUT as it was.

    >>> import tempfile
    >>> class Src:  # what OutputFolder reads of a ShardedCheckpoint
    ...     folder, index_name, metadata = "/nonexistent", "m.safetensors.index.json", {}
    >>> out = OutputFolder(os.path.join(tempfile.mkdtemp(), "out"), Src())
    >>> os.path.basename(out.staged("a.safetensors")) == f".gpuq-{out.run}.a.safetensors"
    True
    >>> out.remove_own(); os.path.exists(out.path)
    False
    """

    def __init__(self, path: str, src):
        self.path, self.src = path, src
        #: Names this run's files: staged shards and their temporary files carry it.
        self.run = secrets.token_hex(6)
        self.created = _prepare(path, src)

    def staged(self, shard: str) -> str:
        return os.path.join(os.path.abspath(self.path), f".gpuq-{self.run}.{shard}")

    def commit(self, shard_entries: dict) -> str:
        """Put the staged shards in place and write the index from ``{shard: {name: nbytes}}``.

        The earlier run's index goes first and the new one last, so an index in OUT never
        names a shard that is not this run's; SIGINT/SIGTERM wait for the end.
        """
        with held_signals():
            self.put_in_place([self.src.index_name], shard_entries)
            index = write_index(self.path, self.src, shard_entries)
            complete(self.path)
        return index

    def put_in_place(self, stale, staged) -> None:
        """Remove the ``stale`` files of OUT (an earlier run's), then rename each ``staged``
        name into place; for a commit, with the signals held. A folder where a staged file goes
        is refused before anything is removed: OUT keeps its earlier model whole."""
        refuse_folders_in_the_way(self.path, staged)
        try:
            for name in stale:
                path = os.path.join(self.path, name)
                if os.path.lexists(path):
                    os.unlink(path)
            for name in staged:
                os.replace(self.staged(name), os.path.join(self.path, name))
        except OSError as exc:
            raise CliError(f"cannot write OUT {self.path!r}: {_one_line(exc)}") from exc

    def remove_own(self) -> None:
        """Remove every file of this run left in OUT (a staged shard, a temporary file that a
        stopped or killed writer left), and OUT itself if the run made it and it is empty."""
        with contextlib.suppress(OSError):
            for f in os.listdir(self.path):
                if f.startswith(".") and f".gpuq-{self.run}." in f:
                    _remove(os.path.join(self.path, f))
        if self.created:
            with contextlib.suppress(OSError):
                os.rmdir(self.path)


def _prepare(out: str, src) -> bool:
    """Check OUT (a folder), create it if missing; True if created here."""
    return prepare_folder(out, src.folder, f"for a sharded IN (its shards and {src.index_name} go there)",
                          "a sharded IN needs a folder")


def refuse_folders_in_the_way(out: str, names) -> None:
    """A CliError if one of ``names``, files this run puts into OUT, is a folder there (the
    rename onto it would fail halfway through a commit).

    >>> import tempfile
    >>> out = tempfile.mkdtemp(); os.mkdir(os.path.join(out, "model.safetensors"))
    >>> refuse_folders_in_the_way(out, ["config.json", "model.safetensors"])
    Traceback (most recent call last):
    ...
    gpuq.checkpoints.files.CliError: cannot write OUT '...': 'model.safetensors' there is a folder, and this run writes a file of that name; remove it or write to a new folder
    """
    for name in sorted(names):
        path = os.path.join(out, name)
        if os.path.isdir(path) and not os.path.islink(path):
            raise CliError(f"cannot write OUT {out!r}: {name!r} there is a folder, and this run "
                           f"writes a file of that name; remove it or write to a new folder")


def prepare_folder(out: str, in_folder: str, what: str, why: str) -> bool:
    """Check an OUT folder (not a file name, not IN's folder ``in_folder``, its parent there,
    writable), create it if missing; True if created here. ``what`` and ``why`` word the
    errors: "OUT must be a folder {what}", "it is a file; {why}".

    >>> import tempfile
    >>> prepare_folder(os.path.join(tempfile.mkdtemp(), "o.json"), "/in", "for x", "x needs a folder")
    Traceback (most recent call last):
    ...
    gpuq.checkpoints.files.CliError: OUT '...o.json' must be a folder for x, not a file name
    """
    if os.path.splitext(out)[1].lower() in (".safetensors", ".npz", ".npy", ".json"):
        raise CliError(f"OUT {out!r} must be a folder {what}, not a file name")
    if os.path.exists(out) and not os.path.isdir(out):
        raise CliError(f"cannot write OUT {out!r}: it is a file; {why}")
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        raise CliError(f"cannot write OUT {out!r}: directory {parent!r} does not exist")
    if os.path.isdir(out):
        if os.path.samefile(out, in_folder):
            raise CliError(f"OUT {out!r} is the input folder; write to a new folder")
        if not os.access(out, os.W_OK | os.X_OK):
            raise CliError(f"cannot write OUT {out!r}: the folder is not writable")
        return False
    try:
        os.mkdir(out)
    except OSError as exc:
        raise CliError(f"cannot write OUT {out!r}: {_one_line(exc)}") from exc
    return True


def write_index(out: str, src: ShardedCheckpoint, shard_entries: dict) -> str:
    """Write OUT's index (atomically) from ``{shard: {name: nbytes}}``; return its path.

    The metadata is IN's, with ``total_size`` (bytes) and, where IN's has it,
    ``total_parameters`` (elements of the stored tensors, from the shards in OUT) recomputed.
    """
    weight_map, total = {}, 0
    for shard, entries in shard_entries.items():
        for name, nbytes in entries.items():
            weight_map[name] = shard
            total += nbytes
    metadata = {**src.metadata, "total_size": total}
    if "total_parameters" in metadata:
        metadata["total_parameters"] = _stored_elements(out, shard_entries)
    index = {"metadata": metadata,
             "weight_map": {n: weight_map[n] for n in sorted(weight_map)}}
    path = os.path.join(out, src.index_name)
    with atomic_output(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(index, indent=2, ensure_ascii=False) + "\n")
    return path


def _stored_elements(out: str, shard_entries: dict) -> int:
    """How many elements the tensors of OUT's shards (named by ``shard_entries``) hold."""
    count = 0
    for shard in shard_entries:
        with Checkpoint(os.path.join(out, shard)) as ckpt:
            count += sum(math.prod(ckpt.spec(n)[0]) for n in ckpt.names)
    return count


def output_shard_entries(path: str) -> dict:
    """``{name: nbytes}`` of a written shard (its header only)."""
    with Checkpoint(path) as ckpt:
        return {n: ckpt.nbytes(n) for n in ckpt.names}


# -- one shard: the same work here and on a worker ---------------------------------------

def shard_job(src: ShardedCheckpoint, shard: str, out: OutputFolder, command: str,
              **options) -> dict:
    """What a shard task needs: plain values only (it is pickled to the worker)."""
    return {"command": command, "in_path": os.path.abspath(src.shard_path(shard)),
            "out_path": out.staged(shard), "shard": shard, **options}


def run_shard(job: dict, device=None, tick=None) -> dict:
    """Convert one shard as ``job`` says; return ``{"rows", "warnings", "entries", "device"}``.

    ``device`` is picked here from ``job["device"]`` when not given (on a
    worker: that worker's GPU under ``auto``). A user error raises CliError.
    """
    from .convert import check_quantized, dequantize_file, quantize_file
    from .env import pick_device

    device = device or pick_device(job["device"])
    warnings = []
    with Checkpoint(job["in_path"]) as ckpt:
        if job["command"] == "quantize":
            schemes = {n: job["schemes"][n] for n in ckpt.names if n in job["schemes"]}
            rows = quantize_file(ckpt, job["out_path"], "safetensors", schemes, device=device,
                                 nonfinite=job["nonfinite"], warn=warnings.append, tick=tick,
                                 calibrate=job.get("calibrate", "minmax"))
        else:
            schemes = check_quantized(ckpt)
            rows = dequantize_file(ckpt, job["out_path"], "safetensors", schemes,
                                   dtype=job["dtype"], device=device, tick=tick,
                                   nonfinite=job.get("nonfinite", "warn"), warn=warnings.append)
    return {"rows": rows, "warnings": warnings, "device": device.name,
            "entries": output_shard_entries(job["out_path"])}
