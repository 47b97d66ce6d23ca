"""rlsched.integrations.nemo_rl against a stand-in for NeMo-RL at commit 7ea279abf.

NeMo-RL is not installable here. The stand-in registers modules under NeMo-RL's module
paths with the signatures of NVIDIA-NeMo/RL 7ea279abf and bodies of this test's own:

* ``nemo_rl.data.packing.algorithms``: the algorithm enum, ``SequencePacker`` (``pack``
  = the subclass's ``_pack_implementation``, then the bin count raised to the minimum
  and the multiple by moving single sequences out of the fullest bins), a first-fit
  decreasing packer, and ``get_packer`` resolving names through a table made per call;
* ``nemo_rl.data.packing``: its re-export;
* ``nemo_rl.distributed.batched_data_dict``: ``get_packer`` imported by name (line 39) and
  the sequence-packing call of ``shard_by_batch_size`` (lines 598-604, 632-659): the
  packer made with ``min_bin_count=shards, bin_count_multiple=shards``, the bins of a
  global batch dealt round-robin to the shards.

The properties restate NeMo-RL's ``tests/unit/data/packing/test_algorithms.py``: every
sequence once, no bin over the capacity, no empty bin, the minimum and the multiple
met, an empty input packed to nothing, an over-capacity sequence and too few sequences
for the bins refused with ValueError, the same answer twice.
"""

import random
import sys

import pytest

import rlsched
import standins
from rlsched.integrations import nemo_rl as rlsched_nemo

torch = pytest.importorskip("torch", reason="python3-torch is needed for the NeMo-RL stand-in")

if not rlsched.native_available():
    pytest.skip("the native module rlsched._native is not built", allow_module_level=True)

ALGORITHMS_SOURCE = '''
import enum
from abc import ABC, abstractmethod
from typing import List, Optional


class PackingAlgorithm(enum.Enum):
    CONCATENATIVE = "concatenative"
    FIRST_FIT_DECREASING = "first_fit_decreasing"
    FIRST_FIT_SHUFFLE = "first_fit_shuffle"
    MODIFIED_FIRST_FIT_DECREASING = "modified_first_fit_decreasing"


class SequencePacker(ABC):
    def __init__(self, bin_capacity: int, collect_metrics: bool = False,
                 min_bin_count: Optional[int] = None, bin_count_multiple: Optional[int] = None):
        if min_bin_count is not None and min_bin_count < 0:
            raise ValueError("negative min_bin_count")
        if bin_count_multiple is not None and bin_count_multiple < 1:
            raise ValueError("bin_count_multiple below 1")
        self.bin_capacity = bin_capacity
        self.collect_metrics = collect_metrics
        self.min_bin_count = min_bin_count
        self.bin_count_multiple = bin_count_multiple

    @abstractmethod
    def _pack_implementation(self, sequence_lengths: List[int]) -> List[List[int]]:
        ...

    def pack(self, sequence_lengths: List[int]) -> List[List[int]]:
        bins = self._pack_implementation(sequence_lengths)
        target = len(bins)
        if self.min_bin_count is not None:
            target = max(target, self.min_bin_count)
        if self.bin_count_multiple is not None:
            target = -(-target // self.bin_count_multiple) * self.bin_count_multiple
        if target > len(sequence_lengths):
            raise ValueError(f"{target} bins need {target} sequences")
        bins = [list(b) for b in bins]
        while len(bins) < target:
            fullest = max(range(len(bins)), key=lambda b: (len(bins[b]), b))
            bins.append([bins[fullest].pop()])
        return bins


class FirstFitDecreasingPacker(SequencePacker):
    def _pack_implementation(self, sequence_lengths):
        bins, loads = [], []
        for i in sorted(range(len(sequence_lengths)), key=lambda i: -sequence_lengths[i]):
            if sequence_lengths[i] > self.bin_capacity:
                raise ValueError("over capacity")
            for b, load in enumerate(loads):
                if load + sequence_lengths[i] <= self.bin_capacity:
                    bins[b].append(i)
                    loads[b] += sequence_lengths[i]
                    break
            else:
                bins.append([i])
                loads.append(sequence_lengths[i])
        return bins


def get_packer(algorithm, bin_capacity, collect_metrics=False, min_bin_count=None,
               bin_count_multiple=None):
    table = {PackingAlgorithm.FIRST_FIT_DECREASING: FirstFitDecreasingPacker,
             PackingAlgorithm.MODIFIED_FIRST_FIT_DECREASING: FirstFitDecreasingPacker}
    if isinstance(algorithm, str):
        try:
            algorithm = PackingAlgorithm[algorithm.upper()]
        except KeyError:
            raise ValueError(f"unknown packer {algorithm}") from None
    if algorithm not in table:
        raise ValueError(f"unknown packer {algorithm}")
    return table[algorithm](bin_capacity, collect_metrics=collect_metrics,
                            min_bin_count=min_bin_count, bin_count_multiple=bin_count_multiple)
'''

