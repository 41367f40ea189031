"""Holds the CuPy stand-in, the package ``cupy/`` next to this file (tests only).

This directory is put on ``sys.path`` (by ``tests/cudasim/install.py``, or
``PYTHONPATH=tests/cudasim/fake``) so that ``import cupy`` finds the stand-in.
This ``__init__.py`` exists only so that pytest's ``--doctest-modules``
collection imports ``cupy/*.py`` under a qualified name (``fake.cupy...``)
instead of putting this directory first on ``sys.path`` and shadowing a real
CuPy on a machine with a GPU. Nothing imports ``fake`` itself.
"""
