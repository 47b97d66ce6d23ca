"""rlsched.weight_sync (the verl checkpoint-engine backend's machinery) against the two
patterns of verl's NCCL backend, on the same bytes, and on paper for published setups.

    PYTHONPATH=python:build/python /usr/bin/python3 benchmarks/weight_sync_backends.py \
        [--trainers 8 --engines 8] [--mib 256] [--bucket-mib 32] [--syncs 3] \
        [--transport gloo|nccl] [--paper-only]

Measured (one machine, one process per rank, forked): every trainer rank walks the same
generator of full bf16 tensors (a Llama-shaped model of about ``--mib`` MiB, made once
per process), and every engine rank receives every tensor. Three ways, each timed from
the first tensor to the last byte on the slowest rank, median over ``--syncs`` after one
warm-up sync:

* ``one sender``: trainer rank 0 broadcasts every bucket to the engine ranks (verl's
  NCCL backend with ``multi_sender=False``); the other trainer ranks walk the generator;
* ``rank 0 + relays``: the same broadcast with the trainer ranks on rank 0's node in
  the group as well (verl's default ``multi_sender=True``: they receive and drop it);
* ``rlsched``: :class:`rlsched.weight_sync.WeightSync`, every trainer rank a sender
  (planned: the second sync on).

Both verl patterns are written here to the behaviour verl documents (one collective
per bucket of ``bucket_size`` from actor rank 0), not copied. With ``--transport nccl``
(a machine with GPUs; one GPU per rank) the same three run on NCCL with CUDA tensors.
Beside each measurement: the bytes on the busiest sender, and the cost model's estimate
with every link at the speed the one-sender run measured (its bytes over its time): on
one machine an engine rank's intake is a link like a sender's, so the model expects
no gain from spreading the senders here; the gain it expects across nodes is on paper.

On paper (no processes): for Qwen3-30B-A3B (4 + 4 GPUs, one node each), Qwen3-235B-A22B
(8 + 8 nodes of 8 GPUs) and DeepSeek-V3 (64 + 64 nodes of 8 GPUs), their bf16 tensors
(rlsched.weight_sync.models.hf_tensors of tests/data/configs) in buckets of 2 GiB
(verl's default), the cost model of rlsched.weight_sync.plan (the resharding planner's
links: 400 GB/s NVLink, 50 GB/s per GPU NIC): one sender against rlsched's plan over
every trainer GPU, with the published figures of peers beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import multiprocessing
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PUBLISHED = {
    "qwen3-30b-a3b": "verl multi-sender: 5.57 s -> 1.89 s (4 + 4 GPUs)",
    "qwen3-235b-a22b": "Miles point-to-point: 10.75 s -> 3.16 s",
    "deepseek-v3": "(Kimi-K2, same shape class, Miles: 53.3 s -> 7.2 s)",
}
PAPER = (("qwen3-30b-a3b", 4, 4, 4), ("qwen3-235b-a22b", 64, 64, 8),
         ("deepseek-v3", 512, 512, 8))


def _specs(mib: int):
    from rlsched.weight_sync.models import hf_tensors
    hidden = 512
    layer = 4 * hidden * hidden + 3 * hidden * 1536  # parameters per layer
    layers = max(1, (mib << 20) // 2 // layer)
    return hf_tensors({"model_type": "llama", "hidden_size": hidden, "intermediate_size": 1536,
                       "num_hidden_layers": layers, "num_attention_heads": 8,
                       "num_key_value_heads": 8, "vocab_size": 8192, "torch_dtype": "bfloat16"})


def paper() -> list[str]:
    from rlsched.weight_sync import plan
    from rlsched.weight_sync.models import hf_tensors
    rows = ["| model | trainer + engine GPUs | bytes | one sender: busiest sender, estimate "
            "| rlsched: busiest sender, estimate, lower bound | published |",
            "|---|---|---:|---|---|---|"]
    for name, trainers, engines, per_node in PAPER:
        with open(os.path.join(ROOT, "tests", "data", "configs", f"{name}.json")) as f:
            specs = hf_tensors(json.load(f))
        bucket = 2 << 30
        chunks = [c for i, s in enumerate(specs) for c in plan.chunks_of(i, i, s, bucket)]
        membership = plan.Membership(tuple(f"t{r // per_node}" for r in range(trainers)),
                                     tuple(f"e{r // per_node}" for r in range(engines)))
        options = plan.SyncOptions(bucket_bytes=bucket, gpus_per_node=per_node)
        total = sum(c.size for c in chunks)
        one = plan.estimate({0: total}, membership, options, [0])
        senders = plan.sender_ranks(membership, None)
        sent = {s: 0 for s in senders}
        for chunk, owner in zip(chunks, plan.plan_senders(chunks, senders)):
            sent[owner] += chunk.size
        ours = plan.estimate(sent, membership, options, senders)
        rows.append(f"| {name} | {trainers} + {engines} | {total / 1e9:.1f} GB | "
                    f"{one.busiest_sender_bytes / 1e9:.1f} GB, {one.seconds:.2f} s | "
                    f"{ours.busiest_sender_bytes / 1e9:.2f} GB "
                    f"({ours.busiest_sender_bytes / one.busiest_sender_bytes:.3f}), "
                    f"{ours.seconds:.2f} s, {ours.lower_bound_seconds:.2f} s | "
                    f"{PUBLISHED[name]} |")
    return rows


def _bucket_sizes(specs, bucket: int) -> list[int]:
    """The buckets of the verl patterns: tensors in order, cut at `bucket` bytes."""
    sizes, filled = [], 0
    for spec in specs:
        for offset in range(0, spec.nbytes, bucket):
            piece = min(bucket, spec.nbytes - offset)
            if filled + piece > bucket:
                sizes.append(filled)
                filled = 0
            filled += piece
    return sizes + [filled]


def _tensors(specs, device):
    import torch
    generator = torch.Generator().manual_seed(7)
    return [(s.name, torch.randn(s.shape, generator=generator).to(torch.bfloat16).to(device))
            for s in specs]


def _walk(tensors, world):
    """The stand-in of a trainer's generator: one collective per tensor."""
    import torch
    flag = torch.zeros(1)
    for name, tensor in tensors:
        world.allreduce([flag]).wait()
        yield name, tensor


