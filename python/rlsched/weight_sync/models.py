"""The full tensors a trainer exports for a Hugging Face model, from its ``config.json``
alone: their Hugging Face names, shapes and dtype, in the order of the model's
modules (embeddings, each layer, the final norm, the output head). Pure.

Covered: Llama, Qwen2 and Qwen3 (GQA; Qwen2's q/k/v biases with ``attention_bias``
or by model type; Qwen3's per-head q/k norms), Qwen2-MoE / Qwen3-MoE (a router and
per-expert projections on the layers ``decoder_sparse_step`` and ``mlp_only_layers``
say; Qwen2-MoE's shared expert and its gate), and DeepSeek-V2/V3 (MLA with the q and kv
low-rank projections and their norms, dense layers before ``first_k_dense_replace``,
routed experts with shared ones, V3's score-correction bias). Multi-token-prediction
layers (``num_nextn_predict_layers``) are not exported by the trainers' generators and
are left out. A tied output head (``tie_word_embeddings``) is not a tensor of its own.
"""

from __future__ import annotations

from typing import Any, List, Mapping, Tuple

from rlsched.errors import InvalidArgumentError
from rlsched.weight_sync.plan import ITEM_SIZES, TensorSpec

__all__ = ["hf_tensors"]

# Tensors as (name, shape) pairs.
_Shapes = List[Tuple[str, Tuple[int, ...]]]


def _int(config: Mapping[str, Any], key: str, default: Any = None) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgumentError(f"model config: {key} = {value!r}, expected an int >= 0",
                                   key)
    return value


def hf_tensors(config: Mapping[str, Any], dtype: str = "") -> list[TensorSpec]:
    """The tensors of the model `config` describes (see the module docstring), each of
    `dtype` (default: the config's ``torch_dtype``, else bfloat16)."""
    dtype = dtype or str(config.get("torch_dtype") or "bfloat16").replace("torch.", "")
    if dtype not in ITEM_SIZES:
        raise InvalidArgumentError(f"model config: torch_dtype = {dtype!r} is not one a "
                                   "sync carries", "torch_dtype")
    model_type = str(config.get("model_type", ""))
    hidden = _int(config, "hidden_size")
    layers = _int(config, "num_hidden_layers")
    vocab = _int(config, "vocab_size")
    out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (vocab, hidden))]
    for layer in range(layers):
        prefix = f"model.layers.{layer}."
        out.append((prefix + "input_layernorm.weight", (hidden,)))
        out += [(prefix + "self_attn." + n, s) for n, s in _attention(config, model_type)]
        out.append((prefix + "post_attention_layernorm.weight", (hidden,)))
        out += [(prefix + "mlp." + n, s) for n, s in _mlp(config, model_type, layer)]
    out.append(("model.norm.weight", (hidden,)))
    if not config.get("tie_word_embeddings", False):
        out.append(("lm_head.weight", (vocab, hidden)))
    return [TensorSpec(name, shape, dtype) for name, shape in out]


def _attention(config: Mapping[str, Any], model_type: str) -> _Shapes:
    hidden = _int(config, "hidden_size")
    heads = _int(config, "num_attention_heads")
    if config.get("kv_lora_rank"):  # MLA (DeepSeek-V2/V3)
        nope, rope = _int(config, "qk_nope_head_dim"), _int(config, "qk_rope_head_dim")
        v_dim, kv_rank = _int(config, "v_head_dim"), _int(config, "kv_lora_rank")
        q_rank = config.get("q_lora_rank")
        q = ([("q_a_proj.weight", (_int(config, "q_lora_rank"), hidden)),
              ("q_a_layernorm.weight", (q_rank,)),
              ("q_b_proj.weight", (heads * (nope + rope), q_rank))] if q_rank else
             [("q_proj.weight", (heads * (nope + rope), hidden))])
        return q + [("kv_a_proj_with_mqa.weight", (kv_rank + rope, hidden)),
                    ("kv_a_layernorm.weight", (kv_rank,)),
                    ("kv_b_proj.weight", (heads * (nope + v_dim), kv_rank)),
                    ("o_proj.weight", (hidden, heads * v_dim))]
    kv_heads = _int(config, "num_key_value_heads", heads)
    head_dim = _int(config, "head_dim", hidden // max(heads, 1))
    out: _Shapes = [("q_proj.weight", (heads * head_dim, hidden)),
                    ("k_proj.weight", (kv_heads * head_dim, hidden)),
                    ("v_proj.weight", (kv_heads * head_dim, hidden))]
    if config.get("attention_bias", model_type in ("qwen2", "qwen2_moe")):
        out += [("q_proj.bias", (heads * head_dim,)), ("k_proj.bias", (kv_heads * head_dim,)),
                ("v_proj.bias", (kv_heads * head_dim,))]
    out.append(("o_proj.weight", (hidden, heads * head_dim)))
    if model_type in ("qwen3", "qwen3_moe"):
        out += [("q_norm.weight", (head_dim,)), ("k_norm.weight", (head_dim,))]
    return out


def _ffn(inner: int, hidden: int, prefix: str = "") -> _Shapes:
    return [(prefix + "gate_proj.weight", (inner, hidden)),
            (prefix + "up_proj.weight", (inner, hidden)),
            (prefix + "down_proj.weight", (hidden, inner))]


def _sparse(config: Mapping[str, Any], layer: int) -> bool:
    if config.get("n_routed_experts"):  # DeepSeek
        frequency = _int(config, "moe_layer_freq", 1) or 1
        return layer >= _int(config, "first_k_dense_replace", 0) and layer % frequency == 0
    if not config.get("num_experts"):
        return False
    step = _int(config, "decoder_sparse_step", 1) or 1
    return layer not in (config.get("mlp_only_layers") or []) and (layer + 1) % step == 0


def _mlp(config: Mapping[str, Any], model_type: str, layer: int) -> _Shapes:
    hidden = _int(config, "hidden_size")
    if not _sparse(config, layer):
        return _ffn(_int(config, "intermediate_size"), hidden)
    inner = _int(config, "moe_intermediate_size")
    experts = _int(config, "n_routed_experts", config.get("num_experts"))
    out: _Shapes = [("gate.weight", (experts, hidden))]
    if model_type == "deepseek_v3":
        out.append(("gate.e_score_correction_bias", (experts,)))
    for expert in range(experts):
        out += _ffn(inner, hidden, f"experts.{expert}.")
    if config.get("n_shared_experts"):
        out += _ffn(inner * _int(config, "n_shared_experts"), hidden, "shared_experts.")
    elif config.get("shared_expert_intermediate_size"):  # Qwen2-MoE
        out += _ffn(_int(config, "shared_expert_intermediate_size"), hidden, "shared_expert.")
        out.append(("shared_expert_gate.weight", (1, hidden)))
    return out
