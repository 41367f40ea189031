"""CPU peers: onnxruntime, PyTorch's quantized tensors, the naive NumPy expression, and
ml_dtypes' fp8 casts.

Each is imported lazily and skipped (with the reason) where not installed.
All get the run's thread count: ``torch.set_num_threads``, onnxruntime's
``intra_op_num_threads``; naive NumPy is single-threaded by nature (NumPy's
ufuncs do not thread), which the table says.

Issue-5 cases (``dynamic`` = ``quantize_dynamic``, ``qparams`` = ``choose_qparams``):
onnxruntime ``DynamicQuantizeLinear`` (uint8, per-tensor, asymmetric: the
only form ONNX has), ``torch.quantize_per_tensor_dynamic`` (per-tensor,
asymmetric), and the naive NumPy expression (``x.min``/``x.max`` per block,
the formula of ``gpuq.choose_qparams`` written out, then the naive quantize).

Issue-19 cases (int4/uint4 packed, fp8 e4m3fn/e5m2; ``Case.is_format``):
onnxruntime QuantizeLinear/DequantizeLinear with int4/uint4/float8 types
(``block_size`` for per-group, ``saturate=1`` for fp8), run through an
IOBinding (its Python binding has no NumPy type for int4 and fp8: outputs are
read as raw bytes from the ``OrtValue``, int4/fp8 inputs are ``OrtValue``s
filled with the code bytes once); ml_dtypes ``(x / s).astype(float8)`` and
``codes.astype(float32) * s`` (fp8 only; its int4 is unpacked, one byte per
code: no peer for packed codes); naive NumPy with nibble packing
(``(q[0::2] & 15) | (q[1::2] << 4)``) for int4. torch's quantized tensors have
neither type (``n/a``); torch's fp8 casts are GPU rows (``bench.gpu_formats``).
All their outputs are checked as bits (``data.as_bits``).
"""

from __future__ import annotations

import ctypes

import numpy as np

from .cases import DYNAMIC_OPS, FP8_TYPES, GROUP, INT4_TYPES
from .contenders import NotApplicable, Prepared
from .data import as_bits, fp8_dtype

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
        if case.qdtype in FP8_TYPES:
            raise NotApplicable("fp8: the naive expression is the ml_dtypes row")
        if case.qdtype in INT4_TYPES:
            return naive_int4(case, inputs, scales, zps)
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


def pack_nibbles(q: np.ndarray) -> np.ndarray:
    """int8/uint8 codes in the int4/uint4 range -> ONNX's packed bytes (element 2k low nibble)."""
    f = q.reshape(-1).view(np.uint8)
    if f.size % 2:
        f = np.concatenate([f, np.zeros(1, np.uint8)])
    return (f[0::2] & 0x0F) | (f[1::2] << 4)


def unpack_nibbles(packed: np.ndarray, n: int, signed: bool) -> np.ndarray:
    """ONNX's packed bytes -> ``n`` int8 (int4, sign-extended) or uint8 (uint4) codes."""
    out = np.empty(2 * packed.size, np.uint8)
    out[0::2] = packed & 0x0F
    out[1::2] = packed >> 4
    out = out[:n]
    return ((out.view(np.int8) ^ 8) - 8).astype(np.int8) if signed else out


def naive_int4(case, inputs, scales, zps):
    """``np.clip(np.rint(x / s) + zp, qmin, qmax)`` then nibble packing; unpack, ``(q - zp) * s``."""
    view, shape, n = case.view_shape(), case.shape(), case.numel()
    s = scales.reshape(case.bcast_shape())
    z = None if zps is None else zps.astype(np.float32).reshape(case.bcast_shape())
    signed = case.qdtype == "int4"
    qmin, qmax = (-8, 7) if signed else (0, 15)
    if case.op == "quantize":
        xs = [x.reshape(view) for x in inputs]

        def run(i):
            t = np.rint(xs[i % len(xs)] / s)
            if z is not None:
                t = t + z
            return pack_nibbles(np.clip(t, qmin, qmax).astype(np.int8 if signed else np.uint8))
    else:
        packed = [c.data for c in inputs]
        fd = np.dtype(case.fdtype)

        def run(i):
            t = unpack_nibbles(packed[i % len(packed)], n, signed).reshape(view).astype(np.float32)
            if z is not None:
                t = t - z
            return (t * s).astype(fd, copy=False).reshape(shape)
    return Prepared(run, as_bits)


class MlDtypes:
    """ml_dtypes' fp8 casts: ``(x / s).astype(float8)`` and ``codes.astype(float32) * s``
    (NumPy ufuncs, single-threaded; non-saturating, which the inputs never reach)."""

    name = "ml_dtypes"
    is_peer = True

    def __init__(self, threads):
        import ml_dtypes  # noqa: F401

    def covers(self, case):
        return case.is_format and case.op not in DYNAMIC_OPS

    def prepare(self, case, inputs, scales, zps):
        if case.qdtype not in FP8_TYPES:
            raise NotApplicable("ml_dtypes' int4 is one byte per code (no packing); fp8 only"
                                if case.qdtype in INT4_TYPES else "fp8 cases only")
        if case.op in DYNAMIC_OPS:
            raise NotApplicable("fp8 cases only")
        view, shape = case.view_shape(), case.shape()
        s = scales.reshape(case.bcast_shape())
        xs = [x.reshape(view) for x in inputs]
        if case.op == "quantize":
            f8 = fp8_dtype(case.qdtype)
            run = lambda i: (xs[i % len(xs)] / s).astype(f8).reshape(shape)  # noqa: E731
        else:
            fd = np.dtype(case.fdtype)
            run = lambda i: (xs[i % len(xs)].astype(np.float32) * s).astype(fd, copy=False).reshape(shape)  # noqa: E731
        return Prepared(run, as_bits)


