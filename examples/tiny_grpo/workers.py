"""The tiny GRPO run's workers: engines that sample the tiny model with a KV cache and a
trainer that trains it with GRPO, attached to ``rlsched run`` over gRPC.

The control plane (rlsched) carries ids and counts only. The data plane is a shared
directory (``--data DIR``):

- ``samples/<sample>.json``: one file per finished sample, written atomically by the
  engine that finished it (prompt and response tokens, the engine's logprob and weights
  version of every response token, the reward), read by the trainer when a StartTrain
  lists the sample;
- ``finished.engine<e>``: the ids of the samples engine e finished, appended as they
  finish (its own count, which a SIGKILL leaves);
- ``partial/<sample>.json``: the tokens of a sample an interrupting SyncWeights paused
  (partial rollout), so that it can be resumed from them;
- ``weights/v0.pt``: the initial policy (a state dict with the HF Llama names, written
  by run.py before anything starts), which the trainer loads (and, with the executor,
  the engines);
- ``stores/<group>``: with the executor, the gloo rendezvous file of each transfer
  group the runtime names (one per weight-sync plan) when the run gives no
  ``--weight-sync-address``;
- ``trainer.store``: with more than one trainer process (``--tp``, ``--dp``), the
  rendezvous file of the trainer's own gloo groups (every trainer process, each DP
  replica's TP group, each TP rank's DP group; tensor_parallel.Grid);
- ``dying.engine<e>``: with ``--die-during-sync``, where engine e was when it killed
  itself (the version, the plan, the point of the sync);
- ``trainer_worlds/<k>.binpb``: with more than one trainer process, the plan of the k-th
  weight-sync world trainer rank 0 tried, joined or lost while joining (the runtime's
  ``WeightSyncPlan``, the senders' part), which the other trainer ranks try after it.

The trainer. ``tp * dp`` processes (``--tp``, ``--dp``; trainer rank ``g = dp_rank * tp +
tp_rank``, Megatron-core's order): rank 0 attaches to the runtime as the
``TrainerWorker`` (:class:`TinyTrainer`) and broadcasts each call it takes (the samples
with their advantages, the step plan's micro-batches, the learning rate, the version to
publish) to the others (:func:`follow`), which train with it: the TP ranks of a replica
their slices of the model (tensor_parallel.py: q/k/v and gate/up column-parallel, o and
down row-parallel; embedding, lm_head and norms replicated), DP replica d the step
plan's ranks d, d + dp, ... with the replicas' gradients summed.

Weights move one of two ways (``--weights``):

- ``executor`` (default): rlsched's executor over ``torch.distributed`` gloo, by the
  weight-sync plans ``rlsched run --model config.json --train tp=T,dp=D --infer tp=1``
  makes (one per membership of the engines) and sends each worker its part of
  (``WeightSyncPlan``: the transfer group's name, backend, world size and address, the
  members, the worker's rank and its transfers; the trainer's part holds every trainer
  rank's transfers). Trainer rank g is rank g and ``members[k]`` rank T*D + k of one
  gloo world per plan (see :class:`PlanSync`); an engine joins the world of the plan
  its SyncWeights names, trainer rank 0 moves to the newest plan when a run fails in
  its world (a member lost or gone to the next plan) and the other trainer ranks to
  the world it moved to. Every rank starts from version 0 (``weights/v0.pt``). Each
  trainer rank hands its own Megatron-named tensors at its TP rank (``linear_qkv``
  fused per query group and split by whole groups, ``linear_fc1`` = its rows of gate
  and up, ``linear_proj`` and ``linear_fc2`` its input columns, the vocabulary padded
  to 128 * T rows and split by rows) to a sync thread that runs the plan once per
  version, in order (the planner picks which DP replica sends what); an engine, on
  SyncWeights(N), runs it until it holds version N (once per version it has not
  received) into vLLM-named tensors (``qkv_proj``, ``gate_up_proj``, the vocabulary
  padded to 64 rows), which it splits back into its HF-named parameters. Every version
  goes to every engine: the engines must all sync to every version (the case in sync
  mode and in async mode with partial rollout, where a sync interrupts every engine at
  once). An engine loads on a thread of its own (the command thread stays free for a
  replan of the sync under way: a member lost during it, see :class:`PlanSync`).
- ``file``: trainer rank 0 writes ``weights/v<N>.pt`` (the full weights, its TP group's
  slices gathered) atomically before it reports the step that made it finished; an
  engine loads it on SyncWeights(version N).

Run one with ``python3 workers.py --role engine|trainer --address unix:PATH --data DIR
[--engine N] [--tp T --dp D --trainer-rank G] --report FILE``; run.py starts them.
"""

import argparse
import gc
import json
import os
import queue
import sys
import threading
import time
from typing import Dict, List, Optional

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

# The example's modules, and rlsched, imported after the sys.path entry above
# (noqa: E402).
from grpo import (ADVANTAGES, Rollout, advantages, decode_step, lr_at, policy_loss,  # noqa: E402
                  sample_seed, set_lr)
from model import CONFIG_PATH, TinyLlama, Config, weights_digest  # noqa: E402
from tensor_parallel import (Grid, all_reduce_grads, clip_grad_norm, full_state,  # noqa: E402
                             load_full_state, megatron_sources)
from task import OPERATIONS, DigitTask  # noqa: E402

from rlsched.v1 import orchestrator_pb2  # noqa: E402
from rlsched.worker import EngineWorker, TrainerWorker  # noqa: E402

# The runtime takes an interrupting sync's pause as one GenerationPaused report where
# its protocol has it, else one GenerationProgressed per sample.
_BATCHED_PAUSE = hasattr(orchestrator_pb2, "GenerationPaused") and hasattr(EngineWorker, "paused")


def write_json_atomic(path: str, data) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def weights_path(data: str, version: int) -> str:
    return os.path.join(data, "weights", f"v{version}.pt")


def publish_weights(data: str, version: int, model) -> str:
    """Writes version `version` (a model, or a full HF-named state) atomically; returns
    its digest."""
    path = weights_path(data, version)
    tmp = f"{path}.tmp.{os.getpid()}"
    state = model if isinstance(model, dict) else model.state_dict()
    state = {k: v.detach().clone() for k, v in state.items()}
    torch.save(state, tmp)
    os.replace(tmp, path)
    return weights_digest(state)


def load_weights(data: str, version: int, model, timeout: float = 120.0) -> None:
    """Loads version `version` into `model` (a TP rank's model: its slices)."""
    load_full_state(model, read_weights(data, version, timeout))


def read_weights(data: str, version: int, timeout: float = 120.0) -> Dict[str, torch.Tensor]:
    """The full HF-named state of version `version`, once published."""
    path = weights_path(data, version)
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise RuntimeError(f"weights version {version} not published at {path} "
                               f"within {timeout} s")
        time.sleep(0.01)
    return torch.load(path)


def _read_json(path: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(path) as f:
                return json.load(f)
        except FileNotFoundError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def store_path(data: str, group: str) -> str:
    """The gloo rendezvous file of the runtime's transfer group `group` (a new one per
    membership: the group's name holds the plan id)."""
    return os.path.join(data, "stores", group)


def _first_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}".splitlines()[0][:200]


class WorldLost(RuntimeError):
    """A weight-sync world failed under this worker (a member lost while it was built
    or during a run); the worker has left it."""

    def __init__(self, plan, reason: str):
        super().__init__(f"weight-sync plan {plan.plan_id}: {reason}")
        self.plan, self.reason = plan, reason


