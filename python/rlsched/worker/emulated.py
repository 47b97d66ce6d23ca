"""Emulated workers for tests and what-if runs of ``rlsched run``.

The engine follows the simulator's engine model (continuous batching: a decode step
takes ``decode_base + decode_per_sequence · running + decode_per_context_token ·
Σ context`` seconds and gives every running sample a token; a sample first prefills
its prompt and the tokens it resumes from at ``prefill_tokens_per_second``; a weight
sync takes ``weight_sync_seconds``), with the simulator's own draws of lengths and
rewards (``response_length``, ``group_rewards``: the same numbers as
``scheduler::WorkloadResponseLength`` for the run config's seed and distribution), so
that one config simulated and run sees the same workload. The trainer
takes each call's predicted step time × ``seconds_per_cost_unit`` +
``train_call_overhead_seconds``. Every time runs ``time_scale`` times faster (the
scheduler's Welcome says how much).

With a weight layout (``rlsched run --model --train --infer``) each sync's part of the
weight-sync plan is checked (:meth:`rlsched.worker.weights.WeightUpdate.check`: the
transfers and bytes the scheduler states are those the ranks' parts give, and the
bytes the emulated transfer moves are those) and recorded; a problem ends the worker
with an error (the run then fails). The sync still takes ``weight_sync_seconds``, as
in the simulator.

Run one with ``python3 -m rlsched.worker.emulated --address unix:PATH --role engine
--engine 3`` (``rlsched run --emulated-engines N --emulated-trainer`` starts them).
``--report FILE`` writes what the worker itself counted (JSON), for tests: with a weight
layout, every plan it received (``weight_plans``: its members, replica, ranks, the
transfers it was told and their bytes; the trainer's also each transfer's receivers),
the syncs per plan and the problems found (``plan_problems``).
"""

import argparse
import heapq
import json
import math
import sys
import threading
import time
from typing import Dict, List, Optional, Union

from rlsched.errors import WorkerError
from rlsched.v1 import orchestrator_pb2
from rlsched.worker.base import EngineWorker, TrainerWorker

# Colocated: the memory a Release frees, and a released engine's sync takes back in order.
_BOTH_MEMORIES = [orchestrator_pb2.MEMORY_TAG_WEIGHTS, orchestrator_pb2.MEMORY_TAG_KV_CACHE]

# The simulator's workload draws (scheduler/src/simulator.cc, common/src/workload.cc),
# replicated bit for bit: chained SplitMix64 seeds per key, Box-Muller normals.
_MASK = (1 << 64) - 1
_TAG_PROMPT_LENGTH = 2
_TAG_SAMPLE_LENGTH = 3
_TAG_REWARD = 4


class _Rng:
    """SplitMix64, as rlsched::workload::Rng."""

    __slots__ = ("state",)

    def __init__(self, seed: int):
        self.state = seed & _MASK

    def next(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & _MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
        return z ^ (z >> 31)

    def uniform_int(self, lo: int, hi: int) -> int:
        span = (hi - lo + 1) & _MASK
        if span == 0:  # the full 64-bit range, as a signed int64
            x = self.next()
            return x - (1 << 64) if x >> 63 else x
        limit = _MASK - ((_MASK % span + 1) % span)
        x = self.next()
        while x > limit:
            x = self.next()
        return lo + x % span

    def uniform_real(self) -> float:
        return (self.next() >> 11) * 2.0 ** -53

    def normal(self) -> float:
        u1 = 1.0 - self.uniform_real()
        u2 = self.uniform_real()
        return math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)


def _hash(seed: int, tag: int, a: int, b: int = 0, c: int = 0) -> int:
    h = _Rng(seed).next()
    for v in (tag, a, b, c):
        h = _Rng(h ^ (v & _MASK)).next()
    return h


def response_length(seed: int, lengths, samples_per_prompt: int, prompt: int, epoch: int,
                    index: int, sorted_list=None) -> int:
    """The simulator's response length of sample ``index`` of the ``epoch``-th group of
    ``prompt`` (scheduler::WorkloadResponseLength): the quantile at
    Φ(ρ·z_prompt + √(1 − ρ²)·z_sample) of the lognormal, or of the sorted list."""
    z_prompt = _Rng(_hash(seed, _TAG_PROMPT_LENGTH, prompt)).normal()
    z_sample = _Rng(_hash(seed, _TAG_SAMPLE_LENGTH, prompt, epoch, index)).normal()
    rho = lengths.length_correlation
    z = rho * z_prompt + math.sqrt(max(0.0, 1.0 - rho * rho)) * z_sample
    values = sorted_list if sorted_list is not None else sorted(lengths.lengths)
    if values:
        n = len(values)
        cdf = 0.5 * math.erfc(-z / math.sqrt(2.0))
        return values[int(min(max(math.floor(cdf * n), 0.0), n - 1.0))]
    value = min(math.exp(min(lengths.mu + lengths.sigma * z, 40.0)), 1e12)
    return int(min(max(math.floor(value + 0.5), 1), lengths.max_tokens))


