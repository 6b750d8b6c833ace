"""Builds the pdkv wheel: the pure-Python package plus libpdkv.so.0.

The library is built by CMake, not here (make build). It comes from
$PDKV_LIBRARY, or else ../build/lib/libpdkv.so.0 next to this folder, and
lands in pdkv/_lib/, where pdkv/_native.py looks first. The wheel is tagged
py3-none-<platform>: it holds no compiled Python module, so one wheel serves
every Python 3 version, on the platform the library was built for.
"""

import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py
from wheel.bdist_wheel import bdist_wheel

HERE = os.path.dirname(os.path.abspath(__file__))


def library_path():
    path = os.environ.get("PDKV_LIBRARY") or os.path.join(HERE, "..", "build", "lib",
                                                          "libpdkv.so.0")
    path = os.path.realpath(path)
    if not os.path.isfile(path):
        raise SystemExit(f"pdkv: {path} does not exist: run `make build` first, "
                         "or set PDKV_LIBRARY to a built libpdkv.so.0")
    return path


class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        target = os.path.join(self.build_lib, "pdkv", "_lib")
        os.makedirs(target, exist_ok=True)
        shutil.copy2(library_path(), os.path.join(target, "libpdkv.so.0"))


class PlatformWheel(bdist_wheel):
    """py3-none-<platform>: any Python 3, this platform's libpdkv.so.0."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        return "py3", "none", super().get_tag()[2]


setup(cmdclass={"build_py": BuildWithLibrary, "bdist_wheel": PlatformWheel})
