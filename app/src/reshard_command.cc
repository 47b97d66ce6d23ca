#include "reshard_command.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <stdexcept>
#include <system_error>
#include <utility>
#include <vector>

#include "command_common.h"
#include "flag_errors.h"
#include "format.h"
#include "rlsched/common/error.h"
#include "rlsched/rollout/model.h"
#include "rlsched/rollout/plan.h"
#include "rlsched/rollout/verify.h"
#include "rlsched/wire/json.h"
#include "rlsched/wire/reshard_convert.h"

namespace rlsched::app {

using namespace ::rlsched::wire;  // NOLINT: the conversions the commands call
namespace {

constexpr std::int64_t kMaxSize = 65536;
constexpr std::int64_t kMaxReplicas = std::int64_t{1} << 20;
constexpr std::int64_t kMaxStageLayers = (std::int64_t{1} << 31) - 1;
constexpr std::int64_t kMaxBucketMiB = std::int64_t{1} << 20;  // 2^40 bytes
constexpr double kMaxGbPerS = 1e6;

// One entry of a key=value list: the key and its value (empty when there was no '=').
struct Entry {
  std::string key;
  std::optional<std::string> value;
};

// Splits `text` at commas into key[=value] entries, '_' in a key read as '-'. Throws
// std::invalid_argument naming `option` for an empty entry or a repeated key.
std::vector<Entry> SplitEntries(std::string_view option, std::string_view text) {
  if (text.empty()) Fail(option, "must not be empty");
  std::vector<Entry> entries;
  std::set<std::string, std::less<>> seen;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    const std::string_view item = text.substr(start, comma - start);
    if (item.empty()) {
      Fail(option, fmt::format("empty entry in '{}'", text));
    }
    Entry entry;
    const std::size_t equals = item.find('=');
    entry.key = std::string(item.substr(0, equals));
    // '_' spells '-' (first_stage_layers, the proto's and Megatron's spelling).
    std::replace(entry.key.begin(), entry.key.end(), '_', '-');
    if (equals != std::string_view::npos) entry.value = std::string(item.substr(equals + 1));
    if (entry.key.empty()) {
      Fail(option, fmt::format("entry '{}' has no key", item));
    }
    if (!seen.insert(entry.key).second) {
      Fail(option, fmt::format("duplicate key '{}'", entry.key));
    }
    entries.push_back(std::move(entry));
    if (comma == text.size()) break;
    start = comma + 1;
  }
  return entries;
}

[[noreturn]] void UnknownKey(std::string_view option, const std::string& key,
                             std::string_view keys) {
  Fail(option, fmt::format("unknown key '{}' (keys: {})", key, keys));
}

// The integer value of `entry`, in [min, max].
std::int64_t IntegerValue(std::string_view option, const Entry& entry, std::int64_t min,
                          std::int64_t max) {
  if (!entry.value) {
    Fail(option, fmt::format("{} needs a value ({}=N), an integer in [{}, {}]", entry.key,
                             entry.key, min, max));
  }
  const std::string& text = *entry.value;
  std::int64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ptr != end || ec != std::errc() || value < min || value > max) {
    Fail(option,
         fmt::format("{} must be an integer in [{}, {}], got '{}'", entry.key, min, max, text));
  }
  return value;
}

// ToModelConfig() with its errors naming the file instead of the request field.
rollout::ModelConfig ParseModel(const ReshardArgs& args, const v1::ReshardRequest& request) {
  try {
    return ToModelConfig(request);
  } catch (const FieldError& e) {
    throw ToFlagError(e, WeightLayoutFlags(args.model));
  }
}

std::string_view DescribeLink(v1::LinkKind kind) {
  switch (kind) {
    case v1::LINK_KIND_INTRA_NODE_OUT:
      return "intra-node out";
    case v1::LINK_KIND_INTRA_NODE_IN:
      return "intra-node in";
    case v1::LINK_KIND_NIC_OUT:
      return "NIC out";
    case v1::LINK_KIND_NIC_IN:
      return "NIC in";
    default:
      return "none";
  }
}

