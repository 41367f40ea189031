"""The compiled loop of :mod:`.gpt_oss_experts` (numba; imported only where it serves).

One unit is one (expert, group of 32 inputs): its 32 output rows ``[32g, 32g + 32)`` of the
dense ``[E, in, out]`` tensor, written along ``out`` while the loop walks the weight rows, so
every store is sequential within one of 32 rows and every block byte is read once. Each byte
is one lookup in the pair table (its two values side by side in one wider integer), which is
about 1.5x faster here than two nibble lookups (bench/NOTES.md).
"""

from __future__ import annotations

from numba import njit


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
