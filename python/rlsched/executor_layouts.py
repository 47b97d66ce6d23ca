"""Deprecated: the executor's reference layouts are :mod:`rlsched.weight_sync.layouts`.
Importing this path warns and gives that module; it goes in a later release."""

import sys

from rlsched._deprecated import warn_moved
from rlsched.weight_sync import layouts

warn_moved("rlsched.executor_layouts", "rlsched.weight_sync.layouts")
sys.modules[__name__] = layouts
