"""rlsched.integrations.verl against a stand-in for verl at commit 1dda039b9.

verl is not installable here. The stand-in registers modules in sys.modules under
verl's module paths with verl's function names and signatures at verl-project/verl
1dda039b9 (2026-08-22) and bodies of this test's own:

* ``verl.utils.seqlen_balancing``: a Karmarkar-Karp (largest differencing) partition,
  the micro-batch recipe (the count from the tokens over the cap, the workload key
  24576·L + L², whole runs of ``force_group_size`` samples, no check of the cap),
  ``prepare_dynamic_batch`` (which looks ``rearrange_micro_batches`` up at call time),
  ``restore_dynamic_batch`` and ``get_reverse_idx``;
* ``verl.workers.engine.utils``: ``prepare_micro_batches``, which imported
  ``rearrange_micro_batches`` by name and calls it as verl's engines do
  (``verl/workers/engine/utils.py:112`` at that commit);
* ``verl.trainer.ppo.ray_trainer``: the driver's ``_balance_batch`` calls
  (``ray_trainer.py:1215``, ``:1227``, ``:1235``), with ``get_seqlen_balanced_partitions``
  imported by name.
"""

import inspect
import math
import os
import random
import shutil
import subprocess
import sys
import textwrap
import types

import pytest

torch = pytest.importorskip("torch", reason="python3-torch is needed for the verl stand-in")

# Imported after the importorskip above (noqa: E402).
import rlsched  # noqa: E402
import standins  # noqa: E402
from rlsched.integrations import verl as rlsched_verl  # noqa: E402

if not rlsched.native_available():
    pytest.skip("the native module rlsched._native is not built", allow_module_level=True)

STANDIN_SOURCE = '''
import heapq
from itertools import chain

import torch
from torch import distributed as dist

from verl.utils import tensordict_utils as tu


def get_device_name():
    return "cpu"


def calculate_workload(seqlen_list):
    return 24576 * seqlen_list + seqlen_list ** 2


def _differencing(values, k, equal_size):
    # Each state: k buckets [sum, indices], heaviest first; merging two states pairs
    # the heaviest buckets of one with the lightest of the other.
    order = sorted(range(len(values)), key=lambda i: (values[i], i))
    if equal_size:
        states = [sorted(([values[i], [i]] for i in order[s:s + k]), key=lambda b: -b[0])
                  for s in range(0, len(order), k)]
    else:
        states = [[[values[i], [i]]] + [[0, []] for _ in range(k - 1)] for i in order]
    heap = [(-(s[0][0] - s[-1][0]), n, s) for n, s in enumerate(states)]
    heapq.heapify(heap)
    serial = len(heap)
    while len(heap) > 1:
        a = heapq.heappop(heap)[2]
        b = heapq.heappop(heap)[2]
        merged = sorted(([a[j][0] + b[k - 1 - j][0], a[j][1] + b[k - 1 - j][1]]
                         for j in range(k)), key=lambda b: -b[0])
        heapq.heappush(heap, (-(merged[0][0] - merged[-1][0]), serial, merged))
        serial += 1
    return [bucket[1] for bucket in heap[0][2]]


def get_seqlen_balanced_partitions(seqlen_list: list[int], k_partitions: int, equal_size: bool):
    assert len(seqlen_list) >= k_partitions
    if equal_size:
        assert len(seqlen_list) % k_partitions == 0
    parts = _differencing(list(seqlen_list), k_partitions, equal_size)
    assert all(parts)
    return [sorted(p) for p in parts]


def rearrange_micro_batches(batch, max_token_len, dp_group=None, num_batches_divided_by=None,
                            same_micro_num_in_dp=True, min_num_micro_batch=None,
                            use_dynamic_bsz_balance=True, force_group_size=1):
    lengths = batch["attention_mask"].sum(dim=1)
    groups = len(lengths) // force_group_size
    count = min(groups, -(-int(lengths.sum()) // max_token_len))
    if min_num_micro_batch is not None:
        count = max(count, min_num_micro_batch)
    if num_batches_divided_by is not None:
        count = -(-count // num_batches_divided_by) * num_batches_divided_by
    work = calculate_workload(lengths).view(groups, force_group_size).sum(dim=1).tolist()
    parts = get_seqlen_balanced_partitions(work, count, equal_size=False)
    parts = [[i for g in p for i in range(g * force_group_size, (g + 1) * force_group_size)]
             for p in parts]
    return [tu.index_select_tensor_dict(batch, p) for p in parts], parts


def get_reverse_idx(idx_map):
    out = list(idx_map)
    for i, j in enumerate(idx_map):
        out[j] = i
    return out


def prepare_dynamic_batch(data, max_token_len, dp_group=None, num_batches_divided_by=None,
                          same_micro_num_in_dp=True, min_num_micro_batch=None,
                          use_dynamic_bsz_balance=True):
    return rearrange_micro_batches(data, max_token_len=max_token_len, dp_group=dp_group,
                                   num_batches_divided_by=num_batches_divided_by,
                                   same_micro_num_in_dp=same_micro_num_in_dp,
                                   min_num_micro_batch=min_num_micro_batch,
                                   use_dynamic_bsz_balance=use_dynamic_bsz_balance)


def restore_dynamic_batch(data, batch_idx_list):
    order = list(chain.from_iterable(batch_idx_list))
    return data[torch.tensor(get_reverse_idx(order), dtype=torch.long)]


def get_group_balanced_partitions(seqlen_list: list[int], uid_list: list, k_partitions: int):
    runs = []
    for i, uid in enumerate(uid_list):
        if i and uid == uid_list[i - 1]:
            runs[-1].append(i)
        else:
            runs.append([i])
    assert len(runs) >= k_partitions
    weights = [sum(int(calculate_workload(torch.tensor([seqlen_list[i]])).item()) for i in r)
               for r in runs]
    parts = get_seqlen_balanced_partitions(weights, k_partitions, equal_size=True)
    return [sorted(i for r in p for i in runs[r]) for p in parts]
'''

