"""gpuq's registered torch ops (gpuq/torch.py, gpuq/_torch_ops.py) with real torch, CPU tensors.

The schemas are pinned; ``torch.library.opcheck`` runs every op over representative
arguments (schema, autograd registration, fake tensor, AOT dispatch with dynamic shapes,
outputs compared with a tolerance of 0); each op's results equal the eager NumPy call bit
for bit; the fake implementations give symbolic shapes and the eager call's errors. The
compiled functions are in tests/test_torch_compile.py.
"""

from __future__ import annotations

import io
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import gpuq  # noqa: E402
import gpuq.torch  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402


def bits(a):
    """``(kind, dtype name, shape, raw bytes)`` of a torch tensor, NumPy array or gpuq.Codes:
    equal exactly when the values are the same bits (no tolerance, NaN payloads included)."""
    if isinstance(a, gpuq.Codes):
        return ("codes", a.dtype, tuple(a.shape), bits(a.data)[3])
    if isinstance(a, torch.Tensor):
        t = a.detach().contiguous()
        return ("array", str(t.dtype).rpartition(".")[2], tuple(t.shape),
                t.reshape(-1).view(torch.uint8).numpy().tobytes())
    a = np.asarray(a)
    return ("array", a.dtype.name, a.shape, a.tobytes())  # tobytes: C order, whatever the strides


def same(got, want):
    """Results equal bit for bit, tuples and None included."""
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want)
        for g, w in zip(got, want):
            same(g, w)
    elif want is None:
        assert got is None
    else:
        assert bits(got) == bits(want)


def host(t):
    """A CPU torch tensor as the NumPy array gpuq reads (bfloat16/fp8: ml_dtypes' type, same bits)."""
    name = str(t.dtype).rpartition(".")[2]
    if name == "bfloat16":
        from gpuq._dtypes import bfloat16

        return t.view(torch.int16).numpy().view(bfloat16())
    if name.startswith("float8"):
        from gpuq._codetypes import fp8_dtype

        return t.view(torch.uint8).numpy().view(fp8_dtype(name))
    return t.numpy()


def as_numpy(r):
    """An eager result on torch tensors as the NumPy call gives it (tuples, Codes, None kept)."""
    if isinstance(r, tuple):
        return tuple(as_numpy(x) for x in r)
    if isinstance(r, gpuq.Codes):
        return gpuq.Codes(r.data.numpy(), r.shape, r.dtype)
    return None if r is None else host(r)


def _x(shape=(4, 6), dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * 3).to(dtype)


# -- the schemas -------------------------------------------------------------------------------

def test_the_registered_schemas_are_the_pinned_ones():
    for name, schema in gpuq.torch.SCHEMAS.items():
        assert str(getattr(torch.ops.gpuq, name).default._schema) == f"gpuq::{name}{schema}"


def test_every_argument_after_the_tensors_is_keyword_only():
    """What lets a keyword with a default (block_size) be appended without breaking a call:
    no call passes one of these by position."""
    for name in gpuq.torch.SCHEMAS:
        for arg in getattr(torch.ops.gpuq, name).default._schema.arguments:
            tensor = str(arg.type).startswith("Tensor") or str(arg.type) == "Optional[Tensor]"
            assert arg.kwarg_only != tensor, (name, arg.name)


def test_a_keyword_appended_to_a_schema_keeps_saved_programs_running():
    """How block_size was added (and how the next keyword will be): an op defined with
    quantize's schema before it, a program using it exported and saved, the op redefined with
    today's schema; the saved program loads and runs. (Arguments equal to their defaults are
    not stored in the program.)"""
    ns, calls = "gpuq_schema_evolution", []

    def define(schema):
        def kernel(src, scales, zps=None, **kwargs):
            calls.append(kwargs)
            return torch.round(src / scales).to(torch.int8)

        op = torch.library.custom_op(f"{ns}::quantize", kernel, mutates_args=(), schema=schema)
        op.register_fake(lambda src, scales, zps=None, **kwargs: torch.empty_like(src, dtype=torch.int8))

    class Uses(torch.nn.Module):
        def forward(self, x):
            return getattr(torch.ops, ns).quantize(x, torch.tensor(0.5), axis=[0], dtype="int8")

    x, today = _x((3,)), gpuq.torch.SCHEMAS["quantize"]
    before = today.split(", int[]? block_size=None")[0] + ") -> Tensor"  # before block_size (and what came after it)
    assert before != today
    define(before)
    buf = io.BytesIO()
    torch.export.save(torch.export.export(Uses(), (x,)), buf)
    define(today)
    assert "block_size" in str(getattr(torch.ops, ns).quantize.default._schema)
    buf.seek(0)
    same(torch.export.load(buf).module()(x), torch.round(x / 0.5).to(torch.int8))
    assert calls[-1] == {"axis": [0]}  # dtype="int8" is the default: never stored, never passed


