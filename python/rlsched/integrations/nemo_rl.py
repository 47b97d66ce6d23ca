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

Not replaced: the dynamic-batching path of ``shard_by_batch_size`` (with
``dynamic_batching_args``), whose micro-batch decision is written inline in that method
(``batched_data_dict.py:774-846``: contiguous runs of length-sorted rows under a
rows × longest-row budget), not in a function of its own.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional

import rlsched
from rlsched.errors import InvalidArgumentError
from rlsched.integrations import Integration, Target, needs_native

__all__ = ["MODULE", "COMMIT", "INTEGRATION", "install", "uninstall", "installed", "check",
           "get_packer", "pack"]

MODULE = "nemo_rl.data.packing.algorithms"
COMMIT = "7ea279abf"

_lock = threading.Lock()
_names: set[str] = set()
_classes: dict[type, type] = {}  # NeMo-RL's SequencePacker -> rlsched's subclass


def pack(sequence_lengths: Any, bin_capacity: int, min_bin_count: Optional[int] = None,
         bin_count_multiple: Optional[int] = None) -> list[list[int]]:
    """Bins of indices into `sequence_lengths`, each under `bin_capacity` tokens, at
    least `min_bin_count` of them and a multiple of `bin_count_multiple` where the
    sequences allow (no bin empty: NeMo-RL's bin-count adjustment raises when they do
    not); with ``min_bin_count == bin_count_multiple`` (shards) ``bins[s::shards]`` is
    shard s's share of a joint plan."""
    lengths = [int(length) for length in sequence_lengths]
    if not lengths:
        return []
    cap = int(bin_capacity)
    for i, length in enumerate(lengths):
        if length > cap:
            raise InvalidArgumentError(
                f"sequence_lengths[{i}]: {length} tokens, above bin_capacity = {cap}",
                f"sequence_lengths[{i}]")
    shards = bin_count_multiple or 1
    if shards > 1 and min_bin_count == shards and len(lengths) >= shards:
        plan = rlsched.plan_step(lengths, num_ranks=shards, max_token_len=cap)
        if not plan.empty_micro_batches:
            ranks = [[list(m.indices) for m in rank.micro_batches] for rank in plan.ranks]
            return [ranks[s][k] for k in range(plan.micro_batches) for s in range(shards)]
    plan = rlsched.plan_step(lengths, num_ranks=1, max_token_len=cap,
                             min_micro_batches=min(max(min_bin_count or 1, 1), len(lengths)),
                             micro_batches_multiple_of=shards, order="heaviest_first")
    return [list(m.indices) for m in plan.ranks[0].micro_batches if m.indices]


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


INTEGRATION = Integration("NeMo-RL", "NVIDIA-NeMo/RL", COMMIT, [
    # nemo_rl/data/packing/algorithms.py:655
    Target(MODULE, "get_packer",
           "(algorithm, bin_capacity, collect_metrics=False, min_bin_count=None, "
           "bin_count_multiple=None)", get_packer),
    # algorithms.py:41 and :78, what the packer subclasses (checked, not replaced)
    Target(MODULE, "SequencePacker",
           "(bin_capacity, collect_metrics=False, min_bin_count=None, bin_count_multiple=None)"),
    Target(MODULE, "SequencePacker._pack_implementation", "(self, sequence_lengths)"),
], ready=needs_native("nemo_rl"))


def install(*, names=("rlsched",), force: bool = False) -> list[str]:
    """Makes `names` (case-insensitive; NeMo-RL's own names too, to take them over)
    resolve to rlsched's packer in every binding of ``get_packer``; returns what it
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
    return replaced


def uninstall() -> list[str]:
    """Puts back what :func:`install` replaced; returns what it restored."""
    _names.clear()
    return INTEGRATION.uninstall()


def installed() -> list[str]:
    """What is replaced now."""
    return INTEGRATION.installed()


def check() -> list[str]:
    """How the installed NeMo-RL differs from 7ea279abf (one line per difference)."""
    return INTEGRATION.check()
