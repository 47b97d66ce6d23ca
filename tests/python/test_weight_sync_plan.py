"""rlsched.weight_sync.plan and .models, pure: properties on seeded random manifests and
hand-made cases (no torch, no processes)."""

import json
import os
import random

import pytest

from rlsched import client
from rlsched.errors import InvalidArgumentError
from rlsched.weight_sync import plan
from rlsched.weight_sync.models import hf_tensors

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "data", "configs")
needs_native = pytest.mark.skipif(client._native is None, reason="no native module")


def _random_specs(rng, count):
    names = ("q_proj", "k_proj", "down_proj", "norm", "embed_tokens", "gate")
    specs = []
    for i in range(count):
        dims = rng.choice([1, 2, 2, 3])
        shape = tuple(rng.choice([0, 1, 3, 64, 129, 300]) if rng.random() < 0.1
                      else rng.randint(1, 300 if dims < 3 else 40) for _ in range(dims))
        specs.append(plan.TensorSpec(f"model.layers.{i}.{rng.choice(names)}.weight", shape,
                                     rng.choice(["bfloat16", "float32", "uint8", "int64"])))
    return specs


def _all_chunks(specs, bucket, fp8=False):
    chunks, wires = [], []
    for source, spec in enumerate(specs):
        for wire in plan.wire_specs(spec, fp8):
            chunks += plan.chunks_of(len(wires), source, wire, bucket)
            wires.append(wire)
    return chunks, wires


@pytest.mark.parametrize("seed", range(12))
def test_chunks_tile_every_wire_tensor(seed):
    rng = random.Random(seed)
    bucket = rng.choice([4096, 4100, 65536])
    chunks, wires = _all_chunks(_random_specs(rng, 40), bucket, fp8=seed % 2 == 1)
    for index, wire in enumerate(wires):
        mine = [c for c in chunks if c.wire == index]
        assert mine[0].offset == 0 and sum(c.size for c in mine) == wire.nbytes
        for a, b in zip(mine, mine[1:]):
            assert b.offset == a.offset + a.size
        assert all(c.size <= bucket and c.offset % plan.ALIGN == 0 for c in mine)


@needs_native
@pytest.mark.parametrize("seed", range(12))
def test_senders_and_buckets_keep_their_invariants(seed):
    rng = random.Random(1000 + seed)
    bucket = rng.choice([4096, 16384])
    chunks, _ = _all_chunks(_random_specs(rng, rng.randint(1, 60)), bucket)
    senders = sorted(rng.sample(range(16), rng.randint(1, 6)))
    owners = plan.plan_senders(chunks, senders)
    assert owners == plan.plan_senders(chunks, senders)  # deterministic
    assert set(owners) <= set(senders)
    loads = {s: 0 for s in senders}
    for chunk, owner in zip(chunks, owners):
        loads[owner] += chunk.size
    total = sum(loads.values())
    # Karmarkar-Karp never leaves a sender above the mean by more than a chunk.
    assert max(loads.values()) <= total / len(senders) + max(c.size for c in chunks)
    buckets = plan.pack_buckets(chunks, owners, bucket)
    position = {(c.wire, c.offset): i for i, c in enumerate(chunks)}
    placed = [position[(c.wire, c.offset)] for b in buckets for c, _ in b.chunks]
    assert sorted(placed) == list(range(len(chunks)))  # every chunk once
    for b in buckets:
        assert b.nbytes <= bucket
        ends = 0
        for c, offset in b.chunks:
            assert offset % plan.ALIGN == 0 and offset >= ends
            assert owners[position[(c.wire, c.offset)]] == b.sender
            ends = offset + c.size
        assert ends == b.nbytes
    # Each sender's chunks keep the generator's order across its buckets.
    for s in senders:
        theirs = [c for b in buckets if b.sender == s for c, _ in b.chunks]
        assert theirs == [c for c, o in zip(chunks, owners) if o == s]


def test_online_senders_take_the_least_loaded():
    online = plan.OnlineSenders([3, 5])
    chunk = plan.Chunk
    assert [online(chunk(0, 0, 0, n)) for n in (10, 4, 4, 4, 1)] == [3, 5, 5, 5, 3]


@pytest.mark.parametrize("seed", range(8))
def test_the_estimate_is_never_below_its_bound(seed):
    rng = random.Random(2000 + seed)
    trainers = rng.randint(1, 16)
    nodes = [f"n{r // rng.choice([2, 4, 8])}" for r in range(trainers)]
    engines = [rng.choice(nodes + ["e0", "e1"]) for _ in range(rng.randint(1, 16))]
    membership = plan.Membership(tuple(nodes), tuple(engines))
    options = plan.SyncOptions(bucket_bytes=1 << 20, gpus_per_node=rng.choice([1, 8]))
    senders = plan.sender_ranks(membership, rng.choice([None, 1, 3]))
    sent = {s: rng.randint(0, 10 ** 9) for s in senders}
    e = plan.estimate(sent, membership, options, senders)
    assert e.seconds >= e.lower_bound_seconds * (1 - 1e-12) > 0 or e.total_bytes == 0
    assert e.busiest_sender_bytes == max(sent.values())