# -- registration ------------------------------------------------------------------------------

def _run(code):
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def test_import_gpuq_never_imports_torch_and_gpuq_torch_registers():
    assert _run("""
        import sys, gpuq
        print("torch" in sys.modules)
        import torch
        print(hasattr(torch.ops.gpuq, "quantize"), gpuq._interop.torch_ops is None)
        import gpuq.torch
        print(hasattr(torch.ops.gpuq, "quantize"), gpuq._interop.torch_ops is gpuq.torch)
    """) == ["False", "False", "True", "True", "True"]


def test_import_gpuq_after_torch_registers_the_ops():
    assert _run("""
        import torch, gpuq
        print(sorted(n for n in ("quantize", "dequantize", "choose_qparams", "quantize_dynamic")
                     if hasattr(torch.ops.gpuq, n)) == sorted(gpuq.torch.SCHEMAS))
    """) == ["True"]


def test_a_torch_without_custom_ops_leaves_import_gpuq_working():
    """torch < 2.4 (no torch.library.custom_op), already imported: import gpuq works, without
    ops (the eager calls as before); import gpuq.torch says what it needs."""
    out = _run("""
        import sys, types
        old = types.ModuleType("torch")
        old.__version__, old.library, old.Tensor = "2.3.1", types.SimpleNamespace(), type("Tensor", (), {})
        fake = types.ModuleType("torch._subclasses.fake_tensor")
        fake.is_fake = lambda t: False
        sys.modules.update({"torch": old, "torch._subclasses": types.ModuleType("torch._subclasses"),
                            "torch._subclasses.fake_tensor": fake})
        import gpuq
        print(gpuq._interop.torch_ops is None, gpuq.quantize([1.0], 1.0).tolist() == [1])
        try:
            import gpuq.torch
        except ImportError as exc:
            print(str(exc) == "gpuq.torch needs torch >= 2.4 (torch.library.custom_op), got torch 2.3.1")
    """)
    assert out == ["True", "True", "True"]


# -- opcheck -----------------------------------------------------------------------------------

def _opcheck_cases():
    x, xb = _x(), _x((5, 7), torch.bfloat16, 1)
    s6, s7 = torch.rand(6) + 0.1, torch.rand(5, 2) + 0.1
    z6 = torch.randint(-3, 4, (6,), dtype=torch.int32)
    q = torch.ops.gpuq.quantize(x, s6, z6, axis=[1])
    packed = torch.ops.gpuq.quantize(xb, s7, axis=[1], group_size=4, dtype="uint4")
    f8 = torch.ops.gpuq.quantize(x, torch.tensor(0.05), dtype="float8_e4m3fn")
    grad = x.clone().requires_grad_(True)
    return [
        ("quantize", (x, torch.tensor(0.05), torch.tensor(3)), {}),
        ("quantize", (xb, s7), dict(axis=[1], group_size=4, dtype="s4")),  # oneDNN's short names too
        ("quantize", (grad, s6, z6), dict(axis=[1], dtype="u8")),
        ("quantize", (_x((2, 3, 4)), torch.rand(2, 4) + 0.1), dict(axis=[0, 2], dtype="float8_e5m2")),
        ("quantize", (_x((5, 7)), torch.rand(3, 1) + 0.1), dict(block_size=[2, -1], dtype="float8_e4m3fn")),
        ("dequantize", (q, s6.clone().requires_grad_(True), z6), dict(axis=[1], dtype="float16")),
        ("dequantize", (packed, s7), dict(axis=[1], group_size=4, packed="uint4", shape=[5, 7],
                                          dtype="bfloat16")),
        ("dequantize", (f8, torch.tensor(0.05, dtype=torch.float64)), dict(dtype="float64")),
        ("choose_qparams", (grad,), dict(axis=[1], group_size=4, dtype="uint8")),
        ("choose_qparams", (xb,), dict(symmetric=True)),
        ("quantize_dynamic", (grad,), dict(axis=[0])),
        ("quantize_dynamic", (xb,), dict(axis=[1], group_size=4, dtype="int4", symmetric=True)),
        ("quantize_dynamic", (x,), dict(dtype="float8_e4m3fn")),
        ("quantize_dynamic", (xb,), dict(block_size=[2, 4], dtype="uint8")),
        ("choose_qparams", (xb,), dict(axis=[1], group_size=4, dtype="int4", symmetric=True, scale_rule="full")),
        ("quantize_dynamic", (grad,), dict(axis=[0], dtype="uint8", symmetric=True, scale_rule="full")),
    ]


