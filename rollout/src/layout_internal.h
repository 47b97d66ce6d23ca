// Internal: the layout functions over a prebuilt name -> tensor index map, so that
// the planner builds the map once.

#ifndef RLSCHED_ROLLOUT_SRC_LAYOUT_INTERNAL_H_
#define RLSCHED_ROLLOUT_SRC_LAYOUT_INTERNAL_H_

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "rlsched/rollout/layout.h"
#include "rlsched/rollout/model.h"

namespace rlsched::rollout::internal {

// How the trainer and the engines split a full tensor (for the planner's estimate of
// its work, before any layout is built).
enum class Split {
  kReplicated,      // whole on every rank of both (norms, the router, MLA's down projections)
  kGrouped,         // q, k, v of grouped-query attention: whole query groups per trainer rank
  kTensorParallel,  // split by tp on both (rows or columns, the vocabulary)
  kExpert,          // a routed expert's: split by etp; on the engines by tp, or whole with EP
};

// One full tensor as LayerTensors() lists it; `count` identical ones (the routed
// experts when listed once for all).
struct TensorShape {
  std::string name;
  std::int64_t rows = 0, cols = 1;
  bool is_vector = false;
  std::int64_t element_bytes = 2;
  Split split = Split::kReplicated;
  std::int64_t count = 1;
};

// The tensors of layer `layer` in HfTensors() order, with its routed experts when
// `moe`; with `experts_once` the routed experts' three tensors are listed once (expert
// 0) with count num_experts, so that the cost is O(1) in the number of experts.
template <class Visit>
void LayerTensors(const ModelConfig& m, std::int64_t layer, bool moe, bool experts_once,
                  Visit&& visit);

// The model's full tensors and their indices by name.
class TensorIndex {
 public:
  explicit TensorIndex(const ModelConfig& model);
  const std::vector<FullTensor>& tensors() const { return tensors_; }
  // The index of `name`; asserts that it exists.
  std::int32_t operator[](const std::string& name) const;
  // The index of routed expert `expert`'s gate_proj in `layer` (an MoE layer); its
  // up_proj and down_proj follow it (HfTensors() lists them in that order).
  std::int32_t ExpertGate(std::int64_t layer, std::int64_t expert) const {
    return expert_base_[layer] + static_cast<std::int32_t>(3 * expert);
  }

 private:
  std::vector<FullTensor> tensors_;
  std::unordered_map<std::string, std::int32_t> index_;
  std::vector<std::int32_t> expert_base_;  // per layer, -1 for a dense layer
};

std::vector<LocalParam> MegatronDenseShards(const ModelConfig& model, const TensorIndex& index,
                                            const TrainLayout& train, std::int64_t pp_rank,
                                            std::int64_t tp_rank);
std::vector<LocalParam> MegatronExpertShards(const ModelConfig& model, const TensorIndex& index,
                                             const TrainLayout& train, std::int64_t pp_rank,
                                             std::int64_t ep_rank, std::int64_t etp_rank);
std::vector<LocalParam> VllmShards(const ModelConfig& model, const TensorIndex& index,
                                   const InferLayout& infer, std::int64_t tp_rank);

template <class Visit>
void LayerTensors(const ModelConfig& m, std::int64_t layer, bool moe, bool experts_once,
                  Visit&& visit) {
  const std::int64_t h = m.hidden_size;
  const std::string l = "model.layers." + std::to_string(layer) + ".";
  auto matrix = [&](std::string name, std::int64_t rows, std::int64_t cols, Split split,
                    std::int64_t count = 1) {
    visit(TensorShape{std::move(name), rows, cols, false, m.dtype_bytes, split, count});
  };
  auto vector = [&](std::string name, std::int64_t rows, std::int64_t bytes, Split split) {
    visit(TensorShape{std::move(name), rows, 1, true, bytes, split, 1});
  };
  auto mlp = [&](const std::string& prefix, std::int64_t ffn, Split split, std::int64_t count) {
    matrix(prefix + "gate_proj.weight", ffn, h, split, count);
    matrix(prefix + "up_proj.weight", ffn, h, split, count);
    matrix(prefix + "down_proj.weight", h, ffn, split, count);
  };
  constexpr Split kRep = Split::kReplicated, kTp = Split::kTensorParallel;
  vector(l + "input_layernorm.weight", h, m.dtype_bytes, kRep);
  const std::string a = l + "self_attn.";
  if (m.is_mla()) {
    const std::int64_t qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
    if (m.q_lora_rank > 0) {
      matrix(a + "q_a_proj.weight", m.q_lora_rank, h, kRep);
      vector(a + "q_a_layernorm.weight", m.q_lora_rank, m.dtype_bytes, kRep);
      matrix(a + "q_b_proj.weight", m.num_heads * qk, m.q_lora_rank, kTp);
    } else {
      matrix(a + "q_proj.weight", m.num_heads * qk, h, kTp);
    }
    matrix(a + "kv_a_proj_with_mqa.weight", m.kv_lora_rank + m.qk_rope_head_dim, h, kRep);
    vector(a + "kv_a_layernorm.weight", m.kv_lora_rank, m.dtype_bytes, kRep);
    matrix(a + "kv_b_proj.weight", m.num_heads * (m.qk_nope_head_dim + m.v_head_dim),
           m.kv_lora_rank, kTp);
    matrix(a + "o_proj.weight", h, m.num_heads * m.v_head_dim, kTp);
  } else {
    const std::int64_t q = m.num_heads * m.head_dim;
    const std::int64_t kv = m.num_kv_heads * m.head_dim;
    matrix(a + "q_proj.weight", q, h, Split::kGrouped);
    matrix(a + "k_proj.weight", kv, h, Split::kGrouped);
    matrix(a + "v_proj.weight", kv, h, Split::kGrouped);
    if (m.qkv_bias) {
      vector(a + "q_proj.bias", q, m.dtype_bytes, Split::kGrouped);
      vector(a + "k_proj.bias", kv, m.dtype_bytes, Split::kGrouped);
      vector(a + "v_proj.bias", kv, m.dtype_bytes, Split::kGrouped);
    }
    if (m.qk_norm) {
      vector(a + "q_norm.weight", m.head_dim, m.dtype_bytes, kRep);
      vector(a + "k_norm.weight", m.head_dim, m.dtype_bytes, kRep);
    }
    matrix(a + "o_proj.weight", h, q, kTp);
  }
  vector(l + "post_attention_layernorm.weight", h, m.dtype_bytes, kRep);
  if (moe) {
    matrix(l + "mlp.gate.weight", m.num_experts, h, kRep);
    if (m.router_bias) vector(l + "mlp.gate.e_score_correction_bias", m.num_experts, 4, kRep);
    if (experts_once) {
      mlp(l + "mlp.experts.0.", m.moe_intermediate_size, Split::kExpert, m.num_experts);
    } else {
      for (std::int64_t e = 0; e < m.num_experts; ++e) {
        mlp(l + "mlp.experts." + std::to_string(e) + ".", m.moe_intermediate_size, Split::kExpert,
            1);
      }
    }
    if (m.num_shared_experts > 0) {
      mlp(l + "mlp.shared_experts.", m.num_shared_experts * m.moe_intermediate_size, kTp, 1);
    }
  } else {
    mlp(l + "mlp.", m.intermediate_size, kTp, 1);
  }
}

}  // namespace rlsched::rollout::internal

#endif  // RLSCHED_ROLLOUT_SRC_LAYOUT_INTERNAL_H_
