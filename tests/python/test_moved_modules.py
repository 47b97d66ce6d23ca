"""The modules that moved (into rlsched.weight_sync; rollout_pb2 renamed orchestrator_pb2
with its .proto): their old paths still import (and run), with a DeprecationWarning
pointing at the importing line, for a release."""

import importlib
import os
import subprocess
import sys

import pytest

MOVED = [("rlsched.executor", "rlsched.weight_sync.executor"),
         ("rlsched.executor_layouts", "rlsched.weight_sync.layouts"),
         ("rlsched.reshard_run", "rlsched.weight_sync.launcher")]
NEEDS_TORCH = {"rlsched.executor", "rlsched.executor_layouts", "rlsched.reshard_run"}
RENAMED = [("rlsched.v1.rollout_pb2", "rlsched.v1.orchestrator_pb2")]


@pytest.mark.parametrize("old, new", MOVED + RENAMED)
def test_an_old_path_warns_and_gives_the_new_module(old, new, monkeypatch):
    if old in NEEDS_TORCH:
        pytest.importorskip("torch")
    monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.warns(DeprecationWarning, match=f"{old} is deprecated .*: use {new}") as caught:
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert [w.filename for w in caught] == [__file__]


def _run(module):
    # The package as this process imports it, whatever the working directory.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    return subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True,
                          text=True, env=env, timeout=60)


def test_the_old_launcher_runs_with_a_warning():
    pytest.importorskip("torch")
    old, new = _run("rlsched.reshard_run"), _run("rlsched.weight_sync.launcher")
    assert old.returncode == new.returncode == 0, (old.stderr, new.stderr)
    assert old.stdout == new.stdout and "--train" in new.stdout
    assert "DeprecationWarning: rlsched.reshard_run is deprecated" in old.stderr
    assert "rlsched.weight_sync.launcher" in old.stderr and new.stderr == ""


def test_the_renamed_proto_module_keeps_the_messages_and_the_wire_format(monkeypatch):
    from rlsched.v1 import orchestrator_pb2
    monkeypatch.delitem(sys.modules, "rlsched.v1.rollout_pb2", raising=False)
    assert orchestrator_pb2.DESCRIPTOR.name == "rlsched/v1/orchestrator.proto"
    assert orchestrator_pb2.DESCRIPTOR.package == "rlsched.v1"
    config = orchestrator_pb2.SimulatorConfig(steps=3, engines=2)
    with pytest.warns(DeprecationWarning):
        old = importlib.import_module("rlsched.v1.rollout_pb2")
    assert old.SimulatorConfig.FromString(config.SerializeToString()) == config
