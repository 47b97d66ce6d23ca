"""The README's commands run as written, and it names what the program offers.

Every fenced shell command of README.md that starts with `build/rlsched` runs (with the
built program, from a scratch directory, the repository's `tests/data` paths made
absolute) and exits 0; every Python block that opens with the `# PYTHONPATH=` line
runs from the repository root. The usage block lists every subcommand of
`rlsched --help`, and the daemon's paragraph every request kind of `serve --help`.
"""

import os
import re
import subprocess
import sys

import pytest

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_README = os.path.join(_REPO, "README.md")


def _blocks(language):
    with open(_README, encoding="utf-8") as f:
        text = f.read()
    return re.findall(r"```" + language + r"\n(.*?)```", text, flags=re.S)


def _commands():
    commands = []
    for block in _blocks("sh"):
        lines = block.splitlines()
        i = 0
        while i < len(lines):
            line = lines[i]
            while line.endswith("\\") and i + 1 < len(lines):
                i += 1
                line = line[:-1] + " " + lines[i].strip()
            i += 1
            if line.startswith("build/rlsched"):
                commands.append(line)
    return commands


COMMANDS = _commands()


def test_the_readme_has_commands():
    assert len(COMMANDS) >= 8, COMMANDS


@pytest.mark.parametrize("command", COMMANDS)
def test_command_runs(command, rlsched_bin, tmp_path):
    line = command.replace("build/rlsched", rlsched_bin, 1)
    line = line.replace(" tests/data/", " " + os.path.join(_REPO, "tests", "data") + "/")
    result = subprocess.run(line, shell=True, cwd=tmp_path, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, f"{command}\n{result.stderr[-2000:]}"
    assert result.stdout.strip(), command


PYTHON_BLOCKS = [b for b in _blocks("python") if b.startswith("# PYTHONPATH=")]


def test_the_readme_has_python_blocks():
    assert len(PYTHON_BLOCKS) >= 2


@pytest.mark.parametrize("index", range(len(PYTHON_BLOCKS)))
def test_python_block_runs(index, rlsched_bin):
    env = os.environ.copy()  # the block runs from the repository root: absolute paths
    env["PYTHONPATH"] = os.pathsep.join(
        os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)
    result = subprocess.run([sys.executable, "-c", PYTHON_BLOCKS[index]], cwd=_REPO,
                            capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, f"{PYTHON_BLOCKS[index]}\n{result.stderr[-2000:]}"


def _help(*args):
    return subprocess.run([os.environ["RLSCHED_BIN"], *args, "--help"], capture_output=True,
                          text=True, check=True).stdout


def test_usage_block_lists_every_subcommand(rlsched_bin):
    help_text = _help()
    subcommands = re.findall(r"^  ([a-z][a-z-]+)\s", help_text.split("SUBCOMMANDS:")[-1],
                             flags=re.M)
    assert {"balance", "plan-step", "serve", "reshard", "simulate"} <= set(subcommands)
    usage = next(b for b in _blocks("text") if b.startswith("rlsched balance"))
    for name in subcommands:
        assert f"rlsched {name} " in usage, name


def test_daemon_paragraph_names_every_request_kind(rlsched_bin):
    from rlsched.v1 import service_pb2  # generated module

    kinds = [f.name for f in service_pb2.Request.DESCRIPTOR.oneofs_by_name["kind"].fields]
    with open(_README, encoding="utf-8") as f:
        text = f.read()
    paragraph = text[text.index("`rlsched serve` answers"):][:600]
    for kind in kinds:
        assert f"`{kind}`" in paragraph, kind
    serve_help = _help("serve")
    for kind in kinds:
        assert kind in serve_help, kind