@pytest.mark.parametrize("i", range(16))
def test_opcheck(i):
    name, args, kwargs = _opcheck_cases()[i]
    utils = torch.library._OPCHECK_DEFAULT_UTILS
    fp8 = (torch.float8_e4m3fn, torch.float8_e5m2)
    fp8_in = [a for a in args if isinstance(a, torch.Tensor) and a.dtype in fp8]
    if fp8_in:
        # test_schema compares inputs before and after with allclose, which torch has no CPU
        # kernel for on fp8: the inputs' bits are compared here instead.
        utils = tuple(u for u in utils if u != "test_schema")
        before = [bits(a) for a in fp8_in]
    op = getattr(torch.ops.gpuq, name)
    torch.library.opcheck(op.default, args, kwargs, test_utils=utils, atol=0, rtol=0)
    if fp8_in:
        op(*args, **kwargs)
        assert [bits(a) for a in fp8_in] == before


def _eager_kwargs(kwargs):
    """An op's keyword arguments as the public function takes them."""
    kw = dict(kwargs)
    if kw.get("axis") is not None:
        kw["axis"] = gpuq._torch_ops.eager_axis(kw["axis"])
    if kw.get("block_size") is not None:
        kw["block_size"] = tuple(kw["block_size"])
    return kw


@pytest.mark.parametrize("i", range(14))
def test_each_op_gives_the_numpy_calls_bits(i):
    name, args, kwargs = _opcheck_cases()[i]
    got = getattr(torch.ops.gpuq, name)(*args, **kwargs)
    kw = _eager_kwargs(kwargs)
    packed, shape = kw.pop("packed", None), kw.pop("shape", None)
    np_args = [host(a.detach()) for a in args]
    if packed is not None:
        np_args[0] = gpuq.Codes(np_args[0], tuple(shape), packed)
    want = getattr(gpuq, name)(*np_args, **kw)
    # Graph outputs are tensors: packed bytes for Codes, no None for absent zero points.
    if isinstance(want, tuple):
        want = tuple(w.data if isinstance(w, gpuq.Codes) else w for w in want if w is not None)
        got = tuple(got)
    elif isinstance(want, gpuq.Codes):
        want = want.data
    same(got, want)


