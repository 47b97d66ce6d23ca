"""rlsched as a backend of verl's checkpoint engine: ``backend: rlsched``.

Written for verl-project/verl at commit 1dda039b9 (``verl/checkpoint_engine/base.py``),
against the interface, not its code. Importing this module checks that interface
(below) with :mod:`rlsched.integrations`' signature check and registers the backend
``"rlsched"`` in ``CheckpointEngineRegistry``; on any difference it registers nothing
and raises :class:`~rlsched.integrations.IncompatibleUpstreamError` naming the method,
the parameter and the commit. Select it in verl's config::

    actor_rollout_ref.rollout.checkpoint_engine:
      backend: rlsched
      custom_backend_module: rlsched.integrations.verl_checkpoint
      engine_kwargs:
        rlsched: {fp8: false, senders: null, timeout_s: 600}

The call sites it serves, at that commit:

* ``verl/workers/engine_workers.py:685``: each actor worker makes the engine with
  ``CheckpointEngineRegistry.new(backend, is_master=(torch.distributed.get_rank() == 0),
  bucket_size=bucket_size, **engine_kwargs)``; ``verl/checkpoint_engine/base.py:338``:
  each rollout worker with ``CheckpointEngineRegistry.new(backend,
  bucket_size=bucket_size, **engine_kwargs)`` (``bucket_size`` =
  ``update_weights_bucket_megabytes << 20``, ``engine_kwargs`` =
  ``engine_kwargs.get(backend, {})``: the options of :class:`rlsched.weight_sync.WeightSync`);
* ``base.py:428-446`` (``CheckpointEngineManager.build_process_group``, on every sync):
  ``prepare()`` on every actor then every rollout worker, then in the driver
  ``build_topology(actor_wg.world_size, rollout.world_size, metadata)``, whose two dicts
  of per-rank lists go, one entry per rank, to ``init_process_group(**kwargs)``;
* ``engine_workers.py:763-764``: every actor rank ``await
  send_weights(per_tensor_param, global_steps=global_steps)`` (the generator of full
  Hugging Face-named tensors, collective across the actor ranks: every rank walks it
  to the end), whose returned dict verl merges into the step's metrics;
* ``base.py:356-358``: every rollout worker passes ``receive_weights(
  global_steps=global_steps)`` to its server adapter with ``wire_format`` (here
  ``"named_tensors"``: (name, tensor) pairs; with fp8 the codes as ``uint8`` under the
  weight's name and the float32 block scales under ``<name>_scale_inv``);
* ``base.py:547-549``: ``finalize()`` on every worker.

What rlsched decides (:mod:`rlsched.weight_sync`): which actor rank sends which tensors
(all of them send by default, their bytes balanced by Karmarkar-Karp once the tensors
are known), the buckets under ``bucket_size`` (a larger tensor spans buckets), one
broadcast per bucket to the rollout workers, and the groups, made once per membership
and kept while healthy (``build_topology`` runs on every sync). Where the interface
cannot carry something: verl gives the backend no model config and no GPU topology
beyond what ``prepare()`` reports, so the first sync learns the tensors from the
generator (the senders chosen as they come) and plans from the second on; the node id
is Ray's (or ``$RLSCHED_NODE_ID``).
"""

from __future__ import annotations

import importlib
from typing import Any, Optional

from rlsched.errors import MissingDependencyError

from rlsched.integrations import IncompatibleUpstreamError
from rlsched.integrations.verl import CHECKPOINT_ENGINE, CHECKPOINT_MODULE as MODULE, COMMIT
from rlsched.weight_sync import WeightSync

__all__ = ["COMMIT", "MODULE", "INTEGRATION", "BACKEND", "RlschedCheckpointEngine", "check"]

BACKEND = "rlsched"

#: verl's interface at the pinned commit (checked, nothing replaced), kept with verl's
#: other pins in :mod:`rlsched.integrations.verl` so that scripts/check_upstream_pins.py
#: reads it without verl installed.
INTEGRATION = CHECKPOINT_ENGINE


#: The differences between the installed verl and the pinned commit ([] if none).
check = INTEGRATION.check


def _base():
    try:
        return importlib.import_module(MODULE)
    except ModuleNotFoundError as error:
        raise MissingDependencyError(f"rlsched.integrations.verl_checkpoint needs verl "
                                     f"({MODULE}), written for verl-project/verl {COMMIT}: "
                                     f"{error}") from error


def _define(base: Any):
    problems = check()
    if problems:
        raise IncompatibleUpstreamError(
            f"verl checkpoint engine: the installed verl differs from verl-project/verl "
            f"{COMMIT}, which the rlsched backend was written for: {'; '.join(problems)}. "
            "The backend was not registered", problems[0].split(":", 1)[0])

    @base.CheckpointEngineRegistry.register(BACKEND)
    class RlschedCheckpointEngine(base.CheckpointEngine):
        """verl's ``CheckpointEngine`` on :class:`rlsched.weight_sync.WeightSync` (see the
        module docstring). ``bucket_size``: bytes per bucket; ``is_master``: actor rank
        0; ``**options``: WeightSync's keyword options (``engine_kwargs["rlsched"]``)."""

        wire_format = "named_tensors"

        def __init__(self, bucket_size: int, is_master: bool = False, **options) -> None:
            self.sync = WeightSync(bucket_size, is_master, **options)

        def prepare(self) -> dict:
            return self.sync.prepare()

        @classmethod
        def build_topology(cls, actor_wg_world_size, rollout_world_size, metadata):
            return WeightSync.build_topology(actor_wg_world_size, rollout_world_size,
                                             list(metadata))

        def init_process_group(self, **kwargs) -> None:
            self.sync.init_process_group(**kwargs)

        def finalize(self) -> None:
            self.sync.finalize()

        async def send_weights(self, weights, global_steps: Optional[int] = None) -> dict:
            return await self.sync.send(weights, global_steps=global_steps)

        async def receive_weights(self, global_steps: Optional[int] = None):
            async for name, tensor in self.sync.receive(global_steps=global_steps):
                yield name, tensor

    RlschedCheckpointEngine.__module__ = __name__
    return RlschedCheckpointEngine


RlschedCheckpointEngine = _define(_base())
