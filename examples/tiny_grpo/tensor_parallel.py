"""Megatron-style tensor parallelism for the tiny model over a ``torch.distributed`` gloo
group: column-parallel and row-parallel linears and the two conjugate autograd
functions between them.

The split (``tp`` ranks, rank ``r``):

- attention: ``q_proj``, ``k_proj``, ``v_proj`` column-parallel (rank r holds query heads
  ``r*H/tp .. (r+1)*H/tp - 1`` and the KV heads they read, ``r*KV/tp ..``; with grouped
  queries a query group never straddles two ranks), ``o_proj`` row-parallel (the input
  columns of rank r's heads);
- MLP: ``gate_proj`` and ``up_proj`` column-parallel (rows ``r*I/tp ..``), ``down_proj``
  row-parallel (the same columns);
- replicated on every rank: ``embed_tokens``, ``lm_head`` (so the logits are whole on
  every rank and the loss, logprobs and entropy need no vocab-parallel cross entropy;
  with 16 tokens a vocab-parallel head would save nothing), the RMSNorm weights.

A column-parallel linear's input passes through :func:`copy_to_tp` (forward: identity;
backward: all-reduce of the input's gradient, the sum over the ranks' column blocks); a
row-parallel linear's output through :func:`reduce_from_tp` (forward: all-reduce of the
ranks' partial sums; backward: identity). Each all-reduce is an all-gather then a sum in
rank order, so that every rank holds the same bits: the replicated parameters' gradients
are then bitwise equal on all ranks and stay equal after each optimizer step (checked at
every publish, :meth:`TPGroup.check_replicated`).

The shards are the slices Megatron-core holds at TP ``tp`` (``linear_qkv`` fused per query
group and split by whole groups, ``linear_fc1`` = [gate_r; up_r], ``linear_proj`` and
``linear_fc2`` split by input columns), so a rank's Megatron tensors for the weight sync
are rlsched's layout rules applied to its own slices (:func:`megatron_sources`).

Data parallel (:class:`Grid`): ``tp * dp`` processes, trainer rank ``g = d*tp + t``
(Megatron-core's order, TP fastest): DP replica ``d`` is TP group ``d``; the ranks of one
TP rank across the replicas form its DP group, which adds up the replicas' gradients
(:func:`all_reduce_grads`, in DP-rank order: every replica then takes the same optimizer
step and holds the same bits).

``python3 tensor_parallel.py --check --tp 2 [--dp 2] --out FILE`` runs the model in a real
world of ``tp * dp`` processes against the TP-1 model from the same initial state (each
DP replica one of the batch's two micro-batches) and writes the largest differences it
measured (see :func:`check`).
"""

import datetime
import json
import os
import sys
from typing import Dict, List, Optional

import torch
import torch.distributed as dist

# Parameter name suffix -> the dimension a TP rank splits (0: rows, column-parallel;
# 1: columns, row-parallel). Any other parameter is replicated.
_SPLIT = {"self_attn.q_proj.weight": 0, "self_attn.k_proj.weight": 0,
          "self_attn.v_proj.weight": 0, "mlp.gate_proj.weight": 0, "mlp.up_proj.weight": 0,
          "self_attn.o_proj.weight": 1, "mlp.down_proj.weight": 1}


def split_dim(name: str) -> Optional[int]:
    """The dimension a TP rank splits parameter `name` along, None when replicated."""
    for suffix, dim in _SPLIT.items():
        if name.endswith(suffix):
            return dim
    return None


def check_tp(config, tp: int) -> None:
    """Refuses a TP size the model cannot be split by (field and bound named)."""
    if not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tp must be an integer >= 1, got {tp!r}")
    for field in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
        value = getattr(config, field)
        if value % tp:
            raise ValueError(f"config.json: field {field} ({value}) must be a multiple of the "
                             f"trainer's TP size {tp}")


