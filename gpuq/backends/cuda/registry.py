"""The CUDA kernel sources and every instantiation the dispatcher can request (no CuPy).

Both the CUDA backend (which compiles with CuPy) and the NVRTC check (which
compiles with the ``nvidia-cuda-nvrtc`` wheel and no GPU) read this module, so
they compile the same source text with the same options and the same names.

* :func:`kernels_dir`: ``gpuq/kernels`` in an installed wheel, ``<repo>/kernels``
  in a source tree.
* :func:`source_text`: a ``.cu`` file with its local ``#include "x.cuh"`` lines
  expanded in place (so the source string, which is CuPy's on-disk cache key,
  changes whenever a header changes).
* :data:`OPTIONS`: the NVRTC options of the contract.
* :data:`SOURCES`: ``{file name: function returning every name expression}``.
  Another op family registers itself by adding an entry, e.g.
  ``SOURCES["qparams.cu"] = qparams_names``.

>>> quantize_name("float32", "int8", True, "channel")
'gpuq::quantize<float, signed char, float, true, 1>'
>>> len(SOURCES["quantize.cu"]()), len(SOURCES["dequantize.cu"]())
(80, 80)
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path


from ..._codetypes import CODE_TYPES
from ..._dtypes import C_TYPES, FLOAT_DTYPES, compute_dtype, dtype_name
from ..._scheme import MAX_MAP_DIMS

#: NVRTC options of the contract (DESIGN.md section 1). CuPy appends
#: ``-ftz=true`` after these and NVRTC honours the last one, so the kernels do
#: not rely on ``-ftz=false``: see kernels/contract.cuh.
OPTIONS = ("-std=c++17", "-ftz=false", "-prec-div=true", "-fmad=false")

#: Scheme index maps: the kernels' MAP template argument (kernels/elementwise.cuh).
#: "value" is not a scheme's map: one host parameter passed by value in the launch.
MAPS = {"tensor": 0, "channel": 1, "group": 2, "strided": 3, "value": 4}

#: Most merged dims the strided (multi-axis) map walks (kMaxDims in elementwise.cuh).
MAX_DIMS = MAX_MAP_DIMS

#: The code dtypes of quantize.cu/dequantize.cu (one affine code per element); formats.cu has the rest.
_QUANT_DTYPES = tuple(n for n, row in CODE_TYPES.items() if row.codec == "affine" and row.storage == "element")
_FORMAT_CODES = (tuple(n for n, row in CODE_TYPES.items() if row.codec == "float8" and row.bits == 8)
                 + tuple(n for n, row in CODE_TYPES.items() if row.storage == "packed" and row.codec == "affine")
                 + tuple(n for n, row in CODE_TYPES.items() if row.codec == "float8" and row.bits < 8))
#: The float dtypes by name: every instantiation is listed whether or not ml_dtypes
#: (bfloat16's NumPy dtype) is installed here.
_FLOATS = FLOAT_DTYPES.names
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$')


def kernels_dir() -> Path:
    """The directory holding the ``.cu``/``.cuh`` files.

    >>> (kernels_dir() / "contract.cuh").is_file()
    True
    """
    return _kernels_dir()


@functools.cache
def _kernels_dir() -> Path:
    env = os.environ.get("GPUQ_KERNELS_DIR")
    candidates = [Path(env)] if env else []
    try:  # installed wheel: package gpuq.kernels (pyproject maps it to kernels/)
        import importlib.util

        spec = importlib.util.find_spec("gpuq.kernels")
        if spec is not None and spec.submodule_search_locations:
            candidates += [Path(p) for p in spec.submodule_search_locations]
    except (ImportError, ValueError):
        pass
    candidates.append(Path(__file__).resolve().parents[3] / "kernels")  # source tree
    for c in candidates:
        if (c / "contract.cuh").is_file():
            return c
    raise FileNotFoundError(
        "gpuq's CUDA sources (contract.cuh) were not found in any of: "
        + ", ".join(str(c) for c in candidates)
    )


@functools.cache
def source_text(name: str) -> str:
    """``name`` (e.g. ``"quantize.cu"``) with local includes expanded once each.

    ``#line`` directives keep compiler messages pointing at the real files.

    >>> "quantize_rn_zp" in source_text("quantize.cu")
    True
    """
    return _expand(name, set())


def _expand(name: str, seen: set) -> str:
    path = kernels_dir() / name
    if name in seen:
        return ""
    seen.add(name)
    out = [f'#line 1 "{name}"']
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        m = _INCLUDE.match(line)
        if m and (kernels_dir() / m.group(1)).is_file():
            out.append(_expand(m.group(1), seen))
            out.append(f'#line {lineno + 1} "{name}"')
        elif line.strip() == "#pragma once":
            out.append("")  # inlined once already; in one text it would warn "in main file"
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def _c(dtype) -> str:
    """The C type of a dtype or dtype name (bfloat16 by name: no ml_dtypes needed here)."""
    name = dtype_name(dtype)
    return C_TYPES[name] if name in C_TYPES else CODE_TYPES[name].kernel_type


def _flag(b: bool) -> str:
    return "true" if b else "false"


def quantize_name(src_dtype, code_dtype, has_zp: bool, map_name: str) -> str:
    """The name expression of one quantize kernel (compute type follows ``src_dtype``)."""
    ct = compute_dtype(src_dtype)
    return (f"gpuq::quantize<{_c(src_dtype)}, {_c(code_dtype)}, {_c(ct)}, "
            f"{_flag(has_zp)}, {MAPS[map_name]}>")


def dequantize_name(code_dtype, out_dtype, has_zp: bool, map_name: str) -> str:
    """The name expression of one dequantize kernel (compute type follows ``out_dtype``)."""
    ct = compute_dtype(out_dtype)
    return (f"gpuq::dequantize<{_c(code_dtype)}, {_c(out_dtype)}, {_c(ct)}, "
            f"{_flag(has_zp)}, {MAPS[map_name]}>")


@functools.cache
def quantize_group(src_dtype, code_dtype) -> tuple:
    """The names compiled together for one (src, code) dtype pair: zp x map."""
    return tuple(quantize_name(src_dtype, code_dtype, z, m) for z in (False, True) for m in MAPS)


@functools.cache
def dequantize_group(code_dtype, out_dtype) -> tuple:
    """The names compiled together for one (code, out) dtype pair: zp x map."""
    return tuple(dequantize_name(code_dtype, out_dtype, z, m) for z in (False, True) for m in MAPS)


def quantize_names() -> list:
    """Every quantize instantiation the dispatcher can request."""
    return [n for f in _FLOATS for q in _QUANT_DTYPES for n in quantize_group(f, q)]


def dequantize_names() -> list:
    """Every dequantize instantiation the dispatcher can request."""
    return [n for q in _QUANT_DTYPES for f in _FLOATS for n in dequantize_group(q, f)]


# --- qparams.cu (gpuq.backends.cuda.qparams launches these) ----------------------------------

def segments_name(dtype, warp: bool) -> str:
    return f"gpuq::minmax_segments<{_c(dtype)}, {_flag(warp)}>"


def columns_name(dtype) -> str:
    return f"gpuq::minmax_columns<{_c(dtype)}>"


def fused_name(dtype, qdtype, warp: bool) -> str:
    return (f"gpuq::dynamic_quantize_segments<{_c(dtype)}, "
            f"{_c(qdtype)}, {_flag(warp)}>")


#: The read-once dynamic kernel's schedules, (lanes per block, units of 16 elements a lane),
#: smallest first: a block of up to lanes * units * 16 elements in registers (issue 38).
UNIT_SCHEDULES = ((8, 1), (16, 1), (32, 1), (32, 2), (256, 1), (256, 2), (256, 4))
#: Input dtypes of the read-once kernels, in registers and staged (float64 keeps the two-pass one).
UNIT_FLOATS = ("float16", "float32", "bfloat16")


def units_name(dtype, qdtype, lanes: int, units: int) -> str:
    """The read-once dynamic kernel for one schedule of :data:`UNIT_SCHEDULES`.

    >>> units_name("float32", "int8", 256, 4)
    'gpuq::dynamic_quantize_units<float, signed char, 256, 4>'
    """
    return f"gpuq::dynamic_quantize_units<{_c(dtype)}, {_c(qdtype)}, {lanes}, {units}>"


def staged_name(dtype, qdtype) -> str:
    """The read-once dynamic kernel for blocks longer than the registers hold (shared memory).

    >>> staged_name("bfloat16", "uint8")
    'gpuq::dynamic_quantize_staged<gpuq_bf16, unsigned char>'
    """
    return f"gpuq::dynamic_quantize_staged<{_c(dtype)}, {_c(qdtype)}>"


def blocks_name(dtype) -> str:
    return f"gpuq::minmax_blocks<{_c(dtype)}>"


def tiles_name(dtype) -> str:
    return f"gpuq::qparams_tiles<{_c(dtype)}>"


FINALIZE = "gpuq::finalize"


def qparams_names() -> list:
    """Every name expression of ``qparams.cu`` the dispatcher can request.

    >>> len(qparams_names()), qparams_names()[0]
    (85, 'gpuq::minmax_segments<__half, false>')
    """
    names = [segments_name(f, w) for f in _FLOATS for w in (False, True)]
    names += [columns_name(f) for f in _FLOATS]
    names += [blocks_name(f) for f in _FLOATS]
    names.append(FINALIZE)
    names += [tiles_name(f) for f in _FLOATS]
    names += [fused_name(f, q, w) for f in _FLOATS for q in _QUANT_DTYPES for w in (False, True)]
    names += [units_name(f, q, *u) for f in UNIT_FLOATS for q in _QUANT_DTYPES for u in UNIT_SCHEDULES]
    names += [staged_name(f, q) for f in UNIT_FLOATS for q in _QUANT_DTYPES]
    return names


# --- formats.cu: fp8, packed int4, fp6 and packed fp4 (gpuq.backends.cuda.formats launches these) --

#: The kernels' FMT template argument of each fp8 code dtype (kernels/formats.cu, Fp8<FMT>).
FP8_FMT = {"float8_e4m3fn": 0, "float8_e5m2": 1}


def quantize_fp8_name(src_dtype, code: str, map_name: str) -> str:
    """The name expression of one fp8 quantize kernel (saturate is a launch argument).

    >>> quantize_fp8_name("float32", "float8_e4m3fn", "channel")
    'gpuq::quantize_fp8<float, 0, float, 1>'
    """
    return (f"gpuq::quantize_fp8<{_c(src_dtype)}, {FP8_FMT[code]}, "
            f"{_c(compute_dtype(src_dtype))}, {MAPS[map_name]}>")


def dequantize_fp8_name(code: str, out_dtype, map_name: str) -> str:
    return (f"gpuq::dequantize_fp8<{FP8_FMT[code]}, {_c(out_dtype)}, "
            f"{_c(compute_dtype(out_dtype))}, {MAPS[map_name]}>")


#: The kernels' MFMT template argument of each fp4/fp6 code dtype (kernels/formats.cu, Mini<MFMT>).
MINI_FMT = {"float4_e2m1fn": 0, "float6_e2m3fn": 1, "float6_e3m2fn": 2}


def quantize_mini_name(src_dtype, code: str, map_name: str) -> str:
    """The name expression of one fp6 or fp4 quantize kernel.

    >>> quantize_mini_name("float32", "float6_e3m2fn", "group"), quantize_mini_name("float32", "float4_e2m1fn", "tensor")
    ('gpuq::quantize_fp6<float, 2, float, 2>', 'gpuq::quantize_fp4<float, float, 0>')
    """
    ct = _c(compute_dtype(src_dtype))
    if MINI_FMT[code] == 0:
        return f"gpuq::quantize_fp4<{_c(src_dtype)}, {ct}, {MAPS[map_name]}>"
    return f"gpuq::quantize_fp6<{_c(src_dtype)}, {MINI_FMT[code]}, {ct}, {MAPS[map_name]}>"


def dequantize_mini_name(code: str, out_dtype, map_name: str) -> str:
    ct = _c(compute_dtype(out_dtype))
    if MINI_FMT[code] == 0:
        return f"gpuq::dequantize_fp4<{_c(out_dtype)}, {ct}, {MAPS[map_name]}>"
    return f"gpuq::dequantize_fp6<{MINI_FMT[code]}, {_c(out_dtype)}, {ct}, {MAPS[map_name]}>"


def quantize_int4_name(src_dtype, signed: bool, has_zp: bool, map_name: str) -> str:
    return (f"gpuq::quantize_int4<{_c(src_dtype)}, {_flag(signed)}, {_c(compute_dtype(src_dtype))}, "
            f"{_flag(has_zp)}, {MAPS[map_name]}>")


def dequantize_int4_name(signed: bool, out_dtype, has_zp: bool, map_name: str) -> str:
    return (f"gpuq::dequantize_int4<{_flag(signed)}, {_c(out_dtype)}, {_c(compute_dtype(out_dtype))}, "
            f"{_flag(has_zp)}, {MAPS[map_name]}>")


@functools.cache
def formats_group(kind: str, float_dtype, code: str) -> tuple:
    """The names compiled together for one (float dtype, code dtype) pair of ``kind``
    (``"quantize"``/``"dequantize"``): the maps (x zp for int4; fp4 has no zero points)."""
    fdt = dtype_name(float_dtype)
    if code in MINI_FMT:
        if kind == "quantize":
            return tuple(quantize_mini_name(fdt, code, m) for m in MAPS)
        return tuple(dequantize_mini_name(code, fdt, m) for m in MAPS)
    if code in FP8_FMT:
        if kind == "quantize":
            return tuple(quantize_fp8_name(fdt, code, m) for m in MAPS)
        return tuple(dequantize_fp8_name(code, fdt, m) for m in MAPS)
    signed = code == "int4"
    if kind == "quantize":
        return tuple(quantize_int4_name(fdt, signed, z, m) for z in (False, True) for m in MAPS)
    return tuple(dequantize_int4_name(signed, fdt, z, m) for z in (False, True) for m in MAPS)


def formats_names() -> list:
    """Every name expression of ``formats.cu``.

    >>> len(formats_names())
    360
    """
    return [n for group in _formats_groups() for n in group]


def _formats_groups() -> list:
    codes = _FORMAT_CODES
    return [formats_group(kind, f, c) for kind in ("quantize", "dequantize") for f in _FLOATS for c in codes]


# --- mse.cu: the MSE search for scales (gpuq.backends.cuda.mse launches these) ---------------------

#: The kernels' CODEC template argument: 0 for the integer codes (their range is a launch
#: argument), 1 + ``FP8_FMT`` for fp8, 3 + ``MINI_FMT`` for fp4 and fp6.
MSE_CODECS = (0, 1, 2, 3, 4, 5)


def mse_codec(code) -> int:
    """The ``CODEC`` of a code type's row (kernels/mse.cu).

    >>> mse_codec(CODE_TYPES["int4"]), mse_codec(CODE_TYPES["float8_e5m2"]), mse_codec(CODE_TYPES["float6_e2m3fn"])
    (0, 2, 4)
    """
    if code.name in MINI_FMT:
        return 3 + MINI_FMT[code.name]
    return 1 + FP8_FMT[code.name] if code.codec == "float8" else 0


def mse_name(dtype, codec: int) -> str:
    """The name expression of one MSE search kernel.

    >>> mse_name("bfloat16", 1)
    'gpuq::mse_search<gpuq_bf16, 1>'
    """
    return f"gpuq::mse_search<{_c(dtype)}, {codec}>"


def mse_names() -> list:
    """Every name expression of ``mse.cu``.

    >>> len(mse_names())
    24
    """
    return [mse_name(f, c) for f in _FLOATS for c in MSE_CODECS]


# --- weight_pass.cu: the one-pass checkpoint weight (gpuq.backends.cuda.weight_pass launches these) --

#: The stored dtypes the weight pass reads (float64 weights keep the multi-pass path).
WEIGHT_DTYPES = ("bfloat16", "float16", "float32")

#: The kernels' KIND template argument: 0 the integer codes in compressed-tensors' words, 1 + ``FP8_FMT``.
WEIGHT_KINDS = (0, 1, 2)


def weight_pass_name(dtype, kind: int, warp: bool, tensor: bool) -> str:
    """The name expression of one weight-pass kernel.

    >>> weight_pass_name("bfloat16", 0, True, False)
    'gpuq::weight_pass<gpuq_bf16, 0, true, false>'
    """
    return f"gpuq::weight_pass<{_c(dtype)}, {kind}, {_flag(warp)}, {_flag(tensor)}>"


def weight_range_name(dtype) -> str:
    return f"gpuq::weight_range<{_c(dtype)}>"


def weight_blocks_name(dtype, kind: int) -> str:
    """The name expression of one fine-grained fp8 (block scales) kernel, ``kind`` 1 + ``FP8_FMT``.

    >>> weight_blocks_name("float16", 1)
    'gpuq::weight_blocks<__half, 1>'
    """
    return f"gpuq::weight_blocks<{_c(dtype)}, {kind}>"


def weight_micro_name(dtype) -> str:
    """The name expression of the microscaling kernel (fp4/fp6 codes under MX or NVFP4 scales;
    the code format and the scale rule are runtime arguments: one instantiation a dtype).

    >>> weight_micro_name("bfloat16")
    'gpuq::weight_micro<gpuq_bf16>'
    """
    return f"gpuq::weight_micro<{_c(dtype)}>"


@functools.cache
def weight_pass_group(dtype) -> tuple:
    """The names compiled together for one stored dtype: kind x team x per-tensor, the range,
    the fp8 block kernels, the microscaling kernel."""
    names = [weight_pass_name(dtype, k, w, t) for k in WEIGHT_KINDS for w in (True, False) for t in (False, True)]
    return tuple(names + [weight_range_name(dtype)] + [weight_blocks_name(dtype, k) for k in WEIGHT_KINDS[1:]]
                 + [weight_micro_name(dtype)])


def weight_pass_names() -> list:
    """Every name expression of ``weight_pass.cu``.

    >>> len(weight_pass_names())
    48
    """
    return [n for f in WEIGHT_DTYPES for n in weight_pass_group(f)]


def compile_units() -> list:
    """Every ``(source, name_expressions)`` the CUDA backend compiles as one module, exactly
    as it asks for them (the same groups, the same order): what a warm-up compiles ahead.

    >>> len(compile_units()), compile_units()[0][0]
    (77, 'quantize.cu')
    """
    units = [("quantize.cu", quantize_group(f, q)) for f in _FLOATS for q in _QUANT_DTYPES]
    units += [("dequantize.cu", dequantize_group(q, f)) for q in _QUANT_DTYPES for f in _FLOATS]
    units.append(("qparams.cu", tuple(qparams_names())))
    units += [("formats.cu", group) for group in _formats_groups()]
    units.append(("mse.cu", tuple(mse_names())))
    units += [("weight_pass.cu", weight_pass_group(f)) for f in WEIGHT_DTYPES]
    return units


#: Source file -> function returning every name expression the dispatcher can
#: request from it. The NVRTC check compiles all of them.
SOURCES = {
    "quantize.cu": quantize_names,
    "dequantize.cu": dequantize_names,
    "qparams.cu": qparams_names,
    "formats.cu": formats_names,
    "mse.cu": mse_names,
    "weight_pass.cu": weight_pass_names,
}
