// The whole step planned at once (PlanStep): candidate assignments of sequences to
// ranks (the balancer's, the long sequences packed together, a time-aware greedy,
// the whole batch packed first, and Karmarkar-Karp on cost), each planned at the
// micro-batch counts that may help, and the best kept.

#include "rlsched/balance/plan_step.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <numeric>
#include <optional>
#include <queue>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "internal.h"
#include "micro_batch_internal.h"
#include "rank_packer.h"
#include "recipe_partition.h"
#include "rlsched/balance/balance.h"
#include "rlsched/common/check.h"
#include "rlsched/common/error.h"
#include "step_bound.h"

namespace rlsched::balance {
namespace internal {

void CheckStepOptions(const StepOptions& options) {
  CheckInRange("num_ranks", options.num_ranks, 1, kMaxParts);
  CheckOptions(options.micro_batch);
  const MicroBatchOptions& mb = options.micro_batch;
  // The count the options force on every rank, whatever the sequences need: the
  // minimum rounded up to the multiple (<= 2^21 each, so no overflow below).
  const std::int64_t forced = RoundUp(mb.min_micro_batches, mb.micro_batches_multiple_of);
  if (forced > kMaxForcedMicroBatches / options.num_ranks) {
    // The option that drives the count: the multiple when it alone reaches the forced
    // count, else the minimum.
    const char* field = mb.micro_batches_multiple_of >= mb.min_micro_batches
                            ? "micro_batches_multiple_of"
                            : "min_micro_batches";
    rlsched::FailBound(field,
                       "such that num_ranks × the micro-batch count <= " +
                           std::to_string(kMaxForcedMicroBatches) + " (kMaxForcedMicroBatches)",
                       std::to_string(mb.micro_batches_multiple_of >= mb.min_micro_batches
                                          ? mb.micro_batches_multiple_of
                                          : mb.min_micro_batches) +
                           ", which makes at least " + std::to_string(options.num_ranks) + " × " +
                           std::to_string(forced) + " = " +
                           std::to_string(options.num_ranks * forced) + " micro-batches");
  }
}

std::int64_t EmptyMicroBatches(const StepPlan& plan) {
  std::int64_t empty = 0;
  for (const RankPlan& rank : plan.ranks) {
    for (const MicroBatch& b : rank.micro_batches) empty += b.indices.empty() ? 1 : 0;
  }
  return empty;
}

void SetTotals(const Padded& padded, const MicroBatchOptions& mb, StepPlan& plan) {
  plan.overhead = Overhead(mb);
  plan.sequences = static_cast<std::int64_t>(padded.tokens.size());
  plan.tokens = padded.total_tokens + padded.oversized_excess;
  plan.unpadded_tokens = padded.total_unpadded;
  plan.oversized = static_cast<std::int64_t>(padded.oversized.size());
  // A plan without ranks (the recipe's figures, RecipeDetail::kFigures) counted its own.
  if (plan.ranks.empty()) return;
  plan.empty_ranks = 0;
  for (const RankPlan& rank : plan.ranks) plan.empty_ranks += rank.sequences == 0 ? 1 : 0;
}

// Karmarkar-Karp on cost across ranks (equal counts), then per rank
// m = ceil(tokens / cap) (the max across ranks, with the minimum and the multiple) and
// Karmarkar-Karp on cost into m micro-batches, which may break the cap: a candidate
// when it keeps it. (It was PlanStep's baseline before the recipe as verl runs it,
// step_baseline.cc, replaced it there; it stays a candidate, so the plan is the same.)
OnCostRanks KarmarkarKarpOnCostRanks(const Padded& padded, const StepOptions& options) {
  const MicroBatchOptions& mb = options.micro_batch;
  // One rank takes everything (what Karmarkar-Karp into one part gives).
  const Partition ranks = MakePartition(
      padded.costs, options.num_ranks, PartSizes::kEqual,
      options.num_ranks == 1 ? Assignment(padded.costs.size(), 0)
                             : KarmarkarKarp(padded.costs, options.num_ranks, PartSizes::kEqual));
  OnCostRanks result;
  for (std::int64_t r = 0; r < options.num_ranks; ++r) {
    result.items.push_back(Gather(padded, ranks.part(r)));
    result.count = std::max(result.count, SmallestCount(result.items.back().total_tokens, mb));
  }
  return result;
}

StepPlan KarmarkarKarpOnCost(const Padded& padded, const StepOptions& options,
                             const OnCostRanks& ranks) {
  const MicroBatchOptions& mb = options.micro_batch;
  const std::int64_t m = ranks.count;
  StepPlan plan;
  plan.num_micro_batches = m;
  for (const RankItems& rank : ranks.items) {
    const Assignment assignment = internal::KarmarkarKarpSorted(
        rank.costs, internal::HeaviestFirst(rank.costs), m, PartSizes::kAny);
    plan.ranks.push_back(MakeRankPlan(padded, rank, m, assignment, mb));
    for (const MicroBatch& b : plan.ranks.back().micro_batches) {
      plan.cap_violations += b.tokens > mb.max_tokens_per_micro_batch ? 1 : 0;
    }
    plan.predicted_step_time = std::max(plan.predicted_step_time, plan.ranks.back().time);
  }
  plan.empty_micro_batches = EmptyMicroBatches(plan);
  return plan;
}

StepPlan KarmarkarKarpOnCost(const Padded& padded, const StepOptions& options) {
  return KarmarkarKarpOnCost(padded, options, KarmarkarKarpOnCostRanks(padded, options));
}

std::optional<OnCostBound> OnCostLowerBound(const Padded& padded, const StepOptions& options,
                                            const OnCostRanks* ranks) {
  const MicroBatchOptions& mb = options.micro_batch;
  __extension__ typedef __int128 Wide;
  const Wide p1 = mb.pipeline_stages - 1;
  const Wide o = Overhead(mb);
  const std::int64_t total_cost = padded.total_cost;
  // No rank time of the plan can overflow (RankTime would throw): its count is at most
  // the whole batch's, its cost at most the total.
  const Wide most = Wide{total_cost} + Wide{SmallestCount(TotalTokens(padded), mb)} * o +
                    p1 * (Wide{total_cost} + o);
  if (most > Wide{std::numeric_limits<std::int64_t>::max()}) return std::nullopt;
  // A rank's time is C + m·o + (p − 1)·(its heaviest micro-batch's cost + o), and that
  // micro-batch costs at least ceil(C / m) and its largest sequence.
  auto rank_bound = [&](std::int64_t cost, std::int64_t largest, std::int64_t m) {
    return static_cast<std::int64_t>(Wide{cost} + Wide{m} * o +
                                     p1 * (Wide{std::max(CeilDiv(cost, m), largest)} + o));
  };
  if (ranks == nullptr) {
    // Some rank costs at least the mean, and the count is at least the one for the
    // mean's tokens (the rank with the most tokens has at least the mean's).
    const std::int64_t m = SmallestCount(CeilDiv(TotalTokens(padded), options.num_ranks), mb);
    return OnCostBound{m, static_cast<std::int64_t>(Wide{CeilDiv(total_cost, options.num_ranks)} +
                                                    Wide{m} * o + p1 * o)};
  }
  OnCostBound bound{ranks->count, 0};
  for (const RankItems& rank : ranks->items) {
    const std::int64_t largest =
        rank.costs.empty() ? 0 : *std::max_element(rank.costs.begin(), rank.costs.end());
    bound.time = std::max(bound.time, rank_bound(rank.total_cost, largest, ranks->count));
  }
  return bound;
}

}  // namespace internal

namespace {

using internal::BalancedAssignment;
using internal::BalancedPartition;
using internal::CeilDiv;
using internal::CheckStepOptions;
using internal::Empties;
using internal::EmptyMicroBatches;
using internal::FillEmptyBins;
using internal::FindFeasible;
using internal::FirstFitDecreasing;
using internal::Gather;
using internal::GatherRanks;
using internal::HeaviestFirst;
using internal::kMaxCountsTried;
using internal::MakeRankPlan;
using internal::Overhead;
using internal::Pack;
using internal::PackedRanks;
using internal::PackGoalFor;
using internal::Pad;
using internal::Padded;
using internal::RankItems;
using internal::RankSearch;
using internal::RecipeAscendingFrom;
using internal::Resolved;
using internal::RoundDown;
using internal::RoundUp;
using internal::SetTotals;
using internal::SmallestCount;
using internal::SmallestWithin;
using internal::StepBound;
using internal::StepLowerBound;
using internal::TimeBound;
using internal::TotalTokens;
using internal::UngroupedBound;
using internal::Units;

// What a rank assignment moves: every sequence on its own, or a group's sequences
// together.
enum class Grouping { kSequences, kGroups };

// The units a rank assignment moves: one per sequence, or one per group (members in
// index order), with their cost and their largest sequence's cost.
Units MakeUnits(const Padded& padded, std::span<const std::int64_t> groups, Grouping grouping) {
  std::vector<std::vector<std::int64_t>> units;
  if (grouping == Grouping::kGroups) {
    std::vector<std::int64_t> by_group(groups.size());
    std::iota(by_group.begin(), by_group.end(), 0);
    std::stable_sort(by_group.begin(), by_group.end(), [&](std::int64_t a, std::int64_t b) {
      return groups[static_cast<std::size_t>(a)] < groups[static_cast<std::size_t>(b)];
    });
    for (std::size_t j = 0; j < by_group.size(); ++j) {
      const std::int64_t i = by_group[j];
      if (j == 0 || groups[static_cast<std::size_t>(i)] !=
                        groups[static_cast<std::size_t>(by_group[j - 1])]) {
        units.emplace_back();
      }
      units.back().push_back(i);
    }
  } else {
    for (std::size_t i = 0; i < padded.costs.size(); ++i) {
      units.push_back({static_cast<std::int64_t>(i)});
    }
  }
  std::vector<std::int64_t> unit_cost(units.size(), 0);
  std::vector<std::int64_t> unit_max(units.size(), 0);
  for (std::size_t u = 0; u < units.size(); ++u) {
    for (const std::int64_t i : units[u]) {
      unit_cost[u] += padded.costs[static_cast<std::size_t>(i)];
      unit_max[u] = std::max(unit_max[u], padded.costs[static_cast<std::size_t>(i)]);
    }
  }
  return {std::move(units), std::move(unit_cost), std::move(unit_max)};
}

// What an assignment of sequences to ranks may move: units (sequences, or whole
// groups when `group_of` holds the group of each sequence); none when the ranks' unit
// counts are fixed (equal counts).
struct Movable {
  std::span<const std::int64_t> group_of;
  bool fixed_counts = false;
};

// FillRanks's ranks: their units (sequences, or whole groups), cheapest first, built
// when a rank first gives one; the units each rank takes in.
class RankFill {
 public:
  RankFill(const Padded& padded, std::span<const std::int64_t> unit_of,
           std::vector<std::vector<std::int64_t>>& ranks)
      : padded_(padded),
        unit_of_(unit_of),
        ranks_(ranks),
        units_(ranks.size()),
        built_(ranks.size(), 0),
        next_(ranks.size(), 0),
        incoming_(ranks.size()) {}

