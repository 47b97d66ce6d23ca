"""Exceptions raised by the rlsched client.

Every exception derives from :class:`RlschedError`, which carries

* ``code`` -- for an error reply of the daemon, the name of its
  ``rlsched.v1.ErrorCode`` (e.g. ``"ERROR_CODE_INVALID_ARGUMENT"``); for a failure
  of the client itself one of the ``DAEMON_*`` / ``PROTOCOL_ERROR`` /
  ``CLIENT_CLOSED`` strings below;
* ``message`` -- a readable message (the daemon's, verbatim, for error replies);
* ``field`` -- the request field at fault as a proto path, e.g.
  ``"balance.num_parts"``, or ``""`` when not known.
"""

from __future__ import annotations

__all__ = [
    "RlschedError",
    "InvalidArgumentError",
    "DaemonError",
    "DAEMON_UNAVAILABLE",
    "DAEMON_DIED",
    "DAEMON_TIMEOUT",
    "PROTOCOL_ERROR",
    "CLIENT_CLOSED",
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
