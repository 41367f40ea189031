"""Check the fixtures that make_fixtures.py wrote, against the real libraries
and against an independent reading of the formats (issue 29).

Run in the same scratch environment::

    /work/scratch29/bin/python tests/serving/check_fixtures.py tests/serving/fixtures

It writes ``checks.json`` beside the fixtures and prints it. What it checks:

1. ``layout``: every quantized tensor's dtype and shape, decoded with plain
   integer arithmetic written here from the format's description (offset-binary
   codes, element j at bit ``bits*j`` of the row's little-endian int32 stream,
   rows padded to whole words and the pad bits zero, zero points packed down
   the output dimension); the decoded codes dequantized as
   ``bf16(float32(q - zp) * float32(s))`` (and ``bf16(float32(fp8) *
   float32(s))`` for fp8) must equal the oracle bit for bit. For int4 rows of
   whole words, ``weight_packed``'s bytes XOR 0x88 must equal gpuq's int4
   packing of the same codes (element 2k in the low nibble of byte k).
2. ``rounding``: the codes compressed-tensors stored, recomputed from the
   ``base`` weights and the stored scale / zero point under two rules: its own
   (``torch.round(clamp(bf16(x / s) + zp))``, the division and the zero-point
   add in bf16) and gpuq's contract (``clamp(rint(float32(x) / float32(s)) +
   zp)``); the count of codes each rule gets wrong.
3. ``transformers``: ``AutoModelForCausalLM.from_pretrained`` of every folder
   on the CPU, a forward pass, the loaded Linear weights against the oracle,
   the logits against the bf16 model's.
4. ``convert_checkpoint``: compressed-tensors' own model-free dequantization
   of each folder (``CompressedTensorsDequantizer`` / ``FP8BlockDequantizer``),
   what fails and why, and its output against the oracle where it works.
5. ``decompress_model``: ``ModelCompressor.decompress_model`` on a model
   loaded compressed, against the oracle.
"""

import json
import os
import sys
import traceback

CT_NAMES = ["ct-int8-w8a16-channel-sym", "ct-int4-g128-sym", "ct-int4-g128-asym",
            "ct-fp8-channel", "ct-int4-channel-asym-padded", "ct-int8-channel-sym-padded"]
ALL_NAMES = CT_NAMES + ["fp8-blocks"]


def _base_of(root, name):
    with open(os.path.join(root, "manifest.json")) as f:
        return json.load(f)["notes"][name]["base"]


def _err(e):
    line = f"{type(e).__name__}: {e}".splitlines()[0]
    return line[:400]


def _bits16(t):
    import torch
    return t.contiguous().view(torch.int16)


def _mismatch(a, b):
    """number of elements whose bf16 bits differ"""
    return int((_bits16(a) != _bits16(b)).sum())


def _unpack_rows(words, bits, n):
    """int32 [rows, W] -> int64 [rows, n] unsigned fields: element j at bit bits*j
    of the row's little-endian stream (fields may straddle words)."""
    import numpy as np
    u = words.astype(np.uint32).astype(np.uint64)
    rows = u.shape[0]
    out = np.zeros((rows, n), dtype=np.int64)
    mask = (1 << bits) - 1
    for j in range(n):
        bit = bits * j
        w, off = divmod(bit, 32)
        v = u[:, w] >> np.uint64(off)
        if off + bits > 32:
            v = v | (u[:, w + 1] << np.uint64(32 - off))
        out[:, j] = (v & np.uint64(mask)).astype(np.int64)
    return out


def _pad_bits_zero(words, bits, n):
    import numpy as np
    u = words.astype(np.uint32).astype(np.uint64)
    used = bits * n
    total = 32 * u.shape[1]
    if used == total:
        return True
    w, off = divmod(used, 32)
    ok = True
    if off:
        ok &= bool(((u[:, w] >> np.uint64(off)) == 0).all())
        w += 1
    if w < u.shape[1]:
        ok &= bool((u[:, w:] == 0).all())
    return ok