  // Rank `r`'s cheapest unit not moved of at most `room` sequences (ties: first
  // sequence) moves to rank `d`; its size, or 0 when every unit is too large.
  std::int64_t Give(std::size_t r, std::size_t d, std::int64_t room) {
    std::vector<Unit>& list = UnitsOf(r);
    while (next_[r] < list.size() && list[next_[r]].moved) ++next_[r];
    for (std::size_t j = next_[r]; j < list.size(); ++j) {
      Unit& unit = list[j];
      if (unit.moved || static_cast<std::int64_t>(unit.members.size()) > room) continue;
      unit.moved = true;
      incoming_[d].insert(incoming_[d].end(), unit.members.begin(), unit.members.end());
      return static_cast<std::int64_t>(unit.members.size());
    }
    return 0;
  }

  // The ranks' lists after the moves, each ascending.
  void Finish() {
    for (std::size_t r = 0; r < ranks_.size(); ++r) {
      if (!built_[r] && incoming_[r].empty()) continue;
      std::vector<std::int64_t> kept;
      if (built_[r]) {
        for (const Unit& unit : units_[r]) {
          if (!unit.moved) kept.insert(kept.end(), unit.members.begin(), unit.members.end());
        }
      } else {
        kept = std::move(ranks_[r]);
      }
      kept.insert(kept.end(), incoming_[r].begin(), incoming_[r].end());
      std::sort(kept.begin(), kept.end());
      ranks_[r] = std::move(kept);
    }
  }

