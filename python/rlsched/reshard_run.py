"""Deprecated: the launcher is :mod:`rlsched.weight_sync.launcher` (``python3 -m
rlsched.weight_sync.launcher``). Importing this path, or running it with ``python3 -m
rlsched.reshard_run``, warns and gives (runs) that module; it goes in a later release."""

import sys

from rlsched._deprecated import warn_moved
from rlsched.weight_sync import launcher

warn_moved("rlsched.reshard_run", "rlsched.weight_sync.launcher")
if __name__ == "__main__":
    sys.exit(launcher.main())
sys.modules[__name__] = launcher
