"""rlsched.Orchestrator: the decision core driven in process.

A seeded discrete-event driver (_orchestrator_driver.py) plays engines and trainer on
random durations, lengths, rewards and engine failures, for each mode and policy; after
every event the core's invariants hold and its counters conserve samples (admitted =
trained + filtered + buffered + queued + in_flight); no sample is trained twice or after
its group was filtered; the runs end with the steps asked for. Also: a hand-made run
with its exact commands, the config forms (dict, JSON text, message), bad configs and
events raising InvalidArgumentError naming the field (the core unchanged), batch
handling equal to one-by-one, determinism, and the step plan a start_train carries.
Skipped when the native module lacks the wire library.
"""

import json

import pytest

import rlsched
from rlsched import orchestrator as orchestrator_module

pytestmark = pytest.mark.skipif(
    not orchestrator_module.available(),
    reason="rlsched._native was built without the wire library (or not at all)")

# Imported after the skip mark above (noqa: E402).
from _orchestrator_driver import Driver  # noqa: E402
from rlsched.v1 import balance_pb2, orchestrator_pb2  # noqa: E402


def _config(mode, steps=4, prompts=3, samples=2, **orchestrator):
    options = {"prompts_per_step": prompts, "samples_per_prompt": samples}
    if mode is not None:
        options["mode"] = mode
    options.update(orchestrator)
    return {"orchestrator": options, "steps": steps}


# The config is validated as `rlsched run` validates it: the filter needs groups whose
# rewards can be all equal in the workload (all_equal_rate > 0), a step cap the
# workload's lengths (lengths.*) fit.
CONFIGS = {
    "sync": _config("ORCHESTRATOR_MODE_SYNC"),
    "one_step_off": _config("ORCHESTRATOR_MODE_ONE_STEP_OFF"),
    "async_s1_partial": _config("ORCHESTRATOR_MODE_ASYNC", max_staleness=1,
                                partial_rollout=True),
    "async_s2_no_partial": _config("ORCHESTRATOR_MODE_ASYNC", max_staleness=2,
                                   partial_rollout=False),
    "async_s1_abort": _config("ORCHESTRATOR_MODE_ASYNC", max_staleness=1,
                              pause_mode="PAUSE_MODE_ABORT"),
    "async_strict_oversample_filter": _config(
        "ORCHESTRATOR_MODE_ASYNC", max_staleness=1, staleness_policy="STALENESS_POLICY_STRICT",
        oversample=0.5, filter_all_equal=True, samples=3),
    "async_fraction": _config(None, staleness_fraction=0.5, prompts=4),
    "async_streaming": _config("ORCHESTRATOR_MODE_ASYNC", max_staleness=1, prompts=4,
                               train_calls_per_sync=2),
    "colocated": _config(None, colocated=True),
    "async_fifo_group_cap": _config("ORCHESTRATOR_MODE_ASYNC", max_staleness=1,
                                    longest_first=False, max_generating_groups=2),
}
CONFIGS["async_strict_oversample_filter"]["all_equal_rate"] = 0.25
# The staleness bound each config trains within (None: admission, no bound on tokens).
BOUND = {"sync": 0, "colocated": 0, "one_step_off": 1, "async_strict_oversample_filter": 1}