 private:
  struct Unit {
    std::int64_t cost = 0;
    std::vector<std::int64_t> members;  // ascending
    bool moved = false;
  };

  std::vector<Unit>& UnitsOf(std::size_t r) {
    std::vector<Unit>& list = units_[r];
    if (built_[r]) return list;
    built_[r] = 1;
    if (unit_of_.empty()) {
      for (const std::int64_t i : ranks_[r]) {
        list.push_back({padded_.costs[static_cast<std::size_t>(i)], {i}});
      }
    } else {
      std::vector<std::int64_t> by_group = ranks_[r];
      std::stable_sort(by_group.begin(), by_group.end(), [&](std::int64_t a, std::int64_t b) {
        return unit_of_[static_cast<std::size_t>(a)] < unit_of_[static_cast<std::size_t>(b)];
      });
      for (std::size_t j = 0; j < by_group.size(); ++j) {
        const std::size_t i = static_cast<std::size_t>(by_group[j]);
        if (j == 0 || unit_of_[i] != unit_of_[static_cast<std::size_t>(by_group[j - 1])]) {
          list.emplace_back();
        }
        list.back().cost += padded_.costs[i];
        list.back().members.push_back(by_group[j]);
      }
    }
    std::stable_sort(list.begin(), list.end(), [](const Unit& a, const Unit& b) {
      return std::tie(a.cost, a.members.front()) < std::tie(b.cost, b.members.front());
    });
    return list;
  }

  const Padded& padded_;
  std::span<const std::int64_t> unit_of_;
  std::vector<std::vector<std::int64_t>>& ranks_;
  std::vector<std::vector<Unit>> units_;
  std::vector<char> built_;
  std::vector<std::size_t> next_;  // per rank: the first unit not moved
  std::vector<std::vector<std::int64_t>> incoming_;
};

// Moves units (sequences; whole groups when `unit_of` holds the group of each
// sequence) so that every rank holds at least `target` sequences, as far as the batch
// allows: each rank short of it (lowest index first) takes the cheapest unit (ties:
// first sequence) of the rank holding the most sequences (ties: lowest index) that can
// give one and keep `target`. Moving the cheapest units off the fullest ranks changes
// the ranks' costs least. O(n log n + moves · log R).
void FillRanks(const Padded& padded, std::span<const std::int64_t> unit_of, std::int64_t target,
               std::vector<std::vector<std::int64_t>>& ranks) {
  const std::size_t num_ranks = ranks.size();
  std::vector<std::int64_t> count(num_ranks);
  bool short_rank = false;
  for (std::size_t r = 0; r < num_ranks; ++r) {
    count[r] = static_cast<std::int64_t>(ranks[r].size());
    short_rank = short_rank || count[r] < target;
  }
  if (!short_rank) return;
  RankFill fill(padded, unit_of, ranks);
  // Donors by sequence count (stale entries skipped); exhausted donors leave for good.
  std::priority_queue<std::pair<std::int64_t, std::int64_t>> donors;  // (count, −rank)
  for (std::size_t r = 0; r < num_ranks; ++r) {
    donors.emplace(count[r], -static_cast<std::int64_t>(r));
  }
  for (std::size_t d = 0; d < num_ranks; ++d) {
    std::vector<std::pair<std::int64_t, std::int64_t>> set_aside;  // d itself
    while (count[d] < target && !donors.empty()) {
      const auto [c, negative] = donors.top();
      donors.pop();
      const std::size_t r = static_cast<std::size_t>(-negative);
      if (c != count[r]) continue;  // stale
      if (r == d) {
        set_aside.emplace_back(c, negative);
        continue;
      }
      if (count[r] <= target) {  // no donor left with a sequence to spare
        donors.emplace(c, negative);
        break;
      }
      const std::int64_t size = fill.Give(r, d, count[r] - target);
      if (size == 0) continue;  // every unit too large: exhausted
      count[r] -= size;
      count[d] += size;
      donors.emplace(count[r], negative);
    }
    for (const auto& entry : set_aside) donors.push(entry);
    if (count[d] < target) {
      // Nothing left to give (the batch is short, or groups too large): stop.
      if (donors.empty() || donors.top().first <= target) break;
    }
  }
  fill.Finish();
}

// The best plan for a given assignment of sequences to ranks (rank r holds
// `ranks[r]`; `movable`: what FillRanks may move): every rank first filled to the smallest count
// (FillRanks), then the smallest count every rank can pack, then larger counts while
// the bound says they may help, never above the fewest sequences of a rank; of the
// counts tried, the smallest within the tolerance of the best. With only_count > 0,
// the ranks are filled to that count (as far as the batch allows) and the plan made
// at it alone (at most the fewest sequences of a rank, rounded to the multiple, unless
// the smallest feasible count is larger). Counts whose bound reaches stop_at (the best plan
// found elsewhere) are not planned; when no count can get below it, no plan is made
// and the result has predicted_step_time = INT64_MAX. A rank whose packing under the
// cap needs more micro-batches than another rank has sequences can still force empty
// ones (the plan counts them). `rank_of`, when given, is the rank of every sequence in
// `ranks` (each ascending), which spares the first gather finding it.
// PlanForRanks's ranks: their lists either in `ranks` (before a gather, after a take
// back) or in the searches' items (their `global`, the same lists), which hold them
// until taken back.
class RankLists {
 public:
  RankLists(const Padded& padded, std::vector<std::vector<std::int64_t>> ranks,
            std::span<const std::int32_t> rank_of, const MicroBatchOptions& mb)
      : padded_(padded), mb_(mb), ranks_(std::move(ranks)), rank_of_(rank_of) {}

  std::int64_t size() const { return static_cast<std::int64_t>(ranks_.size() + searches_.size()); }

  // The lists of the ranks back from the searches (for FillRanks, or a gather again).
  std::vector<std::vector<std::int64_t>>& TakeBack() {
    ranks_.resize(searches_.size());
    for (std::size_t r = 0; r < searches_.size(); ++r) {
      ranks_[r] = std::move(searches_[r].items.global);
    }
    searches_.clear();
    return ranks_;
  }

