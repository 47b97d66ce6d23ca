#include "rlsched/wire/reshard_convert.h"

#include <gmock/gmock.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/util/delimited_message_util.h>
#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "rlsched/common/error.h"
#include "rlsched/workload/workload.h"
#include "rlsched/rollout/model.h"
#include "rlsched/rollout/plan.h"
#include "rlsched/wire/json.h"
#include "tiny_configs.h"

namespace rlsched::wire {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using ::testing::HasSubstr;
using ::testing::StartsWith;

using tiny_configs::kTinyLlama;
using tiny_configs::kTinyMoe;

v1::ReshardRequest TinyRequest() {
  v1::ReshardRequest request;
  request.set_model_config_json(kTinyLlama);
  request.mutable_train()->set_tp(2);
  request.mutable_train()->set_pp(2);
  request.mutable_train()->set_dp(2);
  request.mutable_infer()->set_tp(4);
  request.mutable_infer()->set_replicas(2);
  return request;
}

// The message of the std::invalid_argument that solving `request` throws.
std::string ReshardErrorOf(const v1::ReshardRequest& request) {
  try {
    SolveReshard(request);
  } catch (const rlsched::FieldError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no std::invalid_argument for " << request.ShortDebugString();
  return "";
}

TEST(ReshardConvertTest, ZeroMeansTheDocumentedDefault) {
  v1::ReshardRequest request;
  request.set_model_config_json(kTinyLlama);
  const rollout::ReshardOptions options = ToReshardOptions(request);
  EXPECT_EQ(options.train.tp, 1);
  EXPECT_EQ(options.train.pp, 1);
  EXPECT_EQ(options.train.vpp, 1);
  EXPECT_EQ(options.train.ep, 1);
  EXPECT_EQ(options.train.etp, 1);
  EXPECT_EQ(options.train.cp, 1);
  EXPECT_EQ(options.train.dp, 1);
  EXPECT_TRUE(options.train.layers_per_chunk.empty());
  EXPECT_FALSE(options.train.first_stage_layers.has_value());
  EXPECT_FALSE(options.train.last_stage_layers.has_value());
  EXPECT_EQ(options.infer.tp, 1);
  EXPECT_EQ(options.infer.replicas, 1);
  EXPECT_FALSE(options.infer.expert_parallel);
  EXPECT_FALSE(options.infer.round_robin_experts);
  EXPECT_FALSE(options.topology.colocated);
  EXPECT_EQ(options.topology.gpus_per_node, 8);
  EXPECT_EQ(options.topology.intra_node_gb_per_s, 400.0);
  EXPECT_EQ(options.topology.inter_node_gb_per_s, 50.0);
  EXPECT_EQ(options.bucket_bytes, std::int64_t{512} << 20);
  EXPECT_EQ(kDefaultBucketBytes, rollout::ReshardOptions{}.bucket_bytes);

  // The whole request at its defaults plans: one trainer GPU to one engine GPU.
  const v1::ReshardPlan plan = SolveReshard(request);
  EXPECT_EQ(plan.trainer_ranks(), 1);
  EXPECT_EQ(plan.engine_ranks(), 1);
  EXPECT_GT(plan.num_transfers(), 0);
  EXPECT_EQ(plan.transfers_size(), 0);
}

TEST(ReshardConvertTest, ValuesPassThrough) {
  v1::ReshardRequest request;
  request.set_model_config_json(kTinyMoe);
  v1::TrainLayout* train = request.mutable_train();
  train->set_tp(2);
  train->set_pp(2);
  train->set_vpp(2);
  train->set_ep(4);
  train->set_etp(1);
  train->set_cp(2);
  train->set_dp(1);
  for (const std::int64_t layers : {1, 1, 1, 1}) train->add_layers_per_chunk(layers);
  v1::InferLayout* infer = request.mutable_infer();
  infer->set_tp(4);
  infer->set_replicas(2);
  infer->set_expert_parallel(true);
  infer->set_expert_placement(v1::EXPERT_PLACEMENT_ROUND_ROBIN);
  v1::Topology* topology = request.mutable_topology();
  topology->set_colocated(true);
  topology->set_gpus_per_node(4);
  topology->set_intra_node_gb_per_s(900.0);
  topology->set_inter_node_gb_per_s(25.0);
  request.set_bucket_bytes(1 << 20);

  const rollout::ReshardOptions o = ToReshardOptions(request);
  EXPECT_EQ(o.train.tp, 2);
  EXPECT_EQ(o.train.pp, 2);
  EXPECT_EQ(o.train.vpp, 2);
  EXPECT_EQ(o.train.ep, 4);
  EXPECT_EQ(o.train.etp, 1);
  EXPECT_EQ(o.train.cp, 2);
  EXPECT_EQ(o.train.dp, 1);
  EXPECT_EQ(o.train.layers_per_chunk, (std::vector<std::int64_t>{1, 1, 1, 1}));
  EXPECT_EQ(o.infer.tp, 4);
  EXPECT_EQ(o.infer.replicas, 2);
  EXPECT_TRUE(o.infer.expert_parallel);
  EXPECT_TRUE(o.infer.round_robin_experts);
  EXPECT_TRUE(o.topology.colocated);
  EXPECT_EQ(o.topology.gpus_per_node, 4);
  EXPECT_EQ(o.topology.intra_node_gb_per_s, 900.0);
  EXPECT_EQ(o.topology.inter_node_gb_per_s, 25.0);
  EXPECT_EQ(o.bucket_bytes, 1 << 20);

  const v1::ReshardPlan plan = SolveReshard(request);
  EXPECT_EQ(plan.trainer_ranks(), 8);
  EXPECT_EQ(plan.engine_ranks(), 8);

  // The plan records what it was made for: the request's layouts, topology, bucket
  // budget and target dtype, as given (every size was set).
  request.set_target_dtype(v1::TARGET_DTYPE_BF16);
  const v1::ReshardPlan recorded = SolveReshard(request);
  using google::protobuf::util::MessageDifferencer;
  EXPECT_TRUE(MessageDifferencer::Equals(recorded.train(), request.train()))
      << recorded.train().DebugString();
  EXPECT_TRUE(MessageDifferencer::Equals(recorded.infer(), request.infer()))
      << recorded.infer().DebugString();
  EXPECT_TRUE(MessageDifferencer::Equals(recorded.topology(), request.topology()))
      << recorded.topology().DebugString();
  EXPECT_EQ(recorded.bucket_bytes(), 1 << 20);
  EXPECT_EQ(recorded.target_dtype(), v1::TARGET_DTYPE_BF16);
}

// A request's unset sizes are recorded as the planner used them (1, the default
// topology and bucket budget, bf16, contiguous experts), in the JSON and binary plans
// too, so that an executor can compare them with its world's layouts.
TEST(ReshardConvertTest, PlanRecordsDefaultsFilledIn) {
  v1::ReshardRequest request;
  request.set_model_config_json(kTinyLlama);
  request.mutable_train()->set_tp(2);
  request.mutable_train()->set_first_stage_layers(1);
  request.mutable_train()->set_pp(2);
  request.mutable_infer()->set_replicas(2);
  request.mutable_topology()->set_colocated(true);
  const v1::ReshardPlan plan = SolveReshard(request);
  const v1::TrainLayout& t = plan.train();
  EXPECT_EQ(std::vector<std::int64_t>({t.tp(), t.pp(), t.vpp(), t.ep(), t.etp(), t.cp(), t.dp()}),
            (std::vector<std::int64_t>{2, 2, 1, 1, 1, 1, 1}));
  ASSERT_TRUE(t.has_first_stage_layers());
  EXPECT_EQ(t.first_stage_layers(), 1);
  EXPECT_FALSE(t.has_last_stage_layers());
  EXPECT_EQ(t.layers_per_chunk_size(), 0);
  EXPECT_EQ(plan.infer().tp(), 1);
  EXPECT_EQ(plan.infer().replicas(), 2);
  EXPECT_FALSE(plan.infer().expert_parallel());
  EXPECT_EQ(plan.infer().expert_placement(), v1::EXPERT_PLACEMENT_CONTIGUOUS);
  EXPECT_TRUE(plan.topology().colocated());
  EXPECT_EQ(plan.topology().gpus_per_node(), 8);
  EXPECT_EQ(plan.topology().intra_node_gb_per_s(), 400.0);
  EXPECT_EQ(plan.topology().inter_node_gb_per_s(), 50.0);
  EXPECT_EQ(plan.bucket_bytes(), kDefaultBucketBytes);
  EXPECT_EQ(plan.target_dtype(), v1::TARGET_DTYPE_BF16);

  // The same summary heads the binary plan and closes the JSON plan.
  const rollout::ReshardPlan planned =
      rollout::PlanReshard(ToModelConfig(request), ToReshardOptions(request));
  std::stringstream binary;
  WriteReshardPlanBinary(planned, binary);
  const v1::ReshardPlanIndex index = ReadReshardPlanIndex(binary);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(index.summary().train(), t));
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(index.summary().topology(),
                                                                 plan.topology()));
  std::stringstream json;
  WriteReshardPlanJson(planned, json);
  v1::ReshardPlan parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json.str(), &parsed).ok());
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(parsed.infer(), plan.infer()));
  EXPECT_EQ(parsed.bucket_bytes(), kDefaultBucketBytes);
}

