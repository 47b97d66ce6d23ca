"""rlsched.integrations.verl against a stand-in for verl.utils.seqlen_balancing.

verl is not installable here. The stand-in is a module registered in sys.modules
under verl's module path, with verl's function names and signatures (verl commit
b178a3cd56f58b2d502255daba591e92833930a7) and bodies of this test's own: a
Karmarkar-Karp (largest differencing) partition, the micro-batch recipe (the count
from the tokens over the cap, the workload key 24576·L + L², no check of the cap),
and a caller that looks rearrange_micro_batches up at call time, as
prepare_dynamic_batch does.
"""

import inspect
import math
import os
import random
import subprocess
import sys
import textwrap
import types

import pytest

torch = pytest.importorskip("torch", reason="python3-torch is needed for the verl stand-in")

import rlsched  # noqa: E402
from rlsched.integrations import verl as rlsched_verl  # noqa: E402

if not rlsched.native_available():
    pytest.skip("the native module rlsched._native is not built", allow_module_level=True)

STANDIN_SOURCE = '''
import heapq

import torch

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


def get_seqlen_balanced_partitions(seqlen_list, k_partitions, equal_size):
    assert len(seqlen_list) >= k_partitions
    if equal_size:
        assert len(seqlen_list) % k_partitions == 0
    parts = _differencing(list(seqlen_list), k_partitions, equal_size)
    assert all(parts)
    return [sorted(p) for p in parts]


def rearrange_micro_batches(batch, max_token_len, dp_group=None, num_batches_divided_by=None,
                            same_micro_num_in_dp=True, min_num_micro_batch=None,
                            use_dynamic_bsz_balance=True):
    lengths = batch["attention_mask"].sum(dim=1)
    count = min(len(lengths), -(-int(lengths.sum()) // max_token_len))
    if min_num_micro_batch is not None:
        count = max(count, min_num_micro_batch)
    if num_batches_divided_by is not None:
        count = -(-count // num_batches_divided_by) * num_batches_divided_by
    parts = get_seqlen_balanced_partitions(calculate_workload(lengths).tolist(), count,
                                           equal_size=False)
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


def get_group_balanced_partitions(seqlen_list, uid_list, k_partitions):
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
    return {key: value[index] for key, value in batch.items()}
'''

# verl's signatures (the commit above), as (name, default) per parameter.
VERL_SIGNATURES = {
    "get_seqlen_balanced_partitions": [("seqlen_list", None), ("k_partitions", None),
                                       ("equal_size", None)],
    "get_group_balanced_partitions": [("seqlen_list", None), ("uid_list", None),
                                      ("k_partitions", None)],
    "rearrange_micro_batches": [("batch", None), ("max_token_len", None), ("dp_group", None),
                                ("num_batches_divided_by", None),
                                ("same_micro_num_in_dp", True), ("min_num_micro_batch", None),
                                ("use_dynamic_bsz_balance", True)],
    "get_reverse_idx": [("idx_map", None)],
}


def _module(name, source=None, path=None):
    module = types.ModuleType(name)
    module.__file__ = path or f"/site-packages/{name.replace('.', '/')}.py"
    if source is not None:
        exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module


def register_standin(modules):
    """Registers verl, verl.utils, verl.utils.tensordict_utils,
    verl.utils.seqlen_balancing and a trainer that imported a function by name into
    `modules` (sys.modules or a monkeypatch-like setter); returns the stand-in."""
    verl = _module("verl", path="/site-packages/verl/__init__.py")
    verl.__path__ = []
    utils = _module("verl.utils", path="/site-packages/verl/utils/__init__.py")
    utils.__path__ = []
    verl.utils = utils
    modules("verl", verl)
    modules("verl.utils", utils)
    tu = _module("verl.utils.tensordict_utils", TENSORDICT_UTILS_SOURCE)
    utils.tensordict_utils = tu
    modules("verl.utils.tensordict_utils", tu)
    standin = _module("verl.utils.seqlen_balancing", STANDIN_SOURCE)
    utils.seqlen_balancing = standin
    modules("verl.utils.seqlen_balancing", standin)
    trainer = _module("verl.trainer.ppo.ray_trainer")
    trainer.get_seqlen_balanced_partitions = standin.get_seqlen_balanced_partitions
    modules("verl.trainer.ppo.ray_trainer", trainer)
    return standin


@pytest.fixture
def standin(monkeypatch):
    module = register_standin(lambda name, m: monkeypatch.setitem(sys.modules, name, m))
    yield module
    rlsched_verl.uninstall()