  // The ranks' sequences gathered, as the searches start from them. `rank_of` holds
  // while the ranks are the caller's (FillRanks has not moved any).
  void Gather() {
    if (!searches_.empty()) TakeBack();
    for (RankItems& items : GatherRanks(padded_, std::move(ranks_), rank_of_)) {
      searches_.push_back(RankSearch{std::move(items), 0, std::nullopt});
    }
    ranks_.clear();
    rank_of_ = {};
  }

  // Of the gathered ranks: the smallest count every one can pack.
  std::int64_t SmallestCount() const {
    std::int64_t from = 0;
    for (const RankSearch& search : searches_) {
      from = std::max(from, balance::internal::SmallestCount(search.items.total_tokens, mb_));
    }
    return from;
  }

  // The fewest sequences of a rank, wherever the lists are.
  std::int64_t Fewest() const {
    std::int64_t least = std::numeric_limits<std::int64_t>::max();
    for (const auto& rank : ranks_) {
      least = std::min(least, static_cast<std::int64_t>(rank.size()));
    }
    for (const RankSearch& search : searches_) {
      least = std::min(least, static_cast<std::int64_t>(search.items.global.size()));
    }
    return least;
  }

  // Whether no count from `start` on can give a plan below `stop_at`: a rank takes at
  // least C_r + (p − 1)·L_r + (start + p − 1)·o (see TimeBound).
  bool CannotReach(std::int64_t start, std::int64_t stop_at) const {
    if (stop_at == std::numeric_limits<std::int64_t>::max()) return false;
    const double p1 = static_cast<double>(mb_.pipeline_stages - 1);
    const double overheads = (static_cast<double>(start) + p1) * static_cast<double>(Overhead(mb_));
    double least = 0.0;
    for (const RankSearch& search : searches_) {
      least = std::max(least, static_cast<double>(search.items.total_cost) +
                                  p1 * LargestCost(search) + overheads);
    }
    return least >= static_cast<double>(stop_at);
  }

  // Every rank's smallest feasible count from `start`; the largest of them.
  std::int64_t FindFeasible(std::int64_t start) {
    std::int64_t m = start;
    for (RankSearch& search : searches_) {
      search = balance::internal::FindFeasible(std::move(search.items), start, mb_);
      m = std::max(m, search.feasible_count);
    }
    return m;
  }

  StepPlan PlanWith(std::int64_t count) const {
    StepPlan plan;
    plan.num_micro_batches = count;
    for (const RankSearch& search : searches_) {
      std::optional<Assignment> repacked;
      if (search.feasible_count != count) {
        repacked = Pack(search.items, count, mb_.max_tokens_per_micro_batch, mb_.refine,
                        search.packing, PackGoalFor(mb_));
      }
      const Assignment& packing = search.feasible_count == count ? *search.packing : *repacked;
      plan.ranks.push_back(MakeRankPlan(padded_, search.items, count, packing, mb_));
      plan.predicted_step_time = std::max(plan.predicted_step_time, plan.ranks.back().time);
    }
    plan.empty_micro_batches = EmptyMicroBatches(plan);
    return plan;
  }

  // No plan at `count` has a step time below this.
  double BoundWith(std::int64_t count) const {
    double bound = 0;
    for (const RankSearch& search : searches_) {
      bound = std::max(bound, TimeBound(static_cast<double>(search.items.total_cost),
                                        LargestCost(search), count, mb_));
    }
    return bound;
  }

 private:
  static double LargestCost(const RankSearch& search) {
    const auto& costs = search.items.costs;
    return costs.empty() ? 0.0 : static_cast<double>(*std::max_element(costs.begin(), costs.end()));
  }