std::string DescribeTrain(const v1::TrainLayout& train) {
  std::string text = fmt::format("tp {}", std::max<std::int64_t>(1, train.tp()));
  const std::pair<const char*, std::int64_t> others[] = {{"pp", train.pp()}, {"vpp", train.vpp()},
                                                         {"ep", train.ep()}, {"etp", train.etp()},
                                                         {"cp", train.cp()}, {"dp", train.dp()}};
  for (const auto& [name, value] : others) {
    if (value > 1) text += fmt::format(", {} {}", name, value);
  }
  const auto layers = [](std::int64_t n) {
    return fmt::format("{} layer{}", n, n == 1 ? "" : "s");
  };
  if (train.has_first_stage_layers()) {
    text += fmt::format(", first stage {}", layers(train.first_stage_layers()));
  }
  if (train.has_last_stage_layers()) {
    text += fmt::format(", last stage {}", layers(train.last_stage_layers()));
  }
  return text;
}

std::string DescribeInfer(const v1::ReshardRequest& request) {
  const v1::InferLayout& infer = request.infer();
  const std::int64_t replicas = std::max<std::int64_t>(1, infer.replicas());
  std::string text = fmt::format("{} replica{} × tp {}", replicas, replicas == 1 ? "" : "s",
                                 std::max<std::int64_t>(1, infer.tp()));
  if (infer.expert_parallel()) {
    text += infer.expert_placement() == v1::EXPERT_PLACEMENT_ROUND_ROBIN
                ? ", expert parallel (round-robin experts)"
                : ", expert parallel";
  }
  text +=
      request.topology().colocated() ? ", on the trainer's GPUs (colocated)" : ", on separate GPUs";
  return text;
}

void PrintPlanSummary(const ReshardArgs& args, const v1::ReshardRequest& request,
                      const rollout::ModelConfig& model, const v1::ReshardPlan& plan,
                      std::ostream& out) {
  double parameters = 0.0;
  std::int64_t model_bytes = 0;
  for (const rollout::FullTensor& tensor : rollout::HfTensors(model)) {
    parameters += static_cast<double>(tensor.Elements());
    model_bytes += tensor.Bytes();
  }
  const auto line = [&out](std::string_view label, const std::string& value) {
    out << fmt::format("{:<15}{}\n", label, value);
  };
  line("model", fmt::format("{} ({}): {} parameters, {}, {} layers", args.model,
                            rollout::FamilyName(model.family), FormatCount(parameters),
                            FormatBytes(model_bytes), model.num_layers));
  line("trainer", fmt::format("{} GPUs: {}", plan.trainer_ranks(), DescribeTrain(request.train())));
  line("engines", fmt::format("{} GPUs: {}", plan.engine_ranks(), DescribeInfer(request)));
  const v1::Topology& topology = request.topology();
  line("topology", fmt::format("{} GPUs per node; per GPU and direction: intra-node {} GB/s, "
                               "inter-node (NIC) {} GB/s",
                               topology.gpus_per_node(), topology.intra_node_gb_per_s(),
                               topology.inter_node_gb_per_s()));
  line("engine dtype", request.target_dtype() == v1::TARGET_DTYPE_FP8_BLOCK128
                           ? "fp8 linear weights (128 x 128 block scales), the rest bf16"
                           : "bf16, as trained");
  line("bucket budget",
       fmt::format("{} MiB per GPU, sent and received", request.bucket_bytes() >> 20));
  out << '\n';
  line("received", FormatBytes(plan.bytes_received()) + ", summed over engine GPUs");
  line("local copies", FormatBytes(plan.bytes_local()));
  line("moved", FormatBytes(plan.bytes_moved()) + " over links (a broadcast counts once)");
  line("transfers", fmt::format("{}", plan.num_transfers()));
  line("buckets", fmt::format("{}", plan.num_buckets()));
  const v1::LinkLoad& busiest = plan.busiest_link();
  line("busiest link",
       plan.busiest_link().bytes() > 0
           ? fmt::format("GPU {} {}: {}, {}", busiest.rank(), DescribeLink(busiest.kind()),
                         FormatBytes(busiest.bytes()), FormatDuration(busiest.seconds()))
           : std::string("none (every byte is copied locally)"));
  line("estimate", FormatDuration(plan.estimate_seconds()) +
                       " (per bucket the busiest link's bytes / bandwidth, summed)");
  line("lower bound",
       fmt::format("{} (estimate / lower bound = {})", FormatDuration(plan.lower_bound_seconds()),
                   FormatRatio(plan.estimate_seconds() / plan.lower_bound_seconds())));
  line("naive", fmt::format("{} (gather every tensor on trainer GPU 0, broadcast to every "
                            "engine GPU; naive / estimate = {})",
                            FormatDuration(plan.naive_seconds()),
                            FormatRatio(plan.naive_seconds() / plan.estimate_seconds())));
}

