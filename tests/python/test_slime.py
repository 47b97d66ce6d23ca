"""rlsched.integrations.slime against a stand-in for slime at commit 624b824a8.

slime is not installable here. The stand-in registers modules under slime's module
paths with the signatures of THUDM/slime 624b824a8 and bodies of this test's own:

* ``slime.utils.dp_schedule.build_dp_schedule``: pack first (fixed chunks of
  ``micro_batch_size``, or first fit under the cap), then deal the micro-batches to the
  ranks round-robin; what the drop-in hands the static path to;
* ``slime.utils.flops_utils.calculate_fwd_flops``: a dense transformer's forward FLOPs
  per sample, linear in the length plus an attention term in its square;
* ``slime.ray.rollout``: the call of ``RolloutManager._split_train_data_by_dp``
  (``slime/ray/rollout.py:773``), with the function imported by name (line 31), and the
  per-rank slicing of the samples by ``partition``.

The properties are the invariants of slime's module docstring and of its
``tests/test_dp_schedule.py``, restated on seeded random instances.
"""

import random
import sys
import types

import pytest

import rlsched
import standins
from rlsched.integrations import slime as rlsched_slime

if not rlsched.native_available():
    pytest.skip("the native module rlsched._native is not built", allow_module_level=True)

DP_SCHEDULE_SOURCE = '''
from slime.utils.flops_utils import calculate_fwd_flops


def build_dp_schedule(args, train_parallel_config, total_lengths, *, global_batch_size,
                      rollout_indices):
    dp = train_parallel_config["dp_size"]
    align = dp * (train_parallel_config["microbatch_group_size_per_vp_stage"]
                  if train_parallel_config["vpp_size"] > 1 else 1)
    rollouts = {}
    for i, r in enumerate(rollout_indices):
        rollouts.setdefault(r, []).append(i)
    members = list(rollouts.values())
    steps = len(members) // global_batch_size
    assert steps >= 1, "num_rollouts < global_batch_size"
    parts, mbi, counts = [[] for _ in range(dp)], [[] for _ in range(dp)], []
    for s in range(steps):
        samples = [i for m in members[s * global_batch_size:(s + 1) * global_batch_size]
                   for i in m]
        if args.use_dynamic_batch_size:
            cap = args.max_tokens_per_gpu * train_parallel_config["cp_size"]
            bins = []
            for i in samples:
                for b in bins:
                    if sum(total_lengths[j] for j in b) + total_lengths[i] <= cap:
                        b.append(i)
                        break
                else:
                    bins.append([i])
        else:
            size = args.micro_batch_size
            bins = [samples[k:k + size] for k in range(0, len(samples), size)]
        assert len(bins) % align == 0, "not aligned"
        for k, b in enumerate(bins):
            r = k % dp
            start = len(parts[r])
            parts[r].extend(b)
            mbi[r].append(list(range(start, len(parts[r]))))
        counts.append(len(bins) // dp)
    return parts, mbi, counts, [global_batch_size] * steps
'''

FLOPS_SOURCE = '''
def calculate_fwd_flops(seqlens, args):
    h, layers, heads = args.hidden_size, args.num_layers, args.num_attention_heads
    d = args.kv_channels
    per_token = layers * (2 * h * heads * d + 4 * h * args.num_query_groups * d + 2 * h * h
                          + 6 * h * args.ffn_hidden_size) + 2 * h * args.vocab_size
    return sum(s * per_token + 2 * layers * heads * d * s * s / 2 * 2 for s in seqlens)
'''

# slime/ray/rollout.py at 624b824a8: the import by name (line 31), the call (773-779)
# and the slicing by partition (782-824), with a body of this test's own.
ROLLOUT_SOURCE = '''
from slime.utils.dp_schedule import build_dp_schedule


def split_train_data_by_dp(args, train_parallel_config, data):
    total_lengths = [len(t) for t in data["tokens"]]
    partitions, micro_batch_indices, num_microbatches, global_batch_sizes = build_dp_schedule(
        args,
        train_parallel_config,
        total_lengths,
        global_batch_size=args.global_batch_size,
        rollout_indices=data["rollout_ids"],
    )
    return [{"tokens": [data["tokens"][j] for j in partition],
             "micro_batch_indices": micro_batch_indices[r],
             "num_microbatches": num_microbatches,
             "global_batch_sizes": global_batch_sizes}
            for r, partition in enumerate(partitions)]
'''


def register_standin(setitem, dp_schedule_source=DP_SCHEDULE_SOURCE):
    return standins.register(setitem, ("slime", "slime.utils", "slime.ray"), (
        ("slime.utils.flops_utils", FLOPS_SOURCE),
        ("slime.utils.dp_schedule", dp_schedule_source),
        ("slime.ray.rollout", ROLLOUT_SOURCE)))["slime.utils.dp_schedule"]


@pytest.fixture
def standin(monkeypatch):
    yield from standins.fixture(monkeypatch, register_standin, rlsched_slime)