class PlanSync:
    """One worker's side of the weight sync over rlsched's executor (gloo), by the plans
    ``rlsched run --model --train tp=T,dp=D --infer tp=1`` sends (``WeightSyncPlan``,
    decoded as :class:`rlsched.worker.weights.WeightUpdate`): trainer rank g (of the
    plan's ``summary.trainer_ranks`` = T*D) is rank g, and ``members[k]`` of the plan's
    membership rank ``rank_offset`` = T*D + k of one gloo world per plan (``world_size``
    ranks; rendezvous on ``--weight-sync-address`` when the run gives one, else a
    FileStore named after the group, :func:`store_path`). The trainer's part of a plan
    holds every trainer rank's transfers; each trainer process runs its own
    (``rank_plan(g)``).

    Worlds. A plan is the runtime's membership epoch: a new one when an engine joins or
    is lost. An engine joins the world of the plan its SyncWeights names (leaving the
    one it was in: its members still there see their collectives fail); the trainer
    sends each version in the world it is in, and when a run fails there (a member
    died, or moved on to the runtime's next plan) trainer rank 0 leaves for the newest
    plan the runtime sent it (waiting for one newer than the world that failed) and
    records it (``trainer_worlds/<k>.binpb``); the other trainer ranks leave for the
    world rank 0 recorded next, so that all join the same worlds in the same order.
    Joining is collective: every rank makes its
    :class:`rlsched.weight_sync.executor.Executor` from its part (checked against the
    world's layouts before any byte moves), then the members exchange the last version
    each engine holds and the oldest each trainer rank can still send, and the trainer
    ranks send again every version from the oldest a member lacks (an engine that holds
    one already receives it and keeps what it had).

    Versions. The engines start from version 0 as the trainer does (the initial
    policy's file, the checkpoint a real engine loads); every later version moves
    through the executor, one run of the plan per version, in order. A run ends with a
    barrier of its world: it completes for every member or for none, so no engine
    reports a version while another member of its world may still lose it.

    A member lost *during* a sync. The members still in that sync's world see a join
    or a run fail there (gloo: the dead member's connections close, and every worker
    that fails leaves the world at once, so those waiting on it fail too rather than at
    their timeout); each leaves it (:class:`WorldLost`). The runtime sends every engine
    whose last SyncWeights named that version a replan (``SyncWeights.replan``: the same
    version by the plan of the membership without the lost engine): an engine still
    loading it joins the new world and loads it there (the members say what they hold,
    the trainer sends from the oldest version missing), and reports it once; an engine
    that holds it already joins the new world and reports nothing. The trainer ranks
    move to the newest plan as after any failure in their world (the replan's plan
    comes to rank 0 with ``on_weight_sync_plan``). Worlds tried and lost count as
    worlds (``epochs``, with why they failed), so every trainer rank tries the same
    ones in the same order.

    Not recovered: a member lost before it joined a new world (the others wait in the
    rendezvous for their timeout, then fail); and a replan that names another version
    than the one an engine is loading (the runtime replans the newest version under
    way, and this run syncs every engine to every version together).
    """

    def __init__(self, data: str, engine: Optional[int] = None,
                 timeout_seconds: float = 120.0, tp: int = 1, dp: int = 1,
                 trainer_rank: int = 0):
        import datetime

        from rlsched.weight_sync import executor
        from rlsched.weight_sync import layouts as lay

        self.lay, self.executor_module = lay, executor
        self.data = data
        self.engine = engine  # None: a trainer rank
        # The trainer's TP and DP sizes and this trainer process's rank among its
        # tp * dp processes (dp_rank * tp + tp_rank, Megatron-core's order; engines:
        # the plan's summary says the trainer's layout).
        self.tp, self.dp, self.trainer_rank = tp, dp, trainer_rank
        if engine is not None and (tp, dp, trainer_rank) != (1, 1, 0):
            raise ValueError("PlanSync: tp, dp and trainer_rank are the trainer's")
        if not 0 <= trainer_rank < tp * dp:
            raise ValueError(f"trainer_rank must be in [0, tp*dp = {tp * dp}), got "
                             f"{trainer_rank}")
        self.timeout = datetime.timedelta(seconds=timeout_seconds)
        with open(CONFIG_PATH) as f:
            self.layout = lay.parse_config(f.read())
        self.config = Config.load(CONFIG_PATH)
        os.makedirs(os.path.join(data, "stores"), exist_ok=True)
        os.makedirs(os.path.join(data, "trainer_worlds"), exist_ok=True)
        self.plan = None  # the WeightUpdate whose world this worker is in
        self.executor = None
        self.broken: Optional[str] = None  # trainer: why the current world's run failed
        # Per world tried, in order: its plan, members, rank, runs, and why it failed
        # (None: it did not).
        self.epochs: List[dict] = []
        self.tried = -1  # the epoch of the last world tried
        # The fault --die-during-sync injects (an engine's): SIGKILL itself in the sync
        # of this version, once in that sync's world (-1: never).
        self.die_during_sync = -1
        self.runs = 0
        self.bytes = 0
        self.seconds = 0.0
        self.join_seconds = 0.0
        # Trainer: the newest plan the runtime sent (on_weight_sync_plan), every version
        # it was handed and not known held by every member (to send again in a new world).
        self._offered = threading.Condition()
        self.newest = None
        self.history: Dict[int, Dict[str, torch.Tensor]] = {}
        self.next_version = 1  # trainer: the next version to send (0: every rank has it)
        self.incoming = 1  # engine: the version the next run carries
        self.received = 0  # engine: the newest version held (0: the initial policy)
        self.state: Optional[Dict[str, torch.Tensor]] = None  # engine: that version
        self._stores: Dict[tuple, object] = {}

    @property
    def name(self) -> str:
        if self.engine is None:
            return "trainer" if self.trainer_rank == 0 else f"trainer{self.trainer_rank}"
        return f"engine{self.engine}"

    @staticmethod
    def trainer_ranks(plan) -> int:
        """The plan world's trainer ranks (ranks 0 .. T-1; the engines follow), as its
        summary says."""
        return int(plan.summary.trainer_ranks)

    def train_layout(self, plan):
        """The trainer's layout the plan was made for (its summary's TP and DP)."""
        t = plan.summary.train
        return self.lay.Train(tp=int(t.tp) or 1, dp=int(t.dp) or 1)

    # ---- The runtime's plans. ----

    def check(self, plan) -> None:
        """Refuses a plan this run cannot run (named field and bound)."""
        problems = list(plan.check())
        if plan.group.backend != "gloo":
            problems.append(f"group.backend: {plan.group.backend!r}, this run moves weights "
                            "over gloo (--weight-sync-backend gloo)")
        trainer = self.trainer_ranks(plan)
        if plan.group.world_size != trainer + len(plan.members):
            problems.append(f"group.world_size: {plan.group.world_size}, the summary's "
                            f"{trainer} trainer ranks and {len(plan.members)} engines are "
                            f"{trainer + len(plan.members)}")
        if self.engine is None:
            train = self.train_layout(plan)
            ranks = self.tp * self.dp
            if plan.ranks != ranks or trainer != ranks or (train.tp, train.dp) != (
                    self.tp, self.dp):
                problems.append(f"ranks: {plan.ranks} (summary.trainer_ranks {trainer}, "
                                f"train tp={train.tp} dp={train.dp}), the trainer is TP "
                                f"{self.tp} x DP {self.dp} (--train tp={self.tp},dp={self.dp})")
            if plan.replica != -1 or plan.rank_offset != 0:
                problems.append(f"replica/rank_offset: {plan.replica}/{plan.rank_offset}, "
                                "the trainer's part is -1/0")
        else:
            if plan.ranks != 1:
                problems.append(f"ranks: {plan.ranks}, the engines are TP 1 (--infer tp=1)")
            if trainer < 1:
                problems.append(f"summary.trainer_ranks: {trainer}, at least 1")
            if not 0 <= plan.replica < len(plan.members) or (
                    plan.members[plan.replica] != self.engine):
                problems.append(f"replica: {plan.replica}, engine {self.engine} is not one "
                                f"of the members {list(plan.members)} there")
            elif plan.rank_offset != trainer + plan.replica:
                problems.append(f"rank_offset: {plan.rank_offset}, replica {plan.replica}'s "
                                f"is {trainer + plan.replica} (after {trainer} trainer ranks)")
        if problems:
            raise RuntimeError(f"{self.name}: weight-sync plan {plan.plan_id}: "
                               + "; ".join(problems))

    def offer(self, plan) -> None:
        """Trainer TP rank 0 (its command thread): the runtime sent plan `plan` (a new
        membership)."""
        self.check(plan)
        with self._offered:
            if self.newest is None or plan.epoch > self.newest.epoch:
                self.newest = plan
            self._offered.notify_all()

    def _world_path(self, k: int) -> str:
        return os.path.join(self.data, "trainer_worlds", f"{k}.binpb")

    def _next_plan(self, after: int):
        """Trainer: the plan of the next world to join. TP rank 0: the newest plan, once
        the runtime sent one of an epoch above `after` (it records it for the other TP
        ranks, trainer_worlds/<k>.binpb for its k-th world); another TP rank: the plan
        of rank 0's k-th world, so that every trainer rank joins the same worlds in the
        same order."""
        deadline = time.monotonic() + self.timeout.total_seconds()
        if self.trainer_rank > 0:
            from rlsched.v1 import runtime_pb2
            from rlsched.worker.weights import WeightUpdate
            path = self._world_path(len(self.epochs))
            while not os.path.exists(path):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.name}: TP rank 0 recorded no world "
                                       f"{len(self.epochs)} within {self.timeout}")
                time.sleep(0.01)
            with open(path, "rb") as f:
                plan = WeightUpdate(runtime_pb2.WeightSyncPlan.FromString(f.read()))
            self.check(plan)
            return plan
        with self._offered:
            while self.newest is None or self.newest.epoch <= after:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"trainer: no weight-sync plan after epoch {after} "
                                       f"from the runtime within {self.timeout}")
                self._offered.wait(timeout=left)
            return self.newest

    # ---- Worlds. ----

    def _store(self, plan):
        import torch.distributed as dist

        g = plan.group
        if not g.address:
            return dist.FileStore(store_path(self.data, g.name), g.world_size)
        # One TCP store per address for the process (the trainer serves it), a prefix
        # per group.
        key = (g.address, g.port)
        if key not in self._stores:
            master = self.engine is None and self.trainer_rank == 0
            self._stores[key] = dist.TCPStore(g.address, g.port, is_master=master,
                                              timeout=self.timeout, wait_for_workers=False)
        return dist.PrefixStore(g.name, self._stores[key])

    def _join(self, plan, version: int = -1) -> None:
        """Builds plan `plan`'s world and its executor (collective over its members).
        Every attempt is recorded (``epochs``, one per world tried, in order: the other
        trainer ranks count them as rank 0 does); when a member is lost before the world
        is complete, this worker leaves what it built and raises :class:`WorldLost`.
        `version`: an engine's sync that joins (for ``die_during_sync``)."""
        rank, world = plan.rank_offset + self.trainer_rank, plan.group.world_size
        if self.engine is None and self.trainer_rank == 0 and self.tp * self.dp > 1:
            path = self._world_path(len(self.epochs))
            with open(path + ".tmp", "wb") as f:
                f.write(plan.message.SerializeToString())
            os.replace(path + ".tmp", path)
        self.epochs.append({"plan_id": plan.plan_id, "epoch": plan.epoch,
                            "members": list(plan.members), "group": plan.group.name,
                            "world_size": world, "rank": rank, "resend_from": None,
                            "runs": 0, "time": time.time(), "failed": None})
        self.tried = plan.epoch
        try:
            self._build(plan, rank, world, version)
        except RuntimeError as e:
            reason = _first_line(e)
            self.epochs[-1]["failed"] = reason
            self._leave(f"joining it failed: {reason}", plan)
            raise WorldLost(plan, reason) from None

    def _build(self, plan, rank: int, world: int, version: int) -> None:
        import torch.distributed as dist

        start = time.monotonic()
        lay, ex = self.lay, self.executor_module
        trainer = self.trainer_ranks(plan)
        dist.init_process_group(plan.group.backend, store=self._store(plan), rank=rank,
                                world_size=world, timeout=self.timeout)
        if version >= 0 and version == self.die_during_sync:
            self._die(plan, version, "joined its world, before the executor's checks")
        infer = lay.Infer(tp=1, replicas=len(plan.members))
        zeros = {name: torch.zeros(shape, dtype=dtype)
                 for name, (shape, dtype) in lay.hf_shapes(self.layout).items()}
        self.sources, self.destinations = None, None
        train = self.train_layout(plan)
        if self.engine is None:
            self.sources = lay.megatron_shards(self.layout, train, self.trainer_rank, zeros)
        else:
            self.destinations = {k: torch.zeros_like(v) for k, v in
                                 lay.vllm_shards(self.layout, infer, 0, zeros).items()}
        # Collective: every rank checks its part of the runtime's plan against this
        # world's layouts and its tensors before any byte moves.
        self.executor = ex.Executor(plan.rank_plan(rank), sources=self.sources,
                                    destinations=self.destinations, timeout=self.timeout,
                                    layout=ex.world_layout(train, infer))
        # Trainer rank r < T: the oldest version it can send; rank T + k: the newest one
        # engine members[k] holds. The trainer sends again from the oldest one missing
        # (and that every trainer rank still has).
        mine = (min(self.history, default=self.next_version) if self.engine is None
                else self.received)
        held: List[Optional[int]] = [None] * world
        dist.all_gather_object(held, mine)
        resend_from = max(min(held[trainer:]) + 1, max(held[:trainer]))
        if self.engine is None:
            self.next_version = resend_from
            for v in [v for v in self.history if v < resend_from]:
                del self.history[v]
        else:
            self.incoming = resend_from
        self.plan, self.broken = plan, None
        self.join_seconds += time.monotonic() - start
        self.epochs[-1]["resend_from"] = resend_from

    def _leave(self, reason: str, plan=None) -> None:
        """Leaves the current world, or what was built of plan `plan`'s (its connections
        close: a member still waiting in one of its collectives fails at once instead of
        at its timeout)."""
        import torch.distributed as dist

        plan = plan or self.plan
        print(f"{self.name}: leaves weight-sync plan {plan.plan_id} ({reason})",
              file=sys.stderr, flush=True)
        self.executor = None
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # a broken world: what is left of it goes with the process
                pass
        gc.collect()
        self.plan = None

    def _die(self, plan, version: int, where: str) -> None:
        """The fault ``--die-during-sync`` injects: this engine SIGKILLs itself in the
        sync of `version`, in plan `plan`'s world (saying so in ``dying.engine<e>``)."""
        import signal

        write_json_atomic(os.path.join(self.data, f"dying.engine{self.engine}"), {
            "engine": self.engine, "version": version, "plan_id": plan.plan_id,
            "members": list(plan.members), "where": where, "time": time.time()})
        print(f"{self.name}: --die-during-sync {version}: SIGKILL ({where})", file=sys.stderr,
              flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    # ---- Trainer. ----

    def pending(self) -> bool:
        """Trainer: whether a version it was handed has not been sent yet."""
        return self.next_version in self.history

    def send(self, version: int, sources) -> None:
        """Trainer: keeps `version` (this rank's Megatron-named tensors) and sends every
        version not sent yet, in order, each one run of the plan."""
        self.history[version] = sources
        while self.pending():
            if self.plan is None or self.broken:
                if self.plan is not None:
                    self._leave(self.broken)
                try:  # the newest plan, past every world tried (joined, or lost joining)
                    self._join(self._next_plan(self.tried))
                except WorldLost:
                    pass  # left it; the runtime plans the membership without the lost one
                continue
            fresh = self.history[self.next_version]
            with torch.no_grad():
                for name, tensor in fresh.items():
                    self.sources[name].copy_(tensor)
            self.broken = self._try_run()
            if self.broken:
                self.epochs[-1]["failed"] = self.broken
                continue
            self.next_version += 1
            # Run v completed here: every member finished run v - 1 before it took part
            # in run v, so no world asks for an older version again.
            self.history.pop(self.next_version - 2, None)

    # ---- Engine. ----

    def receive(self, plan, version: int) -> Dict[str, torch.Tensor]:
        """Engine: in the world of plan `plan` (the one its SyncWeights names), runs the
        plan until it holds `version`; its HF-named tensors."""
        if plan is None:
            raise RuntimeError(f"{self.name}: SyncWeights to version {version} names no "
                               "weight-sync plan (rlsched run needs --model --train --infer)")
        self.enter(plan, version)
        while self.received < version:
            if self.incoming == version and version == self.die_during_sync:
                self._die(self.plan, version, "before the run that carries it")
            failure = self._try_run()
            if failure:
                lost = self.plan
                self.epochs[-1]["failed"] = failure
                self._leave(f"the run failed: {failure}")
                raise WorldLost(lost, failure)
            v, self.incoming = self.incoming, self.incoming + 1
            if v > self.received:
                self.received, self.state = v, self._hf_state()
        if self.received != version:  # the trainer no longer had it: a newer one came
            raise RuntimeError(f"{self.name}: SyncWeights to version {version}, but the "
                               f"world of plan {self.plan.plan_id} sent from version "
                               f"{self.received}")
        return self.state

    def enter(self, plan, version: int = -1) -> None:
        """Engine: makes the world of plan `plan` this engine's (leaving the one it is
        in for it, joining it; nothing when it is there already). Raises
        :class:`WorldLost` (having left it) when a member is lost while it is built."""
        if self.plan is not None and plan.plan_id == self.plan.plan_id:
            return
        self.check(plan)
        if self.plan is not None:
            self._leave(f"the runtime's plan {plan.plan_id} replaces it")
        self._join(plan, version)

    def _hf_state(self) -> Dict[str, torch.Tensor]:
        """The received vLLM tensors as HF-named ones."""
        c, d = self.config, self.destinations
        q = c.num_attention_heads * c.head_dim
        kv = c.num_key_value_heads * c.head_dim
        state = {"model.embed_tokens.weight": d["model.embed_tokens.weight"][:c.vocab_size],
                 "lm_head.weight": d["lm_head.weight"][:c.vocab_size],
                 "model.norm.weight": d["model.norm.weight"]}
        for n in range(c.num_hidden_layers):
            p = f"model.layers.{n}."
            qkv = d[p + "self_attn.qkv_proj.weight"]
            gate_up = d[p + "mlp.gate_up_proj.weight"]
            state.update({
                p + "self_attn.q_proj.weight": qkv[:q],
                p + "self_attn.k_proj.weight": qkv[q:q + kv],
                p + "self_attn.v_proj.weight": qkv[q + kv:q + 2 * kv],
                p + "self_attn.o_proj.weight": d[p + "self_attn.o_proj.weight"],
                p + "mlp.gate_proj.weight": gate_up[:c.intermediate_size],
                p + "mlp.up_proj.weight": gate_up[c.intermediate_size:],
                p + "mlp.down_proj.weight": d[p + "mlp.down_proj.weight"],
                p + "input_layernorm.weight": d[p + "input_layernorm.weight"],
                p + "post_attention_layernorm.weight": d[p + "post_attention_layernorm.weight"],
            })
        return {k: v.clone() for k, v in state.items()}

    def _try_run(self) -> Optional[str]:
        """One run of the plan; what failed, or None. (The exception, which holds the
        failed collective and its process group, is gone when this returns.)"""
        try:
            self._run()
            return None
        except RuntimeError as e:
            return _first_line(e)

    def _run(self) -> None:
        import torch.distributed as dist

        stats = self.executor.run()
        # The run completes for every member of the world or for none: no member counts
        # the version received (an engine reports it) before all hold it, so a member
        # lost during the run fails it for all of them (as it would a broadcast chain
        # between GPUs), and the runtime sees the loss while the sync is under way.
        dist.barrier()
        self.runs += 1
        self.epochs[-1]["runs"] += 1
        self.bytes += stats.bytes_sent + stats.bytes_received
        self.seconds += stats.transfer_seconds

    def report(self) -> dict:
        """Runs, bytes and transfer seconds over the run; the worlds joined (one per
        plan: its id, epoch, members, group, rank, the version sent again from, runs)
        and the seconds spent joining them (rendezvous, executor checks, groups)."""
        return {"runs": self.runs, "bytes": self.bytes, "seconds": round(self.seconds, 6),
                "seconds_per_run": round(self.seconds / self.runs, 6) if self.runs else None,
                "join_seconds": round(self.join_seconds, 6), "epochs": self.epochs}


class TinyEngine(EngineWorker):
    """Continuous batching over the running samples (one decode step gives each one a
    token; rows of equal context length run as one batch), a KV cache per sample that a
    weight update invalidates (the prefix is prefilled again on resume)."""

    def __init__(self, address: str, engine: int, max_concurrent: int, *, data: str,
                 task: DigitTask, min_step_seconds: float = 0.0,
                 weight_sync: Optional[PlanSync] = None, stall_at_version: int = -1,
                 **kwargs):
        # With the executor the engine starts from the initial policy's file (version 0,
        # as the trainer does: the checkpoint a real engine loads) and says so in its
        # Hello; every later version comes by the runtime's weight-sync plans. With
        # files it starts with nothing, and its first SyncWeights loads version 0.
        super().__init__(address, engine, max_concurrent,
                         version=0 if weight_sync is not None else -1, **kwargs)
        self.data = data
        # A test hook for killing an engine mid-generation: after its first decode step
        # under this version or a later one it writes stalled.engine<e> and generates no
        # more (it still takes commands), so that the SIGKILL run.py then sends finds it
        # with samples half generated. -1: never.
        self.stall_at_version = stall_at_version
        self.stalled = False
        # Every finished sample's id, appended as it finishes: the engine's own count,
        # which outlives a SIGKILL.
        self._finished_log = open(os.path.join(data, f"finished.engine{engine}"), "a")
        self.weight_sync = weight_sync
        self.min_step_seconds = min_step_seconds
        self.task = task
        self.model = TinyLlama(Config.load(CONFIG_PATH))
        self.model.eval()
        self.loaded: Dict[int, str] = {}  # version -> digest of the engine's own weights
        if weight_sync is not None:
            load_weights(data, 0, self.model)
            self.loaded[0] = weights_digest(self.model.state_dict())
        self._lock = threading.Condition()
        self._running: Dict[int, Rollout] = {}
        self._stop = False
        self._thread: Optional[threading.Thread] = None
        self.finished_samples: List[int] = []
        self.syncs: List[dict] = []
        self.quiet_replans: List[dict] = []  # replans of a version held already
        # Decode steps by "rows,prefilled tokens": [steps, seconds] (a step: its forward
        # pass, sampling, the finishes it made, and its pacing).
        self.decode_steps: Dict[str, list] = {}
        # With the executor: the SyncWeights for the sync thread, in order; and what to
        # do when it cannot go on (main: write the report, exit 1).
        self._syncs: "queue.Queue" = queue.Queue()
        self._sync_thread: Optional[threading.Thread] = None
        self.on_fatal = None
        self.interrupts = 0
        self.resumed_tokens = 0
        self.error: Optional[str] = None

    def on_welcome(self, welcome) -> None:
        self.seed = welcome.config.seed
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        if self.weight_sync is not None:
            self._sync_thread = threading.Thread(target=self._sync_loop, daemon=True)
            self._sync_thread.start()

    # ---- Commands. ----

    def dispatch(self, dispatch) -> None:
        with self._lock:
            for work in dispatch.samples:
                r = Rollout(work.sample, work.group, work.prompt, self.task.prompt(work.prompt),
                            self.task.max_new_tokens,
                            sample_seed(self.seed, work.sample, work.resume_from))
                if len(r.prompt) != work.prompt_tokens:
                    self._fail(f"sample {work.sample}: prompt_tokens {work.prompt_tokens} but "
                               f"the task's prompt has {len(r.prompt)}")
                if work.resume_from > 0:
                    partial = _read_json(self._partial_path(work.sample))
                    if len(partial["response"]) < work.resume_from:
                        self._fail(f"sample {work.sample}: resume_from {work.resume_from} > "
                                   f"{len(partial['response'])} tokens kept")
                    n = work.resume_from
                    r.response = partial["response"][:n]
                    r.logprobs = partial["logprobs"][:n]
                    r.versions = partial["versions"][:n]
                    self.resumed_tokens += n
                self._running[work.sample] = r
            self._lock.notify()

    def abort(self, abort) -> None:
        with self._lock:
            for sample in abort.samples:
                self._running.pop(sample, None)

    def sync_weights(self, sync) -> None:
        """An interrupting sync pauses the running samples at once (one GenerationPaused).
        With the executor the load is the sync thread's (:meth:`_sync_loop`), so that
        this thread keeps taking commands: a replan for the sync under way among them."""
        start = time.monotonic()
        if self.weight_sync is not None and sync.replan:
            # A replan never pauses; the sync thread takes it (the sync it replans is
            # under way there, or done).
            self._syncs.put((sync, start))
            return
        with self._lock:
            if sync.interrupt:
                self.interrupts += 1
                for r in self._running.values():
                    if not r.paused:
                        r.paused = True
                        write_json_atomic(self._partial_path(r.sample), {
                            "response": r.response, "logprobs": r.logprobs,
                            "versions": r.versions})
                progress = [(r.sample, len(r.response)) for r in self._running.values()]
                if _BATCHED_PAUSE:  # one GenerationPaused: the pause's acknowledgement
                    self.paused(sync.version, progress)
                else:  # an older runtime: a GenerationProgressed per sample
                    for sample, tokens in progress:
                        self.progressed(sample, tokens)
            if self.weight_sync is not None:
                self._syncs.put((sync, start))
                return
            load_weights(self.data, sync.version, self.model)
            self._commit(sync, start, [])

    def _commit(self, sync, start: float, replans: List[dict]) -> None:
        """Version `sync.version` is in the model: report it (the lock held)."""
        self.loaded[sync.version] = weights_digest(self.model.state_dict())
        for r in self._running.values():
            r.cache = None  # no KV cache survives a weight update
        self.weights_loaded(sync.version)
        # The sync as the engine saw it: SyncWeights taken to weights committed (the
        # pause, a world joined when the plan is new, the runs, the load), and the
        # replans that took it to another world on the way.
        self.syncs.append({"version": sync.version, "plan_id": sync.plan_id,
                           "seconds": round(time.monotonic() - start, 6),
                           "replans": replans})
        self._lock.notify()

    # ---- The weight sync (the sync thread, with the executor). ----

    def _sync_loop(self) -> None:
        """Takes the SyncWeights in order: each one's version by the executor in the
        world of the plan it names; when that world fails under it (a member lost), it
        leaves the world and waits for the runtime's replan of the version, which it
        loads by (reporting weights_loaded once, the sync's). A replan of a version it
        holds already moves it to the new world and reports nothing."""
        while True:
            item = self._syncs.get()
            if item is None:
                return
            sync, start = item
            try:
                if sync.replan:
                    self._replanned(sync)
                else:
                    self._load(sync, start)
            except Exception as e:  # any: the engine cannot go on
                self.error = self.error or _first_line(e)
                print(f"engine{self.engine}: weight sync failed: {self.error}",
                      file=sys.stderr, flush=True)
                if self.on_fatal is not None:
                    self.on_fatal()
                return

    def _replan_of(self, version: int, timeout: float):
        """The next replan of `version` from the queue (None in time: none came)."""
        try:
            item = self._syncs.get(timeout=timeout)
        except queue.Empty:
            return None
        if item is None:  # the engine stops (the run is over)
            self._syncs.put(None)  # for the sync loop, which ends on it
            raise RuntimeError(f"stopped while waiting for the runtime's replan of version "
                               f"{version}")
        sync = item[0]
        if not sync.replan or sync.version != version:
            raise RuntimeError(f"waiting for the runtime's replan of version {version}, got "
                               f"{sync!r}")
        return sync

    def _load(self, sync, start: float) -> None:
        ws = self.weight_sync
        version, plan = sync.version, sync.plan
        # Every version in order: the trainer runs the plan once per version, in the
        # world of the runtime's plan this sync names.
        if version <= ws.received:
            raise RuntimeError(f"SyncWeights to version {version}, but version "
                               f"{ws.received} was received already")
        replans: List[dict] = []
        # A replan already here supersedes the plan (its world lost a member).
        while True:
            with self._syncs.mutex:
                head = self._syncs.queue[0] if self._syncs.queue else None
            if head is None or not head[0].replan or head[0].version != version:
                break
            plan = self._syncs.get()[0].plan
            replans.append({"plan_id": plan.plan_id, "lost": None, "waited_seconds": 0.0})
        while True:
            tried = time.monotonic()
            try:
                state = ws.receive(plan, version)
                break
            except WorldLost as lost:
                print(f"engine{self.engine}: weight sync to version {version}: {lost}; "
                      "waiting for the runtime's replan", file=sys.stderr, flush=True)
                failed_after = time.monotonic() - tried
                replan = self._replan_of(version, ws.timeout.total_seconds())
                if replan is None:
                    raise RuntimeError(
                        f"weight sync to version {version}: {lost}, and no replan of it "
                        f"within {ws.timeout}") from None
                plan = replan.plan
                replans.append({"plan_id": plan.plan_id, "lost": lost.plan.plan_id,
                                "reason": lost.reason,
                                "failed_after_seconds": round(failed_after, 6),
                                "waited_seconds": round(time.monotonic() - tried
                                                        - failed_after, 6)})
        with self._lock:
            self.model.load_state_dict(state)
            self._commit(sync, start, replans)

    def _replanned(self, sync) -> None:
        """A replan of a version this engine holds: into the new world, no report."""
        ws = self.weight_sync
        if sync.version > ws.received:
            raise RuntimeError(f"a replan of version {sync.version}, which this engine "
                               f"neither holds (it holds {ws.received}) nor is loading")
        self.quiet_replans.append({"version": sync.version, "plan_id": sync.plan_id})
        try:
            ws.enter(sync.plan)
        except WorldLost as lost:  # another member lost: its replan or the next sync
            print(f"engine{self.engine}: replan of version {sync.version}: {lost}",
                  file=sys.stderr, flush=True)

    def resume(self, resume) -> None:
        with self._lock:
            for sample in resume.samples:
                r = self._running.get(sample)
                if r is not None:
                    r.paused = False
                    r.cache = None
            self._lock.notify()

    def release(self, release) -> None:
        self.released()

    def on_stop(self) -> None:
        with self._lock:
            self._stop = True
            self._lock.notify()
        self._syncs.put(None)

    def finish_syncs(self, timeout: float = 60.0) -> None:
        """Waits for the sync thread to finish the syncs it was given (the last one may
        still be loading when the run says goodbye; the trainer waits for it)."""
        if self._sync_thread is not None:
            self._sync_thread.join(timeout)
            if self._sync_thread.is_alive() and self.error is None:
                self.error = f"the weight sync thread did not finish within {timeout} s"

    # ---- Generation (the loop thread). ----

    def _partial_path(self, sample: int) -> str:
        return os.path.join(self.data, "partial", f"{sample}.json")

    def _fail(self, message: str) -> None:
        self.error = message
        raise RuntimeError(message)

    def _loop(self) -> None:
        with self._lock:
            while not self._stop:
                active = [r for r in self._running.values() if not r.paused and not r.done]
                if not active:
                    self._lock.wait(timeout=0.5)
                    continue
                if self.stalled:
                    self._lock.wait(timeout=0.5)
                    continue
                start = time.monotonic()
                # Rows without a KV cache are prefilled (prompt and kept tokens) in this
                # step's forward pass.
                prefill = sum(len(r.prompt) + len(r.response) for r in active
                              if r.cache is None)
                decode_step(self.model, active, self.version)
                if 0 <= self.stall_at_version <= self.version:
                    self.stalled = True
                    write_json_atomic(os.path.join(self.data, f"stalled.engine{self.engine}"),
                                      {"version": self.version, "running": len(self._running),
                                       "tokens": sum(len(r.response)
                                                     for r in self._running.values())})
                    continue
                for r in active:
                    if r.done:
                        self._finish(r)
                # Pacing (a slower engine): commands are taken while it waits.
                deadline = start + self.min_step_seconds
                while not self._stop and time.monotonic() < deadline:
                    self._lock.wait(timeout=deadline - time.monotonic())
                # The engine's speed as it ran: the steps by rows and prefilled tokens.
                step = self.decode_steps.setdefault(f"{len(active)},{prefill}", [0, 0.0])
                step[0] += 1
                step[1] += time.monotonic() - start

    def _finish(self, r: Rollout) -> None:
        del self._running[r.sample]
        reward = self.task.reward(r.prompt_id, r.response)
        write_json_atomic(os.path.join(self.data, "samples", f"{r.sample}.json"), {
            "sample": r.sample, "group": r.group, "prompt_id": r.prompt_id,
            "prompt": r.prompt, "response": r.response, "logprobs": r.logprobs,
            "versions": r.versions, "reward": reward,
            "position_rewards": self.task.position_rewards(r.prompt_id, r.response),
            "engine": self.engine})
        self.finished_samples.append(r.sample)
        self._finished_log.write(f"{r.sample}\n")
        self._finished_log.flush()
        self.finished(r.sample, len(r.response), reward)

    def report(self) -> dict:
        return {"finished": self.finished_samples, "loaded": self.loaded,
                "weight_sync": self.weight_sync.report() if self.weight_sync else None,
                "syncs": self.syncs, "quiet_replans": self.quiet_replans,
                "decode_steps": {k: [n, round(t, 6)] for k, (n, t) in
                                 self.decode_steps.items()},
                "interrupts": self.interrupts, "resumed_tokens": self.resumed_tokens,
                "error": self.error}


class TrainerRank:
    """One rank of the trainer (of ``tp * dp`` processes, :class:`tensor_parallel.Grid`;
    None: one process): its model (its TP slices at TP > 1), its optimizer over them,
    and with the executor the sync thread that sends each version of its tensors
    (:class:`PlanSync`). Every rank runs the same calls (:meth:`train`) and publishes
    (:meth:`publish`) in the same order: the TP and DP collectives pair up across the
    ranks."""

    def __init__(self, data: str, grid: Optional[Grid], *, epochs: int,
                 max_grad_norm: float, entropy_coef: float, clip_high: Optional[float],
                 lr: float, weight_sync: Optional[PlanSync] = None):
        self.data, self.grid = data, grid
        self.group = None if grid is None else grid.tp
        self.epochs, self.max_grad_norm = epochs, max_grad_norm
        self.entropy_coef, self.clip_high = entropy_coef, clip_high
        self.weight_sync = weight_sync
        self.sync_error: Optional[str] = None
        config = Config.load(CONFIG_PATH)
        self.model = TinyLlama(config, tp=self.group)
        load_weights(data, 0, self.model)
        # The initial policy's digest from the slices gathered (collective).
        self.initial_digest = weights_digest(full_state(self.model))
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=lr)
        self.train_seconds = 0.0
        self.calls = 0
        if weight_sync is not None:
            self.layout = weight_sync.layout
            # The sync thread sends every version after 0 in order (every rank starts
            # from version 0, the initial policy's file).
            self._versions: "queue.Queue" = queue.Queue()
            self._sending = threading.Condition()
            self._queued, self._sent = 0, 0
            threading.Thread(target=self._send_versions, daemon=True).start()

    @property
    def rank(self) -> int:
        return 0 if self.grid is None else self.grid.rank

    def my_ranks(self, plan: List[List[List[int]]]) -> List[List[List[int]]]:
        """The step plan's ranks this DP replica trains: those r with r % dp = its DP
        rank (all of them in one replica)."""
        if self.grid is None:
            return plan
        return plan[self.grid.dp_rank::self.grid.dp_size]

    def train(self, items: List[dict], plan: List[List[List[int]]], tokens: int,
              lr: float) -> None:
        """One call: `epochs` passes over `items` in the step plan's ranks and
        micro-batches (`plan`: per rank, per micro-batch, the item indices; a DP replica
        trains its ranks' and the replicas' gradients are summed), the loss a token mean
        over the call (`tokens`), one optimizer step per pass."""
        t0 = time.monotonic()
        self.model.train()
        set_lr(self.optimizer, lr)
        tp = self.group is not None and self.group.size > 1
        for _ in range(self.epochs):
            self.optimizer.zero_grad()
            for rank in self.my_ranks(plan):
                for mb in rank:
                    if mb:
                        loss, _ = policy_loss(self.model, [items[i] for i in mb],
                                              entropy_coef=self.entropy_coef,
                                              clip_high=self.clip_high)
                        # A token mean over the whole call, whatever the split.
                        (loss / tokens).backward()
            if self.grid is not None:
                all_reduce_grads(self.model, self.grid.dp)
            if self.max_grad_norm:
                if tp:  # the full gradient's norm (collective)
                    clip_grad_norm(self.model, self.max_grad_norm)
                else:
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
            self.optimizer.step()
        self.calls += 1
        self.train_seconds += time.monotonic() - t0

    def publish(self, version: int) -> Optional[str]:
        """Makes `version` of the weights (collective over the trainer's ranks): rank 0
        gets the digest of the full weights (its TP group's slices gathered), and with
        the executor every rank hands its Megatron-named tensors to its sync thread; with
        files, rank 0 writes the full weights. Raises unless the replicated parameters
        hold the same bits on the TP ranks and every parameter on the DP replicas."""
        dp, dp_rank = 1, 0
        if self.grid is not None:
            self.grid.tp.check_replicated(self.model)
            self.grid.dp.check_identical(dict(self.model.named_parameters()),
                                         "the DP replicas' parameters")
            dp, dp_rank = self.grid.dp_size, self.grid.dp_rank
        full = full_state(self.model)
        digest = None
        if self.weight_sync is None:
            if self.rank == 0:
                digest = publish_weights(self.data, version, full)
        else:
            if self.rank == 0:
                digest = weights_digest(full)
            sources = {k: v.clone() for k, v in
                       megatron_sources(self.model, self.layout, dp, dp_rank).items()}
            with self._sending:
                self._queued += 1
            self._versions.put((version, sources))
        return digest

    def _send_versions(self) -> None:
        try:
            while True:
                try:
                    version, sources = self._versions.get(timeout=0.2)
                except queue.Empty:
                    continue
                self.weight_sync.send(version, sources)
                with self._sending:
                    self._sent += 1
                    self._sending.notify_all()
        except Exception as e:  # a lost engine: the collective times out
            with self._sending:
                self.sync_error = f"{type(e).__name__}: {e}"
                self._sending.notify_all()
            print(f"{self.weight_sync.name}: weight sync failed: {self.sync_error}",
                  file=sys.stderr, flush=True)

    def fail_sync(self, message: str) -> None:
        if self.weight_sync is None:
            return
        with self._sending:
            self.sync_error = message
            self._sending.notify_all()

    def drain(self, timeout: float = 60.0) -> None:
        """Waits until the engines took every version published (the last sync of a run
        may still be moving when the run says goodbye); the trainer must not leave the
        gloo world before."""
        if self.weight_sync is None:
            return
        with self._sending:
            if not self._sending.wait_for(
                    lambda: self._sent == self._queued or self.sync_error is not None,
                    timeout=timeout):
                self.sync_error = (f"the engines took {self._sent} of {self._queued} versions "
                                   f"within {timeout} s of the end")

    def report(self) -> dict:
        g = self.grid
        return {"rank": self.rank, "tp_rank": 0 if g is None else g.tp_rank,
                "dp_rank": 0 if g is None else g.dp_rank, "tp": 1 if g is None else g.tp_size,
                "dp": 1 if g is None else g.dp_size, "calls": self.calls,
                "train_seconds": round(self.train_seconds, 6),
                "weight_sync": self.weight_sync.report() if self.weight_sync else None,
                "sync_error": self.sync_error}


