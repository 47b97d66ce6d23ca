"""rlsched in slime: a drop-in for ``slime.utils.dp_schedule.build_dp_schedule``.

Written for THUDM/slime at commit 624b824a8 (2026-08-21); the signature of that commit
is checked at :func:`install` (see :mod:`rlsched.integrations`). ::

    import rlsched.integrations.slime as rlsched_slime
    rlsched_slime.install()   # in the process that runs slime's RolloutManager

The call site it serves, at that commit: ``slime/ray/rollout.py:773``
``RolloutManager._split_train_data_by_dp``::

    partitions, micro_batch_indices, num_microbatches, global_batch_sizes = build_dp_schedule(
        self.args, self.train_parallel_config, total_lengths,
        global_batch_size=self.args.global_batch_size, rollout_indices=data["rollout_ids"])

with ``total_lengths`` the samples' token counts, ``rollout_indices`` their rollout
ids, and ``train_parallel_config`` the dict of ``dp_size``, ``cp_size``, ``vpp_size``
and ``microbatch_group_size_per_vp_stage`` (``slime/backends/megatron_utils/actor.py:100``).
``rollout.py`` imported the function by name (line 31), so :func:`install` rebinds it
there too when that module is loaded.

The drop-in returns what slime's function returns (``dp_schedule.py:82-209``): per
data-parallel rank the global sample indices in execution order, per rank its
micro-batches as consecutive ranges of local positions, per step the micro-batch count
every rank runs, and per step ``global_batch_size``. It keeps the invariants of slime's
module docstring: rollouts are grouped by id (first-seen order) and cut into steps of
``global_batch_size`` rollouts, the trailing ones that do not fill a step dropped;
every kept sample placed once; every rank runs the same count in each step, a multiple
of ``microbatch_group_size_per_vp_stage`` under virtual pipelines; each rank's
micro-batches tile its samples.

With ``args.use_dynamic_batch_size`` the decision is rlsched's: each step is planned
at once across the ranks and into micro-batches (``rlsched.plan_step``) under the cap
``max_tokens_per_gpu × cp_size`` (a sample above it alone in its own micro-batch, as
slime does), minimising the predicted step time. The cost is slime's own forward FLOPs
per sample (``slime.utils.flops_utils.calculate_fwd_flops``, a linear plus a quadratic
term in the length, read off at run time) with ``balance_by_flops`` or
``balance_data``, else tokens. Unlike slime's FLOPs balancing, the cap is kept. A plan
that would leave a micro-batch empty is refused, naming the setting. Without dynamic
batching (fixed ``micro_batch_size``), slime's own function decides. Refusals raise
:class:`ScheduleError`, a ValueError naming the setting and, where slime asserts, an
AssertionError as slime's.
"""

from __future__ import annotations

import bisect
import sys
from typing import Any

from rlsched.errors import InvalidArgumentError
from rlsched.integrations import Integration, Target, needs_native, plan_step_indices

__all__ = ["MODULE", "COMMIT", "INTEGRATION", "ScheduleError", "install", "uninstall",
           "installed", "check", "build_dp_schedule"]


class ScheduleError(InvalidArgumentError, AssertionError):
    """A schedule refused: a ValueError naming the setting, and an AssertionError where
    slime's function asserts (its own tests expect one)."""


MODULE = "slime.utils.dp_schedule"
COMMIT = "624b824a8"
FLOPS_MODULE = "slime.utils.flops_utils"


def _config(train_parallel_config: Any, key: str) -> int:
    try:
        value = int(train_parallel_config[key])
    except (KeyError, TypeError, ValueError):
        raise ScheduleError(
            f"train_parallel_config[{key!r}]: required, an integer", key) from None
    if value < 1:
        raise ScheduleError(f"train_parallel_config[{key!r}]: must be >= 1, got {value}",
                            key)
    return value


def _steps(rollout_indices: list, total: int, global_batch_size: int) -> list:
    """Each step's samples (global positions, rollout by rollout in first-seen order; a
    range when they are contiguous); trailing rollouts that do not fill a step are
    dropped."""
    if len(rollout_indices) != total:
        raise ScheduleError(
            f"rollout_indices: must have one id per sample ({total}), got {len(rollout_indices)}",
            "rollout_indices")
    try:  # ids in order (each rollout's samples together): each step a range
        ordered = rollout_indices == sorted(rollout_indices)
    except TypeError:
        ordered = False
    rollouts = list(dict.fromkeys(rollout_indices)) if ordered else []
    members: list[list[int]] = []
    if not ordered:
        by_rollout: dict[Any, list[int]] = {}
        for i, rollout in enumerate(rollout_indices):
            by_rollout.setdefault(rollout, []).append(i)
        members = list(by_rollout.values())
    count = len(rollouts) if ordered else len(members)
    if global_batch_size < 1 or count < global_batch_size:
        raise ScheduleError(
            f"global_batch_size: must be in [1, {count}] (the rollouts), "
            f"got {global_batch_size}", "global_batch_size")
    steps = count // global_batch_size
    if ordered:
        ends = [bisect.bisect_right(rollout_indices, rollouts[(s + 1) * global_batch_size - 1])
                for s in range(steps)]
        return [range(start, end) for start, end in zip([0] + ends[:-1], ends)]
    return [[i for rollout in members[s * global_batch_size:(s + 1) * global_batch_size]
             for i in rollout] for s in range(steps)]


