// One rank's micro-batches under a hard token cap (PlanMicroBatches), and the
// pieces the step planner shares (micro_batch_internal.h): padding, packing a rank's
// sequences into m micro-batches, ordering them and timing the rank.

#include "rlsched/balance/micro_batch.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "internal.h"
#include "micro_batch_internal.h"
#include "rlsched/common/error.h"

namespace rlsched::balance {
namespace internal {
namespace {

constexpr std::int64_t kMaxPipelineStages = 65536;

void CheckAtLeast(std::int64_t value, std::int64_t min, const char* field) {
  if (value < min) {
    rlsched::FailBound(std::string(field), ">= " + std::to_string(min), value);
  }
}

struct Loads {
  std::vector<std::int64_t> tokens;
  std::vector<std::int64_t> costs;
  std::vector<std::int64_t> counts;
};

Loads LoadsOf(const RankItems& items, std::int64_t m, const Assignment& assignment) {
  Loads loads{std::vector<std::int64_t>(static_cast<std::size_t>(m), 0),
              std::vector<std::int64_t>(static_cast<std::size_t>(m), 0),
              std::vector<std::int64_t>(static_cast<std::size_t>(m), 0)};
  for (std::size_t i = 0; i < assignment.size(); ++i) {
    const std::size_t b = static_cast<std::size_t>(assignment[i]);
    loads.tokens[b] += items.tokens[i];
    loads.costs[b] += items.costs[i];
    ++loads.counts[b];
  }
  return loads;
}

bool WithinCap(const Loads& loads, std::int64_t cap) {
  return std::all_of(loads.tokens.begin(), loads.tokens.end(),
                     [cap](std::int64_t t) { return t <= cap; });
}

// Moves items out of bins over the cap into the cheapest bins with room.
// Returns false when some bin stays over the cap.
bool Repair(const RankItems& items, std::int64_t m, std::int64_t cap, Assignment& assignment) {
  Loads loads = LoadsOf(items, m, assignment);
  std::vector<std::int32_t> by_tokens(items.tokens.size());
  std::iota(by_tokens.begin(), by_tokens.end(), 0);
  std::stable_sort(by_tokens.begin(), by_tokens.end(), [&](std::int32_t a, std::int32_t b) {
    return items.tokens[static_cast<std::size_t>(a)] > items.tokens[static_cast<std::size_t>(b)];
  });
  for (const std::int32_t i : by_tokens) {
    const std::size_t from = static_cast<std::size_t>(assignment[static_cast<std::size_t>(i)]);
    if (loads.tokens[from] <= cap) continue;
    const std::int64_t t = items.tokens[static_cast<std::size_t>(i)];
    std::int64_t best = -1;
    for (std::int64_t b = 0; b < m; ++b) {
      const std::size_t to = static_cast<std::size_t>(b);
      if (to == from || loads.tokens[to] + t > cap) continue;
      if (best < 0 || loads.costs[to] < loads.costs[static_cast<std::size_t>(best)]) best = b;
    }
    if (best < 0) continue;
    const std::size_t to = static_cast<std::size_t>(best);
    assignment[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(best);
    loads.tokens[from] -= t;
    loads.tokens[to] += t;
    loads.costs[from] -= items.costs[static_cast<std::size_t>(i)];
    loads.costs[to] += items.costs[static_cast<std::size_t>(i)];
  }
  return WithinCap(loads, cap);
}

// Longest first onto the bin with the fewest tokens (first fit by index on ties).
Assignment LptOnTokens(const RankItems& items, std::int64_t m) {
  return GreedyLptSorted(items.tokens, HeaviestFirst(items.tokens), m, PartSizes::kAny);
}

}  // namespace

void CheckOptions(const MicroBatchOptions& options) {
  CheckAtLeast(options.max_tokens_per_micro_batch, 1, "max_tokens_per_micro_batch");
  CheckAtLeast(options.min_micro_batches, 1, "min_micro_batches");
  CheckAtLeast(options.micro_batches_multiple_of, 1, "micro_batches_multiple_of");
  CheckAtLeast(options.pad_to_multiple_of, 1, "pad_to_multiple_of");
  CheckAtLeast(options.pipeline_stages, 1, "pipeline_stages");
  if (options.pipeline_stages > kMaxPipelineStages) {
    rlsched::Fail("pipeline_stages", "must be <= " + std::to_string(kMaxPipelineStages) + ", got " +
                                         std::to_string(options.pipeline_stages));
  }
  if (options.overhead) CheckAtLeast(*options.overhead, 0, "overhead");
  if (!(options.count_tolerance >= 0.0 && options.count_tolerance <= 1.0)) {
    rlsched::Fail("count_tolerance",
                  "must be in [0, 1], got " + std::to_string(options.count_tolerance));
  }
  if (options.min_micro_batches > kMaxParts) {
    rlsched::Fail("min_micro_batches", "must be <= " + std::to_string(kMaxParts));
  }
  if (options.micro_batches_multiple_of > kMaxParts) {
    rlsched::Fail("micro_batches_multiple_of", "must be <= " + std::to_string(kMaxParts));
  }
}

MicroBatchOptions Resolved(const MicroBatchOptions& options) {
  MicroBatchOptions resolved = options;
  resolved.overhead = options.overhead.value_or(options.cost.micro_batch_overhead());
  return resolved;
}

Padded Pad(std::span<const std::int64_t> lengths, const MicroBatchOptions& options) {
  internal::CheckWeights(lengths, "lengths");
  Padded padded;
  padded.lengths = lengths;
  padded.tokens.resize(lengths.size());
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    if (lengths[i] > kMaxLength) {
      rlsched::FailBound("lengths[" + std::to_string(i) + "]", "<= 2^31", lengths[i]);
    }
    const std::int64_t t = RoundUp(lengths[i], options.pad_to_multiple_of);
    if (t > options.max_tokens_per_micro_batch) {
      rlsched::Fail("lengths[" + std::to_string(i) + "]",
                    "sequence of " + std::to_string(t) +
                        " tokens (padded) exceeds max_tokens_per_micro_batch = " +
                        std::to_string(options.max_tokens_per_micro_batch));
    }
    padded.tokens[i] = t;
  }
  internal::CheckWeights(padded.tokens, "lengths (padded)");
  padded.costs = options.cost.Costs(padded.tokens);
  internal::CheckWeights(padded.costs, "cost");
  return padded;
}

RankItems Gather(const Padded& padded, std::span<const std::int64_t> indices) {
  RankItems items;
  for (const std::int64_t i : indices) {
    items.tokens.push_back(padded.tokens[static_cast<std::size_t>(i)]);
    items.costs.push_back(padded.costs[static_cast<std::size_t>(i)]);
    items.global.push_back(i);
    items.total_tokens += items.tokens.back();
    items.total_unpadded += padded.lengths[static_cast<std::size_t>(i)];
    items.total_cost += items.costs.back();
  }
  return items;
}

std::optional<Assignment> FirstFitDecreasing(const RankItems& items, std::int64_t m,
                                             std::int64_t cap) {
  std::vector<std::int64_t> room(static_cast<std::size_t>(m), cap);
  Assignment assignment(items.tokens.size(), 0);
  for (const std::int32_t i : internal::HeaviestFirst(items.tokens)) {
    const std::int64_t t = items.tokens[static_cast<std::size_t>(i)];
    const auto it = std::find_if(room.begin(), room.end(), [t](std::int64_t r) { return r >= t; });
    if (it == room.end()) return std::nullopt;
    *it -= t;
    assignment[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(it - room.begin());
  }
  return assignment;
}

void FillEmptyBins(const RankItems& items, std::int64_t m, Assignment& assignment) {
  if (static_cast<std::int64_t>(assignment.size()) < m) return;
  Loads loads = LoadsOf(items, m, assignment);
  for (std::int64_t b = 0; b < m; ++b) {
    if (loads.counts[static_cast<std::size_t>(b)] > 0) continue;
    const auto donor = static_cast<std::int32_t>(
        std::max_element(loads.counts.begin(), loads.counts.end()) - loads.counts.begin());
    std::int64_t pick = -1;
    for (std::size_t i = 0; i < assignment.size(); ++i) {
      if (assignment[i] != donor) continue;
      if (pick < 0 || items.tokens[i] < items.tokens[static_cast<std::size_t>(pick)]) {
        pick = static_cast<std::int64_t>(i);
      }
    }
    assignment[static_cast<std::size_t>(pick)] = static_cast<std::int32_t>(b);
    --loads.counts[static_cast<std::size_t>(donor)];
    ++loads.counts[static_cast<std::size_t>(b)];
  }
}

std::optional<Assignment> Pack(const RankItems& items, std::int64_t m, std::int64_t cap,
                               const RefineOptions& refine,
                               const std::optional<Assignment>& extra) {
  const std::int64_t n = static_cast<std::int64_t>(items.tokens.size());
  if (n <= m) {
    Assignment one_each(static_cast<std::size_t>(n));
    std::iota(one_each.begin(), one_each.end(), 0);
    return one_each;
  }
  std::vector<Assignment> starts;
  Assignment kk = KarmarkarKarpSorted(items.costs, HeaviestFirst(items.costs), m, PartSizes::kAny);
  if (Repair(items, m, cap, kk)) starts.push_back(std::move(kk));
  Assignment lpt = LptOnTokens(items, m);
  if (WithinCap(LoadsOf(items, m, lpt), cap)) starts.push_back(std::move(lpt));
  if (starts.empty()) {
    if (auto ffd = FirstFitDecreasing(items, m, cap)) starts.push_back(std::move(*ffd));
  }
  if (extra) starts.push_back(*extra);
  if (starts.empty()) return std::nullopt;

  const std::int64_t bound = LowerBound(items.costs, m, PartSizes::kAny);
  std::optional<Assignment> best;
  std::int64_t best_max = 0;
  for (Assignment& start : starts) {
    FillEmptyBins(items, m, start);
    RefineWithCapacity(items.costs, items.tokens, cap, m, PartSizes::kAny, refine, bound, start);
    const Loads loads = LoadsOf(items, m, start);
    const std::int64_t max_cost = *std::max_element(loads.costs.begin(), loads.costs.end());
    if (!best || max_cost < best_max) {
      best = std::move(start);
      best_max = max_cost;
    }
  }
  return best;
}

std::int64_t RankTime(const std::vector<MicroBatch>& batches, const MicroBatchOptions& options) {
  std::int64_t sum = 0;
  std::int64_t max = 0;
  for (const MicroBatch& b : batches) {
    const std::int64_t t = internal::CheckedAdd(b.cost, Overhead(options), "overhead");
    sum = internal::CheckedAdd(sum, t, "overhead");
    max = std::max(max, t);
  }
  return internal::CheckedAdd(
      sum, internal::CheckedMul(options.pipeline_stages - 1, max, "pipeline_stages"),
      "pipeline_stages");
}

RankPlan MakeRankPlan(const Padded& padded, const RankItems& items, std::int64_t m,
                      const Assignment& assignment, const MicroBatchOptions& options) {
  std::vector<MicroBatch> batches(static_cast<std::size_t>(m));
  for (std::size_t i = 0; i < assignment.size(); ++i) {
    MicroBatch& b = batches[static_cast<std::size_t>(assignment[i])];
    b.indices.push_back(items.global[i]);
    b.tokens += items.tokens[i];
    b.unpadded_tokens += padded.lengths[static_cast<std::size_t>(items.global[i])];
    b.cost += items.costs[i];
  }
  for (MicroBatch& b : batches) std::sort(b.indices.begin(), b.indices.end());
  // Heaviest first; ties by first sequence, empty micro-batches last.
  std::stable_sort(batches.begin(), batches.end(), [](const MicroBatch& a, const MicroBatch& b) {
    if (a.cost != b.cost) return a.cost > b.cost;
    if (a.indices.empty() != b.indices.empty()) return b.indices.empty();
    return !a.indices.empty() && a.indices.front() < b.indices.front();
  });
  RankPlan plan;
  if (options.order == MicroBatchOrder::kPipeline) {
    // Lightest at both ends: the heaviest in the middle, then alternately outwards.
    std::vector<MicroBatch> ordered(batches.size());
    std::size_t left = 0;
    std::size_t right = batches.size();
    for (std::size_t j = batches.size(); j-- > 0;) {  // lightest first
      if ((batches.size() - 1 - j) % 2 == 0) {
        ordered[left++] = std::move(batches[j]);
      } else {
        ordered[--right] = std::move(batches[j]);
      }
    }
    batches = std::move(ordered);
  }
  plan.micro_batches = std::move(batches);
  plan.sequences = static_cast<std::int64_t>(items.global.size());
  plan.tokens = items.total_tokens;
  plan.unpadded_tokens = items.total_unpadded;
  plan.cost = items.total_cost;
  plan.time = RankTime(plan.micro_batches, options);
  return plan;
}

std::int64_t SmallestCount(std::int64_t total_tokens, const MicroBatchOptions& options) {
  const std::int64_t m = std::max(CeilDiv(total_tokens, options.max_tokens_per_micro_batch),
                                  options.min_micro_batches);
  return RoundUp(m, options.micro_batches_multiple_of);
}

// A lower bound on the time of any plan of one rank with m micro-batches, for a rank
// of total cost `rank_cost` whose largest sequence costs `max_item`: the micro-batch
// times add up to rank_cost + m·o, and the largest is at least
// max(rank_cost / m, max_item) + o.
double TimeBound(double rank_cost, double max_item, std::int64_t m,
                 const MicroBatchOptions& options) {
  const double p = static_cast<double>(options.pipeline_stages);
  const double o = static_cast<double>(Overhead(options));
  const double md = static_cast<double>(m);
  return rank_cost + (p - 1.0) * std::max(rank_cost / md, max_item) + (md + p - 1.0) * o;
}

RankSearch FindFeasible(RankItems items, std::int64_t from, const MicroBatchOptions& options) {
  RankSearch search{std::move(items), 0, std::nullopt};
  const std::int64_t q = options.micro_batches_multiple_of;
  for (std::int64_t m = from;; m += q) {
    search.packing =
        Pack(search.items, m, options.max_tokens_per_micro_batch, options.refine, std::nullopt);
    if (search.packing) {
      search.feasible_count = m;
      return search;
    }
  }
}

std::int64_t SmallestWithin(const std::vector<std::pair<std::int64_t, std::int64_t>>& tried,
                            double tolerance) {
  std::int64_t best = std::numeric_limits<std::int64_t>::max();
  for (const auto& [count, time] : tried) best = std::min(best, time);
  const long double limit = static_cast<long double>(best) * (1.0L + tolerance);
  std::int64_t chosen = std::numeric_limits<std::int64_t>::max();
  for (const auto& [count, time] : tried) {
    if (static_cast<long double>(time) <= limit) chosen = std::min(chosen, count);
  }
  return chosen;
}

}  // namespace internal

using internal::CheckOptions;
using internal::FindFeasible;
using internal::Gather;
using internal::kMaxCountsTried;
using internal::MakeRankPlan;
using internal::Pack;
using internal::Pad;
using internal::Padded;
using internal::RankItems;
using internal::RankSearch;
using internal::Resolved;
using internal::RoundDown;
using internal::SmallestCount;
using internal::SmallestWithin;
using internal::TimeBound;

RankPlan PlanMicroBatches(std::span<const std::int64_t> lengths,
                          const MicroBatchOptions& unresolved) {
  CheckOptions(unresolved);
  const MicroBatchOptions options = Resolved(unresolved);
  const Padded padded = Pad(lengths, options);
  std::vector<std::int64_t> all(lengths.size());
  std::iota(all.begin(), all.end(), 0);
  RankItems gathered = Gather(padded, all);
  const std::int64_t from = SmallestCount(gathered.total_tokens, options);
  RankSearch search = FindFeasible(std::move(gathered), from, options);
  const RankItems& items = search.items;
  const double max_item =
      items.costs.empty()
          ? 0.0
          : static_cast<double>(*std::max_element(items.costs.begin(), items.costs.end()));
  const std::int64_t first = search.feasible_count;
  auto plan_with = [&](std::int64_t count) {
    if (count == first) return MakeRankPlan(padded, items, count, *search.packing, options);
    const auto packing =
        Pack(items, count, options.max_tokens_per_micro_batch, options.refine, search.packing);
    return MakeRankPlan(padded, items, count, *packing, options);
  };
  RankPlan best = plan_with(first);
  std::vector<std::pair<std::int64_t, std::int64_t>> tried{{first, best.time}};
  const std::int64_t q = options.micro_batches_multiple_of;
  // Never more micro-batches than sequences.
  const std::int64_t last =
      std::max(first, RoundDown(static_cast<std::int64_t>(items.tokens.size()), q));
  for (std::int64_t m = first + q, counted = 0; counted < kMaxCountsTried && m <= last;
       m += q, ++counted) {
    if (TimeBound(static_cast<double>(items.total_cost), max_item, m, options) >=
        static_cast<double>(best.time)) {
      break;
    }
    RankPlan plan = plan_with(m);
    tried.emplace_back(m, plan.time);
    if (plan.time < best.time) best = std::move(plan);
  }
  const std::int64_t chosen = SmallestWithin(tried, options.count_tolerance);
  if (chosen != static_cast<std::int64_t>(best.micro_batches.size())) best = plan_with(chosen);
  return best;
}

}  // namespace rlsched::balance