// Megatron-core's uneven pipeline split: refused unless the first / last stage's
// layers are given; then passed through and planned as the planner plans it.
TEST(ReshardConvertTest, FirstAndLastStageLayers) {
  v1::ReshardRequest request = TinyRequest();  // 4 layers
  request.mutable_train()->set_pp(3);
  EXPECT_EQ(ReshardErrorOf(request),
            "train.pp: num_hidden_layers (4) must be divisible by pp·vpp (3), or set "
            "first_stage_layers / last_stage_layers for an uneven split");

  request.mutable_train()->set_first_stage_layers(2);
  rollout::ReshardOptions o = ToReshardOptions(request);
  EXPECT_EQ(o.train.first_stage_layers, std::optional<std::int64_t>(2));
  EXPECT_FALSE(o.train.last_stage_layers.has_value());
  request.mutable_train()->clear_first_stage_layers();
  request.mutable_train()->set_last_stage_layers(2);
  o = ToReshardOptions(request);
  EXPECT_FALSE(o.train.first_stage_layers.has_value());
  EXPECT_EQ(o.train.last_stage_layers, std::optional<std::int64_t>(2));

  // Both: 1 | 2 | 1 layers, the same plan as the options built in code.
  request.mutable_train()->set_first_stage_layers(1);
  request.mutable_train()->set_last_stage_layers(1);
  request.set_include_transfers(true);
  o = ToReshardOptions(request);
  rollout::ReshardOptions expected_options = o;
  expected_options.train = {.tp = 2, .pp = 3, .dp = 2};
  expected_options.train.first_stage_layers = 1;
  expected_options.train.last_stage_layers = 1;
  const rollout::ModelConfig model = rollout::ParseHfConfig(kTinyLlama);
  EXPECT_EQ(rollout::StageLayers(model, o.train, 1), (std::vector<std::int64_t>{1, 2}));
  const rollout::ReshardPlan expected = rollout::PlanReshard(model, expected_options);
  const v1::ReshardPlan plan = SolveReshard(request);
  EXPECT_EQ(plan.trainer_ranks(), 12);
  ASSERT_EQ(plan.transfers_size(), static_cast<int>(expected.transfers.size()));
  for (int i = 0; i < plan.transfers_size(); ++i) {
    const rollout::Transfer& want = expected.transfers[static_cast<std::size_t>(i)];
    EXPECT_EQ(plan.transfers(i).src_rank(), want.src_rank);
    EXPECT_EQ(plan.transfers(i).src_param(), expected.param_names[want.src_param]);
  }
  // Layer 2 is on stage 1 (ranks 4..7), layer 3 on stage 2 (ranks 8..11).
  for (const v1::Transfer& t : plan.transfers()) {
    if (t.src_param().starts_with("decoder.layers.2.")) {
      EXPECT_TRUE(t.src_rank() >= 4 && t.src_rank() < 8) << t.ShortDebugString();
    }
    if (t.src_param().starts_with("decoder.layers.3.")) {
      EXPECT_GE(t.src_rank(), 8) << t.ShortDebugString();
    }
  }
}

