"""The README's commands run as written and print what it shows.

Every fenced shell command of README.md that starts with `build/rlsched` runs (with the
built program, from a scratch directory, the repository's `tests/data` paths made
absolute) and exits 0, and the ```text block after a block of them shows lines they
print; every Python block that opens with the `# PYTHONPATH=` line runs from the
repository root. (The pages under docs/ have their own test: test_docs.py.)
"""

import os
import subprocess
import sys

import pytest

from doc_blocks import REPO as _REPO, blocks, missing_lines


def _blocks(language):
    return [b.text for b in blocks("README.md") if b.language == language]


def _joined(block):
    """The block's lines, a line ending in a backslash joined with the next."""
    lines, joined, i = block.splitlines(), [], 0
    while i < len(lines):
        line = lines[i]
        while line.endswith("\\") and i + 1 < len(lines):
            i += 1
            line = line[:-1] + " " + lines[i].strip()
        i += 1
        joined.append(line)
    return joined


def _commands():
    return [line for block in _blocks("sh") for line in _joined(block)
            if line.startswith("build/rlsched")]


def _run(command, rlsched_bin, directory):
    line = command.replace("build/rlsched", rlsched_bin, 1)
    line = line.replace(" tests/data/", " " + os.path.join(_REPO, "tests", "data") + "/")
    return subprocess.run(line, shell=True, cwd=directory, capture_output=True, text=True,
                          timeout=120)


COMMANDS = _commands()


def test_the_readme_has_commands():
    assert len(COMMANDS) >= 4, COMMANDS


@pytest.mark.parametrize("command", COMMANDS)
def test_command_runs(command, rlsched_bin, tmp_path):
    result = _run(command, rlsched_bin, tmp_path)
    assert result.returncode == 0, f"{command}\n{result.stderr[-2000:]}"
    assert result.stdout.strip(), command


PYTHON_BLOCKS = [b for b in _blocks("python") if b.startswith("# PYTHONPATH=")]


def test_shown_outputs_are_printed(rlsched_bin, tmp_path):
    shown = [b for b in blocks("README.md") if b.language == "sh" and b.output is not None]
    assert len(shown) >= 4
    for block in shown:
        printed = ""
        for line in _joined(block.text):
            if line.startswith("build/rlsched"):
                printed += _run(line, rlsched_bin, tmp_path).stdout
        missing = missing_lines(block.output, printed)
        assert not missing, f"{block}: not printed: {missing}"


def test_the_readme_has_python_blocks():
    assert len(PYTHON_BLOCKS) >= 1


@pytest.mark.parametrize("index", range(len(PYTHON_BLOCKS)))
def test_python_block_runs(index, rlsched_bin):
    env = os.environ.copy()  # the block runs from the repository root: absolute paths
    env["PYTHONPATH"] = os.pathsep.join(
        os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)
    result = subprocess.run([sys.executable, "-c", PYTHON_BLOCKS[index]], cwd=_REPO,
                            capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, f"{PYTHON_BLOCKS[index]}\n{result.stderr[-2000:]}"
