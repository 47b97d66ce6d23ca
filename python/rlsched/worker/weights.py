"""A worker's part of a weight-sync plan, as ``rlsched run`` sends it
(``rlsched.v1.WeightSyncPlan``, proto/rlsched/v1/runtime.proto).

With a weight layout (``rlsched run --model config.json --train tp=2 --infer tp=2``),
the scheduler plans each weight sync for the engines attached when it is decided (the
membership: engine ``members[k]`` is replica ``k``) and sends each worker its part once
per plan id, before the first command that uses it: an engine's ``SyncWeights`` names
it (``sync.plan_id``; the base class hands ``sync_weights`` the decoded part as
``sync.plan``), the trainer gets the senders' part when a sync first uses a plan and
when it attaches (``TrainerWorker.on_weight_sync_plan``). A new membership is a new plan
and a new transfer group (``group.name``): the old group is torn down.

:class:`WeightUpdate` is the part decoded: the transfer group (name, backend, world
size, address, port), the worker's ranks in it (``rank_offset`` .. ``rank_offset +
ranks - 1``), the plan's transfers each rank sends or receives (``by_rank``, as
:class:`rlsched.weight_sync.executor.Transfer`; :meth:`WeightUpdate.rank_plan` gives the
:class:`rlsched.weight_sync.executor.RankPlan` an
:class:`rlsched.weight_sync.executor.Executor` runs), and the buckets' metadata
(:meth:`WeightUpdate.buckets`: per bucket, each slice's names, dtype, shape, bytes and
sender rank).
"""

import dataclasses
from typing import Dict, List, Optional, Tuple

from rlsched.weight_sync import executor
from rlsched.errors import InvalidArgumentError

# A transfer's bytes on the wire: the trainer's bf16, or fp8 e4m3 codes then an fp32
# scale per 128 x 128 block when the sender quantises.
DTYPE_BF16 = "bf16"
DTYPE_FP8_BLOCK128 = "fp8_e4m3+fp32_block_scales"


@dataclasses.dataclass(frozen=True)
class TransferGroup:
    """Where a plan's bytes move (``rlsched.v1.TransferGroup``)."""
    name: str
    backend: str
    world_size: int
    address: str
    port: int


@dataclasses.dataclass(frozen=True)
class SliceInfo:
    """One transfer as bucket metadata: what a receiver allocates and where it goes."""
    index: int  # the transfer's position in the plan
    src_rank: int
    src_param: str  # Megatron-core name
    dst_param: str  # vLLM name
    dtype: str  # DTYPE_BF16 or DTYPE_FP8_BLOCK128
    shape: Tuple[int, ...]  # the slice's
    dst_slice: Tuple[Tuple[int, int], ...]
    dst_ranks: Tuple[int, ...]
    bytes: int


