"""CPU peers: onnxruntime, PyTorch's quantized tensors, and the naive NumPy expression.

Each is imported lazily and skipped (with the reason) where not installed.
All get the run's thread count: ``torch.set_num_threads``, onnxruntime's
``intra_op_num_threads``; naive NumPy is single-threaded by nature (NumPy's
ufuncs do not thread), which the table says.
"""

from __future__ import annotations

import numpy as np

from .cases import GROUP
from .contenders import NotApplicable, Prepared


def _zps_or_zero(case, zps):
    return zps if zps is not None else np.zeros(case.param_shape(), np.int32)


class NaiveNumpy:
    """``np.clip(np.rint(x / s) + zp, qmin, qmax).astype(q)`` and ``((q - zp) * s)``: full-size temporaries."""

    name = "numpy naive"
    is_peer = True

    def __init__(self, threads):
        self.threads = threads

    def prepare(self, case, inputs, scales, zps):
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
        from onnx import TensorProto, helper, numpy_helper

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

    def prepare(self, case, inputs, scales, zps):
        model = self._model(case, inputs[0], scales, zps)
        so = self.ort.SessionOptions()
        so.intra_op_num_threads = self.threads
        so.inter_op_num_threads = 1
        so.execution_mode = self.ort.ExecutionMode.ORT_SEQUENTIAL
        try:
            sess = self.ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
            sess.run(None, {"x": inputs[0]})
        except Exception as exc:  # an opset/type the installed build lacks
            raise NotApplicable(f"onnxruntime refused the model: {str(exc).splitlines()[0][:120]}") from None
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

    def prepare(self, case, inputs, scales, zps):
        torch = self.torch
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
