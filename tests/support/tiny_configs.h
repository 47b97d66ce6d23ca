// Small Hugging Face configs that the resharding tests of several binaries plan
// (wire_tests, runtime_tests): quick to plan, with the layouts' hard cases.
#pragma once

namespace rlsched::tiny_configs {

// A small Llama: GQA (4 query heads per KV head), a vocabulary padded on both sides.
inline constexpr char kTinyLlama[] = R"({"model_type": "llama", "hidden_size": 64,
  "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 16,
  "num_key_value_heads": 4, "vocab_size": 1000, "tie_word_embeddings": false})";

// A small Qwen3-MoE: 8 experts, one dense layer.
inline constexpr char kTinyMoe[] = R"({"model_type": "qwen3_moe", "hidden_size": 32,
  "intermediate_size": 48, "moe_intermediate_size": 16, "num_hidden_layers": 4,
  "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 4, "num_experts": 8,
  "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": [1],
  "vocab_size": 300})";

}  // namespace rlsched::tiny_configs