class TPGroup:
    """A tensor-parallel group: rank `rank` of `size` over a gloo process group of its
    own (not the default one: the weight sync's worlds come and go in the same process,
    ``torch.distributed``'s default group, while this one lives as long as the trainer)."""

    def __init__(self, rank: int, size: int, pg=None):
        if not 0 <= rank < size:
            raise ValueError(f"tp rank must be in [0, {size}), got {rank}")
        if size > 1 and pg is None:
            raise ValueError("a TP group of more than one rank needs its process group")
        self.rank, self.size, self.pg = rank, size, pg

    @classmethod
    def join(cls, store_path: str, rank: int, size: int,
             timeout: datetime.timedelta = datetime.timedelta(seconds=600)) -> "TPGroup":
        """Rank `rank` of a group of `size` meeting at the FileStore `store_path`."""
        if size == 1:
            return cls(0, 1)
        store = dist.FileStore(store_path, size)
        return cls(rank, size, dist.ProcessGroupGloo(store, rank, size, timeout))

    def check_identical(self, tensors: Dict[str, torch.Tensor], what: str) -> None:
        """Raises unless `tensors` hold the same bits on every rank of the group."""
        if self.size == 1:
            return
        import hashlib
        h = hashlib.sha256()
        for name in sorted(tensors):
            h.update(name.encode())
            h.update(tensors[name].detach().contiguous().numpy().tobytes())
        mine = torch.frombuffer(bytearray(h.digest()), dtype=torch.uint8)
        digests = self.all_gather(mine)
        if any(not torch.equal(d, digests[0]) for d in digests):
            raise RuntimeError(f"rank {self.rank}: {what} differ between the ranks")

    def all_gather(self, t: torch.Tensor) -> List[torch.Tensor]:
        t = t.contiguous()
        if self.size == 1:
            return [t]
        out = [torch.empty_like(t) for _ in range(self.size)]
        self.pg.allgather([out], [t]).wait()
        return out

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """The sum over the ranks, added in rank order (the same bits on every rank)."""
        if self.size == 1:
            return t
        parts = self.all_gather(t)
        out = parts[0].clone()
        for p in parts[1:]:
            out += p
        return out

    def broadcast_object(self, obj=None, src: int = 0):
        """`obj` of rank `src` (JSON-able) on every rank."""
        if self.size == 1:
            return obj
        opts = dist.BroadcastOptions()
        opts.rootRank = src
        if self.rank == src:
            data = torch.frombuffer(bytearray(json.dumps(obj).encode()), dtype=torch.uint8)
            length = torch.tensor([data.numel()], dtype=torch.int64)
        else:
            length = torch.zeros(1, dtype=torch.int64)
        self.pg.broadcast([length], opts).wait()
        if self.rank != src:
            data = torch.empty(int(length), dtype=torch.uint8)
        self.pg.broadcast([data], opts).wait()
        return json.loads(bytes(data.numpy()).decode())

    def check_replicated(self, model) -> None:
        """Raises unless every replicated parameter holds the same bits on every rank."""
        self.check_identical({n: p for n, p in model.named_parameters()
                              if split_dim(n) is None},
                             "the replicated parameters of the TP ranks")


