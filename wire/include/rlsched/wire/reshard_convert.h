// reshard_convert.h — the weight-resharding planner behind its wire contract.
//
// Overview
//   Turns a rlsched.v1.ReshardRequest into a rollout::ModelConfig (the config.json
//   text parsed by rollout::ParseHfConfig()) and rollout::ReshardOptions, validating
//   every field against the bounds written in reshard.proto (0 means the documented
//   default), runs rollout::PlanReshard() and fills a rlsched.v1.ReshardPlan. The
//   command (`rlsched reshard`) and the daemon (`rlsched serve`) both answer through
//   these functions, so they cannot disagree. Nothing here opens files or logs; the
//   plan-file functions read and write the streams they are given.
//
//   Plan files (`rlsched reshard --plan-out`): WriteReshardPlanJson() streams the whole
//   plan as JSON, byte for byte the text of ToJson(ToReshardPlanMessage(plan, true))
//   without building that message or text (a plan of 10^6 transfers is ~0.3 GB of
//   JSON). WriteReshardPlanBinary() writes the binary plan file of reshard.proto
//   (ReshardPlanIndex, then one ReshardRankPart per GPU, varint-delimited);
//   ReadReshardPlanIndex() and ReadReshardRankPart() read it back, one GPU's part
//   without parsing the others, and RankPartTransfers() expands a part's transfers to
//   plain Transfer messages. ReshardRankParts builds the parts straight from the plan,
//   without a file (what `rlsched run` sends each worker): the file's writer encodes
//   the messages it builds, so a part built is the part read back from the file.
//
//   Errors are std::invalid_argument whose message starts with the request's field
//   path: "train.tp: must be in [0, 65536] (0 means 1), got -1",
//   "model_config_json: config.hidden_size: must be in [1, 2^31), got 0". The
//   planner's own checks (a layout that does not fit the model, the bucket budget)
//   already name fields of the same paths ("train.tp", "infer.tp", "bucket_bytes",
//   "topology.gpus_per_node") and pass through unchanged.
//
// Example
//   rlsched::v1::ReshardRequest request;
//   request.set_model_config_json(config_text);
//   request.mutable_train()->set_tp(8);
//   request.mutable_train()->set_pp(2);
//   request.mutable_train()->set_dp(4);
//   request.mutable_infer()->set_tp(4);
//   request.mutable_infer()->set_replicas(16);
//   request.mutable_topology()->set_colocated(true);
//   rlsched::v1::ReshardPlan plan = rlsched::wire::SolveReshard(request);
//   // plan.estimate_seconds(), plan.lower_bound_seconds(), plan.naive_seconds()
//
// Thread-safety: every function is pure (the plan-file functions touch only the
// streams they are given); concurrent calls on different streams are safe.

#ifndef RLSCHED_WIRE_RESHARD_CONVERT_H_
#define RLSCHED_WIRE_RESHARD_CONVERT_H_

#include <cstdint>
#include <istream>
#include <ostream>
#include <span>
#include <vector>

#include "rlsched/rollout/model.h"
#include "rlsched/rollout/plan.h"
#include "rlsched/v1/reshard.pb.h"

