#include "reshard_convert.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "rlsched/rollout/layout.h"

namespace rlsched::scheduler {
namespace {

constexpr std::int64_t kMaxSize = 65536;                   // one parallel size
constexpr std::int64_t kMaxRanks = std::int64_t{1} << 20;  // GPUs on either side
constexpr std::int64_t kMaxChunkLayers = std::int64_t{1} << 31;
constexpr std::int64_t kMaxBucketBytes = std::int64_t{1} << 40;
constexpr double kMaxGbPerS = 1e6;

[[noreturn]] void Fail(std::string_view field, std::string_view what) {
  throw std::invalid_argument(fmt::format("{}: {}", field, what));
}

// A size where 0 means `unset` (the default), in [0, max]; returns its value.
std::int64_t SizeOrDefault(std::string_view field, std::int64_t value, std::int64_t max,
                           std::int64_t unset) {
  if (value < 0 || value > max) {
    Fail(field, fmt::format("must be in [0, {}] (0 means {}), got {}", max, unset, value));
  }
  return value == 0 ? unset : value;
}

// A bandwidth where 0 means `unset`, finite and in [0, kMaxGbPerS].
double BandwidthOrDefault(std::string_view field, double value, double unset) {
  if (!std::isfinite(value) || value < 0.0 || value > kMaxGbPerS) {
    Fail(field, fmt::format("must be finite and in [0, {}] GB/s (0 means {}), got {}", kMaxGbPerS,
                            unset, value));
  }
  return value == 0.0 ? unset : value;
}

// A stage's layer count: in [1, kMaxChunkLayers).
std::int64_t StageLayerCount(std::string_view field, std::int64_t value) {
  if (value < 1 || value >= kMaxChunkLayers) {
    Fail(field, fmt::format("must be in [1, 2^31), got {}", value));
  }
  return value;
}

rollout::TrainLayout ToTrainLayout(const v1::TrainLayout& train) {
  rollout::TrainLayout layout;
  layout.tp = SizeOrDefault("train.tp", train.tp(), kMaxSize, 1);
  layout.pp = SizeOrDefault("train.pp", train.pp(), kMaxSize, 1);
  layout.vpp = SizeOrDefault("train.vpp", train.vpp(), kMaxSize, 1);
  layout.ep = SizeOrDefault("train.ep", train.ep(), kMaxSize, 1);
  layout.etp = SizeOrDefault("train.etp", train.etp(), kMaxSize, 1);
  layout.cp = SizeOrDefault("train.cp", train.cp(), kMaxSize, 1);
  layout.dp = SizeOrDefault("train.dp", train.dp(), kMaxSize, 1);
  // Multiplied one factor at a time: each is at most 2^16 and the product stops at 2^20.
  std::int64_t world = 1;
  for (const std::int64_t size : {layout.tp, layout.cp, layout.dp, layout.pp}) {
    world *= size;
    if (world > kMaxRanks) {
      Fail("train", fmt::format("tp·cp·dp·pp must be at most {}, got tp {}, cp {}, dp {}, pp {}",
                                kMaxRanks, layout.tp, layout.cp, layout.dp, layout.pp));
    }
  }
  if (train.layers_per_chunk_size() > kMaxRanks) {
    Fail("train.layers_per_chunk",
         fmt::format("at most {} entries, got {}", kMaxRanks, train.layers_per_chunk_size()));
  }
  layout.layers_per_chunk.reserve(static_cast<std::size_t>(train.layers_per_chunk_size()));
  for (int i = 0; i < train.layers_per_chunk_size(); ++i) {
    const std::int64_t layers = train.layers_per_chunk(i);
    if (layers < 0 || layers >= kMaxChunkLayers) {
      Fail(fmt::format("train.layers_per_chunk[{}]", i),
           fmt::format("must be in [0, 2^31), got {}", layers));
    }
    layout.layers_per_chunk.push_back(layers);
  }
  // Set or not (proto3 optional); when set, a layer count. What it must satisfy
  // against the model and pp / vpp is checked by the planner.
  if (train.has_first_stage_layers()) {
    layout.first_stage_layers =
        StageLayerCount("train.first_stage_layers", train.first_stage_layers());
  }
  if (train.has_last_stage_layers()) {
    layout.last_stage_layers =
        StageLayerCount("train.last_stage_layers", train.last_stage_layers());
  }
  return layout;
}

rollout::InferLayout ToInferLayout(const v1::InferLayout& infer) {
  rollout::InferLayout layout;
  layout.tp = SizeOrDefault("infer.tp", infer.tp(), kMaxSize, 1);
  layout.replicas = SizeOrDefault("infer.replicas", infer.replicas(), kMaxRanks, 1);
  if (layout.tp * layout.replicas > kMaxRanks) {
    Fail("infer.replicas", fmt::format("tp·replicas must be at most {}, got tp {}, replicas {}",
                                       kMaxRanks, layout.tp, layout.replicas));
  }
  layout.expert_parallel = infer.expert_parallel();
  switch (infer.expert_placement()) {
    case v1::EXPERT_PLACEMENT_UNSPECIFIED:
    case v1::EXPERT_PLACEMENT_CONTIGUOUS:
      break;
    case v1::EXPERT_PLACEMENT_ROUND_ROBIN:
      if (!infer.expert_parallel()) {
        Fail("infer.expert_placement", "EXPERT_PLACEMENT_ROUND_ROBIN needs expert_parallel");
      }
      layout.round_robin_experts = true;
      break;
    default:
      Fail("infer.expert_placement",
           fmt::format("unknown value {}", static_cast<int>(infer.expert_placement())));
  }
  return layout;
}

rollout::Topology ToTopology(const v1::Topology& topology) {
  const rollout::Topology defaults;
  rollout::Topology result;
  result.colocated = topology.colocated();
  result.gpus_per_node = SizeOrDefault("topology.gpus_per_node", topology.gpus_per_node(), kMaxSize,
                                       defaults.gpus_per_node);
  result.intra_node_gb_per_s = BandwidthOrDefault(
      "topology.intra_node_gb_per_s", topology.intra_node_gb_per_s(), defaults.intra_node_gb_per_s);
  result.inter_node_gb_per_s = BandwidthOrDefault(
      "topology.inter_node_gb_per_s", topology.inter_node_gb_per_s(), defaults.inter_node_gb_per_s);
  return result;
}

// An upper estimate, in bytes, of the model's tensors: every kind of layer counted
// on every layer (attention with and without MLA, a dense MLP and the experts), in
// floating point so that no size can overflow.
double EstimateModelBytes(const rollout::ModelConfig& m) {
  const auto d = [](std::int64_t v) { return static_cast<double>(v); };
  const double h = d(m.hidden_size), heads = d(m.num_heads);
  const double attention =
      h * (heads + 2.0 * d(m.num_kv_heads)) * d(m.head_dim) + heads * d(m.head_dim) * h +
      h * d(m.q_lora_rank) +
      (d(m.q_lora_rank) + h) * heads * (d(m.qk_nope_head_dim) + d(m.qk_rope_head_dim)) +
      h * (d(m.kv_lora_rank) + d(m.qk_rope_head_dim)) +
      d(m.kv_lora_rank) * heads * (d(m.qk_nope_head_dim) + d(m.v_head_dim)) +
      heads * d(m.v_head_dim) * h + 2.0 * (h + d(m.head_dim)) + d(m.q_lora_rank) +
      d(m.kv_lora_rank) + 3.0 * h * (heads + 2.0 * d(m.num_kv_heads));
  const double mlp =
      3.0 * h * d(m.intermediate_size) +
      3.0 * h * d(m.moe_intermediate_size) * (d(m.num_experts) + d(m.num_shared_experts)) +
      (h + 1.0) * d(m.num_experts) + 2.0 * h;
  const double elements = 2.0 * d(m.vocab_size) * h + h + d(m.num_layers) * (attention + mlp);
  return elements * static_cast<double>(std::max<std::int64_t>(m.dtype_bytes, 4));
}

rollout::TargetDtype ToTargetDtype(v1::TargetDtype dtype) {
  switch (dtype) {
    case v1::TARGET_DTYPE_UNSPECIFIED:
    case v1::TARGET_DTYPE_BF16:
      return rollout::TargetDtype::kBf16;
    case v1::TARGET_DTYPE_FP8_BLOCK128:
      return rollout::TargetDtype::kFp8Block128;
    default:
      Fail("target_dtype", fmt::format("unknown value {}", static_cast<int>(dtype)));
  }
}

v1::Quantize ToQuantize(rollout::Quantize quantize) {
  switch (quantize) {
    case rollout::Quantize::kNone:
      return v1::QUANTIZE_NONE;
    case rollout::Quantize::kAtSender:
      return v1::QUANTIZE_AT_SENDER;
    case rollout::Quantize::kAtDestination:
      return v1::QUANTIZE_AT_DESTINATION;
  }
  return v1::QUANTIZE_NONE;
}

v1::LinkKind ToLinkKind(rollout::LinkKind kind) {
  switch (kind) {
    case rollout::LinkKind::kIntraOut:
      return v1::LINK_KIND_INTRA_NODE_OUT;
    case rollout::LinkKind::kIntraIn:
      return v1::LINK_KIND_INTRA_NODE_IN;
    case rollout::LinkKind::kNicOut:
      return v1::LINK_KIND_NIC_OUT;
    case rollout::LinkKind::kNicIn:
      return v1::LINK_KIND_NIC_IN;
  }
  return v1::LINK_KIND_UNSPECIFIED;
}

void AddRanges(const std::vector<rollout::Range>& slice,
               google::protobuf::RepeatedPtrField<v1::Range>* out) {
  out->Reserve(static_cast<int>(slice.size()));
  for (const rollout::Range& range : slice) {
    v1::Range* r = out->Add();
    r->set_begin(range.begin);
    r->set_end(range.end);
  }
}

}  // namespace

rollout::ModelConfig ToModelConfig(const v1::ReshardRequest& request) {
  const std::string& text = request.model_config_json();
  if (static_cast<std::int64_t>(text.size()) > kMaxModelConfigBytes) {
    Fail("model_config_json",
         fmt::format("must be at most {} bytes, got {}", kMaxModelConfigBytes, text.size()));
  }
  rollout::ModelConfig model;
  try {
    model = rollout::ParseHfConfig(text);
  } catch (const std::invalid_argument& e) {
    Fail("model_config_json", e.what());
  }
  // ParseHfConfig() keeps every size below 2^31; products of three of them are not.
  const double layer_experts =
      static_cast<double>(model.num_layers) * (static_cast<double>(model.num_experts) + 1.0);
  if (layer_experts > static_cast<double>(kMaxLayerExperts)) {
    Fail("model_config_json",
         fmt::format("the model is too large: num_hidden_layers × (experts + 1) must be at most "
                     "{}, got {} × {}",
                     kMaxLayerExperts, model.num_layers, model.num_experts + 1));
  }
  const double bytes = EstimateModelBytes(model);
  if (bytes > kMaxModelBytes) {
    Fail("model_config_json",
         fmt::format("the model is too large: about {:.3g} bytes of tensors, at most 2^42 ({:.3g})",
                     bytes, kMaxModelBytes));
  }
  return model;
}

rollout::ReshardOptions ToReshardOptions(const v1::ReshardRequest& request) {
  rollout::ReshardOptions options;
  options.train = ToTrainLayout(request.train());
  options.infer = ToInferLayout(request.infer());
  options.topology = ToTopology(request.topology());
  options.bucket_bytes =
      SizeOrDefault("bucket_bytes", request.bucket_bytes(), kMaxBucketBytes, kDefaultBucketBytes);
  options.target_dtype = ToTargetDtype(request.target_dtype());
  return options;
}

v1::ReshardPlan ToReshardPlanMessage(const rollout::ReshardPlan& plan, bool include_transfers) {
  v1::ReshardPlan message;
  if (include_transfers) {
    message.mutable_transfers()->Reserve(static_cast<int>(plan.transfers.size()));
    for (const rollout::Transfer& transfer : plan.transfers) {
      v1::Transfer* t = message.add_transfers();
      t->set_bucket(transfer.bucket);
      t->set_src_rank(transfer.src_rank);
      t->set_src_param(plan.param_names.at(static_cast<std::size_t>(transfer.src_param)));
      AddRanges(transfer.src_slice, t->mutable_src_slice());
      t->mutable_dst_ranks()->Add(transfer.dst_ranks.begin(), transfer.dst_ranks.end());
      t->set_dst_param(plan.param_names.at(static_cast<std::size_t>(transfer.dst_param)));
      AddRanges(transfer.dst_slice, t->mutable_dst_slice());
      t->set_bytes(transfer.bytes);
      t->set_quantize(ToQuantize(transfer.quantize));
    }
  }
  message.set_num_transfers(static_cast<std::int64_t>(plan.transfers.size()));
  message.set_num_buckets(plan.num_buckets);
  message.set_trainer_ranks(plan.trainer_ranks);
  message.set_engine_ranks(plan.engine_ranks);
  message.set_bytes_received(plan.bytes_received);
  message.set_bytes_local(plan.bytes_local);
  message.set_bytes_moved(plan.bytes_moved);
  message.set_estimate_seconds(plan.estimate_seconds);
  message.set_lower_bound_seconds(plan.lower_bound_seconds);
  message.set_naive_seconds(plan.naive_seconds);
  v1::LinkLoad* busiest = message.mutable_busiest_link();
  busiest->set_rank(plan.busiest_link.rank);
  busiest->set_kind(ToLinkKind(plan.busiest_link.kind));
  busiest->set_bytes(plan.busiest_link.bytes);
  busiest->set_seconds(plan.busiest_link.seconds);
  message.mutable_bucket_seconds()->Add(plan.bucket_seconds.begin(), plan.bucket_seconds.end());
  return message;
}

v1::ReshardPlan SolveReshard(const v1::ReshardRequest& request) {
  const rollout::ModelConfig model = ToModelConfig(request);
  const rollout::ReshardOptions options = ToReshardOptions(request);
  return ToReshardPlanMessage(rollout::PlanReshard(model, options), request.include_transfers());
}

}  // namespace rlsched::scheduler
