"""Which weights a serving-format run quantizes, the ``ignore`` list, and vLLM's shape rules.

**Which weights.** The rank-2 floating ``M.weight`` tensors of Linear layers: gpuq sees tensor
names, not modules, so an embedding is told by its name (a last part containing ``embed``:
``embed_tokens``, ``word_embeddings``, ``embed_in``, ``tok_embeddings``; or ``wte``/``wpe``) and
norms by their rank (1). ``lm_head`` stays in float unless an ``--include`` pattern names it
(every compressed-tensors recipe ignores it). ``--include``/``--exclude``/``--min-size`` select
as for gpuq's own format (:func:`gpuq.checkpoints.selection.select`). A weight whose input dimension the
group size does not divide stays in float (compressed-tensors refuses it). vLLM merges q/k/v
(``qkv_proj``) and gate/up (``gate_up_proj``) into one layer and refuses a merged layer whose
parts differ, so such a set is quantized whole or kept whole in float.

**The ignore rule.** ``targets: ["Linear"]`` and ``ignore`` lists, by exact module name, every
module ``M`` whose ``M.weight`` the output keeps in float (``lm_head``, embeddings, norms, and
every weight left out above), plus ``lm_head`` where the model ties it to the embedding and
stores no ``lm_head.weight``. The model loaders (transformers and vLLM through
compressed-tensors' matching: a Linear by class, minus exact ignore names) then quantize exactly
the weights gpuq quantized; compressed-tensors' model-free tools (``convert_checkpoint``, its
dequantizers), which take every ``M.weight`` of a non-ignored module as quantized, agree too,
since the embedding and the norms are listed. Fine-grained fp8 lists the same modules as
``ignored_layers``.
"""

from __future__ import annotations

import collections
import fnmatch

from ..files import CliError
from ..report import natural_key
from ..selection import is_float, select

#: vLLM's merged Linears (the Llama family's ``packed_modules_mapping``) and Mixtral's expert
#: gate/up (``w1``/``w3``, which vLLM's FusedMoE loads into one ``w13`` and, for NVFP4, reads
#: with w1's global scale alone: vllm#54150): parts of one layer.
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj"),
         "w13": ("w1", "w3")}
#: Marlin's rules (vLLM ``marlin_utils``): group sizes, and the multiples of out and in.
MARLIN_GROUPS, MARLIN_OUT, MARLIN_IN = (-1, 32, 64, 128), 64, 128


def module_of(name: str) -> str:
    """The module of a tensor name.

    >>> module_of("model.layers.0.mlp.up_proj.weight")
    'model.layers.0.mlp.up_proj'
    """
    return name.rpartition(".")[0]


def is_embedding(module: str) -> bool:
    """Whether a module is an embedding, by its name.

    >>> is_embedding("model.embed_tokens"), is_embedding("transformer.wte"), is_embedding("lm_head")
    (True, True, False)
    """
    last = module.rpartition(".")[2]
    return "embed" in last or last in ("wte", "wpe")


#: The reason the report gives for a router kept in float.
ROUTER = "MoE router"


def is_moe_router(module: str) -> bool:
    """Whether a module is a mixture-of-experts router, by its name: the rule every serving
    format applies (those modules stay in float). A router is a module whose last name is
    ``gate`` under ``mlp`` or ``block_sparse_moe`` (Qwen3-MoE, DeepSeek-V3, Mixtral), any module
    named ``router`` (gpt-oss) and ``shared_expert_gate`` (Qwen2-MoE); other routers are left to
    ``--exclude``.

    >>> [is_moe_router(m) for m in ("model.layers.0.mlp.gate", "model.layers.0.block_sparse_moe.gate",
    ...                             "model.layers.0.mlp.router", "model.layers.0.mlp.shared_expert_gate")]
    [True, True, True, True]
    >>> [is_moe_router(m) for m in ("model.layers.0.mlp.gate_proj", "model.layers.0.attn.gate", "gate")]
    [False, False, False]
    """
    parent, _, last = module.rpartition(".")
    return (last == "gate" and parent.rpartition(".")[2] in ("mlp", "block_sparse_moe")
            or last in ("router", "shared_expert_gate"))


