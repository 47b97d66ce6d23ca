#include "rlsched/wire/balance_convert.h"

#include <fmt/format.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <ostream>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>

#include "rlsched/balance/partition.h"
#include "rlsched/common/check.h"
#include "rlsched/common/error.h"
#include "rlsched/rollout/model.h"
#include "rlsched/wire/reshard_convert.h"

namespace rlsched::wire {

namespace {

// The library validates the shape (CostModel::Attention()); only the wire's own
// convention is checked here: num_kv_heads 0 means num_attention_heads.
balance::ModelShape ToModelShape(const v1::ModelShape& model) {
  CheckAtLeast("model.num_kv_heads", model.num_kv_heads(), 0, "(0 means num_attention_heads)");
  const std::int64_t kv_heads =
      model.num_kv_heads() == 0 ? model.num_attention_heads() : model.num_kv_heads();
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

// The cost model of a Hugging Face config.json's text (errors name
// "model_config_json.config.<key>").
balance::CostModel CostModelOfConfig(const v1::CostModel& cost) {
  if (cost.has_model() || cost.has_coefficients()) {
    Fail("model_config_json", "cannot be combined with model or coefficients");
  }
  const auto bytes = static_cast<std::int64_t>(cost.model_config_json().size());
  if (bytes > kMaxModelConfigBytes) {
    FailBound("model_config_json", fmt::format("at most {} bytes", kMaxModelConfigBytes), bytes);
  }
  rollout::ModelConfig model;
  rollout::TrainingFlops flops;
  try {
    model = rollout::ParseHfConfig(cost.model_config_json());
    flops = rollout::TrainingFlopsOf(model);
  } catch (const FieldError& e) {
    throw e.Within("model_config_json");
  }
  balance::TransformerWork work;
  work.flops_per_token = flops.per_token;
  work.flops_per_squared_token = flops.per_squared_token;
  work.parameters = flops.parameters;
  work.num_layers = model.num_layers;
  return balance::CostModel::Attention(work, cost.per_sequence());
}

balance::CostModel CostModelOf(const v1::CostModel& cost) {
  const bool from_config = !cost.model_config_json().empty();
  switch (cost.kind()) {
    case v1::COST_KIND_UNSPECIFIED:
      if (from_config) return CostModelOfConfig(cost);
      [[fallthrough]];
    case v1::COST_KIND_TOKENS:
      if (cost.has_model() || cost.has_coefficients() || from_config) {
        Fail("", "model, coefficients and model_config_json apply only to COST_KIND_ATTENTION");
      }
      if (cost.per_sequence() != 0.0) {
        Fail("per_sequence", "applies only to COST_KIND_ATTENTION with a model");
      }
      return balance::CostModel::Tokens();
    case v1::COST_KIND_ATTENTION:
      break;
    default:
      Fail("kind", fmt::format("unknown value {}", static_cast<int>(cost.kind())));
  }
  if (from_config) return CostModelOfConfig(cost);
  if (cost.has_model() == cost.has_coefficients()) {
    Fail("", "COST_KIND_ATTENTION needs exactly one of model, coefficients and model_config_json");
  }
  if (cost.has_model()) {
    return balance::CostModel::Attention(ToModelShape(cost.model()), cost.per_sequence());
  }
  if (cost.per_sequence() != 0.0) {
    Fail("per_sequence", "applies only with a model; use coefficients.constant");
  }
  const v1::CostCoefficients& coefficients = cost.coefficients();
  return balance::CostModel::Attention(coefficients.linear(), coefficients.quadratic(),
                                       coefficients.constant());
}

// The request's cost field; errors name their path under "cost".
balance::CostModel ToCostModel(const v1::CostModel& cost) {
  try {
    return CostModelOf(cost);
  } catch (const FieldError& e) {
    throw e.Within("cost");
  }
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

balance::MicroBatchOrder ToMicroBatchOrder(v1::MicroBatchOrder order) {
  switch (order) {
    case v1::MICRO_BATCH_ORDER_UNSPECIFIED:
    case v1::MICRO_BATCH_ORDER_PIPELINE:
      return balance::MicroBatchOrder::kPipeline;
    case v1::MICRO_BATCH_ORDER_HEAVIEST_FIRST:
      return balance::MicroBatchOrder::kHeaviestFirst;
    default:
      Fail("order", fmt::format("unknown value {}", static_cast<int>(order)));
  }
}

balance::OversizePolicy ToOversizePolicy(v1::OversizePolicy policy) {
  switch (policy) {
    case v1::OVERSIZE_POLICY_UNSPECIFIED:
    case v1::OVERSIZE_POLICY_RAISE:
      return balance::OversizePolicy::kRaise;
    case v1::OVERSIZE_POLICY_ALONE:
      return balance::OversizePolicy::kAlone;
    default:
      Fail("oversize", fmt::format("unknown value {}", static_cast<int>(policy)));
  }
}

using Int64Field = google::protobuf::RepeatedField<std::int64_t>;

std::span<const std::int64_t> AsSpan(const Int64Field& field) {
  return {field.data(), static_cast<std::size_t>(field.size())};
}

// The sequence fields every request has: at most kMaxItems lengths, each in
// [0, kMaxLength]; groups empty or one id >= 0 per length; keep_groups needs groups.
void CheckSequences(const Int64Field& lengths, const Int64Field& groups, bool keep_groups) {
  const std::int64_t n = lengths.size();
  if (n > balance::kMaxItems) {
    Fail("lengths", fmt::format("at most {} entries, got {}", balance::kMaxItems, n));
  }
  for (std::int64_t i = 0; i < n; ++i) {
    CheckInRange({"lengths", std::size_t(i)}, lengths.Get(static_cast<int>(i)), 0,
                 balance::kMaxLength);
  }
  if (groups.size() != 0) {
    if (groups.size() != n) {
      Fail("groups", fmt::format("must be empty or have one entry per length ({}), got {}", n,
                                 groups.size()));
    }
    for (std::int64_t i = 0; i < n; ++i) {
      CheckAtLeast({"groups", std::size_t(i)}, groups.Get(static_cast<int>(i)), 0);
    }
  }
  if (keep_groups && groups.size() == 0) {
    Fail("keep_groups", "requires groups (one group id per length)");
  }
}

// The refinement budget of an optional refine_iterations field: unset keeps the
// library's default; 0 disables refinement.
balance::RefineOptions ToRefineOptions(bool has_refine_iterations, std::int64_t refine_iterations) {
  balance::RefineOptions refine;
  if (has_refine_iterations) {
    CheckAtLeast("refine_iterations", refine_iterations, 0);
    refine.enabled = refine_iterations > 0;
    refine.max_iterations = refine_iterations;
  }
  return refine;
}

}  // namespace

balance::BalanceOptions ToBalanceOptions(const v1::BalanceRequest& request) {
  CheckInRange("num_parts", request.num_parts(), 1, balance::kMaxParts);
  CheckSequences(request.lengths(), request.groups(), request.keep_groups());

  balance::BalanceOptions options;
  options.partition.num_parts = request.num_parts();
  options.partition.equal_size = request.equal_size();
  options.partition.algorithm = ToAlgorithm(request.algorithm());
  options.partition.refine =
      ToRefineOptions(request.has_refine_iterations(), request.refine_iterations());
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
    for (const std::int64_t index : indices) part->add_indices(static_cast<std::int32_t>(index));
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

balance::StepOptions ToStepOptions(const v1::PlanStepRequest& request) {
  CheckInRange("num_ranks", request.num_ranks(), 1, balance::kMaxParts);
  CheckSequences(request.lengths(), request.groups(), request.keep_groups());

  balance::StepOptions options;
  options.num_ranks = request.num_ranks();
  options.equal_size = request.equal_size();
  options.keep_groups = request.keep_groups();
  options.baseline = !request.skip_baseline();
  balance::MicroBatchOptions& micro_batch = options.micro_batch;
  CheckAtLeast("max_tokens_per_micro_batch", request.max_tokens_per_micro_batch(), 1);
  micro_batch.max_tokens_per_micro_batch = request.max_tokens_per_micro_batch();
  micro_batch.min_micro_batches =
      ZeroMeansOne("min_micro_batches", request.min_micro_batches(), balance::kMaxParts);
  micro_batch.micro_batches_multiple_of = ZeroMeansOne(
      "micro_batches_multiple_of", request.micro_batches_multiple_of(), balance::kMaxParts);
  micro_batch.pad_to_multiple_of = ZeroMeansOne("pad_to_multiple_of", request.pad_to_multiple_of(),
                                                std::numeric_limits<std::int64_t>::max());
  micro_batch.pipeline_stages =
      ZeroMeansOne("pipeline_stages", request.pipeline_stages(), balance::kMaxParts);
  if (request.has_overhead()) {
    micro_batch.overhead = CheckAtLeast("overhead", request.overhead(), 0);
  }
  if (request.has_count_tolerance()) {
    micro_batch.count_tolerance = CheckRealInRange("count_tolerance", request.count_tolerance(),
                                                   0.0, End::kClosed, 1.0, End::kClosed);
  }
  micro_batch.order = ToMicroBatchOrder(request.order());
  micro_batch.oversize = ToOversizePolicy(request.oversize());
  micro_batch.refine =
      ToRefineOptions(request.has_refine_iterations(), request.refine_iterations());
  micro_batch.cost = ToCostModel(request.cost());
  return options;
}

v1::PlanStepReply ToPlanStepReply(const balance::PlannedStep& step) {
  const balance::StepPlan& plan = step.plan;
  v1::PlanStepReply reply;
  reply.mutable_ranks()->Reserve(static_cast<int>(plan.ranks.size()));
  for (const balance::RankPlan& rank_plan : plan.ranks) {
    v1::RankPlan* rank = reply.add_ranks();
    rank->mutable_micro_batches()->Reserve(static_cast<int>(rank_plan.micro_batches.size()));
    for (const balance::MicroBatch& batch : rank_plan.micro_batches) {
      v1::MicroBatch* micro_batch = rank->add_micro_batches();
      for (const std::int64_t index : batch.indices) {
        micro_batch->add_indices(static_cast<std::int32_t>(index));
      }
      micro_batch->set_tokens(batch.tokens);
      micro_batch->set_cost(batch.cost);
      micro_batch->set_unpadded_tokens(batch.unpadded_tokens);
    }
    rank->set_tokens(rank_plan.tokens);
    rank->set_cost(rank_plan.cost);
    rank->set_time(rank_plan.time);
    rank->set_sequences(rank_plan.sequences);
    rank->set_unpadded_tokens(rank_plan.unpadded_tokens);
  }
  reply.set_micro_batches(plan.num_micro_batches);
  reply.set_predicted_step_time(plan.predicted_step_time);
  reply.set_lower_bound(plan.lower_bound);
  v1::BaselinePlan* baseline = reply.mutable_baseline();
  baseline->set_predicted_step_time(step.baseline.predicted_step_time);
  baseline->set_cap_violations(step.baseline.cap_violations);
  baseline->set_micro_batches(step.baseline.num_micro_batches);
  baseline->set_empty_micro_batches(step.baseline.empty_micro_batches);
  reply.set_overhead(plan.overhead);
  reply.set_sequences(plan.sequences);
  reply.set_tokens(plan.tokens);
  reply.set_unpadded_tokens(plan.unpadded_tokens);
  reply.set_empty_micro_batches(plan.empty_micro_batches);
  reply.set_empty_ranks(plan.empty_ranks);
  reply.set_oversized(plan.oversized);
  return reply;
}

v1::PlanStepReply SolvePlanStep(const v1::PlanStepRequest& request) {
  const balance::StepOptions options = ToStepOptions(request);
  // The library names a sequence above the cap and the cap; its message passes through.
  return ToPlanStepReply(
      balance::PlanStep(AsSpan(request.lengths()), AsSpan(request.groups()), options));
}

void WriteJson(const v1::BalanceReply& reply, std::ostream& out) {
  // The other fields as ToJson prints them, parts (field 1, printed first) empty.
  v1::BalanceReply rest = reply;
  rest.clear_parts();
  const std::string tail = ToJson(rest);
  constexpr std::string_view kEmptyParts = "{\"parts\":[]";
  if (!std::string_view(tail).starts_with(kEmptyParts)) {
    out << ToJson(reply);  // a layout this writer does not expect: the whole message
    return;
  }
  out << "{\"parts\":[";
  for (int i = 0; i < reply.parts_size(); ++i) {
    if (i > 0) out << ',';
    out << ToJson(reply.parts(i));
  }
  out << ']' << std::string_view(tail).substr(kEmptyParts.size());
}

namespace {

// The JSON of a MicroBatch and of a RankPlan's fields after micro_batches, as protobuf's
// printer writes them (field order, int64 as strings, int32 as numbers, every field).
void AppendJson(const v1::MicroBatch& batch, std::string& text) {
  text += "{\"indices\":[";
  for (int i = 0; i < batch.indices_size(); ++i) {
    if (i > 0) text += ',';
    fmt::format_to(std::back_inserter(text), "{}", batch.indices(i));
  }
  fmt::format_to(std::back_inserter(text),
                 "],\"tokens\":\"{}\",\"cost\":\"{}\",\"unpadded_tokens\":\"{}\"}}", batch.tokens(),
                 batch.cost(), batch.unpadded_tokens());
}

void AppendRankTail(const v1::RankPlan& rank, std::string& text) {
  fmt::format_to(std::back_inserter(text),
                 "],\"tokens\":\"{}\",\"cost\":\"{}\",\"time\":\"{}\",\"sequences\":\"{}\","
                 "\"unpadded_tokens\":\"{}\"}}",
                 rank.tokens(), rank.cost(), rank.time(), rank.sequences(), rank.unpadded_tokens());
}

// A rank's JSON as AppendJson and AppendRankTail write it, with at most `limit`
// micro-batches.
void AppendJson(const v1::RankPlan& rank, int limit, std::string& text) {
  text += "{\"micro_batches\":[";
  const int count = std::min(limit, rank.micro_batches_size());
  for (int j = 0; j < count; ++j) {
    if (j > 0) text += ',';
    AppendJson(rank.micro_batches(j), text);
  }
  AppendRankTail(rank, text);
}

// Whether AppendJson writes what ToJson does for these messages: the fields it knows
// (RankPlan 1..6, MicroBatch 1..4) and a probe (the first rank's
// scalars and its first micro-batch) printed identically.
bool HandWrittenJsonFits(const v1::PlanStepReply& reply) {
  if (v1::RankPlan::descriptor()->field_count() != 6 ||
      v1::MicroBatch::descriptor()->field_count() != 4) {
    return false;
  }
  if (reply.ranks_size() == 0) return true;
  const v1::RankPlan& first = reply.ranks(0);
  v1::RankPlan probe;
  probe.set_tokens(first.tokens());
  probe.set_cost(first.cost());
  probe.set_time(first.time());
  probe.set_sequences(first.sequences());
  probe.set_unpadded_tokens(first.unpadded_tokens());
  if (first.micro_batches_size() > 0) {
    v1::MicroBatch* batch = probe.add_micro_batches();
    const v1::MicroBatch& source = first.micro_batches(0);
    batch->mutable_indices()->CopyFrom(source.indices());
    batch->set_tokens(source.tokens());
    batch->set_cost(source.cost());
    batch->set_unpadded_tokens(source.unpadded_tokens());
  }
  std::string text;
  AppendJson(probe, 1, text);
  return text == ToJson(probe);
}

}  // namespace

void WriteJson(const v1::PlanStepReply& reply, std::ostream& out) {
  // The other fields as ToJson prints them, ranks (field 1, printed first) empty: built
  // field by field, not copied, so that the ranks are not copied either.
  v1::PlanStepReply rest;
  rest.set_micro_batches(reply.micro_batches());
  rest.set_predicted_step_time(reply.predicted_step_time());
  rest.set_lower_bound(reply.lower_bound());
  if (reply.has_baseline()) *rest.mutable_baseline() = reply.baseline();
  rest.set_overhead(reply.overhead());
  rest.set_sequences(reply.sequences());
  rest.set_tokens(reply.tokens());
  rest.set_unpadded_tokens(reply.unpadded_tokens());
  rest.set_empty_micro_batches(reply.empty_micro_batches());
  rest.set_empty_ranks(reply.empty_ranks());
  rest.set_oversized(reply.oversized());
  const std::string tail = ToJson(rest);
  constexpr std::string_view kEmptyRanks = "{\"ranks\":[]";
  if (v1::PlanStepReply::descriptor()->field_count() != 12 ||
      !std::string_view(tail).starts_with(kEmptyRanks) || !HandWrittenJsonFits(reply)) {
    out << ToJson(reply);  // a layout this writer does not know: the whole message
    return;
  }
  constexpr std::size_t kFlushBytes = std::size_t{1} << 16;
  std::string text = "{\"ranks\":[";
  for (int r = 0; r < reply.ranks_size(); ++r) {
    if (r > 0) text += ',';
    const v1::RankPlan& rank = reply.ranks(r);
    text += "{\"micro_batches\":[";
    for (int j = 0; j < rank.micro_batches_size(); ++j) {
      if (j > 0) text += ',';
      AppendJson(rank.micro_batches(j), text);
      if (text.size() >= kFlushBytes) {
        out << text;
        text.clear();
      }
    }
    AppendRankTail(rank, text);
    if (text.size() >= kFlushBytes) {
      out << text;
      text.clear();
    }
  }
  text += ']';
  text += std::string_view(tail).substr(kEmptyRanks.size());
  out << text;
}

}  // namespace rlsched::wire
