// Pieces shared by the micro-batch planner's sources (private header): the padded
// batch, one rank's sequences, packing them into micro-batches under the cap, the
// step-level helpers, and the units a rank assignment moves.
//
//   micro_batch.cc         one rank's micro-batches (PlanMicroBatches); padding,
//                          packing, ordering and timing a rank
//   step_bound.cc          the lower bound on the step time (step_bound.h)
//   rank_packer.cc         the long sequences packed onto few ranks (rank_packer.h,
//                          with segment_tree.h and fenwick_tree.h)
//   plan_step.cc           the whole step (PlanStep): candidate rank assignments; the
//                          step-level helpers declared here
//   step_baseline.cc       the common recipe as verl runs it (PlanBaseline, RecipePlan)
//   recipe_partition.cc    verl's Karmarkar-Karp and workload key (recipe_partition.h)

#ifndef RLSCHED_BALANCE_SRC_MICRO_BATCH_INTERNAL_H_
#define RLSCHED_BALANCE_SRC_MICRO_BATCH_INTERNAL_H_

#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "rlsched/balance/partition.h"
#include "rlsched/balance/plan_step.h"

namespace rlsched::balance::internal {

// At most this many micro-batch counts are tried above the smallest feasible one.
inline constexpr int kMaxCountsTried = 32;

inline std::int64_t CeilDiv(std::int64_t a, std::int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }
inline std::int64_t RoundUp(std::int64_t a, std::int64_t multiple) {
  return CeilDiv(a, multiple) * multiple;
}
inline std::int64_t RoundDown(std::int64_t a, std::int64_t multiple) {
  return a / multiple * multiple;
}

// Throws std::invalid_argument naming the field unless the options are as documented
// in micro_batch.h.
void CheckOptions(const MicroBatchOptions& options);
void CheckStepOptions(const StepOptions& options);

// The options with the overhead resolved (the cost model's estimate when unset).
MicroBatchOptions Resolved(const MicroBatchOptions& options);

// The overhead of resolved options.
inline std::int64_t Overhead(const MicroBatchOptions& options) { return *options.overhead; }

// The sequences of one rank, padded: `tokens` and `costs` by local index, `global`
// maps a local index to its sequence index.
struct RankItems {
  std::vector<std::int64_t> tokens;
  std::vector<std::int64_t> costs;
  std::vector<std::int64_t> global;
  std::int64_t total_tokens = 0;
  std::int64_t total_unpadded = 0;
  std::int64_t total_cost = 0;
};

// Padded lengths and their costs for the whole batch, checked against the cap, and
// their totals. Without padding and with the tokens' cost model (Pad()'s common case)
// `tokens` and `costs` are the lengths themselves (no copy of the batch); else they
// view storage of their own, which a move keeps (a copy would not: not copyable).
struct Padded {
  Padded() = default;
  Padded(const Padded&) = delete;
  Padded& operator=(const Padded&) = delete;
  Padded(Padded&&) = default;
  Padded& operator=(Padded&&) = default;

  std::span<const std::int64_t> lengths;  // unpadded
  std::span<const std::int64_t> tokens;
  std::span<const std::int64_t> costs;
  std::int64_t total_unpadded = 0;  // Σ lengths
  std::int64_t total_tokens = 0;    // Σ tokens
  std::int64_t total_cost = 0;      // Σ costs
  std::int64_t max_cost = 0;        // the largest cost (0 for no sequence)
  // Under OversizePolicy::kAlone: (sequence, its padded tokens above the cap) of each
  // sequence above the cap, ascending; `tokens` holds the cap for them (so that no
  // other tokens join them), `costs` their own cost. RestoreOversized() puts the
  // excess back into a plan's figures.
  std::vector<std::pair<std::int64_t, std::int64_t>> oversized;
  std::int64_t oversized_excess = 0;  // Σ of the excess

