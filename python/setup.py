"""Builds libllmkern.so with CMake from the repository this directory sits in and ships it
inside the package (llmkern/libllmkern.so), so `pip install ./python` works on a machine
with cmake, a C compiler and OpenMP (scripts/install_deps.sh installs them).

LLMKERN_LIB set at build time: that library file is packaged instead of building one.
"""
import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
LIB = "libllmkern.so"


def build_library(build_temp):
    prebuilt = os.environ.get("LLMKERN_LIB")
    if prebuilt:
        return os.path.join(prebuilt, LIB) if os.path.isdir(prebuilt) else prebuilt
    if not os.path.exists(os.path.join(REPO, "include", "llmkern.h")):
        raise RuntimeError("llmkern: the C sources are not at %s; install from the repository "
                           "checkout (pip install ./python) or set LLMKERN_LIB" % REPO)
    if shutil.which("cmake") is None:
        raise RuntimeError("llmkern: cmake not found (run scripts/install_deps.sh)")
    bdir = os.path.join(os.path.abspath(build_temp), "cmake")
    subprocess.check_call(["cmake", "-S", REPO, "-B", bdir, "-DCMAKE_BUILD_TYPE=Release",
                           "-DLLMKERN_BUILD_TESTS=OFF", "-DLLMKERN_BUILD_BENCH=OFF"])
    subprocess.check_call(["cmake", "--build", bdir, "--target", "llmkern", "-j",
                           str(os.cpu_count() or 2)])
    return os.path.join(bdir, LIB)


class BuildPyWithLib(build_py):
    def run(self):
        super().run()
        lib = os.path.realpath(build_library(self.get_finalized_command("build").build_temp))
        dest = os.path.join(self.build_lib, "llmkern", LIB)
        self.mkpath(os.path.dirname(dest))
        shutil.copyfile(lib, dest)  # the real file, not the .so -> .so.0 symlink chain


class BinaryDistribution(Distribution):
    """The wheel carries a native library: platform-specific, not pure Python."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildPyWithLib}, distclass=BinaryDistribution)