def _fp4_fp6_cases():
    """fp4/fp6 codes with float32 scales, MX (e8m0) and NVFP4 (e4m3 + global_scale) scales (issue 37)."""
    x, xb = _x((4, 40)), _x((3, 33), torch.bfloat16, 2)
    s4, sb = torch.rand(4, 2) + 0.1, torch.rand(3) + 0.1
    f4 = torch.ops.gpuq.quantize(x, s4, axis=[1], group_size=32, dtype="float4_e2m1fn")
    f6 = torch.ops.gpuq.quantize(xb, sb, axis=[0], dtype="float6_e3m2fn")
    gs = float(gpuq.global_scale(x.numpy()))
    sn = torch.ops.gpuq.choose_qparams(x, axis=[1], group_size=16, dtype="float4_e2m1fn",
                                       scale_dtype="float8_e4m3fn", global_scale=gs)[0]
    fn = torch.ops.gpuq.quantize(x, sn, axis=[1], group_size=16, dtype="float4_e2m1fn", global_scale=gs)
    return [
        ("quantize", (x, s4), dict(axis=[1], group_size=32, dtype="float4_e2m1fn")),
        ("quantize", (xb, sb), dict(axis=[0], dtype="f6_e3m2")),
        ("quantize", (_x((5, 7)), torch.tensor(0.3)), dict(dtype="float6_e2m3fn")),
        ("quantize", (x, sn), dict(axis=[1], group_size=16, dtype="float4_e2m1fn", global_scale=gs)),
        ("dequantize", (f4, s4), dict(axis=[1], group_size=32, packed="float4_e2m1fn", shape=[4, 40],
                                      dtype="bfloat16")),
        ("dequantize", (f6, sb), dict(axis=[0], packed="float6_e3m2fn", dtype="float16")),
        ("dequantize", (f6, sb), dict(axis=[0], packed="float6_e3m2fn", shape=[3, 33])),
        ("dequantize", (fn, sn), dict(axis=[1], group_size=16, packed="float4_e2m1fn", shape=[4, 40],
                                      global_scale=gs)),
        ("choose_qparams", (xb,), dict(axis=[1], group_size=32, dtype="float6_e2m3fn")),
        ("choose_qparams", (x,), dict(axis=[1], group_size=32, dtype="float4_e2m1fn", scale_dtype="float8_e8m0fnu",
                                      scale_rule="rceil")),
        ("choose_qparams", (xb,), dict(axis=[1], group_size=16, dtype="float4_e2m1fn", scale_dtype="float8_e4m3fn",
                                       global_scale=gs)),
        ("choose_qparams", (x,), dict(axis=[0], dtype="float6_e3m2fn", method="mse", scale_dtype="bfloat16")),
        ("quantize_dynamic", (x,), dict(axis=[1], group_size=32, dtype="float4_e2m1fn",
                                        scale_dtype="float8_e8m0fnu")),
        ("quantize_dynamic", (xb,), dict(axis=[1], group_size=32, dtype="float6_e2m3fn",
                                         scale_dtype="float8_e8m0fnu", scale_rule="floor")),
        ("quantize_dynamic", (x,), dict(axis=[1], group_size=16, dtype="float4_e2m1fn", scale_dtype="float8_e4m3fn",
                                        global_scale=gs)),
        ("quantize_dynamic", (xb,), dict(axis=[0], dtype="float4_e2m1fn", method="mse", scale_dtype="float16")),
    ]


@pytest.mark.parametrize("i", range(16))
def test_opcheck_fp4_fp6(i):
    name, args, kwargs = _fp4_fp6_cases()[i]
    torch.library.opcheck(getattr(torch.ops.gpuq, name).default, args, kwargs, atol=0, rtol=0)


@pytest.mark.parametrize("i", range(16))
def test_each_fp4_fp6_op_gives_the_numpy_calls_bits(i):
    """The op's tensors are the NumPy call's bits: fp4 its packed bytes, fp6 the bytes of its
    ml_dtypes array (read back through a gpuq.Codes naming the type), scales exactly."""
    name, args, kwargs = _fp4_fp6_cases()[i]
    got = getattr(torch.ops.gpuq, name)(*args, **kwargs)
    kw = _eager_kwargs(kwargs)
    packed, shape = kw.pop("packed", None), kw.pop("shape", None)
    np_args = [host(a.detach()) for a in args]
    if packed is not None:
        np_args[0] = gpuq.Codes(np_args[0], tuple(np_args[0].shape if shape is None else shape), packed)
    want = getattr(gpuq, name)(*np_args, **kw)

    def raw(w):  # the graph's tensor of an eager NumPy result
        if isinstance(w, gpuq.Codes):
            return w.data
        return w.view(np.uint8) if w.dtype.name.startswith("float6") else w

    want = tuple(raw(w) for w in want if w is not None) if isinstance(want, tuple) else raw(want)
    same(tuple(got) if isinstance(got, list) else got, want)


