#include "balance_convert.h"

#include <fmt/format.h>
#include <google/protobuf/util/json_util.h>

#include <cmath>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string_view>

#include "rlsched/balance/partition.h"

namespace rlsched::scheduler {
namespace {

[[noreturn]] void Fail(std::string_view field, std::string_view what) {
  throw std::invalid_argument(fmt::format("{}: {}", field, what));
}

void CheckAtLeastOne(std::string_view field, std::int64_t value) {
  if (value < 1) Fail(field, fmt::format("must be >= 1, got {}", value));
}

void CheckNonNegativeFinite(std::string_view field, double value) {
  if (!std::isfinite(value) || value < 0.0) {
    Fail(field, fmt::format("must be finite and >= 0, got {}", value));
  }
}

balance::ModelShape ToModelShape(const v1::ModelShape& model) {
  CheckAtLeastOne("cost.model.hidden_size", model.hidden_size());
  CheckAtLeastOne("cost.model.num_layers", model.num_layers());
  CheckAtLeastOne("cost.model.ffn_hidden_size", model.ffn_hidden_size());
  CheckAtLeastOne("cost.model.num_attention_heads", model.num_attention_heads());
  CheckAtLeastOne("cost.model.vocab_size", model.vocab_size());
  if (model.num_kv_heads() < 0) {
    Fail("cost.model.num_kv_heads",
         fmt::format("must be >= 0 (0 means num_attention_heads), got {}", model.num_kv_heads()));
  }
  if (model.hidden_size() % model.num_attention_heads() != 0) {
    Fail("cost.model.num_attention_heads",
         fmt::format("must divide hidden_size ({}), got {}", model.hidden_size(),
                     model.num_attention_heads()));
  }
  const std::int64_t kv_heads =
      model.num_kv_heads() == 0 ? model.num_attention_heads() : model.num_kv_heads();
  if (model.num_attention_heads() % kv_heads != 0) {
    Fail("cost.model.num_kv_heads", fmt::format("must divide num_attention_heads ({}), got {}",
                                                model.num_attention_heads(), kv_heads));
  }
  balance::ModelShape shape;
  shape.hidden_size = model.hidden_size();
  shape.num_layers = model.num_layers();
  shape.ffn_hidden_size = model.ffn_hidden_size();
  shape.num_attention_heads = model.num_attention_heads();
  shape.num_kv_heads = kv_heads;
  shape.vocab_size = model.vocab_size();
  shape.gated_mlp = !model.plain_mlp();
  return shape;
}

balance::CostModel ToCostModel(const v1::CostModel& cost) {
  switch (cost.kind()) {
    case v1::COST_KIND_UNSPECIFIED:
    case v1::COST_KIND_TOKENS:
      if (cost.has_model() || cost.has_coefficients()) {
        Fail("cost", "model and coefficients apply only to COST_KIND_ATTENTION");
      }
      if (cost.per_sequence() != 0.0) {
        Fail("cost.per_sequence", "applies only to COST_KIND_ATTENTION with a model");
      }
      return balance::CostModel::Tokens();
    case v1::COST_KIND_ATTENTION:
      break;
    default:
      Fail("cost.kind", fmt::format("unknown value {}", static_cast<int>(cost.kind())));
  }
  if (cost.has_model() == cost.has_coefficients()) {
    Fail("cost", "COST_KIND_ATTENTION needs exactly one of model and coefficients");
  }
  if (cost.has_model()) {
    const balance::ModelShape shape = ToModelShape(cost.model());
    CheckNonNegativeFinite("cost.per_sequence", cost.per_sequence());
    return balance::CostModel::Attention(shape, cost.per_sequence());
  }
  if (cost.per_sequence() != 0.0) {
    Fail("cost.per_sequence", "applies only with a model; use coefficients.constant");
  }
  const v1::CostCoefficients& coefficients = cost.coefficients();
  CheckNonNegativeFinite("cost.coefficients.linear", coefficients.linear());
  CheckNonNegativeFinite("cost.coefficients.quadratic", coefficients.quadratic());
  CheckNonNegativeFinite("cost.coefficients.constant", coefficients.constant());
  if (!(coefficients.linear() + coefficients.quadratic() > 0.0)) {
    Fail("cost.coefficients", "linear + quadratic must be > 0");
  }
  return balance::CostModel::Attention(coefficients.linear(), coefficients.quadratic(),
                                       coefficients.constant());
}

balance::Algorithm ToAlgorithm(v1::Algorithm algorithm) {
  switch (algorithm) {
    case v1::ALGORITHM_UNSPECIFIED:
    case v1::ALGORITHM_KARMARKAR_KARP:
      return balance::Algorithm::kKarmarkarKarp;
    case v1::ALGORITHM_GREEDY:
      return balance::Algorithm::kGreedy;
    default:
      Fail("algorithm", fmt::format("unknown value {}", static_cast<int>(algorithm)));
  }
}

std::span<const std::int64_t> AsSpan(const google::protobuf::RepeatedField<std::int64_t>& field) {
  return {field.data(), static_cast<std::size_t>(field.size())};
}

}  // namespace

balance::BalanceOptions ToBalanceOptions(const v1::BalanceRequest& request) {
  if (request.num_parts() < 1 || request.num_parts() > balance::kMaxParts) {
    Fail("num_parts",
         fmt::format("must be in [1, {}], got {}", balance::kMaxParts, request.num_parts()));
  }
  const std::int64_t n = request.lengths_size();
  if (n > balance::kMaxItems) {
    Fail("lengths", fmt::format("at most {} entries, got {}", balance::kMaxItems, n));
  }
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t length = request.lengths(static_cast<int>(i));
    if (length < 0 || length > balance::kMaxLength) {
      Fail(fmt::format("lengths[{}]", i),
           fmt::format("must be in [0, {}], got {}", balance::kMaxLength, length));
    }
  }
  if (request.groups_size() != 0) {
    if (request.groups_size() != n) {
      Fail("groups", fmt::format("must be empty or have one entry per length ({}), got {}", n,
                                 request.groups_size()));
    }
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t group = request.groups(static_cast<int>(i));
      if (group < 0) Fail(fmt::format("groups[{}]", i), fmt::format("must be >= 0, got {}", group));
    }
  }
  if (request.keep_groups() && request.groups_size() == 0) {
    Fail("keep_groups", "requires groups (one group id per length)");
  }

  balance::BalanceOptions options;
  options.partition.num_parts = request.num_parts();
  options.partition.equal_size = request.equal_size();
  options.partition.algorithm = ToAlgorithm(request.algorithm());
  if (request.has_refine_iterations()) {
    if (request.refine_iterations() < 0) {
      Fail("refine_iterations", fmt::format("must be >= 0, got {}", request.refine_iterations()));
    }
    options.partition.refine.enabled = request.refine_iterations() > 0;
    options.partition.refine.max_iterations = request.refine_iterations();
  }
  options.keep_groups = request.keep_groups();
  options.cost = ToCostModel(request.cost());
  return options;
}