def choose(specs: dict, config: dict, scheme_for, *, include=(), exclude=(), min_size) -> tuple:
    """``(chosen, kept, ignore)``: ``{weight name: scheme}`` to quantize, ``{weight name: why}``
    for the Linear weights kept in float (:data:`ROUTER` for a MoE router, whatever the
    selection says), and the ``ignore`` list (see the module docstring).

    ``scheme_for(name, shape)`` is the scheme of a weight, or the reason it cannot have one.

    >>> import numpy as np
    >>> f = np.dtype("float32")
    >>> specs = {"embed_tokens.weight": ((64, 32), f), "a.q_proj.weight": ((32, 32), f),
    ...          "a.k_proj.weight": ((32, 32), f), "a.v_proj.weight": ((32, 32), f),
    ...          "norm.weight": ((32,), f), "lm_head.weight": ((64, 32), f)}
    >>> chosen, kept, ignore = choose(specs, {}, lambda name, shape: ("a scheme",), min_size=0)
    >>> sorted(chosen), sorted(kept), ignore
    (['a.k_proj.weight', 'a.q_proj.weight', 'a.v_proj.weight'], ['lm_head.weight'], ['embed_tokens', 'lm_head', 'norm'])
    """
    eligible = set(select(specs, include=include, exclude=exclude, min_size=min_size))
    linear = [n for n, (shape, dtype) in specs.items() if n.endswith(".weight") and len(shape) == 2
              and is_float(dtype) and not is_embedding(module_of(n))]
    chosen, kept = {}, {}
    for name in linear:
        module = module_of(name)
        if is_moe_router(module):
            kept[name] = ROUTER
        elif name not in eligible:
            kept[name] = "not selected (--include/--exclude/--min-size)"
        elif module.rpartition(".")[2] == "lm_head" and not any(fnmatch.fnmatchcase(name, p) for p in include):
            kept[name] = "the output layer, kept by default: an --include naming it quantizes it"
        else:
            scheme = scheme_for(name, specs[name][0])
            if isinstance(scheme, str):
                kept[name] = scheme
            else:
                chosen[name] = scheme
    _keep_merged_layers_whole(chosen, kept)
    if not chosen:
        raise CliError(f"no Linear weight to quantize: of {len(linear)} rank-2 floating *.weight "
                       f"tensors (embeddings aside), none is selected and fits the scheme"
                       + (f" ({_why_kept(kept)})" if kept else ""))
    floats = {module_of(n) for n in specs if n.endswith(".weight") and n not in chosen}
    if config.get("tie_word_embeddings") and not any(module_of(n).rpartition(".")[2] == "lm_head"
                                                     for n in specs):
        floats.add("lm_head")  # the tied output layer: a Linear with no weight of its own here
    return chosen, kept, sorted(floats, key=natural_key)


def _why_kept(kept: dict) -> str:
    """Each distinct reason of ``kept`` with how many weights it keeps, the most common first
    and the output layer's default last (it is rarely why nothing fits).

    >>> _why_kept({"a": "x", "b": "y", "c": "y", "lm_head.weight": "the output layer, kept by default"})
    '2 weights: y; 1 weight: x; 1 weight: the output layer, kept by default'
    """
    counts = collections.Counter(kept.values())
    order = sorted(counts, key=lambda r: (r.startswith("the output layer"), -counts[r]))
    return "; ".join(f"{counts[r]} weight{'s' if counts[r] > 1 else ''}: {r}" for r in order)


def _keep_merged_layers_whole(chosen: dict, kept: dict) -> None:
    """Move every part of a merged layer to ``kept`` when one part is kept."""
    for parent_part in list(kept):
        parent, _, last = module_of(parent_part).rpartition(".")
        for parts in FUSED.values():
            if last not in parts:
                continue
            for other in parts:
                name = f"{parent}.{other}.weight"
                if name in chosen:
                    del chosen[name]
                    kept[name] = (f"kept with {parent}.{last}: vLLM merges {'/'.join(parts)} into "
                                  f"one layer, quantized whole or not at all")


def merged_position(module: str, present) -> tuple:
    """``(merged name, is_last_part)`` of a module that vLLM merges with others ``present``
    (module names), or ``(None, True)``.

    >>> merged_position("a.q_proj", {"a.q_proj", "a.k_proj", "a.v_proj"})
    ('qkv_proj', False)
    """
    parent, _, last = module.rpartition(".")
    for merged, parts in FUSED.items():
        if last in parts:
            later = [p for p in parts[parts.index(last) + 1:] if f"{parent}.{p}" in present]
            return merged, not later
    return None, True


