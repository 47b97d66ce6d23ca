// Local search on the heaviest part: one move or one swap at a time.
//
// Each step takes the heaviest part H and looks for the move (an item of H to part P)
// or swap (an item of H for a lighter item of P) that makes max(load H', load P')
// smallest, and applies it if that is below load H. A transfer of d with
// 0 < d < load H - load P strictly lowers the sum of squared loads, so the search
// never cycles and the max load never rises. Partners are visited lightest first;
// partner P can at best reach ceil((H + P) / 2), which prunes the rest. A step tries
// at most kMaxPartners partners, and kPartnersAfterFound once it has found a step, so
// it costs O(kMaxPartners · items per part) however many parts there are (with more
// than kMaxPartners parts the search may stop early: the lightest parts are the
// likeliest partners). A part made heavy by one large item is better served by the
// smallest items anywhere: when the partners offer no step, each item x of H is
// tried against the lightest items y (at most kItemsPerHeavyItem of them), taking the
// first that fits.
//
// With a capacity (micro-batching: tokens per micro-batch under a cap), each item
// also has a size, and a step is taken only if neither part ends above the capacity
// (or above its own size, for a part already over it).

#include <algorithm>
#include <set>
#include <stdexcept>
#include <utility>
#include <vector>

#include "internal.h"
#include "rlsched/balance/partition.h"
#include "rlsched/common/check.h"
#include "rlsched/common/error.h"

namespace rlsched::balance {
namespace {

constexpr int kMaxPartners = 256;
constexpr int kPartnersAfterFound = 32;
constexpr int kItemsPerHeavyItem = 64;

struct Step {
  std::int64_t pair_max;  // max(load H', load P') after the step
  std::int32_t partner = -1;
  std::int32_t from_heavy = -1;  // item leaving H
  std::int32_t from_light = -1;  // item leaving P for H (-1 for a move)
};

class LocalSearch {
 public:
  LocalSearch(std::span<const std::int64_t> weights, std::span<const std::int64_t> sizes,
              std::int64_t capacity, std::int64_t num_parts, PartSizes part_sizes,
              const Assignment& assignment)
      : weights_(weights),
        sizes_(sizes),
        capacity_(capacity),
        size_loads_(static_cast<std::size_t>(num_parts), 0),
        items_(static_cast<std::size_t>(num_parts)),
        item_weights_(static_cast<std::size_t>(num_parts)),
        loads_(static_cast<std::size_t>(num_parts), 0),
        equal_size_(part_sizes == PartSizes::kEqual),
        floor_count_(static_cast<std::int64_t>(weights.size()) / num_parts),
        part_of_(assignment.size()),
        lightest_first_(internal::HeaviestFirst(weights)) {
    std::reverse(lightest_first_.begin(), lightest_first_.end());
    for (std::size_t i = 0; i < assignment.size(); ++i) {
      part_of_[i] = assignment[i];
      loads_[static_cast<std::size_t>(assignment[i])] += weights[i];
      if (!sizes_.empty()) size_loads_[static_cast<std::size_t>(assignment[i])] += sizes_[i];
    }
    FillItems();
    for (std::size_t p = 0; p < loads_.size(); ++p) {
      by_load_.emplace(loads_[p], static_cast<std::int32_t>(p));
    }
  }

  // One improving step, if any. Returns false at a local optimum or at the bound.
  bool Improve(std::int64_t lower_bound) {
    const auto [heavy_load, heavy] = *by_load_.rbegin();
    if (heavy_load <= lower_bound) return false;
    Step best{heavy_load};
    int tried = 0;
    int tried_after_found = 0;
    for (const auto& [load, partner] : by_load_) {
      if (partner == heavy || load >= heavy_load || ++tried > kMaxPartners) break;
      const std::int64_t gap = heavy_load - load;
      const std::int64_t reachable = load + gap / 2 + gap % 2;  // ceil((H + P) / 2)
      if (reachable >= best.pair_max) break;
      if (best.partner >= 0 && ++tried_after_found > kPartnersAfterFound) break;
      if (CanMove(heavy, partner)) BestMove(heavy, partner, heavy_load, load, best);
      BestSwap(heavy, partner, heavy_load, load, best);
      if (best.pair_max == reachable) break;
    }
    if (best.partner < 0) {
      for (const std::int32_t x : Items(heavy)) SmallestPartner(heavy, heavy_load, x, best);
    }
    if (best.partner < 0) return false;
    Apply(heavy, best);
    return true;
  }

