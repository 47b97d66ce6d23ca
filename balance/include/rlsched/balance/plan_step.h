// rlsched/balance/plan_step.h — the whole training step planned at once: the batch to
// the data-parallel ranks, then every rank's micro-batches under the cap
// (micro_batch.h), one count for all.
//
// Overview
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
//   (workload::GrpoBatch is in rlsched/workload/workload.h; any lengths and group ids will do.)
//
// Thread-safety: pure, single-threaded; concurrent calls are safe. Deterministic.

#ifndef RLSCHED_BALANCE_PLAN_STEP_H_
#define RLSCHED_BALANCE_PLAN_STEP_H_

#include <cstdint>
#include <span>
#include <vector>

#include "rlsched/balance/micro_batch.h"

namespace rlsched::balance {

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

#endif  // RLSCHED_BALANCE_PLAN_STEP_H_
