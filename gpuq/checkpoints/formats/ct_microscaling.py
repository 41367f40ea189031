"""compressed-tensors 0.20's microscaling layouts: ``nvfp4-pack-quantized``,
``mxfp4-pack-quantized``, ``mxfp6-pack-quantized`` and ``mxfp8-quantized`` (one
:class:`~gpuq.checkpoints.serving.formats.Layout` each, registered by
:mod:`.compressed_tensors`).

For a quantized Linear ``M`` with weight ``[out, in]`` (README, "Presets and the 4-bit formats";
each checked against compressed-tensors' own compressors in ``tests/serving/test_ct_microscaling.py``):

=======================  ======================================================================
format                   tensors
=======================  ======================================================================
nvfp4-pack-quantized     ``M.weight_packed`` U8 ``[out, in/2]`` (element 2j in the low nibble),
                         ``M.weight_scale`` F8_E4M3 ``[out, in/16]``, ``M.weight_global_scale``
                         F32 ``[1]``; the weight is ``e2m1(q) * float32(s_b / gs)``
mxfp4-pack-quantized     ``M.weight_packed`` U8 ``[out, in/2]``, ``M.weight_scale`` U8
                         ``[out, in/32]`` (biased exponents: ``2**(b - 127)``)
mxfp6-pack-quantized     ``M.weight_packed`` U8 ``[out, 3*in/4]`` (four e2m3 codes
                         ``c0 | c1<<6 | c2<<12 | c3<<18`` in three little-endian bytes),
                         ``M.weight_scale`` U8 ``[out, in/32]``
mxfp8-quantized          ``M.weight`` F8_E4M3 ``[out, in]``, ``M.weight_scale`` U8 ``[out, in/32]``
=======================  ======================================================================

The codes and scales are gpuq's array API's (``scale_dtype="float8_e8m0fnu"`` with the ``even``
rule by default, bit-exact with compressed-tensors' MX compressors; NVFP4's
``gpuq.global_scale`` and ``scale_dtype="float8_e4m3fn"``, bit-exact with its NVFP4 compressor
given the same global scale). One difference: an fp4 weight of exactly -0.0 is code 0x8 in gpuq
(ml_dtypes, ONNX) and 0x0 in compressed-tensors (both read back as zero).

>>> NVFP4.name, [MX[b].name for b in (4, 6, 8)]
('nvfp4-pack-quantized', ['mxfp4-pack-quantized', 'mxfp6-pack-quantized', 'mxfp8-quantized'])
"""

from __future__ import annotations

import numpy as np

from ..files import CliError
from ..serving.formats import Layout, WeightScheme

#: compressed-tensors' ``scale_dtype`` of each scale kind (its config's torch dtype names).
CT_SCALE_DTYPES = {"float8_e4m3fn": "torch.float8_e4m3fn", "float8_e8m0fnu": "torch.uint8"}


def pack_fp4(codes) -> np.ndarray:
    """One fp4 code per element (ml_dtypes' float4_e2m1fn or its uint8 bits) ``[out, in]`` ->
    U8 ``[out, in/2]``, element 2j in the low nibble.

    >>> pack_fp4(np.uint8([[1, 2, 15, 8]])).tolist()
    [[33, 143]]
    """
    c = np.ascontiguousarray(codes).view(np.uint8) & np.uint8(0x0F)
    return (c[:, 0::2] | (c[:, 1::2] << np.uint8(4))).astype(np.uint8)


def pack_fp6(codes) -> np.ndarray:
    """One 6-bit code per element ``[out, in]`` (in % 4 == 0) -> U8 ``[out, 3*in/4]``:
    compressed-tensors' four codes in three little-endian bytes.

    >>> pack_fp6(np.uint8([[1, 2, 3, 63]])).tolist()
    [[129, 48, 252]]
    """
    c = np.ascontiguousarray(codes).view(np.uint8).reshape(codes.shape[0], -1, 4).astype(np.uint32) & 0x3F
    w = c[..., 0] | (c[..., 1] << 6) | (c[..., 2] << 12) | (c[..., 3] << 18)
    return np.stack([w & 0xFF, (w >> 8) & 0xFF, w >> 16], -1).astype(np.uint8).reshape(codes.shape[0], -1)


def unpack_fp6(packed) -> np.ndarray:
    """:func:`pack_fp6` undone: uint8 codes ``[out, 4*cols/3]``.

    >>> unpack_fp6(pack_fp6(np.uint8([[1, 2, 3, 63], [0, 32, 5, 7]]))).tolist()
    [[1, 2, 3, 63], [0, 32, 5, 7]]
    """
    b = packed.reshape(packed.shape[0], -1, 3).astype(np.uint32)
    w = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16)
    c = np.stack([(w >> s) & 0x3F for s in (0, 6, 12, 18)], -1)
    return c.astype(np.uint8).reshape(packed.shape[0], -1)


def _check(arr, name, dtype, shape) -> None:
    if arr.dtype != dtype or tuple(arr.shape) != tuple(shape):
        raise CliError(f"tensor {name!r} is {arr.dtype} {list(arr.shape)}, expected {np.dtype(dtype).name} "
                       f"{list(shape)}")


