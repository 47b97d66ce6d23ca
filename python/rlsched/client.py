"""A client of ``rlsched serve``: one daemon subprocess, reused across calls.

The daemon reads ``rlsched.v1.Request`` messages on its stdin and writes one
``rlsched.v1.Reply`` per request on its stdout, in request order, each framed as a
varint length prefix followed by the serialised message (protobuf's delimited
format). A :class:`Client` starts the daemon on its first call and keeps it.

Thread-safety: a :class:`Client` may be shared by threads; a lock covers the write
of one request and the read of its reply, so calls are serialised. Every request
carries a fresh id and the reply's id is checked.

Failures: a daemon found dead before a call is restarted; one that dies during a
call (killed, crashed) is restarted and the request sent once more. If anything
else interrupts a call half-way (a timeout, ``KeyboardInterrupt``), the stream can
no longer be trusted: the daemon is killed and the next call starts a new one.
Error replies become :class:`~rlsched.errors.RlschedError` (or
:class:`~rlsched.errors.InvalidArgumentError`, a ``ValueError``, for
``ERROR_CODE_INVALID_ARGUMENT``).

After ``os.fork()`` the child does not use the parent's daemon (the pipes are
shared); it starts its own on its first call.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import select
import subprocess
import threading
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any, Optional, Union

from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message

from rlsched._program import ProgramNotFoundError, find_program
from rlsched._proto import balance_pb2, reshard_pb2, orchestrator_pb2, service_pb2
from rlsched.errors import (CLIENT_CLOSED, DAEMON_DIED, DAEMON_TIMEOUT,
                            DAEMON_UNAVAILABLE, PROTOCOL_ERROR, DaemonError,
                            InvalidArgumentError, RlschedError, plain_message)

__all__ = [
    "Client",
    "Part",
    "BalanceResult",
    "MicroBatch",
    "RankPlan",
    "BaselinePlan",
    "StepPlan",
]

# A protobuf message is at most 2 GiB; a longer length prefix means a broken stream.
_MAX_FRAME = (1 << 31) - 1
_READ_CHUNK = 1 << 16
_CLOSE_WAIT_SECONDS = 5.0
# A call's default time limit: the daemon stops a request after its --request-timeout
# (60 s by default) and answers DEADLINE_EXCEEDED; this leaves room for the frames.
DEFAULT_TIMEOUT_SECONDS = 120.0
# reshard's bucket budget: at most 2^40 bytes (the daemon's bound), in MiB.
_MAX_BUCKET_MIB = 1 << 20
# Short names of target dtypes, as the CLI's --target-dtype takes them.
_DTYPE_ALIASES = {"fp8": "fp8_block128"}


# ----------------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class Part:
    """One part of a balance: indices into the request's lengths (ascending), the
    sum of their lengths and of their costs."""
    indices: list[int]
    tokens: int
    cost: int


@dataclass(frozen=True)
class BalanceResult:
    """The answer to :meth:`Client.balance` (mirrors ``rlsched.v1.BalanceReply``)."""
    parts: list[Part]
    max_cost: int
    min_cost: int
    lower_bound: int
    gap: float
    proven_optimal: bool

    @property
    def partitions(self) -> list[list[int]]:
        """The indices of each part."""
        return [part.indices for part in self.parts]

    @classmethod
    def from_proto(cls, reply: balance_pb2.BalanceReply) -> "BalanceResult":
        return cls(parts=[Part(list(p.indices), p.tokens, p.cost) for p in reply.parts],
                   max_cost=reply.max_cost, min_cost=reply.min_cost,
                   lower_bound=reply.lower_bound, gap=reply.gap,
                   proven_optimal=reply.proven_optimal)


@dataclass(frozen=True)
class MicroBatch:
    """One micro-batch: indices into the request's lengths (ascending), padded
    tokens, cost, and unpadded tokens (the sum of its lengths)."""
    indices: list[int]
    tokens: int
    cost: int
    unpadded_tokens: int


@dataclass(frozen=True)
class RankPlan:
    """One rank's micro-batches in execution order, its padded tokens, cost,
    predicted time, sequences and unpadded tokens."""
    micro_batches: list[MicroBatch]
    tokens: int
    cost: int
    time: int
    sequences: int
    unpadded_tokens: int


@dataclass(frozen=True)
class BaselinePlan:
    """verl's recipe on the same input (its workload key, its micro-batch count and
    order), scored with rlsched's cost model; ``cap_violations`` counts its micro-batches
    over the token cap."""
    predicted_step_time: int
    cap_violations: int
    micro_batches: int
    empty_micro_batches: int


@dataclass(frozen=True)
class StepPlan:
    """The answer to :meth:`Client.plan_step` (mirrors ``rlsched.v1.PlanStepReply``).

    For a token-mean loss that does not change with the split, divide each
    micro-batch's summed per-token loss by ``unpadded_tokens`` (the step's), times
    the data-parallel size when the gradients are averaged across ranks; not by the
    micro-batch's own tokens. ``empty_micro_batches`` and ``empty_ranks`` are 0
    unless the input forces them (fewer sequences than ranks × micro-batches);
    ``oversized`` counts the sequences above the cap, each alone in its micro-batch
    (``oversize="alone"``)."""
    ranks: list[RankPlan]
    micro_batches: int
    predicted_step_time: int
    lower_bound: int
    baseline: BaselinePlan
    overhead: int
    sequences: int
    tokens: int
    unpadded_tokens: int
    empty_micro_batches: int
    empty_ranks: int
    oversized: int = 0

    @classmethod
    def from_proto(cls, reply: balance_pb2.PlanStepReply) -> "StepPlan":
        ranks = [RankPlan([MicroBatch(list(m.indices), m.tokens, m.cost, m.unpadded_tokens)
                           for m in r.micro_batches], r.tokens, r.cost, r.time,
                          r.sequences, r.unpadded_tokens)
                 for r in reply.ranks]
        b = reply.baseline
        return cls(ranks=ranks, micro_batches=reply.micro_batches,
                   predicted_step_time=reply.predicted_step_time,
                   lower_bound=reply.lower_bound,
                   baseline=BaselinePlan(b.predicted_step_time, b.cap_violations,
                                         b.micro_batches, b.empty_micro_batches),
                   overhead=reply.overhead, sequences=reply.sequences,
                   tokens=reply.tokens, unpadded_tokens=reply.unpadded_tokens,
                   empty_micro_batches=reply.empty_micro_batches,
                   empty_ranks=reply.empty_ranks, oversized=reply.oversized)


# ----------------------------------------------------------------------------------
# Argument conversion

CostArg = Union[None, str, Mapping[str, Any], balance_pb2.CostModel]


def _as_int_list(values: Any) -> list:
    """`values` as a list of Python ints (numpy arrays and tensors via tolist())."""
    if hasattr(values, "tolist"):
        values = values.tolist()
    elif not isinstance(values, list):
        values = list(values)
    return values


def _extend_int64(field, values: list, name: str) -> None:
    try:
        field.extend(values)
    except TypeError:
        # Not all ints (e.g. floats): integral floats are accepted, others refused.
        converted = []
        for i, value in enumerate(values):
            try:
                as_int = int(value)
            except (TypeError, ValueError, OverflowError):
                raise InvalidArgumentError(
                    f"{name}[{i}]: must be an integer, got {value!r}", f"{name}[{i}]")
            if as_int != value:
                raise InvalidArgumentError(
                    f"{name}[{i}]: must be an integer, got {value!r}", f"{name}[{i}]")
            converted.append(as_int)
        field.extend(converted)
    except ValueError as error:  # out of the int64 range
        raise InvalidArgumentError(f"{name}: {error}", name) from None


def _enum(enum_type, prefix: str, value: Any, field: str) -> int:
    """An enum value from an int, its full name or its short name (any case)."""
    if value is None:
        return 0
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        name = value.upper()
        for candidate in (name, prefix + name):
            if candidate in enum_type.keys():
                return enum_type.Value(candidate)
    raise InvalidArgumentError(
        f"{field}: unknown value {value!r}; one of "
        f"{', '.join(n[len(prefix):].lower() for n in enum_type.keys()[1:])}", field)


def _cost_model(cost: CostArg, field: str = "cost") -> Optional[balance_pb2.CostModel]:
    """A CostModel from None, a CostModel, a kind name ("tokens", "attention") or a
    mapping in protobuf's JSON form (e.g. {"kind": "attention", "model": {...}})."""
    if cost is None:
        return None
    if isinstance(cost, balance_pb2.CostModel):
        return cost
    if isinstance(cost, str):
        return balance_pb2.CostModel(
            kind=_enum(balance_pb2.CostKind, "COST_KIND_", cost, field + ".kind"))
    if isinstance(cost, Mapping):
        data = dict(cost)
        if isinstance(data.get("kind"), str):
            data["kind"] = _enum(balance_pb2.CostKind, "COST_KIND_", data["kind"],
                                 field + ".kind")
        try:
            return json_format.ParseDict(data, balance_pb2.CostModel())
        except json_format.ParseError as error:
            raise InvalidArgumentError(f"{field}: {error}", field) from None
    raise InvalidArgumentError(
        f"{field}: expected None, a kind name, a mapping or a rlsched.v1.CostModel, "
        f"got {type(cost).__name__}", field)