  Assignment Result() const {
    Assignment assignment(weights_.size(), 0);
    for (std::size_t p = 0; p < items_.size(); ++p) {
      for (const std::int32_t item : items_[p]) {
        assignment[static_cast<std::size_t>(item)] = static_cast<std::int32_t>(p);
      }
    }
    return assignment;
  }

 private:
  struct LighterT {
    std::span<const std::int64_t> w;
    bool operator()(std::int32_t a, std::int32_t b) const {
      const std::int64_t wa = w[static_cast<std::size_t>(a)];
      const std::int64_t wb = w[static_cast<std::size_t>(b)];
      return wa != wb ? wa < wb : a < b;
    }
  };
  LighterT Lighter() const { return LighterT{weights_}; }

  // Each part's items in Lighter() order, dealt from every item in that order:
  // lightest_first_ with each run of equal weights reversed (it lists ties by index
  // descending). O(n), where sorting each part cost O(n log(n / k)).
  void FillItems() {
    std::vector<std::size_t> counts(items_.size(), 0);
    for (const std::int32_t p : part_of_) ++counts[static_cast<std::size_t>(p)];
    for (std::size_t p = 0; p < items_.size(); ++p) {
      items_[p].reserve(counts[p]);
      item_weights_[p].reserve(counts[p]);
    }
    const std::size_t n = lightest_first_.size();
    for (std::size_t start = 0; start < n;) {
      std::size_t end = start + 1;
      while (end < n && W(lightest_first_[end]) == W(lightest_first_[start])) ++end;
      for (std::size_t j = end; j-- > start;) {
        const std::int32_t item = lightest_first_[j];
        const auto part = static_cast<std::size_t>(part_of_[static_cast<std::size_t>(item)]);
        items_[part].push_back(item);
        item_weights_[part].push_back(W(item));
      }
      start = end;
    }
  }

  std::int64_t W(std::int32_t item) const { return weights_[static_cast<std::size_t>(item)]; }
  std::vector<std::int32_t>& Items(std::int32_t part) {
    return items_[static_cast<std::size_t>(part)];
  }
  // The weights of Items(part), in its order.
  const std::vector<std::int64_t>& Weights(std::int32_t part) const {
    return item_weights_[static_cast<std::size_t>(part)];
  }

  bool CanMove(std::int32_t from, std::int32_t to) {
    if (!equal_size_) return true;
    // Counts stay in {floor, floor + 1}: only a long part may give to a short one.
    return static_cast<std::int64_t>(Items(from).size()) > floor_count_ &&
           static_cast<std::int64_t>(Items(to).size()) == floor_count_;
  }

  // Considers transferring d (0 < d < gap) from H to P.
  void Consider(std::int64_t d, std::int64_t heavy_load, std::int64_t light_load,
                std::int32_t heavy, std::int32_t partner, std::int32_t from_heavy,
                std::int32_t from_light, Step& best) const {
    if (d <= 0 || d >= heavy_load - light_load) return;
    const std::int64_t pair_max = std::max(heavy_load - d, light_load + d);
    if (pair_max >= best.pair_max) return;
    if (!sizes_.empty()) {
      const std::int64_t moved =
          Size(from_heavy) - (from_light >= 0 ? Size(from_light) : std::int64_t{0});
      if (!Fits(heavy, -moved) || !Fits(partner, moved)) return;
    }
    best = Step{pair_max, partner, from_heavy, from_light};
  }

  std::int64_t Size(std::int32_t item) const { return sizes_[static_cast<std::size_t>(item)]; }

