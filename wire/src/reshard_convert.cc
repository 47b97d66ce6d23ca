#include "rlsched/wire/reshard_convert.h"

#include <fmt/format.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl.h>
#include <google/protobuf/util/delimited_message_util.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "rlsched/common/check.h"
#include "rlsched/common/error.h"
#include "rlsched/rollout/layout.h"
#include "rlsched/wire/json.h"

namespace rlsched::wire {

namespace {

constexpr std::int64_t kMaxSize = 65536;                   // one parallel size
constexpr std::int64_t kMaxRanks = std::int64_t{1} << 20;  // GPUs on either side
constexpr std::int64_t kMaxChunkLayers = std::int64_t{1} << 31;
constexpr std::int64_t kMaxBucketBytes = std::int64_t{1} << 40;
constexpr double kMaxGbPerS = 1e6;
// GPUs a plan's transfers may name: trainer and engine worlds of at most 2^20 each.
constexpr std::int64_t kMaxPlanGpus = std::int64_t{1} << 21;

// A size where 0 means `unset` (the default), in [0, max]; returns its value.
std::int64_t SizeOrDefault(std::string_view field, std::int64_t value, std::int64_t max,
                           std::int64_t unset) {
  CheckInRange(field, value, 0, max, fmt::format("(0 means {})", unset));
  return value == 0 ? unset : value;
}

// A bandwidth where 0 means `unset`, finite and in [0, kMaxGbPerS].
double BandwidthOrDefault(std::string_view field, double value, double unset) {
  CheckFiniteInRange(field, value, 0.0, End::kClosed, kMaxGbPerS, End::kClosed,
                     fmt::format("GB/s (0 means {})", unset));
  return value == 0.0 ? unset : value;
}

// A stage's layer count: in [1, kMaxChunkLayers).
std::int64_t StageLayerCount(std::string_view field, std::int64_t value) {
  return CheckBelow(field, value, 1, {kMaxChunkLayers, "2^31"});
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
    layout.layers_per_chunk.push_back(CheckBelow({"train.layers_per_chunk", std::size_t(i)}, layers,
                                                 0, {kMaxChunkLayers, "2^31"}));
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

// The layouts a plan was made for, every size as the planner used it.
v1::TrainLayout ToTrainLayoutMessage(const rollout::TrainLayout& train) {
  v1::TrainLayout message;
  message.set_tp(train.tp);
  message.set_pp(train.pp);
  message.set_vpp(train.vpp);
  message.set_ep(train.ep);
  message.set_etp(train.etp);
  message.set_cp(train.cp);
  message.set_dp(train.dp);
  message.mutable_layers_per_chunk()->Add(train.layers_per_chunk.begin(),
                                          train.layers_per_chunk.end());
  if (train.first_stage_layers) message.set_first_stage_layers(*train.first_stage_layers);
  if (train.last_stage_layers) message.set_last_stage_layers(*train.last_stage_layers);
  return message;
}

v1::InferLayout ToInferLayoutMessage(const rollout::InferLayout& infer) {
  v1::InferLayout message;
  message.set_tp(infer.tp);
  message.set_replicas(infer.replicas);
  message.set_expert_parallel(infer.expert_parallel);
  message.set_expert_placement(infer.round_robin_experts ? v1::EXPERT_PLACEMENT_ROUND_ROBIN
                                                         : v1::EXPERT_PLACEMENT_CONTIGUOUS);
  return message;
}

v1::Topology ToTopologyMessage(const rollout::Topology& topology) {
  v1::Topology message;
  message.set_colocated(topology.colocated);
  message.set_gpus_per_node(topology.gpus_per_node);
  message.set_intra_node_gb_per_s(topology.intra_node_gb_per_s);
  message.set_inter_node_gb_per_s(topology.inter_node_gb_per_s);
  return message;
}

v1::TargetDtype ToTargetDtypeMessage(rollout::TargetDtype dtype) {
  switch (dtype) {
    case rollout::TargetDtype::kBf16:
      return v1::TARGET_DTYPE_BF16;
    case rollout::TargetDtype::kFp8Block128:
      return v1::TARGET_DTYPE_FP8_BLOCK128;
  }
  return v1::TARGET_DTYPE_UNSPECIFIED;
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

// ---------------------------------------------------------------------------------
// Plan files.

// Output through a buffer of about kFlushBytes.
class BufferedOut {
 public:
  static constexpr std::size_t kFlushBytes = std::size_t{1} << 20;

  explicit BufferedOut(std::ostream& out) : out_(out) { buffer_.reserve(kFlushBytes + 4096); }
  std::string& buffer() { return buffer_; }
  void MaybeFlush() {
    if (buffer_.size() >= kFlushBytes) Flush();
  }
  void Flush() {
    out_.write(buffer_.data(), static_cast<std::streamsize>(buffer_.size()));
    if (!out_) throw std::runtime_error("plan file: cannot write");
    buffer_.clear();
  }

 private:
  std::ostream& out_;
  std::string buffer_;
};

// Appends `"value"` (protobuf's JSON mapping of an int64).
void AppendQuotedInt(std::string& out, std::int64_t value) {
  char text[24];
  text[0] = '"';
  char* end = std::to_chars(text + 1, text + sizeof text - 1, value).ptr;
  *end++ = '"';
  out.append(text, end);
}

// A string as protobuf's JSON printer writes it, quotes included. Names of letters,
// digits and . _ - / need no escaping; anything else goes through protobuf.
std::string QuotedJsonString(const std::string& text) {
  const bool plain = std::all_of(text.begin(), text.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-' || c == '/';
  });
  if (plain) return '"' + text + '"';
  v1::Transfer holder;
  holder.set_src_param(text);
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  std::string json;
  if (!google::protobuf::util::MessageToJsonString(holder, &json, options).ok()) {
    throw std::runtime_error("plan file: cannot print a parameter name as JSON");
  }
  constexpr std::string_view kPrefix = "{\"src_param\":";
  if (!json.starts_with(kPrefix) || !json.ends_with('}')) {
    throw std::logic_error("plan file: unexpected JSON for a parameter name: " + json);
  }
  return json.substr(kPrefix.size(), json.size() - kPrefix.size() - 1);
}

void AppendJsonSlice(std::string& out, const std::vector<rollout::Range>& slice) {
  out += '[';
  for (std::size_t i = 0; i < slice.size(); ++i) {
    out += i == 0 ? "{\"begin\":" : ",{\"begin\":";
    AppendQuotedInt(out, slice[i].begin);
    out += ",\"end\":";
    AppendQuotedInt(out, slice[i].end);
    out += '}';
  }
  out += ']';
}

// A varint (a part's length prefix), appended to a string.
void PutVarint(std::string& out, std::uint64_t value) {
  std::uint8_t bytes[10];
  std::uint8_t* end = google::protobuf::io::CodedOutputStream::WriteVarint64ToArray(value, bytes);
  out.append(reinterpret_cast<const char*>(bytes), static_cast<std::size_t>(end - bytes));
}
std::size_t VarintSize(std::uint64_t value) {
  return google::protobuf::io::CodedOutputStream::VarintSize64(value);
}
// Serialises `message` varint-delimited to `out`.
void WriteDelimited(const google::protobuf::Message& message, std::ostream& out) {
  if (!google::protobuf::util::SerializeDelimitedToOstream(message, &out) || !out) {
    throw std::runtime_error("plan file: cannot write");
  }
}

[[noreturn]] void BadPlanFile(std::string_view what) {
  throw std::runtime_error(fmt::format("plan file: {}", what));
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
  *message.mutable_train() = ToTrainLayoutMessage(plan.options.train);
  *message.mutable_infer() = ToInferLayoutMessage(plan.options.infer);
  *message.mutable_topology() = ToTopologyMessage(plan.options.topology);
  message.set_bucket_bytes(plan.options.bucket_bytes);
  message.set_target_dtype(ToTargetDtypeMessage(plan.options.target_dtype));
  return message;
}

void WriteReshardPlanJson(const rollout::ReshardPlan& plan, std::ostream& out) {
  // The summary's JSON, `{"transfers":[],...}`, is protobuf's own; the transfers are
  // written in between, in the printer's format: fields in number order, every field
  // printed, int64 values quoted, enums by name.
  const std::string summary = ToJson(ToReshardPlanMessage(plan, /*include_transfers=*/false));
  constexpr std::string_view kHead = "{\"transfers\":[";
  if (!summary.starts_with(kHead) || summary.size() <= kHead.size() ||
      summary[kHead.size()] != ']') {
    throw std::logic_error("plan file: unexpected JSON for the summary: " + summary);
  }
  std::vector<std::string> names;
  names.reserve(plan.param_names.size());
  for (const std::string& name : plan.param_names) names.push_back(QuotedJsonString(name));
  const auto quantize = [](rollout::Quantize q) {
    return fmt::format("\"{}\"", v1::Quantize_Name(ToQuantize(q)));
  };
  const std::string quantize_names[] = {quantize(rollout::Quantize::kNone),
                                        quantize(rollout::Quantize::kAtSender),
                                        quantize(rollout::Quantize::kAtDestination)};
  BufferedOut buffered(out);
  std::string& b = buffered.buffer();
  b += kHead;
  for (std::size_t i = 0; i < plan.transfers.size(); ++i) {
    const rollout::Transfer& t = plan.transfers[i];
    b += i == 0 ? "{\"bucket\":" : ",{\"bucket\":";
    AppendQuotedInt(b, t.bucket);
    b += ",\"src_rank\":";
    AppendQuotedInt(b, t.src_rank);
    b += ",\"src_param\":";
    b += names.at(static_cast<std::size_t>(t.src_param));
    b += ",\"src_slice\":";
    AppendJsonSlice(b, t.src_slice);
    b += ",\"dst_ranks\":[";
    for (std::size_t k = 0; k < t.dst_ranks.size(); ++k) {
      if (k > 0) b += ',';
      AppendQuotedInt(b, t.dst_ranks[k]);
    }
    b += "],\"dst_param\":";
    b += names.at(static_cast<std::size_t>(t.dst_param));
    b += ",\"dst_slice\":";
    AppendJsonSlice(b, t.dst_slice);
    b += ",\"bytes\":";
    AppendQuotedInt(b, t.bytes);
    b += ",\"quantize\":";
    b += quantize_names[static_cast<int>(t.quantize)];
    b += '}';
    buffered.MaybeFlush();
  }
  b.append(summary, kHead.size(), std::string::npos);
  b += '\n';
  buffered.Flush();
}

ReshardRankParts::ReshardRankParts(const rollout::ReshardPlan& plan) : plan_(plan) {
  if (plan.transfers.size() > std::numeric_limits<std::uint32_t>::max()) {
    throw std::runtime_error("plan file: more than 2^32 transfers");
  }
  const auto names = static_cast<std::int64_t>(plan.param_names.size());
  std::int64_t gpus = 0;
  const Limit max_gpus{kMaxPlanGpus, "2^21"};
  for (std::size_t i = 0; i < plan.transfers.size(); ++i) {
    const rollout::Transfer& t = plan.transfers[i];
    gpus = std::max(gpus, CheckBelow({"transfers", i, ".src_rank"}, t.src_rank, 0, max_gpus) + 1);
    for (std::size_t k = 0; k < t.dst_ranks.size(); ++k) {
      const std::int64_t d = t.dst_ranks[k];
      if (d < 0 || d >= kMaxPlanGpus) {  // the field's path is formatted only for an error
        CheckBelow(fmt::format("transfers[{}].dst_ranks[{}]", i, k), d, 0, max_gpus);
      }
      gpus = std::max(gpus, d + 1);
    }
    CheckBelow({"transfers", i, ".src_param"}, t.src_param, 0, names, "(the plan's param_names)");
    CheckBelow({"transfers", i, ".dst_param"}, t.dst_param, 0, names, "(the plan's param_names)");
  }
  // The GPUs each transfer involves (its sender and its receivers, each once), and for
  // each GPU the transfers it is in, ascending (a CSR index).
  start_.assign(static_cast<std::size_t>(gpus) + 1, 0);
  auto each_gpu = [](const rollout::Transfer& t, auto&& visit) {
    visit(t.src_rank);
    for (std::int64_t d : t.dst_ranks) {
      if (d != t.src_rank) visit(d);
    }
  };
  for (const rollout::Transfer& t : plan.transfers) {
    each_gpu(t, [&](std::int64_t g) { ++start_[static_cast<std::size_t>(g) + 1]; });
  }
  for (std::size_t g = 1; g < start_.size(); ++g) start_[g] += start_[g - 1];
  transfers_.resize(start_.back());
  std::vector<std::size_t> next(start_.begin(), start_.end() - 1);
  for (std::size_t i = 0; i < plan.transfers.size(); ++i) {
    each_gpu(plan.transfers[i], [&](std::int64_t g) {
      transfers_[next[static_cast<std::size_t>(g)]++] = static_cast<std::uint32_t>(i);
    });
  }
  // Plan-wide ids of the receiver sets: the first transfer with each set.
  group_of_.resize(plan.transfers.size());
  std::unordered_map<std::string, std::uint32_t> ids;
  std::string key;
  for (std::size_t i = 0; i < plan.transfers.size(); ++i) {
    const std::vector<std::int64_t>& d = plan.transfers[i].dst_ranks;
    key.assign(reinterpret_cast<const char*>(d.data()), d.size() * sizeof(std::int64_t));
    const auto [it, inserted] = ids.try_emplace(key, static_cast<std::uint32_t>(groups_.size()));
    if (inserted) groups_.push_back(static_cast<std::uint32_t>(i));
    group_of_[i] = it->second;
  }
  name_ids_.assign(plan.param_names.size(), -1);
  group_ids_.assign(groups_.size(), -1);
}

std::span<const std::uint32_t> ReshardRankParts::TransfersOf(std::int64_t rank) const {
  CheckAtLeast("rank", rank, 0);
  if (rank >= gpus()) return {};
  const auto g = static_cast<std::size_t>(rank);
  return std::span<const std::uint32_t>(transfers_).subspan(start_[g], start_[g + 1] - start_[g]);
}

std::int32_t ReshardRankParts::NameId(std::int32_t name) {
  std::int32_t& id = name_ids_[static_cast<std::size_t>(name)];
  if (id < 0) {
    id = static_cast<std::int32_t>(names_used_.size());
    names_used_.push_back(name);
  }
  return id;
}

std::int32_t ReshardRankParts::GroupId(std::uint32_t group) {
  std::int32_t& id = group_ids_[group];
  if (id < 0) {
    id = static_cast<std::int32_t>(groups_used_.size());
    groups_used_.push_back(group);
  }
  return id;
}

void ReshardRankParts::BuildPart(std::int64_t rank, v1::ReshardRankPart& part) {
  part.Clear();
  const std::span<const std::uint32_t> transfers = TransfersOf(rank);
  auto* out = part.mutable_transfers();
  out->Reserve(static_cast<int>(transfers.size()));
  for (const std::uint32_t index : transfers) {
    const rollout::Transfer& t = plan_.transfers[index];
    v1::RankTransfer* r = out->Add();
    r->set_index(index);
    r->set_bucket(t.bucket);
    r->set_src_rank(t.src_rank);
    r->set_src_param(NameId(t.src_param));
    for (const rollout::Range& range : t.src_slice) {
      r->add_src_slice(range.begin);
      r->add_src_slice(range.end);
    }
    r->set_dst_group(GroupId(group_of_[index]));
    r->set_dst_param(NameId(t.dst_param));
    for (const rollout::Range& range : t.dst_slice) {
      r->add_dst_slice(range.begin);
      r->add_dst_slice(range.end);
    }
    r->set_bytes(t.bytes);
    r->set_quantize(ToQuantize(t.quantize));
  }
  part.mutable_param_names()->Reserve(static_cast<int>(names_used_.size()));
  for (const std::int32_t name : names_used_) {
    part.add_param_names(plan_.param_names[static_cast<std::size_t>(name)]);
    name_ids_[static_cast<std::size_t>(name)] = -1;  // reset for the next part
  }
  part.mutable_dst_groups()->Reserve(static_cast<int>(groups_used_.size()));
  for (const std::uint32_t group : groups_used_) {
    const std::vector<std::int64_t>& ranks = plan_.transfers[groups_[group]].dst_ranks;
    part.add_dst_groups()->mutable_ranks()->Add(ranks.begin(), ranks.end());
    group_ids_[group] = -1;
  }
  names_used_.clear();
  groups_used_.clear();
}

v1::ReshardRankPart ReshardRankParts::Part(std::int64_t rank) {
  v1::ReshardRankPart part;
  BuildPart(rank, part);
  return part;
}

v1::ReshardRankPart ToReshardRankPart(const rollout::ReshardPlan& plan, std::int64_t rank) {
  CheckAtLeast("rank", rank, 0);
  return ReshardRankParts(plan).Part(rank);
}

void WriteReshardPlanBinary(const rollout::ReshardPlan& plan, std::ostream& out) {
  ReshardRankParts parts(plan);
  const auto gpus = static_cast<std::size_t>(parts.gpus());
  // The index, first with placeholder offsets and sizes (fixed64, non-zero, so that
  // its size does not change), rewritten once the parts are written.
  v1::ReshardPlanIndex index;
  index.set_format_version(kPlanFileFormatVersion);
  *index.mutable_summary() = ToReshardPlanMessage(plan, /*include_transfers=*/false);
  for (std::size_t g = 0; g < gpus; ++g) {
    const std::size_t count = parts.TransfersOf(static_cast<std::int64_t>(g)).size();
    if (count == 0) continue;
    v1::ReshardRankPartEntry* entry = index.add_parts();
    entry->set_rank(static_cast<std::int64_t>(g));
    entry->set_offset(1);
    entry->set_size(1);
    entry->set_num_transfers(static_cast<std::int64_t>(count));
  }
  const std::streampos start = out.tellp();
  if (start == std::streampos(-1)) BadPlanFile("the output is not seekable");
  if (start != std::streampos(0)) BadPlanFile("the output is not at the file's start");
  WriteDelimited(index, out);
  std::uint64_t offset = VarintSize(index.ByteSizeLong()) + index.ByteSizeLong();

  // GPUs with the same transfers share a part: by a hash of the list, then compared.
  const auto list_hash = [](std::span<const std::uint32_t> list) {
    std::uint64_t h = 0xcbf29ce484222325ull;
    for (const std::uint32_t t : list) h = (h ^ t) * 0x100000001b3ull;
    return h;
  };
  std::unordered_multimap<std::uint64_t, int> written;  // list hash -> index entry
  v1::ReshardRankPart part;
  BufferedOut buffered(out);
  int entry = 0;
  for (std::size_t g = 0; g < gpus; ++g) {
    const std::span<const std::uint32_t> list = parts.TransfersOf(static_cast<std::int64_t>(g));
    if (list.empty()) continue;
    v1::ReshardRankPartEntry* e = index.mutable_parts(entry);
    const std::uint64_t hash = list_hash(list);
    const auto [first, last] = written.equal_range(hash);
    const auto same = std::find_if(first, last, [&](const auto& w) {
      const std::span<const std::uint32_t> other = parts.TransfersOf(index.parts(w.second).rank());
      return std::equal(list.begin(), list.end(), other.begin(), other.end());
    });
    if (same != last) {
      e->set_offset(index.parts(same->second).offset());
      e->set_size(index.parts(same->second).size());
    } else {
      parts.BuildPart(static_cast<std::int64_t>(g), part);
      std::string& b = buffered.buffer();
      const std::size_t before = b.size();
      const std::size_t length = part.ByteSizeLong();
      PutVarint(b, length);
      const std::size_t at = b.size();
      b.resize(at + length);
      part.SerializeWithCachedSizesToArray(reinterpret_cast<std::uint8_t*>(b.data() + at));
      const std::uint64_t size = b.size() - before;
      e->set_offset(offset);
      e->set_size(size);
      offset += size;
      written.emplace(hash, entry);
      buffered.MaybeFlush();
    }
    ++entry;
  }
  buffered.Flush();
  const std::streampos end = out.tellp();
  out.seekp(start);
  WriteDelimited(index, out);
  if (out.tellp() - start !=
      static_cast<std::streamoff>(VarintSize(index.ByteSizeLong()) + index.ByteSizeLong())) {
    BadPlanFile("the index changed size");
  }
  out.seekp(end);
  if (!out) BadPlanFile("cannot write");
}

v1::ReshardPlanIndex ReadReshardPlanIndex(std::istream& in) {
  in.clear();
  in.seekg(0);
  if (!in) BadPlanFile("cannot seek to the start");
  google::protobuf::io::IstreamInputStream stream(&in);
  v1::ReshardPlanIndex index;
  bool clean_eof = false;
  if (!google::protobuf::util::ParseDelimitedFromZeroCopyStream(&index, &stream, &clean_eof)) {
    BadPlanFile(clean_eof ? "empty" : "the index (first message) does not parse");
  }
  if (index.format_version() != kPlanFileFormatVersion) {
    BadPlanFile(fmt::format("format_version {}, expected {}", index.format_version(),
                            kPlanFileFormatVersion));
  }
  return index;
}

v1::ReshardRankPart ReadReshardRankPart(std::istream& in, const v1::ReshardPlanIndex& index,
                                        std::int64_t rank) {
  CheckAtLeast("rank", rank, 0);
  v1::ReshardRankPart part;
  const auto& parts = index.parts();
  const auto it = std::lower_bound(
      parts.begin(), parts.end(), rank,
      [](const v1::ReshardRankPartEntry& e, std::int64_t r) { return e.rank() < r; });
  if (it == parts.end() || it->rank() != rank) return part;
  if (it->offset() > static_cast<std::uint64_t>(std::numeric_limits<std::streamoff>::max())) {
    BadPlanFile(fmt::format("GPU {}: offset {} out of range", rank, it->offset()));
  }
  in.clear();
  in.seekg(static_cast<std::streamoff>(it->offset()));
  if (!in) BadPlanFile(fmt::format("GPU {}: cannot seek to offset {}", rank, it->offset()));
  google::protobuf::io::IstreamInputStream stream(&in);
  if (!google::protobuf::util::ParseDelimitedFromZeroCopyStream(&part, &stream, nullptr)) {
    BadPlanFile(fmt::format("GPU {}: the part at offset {} does not parse", rank, it->offset()));
  }
  if (part.transfers_size() != it->num_transfers()) {
    BadPlanFile(fmt::format("GPU {}: the part at offset {} has {} transfers, the index says {}",
                            rank, it->offset(), part.transfers_size(), it->num_transfers()));
  }
  return part;
}

std::vector<v1::Transfer> RankPartTransfers(const v1::ReshardRankPart& part) {
  const auto name = [&](std::int32_t id) -> const std::string& {
    if (id < 0 || id >= part.param_names_size()) {
      BadPlanFile(fmt::format("parameter name {} out of range", id));
    }
    return part.param_names(id);
  };
  const auto slice = [&](const google::protobuf::RepeatedField<std::int64_t>& flat,
                         google::protobuf::RepeatedPtrField<v1::Range>* out) {
    if (flat.size() % 2 != 0) BadPlanFile("a slice with an odd number of values");
    for (int i = 0; i < flat.size(); i += 2) {
      v1::Range* r = out->Add();
      r->set_begin(flat[i]);
      r->set_end(flat[i + 1]);
    }
  };
  std::vector<v1::Transfer> transfers;
  transfers.reserve(static_cast<std::size_t>(part.transfers_size()));
  for (const v1::RankTransfer& t : part.transfers()) {
    v1::Transfer& x = transfers.emplace_back();
    x.set_bucket(t.bucket());
    x.set_src_rank(t.src_rank());
    x.set_src_param(name(t.src_param()));
    slice(t.src_slice(), x.mutable_src_slice());
    if (t.dst_group() < 0 || t.dst_group() >= part.dst_groups_size()) {
      BadPlanFile(fmt::format("receiver set {} out of range", t.dst_group()));
    }
    *x.mutable_dst_ranks() = part.dst_groups(t.dst_group()).ranks();
    x.set_dst_param(name(t.dst_param()));
    slice(t.dst_slice(), x.mutable_dst_slice());
    x.set_bytes(t.bytes());
    x.set_quantize(t.quantize());
  }
  return transfers;
}

v1::ReshardPlan SolveReshard(const v1::ReshardRequest& request) {
  const rollout::ModelConfig model = ToModelConfig(request);
  const rollout::ReshardOptions options = ToReshardOptions(request);
  return ToReshardPlanMessage(rollout::PlanReshard(model, options), request.include_transfers());
}

}  // namespace rlsched::wire
