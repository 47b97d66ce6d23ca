"""Fixtures of the Python client's tests; they drive the real `rlsched serve`.

CTest (tests/CMakeLists.txt) sets RLSCHED_BIN to the built program and PYTHONPATH to
<repo>/python:<build>/python. Run by hand from the repository:

    RLSCHED_BIN=build/rlsched PYTHONPATH=python:build/python \
        /usr/bin/python3 -m pytest -q tests/python

Without PYTHONPATH the two directories are derived from RLSCHED_BIN (default
build/rlsched): <repo>/python and the program's directory + /python.

Which CTest suite runs which file is chosen by file name in one place, the Python
section of tests/CMakeLists.txt: the long files have suites of their own, python.client
runs every other test_*.py file.
"""

import os
import sys

import pytest

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_BIN = os.path.abspath(os.environ.get("RLSCHED_BIN") or os.path.join(_REPO, "build", "rlsched"))
os.environ["RLSCHED_BIN"] = _BIN
if not os.environ.get("PYTHONPATH"):
    for _path in (os.path.join(_REPO, "python"), os.path.join(os.path.dirname(_BIN), "python")):
        if os.path.isdir(_path) and _path not in sys.path:
            sys.path.append(_path)

import rlsched  # noqa: E402  (after the path set-up)


@pytest.fixture(scope="session")
def rlsched_bin():
    if not os.access(_BIN, os.X_OK):
        pytest.fail(f"rlsched program not found at {_BIN}: build it or set RLSCHED_BIN")
    return _BIN


@pytest.fixture
def client(rlsched_bin):
    """A fresh client (its own daemon), closed after the test."""
    with rlsched.Client(rlsched_bin, args=["--threads", "2"]) as c:
        yield c
