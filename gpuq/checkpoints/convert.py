"""The work behind ``gpuq quantize`` and ``gpuq dequantize``: one tensor at a time.

Both commands stream: the output's index is declared before any data (see
:func:`gpuq.checkpoints.files.checkpoint_writer`), then each input tensor is read at
its offset, converted, written at its place in the output and dropped. Peak
memory is about the largest tensor's input plus its output plus a fixed
overhead (Python, NumPy, the compiled loops, and bounded scratch for the
error statistics), whatever the size of the file.

The file layout is in :mod:`gpuq.checkpoints.quantized`; a file to dequantize is
checked against it before anything is written.

Non-finite inputs (``--nonfinite``): a tensor's NaN and +/-Inf values are
counted before it is quantized. ``error`` refuses such a tensor; ``warn``
(the default) and ``allow`` quantize it with parameters computed from its
finite values, and the codes of the non-finite values then follow the
library's contract (NaN -> the zero point, +Inf -> qmax, -Inf -> qmin; fp8:
NaN stays NaN, +-Inf -> +-max finite; fp4/fp6: NaN -> 0, +-Inf -> +-max);
``warn`` says so on stderr. The report counts them per tensor, and its SQNR
and max error are over the finite values.
"""

from __future__ import annotations

import math
import sys

import numpy as np

from .files import Checkpoint, CliError, check_output, checkpoint_writer, file_format
from .fused import finite_part  # noqa: F401 (the callers' name for it: here since the one pass needs it too)
from .._codetypes import CODE_TYPES
from .quantized import (api_scales, check_file, code_range, companion_names, is_float8, is_packed,
                        scheme_kw, check_values, codes_dtype, file_meta, has_global_scale, has_zps,
                        logical_shape, output_entries, param_suffixes, stored_scales, zps_dtype)
from .scale_rules import choose_kwargs, is_small_float
from .report import natural_key, nonfinite_text
from .selection import check_names, describe, select
from .stops import complete

NONFINITE_POLICIES = ("error", "warn", "allow")
#: Elements per block of the error statistics: bounds their float64 scratch (~10 MB).
_BLOCK = 1 << 18


class _NoBar:
    def update(self, n=1, name=None):
        pass

    def close(self):
        pass


class _TqdmBar:
    def __init__(self, bar):
        self.bar = bar

    def update(self, n=1, name=None):
        self.bar.update(n)

    def close(self):
        self.bar.close()


class _CallbackBar:
    """Calls ``callback(done, total, name)`` after each tensor (``name`` None for a batch)."""

    def __init__(self, total, callback):
        self.total, self.done, self.callback = total, 0, callback

    def update(self, n=1, name=None):
        self.done += n
        self.callback(self.done, self.total, name)

    def close(self):
        pass


def progress_bar(total: int, enabled, desc: str):
    """A bar over ``total`` tensors (``update(n, name)``, ``close()``): ``enabled`` False for none,
    True for a tqdm bar on stderr, or a callable ``(done, total, name)`` called after each tensor.

    >>> bar = progress_bar(3, False, "quantize"); bar.update(1, "w"); bar.close()
    >>> bar = progress_bar(3, lambda *a: print(a), "quantize"); bar.update(1, "w")
    (1, 3, 'w')
    """
    if callable(enabled):
        return _CallbackBar(total, enabled)
    if not enabled:
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:  # the bar is a nicety: no tqdm, no bar
        return _NoBar()
    return _TqdmBar(tqdm(total=total, desc=desc, unit="tensor", file=sys.stderr, leave=False))


def float_dtype(name: str) -> np.dtype:
    """The NumPy dtype of a float type name; bfloat16 through ml_dtypes (the cli extra).

    >>> float_dtype("bfloat16").name, float_dtype("float16").name
    ('bfloat16', 'float16')
    """
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


#: Output types of gpuq dequantize (the --dtype choices, and the source types it restores).
DEQUANTIZE_DTYPES = ("bfloat16", "float16", "float32", "float64")


