"""Build smla._C: the C extension always; the CUDA kernels when nvcc is found.

Environment switches:
  SMLA_CUDA=auto|0|1      build the CUDA kernels (auto: when nvcc is found)
  SMLA_CUDA_ARCHS="90a;80" GPU targets (default: Hopper sm_90a plus portable sm_80)
  SMLA_DEBUG=1            -O0 -g with AddressSanitizer and UBSan (CPU code); importing such a build
                          needs libasan preloaded (README.md, "Building")
  SMLA_NVCC_JOBS=N        parallel nvcc processes (default: CPU count)
  SMLA_PROFILE_BUILD=1    also compile the attention ablation variants, picked by SMLA_ATTN_ABLATE
                          (CUDA: tools/ablate.py; CPU: benchmarks/bench_cpu.py --stages)

Every configuration builds in its own folder, build/<key> (e.g. build/cpu, build/cuda-90a_80-debug), so
a build with other switches never reuses the objects or the linked library of another one.
"""
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from glob import glob

import numpy as np
from setuptools import Extension, setup
from setuptools.command.build import build
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


def switch(name, default):
    """A yes/no switch: 1/on/true/yes or 0/off/false/no (empty = default); anything else stops the build."""
    value = os.environ.get(name, "").strip().lower()
    if value == "":
        return default
    if value in ("1", "on", "true", "yes"):
        return True
    if value in ("0", "off", "false", "no"):
        return False
    sys.exit(f"{name}={os.environ[name]!r} is not a switch: use 1 or 0" + (" (or auto)" if name == "SMLA_CUDA" else ""))


def find_nvcc():
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    cands = [os.path.join(home, "bin", "nvcc")] if home else []
    cands += [shutil.which("nvcc") or "", "/usr/local/cuda/bin/nvcc"]
    return next((c for c in cands if c and os.path.exists(c)), None)


def cuda_wanted():
    """nvcc's path when the CUDA kernels are to be built, else None."""
    if os.environ.get("SMLA_CUDA", "").strip().lower() in ("", "auto"):
        return find_nvcc()
    if not switch("SMLA_CUDA", False):
        return None
    nvcc = find_nvcc()
    if nvcc is None:
        sys.exit("SMLA_CUDA=1 but nvcc was not found (set CUDA_HOME)")
    return nvcc


DEBUG = switch("SMLA_DEBUG", False)
NVCC = cuda_wanted()
ARCHS = [a.strip() for a in os.environ.get("SMLA_CUDA_ARCHS", "90a;80").replace(",", ";").split(";") if a.strip()]
PROFILE = switch("SMLA_PROFILE_BUILD", False)

# The build folder's name: every switch that changes an object file or the linked library.
KEY = "-".join(["cuda-" + "_".join(ARCHS) if NVCC else "cpu"] + ["debug"] * DEBUG + ["profile"] * PROFILE)

# csrc/core (plain C rules shared with cuda/), csrc/python (the only users of Python.h), csrc/cpu (kernels)
c_sources = sorted(glob("csrc/**/*.c", recursive=True))
cu_sources = sorted(glob("cuda/**/*.cu", recursive=True)) if NVCC else []
# The wgmma kernels (cuda/attention/sm90/) exist only as sm_90a code: they are compiled for that target
# alone, and only when it is among the archs; SMLA_HAVE_SM90 tells the launcher they were built.
SM90_DIR = os.path.join("cuda", "attention", "sm90") + os.sep
HAVE_SM90 = "90a" in ARCHS
if not HAVE_SM90:
    cu_sources = [s for s in cu_sources if not s.startswith(SM90_DIR)]
header_deps = glob("csrc/**/*.h", recursive=True) + glob("cuda/**/*.cuh", recursive=True)

cflags = ["-std=gnu11", "-Wall", "-Wextra", "-ffp-contract=off", "-fopenmp", "-fvisibility=hidden"]
ldflags = ["-fopenmp"]
macros = []
if DEBUG:
    cflags += ["-O0", "-g", "-fsanitize=address,undefined", "-fno-omit-frame-pointer"]
    ldflags += ["-fsanitize=address,undefined"]
    macros.append(("SMLA_DEBUG_BUILD", "1"))
else:
    cflags += ["-O3"]
if PROFILE:
    macros.append(("SMLA_ATTN_ABLATION", "1"))
if NVCC:
    macros += [("SMLA_WITH_CUDA", "1"), ("SMLA_CUDA_ARCHS", '"' + ";".join(ARCHS) + '"')]


class Build(build):
    """Puts the whole build (objects, linked library, wheel staging) under build/<KEY>."""

    def finalize_options(self):
        self.build_base = os.path.join(self.build_base, KEY)
        super().finalize_options()


class BuildExt(build_ext):
    """Compiles cuda/*.cu with nvcc (in parallel) and links them with the static CUDA runtime."""

    def build_extension(self, ext):
        if NVCC:
            if not cu_sources:
                # Linking without them would give a library that fails to import on a GPU host.
                sys.exit("SMLA_CUDA: nvcc was found but cuda/**/*.cu are missing from this source tree, so the "
                         "CUDA kernels cannot be built: use a complete checkout or sdist, or set SMLA_CUDA=0 "
                         "for a CPU-only build")
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
        flags = ["-std=c++17", "-O3", "-lineinfo", "-Xcompiler", "-fPIC,-fvisibility=hidden", "-Icsrc", "-Icuda",
                 "-DSMLA_WITH_CUDA=1", "--expt-relaxed-constexpr", "-Xptxas=-warn-spills"]
        if HAVE_SM90:
            flags += ["-DSMLA_HAVE_SM90=1"]
        if DEBUG:
            flags += ["-DSMLA_DEBUG_BUILD=1"]
        if PROFILE:
            flags += ["-DSMLA_ATTN_ABLATION=1"]

        # objects compiled by another nvcc or with other flags (an edited setup.py) are stale
        stamp = os.path.join(out_dir, "nvcc_flags.txt")
        stamp_text = " ".join([NVCC] + flags + gencode)
        same_flags = os.path.exists(stamp) and open(stamp).read() == stamp_text

        def one(src):
            # cuda/attention/sm90/fp8.cu -> attention_sm90_fp8.cu.o (names repeat across folders)
            obj = os.path.join(out_dir, os.path.relpath(src, "cuda").replace(os.sep, "_") + ".o")
            deps = [src] + header_deps
            if same_flags and os.path.exists(obj) and os.path.getmtime(obj) >= max(os.path.getmtime(d) for d in deps):
                return obj
            arch = ["-gencode=arch=compute_90a,code=sm_90a"] if src.startswith(SM90_DIR) else gencode
            cmd = [NVCC] + flags + arch + ["-c", src, "-o", obj]
            print(" ".join(cmd), flush=True)
            subprocess.check_call(cmd, cwd=ROOT)
            return obj

        jobs = int(os.environ.get("SMLA_NVCC_JOBS", os.cpu_count() or 1))
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            objs = list(pool.map(one, cu_sources))
        with open(stamp, "w") as f:
            f.write(stamp_text)
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
            depends=header_deps + cu_sources,
        )
    ],
    cmdclass={"build": Build, "build_ext": BuildExt},
)