// Throws std::invalid_argument naming --verify when `model` is certainly too large
// for rollout::VerifyPlan(). The verifier holds the trainer shards and one replica's
// reference engine shards, each at least the whole model, and refuses beyond
// kMaxVerifyElements in all; it checks only after building the first shards (which
// for a large model exhausts the memory first), so the command checks before.
void CheckVerifiable(const rollout::ModelConfig& model) {
  std::int64_t parameters = 0;
  for (const rollout::FullTensor& tensor : rollout::HfTensors(model)) {
    parameters += tensor.Elements();
  }
  if (2 * parameters > rollout::kMaxVerifyElements) {
    Fail("--verify",
         fmt::format("the model has {} parameters; the verifier holds several copies of it, at "
                     "most {} elements in all: use a model of a few million parameters",
                     parameters, rollout::kMaxVerifyElements));
  }
}

// Runs rollout::VerifyPlan() and writes its result to `out`; throws
// std::runtime_error if the plan is wrong.
void Verify(const rollout::ModelConfig& model, const rollout::ReshardOptions& options,
            const rollout::ReshardPlan& plan, std::ostream& out) {
  rollout::VerifyResult result;
  const auto start = std::chrono::steady_clock::now();
  try {
    result = rollout::VerifyPlan(model, options, plan);
  } catch (const std::invalid_argument& e) {
    Fail("--verify", e.what());
  }
  const std::chrono::duration<double, std::milli> elapsed =
      std::chrono::steady_clock::now() - start;
  spdlog::info("verified the plan in {:.1f} ms", elapsed.count());
  if (result.ok) {
    out << fmt::format(
        "verify: ok ({} transfers executed on reference data, {} elements written, every "
        "engine tensor equal to its reference)\n",
        result.transfers, result.elements_written);
    FlushOutput(out);
    return;
  }
  out << fmt::format(
      "verify: FAILED ({} transfers, {} elements written): {} mismatched, {} written twice or "
      "more, {} never written, {} padding written, {} padding read, {} bad transfers, {} "
      "bookkeeping errors\n",
      result.transfers, result.elements_written, result.mismatched_elements,
      result.double_written_elements, result.unwritten_elements, result.padding_written_elements,
      result.padding_read_elements, result.bad_transfers, result.bookkeeping_errors);
  for (const std::string& problem : result.problems) out << "  " << problem << '\n';
  FlushOutput(out);
  throw std::runtime_error("--verify: the plan does not move the weights correctly");
}

// Whether --plan-out names a binary plan file: the extension .binpb.
bool IsBinaryPlanPath(const std::string& path) {
  return std::filesystem::path(path).extension() == ".binpb";
}

// Writes the plan file: binary for a .binpb path, else JSON; streamed (neither the
// whole message nor the whole text is built).
void WritePlanFile(const std::string& path, const rollout::ReshardPlan& plan) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (!file) {
    Fail("--plan-out", fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  }
  try {
    if (IsBinaryPlanPath(path)) {
      WriteReshardPlanBinary(plan, file);
    } else {
      WriteReshardPlanJson(plan, file);
    }
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(fmt::format("--plan-out: {}: {}", path, e.what()));
  }
  file.close();
  if (!file) throw std::runtime_error(fmt::format("--plan-out: {}: cannot write", path));
}

}  // namespace

