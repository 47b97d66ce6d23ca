"""The plan of a full-tensor weight sync: which trainer rank sends which bytes, in
which bucket, and what that costs. Pure: no torch, no I/O.

A sync moves a model's **full** tensors (every trainer rank holds every tensor, as a
Hugging Face-named generator gives them) to every engine rank. The unit of transfer is
a chunk: a wire tensor cut at ``bucket_bytes`` (a tensor larger than a bucket spans
several buckets). Each chunk has one sender; a sender packs its chunks, in generator
order, into buckets of at most ``bucket_bytes`` (offsets aligned to 8 bytes, so every
element type can be viewed in place) and broadcasts each bucket to the engine ranks.

Who sends what: with the tensors known (:func:`plan_senders`), the chunks' bytes are
split across the senders by rlsched's balancer (Karmarkar-Karp on bytes, the native
module's ``partition_weights``), so that the busiest sender carries as little as the
chunks allow. Without them (the first sync, before any tensor was seen) every chunk
goes to the sender with the fewest bytes so far (:class:`OnlineSenders`), which every
trainer rank computes alike from the same stream.

The cost model (:func:`estimate`) is the resharding planner's per-GPU links
(``rlsched/rollout/plan.h``: ``intra_node_gb_per_s`` per GPU over NVLink,
``inter_node_gb_per_s`` per GPU NIC, GB = 1e9 bytes): a sender's bytes leave over its
NIC unless every engine rank shares its node (then over NVLink); an engine node takes
each byte in once over its NICs, the bytes of different senders over different NICs
(at most ``gpus_per_node`` at once), and every engine GPU takes every byte over NVLink
from its node's peers. The sync takes as long as its busiest link. The lower bound: every
engine GPU takes every byte over NVLink at best, and the senders' links together carry
every byte once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from typing import Iterable, Optional, Sequence

from rlsched.errors import InvalidArgumentError, MissingDependencyError

__all__ = ["TensorSpec", "Chunk", "Bucket", "Membership", "SyncOptions", "Estimate",
           "ITEM_SIZES", "FP8_BLOCK", "ALIGN", "MAX_BUCKET_BYTES", "wire_specs", "chunks_of",
           "plan_senders", "OnlineSenders", "BucketPacker", "pack_buckets", "estimate",
           "manifest_digest", "scale_name", "sender_ranks", "quantized"]

#: Element sizes of the dtypes a sync carries (torch's names without ``torch.``).
ITEM_SIZES = {"bfloat16": 2, "float16": 2, "float32": 4, "float64": 8, "uint8": 1,
              "int8": 1, "int16": 2, "int32": 4, "int64": 8, "bool": 1}
#: fp8 blocks are FP8_BLOCK x FP8_BLOCK elements of a tensor's last two dims.
FP8_BLOCK = 128
#: Chunk offsets inside a bucket are multiples of this many bytes.
ALIGN = 8
#: The largest bucket (64 GiB): two staging buffers of it are allocated per sender.
MAX_BUCKET_BYTES = 1 << 36
_FLOATS = ("bfloat16", "float16", "float32")
# The linear weights an fp8 engine holds in fp8: q/k/v/o, gate/up/down and the fused
# qkv and gate_up projections, dense or per expert; not embeddings, norms, routers or
# the output head.
_LINEAR = re.compile(r"(^|\.)(q|k|v|o|qkv|gate|up|down|gate_up)_proj\.weight$")


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """A tensor as the trainer's generator yields it (``dtype``: torch's name without
    ``torch.``, e.g. ``"bfloat16"``)."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count * ITEM_SIZES[self.dtype]


def scale_name(name: str) -> str:
    """The block scales of an fp8 tensor: ``<name>_scale_inv`` (vLLM's name)."""
    return name + "_scale_inv"


def quantized(spec: TensorSpec, fp8: bool) -> bool:
    """Whether the sender quantises `spec` to fp8 block-128: with `fp8`, a float linear
    weight of 2 or 3 dims (see the module's pattern)."""
    return (fp8 and spec.dtype in _FLOATS and len(spec.shape) in (2, 3)
            and _LINEAR.search(spec.name) is not None)


