"""Round trips through the real `rlsched serve`: ping, balance, plan_step."""

import random
import re

import pytest

import rlsched
from rlsched.client import _varint
from rlsched.v1 import balance_pb2, service_pb2


def _covers_once(lists, n):
    flat = [i for indices in lists for i in indices]
    return sorted(flat) == list(range(n))


def test_varint_matches_protobuf():
    from google.protobuf.internal.encoder import _VarintBytes
    for value in [0, 1, 127, 128, 300, 16383, 16384, 2**31 - 1, 2**35 + 7]:
        assert _varint(value) == _VarintBytes(value)


def test_generated_modules_import_through_the_package():
    assert service_pb2.Request.DESCRIPTOR.full_name == "rlsched.v1.Request"
    assert balance_pb2.BalanceRequest.DESCRIPTOR.full_name == "rlsched.v1.BalanceRequest"


def test_ping(client):
    version = client.ping()
    assert re.fullmatch(r"\d+\.\d+\.\d+", version)
    assert client.pid is not None


def test_one_daemon_is_reused(client):
    client.ping()
    pid = client.pid
    for _ in range(5):
        client.balance([3, 1, 2], 2)
    assert client.pid == pid
    assert client.restarts == 0


def test_balance_round_trip(client):
    lengths = [4096, 512, 1024, 2048, 300, 7000, 1, 0, 64]
    result = client.balance(lengths, 3)
    assert isinstance(result, rlsched.BalanceResult)
    assert len(result.parts) == 3
    assert _covers_once(result.partitions, len(lengths))
    for part in result.parts:
        assert part.indices == sorted(part.indices)
        assert part.tokens == sum(lengths[i] for i in part.indices)
        assert part.cost == part.tokens  # tokens cost model
    assert result.max_cost == max(p.cost for p in result.parts)
    assert result.min_cost == min(p.cost for p in result.parts)
    assert result.lower_bound <= result.max_cost
    assert result.lower_bound >= max(lengths)
    assert result.gap == pytest.approx(result.max_cost / result.lower_bound - 1)


def test_balance_raw_reply(client):
    reply = client.balance([5, 4, 3], 2, raw=True)
    assert isinstance(reply, balance_pb2.BalanceReply)
    assert len(reply.parts) == 2


def test_balance_accepts_any_iterable(client):
    expected = client.balance([9, 8, 7, 6], 2).partitions
    assert client.balance((9, 8, 7, 6), 2).partitions == expected
    assert client.balance(iter([9, 8, 7, 6]), 2).partitions == expected
    assert client.balance([9.0, 8.0, 7.0, 6.0], 2).partitions == expected


def test_balance_equal_size_and_groups(client):
    rng = random.Random(7)
    groups = [g for g in range(12) for _ in range(4)]  # 12 groups of 4 sequences
    lengths = [rng.randint(1, 5000) for _ in groups]
    result = client.balance(lengths, 4, groups=groups, keep_groups=True, equal_size=True)
    assert _covers_once(result.partitions, len(lengths))
    for part in result.parts:
        part_groups = {groups[i] for i in part.indices}
        assert len(part.indices) == 4 * len(part_groups)  # whole groups only
        assert len(part_groups) == 3  # equal numbers of groups


def test_balance_algorithm_and_cost(client):
    lengths = [30000, 20000, 1000, 1000, 1000, 500]
    greedy = client.balance(lengths, 2, algorithm="greedy", refine_iterations=0)
    assert _covers_once(greedy.partitions, len(lengths))
    attention = client.balance(
        lengths, 2,
        cost={"kind": "attention", "coefficients": {"linear": 1.0, "quadratic": 0.001}})
    for part in attention.parts:
        expected = sum(round(n + 0.001 * n * n) for n in (lengths[i] for i in part.indices))
        assert abs(part.cost - expected) <= len(part.indices)
    model = balance_pb2.CostModel(kind=balance_pb2.COST_KIND_ATTENTION)
    model.model.CopyFrom(balance_pb2.ModelShape(hidden_size=4096, num_layers=32,
                                                ffn_hidden_size=14336,
                                                num_attention_heads=32, num_kv_heads=8,
                                                vocab_size=128256))
    shaped = client.balance(lengths, 2, cost=model)
    assert shaped.max_cost > shaped.parts[0].tokens or shaped.max_cost > 0
    assert client.balance(lengths, 2, cost="tokens").max_cost == \
        client.balance(lengths, 2).max_cost


