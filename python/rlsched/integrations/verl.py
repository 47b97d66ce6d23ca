"""rlsched in verl: in-process drop-ins for ``verl.utils.seqlen_balancing``.

Written for verl-project/verl at commit 1dda039b9 (2026-08-22, after v0.9.0); the
signatures of that commit are checked at :func:`install` (see
:mod:`rlsched.integrations`). ::

    import rlsched.integrations.verl as rlsched_verl
    rlsched_verl.install()    # ['verl.utils.seqlen_balancing.get_seqlen_balanced_partitions', ...]
    ...
    rlsched_verl.uninstall()  # verl's own functions again

In Ray, install in every worker too: ``runtime_env={"worker_process_setup_hook":
"rlsched.integrations.verl.install"}``.

The call sites it serves, at that commit (file:line):

* ``verl/workers/engine/utils.py:112`` ``prepare_micro_batches`` (every training and
  inference step of the FSDP, Megatron, TorchTitan, VeOmni and Automodel engines)::

      rearrange_micro_batches(data, max_token_len=..., dp_group=..., num_batches_divided_by=...,
          same_micro_num_in_dp=..., min_num_micro_batch=..., use_dynamic_bsz_balance=...,
          force_group_size=force_group_size)

  ``data`` a TensorDict whose ``input_ids`` is nested (jagged), ``max_token_len`` the
  per-GPU budget times the sequence-parallel size; the module imported the function
  by name (line 28), so :func:`install` rebinds it there too. Then
  ``restore_dynamic_batch`` (``seqlen_balancing.py:528``, unchanged) undoes the order
  through :func:`get_reverse_idx`.
* ``verl/utils/seqlen_balancing.py:509`` ``prepare_dynamic_batch``: the same function,
  looked up in its own module at call time, without ``force_group_size``.
* ``verl/trainer/ppo/ray_trainer.py:1235`` ``RayPPOTrainer._balance_batch``:
  ``get_seqlen_balanced_partitions(workload_lst, k_partitions=dp_size, equal_size=True)``
  with ``workload_lst`` an int64 tensor of ``calculate_workload``; with
  ``keep_minibatch`` (line 1227) once per mini-batch on a slice of it; with the prefix
  grouper (line 1215) ``get_group_balanced_partitions(seqlen_list=..., uid_list=...,
  k_partitions=dp_size)``, imported at call time. ``verl/trainer/ppo/v1/trainer_base.py:1521``
  and ``verl/trainer/sft_trainer_ray.py:316`` call ``get_seqlen_balanced_partitions``
  the same way (the latter with a float32 tensor of integral workloads).

The drop-ins take the same arguments and return the same structures:

* :func:`get_seqlen_balanced_partitions` — ``k_partitions`` lists of indices, each
  ascending and non-empty, by rlsched's partitioner on the values as given (any
  non-negative integers with an int64 total; integral floats as integers; values with
  a fraction go to verl's function). Its largest part is at most a Karmarkar-Karp
  partition's (the tests check it on random instances).
* :func:`get_group_balanced_partitions` — the same with every run of equal
  consecutive uids kept on one part; a run weighs the sum of verl's
  ``calculate_workload`` over its sequences; every part holds the same number of
  runs (``k_partitions`` must divide the runs, as verl asserts: a run split across
  ranks would break its prefix grouper).
* :func:`rearrange_micro_batches` — the micro-batches and their index lists (each
  ascending), under ``max_token_len`` tokens each (never over it: verl's
  workload-balanced split can be), the fewest that allow it (at least
  ``min_num_micro_batch``, a multiple of ``num_batches_divided_by``; so the count can be
  above verl's ``ceil(tokens / cap)``, never below), the same count on every rank of
  ``dp_group`` when ``same_micro_num_in_dp`` and a group is given (as verl: no group, no
  all-reduce), tokens balanced across them; every run of ``force_group_size``
  consecutive samples in one micro-batch; lighter micro-batches at both ends
  (``use_dynamic_bsz_balance``), else heaviest first. A sample longer than the cap
  follows the oversize policy of :func:`install`: ``"raise"`` (verl's: it asserts
  ``max_token_len >=`` the longest sample) names it, ``"alone"`` gives it a micro-batch of
  its own; a forced run longer than the cap whose samples fit takes one of its own (it
  cannot be split; verl lets it break the cap). A batch refused on one rank of
  ``dp_group`` makes every rank raise (the all-reduces carry the refusal), so that no
  rank waits in a collective for one that stopped.
* :func:`get_reverse_idx` — the inverse permutation (a list, or a tensor / array
  like the argument); raises ValueError naming the entry when the argument is not a
  permutation of ``range(len)``.

Errors: :class:`rlsched.InvalidArgumentError` (a ValueError naming the argument)
where verl's functions assert; :class:`rlsched.integrations.IncompatibleUpstreamError`
from :func:`install` when the installed verl's signatures differ from 1dda039's.
"""

