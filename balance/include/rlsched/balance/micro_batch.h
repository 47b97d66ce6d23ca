// rlsched/balance/micro_batch.h — micro-batches under a hard token cap, and the
// whole training step planned at once.
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
//   PlanStep() plans a whole step from the global batch: sequences to ranks (the
//   balancer, on cost, and with p > 1 assignments that pack the longest sequences
//   together), then one micro-batch count for every rank, chosen to minimise the step
//   time, with every rank's micro-batches planned as above. No all-reduce, no
//   disagreement between ranks. Every rank holds at least as many sequences as the
//   count (the cheapest units move from the fullest ranks when an assignment falls
//   short), so no micro-batch is empty unless the input forces it; the plan counts
//   those it could not avoid. It also reports a lower bound on the step time, and the
//   step's sequence and token totals for a globally normalised loss.
//
//   Karmarkar-Karp on cost across ranks and into m = ceil(tokens / cap) micro-batches
//   per rank is one of PlanStep's candidates, used when it keeps the cap.
//
//   PlanBaseline() is the common recipe as verl runs it, for comparison (verl commit
//   b178a3cd56f58b2d502255daba591e92833930a7): the batch split across the ranks by
//   verl's Karmarkar-Karp with equal counts on verl's workload key 24576·L + L²
//   (RayPPOTrainer._balance_batch, calculate_workload), then per rank
//   min(sequences, ceil(tokens / cap)) micro-batches from the unpadded lengths (at least
//   the minimum), the max over the ranks rounded up to the multiple, filled by the same
//   Karmarkar-Karp on the same key and ordered as verl orders them
//   (rearrange_micro_batches). Nothing in it checks the cap: it can break it (8
//   sequences of 7 tokens under a cap of 8 give 7 micro-batches, one of 14;
//   workload::GrpoBatch(512, 8, 1) on 16 ranks under 32,768 gives 152 of 224). Its step time is
//   predicted with the options' cost model, as the plan's. It ignores groups and
//   equal_size; where verl would stop on an assertion (n not a multiple of the ranks,
//   a rank with fewer sequences than the count) it goes on, with ranks differing by one
//   sequence and empty micro-batches counted.
//
//   Padding: every length is first rounded up to a multiple of `pad_to_multiple_of`
//   (e.g. 2·CP·TP); tokens and costs count the padding.
//
// Example
//   rlsched::workload::SyntheticBatch batch = rlsched::workload::GrpoBatch(512, 8, /*seed=*/1);
//   rlsched::balance::StepOptions options;
//   options.num_ranks = 64;
//   options.micro_batch.max_tokens_per_micro_batch = 32768;
//   options.micro_batch.pipeline_stages = 4;
//   options.micro_batch.micro_batches_multiple_of = 4;
//   rlsched::balance::PlannedStep step =
//       rlsched::balance::PlanStep(batch.lengths, batch.groups, options);
//   // step.plan.ranks[r].micro_batches[j].indices: rank r's j-th micro-batch;
//   // step.plan.unpadded_tokens: the denominator of a token-mean loss over the step;
//   // step.baseline.cap_violations: the common recipe's micro-batches over the cap
//   (workload::GrpoBatch is in rlsched/common/workload.h; any lengths and group ids will do.)
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

// The most micro-batches (num_ranks × the per-rank count) that min_micro_batches and
// micro_batches_multiple_of may force on a step plan: 2^20 = 1,048,576. Beyond what the
// sequences need, a forced count only adds empty micro-batches, and every micro-batch of
// a plan is an object in the plan, in the daemon's reply and in its JSON (tens of
// bytes to ~2 KB each on the way out): 3 sequences with a multiple of 2^20 on 8 ranks
// used to take a minute and 12 GB. 2^20 is 4,096 micro-batches on each of 256 ranks,
// 1,024 on each of 1,024 ranks, far above any trainer's step. The count the sequences
// themselves need (their tokens over the cap; at most one micro-batch per sequence) is
// not limited by it: that is bounded by the input (kMaxItems). PlanStep() and
// PlanBaseline() refuse a request whose forced count exceeds it before they allocate
// anything for the plan.
inline constexpr std::int64_t kMaxForcedMicroBatches = std::int64_t{1} << 20;