def test_fp6_bytes_are_checked_as_codes_checks_them():
    """packed= names fp6 codes too (one uint8 byte per code, shape= optional and src's); the fake
    and the kernel refuse what gpuq.Codes refuses, with its words."""
    codes = torch.zeros(4, 6, dtype=torch.uint8)
    for kwargs in (dict(packed="float6_e2m3fn", shape=[6, 4]), dict(packed="float6_e2m3fn", shape=[24])):
        eager = _error(gpuq.Codes, codes, tuple(kwargs["shape"]), "float6_e2m3fn")
        assert _error(torch.ops.gpuq.dequantize, codes, torch.tensor(0.5), **kwargs) == eager
        with FakeTensorMode() as mode:
            assert _error(torch.ops.gpuq.dequantize, mode.from_tensor(codes), torch.tensor(0.5), **kwargs) == eager
    eager = _error(gpuq.Codes, codes.to(torch.int8), (4, 6), "float6_e3m2fn")
    assert _error(torch.ops.gpuq.dequantize, codes.to(torch.int8), torch.tensor(0.5), packed="float6_e3m2fn") == eager
    with pytest.raises(ValueError, match="packed must be one of int4, uint4, float4_e2m1fn, float6_e2m3fn, "
                                         "float6_e3m2fn .*got 'float8_e4m3fn'"):
        torch.ops.gpuq.dequantize(codes, torch.tensor(0.5), packed="float8_e4m3fn")


def test_fp6_codes_under_tracing_are_the_eager_calls():
    """The public calls on fake tensors: fp6 codes come back as a uint8 tensor and dequantize reads
    the gpuq.Codes of one, as eagerly; NVFP4's global_scale goes through as a number."""
    x = _x((4, 32))
    q = gpuq.quantize(x, 0.25, dtype="float6_e2m3fn")
    assert q.dtype == torch.uint8 and q.shape == (4, 32)
    gs = gpuq.global_scale(x)  # torch tensors (CPU here) read as the NumPy call reads them
    assert gs == gpuq.global_scale(x.numpy())
    assert gpuq.global_scale(x.to(torch.bfloat16)) == gpuq.global_scale(host(x.to(torch.bfloat16)))
    with FakeTensorMode() as mode:
        xf = mode.from_tensor(x)
        qf = gpuq.quantize(xf, 0.25, dtype="float6_e2m3fn")
        assert (qf.dtype, qf.shape) == (torch.uint8, (4, 32))
        y = gpuq.dequantize(gpuq.Codes(qf, (4, 32), "float6_e2m3fn"), 0.25, dtype="bfloat16")
        assert (y.dtype, y.shape) == (torch.bfloat16, (4, 32))
        qn, sn, zn = gpuq.quantize_dynamic(xf, axis=1, group_size=16, dtype="float4_e2m1fn",
                                           scale_dtype="float8_e4m3fn", global_scale=gs)
        assert isinstance(qn, gpuq.Codes) and qn.data.shape == (64,) and sn.shape == (4, 2) and zn is None


def test_outputs_never_require_grad():
    w = torch.nn.Parameter(_x())
    s = torch.nn.Parameter(torch.rand(6) + 0.1)
    q = torch.ops.gpuq.quantize(w, s, axis=[1])
    y = torch.ops.gpuq.dequantize(q, s, axis=[1])
    outs = [q, y, *torch.ops.gpuq.choose_qparams(w), *torch.ops.gpuq.quantize_dynamic(w, dtype="uint8")]
    assert not any(o.requires_grad for o in outs)
    # The control: a differentiable op on the same Parameter records a graph.
    assert (w * s).requires_grad
    same(y, gpuq.dequantize(gpuq.quantize(w.detach().numpy(), s.detach().numpy(), axis=1),
                            s.detach().numpy(), axis=1))


# -- fake implementations: symbolic shapes ----------------------------------------------------

