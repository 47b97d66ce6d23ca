// The common recipe's Karmarkar-Karp, as verl runs it: see recipe_partition.h.

#include "recipe_partition.h"

#include <algorithm>
#include <cstddef>
#include <queue>
#include <utility>
#include <vector>

#include "internal.h"

namespace rlsched::balance::internal {
namespace {

using Wide = RecipeSum;

// One part of a partial solution: its items as a list spliced through `next` (in the
// order added), its sum and count. Items are the input positions.
struct Part {
  Wide sum = 0;
  std::int64_t count = 0;
  std::int64_t head = -1;
  std::int64_t tail = -1;
};

// verl's order of parts: by sum, then item count, then item list (of (index, value)
// pairs). Two parts compared here never share an item, so the lists differ at their
// first items, which decide.
bool Lighter(const Part& a, const Part& b) {
  if (a.sum != b.sum) return a.sum < b.sum;
  if (a.count != b.count) return a.count < b.count;
  return a.head < b.head;
}

struct HeavierPart {
  bool operator()(const Part& a, const Part& b) const { return Lighter(b, a); }
};

// A partial solution: its non-empty parts as a binary min-heap by Lighter (the
// lightest at the root; ascending, which is a heap too, when `sorted`) and a copy of its
// heaviest part; the other k − parts.size() parts are empty (lighter than any non-empty
// part, whose count is >= 1).
struct Solution {
  std::vector<Part> parts;
  Part heaviest;
  bool sorted = true;
};

class Differencing {
 public:
  Differencing(std::span<const std::int64_t> values, std::int64_t num_parts)
      : values_(values), k_(static_cast<std::size_t>(num_parts)), next_(values.size(), -1) {}

  std::vector<std::vector<std::int64_t>> Run(PartSizes sizes) {
    const std::size_t n = values_.size();
    solutions_.reserve(sizes == PartSizes::kEqual ? n / k_ + 1 : n);
    // The items by (value, index) descending: the radix order (value descending, index
    // ascending) with each run of equal values reversed.
    std::vector<std::int64_t> sorted_values;
    std::vector<std::int32_t> order = HeaviestFirst(values_, &sorted_values);
    for (std::size_t run = 0; run < n;) {
      std::size_t end = run + 1;
      while (end < n && sorted_values[end] == sorted_values[run]) ++end;
      std::reverse(order.begin() + static_cast<std::ptrdiff_t>(run),
                   order.begin() + static_cast<std::ptrdiff_t>(end));
      run = end;
    }
    if (sizes == PartSizes::kEqual) {
      // Ascending by (value, index), cut into chunks of k from the lightest end; a
      // chunk is then ascending by Lighter, a heap.
      for (std::size_t offset = 0; offset < n; offset += k_) {
        Solution chunk;
        chunk.parts.reserve(std::min(k_, n - offset));
        for (std::size_t i = offset; i < std::min(n, offset + k_); ++i) {
          const std::size_t s = n - 1 - i;
          const auto item = static_cast<std::int64_t>(order[s]);
          chunk.parts.push_back(Part{sorted_values[s], 1, item, item});
        }
        chunk.heaviest = chunk.parts.back();
        Push(std::move(chunk));
      }
    } else {
      // The single items wait outside the heap, in the order they would leave it:
      // merged with the heap's top at every pop, they need neither a heap entry nor a
      // solution of their own until they meet. That order is by (value, index)
      // descending: a single's spread is its value (0 for every one when k = 1), then
      // its heaviest part (value, 1, index) decides.
      singles_.assign(order.begin(), order.end());
    }
    while (heap_.size() + (singles_.size() - next_single_) > 1) {
      // The first popped becomes the combination; a single item popped second is
      // combined from a scratch solution.
      const std::size_t first = PopSolution();
      Solution* second = nullptr;
      std::size_t second_id = 0;
      if (SinglePopsNext()) {
        const Part part = Single(singles_[next_single_++]);
        scratch_.parts.clear();
        scratch_.parts.push_back(part);
        scratch_.heaviest = part;
        scratch_.sorted = true;
        second = &scratch_;
      } else {
        second_id = heap_.top().id;
        heap_.pop();
        second = &solutions_[second_id];
      }
      Combine(solutions_[first], *second);
      if (second != &scratch_) solutions_[second_id] = Solution();
      heap_.push(EntryOf(first));
    }
    if (heap_.empty() && next_single_ < singles_.size()) heap_.push(EntryOf(PopSolution()));
    std::vector<std::vector<std::int64_t>> parts(k_);
    if (heap_.empty()) return parts;
    Solution& last = solutions_[heap_.top().id];
    SortAscending(last);
    const std::size_t size = last.parts.size();
    // Every item's part (heaviest first), the lists walked interleaved (independent
    // loads instead of one chain of cache misses), then the parts filled in index order
    // (ascending without a sort).
    std::vector<std::int32_t> part_of(values_.size(), -1);
    std::vector<std::pair<std::int64_t, std::int32_t>> walks;  // (item, part)
    walks.reserve(size);
    for (std::size_t p = 0; p < size; ++p) {
      walks.emplace_back(last.parts[size - 1 - p].head, static_cast<std::int32_t>(p));
      parts[p].reserve(static_cast<std::size_t>(last.parts[size - 1 - p].count));
    }
    while (!walks.empty()) {
      for (std::size_t w = 0; w < walks.size();) {
        auto& [item, part] = walks[w];
        if (item < 0) {
          walks[w] = walks.back();
          walks.pop_back();
          continue;
        }
        part_of[static_cast<std::size_t>(item)] = part;
        item = next_[static_cast<std::size_t>(item)];
        ++w;
      }
    }
    for (std::size_t i = 0; i < part_of.size(); ++i) {
      parts[static_cast<std::size_t>(part_of[i])].push_back(static_cast<std::int64_t>(i));
    }
    return parts;
  }