def _fill_simulator_config(message: Any, config: Any, field: str) -> None:
    """`config` (None, a SimulatorConfig or its mapping, the mode and staleness policy
    also by short name) into `message`; errors name `field`."""
    if isinstance(config, Mapping):
        config = dict(config)
        orchestrator = config.get("orchestrator")
        if isinstance(orchestrator, Mapping):
            orchestrator = dict(orchestrator)
            for name, enum, prefix in (
                    ("mode", orchestrator_pb2.OrchestratorMode, "ORCHESTRATOR_MODE_"),
                    ("staleness_policy", orchestrator_pb2.StalenessPolicy,
                     "STALENESS_POLICY_")):
                if isinstance(orchestrator.get(name), str):
                    orchestrator[name] = _enum(enum, prefix, orchestrator[name],
                                               f"{field}.orchestrator.{name}")
            config["orchestrator"] = orchestrator
    _fill_message(message, config, field)


def _fill_message(message: Message, value: Any, field: str, enums=()) -> None:
    """Fills `message` from None, a message of its type, or a mapping in protobuf's
    JSON form; `enums` lists (key, enum type, prefix) whose string values may be
    short names ("round_robin")."""
    if value is None:
        return
    if isinstance(value, type(message)):
        message.CopyFrom(value)
        return
    if not isinstance(value, Mapping):
        raise InvalidArgumentError(
            f"{field}: expected a mapping or a {message.DESCRIPTOR.full_name}, got "
            f"{type(value).__name__}", field)
    data = dict(value)
    for key, enum_type, prefix in enums:
        if isinstance(data.get(key), str):
            data[key] = _enum(enum_type, prefix, data[key], f"{field}.{key}")
    try:
        json_format.ParseDict(data, message)
    except json_format.ParseError as error:
        raise InvalidArgumentError(f"{field}: {error}", field) from None


def _aliased(name: str, value: Any, alias: str, alias_value: Any) -> Any:
    """The value of argument `name`, given under its name or under its older alias
    (None: not given); both given is an error naming the two."""
    if value is not None and alias_value is not None:
        raise InvalidArgumentError(
            f"{name}: given twice, as {name} and as its alias {alias}; give one", name)
    return value if value is not None else alias_value


def _named(error: InvalidArgumentError, names: Mapping[str, str]) -> InvalidArgumentError:
    """A daemon error on a request field in the client's terms: the argument that set
    the field, then the field ("max_token_len (plan_step.max_tokens_per_micro_batch):
    must be >= 1, got 0"); `names` maps fields to arguments. Other errors unchanged."""
    argument = names.get(error.field)
    if argument is None:
        # A sequence above the cap names the cap by its argument too.
        if error.field.startswith("plan_step.lengths") and \
                "max_tokens_per_micro_batch" in error.message:
            return InvalidArgumentError(
                error.message.replace("max_tokens_per_micro_batch", "max_token_len"),
                error.field, error.code)
        return error
    relative = error.field.split(".", 1)[-1]
    message = error.message
    if message.startswith(relative + ": "):
        message = message[len(relative) + 2:]
    return InvalidArgumentError(f"{argument} ({error.field}): {message}", error.field,
                                error.code)


# The Python arguments of the request fields whose names differ (verl's and
# Megatron's names; the CLI's flags are the same words).
_BALANCE_NAMES = {"balance.num_parts": "num_ranks"}
_PLAN_STEP_NAMES = {
    "plan_step.max_tokens_per_micro_batch": "max_token_len",
    "plan_step.pipeline_stages": "pipeline_model_parallel_size",
}


ModelArg = Union[None, str, "os.PathLike[str]", Mapping[str, Any]]


# The most bytes of a config.json read (the daemon's bound, wire::kMaxModelConfigBytes).
_MAX_MODEL_CONFIG_BYTES = 1 << 20


