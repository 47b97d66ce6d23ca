// One rank's micro-batches under a hard token cap (PlanMicroBatches), and the
// pieces the step planner shares (micro_batch_internal.h): padding, packing a rank's
// sequences into m micro-batches, ordering them and timing the rank.

#include "rlsched/balance/micro_batch.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <optional>
#include <queue>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "internal.h"
#include "micro_batch_internal.h"
#include "rlsched/common/check.h"
#include "rlsched/common/error.h"

namespace rlsched::balance {
namespace internal {
namespace {

constexpr std::int64_t kMaxPipelineStages = 65536;

// Throws std::invalid_argument naming lengths[i] when `length` is above kMaxLength or,
// padded, above the cap (Pad()'s checks of one length); returns otherwise.
void CheckLength(std::int64_t length, std::size_t i, const MicroBatchOptions& options) {
  CheckAtMost({"lengths", i}, length, {kMaxLength, "2^31"});
  const std::int64_t t = RoundUp(length, options.pad_to_multiple_of);
  if (t > options.max_tokens_per_micro_batch) {
    rlsched::Fail("lengths[" + std::to_string(i) + "]",
                  "sequence of " + std::to_string(t) +
                      " tokens (padded) exceeds max_tokens_per_micro_batch = " +
                      std::to_string(options.max_tokens_per_micro_batch));
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

}  // namespace

std::optional<Assignment> LptOnTokens(const RankItems& items, std::int64_t m,
                                      std::span<const std::int32_t> by_tokens, std::int64_t cap) {
  const auto n = static_cast<std::int64_t>(items.tokens.size());
  // Only as many bins as items can receive one (as GreedyLptSorted).
  const auto bins = static_cast<std::size_t>(std::min(m, std::max<std::int64_t>(n, 1)));
  // Keys load · 2^32 + bin: one comparison orders by load, then bin; the sift picks
  // the lighter child without a branch.
  __extension__ typedef unsigned __int128 Key;
  std::vector<Key> heap(bins);  // ascending, so a min-heap
  for (std::size_t b = 0; b < bins; ++b) heap[b] = static_cast<Key>(b);
  Assignment assignment(items.tokens.size(), 0);
  for (const std::int32_t i : by_tokens) {
    const Key bin = heap.front() & 0xffff'ffffu;
    assignment[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(bin);
    const Key top =
        heap.front() + (static_cast<Key>(items.tokens[static_cast<std::size_t>(i)]) << 32);
    // The lightest bin goes over the cap: so would any (loads only grow).
    if (top >> 32 > static_cast<Key>(cap)) return std::nullopt;
    std::size_t hole = 0;
    for (;;) {
      std::size_t child = 2 * hole + 1;
      if (child >= bins) break;
      if (child + 1 < bins) child += heap[child + 1] < heap[child] ? 1 : 0;
      if (!(heap[child] < top)) break;
      heap[hole] = heap[child];
      hole = child;
    }
    heap[hole] = top;
  }
  return assignment;
}

// Moves items out of bins over the cap into the cheapest bins with room: the items by
// tokens, largest first (ties: lowest index), each still in a bin over the cap to the bin
// of least cost (ties: lowest index) among those with room for it. Returns false when
// some bin stays over the cap.
//
// O(n log n + n log m): as the items come largest first, the room a bin needs, t, only
// shrinks, so the bins with tokens <= cap − t only grow but for the two bins a move
// changes. Those are kept ordered by (cost, index) (`eligible`); the others wait in a
// min-heap by tokens (`waiting`, stale entries skipped by a per-bin version) until the
// threshold reaches them. (A scan of all m bins per item made this O(n·m), and m grows
// with n: quadratic in the rank's sequences.)
bool Repair(const RankItems& items, std::int64_t m, std::int64_t cap, Assignment& assignment) {
  return Repair(items, m, cap, HeaviestFirst(items.tokens), assignment);
}

bool Repair(const RankItems& items, std::int64_t m, std::int64_t cap,
            std::span<const std::int32_t> by_tokens, Assignment& assignment) {
  Loads loads = LoadsOf(items, m, assignment);
  if (WithinCap(loads, cap)) return true;  // no item would move
  const std::size_t bins = static_cast<std::size_t>(m);
  std::set<std::pair<std::int64_t, std::int64_t>> eligible;  // (cost, bin)
  struct Waiting {
    std::int64_t tokens;
    std::int64_t bin;
    std::uint32_t version;
    bool operator>(const Waiting& o) const {
      return tokens != o.tokens ? tokens > o.tokens : bin > o.bin;
    }
  };
  std::priority_queue<Waiting, std::vector<Waiting>, std::greater<>> waiting;
  std::vector<std::uint32_t> version(bins, 0);
  std::vector<char> is_eligible(bins, 0);
  for (std::size_t b = 0; b < bins; ++b) {
    waiting.push(Waiting{loads.tokens[b], static_cast<std::int64_t>(b), 0});
  }
  std::int64_t threshold = std::numeric_limits<std::int64_t>::min();
  // Bin b's tokens or cost are about to change: out of both structures.
  auto detach = [&](std::size_t b) {
    if (is_eligible[b]) {
      eligible.erase({loads.costs[b], static_cast<std::int64_t>(b)});
      is_eligible[b] = 0;
    } else {
      ++version[b];  // its waiting entry is stale
    }
  };
  auto attach = [&](std::size_t b) {
    if (loads.tokens[b] <= threshold) {
      eligible.emplace(loads.costs[b], static_cast<std::int64_t>(b));
      is_eligible[b] = 1;
    } else {
      waiting.push(Waiting{loads.tokens[b], static_cast<std::int64_t>(b), version[b]});
    }
  };
  for (const std::int32_t i : by_tokens) {
    const std::size_t from = static_cast<std::size_t>(assignment[static_cast<std::size_t>(i)]);
    if (loads.tokens[from] <= cap) continue;
    const std::int64_t t = items.tokens[static_cast<std::size_t>(i)];
    threshold = cap - t;  // never below an earlier one: t only shrinks
    while (!waiting.empty() && waiting.top().tokens <= threshold) {
      const Waiting w = waiting.top();
      waiting.pop();
      const std::size_t b = static_cast<std::size_t>(w.bin);
      if (w.version != version[b] || is_eligible[b]) continue;  // stale
      eligible.emplace(loads.costs[b], w.bin);
      is_eligible[b] = 1;
    }
    // `from` is over the cap, so above the threshold: never eligible.
    if (eligible.empty()) continue;
    const std::size_t to = static_cast<std::size_t>(eligible.begin()->second);
    detach(from);
    detach(to);
    assignment[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(to);
    loads.tokens[from] -= t;
    loads.tokens[to] += t;
    loads.costs[from] -= items.costs[static_cast<std::size_t>(i)];
    loads.costs[to] += items.costs[static_cast<std::size_t>(i)];
    attach(from);
    attach(to);
  }
  return WithinCap(loads, cap);
}

namespace {

// The largest room of a fixed number of bins, with the first bin whose room is at
// least a need: first-fit in O(log m) per item. `Room` holds every room (int32 when
// the cap fits: half the tree's memory, for the descents' cache misses).
template <typename Room>
class RoomTree {
 public:
  RoomTree(std::size_t size, std::int64_t room) {
    while (leaves_ < size) leaves_ *= 2;
    tree_.assign(2 * leaves_, -1);  // padding: never fits (every need is >= 0)
    std::fill(tree_.begin() + static_cast<std::ptrdiff_t>(leaves_),
              tree_.begin() + static_cast<std::ptrdiff_t>(leaves_ + size), static_cast<Room>(room));
    for (std::size_t i = leaves_; i-- > 1;) tree_[i] = std::max(tree_[2 * i], tree_[2 * i + 1]);
  }
  // The smallest bin with room >= need, or -1.
  std::int64_t FirstAtLeast(std::int64_t need) const {
    if (tree_[1] < need) return -1;
    std::size_t node = 1;
    while (node < leaves_) node = tree_[2 * node] >= need ? 2 * node : 2 * node + 1;
    return static_cast<std::int64_t>(node - leaves_);
  }
  std::int64_t Get(std::size_t i) const { return tree_[leaves_ + i]; }
  // `room` at most the room the tree was made with.
  void Set(std::size_t i, std::int64_t room) {
    std::size_t node = leaves_ + i;
    tree_[node] = static_cast<Room>(room);
    // Up to the first ancestor whose maximum stays (then none above it changes).
    for (node /= 2; node >= 1; node /= 2) {
      const Room max = std::max(tree_[2 * node], tree_[2 * node + 1]);
      if (tree_[node] == max) break;
      tree_[node] = max;
    }
  }

 private:
  std::size_t leaves_ = 1;
  std::vector<Room> tree_;
};

// FirstFitDecreasing() on a RoomTree<Room>.
template <typename Room>
std::optional<Assignment> FirstFitOn(const RankItems& items, std::int64_t m, std::int64_t cap,
                                     std::span<const std::int32_t> by_tokens) {
  RoomTree<Room> room(static_cast<std::size_t>(m), cap);
  Assignment assignment(items.tokens.size(), 0);
  // A run of items of equal tokens t: once one goes to bin b (every bin before b has
  // room below t, and keeps it), the next goes to b too while b has room for it. So the
  // run fills b as far as it can, and the tree is updated once per bin instead of once
  // per item (the same assignment).
  const std::size_t n = by_tokens.size();
  for (std::size_t s = 0; s < n;) {
    const std::int64_t t = items.tokens[static_cast<std::size_t>(by_tokens[s])];
    const std::int64_t bin = room.FirstAtLeast(t);
    if (bin < 0) return std::nullopt;
    std::int64_t left = room.Get(static_cast<std::size_t>(bin));
    do {
      assignment[static_cast<std::size_t>(by_tokens[s])] = static_cast<std::int32_t>(bin);
      left -= t;
      ++s;
    } while (s < n && left >= t && items.tokens[static_cast<std::size_t>(by_tokens[s])] == t);
    room.Set(static_cast<std::size_t>(bin), left);
  }
  return assignment;
}

}  // namespace

void CheckOptions(const MicroBatchOptions& options) {
  CheckAtLeast("max_tokens_per_micro_batch", options.max_tokens_per_micro_batch, 1);
  CheckAtLeast("min_micro_batches", options.min_micro_batches, 1);
  CheckAtLeast("micro_batches_multiple_of", options.micro_batches_multiple_of, 1);
  CheckAtLeast("pad_to_multiple_of", options.pad_to_multiple_of, 1);
  CheckAtLeast("pipeline_stages", options.pipeline_stages, 1);
  CheckAtMost("pipeline_stages", options.pipeline_stages, kMaxPipelineStages);
  if (options.overhead) CheckAtLeast("overhead", *options.overhead, 0);
  CheckRealInRange("count_tolerance", options.count_tolerance, 0.0, End::kClosed, 1.0,
                   End::kClosed);
  CheckAtMost("min_micro_batches", options.min_micro_batches, kMaxParts);
  CheckAtMost("micro_batches_multiple_of", options.micro_batches_multiple_of, kMaxParts);
}

MicroBatchOptions Resolved(const MicroBatchOptions& options) {
  MicroBatchOptions resolved = options;
  resolved.overhead = options.overhead.value_or(options.cost.micro_batch_overhead());
  return resolved;
}

Padded Pad(std::span<const std::int64_t> lengths, const MicroBatchOptions& options) {
  Padded padded;
  padded.total_unpadded = internal::CheckWeights(lengths, "lengths");
  padded.lengths = lengths;
  const bool alone = options.oversize == OversizePolicy::kAlone;
  const std::int64_t cap = options.max_tokens_per_micro_batch;
  if (options.pad_to_multiple_of == 1 && options.cost.kind() == CostModel::Kind::kTokens &&
      !(alone && std::any_of(lengths.begin(), lengths.end(),
                             [cap](std::int64_t length) { return length > cap; }))) {
    // No padding and a token's cost is the token: tokens and costs are the lengths,
    // checked as the loop below checks them (the costs' and the sums' checks then
    // pass as the lengths' did).
    std::int64_t most = 0;
    for (std::size_t i = 0; i < lengths.size(); ++i) {
      if (lengths[i] > kMaxLength || lengths[i] > cap) CheckLength(lengths[i], i, options);
      most = std::max(most, lengths[i]);
    }
    padded.tokens = lengths;
    padded.costs = lengths;
    padded.total_tokens = padded.total_unpadded;
    padded.total_cost = padded.total_unpadded;
    padded.max_cost = most;
    return padded;
  }
  std::vector<std::int64_t>& tokens = padded.token_storage;
  tokens.resize(lengths.size());
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    CheckAtMost({"lengths", i}, lengths[i], {kMaxLength, "2^31"});
    const std::int64_t t = RoundUp(lengths[i], options.pad_to_multiple_of);
    if (t > cap) {
      if (!alone) CheckLength(lengths[i], i, options);
      padded.oversized.emplace_back(static_cast<std::int64_t>(i), t - cap);
    }
    tokens[i] = t;
  }
  const std::int64_t total_padded = internal::CheckWeights(tokens, "lengths (padded)");
  padded.cost_storage = options.cost.Costs(tokens);
  padded.total_cost = internal::CheckWeights(padded.cost_storage, "cost");
  // Oversized sequences count as the cap's tokens from here on (their costs are made).
  for (const auto& [i, excess] : padded.oversized) {
    tokens[static_cast<std::size_t>(i)] = cap;
    padded.oversized_excess += excess;
  }
  padded.total_tokens = total_padded - padded.oversized_excess;
  padded.tokens = tokens;
  padded.costs = padded.cost_storage;
  for (const std::int64_t c : padded.costs) padded.max_cost = std::max(padded.max_cost, c);
  return padded;
}

void RestoreOversized(const Padded& padded, RankPlan& rank) {
  if (padded.oversized.empty()) return;
  const auto excess_of = [&](std::int64_t i) -> std::int64_t {
    const auto it = std::lower_bound(padded.oversized.begin(), padded.oversized.end(),
                                     std::pair<std::int64_t, std::int64_t>{i, 0});
    return it != padded.oversized.end() && it->first == i ? it->second : 0;
  };
  for (MicroBatch& b : rank.micro_batches) {
    for (const std::int64_t i : b.indices) {
      const std::int64_t excess = excess_of(i);
      b.tokens += excess;
      rank.tokens += excess;
    }
  }
}

RankItems Gather(const Padded& padded, std::span<const std::int64_t> indices) {
  RankItems items;
  items.tokens.reserve(indices.size());
  items.costs.reserve(indices.size());
  items.global.reserve(indices.size());
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

std::vector<RankItems> GatherRanks(const Padded& padded,
                                   std::vector<std::vector<std::int64_t>> ranks,
                                   std::span<const std::int32_t> rank_of_sequence) {
  std::vector<RankItems> gathered(ranks.size());
  auto one_by_one = [&] {
    for (std::size_t r = 0; r < ranks.size(); ++r) {
      gathered[r] = Gather(padded, ranks[r]);
      gathered[r].global = std::move(ranks[r]);  // the same list
    }
    return std::move(gathered);
  };
  const std::size_t n = padded.tokens.size();
  if (ranks.size() > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max())) {
    return one_by_one();
  }
  std::vector<std::int32_t> checked;
  std::span<const std::int32_t> rank_of = rank_of_sequence;
  if (rank_of.size() != n) {
    checked.assign(n, -1);
    for (std::size_t r = 0; r < ranks.size(); ++r) {
      const std::vector<std::int64_t>& rank = ranks[r];
      for (std::size_t j = 0; j < rank.size(); ++j) {
        const auto i = static_cast<std::size_t>(rank[j]);
        if (checked[i] >= 0 || (j > 0 && rank[j - 1] >= rank[j])) return one_by_one();
        checked[i] = static_cast<std::int32_t>(r);
      }
    }
    rank_of = checked;
  }
  // Each rank's lists written through a cursor of its own (its sequences ascending, as
  // the pass over the batch meets them); its indices are its list, moved.
  std::vector<std::int64_t*> tokens(ranks.size());
  std::vector<std::int64_t*> costs(ranks.size());
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    RankItems& items = gathered[r];
    items.tokens.resize(ranks[r].size());
    items.costs.resize(ranks[r].size());
    tokens[r] = items.tokens.data();
    costs[r] = items.costs.data();
    items.global = std::move(ranks[r]);
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (rank_of[i] < 0) continue;
    const auto r = static_cast<std::size_t>(rank_of[i]);
    RankItems& items = gathered[r];
    *tokens[r]++ = padded.tokens[i];
    *costs[r]++ = padded.costs[i];
    items.total_tokens += padded.tokens[i];
    items.total_unpadded += padded.lengths[i];
    items.total_cost += padded.costs[i];
  }
  return gathered;
}

std::optional<Assignment> FirstFitDecreasing(const RankItems& items, std::int64_t m,
                                             std::int64_t cap) {
  return FirstFitDecreasing(items, m, cap, HeaviestFirst(items.tokens));
}

std::optional<Assignment> FirstFitDecreasing(const RankItems& items, std::int64_t m,
                                             std::int64_t cap,
                                             std::span<const std::int32_t> by_tokens) {
  // Every room stays in [0, cap] (an item goes only where it fits).
  if (cap <= std::numeric_limits<std::int32_t>::max()) {
    return FirstFitOn<std::int32_t>(items, m, cap, by_tokens);
  }
  return FirstFitOn<std::int64_t>(items, m, cap, by_tokens);
}

void FillEmptyBins(const RankItems& items, std::int64_t m, Assignment& assignment) {
  if (static_cast<std::int64_t>(assignment.size()) < m) return;
  Loads loads = LoadsOf(items, m, assignment);
  const std::size_t bins = static_cast<std::size_t>(m);
  if (std::find(loads.counts.begin(), loads.counts.end(), 0) == loads.counts.end()) return;
  // Each empty bin, lowest first, takes the item with the fewest tokens (ties: lowest
  // index) of the bin holding the most items (ties: lowest bin). With at least m items a
  // bin without one leaves another with two or more: a donor is never a bin that took an
  // item here, so its items are its own, taken in (tokens, index) order.
  // O(n log n + m log m).
  std::vector<std::int32_t> by_bin(assignment.size());
  std::iota(by_bin.begin(), by_bin.end(), 0);
  std::sort(by_bin.begin(), by_bin.end(), [&](std::int32_t a, std::int32_t b) {
    const auto ia = static_cast<std::size_t>(a);
    const auto ib = static_cast<std::size_t>(b);
    return std::tie(assignment[ia], items.tokens[ia], a) <
           std::tie(assignment[ib], items.tokens[ib], b);
  });
  std::vector<std::size_t> next(bins + 1, 0);  // the first item of bin b not given away
  for (std::size_t b = 0; b < bins; ++b) {
    next[b + 1] = next[b] + static_cast<std::size_t>(loads.counts[b]);
  }
  std::set<std::pair<std::int64_t, std::int64_t>> fullest;  // (−count, bin)
  for (std::size_t b = 0; b < bins; ++b) {
    fullest.emplace(-loads.counts[b], static_cast<std::int64_t>(b));
  }
  auto set_count = [&](std::size_t b, std::int64_t count) {
    fullest.erase({-loads.counts[b], static_cast<std::int64_t>(b)});
    loads.counts[b] = count;
    fullest.emplace(-count, static_cast<std::int64_t>(b));
  };
  for (std::size_t b = 0; b < bins; ++b) {
    if (loads.counts[b] > 0) continue;
    const auto donor = static_cast<std::size_t>(fullest.begin()->second);
    const std::int32_t pick = by_bin[next[donor]++];
    assignment[static_cast<std::size_t>(pick)] = static_cast<std::int32_t>(b);
    set_count(donor, loads.counts[donor] - 1);
    set_count(b, 1);
  }
}

namespace {

// PackGoal::kWithinCap: the first of `extra`, first-fit decreasing, Karmarkar-Karp on
// cost repaired, and longest first on tokens that keeps the cap, empty bins filled
// (`extra` as it is when none does, as the balanced Pack() takes it).
// First-fit comes before the balanced constructions: it packs tightest (at the
// smallest count of a large rank, often the only one that fits) and costs least.
std::optional<Assignment> FirstWithinCap(const RankItems& items, std::int64_t m, std::int64_t cap,
                                         const std::optional<Assignment>& extra,
                                         std::span<const std::int32_t> given_by_tokens) {
  auto done = [&](Assignment packing) {
    FillEmptyBins(items, m, packing);
    return std::optional<Assignment>(std::move(packing));
  };
  if (extra && WithinCap(LoadsOf(items, m, *extra), cap)) return done(*extra);
  std::vector<std::int32_t> sorted_here;
  if (given_by_tokens.size() != items.tokens.size()) sorted_here = HeaviestFirst(items.tokens);
  const std::span<const std::int32_t> by_tokens =
      given_by_tokens.size() == items.tokens.size() ? given_by_tokens : sorted_here;
  if (auto ffd = FirstFitDecreasing(items, m, cap, by_tokens)) return done(std::move(*ffd));
  Assignment kk = KarmarkarKarpSorted(
      items.costs, items.costs == items.tokens ? by_tokens : HeaviestFirst(items.costs), m,
      PartSizes::kAny);
  if (Repair(items, m, cap, by_tokens, kk)) return done(std::move(kk));
  if (auto lpt = LptOnTokens(items, m, by_tokens, cap)) return done(std::move(*lpt));
  // As the balanced Pack(), which takes `extra` as it is.
  if (extra) return done(*extra);
  return std::nullopt;
}

}  // namespace

std::optional<Assignment> Pack(const RankItems& items, std::int64_t m, std::int64_t cap,
                               const RefineOptions& refine, const std::optional<Assignment>& extra,
                               PackGoal goal, std::span<const std::int32_t> given_by_tokens) {
  const std::int64_t n = static_cast<std::int64_t>(items.tokens.size());
  if (n <= m) {
    Assignment one_each(static_cast<std::size_t>(n));
    std::iota(one_each.begin(), one_each.end(), 0);
    return one_each;
  }
  if (goal == PackGoal::kWithinCap) return FirstWithinCap(items, m, cap, extra, given_by_tokens);
  std::vector<Assignment> starts;
  // The items by tokens, heaviest first, sorted once for the repair, the greedy and
  // first-fit; by cost the same order when costs are the tokens (the tokens' cost model
  // without padding).
  std::vector<std::int32_t> sorted_here;
  if (given_by_tokens.size() != items.tokens.size()) sorted_here = HeaviestFirst(items.tokens);
  const std::span<const std::int32_t> by_tokens =
      given_by_tokens.size() == items.tokens.size() ? given_by_tokens : sorted_here;
  Assignment kk = KarmarkarKarpSorted(
      items.costs, items.costs == items.tokens ? by_tokens : HeaviestFirst(items.costs), m,
      PartSizes::kAny);
  if (Repair(items, m, cap, by_tokens, kk)) starts.push_back(std::move(kk));
  if (auto lpt = LptOnTokens(items, m, by_tokens, cap)) starts.push_back(std::move(*lpt));
  if (starts.empty()) {
    if (auto ffd = FirstFitDecreasing(items, m, cap, by_tokens)) starts.push_back(std::move(*ffd));
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

std::int64_t RankTime(std::span<const std::int64_t> costs, const MicroBatchOptions& options) {
  std::int64_t sum = 0;
  std::int64_t max = 0;
  for (const std::int64_t cost : costs) {
    const std::int64_t t = internal::CheckedAdd(cost, Overhead(options), "overhead");
    sum = internal::CheckedAdd(sum, t, "overhead");
    max = std::max(max, t);
  }
  return internal::CheckedAdd(
      sum, internal::CheckedMul(options.pipeline_stages - 1, max, "pipeline_stages"),
      "pipeline_stages");
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
  {
    std::vector<std::size_t> sizes(static_cast<std::size_t>(m), 0);
    for (const std::int32_t b : assignment) ++sizes[static_cast<std::size_t>(b)];
    for (std::size_t b = 0; b < batches.size(); ++b) batches[b].indices.reserve(sizes[b]);
  }
  if (items.total_unpadded == items.total_tokens && padded.oversized.empty()) {
    // No item was padded (padding never shortens one, so equal sums mean equal
    // lengths; none was cut to the cap): the unpadded lengths are the tokens, and not
    // read from the batch.
    for (std::size_t i = 0; i < assignment.size(); ++i) {
      MicroBatch& b = batches[static_cast<std::size_t>(assignment[i])];
      b.indices.push_back(items.global[i]);
      b.tokens += items.tokens[i];
      b.unpadded_tokens += items.tokens[i];
      b.cost += items.costs[i];
    }
  } else {
    // The unpadded lengths are read at the items' places in the batch: fetched a few
    // items ahead, so that those reads overlap.
    constexpr std::size_t kAhead = 16;
    for (std::size_t i = 0; i < assignment.size(); ++i) {
      if (i + kAhead < assignment.size()) {
        __builtin_prefetch(&padded.lengths[static_cast<std::size_t>(items.global[i + kAhead])]);
      }
      MicroBatch& b = batches[static_cast<std::size_t>(assignment[i])];
      b.indices.push_back(items.global[i]);
      b.tokens += items.tokens[i];
      b.unpadded_tokens += padded.lengths[static_cast<std::size_t>(items.global[i])];
      b.cost += items.costs[i];
    }
  }
  // Already ascending when the rank's sequences are (Gather of an ascending rank).
  if (!std::is_sorted(items.global.begin(), items.global.end())) {
    for (MicroBatch& b : batches) std::sort(b.indices.begin(), b.indices.end());
  }
  // Heaviest first; ties by first sequence, empty micro-batches last (in bin order). The
  // non-empty ones are sorted by index, then every batch moved once: O(s log s + m) for
  // s non-empty batches, however many empty ones a forced count adds.
  {
    // The sort's keys side by side (not read through the batches).
    struct Key {
      std::int64_t cost;
      std::int64_t first;
      std::size_t batch;
    };
    std::vector<Key> full;
    std::vector<std::size_t> empty;
    full.reserve(batches.size());
    for (std::size_t b = 0; b < batches.size(); ++b) {
      if (batches[b].indices.empty()) {
        empty.push_back(b);
      } else {
        full.push_back(Key{batches[b].cost, batches[b].indices.front(), b});
      }
    }
    std::sort(full.begin(), full.end(), [](const Key& x, const Key& y) {
      if (x.cost != y.cost) return x.cost > y.cost;
      return x.first < y.first;  // distinct: no index in two batches
    });
    // Costs are >= 0, so an empty batch (cost 0) is never above a non-empty one.
    std::vector<MicroBatch> sorted;
    sorted.reserve(batches.size());
    for (const Key& key : full) sorted.push_back(std::move(batches[key.batch]));
    for (const std::size_t b : empty) sorted.push_back(std::move(batches[b]));
    batches = std::move(sorted);
  }
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

std::int64_t BinsLowerBound(std::span<const std::int64_t> tokens,
                            std::span<const std::int32_t> heaviest_first, std::int64_t cap) {
  const std::size_t n = heaviest_first.size();
  std::vector<std::int64_t> w(n);           // the tokens, heaviest first
  std::vector<std::int64_t> sum(n + 1, 0);  // sum[j]: of the j heaviest
  for (std::size_t j = 0; j < n; ++j) {
    w[j] = tokens[static_cast<std::size_t>(heaviest_first[j])];
    sum[j + 1] = sum[j] + w[j];
  }
  // The big items, above cap / 2: a bin holds at most one. `room`: what the big items
  // not above cap − a leave in their bins (the sums stay within ± the total tokens).
  std::size_t big = 0;
  std::int64_t room = 0;
  for (; big < n && w[big] > cap / 2; ++big) room += cap - w[big];
  std::int64_t bound = static_cast<std::int64_t>(big);
  std::size_t above = 0;
  // Each threshold a, a distinct size of the small items, smallest first: the small
  // items of at least a are w[big, end).
  for (std::size_t end = n; end > big;) {
    const std::int64_t a = w[end - 1];
    for (; above < big && w[above] > cap - a; ++above) room -= cap - w[above];
    const std::int64_t spill = sum[end] - sum[big] - room;
    if (spill > 0) bound = std::max(bound, static_cast<std::int64_t>(big) + CeilDiv(spill, cap));
    while (end > big && w[end - 1] == a) --end;
  }
  return bound;
}

namespace {

// The bins first-fit decreasing uses when it may open as many as it needs; nullopt when
// an item is above the cap.
std::optional<std::int64_t> FirstFitBins(const RankItems& items, std::int64_t cap,
                                         std::span<const std::int32_t> by_tokens) {
  const auto n = static_cast<std::int64_t>(items.tokens.size());
  const auto packing = FirstFitDecreasing(items, std::max<std::int64_t>(n, 1), cap, by_tokens);
  if (!packing) return std::nullopt;
  return packing->empty() ? 0 : *std::max_element(packing->begin(), packing->end()) + 1;
}

}  // namespace

RankSearch FindFeasible(RankItems items, std::int64_t from, const MicroBatchOptions& options) {
  RankSearch search{std::move(items), 0, std::nullopt};
  const std::int64_t q = options.micro_batches_multiple_of;
  const std::int64_t cap = options.max_tokens_per_micro_batch;
  std::vector<std::int32_t> by_tokens;  // sorted after the first count (most ranks need one)
  auto pack_at = [&](std::int64_t m) {
    search.packing =
        Pack(search.items, m, cap, options.refine, std::nullopt, PackGoalFor(options), by_tokens);
    if (search.packing) search.feasible_count = m;
    return search.packing.has_value();
  };
  if (pack_at(from)) return search;
  by_tokens = HeaviestFirst(search.items.tokens);
  // No packing has fewer micro-batches than Martello and Toth's bound.
  const std::int64_t lowest =
      from + RoundUp(std::max(BinsLowerBound(search.items.tokens, by_tokens, cap) - from, q), q);
  // First-fit decreasing packs every count from the bins it uses on (the same packing
  // with bins left empty): from there down, while a count still packs.
  const std::optional<std::int64_t> first_fit = FirstFitBins(search.items, cap, by_tokens);
  std::int64_t m =
      first_fit ? std::max(lowest, from + RoundUp(std::max<std::int64_t>(*first_fit - from, 0), q))
                : lowest;
  while (!pack_at(m)) m += q;
  for (m -= q; m >= lowest; m -= q) {
    std::optional<Assignment> higher = std::move(search.packing);
    const std::int64_t higher_count = search.feasible_count;
    if (!pack_at(m)) {
      search.packing = std::move(higher);
      search.feasible_count = higher_count;
      break;
    }
  }
  return search;
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
using internal::PackGoalFor;
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
    const auto packing = Pack(items, count, options.max_tokens_per_micro_batch, options.refine,
                              search.packing, PackGoalFor(options));
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
  RestoreOversized(padded, best);
  return best;
}

}  // namespace rlsched::balance