TEST(ReshardConvertTest, ModelConfig) {
  const rollout::ModelConfig model = ToModelConfig(TinyRequest());
  EXPECT_EQ(model.family, rollout::Family::kLlama);
  EXPECT_EQ(model.hidden_size, 64);
  EXPECT_EQ(model.num_layers, 4);
  // The planner's own sizes, e.g. DeepSeek-V3 (61 layers × 257), are within the bounds.
  EXPECT_LT(61 * 257, kMaxLayerExperts);
}

struct InvalidReshardCase {
  std::function<void(v1::ReshardRequest&)> change;
  std::string message;  // the start of the message
};

TEST(ReshardConvertTest, EveryErrorNamesItsField) {
  const std::vector<InvalidReshardCase> cases = {
      {[](auto& r) { r.set_model_config_json(std::string(kMaxModelConfigBytes + 1, ' ')); },
       "model_config_json: must be at most 1048576 bytes, got 1048577"},
      {[](auto& r) { r.set_model_config_json("{"); }, "model_config_json: config: not valid JSON"},
      {[](auto& r) { r.set_model_config_json(""); }, "model_config_json: config: not valid JSON"},
      {[](auto& r) { r.set_model_config_json(R"({"model_type": "gpt2"})"); },
       "model_config_json: config.model_type: unsupported"},
      {[](auto& r) {
         r.set_model_config_json(R"({"model_type": "llama", "hidden_size": 0,
           "intermediate_size": 8, "num_hidden_layers": 2, "num_attention_heads": 4,
           "vocab_size": 10})");
       },
       "model_config_json: config.hidden_size: "},
      {[](auto& r) {
         r.set_model_config_json(R"({"model_type": "llama", "hidden_size": 2000000000,
           "intermediate_size": 2000000000, "num_hidden_layers": 2000000000,
           "num_attention_heads": 1, "vocab_size": 2000000000})");
       },
       "model_config_json: config.num_hidden_layers: must be such that the model has at most "
       "131072 tensors"},
      {[](auto& r) {
         // 3.1 TB in bf16 (within rollout::kMaxModelBytes), above the request's bound.
         r.set_model_config_json(R"({"model_type": "llama", "hidden_size": 8192,
           "intermediate_size": 28672, "num_hidden_layers": 1800, "num_attention_heads": 64,
           "num_key_value_heads": 8, "vocab_size": 128256})");
       },
       "model_config_json: the model is too large"},
      {[](auto& r) {
         r.set_model_config_json(R"({"model_type": "llama", "hidden_size": 2000000000,
           "intermediate_size": 2000000000, "num_hidden_layers": 2,
           "num_attention_heads": 1, "vocab_size": 2000000000})");
       },
       "model_config_json: config: must be a model of at most 2^42 bytes of tensors"},
      {[](auto& r) {
         r.set_model_config_json(R"({"model_type": "llama", "hidden_size": 8,
           "intermediate_size": 8, "num_hidden_layers": 2000000,
           "num_attention_heads": 1, "vocab_size": 8})");
       },
       "model_config_json: config.num_hidden_layers: must be such that the model has at most "
       "131072 tensors (kMaxFullTensors: 2000000 layers), got 2000000, which makes 18000003 "
       "tensors"},
      {[](auto& r) { r.mutable_train()->set_tp(-1); },
       "train.tp: must be in [0, 65536] (0 means 1), got -1"},
      {[](auto& r) { r.mutable_train()->set_pp(65537); },
       "train.pp: must be in [0, 65536] (0 means 1), got 65537"},
      {[](auto& r) { r.mutable_train()->set_vpp(-2); }, "train.vpp: must be in [0, 65536]"},
      {[](auto& r) { r.mutable_train()->set_ep(-3); }, "train.ep: must be in [0, 65536]"},
      {[](auto& r) { r.mutable_train()->set_etp(1 << 20); }, "train.etp: must be in [0, 65536]"},
      {[](auto& r) { r.mutable_train()->set_cp(std::numeric_limits<std::int64_t>::min()); },
       "train.cp: must be in [0, 65536]"},
      {[](auto& r) { r.mutable_train()->set_dp(std::numeric_limits<std::int64_t>::max()); },
       "train.dp: must be in [0, 65536]"},
      {[](auto& r) {
         using Setter = void (v1::TrainLayout::*)(std::int64_t);
         for (const Setter set : {&v1::TrainLayout::set_tp, &v1::TrainLayout::set_cp,
                                  &v1::TrainLayout::set_dp, &v1::TrainLayout::set_pp}) {
           (r.mutable_train()->*set)(65536);
         }
       },
       "train: tp·cp·dp·pp must be at most 1048576"},
      {[](auto& r) { r.mutable_train()->add_layers_per_chunk(-1); },
       "train.layers_per_chunk[0]: must be in [0, 2^31), got -1"},
      {[](auto& r) {
         r.mutable_train()->add_layers_per_chunk(2);
         r.mutable_train()->add_layers_per_chunk(std::int64_t{1} << 40);
       },
       "train.layers_per_chunk[1]: must be in [0, 2^31)"},
      {[](auto& r) { r.mutable_train()->set_first_stage_layers(0); },
       "train.first_stage_layers: must be in [1, 2^31), got 0"},
      {[](auto& r) { r.mutable_train()->set_last_stage_layers(std::int64_t{1} << 31); },
       "train.last_stage_layers: must be in [1, 2^31), got 2147483648"},
      // Checked by the planner, which names the same fields.
      {[](auto& r) { r.mutable_train()->set_tp(3); }, "train.tp: "},
      {[](auto& r) { r.mutable_train()->set_pp(3); },
       "train.pp: num_hidden_layers (4) must be divisible by pp·vpp (3)"},
      {[](auto& r) {
         r.mutable_train()->set_vpp(3);
         r.mutable_train()->set_first_stage_layers(2);
       },
       "train.first_stage_layers: must be a multiple of vpp (3), got 2"},
      {[](auto& r) { r.mutable_train()->set_last_stage_layers(5); },
       "train.last_stage_layers: must be in [1, num_hidden_layers (4)], got 5"},
      {[](auto& r) {
         r.mutable_train()->set_pp(3);
         r.mutable_train()->set_first_stage_layers(3);
       },
       "train.first_stage_layers: first_stage_layers (3) must be at most num_hidden_layers (4) "
       "- 2"},
      {[](auto& r) {
         r.mutable_train()->set_pp(1);
         r.mutable_train()->set_last_stage_layers(4);
       },
       "train.last_stage_layers: needs pp >= 2, got pp 1"},
      {[](auto& r) {
         r.mutable_train()->add_layers_per_chunk(2);
         r.mutable_train()->add_layers_per_chunk(2);
         r.mutable_train()->set_first_stage_layers(2);
       },
       "train.first_stage_layers: cannot be combined with layers_per_chunk"},
      {[](auto& r) { r.mutable_train()->set_ep(2); }, "train.ep: "},
      {[](auto& r) { r.mutable_train()->add_layers_per_chunk(4); }, "train.layers_per_chunk: "},
      {[](auto& r) { r.mutable_infer()->set_tp(-1); },
       "infer.tp: must be in [0, 65536] (0 means 1), got -1"},
      {[](auto& r) { r.mutable_infer()->set_tp(3); }, "infer.tp: "},
      {[](auto& r) { r.mutable_infer()->set_replicas(-1); },
       "infer.replicas: must be in [0, 1048576] (0 means 1), got -1"},
      {[](auto& r) { r.mutable_infer()->set_replicas(std::int64_t{1} << 20); },
       "infer.replicas: tp·replicas must be at most 1048576, got tp 4, replicas 1048576"},
      {[](auto& r) { r.mutable_infer()->set_expert_placement(v1::EXPERT_PLACEMENT_ROUND_ROBIN); },
       "infer.expert_placement: EXPERT_PLACEMENT_ROUND_ROBIN needs expert_parallel"},
      {[](auto& r) {
         r.mutable_infer()->set_expert_placement(static_cast<v1::ExpertPlacement>(7));
       },
       "infer.expert_placement: unknown value 7"},
      {[](auto& r) {
         r.mutable_topology()->set_colocated(true);
         r.mutable_infer()->set_replicas(3);
       },
       "infer.replicas: colocated engines need"},
      {[](auto& r) { r.mutable_topology()->set_gpus_per_node(-8); },
       "topology.gpus_per_node: must be in [0, 65536] (0 means 8), got -8"},
      {[](auto& r) { r.mutable_topology()->set_intra_node_gb_per_s(-1.0); },
       "topology.intra_node_gb_per_s: must be finite and in [0, 1000000] GB/s (0 means 400)"},
      {[](auto& r) { r.mutable_topology()->set_intra_node_gb_per_s(std::nan("")); },
       "topology.intra_node_gb_per_s: must be finite"},
      {[](auto& r) { r.mutable_topology()->set_inter_node_gb_per_s(INFINITY); },
       "topology.inter_node_gb_per_s: must be finite and in [0, 1000000] GB/s (0 means 50)"},
      {[](auto& r) { r.mutable_topology()->set_inter_node_gb_per_s(2e6); },
       "topology.inter_node_gb_per_s: must be finite"},
      {[](auto& r) { r.set_target_dtype(static_cast<v1::TargetDtype>(9)); },
       "target_dtype: unknown value 9"},
      {[](auto& r) { r.set_bucket_bytes(-1); },
       "bucket_bytes: must be in [0, 1099511627776] (0 means 536870912), got -1"},
      {[](auto& r) { r.set_bucket_bytes((std::int64_t{1} << 40) + 1); },
       "bucket_bytes: must be in"},
      // Below the widest row (a row of down_proj, 96 bf16 elements, is 192 bytes).
      {[](auto& r) { r.set_bucket_bytes(100); }, "bucket_bytes: must be in [192 (the widest row)"},
  };
  for (const InvalidReshardCase& c : cases) {
    v1::ReshardRequest request = TinyRequest();
    c.change(request);
    SCOPED_TRACE(c.message);
    EXPECT_THAT(ReshardErrorOf(request), StartsWith(c.message));
  }
}

