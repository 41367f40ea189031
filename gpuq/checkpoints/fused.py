"""The one-pass quantization of a model-folder weight on the host (issue 40, point 1).

:func:`quantize_weight` hands a ``[out, in]`` weight to the compiled pass
(:func:`gpuq.backends.host.weight_pass.weight_rows`), which reads the stored bits (bfloat16,
float16, float32), chooses the scales, writes the codes in the format's final layout and
sums the report's figures at once; it returns None for any case that pass does not cover,
and the caller then takes the multi-pass path (:func:`gpuq.checkpoints.serving.quantize.quantize_weight`),
whose bytes it reproduces exactly. Covered: the host device with the compiled loops,
``--calibrate minmax``, per-tensor, per-channel or per-group scales in bfloat16, float16 or float32,
compressed-tensors' ``pack-quantized`` int codes of 4 or 8 bits (symmetric or with zero points,
each group starting on a word) and ``naive-quantized`` fp8; on a CUDA device the same cases go
through the GPU's pass (:mod:`gpuq.checkpoints.fused_cuda`, the hook in :func:`covers` and
:func:`quantize_weight`). Everything else (block scales, fine-grained fp8, the MSE search,
float64 weights, NumPy-only hosts, gpuq's own files) keeps the multi-pass path.

:class:`Buffers` holds the read and write buffers a run reuses from weight to weight.
"""

from __future__ import annotations

import math

import numpy as np

from .._dtypes import is_bfloat16

_SCALE_DTYPES = ("bfloat16", "float16", "float32")


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

    def load(self, ckpt, name: str) -> np.ndarray:
        """Tensor ``name`` of the open checkpoint ``ckpt``, read into the ``"in"`` buffer (valid
        until the next load); a fresh array where the file is no plain safetensors."""
        if ckpt.format != "safetensors":
            return ckpt.load(name)
        shape, dtype = ckpt.spec(name)
        return ckpt.load(name, out=self.array("in", shape, dtype))


def covers(x, scheme, device, method: str) -> bool:
    """Whether :func:`quantize_weight` takes weight ``x`` in ``scheme`` (see the module docstring).

    >>> from gpuq.checkpoints.env import HostDevice
    >>> from gpuq.checkpoints.formats.compressed_tensors import PACK
    >>> from gpuq.checkpoints.serving.formats import WeightScheme, int_code
    >>> s = WeightScheme(int_code(4), "group", True, "bfloat16", PACK, group_size=128)
    >>> covers(np.zeros((2, 256), np.float32), s, HostDevice(), "minmax")
    True
    >>> covers(np.zeros((2, 256), np.float32), s, HostDevice(), "mse")
    False
    """
    from ..backends.host import choice

    if device.name == "cuda":  # the GPU's pass (gpuq.checkpoints.fused_cuda): its own conditions, then the layout's
        from .fused_cuda import device_covers

        if not device_covers(x, scheme, method):
            return False
    elif device.name != "cpu" or method != "minmax" or choice.kernels() is None:
        return False
    if not isinstance(x, np.ndarray) or x.ndim != 2 or x.size == 0 or not x.flags.c_contiguous:
        return False
    if not (is_bfloat16(x.dtype) or x.dtype in (np.float16, np.float32)):
        return False
    if scheme.scale_dtype not in _SCALE_DTYPES or scheme.strategy not in ("tensor", "channel", "group"):
        return False
    n = x.shape[1]
    g = scheme.group_size if scheme.strategy == "group" else n
    if n % g:
        return False
    code, one_pass = scheme.code, getattr(scheme.layout, "one_pass", None)  # the layout says what it takes
    if one_pass == "words":
        return code.codec == "affine" and code.bits in (4, 8) and (g == n or g % (32 // code.bits) == 0)
    return one_pass == "bytes" and code.codec == "float8" and scheme.symmetric


def quantize_weight(x, scheme, module: str, *, scale_rule=None, buffers=None, device=None):
    """``(tensors, stats, counts)`` of weight ``x`` as the multi-pass path gives them (the same
    bytes; the sums of ``stats`` in another order), in one pass; None where that pass refuses
    a group's parameters (a scale the scale dtype cannot hold: the multi-pass path then says
    which). The caller checks :func:`covers` first. ``scale_rule`` is ``choose_qparams``' (None
    or ``"full"``; None takes the scheme's ``scale_rule`` where it has one); ``buffers`` a
    :class:`Buffers` for the codes (a fresh array without); ``device`` the run's (a CUDA one
    takes the GPU's pass, :mod:`gpuq.checkpoints.fused_cuda`).

    >>> from gpuq.checkpoints.formats.compressed_tensors import PACK
    >>> from gpuq.checkpoints.serving.formats import WeightScheme, int_code
    >>> x = np.array([[0.5, -1.0], [2.0, 4.0]], np.float32)
    >>> s = WeightScheme(int_code(8), "channel", True, "float32", PACK)
    >>> t, stats, counts = quantize_weight(x, s, "m")
    >>> t["m.weight_scale"].ravel().tolist(), counts
    ([0.007874015718698502, 0.031496062874794006], {'nan': 0, 'posinf': 0, 'neginf': 0})
    """
    from .._qoptions import validate
    from ..backends.host import weight_pass

    buffers = buffers or Buffers()
    if scale_rule is None:  # the command's rule name ("narrow" is the API's default, None)
        from .scale_rules import api_kwargs

        scale_rule = api_kwargs("float32", getattr(scheme, "scale_rule", None)).get("scale_rule")
    kw = scheme.api_kwargs()
    stand_in = np.broadcast_to(np.zeros((), x.dtype), x.shape)  # validate reads no data
    _, _, _, code, symmetric, eps, sdt, _ = validate(stand_in, kw["axis"], kw["group_size"], None,
                                                     scheme.code.name, scheme.symmetric, None,
                                                     scheme.scale_dtype, "minmax", scale_rule)
    rows, n = x.shape
    fp8 = code.codec == "float8"
    if fp8:
        out = buffers.array("codes", (rows, n), np.uint8)
    else:
        out = buffers.array("codes", (rows, -(-n * code.bits // 32)), np.uint32)
    g = scheme.group_size if scheme.strategy == "group" else n
    quantize_rows = weight_pass.quantize_rows
    if getattr(device, "name", "cpu") == "cuda":  # the hook: the GPU's pass, the same interface
        from .fused_cuda import quantize_rows
    done = quantize_rows(x, code, symmetric, eps, sdt, g, scheme.strategy == "tensor", out)
    if done is None:
        return None
    scales, zps, (signal, error, max_err), counts = done
    if sum(counts.values()) == x.size:  # nothing finite to compare: no number is right
        signal = error = max_err = math.nan
    stats = {"signal": signal, "error": error, "max_abs_error": max_err}
    if fp8:
        codes = out.view(scheme.code.host_array_dtype())
        tensors = scheme.layout.encode(module, x.shape, scheme, codes, scales, zps)
    else:
        tensors = scheme.layout.encode_words(module, x.shape, scheme, out.view(np.int32), scales, zps)
    return tensors, stats, counts