  // What `tokens` and `costs` view when they are not the lengths (else empty).
  std::vector<std::int64_t> token_storage;
  std::vector<std::int64_t> cost_storage;
};

// Checks and pads `lengths` (resolved options): std::invalid_argument when a length
// is out of range or above the cap once padded, or when totals overflow.
Padded Pad(std::span<const std::int64_t> lengths, const MicroBatchOptions& options);

// Adds each oversized sequence's excess (Padded::oversized) to the tokens of its
// micro-batch and of `rank`. O(indices · log oversized); nothing without oversized ones.
void RestoreOversized(const Padded& padded, RankPlan& rank);

// The sequences `indices` of the batch, in that order.
RankItems Gather(const Padded& padded, std::span<const std::int64_t> indices);

// Gather() of each rank: the same items, read in one pass over the batch in index
// order when every rank's indices ascend and no index is in two ranks (one Gather()
// per rank otherwise). O(n + Σ rank sizes), with reads in order instead of one at a
// random place per sequence and array.
// `rank_of`, when given (one entry per sequence), is the rank of every sequence (-1
// for none), which `ranks` must list ascending (not checked): the pass that finds it
// from `ranks` (and checks them) is then skipped. Each rank's list becomes its items'
// `global` (moved, not copied: the callers pass the lists they are done with).
std::vector<RankItems> GatherRanks(const Padded& padded,
                                   std::vector<std::vector<std::int64_t>> ranks,
                                   std::span<const std::int32_t> rank_of = {});

// First-fit decreasing on tokens into m bins of `cap` tokens; nullopt when an item
// fits in no bin. O(n log n + n log m).
std::optional<Assignment> FirstFitDecreasing(const RankItems& items, std::int64_t m,
                                             std::int64_t cap);
// The same, given HeaviestFirst(items.tokens).
std::optional<Assignment> FirstFitDecreasing(const RankItems& items, std::int64_t m,
                                             std::int64_t cap,
                                             std::span<const std::int32_t> by_tokens);

// Longest first onto the bin with the fewest tokens (ties: lowest bin): the assignment
// GreedyLptSorted(items.tokens, by_tokens, m, PartSizes::kAny) makes, with one sift
// down of a heap per item instead of a pop and a push; nullopt as soon as a bin goes
// over `cap` tokens (the greedy's packing breaks the cap). `by_tokens`:
// HeaviestFirst(items.tokens). O(n log m).
std::optional<Assignment> LptOnTokens(const RankItems& items, std::int64_t m,
                                      std::span<const std::int32_t> by_tokens, std::int64_t cap);

// Moves items out of bins over the cap (m bins, `cap` tokens) into the cheapest bins
// with room, largest items first; false when some bin stays over the cap.
// O(n log n + n log m).
bool Repair(const RankItems& items, std::int64_t m, std::int64_t cap, Assignment& assignment);
// The same, given HeaviestFirst(items.tokens).
bool Repair(const RankItems& items, std::int64_t m, std::int64_t cap,
            std::span<const std::int32_t> by_tokens, Assignment& assignment);

// With at least m items, no bin stays empty: an empty bin takes the item with the
// fewest tokens from the bin holding the most items (it can only lower that bin).
void FillEmptyBins(const RankItems& items, std::int64_t m, Assignment& assignment);

// What Pack() looks for: the packing of least cost in its most costly micro-batch
// (every construction tried, each refined), or the first packing found that keeps the
// cap (`extra`, then first-fit decreasing, Karmarkar-Karp repaired, longest first;
// not refined). Both find a packing for the same (items, m, cap): the second stops at
// the first construction of the first's that fits.
enum class PackGoal { kBalanced, kWithinCap };

// With one pipeline stage a rank's time is its cost plus m overheads, whatever the
// split of its cost: the planner packs for the cap alone (PackGoal::kWithinCap), which
// costs a fraction of the balanced packing. With more stages the split sets the
// pipeline's bubble, and the packing is balanced.
inline PackGoal PackGoalFor(const MicroBatchOptions& options) {
  return options.pipeline_stages == 1 ? PackGoal::kWithinCap : PackGoal::kBalanced;
}

// A packing of `items` into exactly m bins under the cap (with balanced cost for
// PackGoal::kBalanced), or nullopt if none of the constructions fits. `extra` is one
// more starting point (e.g. a packing found for fewer bins, which stays valid with
// empty bins added). With at least m items no bin is left empty. `by_tokens`, when
// given, is HeaviestFirst(items.tokens) (for callers that pack the same items again).
std::optional<Assignment> Pack(const RankItems& items, std::int64_t m, std::int64_t cap,
                               const RefineOptions& refine, const std::optional<Assignment>& extra,
                               PackGoal goal = PackGoal::kBalanced,
                               std::span<const std::int32_t> by_tokens = {});

// Σ (cost_i + overhead) + (p − 1) · max (cost_i + overhead) (resolved options).
std::int64_t RankTime(const std::vector<MicroBatch>& batches, const MicroBatchOptions& options);
// The same, given the micro-batches' costs.
std::int64_t RankTime(std::span<const std::int64_t> costs, const MicroBatchOptions& options);

// Builds the rank's micro-batches from a packing into m bins and orders them
// (options.order).
RankPlan MakeRankPlan(const Padded& padded, const RankItems& items, std::int64_t m,
                      const Assignment& assignment, const MicroBatchOptions& options);

// The smallest count allowed before feasibility: >= ceil(tokens / cap), >= the
// minimum, a multiple of the given value.
std::int64_t SmallestCount(std::int64_t total_tokens, const MicroBatchOptions& options);

// A lower bound on the time of any plan of one rank with m micro-batches, for a rank
// of total cost `rank_cost` whose largest sequence costs `max_item`: the micro-batch
// times add up to rank_cost + m·o, and the largest is at least
// max(rank_cost / m, max_item) + o.
double TimeBound(double rank_cost, double max_item, std::int64_t m,
                 const MicroBatchOptions& options);

// A rank's feasible packings, the smallest count first.
struct RankSearch {
  RankItems items;
  std::int64_t feasible_count = 0;    // smallest count with a packing found
  std::optional<Assignment> packing;  // that packing
};

// Martello and Toth's lower bound L2 on the bins of `cap` tokens that hold `tokens`,
// given their order heaviest first: for a threshold a <= cap / 2,
// the items above cap − a take a bin each, so do those in (cap / 2, cap − a] (no two
// share one), and the items in [a, cap / 2] fill at best the room the latter leave;
// the largest over the small items' sizes a. An item above cap counts as a bin of its
// own. O(n) after the sort.
std::int64_t BinsLowerBound(std::span<const std::int64_t> tokens,
                            std::span<const std::int32_t> heaviest_first, std::int64_t cap);

// A count Pack() packs (for PackGoalFor(options)), in steps of the multiple from
// `from`: `from` itself when it packs (most ranks); else, first-fit decreasing packing
// every count from the bins it uses on, the smallest reached going down from there while
// each next count still packs, never below BinsLowerBound(). (The smallest count any
// construction packs, unless one packs a count below a count none packs.)
RankSearch FindFeasible(RankItems items, std::int64_t from, const MicroBatchOptions& options);

// The smallest count whose time is within `tolerance` of the best of `tried`
// ((count, time) pairs).
std::int64_t SmallestWithin(const std::vector<std::pair<std::int64_t, std::int64_t>>& tried,
                            double tolerance);

// The padded tokens of the batch (padded.total_tokens).
inline std::int64_t TotalTokens(const Padded& padded) { return padded.total_tokens; }

// Micro-batches without a sequence.
std::int64_t EmptyMicroBatches(const StepPlan& plan);

// What RecipePlan() makes: the plan with its micro-batches (PlanBaseline()'s), or its
// figures alone (PlanStep()'s baseline, which its reply reports): the same count, step
// time, cap violations, empty micro-batches and empty ranks, without `ranks` (no
// sequence lists made, sorted or ordered).
enum class RecipeDetail { kMicroBatches, kFigures };

// The common recipe as verl runs it (step_baseline.cc): PlanBaseline() without the
// lower bound and the totals, on padded lengths (resolved options, those `padded` was
// made with).
StepPlan RecipePlan(const Padded& padded, const StepOptions& options,
                    RecipeDetail detail = RecipeDetail::kMicroBatches);
// The same, given RecipeAscending(padded.lengths, &sorted_length) (not checked).
StepPlan RecipePlan(const Padded& padded, const StepOptions& options,
                    std::span<const std::int32_t> ascending,
                    std::span<const std::int64_t> sorted_length,
                    RecipeDetail detail = RecipeDetail::kMicroBatches);

// Karmarkar-Karp on cost across ranks (equal counts), then per rank m = the largest
// SmallestCount() and Karmarkar-Karp on cost into m micro-batches, which may break the
// cap (counted in cap_violations): a candidate of PlanStep() when it keeps it.
StepPlan KarmarkarKarpOnCost(const Padded& padded, const StepOptions& options);

// Its two halves: the rank assignment with each rank's sequences gathered and the
// count m, then the plan at m.
struct OnCostRanks {
  std::vector<RankItems> items;
  std::int64_t count = 0;
};
OnCostRanks KarmarkarKarpOnCostRanks(const Padded& padded, const StepOptions& options);
StepPlan KarmarkarKarpOnCost(const Padded& padded, const StepOptions& options,
                             const OnCostRanks& ranks);

// Lower bounds on KarmarkarKarpOnCost()'s count and predicted step time, from its
// ranks (both exact with one pipeline stage: a rank's time is then its cost plus m
// overheads) or, with none given, from the batch alone; nullopt when planning it could
// overflow (RankTime would throw, so it must be planned to say so).
struct OnCostBound {
  std::int64_t count = 0;
  std::int64_t time = 0;
};
std::optional<OnCostBound> OnCostLowerBound(const Padded& padded, const StepOptions& options,
                                            const OnCostRanks* ranks);

// PlanStep() (Pruning::kBounds), or with every candidate planned that it skips by a
// bound (Pruning::kNone): the same plan, which tests check.
enum class Pruning { kBounds, kNone };
PlannedStep PlanStep(std::span<const std::int64_t> lengths, std::span<const std::int64_t> groups,
                     const StepOptions& options, Pruning pruning);

// The step's totals, empty ranks and overhead on a finished plan (its empty
// micro-batches are counted where it is made; a plan without ranks, the recipe's
// figures, its empty ranks too).
void SetTotals(const Padded& padded, const MicroBatchOptions& mb, StepPlan& plan);

// The units a rank assignment moves: one per sequence, or one per group (members in
// index order), with their cost and their largest sequence's cost.
struct Units {
  std::vector<std::vector<std::int64_t>> members;
  std::vector<std::int64_t> cost;
  std::vector<std::int64_t> largest;
};

// The costs of units alone (sequences: their costs twice).
struct UnitCosts {
  std::span<const std::int64_t> cost;
  std::span<const std::int64_t> largest;
};

}  // namespace rlsched::balance::internal

#endif  // RLSCHED_BALANCE_SRC_MICRO_BATCH_INTERNAL_H_
