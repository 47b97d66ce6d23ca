"""Builds and installs the Python package rlsched with its native module, offline.

    /usr/bin/python3 -m pip install --no-build-isolation .

(in a venv made with ``python3 -m venv --system-site-packages``, or with
``--break-system-packages`` for the system interpreter). ``--no-build-isolation`` is
needed: pip would otherwise fetch setuptools from PyPI; Debian's python3-setuptools and
python3-wheel are used instead.

What the build does:
  * rlsched._native: CMake configures this repository with only the libraries the
    module needs (no program, tests or benchmarks) and builds the target
    ``rlsched_native`` (pybind11, the C++ libraries balance and common); the module is
    copied into the wheel. C++ dependencies come from the system (Debian: cmake g++
    pybind11-dev, and ninja-build when present).
  * rlsched.v1.*_pb2: protoc (Debian: protobuf-compiler) generates the protobuf
    modules from proto/rlsched/v1/*.proto into the wheel.
  * rlsched._version: the version of the top-level CMakeLists.txt's
    ``project(rlsched VERSION x.y.z)``, the project's one version string.

Environment: ``CMAKE_BUILD_PARALLEL_LEVEL`` (jobs of the C++ build), ``RLSCHED_CMAKE_ARGS``
(extra CMake arguments, shell-quoted), ``CMAKE`` and ``PROTOC`` (the tools to use).
Build files go to ``build-python/`` (not ``build/``, which is the usual CMake tree).
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build import build
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py
from setuptools.command.egg_info import egg_info

ROOT = Path(__file__).resolve().parent
BUILD_BASE = "build-python"
# The protobuf modules the package imports (as proto/CMakeLists.txt generates them).
PROTOS = ["balance", "reshard", "rollout", "runtime", "service"]


def project_version() -> str:
    """The ``VERSION`` of ``project(rlsched ...)`` in the top-level CMakeLists.txt."""
    text = (ROOT / "CMakeLists.txt").read_text(encoding="utf-8")
    match = re.search(r"project\(\s*rlsched\s+VERSION\s+([0-9]+(?:\.[0-9]+)*)", text)
    if match is None:
        raise RuntimeError("setup.py: no `project(rlsched VERSION x.y.z)` in "
                           f"{ROOT / 'CMakeLists.txt'}")
    return match.group(1)


def find_tool(env: str, name: str, package: str) -> str:
    path = os.environ.get(env) or shutil.which(name)
    if not path:
        raise RuntimeError(f"setup.py: `{name}` not found on PATH (Debian package {package}); "
                           f"or set {env}")
    return path


class Build(build):
    """Build files under build-python/ instead of build/."""

    def initialize_options(self):
        super().initialize_options()
        self.build_base = BUILD_BASE


class EggInfo(egg_info):
    """The egg-info directory under build-python/ instead of beside the package."""

    def initialize_options(self):
        super().initialize_options()
        os.makedirs(BUILD_BASE, exist_ok=True)
        self.egg_base = BUILD_BASE


class BuildPy(build_py):
    """The pure package, plus rlsched/_version.py and the generated protobuf modules."""

    def run(self):
        super().run()
        package_dir = Path(self.build_lib) / "rlsched"
        (package_dir / "_version.py").write_text(
            '"""The version of rlsched (the top-level CMakeLists.txt\'s project VERSION)."""\n'
            f'version = "{project_version()}"\n', encoding="utf-8")
        protoc = find_tool("PROTOC", "protoc", "protobuf-compiler")
        out = package_dir / "v1"
        out.mkdir(parents=True, exist_ok=True)
        (out / "__init__.py").write_text(
            '"""Generated protobuf modules of rlsched.v1 (built from proto/)."""\n',
            encoding="utf-8")
        proto_dir = ROOT / "proto"
        command = [protoc, f"--proto_path={proto_dir}",
                   f"--python_out={Path(self.build_lib).resolve()}"]
        command += [str(proto_dir / "rlsched" / "v1" / f"{name}.proto") for name in PROTOS]
        subprocess.check_call(command)
        # protoc writes rlsched/v1/<name>_pb2.py under --python_out.
        for name in PROTOS:
            if not (out / f"{name}_pb2.py").is_file():
                raise RuntimeError(f"setup.py: protoc did not write {out / (name + '_pb2.py')}")


class CMakeBuildExt(build_ext):
    """rlsched._native through CMake: configure the repository, build one target."""

    def build_extension(self, ext):
        cmake = find_tool("CMAKE", "cmake", "cmake")
        build_dir = (Path(self.build_temp) / "cmake").resolve()
        configure = [
            cmake, "-S", str(ROOT), "-B", str(build_dir),
            "-DCMAKE_BUILD_TYPE=Release",
            "-DRLSCHED_BUILD_PROGRAM=OFF", "-DRLSCHED_BUILD_TESTS=OFF",
            "-DRLSCHED_BUILD_BENCHMARKS=OFF", "-DRLSCHED_BUILD_PYTHON=ON",
            # pybind11 builds for the interpreter running this build (a venv's python).
            f"-DPYTHON_EXECUTABLE={sys.executable}", f"-DPython_EXECUTABLE={sys.executable}",
        ]
        if shutil.which("ninja") and not (build_dir / "CMakeCache.txt").exists():
            configure += ["-G", "Ninja"]
        configure += shlex.split(os.environ.get("RLSCHED_CMAKE_ARGS", ""))
        subprocess.check_call(configure)
        command = [cmake, "--build", str(build_dir), "--target", "rlsched_native"]
        if self.parallel:
            command += ["--parallel", str(self.parallel)]
        subprocess.check_call(command)
        built = sorted((build_dir / "python" / "rlsched").glob("_native*.so"))
        if len(built) != 1:
            raise RuntimeError(f"setup.py: expected one _native*.so in {build_dir}/python/rlsched, "
                               f"found {[p.name for p in built]}")
        target = Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built[0], target)


setup(
    name="rlsched",
    version=project_version(),
    description="Scheduling for RL post-training of LLMs: balancing, step planning, resharding",
    python_requires=">=3.9",
    package_dir={"": "python"},
    packages=find_packages("python", include=["rlsched", "rlsched.*"]),
    # Built by CMakeBuildExt; the sources are listed for sdists only.
    ext_modules=[Extension("rlsched._native", sources=["python/native/module.cc"])],
    install_requires=["protobuf>=3.12"],
    extras_require={"numpy": ["numpy"], "run": ["grpcio"], "executor": ["torch"]},
    cmdclass={"build": Build, "build_py": BuildPy, "build_ext": CMakeBuildExt,
              "egg_info": EggInfo},
    zip_safe=False,
)
