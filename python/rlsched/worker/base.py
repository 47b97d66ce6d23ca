"""The worker side of ``rlsched.v1.Scheduler/Attach`` (see the package docstring)."""

import collections
import logging
import os
import queue
import threading
import time
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import grpc

from rlsched.errors import InvalidArgumentError
from rlsched.v1 import orchestrator_pb2, runtime_pb2
from rlsched.worker.weights import SyncWeights, WeightUpdate

ATTACH_METHOD = "/rlsched.v1.Scheduler/Attach"
# Weight-sync plans kept by id (the newest ones; a sync names a recent one).
_PLANS_KEPT = 8
# A trainer's part of a large plan (every transfer) can exceed gRPC's 4 MiB default.
_CHANNEL_OPTIONS = [("grpc.max_receive_message_length", -1)]
# Refusals kept in Worker.refusals (the newest).
_REFUSALS_KEPT = 256
# Attach failures retried until welcomed: not listening yet, or the door full for now.
_RETRIED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED)
# A welcomed session lost without a Goodbye (the scheduler died, or dropped the stream):
# reattached within reattach_seconds.
_LOST = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN,
         grpc.StatusCode.INTERNAL, grpc.StatusCode.RESOURCE_EXHAUSTED)


class _Stop:
    """The end of one session's requests (a queue outlives its sessions)."""

    def __init__(self):
        self.ended = False


_log = logging.getLogger("rlsched.worker")


def env_default(value: Optional[str], name: str) -> str:
    """`value`, or when None the environment variable `name` (default "")."""
    return value if value is not None else os.environ.get(name, "")


def open_channel(address: str, tls_ca: str = "", tls_server_name: str = "") -> grpc.Channel:
    """A channel to the scheduler at `address` (``unix:PATH`` or ``HOST:PORT``):
    plaintext, or TLS trusting the PEM certificates in the file `tls_ca`, the server's
    certificate carrying `tls_server_name` when given. No limit on received messages."""
    if not tls_ca:
        return grpc.insecure_channel(address, options=_CHANNEL_OPTIONS)
    try:
        with open(tls_ca, "rb") as f:
            roots = f.read()
    except OSError as error:
        raise InvalidArgumentError(f"tls_ca (RLSCHED_TLS_CA): cannot read {tls_ca}: "
                                   f"{error.strerror}", "tls_ca") from None
    options = _CHANNEL_OPTIONS + ([("grpc.ssl_target_name_override", tls_server_name)]
                                  if tls_server_name else [])
    return grpc.secure_channel(address, grpc.ssl_channel_credentials(roots), options=options)


