"""A verl-shaped world for the checkpoint-engine backend, without Ray: one process per
actor rank and per rollout worker (forked), each with its checkpoint engine made as
verl 1dda039b9 makes it, and a driver that calls them as verl does.

The calls, at that commit:
* engines: ``CheckpointEngineRegistry.new(backend, is_master=(torch.distributed.get_rank()
  == 0), bucket_size=bucket_size, **engine_kwargs)`` on actors
  (verl/workers/engine_workers.py:685), ``CheckpointEngineRegistry.new(backend,
  bucket_size=bucket_size, **engine_kwargs)`` on rollout workers
  (verl/checkpoint_engine/base.py:338), after importing ``custom_backend_module``;
* per sync (``CheckpointEngineManager.update_weights``, base.py:500-556): ``prepare()``
  on every actor then rollout worker, ``build_topology(actor_wg.world_size,
  rollout.world_size, metadata)`` in the driver, each list's length checked, one entry
  per rank to ``init_process_group(**kwargs)``; then ``await send_weights(
  per_tensor_param, global_steps=global_steps)`` on every actor
  (engine_workers.py:763-764; the returned metrics merged) and, on every rollout
  worker, ``receive_weights(global_steps=global_steps)`` consumed as the server adapter
  consumes it; then ``finalize()`` on every worker.

The actors' generator is the stand-in of ``get_per_tensor_param()``: full tensors, each
made with one gloo collective among the actor ranks (their own training world), so a
backend that skips a tensor on some rank hangs and fails the test. Every rollout worker
reports each tensor's bytes as a SHA-256 digest; :func:`expected` gives the digests the
tensors must have.
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import importlib
import multiprocessing
import os
import shutil
import sys
import traceback

STANDINS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "standin_packages")
BACKEND_MODULE = "rlsched.integrations.verl_checkpoint"


def model_specs(layers: int = 2, hidden: int = 256, ffn: int = 384, vocab: int = 1000,
                dtype: str = "bfloat16") -> list:
    """(name, shape, dtype) of a small Llama-shaped model, in the order a Hugging Face
    state dict lists them (embeddings larger than a 64 KiB bucket)."""
    specs = [("model.embed_tokens.weight", (vocab, hidden), dtype)]
    for i in range(layers):
        p = f"model.layers.{i}."
        specs += [(p + "input_layernorm.weight", (hidden,), dtype)]
        specs += [(p + f"self_attn.{x}_proj.weight", (hidden, hidden), dtype) for x in "qkvo"]
        specs += [(p + "post_attention_layernorm.weight", (hidden,), dtype)]
        specs += [(p + "mlp.gate_proj.weight", (ffn, hidden), dtype),
                  (p + "mlp.up_proj.weight", (ffn, hidden), dtype),
                  (p + "mlp.down_proj.weight", (hidden, ffn), dtype)]
    specs += [("model.norm.weight", (hidden,), dtype), ("lm_head.weight", (vocab, hidden), dtype)]
    return specs


def make_tensor(seed: int, step: int, index: int, shape, dtype: str):
    import torch
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + index)
    return torch.randn(tuple(shape), generator=generator).to(getattr(torch, dtype))


def digest(tensor) -> str:
    import torch
    data = tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return hashlib.sha256(data).hexdigest()


def expected(specs, seed: int, step: int, fp8: bool) -> dict:
    """name -> (digest, dtype, shape) of what every rollout worker must receive."""
    from rlsched.weight_sync.executor import quantize_block128
    from rlsched.weight_sync.plan import TensorSpec, quantized, scale_name
    out = {}
    for index, (name, shape, dtype) in enumerate(specs):
        tensor = make_tensor(seed, step, index, shape, dtype)
        if quantized(TensorSpec(name, tuple(shape), dtype), fp8):
            codes, scales = quantize_block128(tensor)
            out[name] = (digest(codes), "uint8", tuple(shape))
            out[scale_name(name)] = (digest(scales), "float32", tuple(scales.shape))
        else:
            out[name] = (digest(tensor), dtype, tuple(shape))
    return out


def _weights(specs, seed: int, step: int, die_at):
    """The stand-in of get_per_tensor_param(): one collective per tensor."""
    import torch
    import torch.distributed as dist
    for index, (name, shape, dtype) in enumerate(specs):
        if die_at is not None and index == die_at:
            os._exit(3)  # this actor rank dies mid-send
        tensor = torch.empty(tuple(shape), dtype=getattr(torch, dtype))
        if dist.get_rank() == 0:
            tensor.copy_(make_tensor(seed, step, index, shape, dtype))
        dist.broadcast(tensor.reshape(-1).view(torch.uint8), src=0)
        yield name, tensor


async def _consume(engine, global_steps):
    received = {}
    async for name, tensor in engine.receive_weights(global_steps=global_steps):
        received[name] = (digest(tensor), str(tensor.dtype).replace("torch.", ""),
                          tuple(tensor.shape))
    return received


def _join_training_world(role: str, rank: int, size: int, store_dir: str, generation: int):
    """verl's actors share a training world (FSDP / Megatron) and its rollout workers a
    gloo world of their own; the backend must not touch either."""
    import torch.distributed as dist
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("gloo", init_method=f"file://{store_dir}/{role}-{generation}",
                            rank=rank, world_size=size, timeout=datetime.timedelta(seconds=5))


def registry(custom_backend_module: str = BACKEND_MODULE):
    """verl's CheckpointEngineRegistry from the stand-in package on disk, after
    importing `custom_backend_module` as verl's import_external_libs does (modules of
    another stand-in that this process imported before are dropped first)."""
    base = sys.modules.get("verl.checkpoint_engine.base")
    if base is None or not str(getattr(base, "__file__", "")).startswith(STANDINS):
        for name in list(sys.modules):
            if name == "verl" or name.startswith("verl.") or name == custom_backend_module:
                del sys.modules[name]
    if STANDINS not in sys.path:
        sys.path.insert(0, STANDINS)
    importlib.import_module(custom_backend_module)
    return importlib.import_module("verl.checkpoint_engine.base").CheckpointEngineRegistry


def _worker(role: str, rank: int, size: int, node: str, config: dict, conn) -> None:
    try:
        os.environ["RLSCHED_NODE_ID"] = node
        os.environ["RLSCHED_WEIGHT_SYNC_HOST"] = "127.0.0.1"
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        import torch.distributed as dist
        _join_training_world(role, rank, size, config["store_dir"], config.get("generation", 0))
        CheckpointEngineRegistry = registry(config.get("custom_backend_module", BACKEND_MODULE))
        engine_kwargs = dict(config.get("engine_kwargs", {}))
        if role == "actor":
            engine = CheckpointEngineRegistry.new(config.get("backend", "rlsched"),
                                                  is_master=(dist.get_rank() == 0),
                                                  bucket_size=config["bucket_size"],
                                                  **engine_kwargs)
        else:
            engine = CheckpointEngineRegistry.new(config.get("backend", "rlsched"),
                                                  bucket_size=config["bucket_size"],
                                                  **engine_kwargs)
        conn.send(("ready", None))
    except BaseException:  # any: reported to the driver
        conn.send(("error", traceback.format_exc()))
        return
    while True:
        method, kwargs = conn.recv()
        try:
            if method == "exit":
                return
            if method == "rejoin":
                _join_training_world(role, rank, size, config["store_dir"], kwargs["generation"])
                result = None
            elif method == "update_weights":
                step = kwargs["global_steps"]
                if role == "actor":
                    weights = _weights(kwargs.get("specs") or config["specs"], config["seed"],
                                       step, kwargs.get("die_at", {}).get(rank))
                    result = asyncio.run(engine.send_weights(weights, global_steps=step))
                else:
                    result = asyncio.run(_consume(engine, step))
            else:
                result = getattr(engine, method)(**kwargs)
            conn.send(("ok", result))
        except BaseException as error:  # any: reported to the driver
            conn.send(("raised", (type(error).__name__, str(error),
                                  getattr(error, "field", ""))))


class World:
    """`actors` actor ranks and `rollouts` rollout workers in processes of their own."""

    def __init__(self, actors: int, rollouts: int, config: dict, actor_nodes, rollout_nodes):
        self.actors, self.rollouts, self.config = actors, rollouts, config
        self.nodes = {"actor": list(actor_nodes), "rollout": list(rollout_nodes)}
        self.ctx = multiprocessing.get_context("fork")
        self.members = [self._start("actor", r) for r in range(actors)]
        self.members += [self._start("rollout", r) for r in range(rollouts)]
        for member in self.members:
            self._expect_ready(member)

    def _start(self, role: str, rank: int, generation: int = 0):
        parent, child = self.ctx.Pipe()
        size = self.actors if role == "actor" else self.rollouts
        config = dict(self.config, generation=generation)
        process = self.ctx.Process(target=_worker, daemon=True,
                                   args=(role, rank, size, self.nodes[role][rank], config, child))
        process.start()
        return {"role": role, "rank": rank, "process": process, "conn": parent}

    @staticmethod
    def _expect_ready(member, timeout: float = 60.0):
        if not member["conn"].poll(timeout):
            raise TimeoutError(f"{member['role']} {member['rank']} did not start")
        status, detail = member["conn"].recv()
        if status != "ready":
            raise RuntimeError(f"{member['role']} {member['rank']}: {detail}")

    def call(self, members, method: str, kwargs_per_member=None, timeout: float = 120.0):
        """Calls `method` on every member at once; returns [(status, result)] in order
        ("lost" for a member that died or did not answer within `timeout`)."""
        kwargs_per_member = kwargs_per_member or [{}] * len(members)
        for member, kwargs in zip(members, kwargs_per_member):
            if member["process"].is_alive():
                member["conn"].send((method, kwargs))
        results = []
        for member in members:
            try:
                ready = member["process"].is_alive() and member["conn"].poll(timeout)
                results.append(member["conn"].recv() if ready else ("lost", None))
            except (EOFError, OSError):
                results.append(("lost", None))
        return results

    def sync(self, global_steps: int, die_at=None, specs=None, timeout: float = 120.0) -> dict:
        """One CheckpointEngineManager.update_weights: returns {"metrics": merged actor
        metrics, "received": per rollout worker, "statuses": per member}. `die_at`:
        {actor rank: the tensor index at which it dies}; `specs`: the tensors the actors'
        generator yields this time (default: the world's)."""
        backend_cls = registry().get(self.config.get("backend", "rlsched"))
        prepared = self.call(self.members, "prepare")
        if any(status != "ok" for status, _ in prepared):
            return {"statuses": prepared}
        metadata = [result for _, result in prepared]
        actor_kwargs, rollout_kwargs = backend_cls.build_topology(self.actors, self.rollouts,
                                                                  metadata)
        for k, v in actor_kwargs.items():
            assert len(v) == self.actors, f"actor_wg_kwargs[{k}]"
        for k, v in rollout_kwargs.items():
            assert len(v) == self.rollouts, f"rollout_kwargs[{k}]"
        per_rank = [{k: v[i] for k, v in actor_kwargs.items()} for i in range(self.actors)]
        per_rank += [{k: v[i] for k, v in rollout_kwargs.items()} for i in range(self.rollouts)]
        joined = self.call(self.members, "init_process_group", per_rank, timeout)
        if any(status != "ok" for status, _ in joined):
            return {"statuses": joined}
        update = {"global_steps": global_steps, "die_at": die_at or {}, "specs": specs}
        statuses = self.call(self.members, "update_weights", [update] * len(self.members),
                             timeout)
        metrics = {}
        for status, result in statuses[:self.actors]:
            if status == "ok" and isinstance(result, dict):
                metrics.update(result)
        received = [result for _, result in statuses[self.actors:]]
        self.call([m for m in self.members if m["process"].is_alive()], "finalize")
        return {"metrics": metrics, "received": received, "statuses": statuses}

    def replace_actor(self, rank: int, generation: int) -> None:
        """A new process for a lost actor rank; the actors' training world made again."""
        survivors = [m for m in self.members[:self.actors] if m["rank"] != rank]
        self.members[rank]["process"].join(timeout=5)
        new = self._start("actor", rank, generation)
        self.members[rank] = new
        self.call(survivors, "rejoin", [{"generation": generation}] * len(survivors))
        self._expect_ready(new)

    def close(self) -> None:
        for member in self.members:
            try:
                if member["process"].is_alive():
                    member["conn"].send(("exit", {}))
            except OSError:
                pass
        for member in self.members:
            member["process"].join(timeout=10)
            if member["process"].is_alive():
                member["process"].kill()
        # The store files of the gloo worlds (the members are gone).
        shutil.rmtree(self.config["store_dir"], ignore_errors=True)
