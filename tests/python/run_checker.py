"""CTest's entry to a checker of the Python sources: ``run_checker.py MODULE ARGS...``
runs ``python3 -m MODULE ARGS`` from the repository's root (where .flake8 and
pyproject.toml configure flake8 and mypy), or exits with status 77 (CTest: skipped)
when the interpreter lacks MODULE (Debian: python3-flake8, mypy; scripts/setup.sh
installs them)."""

import importlib.util
import os
import subprocess
import sys

_DEBIAN_PACKAGES = {"flake8": "python3-flake8", "mypy": "mypy"}
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv):
    module, args = argv[0], argv[1:]
    if importlib.util.find_spec(module) is None:
        print(f"skipped: {sys.executable} lacks {module} "
              f"(apt-get install {_DEBIAN_PACKAGES.get(module, module)})")
        return 77
    return subprocess.call([sys.executable, "-m", module, *args], cwd=_REPO)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
