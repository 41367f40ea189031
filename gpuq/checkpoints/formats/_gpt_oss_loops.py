"""The compiled loop of :mod:`.gpt_oss_experts` (numba; imported only where it serves).

One unit is one (expert, group of 32 inputs): its 32 output rows ``[32g, 32g + 32)`` of the
dense ``[E, in, out]`` tensor, written along ``out`` while the loop walks the weight rows, so
every store is sequential within one of 32 rows and every block byte is read once. Each byte
is one lookup in the pair table (its two values side by side in one wider integer), which is
about 1.5x faster here than two nibble lookups (bench/NOTES.md). For 2-byte outputs
(bfloat16, gpt-oss's) :func:`decode_x4` packs four weight rows' values into each 8-byte store,
about 2x faster again.
"""

from __future__ import annotations

from numba import njit, uint64


@njit(nogil=True, cache=True, boundscheck=False)
def decode(blocks, scales, pairs, bits, shift, u0, u1):
    """``bits[e, 32g + 2j, o]`` and ``bits[e, 32g + 2j + 1, o]`` = the low and high ``shift``
    bits of ``pairs[scales[e, o, g], blocks[e, o, g, j]]``, for the units ``u = e * groups + g``
    in ``[u0, u1)``."""
    groups, rows = blocks.shape[2], blocks.shape[1]
    mask = (pairs.dtype.type(1) << shift) - 1
    for u in range(u0, u1):
        e, g = u // groups, u % groups
        base = 32 * g
        for o in range(rows):
            s = scales[e, o, g]
            for j in range(16):
                v = pairs[s, blocks[e, o, g, j]]
                bits[e, base + 2 * j, o] = v & mask
                bits[e, base + 2 * j + 1, o] = v >> shift


@njit(nogil=True, cache=True, boundscheck=False)
def decode_x4(words, scales, pairs, bits, u0, u1):
    """:func:`decode` for 2-byte outputs, four weight rows at a time: ``bits[e, i, q]`` (the
    output's ``uint64`` view, ``[E, in, out / 4]``) holds inputs ``i`` of rows ``4q .. 4q + 3``,
    so each store writes four values where :func:`decode` writes one, and ``words``
    (``[E, out, G, 2]``, the blocks' ``uint64`` view) is read 8 bytes at a time: about 2x faster
    on one thread here (bench/NOTES.md). ``out % 4 == 0``; little-endian bytes."""
    groups, q = words.shape[2], words.shape[1] // 4
    m16, s16, s32, s48, ff = uint64(0xFFFF), uint64(16), uint64(32), uint64(48), uint64(255)
    for u in range(u0, u1):
        e, g = u // groups, u % groups
        base = 32 * g
        for oq in range(q):
            o = 4 * oq
            t0, t1 = pairs[scales[e, o, g]], pairs[scales[e, o + 1, g]]
            t2, t3 = pairs[scales[e, o + 2, g]], pairs[scales[e, o + 3, g]]
            for h in range(2):
                w0, w1 = words[e, o, g, h], words[e, o + 1, g, h]
                w2, w3 = words[e, o + 2, g, h], words[e, o + 3, g, h]
                for k in range(8):
                    sh = uint64(8 * k)
                    v0, v1 = uint64(t0[(w0 >> sh) & ff]), uint64(t1[(w1 >> sh) & ff])
                    v2, v3 = uint64(t2[(w2 >> sh) & ff]), uint64(t3[(w3 >> sh) & ff])
                    r = base + 16 * h + 2 * k
                    bits[e, r, oq] = (v0 & m16) | ((v1 & m16) << s16) | ((v2 & m16) << s32) | ((v3 & m16) << s48)
                    bits[e, r + 1, oq] = (v0 >> s16) | ((v1 >> s16) << s16) | ((v2 >> s16) << s32) | ((v3 >> s16) << s48)
