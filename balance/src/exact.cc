// The anytime exact search of exact.h, in two phases that share one node budget.
//
// Phase 1, the complete greedy tree: items heaviest first, each tried in every part
// (lightest first, one part per class of interchangeable parts), pruned as exact.h
// describes. It is walked without recursion: choice_[d] is the part that holds item d
// on the current path (-1 before its first child). The children of a node are its
// candidate parts in order of (load, count, index); the next child after part q is
// found by a scan for the smallest key above q's, so a node keeps no list.
//
// Phase 2, bin completion (for what phase 1 leaves open): with a capacity C = best - 1
// the parts are filled one at a time; a part takes the heaviest item left, then every
// set of the other items left that keeps it under C and wastes no more of the total
// room k·C - sum than is left (the waste of the parts filled so far adds up). Without
// the equal-size constraint only maximal sets are tried (a set to which another item
// left still fits is dominated: moving that item in never hurts). Equal weights are
// tried once per position. A packing found lowers C and the search restarts (the
// dominance rule depends on C); a search that ends without one proves the best
// optimal. With few items per part this finds a packing at the lower bound in
// thousands of nodes where the greedy tree needs millions.
//
// A node is counted each time an item is placed in a part (in either phase).

#include "rlsched/balance/exact.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "internal.h"
#include "rlsched/balance/partition.h"
#include "rlsched/common/check.h"
#include "rlsched/common/error.h"

namespace rlsched::balance {
namespace {

// The clock is read every this many nodes.
constexpr std::int64_t kClockInterval = 4096;
// The phases take turns: phase 1 gets kFirstSlice nodes in the first round, phase 2
// kPackingShare times as many, and both twice as many each round. Phase 2 proves most
// of the instances that phase 1 leaves open (it also repeats its work each round).
constexpr std::int64_t kFirstSlice = 2048;
constexpr std::int64_t kPackingShare = 3;
// Phase 2 recurses once per item and part, so it only runs on instances this small.
constexpr std::int64_t kMaxBinCompletionItems = 1024;

// The pigeonhole bound: of the m·k + 1 heaviest items some part holds m + 1, so the
// max load is at least the sum of the m + 1 lightest of those. `sorted` is heaviest
// first.
std::int64_t PigeonholeBound(std::span<const std::int64_t> sorted, std::int64_t num_parts) {
  const std::int64_t n = static_cast<std::int64_t>(sorted.size());
  std::vector<std::int64_t> prefix(sorted.size() + 1, 0);
  for (std::size_t i = 0; i < sorted.size(); ++i) prefix[i + 1] = prefix[i] + sorted[i];
  std::int64_t bound = 0;
  for (std::int64_t m = 1; m * num_parts + 1 <= n; ++m) {
    const std::int64_t last = m * num_parts;  // the (m·k + 1)-th heaviest, 0-based
    bound = std::max(bound, prefix[static_cast<std::size_t>(last + 1)] -
                                prefix[static_cast<std::size_t>(last - m)]);
  }
  return bound;
}

// The node budget and the clock, shared by both phases.
class Budget {
 public:
  explicit Budget(const ExactOptions& options)
      : options_(options), timed_(options.time_limit.count() > 0), limit_(options.max_nodes) {
    if (timed_) start_ = options_.now();
  }

  // Counts one node; false once the budget (or the current phase's limit) is spent.
  bool Spend() {
    ++nodes_;
    if (timed_ && nodes_ % kClockInterval == 0 && options_.now() - start_ >= options_.time_limit) {
      out_ = true;
      return false;
    }
    if (nodes_ >= limit_) {
      out_ = out_ || nodes_ >= options_.max_nodes;
      return false;
    }
    return true;
  }

  // Limits the current phase to `nodes` more nodes (within the whole budget).
  void LimitPhase(std::int64_t nodes) {
    limit_ = nodes_ + std::min(nodes, options_.max_nodes - nodes_);
  }
  // The whole budget (nodes or time) is spent.
  bool out() const { return out_ || nodes_ >= options_.max_nodes; }
  std::int64_t nodes() const { return nodes_; }

