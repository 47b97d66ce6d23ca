"""get_seqlen_balanced_partitions: the contract of the RL frameworks' function."""

import random

import pytest

import rlsched
from rlsched.v1 import service_pb2


def _random_case(rng):
    k = rng.choice([1, 2, 3, 4, 7, 8, 16, 32, 64, 128])
    equal_size = rng.random() < 0.5
    if equal_size:
        n = k * rng.randint(1, 12)
    else:
        n = rng.randint(k, k * 12)
    kind = rng.random()
    if kind < 0.6:  # heavy-tailed, like rollouts
        lengths = [rng.randint(100, 500) + min(16384, round(rng.lognormvariate(6.67, 1.15)))
                   for _ in range(n)]
    elif kind < 0.8:
        lengths = [rng.randint(0, 10) for _ in range(n)]  # tiny, many ties and zeros
    else:
        lengths = [rng.choice([1, 1000, 32768]) for _ in range(n)]
    return lengths, k, equal_size


@pytest.mark.parametrize("seed", range(40))
def test_properties_over_random_inputs(client, seed):
    rng = random.Random(seed)
    for _ in range(5):
        lengths, k, equal_size = _random_case(rng)
        n = len(lengths)
        parts = client.get_seqlen_balanced_partitions(lengths, k, equal_size)
        assert isinstance(parts, list) and len(parts) == k
        seen = []
        for part in parts:
            assert isinstance(part, list) and part, "no part is empty"
            assert part == sorted(part)
            assert all(isinstance(i, int) for i in part)
            seen.extend(part)
        assert sorted(seen) == list(range(n)), "every index exactly once"
        loads = [sum(lengths[i] for i in part) for part in parts]
        if equal_size:
            assert all(len(part) == n // k for part in parts)
        else:
            # Never worse than list scheduling's guarantee.
            assert max(loads) <= sum(lengths) / k + max(lengths)


def test_big_instance(client):
    rng = random.Random(1)
    lengths = [rng.randint(100, 500) + min(16384, round(rng.lognormvariate(6.67, 1.15)))
               for _ in range(16384)]
    for equal_size in (False, True):
        parts = client.get_seqlen_balanced_partitions(lengths, 128, equal_size)
        assert sorted(i for p in parts for i in p) == list(range(16384))
        loads = [sum(lengths[i] for i in p) for p in parts]
        bound = max(max(lengths), -(-sum(lengths) // 128))
        assert max(loads) <= bound * 1.01
        if equal_size:
            assert {len(p) for p in parts} == {128}


def test_fewer_items_than_parts_raises_value_error(client):
    with pytest.raises(ValueError, match=r"number of items:\[3\] < k_partitions:\[4\]"):
        client.get_seqlen_balanced_partitions([1, 2, 3], 4, False)
    with pytest.raises(ValueError):
        client.get_seqlen_balanced_partitions([], 1, True)


def test_equal_size_needs_a_multiple(client):
    with pytest.raises(ValueError) as info:
        client.get_seqlen_balanced_partitions([1, 2, 3, 4, 5], 2, True)
    assert info.value.field == "equal_size"
    # Without equal_size the same input is fine.
    assert len(client.get_seqlen_balanced_partitions([1, 2, 3, 4, 5], 2, False)) == 2


@pytest.mark.parametrize("k", [0, -1, 2.0, None, True])
def test_bad_k_raises_value_error(client, k):
    with pytest.raises(ValueError):
        client.get_seqlen_balanced_partitions([1, 2, 3, 4], k, False)


def test_bad_length_raises_value_error_with_field(client):
    with pytest.raises(rlsched.InvalidArgumentError) as info:
        client.get_seqlen_balanced_partitions([5, -1, 3], 2, False)
    assert isinstance(info.value, ValueError)
    assert info.value.code == "ERROR_CODE_INVALID_ARGUMENT"
    assert info.value.field == "balance.lengths[1]"
    with pytest.raises(ValueError) as info:
        client.get_seqlen_balanced_partitions([5, 1.5, 3], 2, False)
    assert info.value.field == "seqlen_list[1]"


def test_empty_part_in_a_reply_raises_value_error(client, monkeypatch):
    # The daemon allows empty parts (the framework function asserts on them); fake
    # such a reply to check the client's assertion.
    def fake_call(request):
        reply = service_pb2.Reply(id=request.id)
        reply.balance.parts.add(indices=[0, 1], tokens=0, cost=0)
        reply.balance.parts.add()
        return reply
    monkeypatch.setattr(client, "call", fake_call)
    with pytest.raises(ValueError, match="the 1-th partition is empty"):
        client.get_seqlen_balanced_partitions([0, 0], 2, False)


def test_accepts_sequences_with_tolist():
    class Tensorish:
        def __init__(self, values):
            self.values = values

        def tolist(self):
            return list(self.values)

    previous = rlsched.set_default_client(None)
    try:
        assert rlsched.get_seqlen_balanced_partitions(Tensorish([4, 1, 3, 2]), 2, True) \
            == rlsched.get_seqlen_balanced_partitions([4, 1, 3, 2], 2, True)
    finally:
        client = rlsched.set_default_client(previous)
        if client is not None:
            client.close()