def _rank(rank: int, args, store_port: int, results) -> None:
    try:
        _run_rank(rank, args, store_port, results)
    except BaseException:  # noqa: BLE001 - reported to the parent
        import traceback
        results.put((rank, traceback.format_exc(), None))


def _run_rank(rank: int, args, store_port: int, results) -> None:
    import torch
    import torch.distributed as dist
    os.environ["RLSCHED_WEIGHT_SYNC_HOST"] = "127.0.0.1"
    trainers, engines = args.trainers, args.engines
    trainer = rank < trainers
    device = "cuda" if args.transport == "nccl" else "cpu"
    if device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    timeout = datetime.timedelta(seconds=120)
    store = dist.TCPStore("127.0.0.1", store_port, None, False, timeout)
    role_rank = rank if trainer else rank - trainers
    world = dist.ProcessGroupGloo(dist.PrefixStore("world-" + str(trainer), store), role_rank,
                                  trainers if trainer else engines, timeout)
    tensors = _tensors(_specs(args.mib), device) if trainer else None
    times = {}
    for pattern in ("one sender", "rank 0 + relays", "rlsched"):
        times[pattern] = []
        runner = _Pattern(pattern, rank, args, store, timeout, device)
        for sync in range(args.syncs + 1):
            world.barrier().wait()
            start = time.perf_counter()
            runner.run(_walk(tensors, world) if trainer else None)
            world.barrier().wait()
            if sync:
                times[pattern].append(time.perf_counter() - start)
        runner.close()
    results.put((rank, times, getattr(runner, "metrics", None)))


class _Pattern:
    def __init__(self, pattern, rank, args, store, timeout, device):
        import torch.distributed as dist
        from rlsched.weight_sync.session import _new_group
        self.pattern, self.rank, self.device = pattern, rank, device
        self.trainers, self.engines = args.trainers, args.engines
        self.bucket = args.bucket_mib << 20
        self.group = None
        if pattern == "rlsched":
            from rlsched.weight_sync import WeightSync
            self.sync = WeightSync(self.bucket, rank == 0, transport=args.transport,
                                   timeout_s=timeout.total_seconds())
            self.meta_store = dist.PrefixStore("meta-" + pattern, store)
            self.round = 0
            return
        # verl's patterns: one group of the source (and, with relays, every other trainer
        # rank: all share rank 0's node here) and the engine ranks.
        # The engines know the bucket sizes (verl sends each bucket's metadata ahead).
        self.sizes = _bucket_sizes(_specs(args.mib), self.bucket)
        relays = list(range(1, self.trainers)) if pattern == "rank 0 + relays" else []
        members = [0] + relays + list(range(self.trainers, self.trainers + self.engines))
        if rank in members:
            self.group = _new_group(args.transport, dist.PrefixStore("verl-" + pattern, store),
                                    members.index(rank), len(members), timeout)

    def run(self, weights):
        if self.pattern == "rlsched":
            return self._rlsched(weights)
        import torch
        if self.rank >= self.trainers:  # an engine: the buckets, in order
            for size in self.sizes:
                buffer = torch.empty(size, dtype=torch.uint8, device=self.device)
                self.group.broadcast(buffer, 0).wait()
            return
        staging, filled = torch.empty(self.bucket, dtype=torch.uint8, device=self.device), 0
        for _, tensor in weights:
            data = tensor.reshape(-1).view(torch.uint8)
            for offset in range(0, data.numel(), self.bucket):
                piece = data[offset:offset + self.bucket]
                if filled + piece.numel() > self.bucket:
                    self._broadcast(staging[:filled])
                    filled = 0
                if self.rank == 0:
                    staging[filled:filled + piece.numel()].copy_(piece)
                filled += piece.numel()
        self._broadcast(staging[:filled])

    def _broadcast(self, payload):
        if self.group is not None:
            self.group.broadcast(payload, 0).wait()

    def _rlsched(self, weights):
        key = f"meta{self.round}"
        self.round += 1
        self.meta_store.set(f"{key}/{self.rank}", json.dumps(self.sync.prepare()))
        world = self.trainers + self.engines
        metadata = [json.loads(self.meta_store.get(f"{key}/{r}")) for r in range(world)]
        trainer_kwargs, engine_kwargs = type(self.sync).build_topology(
            self.trainers, self.engines, metadata)
        mine = (trainer_kwargs if self.rank < self.trainers else engine_kwargs)["topology"]
        self.sync.init_process_group(mine[self.rank if self.rank < self.trainers
                                          else self.rank - self.trainers])
        if self.rank < self.trainers:
            self.metrics = asyncio.run(self.sync.send(weights))
        else:
            async def consume():
                async for _ in self.sync.receive():
                    pass
            asyncio.run(consume())
        self.sync.finalize()

    def close(self):
        self.group = None


