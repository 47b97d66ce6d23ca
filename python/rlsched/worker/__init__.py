"""Workers of a live run (``rlsched run``): inference engines and the trainer attach
to the scheduler over gRPC (``rlsched.v1.Scheduler/Attach``, proto/rlsched/v1/runtime.proto).

Subclass :class:`EngineWorker` (implement ``dispatch``, ``abort``, ``sync_weights``,
``resume`` and ``release``; report with ``finished``, ``paused`` (once paused for an
interrupting ``sync_weights``: every paused sample's progress in one report; older
workers send ``progressed`` per sample), ``weights_loaded``, ``released``) or
:class:`TrainerWorker` (implement ``start_train``; report with ``step_finished``), then
call ``run()``. The base class handles the stream, the hello with the run's token,
heartbeats and retries while the scheduler is not yet listening. An engine's reports
carry, without the subclass doing anything, the versions its tokens were generated under
(from the versions it committed with ``weights_loaded``, switching where its pause
reports said), each finish's telemetry (tokens, interruptions, seconds) and each
heartbeat's load (``load()``); an engine that knows better passes ``spans=`` /
``telemetry=`` or overrides ``load()``. With a weight layout (``rlsched run --model
--train --infer``), ``sync_weights(sync)`` gets the engine's part of the weight-sync
plan as ``sync.plan`` and the trainer each plan's senders' part through
``on_weight_sync_plan`` (:mod:`rlsched.worker.weights`). :mod:`rlsched.worker.emulated`
has emulated workers.
"""

from rlsched.worker.base import EngineWorker, TrainerWorker, Worker
from rlsched.worker.weights import SyncWeights, TransferGroup, WeightUpdate

__all__ = ["EngineWorker", "SyncWeights", "TrainerWorker", "TransferGroup", "WeightUpdate",
           "Worker"]
