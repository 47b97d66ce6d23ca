"""rlsched in verl: in-process drop-ins for ``verl.utils.seqlen_balancing``.

::

    import rlsched.integrations.verl as rlsched_verl
    rlsched_verl.install()    # ['verl.utils.seqlen_balancing.get_seqlen_balanced_partitions', ...]
    ...
    rlsched_verl.uninstall()  # verl's own functions again

:func:`install` replaces, as module attributes, the functions of FUNCTIONS that
verl's ``verl.utils.seqlen_balancing`` defines, and the same functions where an
already imported ``verl.*`` module bound them by name (``from
verl.utils.seqlen_balancing import get_seqlen_balanced_partitions`` in the PPO
trainer, ``rearrange_micro_batches`` in the Megatron workers); modules imported
later bind the drop-ins, and the module's own callers (``prepare_dynamic_batch``)
look them up at call time. It returns what it replaced, does nothing when verl is
not importable (returns ``[]``), and needs the native module ``rlsched._native``.
Call it in every process that balances: the driver (the batch across the
data-parallel ranks) and each Ray worker (the micro-batches).

The drop-ins take the same arguments and return the same structures as verl's
functions of the same names:

* :func:`get_seqlen_balanced_partitions` — ``k_partitions`` lists of indices, each
  ascending and non-empty, by rlsched's partitioner on the values as given (verl
  passes its workload estimate, which may exceed 2^31 per sequence: any
  non-negative integers with an int64 total). Its largest part is at most a
  Karmarkar-Karp partition's (tests/python/test_verl.py checks it on random
  instances). Values with a fraction go to the function it replaced.
* :func:`get_group_balanced_partitions` — the same with every run of equal
  consecutive uids kept on one part; a run weighs the sum of verl's
  ``calculate_workload`` over its sequences; every part holds the same number of
  runs, give or take one.
* :func:`rearrange_micro_batches` — the micro-batches and their index lists, under
  ``max_token_len`` tokens each (never over it: the workload-balanced split it
  replaces can be), the fewest that allow it (at least ``min_num_micro_batch``, a
  multiple of ``num_batches_divided_by``), the same count on every rank of
  ``dp_group`` when ``same_micro_num_in_dp`` and torch.distributed is initialized,
  tokens balanced across them; lighter micro-batches at both ends
  (``use_dynamic_bsz_balance``), else heaviest first.
* :func:`get_reverse_idx` — the inverse permutation (a list, or a tensor / array
  like the argument); raises ValueError naming the entry when the argument is not a
  permutation of ``range(len)``.

Errors: :class:`rlsched.InvalidArgumentError` (a ValueError naming the argument)
where verl's functions assert.
"""

from __future__ import annotations

import importlib
import operator
import sys
import threading
from typing import Any, Callable

from rlsched import client as _client
from rlsched.errors import InvalidArgumentError

__all__ = [
    "MODULE",
    "FUNCTIONS",
    "install",
    "uninstall",
    "installed",
    "get_seqlen_balanced_partitions",
    "get_group_balanced_partitions",
    "rearrange_micro_batches",
    "get_reverse_idx",
]

MODULE = "verl.utils.seqlen_balancing"
FUNCTIONS = ("get_seqlen_balanced_partitions", "get_group_balanced_partitions",
             "rearrange_micro_batches", "get_reverse_idx")

_lock = threading.Lock()
# (module, attribute, the function it held) for everything install() replaced.
_replaced: list[tuple[Any, str, Callable]] = []
# verl's functions by name, from MODULE, while installed.
_originals: dict[str, Callable] = {}