PACKING_SOURCE = '''
from nemo_rl.data.packing.algorithms import PackingAlgorithm, SequencePacker, get_packer
'''

BATCHED_DATA_DICT_SOURCE = '''
from collections import UserDict
from typing import Optional

import torch

from nemo_rl.data.packing import get_packer


class SlicedDataDict(dict):
    pass


class BatchedDataDict(UserDict):
    def shard_by_batch_size(self, shards: int, batch_size: Optional[int] = None,
                            allow_uneven_shards: bool = False,
                            dynamic_batching_args=None, sequence_packing_args=None):
        # Dynamic batching only: rows sorted by length per global batch, dealt to the
        # shards in turn; runs of positions filled greedily under rows x longest row.
        args = dynamic_batching_args
        lengths = self.data[args["input_lengths_key"]]
        total = len(lengths)
        batch_size = batch_size or total
        size = batch_size // shards
        order = []
        for c in range(total // batch_size):
            rows = sorted(range(c * batch_size, (c + 1) * batch_size),
                          key=lambda i: int(lengths[i]))
            order.append([rows[s::shards] for s in range(shards)])
        out = []
        for s in range(shards):
            picked = torch.tensor([i for chunk in order for i in chunk[s]], dtype=torch.long)
            out.append(SlicedDataDict({k: v[picked] for k, v in self.data.items()}))
        width = self.data[args["input_key"]].shape[1]
        indices, padded = [], []
        for c in range(total // batch_size):
            runs, run_lengths, longest = [[0, 0]], [0], 0
            for j in range(size):
                tallest = max(int(shard[args["input_lengths_key"]][c * size + j])
                              for shard in out)
                tallest = min(-(-tallest // args["sequence_length_round"])
                              * args["sequence_length_round"], width)
                longest = max(longest, tallest)
                if (runs[-1][1] - runs[-1][0] + 1) * longest <= args["max_tokens_per_microbatch"]:
                    runs[-1][1] += 1
                    run_lengths[-1] = longest
                else:
                    runs.append([j, j + 1])
                    longest = tallest
                    run_lengths.append(longest)
            indices.append(runs)
            padded.append(run_lengths)
        for shard in out:
            shard.micro_batch_indices = indices
            shard.micro_batch_lengths = padded
        return out, [i for chunk in order for rows in chunk for i in rows]


def packed_shards(lengths, sequence_packing_args, shards, batch_size):
    bin_packer = get_packer(
        algorithm=sequence_packing_args["algorithm"],
        bin_capacity=sequence_packing_args["max_tokens_per_microbatch"],
        collect_metrics=False,
        min_bin_count=shards,
        bin_count_multiple=shards,
    )
    per_shard = [[] for _ in range(shards)]
    for start in range(0, len(lengths), batch_size):
        bins = bin_packer.pack(sequence_lengths=lengths[start:start + batch_size])
        for s in range(shards):
            per_shard[s].append([[start + i for i in b] for b in bins[s::shards]])
    return per_shard
'''


def register_standin(setitem, algorithms_source=ALGORITHMS_SOURCE):
    return standins.register(
        setitem, ("nemo_rl", "nemo_rl.data", "nemo_rl.distributed", "nemo_rl.data.packing"),
        (("nemo_rl.data.packing.algorithms", algorithms_source),
         ("nemo_rl.data.packing", PACKING_SOURCE),
         ("nemo_rl.distributed.batched_data_dict", BATCHED_DATA_DICT_SOURCE))
    )["nemo_rl.data.packing.algorithms"]


@pytest.fixture
def standin(monkeypatch):
    yield from standins.fixture(monkeypatch, register_standin, rlsched_nemo)


def check_bins(bins, lengths, cap, minimum=None, multiple=None):
    assert sorted(i for b in bins for i in b) == list(range(len(lengths))), "each once"
    assert all(b for b in bins), "no empty bin"
    assert all(sum(lengths[i] for i in b) <= cap for b in bins), "over the capacity"
    if minimum is not None:
        assert len(bins) >= minimum
    if multiple is not None:
        assert len(bins) % multiple == 0