namespace rlsched::wire {

// The largest model_config_json accepted: 1 MiB.
inline constexpr std::int64_t kMaxModelConfigBytes = std::int64_t{1} << 20;
// The largest model planned: its tensors' bytes, estimated from the config's sizes,
// at most 2^42 (4.4 TB; DeepSeek-V3 in bf16 is 1.3 TB), so that the planner's byte
// counts (summed over up to 2^20 engine GPUs) stay far from int64's range.
inline constexpr double kMaxModelBytes = 4398046511104.0;  // 2^42
// At most this many layers × (routed experts + 1) (DeepSeek-V3: 61 × 257).
inline constexpr std::int64_t kMaxLayerExperts = std::int64_t{1} << 20;
// The default bucket budget (bucket_bytes = 0): 512 MiB.
inline constexpr std::int64_t kDefaultBucketBytes = std::int64_t{512} << 20;

// The model a request describes: model_config_json (at most kMaxModelConfigBytes)
// parsed by rollout::ParseHfConfig(), whose errors are prefixed with
// "model_config_json: " (e.g. "model_config_json: config: not valid JSON"). Also
// refuses a model above kMaxModelBytes or kMaxLayerExperts. O(config size).
rollout::ModelConfig ToModelConfig(const v1::ReshardRequest& request);

// The options a request asks for. Throws std::invalid_argument whose message starts
// with the proto field's path and states the bound. Checks: train.tp, pp, vpp, ep,
// etp, cp and dp each in [0, 65536] (0 means 1) with tp·cp·dp·pp at most 2^20;
// train.layers_per_chunk at most 2^20 entries, each in [0, 2^31);
// train.first_stage_layers and last_stage_layers, when set, in [1, 2^31); infer.tp in
// [0, 65536] and infer.replicas in [0, 2^20] (0 means 1) with tp·replicas at most
// 2^20; a known infer.expert_placement, round-robin only with expert_parallel;
// topology.gpus_per_node in [0, 65536] (0 means 8); the bandwidths finite and in
// [0, 1e6] GB/s (0 means 400 intra-node, 50 inter-node); bucket_bytes in [0, 2^40]
// (0 means 512 MiB); a known target_dtype (unset: bf16). What depends on the model
// (divisibility, the pipeline split — "train.pp: num_hidden_layers (28) must be divisible
// by pp·vpp (3), ..." — the widest row against the bucket) is checked by
// rollout::PlanReshard(). O(layers_per_chunk).
rollout::ReshardOptions ToReshardOptions(const v1::ReshardRequest& request);

// The plan as its wire message: every summary field, and the transfers (parameter
// names resolved through plan.param_names) when `include_transfers`. O(transfers).
v1::ReshardPlan ToReshardPlanMessage(const rollout::ReshardPlan& plan, bool include_transfers);

// Writes the plan with every transfer as JSON, then a newline: the same bytes as
// ToJson(ToReshardPlanMessage(plan, true)) + '\n' (protobuf's JSON mapping, proto field
// names, int64 values as strings), streamed through a small buffer. Throws
// std::runtime_error when `out` fails. O(transfers) time, O(param names) memory.
void WriteReshardPlanJson(const rollout::ReshardPlan& plan, std::ostream& out);

// The format_version of the binary plan files this code writes and reads.
inline constexpr std::int32_t kPlanFileFormatVersion = 1;

// Writes the binary plan file (reshard.proto, "The binary plan file"): a
// ReshardPlanIndex, then a ReshardRankPart for every GPU that sends or receives,
// ascending, each varint-delimited: ReshardRankParts' message for the GPU, serialised
// (GPUs with the same transfers share one copy). `out` must be seekable (a file or a
// string stream; the index, written first, is rewritten with the parts' offsets at
// the end) and positioned at the file's start. Throws std::runtime_error when `out`
// fails, std::invalid_argument for a plan ReshardRankParts refuses.
// O(transfers × GPUs per transfer) time; memory O(transfers) indices plus one part.
void WriteReshardPlanBinary(const rollout::ReshardPlan& plan, std::ostream& out);

// Every GPU's part of a plan (the ReshardRankPart of the binary plan file), built
// straight from the plan: Part(rank) equals what ReadReshardRankPart() reads back from
// WriteReshardPlanBinary()'s file for that rank, field for field (the writer encodes
// the messages this builds). Construction indexes the plan's transfers by GPU in one
// pass (O(transfers × GPUs per transfer)); then each part costs O(its size). Keeps a
// reference to `plan`, which must outlive it. Not safe for concurrent calls on one
// object (the parts' id tables are reused); distinct objects are independent.
//
//   ReshardRankParts parts(plan);
//   for (std::int64_t rank = 0; rank < parts.gpus(); ++rank) send(rank, parts.Part(rank));
class ReshardRankParts {
 public:
  // Throws std::runtime_error for a plan of 2^32 transfers or more, std::invalid_argument
  // naming the field for a transfer with a negative rank or a parameter out of
  // plan.param_names ("transfers[3].dst_ranks[1]: must be >= 0, got -2").
  explicit ReshardRankParts(const rollout::ReshardPlan& plan);

