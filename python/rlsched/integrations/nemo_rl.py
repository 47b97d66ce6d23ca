"""rlsched in NeMo-RL: a sequence packer named ``"rlsched"``.

Written for NVIDIA-NeMo/RL at commit 7ea279abf (2026-08-22); the signatures of that
commit are checked at :func:`install` (see :mod:`rlsched.integrations`). ::

    import rlsched.integrations.nemo_rl as rlsched_nemo
    rlsched_nemo.install()    # then policy.sequence_packing.algorithm: rlsched

NeMo-RL resolves a packer by name in ``nemo_rl/data/packing/algorithms.py:655``
``get_packer(algorithm, bin_capacity, collect_metrics=False, min_bin_count=None,
bin_count_multiple=None)`` through its own enum and a table built on each call, so
nothing can register a new name. :func:`install` replaces every binding of
``get_packer`` (the algorithms module, the re-export of ``nemo_rl.data.packing``, and
``nemo_rl/distributed/batched_data_dict.py:39``, which imported it by name) with one that
resolves the names of :func:`install` (``"rlsched"`` by default, case-insensitive; a
user may also map NeMo-RL's own names) to rlsched's packer and every other name to
NeMo-RL's function.

The call site it serves: ``BatchedDataDict.shard_by_batch_size`` with
``sequence_packing_args`` (``batched_data_dict.py:598``)::

    get_packer(algorithm=sequence_packing_args["algorithm"],
               bin_capacity=sequence_packing_args["max_tokens_per_microbatch"],
               collect_metrics=False, min_bin_count=shards, bin_count_multiple=shards)

then ``packer.pack(sequence_lengths=...)`` per global batch, and bins dealt to the
data-parallel shards round-robin (shard s takes ``bins[s::shards]``). The packer is a
subclass of NeMo-RL's ``SequencePacker`` (its ``pack``, bin-count adjustment and
metrics are NeMo-RL's); only ``_pack_implementation`` decides. With ``min_bin_count ==
bin_count_multiple`` (the shards, as at that call site) it plans the batch across the
shards and into micro-batches at once (``rlsched.plan_step``: the same count on every
shard, under the capacity, minimising the slowest shard's predicted time) and orders
the bins so that the round-robin deal gives each shard its planned micro-batches;
otherwise it packs one rank under the same constraints. A sequence above the capacity
raises ValueError naming it, as NeMo-RL's packers do.

Dynamic batching (``shard_by_batch_size`` with ``dynamic_batching_args``,
``batched_data_dict.py:430``) decides its micro-batches inline in that method
(``batched_data_dict.py:774-846``): the rows of each global batch sorted by length and
dealt to the shards in turn, then at each shard position the longest row across the
shards (rounded up to ``sequence_length_round``, at most the input's width), and
contiguous runs of positions under a padded budget, rows × the run's longest row <=
``max_tokens_per_microbatch``, the same runs on every shard; it fills each run greedily,
so the last one of a batch is often a few rows. :func:`install` wraps the method
(``BatchedDataDict.shard_by_batch_size``, replaced on the class): NeMo-RL's method moves
the data, then the runs are decided again by :func:`dynamic_micro_batches` (the same,
fewest, number of runs under the same budget, the heaviest run as light as possible)
and set on every shard as NeMo-RL sets them (``micro_batch_indices``,
``micro_batch_lengths``). ``install(dynamic_batching=False)`` leaves the method alone.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional

from rlsched.errors import InvalidArgumentError
from rlsched.integrations import Integration, Target, needs_native, plan_step_indices

__all__ = ["MODULE", "DATA_MODULE", "COMMIT", "INTEGRATION", "install", "uninstall",
           "installed", "check", "get_packer", "pack", "dynamic_micro_batches",
           "shard_by_batch_size"]

MODULE = "nemo_rl.data.packing.algorithms"
DATA_MODULE = "nemo_rl.distributed.batched_data_dict"
COMMIT = "7ea279abf"

_lock = threading.Lock()
_names: set[str] = set()
_settings = {"dynamic_batching": True}
_classes: dict[type, type] = {}  # NeMo-RL's SequencePacker -> rlsched's subclass


def pack(sequence_lengths: Any, bin_capacity: int, min_bin_count: Optional[int] = None,
         bin_count_multiple: Optional[int] = None) -> list[list[int]]:
    """Bins of indices into `sequence_lengths`, each under `bin_capacity` tokens, at
    least `min_bin_count` of them and a multiple of `bin_count_multiple` where the
    sequences allow (no bin empty: NeMo-RL's bin-count adjustment raises when they do
    not); with ``min_bin_count == bin_count_multiple`` (shards) ``bins[s::shards]`` is
    shard s's share of a joint plan."""
    lengths = sequence_lengths if isinstance(sequence_lengths, list) \
        else [int(length) for length in sequence_lengths]
    if not lengths:
        return []
    cap = int(bin_capacity)
    try:
        return _pack(lengths, cap, min_bin_count, bin_count_multiple or 1)
    except InvalidArgumentError as error:
        # A sequence above the capacity (the planner refuses it too), named as NeMo-RL's
        # packers name it.
        for i, length in enumerate(int(length) for length in lengths):
            if length > cap:
                raise InvalidArgumentError(
                    f"sequence_lengths[{i}]: {length} tokens, above bin_capacity = {cap}",
                    f"sequence_lengths[{i}]") from None
        raise error


