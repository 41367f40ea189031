"""gpuq's benchmark: gpuq against the memory-copy limit and its peers, side by side.

``python -m bench --help`` (from the repository root) for the options; ``bench/NOTES.md``
for the method and the numbers measured so far. :func:`main` takes an argv list.
"""

from .cli import main, run

__all__ = ["main", "run"]
