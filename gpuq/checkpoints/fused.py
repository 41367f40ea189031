"""The one-pass quantization of a model-folder weight on the host (issue 40, point 1).

:func:`quantize_weight` hands a ``[out, in]`` weight to the compiled pass
(:func:`gpuq.backends.host.weight_pass.weight_rows`), which reads the stored bits (bfloat16,
float16, float32), chooses the scales, writes the codes in the format's final layout and
sums the report's figures at once; it returns None for any case that pass does not cover,
and the caller then takes the multi-pass path (:func:`gpuq.checkpoints.serving.quantize.quantize_weight`),
whose bytes it reproduces exactly. Covered: the host device with the compiled loops,
per-tensor, per-channel or per-group scales in bfloat16, float16 or float32,
compressed-tensors' ``pack-quantized`` int codes of 4 or 8 bits (symmetric or with zero points,
each group starting on a word) and ``naive-quantized`` fp8; fine-grained fp8's block scales
(``--calibrate minmax``: :func:`gpuq.backends.host.weight_pass.block_strips`).

gpuq's own files (``gpuq quantize`` without ``--format``, locally or on ``--workers``) take the
same pass through :func:`covers_file` and :func:`quantize_file_tensor`: int8/uint8 bytes,
int4/uint4 nibbles (ONNX's order, rows of an even length), fp8 bytes, per tensor, per channel
(axis 0 of a matrix, the multi-axis scheme of a rank-3+ tensor: one scale a row of its last
dimension) or in groups along the last dimension that divide it, float32 scales (the
narrow and the full-range rule). Everything else in gpuq's files (block scales, MX/NVFP4
scales, fp4/fp6, float64 weights, a GPU, NumPy-only hosts) keeps the multi-pass path.

compressed-tensors' microscaling layouts (``nvfp4-pack-quantized``, ``mxfp4-pack-quantized``,
``mxfp6-pack-quantized``, ``mxfp8-quantized``: the layouts whose ``one_pass`` is ``"micro"``)
take :func:`gpuq.backends.host.weight_pass.quantize_micro` on the host: each group's e8m0 (MX,
by the scheme's rule) or e4m3 (NVFP4) scale chosen in the pass from its ``max |x|``, NVFP4's
under the weight's global scale (a reduction over it first) or the merged layer's shared one,
the codes in their stored bytes. gpt-oss's MXFP4 experts take the same pass one expert at a
time (:func:`micro_bytes`, from ``gpuq.checkpoints.formats.gpt_oss``).

``--calibrate mse`` (not with block scales): the search chooses the scales as the multi-pass
path does (:func:`gpuq.choose_qparams`, today's code), then the pass writes the codes and
sums the figures with them.

On a CUDA device, compressed-tensors' int 4/8-bit words and fp8 bytes with per-tensor,
per-channel or per-group scales go through the GPU's pass (:mod:`gpuq.checkpoints.fused_cuda`,
the hook in :func:`covers` and :func:`_run`): min/max scales chosen in the kernel, or the
given ones of ``--calibrate mse`` and ``mxfp8-quantized`` (``choose_qparams`` on the GPU, as
the multi-pass path calls it there); so do fine-grained fp8's block scales (``--calibrate
minmax``, a block kernel); and so do the microscaling layouts' fp4/fp6 codes (NVFP4, MXFP4,
MXFP6, gpt-oss's experts: :func:`micro_kernel`, ``weight_micro``; NVFP4's own global scale
computed on the GPU).

:class:`Buffers` holds the code buffers a run reuses from weight to weight (the weights are
read through a memory map of the file, :meth:`gpuq.checkpoints.files.Checkpoint.mapped`).
"""

from __future__ import annotations

import math

import numpy as np

from .._dtypes import is_bfloat16

_SCALE_DTYPES = ("bfloat16", "float16", "float32")
_E8M0, _E4M3 = "float8_e8m0fnu", "float8_e4m3fn"  # MX's and NVFP4's scale dtypes


