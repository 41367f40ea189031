"""The gpuq quantized-file format: what ``gpuq quantize`` writes and ``gpuq dequantize`` accepts.

Format version 1 (every gpuq so far). For each quantized tensor ``NAME``:

==================  ================================================================
entry               contents
==================  ================================================================
``NAME``            the int8/uint8 codes, same shape as the source tensor
``NAME.scales``     float32 scales, shaped as :func:`gpuq.quantize` takes them
                    (per-tensor ``()`` in an .npz and ``(1,)`` in a .safetensors
                    file, as version 1 wrote them; per-channel ``(shape[k],)``;
                    per-group ``shape`` with dim k -> ceil(n / g))
``NAME.zps``        zero points, same shape, in the code dtype (int8/uint8, as
                    ONNX stores them); ABSENT for symmetric int8 (zero point
                    0, the library's ``zps=None``) and present otherwise
==================  ================================================================

plus the gpuq metadata (safetensors metadata key ``"gpuq"``, .npz member
``__gpuq__``), JSON::

    {"format_version": 1, "source_format": "safetensors",
     "tensors": {"NAME": {"dtype": "int8", "symmetric": false, "axis": 0,
                          "group_size": null, "source_dtype": "bfloat16"}, ...}}

Every other tensor is copied bit for bit. Nothing in a file is trusted:
:func:`check_file` holds each quantized tensor and its companions to the
metadata (code dtype, scales and zero-point dtypes and shapes for the recorded
scheme, presence or absence of the zero points) and refuses a format version
it does not know, before any output is written. ``tests/data/format_v1/`` holds
files written by the first version; every later gpuq must read them with the
same values.
"""

from __future__ import annotations

import numpy as np

from .files import CliError

#: The version this gpuq writes.
FORMAT_VERSION = 1
#: The versions this gpuq reads.
KNOWN_VERSIONS = (1,)
CODE_DTYPES = ("int8", "uint8")
_SCHEME_KEYS = {"dtype", "symmetric", "axis", "group_size", "source_dtype"}


