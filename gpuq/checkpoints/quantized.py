"""The gpuq quantized-file format: what ``gpuq quantize`` writes and ``gpuq dequantize`` accepts.

For each quantized tensor ``NAME``:

==================  ================================================================
entry               contents
==================  ================================================================
``NAME``            the codes (see "Code storage" below)
``NAME.scales``     float32 scales (version 5: see "Scales" below), shaped as
                    :func:`gpuq.quantize` takes them
                    (per-tensor ``()`` in an .npz and ``(1,)`` in a .safetensors
                    file, as version 1 wrote them; per-channel ``(shape[k],)``;
                    multi-axis ``shape`` projected onto the axes; per-group
                    ``shape`` with dim k -> ceil(n / g))
``NAME.zps``        zero points, same shape: int8 for int8/int4 codes, uint8 for
                    uint8/uint4 codes (one per byte, not packed); ABSENT for
                    symmetric int8/int4 (zero point 0, the library's
                    ``zps=None``) and for fp8 (which has no zero point), present
                    otherwise
``NAME.global_      float32, shape ``(1,)``: NVFP4's global scale (version 5,
scale``             ``"scale_dtype": "float8_e4m3fn"`` only)
==================  ================================================================

plus the gpuq metadata (safetensors metadata key ``"gpuq"``, .npz member
``__gpuq__``), JSON::

    {"format_version": 2, "source_format": "safetensors",
     "tensors": {"NAME": {"dtype": "int4", "symmetric": false, "axis": 1,
                          "group_size": 128, "source_dtype": "bfloat16",
                          "shape": [4096, 4096], "packing": "onnx_nibbles"}, ...}}

``axis`` is null (per-tensor), an axis ``k >= 0`` (per-channel, or per-group
with a ``group_size``), or, from version 3, a list of two or more increasing
axes (the multi-axis scheme, no ``group_size``: ``[0, 1]`` is one scale per
row of an ``[experts, out, in]`` tensor).

Code storage, by code dtype:

=================  ======================================  ====================================
``dtype``          ``NAME`` in a .safetensors file          ``NAME`` in an .npz
=================  ======================================  ====================================
int8, uint8        I8 / U8, the tensor's shape              int8 / uint8, the tensor's shape
int4, uint4        U8, 1-D, ``ceil(n / 2)`` bytes           uint8, the same
float8_e4m3fn      F8_E4M3, the tensor's shape              uint8 (the fp8 bits), the shape
float8_e5m2        F8_E5M2, the tensor's shape              uint8 (the fp8 bits), the shape
float4_e2m1fn      U8, 1-D, ``ceil(n / 2)`` bytes           uint8, the same
float6_e2m3fn,     U8, the tensor's shape (one code a      uint8, the same
float6_e3m2fn      byte, the 6-bit pattern)
=================  ======================================  ====================================

* int4/uint4 are packed two per byte in ONNX's order over the C-order
  flattened tensor (``"packing": "onnx_nibbles"``, the one packing there is):
  element ``2k`` in the low nibble of byte ``k``, ``2k + 1`` in the high
  nibble, int4 as two's complement nibbles; an odd count pads the last high
  nibble with 0. The bytes are :attr:`gpuq.Codes.data`. A 1-D byte string has
  lost the tensor's shape, so the scheme records it (``"shape"``, required for
  int4/uint4 and refused elsewhere). Their zero points lie in the code range
  ([-8, 7] / [0, 15]) and the padding nibble is 0, both checked on reading.
* float4_e2m1fn packs as int4 (the same nibble order, ``"shape"`` and ``"packing"``
  recorded, the padding nibble 0); fp6 has no safetensors type: one byte a code, whose top
  two bits are 0 (checked on reading).
* fp8 is stored in safetensors' own float8 types (``F8_E4M3`` is
  float8_e4m3fn, as torch and the safetensors library read it), so any
  safetensors reader loads the codes as fp8; NumPy's .npy has no fp8 type (an
  ml_dtypes array saves as raw ``V1`` bytes, its type lost), so an .npz holds
  the uint8 bits and the dtype comes from the metadata. fp8 schemes are always
  ``"symmetric": true`` and have no zero points.

Scales (version 5). A scheme of fp4/fp6 codes, or of fp8 codes with MX scales, has two more
keys, the arguments :func:`gpuq.choose_qparams` took: ``"scale_dtype"`` and ``"scale_rule"``.

=====================  ==================  ======================================================
``scale_dtype``        ``scale_rule``      ``NAME.scales``
=====================  ==================  ======================================================
``float32``            null                float32 (fp4/fp6 with ``--scales float32``)
``float8_e8m0fnu``     floor, even, ceil,  U8 e8m0 bytes ``k + 127`` of the scales ``2**k``
                       rceil               (:func:`gpuq.e8m0_bytes`), in both formats
``float8_e4m3fn``      null                NVFP4 (float4_e2m1fn only): the e4m3 block scales,
                                           F8_E4M3 in .safetensors, their uint8 bits in .npz,
                                           and ``NAME.global_scale``
=====================  ==================  ======================================================

The full-range rule of integer codes (``gpuq quantize --scale-rule full``, the int4 default) is
not recorded: it chooses ordinary float32 scales, read as any other (:func:`recorded_scheme`).

Versions. Version 1 (every gpuq before the int4/fp8 codes) knows int8/uint8
only, with exactly the keys dtype, symmetric, axis, group_size, source_dtype.
Version 2 adds int4, uint4, float8_e4m3fn and float8_e5m2. Version 3 adds a
list of axes (the multi-axis scheme: the default for tensors of rank >= 3),
with the same keys. Version 4 adds block scales: ``"block_size"``, one entry
per dimension of the tensor (``axis`` and ``group_size`` null; ``--block
128x128`` records ``[128, 128]``, ``[1, 128, 128]`` for a rank-3 tensor), the
scales of shape ``ceil(shape / block_size)``. Version 5 adds fp4/fp6 codes and the scale keys
above (MX and NVFP4 scales). A file is written in the lowest version that holds it
(:func:`version_for`): int8/uint8 output with one axis per tensor stays
version 1, the same bytes as before, so a gpuq from before version 2 still
reads it; a file with any int4/fp8 tensor is version 2, and one with any
multi-axis tensor version 3 (an older gpuq refuses such files with "upgrade
gpuq" instead of misreading them), one with any block scheme version 4, one with
fp4/fp6 codes or MX/NVFP4 scales version 5. This gpuq reads all five.

Nothing in a file is trusted: :func:`check_file` holds each quantized tensor
and its companions to the metadata (code dtype and the version that allows
it, the storage dtype and shape, the packed length, scales and zero-point
dtypes and shapes for the recorded scheme, presence or absence of the zero
points) and refuses a format version it does not know, before any output is
written; :func:`check_values` checks what needs the data (int4 zero points in
range, the padding nibble, fp6 bytes below 64) as each tensor is read, before it is used (the
output is atomic: an error leaves no file). ``tests/data/format_v1/`` and
``tests/data/format_v2/`` ... ``tests/data/format_v5/`` hold files written by each
version; every later gpuq must read them with the same values.
"""