def _parameters(function):
    return [(p.name, None if p.default is inspect.Parameter.empty else p.default)
            for p in inspect.signature(function).parameters.values()]


def _check_partition(parts, n, k):
    assert isinstance(parts, list) and len(parts) == k
    seen = []
    for part in parts:
        assert isinstance(part, list) and part, "no part is empty"
        assert all(type(i) is int for i in part)
        assert part == sorted(part)
        seen.extend(part)
    assert sorted(seen) == list(range(n)), "every index exactly once"


def test_the_drop_ins_have_verls_signatures(standin):
    for name, parameters in VERL_SIGNATURES.items():
        assert _parameters(getattr(rlsched_verl, name)) == parameters, name
        assert _parameters(getattr(standin, name)) == parameters, name
        assert getattr(rlsched_verl, name).__doc__ != getattr(standin, name).__doc__


def test_install_replaces_and_uninstall_restores(standin):
    originals = {name: getattr(standin, name) for name in rlsched_verl.FUNCTIONS}
    trainer = sys.modules["verl.trainer.ppo.ray_trainer"]
    elsewhere = types.ModuleType("not_verl")
    elsewhere.get_seqlen_balanced_partitions = originals["get_seqlen_balanced_partitions"]
    sys.modules["not_verl"] = elsewhere
    try:
        replaced = rlsched_verl.install()
        assert sorted(replaced) == sorted(
            [f"verl.utils.seqlen_balancing.{name}" for name in rlsched_verl.FUNCTIONS]
            + ["verl.trainer.ppo.ray_trainer.get_seqlen_balanced_partitions"])
        for name in rlsched_verl.FUNCTIONS:
            assert getattr(standin, name) is getattr(rlsched_verl, name)
        assert trainer.get_seqlen_balanced_partitions is \
            rlsched_verl.get_seqlen_balanced_partitions
        assert elsewhere.get_seqlen_balanced_partitions is \
            originals["get_seqlen_balanced_partitions"], "only verl's modules are patched"
        assert rlsched_verl.install() == replaced, "installing twice changes nothing"
        assert rlsched_verl.installed() == replaced

        restored = rlsched_verl.uninstall()
        assert sorted(restored) == sorted(replaced)
        for name in rlsched_verl.FUNCTIONS:
            assert getattr(standin, name) is originals[name]
        assert trainer.get_seqlen_balanced_partitions is \
            originals["get_seqlen_balanced_partitions"]
        assert rlsched_verl.installed() == []
        assert rlsched_verl.uninstall() == []
    finally:
        del sys.modules["not_verl"]


def test_install_without_verl_does_nothing(monkeypatch):
    monkeypatch.setitem(sys.modules, "verl", None)  # `import verl` fails
    assert rlsched_verl.install() == []
    assert rlsched_verl.installed() == []


def test_install_by_module_name_and_partial_module(monkeypatch):
    # An older verl without get_group_balanced_partitions: the others are replaced.
    module = types.ModuleType("verl_old.utils.seqlen_balancing")
    exec(compile(STANDIN_SOURCE.replace("from verl.utils import tensordict_utils as tu", ""),
                 "verl_old.py", "exec"), module.__dict__)
    del module.get_group_balanced_partitions
    monkeypatch.setitem(sys.modules, "verl_old.utils.seqlen_balancing", module)
    try:
        replaced = rlsched_verl.install("verl_old.utils.seqlen_balancing")
        assert len(replaced) == 3
        assert "verl_old.utils.seqlen_balancing.get_group_balanced_partitions" not in replaced
        assert module.get_reverse_idx is rlsched_verl.get_reverse_idx
    finally:
        rlsched_verl.uninstall()
    assert module.get_reverse_idx is not rlsched_verl.get_reverse_idx


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
    with pytest.raises(ValueError, match=r"weights\[1\]: must be >= 0") as error:
        rlsched_verl.get_seqlen_balanced_partitions([1, -2, 3], 2, False)
    assert error.value.field == "weights[1]"
    with pytest.raises(ValueError, match="overflows int64"):
        rlsched_verl.get_seqlen_balanced_partitions([2**62, 2**62, 1], 2, False)


def test_values_with_a_fraction_go_to_verls_function(standin):
    values = [1.5, 2.25, 3.0, 7.75, 0.5, 4.0]
    expected = standin.get_seqlen_balanced_partitions(values, 2, True)
    rlsched_verl.install()
    assert rlsched_verl.get_seqlen_balanced_partitions(values, 2, True) == expected
    rlsched_verl.uninstall()
    with pytest.raises(ValueError, match="must be an integer"):
        rlsched_verl.get_seqlen_balanced_partitions(values, 2, True)


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
    with pytest.raises(ValueError, match="k_partitions.*uid groups \\(2\\)"):
        rlsched_verl.get_group_balanced_partitions([1, 2, 3], ["a", "a", "b"], 3)


