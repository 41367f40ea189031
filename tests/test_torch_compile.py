"""gpuq's public functions inside ``torch.compile`` and ``torch.export``, real torch, CPU tensors.

One function body runs three ways, compiled on torch tensors, eagerly on the same tensors
and on NumPy arrays, and the three give the same bits. ``fullgraph=True`` refuses any graph
break, and a recording backend counts the graphs and lists their gpuq ops. The backend is
``aot_eager`` (dynamo, fake tensors, AOT autograd, no code generation); one case runs
inductor (about 25 s to compile on a 2-core machine). GPU cases (CUDA graphs, torch's
stream) are in the device check's torch step, bench/gpu_torch_checks.py.
"""

from __future__ import annotations

import io

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import gpuq  # noqa: E402
import gpuq.torch  # noqa: E402
from test_torch_ops import as_numpy, bits, same  # noqa: E402


class Recorder:
    """A torch.compile backend that keeps every graph dynamo hands it, then runs ``inner``."""

    def __init__(self, inner="aot_eager"):
        self.graphs, self.inner = [], torch._dynamo.lookup_backend(inner)

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return self.inner(gm, example_inputs)

    def gpuq_ops(self):
        return sorted({str(n.target).split(".")[1] for g in self.graphs for n in g.graph.nodes
                       if n.op == "call_function" and str(n.target).startswith("gpuq.")})


def _x(shape=(6, 10), seed=0):
    return (torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 3).contiguous()


_S10 = np.linspace(0.01, 0.1, 10, dtype=np.float32)  # NumPy scales, as the op objects hold them


def _every_code_type(x, xb):
    """int8 with a zero point, fp8 per channel, int4 per group, bfloat16 in and out, dynamic
    quantization and parameters from data: the issue's cases in one body (any array type).
    Scales and zero points come as numbers, lists and NumPy arrays."""
    q8 = gpuq.quantize(x, 0.05, 3)
    f8 = gpuq.quantize(x, _S10, axis=1, dtype="float8_e4m3fn")
    c4 = gpuq.quantize(xb, [[0.5, 0.25, 0.125]] * 6, [[1, -2, 0]] * 6, axis=1, group_size=4, dtype="int4")
    u8 = gpuq.quantize(xb, 0.1, 128, dtype=np.uint8)  # NumPy's types as dtype arguments too
    qd, sd, zd = gpuq.quantize_dynamic(x, axis=0)
    s4, z4 = gpuq.choose_qparams(xb, axis=1, group_size=4, dtype="uint4")
    q4, _, _ = gpuq.quantize_dynamic(xb, axis=1, group_size=4, dtype="uint4")
    fb, sb, _ = gpuq.quantize_dynamic(x, block_size=(4, -1), dtype="float8_e4m3fn")  # block scales
    sm, zm = gpuq.choose_qparams(x, axis=1, group_size=4, dtype="int4", method="mse",
                                 scale_dtype="bfloat16")  # the MSE search, bfloat16 scales
    qm, _, _ = gpuq.quantize_dynamic(xb, axis=0, method="mse", scale_dtype=np.float16)
    return (q8, f8, c4, u8, qd, sd, zd, s4, z4, q4, fb, sb, sm, zm, qm,
            gpuq.dequantize(fb, sb, block_size=(4, -1), dtype="bfloat16"),
            gpuq.dequantize(q8, 0.05, 3, dtype="bfloat16"),
            gpuq.dequantize(f8, _S10, axis=1),
            gpuq.dequantize(c4, [[0.5, 0.25, 0.125]] * 6, [[1, -2, 0]] * 6, axis=1, group_size=4,
                            dtype=np.float16),
            gpuq.dequantize(qd, sd, zd, axis=0, dtype="bfloat16"),
            gpuq.dequantize(q4, s4, z4, axis=1, group_size=4))


def test_one_graph_with_the_bits_of_eager_and_numpy():
    x = _x()
    xb = (_x(seed=1) * 4).to(torch.bfloat16)
    before = (bits(x), bits(xb))
    rec = Recorder()
    got = torch.compile(_every_code_type, fullgraph=True, backend=rec)(x, xb)
    assert len(rec.graphs) == 1
    assert rec.gpuq_ops() == ["choose_qparams", "dequantize", "quantize", "quantize_dynamic"]
    eager = _every_code_type(x, xb)
    same(got, eager)
    # What the eager call returns comes back: torch tensors (fp8 as torch fp8), Codes of packed
    # torch bytes for int4/uint4, None for symmetric zero points.
    assert isinstance(got[2], gpuq.Codes) and isinstance(got[2].data, torch.Tensor)
    assert got[1].dtype == got[10].dtype == torch.float8_e4m3fn and got[15].dtype == torch.bfloat16
    numpy = _every_code_type(x.numpy(), as_numpy(xb))
    same(as_numpy(got), numpy)
    assert (bits(x), bits(xb)) == before  # inputs never written