class Buffers:
    """Byte buffers reused across the weights of a run, grown to the largest asked for.

    >>> b = Buffers()
    >>> a = b.array("codes", (2, 3), np.uint8); a.shape, a.dtype.name
    ((2, 3), 'uint8')
    >>> b.array("codes", (1, 2), np.uint8).ctypes.data == a.ctypes.data   # the same memory
    True
    """

    def __init__(self):
        self._bufs = {}

    def array(self, key: str, shape, dtype) -> np.ndarray:
        """An uninitialised C-order array of ``shape`` and ``dtype`` in buffer ``key``."""
        dtype = np.dtype(dtype)
        n = math.prod(shape) * dtype.itemsize
        buf = self._bufs.get(key)
        if buf is None or buf.size < n:
            buf = self._bufs[key] = np.empty(max(n, 1), np.uint8)
        return buf[:n].view(dtype).reshape(shape)


def finite_part(x: np.ndarray) -> np.ndarray:
    """``x`` with NaN and +-Inf replaced by 0: the values a tensor's parameters come from under
    ``--nonfinite warn/allow`` (signalling NaNs too, without NumPy's invalid-value warning).

    >>> finite_part(np.array([1.5, np.nan, -np.inf, 2.0], np.float32))
    array([1.5, 0. , 0. , 2. ], dtype=float32)
    """
    with np.errstate(invalid="ignore"):
        return np.where(np.isfinite(x), x, x.dtype.type(0))


