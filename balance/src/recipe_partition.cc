// The common recipe's Karmarkar-Karp, as verl runs it: see recipe_partition.h.

#include "recipe_partition.h"

#include <algorithm>
#include <cstddef>
#include <queue>
#include <utility>
#include <vector>

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

// A partial solution: its non-empty parts, heaviest first; the other k − size() are
// empty (lighter than any non-empty part, whose count is >= 1).
using Solution = std::vector<Part>;

class Differencing {
 public:
  Differencing(std::span<const std::int64_t> values, std::int64_t num_parts)
      : values_(values), k_(static_cast<std::size_t>(num_parts)), next_(values.size(), -1) {}

  std::vector<std::vector<std::int64_t>> Run(PartSizes sizes) {
    const std::size_t n = values_.size();
    solutions_.reserve(sizes == PartSizes::kEqual ? n / k_ + 1 : n);
    if (sizes == PartSizes::kEqual) {
      std::vector<std::pair<std::int64_t, std::int64_t>> sorted(n);  // (value, index)
      for (std::size_t i = 0; i < n; ++i) {
        sorted[i] = {values_[i], static_cast<std::int64_t>(i)};
      }
      std::sort(sorted.begin(), sorted.end());
      for (std::size_t offset = 0; offset < n; offset += k_) {
        Solution chunk;
        for (std::size_t i = offset; i < std::min(n, offset + k_); ++i) {
          chunk.push_back(Single(sorted[i].second));
        }
        SortParts(chunk);
        Push(std::move(chunk));
      }
    } else {
      for (std::size_t i = 0; i < n; ++i) Push({Single(static_cast<std::int64_t>(i))});
    }
    while (heap_.size() > 1) {
      const std::size_t first = heap_.top();
      heap_.pop();
      const std::size_t second = heap_.top();
      heap_.pop();
      Combine(solutions_[first], solutions_[second]);
      solutions_[second] = Solution();
      heap_.push(first);
    }
    std::vector<std::vector<std::int64_t>> parts(k_);
    if (heap_.empty()) return parts;
    const Solution& last = solutions_[heap_.top()];
    for (std::size_t p = 0; p < last.size(); ++p) {
      for (std::int64_t i = last[p].head; i >= 0; i = next_[static_cast<std::size_t>(i)]) {
        parts[p].push_back(i);
      }
      std::sort(parts[p].begin(), parts[p].end());
    }
    return parts;
  }

 private:
  // verl pops the partial solution of largest spread first; ties: the one whose
  // heaviest part is heavier. A strict total order (no two share an item).
  struct PopsLater {
    const Differencing* self;
    bool operator()(std::size_t a, std::size_t b) const {
      const Solution& x = self->solutions_[a];
      const Solution& y = self->solutions_[b];
      const Wide spread_x = self->Spread(x);
      const Wide spread_y = self->Spread(y);
      if (spread_x != spread_y) return spread_x < spread_y;
      return Lighter(x.front(), y.front());
    }
  };

  Part Single(std::int64_t i) const { return Part{values_[static_cast<std::size_t>(i)], 1, i, i}; }

  Wide Spread(const Solution& s) const {
    return s.front().sum - (s.size() == k_ ? s.back().sum : Wide{0});
  }

  // (No two parts are equal: any sort gives verl's stable order.)
  static void SortParts(Solution& s) {
    std::sort(s.begin(), s.end(), [](const Part& a, const Part& b) { return Lighter(b, a); });
  }

  void Push(Solution s) {
    solutions_.push_back(std::move(s));
    heap_.push(solutions_.size() - 1);
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

  // Part i of the result: a's i-th heaviest with b's i-th lightest (b's part k − 1 − i),
  // for the i where either is non-empty; then heaviest first. In place, into a.
  void Combine(Solution& a, const Solution& b) {
    const std::size_t na = a.size();
    const std::size_t nb = b.size();
    for (std::size_t i = k_ - std::min(k_, nb); i < na; ++i) Splice(a[i], b[k_ - 1 - i]);
    for (std::size_t i = std::max(na, k_ - nb); i < k_; ++i) a.push_back(b[k_ - 1 - i]);
    SortParts(a);
  }

  std::span<const std::int64_t> values_;
  std::size_t k_;
  std::vector<std::int64_t> next_;  // by item: the next item of its part, -1 at the end
  std::vector<Solution> solutions_;
  std::priority_queue<std::size_t, std::vector<std::size_t>, PopsLater> heap_{PopsLater{this}};
};

}  // namespace

std::vector<std::vector<std::int64_t>> RecipeKarmarkarKarp(std::span<const std::int64_t> values,
                                                           std::int64_t num_parts,
                                                           PartSizes sizes) {
  return Differencing(values, num_parts).Run(sizes);
}

}  // namespace rlsched::balance::internal
