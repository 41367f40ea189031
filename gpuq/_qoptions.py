"""The options of ``choose_qparams`` and ``quantize_dynamic`` that are no data, checked.

One place for the checks and their words, below the layers that call them: the public
functions (:mod:`gpuq.qparams`), the Dask path (:mod:`gpuq._dask`, on a zero-strided stand-in
of the Dask array: nothing is computed) and the torch ops (:mod:`gpuq._torch_ops`,
:mod:`gpuq.torch`).
"""

from __future__ import annotations

import numbers

import numpy as np

from ._codetypes import as_code_type
from ._dispatch import backend_for
from ._dtypes import FLOAT_DTYPES, dtype_name, native
from ._scheme import Scheme

#: The ways ``method=`` chooses parameters from data: each block's min/max, or the MSE search
#: over 20 shrunken ranges (see the module docstring).
METHODS = ("minmax", "mse")

#: Default scale for a block whose range is 0: the smallest normal float32.
EPS = float(np.finfo(np.float32).tiny)
#: The dtypes a scale may be rounded to (``scale_dtype``), with the default ``eps`` of each: the
#: smallest normal float32 where the dtype holds it, float16's smallest positive value otherwise.
SCALE_DTYPES = {"float32": EPS, "bfloat16": EPS, "float16": 2.0**-24, "float8_e8m0fnu": EPS, "float8_e4m3fn": EPS}
#: ``scale_rule`` values (None: the default rule). ``"full"``: symmetric integer codes use their
#: whole range, ``scale = max|x| / ((qmax - qmin) / 2)`` (int4: / 7.5, int8: / 127.5), as torchao,
#: compressed-tensors and GPTQ do; the others are the MX power-of-two rules of
#: ``scale_dtype="float8_e8m0fnu"`` (:func:`scale_rule` checks those against the scale dtype).
SCALE_RULES = ("full", "floor", "even", "ceil", "rceil")
#: How ``validate`` hands the full-range rule to the backends: as ``symmetric``, 2 (the
#: kernels' ``int symmetric``: 0 asymmetric, 1 max|x| / ((qmax - qmin) // 2), 2 full range).
FULL_RANGE = 2


def validate(x, axis, group_size, block_size, dtype, symmetric, eps, scale_dtype, method, scale_rule=None):
    """The arguments of :func:`choose_qparams` / :func:`quantize_dynamic` checked and normalised,
    without reading ``x``'s data (a zero-strided stand-in of its dtype and shape serves:
    the Dask and torch paths check so): ``(backend, array, scheme, code, symmetric, eps,
    scale dtype name, method)``; ``symmetric`` is :data:`FULL_RANGE` under ``scale_rule="full"``.

    >>> stand_in = np.broadcast_to(np.zeros((), np.float32), (6, 8))   # no data: zero strides
    >>> _, _, scheme, code, symmetric, eps, sdt, method = validate(
    ...     stand_in, None, None, (4, 4), "int4", None, None, "bf16", "mse")
    >>> scheme.param_shape, code.name, symmetric, sdt, method
    ((2, 2), 'int4', False, 'bfloat16', 'mse')
    """
    backend, arr = backend_for(x, "x")  # an ndarray subclass: its base ndarray; masked: TypeError
    if native(arr.dtype) not in FLOAT_DTYPES:
        raise TypeError(f"x must be float16, float32, float64 or bfloat16, got {arr.dtype}")
    code = as_code_type(dtype)
    if symmetric is None:
        symmetric = code.zero_point == "none"  # no zero point: symmetric by nature (fp8)
    _check_symmetric(symmetric)
    if code.zero_point == "none" and not symmetric:
        raise ValueError(f"symmetric must be True for {code.name} codes (float codes have no zero point), "
                         f"got symmetric=False")
    sdt = _scale_dtype(scale_dtype)
    mode = symmetric_mode(scale_rule, code, symmetric, sdt)
    scheme = Scheme.build(arr.shape, axis, group_size, block_size)
    eps = _check_eps(eps, SCALE_DTYPES[sdt])
    return backend, arr, scheme, code, mode, eps, sdt, _method(method)


