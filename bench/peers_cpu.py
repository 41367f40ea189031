"""CPU peers: onnxruntime, PyTorch's quantized tensors, and the naive NumPy expression.

Each is imported lazily and skipped (with the reason) where not installed.
All get the run's thread count: ``torch.set_num_threads``, onnxruntime's
``intra_op_num_threads``; naive NumPy is single-threaded by nature (NumPy's
ufuncs do not thread), which the table says.

Issue-5 cases (``dynamic`` = ``quantize_dynamic``, ``qparams`` = ``choose_qparams``):
onnxruntime ``DynamicQuantizeLinear`` (uint8, per-tensor, asymmetric: the
only form ONNX has), ``torch.quantize_per_tensor_dynamic`` (per-tensor,
asymmetric), and the naive NumPy expression (``x.min``/``x.max`` per block,
the formula of ``gpuq.choose_qparams`` written out, then the naive quantize).
"""

from __future__ import annotations

import numpy as np

from .cases import DYNAMIC_OPS, GROUP
from .contenders import NotApplicable, Prepared

#: Smallest normal float32: gpuq.choose_qparams's default eps (a range-0 block's scale).
EPS = float(np.finfo(np.float32).tiny)


def _zps_or_zero(case, zps):
    return zps if zps is not None else np.zeros(case.param_shape(), np.int32)


def reduced_axes(case):
    """Axes of ``case.view_shape()`` a dynamic case reduces over (one slot per scale)."""
    if case.scheme == "tensor":
        return None
    if case.scheme == "row":
        return 1
    if case.scheme == "group":
        return -1
    raise NotApplicable(f"no naive qparams for the {case.scheme} scheme")


def formula(lo, hi, qmin, qmax, symmetric, xp):
    """``gpuq.choose_qparams``'s formula written out in array code (NumPy or CuPy), float32 throughout.

    asymmetric: range widened to 0, ``s = (hi' - lo') / (qmax - qmin)``,
    ``zp = clamp(qmin - rint(lo' / s), qmin, qmax)``; symmetric: ``s = max|x| / 127``,
    zps None (int8) or 128 (uint8); ``s >= eps``.
    """
    f = lambda v: xp.asarray(v, dtype=xp.float32)  # noqa: E731  (0-d float32: no promotion)
    lo, hi = lo.astype(xp.float32), hi.astype(xp.float32)
    if symmetric:
        amax = xp.maximum(xp.maximum(hi, -lo), f(0))
        s = xp.maximum(amax / f(127), f(EPS))
        z = None if qmin < 0 else xp.full(s.shape, 128, xp.int32)
        return s, z
    lo0, hi0 = xp.minimum(lo, f(0)), xp.maximum(hi, f(0))
    s = xp.maximum((hi0 - lo0) / f(qmax - qmin), f(EPS))
    z = xp.clip(f(qmin) - xp.rint(lo0 / s), qmin, qmax).astype(xp.int32)
    return s, z


def parts(case, result, to_host=np.asarray):
    """``(q, s, z)`` or ``(s, z)`` of a peer as the dict ``runner.compare`` checks (int32 zps, float32 scales)."""
    *q, s, z = result
    out = {"scales": np.asarray(to_host(s), np.float32).reshape(case.param_shape()),
           "zps": None if z is None else np.asarray(to_host(z)).astype(np.int32).reshape(case.param_shape())}
    if q:
        out["q"] = to_host(q[0]).reshape(case.shape())
    return out


def naive_dynamic(case, inputs, xp, to_host):
    """The naive dynamic expression in ``xp`` (NumPy or CuPy): min/max per block, formula, quantize."""
    ax = reduced_axes(case)
    view, bshape, pshape, shape = case.view_shape(), case.bcast_shape(), case.param_shape(), case.shape()
    info = np.iinfo(case.qdtype)
    xs = [x.reshape(view) for x in inputs]
    sym = not case.zps

    def qparams(x):
        lo, hi = x.min(axis=ax), x.max(axis=ax)
        s, z = formula(lo, hi, info.min, info.max, sym, xp)
        return s.reshape(pshape), (None if z is None else z.reshape(pshape))

    if case.op == "qparams":
        run = lambda i: qparams(xs[i % len(xs)])  # noqa: E731
    else:
        def run(i):
            x = xs[i % len(xs)]
            s, z = qparams(x)
            t = xp.rint(x / s.reshape(bshape))
            if z is not None:
                t = t + z.astype(xp.float32).reshape(bshape)
            return xp.clip(t, info.min, info.max).astype(case.qdtype).reshape(shape), s, z
    return Prepared(run, lambda r: parts(case, r, to_host))


