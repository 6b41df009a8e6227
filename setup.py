"""Installs the Python module memcalc (python/memcalc and its extension memcalc._memcalc).

The extension is built by this repository's CMake (-DMEMCALC_PYTHON=ON, target memcalc_python) for the
interpreter that runs this, or, with MEMCALC_PYTHON_BUILT set to a build's python/ folder
(MEMCALC_PYTHON_BUILT=build/python), taken from there as built: nothing is compiled again.
Offline, in a virtual environment that sees Debian's setuptools and wheel:

    /usr/bin/python3 -m venv --system-site-packages .venv && .venv/bin/pip install --no-build-isolation .

CMake reads CMAKE_BUILD_PARALLEL_LEVEL and CMAKE_CXX_COMPILER_LAUNCHER (ccache) from the environment.
"""
import os
import re
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))


def version():
    with open(os.path.join(HERE, "CMakeLists.txt"), encoding="utf-8") as f:
        return re.search(r"project\(memcalc VERSION ([0-9.]+)", f.read()).group(1)


class CMakeBuild(build_ext):
    """Builds memcalc._memcalc with CMake, or copies it from MEMCALC_PYTHON_BUILT."""

    def build_extension(self, ext):
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        folder = os.environ.get("MEMCALC_PYTHON_BUILT")
        if folder:
            folder = os.path.abspath(folder)
        else:
            build_dir = os.path.join(os.path.abspath(self.build_temp), "cmake")
            subprocess.check_call(["cmake", "-S", HERE, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
                                   "-DMEMCALC_PYTHON=ON", f"-DPython3_EXECUTABLE={sys.executable}",
                                   "-DMEMCALC_BUILD_TESTS=OFF", "-DMEMCALC_BUILD_BENCHMARKS=OFF", "-DMEMCALC_WERROR=OFF"])
            subprocess.check_call(["cmake", "--build", build_dir, "--target", "memcalc_python"])
            folder = os.path.join(build_dir, "python")
        built = os.path.join(folder, "memcalc", "_memcalc" + suffix)
        if not os.path.isfile(built):
            sys.exit(f"memcalc: no {built}: build the target memcalc_python there for this Python ({sys.executable})")
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(built, target)


setup(
    name="memcalc",
    version=version(),
    description="Training-memory calculator for transformer language models",
    license="MIT",
    python_requires=">=3.7",
    package_dir={"": "python"},
    packages=["memcalc"],
    ext_modules=[Extension("memcalc._memcalc", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    options={"build": {"build_base": "build/setuptools"}},  # beside a CMake build/, not over it
    zip_safe=False,
)