 private:
  // verl pops the partial solution of largest spread first; ties: the one whose
  // heaviest part is heavier. A strict total order (no two share an item). The heap
  // holds each solution's key beside its index (a solution changes only while out of
  // the heap), so comparisons read no solution.
  struct Entry {
    Wide spread;
    Part heaviest;
    std::size_t id;
  };
  struct PopsLater {
    bool operator()(const Entry& x, const Entry& y) const {
      if (x.spread != y.spread) return x.spread < y.spread;
      return Lighter(x.heaviest, y.heaviest);
    }
  };

  Part Single(std::int64_t i) const { return Part{values_[static_cast<std::size_t>(i)], 1, i, i}; }

  // The heap entry item i would have as a solution of its own.
  Entry SingleEntry(std::int64_t i) const {
    const Part part = Single(i);
    return Entry{k_ == 1 ? Wide{0} : part.sum, part, 0};
  }

  // Whether the next single item leaves before the heap's top (or the heap is empty).
  bool SinglePopsNext() const {
    if (next_single_ == singles_.size()) return false;
    return heap_.empty() || PopsLater()(heap_.top(), SingleEntry(singles_[next_single_]));
  }

  // The next partial solution in verl's order, off the heap or a single item made one.
  std::size_t PopSolution() {
    if (SinglePopsNext()) {
      const Part part = Single(singles_[next_single_++]);
      solutions_.push_back(Solution{{part}, part, true});
      return solutions_.size() - 1;
    }
    const std::size_t id = heap_.top().id;
    heap_.pop();
    return id;
  }

  Wide Spread(const Solution& s) const {
    return s.heaviest.sum - (s.parts.size() == k_ ? s.parts.front().sum : Wide{0});
  }

  static void SortAscending(Solution& s) {
    if (!s.sorted) std::sort(s.parts.begin(), s.parts.end(), Lighter);
    s.sorted = true;
  }

  Entry EntryOf(std::size_t id) const {
    const Solution& s = solutions_[id];
    return Entry{Spread(s), s.heaviest, id};
  }

  void Push(Solution s) {
    solutions_.push_back(std::move(s));
    heap_.push(EntryOf(solutions_.size() - 1));
  }

  // b's items appended to a's.
  void Splice(Part& a, const Part& b) {
    if (b.count == 0) return;
    if (a.count == 0) {
      a = b;
      return;
    }
    next_[static_cast<std::size_t>(a.tail)] = b.head;
    a.tail = b.tail;
    a.sum += b.sum;
    a.count += b.count;
  }

