"""A full-tensor weight sync over ``torch.distributed`` (gloo on CPUs, NCCL on GPUs).

One :class:`WeightSync` per process, trainer or engine, made once and used at every
sync in five steps (the shape of verl's checkpoint-engine interface, which
:mod:`rlsched.integrations.verl_checkpoint` implements with it)::

    sync = WeightSync(bucket_bytes=512 << 20, is_master=(trainer_rank == 0))
    metadata = sync.prepare()                                  # every member
    trainer_kwargs, engine_kwargs = WeightSync.build_topology(  # anywhere, from all
        num_trainers, num_engines, all_metadata)               # members' metadata
    sync.init_process_group(**my_kwargs)                       # my index in either list
    await sync.send(weights)          # every trainer rank: (name, full tensor) pairs
    async for name, tensor in sync.receive(): ...              # every engine rank
    sync.finalize()

Members: trainer ranks ``0..T-1`` then engine ranks ``T..T+E-1``. Trainer rank 0 (the
master) hosts the rendezvous (a ``TCPStore``). The groups, made once per membership
and generation: a control group (trainer 0 and the engine ranks, always gloo) and, per
sending trainer rank, a data group (it and the engine ranks). They are kept from sync
to sync while every member reports them healthy; after a failure on any member the
next :meth:`build_topology` starts a new generation and every member makes new ones.

What moves (see :mod:`rlsched.weight_sync.plan`): every trainer rank walks the whole
generator, in order (producing a tensor may be collective across the trainer ranks),
and computes the same buckets; each bucket's sender copies its chunks into one of two
staging buffers of ``bucket_bytes`` and broadcasts it on its data group, without
waiting (it waits for a buffer's previous broadcast before filling it again); trainer
rank 0 broadcasts every bucket's header (the chunks' names, shapes, dtypes and
offsets) on the control group first. Engine ranks follow the headers: each bucket is
received into a buffer of its own and its tensors are yielded as views of it (a
tensor split across buckets is assembled first), so a tensor stays valid as long as
the caller holds it. On the first sync the senders are chosen as the chunks come
(:class:`~rlsched.weight_sync.plan.OnlineSenders`); the tensors' names, shapes and
dtypes are then kept (per membership) and every later sync is planned before its first
byte (:func:`~rlsched.weight_sync.plan.plan_senders`, Karmarkar-Karp on bytes).

Checks: in :meth:`init_process_group` every member publishes the digest of the
membership it was given and compares it with everyone's before any group is made (a
member given the topology of another membership is refused on every member); on later
syncs each tensor the generator yields is checked against the kept ones (name, shape,
dtype; a renamed, reshaped, missing or extra tensor stops the sync on every member
with an error naming it; no engine rank is left waiting: trainer rank 0 sends an abort
header); engine ranks check every header's membership digest, sequence and sizes.
Every collective waits at most ``timeout_s``: a lost member fails the others with
:class:`WeightSyncError` instead of hanging them.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import socket
import time
from typing import Any, AsyncIterator, Iterable, Mapping, Optional, Union

from rlsched.errors import WEIGHT_SYNC_FAILED, InvalidArgumentError, WeightSyncError
from rlsched.weight_sync import plan as _plan
from rlsched.weight_sync.models import hf_tensors
from rlsched.weight_sync.plan import (Bucket, BucketPacker, Chunk, Membership, OnlineSenders,
                                      SyncOptions, TensorSpec)

# torch, ray and the executor (for its fp8 rule) are imported in the functions that use
# them: optional dependencies, and planning a sync needs none.

__all__ = ["WeightSync", "WeightSyncError", "WEIGHT_SYNC_FAILED", "node_id"]

_NODE_ENV = "RLSCHED_NODE_ID"
_HOST_ENV = "RLSCHED_WEIGHT_SYNC_HOST"


def node_id() -> str:
    """This process's node: ``$RLSCHED_NODE_ID``, else Ray's node id when Ray is
    initialised, else the host name."""
    if os.environ.get(_NODE_ENV):
        return os.environ[_NODE_ENV]
    try:
        import ray
        if ray.is_initialized():
            return ray.get_runtime_context().get_node_id()
    except ImportError:
        pass
    return socket.gethostname()


def _host() -> str:
    """The address other members reach the master at: ``$RLSCHED_WEIGHT_SYNC_HOST``,
    else Ray's node address when Ray is initialised, else the address of the interface
    that routes outwards (the host name's address can be a loopback one, 127.0.1.1 on
    Debian), else the host name's."""
    if os.environ.get(_HOST_ENV):
        return os.environ[_HOST_ENV]
    try:
        import ray
        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except ImportError:
        pass
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("10.255.255.255", 1))  # no packet is sent
            address = probe.getsockname()[0]
        if not address.startswith("127."):
            return address
    except OSError:
        pass
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def _dtype_name(dtype: Any) -> str:
    return str(dtype).replace("torch.", "")


