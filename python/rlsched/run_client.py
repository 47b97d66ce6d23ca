"""The daemon's requests answered by a live run (``rlsched run``) over its gRPC socket.

:class:`RunClient` has :class:`rlsched.Client`'s methods (``balance``, ``plan_step``,
``reshard``, ``simulate``, ``ping``…) and sends each request to the run's
``Scheduler.Call`` (proto/rlsched/v1/runtime.proto), which answers it as ``rlsched
serve`` does. A framework that already talks to the run (its workers attach there)
needs no daemon process of its own::

    from rlsched.run_client import RunClient
    with RunClient("unix:/tmp/run.sock", token="s3cret") as client:
        plan = client.plan_step(lengths, num_ranks=8, max_tokens_per_micro_batch=16384)

The token is the run's (``--token-file``; default: ``RLSCHED_WORKER_TOKEN``), sent in
the metadata key ``rlsched-token``; TLS as for the workers (``tls_ca``, default
``RLSCHED_TLS_CA``; ``tls_server_name``, default ``RLSCHED_TLS_SERVER_NAME``). Needs
``grpcio`` (Debian: ``python3-grpcio``).
"""

import itertools
import threading
from typing import Optional

import grpc

from rlsched.client import DEFAULT_TIMEOUT_SECONDS, Client, _error_from_reply
from rlsched.errors import CLIENT_CLOSED, DAEMON_TIMEOUT, DAEMON_UNAVAILABLE, DaemonError
from rlsched.v1 import service_pb2
from rlsched.worker.base import env_default, open_channel

CALL_METHOD = "/rlsched.v1.Scheduler/Call"


class RunClient(Client):
    """:class:`rlsched.Client`'s methods answered by a live run's ``Scheduler.Call``.

    Args:
        address: the run's ``--listen`` (``unix:PATH`` or ``HOST:PORT``).
        token: the run's token (default: ``RLSCHED_WORKER_TOKEN``).
        timeout: seconds one call may take (the call's deadline: a simulation past it
            is stopped by the run); ``None`` waits forever.
        tls_ca, tls_server_name: TLS, as for the workers.

    A refused token raises :class:`~rlsched.DaemonError` with code ``UNAUTHENTICATED``,
    a run that is not there ``DAEMON_UNAVAILABLE``, a call past its deadline
    ``DAEMON_TIMEOUT``; an error reply raises as :class:`rlsched.Client`'s do.
    """

    def __init__(self, address: str, token: Optional[str] = None, *,
                 timeout: Optional[float] = DEFAULT_TIMEOUT_SECONDS,
                 tls_ca: Optional[str] = None,
                 tls_server_name: Optional[str] = None) -> None:
        # No daemon: none of Client's process state.
        self.address = address
        self._token = env_default(token, "RLSCHED_WORKER_TOKEN")
        self._timeout = timeout
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._closed = False
        self._proc = None
        self._restarts = 0
        self._channel = open_channel(address, env_default(tls_ca, "RLSCHED_TLS_CA"),
                                     env_default(tls_server_name, "RLSCHED_TLS_SERVER_NAME"))
        self._call = self._channel.unary_unary(
            CALL_METHOD, request_serializer=service_pb2.Request.SerializeToString,
            response_deserializer=service_pb2.Reply.FromString)

    def __del__(self) -> None:
        pass

    def close(self) -> None:
        """Closes the channel; later calls raise :class:`~rlsched.DaemonError`
        (``CLIENT_CLOSED``). Idempotent."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._channel.close()

    @property
    def binary(self) -> str:
        return self.address

    def call(self, request: service_pb2.Request) -> service_pb2.Reply:
        """Sends `request` (its id is replaced by a fresh one) to the run and returns the
        reply; raises :class:`~rlsched.RlschedError` for an error reply."""
        with self._lock:
            if self._closed:
                raise DaemonError(CLIENT_CLOSED, "the client is closed")
            request.id = str(next(self._ids))
        try:
            reply = self._call(request, timeout=self._timeout,
                               metadata=(("rlsched-token", self._token),))
        except grpc.RpcError as error:
            code = error.code()
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise DaemonError(DAEMON_TIMEOUT, f"{self.address}: no reply within "
                                  f"{self._timeout} s") from None
            if code == grpc.StatusCode.UNAVAILABLE:
                raise DaemonError(DAEMON_UNAVAILABLE, f"{self.address}: "
                                  f"{error.details()}") from None
            raise DaemonError(code.name, f"{self.address}: {error.details()}") from None
        if reply.WhichOneof("kind") == "error":
            raise _error_from_reply(reply.error)
        return reply