def group_rewards(seed: int, all_equal_rate: float, samples_per_prompt: int,
                  group: int) -> List[float]:
    """The simulator's rewards of a group (all equal with probability all_equal_rate,
    else independent 0/1 with one flipped when they came out all equal)."""
    rng = _Rng(_hash(seed, _TAG_REWARD, group))
    g = samples_per_prompt
    if rng.uniform_real() < all_equal_rate:
        return [float(rng.next() & 1)] * g
    rewards = [float(rng.next() & 1) for _ in range(g)]
    if g > 1 and all(r == rewards[0] for r in rewards):
        flip = rng.uniform_int(0, g - 1)
        rewards[flip] = 1.0 - rewards[flip]
    return rewards


class _Clock:
    """Run seconds: wall seconds / time_scale since the welcome."""

    def __init__(self, scale: float):
        self.scale = scale if scale > 0 else 1.0
        self.start = time.monotonic()

    def now(self) -> float:
        return (time.monotonic() - self.start) / self.scale


class _Sample:
    __slots__ = ("tokens", "length", "prompt_tokens", "ready_at", "paused", "first_token_seconds")

    def __init__(self, tokens: float, length: int, prompt_tokens: int, ready_at: float,
                 first_token_seconds: float):
        self.tokens = tokens
        self.length = length
        self.prompt_tokens = prompt_tokens
        self.ready_at = ready_at
        self.paused = False
        self.first_token_seconds = first_token_seconds  # its prefill, in run seconds


