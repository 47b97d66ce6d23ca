"""`pip install` of the package, offline, into a fresh venv (setup.py, pyproject.toml).

The repository (without its build trees and .git) is copied to a temporary directory,
as a fresh clone; a venv is made with ``--system-site-packages`` (Debian's pip,
setuptools, wheel, protobuf and numpy come from the system); ``pip install
--no-build-isolation --no-index .`` builds the native module through CMake and the
protobuf modules through protoc; then a subprocess without PYTHONPATH imports the
installed package and solves in process. The C++ build runs with
CMAKE_BUILD_PARALLEL_LEVEL (default 1); about 4.3 min of CPU with the program (the
native module with the decision core, so protobuf, the scheduler and the wire library,
and the program from the same CMake tree; 4 min 41 s wall at level 1 here, load ~3).

When the program's packages are present (they are wherever the CMake build of the
program configures), the same build also compiles the program ``rlsched`` and ships it
as ``rlsched/bin/rlsched``: the test checks that ``<venv>/bin/rlsched`` (the console
script) runs it, and that a ``Client()`` without RLSCHED_BIN and without any rlsched on
PATH finds it. The lookup's order and its error (``RLSCHED_PIP_PROGRAM=0`` builds no
program) are tested on temporary directories, without a second pip build.

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

from rlsched import _program

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
        import rlsched.integrations.verl, rlsched.integrations.slime
        import rlsched.integrations.nemo_rl, rlsched.integrations.areal
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


def _site_package(installed):
    python = installed["python"]
    done = subprocess.run([str(python), "-c", "import os, rlsched; "
                           "print(os.path.dirname(rlsched.__file__))"],
                          env=installed["env"], capture_output=True, text=True, timeout=60,
                          cwd=installed["venv"])
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_pip_install_ships_the_program_and_the_console_script_runs_it(installed, tmp_path):
    package = _site_package(installed)
    shipped = os.path.join(package, "bin", "rlsched")
    assert package.startswith(str(installed["venv"])), package
    assert os.path.isfile(shipped) and os.access(shipped, os.X_OK), shipped
    version = _project_version()
    direct = subprocess.run([shipped, "--version"], capture_output=True, text=True,
                            timeout=60)
    assert direct.returncode == 0, direct.stderr
    assert direct.stdout.split() == ["rlsched", version]

    # The console script: same output, same exit status, from a PATH with only the venv.
    script = installed["venv"] / "bin" / "rlsched"
    assert script.is_file()
    env = dict(installed["env"], PATH=f"{installed['venv'] / 'bin'}:/usr/bin:/bin")
    via_script = subprocess.run([str(script), "--version"], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=60)
    assert via_script.returncode == 0, via_script.stderr
    assert via_script.stdout == direct.stdout
    bad_direct = subprocess.run([shipped, "balance", "--no-such-flag"], capture_output=True,
                                text=True, timeout=60)
    bad_script = subprocess.run(["rlsched", "balance", "--no-such-flag"], cwd=tmp_path,
                                env=env, capture_output=True, text=True, timeout=60)
    assert bad_direct.returncode != 0
    assert bad_script.returncode == bad_direct.returncode
    assert bad_script.stderr == bad_direct.stderr


def test_client_finds_the_shipped_program_without_rlsched_bin_or_path(installed, tmp_path):
    # PATH holds the system's directories only (no rlsched there) and the venv's bin,
    # whose rlsched is the console script, which the lookup skips.
    path = f"{installed['venv'] / 'bin'}:/usr/bin:/bin"
    for directory in ("/usr/bin", "/bin"):
        assert not os.path.exists(os.path.join(directory, "rlsched")), directory
    env = {k: v for k, v in installed["env"].items() if k != "RLSCHED_BIN"}
    env["PATH"] = path
    script = textwrap.dedent("""
        import json, rlsched
        lengths = [4096, 17, 900, 2500, 333, 8000, 64, 1200, 512, 3000]
        with rlsched.Client() as client:
            result = client.balance(lengths, 3)
            version = client.ping()
            binary = client._resolve_binary()
        print(json.dumps({"program": rlsched.find_program(), "binary": binary,
                          "version": version, "max_cost": result.max_cost,
                          "parts": [p.indices for p in result.parts]}))
    """)
    done = subprocess.run([str(installed["python"]), "-c", script], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    shipped = os.path.join(_site_package(installed), "bin", "rlsched")
    assert out["program"] == out["binary"] == shipped
    lengths = [4096, 17, 900, 2500, 333, 8000, 64, 1200, 512, 3000]
    assert sorted(i for p in out["parts"] for i in p) == list(range(len(lengths)))
    assert out["max_cost"] == max(sum(lengths[i] for i in p) for p in out["parts"])
    assert out["max_cost"] <= max(max(lengths), -(-sum(lengths) // 3)) + max(lengths)


# The lookup (rlsched._program.find_program) on temporary directories: no pip build.

def _executable(path, text="#!/bin/sh\nexit 0\n"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    path.chmod(0o755)
    return str(path)


def test_lookup_order_rlsched_bin_then_shipped_then_path(tmp_path, monkeypatch):
    package = tmp_path / "site" / "rlsched"
    on_path = _executable(tmp_path / "path" / "rlsched")
    monkeypatch.delenv("RLSCHED_BIN", raising=False)
    # Only PATH has one.
    assert _program.find_program([str(package)], path=str(tmp_path / "path")) == on_path
    # The shipped program comes before PATH.
    shipped = _executable(package / "bin" / "rlsched")
    assert _program.find_program([str(package)], path=str(tmp_path / "path")) == shipped
    assert _program.shipped_program([str(package)]) == shipped
    # RLSCHED_BIN comes before both.
    monkeypatch.setenv("RLSCHED_BIN", "/somewhere/rlsched")
    assert _program.find_program([str(package)], path=str(tmp_path / "path")) == \
        "/somewhere/rlsched"
    # A shipped file that is not executable does not count.
    monkeypatch.delenv("RLSCHED_BIN")
    (package / "bin" / "rlsched").chmod(0o644)
    assert _program.find_program([str(package)], path=str(tmp_path / "path")) == on_path


def test_lookup_skips_the_console_script_on_path(tmp_path, monkeypatch):
    monkeypatch.delenv("RLSCHED_BIN", raising=False)
    venv_bin = tmp_path / "venv" / "bin"
    _executable(venv_bin / "rlsched", "#!/venv/bin/python\n# -*- coding: utf-8 -*-\n"
                "import re\nimport sys\nfrom rlsched._program import main\n")
    real = _executable(tmp_path / "usr" / "bin" / "rlsched")
    path = f"{venv_bin}:{tmp_path / 'usr' / 'bin'}"
    assert _program.find_program([str(tmp_path / "none")], path=path) == real
    with pytest.raises(_program.ProgramNotFoundError):
        _program.find_program([str(tmp_path / "none")], path=str(venv_bin))


def test_lookup_error_names_the_three_places(tmp_path, monkeypatch):
    # What a package built with RLSCHED_PIP_PROGRAM=0 sees: no bin/rlsched in it.
    monkeypatch.delenv("RLSCHED_BIN", raising=False)
    package = tmp_path / "site" / "rlsched"
    package.mkdir(parents=True)
    with pytest.raises(_program.ProgramNotFoundError) as error:
        _program.find_program([str(package)], path=str(tmp_path / "empty"))
    message = str(error.value)
    assert "RLSCHED_BIN" in message
    assert str(package / "bin" / "rlsched") in message
    assert "PATH" in message
    assert isinstance(error.value, FileNotFoundError)


def test_client_error_without_a_program_names_the_three_places(tmp_path, monkeypatch):
    import rlsched
    from rlsched.errors import DaemonError
    monkeypatch.delenv("RLSCHED_BIN", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(_program, "_package_dirs", lambda: [str(tmp_path / "pkg")])
    client = rlsched.Client()
    with pytest.raises(DaemonError) as error:
        client.ping()
    message = str(error.value)
    assert "RLSCHED_BIN" in message and "PATH" in message
    assert str(tmp_path / "pkg" / "bin" / "rlsched") in message
    assert "Client(binary=...)" in message
    client.close()


def test_console_script_without_a_shipped_program_exits_2(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(_program, "_package_dirs", lambda: [str(tmp_path / "pkg")])
    assert _program.main(["--version"]) == 2
    err = capsys.readouterr().err
    assert "no rlsched program" in err and "RLSCHED_PIP_PROGRAM=0" in err


def test_pip_install_ships_the_type_marker_and_the_weight_sync(installed, tmp_path):
    script = "import os, rlsched; print(os.path.dirname(rlsched.__file__))"
    where = subprocess.run([str(installed["python"]), "-c", script], cwd=tmp_path,
                           env=installed["env"], capture_output=True, text=True, timeout=120)
    assert where.returncode == 0, where.stderr
    package = where.stdout.strip()
    for name in ("py.typed", "weight_sync/executor.py", "weight_sync/layouts.py",
                 "weight_sync/launcher.py", "executor.py", "reshard_run.py"):
        assert os.path.isfile(os.path.join(package, name)), name
    show = subprocess.run([str(installed["python"]), "-m", "pip", "show", "rlsched"],
                          cwd=tmp_path, env=installed["env"], capture_output=True, text=True,
                          timeout=120)
    assert show.returncode == 0, show.stderr
    assert "Requires: protobuf" in show.stdout.splitlines()
