"""Client.simulate and rlsched.simulate against the real daemon."""

import json

import pytest
from google.protobuf import json_format

from rlsched import in_process
from rlsched.errors import InvalidArgumentError
from rlsched.v1 import orchestrator_pb2

SMALL = {"engines": 4, "trainer_ranks": 4, "steps": 3,
         "orchestrator": {"mode": "async", "max_staleness": 1,
                          "prompts_per_step": 8, "samples_per_prompt": 4}}


def test_one_run(client):
    reply = client.simulate(SMALL)
    assert isinstance(reply, orchestrator_pb2.SimulateReply)
    assert len(reply.runs) == 1
    run = reply.runs[0]
    assert run.config.engines == 4 and run.config.steps == 3
    c = run.report.counters
    assert c.steps_finished == 3 and c.trained == 3 * 8 * 4
    assert c.admitted == c.trained + c.filtered + c.buffered + c.queued + c.in_flight
    m = run.report.metrics
    # The admission policy (async's default) keeps every token: nothing discarded for
    # staleness; the response tokens are fewer than the prompt + response tokens.
    assert c.stale_restarts == 0 and c.stale_discarded_tokens == 0
    assert 0 < sum(m.token_staleness_histogram) < c.trained_tokens
    assert sum(m.staleness_histogram) == c.trained
    assert 0 < m.samples_per_second <= run.report.ideal_samples_per_second * 1.0001
    assert run.report.trace_json == ""
    # Deterministic: the same request gives the same reply.
    assert client.simulate(SMALL) == reply


def test_compare_and_trace(client):
    # compare gives each run its mode, staleness and partial rollout.
    config = dict(SMALL, trace=True,
                  orchestrator={"prompts_per_step": 8, "samples_per_prompt": 4})
    reply = client.simulate(config, compare=True, trace_run="sync")
    names = [run.name for run in reply.runs]
    # colocated sync on the same 8 GPUs first, then the six.
    assert names == ["colocated_sync", "sync", "one_step_off", "async_s1_partial",
                     "async_s1", "async_s2_partial", "async_s2"]
    trace = json.loads(reply.runs[1].report.trace_json)
    assert trace["traceEvents"]
    assert all(run.report.trace_json == "" for run in reply.runs if run.name != "sync")
    colocated = reply.runs[0].config
    assert colocated.orchestrator.colocated and colocated.engines == 8
    assert colocated.trainer_ranks == 8
    by_name = {run.name: run.report for run in reply.runs}
    for name, report in by_name.items():
        # sync and one_step_off keep their bound (strict); the async runs use the
        # admission policy and discard no token for staleness.
        if name in ("colocated_sync", "sync", "one_step_off"):
            assert report.metrics.max_staleness <= (1 if name == "one_step_off" else 0), name
        assert report.counters.stale_discarded_tokens == 0, name


def test_strict_policy_keeps_the_bound(client):
    config = dict(SMALL, orchestrator=dict(SMALL["orchestrator"], staleness_policy="strict"))
    report = client.simulate(config).runs[0].report
    assert report.metrics.max_staleness <= 1
    assert report.counters.stale_restarts <= report.counters.restarts


def test_invalid_config_names_the_field(client):
    with pytest.raises(InvalidArgumentError) as info:
        client.simulate({"engines": 0})
    assert info.value.field == "simulate.config.engines"
    with pytest.raises(InvalidArgumentError) as info:
        client.simulate({"max_events": 10})
    assert info.value.field == "simulate.config.max_events"
    assert client.ping()  # the daemon keeps serving


def test_async_fields_select_async_or_are_refused(client):
    small = {"engines": 4, "trainer_ranks": 4, "steps": 2,
             "orchestrator": {"max_staleness": 2, "prompts_per_step": 8,
                              "samples_per_prompt": 4}}
    options = client.simulate(small).runs[0].config.orchestrator
    assert options.mode == orchestrator_pb2.ORCHESTRATOR_MODE_ASYNC
    assert options.max_staleness == 2 and options.partial_rollout
    sync = dict(small, orchestrator=dict(small["orchestrator"], mode="sync"))
    with pytest.raises(InvalidArgumentError) as info:
        client.simulate(sync)
    assert info.value.field == "simulate.config.orchestrator.max_staleness"
    assert "applies to mode async only" in str(info.value)
    with pytest.raises(InvalidArgumentError) as info:
        client.simulate(SMALL, compare=True)
    assert info.value.field == "simulate.config.orchestrator.mode"


def test_fraction_policy_and_streaming(client):
    config = dict(SMALL, orchestrator={"staleness_policy": "fraction", "staleness_fraction": 1.5,
                                       "train_calls_per_sync": 2, "prompts_per_step": 8,
                                       "samples_per_prompt": 4},
                  decode_speed={"single_tokens_per_second": 40, "full_tokens_per_second": 200},
                  train_seconds_per_step=20)
    run = client.simulate(config).runs[0]
    options = run.config.orchestrator
    assert options.mode == orchestrator_pb2.ORCHESTRATOR_MODE_ASYNC
    assert options.staleness_policy == orchestrator_pb2.STALENESS_POLICY_FRACTION
    assert options.staleness_fraction == 1.5 and options.max_staleness == 2
    assert options.train_calls_per_sync == 2
    assert run.config.decode_speed.single_tokens_per_second == pytest.approx(40)
    assert run.config.decode_speed.full_tokens_per_second == pytest.approx(200)
    assert not run.config.HasField("train_seconds_per_step")
    c = run.report.counters
    assert c.steps_finished == 3 and c.trained == 3 * 8 * 4
    # The fraction policy discards nothing for staleness.
    assert c.stale_restarts == 0 and c.stale_discarded_tokens == 0
    assert run.report.metrics.max_staleness <= 2
    # staleness_fraction alone selects async with the fraction policy.
    implied = dict(SMALL, orchestrator={"staleness_fraction": 0.5, "prompts_per_step": 8,
                                        "samples_per_prompt": 4})
    options = client.simulate(implied).runs[0].config.orchestrator
    assert options.mode == orchestrator_pb2.ORCHESTRATOR_MODE_ASYNC
    assert options.staleness_policy == orchestrator_pb2.STALENESS_POLICY_FRACTION


