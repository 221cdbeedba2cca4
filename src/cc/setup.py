"""Builds `elasticdl_native`: C++/OpenMP kernels, plus CUDA kernels when nvcc is found.

CUDA is built when `nvcc` is on PATH (or at $CUDA_HOME/bin or /usr/local/cuda/bin) and
ELASTICDL_BUILD_CUDA is not "0"; ELASTICDL_BUILD_CUDA=1 makes a missing nvcc an error.
The CUDA runtime is linked statically, so the module needs only the NVIDIA driver at run
time and still imports (reporting no device) on machines without one; `cuda_archs()` lists the
architectures the kernels were compiled for (nvcc's __CUDA_ARCH_LIST__), also without a GPU.
ELASTICDL_CUDA_ARCHS (default "80;90") selects the GPU architectures (SASS + PTX of the last).
"""

import os
import shutil
import subprocess

from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import setup

HERE = os.path.dirname(os.path.abspath(__file__))

# Baseline x86-64 code (the wheel must run anywhere); AVX2 clones are chosen at load time
# via target_clones (cpu_target.h). No FMA contraction: keeps results bit-identical to
# the NumPy reference.
CXX_FLAGS = ["-O3", "-fopenmp", "-ffp-contract=off", "-fno-math-errno", "-Wall", "-Wno-unknown-pragmas"]


def _find_nvcc():
    want = os.environ.get("ELASTICDL_BUILD_CUDA", "auto")
    if want == "0":
        return None
    cands = [shutil.which("nvcc")]
    for root in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if root:
            cands.append(os.path.join(root, "bin", "nvcc"))
    nvcc = next((c for c in cands if c and os.path.exists(c)), None)
    if nvcc is None and want == "1":
        raise RuntimeError("ELASTICDL_BUILD_CUDA=1 but nvcc was not found (set CUDA_HOME or PATH)")
    return nvcc


class BuildExt(build_ext):
    """Compiles kernels_cuda.cu with nvcc first and links its object into the module."""

    def build_extensions(self):
        nvcc = _find_nvcc()
        ext = self.extensions[0]
        if nvcc:
            # nvcc may be a symlink or wrapper outside the toolkit: look in the usual roots too.
            roots = [os.path.dirname(os.path.dirname(os.path.realpath(nvcc))), os.environ.get("CUDA_HOME", ""),
                     "/usr/local/cuda"]
            obj = os.path.join(self.build_temp, "kernels_cuda.o")
            os.makedirs(self.build_temp, exist_ok=True)
            archs = os.environ.get("ELASTICDL_CUDA_ARCHS", "80;90").split(";")
            gencode = []
            for a in archs:
                gencode += [f"-gencode=arch=compute_{a},code=sm_{a}"]
            gencode += [f"-gencode=arch=compute_{archs[-1]},code=compute_{archs[-1]}"]
            cmd = [nvcc, "-c", os.path.join(HERE, "kernels_cuda.cu"), "-o", obj, "-O3", "-std=c++17",
                   "--fmad=false", "-Xcompiler", "-fPIC", "-DEDL_WITH_CUDA", *gencode]
            self.announce(" ".join(cmd), level=2)
            subprocess.check_call(cmd)
            ext.extra_objects.append(obj)
            ext.define_macros.append(("EDL_WITH_CUDA", "1"))
            libdirs = [os.path.join(r, d) for r in roots if r for d in ("lib64", "lib", "targets/x86_64-linux/lib")]
            libdirs = [d for d in libdirs if os.path.exists(os.path.join(d, "libcudart_static.a"))]
            if not libdirs:
                raise RuntimeError(f"libcudart_static.a not found under {roots}; set CUDA_HOME")
            ext.library_dirs.append(libdirs[0])
            ext.libraries += ["cudart_static", "dl", "rt", "pthread"]
            # The static runtime's symbols stay private: where torch or TensorFlow loaded their
            # shared libcudart (another CUDA version) globally first, the module's calls would
            # otherwise bind to that one.
            ext.extra_link_args.append("-Wl,--exclude-libs,ALL")
        super().build_extensions()


setup(
    name="elasticdl_native",
    version="0.1.0",
    description="ElasticDL parameter-server kernels (embedding lookup, aggregation, optimizers)",
    ext_modules=[
        Pybind11Extension(
            "elasticdl_native",
            ["elasticdl_native.cc", "kernels_cpu.cc", "sparse_cpu.cc", "dedup_cpu.cc", "range_rank_cpu.cc", "id_map_cpu.cc",
             "push_wire_cpu.cc", "push_wire_py.cc", "init_cpu.cc"],
            cxx_std=17,
            extra_compile_args=CXX_FLAGS,
            extra_link_args=["-fopenmp"],
        )
    ],
    cmdclass={"build_ext": BuildExt},
    zip_safe=False,
)
