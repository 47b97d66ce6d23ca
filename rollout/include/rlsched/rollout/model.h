// rlsched/rollout/model.h — a decoder-only model's shape and its full tensors.
//
// Overview
//   ParseHfConfig() reads the text of a Hugging Face `config.json` for the families
//   the resharding planner knows: Llama (3.x), Qwen2/2.5 (QKV biases), Qwen3 (q/k
//   RMS norms), Qwen3-MoE and DeepSeek-V3 (MLA attention, first dense layers, routed
//   and shared experts). HfTensors() lists the model's full tensors under their
//   Hugging Face names, in a fixed order; they are the common ground between the
//   trainer's layout and the engines' layout (layout.h): every shard on either side
//   is a set of rectangles of these tensors.
//
// Example
//   rlsched::rollout::ModelConfig m = rlsched::rollout::ParseHfConfig(text);
//   for (const rlsched::rollout::FullTensor& t : rlsched::rollout::HfTensors(m)) {
//     // t.name, t.rows, t.cols (cols == 1 for a vector), t.Bytes()
//   }
//
// Thread-safety: pure functions. Errors: std::invalid_argument naming the field.

#ifndef RLSCHED_ROLLOUT_MODEL_H_
#define RLSCHED_ROLLOUT_MODEL_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace rlsched::rollout {

enum class Family {
  kLlama,       // LlamaForCausalLM
  kQwen2,       // Qwen2ForCausalLM: biases on q, k, v
  kQwen3,       // Qwen3ForCausalLM: RMS norms on q and k (per head)
  kQwen3Moe,    // Qwen3MoeForCausalLM: routed experts, q/k norms
  kDeepseekV3,  // DeepseekV3ForCausalLM: MLA, first dense layers, routed + shared experts
};

// The family's name as in config.json's model_type ("llama", "qwen2", ...).
std::string_view FamilyName(Family family);

struct ModelConfig {
  Family family = Family::kLlama;
  std::int64_t hidden_size = 0;
  std::int64_t intermediate_size = 0;  // the dense MLP's
  std::int64_t num_layers = 0;
  std::int64_t num_heads = 0;
  std::int64_t num_kv_heads = 0;  // query groups
  std::int64_t head_dim = 0;      // hidden_size / num_heads unless given
  std::int64_t vocab_size = 0;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  // Qwen2
  bool qk_norm = false;   // Qwen3, Qwen3-MoE

  // Mixture of experts (0 experts: dense).
  std::int64_t num_experts = 0;
  std::int64_t moe_intermediate_size = 0;
  std::int64_t num_shared_experts = 0;  // DeepSeek: shared experts fused into one MLP
  // Layers with a dense MLP in an MoE model, ascending (DeepSeek: the first
  // first_k_dense_replace; Qwen3-MoE: mlp_only_layers and decoder_sparse_step).
  std::vector<std::int64_t> dense_layers;
  bool router_bias = false;  // DeepSeek's e_score_correction_bias

  // Multi-head latent attention (DeepSeek-V3); kv_lora_rank > 0 means MLA.
  std::int64_t q_lora_rank = 0;  // 0: q_proj is a plain [heads * qk_head_dim, hidden]
  std::int64_t kv_lora_rank = 0;
  std::int64_t qk_nope_head_dim = 0;
  std::int64_t qk_rope_head_dim = 0;
  std::int64_t v_head_dim = 0;

  std::int64_t dtype_bytes = 2;  // bf16

  bool is_moe() const { return num_experts > 0; }
  bool is_mla() const { return kv_lora_rank > 0; }
  // Whether `layer` has routed experts.
  bool IsMoeLayer(std::int64_t layer) const;
};

// Parses config.json text. Throws std::invalid_argument naming the field for
// malformed JSON, an unknown model_type/architecture, a missing or out-of-range
// field (sizes must be positive and below 2^31; heads must divide evenly).
ModelConfig ParseHfConfig(std::string_view json_text);

// Checks the invariants ParseHfConfig() establishes (for configs built in code).
void Validate(const ModelConfig& model);

// A full (unsharded) tensor: a matrix [rows, cols], or a vector [rows] with
// cols == 1 and is_vector set.
struct FullTensor {
  std::string name;  // Hugging Face name, e.g. "model.layers.3.self_attn.q_proj.weight"
  std::int64_t rows = 0;
  std::int64_t cols = 1;
  bool is_vector = false;
  std::int64_t element_bytes = 2;  // the model's dtype; 4 for DeepSeek's fp32 expert bias
  std::int64_t Elements() const { return rows * cols; }
  std::int64_t Bytes() const { return Elements() * element_bytes; }
};

// Every full tensor of the model, in a fixed order (embedding, then layer by layer,
// then the final norm and lm_head unless tied). MTP layers are not included.
// Complexity O(layers * (experts + 1)).
std::vector<FullTensor> HfTensors(const ModelConfig& model);

}  // namespace rlsched::rollout

#endif  // RLSCHED_ROLLOUT_MODEL_H_