class Worker:
    """A connection to the scheduler: hello, then events out and commands in.

    ``token`` defaults to the environment's ``RLSCHED_WORKER_TOKEN``. With TLS (the
    scheduler runs with ``--tls-cert``), ``tls_ca`` is the PEM file of the certificates to
    trust (default: ``RLSCHED_TLS_CA``; unset: plaintext), and ``tls_server_name`` the
    name the server's certificate must carry when the address does not say it (default:
    ``RLSCHED_TLS_SERVER_NAME``; a Unix socket's is ``localhost``). Commands are
    handled on the thread that calls :meth:`run`, one at a time, in order; events may
    be sent from any thread. With ``reattach_seconds`` > 0, a welcomed session lost
    without a Goodbye (the scheduler killed and resumed, ``rlsched run --resume``) is
    attached again within that many seconds, saying what the worker holds (an engine its
    samples and weights, a trainer its last call); the events sent meanwhile go out
    then, and ``on_welcome`` is called again.
    """

    role = runtime_pb2.WORKER_ROLE_UNSPECIFIED

    def __init__(self, address: str, token: Optional[str] = None, *,
                 name: Optional[str] = None, heartbeat_seconds: float = 1.0,
                 connect_timeout_seconds: float = 30.0, reattach_seconds: float = 0.0,
                 tls_ca: Optional[str] = None, tls_server_name: Optional[str] = None):
        self.address = address
        self.token = env_default(token, "RLSCHED_WORKER_TOKEN")
        self.tls_ca = env_default(tls_ca, "RLSCHED_TLS_CA")
        self.tls_server_name = env_default(tls_server_name, "RLSCHED_TLS_SERVER_NAME")
        self.name = name or f"{os.uname().nodename}:{os.getpid()}"
        self.heartbeat_seconds = heartbeat_seconds
        self.connect_timeout_seconds = connect_timeout_seconds
        self.reattach_seconds = reattach_seconds
        self._lost_at: Optional[float] = None  # when the welcomed session was lost
        self._heartbeats_started = False
        self.welcome: Optional[runtime_pb2.Welcome] = None
        self.goodbye: Optional[str] = None
        # The weight-sync plans received (WeightSyncPlan, decoded), by plan id, and the
        # newest.
        self.weight_plans: Dict[str, WeightUpdate] = {}
        self.weight_plan: Optional[WeightUpdate] = None
        # The scheduler's refusals of this worker's events, newest last: (event, reason).
        self.refusals: "collections.deque[Tuple[orchestrator_pb2.OrchestratorEvent, str]]" = \
            collections.deque(maxlen=_REFUSALS_KEPT)
        self._out: "queue.Queue[Optional[runtime_pb2.WorkerMessage]]" = queue.Queue()
        self._done = threading.Event()

    # ---- What a subclass provides. ----

    def hello(self) -> runtime_pb2.Hello:
        return runtime_pb2.Hello(role=self.role, token=self.token, name=self.name)

    def on_welcome(self, welcome: runtime_pb2.Welcome) -> None:
        """Called before any command, and again at each reattach."""

    def on_command(self, command: orchestrator_pb2.OrchestratorCommand) -> None:
        raise NotImplementedError

    def on_weight_sync_plan(self, plan: WeightUpdate) -> None:
        """Called for each weight-sync plan received (once per plan id, before the
        command that first uses it): a new membership, so a new transfer group
        (``plan.group``). ``self.weight_plan`` is already ``plan``."""

    def on_stop(self) -> None:
        """Called when the session ends (Goodbye, or the scheduler went away)."""

    def on_refused(self, event: orchestrator_pb2.OrchestratorEvent, reason: str) -> None:
        """Called when the scheduler refused one of this worker's events (the state is
        unchanged): ``event`` as the scheduler saw it, ``reason`` naming the field and
        the bound (``"sample: must be a sample in flight on the reporting engine 3, got
        17 (...)"``). Some are races an honest worker meets (a finish crossing the
        ``abort`` of its sample); others are its errors. The default logs a warning
        (logger ``rlsched.worker``); override to raise, which ends :meth:`run` with that
        exception. ``self.refusals`` keeps the newest."""
        _log.warning("the scheduler refused %s: %s", event.WhichOneof("kind"), reason)

    def load(self) -> Tuple[int, int]:
        """``(running, waiting)`` requests, sent with every heartbeat (a trainer: zeros)."""
        return 0, 0

    def generated_tokens(self) -> Optional[int]:
        """An engine's generated-token counter (tokens decoded since it started, never
        going down), sent with every heartbeat; None: not sent. With it the scheduler
        tells a stuck engine (requests running, the counter still for ``rlsched run
        --stuck-timeout``) from a busy one, and drops it (Goodbye "stuck: ..."); without
        it the engine is not judged. Read it from the engine's own metrics (vLLM's and
        SGLang's generation-token counters)."""
        return None

    # ---- Sending. ----

    def send_event(self, **kind) -> None:
        """Sends an OrchestratorEvent with one field set, e.g. ``generation_finished=...``.
        The scheduler stamps the time."""
        self._out.put(runtime_pb2.WorkerMessage(event=orchestrator_pb2.OrchestratorEvent(**kind)))

    # ---- The session. ----

    def _requests(self, stop: _Stop):
        yield runtime_pb2.WorkerMessage(hello=self.hello())
        while True:
            message = self._out.get()
            if message is None or message is stop:
                return
            if isinstance(message, _Stop):
                continue  # an earlier session's end
            if stop.ended:  # taken after our session died: the next session's to send
                with self._out.mutex:
                    self._out.queue.appendleft(message)
                    self._out.not_empty.notify()
                return
            yield message

    def _heartbeat_interval(self) -> float:
        """The Welcome's interval once welcomed (when it gives one), else our own."""
        welcome = self.welcome
        if welcome is not None and welcome.heartbeat_seconds > 0:
            return welcome.heartbeat_seconds
        return self.heartbeat_seconds

    def _heartbeat(self) -> None:
        running, waiting = self.load()
        beat = runtime_pb2.Heartbeat(running=running, waiting=waiting)
        tokens = self.generated_tokens()
        if tokens is not None:
            beat.generated_tokens = int(tokens)
        self._out.put(runtime_pb2.WorkerMessage(heartbeat=beat))

    def _heartbeats(self) -> None:
        while not self._done.wait(self._heartbeat_interval()):
            self._heartbeat()

    def _plan(self, message: runtime_pb2.WeightSyncPlan) -> None:
        plan = WeightUpdate(message)
        self.weight_plans[plan.plan_id] = plan
        while len(self.weight_plans) > _PLANS_KEPT:
            del self.weight_plans[next(iter(self.weight_plans))]
        self.weight_plan = plan
        self.on_weight_sync_plan(plan)

    def plan_of(self, plan_id: str) -> Optional[WeightUpdate]:
        """The weight-sync plan `plan_id` names (None for ""); raises an
        InvalidArgumentError (a ValueError) for an id the scheduler never sent (a
        protocol error)."""
        if not plan_id:
            return None
        plan = self.weight_plans.get(plan_id)
        if plan is None:
            raise InvalidArgumentError(f"plan_id: {plan_id!r} names no weight-sync plan "
                                       f"received (have {sorted(self.weight_plans)})",
                                       "plan_id")
        return plan

    def _channel(self) -> grpc.Channel:
        return open_channel(self.address, self.tls_ca, self.tls_server_name)

    def run(self) -> Optional[str]:
        """Attaches and handles commands until the scheduler says Goodbye (returns its
        reason) or goes away (raises grpc.RpcError). Until welcomed it retries, with
        backoff up to ``connect_timeout_seconds``, while the scheduler is not listening
        yet or turns the stream away for now (UNAVAILABLE, RESOURCE_EXHAUSTED: its door
        is full of streams that have not said Hello); once welcomed, a lost session is
        attached again within ``reattach_seconds`` (0: not)."""
        deadline = time.monotonic() + self.connect_timeout_seconds
        delay = 0.05
        channel = self._channel()
        try:
            while True:
                try:
                    grpc.channel_ready_future(channel).result(
                        timeout=max(0.0, deadline - time.monotonic()))
                    return self._session(channel)
                except grpc.RpcError as error:
                    deadline = self._retry_deadline(error, deadline, delay)
                time.sleep(delay)
                delay = min(2 * delay, 2.0 if self._lost_at is None else 0.5)
        finally:
            self._done.set()
            self._out.put(None)
            self.on_stop()
            channel.close()

    def _retry_deadline(self, error: grpc.RpcError, deadline: float, delay: float) -> float:
        """The deadline to retry the attach by, or raises `error`."""
        now = time.monotonic()
        if self.welcome is None:  # not yet attached
            if error.code() not in _RETRIED or now + delay > deadline:
                raise error
            return deadline
        if self.reattach_seconds <= 0 or error.code() not in _LOST:
            raise error
        if self._lost_at is None:
            self._lost_at = now
        if now + delay > self._lost_at + self.reattach_seconds:
            raise error
        return self._lost_at + self.reattach_seconds

    def _session(self, channel: grpc.Channel) -> Optional[str]:
        """One Attach stream: the commands until Goodbye; raises grpc.RpcError when the
        stream fails (before a Goodbye)."""
        attach = channel.stream_stream(
            ATTACH_METHOD,
            request_serializer=runtime_pb2.WorkerMessage.SerializeToString,
            response_deserializer=runtime_pb2.SchedulerMessage.FromString)
        stop = _Stop()
        if self._lost_at is not None:
            self._drop_stale()
        try:
            for message in attach(self._requests(stop)):
                if self._handle(message):
                    break
        except grpc.RpcError:
            if self.goodbye is None:
                raise
        finally:
            stop.ended = True
            self._out.put(stop)
        return self.goodbye

    def _drop_stale(self) -> None:
        """Before an engine's reattach: the lost session's waiting messages. Its Hello says
        what it holds, and the scheduler keeps or resets it on that; the waiting reports
        spoke to the scheduler's old view (a finish sent after a reset could pass for the
        finish of the sample's next dispatch). A sample it finished meanwhile is not
        held: the scheduler gives it out again."""
        if self.role != runtime_pb2.WORKER_ROLE_ENGINE:
            return  # a trainer's finishes and filters stand (its Hello says its call)
        with self._out.mutex:
            kept = [m for m in self._out.queue if not isinstance(m, runtime_pb2.WorkerMessage)]
            self._out.queue.clear()
            self._out.queue.extend(kept)

    def _handle(self, message: runtime_pb2.SchedulerMessage) -> bool:
        """One message of the scheduler's; True for Goodbye."""
        kind = message.WhichOneof("kind")
        if kind == "welcome":
            self.welcome = message.welcome
            self._lost_at = None
            self.on_welcome(message.welcome)
            self._heartbeat()  # the first, with the load at the start
            if not self._heartbeats_started:
                self._heartbeats_started = True
                threading.Thread(target=self._heartbeats, daemon=True).start()
        elif kind == "command":
            self.on_command(message.command)
        elif kind == "weight_sync_plan":
            self._plan(message.weight_sync_plan)
        elif kind == "refused":
            self.refusals.append((message.refused.event, message.refused.reason))
            self.on_refused(message.refused.event, message.refused.reason)
        elif kind == "goodbye":
            self.goodbye = message.goodbye.reason
            return True
        return False