TENSORDICT_UTILS_SOURCE = '''
import torch


def index_select_tensor_dict(batch, indices):
    index = torch.tensor(indices, dtype=torch.long)
    return {key: value[index] for key, value in batch.items() if isinstance(value, torch.Tensor)}


def get_non_tensor_data(data, key, default):
    return getattr(data, "non_tensor", {}).get(key, default)
'''

# verl/workers/engine/utils.py at 1dda039: the import by name (line 28) and the call
# (lines 106-121), with a body of this test's own.
ENGINE_UTILS_SOURCE = '''
from verl.utils import tensordict_utils as tu
from verl.utils.seqlen_balancing import rearrange_micro_batches, restore_dynamic_batch


def prepare_micro_batches(data, dp_group=None, num_batches_divided_by=None,
                          same_micro_num_in_dp=True, min_num_micro_batch=None,
                          use_dynamic_bsz_balance=True):
    sp_size = tu.get_non_tensor_data(data=data, key="sp_size", default=1)
    force_group_size = tu.get_non_tensor_data(data=data, key="force_group_size", default=1)
    max_token_len = data["max_token_len_per_gpu"] * sp_size
    return rearrange_micro_batches(
        data,
        max_token_len=max_token_len,
        dp_group=dp_group,
        num_batches_divided_by=num_batches_divided_by,
        same_micro_num_in_dp=same_micro_num_in_dp,
        min_num_micro_batch=min_num_micro_batch,
        use_dynamic_bsz_balance=use_dynamic_bsz_balance,
        force_group_size=force_group_size,
    )


def restore(output, indices):
    return restore_dynamic_batch(output, indices)
'''

# verl/trainer/ppo/ray_trainer.py at 1dda039: the import by name (line 69) and
# _balance_batch's three calls (lines 1197-1242), on plain arguments, with a body of
# this test's own.
RAY_TRAINER_SOURCE = '''
import torch

from verl.utils.seqlen_balancing import calculate_workload, get_seqlen_balanced_partitions


def balance_batch(attention_mask, dp_size, uid_list=None, minibatch_size=None):
    seqlens = attention_mask.view(attention_mask.shape[0], -1).sum(-1)
    workload_lst = calculate_workload(seqlens)
    if uid_list is not None:
        from verl.utils.seqlen_balancing import get_group_balanced_partitions
        return get_group_balanced_partitions(seqlen_list=seqlens.tolist(), uid_list=uid_list,
                                             k_partitions=dp_size)
    if minibatch_size is not None:
        parts = [[] for _ in range(dp_size)]
        for i in range(len(workload_lst) // minibatch_size):
            mini = get_seqlen_balanced_partitions(
                workload_lst[i * minibatch_size:(i + 1) * minibatch_size],
                k_partitions=dp_size,
                equal_size=True,
            )
            for j, part in enumerate(mini):
                parts[j].extend([x + minibatch_size * i for x in part])
        return parts
    return get_seqlen_balanced_partitions(workload_lst, k_partitions=dp_size, equal_size=True)
'''

# The signatures at verl b178a3cd (before force_group_size), for the refusal.
OLD_REARRANGE = '''
def rearrange_micro_batches(batch, max_token_len, dp_group=None, num_batches_divided_by=None,
                            same_micro_num_in_dp=True, min_num_micro_batch=None,
                            use_dynamic_bsz_balance=True):
    raise AssertionError("never called: install refuses it")
'''


def register_standin(modules, seqlen_source=None):
    """Registers verl's packages, verl.utils.tensordict_utils,
    verl.utils.seqlen_balancing, verl.workers.engine.utils and
    verl.trainer.ppo.ray_trainer into `modules` (sys.modules or a monkeypatch-like
    setter); returns the seqlen_balancing stand-in. `seqlen_source` replaces its
    source (another verl's signatures)."""
    return standins.register(
        modules, ("verl", "verl.utils", "verl.workers", "verl.workers.engine", "verl.trainer",
                  "verl.trainer.ppo"),
        (("verl.utils.tensordict_utils", TENSORDICT_UTILS_SOURCE),
         ("verl.utils.seqlen_balancing", seqlen_source or STANDIN_SOURCE),
         ("verl.workers.engine.utils", ENGINE_UTILS_SOURCE),
         ("verl.trainer.ppo.ray_trainer", RAY_TRAINER_SOURCE)))["verl.utils.seqlen_balancing"]


@pytest.fixture
def standin(monkeypatch):
    yield from standins.fixture(monkeypatch, register_standin, rlsched_verl)