def _pack(lengths: list, cap: int, min_bin_count: Optional[int], shards: int) -> list:
    if shards > 1 and min_bin_count == shards and len(lengths) >= shards:
        ranks, count, empty = plan_step_indices(lengths, shards, cap)
        if not empty:
            return [ranks[s][k] for k in range(count) for s in range(shards)]
    ranks, _, _ = plan_step_indices(
        lengths, 1, cap, min_micro_batches=min(max(min_bin_count or 1, 1), len(lengths)),
        micro_batches_multiple_of=shards, order="heaviest_first")
    return [indices for indices in ranks[0] if indices]


def _packer_class(base: type) -> type:
    """rlsched's packer as a subclass of NeMo-RL's SequencePacker `base`."""
    with _lock:
        if base not in _classes:
            def _pack_implementation(self, sequence_lengths):
                return pack(sequence_lengths, self.bin_capacity, self.min_bin_count,
                            self.bin_count_multiple)

            _classes[base] = type("RlschedPacker", (base,), {
                "__doc__": "rlsched's packer (rlsched.integrations.nemo_rl.pack).",
                "__module__": __name__,
                "_pack_implementation": _pack_implementation,
            })
        return _classes[base]


def get_packer(algorithm, bin_capacity, collect_metrics=False, min_bin_count=None,
               bin_count_multiple=None):
    """NeMo-RL's ``get_packer``, with the names of :func:`install` resolving to
    rlsched's packer (a subclass of NeMo-RL's ``SequencePacker``)."""
    original: Callable = INTEGRATION.originals["get_packer"]
    if not (isinstance(algorithm, str) and algorithm.lower() in _names):
        return original(algorithm, bin_capacity, collect_metrics=collect_metrics,
                        min_bin_count=min_bin_count, bin_count_multiple=bin_count_multiple)
    import importlib
    base = importlib.import_module(MODULE).SequencePacker
    return _packer_class(base)(bin_capacity, collect_metrics=collect_metrics,
                               min_bin_count=min_bin_count,
                               bin_count_multiple=bin_count_multiple)


def _runs(lengths: list[int], limit: int) -> list[int]:
    """The ends of the fewest contiguous runs of positions whose rows × longest row stay
    within `limit`, filled greedily (each position's length at most `limit`)."""
    ends, start, longest = [], 0, 0
    for j, length in enumerate(lengths):
        longest = max(longest, length)
        if (j - start + 1) * longest > limit:
            ends.append(j)
            start, longest = j, length
    ends.append(len(lengths))
    return ends


def dynamic_micro_batches(lengths: Any, max_tokens: int) -> tuple[list[list[int]], list[int]]:
    """Contiguous runs of positions (half-open ``[start, end]``) and each run's padded
    length (its longest), every run's rows × padded length within `max_tokens`: the
    fewest runs, and among those the heaviest run (rows × padded length) as light as
    possible (the greedy fill's count, then a bisection on the heaviest run's tokens).
    `lengths`: each position's padded length (each at most `max_tokens`). O(n log
    max_tokens)."""
    values = [int(length) for length in lengths]
    cap = int(max_tokens)
    for j, length in enumerate(values):
        if length > cap:
            raise InvalidArgumentError(
                f"lengths[{j}]: {length} tokens (padded), above max_tokens_per_microbatch = "
                f"{cap}", f"lengths[{j}]")
    if not values:
        return [[0, 0]], [0]
    count = len(_runs(values, cap))
    low, high = max(values), cap  # the heaviest run's tokens: at least the longest row
    while low < high:
        middle = (low + high) // 2
        if len(_runs(values, middle)) <= count:
            high = middle
        else:
            low = middle + 1
    ends = _runs(values, low)
    starts = [0] + ends[:-1]
    return ([[a, b] for a, b in zip(starts, ends)],
            [max(values[a:b]) for a, b in zip(starts, ends)])


