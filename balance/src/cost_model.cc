#include "rlsched/balance/cost_model.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <string>

#include "rlsched/balance/partition.h"
#include "rlsched/common/check.h"
#include "rlsched/common/error.h"

namespace rlsched::balance {
namespace {

constexpr double kMaxCost = 4.611686018427387904e18;  // 2^62

void CheckShape(const ModelShape& shape) {
  CheckAtLeast("model.hidden_size", shape.hidden_size, 1);
  CheckAtLeast("model.num_layers", shape.num_layers, 1);
  CheckAtLeast("model.ffn_hidden_size", shape.ffn_hidden_size, 1);
  CheckAtLeast("model.num_attention_heads", shape.num_attention_heads, 1);
  CheckAtLeast("model.num_kv_heads", shape.num_kv_heads, 1);
  CheckAtLeast("model.vocab_size", shape.vocab_size, 1);
  CheckDivides("model.num_attention_heads", shape.num_attention_heads, "hidden_size",
               shape.hidden_size);
  CheckDivides("model.num_kv_heads", shape.num_kv_heads, "num_attention_heads",
               shape.num_attention_heads);
}

void CheckWork(const TransformerWork& work) {
  CheckFiniteAtLeast("work.flops_per_token", work.flops_per_token, 0.0, End::kOpen);
  CheckFiniteAtLeast("work.flops_per_squared_token", work.flops_per_squared_token, 0.0);
  CheckFiniteAtLeast("work.parameters", work.parameters, 0.0);
  CheckAtLeast("work.num_layers", work.num_layers, 1);
}

}  // namespace

// Matrix parameters and forward + backward FLOPs of one token (linear part) and of one
// squared token (attention), see the file comment. In double: shapes up to ~1e6 keep
// every product far inside its range.
TransformerWork WorkOf(const ModelShape& shape) {
  CheckShape(shape);
  const double h = static_cast<double>(shape.hidden_size);
  const double layers = static_cast<double>(shape.num_layers);
  const double f = static_cast<double>(shape.ffn_hidden_size);
  const double head_dim = h / static_cast<double>(shape.num_attention_heads);
  const double kv = static_cast<double>(shape.num_kv_heads) * head_dim;
  const double mlp_matrices = shape.gated_mlp ? 3.0 : 2.0;
  const double layer_parameters = h * (h + 2.0 * kv) + h * h + mlp_matrices * h * f;
  const double parameters = layers * layer_parameters + h * static_cast<double>(shape.vocab_size);
  return {3.0 * 2.0 * parameters, 3.0 * layers * 2.0 * h, parameters, shape.num_layers};
}

double MicroBatchOverheadTokens(const ModelShape& shape, const MicroBatchOverheadModel& model) {
  return MicroBatchOverheadTokens(WorkOf(shape), model);
}

double MicroBatchOverheadTokens(const TransformerWork& work, const MicroBatchOverheadModel& model) {
  CheckWork(work);
  CheckFiniteAtLeast("overhead_model.flops_per_second", model.flops_per_second, 0.0, End::kOpen);
  CheckFiniteAtLeast("overhead_model.memory_bytes_per_second", model.memory_bytes_per_second, 0.0,
                     End::kOpen);
  CheckFiniteAtLeast("overhead_model.bytes_per_parameter", model.bytes_per_parameter, 0.0);
  CheckFiniteAtLeast("overhead_model.kernels_per_layer", model.kernels_per_layer, 0.0);
  CheckFiniteAtLeast("overhead_model.kernel_latency_seconds", model.kernel_latency_seconds, 0.0);
  CheckFiniteAtLeast("overhead_model.framework_seconds", model.framework_seconds, 0.0);
  const double weights =
      3.0 * model.bytes_per_parameter * work.parameters / model.memory_bytes_per_second;
  const double launches =
      model.kernels_per_layer * static_cast<double>(work.num_layers) * model.kernel_latency_seconds;
  return model.flops_per_second * (weights + launches + model.framework_seconds) /
         work.flops_per_token;
}

namespace {

// The default overhead of a cost model whose token costs `linear` units.
std::int64_t OverheadFor(const TransformerWork& work, double linear) {
  const double units = linear * MicroBatchOverheadTokens(work);
  return units < 4.0e18 ? std::llround(units) : std::int64_t{4'000'000'000'000'000'000};
}

}  // namespace

CostModel CostModel::Tokens() {
  return CostModel(Kind::kTokens, 1.0, 0.0, 0.0, OverheadFor(WorkOf(ModelShape{}), 1.0));
}

CostModel CostModel::Attention(double linear, double quadratic, double constant) {
  CheckFiniteAtLeast("coefficients.linear", linear, 0.0);
  CheckFiniteAtLeast("coefficients.quadratic", quadratic, 0.0);
  CheckFiniteAtLeast("coefficients.constant", constant, 0.0);
  if (linear + quadratic <= 0.0) rlsched::Fail("coefficients", "linear + quadratic must be > 0");
  return CostModel(Kind::kAttention, linear, quadratic, constant,
                   OverheadFor(WorkOf(ModelShape{}), linear));
}

CostModel CostModel::Attention(const ModelShape& shape, double constant) {
  return Attention(WorkOf(shape), constant);
}

CostModel CostModel::Attention(const TransformerWork& work, double constant) {
  CheckWork(work);
  CheckFiniteAtLeast("per_sequence", constant, 0.0);
  return CostModel(Kind::kAttention, 1.0, work.flops_per_squared_token / work.flops_per_token,
                   constant, OverheadFor(work, 1.0));
}

std::int64_t CostModel::Cost(std::int64_t length) const {
  CheckInRange("lengths", length, 0, {kMaxLength, "2^31"});
  if (kind_ == Kind::kTokens) return length;
  const double l = static_cast<double>(length);
  const double cost = linear_ * l + quadratic_ * l * l + constant_;
  if (!(cost < kMaxCost)) {
    rlsched::Fail("cost",
                  "the cost of a sequence of length " + std::to_string(length) + " exceeds 2^62");
  }
  return std::llround(cost);
}

std::vector<std::int64_t> CostModel::Costs(std::span<const std::int64_t> lengths) const {
  std::vector<std::int64_t> costs(lengths.size());
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    CheckInRange({"lengths", i}, lengths[i], 0, {kMaxLength, "2^31"});
    costs[i] = Cost(lengths[i]);
  }
  return costs;
}

std::string CostModel::Describe() const {
  if (kind_ == Kind::kTokens) return "tokens";
  char buffer[160];
  std::snprintf(buffer, sizeof(buffer), "attention(linear=%g, quadratic=%.6g, constant=%g)",
                linear_, quadratic_, constant_);
  return buffer;
}

}  // namespace rlsched::balance
