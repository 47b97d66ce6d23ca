"""The package's metadata: pyproject.toml's [project] with the version left to setup.py,
which takes the top-level CMakeLists.txt's project(rlsched VERSION x.y.z), the project's
one version string; the PEP 561 marker. (test_install.py checks the installed package.)"""

import os
import re
import subprocess
import sys

import pytest

import rlsched

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _cmake_version() -> str:
    with open(os.path.join(_REPO, "CMakeLists.txt"), encoding="utf-8") as f:
        return re.search(r"project\(\s*rlsched\s+VERSION\s+([0-9.]+)", f.read()).group(1)


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11
    with open(os.path.join(_REPO, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def test_pyproject_declares_the_project_with_a_dynamic_version():
    project = _pyproject()["project"]
    assert project["name"] == "rlsched"
    assert project["dynamic"] == ["version"] and "version" not in project
    assert any(d.startswith("protobuf") for d in project["dependencies"])
    extras = project["optional-dependencies"]
    assert extras["worker"] == ["grpcio"] and extras["weight-sync"] == ["torch"]
    assert project["scripts"] == {"rlsched": "rlsched._program:main"}


def test_the_declared_version_is_cmakes():
    done = subprocess.run([sys.executable, "setup.py", "--name", "--version"], cwd=_REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["rlsched", _cmake_version()]
    # The build's rlsched._version (CMake writes it) says the same.
    assert rlsched.__version__ == _cmake_version()


def test_the_package_is_typed():
    assert os.path.isfile(os.path.join(_REPO, "python", "rlsched", "py.typed"))