def _model_config_json(model: ModelArg) -> str:
    """The text of a Hugging Face config.json from a path (the file, or the model's
    folder holding it), its text (a str that opens with "{"), the parsed config (a
    mapping) or an object with ``to_dict()`` (a transformers config)."""
    to_dict = getattr(model, "to_dict", None)
    if to_dict is not None and not isinstance(model, Mapping):
        model = to_dict()
    if isinstance(model, Mapping):
        try:
            return json.dumps(dict(model), allow_nan=False,
                              default=lambda v: v.item() if hasattr(v, "item") else str(v))
        except ValueError as error:
            raise InvalidArgumentError(f"model: {error}", "model") from None
    if isinstance(model, str) and model.lstrip().startswith("{"):
        return model
    if not isinstance(model, (str, os.PathLike)):
        raise InvalidArgumentError(
            f"model: expected a config.json path, a model folder, its text or a mapping, got "
            f"{type(model).__name__}", "model")
    path = os.fspath(model)
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_MODEL_CONFIG_BYTES + 1)
    except OSError as error:
        raise InvalidArgumentError(f"model: {path}: {error.strerror}", "model") from None
    if len(data) > _MAX_MODEL_CONFIG_BYTES:
        raise InvalidArgumentError(
            f"model: {path}: larger than {_MAX_MODEL_CONFIG_BYTES} bytes", "model")
    if not data.strip():
        raise InvalidArgumentError(f"model: {path}: an empty file, not a config.json", "model")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidArgumentError(f"model: {path}: not UTF-8 text", "model") from None


def _fill_common(message, lengths, groups, cost, refine_iterations, model=None) -> None:
    _extend_int64(message.lengths, _as_int_list(lengths), "lengths")
    if groups is not None:
        _extend_int64(message.groups, _as_int_list(groups), "groups")
    if model is not None:
        if cost not in (None, "attention"):
            raise InvalidArgumentError("model: cannot be combined with a cost model (cost=)",
                                       "model")
        message.cost.kind = balance_pb2.COST_KIND_ATTENTION
        message.cost.model_config_json = _model_config_json(model)
    cost_model = None if model is not None else _cost_model(cost)
    if cost_model is not None:
        message.cost.CopyFrom(cost_model)
    if refine_iterations is not None:
        message.refine_iterations = refine_iterations


# ----------------------------------------------------------------------------------
# Process bookkeeping: atexit and fork

_live_clients: "weakref.WeakSet[Client]" = weakref.WeakSet()


def _close_all_clients() -> None:
    for client in list(_live_clients):
        try:
            client.close()
        except Exception:  # pragma: no cover - best effort at exit
            pass


def _forget_all_daemons_in_child() -> None:
    for client in list(_live_clients):
        client._after_fork_in_child()


atexit.register(_close_all_clients)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_all_daemons_in_child)


class _Gone(Exception):
    """The daemon went away during a call (broken pipe or EOF)."""


def _fileno(pipe: Optional[IO[bytes]]) -> int:
    """The descriptor of one of the daemon's pipes (the client starts it with both)."""
    assert pipe is not None, "the daemon is started with its stdin and stdout piped"
    return pipe.fileno()


def _close(pipe: Optional[IO[bytes]]) -> None:
    if pipe is not None:
        pipe.close()


# ----------------------------------------------------------------------------------
# The client