def wire_specs(spec: TensorSpec, fp8: bool) -> list[TensorSpec]:
    """What goes on the wire for `spec`: itself, or with fp8 its codes (``uint8``, the
    same name and shape) and its float32 scales (:func:`scale_name`, the leading dims
    then ceil(rows / 128), ceil(cols / 128))."""
    if not quantized(spec, fp8):
        return [spec]
    *lead, rows, cols = spec.shape
    blocks = (-(-rows // FP8_BLOCK), -(-cols // FP8_BLOCK))
    return [TensorSpec(spec.name, spec.shape, "uint8"),
            TensorSpec(scale_name(spec.name), tuple(lead) + blocks, "float32")]


@dataclasses.dataclass(frozen=True)
class Chunk:
    """Bytes [offset, offset + size) of wire tensor `wire` (an index into the sync's
    wire tensors), which comes from generator tensor `source`."""

    wire: int
    source: int
    offset: int
    size: int


def _chunk_bytes(bucket_bytes: int) -> int:
    return bucket_bytes - bucket_bytes % ALIGN


def chunks_of(wire: int, source: int, spec: TensorSpec, bucket_bytes: int) -> list[Chunk]:
    """`spec`'s bytes cut into chunks that each fill at most one bucket (one empty chunk
    for an empty tensor, so that it is still delivered)."""
    step = _chunk_bytes(bucket_bytes)
    total = spec.nbytes
    if total == 0:
        return [Chunk(wire, source, 0, 0)]
    return [Chunk(wire, source, offset, min(step, total - offset))
            for offset in range(0, total, step)]


@dataclasses.dataclass(frozen=True)
class Membership:
    """Who takes part: the node id of every trainer rank and of every engine rank, in
    rank order (verl: actor worker-group ranks, then rollout workers)."""

    trainer_nodes: tuple[str, ...]
    engine_nodes: tuple[str, ...]

    def digest(self) -> str:
        text = json.dumps([list(self.trainer_nodes), list(self.engine_nodes)])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def colocated(self) -> bool:
        """An engine rank shares a node with a trainer rank."""
        return bool(set(self.trainer_nodes) & set(self.engine_nodes))


@dataclasses.dataclass(frozen=True)
class SyncOptions:
    """``bucket_bytes``: the most bytes a bucket holds (verl's
    ``update_weights_bucket_megabytes`` << 20). ``fp8``: the sender quantises linear
    weights to fp8 block-128. ``senders``: how many trainer ranks send (the first ones
    of each node in turn; None: all). The bandwidths and ``gpus_per_node`` are the
    cost model's (the resharding planner's defaults)."""

    bucket_bytes: int
    fp8: bool = False
    senders: Optional[int] = None
    intra_node_gb_per_s: float = 400.0
    inter_node_gb_per_s: float = 50.0
    gpus_per_node: int = 8

    def check(self) -> None:
        if not _is_int(self.bucket_bytes) or not 4096 <= self.bucket_bytes <= MAX_BUCKET_BYTES:
            raise InvalidArgumentError(f"bucket_bytes: {self.bucket_bytes!r}, expected an int "
                                       f"in [4096, {MAX_BUCKET_BYTES}]", "bucket_bytes")
        if not isinstance(self.fp8, bool):
            raise InvalidArgumentError(f"fp8: {self.fp8!r}, expected true or false", "fp8")
        if self.senders is not None and (not _is_int(self.senders) or self.senders < 1):
            raise InvalidArgumentError(
                f"senders: {self.senders!r}, expected an int >= 1 or None", "senders")
        for field in ("intra_node_gb_per_s", "inter_node_gb_per_s"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not 0 < value < float("inf"):
                raise InvalidArgumentError(f"{field}: {value!r}, expected > 0", field)
        if not _is_int(self.gpus_per_node) or self.gpus_per_node < 1:
            raise InvalidArgumentError(
                f"gpus_per_node: {self.gpus_per_node!r}, expected an int >= 1", "gpus_per_node")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def sender_ranks(membership: Membership, senders: Optional[int]) -> list[int]:
    """The trainer ranks that send: all, or the first `senders` taken one node at a
    time (the first rank of each node, then the second, ...), so that the senders'
    NICs spread over the trainer nodes. Ascending."""
    count = len(membership.trainer_nodes)
    if senders is None or senders >= count:
        return list(range(count))
    by_node: dict[str, list[int]] = {}
    for rank, node in enumerate(membership.trainer_nodes):
        by_node.setdefault(node, []).append(rank)
    chosen: list[int] = []
    depth = 0
    while len(chosen) < senders:
        for ranks in by_node.values():
            if depth < len(ranks) and len(chosen) < senders:
                chosen.append(ranks[depth])
        depth += 1
    return sorted(chosen)


def plan_senders(chunks: Sequence[Chunk], senders: Sequence[int]) -> list[int]:
    """The sender of every chunk: the chunks' bytes split across `senders` by
    Karmarkar-Karp (rlsched's balancer, in the native module), so that the busiest
    sender carries as few bytes as it finds. Deterministic."""
    if len(senders) == 1 or not chunks:
        return [senders[0]] * len(chunks)
    from rlsched import client  # here: the rest of the plan needs neither it nor protobuf
    if client._native is None:
        raise MissingDependencyError("rlsched.weight_sync plans with the native module "
                                     "rlsched._native: install the package with pip (see "
                                     "README.md)")
    parts = client._native.partition_weights([c.size for c in chunks], len(senders), False)
    owner = [0] * len(chunks)
    for part, indices in enumerate(parts):
        for index in indices:
            owner[index] = senders[part]
    return owner


class OnlineSenders:
    """The sender of each chunk as the chunks arrive, before the tensors are known: the
    sender with the fewest bytes so far (the lowest rank on a tie). Every trainer rank
    that sees the same chunks in the same order makes the same choices."""

    def __init__(self, senders: Sequence[int]) -> None:
        self._load = {rank: 0 for rank in senders}

    def __call__(self, chunk: Chunk) -> int:
        rank = min(self._load, key=lambda r: (self._load[r], r))
        self._load[rank] += chunk.size
        return rank


@dataclasses.dataclass
class Bucket:
    """One broadcast: `sender`'s chunks at their byte offsets, `nbytes` in all."""

    sender: int
    chunks: list[tuple[Chunk, int]] = dataclasses.field(default_factory=list)
    nbytes: int = 0

    def fits(self, chunk: Chunk, bucket_bytes: int) -> bool:
        return not self.chunks or _aligned(self.nbytes) + chunk.size <= bucket_bytes

    def add(self, chunk: Chunk) -> None:
        offset = _aligned(self.nbytes) if self.chunks else 0
        self.chunks.append((chunk, offset))
        self.nbytes = offset + chunk.size


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


class BucketPacker:
    """Buckets in the order they close: each sender fills one bucket at a time in the
    chunks' order and closes it when the next chunk does not fit; :meth:`finish` closes
    the open ones in sender order. Every trainer rank walking the generator meets them
    in this order."""

    def __init__(self, bucket_bytes: int) -> None:
        self.bucket_bytes = bucket_bytes
        self.open: dict[int, Bucket] = {}

    def add(self, chunk: Chunk, sender: int) -> tuple[Optional[Bucket], Bucket, bool]:
        """Adds `chunk` to `sender`'s bucket: (the bucket it closed or None, the bucket
        holding `chunk`, whether that one is new)."""
        bucket = self.open.get(sender)
        closed = None
        if bucket is not None and not bucket.fits(chunk, self.bucket_bytes):
            closed, bucket = bucket, None
        new = bucket is None
        if bucket is None:
            bucket = self.open[sender] = Bucket(sender)
        bucket.add(chunk)
        return closed, bucket, new

    def finish(self) -> list[Bucket]:
        closed = [self.open[s] for s in sorted(self.open)]
        self.open.clear()
        return closed


def pack_buckets(chunks: Iterable[Chunk], owners: Iterable[int],
                 bucket_bytes: int) -> list[Bucket]:
    """Every bucket of a sync, in the order they close (:class:`BucketPacker`)."""
    packer = BucketPacker(bucket_bytes)
    buckets = []
    for chunk, sender in zip(chunks, owners):
        closed, _, _ = packer.add(chunk, sender)
        if closed is not None:
            buckets.append(closed)
    return buckets + packer.finish()


@dataclasses.dataclass(frozen=True)
class Estimate:
    """Seconds of a sync by the cost model, its lower bound, and the bytes on the
    busiest sender."""

    seconds: float
    lower_bound_seconds: float
    busiest_sender_bytes: int
    total_bytes: int


def estimate(sent: dict[int, int], membership: Membership, options: SyncOptions,
             senders: Sequence[int]) -> Estimate:
    """The cost model of the module docstring for `sent` (bytes per sending trainer
    rank), and its lower bound for any split of the same bytes over `senders`."""
    total = sum(sent.values())
    gb = 1e9
    engine_nodes = set(membership.engine_nodes)

    def seconds(loads: dict[int, float]) -> float:
        node_of = membership.trainer_nodes
        worst = total / (options.intra_node_gb_per_s * gb)  # every engine GPU, all bytes
        for rank, load in loads.items():
            local = engine_nodes == {node_of[rank]}
            bandwidth = options.intra_node_gb_per_s if local else options.inter_node_gb_per_s
            worst = max(worst, load / (bandwidth * gb))
        for node in engine_nodes:  # each engine node takes every byte in once
            remote = [load for rank, load in loads.items() if node_of[rank] != node and load]
            paths = min(len(remote), options.gpus_per_node)
            if paths:
                worst = max(worst, sum(remote) / (paths * options.inter_node_gb_per_s * gb))
        return worst

    return Estimate(seconds=seconds({r: float(b) for r, b in sent.items()}),
                    lower_bound_seconds=_lower_bound(total, membership, options, senders),
                    busiest_sender_bytes=max(sent.values(), default=0), total_bytes=total)


def _lower_bound(total: int, membership: Membership, options: SyncOptions,
                 senders: Sequence[int]) -> float:
    """No plan beats it: every engine GPU takes every byte over NVLink at most, and the
    senders' links together carry every byte once."""
    gb = 1e9
    engine_nodes = set(membership.engine_nodes)
    out = sum(options.intra_node_gb_per_s if engine_nodes == {membership.trainer_nodes[r]}
              else options.inter_node_gb_per_s for r in senders)
    return max(total / (options.intra_node_gb_per_s * gb), total / (out * gb))


def manifest_digest(specs: Iterable[TensorSpec]) -> str:
    """A digest of the tensors' names, shapes and dtypes, in order."""
    text = json.dumps([[s.name, list(s.shape), s.dtype] for s in specs])
    return hashlib.sha256(text.encode()).hexdigest()[:16]
