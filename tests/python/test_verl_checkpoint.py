"""The verl checkpoint-engine backend (rlsched.integrations.verl_checkpoint) and
rlsched.weight_sync under it: the interface check at import against stand-ins of
verl 1dda039b9's base.py, and real worlds of processes (gloo on loopback, no Ray)
driven as CheckpointEngineManager drives them (verl_checkpoint_world.py).

The 4 + 4 worlds run by default; 8 + 8 with RLSCHED_THOROUGH=1 (the CTest test
python.verl_checkpoint.thorough, label thorough)."""

import importlib
import os
import sys
import tempfile
import time

import pytest

torch = pytest.importorskip("torch")

# Imported after the importorskip above (noqa: E402).
import standins  # noqa: E402
import verl_checkpoint_world as vw  # noqa: E402
from rlsched.integrations import IncompatibleUpstreamError  # noqa: E402

THOROUGH = os.environ.get("RLSCHED_THOROUGH") == "1"
BUCKET = 64 << 10
TIMEOUT_S = 8


def _base_source(send_weights="(self, weights, global_steps: int = None)"):
    """verl 1dda039b9's base.py interface (bodies of our own), with `send_weights`'s
    parameter list replaceable."""
    path = os.path.join(vw.STANDINS, "verl", "checkpoint_engine", "base.py")
    with open(path, encoding="utf-8") as f:
        source = f.read()
    return source.replace("async def send_weights(self, weights, global_steps: int = None)",
                          f"async def send_weights{send_weights}")


def _import_backend(monkeypatch, source):
    standins.register(lambda name, m: monkeypatch.setitem(sys.modules, name, m),
                      ["verl", "verl.checkpoint_engine"],
                      [("verl.checkpoint_engine.base", source)])
    monkeypatch.delitem(sys.modules, vw.BACKEND_MODULE, raising=False)
    try:
        module = importlib.import_module(vw.BACKEND_MODULE)
    finally:  # dropped again after the test, with the stand-in it registered in
        monkeypatch.setitem(sys.modules, vw.BACKEND_MODULE, sys.modules.get(vw.BACKEND_MODULE))
    return module


def test_import_registers_the_backend_in_verls_registry(monkeypatch):
    module = _import_backend(monkeypatch, _base_source())
    base = sys.modules["verl.checkpoint_engine.base"]
    cls = base.CheckpointEngineRegistry.get("rlsched")
    assert cls is module.RlschedCheckpointEngine
    assert issubclass(cls, base.CheckpointEngine) and cls.wire_format == "named_tensors"
    assert module.check() == []
    # As verl's actor and rollout workers make it (engine_workers.py:685, base.py:338).
    actor = base.CheckpointEngineRegistry.new("rlsched", is_master=True, bucket_size=BUCKET,
                                              fp8=True, senders=2)
    rollout = base.CheckpointEngineRegistry.new("rlsched", bucket_size=BUCKET)
    assert actor.sync.is_master and not rollout.sync.is_master
    assert actor.sync.options.fp8 and actor.sync.options.senders == 2


def test_an_interface_of_another_commit_is_refused_at_import(monkeypatch):
    # Before verl added global_steps, send_weights was (self, weights).
    with pytest.raises(IncompatibleUpstreamError) as raised:
        _import_backend(monkeypatch, _base_source(send_weights="(self, weights)"))
    message = str(raised.value)
    assert "send_weights" in message and "global_steps" in message and "1dda039b9" in message
    assert "rlsched" not in sys.modules["verl.checkpoint_engine.base"] \
        .CheckpointEngineRegistry._registry


def test_bad_engine_kwargs_are_refused_by_name(monkeypatch):
    _import_backend(monkeypatch, _base_source())
    registry = sys.modules["verl.checkpoint_engine.base"].CheckpointEngineRegistry
    for kwargs, field in (({"bucket_size": 100}, "bucket_bytes"),
                          ({"bucket_size": BUCKET, "senders": 0}, "senders"),
                          ({"bucket_size": BUCKET, "transport": "mpi"}, "transport"),
                          ({"bucket_size": BUCKET, "timeout_s": -1}, "timeout_s"),
                          ({"bucket_size": BUCKET, "fp8": "false"}, "fp8"),
                          ({"bucket_size": BUCKET, "senders": True}, "senders"),
                          ({"bucket_size": 1 << 40}, "bucket_bytes")):
        with pytest.raises(ValueError) as raised:
            registry.new("rlsched", **kwargs)
        assert raised.value.field == field


def _nodes(actors, rollouts, colocated, gpus_per_node):
    if colocated:
        return ([f"node{r // gpus_per_node}" for r in range(actors)],
                [f"node{r // gpus_per_node}" for r in range(rollouts)])
    return ([f"trainer{r // gpus_per_node}" for r in range(actors)],
            [f"engine{r // gpus_per_node}" for r in range(rollouts)])


def _world(actors, rollouts, colocated, fp8=False, specs=None, **engine_kwargs):
    store_dir = tempfile.mkdtemp(prefix="rlsched-verl-ce-")
    config = {"store_dir": store_dir, "bucket_size": BUCKET, "seed": 20261206,
              "specs": specs or vw.model_specs(),
              "engine_kwargs": dict({"fp8": fp8, "timeout_s": TIMEOUT_S, "transport": "gloo"},
                                    **engine_kwargs)}
    actor_nodes, rollout_nodes = _nodes(actors, rollouts, colocated, 4)
    return vw.World(actors, rollouts, config, actor_nodes, rollout_nodes)