def _gpuq_int4_pack(q):
    """gpuq's int4 packing of signed codes: element 2k in the low nibble of byte k
    over the C-order flattened tensor (README, Code dtypes)."""
    import numpy as np
    flat = (q.reshape(-1) & 0xF).astype(np.uint8)
    if flat.size % 2:
        flat = np.concatenate([flat, np.zeros(1, np.uint8)])
    return flat[0::2] | (flat[1::2] << 4)


def check_layout(root, report):
    import numpy as np
    import torch
    from safetensors.torch import load_file

    out = {}
    for name in ALL_NAMES:
        t = load_file(os.path.join(root, name, "model.safetensors"))
        oracle = load_file(os.path.join(root, "oracle", name, "dequantized.safetensors"))
        cfg = json.load(open(os.path.join(root, name, "config.json")))["quantization_config"]
        res = {"modules": 0, "mismatched_elements": 0, "problems": [], "shapes": {}}
        if name == "fp8-blocks":
            bs = cfg["weight_block_size"]
            for k in sorted(t):
                if not k.endswith(".weight_scale_inv"):
                    continue
                m = k.rpartition(".")[0]
                w, s = t[m + ".weight"], t[k]
                o, i = w.shape
                if w.dtype != torch.float8_e4m3fn or s.dtype != torch.float32:
                    res["problems"].append(f"{m}: dtypes {w.dtype} {s.dtype}")
                if tuple(s.shape) != (-(-o // bs[0]), -(-i // bs[1])):
                    res["problems"].append(f"{m}: scale shape {tuple(s.shape)}")
                full = s.repeat_interleave(bs[0], 0).repeat_interleave(bs[1], 1)[:o, :i]
                deq = (w.to(torch.float32) * full).to(torch.bfloat16)
                res["mismatched_elements"] += _mismatch(deq, oracle[m + ".weight"])
                res["shapes"][m] = {"weight": list(w.shape), "weight_scale_inv": list(s.shape)}
                res["modules"] += 1
            out[name] = res
            continue
        wargs = cfg["config_groups"]["group_0"]["weights"]
        bits = wargs["num_bits"]
        for k in sorted(t):
            if k.endswith(".weight_packed"):
                m = k[: -len(".weight_packed")]
                packed, shape, s = t[k], t[m + ".weight_shape"], t[m + ".weight_scale"]
                o, i = (int(x) for x in shape)
                if packed.dtype != torch.int32 or shape.dtype != torch.int64 or list(shape.shape) != [2]:
                    res["problems"].append(f"{m}: {packed.dtype} {shape.dtype} {list(shape.shape)}")
                if tuple(packed.shape) != (o, -(-(i * bits) // 32)):
                    res["problems"].append(f"{m}: packed shape {tuple(packed.shape)}")
                if s.dtype != torch.bfloat16:
                    res["problems"].append(f"{m}: scale dtype {s.dtype}")
                pw = packed.numpy()
                if not _pad_bits_zero(pw, bits, i):
                    res["problems"].append(f"{m}: nonzero pad bits")
                q = _unpack_rows(pw, bits, i) - (1 << (bits - 1))
                g = i if wargs["strategy"] == "channel" else wargs["group_size"]
                if tuple(s.shape) != (o, i // g):
                    res["problems"].append(f"{m}: scale shape {tuple(s.shape)}")
                zp = np.zeros((o, i // g), dtype=np.int64)
                shapes = {"weight_packed": list(packed.shape), "weight_scale": list(s.shape),
                          "weight_shape": shape.tolist()}
                if m + ".weight_zero_point" in t:
                    z = t[m + ".weight_zero_point"]
                    shapes["weight_zero_point"] = list(z.shape)
                    if z.dtype != torch.int32 or tuple(z.shape) != (-(-(o * bits) // 32), i // g):
                        res["problems"].append(f"{m}: zp {z.dtype} {tuple(z.shape)}")
                    # packed down the output dimension: unpack the transpose's rows
                    zp = (_unpack_rows(z.numpy().T.copy(), bits, o) - (1 << (bits - 1))).T
                elif not wargs["symmetric"]:
                    res["problems"].append(f"{m}: asymmetric but no weight_zero_point")
                qd = (q.reshape(o, i // g, g) - zp[:, :, None]).reshape(o, i)
                deq = (torch.from_numpy(qd.astype(np.float32))
                       * s.to(torch.float32).repeat_interleave(g, 1)).to(torch.bfloat16)
                res["mismatched_elements"] += _mismatch(deq, oracle[m + ".weight"])
                if bits == 4 and (i * 4) % 32 == 0:
                    ours = _gpuq_int4_pack(q.astype(np.int8))
                    theirs = pw.astype("<i4").view(np.uint8).reshape(-1) ^ 0x88
                    res.setdefault("xor_0x88_equal_modules", 0)
                    res["xor_0x88_equal_modules"] += int(np.array_equal(ours, theirs))
                res["shapes"][m] = shapes
                res["modules"] += 1
            elif k.endswith(".weight_scale") and m_is_fp8(t, k):
                m = k[: -len(".weight_scale")]
                w, s = t[m + ".weight"], t[k]
                if w.dtype != torch.float8_e4m3fn or s.dtype != torch.bfloat16:
                    res["problems"].append(f"{m}: dtypes {w.dtype} {s.dtype}")
                if tuple(s.shape) != (w.shape[0], 1):
                    res["problems"].append(f"{m}: scale shape {tuple(s.shape)}")
                deq = (w.to(torch.float32) * s.to(torch.float32)).to(torch.bfloat16)
                res["mismatched_elements"] += _mismatch(deq, oracle[m + ".weight"])
                res["shapes"][m] = {"weight": list(w.shape), "weight_scale": list(s.shape)}
                res["modules"] += 1
        out[name] = res
    report["layout"] = out


def m_is_fp8(t, k):
    import torch
    w = t.get(k[: -len("_scale")])
    return w is not None and w.dtype == torch.float8_e4m3fn


def check_rounding(root, report):
    """Which rule makes the codes compressed-tensors stored?"""
    import numpy as np
    import torch
    from safetensors.torch import load_file

    out = {}
    for name in CT_NAMES:
        base = load_file(os.path.join(root, _base_of(root, name), "model.safetensors"))
        t = load_file(os.path.join(root, name, "model.safetensors"))
        cfg = json.load(open(os.path.join(root, name, "config.json")))["quantization_config"]
        wargs = cfg["config_groups"]["group_0"]["weights"]
        bits = wargs["num_bits"]
        res = {"codes": 0, "ct_rule_wrong": 0, "gpuq_rule_wrong": 0, "scale_rule_wrong": 0}
        for k in sorted(t):
            if not (k.endswith(".weight_packed") or (k.endswith(".weight_scale") and m_is_fp8(t, k))):
                continue
            m = k.rpartition(".")[0]
            x = base[m + ".weight"]
            s = t[m + ".weight_scale"]
            o, i = x.shape
            g = i if wargs["strategy"] == "channel" else wargs["group_size"]
            sf = s.repeat_interleave(g, 1)
            if wargs["type"] == "float":
                stored = t[m + ".weight"]
                ct = torch.clamp(x / sf, -448, 448).to(torch.float8_e4m3fn)
                gq = (x.to(torch.float32) / sf.to(torch.float32)).clamp(-448, 448).to(torch.float8_e4m3fn)
                amax = x.abs().amax(dim=1, keepdim=True)
                sc = amax / torch.tensor(448.0, dtype=torch.bfloat16)
                res["codes"] += stored.numel()
                res["ct_rule_wrong"] += int((ct.view(torch.uint8) != stored.view(torch.uint8)).sum())
                res["gpuq_rule_wrong"] += int((gq.view(torch.uint8) != stored.view(torch.uint8)).sum())
                res["scale_rule_wrong"] += int((_bits16(sc) != _bits16(s)).sum())
                continue
            q = torch.from_numpy(_unpack_rows(t[k].numpy(), bits, i) - (1 << (bits - 1)))
            qmin, qmax = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
            if m + ".weight_zero_point" in t:
                z = t[m + ".weight_zero_point"].numpy()
                zp = torch.from_numpy((_unpack_rows(z.T.copy(), bits, o) - (1 << (bits - 1))).T.copy())
            else:
                zp = torch.zeros(s.shape, dtype=torch.int64)
            zf = zp.repeat_interleave(g, 1)
            ct = torch.round(torch.clamp(x / sf + zf.to(torch.bfloat16), qmin, qmax)).to(torch.int64)
            gq = torch.clamp(torch.from_numpy(np.rint(x.to(torch.float32).numpy()
                                                      / sf.to(torch.float32).numpy())).to(torch.int64)
                             + zf, qmin, qmax)
            res["codes"] += q.numel()
            res["ct_rule_wrong"] += int((ct != q).sum())
            res["gpuq_rule_wrong"] += int((gq != q).sum())
            # the scale: symmetric max|x| / ((qmax - qmin) / 2), in bf16
            xr = x.reshape(o, i // g, g)
            if wargs["symmetric"]:
                amax = torch.maximum(xr.amax(-1).clamp(min=0), -xr.amin(-1).clamp(max=0))
                sc = amax / torch.tensor((qmax - qmin) / 2, dtype=torch.bfloat16)
            else:
                lo, hi = xr.amin(-1).clamp(max=0), xr.amax(-1).clamp(min=0)
                sc = (hi - lo) / torch.tensor(float(qmax - qmin), dtype=torch.bfloat16)
                zz = torch.round(torch.clamp(qmin - lo / sc, qmin, qmax)).to(torch.int64)
                res.setdefault("zp_rule_wrong", 0)
                res["zp_rule_wrong"] += int((zz != zp).sum())
            res["scale_rule_wrong"] += int((_bits16(sc) != _bits16(s)).sum())
        out[name] = res
    report["rounding"] = out


def _ids():
    import torch
    g = torch.Generator().manual_seed(0)
    return torch.randint(3, 128, (2, 16), generator=g)


def check_transformers(root, report):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    out = {}
    ids = _ids()
    refs = {}
    for base in ("base", "padded-base", "fp8-blocks-base"):
        mdl = AutoModelForCausalLM.from_pretrained(os.path.join(root, base), dtype=torch.bfloat16)
        with torch.no_grad():
            refs[base] = mdl(ids).logits.float()
    for name in ALL_NAMES:
        res = {}
        try:
            mdl = AutoModelForCausalLM.from_pretrained(os.path.join(root, name))
            with torch.no_grad():
                logits = mdl(ids).logits.float()
            ref = refs[_base_of(root, name)]
            res["loaded"] = True
            res["dtype"] = str(next(mdl.parameters()).dtype)
            res["logits_max_abs_diff_vs_bf16"] = float((logits - ref).abs().max())
            res["logits_ref_max_abs"] = float(ref.abs().max())
            res["argmax_agreement"] = float((logits.argmax(-1) == ref.argmax(-1)).float().mean())
            oracle = load_file(os.path.join(root, "oracle", name, "dequantized.safetensors"))
            sd = mdl.state_dict()
            bad, missing, per_module = 0, [], {}
            for k, v in oracle.items():
                if k not in sd:
                    missing.append(k)
                    continue
                w = sd[k]
                n = _mismatch(w.to(torch.bfloat16), v) if w.dtype == torch.bfloat16 else v.numel()
                bad += n
                if n:
                    per_module[k] = f"{n} of {v.numel()}"
                if w.dtype != torch.bfloat16:
                    res.setdefault("weight_dtypes", set()).add(str(w.dtype))
            res["weights_vs_oracle_mismatched_elements"] = bad
            if per_module:
                res["mismatched_by_tensor"] = per_module
            if missing:
                res["weights_missing"] = missing[:3] + (["..."] if len(missing) > 3 else [])
            if "weight_dtypes" in res:
                res["weight_dtypes"] = sorted(res["weight_dtypes"])
        except Exception as e:
            res["loaded"] = False
            res["error"] = _err(e)
            res["where"] = traceback.extract_tb(e.__traceback__)[-1].filename.split("site-packages/")[-1]
        out[name] = res
    report["transformers"] = out


def check_convert_checkpoint(root, tmp, report):
    import shutil

    import torch
    from compressed_tensors.entrypoints.convert import (
        CompressedTensorsDequantizer, FP8BlockDequantizer, convert_checkpoint)
    from safetensors.torch import load_file

    out = {}

    def run(label, folder, make):
        dst = os.path.join(tmp, label)
        shutil.rmtree(dst, ignore_errors=True)
        res = {}
        try:
            convert_checkpoint(folder, dst, make(), max_workers=1, device="cpu")
            got = {}
            for f in os.listdir(dst):
                if f.endswith(".safetensors"):
                    got.update(load_file(os.path.join(dst, f)))
            oracle = load_file(os.path.join(root, "oracle", os.path.basename(folder),
                                            "dequantized.safetensors"))
            res["ok"] = True
            res["mismatched_elements_vs_oracle"] = sum(_mismatch(got[k], v) for k, v in oracle.items())
            cfg = json.load(open(os.path.join(dst, "config.json")))
            res["quantization_config_removed"] = "quantization_config" not in cfg
        except Exception as e:
            res["ok"] = False
            res["error"] = _err(e)
        out[label] = res

    for name in CT_NAMES:
        folder = os.path.join(root, name)
        run(name, folder, lambda f=folder: CompressedTensorsDequantizer(f, dtype=torch.bfloat16))
        if name == "ct-fp8-channel":
            run(name + "+ignore-embed", folder, lambda f=folder: CompressedTensorsDequantizer(
                f, ignore=["model.embed_tokens"], dtype=torch.bfloat16))
            run(name + "+ignore-embed-norms", folder, lambda f=folder: CompressedTensorsDequantizer(
                f, ignore=["model.embed_tokens", "re:.*norm$"], dtype=torch.bfloat16))
    folder = os.path.join(root, "fp8-blocks")
    run("fp8-blocks", folder, lambda: FP8BlockDequantizer.from_pretrained(folder, dtype=torch.bfloat16))
    report["convert_checkpoint"] = out


def check_decompress_model(root, report):
    import torch
    from compressed_tensors.compressors import ModelCompressor
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    out = {}
    for name in CT_NAMES:
        res = {}
        try:
            mdl = AutoModelForCausalLM.from_pretrained(os.path.join(root, name))
            hf_q = getattr(mdl, "hf_quantizer", None)
            comp = hf_q.compressor if hf_q is not None else ModelCompressor.from_compression_config(
                mdl.config.quantization_config)
            comp.decompress_model(mdl)
            sd = mdl.state_dict()
            oracle = load_file(os.path.join(root, "oracle", name, "dequantized.safetensors"))
            res["mismatched_elements_vs_oracle"] = sum(
                _mismatch(sd[k].to(torch.bfloat16), v) if sd[k].dtype == torch.bfloat16 else v.numel()
                for k, v in oracle.items())
        except Exception as e:
            res["error"] = _err(e)
        out[name] = res
    report["decompress_model"] = out


def main(argv):
    import tempfile

    import compressed_tensors
    import torch
    import transformers

    root = os.path.abspath(argv[1] if len(argv) > 1 else "tests/serving/fixtures")
    report = {"versions": {"torch": torch.__version__,
                           "compressed-tensors": compressed_tensors.__version__,
                           "transformers": transformers.__version__}}
    try:
        import accelerate
        report["versions"]["accelerate"] = accelerate.__version__
    except ImportError:
        report["versions"]["accelerate"] = None
    check_layout(root, report)
    check_rounding(root, report)
    check_transformers(root, report)
    with tempfile.TemporaryDirectory() as tmp:
        check_convert_checkpoint(root, tmp, report)
    check_decompress_model(root, report)
    name = argv[2] if len(argv) > 2 else "checks.json"
    with open(os.path.join(root, name), "w") as f:
        json.dump(report, f, indent=2, sort_keys=True)
        f.write("\n")
    print(json.dumps(report, indent=2, sort_keys=True))


if __name__ == "__main__":
    main(sys.argv)