CLI::App* AddReshardCommand(CLI::App& app, ReshardArgs& args) {
  CLI::App* command = app.add_subcommand(
      "reshard",
      "Plan the weight transfer after a train step: which slices of which tensors move from "
      "the trainer's GPUs (Megatron-core layout) to the inference engines' GPUs (vLLM "
      "layout), from which sender, in which bucket, and what that costs");
  command->fallthrough();
  command->footer(
      "--train keys: tp, pp, vpp (virtual pipeline chunks per stage), ep, etp (expert tensor "
      "parallel), cp, dp, and first-stage-layers, last-stage-layers (Megatron-core's uneven "
      "pipeline split: the first / last stage's layers, the rest even over the other stages; "
      "without them pp·vpp must divide the layers); --infer keys: tp, replicas, and ep (no "
      "value) for expert parallelism (EP = TP). Unset sizes are 1. Trainer ranks are GPUs "
      "0..T-1; engine (replica, tp rank) is "
      "GPU T + replica·tp + rank, or replica·tp + rank with --colocated.\n"
      "Output: a summary, or with --json the rlsched.v1.ReshardPlan without its transfers in "
      "protobuf's JSON mapping (proto field names; int64 values are strings). --plan-out "
      "writes the plan with every transfer in the same mapping; a FILE ending in .binpb "
      "gets the binary plan file of reshard.proto instead: a ReshardPlanIndex, then one "
      "ReshardRankPart per GPU, varint-delimited, so that an executor reads only its own "
      "GPU's transfers.\n"
      "Fields of rlsched.v1.ReshardRequest (the daemon's names): --model model_config_json (the "
      "file's text), --train train.* (first-stage-layers first_stage_layers, "
      "last-stage-layers last_stage_layers), --infer infer.tp, infer.replicas, ep "
      "infer.expert_parallel, --round-robin-experts infer.expert_placement ROUND_ROBIN, "
      "--colocated, --gpus-per-node, --intra-node-gb-per-s, --inter-node-gb-per-s topology.*, "
      "--bucket-mib bucket_bytes (× 2^20), --target-dtype target_dtype, --plan-out "
      "include_transfers.");

  command
      ->add_option("--model", args.model,
                   "The model's Hugging Face config.json, or its model folder (which holds "
                   "config.json): Llama, Qwen2/2.5, Qwen3, Qwen3-MoE, DeepSeek-V3")
      ->type_name("FILE|DIR")
      ->required();
  command
      ->add_option("--train", args.train,
                   fmt::format("The trainer's layout (Megatron-core's parallel sizes), e.g. "
                               "tp=8,pp=2,dp=4 or tp=2,pp=3,first-stage-layers=10: keys tp, pp, "
                               "vpp, ep, etp, cp, dp (each an {}; default 1) and "
                               "first-stage-layers, last-stage-layers (layers, each an {}; "
                               "default: an even split); '_' may replace '-' in a key",
                               IntegerRangeText(1, kMaxSize), IntegerRangeText(1, kMaxStageLayers)))
      ->type_name("K=V,...")
      ->required();
  command
      ->add_option("--infer", args.infer,
                   fmt::format("The engines' layout (vLLM), e.g. tp=4,replicas=16: keys tp (an "
                               "{}; default 1), replicas (an {}; default 1), and ep without a "
                               "value for expert parallelism (EP = TP)",
                               IntegerRangeText(1, kMaxSize), IntegerRangeText(1, kMaxReplicas)))
      ->type_name("K=V,...")
      ->required();
  AddReshardPlacementOptions(*command, args);
  command
      ->add_option("--plan-out", args.plan_out,
                   "Write the plan with every transfer to FILE: JSON, or with the extension "
                   ".binpb the binary plan file (an index, then each GPU's transfers)")
      ->type_name("FILE");
  command->add_flag("--verify", args.verify,
                    "Execute the plan on reference data and compare every engine tensor with "
                    "the vLLM layout built independently (small models only); prints the result "
                    "after the summary (on stderr with --json); exit status 1 if the plan is "
                    "wrong");
  command->add_flag("--json", args.json,
                    "Print the ReshardPlan (without transfers) as one line of JSON");
  return command;
}

