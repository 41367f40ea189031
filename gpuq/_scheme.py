"""Granularity: which scale / zero point each element uses.

============  ===================================  ==========================================
scheme        asked for with                       scales / zps shape for ``src.shape``
============  ===================================  ==========================================
per-tensor    ``axis=None`` (or ``axis=()``)        one element: ``()`` or ``(1,)``
per-channel   ``axis=k``, k in [-r, r-1]            ``(shape[k],)``
multi-axis    ``axis=(k1, k2, ...)``                ``tuple(shape[k] for k in sorted axes)``
per-group     ``axis=k, group_size=g``              ``shape`` with dim k -> ceil(shape[k] / g)
============  ===================================  ==========================================

A :class:`Scheme` is built once per call from ``(shape, axis, group_size)``
and is the only place that knows these rules. Backends ask it for
:meth:`Scheme.pieces`: the tensor cut into at most two broadcast problems
(a per-group tensor with a ragged last group is two), each a view shape for
src/out and a broadcastable view of the parameters.
"""

from __future__ import annotations

import functools
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

    @classmethod
    def build(cls, shape, axis=None, group_size=None) -> Scheme:
        """Validate ``axis``/``group_size`` against ``shape``.

        >>> Scheme.build((4, 6), axis=-1).param_shape
        (6,)
        >>> Scheme.build((4, 6), axis=1, group_size=4).param_shape
        (4, 2)
        """
        # Repeated calls on one shape (an inference loop) reuse the validated scheme.
        # Only plain ints are cached: True == 1 and 2.0 == 2 must still be refused.
        if type(shape) is tuple and _plain(axis) and _plain(group_size):
            return _build_cached(shape, axis, group_size)
        return cls._build(shape, axis, group_size)

    @classmethod
    def _build(cls, shape, axis, group_size) -> Scheme:
        shape = tuple(int(d) for d in shape)
        rank = len(shape)
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
    def param_shape(self) -> tuple:
        """The shape scales and zero points must have (per-tensor: ``()``)."""
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
        (k,) = self.axes
        n, g = self.shape[k], self.group_size
        head, tail = self.shape[:k], self.shape[k + 1:]
        full, rest = divmod(n, g)
        pieces = []
        if full:
            cut = (slice(None),) * k + (slice(0, full * g),)
            pcut = (slice(None),) * k + (slice(0, full),)
            pieces.append(Piece(cut, head + (full, g) + tail, pcut, head + (full, 1) + tail))
        if rest:
            cut = (slice(None),) * k + (slice(full * g, n),)
            pcut = (slice(None),) * k + (slice(full, full + 1),)
            pieces.append(Piece(cut, head + (rest,) + tail, pcut, head + (1,) + tail))
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
        * ``"strided"``: ``dims`` holds the merged dims' sizes then their parameter strides.
        * ``"expand"``: more than ``MAX_MAP_DIMS`` alternating dims: parameters must
          be broadcast to the full shape first.

        >>> Scheme.build((2, 3, 4), axis=1).index_map
        ('channel', 3, 4, 0, None)
        >>> Scheme.build((2, 3, 4), axis=(0, 2)).index_map
        ('strided', 3, 0, 0, (2, 3, 4, 4, 0, 1))
        >>> Scheme.build((6, 10), axis=1, group_size=4).index_map
        ('group', 10, 1, 4, None)
        >>> Scheme.build((6, 8), axis=1, group_size=4).index_map
        ('channel', 12, 4, 0, None)
        """
        shape = self.shape
        if self.kind == "tensor":
            return "tensor", 0, 0, 0, None
        if self.kind == "group":
            (k,) = self.axes
            n, g = shape[k], self.group_size
            inner = math.prod(shape[k + 1:])
            if n % g == 0 and inner == 1:
                # Full groups along the last (merged) axis: scale index = i // g.
                return "channel", math.prod(shape) // g, g, 0, None
            return "group", n, inner, g, None
        axes = set(self.axes)
        dims = []  # [size, varies_with_scale]; size-1 dims dropped, equal neighbours merged
        for d, size in enumerate(shape):
            if size == 1:
                continue
            scale = d in axes
            if dims and dims[-1][1] == scale:
                dims[-1][0] *= size
            else:
                dims.append([size, scale])
        runs = [i for i, (_, s) in enumerate(dims) if s]
        if not runs:
            return "tensor", 0, 0, 0, None
        if len(runs) == 1:
            (i,) = runs
            return "channel", dims[i][0], math.prod(size for size, _ in dims[i + 1:]), 0, None
        if len(dims) > MAX_MAP_DIMS:
            return "expand", 0, 0, 0, None
        pstrides, stride = [], 1
        for size, scale in reversed(dims):
            pstrides.append(stride if scale else 0)
            stride *= size if scale else 1
        sizes = tuple(size for size, _ in dims)
        return "strided", len(dims), 0, 0, sizes + tuple(reversed(pstrides))


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
