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
  std::int64_t experts_per_token = 0;  // routed experts per token (0: not given)
  std::int64_t moe_intermediate_size = 0;
  std::int64_t num_shared_experts = 0;  // DeepSeek: shared experts fused into one MLP
  // Which layers of an MoE model have routed experts, as rules (never one entry per
  // layer, so that reading a config costs O(its text), not O(num_hidden_layers)): layer
  // i does when i >= first_dense_layers, i % moe_layer_step == moe_layer_phase and i is
  // not listed in dense_layers; the others have a dense MLP of intermediate_size.
  // DeepSeek: first_k_dense_replace, moe_layer_freq (phase 0); Qwen3-MoE:
  // decoder_sparse_step (phase step - 1) and mlp_only_layers.
  std::int64_t first_dense_layers = 0;  // in [0, 2^31)
  std::int64_t moe_layer_step = 1;      // in [1, 2^31)
  std::int64_t moe_layer_phase = 0;     // in [0, moe_layer_step)
  // Layers listed as dense, strictly ascending, each in [0, num_layers).
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
  // Whether `layer` has routed experts. O(log dense_layers).
  bool IsMoeLayer(std::int64_t layer) const;
  // How many of the num_layers layers have routed experts (0 for a dense model).
  // O(dense_layers).
  std::int64_t NumMoeLayers() const;
};

// The largest model ParseHfConfig() and Validate() accept, counted before anything is
// built from it, so that no input can make HfTensors() or the layouts allocate without
// bound: at most kMaxFullTensors tensors, 2^17 (DeepSeek-V3 has 47,653; planning costs about 30 µs
// per tensor) and at most kMaxModelBytes bytes of tensors (2^42, 4.4 TB; DeepSeek-V3 in bf16 is 1.3
// TB), which keeps every byte count of a plan over up to 2^20 GPUs within int64.
inline constexpr std::int64_t kMaxFullTensors = std::int64_t{1} << 17;
inline constexpr double kMaxModelBytes = 4398046511104.0;  // 2^42

// The number of full tensors (HfTensors(model).size()) and their bytes, computed from
// the model's sizes without listing them, in floating point (no overflow for any
// sizes). O(dense_layers + num_experts).
struct ModelSize {
  double tensors = 0.0;
  double bytes = 0.0;
};
ModelSize SizeOf(const ModelConfig& model);

// Parses config.json text. Throws rlsched::FieldError naming the key ("config.<key>")
// for malformed JSON, an unknown model_type/architecture, a missing or out-of-range
// field (sizes must be positive and below 2^31; heads must divide evenly;
// mlp_only_layers' entries in [0, num_hidden_layers)), or a model above
// kMaxFullTensors or kMaxModelBytes (naming num_hidden_layers, or the experts' key when
// the experts make the model too large, with the count and the bound).
// O(text size + log of the list's length per entry): no number in the text makes it
// loop or allocate more.
ModelConfig ParseHfConfig(std::string_view json_text);

// Checks the invariants ParseHfConfig() establishes (for configs built in code),
// including the size limits above. O(dense_layers + num_experts).
void Validate(const ModelConfig& model);

// What training costs per token, for the step planner's cost model: forward + backward
// (3 × forward) FLOPs of one token's linear work and of one squared token of a
// sequence (causal attention: half the score matrix), and the parameters.
//   per layer, per token (forward, 2 FLOPs a multiply-add; h hidden, H heads, G KV
//   heads, d head_dim):
//     attention projections  2·h·H·d (q) + 2·2·h·G·d (k, v) + 2·H·d·h (o);
//       MLA: q 2·h·q_lora + 2·q_lora·H·(nope + rope) (or 2·h·H·(nope + rope) without a
//       q LoRA), kv 2·h·(kv_lora + rope) + 2·kv_lora·H·(nope + v), o 2·H·v·h
//     MLP  2·3·h·f (dense layers, gated)
//     MoE  2·3·h·m·(k + s) + 2·h·E (k routed of E experts of width m, s shared ones,
//          the router)
//   once per token: the LM head 2·h·V (tied embeddings change no FLOPs, only the
//   parameters)
//   per layer, per squared token: H·(dq + dv) (QKᵀ and AV over half the square; d
//   each without MLA, nope + rope and v with it)
// Throws FieldError on config.num_experts_per_tok for an MoE model without it. O(1)
// plus NumMoeLayers().
struct TrainingFlops {
  double per_token = 0.0;
  double per_squared_token = 0.0;
  double parameters = 0.0;  // every tensor's elements (all experts)
};
TrainingFlops TrainingFlopsOf(const ModelConfig& model);

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
// Throws as Validate() for a model above kMaxFullTensors before listing any.
// Complexity O(layers * (experts + 1)).
std::vector<FullTensor> HfTensors(const ModelConfig& model);

}  // namespace rlsched::rollout

#endif  // RLSCHED_ROLLOUT_MODEL_H_