def test_spreading_senders_lowers_the_estimate_on_separate_nodes():
    membership = plan.Membership(("t0",) * 8, ("e0",) * 8)
    options = plan.SyncOptions(bucket_bytes=1 << 20)
    total = 60 * 10 ** 9
    one = plan.estimate({0: total}, membership, options, [0])
    spread = plan.estimate({r: total // 8 for r in range(8)}, membership, options, range(8))
    assert spread.seconds <= one.seconds / 4
    assert spread.busiest_sender_bytes * 2 <= one.busiest_sender_bytes


def test_sender_ranks_spread_over_nodes():
    membership = plan.Membership(("a", "a", "b", "b", "c"), ("e",))
    assert plan.sender_ranks(membership, None) == [0, 1, 2, 3, 4]
    assert plan.sender_ranks(membership, 3) == [0, 2, 4]
    assert plan.sender_ranks(membership, 4) == [0, 1, 2, 4]


def test_fp8_wire_tensors():
    weight = plan.TensorSpec("model.layers.0.mlp.gate_up_proj.weight", (300, 200), "bfloat16")
    codes, scales = plan.wire_specs(weight, True)
    assert codes == plan.TensorSpec(weight.name, (300, 200), "uint8")
    assert scales == plan.TensorSpec(weight.name + "_scale_inv", (3, 2), "float32")
    for name, shape in (("model.embed_tokens.weight", (10, 4)), ("model.norm.weight", (4,)),
                        ("model.layers.0.mlp.gate.weight", (8, 4)), ("lm_head.weight", (10, 4))):
        spec = plan.TensorSpec(name, shape, "bfloat16")
        assert plan.wire_specs(spec, True) == [spec]
    assert plan.wire_specs(weight, False) == [weight]


def test_options_are_checked_by_field():
    for kwargs, field in (({"bucket_bytes": 100}, "bucket_bytes"),
                          ({"bucket_bytes": 1 << 20, "senders": 0}, "senders"),
                          ({"bucket_bytes": 1 << 20, "inter_node_gb_per_s": 0},
                           "inter_node_gb_per_s"),
                          ({"bucket_bytes": 1 << 20, "gpus_per_node": 0}, "gpus_per_node")):
        with pytest.raises(InvalidArgumentError) as raised:
            plan.SyncOptions(**kwargs).check()
        assert raised.value.field == field


@pytest.mark.parametrize("name,billions", [("llama-3.1-8b", 8.030), ("llama-3.1-70b", 70.554),
                                           ("qwen3-30b-a3b", 30.532),
                                           ("qwen3-235b-a22b", 235.094),
                                           ("deepseek-v3", 671.026)])
def test_hf_tensors_count_the_published_parameters(name, billions):
    with open(os.path.join(CONFIGS, f"{name}.json"), encoding="utf-8") as f:
        tensors = hf_tensors(json.load(f))
    assert len({t.name for t in tensors}) == len(tensors)
    params = sum(t.nbytes for t in tensors) / 2
    assert abs(params / 1e9 - billions) < 0.001


def test_hf_tensors_of_a_small_llama_by_hand():
    config = {"model_type": "llama", "hidden_size": 8, "intermediate_size": 16,
              "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
              "vocab_size": 10, "tie_word_embeddings": True}
    got = [(t.name, t.shape) for t in hf_tensors(config)]
    assert got == [("model.embed_tokens.weight", (10, 8)),
                   ("model.layers.0.input_layernorm.weight", (8,)),
                   ("model.layers.0.self_attn.q_proj.weight", (8, 8)),
                   ("model.layers.0.self_attn.k_proj.weight", (4, 8)),
                   ("model.layers.0.self_attn.v_proj.weight", (4, 8)),
                   ("model.layers.0.self_attn.o_proj.weight", (8, 8)),
                   ("model.layers.0.post_attention_layernorm.weight", (8,)),
                   ("model.layers.0.mlp.gate_proj.weight", (16, 8)),
                   ("model.layers.0.mlp.up_proj.weight", (16, 8)),
                   ("model.layers.0.mlp.down_proj.weight", (8, 16)),
                   ("model.norm.weight", (8,))]


def test_hf_tensors_refuse_a_bad_config_by_key():
    with pytest.raises(InvalidArgumentError) as raised:
        hf_tensors({"hidden_size": -1, "num_hidden_layers": 1, "vocab_size": 3})
    assert raised.value.field == "hidden_size"


def test_build_topology_refuses_bad_metadata_by_field():
    from rlsched.weight_sync import WeightSync
    good_master = {"node": "a", "master": {"host": "h", "port": 1, "next_generation": 0}}
    for args, field in (((True, 1, [good_master, {"node": "b"}]), "actor_wg_world_size"),
                        ((1, 1, [good_master]), "metadata"),
                        ((1, 1, [good_master, None]), "metadata[1].node"),
                        ((1, 1, [{"node": "a"}, {"node": "b"}]), "metadata[0].master")):
        with pytest.raises(InvalidArgumentError) as raised:
            WeightSync.build_topology(*args)
        assert raised.value.field == field


def test_kept_groups_only_when_every_member_holds_them_at_its_rank():
    from rlsched.weight_sync import WeightSync
    master = {"host": "h", "port": 7, "next_generation": 3}
    first, _ = WeightSync.build_topology(1, 2, [dict(node="a", master=master),
                                                dict(node="b"), dict(node="c")])
    topology = first["topology"][0]
    assert topology["generation"] == 3
    held = [[3, topology["digest"], r] for r in range(3)]
    meta = [dict(node="a", master=master, held=held[0]), dict(node="b", held=held[1]),
            dict(node="c", held=held[2])]
    kept, _ = WeightSync.build_topology(1, 2, meta)
    assert kept["topology"][0]["generation"] == 3
    # Two members swapped ranks: each holds the groups at the other's rank.
    swapped = [meta[0], dict(meta[1], held=held[2]), dict(meta[2], held=held[1])]
    fresh, _ = WeightSync.build_topology(1, 2, swapped)
    assert fresh["topology"][0]["generation"] == 4