def covers(x, scheme, device, method: str) -> bool:
    """Whether :func:`quantize_weight` takes weight ``x`` in ``scheme`` (see the module docstring).

    >>> from gpuq.checkpoints.env import HostDevice
    >>> from gpuq.checkpoints.formats.compressed_tensors import PACK
    >>> from gpuq.checkpoints.serving.formats import WeightScheme, int_code
    >>> s = WeightScheme(int_code(4), "group", True, "bfloat16", PACK, group_size=128)
    >>> covers(np.zeros((2, 256), np.float32), s, HostDevice(), "minmax")
    True
    >>> covers(np.zeros((2, 256), np.float32), s, HostDevice(), "mse")  # the search's scales, then the pass
    True
    >>> covers(np.zeros((2, 256), np.float64), s, HostDevice(), "minmax")
    False
    """
    from ..backends.host import choice

    if device.name == "cuda":  # the GPU's pass (gpuq.checkpoints.fused_cuda): its own conditions, then the layout's
        from .fused_cuda import device_covers

        if not device_covers(x, scheme, method):
            return False
    elif device.name != "cpu" or method not in ("minmax", "mse") or choice.kernels() is None:
        return False
    if not isinstance(x, np.ndarray) or x.ndim != 2 or x.size == 0 or not x.flags.c_contiguous:
        return False
    if not (is_bfloat16(x.dtype) or x.dtype in (np.float16, np.float32)):
        return False
    code, one_pass = scheme.code, getattr(scheme.layout, "one_pass", None)  # the layout says what it takes
    if one_pass == "micro" and device.name == "cuda":
        if code.bits == 8:  # MXFP8: choose_qparams' e8m0 scales, then the GPU's fp8 pass
            return (method == "minmax" and scheme.strategy == "group" and scheme.scale_dtype == _E8M0
                    and code.codec == "float8" and x.shape[1] % scheme.group_size == 0)
        if scheme.group_size not in (16, 32):  # weight_micro's groups; else the host's conditions below
            return False
    if one_pass == "micro":  # fp4/fp6/fp8 under MX or NVFP4 scales, chosen in the host's pass
        return (method == "minmax" and scheme.scale_dtype in (_E8M0, _E4M3)
                and code.codec == "float8" and code.bits in (4, 6, 8) and x.shape[1] % scheme.group_size == 0
                and (scheme.scale_dtype == _E8M0 or code.takes_global_scale))
    if scheme.scale_dtype not in _SCALE_DTYPES:
        return False
    if scheme.strategy == "block":
        return method == "minmax" and one_pass == "blocks" and code.codec == "float8" and code.bits == 8 and len(scheme.block) == 2
    if scheme.strategy not in ("tensor", "channel", "group"):
        return False
    n = x.shape[1]
    g = scheme.group_size if scheme.strategy == "group" else n
    if n % g:
        return False
    if one_pass == "words":
        return code.codec == "affine" and code.bits in (4, 8) and (g == n or g % (32 // code.bits) == 0)
    return one_pass == "bytes" and code.codec == "float8" and scheme.symmetric


def quantize_weight(x, scheme, module: str, *, scale_rule=None, buffers=None, method="minmax", device=None,
                    global_scale=None):
    """``(tensors, stats, counts)`` of weight ``x`` as the multi-pass path gives them (the same
    bytes; the sums of ``stats`` in another order), in one pass; None where that pass refuses
    a group's parameters (a scale the scale dtype cannot hold: the multi-pass path then says
    which). The caller checks :func:`covers` first. ``scale_rule`` is ``choose_qparams``' (None
    or ``"full"``; None takes the scheme's ``scale_rule`` where it has one); ``buffers`` a
    :class:`Buffers` for the codes (a fresh array without); ``method`` ``"mse"``: the scales are
    the MSE search's (:func:`gpuq.choose_qparams`, as the multi-pass path calls it), the codes
    and figures the pass's; ``device`` the run's (a CUDA one takes the GPU's pass,
    :mod:`gpuq.checkpoints.fused_cuda`); ``global_scale`` NVFP4's (a merged layer's shared one,
    ``serving.quantize.shared_global_scales``; None: the weight's own, :func:`gpuq.global_scale`).

    >>> from gpuq.checkpoints.formats.compressed_tensors import PACK
    >>> from gpuq.checkpoints.serving.formats import WeightScheme, int_code
    >>> x = np.array([[0.5, -1.0], [2.0, 4.0]], np.float32)
    >>> s = WeightScheme(int_code(8), "channel", True, "float32", PACK)
    >>> t, stats, counts = quantize_weight(x, s, "m")
    >>> t["m.weight_scale"].ravel().tolist(), counts
    ([0.007874015718698502, 0.031496062874794006], {'nan': 0, 'posinf': 0, 'neginf': 0})
    """
    buffers = buffers or Buffers()
    if scheme.strategy == "block":
        return _blocks(x, scheme, module, buffers, device)
    if getattr(scheme.layout, "one_pass", None) == "micro" and (micro_kernel(scheme) or not _on_cuda(device)):
        return _micro(x, scheme, module, buffers, global_scale, device)
    if scale_rule is None:
        scale_rule = scheme_rule(scheme)
    g = group_of(x.shape, scheme)
    given = None
    if scales_given(scheme, method):  # on a GPU, MXFP8's e8m0 scales come from choose_qparams
        given = chosen_for(x, scheme, method, scale_rule, device)
        if given is None:
            return None
    done = _run(x, scheme.code.name, scheme.symmetric, scheme.scale_dtype, scheme.strategy, g, scale_rule,
                buffers, "words", given, device)
    if done is None:
        return None
    out, _, scales, zps, stats, counts = done
    return encode(scheme, module, x.shape, out, scales, zps), stats, counts


def scales_given(scheme, method: str) -> bool:
    """Whether the pass takes ``scheme``'s scales from the library's call (:func:`chosen_for`):
    the MSE search's, or MX's e8m0 ones; otherwise it chooses them (min/max)."""
    return method == "mse" or scheme.scale_dtype == _E8M0


def chosen_for(x, scheme, method: str, scale_rule=None, device=None):
    """``(scales, zps)`` of weight ``x`` in ``scheme`` by ``method`` as the multi-pass path
    chooses them (:func:`_chosen`; on a CUDA ``device``, on the GPU as it does there), None
    where the call refuses."""
    return _chosen(x, x, scheme.code.name, scheme.symmetric, scheme.scale_dtype, scale_rule,
                   scheme.api_kwargs(), method, device)


def scheme_rule(scheme):
    """``choose_qparams``' ``scale_rule`` for the command's rule name of ``scheme`` (None: the
    API's default, the narrow rule)."""
    from .scale_rules import api_kwargs

    return api_kwargs("float32", getattr(scheme, "scale_rule", None)).get("scale_rule")


def group_of(shape, scheme) -> int:
    """The pass's group length along a row of a ``[rows, n]`` weight (``n`` per tensor or channel)."""
    return scheme.group_size if scheme.strategy == "group" else shape[1]


def encode(scheme, module, shape, out, scales, zps) -> dict:
    """The stored tensors of a weight from the pass's codes ``out`` (fp8 bytes, or int codes in
    compressed-tensors' words) and parameters, by ``scheme``'s layout."""
    if scheme.code.codec == "float8":
        return scheme.layout.encode(module, shape, scheme, out.view(scheme.code.host_array_dtype()), scales, zps)
    return scheme.layout.encode_words(module, shape, scheme, out.view(np.int32), scales, zps)


def block_args(shape, x_dtype, scheme) -> tuple:
    """``(code, symmetric, eps, scale_dtype)`` of the fp8 block pass over a weight of ``shape``
    and ``x_dtype`` in ``scheme``, as ``gpuq._qoptions.validate`` gives them (it reads no data)."""
    from .._qoptions import validate

    stand_in = np.broadcast_to(np.zeros((), x_dtype), shape)
    _, _, _, code, symmetric, eps, sdt, _ = validate(stand_in, None, None, tuple(scheme.block), scheme.code.name,
                                                     True, None, scheme.scale_dtype, "minmax")
    return code, symmetric, eps, sdt


def _blocks(x, scheme, module, buffers, device=None):
    """:func:`quantize_weight` of fp8 block scales (fine-grained fp8); a CUDA ``device`` takes
    the GPU's block kernel (:func:`gpuq.checkpoints.fused_cuda.quantize_blocks`, the same results)."""
    from ..backends.host import weight_pass

    code, symmetric, eps, sdt = block_args(x.shape, x.dtype, scheme)
    out = buffers.array("codes", x.shape, np.uint8)
    if getattr(device, "name", "cpu") == "cuda":
        from .fused_cuda import quantize_blocks
    else:
        quantize_blocks = weight_pass.quantize_blocks
    done = quantize_blocks(x, code, symmetric, eps, sdt, tuple(scheme.block), out)
    if done is None:
        return None
    scales, (signal, error, max_err), counts = done
    stats = _figures(signal, error, max_err, counts, x.size)
    codes = out.view(scheme.code.host_array_dtype())
    return scheme.layout.encode(module, x.shape, scheme, codes, scales, None), stats, counts


def _on_cuda(device) -> bool:
    return getattr(device, "name", "cpu") == "cuda"


def micro_kernel(scheme) -> bool:
    """Whether a microscaling ``scheme`` takes the GPU's microscaling kernel on a CUDA device
    (fp4/fp6 codes: ``weight_micro``); MXFP8 takes the GPU's fp8 pass under choose_qparams'
    e8m0 scales instead."""
    return getattr(scheme.layout, "one_pass", None) == "micro" and scheme.code.bits in (4, 6)


def _micro(x, scheme, module, buffers, global_scale, device=None):
    """:func:`quantize_weight` of fp4/fp6/fp8 codes under MX or NVFP4 scales (compressed-tensors'
    microscaling layouts): the scales chosen in the pass, the codes in their stored bytes."""
    if scheme.scale_dtype == _E4M3 and global_scale is None and not _on_cuda(device):
        global_scale = _global_scale(x)  # NVFP4: the tensor's global scale first (a reduction; the GPU's own)
    codes, sbytes, stats, counts, gs = micro_bytes(x, scheme, buffers, global_scale, device)
    two_level = {} if gs is None else {"global_scale": gs}
    return scheme.layout.encode_bytes(module, x.shape, scheme, codes, sbytes, **two_level), stats, counts


def micro_bytes(x, scheme, buffers=None, global_scale=None, device=None):
    """``(codes, scale_bytes, stats, counts, global_scale)`` of a ``[out, in]`` weight ``x`` in
    fp4/fp6/fp8 codes under MX scales (by ``scheme.scale_rule``) or NVFP4's (``global_scale``
    given; on a CUDA ``device`` None: the weight's own, computed on the GPU), as the
    multi-pass path forms them, in one pass (:func:`gpuq.backends.host.weight_pass.quantize_micro`,
    on a CUDA ``device`` :func:`gpuq.checkpoints.fused_cuda.quantize_micro`;
    the caller checks :func:`covers` first): the codes' bytes (uint8 ``[out, in * bits / 8]``, fp4
    two a byte with input ``2j`` in the low nibble, fp6 four in three bytes; in ``buffers``' memory
    where given, valid until its next weight), the scales' bytes (uint8 ``[out, in / group]``:
    e8m0, or NVFP4's e4m3), the report's figures, the NaN/Inf counts and NVFP4's global scale
    (None for MX).

    >>> from gpuq._codetypes import CODE_TYPES
    >>> from gpuq.checkpoints.serving.formats import WeightScheme
    >>> s = WeightScheme(CODE_TYPES["float4_e2m1fn"], "group", True, _E8M0, None, group_size=32)
    >>> codes, sb, stats, counts, gs = micro_bytes(np.float32([[3.0, -1.0] + [0.0] * 30]), s)
    >>> codes[0, 0], sb.tolist(), stats["error"], gs   # 3 = 6 * 2**-1: codes 7 (6.0) and 12 (-2.0)
    (np.uint8(199), [[126]], 0.0, None)
    """
    from ..backends.host import weight_pass

    rows, n = x.shape
    out = (buffers or Buffers()).array("codes", (rows, n * scheme.code.bits // 8), np.uint8)
    nvfp4 = scheme.scale_dtype == _E4M3
    kw = dict(global_scale=global_scale, mx_table=mx_table_of(scheme))
    if _on_cuda(device) and micro_kernel(scheme):  # the hook: the GPU's microscaling kernel
        from .fused_cuda import quantize_micro

        sbytes, (signal, error, max_err), counts, global_scale = quantize_micro(
            x, scheme.code, scheme.group_size, out, nvfp4=nvfp4, **kw)
    else:
        sbytes, (signal, error, max_err), counts = weight_pass.quantize_micro(x, scheme.code, scheme.group_size,
                                                                              out, **kw)
    return out, sbytes, _figures(signal, error, max_err, counts, x.size), counts, global_scale


def mx_table_of(scheme):
    """The MX rule table (:func:`gpuq._mx.mx_rule_table`) of a microscaling ``scheme`` by its
    ``scale_rule``; None for NVFP4's e4m3 scales."""
    from .._mx import DEFAULT_RULE, mx_rule_table

    if scheme.scale_dtype == _E4M3:
        return None
    return mx_rule_table(scheme.code.name, scheme.scale_rule or DEFAULT_RULE)


def _global_scale(x) -> np.float32:
    """:func:`gpuq.global_scale` of ``x``'s finite values, from the pass's own reduction."""
    import gpuq

    return gpuq.global_scale(amax=finite_amax(x), float_dtype=x.dtype)


def finite_amax(x):
    """``max |x|`` (float32) over the finite values of a 2-D weight ``x`` by the compiled
    reduction (order keys of the stored bits, no float32 copy); None where it does not serve
    (NumPy-only hosts, other dtypes or layouts: the caller reduces it itself).

    >>> finite_amax(np.float32([[1.0, np.nan], [-2.0, np.inf]]))
    np.float32(2.0)
    """
    from ..backends.host import choice, weight_pass

    if (choice.kernels() is None or not isinstance(x, np.ndarray) or x.ndim != 2 or not x.size
            or not x.flags.c_contiguous or not (is_bfloat16(x.dtype) or x.dtype in (np.float16, np.float32))):
        return None
    return weight_pass.weight_amax(x)


def _figures(signal, error, max_err, counts, size) -> dict:
    if sum(counts.values()) == size:  # nothing finite to compare: no number is right
        signal = error = max_err = math.nan
    return {"signal": signal, "error": error, "max_abs_error": max_err}


def _chosen(x, x2d, dtype, symmetric, scale_dtype, scale_rule, kw, method, device=None):
    """``(scales, zps)`` of :func:`gpuq.choose_qparams` over ``x`` (``x2d`` its ``[rows, n]``
    view) by ``method`` (the MSE search, or MX's min/max rule), as the multi-pass path chooses
    them: from the finite values (NaN/Inf replaced by 0 where there are any), on a CUDA
    ``device`` on the GPU (host arrays back); None where the call refuses (the multi-pass path
    then says why)."""
    import gpuq

    from ..backends.host.weight_pass import nonfinite_in

    pd = finite_part(x) if nonfinite_in(x2d) else x
    cuda = getattr(device, "name", "cpu") == "cuda"
    try:
        scales, zps = gpuq.choose_qparams(device.put(pd) if cuda else pd, dtype=dtype, symmetric=symmetric,
                                          scale_dtype=scale_dtype, method=method, **kw,
                                          **({} if scale_rule is None else {"scale_rule": scale_rule}))
    except ValueError:
        return None
    return (device.get(scales), device.get(zps)) if cuda else (scales, zps)


def _run(x, dtype, symmetric, scale_dtype, strategy, g, scale_rule, buffers, packing, given=None, device=None):
    """The pass over a C-order ``[rows, n]`` ``x``: ``(out, code, scales, zps, stats, counts)``
    (``out`` the codes in ``buffers``' ``"codes"``: fp8 bytes, or int codes as ``packing`` lays
    them out, :func:`gpuq.backends.host.weight_pass.quantize_rows`), or None where a scale is
    refused; a CUDA ``device`` takes the GPU's pass (``packing`` ``"words"``)."""
    from ..backends.host import weight_pass

    code, symmetric, eps, sdt = pass_args(x.shape, x.dtype, dtype, symmetric, scale_dtype, strategy, g, scale_rule)
    rows, n = x.shape
    if code.codec == "float8":
        out = buffers.array("codes", (rows, n), np.uint8)
    elif packing == "words":
        out = buffers.array("codes", (rows, -(-n * code.bits // 32)), np.uint32)
    else:
        out = buffers.array("codes", (rows, n * code.bits // 8), np.uint8)
    if getattr(device, "name", "cpu") == "cuda":  # the hook: the GPU's pass, the host pass's interface
        from .fused_cuda import quantize_rows

        done = quantize_rows(x, code, symmetric, eps, sdt, g, strategy == "tensor", out, given)
    else:
        done = weight_pass.quantize_rows(x, code, symmetric, eps, sdt, g, strategy == "tensor", out, packing, given)
    if done is None:
        return None
    scales, zps, (signal, error, max_err), counts = done
    return out, code, scales, zps, _figures(signal, error, max_err, counts, x.size), counts


def pass_args(shape, x_dtype, dtype, symmetric, scale_dtype, strategy, g, scale_rule) -> tuple:
    """``(code, symmetric, eps, scale_dtype)`` of the pass over a ``[rows, n]`` weight of
    ``shape`` and ``x_dtype`` as ``gpuq._qoptions.validate`` gives them (it reads no data)."""
    from .._qoptions import validate

    axis = {"tensor": None, "channel": 0, "group": 1}[strategy]
    stand_in = np.broadcast_to(np.zeros((), x_dtype), shape)
    _, _, _, code, symmetric, eps, sdt, _ = validate(stand_in, axis, g if strategy == "group" else None, None,
                                                     dtype, symmetric, None, scale_dtype, "minmax", scale_rule)
    return code, symmetric, eps, sdt


def file_geometry(shape, scheme: dict):
    """``(rows, n, strategy, g)`` of a gpuq-file tensor of ``shape`` under ``scheme`` (a dict,
    :mod:`gpuq.checkpoints.quantized`) as the pass sees it, the tensor as ``[rows, n]`` rows of
    its last dimension; None where the scheme is none the pass takes.

    >>> file_geometry((4, 256), {"dtype": "int8", "axis": 0, "group_size": None})
    (4, 256, 'channel', 256)
    >>> file_geometry((2, 4, 256), {"dtype": "int4", "axis": 2, "group_size": 128})
    (8, 256, 'group', 128)
    >>> file_geometry((4, 256), {"dtype": "int8", "axis": 1, "group_size": None}) is None  # per column
    True
    """
    rank = len(shape)
    if rank == 0 or scheme.get("block_size") is not None or "scale_dtype" in scheme:
        return None
    n, rows = shape[-1], math.prod(shape[:-1])
    axis, group = scheme["axis"], scheme["group_size"]
    if axis is None:
        return rows, n, "tensor", n
    if group is None:  # one scale a row of the last dimension: axis 0 of a matrix, or axes [0, rank - 1)
        chan = axis == 0 if rank == 2 else axis == list(range(rank - 1))
        return (rows, n, "channel", n) if chan else None
    if axis == rank - 1 and n % group == 0:
        return rows, n, "group", group
    return None


def covers_file(x, scheme: dict, device, method: str) -> bool:
    """Whether :func:`quantize_file_tensor` takes tensor ``x`` of a gpuq file in ``scheme`` (see
    the module docstring).

    >>> from gpuq.checkpoints.env import HostDevice
    >>> s = {"dtype": "int4", "symmetric": True, "axis": 1, "group_size": 128}
    >>> covers_file(np.zeros((2, 256), np.float32), s, HostDevice(), "minmax")
    True
    >>> covers_file(np.zeros((2, 256), np.float64), s, HostDevice(), "minmax")
    False
    """
    from .._codetypes import CODE_TYPES
    from ..backends.host import choice

    if device.name != "cpu" or method not in ("minmax", "mse") or choice.kernels() is None:
        return False
    if not isinstance(x, np.ndarray) or x.size == 0 or not x.flags.c_contiguous:
        return False
    if not (is_bfloat16(x.dtype) or x.dtype in (np.float16, np.float32)):
        return False
    geometry = file_geometry(x.shape, scheme)
    code = CODE_TYPES.get(scheme["dtype"])
    if geometry is None or code is None or code.bits not in (4, 8):
        return False
    _, n, _, g = geometry
    if code.codec == "float8":
        return code.bits == 8
    return code.bits == 8 or (n % 2 == 0 and g % 2 == 0)  # nibbles: each row and group starts on a byte


def quantize_file_tensor(x, scheme: dict, fmt: str, buffers=None, method="minmax"):
    """``(codes, scales, zps, stats, counts)`` of tensor ``x`` in a gpuq file of format ``fmt``
    (``"safetensors"`` or ``"npz"``), as the multi-pass path stores them (the same bytes; the
    sums of ``stats`` in another order): the codes in their stored dtype and shape
    (:func:`gpuq.checkpoints.quantized.codes_dtype`; in ``buffers``' memory where given, valid
    until its next weight), float32 scales in the parameters' shape, zero points in their
    stored dtype or None. None where a scale is refused (the multi-pass path says which).
    ``method`` ``"mse"``: the MSE search's scales, then the pass. The caller checks
    :func:`covers_file` first.

    >>> s = {"dtype": "int4", "symmetric": True, "axis": 1, "group_size": 2}
    >>> codes, scales, zps, stats, counts = quantize_file_tensor(np.float32([[7.0, -3.5]]), s, "npz")
    >>> codes.tolist(), scales.tolist(), zps, stats["error"]
    ([199], [[1.0]], None, 0.25)
    """
    from .quantized import codes_dtype, codes_shape, param_shape, scheme_kw, zps_dtype
    from .scale_rules import api_kwargs

    rows, n, strategy, g = file_geometry(x.shape, scheme)
    rule = api_kwargs("float32", scheme.get("scale_rule")).get("scale_rule")
    x2d, given = x.reshape(rows, n), None
    if method == "mse":
        given = _chosen(x, x2d, scheme["dtype"], scheme["symmetric"], "float32", rule, scheme_kw(scheme), "mse")
        if given is None:
            return None
    done = _run(x2d, scheme["dtype"], scheme["symmetric"], "float32", strategy, g, rule,
                buffers or Buffers(), "bytes", given)
    if done is None:
        return None
    out, _, scales, zps, stats, counts = done
    dtype = scheme["dtype"]
    codes = out.view(codes_dtype(dtype, fmt)).reshape(codes_shape(dtype, x.shape))
    pshape = param_shape(x.shape, scheme["axis"], scheme["group_size"])
    if zps is not None:
        zps = zps.astype(zps_dtype(dtype)).reshape(pshape)  # in the code range: finalize_one clamps them
    return codes, scales.reshape(pshape), zps, stats, counts
