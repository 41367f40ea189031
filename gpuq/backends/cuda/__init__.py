"""The CUDA backend: device arrays (CuPy, ``__cuda_array_interface__``, CUDA ``__dlpack__``).

:mod:`.backend` (``CudaBackend``: alignment, index maps, the launch of the
(de)quantize kernels), :mod:`.qparams` (parameters from data: the reduction
and fused dynamic kernels), :mod:`.compiler` (CuPy ``RawModule`` on first use,
cached per device), :mod:`.registry` (the kernel sources, the NVRTC options
and every name expression: the one table below both launchers and the NVRTC
check) and :mod:`.nvrtc_check` (compile every kernel without a GPU).

May import: :mod:`gpuq._dtypes`, :mod:`gpuq._scheme`, its own modules, and
CuPy inside functions only: importing any of these modules never touches CUDA.
The kernel sources themselves are ``kernels/*.cu`` (the ``gpuq.kernels``
package of the wheel).
"""