def _symbolic_shapes(fn, x, *args):
    """The shapes (as strings, ``x``'s sizes named n0, n1...) and dtypes of every op node's
    value when ``fn(x, *args)`` is traced with symbolic sizes."""
    import re

    gm = make_fx(fn, tracing_mode="symbolic")(x, *args)
    nodes = list(gm.graph.nodes)
    names = {str(d): f"n{i}" for i, d in enumerate(nodes[0].meta["val"].shape)}
    out = {}
    for node in nodes:
        if node.op == "call_function" and str(node.target).startswith("gpuq."):
            vals = node.meta["val"] if isinstance(node.meta["val"], list) else [node.meta["val"]]
            out[str(node.target).split(".")[1]] = [
                (re.sub(r"\bs\d+\b", lambda m: names[m.group()], str(tuple(v.shape))), v.dtype) for v in vals]
    return out


def test_fake_shapes_are_symbolic():
    def f(x):
        q, s, z = gpuq.quantize_dynamic(x, axis=1, group_size=4, dtype="uint4")
        return q.data, gpuq.dequantize(q, s, z, axis=1, group_size=4, dtype="bfloat16")

    shapes = _symbolic_shapes(f, _x((3, 10)))
    groups = "-(((-n1)//4))"  # ceil(n1 / 4), sympy's way
    assert shapes["quantize_dynamic"] == [("(((n0*n1 + 1)//2),)", torch.uint8),
                                          (f"(n0, {groups})", torch.float32),
                                          (f"(n0, {groups})", torch.int32)]
    assert shapes["dequantize"] == [("(n0, n1)", torch.bfloat16)]


def test_fake_shapes_of_block_scales_are_symbolic():
    def f(x, s):
        return gpuq.quantize(x, s, block_size=(2, -1)), gpuq.choose_qparams(x, block_size=(2, 4))[0]

    shapes = _symbolic_shapes(f, _x((6, 10)), torch.rand(3, 1) + 0.1)
    assert shapes == {"quantize": [("(n0, n1)", torch.int8)],
                      "choose_qparams": [("(-(((-n0)//2)), -(((-n1)//4)))", torch.float32),
                                         ("(-(((-n0)//2)), -(((-n1)//4)))", torch.int32)]}


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int4", "uint4", "float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("symmetric", [None, True, False])
def test_fake_parameters_are_the_real_ones(dtype, symmetric):
    """choose_qparams' fake gives what its kernel gives: which zero points are left out (None
    in the eager call), every dtype and shape; or the eager call's error for both."""
    x = _x((4, 6))
    kw = dict(axis=[1], dtype=dtype, symmetric=symmetric)
    try:
        real = torch.ops.gpuq.choose_qparams(x, **kw)
    except ValueError as exc:
        with FakeTensorMode() as mode, pytest.raises(ValueError, match=re.escape(str(exc))):
            torch.ops.gpuq.choose_qparams(mode.from_tensor(x), **kw)
        return
    with FakeTensorMode() as mode:
        fake = torch.ops.gpuq.choose_qparams(mode.from_tensor(x), **kw)
    assert [(t.dtype, t.shape) for t in fake] == [(t.dtype, t.shape) for t in real]
    eager = gpuq.choose_qparams(x, axis=1, dtype=dtype, symmetric=symmetric)
    assert len(real) == 2 - (eager[1] is None)


@pytest.mark.parametrize("dtype, want", [("int8", torch.int8), ("float8_e5m2", torch.float8_e5m2)])
def test_fake_shapes_per_channel_and_multi_axis(dtype, want):
    def f(x, s):
        return gpuq.quantize(x, s, axis=(0, 2), dtype=dtype), gpuq.choose_qparams(x, axis=(2, 0))[0]

    shapes = _symbolic_shapes(f, _x((2, 3, 5)), torch.rand(2, 5) + 0.1)
    assert shapes == {"quantize": [("(n0, n1, n2)", want)], "choose_qparams": [("(n0, n2)", torch.float32),
                                                                             ("(n0, n2)", torch.int32)]}


# -- fake implementations: the eager call's errors ---------------------------------------------