TEST(ReshardConvertTest, RoundTripOnATinyLlama) {
  v1::ReshardRequest request = TinyRequest();
  const rollout::ModelConfig model = rollout::ParseHfConfig(kTinyLlama);
  for (const bool colocated : {false, true}) {
    SCOPED_TRACE(colocated);
    request.mutable_topology()->set_colocated(colocated);
    rollout::ReshardOptions options;
    options.train = {.tp = 2, .pp = 2, .dp = 2};
    options.infer = {.tp = 4, .replicas = 2};
    options.topology.colocated = colocated;
    const rollout::ReshardPlan expected = rollout::PlanReshard(model, options);

    request.set_include_transfers(false);
    const v1::ReshardPlan summary = SolveReshard(request);
    request.set_include_transfers(true);
    const v1::ReshardPlan full = SolveReshard(request);

    EXPECT_EQ(summary.transfers_size(), 0);
    ASSERT_EQ(full.transfers_size(), static_cast<int>(expected.transfers.size()));
    for (const v1::ReshardPlan* plan : {&summary, &full}) {
      EXPECT_EQ(plan->num_transfers(), static_cast<std::int64_t>(expected.transfers.size()));
      EXPECT_EQ(plan->num_buckets(), expected.num_buckets);
      EXPECT_EQ(plan->trainer_ranks(), 8);
      EXPECT_EQ(plan->engine_ranks(), 8);
      EXPECT_EQ(plan->bytes_received(), expected.bytes_received);
      EXPECT_EQ(plan->bytes_local(), expected.bytes_local);
      EXPECT_EQ(plan->bytes_moved(), expected.bytes_moved);
      EXPECT_EQ(plan->estimate_seconds(), expected.estimate_seconds);
      EXPECT_EQ(plan->lower_bound_seconds(), expected.lower_bound_seconds);
      EXPECT_EQ(plan->naive_seconds(), expected.naive_seconds);
      EXPECT_EQ(plan->busiest_link().rank(), expected.busiest_link.rank);
      EXPECT_EQ(plan->busiest_link().bytes(), expected.busiest_link.bytes);
      EXPECT_EQ(plan->busiest_link().seconds(), expected.busiest_link.seconds);
      EXPECT_NE(plan->busiest_link().kind(), v1::LINK_KIND_UNSPECIFIED);
      EXPECT_EQ(std::vector<double>(plan->bucket_seconds().begin(), plan->bucket_seconds().end()),
                expected.bucket_seconds);
    }
    // The summary is the full plan without its transfers.
    v1::ReshardPlan stripped = full;
    stripped.clear_transfers();
    EXPECT_TRUE(MessageDifferencer::Equals(stripped, summary));

    std::int64_t received = 0;
    for (std::size_t i = 0; i < expected.transfers.size(); ++i) {
      const rollout::Transfer& want = expected.transfers[i];
      const v1::Transfer& got = full.transfers(static_cast<int>(i));
      EXPECT_EQ(got.bucket(), want.bucket);
      EXPECT_EQ(got.src_rank(), want.src_rank);
      EXPECT_EQ(got.src_param(), expected.param_names[static_cast<std::size_t>(want.src_param)]);
      EXPECT_EQ(got.dst_param(), expected.param_names[static_cast<std::size_t>(want.dst_param)]);
      EXPECT_EQ(std::vector<std::int64_t>(got.dst_ranks().begin(), got.dst_ranks().end()),
                want.dst_ranks);
      ASSERT_EQ(got.src_slice_size(), static_cast<int>(want.src_slice.size()));
      for (int d = 0; d < got.src_slice_size(); ++d) {
        EXPECT_EQ(got.src_slice(d).begin(), want.src_slice[static_cast<std::size_t>(d)].begin);
        EXPECT_EQ(got.src_slice(d).end(), want.src_slice[static_cast<std::size_t>(d)].end);
      }
      ASSERT_EQ(got.dst_slice_size(), static_cast<int>(want.dst_slice.size()));
      for (int d = 0; d < got.dst_slice_size(); ++d) {
        EXPECT_EQ(got.dst_slice(d).begin(), want.dst_slice[static_cast<std::size_t>(d)].begin);
        EXPECT_EQ(got.dst_slice(d).end(), want.dst_slice[static_cast<std::size_t>(d)].end);
      }
      EXPECT_EQ(got.bytes(), want.bytes);
      received += got.bytes() * got.dst_ranks_size();
    }
    EXPECT_EQ(received, full.bytes_received());
    // Megatron names on the sending side, vLLM names on the receiving side.
    for (const v1::Transfer& transfer : full.transfers()) {
      EXPECT_THAT(transfer.src_param(), ::testing::Not(StartsWith("model.")));
      EXPECT_THAT(transfer.dst_param(),
                  ::testing::AnyOf(StartsWith("model."), StartsWith("lm_head")));
    }
  }
}

