"""`rlsched run --resume`: a scheduler killed with SIGKILL at a seeded random moment,
resumed from its event log, with real emulated worker processes that outlive it and
reattach (sync, colocated sync, one_step_off and async runs; in some seeds a random
engine is killed too). Every run finishes its steps; the trainer (its own list) trains every sample
once; the log (the first life's records and the resumed one's) replays to the same
commands; the versions the engines were synced to only go up.

Twelve runs by default (python.resume); RLSCHED_THOROUGH=1 runs 104 (python.resume.thorough).
RLSCHED_RESUME_TIMES=FILE appends a line per run: mode, seed, the seconds until the
workers were back (or "window"), the resume's seconds, and the engines that reattached
having released their memory.
"""

import json
import os
import random
import re
import signal
import subprocess
import time

import pytest

from test_run import _log_records  # the event log's records, as test_run reads them

_THOROUGH = os.environ.get("RLSCHED_THOROUGH") == "1"
_SEEDS = range(26) if _THOROUGH else range(3)  # x 4 modes: 104 runs, or 12
_MODES = {
    "sync": {"mode": "ORCHESTRATOR_MODE_SYNC"},
    "colocated": {"mode": "ORCHESTRATOR_MODE_SYNC", "colocated": True},
    "one_step_off": {"mode": "ORCHESTRATOR_MODE_ONE_STEP_OFF"},
    "async": {"mode": "ORCHESTRATOR_MODE_ASYNC", "max_staleness": 1, "partial_rollout": True},
}
_ENGINES = 3
_STEPS = 4
_PROMPTS, _SAMPLES = 8, 4


def _config(tmp_path, mode):
    config = {
        "orchestrator": dict(_MODES[mode], prompts_per_step=_PROMPTS, samples_per_prompt=_SAMPLES),
        "steps": _STEPS, "engines": _ENGINES, "engine": {"max_concurrent": 8},
        "trainer_ranks": 2, "train_seconds_per_step": 20, "weight_sync_seconds": 1,
        "lengths": {"mu": 5.0, "sigma": 1.0, "max_tokens": 2048},
    }
    path = tmp_path / "run.json"
    path.write_text(json.dumps(config))
    return str(path)


def _engines(pid):
    """The emulated engines the run `pid` started (its children with --role engine)."""
    return [child for child in _children(pid)
            if b"engine" in open(f"/proc/{child}/cmdline", "rb").read().split(b"\0")]


def _children(pid):
    """The processes whose parent is `pid`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(entry))
    return found


def _wait_gone(pids, timeout=30):
    deadline = time.monotonic() + timeout
    while any(os.path.exists(f"/proc/{pid}") and _running(pid) for pid in pids):
        assert time.monotonic() < deadline, "the emulated workers did not end"
        time.sleep(0.05)


def _running(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _synced_versions(path):
    """Each engine's SyncWeights versions in the log, in order."""
    versions = {}
    for record in _log_records(path):
        if record.WhichOneof("kind") == "command" and record.command.HasField("sync_weights"):
            sync = record.command.sync_weights
            versions.setdefault(sync.engine, []).append(sync.version)
    return versions


def _released_reattachments(path):
    """The engines that reattached saying they had released their memory (colocated)."""
    return sum(1 for record in _log_records(path)
               if record.WhichOneof("kind") == "event"
               and record.event.WhichOneof("kind") == "engine_attached"
               and record.event.engine_attached.released)


def _run(rlsched_bin, tmp_path, mode, *extra, output=subprocess.PIPE):
    reports = tmp_path / "reports"
    reports.mkdir(exist_ok=True)
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    args = [rlsched_bin, "--log-level", "info", "run", "--config", _config(tmp_path, mode),
            "--listen", f"unix:{tmp_path}/run.sock", "--token-file", str(token),
            "--emulated-engines", str(_ENGINES), "--emulated-trainer", "--time-scale", "0.02",
            "--emulated-reports", str(reports), "--reattach-window", "3", "--json",
            "--timeout", "120", *extra]
    return subprocess.Popen(args, stdout=output, stderr=output, text=True)


@pytest.mark.parametrize("seed", _SEEDS)
@pytest.mark.parametrize("mode", sorted(_MODES))
def test_a_killed_scheduler_resumes_from_its_log(rlsched_bin, tmp_path, mode, seed):
    rng = random.Random(f"{mode}-{seed}")
    log = str(tmp_path / "events.log")
    # Its output to a file: the workers it started keep the file open (they outlive it).
    with open(tmp_path / "first.txt", "w") as output:
        first = _run(rlsched_bin, tmp_path, mode, "--event-log", log, output=output)
    # A moment in the run: after the start-up (~0.3 s), before the end (~2.8 s).
    time.sleep(0.3 + rng.uniform(0.0, 1.9))
    workers = _children(first.pid)
    engines = _engines(first.pid)
    if first.poll() is not None:
        pytest.fail("the run ended before the kill: " + (tmp_path / "first.txt").read_text())
    first.send_signal(signal.SIGKILL)
    first.wait()
    if seed % 3 == 2 and engines:  # an engine dies with it
        os.kill(rng.choice(sorted(engines)), signal.SIGKILL)
    started = time.monotonic()
    second = _run(rlsched_bin, tmp_path, mode, "--resume", log)
    out, err = second.communicate(timeout=180)
    assert second.returncode == 0, err[-4000:]
    report = json.loads(out)
    assert report["done"], err[-3000:]
    resumed_in = time.monotonic() - started
    assert resumed_in < 60, err[-2000:]
    back = re.search(r"workers are back after ([0-9.]+) s", err)
    if os.environ.get("RLSCHED_RESUME_TIMES"):  # the distribution, for the notes
        with open(os.environ["RLSCHED_RESUME_TIMES"], "a") as f:
            f.write(f"{mode} {seed} {back.group(1) if back else 'window'} {resumed_in:.3f} "
                    f"{_released_reattachments(log)}\n")
    trained = int(report["counters"]["trained"])
    assert trained == _STEPS * _PROMPTS * _SAMPLES
    _wait_gone(workers + _children(second.pid))  # they write their reports as they end
    with open(tmp_path / "reports" / "trainer.json") as f:
        listed = json.load(f)["trained"]
    assert len(listed) == len(set(listed)) == trained, err[-3000:]
    replay = subprocess.run([rlsched_bin, "replay", log], capture_output=True, text=True,
                            timeout=120)
    assert replay.returncode == 0 and "identical" in replay.stdout, replay.stdout + replay.stderr
    for engine, versions in _synced_versions(log).items():
        assert versions == sorted(versions), (engine, versions)