def _positive(s, name) -> np.ndarray:
    """float32 scales, refused unless every one is finite and > 0 (the readers' rule)."""
    bad = ~(np.isfinite(s) & (s > 0))
    if bad.any():
        i = tuple(int(j) for j in np.argwhere(bad)[0])
        raise CliError(f"tensor {name!r} holds a scale that is not finite and > 0 ({s[i]} at {list(i)})")
    return s


def e8m0_float32(stored, name, grid) -> np.ndarray:
    """U8 biased exponents ``grid`` -> float32 ``2**(b - 127)``; byte 255 (NaN) refused."""
    import gpuq

    _check(stored, name, np.uint8, grid)
    if (stored == 255).any():
        i = tuple(int(j) for j in np.argwhere(stored == 255)[0])
        raise CliError(f"tensor {name!r} holds e8m0 scale byte 255 (NaN) at {list(i)}: no scale")
    return gpuq.e8m0_scales(stored)


class _Micro(Layout):
    """What the four layouts share: codes of one float type, scales per ``group`` along the
    input dimension (``weight_scale``), the weight's shape from the stored codes'."""

    code_name: str = ""
    group = 32
    #: stored codes per input element (a packed layout holds fewer bytes than elements)
    bytes_per = (1, 1)
    global_scale = False
    #: gpuq.checkpoints.fused: the scales, the codes' stored bytes and the figures in one pass
    one_pass = "micro"

    def params(self, scheme):
        return ("weight_packed", "weight_scale")

    def dense_cols(self, stored_cols: int) -> int:
        return stored_cols * self.bytes_per[1] // self.bytes_per[0]

    def stored_cols(self, n: int) -> int:
        return n * self.bytes_per[0] // self.bytes_per[1]

    def shape(self, module, scheme, load, specs) -> tuple:
        name = self.primary(module, scheme)
        dims = tuple(specs[name][0])
        if len(dims) != 2 or (dims[1] * self.bytes_per[1]) % self.bytes_per[0]:
            raise CliError(f"tensor {name!r} has shape {list(dims)}: not the [out, "
                           f"{self.bytes_per[0]}*in/{self.bytes_per[1]}] codes of {self.name}")
        return (dims[0], self.dense_cols(dims[1]))

    def entries(self, module, shape, scheme) -> dict:
        out, n = shape
        return {f"{module}.{self.params(scheme)[0]}": ((out, self.stored_cols(n)), self.stored_dtype()),
                f"{module}.weight_scale": ((out, n // self.group), self.scale_numpy())}

    def stored_dtype(self):
        return np.dtype(np.uint8)

    def scale_numpy(self):
        return np.dtype(np.uint8)

    def store(self, codes):
        return codes

    def load_codes(self, stored, shape):
        return stored

    def encode(self, module, shape, scheme, codes, scales, zps, **_) -> dict:
        import gpuq

        return {f"{module}.{self.params(scheme)[0]}": self.store(codes),
                f"{module}.weight_scale": gpuq.e8m0_bytes(np.asarray(scales, np.float32)).reshape(
                    shape[0], -1)}

    def encode_bytes(self, module, shape, scheme, codes, scale_bytes, **_) -> dict:
        """:meth:`encode`'s tensors from the codes' stored bytes (uint8 ``[out, stored_cols]``)
        and the scales' (uint8 ``[out, in / group]``): gpuq.checkpoints.fused's one pass."""
        return {f"{module}.{self.params(scheme)[0]}": codes.view(self.stored_dtype()),
                f"{module}.weight_scale": scale_bytes.view(self.scale_numpy())}

    def decode(self, module, scheme, load) -> tuple:
        name = f"{module}.{self.params(scheme)[0]}"
        stored = load(name)
        if stored.ndim != 2:
            raise CliError(f"tensor {name!r} is {stored.dtype} {list(stored.shape)}: not 2-D codes")
        shape = (stored.shape[0], self.dense_cols(stored.shape[1]))
        _check(stored, name, self.stored_dtype(), (shape[0], self.stored_cols(shape[1])))
        if shape[1] % self.group:
            raise CliError(f"tensor {name!r} holds {shape[1]} codes a row, not a whole number of groups "
                           f"of {self.group} ({self.name})")
        scales = self.scales(module, load, (shape[0], shape[1] // self.group))
        return self.load_codes(stored, shape), scales, None, shape

    def scales(self, module, load, grid):
        return e8m0_float32(load(f"{module}.weight_scale"), f"{module}.weight_scale", grid)


class MXFP4Packed(_Micro):
    """``mxfp4-pack-quantized``: e2m1 codes two per byte, e8m0 scales per 32."""

    name, code_name, bytes_per = "mxfp4-pack-quantized", "float4_e2m1fn", (1, 2)

    def store(self, codes):
        return pack_fp4(codes)

    def load_codes(self, stored, shape):
        import gpuq

        return gpuq.Codes(np.ascontiguousarray(stored).reshape(-1), shape, "float4_e2m1fn")


class MXFP6Packed(_Micro):
    """``mxfp6-pack-quantized``: e2m3 codes four in three bytes, e8m0 scales per 32."""

    name, code_name, bytes_per = "mxfp6-pack-quantized", "float6_e2m3fn", (3, 4)

    def store(self, codes):
        return pack_fp6(codes)

    def load_codes(self, stored, shape):
        import ml_dtypes

        return unpack_fp6(stored).view(ml_dtypes.float6_e2m3fn)


class MXFP8Quantized(_Micro):
    """``mxfp8-quantized``: e4m3 codes in ``M.weight``, e8m0 scales per 32."""

    name, code_name = "mxfp8-quantized", "float8_e4m3fn"

    def params(self, scheme):
        return ("weight", "weight_scale")

    def stored_dtype(self):
        import ml_dtypes

        return np.dtype(ml_dtypes.float8_e4m3fn)

    def store(self, codes):
        return np.ascontiguousarray(codes).view(self.stored_dtype())


class NVFP4Packed(MXFP4Packed):
    """``nvfp4-pack-quantized``: e2m1 codes two per byte, e4m3 scales per 16, a float32 global
    scale; the scales gpuq dequantizes with are ``float32(s_b / gs)``."""

    name, group, global_scale = "nvfp4-pack-quantized", 16, True

    def params(self, scheme):
        return ("weight_packed", "weight_scale", "weight_global_scale")

    def scale_numpy(self):
        import ml_dtypes

        return np.dtype(ml_dtypes.float8_e4m3fn)

    def entries(self, module, shape, scheme) -> dict:
        return {**super().entries(module, shape, scheme),
                f"{module}.weight_global_scale": ((1,), np.dtype(np.float32))}

    def encode(self, module, shape, scheme, codes, scales, zps, *, global_scale) -> dict:
        return {f"{module}.weight_packed": pack_fp4(codes),
                f"{module}.weight_scale": np.asarray(scales, np.float32).reshape(shape[0], -1).astype(
                    self.scale_numpy()),
                f"{module}.weight_global_scale": np.float32([global_scale])}

    def encode_bytes(self, module, shape, scheme, codes, scale_bytes, *, global_scale) -> dict:
        return {**super().encode_bytes(module, shape, scheme, codes, scale_bytes),
                f"{module}.weight_global_scale": np.float32([global_scale])}

    def scales(self, module, load, grid):
        gname = f"{module}.weight_global_scale"
        gs = load(gname)
        if gs.dtype != np.float32 or gs.size != 1:
            raise CliError(f"tensor {gname!r} is {gs.dtype} {list(gs.shape)}, expected float32 [1]")
        gs = _positive(gs.reshape(()), gname)
        name = f"{module}.weight_scale"
        stored = load(name)
        _check(stored, name, self.scale_numpy(), grid)
        sb = _positive(stored.astype(np.float32), name)
        return (sb / np.float32(gs)).astype(np.float32)


NVFP4 = NVFP4Packed()
#: The MX layouts by element bits.
MX = {4: MXFP4Packed(), 6: MXFP6Packed(), 8: MXFP8Quantized()}
#: compressed-tensors' format name -> layout, for the readers.
LAYOUTS = {NVFP4.name: NVFP4, **{layout.name: layout for layout in MX.values()}}


def scheme_for(code, scales: str, scale_dtype_model=None, scale_rule=None) -> WeightScheme:
    """The :class:`~gpuq.checkpoints.serving.formats.WeightScheme` of ``code`` (a code row) with
    ``scales`` ``"nvfp4"`` or ``"mx"``.

    >>> from gpuq._codetypes import CODE_TYPES
    >>> scheme_for(CODE_TYPES["float4_e2m1fn"], "nvfp4").describe()
    'float4_e2m1fn g=16 e4m3 + global'
    """
    if scales == "nvfp4":
        return WeightScheme(code, "tensor_group", True, "float8_e4m3fn", NVFP4, group_size=16)
    layout = MX[code.bits]
    return WeightScheme(code, "group", True, "float8_e8m0fnu", layout, group_size=32, scale_rule=scale_rule)


def read_scheme(w: dict, layout, bad) -> WeightScheme:
    """The scheme of a config group's ``weights`` for one of these layouts; ``bad(why)`` for
    arguments the layout does not hold."""
    from ..._codetypes import CODE_TYPES

    code = CODE_TYPES[layout.code_name]
    bits = code.bits
    strategy = "tensor_group" if layout is NVFP4 else "group"
    scale = "float8_e4m3fn" if layout is NVFP4 else "float8_e8m0fnu"
    want = {"type": "float", "num_bits": bits, "strategy": strategy, "group_size": layout.group,
            "symmetric": True}
    got = {k: w.get(k, True if k == "symmetric" else None) for k in want}
    if got != want or w.get("dynamic") not in (False, None) or w.get("scale_dtype") not in (
            None, CT_SCALE_DTYPES[scale]):
        raise bad(f"{layout.name} holds weights {want} with scale_dtype {CT_SCALE_DTYPES[scale]}, got "
                  f"{ {k: w.get(k) for k in list(want) + ['dynamic', 'scale_dtype']} }")
    return scheme_for(code, "nvfp4" if layout is NVFP4 else "mx")