def test_new_fields_that_do_not_apply_are_refused(client):
    sync = dict(SMALL, orchestrator=dict(SMALL["orchestrator"], mode="sync",
                                         max_staleness=0, staleness_fraction=0.5))
    with pytest.raises(InvalidArgumentError) as info:
        client.simulate(sync)
    assert info.value.field == "simulate.config.orchestrator.staleness_fraction"
    colocated = dict(SMALL, orchestrator=dict(SMALL["orchestrator"], colocated=True))
    with pytest.raises(InvalidArgumentError) as info:
        client.simulate(colocated)
    assert info.value.field == "simulate.config.orchestrator.colocated"
    with pytest.raises(InvalidArgumentError) as info:
        client.simulate(dict(SMALL, release_seconds=2))
    assert info.value.field == "simulate.config.release_seconds"
    with pytest.raises(InvalidArgumentError) as info:
        client.simulate(dict(SMALL, train_seconds_per_step=10, seconds_per_cost_unit=1e-3))
    assert info.value.field == "simulate.config.train_seconds_per_step"
    with pytest.raises(InvalidArgumentError) as info:
        client.simulate({"orchestrator": {"staleness_policy": "fractional"}})
    assert info.value.field == "simulate.config.orchestrator.staleness_policy"
    assert "fraction" in str(info.value)
    ok = dict(SMALL, orchestrator={"colocated": True, "prompts_per_step": 8,
                                   "samples_per_prompt": 4},
              release_seconds=1, resume_seconds=2)
    run = client.simulate(ok).runs[0]
    assert run.config.orchestrator.mode == orchestrator_pb2.ORCHESTRATOR_MODE_SYNC
    assert run.config.orchestrator.colocated and run.config.resume_seconds == 2


def test_calibrate_through_the_daemon_and_in_process(client):
    sync = dict(SMALL, orchestrator={"mode": "sync", "prompts_per_step": 8,
                                     "samples_per_prompt": 4})
    measured_run = client.simulate(dict(sync, decode_speed={"single_tokens_per_second": 30,
                                                            "full_tokens_per_second": 400}))
    m = measured_run.runs[0].report.metrics
    measured = {"generation_seconds": m.generation_seconds_per_step,
                "train_seconds": m.train_seconds_per_step}
    report = client.calibrate(measured, sync)
    assert isinstance(report, orchestrator_pb2.CalibrationReport)
    assert [f.name for f in report.figures] == ["generation_seconds", "train_seconds"]
    assert all(abs(f.residual) < 1e-3 for f in report.figures), report.figures
    assert "engine.decode_base_seconds" in report.fitted and not report.warnings
    # The fitted config reproduces the measured figures.
    again = client.simulate(json_format.MessageToDict(report.config,
                                                      preserving_proto_field_name=True))
    assert again.runs[0].report.metrics.generation_seconds_per_step == pytest.approx(
        measured["generation_seconds"], rel=1e-3)
    if in_process.available():
        assert in_process.InProcessClient().calibrate(measured, sync) == report
    with pytest.raises(InvalidArgumentError) as error:
        client.calibrate({"generation_seconds": 1, "train_seconds": -1}, sync)
    assert error.value.field == "calibrate.measured.train_seconds"
    with pytest.raises(InvalidArgumentError) as error:
        client.calibrate(measured, dict(sync, engines=0))
    assert error.value.field == "calibrate.config.engines"


def test_even_split_keeps_engines_to_their_share(client):
    # Sync, 8 engines of 16 slots for 64 x 8 samples: with the load rule an engine that
    # is done early takes the others' queued samples; split evenly it waits, so the step
    # is longer. The same reply through the daemon and in process.
    config = {"engines": 8, "steps": 4, "engine": {"max_concurrent": 16},
              "orchestrator": {"mode": "sync", "prompts_per_step": 64, "samples_per_prompt": 8}}
    even = dict(config, orchestrator=dict(config["orchestrator"], even_split=True))
    load_run, even_run = client.simulate(config).runs[0], client.simulate(even).runs[0]
    assert not load_run.config.orchestrator.even_split and even_run.config.orchestrator.even_split
    assert even_run.report.counters.trained == load_run.report.counters.trained == 4 * 64 * 8
    load_m, even_m = load_run.report.metrics, even_run.report.metrics
    assert even_m.generation_seconds_per_step > 1.05 * load_m.generation_seconds_per_step
    if in_process.available():
        assert in_process.InProcessClient().simulate(even).runs[0] == even_run