// An fp8 target: the option passes through and every transfer says where it is
// quantised, as the planner decided.
TEST(ReshardConvertTest, Fp8Target) {
  constexpr char kWide[] = R"({"model_type": "qwen3_moe", "hidden_size": 256,
    "intermediate_size": 512, "moe_intermediate_size": 256, "num_hidden_layers": 2,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 32, "num_experts": 8,
    "vocab_size": 300})";
  v1::ReshardRequest request;
  request.set_model_config_json(kWide);
  request.mutable_train()->set_tp(2);
  request.mutable_train()->set_ep(2);
  request.mutable_train()->set_dp(2);
  request.mutable_infer()->set_tp(2);
  request.mutable_infer()->set_replicas(2);
  request.set_target_dtype(v1::TARGET_DTYPE_FP8_BLOCK128);
  request.set_include_transfers(true);
  const rollout::ReshardOptions options = ToReshardOptions(request);
  EXPECT_EQ(options.target_dtype, rollout::TargetDtype::kFp8Block128);
  const rollout::ReshardPlan expected =
      rollout::PlanReshard(rollout::ParseHfConfig(kWide), options);
  const v1::ReshardPlan plan = SolveReshard(request);
  ASSERT_EQ(plan.transfers_size(), static_cast<int>(expected.transfers.size()));
  int at_sender = 0;
  for (int i = 0; i < plan.transfers_size(); ++i) {
    const rollout::Quantize want = expected.transfers[static_cast<std::size_t>(i)].quantize;
    const v1::Quantize got = plan.transfers(i).quantize();
    EXPECT_EQ(got, want == rollout::Quantize::kAtSender        ? v1::QUANTIZE_AT_SENDER
                   : want == rollout::Quantize::kAtDestination ? v1::QUANTIZE_AT_DESTINATION
                                                               : v1::QUANTIZE_NONE);
    at_sender += got == v1::QUANTIZE_AT_SENDER;
  }
  EXPECT_GT(at_sender, 0);
  // Fewer bytes than the bf16 plan.
  request.set_target_dtype(v1::TARGET_DTYPE_BF16);
  EXPECT_LT(plan.bytes_received(), SolveReshard(request).bytes_received());
  EXPECT_EQ(ToReshardOptions(request).target_dtype, rollout::TargetDtype::kBf16);
}