def _check_partition(parts, n, k):
    assert isinstance(parts, list) and len(parts) == k
    seen = []
    for part in parts:
        assert isinstance(part, list) and part, "no part is empty"
        assert all(type(i) is int for i in part)
        assert part == sorted(part)
        seen.extend(part)
    assert sorted(seen) == list(range(n)), "every index exactly once"


def test_the_drop_ins_have_the_pinned_signatures(standin):
    assert rlsched_verl.INTEGRATION.commit == rlsched_verl.COMMIT == "1dda039b9"
    for target in rlsched_verl.INTEGRATION.targets:
        expected = [(p.name, p.default) for p in target.expected().parameters.values()]
        for function in (target.drop_in, getattr(standin, target.name)):
            assert [(p.name, p.default)
                    for p in inspect.signature(function).parameters.values()] == expected
        assert target.drop_in.__doc__ != getattr(standin, target.name).__doc__
    assert "force_group_size=1" in rlsched_verl.INTEGRATION.targets[2].signature
    assert rlsched_verl.check() == []


def test_install_replaces_and_uninstall_restores(standin):
    originals = {name: getattr(standin, name) for name in rlsched_verl.FUNCTIONS}
    trainer = sys.modules["verl.trainer.ppo.ray_trainer"]
    engine = sys.modules["verl.workers.engine.utils"]
    # A recipe outside verl that imported a function under another name.
    recipe = types.ModuleType("my_recipe")
    recipe.balance = originals["get_seqlen_balanced_partitions"]
    sys.modules["my_recipe"] = recipe
    try:
        replaced = rlsched_verl.install()
        assert sorted(replaced) == sorted(
            [f"verl.utils.seqlen_balancing.{name}" for name in rlsched_verl.FUNCTIONS]
            + ["verl.trainer.ppo.ray_trainer.get_seqlen_balanced_partitions",
               "verl.workers.engine.utils.rearrange_micro_batches", "my_recipe.balance"])
        for name in rlsched_verl.FUNCTIONS:
            assert getattr(standin, name) is getattr(rlsched_verl, name)
        assert trainer.get_seqlen_balanced_partitions is \
            rlsched_verl.get_seqlen_balanced_partitions
        assert engine.rearrange_micro_batches is rlsched_verl.rearrange_micro_batches
        assert recipe.balance is rlsched_verl.get_seqlen_balanced_partitions
        assert rlsched_verl.install() == replaced, "installing twice changes nothing"
        assert rlsched_verl.installed() == replaced
        # A module imported after the install binds the drop-in; uninstall puts it back.
        late = types.ModuleType("late_recipe")
        late.rearrange = standin.rearrange_micro_batches
        sys.modules["late_recipe"] = late

        restored = rlsched_verl.uninstall()
        assert sorted(restored) == sorted(replaced + ["late_recipe.rearrange"])
        for name in rlsched_verl.FUNCTIONS:
            assert getattr(standin, name) is originals[name]
        assert engine.rearrange_micro_batches is originals["rearrange_micro_batches"]
        assert recipe.balance is originals["get_seqlen_balanced_partitions"]
        assert late.rearrange is originals["rearrange_micro_batches"]
        assert rlsched_verl.installed() == []
        assert rlsched_verl.uninstall() == []
    finally:
        sys.modules.pop("my_recipe", None)
        sys.modules.pop("late_recipe", None)


def test_install_refuses_without_the_native_module(standin, monkeypatch):
    monkeypatch.setattr(rlsched.client, "_native", None)
    original = standin.rearrange_micro_batches
    with pytest.raises(ImportError, match="native module"):
        rlsched_verl.install()
    assert standin.rearrange_micro_batches is original
    assert rlsched_verl.installed() == []


def test_a_decorated_upstream_function_is_refused(monkeypatch):
    source = STANDIN_SOURCE.replace("def get_reverse_idx(idx_map):", """def _logged(f):
    import functools

    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        return f(*args, **kwargs)
    return wrapper


@_logged
def get_reverse_idx(idx_map):""")
    register_standin(lambda name, m: monkeypatch.setitem(sys.modules, name, m), source)
    with pytest.raises(rlsched.integrations.IncompatibleUpstreamError,
                       match="get_reverse_idx: wrapped by a decorator"):
        rlsched_verl.install()


def test_install_without_verl_does_nothing(monkeypatch):
    monkeypatch.setitem(sys.modules, "verl", None)  # `import verl` fails
    assert rlsched_verl.install() == []
    assert rlsched_verl.installed() == []
    assert rlsched_verl.check() == []


def _old_verl(monkeypatch):
    """The stand-in with rearrange_micro_batches as verl b178a3cd declared it (no
    force_group_size)."""
    source = STANDIN_SOURCE[:STANDIN_SOURCE.index("def rearrange_micro_batches")] + \
        OLD_REARRANGE + STANDIN_SOURCE[STANDIN_SOURCE.index("def get_reverse_idx"):]
    return register_standin(lambda name, m: monkeypatch.setitem(sys.modules, name, m), source)


