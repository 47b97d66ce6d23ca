#include "rlsched/wire/balance_convert.h"

#include <gmock/gmock.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "rlsched/common/error.h"
#include "rlsched/workload/workload.h"
#include "rlsched/wire/reshard_convert.h"

namespace rlsched::wire {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

v1::BalanceRequest SmallRequest() {
  v1::BalanceRequest request;
  for (const std::int64_t length : {4096, 512, 700, 3000, 2048, 128}) request.add_lengths(length);
  request.set_num_parts(2);
  return request;
}

// Either request with an attention cost from a Llama-3.1-8B shape.
template <typename Request>
Request WithModel(Request request) {
  v1::CostModel* cost = request.mutable_cost();
  cost->set_kind(v1::COST_KIND_ATTENTION);
  v1::ModelShape* model = cost->mutable_model();
  model->set_hidden_size(4096);
  model->set_num_layers(32);
  model->set_ffn_hidden_size(14336);
  model->set_num_attention_heads(32);
  model->set_num_kv_heads(8);
  model->set_vocab_size(128256);
  return request;
}

// Either request with an attention cost from coefficients.
template <typename Request>
Request WithCoefficients(Request request) {
  v1::CostModel* cost = request.mutable_cost();
  cost->set_kind(v1::COST_KIND_ATTENTION);
  cost->mutable_coefficients()->set_linear(1.0);
  cost->mutable_coefficients()->set_quadratic(1e-4);
  return request;
}

void Convert(const v1::BalanceRequest& request) { ToBalanceOptions(request); }
void Convert(const v1::PlanStepRequest& request) { ToStepOptions(request); }

// The message of the std::invalid_argument that converting `request` throws.
template <typename Request>
std::string ConversionError(const Request& request) {
  try {
    Convert(request);
  } catch (const rlsched::FieldError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no std::invalid_argument for " << request.ShortDebugString();
  return "";
}

TEST(BalanceConvertTest, Defaults) {
  const balance::BalanceOptions options = ToBalanceOptions(SmallRequest());
  EXPECT_EQ(options.partition.num_parts, 2);
  EXPECT_FALSE(options.partition.equal_size);
  EXPECT_EQ(options.partition.algorithm, balance::Algorithm::kKarmarkarKarp);
  EXPECT_TRUE(options.partition.refine.enabled);
  EXPECT_EQ(options.partition.refine.max_iterations, balance::RefineOptions{}.max_iterations);
  EXPECT_FALSE(options.keep_groups);
  EXPECT_EQ(options.cost.kind(), balance::CostModel::Kind::kTokens);
}

TEST(BalanceConvertTest, EveryOption) {
  v1::BalanceRequest request = WithCoefficients(SmallRequest());
  for (int i = 0; i < request.lengths_size(); ++i) request.add_groups(i / 2);
  request.set_num_parts(3);
  request.set_equal_size(true);
  request.set_keep_groups(true);
  request.set_algorithm(v1::ALGORITHM_GREEDY);
  request.set_refine_iterations(7);
  request.mutable_cost()->mutable_coefficients()->set_constant(5.0);
  const balance::BalanceOptions options = ToBalanceOptions(request);
  EXPECT_EQ(options.partition.num_parts, 3);
  EXPECT_TRUE(options.partition.equal_size);
  EXPECT_TRUE(options.keep_groups);
  EXPECT_EQ(options.partition.algorithm, balance::Algorithm::kGreedy);
  EXPECT_TRUE(options.partition.refine.enabled);
  EXPECT_EQ(options.partition.refine.max_iterations, 7);
  EXPECT_EQ(options.cost.kind(), balance::CostModel::Kind::kAttention);
  EXPECT_DOUBLE_EQ(options.cost.linear(), 1.0);
  EXPECT_DOUBLE_EQ(options.cost.quadratic(), 1e-4);
  EXPECT_DOUBLE_EQ(options.cost.constant(), 5.0);
}

TEST(BalanceConvertTest, ZeroRefineIterationsDisablesRefinement) {
  v1::BalanceRequest request = SmallRequest();
  request.set_refine_iterations(0);
  EXPECT_FALSE(ToBalanceOptions(request).partition.refine.enabled);
}

TEST(BalanceConvertTest, ModelShapeMatchesTheLibrary) {
  const v1::BalanceRequest request = WithModel(SmallRequest());
  const balance::CostModel expected = balance::CostModel::Attention(balance::ModelShape{});
  const balance::BalanceOptions options = ToBalanceOptions(request);
  EXPECT_DOUBLE_EQ(options.cost.linear(), expected.linear());
  EXPECT_DOUBLE_EQ(options.cost.quadratic(), expected.quadratic());
  EXPECT_EQ(options.cost.Cost(8192), expected.Cost(8192));
}

std::string ConfigText(const std::string& name) {
  std::ifstream file(std::string(RLSCHED_TEST_CONFIG_DIR) + "/" + name);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

// A Hugging Face config gives the attention cost of its architecture: a dense Llama the
// same as its shape; an MoE model its own (hand counts in tests/rollout); errors name
// the key under cost.model_config_json.
TEST(BalanceConvertTest, ModelConfigJsonGivesTheArchitecturesCost) {
  v1::BalanceRequest request = SmallRequest();
  request.mutable_cost()->set_model_config_json(ConfigText("llama-3.1-8b.json"));
  const balance::CostModel llama = ToBalanceOptions(request).cost;  // kind unset: attention
  const balance::CostModel shape = balance::CostModel::Attention(balance::ModelShape{});
  EXPECT_EQ(llama.kind(), balance::CostModel::Kind::kAttention);
  EXPECT_DOUBLE_EQ(llama.quadratic(), shape.quadratic());
  EXPECT_EQ(llama.Cost(32768), shape.Cost(32768));
  request.mutable_cost()->set_model_config_json(ConfigText("qwen3-30b-a3b.json"));
  request.mutable_cost()->set_kind(v1::COST_KIND_ATTENTION);
  request.mutable_cost()->set_per_sequence(7.0);
  const balance::CostModel qwen = ToBalanceOptions(request).cost;
  EXPECT_DOUBLE_EQ(qwen.quadratic(), 3.0 * 48 * 32 * 256 / 18'249'940'992.0);
  EXPECT_DOUBLE_EQ(qwen.constant(), 7.0);
  EXPECT_GT(qwen.micro_batch_overhead(), llama.micro_batch_overhead());

  const auto error = [](const v1::BalanceRequest& r) {
    try {
      ToBalanceOptions(r);
    } catch (const FieldError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  v1::BalanceRequest bad = request;
  bad.mutable_cost()->set_kind(v1::COST_KIND_TOKENS);
  EXPECT_THAT(error(bad), HasSubstr("apply only to COST_KIND_ATTENTION"));
  bad = request;
  bad.mutable_cost()->mutable_model()->set_hidden_size(64);
  EXPECT_THAT(error(bad), HasSubstr("cost.model_config_json: cannot be combined"));
  bad = request;
  bad.mutable_cost()->set_model_config_json(R"({"model_type": "llama", "hidden_size": 64})");
  EXPECT_THAT(error(bad), HasSubstr("cost.model_config_json.config.intermediate_size"));
  bad = request;
  bad.mutable_cost()->set_model_config_json(std::string(kMaxModelConfigBytes + 1, ' '));
  EXPECT_THAT(error(bad), HasSubstr("cost.model_config_json: must be at most"));
}

TEST(BalanceConvertTest, ZeroKvHeadsMeansAsManyAsHeads) {
  v1::BalanceRequest request = WithModel(SmallRequest());
  request.mutable_cost()->mutable_model()->set_num_kv_heads(0);
  request.mutable_cost()->mutable_model()->set_plain_mlp(true);
  balance::ModelShape shape;
  shape.num_kv_heads = shape.num_attention_heads;
  shape.gated_mlp = false;
  const balance::CostModel expected = balance::CostModel::Attention(shape);
  EXPECT_DOUBLE_EQ(ToBalanceOptions(request).cost.quadratic(), expected.quadratic());
}

TEST(BalanceConvertTest, LengthBoundsAreInclusive) {
  v1::BalanceRequest request = SmallRequest();
  request.add_lengths(0);
  request.add_lengths(balance::kMaxLength);
  request.set_num_parts(balance::kMaxParts);
  EXPECT_NO_THROW(ToBalanceOptions(request));
}

template <typename Request>
struct InvalidCase {
  std::string name;
  std::function<void(Request&)> mutate;
  std::string message;  // the error message starts with this
};

TEST(BalanceConvertTest, ValidationErrorsNameTheField) {
  const std::vector<InvalidCase<v1::BalanceRequest>> cases = {
      {"num_parts zero", [](auto& r) { r.set_num_parts(0); },
       "num_parts: must be in [1, 1048576], got 0"},
      {"num_parts too large", [](auto& r) { r.set_num_parts(balance::kMaxParts + 1); },
       "num_parts: must be in [1, 1048576], got 1048577"},
      {"negative length", [](auto& r) { r.set_lengths(1, -1); },
       "lengths[1]: must be in [0, 2147483648], got -1"},
      {"too long", [](auto& r) { r.set_lengths(0, balance::kMaxLength + 1); },
       "lengths[0]: must be in [0, 2147483648], got 2147483649"},
      {"groups size", [](auto& r) { r.add_groups(0); },
       "groups: must be empty or have one entry per length (6), got 1"},
      {"negative group",
       [](auto& r) {
         for (int i = 0; i < r.lengths_size(); ++i) r.add_groups(i == 3 ? -2 : 0);
       },
       "groups[3]: must be >= 0, got -2"},
      {"keep_groups without groups", [](auto& r) { r.set_keep_groups(true); }, "keep_groups: "},
      {"unknown algorithm", [](auto& r) { r.set_algorithm(static_cast<v1::Algorithm>(9)); },
       "algorithm: unknown value 9"},
      {"negative refine", [](auto& r) { r.set_refine_iterations(-1); },
       "refine_iterations: must be >= 0, got -1"},
      {"unknown cost kind",
       [](auto& r) { r.mutable_cost()->set_kind(static_cast<v1::CostKind>(5)); },
       "cost.kind: unknown value 5"},
      {"attention without model or coefficients",
       [](auto& r) { r.mutable_cost()->set_kind(v1::COST_KIND_ATTENTION); },
       "cost: COST_KIND_ATTENTION needs exactly one of model, coefficients and model_config_json"},
      {"attention with model and coefficients", [](auto& r) { r = WithModel(WithCoefficients(r)); },
       "cost: COST_KIND_ATTENTION needs exactly one of model, coefficients and model_config_json"},
      {"tokens with a model",
       [](auto& r) {
         r = WithModel(r);
         r.mutable_cost()->set_kind(v1::COST_KIND_TOKENS);
       },
       "cost: model, coefficients and model_config_json apply only to COST_KIND_ATTENTION"},
      {"unspecified kind with coefficients",
       [](auto& r) {
         r = WithCoefficients(r);
         r.mutable_cost()->set_kind(v1::COST_KIND_UNSPECIFIED);
       },
       "cost: model, coefficients and model_config_json apply only to COST_KIND_ATTENTION"},
      {"tokens with per_sequence", [](auto& r) { r.mutable_cost()->set_per_sequence(1.0); },
       "cost.per_sequence: "},
      {"hidden_size",
       [](auto& r) { (r = WithModel(r)).mutable_cost()->mutable_model()->set_hidden_size(0); },
       "cost.model.hidden_size: must be >= 1, got 0"},
      {"num_layers",
       [](auto& r) { (r = WithModel(r)).mutable_cost()->mutable_model()->set_num_layers(-1); },
       "cost.model.num_layers: must be >= 1, got -1"},
      {"ffn_hidden_size",
       [](auto& r) { (r = WithModel(r)).mutable_cost()->mutable_model()->set_ffn_hidden_size(0); },
       "cost.model.ffn_hidden_size: must be >= 1, got 0"},
      {"num_attention_heads",
       [](auto& r) {
         (r = WithModel(r)).mutable_cost()->mutable_model()->set_num_attention_heads(0);
       },
       "cost.model.num_attention_heads: must be >= 1, got 0"},
      {"vocab_size",
       [](auto& r) { (r = WithModel(r)).mutable_cost()->mutable_model()->set_vocab_size(0); },
       "cost.model.vocab_size: must be >= 1, got 0"},
      {"negative num_kv_heads",
       [](auto& r) { (r = WithModel(r)).mutable_cost()->mutable_model()->set_num_kv_heads(-1); },
       "cost.model.num_kv_heads: must be >= 0"},
      {"heads do not divide hidden",
       [](auto& r) {
         (r = WithModel(r)).mutable_cost()->mutable_model()->set_num_attention_heads(3);
       },
       "cost.model.num_attention_heads: must divide hidden_size (4096), got 3"},
      {"kv heads do not divide heads",
       [](auto& r) { (r = WithModel(r)).mutable_cost()->mutable_model()->set_num_kv_heads(5); },
       "cost.model.num_kv_heads: must divide num_attention_heads (32), got 5"},
      {"negative per_sequence",
       [](auto& r) { (r = WithModel(r)).mutable_cost()->set_per_sequence(-1.0); },
       "cost.per_sequence: must be finite and >= 0, got -1"},
      {"per_sequence with coefficients",
       [](auto& r) { (r = WithCoefficients(r)).mutable_cost()->set_per_sequence(1.0); },
       "cost.per_sequence: "},
      {"negative linear",
       [](auto& r) {
         (r = WithCoefficients(r)).mutable_cost()->mutable_coefficients()->set_linear(-1.0);
       },
       "cost.coefficients.linear: must be finite and >= 0, got -1"},
      {"NaN quadratic",
       [](auto& r) {
         (r = WithCoefficients(r))
             .mutable_cost()
             ->mutable_coefficients()
             ->set_quadratic(std::numeric_limits<double>::quiet_NaN());
       },
       "cost.coefficients.quadratic: must be finite and >= 0"},
      {"infinite constant",
       [](auto& r) {
         (r = WithCoefficients(r))
             .mutable_cost()
             ->mutable_coefficients()
             ->set_constant(std::numeric_limits<double>::infinity());
       },
       "cost.coefficients.constant: must be finite and >= 0"},
      {"zero coefficients",
       [](auto& r) {
         v1::CostCoefficients* c = (r = WithCoefficients(r)).mutable_cost()->mutable_coefficients();
         c->set_linear(0.0);
         c->set_quadratic(0.0);
         c->set_constant(3.0);
       },
       "cost.coefficients: linear + quadratic must be > 0"},
  };
  for (const InvalidCase<v1::BalanceRequest>& c : cases) {
    SCOPED_TRACE(c.name);
    v1::BalanceRequest request = SmallRequest();
    c.mutate(request);
    EXPECT_THAT(ConversionError(request), StartsWith(c.message));
    EXPECT_THROW(SolveBalance(request), std::invalid_argument);
  }
}

// Checks everything a reply promises about `request`.
void ExpectValidReply(const v1::BalanceRequest& request, const v1::BalanceReply& reply) {
  const balance::BalanceOptions options = ToBalanceOptions(request);
  const std::vector<std::int64_t> lengths(request.lengths().begin(), request.lengths().end());
  const std::vector<std::int64_t> costs = options.cost.Costs(lengths);
  ASSERT_EQ(reply.parts_size(), request.num_parts());
  std::vector<int> seen(lengths.size(), 0);
  std::map<std::int64_t, int> part_of_group;
  std::int64_t max_cost = std::numeric_limits<std::int64_t>::min();
  std::int64_t min_cost = std::numeric_limits<std::int64_t>::max();
  std::int64_t total_cost = 0;
  for (int p = 0; p < reply.parts_size(); ++p) {
    const v1::Part& part = reply.parts(p);
    std::int64_t tokens = 0;
    std::int64_t cost = 0;
    for (int j = 0; j < part.indices_size(); ++j) {
      const std::int64_t index = part.indices(j);
      ASSERT_GE(index, 0);
      ASSERT_LT(index, request.lengths_size());
      if (j > 0) {
        EXPECT_LT(part.indices(j - 1), index) << "part " << p << " not ascending";
      }
      ++seen[static_cast<std::size_t>(index)];
      tokens += lengths[static_cast<std::size_t>(index)];
      cost += costs[static_cast<std::size_t>(index)];
      if (request.keep_groups()) {
        const auto [it, inserted] =
            part_of_group.emplace(request.groups(static_cast<int>(index)), p);
        EXPECT_EQ(it->second, p) << "group " << it->first << " split";
      }
    }
    EXPECT_EQ(part.tokens(), tokens) << "part " << p;
    EXPECT_EQ(part.cost(), cost) << "part " << p;
    max_cost = std::max(max_cost, cost);
    min_cost = std::min(min_cost, cost);
    total_cost += cost;
  }
  for (std::size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], 1) << "index " << i;
  EXPECT_EQ(reply.max_cost(), max_cost);
  EXPECT_EQ(reply.min_cost(), min_cost);
  EXPECT_LE(reply.lower_bound(), reply.max_cost());
  const std::int64_t k = request.num_parts();
  EXPECT_GE(reply.lower_bound(), (total_cost + k - 1) / k);
  // At the bound it is proven; small instances may also be proven by the exact search.
  if (reply.max_cost() == reply.lower_bound()) {
    EXPECT_TRUE(reply.proven_optimal());
  }
  if (reply.lower_bound() > 0) {
    EXPECT_NEAR(
        reply.gap(),
        static_cast<double>(reply.max_cost()) / static_cast<double>(reply.lower_bound()) - 1.0,
        1e-12);
  }
}

TEST(SolveBalanceTest, SmallInstance) {
  const v1::BalanceRequest request = SmallRequest();
  const v1::BalanceReply reply = SolveBalance(request);
  ExpectValidReply(request, reply);
  EXPECT_EQ(reply.lower_bound(), (4096 + 512 + 700 + 3000 + 2048 + 128 + 1) / 2);
}

TEST(SolveBalanceTest, MorePartsThanSequences) {
  v1::BalanceRequest request = SmallRequest();
  request.set_num_parts(10);
  const v1::BalanceReply reply = SolveBalance(request);
  ExpectValidReply(request, reply);
  EXPECT_EQ(reply.min_cost(), 0);
  EXPECT_EQ(reply.max_cost(), 4096);
  EXPECT_TRUE(reply.proven_optimal());
}

TEST(SolveBalanceTest, RandomRequestsAreValidAndDeterministic) {
  workload::Rng rng(2024);
  for (int trial = 0; trial < 60; ++trial) {
    SCOPED_TRACE(trial);
    const std::int64_t prompts = rng.UniformInt(1, 40);
    const std::int64_t samples = rng.UniformInt(1, 8);
    const workload::SyntheticBatch batch = workload::GrpoBatch(prompts, samples, rng.Next());
    v1::BalanceRequest request;
    request.mutable_lengths()->Add(batch.lengths.begin(), batch.lengths.end());
    if (rng.UniformInt(0, 1) == 1) {
      request.mutable_groups()->Add(batch.groups.begin(), batch.groups.end());
      request.set_keep_groups(rng.UniformInt(0, 1) == 1);
    }
    request.set_num_parts(rng.UniformInt(1, 24));
    request.set_equal_size(rng.UniformInt(0, 1) == 1);
    request.set_algorithm(rng.UniformInt(0, 2) == 0 ? v1::ALGORITHM_GREEDY
                                                    : v1::ALGORITHM_KARMARKAR_KARP);
    switch (rng.UniformInt(0, 2)) {
      case 0:
        break;
      case 1:
        request = WithModel(request);
        break;
      default:
        request = WithCoefficients(request);
        break;
    }
    if (rng.UniformInt(0, 3) == 0) request.set_refine_iterations(rng.UniformInt(0, 50));
    const v1::BalanceReply reply = SolveBalance(request);
    ExpectValidReply(request, reply);
    EXPECT_EQ(SolveBalance(request).SerializeAsString(), reply.SerializeAsString());
  }
}

TEST(SolveBalanceTest, EqualSizeCountsHold) {
  v1::BalanceRequest request;
  const std::vector<std::int64_t> lengths = workload::HeavyTailedLengths(103, 7);
  request.mutable_lengths()->Add(lengths.begin(), lengths.end());
  request.set_num_parts(10);
  request.set_equal_size(true);
  const v1::BalanceReply reply = SolveBalance(request);
  ExpectValidReply(request, reply);
  for (const v1::Part& part : reply.parts()) {
    EXPECT_GE(part.indices_size(), 10);
    EXPECT_LE(part.indices_size(), 11);
  }
}

TEST(ToJsonTest, ProtoFieldNamesAndDefaults) {
  v1::BalanceRequest request;
  request.add_lengths(5);
  request.set_num_parts(2);
  const std::string json = ToJson(SolveBalance(request));
  EXPECT_EQ(json.find('\n'), std::string::npos) << json;
  EXPECT_THAT(json, HasSubstr("\"max_cost\":\"5\""));
  EXPECT_THAT(json, HasSubstr("\"min_cost\":\"0\""));
  EXPECT_THAT(json, HasSubstr("\"lower_bound\":\"5\""));
  EXPECT_THAT(json, HasSubstr("\"gap\":0"));
  EXPECT_THAT(json, HasSubstr("\"proven_optimal\":true"));
  // The empty part prints its default-valued fields.
  EXPECT_THAT(json, HasSubstr("{\"indices\":[],\"tokens\":\"0\",\"cost\":\"0\"}"));
}

TEST(ToJsonTest, EnumsByName) {
  v1::BalanceRequest request = SmallRequest();
  EXPECT_THAT(ToJson(request), HasSubstr("\"algorithm\":\"ALGORITHM_UNSPECIFIED\""));
  EXPECT_THAT(ToJson(request), HasSubstr("\"equal_size\":false"));
  request.set_algorithm(v1::ALGORITHM_GREEDY);
  request = WithModel(request);
  const std::string json = ToJson(request);
  EXPECT_THAT(json, HasSubstr("\"algorithm\":\"ALGORITHM_GREEDY\""));
  EXPECT_THAT(json, HasSubstr("\"kind\":\"COST_KIND_ATTENTION\""));
  EXPECT_THAT(json, HasSubstr("\"num_kv_heads\":\"8\""));
  EXPECT_THAT(json, HasSubstr("\"plain_mlp\":false"));
}

TEST(ToJsonTest, RoundTrips) {
  const v1::BalanceReply reply = SolveBalance(WithModel(SmallRequest()));
  v1::BalanceReply parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(ToJson(reply), &parsed).ok());
  EXPECT_EQ(parsed.SerializeAsString(), reply.SerializeAsString());
}

v1::PlanStepRequest SmallStepRequest() {
  v1::PlanStepRequest request;
  for (const std::int64_t length : {4096, 512, 700, 3000, 2048, 128}) request.add_lengths(length);
  request.set_num_ranks(2);
  request.set_max_tokens_per_micro_batch(4096);
  return request;
}

TEST(StepConvertTest, Defaults) {
  const balance::StepOptions options = ToStepOptions(SmallStepRequest());
  EXPECT_EQ(options.num_ranks, 2);
  EXPECT_FALSE(options.equal_size);
  EXPECT_FALSE(options.keep_groups);
  const balance::MicroBatchOptions& micro_batch = options.micro_batch;
  EXPECT_EQ(micro_batch.max_tokens_per_micro_batch, 4096);
  // Unset (0) means 1.
  EXPECT_EQ(micro_batch.min_micro_batches, 1);
  EXPECT_EQ(micro_batch.micro_batches_multiple_of, 1);
  EXPECT_EQ(micro_batch.pad_to_multiple_of, 1);
  EXPECT_EQ(micro_batch.pipeline_stages, 1);
  EXPECT_FALSE(micro_batch.overhead.has_value());  // the cost model's estimate
  EXPECT_EQ(micro_batch.count_tolerance, 0.01);
  EXPECT_EQ(micro_batch.order, balance::MicroBatchOrder::kPipeline);
  EXPECT_TRUE(micro_batch.refine.enabled);
  EXPECT_EQ(micro_batch.refine.max_iterations, balance::RefineOptions{}.max_iterations);
  EXPECT_EQ(micro_batch.cost.kind(), balance::CostModel::Kind::kTokens);
}

TEST(StepConvertTest, EveryOption) {
  v1::PlanStepRequest request = WithCoefficients(SmallStepRequest());
  for (int i = 0; i < request.lengths_size(); ++i) request.add_groups(i / 2);
  request.set_num_ranks(3);
  request.set_equal_size(true);
  request.set_keep_groups(true);
  request.set_max_tokens_per_micro_batch(8192);
  request.set_min_micro_batches(3);
  request.set_micro_batches_multiple_of(2);
  request.set_pad_to_multiple_of(16);
  request.set_pipeline_stages(4);
  request.set_overhead(250);
  request.set_count_tolerance(0.05);
  request.set_order(v1::MICRO_BATCH_ORDER_HEAVIEST_FIRST);
  request.set_oversize(v1::OVERSIZE_POLICY_ALONE);
  request.set_refine_iterations(0);
  const balance::StepOptions options = ToStepOptions(request);
  EXPECT_EQ(options.num_ranks, 3);
  EXPECT_TRUE(options.equal_size);
  EXPECT_TRUE(options.keep_groups);
  const balance::MicroBatchOptions& micro_batch = options.micro_batch;
  EXPECT_EQ(micro_batch.max_tokens_per_micro_batch, 8192);
  EXPECT_EQ(micro_batch.min_micro_batches, 3);
  EXPECT_EQ(micro_batch.micro_batches_multiple_of, 2);
  EXPECT_EQ(micro_batch.pad_to_multiple_of, 16);
  EXPECT_EQ(micro_batch.pipeline_stages, 4);
  EXPECT_EQ(micro_batch.overhead, 250);
  EXPECT_EQ(micro_batch.count_tolerance, 0.05);
  EXPECT_EQ(micro_batch.order, balance::MicroBatchOrder::kHeaviestFirst);
  EXPECT_EQ(micro_batch.oversize, balance::OversizePolicy::kAlone);
  EXPECT_FALSE(micro_batch.refine.enabled);
  EXPECT_EQ(micro_batch.cost.kind(), balance::CostModel::Kind::kAttention);
  EXPECT_DOUBLE_EQ(micro_batch.cost.quadratic(), 1e-4);

  request.set_order(v1::MICRO_BATCH_ORDER_PIPELINE);
  request.set_refine_iterations(9);
  EXPECT_EQ(ToStepOptions(request).micro_batch.order, balance::MicroBatchOrder::kPipeline);
  EXPECT_EQ(ToStepOptions(request).micro_batch.refine.max_iterations, 9);
}

TEST(StepConvertTest, BoundsAreInclusive) {
  v1::PlanStepRequest request = SmallStepRequest();
  request.add_lengths(0);
  request.add_lengths(balance::kMaxLength);
  request.set_num_ranks(balance::kMaxParts);
  request.set_max_tokens_per_micro_batch(1);
  request.set_min_micro_batches(balance::kMaxParts);
  request.set_micro_batches_multiple_of(balance::kMaxParts);
  request.set_pipeline_stages(balance::kMaxParts);
  request.set_pad_to_multiple_of(std::numeric_limits<std::int64_t>::max());
  EXPECT_NO_THROW(ToStepOptions(request));
}

TEST(StepConvertTest, ValidationErrorsNameTheField) {
  const std::vector<InvalidCase<v1::PlanStepRequest>> cases = {
      {"num_ranks zero", [](auto& r) { r.set_num_ranks(0); },
       "num_ranks: must be in [1, 1048576], got 0"},
      {"unknown oversize", [](auto& r) { r.set_oversize(static_cast<v1::OversizePolicy>(7)); },
       "oversize: unknown value 7"},
      {"num_ranks too large", [](auto& r) { r.set_num_ranks(balance::kMaxParts + 1); },
       "num_ranks: must be in [1, 1048576], got 1048577"},
      {"no cap", [](auto& r) { r.clear_max_tokens_per_micro_batch(); },
       "max_tokens_per_micro_batch: must be >= 1, got 0"},
      {"negative cap", [](auto& r) { r.set_max_tokens_per_micro_batch(-5); },
       "max_tokens_per_micro_batch: must be >= 1, got -5"},
      {"negative min_micro_batches", [](auto& r) { r.set_min_micro_batches(-1); },
       "min_micro_batches: must be in [0, 1048576] (0 means 1), got -1"},
      {"min_micro_batches too large",
       [](auto& r) { r.set_min_micro_batches(balance::kMaxParts + 1); },
       "min_micro_batches: must be in [0, 1048576] (0 means 1), got 1048577"},
      {"negative micro_batches_multiple_of", [](auto& r) { r.set_micro_batches_multiple_of(-2); },
       "micro_batches_multiple_of: must be in [0, 1048576] (0 means 1), got -2"},
      {"micro_batches_multiple_of too large",
       [](auto& r) { r.set_micro_batches_multiple_of(balance::kMaxParts + 1); },
       "micro_batches_multiple_of: must be in [0, 1048576] (0 means 1), got 1048577"},
      {"negative pad_to_multiple_of", [](auto& r) { r.set_pad_to_multiple_of(-1); },
       "pad_to_multiple_of: must be >= 0 (0 means 1), got -1"},
      {"negative pipeline_stages", [](auto& r) { r.set_pipeline_stages(-1); },
       "pipeline_stages: must be in [0, 1048576] (0 means 1), got -1"},
      {"pipeline_stages too large", [](auto& r) { r.set_pipeline_stages(balance::kMaxParts + 1); },
       "pipeline_stages: must be in [0, 1048576] (0 means 1), got 1048577"},
      {"negative overhead", [](auto& r) { r.set_overhead(-1); }, "overhead: must be >= 0, got -1"},
      {"unknown order", [](auto& r) { r.set_order(static_cast<v1::MicroBatchOrder>(7)); },
       "order: unknown value 7"},
      // The checks shared with BalanceRequest.
      {"negative length", [](auto& r) { r.set_lengths(1, -1); },
       "lengths[1]: must be in [0, 2147483648], got -1"},
      {"too long", [](auto& r) { r.set_lengths(0, balance::kMaxLength + 1); },
       "lengths[0]: must be in [0, 2147483648], got 2147483649"},
      {"groups size", [](auto& r) { r.add_groups(0); },
       "groups: must be empty or have one entry per length (6), got 1"},
      {"negative group",
       [](auto& r) {
         for (int i = 0; i < r.lengths_size(); ++i) r.add_groups(i == 4 ? -3 : 0);
       },
       "groups[4]: must be >= 0, got -3"},
      {"keep_groups without groups", [](auto& r) { r.set_keep_groups(true); }, "keep_groups: "},
      {"negative refine", [](auto& r) { r.set_refine_iterations(-1); },
       "refine_iterations: must be >= 0, got -1"},
      {"unknown cost kind",
       [](auto& r) { r.mutable_cost()->set_kind(static_cast<v1::CostKind>(5)); },
       "cost.kind: unknown value 5"},
      {"attention without model or coefficients",
       [](auto& r) { r.mutable_cost()->set_kind(v1::COST_KIND_ATTENTION); },
       "cost: COST_KIND_ATTENTION needs exactly one of model, coefficients and model_config_json"},
      {"hidden_size",
       [](auto& r) { (r = WithModel(r)).mutable_cost()->mutable_model()->set_hidden_size(0); },
       "cost.model.hidden_size: must be >= 1, got 0"},
      {"zero coefficients",
       [](auto& r) {
         v1::CostCoefficients* c = (r = WithCoefficients(r)).mutable_cost()->mutable_coefficients();
         c->set_linear(0.0);
         c->set_quadratic(0.0);
       },
       "cost.coefficients: linear + quadratic must be > 0"},
  };
  for (const InvalidCase<v1::PlanStepRequest>& c : cases) {
    SCOPED_TRACE(c.name);
    v1::PlanStepRequest request = SmallStepRequest();
    c.mutate(request);
    EXPECT_THAT(ConversionError(request), StartsWith(c.message));
    EXPECT_THROW(SolvePlanStep(request), std::invalid_argument);
  }
}

std::string SolveError(const v1::PlanStepRequest& request) {
  try {
    SolvePlanStep(request);
  } catch (const rlsched::FieldError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no std::invalid_argument for " << request.ShortDebugString();
  return "";
}

TEST(SolvePlanStepTest, SequenceOverTheCapNamesItAndTheCap) {
  v1::PlanStepRequest request = SmallStepRequest();
  request.set_max_tokens_per_micro_batch(3000);
  EXPECT_EQ(SolveError(request),
            "lengths[0]: sequence of 4096 tokens (padded) exceeds max_tokens_per_micro_batch = "
            "3000");
  // Padding counts against the cap.
  request.set_max_tokens_per_micro_batch(4095);
  request.set_lengths(0, 4000);
  request.set_lengths(3, 4095);
  request.set_pad_to_multiple_of(8);
  EXPECT_EQ(SolveError(request),
            "lengths[3]: sequence of 4096 tokens (padded) exceeds max_tokens_per_micro_batch = "
            "4095");
  request.set_max_tokens_per_micro_batch(4001);
  request.set_pad_to_multiple_of(3);
  EXPECT_THAT(SolveError(request),
              StartsWith("lengths[0]: sequence of 4002 tokens (padded) exceeds "
                         "max_tokens_per_micro_batch = 4001"));
}

TEST(SolvePlanStepTest, TimeOverflowIsAnError) {
  v1::PlanStepRequest request = SmallStepRequest();
  request.set_overhead(std::numeric_limits<std::int64_t>::max());
  EXPECT_THAT(SolveError(request), HasSubstr("overflows int64"));
}

std::int64_t PaddedLength(std::int64_t length, std::int64_t multiple) {
  return (length + multiple - 1) / multiple * multiple;
}

// Checks everything a step reply promises about `request`.
void ExpectValidPlan(const v1::PlanStepRequest& request, const v1::PlanStepReply& reply) {
  const balance::StepOptions options = ToStepOptions(request);
  const balance::MicroBatchOptions& micro_batch = options.micro_batch;
  const std::int64_t cap = micro_batch.max_tokens_per_micro_batch;
  std::vector<std::int64_t> tokens_of;
  for (const std::int64_t length : request.lengths()) {
    tokens_of.push_back(PaddedLength(length, micro_batch.pad_to_multiple_of));
  }
  const std::vector<std::int64_t> cost_of = micro_batch.cost.Costs(tokens_of);

  ASSERT_EQ(reply.ranks_size(), request.num_ranks());
  const std::int64_t m = reply.micro_batches();
  EXPECT_GE(m, micro_batch.min_micro_batches);
  EXPECT_EQ(m % micro_batch.micro_batches_multiple_of, 0);
  std::vector<int> seen(tokens_of.size(), 0);
  std::map<std::int64_t, int> rank_of_group;
  std::int64_t slowest = 0;
  std::int64_t total_tokens = 0;
  std::int64_t unpadded_total = 0;
  std::int64_t ranks_with_empty = 0;
  for (int r = 0; r < reply.ranks_size(); ++r) {
    SCOPED_TRACE(::testing::Message() << "rank " << r);
    const v1::RankPlan& rank = reply.ranks(r);
    ASSERT_EQ(rank.micro_batches_size(), m);
    std::int64_t rank_tokens = 0;
    std::int64_t rank_cost = 0;
    std::int64_t sequences = 0;
    std::int64_t sum_time = 0;
    std::int64_t max_time = 0;
    bool has_empty = false;
    for (const v1::MicroBatch& batch : rank.micro_batches()) {
      std::int64_t tokens = 0;
      std::int64_t unpadded = 0;
      std::int64_t cost = 0;
      for (int j = 0; j < batch.indices_size(); ++j) {
        const std::int64_t index = batch.indices(j);
        ASSERT_GE(index, 0);
        ASSERT_LT(index, request.lengths_size());
        if (j > 0) {
          EXPECT_LT(batch.indices(j - 1), index) << "not ascending";
        }
        ++seen[static_cast<std::size_t>(index)];
        tokens += tokens_of[static_cast<std::size_t>(index)];
        unpadded += request.lengths(static_cast<int>(index));
        cost += cost_of[static_cast<std::size_t>(index)];
        if (request.keep_groups()) {
          const auto [it, inserted] =
              rank_of_group.emplace(request.groups(static_cast<int>(index)), r);
          EXPECT_EQ(it->second, r) << "group " << it->first << " split";
        }
      }
      EXPECT_EQ(batch.tokens(), tokens);
      EXPECT_LE(batch.tokens(), cap) << "over the cap";
      EXPECT_EQ(batch.cost(), cost);
      has_empty = has_empty || batch.indices_size() == 0;
      sequences += batch.indices_size();
      rank_tokens += tokens;
      rank_cost += cost;
      EXPECT_EQ(batch.unpadded_tokens(), unpadded);
      unpadded_total += unpadded;
      sum_time += cost + reply.overhead();
      max_time = std::max(max_time, cost + reply.overhead());
    }
    EXPECT_EQ(rank.tokens(), rank_tokens);
    EXPECT_EQ(rank.cost(), rank_cost);
    EXPECT_EQ(rank.sequences(), sequences);
    EXPECT_EQ(rank.time(), sum_time + (micro_batch.pipeline_stages - 1) * max_time);
    if (has_empty) {
      EXPECT_LT(sequences, m) << "an empty micro-batch on a rank with enough sequences";
      ++ranks_with_empty;
    }
    total_tokens += rank_tokens;
    if (request.equal_size() && !request.keep_groups()) {
      const std::int64_t n = request.lengths_size();
      EXPECT_GE(sequences, n / request.num_ranks());
      EXPECT_LE(sequences, (n + request.num_ranks() - 1) / request.num_ranks());
    }
    slowest = std::max(slowest, rank.time());
  }
  for (std::size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], 1) << "index " << i;
  EXPECT_EQ(reply.predicted_step_time(), slowest);
  EXPECT_LE(reply.lower_bound(), reply.predicted_step_time());
  EXPECT_EQ(reply.overhead(),
            micro_batch.overhead.value_or(micro_batch.cost.micro_batch_overhead()));
  EXPECT_EQ(reply.sequences(), request.lengths_size());
  EXPECT_EQ(reply.tokens(), total_tokens);
  EXPECT_EQ(reply.unpadded_tokens(), unpadded_total);
  EXPECT_EQ(reply.empty_micro_batches() > 0, ranks_with_empty > 0);
  if (reply.empty_micro_batches() > 0 && !request.keep_groups()) {
    EXPECT_GT(request.num_ranks() * m, request.lengths_size()) << "avoidable empty micro-batches";
  }

  const v1::BaselinePlan& baseline = reply.baseline();
  EXPECT_GE(baseline.micro_batches(), micro_batch.min_micro_batches);
  EXPECT_EQ(baseline.micro_batches() % micro_batch.micro_batches_multiple_of, 0);
  // The recipe's plan (PlanBaseline), its micro-batches over the cap counted here from
  // their sequences' padded lengths.
  const balance::StepPlan recipe = balance::PlanBaseline(
      std::vector<std::int64_t>(request.lengths().begin(), request.lengths().end()), options);
  std::int64_t over_cap = 0;
  for (const balance::RankPlan& rank : recipe.ranks) {
    for (const balance::MicroBatch& batch : rank.micro_batches) {
      std::int64_t tokens = 0;
      for (const std::int64_t i : batch.indices) tokens += tokens_of[static_cast<std::size_t>(i)];
      over_cap += tokens > cap ? 1 : 0;
    }
  }
  EXPECT_EQ(baseline.cap_violations(), over_cap);
  EXPECT_EQ(baseline.micro_batches(), recipe.num_micro_batches);
  EXPECT_EQ(baseline.predicted_step_time(), recipe.predicted_step_time);
  EXPECT_LE(baseline.cap_violations(), request.num_ranks() * baseline.micro_batches());
  if (!request.keep_groups() && baseline.cap_violations() == 0 &&
      baseline.empty_micro_batches() <= reply.empty_micro_batches()) {
    EXPECT_LE(
        static_cast<double>(reply.predicted_step_time()),
        static_cast<double>(baseline.predicted_step_time()) * (1.0 + micro_batch.count_tolerance));
  }
}

v1::PlanStepRequest RandomStepRequest(workload::Rng& rng) {
  const workload::SyntheticBatch batch =
      workload::GrpoBatch(rng.UniformInt(1, 30), rng.UniformInt(1, 8), rng.Next());
  v1::PlanStepRequest request;
  request.mutable_lengths()->Add(batch.lengths.begin(), batch.lengths.end());
  if (rng.UniformInt(0, 1) == 1) {
    request.mutable_groups()->Add(batch.groups.begin(), batch.groups.end());
    request.set_keep_groups(rng.UniformInt(0, 1) == 1);
  }
  request.set_num_ranks(rng.UniformInt(1, 16));
  request.set_equal_size(rng.UniformInt(0, 1) == 1);
  if (rng.UniformInt(0, 2) == 0) request.set_pad_to_multiple_of(rng.UniformInt(0, 64));
  std::int64_t longest = 1;
  for (const std::int64_t length : batch.lengths) {
    longest = std::max(
        longest, PaddedLength(length, std::max<std::int64_t>(1, request.pad_to_multiple_of())));
  }
  // From the tightest cap (every micro-batch nearly one sequence) to a loose one.
  switch (rng.UniformInt(0, 2)) {
    case 0:
      request.set_max_tokens_per_micro_batch(longest);
      break;
    case 1:
      request.set_max_tokens_per_micro_batch(longest + rng.UniformInt(0, longest));
      break;
    default:
      request.set_max_tokens_per_micro_batch(rng.UniformInt(longest, 8 * longest));
      break;
  }
  request.set_min_micro_batches(rng.UniformInt(0, 4));
  request.set_micro_batches_multiple_of(rng.UniformInt(0, 4));
  request.set_pipeline_stages(rng.UniformInt(0, 4));
  if (rng.UniformInt(0, 1) == 1) request.set_overhead(rng.UniformInt(0, 5000));
  request.set_order(static_cast<v1::MicroBatchOrder>(rng.UniformInt(0, 2)));
  switch (rng.UniformInt(0, 2)) {
    case 0:
      break;
    case 1:
      request = WithModel(request);
      break;
    default:
      request = WithCoefficients(request);
      break;
  }
  if (rng.UniformInt(0, 3) == 0) request.set_refine_iterations(rng.UniformInt(0, 50));
  return request;
}

TEST(SolvePlanStepTest, RandomRequestsAreValidAndDeterministic) {
  workload::Rng rng(2025);
  for (int trial = 0; trial < 300; ++trial) {
    const v1::PlanStepRequest request = RandomStepRequest(rng);
    SCOPED_TRACE(::testing::Message()
                 << "trial " << trial << ": " << request.ShortDebugString().substr(0, 400));
    const v1::PlanStepReply reply = SolvePlanStep(request);
    ExpectValidPlan(request, reply);
    EXPECT_EQ(SolvePlanStep(request).SerializeAsString(), reply.SerializeAsString());
    if (::testing::Test::HasFailure()) break;
  }
}

TEST(SolvePlanStepTest, SmallInstance) {
  v1::PlanStepRequest request = SmallStepRequest();
  request.set_pipeline_stages(2);
  request.set_overhead(100);
  const v1::PlanStepReply reply = SolvePlanStep(request);
  ExpectValidPlan(request, reply);
}

TEST(SolvePlanStepTest, MoreRanksThanSequences) {
  v1::PlanStepRequest request = SmallStepRequest();
  request.set_num_ranks(10);
  request.set_overhead(7);
  const v1::PlanStepReply reply = SolvePlanStep(request);
  ExpectValidPlan(request, reply);
  EXPECT_EQ(reply.micro_batches(), 1);
  EXPECT_EQ(reply.predicted_step_time(), 4096 + 7);
}

// The failure of the common recipe (m = ceil(tokens / cap), then Karmarkar-Karp on
// its workload key): 8 sequences of 7 tokens under a cap of 8 give 7 micro-batches, one of 14.
TEST(SolvePlanStepTest, KnownBaselineFailureKeepsTheCap) {
  v1::PlanStepRequest request;
  for (int i = 0; i < 8; ++i) request.add_lengths(7);
  request.set_num_ranks(1);
  request.set_max_tokens_per_micro_batch(8);
  const v1::PlanStepReply reply = SolvePlanStep(request);
  ExpectValidPlan(request, reply);
  EXPECT_EQ(reply.micro_batches(), 8);
  for (const v1::MicroBatch& batch : reply.ranks(0).micro_batches()) {
    EXPECT_EQ(batch.indices_size(), 1);
  }
  EXPECT_EQ(reply.baseline().micro_batches(), 7);
  EXPECT_EQ(reply.baseline().cap_violations(), 1);
}

// The streamed writer prints ToJson's text byte for byte.
TEST(ToJsonTest, WriteJsonOfABalanceReplyIsToJson) {
  for (const std::int64_t parts : {1, 3, 64}) {
    for (const std::uint64_t seed : {1, 2}) {
      v1::BalanceRequest request;
      for (const std::int64_t length : workload::HeavyTailedLengths(500, seed)) {
        request.add_lengths(length);
      }
      request.set_num_parts(parts);
      const v1::BalanceReply reply = SolveBalance(request);
      std::ostringstream streamed;
      WriteJson(reply, streamed);
      EXPECT_EQ(streamed.str(), ToJson(reply)) << parts << " parts, seed " << seed;
    }
  }
  std::ostringstream empty;
  WriteJson(v1::BalanceReply(), empty);
  EXPECT_EQ(empty.str(), ToJson(v1::BalanceReply()));
}

// The streamed writer of a plan prints ToJson's text byte for byte: plans with several
// micro-batches per rank, pipeline stages and padding, attention cost, empty ranks and
// empty micro-batches forced by the minimum, and hand-made replies (negative values,
// ranks without micro-batches, no baseline).
TEST(ToJsonTest, WriteJsonOfAPlanStepReplyIsToJson) {
  const auto expect_same = [](const v1::PlanStepReply& reply, const std::string& what) {
    std::ostringstream streamed;
    WriteJson(reply, streamed);
    EXPECT_EQ(streamed.str(), ToJson(reply)) << what;
  };
  for (const std::int64_t ranks : {1, 3, 16}) {
    for (const std::uint64_t seed : {1, 2, 3}) {
      v1::PlanStepRequest request;
      for (const std::int64_t length : workload::HeavyTailedLengths(400, seed)) {
        request.add_lengths(std::min<std::int64_t>(length, 16384));
      }
      request.set_num_ranks(ranks);
      request.set_max_tokens_per_micro_batch(16384);
      request.set_pipeline_stages(seed == 1 ? 1 : 4);
      request.set_micro_batches_multiple_of(seed == 3 ? 4 : 1);
      request.set_pad_to_multiple_of(seed == 2 ? 8 : 1);
      if (seed == 3) {
        request.mutable_cost()->set_kind(v1::COST_KIND_ATTENTION);
        request.mutable_cost()->mutable_coefficients()->set_linear(1.0);
        request.mutable_cost()->mutable_coefficients()->set_quadratic(0.001);
      }
      expect_same(SolvePlanStep(request),
                  std::to_string(ranks) + " ranks, seed " + std::to_string(seed));
    }
  }
  // Fewer sequences than ranks and a forced minimum: empty ranks and micro-batches.
  v1::PlanStepRequest sparse;
  sparse.add_lengths(5);
  sparse.add_lengths(0);
  sparse.add_lengths(9);
  sparse.set_num_ranks(5);
  sparse.set_max_tokens_per_micro_batch(10);
  sparse.set_min_micro_batches(3);
  const v1::PlanStepReply sparse_reply = SolvePlanStep(sparse);
  ASSERT_GT(sparse_reply.empty_ranks(), 0);
  expect_same(sparse_reply, "sparse");

  v1::PlanStepReply made;
  made.add_ranks();  // no micro-batches, every field 0
  v1::RankPlan* rank = made.add_ranks();
  rank->set_tokens(-3);
  rank->set_cost(std::numeric_limits<std::int64_t>::max());
  rank->set_time(std::numeric_limits<std::int64_t>::min());
  rank->add_micro_batches();  // empty
  v1::MicroBatch* batch = rank->add_micro_batches();
  batch->add_indices(std::numeric_limits<std::int32_t>::max());
  batch->add_indices(-1);
  batch->set_unpadded_tokens(-7);
  made.set_lower_bound(-1);
  expect_same(made, "made, no baseline");
  made.mutable_baseline()->set_cap_violations(2);
  expect_same(made, "made, with a baseline");
  expect_same(v1::PlanStepReply(), "empty");
}

TEST(ToJsonTest, PlanStepFieldNames) {
  v1::PlanStepRequest request;
  for (int i = 0; i < 8; ++i) request.add_lengths(7);
  request.set_num_ranks(1);
  request.set_max_tokens_per_micro_batch(8);
  request.set_overhead(0);
  const v1::PlanStepReply reply = SolvePlanStep(request);
  const std::string json = ToJson(reply);
  EXPECT_EQ(json.find('\n'), std::string::npos) << json;
  // Indices are plain JSON numbers (int32), other int64 values strings.
  EXPECT_THAT(json, StartsWith("{\"ranks\":[{\"micro_batches\":[{\"indices\":[7],"));
  EXPECT_THAT(json, HasSubstr("\"tokens\":\"7\",\"cost\":\"7\",\"unpadded_tokens\":\"7\"}"));
  EXPECT_THAT(json, HasSubstr("],\"tokens\":\"56\",\"cost\":\"56\",\"time\":\"56\","
                              "\"sequences\":\"8\",\"unpadded_tokens\":\"56\"}]"));
  EXPECT_THAT(json, HasSubstr("\"micro_batches\":\"8\""));
  EXPECT_THAT(json, HasSubstr("\"predicted_step_time\":\"56\""));
  EXPECT_THAT(json, HasSubstr("\"lower_bound\":\"56\""));
  EXPECT_THAT(json, HasSubstr("\"baseline\":{\"predicted_step_time\":\"56\",\"cap_violations\":"
                              "\"1\",\"micro_batches\":\"7\",\"empty_micro_batches\":\"0\"}"));
  EXPECT_THAT(json, HasSubstr("\"overhead\":\"0\",\"sequences\":\"8\",\"tokens\":\"56\","
                              "\"unpadded_tokens\":\"56\",\"empty_micro_batches\":\"0\","
                              "\"empty_ranks\":\"0\",\"oversized\":\"0\"}"));

  const std::string request_json = ToJson(request);
  for (const char* field :
       {"\"num_ranks\":\"1\"", "\"max_tokens_per_micro_batch\":\"8\"",
        "\"min_micro_batches\":\"0\"", "\"micro_batches_multiple_of\":\"0\"",
        "\"pad_to_multiple_of\":\"0\"", "\"pipeline_stages\":\"0\"", "\"overhead\":\"0\"",
        "\"keep_groups\":false", "\"order\":\"MICRO_BATCH_ORDER_UNSPECIFIED\""}) {
    EXPECT_THAT(request_json, HasSubstr(field));
  }

  v1::PlanStepReply parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &parsed).ok());
  EXPECT_EQ(parsed.SerializeAsString(), reply.SerializeAsString());
}

}  // namespace
}  // namespace rlsched::wire
