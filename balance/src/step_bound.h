// The lower bound on a step's time (private header): no plan of the step, with any
// rank assignment and micro-batch count, is faster. See step_bound.cc.

#ifndef RLSCHED_BALANCE_SRC_STEP_BOUND_H_
#define RLSCHED_BALANCE_SRC_STEP_BOUND_H_

#include <cstdint>

#include "micro_batch_internal.h"
#include "rlsched/balance/plan_step.h"
#include "rlsched/balance/partition.h"

namespace rlsched::balance::internal {

// Whether the plans bounded may have micro-batches without a sequence.
enum class Empties { kAllowed, kNone };

struct StepBound {
  std::int64_t value = 0;  // no plan has a smaller step time
  std::int64_t count = 0;  // with p > 1, the bound's best micro-batch count (0: none)
};

// No plan with any rank assignment has a smaller step time (see TimeBound): the
// heaviest rank costs at least max(total / R, largest unit), and some micro-batch
// count m >= ceil(total tokens / R / cap) (honouring the minimum and the multiple)
// must be used; with Empties::kNone, also m <= floor(n / R) when the first count
// allows it (every rank then holds at least m sequences: the bound of plans without
// an empty micro-batch). TimeBound is convex in m, so the best m is next to the real
// minimiser. With p > 1 also the combined bound (step_bound.cc: every rank's cost,
// largest sequence and count together, over the `units` a rank assignment moves, with
// PartSizes::kEqual when every rank holds floor(U / R) or ceil(U / R) of the U units),
// whose best count is returned as a hint (0: none). Resolved options.
StepBound StepLowerBound(const Padded& padded, std::int64_t max_unit_cost, const UnitCosts& units,
                         PartSizes unit_counts, Empties empties, const StepOptions& options);

// The bound of plans that may split groups (the baseline's), equal sequence counts
// with PartSizes::kEqual.
std::int64_t UngroupedBound(const Padded& padded, PartSizes sequence_counts, Empties empties,
                            const StepOptions& options);

}  // namespace rlsched::balance::internal

#endif  // RLSCHED_BALANCE_SRC_STEP_BOUND_H_
