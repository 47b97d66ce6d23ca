// rlsched/rollout/plan.h — the weight-resharding plan: which slices move from which
// trainer rank to which engine ranks, in which bucket, and what that costs.
//
// Overview
//   PlanReshard() matches every piece of every engine shard (layout.h) with the
//   trainer shards that hold it, chooses a sender among the ranks that hold it (DP
//   and CP replicas, both copies of a tied embedding) to balance the bytes on every
//   link, sends one broadcast per region to all engine replicas that need it (one
//   per node that holds a copy, over the intra-node links; one over the NICs for the
//   nodes that hold none), copies locally where a colocated engine rank already holds
//   the bytes, and packs the transfers into buckets so that no rank sends or receives
//   more than the budget in one bucket (a local copy counts as received, not sent).
//
//   Ranks are global GPU ids: trainer ranks 0..T-1; engine rank (replica, tp_rank)
//   is T + replica·TP + tp_rank on separate GPUs, replica·TP + tp_rank when
//   colocated. GPU g is on node g / gpus_per_node. Each GPU has an intra-node link
//   and a NIC, each full duplex. A transfer costs its bytes once on each link it
//   crosses (a broadcast: once out of the sender, once into each receiver).
//
//   With an fp8 target, the engines' linear weights are quantised in 128 x 128
//   blocks: by the sender when a transfer covers whole blocks of the engine tensor
//   (fp8 bytes + fp32 block scales cross the links), else by the engine after the
//   bf16 slices arrive. The naive method moves bf16 either way.
//
//   Cost: a bucket takes max over links of (its bytes on the link / bandwidth); the
//   estimate is the sum over buckets. The lower bound is the largest, over links and
//   over groups of ranks that hold the same data, of bytes that must cross them /
//   bandwidth. The naive method (gather every full tensor on trainer rank 0, then
//   broadcast it to every engine rank) is estimated with the same link model.
//
// Example
//   ReshardOptions o;
//   o.train = {.tp = 8, .pp = 2, .dp = 4};
//   o.infer = {.tp = 4, .replicas = 16};
//   o.topology.colocated = true;
//   ReshardPlan plan = PlanReshard(model, o);
//   // plan.transfers, plan.estimate_seconds, plan.lower_bound_seconds
//
// Complexity: O(P log P) for P transfers (before splitting into buckets), with
//   P about (engine pieces) x (trainer shards each overlaps). Memory O(P).
// Thread-safety: pure. Errors: std::invalid_argument naming the field.

#ifndef RLSCHED_ROLLOUT_PLAN_H_
#define RLSCHED_ROLLOUT_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "rlsched/rollout/layout.h"
#include "rlsched/rollout/model.h"

