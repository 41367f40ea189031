"""The CUDA backend: device arrays (CuPy, ``__cuda_array_interface__``, CUDA ``__dlpack__``).

:mod:`.backend` (``CudaBackend``, the protocol's methods: the row of a code type chooses the
module below), :mod:`.launch` (arrays, alignment, index maps, grids and the launch of the
one-byte integer kernels; parameter lifetimes across streams), :mod:`.formats` (fp8 and packed
int4 kernels), :mod:`.qparams` (parameters from data: the reduction and fused dynamic kernels), :mod:`.mse` (the
MSE search for scales),
:mod:`.compiler` (CuPy ``RawModule`` on first use, cached per device), :mod:`.registry` (the
kernel sources, the NVRTC options and every name expression: the one table below the
launchers and the NVRTC check) and :mod:`.nvrtc_check` (compile every kernel without a GPU).

May import: :mod:`gpuq._codetypes`, :mod:`gpuq._dtypes`, :mod:`gpuq._scheme`, its own modules,
and CuPy inside functions only: importing any of these modules never touches CUDA. The kernel
sources themselves are ``kernels/*.cu`` (the ``gpuq.kernels`` package of the wheel).
"""
