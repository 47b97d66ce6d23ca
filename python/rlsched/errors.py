"""Exceptions raised by the rlsched client.

Every exception derives from :class:`RlschedError`, which carries

* ``code`` -- for an error reply of the daemon, the name of its
  ``rlsched.v1.ErrorCode`` (e.g. ``"ERROR_CODE_INVALID_ARGUMENT"``, also the code of an
  argument the package rejects itself); for a failure of the client itself one of the
  ``DAEMON_*`` / ``PROTOCOL_ERROR`` / ``CLIENT_CLOSED`` strings below; for a failure at
  run time of the weight sync, the executor or the worker SDK, or a missing optional
  dependency or program, one of the ``*_FAILED`` / ``MISSING_DEPENDENCY`` /
  ``PROGRAM_NOT_FOUND`` strings;
* ``message`` -- a readable message (the daemon's, verbatim, for error replies);
* ``field`` -- the request field at fault as a proto path, e.g.
  ``"balance.num_parts"``, or ``""`` when not known.

Each error is also the builtin exception it stands for (an
:class:`InvalidArgumentError` is a :class:`ValueError`, the ``*Error`` of a failure at
run time a :class:`RuntimeError`, a :class:`MissingDependencyError` an
:class:`ImportError`), so that ``except ValueError`` keeps catching them. ``str()`` of
an error is ``"<code>: <message>"``, followed by ``" (field <field>)"`` when a field is
known; :func:`plain_message` gives the message alone.
"""

from __future__ import annotations

__all__ = [
    "RlschedError",
    "InvalidArgumentError",
    "DaemonError",
    "WeightSyncError",
    "ExecutorError",
    "WorkerError",
    "MissingDependencyError",
    "plain_message",
    "DAEMON_UNAVAILABLE",
    "DAEMON_DIED",
    "DAEMON_TIMEOUT",
    "PROTOCOL_ERROR",
    "CLIENT_CLOSED",
    "WEIGHT_SYNC_FAILED",
    "EXECUTOR_FAILED",
    "WORKER_FAILED",
    "MISSING_DEPENDENCY",
    "PROGRAM_NOT_FOUND",
]

#: The daemon could not be started (binary not found or not executable).
DAEMON_UNAVAILABLE = "DAEMON_UNAVAILABLE"
#: The daemon died during a call, and again during the one retry.
DAEMON_DIED = "DAEMON_DIED"
#: No reply within the client's timeout (the daemon is killed and restarted on the
#: next call).
DAEMON_TIMEOUT = "DAEMON_TIMEOUT"
#: The daemon sent something that is not a well-formed reply to the request.
PROTOCOL_ERROR = "PROTOCOL_ERROR"
#: The client was closed.
CLIENT_CLOSED = "CLIENT_CLOSED"
#: A weight sync failed or was refused (:class:`WeightSyncError`).
WEIGHT_SYNC_FAILED = "WEIGHT_SYNC_FAILED"
#: The resharding executor failed while it moved a plan's bytes (:class:`ExecutorError`).
EXECUTOR_FAILED = "EXECUTOR_FAILED"
#: A worker found a message of the scheduler it cannot follow (:class:`WorkerError`).
WORKER_FAILED = "WORKER_FAILED"
#: An optional dependency (the native module, torch, verl, ...) is not installed.
MISSING_DEPENDENCY = "MISSING_DEPENDENCY"
#: No ``rlsched`` program where :func:`rlsched.find_program` looks
#: (:class:`rlsched.ProgramNotFoundError`).
PROGRAM_NOT_FOUND = "PROGRAM_NOT_FOUND"


class RlschedError(Exception):
    """An error reply of ``rlsched serve``, or a failure to talk to it."""

    def __init__(self, code: str, message: str, field: str = "") -> None:
        self.code = code
        self.message = message
        self.field = field
        super().__init__(code, message, field)

    def __str__(self) -> str:
        where = f" (field {self.field})" if self.field else ""
        return f"{self.code}: {self.message}{where}"

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(code={self.code!r}, message={self.message!r}, "
                f"field={self.field!r})")

    def __reduce__(self):
        # Subclasses take other constructor arguments: rebuild from the fields, so
        # that the errors survive pickling (multiprocessing, Ray).
        return (_restore, (type(self), self.code, self.message, self.field))


def _restore(cls, code, message, field):
    error = cls.__new__(cls)
    RlschedError.__init__(error, code, message, field)
    return error


class InvalidArgumentError(RlschedError, ValueError):
    """An invalid argument: an ``ERROR_CODE_INVALID_ARGUMENT`` reply of the daemon, or
    an argument the client rejects before sending (then ``field`` names the Python
    argument). Also a :class:`ValueError`."""

    def __init__(self, message: str, field: str = "",
                 code: str = "ERROR_CODE_INVALID_ARGUMENT") -> None:
        super().__init__(code, message, field)


class DaemonError(RlschedError):
    """The daemon could not be started, died twice in one call, timed out, broke the
    protocol, or the client is closed (``code`` says which)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(code, message, "")


class WeightSyncError(RlschedError, RuntimeError):
    """A weight sync failed or was refused; ``field`` names what is at fault (a tensor's
    name, ``membership``, ``timeout``) when known. Also a :class:`RuntimeError`."""

    def __init__(self, message: str, field: str = "", code: str = WEIGHT_SYNC_FAILED) -> None:
        super().__init__(code, message, field)


class ExecutorError(WeightSyncError):
    """The resharding executor (:mod:`rlsched.weight_sync.executor`) or its launcher
    failed at run time: a tensor changed under it, a world lost a rank. A bad plan or
    bad tensors are an :class:`InvalidArgumentError` instead."""

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message, field, EXECUTOR_FAILED)


class WorkerError(RlschedError, RuntimeError):
    """A worker (:mod:`rlsched.worker`) cannot follow a message of the scheduler. Also a
    :class:`RuntimeError`."""

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(WORKER_FAILED, message, field)


class MissingDependencyError(RlschedError, ImportError):
    """An optional dependency of the feature called is not installed; the message says
    which and how to get it. Also an :class:`ImportError`."""

    def __init__(self, message: str) -> None:
        super().__init__(MISSING_DEPENDENCY, message, "")


def plain_message(error: BaseException) -> str:
    """The message of `error` without the code and field :class:`RlschedError` adds to
    ``str()``: for quoting an error inside another message."""
    return error.message if isinstance(error, RlschedError) else str(error)
