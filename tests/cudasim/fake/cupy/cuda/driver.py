"""``cupy.cuda.driver`` of the stand-in: only its error class."""

from .._errors import CUDADriverError  # noqa: F401