TEST(ReshardConvertTest, IsDeterministic) {
  v1::ReshardRequest request = TinyRequest();
  request.set_include_transfers(true);
  EXPECT_TRUE(MessageDifferencer::Equals(SolveReshard(request), SolveReshard(request)));
}

// Plans of every kind the plan files must carry: broadcasts over the NICs and within
// nodes, local copies, split transfers, expert parallelism, fp8.
std::vector<std::pair<std::string, rollout::ReshardPlan>> PlansToWrite() {
  const rollout::ModelConfig llama = rollout::ParseHfConfig(kTinyLlama);
  const rollout::ModelConfig moe = rollout::ParseHfConfig(kTinyMoe);
  std::vector<std::pair<std::string, rollout::ReshardPlan>> plans;
  rollout::ReshardOptions o;
  o.train = {.tp = 2, .pp = 2, .dp = 2};
  o.infer = {.tp = 4, .replicas = 2};
  plans.emplace_back("llama separate", rollout::PlanReshard(llama, o));
  o.topology.colocated = true;
  o.topology.gpus_per_node = 4;
  o.bucket_bytes = 4096;  // splits and many buckets
  plans.emplace_back("llama colocated, small buckets", rollout::PlanReshard(llama, o));
  o = {};
  o.train = {.tp = 2, .pp = 2, .ep = 4, .cp = 2};
  o.infer = {.tp = 4, .replicas = 3, .expert_parallel = true, .round_robin_experts = true};
  o.topology.gpus_per_node = 3;
  o.target_dtype = rollout::TargetDtype::kFp8Block128;
  plans.emplace_back("moe expert parallel, fp8", rollout::PlanReshard(moe, o));
  return plans;
}

// The transfers of `plan` (as wire messages) that `rank` sends or receives, in order.
std::vector<v1::Transfer> TransfersOf(const v1::ReshardPlan& plan, std::int64_t rank) {
  std::vector<v1::Transfer> out;
  for (const v1::Transfer& t : plan.transfers()) {
    if (t.src_rank() == rank ||
        std::find(t.dst_ranks().begin(), t.dst_ranks().end(), rank) != t.dst_ranks().end()) {
      out.push_back(t);
    }
  }
  return out;
}

// The streamed JSON is the printer's text byte for byte.
TEST(ReshardConvertTest, PlanJsonIsTheMessagesJson) {
  for (const auto& [name, plan] : PlansToWrite()) {
    SCOPED_TRACE(name);
    std::ostringstream out;
    WriteReshardPlanJson(plan, out);
    EXPECT_EQ(out.str(), ToJson(ToReshardPlanMessage(plan, /*include_transfers=*/true)) + "\n");
  }
  // Names that need escaping, and a plan without transfers.
  rollout::ReshardPlan plan;
  plan.param_names = {"a\"b\\c", "tab\there <&> \u00e9", "plain.name_1-x/y"};
  plan.transfers.push_back({.bucket = 0,
                            .src_rank = 1,
                            .src_param = 0,
                            .src_slice = {{0, 3}, {2, 5}},
                            .dst_ranks = {4, 9},
                            .dst_param = 1,
                            .dst_slice = {{7, 10}},
                            .bytes = 18,
                            .quantize = rollout::Quantize::kAtDestination});
  plan.transfers.push_back(
      {.bucket = 2, .src_rank = 3, .src_param = 2, .dst_ranks = {3}, .dst_param = 2});
  plan.num_buckets = 3;
  plan.estimate_seconds = 0.1 + 0.2;
  plan.bucket_seconds = {1e-7, 1.0 / 3.0, 12345.678};
  std::ostringstream out;
  WriteReshardPlanJson(plan, out);
  EXPECT_EQ(out.str(), ToJson(ToReshardPlanMessage(plan, true)) + "\n");
  plan.transfers.clear();
  std::ostringstream empty;
  WriteReshardPlanJson(plan, empty);
  EXPECT_EQ(empty.str(), ToJson(ToReshardPlanMessage(plan, true)) + "\n");
}