class NaiveNumpy:
    """``np.clip(np.rint(x / s) + zp, qmin, qmax).astype(q)`` and ``((q - zp) * s)``: full-size temporaries."""

    name = "numpy naive"
    is_peer = True

    def __init__(self, threads):
        self.threads = threads

    def prepare(self, case, inputs, scales, zps):
        if case.op in DYNAMIC_OPS:
            return naive_dynamic(case, inputs, np, np.asarray)
        view = case.view_shape()
        s = scales.reshape(case.bcast_shape())
        z = None if zps is None else zps.astype(np.float32).reshape(case.bcast_shape())
        xs = [x.reshape(view) for x in inputs]
        shape = case.shape()
        if case.op == "quantize":
            info = np.iinfo(case.qdtype)
            qmin, qmax, qd = info.min, info.max, np.dtype(case.qdtype)

            def run(i):
                t = np.rint(xs[i % len(xs)] / s)
                if z is not None:
                    t = t + z
                return np.clip(t, qmin, qmax).astype(qd).reshape(shape)
        else:
            fd = np.dtype(case.fdtype)

            def run(i):
                t = xs[i % len(xs)].astype(np.float32)
                if z is not None:
                    t = t - z
                return (t * s).astype(fd, copy=False).reshape(shape)
        return Prepared(run)


class OnnxRuntime:
    """onnxruntime QuantizeLinear / DequantizeLinear on a one-node model (opset 21)."""

    name = "onnxruntime"
    is_peer = True
    OPSET = 21

    def __init__(self, threads):
        import onnx  # noqa: F401  (fail early: both are needed)
        import onnxruntime as ort

        self.ort = ort
        self.threads = threads

    def _model(self, case, x, scales, zps):
        import onnx
        from onnx import helper, numpy_helper

        if case.scheme == "axes":
            raise NotApplicable("ONNX has no multi-axis scale")
        attrs = {}
        if case.scheme in ("first", "middle", "last"):
            attrs["axis"] = case.axis() % len(case.shape())
        elif case.scheme == "group":
            attrs["axis"] = len(case.shape()) - 1
            attrs["block_size"] = GROUP
        # ONNX: scale type = the float side's type (float16 input/output uses float16 scales).
        sdtype = np.dtype(case.fdtype)
        s = scales.astype(sdtype)
        qd = np.dtype(case.qdtype)
        z = _zps_or_zero(case, zps).astype(qd)
        if case.scheme == "tensor":
            s, z = s.reshape(()), z.reshape(())
        inits = [numpy_helper.from_array(s, "scale"), numpy_helper.from_array(z, "zp")]
        ftype = helper.np_dtype_to_tensor_dtype(np.dtype(case.fdtype))
        qtype = helper.np_dtype_to_tensor_dtype(qd)
        shape = list(case.shape())
        if case.op == "quantize":
            node = helper.make_node("QuantizeLinear", ["x", "scale", "zp"], ["y"], **attrs)
            xin = helper.make_tensor_value_info("x", ftype, shape)
            yout = helper.make_tensor_value_info("y", qtype, shape)
        else:
            node = helper.make_node("DequantizeLinear", ["x", "scale", "zp"], ["y"], **attrs)
            xin = helper.make_tensor_value_info("x", qtype, shape)
            yout = helper.make_tensor_value_info("y", ftype, shape)
        graph = helper.make_graph([node], "q", [xin], [yout], initializer=inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.OPSET)])
        model.ir_version = min(model.ir_version, 10)
        onnx.checker.check_model(model)
        return model.SerializeToString()

    def _dynamic_model(self, case):
        from onnx import TensorProto, helper

        if case.op == "qparams":
            raise NotApplicable("ONNX has no qparams-only op")
        if not (case.scheme == "tensor" and case.qdtype == "uint8" and case.zps and case.fdtype == "float32"):
            raise NotApplicable("DynamicQuantizeLinear is uint8, asymmetric, per-tensor, float32 only")
        node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "y_scale", "y_zp"])
        shape = list(case.shape())
        graph = helper.make_graph(
            [node], "dq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
            [helper.make_tensor_value_info("y", TensorProto.UINT8, shape),
             helper.make_tensor_value_info("y_scale", TensorProto.FLOAT, []),
             helper.make_tensor_value_info("y_zp", TensorProto.UINT8, [])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.OPSET)])
        model.ir_version = min(model.ir_version, 10)
        return model.SerializeToString()

    def prepare(self, case, inputs, scales, zps):
        dynamic = case.op in DYNAMIC_OPS
        model = self._dynamic_model(case) if dynamic else self._model(case, inputs[0], scales, zps)
        so = self.ort.SessionOptions()
        so.intra_op_num_threads = self.threads
        so.inter_op_num_threads = 1
        so.execution_mode = self.ort.ExecutionMode.ORT_SEQUENTIAL
        try:
            sess = self.ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
            sess.run(None, {"x": inputs[0]})
        except Exception as exc:  # an opset/type the installed build lacks
            raise NotApplicable(f"onnxruntime refused the model: {str(exc).splitlines()[0][:120]}") from None
        if dynamic:
            return Prepared(lambda i: sess.run(None, {"x": inputs[i % len(inputs)]}),
                            lambda r: parts(case, r))
        return Prepared(lambda i: sess.run(None, {"x": inputs[i % len(inputs)]})[0])


