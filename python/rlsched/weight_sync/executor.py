"""rlsched.weight_sync.executor: runs a weight-resharding plan on ``torch.distributed``.

The planner (``rlsched reshard --plan-out``, ``rlsched.reshard(...)``) says which slice
of which trainer tensor goes to which engine ranks in which bucket; this module moves
the bytes. Every rank of one ``torch.distributed`` world (trainer ranks and engine
ranks numbered as the plan numbers them: trainer ``0..T-1``, engine (replica, tp rank)
``T + replica*tp + tp_rank`` on separate GPUs or ``replica*tp + tp_rank`` colocated)
makes an :class:`Executor` from the same plan once, then runs it at every sync::

    plan = load_plan("plan.json", rank)           # or "plan.binpb": this rank's part only
    sync = Executor(plan, sources=megatron_state,  # Megatron names -> local shards
                    destinations=vllm_params,      # vLLM names -> preallocated tensors
                    timeout=datetime.timedelta(seconds=60))
    stats = sync.run()                             # after every train step

(:func:`execute` does both once.) Names are canonical (``rlsched/rollout/layout.h``):
Megatron's with the global layer index and global expert id, vLLM's after its loader's
stacking (``qkv_proj``, ``gate_up_proj``, ``experts.w13_weight``). An engine may pass
``on_slice(vllm_name, tensor, dst_slice)`` instead of (or beside) ``destinations``: it
is called for every slice as its bucket completes, ``tensor`` a view of the staging
buffer shaped like the destination slice (valid during the call only), or of the
destination tensor when both are given.

How it moves bytes. Buckets run in order. Inside a bucket, the transfers of one
(source rank, destination set) are packed into one contiguous buffer and moved with one
collective: a broadcast over a process group made once per distinct member set (source
plus destinations, created in the same order on every rank when the Executor is made),
a send/recv pair when there is one destination, a plain copy when the destination is the
source rank itself. A transfer of at least ``direct_min_bytes`` (1 MiB) moves in a
collective of its own, straight from the source tensor and into the destination tensor
where its slice is contiguous there (no staging copy: on CPU the copies cost as much as
loopback TCP); one the sender quantises to fp8 moves its codes so (quantised into
staging on the sender, received in place), its block scales packed with the small
transfers of the same source and destinations, in a collective after it. Every rank
starts its collectives in one global order (bucket, source, destinations, single
transfers before packed ones, first transfer), asynchronously, packing the next while
the previous ones move, then waits for the bucket and unpacks (a colocated sender that
also receives a slice takes it from what it packed), so that collectives on different
groups run at the same time and no two ranks wait on each other in opposite orders.
Staging memory: one buffer per run, :attr:`Executor.staging_bytes`: the largest
bucket's packed slices on this rank (what it sends plus what it receives over links in
that bucket, at most the plan's bucket budget each way, less what moves straight; local
copies need none), plus at most 7 bytes of alignment per packed slice and per
collective. A collective waits at most `timeout` (then torch raises), so that a lost
rank fails the others instead of hanging them.

Checks before any byte moves (every rank checks its part, then the ranks exchange
their findings in one ``all_gather_object``, so that every rank raises the same
:class:`PlanMismatchError` and none is left waiting in a collective): the world size
against the plan's trainer and engine ranks, each sent tensor present with the slice's
number of dims, the slice inside its shape and bytes equal to elements x element size,
each destination tensor present and the slice inside it with the same element size and
shape, source and destination slices with the same shape (dims of size 1 aside), every
element of every destination tensor written exactly once by the slices the rank
receives (:func:`coverage_problems`: from the slices' corners, no per-element work; the
problem names the tensor, the first element written never or twice and the transfers
that write it; vocabulary padding and fp8 block scales aside); for a plan read whole
from a file (:func:`load_plan`), the ranks' parts together against the plan's
``num_transfers`` and ``bytes_received`` (every transfer in its sender's part and in
each receiver's); and, when the caller says which
layouts its world runs (``layout``, see :func:`world_layout`), each against the layouts
the plan records it was made for (``ReshardPlan.train``, ``infer``, ``topology``,
``target_dtype``): two layouts of one world size can give slices of the same shapes
(a plan for trainer TP 2 run by DP 2 ranks), which only this check tells apart. A rank
that cannot read its part (a cut ``.binpb``) calls :func:`refuse_plan`, which takes part
in the same exchange: every rank raises with its cause instead of losing the rank.
:class:`PlanMismatchError` is an :class:`rlsched.errors.InvalidArgumentError`.

fp8 targets (``--target-dtype fp8_block128``): an engine's linear weights are fp8 e4m3
in 128 x 128 blocks (torch 1.13 has no float8 type: destination tensors hold the bits as
``torch.uint8``, and ``<name>_scale_inv`` the float32 scale of each block, shaped
:func:`scale_shape`). Where the plan says the sender quantises (the slice covers whole
blocks), the sender sends the codes then the scales (bytes = elements + 4 x blocks);
otherwise the bf16 slices arrive and the engine rank gathers them in a bf16 buffer (the
whole 128 x 128 blocks they touch: memory beyond the staging buffer, per tensor being
gathered) and quantises those blocks when the last slice is in. Both sides quantise with
:func:`quantize_block128` (scale = block amax / 448 in float32, codes rounded to nearest
even on the float32 bits), so the bytes do not depend on who quantised. On CPU it runs
in the native module when that has it (``rlsched._native.quantize_block128``, C++: one
pass for the block maxima and one for the codes, the same bytes), else in torch (about a
dozen vectorised in-place passes per element, and numpy for shifts).

Thread-safety: one :meth:`Executor.run` per rank at a time; every rank runs the same
number of syncs in the same order.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import itertools
import json
import time
from typing import (TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Mapping, Optional,
                    Sequence, Tuple, cast)

from rlsched.errors import ExecutorError, InvalidArgumentError, RlschedError, plain_message

if TYPE_CHECKING:  # torch is imported where it is used, so that reading plans needs none
    import torch

QUANTIZE_NONE = 0
QUANTIZE_AT_SENDER = 1
QUANTIZE_AT_DESTINATION = 2
_QUANTIZE_NAMES = {"QUANTIZE_NONE": QUANTIZE_NONE, "QUANTIZE_AT_SENDER": QUANTIZE_AT_SENDER,
                   "QUANTIZE_AT_DESTINATION": QUANTIZE_AT_DESTINATION}

# Buffer offsets are rounded up to this many bytes so that any element type can be
# viewed in place.
_ALIGN = 8
# At most this many problems are listed in a PlanMismatchError.
MAX_PROBLEMS = 20

Slice = Tuple[Tuple[int, int], ...]


class PlanMismatchError(InvalidArgumentError):
    """The plan does not fit this world or these tensors, or a rank could not read its
    part; raised on every rank before any byte moves. ``problems`` lists them as
    ``(rank, field, text)`` (rank -1: the ranks' parts together), ``field`` is the first
    one's. An
    :class:`~rlsched.errors.InvalidArgumentError` (so also a ValueError)."""

    def __init__(self, problems: Sequence[Tuple[int, str, str]], total: int):
        self.problems = [(rank, field, text) for rank, field, text in problems]
        self.total = total
        lines = [f"{f'rank {rank}' if rank >= 0 else 'the parts'}: {field}: {text}"
                 for rank, field, text in self.problems]
        more = f" (and {total - len(self.problems)} more)" if total > len(self.problems) else ""
        super().__init__(f"the plan does not fit this world: {total} problem(s){more}:\n  "
                         + "\n  ".join(lines), self.problems[0][1] if self.problems else "")

    def __reduce__(self):
        return (type(self), (self.problems, self.total))


@dataclasses.dataclass(frozen=True)
class Transfer:
    """One transfer of the plan (``rlsched.v1.Transfer``), slices as (begin, end) pairs."""
    index: int
    bucket: int
    src_rank: int
    src_param: str
    src_slice: Slice
    dst_ranks: Tuple[int, ...]
    dst_param: str
    dst_slice: Slice
    bytes: int
    quantize: int = QUANTIZE_NONE

    @property
    def local(self) -> bool:
        return self.dst_ranks == (self.src_rank,)

    @property
    def elements(self) -> int:
        return _slice_elements(self.src_slice)


@dataclasses.dataclass
class RankPlan:
    """The transfers one rank sends or receives (plan order), and the plan's summary."""
    rank: int
    trainer_ranks: int
    engine_ranks: int
    num_buckets: int
    world_size: int  # what the plan needs: trainer + engine ranks, or the larger colocated
    colocated: bool
    transfers: List[Transfer]
    summary: dict  # the plan's summary fields (bytes_moved, estimate_seconds, ...)
    # What the plan was made for, as :func:`world_layout` gives it; None for a plan that
    # does not record it (written by an rlsched before the plan carried its layouts).
    made_for: Optional[dict] = None
    # The whole plan's recorded (num_transfers, bytes_received), for a part read from a
    # plan file that is run whole (:func:`load_plan`): the ranks check their parts
    # against them together. None: not checked (a run's part of a replica's world).
    totals: Optional[Tuple[int, int]] = dataclasses.field(default=None, compare=False)


_TRAIN_SIZES = ("tp", "pp", "vpp", "ep", "etp", "cp", "dp")
_TARGET_DTYPES = {"TARGET_DTYPE_UNSPECIFIED": "bf16", "TARGET_DTYPE_BF16": "bf16",
                  "TARGET_DTYPE_FP8_BLOCK128": "fp8_block128", 0: "bf16", 1: "bf16",
                  2: "fp8_block128", "bf16": "bf16", "fp8": "fp8_block128",
                  "fp8_block128": "fp8_block128"}


def _fields(layout) -> dict:
    if layout is None:
        return {}
    if dataclasses.is_dataclass(layout):
        return dataclasses.asdict(layout)
    return dict(layout)


def world_layout(train, infer, colocated: bool = False, target_dtype: str = "bf16") -> dict:
    """The layouts a world runs, in the form plans record them: `train` a mapping (or
    ``layouts.Train``) of Megatron sizes tp, pp, vpp, ep, etp, cp, dp (absent or
    0: 1) and optionally first_stage_layers / last_stage_layers / layers_per_chunk;
    `infer` a mapping (or ``layouts.Infer``) of tp, replicas, expert_parallel
    (or ``ep``) and round_robin_experts; `target_dtype` bf16 or fp8_block128 (fp8)."""
    t, i = _fields(train), _fields(infer)
    out_train: Dict[str, Any] = {k: int(t.get(k) or 1) for k in _TRAIN_SIZES}
    for key in ("first_stage_layers", "last_stage_layers"):
        if t.get(key) is not None:
            out_train[key] = int(t[key])
    chunks = [int(n) for n in t.get("layers_per_chunk") or ()]
    if chunks:
        out_train["layers_per_chunk"] = chunks
    expert_parallel = bool(i.get("expert_parallel", i.get("ep", False)))
    out_infer = {"tp": int(i.get("tp") or 1), "replicas": int(i.get("replicas") or 1),
                 "expert_parallel": expert_parallel,
                 "round_robin_experts": bool(i.get("round_robin_experts", False))}
    if target_dtype not in _TARGET_DTYPES:
        raise InvalidArgumentError(f"target_dtype: {target_dtype!r} is not bf16 or fp8_block128",
                                   "target_dtype")
    return {"train": out_train, "infer": out_infer, "colocated": bool(colocated),
            "target_dtype": _TARGET_DTYPES[target_dtype]}


def _made_for(train, infer, topology, target_dtype, get) -> Optional[dict]:
    """The recorded layouts of a plan's summary (JSON dicts or protobuf messages, read
    through `get(message, field, default)`), or None when the plan has none."""
    if train is None or infer is None:
        return None
    placement = get(infer, "expert_placement", 0)
    return world_layout(
        {**{k: get(train, k, 1) for k in _TRAIN_SIZES},
         "first_stage_layers": get(train, "first_stage_layers", None),
         "last_stage_layers": get(train, "last_stage_layers", None),
         "layers_per_chunk": get(train, "layers_per_chunk", ())},
        {"tp": get(infer, "tp", 1), "replicas": get(infer, "replicas", 1),
         "expert_parallel": get(infer, "expert_parallel", False),
         "round_robin_experts": placement in (2, "EXPERT_PLACEMENT_ROUND_ROBIN")},
        colocated=bool(get(topology, "colocated", False)) if topology is not None else False,
        target_dtype=target_dtype if target_dtype in _TARGET_DTYPES else "bf16")


# ---------------------------------------------------------------------------------
# Reading plans.

def _slice_elements(s: Slice) -> int:
    n = 1
    for b, e in s:
        n *= e - b
    return n


def _json_ranges(ranges) -> Slice:
    return tuple((int(r.get("begin", 0)), int(r.get("end", 0))) for r in ranges)


def _cause(error: Exception) -> str:
    """What a wrapping message quotes of `error`: its message when it is one of ours,
    else its type and text."""
    if isinstance(error, RlschedError):
        return plain_message(error)
    return f"{type(error).__name__}: {error}"


def _json_transfer(index: int, t: dict) -> Transfer:
    try:
        return _json_transfer_fields(index, t)
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise InvalidArgumentError(f"transfers[{index}]: not a transfer of "
                                   f"rlsched.v1.ReshardPlan ({_cause(error)})",
                                   f"transfers[{index}]") from None


def _json_transfer_fields(index: int, t: dict) -> Transfer:
    q = t.get("quantize", "QUANTIZE_NONE")
    if isinstance(q, str) and q not in _QUANTIZE_NAMES:
        raise InvalidArgumentError(f"quantize {q!r}", f"transfers[{index}].quantize")
    return Transfer(index=index, bucket=int(t.get("bucket", 0)), src_rank=int(t.get("src_rank", 0)),
                    src_param=t["src_param"], src_slice=_json_ranges(t.get("src_slice", [])),
                    dst_ranks=tuple(int(r) for r in t.get("dst_ranks", [])),
                    dst_param=t["dst_param"], dst_slice=_json_ranges(t.get("dst_slice", [])),
                    bytes=int(t.get("bytes", 0)),
                    quantize=_QUANTIZE_NAMES[q] if isinstance(q, str) else int(q))


def _plan_world(trainer_ranks: int, engine_ranks: int, max_rank: int) -> Tuple[int, bool]:
    """(world size, colocated): separate GPUs put the last engine rank at T + E - 1."""
    colocated = max_rank < max(trainer_ranks, engine_ranks)
    return (max(trainer_ranks, engine_ranks) if colocated else trainer_ranks + engine_ranks,
            colocated)


_SUMMARY_FIELDS = ("num_transfers", "num_buckets", "trainer_ranks", "engine_ranks",
                   "bytes_received", "bytes_local", "bytes_moved", "estimate_seconds",
                   "lower_bound_seconds", "naive_seconds")


def plan_from_json(plan: dict, rank: int) -> RankPlan:
    """The part of a JSON plan (``rlsched.v1.ReshardPlan`` in protobuf's JSON mapping,
    as ``rlsched reshard --plan-out plan.json`` writes it) that `rank` takes part in."""
    transfers = [_json_transfer(i, t) for i, t in enumerate(plan.get("transfers", []))]
    if not transfers and int(plan.get("num_transfers", 0)) > 0:
        raise InvalidArgumentError("transfers: the plan has none listed (plan it with "
                                   "include_transfers / --plan-out)", "transfers")
    trainer_ranks = int(plan.get("trainer_ranks", 0))
    engine_ranks = int(plan.get("engine_ranks", 0))
    max_rank = max((max(t.src_rank, *t.dst_ranks) for t in transfers if t.dst_ranks), default=-1)
    world, colocated = _plan_world(trainer_ranks, engine_ranks, max_rank)
    _check_totals(plan, transfers)
    mine = [t for t in transfers if t.src_rank == rank or rank in t.dst_ranks]
    summary = {k: plan.get(k) for k in _SUMMARY_FIELDS if k in plan}
    summary["num_transfers"] = len(transfers)
    try:
        made_for = _made_for(plan.get("train"), plan.get("infer"), plan.get("topology"),
                             plan.get("target_dtype", "bf16"),
                             lambda m, k, d: m.get(k, d))
    except (TypeError, ValueError, AttributeError) as error:
        raise InvalidArgumentError(f"train / infer / topology: not the layouts of "
                                   f"rlsched.v1.ReshardPlan ({_cause(error)})",
                                   getattr(error, "field", "")) from None
    return RankPlan(rank=rank, trainer_ranks=trainer_ranks, engine_ranks=engine_ranks,
                    num_buckets=int(plan.get("num_buckets", 0)), world_size=world,
                    colocated=colocated, transfers=mine, summary=summary, made_for=made_for,
                    totals=(len(transfers), sum(t.bytes * len(t.dst_ranks) for t in transfers)))


def _check_totals(plan: dict, transfers: List[Transfer]) -> None:
    """A listed plan against its own totals (``num_transfers``, ``bytes_received``): a
    transfer removed, added or re-addressed is refused before any byte moves."""
    recorded = plan.get("num_transfers")
    if recorded is not None and int(recorded) != len(transfers):
        raise InvalidArgumentError(f"transfers: {len(transfers)} listed, the plan records "
                                   f"num_transfers = {int(recorded)} (a transfer removed or "
                                   "added)", "transfers")
    received = plan.get("bytes_received")
    delivered = sum(t.bytes * len(t.dst_ranks) for t in transfers)
    if received is not None and transfers and int(received) != delivered:
        raise InvalidArgumentError(f"transfers: they deliver {delivered} bytes, the plan "
                                   f"records bytes_received = {int(received)} (a transfer "
                                   "removed, added or re-addressed)", "transfers")


def _read_delimited(f, message_type):
    from google.protobuf.internal.decoder import _DecodeVarint32
    head = f.read(10)
    if not head:
        raise InvalidArgumentError("binary plan: unexpected end of file", "plan")
    size, used = _DecodeVarint32(head, 0)
    f.seek(f.tell() - len(head) + used)
    data = f.read(size)
    if len(data) != size:
        raise InvalidArgumentError(f"binary plan: a message of {size} bytes is cut short "
                                   f"({len(data)} read)", "plan")
    message = message_type()
    try:
        message.ParseFromString(data)
    except Exception as error:  # protobuf's DecodeError and kin
        raise InvalidArgumentError(f"binary plan: a {message_type.__name__} that does not "
                                   f"parse ({error})", "plan") from None
    return message


def part_transfers(part, rank: int, source: str) -> List[Transfer]:
    """The transfers of a ``rlsched.v1.ReshardRankPart`` (GPU `rank`'s part, from a binary
    plan file or a run's ``rlsched.v1.WeightSyncPlan``), in the part's order, parameter
    names and receiver sets resolved through the part's tables. A transfer naming an
    entry outside the tables raises an InvalidArgumentError (a ValueError) whose message starts with
    `source`."""
    names = list(part.param_names)
    groups = [tuple(g.ranks) for g in part.dst_groups]
    out = []
    for t in part.transfers:
        if not (0 <= t.src_param < len(names) and 0 <= t.dst_param < len(names)
                and 0 <= t.dst_group < len(groups)):
            raise InvalidArgumentError(f"{source}: transfer {t.index} of rank {rank}'s part "
                                       f"names a parameter or receiver set outside the "
                                       f"part's tables ({len(names)} names, {len(groups)} "
                                       "sets)", "transfers")
        out.append(Transfer(
            index=t.index, bucket=t.bucket, src_rank=t.src_rank, src_param=names[t.src_param],
            src_slice=tuple(zip(t.src_slice[0::2], t.src_slice[1::2])),
            dst_ranks=groups[t.dst_group], dst_param=names[t.dst_param],
            dst_slice=tuple(zip(t.dst_slice[0::2], t.dst_slice[1::2])),
            bytes=t.bytes, quantize=int(t.quantize)))
    return out


def _proto_field(message, field, default):
    """`field` of a protobuf message; `default` for an unset optional stage size."""
    if field in ("first_stage_layers", "last_stage_layers"):
        return getattr(message, field) if message.HasField(field) else default
    return getattr(message, field)


def summary_rank_plan(summary, rank: int, world_size: int, colocated: bool,
                      transfers: List[Transfer]) -> RankPlan:
    """GPU `rank`'s :class:`RankPlan` from a plan's summary message (a
    ``rlsched.v1.ReshardPlan`` without transfers: a binary plan's index, a
    ``WeightSyncPlan``'s summary) and the rank's `transfers` (:func:`part_transfers`)."""
    s = summary
    made_for = (_made_for(s.train, s.infer, s.topology, int(s.target_dtype), _proto_field)
                if s.HasField("train") and s.HasField("infer") else None)
    return RankPlan(rank=rank, trainer_ranks=s.trainer_ranks, engine_ranks=s.engine_ranks,
                    num_buckets=s.num_buckets, world_size=world_size, colocated=colocated,
                    transfers=transfers, summary={k: getattr(s, k) for k in _SUMMARY_FIELDS},
                    made_for=made_for)


def plan_from_binpb(path: str, rank: int) -> RankPlan:
    """This rank's part of a binary plan file (``--plan-out plan.binpb``): the index, then
    only the part at this rank's offset."""
    from rlsched._proto import reshard_pb2
    with open(path, "rb") as f:
        index = _read_delimited(f, reshard_pb2.ReshardPlanIndex)
        if index.format_version != 1:
            raise InvalidArgumentError(f"format_version: binary plan format "
                                       f"{index.format_version}, this executor reads 1",
                                       "format_version")
        s = index.summary
        max_rank = max((p.rank for p in index.parts), default=-1)
        world, colocated = _plan_world(s.trainer_ranks, s.engine_ranks, max_rank)
        transfers: List[Transfer] = []
        for entry in index.parts:
            if entry.rank != rank:
                continue
            f.seek(entry.offset)
            transfers += part_transfers(_read_delimited(f, reshard_pb2.ReshardRankPart), rank,
                                        "binary plan")
    part = summary_rank_plan(s, rank, world, colocated, transfers)
    part.totals = (s.num_transfers, s.bytes_received)
    return part


def load_plan(path: str, rank: int) -> RankPlan:
    """Reads `rank`'s part of a plan file: binary (``.binpb``) or JSON (anything else)."""
    if path.endswith(".binpb"):
        return plan_from_binpb(path, rank)
    with open(path, "r", encoding="utf-8") as f:
        return plan_from_json(json.load(f), rank)


# ---------------------------------------------------------------------------------
# Checks.

def _squeezed(shape: Iterable[int]) -> Tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def _slice_shape(s: Slice) -> Tuple[int, ...]:
    return tuple(e - b for b, e in s)


def _slice_text(s: Slice) -> str:
    return "[" + ", ".join(f"{b}:{e}" for b, e in s) + "]"


def _check_slice(problems, rank, field, name, tensor, s: Slice, t: Transfer) -> bool:
    where = f"transfer {t.index} (bucket {t.bucket})"
    if len(s) != tensor.dim():
        problems.append((rank, field, f"{len(s)} dims for '{name}' of shape {list(tensor.shape)} "
                                      f"in {where}"))
        return False
    for d, ((b, e), size) in enumerate(zip(s, tensor.shape)):
        if not 0 <= b <= e <= size:
            problems.append((rank, f"{field}[{d}]",
                             f"[{b}, {e}) outside dim {d} of '{name}' (size {size}, shape "
                             f"{list(tensor.shape)}) in {where}"))
            return False
    return True


def _fp8_geometry(t: Transfer) -> Tuple[int, int, int]:
    """(rows, cols, blocks) of a quantised transfer's destination slice (its last two
    dims), blocks of 128 x 128 counted from the slice's origin."""
    rows = t.dst_slice[-2][1] - t.dst_slice[-2][0] if len(t.dst_slice) >= 2 else 1
    cols = t.dst_slice[-1][1] - t.dst_slice[-1][0]
    return rows, cols, -(-rows // FP8_BLOCK) * -(-cols // FP8_BLOCK)


def scale_name(name: str) -> str:
    """The block-scale tensor of an fp8 destination tensor (vLLM's ``weight_scale_inv``:
    ``...qkv_proj.weight`` -> ``...qkv_proj.weight_scale_inv``)."""
    return name + "_scale_inv"


def scale_shape(shape: Sequence[int]) -> Tuple[int, ...]:
    """The block-scale tensor's shape for an fp8 tensor of `shape`: the leading dims,
    then ceil(rows / 128), ceil(cols / 128)."""
    return tuple(shape[:-2]) + (-(-shape[-2] // FP8_BLOCK), -(-shape[-1] // FP8_BLOCK))


def check_layout(plan: RankPlan, layout: dict) -> List[Tuple[int, str, str]]:
    """The differences between the layouts the plan was made for and `layout` (as
    :func:`world_layout` gives it), as (rank, field, text): one per field that differs."""
    if plan.made_for is None:
        return [(plan.rank, "train", "the plan does not record the layouts it was made for "
                                     "(planned by an older rlsched): plan it again")]
    problems: List[Tuple[int, str, str]] = []
    want = plan.made_for
    for part in ("train", "infer"):
        keys = sorted(set(want[part]) | set(layout[part]))
        for key in keys:
            a, b = want[part].get(key), layout[part].get(key)
            if a != b:
                problems.append((plan.rank, f"{part}.{key}",
                                 f"the plan is for {part}.{key} = {a}, this world runs {b}"))
    for key in ("colocated", "target_dtype"):
        if want[key] != layout[key]:
            field = "topology.colocated" if key == "colocated" else key
            problems.append((plan.rank, field,
                             f"the plan is for {field} = {want[key]}, this world runs "
                             f"{layout[key]}"))
    return problems


# Coverage: every element of a destination tensor written exactly once, from the plan's
# destination slices (boxes: a (begin, end) interval per dim) before any byte moves.
# The indicator of a box is a signed sum over its 2^dims corners c (each coordinate a
# begin or an end) of Q_c(x) = [x >= c in every dim], the sign -1 per end taken. The
# Q_c of distinct points are linearly independent, so the boxes write the tensor's own
# box B exactly once iff their corners' signed counts, less B's, all cancel. Where they
# do not, the smallest corner (row-major) with a nonzero residual, p, is the first
# element written other than once: every Q_q nonzero at an element before p has q before
# p (a zero residual), and at p itself no other nonzero residual counts; so p is written
# 1 + residual(p) times (p lies in B: the boxes do, and outside B both sides are 0).

def _add_corners(corners: Dict[Tuple[int, ...], int], box: Slice, sign: int) -> None:
    for corner in itertools.product(*(((b, 1), (e, -1)) for b, e in box)):
        weight = sign
        for _, end_sign in corner:
            weight *= end_sign
        point = tuple(c for c, _ in corner)
        corners[point] = corners.get(point, 0) + weight


def first_miscovered(shape: Sequence[int], boxes: Iterable[Slice],
                     extent: Optional[Slice] = None
                     ) -> Optional[Tuple[Tuple[int, ...], int]]:
    """The first element (row-major) of a tensor of `shape` that `boxes` (slices inside
    it: a (begin, end) pair per dim) do not write exactly once, and how many times they
    write it (0: never); None when they write every element exactly once. `extent`:
    only the elements of this box of the tensor count (the boxes inside it). Pure; time
    and memory O(boxes x 2^dims) (the signed corner counts above), no per-element
    work."""
    corners: Dict[Tuple[int, ...], int] = {}
    for box in boxes:
        _add_corners(corners, box, 1)
    _add_corners(corners, extent or tuple((0, d) for d in shape), -1)
    residual = [point for point, count in corners.items() if count]
    if not residual:
        return None
    first = min(residual)
    return first, 1 + corners[first]


def _inside(point: Tuple[int, ...], box: Slice) -> bool:
    return all(b <= x < e for x, (b, e) in zip(point, box))


def _coverage_text(name: str, extent: str, transfers: Sequence[Transfer], element,
                   times: int) -> str:
    if times == 0:
        return (f"element {list(element)} of '{name}' ({extent}) is written by no "
                f"transfer ({len(transfers)} transfer(s) write into it: a transfer missing "
                "or re-addressed)")
    writers = [t.index for t in transfers if _inside(element, t.dst_slice)]
    return (f"element {list(element)} of '{name}' ({extent}) is written {times} "
            f"times, by transfers {writers[:8]}")


# vLLM's vocabulary tables (canonical names), padded to a multiple of this many rows
# that no transfer writes (rlsched/rollout/layout.h: VllmPaddedVocab): the last rows
# of the table, so at most VOCAB_PADDING - 1 trailing rows of a rank's shard.
VOCAB_TABLES = ("embed_tokens.weight", "lm_head.weight")
VOCAB_PADDING = 64


def _vocabulary_extent(name: str, shape: Tuple[int, ...],
                       slices: Sequence[Slice]) -> Optional[Slice]:
    """The part of a destination tensor its slices must write: None (all of it), or for
    a vocabulary table all but the trailing rows of its padding (fewer than
    VOCAB_PADDING rows after the last row written)."""
    if not name.endswith(VOCAB_TABLES) or not shape:
        return None
    rows = max(max((s[0][1] for s in slices), default=0), shape[0] - (VOCAB_PADDING - 1))
    return ((0, rows),) + tuple((0, d) for d in shape[1:])


def coverage_problems(rank: int, transfers: Sequence[Transfer],
                      destinations: Optional[Mapping[str, "torch.Tensor"]]
                      ) -> List[Tuple[int, str, str]]:
    """Whether the `transfers` `rank` receives write each element of its destination
    tensors exactly once, as (rank, "dst_slice", text) problems naming the tensor, the
    first element written other than once (row-major) and the transfers that write it.
    Every tensor of `destinations` counts, whole (a fp8 tensor's ``_scale_inv`` aside: its
    blocks follow the codes; and a vocabulary table's padding, :data:`VOCAB_TABLES`:
    fewer than :data:`VOCAB_PADDING` trailing rows may stay unwritten); without them (an
    ``on_slice`` callback alone) a tensor's extent is taken as the box its slices span, so
    only elements written twice, or missing between others, are found. The slices must
    lie inside their tensors (:func:`check_plan` checks that first)."""
    received: Dict[str, List[Transfer]] = {}
    for t in transfers:
        if rank in t.dst_ranks:
            received.setdefault(t.dst_param, []).append(t)
    names = set(received)
    if destinations is not None:
        scales = {scale_name(n) for n in destinations}
        names.update(n for n, d in destinations.items() if n not in scales and d.numel())
    problems = []
    for name in sorted(names):
        mine = received.get(name, [])
        slices = [t.dst_slice for t in mine]
        if destinations is not None:
            shape = tuple(destinations[name].shape)
            extent, text = _vocabulary_extent(name, shape, slices), f"shape {list(shape)}"
        else:  # the box the slices span
            extent = tuple((min(b for b, _ in dims), max(e for _, e in dims))
                           for dims in zip(*slices))
            shape, text = tuple(e for _, e in extent), f"its slices span {_slice_text(extent)}"
        found = first_miscovered(shape, slices, extent)
        if found is not None:
            problems.append((rank, "dst_slice", _coverage_text(name, text, mine, *found)))
    return problems


def check_plan(plan: RankPlan, world_size: int, sources: Mapping[str, "torch.Tensor"],
               destinations: Optional[Mapping[str, "torch.Tensor"]],
               layout: Optional[dict] = None) -> List[Tuple[int, str, str]]:
    """This rank's problems with the plan, as (rank, field, text); empty when it fits.
    `layout`: the layouts this world runs (:func:`world_layout`), checked after the world
    size against the ones the plan was made for; None: not checked."""
    rank = plan.rank
    problems: List[Tuple[int, str, str]] = []
    if world_size != plan.world_size:
        where = "colocated" if plan.colocated else "on separate GPUs"
        problems.append((rank, "world_size",
                         f"the plan is for {plan.world_size} ranks ({plan.trainer_ranks} trainer, "
                         f"{plan.engine_ranks} engine, {where}), this world has {world_size}"))
        return problems
    if layout is not None:
        problems = check_layout(plan, layout)
        if problems:
            return problems
    for t in plan.transfers:
        where = f"transfer {t.index} (bucket {t.bucket})"
        if t.quantize not in (QUANTIZE_NONE, QUANTIZE_AT_SENDER, QUANTIZE_AT_DESTINATION):
            problems.append((rank, "quantize", f"unknown value {t.quantize} in {where}"))
            continue
        if not t.dst_ranks or list(t.dst_ranks) != sorted(set(t.dst_ranks)):
            problems.append((rank, "dst_ranks", f"{list(t.dst_ranks)} not strictly ascending in "
                                                f"{where}"))
            continue
        engines = (0, plan.engine_ranks) if plan.colocated else \
            (plan.trainer_ranks, plan.trainer_ranks + plan.engine_ranks)
        strangers = [d for d in t.dst_ranks if not engines[0] <= d < engines[1]]
        if strangers:
            problems.append((rank, "dst_ranks", f"{strangers} not engine ranks in "
                                                f"[{engines[0]}, {engines[1]}) in {where}"))
            continue
        if not 0 <= t.src_rank < plan.trainer_ranks:
            problems.append((rank, "src_rank", f"{t.src_rank} not a trainer rank in [0, "
                                               f"{plan.trainer_ranks}) in {where}"))
            continue
        if _squeezed(_slice_shape(t.src_slice)) != _squeezed(_slice_shape(t.dst_slice)):
            problems.append((rank, "dst_slice", f"{_slice_text(t.dst_slice)} has another shape "
                                                f"than src_slice {_slice_text(t.src_slice)} in "
                                                f"{where}"))
            continue
        at_sender = t.quantize == QUANTIZE_AT_SENDER
        if t.quantize != QUANTIZE_NONE and len(t.dst_slice) < 2:
            problems.append((rank, "quantize", f"a vector slice quantised in {where}"))
            continue
        if at_sender:
            rows, cols, blocks = _fp8_geometry(t)
            if t.dst_slice[-2][0] % FP8_BLOCK or t.dst_slice[-1][0] % FP8_BLOCK:
                problems.append((rank, "quantize", f"quantised by the sender but dst_slice "
                                                   f"{_slice_text(t.dst_slice)} does not start on "
                                                   f"a 128 x 128 block in {where}"))
                continue
            if t.bytes != t.elements + 4 * blocks:
                problems.append((rank, "bytes", f"{t.bytes} for {t.elements} fp8 elements and "
                                                f"{blocks} block scales (expected "
                                                f"{t.elements + 4 * blocks}) in {where}"))
                continue
        if t.src_rank == rank:
            src = sources.get(t.src_param)
            if src is None:
                problems.append((rank, "src_param", f"no local tensor '{t.src_param}' ({where})"))
            elif (_check_slice(problems, rank, "src_slice", t.src_param, src, t.src_slice, t)
                  and not at_sender):
                need = t.elements * src.element_size()
                if t.bytes != need:
                    problems.append((rank, "bytes", f"{t.bytes} for {t.elements} elements of "
                                                    f"'{t.src_param}' ({src.dtype}, {need} "
                                                    f"bytes) in {where}"))
        if rank in t.dst_ranks and destinations is None and t.quantize != QUANTIZE_NONE:
            problems.append((rank, "destinations", f"{where} is quantised to fp8: the engine "
                                                   "rank needs its destination tensors (uint8) "
                                                   "and their block scales, not a callback alone"))
        elif rank in t.dst_ranks and destinations is not None:
            dst = destinations.get(t.dst_param)
            if dst is None:
                problems.append((rank, "dst_param",
                                 f"no destination tensor '{t.dst_param}' ({where})"))
                continue
            if not _check_slice(problems, rank, "dst_slice", t.dst_param, dst, t.dst_slice, t):
                continue
            if t.quantize == QUANTIZE_NONE and t.bytes != t.elements * dst.element_size():
                problems.append((rank, "bytes", f"{t.bytes} for {t.elements} elements of "
                                                f"destination '{t.dst_param}' ({dst.dtype}) "
                                                f"in {where}"))
            if t.quantize != QUANTIZE_NONE:
                import torch
                scales = destinations.get(scale_name(t.dst_param))
                want = scale_shape(dst.shape)
                if dst.dtype != torch.uint8:
                    problems.append((rank, "dst_param", f"'{t.dst_param}' is {dst.dtype}; an fp8 "
                                                        f"destination holds the e4m3 bits as "
                                                        f"torch.uint8 ({where})"))
                elif scales is None or tuple(scales.shape) != want or scales.dtype != torch.float32:
                    got = "none" if scales is None else f"{scales.dtype} {list(scales.shape)}"
                    problems.append((rank, "dst_param", f"'{scale_name(t.dst_param)}' must be "
                                                        f"float32 {list(want)}, got {got} "
                                                        f"({where})"))
    return problems or coverage_problems(rank, plan.transfers, destinations)


# ---------------------------------------------------------------------------------
# fp8 (e4m3, "fn": no infinities, largest 448) in 128 x 128 blocks.
#
# Every rank must get the same bytes: the codes are computed on float32 bits, rounded
# to nearest even and saturated at +-448 (:func:`e4m3_bits`, the per-element formula).
# The quantiser gets the same bytes with fewer passes over memory (about a dozen cheap
# vectorised in-place operations per element, on buffers of _CHUNK_ELEMENTS that stay in
# cache): the block maxima on the input's bits (magnitudes of IEEE floats order as their
# bits do), one division by the block's scale, then the rounding. With
# M = 1.5 x 2^(e+20) for a value y of exponent e (2^-6's for |y| < 2^-6), float32
# addition rounds y + M to a multiple of 2^(e-3), to nearest even: y with the 3
# mantissa bits e4m3 keeps (or e4m3's subnormal multiples of 2^-9), and (y + M) - M is
# exact; times 2^-120, its float32 bits are the e4m3 code shifted left by 20 (e4m3's
# subnormals land on float32's: 2^-129 = 2^20 x 2^-149). Scales that are normal floats
# keep |y| <= 448 (1 + 2^-22), which rounds to 448: no saturation needed; blocks of
# other scales (0 after underflow, subnormal, inf, NaN) take the per-element formula.
# tests/python/test_executor.py checks both against a per-block reference.
#
# On CPU the native module's quantiser (rollout/quantize.h, one pass for the block
# maxima and one for the codes) gives the same bytes several times faster;
# :func:`_quantize_natively` decides which runs. It keeps subnormals whatever
# torch.set_flush_denormal says (the torch path then flushes, as its reference does):
# its bytes are those every rank computes in the default mode.

FP8_BLOCK = 128
FP8_MAX = 448.0
_CHUNK_ELEMENTS = 1 << 18
_F32_SIGN = -0x80000000
_F32_EXPONENT = 0x7F800000
_F32_MIN_NORMAL = 0x3C800000  # 2^-6, e4m3's smallest normal value
_ROUNDING_FACTOR = 1.5 * 2.0 ** 20  # 2^e -> M = 1.5 x 2^(e+20): ulp(y + M) = 2^(e-3)
_MAGNITUDE_BITS = {2: 0x7FFF, 4: 0x7FFFFFFF}


def e4m3_bits(y: "torch.Tensor") -> "torch.Tensor":
    """float32 values -> their fp8 e4m3 bits (uint8), rounded to nearest even and
    saturated at +-448, computed on the float32 bits so that every rank gets the same
    bytes. NaN is not expected (block scaling keeps values finite)."""
    import torch
    b = y.contiguous().view(torch.int32)
    sign = (b >> 31) & 1
    a_bits = b & 0x7FFFFFFF
    a = a_bits.view(torch.float32)
    # Normal e4m3 (|y| >= 2^-6): keep 3 of float32's 23 mantissa bits, ties to even;
    # a carry moves into the exponent. Rebias the exponent from 127 to 7: -120 << 3.
    normal = ((a_bits + 0x7FFFF + ((a_bits >> 20) & 1)) >> 20) - (120 << 3)
    normal = torch.clamp(normal, max=0x7E)
    # Subnormal e4m3: multiples of 2^-9 (torch.round rounds ties to even; 8 is 2^-6).
    sub = torch.round(a * 512.0).to(torch.int32)
    code = torch.where(a < 2.0 ** -6, sub, normal)
    return (code | (sign << 7)).to(torch.uint8)


class _Scratch:
    """The quantiser's buffers: float32 y and int32 m, s of `n` elements, with numpy views
    of their bits on CPU (numpy's shifts are vectorised; torch 1.13's CPU shift is not
    and costs as much as five other passes)."""

    def __init__(self, n: int, device):
        import torch
        self.y = torch.empty(n, dtype=torch.float32, device=device)
        self.m = torch.empty(n, dtype=torch.int32, device=device)
        self.s = torch.empty(n, dtype=torch.int32, device=device)
        self.np = None
        if self.y.device.type == "cpu":
            try:
                import numpy
            except ImportError:  # pragma: no cover - torch's CPU builds come with numpy
                pass
            else:
                self.np = (numpy, self.y.view(torch.int32).numpy().view(numpy.uint32),
                           self.s.numpy().view(numpy.uint32))

    def codes(self, n: int, out: "torch.Tensor") -> None:
        """y[:n] (float32, each |y| <= 448 (1 + 2^-22), consumed) -> their e4m3 codes
        (as :func:`e4m3_bits`) into `out` (uint8, n elements in any shape)."""
        import torch
        y, m, s = self.y[:n], self.m[:n], self.s[:n]
        b = y.view(torch.int32)
        if self.np is not None:
            numpy, bn, sn = self.np
            numpy.right_shift(bn[:n], 31, out=sn[:n])  # the sign bit (logical shifts)
        else:
            torch.bitwise_and(b, _F32_SIGN, out=s).__irshift__(31).bitwise_and_(1)
        torch.bitwise_and(b, _F32_EXPONENT, out=m)
        m.clamp_(min=_F32_MIN_NORMAL)  # 2^e, e at least -6
        mf = m.view(torch.float32)
        # y + M with M = 1.5 x 2^20 x 2^e (exact: a power of two times 3), rounded once:
        # y rounded to e4m3's grid, to nearest even; less M again: exact.
        y.add_(mf, alpha=_ROUNDING_FACTOR).sub_(mf, alpha=_ROUNDING_FACTOR)
        y.mul_(2.0 ** -120)  # bits: code << 20 (e4m3's subnormals on float32's)
        if self.np is not None:
            numpy.right_shift(bn[:n], 20, out=bn[:n])  # the code (and the sign at bit 11)
        else:
            b.bitwise_and_(0x7FFFFFFF).__irshift__(20)
        b.add_(s, alpha=0x80)  # the sign at bit 7
        out.copy_(b.view(out.shape))  # the low bytes


def _subnormals_kept() -> bool:
    """Whether float32 arithmetic keeps subnormals here (torch.set_flush_denormal(True)
    flushes them; the rounding above needs them)."""
    import torch
    return bool(torch.tensor([2.0 ** -140]).mul_(0.5).ne(0).item())


def _group_max(t: "torch.Tensor", dim: int) -> "torch.Tensor":
    """The maxima of t over groups of 128 along `dim` (>= 0), the last group partial."""
    import torch
    n = t.shape[dim]
    full = n // FP8_BLOCK * FP8_BLOCK
    parts = []
    if full:
        parts.append(t.narrow(dim, 0, full).unflatten(dim, (full // FP8_BLOCK, FP8_BLOCK))
                     .amax(dim + 1))
    if n > full:
        parts.append(t.narrow(dim, full, n - full).amax(dim, keepdim=True))
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim)


def _block_scales(x: "torch.Tensor", scales: "torch.Tensor") -> None:
    """The scales of x [k, rows, cols]'s blocks into scales [k, row blocks, col blocks]:
    amax / 448 in float32, 1 for an all-zero block; the maxima on the magnitudes' bits,
    a few block rows (or matrices) at a time."""
    import torch
    k, rows, cols = x.shape
    width = torch.int16 if x.element_size() == 2 else torch.int32
    bits = x.view(width)
    piece = 8 * _CHUNK_ELEMENTS  # elements of the magnitudes at a time
    step = max(1, piece // (FP8_BLOCK * cols)) * FP8_BLOCK
    matrices = max(1, piece // (rows * cols)) if step >= rows else 1
    for l0 in range(0, k, matrices):
        for i in range(0, rows, step):
            magnitude = torch.bitwise_and(bits[l0:l0 + matrices, i:i + step],
                                          _MAGNITUDE_BITS[x.element_size()])
            amax = _group_max(_group_max(magnitude, 1), 2).view(x.dtype).to(torch.float32)
            scale = amax / FP8_MAX
            scales[l0:l0 + matrices, i // FP8_BLOCK:(i + step) // FP8_BLOCK].copy_(
                torch.where(amax == 0, torch.ones_like(scale), scale))


def _quantize_chunk(x, codes, scales, scratch: _Scratch) -> None:
    """Quantises x [k, R, cols] (R rows from a block boundary) into codes [k, R, cols]
    (uint8), given its blocks' scales [k, ceil(R / 128), ceil(cols / 128)] (normal
    floats); scratch of at least x.numel() elements."""
    import torch
    k, r, cols = x.shape
    n = x.numel()
    # y = x / its block's scale, in float32 (as x.float() / scale).
    yv = scratch.y[:n].view(k, r, cols)
    rb, bc = scales.shape[1], scales.shape[2]
    if r % FP8_BLOCK == 0 and cols % FP8_BLOCK == 0:  # whole blocks: one division
        blocked = (k, rb, FP8_BLOCK, bc, FP8_BLOCK)
        torch.div(x.view(blocked), scales[:, :, None, :, None], out=yv.view(blocked))
    else:
        per_row = scales[:, :, None, :].expand(k, rb, FP8_BLOCK, bc).reshape(
            k, rb * FP8_BLOCK, bc)[:, :r, :]  # [k, r, col blocks]
        full = cols // FP8_BLOCK * FP8_BLOCK
        if full:
            torch.div(x[..., :full].unflatten(-1, (full // FP8_BLOCK, FP8_BLOCK)),
                      per_row[..., :full // FP8_BLOCK, None],
                      out=yv[..., :full].unflatten(-1, (full // FP8_BLOCK, FP8_BLOCK)))
        if cols > full:
            torch.div(x[..., full:], per_row[..., full // FP8_BLOCK:], out=yv[..., full:])
    scratch.codes(n, codes)


def _quantize_reference(x, codes, scales) -> None:
    """quantize_block128 with the per-element formula (:func:`e4m3_bits`), 128 rows at a
    time."""
    import torch
    shape = tuple(x.shape)
    rows, cols = shape[-2], shape[-1]
    bc = -(-cols // FP8_BLOCK)
    pad_cols = bc * FP8_BLOCK - cols
    for i in range(0, rows, FP8_BLOCK):
        part = x[..., i:i + FP8_BLOCK, :].to(torch.float32)
        r = part.shape[-2]
        if pad_cols:
            part = torch.nn.functional.pad(part, (0, pad_cols))
        blocks = part.reshape(shape[:-2] + (r, bc, FP8_BLOCK))
        amax = blocks.abs().amax(dim=(-3, -1))  # [..., bc]
        scale = amax / FP8_MAX
        scale = torch.where(amax == 0, torch.ones_like(scale), scale)
        q = e4m3_bits(blocks / scale.unsqueeze(-2).unsqueeze(-1))
        codes[..., i:i + r, :].copy_(q.reshape(shape[:-2] + (r, bc * FP8_BLOCK))[..., :cols])
        scales[..., i // FP8_BLOCK, :].copy_(scale)


# rlsched._native.quantize_block128, False when the native module lacks it (a build
# without it, or an older one), None until first looked up.
_native_quantize_fn = None


def _native_quantize():
    """The native module's quantiser, or None."""
    global _native_quantize_fn  # looked up once
    if _native_quantize_fn is None:
        try:
            from rlsched import _native
        except ImportError:
            _native = None
        _native_quantize_fn = getattr(_native, "quantize_block128", None) or False
    return _native_quantize_fn or None


_NATIVE_DTYPES = {"torch.bfloat16": "bfloat16", "torch.float16": None, "torch.float32": None}


def _quantize_natively(x3, c3, s3) -> bool:
    """Quantises x3 [k, rows, cols] into c3 (uint8) and s3 (float32, [k, row blocks, col
    blocks]) with the native module when it has the quantiser, the tensors are on the CPU,
    c3 and s3 contiguous, and x3 bf16, f16 or f32 (numpy views of the same memory; a
    strided x3 copied a strip of block rows at a time; the GIL released while it runs);
    returns whether it did. Otherwise the torch
    path quantises (GPUs, builds without the module)."""
    fn = _native_quantize()
    if fn is None or str(x3.dtype) not in _NATIVE_DTYPES:
        return False
    if any(t.device.type != "cpu" for t in (x3, c3, s3)) or not (
            c3.is_contiguous() and s3.is_contiguous()):
        return False
    import torch
    tag = _NATIVE_DTYPES[str(x3.dtype)]

    def run(x, c, s):
        x = x.detach()
        fn(x.view(torch.int16).numpy() if tag else x.numpy(), c.detach().numpy(),
           s.detach().numpy(), tag)

    if x3.is_contiguous():
        run(x3, c3, s3)
        return True
    # A strided x (a column slice of a sender's tensor, a gather rectangle): copied a
    # strip of whole block rows at a time (within _CHUNK_ELEMENTS x 8 elements, as the
    # torch path's temporaries), each quantised natively into its rows of c3 and s3.
    k, rows, cols = x3.shape
    step = max(1, 8 * _CHUNK_ELEMENTS // (FP8_BLOCK * cols)) * FP8_BLOCK
    buffer = torch.empty(min(rows, step) * cols, dtype=x3.dtype)
    for m in range(k):
        for i in range(0, rows, step):
            i1 = min(i + step, rows)
            strip = buffer[:(i1 - i) * cols].view(1, i1 - i, cols)
            strip.copy_(x3[m:m + 1, i:i1])
            run(strip, c3[m:m + 1, i:i1], s3[m:m + 1, i // FP8_BLOCK:-(-i1 // FP8_BLOCK)])
    return True


def quantize_block128(x: "torch.Tensor", codes: Optional["torch.Tensor"] = None,
                      scales: Optional["torch.Tensor"] = None):
    """Quantises x [..., rows, cols] (any float dtype) to fp8 e4m3 in 128 x 128 blocks
    of its last two dims, counted from its origin: per block scale = amax(|x|) / 448 in
    float32 (1 for an all-zero block), codes = e4m3_bits(x / scale) with x / scale in
    float32. Writes into `codes` (uint8, x's shape) and `scales` (float32,
    scale_shape(x.shape)) when given, else allocates them; returns (codes, scales).
    On CPU the native module quantises when it can (:func:`_quantize_natively`: no
    temporaries beyond strips of a strided x, or copies of codes and scales that have no
    3-d view); the torch path works on a few block rows (or several small
    matrices) at a time: temporaries stay within about 12 MiB. Deterministic: the same
    input gives the same bytes on every rank, whichever path quantised."""
    import torch
    shape = tuple(x.shape)
    rows, cols = shape[-2], shape[-1]
    if codes is None:
        codes = torch.empty(shape, dtype=torch.uint8, device=x.device)
    if scales is None:
        scales = torch.empty(scale_shape(shape), dtype=torch.float32, device=x.device)
    if x.numel() == 0:
        return codes, scales
    x3 = x.reshape((-1, rows, cols))
    if x3.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        x3 = x3.to(torch.float32)
    s3_shape = (x3.shape[0],) + scale_shape(shape)[-2:]
    # Written through 3-d views of codes and scales, or copies where there are none.
    try:
        c3, s3, copy_back = codes.view(x3.shape), scales.view(s3_shape), False
    except RuntimeError:
        c3 = torch.empty(x3.shape, dtype=torch.uint8, device=x.device)
        s3 = torch.empty(s3_shape, dtype=torch.float32, device=x.device)
        copy_back = True
    if not _quantize_natively(x3, c3, s3):
        _quantize_torch(x3, c3, s3)
    if copy_back:
        codes.copy_(c3.view(shape))
        scales.copy_(s3.view(scales.shape))
    return codes, scales


def _quantize_torch(x3, c3, s3) -> None:
    """quantize_block128's torch path on x3 [k, rows, cols] (bf16, f16 or f32) into c3
    (uint8, x3's shape) and s3 (float32, [k, row blocks, col blocks])."""
    _block_scales(x3, s3)
    # Block rows whose scales are all normal floats take the fast rounding, the others
    # (scales 0 after underflow, subnormal, inf, NaN) the per-element formula.
    fast = (((s3 >= 2.0 ** -126) & (s3 < float("inf"))).all(dim=2).tolist()
            if _subnormals_kept() else None)
    rows, cols = x3.shape[1], x3.shape[2]
    per_matrix = rows * cols
    block_rows = max(1, _CHUNK_ELEMENTS // (FP8_BLOCK * cols)) * FP8_BLOCK
    matrices = max(1, _CHUNK_ELEMENTS // per_matrix) if block_rows >= rows else 1
    chunk = min(x3.numel(), matrices * per_matrix if block_rows >= rows else block_rows * cols)
    scratch = _Scratch(chunk, x3.device) if fast is not None else None
    for l0 in range(0, x3.shape[0], matrices):
        l1 = min(l0 + matrices, x3.shape[0])
        for i in range(0, rows, block_rows):
            i1 = min(i + block_rows, rows)
            rb0, rb1 = i // FP8_BLOCK, -(-i1 // FP8_BLOCK)
            if fast is not None and scratch is not None \
                    and all(all(f[rb0:rb1]) for f in fast[l0:l1]):
                _quantize_chunk(x3[l0:l1, i:i1], c3[l0:l1, i:i1], s3[l0:l1, rb0:rb1], scratch)
            else:
                _quantize_reference(x3[l0:l1, i:i1], c3[l0:l1, i:i1], s3[l0:l1, rb0:rb1])


def _gather_region(shape: Tuple[int, ...], slices: Sequence[Slice]):
    """Where an engine gathers the bf16 slices of an fp8 tensor of `shape` that it
    quantises itself: ((first row, first col), buffer shape, rectangles). The buffer
    holds the whole 128 x 128 blocks the slices touch, from the first such block row and
    col to the last (the leading dims whole); the rectangles (:func:`_block_rectangles`,
    in blocks of the tensor) are the blocks to quantise."""
    import torch
    rows, cols = shape[-2], shape[-1]
    r_lo = min(s[-2][0] for s in slices) // FP8_BLOCK * FP8_BLOCK
    c_lo = min(s[-1][0] for s in slices) // FP8_BLOCK * FP8_BLOCK
    r_hi = min(rows, -(-max(s[-2][1] for s in slices) // FP8_BLOCK) * FP8_BLOCK)
    c_hi = min(cols, -(-max(s[-1][1] for s in slices) // FP8_BLOCK) * FP8_BLOCK)
    mask = torch.zeros(scale_shape(shape), dtype=torch.bool)
    for s in slices:
        (r0, r1), (c0, c1) = s[-2], s[-1]
        mask[tuple(slice(b, e) for b, e in s[:-2]) + (
            slice(r0 // FP8_BLOCK, -(-r1 // FP8_BLOCK)),
            slice(c0 // FP8_BLOCK, -(-c1 // FP8_BLOCK)))] = True
    return ((r_lo, c_lo), tuple(shape[:-2]) + (max(0, r_hi - r_lo), max(0, c_hi - c_lo)),
            list(_block_rectangles(mask)))


def _block_rectangles(mask: "torch.Tensor"):
    """The True blocks of a block mask [..., row blocks, col blocks] as rectangles
    (leading index as a tuple of ints or slices, (first, end) row blocks, (first, end)
    col blocks): per leading index (all at once where every one has the same mask),
    runs of blocks in a row, merged over consecutive rows that have the same runs."""
    lead_shape = tuple(mask.shape[:-2])
    flat = mask.reshape((-1,) + tuple(mask.shape[-2:]))
    if bool((flat == flat[:1]).all()):
        leads = [(tuple(slice(None) for _ in lead_shape), flat[0])]
    else:
        leads = list(zip(itertools.product(*(range(d) for d in lead_shape)), flat))
    for lead, m in leads:
        previous: Optional[List[Tuple[int, int]]] = None
        start = 0
        rows = m.tolist() + [[False] * m.shape[1]]
        for r, row in enumerate(rows):
            runs: List[Tuple[int, int]] = []
            c = 0
            while c < len(row):
                if row[c]:
                    e = c
                    while e < len(row) and row[e]:
                        e += 1
                    runs.append((c, e))
                    c = e
                else:
                    c += 1
            if runs != previous:
                for run in previous or []:
                    yield lead, (start, r), run
                previous, start = runs, r


# ---------------------------------------------------------------------------------
# The collectives.

# Transfers of at least this many bytes move in a collective of their own, straight
# from the source tensor and into the destination tensor where the slice is contiguous
# there (no staging copy); smaller ones are packed per (source, destination set). A
# transfer the sender quantises moves its codes alone from this many codes on (the
# sender quantises them into staging; they arrive straight in the destination where its
# slice is contiguous), its block scales packed with the small transfers.
DIRECT_MIN_BYTES = 1 << 20

# What of a transfer a collective carries: all its bytes, or (quantised by the sender)
# its fp8 codes alone or its float32 block scales alone.
PART_WHOLE = 0
PART_CODES = 1
PART_SCALES = 2


@dataclasses.dataclass
class Collective:
    """One collective of a bucket: the transfers of one (source, destination set) packed
    into one buffer (`offsets`, `size` bytes), or large transfers alone (`direct`: one,
    or several whose slices continue each other's, back to back: one slice of the
    tensors).
    `parts[i]` says what of ``transfers[i]`` it carries (PART_*; empty: every transfer
    whole), `sizes[i]` how many bytes."""
    bucket: int
    src: int
    dst_ranks: Tuple[int, ...]
    transfers: List[Transfer]
    offsets: List[int]
    size: int
    direct: bool
    parts: List[int] = dataclasses.field(default_factory=list)
    sizes: List[int] = dataclasses.field(default_factory=list)

    def __post_init__(self):
        if not self.parts:
            self.parts = [PART_WHOLE] * len(self.transfers)
        if not self.sizes:
            self.sizes = [part_bytes(t, p) for t, p in zip(self.transfers, self.parts)]

    # Cached: a run reads them for every collective of every sync.
    @functools.cached_property
    def receivers(self) -> Tuple[int, ...]:
        return tuple(d for d in self.dst_ranks if d != self.src)

    @functools.cached_property
    def members(self) -> Tuple[int, ...]:
        return tuple(sorted({self.src, *self.dst_ranks}))

    @functools.cached_property
    def kind(self) -> str:
        """'local' (the source copies to itself), 'p2p' (send/recv), 'broadcast'."""
        n = len(self.receivers)
        return "local" if n == 0 else "p2p" if n == 1 else "broadcast"

    @property
    def tag(self) -> int:
        """A send/recv's tag, unique in the plan: from its first part (a transfer's codes
        and its scales can travel apart, between the same two ranks)."""
        return 2 * self.transfers[0].index + (self.parts[0] == PART_SCALES)


def part_bytes(t: Transfer, part: int) -> int:
    """The bytes of `part` (PART_*) of transfer `t`."""
    if part == PART_WHOLE:
        return t.bytes
    codes = t.elements
    return codes if part == PART_CODES else t.bytes - codes


def _follows(a: Slice, b: Slice) -> bool:
    """Whether slice `b` continues slice `a` along their first dim (the same ranges in
    the others): together, one slice whose elements are a's then b's."""
    return len(a) == len(b) > 0 and b[0][0] == a[0][1] and b[1:] == a[1:]


def _continues(a: Transfer, b: Transfer, part: int) -> bool:
    """Whether transfer `b` can join `a`'s single collective: its destination slice
    continues a's in the same tensor, and (unless the sender stages them: fp8 codes)
    its source slice continues a's in the same tensor."""
    if a.dst_param != b.dst_param or not _follows(a.dst_slice, b.dst_slice):
        return False
    return part == PART_CODES or (a.src_param == b.src_param
                                  and _follows(a.src_slice, b.src_slice))


def _span(slices: Sequence[Slice]) -> Slice:
    """The slice that consecutive `slices` (each continuing the previous) make."""
    return ((slices[0][0][0], slices[-1][0][1]),) + tuple(slices[0][1:])


def schedule(transfers: Iterable[Transfer],
             direct_min_bytes: Optional[int] = DIRECT_MIN_BYTES) -> List[List[Collective]]:
    """The collectives of `transfers` (one rank's part, or the whole plan), bucket by
    bucket, each bucket's in one global order (source, destinations, the single
    transfers before the packed ones, first transfer): every rank that takes part in a
    collective finds it at the same place, so that blocking or queued collectives never
    wait on each other in a cycle, and a sender has quantised the codes that move alone
    before it packs their scales. `direct_min_bytes` None: every transfer is packed."""
    buckets: Dict[int, Dict[tuple, List[Tuple[Transfer, int]]]] = {}
    # The latest single collective per (bucket, source, destinations, part).
    last_alone: Dict[tuple, tuple] = {}
    threshold = 0 if direct_min_bytes is None else direct_min_bytes
    for t in sorted(transfers, key=lambda t: t.index):
        alone = direct_min_bytes is not None and t.dst_ranks != (t.src_rank,)
        key = (t.src_rank, t.dst_ranks, -1)
        bucket = buckets.setdefault(t.bucket, {})
        part = None
        if alone and t.quantize == QUANTIZE_NONE and t.bytes >= threshold:
            part = PART_WHOLE
        elif alone and t.quantize == QUANTIZE_AT_SENDER and t.elements >= threshold:
            part = PART_CODES
            bucket.setdefault(key, []).append((t, PART_SCALES))
        if part is None:
            bucket.setdefault(key, []).append((t, PART_WHOLE))
            continue
        # A transfer that continues the previous single one's slices (in the next rows,
        # of the same tensors) joins its collective: one buffer on both sides.
        group = (t.bucket, t.src_rank, t.dst_ranks, part)
        previous = last_alone.get(group)
        if previous is not None and _continues(bucket[previous][-1][0], t, part):
            bucket[previous].append((t, part))
        else:
            last_alone[group] = (t.src_rank, t.dst_ranks, t.index)
            bucket[last_alone[group]] = [(t, part)]
    out = []
    for number in sorted(buckets):
        cs = []
        for (src, dst_ranks, single), parts in buckets[number].items():
            # Packed: the whole transfers, then the scales of codes that moved alone;
            # aligned. A single collective's parts follow each other unaligned: they
            # are one slice of the tensors.
            parts.sort(key=lambda tp: (tp[1] == PART_SCALES, tp[0].index))
            offsets, sizes, size = [], [], 0
            for t, p in parts:
                size = size if single >= 0 else _align(size)
                offsets.append(size)
                sizes.append(part_bytes(t, p))
                size += sizes[-1]
            cs.append(Collective(bucket=number, src=src, dst_ranks=dst_ranks,
                                 transfers=[t for t, _ in parts], offsets=offsets, size=size,
                                 direct=single >= 0, parts=[p for _, p in parts], sizes=sizes))
        cs.sort(key=lambda c: (c.src, c.dst_ranks, not c.direct, c.transfers[0].index))
        out.append(cs)
    return out


# ---------------------------------------------------------------------------------
# Execution.

@dataclasses.dataclass
class ExecuteStats:
    rank: int
    buckets: int = 0  # buckets this rank took part in
    collectives: int = 0  # broadcasts and send/recv pairs this rank took part in
    direct: int = 0  # of those, single large transfers (no packing)
    bytes_sent: int = 0  # over links, once per collective it sourced
    bytes_received: int = 0  # over links
    bytes_local: int = 0  # copied on the rank itself
    bytes_staged: int = 0  # copied through staging buffers (packing and unpacking)
    quantized_at_sender: int = 0  # fp8 transfers received as codes + scales
    quantized_at_destination: int = 0  # fp8 transfers received in bf16, quantised here
    peak_staging_bytes: int = 0  # the largest bucket's buffers on this rank
    staging_allocated_bytes: int = 0  # the staging buffer allocated by this run (0: kept)
    groups: int = 0  # process groups made (world-wide count)
    check_seconds: float = 0.0  # checks and group creation
    transfer_seconds: float = 0.0  # the buckets

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _view(tensor, s: Slice):
    return tensor[tuple(slice(b, e) for b, e in s)]


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _float32_of(packed, copy: bool = True):
    """The float32 values in `packed` (a flat uint8 tensor of 4 x n bytes): a view of
    them where they are 4-aligned, else a copy (`copy` False: None)."""
    import torch
    if packed.storage_offset() % 4 == 0:
        return packed.view(torch.float32)
    if not copy:
        return None
    out = torch.empty(packed.numel() // 4, dtype=torch.float32, device=packed.device)
    out.view(torch.uint8).copy_(packed)
    return out


def _bytes_of(view):
    """A contiguous tensor's bytes as a flat uint8 tensor (no copy)."""
    import torch
    return view.reshape(-1).view(torch.uint8)


def _part_counts(plan: RankPlan) -> Optional[Tuple[int, int, int, int, Tuple[int, ...]]]:
    """What this rank's part says of the whole plan, for a part of a plan run whole
    (``plan.totals``; else None): the transfers it sends, their deliveries (one per
    receiver) and bytes delivered, the transfers it receives; and the plan's totals."""
    if plan.totals is None:
        return None
    sent = [t for t in plan.transfers if t.src_rank == plan.rank]
    return (len(sent), sum(len(t.dst_ranks) for t in sent),
            sum(t.bytes * len(t.dst_ranks) for t in sent),
            sum(plan.rank in t.dst_ranks for t in plan.transfers), tuple(plan.totals))


def _totals_problems(counts: Sequence[tuple]) -> List[Tuple[int, str, str]]:
    """The ranks' parts (:func:`_part_counts` of every rank) against each other and the
    plan's recorded totals: every transfer is in its sender's part, and in the part of
    each of its receivers."""
    sent, deliveries, delivered, received = (sum(c[k] for c in counts) for k in range(4))
    num_transfers, bytes_received = counts[0][4]
    problems = []
    if sent != num_transfers:
        problems.append((-1, "num_transfers", f"the ranks' parts send {sent} transfers, the "
                                              f"plan records {num_transfers}"))
    if delivered != bytes_received:
        problems.append((-1, "bytes_received", f"the ranks' parts deliver {delivered} bytes, "
                                               f"the plan records {bytes_received}"))
    if deliveries != received:
        problems.append((-1, "dst_ranks", f"the senders' parts deliver {deliveries} times, the "
                                          f"receivers' parts receive {received} transfers"))
    return problems


def exchange_findings(problems: Sequence[Tuple[int, str, str]],
                      groups: Sequence[Tuple[int, ...]] = (),
                      counts: Optional[tuple] = None) -> List[tuple]:
    """The collective every rank's :class:`Executor` starts with (one
    ``all_gather_object`` on the default group): each rank's `problems` with the plan,
    the member sets of its broadcasts (`groups`) and its part's counts
    (:func:`_part_counts`); raises :class:`PlanMismatchError` on every rank, with every
    rank's problems, when any rank has one or the parts disagree. Returns what every
    rank sent."""
    import torch.distributed as dist
    slots: List[Optional[tuple]] = [None] * dist.get_world_size()
    dist.all_gather_object(slots, (list(problems[:MAX_PROBLEMS]), len(problems),
                                   list(groups), counts))
    gathered = cast(List[tuple], slots)  # every slot filled by the gather
    found = [p for g in gathered for p in g[0]]
    total = sum(g[1] for g in gathered)
    if not total and all(g[3] is not None for g in gathered):
        found = _totals_problems([g[3] for g in gathered])
        total = len(found)
    if total:
        raise PlanMismatchError(found[:MAX_PROBLEMS], total)
    return gathered


def refuse_plan(rank: int, field: str, text: str) -> None:
    """For a rank that cannot make its :class:`Executor` (its part of the plan does not
    read, e.g. a cut ``.binpb``): takes part in the exchange the other ranks' Executors
    start with, so that every rank raises the same :class:`PlanMismatchError` naming
    this rank's cause instead of waiting for it (or failing on its closed
    connection). Always raises."""
    exchange_findings([(rank, field, text)])
    raise AssertionError("unreachable: the exchange raises")  # pragma: no cover


class Executor:
    """One rank's side of a plan, set up once and run at every weight sync.

    Construction is collective (every rank of the world constructs its Executor with the
    same plan file, in the same order as its other collectives): it checks the plan
    against this world and these tensors, exchanges the findings (raising
    :class:`PlanMismatchError` on every rank when any rank found a problem, before any
    byte moves), and makes the process groups of the plan's broadcasts (one per
    distinct member set, in the same order everywhere). :meth:`run` then moves the bytes
    from `sources` (read at run time: the trainer updates them in place) into
    `destinations` / `on_slice`; it allocates one staging buffer of
    :attr:`staging_bytes` (the largest bucket's packed slices on this rank) for the
    run and frees it after, or with `keep_staging` once, kept for the next runs (no
    allocation and first touch at every sync, for that much memory held between them).

    `keep_staging` is off by default. What it saves is the first touch of a freshly
    mapped buffer at every sync, which costs only where the allocator maps fresh pages
    (CPU tensors): measured with benchmarks/executor_bench.py (gloo, 8 ranks on 2
    cores), about 10% of an fp8 sync (median 0.23-0.24 s against 0.26 s: the senders
    quantise into staging, and a fresh buffer slows the quantiser from 3.4 to 2.1 GB/s
    on an idle core), nothing measurable for bf16 (which stages little). On GPUs
    torch's caching allocator already hands a freed buffer back without that cost, and
    a kept one is memory a colocated engine cannot get back for its KV cache between
    syncs (up to one bucket per rank, each way when it both sends and receives). Turn it
    on for syncs of CPU tensors where that memory may stay held between them.

    Arguments as :func:`execute`.
    """

    def __init__(self, plan: RankPlan, sources: Optional[Mapping[str, "torch.Tensor"]] = None,
                 destinations: Optional[Mapping[str, "torch.Tensor"]] = None,
                 on_slice: Optional[Callable[[str, "torch.Tensor", Slice], None]] = None,
                 dtype=None, device=None,
                 direct_min_bytes: Optional[int] = DIRECT_MIN_BYTES,
                 timeout: Optional["datetime.timedelta"] = None,
                 layout: Optional[dict] = None, keep_staging: bool = False):
        import torch
        import torch.distributed as dist

        start = time.perf_counter()
        self.keep_staging = keep_staging
        self._kept_arena: Optional["torch.Tensor"] = None
        self.plan, self.destinations, self.on_slice = plan, destinations, on_slice
        self.sources = sources or {}
        # The destination tensors, {} without them: what writes fp8 or gathers needs them.
        self._targets: Mapping[str, "torch.Tensor"] = destinations or {}
        self.dtype = dtype or torch.bfloat16
        if device is None:
            any_tensor = next(iter(self.sources.values()), None)
            if any_tensor is None and destinations:
                any_tensor = next(iter(destinations.values()), None)
            device = any_tensor.device if any_tensor is not None else torch.device("cpu")
        self.device = device
        self.rank, world = dist.get_rank(), dist.get_world_size()

        # Checks, and the member sets of the broadcasts this rank takes part in; every
        # rank learns every rank's findings (one collective, no tensor bytes yet).
        if self.rank != plan.rank:
            problems = [(self.rank, "rank", f"the plan part was read for rank {plan.rank}, "
                                            f"this process is rank {self.rank}")]
        else:
            problems = check_plan(plan, world, self.sources, destinations, layout)
        self.buckets = ([[c for c in cs if self.rank == c.src or self.rank in c.dst_ranks]
                         for cs in schedule(plan.transfers, direct_min_bytes)]
                        if not problems else [])
        my_groups = sorted({c.members for cs in self.buckets for c in cs
                            if c.kind == "broadcast"})
        gathered = exchange_findings(problems, my_groups,
                                     None if problems else _part_counts(plan))

        member_sets = sorted({tuple(m) for g in gathered for m in g[2]})
        self.groups = {}
        self.timeout = timeout
        for members in member_sets:
            pg = (dist.new_group(ranks=list(members)) if timeout is None
                  else dist.new_group(ranks=list(members), timeout=timeout))
            if self.rank in members:
                self.groups[members] = pg
        self.num_groups = len(member_sets)
        # fp8 quantised at the destination: per tensor, the bf16 elements to gather, and
        # where they go (the plan fixes both: :func:`_gather_region`).
        self._gather_need: Dict[str, int] = {}
        gather_slices: Dict[str, List[Slice]] = {}
        for t in plan.transfers:
            if t.quantize == QUANTIZE_AT_DESTINATION and self.rank in t.dst_ranks:
                self._gather_need[t.dst_param] = self._gather_need.get(t.dst_param, 0) + t.elements
                gather_slices.setdefault(t.dst_param, []).append(t.dst_slice)
        self._gather_regions = {name: _gather_region(tuple(self._targets[name].shape), slices)
                                for name, slices in gather_slices.items()}
        # Staging: per bucket, the aligned buffers of the collectives this rank cannot
        # move straight from or into its tensors, at offsets fixed here (None: unstaged);
        # and where the scales of codes that move alone are packed (a sender quantises
        # into both at once).
        self._offsets: List[List[Optional[int]]] = []
        self._scales_at: Dict[int, int] = {}
        self.staging_bytes = 0
        for cs in self.buckets:
            used = 0
            offsets: List[Optional[int]] = []
            for c in cs:
                if c.kind == "local" or self._direct_view(c) is not None:
                    offsets.append(None)
                    continue
                offsets.append(used)
                for t, part, offset in zip(c.transfers, c.parts, c.offsets):
                    if part == PART_SCALES:
                        self._scales_at[t.index] = used + offset
                used = _align(used + c.size)
            self._offsets.append(offsets)
            self.staging_bytes = max(self.staging_bytes, used)
        self.setup_seconds = time.perf_counter() - start

    def _direct_view(self, c: Collective):
        """The contiguous tensor slice a direct collective moves on this rank, or None:
        the source's (the sender quantises codes into staging), else the destination's."""
        if not c.direct:
            return None
        t = c.transfers[0]
        if self.rank == c.src:
            if c.parts[0] != PART_WHOLE:
                return None
            view = _view(self.sources[t.src_param], _span([u.src_slice for u in c.transfers]))
        elif self.destinations is not None:
            view = _view(self.destinations[t.dst_param],
                         _span([u.dst_slice for u in c.transfers]))
        else:
            return None
        return view if view.is_contiguous() else None

    def _element_type(self, t: Transfer):
        """The element type of a transfer's bytes on the wire (unquantised)."""
        import torch
        if self.destinations is not None and t.quantize == QUANTIZE_NONE:
            return self.destinations[t.dst_param].dtype
        return torch.float32 if t.bytes == 4 * t.elements else self.dtype

    # fp8 ---------------------------------------------------------------------------

    def _scale_view(self, t: Transfer):
        (r0, r1), (c0, c1) = t.dst_slice[-2], t.dst_slice[-1]
        index = tuple(slice(b, e) for b, e in t.dst_slice[:-2]) + (
            slice(r0 // FP8_BLOCK, -(-r1 // FP8_BLOCK)),
            slice(c0 // FP8_BLOCK, -(-c1 // FP8_BLOCK)))
        return self._targets[scale_name(t.dst_param)][index], index

    def _write_fp8(self, t: Transfer, codes, scales):
        """Writes a sender-quantised slice: codes [rows, cols] (None: they are in place
        already), scales [blocks]; then hands both to on_slice."""
        view = _view(self._targets[t.dst_param], t.dst_slice)
        if codes is not None:
            view.copy_(codes.reshape(view.shape))
        sview, index = self._scale_view(t)
        sview.copy_(scales.reshape(sview.shape))
        if self.on_slice is not None:
            self.on_slice(t.dst_param, view, t.dst_slice)
            self.on_slice(scale_name(t.dst_param), sview,
                          tuple((i.start, i.stop) for i in index))

    def _pack_fp8(self, t: Transfer, src_view, codes, scales):
        """Quantises a source slice into its wire form: its codes into `codes`, its
        float32 block scales into `scales` (both uint8 bytes of staging: after the codes,
        or where the scales of codes moving alone are packed)."""
        import torch
        rows, cols, _ = _fp8_geometry(t)
        in_place = _float32_of(scales, copy=False)
        _, written = quantize_block128(
            src_view.reshape(rows, cols), codes=codes.view(rows, cols),
            scales=None if in_place is None else in_place.view(scale_shape((rows, cols))))
        if in_place is None:  # not 4-aligned: copied in after
            scales.copy_(written.view(-1).view(torch.uint8))

    def _unpack_scales(self, t: Transfer, payload, codes):
        """A sender-quantised slice's float32 scales from `payload` (bytes), its codes
        from `codes` (None: already in the destination)."""
        self._write_fp8(t, codes, _float32_of(payload[:4 * _fp8_geometry(t)[2]]))

    def _gather(self, t: Transfer, data, gathering: Dict[str, "torch.Tensor"],
                remaining: Dict[str, int]):
        """An unquantised slice of a tensor the engine quantises: kept in a bf16 copy of
        the tensor's blocks that such slices touch until its last slice arrives, then
        those blocks are quantised."""
        import torch
        name = t.dst_param
        dst = self._targets[name]
        (r_lo, c_lo), shape, rectangles = self._gather_regions[name]
        acc = gathering.get(name)
        if acc is None:
            acc = gathering[name] = torch.zeros(shape, dtype=data.dtype, device=dst.device)
        s = t.dst_slice
        view = acc[tuple(slice(b, e) for b, e in s[:-2]) + (
            slice(s[-2][0] - r_lo, s[-2][1] - r_lo), slice(s[-1][0] - c_lo, s[-1][1] - c_lo))]
        view.copy_(data.reshape(view.shape))
        remaining[name] -= t.elements
        if remaining[name]:
            return
        del gathering[name]
        scales_dst = self._targets[scale_name(name)]
        # Only the blocks these slices cover (the others came quantised by their
        # senders), in rectangles of whole blocks quantised straight into the
        # destination: the same blocks, so the same bytes.
        for lead, (r0, r1), (c0, c1) in rectangles:
            rows, cols = (r0 * FP8_BLOCK, r1 * FP8_BLOCK), (c0 * FP8_BLOCK, c1 * FP8_BLOCK)
            quantize_block128(
                acc[lead + (slice(rows[0] - r_lo, rows[1] - r_lo),
                            slice(cols[0] - c_lo, cols[1] - c_lo))],
                codes=dst[lead + (slice(*rows), slice(*cols))],
                scales=scales_dst[lead + (slice(r0, r1), slice(c0, c1))])
        del acc
        if self.on_slice is not None:
            self.on_slice(name, dst, tuple((0, d) for d in dst.shape))
            self.on_slice(scale_name(name), scales_dst, tuple((0, d) for d in scales_dst.shape))

    def _count(self, stats, t: Transfer, part: int = PART_WHOLE):
        if part == PART_CODES:  # counted with its scales
            return
        if t.quantize == QUANTIZE_AT_SENDER:
            stats.quantized_at_sender += 1
        elif t.quantize == QUANTIZE_AT_DESTINATION:
            stats.quantized_at_destination += 1

    def _from_source(self, t: Transfer, gathering, remaining):
        """A transfer whose source is this rank and which this rank also receives."""
        src_view = _view(self.sources[t.src_param], t.src_slice)
        if t.quantize == QUANTIZE_AT_SENDER:
            rows, cols, _ = _fp8_geometry(t)
            codes, scales = quantize_block128(src_view.reshape(rows, cols))
            self._write_fp8(t, codes, scales)
        elif t.quantize == QUANTIZE_AT_DESTINATION:
            self._gather(t, src_view, gathering, remaining)
        else:
            self._deliver(t, src_view)

    def _received(self, t: Transfer, part: int, payload, gathering, remaining):
        """A part (PART_*) of a transfer, its bytes in staging (`payload`: uint8)."""
        if part == PART_CODES:  # on_slice sees them with their scales
            view = _view(self._targets[t.dst_param], t.dst_slice)
            view.copy_(payload.view(view.shape))
        elif part == PART_SCALES:
            self._unpack_scales(t, payload, None)
        elif t.quantize == QUANTIZE_AT_SENDER:
            n = t.elements
            self._unpack_scales(t, payload[n:], payload[:n])
        elif t.quantize == QUANTIZE_AT_DESTINATION:
            self._gather(t, payload.view(self._element_type(t)), gathering, remaining)
        else:
            self._deliver(t, payload.view(self._element_type(t)))

    def _deliver(self, t: Transfer, data):
        """Hands a received (or locally held) slice to the destination; `data` None:
        it was received in place."""
        if self.destinations is not None:
            view = _view(self.destinations[t.dst_param], t.dst_slice)
            if data is not None:
                view.copy_(data.reshape(view.shape))
            if self.on_slice is not None:
                self.on_slice(t.dst_param, view, t.dst_slice)
        elif self.on_slice is not None:
            self.on_slice(t.dst_param, data.reshape(_slice_shape(t.dst_slice)), t.dst_slice)

    def _pack(self, c: Collective, buffer, arena):
        """Packs what this rank sends in `c` into `buffer` (its staging)."""
        sources = self.sources
        for t, part, offset, size in zip(c.transfers, c.parts, c.offsets, c.sizes):
            if part == PART_SCALES:  # written when its codes were quantised
                continue
            src = sources[t.src_param]
            payload = buffer[offset:offset + size]
            if part == PART_CODES:
                at = self._scales_at[t.index]
                self._pack_fp8(t, _view(src, t.src_slice), payload,
                               arena[at:at + part_bytes(t, PART_SCALES)])
            elif t.quantize == QUANTIZE_AT_SENDER:
                n = t.elements
                self._pack_fp8(t, _view(src, t.src_slice), payload[:n], payload[n:])
            else:
                payload.view(src.dtype).view(_slice_shape(t.src_slice)).copy_(
                    _view(src, t.src_slice))

    def run(self) -> ExecuteStats:
        """Moves the bytes, bucket by bucket; returns this rank's statistics. Every rank
        runs its Executor the same number of times, in the same order."""
        import torch
        import torch.distributed as dist

        rank = self.rank
        stats = ExecuteStats(rank=rank, groups=self.num_groups, check_seconds=self.setup_seconds)
        start = time.perf_counter()
        arena = self._kept_arena
        if arena is None:
            arena = torch.empty(self.staging_bytes, dtype=torch.uint8, device=self.device)
            stats.staging_allocated_bytes = self.staging_bytes
            if self.keep_staging:
                self._kept_arena = arena
        gathering: Dict[str, "torch.Tensor"] = {}
        remaining = dict(self._gather_need)
        for cs, offsets in zip(self.buckets, self._offsets):
            stats.buckets += 1
            pending, used = [], 0
            # Collectives start as soon as they are packed, so that packing the next one
            # overlaps the transfer of the previous ones; unpacking likewise overlaps the
            # transfers still running.
            for c, offset in zip(cs, offsets):
                if c.kind == "local":
                    for t in c.transfers:
                        self._from_source(t, gathering, remaining)
                        self._count(stats, t)
                        stats.bytes_local += t.bytes
                    continue
                staged = offset is not None
                if offset is not None:
                    buffer = arena[offset:offset + c.size]
                    used = _align(offset + c.size)
                else:
                    view = self._direct_view(c)
                    if view is None:
                        raise ExecutorError(f"transfer {c.transfers[0].index}: its tensor "
                                            "slice is no longer contiguous (the tensors "
                                            "changed since the Executor was made)",
                                            c.transfers[0].src_param if self.rank == c.src
                                            else c.transfers[0].dst_param)
                    buffer = _bytes_of(view)
                sends = rank == c.src
                if sends:
                    if staged:
                        self._pack(c, buffer, arena)
                        stats.bytes_staged += c.size
                    stats.bytes_sent += sum(c.sizes)
                if c.kind == "p2p":  # tagged by its first part: unique in the plan
                    work = (dist.isend(buffer, dst=c.receivers[0], tag=c.tag) if sends
                            else dist.irecv(buffer, src=c.src, tag=c.tag))
                else:
                    work = dist.broadcast(buffer, src=c.src, group=self.groups[c.members],
                                          async_op=True)
                stats.collectives += 1
                stats.direct += c.direct
                if sends and rank in c.dst_ranks:  # a colocated sender that also receives
                    for t, part, o, n in zip(c.transfers, c.parts, c.offsets, c.sizes):
                        if staged:  # what it sends, as a receiver takes it
                            self._received(t, part, buffer[o:o + n], gathering, remaining)
                        else:
                            self._from_source(t, gathering, remaining)
                        self._count(stats, t, part)
                        stats.bytes_local += n
                pending.append((c, work, buffer, staged))
            stats.peak_staging_bytes = max(stats.peak_staging_bytes, used)
            for c, work, buffer, staged in pending:
                if self.timeout is not None and c.kind == "p2p":
                    work.wait(self.timeout)
                else:
                    work.wait()  # a broadcast's group carries the timeout
                if rank == c.src:
                    continue
                for t, part, o, n in zip(c.transfers, c.parts, c.offsets, c.sizes):
                    if staged:
                        self._received(t, part, buffer[o:o + n], gathering, remaining)
                        stats.bytes_staged += n
                    elif part == PART_WHOLE:
                        self._deliver(t, None)
                    # (codes received in place are handed over with their scales)
                    self._count(stats, t, part)
                    stats.bytes_received += n
        del arena
        incomplete = sorted(name for name, left in remaining.items() if left)
        if incomplete:  # the plan's slices of a tensor add up to fewer elements
            raise ExecutorError(f"fp8: tensors not complete after the last bucket: "
                                f"{incomplete}", "fp8")
        stats.transfer_seconds = time.perf_counter() - start
        return stats


def execute(plan: RankPlan, sources: Optional[Mapping[str, "torch.Tensor"]] = None,
            destinations: Optional[Mapping[str, "torch.Tensor"]] = None,
            on_slice: Optional[Callable[[str, "torch.Tensor", Slice], None]] = None,
            dtype=None, device=None,
            direct_min_bytes: Optional[int] = DIRECT_MIN_BYTES,
            timeout: Optional["datetime.timedelta"] = None,
            layout: Optional[dict] = None) -> ExecuteStats:
    """Runs `plan` (this rank's part) once on the initialised default process group:
    ``Executor(...).run()``. For a sync at every step, keep the :class:`Executor` (its
    checks and process groups are made once).

    `sources`: this rank's Megatron-named local tensors (trainer ranks). `destinations`:
    vLLM-named preallocated tensors (engine ranks); `on_slice(name, tensor, dst_slice)`
    is called for every received slice, after the copy into `destinations` when both are
    given; the plan must write every element of every destination tensor exactly once
    (:func:`coverage_problems`). `dtype`: the element type of 2-byte slices handed to
    `on_slice` without a destination tensor (default bfloat16; 4-byte slices are
    float32). `device`: where
    staging buffers live (default: the sources' or destinations' device, else CPU; the
    NCCL backend needs CUDA tensors). `direct_min_bytes`: transfers at least this large
    move alone and without staging where their slice is contiguous (None: pack all);
    every rank must pass the same value. `timeout`: how long one collective of a sync may
    wait (the broadcasts' process groups are made with it, a send/recv waits that long);
    None: the default process group's timeout. `layout`: the layouts this world runs
    (:func:`world_layout`); the plan is refused when it was made for others (None: not
    checked; pass it, as a plan for another layout of the same world size can fit every
    tensor shape).

    Every rank of the world must call it with the same plan file. Raises
    :class:`PlanMismatchError` on every rank, before any byte moves, when the plan does
    not fit; a collective that fails or times out (a rank gone) raises torch's
    RuntimeError. Returns this rank's :class:`ExecuteStats`.
    """
    return Executor(plan, sources, destinations, on_slice, dtype=dtype, device=device,
                    direct_min_bytes=direct_min_bytes, timeout=timeout, layout=layout).run()
