"""Deprecated: ``rlsched.v1.rollout_pb2`` is ``rlsched.v1.orchestrator_pb2``.

``rollout.proto`` held the orchestrator's and the simulator's contract while ``rollout``
in C++ is the weight resharding; it is now ``orchestrator.proto`` (the same package,
messages, field numbers and wire format). Importing this path warns and gives the new
module; it goes in a later release. proto/CMakeLists.txt and setup.py copy this file
beside the generated modules.
"""

import sys

from rlsched._deprecated import warn_moved
from rlsched.v1 import orchestrator_pb2

warn_moved("rlsched.v1.rollout_pb2", "rlsched.v1.orchestrator_pb2")
sys.modules[__name__] = orchestrator_pb2