def test_install_rebinds_every_get_packer_and_uninstall_restores(standin):
    original = standin.get_packer
    data = sys.modules["nemo_rl.distributed.batched_data_dict"]
    packing = sys.modules["nemo_rl.data.packing"]
    assert rlsched_nemo.check() == []
    method = data.BatchedDataDict.shard_by_batch_size
    assert sorted(rlsched_nemo.install()) == [
        "nemo_rl.data.packing.algorithms.get_packer", "nemo_rl.data.packing.get_packer",
        "nemo_rl.distributed.batched_data_dict.BatchedDataDict.shard_by_batch_size",
        "nemo_rl.distributed.batched_data_dict.get_packer"]
    assert data.get_packer is packing.get_packer is rlsched_nemo.get_packer
    assert data.BatchedDataDict.shard_by_batch_size is rlsched_nemo.shard_by_batch_size
    assert standin.SequencePacker.__dict__.get("_pack_implementation") is not None, \
        "checked, not replaced"
    rlsched_nemo.uninstall()
    assert data.get_packer is packing.get_packer is standin.get_packer is original
    assert data.BatchedDataDict.shard_by_batch_size is method


def test_the_name_resolves_to_rlscheds_packer_and_the_others_to_nemo_rls(standin):
    rlsched_nemo.install()
    packer = standin.get_packer("RLSched", 100)
    assert isinstance(packer, standin.SequencePacker)
    assert type(packer).__name__ == "RlschedPacker"
    assert type(standin.get_packer("first_fit_decreasing", 100)).__name__ == \
        "FirstFitDecreasingPacker"
    with pytest.raises(ValueError):
        standin.get_packer("no_such_packer", 100)
    rlsched_nemo.uninstall()
    rlsched_nemo.install(names=["modified_first_fit_decreasing"])
    assert type(standin.get_packer("modified_first_fit_decreasing", 100)).__name__ == \
        "RlschedPacker"
    with pytest.raises(ValueError):
        standin.get_packer("rlsched", 100)


def test_install_refuses_another_signature(monkeypatch):
    source = ALGORITHMS_SOURCE.replace(
        "def _pack_implementation(self, sequence_lengths: List[int])",
        "def _pack_implementation(self, sequence_lengths: List[int], seed=0)")
    module = register_standin(lambda name, m: monkeypatch.setitem(sys.modules, name, m), source)
    with pytest.raises(rlsched.integrations.IncompatibleUpstreamError,
                       match=r"SequencePacker\._pack_implementation: parameter 3 'seed'"):
        rlsched_nemo.install()
    assert module.get_packer is not rlsched_nemo.get_packer


def test_nemo_rls_own_cases(standin):
    rlsched_nemo.install()
    packer = standin.get_packer("rlsched", 100)
    assert packer.pack([]) == []
    check_bins(packer.pack([70, 75]), [70, 75], 100)
    check_bins(packer.pack([100, 100, 100]), [100] * 3, 100)
    assert len(packer.pack([50])) == 1
    with pytest.raises(ValueError, match=r"sequence_lengths\[1\]: 150 tokens, above "
                                         r"bin_capacity = 100"):
        packer.pack([50, 150, 70])
    for minimum, multiple in [(3, None), (None, 4)]:
        with pytest.raises(ValueError):
            standin.get_packer("rlsched", 100, min_bin_count=minimum,
                               bin_count_multiple=multiple).pack([50, 50])
    lengths = [46, 24, 55, 88, 11, 14, 73, 17]
    assert packer.pack(lengths) == packer.pack(lengths), "deterministic"


@pytest.mark.parametrize("seed", range(20))
def test_random_packs_meet_the_constraints(standin, seed):
    rng = random.Random(600 + seed)
    rlsched_nemo.install()
    cap = rng.choice([100, 1024, 4096])
    n = rng.randint(0, 200)
    lengths = [rng.randint(0 if rng.random() < 0.1 else 1, cap) for _ in range(n)]
    minimum = rng.choice([None, 0, 1, 3, 8])
    multiple = rng.choice([None, 1, 2, 4])
    if rng.random() < 0.4:
        minimum = multiple = rng.choice([2, 4, 8])
    packer = standin.get_packer("rlsched", cap, min_bin_count=minimum,
                                bin_count_multiple=multiple)
    try:
        bins = packer.pack(lengths)
    except ValueError:
        assert n < max(minimum or 0, multiple or 0, 1), "refused only for too few sequences"
        return
    if n == 0:
        assert bins == []
        return
    check_bins(bins, lengths, cap, minimum, multiple)