from __future__ import annotations

import operator
import os
import sys
from typing import Any, Callable, Optional

from rlsched import client as _client
from rlsched.errors import InvalidArgumentError, MissingDependencyError
from rlsched.integrations import Integration, Target, needs_native

__all__ = [
    "MODULE",
    "COMMIT",
    "FUNCTIONS",
    "INTEGRATION",
    "CHECKPOINT_MODULE",
    "CHECKPOINT_ENGINE",
    "OVERSIZE_POLICIES",
    "OVERSIZE_ENV",
    "install",
    "uninstall",
    "installed",
    "check",
    "get_seqlen_balanced_partitions",
    "get_group_balanced_partitions",
    "rearrange_micro_batches",
    "get_reverse_idx",
]

MODULE = "verl.utils.seqlen_balancing"
COMMIT = "1dda039b9"
#: What a sample (or forced group) above the cap does: raise (verl's behaviour) or
#: take a micro-batch of its own.
OVERSIZE_POLICIES = ("raise", "alone")

#: The environment variable that sets install()'s default oversize policy, so that a
#: Ray worker_process_setup_hook (which takes no arguments) installs the policy chosen.
OVERSIZE_ENV = "RLSCHED_VERL_OVERSIZE"

_settings = {"oversize": "raise"}


def _native():
    native = _client._native
    if native is None:
        raise MissingDependencyError(
            "rlsched.integrations.verl needs the native module rlsched._native: install the "
            "package with pip (see README.md) or build with -DRLSCHED_BUILD_PYTHON=ON")
    return native


def _solve(function, *args, **kwargs):
    return _client._native_solve(function, *args, **kwargs)


def _index(value: Any, field: str) -> int:
    if isinstance(value, bool):
        raise InvalidArgumentError(f"{field}: must be an integer, got {value!r}", field)
    try:
        return operator.index(value)
    except TypeError:
        raise InvalidArgumentError(f"{field}: must be an integer, got {value!r}", field) from None


def _at_least(value: Any, bound: int, field: str) -> int:
    number = _index(value, field)
    if number < bound:
        raise InvalidArgumentError(f"{field}: must be >= {bound}, got {number}", field)
    return number


def _as_list(values: Any) -> list:
    """A list of Python numbers: a tensor's or array's values, or a list's elements
    (0-d tensors and numpy scalars as their values)."""
    if hasattr(values, "tolist"):  # tensors, numpy arrays
        return values.tolist()
    return [v.item() if hasattr(v, "item") and not isinstance(v, (int, float)) else v
            for v in values]


def _for_verl(values: list) -> bool:
    """Values the native partitioner does not take and verl's own function does: a
    fraction (or a non-finite float) or a negative number."""
    return any((isinstance(v, float) and not v.is_integer()) or
               (isinstance(v, (int, float)) and not isinstance(v, bool) and v < 0)
               for v in values)


def _integers(values: list) -> list:
    """Integral floats (a float tensor's workloads) as ints; the rest as given."""
    return [int(v) if isinstance(v, float) and v.is_integer() else v for v in values]


