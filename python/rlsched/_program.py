"""Where the ``rlsched`` program is: the one lookup every part of the package uses.

:func:`find_program` looks, in this order, at

1. the ``RLSCHED_BIN`` environment variable,
2. the program shipped inside the package (``rlsched/bin/rlsched``, which ``pip install``
   builds when the program's C++ packages are present, see setup.py),
3. ``rlsched`` on ``PATH`` (not the package's own ``rlsched`` console script, which only
   runs the shipped program),

and raises :class:`ProgramNotFoundError` naming all three when none has it.

:func:`main` is the ``rlsched`` console script that pip installs: it runs the shipped
program with the same arguments (``os.execv``, so the exit status is the program's);
without a shipped program it says so and exits with status 2.
"""

import errno
import os
import shutil
import sys
from typing import Iterable, Optional

from rlsched.errors import PROGRAM_NOT_FOUND, RlschedError

# The program inside the package, relative to a directory of the package's __path__.
SHIPPED_RELATIVE = os.path.join("bin", "rlsched")
# What the console script's file holds (pip's launcher imports this module's main).
_CONSOLE_SCRIPT_MARK = b"rlsched._program"


class ProgramNotFoundError(RlschedError, FileNotFoundError):
    """No ``rlsched`` program in any of the places :func:`find_program` looks. Also a
    :class:`FileNotFoundError`."""

    def __init__(self, message: str) -> None:
        super().__init__(PROGRAM_NOT_FOUND, message, "")
        self.errno, self.strerror = errno.ENOENT, message

    def __reduce__(self):
        return (type(self), (self.message,))


def _package_dirs() -> list:
    import rlsched
    return list(getattr(rlsched, "__path__", []))


def shipped_program(package_dirs: Optional[Iterable[str]] = None) -> Optional[str]:
    """The executable ``bin/rlsched`` in a directory of the package (the installed
    package, or an editable install's ``build-python/editable/rlsched/``), else None."""
    for directory in (_package_dirs() if package_dirs is None else package_dirs):
        candidate = os.path.join(directory, SHIPPED_RELATIVE)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def _is_console_script(path: str) -> bool:
    # pip's console script is a small Python file that imports this module; running it
    # as the daemon would only run the shipped program again (or fail).
    try:
        with open(path, "rb") as script:
            head = script.read(4096)
    except OSError:
        return False
    return head.startswith(b"#!") and _CONSOLE_SCRIPT_MARK in head


def _on_path(path: Optional[str]) -> Optional[str]:
    search = os.environ.get("PATH", os.defpath) if path is None else path
    for directory in search.split(os.pathsep):
        found = shutil.which("rlsched", path=directory or os.curdir)
        if found and not _is_console_script(found):
            return found
    return None


def find_program(package_dirs: Optional[Iterable[str]] = None,
                 path: Optional[str] = None) -> str:
    """The ``rlsched`` program to run: ``$RLSCHED_BIN``, else the program shipped with
    the package, else ``rlsched`` on ``PATH`` (`path` overrides ``$PATH``,
    `package_dirs` the package's directories; both for tests).

    Raises:
        ProgramNotFoundError: none of the three has it; the message names all three.
    """
    from_env = os.environ.get("RLSCHED_BIN")
    if from_env:
        return from_env
    shipped = shipped_program(package_dirs)
    if shipped:
        return shipped
    found = _on_path(path)
    if found:
        return found
    dirs = _package_dirs() if package_dirs is None else list(package_dirs)
    places = ", ".join(os.path.join(d, SHIPPED_RELATIVE) for d in dirs) or "(no package dir)"
    raise ProgramNotFoundError(
        "rlsched program not found: RLSCHED_BIN is not set, no program is shipped with "
        f"the package (looked for {places}; `pip install` builds it when the program's "
        "C++ packages are present, see setup.py), and there is no rlsched on PATH")


def main(argv: Optional[list] = None) -> int:
    """The ``rlsched`` console script: runs the shipped program with these arguments."""
    args = sys.argv[1:] if argv is None else list(argv)
    program = shipped_program()
    if program is None:
        print("rlsched: this installation of the Python package has no rlsched program "
              "(pip built it without: the program's C++ packages were missing, or "
              "RLSCHED_PIP_PROGRAM=0). Install them (Debian: libgrpc++-dev "
              "protobuf-compiler-grpc libtbb-dev libspdlog-dev libcli11-dev) and run pip "
              "install again, or build the program with CMake and set RLSCHED_BIN.",
              file=sys.stderr)
        return 2
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(program, [program, *args])
    return 2  # not reached


if __name__ == "__main__":
    sys.exit(main())