class Client:
    """One ``rlsched serve`` subprocess, started on first use and reused.

    Args:
        binary: the ``rlsched`` program; default: :func:`rlsched.find_program` (the
            ``RLSCHED_BIN`` environment variable, else the program shipped with the
            package, else ``rlsched`` on ``PATH``).
        args: extra arguments after ``serve`` (e.g. ``["--log-level", "warn"]``).
        timeout: seconds one call may take (write + solve + read); default
            ``DEFAULT_TIMEOUT_SECONDS`` (120 s, above the daemon's own 60 s
            ``--request-timeout``, after which it answers ``DEADLINE_EXCEEDED``);
            ``None`` waits forever. On a timeout the daemon is killed and
            :class:`DaemonError` raised; the next call starts anew.
        stderr: where the daemon's logs go (as for ``subprocess.Popen``); default:
            this process's stderr.
        env: the daemon's environment (default: this process's).

    Use it as a context manager or call :meth:`close`; clients still open at
    interpreter exit are closed by an ``atexit`` hook.
    """

    def __init__(self, binary: Optional[Union[str, os.PathLike]] = None, *,
                 args: Sequence[str] = (), timeout: Optional[float] = DEFAULT_TIMEOUT_SECONDS,
                 stderr: Any = None, env: Optional[Mapping[str, str]] = None) -> None:
        self._binary = os.fspath(binary) if binary is not None else None
        self._args = list(args)
        self._timeout = timeout
        self._stderr = stderr
        self._env = dict(env) if env is not None else None
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._proc: Optional[subprocess.Popen] = None
        self._rbuf = bytearray()
        self._owner_pid = os.getpid()
        self._closed = False
        self._restarts = 0
        _live_clients.add(self)

    # -- lifetime -------------------------------------------------------------------

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def close(self) -> None:
        """Ends the daemon (EOF on its stdin, then a kill if it does not exit within
        a few seconds). Later calls raise :class:`DaemonError` (``CLIENT_CLOSED``).
        Idempotent."""
        with self._lock:
            self._closed = True
            proc, self._proc = self._proc, None
            self._rbuf.clear()
            if proc is None or self._owner_pid != os.getpid():
                return
            # EOF on its input ends the daemon with status 0; its output stays open
            # until it has exited (a closed output would be an error for it).
            try:
                _close(proc.stdin)
            except OSError:
                pass
            try:
                proc.wait(timeout=_CLOSE_WAIT_SECONDS)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            finally:
                _close(proc.stdout)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def pid(self) -> Optional[int]:
        """The daemon's process id, or None before the first call / after close()."""
        proc = self._proc
        return proc.pid if proc is not None else None

    @property
    def restarts(self) -> int:
        """How many times a dead daemon was replaced."""
        return self._restarts

    @property
    def binary(self) -> str:
        """The program the client starts (resolved as described in the class)."""
        return self._resolve_binary()

    def _after_fork_in_child(self) -> None:
        # The parent's daemon and lock belong to the parent: drop them without
        # touching the process; the child starts its own daemon when it needs one.
        self._lock = threading.Lock()
        proc, self._proc = self._proc, None
        self._rbuf = bytearray()
        self._owner_pid = os.getpid()
        if proc is not None:
            for stream in (proc.stdin, proc.stdout):
                try:
                    _close(stream)
                except OSError:
                    pass
            proc.returncode = -1  # never wait for the parent's child

    def _resolve_binary(self) -> str:
        if self._binary:
            return self._binary
        try:
            return find_program()
        except ProgramNotFoundError as error:
            raise DaemonError(DAEMON_UNAVAILABLE,
                              f"{plain_message(error)}; or pass Client(binary=...)") from error

    def _start(self) -> subprocess.Popen:
        binary = self._resolve_binary()
        try:
            proc = subprocess.Popen([binary, "serve", *self._args],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=self._stderr, env=self._env, bufsize=0,
                                    close_fds=True)
        except OSError as error:
            raise DaemonError(DAEMON_UNAVAILABLE,
                              f"cannot start {binary!r} serve: {error}") from error
        self._rbuf.clear()
        return proc

    def _discard(self, proc: subprocess.Popen) -> None:
        """Kills the daemon (if it still runs), reaps it and forgets it."""
        if self._proc is proc:
            self._proc = None
        self._rbuf.clear()
        for stream in (proc.stdin, proc.stdout):
            try:
                _close(stream)
            except OSError:
                pass
        if proc.poll() is None:
            try:
                proc.kill()
            except OSError:
                pass
        try:
            proc.wait(timeout=_CLOSE_WAIT_SECONDS)
        except subprocess.TimeoutExpired:  # pragma: no cover - unkillable
            pass

    def _ensure_started(self) -> subprocess.Popen:
        proc = self._proc
        if proc is not None and proc.poll() is not None:
            self._discard(proc)
            self._restarts += 1
            proc = None
        if proc is None:
            proc = self._proc = self._start()
        return proc

    # -- framing --------------------------------------------------------------------

    @staticmethod
    def _remaining(deadline: Optional[float]) -> Optional[float]:
        if deadline is None:
            return None
        left = deadline - time.monotonic()
        if left <= 0:
            raise DaemonError(DAEMON_TIMEOUT, "no reply from rlsched serve in time")
        return left

    def _write(self, proc: subprocess.Popen, data: bytes,
               deadline: Optional[float]) -> None:
        fd = _fileno(proc.stdin)
        view = memoryview(data)
        try:
            while view:
                if deadline is not None:
                    _, ready, _ = select.select([], [fd], [], self._remaining(deadline))
                    if not ready:
                        continue
                written = os.write(fd, view)
                view = view[written:]
        except (BrokenPipeError, ConnectionResetError) as error:
            raise _Gone(f"writing the request: {error}") from error

    def _fill(self, fd: int, want: int, deadline: Optional[float]) -> None:
        """Reads until the buffer holds at least `want` bytes."""
        buf = self._rbuf
        while len(buf) < want:
            if deadline is not None:
                ready, _, _ = select.select([fd], [], [], self._remaining(deadline))
                if not ready:
                    continue
            try:
                chunk = os.read(fd, max(_READ_CHUNK, min(want - len(buf), 1 << 24)))
            except ConnectionResetError as error:
                raise _Gone(f"reading the reply: {error}") from error
            if not chunk:
                raise _Gone("reading the reply: end of stream")
            buf += chunk

    def _read_frame(self, proc: subprocess.Popen, deadline: Optional[float]) -> bytes:
        fd = _fileno(proc.stdout)
        buf = self._rbuf
        size = 0
        shift = 0
        pos = 0
        while True:  # the varint length prefix
            if pos >= len(buf):
                self._fill(fd, pos + 1, deadline)
            byte = buf[pos]
            pos += 1
            size |= (byte & 0x7F) << shift
            if not byte & 0x80:
                break
            shift += 7
            if shift >= 64:
                raise DaemonError(PROTOCOL_ERROR, "malformed reply length prefix")
        if size > _MAX_FRAME:
            raise DaemonError(PROTOCOL_ERROR, f"reply length prefix {size} is too big")
        end = pos + size
        if len(buf) < end:
            self._fill(fd, end, deadline)
        frame = bytes(buf[pos:end])
        del buf[:end]
        return frame

    def _read_salvage(self, proc: subprocess.Popen) -> bytes:
        """After a broken pipe: the reply the daemon wrote before exiting, if any
        (waits a few seconds at most); else raises _Gone."""
        try:
            return self._read_frame(proc, time.monotonic() + _CLOSE_WAIT_SECONDS)
        except DaemonError as error:
            raise _Gone(f"writing the request: broken pipe ({error.message})") from None

    # -- calls ----------------------------------------------------------------------

    def call(self, request: service_pb2.Request) -> service_pb2.Reply:
        """Sends `request` (its id is replaced by a fresh one) and returns the reply.
        Raises :class:`RlschedError` for an error reply."""
        reply = self._exchange(request)
        if reply.WhichOneof("kind") == "error":
            raise _error_from_reply(reply.error)
        return reply

    def _exchange(self, request: service_pb2.Request) -> service_pb2.Reply:
        with self._lock:
            if self._closed:
                raise DaemonError(CLIENT_CLOSED, "the client is closed")
            if self._owner_pid != os.getpid():  # pragma: no cover - fork hook missed
                self._after_fork_in_child()
            deadline = (time.monotonic() + self._timeout
                        if self._timeout is not None else None)
            for attempt in (1, 2):
                proc = self._ensure_started()
                request_id = str(next(self._ids))
                request.id = request_id
                payload = request.SerializeToString()
                data = _varint(len(payload)) + payload
                try:
                    try:
                        self._write(proc, data, deadline)
                    except _Gone:
                        # The daemon stopped reading; it may have said why first
                        # (e.g. a BAD_FRAME reply to a request above its cap).
                        frame = self._read_salvage(proc)
                    else:
                        frame = self._read_frame(proc, deadline)
                except _Gone as gone:
                    self._discard(proc)
                    self._restarts += 1
                    if attempt == 1:
                        continue
                    raise DaemonError(
                        DAEMON_DIED,
                        f"rlsched serve died twice during one call ({gone}; exit "
                        f"status {proc.returncode})") from None
                except BaseException:
                    # Timeout, interrupt, protocol error: the stream is out of step.
                    self._discard(proc)
                    raise
                return self._check_reply(proc, frame, request_id)
        raise AssertionError("unreachable")  # pragma: no cover

    def _check_reply(self, proc: subprocess.Popen, frame: bytes,
                     request_id: str) -> service_pb2.Reply:
        reply = service_pb2.Reply()
        try:
            reply.ParseFromString(frame)
        except DecodeError as error:
            self._discard(proc)
            raise DaemonError(PROTOCOL_ERROR, f"unparsable reply: {error}") from None
        if reply.id != request_id:
            self._discard(proc)
            if not reply.id and reply.WhichOneof("kind") == "error":
                # The daemon could not read the request (e.g. above its
                # --max-message-bytes); it exits after such a reply.
                raise _error_from_reply(reply.error)
            raise DaemonError(PROTOCOL_ERROR,
                              f"reply id {reply.id!r} does not match request id "
                              f"{request_id!r}")
        return reply

    def ping(self) -> str:
        """Checks the daemon is alive; returns its version."""
        request = service_pb2.Request()
        request.ping.SetInParent()
        return self.call(request).pong.version

    def balance(self, lengths: Iterable[int], num_ranks: Optional[int] = None, *,
                groups: Optional[Iterable[int]] = None, equal_size: bool = False,
                keep_groups: bool = False, cost: CostArg = None,
                algorithm: Union[None, int, str] = None,
                refine_iterations: Optional[int] = None,
                num_parts: Optional[int] = None, model: ModelArg = None,
                raw: bool = False) -> Union[BalanceResult, balance_pb2.BalanceReply]:
        """Splits sequences of the given lengths into `num_ranks` parts (the
        data-parallel size; field ``num_parts``, also accepted under that name), the
        heaviest as light as possible (``rlsched.v1.BalanceRequest``; see
        balance.proto for every field). `cost`: None (tokens), "tokens", "attention" with a mapping
        such as ``{"kind": "attention", "model": {"hidden_size": 4096, ...}}``, or
        a ``rlsched.v1.CostModel``. `model`: a Hugging Face config.json (its path, the
        model's folder, or the parsed mapping), the attention cost of its architecture
        (not with `cost`). `algorithm`: None, "karmarkar_karp", "greedy".
        Returns a :class:`BalanceResult`, or the ``BalanceReply`` with ``raw=True``.
        """
        num_ranks = _aliased("num_ranks", num_ranks, "num_parts", num_parts)
        if num_ranks is None:
            raise InvalidArgumentError("num_ranks: required (the number of parts)", "num_ranks")
        request = service_pb2.Request()
        message = request.balance
        _fill_common(message, lengths, groups, cost, refine_iterations, model)
        message.num_parts = num_ranks
        message.equal_size = equal_size
        message.keep_groups = keep_groups
        message.algorithm = _enum(balance_pb2.Algorithm, "ALGORITHM_", algorithm,
                                  "balance.algorithm")
        try:
            reply = self.call(request).balance
        except InvalidArgumentError as error:
            raise _named(error, _BALANCE_NAMES) from None
        return reply if raw else BalanceResult.from_proto(reply)

    def plan_step(self, lengths: Iterable[int], *, num_ranks: int,
                  max_token_len: Optional[int] = None,
                  groups: Optional[Iterable[int]] = None, equal_size: bool = False,
                  keep_groups: bool = False, min_micro_batches: int = 0,
                  micro_batches_multiple_of: int = 0, pad_to_multiple_of: int = 0,
                  pipeline_model_parallel_size: Optional[int] = None,
                  overhead: Optional[int] = None,
                  cost: CostArg = None, order: Union[None, int, str] = None,
                  refine_iterations: Optional[int] = None,
                  count_tolerance: Optional[float] = None,
                  max_tokens_per_micro_batch: Optional[int] = None,
                  pipeline_stages: Optional[int] = None,
                  oversize: Union[None, int, str] = None, model: ModelArg = None,
                  baseline: bool = True,
                  raw: bool = False) -> Union[StepPlan, balance_pb2.PlanStepReply]:
        """Plans a whole step (``rlsched.v1.PlanStepRequest``): sequences to
        `num_ranks` ranks (the data-parallel size) and each rank's into micro-batches
        of at most `max_token_len` (padded) tokens, the same count on every rank.
        The names are the CLI's flags: `max_token_len` is verl's token cap per GPU
        (field ``max_tokens_per_micro_batch``, also accepted under that name);
        `pipeline_model_parallel_size` is Megatron's (field ``pipeline_stages``, also
        accepted; None or 0: 1); `min_micro_batches`, `micro_batches_multiple_of`,
        `pad_to_multiple_of`: 0 means 1.
        `overhead`: the cost of one micro-batch launch in cost units; None estimates
        it from the cost model's shape (about 190 tokens for an 8B model; the reply's
        ``overhead``). `count_tolerance`: None (0.01). `order`: None (pipeline),
        "pipeline", "heaviest_first". `oversize`: what a sequence longer than the cap
        does, None or "raise" (an error naming it), "alone" (a micro-batch of its own).
        `model`: a Hugging Face config.json (its path, the model's folder, or the
        parsed mapping), the attention cost of its architecture (not with `cost`).
        `baseline`: False leaves out the common recipe's figures (the reply's
        ``baseline`` zero), about a quarter of the time.
        Returns a :class:`StepPlan`, or the ``PlanStepReply`` with ``raw=True``."""
        max_token_len, pipeline_model_parallel_size = _plan_step_sizes(
            max_token_len, max_tokens_per_micro_batch, pipeline_model_parallel_size,
            pipeline_stages)
        _check_step_ints(num_ranks=num_ranks, min_micro_batches=min_micro_batches,
                         micro_batches_multiple_of=micro_batches_multiple_of,
                         pad_to_multiple_of=pad_to_multiple_of, overhead=overhead,
                         refine_iterations=refine_iterations)
        request = service_pb2.Request()
        message = request.plan_step
        _fill_common(message, lengths, groups, cost, refine_iterations, model)
        message.num_ranks = num_ranks
        message.max_tokens_per_micro_batch = max_token_len
        message.equal_size = equal_size
        message.keep_groups = keep_groups
        message.min_micro_batches = min_micro_batches
        message.micro_batches_multiple_of = micro_batches_multiple_of
        message.pad_to_multiple_of = pad_to_multiple_of
        message.pipeline_stages = pipeline_model_parallel_size or 0
        if overhead is not None:
            message.overhead = overhead
        if count_tolerance is not None:
            message.count_tolerance = count_tolerance
        message.order = _enum(balance_pb2.MicroBatchOrder, "MICRO_BATCH_ORDER_", order,
                              "plan_step.order")
        message.oversize = _enum(balance_pb2.OversizePolicy, "OVERSIZE_POLICY_", oversize,
                                 "plan_step.oversize")
        message.skip_baseline = not baseline
        try:
            reply = self.call(request).plan_step
        except InvalidArgumentError as error:
            raise _named(error, _PLAN_STEP_NAMES) from None
        return reply if raw else StepPlan.from_proto(reply)

    def plan_micro_batches(self, lengths: Iterable[int],
                           max_token_len: Optional[int] = None, *,
                           min_micro_batches: int = 0,
                           micro_batches_multiple_of: int = 0,
                           pad_to_multiple_of: int = 0,
                           pipeline_model_parallel_size: Optional[int] = None,
                           overhead: Optional[int] = None, cost: CostArg = None,
                           order: Union[None, int, str] = None,
                           groups: Optional[Iterable[int]] = None,
                           keep_groups: bool = False,
                           refine_iterations: Optional[int] = None,
                           max_tokens_per_micro_batch: Optional[int] = None,
                           pipeline_stages: Optional[int] = None,
                           oversize: Union[None, int, str] = None, model: ModelArg = None,
                           count_tolerance: Optional[float] = None) -> list[list[int]]:
        """One rank's micro-batches: :meth:`plan_step` with ``num_ranks=1`` (the
        same arguments and aliases). Returns the micro-batches in execution order,
        each a list of ascending indices into `lengths`; none holds more than
        `max_token_len` (padded) tokens, but for a sequence above it alone with
        ``oversize="alone"``.
        """
        plan = self.plan_step(
            lengths, num_ranks=1, max_token_len=max_token_len,
            max_tokens_per_micro_batch=max_tokens_per_micro_batch,
            groups=groups, keep_groups=keep_groups,
            min_micro_batches=min_micro_batches,
            micro_batches_multiple_of=micro_batches_multiple_of,
            pad_to_multiple_of=pad_to_multiple_of,
            pipeline_model_parallel_size=pipeline_model_parallel_size,
            pipeline_stages=pipeline_stages,
            overhead=overhead, cost=cost, order=order,
            refine_iterations=refine_iterations, oversize=oversize, model=model,
            count_tolerance=count_tolerance, baseline=False, raw=True)
        return [list(m.indices) for m in plan.ranks[0].micro_batches]

    def reshard(self, model_config_json: Union[str, bytes, Mapping[str, Any]], *,
                train: Union[Mapping[str, Any], reshard_pb2.TrainLayout],
                infer: Union[Mapping[str, Any], reshard_pb2.InferLayout],
                topology: Union[None, Mapping[str, Any], reshard_pb2.Topology] = None,
                bucket_mib: Optional[int] = None, include_transfers: bool = False,
                target_dtype: Union[None, int, str] = None,
                bucket_bytes: Optional[int] = None,
                raw: bool = False) -> reshard_pb2.ReshardPlan:
        """Plans the weight transfer after a train step from the trainer's layout
        (Megatron-core) to the inference engines' layout (vLLM)
        (``rlsched.v1.ReshardRequest``; see reshard.proto for every field).

        `model_config_json`: the model's Hugging Face ``config.json`` text (or a
        mapping, dumped as JSON). `train`: e.g. ``{"tp": 8, "pp": 2, "dp": 4}`` (keys
        tp, pp, vpp, ep, etp, cp, dp, layers_per_chunk; unset sizes are 1; pp·vpp must
        divide the layers unless ``first_stage_layers`` / ``last_stage_layers`` give
        Megatron-core's uneven split, e.g. ``{"pp": 3, "first_stage_layers": 10}``). `infer`:
        e.g. ``{"tp": 4, "replicas": 16}`` (and ``expert_parallel``,
        ``expert_placement``: "contiguous" or "round_robin"). `topology`: e.g.
        ``{"colocated": True, "gpus_per_node": 8}`` (and ``intra_node_gb_per_s``,
        ``inter_node_gb_per_s``). Each may also be the message itself.
        `bucket_mib`: the bytes a GPU may send, and receive, in one bucket, in MiB
        (2^20 bytes; the CLI's ``--bucket-mib``, verl's
        ``update_weights_bucket_megabytes``); or `bucket_bytes` in bytes (the field;
        not both); None or 0: 512 MiB. The transfers come back only with
        `include_transfers` (a large model has 10^5-10^6). `target_dtype`: None
        (bf16), "bf16" or "fp8_block128" (alias "fp8"), as the CLI's
        ``--target-dtype``.

        Returns the ``rlsched.v1.ReshardPlan`` message (`raw` is accepted for
        symmetry with the other calls; the message is returned either way). Raises
        :class:`InvalidArgumentError` naming the field (e.g. ``reshard.train.tp``).
        """
        del raw  # the plan is returned as its message either way
        request = service_pb2.Request()
        message = request.reshard
        if isinstance(model_config_json, Mapping):
            model_config_json = json.dumps(dict(model_config_json))
        elif isinstance(model_config_json, bytes):
            model_config_json = model_config_json.decode("utf-8")
        if not isinstance(model_config_json, str):
            raise InvalidArgumentError(
                "reshard.model_config_json: expected the config.json text, got "
                f"{type(model_config_json).__name__}", "reshard.model_config_json")
        message.model_config_json = model_config_json
        _fill_message(message.train, train, "reshard.train")
        _fill_message(message.infer, infer, "reshard.infer",
                      [("expert_placement", reshard_pb2.ExpertPlacement,
                        "EXPERT_PLACEMENT_")])
        _fill_message(message.topology, topology, "reshard.topology")
        if bucket_mib is not None and bucket_bytes is not None:
            raise InvalidArgumentError(
                "bucket_mib: given with bucket_bytes, the same budget in bytes; give one",
                "bucket_mib")
        if bucket_mib is not None:
            if (not isinstance(bucket_mib, int) or isinstance(bucket_mib, bool)
                    or not 0 <= bucket_mib <= _MAX_BUCKET_MIB):
                raise InvalidArgumentError(
                    f"bucket_mib: must be an integer in [0, {_MAX_BUCKET_MIB}] (0: 512), got "
                    f"{bucket_mib!r}", "bucket_mib")
            message.bucket_bytes = bucket_mib << 20
        elif bucket_bytes is not None:
            message.bucket_bytes = bucket_bytes
        message.include_transfers = include_transfers
        if isinstance(target_dtype, str) and target_dtype.lower() in _DTYPE_ALIASES:
            target_dtype = _DTYPE_ALIASES[target_dtype.lower()]
        message.target_dtype = _enum(reshard_pb2.TargetDtype, "TARGET_DTYPE_", target_dtype,
                                     "reshard.target_dtype")
        try:
            return self.call(request).reshard
        except InvalidArgumentError as error:
            if bucket_mib is not None:
                raise _named(error, {"reshard.bucket_bytes": "bucket_mib"}) from None
            raise

    def simulate(self,
                 config: Union[None, Mapping[str, Any], orchestrator_pb2.SimulatorConfig] = None,
                 *, compare: bool = False,
                 trace_run: Optional[str] = None) -> orchestrator_pb2.SimulateReply:
        """Runs the rollout/train simulator (``rlsched.v1.SimulateRequest``; see
        orchestrator.proto for every field).

        `config`: None (the default workload), a ``rlsched.v1.SimulatorConfig`` or a
        mapping in protobuf's JSON form, e.g. ``{"engines": 8, "steps": 3,
        "orchestrator": {"mode": "async", "max_staleness": 1}}`` (``mode`` may be a
        short name: sync, one_step_off, async; ``staleness_policy``: admission,
        fraction, strict). Unset fields keep the simulator's defaults; ``"trace":
        True`` returns the Chrome trace JSON in the report. Besides those:

        - ``orchestrator.staleness_fraction``: the fraction policy's alpha (verl's
          ``staleness_threshold``, a real number >= 0); without a policy or mode it
          selects async with the fraction policy.
        - ``orchestrator.train_calls_per_sync``: streaming (verl's
          ``trigger_parameter_sync_step``), trainer calls per weight sync, a divisor
          of ``prompts_per_step``.
        - ``orchestrator.colocated``: sync with engines and trainer taking turns on
          the same GPUs (selects sync); ``release_seconds`` and ``resume_seconds``
          per engine (colocated runs only).
        - ``decode_speed``: ``{"single_tokens_per_second": ..., "full_tokens_per_second":
          ...}``, an engine's decode speed alone and at full concurrency, instead of
          ``engine.decode_base_seconds`` / ``decode_per_sequence_seconds``.
        - ``train_seconds_per_step``: the trainer's mean seconds per step, instead of
          ``seconds_per_cost_unit``; ``train_call_overhead_seconds`` per trainer call.
        - ``gpus_per_engine``, ``gpus_per_trainer_rank``: the GPUs behind an engine
          and a trainer rank (for the comparison's colocated_sync run).

        A field that does not apply (e.g. ``staleness_fraction`` with mode sync) is
        refused, naming it. `compare`: run colocated sync on the same GPUs
        (``colocated_sync``, when they divide into engines and ranks), then sync,
        one_step_off and async s = 1, 2 with and without partial rollout on the same
        workload (the config then leaves the mode, max_staleness, partial_rollout,
        staleness_policy, staleness_fraction and colocated unset); `trace_run` names
        the run whose trace is kept.

        Returns the ``rlsched.v1.SimulateReply`` (``runs[i].name``, ``.config`` with
        every field set, ``.report``). Raises :class:`InvalidArgumentError` naming the
        field (e.g. ``simulate.config.engines``).
        """
        request = service_pb2.Request()
        message = request.simulate
        _fill_simulator_config(message.config, config, "simulate.config")
        message.compare = compare
        if trace_run:
            message.trace_run = trace_run
        return self.call(request).simulate

    def calibrate(self, measured: Union[Mapping[str, Any], orchestrator_pb2.MeasuredRun],
                  config: Union[None, Mapping[str, Any], orchestrator_pb2.SimulatorConfig] = None
                  ) -> orchestrator_pb2.CalibrationReport:
        """Calibrates the simulator to a measured sync run (``rlsched.v1.CalibrateRequest``;
        what ``rlsched simulate --calibrate`` does).

        `measured`: a ``rlsched.v1.MeasuredRun`` or its mapping, per step in seconds:
        ``generation_seconds`` and ``train_seconds``, and optionally ``switch_seconds``,
        ``offload_seconds``, ``other_trainer_ranks`` with ``other_train_seconds``.
        `config`: the run's cluster and workload, as :meth:`simulate` takes it (a sync
        run). Returns the ``rlsched.v1.CalibrationReport``: ``config`` fitted (for
        :meth:`simulate`), ``figures`` (each measured against simulated, with its
        residual), ``fitted`` and ``warnings``. Raises :class:`InvalidArgumentError`
        naming the field (e.g. ``calibrate.measured.train_seconds``).
        """
        request = service_pb2.Request()
        message = request.calibrate
        _fill_simulator_config(message.config, config, "calibrate.config")
        _fill_message(message.measured, measured, "calibrate.measured")
        return self.call(request).calibrate

    def get_seqlen_balanced_partitions(self, seqlen_list: Sequence[int],
                                       k_partitions: int,
                                       equal_size: bool) -> list[list[int]]:
        """Drop-in for the function of this name in RL frameworks (verl): splits
        the sequences into `k_partitions` parts of balanced total length and
        returns the parts as lists of indices into `seqlen_list`, each ascending,
        every index exactly once. With `equal_size` every part holds
        ``len(seqlen_list) // k_partitions`` sequences.

        Raises ValueError (:class:`InvalidArgumentError`) where that function
        asserts: fewer sequences than parts, `equal_size` with a length not
        divisible by `k_partitions`, or an empty part in the result; and for
        arguments the daemon rejects (e.g. a negative length, field
        ``balance.lengths[i]``).
        """
        values = _as_int_list(seqlen_list)
        n = len(values)
        k = k_partitions
        _check_partition_arguments(n, k, equal_size)
        request = service_pb2.Request()
        message = request.balance
        _extend_int64(message.lengths, values, "seqlen_list")
        message.num_parts = k
        message.equal_size = bool(equal_size)
        reply = self.call(request).balance
        partitions = [list(part.indices) for part in reply.parts]
        if len(partitions) != k:
            raise DaemonError(PROTOCOL_ERROR,
                              f"{len(partitions)} parts in the reply, expected {k}")
        total = 0
        for i, part in enumerate(partitions):
            if not part:
                raise InvalidArgumentError(f"the {i}-th partition is empty",
                                           "k_partitions")
            total += len(part)
        if total != n:
            raise DaemonError(PROTOCOL_ERROR,
                              f"{total} indices in the reply, expected {n}")
        return partitions