def _fill_empty_parts(parts: list[list[int]], weights: list) -> None:
    """Gives each empty part the lightest item of the part with the most items. With at
    least as many items as parts such a part has two or more; the moved item weighs no
    more than the load it leaves, so the largest load does not grow."""
    for p, part in enumerate(parts):
        if part:
            continue
        donor = max(range(len(parts)), key=lambda q: (len(parts[q]), -q))
        lightest = min(parts[donor], key=lambda i: (weights[i], -i))
        parts[donor].remove(lightest)
        parts[p] = [lightest]


def _integer_input(values: Any) -> Any:
    """What the native module reads without a Python pass when the values are integers:
    a CPU integer tensor as its numpy view, an integer array as it is, a list as it is;
    None for anything else (floats: element by element)."""
    if hasattr(values, "is_floating_point"):  # a torch tensor
        if values.is_floating_point() or values.is_complex() or values.device.type != "cpu":
            return None
        return values.numpy()
    if hasattr(values, "__array_interface__"):  # numpy
        return values if values.dtype.kind in "iu" else None
    return values if isinstance(values, list) else None


def get_seqlen_balanced_partitions(seqlen_list, k_partitions, equal_size):
    """`k_partitions` parts of balanced sums of `seqlen_list` (the values as given):
    a list of lists of indices, each ascending and non-empty, every index once; with
    `equal_size` every part holds ``len(seqlen_list) // k_partitions`` indices."""
    k = _index(k_partitions, "k_partitions")
    _client._check_partition_arguments(len(seqlen_list), k, equal_size)
    partition = _native().partition_weights
    values = _integer_input(seqlen_list)
    parts = None
    if values is not None:
        try:
            parts = _solve(partition, values, k, bool(equal_size))
        except (InvalidArgumentError, TypeError):
            pass  # not non-negative integers after all: element by element below
    if parts is None:
        # Fractions, negatives, floats, 0-d tensors (the native module takes non-negative
        # integers; verl's function the rest).
        values = _as_list(seqlen_list)
        original = INTEGRATION.originals.get("get_seqlen_balanced_partitions")
        if _for_verl(values) and original is not None:
            return original(seqlen_list, k_partitions, equal_size)
        values = _integers(values)
        try:
            parts = _solve(partition, values, k, bool(equal_size))
        except InvalidArgumentError as refused:
            raise _renamed(refused, "weights", "seqlen_list") from None
    if not equal_size and any(not part for part in parts):
        _fill_empty_parts(parts, list(values))
        parts = [sorted(part) for part in parts]
    return parts


def _renamed(error: InvalidArgumentError, internal: str, argument: str) -> InvalidArgumentError:
    """The native module's error with its argument name in verl's terms."""
    if not error.field.startswith(internal):
        return error
    field = argument + error.field[len(internal):]
    return InvalidArgumentError(error.message.replace(error.field, field, 1), field)


def _workloads(lengths: list) -> list[int]:
    """verl's workload estimate of each length: its own calculate_workload when the
    module is loaded (it takes a tensor), else verl's formula for a 7B shape,
    24576·L + L² (seqlen_balancing.py:46)."""
    module = sys.modules.get(MODULE)
    estimate = getattr(module, "calculate_workload", None)
    if estimate is not None:
        try:
            import torch
        except ImportError:
            pass
        else:
            return [int(w) for w in
                    estimate(torch.tensor(lengths, dtype=torch.int64)).tolist()]
    return [24576 * int(length) + int(length) ** 2 for length in lengths]


def _runs(uids: list) -> list[list[int]]:
    runs: list[list[int]] = []
    for i, uid in enumerate(uids):
        if i > 0 and uid == uids[i - 1]:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def get_group_balanced_partitions(seqlen_list, uid_list, k_partitions):
    """`k_partitions` parts, each a list of ascending indices, with every run of equal
    consecutive uids (a prompt's responses) on one part; the runs' workloads are
    balanced and every part holds the same number of runs (k must divide them, as
    verl asserts)."""
    lengths = _as_list(seqlen_list)
    uids = _as_list(uid_list)
    if len(lengths) != len(uids):
        raise InvalidArgumentError(
            f"uid_list: must have one uid per sequence ({len(lengths)}), got {len(uids)}",
            "uid_list")
    k = _at_least(k_partitions, 1, "k_partitions")
    runs = _runs(uids)
    if len(runs) < k or len(runs) % k != 0:
        raise InvalidArgumentError(
            f"k_partitions: must divide the number of uid runs ({len(runs)}: consecutive "
            f"equal uids), got {k}", "k_partitions")
    for i, length in enumerate(lengths):
        if _index(length, f"seqlen_list[{i}]") < 0:
            raise InvalidArgumentError(f"seqlen_list[{i}]: must be >= 0, got {length}",
                                       f"seqlen_list[{i}]")
    workloads = _workloads(lengths)
    weights = [sum(workloads[i] for i in run) for run in runs]
    parts = _solve(_native().partition_weights, weights, k, True)
    return [sorted(i for r in part for i in runs[r]) for part in parts]


