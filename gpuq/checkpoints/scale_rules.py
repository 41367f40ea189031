"""How the command chooses scales: ``--scales`` (what the scales are) and ``--scale-rule`` (how
they come from each block's ``max|x|``), resolved per code type before any data is read.

=========================  ==========================================================================
``--scales``               the scales
=========================  ==========================================================================
``float32``                float32 scales (the int and fp8 codes' default): ``max|x| / divisor``,
                           or min/max with zero points for asymmetric integer codes
``mx``                     OCP MX's power-of-two scales (``scale_dtype="float8_e8m0fnu"``), for fp4,
                           fp6 and fp8 codes; the default of fp4 and fp6; the rule ``--scale-rule``
                           floor, even (default), ceil or rceil (:func:`gpuq.choose_qparams`)
``nvfp4``                  NVFP4's e4m3 block scales and a float32 global scale per tensor
                           (:func:`gpuq.global_scale`), float4_e2m1fn codes only
=========================  ==========================================================================

With float32 scales, symmetric integer codes take one of two rules:

* ``full`` (the command's default for 4-bit codes, int4 and uint4, in every format): the codes'
  whole range, ``scale = max|x| / ((qmax - qmin) / 2)`` (``/ 7.5``), as torchao, compressed-tensors
  and GPTQ choose them; ``gpuq.choose_qparams(..., scale_rule="full")``.
* ``narrow`` (the default for 8-bit codes, and the array API's default everywhere): the narrow
  range ``[-qmax, qmax]``, ``scale = max|x| / qmax`` (``/ 7``, ``/ 127``), TensorFlow's
  ``narrow_range``; ``choose_qparams``' default rule (``scale_rule=None``). For int8 it is the
  more accurate of the two on Gaussian weights (bench/NOTES.md: 43.79 dB against 43.72 dB).

The rule is a choice of the writer: the file holds ordinary float32 scales either way, and the
report names the rule. The MX rules and NVFP4 are recorded in the file (format version 5:
:mod:`gpuq.checkpoints.quantized`), since what the scales are decides how they are stored.
"""

from __future__ import annotations

from .._codetypes import CODE_TYPES
from .files import CliError

#: ``--scales`` choices.
SCALES = ("float32", "mx", "nvfp4")
#: The rules of symmetric integer codes with float32 scales.
INT_RULES = ("full", "narrow")
#: OCP MX's rules (``choose_qparams(scale_rule=...)`` with e8m0 scales); the first default is "even".
MX_RULES = ("floor", "even", "ceil", "rceil")
#: ``--scale-rule`` choices.
SCALE_RULES = INT_RULES + MX_RULES
MX_DEFAULT = "even"
#: The scale dtype (``choose_qparams(scale_dtype=...)``) of each kind of scales.
SCALE_DTYPE = {"float32": "float32", "mx": "float8_e8m0fnu", "nvfp4": "float8_e4m3fn"}
#: NVFP4's element type.
NVFP4_CODE = "float4_e2m1fn"


def is_small_float(dtype) -> bool:
    """fp4 and fp6: the codes that default to MX scales and that only format version 5 holds.

    >>> is_small_float("float4_e2m1fn"), is_small_float("float6_e3m2fn"), is_small_float("float8_e4m3fn")
    (True, True, False)
    """
    row = CODE_TYPES.get(dtype) if isinstance(dtype, str) else None
    return row is not None and row.codec == "float8" and row.bits < 8


def default_int_rule(dtype: str) -> str:
    """The command's rule for symmetric integer codes with float32 scales: ``full`` for the
    4-bit codes, ``narrow`` for the 8-bit ones.

    >>> default_int_rule("int4"), default_int_rule("uint4"), default_int_rule("int8")
    ('full', 'full', 'narrow')
    """
    return "full" if CODE_TYPES[dtype].bits == 4 else "narrow"