v1::BalanceReply SolveBalance(const v1::BalanceRequest& request) {
  const balance::BalanceOptions options = ToBalanceOptions(request);
  const balance::BalanceResult result =
      balance::Balance(AsSpan(request.lengths()), AsSpan(request.groups()), options);
  const balance::Partition& partition = result.partition;

  v1::BalanceReply reply;
  reply.mutable_parts()->Reserve(static_cast<int>(partition.num_parts()));
  for (std::int64_t p = 0; p < partition.num_parts(); ++p) {
    const std::span<const std::int64_t> indices = partition.part(p);
    v1::Part* part = reply.add_parts();
    part->mutable_indices()->Reserve(static_cast<int>(indices.size()));
    for (const std::int64_t index : indices) part->add_indices(index);
    part->set_tokens(result.tokens[static_cast<std::size_t>(p)]);
    part->set_cost(partition.loads[static_cast<std::size_t>(p)]);
  }
  reply.set_max_cost(partition.max_load);
  reply.set_min_cost(partition.min_load);
  reply.set_lower_bound(partition.lower_bound);
  reply.set_gap(partition.gap);
  reply.set_proven_optimal(partition.proven_optimal);
  return reply;
}

std::string ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions print_options;
  print_options.preserve_proto_field_names = true;
  print_options.always_print_primitive_fields = true;
  std::string json;
  const auto status = google::protobuf::util::MessageToJsonString(message, &json, print_options);
  if (!status.ok()) {
    throw std::runtime_error(
        fmt::format("cannot print {} as JSON: {}", message.GetTypeName(), status.ToString()));
  }
  return json;
}

}  // namespace rlsched::scheduler