def _fp4_fp6(x, xb, gs):
    """fp4 with MX and NVFP4 scales, fp6 with float32 and MSE scales (issue 37), quantized and
    dequantized (fp6 codes read back through a gpuq.Codes naming the type)."""
    qm, sm, _ = gpuq.quantize_dynamic(x, axis=1, group_size=32, dtype="float4_e2m1fn", scale_dtype="float8_e8m0fnu")
    qn, sn, _ = gpuq.quantize_dynamic(xb, axis=1, group_size=16, dtype="float4_e2m1fn",
                                      scale_dtype="float8_e4m3fn", global_scale=gs)
    s6, _ = gpuq.choose_qparams(x, axis=0, dtype="float6_e3m2fn", method="mse")
    q6 = gpuq.quantize(x, s6, axis=0, dtype="float6_e3m2fn")
    q2 = gpuq.quantize(xb, _S10[:1] * 2, dtype="float6_e2m3fn")
    c6 = q6 if isinstance(q6, np.ndarray) else gpuq.Codes(q6, tuple(q6.shape), "float6_e3m2fn")  # torch: uint8
    return (qm, sm, qn, sn, s6, q6, q2,
            gpuq.dequantize(qm, sm, axis=1, group_size=32, dtype="bfloat16"),
            gpuq.dequantize(qn, sn, axis=1, group_size=16, global_scale=gs),
            gpuq.dequantize(c6, s6, axis=0))


def test_fp4_fp6_one_graph_with_the_bits_of_eager_and_numpy():
    x = _x((6, 64))
    xb = (_x((6, 64), seed=1) * 4).to(torch.bfloat16)
    gs = float(gpuq.global_scale(xb))
    rec = Recorder()
    got = torch.compile(_fp4_fp6, fullgraph=True, backend=rec)(x, xb, gs)
    assert len(rec.graphs) == 1
    assert rec.gpuq_ops() == ["choose_qparams", "dequantize", "quantize", "quantize_dynamic"]
    same(got, _fp4_fp6(x, xb, gs))
    assert isinstance(got[0], gpuq.Codes) and got[0].dtype == "float4_e2m1fn" and got[5].dtype == torch.uint8
    numpy = _fp4_fp6(x.numpy(), as_numpy(xb), gs)
    # NumPy's fp6 codes are ml_dtypes arrays; torch's the uint8 tensor of the same bytes.
    numpy = tuple(n.view(np.uint8) if isinstance(n, np.ndarray) and n.dtype.name.startswith("float6") else n
                  for n in numpy)
    same(as_numpy(got), numpy)


@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")  # the eager path's
def test_without_the_ops_dynamo_breaks_the_graph():
    """The control, measured with torch._dynamo.explain: the eager call is opaque to dynamo
    (NumPy, numba); with gpuq.torch's route it is one graph of ops."""
    def f(x):
        return gpuq.dequantize(gpuq.quantize(x * 2, 0.25), 0.25) + 1

    x = _x()
    routed = torch._dynamo.explain(f)(x)
    assert (routed.graph_count, routed.graph_break_count) == (1, 0)
    hook = gpuq._interop.torch_ops
    gpuq._interop.torch_ops = None
    try:
        opaque = torch._dynamo.explain(f)(x)
        want = f(x)
    finally:
        gpuq._interop.torch_ops = hook
    assert opaque.graph_break_count >= 1, str(opaque)
    same(torch.compile(f, fullgraph=True, backend="aot_eager")(x), want)


def test_dynamic_shapes_one_graph_for_every_size():
    def f(x):
        c, s, z = gpuq.quantize_dynamic(x, axis=1, group_size=4, dtype="int4")
        return c, s, z, gpuq.dequantize(c, s, z, axis=1, group_size=4)

    rec = Recorder()
    fc = torch.compile(f, fullgraph=True, backend=rec, dynamic=True)
    # Odd counts pad the last byte. (A size that makes a dim 1, one group here, is a second
    # graph: torch specialises sizes 0 and 1.)
    for shape in ((5, 7), (9, 13), (2, 16)):
        x = _x(shape, seed=shape[0])
        got = fc(x)
        same(got, f(x))
        same(as_numpy(got), f(x.numpy()))
        assert got[0].shape == shape
    assert len(rec.graphs) == 1


