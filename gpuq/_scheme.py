"""Granularity: which scale / zero point each element uses.

============  ===================================  ==========================================
scheme        asked for with                       scales / zps shape for ``src.shape``
============  ===================================  ==========================================
per-tensor    ``axis=None`` (or ``axis=()``)        one element: ``()`` or ``(1,)``
per-channel   ``axis=k``, k in [-r, r-1]            ``(shape[k],)``
multi-axis    ``axis=(k1, k2, ...)``                ``tuple(shape[k] for k in sorted axes)``
per-group     ``axis=k, group_size=g``              ``shape`` with dim k -> ceil(shape[k] / g)
blocks        ``block_size=(b_0, ..., b_{r-1})``    ``(ceil(shape[0] / b_0), ...)``
============  ===================================  ==========================================

A :class:`Scheme` is built once per call from ``(shape, axis, group_size, block_size)``
and is the only place that knows these rules. Backends ask it for
:meth:`Scheme.pieces`: the tensor cut into broadcast problems (a per-group tensor
with a ragged last group is two; blocks ragged along k dimensions are up to 2**k),
each a view shape for src/out and a broadcastable view of the parameters, and
for :attr:`Scheme.index_map`: which parameter a flat element uses, as the kernels
walk it.

Every scheme is a block shape (``Scheme.blocks``): per-tensor is the whole shape,
per-channel 1 along the axis and the whole of every other dimension, per-group
``g`` along the axis and 1 elsewhere, multi-axis 1 on its axes; element
``(i_0, ..., i_{r-1})`` uses parameter ``(i_0 // b_0, ..., i_{r-1} // b_{r-1})``
(the scheme's own parameter shape drops the dimensions the others do not keep).
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
from dataclasses import dataclass

#: Most merged dims the strided (multi-axis) index map walks: kMaxDims in
#: kernels/elementwise.cuh. More alternating dims than this lower to "expand".
MAX_MAP_DIMS = 8


@dataclass(frozen=True)
class Piece:
    """One broadcast problem: ``src[src_index].reshape(view_shape)`` uses
    ``params[param_index].reshape(param_view_shape)`` element-wise."""

    src_index: tuple
    view_shape: tuple
    param_index: tuple
    param_view_shape: tuple


@dataclass(frozen=True)
class Scheme:
    """A validated granularity for one tensor shape.

    ``kind`` is ``"tensor"``, ``"channel"``, ``"axes"`` or ``"group"``;
    ``axes`` holds the normalised non-negative axes (one for channel/group).
    """

    shape: tuple
    kind: str
    axes: tuple = ()
    group_size: int | None = None
    block_size: tuple | None = None  # kind "block": one entry per dim, 1 <= b <= max(n, 1)

    @classmethod
    def build(cls, shape, axis=None, group_size=None, block_size=None) -> Scheme:
        """Validate ``axis``/``group_size``/``block_size`` against ``shape``.

        >>> Scheme.build((4, 6), axis=-1).param_shape
        (6,)
        >>> Scheme.build((4, 6), axis=1, group_size=4).param_shape
        (4, 2)
        >>> Scheme.build((300, 200), block_size=(128, -1)).param_shape
        (3, 1)
        """
        # Repeated calls on one shape (an inference loop) reuse the validated scheme.
        # Only plain ints are cached: True == 1 and 2.0 == 2 must still be refused.
        if block_size is None and type(shape) is tuple and _plain(axis) and _plain(group_size):
            return _build_cached(shape, axis, group_size)
        return cls._build(shape, axis, group_size, block_size)

    @classmethod
    def _build(cls, shape, axis, group_size, block_size=None) -> Scheme:
        shape = tuple(int(d) for d in shape)
        rank = len(shape)
        if block_size is not None:
            return cls(shape, "block", (), None, _blocks(block_size, shape, axis, group_size))
        if group_size is not None:
            group_size = _as_int(group_size, "group_size")
            if group_size < 1:
                raise ValueError(f"group_size must be a positive integer, got {group_size}")
            if axis is None or isinstance(axis, (tuple, list)):
                raise ValueError(
                    f"group_size={group_size} needs a single integer axis to group along, "
                    f"got axis={axis!r}"
                )
            k = _normalise_axis(axis, rank, "axis")
            return cls(shape, "group", (k,), group_size)
        if axis is None:
            return cls(shape, "tensor")
        if isinstance(axis, (tuple, list)):
            axes = tuple(_normalise_axis(a, rank, "axis") for a in axis)
            if len(set(axes)) != len(axes):
                raise ValueError(f"axis must not repeat an axis, got {tuple(axis)!r} for rank {rank}")
            axes = tuple(sorted(axes))
            if not axes:
                return cls(shape, "tensor")
            if len(axes) == 1:
                return cls(shape, "channel", axes)
            return cls(shape, "axes", axes)
        return cls(shape, "channel", (_normalise_axis(axis, rank, "axis"),))

    @functools.cached_property
    def blocks(self) -> tuple:
        """The block shape of this scheme: the elements that share one parameter, per dim.

        >>> Scheme.build((4, 6), axis=1, group_size=4).blocks, Scheme.build((4, 6), axis=0).blocks
        ((1, 4), (1, 6))
        """
        if self.kind == "block":
            return self.block_size
        if self.kind == "tensor":
            return tuple(max(n, 1) for n in self.shape)
        if self.kind == "group":
            (k,) = self.axes
            return tuple(self.group_size if d == k else 1 for d in range(len(self.shape)))
        return tuple(1 if d in self.axes else max(n, 1) for d, n in enumerate(self.shape))

    @functools.cached_property
    def param_shape(self) -> tuple:
        """The shape scales and zero points must have (per-tensor: ``()``)."""
        if self.kind == "block":
            return tuple(-(-n // b) for n, b in zip(self.shape, self.block_size))
        if self.kind == "tensor":
            return ()
        if self.kind == "group":
            (k,) = self.axes
            return self.shape[:k] + (-(-self.shape[k] // self.group_size),) + self.shape[k + 1:]
        return tuple(self.shape[a] for a in self.axes)

    def describe(self) -> str:
        """Human wording used in error messages."""
        if self.kind == "tensor":
            return "per-tensor"
        if self.kind == "block":
            return f"block_size={self.block_size} of shape {self.shape}"
        if self.kind == "group":
            return f"axis={self.axes[0]}, group_size={self.group_size} of shape {self.shape}"
        axis = self.axes[0] if self.kind == "channel" else self.axes
        return f"axis={axis} of shape {self.shape}"

    def pieces(self) -> tuple:
        """The tensor as broadcast problems (see the module docstring)."""
        return self._pieces

    @functools.cached_property
    def _pieces(self) -> tuple:
        rank = len(self.shape)
        whole = (Ellipsis,)  # not (): indexing a 0-d array with () gives a scalar copy
        if self.kind == "tensor":
            return (Piece(whole, self.shape, (), (1,) * rank),)
        if self.kind in ("channel", "axes"):
            pshape = tuple(d if i in self.axes else 1 for i, d in enumerate(self.shape))
            return (Piece(whole, self.shape, (Ellipsis,), pshape),)
        # Groups and blocks: every dim whose block neither is 1 nor covers it is cut into its
        # whole blocks (a view of (F, b): parameters (F, 1)) and a ragged rest (parameters 1).
        # The parameter arrays of group schemes keep all dims, like blocks; per-tensor-like
        # dims (a block covering the dim) take parameter 1.
        options = []
        for d, (n, b) in enumerate(zip(self.shape, self.blocks)):
            if b == 1:
                options.append([(slice(None), (n,), slice(None), (n,))])
            elif b >= n:
                options.append([(slice(None), (n,), slice(None), (1,))])
            else:
                full, rest = divmod(n, b)
                parts = [(slice(0, full * b), (full, b), slice(0, full), (full, 1))]
                if rest:
                    parts.append((slice(full * b, n), (rest,), slice(full, full + 1), (1,)))
                options.append(parts)
        pieces = []
        for combo in itertools.product(*options):
            src_index = tuple(c[0] for c in combo)
            view = tuple(x for c in combo for x in c[1])
            param_index = tuple(c[2] for c in combo)
            pview = tuple(x for c in combo for x in c[3])
            pieces.append(Piece(src_index, view, param_index, pview))
        return tuple(pieces)

    @functools.cached_property
    def index_map(self) -> tuple:
        """Which parameter flat element ``i`` of a C-contiguous tensor uses, as the CUDA
        kernels' MAP and the host kernels' runs take it: ``(map_name, m0, m1, m2, dims)``.

        * ``"tensor"``: parameter 0.
        * ``"channel"``: parameter ``(i // m1) % m0`` (per-tensor rows of ``m1``
          elements, adjacent multi-axis and full groups along the last axis included).
        * ``"group"``: ``((i // (m1 * m0)) * ceil(m0 / m2) + ((i // m1) % m0) // m2) * m1
          + i % m1``, a grouped axis of ``m0`` with ``m1`` elements after it.
        * ``"strided"``: ``dims`` holds the merged dims' sizes, then their parameter strides,
          then their block sizes: parameter ``sum_d (coord_d // block_d) * pstride_d``
          (multi-axis: blocks of 1 on its axes, whole elsewhere; block schemes).
        * ``"expand"``: more than ``MAX_MAP_DIMS`` alternating dims: parameters must
          be broadcast to the full shape first.

        >>> Scheme.build((2, 3, 4), axis=1).index_map
        ('channel', 3, 4, 0, None)
        >>> Scheme.build((2, 3, 4), axis=(0, 2)).index_map
        ('strided', 3, 0, 0, (2, 3, 4, 4, 0, 1, 1, 3, 1))
        >>> Scheme.build((300, 200), block_size=(128, 128)).index_map
        ('strided', 2, 0, 0, (300, 200, 2, 1, 128, 128))
        >>> Scheme.build((6, 10), axis=1, group_size=4).index_map
        ('group', 10, 1, 4, None)
        >>> Scheme.build((6, 8), axis=1, group_size=4).index_map
        ('channel', 12, 4, 0, None)
        """
        merged = self.merged
        varying = [k for k, (_, _, cls) in enumerate(merged) if cls != "whole"]
        if not varying:
            return "tensor", 0, 0, 0, None
        total = math.prod(self.shape)
        blocked = [k for k in varying if merged[k][2] == "block"]
        if len(varying) == 1 or (len(blocked) == 1 and len(varying) == len(merged)):
            # One varying run (its inner dims whole), or one block dim among per-element ones.
            k = blocked[0] if blocked else varying[0]
            n, b, cls = merged[k]
            inner = math.prod(size for size, _, _ in merged[k + 1:])
            if cls == "each":
                return "channel", n, inner, 0, None
            if inner == 1 and n % b == 0:
                # Whole blocks along the last (merged) dim: parameter (i // b) mod (its count).
                outer = math.prod(size for size, _, c in merged[:k] if c != "whole")
                return "channel", outer * (n // b), b, 0, None
            if len(varying) == len(merged):  # per-element dims around one block dim: groups
                return "group", n, inner, b, None
        if len(merged) > MAX_MAP_DIMS:
            return "expand", 0, 0, 0, None
        return "strided", len(merged), 0, 0, strided_dims(merged)

    @functools.cached_property
    def merged(self) -> tuple:
        """The shape as the kernels walk it: ``(size, block, class)`` per dim, size-1 dims
        dropped and neighbours merged where both are covered by their blocks (class
        ``"whole"``, block = size) or both split per element (``"each"``, block 1); a dim cut
        into blocks of other sizes (``"block"``) stays alone. C order is kept.

        >>> Scheme.build((2, 3, 4), axis=(0, 2)).merged
        ((2, 1, 'each'), (3, 3, 'whole'), (4, 1, 'each'))
        >>> Scheme.build((4, 1, 300), axis=2, group_size=128).merged
        ((4, 1, 'each'), (300, 128, 'block'))
        """
        merged = []  # [size, block, class]
        for n, b in zip(self.shape, self.blocks):
            if n == 1:
                continue
            cls = "whole" if b >= n else "each" if b == 1 else "block"
            if merged and cls != "block" and merged[-1][2] == cls:
                merged[-1][0] *= n
                merged[-1][1] = merged[-1][0] if cls == "whole" else 1
            else:
                merged.append([n, n if cls == "whole" else b, cls])
        return tuple(tuple(m) for m in merged)


def strided_dims(merged) -> tuple:
    """The strided map's ``dims`` of merged dims (:attr:`Scheme.merged`): their sizes, then their
    parameter strides (C order of the parameter grid; 0 where a block covers its dim), then
    their block sizes.

    >>> strided_dims(Scheme.build((300, 200), block_size=(128, 128)).merged)
    (300, 200, 2, 1, 128, 128)
    """
    pstrides, stride = [], 1
    for n, b, cls in reversed(merged):
        pstrides.append(0 if cls == "whole" else stride)
        stride *= 1 if cls == "whole" else -(-n // b)
    sizes = tuple(n for n, _, _ in merged)
    blocks = tuple(b for _, b, _ in merged)
    return sizes + tuple(reversed(pstrides)) + blocks


def _blocks(block_size, shape, axis, group_size) -> tuple:
    """``block_size`` checked against ``shape`` and normalised: an entry of -1 or of at least
    its dimension covers the whole dimension (``max(n, 1)``)."""
    if type(block_size).__name__ == "ndarray" and getattr(block_size, "ndim", 0) == 1:
        block_size = block_size.tolist()  # a 1-D array of sizes (NumPy, CuPy) as the list it holds
    if isinstance(block_size, (bool, int)) or hasattr(block_size, "__index__"):
        raise TypeError(
            f"block_size must have one entry per dimension of src, e.g. block_size=(128, 128), got "
            f"{block_size!r}; for groups along one axis use group_size= (ONNX's block_size)")
    if not isinstance(block_size, (tuple, list)):
        raise TypeError(f"block_size must be a tuple of ints, one per dimension of src, got {block_size!r}")
    for name, value in (("axis", axis), ("group_size", group_size)):
        if value is not None:
            raise ValueError(f"block_size={tuple(block_size)!r} and {name}={value!r} both say which "
                             f"elements share a scale: give block_size alone")
    if len(block_size) != len(shape):
        raise ValueError(f"block_size must have one entry per dimension of src ({len(shape)} for shape "
                         f"{shape}), got {len(block_size)}: {tuple(block_size)!r}")
    out = []
    for b, n in zip(block_size, shape):
        b = _as_int(b, "block_size")
        if b == -1 or b >= max(n, 1):
            out.append(max(n, 1))
        elif b >= 1:
            out.append(b)
        else:
            raise ValueError(f"block_size entries must be positive, or -1 for the whole dimension, got "
                             f"{tuple(block_size)!r}")
    return tuple(out)


def _plain(value) -> bool:
    return value is None or type(value) is int


@functools.lru_cache(maxsize=256)
def _build_cached(shape, axis, group_size) -> Scheme:
    return Scheme._build(shape, axis, group_size)


def _as_int(value, argname: str) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{argname} must be an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{argname} must be an integer, got {value!r}") from None


def _normalise_axis(axis, rank: int, argname: str) -> int:
    a = _as_int(axis, argname)
    if rank == 0:
        raise ValueError(
            f"{argname}={a} asks for per-channel (de)quantization of a 0-d tensor; "
            f"use axis=None (per-tensor)"
        )
    if not -rank <= a < rank:
        raise ValueError(f"{argname} must be in [{-rank}, {rank - 1}] for rank {rank}, got {a}")
    return a % rank