class Grid:
    """A trainer process's place among ``tp * dp`` processes: its trainer rank
    ``rank = dp_rank * tp + tp_rank`` and three gloo groups of its own (``world``: every
    trainer process, for the calls rank 0 hands on; ``tp``: its DP replica's TP ranks;
    ``dp``: its TP rank in every replica), each on a prefix of one FileStore."""

    def __init__(self, rank: int, tp: int, dp: int, world: TPGroup, tp_group: TPGroup,
                 dp_group: TPGroup):
        self.rank, self.tp_size, self.dp_size = rank, tp, dp
        self.tp_rank, self.dp_rank = rank % tp, rank // tp
        self.world, self.tp, self.dp = world, tp_group, dp_group

    @property
    def size(self) -> int:
        return self.tp_size * self.dp_size

    @classmethod
    def join(cls, store_path: str, rank: int, tp: int, dp: int = 1,
             timeout: datetime.timedelta = datetime.timedelta(seconds=600)) -> "Grid":
        for name, value in (("tp", tp), ("dp", dp)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        size = tp * dp
        if not 0 <= rank < size:
            raise ValueError(f"trainer rank must be in [0, tp*dp = {size}), got {rank}")
        t, d = rank % tp, rank // tp
        store = dist.FileStore(store_path, size) if size > 1 else None

        def group(name, local, n):
            if n == 1:
                return TPGroup(0, 1)
            return TPGroup(local, n, dist.ProcessGroupGloo(dist.PrefixStore(name, store),
                                                           local, n, timeout))

        # Made in the same order on every process: the world, then TP group d, then
        # DP group t.
        return cls(rank, tp, dp, group("world", rank, size), group(f"tp{d}", t, tp),
                   group(f"dp{t}", d, dp))


def all_reduce_grads(model, group: TPGroup) -> None:
    """Sums every parameter's gradient over the DP group (in DP-rank order; a
    parameter without a gradient on a rank counts zeros there)."""
    if group.size == 1:
        return
    for _, p in sorted(model.named_parameters()):
        grad = p.grad if p.grad is not None else torch.zeros_like(p)
        p.grad = group.all_reduce(grad.detach())


class _CopyToTP(torch.autograd.Function):
    """Megatron's f: identity forward, all-reduce of the gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return ctx.group.all_reduce(grad), None


class _ReduceFromTP(torch.autograd.Function):
    """Megatron's g: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        return group.all_reduce(x)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def copy_to_tp(x: torch.Tensor, group: Optional[TPGroup]) -> torch.Tensor:
    """The input of column-parallel linears."""
    return x if group is None or group.size == 1 else _CopyToTP.apply(x, group)


def reduce_from_tp(x: torch.Tensor, group: Optional[TPGroup]) -> torch.Tensor:
    """The output of a row-parallel linear (the ranks' partial sums added)."""
    return x if group is None or group.size == 1 else _ReduceFromTP.apply(x, group)


def shard_of(name: str, full: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """Rank `rank`'s slice of the full parameter `name`."""
    dim = split_dim(name)
    if dim is None or size == 1:
        return full
    n = full.shape[dim] // size
    return full.narrow(dim, rank * n, n)


def load_full_state(model, state: Dict[str, torch.Tensor]) -> None:
    """Loads the full HF-named `state` into `model` (a TP rank's: its slices)."""
    group = model.tp
    rank, size = (0, 1) if group is None else (group.rank, group.size)
    model.load_state_dict({k: shard_of(k, v, rank, size).clone() for k, v in state.items()})


def full_state(model) -> Dict[str, torch.Tensor]:
    """The full HF-named parameters (the ranks' slices gathered; collective), detached
    copies."""
    group = model.tp
    out = {}
    for name, t in model.state_dict().items():
        dim = split_dim(name)
        if group is None or group.size == 1 or dim is None:
            out[name] = t.detach().clone()
        else:
            out[name] = torch.cat(group.all_gather(t.detach()), dim=dim)
    return out


def megatron_sources(model, layout, dp: int = 1, dp_rank: int = 0) -> Dict[str, torch.Tensor]:
    """This rank's tensors in Megatron-core's layout at its TP size (and DP size `dp`,
    replica `dp_rank`: trainer rank dp_rank * tp + tp rank; names and slices by rlsched's
    rules, ``layouts.megatron_shards``), from its own slices only: the slices
    are placed at their rank's place in zero tensors of the full shapes, whose other
    ranks' parts the rule never reads."""
    from rlsched.weight_sync import layouts as lay

    group = model.tp
    rank, size = (0, 1) if group is None else (group.rank, group.size)
    full = {}
    for name, t in model.state_dict().items():
        dim = split_dim(name)
        if size == 1 or dim is None:
            full[name] = t.detach()
            continue
        shape = list(t.shape)
        shape[dim] *= size
        whole = torch.zeros(shape, dtype=t.dtype)
        whole.narrow(dim, rank * t.shape[dim], t.shape[dim]).copy_(t.detach())
        full[name] = whole
    return lay.megatron_shards(layout, lay.Train(tp=size, dp=dp), dp_rank * size + rank, full)


def clip_grad_norm(model, max_norm: float) -> float:
    """``torch.nn.utils.clip_grad_norm_`` over the full model (collective): the norm of
    every full gradient, the sharded parameters' squares summed over the ranks and the
    replicated ones' counted once; every rank scales by the same factor."""
    group = model.tp
    sharded = torch.zeros((), dtype=torch.float32)
    replicated = torch.zeros((), dtype=torch.float32)
    params = [(n, p) for n, p in model.named_parameters() if p.grad is not None]
    for name, p in params:
        sq = p.grad.detach().float().pow(2).sum()
        if split_dim(name) is None:
            replicated += sq
        else:
            sharded += sq
    if group is not None and group.size > 1:
        sharded = group.all_reduce(sharded.reshape(1)).reshape(())
    total = torch.sqrt(sharded + replicated)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for _, p in params:
        p.grad.detach().mul_(coef)
    return float(total)


# ---------------------------------------------------------------------------------
# The check: the TP model against the TP-1 model, in a real world of tp processes.

def _check_batch(seed: int):
    """A fixed GRPO batch (random tokens, logprobs and per-token advantages)."""
    g = torch.Generator().manual_seed(seed)
    batch = []
    for i in range(6):
        prompt = torch.randint(0, 13, (5,), generator=g).tolist()
        n = 3 + i % 2
        batch.append({"prompt": prompt,
                      "response": torch.randint(0, 16, (n,), generator=g).tolist(),
                      "logprobs": (-torch.rand(n, generator=g) * 3).tolist(),
                      "advantage": (torch.randn(n, generator=g)).tolist() if i % 2
                      else float(torch.randn(1, generator=g))})
    return batch


def _run_check(model, clip_norm, seed: int, steps: int, dp: Optional[TPGroup] = None) -> dict:
    """Forward, logprobs and gradients on a fixed batch in two micro-batches (with a DP
    group, replica d takes micro-batches d, d + dp, ... and the gradients are summed over
    the replicas), then `steps` Adam steps with the gradient's norm clipped: what the
    comparison needs (full tensors)."""
    import torch.nn.functional as F

    from grpo import policy_loss
    batch = _check_batch(seed)
    ids = torch.tensor([b["prompt"] + b["response"] for b in batch[0:4:2]])
    out = {"initial": full_state(model)}
    with torch.no_grad():
        logits, _ = model(ids)
        out["logits"] = logits
        out["logprobs"] = F.log_softmax(logits.float(), -1)
        # The KV cache: the last token after a prefill of the others.
        _, cache = model(ids[:, :-1])
        step_logits, _ = model(ids[:, -1:], cache)
        out["cached_logits"] = step_logits
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    tokens = sum(len(b["response"]) for b in batch)
    for step in range(steps):
        optimizer.zero_grad()
        loss_sum = torch.zeros(1, dtype=torch.float64)
        parts = (batch[:2], batch[2:])  # two micro-batches
        if dp is not None:
            parts = parts[dp.rank::dp.size]
        for part in parts:
            loss, _ = policy_loss(model, part, entropy_coef=0.01)
            (loss / tokens).backward()
            loss_sum += float(loss)
        if dp is not None:
            all_reduce_grads(model, dp)
            loss_sum = dp.all_reduce(loss_sum)
        if step == 0:
            out["loss"] = loss_sum[0].float()
            out["grads"] = _full_grads(model)
        out[f"norm{step}"] = torch.tensor(clip_norm(model, 0.5))
        optimizer.step()
    out["trained"] = full_state(model)
    return out


def _full_grads(model) -> Dict[str, torch.Tensor]:
    group = model.tp
    out = {}
    for name, p in model.named_parameters():
        dim = split_dim(name)
        g = p.grad.detach()
        out[name] = (torch.cat(group.all_gather(g), dim=dim)
                     if group is not None and group.size > 1 and dim is not None else g.clone())
    return out


def _flatten(d: dict, prefix: str = "") -> Dict[str, torch.Tensor]:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}/"))
        else:
            out[prefix + k] = v
    return out


def check(tp: int, store_path: str, rank: int, seed: int = 0, steps: int = 3,
          dp: int = 1) -> Optional[dict]:
    """Trainer rank `rank` of the check: builds the TP-`tp` model (DP replica rank // tp
    of `dp`) from the initial state of `seed` and runs :func:`_run_check`; rank 0 also
    runs the TP-1 model and returns, per quantity, the largest absolute difference
    (``initial``: the gathered initial weights, 0 when byte-identical), and whether the
    replicated parameters held the same bits on every TP rank after training (and every
    parameter on every DP replica)."""
    from model import TinyLlama, Config, load_model

    torch.manual_seed(seed)
    grid = Grid.join(store_path, rank, tp, dp, datetime.timedelta(seconds=120))
    reference = load_model(seed=seed)
    model = TinyLlama(Config.load(), tp=grid.tp)
    load_full_state(model, reference.state_dict())
    got = _flatten(_run_check(model, clip_grad_norm, seed, steps,
                              grid.dp if dp > 1 else None))
    replicated_equal = True
    try:
        grid.tp.check_replicated(model)
        grid.dp.check_identical(dict(model.named_parameters()), "the DP replicas' parameters")
    except RuntimeError:
        replicated_equal = False
    # Every rank's verdict to rank 0.
    verdicts = grid.world.all_gather(torch.tensor([int(replicated_equal)]))
    replicated_equal = all(int(v) for v in verdicts)
    if rank != 0:
        return None
    want = _flatten(_run_check(reference, lambda m, n: float(
        torch.nn.utils.clip_grad_norm_(m.parameters(), n)), seed, steps))
    assert set(got) == set(want), (sorted(set(got) ^ set(want)))
    diffs: Dict[str, float] = {}
    for key in sorted(want):
        kind = key.split("/")[0]
        d = float((got[key].double() - want[key].double()).abs().max())
        diffs[kind] = max(diffs.get(kind, 0.0), d)
    scale = {k.split("/")[0]: 0.0 for k in want}
    for key in want:
        kind = key.split("/")[0]
        scale[kind] = max(scale[kind], float(want[key].abs().max()))
    return {"tp": tp, "dp": dp, "steps": steps, "max_abs_diff": diffs, "max_abs_value": scale,
            "replicated_identical": replicated_equal,
            "initial_identical": all(torch.equal(got[k], want[k]) for k in want
                                     if k.startswith("initial/"))}


def main(argv=None) -> int:
    import argparse
    import subprocess
    import tempfile

    parser = argparse.ArgumentParser(description="The TP model against the TP-1 model")
    parser.add_argument("--check", action="store_true", required=True)
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--dp", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--store", default=None)
    parser.add_argument("--out", default=None, help="rank 0: write the differences (JSON)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    children = []
    if args.rank == 0 and args.store is None:
        args.store = os.path.join(tempfile.mkdtemp(prefix="tp-check-"), "store")
        for r in range(1, args.tp * args.dp):
            children.append(subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--check", "--tp", str(args.tp),
                 "--dp", str(args.dp),
                 "--seed", str(args.seed), "--steps", str(args.steps), "--rank", str(r),
                 "--store", args.store]))
    result = check(args.tp, args.store, args.rank, args.seed, args.steps, args.dp)
    status = 0
    for c in children:
        status |= c.wait()
    if result is not None:
        text = json.dumps(result, indent=1)
        if args.out:
            with open(args.out, "w") as f:
                f.write(text)
        print(text)
    return status


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    status = main()
    sys.stdout.flush()
    os._exit(status)
