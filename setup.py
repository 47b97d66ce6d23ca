"""Builds and installs the Python package rlsched with its native module, offline.

    /usr/bin/python3 -m pip install --no-build-isolation .

(in a venv made with ``python3 -m venv --system-site-packages``, or with
``--break-system-packages`` for the system interpreter). ``--no-build-isolation`` is
needed: pip would otherwise fetch setuptools from PyPI; Debian's python3-setuptools and
python3-wheel are used instead.

What the build does:
  * rlsched._native: CMake configures this repository (no tests or benchmarks) and
    builds the one target ``rlsched_native`` (pybind11; the C++ libraries balance and
    common, and, for the decision core ``rlsched.Orchestrator`` and the in-process
    ``solve()``, the wire library: scheduler, rollout and the C++ protobuf messages); the
    module is copied into the wheel. C++ dependencies come from the system (Debian:
    cmake g++ pybind11-dev, and ninja-build when present; for the wire library
    libprotobuf-dev protobuf-compiler libfmt-dev nlohmann-json3-dev; the program's other
    packages, gRPC, oneTBB, spdlog and CLI11, only for the program, see below). When
    the configuration with the wire library fails (a package missing), the module is
    built without it (balance and plan_step in process; Orchestrator and the other cost
    models unavailable) and a warning says so; ``RLSCHED_PIP_WIRE=0`` asks for that
    build directly (and so for no program).
  * the program ``rlsched``: when the program's packages are present too (gRPC, oneTBB,
    spdlog, CLI11; Debian: libgrpc++-dev protobuf-compiler-grpc libtbb-dev
    libspdlog-dev libcli11-dev), the same configuration (``-DRLSCHED_BUILD_PROGRAM=ON``)
    and the same build also make the target ``rlsched``, shipped as
    ``rlsched/bin/rlsched`` (executable) in the package; ``rlsched.find_program()``
    finds it (after ``RLSCHED_BIN``, before ``PATH``) and the console script ``rlsched``
    (``<venv>/bin/rlsched``) runs it. When that configuration fails, or with
    ``RLSCHED_PIP_PROGRAM=0``, the module is built as above without the program and a
    warning says how to get it.
  * rlsched.v1.*_pb2: protoc (Debian: protobuf-compiler) generates the protobuf
    modules from proto/rlsched/v1/*.proto into the wheel.
  * rlsched._version: the version of the top-level CMakeLists.txt's
    ``project(rlsched VERSION x.y.z)``, the project's one version string.

Editable (``pip install --no-build-isolation -e .``): the sources of python/rlsched/ are
imported in place; the native module, the protobuf modules and ``_version.py`` are
written to ``build-python/editable/rlsched/`` (the program to its ``bin/rlsched``),
which the package adds to its ``__path__``. Python edits take effect at once; after a
C++ or .proto change run the install again.

Environment: ``CMAKE_BUILD_PARALLEL_LEVEL`` (jobs of the C++ build), ``RLSCHED_CMAKE_ARGS``
(extra CMake arguments, shell-quoted), ``CMAKE`` and ``PROTOC`` (the tools to use),
``RLSCHED_PIP_PROGRAM=0`` (no program), ``RLSCHED_PIP_WIRE=0`` (no wire library, hence
no program).
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
# What an editable install generates and builds (the package's native module, protobuf
# modules and _version.py), kept out of the sources: <repo>/build-python/editable/rlsched/.
EDITABLE_DIR = ROOT / BUILD_BASE / "editable"
# The protobuf modules the package imports (as proto/CMakeLists.txt generates them).
PROTOS = ["balance", "reshard", "orchestrator", "runtime", "service"]
# Where the program goes in the package (rlsched/_program.py looks there).
PROGRAM_IN_PACKAGE = Path("bin") / "rlsched"
PROGRAM_MISSING_WARNING = (
    "setup.py: WARNING: the rlsched program is not included ({reason}); the package "
    "works in process, and its daemon calls need a program: install the program's "
    "packages (Debian: libgrpc++-dev protobuf-compiler-grpc libtbb-dev libspdlog-dev "
    "libcli11-dev) and run pip install again, or build it with CMake (cmake -S . -B build "
    "&& cmake --build build --target rlsched) and set RLSCHED_BIN=build/rlsched")


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
        # An editable install (pip install -e) imports the sources in place: the
        # generated files go to build-python/editable/rlsched/, which the package adds to
        # its __path__ (rlsched/__init__.py), as it does for a CMake build tree.
        lib = EDITABLE_DIR if getattr(self, "editable_mode", False) else Path(self.build_lib)
        package_dir = lib / "rlsched"
        package_dir.mkdir(parents=True, exist_ok=True)
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
                   f"--python_out={lib.resolve()}"]
        command += [str(proto_dir / "rlsched" / "v1" / f"{name}.proto") for name in PROTOS]
        subprocess.check_call(command)
        # protoc writes rlsched/v1/<name>_pb2.py under --python_out.
        for name in PROTOS:
            if not (out / f"{name}_pb2.py").is_file():
                raise RuntimeError(f"setup.py: protoc did not write {out / (name + '_pb2.py')}")
        # The deprecated name of orchestrator_pb2 (proto/CMakeLists.txt copies it too).
        shutil.copyfile(proto_dir / "aliases" / "rollout_pb2.py", out / "rollout_pb2.py")


class CMakeBuildExt(build_ext):
    """rlsched._native, and the program rlsched when it can be built, through CMake: one
    configuration of the repository, one build of both targets."""

    def _configure(self, cmake, build_dir, program, wire):
        configure = [
            cmake, "-S", str(ROOT), "-B", str(build_dir),
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DRLSCHED_BUILD_PROGRAM={'ON' if program else 'OFF'}",
            f"-DRLSCHED_BUILD_WIRE={'ON' if wire else 'OFF'}",
            "-DRLSCHED_BUILD_TESTS=OFF",
            "-DRLSCHED_BUILD_BENCHMARKS=OFF", "-DRLSCHED_BUILD_PYTHON=ON",
            # pybind11 builds for the interpreter running this build (a venv's python).
            f"-DPYTHON_EXECUTABLE={sys.executable}", f"-DPython_EXECUTABLE={sys.executable}",
        ]
        if shutil.which("ninja") and not (build_dir / "CMakeCache.txt").exists():
            configure += ["-G", "Ninja"]
        configure += shlex.split(os.environ.get("RLSCHED_CMAKE_ARGS", ""))
        return subprocess.call(configure)

    def _configure_best(self, cmake, base):
        """Configures the fullest build the system's packages allow: the program and the
        module (RLSCHED_PIP_PROGRAM not "0"), else the module with the wire library
        (RLSCHED_PIP_WIRE not "0"), else the module alone. Returns the build directory
        and whether the program is in it."""
        wire = os.environ.get("RLSCHED_PIP_WIRE", "1") != "0"
        program = wire and os.environ.get("RLSCHED_PIP_PROGRAM", "1") != "0"
        if program:
            build_dir = base / "cmake-program"
            if self._configure(cmake, build_dir, True, True) == 0:
                return build_dir, True
            print(PROGRAM_MISSING_WARNING.format(
                reason="configuring with the program failed (see above)"), file=sys.stderr)
        else:
            reason = "RLSCHED_PIP_PROGRAM=0" if wire else "RLSCHED_PIP_WIRE=0"
            print(PROGRAM_MISSING_WARNING.format(reason=reason), file=sys.stderr)
        if wire:
            build_dir = base / "cmake"
            if self._configure(cmake, build_dir, False, True) == 0:
                return build_dir, False
            print("setup.py: WARNING: configuring with the wire library failed (see above); "
                  "building rlsched._native without it: no rlsched.Orchestrator, and cost "
                  "models other than tokens go to the daemon", file=sys.stderr)
        build_dir = base / "cmake-no-wire"
        if self._configure(cmake, build_dir, False, False) != 0:
            raise RuntimeError("setup.py: CMake could not configure rlsched_native")
        return build_dir, False

    def build_extension(self, ext):
        cmake = find_tool("CMAKE", "cmake", "cmake")
        base = Path(self.build_temp).resolve()
        build_dir, program = self._configure_best(cmake, base)
        command = [cmake, "--build", str(build_dir), "--target", "rlsched_native"]
        if program:
            command += ["rlsched"]
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
        # The program goes into the package as rlsched/bin/rlsched (rlsched.find_program()
        # and the rlsched console script run it). A build without it removes one an
        # earlier build left in build_lib.
        shipped = target.parent / PROGRAM_IN_PACKAGE
        if program:
            executable = build_dir / "rlsched"
            if not executable.is_file():
                raise RuntimeError(f"setup.py: the build did not write {executable}")
            shipped.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(executable, shipped)
            shipped.chmod(0o755)
        elif shipped.exists():
            shipped.unlink()

    def copy_extensions_to_source(self):
        # pip install -e: the module goes beside the generated files in
        # build-python/editable/rlsched/, not into python/rlsched/ (where it would
        # shadow a CMake build tree's module).
        if not getattr(self, "editable_mode", False):
            super().copy_extensions_to_source()
            return
        for ext in self.extensions:
            filename = self.get_ext_filename(self.get_ext_fullname(ext.name))
            target = EDITABLE_DIR / filename
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(Path(self.build_lib) / filename, target)
            # The program beside it: build-python/editable/rlsched/bin/rlsched.
            built = Path(self.build_lib) / Path(filename).parent / PROGRAM_IN_PACKAGE
            shipped = target.parent / PROGRAM_IN_PACKAGE
            if built.is_file():
                shipped.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(built, shipped)
                shipped.chmod(0o755)
            elif shipped.exists():
                shipped.unlink()


# The metadata (name, dependencies, extras, the console script) is pyproject.toml's
# [project]; the version, dynamic there, comes from CMakeLists.txt.
setup(
    version=project_version(),
    package_dir={"": "python"},
    packages=find_packages("python", include=["rlsched", "rlsched.*"]),
    # The package's inline types (PEP 561).
    package_data={"rlsched": ["py.typed"]},
    # Built by CMakeBuildExt; the sources are listed for sdists only.
    ext_modules=[Extension("rlsched._native", sources=["python/native/module.cc"])],
    cmdclass={"build": Build, "build_py": BuildPy, "build_ext": CMakeBuildExt,
              "egg_info": EggInfo},
    zip_safe=False,
)