// Write the binary plan, read back each GPU's part alone: the GPU's transfers of the
// in-memory plan, in order, with their positions in the plan.
TEST(ReshardConvertTest, BinaryPlanGivesEachGpuItsTransfers) {
  for (const auto& [name, plan] : PlansToWrite()) {
    SCOPED_TRACE(name);
    std::stringstream file;
    WriteReshardPlanBinary(plan, file);
    const std::string bytes = file.str();
    const v1::ReshardPlan full = ToReshardPlanMessage(plan, /*include_transfers=*/true);

    const v1::ReshardPlanIndex index = ReadReshardPlanIndex(file);
    EXPECT_EQ(index.format_version(), kPlanFileFormatVersion);
    EXPECT_TRUE(MessageDifferencer::Equals(index.summary(), ToReshardPlanMessage(plan, false)));
    std::int64_t gpus = 0, pairs = 0, last_rank = -1;
    std::set<std::uint64_t> offsets;
    for (const v1::ReshardRankPartEntry& e : index.parts()) {
      EXPECT_GT(e.rank(), last_rank);  // ascending
      last_rank = e.rank();
      EXPECT_LT(e.offset() + e.size() - 1, bytes.size());
      offsets.insert(e.offset());
      pairs += e.num_transfers();
      gpus = std::max(gpus, e.rank() + 1);
    }
    std::int64_t expected_pairs = 0;
    for (const rollout::Transfer& t : plan.transfers) {
      expected_pairs += static_cast<std::int64_t>(t.dst_ranks.size()) + (t.local() ? 0 : 1);
    }
    EXPECT_EQ(pairs, expected_pairs);
    if (name == "llama separate") {
      // Both replicas' engine GPUs of a TP rank receive the same broadcasts: one part.
      EXPECT_LT(offsets.size(), static_cast<std::size_t>(index.parts_size()));
    }

    // Every GPU, in an order other than the file's, plus one past the last.
    for (std::int64_t rank = gpus; rank >= 0; --rank) {
      SCOPED_TRACE(rank);
      const v1::ReshardRankPart part = ReadReshardRankPart(file, index, rank);
      const std::vector<v1::Transfer> want = TransfersOf(full, rank);
      const std::vector<v1::Transfer> got = RankPartTransfers(part);
      ASSERT_EQ(got.size(), want.size());
      for (std::size_t i = 0; i < got.size(); ++i) {
        EXPECT_TRUE(MessageDifferencer::Equals(got[i], want[i]))
            << got[i].ShortDebugString() << "\nvs\n"
            << want[i].ShortDebugString();
        const auto position = static_cast<int>(part.transfers(static_cast<int>(i)).index());
        EXPECT_TRUE(MessageDifferencer::Equals(got[i], full.transfers(position)));
      }
    }
  }
}

// A random layout of the tiny Llama or the tiny MoE, seeded: any sizes, the planner
// deciding which fit (nullopt when it refuses them).
std::optional<rollout::ReshardPlan> RandomPlan(std::uint64_t seed) {
  workload::Rng rng(seed);
  const bool moe = rng.UniformInt(0, 1) == 1;
  const rollout::ModelConfig model = rollout::ParseHfConfig(moe ? kTinyMoe : kTinyLlama);
  const auto pick = [&](std::initializer_list<std::int64_t> values) {
    return *(values.begin() + rng.UniformInt(0, static_cast<std::int64_t>(values.size()) - 1));
  };
  rollout::ReshardOptions o;
  o.train.tp = pick({1, 2, 4});
  o.train.pp = pick({1, 2, 4});
  o.train.vpp = pick({1, 1, 2});
  o.train.cp = pick({1, 1, 2});
  o.train.dp = pick({1, 2, 3});
  if (moe) {
    o.train.ep = pick({1, 2, 4});
    o.train.etp = pick({1, 1, 2});
  }
  o.infer.tp = pick({1, 2, 4, 8});
  o.infer.replicas = rng.UniformInt(1, 4);
  o.infer.expert_parallel = moe && rng.UniformInt(0, 1) == 1;
  o.infer.round_robin_experts = o.infer.expert_parallel && rng.UniformInt(0, 1) == 1;
  o.topology.colocated = rng.UniformInt(0, 1) == 1;
  o.topology.gpus_per_node = pick({1, 2, 3, 4, 8});
  o.bucket_bytes = pick({2048, 4096, 1 << 16, std::int64_t{512} << 20});
  o.target_dtype =
      rng.UniformInt(0, 2) == 0 ? rollout::TargetDtype::kFp8Block128 : rollout::TargetDtype::kBf16;
  try {
    return rollout::PlanReshard(model, o);
  } catch (const std::invalid_argument&) {
    return std::nullopt;
  }
}