def make_args(**overrides):
    values = dict(micro_batch_size=1, use_dynamic_batch_size=True, max_tokens_per_gpu=None,
                  balance_data=False, balance_by_flops=False, global_batch_size=1,
                  hidden_size=16, num_attention_heads=2, num_query_groups=2, vocab_size=32,
                  ffn_hidden_size=64, num_experts=None, num_layers=2, kv_channels=8)
    values.update(overrides)
    return types.SimpleNamespace(**values)


def make_tp(dp_size=1, cp_size=1, vpp_size=1, microbatch_group_size_per_vp_stage=1):
    return {"dp_size": dp_size, "cp_size": cp_size, "vpp_size": vpp_size,
            "microbatch_group_size_per_vp_stage": microbatch_group_size_per_vp_stage}


def check_schedule(result, lengths, rollout_ids, gbs, tp, cap):
    """slime's invariants: equal counts per step on every rank (a multiple of the
    micro-batch group under virtual pipelines); every kept sample once, the kept ones
    the rollouts of the full steps; each rank's micro-batches tiling its samples; the
    cap kept but for a sample alone; each step's samples those of its rollouts; no
    micro-batch empty."""
    partitions, mbi, counts, gbs_per_step = result
    dp = tp["dp_size"]
    assert len(partitions) == len(mbi) == dp
    assert gbs_per_step == [gbs] * len(counts)
    group = tp["microbatch_group_size_per_vp_stage"] if tp["vpp_size"] > 1 else 1
    assert all(c % group == 0 and c >= 1 for c in counts)
    order = list(dict.fromkeys(rollout_ids))
    steps = len(order) // gbs
    assert len(counts) == steps
    kept = {r for r in order[:steps * gbs]}
    placed = [i for p in partitions for i in p]
    assert sorted(placed) == [i for i, r in enumerate(rollout_ids) if r in kept]
    for r in range(dp):
        assert len(mbi[r]) == sum(counts)
        assert [i for m in mbi[r] for i in m] == list(range(len(partitions[r])))
        offset = 0
        for s, count in enumerate(counts):
            step_rollouts = set(order[s * gbs:(s + 1) * gbs])
            for m in mbi[r][offset:offset + count]:
                samples = [partitions[r][i] for i in m]
                assert samples, "an empty micro-batch"
                assert {rollout_ids[i] for i in samples} <= step_rollouts
                tokens = sum(lengths[i] for i in samples)
                assert tokens <= cap or len(samples) == 1, "the cap is broken"
            offset += count


def test_the_drop_in_has_the_pinned_signature(standin):
    import inspect
    target = rlsched_slime.INTEGRATION.targets[0]
    expected = [(p.name, p.kind) for p in target.expected().parameters.values()]
    for function in (rlsched_slime.build_dp_schedule, standin.build_dp_schedule):
        assert [(p.name, p.kind) for p in inspect.signature(function).parameters.values()] \
            == expected
    assert rlsched_slime.check() == []


def test_install_rebinds_the_rollout_manager_and_uninstall_restores(standin):
    rollout = sys.modules["slime.ray.rollout"]
    original = standin.build_dp_schedule
    assert sorted(rlsched_slime.install()) == ["slime.ray.rollout.build_dp_schedule",
                                               "slime.utils.dp_schedule.build_dp_schedule"]
    assert rollout.build_dp_schedule is rlsched_slime.build_dp_schedule
    rlsched_slime.uninstall()
    assert rollout.build_dp_schedule is original and standin.build_dp_schedule is original


def test_install_refuses_another_signature(monkeypatch):
    source = DP_SCHEDULE_SOURCE.replace("*, global_batch_size,", "global_batch_size, *,")
    module = register_standin(lambda name, m: monkeypatch.setitem(sys.modules, name, m), source)
    with pytest.raises(rlsched.integrations.IncompatibleUpstreamError,
                       match=r"THUDM/slime 624b824a8.*parameter 4 is global_batch_size "
                             r"\(positional or keyword\)"):
        rlsched_slime.install()
    assert module.build_dp_schedule is not rlsched_slime.build_dp_schedule


def test_install_without_slime_does_nothing(monkeypatch):
    monkeypatch.setitem(sys.modules, "slime", None)
    assert rlsched_slime.install() == []