def measured(args) -> list[str]:
    import torch.distributed as dist
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    store = dist.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=120),
                          wait_for_workers=False)
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    ranks = args.trainers + args.engines
    procs = [ctx.Process(target=_rank, args=(r, args, store.port, results), daemon=True)
             for r in range(ranks)]
    for p in procs:
        p.start()
    outs = [results.get(timeout=1800) for _ in range(ranks)]
    for p in procs:
        p.join(timeout=30)
    failed = [out for out in outs if isinstance(out[1], str)]
    if failed:
        raise SystemExit(f"rank {failed[0][0]} failed:\n{failed[0][1]}")
    metrics = next(m for r, _, m in outs if r == 0)
    total = metrics["rlsched/weight_sync/total_bytes"]
    rows = [f"{args.trainers} + {args.engines} ranks, {args.transport}, "
            f"{total / 2**20:.0f} MiB of bf16 tensors, buckets of {args.bucket_mib} MiB, "
            f"median of {args.syncs} syncs after a warm-up",
            "| pattern | seconds per sync | bytes on the busiest sender | estimate |",
            "|---|---:|---:|---:|"]
    seconds = {p: statistics.median(max(times[p][i] for _, times, _ in outs)
                                    for i in range(args.syncs))
               for p in ("one sender", "rank 0 + relays", "rlsched")}
    # The cost model with every link at the speed the one-sender run measured (one
    # machine: every rank's link is loopback, an engine rank's intake as much as a
    # sender's output).
    from rlsched.weight_sync import plan
    link = total / seconds["one sender"] / 1e9
    options = plan.SyncOptions(bucket_bytes=args.bucket_mib << 20, intra_node_gb_per_s=link,
                               inter_node_gb_per_s=link)
    membership = plan.Membership(("host",) * args.trainers, ("host",) * args.engines)
    busiest = {"one sender": total, "rank 0 + relays": total,
               "rlsched": metrics["rlsched/weight_sync/busiest_sender_bytes"]}
    sent = {"one sender": {0: total},
            "rlsched": {0: busiest["rlsched"], 1: total - busiest["rlsched"]}}
    for pattern, value in seconds.items():
        estimate = ""
        if pattern in sent:
            e = plan.estimate(sent[pattern], membership, options, list(sent[pattern]))
            estimate = f"{e.seconds:.3f} s"
        rows.append(f"| {pattern} | {value:.3f} | {busiest[pattern] / 2**20:.1f} MiB | "
                    f"{estimate} |")
    rows.append(f"speed-up of rlsched: {seconds['one sender'] / seconds['rlsched']:.2f}x "
                f"over one sender, {seconds['rank 0 + relays'] / seconds['rlsched']:.2f}x "
                "over rank 0 + relays")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trainers", type=int, default=8)
    parser.add_argument("--engines", type=int, default=8)
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--bucket-mib", type=int, default=32)
    parser.add_argument("--syncs", type=int, default=3)
    parser.add_argument("--transport", choices=("gloo", "nccl"), default="gloo")
    parser.add_argument("--paper-only", action="store_true")
    args = parser.parse_args()
    print("\n".join(paper()))
    if not args.paper_only:
        print()
        print("\n".join(measured(args)))


if __name__ == "__main__":
    sys.exit(main())