def resolve(dtype: str, symmetric: bool, scales=None, scale_rule=None) -> tuple:
    """``(scales, rule)`` for codes of ``dtype``: ``--scales`` and ``--scale-rule`` as given
    (None: the defaults) checked against the code type. ``rule`` is ``full``/``narrow`` for
    symmetric integer codes, an MX rule for ``mx``, None otherwise (asymmetric codes, fp8 with
    float32 scales, NVFP4, whose scales have one rule). One CliError line naming the flag for a
    combination that does not exist.

    >>> resolve("int4", True), resolve("int8", True), resolve("int4", False)
    (('float32', 'full'), ('float32', 'narrow'), ('float32', None))
    >>> resolve("float4_e2m1fn", True), resolve("float6_e2m3fn", True, "mx", "ceil")
    (('mx', 'even'), ('mx', 'ceil'))
    >>> resolve("float4_e2m1fn", True, "nvfp4"), resolve("int4", True, None, "narrow")
    (('nvfp4', None), ('float32', 'narrow'))
    >>> resolve("int4", False, None, "full")
    Traceback (most recent call last):
    ...
    gpuq.checkpoints.files.CliError: --scale-rule full is for symmetric integer codes (add --symmetric), got int4 asymmetric
    """
    row = CODE_TYPES[dtype]
    if scales is None:
        scales = "mx" if is_small_float(dtype) else "float32"
    if scales not in SCALES:
        raise CliError(f"--scales must be one of {', '.join(SCALES)}, got {scales!r}")
    if scale_rule is not None and scale_rule not in SCALE_RULES:
        raise CliError(f"--scale-rule must be one of {', '.join(SCALE_RULES)}, got {scale_rule!r}")
    if scales == "mx":
        if row.codec != "float8":
            raise CliError(f"--scales mx (power-of-two e8m0 scales) is for float codes (fp4, fp6, fp8), "
                           f"got --dtype {dtype}")
        if scale_rule is not None and scale_rule not in MX_RULES:
            raise CliError(f"--scale-rule {scale_rule} is for symmetric integer codes; MX scales take "
                           f"{', '.join(MX_RULES)}")
        return scales, scale_rule or MX_DEFAULT
    if scales == "nvfp4":
        if dtype != NVFP4_CODE:
            raise CliError(f"--scales nvfp4 (e4m3 block scales and a global scale) is for --dtype "
                           f"{NVFP4_CODE}, got --dtype {dtype}")
        if scale_rule is not None:
            raise CliError(f"--scale-rule {scale_rule}: NVFP4's scales have one rule "
                           f"(compressed-tensors'); drop --scale-rule")
        return scales, None
    if scale_rule in MX_RULES:
        raise CliError(f"--scale-rule {scale_rule} is an MX rule: it needs --scales mx (and float codes)")
    if row.codec != "affine":
        if scale_rule is not None:
            raise CliError(f"--scale-rule {scale_rule} is for symmetric integer codes, got --dtype {dtype} "
                           f"(float32 scales of float codes are max|x| / {row.qmax:g})")
        return scales, None
    if not symmetric:
        if scale_rule is not None:
            raise CliError(f"--scale-rule {scale_rule} is for symmetric integer codes (add --symmetric), "
                           f"got {dtype} asymmetric")
        return scales, None
    return scales, scale_rule or default_int_rule(dtype)


def scheme_keys(dtype: str, scales: str, rule) -> dict:
    """The scale keys a gpuq-file scheme carries: ``scale_dtype``/``scale_rule`` (recorded in the
    file: format version 5) for fp4/fp6 codes and for MX or NVFP4 scales; ``scale_rule: "full"``
    for the full-range rule (the file's scales are ordinary ones: not recorded); none otherwise.

    >>> scheme_keys("int4", "float32", "full"), scheme_keys("int4", "float32", "narrow")
    ({'scale_rule': 'full'}, {})
    >>> scheme_keys("float4_e2m1fn", "nvfp4", None)
    {'scale_dtype': 'float8_e4m3fn', 'scale_rule': None}
    """
    if is_small_float(dtype) or scales != "float32":
        return {"scale_dtype": SCALE_DTYPE[scales], "scale_rule": rule}
    return {"scale_rule": rule} if rule == "full" else {}