def test_install_refuses_a_changed_signature_and_names_the_parameter(monkeypatch):
    module = _old_verl(monkeypatch)
    original = module.rearrange_micro_batches
    with pytest.raises(rlsched.integrations.IncompatibleUpstreamError) as error:
        rlsched_verl.install()
    message = str(error.value)
    assert "verl.utils.seqlen_balancing.rearrange_micro_batches" in message
    assert "'force_group_size' is missing" in message
    assert "verl-project/verl 1dda039b9" in message and "force=True" in message
    assert error.value.field == "verl.utils.seqlen_balancing.rearrange_micro_batches"
    assert isinstance(error.value, TypeError)
    assert rlsched_verl.installed() == [], "nothing replaced"
    assert module.rearrange_micro_batches is original
    assert module.get_reverse_idx is not rlsched_verl.get_reverse_idx
    assert rlsched_verl.check() == [
        "verl.utils.seqlen_balancing.rearrange_micro_batches: parameter 8 "
        "'force_group_size' is missing"]
    try:
        assert len(rlsched_verl.install(force=True)) == 6
        assert module.rearrange_micro_batches is rlsched_verl.rearrange_micro_batches
    finally:
        rlsched_verl.uninstall()


@pytest.mark.parametrize("change, says", [
    ("def get_reverse_idx(idx_map, inplace=False):", "parameter 2 'inplace' (inplace=False "),
    ("def get_reverse_idx(index_map):", "parameter 1 is index_map (positional or keyword), "
                                        "expected idx_map"),
    ("def get_reverse_idx(*, idx_map):", "parameter 1 is idx_map (keyword-only)"),
    ("get_reverse_idx = None\ndef _gone(idx_map):", "get_reverse_idx: not defined"),
])
def test_install_refuses_any_difference(monkeypatch, change, says):
    source = STANDIN_SOURCE.replace("def get_reverse_idx(idx_map):", change)
    module = register_standin(lambda name, m: monkeypatch.setitem(sys.modules, name, m), source)
    with pytest.raises(rlsched.integrations.IncompatibleUpstreamError, match="get_reverse_idx"):
        rlsched_verl.install()
    assert says in " ".join(rlsched_verl.check())
    assert module.rearrange_micro_batches is not rlsched_verl.rearrange_micro_batches


def test_a_changed_default_is_refused(monkeypatch):
    source = STANDIN_SOURCE.replace("use_dynamic_bsz_balance=True, force_group_size=1",
                                    "use_dynamic_bsz_balance=False, force_group_size=1", 1)
    register_standin(lambda name, m: monkeypatch.setitem(sys.modules, name, m), source)
    assert rlsched_verl.check() == [
        "verl.utils.seqlen_balancing.rearrange_micro_batches: parameter 7 is "
        "use_dynamic_bsz_balance=False (positional or keyword), expected "
        "use_dynamic_bsz_balance=True (positional or keyword)"]


def _random_values(rng, n):
    kind = rng.random()
    if kind < 0.4:  # rollout lengths
        return [rng.randint(100, 500) + min(16384, round(rng.lognormvariate(6.67, 1.15)))
                for _ in range(n)]
    if kind < 0.7:  # verl's workload key of such lengths, above 2^31 for long ones
        return [24576 * s + s * s for s in
                (rng.randint(1, 60000) if rng.random() < 0.3 else rng.randint(1, 4000)
                 for _ in range(n))]
    if kind < 0.85:
        return [rng.randint(0, 5) for _ in range(n)]  # ties and zeros
    return [rng.choice([1, 1000, 32768]) for _ in range(n)]


