"""`rlsched simulate --config`: the config a run prints with --json, fed back, is the same
run, whichever JSON spelling it is written in; and the per-step metrics add up."""

import json
import re
import subprocess

import pytest

SMALL = ["--engines", "4", "--trainer-ranks", "4", "--prompts-per-step", "16",
         "--samples-per-prompt", "4"]

FLAG_SETS = [
    [],
    ["--mode", "async", "--max-staleness", "2", "--no-partial-rollout"],
    ["--mode", "async", "--staleness-policy", "fraction", "--staleness-fraction", "0.5",
     "--filter-all-equal", "--all-equal-rate", "0.2", "--oversample", "0.25"],
    ["--colocated", "--release-seconds", "3", "--resume-seconds", "2", "--warmup-steps", "0"],
    ["--engine-tokens-per-second", "40,500", "--train-seconds-per-step", "20",
     "--train-call-overhead-seconds", "0.5", "--gpus-per-engine", "2", "--dispatch", "arrival"],
    ["--mode", "one_step_off", "--length-dist", "lognormal:6,1,4096", "--mtbf", "2000",
     "--seed", "7"],
    ["--compare"],
]


def simulate(rlsched_bin, *args):
    done = subprocess.run([rlsched_bin, "simulate", *args], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def camel(value):
    """The same JSON with lowerCamelCase keys (protobuf's other JSON spelling)."""
    if isinstance(value, dict):
        return {re.sub(r"_([a-z])", lambda m: m.group(1).upper(), k): camel(v)
                for k, v in value.items()}
    if isinstance(value, list):
        return [camel(v) for v in value]
    return value


@pytest.mark.parametrize("flags", FLAG_SETS, ids=lambda f: " ".join(f) or "defaults")
@pytest.mark.parametrize("spelling", ["as printed", "lowerCamelCase"])
def test_a_printed_config_fed_back_is_the_same_run(rlsched_bin, tmp_path, flags, spelling):
    reply = json.loads(simulate(rlsched_bin, *SMALL, "--steps", "3", *flags, "--json"))
    for run in reply["runs"]:
        config = run["config"] if spelling == "as printed" else camel(run["config"])
        path = tmp_path / f"{run['name']}.json"
        path.write_text(json.dumps(config))
        again = json.loads(simulate(rlsched_bin, "--config", str(path), "--json"))["runs"]
        assert len(again) == 1
        assert again[0]["config"] == run["config"], run["name"]
        assert again[0]["report"] == run["report"], run["name"]


def test_the_help_says_which_spellings_config_takes(rlsched_bin):
    text = " ".join(simulate(rlsched_bin, "--help").split())
    assert "--config FILE" in text
    assert "snake_case (as --json prints them) or lowerCamelCase" in text
    assert "a run's config from --json, fed back, is the same run" in text


@pytest.mark.parametrize("flags", [[], ["--colocated", "--release-seconds", "4"],
                                   ["--train-calls-per-sync", "2"]],
                         ids=["sync", "colocated", "streamed"])
def test_a_sync_steps_time_is_its_generation_switch_and_training(rlsched_bin, flags):
    reply = json.loads(simulate(rlsched_bin, *SMALL, "--steps", "3", *flags, "--warmup-steps", "0",
                                "--json"))
    m = reply["runs"][0]["report"]["metrics"]
    parts = (m["generation_seconds_per_step"] + m["switch_seconds_per_step"]
             + m["train_seconds_per_step"])
    if "--train-calls-per-sync" in flags:  # streamed: the first call trains while the
        # rest generates, so the parts overlap
        assert parts > m["steady_seconds_per_step"]
    else:
        assert parts == pytest.approx(m["steady_seconds_per_step"], rel=1e-9)
    assert m["steady_seconds_per_step"] == pytest.approx(m["seconds_per_step"], rel=1e-9)
    if "--release-seconds" in flags:
        assert m["switch_seconds_per_step"] >= 4


def test_generation_excludes_the_wait_for_the_trainer(rlsched_bin):
    # one_step_off: a batch that finished generating waits for the trainer; the engines'
    # own generation time leaves that out, the older mean_generation_seconds keeps it.
    reply = json.loads(simulate(rlsched_bin, *SMALL, "--steps", "3", "--mode", "one_step_off",
                                "--train-seconds-per-step", "4000", "--json"))
    report = reply["runs"][0]["report"]
    m = report["metrics"]
    assert 0 < m["generation_seconds_per_step"] < report["mean_generation_seconds"]
    assert m.get("switch_seconds_per_step", 0) == 0
    assert m["train_seconds_per_step"] == pytest.approx(report["mean_train_seconds"])


def test_the_steady_state_leaves_out_the_warm_up(rlsched_bin):
    def steady(warmup):
        reply = json.loads(simulate(rlsched_bin, *SMALL, "--steps", "5", "--mode", "async",
                                    "--warmup-steps", str(warmup), "--json"))
        return reply["runs"][0]["report"]["metrics"].get("steady_seconds_per_step", 0)
    assert steady(0) > 0 and steady(2) > 0
    assert steady(5) == 0  # no step past the warm-up
    assert steady(0) != steady(2)