  // Whether `part` may change its size by `delta`.
  bool Fits(std::int32_t part, std::int64_t delta) const {
    const std::int64_t after = size_loads_[static_cast<std::size_t>(part)] + delta;
    return after <= capacity_ || delta <= 0;
  }

  void BestMove(std::int32_t heavy, std::int32_t partner, std::int64_t heavy_load,
                std::int64_t light_load, Step& best) {
    const auto& h = Items(heavy);
    const auto& hw = Weights(heavy);
    const std::int64_t half = (heavy_load - light_load) / 2;
    // First item heavier than half; it and the one before are the candidates.
    const auto j =
        static_cast<std::size_t>(std::upper_bound(hw.begin(), hw.end(), half) - hw.begin());
    if (j < h.size()) Consider(hw[j], heavy_load, light_load, heavy, partner, h[j], -1, best);
    if (j > 0) Consider(hw[j - 1], heavy_load, light_load, heavy, partner, h[j - 1], -1, best);
  }

  void BestSwap(std::int32_t heavy, std::int32_t partner, std::int64_t heavy_load,
                std::int64_t light_load, Step& best) {
    const auto& h = Items(heavy);
    const auto& p = Items(partner);
    const std::int64_t* const hw = Weights(heavy).data();
    const std::int64_t* const pw = Weights(partner).data();
    const std::int64_t half = (heavy_load - light_load) / 2;
    // No step with this partner ends below ceil((H + P) / 2): once one reaches it, no
    // later candidate can replace it (Consider takes only a strictly smaller max).
    const std::int64_t reachable = light_load + half + (heavy_load - light_load) % 2;
    std::size_t j = 0;  // first item of H heavier than w(y) + half; moves forward only
    for (std::size_t i = 0; i < p.size(); ++i) {
      if (best.pair_max == reachable) return;
      const std::int64_t wy = pw[i];
      const std::int64_t target = wy + half;
      while (j < h.size() && hw[j] <= target) ++j;
      if (j < h.size()) {
        Consider(hw[j] - wy, heavy_load, light_load, heavy, partner, h[j], p[i], best);
      }
      if (j > 0) {
        Consider(hw[j - 1] - wy, heavy_load, light_load, heavy, partner, h[j - 1], p[i], best);
      }
    }
  }

  // Swaps x for the lightest item y outside H that keeps P + d below H.
  void SmallestPartner(std::int32_t heavy, std::int64_t heavy_load, std::int32_t x, Step& best) {
    int tried = 0;
    for (const std::int32_t y : lightest_first_) {
      if (W(y) >= W(x) || tried == kItemsPerHeavyItem) return;
      const std::int32_t partner = part_of_[static_cast<std::size_t>(y)];
      if (partner == heavy) continue;
      ++tried;
      const std::int64_t light_load = loads_[static_cast<std::size_t>(partner)];
      if (light_load + W(x) - W(y) < heavy_load) {
        const std::int64_t before = best.pair_max;
        Consider(W(x) - W(y), heavy_load, light_load, heavy, partner, x, y, best);
        if (best.pair_max != before || sizes_.empty()) return;
      }
    }
  }

  void Remove(std::int32_t part, std::int32_t item) {
    auto& list = Items(part);
    const auto it = std::lower_bound(list.begin(), list.end(), item, Lighter());
    RLSCHED_CHECK(it != list.end() && *it == item);
    auto& weights = item_weights_[static_cast<std::size_t>(part)];
    weights.erase(weights.begin() + (it - list.begin()));
    list.erase(it);
  }

  void Insert(std::int32_t part, std::int32_t item) {
    auto& list = Items(part);
    const auto it = std::upper_bound(list.begin(), list.end(), item, Lighter());
    auto& weights = item_weights_[static_cast<std::size_t>(part)];
    weights.insert(weights.begin() + (it - list.begin()), W(item));
    list.insert(it, item);
  }