def _varint(value: int) -> bytes:
    """The base-128 varint encoding of a non-negative int (protobuf's)."""
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _error_from_reply(error: service_pb2.Error) -> RlschedError:
    code = service_pb2.ErrorCode.Name(error.code) if error.code in \
        service_pb2.ErrorCode.values() else str(error.code)
    if error.code == service_pb2.ERROR_CODE_INVALID_ARGUMENT:
        return InvalidArgumentError(error.message, error.field, code)
    return RlschedError(code, error.message, error.field)


# ----------------------------------------------------------------------------------
# In process: the native module rlsched._native (python/native/), when it was built

try:
    import rlsched._native as _native
except ImportError:  # not built, or built for another interpreter
    _native = None


def native_available() -> bool:
    """Whether the native module ``rlsched._native`` imports (then the module-level
    functions balance, plan_step, plan_micro_batches and get_seqlen_balanced_partitions
    solve in process instead of in the daemon; ``RLSCHED_NATIVE=0`` turns that off)."""
    return _native is not None


def _native_enum(value: Any, prefix: str) -> Optional[str]:
    """A short lowercase enum name for the native module ("" for None); None when the
    value is not a name (e.g. an int: the daemon handles it)."""
    if value is None:
        return ""
    if not isinstance(value, str):
        return None
    name = value.lower()
    return name[len(prefix):] if name.startswith(prefix) else name


