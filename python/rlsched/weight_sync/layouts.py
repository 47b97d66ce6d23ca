"""Deterministic full tensors of a model and its shards in the trainer's and the
engines' layouts, built with torch tensor operations from the frameworks' rules, for
checking the executor (``rlsched.weight_sync.launcher --check``).

This is a model of the two frameworks written independently of the C++ planner
(``rollout/src/layout.cc``) and of its verifier: the planner's Piece lists are never
read here. Conventions (``rlsched/rollout/layout.h``, ``verify.h``):

- Megatron-core (trainer): dense rank order tp fastest, then cp, dp, pp; experts etp
  fastest, then ep, expert-dp, pp. ``linear_qkv`` fuses per query group [q heads of the
  group; k; v] and TP splits whole groups; ``linear_fc1`` is [gate_r; up_r];
  ``linear_proj`` / ``linear_fc2`` split the input dim; the vocabulary is padded to a
  multiple of 128*tp (padding rows hold :data:`MEGATRON_PAD`) and split by rows; layers
  over pp*vpp chunks (chunk v*pp + r on stage r); experts contiguous per EP rank, split
  by etp; tied embeddings: ``output_layer.weight`` on the last chunk only when it is not
  the first. Names carry the global layer index and global expert id.
- vLLM (engines): ``qkv_proj`` [Q_r; K_r; V_r] with KV heads replicated when
  tp > kv heads, ``gate_up_proj`` [gate_r; up_r], ``o_proj`` / ``down_proj`` split the
  input dim, vocabulary padded to 64 (zero rows) and split by rows, FusedMoE
  ``w13_weight`` [experts, 2*I/tp, hidden] / ``w2_weight`` [experts, hidden, I/tp] (whole
  experts with expert parallelism, contiguous, the first E % tp ranks one more, or
  round-robin), DeepSeek ``fused_qkv_a_proj`` = [q_a_proj; kv_a_proj_with_mqa].
"""

from __future__ import annotations

import dataclasses
import json
import zlib
from typing import Dict, List, Optional, Tuple

import torch

from rlsched.errors import InvalidArgumentError

# The content of Megatron's vocabulary padding rows (bf16 bits 0x7EAD, a finite value
# that no full tensor holds: full tensors draw from [1, 0x7800)).
MEGATRON_PAD = 0x7EAD

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclasses.dataclass
class Model:
    family: str
    hidden: int
    ffn: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    experts: int = 0
    moe_ffn: int = 0
    shared_experts: int = 0
    first_dense: int = 0
    moe_step: int = 1
    moe_phase: int = 0
    dense_layers: Tuple[int, ...] = ()
    router_bias: bool = False
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope: int = 0
    qk_rope: int = 0
    v_head_dim: int = 0
    dtype: torch.dtype = torch.bfloat16

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    def is_moe_layer(self, layer: int) -> bool:
        return (self.experts > 0 and layer >= self.first_dense
                and layer % self.moe_step == self.moe_phase and layer not in self.dense_layers)