class TinyTrainer(TrainerWorker):
    """Trains each call on the samples it lists, in the step plan's ranks and
    micro-batches (the step plan's data-parallel ranks' gradients accumulate in one
    optimizer step: data parallel in one process), one optimizer step per pass
    (``epochs`` passes), then publishes the new version and reports the step.

    Tensor and data parallel (``grid``: ``tp * dp`` > 1 processes): this process is
    trainer rank 0 (TP rank 0 of DP replica 0) and the one attached to the runtime;
    ranks 1 .. tp*dp-1 are processes of their own (:func:`follow`) that take each call
    from it (a JSON command broadcast to every trainer process: the samples with their
    advantages, the step plan's micro-batches, the learning rate, the version to
    publish). TP ranks train their slices together; DP replica d trains the step plan's
    ranks d, d + dp, ... and the replicas add up their gradients. Each rank sends its own
    tensors through the executor, as the runtime's plan (``--train tp=<tp>,dp=<dp>``)
    says: trainer ranks 0 .. tp*dp-1 of each world."""

    def __init__(self, address: str, *, data: str, lr: float, epochs: int, seed: int,
                 csv_path: Optional[str] = None, weight_sync: Optional[PlanSync] = None,
                 advantage: str = "outcome", max_grad_norm: float = 0.0,
                 entropy_coef: float = 0.0, lr_end: Optional[float] = None,
                 clip_high: Optional[float] = None, grid: Optional[Grid] = None,
                 **kwargs):
        super().__init__(address, **kwargs)
        if grid is not None and grid.rank != 0:
            raise ValueError("TinyTrainer is trainer rank 0 (the others follow it)")
        self.lr, self.lr_end = lr, lr_end
        self.advantage = advantage
        self.data = data
        self.weight_sync = weight_sync
        self.grid = grid
        torch.manual_seed(seed)
        self.rank = TrainerRank(data, grid, epochs=epochs, max_grad_norm=max_grad_norm,
                                entropy_coef=entropy_coef, clip_high=clip_high, lr=lr,
                                weight_sync=weight_sync)
        self.model = self.rank.model
        self.followers: List[dict] = []  # the other trainer ranks' reports, at the end
        self.trained: List[int] = []
        self.trained_by_engine: Dict[str, int] = {}  # engine id -> samples trained
        self.published: Dict[int, str] = {0: self.rank.initial_digest}
        self.steps: List[dict] = []
        self.staleness_violations = 0
        self.length_mismatches = 0
        self.partial_samples = 0  # trained samples with tokens of more than one version
        self.csv_path = csv_path
        self.start = time.monotonic()
        if csv_path:
            with open(csv_path, "w") as f:
                f.write("step,mean_reward,samples,tokens,micro_batches,max_token_staleness,"
                        "train_seconds,wall_seconds\n")

    @property
    def sync_error(self) -> Optional[str]:
        return self.rank.sync_error

    @property
    def ranks(self) -> int:
        """The trainer's processes (tp * dp)."""
        return 1 if self.grid is None else self.grid.size

    def on_welcome(self, welcome) -> None:
        config = welcome.config
        self.samples_per_prompt = config.orchestrator.samples_per_prompt
        self.max_staleness = config.orchestrator.max_staleness
        self.calls_per_sync = max(1, config.orchestrator.train_calls_per_sync)
        self.total_steps = config.steps

    def on_weight_sync_plan(self, plan) -> None:
        """The runtime's plan of a membership (the senders' part: every trainer rank's):
        the sync threads move to its world when the current one fails (rank 0 records it
        for the other TP ranks)."""
        if self.weight_sync is None:
            return
        try:
            self.weight_sync.offer(plan)
        except RuntimeError as e:
            self.rank.fail_sync(str(e))
            raise

    def start_train(self, call) -> None:
        t0 = time.monotonic()
        items = []
        max_stale = 0
        for i, sample in enumerate(call.samples):
            s = _read_json(os.path.join(self.data, "samples", f"{sample}.json"))
            if len(s["prompt"]) + len(s["response"]) != call.lengths[i]:
                self.length_mismatches += 1
            stale = max(call.step - v for v in s["versions"])
            if len(set(s["versions"])) > 1:
                self.partial_samples += 1
            max_stale = max(max_stale, stale)
            if stale > self.max_staleness:
                self.staleness_violations += 1
            items.append(s)
        # GRPO advantages within each group (a call holds whole groups).
        groups: Dict[int, List[dict]] = {}
        for s in items:
            groups.setdefault(s["sample"] // self.samples_per_prompt, []).append(s)
        for rows in groups.values():
            for s, a in zip(rows, advantages(self.advantage, [s["reward"] for s in rows],
                                             [s["position_rewards"] for s in rows],
                                             [len(s["response"]) for s in rows])):
                s["advantage"] = a
        tokens = sum(len(s["response"]) for s in items)
        plan = [[list(mb.indices) for mb in rank.micro_batches] for rank in call.plan.ranks]
        if not plan:
            plan = [[list(range(len(items)))]]
        micro_batches = sum(1 for rank in plan for mb in rank if mb)
        lr = lr_at(call.step, self.total_steps, self.lr, self.lr_end)
        publish = call.step + 1 if call.call == self.calls_per_sync - 1 else None
        if self.ranks > 1:  # the other trainer ranks train the same call
            self.grid.world.broadcast_object({
                "kind": "train", "step": call.step, "call": call.call, "lr": lr,
                "tokens": tokens, "plan": plan, "publish": publish,
                "items": [{k: s[k] for k in ("prompt", "response", "logprobs", "advantage")}
                          for s in items]})
        self.rank.train(items, plan, tokens, lr)
        self.trained.extend(call.samples)
        for s in items:
            key = str(s["engine"])
            self.trained_by_engine[key] = self.trained_by_engine.get(key, 0) + 1
        mean_reward = sum(s["reward"] for s in items) / len(items)
        if publish is not None:
            self.published[publish] = self.rank.publish(publish)
        record = {"step": call.step, "call": call.call, "mean_reward": mean_reward,
                  "samples": len(items), "tokens": tokens, "micro_batches": micro_batches,
                  "max_token_staleness": max_stale,
                  # The samples this rank's DP replica trained (its step plan ranks').
                  "trained": sum(len(mb) for r in self.rank.my_ranks(plan) for mb in r),
                  "train_seconds": time.monotonic() - t0,
                  "wall_seconds": time.monotonic() - self.start}
        self.steps.append(record)
        if self.csv_path:
            with open(self.csv_path, "a") as f:
                f.write(",".join(str(round(record[k], 6) if isinstance(record[k], float)
                                     else record[k])
                                 for k in ("step", "mean_reward", "samples", "tokens",
                                           "micro_batches", "max_token_staleness",
                                           "train_seconds", "wall_seconds")) + "\n")
        self.step_finished(call.step, call.call)

    def drain(self, timeout: float = 60.0) -> None:
        """Waits until the engines took every version this rank published, then stops
        the other TP ranks (each drains its own sync first) and takes their reports."""
        self.rank.drain(timeout)
        self.stop_followers()

    def stop_followers(self) -> None:
        if self.ranks == 1 or self.followers:
            return
        self.grid.world.broadcast_object({"kind": "stop"})
        for r in range(1, self.ranks):
            report = self.grid.world.broadcast_object(None, src=r)
            self.followers.append(report)
            if report.get("sync_error") and self.rank.sync_error is None:
                self.rank.fail_sync(f"trainer{r}: {report['sync_error']}")

    def report(self) -> dict:
        return {"trained": self.trained, "trained_by_engine": self.trained_by_engine,
                "weight_sync": self.weight_sync.report() if self.weight_sync else None,
                "sync_error": self.sync_error, "published": self.published, "steps": self.steps,
                "staleness_violations": self.staleness_violations,
                "max_staleness": self.max_staleness,
                "length_mismatches": self.length_mismatches,
                "partial_samples": self.partial_samples,
                "tp": 1 if self.grid is None else self.grid.tp_size,
                "dp": 1 if self.grid is None else self.grid.dp_size,
                "ranks": [self.rank.report()] + self.followers}


def follow(rank: TrainerRank, report_path: str) -> int:
    """Trainer rank r > 0: trains each call trainer rank 0 broadcasts to every trainer
    process and publishes with it, until it says stop; then drains its weight sync, writes
    its report and sends it to rank 0. 0 when its sync ended clean."""
    world = rank.grid.world
    steps = []
    while True:
        command = world.broadcast_object(None, src=0)
        if command["kind"] == "stop":
            break
        rank.train(command["items"], command["plan"], command["tokens"], command["lr"])
        if command["publish"] is not None:
            rank.publish(command["publish"])
        # The samples this rank's DP replica trained (its step plan ranks').
        mine = sum(len(mb) for r in rank.my_ranks(command["plan"]) for mb in r)
        steps.append({"step": command["step"], "call": command["call"],
                      "samples": len(command["items"]), "trained": mine})
    rank.drain()
    report = rank.report()
    report["steps"] = steps
    write_json_atomic(report_path, report)
    for r in range(1, world.size):
        world.broadcast_object(report if r == world.rank else None, src=r)
    return 0 if rank.sync_error is None else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--role", choices=["engine", "trainer"], required=True)
    parser.add_argument("--address", required=True, help="unix:PATH or HOST:PORT")
    parser.add_argument("--data", required=True, help="the shared data directory")
    parser.add_argument("--engine", type=int, default=0)
    parser.add_argument("--max-concurrent", type=int, default=64)
    parser.add_argument("--task", choices=OPERATIONS, default="add")
    parser.add_argument("--digits", type=int, default=3)
    parser.add_argument("--alphabet", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--advantage", choices=ADVANTAGES, default="process")
    parser.add_argument("--max-grad-norm", type=float, default=1.0)
    parser.add_argument("--clip-high", type=float, default=None)
    parser.add_argument("--lr-end", type=float, default=None)
    parser.add_argument("--entropy-coef", type=float, default=0.0)
    parser.add_argument("--min-step-seconds", type=float, default=0.0,
                        help="engine: a decode step lasts at least this long (a slower engine)")
    parser.add_argument("--die-during-sync", type=int, default=-1, metavar="VERSION",
                        help="engine, with the executor: SIGKILL itself in the sync of "
                        "this version once in that sync's world, before the transfer "
                        "completes (when the sync joins a new world, before the "
                        "executor's collective checks; else before the run that carries "
                        "the version); writes dying.engine<e> first")
    parser.add_argument("--stall-at-version", type=int, default=-1,
                        help="engine: stop generating after the first decode step under "
                        "this version and write stalled.engine<e> (run.py then kills it)")
    parser.add_argument("--csv", default=None, help="trainer: the reward-per-step CSV")
    parser.add_argument("--weights", choices=["executor", "file"], default="executor")
    parser.add_argument("--report", required=True, help="write what this worker did (JSON)")
    parser.add_argument("--tp", type=int, default=1,
                        help="trainer: its tensor-parallel size")
    parser.add_argument("--dp", type=int, default=1,
                        help="trainer: its data-parallel size (tp * dp processes)")
    parser.add_argument("--trainer-rank", type=int, default=0,
                        help="trainer: this process's rank, dp_rank * tp + tp_rank (0 "
                        "attaches to the runtime, the others follow it)")
    parser.add_argument("--tp-timeout", type=float, default=900.0,
                        help="trainer: how long a TP or DP collective may wait (seconds; "
                        "rank > 0 waits that long for rank 0's next call)")
    args = parser.parse_args(argv)
    if args.tp < 1 or args.dp < 1:
        parser.error(f"--tp and --dp must be >= 1, got {args.tp} and {args.dp}")
    if not 0 <= args.trainer_rank < args.tp * args.dp:
        parser.error(f"--trainer-rank must be in [0, tp*dp = {args.tp * args.dp}), got "
                     f"{args.trainer_rank}")
    if args.role == "engine" and args.tp * args.dp != 1:
        parser.error("--tp and --dp are the trainer's (the engines are TP 1)")
    if args.die_during_sync != -1 and (args.role != "engine" or args.weights != "executor"
                                       or args.die_during_sync < 1):
        parser.error(f"--die-during-sync is an engine's, with --weights executor, and a "
                     f"version >= 1 (version 0 is the initial policy's file), got "
                     f"{args.die_during_sync} (--role {args.role}, --weights {args.weights})")
    torch.set_num_threads(1)
    import datetime
    grid = None
    if args.role == "trainer" and args.tp * args.dp > 1:
        # The trainer's groups meet at a FileStore in the data directory (run.py starts
        # every rank with the same one).
        grid = Grid.join(os.path.join(args.data, "trainer.store"), args.trainer_rank, args.tp,
                         args.dp, datetime.timedelta(seconds=args.tp_timeout))
    weight_sync = None
    if args.weights == "executor":
        weight_sync = PlanSync(args.data, None if args.role == "trainer" else args.engine,
                               tp=args.tp, dp=args.dp, trainer_rank=args.trainer_rank)
        weight_sync.die_during_sync = args.die_during_sync
    if args.role == "trainer" and args.trainer_rank > 0:
        rank = TrainerRank(args.data, grid, epochs=args.epochs,
                           max_grad_norm=args.max_grad_norm, entropy_coef=args.entropy_coef,
                           clip_high=args.clip_high, lr=args.lr, weight_sync=weight_sync)
        return follow(rank, args.report)
    if args.role == "engine":
        worker = TinyEngine(args.address, args.engine, args.max_concurrent, data=args.data,
                            task=DigitTask(args.task, args.digits, args.alphabet, args.seed),
                            min_step_seconds=args.min_step_seconds, weight_sync=weight_sync,
                            stall_at_version=args.stall_at_version)
    else:
        worker = TinyTrainer(args.address, data=args.data, lr=args.lr, epochs=args.epochs,
                             seed=args.seed, csv_path=args.csv, weight_sync=weight_sync,
                             advantage=args.advantage, max_grad_norm=args.max_grad_norm,
                             entropy_coef=args.entropy_coef, lr_end=args.lr_end,
                             clip_high=args.clip_high, grid=grid)

    def write_report() -> None:
        report = worker.report()
        report["goodbye"] = worker.goodbye
        import resource
        usage = resource.getrusage(resource.RUSAGE_SELF)
        report["cpu_seconds"] = round(usage.ru_utime + usage.ru_stime, 3)
        write_json_atomic(args.report, report)

    if args.role == "engine" and weight_sync is not None:
        def fatal() -> None:  # the sync thread cannot go on: the engine fails
            write_report()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)
        worker.on_fatal = fatal
    reason = None
    try:
        reason = worker.run()
        if args.role == "trainer":
            worker.drain()
        elif weight_sync is not None:
            worker.finish_syncs()
    finally:
        if args.role == "trainer" and reason != "done":
            try:  # the other trainer ranks wait for rank 0's next call: stop them
                worker.stop_followers()
            except RuntimeError as e:
                print(f"trainer: stopping the other trainer ranks failed: {e}",
                      file=sys.stderr)
        write_report()
    failed = getattr(worker, "sync_error", None) or getattr(worker, "error", None)
    return 0 if reason == "done" and not failed else 1


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip the interpreter's teardown: gloo's threads do not survive the destruction of
    # the process group at exit ("terminate called without an active exception").
    os._exit(status)
