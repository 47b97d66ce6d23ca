"""rlsched in AReaL: the ``"kk"`` allocator of ``areal.utils.seqpack``.

Written for areal-project/AReaL at commit cbff54d64 (2026-08-22); the signatures of that
commit are checked at :func:`install` (see :mod:`rlsched.integrations`). ::

    import rlsched.integrations.areal as rlsched_areal
    rlsched_areal.install()   # then mb_spec.packing_algorithm: kk

AReaL picks an allocator by name, ``get_allocate_fn(algorithm="ffd")``
(``areal/utils/seqpack.py:167``), which returns the module's ``kk_allocate`` for
``"kk"``, looked up when it is called; :func:`install` replaces that module attribute
(``kk_allocate(values, capacity, min_groups, n_groups_divisor=1, equal_size=False)``,
``seqpack.py:446``), so every caller of ``get_allocate_fn("kk")`` gets rlsched's. The call
sites it serves, at that commit:

* ``areal/utils/data.py:468-474`` ``allocate_balanced_mbs`` (micro-batches of
  ``split_padded_tensor_dict_into_mb_list``, the FSDP, Megatron and Archon engines)::

      allocate_fn(lens, mb_spec.max_tokens_per_mb, min_groups=mb_spec.n_mbs,
                  n_groups_divisor=mb_spec.n_mbs_divisor)

  with ``lens`` a numpy int64 array of per-block token counts; the caller sorts the
  groups and their members, and agrees on the count across ranks itself;
* ``areal/infra/dist_rollout.py:79-84`` ``redistribute_trajectories`` (trajectories to
  data-parallel ranks: rank r takes group r, computed on every rank without a
  broadcast, so the answer must be the same in every process)::

      allocate_fn(seqlens, capacity=int(1e12), min_groups=dist.get_world_size(group))

Only the decision is replaced; the all-gather, the tensor splits and the count
agreement stay AReaL's.

The drop-in returns what AReaL's does: groups of indices into `values` (Python ints,
each group ascending, the heaviest group first), every index once, no group empty, no
group above `capacity`, at least ``min_groups`` groups (``None`` or less: the divisor)
and a multiple of ``n_groups_divisor`` where the values allow (as AReaL's, fewer groups
than the multiple when there are fewer values). The count is the smallest that keeps
the cap under those rules (``rlsched.plan_step``); the groups are then rlsched's balanced
partition into that many (``rlsched.get_seqlen_balanced_partitions``'s partitioner, with
``equal_size`` every group holding ``len(values) / k`` values) when it keeps the cap,
else, as AReaL falls back to its first-fit, the step planner's packing, which always
does. A value above the capacity,
fewer values than ``min_groups``, or ``equal_size`` with a count that does not divide
raise :class:`AllocationError` (a ValueError and, as AReaL's errors, a RuntimeError),
naming the argument.
"""

from __future__ import annotations

from typing import Any

from rlsched import client as _client
from rlsched.errors import InvalidArgumentError
from rlsched.integrations import Integration, Target, needs_native, plan_step_indices

__all__ = ["MODULE", "COMMIT", "INTEGRATION", "AllocationError", "install", "uninstall",
           "installed", "check", "kk_allocate"]

MODULE = "areal.utils.seqpack"
COMMIT = "cbff54d64"


class AllocationError(InvalidArgumentError, RuntimeError):
    """An allocation refused: a ValueError naming the argument, and a RuntimeError as
    the errors of AReaL's allocators."""


def _values(values: Any) -> list[int]:
    if hasattr(values, "tolist"):
        values = values.tolist()
    if isinstance(values, list) and all(type(value) is int and value >= 0 for value in values):
        return values
    out = []
    for i, value in enumerate(values):
        if hasattr(value, "item") and not isinstance(value, (int, float)):
            value = value.item()  # numpy scalars, 0-d tensors
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise AllocationError(f"values[{i}]: must be an integer >= 0, got {value!r}",
                                  f"values[{i}]")
        out.append(value)
    return out


def _count(values: list[int], capacity: int, minimum: int, divisor: int) -> list[list[int]]:
    """The step planner's groups: the fewest under the cap, at least `minimum` and a
    multiple of `divisor` (empty ones left out where the values cannot fill them)."""
    plan, _, _ = plan_step_indices(values, 1, capacity,
                                   min_micro_batches=min(minimum, len(values)),
                                   micro_batches_multiple_of=divisor, order="heaviest_first")
    return [indices for indices in plan[0] if indices]


def _balanced(values: list[int], k: int, equal_size: bool) -> list[list[int]]:
    # Karmarkar-Karp, LPT and refinement, without the exact search: AReaL's allocator is
    # Karmarkar-Karp alone, and on a rank's micro-batches (up to 64 values, where the
    # search would run) it was most of the drop-in's time (framework_dropins.py).
    return _client._native_solve(_client._native.partition_weights, values, k, equal_size,
                                 exact_nodes=0)


def kk_allocate(values, capacity, min_groups, n_groups_divisor=1, equal_size=False):
    """AReaL's allocator contract (see the module docstring): groups of indices of
    `values` under `capacity`, at least `min_groups`, a multiple of `n_groups_divisor`."""
    items = _values(values)
    cap, divisor = int(capacity), int(n_groups_divisor)
    if divisor < 1:
        raise AllocationError(f"n_groups_divisor: must be >= 1, got {divisor}",
                              "n_groups_divisor")
    minimum = divisor if min_groups is None or min_groups < divisor else int(min_groups)
    if items and max(items) > cap:
        i = next(i for i, value in enumerate(items) if value > cap)
        raise AllocationError(f"values[{i}]: {items[i]}, above capacity = {cap}", f"values[{i}]")
    if len(items) < minimum:
        raise AllocationError(
            f"min_groups: {minimum} groups for {len(items)} values would leave some empty",
            "min_groups")
    packed = _count(items, cap, minimum, divisor)
    k = len(packed)
    if equal_size and len(items) % k != 0:
        raise AllocationError(
            f"equal_size: {len(items)} values cannot make {k} groups of equal size",
            "equal_size")
    groups = _balanced(items, k, bool(equal_size))
    value = items.__getitem__
    sums = [sum(map(value, g)) for g in groups]
    if not all(groups) or max(sums) > cap:
        groups = packed  # the partition breaks the cap or leaves a group empty
        sums = [sum(map(value, g)) for g in groups]
    # Both give each group's indices ascending.
    ordered = sorted(zip([-total for total in sums], groups))
    return [g for _, g in ordered]


INTEGRATION = Integration("AReaL", "areal-project/AReaL", COMMIT, [
    # areal/utils/seqpack.py:446
    Target(MODULE, "kk_allocate",
           "(values, capacity, min_groups, n_groups_divisor=1, equal_size=False)", kk_allocate),
    # seqpack.py:167, which hands kk_allocate out (checked, not replaced)
    Target(MODULE, "get_allocate_fn", "(algorithm='ffd')"),
], ready=needs_native("areal"))


#: install(force=False), uninstall(), installed(), check(): the Integration's (see
#: rlsched.integrations): [] when the framework is not importable; a version whose
#: signatures differ from the pinned commit's refused, replacing nothing, unless force.
install = INTEGRATION.install
uninstall = INTEGRATION.uninstall
installed = INTEGRATION.installed
check = INTEGRATION.check