class EmulatedEngine(EngineWorker):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._lock = threading.Condition()
        self._running: Dict[int, _Sample] = {}
        self._generated = 0.0  # tokens decoded, all samples (the heartbeats' counter)
        self._timers: List = []  # (run time, seq, callable)
        self._seq = 0
        self._stop = False
        self._released = False
        self.finished_count = 0
        self._thread: Optional[threading.Thread] = None
        # The weight-sync plans received and checked (reports).
        self.plans: Dict[str, dict] = {}
        self.plan_problems: List[str] = []
        self.moved_bytes = 0  # what the emulated transfers moved, summed over syncs

    # ---- The model, from the welcome's config. ----

    def on_welcome(self, welcome) -> None:
        if self._thread is not None:
            return  # a reattach: the same run, its engine time going on
        config = welcome.config
        self.clock = _Clock(welcome.time_scale)
        engine = config.engine
        self.base = engine.decode_base_seconds
        self.per_sequence = engine.decode_per_sequence_seconds
        self.per_context = engine.decode_per_context_token_seconds
        self.prefill = engine.prefill_tokens_per_second or float("inf")
        self.sync_seconds = config.weight_sync_seconds
        self.release_seconds = config.release_seconds
        self.resume_seconds = config.resume_seconds
        self.seed = config.seed
        self.samples_per_prompt = max(1, config.orchestrator.samples_per_prompt)
        self.lengths = config.lengths
        self.length_list = sorted(config.lengths.lengths)
        self.dataset_prompts = max(1, config.dataset_prompts)
        self.all_equal_rate = config.all_equal_rate
        self._rewards: Dict[int, List[float]] = {}
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def length_of(self, sample: int, group: int, prompt: int) -> int:
        """The simulator's draw: the group's epoch is group / dataset_prompts (the run's
        loader posts the dataset's prompts in order, cycled)."""
        return response_length(self.seed, self.lengths, self.samples_per_prompt, prompt,
                               group // self.dataset_prompts,
                               sample - group * self.samples_per_prompt, self.length_list)

    def reward_of(self, sample: int) -> float:
        group = sample // self.samples_per_prompt
        rewards = self._rewards.get(group)
        if rewards is None:
            rewards = group_rewards(self.seed, self.all_equal_rate, self.samples_per_prompt, group)
            self._rewards[group] = rewards
        return rewards[sample - group * self.samples_per_prompt]

    def dispatch(self, dispatch) -> None:
        with self._lock:
            now = self._advance()
            for work in dispatch.samples:
                prefill = (work.prompt_tokens + work.resume_from) / self.prefill
                self._running[work.sample] = _Sample(
                    float(work.resume_from), self.length_of(work.sample, work.group, work.prompt),
                    work.prompt_tokens, now + prefill, prefill)
            self._lock.notify()

    def abort(self, abort) -> None:
        with self._lock:
            self._advance()
            for sample in abort.samples:
                self._running.pop(sample, None)
            self._lock.notify()

    def on_weight_sync_plan(self, plan) -> None:
        record = plan.as_dict()
        record["syncs"] = 0
        record["replans"] = 0
        record["problems"] = [f"{plan.plan_id}: {p}" for p in plan.check()]
        if not 0 <= plan.replica < len(plan.members) or plan.members[plan.replica] != self.engine:
            record["problems"].append(f"{plan.plan_id}: engine {self.engine} is not "
                                      f"members[{plan.replica}] of {list(plan.members)}")
        self.plan_problems.extend(record["problems"])
        self.plans[plan.plan_id] = record
        if record["problems"]:
            raise WorkerError("weight-sync plan: " + "; ".join(record["problems"]),
                              "weight_sync_plan")

    def sync_weights(self, sync) -> None:
        if sync.plan is not None:
            # The emulated transfer moves what this engine's ranks receive by their parts.
            moved = sync.plan.received_bytes()
            if moved != sync.plan.bytes:
                self.plan_problems.append(f"sync v{sync.version}: the transfer moves {moved} "
                                          f"bytes, told {sync.plan.bytes}")
                raise WorkerError(self.plan_problems[-1], "sync_weights.plan")
            self.moved_bytes += moved
            self.plans[sync.plan.plan_id]["replans" if sync.replan else "syncs"] += 1
        elif self.plans:
            self.plan_problems.append(f"sync v{sync.version}: no plan in a run with plans")
            raise WorkerError(self.plan_problems[-1], "sync_weights.plan")
        if sync.replan:
            return  # the emulated transfer of the sync under way, by the new plan: no time
        with self._lock:
            now = self._advance()
            if sync.interrupt:
                # Paused at once (between decode steps): one report for all its samples;
                # with PAUSE_MODE_ABORT they are aborted (forgotten) once reported.
                report = []
                for sample, run in self._running.items():
                    if not run.paused:
                        run.paused = True
                        report.append((sample, int(run.tokens)))
                if sync.pause == orchestrator_pb2.PAUSE_MODE_ABORT:
                    for sample, _ in report:
                        del self._running[sample]
                self.paused(sync.version, report)
            # A released engine takes its weights' memory back, loads, then its KV cache.
            expected = _BOTH_MEMORIES if self._released else []
            if list(sync.resume) != expected:
                raise WorkerError(f"sync v{sync.version}: resume {list(sync.resume)}, "
                                  f"expected {expected} (released: {self._released})",
                                  "sync_weights.resume")
            delay = self.sync_seconds + (self.resume_seconds if self._released else 0.0)
            self._released = False
            self._at(now + delay, lambda: self.weights_loaded(sync.version))

    def resume(self, resume) -> None:
        with self._lock:
            now = self._advance()
            for sample in resume.samples:
                run = self._running.get(sample)
                if run is not None:
                    run.paused = False
                    # No KV cache survives a weight update: the prefix is prefilled again.
                    run.ready_at = now + (run.prompt_tokens + run.tokens) / self.prefill
            self._lock.notify()

    def release(self, release) -> None:
        if sorted(release.tags) != _BOTH_MEMORIES:
            raise WorkerError(f"release: tags {list(release.tags)}, expected "
                              f"{_BOTH_MEMORIES}", "release.tags")
        with self._lock:
            now = self._advance()
            self._released = True
            self._at(now + self.release_seconds, self.released)

    def on_stop(self) -> None:
        with self._lock:
            self._stop = True
            self._lock.notify()

    # ---- The engine's time (the loop thread; the lock held). ----

    def _at(self, when: float, action) -> None:
        heapq.heappush(self._timers, (when, self._seq, action))
        self._seq += 1
        self._lock.notify()

    def _step_seconds(self, active: List[_Sample]) -> float:
        context = sum(s.prompt_tokens + s.tokens for s in active)
        return self.base + self.per_sequence * len(active) + self.per_context * context

    def _advance(self) -> float:
        """Decodes up to now: every ready, unpaused sample gains elapsed / step tokens."""
        now = self.clock.now()
        last = getattr(self, "_last", now)
        self._last = now
        active = [s for s in self._running.values() if not s.paused and s.ready_at <= last]
        if active and now > last:
            step = self._step_seconds(active)
            gained = (now - last) / step if step > 0 else float("inf")
            for run in active:
                before = run.tokens
                run.tokens = min(float(run.length), run.tokens + gained)
                self._generated += run.tokens - before
        return now

    def generated_tokens(self) -> Optional[int]:
        with self._lock:
            self._advance()
            return int(self._generated)

    def _loop(self) -> None:
        with self._lock:
            while not self._stop:
                now = self._advance()
                for sample in [s for s, r in self._running.items()
                               if not r.paused and r.tokens >= r.length]:
                    run = self._running.pop(sample)
                    self.finished_count += 1
                    # The base class adds the versions and the rest of the telemetry.
                    self.finished(sample, run.length, self.reward_of(sample),
                                  telemetry={"first_token_seconds": run.first_token_seconds})
                while self._timers and self._timers[0][0] <= now:
                    heapq.heappop(self._timers)[2]()
                # Sleep until the next finish, prefill end or timer.
                wake = float("inf")
                active = [r for r in self._running.values() if not r.paused and r.ready_at <= now]
                if active:
                    step = self._step_seconds(active)
                    wake = now + min(r.length - r.tokens for r in active) * step
                for run in self._running.values():
                    if not run.paused and run.ready_at > now:
                        wake = min(wake, run.ready_at)
                if self._timers:
                    wake = min(wake, self._timers[0][0])
                wall = None if wake == float("inf") else max(
                    0.0005, (wake - now) * self.clock.scale)
                self._lock.wait(timeout=wall)