namespace rlsched::rollout {

struct Topology {
  bool colocated = false;
  std::int64_t gpus_per_node = 8;
  double intra_node_gb_per_s = 400.0;  // per GPU, each direction; GB = 1e9 bytes
  double inter_node_gb_per_s = 50.0;   // per GPU NIC, each direction
};

// What the engines run.
enum class TargetDtype {
  kBf16,         // the trainer's bf16, copied as is
  kFp8Block128,  // linear weights in fp8 (e4m3) with an fp32 scale per 128 x 128 block
};

// Where a transfer's bytes are quantised to fp8 (TargetDtype::kFp8Block128).
enum class Quantize {
  kNone,           // not quantised (bf16 target, or not a linear weight)
  kAtSender,       // the slice covers whole 128 x 128 blocks of the engine tensor: the
                   // sender quantises and sends 1 byte per element + 4 per block scale
  kAtDestination,  // blocks straddle the slice: bf16 is sent, and the engine rank
                   // quantises once every slice of the tensor has arrived
};

struct ReshardOptions {
  TrainLayout train;
  InferLayout infer;
  Topology topology;
  std::int64_t bucket_bytes = std::int64_t{512} << 20;  // per rank per bucket, each way
  TargetDtype target_dtype = TargetDtype::kBf16;
};

// [begin, end) along one dim.
struct Range {
  std::int64_t begin = 0;
  std::int64_t end = 0;
  friend bool operator==(const Range&, const Range&) = default;
};

struct Transfer {
  std::int64_t bucket = 0;
  std::int64_t src_rank = 0;
  std::int32_t src_param = 0;           // index into ReshardPlan::param_names
  std::vector<Range> src_slice;         // per dim of the source rank's local tensor
  std::vector<std::int64_t> dst_ranks;  // ascending; == {src_rank} for a local copy
  std::int32_t dst_param = 0;
  std::vector<Range> dst_slice;  // per dim of each destination's local tensor
  std::int64_t bytes = 0;        // of one copy (fp8 data + block scales when kAtSender)
  Quantize quantize = Quantize::kNone;
  bool local() const { return dst_ranks.size() == 1 && dst_ranks[0] == src_rank; }
};

// One direction of one GPU's link.
enum class LinkKind { kIntraOut, kIntraIn, kNicOut, kNicIn };

struct LinkLoad {
  std::int64_t rank = 0;
  LinkKind kind = LinkKind::kNicIn;
  std::int64_t bytes = 0;
  double seconds = 0.0;
};

struct ReshardPlan {
  // What the plan was made for (the layouts, topology, bucket budget and target
  // dtype), so that an executor can refuse it for another world before any byte moves:
  // two layouts of one world size can give slices of the same shapes.
  ReshardOptions options;
  std::vector<std::string> param_names;  // Megatron and vLLM names used by transfers
  std::vector<Transfer> transfers;       // by bucket, then in a fixed order
  std::int64_t num_buckets = 0;
  std::int64_t trainer_ranks = 0;
  std::int64_t engine_ranks = 0;
  std::int64_t bytes_received = 0;  // summed over destination ranks (local copies too)
  std::int64_t bytes_local = 0;     // of those, by local copies
  std::int64_t bytes_moved = 0;     // over non-local transfers (a broadcast counts once)
  double estimate_seconds = 0.0;
  double lower_bound_seconds = 0.0;
  double naive_seconds = 0.0;
  LinkLoad busiest_link;  // over the whole plan
  std::vector<double> bucket_seconds;
};

// The global GPU id of engine (replica, tp_rank).
std::int64_t EngineRank(const ReshardOptions& options, std::int64_t replica, std::int64_t tp_rank);

// The most transfers PlanReshard() plans, by EstimateTransfers(), checked before any
// layout is built: 2^23. Planning peaks at about 0.5-1 KB per transfer planned, and
// the estimate is an upper bound (measured: DeepSeek-V3 TP2 PP8 EP32 DP32 -> TP16 x 8
// with 1 MiB buckets estimates 6.7 M and plans 1.5 M transfers in 1.6 GB; Llama-3.1-70B
// TP8 PP2 DP4 -> TP4 x 16 colocated with 1 MiB buckets 2.5 M and 0.8 M in 0.4 GB).
inline constexpr std::int64_t kMaxPlanTransfers = std::int64_t{1} << 23;

// An upper estimate of the transfers PlanReshard(model, options) emits, from the
// model's sizes and the layouts alone (nothing is built): per full tensor the slices
// its trainer and engine splits cut it into, times the receiver groups of a slice
// (the transfers one region needs), plus the parts the bucket
// budget splits them into (each at least half the budget). Receiver groups: 2 on
// separate GPUs (the engines share at most one node with the trainer), else at most
// 2 per trainer copy of the slice + 1. Preconditions: the checks
// of Validate(model, train / infer). O(dense_layers) time, O(1) memory.
struct TransferEstimate {
  double slices = 0.0;        // regions of full tensors to deliver, summed over engine TP ranks
  double receivers = 0.0;     // transfers per region at most (receiver groups)
  double bucket_parts = 0.0;  // extra transfers from splitting at the bucket budget
  double transfers = 0.0;     // slices × receivers + bucket_parts
};
TransferEstimate EstimateTransfers(const ModelConfig& model, const ReshardOptions& options);

// Plans the resharding. Throws rlsched::FieldError naming the field for a layout
// that does not fit the model, a non-positive bandwidth or gpus_per_node, a bucket
// smaller than one row of some tensor (with an fp8 target: 128 rows) ("bucket_bytes"),
// or a plan whose EstimateTransfers() is above kMaxPlanTransfers (refused before
// planning, naming "bucket_bytes" when the budget's splitting makes most of the
// estimate, else "infer.replicas" or "config.num_hidden_layers", with the estimate).
ReshardPlan PlanReshard(const ModelConfig& model, const ReshardOptions& options);

}  // namespace rlsched::rollout

#endif  // RLSCHED_ROLLOUT_PLAN_H_
