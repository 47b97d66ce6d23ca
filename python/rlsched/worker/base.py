"""The worker side of ``rlsched.v1.Scheduler/Attach`` (see the package docstring)."""

import os
import queue
import threading
import time
from typing import Iterable, Optional, Tuple

import grpc

from rlsched.v1 import rollout_pb2, runtime_pb2

ATTACH_METHOD = "/rlsched.v1.Scheduler/Attach"


class Worker:
    """A connection to the scheduler: hello, then events out and commands in.

    ``token`` defaults to the environment's ``RLSCHED_WORKER_TOKEN``. With TLS (the
    scheduler runs with ``--tls-cert``), ``tls_ca`` is the PEM file of the certificates to
    trust (default: ``RLSCHED_TLS_CA``; unset: plaintext), and ``tls_server_name`` the
    name the server's certificate must carry when the address does not say it (default:
    ``RLSCHED_TLS_SERVER_NAME``; a Unix socket's is ``localhost``). Commands are
    handled on the thread that calls :meth:`run`, one at a time, in order; events may
    be sent from any thread.
    """

    role = runtime_pb2.WORKER_ROLE_UNSPECIFIED

    def __init__(self, address: str, token: Optional[str] = None, *,
                 name: Optional[str] = None, heartbeat_seconds: float = 1.0,
                 connect_timeout_seconds: float = 30.0, tls_ca: Optional[str] = None,
                 tls_server_name: Optional[str] = None):
        self.address = address
        self.token = token if token is not None else os.environ.get("RLSCHED_WORKER_TOKEN", "")
        self.tls_ca = tls_ca if tls_ca is not None else os.environ.get("RLSCHED_TLS_CA", "")
        self.tls_server_name = (tls_server_name if tls_server_name is not None
                                else os.environ.get("RLSCHED_TLS_SERVER_NAME", ""))
        self.name = name or f"{os.uname().nodename}:{os.getpid()}"
        self.heartbeat_seconds = heartbeat_seconds
        self.connect_timeout_seconds = connect_timeout_seconds
        self.welcome: Optional[runtime_pb2.Welcome] = None
        self.goodbye: Optional[str] = None
        self._out: "queue.Queue[Optional[runtime_pb2.WorkerMessage]]" = queue.Queue()
        self._done = threading.Event()

    # ---- What a subclass provides. ----

    def hello(self) -> runtime_pb2.Hello:
        return runtime_pb2.Hello(role=self.role, token=self.token, name=self.name)

    def on_welcome(self, welcome: runtime_pb2.Welcome) -> None:
        """Called once, before any command."""

    def on_command(self, command: rollout_pb2.OrchestratorCommand) -> None:
        raise NotImplementedError

    def on_stop(self) -> None:
        """Called when the session ends (Goodbye, or the scheduler went away)."""

    # ---- Sending. ----

    def send_event(self, **kind) -> None:
        """Sends an OrchestratorEvent with one field set, e.g. ``generation_finished=...``.
        The scheduler stamps the time."""
        self._out.put(runtime_pb2.WorkerMessage(event=rollout_pb2.OrchestratorEvent(**kind)))

    # ---- The session. ----

    def _requests(self):
        yield runtime_pb2.WorkerMessage(hello=self.hello())
        while True:
            message = self._out.get()
            if message is None:
                return
            yield message

    def _heartbeats(self) -> None:
        while not self._done.wait(self.heartbeat_seconds):
            self._out.put(runtime_pb2.WorkerMessage(heartbeat=runtime_pb2.Heartbeat()))

    def _channel(self) -> grpc.Channel:
        if not self.tls_ca:
            return grpc.insecure_channel(self.address)
        try:
            with open(self.tls_ca, "rb") as f:
                roots = f.read()
        except OSError as error:
            raise ValueError(f"tls_ca (RLSCHED_TLS_CA): cannot read {self.tls_ca}: "
                             f"{error.strerror}") from None
        options = ([("grpc.ssl_target_name_override", self.tls_server_name)]
                   if self.tls_server_name else [])
        return grpc.secure_channel(self.address, grpc.ssl_channel_credentials(roots),
                                   options=options)

    def run(self) -> Optional[str]:
        """Attaches and handles commands until the scheduler says Goodbye (returns its
        reason) or goes away (raises grpc.RpcError). Retries while the scheduler is
        not listening yet, up to ``connect_timeout_seconds``."""
        deadline = time.monotonic() + self.connect_timeout_seconds
        channel = self._channel()
        try:
            grpc.channel_ready_future(channel).result(
                timeout=max(0.0, deadline - time.monotonic()))
            attach = channel.stream_stream(
                ATTACH_METHOD,
                request_serializer=runtime_pb2.WorkerMessage.SerializeToString,
                response_deserializer=runtime_pb2.SchedulerMessage.FromString)
            heartbeat = threading.Thread(target=self._heartbeats, daemon=True)
            heartbeat.start()
            try:
                for message in attach(self._requests()):
                    kind = message.WhichOneof("kind")
                    if kind == "welcome":
                        self.welcome = message.welcome
                        self.on_welcome(message.welcome)
                    elif kind == "command":
                        self.on_command(message.command)
                    elif kind == "goodbye":
                        self.goodbye = message.goodbye.reason
                        break
            except grpc.RpcError:
                if self.goodbye is None:
                    raise
            finally:
                self._done.set()
                self._out.put(None)
                self.on_stop()
            return self.goodbye
        finally:
            channel.close()