def _ort_bytes(value, nbytes) -> np.ndarray:
    """The raw bytes of a CPU ``OrtValue`` (int4/fp8 outputs have no NumPy type), copied out."""
    return np.frombuffer((ctypes.c_uint8 * nbytes).from_address(value.data_ptr()), np.uint8).copy()


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
        if case.scheme in ("first", "middle", "last", "row"):
            attrs["axis"] = case.axis() % len(case.shape())
        elif case.scheme == "group":
            attrs["axis"] = len(case.shape()) - 1
            attrs["block_size"] = GROUP
        # ONNX: scale type = the float side's type (float16 input/output uses float16 scales).
        sdtype = np.dtype(case.fdtype)
        s = scales.astype(sdtype)
        if case.is_format:
            qtype = {"int4": onnx.TensorProto.INT4, "uint4": onnx.TensorProto.UINT4,
                     "float8_e4m3fn": onnx.TensorProto.FLOAT8E4M3FN,
                     "float8_e5m2": onnx.TensorProto.FLOAT8E5M2}[case.qdtype]
            z = _zps_or_zero(case, zps)
            if case.scheme == "tensor":
                s = s.reshape(())
            if case.qdtype in FP8_TYPES and case.op == "quantize":
                attrs["saturate"] = 1  # ONNX's default, stated: gpuq's default too
            zdims = list(s.shape)
            zvals = z.reshape(-1).astype(np.float32 if case.qdtype in FP8_TYPES else np.int32).tolist()
            inits = [numpy_helper.from_array(s, "scale"), helper.make_tensor("zp", qtype, zdims, zvals)]
        else:
            qd = np.dtype(case.qdtype)
            z = _zps_or_zero(case, zps).astype(qd)
            if case.scheme == "tensor":
                s, z = s.reshape(()), z.reshape(())
            inits = [numpy_helper.from_array(s, "scale"), numpy_helper.from_array(z, "zp")]
            qtype = helper.np_dtype_to_tensor_dtype(qd)
        ftype = helper.np_dtype_to_tensor_dtype(np.dtype(case.fdtype))
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
            if case.is_format:
                return self._prepare_format(case, sess, inputs)
            sess.run(None, {"x": inputs[0]})
        except NotApplicable:
            raise
        except Exception as exc:  # an opset/type the installed build lacks
            raise NotApplicable(f"onnxruntime refused the model: {str(exc).splitlines()[0][:120]}") from None
        if dynamic:
            return Prepared(lambda i: sess.run(None, {"x": inputs[i % len(inputs)]}),
                            lambda r: parts(case, r))
        return Prepared(lambda i: sess.run(None, {"x": inputs[i % len(inputs)]})[0])


    def _prepare_format(self, case, sess, inputs):
        """int4/fp8 through an IOBinding: the output bound to onnxruntime's CPU allocator (its
        arena, as a plain ``run``'s output), read back as raw bytes; int4/fp8 inputs are
        ``OrtValue``s filled with the code bytes once, before timing."""
        from onnx import TensorProto

        io = sess.io_binding()
        shape = list(case.shape())
        if case.op == "quantize":
            xs = list(inputs)
            nbytes = case.code_nbytes()

            def bind(i):
                io.bind_cpu_input("x", xs[i % len(xs)])

            fetch = lambda v: _ort_bytes(v, nbytes)  # noqa: E731
        else:
            elem = {"int4": TensorProto.INT4, "uint4": TensorProto.UINT4,
                    "float8_e4m3fn": TensorProto.FLOAT8E4M3FN, "float8_e5m2": TensorProto.FLOAT8E5M2}[case.qdtype]
            values = []
            for c in inputs:
                raw = np.ascontiguousarray(as_bits(c)).reshape(-1)
                v = self.ort.OrtValue.ortvalue_from_shape_and_type(shape, elem, "cpu", 0)
                ctypes.memmove(v.data_ptr(), raw.ctypes.data, raw.nbytes)
                values.append((v, raw))  # raw kept alive beside its copy (not needed, cheap)

            def bind(i):
                io.bind_ortvalue_input("x", values[i % len(values)][0])

            fetch = lambda v: as_bits(v.numpy())  # noqa: E731

        def run(i):
            bind(i)
            io.bind_output("y", "cpu")
            sess.run_with_iobinding(io)
            return io.get_outputs()[0]

        run(0)
        return Prepared(run, fetch)


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
        if case.is_format:
            raise NotApplicable("torch's quantized tensors are int8/uint8 only (fp8 casts: GPU rows)")
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
    for cls in (OnnxRuntime, TorchQuantized, NaiveNumpy, MlDtypes):
        try:
            peers.append(cls(threads))
        except ImportError as exc:
            missing.append((cls.name, f"not installed ({exc.name})"))
    return peers, missing
