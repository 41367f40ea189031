"""cudasim: gpuq's CUDA kernels built and run on the host, for tests without a GPU.

* :mod:`cudasim.hostbuild`: build a kernel source with g++ into a loadable
  module and launch its kernels (every CUDA thread a fiber).
* :mod:`cudasim.ptx`: the inline-PTX translator and the PTX forms it knows.
* :mod:`cudasim.source`: the C++ tokenizer both use.
* ``shim/``: the CUDA dialect, PTX helpers and fiber runtime as C++ headers.
* ``fake/``: a NumPy-backed stand-in for CuPy on top of this engine.

Importing the package compiles nothing.
"""