 private:
  const ExactOptions& options_;
  bool timed_;
  std::chrono::nanoseconds start_{0};
  std::int64_t limit_;
  std::int64_t nodes_ = 0;
  bool out_ = false;
};

// Phase 1: the complete greedy tree, pruned.
class CompleteGreedy {
 public:
  // `sorted`: the weights heaviest first. `best`: the incumbent's max load; only
  // strictly better answers are recorded. Stops at `lower_bound`.
  CompleteGreedy(std::span<const std::int64_t> sorted, std::int64_t num_parts, PartSizes sizes,
                 std::int64_t best, std::int64_t lower_bound, Budget& budget)
      : w_(sorted),
        n_(static_cast<std::int64_t>(sorted.size())),
        k_(num_parts),
        equal_size_(sizes == PartSizes::kEqual),
        floor_(n_ / num_parts),
        extra_(n_ % num_parts),
        suffix_(sorted.size() + 1, 0),
        loads_(static_cast<std::size_t>(num_parts), 0),
        counts_(static_cast<std::size_t>(num_parts), 0),
        choice_(sorted.size() + 1, -1),
        best_(best),
        lower_bound_(lower_bound),
        budget_(budget) {
    for (std::int64_t i = n_ - 1; i >= 0; --i) {
      suffix_[static_cast<std::size_t>(i)] = suffix_[static_cast<std::size_t>(i + 1)] + W(i);
    }
  }

  // Walks the tree until it is exhausted or the bound is met (returns true: best() is
  // optimal) or the budget runs out (returns false; a later call resumes the walk).
  bool Run() {
    while (d_ >= 0) {
      if (choice_[static_cast<std::size_t>(d_)] < 0 && Complete(d_)) {
        if (best_ <= lower_bound_) return true;
        --d_;
        continue;
      }
      const std::int32_t previous = choice_[static_cast<std::size_t>(d_)];
      if (previous >= 0) Unplace(d_, previous);
      const std::int32_t next = NextPart(d_, previous);
      if (next < 0) {
        --d_;
        continue;
      }
      Place(d_, next);
      choice_[static_cast<std::size_t>(d_)] = next;
      if (Promising(d_ + 1)) {
        ++d_;
        choice_[static_cast<std::size_t>(d_)] = -1;
      }
      if (!budget_.Spend()) return false;
    }
    return true;
  }

  // Only answers below `best` count from now on (another phase found `best`).
  void Lower(std::int64_t best) { best_ = std::min(best_, best); }

  std::int64_t best() const { return best_; }
  // The part of each item, by position in `sorted`, of the last answer recorded.
  const std::vector<std::int32_t>& best_parts() const { return best_parts_; }

 private:
  std::int64_t W(std::int64_t item) const { return w_[static_cast<std::size_t>(item)]; }
  std::int64_t& Load(std::int32_t part) { return loads_[static_cast<std::size_t>(part)]; }
  std::int64_t& Count(std::int32_t part) { return counts_[static_cast<std::size_t>(part)]; }

  // The sum of the `m` lightest items (the last m); every unplaced item set contains
  // them while m <= the number of unplaced items.
  std::int64_t Lightest(std::int64_t m) const { return suffix_[static_cast<std::size_t>(n_ - m)]; }
  // The sum of the `m` heaviest unplaced items when items from `first` on are unplaced.
  std::int64_t Heaviest(std::int64_t first, std::int64_t m) const {
    const std::int64_t end = std::min(n_, first + m);
    return suffix_[static_cast<std::size_t>(first)] - suffix_[static_cast<std::size_t>(end)];
  }

  // Equal size: how many more items `part` may take (floor - count, plus one while
  // some part may still grow to floor + 1).
  std::int64_t Slots(std::int32_t part) {
    const std::int64_t count = Count(part);
    if (count > floor_) return 0;
    return floor_ - count + (full_ < extra_ ? 1 : 0);
  }

