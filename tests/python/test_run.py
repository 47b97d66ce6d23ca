"""`rlsched run` end to end: the real program, real worker processes (the emulated
workers of rlsched.worker.emulated) on a real Unix socket, faults included.

The workers count what they did themselves (--report), so conservation is checked by
the workers, not only by the scheduler's counters.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from rlsched.v1 import orchestrator_pb2, runtime_pb2

_PYTHON = "/usr/bin/python3"

# 8 engines × 32, async s = 1 with partial rollout under the strict policy (every
# trained token at most one version old), 32 prompts × 4 per step, a 30 s trainer
# step, lengths of mean ~330 tokens up to 4,096.
_CONFIG = {
    "orchestrator": {
        "mode": "ORCHESTRATOR_MODE_ASYNC",
        "max_staleness": 1,
        "partial_rollout": True,
        "staleness_policy": "STALENESS_POLICY_STRICT",
        "prompts_per_step": 32,
        "samples_per_prompt": 4,
    },
    "steps": 10,
    "engines": 8,
    "engine": {"max_concurrent": 32},
    "trainer_ranks": 4,
    "train_seconds_per_step": 30,
    "weight_sync_seconds": 0.5,
    "lengths": {"mu": 5.5, "sigma": 1.0, "max_tokens": 4096},
}


def _write_config(tmp_path, **changes):
    config = json.loads(json.dumps(_CONFIG))
    config.update(changes)
    path = tmp_path / "run.json"
    path.write_text(json.dumps(config))
    return str(path)


class _Run:
    """`rlsched run` waiting for workers on a Unix socket, and the workers the test starts."""

    def __init__(self, rlsched_bin, tmp_path, config, extra=()):
        self.tmp = tmp_path
        self.socket = f"unix:{tmp_path}/run.sock"
        self.token_file = tmp_path / "token"
        self.token_file.write_text("s3cret\n")
        self.log = str(tmp_path / "events.log")
        self.process = subprocess.Popen(
            [rlsched_bin, "--log-level", "info", "run", "--config", config, "--listen",
             self.socket, "--token-file", str(self.token_file), "--event-log", self.log,
             "--json", "--timeout", "240", *(extra or ("--time-scale", "0.005"))],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.workers = {}
        self.err_lines = []
        self._reader = threading.Thread(target=self._read_err, daemon=True)
        self._reader.start()
        self._wait_for_socket()

    def _read_err(self):
        for line in self.process.stderr:
            self.err_lines.append(line)

    def wait_for(self, text, timeout=60):
        """Waits until the program's stderr has a line containing `text`."""
        deadline = time.monotonic() + timeout
        while not any(text in line for line in list(self.err_lines)):
            assert self.process.poll() is None, "".join(self.err_lines)[-3000:]
            assert time.monotonic() < deadline, \
                f"no '{text}' in: " + "".join(self.err_lines)[-3000:]
            time.sleep(0.02)

    def _wait_for_socket(self):
        path = self.socket[len("unix:"):]
        deadline = time.monotonic() + 30
        while not os.path.exists(path):
            assert self.process.poll() is None, self.process.communicate()
            assert time.monotonic() < deadline, "rlsched run did not listen"
            time.sleep(0.05)

    def start(self, name, *args, token="s3cret", env=None):
        env = dict(os.environ, RLSCHED_WORKER_TOKEN=token, **(env or {}))
        report = str(self.tmp / f"{name}.json")
        self.workers[name] = (subprocess.Popen(
            [_PYTHON, "-m", "rlsched.worker.emulated", "--address", self.socket,
             "--report", report, *args],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), report)
        return self.workers[name][0]

    def engine(self, engine):
        return self.start(f"engine{engine}", "--role", "engine", "--engine", str(engine),
                          "--max-concurrent", "32")

    def trainer(self, name="trainer"):
        return self.start(name, "--role", "trainer")

    def finish(self, timeout=240):
        out = self.process.stdout.read()
        self.process.wait(timeout=timeout)
        self._reader.join(timeout=30)
        err = "".join(self.err_lines)
        for process, _ in self.workers.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        return self.process.returncode, out, err

    def report(self, name):
        with open(self.workers[name][1]) as f:
            return json.load(f)

    def run_to_the_end(self, engines):
        """Starts engines 0 .. engines - 1 and the trainer, waits for the run, checks that
        it finished its steps and that the trainer trained each sample once (its own
        count against the RunReport's), and returns the RunReport."""
        for engine in range(engines):
            self.engine(engine)
        self.trainer()
        status, out, err = self.finish()
        assert status == 0, err[-3000:]
        report = json.loads(out)
        assert report["done"]
        trained = self.report("trainer")["trained"]
        assert len(trained) == len(set(trained)) == int(report["counters"]["trained"])
        return report

    def close(self):
        for process, _ in self.workers.values():
            if process.poll() is None:
                process.kill()
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def run_factory(rlsched_bin, tmp_path):
    runs = []

    def make(config=None, extra=()):
        run = _Run(rlsched_bin, tmp_path, config or _write_config(tmp_path), extra)
        runs.append(run)
        return run

    yield make
    for run in runs:
        run.close()