def _native_solve(function, *args, **kwargs):
    try:
        return function(*args, **kwargs)
    except ValueError as error:
        if isinstance(error, InvalidArgumentError):
            raise
        raise InvalidArgumentError(str(error), getattr(error, "field", "")) from None


def _native_lengths(values: Any) -> Any:
    """Lengths for the native module: numpy arrays as they are (read in place when
    contiguous int64), other objects with tolist() (tensors) as lists."""
    if hasattr(values, "tolist") and not hasattr(values, "__array_interface__"):
        return values.tolist()
    if not hasattr(values, "__len__") and hasattr(values, "__iter__"):
        return list(values)  # a generator or iterator, as the daemon path takes it
    return values


def native_balance(lengths, num_ranks=None, *, groups=None, equal_size=False,
                   keep_groups=False, cost=None, algorithm=None, refine_iterations=None,
                   num_parts=None, model=None, raw=False):
    """:meth:`Client.balance` in process; NotImplemented for the arguments only the
    daemon takes (a cost model other than tokens, a model, an int algorithm, ``raw``)."""
    if _native is None or raw or cost not in (None, "tokens") or model is not None:
        return NotImplemented
    algorithm_name = _native_enum(algorithm, "algorithm_")
    if algorithm_name is None:
        return NotImplemented
    num_ranks = _aliased("num_ranks", num_ranks, "num_parts", num_parts)
    if num_ranks is None:
        raise InvalidArgumentError("num_ranks: required (the number of parts)", "num_ranks")
    r = _native_solve(_native.balance, _native_lengths(lengths), num_ranks,
                      equal_size=bool(equal_size),
                      groups=None if groups is None else _native_lengths(groups),
                      keep_groups=bool(keep_groups), algorithm=algorithm_name,
                      refine_iterations=refine_iterations)
    indices = r["indices"].tolist()
    offsets = r["offsets"].tolist()
    tokens = r["tokens"].tolist()
    costs = r["costs"].tolist()
    parts = [Part(indices[offsets[p]:offsets[p + 1]], tokens[p], costs[p])
             for p in range(len(costs))]
    return BalanceResult(parts=parts, max_cost=r["max_cost"], min_cost=r["min_cost"],
                         lower_bound=r["lower_bound"], gap=r["gap"],
                         proven_optimal=r["proven_optimal"])