class _Account:
    """What the base class knows of a sample's run on this engine: where it began
    (``resume_from``), the versions its tokens came under (``[version, first_token]``
    spans: the version committed when it was dispatched or resumed), the tokens last
    reported, and its times (wall seconds)."""

    __slots__ = ("resume_from", "spans", "tokens", "paused", "exact", "started", "paused_at",
                 "paused_seconds", "interruptions")

    def __init__(self, resume_from: int, version: int, now: float):
        self.resume_from = resume_from
        self.spans: List[List[int]] = [[version, resume_from]]
        self.tokens = resume_from
        self.paused = False
        self.exact = True  # False: it ran across a weight commit without a pause
        self.started = now
        self.paused_at: Optional[float] = None
        self.paused_seconds = 0.0
        self.interruptions = 0

    def pause(self, tokens: int, now: float) -> None:
        self.tokens = max(self.tokens, tokens)
        if not self.paused:
            self.paused = True
            self.paused_at = now
            self.interruptions += 1

    def resume(self, version: int, now: float) -> None:
        if self.paused_at is not None:
            self.paused_seconds += now - self.paused_at
            self.paused_at = None
        self.paused = False
        if self.spans and self.spans[-1][1] >= self.tokens:
            self.spans.pop()  # no token of that version
        if not self.spans or self.spans[-1][0] != version:
            self.spans.append([version, self.tokens])

    def spans_to(self, tokens: int) -> List[Tuple[int, int]]:
        """The account of the tokens [resume_from, tokens): spans holding a token."""
        if not self.exact or tokens <= self.resume_from:
            return []
        return [(v, first) for v, first in self.spans if first < tokens]