def _torch_dtype(name: str):
    import torch
    return getattr(torch, name)


async def _items(weights: Union[Iterable, AsyncIterator]) -> AsyncIterator:
    if hasattr(weights, "__aiter__"):
        async for item in weights:
            yield item
    else:
        for item in weights:
            yield item


class _Groups:
    """The process groups of one generation, on this member."""

    def __init__(self, topology: dict, backend: str, timeout: datetime.timedelta) -> None:
        import torch.distributed as dist
        self.topology = topology
        rank, trainers = topology["rank"], topology["num_trainers"]
        engines = topology["world_size"] - trainers
        master = topology["master"]
        self.store = dist.TCPStore(master["host"], master["port"], None, False, timeout)
        prefix = f"rlsched/g{topology['generation']}/{topology['digest']}/"
        self._sync_store = dist.PrefixStore(prefix + "sync/", self.store)
        self._syncs = 0
        self._agree(dist.PrefixStore(prefix + "digest/", self.store), rank, topology, timeout)
        self.control: Any = None  # on trainer rank 0 and the engine ranks
        self.data: dict[int, Any] = {}

        def group(name: str, root: int, kind: str):
            members = [root] + list(range(trainers, trainers + engines))
            store = dist.PrefixStore(prefix + name + "/", self.store)
            return _new_group(kind, store, members.index(rank), len(members), timeout)

        is_engine = rank >= trainers
        if rank == 0 or is_engine:
            self.control = group("control", 0, "gloo")
        for sender in topology["senders"]:
            if sender == rank or is_engine:
                self.data[sender] = group(f"sender{sender}", sender, backend)

    def begin(self) -> None:
        """Counts this member's syncs (the abort key is per sync)."""
        self._syncs += 1

    def set_abort(self, message: str, field: str) -> None:
        """Tells every member why this trainer rank stopped the sync."""
        try:
            self._sync_store.set(f"why{self._syncs}", json.dumps([message, field]))
            self._sync_store.add(f"abort{self._syncs}", 1)
        except RuntimeError:
            pass  # the store is gone: the others time out

    def abort_reason(self) -> Optional[tuple[str, str]]:
        """(message, field) if a trainer rank stopped this sync, else None."""
        try:  # add(key, 0) reads a counter without waiting for it
            if self._sync_store.add(f"abort{self._syncs}", 0) > 0:
                why = self._sync_store.get(f"why{self._syncs}")
                message, field = json.loads(why.decode())
                return message, field
        except (RuntimeError, ValueError):
            pass
        return None

    @staticmethod
    def _agree(store, rank: int, topology: dict, timeout: datetime.timedelta) -> None:
        """Every member's membership digest, compared before any group is made."""
        store.set(str(rank), topology["agreed"])
        keys = [str(r) for r in range(topology["world_size"])]
        try:
            store.wait(keys, timeout)
        except RuntimeError as error:
            raise WeightSyncError(
                f"init_process_group: not every member joined generation "
                f"{topology['generation']} within {timeout.total_seconds():g} s ({error})",
                "timeout") from error
        digests = {r: store.get(k).decode() for r, k in enumerate(keys)}
        strangers = [r for r, d in digests.items() if d != topology["agreed"]]
        if strangers:
            raise WeightSyncError(
                f"init_process_group: members {strangers} were given the topology of another "
                f"membership or other options (membership/options {digests[strangers[0]]}, "
                f"this member's {topology['agreed']}): build_topology from every member's "
                "current prepare() metadata, and give every member the same options",
                "membership")


def _new_group(kind: str, store, rank: int, size: int, timeout: datetime.timedelta):
    import torch.distributed as dist
    if kind == "gloo":
        return dist.ProcessGroupGloo(store, rank, size, timeout)
    # NCCL: written to torch's ProcessGroupNCCL(store, rank, size, options); no GPU
    # machine ran it in CI (see the docs).
    # Untyped: the signature is torch 2's; Debian's torch 1.13 types say (..., timeout).
    nccl: Any = dist.ProcessGroupNCCL
    options = nccl.Options()
    options._timeout = timeout
    return nccl(store, rank, size, options)


