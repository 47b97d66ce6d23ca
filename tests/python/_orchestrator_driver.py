"""A seeded discrete-event driver of rlsched.Orchestrator for the tests and the benchmark.

It plays the engines and the trainer: executes the core's commands (dispatch, abort,
sync_weights with or without interrupt, resume, start_train, release) in virtual time
with random durations, and reports what happens as events (generation_finished with
random lengths and 0/1 rewards, generation_paused, weights_loaded, train_step_finished,
engine_released), plus random engine failures and re-joins. Every event is fed through
a callback so a test can check the core after each one. Deterministic per seed.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

from rlsched.v1 import orchestrator_pb2


@dataclass
class _Sample:
    engine: int
    tokens: int          # response tokens generated so far (as last counted)
    target: int          # total response tokens it will have
    since: float         # when its tokens were last counted (running from then)
    paused: bool = False


@dataclass
class Driver:
    core: object                 # rlsched.Orchestrator
    seed: int
    engines: int = 3
    max_concurrent: int = 4
    prompts: int = 1000
    prompt_tokens: tuple = (16, 256)
    response_tokens: tuple = (1, 300)
    seconds_per_token: float = 0.01
    train_seconds: tuple = (0.5, 3.0)
    sync_seconds: float = 0.2
    failure_rate: float = 0.0    # per event, an engine fails
    rejoin_seconds: float = 5.0
    max_events: int = 20000
    on_event: object = None      # callback(event_dict, commands) after each event
    log: list = field(default_factory=list)   # (event dict, [command messages])

    def __post_init__(self):
        self.rng = random.Random(self.seed)
        self.now = 0.0
        self.queue = []          # (time, seq, kind, payload, token)
        self.seq = 0
        self.samples = {}        # sample -> _Sample (in flight on some engine)
        self.generation = {}     # sample -> token of its pending finish (cancellation)
        self.joined = set()
        self.engine_epoch = {}   # engine -> incarnation (events of a failed one dropped)

    # -- plumbing ------------------------------------------------------------------

    def _at(self, time, kind, payload, engine=None):
        self.seq += 1
        epoch = self.engine_epoch.get(engine) if engine is not None else None
        heapq.heappush(self.queue, (time, self.seq, kind, payload, engine, epoch))

    def feed(self, kind, **fields):
        event = {kind: fields}
        commands = self.core.handle(event)
        self.log.append((event, commands))
        if self.on_event is not None:
            self.on_event(event, commands)
        for command in commands:
            self._execute(command)
        return commands

    # -- the engines and the trainer -----------------------------------------------

    def _schedule_finish(self, sample):
        s = self.samples[sample]
        token = object()
        self.generation[sample] = token
        done_at = self.now + (s.target - s.tokens) * self.seconds_per_token + 1e-3
        self._at(done_at, "finish", (sample, token), s.engine)

    def _progress(self, s):
        """Tokens of a running sample at self.now (below its target)."""
        if s.paused:
            return s.tokens
        grown = int((self.now - s.since) / self.seconds_per_token)
        return min(s.target - 1, s.tokens + max(grown, 0)) if s.target > s.tokens else s.tokens

    def _execute(self, command):
        kind = command.WhichOneof("kind")
        if kind == "dispatch":
            d = command.dispatch
            for work in d.samples:
                low, high = self.response_tokens
                target = max(work.resume_from + 1,
                             work.resume_from + self.rng.randint(low, high))
                self.samples[work.sample] = _Sample(d.engine, work.resume_from, target, self.now)
                self._schedule_finish(work.sample)
        elif kind == "abort":
            for sample in command.abort.samples:
                self.samples.pop(sample, None)
                self.generation.pop(sample, None)
        elif kind == "sync_weights":
            sync = command.sync_weights
            if sync.interrupt:
                report = []
                for sample, s in sorted(self.samples.items()):
                    if s.engine == sync.engine and not s.paused:
                        s.tokens = self._progress(s)
                        s.paused = True
                        self.generation.pop(sample, None)
                        report.append((sample, s.tokens))
                if sync.pause == orchestrator_pb2.PAUSE_MODE_ABORT:  # aborted: forgotten
                    for sample, _ in report:
                        del self.samples[sample]
                self._at(self.now, "paused", (sync.engine, sync.version, report), sync.engine)
            self._at(self.now + self.sync_seconds * (0.5 + self.rng.random()), "loaded",
                     (sync.engine, sync.version), sync.engine)
        elif kind == "resume":
            for sample in command.resume.samples:
                s = self.samples.get(sample)
                if s is not None and s.paused:
                    s.paused = False
                    s.since = self.now
                    self._schedule_finish(sample)
        elif kind == "start_train":
            t = command.start_train
            low, high = self.train_seconds
            self._at(self.now + self.rng.uniform(low, high), "trained", (t.step, t.call))
        elif kind == "release":
            self._at(self.now + 0.1, "released", command.release.engine, command.release.engine)
        else:  # pragma: no cover - a new command kind
            raise AssertionError(f"unknown command {command}")

    def _fail(self, engine):
        self.joined.discard(engine)
        self.engine_epoch[engine] = self.engine_epoch.get(engine, 0) + 1
        for sample in [x for x, s in self.samples.items() if s.engine == engine]:
            del self.samples[sample]
            self.generation.pop(sample, None)
        self.feed("engine_failed", time=self.now, engine=engine)
        self._at(self.now + self.rejoin_seconds, "join", engine)

    # -- the run -------------------------------------------------------------------

    def run(self):
        low, high = self.prompt_tokens
        for engine in range(self.engines):
            self.engine_epoch[engine] = 0
            self.joined.add(engine)
            self.feed("engine_joined", time=0.0, engine=engine,
                      max_concurrent=self.max_concurrent)
        self.feed("prompts_available", time=0.0,
                  prompts=[(i, self.rng.randint(low, high)) for i in range(self.prompts)])
        while self.queue and not self.core.done and self.core.events < self.max_events:
            time, _, kind, payload, engine, epoch = heapq.heappop(self.queue)
            if engine is not None and self.engine_epoch.get(engine) != epoch:
                continue  # the engine failed since: its pending work is gone
            self.now = max(self.now, time)
            if kind == "finish":
                sample, token = payload
                if self.generation.get(sample) is not token:
                    continue  # paused, aborted or re-dispatched since
                s = self.samples.pop(sample)
                del self.generation[sample]
                self.feed("generation_finished", time=self.now, sample=sample,
                          tokens=s.target, reward=float(self.rng.randint(0, 1)))
            elif kind == "paused":
                engine_id, version, report = payload
                self.feed("generation_paused", time=self.now, engine=engine_id,
                          version=version, samples=report)
            elif kind == "loaded":
                engine_id, version = payload
                self.feed("weights_loaded", time=self.now, engine=engine_id, version=version)
            elif kind == "trained":
                step, call = payload
                self.feed("train_step_finished", time=self.now, step=step, call=call)
            elif kind == "released":
                self.feed("engine_released", time=self.now, engine=payload)
            elif kind == "join":
                self.joined.add(payload)
                self.feed("engine_joined", time=self.now, engine=payload,
                          max_concurrent=self.max_concurrent)
            if self.failure_rate and self.joined and self.rng.random() < self.failure_rate:
                self._fail(self.rng.choice(sorted(self.joined)))
        return self