def row_blocks(shape: tuple, scheme: dict, target: int = _BLOCK):
    """``(r0, r1)`` row ranges (along axis 0) of about ``target`` elements each.

    With groups along axis 0 a block starts at a multiple of the group size,
    so each block's scales are a slice of the tensor's (:func:`param_rows`).
    For packed int4/uint4 codes a block starts at an even element, so its
    codes are whole bytes of the packed ones (:func:`code_rows`).

    >>> list(row_blocks((10, 3), {"axis": 0, "group_size": 4}, target=6))
    [(0, 4), (4, 8), (8, 10)]
    >>> list(row_blocks((5, 3), {"dtype": "int4", "axis": 1, "group_size": None}, target=3))
    [(0, 2), (2, 4), (4, 5)]
    """
    rows = shape[0] if shape else 1
    per_row = math.prod(shape[1:]) if shape else 1
    step = max(1, target // max(per_row, 1))
    g = scheme.get("group_size")
    mult = g if scheme.get("axis") == 0 and g is not None else 1
    block = scheme.get("block_size")
    if block is not None and shape:  # whole blocks along axis 0 (-1: the whole axis)
        mult = rows if block[0] == -1 else min(block[0], max(rows, 1))
    if is_packed(scheme.get("dtype")) and per_row % 2:
        mult = math.lcm(mult, 2)
    step = max(mult, step // mult * mult)
    for r0 in range(0, rows, step):
        yield r0, min(rows, r0 + step)


def param_rows(p, scheme: dict, r0: int, r1: int):
    """The scales (or zero points) of rows ``r0:r1`` of the tensor, for the same scheme.

    >>> s = np.arange(6).reshape(3, 2)     # per-group scales of a (6, 4) tensor, axis 0, g=2
    >>> param_rows(s, {"axis": 0, "group_size": 2}, 2, 6)
    array([[2, 3],
           [4, 5]])
    >>> param_rows(s, {"axis": [0, 2], "group_size": None}, 1, 2)   # a (3, 5, 2) tensor's
    array([[2, 3]])
    """
    axis, g = scheme.get("axis"), scheme.get("group_size")
    block = scheme.get("block_size")
    if block is not None:  # block scales keep every dim: rows of blocks along dim 0
        b = block[0] if block[0] != -1 else max(r1, 1)
        return p if p is None else p[r0 // b: -(-r1 // b)]
    if isinstance(axis, list):  # the scales' first dimension is dim 0's only if 0 is an axis
        return p if p is None or 0 not in axis else p[r0:r1]
    if p is None or axis is None or (axis != 0 and g is None):
        return p  # per-tensor, or one scale per channel of another axis: all rows share them
    if axis == 0 and g is not None:
        return p[r0 // g: -(-r1 // g)]
    return p[r0:r1]  # per-channel along axis 0, or groups along another axis (dim 0 kept)


def code_rows(q, r0: int, r1: int):
    """Rows ``r0:r1`` (along axis 0) of codes ``q``: an array, or a :class:`gpuq.Codes`
    (packed int4/uint4: the whole bytes of those rows, which :func:`row_blocks` makes
    start at an even element; fp8 bits on a GPU).

    >>> import gpuq
    >>> c = gpuq.pack(np.arange(-6, 4, dtype=np.int8).reshape(5, 2))
    >>> gpuq.unpack(code_rows(c, 2, 4)).tolist()
    [[-2, -1], [0, 1]]
    """
    import gpuq

    if not isinstance(q, gpuq.Codes):
        return q[r0:r1]
    rest = tuple(q.shape[1:])
    if is_packed(q.dtype):
        per_row = math.prod(rest)
        a, b = r0 * per_row, r1 * per_row
        return gpuq.Codes(q.data[a // 2:(b + 1) // 2], (r1 - r0, *rest), q.dtype)
    return gpuq.Codes(q.data[r0:r1], (r1 - r0, *rest), q.dtype)


def count_nonfinite(x: np.ndarray) -> dict:
    """NaN, +Inf and -Inf counts of a host float array, read block by block.

    >>> count_nonfinite(np.array([[1, np.nan], [np.inf, np.nan]], np.float32))
    {'nan': 2, 'posinf': 1, 'neginf': 0}
    """
    counts = {"nan": 0, "posinf": 0, "neginf": 0}
    flat = x.ravel(order="K")  # a view for C- or Fortran-ordered arrays
    for i in range(0, flat.size, _BLOCK):
        blk = flat[i:i + _BLOCK]
        with np.errstate(invalid="ignore"):  # a signalling NaN raises the invalid flag: counted here
            if np.isfinite(blk).all():
                continue
            counts["nan"] += int(np.count_nonzero(np.isnan(blk)))
            counts["posinf"] += int(np.count_nonzero(blk == np.inf))
            counts["neginf"] += int(np.count_nonzero(blk == -np.inf))
    return counts


def error_stats(x, q, scales, zps, scheme: dict, *, get=np.asarray,
                finite_only: bool = False) -> dict:
    """Signal and error energy and max abs error of the float32 dequantization of ``q``.

    ``x`` is the host float tensor; ``q``, ``scales`` and ``zps`` are where the
    work ran (host or device: ``get`` brings an array to the host). Row block
    by row block (:func:`row_blocks`), ``q`` is dequantized with
    :func:`gpuq.dequantize` (what ``gpuq dequantize`` writes by default) and
    compared with ``x`` in float64, so the scratch stays small on big tensors.
    ``finite_only`` leaves out the elements where ``x`` is not finite.

    >>> import gpuq
    >>> x = np.array([[3.0, 4.0], [1.0, -2.0]], np.float32)
    >>> scheme = {"axis": 0, "group_size": None}
    >>> s = error_stats(x, gpuq.quantize(x, [0.5, 1.0], axis=0), np.float32([0.5, 1.0]), None, scheme)
    >>> s["signal"], s["error"], s["max_abs_error"]
    (30.0, 0.0, 0.0)
    """
    import gpuq

    kw = scheme_kw(scheme)
    signal = error = max_err = 0.0
    compared = 0
    for r0, r1 in row_blocks(x.shape, scheme):
        x_hat = get(gpuq.dequantize(code_rows(q, r0, r1), param_rows(scales, scheme, r0, r1),
                                    param_rows(zps, scheme, r0, r1), dtype="float32", **kw))
        with np.errstate(invalid="ignore"):  # signalling NaNs: counted and reported already
            a = x[r0:r1].astype(np.float64).reshape(-1)
            d = a - x_hat.astype(np.float64).reshape(-1)
            if finite_only:
                keep = np.isfinite(a)
                a, d = a[keep], d[keep]
        compared += a.size
        if a.size:
            # einsum's own loop, not BLAS: np.dot's threads wait on the host backend's pool
            # after a quantize (3 ms instead of 20 us per block here).
            signal += float(np.einsum("i,i->", a, a))
            error += float(np.einsum("i,i->", d, d))
            max_err = max(max_err, float(np.abs(d).max()))
    if compared == 0 and x.size:  # nothing finite to compare: no number is right
        return {"signal": math.nan, "error": math.nan, "max_abs_error": math.nan}
    return {"signal": signal, "error": error, "max_abs_error": max_err}


def sqnr_db(signal: float, error: float) -> float:
    """``10*log10(signal/error)``; ``inf`` when the round trip is exact (error 0).

    >>> sqnr_db(1.0, 0.0), sqnr_db(100.0, 1.0)
    (inf, 20.0)
    """
    if math.isnan(signal) or math.isnan(error):
        return math.nan
    if error == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / error)


def quantize_tensor(x, scheme: dict, device, *, name: str = "x", nonfinite: str = "warn",
                    calibrate: str = "minmax"):
    """Codes, scales, zps (on the host; zps None where the scheme has none), error stats, counts.

    The codes are what :func:`gpuq.quantize` returns, brought to the host: an
    int8/uint8 array, an ml_dtypes fp8 array, or a :class:`gpuq.Codes` of
    packed int4/uint4 bytes (:func:`stored_codes` gives what the file holds).

    ``x`` (float16, float32, float64 or bfloat16: gpuq takes bfloat16 as it is, no
    float32 copy of the tensor) is taken over. Parameters come from :func:`gpuq.choose_qparams`; for
    a tensor with NaN or +/-Inf they are computed on a copy with those values
    replaced by 0, which changes nothing else: an asymmetric range always
    includes 0 and a symmetric one is ``max |x|``, so these are the parameters
    of the finite values. The codes come from :func:`gpuq.quantize` on ``x``
    itself, so NaN gives the zero point and +/-Inf saturate, as the contract says.

    The scheme's scale keys choose the scales (:func:`gpuq.checkpoints.scale_rules.choose_kwargs`:
    the full-range rule, MX, NVFP4). NVFP4's global scale comes back in ``stats["global_scale"]``,
    and the scales are its e4m3 block scales (the statistics use ``float32(s_b / gs)``).

    ``calibrate`` is ``choose_qparams``' ``method`` (``"minmax"`` or ``"mse"``). Under
    ``"mse"`` the replaced values are zeros of the copy, and a zero's round trip is exact
    (0 quantizes to the zero point and comes back as 0), so each adds exactly +0 to its
    block's error sum: the search sums over the finite values only, as if they were absent.

    >>> from gpuq.checkpoints.env import HostDevice
    >>> x = np.array([[0.5, np.nan], [-1.0, 2.0]], np.float32)
    >>> q, s, z, stats, counts = quantize_tensor(
    ...     x, {"dtype": "int8", "symmetric": True, "axis": None, "group_size": None}, HostDevice())
    >>> q.tolist(), counts["nan"]
    ([[32, 0], [-64, 127]], 1)
    """
    import gpuq

    from .._nvfp4 import block_scales
    from ..qparams import choose_qparams

    kw = scheme_kw(scheme)
    counts = count_nonfinite(x)
    bad = sum(counts.values())
    if bad and nonfinite == "error":
        raise _refused(name, counts)
    xd = device.put(x)
    # Parameters of the finite values: the same tensor with NaN/Inf replaced by 0.
    pd = device.put(finite_part(x)) if bad else xd
    rule_kw = choose_kwargs(scheme, pd)
    scales, zps = choose_qparams(pd, dtype=scheme["dtype"], symmetric=scheme["symmetric"], method=calibrate,
                                 **kw, **rule_kw)
    del pd
    gs = rule_kw.get("global_scale")
    q = gpuq.quantize(xd, scales, zps, dtype=scheme["dtype"], **kw,
                      **({} if gs is None else {"global_scale": gs}))
    del xd
    block = scales if gs is None else block_scales(scales, gs)
    stats = error_stats(x, q, block, zps, scheme, get=device.get, finite_only=bool(bad))
    if gs is not None:
        stats["global_scale"] = gs
    scales = np.asarray(device.get(scales), np.float32)
    if zps is not None:
        zps = _narrow(np.asarray(device.get(zps)), scheme["dtype"], name)
    return host_codes(q, device), scales, zps, stats, counts


def _refused(name, counts) -> CliError:
    """``--nonfinite error``'s refusal of tensor ``name`` with these NaN/Inf ``counts``."""
    return CliError(f"tensor {name!r} has {nonfinite_text(counts)}; --nonfinite warn or "
                    f"allow quantizes it with parameters from its finite values")


def host_codes(q, device):
    """Codes of :func:`gpuq.quantize` on the host: NumPy arrays (fp8: ml_dtypes'), or a
    :class:`gpuq.Codes` with NumPy data for int4/uint4."""
    import gpuq

    if not isinstance(q, gpuq.Codes):
        return device.get(q)
    data = np.ascontiguousarray(device.get(q.data))
    if is_float8(q.dtype) and not is_packed(q.dtype):  # fp8/fp6 bits from a GPU array library
        return data.view(CODE_TYPES[q.dtype].host_array_dtype()).reshape(q.shape)
    return gpuq.Codes(data, q.shape, q.dtype)


def stored_codes(q, scheme: dict, fmt: str):
    """What the file holds for host codes ``q`` (see :mod:`gpuq.checkpoints.quantized`): the packed
    bytes of int4/uint4/fp4, the uint8 bits of fp8 in an .npz and of fp6, else ``q`` itself.

    >>> import gpuq
    >>> stored_codes(gpuq.pack(np.array([1, -2, 3], np.int8)), {"dtype": "int4"}, "npz")
    array([225,   3], dtype=uint8)
    """
    if is_packed(scheme["dtype"]):
        return q.data
    if is_float8(scheme["dtype"]) and codes_dtype(scheme["dtype"], fmt) == np.uint8:
        return q.view(np.uint8)
    return q


def api_codes(stored, scheme: dict, device):
    """The codes to hand :func:`gpuq.dequantize` for a stored codes tensor, on ``device``."""
    import gpuq

    dtype = scheme["dtype"]
    if is_packed(dtype):
        return gpuq.Codes(device.put(stored), tuple(scheme["shape"]), dtype)
    if is_float8(dtype):
        bits = stored.view(np.uint8)
        if device.xp is np:
            return bits.view(CODE_TYPES[dtype].host_array_dtype())  # an ml_dtypes fp8/fp6 array
        return gpuq.Codes(device.put(bits), tuple(bits.shape), dtype)
    return device.put(stored)


def _narrow(zps, code: str, name):
    """Zero points in their stored dtype (int8 for int8/int4, uint8 for uint8/uint4).

    choose_qparams clamps zero points to the code range, so they always fit.

    >>> _narrow(np.array([0, 255], np.int32), "uint8", "w").dtype
    dtype('uint8')
    >>> _narrow(np.array([-8, 7], np.int32), "int4", "w").dtype
    dtype('int8')
    """
    dt = zps_dtype(code)
    lo, hi = code_range(code)
    if zps.size and (int(zps.min()) < lo or int(zps.max()) > hi):
        raise CliError(f"tensor {name!r}: zero points outside {code} [{lo}, {hi}]: "
                       f"[{int(zps.min())}, {int(zps.max())}]")
    return zps.astype(dt)


def _out_format(in_fmt, out_path, *, npy_ok):
    out_fmt = file_format(out_path, "OUT")
    allowed = {in_fmt} | ({"npz"} if in_fmt == "npy" else set()) | ({"npy"} if npy_ok else set())
    if in_fmt == "npy":
        allowed.discard("npy")
    if out_fmt not in allowed:
        want = " or ".join("." + f for f in sorted(allowed))
        why = (" (a .npy holds one array; the codes, scales and zps go in an .npz)"
               if in_fmt == "npy" else "")
        raise CliError(f"OUT {out_path!r} must be {want} for a .{in_fmt} IN{why}")
    return out_fmt


def run_quantize(in_path, out_path, plan, *, include=(), exclude=(), min_size, device,
                 progress=True, nonfinite="warn", warn=None, calibrate="minmax") -> dict:
    """Quantize a checkpoint file; return the report (see :mod:`gpuq.checkpoints.report`).

    ``nonfinite`` is the policy for tensors with NaN/Inf (``"error"``, ``"warn"``,
    ``"allow"``); ``warn`` is called with one line of text per such tensor
    under ``"warn"``.
    """
    check_nonfinite(nonfinite)
    in_fmt = file_format(in_path, "IN")
    out_fmt = _out_format(in_fmt, out_path, npy_ok=False)
    with Checkpoint(in_path) as ckpt:
        check_output(out_path, out_fmt, in_path)
        if ckpt.meta is not None:
            raise CliError(f"IN {in_path!r} is already quantized by gpuq; dequantize it first")
        specs = {n: ckpt.spec(n) for n in ckpt.names}
        schemes = plan_schemes(specs, plan, include=include, exclude=exclude, min_size=min_size)
        bar = progress_bar(len(specs), progress, "quantize")
        try:
            rows = quantize_file(ckpt, out_path, out_fmt, schemes, device=device,
                                 nonfinite=nonfinite, warn=warn, tick=lambda name: bar.update(1, name),
                                 calibrate=calibrate)
            complete(out_path)
        finally:
            bar.close()
    return _report("quantize", in_path, out_path, device, rows)


def check_nonfinite(nonfinite: str) -> None:
    """Refuse an unknown ``--nonfinite`` policy."""
    if nonfinite not in NONFINITE_POLICIES:
        raise CliError(f"--nonfinite must be one of {', '.join(NONFINITE_POLICIES)}")


def plan_schemes(specs: dict, plan, *, include=(), exclude=(), min_size) -> dict:
    """``{name: scheme}`` of the tensors to quantize among ``specs`` (name -> (shape, dtype)).

    Every check (the patterns, the names of the companions, the axis of each
    chosen tensor) runs here, before any work.
    """
    chosen = select(specs, include=include, exclude=exclude, min_size=min_size)
    schemes = {n: plan.for_shape(n, specs[n][0]) for n in chosen}
    check_names(list(specs), chosen, param_suffixes(next(iter(schemes.values()))) if schemes else ())
    return schemes


def quantize_file(ckpt, out_path, out_fmt, schemes, *, device, nonfinite="warn", warn=None,
                  tick=None, calibrate="minmax") -> list:
    """Quantize the tensors of the open checkpoint ``ckpt`` named in ``schemes`` into ``out_path``.

    Every other tensor is copied. The output is streamed and atomic
    (:func:`gpuq.checkpoints.files.checkpoint_writer`); its bytes depend only on
    ``ckpt``, ``schemes``, ``out_fmt`` and ``calibrate`` (the parameters' method, which the
    file does not record: its scales are ordinary ones), which is what makes a shard
    written on a cluster worker the same file as one written here.
    ``tick(name)`` is called after each tensor is written. Returns the
    report rows (unsorted, with the private ``_signal``/``_error`` keys
    :func:`finish_report` sums).
    """
    from .fused import Buffers

    specs = {n: ckpt.spec(n) for n in ckpt.names}
    # Every output entry is known from the input's index: the header goes first.
    entries, meta = quantize_layout(specs, schemes, out_fmt, ckpt.format)
    rows = []
    buffers = Buffers()  # the code buffers of the one pass, reused from tensor to tensor (the input is mapped)
    with checkpoint_writer(out_path, out_fmt, entries, meta, ckpt.extra_metadata) as out:
        for name in ckpt.names:
            shape, dtype = specs[name]
            row = {"name": name, "shape": list(shape), "dtype": dtype.name,
                   "bytes_before": ckpt.nbytes(name)}
            if name not in schemes:
                out.copy_from(name, ckpt)  # file to file in the kernel where it can
                rows.append({**row, "quantized": False, "scheme": None,
                             "bytes_after": row["bytes_before"], "sqnr_db": None,
                             "max_abs_error": None, "nonfinite": None})
            else:
                rows.append(_quantize_one(ckpt, name, schemes[name], row, out, device,
                                          nonfinite, warn, calibrate, buffers))
            if tick is not None:
                tick(name)
    return rows


def quantize_layout(specs: dict, schemes: dict, out_fmt: str, source_format: str) -> tuple:
    """``(entries, meta)`` of the quantized output of a checkpoint whose tensors are ``specs``
    (name -> (shape, dtype), in file order): every output entry's shape and dtype, and the
    gpuq metadata. Known from the input's index alone, before any data is read.

    >>> entries, meta = quantize_layout({"w": ((4, 8), np.dtype("float32"))},
    ...     {"w": {"dtype": "int8", "symmetric": True, "axis": 0, "group_size": None}}, "npz", "npz")
    >>> list(entries), meta["format_version"]
    (['w', 'w.scales'], 1)
    """
    entries = {}
    for name, (shape, dtype) in specs.items():
        entries.update(output_entries(name, shape, schemes[name], out_fmt) if name in schemes
                       else {name: (shape, dtype)})
    return entries, file_meta(schemes, {n: specs[n][1].name for n in schemes}, source_format)


def _quantize_one(ckpt, name, scheme, row, out, device, nonfinite, warn, calibrate, buffers) -> dict:
    from . import fused

    x = ckpt.mapped(name)  # the file's pages, no copy (a fresh array where no map can be made)
    # The one pass (gpuq.checkpoints.fused) where it covers the case: the same bytes.
    done = (fused.quantize_file_tensor(x, scheme, out.fmt, buffers, calibrate)
            if fused.covers_file(x, scheme, device, calibrate) else None)
    if done is not None:
        codes, scales, zps, stats, counts = done
        if sum(counts.values()) and nonfinite == "error":
            raise _refused(name, counts)
    else:
        try:
            # The loaded tensor goes straight in: quantize_tensor holds the only reference.
            q, scales, zps, stats, counts = quantize_tensor(x, scheme, device, name=name, nonfinite=nonfinite,
                                                            calibrate=calibrate)
        except CliError:  # a ValueError already in its one-line form
            raise
        except (ValueError, TypeError) as exc:
            raise CliError(f"tensor {name!r}: {' '.join(str(exc).split())}") from exc
        codes = stored_codes(q, scheme, out.fmt)
    del x
    if sum(counts.values()) and nonfinite == "warn" and warn is not None:
        what = ("NaN -> 0, +-Inf -> +-max" if is_small_float(scheme["dtype"])  # fp4/fp6 have no NaN
                else "NaN -> NaN, +-Inf -> +-max finite" if is_float8(scheme["dtype"])
                else "NaN -> zero point, +-Inf -> saturated")
        warn(f"tensor {name!r} has {nonfinite_text(counts)}: quantized with parameters from "
             f"its finite values ({what}); --nonfinite error refuses it, allow keeps quiet")
    pshape = out.entries[name + ".scales"][0]  # (1,) for per-tensor in .safetensors
    out.write(name, codes)
    after = codes.nbytes
    for suffix, p in stored_scales(scales, scheme, out.fmt, stats.get("global_scale")).items():
        p = p.reshape(out.entries[name + suffix][0])
        out.write(name + suffix, p)
        after += p.nbytes
    if has_zps(scheme):
        out.write(name + ".zps", zps.reshape(pshape))
        after += zps.nbytes
    return {**row, "quantized": True, "scheme": scheme, "scheme_text": describe(scheme),
            "bytes_after": int(after), "sqnr_db": sqnr_db(stats["signal"], stats["error"]),
            "max_abs_error": stats["max_abs_error"], "nonfinite": counts,
            "_signal": stats["signal"], "_error": stats["error"]}


def _report(command, in_path, out_path, device, rows) -> dict:
    return finish_report(command, in_path, out_path, device.name, rows)


def finish_report(command, in_path, out_path, device_name, rows) -> dict:
    """The report of ``command`` from its rows (any order: sorted here), totals included."""
    rows = sorted(rows, key=lambda r: natural_key(r["name"]))
    quantized = [r for r in rows if r["quantized"]]
    # A tensor with no finite value has NaN statistics: it adds nothing to the totals.
    signal = sum(v for r in rows if not math.isnan(v := r.pop("_signal", 0.0)))
    error = sum(v for r in rows if not math.isnan(v := r.pop("_error", 0.0)))
    errs = [r["max_abs_error"] for r in quantized
            if "max_abs_error" in r and not math.isnan(r["max_abs_error"])]
    total = {
        "tensors": len(rows),
        "quantized": len(quantized),
        "kept": len(rows) - len(quantized),
        "bytes_before": sum(r["bytes_before"] for r in rows),
        "bytes_after": sum(r["bytes_after"] for r in rows),
    }
    if command == "quantize":
        total["sqnr_db"] = sqnr_db(signal, error)  # energy-weighted over the quantized tensors
        total["max_abs_error"] = max(errs) if errs else None
        total["nonfinite"] = {k: sum(r["nonfinite"][k] for r in quantized)
                              for k in ("nan", "posinf", "neginf")}
    return {"command": command, "input": in_path, "output": out_path, "device": device_name,
            "tensors": rows, "total": total}


def run_dequantize(in_path, out_path, *, dtype, device, progress=True, nonfinite="warn", warn=None) -> dict:
    """Restore floats from a file written by :func:`run_quantize`; return a short report.

    The file is checked against its gpuq metadata first (:func:`gpuq.checkpoints.quantized.check_file`).
    """
    in_fmt = file_format(in_path, "IN")
    out_fmt = _out_format(in_fmt, out_path, npy_ok=(in_fmt == "npz"))
    with Checkpoint(in_path) as ckpt:
        check_output(out_path, out_fmt, in_path)
        schemes = check_quantized(ckpt)
        restored = restored_names(ckpt, schemes)
        if out_fmt == "npy" and len(restored) != 1:
            raise CliError(f"OUT {out_path!r} is a .npy, which holds one array, but IN has "
                           f"{len(restored)} tensors; write an .npz")
        bar = progress_bar(len(restored), progress, "dequantize")
        try:
            rows = dequantize_file(ckpt, out_path, out_fmt, schemes, dtype=dtype, device=device,
                                   tick=lambda name: bar.update(1, name), nonfinite=nonfinite, warn=warn)
            complete(out_path)
        finally:
            bar.close()
    return _report("dequantize", in_path, out_path, device, rows)


def check_restored(y, name, nonfinite, warn) -> dict:
    """NaN/Inf counts of a dequantized tensor (:func:`count_nonfinite`): fp8 NaN codes, or
    codes times scales beyond the output dtype. ``nonfinite`` ``"error"`` refuses it (CliError),
    ``"warn"`` says so through ``warn`` (one line), ``"allow"`` keeps quiet.

    >>> check_restored(np.array([1.0, np.nan], np.float32), "w", "warn", print)  # doctest: +ELLIPSIS
    tensor 'w' dequantizes to 1 non-finite value (1 NaN) (NaN codes, ...
    {'nan': 1, 'posinf': 0, 'neginf': 0}
    """
    return judge_restored(count_nonfinite(y), name, y.dtype.name, nonfinite, warn)


def judge_restored(counts, name, dtype_name, nonfinite, warn) -> dict:
    """:func:`check_restored` on the NaN/Inf ``counts`` of a tensor of ``dtype_name`` (a tensor
    dequantized piece by piece: the sum of its pieces' counts, or one piece's under ``error``)."""
    text = nonfinite_text(counts) if sum(counts.values()) else None
    if text and nonfinite == "error":
        raise CliError(f"tensor {name!r} dequantizes to {text} (NaN codes, or codes times scales beyond "
                       f"{dtype_name}); --nonfinite warn or allow writes it")
    if text and nonfinite == "warn" and warn is not None:
        warn(f"tensor {name!r} dequantizes to {text} (NaN codes, or codes times scales beyond "
             f"{dtype_name}): written as it is; --nonfinite error refuses it, allow keeps quiet")
    return counts


def check_quantized(ckpt) -> dict:
    """``{name: scheme}`` of a file written by gpuq quantize, checked; CliError otherwise."""
    if ckpt.meta is None:
        raise CliError(f"IN {ckpt.path!r} has no gpuq metadata: it was not written by "
                       f"gpuq quantize")
    return check_file(ckpt)


def restored_names(ckpt, schemes) -> list:
    """The tensors a dequantized ``ckpt`` holds: all but the scales and zero points."""
    companions = companion_names(schemes)
    return [n for n in ckpt.names if n not in companions]


def output_dtype(scheme: dict, dtype) -> np.dtype:
    """The float type a quantized tensor is restored to: ``dtype`` when given, else the
    source dtype the file records (bfloat16 in, bfloat16 back; float64 in, float64 back,
    divided and multiplied in float64); float32 for a file that records none or another type.

    >>> output_dtype({"source_dtype": "bfloat16"}, None).name, output_dtype({}, None).name
    ('bfloat16', 'float32')
    >>> output_dtype({"source_dtype": "float64"}, None).name
    'float64'
    >>> output_dtype({"source_dtype": "bfloat16"}, "float16").name
    'float16'
    """
    if dtype is not None:
        return float_dtype(dtype)
    src = scheme.get("source_dtype")
    return float_dtype(src if src in DEQUANTIZE_DTYPES else "float32")


def dequantize_file(ckpt, out_path, out_fmt, schemes, *, dtype, device, tick=None, nonfinite="warn",
                    warn=None) -> list:
    """Write the float tensors of the checked quantized checkpoint ``ckpt`` to ``out_path``.

    Streamed and atomic like :func:`quantize_file`; ``schemes`` is
    :func:`check_quantized`'s answer; ``dtype`` None restores each tensor's source dtype
    (:func:`output_dtype`); ``nonfinite`` and ``warn``: :func:`check_restored`. Returns the
    report rows.
    """
    import gpuq

    restored = restored_names(ckpt, schemes)
    entries = {n: (logical_shape(n, schemes[n], ckpt), output_dtype(schemes[n], dtype))
               if n in schemes else ckpt.spec(n) for n in restored}
    rows = []
    with checkpoint_writer(out_path, out_fmt, entries, None, ckpt.extra_metadata) as out:
        for name in restored:
            shape, in_dtype = ckpt.spec(name)
            row = {"name": name, "shape": list(shape), "dtype": in_dtype.name}
            if name in schemes:  # packed int4: the tensor's shape, not the bytes'
                row.update(shape=list(entries[name][0]), dtype=schemes[name]["dtype"])
            if name not in schemes:
                out.write(name, ckpt.load(name))
                rows.append({**row, "quantized": False, "bytes_before": ckpt.nbytes(name),
                             "bytes_after": ckpt.nbytes(name)})
            else:
                s = schemes[name]
                gs = ckpt.load(name + ".global_scale") if has_global_scale(s) else None
                scales, scale_kw = api_scales(ckpt.load(name + ".scales"), s, gs)
                zps = ckpt.load(name + ".zps") if has_zps(s) else None
                before = ckpt.nbytes(name) + sum(ckpt.nbytes(name + x) for x in param_suffixes(s)
                                                 if x != ".zps" or zps is not None)
                stored = ckpt.load(name)
                check_values(ckpt.path, name, s, stored, zps)
                try:
                    # Host scales/zps with a device src are uploaded by the library.
                    y = gpuq.dequantize(api_codes(stored, s, device), scales, zps,
                                        dtype=entries[name][1], **scheme_kw(s), **scale_kw)
                except CliError:  # a ValueError already in its one-line form
                    raise
                except (ValueError, TypeError) as exc:
                    raise CliError(f"tensor {name!r}: {' '.join(str(exc).split())}") from exc
                y = device.get(y)
                counts = check_restored(y, name, nonfinite, warn)
                out.write(name, y)
                rows.append({**row, "quantized": True, "bytes_before": int(before),
                             "bytes_after": int(y.nbytes), "nonfinite": counts})
                del y
            if tick is not None:
                tick(name)
    return rows
