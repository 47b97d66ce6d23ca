"""A :class:`~rlsched.Client` that answers in this process instead of a daemon.

:class:`InProcessClient` has every method of :class:`rlsched.Client` (``balance``,
``plan_step``, ``plan_micro_batches``, ``get_seqlen_balanced_partitions``,
``reshard``, ``simulate``, ``calibrate``, ``ping``) with the same arguments and results: it builds
the same ``rlsched.v1.Request`` and hands it, serialized, to the native module's
``solve()``, which answers it with the daemon's own code (``rlsched::wire::Solve``,
rlsched/wire/solve.h) while the GIL is released. So every option the daemon takes
works in process too: the attention cost model, ``raw=True``, resharding plans and
simulations. Error replies raise the same exceptions as the daemon's
(:class:`~rlsched.InvalidArgumentError` naming the request field).

It needs the native module built with the wire library (``rlsched._native.HAS_WIRE``:
CMake with ``RLSCHED_BUILD_WIRE``, the default, or ``pip install``);
:func:`available` says whether it is. Unlike the daemon, a call has no deadline (the
daemon's ``--request-timeout``); the work limits of the requests are the same.

Thread-safety: calls from several threads run side by side (the solver releases the
GIL); the client holds no state beyond the request ids.
"""

from __future__ import annotations

import itertools
import threading

from rlsched._proto import service_pb2
from rlsched.client import Client, _error_from_reply
from rlsched.errors import CLIENT_CLOSED, DaemonError, MissingDependencyError

__all__ = ["InProcessClient", "available"]

try:
    import rlsched._native as _native
except ImportError:  # not built, or built for another interpreter
    _native = None


def available() -> bool:
    """Whether the native module has the wire library (solve() and Orchestrator)."""
    return _native is not None and bool(getattr(_native, "HAS_WIRE", False))


class InProcessClient(Client):
    """:class:`rlsched.Client`'s methods answered by ``rlsched._native.solve``.

    Raises ImportError at construction when the native module lacks the wire library
    (see :func:`available`)."""

    def __init__(self) -> None:
        if not available():
            raise MissingDependencyError(
                "rlsched._native was built without the wire library (HAS_WIRE is False or "
                "the module is missing): build with RLSCHED_BUILD_WIRE=ON or pip install")
        # No daemon: none of Client's process state.
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._closed = False
        self._proc = None
        self._restarts = 0

    def __del__(self) -> None:
        pass

    def close(self) -> None:
        """Later calls raise :class:`~rlsched.DaemonError` (``CLIENT_CLOSED``), as a
        closed :class:`~rlsched.Client`'s. Idempotent."""
        self._closed = True

    @property
    def binary(self) -> str:
        return "rlsched._native"

    def call(self, request: service_pb2.Request) -> service_pb2.Reply:
        """Answers `request` (its id is replaced by a fresh one) as the daemon does;
        raises :class:`~rlsched.RlschedError` for an error reply."""
        if self._closed:
            raise DaemonError(CLIENT_CLOSED, "the client is closed")
        with self._lock:
            request.id = str(next(self._ids))
        reply = service_pb2.Reply.FromString(_native.solve(request.SerializeToString()))
        if reply.WhichOneof("kind") == "error":
            raise _error_from_reply(reply.error)
        return reply