def scales_kind(scheme) -> str:
    """``float32``, ``mx`` or ``nvfp4``: the scales of a gpuq-file scheme (a dict).

    >>> scales_kind({"scale_dtype": "float8_e8m0fnu"}), scales_kind({"dtype": "int8"})
    ('mx', 'float32')
    """
    sdt = scheme.get("scale_dtype", "float32")
    return next(k for k, v in SCALE_DTYPE.items() if v == sdt)


def api_kwargs(scale_dtype="float32", scale_rule=None) -> dict:
    """The keywords of :func:`gpuq.choose_qparams` for a scheme's scale keys (NVFP4's
    ``global_scale`` is the data's: :func:`choose_kwargs`).

    >>> api_kwargs("float32", "full"), api_kwargs("float32", "narrow"), api_kwargs()
    ({'scale_rule': 'full'}, {}, {})
    >>> api_kwargs("float8_e8m0fnu", "even")
    {'scale_dtype': 'float8_e8m0fnu', 'scale_rule': 'even'}
    """
    kw = {} if scale_dtype == "float32" else {"scale_dtype": scale_dtype}
    if scale_rule not in (None, "narrow"):
        kw["scale_rule"] = scale_rule
    return kw


def choose_kwargs(scheme: dict, x) -> dict:
    """:func:`api_kwargs` of a gpuq-file scheme, with NVFP4's global scale of ``x`` (the tensor
    whose scales are chosen: its finite values).

    >>> import numpy as np
    >>> choose_kwargs({"scale_dtype": "float8_e4m3fn", "scale_rule": None}, np.float32([[0.5, -3.0]]))
    {'scale_dtype': 'float8_e4m3fn', 'global_scale': np.float32(896.0)}
    """
    kw = api_kwargs(scheme.get("scale_dtype", "float32"), scheme.get("scale_rule"))
    if kw.get("scale_dtype") == SCALE_DTYPE["nvfp4"]:
        import gpuq

        kw["global_scale"] = gpuq.global_scale(x)
    return kw


def word(scale_dtype="float32", scale_rule=None):
    """The rule's word in a report's scheme text, or None where the default needs none.

    >>> word("float32", "full"), word("float8_e8m0fnu", "ceil"), word("float8_e4m3fn"), word()
    ('full-range', 'mx-ceil', 'nvfp4', None)
    """
    if scale_dtype == SCALE_DTYPE["mx"]:
        return f"mx-{scale_rule}"
    if scale_dtype == SCALE_DTYPE["nvfp4"]:
        return "nvfp4"
    return "full-range" if scale_rule == "full" else None


def rule_note(rule, dtype) -> list:
    """The report's line on the rule of symmetric integer codes where it is worth a line: the
    full-range rule, and the narrow one of 4-bit codes (whose default is the full range).

    >>> rule_note("full", "int4")
    ['note: symmetric int4 scales by the full-range rule, max|x| / 7.5 (--scale-rule narrow: max|x| / 7)']
    """
    row = CODE_TYPES.get(dtype)
    if rule not in INT_RULES or row is None or (rule == "narrow" and default_int_rule(dtype) == "narrow"):
        return []  # the 8-bit codes' narrow rule is every gpuq's: nothing to say
    full, narrow = (row.qmax - row.qmin) / 2, (row.qmax - row.qmin) // 2
    other = "narrow" if rule == "full" else "full"
    mine, theirs = (full, narrow) if rule == "full" else (narrow, full)
    return [f"note: symmetric {dtype} scales by the {'full-range' if rule == 'full' else 'narrow'} rule, "
            f"max|x| / {mine:g} (--scale-rule {other}: max|x| / {theirs:g})"]
