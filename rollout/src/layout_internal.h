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

}  // namespace rlsched::rollout::internal

#endif  // RLSCHED_ROLLOUT_SRC_LAYOUT_INTERNAL_H_