def _error_cases():
    x, s6, z6 = _x(), torch.rand(6) + 0.1, torch.zeros(6, dtype=torch.int32)
    q = gpuq.quantize(x, s6, axis=1)
    c = gpuq.quantize(x, s6, axis=1, dtype="int4")
    c4 = gpuq.quantize(x, 0.5, dtype="float4_e2m1fn")
    f6 = gpuq.Codes(gpuq.quantize(x, s6, axis=1, dtype="float6_e2m3fn"), (4, 6), "float6_e2m3fn")
    return [
        (gpuq.quantize, (x, torch.rand(5) + 0.1), dict(axis=1)),
        (gpuq.quantize, (x, s6, torch.zeros(3, dtype=torch.int32)), dict(axis=1)),
        (gpuq.quantize, (x, torch.ones(6, dtype=torch.bool)), dict(axis=1)),
        (gpuq.quantize, (x, s6, torch.zeros(6)), dict(axis=1)),
        (gpuq.quantize, (x.to(torch.int32), 0.5), {}),
        (gpuq.quantize, (x, 0.5), dict(dtype="int9")),
        (gpuq.quantize, (x, 0.5), dict(saturate=False)),
        (gpuq.quantize, (x, 0.5), dict(axis=2)),
        (gpuq.quantize, (x, s6), dict(axis=(1,), group_size=2)),
        (gpuq.quantize, (x, s6), dict(axis=1, group_size=0)),
        (gpuq.quantize, (x, torch.rand(4, 3) + 0.1), dict(axis=1, group_size=4)),
        (gpuq.dequantize, (x, 0.5), {}),
        (gpuq.dequantize, (q, s6, z6), dict(axis=1, dtype="int8")),
        (gpuq.dequantize, (c, torch.rand(4) + 0.1), dict(axis=1)),
        (gpuq.choose_qparams, (x,), dict(dtype="float8_e4m3fn", symmetric=False)),
        (gpuq.choose_qparams, (x,), dict(eps=-1.0)),
        (gpuq.choose_qparams, (x,), dict(dtype="int9")),
        (gpuq.quantize_dynamic, (x.to(torch.int8),), {}),
        (gpuq.quantize_dynamic, (x,), dict(axis=(0, 0))),
        (gpuq.quantize, (x, 0.5), dict(block_size=2)),
        (gpuq.quantize, (x, 0.5), dict(block_size=(2, 2, 2))),
        (gpuq.quantize, (x, torch.rand(2, 2) + 0.1), dict(block_size=(2, 2))),
        (gpuq.dequantize, (q, s6), dict(axis=1, block_size=(1, 1))),
        (gpuq.choose_qparams, (x,), dict(block_size=(0, 2))),
        # options the schema's bool?/float?/str would coerce or word as torch does
        (gpuq.choose_qparams, (x,), dict(symmetric=1)),
        (gpuq.choose_qparams, (x,), dict(eps=True)),
        (gpuq.choose_qparams, (x,), dict(scale_dtype=None)),
        (gpuq.choose_qparams, (x,), dict(method=None)),
        (gpuq.quantize, (x, 0.5), dict(saturate=1)),
        (gpuq.quantize_dynamic, (x,), dict(symmetric=0)),
        (gpuq.quantize, (x, np.True_), {}),
        # fp4/fp6 codes, MX and NVFP4 scales (issue 37)
        (gpuq.quantize, (x, 0.5), dict(dtype="float4_e2m1fn", global_scale=-1.0)),
        (gpuq.quantize, (x, 0.5), dict(dtype="int8", global_scale=2.0)),
        (gpuq.quantize, (x, 0.5), dict(dtype="float6_e3m2fn", saturate=False)),
        (gpuq.dequantize, (f6, torch.rand(5) + 0.1), dict(axis=1)),
        (gpuq.dequantize, (c4, 0.5), dict(global_scale="gs")),
        (gpuq.choose_qparams, (x,), dict(dtype="float4_e2m1fn", scale_dtype="float8_e4m3fn")),
        (gpuq.choose_qparams, (x,), dict(dtype="float6_e2m3fn", scale_dtype="float8_e8m0fnu", method="mse")),
        (gpuq.choose_qparams, (x,), dict(dtype="int4", scale_dtype="float8_e8m0fnu")),
        (gpuq.quantize_dynamic, (x,), dict(dtype="float4_e2m1fn", scale_dtype="float8_e4m3fn", global_scale=0.0)),
        (gpuq.quantize_dynamic, (x,), dict(dtype="float4_e2m1fn", scale_dtype="float8_e8m0fnu", scale_rule="up")),
    ]