// The parts built straight from a plan are the binary plan file's parts, for every GPU
// (and past the last one), whatever the layout: equal messages, and each part written
// in the file is the canonical encoding of the part built.
TEST(ReshardConvertTest, PartsBuiltFromThePlanAreTheFilesParts) {
  int planned = 0;
  for (std::uint64_t seed = 1; planned < 40 && seed <= 400; ++seed) {
    const std::optional<rollout::ReshardPlan> plan = RandomPlan(seed);
    if (!plan) continue;
    ++planned;
    SCOPED_TRACE(seed);
    std::stringstream file;
    WriteReshardPlanBinary(*plan, file);
    const std::string bytes = file.str();
    const v1::ReshardPlanIndex index = ReadReshardPlanIndex(file);
    ReshardRankParts parts(*plan);
    const v1::ReshardPlan full = ToReshardPlanMessage(*plan, /*include_transfers=*/true);
    std::int64_t gpus = 0;
    for (const rollout::Transfer& t : plan->transfers) {
      gpus = std::max(gpus, t.src_rank + 1);
      for (const std::int64_t d : t.dst_ranks) gpus = std::max(gpus, d + 1);
    }
    ASSERT_EQ(parts.gpus(), gpus);
    std::int64_t pairs = 0;
    for (std::int64_t rank = 0; rank <= gpus; ++rank) {
      SCOPED_TRACE(rank);
      const v1::ReshardRankPart built = parts.Part(rank);
      const v1::ReshardRankPart read = ReadReshardRankPart(file, index, rank);
      ASSERT_TRUE(MessageDifferencer::Equals(built, read)) << built.ShortDebugString() << "\nvs\n"
                                                           << read.ShortDebugString();
      EXPECT_EQ(static_cast<std::size_t>(built.transfers_size()), parts.TransfersOf(rank).size());
      for (int k = 0; k < built.transfers_size(); ++k) {
        EXPECT_EQ(built.transfers(k).index(), parts.TransfersOf(rank)[static_cast<std::size_t>(k)]);
      }
      pairs += built.transfers_size();
      // Against the plan itself: the GPU's transfers, in plan order; names and receiver
      // sets numbered in order of first use, each used.
      const std::vector<v1::Transfer> got = RankPartTransfers(built);
      const std::vector<v1::Transfer> want = TransfersOf(full, rank);
      ASSERT_EQ(got.size(), want.size());
      for (std::size_t i = 0; i < got.size(); ++i) {
        EXPECT_TRUE(MessageDifferencer::Equals(got[i], want[i])) << got[i].ShortDebugString();
      }
      int next_name = 0, next_group = 0;
      for (const v1::RankTransfer& t : built.transfers()) {
        for (const int name : {t.src_param(), t.dst_param()}) {
          EXPECT_LE(name, next_name);
          next_name = std::max(next_name, name + 1);
        }
        EXPECT_LE(t.dst_group(), next_group);
        next_group = std::max(next_group, t.dst_group() + 1);
      }
      EXPECT_EQ(next_name, built.param_names_size());
      EXPECT_EQ(next_group, built.dst_groups_size());
      // The one-GPU function gives the same part.
      if (rank % 3 == 0) {
        EXPECT_TRUE(MessageDifferencer::Equals(ToReshardRankPart(*plan, rank), built));
      }
    }
    std::int64_t expected_pairs = 0;
    for (const rollout::Transfer& t : plan->transfers) {
      expected_pairs += static_cast<std::int64_t>(t.dst_ranks.size()) + (t.local() ? 0 : 1);
    }
    EXPECT_EQ(pairs, expected_pairs);
    // Byte for byte: every index entry points at the delimited encoding of its GPU's
    // part as built.
    for (const v1::ReshardRankPartEntry& e : index.parts()) {
      std::string encoded;
      {
        google::protobuf::io::StringOutputStream stream(&encoded);
        ASSERT_TRUE(google::protobuf::util::SerializeDelimitedToZeroCopyStream(parts.Part(e.rank()),
                                                                               &stream));
      }
      EXPECT_EQ(e.size(), encoded.size());
      EXPECT_EQ(bytes.substr(e.offset(), e.size()), encoded) << "rank " << e.rank();
    }
    // A part reused: its memory is cleared first.
    v1::ReshardRankPart reused = parts.Part(gpus - 1);
    parts.BuildPart(0, reused);
    EXPECT_TRUE(MessageDifferencer::Equals(reused, parts.Part(0)));
  }
  EXPECT_GE(planned, 40);
}

TEST(ReshardConvertTest, PartsOfABadPlanNameTheField) {
  rollout::ReshardPlan plan;
  plan.param_names = {"a", "b"};
  plan.transfers.push_back({.src_rank = 1, .src_param = 0, .dst_ranks = {4, 9}, .dst_param = 1});
  EXPECT_EQ(ReshardRankParts(plan).gpus(), 10);
  EXPECT_THAT(ToReshardRankPart(plan, 9).ShortDebugString(), HasSubstr("ranks: 4 ranks: 9"));
  EXPECT_EQ(ToReshardRankPart(plan, 3).transfers_size(), 0);
  const auto error_of = [](const rollout::ReshardPlan& p) -> std::string {
    try {
      ReshardRankParts parts(p);
    } catch (const FieldError& e) {
      return e.what();
    }
    return "no error";
  };
  rollout::ReshardPlan bad = plan;
  bad.transfers[0].dst_ranks[1] = -2;
  EXPECT_EQ(error_of(bad), "transfers[0].dst_ranks[1]: must be in [0, 2^21), got -2");
  bad = plan;
  bad.transfers[0].src_rank = std::int64_t{1} << 21;
  EXPECT_EQ(error_of(bad), "transfers[0].src_rank: must be in [0, 2^21), got 2097152");
  bad = plan;
  bad.transfers[0].dst_param = 2;
  EXPECT_EQ(error_of(bad),
            "transfers[0].dst_param: must be in [0, 2) (the plan's param_names), got 2");
  std::stringstream file;
  EXPECT_THROW(WriteReshardPlanBinary(bad, file), FieldError);
  EXPECT_THROW(ToReshardRankPart(plan, -1), FieldError);
  ReshardRankParts parts(plan);
  EXPECT_THROW(parts.Part(-1), FieldError);
  EXPECT_THROW(parts.TransfersOf(-1), FieldError);
}

TEST(ReshardConvertTest, BinaryPlanErrors) {
  const rollout::ReshardPlan plan = PlansToWrite().front().second;
  std::stringstream file;
  WriteReshardPlanBinary(plan, file);
  const v1::ReshardPlanIndex index = ReadReshardPlanIndex(file);
  EXPECT_THROW(ReadReshardRankPart(file, index, -1), std::invalid_argument);

  std::stringstream empty;
  EXPECT_THROW(ReadReshardPlanIndex(empty), std::runtime_error);
  std::stringstream json;
  WriteReshardPlanJson(plan, json);
  EXPECT_THROW(ReadReshardPlanIndex(json), std::runtime_error);
  // The index points past a truncated file.
  std::stringstream truncated(file.str().substr(0, file.str().size() / 2));
  bool threw = false;
  for (const v1::ReshardRankPartEntry& e : index.parts()) {
    try {
      ReadReshardRankPart(truncated, index, e.rank());
    } catch (const std::runtime_error& error) {
      threw = true;
      EXPECT_THAT(error.what(), StartsWith("plan file: GPU "));
    }
  }
  EXPECT_TRUE(threw);
  // The writer needs the file's start.
  std::stringstream late;
  late << "x";
  EXPECT_THROW(WriteReshardPlanBinary(plan, late), std::runtime_error);
}

}  // namespace
}  // namespace rlsched::wire
