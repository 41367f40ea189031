"""The compiled loop of :mod:`.gpt_oss_experts` (numba; imported only where it serves).

One unit is one (expert, group of 32 inputs): its 32 output rows ``[32g, 32g + 32)`` of the
dense ``[E, in, out]`` tensor, written along ``out`` while the loop walks the weight rows, so
every store is sequential within one of 32 rows and every block byte is read once.
"""

from __future__ import annotations

from numba import njit


@njit(nogil=True, cache=True, boundscheck=False)
def decode(blocks, scales, table, bits, u0, u1):
    """``bits[e, 32g + 2j (+1), o] = table[scales[e, o, g], low (high) nibble of blocks[e, o, g, j]]``
    for the units ``u = e * groups + g`` in ``[u0, u1)``."""
    groups, rows = blocks.shape[2], blocks.shape[1]
    for u in range(u0, u1):
        e, g = u // groups, u % groups
        base = 32 * g
        for o in range(rows):
            s = scales[e, o, g]
            for j in range(16):
                b = blocks[e, o, g, j]
                bits[e, base + 2 * j, o] = table[s, b & 15]
                bits[e, base + 2 * j + 1, o] = table[s, b >> 4]
