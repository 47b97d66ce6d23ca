"""`pip install -e` of the repository, offline, into a fresh venv (setup.py's editable
build).

Like test_install.py: the repository is copied to a temporary directory and a venv made
with ``--system-site-packages``; ``pip install --no-build-isolation --no-index -e .``
builds the native module (with the wire library), the program (``bin/rlsched``) and
the protobuf modules into ``build-python/editable/rlsched/``; a subprocess without
PYTHONPATH then imports the package from the copy's python/rlsched/ (the sources, in
place), runs the decision core and the step planner, finds the program, sees an edit
of a Python file without reinstalling, and the sources stay clean (no module or
generated file beside them).

The build takes several minutes of CPU (CMAKE_BUILD_PARALLEL_LEVEL, default 1), so the test
runs only with RLSCHED_TEST_EDITABLE=1 (the python.install CTest is its place); skipped
otherwise, and without venv or pip.
"""

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

from test_install import _project_version, pip_install

pytestmark = pytest.mark.skipif(
    os.environ.get("RLSCHED_TEST_EDITABLE") != "1",
    reason="the editable install builds the native module (minutes): RLSCHED_TEST_EDITABLE=1")


def test_pip_install_editable(tmp_path):
    if importlib.util.find_spec("venv") is None or importlib.util.find_spec("pip") is None:
        pytest.skip(f"{sys.executable} has no venv module or no pip")
    installed = pip_install(tmp_path, "-e", timeout=1500)
    python, source, env = installed["python"], installed["source"], installed["env"]

    script = textwrap.dedent("""
        import json
        import rlsched, rlsched._native
        core = rlsched.Orchestrator({"orchestrator": {"prompts_per_step": 1,
                                                      "samples_per_prompt": 2}, "steps": 1})
        commands = core.engine_joined(time=0, engine=0, max_concurrent=2)
        commands += core.prompts_available(time=0, prompts=[(4, 10)])
        print(json.dumps({
            "file": rlsched.__file__,
            "native_file": rlsched._native.__file__,
            "version": rlsched.__version__,
            "native_version": rlsched._native.__version__,
            "commands": [c.WhichOneof("kind") for c in commands],
            "plan": rlsched.plan_step_indices([5, 9, 3, 7], 2, 10),
            "marker": getattr(rlsched, "EDITED", None),
            "program": rlsched.find_program(),
        }))
    """)

    def run():
        done = subprocess.run([str(python), "-c", script], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    out = run()
    package = source / "python" / "rlsched"
    editable = source / "build-python" / "editable" / "rlsched"
    assert out["file"] == str(package / "__init__.py")
    assert out["native_file"].startswith(str(editable))
    assert out["version"] == out["native_version"] == _project_version()
    assert out["commands"] == ["dispatch"]
    plan = out["plan"]
    assert sorted(i for rank in plan for m in rank for i in m) == [0, 1, 2, 3]
    assert out["marker"] is None
    # The program is built into the editable directory too, and found there (the
    # environment has no RLSCHED_BIN; the shipped program comes before PATH).
    shipped = editable / "bin" / "rlsched"
    assert out["program"] == str(shipped)
    assert os.access(shipped, os.X_OK)
    version = subprocess.run([str(installed["venv"] / "bin" / "rlsched"), "--version"],
                             cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=60)
    assert version.returncode == 0, version.stderr
    assert version.stdout.split() == ["rlsched", _project_version()]
    # Nothing built beside the sources.
    assert not list(package.glob("_native*")) and not (package / "v1").exists()
    assert not (package / "_version.py").exists()
    # A Python edit shows without reinstalling.
    with open(package / "__init__.py", "a", encoding="utf-8") as f:
        f.write("\nEDITED = 1\n")
    assert run()["marker"] == 1
