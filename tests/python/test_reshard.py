"""Client.reshard and rlsched.reshard against the real daemon."""

import json

import pytest

import rlsched
from rlsched.errors import InvalidArgumentError
from rlsched.v1 import reshard_pb2

# A small Llama: 4 layers, hidden 64, 16 query heads in 4 KV groups.
TINY_LLAMA = {
    "model_type": "llama", "hidden_size": 64, "intermediate_size": 96,
    "num_hidden_layers": 4, "num_attention_heads": 16, "num_key_value_heads": 4,
    "vocab_size": 1000, "tie_word_embeddings": False,
}


def test_round_trip(client):
    text = json.dumps(TINY_LLAMA)
    summary = client.reshard(text, train={"tp": 2, "pp": 2, "dp": 2},
                             infer={"tp": 4, "replicas": 2})
    assert isinstance(summary, reshard_pb2.ReshardPlan)
    assert summary.trainer_ranks == 8 and summary.engine_ranks == 8
    assert summary.num_transfers > 0 and len(summary.transfers) == 0
    assert summary.num_buckets == len(summary.bucket_seconds) >= 1
    assert summary.lower_bound_seconds <= summary.estimate_seconds < summary.naive_seconds

    full = client.reshard(TINY_LLAMA, train=reshard_pb2.TrainLayout(tp=2, pp=2, dp=2),
                          infer={"tp": 4, "replicas": 2}, include_transfers=True)
    assert len(full.transfers) == full.num_transfers == summary.num_transfers
    assert sum(t.bytes * len(t.dst_ranks) for t in full.transfers) == full.bytes_received
    assert all(t.dst_param.startswith(("model.", "lm_head")) for t in full.transfers)
    full.ClearField("transfers")
    assert full == summary

    # Colocated (local copies), a small bucket (more buckets).
    plan = client.reshard(
        text, train={"tp": 4, "dp": 2}, infer={"tp": 4, "replicas": 2},
        topology={"colocated": True, "gpus_per_node": 4}, bucket_bytes=4096)
    assert plan.bytes_local > 0 and plan.num_buckets > summary.num_buckets

    # An fp8 target is named by its short name.
    wide = dict(TINY_LLAMA, hidden_size=256, intermediate_size=512, num_attention_heads=8,
                num_key_value_heads=4)
    bf16 = client.reshard(wide, train={"tp": 2}, infer={"tp": 2})
    fp8 = client.reshard(wide, train={"tp": 2}, infer={"tp": 2}, target_dtype="fp8_block128",
                         include_transfers=True)
    assert fp8.bytes_received < bf16.bytes_received
    assert any(t.quantize == reshard_pb2.QUANTIZE_AT_SENDER for t in fp8.transfers)


def test_first_and_last_stage_layers(client):
    # 4 layers over 3 stages: refused unless the first / last stages' layers are given.
    with pytest.raises(InvalidArgumentError) as info:
        client.reshard(TINY_LLAMA, train={"pp": 3}, infer={"tp": 2})
    assert info.value.field == "reshard.train.pp"
    assert info.value.message == (
        "train.pp: num_hidden_layers (4) must be divisible by pp·vpp (3), or set "
        "first_stage_layers / last_stage_layers for an uneven split")
    plan = client.reshard(TINY_LLAMA, train={"pp": 3, "first_stage_layers": 2},
                          infer={"tp": 2}, include_transfers=True)
    assert plan.trainer_ranks == 3
    # 2 | 1 | 1: layer 1 on stage 0 (rank 0), layer 2 on stage 1 (rank 1).
    ranks = {}
    for t in plan.transfers:
        if t.src_param.startswith("decoder.layers."):
            ranks.setdefault(int(t.src_param.split(".")[2]), set()).add(t.src_rank)
    assert ranks == {0: {0}, 1: {0}, 2: {1}, 3: {2}}
    both = client.reshard(TINY_LLAMA, train=reshard_pb2.TrainLayout(
        pp=3, first_stage_layers=1, last_stage_layers=1), infer={"tp": 2})
    assert both.trainer_ranks == 3
    with pytest.raises(InvalidArgumentError) as info:
        client.reshard(TINY_LLAMA, train={"pp": 3, "last_stage_layers": 0}, infer={"tp": 2})
    assert info.value.field == "reshard.train.last_stage_layers"
    assert info.value.message == "train.last_stage_layers: must be in [1, 2^31), got 0"


def test_module_function(rlsched_bin):
    with rlsched.Client(rlsched_bin) as client:
        previous = rlsched.set_default_client(client)
        try:
            plan = rlsched.reshard(json.dumps(TINY_LLAMA), train={"dp": 2}, infer={"tp": 2})
        finally:
            rlsched.set_default_client(previous)
    assert plan.trainer_ranks == 2 and plan.engine_ranks == 2


@pytest.mark.parametrize("kwargs, field", [
    ({"train": {"tp": -1}, "infer": {"tp": 1}}, "reshard.train.tp"),
    ({"train": {"tp": 3}, "infer": {"tp": 1}}, "reshard.train.tp"),
    ({"train": {}, "infer": {"tp": 1, "replicas": -2}}, "reshard.infer.replicas"),
    ({"train": {}, "infer": {"tp": 1}, "topology": {"gpus_per_node": -1}},
     "reshard.topology.gpus_per_node"),
    ({"train": {}, "infer": {"tp": 1}, "bucket_bytes": -5}, "reshard.bucket_bytes"),
    ({"train": {}, "infer": {"tp": 1, "expert_placement": "round_robin"}},
     "reshard.infer.expert_placement"),
])
def test_errors_name_the_field(client, kwargs, field):
    with pytest.raises(InvalidArgumentError) as info:
        client.reshard(json.dumps(TINY_LLAMA), **kwargs)
    assert info.value.code == "ERROR_CODE_INVALID_ARGUMENT"
    assert info.value.field == field
    assert info.value.message.startswith(field[len("reshard."):])
    assert client.ping()  # serving goes on


def test_bad_model_and_arguments(client):
    with pytest.raises(InvalidArgumentError) as info:
        client.reshard("{", train={}, infer={})
    assert info.value.field == "reshard.model_config_json"
    assert "not valid JSON" in info.value.message
    # Checked by the client before sending.
    with pytest.raises(InvalidArgumentError) as info:
        client.reshard(json.dumps(TINY_LLAMA), train={"tq": 2}, infer={})
    assert info.value.field == "reshard.train"
    with pytest.raises(InvalidArgumentError) as info:
        client.reshard(json.dumps(TINY_LLAMA), train=[2], infer={})
    assert info.value.field == "reshard.train"
    with pytest.raises(InvalidArgumentError) as info:
        client.reshard(json.dumps(TINY_LLAMA), train={},
                       infer={"expert_placement": "diagonal"})
    assert info.value.field == "reshard.infer.expert_placement"