class WeightSync:
    """One member of a full-tensor weight sync (see the module docstring).

    ``bucket_bytes``: the most bytes one broadcast carries (at least 4,096).
    ``is_master``: trainer rank 0. ``fp8``: the sender quantises linear weights to fp8
    block-128 (codes as ``uint8`` under the tensor's name, float32 scales under
    ``<name>_scale_inv``). ``senders``: how many trainer ranks send (None: all).
    ``transport``: ``"gloo"``, ``"nccl"`` or ``"auto"`` (NCCL when CUDA is available;
    not named ``backend``, which verl's ``CheckpointEngineRegistry.new`` takes itself).
    ``timeout_s``: the longest any collective or rendezvous waits. ``device``: where
    engine ranks receive (default: ``"cuda"`` with NCCL, else ``"cpu"``). The
    bandwidths and ``gpus_per_node`` feed the cost model of the sync's metrics.
    ``model_config``: the model's Hugging Face ``config.json`` (a path to it or to its
    directory, or the mapping), on the trainer ranks: the tensors are then known before
    the first sync (:func:`rlsched.weight_sync.models.hf_tensors`), which is planned
    like the later ones, and the generator is checked against them.
    """

    def __init__(self, bucket_bytes: int, is_master: bool = False, *, fp8: bool = False,
                 senders: Optional[int] = None, transport: str = "auto",
                 timeout_s: float = 600.0, device: Optional[str] = None,
                 host: Optional[str] = None, intra_node_gb_per_s: float = 400.0,
                 inter_node_gb_per_s: float = 50.0, gpus_per_node: int = 8,
                 model_config: Union[None, str, Mapping[str, Any]] = None) -> None:
        self.options = SyncOptions(bucket_bytes=bucket_bytes, fp8=fp8, senders=senders,
                                   intra_node_gb_per_s=intra_node_gb_per_s,
                                   inter_node_gb_per_s=inter_node_gb_per_s,
                                   gpus_per_node=gpus_per_node)
        self.options.check()
        if transport not in ("auto", "gloo", "nccl"):
            raise InvalidArgumentError(f"transport: {transport!r}, expected auto, gloo or nccl",
                                       "transport")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) \
                or not 0 < timeout_s < 1e7:
            raise InvalidArgumentError(f"timeout_s: {timeout_s!r}, expected in (0, 1e7)",
                                       "timeout_s")
        self.is_master = bool(is_master)
        self.transport = transport
        self.timeout = datetime.timedelta(seconds=float(timeout_s))
        self.device = device
        self.host = host
        self._store: Any = None  # the master's TCPStore server
        self._generation = 0  # the master's next generation
        self._groups: Optional[_Groups] = None
        self._healthy = False
        # The tensors of the last complete sync, and plans made from them (the owner of
        # every chunk) per (manifest digest, senders).
        self._manifest: Optional[list[TensorSpec]] = None
        self._manifest_digest: Optional[str] = None
        self._plans: dict[tuple, dict] = {}
        self._keep(None if model_config is None else hf_tensors(_read_config(model_config)))
        self.last_metrics: dict[str, float] = {}

    # ---- the five steps -------------------------------------------------------------

    def prepare(self) -> dict:
        """This member's metadata for :meth:`build_topology`: its node, the generation
        of the groups it holds (-1 if none or broken), and on the master the
        rendezvous address."""
        held = self._groups.topology if self._groups is not None and self._healthy else None
        metadata: dict[str, Any] = {
            "node": node_id(), "manifest": self._manifest_digest,
            "held": None if held is None else [held["generation"], held["digest"], held["rank"]]}
        if self.is_master:
            if self._store is None:
                import torch.distributed as dist
                self.host = self.host or _host()
                self._store = dist.TCPStore(self.host, 0, None, True, self.timeout,
                                            wait_for_workers=False)
            metadata["master"] = {"host": self.host, "port": self._store.port,
                                  "next_generation": self._generation}
        return metadata

    @classmethod
    def build_topology(cls, num_trainers: int, num_engines: int,
                       metadata: list) -> tuple[dict[str, list], dict[str, list]]:
        """Per-rank keyword lists for :meth:`init_process_group`: ``(trainer_kwargs,
        engine_kwargs)``, each value a list with one entry per trainer rank (engine
        rank). `metadata`: every member's :meth:`prepare`, trainer ranks first."""
        topology = _topology(num_trainers, num_engines, metadata)
        world = num_trainers + num_engines
        per_rank = [dict(topology, rank=r) for r in range(world)]
        return ({"topology": per_rank[:num_trainers]}, {"topology": per_rank[num_trainers:]})

    def init_process_group(self, topology: dict) -> None:
        """Joins the groups of `topology` (from :meth:`build_topology`), keeping the
        ones this member holds when the generation and membership are the same."""
        held = self._groups.topology if self._groups is not None else None
        if (self._healthy and held is not None and held["generation"] == topology["generation"]
                and held["digest"] == topology["digest"] and held["rank"] == topology["rank"]):
            held["manifest"] = topology["manifest"]  # the groups stay; the tensors may not
            return
        self._release()
        if self.is_master:
            self._generation = max(self._generation, topology["generation"] + 1)
        senders = _plan.sender_ranks(_membership(topology), self.options.senders)
        agreed = f"{topology['membership_digest']}/{self._options_digest()}"
        try:
            self._groups = _Groups(dict(topology, senders=senders, agreed=agreed),
                                   self._backend(), self.timeout)
        except RuntimeError as error:  # a member gone, a refused connection
            if isinstance(error, WeightSyncError):
                raise
            raise WeightSyncError(f"init_process_group: the groups of generation "
                                  f"{topology['generation']} could not be made: {error}",
                                  "timeout") from error
        self._healthy = True

    async def send(self, weights, global_steps: Optional[int] = None) -> dict:
        """Walks `weights` ((name, full tensor) pairs, a generator or an async one) to
        the end and sends this rank's buckets. Every trainer rank calls it. Returns
        the sync's metrics (seconds, bytes, the cost model's estimate)."""
        sender = _Sender(self, self._joined(trainer=True), global_steps)
        try:
            metrics = await sender.run(weights)
        except BaseException:
            self._release()
            raise
        finally:
            sender.staging = [None, None]  # the staging buffers go with the sync
        self.last_metrics = metrics
        return metrics

    async def receive(self, global_steps: Optional[int] = None) -> AsyncIterator:
        """Yields every tensor the trainer's generator gave, as (name, tensor) (with
        fp8: the codes and the scales). Every engine rank calls it."""
        groups = self._joined(trainer=False)
        try:
            async for item in _receive(self, groups, global_steps):
                yield item
        except BaseException:
            del groups
            self._release()
            raise

    def finalize(self) -> None:
        """Ends a sync; the groups stay for the next one while healthy."""
        if not self._healthy:
            self._release()

    def _release(self) -> None:
        """Drops the groups (their threads and sockets go with the last reference)."""
        self._groups = None
        self._healthy = False

    # ---- helpers --------------------------------------------------------------------

    def _options_digest(self) -> str:
        o = self.options
        return f"b{o.bucket_bytes}-fp8{int(o.fp8)}-s{o.senders}"

    def _backend(self) -> str:
        if self.transport != "auto":
            return self.transport
        import torch
        return "nccl" if torch.cuda.is_available() else "gloo"

    def _joined(self, trainer: bool) -> _Groups:
        if self._groups is None:
            raise WeightSyncError("no groups: call prepare, build_topology and "
                                  "init_process_group before a sync", "init_process_group")
        topology = self._groups.topology
        if (topology["rank"] < topology["num_trainers"]) != trainer:
            role = "trainer" if topology["rank"] < topology["num_trainers"] else "engine"
            raise WeightSyncError(f"rank {topology['rank']} is an {role} rank: "
                                  f"{'send' if trainer else 'receive'} is not its part", "rank")
        return self._groups

    def manifest(self) -> Optional[list[TensorSpec]]:
        """The tensors kept from the last complete sync (None before it)."""
        return self._manifest

    def _keep(self, manifest: Optional[list[TensorSpec]]) -> None:
        """Keeps `manifest` (None: forget the tensors and their plans) and its digest."""
        self._manifest = manifest
        self._manifest_digest = None if manifest is None else _plan.manifest_digest(manifest)
        if manifest is None:
            self._plans = {}