  void Place(std::int64_t item, std::int32_t part) {
    Load(part) += W(item);
    if (Count(part) == floor_) ++full_;  // only allowed while full_ < extra_
    ++Count(part);
  }

  void Unplace(std::int64_t item, std::int32_t part) {
    Load(part) -= W(item);
    --Count(part);
    if (Count(part) == floor_) --full_;
  }

  // The next part to try for `item` after `previous` (-1: the first), or -1. Parts
  // are ordered by (load, count in equal-size mode, index); a part is skipped when
  // an earlier one has the same key (they are interchangeable) or a cut applies.
  std::int32_t NextPart(std::int64_t item, std::int32_t previous) {
    const std::int64_t weight = W(item);
    const std::int64_t prev_load = previous >= 0 ? Load(previous) : -1;
    const std::int64_t prev_count = previous < 0 ? -1 : equal_size_ ? Count(previous) : 0;
    std::int32_t found = -1;
    std::int64_t found_load = 0;
    std::int64_t found_count = 0;
    for (std::int32_t p = 0; p < k_; ++p) {
      const std::int64_t load = Load(p);
      if (load + weight >= best_) continue;
      const std::int64_t count = equal_size_ ? Count(p) : 0;
      if (previous >= 0 && (load < prev_load || (load == prev_load && count <= prev_count))) {
        continue;  // tried already, or interchangeable with a part tried already
      }
      if (found >= 0 && (load > found_load || (load == found_load && count >= found_count))) {
        continue;
      }
      if (equal_size_) {
        if (Slots(p) == 0) continue;
        // The part still needs `need` of the remaining items after this one, and
        // they weigh at least as much as the lightest `need` items.
        const std::int64_t need = floor_ - count - 1;
        if (need > 0 && load + weight + Lightest(need) >= best_) continue;
      }
      found = p;
      found_load = load;
      found_count = count;
    }
    return found;
  }

  // Whether a completion of the items from `first` on can beat best_ (see the file
  // comment of exact.h: room under best_ - 1, less the wasted room).
  bool Promising(std::int64_t first) {
    const std::int64_t remaining = suffix_[static_cast<std::size_t>(first)];
    if (remaining == 0) return true;
    const std::int64_t limit = best_ - 1;
    const std::int64_t smallest = W(n_ - 1);
    std::int64_t room = 0;
    for (std::int32_t p = 0; p < k_; ++p) {
      std::int64_t free = limit - Load(p);
      if (free < 0) return false;  // placed before best_ dropped
      if (equal_size_) free = std::min(free, Heaviest(first, Slots(p)));
      if (free >= smallest) room = free >= remaining - room ? remaining : room + free;
    }
    return room >= remaining;
  }

  // At a node whose items before `first` are placed: completes it at once when the
  // result is known (every item placed; the rest fit into the lightest part without
  // raising the max load; in equal-size mode, only zero weights are left). Records
  // the result when it beats best_. Returns whether the node was completed.
  bool Complete(std::int64_t first) {
    std::int32_t lightest = 0;
    std::int64_t max_load = 0;
    for (std::int32_t p = 0; p < k_; ++p) {
      if (Load(p) < Load(lightest)) lightest = p;
      max_load = std::max(max_load, Load(p));
    }
    const std::int64_t remaining = suffix_[static_cast<std::size_t>(first)];
    if (first < n_) {
      if (equal_size_ ? remaining > 0 : Load(lightest) + remaining > max_load) return false;
    }
    if (max_load >= best_) return true;  // placed before best_ dropped
    best_ = max_load;
    best_parts_.assign(choice_.begin(), choice_.begin() + first);
    if (!equal_size_) {
      best_parts_.resize(static_cast<std::size_t>(n_), lightest);
      return true;
    }
    // Zero weights: fill every part up to floor, then the extra slots.
    std::vector<std::int64_t> counts = counts_;
    std::int64_t full = full_;
    std::int32_t p = 0;
    for (std::int64_t item = first; item < n_; ++item) {
      while (p < k_ && counts[static_cast<std::size_t>(p)] >= floor_) ++p;
      if (p == k_) break;
      best_parts_.push_back(p);
      ++counts[static_cast<std::size_t>(p)];
    }
    for (p = 0; static_cast<std::int64_t>(best_parts_.size()) < n_; ++p) {
      RLSCHED_CHECK(p < k_);
      if (counts[static_cast<std::size_t>(p)] == floor_ && full < extra_) {
        best_parts_.push_back(p);
        ++full;
      }
    }
    return true;
  }