  // 1 + the largest GPU a transfer names (its sender or a receiver); 0 without transfers.
  std::int64_t gpus() const { return static_cast<std::int64_t>(start_.size()) - 1; }
  // The plan's indices of the transfers GPU `rank` sends or receives, ascending (empty
  // for a rank at or past gpus()). Throws std::invalid_argument for a negative rank.
  std::span<const std::uint32_t> TransfersOf(std::int64_t rank) const;

  // GPU `rank`'s part: its transfers in plan order, names and receiver sets by part-local
  // ids in order of first use. A GPU with no transfers (rank >= gpus() too) gets an
  // empty part. Throws std::invalid_argument for a negative rank. O(part size).
  v1::ReshardRankPart Part(std::int64_t rank);
  // The same, into `part` (cleared first; its memory is reused).
  void BuildPart(std::int64_t rank, v1::ReshardRankPart& part);

 private:
  std::int32_t NameId(std::int32_t name);
  std::int32_t GroupId(std::uint32_t group);

  const rollout::ReshardPlan& plan_;
  std::vector<std::size_t> start_;        // per GPU into transfers_; gpus() + 1 entries
  std::vector<std::uint32_t> transfers_;  // each GPU's transfers, ascending
  std::vector<std::uint32_t> group_of_;   // per transfer: its receiver set's plan-wide id
  std::vector<std::uint32_t> groups_;     // per receiver set: the first transfer with it
  // Scratch of BuildPart(): part-local ids (-1: unused) and what they stand for.
  std::vector<std::int32_t> name_ids_, group_ids_;
  std::vector<std::int32_t> names_used_;
  std::vector<std::uint32_t> groups_used_;
};

// GPU `rank`'s part of `plan`: ReshardRankParts(plan).Part(rank). O(transfers × GPUs per
// transfer); for several GPUs of one plan, build a ReshardRankParts once.
v1::ReshardRankPart ToReshardRankPart(const rollout::ReshardPlan& plan, std::int64_t rank);

// The index of a binary plan file: its first message (read from the stream's start).
// Throws std::runtime_error for a stream that is not a binary plan file of
// kPlanFileFormatVersion.
v1::ReshardPlanIndex ReadReshardPlanIndex(std::istream& in);

// GPU `rank`'s part of the binary plan file `in` whose index is `index`: seeks to it
// and parses it alone. A GPU with no part (no transfers) gets an empty part. Throws
// std::invalid_argument for a negative rank, std::runtime_error for a malformed file.
// O(part size + log GPUs).
v1::ReshardRankPart ReadReshardRankPart(std::istream& in, const v1::ReshardPlanIndex& index,
                                        std::int64_t rank);

// A part's transfers as plain Transfer messages (names and receivers resolved), in the
// part's order: equal to the plan's transfers that the part's GPU sends or receives.
// Throws std::runtime_error for an index out of the part's tables. O(part size).
std::vector<v1::Transfer> RankPartTransfers(const v1::ReshardRankPart& part);

// Validates `request` (ToModelConfig(), ToReshardOptions()), plans the resharding
// (rollout::PlanReshard()) and returns the plan, with the transfers only when
// request.include_transfers(). Throws std::invalid_argument naming the field for bad
// input. Deterministic. Complexity: that of rollout::PlanReshard().
v1::ReshardPlan SolveReshard(const v1::ReshardRequest& request);

}  // namespace rlsched::wire

#endif  // RLSCHED_WIRE_RESHARD_CONVERT_H_
