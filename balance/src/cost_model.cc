#include "rlsched/balance/cost_model.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <string>

#include "rlsched/balance/partition.h"
#include "rlsched/common/error.h"

namespace rlsched::balance {
namespace {

constexpr double kMaxCost = 4.611686018427387904e18;  // 2^62

void CheckCoefficient(double value, const char* name) {
  if (!std::isfinite(value) || value < 0.0) {
    rlsched::FailBound(name, "finite and >= 0", value);
  }
}

void CheckShapeField(std::int64_t value, const char* name) {
  if (value < 1) {
    rlsched::FailBound(std::string("model.") + name, ">= 1", value);
  }
}

void CheckShape(const ModelShape& shape) {
  CheckShapeField(shape.hidden_size, "hidden_size");
  CheckShapeField(shape.num_layers, "num_layers");
  CheckShapeField(shape.ffn_hidden_size, "ffn_hidden_size");
  CheckShapeField(shape.num_attention_heads, "num_attention_heads");
  CheckShapeField(shape.num_kv_heads, "num_kv_heads");
  CheckShapeField(shape.vocab_size, "vocab_size");
  if (shape.hidden_size % shape.num_attention_heads != 0) {
    rlsched::Fail("model.num_attention_heads", "must divide hidden_size (" +
                                                   std::to_string(shape.hidden_size) + "), got " +
                                                   std::to_string(shape.num_attention_heads));
  }
  if (shape.num_attention_heads % shape.num_kv_heads != 0) {
    rlsched::Fail("model.num_kv_heads", "must divide num_attention_heads (" +
                                            std::to_string(shape.num_attention_heads) + "), got " +
                                            std::to_string(shape.num_kv_heads));
  }
}

void CheckWork(const TransformerWork& work) {
  if (!std::isfinite(work.flops_per_token) || work.flops_per_token <= 0.0) {
    rlsched::FailBound("work.flops_per_token", "finite and > 0", work.flops_per_token);
  }
  if (!std::isfinite(work.flops_per_squared_token) || work.flops_per_squared_token < 0.0) {
    rlsched::FailBound("work.flops_per_squared_token", "finite and >= 0",
                       work.flops_per_squared_token);
  }
  if (!std::isfinite(work.parameters) || work.parameters < 0.0) {
    rlsched::FailBound("work.parameters", "finite and >= 0", work.parameters);
  }
  if (work.num_layers < 1) rlsched::FailBound("work.num_layers", ">= 1", work.num_layers);
}

// The smallest value an overhead-model field may take.
enum class AtLeast { kPositive, kZero };

void CheckOverheadField(double value, AtLeast at_least, const char* name) {
  const bool positive = at_least == AtLeast::kPositive;
  if (!std::isfinite(value) || value < 0.0 || (positive && value == 0.0)) {
    rlsched::FailBound(std::string("overhead_model.") + name,
                       positive ? "finite and > 0" : "finite and >= 0", value);
  }
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
  CheckOverheadField(model.flops_per_second, AtLeast::kPositive, "flops_per_second");
  CheckOverheadField(model.memory_bytes_per_second, AtLeast::kPositive, "memory_bytes_per_second");
  CheckOverheadField(model.bytes_per_parameter, AtLeast::kZero, "bytes_per_parameter");
  CheckOverheadField(model.kernels_per_layer, AtLeast::kZero, "kernels_per_layer");
  CheckOverheadField(model.kernel_latency_seconds, AtLeast::kZero, "kernel_latency_seconds");
  CheckOverheadField(model.framework_seconds, AtLeast::kZero, "framework_seconds");
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
  CheckCoefficient(linear, "coefficients.linear");
  CheckCoefficient(quadratic, "coefficients.quadratic");
  CheckCoefficient(constant, "coefficients.constant");
  if (linear + quadratic <= 0.0) rlsched::Fail("coefficients", "linear + quadratic must be > 0");
  return CostModel(Kind::kAttention, linear, quadratic, constant,
                   OverheadFor(WorkOf(ModelShape{}), linear));
}

CostModel CostModel::Attention(const ModelShape& shape, double constant) {
  return Attention(WorkOf(shape), constant);
}

CostModel CostModel::Attention(const TransformerWork& work, double constant) {
  CheckWork(work);
  CheckCoefficient(constant, "per_sequence");
  return CostModel(Kind::kAttention, 1.0, work.flops_per_squared_token / work.flops_per_token,
                   constant, OverheadFor(work, 1.0));
}

std::int64_t CostModel::Cost(std::int64_t length) const {
  if (length < 0 || length > kMaxLength) {
    rlsched::Fail("lengths", "each length must be in [0, 2^31], got " + std::to_string(length));
  }
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
    if (lengths[i] < 0 || lengths[i] > kMaxLength) {
      rlsched::FailBound("lengths[" + std::to_string(i) + "]", "in [0, 2^31]", lengths[i]);
    }
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