def symmetric_mode(scale_rule, code, symmetric, scale_dtype="float32"):
    """``scale_rule`` checked against the code type and ``symmetric``: ``bool(symmetric)``, or
    :data:`FULL_RANGE` for ``"full"``, which only symmetric integer codes take (with MX scales,
    ``scale_dtype="float8_e8m0fnu"``, the rule names are checked by :func:`scale_rule`, whose
    message lists the MX rules).

    >>> from gpuq._codetypes import code_type
    >>> symmetric_mode("full", code_type("int4"), True), symmetric_mode(None, code_type("int4"), True)
    (2, True)
    >>> symmetric_mode("full", code_type("uint8"), False)
    Traceback (most recent call last):
    ...
    ValueError: scale_rule='full' is for symmetric integer codes, got dtype=uint8 with symmetric=False
    """
    if scale_rule is None or (scale_dtype == MX_SCALE_DTYPE and scale_rule != "full"):
        return bool(symmetric)
    _check_scale_rule(scale_rule)
    if scale_rule != "full":  # an MX rule: checked with the scale dtype by scale_rule()
        return bool(symmetric)
    if code.codec != "affine" or not symmetric:
        raise ValueError(f"scale_rule={scale_rule!r} is for symmetric integer codes, got dtype={code.name} "
                         f"with symmetric={bool(symmetric)}")
    return FULL_RANGE


def _check_scale_rule(value) -> None:
    if not isinstance(value, str):
        raise TypeError(f"scale_rule must be None or a string, one of {', '.join(map(repr, SCALE_RULES))}; "
                        f"got {value!r}")
    if value not in SCALE_RULES:
        raise ValueError(f"scale_rule must be None or one of {', '.join(map(repr, SCALE_RULES))}, got {value!r}")


def check_options(symmetric, eps, scale_dtype, method, scale_rule=None) -> tuple:
    """The options of :func:`choose_qparams` and :func:`quantize_dynamic` that are no arrays,
    checked as those calls check them (for callers that hand them on, such as the torch ops):
    ``(symmetric, eps, scale dtype name, method)``, ``symmetric`` and ``eps`` None where given so
    (``scale_rule`` is checked by its values here, against the code type by :func:`validate`).

    >>> check_options(None, 1e-3, "bf16", "mse")
    (None, 0.0010000000474974513, 'bfloat16', 'mse')
    >>> check_options(1, None, "float32", "minmax")
    Traceback (most recent call last):
    ...
    TypeError: symmetric must be True or False, got 1
    """
    if symmetric is not None:
        _check_symmetric(symmetric)
    sdt = _scale_dtype(scale_dtype)
    if scale_rule is not None and not (sdt == "float8_e8m0fnu" and isinstance(scale_rule, str)):
        _check_scale_rule(scale_rule)  # an MX rule's name is checked by validate (its message lists those)
    eps = None if eps is None else _check_eps(eps, SCALE_DTYPES[sdt])
    return (None if symmetric is None else bool(symmetric)), eps, sdt, _method(method)


def check_bool(value, name: str) -> None:
    """``value`` is True or False (a NumPy bool too), else a TypeError naming ``name``.

    >>> check_bool(0, "check_values")
    Traceback (most recent call last):
    ...
    TypeError: check_values must be True or False, got 0
    """
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}")


def _check_symmetric(symmetric) -> None:
    check_bool(symmetric, "symmetric")


def _method(value) -> str:
    """``method`` checked: one of :data:`METHODS`.

    >>> _method("mse")
    'mse'
    >>> _method("MSE")
    Traceback (most recent call last):
    ...
    ValueError: method must be one of 'minmax', 'mse', got 'MSE'
    """
    if not isinstance(value, str):
        raise TypeError(f"method must be a string, one of {', '.join(map(repr, METHODS))}; got {value!r}")
    if value not in METHODS:
        raise ValueError(f"method must be one of {', '.join(map(repr, METHODS))}, got {value!r}")
    return value


def _scale_dtype(value) -> str:
    """The name of ``scale_dtype`` (a name, oneDNN short name, NumPy or ml_dtypes dtype or type).

    >>> _scale_dtype("bf16"), _scale_dtype(np.float16)
    ('bfloat16', 'float16')
    """
    want = ", ".join(SCALE_DTYPES)
    if isinstance(value, str):
        name = _SHORT_SCALE.get(value.lower(), value)
        if name not in SCALE_DTYPES:
            raise ValueError(f"scale_dtype must be one of {want}, got {value!r}")
        return name
    try:
        name = None if value is None else dtype_name(value)
    except TypeError:
        name = None
    if name is None:
        raise TypeError(f"scale_dtype must be a dtype or dtype name, one of {want}; got {value!r}")
    if name not in SCALE_DTYPES:
        raise TypeError(f"scale_dtype must be one of {want}, got {name}")
    return name