def _device_name() -> str:
    module = sys.modules.get(MODULE)
    device = getattr(module, "get_device_name", None)
    if device is not None:
        return device()
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


def _selector() -> Callable:
    module = sys.modules.get(MODULE)
    select = getattr(getattr(module, "tu", None), "index_select_tensor_dict", None)
    if select is not None:
        return select

    def index(batch, indices):
        import torch
        return batch[torch.tensor(indices, dtype=torch.long)]

    return index


def _effective_lengths(batch) -> list[int]:
    """Each sample's tokens: the jagged ``input_ids``' row lengths, else the
    ``attention_mask``'s row sums (seqlen_balancing.py:376-382)."""
    input_ids = batch["input_ids"]
    if getattr(input_ids, "is_nested", False):
        sizes = input_ids.offsets().diff()
    else:
        sizes = batch["attention_mask"].sum(dim=1)
    return sizes.cpu().tolist()  # Python ints (an integer tensor's tolist)


def _units(lengths: list[int], group: int, cap: int) -> list[int]:
    """The tokens of each run of `group` consecutive samples. Under the "raise" policy a
    sample above the cap is refused, naming it (verl asserts max_token_len >= the
    longest sample); a run above the cap whose samples fit takes a micro-batch of its
    own (verl lets such a run break the cap: it cannot be split)."""
    if len(lengths) % group != 0:
        raise InvalidArgumentError(
            f"force_group_size: the batch's {len(lengths)} samples must be a multiple of "
            f"it, got {group}", "force_group_size")
    if _settings["oversize"] == "raise" and lengths and max(lengths) > cap:
        i = next(i for i, tokens in enumerate(lengths) if tokens > cap)
        raise InvalidArgumentError(
            f"max_token_len: sample {i} has {lengths[i]} tokens, above max_token_len = "
            f"{cap} (oversize policy 'raise'; install(oversize='alone') gives it a "
            "micro-batch of its own)", "max_token_len")
    if group == 1:
        return lengths
    return [sum(lengths[u * group:(u + 1) * group]) for u in range(len(lengths) // group)]


class _Ranks:
    """The count agreement across `dp_group`: all-reduces of (count, failed) by MAX, so
    that a rank whose batch is refused makes every rank raise, never leaves the others
    waiting in a collective."""

    def __init__(self, dp_group) -> None:
        self.group = dp_group
        self.device = _device_name()

    def largest(self, count: int, failed: bool) -> tuple[int, bool]:
        import torch
        import torch.distributed as dist
        tensor = torch.tensor([count, int(failed)], device=self.device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self.group)
        values = tensor.cpu().tolist()
        return int(values[0]), bool(values[1])


def _agreed_plan(plan: Callable[[int], dict], minimum: int, units: int, ranks: _Ranks) -> dict:
    """The plan at the smallest count every rank of the group can take: every rank plans
    at least the largest count; the smallest feasible count at or above it is that
    count, which another all-reduce confirms (the loop's decisions use all-reduced
    values only, so every rank takes the same turns and makes the same calls)."""
    error: Optional[InvalidArgumentError] = None
    planned: dict = {}

    def attempt(count: int) -> int:
        nonlocal error, planned
        try:
            if count > units:
                raise InvalidArgumentError(
                    f"dp_group: the data-parallel ranks need {count} micro-batches each (the "
                    f"most any rank needs to keep the cap), more than this rank's {units} "
                    "samples (or forced groups): balance the batch across the ranks, or raise "
                    "max_token_len", "dp_group")
            planned = plan(count)
            return planned["micro_batches"]
        except InvalidArgumentError as refused:
            error = refused
            return 0

    count = attempt(minimum)
    target, failed = ranks.largest(count, error is not None)
    while not failed:
        if count != target:
            count = attempt(target)
        agreed, failed = ranks.largest(count, error is not None)
        if not failed and agreed == target:
            return planned
        target = agreed
    raise error or InvalidArgumentError(
        "dp_group: another data-parallel rank refused its batch (its error says why); "
        "every rank stops with it", "dp_group")


def rearrange_micro_batches(batch, max_token_len, dp_group=None, num_batches_divided_by=None,
                            same_micro_num_in_dp=True, min_num_micro_batch=None,
                            use_dynamic_bsz_balance=True, force_group_size=1):
    """Splits `batch` (``input_ids``, nested or with an ``attention_mask``) into
    micro-batches of at most `max_token_len` tokens each, every run of
    `force_group_size` consecutive samples in one; returns the micro-batches and, for
    each, the ascending indices of its samples in `batch`."""
    import torch.distributed as dist

    ranks = (_Ranks(dp_group) if same_micro_num_in_dp and dp_group is not None and
             dist.is_available() and dist.is_initialized() else None)
    try:
        lengths = _effective_lengths(batch)
        cap = _at_least(max_token_len, 1, "max_token_len")
        group = _at_least(force_group_size, 1, "force_group_size")
        units = _units(lengths, group, cap)
        minimum = 1 if min_num_micro_batch is None else _index(min_num_micro_batch,
                                                               "min_num_micro_batch")
        multiple = 0 if num_batches_divided_by is None else _index(num_batches_divided_by,
                                                                   "num_batches_divided_by")
    except InvalidArgumentError:
        if ranks is not None:
            ranks.largest(0, True)  # the others raise too, at their first all-reduce
        raise
    order = "pipeline" if use_dynamic_bsz_balance else "heaviest_first"
    native = _native()

    def plan(count: int) -> dict:
        return _solve(native.plan_step, units, 1, cap, min_micro_batches=max(count, 0),
                      micro_batches_multiple_of=multiple, order=order, oversize="alone",
                      baseline=False)

    if ranks is not None:
        planned = _agreed_plan(plan, minimum, len(units), ranks)
    else:
        planned = plan(minimum)
    count = planned["micro_batches"]
    if count > len(units):
        field = ("min_num_micro_batch" if minimum >= count else
                 "num_batches_divided_by" if multiple > 1 else "dp_group")
        what = "samples" if group == 1 else f"groups of {group} samples"
        raise InvalidArgumentError(
            f"{field}: {count} micro-batches for {len(units)} {what} would leave some "
            "empty", field)
    micro_batches = planned["ranks"][0][0]  # each one's units, ascending
    indices = ([list(micro_batch[0]) for micro_batch in micro_batches] if group == 1 else
               [[i for u in micro_batch[0] for i in range(u * group, (u + 1) * group)]
                for micro_batch in micro_batches])
    select = _selector()
    return [select(batch, part) for part in indices], indices


def get_reverse_idx(idx_map):
    """The inverse of the permutation `idx_map`: ``out[idx_map[i]] == i``; a list, or a
    tensor / numpy array of the argument's dtype for one."""
    values = _as_list(idx_map)
    n = len(values)
    inverse = [-1] * n
    for i, value in enumerate(values):
        j = _index(value, f"idx_map[{i}]")
        if not 0 <= j < n:
            raise InvalidArgumentError(f"idx_map[{i}]: must be in [0, {n}), got {j}",
                                       f"idx_map[{i}]")
        if inverse[j] != -1:
            raise InvalidArgumentError(
                f"idx_map[{i}]: {j} is also idx_map[{inverse[j]}]; not a permutation",
                f"idx_map[{i}]")
        inverse[j] = i
    module = type(idx_map).__module__ or ""
    if module.startswith("torch"):
        import torch
        return torch.tensor(inverse, dtype=idx_map.dtype, device=idx_map.device)
    if module.startswith("numpy"):
        import numpy
        return numpy.array(inverse, dtype=idx_map.dtype)
    return inverse


INTEGRATION = Integration("verl", "verl-project/verl", COMMIT, [
    # seqlen_balancing.py:213
    Target(MODULE, "get_seqlen_balanced_partitions", "(seqlen_list, k_partitions, equal_size)",
           get_seqlen_balanced_partitions),
    # seqlen_balancing.py:554
    Target(MODULE, "get_group_balanced_partitions", "(seqlen_list, uid_list, k_partitions)",
           get_group_balanced_partitions),
    # seqlen_balancing.py:348
    Target(MODULE, "rearrange_micro_batches",
           "(batch, max_token_len, dp_group=None, num_batches_divided_by=None, "
           "same_micro_num_in_dp=True, min_num_micro_batch=None, use_dynamic_bsz_balance=True, "
           "force_group_size=1)", rearrange_micro_batches),
    # seqlen_balancing.py:471
    Target(MODULE, "get_reverse_idx", "(idx_map)", get_reverse_idx),
], ready=needs_native("verl"))
FUNCTIONS = tuple(t.name for t in INTEGRATION.targets)


def install(*, force: bool = False, oversize: Optional[str] = None) -> list[str]:
    """Replaces verl's balancing functions by the drop-ins; returns what it replaced
    (``"<module>.<function>"``), ``[]`` when verl is not importable. Refuses (replacing
    nothing, :class:`~rlsched.integrations.IncompatibleUpstreamError` naming the
    function and the parameter) a verl whose signatures differ from 1dda039's, unless
    `force`. `oversize`: the policy for a sample above the cap (OVERSIZE_POLICIES;
    default: the environment variable OVERSIZE_ENV, else "raise"). Installing again is
    a no-op that returns the same list (the policy is updated)."""
    if oversize is None:
        oversize = os.environ.get(OVERSIZE_ENV) or "raise"
    if oversize not in OVERSIZE_POLICIES:
        raise InvalidArgumentError(
            f"oversize: must be one of {', '.join(OVERSIZE_POLICIES)}, got {oversize!r}",
            "oversize")
    replaced = INTEGRATION.install(force=force)
    _settings["oversize"] = oversize
    return replaced


def uninstall() -> list[str]:
    """Puts back what :func:`install` replaced; returns what it restored."""
    _settings["oversize"] = "raise"
    return INTEGRATION.uninstall()


#: What is replaced now; how the installed framework differs from the pinned commit
#: (the Integration's, see rlsched.integrations).
installed = INTEGRATION.installed
check = INTEGRATION.check


#: The module of verl's checkpoint-engine interface, and that interface at the pinned
#: commit: checked (nothing replaced) by :mod:`rlsched.integrations.verl_checkpoint`,
#: the backend "rlsched", before it registers.
CHECKPOINT_MODULE = "verl.checkpoint_engine.base"
CHECKPOINT_ENGINE = Integration("verl checkpoint engine", "verl-project/verl", COMMIT, [
    Target(CHECKPOINT_MODULE, "CheckpointEngineRegistry.register", "(backend)"),
    Target(CHECKPOINT_MODULE, "CheckpointEngineRegistry.get", "(cls, backend)"),
    Target(CHECKPOINT_MODULE, "CheckpointEngine.prepare", "(self)"),
    Target(CHECKPOINT_MODULE, "CheckpointEngine.build_topology",
           "(cls, actor_wg_world_size, rollout_world_size, metadata)"),
    Target(CHECKPOINT_MODULE, "CheckpointEngine.init_process_group", "(self, **kwargs)"),
    Target(CHECKPOINT_MODULE, "CheckpointEngine.finalize", "(self)"),
    Target(CHECKPOINT_MODULE, "CheckpointEngine.send_weights",
           "(self, weights, global_steps=None)"),
    Target(CHECKPOINT_MODULE, "CheckpointEngine.receive_weights", "(self, global_steps=None)"),
])