def _version_spans(spans: Optional[Iterable[Sequence[int]]]) -> List[orchestrator_pb2.VersionSpan]:
    return [orchestrator_pb2.VersionSpan(version=int(v), first_token=int(first))
            for v, first in (spans or [])]


class EngineWorker(Worker):
    """An inference engine. ``engine`` is its id; ``version`` the weights it holds
    (-1: none).

    The base class keeps an account of each sample it was given (from its ``dispatch``
    to its ``finished`` or ``abort``): the reports carry the versions the sample's tokens
    were generated under (``VersionSpan``: the version committed by ``weights_loaded``
    when the sample was dispatched or resumed, switching at the token count its pause
    reported), the finish its telemetry (tokens generated, interruptions, seconds from
    dispatch to finish and paused), and the heartbeats its load (``load()``: samples
    running and paused). A sample that ran across a ``weights_loaded`` without being
    reported paused gets no account (the scheduler infers it). An engine that knows
    better (per-token versions of its own, preemptions, time to first token) passes
    ``spans`` / ``telemetry`` to the reports, or overrides ``load()``.
    """

    role = runtime_pb2.WORKER_ROLE_ENGINE

    def __init__(self, address: str, engine: int, max_concurrent: int, *,
                 version: int = -1, **kwargs):
        super().__init__(address, **kwargs)
        self.engine = engine
        self.max_concurrent = max_concurrent
        self.version = version
        self._accounts: Dict[int, _Account] = {}
        self._accounts_lock = threading.Lock()
        self._pausing = False  # an interrupting sync_weights, weights_loaded not yet
        self._pause_abort = False  # that sync's pause mode is ABORT: reported samples leave
        self._memory_released = False  # colocated: released(), weights_loaded not yet

    def hello(self) -> runtime_pb2.Hello:
        hello = super().hello()
        hello.engine = self.engine
        hello.max_concurrent = self.max_concurrent
        with self._accounts_lock:
            hello.version = self.version
            hello.samples.extend(sorted(self._accounts))  # what it holds (a reattach)
            hello.released = self._memory_released
        return hello

    def on_command(self, command: orchestrator_pb2.OrchestratorCommand) -> None:
        kind = command.WhichOneof("kind")
        message = getattr(command, kind)
        self._track(kind, message)  # before the subclass: its reports may come at once
        if kind == "sync_weights":
            self.sync_weights(SyncWeights(message, self.plan_of(message.plan_id)))
        else:
            getattr(self, kind)(message)

    def _track(self, kind: str, message) -> None:
        now = time.monotonic()
        with self._accounts_lock:
            if kind == "dispatch":
                for work in message.samples:
                    self._accounts[work.sample] = _Account(work.resume_from, self.version, now)
            elif kind == "resume":
                for sample in message.samples:
                    account = self._accounts.get(sample)
                    if account is not None:
                        account.resume(self.version, now)
            elif kind == "abort":
                for sample in message.samples:
                    self._accounts.pop(sample, None)
            elif kind == "sync_weights" and message.interrupt and not message.replan:
                self._pausing = True
                self._pause_abort = message.pause == orchestrator_pb2.PAUSE_MODE_ABORT

    def load(self) -> Tuple[int, int]:
        """``(running, waiting)``: the samples given and not finished or aborted, those
        paused for a weight sync counted as waiting."""
        with self._accounts_lock:
            waiting = sum(1 for a in self._accounts.values() if a.paused)
            return len(self._accounts) - waiting, waiting

    def _seconds(self, wall: float) -> float:
        """Wall seconds in the run's seconds (the Welcome's time_scale)."""
        scale = self.welcome.time_scale if self.welcome is not None else 0.0
        return wall / scale if scale > 0 else wall

    def _paused_spans(self, sample: int, tokens: int,
                      spans: Optional[Iterable[Sequence[int]]]
                      ) -> List[orchestrator_pb2.VersionSpan]:
        """A pause report of `sample` (the accounts' lock held)."""
        account = self._accounts.get(sample)
        if account is not None:
            account.pause(tokens, time.monotonic())
            if spans is None:
                spans = account.spans_to(tokens)
        return _version_spans(spans)

    # The commands (orchestrator.proto's messages).
    def dispatch(self, dispatch: orchestrator_pb2.Dispatch) -> None:
        raise NotImplementedError

    def abort(self, abort: orchestrator_pb2.Abort) -> None:
        raise NotImplementedError

    def sync_weights(self, sync: SyncWeights) -> None:
        """Load ``sync.version``. ``sync`` reads as the ``orchestrator_pb2.SyncWeights`` message
        (``engine``, ``version``, ``interrupt``, ``pause``, ``plan_id``, ``replan``) and
        carries ``sync.plan``: this engine's part of the weight-sync plan
        (:class:`WeightUpdate`: the transfer group, its ranks, the transfers they receive
        with names, dtypes, shapes, bytes and senders), None when the run has no weight
        layout. With ``sync.replan`` an engine was lost during the sync of
        ``sync.version`` and the group is rebuilt without it: leave the old group, join
        ``sync.plan``'s; still loading that version, load it by the new plan (one
        ``weights_loaded``, the sync's); holding it already, report nothing. A replan
        never pauses."""
        raise NotImplementedError

    def resume(self, resume: orchestrator_pb2.Resume) -> None:
        raise NotImplementedError

    def release(self, release: orchestrator_pb2.Release) -> None:
        """Colocated: free the GPU memory ``release.tags`` names (``MEMORY_TAG_WEIGHTS``,
        ``MEMORY_TAG_KV_CACHE``) for the trainer, then report ``released()``. The next
        ``sync_weights`` wakes the engine: ``sync.resume`` lists the memory to take back,
        in order (the weights' before loading the new weights into it, the KV cache
        after)."""
        raise NotImplementedError

    # The reports.
    def finished(self, sample: int, tokens: int, reward: float, *,
                 spans: Optional[Iterable[Sequence[int]]] = None,
                 telemetry: Optional[Mapping[str, float]] = None) -> None:
        """A sample finished with ``tokens`` response tokens in all. ``spans``: the
        engine's own account of the versions of its tokens since the dispatch
        (``(version, first_token)`` pairs, see ``VersionSpan``; default: the base class's
        account). ``telemetry``: ``RequestTelemetry`` fields the engine measured
        (e.g. ``preemptions``, ``first_token_seconds``), over the base class's."""
        now = time.monotonic()
        with self._accounts_lock:  # held until queued: a Hello sees it held or waiting
            account = self._accounts.pop(sample, None)
            self.__finish_report(sample, tokens, reward, account, now, spans, telemetry)

    def __finish_report(self, sample, tokens, reward, account, now, spans, telemetry) -> None:
        figures = {}
        if account is not None:
            if spans is None:
                spans = account.spans_to(tokens)
            paused = account.paused_seconds + (
                now - account.paused_at if account.paused_at is not None else 0.0)
            figures = {"generated_tokens": max(0, tokens - account.resume_from),
                       "interruptions": account.interruptions,
                       "seconds": self._seconds(now - account.started),
                       "paused_seconds": self._seconds(paused)}
        figures.update(telemetry or {})
        finished = orchestrator_pb2.GenerationFinished(sample=sample, tokens=tokens,
                                                       reward=reward, spans=_version_spans(spans))
        if figures:
            finished.telemetry.CopyFrom(orchestrator_pb2.RequestTelemetry(**figures))
        self.send_event(generation_finished=finished)

    def progressed(self, sample: int, tokens: int, *,
                   spans: Optional[Iterable[Sequence[int]]] = None) -> None:
        """One sample's progress (an older way to report a pause: one per sample)."""
        with self._accounts_lock:
            if self._pausing:
                spans = self._paused_spans(sample, tokens, spans)
                if self._pause_abort:
                    self._accounts.pop(sample, None)
            else:
                account = self._accounts.get(sample)
                if spans is None and account is not None:
                    spans = account.spans_to(tokens)
                spans = _version_spans(spans)
        self.send_event(generation_progressed=orchestrator_pb2.GenerationProgressed(
            sample=sample, tokens=tokens, spans=spans))

    def paused(self, version: int, samples: Iterable[Sequence]) -> None:
        """The pause of an interrupting ``sync_weights`` (``version``: its version),
        reported once the engine is paused and idle: ``(sample, tokens)`` for every
        sample it paused, each once (an empty list when none was left running); a third
        item, when given, is the sample's ``spans`` (see ``finished``). With the sync's
        ``pause`` ``PAUSE_MODE_ABORT`` the engine has aborted them: this is their last
        report here (after ``weights_loaded`` the scheduler dispatches them to this engine
        again, each from ``resume_from`` = its tokens)."""
        progress = []
        with self._accounts_lock:
            for item in samples:
                sample, tokens = int(item[0]), int(item[1])
                spans = self._paused_spans(sample, tokens, item[2] if len(item) > 2 else None)
                if self._pause_abort:
                    self._accounts.pop(sample, None)
                progress.append(orchestrator_pb2.SampleProgress(sample=sample, tokens=tokens,
                                                                spans=spans))
        self.send_event(generation_paused=orchestrator_pb2.GenerationPaused(
            engine=self.engine, version=version, samples=progress))

    def weights_loaded(self, version: int) -> None:
        """The weights of ``version`` are committed: the tokens generated from now on
        are of that version (the accounts' spans say so from the next resume or
        dispatch on)."""
        with self._accounts_lock:
            if version != self.version:
                for account in self._accounts.values():
                    if not account.paused:
                        account.exact = False  # ran across the commit: no account
            self.version = version
            self._pausing = False
            self._pause_abort = False
            self._memory_released = False
        self.send_event(weights_loaded=orchestrator_pb2.WeightsLoaded(
            engine=self.engine, version=version))

    def released(self) -> None:
        with self._accounts_lock:
            self._memory_released = True  # said again in the Hello of a reattach
        self.send_event(engine_released=orchestrator_pb2.EngineReleased(engine=self.engine))