  std::span<const std::int64_t> w_;
  std::int64_t n_;
  std::int64_t k_;
  bool equal_size_;
  std::int64_t floor_;                // equal size: every part holds floor_ or floor_ + 1
  std::int64_t extra_;                // items, and extra_ parts hold floor_ + 1
  std::int64_t full_ = 0;             // parts holding floor_ + 1 items now
  std::vector<std::int64_t> suffix_;  // suffix_[i]: the sum of the items from i on
  std::vector<std::int64_t> loads_;
  std::vector<std::int64_t> counts_;
  std::vector<std::int32_t> choice_;
  std::int64_t best_;
  std::int64_t lower_bound_;
  Budget& budget_;
  std::int64_t d_ = 0;  // the depth of the walk: items before d_ are placed
  std::vector<std::int32_t> best_parts_;
};

// Phase 2: bin completion under a capacity.
class BinCompletion {
 public:
  enum class Outcome { kFound, kInfeasible, kStopped };

  // `sorted`: the weights heaviest first, all of them placed (in equal-size mode)
  // or only the positive ones (the caller places the zeros).
  BinCompletion(std::span<const std::int64_t> sorted, std::int64_t num_parts, PartSizes sizes,
                Budget& budget)
      : w_(sorted),
        n_(static_cast<std::int64_t>(sorted.size())),
        k_(num_parts),
        equal_size_(sizes == PartSizes::kEqual),
        floor_(n_ / num_parts),
        extra_(n_ % num_parts),
        used_(sorted.size(), false),
        part_of_(sorted.size(), 0),
        levels_(static_cast<std::size_t>(num_parts)),
        budget_(budget) {
    for (const std::int64_t x : sorted) total_ += x;
  }

  // Looks for a packing with every part's load <= capacity.
  Outcome Decide(std::int64_t capacity) {
    capacity_ = capacity;
    // The room the parts may leave unused, all together.
    if (__builtin_mul_overflow(capacity, k_, &slack_)) slack_ = INT64_MAX;
    slack_ -= total_;
    if (slack_ < 0) return Outcome::kInfeasible;
    found_ = false;
    stopped_ = false;
    filled_ = 0;
    FillPart(0, 0, extra_);
    if (found_) return Outcome::kFound;
    return stopped_ ? Outcome::kStopped : Outcome::kInfeasible;
  }

  // After kFound: the packing's max load and the part of each item of `sorted`.
  std::int64_t found_max() const { return found_max_; }
  const std::vector<std::int32_t>& found_parts() const { return found_parts_; }

 private:
  // The items left when a part starts, heaviest first, with suffix sums.
  struct Level {
    std::vector<std::int32_t> items;
    std::vector<std::int64_t> suffix;  // suffix[j]: the weight of items[j..]
    std::vector<std::int32_t> chosen;  // positions in `items` taken besides items[0]
    std::int64_t part = 0;
    std::int64_t min_load = 0;  // loads below this waste too much room
    std::int64_t min_count = 0;
    std::int64_t max_count = 0;
    std::int64_t waste = 0;  // room wasted by the parts before
    std::int64_t extra_left = 0;
  };

  std::int64_t W(std::int32_t item) const { return w_[static_cast<std::size_t>(item)]; }