def native_plan_step(lengths, *, num_ranks, max_token_len=None, groups=None,
                     equal_size=False, keep_groups=False, min_micro_batches=0,
                     micro_batches_multiple_of=0, pad_to_multiple_of=0,
                     pipeline_model_parallel_size=None, overhead=None, cost=None,
                     order=None, refine_iterations=None, count_tolerance=None,
                     max_tokens_per_micro_batch=None, pipeline_stages=None, oversize=None,
                     model=None, baseline=True, raw=False):
    """:meth:`Client.plan_step` in process; NotImplemented for the arguments only the
    daemon takes (a cost model other than tokens, a model, an int order or oversize,
    ``raw``)."""
    if _native is None or raw or cost not in (None, "tokens") or model is not None:
        return NotImplemented
    order_name = _native_enum(order, "micro_batch_order_")
    oversize_name = _native_enum(oversize, "oversize_policy_")
    if order_name is None or oversize_name is None:
        return NotImplemented
    max_token_len, pipeline_model_parallel_size = _plan_step_sizes(
        max_token_len, max_tokens_per_micro_batch, pipeline_model_parallel_size,
        pipeline_stages)
    _check_step_ints(num_ranks=num_ranks, min_micro_batches=min_micro_batches,
                     micro_batches_multiple_of=micro_batches_multiple_of,
                     pad_to_multiple_of=pad_to_multiple_of, overhead=overhead,
                     refine_iterations=refine_iterations)
    r = _native_solve(
        _native.plan_step, _native_lengths(lengths), num_ranks, max_token_len,
        groups=None if groups is None else _native_lengths(groups),
        equal_size=bool(equal_size), keep_groups=bool(keep_groups),
        min_micro_batches=min_micro_batches,
        micro_batches_multiple_of=micro_batches_multiple_of,
        pad_to_multiple_of=pad_to_multiple_of,
        pipeline_model_parallel_size=pipeline_model_parallel_size or 0,
        overhead=overhead, count_tolerance=count_tolerance, order=order_name,
        refine_iterations=refine_iterations, oversize=oversize_name, baseline=bool(baseline))
    ranks = [RankPlan([MicroBatch(*m) for m in micro_batches], tokens, cost_, time_,
                      sequences, unpadded)
             for micro_batches, tokens, cost_, time_, sequences, unpadded in r["ranks"]]
    b = r["baseline"]
    return StepPlan(ranks=ranks, micro_batches=r["micro_batches"],
                    predicted_step_time=r["predicted_step_time"],
                    lower_bound=r["lower_bound"],
                    baseline=BaselinePlan(b["predicted_step_time"], b["cap_violations"],
                                          b["micro_batches"], b["empty_micro_batches"]),
                    overhead=r["overhead"], sequences=r["sequences"], tokens=r["tokens"],
                    unpadded_tokens=r["unpadded_tokens"],
                    empty_micro_batches=r["empty_micro_batches"],
                    empty_ranks=r["empty_ranks"], oversized=r["oversized"])


