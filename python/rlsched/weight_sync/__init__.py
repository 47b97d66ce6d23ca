"""rlsched.weight_sync: the trainer-to-engine weight sync of full tensors, planned by
rlsched (which trainer rank sends which bytes, in which bucket) and run on
``torch.distributed``. Usable from any trainer; verl's checkpoint engine is one user
(:mod:`rlsched.integrations.verl_checkpoint`).

* :class:`WeightSync` — one member of a sync: ``prepare``, ``build_topology``,
  ``init_process_group``, ``send`` / ``receive``, ``finalize``;
* :mod:`rlsched.weight_sync.plan` — the plan alone (chunks, senders, buckets, the cost
  model and its lower bound), pure.

The resharding weight sync, planned by ``rlsched reshard`` (trainer shards to engine
shards, slice by slice), is here too; its modules are imported by name:

* :mod:`rlsched.weight_sync.executor` — runs a resharding plan on ``torch.distributed``;
* :mod:`rlsched.weight_sync.layouts` — the reference layouts it is checked against
  (deterministic full tensors, Megatron and vLLM shards), with torch;
* :mod:`rlsched.weight_sync.launcher` — a whole world on one machine
  (``python3 -m rlsched.weight_sync.launcher``).

Their old paths ``rlsched.executor``, ``rlsched.executor_layouts`` and
``rlsched.reshard_run`` still import (and run) for a release, with a
:class:`DeprecationWarning`.
"""

from rlsched.weight_sync.plan import (Estimate, Membership, SyncOptions, TensorSpec,
                                      estimate, plan_senders, scale_name, sender_ranks)
from rlsched.weight_sync.session import (WEIGHT_SYNC_FAILED, WeightSync, WeightSyncError,
                                         node_id)

__all__ = ["WeightSync", "WeightSyncError", "WEIGHT_SYNC_FAILED", "node_id", "TensorSpec",
           "Membership", "SyncOptions", "Estimate", "estimate", "plan_senders",
           "sender_ranks", "scale_name"]