def _error(fn, *args, **kwargs):
    with pytest.raises((TypeError, ValueError)) as info:
        fn(*args, **kwargs)
    return type(info.value), str(info.value)


def _fake(mode, a):
    return mode.from_tensor(a) if isinstance(a, torch.Tensor) else (
        gpuq.Codes(mode.from_tensor(a.data), a.shape, a.dtype) if isinstance(a, gpuq.Codes) else a)


@pytest.mark.parametrize("i", range(41))
def test_fake_tensors_raise_the_eager_calls_error(i):
    """The public call on fake tensors (what torch.export's tracing does) goes through the op's
    fake implementation and raises what the eager call on real tensors raises, word for word."""
    fn, args, kwargs = _error_cases()[i]
    eager = _error(fn, *args, **kwargs)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake_args = [_fake(mode, a) for a in args]
        assert gpuq.torch.traced(fake_args[0])
        assert _error(fn, *fake_args, **kwargs) == eager


def test_the_error_cases_are_all_run():
    assert len(_error_cases()) == 41


@pytest.mark.parametrize("zps", [np.int32(3), [np.int64(1), 2, np.uint8(3), 4, 5, 6]])
def test_numpy_integer_zero_points_when_traced(zps):
    """NumPy integer scalars are zero points under torch.export's default (non-strict) tracing
    too, which hands them to gpuq as they are (dynamo's strict tracing makes them Python ints)."""
    x = _x()
    axis, scales = (None, 0.05) if np.isscalar(zps) else (1, [0.05] * 6)
    want = gpuq.quantize(x, scales, zps, axis=axis, dtype="uint8")

    class M(torch.nn.Module):
        def forward(self, x):
            return gpuq.quantize(x, scales, zps, axis=axis, dtype="uint8")

    same(torch.export.export(M(), (x,), strict=False).module()(x), want)


def test_packed_bytes_are_checked_as_codes_checks_them():
    wrong = torch.zeros(11, dtype=torch.uint8)
    eager = _error(gpuq.Codes, wrong, (4, 6), "int4")
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(wrong)
        assert _error(torch.ops.gpuq.dequantize, fake, torch.tensor(0.5), packed="int4",
                      shape=[4, 6]) == eager
        strided = mode.from_tensor(torch.zeros(24, dtype=torch.uint8)[::2])
        assert _error(torch.ops.gpuq.dequantize, strided, torch.tensor(0.5), packed="int4", shape=[4, 6]) == \
            _error(gpuq.Codes, torch.zeros(24, dtype=torch.uint8)[::2], (4, 6), "int4")
    for kwargs, words in ((dict(packed="int8", shape=[4, 6]), "packed must be one of int4, uint4"),
                          (dict(packed="uint4"), "shape is required with packed='uint4'")):
        with pytest.raises(ValueError, match=words):  # the kernel
            torch.ops.gpuq.dequantize(torch.zeros(12, dtype=torch.uint8), torch.tensor(0.5), **kwargs)
        with FakeTensorMode(allow_non_fake_inputs=True), pytest.raises(ValueError, match=words):  # the fake
            torch.ops.gpuq.dequantize(torch.zeros(12, dtype=torch.uint8), torch.tensor(0.5), **kwargs)


def test_value_errors_come_from_the_kernel():
    """A scale of 0 needs the data: the fake passes it, the op's kernel raises the eager error."""
    x = _x()
    with FakeTensorMode() as mode:
        assert torch.ops.gpuq.quantize(mode.from_tensor(x), torch.tensor(0.0)).shape == (4, 6)
    assert _error(torch.ops.gpuq.quantize, x, torch.tensor(0.0)) == _error(gpuq.quantize, x.numpy(), 0.0)