void AddReshardPlacementOptions(CLI::App& command, ReshardArgs& args) {
  command.add_flag("--round-robin-experts", args.round_robin_experts,
                   "With ep in --infer: engine rank r holds experts r, r + tp, ... (default: "
                   "contiguous blocks)");
  command.add_flag("--colocated", args.colocated,
                   "The engines run on the trainer's GPUs (default: on separate GPUs)");
  const ReshardArgs defaults;
  AddBoundedOption(command, "--gpus-per-node", args.gpus_per_node,
                   "GPUs per node (field topology.gpus_per_node).", IntegerRange{1, kMaxSize},
                   fmt::format("{}", defaults.gpus_per_node))
      ->type_name("N");
  const std::string bandwidth = RealRangeText(0.0, kMaxGbPerS, /*min_open=*/true);
  AddBoundedOption(command, "--intra-node-gb-per-s", args.intra_node_gb_per_s,
                   "Intra-node bandwidth per GPU and direction, in GB/s (10^9 bytes "
                   "per second; field topology.intra_node_gb_per_s).",
                   RealRange{0.0, kMaxGbPerS, /*min_open=*/true},
                   fmt::format("{:g}", defaults.intra_node_gb_per_s))
      ->type_name("GB/S");
  AddBoundedOption(command, "--inter-node-gb-per-s", args.inter_node_gb_per_s,
                   "Inter-node (NIC) bandwidth per GPU and direction, in GB/s (10^9 "
                   "bytes per second; field topology.inter_node_gb_per_s).",
                   RealRange{0.0, kMaxGbPerS, /*min_open=*/true},
                   fmt::format("{:g}", defaults.inter_node_gb_per_s))
      ->type_name("GB/S");
  AddBoundedOption(command, "--bucket-mib,--bucket-mb", args.bucket_mb,
                   "Bytes a GPU may send, and receive, in one bucket, in MiB (2^20 "
                   "bytes; verl's update_weights_bucket_megabytes; field bucket_bytes "
                   "= MiB × 2^20).",
                   IntegerRange{1, kMaxBucketMiB}, fmt::format("{}", defaults.bucket_mb))
      ->type_name("MIB");
  command
      .add_option("--target-dtype", args.target_dtype,
                  "What the engines run: bf16 (the trainer's weights as they are) or fp8_block128 "
                  "(alias fp8: linear weights in fp8 e4m3 with a scale per 128 x 128 block, "
                  "quantised by the sender when a slice covers whole blocks); field target_dtype, "
                  "TARGET_DTYPE_BF16 or TARGET_DTYPE_FP8_BLOCK128 (default: bf16)")
      ->type_name("bf16|fp8_block128")
      ->check(CLI::IsMember({"bf16", "fp8_block128", "fp8"}).description(""));
}

v1::TrainLayout ParseTrainOption(std::string_view text) {
  constexpr std::string_view kOption = "--train";
  constexpr std::string_view kKeys =
      "tp, pp, vpp, ep, etp, cp, dp, first-stage-layers, last-stage-layers";
  v1::TrainLayout train;
  for (const Entry& entry : SplitEntries(kOption, text)) {
    if (entry.key == "first-stage-layers") {
      train.set_first_stage_layers(IntegerValue(kOption, entry, 1, kMaxStageLayers));
      continue;
    }
    if (entry.key == "last-stage-layers") {
      train.set_last_stage_layers(IntegerValue(kOption, entry, 1, kMaxStageLayers));
      continue;
    }
    void (v1::TrainLayout::*set)(std::int64_t) = nullptr;
    if (entry.key == "tp") set = &v1::TrainLayout::set_tp;
    if (entry.key == "pp") set = &v1::TrainLayout::set_pp;
    if (entry.key == "vpp") set = &v1::TrainLayout::set_vpp;
    if (entry.key == "ep") set = &v1::TrainLayout::set_ep;
    if (entry.key == "etp") set = &v1::TrainLayout::set_etp;
    if (entry.key == "cp") set = &v1::TrainLayout::set_cp;
    if (entry.key == "dp") set = &v1::TrainLayout::set_dp;
    if (set == nullptr) UnknownKey(kOption, entry.key, kKeys);
    (train.*set)(IntegerValue(kOption, entry, 1, kMaxSize));
  }
  return train;
}

