"""The protobuf modules generated from proto/rlsched/v1/*.proto at build time.

They are not part of this source directory: the build writes them to
``<build>/python/rlsched/v1/`` and ``rlsched/__init__.py`` adds every ``rlsched``
directory on ``sys.path`` to the package's ``__path__``, so with
``PYTHONPATH=<repo>/python:<build>/python`` they import as ``rlsched.v1.*_pb2``.
"""

from __future__ import annotations

from rlsched.errors import MissingDependencyError

try:
    from rlsched.v1 import balance_pb2, reshard_pb2, orchestrator_pb2, service_pb2
except ImportError as error:  # pragma: no cover - depends on the environment
    raise MissingDependencyError(
        "rlsched: the generated protobuf modules "
        "rlsched.v1.{balance,reshard,orchestrator,service}_pb2 "
        "were not found. Build the project (they are generated into "
        "<build>/python/rlsched/v1/) and put <build>/python on PYTHONPATH next to "
        "<repo>/python; they need the protobuf runtime (Debian: python3-protobuf). "
        f"Original error: {error}") from error

__all__ = ["balance_pb2", "reshard_pb2", "orchestrator_pb2", "service_pb2"]