def _rebalance(shards: list, args: Any, width: int) -> None:
    """Sets every shard's micro_batch_indices and micro_batch_lengths from
    dynamic_micro_batches, per global batch, on the rows NeMo-RL placed."""
    chunks = shards[0].micro_batch_indices
    size = chunks[0][-1][1] if chunks and chunks[0] else 0  # positions per chunk
    round_to = int(args["sequence_length_round"])
    indices, lengths = [], []
    for c in range(len(chunks)):
        longest = []
        for j in range(c * size, (c + 1) * size):
            tallest = max(int(shard[args["input_lengths_key"]][j]) for shard in shards)
            longest.append(min(-(-tallest // round_to) * round_to, width))
        runs, padded = dynamic_micro_batches(longest, args["max_tokens_per_microbatch"])
        indices.append(runs)
        lengths.append(padded)
    for shard in shards:
        shard.micro_batch_indices = indices
        shard.micro_batch_lengths = lengths


def shard_by_batch_size(self, shards, batch_size=None, allow_uneven_shards=False,
                        dynamic_batching_args=None, sequence_packing_args=None):
    """NeMo-RL's ``BatchedDataDict.shard_by_batch_size``, with the micro-batches of
    dynamic batching decided again by :func:`dynamic_micro_batches`."""
    original = INTEGRATION.originals["BatchedDataDict.shard_by_batch_size"]
    result = original(self, shards, batch_size=batch_size,
                      allow_uneven_shards=allow_uneven_shards,
                      dynamic_batching_args=dynamic_batching_args,
                      sequence_packing_args=sequence_packing_args)
    if dynamic_batching_args is None or not _settings["dynamic_batching"]:
        return result
    width = int(self[dynamic_batching_args["input_key"]].shape[1])
    _rebalance(result[0], dynamic_batching_args, width)
    return result


INTEGRATION = Integration("NeMo-RL", "NVIDIA-NeMo/RL", COMMIT, [
    # nemo_rl/data/packing/algorithms.py:655
    Target(MODULE, "get_packer",
           "(algorithm, bin_capacity, collect_metrics=False, min_bin_count=None, "
           "bin_count_multiple=None)", get_packer),
    # algorithms.py:41 and :78, what the packer subclasses (checked, not replaced)
    Target(MODULE, "SequencePacker",
           "(bin_capacity, collect_metrics=False, min_bin_count=None, bin_count_multiple=None)"),
    Target(MODULE, "SequencePacker._pack_implementation", "(self, sequence_lengths)"),
    # nemo_rl/distributed/batched_data_dict.py:430, wrapped on its class
    Target(DATA_MODULE, "BatchedDataDict.shard_by_batch_size",
           "(self, shards, batch_size=None, allow_uneven_shards=False, "
           "dynamic_batching_args=None, sequence_packing_args=None)", shard_by_batch_size),
], ready=needs_native("nemo_rl"))


def install(*, names=("rlsched",), dynamic_batching: bool = True,
            force: bool = False) -> list[str]:
    """Makes `names` (case-insensitive; NeMo-RL's own names too, to take them over)
    resolve to rlsched's packer in every binding of ``get_packer``, and (with
    `dynamic_batching`) dynamic batching's micro-batches rlsched's; returns what it
    replaced, ``[]`` when NeMo-RL is not importable. Refuses (replacing nothing,
    :class:`~rlsched.integrations.IncompatibleUpstreamError`) a NeMo-RL whose
    signatures differ from 7ea279abf's, unless `force`."""
    if isinstance(names, str) or not names or not all(isinstance(n, str) and n for n in names):
        raise InvalidArgumentError(f"names: must be a non-empty list of names, got {names!r}",
                                   "names")
    replaced = INTEGRATION.install(force=force)
    if replaced:
        _names.clear()
        _names.update(n.lower() for n in names)
        _settings["dynamic_batching"] = bool(dynamic_batching)
    return replaced


def uninstall() -> list[str]:
    """Puts back what :func:`install` replaced; returns what it restored."""
    _names.clear()
    return INTEGRATION.uninstall()


#: What is replaced now; how the installed framework differs from the pinned commit
#: (the Integration's, see rlsched.integrations).
installed = INTEGRATION.installed
check = INTEGRATION.check