def test_plan_step_round_trip(client):
    rng = random.Random(3)
    lengths = [rng.randint(100, 500) + min(8000, int(rng.lognormvariate(6.67, 1.15)))
               for _ in range(256)]
    cap = 16384
    plan = client.plan_step(lengths, num_ranks=4, max_tokens_per_micro_batch=cap,
                            pad_to_multiple_of=8, micro_batches_multiple_of=2,
                            pipeline_stages=2, overhead=100, order="heaviest_first")
    assert isinstance(plan, rlsched.StepPlan)
    assert len(plan.ranks) == 4
    assert plan.micro_batches % 2 == 0
    assert _covers_once([m.indices for r in plan.ranks for m in r.micro_batches],
                        len(lengths))
    for rank in plan.ranks:
        assert len(rank.micro_batches) == plan.micro_batches
        for mb in rank.micro_batches:
            assert mb.indices == sorted(mb.indices)
            assert mb.tokens <= cap
            assert mb.tokens == sum(-(-lengths[i] // 8) * 8 for i in mb.indices)
        costs = [mb.cost for mb in rank.micro_batches]
        assert costs == sorted(costs, reverse=True)
        assert rank.tokens == sum(mb.tokens for mb in rank.micro_batches)
    assert plan.predicted_step_time == max(r.time for r in plan.ranks)
    assert plan.lower_bound <= plan.predicted_step_time
    assert plan.baseline.micro_batches >= 1
    assert plan.baseline.predicted_step_time > 0
    # What a trainer needs for a loss that does not depend on the split.
    assert plan.overhead == 100
    assert plan.sequences == len(lengths)
    assert plan.unpadded_tokens == sum(lengths)
    assert plan.tokens == sum(r.tokens for r in plan.ranks)
    for rank in plan.ranks:
        assert rank.sequences == sum(len(mb.indices) for mb in rank.micro_batches)
        assert rank.unpadded_tokens == sum(mb.unpadded_tokens for mb in rank.micro_batches)
        for mb in rank.micro_batches:
            assert mb.unpadded_tokens == sum(lengths[i] for i in mb.indices)
    assert plan.empty_micro_batches == 0 and plan.empty_ranks == 0


def test_plan_step_default_overhead_and_no_empty_micro_batches(client):
    # The pipeline example that once gave ranks hundreds of empty micro-batches.
    rng = random.Random(5)
    lengths = [rng.randint(100, 500) + min(30000, int(rng.lognormvariate(7.0, 1.2)))
               for _ in range(1024)]
    plan = client.plan_step(lengths, num_ranks=8, max_tokens_per_micro_batch=32768,
                            pipeline_stages=2)
    assert plan.overhead > 0  # the estimate, not 0
    assert plan.empty_micro_batches == 0
    assert all(mb.indices for r in plan.ranks for mb in r.micro_batches)
    assert plan.micro_batches <= min(r.sequences for r in plan.ranks)
    # Forced: 10 sequences cannot fill 4 ranks × 4 micro-batches; the plan says so.
    forced = client.plan_step(lengths[:10], num_ranks=4, max_tokens_per_micro_batch=32768,
                              min_micro_batches=4)
    assert forced.empty_micro_batches == 4 * 4 - 10


def test_plan_micro_batches(client):
    rng = random.Random(11)
    lengths = [rng.randint(1, 4000) for _ in range(100)]
    cap = 8192
    batches = client.plan_micro_batches(lengths, cap, min_micro_batches=3)
    assert len(batches) >= 3
    assert _covers_once(batches, len(lengths))
    for indices in batches:
        assert indices == sorted(indices)
        assert sum(lengths[i] for i in indices) <= cap


def test_raw_call(client):
    request = service_pb2.Request(id="ignored")
    request.ping.SetInParent()
    reply = client.call(request)
    assert reply.WhichOneof("kind") == "pong"
    assert reply.id == request.id != "ignored"  # the client's own id


def test_module_level_functions(rlsched_bin):
    previous = rlsched.set_default_client(None)
    try:
        assert rlsched.default_client() is rlsched.default_client()
        assert rlsched.ping()
        assert rlsched.get_seqlen_balanced_partitions([1, 2, 3, 4], 2, True) in (
            [[0, 3], [1, 2]], [[1, 2], [0, 3]])
        assert len(rlsched.balance([1, 2, 3], 2).parts) == 2
        assert len(rlsched.plan_step([1, 2, 3], num_ranks=3,
                                     max_tokens_per_micro_batch=4).ranks) == 3
        assert _covers_once(rlsched.plan_micro_batches([5, 5, 5], 10), 3)
    finally:
        client = rlsched.set_default_client(previous)
        if client is not None:
            client.close()
