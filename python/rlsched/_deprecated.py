"""The package's old module paths, kept for a release after their modules moved."""

import sys
import warnings


def _importing(frame) -> bool:
    """Whether `frame` is the import machinery's (importlib, frozen or not)."""
    return frame.f_globals.get("__name__", "").startswith("importlib")


def _bootstrap(frame) -> bool:
    """Whether warnings.warn skips `frame` when it counts `stacklevel` (its rule)."""
    name = frame.f_code.co_filename
    return "importlib" in name and "_bootstrap" in name


def warn_moved(old: str, new: str) -> None:
    """Warns (DeprecationWarning) that module `old` is now `new`. Called by the module at
    `old`: the warning points at the line that imported it (past the import machinery),
    or at the module itself when it runs as ``python3 -m``."""
    level, frame = 2, sys._getframe(1)
    if frame.f_globals.get("__name__") != "__main__":
        frame = frame.f_back
        while frame is not None and _importing(frame):
            level += not _bootstrap(frame)
            frame = frame.f_back
        level += 1
    warnings.warn(f"{old} is deprecated and will be removed in a later release: use {new}",
                  DeprecationWarning, stacklevel=level)
