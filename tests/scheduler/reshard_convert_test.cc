#include "reshard_convert.h"

#include <gmock/gmock.h>
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "rlsched/rollout/model.h"
#include "rlsched/rollout/plan.h"

namespace rlsched::scheduler {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// A small Llama: GQA (4 query heads per KV head), a vocabulary padded on both sides.
constexpr char kTinyLlama[] = R"({"model_type": "llama", "hidden_size": 64,
  "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 16,
  "num_key_value_heads": 4, "vocab_size": 1000, "tie_word_embeddings": false})";

// A small Qwen3-MoE: 8 experts, one dense layer.
constexpr char kTinyMoe[] = R"({"model_type": "qwen3_moe", "hidden_size": 32,
  "intermediate_size": 48, "moe_intermediate_size": 16, "num_hidden_layers": 4,
  "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 4, "num_experts": 8,
  "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": [1],
  "vocab_size": 300})";

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
std::string ErrorOf(const v1::ReshardRequest& request) {
  try {
    SolveReshard(request);
  } catch (const std::invalid_argument& e) {
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
}

// Megatron-core's uneven pipeline split: refused unless the first / last stage's
// layers are given; then passed through and planned as the planner plans it.
TEST(ReshardConvertTest, FirstAndLastStageLayers) {
  v1::ReshardRequest request = TinyRequest();  // 4 layers
  request.mutable_train()->set_pp(3);
  EXPECT_EQ(ErrorOf(request),
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

struct InvalidCase {
  std::function<void(v1::ReshardRequest&)> change;
  std::string message;  // the start of the message
};

TEST(ReshardConvertTest, EveryErrorNamesItsField) {
  const std::vector<InvalidCase> cases = {
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
       "model_config_json: the model is too large"},
      {[](auto& r) {
         r.set_model_config_json(R"({"model_type": "llama", "hidden_size": 8,
           "intermediate_size": 8, "num_hidden_layers": 2000000,
           "num_attention_heads": 1, "vocab_size": 8})");
       },
       "model_config_json: the model is too large: num_hidden_layers × (experts + 1) must be at "
       "most 1048576, got 2000000 × 1"},
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
  for (const InvalidCase& c : cases) {
    v1::ReshardRequest request = TinyRequest();
    c.change(request);
    SCOPED_TRACE(c.message);
    EXPECT_THAT(ErrorOf(request), StartsWith(c.message));
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

}  // namespace
}  // namespace rlsched::scheduler