class EmulatedTrainer(TrainerWorker):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.trained: List[int] = []
        self.calls = 0
        self.plans: Dict[str, dict] = {}
        self.plan_problems: List[str] = []

    def on_weight_sync_plan(self, plan) -> None:
        record = plan.as_dict()
        # Each transfer's receivers (the senders' parts hold every transfer once).
        receivers = {}
        for rank, part in plan.by_rank.items():
            for t in part:
                if t.src_rank == rank:
                    receivers[t.index] = list(t.dst_ranks)
        record["receivers"] = [receivers.get(i) for i in range(len(receivers))]
        problems = [f"{plan.plan_id}: {p}" for p in plan.check()]
        if sorted(receivers) != list(plan.transfers):
            problems.append(f"{plan.plan_id}: the senders' parts hold {len(receivers)} "
                            f"transfers, told {len(plan.transfers)}")
        if plan.summary.num_transfers != len(receivers):
            problems.append(f"{plan.plan_id}: the plan has {plan.summary.num_transfers} "
                            f"transfers, the senders' parts {len(receivers)}")
        record["problems"] = problems
        self.plan_problems.extend(problems)
        self.plans[plan.plan_id] = record
        if problems:
            raise WorkerError("weight-sync plan: " + "; ".join(problems), "weight_sync_plan")

    def on_welcome(self, welcome) -> None:
        config = welcome.config
        self.scale = welcome.time_scale if welcome.time_scale > 0 else 1.0
        self.seconds_per_cost_unit = config.seconds_per_cost_unit
        self.overhead = config.train_call_overhead_seconds

    def start_train(self, call) -> None:
        seconds = call.plan.predicted_step_time * self.seconds_per_cost_unit + self.overhead
        self.trained.extend(call.samples)
        self.calls += 1
        timer = threading.Timer(seconds * self.scale, self.step_finished, (call.step, call.call))
        timer.daemon = True
        timer.start()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--address", required=True, help="unix:PATH or HOST:PORT")
    parser.add_argument("--role", choices=["engine", "trainer"], required=True)
    parser.add_argument("--engine", type=int, default=0, help="the engine's id")
    parser.add_argument("--max-concurrent", type=int, default=256)
    parser.add_argument("--version", type=int, default=-1, help="weights held (-1: none)")
    parser.add_argument("--token", default=None,
                        help="the run's token (default: $RLSCHED_WORKER_TOKEN)")
    parser.add_argument("--report", default=None, help="write what this worker counted (JSON)")
    parser.add_argument("--connect-timeout", type=float, default=30.0,
                        help="seconds to wait for the scheduler (default 30)")
    parser.add_argument("--reattach-seconds", type=float, default=0.0,
                        help="seconds to wait for a scheduler that went away, then attach "
                             "again (a resumed run; default 0: end)")
    args = parser.parse_args(argv)
    common = {"token": args.token, "connect_timeout_seconds": args.connect_timeout,
              "reattach_seconds": args.reattach_seconds}
    worker: Union[EmulatedEngine, EmulatedTrainer]
    if args.role == "engine":
        worker = EmulatedEngine(args.address, args.engine, args.max_concurrent,
                                version=args.version, **common)
    else:
        worker = EmulatedTrainer(args.address, **common)
    reason = None
    try:
        reason = worker.run()
    finally:
        if args.report:
            _write_report(args, worker, reason)
    return 0 if reason is not None and not reason.startswith("refused") else 1


def _write_report(args, worker, reason) -> None:
    """What the worker counted, as JSON (written also when the session failed)."""
    report = {"goodbye": reason, "weight_plans": worker.plans,
              "plan_problems": worker.plan_problems}
    if args.role == "engine":
        report["finished"] = worker.finished_count
        report["moved_bytes"] = worker.moved_bytes
    else:
        report["trained"] = worker.trained
        report["calls"] = worker.calls
    with open(args.report, "w") as out:
        json.dump(report, out)


if __name__ == "__main__":
    sys.exit(main())