def _check_exact(world, result, step, fp8):
    statuses = result["statuses"]
    assert all(status == "ok" for status, _ in statuses), statuses
    want = vw.expected(world.config["specs"], world.config["seed"], step, fp8)
    for rank, received in enumerate(result["received"]):
        assert received == want, f"rollout worker {rank}"


WORLDS = [(4, 4)] + ([(8, 8)] if THOROUGH else [])


@pytest.mark.parametrize("actors,rollouts", WORLDS)
@pytest.mark.parametrize("colocated,fp8", [(True, False), (False, True)])
def test_two_syncs_deliver_every_tensor_byte_exact(actors, rollouts, colocated, fp8):
    world = _world(actors, rollouts, colocated, fp8)
    try:
        first = world.sync(1)
        _check_exact(world, first, 1, fp8)
        second = world.sync(2)  # new weights, the plan made from the first sync's tensors
        _check_exact(world, second, 2, fp8)
    finally:
        world.close()
    m1, m2 = first["metrics"], second["metrics"]
    assert m1["rlsched/weight_sync/planned"] == 0 and m2["rlsched/weight_sync/planned"] == 1
    assert m2["rlsched/weight_sync/senders"] == actors
    total = m2["rlsched/weight_sync/total_bytes"]
    # The embeddings span several buckets; the busiest sender carries about 1/actors.
    assert total > 2 * BUCKET
    assert m2["rlsched/weight_sync/busiest_sender_bytes"] <= total / actors + BUCKET
    assert m2["rlsched/weight_sync/estimate_seconds"] >= \
        m2["rlsched/weight_sync/lower_bound_seconds"] > 0


def test_fewer_senders_than_actor_ranks():
    world = _world(4, 2, colocated=False, senders=2)
    try:
        for step in (1, 2):
            result = world.sync(step)
            _check_exact(world, result, step, False)
    finally:
        world.close()
    assert result["metrics"]["rlsched/weight_sync/senders"] == 2


def test_a_renamed_tensor_stops_every_member_with_its_name():
    specs = vw.model_specs()
    renamed = list(specs)
    name, shape, dtype = renamed[3]
    assert name == "model.layers.0.self_attn.k_proj.weight"
    renamed[3] = (name.replace("k_proj", "key_proj"), shape, dtype)
    world = _world(4, 4, colocated=True, specs=specs)
    try:
        _check_exact(world, world.sync(1), 1, False)
        result = world.sync(2, specs=renamed)
        # The next sync learns the new names (and plans from them the one after).
        world.config["specs"] = renamed  # what the driver expects
        _check_exact(world, world.sync(3, specs=renamed), 3, False)
        _check_exact(world, world.sync(4, specs=renamed), 4, False)
    finally:
        world.close()
    statuses = result["statuses"]
    assert all(status == "raised" for status, _ in statuses), statuses
    for _, (kind, message, field) in statuses:
        assert kind == "WeightSyncError" and "self_attn.key_proj" in message, message
        assert field == renamed[3][0], (kind, message, field)


def test_an_actor_rank_lost_mid_send_fails_every_member_then_the_next_sync_works():
    world = _world(4, 4, colocated=False)
    try:
        _check_exact(world, world.sync(1), 1, False)
        start = time.monotonic()
        lost = world.sync(2, die_at={3: 6}, timeout=TIMEOUT_S + 30)
        elapsed = time.monotonic() - start
        statuses = lost["statuses"]
        assert statuses[3][0] == "lost"
        others = [s for i, s in enumerate(statuses) if i != 3]
        assert all(status == "raised" for status, _ in others), others
        rollout_errors = [detail for status, detail in statuses[4:]]
        assert all(kind == "WeightSyncError" for kind, _, _ in rollout_errors), rollout_errors
        assert elapsed < TIMEOUT_S + 10 + 5, elapsed  # + 5: the training world's own timeout
        world.replace_actor(3, generation=1)
        _check_exact(world, world.sync(3), 3, False)
    finally:
        world.close()


def _config_specs(config):
    from rlsched.weight_sync.models import hf_tensors
    return [(s.name, s.shape, s.dtype) for s in hf_tensors(config)]


TINY = {"model_type": "qwen3", "hidden_size": 128, "intermediate_size": 256,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 32, "vocab_size": 600, "torch_dtype": "bfloat16"}


def test_a_model_config_plans_the_first_sync_and_checks_the_generator():
    world = _world(4, 4, colocated=False, specs=_config_specs(TINY), model_config=TINY)
    try:
        first = world.sync(1)
        _check_exact(world, first, 1, False)
        short = _config_specs(TINY)[:-1]  # the generator without the output head
        missing = world.sync(2, specs=short)
    finally:
        world.close()
    assert first["metrics"]["rlsched/weight_sync/planned"] == 1
    for status, detail in missing["statuses"]:
        assert status == "raised" and detail[2] == "lm_head.weight", detail