  const Padded& padded_;
  const MicroBatchOptions& mb_;
  std::vector<std::vector<std::int64_t>> ranks_;
  std::span<const std::int32_t> rank_of_;
  std::vector<RankSearch> searches_;
};

// PlanForRanks's first count: the smallest every rank can pack, at least `desired`
// (only_count) where the batch has the sequences, the ranks filled (FillRanks) when they
// fall short; nullopt when no count can give a plan below `stop_at`.
std::optional<std::int64_t> FirstCount(const Padded& padded, RankLists& lists,
                                       const Movable& movable, const MicroBatchOptions& mb,
                                       std::int64_t desired, std::int64_t stop_at) {
  const std::int64_t q = mb.micro_batches_multiple_of;
  const std::int64_t num_ranks = lists.size();
  const auto n = static_cast<std::int64_t>(padded.tokens.size());
  // The most sequences every rank can hold, as a multiple of q (with fixed counts, what
  // the ranks hold).
  std::int64_t fillable = RoundDown(n / num_ranks, q);
  if (movable.fixed_counts) fillable = std::min(fillable, RoundDown(lists.Fewest(), q));
  for (int round = 0;; ++round) {
    lists.Gather();
    const std::int64_t from = lists.SmallestCount();
    // Every rank at least `target` sequences where the batch has them.
    const std::int64_t target = std::max(from, std::min(desired, fillable));
    if (lists.Fewest() < target && !movable.fixed_counts) {
      // When the batch cannot fill every rank to it: as evenly as it can.
      FillRanks(padded, movable.group_of, std::min(target, n / num_ranks), lists.TakeBack());
      lists.Gather();
      if (lists.SmallestCount() != from && round < 3) continue;  // the fill raised the count
    }
    const std::int64_t start = std::max(from, std::min(desired, RoundDown(lists.Fewest(), q)));
    if (lists.CannotReach(start, stop_at)) return std::nullopt;
    const std::int64_t m = lists.FindFeasible(start);
    // A packing needed more micro-batches than some rank has sequences: fill again.
    if (round < 3 && m > lists.Fewest() && lists.Fewest() < fillable && !movable.fixed_counts) {
      desired = std::max(desired, m);
      continue;
    }
    return m;
  }
}

StepPlan PlanForRanks(const Padded& padded, std::vector<std::vector<std::int64_t>> ranks,
                      const Movable& movable, const MicroBatchOptions& mb,
                      std::int64_t only_count = 0,
                      std::int64_t stop_at = std::numeric_limits<std::int64_t>::max(),
                      std::span<const std::int32_t> rank_of = {}) {
  const std::int64_t q = mb.micro_batches_multiple_of;
  RankLists lists(padded, std::move(ranks), rank_of, mb);
  const std::optional<std::int64_t> first =
      FirstCount(padded, lists, movable, mb, only_count > 0 ? RoundUp(only_count, q) : 0, stop_at);
  if (!first) {
    StepPlan none;
    none.predicted_step_time = std::numeric_limits<std::int64_t>::max();
    return none;
  }
  std::int64_t m = *first;
  if (only_count > 0) return lists.PlanWith(m);
  // Never more micro-batches than the fewest sequences of a rank.
  const std::int64_t last = std::max(m, RoundDown(lists.Fewest(), q));
  StepPlan best = lists.PlanWith(m);
  std::vector<std::pair<std::int64_t, std::int64_t>> tried{{m, best.predicted_step_time}};
  for (int counted = 0; counted < kMaxCountsTried && m + q <= last; ++counted) {
    m += q;
    const double bound = lists.BoundWith(m);
    if (bound >= static_cast<double>(best.predicted_step_time)) break;
    if (bound >= static_cast<double>(stop_at)) continue;  // a larger count may still beat it
    StepPlan plan = lists.PlanWith(m);
    tried.emplace_back(m, plan.predicted_step_time);
    if (plan.predicted_step_time < best.predicted_step_time) best = std::move(plan);
  }
  const std::int64_t chosen = SmallestWithin(tried, mb.count_tolerance);
  if (chosen != best.num_micro_batches) best = lists.PlanWith(chosen);
  return best;
}

std::vector<std::vector<std::int64_t>> PartsOf(const Partition& partition) {
  std::vector<std::vector<std::int64_t>> parts;
  for (std::int64_t r = 0; r < partition.num_parts(); ++r) {
    const auto part = partition.part(r);
    parts.emplace_back(part.begin(), part.end());
  }
  return parts;
}

// The sequences of each of `num_ranks` ranks, ascending, from the rank of every
// sequence: PartsOf(MakePartition(…, assignment)) without the Partition.
std::vector<std::vector<std::int64_t>> RanksOf(const Assignment& assignment,
                                               std::int64_t num_ranks) {
  std::vector<std::size_t> sizes(static_cast<std::size_t>(num_ranks), 0);
  for (const std::int32_t r : assignment) ++sizes[static_cast<std::size_t>(r)];
  std::vector<std::vector<std::int64_t>> ranks(static_cast<std::size_t>(num_ranks));
  for (std::size_t r = 0; r < ranks.size(); ++r) ranks[r].reserve(sizes[r]);
  for (std::size_t i = 0; i < assignment.size(); ++i) {
    ranks[static_cast<std::size_t>(assignment[i])].push_back(static_cast<std::int64_t>(i));
  }
  return ranks;
}

// Above this many (unit, rank) pairs the time-aware assignment is not tried.
constexpr std::int64_t kMaxGreedyPairs = 64'000'000;

// With a pipeline a rank's time also grows with its largest sequence:
// about C + (p − 1)·max(C / m, largest). This assigns the units (sequences, or whole
// groups) heaviest first to the rank whose estimate after it is least (ties: lowest rank),
// honouring equal counts, for the given m. A second candidate beside the balancer's
// cost-only assignment. O(units · ranks).
std::vector<std::vector<std::int64_t>> TimeAwareRanks(const Units& all, const StepOptions& options,
                                                      std::int64_t m) {
  const std::vector<std::vector<std::int64_t>>& units = all.members;
  const std::vector<std::int64_t>& unit_cost = all.cost;
  const std::vector<std::int64_t>& unit_max = all.largest;
  const std::vector<std::int32_t> order = internal::HeaviestFirst(unit_cost);

  const std::int64_t num_ranks = options.num_ranks;
  const std::int64_t num_units = static_cast<std::int64_t>(units.size());
  const std::int64_t floor = num_units / num_ranks;
  const std::int64_t extra = num_units % num_ranks;
  std::int64_t extra_used = 0;
  const double p = static_cast<double>(options.micro_batch.pipeline_stages);
  const double md = static_cast<double>(m);
  auto estimate = [&](double cost, double largest) {
    return cost + (p - 1.0) * std::max(cost / md, largest);
  };
  std::vector<double> cost(static_cast<std::size_t>(num_ranks), 0.0);
  std::vector<double> largest(static_cast<std::size_t>(num_ranks), 0.0);
  std::vector<std::int64_t> count(static_cast<std::size_t>(num_ranks), 0);
  std::vector<std::vector<std::int64_t>> ranks(static_cast<std::size_t>(num_ranks));
  for (const std::int32_t u : order) {
    const double c = static_cast<double>(unit_cost[static_cast<std::size_t>(u)]);
    const double a = static_cast<double>(unit_max[static_cast<std::size_t>(u)]);
    std::size_t best = 0;
    double best_estimate = 0.0;
    bool found = false;
    for (std::size_t r = 0; r < ranks.size(); ++r) {
      if (options.equal_size &&
          (count[r] == floor + 1 || (count[r] == floor && extra_used == extra))) {
        continue;  // full
      }
      const double after = estimate(cost[r] + c, std::max(largest[r], a));
      if (!found || after < best_estimate) {
        best = r;
        best_estimate = after;
        found = true;
      }
    }
    cost[best] += c;
    largest[best] = std::max(largest[best], a);
    if (++count[best] == floor + 1) ++extra_used;
    for (const std::int64_t i : units[static_cast<std::size_t>(u)]) ranks[best].push_back(i);
  }
  for (auto& rank : ranks) std::sort(rank.begin(), rank.end());
  return ranks;
}

// The long sequences packed together (PackedRanks; equal counts when asked) at count
// m: ranks holding several long sequences pay the bubble behind one of them, so the
// others can take more cost. Planned only when the packing's relaxed time (each rank's
// heaviest micro-batch at max(C_r / m, its largest sequence, the pigeonhole sums
// below), a bound on its plan before PlanForRanks fills its ranks to m sequences) is
// below `best`; nullopt otherwise. O(PackedRanks + one PlanForRanks count).
std::optional<StepPlan> PackedPlan(const Padded& padded, const Units& units, const Movable& movable,
                                   const StepOptions& options, std::int64_t bound, std::int64_t m,
                                   double best) {
  const MicroBatchOptions& mb = options.micro_batch;
  const double p1 = static_cast<double>(mb.pipeline_stages - 1);
  const double o = static_cast<double>(Overhead(mb));
  const double md = static_cast<double>(m);
  const double overheads = (md + p1) * o;
  double total = 0.0;
  for (const std::int64_t c : padded.costs) total += static_cast<double>(c);
  const double mean = total / static_cast<double>(options.num_ranks);
  // No packing's budget (the time less the overheads) is below the bound's.
  const double least = std::max(mean, static_cast<double>(bound) - overheads);
  const std::vector<std::vector<std::int64_t>> packed =
      PackedRanks(units, options.num_ranks, mb.pipeline_stages, m, least,
                  std::min(best, 4.0 * least), PartSizesFor(options.equal_size));
  if (packed.empty()) return std::nullopt;
  double relaxed = 0.0;
  std::vector<std::int64_t> costs;
  for (const auto& rank : packed) {
    costs.clear();
    for (const std::int64_t i : rank) costs.push_back(padded.costs[static_cast<std::size_t>(i)]);
    double cost = 0.0, largest = 0.0;
    for (const std::int64_t c : costs) {
      cost += static_cast<double>(c);
      largest = std::max(largest, static_cast<double>(c));
    }
    // k + 1 of the k·m + 1 largest sequences share a micro-batch.
    if (static_cast<std::int64_t>(costs.size()) > m) {
      std::sort(costs.begin(), costs.end(), std::greater<>());
      for (std::int64_t k = 1; k * m < static_cast<std::int64_t>(costs.size()); ++k) {
        double shared = 0.0;
        for (std::int64_t j = k * m - k; j <= k * m; ++j) {
          shared += static_cast<double>(costs[static_cast<std::size_t>(j)]);
        }
        largest = std::max(largest, shared);
      }
    }
    relaxed = std::max(relaxed, cost + p1 * std::max(cost / md, largest) + overheads);
  }
  if (relaxed >= best) return std::nullopt;
  return PlanForRanks(padded, packed, movable, mb, m);
}

// The fewest empty micro-batches of the candidates (INT64_MAX for none).
std::int64_t LeastEmpty(const std::vector<StepPlan>& candidates) {
  std::int64_t least = std::numeric_limits<std::int64_t>::max();
  for (const StepPlan& c : candidates) least = std::min(least, c.empty_micro_batches);
  return least;
}

// Of the candidate plans: the fewest empty micro-batches, then, of the plans within
// the count tolerance of the best time, the fewest micro-batches, then the best time
// (ties: the first candidate). Returns its index.
std::size_t ChosenIndex(const std::vector<StepPlan>& candidates, double tolerance) {
  const std::int64_t least_empty = LeastEmpty(candidates);
  std::int64_t best_time = std::numeric_limits<std::int64_t>::max();
  for (const StepPlan& c : candidates) {
    if (c.empty_micro_batches == least_empty)
      best_time = std::min(best_time, c.predicted_step_time);
  }
  const long double limit = static_cast<long double>(best_time) * (1.0L + tolerance);
  std::size_t chosen = candidates.size();
  for (std::size_t j = 0; j < candidates.size(); ++j) {
    const StepPlan& c = candidates[j];
    if (c.empty_micro_batches != least_empty ||
        static_cast<long double>(c.predicted_step_time) > limit) {
      continue;
    }
    if (chosen == candidates.size() || std::tie(c.num_micro_batches, c.predicted_step_time) <
                                           std::tie(candidates[chosen].num_micro_batches,
                                                    candidates[chosen].predicted_step_time)) {
      chosen = j;
    }
  }
  return chosen;
}

StepPlan Choose(std::vector<StepPlan> candidates, double tolerance) {
  return std::move(candidates[ChosenIndex(candidates, tolerance)]);
}

// Whether one more candidate, appended to `candidates`, with at least `count`
// micro-batches and a predicted time of at least `time`, leaves the plan unchanged,
// whatever its empty micro-batches and cap violations: a candidate without empty
// micro-batches exists (the new one cannot lower the fewest, nor call for the
// bins-first plan), the best time of those is at most `time` (the new one cannot
// lower it, so the tolerance's limit stays), and the chosen one's (count, time) is at
// most (count, time) (the new one cannot beat it: Choose takes a strictly smaller pair,
// and the first on ties).
bool CannotChangeTheChoice(const std::vector<StepPlan>& candidates, std::int64_t count,
                           std::int64_t time, double tolerance) {
  if (candidates.empty() || LeastEmpty(candidates) > 0) return false;
  std::int64_t best_time = std::numeric_limits<std::int64_t>::max();
  for (const StepPlan& c : candidates) {
    if (c.empty_micro_batches == 0) best_time = std::min(best_time, c.predicted_step_time);
  }
  if (best_time > time) return false;
  const StepPlan& chosen = candidates[ChosenIndex(candidates, tolerance)];
  return std::tie(chosen.num_micro_batches, chosen.predicted_step_time) <= std::tie(count, time);
}

// Above this many (sequence, micro-batch) pairs the bins-first candidate is not tried.
constexpr std::int64_t kMaxBinPairs = 20'000'000;

// Bins first: the whole batch packed first-fit decreasing into R·m micro-batches under
// the cap (every one non-empty), then m of them dealt to each rank, the costliest
// first onto the cheapest rank with a place left (ties: lowest rank), each rank's then
// rebalanced by Pack. For the smallest count m from the tokens' (a multiple of q) that
// packs, while R·m <= n: a plan without empty micro-batches where a rank assignment
// made one rank's packing need more micro-batches than another rank has sequences.
// Not for whole groups or equal counts. nullopt when no count up to 8 tries packs.
// O(tries · n · R·m + R²·m).
std::optional<StepPlan> BinsFirstPlan(const Padded& padded, const StepOptions& options) {
  const MicroBatchOptions& mb = options.micro_batch;
  const std::int64_t num_ranks = options.num_ranks;
  const auto n = static_cast<std::int64_t>(padded.tokens.size());
  std::vector<std::int64_t> all(padded.tokens.size());
  std::iota(all.begin(), all.end(), 0);
  const RankItems items = Gather(padded, all);
  std::int64_t m = SmallestCount(CeilDiv(items.total_tokens, num_ranks), mb);
  for (int tries = 0; tries < 8 && num_ranks * m <= n; ++tries, m += mb.micro_batches_multiple_of) {
    const std::int64_t bins = num_ranks * m;
    if (n > kMaxBinPairs / bins) return std::nullopt;
    std::optional<Assignment> packing =
        FirstFitDecreasing(items, bins, mb.max_tokens_per_micro_batch);
    if (!packing) continue;
    FillEmptyBins(items, bins, *packing);
    std::vector<std::int64_t> bin_cost(static_cast<std::size_t>(bins), 0);
    for (std::size_t i = 0; i < packing->size(); ++i) {
      bin_cost[static_cast<std::size_t>((*packing)[i])] += items.costs[i];
    }
    std::vector<std::int64_t> order(static_cast<std::size_t>(bins));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
      return bin_cost[static_cast<std::size_t>(a)] > bin_cost[static_cast<std::size_t>(b)];
    });
    std::vector<std::int64_t> load(static_cast<std::size_t>(num_ranks), 0);
    std::vector<std::int64_t> placed(static_cast<std::size_t>(num_ranks), 0);
    std::vector<std::int64_t> rank_of(static_cast<std::size_t>(bins), 0);
    std::vector<std::int64_t> slot_of(static_cast<std::size_t>(bins), 0);
    for (const std::int64_t b : order) {
      std::size_t best = 0;
      bool found = false;
      for (std::size_t r = 0; r < load.size(); ++r) {
        if (placed[r] == m) continue;
        if (!found || load[r] < load[best]) {
          best = r;
          found = true;
        }
      }
      rank_of[static_cast<std::size_t>(b)] = static_cast<std::int64_t>(best);
      slot_of[static_cast<std::size_t>(b)] = placed[best]++;
      load[best] += bin_cost[static_cast<std::size_t>(b)];
    }
    std::vector<std::vector<std::int64_t>> ranks(static_cast<std::size_t>(num_ranks));
    for (std::size_t i = 0; i < packing->size(); ++i) {
      ranks[static_cast<std::size_t>(rank_of[static_cast<std::size_t>((*packing)[i])])].push_back(
          static_cast<std::int64_t>(i));
    }
    StepPlan plan;
    plan.num_micro_batches = m;
    for (const auto& rank : ranks) {
      const RankItems mine = Gather(padded, rank);  // ascending, as `rank`
      Assignment start(rank.size());
      for (std::size_t j = 0; j < rank.size(); ++j) {
        start[j] = static_cast<std::int32_t>(
            slot_of[static_cast<std::size_t>((*packing)[static_cast<std::size_t>(rank[j])])]);
      }
      const std::optional<Assignment> refined =
          Pack(mine, m, mb.max_tokens_per_micro_batch, mb.refine, start, PackGoalFor(mb));
      plan.ranks.push_back(MakeRankPlan(padded, mine, m, *refined, mb));
      plan.predicted_step_time = std::max(plan.predicted_step_time, plan.ranks.back().time);
    }
    plan.empty_micro_batches = EmptyMicroBatches(plan);
    return plan;
  }
  return std::nullopt;
}

