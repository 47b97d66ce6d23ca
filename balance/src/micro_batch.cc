#include "rlsched/balance/micro_batch.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <optional>
#include <queue>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "internal.h"
#include "rlsched/balance/balance.h"

namespace rlsched::balance {
namespace {

// At most this many micro-batch counts are tried above the smallest feasible one.
constexpr int kMaxCountsTried = 32;
constexpr std::int64_t kMaxPipelineStages = 65536;

void CheckAtLeast(std::int64_t value, std::int64_t min, const char* field) {
  if (value < min) {
    throw std::invalid_argument(std::string(field) + ": must be >= " + std::to_string(min) +
                                ", got " + std::to_string(value));
  }
}

void CheckOptions(const MicroBatchOptions& options) {
  CheckAtLeast(options.max_tokens_per_micro_batch, 1, "max_tokens_per_micro_batch");
  CheckAtLeast(options.min_micro_batches, 1, "min_micro_batches");
  CheckAtLeast(options.micro_batches_multiple_of, 1, "micro_batches_multiple_of");
  CheckAtLeast(options.pad_to_multiple_of, 1, "pad_to_multiple_of");
  CheckAtLeast(options.pipeline_stages, 1, "pipeline_stages");
  if (options.pipeline_stages > kMaxPipelineStages) {
    throw std::invalid_argument(
        "pipeline_stages: must be <= " + std::to_string(kMaxPipelineStages) + ", got " +
        std::to_string(options.pipeline_stages));
  }
  if (options.overhead) CheckAtLeast(*options.overhead, 0, "overhead");
  if (!(options.count_tolerance >= 0.0 && options.count_tolerance <= 1.0)) {
    throw std::invalid_argument("count_tolerance: must be in [0, 1], got " +
                                std::to_string(options.count_tolerance));
  }
  if (options.min_micro_batches > kMaxParts) {
    throw std::invalid_argument("min_micro_batches: must be <= " + std::to_string(kMaxParts));
  }
  if (options.micro_batches_multiple_of > kMaxParts) {
    throw std::invalid_argument("micro_batches_multiple_of: must be <= " +
                                std::to_string(kMaxParts));
  }
}

std::int64_t CeilDiv(std::int64_t a, std::int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }
std::int64_t RoundUp(std::int64_t a, std::int64_t multiple) {
  return CeilDiv(a, multiple) * multiple;
}
std::int64_t RoundDown(std::int64_t a, std::int64_t multiple) { return a / multiple * multiple; }

// The options with the overhead resolved (the cost model's estimate when unset).
MicroBatchOptions Resolved(const MicroBatchOptions& options) {
  MicroBatchOptions resolved = options;
  resolved.overhead = options.overhead.value_or(options.cost.micro_batch_overhead());
  return resolved;
}

// The overhead of resolved options.
std::int64_t Overhead(const MicroBatchOptions& options) { return *options.overhead; }

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

// Padded lengths and their costs for the whole batch, checked against the cap.
struct Padded {
  std::span<const std::int64_t> lengths;  // unpadded
  std::vector<std::int64_t> tokens;
  std::vector<std::int64_t> costs;
};

Padded Pad(std::span<const std::int64_t> lengths, const MicroBatchOptions& options) {
  internal::CheckWeights(lengths, "lengths");
  Padded padded;
  padded.lengths = lengths;
  padded.tokens.resize(lengths.size());
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    if (lengths[i] > kMaxLength) {
      throw std::invalid_argument("lengths[" + std::to_string(i) + "]: must be <= 2^31, got " +
                                  std::to_string(lengths[i]));
    }
    const std::int64_t t = RoundUp(lengths[i], options.pad_to_multiple_of);
    if (t > options.max_tokens_per_micro_batch) {
      throw std::invalid_argument("lengths[" + std::to_string(i) + "]: sequence of " +
                                  std::to_string(t) +
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
  return internal::GreedyLptSorted(items.tokens, internal::HeaviestFirst(items.tokens), m, false);
}

// First-fit decreasing on tokens; nullopt when an item fits in no bin.
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

// With at least m items, no bin stays empty: an empty bin takes the item with the
// fewest tokens from the bin holding the most items (it can only lower that bin).
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

// A packing of `items` into exactly m bins under the cap with balanced cost, or
// nullopt if none of the constructions fits. `extra` is one more starting point
// (e.g. a packing found for fewer bins, which stays valid with empty bins added).
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
  Assignment kk =
      internal::KarmarkarKarpSorted(items.costs, internal::HeaviestFirst(items.costs), m, false);
  if (Repair(items, m, cap, kk)) starts.push_back(std::move(kk));
  Assignment lpt = LptOnTokens(items, m);
  if (WithinCap(LoadsOf(items, m, lpt), cap)) starts.push_back(std::move(lpt));
  if (starts.empty()) {
    if (auto ffd = FirstFitDecreasing(items, m, cap)) starts.push_back(std::move(*ffd));
  }
  if (extra) starts.push_back(*extra);
  if (starts.empty()) return std::nullopt;

  const std::int64_t bound = LowerBound(items.costs, m, false);
  std::optional<Assignment> best;
  std::int64_t best_max = 0;
  for (Assignment& start : starts) {
    FillEmptyBins(items, m, start);
    internal::RefineWithCapacity(items.costs, items.tokens, cap, m, false, refine, bound, start);
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

// Builds the rank's micro-batches from a packing and orders them.
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

// The smallest count allowed before feasibility: >= ceil(tokens / cap), >= the
// minimum, a multiple of the given value.
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

// A rank's feasible packings, the smallest count first.
struct RankSearch {
  RankItems items;
  std::int64_t feasible_count = 0;    // smallest count with a packing found
  std::optional<Assignment> packing;  // that packing
};

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

// The smallest count whose time is within `tolerance` of the best of `tried`
// ((count, time) pairs).
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

}  // namespace

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

namespace {

void CheckStepOptions(const StepOptions& options) {
  if (options.num_ranks < 1 || options.num_ranks > kMaxParts) {
    throw std::invalid_argument("num_ranks: must be in [1, " + std::to_string(kMaxParts) +
                                "], got " + std::to_string(options.num_ranks));
  }
  CheckOptions(options.micro_batch);
  const MicroBatchOptions& mb = options.micro_batch;
  const std::int64_t per_rank = std::max(mb.min_micro_batches, mb.micro_batches_multiple_of);
  if (per_rank > kMaxItems / options.num_ranks) {
    throw std::invalid_argument(
        "num_ranks × max(min_micro_batches, micro_batches_multiple_of): must be <= " +
        std::to_string(kMaxItems) + ", got " + std::to_string(options.num_ranks) + " × " +
        std::to_string(per_rank));
  }
}

// The units a rank assignment moves: one per sequence, or one per group (members in
// index order), with their cost and their largest sequence's cost.
struct Units {
  std::vector<std::vector<std::int64_t>> members;
  std::vector<std::int64_t> cost;
  std::vector<std::int64_t> largest;
};

Units MakeUnits(const Padded& padded, std::span<const std::int64_t> groups, bool keep_groups) {
  std::vector<std::vector<std::int64_t>> units;
  if (keep_groups) {
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

// The costs of units alone (sequences: their costs twice).
struct UnitCosts {
  std::span<const std::int64_t> cost;
  std::span<const std::int64_t> largest;
};

// The relaxation behind the combined bound, for p > 1. For a count m, let
// T' = T − (m + p − 1)·o and h_r the cost of rank r's heaviest micro-batch, at least
// max(C_r / m, L_r) (rank r's cost and largest sequence). A plan with step time <= T
// has C_r + (p − 1)·h_r <= T' on every rank, so R·T' >= C + (p − 1)·Σ_r h_r and
// Σ_r h_r >= max(C / m, ∫ k(x) dx) with k(x) = #{r : h_r > x}. With
// I(x) = ∫_x^∞ k = Σ_{h_r > x} (h_r − x): the ranks with h_r > x hold every sequence
// above x (cost B_x) and cost at most Σ (T' − (p − 1)·h_r) = k·T' − (p − 1)·(k·x + I(x)),
// each at most T'·m / (m + p − 1) (as h_r >= C_r / m); every other rank costs at most
// m·x. Hence, k being an integer <= R:
//   k·(T' − (p − 1)·x)           >= B_x + (p − 1)·I(x)   (B_x may be 0),
//   k·T'·m / (m + p − 1)         >= B_x,   and k >= 1 when B_x > 0,
//   k·(T' − (p − 1)·x − m·x)     >= C + (p − 1)·I(x) − R·m·x,
//   k·(T'·m / (m + p − 1) − m·x) >= C − R·m·x.
// Units: a rank assignment moves sequences, or whole groups (keep_groups). The ranks
// with h_r > x then hold every unit whose largest sequence is above x, so B_x counts
// those units whole; and the rank holding a unit of cost c and largest sequence a has
// T' >= c + (p − 1)·max(a, c / m). With equal counts (every rank floor(U / R) or
// ceil(U / R) of the U units) the k ranks hold the N_x units above x and at least
// k·floor(U / R) − N_x others, no cheaper than the cheapest units (S_j: the j
// cheapest): B_x + S_{k·floor(U/R) − N_x} replaces B_x in the first two inequalities,
// and k >= N_x / ceil(U / R). As k(x) never falls as x falls, neither does its estimate.
// Feasible() integrates a lower estimate of k from the top down on a grid (on each
// interval [x0, x1): B, N and I at x1, the capacities at x0, so each estimate holds on
// the whole interval); T' fails when some k must exceed R or the sum exceeds R·T'.
// With m = ∞ (passed as 0) the C terms vanish: what is left bounds through every
// rank's largest sequence alone, R·T' >= C + (p − 1)·Σ_r L_r.
// Ranges of counts: the relaxation at count b also holds for every count m <= b
// (max(C_r / m, L_r) only falls as m grows), and T − (m + p − 1)·o <= T − (a + p − 1)·o
// for m >= a; so MinBudget(b) + (a + p − 1)·o bounds every plan with m in [a, b].
// O(n log n) to build, O(grid + R) per feasibility test (grid <= 128 + 128 + 32).
class CombinedRelaxation {
 public:
  // The units a rank assignment moves (sequences, or whole groups) by their cost and
  // their largest sequence's cost; with equal_counts every rank holds floor(U / R) or
  // ceil(U / R) of the U units.
  CombinedRelaxation(const UnitCosts& units, std::int64_t num_ranks, std::int64_t stages,
                     bool equal_counts)
      : r_(static_cast<double>(num_ranks)), p1_(static_cast<double>(stages - 1)) {
    const std::size_t n = units.cost.size();
    // Units by largest sequence, descending.
    std::vector<std::size_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(),
              [&](std::size_t a, std::size_t b) { return units.largest[a] > units.largest[b]; });
    std::vector<double> prefix(n + 1, 0.0);  // prefix[i]: the i units of largest sequences
    for (std::size_t i = 0; i < n; ++i) {
      const double c = static_cast<double>(units.cost[order[i]]);
      const double a = static_cast<double>(units.largest[order[i]]);
      prefix[i + 1] = prefix[i] + c;
      largest_ = std::max(largest_, a);
      unit_cost_ = std::max(unit_cost_, c);
      unit_floor_ = std::max(unit_floor_, c + p1_ * a);
    }
    total_ = prefix.back();
    const auto u = static_cast<std::int64_t>(n);
    if (equal_counts && u >= num_ranks) {
      min_units_ = static_cast<double>(u / num_ranks);
      max_units_ = static_cast<double>(CeilDiv(u, num_ranks));
      std::vector<std::int64_t> ascending(units.cost.begin(), units.cost.end());
      std::sort(ascending.begin(), ascending.end());
      smallest_.assign(n + 1, 0.0);
      for (std::size_t i = 0; i < n; ++i) {
        smallest_[i + 1] = smallest_[i] + static_cast<double>(ascending[i]);
      }
    }
    // Grid on [0, largest]: uniform points, plus the largest distinct largest-sequence
    // costs (where B jumps most, relative to its size), so B is exact there.
    xs_.push_back(0.0);
    for (int j = 1; j <= kUniform; ++j) xs_.push_back(largest_ * j / kUniform);
    int distinct = 0;
    for (std::size_t i = 0; i < n && distinct < kTop; ++i) {
      if (i == 0 || units.largest[order[i]] != units.largest[order[i - 1]]) {
        xs_.push_back(static_cast<double>(units.largest[order[i]]));
        ++distinct;
      }
    }
    std::sort(xs_.begin(), xs_.end());
    xs_.erase(std::unique(xs_.begin(), xs_.end()), xs_.end());
    // above_[i], count_[i]: the cost and number of the units whose largest sequence is
    // >= xs_[i] (above every x < xs_[i]).
    above_.resize(xs_.size());
    count_.resize(xs_.size());
    for (std::size_t i = 0; i < xs_.size(); ++i) {
      const auto it = std::partition_point(order.begin(), order.end(), [&](std::size_t v) {
        return static_cast<double>(units.largest[v]) >= xs_[i];
      });
      const auto k = static_cast<std::size_t>(it - order.begin());
      above_[i] = prefix[k];
      count_[i] = static_cast<double>(k);
    }
  }

  double largest() const { return largest_; }
  double total() const { return total_; }

  // Every T' below the returned value is infeasible for count m (0: unbounded).
  // Bisection to 1e-4. O(log(1e4) · grid).
  double MinBudget(double m) const {
    if (total_ <= 0.0) return 0.0;
    // Infeasible below: the rank with the largest unit, the mean rank.
    double lo = std::max(Floor(m), total_ / r_) * (1.0 - 1e-9);
    if (m > 0) lo = std::max(lo, total_ / r_ * (1.0 + p1_ / m) * (1.0 - 1e-9));
    double hi = lo * 1.25;
    for (int doubling = 0; doubling < 64 && !Feasible(hi, m); ++doubling) {
      lo = hi;
      hi *= 2.0;
    }
    for (int iteration = 0; iteration < 64 && hi - lo > 1e-4 * hi; ++iteration) {
      const double mid = (lo + hi) / 2;
      (Feasible(mid, m) ? hi : lo) = mid;
    }
    return lo * (1.0 - 1e-9);  // below the threshold despite rounding
  }

 private:
  static constexpr int kUniform = 128;
  static constexpr int kTop = 128;
  static constexpr int kExtension = 32;  // intervals above the largest cost (C terms)

  // The rank holding a unit of cost c and largest sequence a needs at least
  // c + (p − 1)·max(a, c / m).
  double Floor(double m) const {
    return std::max(unit_floor_, m > 0 ? unit_cost_ * (1.0 + p1_ / m) : 0.0);
  }

  // The cost of the j cheapest units (0 for j <= 0).
  double Smallest(double j) const {
    if (j <= 0.0 || smallest_.empty()) return 0.0;
    return smallest_[std::min(static_cast<std::size_t>(j), smallest_.size() - 1)];
  }

  bool Feasible(double t, double m) const {
    if (t < Floor(m)) return false;
    const double cap = m > 0 ? t * m / (m + p1_) : t;  // a rank's cost at most
    const double eps = 1e-9 * total_;
    double integral = 0.0;  // lower estimate of I(x1)
    double previous = 0.0;  // k on the interval above: k(x) only grows as x falls
    bool ok = true;
    // One interval [x0, x1) with B_x >= b on it, held by `count` units.
    auto interval = [&](double x0, double x1, double b, double count) {
      double k = 0.0;
      const double need0 = b + p1_ * integral;
      const double room0 = t - p1_ * x0;
      if (need0 > 0.0) {
        if (room0 <= 0.0) return false;
        k = need0 / room0;
      }
      if (b > 0.0) k = std::max({k, 1.0, b / cap});
      if (m > 0) {
        const double need = total_ + p1_ * integral - r_ * m * x1;
        if (need > eps) {
          const double room = t - (p1_ + m) * x0;
          if (room <= 0.0) return false;
          k = std::max(k, need / room);
        }
        const double need2 = total_ - r_ * m * x1;
        if (need2 > eps) {
          const double room = cap - m * x0;
          if (room <= 0.0) return false;
          k = std::max(k, need2 / room);
        }
      }
      double whole = std::max(previous, std::ceil(k - 1e-9 * std::max(1.0, k)));
      if (min_units_ > 0.0 && count > 0.0) {
        // Equal counts: the k ranks hold the `count` units and at least
        // k·min − count others, no cheaper than the cheapest ones; and at most max each.
        whole = std::max(whole, std::ceil(count / max_units_ - 1e-9));
        auto holds = [&](double w) {
          const double others = Smallest(w * min_units_ - count);
          return w * room0 + eps >= need0 + others && w * cap + eps >= b + others;
        };
        while (whole <= r_ && !holds(whole)) whole += 1.0;
      }
      if (whole > r_) return false;
      previous = whole;
      integral += whole * (x1 - x0);
      return true;
    };
    // Above the largest cost only the C terms count: up to C / (R·m).
    if (m > 0) {
      const double top = total_ / (r_ * m);
      if (top > largest_) {
        const double step = (top - largest_) / kExtension;
        for (int j = kExtension; j >= 1 && ok; --j) {
          ok = interval(largest_ + step * (j - 1), largest_ + step * j, 0.0, 0.0);
        }
      }
    }
    for (std::size_t i = xs_.size() - 1; i >= 1 && ok; --i) {
      ok = interval(xs_[i - 1], xs_[i], above_[i], count_[i]);
    }
    if (!ok) return false;
    const double sum_m = std::max(m > 0 ? total_ / m : 0.0, integral);
    return r_ * t >= total_ + p1_ * sum_m;
  }

  double r_;
  double p1_;
  double total_ = 0.0;
  double largest_ = 0.0;          // the largest sequence
  double unit_cost_ = 0.0;        // the costliest unit
  double unit_floor_ = 0.0;       // max over units of cost + (p − 1)·largest sequence
  double min_units_ = 0.0;        // units per rank at least (0: counts not equal)
  double max_units_ = 0.0;        // and at most
  std::vector<double> smallest_;  // smallest_[j]: the j cheapest units
  std::vector<double> xs_;
  std::vector<double> above_;
  std::vector<double> count_;
};

// The combined bound (see CombinedRelaxation) minimised over the admissible counts
// m in [first, last] (multiples of q; last = 0: unbounded): a range [a, b] of counts (b = 0: all
// from a on) is worth max(MinBudget(b), the closed form of StepLowerBound at b) + (a+p−1)·o, which
// bounds every count in it. Best first: the range of least worth is split (one new MinBudget each)
// until it is a single count or the evaluations run out; its worth then bounds every plan, since
// the ranges cover every admissible count. With o = 0 every range containing the last count is
// worth the same, so that is the bound. Returns the bound and the count of that single range (with
// o = 0, the last count; 0: none), a hint for the planner. O(kMaxEvaluations · MinBudget).
std::pair<long double, std::int64_t> CombinedBound(const UnitCosts& units, bool equal_counts,
                                                   long double heaviest, std::int64_t first,
                                                   std::int64_t last, const StepOptions& options) {
  constexpr int kMaxEvaluations = 40;
  const MicroBatchOptions& mb = options.micro_batch;
  const CombinedRelaxation relax(units, options.num_ranks, mb.pipeline_stages, equal_counts);
  if (relax.total() <= 0.0) return {0.0L, 0};
  const long double p = static_cast<long double>(mb.pipeline_stages);
  const long double o = static_cast<long double>(Overhead(mb));
  const std::int64_t q = mb.micro_batches_multiple_of;
  const long double floor_term = p * static_cast<long double>(relax.largest());
  std::vector<std::pair<std::int64_t, double>> budgets;  // MinBudget by count
  auto budget = [&](std::int64_t b) {
    for (const auto& [count, t] : budgets) {
      if (count == b) return t;
    }
    budgets.emplace_back(b, relax.MinBudget(static_cast<double>(b)));
    return budgets.back().second;
  };
  auto worth = [&](std::int64_t a, std::int64_t b) {
    const long double closed =
        b > 0 ? std::max(heaviest + heaviest * (p - 1.0L) / static_cast<long double>(b), floor_term)
              : std::max(heaviest, floor_term);
    return std::max(static_cast<long double>(budget(b)), closed) +
           (static_cast<long double>(a) + p - 1.0L) * o;
  };
  struct Range {
    long double worth;
    std::int64_t a, b;
    bool operator>(const Range& other) const { return worth > other.worth; }
  };
  std::priority_queue<Range, std::vector<Range>, std::greater<>> ranges;
  ranges.push({worth(first, last), first, last});
  if (o == 0) return {ranges.top().worth, last};
  while (true) {
    const Range range = ranges.top();
    if (range.a == range.b) return {range.worth, range.a};
    if (static_cast<int>(budgets.size()) >= kMaxEvaluations) return {range.worth, 0};
    ranges.pop();
    const std::int64_t mid = range.b == 0 ? std::max(range.a, RoundUp(2 * range.a, q))
                                          : range.a + q * ((range.b - range.a) / q / 2);
    ranges.push({std::max(range.worth, worth(range.a, mid)), range.a, mid});
    ranges.push({std::max(range.worth, worth(mid + q, range.b)), mid + q, range.b});
  }
}

// No plan with any rank assignment has a smaller step time (see TimeBound): the
// heaviest rank costs at least max(total / R, largest unit), and some micro-batch
// count m >= ceil(total tokens / R / cap) (honouring the minimum and the multiple)
// must be used; with Empties::kNone, also m <= floor(n / R) when the first count
// allows it (every rank then holds at least m sequences: the bound of plans without
// an empty micro-batch). TimeBound is convex in m, so the best m is next to the real
// minimiser. With p > 1 also CombinedBound, whose best count is returned as a hint
// (0: none).
struct StepBound {
  std::int64_t value = 0;
  std::int64_t count = 0;
};

enum class Empties { kAllowed, kNone };

StepBound StepLowerBound(const Padded& padded, std::int64_t max_unit_cost, const UnitCosts& units,
                         bool equal_counts, Empties empties, const StepOptions& options) {
  const MicroBatchOptions& mb = options.micro_batch;
  std::int64_t total_cost = 0;
  std::int64_t total_tokens = 0;
  std::int64_t max_item = 0;
  for (std::size_t i = 0; i < padded.costs.size(); ++i) {
    total_cost += padded.costs[i];
    total_tokens += padded.tokens[i];
    max_item = std::max(max_item, padded.costs[i]);
  }
  const long double r = static_cast<long double>(options.num_ranks);
  const long double heaviest =
      std::max(static_cast<long double>(total_cost) / r, static_cast<long double>(max_unit_cost));
  const long double p = static_cast<long double>(mb.pipeline_stages);
  const long double o = static_cast<long double>(Overhead(mb));
  const long double spread = heaviest * (p - 1.0L);  // f(m) = max(heaviest + spread/m, p·max)
  const long double floor_term = p * static_cast<long double>(max_item);
  auto f = [&](long double m) {
    return std::max(heaviest + spread / m, floor_term) + m * o + (p - 1.0L) * o;
  };
  const std::int64_t first = SmallestCount(CeilDiv(total_tokens, options.num_ranks), mb);
  const std::int64_t fillable =
      RoundDown(static_cast<std::int64_t>(padded.costs.size()) / options.num_ranks,
                mb.micro_batches_multiple_of);
  const std::int64_t last = empties == Empties::kNone && fillable >= first ? fillable : 0;
  const long double q = static_cast<long double>(mb.micro_batches_multiple_of);
  long double best_m = std::numeric_limits<long double>::infinity();
  if (o > 0) best_m = std::sqrt(spread / o);
  if (floor_term > heaviest && spread > 0)
    best_m = std::min(best_m, spread / (floor_term - heaviest));
  if (last > 0) best_m = std::min(best_m, static_cast<long double>(last));
  long double value;
  if (std::isinf(best_m)) {
    value = heaviest + (p - 1.0L) * o;  // the infimum as m grows
  } else {
    const long double steps = std::max(0.0L, std::floor((best_m - first) / q));
    const long double m1 = first + steps * q;
    value =
        last > 0 && m1 + q > static_cast<long double>(last) ? f(m1) : std::min(f(m1), f(m1 + q));
    if (spread == 0) value = f(static_cast<long double>(first));
  }
  // With a pipeline, every rank's cost, largest sequence and count together.
  std::int64_t count = 0;
  if (mb.pipeline_stages > 1) {
    const auto [combined, combined_count] =
        CombinedBound(units, equal_counts, heaviest, first, last, options);
    value = std::max(value, combined);
    count = combined_count;
  }
  const long double limit = static_cast<long double>(std::numeric_limits<std::int64_t>::max());
  return {value >= limit ? std::numeric_limits<std::int64_t>::max()
                         : static_cast<std::int64_t>(std::floor(value)),
          count};
}

// The bound of plans that may split groups (the baseline's), equal sequence counts
// when asked.
std::int64_t UngroupedBound(const Padded& padded, bool equal_counts, Empties empties,
                            const StepOptions& options) {
  return StepLowerBound(padded, 0, {padded.costs, padded.costs}, equal_counts, empties, options)
      .value;
}

}  // namespace

namespace {

// What an assignment of sequences to ranks may move: units (sequences, or whole
// groups when `group_of` holds the group of each sequence); none when the ranks' unit
// counts are fixed (equal counts).
struct Movable {
  std::span<const std::int64_t> group_of;
  bool fixed_counts = false;
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
  struct Unit {
    std::int64_t cost = 0;
    std::vector<std::int64_t> members;  // ascending
    bool moved = false;
  };
  std::vector<std::vector<Unit>> units(num_ranks);
  std::vector<char> built(num_ranks, 0);
  auto build = [&](std::size_t r) {
    if (built[r]) return;
    built[r] = 1;
    std::vector<Unit>& list = units[r];
    if (unit_of.empty()) {
      for (const std::int64_t i : ranks[r]) {
        list.push_back({padded.costs[static_cast<std::size_t>(i)], {i}});
      }
    } else {
      std::vector<std::int64_t> by_group = ranks[r];
      std::stable_sort(by_group.begin(), by_group.end(), [&](std::int64_t a, std::int64_t b) {
        return unit_of[static_cast<std::size_t>(a)] < unit_of[static_cast<std::size_t>(b)];
      });
      for (std::size_t j = 0; j < by_group.size(); ++j) {
        const std::size_t i = static_cast<std::size_t>(by_group[j]);
        if (j == 0 || unit_of[i] != unit_of[static_cast<std::size_t>(by_group[j - 1])]) {
          list.emplace_back();
        }
        list.back().cost += padded.costs[i];
        list.back().members.push_back(by_group[j]);
      }
    }
    std::stable_sort(list.begin(), list.end(), [](const Unit& a, const Unit& b) {
      return std::tie(a.cost, a.members.front()) < std::tie(b.cost, b.members.front());
    });
  };
  // Donors by sequence count (stale entries skipped); exhausted donors leave for good.
  std::priority_queue<std::pair<std::int64_t, std::int64_t>> donors;  // (count, −rank)
  for (std::size_t r = 0; r < num_ranks; ++r) {
    donors.emplace(count[r], -static_cast<std::int64_t>(r));
  }
  std::vector<std::size_t> next(num_ranks, 0);  // the first unit not moved
  std::vector<std::vector<std::int64_t>> incoming(num_ranks);
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
      build(r);
      std::vector<Unit>& list = units[r];
      while (next[r] < list.size() && list[next[r]].moved) ++next[r];
      Unit* give = nullptr;
      for (std::size_t j = next[r]; j < list.size(); ++j) {
        if (!list[j].moved &&
            static_cast<std::int64_t>(list[j].members.size()) <= count[r] - target) {
          give = &list[j];
          break;
        }
      }
      if (give == nullptr) continue;  // every unit too large: exhausted
      give->moved = true;
      const auto size = static_cast<std::int64_t>(give->members.size());
      count[r] -= size;
      count[d] += size;
      incoming[d].insert(incoming[d].end(), give->members.begin(), give->members.end());
      donors.emplace(count[r], negative);
    }
    for (const auto& entry : set_aside) donors.push(entry);
    if (count[d] < target) {
      // Nothing left to give (the batch is short, or groups too large): stop.
      if (donors.empty() || donors.top().first <= target) break;
    }
  }
  for (std::size_t r = 0; r < num_ranks; ++r) {
    if (!built[r] && incoming[r].empty()) continue;
    std::vector<std::int64_t> kept;
    if (built[r]) {
      for (const Unit& unit : units[r]) {
        if (!unit.moved) kept.insert(kept.end(), unit.members.begin(), unit.members.end());
      }
    } else {
      kept = std::move(ranks[r]);
    }
    kept.insert(kept.end(), incoming[r].begin(), incoming[r].end());
    std::sort(kept.begin(), kept.end());
    ranks[r] = std::move(kept);
  }
}

std::int64_t EmptyMicroBatches(const StepPlan& plan) {
  std::int64_t empty = 0;
  for (const RankPlan& rank : plan.ranks) {
    for (const MicroBatch& b : rank.micro_batches) empty += b.indices.empty() ? 1 : 0;
  }
  return empty;
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
// ones (the plan counts them).
StepPlan PlanForRanks(const Padded& padded, std::vector<std::vector<std::int64_t>> ranks,
                      const Movable& movable, const MicroBatchOptions& mb,
                      std::int64_t only_count = 0,
                      std::int64_t stop_at = std::numeric_limits<std::int64_t>::max()) {
  const std::int64_t cap = mb.max_tokens_per_micro_batch;
  const std::int64_t q = mb.micro_batches_multiple_of;
  const auto num_ranks = static_cast<std::int64_t>(ranks.size());
  const auto n = static_cast<std::int64_t>(padded.tokens.size());
  // The most sequences every rank can hold, as a multiple of q (with fixed counts,
  // what the ranks hold).
  std::int64_t fillable = RoundDown(n / num_ranks, q);
  auto smallest_count = [&] {
    std::int64_t from = 0;
    for (const auto& rank : ranks) {
      std::int64_t tokens = 0;
      for (const std::int64_t i : rank) tokens += padded.tokens[static_cast<std::size_t>(i)];
      from = std::max(from, SmallestCount(tokens, mb));
    }
    return from;
  };
  auto fewest = [&] {
    std::int64_t least = std::numeric_limits<std::int64_t>::max();
    for (const auto& rank : ranks) least = std::min(least, static_cast<std::int64_t>(rank.size()));
    return least;
  };
  if (movable.fixed_counts) fillable = std::min(fillable, RoundDown(fewest(), q));
  std::vector<RankSearch> searches;
  std::int64_t m = 0;
  std::int64_t desired = only_count > 0 ? RoundUp(only_count, q) : 0;
  for (int round = 0;; ++round) {
    const std::int64_t from = smallest_count();
    // Every rank at least `target` sequences where the batch has them.
    const std::int64_t target = std::max(from, std::min(desired, fillable));
    if (fewest() < target && !movable.fixed_counts) {
      // When the batch cannot fill every rank to it: as evenly as it can.
      FillRanks(padded, movable.group_of, std::min(target, n / num_ranks), ranks);
      if (smallest_count() != from && round < 3) continue;  // the fill raised the count
    }
    const std::int64_t start = std::max(from, std::min(desired, RoundDown(fewest(), q)));
    // No count from `start` on gives a rank less than C_r + (p − 1)·L_r +
    // (start + p − 1)·o (see TimeBound): then no plan here reaches stop_at.
    searches.clear();
    for (const auto& rank : ranks) {
      searches.push_back(RankSearch{Gather(padded, rank), 0, std::nullopt});
    }
    if (stop_at < std::numeric_limits<std::int64_t>::max()) {
      const double p1 = static_cast<double>(mb.pipeline_stages - 1);
      const double overheads =
          (static_cast<double>(start) + p1) * static_cast<double>(Overhead(mb));
      double least = 0.0;
      for (const RankSearch& search : searches) {
        const auto& costs = search.items.costs;
        const double largest =
            costs.empty() ? 0.0
                          : static_cast<double>(*std::max_element(costs.begin(), costs.end()));
        least = std::max(least,
                         static_cast<double>(search.items.total_cost) + p1 * largest + overheads);
      }
      if (least >= static_cast<double>(stop_at)) {
        StepPlan none;
        none.predicted_step_time = std::numeric_limits<std::int64_t>::max();
        return none;
      }
    }
    m = start;
    for (RankSearch& search : searches) {
      search = FindFeasible(std::move(search.items), start, mb);
      m = std::max(m, search.feasible_count);
    }
    // A packing needed more micro-batches than some rank has sequences: fill again.
    if (round < 3 && m > fewest() && fewest() < fillable && !movable.fixed_counts) {
      desired = std::max(desired, m);
      continue;
    }
    break;
  }
  auto plan_with = [&](std::int64_t count) {
    StepPlan plan;
    plan.num_micro_batches = count;
    for (const RankSearch& search : searches) {
      const auto packing = search.feasible_count == count
                               ? search.packing
                               : Pack(search.items, count, cap, mb.refine, search.packing);
      plan.ranks.push_back(MakeRankPlan(padded, search.items, count, *packing, mb));
      plan.predicted_step_time = std::max(plan.predicted_step_time, plan.ranks.back().time);
    }
    plan.empty_micro_batches = EmptyMicroBatches(plan);
    return plan;
  };
  auto bound_with = [&](std::int64_t count) {
    double bound = 0;
    for (const RankSearch& search : searches) {
      const auto& costs = search.items.costs;
      const double max_item =
          costs.empty() ? 0.0 : static_cast<double>(*std::max_element(costs.begin(), costs.end()));
      bound = std::max(
          bound, TimeBound(static_cast<double>(search.items.total_cost), max_item, count, mb));
    }
    return bound;
  };

  if (only_count > 0) return plan_with(m);
  // Never more micro-batches than the fewest sequences of a rank.
  const std::int64_t last = std::max(m, RoundDown(fewest(), q));
  StepPlan best = plan_with(m);
  std::vector<std::pair<std::int64_t, std::int64_t>> tried{{m, best.predicted_step_time}};
  for (int counted = 0; counted < kMaxCountsTried && m + q <= last; ++counted) {
    m += q;
    const double bound = bound_with(m);
    if (bound >= static_cast<double>(best.predicted_step_time)) break;
    if (bound >= static_cast<double>(stop_at)) continue;  // a larger count may still beat it
    StepPlan plan = plan_with(m);
    tried.emplace_back(m, plan.predicted_step_time);
    if (plan.predicted_step_time < best.predicted_step_time) best = std::move(plan);
  }
  const std::int64_t chosen = SmallestWithin(tried, mb.count_tolerance);
  if (chosen != best.num_micro_batches) best = plan_with(chosen);
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

// PlanBaseline() without the lower bound, on padded lengths.
StepPlan Baseline(const Padded& padded, const StepOptions& options) {
  const MicroBatchOptions& mb = options.micro_batch;
  const Partition ranks =
      MakePartition(padded.costs, options.num_ranks, true,
                    KarmarkarKarp(padded.costs, options.num_ranks, /*equal_size=*/true));
  std::vector<RankItems> items;
  std::int64_t m = 0;
  for (std::int64_t r = 0; r < options.num_ranks; ++r) {
    items.push_back(Gather(padded, ranks.part(r)));
    m = std::max(m, SmallestCount(items.back().total_tokens, mb));
  }
  StepPlan plan;
  plan.num_micro_batches = m;
  for (const RankItems& rank : items) {
    const Assignment assignment =
        internal::KarmarkarKarpSorted(rank.costs, internal::HeaviestFirst(rank.costs), m, false);
    plan.ranks.push_back(MakeRankPlan(padded, rank, m, assignment, mb));
    for (const MicroBatch& b : plan.ranks.back().micro_batches) {
      plan.cap_violations += b.tokens > mb.max_tokens_per_micro_batch ? 1 : 0;
    }
    plan.predicted_step_time = std::max(plan.predicted_step_time, plan.ranks.back().time);
  }
  plan.empty_micro_batches = EmptyMicroBatches(plan);
  return plan;
}

}  // namespace

// With a pipeline, a rank pays (p − 1) times its heaviest micro-batch, which holds
// its largest sequence: spreading the longest sequences one per rank makes every rank
// pay for one. This packs instead: units by largest sequence, longest first, each long
// unit into the first rank that still has room (first fit), where a rank led by a
// sequence of cost a has room for cost up to min(T − (p − 1)·a, T·m / (m + p − 1)),
// less once its sequences must share micro-batches (see `high` below). Short units
// (largest sequence below T / (m + p − 1), which would not be their rank's heaviest
// micro-batch) then go to the rank with the most room (worst fit): spread out, they
// share micro-batches least. With equal counts (every rank floor(U / R) units, or one
// more; groups are then long or short units too) the ranks holding
// long units must also take their quota of others: their room for long units keeps a
// reserve per slot still to fill (the mean cost of the cheapest short units that would
// fill them), they are filled with those cheapest units (worst fit), then each swaps
// its fillers, cheapest first, for the costliest free short unit that still fits its
// room (using it up takes cost off the other ranks); the other short units go worst
// fit to every rank with a slot left. T is the smallest budget (bisection, to 1e-3) in
// [lo, hi] that fits every unit on the ranks. Empty when even `hi` does not.
// O(units · (log units + log ranks) · log((hi − lo) / (1e-3·hi))).
std::vector<std::vector<std::int64_t>> PackedRanks(const Units& units, std::int64_t num_ranks_in,
                                                   std::int64_t stages, std::int64_t m, double lo,
                                                   double hi, bool equal_counts) {
  const std::size_t n = units.cost.size();
  // By largest sequence, then cost, descending (ties: index).
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return std::tie(units.largest[b], units.cost[b]) < std::tie(units.largest[a], units.cost[a]);
  });
  const std::size_t num_ranks = static_cast<std::size_t>(num_ranks_in);
  const double p1 = static_cast<double>(stages - 1);
  const double md = static_cast<double>(m);
  // A max segment tree over the ranks' remaining room finds the first rank with room
  // for a unit in O(log ranks); unopened ranks have room -1 until opened.
  std::size_t leaves = 1;
  while (leaves < num_ranks) leaves *= 2;
  std::vector<double> tree(2 * leaves);
  std::vector<std::size_t> rank_of(n);
  auto set = [&](std::size_t r, double v) {
    std::size_t i = leaves + r;
    tree[i] = v;
    for (i /= 2; i >= 1; i /= 2) tree[i] = std::max(tree[2 * i], tree[2 * i + 1]);
  };
  auto first_with = [&](double need) -> std::size_t {  // leaves if none
    if (tree[1] < need) return leaves;
    std::size_t i = 1;
    while (i < leaves) i = tree[2 * i] >= need ? 2 * i : 2 * i + 1;
    return i - leaves;
  };
  // Per rank: cost, sequences (in the order added: descending), and the heaviest
  // micro-batch at least: its largest sequence and, at k·m + 1 sequences, the k + 1
  // last added together (k + 1 of the k·m + 1 largest share a micro-batch). Counted
  // per sequence only when every unit is one sequence.
  const bool singles = std::all_of(units.members.begin(), units.members.end(),
                                   [](const auto& members) { return members.size() == 1; });
  std::vector<double> cost(num_ranks), high(num_ranks), tail(num_ranks);
  std::vector<std::vector<double>> held(num_ranks);
  // Equal counts: `quota` units per rank, `extra` ranks one more (`extra_used` so far);
  // a rank that holds long units keeps `reserve` per slot it must still fill.
  const std::size_t quota = equal_counts ? n / num_ranks : 0;
  const std::size_t extra = equal_counts ? n % num_ranks : 0;
  std::size_t extra_used = 0;
  double reserve = 0.0;
  auto full = [&](std::size_t r) {
    const std::size_t held_r = held[r].size();
    return equal_counts && (held_r > quota || (held_r == quota && extra_used == extra));
  };
  auto spare = [&](std::size_t r, double t) {  // the cost rank r can still take
    double free = std::min(t - p1 * high[r], t * md / (md + p1)) - cost[r];
    // At k·m sequences the next one, c, makes the heaviest at least tail + c.
    const std::int64_t n_r = static_cast<std::int64_t>(held[r].size());
    if (singles && n_r > 0 && n_r % m == 0) {
      free = std::min(free, (t - cost[r] - p1 * tail[r]) / (1 + p1));
    }
    return free;
  };
  auto room = [&](std::size_t r, double t) {  // spare(), less the reserve; -1 when full
    if (full(r)) return -1.0;
    double free = spare(r, t);
    if (reserve > 0.0 && held[r].size() + 1 < quota) {
      free -= static_cast<double>(quota - held[r].size() - 1) * reserve;
    }
    return free;
  };
  auto most_room = [&]() {
    std::size_t i = 1;
    while (i < leaves) i = tree[2 * i] >= tree[2 * i + 1] ? 2 * i : 2 * i + 1;
    return i - leaves;
  };
  // By rank, its units in the order added (equal counts only).
  std::vector<std::vector<std::size_t>> members(num_ranks);
  auto open = [&](std::size_t r) {
    members[r].clear();
    cost[r] = 0.0;
    held[r].clear();
    high[r] = 0.0;
  };
  // Adds unit u to rank r (without updating the tree).
  auto add = [&](std::size_t r, std::size_t u) {
    const double c = static_cast<double>(units.cost[u]);
    cost[r] += c;
    held[r].push_back(c);
    high[r] = std::max(high[r], static_cast<double>(units.largest[u]));
    const std::int64_t n_r = static_cast<std::int64_t>(held[r].size());
    if (singles && n_r > 1 && n_r % m == 1) high[r] = std::max(high[r], tail[r] + c);
    if (singles && n_r % m == 0) {  // the last n_r / m sequences
      tail[r] = 0.0;
      for (std::int64_t j = n_r - n_r / m; j < n_r; ++j) tail[r] += held[r][j];
    }
    if (equal_counts && held[r].size() == quota + 1 && ++extra_used == extra) {
      for (std::size_t s = 0; s < num_ranks; ++s) {  // ranks at the quota are now full
        if (tree[leaves + s] >= 0.0 && full(s)) set(s, -1.0);
      }
    }
    rank_of[u] = r;
    if (equal_counts) members[r].push_back(u);
  };
  // Long units first fit; returns the ranks opened, or num_ranks + 1 when some unit
  // fits nowhere.
  auto place_long = [&](double t, std::size_t end) -> std::size_t {
    std::fill(tree.begin(), tree.end(), -1.0);
    extra_used = 0;
    std::size_t opened = 0;
    for (std::size_t j = 0; j < end; ++j) {
      const std::size_t u = order[j];
      const double c = static_cast<double>(units.cost[u]);
      std::size_t r = first_with(c);
      if (r == leaves) {
        if (opened == num_ranks) return num_ranks + 1;
        r = opened++;
        open(r);
        high[r] = static_cast<double>(units.largest[u]);
        if (room(r, t) < c) return num_ranks + 1;
      }
      add(r, u);
      set(r, room(r, t));
    }
    return opened;
  };
  auto fits = [&](double t) {
    std::fill(tree.begin(), tree.end(), -1.0);
    const double short_below = t / (md + p1);
    reserve = 0.0;
    std::size_t opened = 0;
    for (const std::size_t u : order) {
      const double c = static_cast<double>(units.cost[u]);
      if (singles && static_cast<double>(units.largest[u]) < short_below) {
        // Short units: onto the rank with the most room (worst fit), every rank open.
        for (; opened < num_ranks; ++opened) {
          open(opened);
          set(opened, room(opened, t));
        }
        const std::size_t r = most_room();
        if (tree[leaves + r] < c) return false;
        add(r, u);
        set(r, room(r, t));
        continue;
      }
      std::size_t r = first_with(c);
      if (r == leaves) {
        if (opened == num_ranks) return false;
        r = opened++;
        open(r);
        high[r] = static_cast<double>(units.largest[u]);
        if (room(r, t) < c) return false;
      }
      add(r, u);
      set(r, room(r, t));
    }
    return true;
  };
  // Equal counts. The cheapest units first (ties: index), for the fillers.
  std::vector<std::size_t> by_cost;
  std::vector<char> taken;               // by unit: placed as a filler
  std::vector<std::size_t> pool;         // the short units, cheapest first
  std::vector<std::size_t> position;     // by unit: its place in the pool
  std::vector<std::int64_t> free_count;  // Fenwick tree: pool units not placed
  std::vector<std::size_t> before;
  if (equal_counts) {
    by_cost.resize(n);
    std::iota(by_cost.begin(), by_cost.end(), 0);
    std::stable_sort(by_cost.begin(), by_cost.end(),
                     [&](std::size_t a, std::size_t b) { return units.cost[a] < units.cost[b]; });
    taken.resize(n);
    position.resize(n);
  }
  std::vector<std::size_t> fillers;
  auto fits_equal = [&](double t) {
    const double short_below = t / (md + p1);
    const std::size_t end = static_cast<std::size_t>(
        std::partition_point(
            order.begin(), order.end(),
            [&](std::size_t u) { return static_cast<double>(units.largest[u]) >= short_below; }) -
        order.begin());
    // The fillers: the cheapest short units, one per slot the long ranks leave; the
    // reserve is their mean cost (a few rounds, as the slots depend on it).
    std::size_t opened = 0;
    reserve = 0.0;
    for (int round = 0; round < 4; ++round) {
      opened = place_long(t, end);
      if (opened > num_ranks) return false;
      std::size_t slots = 0;
      for (std::size_t r = 0; r < opened; ++r) slots += quota - std::min(quota, held[r].size());
      fillers.clear();
      double sum = 0.0;
      for (std::size_t j = 0; j < n && fillers.size() < slots; ++j) {
        const std::size_t u = by_cost[j];
        if (static_cast<double>(units.largest[u]) >= short_below) continue;
        fillers.push_back(u);
        sum += static_cast<double>(units.cost[u]);
      }
      if (fillers.size() < slots) return false;
      const double mean = slots == 0 ? 0.0 : sum / static_cast<double>(slots);
      if (mean <= reserve * (1.0 + 1e-3) + 1e-9) break;
      reserve = mean;
    }
    reserve = 0.0;
    // The fillers, most costly first, worst fit onto the long ranks short of the quota.
    for (std::size_t r = 0; r < opened; ++r) set(r, held[r].size() < quota ? room(r, t) : -1.0);
    for (std::size_t j = fillers.size(); j-- > 0;) {
      const std::size_t u = fillers[j];
      const std::size_t r = most_room();
      if (tree[leaves + r] < static_cast<double>(units.cost[u])) return false;
      add(r, u);
      set(r, held[r].size() < quota ? room(r, t) : -1.0);
    }
    // Room left on a long rank: its fillers, cheapest first, each swapped for the
    // costliest short unit not placed yet that still fits (Fenwick trees over the
    // short units by cost find it), taking cost off the other ranks.
    for (const std::size_t u : pool) taken[u] = 0;
    pool.clear();
    for (const std::size_t u : by_cost) {
      if (static_cast<double>(units.largest[u]) < short_below) {
        position[u] = pool.size();
        pool.push_back(u);
      }
    }
    const std::size_t size = pool.size();
    std::size_t top_bit = 1;
    while (top_bit * 2 <= size) top_bit *= 2;
    free_count.assign(size + 1, 0);
    for (std::size_t i = 1; i <= size; ++i) {
      free_count[i] += 1;
      const std::size_t parent = i + (i & (~i + 1));
      if (parent <= size) free_count[parent] += free_count[i];
    }
    auto mark = [&](std::size_t u, bool take) {
      taken[u] = take ? 1 : 0;
      for (std::size_t i = position[u] + 1; i <= size; i += i & (~i + 1)) {
        free_count[i] += take ? -1 : 1;
      }
    };
    // The costliest free unit at or below cap, or size when none.
    auto costliest = [&](double cap) {
      std::size_t below =
          static_cast<std::size_t>(std::upper_bound(pool.begin(), pool.end(), cap,
                                                    [&](double v, std::size_t u) {
                                                      return v < static_cast<double>(units.cost[u]);
                                                    }) -
                                   pool.begin());
      std::int64_t k = 0;  // free units in [1, below]
      for (std::size_t i = below; i > 0; i -= i & (~i + 1)) k += free_count[i];
      if (k == 0) return size;
      std::size_t pos = 0;  // the k-th free unit: the last position with fewer before it
      for (std::size_t bit = top_bit; bit > 0; bit /= 2) {
        if (pos + bit <= size && free_count[pos + bit] < k) {
          pos += bit;
          k -= free_count[pos];
        }
      }
      return pos;
    };
    for (const std::size_t u : fillers) mark(u, true);
    for (std::size_t r = 0; r < opened; ++r) {
      double budget = spare(r, t);
      if (budget <= 0.0) continue;
      before = members[r];
      bool changed = false;
      // members[r]: its long units, then its fillers, most costly first.
      for (std::size_t j = members[r].size(); j-- > 0 && budget > 0.0;) {
        const std::size_t f = members[r][j];
        if (static_cast<double>(units.largest[f]) >= short_below) break;
        const double c = static_cast<double>(units.cost[f]);
        const std::size_t pos = costliest(c + budget);
        if (pos == size || static_cast<double>(units.cost[pool[pos]]) <= c) continue;
        const std::size_t g = pool[pos];
        mark(g, true);
        mark(f, false);
        members[r][j] = g;
        budget -= static_cast<double>(units.cost[g]) - c;
        changed = true;
      }
      if (!changed) continue;
      auto rebuild = [&](std::vector<std::size_t> list) {
        std::stable_sort(list.begin(), list.end(), [&](std::size_t a, std::size_t b) {
          return units.cost[a] > units.cost[b];
        });
        if (held[r].size() > quota) --extra_used;
        open(r);
        for (const std::size_t u : list) add(r, u);
      };
      const std::vector<std::size_t> upgraded = members[r];
      rebuild(upgraded);
      if (spare(r, t) < 0.0) {  // the micro-batch sharing grew: undo
        // Only the short units are in the pool (the rank's long units are not, and
        // marking them would corrupt the counts of free short units).
        auto is_short = [&](std::size_t u) {
          return static_cast<double>(units.largest[u]) < short_below;
        };
        for (const std::size_t u : upgraded) {
          if (is_short(u)) mark(u, false);
        }
        for (const std::size_t u : before) {
          if (is_short(u)) mark(u, true);
        }
        rebuild(before);
      }
    }
    // The other short units worst fit onto every rank with a slot left.
    for (std::size_t r = 0; r < num_ranks; ++r) {
      if (r >= opened) open(r);
      set(r, room(r, t));
    }
    bool ok = true;
    for (std::size_t j = end; j < n && ok; ++j) {
      const std::size_t u = order[j];
      if (taken[u]) continue;
      const std::size_t r = most_room();
      if (tree[leaves + r] < static_cast<double>(units.cost[u])) {
        ok = false;
        break;
      }
      add(r, u);
      set(r, room(r, t));
    }
    return ok;
  };
  auto test = [&](double t) { return equal_counts ? fits_equal(t) : fits(t); };
  // The budget is usually just above lo: bracket it from there.
  for (double top = std::min(hi, lo * 1.0625);; top = std::min(hi, top * 1.25)) {
    if (test(top)) {
      hi = top;
      break;
    }
    if (top >= hi) return {};
    lo = top;
  }
  for (int iteration = 0; iteration < 40 && hi - lo > 1e-3 * hi; ++iteration) {
    const double mid = (lo + hi) / 2;
    (test(mid) ? hi : lo) = mid;
  }
  test(hi);
  std::vector<std::vector<std::int64_t>> ranks(num_ranks);
  for (std::size_t u = 0; u < n; ++u) {
    for (const std::int64_t i : units.members[u]) ranks[rank_of[u]].push_back(i);
  }
  for (auto& rank : ranks) std::sort(rank.begin(), rank.end());
  return ranks;
}

namespace {

std::int64_t TotalTokens(const Padded& padded) {
  return std::accumulate(padded.tokens.begin(), padded.tokens.end(), std::int64_t{0});
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
                  std::min(best, 4.0 * least), options.equal_size);
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
// (ties: the first candidate).
StepPlan Choose(std::vector<StepPlan> candidates, double tolerance) {
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
  return std::move(candidates[chosen]);
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
          Pack(mine, m, mb.max_tokens_per_micro_batch, mb.refine, start);
      plan.ranks.push_back(MakeRankPlan(padded, mine, m, *refined, mb));
      plan.predicted_step_time = std::max(plan.predicted_step_time, plan.ranks.back().time);
    }
    plan.empty_micro_batches = EmptyMicroBatches(plan);
    return plan;
  }
  return std::nullopt;
}

// The step's totals, empty ranks and overhead on a finished plan (its empty
// micro-batches are counted where it is made).
void SetTotals(const Padded& padded, const MicroBatchOptions& mb, StepPlan& plan) {
  plan.overhead = Overhead(mb);
  plan.sequences = static_cast<std::int64_t>(padded.tokens.size());
  plan.tokens = TotalTokens(padded);
  plan.unpadded_tokens =
      std::accumulate(padded.lengths.begin(), padded.lengths.end(), std::int64_t{0});
  plan.empty_ranks = 0;
  for (const RankPlan& rank : plan.ranks) plan.empty_ranks += rank.sequences == 0 ? 1 : 0;
}

}  // namespace

PlannedStep PlanStep(std::span<const std::int64_t> lengths, std::span<const std::int64_t> groups,
                     const StepOptions& unresolved) {
  CheckStepOptions(unresolved);
  StepOptions options = unresolved;
  options.micro_batch = Resolved(unresolved.micro_batch);
  const MicroBatchOptions& mb = options.micro_batch;
  const Padded padded = Pad(lengths, mb);
  const Movable movable{options.keep_groups ? groups : std::span<const std::int64_t>{},
                        options.equal_size};

  // Sequences to ranks: the balancer on the padded lengths' cost.
  BalanceOptions balance;
  balance.partition.num_parts = options.num_ranks;
  balance.partition.equal_size = options.equal_size;
  balance.partition.refine = mb.refine;
  balance.cost = mb.cost;
  balance.keep_groups = options.keep_groups;
  const BalanceResult ranks = Balance(padded.tokens, groups, balance);

  // The lower bound first: its best count guides the packed candidate below. With
  // whole groups the heaviest rank holds at least the balancer's bound over groups.
  // With a pipeline the bound also knows the units (whole groups) and equal counts.
  const std::int64_t max_unit = options.keep_groups ? ranks.partition.lower_bound : 0;
  const Units units =
      mb.pipeline_stages > 1 ? MakeUnits(padded, groups, options.keep_groups) : Units{};
  // The bound of plans without an empty micro-batch, what the planner makes unless the
  // input forces one (then the bound is taken again, allowing them).
  auto bound_of = [&](Empties empties) {
    return StepLowerBound(padded, max_unit, {units.cost, units.largest}, options.equal_size,
                          empties, options);
  };
  const StepBound bound = bound_of(Empties::kNone);

  PlannedStep result;
  const std::int64_t num_units = static_cast<std::int64_t>(lengths.size());
  const bool pipeline = mb.pipeline_stages > 1 && num_units * options.num_ranks <= kMaxGreedyPairs;
  // Every candidate planned is kept: Choose may prefer one with fewer micro-batches
  // within the count tolerance of the best. Candidates that cannot beat the best are
  // not planned (PlanForRanks's stop_at), which keeps large inputs fast.
  std::vector<StepPlan> candidates;
  std::int64_t best = std::numeric_limits<std::int64_t>::max();
  auto take = [&](StepPlan plan) {
    if (plan.ranks.empty()) return;  // pruned
    best = std::min(best, plan.predicted_step_time);
    candidates.push_back(std::move(plan));
  };
  // With a pipeline the packed candidate comes first at the bound's best count (the
  // most micro-batches the ranks can fill without an overhead): the other candidates
  // then skip the counts, or whole plans, that cannot come near it (see PlanForRanks).
  const bool packed_first = pipeline && bound.count > 0;
  if (packed_first) {
    if (auto packed = PackedPlan(padded, units, movable, options, bound.value, bound.count,
                                 std::numeric_limits<double>::infinity())) {
      take(std::move(*packed));
    }
  }
  // The balancer's assignment (not planned when it cannot come near the packed one).
  StepPlan balanced = PlanForRanks(padded, PartsOf(ranks.partition), movable, mb, 0, best);
  const std::int64_t m0 =
      balanced.ranks.empty()
          ? std::max(bound.count,
                     SmallestCount(CeilDiv(TotalTokens(padded), options.num_ranks), mb))
          : balanced.num_micro_batches;
  take(std::move(balanced));
  if (pipeline) {
    // Else the packed candidate at the balancer's count.
    if (!packed_first) {
      if (auto packed = PackedPlan(padded, units, movable, options, bound.value, m0,
                                   static_cast<double>(best))) {
        take(std::move(*packed));
      }
    }
    // And the time-aware assignment for the balancer's count.
    take(PlanForRanks(padded, TimeAwareRanks(units, options, m0), movable, mb, 0, best));
  }

  result.baseline = Baseline(padded, options);
  // Without groups or empty micro-batches the baseline's bound is the same one.
  const Empties baseline_empties =
      result.baseline.empty_micro_batches > 0 ? Empties::kAllowed : Empties::kNone;
  result.baseline.lower_bound = options.keep_groups || baseline_empties == Empties::kAllowed
                                    ? UngroupedBound(padded, false, baseline_empties, options)
                                    : bound.value;
  SetTotals(padded, mb, result.baseline);
  // The baseline's plan is a valid answer when it keeps the cap (it ignores groups).
  if (!options.keep_groups && result.baseline.cap_violations == 0) {
    candidates.push_back(result.baseline);
  }
  // Empty micro-batches left by every candidate: try the bins-first assignment.
  if (LeastEmpty(candidates) > 0 && !options.keep_groups && !options.equal_size) {
    if (auto bins_first = BinsFirstPlan(padded, options))
      candidates.push_back(std::move(*bins_first));
  }
  result.plan = Choose(std::move(candidates), mb.count_tolerance);
  result.plan.lower_bound =
      result.plan.empty_micro_batches > 0 ? bound_of(Empties::kAllowed).value : bound.value;
  result.plan.cap_violations = 0;
  SetTotals(padded, mb, result.plan);
  return result;
}

StepPlan PlanBaseline(std::span<const std::int64_t> lengths, const StepOptions& unresolved) {
  CheckStepOptions(unresolved);
  StepOptions options = unresolved;
  options.micro_batch = Resolved(unresolved.micro_batch);
  const Padded padded = Pad(lengths, options.micro_batch);
  StepPlan plan = Baseline(padded, options);
  plan.lower_bound =
      UngroupedBound(padded, options.equal_size && !options.keep_groups,
                     plan.empty_micro_batches > 0 ? Empties::kAllowed : Empties::kNone, options);
  SetTotals(padded, options.micro_batch, plan);
  return plan;
}

}  // namespace rlsched::balance
