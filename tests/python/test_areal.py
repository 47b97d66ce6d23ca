"""rlsched.integrations.areal against a stand-in for AReaL at commit cbff54d64.

AReaL is not installable here. The stand-in registers modules under AReaL's module
paths with the signatures of areal-project/AReaL cbff54d64 and bodies of this test's
own:

* ``areal.utils.seqpack``: ``get_allocate_fn`` handing out the module's ``ffd_allocate``
  or ``kk_allocate`` (looked up when called), a first-fit ``ffd_allocate`` and a
  Karmarkar-Karp ``kk_allocate`` under the capacity;
* ``areal.utils.data``: ``allocate_balanced_mbs`` (``data.py:452-476``: the allocator of
  ``mb_spec.packing_algorithm`` called as at lines 468-474, the groups then sorted);
* ``areal.infra.dist_rollout``: the decision of ``redistribute_trajectories``
  (``dist_rollout.py:79-88``: capacity 1e12, ``min_groups`` the world size, rank r
  taking group r).

The properties restate AReaL's ``tests/test_kk_allocate.py`` and
``tests/test_utils.py::test_micro_batch_split``: every index once, no group above the
capacity, at least ``min_groups``, a multiple of the divisor where the values allow,
exactly the world size under an unbounded capacity, equal sizes with ``equal_size``,
errors for a value above the capacity and for fewer values than groups, the same
answer twice.
"""

import random
import sys
import types

import pytest

import rlsched
import standins
from rlsched.integrations import areal as rlsched_areal

if not rlsched.native_available():
    pytest.skip("the native module rlsched._native is not built", allow_module_level=True)

np = pytest.importorskip("numpy")

SEQPACK_SOURCE = '''
PACKING_ALGORITHMS = {"ffd", "kk"}


def get_allocate_fn(algorithm: str = "ffd"):
    if algorithm == "ffd":
        return ffd_allocate
    if algorithm == "kk":
        return kk_allocate
    raise ValueError(f"no allocator {algorithm}")


def ffd_allocate(values, capacity, min_groups, n_groups_divisor=1):
    values = list(values)
    groups, loads = [[] for _ in range(min_groups)], [0] * min_groups
    for i in sorted(range(len(values)), key=lambda i: -values[i]):
        if values[i] > capacity:
            raise RuntimeError("above capacity")
        fits = [g for g in range(len(groups)) if loads[g] + values[i] <= capacity]
        g = min(fits, key=lambda g: (len(groups[g]), loads[g])) if fits else len(groups)
        if g == len(groups):
            groups.append([])
            loads.append(0)
        groups[g].append(i)
        loads[g] += values[i]
    return [g for g in groups if g]


def kk_allocate(values: list[int], capacity: int, min_groups: int, n_groups_divisor: int = 1,
                equal_size: bool = False) -> list[list[int]]:
    values = list(values)
    k = max(min_groups, -(-sum(values) // capacity))
    k = min(-(-k // n_groups_divisor) * n_groups_divisor, len(values))
    groups, loads = [[] for _ in range(k)], [0] * k
    for i in sorted(range(len(values)), key=lambda i: -values[i]):
        g = min(range(k), key=lambda g: loads[g])
        groups[g].append(i)
        loads[g] += values[i]
    if max(loads) > capacity:
        return ffd_allocate(values, capacity, min_groups, n_groups_divisor)
    return groups
'''

DATA_SOURCE = '''
from areal.utils.seqpack import get_allocate_fn


def allocate_balanced_mbs(mb_spec, lens):
    allocate_fn = get_allocate_fn(getattr(mb_spec, "packing_algorithm", "ffd"))
    group_indices = allocate_fn(
        lens,
        mb_spec.max_tokens_per_mb,
        min_groups=mb_spec.n_mbs,
        n_groups_divisor=mb_spec.n_mbs_divisor,
    )
    return sorted([sorted(g) for g in group_indices])
'''

DIST_ROLLOUT_SOURCE = '''
from areal.utils.seqpack import get_allocate_fn


def redistribution(seqlens, world_size, rank, packing_algorithm="ffd"):
    allocate_fn = get_allocate_fn(packing_algorithm)
    group_indices = allocate_fn(seqlens, capacity=int(1e12), min_groups=world_size)
    return group_indices, group_indices[rank]
'''


def register_standin(setitem, seqpack_source=SEQPACK_SOURCE):
    return standins.register(setitem, ("areal", "areal.utils", "areal.infra"), (
        ("areal.utils.seqpack", seqpack_source), ("areal.utils.data", DATA_SOURCE),
        ("areal.infra.dist_rollout", DIST_ROLLOUT_SOURCE)))["areal.utils.seqpack"]


@pytest.fixture
def standin(monkeypatch):
    yield from standins.fixture(monkeypatch, register_standin, rlsched_areal)


def check_groups(groups, values, capacity, minimum=None, divisor=1):
    n = len(values)
    assert sorted(i for g in groups for i in g) == list(range(n)), "every index once"
    assert all(g for g in groups), "no empty group"
    assert all(type(i) is int for g in groups for i in g)
    assert all(sum(values[i] for i in g) <= capacity for g in groups)
    if minimum is not None:
        assert len(groups) >= min(max(minimum, divisor), n)
    assert len(groups) % divisor == 0 or len(groups) == n