// The common recipe's figures alone, for comparison (it ignores groups): what the reply
// reports of it (PlannedStep::baseline). `bound`: the plan's bound without empty
// micro-batches, the baseline's too without groups or empty micro-batches.
StepPlan BaselineFigures(const Padded& padded, const StepOptions& options, std::int64_t bound,
                         bool shared_sort, std::vector<std::int32_t> recipe_ascending,
                         std::vector<std::int64_t> recipe_sorted) {
  StepPlan baseline = shared_sort
                          ? internal::RecipePlan(padded, options, recipe_ascending, recipe_sorted,
                                                 internal::RecipeDetail::kFigures)
                          : internal::RecipePlan(padded, options, internal::RecipeDetail::kFigures);
  const Empties empties = baseline.empty_micro_batches > 0 ? Empties::kAllowed : Empties::kNone;
  baseline.lower_bound = options.keep_groups || empties == Empties::kAllowed
                             ? UngroupedBound(padded, PartSizes::kAny, empties, options)
                             : bound;
  SetTotals(padded, options.micro_batch, baseline);
  return baseline;
}

}  // namespace

PlannedStep PlanStep(std::span<const std::int64_t> lengths, std::span<const std::int64_t> groups,
                     const StepOptions& unresolved) {
  return internal::PlanStep(lengths, groups, unresolved, internal::Pruning::kBounds);
}