def parse_config(text: str) -> Model:
    """The fields of a Hugging Face config.json that shape the tensors."""
    j = json.loads(text)
    family = j.get("model_type") or ""
    known = ("llama", "qwen2", "qwen3", "qwen3_moe", "deepseek_v3")
    if family not in known:
        raise InvalidArgumentError(f"config.model_type: {family!r} is not one of "
                                   f"{', '.join(known)}", "config.model_type")
    heads = int(j["num_attention_heads"])
    m = Model(family=family, hidden=int(j["hidden_size"]), ffn=int(j["intermediate_size"]),
              layers=int(j["num_hidden_layers"]), heads=heads,
              kv_heads=int(j.get("num_key_value_heads", heads)),
              head_dim=int(j.get("head_dim") or int(j["hidden_size"]) // heads),
              vocab=int(j["vocab_size"]), tied=bool(j.get("tie_word_embeddings", False)),
              dtype=_DTYPES[j.get("torch_dtype", "bfloat16")])
    if family == "qwen2":
        m.qkv_bias = True
    elif family in ("llama", "qwen3", "qwen3_moe"):
        m.qkv_bias = bool(j.get("attention_bias", False))
    m.qk_norm = family in ("qwen3", "qwen3_moe")
    if family == "qwen3_moe":
        m.experts = int(j["num_experts"])
        m.moe_ffn = int(j["moe_intermediate_size"])
        m.moe_step = int(j.get("decoder_sparse_step", 1))
        m.moe_phase = m.moe_step - 1
        m.dense_layers = tuple(j.get("mlp_only_layers") or ())
    elif family == "deepseek_v3":
        m.experts = int(j["n_routed_experts"])
        m.moe_ffn = int(j["moe_intermediate_size"])
        m.shared_experts = int(j.get("n_shared_experts", 0))
        m.first_dense = int(j.get("first_k_dense_replace", 0))
        m.moe_step = int(j.get("moe_layer_freq", 1))
        m.router_bias = j.get("topk_method", "noaux_tc") == "noaux_tc"
        m.q_lora_rank = int(j.get("q_lora_rank") or 0)
        m.kv_lora_rank = int(j["kv_lora_rank"])
        m.qk_nope = int(j["qk_nope_head_dim"])
        m.qk_rope = int(j["qk_rope_head_dim"])
        m.v_head_dim = int(j["v_head_dim"])
    return m


# ---------------------------------------------------------------------------------
# Full tensors.

def hf_shapes(m: Model) -> Dict[str, Tuple[Tuple[int, ...], torch.dtype]]:
    """Every full Hugging Face tensor: name -> (shape, dtype)."""
    h, out = m.hidden, {}

    def add(name, *shape, dtype=None):
        out[name] = (tuple(shape), dtype or m.dtype)

    add("model.embed_tokens.weight", m.vocab, h)
    for i in range(m.layers):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        add(p + "input_layernorm.weight", h)
        if m.mla:
            qk = m.qk_nope + m.qk_rope
            if m.q_lora_rank:
                add(a + "q_a_proj.weight", m.q_lora_rank, h)
                add(a + "q_a_layernorm.weight", m.q_lora_rank)
                add(a + "q_b_proj.weight", m.heads * qk, m.q_lora_rank)
            else:
                add(a + "q_proj.weight", m.heads * qk, h)
            add(a + "kv_a_proj_with_mqa.weight", m.kv_lora_rank + m.qk_rope, h)
            add(a + "kv_a_layernorm.weight", m.kv_lora_rank)
            add(a + "kv_b_proj.weight", m.heads * (m.qk_nope + m.v_head_dim), m.kv_lora_rank)
            add(a + "o_proj.weight", h, m.heads * m.v_head_dim)
        else:
            q, kv = m.heads * m.head_dim, m.kv_heads * m.head_dim
            add(a + "q_proj.weight", q, h)
            add(a + "k_proj.weight", kv, h)
            add(a + "v_proj.weight", kv, h)
            if m.qkv_bias:
                add(a + "q_proj.bias", q)
                add(a + "k_proj.bias", kv)
                add(a + "v_proj.bias", kv)
            if m.qk_norm:
                add(a + "q_norm.weight", m.head_dim)
                add(a + "k_norm.weight", m.head_dim)
            add(a + "o_proj.weight", h, q)
        add(p + "post_attention_layernorm.weight", h)

        def mlp(prefix, f):
            add(prefix + "gate_proj.weight", f, h)
            add(prefix + "up_proj.weight", f, h)
            add(prefix + "down_proj.weight", h, f)

        if m.is_moe_layer(i):
            add(p + "mlp.gate.weight", m.experts, h)
            if m.router_bias:
                add(p + "mlp.gate.e_score_correction_bias", m.experts, dtype=torch.float32)
            for e in range(m.experts):
                mlp(p + f"mlp.experts.{e}.", m.moe_ffn)
            if m.shared_experts:
                mlp(p + "mlp.shared_experts.", m.shared_experts * m.moe_ffn)
        else:
            mlp(p + "mlp.", m.ffn)
    add("model.norm.weight", h)
    if not m.tied:
        add("lm_head.weight", m.vocab, h)
    return out


def full_tensors(m: Model) -> Dict[str, torch.Tensor]:
    """Deterministic full tensors: the bits of each element drawn from a generator seeded
    by the CRC-32 of the tensor's name, in [1, 0x7800) (finite and non-zero in bf16 and
    fp16, never :data:`MEGATRON_PAD`); fp32 tensors likewise in their high half."""
    out = {}
    for name, (shape, dtype) in hf_shapes(m).items():
        g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
        if dtype == torch.float32:
            bits = torch.randint(1, 0x7800, shape, generator=g, dtype=torch.int32) << 16
            out[name] = bits.view(torch.float32)
        else:
            bits = torch.randint(1, 0x7800, shape, generator=g, dtype=torch.int16)
            out[name] = bits.view(dtype)
    return out


# ---------------------------------------------------------------------------------
# Megatron-core.

@dataclasses.dataclass
class Train:
    tp: int = 1
    pp: int = 1
    vpp: int = 1
    ep: int = 1
    etp: int = 1
    cp: int = 1
    dp: int = 1
    first_stage_layers: Optional[int] = None
    last_stage_layers: Optional[int] = None

    @property
    def world(self) -> int:
        return self.tp * self.cp * self.dp * self.pp


def _round_up(n: int, k: int) -> int:
    return (n + k - 1) // k * k


def _rows(t: torch.Tensor, part: int, parts: int) -> torch.Tensor:
    n = t.shape[0] // parts
    return t[part * n:(part + 1) * n]


def _cols(t: torch.Tensor, part: int, parts: int) -> torch.Tensor:
    n = t.shape[-1] // parts
    return t[..., part * n:(part + 1) * n]


def _gate_up(gate, up, part, parts):
    return torch.cat([_rows(gate, part, parts), _rows(up, part, parts)])


def _pad_rows(t: torch.Tensor, rows: int, value_bits: int) -> torch.Tensor:
    """Appends rows whose elements hold `value_bits` (16-bit pattern; in the high half of
    a 4-byte element) up to `rows` rows."""
    wide = t.element_size() == 4
    pad = torch.full((rows - t.shape[0],) + tuple(t.shape[1:]),
                     value_bits << 16 if wide else value_bits,
                     dtype=torch.int32 if wide else torch.int16)
    return torch.cat([t, pad.view(t.dtype)])


def chunk_layers(m: Model, t: Train) -> List[Tuple[int, int]]:
    """[begin, end) of each model chunk v*pp + r, as Megatron-core builds them
    (even split, or the first / last stage's layers given)."""
    out = []
    for c in range(t.pp * t.vpp):
        r, v = c % t.pp, c // t.pp
        if t.first_stage_layers is None and t.last_stage_layers is None:
            count = m.layers // t.pp // t.vpp
            offset = v * (m.layers // t.vpp) + r * count
        else:
            first = t.first_stage_layers or 0
            last = t.last_stage_layers or 0
            middle_stages = (t.pp - (t.first_stage_layers is not None)
                             - (t.last_stage_layers is not None))
            middle_layers = m.layers - first - last
            per_rank = middle_layers // middle_stages if middle_stages else 0
            if r == 0 and t.first_stage_layers is not None:
                per_rank = first
            if r == t.pp - 1 and t.last_stage_layers is not None:
                per_rank = last
            count = per_rank // t.vpp
            fc, lc, mc = first // t.vpp, last // t.vpp, middle_layers // t.vpp
            rnd = fc + mc + lc
            mid_rank = r - 1 if t.first_stage_layers is not None else r
            offset = v * rnd if r == 0 else (
                v * rnd + fc + mid_rank * (mc // middle_stages if middle_stages else 0))
        out.append((offset, offset + count))
    return out


def megatron_shards(m: Model, t: Train, rank: int,
                    full: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Trainer rank `rank`'s local tensors (contiguous copies)."""
    per_stage = t.tp * t.cp * t.dp
    pp, in_stage = divmod(rank, per_stage)
    tp_r = in_stage % t.tp
    etp_r = in_stage % t.etp
    ep_r = (in_stage // t.etp) % t.ep
    chunks = chunk_layers(m, t)
    last_chunk = t.pp * t.vpp - 1
    out: Dict[str, torch.Tensor] = {}

    def vocab(name):
        f = full[name]
        return _rows(_pad_rows(f, _round_up(m.vocab, 128 * t.tp), MEGATRON_PAD), tp_r, t.tp)

    for v in range(t.vpp):
        chunk = v * t.pp + pp
        if chunk == 0:
            out["embedding.word_embeddings.weight"] = vocab("model.embed_tokens.weight")
        for i in range(*chunks[chunk]):
            hf, mg = f"model.layers.{i}.", f"decoder.layers.{i}."
            a, sa = hf + "self_attn.", mg + "self_attention."
            if m.mla:
                out[mg + "input_layernorm.weight"] = full[hf + "input_layernorm.weight"]
                if m.q_lora_rank:
                    out[sa + "linear_q_down_proj.weight"] = full[a + "q_a_proj.weight"]
                    out[sa + "linear_q_up_proj.layer_norm_weight"] = (
                        full[a + "q_a_layernorm.weight"])
                    out[sa + "linear_q_up_proj.weight"] = _rows(
                        full[a + "q_b_proj.weight"], tp_r, t.tp)
                else:
                    out[sa + "linear_q_proj.weight"] = _rows(full[a + "q_proj.weight"], tp_r, t.tp)
                out[sa + "linear_kv_down_proj.weight"] = full[a + "kv_a_proj_with_mqa.weight"]
                out[sa + "linear_kv_up_proj.layer_norm_weight"] = full[a + "kv_a_layernorm.weight"]
                out[sa + "linear_kv_up_proj.weight"] = _rows(
                    full[a + "kv_b_proj.weight"], tp_r, t.tp)
                out[sa + "linear_proj.weight"] = _cols(full[a + "o_proj.weight"], tp_r, t.tp)
            else:
                d, groups = m.head_dim, m.kv_heads
                qg = m.heads // groups

                def fused(q, k, v_):
                    parts = []
                    for g in range(groups):
                        parts += [q[g * qg * d:(g + 1) * qg * d], k[g * d:(g + 1) * d],
                                  v_[g * d:(g + 1) * d]]
                    return _rows(torch.cat(parts), tp_r, t.tp)

                out[sa + "linear_qkv.layer_norm_weight"] = full[hf + "input_layernorm.weight"]
                out[sa + "linear_qkv.weight"] = fused(full[a + "q_proj.weight"],
                                                      full[a + "k_proj.weight"],
                                                      full[a + "v_proj.weight"])
                if m.qkv_bias:
                    out[sa + "linear_qkv.bias"] = fused(full[a + "q_proj.bias"],
                                                        full[a + "k_proj.bias"],
                                                        full[a + "v_proj.bias"])
                if m.qk_norm:
                    out[sa + "q_layernorm.weight"] = full[a + "q_norm.weight"]
                    out[sa + "k_layernorm.weight"] = full[a + "k_norm.weight"]
                out[sa + "linear_proj.weight"] = _cols(full[a + "o_proj.weight"], tp_r, t.tp)
            norm = full[hf + "post_attention_layernorm.weight"]
            if not m.is_moe_layer(i):
                out[mg + "mlp.linear_fc1.layer_norm_weight"] = norm
                out[mg + "mlp.linear_fc1.weight"] = _gate_up(full[hf + "mlp.gate_proj.weight"],
                                                             full[hf + "mlp.up_proj.weight"],
                                                             tp_r, t.tp)
                out[mg + "mlp.linear_fc2.weight"] = _cols(full[hf + "mlp.down_proj.weight"],
                                                          tp_r, t.tp)
            else:
                out[mg + "pre_mlp_layernorm.weight"] = norm
                out[mg + "mlp.router.weight"] = full[hf + "mlp.gate.weight"]
                if m.router_bias:
                    out[mg + "mlp.router.expert_bias"] = (
                        full[hf + "mlp.gate.e_score_correction_bias"])
                if m.shared_experts:
                    s = hf + "mlp.shared_experts."
                    out[mg + "mlp.shared_experts.linear_fc1.weight"] = _gate_up(
                        full[s + "gate_proj.weight"], full[s + "up_proj.weight"], tp_r, t.tp)
                    out[mg + "mlp.shared_experts.linear_fc2.weight"] = _cols(
                        full[s + "down_proj.weight"], tp_r, t.tp)
                local = m.experts // t.ep
                for e in range(ep_r * local, (ep_r + 1) * local):
                    x = hf + f"mlp.experts.{e}."
                    y = mg + f"mlp.experts.local_experts.{e}."
                    out[y + "linear_fc1.weight"] = _gate_up(
                        full[x + "gate_proj.weight"], full[x + "up_proj.weight"], etp_r, t.etp)
                    out[y + "linear_fc2.weight"] = _cols(full[x + "down_proj.weight"], etp_r, t.etp)
        if chunk == last_chunk:
            out["decoder.final_layernorm.weight"] = full["model.norm.weight"]
            if not m.tied:
                out["output_layer.weight"] = vocab("lm_head.weight")
            elif last_chunk != 0:
                out["output_layer.weight"] = vocab("model.embed_tokens.weight")
    return {k: v.contiguous().clone() for k, v in out.items()}


# ---------------------------------------------------------------------------------
# vLLM.

@dataclasses.dataclass
class Infer:
    tp: int = 1
    replicas: int = 1
    expert_parallel: bool = False
    round_robin_experts: bool = False


def engine_experts(m: Model, infer: Infer, r: int) -> Tuple[List[int], int, int]:
    """(global experts on engine TP rank r, expert TP size, expert TP rank)."""
    if not infer.expert_parallel or infer.tp == 1:
        return list(range(m.experts)), infer.tp, r
    if infer.round_robin_experts:
        return list(range(r, m.experts, infer.tp)), 1, 0
    base, rem = divmod(m.experts, infer.tp)
    start = r * base + min(r, rem)
    return list(range(start, start + base + (r < rem))), 1, 0


def vllm_shards(m: Model, infer: Infer, r: int,
                full: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Engine TP rank `r`'s tensors as vLLM's loaders fill them (contiguous copies)."""
    tp, h = infer.tp, m.hidden
    out: Dict[str, torch.Tensor] = {}

    def vocab(name):
        return _rows(_pad_rows(full[name], _round_up(m.vocab, 64), 0), r, tp)

    out["model.embed_tokens.weight"] = vocab("model.embed_tokens.weight")
    for i in range(m.layers):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        out[p + "input_layernorm.weight"] = full[p + "input_layernorm.weight"]
        out[p + "post_attention_layernorm.weight"] = full[p + "post_attention_layernorm.weight"]
        if m.mla:
            if m.q_lora_rank:
                out[a + "fused_qkv_a_proj.weight"] = torch.cat(
                    [full[a + "q_a_proj.weight"], full[a + "kv_a_proj_with_mqa.weight"]])
                out[a + "q_a_layernorm.weight"] = full[a + "q_a_layernorm.weight"]
                out[a + "q_b_proj.weight"] = _rows(full[a + "q_b_proj.weight"], r, tp)
            else:
                out[a + "q_proj.weight"] = _rows(full[a + "q_proj.weight"], r, tp)
                out[a + "kv_a_proj_with_mqa.weight"] = full[a + "kv_a_proj_with_mqa.weight"]
            out[a + "kv_a_layernorm.weight"] = full[a + "kv_a_layernorm.weight"]
            out[a + "kv_b_proj.weight"] = _rows(full[a + "kv_b_proj.weight"], r, tp)
            out[a + "o_proj.weight"] = _cols(full[a + "o_proj.weight"], r, tp)
        else:
            d, kvh = m.head_dim, m.kv_heads
            first = r // (tp // kvh) if tp >= kvh else r * (kvh // tp)
            count = 1 if tp >= kvh else kvh // tp

            def qkv(q, k, v):
                return torch.cat([_rows(q, r, tp), k[first * d:(first + count) * d],
                                  v[first * d:(first + count) * d]])

            out[a + "qkv_proj.weight"] = qkv(full[a + "q_proj.weight"], full[a + "k_proj.weight"],
                                             full[a + "v_proj.weight"])
            if m.qkv_bias:
                out[a + "qkv_proj.bias"] = qkv(full[a + "q_proj.bias"], full[a + "k_proj.bias"],
                                               full[a + "v_proj.bias"])
            if m.qk_norm:
                out[a + "q_norm.weight"] = full[a + "q_norm.weight"]
                out[a + "k_norm.weight"] = full[a + "k_norm.weight"]
            out[a + "o_proj.weight"] = _cols(full[a + "o_proj.weight"], r, tp)
        mlp = p + "mlp."
        if not m.is_moe_layer(i):
            out[mlp + "gate_up_proj.weight"] = _gate_up(full[mlp + "gate_proj.weight"],
                                                        full[mlp + "up_proj.weight"], r, tp)
            out[mlp + "down_proj.weight"] = _cols(full[mlp + "down_proj.weight"], r, tp)
            continue
        out[mlp + "gate.weight"] = full[mlp + "gate.weight"]
        if m.router_bias:
            out[mlp + "gate.e_score_correction_bias"] = full[mlp + "gate.e_score_correction_bias"]
        experts, etp, etp_r = engine_experts(m, infer, r)
        fl = m.moe_ffn // etp
        w13 = [_gate_up(full[mlp + f"experts.{e}.gate_proj.weight"],
                        full[mlp + f"experts.{e}.up_proj.weight"], etp_r, etp) for e in experts]
        w2 = [_cols(full[mlp + f"experts.{e}.down_proj.weight"], etp_r, etp) for e in experts]
        out[mlp + "experts.w13_weight"] = (torch.stack(w13) if w13 else
                                           torch.zeros((0, 2 * fl, h), dtype=m.dtype))
        out[mlp + "experts.w2_weight"] = (torch.stack(w2) if w2 else
                                          torch.zeros((0, h, fl), dtype=m.dtype))
        if m.shared_experts:
            s = mlp + "shared_experts."
            out[s + "gate_up_proj.weight"] = _gate_up(full[s + "gate_proj.weight"],
                                                      full[s + "up_proj.weight"], r, tp)
            out[s + "down_proj.weight"] = _cols(full[s + "down_proj.weight"], r, tp)
    out["model.norm.weight"] = full["model.norm.weight"]
    if not m.tied:
        out["lm_head.weight"] = vocab("lm_head.weight")
    return {k: v.contiguous().clone() for k, v in out.items()}


def is_linear(name: str) -> bool:
    """Whether an engine tensor is a linear layer's weight, which an fp8 target holds in
    fp8 (every ``*_proj.weight`` and the FusedMoE ``w13_weight`` / ``w2_weight``; not the
    embedding, lm_head, the router, norms or biases)."""
    return name.endswith(("_proj.weight", ".w13_weight", ".w2_weight"))


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's elements as integers of the same width (for bit-exact comparison)."""
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return t.view(width[t.element_size()])