def _native():
    native = _client._native
    if native is None:
        raise ImportError(
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


def _as_list(values: Any) -> list:
    if hasattr(values, "tolist"):  # tensors, numpy arrays
        values = values.tolist()
    return list(values)


def _has_fraction(values: list) -> bool:
    return any(isinstance(v, float) and not v.is_integer() for v in values)


def _fill_empty_parts(parts: list[list[int]], weights: list) -> bool:
    """Gives each empty part the lightest item of the part with the most items; returns
    whether it moved any. With at least as many items as parts such a part has two or
    more; the moved item weighs no more than the load it leaves, so the largest load
    does not grow."""
    moved = False
    for p, part in enumerate(parts):
        if part:
            continue
        donor = max(range(len(parts)), key=lambda q: (len(parts[q]), -q))
        lightest = min(parts[donor], key=lambda i: (weights[i], -i))
        parts[donor].remove(lightest)
        parts[p] = [lightest]
        moved = True
    return moved


def get_seqlen_balanced_partitions(seqlen_list, k_partitions, equal_size):
    """`k_partitions` parts of balanced sums of `seqlen_list` (the values as given):
    a list of lists of indices, each ascending and non-empty, every index once; with
    `equal_size` every part holds ``len(seqlen_list) // k_partitions`` indices."""
    values = _as_list(seqlen_list)
    if _has_fraction(values) and "get_seqlen_balanced_partitions" in _originals:
        return _originals["get_seqlen_balanced_partitions"](seqlen_list, k_partitions,
                                                            equal_size)
    k = _index(k_partitions, "k_partitions")
    _client._check_partition_arguments(len(values), k, equal_size)
    parts = _solve(_native().partition_weights, values, k, bool(equal_size))
    if not equal_size and _fill_empty_parts(parts, values):
        parts = [sorted(part) for part in parts]
    return parts


def _workloads(lengths: list) -> list[int]:
    """verl's workload estimate of each length: its own calculate_workload when the
    module is loaded (it takes a tensor), else the same formula for a 7B shape as verl
    states it, 24576·L + L²."""
    module = sys.modules.get(MODULE)
    estimate = getattr(module, "calculate_workload", None)
    if estimate is not None:
        try:
            import torch
        except ImportError:
            torch = None
        if torch is not None:
            return [int(w) for w in
                    estimate(torch.tensor(lengths, dtype=torch.int64)).tolist()]
    return [24576 * int(length) + int(length) ** 2 for length in lengths]


def get_group_balanced_partitions(seqlen_list, uid_list, k_partitions):
    """`k_partitions` parts, each a list of ascending indices, with every run of equal
    consecutive uids (a prompt's responses) on one part; the runs' workloads are
    balanced and every part holds the same number of runs, give or take one."""
    lengths = _as_list(seqlen_list)
    uids = _as_list(uid_list)
    if len(lengths) != len(uids):
        raise InvalidArgumentError(
            f"uid_list: must have one uid per sequence ({len(lengths)}), got {len(uids)}",
            "uid_list")
    k = _index(k_partitions, "k_partitions")
    if k < 1:
        raise InvalidArgumentError(f"k_partitions: must be >= 1, got {k}", "k_partitions")
    runs: list[list[int]] = []
    for i, uid in enumerate(uids):
        if i > 0 and uid == uids[i - 1]:
            runs[-1].append(i)
        else:
            runs.append([i])
    if len(runs) < k:
        raise InvalidArgumentError(
            f"k_partitions: must be at most the number of uid groups ({len(runs)}), got {k}",
            "k_partitions")
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


def rearrange_micro_batches(batch, max_token_len, dp_group=None, num_batches_divided_by=None,
                            same_micro_num_in_dp=True, min_num_micro_batch=None,
                            use_dynamic_bsz_balance=True):
    """Splits `batch` (``input_ids``, nested or with an ``attention_mask``) into
    micro-batches of at most `max_token_len` tokens each; returns the micro-batches
    and, for each, the ascending indices of its sequences in `batch`."""
    import torch
    import torch.distributed as dist

    input_ids = batch["input_ids"]
    if getattr(input_ids, "is_nested", False):
        sizes = input_ids.offsets().diff()
        widest = int(sizes.max().item()) if sizes.numel() else 0
    else:
        mask = batch["attention_mask"]
        widest = int(mask.shape[-1])
        sizes = mask.sum(dim=1)
    lengths = [int(v) for v in sizes.cpu().tolist()]
    cap = _index(max_token_len, "max_token_len")
    if cap < widest:
        raise InvalidArgumentError(
            f"max_token_len: must be >= the batch's sequence length {widest}, got {cap}",
            "max_token_len")
    minimum = 1 if min_num_micro_batch is None else _index(min_num_micro_batch,
                                                           "min_num_micro_batch")
    multiple = 0 if num_batches_divided_by is None else _index(num_batches_divided_by,
                                                               "num_batches_divided_by")
    order = "pipeline" if use_dynamic_bsz_balance else "heaviest_first"
    native = _native()

    def plan(count: int) -> dict:
        return _solve(native.plan_step, lengths, 1, cap, min_micro_batches=max(count, 0),
                      micro_batches_multiple_of=multiple, order=order)

    planned = plan(minimum)
    count = planned["micro_batches"]
    if same_micro_num_in_dp and dist.is_available() and dist.is_initialized():
        device = _device_name()

        def largest(value: int) -> int:
            tensor = torch.tensor([value], device=device)
            dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=dp_group)
            return int(tensor.cpu().item())

        # Every rank plans at least the largest count; the smallest feasible count at
        # or above it is that count, which a second all-reduce confirms (the loop's
        # decisions use all-reduced values only, so every rank takes the same turns).
        target = largest(count)
        while True:
            if count != target:
                planned = plan(target)
                count = planned["micro_batches"]
            agreed = largest(count)
            if agreed == target:
                break
            target = agreed
    if count > len(lengths):
        field = ("min_num_micro_batch" if minimum >= count else
                 "num_batches_divided_by" if multiple > 1 else "dp_group")
        raise InvalidArgumentError(
            f"{field}: {count} micro-batches for {len(lengths)} sequences would leave some "
            "empty", field)
    indices = [sorted(micro_batch[0]) for micro_batch in planned["ranks"][0][0]]
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