  void SetLoad(std::int32_t part, std::int64_t load) {
    std::int64_t& current = loads_[static_cast<std::size_t>(part)];
    by_load_.erase({current, part});
    current = load;
    by_load_.emplace(load, part);
  }

  void Apply(std::int32_t heavy, const Step& step) {
    std::int64_t d = W(step.from_heavy);
    Remove(heavy, step.from_heavy);
    Insert(step.partner, step.from_heavy);
    part_of_[static_cast<std::size_t>(step.from_heavy)] = step.partner;
    if (step.from_light >= 0) {
      d -= W(step.from_light);
      Remove(step.partner, step.from_light);
      Insert(heavy, step.from_light);
      part_of_[static_cast<std::size_t>(step.from_light)] = heavy;
    }
    if (!sizes_.empty()) {
      const std::int64_t moved =
          Size(step.from_heavy) - (step.from_light >= 0 ? Size(step.from_light) : 0);
      size_loads_[static_cast<std::size_t>(heavy)] -= moved;
      size_loads_[static_cast<std::size_t>(step.partner)] += moved;
    }
    SetLoad(heavy, loads_[static_cast<std::size_t>(heavy)] - d);
    SetLoad(step.partner, loads_[static_cast<std::size_t>(step.partner)] + d);
  }

  std::span<const std::int64_t> weights_;
  std::span<const std::int64_t> sizes_;  // empty: no capacity
  std::int64_t capacity_;
  std::vector<std::int64_t> size_loads_;
  std::vector<std::vector<std::int32_t>> items_;         // per part, lightest first
  std::vector<std::vector<std::int64_t>> item_weights_;  // their weights, in that order
  std::vector<std::int64_t> loads_;
  std::set<std::pair<std::int64_t, std::int32_t>> by_load_;
  bool equal_size_;
  std::int64_t floor_count_;
  std::vector<std::int32_t> part_of_;
  std::vector<std::int32_t> lightest_first_;  // every item, by weight ascending
};

}  // namespace

namespace internal {

std::int64_t RefineWithCapacity(std::span<const std::int64_t> weights,
                                std::span<const std::int64_t> sizes, std::int64_t capacity,
                                std::int64_t num_parts, PartSizes part_sizes,
                                const RefineOptions& options, std::int64_t lower_bound,
                                Assignment& assignment) {
  CheckAtLeast("refine.max_iterations", options.max_iterations, 0);
  const bool timed = options.time_limit.count() > 0;
  if (timed && !options.now) {
    rlsched::Fail("refine.now", "a clock is required with refine.time_limit");
  }
  if (!options.enabled || options.max_iterations == 0 || weights.empty()) return 0;
  {  // Nothing to do at the bound: skip building the search's structures.
    std::vector<std::int64_t> loads(static_cast<std::size_t>(num_parts), 0);
    for (std::size_t i = 0; i < weights.size(); ++i) {
      loads[static_cast<std::size_t>(assignment[i])] += weights[i];
    }
    if (*std::max_element(loads.begin(), loads.end()) <= lower_bound) return 0;
  }
  const auto start = timed ? options.now() : std::chrono::nanoseconds{0};

  LocalSearch search(weights, sizes, capacity, num_parts, part_sizes, assignment);
  std::int64_t steps = 0;
  while (steps < options.max_iterations && search.Improve(lower_bound)) {
    ++steps;
    if (timed && options.now() - start >= options.time_limit) break;
  }
  if (steps > 0) assignment = search.Result();
  return steps;
}

}  // namespace internal

std::int64_t Refine(std::span<const std::int64_t> weights, std::int64_t num_parts, PartSizes sizes,
                    const RefineOptions& options, std::int64_t lower_bound,
                    Assignment& assignment) {
  internal::CheckNumParts(num_parts);
  internal::CheckWeights(weights, "weights");
  internal::CheckAssignment(assignment, weights.size(), num_parts);
  return internal::RefineWithCapacity(weights, {}, 0, num_parts, sizes, options, lower_bound,
                                      assignment);
}

}  // namespace rlsched::balance
