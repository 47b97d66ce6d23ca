"""The whole-step plan as index lists ready to slice a batch.

:func:`plan_step_indices` plans a training step (``rlsched.plan_step``: the sequences
to ``num_ranks`` data-parallel ranks, each rank's into micro-batches of at most
``max_token_len`` tokens, the same count on every rank) and returns only what a
trainer needs to cut its batch: ``plan[r][k]``, the ascending indices (into
`lengths`) of rank r's k-th micro-batch, in execution order::

    plan = rlsched.plan_step_indices(seqlens, num_ranks=dp_size, max_token_len=16384)
    my_batch = [batch[indices] for indices in plan[dp_rank]]   # numpy / torch indexing

Every index appears exactly once; no micro-batch holds more than ``max_token_len``
(padded) tokens; a rank may get empty micro-batches when there are fewer sequences
than places. The indices are those of ``rlsched plan-step --json`` for the same input
(``ranks[r].micro_batches[k].indices``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["plan_step_indices"]


def plan_step_indices(lengths: Any, num_ranks: int, max_token_len: int, *,
                      as_numpy: bool = False, **options: Any) -> list:
    """``[rank][micro_batch]`` -> ascending indices of `lengths` (lists of ints, or
    numpy int64 arrays with ``as_numpy``). `options` are :func:`rlsched.plan_step`'s
    (``groups``, ``equal_size``, ``keep_groups``, ``min_micro_batches``,
    ``micro_batches_multiple_of``, ``pad_to_multiple_of``,
    ``pipeline_model_parallel_size``, ``overhead``, ``cost``, ``order``,
    ``refine_iterations``, ``count_tolerance``, ``oversize``). In process with the native module
    (every cost model when it has the wire library), else through the daemon. Raises
    :class:`rlsched.InvalidArgumentError` naming the argument."""
    import rlsched
    plan = rlsched.plan_step(lengths, num_ranks=num_ranks, max_token_len=max_token_len,
                             **options)
    out = [[list(m.indices) for m in rank.micro_batches] for rank in plan.ranks]
    if as_numpy:
        import numpy as np
        return [[np.asarray(indices, dtype=np.int64) for indices in rank] for rank in out]
    return out
