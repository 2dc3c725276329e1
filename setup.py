"""Build smla._C: the C extension always; the CUDA kernels when nvcc is found.

Environment switches:
  SMLA_CUDA=auto|0|1      build the CUDA kernels (auto: when nvcc is found)
  SMLA_CUDA_ARCHS="90a;80" GPU targets (default: Hopper sm_90a plus portable sm_80)
  SMLA_DEBUG=1            -O0 -g with AddressSanitizer and UBSan (CPU code)
  SMLA_NVCC_JOBS=N        parallel nvcc processes (default: CPU count)
  SMLA_PROFILE_BUILD=1    also compile the attention ablation variants (tools/ablate.py)
"""
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from glob import glob

import numpy as np
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


def find_nvcc():
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    cands = [os.path.join(home, "bin", "nvcc")] if home else []
    cands += [shutil.which("nvcc") or "", "/usr/local/cuda/bin/nvcc"]
    return next((c for c in cands if c and os.path.exists(c)), None)


def cuda_wanted():
    mode = os.environ.get("SMLA_CUDA", "auto").lower()
    nvcc = find_nvcc()
    if mode in ("0", "off", "false", "no"):
        return None
    if mode in ("1", "on", "true", "yes") and nvcc is None:
        sys.exit("SMLA_CUDA=1 but nvcc was not found (set CUDA_HOME)")
    return nvcc


DEBUG = os.environ.get("SMLA_DEBUG", "0") not in ("0", "", "false")
NVCC = cuda_wanted()
ARCHS = [a.strip() for a in os.environ.get("SMLA_CUDA_ARCHS", "90a;80").replace(",", ";").split(";") if a.strip()]

c_sources = sorted(glob("csrc/*.c") + glob("csrc/ops/*.c") + glob("csrc/cpu/*.c"))
cu_sources = sorted(glob("cuda/*.cu")) if NVCC else []

cflags = ["-std=gnu11", "-Wall", "-Wextra", "-ffp-contract=off", "-fopenmp", "-fvisibility=hidden"]
ldflags = ["-fopenmp"]
macros = []
if DEBUG:
    cflags += ["-O0", "-g", "-fsanitize=address,undefined", "-fno-omit-frame-pointer"]
    ldflags += ["-fsanitize=address,undefined"]
    macros.append(("SMLA_DEBUG_BUILD", "1"))
else:
    cflags += ["-O3"]
if NVCC:
    macros += [("SMLA_WITH_CUDA", "1"), ("SMLA_CUDA_ARCHS", '"' + ";".join(ARCHS) + '"')]


class BuildExt(build_ext):
    """Compiles cuda/*.cu with nvcc (in parallel) and links them with the static CUDA runtime."""

    def build_extension(self, ext):
        if NVCC:
            objs = self.compile_cuda()
            cuda_lib = os.path.join(os.path.dirname(os.path.dirname(NVCC)), "lib64")
            ext.extra_objects = objs
            ext.depends = list(ext.depends) + objs  # a rebuilt CUDA object relinks the library
            ext.library_dirs = [cuda_lib]
            ext.libraries = ["cudart_static", "rt", "pthread", "dl", "stdc++"]
        super().build_extension(ext)

    def compile_cuda(self):
        out_dir = os.path.join(self.build_temp, "cuda")
        os.makedirs(out_dir, exist_ok=True)
        gencode = []
        for a in ARCHS:
            gencode += [f"-gencode=arch=compute_{a},code=sm_{a}"]
        flags = ["-std=c++17", "-O3", "-lineinfo", "-Xcompiler", "-fPIC,-fvisibility=hidden", "-Icsrc",
                 "-DSMLA_WITH_CUDA=1", "--expt-relaxed-constexpr", "-Xptxas=-warn-spills"] + gencode
        if DEBUG:
            flags += ["-DSMLA_DEBUG_BUILD=1"]
        if os.environ.get("SMLA_PROFILE_BUILD", "0") not in ("0", "", "false"):
            flags += ["-DSMLA_ATTN_ABLATION=1"]

        # objects compiled with other flags (another SMLA_CUDA_ARCHS, SMLA_PROFILE_BUILD, ...) are stale
        stamp = os.path.join(out_dir, "nvcc_flags.txt")
        same_flags = os.path.exists(stamp) and open(stamp).read() == " ".join(flags)

        def one(src):
            obj = os.path.join(out_dir, os.path.basename(src) + ".o")
            deps = [src] + glob("cuda/*.cuh") + glob("csrc/*.h") + glob("csrc/cpu/*.h")
            if same_flags and os.path.exists(obj) and os.path.getmtime(obj) >= max(os.path.getmtime(d) for d in deps):
                return obj
            cmd = [NVCC] + flags + ["-c", src, "-o", obj]
            print(" ".join(cmd), flush=True)
            subprocess.check_call(cmd, cwd=ROOT)
            return obj

        jobs = int(os.environ.get("SMLA_NVCC_JOBS", os.cpu_count() or 1))
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            objs = list(pool.map(one, cu_sources))
        with open(stamp, "w") as f:
            f.write(" ".join(flags))
        return objs


setup(
    ext_modules=[
        Extension(
            "smla._C",
            sources=c_sources,
            include_dirs=[np.get_include(), "csrc"],
            define_macros=macros,
            extra_compile_args=cflags,
            extra_link_args=ldflags,
            depends=glob("csrc/*.h") + glob("csrc/*/*.h") + cu_sources + glob("cuda/*.cuh"),
        )
    ],
    cmdclass={"build_ext": BuildExt},
)
