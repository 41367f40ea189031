"""compressed-tensors' ``pack-quantized`` words: offset-binary codes, little-endian, in int32.

Each row of codes becomes a row of int32 words (compressed-tensors 0.20
``compressors/pack_quantized/helpers.py``, ``pack_to_int32``): code ``q`` is stored as the
unsigned field ``q + 2**(bits - 1)``; element ``j`` of the row sits at bit ``bits * j`` of the
row's stream of 32-bit little-endian words; a row is padded with zero bits to whole words. The
zero points of an asymmetric scheme are packed the same way down the output dimension
(the rows of their transpose). Widths that divide 32 are packed here (4 and 8 bits: the gpuq code
types compressed-tensors stores); 3, 5, 6 and 7 bits, whose fields cross words, are not.

>>> words = pack_rows(np.array([[-8, 7, 0]], np.int8), 4)     # fields 0x0, 0xf, 0x8
>>> words, hex(int(words[0, 0]))
(array([[2288]], dtype=int32), '0x8f0')
>>> unpack_rows(words, 4, 3)
array([[-8,  7,  0]], dtype=int8)
"""

from __future__ import annotations

import numpy as np

#: Elements per block of a conversion: bounds the uint32 scratch on large tensors.
_BLOCK = 1 << 20


def words_per_row(n: int, bits: int) -> int:
    """int32 words of a row of ``n`` codes of ``bits`` bits.

    >>> words_per_row(70, 8), words_per_row(100, 4), words_per_row(128, 4)
    (18, 13, 16)
    """
    return -(-n * bits // 32)


def _layout(bits: int):
    if bits < 1 or 32 % bits:
        raise ValueError(f"bits must divide 32 (1, 2, 4, 8, 16) to pack codes whole per word, got {bits}")
    per = 32 // bits
    return per, np.arange(per, dtype=np.uint32) * np.uint32(bits)


def pack_rows(codes: np.ndarray, bits: int) -> np.ndarray:
    """2-D signed ``codes`` (each in ``[-2**(bits-1), 2**(bits-1))``) as int32 words, row by row.

    >>> w = pack_rows(np.array([[1, -1, 0, 2, -128]], np.int8), 8)   # 0x81 0x7f 0x80 0x82 | 0x00
    >>> hex(int(w[0, 0]) & 0xFFFFFFFF), int(w[0, 1])
    ('0x82807f81', 0)
    """
    rows, n = codes.shape
    per, shifts = _layout(bits)
    nwords = words_per_row(n, bits)
    out = np.empty((rows, nwords), np.int32)
    step = max(1, _BLOCK // max(n, 1))
    for r0 in range(0, rows, step):
        block = codes[r0:r0 + step]
        fields = np.zeros((block.shape[0], nwords * per), np.uint32)
        fields[:, :n] = block.astype(np.int32) + (1 << (bits - 1))  # the offset-binary field
        fields = fields.reshape(block.shape[0], nwords, per) << shifts
        out[r0:r0 + step] = np.bitwise_or.reduce(fields, axis=2).view(np.int32)
    return out


def unpack_rows(words: np.ndarray, bits: int, n: int) -> np.ndarray:
    """The int8 codes of :func:`pack_rows`' words, ``n`` per row; ``ValueError`` where a row's
    padding bits (past its ``n`` fields) are not 0, as compressed-tensors writes them.

    >>> unpack_rows(np.array([[-2105507967, 0]], np.int32), 8, 5)
    array([[   1,   -1,    0,    2, -128]], dtype=int8)
    """
    rows, nwords = words.shape
    per, shifts = _layout(bits)
    if nwords != words_per_row(n, bits):
        raise ValueError(f"{n} codes of {bits} bits take {words_per_row(n, bits)} words a row, got {nwords}")
    out = np.empty((rows, n), np.int8)
    mask = np.uint32((1 << bits) - 1)
    step = max(1, _BLOCK // max(nwords * per, 1))
    for r0 in range(0, rows, step):
        w = words[r0:r0 + step].astype(np.int32, copy=False).view(np.uint32)
        fields = ((w[:, :, None] >> shifts) & mask).reshape(w.shape[0], nwords * per)
        if fields[:, n:].any():
            r = r0 + int(np.argmax(fields[:, n:].any(axis=1)))
            raise ValueError(f"row {r} has padding bits that are not 0 after its {n} codes")
        out[r0:r0 + step] = (fields[:, :n].astype(np.int32) - (1 << (bits - 1))).astype(np.int8)
    return out
