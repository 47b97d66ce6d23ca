"""`rlsched simulate --config`: the config a run prints with --json, fed back, is the same
run, whichever JSON spelling it is written in; the per-step metrics add up; --calibrate
fits a measured sync run."""

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
                                "--train-seconds-per-step", "4000", "--warmup-steps", "0",
                                "--json"))
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


def test_calibrate_fits_a_measured_sync_run_and_its_config_reproduces_it(rlsched_bin, tmp_path):
    # The "measured" run: a sync colocated run of a hidden engine and trainer speed.
    truth = [*SMALL, "--steps", "3", "--colocated", "--release-seconds", "2",
             "--resume-seconds", "2", "--engine-tokens-per-second", "30,600",
             "--train-seconds-per-step", "25"]
    m = json.loads(simulate(rlsched_bin, *truth, "--json"))["runs"][0]["report"]["metrics"]
    measured = {"generation_seconds": m["generation_seconds_per_step"],
                "train_seconds": m["train_seconds_per_step"],
                "switch_seconds": m["switch_seconds_per_step"]}
    (tmp_path / "measured.json").write_text(json.dumps(measured))
    fitted = tmp_path / "fitted.json"
    # The cluster as the user knows it, without the speeds.
    cluster = [*SMALL, "--steps", "3", "--colocated"]
    report = json.loads(simulate(rlsched_bin, *cluster, "--calibrate",
                                 str(tmp_path / "measured.json"), "--config-out", str(fitted),
                                 "--json"))
    assert [f["name"] for f in report["figures"]] == ["generation_seconds", "train_seconds",
                                                      "switch_seconds"]
    for figure in report["figures"]:
        assert abs(figure.get("residual", 0)) < 1e-3, figure
    assert report.get("warnings", []) == []
    assert "engine.decode_base_seconds" in report["fitted"]
    again = json.loads(simulate(rlsched_bin, "--config", str(fitted), "--json"))
    metrics = again["runs"][0]["report"]["metrics"]
    assert metrics["generation_seconds_per_step"] == pytest.approx(
        measured["generation_seconds"], rel=1e-3)
    assert metrics["train_seconds_per_step"] == pytest.approx(measured["train_seconds"], rel=1e-3)
    text = simulate(rlsched_bin, *cluster, "--calibrate", str(tmp_path / "measured.json"))
    assert re.search(r"generation_seconds\s+\S+ s\s+\S+ s\s+[+-]0\.00%", text), text


def test_calibrate_warns_and_refuses_by_name(rlsched_bin, tmp_path):
    measured = tmp_path / "measured.json"
    measured.write_text(json.dumps({"generation_seconds": 0.001, "train_seconds": 20}))
    text = simulate(rlsched_bin, *SMALL, "--steps", "2", "--calibrate", str(measured))
    assert "warning          generation_seconds: no engine.decode_base_seconds reaches it" in text
    measured.write_text(json.dumps({"generation_seconds": 10, "train_seconds": -1}))
    done = subprocess.run([rlsched_bin, "simulate", *SMALL, "--calibrate", str(measured)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert f"--calibrate {measured}: train_seconds: must be > 0, got -1" in done.stderr
    measured.write_text(json.dumps({"generation_seconds": 10, "train_seconds": 20}))
    done = subprocess.run([rlsched_bin, "simulate", *SMALL, "--mode", "async", "--calibrate",
                           str(measured)], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "must be sync" in done.stderr, done.stderr
    measured.write_text("{not json")
    done = subprocess.run([rlsched_bin, "simulate", *SMALL, "--calibrate", str(measured)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "not a JSON rlsched.v1.MeasuredRun" in done.stderr


def test_another_mode_replaces_the_files_mode_fields(rlsched_bin, tmp_path):
    # A printed colocated sync config predicts an async run with --mode async: the file's
    # sync fields (staleness 0, strict, colocated with its release and resume) give way.
    sync = json.loads(simulate(rlsched_bin, *SMALL, "--steps", "3", "--colocated",
                               "--release-seconds", "2", "--json"))["runs"][0]["config"]
    path = tmp_path / "sync.json"
    path.write_text(json.dumps(sync))
    run = json.loads(simulate(rlsched_bin, "--config", str(path), "--mode", "async",
                              "--json"))["runs"][0]["config"]
    o = run["orchestrator"]
    assert o["mode"] == "ORCHESTRATOR_MODE_ASYNC" and not o.get("colocated", False)
    assert o["max_staleness"] == "1" and o["partial_rollout"] is True
    assert run.get("release_seconds", 0) == 0
    # The same mode keeps the file's details.
    asynchronous = json.loads(simulate(rlsched_bin, *SMALL, "--steps", "3", "--max-staleness",
                                       "2", "--json"))["runs"][0]["config"]
    path.write_text(json.dumps(asynchronous))
    run = json.loads(simulate(rlsched_bin, "--config", str(path), "--mode", "async",
                              "--json"))["runs"][0]["config"]
    assert run["orchestrator"]["max_staleness"] == "2"