#: The scale dtypes of a scale rule (not a rounding of min/max's scale): OCP MX's power-of-two
#: e8m0 scales (``scale_rule``: :data:`gpuq._mx.RULES`).
#: NVFP4's e4m3 block scales (with ``global_scale``, :mod:`gpuq._nvfp4`).
RULE_SCALE_DTYPES = ("float8_e8m0fnu", "float8_e4m3fn")
MX_SCALE_DTYPE, NVFP4_SCALE_DTYPE = RULE_SCALE_DTYPES


def scale_rule(value, scale_dtype, code, eps, method, global_scale=None):
    """``scale_rule`` checked against the other options: an MX rule name (default ``"even"``)
    with ``scale_dtype="float8_e8m0fnu"``, ``"nvfp4"`` with ``"float8_e4m3fn"`` (which takes
    ``global_scale``, fp4 codes only), else None (no rule is given).

    >>> from gpuq._codetypes import CODE_TYPES
    >>> scale_rule(None, "float8_e8m0fnu", CODE_TYPES["float4_e2m1fn"], None, "minmax")
    'even'
    >>> scale_rule("round", "float8_e8m0fnu", CODE_TYPES["float4_e2m1fn"], None, "minmax")
    Traceback (most recent call last):
    ...
    ValueError: scale_rule must be one of 'floor', 'even', 'ceil', 'rceil' with scale_dtype='float8_e8m0fnu', got 'round'
    """
    from ._mx import DEFAULT_RULE, RULES

    if (global_scale is not None) != (scale_dtype == NVFP4_SCALE_DTYPE):
        raise ValueError(f"global_scale goes with scale_dtype='float8_e4m3fn' (NVFP4) and it needs one, got "
                         f"global_scale={'None' if global_scale is None else 'a value'} with "
                         f"scale_dtype={scale_dtype!r}")
    if scale_dtype == NVFP4_SCALE_DTYPE:
        if not code.takes_global_scale or value is not None or eps is not None or method != "minmax":
            raise ValueError(f"scale_dtype='float8_e4m3fn' (NVFP4) takes float4_e2m1fn codes, method='minmax', "
                             f"no eps and no scale_rule; got {code.name} codes, method={method!r}, eps={eps!r}, "
                             f"scale_rule={value!r}")
        return "nvfp4"
    if scale_dtype not in RULE_SCALE_DTYPES:
        if value is not None and value != "full":  # "full" is the integer codes' rule (symmetric_mode)
            raise ValueError(f"scale_rule applies to scale_dtype='float8_e8m0fnu' (MX scales) only, got "
                             f"scale_rule={value!r} with scale_dtype={scale_dtype!r}")
        return None
    if code.codec != "float8":
        raise ValueError(f"scale_dtype='float8_e8m0fnu' (MX scales) applies to float codes (fp4, fp6, "
                         f"fp8), got {code.name} codes")
    if eps is not None:
        raise ValueError(f"eps does not apply to scale_dtype='float8_e8m0fnu' (a zero block gets 2**-127), "
                         f"got eps={eps!r}")
    if method != "minmax":
        raise ValueError(f"method={method!r} with scale_dtype='float8_e8m0fnu' is not supported (MX scales "
                         f"come from each block's max)")
    rule = DEFAULT_RULE if value is None else value
    if rule not in RULES:
        raise ValueError(f"scale_rule must be one of {', '.join(map(repr, RULES))} with "
                         f"scale_dtype='float8_e8m0fnu', got {value!r}")
    return rule


#: oneDNN's short names ("f16" is NumPy's 16-byte float: the short name wins here).
_SHORT_SCALE = {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}


def _check_eps(eps, default):
    if eps is None:
        return default
    if isinstance(eps, bool) or not isinstance(eps, (numbers.Real, np.floating, np.integer)):
        raise TypeError(f"eps must be a real number, got {eps!r}")
    with np.errstate(over="ignore"):
        e = np.float32(eps)
    if not (np.isfinite(e) and e > 0):
        raise ValueError(f"eps must be finite and > 0 as a float32, got {eps!r} (float32: {e})")
    return float(e)
