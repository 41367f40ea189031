"""The work behind ``gpuq quantize`` and ``gpuq dequantize``: one tensor at a time.

Output layout of a quantized file, for each quantized tensor ``name``:

==================  ================================================================
entry               contents
==================  ================================================================
``name``            the int8/uint8 codes, same shape as the source tensor
``name.scales``     float32 scales, shaped as :func:`gpuq.quantize` takes them
                    (per-tensor ``()``, per-channel ``(shape[k],)``, per-group
                    ``shape`` with dim k -> ceil(n / g))
``name.zps``        zero points, same shape, in the code dtype (int8/uint8, as
                    ONNX stores them); ABSENT for symmetric int8 (zero point
                    0, the library's ``zps=None``)
==================  ================================================================

plus the gpuq metadata (format version, and per tensor the scheme and the
source dtype). Every other tensor is copied bit for bit.
"""

from __future__ import annotations

import math
import sys

import numpy as np

from .files import Checkpoint, CliError, check_output, file_format, write_checkpoint
from .selection import check_names, describe, select

FORMAT_VERSION = 1


def _progress(items, enabled, desc):
    if not enabled:
        return items
    try:
        from tqdm import tqdm
    except ImportError:  # the bar is a nicety: no tqdm, no bar
        return items
    return tqdm(items, desc=desc, unit="tensor", file=sys.stderr, leave=False)


def widen(x: np.ndarray) -> np.ndarray:
    """bfloat16 -> float32 (exact: every bfloat16 is a float32); other floats as they are.

    >>> import ml_dtypes
    >>> widen(np.array([1.5, -2.0], ml_dtypes.bfloat16))
    array([ 1.5, -2. ], dtype=float32)
    """
    if x.dtype.name == "bfloat16":
        return x.astype(np.float32)
    return x


def error_stats(x, x_hat, xp=np, chunk: int = 1 << 22) -> dict:
    """Signal and error energy and max abs error of ``x_hat`` against ``x``, in float64.

    Chunked so the float64 temporaries stay small on big tensors. ``xp`` is
    the array module (NumPy or CuPy) that holds both arrays.

    >>> s = error_stats(np.array([3.0, 4.0], np.float32), np.array([3.0, 3.5], np.float32))
    >>> s["signal"], s["error"], s["max_abs_error"], round(sqnr_db(s["signal"], s["error"]), 3)
    (25.0, 0.25, 0.5, 20.0)
    """
    xf, yf = x.reshape(-1), x_hat.reshape(-1)
    signal = error = 0.0
    max_err = 0.0
    for i in range(0, xf.size, chunk):
        a = xf[i:i + chunk].astype(xp.float64)
        d = a - yf[i:i + chunk].astype(xp.float64)
        signal += float((a * a).sum())
        error += float((d * d).sum())
        m = float(xp.abs(d).max())
        if m > max_err or math.isnan(m):  # NaN (a NaN in x) sticks
            max_err = m if not math.isnan(max_err) else max_err
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


def quantize_tensor(x, scheme: dict, device):
    """Codes, scales, zps (host arrays; zps None for symmetric int8) and error stats."""
    import gpuq
    from ..qparams import choose_qparams

    xd = device.put(widen(x))
    kw = {"axis": scheme["axis"], "group_size": scheme["group_size"]}
    scales, zps = choose_qparams(xd, dtype=scheme["dtype"], symmetric=scheme["symmetric"], **kw)
    q = gpuq.quantize(xd, scales, zps, dtype=scheme["dtype"], **kw)
    # The report's error is that of what `gpuq dequantize` writes by default (float32).
    x_hat = gpuq.dequantize(q, scales, zps, dtype="float32", **kw)
    stats = error_stats(xd, x_hat, device.xp)
    scales = np.asarray(device.get(scales), np.float32)
    if zps is not None:
        zps = _narrow(np.asarray(device.get(zps)), np.dtype(scheme["dtype"]))
    return device.get(q), scales, zps, stats