  // The lightest part of the heap `parts`, removed.
  static Part PopLightest(std::vector<Part>& parts) {
    std::pop_heap(parts.begin(), parts.end(), HeavierPart());
    const Part part = parts.back();
    parts.pop_back();
    return part;
  }

  static void PushPart(std::vector<Part>& parts, const Part& part, Part& heaviest) {
    parts.push_back(part);
    std::push_heap(parts.begin(), parts.end(), HeavierPart());
    if (Lighter(heaviest, part)) heaviest = part;
  }

  // verl's combination: a's j-th heaviest part with b's j-th lightest, counting the
  // empty parts as the lightest (a's i-th part, heaviest first, with b's (k − 1 − i)-th);
  // the result in a. Equivalently a's j-th lightest with b's j-th heaviest: the pairs of
  // two non-empty parts are j in [k − |a|, |b|), m = |a| + |b| − k of them; below them
  // b's heaviest parts meet empty parts of a, above them a's heaviest meet empty parts
  // of b and stay. Only the smaller solution is sorted, and only the m parts of the
  // larger one that change leave its heap and come back: O(s log s + s log k) with s
  // the smaller solution's size, O(log k) when one of them is a single item (the
  // common step), where a sort of all k parts per step made the method quadratic.
  void Combine(Solution& a, Solution& b) {
    const std::size_t na = a.parts.size();
    const std::size_t nb = b.parts.size();
    const std::size_t m = na + nb > k_ ? na + nb - k_ : 0;
    const std::size_t empty_a = k_ - na;
    popped_.clear();
    if (nb <= na) {
      SortAscending(b);  // b's j-th heaviest is b.parts[nb − 1 − j]
      a.sorted = false;
      // a's m lightest, lightest first: the t-th meets b's (k − |a| + t)-th heaviest.
      for (std::size_t t = 0; t < m; ++t) popped_.push_back(PopLightest(a.parts));
      for (std::size_t t = 0; t < m; ++t) {
        Splice(popped_[t], b.parts[nb - 1 - (empty_a + t)]);
        PushPart(a.parts, popped_[t], a.heaviest);
      }
      // b's heaviest parts that meet empty parts of a.
      for (std::size_t j = 0; j < std::min(nb, empty_a); ++j) {
        PushPart(a.parts, b.parts[nb - 1 - j], a.heaviest);
      }
    } else {
      SortAscending(a);  // a's j-th lightest non-empty part is a.parts[j − (k − |a|)]
      b.sorted = false;
      // b's m lightest, lightest first: the t-th is b's (|b| − 1 − t)-th heaviest and
      // meets a's part m − 1 − t (ascending).
      for (std::size_t t = 0; t < m; ++t) popped_.push_back(PopLightest(b.parts));
      Part heaviest = b.heaviest;
      for (std::size_t t = 0; t < m; ++t) {
        Part joined = a.parts[m - 1 - t];
        Splice(joined, popped_[t]);
        PushPart(b.parts, joined, heaviest);
      }
      // a's heaviest parts that meet empty parts of b.
      for (std::size_t u = m; u < na; ++u) PushPart(b.parts, a.parts[u], heaviest);
      a.parts.swap(b.parts);
      a.heaviest = heaviest;
      a.sorted = false;
    }
  }

  std::span<const std::int64_t> values_;
  std::size_t k_;
  std::vector<std::int64_t> next_;  // by item: the next item of its part, -1 at the end
  std::vector<Solution> solutions_;
  std::vector<Part> popped_;
  std::vector<std::int64_t> singles_;  // kAny: the items in the order they leave
  std::size_t next_single_ = 0;
  Solution scratch_;
  std::priority_queue<Entry, std::vector<Entry>, PopsLater> heap_;
};

}  // namespace

std::vector<std::vector<std::int64_t>> RecipeKarmarkarKarp(std::span<const std::int64_t> values,
                                                           std::int64_t num_parts,
                                                           PartSizes sizes) {
  return Differencing(values, num_parts).Run(sizes);
}

}  // namespace rlsched::balance::internal