  // Fills part `part` (the parts before are full), having wasted `waste` room so far;
  // `extra_left` parts may still take floor + 1 items (equal size).
  void FillPart(std::int64_t part, std::int64_t waste, std::int64_t extra_left) {
    if (part == k_ - 1) {
      // The last part takes every item left; the waste budget guarantees it fits.
      RLSCHED_CHECK(total_ - filled_ <= capacity_);
      Record(part);
      return;
    }
    Level& level = levels_[static_cast<std::size_t>(part)];
    level.items.clear();
    for (std::int32_t i = 0; i < n_; ++i) {
      if (!used_[static_cast<std::size_t>(i)]) level.items.push_back(i);
    }
    if (level.items.empty()) {  // fewer items than parts: the rest stay empty
      Record(part);
      return;
    }
    level.suffix.assign(level.items.size() + 1, 0);
    for (std::size_t j = level.items.size(); j-- > 0;) {
      level.suffix[j] = level.suffix[j + 1] + W(level.items[j]);
    }
    level.chosen.clear();
    level.part = part;
    level.min_load = capacity_ - (slack_ - waste);
    level.waste = waste;
    level.extra_left = extra_left;
    if (equal_size_) {
      const std::int64_t parts_after = k_ - part - 1;
      level.max_count = floor_ + (extra_left > 0 ? 1 : 0);
      level.min_count = floor_ + (extra_left > parts_after ? 1 : 0);
    } else {
      level.min_count = 1;
      level.max_count = n_;
    }
    // The heaviest item left goes here (the empty parts are interchangeable).
    const std::int32_t first = level.items[0];
    used_[static_cast<std::size_t>(first)] = true;
    part_of_[static_cast<std::size_t>(first)] = static_cast<std::int32_t>(part);
    if (budget_.Spend()) {
      Extend(level, 1, W(first), 1);
    } else {
      stopped_ = true;
    }
    used_[static_cast<std::size_t>(first)] = false;
  }

  // Adds items from position `from` on to the part of `level`, which holds `count`
  // items weighing `load` so far; then tries the set as it is.
  void Extend(Level& level, std::size_t from, std::int64_t load, std::int64_t count) {
    const std::size_t size = level.items.size();
    for (std::size_t j = from; j < size && count < level.max_count; ++j) {
      if (found_ || stopped_) return;
      // Even the heaviest items that may still come cannot reach min_load.
      const std::size_t last =
          std::min(size, j + static_cast<std::size_t>(level.max_count - count));
      if (load + level.suffix[j] - level.suffix[last] < level.min_load) break;
      if (count + static_cast<std::int64_t>(size - j) < level.min_count) break;
      const std::int64_t x = W(level.items[j]);
      // With x the part must still take `need` more items, at least the lightest.
      const std::int64_t need = level.min_count - count - 1;
      const std::int64_t lightest =
          need > 0 ? level.suffix[size - static_cast<std::size_t>(need)] : 0;
      if (load + x + lightest > capacity_) continue;
      if (j > from && x == W(level.items[j - 1])) continue;  // the same set again
      if (!budget_.Spend()) {
        stopped_ = true;
        return;
      }
      level.chosen.push_back(static_cast<std::int32_t>(j));
      Extend(level, j + 1, load + x, count + 1);
      level.chosen.pop_back();
    }
    if (found_ || stopped_) return;
    if (load < level.min_load || count < level.min_count) return;
    if (!equal_size_ && SmallestLeftOut(level) <= capacity_ - load) return;  // not maximal
    for (const std::int32_t j : level.chosen) {
      const std::int32_t item = level.items[static_cast<std::size_t>(j)];
      used_[static_cast<std::size_t>(item)] = true;
      part_of_[static_cast<std::size_t>(item)] = static_cast<std::int32_t>(level.part);
    }
    filled_ += load;
    FillPart(level.part + 1, level.waste + (capacity_ - load),
             level.extra_left - (count > floor_ ? 1 : 0));
    filled_ -= load;
    for (const std::int32_t j : level.chosen) {
      used_[static_cast<std::size_t>(level.items[static_cast<std::size_t>(j)])] = false;
    }
  }

