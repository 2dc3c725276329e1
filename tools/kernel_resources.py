"""Registers, spills, stack and shared memory of every kernel in the given CUDA sources, as ptxas reports
them, one line per (arch, kernel), names demangled and anonymous-namespace hashes removed, so that two
builds of the same kernels (a refactor, another file layout) can be compared with diff:

    python3 tools/kernel_resources.py cuda/attention/*.cu > before.txt   (then again after, and diff)

Compiles each file with setup.py's flags for sm_90a and sm_80 (files under cuda/attention/sm90/ for sm_90a
only) plus -Xptxas -v, into a temporary folder. Needs nvcc; no GPU.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

NVCC = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
FLAGS = ["-std=c++17", "-O3", "-Xcompiler", "-fPIC", "-Icsrc", "-Icuda", "-DSMLA_WITH_CUDA=1",
         "-DSMLA_HAVE_SM90=1", "--expt-relaxed-constexpr", "-Xptxas=-v"]
ARCHS = ["-gencode=arch=compute_90a,code=sm_90a", "-gencode=arch=compute_80,code=sm_80"]


def resources(src, extra):
    archs = ARCHS[:1] if os.sep + "sm90" + os.sep in src else ARCHS
    with tempfile.TemporaryDirectory() as tmp:
        r = subprocess.run([NVCC] + FLAGS + extra + archs + ["-c", src, "-o", os.path.join(tmp, "k.o")],
                           capture_output=True, text=True)
    if r.returncode:
        sys.exit(r.stderr)
    rows, fn, arch = [], None, None
    for line in r.stderr.splitlines():
        m = re.search(r"Compiling entry function '(\S+)' for '(sm_\w+)'", line)
        if m:
            fn, arch = m.group(1), m.group(2)
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and fn:
            spill = f"stack {m.group(1)} spill {m.group(2)}/{m.group(3)}"
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and fn:
            sm = re.search(r"(\d+) bytes smem", line)
            name = subprocess.run(["c++filt", fn], capture_output=True, text=True).stdout.strip()
            name = re.sub(r"\(anonymous namespace\)::", "", name)
            rows.append(f"{arch} {name}: regs {m.group(1)} static-smem {sm.group(1) if sm else 0} {spill}")
            fn = None
    return rows


def main(args):
    extra = [a for a in args if a.startswith("-D")]
    rows = set()
    for src in (a for a in args if not a.startswith("-D")):
        rows.update(resources(src, extra))
    print("\n".join(sorted(rows)))


if __name__ == "__main__":
    main(sys.argv[1:])
