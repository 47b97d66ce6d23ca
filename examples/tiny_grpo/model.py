"""A tiny decoder-only transformer with the Hugging Face Llama parameter names and shapes.

The parameters are named as ``LlamaForCausalLM``'s state dict names them
(``model.embed_tokens.weight``, ``model.layers.N.self_attn.{q,k,v,o}_proj.weight``,
``model.layers.N.mlp.{gate,up,down}_proj.weight``, ``model.layers.N.input_layernorm.weight``,
``model.layers.N.post_attention_layernorm.weight``, ``model.norm.weight``,
``lm_head.weight``), with the shapes its ``config.json`` gives (grouped-query attention,
SwiGLU MLP, RMSNorm, rotary position embeddings, no biases), so that rlsched's resharding
planner reads ``config.json`` as it reads a real Llama.

Two paths: :meth:`TinyLlama.forward` over whole sequences (training, prefill), with an
optional KV cache that it extends (decoding one token at a time, batched over
sequences of equal length).

``TinyLlama(config, tp=group)`` is one rank of the Megatron-style tensor-parallel model
(tensor_parallel.py): its attention and MLP projections hold the rank's slices under the
same names, the embedding, lm_head and norms are replicated.
"""

import json
import math
import os
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from tensor_parallel import TPGroup, check_tp, copy_to_tp, reduce_from_tp

CONFIG_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "config.json")

KVCache = List[Tuple[torch.Tensor, torch.Tensor]]  # per layer: k, v [B, kv_heads, T, head_dim]


class Config:
    """The fields of an HF Llama ``config.json`` this model uses."""

    def __init__(self, data: dict):
        def need(key, lo=1):
            if key not in data:
                raise ValueError(f"config.json: field {key} is missing")
            value = data[key]
            if not isinstance(value, int) or value < lo:
                raise ValueError(f"config.json: field {key} must be an integer >= {lo}, "
                                 f"got {value!r}")
            return value

        self.vocab_size = need("vocab_size")
        self.hidden_size = need("hidden_size")
        self.intermediate_size = need("intermediate_size")
        self.num_hidden_layers = need("num_hidden_layers")
        self.num_attention_heads = need("num_attention_heads")
        self.num_key_value_heads = need("num_key_value_heads")
        self.max_position_embeddings = need("max_position_embeddings")
        self.rms_norm_eps = float(data.get("rms_norm_eps", 1e-5))
        self.rope_theta = float(data.get("rope_theta", 10000.0))
        if data.get("tie_word_embeddings", False):
            raise ValueError("config.json: field tie_word_embeddings must be false here")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError("config.json: hidden_size must be a multiple of "
                             "num_attention_heads")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("config.json: num_attention_heads must be a multiple of "
                             "num_key_value_heads")
        self.head_dim = self.hidden_size // self.num_attention_heads

    @classmethod
    def load(cls, path: str = CONFIG_PATH) -> "Config":
        with open(path) as f:
            return cls(json.load(f))


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Rotary:
    """HF Llama's rotary embedding (the half-split convention)."""

    def __init__(self, head_dim: int, max_positions: int, theta: float):
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        t = torch.arange(max_positions, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos = emb.cos()
        self.sin = emb.sin()

    def apply(self, x, positions):
        # x [B, heads, T, D]; positions [T]
        cos = self.cos[positions][None, None]
        sin = self.sin[positions][None, None]
        return x * cos + _rotate_half(x) * sin


class Attention(nn.Module):
    """Grouped-query attention; with a TP group the rank's heads only (q, k, v
    column-parallel, o row-parallel)."""

    def __init__(self, c: Config, tp: Optional[TPGroup] = None):
        super().__init__()
        size = 1 if tp is None else tp.size
        self.tp = tp
        self.heads, self.kv_heads, self.head_dim = (c.num_attention_heads // size,
                                                    c.num_key_value_heads // size, c.head_dim)
        self.q_proj = nn.Linear(c.hidden_size, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, c.hidden_size, bias=False)

    def forward(self, x, rotary: Rotary, positions, past: Optional[Tuple], mask):
        b, t, _ = x.shape
        x = copy_to_tp(x, self.tp)
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = rotary.apply(q, positions), rotary.apply(k, positions)
        if past is not None:
            k = torch.cat((past[0], k), dim=2)
            v = torch.cat((past[1], v), dim=2)
        present = (k, v)
        repeat = self.heads // self.kv_heads
        kk = k.repeat_interleave(repeat, dim=1) if repeat > 1 else k
        vv = v.repeat_interleave(repeat, dim=1) if repeat > 1 else v
        scores = q @ kk.transpose(-1, -2) / math.sqrt(self.head_dim)
        if mask is not None:
            scores = scores + mask
        out = torch.softmax(scores, dim=-1) @ vv
        out = out.transpose(1, 2).reshape(b, t, self.heads * self.head_dim)
        return reduce_from_tp(self.o_proj(out), self.tp), present


class MLP(nn.Module):
    """SwiGLU; with a TP group the rank's rows of gate and up (column-parallel) and
    columns of down (row-parallel)."""

    def __init__(self, c: Config, tp: Optional[TPGroup] = None):
        super().__init__()
        self.tp = tp
        inner = c.intermediate_size // (1 if tp is None else tp.size)
        self.gate_proj = nn.Linear(c.hidden_size, inner, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, inner, bias=False)
        self.down_proj = nn.Linear(inner, c.hidden_size, bias=False)

    def forward(self, x):
        x = copy_to_tp(x, self.tp)
        return reduce_from_tp(self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x)),
                              self.tp)