from __future__ import annotations

import math

import numpy as np

from .._codetypes import CODE_TYPES
from .files import MAX_RANK, CliError
from .scale_rules import MX_RULES, NVFP4_CODE, SCALE_DTYPE, is_small_float

#: The newest version this gpuq writes (a file gets the lowest version that holds it:
#: :func:`version_for`).
FORMAT_VERSION = 5
#: The versions this gpuq reads.
KNOWN_VERSIONS = (1, 2, 3, 4, 5)
#: The first version with a list of axes (the multi-axis scheme).
MULTI_AXIS_VERSION = 3
#: The first version with block scales (``"block_size"``: one entry per dim).
BLOCK_VERSION = 4
#: The first version with fp4/fp6 codes and MX/NVFP4 scales (``"scale_dtype"``, ``"scale_rule"``).
SCALES_VERSION = 5
#: The code dtypes of version 1 files (a fact of the file format; what each code dtype is
#: comes from the code-type table, gpuq._codetypes).
V1_CODE_DTYPES = ("int8", "uint8")
#: The code dtypes the checkpoint files hold, in the table's order: every code dtype (fp4/fp6
#: from version 5).
CODE_DTYPES = tuple(CODE_TYPES)
#: The one packing of int4/uint4 codes (ONNX's nibble order, see the module docstring).
PACKING = "onnx_nibbles"


def is_packed(dtype) -> bool:
    """Whether ``dtype``'s codes are stored two per byte (its row's storage); False for a
    name that is no code dtype.

    >>> is_packed("uint4"), is_packed("int8"), is_packed("int3")
    (True, False, False)
    """
    row = CODE_TYPES.get(dtype) if isinstance(dtype, str) else None
    return row is not None and row.storage == "packed"


def is_float8(dtype) -> bool:
    """Whether ``dtype`` is an fp8 code dtype (its row's codec): stored in safetensors' own
    float8 types, no zero point, always symmetric.

    >>> is_float8("float8_e5m2"), is_float8("int4")
    (True, False)
    """
    row = CODE_TYPES.get(dtype) if isinstance(dtype, str) else None
    return row is not None and row.codec == "float8"


def code_range(dtype) -> tuple:
    """``(qmin, qmax)`` of an integer code dtype (its zero points lie in it too).

    >>> code_range("int4"), code_range("uint8")
    ((-8, 7), (0, 255))
    """
    row = CODE_TYPES[dtype]
    return row.qmin, row.qmax