_DROP_INS: dict[str, Callable] = {
    "get_seqlen_balanced_partitions": get_seqlen_balanced_partitions,
    "get_group_balanced_partitions": get_group_balanced_partitions,
    "rearrange_micro_batches": rearrange_micro_batches,
    "get_reverse_idx": get_reverse_idx,
}


def _names(entries) -> list[str]:
    return [f"{getattr(module, '__name__', module)}.{name}" for module, name, _ in entries]


def install(module=None) -> list[str]:
    """Replaces verl's balancing functions by the drop-ins; returns what it replaced
    (``"<module>.<function>"``), ``[]`` when verl is not importable. `module`: the
    module object or name to patch (default MODULE). Installing again is a no-op that
    returns the same list; :func:`uninstall` restores."""
    with _lock:
        if _replaced:
            return _names(_replaced)
        if module is None or isinstance(module, str):
            name = module or MODULE
            try:
                module = importlib.import_module(name)
            except ModuleNotFoundError as error:
                if error.name and name.startswith(error.name):
                    return []  # verl is not installed
                raise
        _native()
        originals = {name: module.__dict__[name] for name in FUNCTIONS
                     if callable(module.__dict__.get(name))}
        entries = [(module, name, original) for name, original in originals.items()]
        # Modules of the same package that bound a function by name before now.
        package = module.__name__.split(".")[0]
        for other_name, other in list(sys.modules.items()):
            if other is None or other is module or not (
                    other_name == package or other_name.startswith(package + ".")):
                continue
            namespace = getattr(other, "__dict__", {})
            for name, original in originals.items():
                if namespace.get(name) is original:
                    entries.append((other, name, original))
        for target, name, _ in entries:
            setattr(target, name, _DROP_INS[name])
        _originals.update(originals)
        _replaced.extend(entries)
        return _names(entries)


def uninstall() -> list[str]:
    """Puts back what :func:`install` replaced (where the drop-in is still in place);
    returns what it restored."""
    with _lock:
        restored = []
        for target, name, original in reversed(_replaced):
            if getattr(target, name, None) is _DROP_INS[name]:
                setattr(target, name, original)
                restored.append((target, name, original))
        _replaced.clear()
        _originals.clear()
        return _names(reversed(restored))


def installed() -> list[str]:
    """What is replaced now (``"<module>.<function>"``)."""
    with _lock:
        return _names(_replaced)
