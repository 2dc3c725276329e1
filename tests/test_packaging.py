"""Packaging: a complete sdist whatever the machine, one build folder per build configuration, one version
source, the py.typed marker, and the debug (AddressSanitizer) build's import error.

Everything here runs setup.py on a copy of the source tree (no compiler run, except one tiny gcc link for
the sanitizer check), with the CUDA switches set so that nvcc is never started.
"""
import glob
import importlib.resources
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HAVE_SOURCE = os.path.exists(os.path.join(ROOT, "setup.py"))
needs_source = pytest.mark.skipif(not HAVE_SOURCE, reason="needs the source tree (setup.py)")

# What a checkout may hold that is not source: build products, caches, local results.
_NOT_SOURCE = ("build", "dist", ".git", ".pytest_cache", "__pycache__", "*.egg-info", "*.so", "*.o", "*.pyc",
               "results")
# The folders the sdist must carry whole.
_TREES = ("csrc", "cuda", "tests", "benchmarks", "tools", "docs", "src")


def _copy_source(dst):
    shutil.copytree(ROOT, dst, ignore=shutil.ignore_patterns(*_NOT_SOURCE))
    return str(dst)


def _env(**switches):
    """The environment without any build switch, CUDA_HOME or nvcc on PATH, plus `switches`."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SMLA_") and k not in ("CUDA_HOME", "CUDA_PATH", "LD_PRELOAD")}
    env["PATH"] = os.pathsep.join(d for d in env.get("PATH", "").split(os.pathsep)
                                  if d and not os.path.exists(os.path.join(d, "nvcc")))
    env.update(switches)
    return env


def _run(args, cwd, env):
    return subprocess.run([sys.executable] + args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _sdist(src, out_dir):
    """Builds an sdist of the tree at src (PEP 517 hook, no isolation) and returns its path."""
    setuptools = pytest.importorskip("setuptools", minversion="77")  # the [test] extra installs it
    assert setuptools
    code = "import sys; from setuptools import build_meta; print(build_meta.build_sdist(sys.argv[1]))"
    r = _run(["-c", code, str(out_dir)], src, _env(SMLA_CUDA="0"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return os.path.join(str(out_dir), r.stdout.strip().splitlines()[-1])


def _members(sdist):
    with tarfile.open(sdist) as tar:
        names = tar.getnames()
        top = names[0].split("/")[0]
        pkg_info = tar.extractfile(f"{top}/PKG-INFO").read().decode()
    return {n[len(top) + 1:] for n in names if n.startswith(top + "/")}, pkg_info


@pytest.fixture(scope="module")
def source_copy(tmp_path_factory):
    if not HAVE_SOURCE:
        pytest.skip("needs the source tree (setup.py)")
    return _copy_source(tmp_path_factory.mktemp("src") / "smla")


def test_sdist_has_every_source_without_nvcc(source_copy, tmp_path):
    files, pkg_info = _members(_sdist(source_copy, tmp_path))
    expected = {"LICENSE", "README.md", "setup.py", "pyproject.toml", "MANIFEST.in", "src/smla/py.typed",
                "cuda/runtime.cu", "csrc/cpu/threads.h", "csrc/python/ops/attention.h", "tests/conftest.py",
                "tests/reference.py", "tests/torch_arrays.py", "docs/design.md"}
    for tree in _TREES:
        for d, dirs, names in os.walk(os.path.join(source_copy, tree)):
            expected |= {os.path.relpath(os.path.join(d, n), source_copy) for n in names
                         if not n.endswith(".egg-info") and ".egg-info" not in d}
    missing = sorted(expected - files)
    assert not missing, f"the sdist lacks {missing}"
    assert any(f.startswith("cuda/") and f.endswith(".cu") for f in files)
    assert not [f for f in files if f.endswith((".so", ".o", ".pyc"))]
    assert "License-Expression: Apache-2.0" in pkg_info
    assert "License-File: LICENSE" in pkg_info


def test_version_is_read_from_the_package_source(tmp_path):
    """__version__ in src/smla/__init__.py is the only version: the metadata follows it, read without
    importing the package (the copy has no compiled extension, so an import would fail)."""
    if not HAVE_SOURCE:
        pytest.skip("needs the source tree (setup.py)")
    src = _copy_source(tmp_path / "smla")
    init = os.path.join(src, "src", "smla", "__init__.py")
    text = open(init).read()
    assert len(re.findall(r'^__version__ = "[^"]+"$', text, re.M)) == 1
    with open(init, "w") as f:
        f.write(re.sub(r'^__version__ = "[^"]+"$', '__version__ = "9.8.7"', text, flags=re.M))
    _, pkg_info = _members(_sdist(src, tmp_path))
    assert re.search(r"^Version: 9\.8\.7$", pkg_info, re.M), pkg_info[:400]


_FAKE_TOOL = """#!/bin/sh
# Stands in for gcc / nvcc: records its command line and creates the file named after -o.
echo "$0 $*" >> "$SMLA_FAKE_TOOL_LOG"
prev=""; for a in "$@"; do [ "$prev" = "-o" ] && mkdir -p "$(dirname "$a")" && : > "$a"; prev="$a"; done
exit 0
"""


@pytest.fixture
def fake_tools(tmp_path):
    """(CC, CUDA_HOME, log): a compiler, linker and nvcc that only record what they were asked to do."""
    cc = tmp_path / "bin" / "fake-cc"
    nvcc = tmp_path / "cuda" / "bin" / "nvcc"
    for tool in (cc, nvcc):
        tool.parent.mkdir(parents=True)
        tool.write_text(_FAKE_TOOL)
        tool.chmod(0o755)
    return str(cc), str(tmp_path / "cuda"), tmp_path / "tools.log"


def _fake_build(source, fake_tools, **switches):
    """Runs `setup.py build_ext` with the fake tools; returns the commands they were given."""
    cc, cuda_home, log = fake_tools
    log.write_text("")
    env = _env(CC=cc, SMLA_FAKE_TOOL_LOG=str(log), **switches)
    env.pop("LDSHARED", None)
    if switches.get("SMLA_CUDA") == "1":
        env["CUDA_HOME"] = cuda_home
    r = _run(["setup.py", "build_ext"], source, env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return log.read_text().splitlines()


def _linked(commands):
    """The library that the commands linked, or None when the build found it up to date."""
    libs = [m for c in commands for m in re.findall(r" -o (\S+_C\S*\.so)", c)]
    assert len(libs) <= 1, commands
    return libs[0] if libs else None


@needs_source
def test_each_build_configuration_has_its_own_build_folder(source_copy, fake_tools):
    """A second `pip install .` with other switches must not reuse the first one's objects or library
    (it used to find the first library up to date and ship it: `cuda: True` after SMLA_CUDA=0)."""
    configs = [dict(SMLA_CUDA="0"), dict(SMLA_CUDA="0", SMLA_DEBUG="1"),
               dict(SMLA_CUDA="1", SMLA_CUDA_ARCHS="90a;80"), dict(SMLA_CUDA="1", SMLA_CUDA_ARCHS="80"),
               dict(SMLA_CUDA="1", SMLA_CUDA_ARCHS="80", SMLA_PROFILE_BUILD="1")]
    libs = []
    for config in configs:
        commands = _fake_build(source_copy, fake_tools, **config)
        libs.append(_linked(commands))
        assert libs[-1] is not None, f"{config}: nothing was linked"
        assert any(" -c csrc/python/module.c " in c for c in commands), f"{config}: module.c was not compiled"
        nvcc = [c for c in commands if "/cuda/bin/nvcc " in c]
        cu = glob.glob(os.path.join(source_copy, "cuda", "**", "*.cu"), recursive=True)
        if "90a" not in config.get("SMLA_CUDA_ARCHS", ""):  # the wgmma kernels are sm_90a code only
            cu = [f for f in cu if os.sep + os.path.join("attention", "sm90") + os.sep not in f]
        assert len(nvcc) == (len(cu) if "SMLA_CUDA_ARCHS" in config else 0), config
        c_compiles = [c for c in commands if " -c csrc/" in c and c not in nvcc]
        assert all(("-fsanitize=address" in c) == ("SMLA_DEBUG" in config) for c in c_compiles), config
    assert len({os.path.dirname(os.path.dirname(p)) for p in libs}) == len(configs), libs
    # Each configuration keeps its own up-to-date library: building the first one again links nothing.
    assert _linked(_fake_build(source_copy, fake_tools, **configs[0])) is None


@needs_source
def test_a_bad_build_switch_stops_the_build(source_copy, fake_tools):
    r = _run(["setup.py", "build_ext"], source_copy, _env(SMLA_DEBUG="maybe", CC=fake_tools[0],
                                                          SMLA_FAKE_TOOL_LOG=str(fake_tools[2])))
    assert r.returncode != 0
    assert "SMLA_DEBUG='maybe' is not a switch" in r.stderr


def test_cuda_build_without_cuda_sources_stops(tmp_path, fake_tools):
    """A tree without cuda/**/*.cu (an sdist made without nvcc, before MANIFEST.in) must not build a library
    that fails to import on a GPU host (undefined smla_cuda_* symbols)."""
    if not HAVE_SOURCE:
        pytest.skip("needs the source tree (setup.py)")
    src = _copy_source(tmp_path / "smla")
    for folder, _, names in os.walk(os.path.join(src, "cuda")):
        for name in names:
            if name.endswith(".cu"):
                os.remove(os.path.join(folder, name))
    env = _env(SMLA_CUDA="1", CUDA_HOME=fake_tools[1], CC=fake_tools[0], SMLA_FAKE_TOOL_LOG=str(fake_tools[2]))
    env.pop("LDSHARED", None)
    r = _run(["setup.py", "build_ext"], src, env)
    assert r.returncode != 0, r.stdout[-2000:]
    assert "cuda/**/*.cu are missing" in r.stderr
    assert "SMLA_CUDA=0" in r.stderr


@needs_source
def test_wheel_files_include_py_typed(source_copy, tmp_path):
    r = _run(["setup.py", "-q", "build_py", "--build-lib", str(tmp_path / "lib")], source_copy,
             _env(SMLA_CUDA="0"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert (tmp_path / "lib" / "smla" / "py.typed").is_file()


def test_installed_package_is_typed():
    assert importlib.resources.files("smla").joinpath("py.typed").is_file()


def test_debug_build_without_preloaded_asan_raises_import_error(tmp_path):
    """An SMLA_DEBUG=1 extension links libasan, which must be loaded first: importing it in a plain
    Python used to end the process at once. smla's import now raises an ImportError with the command."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("needs gcc to link a small AddressSanitizer library")
    import smla

    pkg = tmp_path / "pkg" / "smla"
    pkg.mkdir(parents=True)
    for name in os.listdir(os.path.dirname(smla.__file__)):
        if name.endswith(".py"):
            shutil.copy(os.path.join(os.path.dirname(smla.__file__), name), pkg / name)
    (tmp_path / "stub.c").write_text("int smla_stub(void) { return 1; }\n")
    ext = pkg / ("_C" + sysconfig.get_config_var("EXT_SUFFIX"))
    link = subprocess.run([gcc, "-shared", "-fPIC", "-fsanitize=address", str(tmp_path / "stub.c"), "-o", str(ext)],
                          capture_output=True, text=True)
    if link.returncode != 0:
        pytest.skip(f"gcc cannot link with -fsanitize=address here: {link.stderr[-300:]}")

    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "ASAN_OPTIONS", "PYTHONPATH")}
    env["PYTHONPATH"] = str(tmp_path / "pkg")
    r = subprocess.run([sys.executable, "-c", "import smla"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "ImportError: " in r.stderr and "SMLA_DEBUG=1 build" in r.stderr, r.stderr[-2000:]
    assert "LD_PRELOAD=$(gcc -print-file-name=libasan.so) ASAN_OPTIONS=detect_leaks=0 python" in r.stderr

    # With the runtime preloaded the check lets the import through (to the stub, which is no module).
    libasan = subprocess.run([gcc, "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    env.update(LD_PRELOAD=libasan, ASAN_OPTIONS="detect_leaks=0")
    r = subprocess.run([sys.executable, "-c", "import smla"], env=env, capture_output=True, text=True, timeout=60)
    assert "PyInit__C" in r.stderr, r.stderr[-2000:]
