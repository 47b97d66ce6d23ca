"""Deprecated: the executor is :mod:`rlsched.weight_sync.executor`. Importing this path
warns and gives that module; it goes in a later release."""

import sys

from rlsched._deprecated import warn_moved
from rlsched.weight_sync import executor

warn_moved("rlsched.executor", "rlsched.weight_sync.executor")
sys.modules[__name__] = executor