class DecoderLayer(nn.Module):
    def __init__(self, c: Config, tp: Optional[TPGroup] = None):
        super().__init__()
        self.self_attn = Attention(c, tp)
        self.mlp = MLP(c, tp)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, x, rotary, positions, past, mask):
        h, present = self.self_attn(self.input_layernorm(x), rotary, positions, past, mask)
        x = x + h
        return x + self.mlp(self.post_attention_layernorm(x)), present


class _Body(nn.Module):
    """``model.*`` of LlamaForCausalLM."""

    def __init__(self, c: Config, tp: Optional[TPGroup] = None):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(c, tp) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class TinyLlama(nn.Module):
    def __init__(self, config: Config, tp: Optional[TPGroup] = None):
        super().__init__()
        if tp is not None:
            check_tp(config, tp.size)
        self.config = config
        self.tp = tp
        self.model = _Body(config, tp)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.rotary = Rotary(config.head_dim, config.max_position_embeddings, config.rope_theta)

    def init_weights(self, seed: int) -> None:
        """Deterministic initialisation (normal, std 0.02 as HF Llama; norms 1). A TP
        rank loads its slices of the full model instead (tensor_parallel.load_full_state)."""
        if self.tp is not None and self.tp.size > 1:
            raise ValueError("init_weights: a TP rank loads its slices of the full model "
                             "(tensor_parallel.load_full_state)")
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in sorted(self.named_parameters()):
                if name.endswith("layernorm.weight") or name == "model.norm.weight":
                    p.fill_(1.0)
                else:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.02)

    def forward(self, ids: torch.Tensor, cache: Optional[KVCache] = None):
        """ids [B, T] -> logits [B, T, vocab] and the KV cache extended by these T tokens.
        With ``cache``, the T tokens follow the cached ones (all rows equally long)."""
        b, t = ids.shape
        start = 0 if cache is None else cache[0][0].shape[2]
        if start + t > self.config.max_position_embeddings:
            raise ValueError(f"sequence of {start + t} tokens exceeds max_position_embeddings "
                             f"{self.config.max_position_embeddings}")
        positions = torch.arange(start, start + t)
        mask = None
        if t > 1:
            # Query i (at start + i) sees keys 0..start + i.
            keys = torch.arange(start + t)
            mask = torch.where(keys[None, :] <= positions[:, None], 0.0, float("-inf"))
        x = self.model.embed_tokens(ids)
        presents = []
        for i, layer in enumerate(self.model.layers):
            x, present = layer(x, self.rotary, positions, None if cache is None else cache[i], mask)
            presents.append(present)
        return self.lm_head(self.model.norm(x)), presents


def load_model(path: str = CONFIG_PATH, seed: int = 0) -> TinyLlama:
    model = TinyLlama(Config.load(path))
    model.init_weights(seed)
    return model


def weights_digest(state) -> str:
    """SHA-256 over the parameters' names and bytes, in name order: equal digests mean
    byte-identical weights."""
    import hashlib
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().contiguous().cpu()
        h.update(name.encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()
