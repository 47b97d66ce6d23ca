#include "rlsched/balance/micro_batch.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
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
  CheckAtLeast(options.overhead, 0, "overhead");
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

// The sequences of one rank, padded: `tokens` and `costs` by local index, `global`
// maps a local index to its sequence index.
struct RankItems {
  std::vector<std::int64_t> tokens;
  std::vector<std::int64_t> costs;
  std::vector<std::int64_t> global;
  std::int64_t total_tokens = 0;
  std::int64_t total_cost = 0;
};

// Padded lengths and their costs for the whole batch, checked against the cap.
struct Padded {
  std::vector<std::int64_t> tokens;
  std::vector<std::int64_t> costs;
};

Padded Pad(std::span<const std::int64_t> lengths, const MicroBatchOptions& options) {
  internal::CheckWeights(lengths, "lengths");
  Padded padded;
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
    const std::int64_t t = internal::CheckedAdd(b.cost, options.overhead, "overhead");
    sum = internal::CheckedAdd(sum, t, "overhead");
    max = std::max(max, t);
  }
  return internal::CheckedAdd(
      sum, internal::CheckedMul(options.pipeline_stages - 1, max, "pipeline_stages"),
      "pipeline_stages");
}

// Builds the rank's micro-batches from a packing and orders them.
RankPlan MakeRankPlan(const RankItems& items, std::int64_t m, const Assignment& assignment,
                      const MicroBatchOptions& options) {
  std::vector<MicroBatch> batches(static_cast<std::size_t>(m));
  for (std::size_t i = 0; i < assignment.size(); ++i) {
    MicroBatch& b = batches[static_cast<std::size_t>(assignment[i])];
    b.indices.push_back(items.global[i]);
    b.tokens += items.tokens[i];
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
  plan.tokens = items.total_tokens;
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
  const double o = static_cast<double>(options.overhead);
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

}  // namespace

RankPlan PlanMicroBatches(std::span<const std::int64_t> lengths, const MicroBatchOptions& options) {
  CheckOptions(options);
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
  std::int64_t m = search.feasible_count;
  RankPlan best = MakeRankPlan(items, m, *search.packing, options);
  const std::int64_t q = options.micro_batches_multiple_of;
  const std::int64_t last = std::max(m, RoundUp(static_cast<std::int64_t>(items.tokens.size()), q));
  for (int tried = 0; tried < kMaxCountsTried && m + q <= last; ++tried) {
    m += q;
    if (TimeBound(static_cast<double>(items.total_cost), max_item, m, options) >=
        static_cast<double>(best.time)) {
      break;
    }
    const auto packing =
        Pack(items, m, options.max_tokens_per_micro_batch, options.refine, search.packing);
    RankPlan plan = MakeRankPlan(items, m, *packing, options);
    if (plan.time < best.time) best = std::move(plan);
  }
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

// A bound from every rank's largest sequence, for p > 1. A rank's time is at least
// C_r + (p-1)·L_r (its cost, and the pipeline's fill and drain behind its heaviest
// micro-batch, which holds its largest sequence L_r), so R·T >= C + (p-1)·Σ_r L_r;
// the launch overheads of the m micro-batches come on top (the caller adds them).
// For Σ_r L_r: every sequence above x lies on a rank with L_r > x, whose cost is
// below T - (p-1)·x; so at least k_x = B_x / (T - (p-1)·x) ranks (B_x: the cost of
// the sequences above x), at most R, have L_r > x, and Σ_r L_r = ∫ #{r : L_r > x} dx
// >= ∫ min(R, max(1, k_x)) dx over x < the largest cost. The smallest T that
// satisfies R·T >= C + (p-1)·∫... (a bisection; the right side falls as T grows)
// bounds the step time (to 1e-4). O(n log n + n · 14).
double LargestSequenceBound(std::vector<std::int64_t> costs, std::int64_t num_ranks,
                            std::int64_t stages) {
  if (stages <= 1 || costs.empty()) return 0.0;
  std::sort(costs.begin(), costs.end(), std::greater<>());
  const double a = static_cast<double>(stages - 1);
  const double r = static_cast<double>(num_ranks);
  double total = 0.0;
  for (const std::int64_t c : costs) total += static_cast<double>(c);
  // ∫ over [x0, x1) of min(R, max(1, B / (t - a·x))) dx, with t > a·x1.
  auto piece = [&](double b, double t, double x0, double x1) {
    const double one = (t - b) / a;      // where B / (t - a·x) reaches 1
    const double all = (t - b / r) / a;  // where it reaches R
    double sum = 0.0;
    const double lo1 = std::min(std::max(x0, one), x1);  // [x0, lo1): value 1
    sum += lo1 - x0;
    const double hi = std::min(std::max(lo1, all), x1);  // [lo1, hi): B / (t - a·x)
    if (hi > lo1) sum += b / a * std::log((t - a * lo1) / (t - a * hi));
    sum += (x1 - hi) * r;  // [hi, x1): R
    return sum;
  };
  auto feasible = [&](double t) {
    double largest_sum = 0.0, b = 0.0;
    // Between consecutive distinct costs, B_x is the cost of the sequences above x.
    for (std::size_t i = 0; i < costs.size();) {
      const double v = static_cast<double>(costs[i]);
      while (i < costs.size() && static_cast<double>(costs[i]) == v) {
        b += static_cast<double>(costs[i]);
        ++i;
      }
      const double next = i < costs.size() ? static_cast<double>(costs[i]) : 0.0;
      largest_sum += piece(b, t, next, v);
    }
    return r * t >= total + a * largest_sum;
  };
  const double largest = static_cast<double>(costs.front());
  double lo = a * largest, hi = total + a * largest * r + 1.0;  // infeasible, feasible
  if (largest == 0.0) return 0.0;
  for (int iteration = 0; iteration < 64 && hi - lo > 1e-4 * hi; ++iteration) {
    const double mid = (lo + hi) / 2;
    (feasible(mid) ? hi : lo) = mid;
  }
  return lo * (1.0 - 1e-9);  // below the threshold despite rounding
}

// No plan with any rank assignment has a smaller step time (see TimeBound): the
// heaviest rank costs at least max(total / R, largest unit), and some micro-batch
// count m >= ceil(total tokens / R / cap) (honouring the minimum and the multiple)
// must be used. TimeBound is convex in m, so the best m is next to the real minimiser.
std::int64_t StepLowerBound(const Padded& padded, std::int64_t max_unit_cost,
                            const StepOptions& options) {
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
  const long double o = static_cast<long double>(mb.overhead);
  const long double spread = heaviest * (p - 1.0L);  // f(m) = max(heaviest + spread/m, p·max)
  const long double floor_term = p * static_cast<long double>(max_item);
  auto f = [&](long double m) {
    return std::max(heaviest + spread / m, floor_term) + m * o + (p - 1.0L) * o;
  };
  const std::int64_t first = SmallestCount(CeilDiv(total_tokens, options.num_ranks), mb);
  const long double q = static_cast<long double>(mb.micro_batches_multiple_of);
  long double best_m = std::numeric_limits<long double>::infinity();
  if (o > 0) best_m = std::sqrt(spread / o);
  if (floor_term > heaviest && spread > 0)
    best_m = std::min(best_m, spread / (floor_term - heaviest));
  long double value;
  if (std::isinf(best_m)) {
    value = heaviest + (p - 1.0L) * o;  // the infimum as m grows
  } else {
    const long double steps = std::max(0.0L, std::floor((best_m - first) / q));
    const long double m1 = first + steps * q;
    value = std::min(f(m1), f(m1 + q));
    if (spread == 0) value = f(static_cast<long double>(first));
  }
  // With launch overheads: T >= C_r + m·o + (p-1)·(L_r + o), and m >= first.
  if (mb.pipeline_stages > 1) {
    value =
        std::max(value, LargestSequenceBound(padded.costs, options.num_ranks, mb.pipeline_stages) +
                            (static_cast<long double>(first) + p - 1.0L) * o);
  }
  const long double limit = static_cast<long double>(std::numeric_limits<std::int64_t>::max());
  return value >= limit ? std::numeric_limits<std::int64_t>::max()
                        : static_cast<std::int64_t>(std::floor(value));
}

}  // namespace

namespace {

// The best plan for a given assignment of sequences to ranks (rank r holds
// `ranks[r]`): the smallest count every rank can pack, then larger counts while the
// bound says they may help. With only_count > 0, the plan at that count alone
// (raised to the smallest feasible count, rounded to the multiple, at most one
// micro-batch per sequence of the fullest rank).
StepPlan PlanForRanks(const Padded& padded, const std::vector<std::vector<std::int64_t>>& ranks,
                      const MicroBatchOptions& mb, std::int64_t only_count = 0) {
  const std::int64_t cap = mb.max_tokens_per_micro_batch;
  const std::int64_t q = mb.micro_batches_multiple_of;
  std::vector<RankSearch> searches;
  std::int64_t from = 0;
  std::int64_t most_items = 0;
  for (const auto& rank : ranks) {
    searches.push_back(RankSearch{Gather(padded, rank), 0, std::nullopt});
    from = std::max(from, SmallestCount(searches.back().items.total_tokens, mb));
    most_items = std::max(most_items, static_cast<std::int64_t>(rank.size()));
  }
  // With one count asked for, the feasibility search starts there (one packing per
  // rank when every rank fits).
  if (only_count > 0) {
    from = std::min(std::max(from, RoundUp(only_count, q)), std::max(from, RoundUp(most_items, q)));
  }
  std::int64_t m = from;
  for (RankSearch& search : searches) {
    search = FindFeasible(std::move(search.items), from, mb);
    m = std::max(m, search.feasible_count);
  }
  auto plan_with = [&](std::int64_t count) {
    StepPlan plan;
    plan.num_micro_batches = count;
    for (const RankSearch& search : searches) {
      const auto packing = search.feasible_count == count
                               ? search.packing
                               : Pack(search.items, count, cap, mb.refine, search.packing);
      plan.ranks.push_back(MakeRankPlan(search.items, count, *packing, mb));
      plan.predicted_step_time = std::max(plan.predicted_step_time, plan.ranks.back().time);
    }
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

  const std::int64_t last = std::max(m, RoundUp(most_items, q));
  if (only_count > 0) return plan_with(m);
  StepPlan best = plan_with(m);
  for (int tried = 0; tried < kMaxCountsTried && m + q <= last; ++tried) {
    m += q;
    if (bound_with(m) >= static_cast<double>(best.predicted_step_time)) break;
    StepPlan plan = plan_with(m);
    if (plan.predicted_step_time < best.predicted_step_time) best = std::move(plan);
  }
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

}  // namespace

// With a pipeline, a rank pays (p − 1) times its heaviest micro-batch, which holds
// its largest sequence: spreading the longest sequences one per rank makes every rank
// pay for one. This packs instead: units by largest sequence, longest first, each into
// the first rank that still has room (first fit), where a rank led by a sequence of
// cost a has room for cost up to min(T − (p − 1)·a, T·m / (m + p − 1)); T is the
// smallest budget (bisection, to 1e-3) in [lo, hi] that fits every unit on the ranks.
// Empty when even `hi` does not. O(units · (log units + log ranks · 15)).
std::vector<std::vector<std::int64_t>> PackedRanks(const Units& units, std::int64_t num_ranks_in,
                                                   std::int64_t stages, std::int64_t m, double lo,
                                                   double hi) {
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
  auto fits = [&](double t) {
    std::fill(tree.begin(), tree.end(), -1.0);
    std::size_t opened = 0;
    for (const std::size_t u : order) {
      const double c = static_cast<double>(units.cost[u]);
      std::size_t r = first_with(c);
      if (r == leaves) {
        if (opened == num_ranks) return false;
        r = opened++;
        const double room =
            std::min(t - p1 * static_cast<double>(units.largest[u]), t * md / (md + p1));
        if (room < c) return false;
        set(r, room);
      }
      set(r, tree[leaves + r] - c);
      rank_of[u] = r;
    }
    return true;
  };
  if (!fits(hi)) return {};
  for (int iteration = 0; iteration < 40 && hi - lo > 1e-3 * hi; ++iteration) {
    const double mid = (lo + hi) / 2;
    (fits(mid) ? hi : lo) = mid;
  }
  fits(hi);
  std::vector<std::vector<std::int64_t>> ranks(num_ranks);
  for (std::size_t u = 0; u < n; ++u) {
    for (const std::int64_t i : units.members[u]) ranks[rank_of[u]].push_back(i);
  }
  for (auto& rank : ranks) std::sort(rank.begin(), rank.end());
  return ranks;
}

PlannedStep PlanStep(std::span<const std::int64_t> lengths, std::span<const std::int64_t> groups,
                     const StepOptions& options) {
  CheckStepOptions(options);
  const MicroBatchOptions& mb = options.micro_batch;
  const Padded padded = Pad(lengths, mb);

  // Sequences to ranks: the balancer on the padded lengths' cost.
  BalanceOptions balance;
  balance.partition.num_parts = options.num_ranks;
  balance.partition.equal_size = options.equal_size;
  balance.partition.refine = mb.refine;
  balance.cost = mb.cost;
  balance.keep_groups = options.keep_groups;
  const BalanceResult ranks = Balance(padded.tokens, groups, balance);

  PlannedStep result;
  result.plan = PlanForRanks(padded, PartsOf(ranks.partition), mb);
  // With a pipeline, also the time-aware assignment for the count just chosen.
  const std::int64_t num_units = static_cast<std::int64_t>(lengths.size());
  if (mb.pipeline_stages > 1 && num_units * options.num_ranks <= kMaxGreedyPairs) {
    const Units units = MakeUnits(padded, groups, options.keep_groups);
    StepPlan plan =
        PlanForRanks(padded, TimeAwareRanks(units, options, result.plan.num_micro_batches), mb);
    if (plan.predicted_step_time < result.plan.predicted_step_time) result.plan = std::move(plan);
    // And the long sequences packed together (without equal counts). That pays off
    // through many more micro-batches than the plan so far uses (the bubble then
    // shrinks to the packed ranks' largest sequences), so it is tried only when the
    // count m at which C + (p − 1)·C/m + m·o is least for the mean rank cost C is at
    // least twice the current one (8 times it without overhead), and planned only
    // when the packing's relaxed time (each rank's heaviest micro-batch at
    // max(C_r / m, its largest sequence), a bound on its plan) beats the plan so far.
    const std::int64_t m0 = result.plan.num_micro_batches;
    const double p1 = static_cast<double>(mb.pipeline_stages - 1);
    const double o = static_cast<double>(mb.overhead);
    double total = 0.0;
    for (const std::int64_t c : padded.costs) total += static_cast<double>(c);
    const double mean = total / static_cast<double>(options.num_ranks);
    const std::int64_t m =
        o > 0 ? std::min<std::int64_t>(std::llround(std::sqrt(p1 * mean / o)), 8 * m0) : 8 * m0;
    if (!options.equal_size && m >= 2 * m0) {
      const double best = static_cast<double>(result.plan.predicted_step_time);
      const std::vector<std::vector<std::int64_t>> packed =
          PackedRanks(units, options.num_ranks, mb.pipeline_stages, m, mean, best);
      double relaxed = 0.0;
      for (const auto& rank : packed) {
        double cost = 0.0, largest = 0.0;
        for (const std::int64_t i : rank) {
          const double c = static_cast<double>(padded.costs[static_cast<std::size_t>(i)]);
          cost += c;
          largest = std::max(largest, c);
        }
        const double md = static_cast<double>(m);
        relaxed = std::max(relaxed, cost + p1 * std::max(cost / md, largest) + (md + p1) * o);
      }
      if (!packed.empty() && relaxed < best) {
        StepPlan packed_plan = PlanForRanks(padded, packed, mb, m);
        if (packed_plan.predicted_step_time < result.plan.predicted_step_time) {
          result.plan = std::move(packed_plan);
        }
      }
    }
  }

  result.baseline = PlanBaseline(lengths, options);
  // The baseline's plan is a valid answer when it keeps the cap (it ignores groups).
  if (!options.keep_groups && result.baseline.cap_violations == 0 &&
      result.baseline.predicted_step_time < result.plan.predicted_step_time) {
    result.plan = result.baseline;
  }
  // With whole groups the heaviest rank holds at least the balancer's bound over groups.
  const std::int64_t max_unit = options.keep_groups ? ranks.partition.lower_bound : 0;
  // Without groups the baseline's bound is the same one: computed once.
  result.plan.lower_bound =
      options.keep_groups ? StepLowerBound(padded, max_unit, options) : result.baseline.lower_bound;
  result.plan.cap_violations = 0;
  return result;
}

StepPlan PlanBaseline(std::span<const std::int64_t> lengths, const StepOptions& options) {
  CheckStepOptions(options);
  const MicroBatchOptions& mb = options.micro_batch;
  const Padded padded = Pad(lengths, mb);
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
    plan.ranks.push_back(MakeRankPlan(rank, m, assignment, mb));
    for (const MicroBatch& b : plan.ranks.back().micro_batches) {
      plan.cap_violations += b.tokens > mb.max_tokens_per_micro_batch ? 1 : 0;
    }
    plan.predicted_step_time = std::max(plan.predicted_step_time, plan.ranks.back().time);
  }
  plan.lower_bound = StepLowerBound(padded, 0, options);
  return plan;
}

}  // namespace rlsched::balance
