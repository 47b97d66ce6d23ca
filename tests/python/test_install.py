"""`pip install` of the package, offline, into a fresh venv (setup.py, pyproject.toml).

The repository (without its build trees and .git) is copied to a temporary directory,
as a fresh clone; a venv is made with ``--system-site-packages`` (Debian's pip,
setuptools, wheel, protobuf and numpy come from the system); ``pip install
--no-build-isolation --no-index .`` builds the native module through CMake and the
protobuf modules through protoc; then a subprocess without PYTHONPATH imports the
installed package and solves in process. The C++ build runs with
CMAKE_BUILD_PARALLEL_LEVEL (default 1); about 3.5 min of CPU (the native module with
the decision core, so protobuf, the scheduler and the wire library).

Skipped only when the interpreter has no venv module or no pip (Debian: python3-venv,
python3-pip; scripts/setup.sh installs them).
"""

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# What a clone has that the build does not need, and what a build leaves behind.
_IGNORED_AT_ROOT = {".git", ".cache", ".pytest_cache", ".ci"}


def _project_version():
    with open(os.path.join(_REPO, "CMakeLists.txt"), encoding="utf-8") as f:
        return re.search(r"project\(\s*rlsched\s+VERSION\s+([0-9.]+)", f.read()).group(1)


def _copy_sources(destination):
    def ignore(directory, names):
        ignored = {n for n in names if n in ("__pycache__",) or n.endswith((".pyc", ".so"))}
        if os.path.abspath(directory) == _REPO:
            ignored |= {n for n in names if n in _IGNORED_AT_ROOT or n.startswith("build")}
        return ignored

    shutil.copytree(_REPO, destination, ignore=ignore, symlinks=True)


def pip_install(root, *options, timeout):
    """Copies the sources to root/rlsched, makes a venv root/venv and pip-installs the
    copy into it, offline (`options` such as "-e" go before the "."). Returns the
    venv's python, the venv, the copy and the environment the install ran with."""
    source = root / "rlsched"
    _copy_sources(source)
    venv = root / "venv"
    # Without pip of its own: the system's pip (python3-pip) runs in the venv through
    # --system-site-packages and installs into the venv.
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip",
                    str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "RLSCHED_BIN", "RLSCHED_NATIVE", "PIP_INDEX_URL")}
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", "1")
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    result = subprocess.run(
        [str(python), "-m", "pip", "install", "--no-build-isolation", "--no-index", *options,
         "."], cwd=source, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"pip install failed:\n{result.stdout}\n{result.stderr}"
    return {"python": python, "venv": venv, "source": source, "env": env}


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    if importlib.util.find_spec("venv") is None:
        pytest.skip(f"{sys.executable} has no venv module (apt-get install python3-venv)")
    if importlib.util.find_spec("pip") is None:
        pytest.skip(f"{sys.executable} has no pip (apt-get install python3-pip)")
    return pip_install(tmp_path_factory.mktemp("install"), timeout=840)


def test_pip_install_builds_the_native_module_and_the_protobuf_modules(installed, tmp_path):
    script = textwrap.dedent("""
        import json, os, sys
        import rlsched, rlsched._native, rlsched.v1.service_pb2, rlsched.v1.runtime_pb2
        import rlsched.integrations.verl
        lengths = [4096, 17, 900, 2500, 333, 8000, 64, 1200, 512, 3000]
        result = rlsched.balance(lengths, 3)
        parts = rlsched.get_seqlen_balanced_partitions(lengths, 2, equal_size=True)
        # The decision core and the daemon's solver in process (the wire library, which
        # the pip build compiles without gRPC): one engine joins a sync run without
        # weights and is told to load version 0.
        core = rlsched.Orchestrator({"orchestrator": {"mode": "ORCHESTRATOR_MODE_SYNC",
                                                      "prompts_per_step": 1,
                                                      "samples_per_prompt": 2},
                                     "steps": 1})
        first = core.engine_joined(time=0, engine=0, max_concurrent=4, version=-1)
        with rlsched.InProcessClient() as solver:
            solved = solver.balance(lengths, 3)
        print(json.dumps({
            "has_wire": rlsched._native.HAS_WIRE,
            "first_command": [c.WhichOneof("kind") for c in first],
            "first_version": first[0].sync_weights.version,
            "in_process_max_cost": solved.max_cost,
            "file": rlsched.__file__,
            "native_file": rlsched._native.__file__,
            "path": list(rlsched.__path__),
            "native": rlsched.native_available(),
            "version": rlsched.__version__,
            "native_version": rlsched._native.__version__,
            "parts": [p.indices for p in result.parts],
            "max_cost": result.max_cost,
            "lower_bound": result.lower_bound,
            "equal_parts": parts,
        }))
    """)
    # From a directory outside the sources, without PYTHONPATH and without a daemon.
    result = subprocess.run([str(installed["python"]), "-c", script], cwd=tmp_path,
                            env=installed["env"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    site = str(installed["venv"])
    assert out["file"].startswith(site), out["file"]
    assert out["native_file"].startswith(site), out["native_file"]
    assert all(p.startswith(site) for p in out["path"]), out["path"]
    assert out["native"] is True
    assert out["version"] == out["native_version"] == _project_version()
    assert out["has_wire"] is True
    assert out["first_command"] == ["sync_weights"] and out["first_version"] == 0
    assert out["in_process_max_cost"] == out["max_cost"]

    lengths = [4096, 17, 900, 2500, 333, 8000, 64, 1200, 512, 3000]
    parts = out["parts"]
    assert sorted(i for p in parts for i in p) == list(range(len(lengths)))
    loads = [sum(lengths[i] for i in p) for p in parts]
    assert max(loads) == out["max_cost"]
    # 20,622 tokens in 3 parts: the bound is 8,000 (one sequence) vs ceil(20,622/3).
    assert out["lower_bound"] == max(max(lengths), -(-sum(lengths) // 3))
    assert max(loads) <= out["lower_bound"] + max(lengths)
    equal = out["equal_parts"]
    assert [len(p) for p in equal] == [5, 5]
    assert sorted(i for p in equal for i in p) == list(range(len(lengths)))

    # The package metadata carries the same version.
    show = subprocess.run([str(installed["python"]), "-m", "pip", "show", "rlsched"],
                          cwd=tmp_path, env=installed["env"], capture_output=True, text=True,
                          timeout=120)
    assert show.returncode == 0, show.stderr
    assert f"Version: {_project_version()}" in show.stdout.splitlines()


def test_the_build_leaves_the_sources_clean(installed):
    source = installed["source"]
    # Build files go to build-python/ (ignored by git), not to build/ (a CMake tree's
    # usual name) nor beside the package.
    assert not (source / "build").exists()
    assert (source / "build-python").is_dir()
    assert not any(name.endswith(".egg-info") for name in os.listdir(source / "python"))