def param_shape(shape: tuple, axis, group_size) -> tuple:
    """The shape of the scales (and zero points) of a tensor of ``shape``.

    >>> param_shape((4, 10), None, None), param_shape((4, 10), 1, None), param_shape((4, 10), 1, 3)
    ((), (10,), (4, 4))
    """
    if axis is None:
        return ()
    if group_size is None:
        return (shape[axis],)
    return tuple(-(-d // group_size) if i == axis else d for i, d in enumerate(shape))


def has_zps(scheme: dict) -> bool:
    """Whether ``NAME.zps`` is stored: always, except for symmetric int8 (zero point 0).

    >>> has_zps({"dtype": "int8", "symmetric": True}), has_zps({"dtype": "uint8", "symmetric": True})
    (False, True)
    """
    return not (scheme["symmetric"] and scheme["dtype"] == "int8")


def output_entries(name: str, shape: tuple, scheme: dict, fmt: str) -> dict:
    """The entries (name -> (shape, dtype)) that quantizing tensor ``name`` writes in ``fmt``.

    >>> output_entries("w", (4, 10), {"dtype": "uint8", "symmetric": False, "axis": 0,
    ...                               "group_size": None}, "npz")  # doctest: +NORMALIZE_WHITESPACE
    {'w': ((4, 10), dtype('uint8')), 'w.scales': ((4,), dtype('float32')),
     'w.zps': ((4,), dtype('uint8'))}
    """
    code = np.dtype(scheme["dtype"])
    pshape = param_shape(shape, scheme["axis"], scheme["group_size"])
    if pshape == () and fmt == "safetensors":
        pshape = (1,)  # what version 1 wrote (its writer made 0-d arrays 1-d): same bytes
    out = {name: (tuple(shape), code), name + ".scales": (pshape, np.dtype(np.float32))}
    if has_zps(scheme):
        out[name + ".zps"] = (pshape, code)
    return out


def file_meta(schemes: dict, source_dtypes: dict, source_format: str) -> dict:
    """The gpuq metadata of a quantized file (the current format version).

    >>> file_meta({"w": {"dtype": "int8", "symmetric": True, "axis": 0, "group_size": None}},
    ...           {"w": "float32"}, "npz")["format_version"]
    1
    """
    return {"format_version": FORMAT_VERSION, "source_format": source_format,
            "tensors": {n: {**s, "source_dtype": source_dtypes[n]} for n, s in schemes.items()}}


def check_file(ckpt) -> dict:
    """Check a gpuq-quantized checkpoint against its metadata; return ``{name: scheme}``.

    Raises :class:`CliError` (one line, naming the file and the tensor) for a
    format version this gpuq does not know, a malformed scheme, a missing or
    mistyped tensor, scales or zero points of the wrong shape, or zero points
    present where the scheme has none / absent where it needs them.
    """
    path, meta = ckpt.path, ckpt.meta

    def bad(why):
        return CliError(f"cannot read IN {path!r}: {why}")

    version = meta.get("format_version")
    if not _is_int(version) or version < 1:
        raise bad(f"its gpuq metadata is not valid: format_version is {version!r}, "
                  f"expected {FORMAT_VERSION}")
    if version not in KNOWN_VERSIONS:
        raise bad(f"it was written in gpuq file format version {version}, newer than this "
                  f"gpuq reads (version {max(KNOWN_VERSIONS)}); upgrade gpuq to dequantize it")
    names = set(ckpt.names)
    schemes = {}
    for name, scheme in meta["tensors"].items():
        scheme = _check_scheme(name, scheme, bad)
        if name not in names:
            raise bad(f"tensor {name!r} is in the gpuq metadata but not in the file")
        shape = ckpt.spec(name)[0]
        if scheme["axis"] is not None and scheme["axis"] >= len(shape):
            raise bad(f"tensor {name!r}: the gpuq metadata says axis {scheme['axis']}, but "
                      f"the codes have shape {list(shape)}")
        wanted = output_entries(name, shape, scheme, ckpt.format)
        if scheme["axis"] is None and name + ".scales" in names:
            # Per-tensor: () or (1,) (version 1 wrote both), the zero points as the scales.
            got = tuple(ckpt.spec(name + ".scales")[0])
            for entry in (name + ".scales", name + ".zps"):
                if entry in wanted and got in ((), (1,)):
                    wanted[entry] = (got, wanted[entry][1])
        for entry, (want_shape, want_dtype) in wanted.items():
            what = {name: "codes", name + ".scales": "scales", name + ".zps": "zero points"}[entry]
            if entry not in names:
                raise bad(f"tensor {name!r}: its {what} {entry!r} are missing (the gpuq metadata "
                          f"says {_describe(scheme)})")
            got_shape, got_dtype = ckpt.spec(entry)
            if got_dtype != want_dtype:
                raise bad(f"tensor {name!r}: its {what} {entry!r} are {got_dtype}, but the gpuq "
                          f"metadata says {_describe(scheme)}, which needs {want_dtype}")
            if tuple(got_shape) != want_shape:
                raise bad(f"tensor {name!r}: its {what} {entry!r} have shape {list(got_shape)}, "
                          f"but {_describe(scheme)} of shape {list(shape)} needs "
                          f"{list(want_shape)}")
        if not has_zps(scheme) and name + ".zps" in names:
            raise bad(f"tensor {name!r}: the file has {name + '.zps'!r}, but the gpuq metadata "
                      f"says {_describe(scheme)}, which has no zero points")
        schemes[name] = scheme
    companions = {n + s for n in schemes for s in (".scales", ".zps")}
    for name in schemes:
        if name in companions:
            raise bad(f"tensor {name!r} is listed as quantized but is also the scales or zero "
                      f"points of another tensor")
    return schemes


def _check_scheme(name, scheme, bad) -> dict:
    def invalid(why):
        return bad(f"its gpuq metadata is not valid: tensor {name!r}: {why}")

    if not isinstance(scheme, dict):
        raise invalid(f"the scheme is {scheme!r}, not a table")
    missing = _SCHEME_KEYS - {"source_dtype"} - set(scheme)
    unknown = set(scheme) - _SCHEME_KEYS
    if missing or unknown:
        raise invalid(f"missing keys {sorted(missing)}, unknown keys {sorted(unknown)}")
    dtype, symmetric = scheme["dtype"], scheme["symmetric"]
    axis, group_size = scheme["axis"], scheme["group_size"]
    if dtype not in CODE_DTYPES:
        raise invalid(f"dtype {dtype!r} is not one of {', '.join(CODE_DTYPES)}")
    if not isinstance(symmetric, bool):
        raise invalid(f"symmetric is {symmetric!r}, not true or false")
    if axis is not None and not (_is_int(axis) and axis >= 0):
        raise invalid(f"axis {axis!r} is not null or an integer >= 0")
    if group_size is not None and not (_is_int(group_size) and group_size >= 1 and axis is not None):
        raise invalid(f"group_size {group_size!r} is not null or an integer >= 1 with an axis")
    if "source_dtype" in scheme and not isinstance(scheme["source_dtype"], str):
        raise invalid(f"source_dtype {scheme['source_dtype']!r} is not a dtype name")
    return dict(scheme)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _describe(scheme) -> str:
    if scheme["axis"] is None:
        where = "per-tensor"
    elif scheme["group_size"] is None:
        where = f"axis {scheme['axis']}"
    else:
        where = f"axis {scheme['axis']}, group size {scheme['group_size']}"
    return f"{scheme['dtype']} {'symmetric' if scheme['symmetric'] else 'asymmetric'} {where}"

