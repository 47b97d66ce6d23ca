"""The daemon's lifetime: shared by threads, killed, stopped, closed, forked."""

import os
import random
import signal
import threading
import time

import pytest

import rlsched
from rlsched.errors import DaemonError


def _wait_dead(pid, timeout=5.0):
    """Waits until `pid` is a zombie or gone (the client reaps it, not us)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return
        except FileNotFoundError:
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} did not die")


def _wait_stopped(pid, timeout=5.0):
    """Waits until every thread of `pid` is stopped: kill() returns before a
    SIGSTOP has taken effect, and a busy machine may let the daemon answer first."""
    deadline = time.monotonic() + timeout
    task_dir = f"/proc/{pid}/task"
    while time.monotonic() < deadline:
        states = []
        for tid in os.listdir(task_dir):
            with open(f"{task_dir}/{tid}/stat") as stat:
                states.append(stat.read().rsplit(")", 1)[1].split()[0])
        if all(state in ("T", "t") for state in states):
            return
        time.sleep(0.01)
    pytest.fail(f"process {pid} did not stop within {timeout} s")


def test_concurrent_use_of_one_client(client):
    errors = []
    results = {}

    def worker(t):
        try:
            rng = random.Random(t)
            for j in range(15):
                n = 50 + 10 * t + j  # a distinct size per call, to catch mix-ups
                lengths = [rng.randint(1, 10000) for _ in range(n)]
                k = 1 + (t + j) % 8
                if j % 3 == 0:
                    parts = client.get_seqlen_balanced_partitions(lengths, k, False)
                    assert len(parts) == k
                    assert sorted(i for p in parts for i in p) == list(range(n))
                elif j % 3 == 1:
                    result = client.balance(lengths, k)
                    assert sum(p.tokens for p in result.parts) == sum(lengths)
                    assert sorted(i for p in result.partitions for i in p) == list(range(n))
                else:
                    plan = client.plan_step(lengths, num_ranks=k,
                                            max_tokens_per_micro_batch=20000)
                    assert sum(r.tokens for r in plan.ranks) == sum(lengths)
                results[(t, j)] = True
        except BaseException as error:  # any: reported below
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    assert len(results) == 8 * 15
    assert client.restarts == 0


def test_killed_daemon_is_restarted(client):
    client.ping()
    pid = client.pid
    os.kill(pid, signal.SIGKILL)
    _wait_dead(pid)
    assert client.get_seqlen_balanced_partitions([3, 1, 2, 2], 2, True) in (
        [[0, 1], [2, 3]], [[2, 3], [0, 1]])
    assert client.pid not in (None, pid)
    assert client.restarts == 1


def test_daemon_killed_during_a_call_is_restarted(client):
    client.ping()
    pid = client.pid
    os.kill(pid, signal.SIGSTOP)  # the call below writes, then waits for a reply
    _wait_stopped(pid)
    outcome = {}

    def call():
        try:
            outcome["parts"] = client.get_seqlen_balanced_partitions(
                list(range(1, 101)), 4, True)
        except BaseException as error:  # any: the test reports it
            outcome["error"] = error

    thread = threading.Thread(target=call)
    thread.start()
    time.sleep(0.3)
    os.kill(pid, signal.SIGKILL)
    thread.join(timeout=30)
    assert "error" not in outcome, outcome.get("error")
    parts = outcome["parts"]
    assert sorted(i for p in parts for i in p) == list(range(100))
    assert client.pid not in (None, pid)
    assert client.restarts == 1


def test_timeout_kills_a_hung_daemon(rlsched_bin):
    with rlsched.Client(rlsched_bin, timeout=0.5) as client:
        client.ping()
        pid = client.pid
        os.kill(pid, signal.SIGSTOP)
        _wait_stopped(pid)
        start = time.monotonic()
        with pytest.raises(DaemonError) as info:
            client.ping()
        assert info.value.code == "DAEMON_TIMEOUT"
        assert time.monotonic() - start < 5
        assert client.pid is None
        _wait_dead(pid)
        assert client.ping()  # a new daemon


def test_daemon_that_keeps_dying(tmp_path):
    with rlsched.Client("/bin/true") as client:
        with pytest.raises(DaemonError) as info:
            client.ping()
        assert info.value.code == "DAEMON_DIED"
    with rlsched.Client(str(tmp_path / "no-such-rlsched")) as client:
        with pytest.raises(DaemonError) as info:
            client.ping()
        assert info.value.code == "DAEMON_UNAVAILABLE"


def test_binary_from_the_environment(rlsched_bin, monkeypatch):
    monkeypatch.setenv("RLSCHED_BIN", rlsched_bin)
    with rlsched.Client() as client:
        assert client.binary == rlsched_bin
        assert client.ping()


def test_close_ends_the_daemon_cleanly(rlsched_bin):
    client = rlsched.Client(rlsched_bin)
    with client:
        client.ping()
        proc = client._proc
    assert proc.returncode == 0  # EOF on its input: a clean exit
    assert client.closed and client.pid is None
    client.close()  # idempotent
    with pytest.raises(DaemonError) as info:
        client.ping()
    assert info.value.code == "CLIENT_CLOSED"


def test_forked_child_uses_its_own_daemon(client):
    client.ping()
    parent_daemon = client.pid
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # the child: report through the pipe, never return into pytest
        status = 1
        try:
            os.close(read_end)
            parts = client.get_seqlen_balanced_partitions([1, 2, 3, 4], 2, True)
            ok = (client.pid not in (None, parent_daemon)
                  and sorted(i for p in parts for i in p) == [0, 1, 2, 3])
            client.close()
            os.write(write_end, b"ok" if ok else b"bad")
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        answer = pipe.read()
    _, status = os.waitpid(child, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert answer == b"ok"
    assert client.pid == parent_daemon
    assert client.ping()