@pytest.mark.parametrize("seed", range(30))
def test_partitions_are_verls_structure_and_at_least_as_balanced(standin, seed):
    rng = random.Random(seed)
    reference = standin.get_seqlen_balanced_partitions
    rlsched_verl.install()
    assert standin.get_seqlen_balanced_partitions is rlsched_verl.get_seqlen_balanced_partitions
    for _ in range(6):
        k = rng.choice([1, 2, 3, 4, 8, 16, 32])
        equal_size = rng.random() < 0.5
        n = k * rng.randint(1, 12) if equal_size else rng.randint(k, 12 * k)
        values = _random_values(rng, n)
        ours = standin.get_seqlen_balanced_partitions(values, k, equal_size)
        theirs = reference(values, k, equal_size)
        _check_partition(ours, n, k)
        _check_partition(theirs, n, k)
        if equal_size:
            assert [len(p) for p in ours] == [n // k] * k
        ours_max = max(sum(values[i] for i in p) for p in ours)
        theirs_max = max(sum(values[i] for i in p) for p in theirs)
        assert ours_max <= theirs_max, (values, k, equal_size)
        # Tensors, as verl passes them.
        assert rlsched_verl.get_seqlen_balanced_partitions(
            torch.tensor(values), k, equal_size) == ours


def test_partition_errors_name_the_argument(standin):
    rlsched_verl.install()
    with pytest.raises(ValueError, match="k_partitions"):
        rlsched_verl.get_seqlen_balanced_partitions([1, 2], 3, False)
    with pytest.raises(ValueError, match="equal_size"):
        rlsched_verl.get_seqlen_balanced_partitions([1, 2, 3], 2, True)
    with pytest.raises(ValueError, match="overflows int64"):
        rlsched_verl.get_seqlen_balanced_partitions([2**62, 2**62, 1], 2, False)


def test_values_the_partitioner_does_not_take_go_to_verls_function(standin, monkeypatch):
    import numpy
    cases = [[1.5, 2.25, 3.0, 7.75, 0.5, 4.0],  # fractions
             [1, -2, 3, 4],  # a negative workload
             [numpy.float32(v) for v in (1.5, 2.0, 3.0, 4.0)],  # numpy scalars
             [torch.tensor(v) for v in (1.5, 2.0, 3.0, 4.0)]]  # 0-d float tensors
    rlsched_verl.install()
    for values in cases:
        expected = rlsched_verl.INTEGRATION.originals["get_seqlen_balanced_partitions"](
            values, 2, True)
        assert rlsched_verl.get_seqlen_balanced_partitions(values, 2, True) == expected
    # Integral values of any of those types are rlsched's.
    for values in ([torch.tensor(v) for v in (5, 1, 4, 2)], [numpy.int64(v) for v in (5, 1, 4, 2)],
                   torch.tensor([5.0, 1.0, 4.0, 2.0])):
        assert sorted(rlsched_verl.get_seqlen_balanced_partitions(values, 2, True)) == \
            [[0, 1], [2, 3]]
    monkeypatch.setattr(rlsched_verl.INTEGRATION, "originals", {})
    with pytest.raises(ValueError, match="must be an integer"):
        rlsched_verl.get_seqlen_balanced_partitions(cases[0], 2, True)
    with pytest.raises(ValueError, match=r"seqlen_list\[1\]: must be >= 0, got -2") as error:
        rlsched_verl.get_seqlen_balanced_partitions([1, -2, 3], 2, False)
    assert error.value.field == "seqlen_list[1]"


def test_no_part_is_empty_when_zeros_would_leave_one():
    for n, k in [(5, 3), (4, 4), (9, 8)]:
        values = [0] * (n - 1) + [5]
        _check_partition(rlsched_verl.get_seqlen_balanced_partitions(values, k, False), n, k)


@pytest.mark.parametrize("seed", range(10))
def test_group_partitions_keep_runs_and_balance(standin, seed):
    rng = random.Random(100 + seed)
    reference = standin.get_group_balanced_partitions
    rlsched_verl.install()
    for _ in range(4):
        k = rng.choice([1, 2, 4, 8])
        runs = k * rng.randint(1, 6)
        group_size = rng.choice([1, 4, 8])
        lengths = [rng.randint(1, 8000) for _ in range(runs * group_size)]
        # Run labels that repeat a uid after another one: runs, not uids, are the unit.
        uids = [f"u{(r % 3)}" for r in range(runs) for _ in range(group_size)]
        ours = standin.get_group_balanced_partitions(lengths, uids, k)
        theirs = reference(lengths, uids, k)
        n = len(lengths)
        _check_partition(ours, n, k)
        _check_partition(theirs, n, k)
        part_of = {i: p for p, part in enumerate(ours) for i in part}
        for r in range(runs):
            members = range(r * group_size, (r + 1) * group_size)
            assert len({part_of[i] for i in members}) == 1, "a run stays on one part"
        assert all(len(p) == n // k for p in ours), "equal runs per part"

        def heaviest(parts):
            return max(sum(24576 * lengths[i] + lengths[i] ** 2 for i in p) for p in parts)

        assert heaviest(ours) <= heaviest(theirs)


def test_group_partitions_errors():
    with pytest.raises(ValueError, match="uid_list"):
        rlsched_verl.get_group_balanced_partitions([1, 2, 3], ["a", "b"], 1)
    with pytest.raises(ValueError, match=r"k_partitions: must divide the number of uid runs "
                                         r"\(2: consecutive equal uids\), got 3"):
        rlsched_verl.get_group_balanced_partitions([1, 2, 3], ["a", "a", "b"], 3)
    # 5 runs on 2 ranks: verl asserts; a run split across ranks would break the grouper.
    with pytest.raises(ValueError, match="must divide the number of uid runs \\(5"):
        rlsched_verl.get_group_balanced_partitions([1] * 10, list("aabbaaccdd"), 2)


def _padded_batch(lengths, width):
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for i, length in enumerate(lengths):
        mask[i, :length] = 1
    ids = torch.arange(len(lengths) * width).reshape(len(lengths), width)
    return {"input_ids": ids, "attention_mask": mask}


class _TensorDict(dict):
    """What prepare_micro_batches reads of verl's TensorDict: tensors by key, the
    non-tensor entries through tu.get_non_tensor_data."""

    def __init__(self, tensors, **non_tensor):
        super().__init__(tensors)
        self.non_tensor = non_tensor


def test_micro_batches_never_break_the_cap_where_the_recipe_does(standin):
    # 8 sequences of 7 tokens under a cap of 8: the recipe plans ceil(56 / 8) = 7
    # micro-batches, so one holds 14 tokens.
    batch = _padded_batch([7] * 8, 8)
    _, recipe = standin.prepare_dynamic_batch(batch, max_token_len=8)
    assert max(len(p) * 7 for p in recipe) == 14
    rlsched_verl.install()
    micro_batches, parts = standin.prepare_dynamic_batch(batch, max_token_len=8)
    assert len(parts) == 8 and all(len(p) == 1 for p in parts)
    assert len(micro_batches) == 8


def _check_micro_batches(parts, lengths, group, cap, alone=False):
    """verl's invariants (tests/utils/test_seqlen_balancing.py at 1dda039): every index
    once, each index list ascending; and ours: each run of `group` samples in one
    micro-batch, the cap kept (an oversized run alone when `alone`)."""
    n = len(lengths)
    _check_partition(parts, n, len(parts))
    where = {i: k for k, part in enumerate(parts) for i in part}
    for g in range(n // group):
        assert len({where[i] for i in range(g * group, (g + 1) * group)}) == 1, \
            f"run {g} split across micro-batches"
    for part in parts:
        tokens = sum(lengths[i] for i in part)
        if tokens > cap:
            assert alone, "the cap is broken"
            runs = {i // group for i in part if lengths[i] > 0}
            assert len(runs) == 1, "an oversized run shares its micro-batch"


@pytest.mark.parametrize("seed", range(16))
def test_engine_micro_batches_structure_cap_groups_and_order(standin, seed):
    """prepare_micro_batches's exact call (force_group_size from the data), then the
    outputs put back in order by restore_dynamic_batch, as postprocess_batch_func does."""
    rng = random.Random(200 + seed)
    engine = sys.modules["verl.workers.engine.utils"]
    rlsched_verl.install()
    for _ in range(4):
        group = rng.choice([1, 1, 2, 4])
        n = group * rng.randint(1, 48 // group)
        width = rng.choice([64, 512, 2048])
        lengths = [rng.randint(1, width) for _ in range(n)]
        per_gpu = rng.randint(width * group, 4 * width * group)
        sp_size = rng.choice([1, 2])
        cap = per_gpu * sp_size
        minimum = rng.choice([None, 1, 2, 3])
        multiple = rng.choice([None, 1, 2, 4])
        balance = rng.random() < 0.5
        data = _TensorDict(_padded_batch(lengths, width), force_group_size=group,
                           sp_size=sp_size)
        data["max_token_len_per_gpu"] = per_gpu
        units = [sum(lengths[u * group:(u + 1) * group]) for u in range(n // group)]
        fewest = _round_up(max(minimum or 1, _first_fit_decreasing_bins(units, cap)),
                           multiple or 1)
        try:
            micro_batches, parts = engine.prepare_micro_batches(
                data, dp_group=None, num_batches_divided_by=multiple, same_micro_num_in_dp=True,
                min_num_micro_batch=minimum, use_dynamic_bsz_balance=balance)
        except ValueError as error:
            # Only when the minimum or the multiple forces more micro-batches than runs
            # (verl asserts then).
            assert error.field in ("num_batches_divided_by", "min_num_micro_batch")
            assert fewest > n // group
            continue
        count = len(parts)
        assert len(micro_batches) == count
        _check_micro_batches(parts, lengths, group, cap)
        assert count >= max(minimum or 1, math.ceil(sum(lengths) / cap))
        if multiple:
            assert count % multiple == 0
        assert count <= fewest, "the fewest that keep the cap"
        for micro_batch, part in zip(micro_batches, parts):
            assert torch.equal(micro_batch["input_ids"], data["input_ids"][part])
        outputs = torch.cat([m["input_ids"] for m in micro_batches])
        assert torch.equal(engine.restore(outputs, parts), data["input_ids"])


def test_reward_model_pairs_stay_together_where_the_count_is_forced(standin):
    # Pairs (chosen, rejected) of 300 + 300 tokens under a cap of 700: each pair alone.
    engine = sys.modules["verl.workers.engine.utils"]
    rlsched_verl.install()
    lengths = [300, 300, 250, 350, 100, 120, 400, 200]
    data = _TensorDict(_padded_batch(lengths, 400), force_group_size=2)
    data["max_token_len_per_gpu"] = 700
    _, parts = engine.prepare_micro_batches(data, dp_group=None, min_num_micro_batch=2)
    _check_micro_batches(parts, lengths, 2, 700)
    assert sorted(map(tuple, parts)) == [(0, 1), (2, 3), (4, 5), (6, 7)]


def test_oversize_policy_raise_names_the_sample_or_group_and_alone_isolates(standin):
    rlsched_verl.install()
    lengths = [30, 90, 40, 10, 20, 20]
    batch = _padded_batch(lengths, 100)
    with pytest.raises(ValueError, match=r"max_token_len: sample 1 has 90 tokens, above "
                                         r"max_token_len = 80 \(oversize policy 'raise'") as e:
        rlsched_verl.rearrange_micro_batches(batch, 80)
    assert e.value.field == "max_token_len"
    # A forced pair above the cap whose samples fit: alone (verl lets it break the cap).
    _, parts = rlsched_verl.rearrange_micro_batches(batch, 100, force_group_size=2)
    _check_micro_batches(parts, lengths, 2, 100, alone=True)
    assert [0, 1] in parts
    with pytest.raises(ValueError, match="force_group_size: the batch's 6 samples must be a "
                                         "multiple of it, got 4"):
        rlsched_verl.rearrange_micro_batches(batch, 100, force_group_size=4)
    rlsched_verl.install(oversize="alone")
    _, parts = rlsched_verl.rearrange_micro_batches(batch, 80)
    _check_micro_batches(parts, lengths, 1, 80, alone=True)
    assert [1] in parts
    _, parts = rlsched_verl.rearrange_micro_batches(batch, 100, force_group_size=2)
    _check_micro_batches(parts, lengths, 2, 100, alone=True)
    assert [0, 1] in parts
    with pytest.raises(ValueError, match="oversize: must be one of raise, alone"):
        rlsched_verl.install(oversize="drop")


def _round_up(value, multiple):
    return -(-value // multiple) * multiple


def _first_fit_decreasing_bins(lengths, cap):
    loads = []
    for length in sorted(lengths, reverse=True):
        for b, load in enumerate(loads):
            if load + length <= cap:
                loads[b] += length
                break
        else:
            loads.append(length)
    return len(loads)


class _Jagged:
    """What rearrange_micro_batches reads of a jagged nested tensor (torch 1.13 has no
    offsets())."""
    is_nested = True

    def __init__(self, lengths):
        self._offsets = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)))

    def offsets(self):
        return self._offsets


def test_micro_batches_of_nested_input_ids_and_errors(standin):
    rlsched_verl.install()
    lengths = [5, 9, 3, 8, 2]
    batch = {"input_ids": _Jagged(lengths), "rows": torch.arange(5)}
    select = sys.modules["verl.utils.tensordict_utils"]
    select.index_select_tensor_dict = lambda b, p: {"rows": b["rows"][p]}
    micro_batches, parts = rlsched_verl.rearrange_micro_batches(batch, max_token_len=10)
    _check_micro_batches(parts, lengths, 1, 10)
    assert len(parts) == 3  # 27 tokens under 10
    assert [m["rows"].tolist() for m in micro_batches] == parts
    with pytest.raises(ValueError, match="sample 1 has 9 tokens, above max_token_len = 8"):
        rlsched_verl.rearrange_micro_batches(batch, max_token_len=8)
    with pytest.raises(ValueError, match="min_num_micro_batch"):
        rlsched_verl.rearrange_micro_batches(batch, max_token_len=10, min_num_micro_batch=6)
    with pytest.raises(ValueError, match="max_token_len: must be >= 1, got 0"):
        rlsched_verl.rearrange_micro_batches(batch, max_token_len=0)


@pytest.mark.parametrize("seed", range(6))
def test_driver_balance_batch_paths(standin, seed):
    """_balance_batch's three calls: a permutation split into dp_size equal parts, each
    mini-batch split evenly with keep_minibatch, uid runs on one rank with the prefix
    grouper; and sft_trainer_ray's float32 workloads."""
    rng = random.Random(400 + seed)
    trainer = sys.modules["verl.trainer.ppo.ray_trainer"]
    rlsched_verl.install()
    dp = rng.choice([1, 2, 4])
    group = rng.choice([1, 4, 8])
    prompts = dp * rng.randint(1, 6)
    n = prompts * group
    mask = _padded_batch([rng.randint(1, 3000) for _ in range(n)], 3000)["attention_mask"]
    parts = trainer.balance_batch(mask, dp)
    _check_partition(parts, n, dp)
    assert all(len(p) == n // dp for p in parts)
    mini = n // rng.choice([d for d in (1, 2) if (n // dp) % d == 0])
    parts = trainer.balance_batch(mask, dp, minibatch_size=mini)
    assert sorted(i for p in parts for i in p) == list(range(n))
    for m in range(n // mini):
        inside = [[i for i in p if m * mini <= i < (m + 1) * mini] for p in parts]
        assert [len(p) for p in inside] == [mini // dp] * dp
    uids = [f"p{u}" for u in range(prompts) for _ in range(group)]
    parts = trainer.balance_batch(mask, dp, uid_list=uids)
    _check_partition(parts, n, dp)
    owner = {i: r for r, p in enumerate(parts) for i in p}
    assert all(len({owner[i] for i in range(u * group, (u + 1) * group)}) == 1
               for u in range(prompts))
    # sft_trainer_ray.py:314: calculate_workload of a float32 tensor.
    work = standin.calculate_workload(torch.Tensor([float(v) for v in mask.sum(-1).tolist()]))
    _check_partition(standin.get_seqlen_balanced_partitions(work, k_partitions=dp,
                                                            equal_size=True), n, dp)


_DP_FAIL_SCRIPT = textwrap.dedent('''
    import json, sys
    import torch.distributed as dist
    sys.path[:0] = [{paths}]
    sys.path.insert(0, {here!r})
    import test_verl
    test_verl.register_standin(sys.modules.__setitem__)
    from rlsched.integrations import verl as rlsched_verl
    rank, mode = int(sys.argv[1]), sys.argv[3]
    dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=rank,
                            world_size=2)
    rlsched_verl.install()
    import verl.workers.engine.utils as engine
    lengths = {{"oversized": [[50, 120, 30], [60, 60, 60]],
                "short": [[10, 10, 10], [60, 60, 60, 60]]}}[mode][rank]
    data = test_verl._TensorDict(test_verl._padded_batch(lengths, 120))
    data["max_token_len_per_gpu"] = 100
    try:
        engine.prepare_micro_batches(data=data, dp_group=dist.group.WORLD)
        print(json.dumps({{"error": None}}))
    except ValueError as error:
        print(json.dumps({{"error": error.field}}))
    dist.destroy_process_group()
''')


@pytest.mark.parametrize("mode, fields", [("oversized", ["max_token_len", "dp_group"]),
                                          ("short", ["dp_group", "dp_group"])])
def test_a_batch_refused_on_one_rank_stops_every_rank(tmp_path, mode, fields):
    """Rank 0's batch is refused (a sample above the cap; or fewer samples than the
    micro-batches rank 1 needs): both ranks raise, neither waits in a collective."""
    import json
    script = _DP_FAIL_SCRIPT.format(paths=", ".join(repr(p) for p in sys.path if p),
                                    here=os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    processes = [subprocess.Popen([sys.executable, "-c", script, str(rank),
                                   str(tmp_path / "store"), mode],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=env) for rank in range(2)]
    outputs = []
    for process in processes:
        try:
            out, err = process.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            for p in processes:
                p.kill()
            pytest.fail("a rank waited in a collective")
        assert process.returncode == 0, err
        outputs.append(json.loads(out.strip().splitlines()[-1])["error"])
    assert outputs == fields


_DP_SCRIPT = textwrap.dedent('''
    import json, sys
    import torch.distributed as dist
    sys.path[:0] = [{paths}]
    sys.path.insert(0, {here!r})
    import test_verl
    test_verl.register_standin(sys.modules.__setitem__)
    from rlsched.integrations import verl as rlsched_verl
    rank = int(sys.argv[1])
    dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=rank,
                            world_size=2)
    rlsched_verl.install()
    import verl.workers.engine.utils as engine
    import verl.utils.seqlen_balancing as sb
    # Rank 0 needs 3 micro-batches, rank 1 needs 5; both must run 5.
    lengths = [[100] * 4 + [20] * 6, [90] * 9 + [10]][rank]
    data = test_verl._TensorDict(test_verl._padded_batch(lengths, 100), force_group_size=2)
    data["max_token_len_per_gpu"] = 200
    _, parts = engine.prepare_micro_batches(data=data, dp_group=dist.group.WORLD,
                                            same_micro_num_in_dp=True)
    # As verl: no group, no all-reduce.
    _, no_group = sb.prepare_dynamic_batch(data, max_token_len=200)
    _, unsynced = sb.rearrange_micro_batches(data, 200, dp_group=dist.group.WORLD,
                                             same_micro_num_in_dp=False)
    print(json.dumps({{"parts": parts, "no_group": len(no_group),
                       "unsynced": len(unsynced)}}))
    dist.destroy_process_group()
''')


def test_micro_batch_count_agrees_across_data_parallel_ranks(tmp_path):
    import json
    script = _DP_SCRIPT.format(paths=", ".join(repr(p) for p in sys.path if p),
                               here=os.path.dirname(os.path.abspath(__file__)))
    store = tmp_path / "store"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    processes = [subprocess.Popen([sys.executable, "-c", script, str(rank), str(store)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=env) for rank in range(2)]
    outputs = []
    for process in processes:
        out, err = process.communicate(timeout=180)
        assert process.returncode == 0, err
        outputs.append(json.loads(out.strip().splitlines()[-1]))
    assert [o["unsynced"] for o in outputs] == [3, 5]
    assert [o["no_group"] for o in outputs] == [3, 5]
    lengths = [[100] * 4 + [20] * 6, [90] * 9 + [10]]
    for rank, output in enumerate(outputs):
        assert len(output["parts"]) == 5
        _check_micro_batches(output["parts"], lengths[rank], 2, 200)


@pytest.mark.parametrize("seed", range(5))
def test_reverse_idx(seed):
    rng = random.Random(300 + seed)
    n = rng.randint(0, 50)
    permutation = list(range(n))
    rng.shuffle(permutation)
    inverse = rlsched_verl.get_reverse_idx(permutation)
    assert isinstance(inverse, list)
    assert all(inverse[permutation[i]] == i for i in range(n))
    tensor = rlsched_verl.get_reverse_idx(torch.tensor(permutation, dtype=torch.int64))
    assert isinstance(tensor, torch.Tensor) and tensor.dtype == torch.int64
    assert tensor.tolist() == inverse
    numpy = pytest.importorskip("numpy")
    array = rlsched_verl.get_reverse_idx(numpy.array(permutation, dtype=numpy.int32))
    assert isinstance(array, numpy.ndarray) and array.dtype == numpy.int32
    assert array.tolist() == inverse


def test_reverse_idx_errors():
    with pytest.raises(ValueError, match=r"idx_map\[2\]: 0 is also idx_map\[0\]"):
        rlsched_verl.get_reverse_idx([0, 1, 0])
    with pytest.raises(ValueError, match=r"idx_map\[1\]: must be in \[0, 2\), got 5"):
        rlsched_verl.get_reverse_idx([0, 5])


def test_the_pin_checker_reads_a_checkout_without_importing_it(tmp_path):
    """scripts/check_upstream_pins.py on a checkout written from the stand-in (ok) and
    from the older signature (refused, exit 1)."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts",
                          "check_upstream_pins.py")
    older = STANDIN_SOURCE[:STANDIN_SOURCE.index("def rearrange_micro_batches")] + \
        OLD_REARRANGE + STANDIN_SOURCE[STANDIN_SOURCE.index("def get_reverse_idx"):]
    for source, status in ((STANDIN_SOURCE, 0), (older, 1)):
        root = tmp_path / str(status)
        (root / "verl" / "utils").mkdir(parents=True)
        (root / "verl" / "utils" / "seqlen_balancing.py").write_text(source)
        # The checkpoint engine's interface, pinned beside the drop-ins.
        (root / "verl" / "checkpoint_engine").mkdir()
        shutil.copy(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                 "standin_packages", "verl", "checkpoint_engine", "base.py"),
                    root / "verl" / "checkpoint_engine" / "base.py")
        run = subprocess.run([sys.executable, script, "--verl", str(root)],
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == status, run.stdout + run.stderr
        assert ("DIFF verl.utils.seqlen_balancing.rearrange_micro_batches" in run.stdout) == \
            bool(status)