  // The lightest item of the level left out of the current set (INT64_MAX if none).
  std::int64_t SmallestLeftOut(const Level& level) const {
    std::size_t j = level.items.size() - 1;
    for (auto it = level.chosen.rbegin(); it != level.chosen.rend(); ++it) {
      if (static_cast<std::size_t>(*it) != j) break;
      --j;
    }
    return j == 0 ? INT64_MAX : W(level.items[j]);
  }

  // Every item not yet used goes to `part`; the packing is complete.
  void Record(std::int64_t part) {
    found_ = true;
    found_parts_ = part_of_;
    std::vector<std::int64_t> loads(static_cast<std::size_t>(k_), 0);
    for (std::int32_t i = 0; i < n_; ++i) {
      if (!used_[static_cast<std::size_t>(i)]) {
        found_parts_[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(part);
      }
      loads[static_cast<std::size_t>(found_parts_[static_cast<std::size_t>(i)])] += W(i);
    }
    found_max_ = *std::max_element(loads.begin(), loads.end());
  }

  std::span<const std::int64_t> w_;
  std::int64_t n_;
  std::int64_t k_;
  bool equal_size_;
  std::int64_t floor_;
  std::int64_t extra_;
  std::int64_t total_ = 0;
  std::int64_t capacity_ = 0;
  std::int64_t slack_ = 0;
  std::int64_t filled_ = 0;
  std::vector<bool> used_;
  std::vector<std::int32_t> part_of_;
  std::vector<Level> levels_;
  Budget& budget_;
  bool found_ = false;
  bool stopped_ = false;
  std::int64_t found_max_ = 0;
  std::vector<std::int32_t> found_parts_;
};

// a * b for positive a and b, saturating at INT64_MAX.
std::int64_t Times(std::int64_t a, std::int64_t b) {
  std::int64_t product = 0;
  return __builtin_mul_overflow(a, b, &product) ? INT64_MAX : product;
}

// Throws unless `incumbent` is a valid answer for the instance.
void CheckIncumbent(const Assignment& incumbent, std::size_t num_items, std::int64_t num_parts,
                    PartSizes sizes) {
  if (incumbent.size() != num_items) {
    rlsched::Fail("incumbent", "must be empty or have one entry per item (" +
                                   std::to_string(num_items) + "), got " +
                                   std::to_string(incumbent.size()));
  }
  std::vector<std::int64_t> counts(static_cast<std::size_t>(num_parts), 0);
  for (std::size_t i = 0; i < incumbent.size(); ++i) {
    CheckBelow({"incumbent", i}, incumbent[i], 0, num_parts);
    ++counts[static_cast<std::size_t>(incumbent[i])];
  }
  if (sizes != PartSizes::kEqual) return;
  const std::int64_t n = static_cast<std::int64_t>(num_items);
  const std::int64_t low = n / num_parts;
  const std::int64_t high = low + (n % num_parts != 0 ? 1 : 0);
  for (std::size_t p = 0; p < counts.size(); ++p) {
    if (counts[p] < low || counts[p] > high) {
      rlsched::Fail("incumbent", "part " + std::to_string(p) + " holds " +
                                     std::to_string(counts[p]) + " items; equal_size needs " +
                                     std::to_string(low) + (high != low ? " or " : "") +
                                     (high != low ? std::to_string(high) : std::string()));
    }
  }
}

}  // namespace

ExactResult ExactSearch(std::span<const std::int64_t> weights, std::int64_t num_parts,
                        PartSizes sizes, const Assignment& incumbent, const ExactOptions& options) {
  internal::CheckNumParts(num_parts);
  internal::CheckWeights(weights, "weights");
  CheckAtLeast("exact.max_nodes", options.max_nodes, 0);
  if (options.time_limit.count() > 0 && !options.now) {
    rlsched::Fail("exact.now", "a clock is required with exact.time_limit");
  }
  const std::vector<std::int32_t> order = internal::HeaviestFirst(weights);
  ExactResult result;
  if (incumbent.empty() && !weights.empty()) {
    result.assignment = internal::GreedyLptSorted(weights, order, num_parts, sizes);
  } else {
    CheckIncumbent(incumbent, weights.size(), num_parts, sizes);
    result.assignment = incumbent;
  }
  {
    std::vector<std::int64_t> loads(static_cast<std::size_t>(num_parts), 0);
    for (std::size_t i = 0; i < weights.size(); ++i) {
      loads[static_cast<std::size_t>(result.assignment[i])] += weights[i];
    }
    result.max_load = *std::max_element(loads.begin(), loads.end());
  }

  std::vector<std::int64_t> sorted(weights.size());
  for (std::size_t j = 0; j < order.size(); ++j) {
    sorted[j] = weights[static_cast<std::size_t>(order[j])];
  }
  result.lower_bound =
      std::max(LowerBound(weights, num_parts, sizes), PigeonholeBound(sorted, num_parts));
  if (result.max_load <= result.lower_bound) {
    result.proven_optimal = true;
    result.lower_bound = result.max_load;
    return result;
  }
  if (options.max_nodes == 0) return result;

  // The best answer so far, by position in `sorted` (empty: the incumbent).
  std::vector<std::int32_t> best_parts;
  std::int64_t best = result.max_load;
  bool proven = false;
  Budget budget(options);

  // At most n parts are ever used (in equal-size mode with n < k every part holds at
  // most one item, which n parts of exactly one item model as well).
  const std::int64_t n = static_cast<std::int64_t>(weights.size());
  const std::int64_t used_parts = std::min(num_parts, n);
  CompleteGreedy greedy(sorted, used_parts, sizes, best, result.lower_bound, budget);
  // Phase 2 on the positive weights (or on all of them, for the counts).
  std::int64_t active = n;
  if (sizes != PartSizes::kEqual) {
    while (active > 0 && sorted[static_cast<std::size_t>(active - 1)] == 0) --active;
  }
  const bool packing = active <= kMaxBinCompletionItems;
  // (Built on nothing when phase 2 is off: its memory is O(parts · n).)
  BinCompletion packer(
      std::span<const std::int64_t>(sorted).first(static_cast<std::size_t>(packing ? active : 0)),
      packing ? std::min(used_parts, std::max<std::int64_t>(active, 1)) : 1, sizes, budget);

  // The phases take turns, with slices doubling each round: phase 1 resumes where it
  // stopped, phase 2 restarts (with the best answer so far).
  for (std::int64_t slice = kFirstSlice; !proven && !budget.out(); slice = Times(slice, 2)) {
    greedy.Lower(best);
    budget.LimitPhase(slice);
    proven = greedy.Run();
    if (greedy.best() < best) {
      best = greedy.best();
      best_parts = greedy.best_parts();
    }
    if (proven || budget.out() || !packing) continue;
    budget.LimitPhase(Times(slice, kPackingShare));
    while (!proven) {
      const BinCompletion::Outcome outcome = packer.Decide(best - 1);
      if (outcome == BinCompletion::Outcome::kStopped) break;
      if (outcome == BinCompletion::Outcome::kInfeasible) {
        proven = true;
        break;
      }
      best = packer.found_max();
      best_parts = packer.found_parts();
      best_parts.resize(static_cast<std::size_t>(n), 0);  // the zeros
      proven = best <= result.lower_bound;
    }
  }

  result.proven_optimal = proven;
  result.nodes = budget.nodes();
  if (!best_parts.empty()) {
    result.improved = true;
    result.max_load = best;
    for (std::size_t j = 0; j < order.size(); ++j) {
      result.assignment[static_cast<std::size_t>(order[j])] = best_parts[j];
    }
  }
  if (result.proven_optimal) result.lower_bound = result.max_load;
  return result;
}

}  // namespace rlsched::balance