class EngineWorker(Worker):
    """An inference engine. ``engine`` is its id; ``version`` the weights it holds
    (-1: none)."""

    role = runtime_pb2.WORKER_ROLE_ENGINE

    def __init__(self, address: str, engine: int, max_concurrent: int, *,
                 version: int = -1, **kwargs):
        super().__init__(address, **kwargs)
        self.engine = engine
        self.max_concurrent = max_concurrent
        self.version = version

    def hello(self) -> runtime_pb2.Hello:
        hello = super().hello()
        hello.engine = self.engine
        hello.max_concurrent = self.max_concurrent
        hello.version = self.version
        return hello

    def on_command(self, command: rollout_pb2.OrchestratorCommand) -> None:
        kind = command.WhichOneof("kind")
        getattr(self, kind)(getattr(command, kind))

    # The commands (rollout.proto's messages).
    def dispatch(self, dispatch: rollout_pb2.Dispatch) -> None:
        raise NotImplementedError

    def abort(self, abort: rollout_pb2.Abort) -> None:
        raise NotImplementedError

    def sync_weights(self, sync: rollout_pb2.SyncWeights) -> None:
        raise NotImplementedError

    def resume(self, resume: rollout_pb2.Resume) -> None:
        raise NotImplementedError

    def release(self, release: rollout_pb2.Release) -> None:
        raise NotImplementedError

    # The reports.
    def finished(self, sample: int, tokens: int, reward: float) -> None:
        self.send_event(generation_finished=rollout_pb2.GenerationFinished(
            sample=sample, tokens=tokens, reward=reward))

    def progressed(self, sample: int, tokens: int) -> None:
        """One sample's progress (an older way to report a pause: one per sample)."""
        self.send_event(generation_progressed=rollout_pb2.GenerationProgressed(
            sample=sample, tokens=tokens))

    def paused(self, version: int, samples: Iterable[Tuple[int, int]]) -> None:
        """The pause of an interrupting ``sync_weights`` (``version``: its version),
        reported once the engine is paused and idle: ``(sample, tokens)`` for every
        sample it paused, each once (an empty list when none was left running)."""
        self.send_event(generation_paused=rollout_pb2.GenerationPaused(
            engine=self.engine, version=version,
            samples=[rollout_pb2.SampleProgress(sample=sample, tokens=tokens)
                     for sample, tokens in samples]))

    def weights_loaded(self, version: int) -> None:
        self.version = version
        self.send_event(weights_loaded=rollout_pb2.WeightsLoaded(
            engine=self.engine, version=version))

    def released(self) -> None:
        self.send_event(engine_released=rollout_pb2.EngineReleased(engine=self.engine))


class TrainerWorker(Worker):
    """The trainer: one call at a time (``start_train``), then ``step_finished``."""

    role = runtime_pb2.WORKER_ROLE_TRAINER

    def on_command(self, command: rollout_pb2.OrchestratorCommand) -> None:
        if command.WhichOneof("kind") == "start_train":
            self.start_train(command.start_train)

    def start_train(self, call: rollout_pb2.StartTrain) -> None:
        raise NotImplementedError

    def step_finished(self, step: int, call: int) -> None:
        self.send_event(train_step_finished=rollout_pb2.TrainStepFinished(step=step, call=call))

    def filtered(self, group: int) -> None:
        self.send_event(group_filtered=rollout_pb2.GroupFiltered(group=group))