def test_slimes_own_cases(standin):
    """The inputs of slime's tests/test_dp_schedule.py (dynamic ones), the same
    invariants; an oversized sample alone; rollouts kept within a step; trailing
    rollouts trimmed; the micro-batch group under virtual pipelines; and the rollout
    manager's slicing of the samples by partition agreeing with the schedule."""
    rlsched_slime.install()
    rollout = sys.modules["slime.ray.rollout"]
    cases = [
        ([5] * 8, list(range(8)), 8, make_tp(dp_size=2), 10),
        ([15, 3, 3, 3, 3, 3, 3, 3], list(range(8)), 8, make_tp(dp_size=2), 10),
        ([4] * 32, list(range(32)), 16,
         make_tp(dp_size=2, vpp_size=2, microbatch_group_size_per_vp_stage=2), 8),
        ([3] * 9, [0, 0, 0, 1, 1, 2, 2, 2, 2], 1, make_tp(), 12),
        ([3] * 8, [0, 0, 1, 2, 2, 3, 4, 4], 2, make_tp(), 12),
    ]
    for lengths, ids, gbs, tp, cap in cases:
        args = make_args(max_tokens_per_gpu=cap, global_batch_size=gbs)
        data = {"tokens": [[0] * n for n in lengths], "rollout_ids": ids}
        per_rank = rollout.split_train_data_by_dp(args, tp, data)
        result = rlsched_slime.build_dp_schedule(args, tp, lengths, global_batch_size=gbs,
                                                 rollout_indices=ids)
        check_schedule(result, lengths, ids, gbs, tp, cap)
        assert [len(r["tokens"]) for r in per_rank] == [len(p) for p in result[0]]
    # The oversized sample alone; three steps of one rollout each.
    _, mbi, counts, _ = rlsched_slime.build_dp_schedule(
        make_args(max_tokens_per_gpu=12), make_tp(), [3] * 9, global_batch_size=1,
        rollout_indices=[0, 0, 0, 1, 1, 2, 2, 2, 2])
    assert len(counts) == 3


def test_errors_name_the_setting(standin):
    rlsched_slime.install()
    with pytest.raises(AssertionError, match="global_batch_size: must be in \\[1, 3\\]"):
        rlsched_slime.build_dp_schedule(make_args(max_tokens_per_gpu=12), make_tp(), [1] * 6,
                                        global_batch_size=4, rollout_indices=[0, 0, 1, 1, 2, 2])
    with pytest.raises(ValueError, match="microbatch_group_size_per_vp_stage = 4"):
        rlsched_slime.build_dp_schedule(
            make_args(max_tokens_per_gpu=100),
            make_tp(dp_size=2, vpp_size=2, microbatch_group_size_per_vp_stage=4), [1] * 4,
            global_batch_size=4, rollout_indices=[0, 1, 2, 3])
    with pytest.raises(ValueError, match="dp_size"):
        rlsched_slime.build_dp_schedule(make_args(max_tokens_per_gpu=100), make_tp(dp_size=4),
                                        [1] * 2, global_batch_size=2, rollout_indices=[0, 1])


def test_static_batches_are_slimes_own(standin):
    original = standin.build_dp_schedule
    rlsched_slime.install()
    args = make_args(use_dynamic_batch_size=False, micro_batch_size=2)
    lengths = [10] * 16
    expected = original(args, make_tp(dp_size=4), lengths, global_batch_size=16,
                        rollout_indices=list(range(16)))
    assert rlsched_slime.build_dp_schedule(args, make_tp(dp_size=4), lengths,
                                           global_batch_size=16,
                                           rollout_indices=list(range(16))) == expected


@pytest.mark.parametrize("seed", range(40))
def test_random_schedules_keep_the_invariants(standin, seed):
    rng = random.Random(500 + seed)
    rlsched_slime.install()
    dp = rng.choice([1, 2, 4, 8])
    vpp = rng.choice([1, 1, 2])
    group = rng.choice([1, 2]) if vpp > 1 else 1
    cp = rng.choice([1, 2])
    per_gpu = rng.choice([2048, 4096, 8192])
    rollouts = rng.randint(dp, 12 * dp)
    samples_per = rng.choice([1, 2, 4, 8])
    ids = [r for r in range(rollouts) for _ in range(samples_per)]
    if rng.random() < 0.5:
        rng.shuffle(ids)  # a rollout's samples scattered through the batch
    lengths = [min(3 * per_gpu * cp, 50 + int(rng.lognormvariate(6.5, 1.2))) for _ in ids]
    gbs = rng.randint(1, rollouts)
    if gbs * samples_per < dp * group:
        gbs = -(-dp * group // samples_per)
    if gbs > rollouts:
        return
    args = make_args(max_tokens_per_gpu=per_gpu, balance_by_flops=rng.random() < 0.5,
                     balance_data=rng.random() < 0.5)
    tp = make_tp(dp_size=dp, cp_size=cp, vpp_size=vpp, microbatch_group_size_per_vp_stage=group)
    try:
        result = rlsched_slime.build_dp_schedule(args, tp, lengths, global_batch_size=gbs,
                                                 rollout_indices=ids)
    except ValueError as error:
        # Only a step with fewer samples than dp_size × the micro-batch group (slime
        # refuses those too: it cannot make that many micro-batches).
        assert error.field in ("microbatch_group_size_per_vp_stage", "dp_size"), error
        order = list(dict.fromkeys(ids))
        sizes = [sum(ids.count(r) for r in order[s * gbs:(s + 1) * gbs])
                 for s in range(rollouts // gbs)]
        assert min(sizes) < dp * group, (sizes, dp, group)
        return
    check_schedule(result, lengths, ids, gbs, tp, per_gpu * cp)
    assert len(result[2]) == rollouts // gbs