namespace internal {

namespace {

// The balancer's split of the sequences to ranks, and the common recipe's sort of the
// batch when the balancer's can serve it too.
struct BalancedSplit {
  std::vector<std::vector<std::int64_t>> ranks;
  Assignment assignment;          // the rank of every sequence in `ranks` (no groups)
  std::int64_t groups_bound = 0;  // with whole groups: the balancer's bound over groups
  // The recipe's order of the batch when the balancer's sort gave it (else empty).
  std::vector<std::int32_t> recipe_ascending;
  std::vector<std::int64_t> recipe_sorted;
  bool shared_sort = false;
};

// Sequences to ranks: the balancer on the padded lengths' cost (Balance()'s partition of
// padded.tokens, whose costs Pad() made). The common recipe, for comparison (it ignores
// groups), sorts the unpadded lengths: when the costs are those lengths (the tokens' cost
// model without padding) one sort serves both.
BalancedSplit SplitToRanks(const Padded& padded, std::span<const std::int64_t> groups,
                           const StepOptions& options) {
  const MicroBatchOptions& mb = options.micro_batch;
  BalanceOptions balance;
  balance.partition.num_parts = options.num_ranks;
  balance.partition.equal_size = options.equal_size;
  balance.partition.refine = mb.refine;
  balance.cost = mb.cost;
  balance.keep_groups = options.keep_groups;
  BalancedSplit split;
  if (options.keep_groups) {
    const Partition partition =
        BalancedPartition(padded.tokens, padded.costs, groups, balance, {}, {});
    split.groups_bound = partition.lower_bound;
    split.ranks = PartsOf(partition);
    return split;
  }
  std::vector<std::int64_t> sorted;
  std::vector<std::int32_t> order = HeaviestFirst(padded.costs, &sorted);
  split.assignment =
      BalancedAssignment(padded.tokens, padded.costs, groups, balance, order, sorted);
  split.ranks = RanksOf(split.assignment, options.num_ranks);
  if (options.baseline && std::equal(padded.costs.begin(), padded.costs.end(),
                                     padded.lengths.begin(), padded.lengths.end())) {
    split.recipe_ascending = RecipeAscendingFrom(std::move(order), sorted);
    split.recipe_sorted = std::move(sorted);
    split.shared_sort = true;
  }
  return split;
}

// Every candidate planned is kept: Choose may prefer one with fewer micro-batches within
// the count tolerance of the best. Candidates that cannot beat the best are not planned
// (PlanForRanks's stop_at), which keeps large inputs fast.
struct Candidates {
  std::vector<StepPlan> plans;
  std::int64_t best = std::numeric_limits<std::int64_t>::max();