class TorchQuantized:
    """``torch.quantize_per_tensor`` / ``quantize_per_channel`` and ``Tensor.dequantize``."""

    name = "torch"
    is_peer = True

    def __init__(self, threads, device="cpu"):
        import warnings

        import torch

        # torch deprecates its quantized tensors; they are still what a user would pick today.
        warnings.filterwarnings("ignore", message=".*quantize_per_tensor.*deprecated", category=UserWarning)
        self.torch = torch
        self.device = device
        if device == "cpu":
            torch.set_num_threads(threads)

    def _as_torch(self, a):
        t = self.torch.from_dlpack(a) if self.device != "cpu" else self.torch.from_numpy(np.ascontiguousarray(a))
        return t

    def _prepare_dynamic(self, case, inputs):
        torch = self.torch
        if case.op == "qparams" or case.scheme != "tensor" or not case.zps:
            raise NotApplicable("torch.quantize_per_tensor_dynamic: asymmetric per-tensor only")
        qdt = torch.qint8 if case.qdtype == "int8" else torch.quint8
        xs = [self._as_torch(x) for x in inputs]
        run = lambda i: torch.quantize_per_tensor_dynamic(xs[i % len(xs)], qdt, False)  # noqa: E731
        # Its scale is a float64 (compared as float32), its zp a Python int.
        fetch = lambda r: parts(case, (r.int_repr().cpu().numpy(), r.q_scale(), r.q_zero_point()))  # noqa: E731
        try:
            run(0)
        except Exception as exc:
            raise NotApplicable(f"torch refused: {str(exc).splitlines()[0][:120]}") from None
        return Prepared(run, fetch)

    def prepare(self, case, inputs, scales, zps):
        torch = self.torch
        if case.op in DYNAMIC_OPS:
            return self._prepare_dynamic(case, inputs)
        if case.scheme not in ("tensor", "first", "middle", "last"):
            raise NotApplicable("torch has no per-group or multi-axis quantized tensor")
        qdt = torch.qint8 if case.qdtype == "int8" else torch.quint8
        z = _zps_or_zero(case, zps)
        xs = [self._as_torch(x) for x in inputs]
        dev = xs[0].device
        if case.scheme == "tensor":
            sf, zi = float(scales.reshape(-1)[0]), int(z.reshape(-1)[0])
        else:
            axis = case.axis() % len(case.shape())
            st = torch.tensor(scales.astype(np.float64), device=dev)
            zt = torch.tensor(z.astype(np.int64), device=dev)
        if case.op == "quantize":
            if case.scheme == "tensor":
                run = lambda i: torch.quantize_per_tensor(xs[i % len(xs)], sf, zi, qdt)  # noqa: E731
            else:
                run = lambda i: torch.quantize_per_channel(xs[i % len(xs)], st, zt, axis, qdt)  # noqa: E731
            fetch = lambda r: r.int_repr().cpu().numpy()  # noqa: E731
        else:
            if case.scheme == "tensor":
                qs = [torch._make_per_tensor_quantized_tensor(x, sf, zi) for x in xs]
            else:
                qs = [torch._make_per_channel_quantized_tensor(x, st, zt, axis) for x in xs]
            if case.fdtype == "float32":
                run = lambda i: qs[i % len(qs)].dequantize()  # noqa: E731
            else:
                fd = getattr(torch, case.fdtype)
                run = lambda i: qs[i % len(qs)].dequantize().to(fd)  # noqa: E731
            fetch = lambda r: r.cpu().numpy()  # noqa: E731
        try:
            run(0)
        except Exception as exc:
            raise NotApplicable(f"torch refused: {str(exc).splitlines()[0][:120]}") from None
        return Prepared(run, fetch)


def cpu_peers(threads):
    """The CPU peers that import here, and ``(name, reason)`` for those that do not."""
    peers, missing = [], []
    for cls in (OnnxRuntime, TorchQuantized, NaiveNumpy):
        try:
            peers.append(cls(threads))
        except ImportError as exc:
            missing.append((cls.name, f"not installed ({exc.name})"))
    return peers, missing