def _padded_batch(lengths, width):
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for i, length in enumerate(lengths):
        mask[i, :length] = 1
    ids = torch.arange(len(lengths) * width).reshape(len(lengths), width)
    return {"input_ids": ids, "attention_mask": mask}


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


@pytest.mark.parametrize("seed", range(12))
def test_micro_batches_structure_and_cap(standin, seed):
    rng = random.Random(200 + seed)
    rlsched_verl.install()
    for _ in range(4):
        n = rng.randint(1, 96)
        width = rng.choice([64, 512, 2048])
        lengths = [rng.randint(1, width) for _ in range(n)]
        batch = _padded_batch(lengths, width)
        cap = rng.randint(width, 4 * width)
        minimum = rng.choice([None, 1, 2, 3])
        multiple = rng.choice([None, 1, 2, 4])
        if (minimum or 1) > n or (multiple or 1) > n:
            continue
        balance = rng.random() < 0.5
        fewest = _round_up(max(minimum or 1, _first_fit_decreasing_bins(lengths, cap)),
                           multiple or 1)
        try:
            micro_batches, parts = standin.rearrange_micro_batches(
                batch, cap, num_batches_divided_by=multiple, min_num_micro_batch=minimum,
                use_dynamic_bsz_balance=balance)
        except ValueError as error:
            # Only when the multiple forces more micro-batches than sequences.
            assert error.field == "num_batches_divided_by"
            assert fewest > n
            continue
        count = len(parts)
        assert len(micro_batches) == count
        _check_partition(parts, n, count)
        assert all(sum(lengths[i] for i in p) <= cap for p in parts), "under the cap"
        assert count >= max(minimum or 1, math.ceil(sum(lengths) / cap))
        if multiple:
            assert count % multiple == 0
        # The fewest that allow the cap: no more than first-fit decreasing needs.
        assert count <= fewest
        for micro_batch, part in zip(micro_batches, parts):
            assert torch.equal(micro_batch["input_ids"], batch["input_ids"][part])
            assert torch.equal(micro_batch["attention_mask"], batch["attention_mask"][part])


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


def test_micro_batches_of_nested_input_ids_and_errors(standin):
    rlsched_verl.install()

    class Jagged:  # what rearrange_micro_batches reads of a nested tensor
        is_nested = True

        def __init__(self, lengths):
            self._offsets = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)))

        def offsets(self):
            return self._offsets

    lengths = [5, 9, 3, 8, 2]
    batch = {"input_ids": Jagged(lengths), "rows": torch.arange(5)}
    select = sys.modules["verl.utils.tensordict_utils"]
    select.index_select_tensor_dict = lambda b, p: {"rows": b["rows"][p]}
    micro_batches, parts = rlsched_verl.rearrange_micro_batches(batch, max_token_len=10)
    _check_partition(parts, 5, len(parts))
    assert all(sum(lengths[i] for i in p) <= 10 for p in parts)
    assert len(parts) == 3  # 27 tokens under 10
    assert [m["rows"].tolist() for m in micro_batches] == parts
    with pytest.raises(ValueError, match="max_token_len: must be >= the batch's sequence "
                                         "length 9, got 8"):
        rlsched_verl.rearrange_micro_batches(batch, max_token_len=8)
    with pytest.raises(ValueError, match="min_num_micro_batch"):
        rlsched_verl.rearrange_micro_batches(batch, max_token_len=10, min_num_micro_batch=6)


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
    import verl.utils.seqlen_balancing as sb
    # Rank 0 needs 2 micro-batches, rank 1 needs 5; both must run 5.
    lengths = [[100, 100, 100, 20, 20, 20], [90, 90, 90, 90, 90, 90, 90, 90, 90, 10]][rank]
    batch = test_verl._padded_batch(lengths, 100)
    _, parts = sb.prepare_dynamic_batch(batch, max_token_len=200)
    _, unsynced = sb.rearrange_micro_batches(batch, 200, same_micro_num_in_dp=False)
    print(json.dumps({{"parts": parts, "unsynced": len(unsynced)}}))
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
    assert [o["unsynced"] for o in outputs] == [2, 5]
    lengths = [[100, 100, 100, 20, 20, 20], [90] * 9 + [10]]
    for rank, output in enumerate(outputs):
        _check_partition(output["parts"], len(lengths[rank]), 5)
        assert all(sum(lengths[rank][i] for i in p) <= 200 for p in output["parts"])


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