@pytest.mark.parametrize("seed", range(8))
def test_shards_through_the_sharding_call(standin, seed):
    """shard_by_batch_size's call: every shard the same number of bins per global
    batch, each bin a micro-batch of the joint plan, every sequence once."""
    rng = random.Random(700 + seed)
    data = sys.modules["nemo_rl.distributed.batched_data_dict"]
    shards = rng.choice([2, 4, 8])
    batch = shards * rng.randint(4, 32)
    lengths = [min(8192, 64 + int(rng.lognormvariate(6.5, 1.1))) for _ in range(2 * batch)]
    args = {"algorithm": "first_fit_decreasing", "max_tokens_per_microbatch": 8192}
    rlsched_nemo.install()
    ours = data.packed_shards(lengths, dict(args, algorithm="rlsched"), shards, batch)
    placed = sorted(i for shard in ours for chunk in shard for b in chunk for i in b)
    assert placed == list(range(len(lengths)))
    for chunk in range(2):
        counts = {len(shard[chunk]) for shard in ours}
        assert len(counts) == 1, "the same number of bins on every shard"
        for shard in ours:
            for b in shard[chunk]:
                assert b and sum(lengths[i] for i in b) <= 8192
        start = chunk * batch
        plan = rlsched.plan_step(lengths[start:start + batch], num_ranks=shards,
                                 max_token_len=8192)
        assert [[[start + i for i in m.indices] for m in rank.micro_batches]
                for rank in plan.ranks] == [shard[chunk] for shard in ours]


def _dynamic(lengths, shards, batch_size, round_to, budget, width):
    data = sys.modules["nemo_rl.distributed.batched_data_dict"]
    batch = data.BatchedDataDict({
        "input_ids": torch.zeros(len(lengths), width, dtype=torch.long),
        "input_lengths": torch.tensor(lengths)})
    args = {"max_tokens_per_microbatch": budget, "sequence_length_round": round_to,
            "input_key": "input_ids", "input_lengths_key": "input_lengths"}
    return batch.shard_by_batch_size(shards, batch_size=batch_size, dynamic_batching_args=args)


@pytest.mark.parametrize("seed", range(20))
def test_dynamic_batching_runs_fewest_and_balanced(standin, seed):
    """NeMo-RL's invariants of dynamic batching (runs tiling each batch's positions,
    rows × padded length within the budget, a multiple of the round, the same runs on
    every shard) with the greedy fill's count and a heaviest run no heavier."""
    rng = random.Random(1000 + seed)
    shards = rng.choice([1, 2, 4])
    batch_size = shards * rng.randint(2, 24)
    width = rng.choice([512, 2048, 4096])
    lengths = [rng.randint(1, width) for _ in range(batch_size * rng.randint(1, 3))]
    round_to = rng.choice([1, 4, 64])
    budget = rng.randint(width, 8 * width)
    theirs, _ = _dynamic(lengths, shards, batch_size, round_to, budget, width)
    rlsched_nemo.install()
    ours, order = _dynamic(lengths, shards, batch_size, round_to, budget, width)
    assert sorted(order) == list(range(len(lengths)))
    size = batch_size // shards
    for c, (runs, padded) in enumerate(zip(ours[0].micro_batch_indices,
                                           ours[0].micro_batch_lengths)):
        assert all(s.micro_batch_indices is ours[0].micro_batch_indices for s in ours)
        assert runs[0][0] == 0 and runs[-1][1] == size
        assert all(a[1] == b[0] and a[0] < a[1] for a, b in zip(runs, runs[1:]))
        assert len(runs) == len(theirs[0].micro_batch_indices[c]), "the fewest runs"
        for (a, b), length in zip(runs, padded):
            tallest = max(int(s["input_lengths"][c * size + j]) for s in ours
                          for j in range(a, b))
            assert length == min(-(-tallest // round_to) * round_to, width)
            assert length % round_to == 0 or length == width
            assert (b - a) * length <= budget, "within the budget"
        heaviest = max((b - a) * n for (a, b), n in zip(runs, padded))
        greedy = max((b - a) * n for (a, b), n in zip(theirs[0].micro_batch_indices[c],
                                                      theirs[0].micro_batch_lengths[c]))
        assert heaviest <= greedy
    rlsched_nemo.uninstall()
    rlsched_nemo.install(dynamic_batching=False)
    again, _ = _dynamic(lengths, shards, batch_size, round_to, budget, width)
    assert again[0].micro_batch_indices == theirs[0].micro_batch_indices


def test_dynamic_micro_batches_by_hand():
    # NeMo-RL's example: greedy fills [0, 2], [2, 3], [3, 4] under 32 tokens.
    runs, padded = rlsched_nemo.dynamic_micro_batches([8, 8, 28, 32], 32)
    assert runs == [[0, 2], [2, 3], [3, 4]] and padded == [8, 28, 32]
    # Greedy: [0, 3] (3 × 10) then [3, 4] alone; balanced: two runs of 2 × 10.
    runs, padded = rlsched_nemo.dynamic_micro_batches([10, 10, 10, 10], 30)
    assert runs == [[0, 2], [2, 4]] and padded == [10, 10]
    with pytest.raises(ValueError, match=r"lengths\[1\]: 40 tokens"):
        rlsched_nemo.dynamic_micro_batches([10, 40], 32)
