"""The package's old module paths, kept for a release after their modules moved."""

import sys
import warnings
from types import FrameType


def _importing(frame) -> bool:
    """Whether `frame` is the import machinery's (importlib, frozen or not)."""
    return frame.f_globals.get("__name__", "").startswith("importlib")


def _bootstrap(frame) -> bool:
    """Whether warnings.warn skips `frame` when it counts `stacklevel` (its rule)."""
    name = frame.f_code.co_filename
    return "importlib" in name and "_bootstrap" in name


def _importer_level(module: FrameType) -> int:
    """The ``stacklevel`` of the line importing `module` (a module's frame), for
    warnings.warn called by a function `module` calls; `module` itself when it runs as
    ``python3 -m``."""
    if module.f_globals.get("__name__") == "__main__":
        return 2
    level, frame = 3, module.f_back
    while frame is not None and _importing(frame):
        level += not _bootstrap(frame)
        frame = frame.f_back
    return level


def warn_moved(old: str, new: str) -> None:
    """Warns (DeprecationWarning) that module `old` is now `new`. Called by the module at
    `old`: the warning points at the line that imported it (past the import machinery),
    or at the module itself when it runs as ``python3 -m``."""
    warnings.warn(f"{old} is deprecated and will be removed in a later release: use {new}",
                  DeprecationWarning, stacklevel=_importer_level(sys._getframe(1)))