_SCHEME_KEYS = {"dtype", "symmetric", "axis", "group_size", "source_dtype"}
_PACKED_KEYS = {"shape", "packing"}
_SCALE_KEYS = {"scale_dtype", "scale_rule"}
#: The stored dtype of the scales of each ``scale_dtype`` in an .npz (a .safetensors file stores
#: e4m3 scales as F8_E4M3: :func:`scales_dtype`).
_SCALES_NPZ = {"float32": np.float32, "float8_e8m0fnu": np.uint8, "float8_e4m3fn": np.uint8}


def min_version(dtype: str) -> int:
    """The first format version that holds codes of ``dtype``.

    >>> min_version("uint8"), min_version("int4"), min_version("float8_e5m2"), min_version("float4_e2m1fn")
    (1, 2, 2, 5)
    """
    if is_small_float(dtype):
        return SCALES_VERSION
    return 1 if dtype in V1_CODE_DTYPES else 2


def recorded_scheme(scheme: dict) -> dict:
    """What the file records of ``scheme``: the full-range rule of integer codes is a choice of
    the writer (the scales are ordinary float32 ones, read as any other), so it is left out,
    and the file stays in the version it had before that rule.

    >>> recorded_scheme({"dtype": "int4", "axis": 1, "scale_rule": "full"})
    {'dtype': 'int4', 'axis': 1}
    """
    if "scale_dtype" in scheme:
        return scheme
    return {k: v for k, v in scheme.items() if k != "scale_rule"}


def scheme_version(scheme: dict) -> int:
    """The first format version that holds ``scheme``: its code dtype's, 3 for a list of axes,
    4 for block scales, 5 for fp4/fp6 codes and MX or NVFP4 scales.

    >>> scheme_version({"dtype": "int8", "axis": 0}), scheme_version({"dtype": "int8", "axis": [0, 1]})
    (1, 3)
    >>> scheme_version({"dtype": "float8_e4m3fn", "axis": None, "block_size": [128, 128]})
    4
    >>> scheme_version({"dtype": "float8_e4m3fn", "axis": 1, "scale_dtype": "float8_e8m0fnu"})
    5
    """
    if "scale_dtype" in scheme or is_small_float(scheme["dtype"]):
        return SCALES_VERSION
    if scheme.get("block_size") is not None:
        return BLOCK_VERSION
    if isinstance(scheme.get("axis"), list):
        return MULTI_AXIS_VERSION
    return min_version(scheme["dtype"])


def version_for(schemes: dict) -> int:
    """The version a file with these schemes is written in: the lowest that holds them all.

    >>> version_for({"w": {"dtype": "int8", "axis": 0}}), version_for({})
    (1, 1)
    >>> version_for({"w": {"dtype": "int4", "axis": 1}}), version_for({"w": {"dtype": "uint8", "axis": [0, 1]}})
    (2, 3)
    """
    return max([1] + [scheme_version(s) for s in schemes.values()])


def api_axis(scheme: dict):
    """The scheme's ``axis`` as :func:`gpuq.quantize` takes it: a tuple for a list of axes.

    >>> api_axis({"axis": [0, 1]}), api_axis({"axis": 1}), api_axis({"axis": None})
    ((0, 1), 1, None)
    """
    axis = scheme["axis"]
    return tuple(axis) if isinstance(axis, list) else axis


def scheme_kw(scheme: dict) -> dict:
    """The granularity keywords of :func:`gpuq.quantize` (and the others) for ``scheme``.

    >>> scheme_kw({"axis": 1, "group_size": 128})
    {'axis': 1, 'group_size': 128, 'block_size': None}
    >>> scheme_kw({"axis": None, "group_size": None, "block_size": [1, 128, 128]})["block_size"]
    (1, 128, 128)
    """
    block = scheme.get("block_size")
    return {"axis": api_axis(scheme), "group_size": scheme["group_size"],
            "block_size": None if block is None else tuple(block)}


def scheme_for(dtype: str, symmetric: bool, axis, group_size, shape, block_size=None) -> dict:
    """The scheme of one tensor of ``shape`` (``axis`` already in ``[0, rank)``, or a list of
    such axes).

    fp8 is always symmetric (it has no zero point); int4/uint4 record the
    logical shape and the packing, which the packed bytes cannot hold.

    >>> scheme_for("int4", False, 1, 128, (4, 256))  # doctest: +NORMALIZE_WHITESPACE
    {'dtype': 'int4', 'symmetric': False, 'axis': 1, 'group_size': 128, 'shape': [4, 256],
     'packing': 'onnx_nibbles'}
    >>> scheme_for("float8_e4m3fn", False, 0, None, (4, 256))["symmetric"]
    True
    """
    scheme = {"dtype": dtype, "symmetric": bool(symmetric) or is_float8(dtype),
              "axis": axis, "group_size": group_size}
    if block_size is not None:  # version 4: blocks of any shape, one entry per dim
        scheme["block_size"] = [int(b) for b in block_size]
    if is_packed(dtype):
        scheme.update(shape=[int(d) for d in shape], packing=PACKING)
    return scheme