class WeightUpdate:
    """A worker's part of one weight-sync plan (``rlsched.v1.WeightSyncPlan``), decoded.

    ``replica`` is the engine's (its index in ``members``), -1 for the trainer;
    ``transfers`` the plan indices the worker takes part in (an engine: those reaching
    its ranks; the trainer: all) and ``bytes`` what the scheduler says its ranks receive
    (an engine: each transfer once per rank reached) or send (the trainer: each once).
    """

    def __init__(self, message):
        self.message = message
        self.plan_id: str = message.plan_id
        self.epoch: int = message.epoch
        g = message.group
        self.group = TransferGroup(name=g.name, backend=g.backend, world_size=g.world_size,
                                   address=g.address, port=g.port)
        self.members: Tuple[int, ...] = tuple(message.members)
        self.replica: int = message.replica
        self.rank_offset: int = message.rank_offset
        self.ranks: int = message.ranks
        self.summary = message.summary
        self.transfers: Tuple[int, ...] = tuple(message.transfers)
        self.bytes: int = message.bytes
        if len(message.parts) != self.ranks:
            raise InvalidArgumentError(f"weight_sync_plan {self.plan_id}: parts: "
                                       f"{len(message.parts)} for {self.ranks} ranks",
                                       "weight_sync_plan.parts")
        self.by_rank: Dict[int, List[executor.Transfer]] = {
            self.rank_offset + i: executor.part_transfers(part, self.rank_offset + i,
                                                          f"weight_sync_plan {self.plan_id}")
            for i, part in enumerate(message.parts)}

    @property
    def rank_range(self) -> range:
        return range(self.rank_offset, self.rank_offset + self.ranks)

    def received_bytes(self) -> int:
        """The bytes the worker's ranks receive by their parts: each transfer once per
        rank of the worker it reaches (local copies included)."""
        return sum(t.bytes for rank, part in self.by_rank.items() for t in part
                   if rank in t.dst_ranks)

    def sent_bytes(self) -> int:
        """The bytes the worker's ranks send by their parts: each transfer once."""
        return sum(t.bytes for rank, part in self.by_rank.items() for t in part
                   if t.src_rank == rank)

    def received_transfers(self) -> List[int]:
        """The plan indices reaching the worker's ranks, ascending (by the parts)."""
        return sorted({t.index for rank, part in self.by_rank.items() for t in part
                       if rank in t.dst_ranks})

    def check(self) -> List[str]:
        """What in the part contradicts itself (empty when nothing): the transfers and
        bytes the scheduler states against those the ranks' parts give."""
        problems = []
        if self.replica >= 0:
            if not 0 <= self.replica < len(self.members):
                problems.append(f"replica {self.replica} outside members {list(self.members)}")
            received, mine = self.received_bytes(), self.received_transfers()
            if received != self.bytes:
                problems.append(f"bytes: told {self.bytes}, the parts receive {received}")
            if mine != list(self.transfers):
                problems.append(f"transfers: told {len(self.transfers)}, the parts reach "
                                f"{len(mine)} (first difference at "
                                f"{_first_difference(mine, list(self.transfers))})")
        else:
            sent = self.sent_bytes()
            if sent != self.bytes:
                problems.append(f"bytes: told {self.bytes}, the parts send {sent}")
        for rank, part in self.by_rank.items():
            for t in part:
                if t.src_rank != rank and rank not in t.dst_ranks:
                    problems.append(f"rank {rank}: transfer {t.index} neither sent nor received")
                    break
        return problems

    def buckets(self) -> Dict[int, List[SliceInfo]]:
        """Per bucket (ascending), the slices the worker's ranks send or receive in it:
        names, dtype, shape, bytes, the sender; each transfer once."""
        seen = set()
        out: Dict[int, List[SliceInfo]] = {}
        for part in self.by_rank.values():
            for t in part:
                if t.index in seen:
                    continue
                seen.add(t.index)
                out.setdefault(t.bucket, []).append(SliceInfo(
                    index=t.index, src_rank=t.src_rank, src_param=t.src_param,
                    dst_param=t.dst_param,
                    dtype=(DTYPE_FP8_BLOCK128 if t.quantize == executor.QUANTIZE_AT_SENDER
                           else DTYPE_BF16),
                    shape=tuple(e - b for b, e in t.src_slice), dst_slice=t.dst_slice,
                    dst_ranks=t.dst_ranks, bytes=t.bytes))
        return {b: sorted(v, key=lambda s: s.index) for b, v in sorted(out.items())}

    def rank_plan(self, rank: int) -> "executor.RankPlan":
        """Rank `rank`'s part as the executor takes it (one of the worker's ranks)."""
        if rank not in self.by_rank:
            raise InvalidArgumentError(f"rank: {rank} is not one of this worker's ranks "
                                       f"[{self.rank_offset}, {self.rank_offset + self.ranks})",
                                       "rank")
        return executor.summary_rank_plan(
            self.summary, rank, self.group.world_size, bool(self.summary.topology.colocated),
            list(self.by_rank[rank]))

    def as_dict(self) -> dict:
        """A JSON-able record (reports, logs)."""
        return {"plan_id": self.plan_id, "epoch": self.epoch, "members": list(self.members),
                "replica": self.replica, "rank_offset": self.rank_offset, "ranks": self.ranks,
                "world_size": self.group.world_size, "group": self.group.name,
                "backend": self.group.backend, "transfers": list(self.transfers),
                "bytes": self.bytes, "trainer_ranks": self.summary.trainer_ranks,
                "engine_ranks": self.summary.engine_ranks,
                "num_transfers": self.summary.num_transfers}


def _first_difference(a: List[int], b: List[int]) -> Optional[int]:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


class SyncWeights:
    """A ``SyncWeights`` command with its weight-sync plan: the message's fields
    (``engine``, ``version``, ``interrupt``, ``plan_id``, ``pause``) and ``plan``, the engine's
    :class:`WeightUpdate` (None when the run has no weight layout)."""

    __slots__ = ("message", "plan")

    def __init__(self, message, plan: Optional[WeightUpdate]):
        self.message = message
        self.plan = plan

    def __getattr__(self, name):
        return getattr(self.message, name)

    def __repr__(self) -> str:
        return (f"SyncWeights(engine={self.message.engine}, version={self.message.version}, "
                f"interrupt={self.message.interrupt}, pause={self.message.pause}, "
                f"plan_id={self.message.plan_id!r})")