def _replay(rlsched_bin, log):
    result = subprocess.run([rlsched_bin, "replay", log], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "identical" in result.stdout


def _log_records(log):
    """The run's event log: its varint-delimited EventLogRecords, in order."""
    with open(log, "rb") as f:
        data = f.read()
    position = 0
    while position < len(data):
        size, shift = 0, 0
        while True:
            byte = data[position]
            position += 1
            size |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                break
        yield runtime_pb2.EventLogRecord.FromString(data[position:position + size])
        position += size


def _event_kinds(log):
    """How many events of each kind the run's event log holds, and the most samples one
    GenerationPaused report carries; the generation reports carrying an engine's account
    of its tokens' versions are counted under "with_spans"; and the most
    GenerationPaused reports one engine sent for one interrupting sync (its version)."""
    kinds, paused_samples, pauses = {}, 0, {}
    for record in _log_records(log):
        if record.WhichOneof("kind") == "event":
            kind = record.event.WhichOneof("kind")
            kinds[kind] = kinds.get(kind, 0) + 1
            if kind == "generation_paused":
                paused = record.event.generation_paused
                paused_samples = max(paused_samples, len(paused.samples))
                key = (paused.engine, paused.version)
                pauses[key] = pauses.get(key, 0) + 1
                spans = sum(1 for p in record.event.generation_paused.samples if p.spans)
            elif kind in ("generation_finished", "generation_progressed"):
                spans = 1 if getattr(record.event, kind).spans else 0
            else:
                spans = 0
            kinds["with_spans"] = kinds.get("with_spans", 0) + spans
    return kinds, paused_samples, max(pauses.values(), default=0)


def test_ten_steps_with_eight_engines_conserve_samples_as_the_workers_count_them(
        rlsched_bin, run_factory):
    # Heartbeats every 0.5 s (a tenth of the timeout), carrying the engines' load.
    run = run_factory(extra=("--time-scale", "0.005", "--heartbeat-timeout", "5"))
    for engine in range(8):
        run.engine(engine)
    run.trainer()
    status, out, err = run.finish()
    assert status == 0, err[-3000:]
    report = json.loads(out)
    assert report["done"]
    counters = report["counters"]
    trained = int(counters["trained"])
    assert trained == 10 * 32 * 4
    # The trainer's own count: every trained sample once.
    trainer = run.report("trainer")
    assert len(trainer["trained"]) == trained
    assert len(set(trainer["trained"])) == trained
    assert trainer["goodbye"] == "done"
    # The engines' own count: every sample the core counts as generated was finished by
    # some engine (restarted samples finish once more).
    finished = sum(run.report(f"engine{e}")["finished"] for e in range(8))
    admitted = int(counters["admitted"])
    in_core = (trained + int(counters.get("filtered", 0)) + int(counters.get("buffered", 0)))
    assert admitted == in_core + int(counters.get("queued", 0)) + int(counters.get("in_flight", 0))
    assert finished >= trained + int(counters.get("buffered", 0))
    # Strict: every trained token at most one version old.
    assert int(report["metrics"]["max_staleness"]) <= 1
    assert int(report.get("rejected_events", 0)) == 0
    # The engines report each interrupting sync's pause in one GenerationPaused (with
    # every sample the engine ran at the sync: how many is up to the timing), never
    # sample by sample.
    kinds, most_paused, pauses_per_sync = _event_kinds(run.log)
    assert kinds.get("generation_paused", 0) >= 8, kinds
    assert kinds.get("generation_progressed", 0) == 0, kinds
    assert most_paused >= 1, (most_paused, kinds)
    assert pauses_per_sync == 1, (pauses_per_sync, kinds)
    # The engines' accounts of their tokens' versions (the worker base class's, from the
    # versions it committed), checked by the core and equal to its inference.
    assert int(counters.get("version_reports", 0)) == kinds["with_spans"] > 0, kinds
    assert int(counters.get("version_reports", 0)) >= kinds["generation_finished"]
    assert int(counters.get("version_corrections", 0)) == 0
    # Every finish carried the engine's telemetry.
    requests = report["requests"]
    assert int(requests["requests"]) == kinds["generation_finished"]
    assert int(requests["generated_tokens"]) > 0
    assert int(requests["interruptions"]) > 0
    assert 0 < requests["mean_first_token_seconds"] < requests["mean_seconds"]
    assert requests["p50_seconds"] <= requests["p99_seconds"] <= requests["max_seconds"]
    # Every engine's load, from its heartbeats: at most its 32 places, some busy.
    load = report["engine_load"]
    assert [int(e["engine"]) for e in load] == list(range(8)), load
    for e in load:
        assert int(e["heartbeats"]) >= 1, e
        assert int(e.get("max_running", 0)) + int(e.get("max_waiting", 0)) <= 32, e
    assert sum(int(e.get("max_running", 0)) for e in load) > 0, load
    _replay(rlsched_bin, run.log)


def test_pause_mode_abort_resubmits_paused_samples_to_their_engine(rlsched_bin, run_factory,
                                                                   tmp_path):
    # Engines that cannot hold a request across a weight update: every interrupting sync
    # says PAUSE_MODE_ABORT, the engines report their samples' tokens and forget them,
    # and once an engine has loaded, its samples are dispatched to it again from those
    # tokens (no Resume).
    # Under the admission policy (the strict one could discard a stale sample's tokens,
    # which then starts again anywhere).
    orchestrator = dict(_CONFIG["orchestrator"], pause_mode="PAUSE_MODE_ABORT",
                        staleness_policy="STALENESS_POLICY_ADMISSION")
    run = run_factory(_write_config(tmp_path, orchestrator=orchestrator, steps=6, engines=4))
    report = run.run_to_the_end(4)
    counters = report["counters"]
    assert int(counters["trained"]) == 6 * 32 * 4
    assert int(report.get("rejected_events", 0)) == 0
    # From the log: every interrupting sync says abort; nothing is resumed in place;
    # each paused sample comes back in the next Dispatch to its own engine, after its
    # WeightsLoaded, from the tokens its pause reported.
    paused_at, loaded, resubmitted, syncs = {}, set(), 0, 0
    for record in _log_records(run.log):
        if record.WhichOneof("kind") == "command":
            kind = record.command.WhichOneof("kind")
            assert kind != "resume", record
            if kind == "sync_weights" and record.command.sync_weights.interrupt:
                assert record.command.sync_weights.pause == orchestrator_pb2.PAUSE_MODE_ABORT
                syncs += 1
                loaded.discard(record.command.sync_weights.engine)
            if kind == "dispatch":
                dispatch = record.command.dispatch
                for work in dispatch.samples:
                    if work.sample in paused_at:
                        engine, tokens = paused_at.pop(work.sample)
                        assert (dispatch.engine, work.resume_from) == (engine, tokens), work
                        assert engine in loaded
                        resubmitted += 1
        elif record.event.WhichOneof("kind") == "generation_paused":
            paused = record.event.generation_paused
            for p in paused.samples:
                paused_at[p.sample] = (paused.engine, p.tokens)
        elif record.event.WhichOneof("kind") == "weights_loaded":
            loaded.add(record.event.weights_loaded.engine)
    assert syncs >= 4 and resubmitted > 0, (syncs, resubmitted)
    assert int(counters["resubmitted"]) == resubmitted
    _replay(rlsched_bin, run.log)


def test_colocated_engines_release_and_take_back_their_memory_by_tag(rlsched_bin, run_factory,
                                                                     tmp_path):
    # Colocated sync: before each step every engine frees its weights and KV cache;
    # the next sync wakes it, weights' memory first, KV cache after the load. The
    # emulated engines refuse any other tags (the run would fail).
    orchestrator = {"mode": "ORCHESTRATOR_MODE_SYNC", "colocated": True,
                    "prompts_per_step": 8, "samples_per_prompt": 4}
    run = run_factory(_write_config(tmp_path, orchestrator=orchestrator, steps=3, engines=2))
    run.run_to_the_end(2)
    both = [orchestrator_pb2.MEMORY_TAG_WEIGHTS, orchestrator_pb2.MEMORY_TAG_KV_CACHE]
    released, woken = set(), 0
    for record in _log_records(run.log):
        if record.WhichOneof("kind") != "command":
            continue
        kind = record.command.WhichOneof("kind")
        if kind == "release":
            assert list(record.command.release.tags) == both
            released.add(record.command.release.engine)
        elif kind == "sync_weights":
            sync = record.command.sync_weights
            assert list(sync.resume) == (both if sync.engine in released else []), sync
            woken += sync.engine in released
            released.discard(sync.engine)
    assert woken >= 2 * 2, woken  # both engines, at least the first two steps' ends
    _replay(rlsched_bin, run.log)


def test_the_run_answers_the_daemons_requests_for_a_caller_with_its_token(
        rlsched_bin, run_factory, tmp_path):
    from rlsched import Client, InvalidArgumentError
    from rlsched.errors import DaemonError
    from rlsched.run_client import RunClient

    run = run_factory(_write_config(tmp_path, steps=2, engines=2))
    lengths = [900, 30, 500, 470, 200, 220, 640, 10, 4000, 77]
    # The answers are those of `rlsched serve` (the native module is absent from the
    # sanitizer builds).
    with RunClient(run.socket, token="s3cret") as client, Client(rlsched_bin) as local:
        assert client.ping() == local.ping()
        assert client.balance(lengths, 3, raw=True) == local.balance(lengths, 3, raw=True)
        assert (client.plan_step(lengths, num_ranks=2, max_token_len=4096, raw=True)
                == local.plan_step(lengths, num_ranks=2, max_token_len=4096, raw=True))
        with pytest.raises(InvalidArgumentError) as bad:
            client.balance(lengths, 0)
        assert bad.value.field == "balance.num_parts"
    for token in ("", "wrong"):
        with RunClient(run.socket, token=token) as stranger:
            with pytest.raises(DaemonError) as refused:
                stranger.ping()
            assert refused.value.code == "UNAUTHENTICATED"
    # The run itself goes on; the two callers are counted as refused.
    report = run.run_to_the_end(2)
    assert int(report["workers_refused"]) == 2


def test_a_killed_engine_a_late_engine_and_a_returning_trainer(rlsched_bin, run_factory):
    # Slower (a run second lasts 20 ms), so that the faults land mid-run.
    run = run_factory(extra=("--time-scale", "0.02"))
    for engine in range(4):
        run.engine(engine)
    trainer = run.trainer("trainer_first")
    # Let the run get going, then kill an engine mid-generation and the trainer.
    run.wait_for("engine 1 attached")
    run.wait_for("trainer attached")
    run.wait_for("step    0")
    run.workers["engine1"][0].send_signal(signal.SIGKILL)
    trainer.send_signal(signal.SIGKILL)
    time.sleep(0.5)
    run.engine(7)            # an engine joins mid-run
    run.trainer("trainer")   # the trainer comes back: the unfinished call is sent again
    status, out, err = run.finish()
    assert status == 0, err[-3000:]
    report = json.loads(out)
    assert report["done"]
    assert int(report["counters"]["trained"]) == 10 * 32 * 4
    assert int(report["counters"]["engine_failures"]) >= 1
    assert "engine 1 lost" in err
    assert "the trainer is lost" in err
    _replay(rlsched_bin, run.log)


def test_the_first_prompts_wait_for_the_engines_asked_for(rlsched_bin, run_factory):
    """--wait-for-engines 2: with one engine attached nothing is dispatched; the first
    prompts go out once the second one is there, and the first step runs on both."""
    run = run_factory(extra=("--time-scale", "0.005", "--wait-for-engines", "2"))
    run.engine(0)
    run.trainer()
    run.wait_for("engine 0 attached")
    run.wait_for("trainer attached")
    time.sleep(1.0)
    assert not any("the first prompts go out" in line or line.startswith("step ")
                   for line in run.err_lines), "".join(run.err_lines)
    run.engine(1)
    status, out, err = run.finish()
    assert status == 0, err[-3000:]
    assert "2 engines attached after" in err
    assert json.loads(out)["done"]
    # In the event log both engines' attaches come before the first prompts, and each
    # engine is dispatched samples from the first batch on.
    order = [record.event.WhichOneof("kind") for record in _log_records(run.log)
             if record.WhichOneof("kind") == "event"]
    first_prompts = order.index("prompts_available")
    assert order[:first_prompts].count("engine_attached") == 2, order[:first_prompts + 1]
    assert run.report("engine0")["finished"] and run.report("engine1")["finished"]


def test_a_rogue_engine_cannot_report_for_other_engines_samples(rlsched_bin, run_factory,
                                                                tmp_path):
    """An engine on the real socket that reports finishes and progress for samples it was
    not given (and a group it does not run) is refused every time and told why (its
    on_refused); the run trains every sample once, from the engines that ran it."""
    from rlsched.worker import EngineWorker

    refused = []

    mine = set()  # what the scheduler gave the rogue: those it reports honestly

    class Rogue(EngineWorker):
        def dispatch(self, dispatch):
            mine.update(work.sample for work in dispatch.samples)
            for work in dispatch.samples:
                for other in range(work.sample + 1, work.sample + 4):
                    if other in mine:
                        continue
                    self.finished(other, 1, 0.0)
                    self.progressed(other, 100000)
                # A filter of a group it does not run (one it ran alone would be taken,
                # and a rogue attached first could filter every group and starve the
                # data loader: the worker server test files one for a running group).
                self.send_event(group_filtered=orchestrator_pb2.GroupFiltered(
                    group=10 ** 6 + work.sample, engine=0))
                self.finished(work.sample, work.resume_from + 1, 0.0)

        def abort(self, abort):
            pass

        def resume(self, resume):
            for sample in resume.samples:
                self.finished(sample, self._accounts[sample].tokens + 1, 0.0)

        def release(self, release):
            self.released()

        def sync_weights(self, sync):
            if sync.interrupt and not sync.replan:
                self.paused(sync.version, [])
            self.weights_loaded(sync.version)

        def on_refused(self, event, reason):
            refused.append((event.WhichOneof("kind"), reason))

    run = run_factory(_write_config(tmp_path, steps=3))
    rogue = Rogue(run.socket, 9, 4, token="s3cret")
    thread = threading.Thread(target=rogue.run, daemon=True)
    thread.start()
    report = run.run_to_the_end(3)
    thread.join(timeout=60)
    assert int(report["counters"]["trained"]) == 3 * 32 * 4
    stolen = [r for _, r in refused if "in flight on engine" in r]
    assert stolen, refused[:5]
    assert all(r.startswith(("sample: ", "group: ")) for _, r in refused), refused[:5]
    kinds = {k for k, _ in refused}
    assert {"generation_finished", "generation_progressed", "group_filtered"} <= kinds
    assert int(report["rejected_events"]) >= len(refused)
    assert [e for e, _ in rogue.refusals][-1].WhichOneof("kind") == refused[-1][0]


def test_a_worker_turned_away_by_a_full_door_retries_until_welcomed(rlsched_bin, run_factory,
                                                                    tmp_path):
    """Streams that never say Hello fill the door (--max-waiting 2); the next worker is
    turned away (RESOURCE_EXHAUSTED) and the worker SDK retries with backoff until the
    silent ones are closed at their deadline (--hello-timeout), then joins."""
    import grpc
    from rlsched.worker import EngineWorker
    from rlsched.worker.base import ATTACH_METHOD

    run = run_factory(_write_config(tmp_path, steps=1),
                      extra=("--time-scale", "0.005", "--max-waiting", "2",
                             "--hello-timeout", "1.5"))
    channel = grpc.insecure_channel(run.socket)
    attach = channel.stream_stream(ATTACH_METHOD,
                                   request_serializer=runtime_pb2.WorkerMessage.SerializeToString,
                                   response_deserializer=runtime_pb2.SchedulerMessage.FromString)
    hold = threading.Event()

    def silence():
        hold.wait(60)
        return
        yield

    silent = [attach(silence()) for _ in range(2)]
    welcomed = threading.Event()

    class Engine(EngineWorker):
        def on_welcome(self, welcome):
            welcomed.set()

        def dispatch(self, dispatch):
            for work in dispatch.samples:
                self.finished(work.sample, work.resume_from + 1, 0.0)

        def abort(self, abort):
            pass

        def sync_weights(self, sync):
            if sync.interrupt and not sync.replan:
                self.paused(sync.version, [])
            self.weights_loaded(sync.version)

    time.sleep(0.3)  # the silent streams are waiting
    engine = Engine(run.socket, 0, 32, token="s3cret", connect_timeout_seconds=30)
    thread = threading.Thread(target=engine.run, daemon=True)
    thread.start()
    assert welcomed.wait(30), "".join(run.err_lines)[-2000:]
    run.wait_for("turned away")
    run.trainer()
    status, out, err = run.finish()
    hold.set()
    for call in silent:
        call.cancel()
    channel.close()
    assert status == 0, err[-3000:]
    report = json.loads(out)
    assert report["done"]
    assert int(report["workers_refused"]) >= 3  # turned away once at least, 2 silent closed


def test_sigterm_ends_the_run_gracefully(rlsched_bin, run_factory):
    """SIGTERM mid-run: the report is printed (not done), every worker is told Goodbye and
    ends on its own, the event log is whole (it replays), the socket file is gone, and
    the exit status says which signal (128 + 15)."""
    run = run_factory(extra=("--time-scale", "0.02"))
    for engine in range(2):
        run.engine(engine)
    run.trainer()
    run.wait_for("step    0")
    run.process.send_signal(signal.SIGTERM)
    status, out, err = run.finish()
    assert status == 128 + signal.SIGTERM, err[-3000:]
    report = json.loads(out)
    assert not report["done"] and int(report["counters"]["steps_finished"]) >= 1
    assert "stopped by SIGTERM before the run finished" in err
    for name, (process, _) in run.workers.items():
        assert process.returncode == 0, (name, process.stderr.read()[-2000:])
    assert not os.path.exists(run.socket[len("unix:"):])
    _replay(rlsched_bin, run.log)


def test_a_worker_with_a_wrong_token_is_refused(rlsched_bin, run_factory, tmp_path):
    run = run_factory(_write_config(tmp_path, steps=2))
    intruder = run.start("intruder", "--role", "engine", "--engine", "0", token="guess")
    assert intruder.wait(timeout=60) == 1
    assert run.report("intruder")["goodbye"] == "refused: wrong or missing token"
    for engine in range(2):
        run.engine(engine)
    run.trainer()
    status, out, err = run.finish()
    assert status == 0, err[-3000:]
    report = json.loads(out)
    assert int(report["workers_refused"]) == 1
    assert "wrong or missing token" in err


def _certificate(tmp_path, name):
    """A self-signed certificate for localhost and its key (PEM files)."""
    cert, key = tmp_path / f"{name}.pem", tmp_path / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj",
                    "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return str(cert), str(key)


def test_workers_attach_over_tls(rlsched_bin, run_factory, tmp_path):
    cert, key = _certificate(tmp_path, "run")
    other, _ = _certificate(tmp_path, "other")
    run = run_factory(_write_config(tmp_path, steps=2),
                      extra=("--time-scale", "0.005", "--tls-cert", cert, "--tls-key", key))
    # Plaintext, or TLS trusting another certificate: no session (the handshake fails).
    plain = run.start("plain", "--role", "engine", "--engine", "0", "--connect-timeout", "3")
    stranger = run.start("stranger", "--role", "engine", "--engine", "1", "--connect-timeout",
                         "3", env={"RLSCHED_TLS_CA": other})
    for worker in (plain, stranger):
        assert worker.wait(timeout=60) != 0
        assert "FutureTimeoutError" in worker.stderr.read()
    trusted = {"RLSCHED_TLS_CA": cert}
    for engine in range(2):
        run.start(f"engine{engine}", "--role", "engine", "--engine", str(engine),
                  "--max-concurrent", "32", env=trusted)
    run.start("trainer", "--role", "trainer", env=trusted)
    status, out, err = run.finish()
    assert status == 0, err[-3000:]
    report = json.loads(out)
    assert report["done"] and int(report["counters"]["trained"]) == 2 * 32 * 4
    assert sorted(run.report("trainer")["trained"]) == list(range(2 * 32 * 4))


def test_groups_filtered_mid_step_are_replaced_at_once(rlsched_bin, tmp_path):
    """Dynamic sampling that drops most groups (85% all-equal rewards): a step needs more
    groups than the loader keeps ahead (3 batches of 8 in sync mode), so the refill for
    filtered groups cannot wait for the step's end (the run would starve and hang)."""
    config = _write_config(
        tmp_path, steps=3, engines=2, all_equal_rate=0.85,
        orchestrator={"mode": "ORCHESTRATOR_MODE_SYNC", "prompts_per_step": 8,
                      "samples_per_prompt": 4, "filter_all_equal": True})
    log = tmp_path / "events.log"
    result = subprocess.run(
        [rlsched_bin, "run", "--config", config, "--emulated-engines", "2", "--emulated-trainer",
         "--json", "--timeout", "120", "--event-log", str(log)],
        capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["done"] and int(report["counters"]["trained"]) == 3 * 8 * 4
    prompts_before_first_step = 0
    for record in _log_records(log):
        if record.WhichOneof("kind") != "event":
            continue
        kind = record.event.WhichOneof("kind")
        if kind == "train_step_finished":
            break
        if kind == "prompts_available":
            prompts_before_first_step += len(record.event.prompts_available.prompts)
    assert prompts_before_first_step > 3 * 8, prompts_before_first_step


def test_emulated_workers_over_tls_and_bad_tls_arguments(rlsched_bin, tmp_path):
    cert, key = _certificate(tmp_path, "run")
    config = _write_config(tmp_path, steps=2)
    result = subprocess.run(
        [rlsched_bin, "run", "--config", config, "--emulated-engines", "2", "--emulated-trainer",
         "--tls-cert", cert, "--tls-key", key, "--json"],
        capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout)["done"]
    for args, field in ((["--tls-cert", cert], "--tls-key"), (["--tls-key", key], "--tls-cert"),
                        (["--tls-cert", key, "--tls-key", key], "--tls-cert"),
                        (["--tls-cert", cert, "--tls-key", cert], "--tls-key")):
        result = subprocess.run([rlsched_bin, "run", "--config", config, "--emulated-engines", "1",
                                 "--emulated-trainer", *args],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode != 0 and field in result.stderr, (args, result.stderr)


def test_emulated_workers_started_by_the_program(rlsched_bin, tmp_path):
    config = _write_config(tmp_path, steps=3)
    result = subprocess.run(
        [rlsched_bin, "run", "--config", config, "--emulated-engines", "4", "--emulated-trainer",
         "--json"], capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["done"]
    assert int(report["counters"]["trained"]) == 3 * 32 * 4
    assert result.stderr.count("step ") >= 3  # a progress line per step


def test_bad_arguments_are_refused_clearly(rlsched_bin, tmp_path):
    result = subprocess.run([rlsched_bin, "run", "--listen", f"unix:{tmp_path}/x.sock"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "--token-file" in result.stderr
    bad = tmp_path / "bad.json"
    bad.write_text('{"steps": 0}')
    result = subprocess.run([rlsched_bin, "run", "--config", str(bad), "--emulated-engines", "1",
                             "--emulated-trainer"], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "steps" in result.stderr
    result = subprocess.run([rlsched_bin, "run", "--emulated-engines", "1",
                             "--emulated-trainer", "--wait-for-engines", "-1"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "--wait-for-engines" in result.stderr and "[0, 4096]" in result.stderr
    log = tmp_path / "not-a-log"
    log.write_bytes(b"\x05abc")
    result = subprocess.run([rlsched_bin, "replay", str(log)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode != 0
    assert "record 0" in result.stderr


_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_MODEL = os.path.join(_REPO, "tests", "data", "configs", "tiny-llama.json")
# Trainer TP 2 x PP 2 (4 GPUs) -> engines of TP 2, 64 KiB buckets: a few dozen transfers.
_LAYOUT = ("--model", _MODEL, "--train", "tp=2,pp=2", "--infer", "tp=2", "--bucket-mib", "1")


def _check_weight_plans(run, engines, trainer="trainer"):
    """The workers' own records of the weight-sync plans they got: no problem found by
    any (each part's transfers and bytes are those its ranks' parts give), each engine is
    its plan's members[replica], the trainer got the newest plan, and the engines that
    got a plan the trainer has (its senders' part lists every transfer's receivers)
    cover its receiving transfers exactly once per replica (all of them when every
    member got it). Returns {plan id: (members, engines)} for every plan an engine got."""
    reports = {e: run.report(f"engine{e}") for e in engines}
    senders = run.report(trainer)
    assert senders["plan_problems"] == [], senders["plan_problems"]
    seen = {}
    for engine, report in reports.items():
        assert report["plan_problems"] == [], (engine, report["plan_problems"])
        for plan_id, part in report["weight_plans"].items():
            assert part["members"][part["replica"]] == engine, (engine, part)
            assert part["backend"] == "gloo" and part["group"] == "rlsched-weights-" + plan_id
            seen.setdefault(plan_id, []).append((engine, part))
    assert seen, "no engine got a weight-sync plan"
    newest = max(seen, key=lambda plan_id: int(plan_id.split("-")[0]))
    assert newest in senders["weight_plans"], (newest, sorted(senders["weight_plans"]))
    covered = {}
    for plan_id, parts in seen.items():
        covered[plan_id] = (parts[0][1]["members"], sorted(e for e, _ in parts))
        plan = senders["weight_plans"].get(plan_id)
        if plan is None:  # used before the trainer attached
            continue
        members, tp, first = plan["members"], parts[0][1]["ranks"], plan["trainer_ranks"]
        assert tp == 2 and first == 4
        # (replica, transfer) for every replica each transfer reaches.
        expected = {(k, i) for i, receivers in enumerate(plan["receivers"])
                    for k in range(len(members))
                    if any(first + k * tp <= r < first + (k + 1) * tp for r in receivers)}
        got = [(part["replica"], i) for _, part in parts for i in part["transfers"]]
        assert len(got) == len(set(got)), plan_id
        replicas = {part["replica"] for _, part in parts}
        assert set(got) == {(k, i) for k, i in expected if k in replicas}, plan_id
        for engine, part in parts:
            assert part["members"] == members and part["epoch"] == plan["epoch"]
            assert part["world_size"] == first + tp * len(members)
    return covered


def test_each_engine_gets_its_part_of_the_weight_sync_plan(rlsched_bin, run_factory, tmp_path):
    run = run_factory(_write_config(tmp_path, steps=3, engines=4),
                      extra=("--time-scale", "0.005", *_LAYOUT))
    # The engines join one by one (memberships {0}, {0, 1}, ...: each joining engine is
    # synced at once), then the trainer, which gets the current plan as it attaches.
    for engine in range(4):
        run.engine(engine)
        run.wait_for(f"engine {engine} attached")
        run.wait_for(f"weight-sync plan {engine}-")
    run.trainer()
    status, out, err = run.finish()
    assert status == 0, err[-3000:]
    report = json.loads(out)
    assert report["done"]
    covered = _check_weight_plans(run, range(4))
    assert sorted(members for members, _ in covered.values()) == [
        [0], [0, 1], [0, 1, 2], [0, 1, 2, 3]], covered
    # The report lists the epochs in order, with their plans' sizes and syncs: the
    # engines' own counts of the syncs that named each plan.
    epochs = report["weight_sync"]
    assert [[int(m) for m in e["members"]] for e in epochs] == [
        [0], [0, 1], [0, 1, 2], [0, 1, 2, 3]], epochs
    assert [int(e.get("epoch", 0)) for e in epochs] == [0, 1, 2, 3]
    named = {}
    for engine in range(4):
        for plan_id, part in run.report(f"engine{engine}")["weight_plans"].items():
            epoch = int(plan_id.split("-")[0])
            named[epoch] = named.get(epoch, 0) + part["syncs"]
    for e in epochs:
        assert int(e["transfers"]) > 0 and int(e["bytes"]) > 0 and int(e["buckets"]) > 0, e
        assert int(e["syncs"]) == named[int(e.get("epoch", 0))], (e, named)
    assert int(report.get("weight_sync_replans", 0)) == 0
    # The steps' syncs use the last membership's plan: every member's part, sent once,
    # covering the plan; the trainer has that one only.
    full = [plan for plan, (members, engines) in covered.items() if members == [0, 1, 2, 3]]
    assert covered[full[0]][1] == [0, 1, 2, 3]
    assert list(run.report("trainer")["weight_plans"]) == full
    for engine in range(4):
        report = run.report(f"engine{engine}")
        part = report["weight_plans"][full[0]]
        assert part["syncs"] >= 2, part  # the steps' syncs name the plan only
        assert report["moved_bytes"] > 0
    assert "weight-sync plan" in err
    _replay(rlsched_bin, run.log)


def test_a_lost_engine_gets_the_survivors_a_new_weight_sync_plan(rlsched_bin, run_factory,
                                                                 tmp_path):
    run = run_factory(_write_config(tmp_path, steps=6, engines=4),
                      extra=("--time-scale", "0.02", *_LAYOUT))
    for engine in range(4):
        run.engine(engine)
        run.wait_for(f"engine {engine} attached")
        run.wait_for(f"weight-sync plan {engine}-")
    run.trainer()
    run.wait_for("step    0")
    run.workers["engine1"][0].send_signal(signal.SIGKILL)
    run.wait_for("engine 1 lost")
    run.engine(7)
    run.wait_for("engine 7 attached")
    status, out, err = run.finish()
    assert status == 0, err[-3000:]
    assert json.loads(out)["done"]
    covered = _check_weight_plans(run, [0, 2, 3, 7])
    # The trainer, attached from the start of training, got every plan used since.
    trainer_plans = run.report("trainer")["weight_plans"]
    assert all(plan in trainer_plans for plan in covered if int(plan.split("-")[0]) >= 3)
    memberships = [members for members, _ in covered.values()]
    # After the loss the survivors sync by a plan without engine 1, then with engine 7.
    assert [0, 2, 3] in memberships or [0, 2, 3, 7] in memberships, memberships
    assert [0, 2, 3, 7] in memberships, memberships
    last = max(covered, key=lambda plan: int(plan.split("-")[0]))
    assert covered[last] == ([0, 2, 3, 7], [0, 2, 3, 7]), covered
    _replay(rlsched_bin, run.log)


def test_bad_weight_layouts_are_refused_before_the_run(rlsched_bin, tmp_path):
    config = _write_config(tmp_path, steps=1, engines=2)
    base = [rlsched_bin, "run", "--config", config, "--emulated-engines", "2",
            "--emulated-trainer"]
    for args, text in [
            (("--model", _MODEL, "--train", "tp=2,pp=3", "--infer", "tp=2"), "--train (train.pp)"),
            (("--model", _MODEL, "--train", "tp=2", "--infer", "tp=3"), "--infer (infer.tp)"),
            (("--model", _MODEL, "--train", "tp=2", "--infer", "tp=2,replicas=3"),
             "--infer: replicas=3 differs from the run's engines (2)"),
            (("--model", _MODEL, "--infer", "tp=2"), "--train: required with --model"),
            (("--train", "tp=2", "--infer", "tp=2"), "--model: required"),
            (("--model", str(tmp_path / "none.json"), "--train", "tp=2", "--infer", "tp=2"),
             "--model"),
            (("--model", _MODEL, "--train", "tq=2", "--infer", "tp=2"), "--train: unknown key"),
            (("--model", _MODEL, "--train", "tp=2", "--infer", "tp=2", "--weight-sync-address",
              "host"), "--weight-sync-address: must be HOST:PORT")]:
        start = time.monotonic()
        result = subprocess.run(base + list(args), capture_output=True, text=True, timeout=60)
        assert result.returncode != 0, args
        assert text in result.stderr, (args, result.stderr)
        assert "attached" not in result.stderr, args  # refused before any worker started
        assert time.monotonic() - start < 30


def test_model_folders_are_read_as_reshard_reads_them(rlsched_bin, tmp_path):
    """--model takes a config.json or its model folder in `run` as in `reshard` (one
    reader): a run with a folder plans and sends the weight sync; a folder without
    config.json and a missing path are refused by both, naming --model and the path."""
    folder = tmp_path / "tiny-llama"
    folder.mkdir()
    with open(_MODEL) as f:
        (folder / "config.json").write_text(f.read())
    (folder / "model.safetensors.index.json").write_text("{}")  # a folder's other files
    config = _write_config(tmp_path, steps=1, engines=2)
    layout = ["--train", "tp=2,pp=2", "--infer", "tp=2", "--bucket-mib", "1"]
    result = subprocess.run(
        [rlsched_bin, "--log-level", "info", "run", "--config", config, "--emulated-engines", "2",
         "--emulated-trainer", "--json", "--model", str(folder), *layout],
        capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout)["done"]
    assert "weight-sync plan" in result.stderr
    # reshard plans the same from the folder and from the file.
    plans = [subprocess.run([rlsched_bin, "reshard", "--model", model, "--train", "tp=2,pp=2",
                             "--infer", "tp=2,replicas=2", "--bucket-mib", "1", "--json"],
                            capture_output=True, text=True, timeout=60, check=True).stdout
             for model in (str(folder), _MODEL)]
    assert plans[0] == plans[1]
    empty = tmp_path / "empty"
    empty.mkdir()
    for model, text in [(empty, f"--model: {empty}: a folder without config.json"),
                        (tmp_path / "none", f"--model: {tmp_path / 'none'}: cannot open")]:
        for command in (["run", "--config", config, "--emulated-engines", "2",
                         "--emulated-trainer", "--model", str(model), *layout],
                        ["reshard", "--model", str(model), "--train", "tp=2", "--infer", "tp=2"]):
            refused = subprocess.run([rlsched_bin, *command], capture_output=True, text=True,
                                     timeout=60)
            assert refused.returncode == 2, (command, refused.stderr)
            assert text in refused.stderr, (command, refused.stderr)
            assert "attached" not in refused.stderr


def test_emulated_workers_check_the_plans_the_program_sends(rlsched_bin, tmp_path):
    config = _write_config(tmp_path, steps=2, engines=2)
    result = subprocess.run(
        [rlsched_bin, "--log-level", "info", "run", "--config", config, "--emulated-engines", "2",
         "--emulated-trainer", "--json", "--weight-sync-backend", "nccl", "--weight-sync-address",
         "127.0.0.1:29500", *_LAYOUT], capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout)["done"]
    assert "weight-sync plan" in result.stderr


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


def test_emulated_draws_are_the_simulators():
    """The emulated engine's lengths and rewards are the simulator's own draws, bit for
    bit: the same values as tests/scheduler/simulator_test.cc's
    SimulatorWorkload.DrawsArePureFunctionsOfTheirKeys."""
    from rlsched.v1 import orchestrator_pb2
    from rlsched.worker.emulated import group_rewards, response_length

    lognormal = orchestrator_pb2.LengthDistribution(mu=5.5, sigma=1.0, max_tokens=4096,
                                                    length_correlation=0.8)
    keys = [(0, 0, 0), (0, 0, 1), (3, 0, 2), (5, 1, 3), (123456, 2, 0)]
    assert [response_length(7, lognormal, 4, *k) for k in keys] == [170, 170, 35, 234, 69]
    listed = orchestrator_pb2.LengthDistribution(lengths=[900, 5, 70, 3000, 12],
                                                 length_correlation=0.3)
    keys = [(0, 0, 0), (1, 0, 1), (2, 3, 2), (9, 1, 3)]
    assert [response_length(42, listed, 4, *k) for k in keys] == [3000, 900, 900, 12]
    assert [group_rewards(11, 0.3, 4, g) for g in range(5)] == [
        [1, 0, 0, 1], [1, 1, 1, 0], [1, 0, 1, 0], [0, 0, 0, 0], [0, 1, 1, 0]]


def test_engine_worker_accounts_for_versions_load_and_telemetry():
    """The EngineWorker base class's own account (no scheduler needed): the versions it
    committed, switching where its pause report said; none for a sample that ran across
    a commit without a pause; the engine's own spans and telemetry win; the load."""
    from rlsched.v1 import orchestrator_pb2
    from rlsched.worker import EngineWorker

    class Engine(EngineWorker):
        def dispatch(self, dispatch):
            pass

        def resume(self, resume):
            pass

        def abort(self, abort):
            pass

        def sync_weights(self, sync):
            pass

    engine = Engine("unix:/nonexistent", 3, 8, version=2)

    def command(**kind):
        engine.on_command(orchestrator_pb2.OrchestratorCommand(**kind))

    def sent():
        events = []
        while not engine._out.empty():
            events.append(engine._out.get().event)
        return events

    command(dispatch=orchestrator_pb2.Dispatch(engine=3, version=2, samples=[
        orchestrator_pb2.SampleWork(sample=s, resume_from=r)
        for s, r in ((10, 0), (11, 5), (12, 0))]))
    assert engine.load() == (3, 0)
    command(sync_weights=orchestrator_pb2.SyncWeights(engine=3, version=3, interrupt=True))
    engine.paused(3, [(10, 7), (11, 5)])  # 11: no token since its dispatch
    assert engine.load() == (1, 2)
    engine.weights_loaded(3)  # 12 kept running across the commit: no account of it
    command(resume=orchestrator_pb2.Resume(engine=3, version=3, samples=[10, 11]))
    assert engine.load() == (3, 0)
    engine.finished(10, 12, 1.0)
    engine.finished(11, 9, 0.0, telemetry={"preemptions": 2})
    engine.finished(12, 4, 0.0)
    command(dispatch=orchestrator_pb2.Dispatch(engine=3, version=3, samples=[
        orchestrator_pb2.SampleWork(sample=13, resume_from=0)]))
    engine.finished(13, 6, 0.0, spans=[(3, 0)], telemetry={"first_token_seconds": 0.5})
    assert engine.load() == (0, 0)
    paused, loaded, finished_10, finished_11, finished_12, finished_13 = sent()
    assert loaded.weights_loaded.version == 3 and engine.version == 3
    spans = [[(s.version, s.first_token) for s in p.spans]
             for p in paused.generation_paused.samples]
    assert spans == [[(2, 0)], []]
    f = finished_10.generation_finished
    assert [(s.version, s.first_token) for s in f.spans] == [(2, 0), (3, 7)]
    assert f.telemetry.generated_tokens == 12 and f.telemetry.interruptions == 1
    assert f.telemetry.seconds >= f.telemetry.paused_seconds >= 0
    f = finished_11.generation_finished
    assert [(s.version, s.first_token) for s in f.spans] == [(3, 5)]
    assert f.telemetry.generated_tokens == 4 and f.telemetry.preemptions == 2
    assert list(finished_12.generation_finished.spans) == []
    assert finished_12.generation_finished.telemetry.generated_tokens == 4
    f = finished_13.generation_finished
    assert [(s.version, s.first_token) for s in f.spans] == [(3, 0)]
    assert f.telemetry.first_token_seconds == 0.5


def test_weight_update_decodes_and_checks_a_part_and_syncs_carry_it():
    """A WeightSyncPlan built by hand: the engine's part decoded (ranks, transfers by
    rank, buckets with names, dtypes, shapes, bytes and senders, the executor's rank
    plan), its stated bytes checked against its parts, SyncWeights handed to
    ``sync_weights`` with the plan its id names, an unknown id refused."""
    from rlsched.v1 import reshard_pb2, orchestrator_pb2, runtime_pb2
    from rlsched.worker import EngineWorker, WeightUpdate
    from rlsched.worker.weights import DTYPE_BF16, DTYPE_FP8_BLOCK128

    # Trainer ranks 0, 1; engine replica 1 of members [4, 9] on ranks 4, 5 (TP 2).
    def part(rank, transfers):
        names = ["w.src", "w.dst"]
        groups = sorted({tuple(t[2]) for t in transfers})
        return reshard_pb2.ReshardRankPart(
            param_names=names, dst_groups=[reshard_pb2.RankGroup(ranks=list(g)) for g in groups],
            transfers=[reshard_pb2.RankTransfer(
                index=i, bucket=b, src_rank=src, src_param=0, dst_param=1,
                src_slice=[0, 4, 0, 8], dst_slice=[0, 4, 0, 8], dst_group=groups.index(tuple(d)),
                bytes=n, quantize=q) for i, b, d, src, n, q in
                [(t[0], t[1], t[2], t[3], t[4], t[5]) for t in transfers]])

    t0 = (0, 0, [2, 4], 0, 64, 0)      # reaches rank 4 (and replica 0's rank 2)
    t1 = (1, 0, [4, 5], 1, 64, 1)      # both of our ranks, quantised by the sender
    t2 = (2, 1, [5], 0, 32, 0)
    message = runtime_pb2.WeightSyncPlan(
        plan_id="3-00ff", epoch=3,
        group=runtime_pb2.TransferGroup(name="rlsched-weights-3-00ff", backend="gloo",
                                        world_size=6, address="10.0.0.1", port=29500),
        members=[4, 9], replica=1, rank_offset=4, ranks=2,
        summary=reshard_pb2.ReshardPlan(num_transfers=4, num_buckets=2, trainer_ranks=2,
                                        engine_ranks=4),
        parts=[part(4, [t0, t1]), part(5, [t1, t2])], transfers=[0, 1, 2], bytes=64 + 128 + 32)
    plan = WeightUpdate(message)
    assert plan.check() == []
    assert plan.group.address == "10.0.0.1" and plan.group.port == 29500
    assert list(plan.rank_range) == [4, 5]
    assert plan.received_transfers() == [0, 1, 2] and plan.received_bytes() == 224
    buckets = plan.buckets()
    assert sorted(buckets) == [0, 1]
    assert [(s.index, s.dtype, s.shape, s.src_rank, s.bytes) for s in buckets[0]] == [
        (0, DTYPE_BF16, (4, 8), 0, 64), (1, DTYPE_FP8_BLOCK128, (4, 8), 1, 64)]
    assert buckets[1][0].dst_param == "w.dst" and buckets[1][0].dst_ranks == (5,)
    rank_plan = plan.rank_plan(5)
    assert [t.index for t in rank_plan.transfers] == [1, 2] and rank_plan.world_size == 6
    with pytest.raises(ValueError, match="rank: 3"):
        plan.rank_plan(3)
    # A part whose stated bytes or transfers its ranks' parts do not give.
    bad = runtime_pb2.WeightSyncPlan()
    bad.CopyFrom(message)
    bad.bytes = 225
    del bad.transfers[:]
    bad.transfers.extend([0, 1])
    problems = WeightUpdate(bad).check()
    assert any("bytes: told 225" in p for p in problems), problems
    assert any("transfers: told 2" in p for p in problems), problems
    bad.CopyFrom(message)
    bad.ranks = 3
    with pytest.raises(ValueError, match="parts: 2 for 3 ranks"):
        WeightUpdate(bad)

    got = []

    class Engine(EngineWorker):
        def sync_weights(self, sync):
            got.append(sync)

    engine = Engine("unix:/nonexistent", 9, 8)
    engine._plan(message)
    assert engine.weight_plan is engine.weight_plans["3-00ff"]
    engine.on_command(orchestrator_pb2.OrchestratorCommand(
        sync_weights=orchestrator_pb2.SyncWeights(engine=9, version=2, plan_id="3-00ff")))
    engine.on_command(orchestrator_pb2.OrchestratorCommand(
        sync_weights=orchestrator_pb2.SyncWeights(engine=9, version=3)))
    assert got[0].version == 2 and got[0].plan is engine.weight_plan
    assert got[1].plan is None and got[1].interrupt is False
    with pytest.raises(ValueError, match="plan_id: '4-0000'"):
        engine.on_command(orchestrator_pb2.OrchestratorCommand(
            sync_weights=orchestrator_pb2.SyncWeights(engine=9, version=4, plan_id="4-0000")))


def test_an_engines_hello_says_what_it_holds_and_whether_it_released():
    # What a reattaching engine's Hello carries: its samples, and (colocated) that it
    # released its GPU memory, until it loads weights again.
    from rlsched.v1 import orchestrator_pb2
    from rlsched.worker import EngineWorker

    class Engine(EngineWorker):
        def dispatch(self, dispatch):
            pass

        def abort(self, abort):
            pass

        def release(self, release):
            self.released()

        def sync_weights(self, sync):
            pass

    engine = Engine("unix:/nonexistent", 1, 4, version=0)
    engine.on_command(orchestrator_pb2.OrchestratorCommand(dispatch=orchestrator_pb2.Dispatch(
        engine=1, version=0, samples=[orchestrator_pb2.SampleWork(sample=s) for s in (5, 2)])))
    hello = engine.hello()
    assert list(hello.samples) == [2, 5] and not hello.released
    engine.on_command(orchestrator_pb2.OrchestratorCommand(abort=orchestrator_pb2.Abort(
        engine=1, samples=[2, 5])))
    engine.on_command(orchestrator_pb2.OrchestratorCommand(release=orchestrator_pb2.Release(
        engine=1)))
    assert engine.hello().released
    engine.on_command(orchestrator_pb2.OrchestratorCommand(
        sync_weights=orchestrator_pb2.SyncWeights(engine=1, version=1)))
    engine.weights_loaded(1)
    hello = engine.hello()
    assert not hello.released and hello.version == 1