def param_shape(shape: tuple, axis, group_size, block_size=None) -> tuple:
    """The shape of the scales (and zero points) of a tensor of ``shape``.

    >>> param_shape((4, 10), None, None), param_shape((4, 10), 1, None), param_shape((4, 10), 1, 3)
    ((), (10,), (4, 4))
    >>> param_shape((2, 4, 10), [0, 1], None), param_shape((300, 200), None, None, [128, 128])
    ((2, 4), (3, 2))
    """
    if block_size is not None:
        return tuple(-(-d // (d if b == -1 or b >= d else b)) if d else 0
                     for d, b in zip(shape, block_size))
    if axis is None:
        return ()
    if isinstance(axis, list):
        return tuple(shape[k] for k in axis)
    if group_size is None:
        return (shape[axis],)
    return tuple(-(-d // group_size) if i == axis else d for i, d in enumerate(shape))


def has_zps(scheme: dict) -> bool:
    """Whether ``NAME.zps`` is stored: not for symmetric int8/int4 (zero point 0) nor fp8.

    >>> has_zps({"dtype": "int8", "symmetric": True}), has_zps({"dtype": "uint8", "symmetric": True})
    (False, True)
    >>> has_zps({"dtype": "int4", "symmetric": False}), has_zps({"dtype": "float8_e5m2", "symmetric": True})
    (True, False)
    """
    row = CODE_TYPES[scheme["dtype"]]
    if row.zero_point == "none":
        return False
    return not (scheme["symmetric"] and row.symmetric_zp == 0)


def zps_dtype(dtype: str) -> np.dtype:
    """The stored dtype of the zero points of ``dtype`` codes (one per byte, never packed).

    >>> zps_dtype("int4"), zps_dtype("uint4")
    (dtype('int8'), dtype('uint8'))
    """
    return np.dtype(np.int8 if CODE_TYPES[dtype].signed else np.uint8)


def codes_dtype(dtype: str, fmt: str) -> np.dtype:
    """The stored dtype of ``dtype`` codes in a file of format ``fmt`` (fp6: one code per byte,
    U8, as safetensors has no fp6 type).

    >>> codes_dtype("int4", "safetensors"), codes_dtype("float8_e4m3fn", "npz"), codes_dtype("float6_e2m3fn", "safetensors")
    (dtype('uint8'), dtype('uint8'), dtype('uint8'))
    >>> codes_dtype("float8_e4m3fn", "safetensors").name
    'float8_e4m3fn'
    """
    if dtype in V1_CODE_DTYPES:
        return np.dtype(dtype)
    if is_float8(dtype) and not is_small_float(dtype) and fmt == "safetensors":
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, dtype))
    return np.dtype(np.uint8)


def scales_dtype(scheme: dict, fmt: str) -> np.dtype:
    """The stored dtype of a scheme's scales: float32; e8m0 bytes (uint8) for MX scales; NVFP4's
    e4m3 block scales as F8_E4M3 in a .safetensors file, their uint8 bits in an .npz.

    >>> scales_dtype({"dtype": "int8"}, "npz"), scales_dtype({"scale_dtype": "float8_e8m0fnu"}, "safetensors")
    (dtype('float32'), dtype('uint8'))
    >>> scales_dtype({"scale_dtype": "float8_e4m3fn"}, "safetensors").name
    'float8_e4m3fn'
    """
    sdt = scheme.get("scale_dtype", "float32")
    if sdt == SCALE_DTYPE["nvfp4"] and fmt == "safetensors":
        import ml_dtypes

        return np.dtype(ml_dtypes.float8_e4m3fn)
    return np.dtype(_SCALES_NPZ[sdt])


def has_global_scale(scheme: dict) -> bool:
    """Whether ``NAME.global_scale`` (float32, shape ``(1,)``) is stored: NVFP4's scales.

    >>> has_global_scale({"scale_dtype": "float8_e4m3fn"}), has_global_scale({"dtype": "int8"})
    (True, False)
    """
    return scheme.get("scale_dtype") == SCALE_DTYPE["nvfp4"]


def param_suffixes(scheme: dict) -> tuple:
    """The suffixes of the entries stored beside a tensor's codes (some may be absent).

    >>> param_suffixes({"dtype": "int8"}), param_suffixes({"scale_dtype": "float8_e4m3fn"})
    (('.scales', '.zps'), ('.scales', '.zps', '.global_scale'))
    """
    return (".scales", ".zps") + ((".global_scale",) if has_global_scale(scheme) else ())


def companion_names(schemes: dict) -> set:
    """Every stored parameter entry of the quantized tensors ``schemes`` (name -> scheme)."""
    return {n + s for n, sc in schemes.items() for s in param_suffixes(sc)}


def stored_scales(scales, scheme: dict, fmt: str, global_scale=None) -> dict:
    """The parameter entries (suffix -> array) of host float32 ``scales`` as the file stores them:
    float32 as they are; MX's as e8m0 bytes (:func:`gpuq.e8m0_bytes`); NVFP4's e4m3 values as
    F8_E4M3 (their uint8 bits in an .npz) with ``global_scale`` beside them.

    >>> stored_scales(np.float32([0.25, 4.0]), {"scale_dtype": "float8_e8m0fnu"}, "npz")
    {'.scales': array([125, 129], dtype=uint8)}
    """
    import gpuq

    sdt = scheme.get("scale_dtype", "float32")
    if sdt == SCALE_DTYPE["mx"]:
        return {".scales": gpuq.e8m0_bytes(scales)}
    if sdt == SCALE_DTYPE["nvfp4"]:
        import ml_dtypes

        bits = scales.astype(ml_dtypes.float8_e4m3fn)  # exact: the scales hold e4m3 values
        return {".scales": bits if fmt == "safetensors" else bits.view(np.uint8),
                ".global_scale": np.float32(global_scale).reshape(1)}
    return {".scales": scales}


def api_scales(stored, scheme: dict, global_scale=None) -> tuple:
    """``(scales, keywords)`` for :func:`gpuq.dequantize` from the stored scales (and NVFP4's
    stored global scale): float32 scales, and ``global_scale`` where the scheme has one.

    >>> api_scales(np.uint8([125, 129]), {"scale_dtype": "float8_e8m0fnu"})
    (array([0.25, 4.  ], dtype=float32), {})
    """
    import gpuq

    sdt = scheme.get("scale_dtype", "float32")
    if sdt == SCALE_DTYPE["mx"]:
        return gpuq.e8m0_scales(stored), {}
    if sdt == SCALE_DTYPE["nvfp4"]:
        import ml_dtypes

        s = np.asarray(stored).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
        return s, {"global_scale": np.asarray(global_scale).reshape(())[()]}
    return stored, {}


def codes_shape(dtype: str, shape) -> tuple:
    """The stored shape of the codes of a tensor of ``shape``: 1-D ``ceil(n / 2)`` bytes for
    int4/uint4, the shape itself otherwise.

    >>> codes_shape("int4", (3, 5)), codes_shape("int8", (3, 5))
    ((8,), (3, 5))
    """
    if is_packed(dtype):
        return ((math.prod(shape) + 1) // 2,)
    return tuple(shape)


def logical_shape(name: str, scheme: dict, ckpt) -> tuple:
    """The shape of the tensor ``name`` stands for: the recorded one for packed codes."""
    if is_packed(scheme["dtype"]):
        return tuple(scheme["shape"])
    return tuple(ckpt.spec(name)[0])


def output_entries(name: str, shape: tuple, scheme: dict, fmt: str) -> dict:
    """The entries (name -> (shape, dtype)) that quantizing tensor ``name`` of ``shape`` writes
    in ``fmt``.

    >>> output_entries("w", (4, 10), {"dtype": "uint8", "symmetric": False, "axis": 0,
    ...                               "group_size": None}, "npz")  # doctest: +NORMALIZE_WHITESPACE
    {'w': ((4, 10), dtype('uint8')), 'w.scales': ((4,), dtype('float32')),
     'w.zps': ((4,), dtype('uint8'))}
    >>> output_entries("w", (3, 5), {"dtype": "int4", "symmetric": True, "axis": 1,
    ...                              "group_size": 2}, "npz")  # doctest: +NORMALIZE_WHITESPACE
    {'w': ((8,), dtype('uint8')), 'w.scales': ((3, 3), dtype('float32'))}
    """
    dtype = scheme["dtype"]
    pshape = param_shape(shape, scheme["axis"], scheme["group_size"], scheme.get("block_size"))
    if pshape == () and fmt == "safetensors":
        pshape = (1,)  # what version 1 wrote (its writer made 0-d arrays 1-d): same bytes
    out = {name: (codes_shape(dtype, shape), codes_dtype(dtype, fmt)),
           name + ".scales": (pshape, scales_dtype(scheme, fmt))}
    if has_zps(scheme):
        out[name + ".zps"] = (pshape, zps_dtype(dtype))
    if has_global_scale(scheme):
        out[name + ".global_scale"] = ((1,), np.dtype(np.float32))
    return out


def file_meta(schemes: dict, source_dtypes: dict, source_format: str) -> dict:
    """The gpuq metadata of a quantized file, in the lowest version that holds ``schemes``.

    >>> file_meta({"w": {"dtype": "int8", "symmetric": True, "axis": 0, "group_size": None}},
    ...           {"w": "float32"}, "npz")["format_version"]
    1
    """
    schemes = {n: recorded_scheme(s) for n, s in schemes.items()}
    return {"format_version": version_for(schemes), "source_format": source_format,
            "tensors": {n: {**s, "source_dtype": source_dtypes[n]} for n, s in schemes.items()}}


def check_file(ckpt) -> dict:
    """Check a gpuq-quantized checkpoint against its metadata; return ``{name: scheme}``.

    Raises :class:`CliError` (one line, naming the file and the tensor) for a
    format version this gpuq does not know, a malformed scheme (a code dtype
    the file's version does not have among them), a missing or mistyped
    tensor, packed codes of the wrong length, scales or zero points of the
    wrong shape, or zero points present where the scheme has none / absent
    where it needs them.
    """
    path, meta = ckpt.path, ckpt.meta

    def bad(why):
        return CliError(f"cannot read IN {path!r}: {why}")

    version = meta.get("format_version")
    if not _is_int(version) or version < 1:
        raise bad(f"its gpuq metadata is not valid: format_version is {version!r}, "
                  f"expected {', '.join(map(str, KNOWN_VERSIONS[:-1]))} or {KNOWN_VERSIONS[-1]}")
    if version not in KNOWN_VERSIONS:
        raise bad(f"it was written in gpuq file format version {version}, newer than this "
                  f"gpuq reads (version {max(KNOWN_VERSIONS)}); upgrade gpuq to dequantize it")
    names = set(ckpt.names)
    schemes = {}
    for name, scheme in meta["tensors"].items():
        scheme = _check_scheme(name, scheme, version, bad)
        if name not in names:
            raise bad(f"tensor {name!r} is in the gpuq metadata but not in the file")
        shape = logical_shape(name, scheme, ckpt)
        axes = scheme["axis"] if isinstance(scheme["axis"], list) else [scheme["axis"]]
        if scheme["axis"] is not None and max(axes) >= len(shape):
            what = "the tensor has" if is_packed(scheme["dtype"]) else "the codes have"
            raise bad(f"tensor {name!r}: the gpuq metadata says axis {scheme['axis']}, but "
                      f"{what} shape {list(shape)}")
        block = scheme.get("block_size")
        if block is not None and len(block) != len(shape):
            what = "the tensor has" if is_packed(scheme["dtype"]) else "the codes have"
            raise bad(f"tensor {name!r}: the gpuq metadata says block_size {block}, one entry "
                      f"per dim, but {what} shape {list(shape)}")
        wanted = output_entries(name, shape, scheme, ckpt.format)
        if scheme["axis"] is None and name + ".scales" in names:
            # Per-tensor: () or (1,) (version 1 wrote both), the zero points as the scales.
            got = tuple(ckpt.spec(name + ".scales")[0])
            for entry in (name + ".scales", name + ".zps"):
                if entry in wanted and got in ((), (1,)):
                    wanted[entry] = (got, wanted[entry][1])
        for entry, (want_shape, want_dtype) in wanted.items():
            what = {name: "codes", name + ".scales": "scales", name + ".zps": "zero points",
                    name + ".global_scale": "global scale"}[entry]
            if entry not in names:
                raise bad(f"tensor {name!r}: its {what} {entry!r} are missing (the gpuq metadata "
                          f"says {_describe(scheme)})")
            got_shape, got_dtype = ckpt.spec(entry)
            if got_dtype != want_dtype:
                raise bad(f"tensor {name!r}: its {what} {entry!r} are {_dtype_text(got_dtype)}, "
                          f"but the gpuq metadata says {_describe(scheme)}, which needs "
                          f"{_dtype_text(want_dtype)}{_storage_hint(scheme, entry == name)}")
            if tuple(got_shape) != want_shape:
                if entry == name and is_packed(scheme["dtype"]):
                    raise bad(f"tensor {name!r}: its packed codes {entry!r} have shape "
                              f"{list(got_shape)}, but {scheme['dtype']} codes of shape "
                              f"{list(shape)} pack into {want_shape[0]} bytes (1-D, "
                              f"ceil({math.prod(shape)} / 2))")
                raise bad(f"tensor {name!r}: its {what} {entry!r} have shape {list(got_shape)}, "
                          f"but {_describe(scheme)} of shape {list(shape)} needs "
                          f"{list(want_shape)}")
        if not has_zps(scheme) and name + ".zps" in names:
            why = ((f"{scheme['dtype']} codes have no zero point" if is_small_float(scheme["dtype"])
                    else "fp8 codes have no zero point") if is_float8(scheme["dtype"])
                   else "which has no zero points")
            raise bad(f"tensor {name!r}: the file has {name + '.zps'!r}, but the gpuq metadata "
                      f"says {_describe(scheme)}, {why}")
        if "scale_dtype" in scheme and not has_global_scale(scheme) and name + ".global_scale" in names:
            raise bad(f"tensor {name!r}: the file has {name + '.global_scale'!r}, but the gpuq metadata "
                      f"says {_describe(scheme)} with scale_dtype {scheme['scale_dtype']}, which has no "
                      f"global scale")
        schemes[name] = scheme
    companions = companion_names(schemes)
    for name in schemes:
        if name in companions:
            raise bad(f"tensor {name!r} is listed as quantized but is also the scales or zero "
                      f"points of another tensor")
    return schemes


def check_values(path: str, name: str, scheme: dict, codes, zps) -> None:
    """What :func:`check_file` cannot see without the data, for one tensor as it is read:
    int4/uint4 zero points in the code range, and the padding nibble of an odd count 0.

    ``codes`` are the stored codes (host), ``zps`` the stored zero points or None.

    >>> check_values("f", "w", {"dtype": "int4", "shape": [3]}, np.array([0x21, 0x13], np.uint8),
    ...              None)
    Traceback (most recent call last):
    ...
    gpuq.checkpoints.files.CliError: cannot read IN 'f': tensor 'w': the high nibble of its last byte pads an odd count of int4 codes (3) and must be 0, but it is 1: damaged or not written by gpuq
    """
    dtype = scheme["dtype"]
    if is_small_float(dtype) and not is_packed(dtype):
        # fp6 codes are one per byte: the top two bits are no code's
        if codes.size and int(codes.view(np.uint8).max()) >= 64:
            raise CliError(f"cannot read IN {path!r}: tensor {name!r}: its {dtype} codes hold a byte "
                           f"{int(codes.view(np.uint8).max()):#04x}, beyond the 6-bit codes (0x00-0x3f): "
                           f"damaged or not written by gpuq")
        return
    if not is_packed(dtype):
        return
    if not is_float8(dtype):
        _check_zps_range(path, name, dtype, zps)
    n = math.prod(scheme["shape"])
    if n % 2 and codes.size and int(codes[-1]) >> 4:
        raise CliError(f"cannot read IN {path!r}: tensor {name!r}: the high nibble of its last "
                       f"byte pads an odd count of {dtype} codes ({n}) and must be 0, but it is "
                       f"{int(codes[-1]) >> 4}: damaged or not written by gpuq")


def _check_zps_range(path, name, dtype, zps) -> None:
    lo, hi = code_range(dtype)
    if zps is not None and zps.size and (int(zps.min()) < lo or int(zps.max()) > hi):
        raise CliError(f"cannot read IN {path!r}: tensor {name!r}: its zero points "
                       f"{name + '.zps'!r} lie in [{int(zps.min())}, {int(zps.max())}], "
                       f"outside the {dtype} range [{lo}, {hi}]")


def _check_scale_keys(dtype, scheme, version, invalid) -> None:
    """The scale keys of version 5: required for fp4/fp6 codes, allowed on fp8 ones (MX scales),
    ``scale_rule`` one that ``scale_dtype`` takes."""
    sdt, rule = scheme["scale_dtype"], scheme["scale_rule"]
    if version < SCALES_VERSION:
        raise invalid(f"scale_dtype {sdt!r} needs format version {SCALES_VERSION}, but the file says "
                      f"version {version}")
    if sdt not in SCALE_DTYPE.values():
        raise invalid(f"scale_dtype {sdt!r} is not one of {', '.join(SCALE_DTYPE.values())}")
    if sdt == SCALE_DTYPE["mx"]:
        if rule not in MX_RULES:
            raise invalid(f"scale_rule {rule!r} is not one of {', '.join(MX_RULES)} (MX scales)")
    elif rule is not None:
        raise invalid(f"scale_rule {rule!r} with scale_dtype {sdt!r}: only MX scales have a rule")
    if sdt == SCALE_DTYPE["nvfp4"] and dtype != NVFP4_CODE:
        raise invalid(f"scale_dtype {sdt!r} (NVFP4) goes with {NVFP4_CODE} codes, got {dtype}")


def _check_scheme(name, scheme, version, bad) -> dict:
    def invalid(why):
        return bad(f"its gpuq metadata is not valid: tensor {name!r}: {why}")

    if not isinstance(scheme, dict):
        raise invalid(f"the scheme is {scheme!r}, not a table")
    dtype = scheme.get("dtype")
    if not isinstance(dtype, str) or dtype not in CODE_DTYPES:
        raise invalid(f"dtype {dtype!r} is not one of {', '.join(CODE_DTYPES)}")
    if min_version(dtype) > version:
        raise invalid(f"dtype {dtype!r} needs format version {min_version(dtype)}, but the "
                      f"file says version {version} (whose code dtypes are "
                      f"{', '.join(V1_CODE_DTYPES)})")
    keys = _SCHEME_KEYS | (_PACKED_KEYS if is_packed(dtype) else set())
    if "block_size" in scheme:
        keys = keys | {"block_size"}
    if is_small_float(dtype) or (is_float8(dtype) and _SCALE_KEYS & set(scheme)):
        keys = keys | _SCALE_KEYS
    missing = keys - {"source_dtype"} - set(scheme)
    unknown = set(scheme) - keys
    if missing or unknown:
        what = [f"{word} {', '.join(map(repr, sorted(found)))}"
                for word, found in (("missing keys", missing), ("unknown keys", unknown)) if found]
        raise invalid(f"{' and '.join(what)} for {dtype} codes (expected "
                      f"{', '.join(sorted(keys))})")
    symmetric = scheme["symmetric"]
    axis, group_size = scheme["axis"], scheme["group_size"]
    if not isinstance(symmetric, bool):
        raise invalid(f"symmetric is {symmetric!r}, not true or false")
    if is_float8(dtype) and not symmetric:
        raise invalid(f"symmetric is false, but {dtype} codes have no zero point (always "
                      f"symmetric)")
    if isinstance(axis, list):
        if not (len(axis) >= 2 and all(_is_int(k) and k >= 0 for k in axis)
                and all(a < b for a, b in zip(axis, axis[1:]))):
            raise invalid(f"axis {axis!r} is not a list of two or more increasing integers >= 0")
        if version < MULTI_AXIS_VERSION:
            raise invalid(f"axis {axis!r} (several axes) needs format version "
                          f"{MULTI_AXIS_VERSION}, but the file says version {version}")
        if group_size is not None:
            raise invalid(f"group_size {group_size!r} with several axes {axis!r}: groups run "
                          f"along one axis")
    elif axis is not None and not (_is_int(axis) and axis >= 0):
        raise invalid(f"axis {axis!r} is not null, an integer >= 0 or a list of them")
    if group_size is not None and not (_is_int(group_size) and group_size >= 1 and axis is not None):
        raise invalid(f"group_size {group_size!r} is not null or an integer >= 1 with an axis")
    if "block_size" in scheme:
        block = scheme["block_size"]
        if not (isinstance(block, list) and 1 <= len(block) <= MAX_RANK
                and all(_is_int(b) and (b >= 1 or b == -1) for b in block)):
            raise invalid(f"block_size {block!r} is not a list of integers >= 1 (or -1), one per dim")
        if version < BLOCK_VERSION:
            raise invalid(f"block_size {block!r} needs format version {BLOCK_VERSION}, but the file "
                          f"says version {version}")
        if axis is not None or group_size is not None:
            raise invalid(f"block_size {block!r} with axis {axis!r} / group_size {group_size!r}: "
                          f"a block shape says it alone")
    if _SCALE_KEYS <= keys:
        _check_scale_keys(dtype, scheme, version, invalid)
    if "source_dtype" in scheme and not isinstance(scheme["source_dtype"], str):
        raise invalid(f"source_dtype {scheme['source_dtype']!r} is not a dtype name")
    if is_packed(dtype):
        shape = scheme["shape"]
        if (not isinstance(shape, list) or len(shape) > MAX_RANK
                or not all(_is_int(d) and 0 <= d < 2**63 for d in shape)):
            raise invalid(f"shape {shape!r} is not a list of at most {MAX_RANK} sizes")
        if scheme["packing"] != PACKING:
            raise invalid(f"packing {scheme['packing']!r} is unknown (this gpuq reads "
                          f"{PACKING!r}: ONNX's nibble order)")
    return dict(scheme)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _dtype_text(dt) -> str:
    return dt.name if isinstance(dt, np.dtype) else str(dt)


def _storage_hint(scheme, is_codes) -> str:
    if not is_codes:
        return ""
    if is_packed(scheme["dtype"]):
        return " (packed bytes)"
    if is_float8(scheme["dtype"]):
        return " (fp8: F8_* in .safetensors, the uint8 bits in .npz)"
    return ""


def _describe(scheme) -> str:
    if scheme.get("block_size") is not None:
        where = f"blocks {scheme['block_size']}"
    elif scheme["axis"] is None:
        where = "per-tensor"
    elif isinstance(scheme["axis"], list):
        where = f"axes {scheme['axis']}"
    elif scheme["group_size"] is None:
        where = f"axis {scheme['axis']}"
    else:
        where = f"axis {scheme['axis']}, group size {scheme['group_size']}"
    if is_float8(scheme["dtype"]):
        return f"{scheme['dtype']} {where}"
    return f"{scheme['dtype']} {'symmetric' if scheme['symmetric'] else 'asymmetric'} {where}"