def _narrow(zps, code_dtype):
    """Zero points in the code dtype (as ONNX stores them) when they fit, else int32.

    choose_qparams clamps zero points to the code range, so they always fit;
    the int32 fallback keeps any other zero point exact.

    >>> _narrow(np.array([0, 255], np.int32), np.dtype(np.uint8)).dtype
    dtype('uint8')
    >>> _narrow(np.array([-1, 255], np.int32), np.dtype(np.uint8)).dtype
    dtype('int32')
    """
    info = np.iinfo(code_dtype)
    if zps.size == 0 or (int(zps.min()) >= info.min and int(zps.max()) <= info.max):
        return zps.astype(code_dtype)
    return zps.astype(np.int32)


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
                 progress=True) -> dict:
    """Quantize a checkpoint file; return the report (see :mod:`gpuq.cli.report`)."""
    in_fmt = file_format(in_path, "IN")
    out_fmt = _out_format(in_fmt, out_path, npy_ok=False)
    with Checkpoint(in_path) as ckpt:
        check_output(out_path, out_fmt, in_path)
        if ckpt.meta is not None:
            raise CliError(f"IN {in_path!r} is already quantized by gpuq; dequantize it first")
        specs = {n: ckpt.spec(n) for n in ckpt.names}
        chosen = select(specs, include=include, exclude=exclude, min_size=min_size)
        check_names(ckpt.names, chosen)
        schemes = {n: plan.for_shape(n, specs[n][0]) for n in chosen}
        tensors, rows, meta_tensors = {}, [], {}
        for name in _progress(ckpt.names, progress, "quantize"):
            x = ckpt.load(name)
            row = {"name": name, "shape": list(x.shape), "dtype": x.dtype.name,
                   "bytes_before": int(x.nbytes)}
            if name not in schemes:
                tensors[name] = x
                rows.append({**row, "quantized": False, "scheme": None,
                             "bytes_after": int(x.nbytes), "sqnr_db": None,
                             "max_abs_error": None})
                continue
            scheme = schemes[name]
            try:
                q, scales, zps, stats = quantize_tensor(x, scheme, device)
            except (ValueError, TypeError) as exc:
                raise CliError(f"tensor {name!r}: {' '.join(str(exc).split())}") from exc
            tensors[name], tensors[name + ".scales"] = q, scales
            after = q.nbytes + scales.nbytes
            if zps is not None:
                tensors[name + ".zps"] = zps
                after += zps.nbytes
            meta_tensors[name] = {**scheme, "source_dtype": x.dtype.name}
            rows.append({**row, "quantized": True, "scheme": scheme,
                         "scheme_text": describe(scheme), "bytes_after": int(after),
                         "sqnr_db": sqnr_db(stats["signal"], stats["error"]),
                         "max_abs_error": stats["max_abs_error"],
                         "_signal": stats["signal"], "_error": stats["error"]})
        extra = ckpt.extra_metadata
    meta = {"format_version": FORMAT_VERSION, "source_format": in_fmt, "tensors": meta_tensors}
    write_checkpoint(out_path, out_fmt, tensors, meta, extra)
    return _report("quantize", in_path, out_path, device, rows)


def _report(command, in_path, out_path, device, rows) -> dict:
    quantized = [r for r in rows if r["quantized"]]
    signal = sum(r.pop("_signal", 0.0) for r in rows)
    error = sum(r.pop("_error", 0.0) for r in rows)
    errs = [r["max_abs_error"] for r in quantized if "max_abs_error" in r]
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
    return {"command": command, "input": in_path, "output": out_path, "device": device.name,
            "tensors": rows, "total": total}


def run_dequantize(in_path, out_path, *, dtype, device, progress=True) -> dict:
    """Restore floats from a file written by :func:`run_quantize`; return a short report."""
    in_fmt = file_format(in_path, "IN")
    out_fmt = _out_format(in_fmt, out_path, npy_ok=(in_fmt == "npz"))
    import gpuq

    with Checkpoint(in_path) as ckpt:
        check_output(out_path, out_fmt, in_path)
        if ckpt.meta is None:
            raise CliError(f"IN {in_path!r} has no gpuq metadata: it was not written by "
                           f"gpuq quantize")
        schemes = ckpt.meta["tensors"]
        names = set(ckpt.names)
        for name in schemes:
            for need in (name, name + ".scales"):
                if need not in names:
                    raise CliError(f"cannot read IN {in_path!r}: tensor {need!r} is missing")
        companions = {n + s for n in schemes for s in (".scales", ".zps")}
        restored = [n for n in ckpt.names if n not in companions]
        if out_fmt == "npy" and len(restored) != 1:
            raise CliError(f"OUT {out_path!r} is a .npy, which holds one array, but IN has "
                           f"{len(restored)} tensors; write an .npz")
        tensors, rows = {}, []
        for name in _progress(restored, progress, "dequantize"):
            x = ckpt.load(name)
            row = {"name": name, "shape": list(x.shape), "dtype": x.dtype.name}
            if name not in schemes:
                tensors[name] = x
                rows.append({**row, "quantized": False, "bytes_before": int(x.nbytes),
                             "bytes_after": int(x.nbytes)})
                continue
            s = schemes[name]
            scales = ckpt.load(name + ".scales")
            zps = ckpt.load(name + ".zps") if name + ".zps" in names else None
            before = x.nbytes + scales.nbytes + (0 if zps is None else zps.nbytes)
            try:
                # Host scales/zps with a device src are uploaded by the library.
                y = gpuq.dequantize(device.put(x), scales, zps, axis=s.get("axis"),
                                    group_size=s.get("group_size"), dtype=dtype)
            except (ValueError, TypeError) as exc:
                raise CliError(f"tensor {name!r}: {' '.join(str(exc).split())}") from exc
            tensors[name] = device.get(y)
            rows.append({**row, "quantized": True, "bytes_before": int(before),
                         "bytes_after": int(y.nbytes)})
        extra = ckpt.extra_metadata
    write_checkpoint(out_path, out_fmt, tensors, None, extra)
    return _report("dequantize", in_path, out_path, device, rows)