def _plan_step_sizes(max_token_len, max_tokens_per_micro_batch, pipeline_model_parallel_size,
                     pipeline_stages):
    """plan_step's cap and pipeline size from their canonical names or aliases (the cap
    required), for the daemon and the in-process paths."""
    max_token_len = _aliased("max_token_len", max_token_len,
                             "max_tokens_per_micro_batch", max_tokens_per_micro_batch)
    if max_token_len is None:
        raise InvalidArgumentError(
            "max_token_len: required (the most tokens in one micro-batch)", "max_token_len")
    pipeline_model_parallel_size = _aliased(
        "pipeline_model_parallel_size", pipeline_model_parallel_size, "pipeline_stages",
        pipeline_stages)
    _check_step_ints(max_token_len=max_token_len,
                     pipeline_model_parallel_size=pipeline_model_parallel_size)
    return max_token_len, pipeline_model_parallel_size


_INT64 = (-(1 << 63), (1 << 63) - 1)


def _check_step_ints(**named) -> None:
    """plan_step's integer arguments, the same on both paths: an int (not a bool) that
    int64 holds, or None; else InvalidArgumentError naming the argument and the value
    (the request's own bounds are the planner's, checked after)."""
    for name, value in named.items():
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidArgumentError(f"{name}: expected an int, got {value!r}", name)
        if not _INT64[0] <= value <= _INT64[1]:
            raise InvalidArgumentError(f"{name}: {value} does not fit in int64", name)


def _check_partition_arguments(n, k, equal_size):
    """get_seqlen_balanced_partitions' own checks (where verl's function asserts)."""
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise InvalidArgumentError(f"k_partitions must be a positive int, got {k!r}",
                                   "k_partitions")
    if n < k:
        raise InvalidArgumentError(
            f"number of items:[{n}] < k_partitions:[{k}]", "k_partitions")
    if equal_size and n % k != 0:
        raise InvalidArgumentError(
            f"equal_size needs len(seqlen_list) % k_partitions == 0, got {n} % {k}",
            "equal_size")


def native_get_seqlen_balanced_partitions(seqlen_list, k_partitions, equal_size):
    """:meth:`Client.get_seqlen_balanced_partitions` in process (the same checks and
    results)."""
    values = _native_lengths(seqlen_list)
    n = len(values)
    k = k_partitions
    _check_partition_arguments(n, k, equal_size)
    partitions = _native_solve(_native.partitions, values, k, equal_size=bool(equal_size))
    for i, part in enumerate(partitions):
        if not part:
            raise InvalidArgumentError(f"the {i}-th partition is empty", "k_partitions")
    return partitions
