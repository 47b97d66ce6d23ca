"""The decision core in process: :class:`Orchestrator`, events in, commands out.

The rollout/train orchestrator's core (rlsched/scheduler/orchestrator.h) decides what
generates where and when the trainer runs; it has no clock, thread or I/O. A
framework's own driver loop feeds it what happened (events) and carries out what it
answers (commands)::

    import rlsched
    core = rlsched.Orchestrator({"orchestrator": {"mode": "ORCHESTRATOR_MODE_ASYNC",
                                                  "max_staleness": 1,
                                                  "prompts_per_step": 64,
                                                  "samples_per_prompt": 8},
                                 "steps": 100})
    commands = core.engine_joined(time=0.0, engine=0, max_concurrent=256)
    commands += core.prompts_available(time=0.0, prompts=[(i, 512) for i in range(128)])
    for command in commands:
        kind = command.WhichOneof("kind")       # "dispatch", "sync_weights", ...
        if kind == "dispatch":
            for work in command.dispatch.samples:   # sample, group, prompt, ...
                ...
    core.generation_finished(time=12.5, sample=3, tokens=733, reward=1.0)
    core.check_invariants()
    print(core.report().counters.trained)

Names are those of orchestrator.proto: the events are the ``kind`` fields of
``rlsched.v1.OrchestratorEvent`` (``prompts_available``, ``engine_joined``,
``engine_left``, ``engine_failed``, ``generation_progressed``, ``generation_paused``,
``generation_finished``, ``group_filtered``, ``train_step_finished``,
``weights_loaded``, ``engine_released``), each a method taking that message's fields
as keywords; the commands are ``rlsched.v1.OrchestratorCommand`` messages (``dispatch``,
``abort``, ``sync_weights``, ``resume``, ``start_train``, ``release``). The config is
a ``rlsched.v1.SimulatorConfig`` (the ``rlsched run --config`` / ``simulate --config``
file): a dict in protobuf's JSON mapping, its JSON text, or the message; unset fields
keep the defaults, and the core runs with the options ``rlsched run`` gives it
(``orchestrator.*``, ``steps``, ``orchestrator.filter_all_equal``). With
``plan_steps=True`` each ``start_train`` carries the step plan of ``step`` and
``trainer_ranks`` (``start_train.plan``, a ``PlanStepReply``), as in the simulator.
The config is validated as ``rlsched run`` validates it, its workload fields included
(``orchestrator.filter_all_equal`` needs ``all_equal_rate`` > 0, and
``step.max_tokens_per_micro_batch`` must hold the workload's longest sequence,
``lengths.max_prompt_tokens`` + ``lengths.max_tokens``). Unset event fields are
proto3's zeros: ``engine_joined`` without ``version`` holds version 0 (the initial
policy); ``version=-1`` asks the core to load weights first.

Every conversion is the C++ wire library's (rlsched/wire/orchestrator_convert.h,
simulate_convert.h): the same events give the same commands as ``rlsched run``'s core
(its event log replays against this class's). The GIL is released while the core
decides. Bad input raises :class:`~rlsched.InvalidArgumentError` (a ValueError) whose
``field`` names the config field (``"orchestrator.prompts_per_step"``) or the event's
(``"engine_joined.engine"``); the core is then unchanged. Times are seconds and may not
go backwards.

Thread-safety: an Orchestrator is not thread-safe; drive it from one thread (a call
while another thread's call is running raises RuntimeError instead of racing).
Needs ``rlsched._native`` built with the wire library (:func:`available`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Optional, Union

from rlsched._proto import orchestrator_pb2
from rlsched.errors import InvalidArgumentError, MissingDependencyError

__all__ = ["Orchestrator", "TrainedSample", "EVENT_KINDS", "available"]

try:
    import rlsched._native as _native
except ImportError:  # not built, or built for another interpreter
    _native = None

#: The event kinds, as OrchestratorEvent's oneof names them.
EVENT_KINDS = tuple(f.name for f in
                    orchestrator_pb2.OrchestratorEvent.DESCRIPTOR.oneofs_by_name["kind"].fields)

ConfigArg = Union[None, Mapping, str, bytes, "orchestrator_pb2.SimulatorConfig"]
EventArg = Union[Mapping, bytes, "orchestrator_pb2.OrchestratorEvent"]


def available() -> bool:
    """Whether the native module has the decision core (built with the wire library)."""
    return _native is not None and bool(getattr(_native, "HAS_WIRE", False))


@dataclass(frozen=True)
class TrainedSample:
    """A sample of the last ``start_train``: its response tokens and, per policy
    version that generated some of them, ``(version, first_token)`` in generation
    order."""
    sample: int
    response_tokens: int
    spans: list


def _invalid(error: ValueError) -> InvalidArgumentError:
    if isinstance(error, InvalidArgumentError):
        return error
    out = InvalidArgumentError(str(error), getattr(error, "field", ""))
    for name in ("handled", "commands"):
        if hasattr(error, name):
            setattr(out, name, getattr(error, name))
    return out


def _event_bytes(event: EventArg, field: str = "event") -> bytes:
    """`event` serialized: a message, its bytes, or a mapping {kind: {fields}}."""
    if isinstance(event, orchestrator_pb2.OrchestratorEvent):
        return event.SerializeToString()
    if isinstance(event, (bytes, bytearray, memoryview)):
        return bytes(event)
    if isinstance(event, Mapping):
        if len(event) != 1:
            raise InvalidArgumentError(
                f"{field}: must have exactly one kind (one of {', '.join(EVENT_KINDS)}), "
                f"got {sorted(event)}", field)
        (kind, fields), = event.items()
        return _make_event(kind, fields, field).SerializeToString()
    raise InvalidArgumentError(
        f"{field}: must be a rlsched.v1.OrchestratorEvent, its bytes, or a mapping "
        f"{{kind: fields}}, got {type(event).__name__}", field)


def _pairs(values: Any, names: tuple, field: str) -> list:
    """A list of mappings from pairs (a, b) or mappings, for Prompt / SampleProgress."""
    out = []
    for i, value in enumerate(values):
        if isinstance(value, Mapping):
            out.append(dict(value))
        elif isinstance(value, (tuple, list)) and len(value) == 2:
            out.append(dict(zip(names, value)))
        else:
            raise InvalidArgumentError(
                f"{field}[{i}]: must be a pair ({', '.join(names)}) or a mapping, got "
                f"{value!r}", f"{field}[{i}]")
    return out


def _make_event(kind: str, fields: Any, field: str = "event") -> orchestrator_pb2.OrchestratorEvent:
    if kind not in EVENT_KINDS:
        raise InvalidArgumentError(
            f"{field}: unknown event kind {kind!r}; one of {', '.join(EVENT_KINDS)}", field)
    if isinstance(fields, Mapping):
        fields = dict(fields)
    elif hasattr(fields, "SerializeToString"):
        return orchestrator_pb2.OrchestratorEvent(**{kind: fields})
    else:
        raise InvalidArgumentError(f"{field}.{kind}: must be a mapping of its fields, got "
                                   f"{type(fields).__name__}", f"{field}.{kind}")
    if kind == "prompts_available" and "prompts" in fields:
        fields["prompts"] = _pairs(fields["prompts"], ("id", "prompt_tokens"),
                                   f"{field}.{kind}.prompts")
    elif kind == "generation_paused" and "samples" in fields:
        fields["samples"] = _pairs(fields["samples"], ("sample", "tokens"),
                                   f"{field}.{kind}.samples")
    try:
        return orchestrator_pb2.OrchestratorEvent(**{kind: fields})
    except (ValueError, TypeError) as error:
        raise InvalidArgumentError(f"{field}.{kind}: {error}", f"{field}.{kind}") from None


def _commands(serialized: list) -> list:
    return [orchestrator_pb2.OrchestratorCommand.FromString(c) for c in serialized]


class Orchestrator:
    """The decision core (see the module docstring).

    Args:
        config: the run's ``rlsched.v1.SimulatorConfig``: None (the defaults), a
            mapping in protobuf's JSON mapping (``{"orchestrator": {"mode":
            "ORCHESTRATOR_MODE_ASYNC", ...}, "steps": 10}``), its JSON text, or the
            message.
        plan_steps: each ``start_train`` carries the balancer's plan of its step
            (``config.step``, ``config.trainer_ranks``).
    """

    def __init__(self, config: ConfigArg = None, *, plan_steps: bool = False) -> None:
        if not available():
            raise MissingDependencyError(
                "rlsched.Orchestrator needs rlsched._native built with the wire library "
                "(CMake with RLSCHED_BUILD_WIRE=ON, the default, or pip install)")
        data: Union[bytes, str]
        if config is None:
            data, is_json = b"", False
        elif isinstance(config, orchestrator_pb2.SimulatorConfig):
            data, is_json = config.SerializeToString(), False
        elif isinstance(config, Mapping):
            try:
                data, is_json = json.dumps(config, allow_nan=False), True
            except (TypeError, ValueError) as error:
                raise InvalidArgumentError(f"config: not JSON-serializable: {error}",
                                           "config") from None
        elif isinstance(config, str):
            data, is_json = config, True
        else:
            raise InvalidArgumentError(
                "config: must be a mapping, JSON text or rlsched.v1.SimulatorConfig, got "
                f"{type(config).__name__}", "config")
        try:
            self._core = _native.Orchestrator(data, json=is_json, plan=bool(plan_steps))
        except ValueError as error:
            raise _invalid(error) from None

    # -- events ----------------------------------------------------------------------

    def handle(self, event: EventArg) -> list:
        """Applies one event (a ``rlsched.v1.OrchestratorEvent``, its bytes, or a
        mapping ``{kind: {field: value}}``); returns its commands
        (``rlsched.v1.OrchestratorCommand``)."""
        data = _event_bytes(event)
        try:
            return _commands(self._core.handle(data))
        except ValueError as error:
            raise _invalid(error) from None

    def handle_many(self, events: Iterable[EventArg]) -> list:
        """Applies events in order (one native call, the GIL released throughout);
        returns each one's list of commands. At a refused event ``events[i]`` it stops
        with InvalidArgumentError naming ``events[i].<kind>.<field>``, whose
        ``handled`` is i and ``commands`` the commands of ``events[:i]`` (as this method
        returns them), which stay applied."""
        data = [_event_bytes(e, f"events[{i}]") for i, e in enumerate(events)]
        try:
            return [_commands(c) for c in self._core.handle_many(data)]
        except ValueError as error:
            invalid = _invalid(error)
            if hasattr(error, "commands"):
                setattr(invalid, "commands", [_commands(c) for c in error.commands])
            raise invalid from None

    # -- state -------------------------------------------------------------------------

    def counters(self) -> orchestrator_pb2.OrchestratorCounters:
        """The core's counters (admitted = trained + filtered + buffered + queued +
        in_flight, in samples)."""
        return orchestrator_pb2.OrchestratorCounters.FromString(self._core.counters())

    def metrics(self, now: Optional[float] = None) -> orchestrator_pb2.OrchestratorMetrics:
        """The time-based figures up to `now` (default: the last event's time; not
        before it)."""
        try:
            return orchestrator_pb2.OrchestratorMetrics.FromString(self._core.metrics(now))
        except ValueError as error:
            raise _invalid(error) from None

    def report(self, now: Optional[float] = None):
        """A ``rlsched.v1.RunReport`` (runtime.proto): metrics and counters up to `now`,
        ``events`` handled, ``rejected_events``, ``done`` (no wall-clock fields)."""
        from rlsched.v1 import runtime_pb2
        try:
            return runtime_pb2.RunReport.FromString(self._core.report(now))
        except ValueError as error:
            raise _invalid(error) from None

    @property
    def config(self) -> orchestrator_pb2.SimulatorConfig:
        """The config as run, every field set."""
        return orchestrator_pb2.SimulatorConfig.FromString(self._core.config())

    def last_batch(self) -> list:
        """The samples of the last ``start_train`` (:class:`TrainedSample`)."""
        return [TrainedSample(s, t, list(spans)) for s, t, spans in self._core.last_batch()]

    def check_invariants(self) -> None:
        """Checks conservation and the staleness bound over the whole state; raises
        RuntimeError naming the first broken invariant. O(samples alive)."""
        self._core.check_invariants()

    @property
    def latest_version(self) -> int:
        """The policy version the trainer produces next (= steps finished)."""
        return self._core.latest_version

    @property
    def done(self) -> bool:
        """Whether ``config.steps`` steps have finished."""
        return self._core.done

    @property
    def events(self) -> int:
        """Events handled."""
        return self._core.events

    @property
    def rejected_events(self) -> int:
        """Events refused (each raised InvalidArgumentError)."""
        return self._core.rejected_events

    @property
    def last_time(self) -> Optional[float]:
        """The last handled event's time; None before the first."""
        return self._core.last_time


def _event_method(kind: str):
    def method(self, **fields) -> list:
        return self.handle({kind: fields})

    message = getattr(orchestrator_pb2, "".join(p.capitalize() for p in kind.split("_")))
    names = ", ".join(f.name for f in message.DESCRIPTOR.fields)
    method.__name__ = kind
    method.__qualname__ = f"Orchestrator.{kind}"
    method.__doc__ = (f"Handles a ``{kind}`` event (``rlsched.v1.{message.__name__}``: "
                      f"{names}); returns its commands.")
    return method


for _kind in EVENT_KINDS:
    setattr(Orchestrator, _kind, _event_method(_kind))
del _kind