def _flops_cost(args: Any) -> tuple[float, float]:
    """slime's forward FLOPs of one sample, f(s) = c1·s + c2·s² (flops_utils.py:74), as
    rlsched's attention cost's coefficients (linear, quadratic) in units of c1 (1 per
    token)."""
    module = sys.modules.get(FLOPS_MODULE)
    if module is None:
        import importlib
        module = importlib.import_module(FLOPS_MODULE)
    f = module.calculate_fwd_flops
    s = 1024
    one, two = float(f([s], args)), float(f([2 * s], args))
    quadratic = (two - 2 * one) / (2 * s * s)
    linear = (one - quadratic * s * s) / s
    if not linear > 0:
        raise ScheduleError(
            f"args: slime's FLOPs per token must be > 0, got {linear}", "args")
    return 1.0, max(quadratic, 0.0) / linear


def _plan(lengths: list, dp: int, cap: int, multiple: int, attention: Any):
    plan, count, empty = plan_step_indices(lengths, dp, cap,
                                           micro_batches_multiple_of=multiple,
                                           oversize="alone", attention=attention)
    if empty:
        raise ScheduleError(
            f"train_parallel_config: a step of {len(lengths)} samples cannot fill "
            f"{dp} ranks × {count} micro-batches (dp_size × a multiple of "
            f"microbatch_group_size_per_vp_stage = {multiple}) without an empty one",
            "microbatch_group_size_per_vp_stage" if multiple > 1 else "dp_size")
    return plan, count


def _place(plan: list, samples: Any, partitions: list, micro_batch_indices: list) -> None:
    """Appends each rank's planned micro-batches (indices into `samples`) to its
    partition (global positions) and their positions in it to its micro-batches."""
    offset = samples.start if isinstance(samples, range) else None
    for rank, micro_batches in enumerate(plan):
        partition, indices = partitions[rank], micro_batch_indices[rank]
        for micro_batch in micro_batches:
            start = len(partition)
            if offset == 0:
                partition.extend(micro_batch)
            elif offset is not None:
                partition.extend([offset + i for i in micro_batch])
            else:
                partition.extend([samples[i] for i in micro_batch])
            indices.append(list(range(start, len(partition))))


def build_dp_schedule(args, train_parallel_config, total_lengths, *, global_batch_size,
                      rollout_indices):
    """slime's schedule of a rollout batch (see the module docstring): ``(partitions,
    micro_batch_indices, num_microbatches, global_batch_sizes)``."""
    if not getattr(args, "use_dynamic_batch_size", False):
        return INTEGRATION.originals["build_dp_schedule"](
            args, train_parallel_config, total_lengths, global_batch_size=global_batch_size,
            rollout_indices=rollout_indices)
    lengths = total_lengths if isinstance(total_lengths, list) else list(total_lengths)
    dp = _config(train_parallel_config, "dp_size")
    cp = _config(train_parallel_config, "cp_size")
    cap = int(getattr(args, "max_tokens_per_gpu", 0) or 0) * cp
    if cap < 1:
        raise ScheduleError(
            "args.max_tokens_per_gpu: must be >= 1 with use_dynamic_batch_size",
            "max_tokens_per_gpu")
    vpp = _config(train_parallel_config, "vpp_size")
    multiple = _config(train_parallel_config, "microbatch_group_size_per_vp_stage") \
        if vpp > 1 else 1
    flops = getattr(args, "balance_by_flops", False) or getattr(args, "balance_data", False)
    attention = _flops_cost(args) if flops else None
    partitions: list[list[int]] = [[] for _ in range(dp)]
    micro_batch_indices: list[list[list[int]]] = [[] for _ in range(dp)]
    num_microbatches, global_batch_sizes = [], []
    for samples in _steps(list(rollout_indices), len(lengths), int(global_batch_size)):
        step = lengths[samples.start:samples.stop] if isinstance(samples, range) \
            else [lengths[i] for i in samples]
        plan, count = _plan(step, dp, cap, multiple, attention)
        _place(plan, samples, partitions, micro_batch_indices)
        num_microbatches.append(count)
        global_batch_sizes.append(int(global_batch_size))
    return partitions, micro_batch_indices, num_microbatches, global_batch_sizes


INTEGRATION = Integration("slime", "THUDM/slime", COMMIT, [
    # slime/utils/dp_schedule.py:82
    Target(MODULE, "build_dp_schedule",
           "(args, train_parallel_config, total_lengths, *, global_batch_size, rollout_indices)",
           build_dp_schedule),
], ready=needs_native("slime"))


#: install(force=False), uninstall(), installed(), check(): the Integration's (see
#: rlsched.integrations): [] when the framework is not importable; a version whose
#: signatures differ from the pinned commit's refused, replacing nothing, unless force.
install = INTEGRATION.install
uninstall = INTEGRATION.uninstall
installed = INTEGRATION.installed
check = INTEGRATION.check
