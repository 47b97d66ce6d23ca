// rlsched/balance/micro_batch.h — one rank's micro-batches under a hard token cap.
//
// Overview
//   A rank trains on its sequences in micro-batches. GPU memory bounds the tokens of
//   one micro-batch (`max_tokens_per_micro_batch`, a hard cap); pipeline parallelism
//   may require the count to be a multiple of its stage count; every rank must run
//   the same count. With micro-batch times t_i = cost_i + overhead and p pipeline
//   stages, a rank's time under the 1F1B schedule is
//
//       Σ t_i + (p − 1) · max t_i
//
//   and the step's time is the slowest rank's.
//
//   PlanMicroBatches() plans one rank: the smallest feasible count m (at least
//   ceil(tokens / cap), at least `min_micro_batches`, a multiple of
//   `micro_batches_multiple_of`, and a packing under the cap must exist: found by
//   Karmarkar-Karp on cost repaired under the cap, LPT on tokens, or first-fit
//   decreasing), then, when p > 1, a larger m if that lowers the rank's time by more
//   than `count_tolerance`, never more micro-batches than sequences (no empty
//   micro-batch unless the minimum or the multiple forces one). With p > 1 the cost is
//   balanced across the m micro-batches by the capped local search, which never breaks
//   the cap. With one pipeline stage a rank is packed for the cap alone (the first of
//   those constructions that keeps it, first-fit first, not refined): its time, its
//   cost plus m overheads, does not depend on the split.
//
//   Every micro-batch costs `overhead` (kernel launches, streaming the weights, the
//   framework's own work); unset, it is estimated from the cost model's shape (see
//   MicroBatchOverheadTokens in cost_model.h). With 0, the (p − 1)·max t_i term alone
//   would favour one sequence per micro-batch.
//
//   Padding: every length is first rounded up to a multiple of `pad_to_multiple_of`
//   (e.g. 2·CP·TP); tokens and costs count the padding.
//
//   The whole step (the batch to ranks, then each rank's micro-batches):
//   rlsched/balance/plan_step.h.
//
// Thread-safety: pure, single-threaded; concurrent calls are safe. Deterministic.

#ifndef RLSCHED_BALANCE_MICRO_BATCH_H_
#define RLSCHED_BALANCE_MICRO_BATCH_H_

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "rlsched/balance/cost_model.h"
#include "rlsched/balance/partition.h"

namespace rlsched::balance {

enum class MicroBatchOrder {
  kPipeline,       // light micro-batches at both ends, the heaviest in the middle
  kHeaviestFirst,  // by cost, descending
};

// What a sequence whose padded tokens exceed the cap does.
enum class OversizePolicy {
  kRaise,  // an error naming it (FieldError on lengths[i])
  kAlone,  // a micro-batch of its own (no other sequence with tokens beside it); it
           // counts as the cap's tokens while packing and at its own cost
};

struct MicroBatchOptions {
  // Hard cap on the (padded) tokens of one micro-batch, >= 1. A sequence longer than
  // the cap follows `oversize`.
  std::int64_t max_tokens_per_micro_batch = 0;
  OversizePolicy oversize = OversizePolicy::kRaise;
  std::int64_t min_micro_batches = 1;          // >= 1
  std::int64_t micro_batches_multiple_of = 1;  // >= 1, e.g. the pipeline-parallel size
  std::int64_t pad_to_multiple_of = 1;         // >= 1
  std::int64_t pipeline_stages = 1;            // p >= 1
  // Cost of one micro-batch launch (forward + backward) in cost units, >= 0. Unset:
  // cost.micro_batch_overhead(), an estimate from the model shape (cost_model.h:
  // about 190 tokens of linear work for a Llama-3.1-8B shape). 0 makes micro-batches
  // free, which no trainer's are.
  std::optional<std::int64_t> overhead;
  // The count is the smallest whose predicted time is within this fraction of the
  // best count's (among the counts tried), in [0, 1]: a micro-batch more must buy
  // more than this.
  double count_tolerance = 0.01;
  MicroBatchOrder order = MicroBatchOrder::kPipeline;
  CostModel cost = CostModel::Tokens();
  RefineOptions refine;
};

struct MicroBatch {
  std::vector<std::int64_t> indices;  // sequence indices, ascending
  std::int64_t tokens = 0;            // padded
  std::int64_t unpadded_tokens = 0;   // the sum of the sequences' lengths
  std::int64_t cost = 0;
};

struct RankPlan {
  std::vector<MicroBatch> micro_batches;  // in execution order
  std::int64_t sequences = 0;
  std::int64_t tokens = 0;  // padded
  std::int64_t unpadded_tokens = 0;
  std::int64_t cost = 0;
  std::int64_t time = 0;  // Σ (cost_i + overhead) + (p − 1) · max (cost_i + overhead)
};

// Plans the micro-batches of one rank (indices are positions in `lengths`).
// Preconditions (else std::invalid_argument naming the field and the bound): lengths
// as for Balance(); max_tokens_per_micro_batch >= 1 and no padded length above it unless
// oversize is kAlone;
// the other options as documented; totals fit in int64.
// Complexity: O(n log n) per micro-batch count tried, plus the refinement.
RankPlan PlanMicroBatches(std::span<const std::int64_t> lengths, const MicroBatchOptions& options);

}  // namespace rlsched::balance

#endif  // RLSCHED_BALANCE_MICRO_BATCH_H_