def _checked_run(config, seed, **driver_args):
    core = rlsched.Orchestrator(config)
    trained = []
    size = core.config.orchestrator.samples_per_prompt

    def check(event, commands):
        core.check_invariants()
        c = core.counters()
        assert c.admitted == c.trained + c.filtered + c.buffered + c.queued + c.in_flight, c
        assert c.admitted == c.admitted_groups * size
        for command in commands:
            if command.WhichOneof("kind") == "start_train":
                samples = list(command.start_train.samples)
                assert samples == sorted(samples)
                assert len(command.start_train.lengths) == len(samples)
                assert {s // size for s in samples} == set(command.start_train.groups)
                trained.extend(samples)

    driver = Driver(core, seed, on_event=check, **driver_args).run()
    return core, driver, trained


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("seed", range(1, 7))
def test_random_runs_conserve_samples_and_keep_invariants(name, seed):
    config = dict(CONFIGS[name], steps=6)
    # Engine failures (and re-joins) in half the runs; 2 to 4 engines of 2 to 5 slots.
    failure_rate = (0.0, 0.03, 0.08)[(seed - 1) // 2]
    core, driver, trained = _checked_run(config, seed, failure_rate=failure_rate,
                                         engines=2 + seed % 3, max_concurrent=2 + seed % 4)
    steps = config["steps"]
    options = config["orchestrator"]
    per_step = options["prompts_per_step"] * options["samples_per_prompt"]
    c = core.counters()
    assert core.done, (name, seed, c)
    assert c.steps_finished == steps and core.latest_version == steps
    # Each step trains P complete groups, every sample once.
    assert c.trained == steps * per_step == len(trained)
    assert len(set(trained)) == len(trained)
    assert c.trained_groups * options["samples_per_prompt"] == c.trained
    assert c.engine_failures == sum(1 for e, _ in driver.log if "engine_failed" in e)
    # The filter: a group whose samples' rewards (their last finish) are all equal is
    # never trained with filter_all_equal, and counted as filtered; without it, trained.
    size = options["samples_per_prompt"]
    rewards = {}
    for event, commands in driver.log:
        if "generation_finished" in event:
            finished = event["generation_finished"]
            rewards[finished["sample"]] = finished["reward"]
        for command in commands:  # a finished sample generated again (a restart)
            if command.WhichOneof("kind") == "dispatch":
                for work in command.dispatch.samples:
                    rewards.pop(work.sample, None)
    trained_groups = {s // size for s in trained}
    equal = {g for g in trained_groups | {s // size for s in rewards}
             if all(g * size + i in rewards for i in range(size))
             and len({rewards[g * size + i] for i in range(size)}) == 1}
    if options.get("filter_all_equal"):
        assert not equal & trained_groups
        assert equal and c.filtered_groups == len(equal) and c.filtered == len(equal) * size
    else:
        assert c.filtered == 0
    metrics = core.metrics()
    assert sum(metrics.staleness_histogram) == c.trained
    if name in BOUND:
        assert metrics.max_staleness <= BOUND[name], (name, list(metrics.staleness_histogram))
    report = core.report()
    assert report.events == core.events == len(driver.log)
    assert report.rejected_events == 0 and report.done
    assert report.counters == c
    # Sync weights with interrupt only where partial rollout is on.
    interrupts = [cmd for _, cmds in driver.log for cmd in cmds
                  if cmd.WhichOneof("kind") == "sync_weights" and cmd.sync_weights.interrupt]
    if name in ("sync", "one_step_off", "colocated", "async_s2_no_partial"):
        assert not interrupts
    # Pause mode abort: the interrupts say so and nothing is resumed in place (the
    # paused samples come back through dispatch).
    aborting = name == "async_s1_abort"
    assert all((cmd.sync_weights.pause == orchestrator_pb2.PAUSE_MODE_ABORT) == aborting
               for cmd in interrupts)
    resumes = [cmd for _, cmds in driver.log for cmd in cmds if cmd.WhichOneof("kind") == "resume"]
    if aborting:
        reported = sum(len(event["generation_paused"].get("samples", []))
                       for event, _ in driver.log if "generation_paused" in event)
        # Each reported sample goes back to its engine, unless that engine failed first.
        assert not resumes and 0 < c.resubmitted <= reported
        assert c.engine_failures > 0 or c.resubmitted == reported
    else:
        assert c.resubmitted == 0
    if name == "colocated":
        assert any(cmd.WhichOneof("kind") == "release" for _, cmds in driver.log for cmd in cmds)


def test_the_last_batch_is_the_last_start_train():
    core, driver, _ = _checked_run(CONFIGS["async_s1_partial"], 5)
    last = [cmd.start_train for _, cmds in driver.log for cmd in cmds
            if cmd.WhichOneof("kind") == "start_train"][-1]
    batch = core.last_batch()
    assert [s.sample for s in batch] == list(last.samples)
    for sample, length in zip(batch, last.lengths):
        assert sample.spans and sample.spans[0][1] == 0
        assert [v for v, _ in sample.spans] == sorted({v for v, _ in sample.spans})
        assert 0 < sample.response_tokens < length


def test_same_events_same_commands_and_batches_equal_single_events():
    config = CONFIGS["async_strict_oversample_filter"]
    _, first, _ = _checked_run(config, 11, failure_rate=0.02)
    _, second, _ = _checked_run(config, 11, failure_rate=0.02)

    def serialized(log):
        return [(json.dumps(e, sort_keys=True), [c.SerializeToString() for c in cmds])
                for e, cmds in log]

    assert serialized(first.log) == serialized(second.log)
    # The recorded events through handle_many on a fresh core: the same commands.
    replay = rlsched.Orchestrator(config)
    answered = replay.handle_many([e for e, _ in first.log])
    assert [[c.SerializeToString() for c in cmds] for cmds in answered] == \
        [[c.SerializeToString() for c in cmds] for _, cmds in first.log]
    # And as messages and as bytes.
    again = rlsched.Orchestrator(config)
    for i, (event, commands) in enumerate(first.log):
        (kind, fields), = event.items()
        message = orchestrator_module._make_event(kind, fields)
        given = message if i % 2 else message.SerializeToString()
        assert again.handle(given) == commands
    assert again.counters() == replay.counters()


def _commands(commands):
    out = []
    for c in commands:
        kind = c.WhichOneof("kind")
        body = getattr(c, kind)
        if kind == "dispatch":
            out.append(("dispatch", body.engine, body.version,
                        [(w.sample, w.group, w.prompt, w.prompt_tokens, w.resume_from)
                         for w in body.samples]))
        elif kind == "sync_weights":
            out.append(("sync_weights", body.engine, body.version, body.interrupt))
        elif kind == "start_train":
            out.append(("start_train", body.step, body.call, list(body.groups),
                        list(body.samples), list(body.lengths)))
        else:
            out.append((kind, body))
    return out


def test_a_sync_run_by_hand():
    # One engine without weights, P = 1 prompt x G = 2 samples, two steps.
    core = rlsched.Orchestrator(_config("ORCHESTRATOR_MODE_SYNC", steps=2, prompts=1))
    # The engine holds no weights (version -1; the wire's default, 0, is the initial
    # policy): the core loads version 0 on it.
    assert _commands(core.engine_joined(time=0, engine=0, max_concurrent=4, version=-1)) == \
        [("sync_weights", 0, 0, False)]
    assert core.prompts_available(time=0, prompts=[(7, 100), (8, 50)]) == []
    # Weights loaded: prompt 7's group (group 0: samples 0 and 1) generates.
    assert _commands(core.weights_loaded(time=1, engine=0, version=0)) == \
        [("dispatch", 0, 0, [(0, 0, 7, 100, 0), (1, 0, 7, 100, 0)])]
    assert core.generation_finished(time=2, sample=1, tokens=30, reward=1.0) == []
    c = core.counters()
    assert (c.admitted, c.in_flight, c.buffered) == (2, 1, 1)
    # The group completes: step 0 trains it (lengths: prompt + response tokens); sync
    # mode admits nothing more until version 1 exists.
    assert _commands(core.generation_finished(time=3, sample=0, tokens=20, reward=0.0)) == \
        [("start_train", 0, 0, [0], [0, 1], [120, 130])]
    assert [(s.sample, s.response_tokens, s.spans) for s in core.last_batch()] == \
        [(0, 20, [(0, 0)]), (1, 30, [(0, 0)])]
    # The step ends: version 1 goes to the idle engine, then prompt 8's group runs.
    assert _commands(core.train_step_finished(time=5, step=0, call=0)) == \
        [("sync_weights", 0, 1, False)]
    assert core.latest_version == 1 and not core.done
    assert _commands(core.weights_loaded(time=6, engine=0, version=1)) == \
        [("dispatch", 0, 1, [(2, 1, 8, 50, 0), (3, 1, 8, 50, 0)])]
    core.generation_finished(time=7, sample=2, tokens=5, reward=1.0)
    assert _commands(core.generation_finished(time=8, sample=3, tokens=6, reward=1.0)) == \
        [("start_train", 1, 0, [1], [2, 3], [55, 56])]
    core.train_step_finished(time=9, step=1, call=0)
    assert core.done
    c = core.counters()
    assert (c.trained, c.trained_tokens, c.steps_finished) == (4, 361, 2)
    m = core.metrics(now=10)
    assert m.elapsed_seconds == 10 and m.samples_per_second == pytest.approx(0.4)
    core.check_invariants()


def test_config_forms_agree():
    config = CONFIGS["async_s1_partial"]
    message = orchestrator_pb2.SimulatorConfig()
    message.orchestrator.mode = orchestrator_pb2.ORCHESTRATOR_MODE_ASYNC
    message.orchestrator.max_staleness = 1
    message.orchestrator.partial_rollout = True
    message.orchestrator.prompts_per_step = 3
    message.orchestrator.samples_per_prompt = 2
    message.steps = 4
    as_dict = rlsched.Orchestrator(config).config
    assert rlsched.Orchestrator(json.dumps(config)).config == as_dict
    assert rlsched.Orchestrator(message).config == as_dict
    assert as_dict.orchestrator.prompts_per_step == 3 and as_dict.steps == 4
    # camelCase keys are the JSON mapping's too; None is the default config.
    camel = {"orchestrator": {"mode": "ORCHESTRATOR_MODE_ASYNC", "maxStaleness": 1,
                              "partialRollout": True, "promptsPerStep": 3,
                              "samplesPerPrompt": 2}, "steps": 4}
    assert rlsched.Orchestrator(camel).config == as_dict
    assert rlsched.Orchestrator().config == rlsched.Orchestrator({}).config


@pytest.mark.parametrize("config,field,text", [
    ({"orchestrator": {"prompts_per_step": 0}}, "orchestrator.prompts_per_step", "got 0"),
    ({"orchestrator": {"mode": "ORCHESTRATOR_MODE_SYNC", "max_staleness": 2}},
     "orchestrator.max_staleness", "async"),
    ({"orchestrator": {"samples_per_prompt": -1}}, "orchestrator.samples_per_prompt", "-1"),
    ({"steps": -3}, "steps", "-3"),
    ({"orchestrator": {"mode": "FAST"}}, "config", "FAST"),
    ({"no_such_field": 1}, "config", "no_such_field"),
    ("{not json", "config", "JSON"),
    (42, "config", "int"),
    ({"x": float("nan")}, "config", "JSON"),
])
def test_bad_config_names_the_field(config, field, text):
    with pytest.raises(rlsched.InvalidArgumentError) as info:
        rlsched.Orchestrator(config)
    assert info.value.field == field
    assert str(info.value.message).startswith(field + ":") and text in info.value.message


def _started(config=None):
    core = rlsched.Orchestrator(config or _config("ORCHESTRATOR_MODE_SYNC", prompts=1))
    core.engine_joined(time=0, engine=0, max_concurrent=2, version=0)
    core.prompts_available(time=0, prompts=[(1, 10)])
    return core


@pytest.mark.parametrize("kind,fields,field", [
    ("generation_finished", {"time": 1, "sample": 99, "tokens": 5}, "generation_finished.sample"),
    ("generation_finished", {"time": -1, "sample": 0, "tokens": 5}, "generation_finished.time"),
    ("generation_finished", {"time": 1, "sample": 0, "tokens": 5, "reward": float("inf")},
     "generation_finished.reward"),
    ("engine_joined", {"time": 1, "engine": 0}, "engine_joined.engine"),
    ("engine_joined", {"time": 1, "engine": 1, "max_concurrent": 0},
     "engine_joined.max_concurrent"),
    ("engine_left", {"time": 1, "engine": 5}, "engine_left.engine"),
    ("train_step_finished", {"time": 1, "step": 0}, "train_step_finished.step"),
    ("weights_loaded", {"time": 1, "engine": 3, "version": 0}, "weights_loaded.engine"),
    ("generation_paused", {"time": 1, "engine": 0, "version": 1}, "generation_paused.engine"),
    ("prompts_available", {"time": 1, "prompts": [(2, -5)]},
     "prompts_available.prompts.prompt_tokens"),
])
def test_bad_events_name_the_field_and_leave_the_core_unchanged(kind, fields, field):
    core = _started()
    before = (core.counters(), core.events, core.last_time)
    with pytest.raises(rlsched.InvalidArgumentError) as info:
        getattr(core, kind)(**fields)
    assert isinstance(info.value, ValueError)
    assert info.value.field == field, info.value
    assert info.value.message.startswith(field + ":")
    assert (core.counters(), core.events, core.last_time) == before
    assert core.rejected_events == 1
    core.check_invariants()
    # The core goes on: sample 0 finishes normally.
    assert core.generation_finished(time=2, sample=0, tokens=3, reward=1.0) == []


@pytest.mark.parametrize("event,field", [
    ({}, "event"),
    ({"engine_joined": {}, "engine_left": {}}, "event"),
    ({"engine_exploded": {"time": 1}}, "event"),
    ({"engine_joined": {"time": 1, "colour": 3}}, "event.engine_joined"),
    ({"engine_joined": 5}, "event.engine_joined"),
    ({"prompts_available": {"time": 1, "prompts": [(1, 2, 3)]}},
     "event.prompts_available.prompts[0]"),
    (b"\xff\xff", "event"),
    (orchestrator_pb2.OrchestratorEvent(), "event.kind"),
    (3.5, "event"),
])
def test_malformed_events_name_the_field(event, field):
    core = _started()
    with pytest.raises(rlsched.InvalidArgumentError) as info:
        core.handle(event)
    assert info.value.field == field, info.value
    core.check_invariants()


def test_a_batch_stops_at_the_refused_event():
    core = _started()
    events = [{"generation_finished": {"time": 1, "sample": 0, "tokens": 4, "reward": 1}},
              {"generation_finished": {"time": 2, "sample": 0, "tokens": 4, "reward": 1}},
              {"generation_finished": {"time": 3, "sample": 1, "tokens": 4, "reward": 1}}]
    with pytest.raises(rlsched.InvalidArgumentError) as info:
        core.handle_many(events)
    assert info.value.field == "events[1].generation_finished.sample"
    assert info.value.handled == 1 and info.value.commands == [[]]
    assert core.events == 5 - 2 and core.counters().buffered == 1
    # The rest goes on from there.
    answered = core.handle_many(events[2:])
    assert [c.WhichOneof("kind") for c in answered[0]] == ["start_train"]


def test_metrics_before_the_last_event_are_refused():
    core = _started()
    core.generation_finished(time=4, sample=0, tokens=3, reward=1.0)
    with pytest.raises(rlsched.InvalidArgumentError) as info:
        core.metrics(now=3)
    assert info.value.field == "now"
    assert core.metrics(now=5).elapsed_seconds == 5
    assert core.metrics().elapsed_seconds == 4


def test_start_train_carries_the_step_plan():
    config = _config("ORCHESTRATOR_MODE_ASYNC", max_staleness=1, prompts=4, samples=4)
    config.update({"trainer_ranks": 3, "step": {"max_tokens_per_micro_batch": 700},
                   "lengths": {"max_tokens": 400, "min_prompt_tokens": 10,
                               "max_prompt_tokens": 200}})
    core = rlsched.Orchestrator(config, plan_steps=True)
    driver = Driver(core, 21, response_tokens=(1, 400), prompt_tokens=(10, 200)).run()
    starts = [cmd.start_train for _, cmds in driver.log for cmd in cmds
              if cmd.WhichOneof("kind") == "start_train"]
    assert len(starts) == 4
    for start in starts:
        plan = start.plan
        assert len(plan.ranks) == 3
        placed = sorted(i for r in plan.ranks for m in r.micro_batches for i in m.indices)
        assert placed == list(range(len(start.samples)))
        for rank in plan.ranks:
            for m in rank.micro_batches:
                assert sum(start.lengths[i] for i in m.indices) <= 700
        # The same plan as the step planner's on those lengths and groups, with the
        # config's step options (its cost model: attention coefficients).
        step = core.config.step
        assert step.cost.kind == balance_pb2.COST_KIND_ATTENTION
        groups = [s // 4 for s in start.samples]
        expected = rlsched.plan_step_indices(
            list(start.lengths), 3, 700, groups=groups, equal_size=step.equal_size,
            keep_groups=step.keep_groups, cost=step.cost, order=step.order,
            refine_iterations=step.refine_iterations,
            overhead=step.overhead if step.HasField("overhead") else None,
            min_micro_batches=step.min_micro_batches,
            micro_batches_multiple_of=step.micro_batches_multiple_of,
            pad_to_multiple_of=step.pad_to_multiple_of,
            pipeline_model_parallel_size=step.pipeline_stages)
        assert [[list(m.indices) for m in r.micro_batches] for r in plan.ranks] == expected
    # Without plan_steps none is attached.
    plain = Driver(rlsched.Orchestrator(config), 21, response_tokens=(1, 400),
                   prompt_tokens=(10, 200)).run()
    assert not any(cmd.start_train.HasField("plan") for _, cmds in plain.log for cmd in cmds
                   if cmd.WhichOneof("kind") == "start_train")


def test_calls_from_two_threads_at_once_raise_instead_of_racing():
    import threading
    config = CONFIGS["async_s1_partial"]
    recorded = Driver(rlsched.Orchestrator(config), 31).run()
    events = [e for e, _ in recorded.log]
    core = rlsched.Orchestrator(config)
    stop = threading.Event()
    refused = []

    def read():
        while not stop.is_set():
            try:
                c = core.counters()
                assert c.admitted == c.trained + c.filtered + c.buffered + c.queued + c.in_flight
            except RuntimeError as error:
                assert "two threads" in str(error)
                refused.append(error)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        handled = 0
        while handled < len(events):
            try:
                core.handle_many(events[handled:handled + 1])
                handled += 1
            except RuntimeError as error:
                assert "two threads" in str(error)
    finally:
        stop.set()
        reader.join()
    assert core.counters() == recorded.core.counters()
    core.check_invariants()