def _read_config(config: Union[str, Mapping[str, Any]]) -> Mapping[str, Any]:
    if isinstance(config, Mapping):
        return config
    path = os.path.join(config, "config.json") if os.path.isdir(config) else config
    try:
        with open(path, encoding="utf-8") as f:
            loaded = json.load(f)
    except (OSError, ValueError) as error:
        raise InvalidArgumentError(f"model_config: cannot read {path!r}: {error}",
                                   "model_config") from error
    if not isinstance(loaded, dict):
        raise InvalidArgumentError(f"model_config: {path!r} is not a JSON object",
                                   "model_config")
    return loaded


def _count(field: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgumentError(f"{field}: {value!r}, expected an int >= 1", field)
    return value


def _checked_metadata(metadata: list, world: int) -> list[dict]:
    if not isinstance(metadata, (list, tuple)) or len(metadata) != world:
        size = len(metadata) if isinstance(metadata, (list, tuple)) else type(metadata).__name__
        raise InvalidArgumentError(f"metadata: {size} entries, expected one per member "
                                   f"({world})", "metadata")
    for i, m in enumerate(metadata):
        if not isinstance(m, dict) or not isinstance(m.get("node"), str):
            raise InvalidArgumentError(f"metadata[{i}]: {m!r} is not a prepare() of "
                                       "rlsched.weight_sync (no node)", f"metadata[{i}].node")
    master = metadata[0].get("master")
    if not (isinstance(master, dict) and isinstance(master.get("host"), str)
            and isinstance(master.get("port"), int)
            and isinstance(master.get("next_generation"), int)):
        raise InvalidArgumentError("metadata[0]: trainer rank 0 must be the master "
                                   "(is_master=True), with its rendezvous address",
                                   "metadata[0].master")
    return list(metadata)


def _topology(num_trainers: int, num_engines: int, metadata: list) -> dict:
    world = _count("actor_wg_world_size", num_trainers) + _count("rollout_world_size",
                                                                 num_engines)
    metadata = _checked_metadata(metadata, world)
    master = metadata[0]["master"]
    membership = Membership(tuple(m["node"] for m in metadata[:num_trainers]),
                            tuple(m["node"] for m in metadata[num_trainers:]))
    membership_digest = membership.digest()
    digest = f"{membership_digest}-{master['port']}"
    # The groups are kept when every member holds them at its own rank; else a new
    # generation, which no member has used (its rendezvous keys are fresh).
    held = [m.get("held") for m in metadata]
    generation = held[0][0] if held[0] else -1
    if any(h != [generation, digest, rank] for rank, h in enumerate(held)):
        generation = max([master["next_generation"]] +
                         [h[0] + 1 for h in held if isinstance(h, list) and h])
    manifests = {m.get("manifest") for m in metadata[:num_trainers]}
    return {"num_trainers": num_trainers, "world_size": world,
            "master": {"host": master["host"], "port": master["port"]},
            "generation": generation, "membership_digest": membership_digest,
            "digest": digest, "manifest": manifests.pop() if len(manifests) == 1 else None,
            "trainer_nodes": list(membership.trainer_nodes),
            "engine_nodes": list(membership.engine_nodes), "senders": None}


def _membership(topology: dict) -> Membership:
    return Membership(tuple(topology["trainer_nodes"]), tuple(topology["engine_nodes"]))


# ---- the wire ----------------------------------------------------------------------

def _wait(work, what: str, groups: Optional[_Groups] = None) -> None:
    """Waits for `work`; on failure raises WeightSyncError, with the reason a trainer
    rank left in the store when there is one (`groups` given)."""
    try:
        work.wait()
    except RuntimeError as error:
        reason = groups.abort_reason() if groups is not None else None
        if reason is not None:
            raise WeightSyncError(f"the trainer ranks stopped the sync: {reason[0]}",
                                  reason[1]) from error
        raise WeightSyncError(f"{what}: {error}", "timeout") from error


def _send_header(control, header: dict, keep: list) -> None:
    import torch
    data = torch.frombuffer(bytearray(json.dumps(header).encode()), dtype=torch.uint8)
    length = torch.tensor([data.numel()], dtype=torch.int64)
    keep.append((control.broadcast(length, 0), length))
    keep.append((control.broadcast(data, 0), data))


def _receive_header(groups: _Groups) -> dict:
    import torch
    length = torch.zeros(1, dtype=torch.int64)
    _wait(groups.control.broadcast(length, 0), "the next bucket's header from trainer rank 0",
          groups)
    data = torch.empty(int(length.item()), dtype=torch.uint8)
    _wait(groups.control.broadcast(data, 0), "a bucket header from trainer rank 0", groups)
    return json.loads(bytes(data.numpy()).decode())


def _wire_bytes(tensor):
    return tensor.contiguous().reshape(-1).view(__import__("torch").uint8)


class _Mismatch(Exception):
    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


class _Sender:
    """One trainer rank's walk of the generator (see the module docstring)."""

    def __init__(self, sync: WeightSync, groups: _Groups, global_steps: Optional[int]) -> None:
        topology = groups.topology
        self.sync, self.groups, self.global_steps = sync, groups, global_steps
        self.rank = topology["rank"]
        self.options = sync.options
        # The kept tensors when every trainer rank kept the same ones (build_topology
        # compared them), else None: the senders are then chosen as the chunks come.
        agreed = topology["manifest"] is not None and topology["manifest"] == \
            sync._manifest_digest
        known = sync.manifest() if agreed else None
        self.known = None if known is None else {spec.name: spec for spec in known}
        self.owners = self._planned_owners(known) if known is not None else None
        self.online = OnlineSenders(topology["senders"])
        self.seen: list[TensorSpec] = []
        self._names: set[str] = set()
        self.wires: list[TensorSpec] = []
        self.packer = BucketPacker(sync.options.bucket_bytes)
        self.sent = {s: 0 for s in topology["senders"]}
        self.buckets = 0
        self.staging: list = [None, None]
        self.staging_work: list = [None, None]
        self.slot = 0  # the staging buffer of this rank's open bucket
        self.inflight: list = []

    def _planned_owners(self, known: list[TensorSpec]) -> dict[tuple[str, int], int]:
        """The sender of every chunk, (wire tensor name, byte offset) -> trainer rank,
        planned once per (tensors, senders)."""
        senders = self.groups.topology["senders"]
        key = (self.groups.topology["manifest"], tuple(senders))
        if key not in self.sync._plans:
            chunks: list[Chunk] = []
            names: list[str] = []
            for source, spec in enumerate(known):
                for wire in _plan.wire_specs(spec, self.options.fp8):
                    cut = _plan.chunks_of(len(names), source, wire, self.options.bucket_bytes)
                    chunks += cut
                    names += [wire.name] * len(cut)
            owners = _plan.plan_senders(chunks, senders)
            self.sync._plans = {key: {(names[i], c.offset): owners[i]
                                      for i, c in enumerate(chunks)}}
        return self.sync._plans[key]

    async def run(self, weights) -> dict:
        start = time.perf_counter()
        self.groups.begin()
        try:
            async for name, tensor in _items(weights):
                spec = TensorSpec(str(name), tuple(int(d) for d in tensor.shape),
                                  _dtype_name(tensor.dtype))
                self._check(spec)
                self.seen.append(spec)
                self._tensor(len(self.seen) - 1, spec, tensor)
            self._check_complete()
            for bucket in self.packer.finish():
                self._close(bucket)
            if self.rank == 0:
                _send_header(self.groups.control, self._header("end"), self.inflight)
        except _Mismatch as mismatch:
            # The next sync learns the tensors again.
            self.sync._keep(None)
            self._abort(str(mismatch), mismatch.field)
            raise WeightSyncError(str(mismatch), mismatch.field) from None
        except WeightSyncError:
            raise
        except Exception as error:  # the generator or a copy failed: tell the engines
            self._abort(f"trainer ranks stopped: {type(error).__name__}: {error}", "")
            raise
        self._drain()
        if self.known is None:
            self.sync._keep(self.seen)
        return self._metrics(time.perf_counter() - start)

    def _check(self, spec: TensorSpec) -> None:
        if spec.dtype not in _plan.ITEM_SIZES:
            raise _Mismatch(f"tensor {spec.name!r}: dtype {spec.dtype} is not one a sync "
                            f"carries ({', '.join(_plan.ITEM_SIZES)})", spec.name)
        if spec.name in self._names:
            raise _Mismatch(f"tensor {spec.name!r} comes twice", spec.name)
        self._names.add(spec.name)
        if self.known is None:
            return
        want = self.known.get(spec.name)
        if want is None:
            raise _Mismatch(f"tensor {spec.name!r} {list(spec.shape)} {spec.dtype} is not one "
                            f"of the {len(self.known)} planned (renamed or extra: rebuild the "
                            "topology, or fix the model config, to plan again)", spec.name)
        if want != spec:
            raise _Mismatch(f"tensor {spec.name!r} is {list(spec.shape)} {spec.dtype}, planned "
                            f"as {list(want.shape)} {want.dtype} (reshaped or retyped)",
                            spec.name)

    def _check_complete(self) -> None:
        if self.known is None or len(self._names) == len(self.known):
            return
        missing = next(name for name in self.known if name not in self._names)
        raise _Mismatch(f"tensor {missing!r} is missing: the generator gave "
                        f"{len(self._names)} of the {len(self.known)} planned tensors", missing)

    def _tensor(self, source: int, spec: TensorSpec, tensor) -> None:
        data = None  # this rank's wire bytes of the tensor, made when it sends a chunk
        for k, wire in enumerate(_plan.wire_specs(spec, self.options.fp8)):
            wire_id = len(self.wires)
            self.wires.append(wire)
            for chunk in _plan.chunks_of(wire_id, source, wire, self.options.bucket_bytes):
                bucket = self._bucket_for(chunk)
                if bucket.sender == self.rank and chunk.size:
                    if data is None:
                        data = self._wire_data(spec, tensor)
                    at = bucket.chunks[-1][1]
                    self.staging[self.slot][at:at + chunk.size].copy_(
                        data[k][chunk.offset:chunk.offset + chunk.size])

    def _bucket_for(self, chunk: Chunk) -> Bucket:
        """The open bucket `chunk` joins (its sender's full one closed first)."""
        owner = (self.owners[(self.wires[chunk.wire].name, chunk.offset)]
                 if self.owners is not None else self.online(chunk))
        self.sent[owner] += chunk.size
        closed, bucket, new = self.packer.add(chunk, owner)
        if closed is not None:
            self._close(closed)
        if new and owner == self.rank:
            self._stage()
        return bucket

    def _wire_data(self, spec: TensorSpec, tensor) -> list:
        """The wire tensors of `tensor` as flat bytes, on the staging buffers' device."""
        device = self.staging[self.slot].device
        if not _plan.quantized(spec, self.options.fp8):
            return [_wire_bytes(tensor.detach().to(device))]
        from rlsched.weight_sync.executor import quantize_block128
        codes, scales = quantize_block128(tensor.detach().to(device))
        return [_wire_bytes(codes), _wire_bytes(scales)]

    def _stage(self) -> None:
        """Takes the next staging buffer, once its previous broadcast is done."""
        import torch
        self.slot = 1 - self.slot
        if self.staging_work[self.slot] is not None:
            _wait(self.staging_work[self.slot], "a bucket's broadcast to the engine ranks")
            self.staging_work[self.slot] = None
        if self.staging[self.slot] is None:
            device = "cuda" if self.sync._backend() == "nccl" else "cpu"
            self.staging[self.slot] = torch.empty(self.options.bucket_bytes, dtype=torch.uint8,
                                                  device=device)

    def _close(self, bucket: Bucket) -> None:
        import torch
        # The header only where it is used: rank 0 sends it, the sender digests it.
        mine = bucket.sender == self.rank
        header = self._header("bucket", bucket) if self.rank == 0 or mine else {}
        self.buckets += 1
        if self.rank == 0:
            reason = self.groups.abort_reason()
            if reason is not None:  # another trainer rank stopped
                raise _Mismatch(*reason)
            _send_header(self.groups.control, header, self.inflight)
        if mine:
            # The bucket's size and contents as this rank sees them, first: an engine
            # rank compares them with trainer rank 0's header before it receives.
            preamble = torch.tensor([bucket.nbytes, _chunks_digest(header["chunks"])],
                                    dtype=torch.int64, device=self.staging[self.slot].device)
            data = self.groups.data[self.rank]
            self.inflight.append((data.broadcast(preamble, 0), preamble))
            payload = self.staging[self.slot][:bucket.nbytes]
            self.staging_work[self.slot] = data.broadcast(payload, 0)

    def _header(self, status: str, bucket: Optional[Bucket] = None, message: str = "",
                field: str = "") -> dict:
        topology = self.groups.topology
        header = {"status": status, "seq": self.buckets, "agreed": topology["agreed"],
                  "global_steps": self.global_steps, "message": message, "field": field}
        if bucket is not None:
            header.update(sender=bucket.sender, nbytes=bucket.nbytes, chunks=[
                [self.wires[c.wire].name, list(self.wires[c.wire].shape),
                 self.wires[c.wire].dtype, c.wire, c.offset, c.size, offset,
                 self.wires[c.wire].nbytes] for c, offset in bucket.chunks])
        if status == "end":
            header["wires"] = len(self.wires)
        return header

    def _abort(self, message: str, field: str) -> None:
        self.groups.set_abort(message, field)
        if self.rank == 0:
            try:
                _send_header(self.groups.control, self._header("abort", message=message,
                                                               field=field), self.inflight)
            except RuntimeError:
                pass  # the engines time out instead
        try:
            self._drain()
        except WeightSyncError:
            pass

    def _drain(self) -> None:
        for slot, work in enumerate(self.staging_work):
            if work is not None:
                self.staging_work[slot] = None
                _wait(work, "a bucket's broadcast to the engine ranks")
        for work, _ in self.inflight:
            _wait(work, "a bucket header's broadcast to the engine ranks")
        self.inflight.clear()

    def _metrics(self, seconds: float) -> dict:
        topology = self.groups.topology
        estimate = _plan.estimate(self.sent, _membership(topology), self.options,
                                  topology["senders"])
        return {"rlsched/weight_sync/seconds": seconds,
                "rlsched/weight_sync/buckets": float(self.buckets),
                "rlsched/weight_sync/total_bytes": float(estimate.total_bytes),
                "rlsched/weight_sync/busiest_sender_bytes": float(estimate.busiest_sender_bytes),
                "rlsched/weight_sync/senders": float(len(topology["senders"])),
                "rlsched/weight_sync/planned": float(self.owners is not None),
                "rlsched/weight_sync/estimate_seconds": estimate.seconds,
                "rlsched/weight_sync/lower_bound_seconds": estimate.lower_bound_seconds}


def _chunks_digest(chunks: list) -> int:
    return int(hashlib.sha256(json.dumps(chunks).encode()).hexdigest()[:15], 16)


def _check_preamble(groups: _Groups, header: dict, device: str) -> None:
    """The sender's own view of the bucket against trainer rank 0's header, before a
    byte of it is received (a payload of another size would abort the process)."""
    import torch
    preamble = torch.zeros(2, dtype=torch.int64, device=device)
    _wait(groups.data[header["sender"]].broadcast(preamble, 0),
          f"bucket {header['seq']}'s size from trainer rank {header['sender']}", groups)
    preamble = preamble.cpu()
    if preamble.tolist() != [header["nbytes"], _chunks_digest(header["chunks"])]:
        names = sorted({chunk[0] for chunk in header["chunks"]})
        raise WeightSyncError(
            f"bucket {header['seq']}: trainer rank {header['sender']} holds "
            f"{preamble[0].item()} bytes of other tensors than trainer rank 0 says "
            f"({header['nbytes']} bytes of {', '.join(names[:3])}"
            f"{', ...' if len(names) > 3 else ''}): the trainer ranks' generators disagree",
            names[0] if names else "")


async def _receive(sync: WeightSync, groups: _Groups, global_steps: Optional[int]):
    """An engine rank's side (see the module docstring)."""
    import torch
    device = sync.device or ("cuda" if sync._backend() == "nccl" else "cpu")
    agreed = groups.topology["agreed"]
    groups.begin()
    partial: dict[int, list] = {}  # wire id -> [bytes buffer, bytes received]
    delivered = 0
    pending = None
    seq = 0
    while True:
        header = _receive_header(groups)
        if header["status"] == "abort":
            raise WeightSyncError(f"the trainer ranks stopped the sync: {header['message']}",
                                  header.get("field", ""))
        if header.get("agreed") != agreed or header.get("seq") != seq:
            raise WeightSyncError(
                f"bucket header {header.get('seq')} for {header.get('agreed')}, expected "
                f"bucket {seq} for {agreed}", "membership")
        if (global_steps is not None and header.get("global_steps") is not None
                and header["global_steps"] != global_steps):
            raise WeightSyncError(f"the trainer sends step {header['global_steps']}, this "
                                  f"engine rank receives step {global_steps}", "global_steps")
        if header["status"] == "end":
            break
        seq += 1
        _check_preamble(groups, header, device)
        buffer = torch.empty(header["nbytes"], dtype=torch.uint8, device=device)
        work = groups.data[header["sender"]].broadcast(buffer, 0)
        if pending is not None:
            for item in _unpack(*pending, partial, groups):
                delivered += 1
                yield item
        pending = (header, buffer, work)
    if pending is not None:
        for item in _unpack(*pending, partial, groups):
            delivered += 1
            yield item
    if partial or delivered != header.get("wires"):
        raise WeightSyncError(f"received {delivered} of {header.get('wires')} tensors "
                              f"({len(partial)} incomplete)", "")


def _unpack(header: dict, buffer, work, partial: dict, groups: _Groups):
    """The tensors that bucket `header` completes, as (name, tensor)."""
    import torch
    _wait(work, f"bucket {header['seq']} from trainer rank {header['sender']}", groups)
    for name, shape, dtype, wire, offset, size, at, nbytes in header["chunks"]:
        piece = buffer[at:at + size]
        if size == nbytes:
            yield name, piece.view(_torch_dtype(dtype)).view(shape)
            continue
        whole = partial.setdefault(wire, [torch.empty(nbytes, dtype=torch.uint8,
                                                      device=buffer.device), 0])
        whole[0][offset:offset + size].copy_(piece)
        whole[1] += size
        if whole[1] == nbytes:
            del partial[wire]
            yield name, whole[0].view(_torch_dtype(dtype)).view(shape)
