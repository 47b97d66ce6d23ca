// Small models of every family for the rollout tests, as config.json text.

#ifndef RLSCHED_TESTS_ROLLOUT_TEST_MODELS_H_
#define RLSCHED_TESTS_ROLLOUT_TEST_MODELS_H_

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "rlsched/rollout/model.h"

namespace rlsched::rollout::testing {

// The text of a shipped config (tests/data/configs/`name`; the build defines
// RLSCHED_TEST_CONFIG_DIR), "" when it cannot be read.
inline std::string ReadConfig(const std::string& name) {
  std::ifstream in(std::string(RLSCHED_TEST_CONFIG_DIR) + "/" + name);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Dimensions are small but keep the structure: GQA (4 query heads per group), a
// vocabulary that needs padding on both sides, biases, norms, dense and MoE layers.
inline std::vector<std::pair<std::string, std::string>> SmallModelConfigs() {
  return {
      {"llama", R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 96,
        "num_hidden_layers": 4, "num_attention_heads": 16, "num_key_value_heads": 4,
        "vocab_size": 1000, "tie_word_embeddings": false})"},
      {"qwen2", R"({"architectures": ["Qwen2ForCausalLM"], "hidden_size": 32,
        "intermediate_size": 64, "num_hidden_layers": 3, "num_attention_heads": 8,
        "num_key_value_heads": 4, "vocab_size": 515, "tie_word_embeddings": true})"},
      {"qwen3", R"({"model_type": "qwen3", "hidden_size": 32, "intermediate_size": 48,
        "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 8,
        "head_dim": 6, "vocab_size": 700, "tie_word_embeddings": false})"},
      {"qwen3_moe", R"({"model_type": "qwen3_moe", "hidden_size": 32, "intermediate_size": 48,
        "moe_intermediate_size": 16, "num_hidden_layers": 4, "num_attention_heads": 8,
        "num_key_value_heads": 4, "head_dim": 4, "num_experts": 8, "num_experts_per_tok": 2,
        "decoder_sparse_step": 1, "mlp_only_layers": [1], "vocab_size": 300})"},
      {"deepseek_v3", R"({"model_type": "deepseek_v3", "hidden_size": 32,
        "intermediate_size": 64, "moe_intermediate_size": 8, "num_hidden_layers": 4,
        "num_attention_heads": 8, "num_key_value_heads": 8, "n_shared_experts": 1,
        "n_routed_experts": 8, "num_experts_per_tok": 2, "first_k_dense_replace": 1,
        "q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 4, "qk_rope_head_dim": 2,
        "v_head_dim": 4, "vocab_size": 333, "tie_word_embeddings": false,
        "topk_method": "noaux_tc"})"},
  };
}

inline std::vector<std::pair<std::string, ModelConfig>> SmallModels() {
  std::vector<std::pair<std::string, ModelConfig>> out;
  for (const auto& [name, text] : SmallModelConfigs()) out.emplace_back(name, ParseHfConfig(text));
  return out;
}

}  // namespace rlsched::rollout::testing

#endif  // RLSCHED_TESTS_ROLLOUT_TEST_MODELS_H_
