#!/usr/bin/env python3
"""The GPU install, checked without a GPU: run in a fresh venv after `pip install ".[cuda13]"`.

CuPy's own compile path without a driver: CuPy's option assembly (include paths from the
[ctk] wheels), its NVRTC binding and program class, the options CuPy appends (-ftz=true,
-arch=sm_90, --device-as-default-execution-space). Stops short of loading the cubin (needs a driver)."""
import cupy
from cupy.cuda import compiler
from gpuq.backends.cuda import registry
print("cupy", cupy.__version__, "| nvrtc", compiler._get_nvrtc_version())
opts = cupy._core.core.assemble_cupy_compiler_options(tuple(registry.OPTIONS))
tail = ("-ftz=true", "-arch=sm_90", "--device-as-default-execution-space")
print("include dirs:", [o for o in opts if o.startswith("-I")])
for src in registry.SOURCES:
    names = list(registry.SOURCES[src]())
    prog = compiler._NVRTCProgram(registry.source_text(src), "", name_expressions=names, method="cubin")
    code, mapping = prog.compile(opts + tail)
    print(f"{src}: {len(mapping)} kernels, cubin {len(code)} bytes")
code = '#include <cuda_fp16.h>\n__global__ void k(__half* x){ x[0] = __float2half(1.0f); }'
prog = compiler._NVRTCProgram(code, "", method="cubin")
print("cuda_fp16.h (CuPy's own float16 kernels):", len(prog.compile(cupy._core.core.assemble_cupy_compiler_options(()) + tail)[0]), "bytes")