struct StepOptions {
  std::int64_t num_ranks = 1;  // data-parallel ranks, in [1, kMaxParts]
  bool equal_size = false;     // equal sequence (or group) counts per rank
  bool keep_groups = false;    // a group's sequences on one rank; requires groups
  // PlanStep() also works out the common recipe's figures (PlannedStep::baseline); false
  // leaves them zero (the plan does not depend on them), about a quarter of the time.
  bool baseline = true;
  MicroBatchOptions micro_batch;
};

struct StepPlan {
  std::vector<RankPlan> ranks;
  std::int64_t num_micro_batches = 0;    // the same on every rank
  std::int64_t predicted_step_time = 0;  // max over ranks of RankPlan::time
  // No valid plan has a smaller step time; when this plan has no empty micro-batch,
  // no valid plan without one (a plan with empty micro-batches may be faster then).
  std::int64_t lower_bound = 0;
  // Micro-batches whose (padded) tokens exceed the cap: 0 for PlanStep's plan, counted
  // for the baseline.
  std::int64_t cap_violations = 0;
  std::int64_t overhead = 0;  // the per-micro-batch overhead used
  // For a loss that does not depend on the split: the step's sequences and tokens
  // (padded, and the sum of the lengths), to normalise a token-mean loss globally.
  std::int64_t sequences = 0;
  std::int64_t tokens = 0;
  std::int64_t unpadded_tokens = 0;
  // Micro-batches without a sequence, and ranks without one. PlanStep makes none
  // unless the input forces them: fewer sequences (whole groups) than ranks, or
  // min_micro_batches / micro_batches_multiple_of above what the ranks can fill.
  std::int64_t empty_micro_batches = 0;
  std::int64_t empty_ranks = 0;
  // Sequences above the cap, each alone in its micro-batch (OversizePolicy::kAlone);
  // their micro-batches are the only ones above the cap.
  std::int64_t oversized = 0;
};

struct PlannedStep {
  StepPlan plan;  // never breaks the cap (but for oversized sequences alone); cap_violations == 0
  // PlanBaseline() on the same input, for comparison (not used by `plan`): its figures
  // (count, predicted time, lower bound, cap violations, empty micro-batches, totals and
  // empty ranks), what a plan-step reply reports of it, without its ranks (`ranks`
  // empty: PlanBaseline() lists its micro-batches).
  StepPlan baseline;
};

// Plans a whole step (see the file comment). The plan never breaks the cap; without
// keep_groups its predicted time is within count_tolerance of Karmarkar-Karp on cost's
// (a candidate) when that keeps the cap and has no more empty micro-batches. The
// baseline is not a candidate: the plan does not depend on it.
// Preconditions: as PlanMicroBatches() and Balance() (groups); num_ranks ×
// RoundUp(min_micro_batches, micro_batches_multiple_of) <= kMaxForcedMicroBatches, else
// FieldError naming whichever of the two options drives the count, with the bound and
// the plan's micro-batch count estimated from the options and the tokens.
// Complexity: O(n log n) per micro-batch count tried (at most a few dozen), and
// O(num_ranks × count) for the plan itself.
PlannedStep PlanStep(std::span<const std::int64_t> lengths, std::span<const std::int64_t> groups,
                     const StepOptions& options);

// The common recipe as verl runs it (see the file comment); cap_violations counts its
// micro-batches above the cap; lower_bound as PlanStep's (a bound on plans under the
// cap: a baseline that breaks the cap may be below it). O(n log n + n·k log k) for the
// rank split and, per rank, O(n_r · min(n_r, m) · log m) for its micro-batches.
StepPlan PlanBaseline(std::span<const std::int64_t> lengths, const StepOptions& options);

}  // namespace rlsched::balance

#endif  // RLSCHED_BALANCE_MICRO_BATCH_H_