def test_out_is_written_and_returned_under_compile():
    x = _x()
    out8 = torch.zeros(6, 10, dtype=torch.int8)
    out4 = gpuq.Codes(torch.zeros(30, dtype=torch.uint8), (6, 10), "int4")
    outf = torch.zeros(6, 10, dtype=torch.float16)

    def f(x, out8, out4, outf):
        a = gpuq.quantize(x, 0.05, out=out8)  # dtype from out
        b = gpuq.quantize(x, 0.5, dtype="int4", out=out4)
        c = gpuq.dequantize(out8, 0.05, out=outf)
        return a is out8, b is out4, c is outf

    assert torch.compile(f, fullgraph=True, backend="aot_eager")(x, out8, out4, outf) == (True, True, True)
    same(out8, gpuq.quantize(x.numpy(), 0.05))
    same(as_numpy(out4), gpuq.quantize(x.numpy(), 0.5, dtype="int4"))
    same(outf, gpuq.dequantize(gpuq.quantize(x.numpy(), 0.05), 0.05, dtype="float16"))


def _compile_error(fn, *args):
    with pytest.raises(Exception) as info:
        torch.compile(fn, fullgraph=True, backend="aot_eager")(*args)
    return info.value


def test_errors_under_compile_carry_the_eager_message():
    x = _x()
    eager = pytest.raises(ValueError, gpuq.quantize, x, [0.5] * 9, axis=1).value
    # Shape errors: the op's fake raises the eager error while dynamo traces; torch wraps it.
    err = _compile_error(lambda x: gpuq.quantize(x, [0.5] * 9, axis=1), x)
    assert isinstance(err, torch._dynamo.exc.TorchRuntimeError) and str(eager) in str(err)
    # Argument errors the ops cannot express are raised by the route while dynamo traces.
    eager = pytest.raises(ValueError, gpuq.quantize, x, 0.5, axis=(1,), group_size=2).value
    assert str(eager) in str(_compile_error(lambda x: gpuq.quantize(x, 0.5, axis=(1,), group_size=2), x))
    # Value errors need the data: the op's kernel raises the eager error itself when it runs.
    with pytest.raises(ValueError) as info:
        torch.compile(lambda x: gpuq.quantize(x, 0.0), fullgraph=True, backend="aot_eager")(x)
    assert str(info.value) == str(pytest.raises(ValueError, gpuq.quantize, x, 0.0).value)


class _QuantizedLinear(torch.nn.Module):
    """A linear layer whose weight goes through int8 per output channel on every call."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(_x((8, 16), seed=3))

    def forward(self, x):
        q, s, z = gpuq.quantize_dynamic(self.weight, axis=0)
        return x @ gpuq.dequantize(q, s, z, axis=0).T


@pytest.mark.parametrize("strict", [False, True])  # fake tensors through the route / dynamo
def test_export_keeps_the_ops_in_the_graph(strict):
    m, x = _QuantizedLinear(), _x((3, 16), seed=4)
    ep = torch.export.export(m, (x,), strict=strict)
    targets = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    assert "gpuq.quantize_dynamic.default" in targets and "gpuq.dequantize.default" in targets
    want = m(x)
    assert not want.requires_grad  # the ops record nothing: x does not need grad, the weight got none
    same(ep.module()(x), want)
    buf = io.BytesIO()
    torch.export.save(ep, buf)
    buf.seek(0)
    same(torch.export.load(buf).module()(x), want)


def test_the_readme_example_under_inductor():
    """README's torch.compile block, run as it stands (the one inductor case): inductor's code
    calls the ops, checking each output's size and strides against the fake's, and the result
    has eager's bits; the exported program keeps the ops."""
    import re
    from pathlib import Path

    from torch._inductor.utils import run_and_get_code

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme[readme.index("## Inside `torch.compile`"):]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    ns = {}
    _, code = run_and_get_code(exec, block, ns)
    code = "\n".join(code)
    assert "torch.ops.gpuq.quantize_dynamic.default(" in code and "torch.ops.gpuq.dequantize.default(" in code
    assert "assert_size_stride(" in code
    same(ns["y"], ns["m"](ns["x"]))
    targets = {str(n.target) for n in ns["ep"].graph.nodes}
    assert {"gpuq.quantize_dynamic.default", "gpuq.dequantize.default"} <= targets