class TrainerWorker(Worker):
    """The trainer: one call at a time (``start_train``), then ``step_finished``. With a
    weight layout, ``on_weight_sync_plan`` receives the senders' part of each plan (every
    trainer rank's transfers) when a sync first uses it and when the trainer attaches;
    ``weight_plan`` is the newest."""

    role = runtime_pb2.WORKER_ROLE_TRAINER

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._call: Optional[runtime_pb2.TrainCall] = None  # the last call given
        self._call_lock = threading.Lock()

    def hello(self) -> runtime_pb2.Hello:
        hello = super().hello()
        with self._call_lock:
            if self._call is not None:
                hello.call.CopyFrom(self._call)  # a reattach: what became of it
        return hello

    def on_command(self, command: orchestrator_pb2.OrchestratorCommand) -> None:
        if command.WhichOneof("kind") == "start_train":
            call = command.start_train
            with self._call_lock:
                self._call = runtime_pb2.TrainCall(step=call.step, call=call.call)
            self.start_train(call)

    def start_train(self, call: orchestrator_pb2.StartTrain) -> None:
        raise NotImplementedError

    def step_finished(self, step: int, call: int) -> None:
        with self._call_lock:
            if self._call is not None and (self._call.step, self._call.call) == (step, call):
                self._call.finished = True
        self.send_event(
            train_step_finished=orchestrator_pb2.TrainStepFinished(step=step, call=call))

    def filtered(self, group: int) -> None:
        self.send_event(group_filtered=orchestrator_pb2.GroupFiltered(group=group))