  void Take(StepPlan plan) {
    if (plan.ranks.empty()) return;  // pruned
    best = std::min(best, plan.predicted_step_time);
    plans.push_back(std::move(plan));
  }
};

// The balancer's assignment and, with a pipeline, the packed and time-aware ones.
void PlanAssignments(const Padded& padded, const Units& units, const Movable& movable,
                     const StepOptions& options, const StepBound& bound, BalancedSplit& split,
                     std::int64_t num_units, Candidates& candidates) {
  const MicroBatchOptions& mb = options.micro_batch;
  const bool pipeline = mb.pipeline_stages > 1 && num_units * options.num_ranks <= kMaxGreedyPairs;
  // With a pipeline the packed candidate comes first at the bound's best count (the
  // most micro-batches the ranks can fill without an overhead): the other candidates
  // then skip the counts, or whole plans, that cannot come near it (see PlanForRanks).
  const bool packed_first = pipeline && bound.count > 0;
  if (packed_first) {
    if (auto packed = PackedPlan(padded, units, movable, options, bound.value, bound.count,
                                 std::numeric_limits<double>::infinity())) {
      candidates.Take(std::move(*packed));
    }
  }
  // The balancer's assignment (not planned when it cannot come near the packed one).
  StepPlan balanced = PlanForRanks(padded, std::move(split.ranks), movable, mb, 0, candidates.best,
                                   split.assignment);
  split.assignment = Assignment();  // released (`= {}` would keep the storage)
  const std::int64_t m0 =
      balanced.ranks.empty()
          ? std::max(bound.count,
                     SmallestCount(CeilDiv(TotalTokens(padded), options.num_ranks), mb))
          : balanced.num_micro_batches;
  candidates.Take(std::move(balanced));
  if (!pipeline) return;
  // Else the packed candidate at the balancer's count.
  if (!packed_first) {
    if (auto packed = PackedPlan(padded, units, movable, options, bound.value, m0,
                                 static_cast<double>(candidates.best))) {
      candidates.Take(std::move(*packed));
    }
  }
  // And the time-aware assignment for the balancer's count.
  candidates.Take(
      PlanForRanks(padded, TimeAwareRanks(units, options, m0), movable, mb, 0, candidates.best));
}

// Karmarkar-Karp on cost is a valid answer when it keeps the cap (it ignores groups).
// Planned only when it could change the plan (CannotChangeTheChoice): its bounds from
// the batch, then from its ranks (exact with one pipeline stage), come first.
void PlanOnCost(const Padded& padded, const StepOptions& options, Pruning pruning,
                Candidates& candidates) {
  auto may_change = [&](const OnCostRanks* on_cost_ranks) {
    if (pruning == Pruning::kNone) return true;
    const auto least = OnCostLowerBound(padded, options, on_cost_ranks);
    return !least || !CannotChangeTheChoice(candidates.plans, least->count, least->time,
                                            options.micro_batch.count_tolerance);
  };
  if (!may_change(nullptr)) return;
  const OnCostRanks on_cost_ranks = KarmarkarKarpOnCostRanks(padded, options);
  if (!may_change(&on_cost_ranks)) return;
  StepPlan on_cost = KarmarkarKarpOnCost(padded, options, on_cost_ranks);
  if (on_cost.cap_violations == 0) candidates.plans.push_back(std::move(on_cost));
}

}  // namespace

PlannedStep PlanStep(std::span<const std::int64_t> lengths, std::span<const std::int64_t> groups,
                     const StepOptions& unresolved, Pruning pruning) {
  CheckStepOptions(unresolved);
  StepOptions options = unresolved;
  options.micro_batch = Resolved(unresolved.micro_batch);
  const MicroBatchOptions& mb = options.micro_batch;
  const Padded padded = Pad(lengths, mb);
  const Movable movable{options.keep_groups ? groups : std::span<const std::int64_t>{},
                        options.equal_size};
  BalancedSplit split = SplitToRanks(padded, groups, options);

  // The lower bound first: its best count guides the packed candidate. With whole groups
  // the heaviest rank holds at least the balancer's bound over groups. With a pipeline
  // the bound also knows the units (whole groups) and equal counts.
  const Units units = mb.pipeline_stages > 1 ? MakeUnits(padded, groups,
                                                         options.keep_groups ? Grouping::kGroups
                                                                             : Grouping::kSequences)
                                             : Units{};
  // The bound of plans without an empty micro-batch, what the planner makes unless the
  // input forces one (then the bound is taken again, allowing them).
  auto bound_of = [&](Empties empties) {
    return StepLowerBound(padded, split.groups_bound, {units.cost, units.largest},
                          PartSizesFor(options.equal_size), empties, options);
  };
  const StepBound bound = bound_of(Empties::kNone);

  Candidates candidates;
  PlanAssignments(padded, units, movable, options, bound, split,
                  static_cast<std::int64_t>(lengths.size()), candidates);
  PlannedStep result;
  if (options.baseline) {
    result.baseline =
        BaselineFigures(padded, options, bound.value, split.shared_sort,
                        std::move(split.recipe_ascending), std::move(split.recipe_sorted));
  }
  if (!options.keep_groups) PlanOnCost(padded, options, pruning, candidates);
  // Empty micro-batches left by every candidate: try the bins-first assignment.
  if (LeastEmpty(candidates.plans) > 0 && !options.keep_groups && !options.equal_size) {
    if (auto bins_first = BinsFirstPlan(padded, options))
      candidates.plans.push_back(std::move(*bins_first));
  }
  result.plan = Choose(std::move(candidates.plans), mb.count_tolerance);
  result.plan.lower_bound =
      result.plan.empty_micro_batches > 0 ? bound_of(Empties::kAllowed).value : bound.value;
  result.plan.cap_violations = 0;
  for (RankPlan& rank : result.plan.ranks) RestoreOversized(padded, rank);
  SetTotals(padded, mb, result.plan);
  return result;
}

}  // namespace internal

}  // namespace rlsched::balance