def vllm_check(module: str, shape, scheme, present) -> str:
    """Whether vLLM's kernels take this layer's shape: for int codes Marlin's rules (group size
    in -1/32/64/128, ``out % 64``, ``in % 128``; zero points for 4-bit codes only), for
    fp4 weight-only codes (NVFP4, MXFP4) fp4 Marlin's (:func:`fp4_marlin_check`), for
    fine-grained fp8 the merged layers' rule (every part but the last a whole number of blocks
    along out); fp8 per channel or tensor, fp6, MX fp8 and the MXFP4 preset with fp4
    activations have no shape rule here (``"-"``).

    >>> from gpuq.checkpoints.formats.compressed_tensors import PACK
    >>> from gpuq.checkpoints.serving.formats import WeightScheme, int_code
    >>> vllm_check("a.q_proj", (100, 256), WeightScheme(int_code(4), "group", True, "bfloat16", PACK,
    ...            group_size=128), set())
    'no: out 100 % 64'
    """
    out, n = shape
    problems = []
    if scheme.code.codec == "float8" and scheme.code.bits == 4 and scheme.preset != "MXFP4":
        return fp4_marlin_check(shape, scheme)
    if scheme.code.codec == "float8":
        if scheme.strategy != "block":
            return "-"
        merged, last = merged_position(module, present)
        if not last and out % scheme.block[0]:
            problems.append(f"merged into {merged}, out {out} % {scheme.block[0]}")
        return "ok" if not problems else "no: " + "; ".join(problems)
    group = -1 if scheme.strategy == "channel" else scheme.group_size
    if group not in MARLIN_GROUPS:
        problems.append(f"group {group} not in Marlin's 32/64/128")
    if out % MARLIN_OUT:
        problems.append(f"out {out} % {MARLIN_OUT}")
    if n % MARLIN_IN:
        problems.append(f"in {n} % {MARLIN_IN}")
    if not scheme.symmetric and scheme.code.bits != 4:
        problems.append(f"asymmetric {scheme.code.name}: Marlin's zero points are 4-bit only")
    return "Marlin ok" if not problems else "no: " + "; ".join(problems)


#: fp4 Marlin (vLLM ``generate_kernels.py``): the group of each scale dtype (NVFP4's e4m3 scales
#: per 16, MXFP4's e8m0 per 32), the only ones its kernels are built for.
FP4_MARLIN_GROUPS = {"float8_e4m3fn": 16, "float8_e8m0fnu": 32}


def fp4_marlin_check(shape, scheme) -> str:
    """Whether vLLM's fp4 Marlin kernel (what it runs compressed-tensors' NVFP4A16 and MXFP4A16
    Linears with: ``CompressedTensorsW4A16Fp4``, ``CompressedTensorsW4A16Mxfp4``) takes an
    ``[out, in]`` weight: ``prepare_fp4_layer_for_marlin`` pads ``out`` up to a multiple of 64
    (``marlin_utils_fp4.py``), and ``marlin_gemm`` needs one of its thread tiles (k, n) in
    (128, 128), (64, 256), (64, 128), (128, 64) to divide (in, padded out) (``marlin.cu``
    ``is_valid_config``; (128, 64) and (64, 128) serve every batch size): so ``in % 128 == 0``,
    or ``in % 64 == 0`` with the padded ``out % 128 == 0``. The group must be the kernel's (16
    for e4m3 scales, 32 for e8m0). MXFP4's kernels take bfloat16 activations only (a load note
    says so for float16 models).

    >>> from gpuq.checkpoints.serving.formats import WeightScheme
    >>> from gpuq._codetypes import as_code_type
    >>> nv = WeightScheme(as_code_type("float4_e2m1fn"), "tensor_group", True, "float8_e4m3fn", None, group_size=16)
    >>> fp4_marlin_check((100, 256), nv), fp4_marlin_check((100, 192), nv), fp4_marlin_check((64, 192), nv)
    ('Marlin ok', 'Marlin ok', 'no: in 192 % 128 (or in % 64 with out 64, padded to 64, % 128)')
    """
    out, n = shape
    problems = []
    group = FP4_MARLIN_GROUPS.get(scheme.scale_dtype)
    if scheme.group_size != group:
        problems.append(f"group {scheme.group_size} with {scheme.scale_dtype} scales: fp4 Marlin takes "
                        f"{', '.join(f'{g} ({d})' for d, g in FP4_MARLIN_GROUPS.items())}")
    padded = -(-out // 64) * 64
    if n % 128 and not (n % 64 == 0 and padded % 128 == 0):
        problems.append(f"in {n} % 128 (or in % 64 with out {out}, padded to {padded}, % 128)")
    return "Marlin ok" if not problems else "no: " + "; ".join(problems)