v1::InferLayout ParseInferOption(std::string_view text) {
  constexpr std::string_view kOption = "--infer";
  constexpr std::string_view kKeys = "tp, replicas, ep";
  v1::InferLayout infer;
  for (const Entry& entry : SplitEntries(kOption, text)) {
    if (entry.key == "tp") {
      infer.set_tp(IntegerValue(kOption, entry, 1, kMaxSize));
    } else if (entry.key == "replicas") {
      infer.set_replicas(IntegerValue(kOption, entry, 1, kMaxReplicas));
    } else if (entry.key == "ep") {
      if (entry.value) {
        Fail(kOption,
             fmt::format("ep takes no value (it turns on expert parallelism, EP = TP), got 'ep={}'",
                         *entry.value));
      }
      infer.set_expert_parallel(true);
    } else {
      UnknownKey(kOption, entry.key, kKeys);
    }
  }
  return infer;
}

v1::ReshardRequest MakeReshardRequest(const ReshardArgs& args, std::string model_config_json) {
  v1::ReshardRequest request;
  request.set_model_config_json(std::move(model_config_json));
  *request.mutable_train() = ParseTrainOption(args.train);
  *request.mutable_infer() = ParseInferOption(args.infer);
  if (args.round_robin_experts) {
    if (!request.infer().expert_parallel()) {
      Fail("--round-robin-experts", "needs ep in --infer");
    }
    request.mutable_infer()->set_expert_placement(v1::EXPERT_PLACEMENT_ROUND_ROBIN);
  }
  v1::Topology* topology = request.mutable_topology();
  topology->set_colocated(args.colocated);
  topology->set_gpus_per_node(args.gpus_per_node);
  topology->set_intra_node_gb_per_s(args.intra_node_gb_per_s);
  topology->set_inter_node_gb_per_s(args.inter_node_gb_per_s);
  if (args.bucket_mb < 1 || args.bucket_mb > kMaxBucketMiB) {
    Fail("--bucket-mib",
         fmt::format("must be an {}, got {}", IntegerRangeText(1, kMaxBucketMiB), args.bucket_mb));
  }
  request.set_bucket_bytes(args.bucket_mb << 20);
  if (args.target_dtype == "fp8_block128" || args.target_dtype == "fp8") {
    request.set_target_dtype(v1::TARGET_DTYPE_FP8_BLOCK128);
  } else if (args.target_dtype == "bf16") {
    request.set_target_dtype(v1::TARGET_DTYPE_BF16);
  } else {
    Fail("--target-dtype",
         fmt::format("must be bf16 or fp8_block128 (alias fp8), got '{}'", args.target_dtype));
  }
  request.set_include_transfers(!args.plan_out.empty());
  return request;
}

void RunReshardCommand(const ReshardArgs& args, std::ostream& out, std::ostream& err) {
  const v1::ReshardRequest request = MakeReshardRequest(args, ReadModelConfig(args.model));
  const rollout::ModelConfig model = ParseModel(args, request);
  const rollout::ReshardOptions options = ToReshardOptions(request);
  if (args.verify) CheckVerifiable(model);

  const auto start = std::chrono::steady_clock::now();
  const rollout::ReshardPlan plan = [&] {
    try {
      return rollout::PlanReshard(model, options);
    } catch (const FieldError& e) {
      throw ToFlagError(e, WeightLayoutFlags(args.model));
    }
  }();
  const std::chrono::duration<double, std::milli> elapsed =
      std::chrono::steady_clock::now() - start;
  spdlog::info(
      "planned {} transfers in {} buckets in {:.1f} ms (estimate {:.6f} s, lower bound "
      "{:.6f} s)",
      plan.transfers.size(), plan.num_buckets, elapsed.count(), plan.estimate_seconds,
      plan.lower_bound_seconds);

  const v1::ReshardPlan summary = ToReshardPlanMessage(plan, /*include_transfers=*/false);
  if (!args.plan_out.empty()) {
    const auto write_start = std::chrono::steady_clock::now();
    WritePlanFile(args.plan_out, plan);
    const std::chrono::duration<double, std::milli> write_elapsed =
        std::chrono::steady_clock::now() - write_start;
    spdlog::info("wrote {} in {:.1f} ms", args.plan_out, write_elapsed.count());
  }
  if (args.json) {
    out << ToJson(summary) << '\n';
  } else {
    PrintPlanSummary(args, request, model, summary, out);
  }
  FlushOutput(out);
  if (args.verify) Verify(model, options, plan, args.json ? err : out);
}

}  // namespace rlsched::app
