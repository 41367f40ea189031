"""What a backend is: the one interface the layers above call, for every code dtype.

A backend serves the arrays of one kind (host NumPy arrays; CUDA device arrays). The layers
above find it one way, :func:`gpuq._dispatch.backend_for` (the backend of an array, and the
array as that backend takes it), validate every argument by the rows of the code-type table
(:mod:`gpuq._codetypes`) and call these methods; nothing above ``backends/`` branches on a
backend's name or a format's kind, and nothing here re-validates. Inside a backend, the row's
codec and storage choose the element operation (affine or float8; one code per element or
packed nibbles), over one traversal per backend.

Both :class:`gpuq.backends.host.backend.NumpyBackend` and
:class:`gpuq.backends.cuda.backend.CudaBackend` implement every method with these signatures
(``tests/test_layout.py`` checks it). All are static: a backend is a namespace, not an
instance.

>>> from gpuq.backends.protocol import Backend
>>> sorted(n for n in vars(Backend) if not n.startswith("_"))[:4]
['as_array', 'check_int32', 'check_out', 'check_scales']
"""

from __future__ import annotations

from typing import Protocol


class Backend(Protocol):
    """The backend interface (see the module docstring)."""

    #: ``"numpy"`` or ``"cuda"``: for messages and keys, never for choosing a path above.
    name: str
    #: How messages name this backend's arrays: ``"a NumPy"``, ``"a device"`` (array).
    arrays: str

    # -- arrays --------------------------------------------------------------------------------

    @staticmethod
    def as_array(obj, dtype=None):
        """``obj`` (an array this backend serves) as the backend's array type, zero copy; with
        ``dtype``, converted to it where it lives (its device: no peer access is assumed)."""

    @staticmethod
    def empty(like, shape, dtype):
        """A new array of ``shape`` and ``dtype`` where ``like`` lives (host, or its device)."""

    @staticmethod
    def code_storage(code):
        """``(dtype, packed_in_codes)``: the dtype of the array that holds ``code``'s codes here,
        and whether results wrap it in a :class:`gpuq.Codes` (packed codes; fp8 where the
        array type has no fp8 dtype)."""

    @staticmethod
    def to_param(arr, src):
        """Validated parameters placed for ``src``: uploaded to its device (one host value
        stays on the host, for the kernels' by-value path); a device array on another device
        is a ``TypeError``."""

    @staticmethod
    def check_out(out, src) -> None:
        """``out`` writeable, where ``src`` is, and not overlapping it."""

    @staticmethod
    def device_key(arr):
        """A key for parameters uploaded once per device (the op objects)."""

    @staticmethod
    def settle() -> None:
        """Wait once for uploads that later calls on any stream will read."""

    @staticmethod
    def track_reads(arrays):
        """An object with ``note_read()`` and ``release()`` that keeps ``arrays`` (parameters
        uploaded once) alive until every stream that read them has passed."""

    # -- values of parameters that live here -----------------------------------------------------

    @staticmethod
    def check_scales(arr, argname) -> None:
        """``ValueError`` unless every scale is finite and > 0 (saying which, where)."""

    @staticmethod
    def check_int32(arr, argname) -> None:
        """``ValueError`` unless every zero point fits int32."""

    @staticmethod
    def check_zero(arr, argname, code) -> None:
        """``ValueError`` unless every zero point is 0 (``code`` has no zero point)."""

    # -- the work --------------------------------------------------------------------------------

    @staticmethod
    def quantize(code, src, scheme, scales, zps, out, saturate) -> None:
        """``out`` (``code_storage``'s array) = the codes of ``src``."""

    @staticmethod
    def dequantize(code, src, scheme, scales, zps, out) -> None:
        """``out`` (floats) = ``(q - zp) * s`` of the codes in ``src`` (``code_storage``'s array)."""

    @staticmethod
    def minmax(x, scheme):
        """Per-slot ``(lo, hi)`` floats of ``x`` (``scheme.param_shape``), NaN skipped; NaN where
        a slot holds no number."""

    @staticmethod
    def choose_qparams(code, x, scheme, symmetric, eps, scale_dtype, method, check=True):
        """``(scales, zps)`` of ``x`` for ``code`` (zps None where the parameters have none), each
        scale rounded to nearest even in ``scale_dtype`` (``"float32"``, ``"bfloat16"``,
        ``"float16"``) before the zero point is derived from it; ``ValueError`` where one rounds
        to 0 or overflows there. ``method`` is ``"minmax"`` (each block's range) or ``"mse"``
        (the search of ``gpuq.qparams``' docstring, bit for bit the same on every backend).
        ``check=False`` (``"minmax"`` only): nothing raises and nothing is read back; a block
        holding +/-Inf gets scale +Inf, a scale the dtype cannot hold comes back as 0 or +Inf, and
        the zero point of either is 0 (the symmetric one where the parameters are symmetric)."""

    @staticmethod
    def quantize_dynamic(code, x, scheme, symmetric, eps, scale_dtype, check=True):
        """``(codes, scales, zps)`` in one pass where this backend fuses it, else None; ``check`` as
        in :meth:`choose_qparams` (the codes of unchecked parameters are ``quantize``'s)."""