def test_install_replaces_the_kk_allocator_get_allocate_fn_hands_out(standin):
    original = standin.kk_allocate
    assert rlsched_areal.check() == []
    assert rlsched_areal.install() == ["areal.utils.seqpack.kk_allocate"]
    assert standin.get_allocate_fn("kk") is rlsched_areal.kk_allocate
    assert standin.get_allocate_fn("ffd") is standin.ffd_allocate
    rlsched_areal.uninstall()
    assert standin.get_allocate_fn("kk") is original


def test_install_refuses_another_signature(monkeypatch):
    source = SEQPACK_SOURCE.replace("n_groups_divisor: int = 1,\n                equal_size",
                                    "n_groups_divisor: int = 2,\n                equal_size")
    register_standin(lambda name, m: monkeypatch.setitem(sys.modules, name, m), source)
    with pytest.raises(rlsched.integrations.IncompatibleUpstreamError,
                       match="areal-project/AReaL cbff54d64.*n_groups_divisor=2"):
        rlsched_areal.install()


def test_areals_own_cases(standin):
    rlsched_areal.install()
    kk = standin.get_allocate_fn("kk")
    check_groups(kk([100, 200, 300, 400], 500, 1), [100, 200, 300, 400], 500, 1)
    groups = kk([100] * 10, 500, 3, 2)
    check_groups(groups, [100] * 10, 500, 3, 2)
    assert len(kk(list(range(1, 51)), int(1e12), 2)) == 2
    assert len(kk([100] * 10, 120, 1, 8)) == 10  # the divisor gives way to the values
    assert len(kk([250] * 4, 300, 2)) == 4
    check_groups(kk([280, 280, 280, 160], 400, 1), [280, 280, 280, 160], 400, 1)
    assert [len(g) for g in kk(list(range(6)), 100, 3, equal_size=True)] == [2, 2, 2]
    with pytest.raises(RuntimeError, match=r"equal_size"):
        kk([10] * 5, 100, 3, equal_size=True)
    with pytest.raises(RuntimeError, match=r"values\[1\]: 600, above capacity = 500"):
        kk([100, 600], 500, 1)
    with pytest.raises(ValueError, match="min_groups"):
        kk([100, 200], 500, 3)
    assert kk([1, 2, 3, 4], 100, 2) == kk([1, 2, 3, 4], 100, 2)
    assert kk([np.int64(v) for v in (1, 2, 3, 4)], 100, 2) == kk([1, 2, 3, 4], 100, 2)
    assert [sum(x for x in (1, 2, 3, 4) if x - 1 in g) for g in kk([1, 2, 3, 4], 100, 2)] \
        == [5, 5]


@pytest.mark.parametrize("seed", range(20))
def test_micro_batches_through_allocate_balanced_mbs(standin, seed):
    """test_micro_batch_split's invariants on allocate_balanced_mbs's call, numpy lens."""
    rng = random.Random(800 + seed)
    data = sys.modules["areal.utils.data"]
    rlsched_areal.install()
    cap = rng.choice([24, 36, 48, 100, 4096])
    lens = np.array([rng.randint(1, min(cap, 22 if cap < 4096 else 4096))
                     for _ in range(rng.randint(1, 64))], dtype=np.int64)
    spec = types.SimpleNamespace(max_tokens_per_mb=cap, n_mbs=rng.choice([None, 1, 2, 4, 8]),
                                 n_mbs_divisor=rng.choice([1, 2, 3]), packing_algorithm="kk")
    values = lens.tolist()
    try:
        groups = data.allocate_balanced_mbs(spec, lens)
    except ValueError as error:
        assert error.field == "min_groups"
        assert len(values) < max(spec.n_mbs or 0, spec.n_mbs_divisor)
        return
    check_groups(groups, values, cap, spec.n_mbs, spec.n_mbs_divisor)


@pytest.mark.parametrize("seed", range(12))
def test_redistribution_gives_every_rank_one_balanced_group(standin, seed):
    rng = random.Random(900 + seed)
    rollout = sys.modules["areal.infra.dist_rollout"]
    world = rng.choice([2, 4, 8])
    seqlens = [min(32768, 100 + int(rng.lognormvariate(7.0, 1.2)))
               for _ in range(world * rng.randint(1, 40))]
    theirs, _ = rollout.redistribution(seqlens, world, 0, "kk")
    rlsched_areal.install()
    per_rank = [rollout.redistribution(seqlens, world, rank, "kk") for rank in range(world)]
    groups = per_rank[0][0]
    assert all(p[0] == groups for p in per_rank), "the same decision on every rank"
    assert [p[1] for p in per_rank] == groups
    assert len(groups) == world
    check_groups(groups, seqlens, int(1e12), world)

    def heaviest(gs):
        return max(sum(seqlens[i] for i in g) for g in gs)

    assert heaviest(groups) <= heaviest(theirs), "no heavier than a greedy allocation"
