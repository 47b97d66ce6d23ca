// The common recipe's Karmarkar-Karp, as verl runs it: see recipe_partition.h.

#include "recipe_partition.h"

#include <algorithm>
#include <cstddef>
#include <queue>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "internal.h"

namespace rlsched::balance::internal {
namespace {

// One part of a partial solution: its sum and count, its first item (the input index
// that breaks ties) and its items as a list spliced through `next` (in the order
// added). The list links items by their position in the ascending (value, index)
// order, not by index: a solution's parts then end in items of one run of positions
// (the chunk, or the single item, it met last), so splicing writes to a few cache lines
// instead of one line per part across the whole input.
template <typename Sum>
struct Part {
  Sum sum = 0;
  std::int32_t count = 0;
  std::int32_t head = -1;      // input index of the first item
  std::int32_t head_pos = -1;  // position of the first item
  std::int32_t tail_pos = -1;  // position of the last item
};

// verl's order of parts: by sum, then item count, then item list (of (index, value)
// pairs). Two parts compared here never share an item, so the lists differ at their
// first items, which decide.
template <typename Sum>
bool Lighter(const Part<Sum>& a, const Part<Sum>& b) {
  if constexpr (std::is_same_v<Sum, std::int64_t>) {
    // One 128-bit comparison (sum, then count and head, all >= 0) instead of three
    // data-dependent branches: the heaps below compare parts of near sums.
    __extension__ typedef unsigned __int128 Key;
    auto key = [](const Part<Sum>& x) {
      return Key{static_cast<std::uint64_t>(x.sum)} << 64 |
             (std::uint64_t{static_cast<std::uint32_t>(x.count)} << 32 |
              static_cast<std::uint32_t>(x.head));
    };
    return key(a) < key(b);
  } else {
    if (a.sum != b.sum) return a.sum < b.sum;
    if (a.count != b.count) return a.count < b.count;
    return a.head < b.head;
  }
}

// The solutions' parts are kept as 4-ary min-heaps by Lighter (node i's children are
// 4i + 1 … 4i + 4): half the levels of a binary heap, and a node's children side by
// side, for the sift that every single item's join takes.
constexpr std::size_t kArity = 4;

// `part` placed at `hole` of the heap `parts` or above it: it climbs while lighter
// than its parent.
template <typename Sum>
void SiftUp(std::vector<Part<Sum>>& parts, std::size_t hole, const Part<Sum>& part) {
  while (hole > 0) {
    const std::size_t parent = (hole - 1) / kArity;
    if (!Lighter(part, parts[parent])) break;
    parts[hole] = parts[parent];
    hole = parent;
  }
  parts[hole] = part;
}

// The heap `parts` with its root replaced by `part`. Bottom-up: the hole goes down to
// a leaf along the lightest children (without a branch on the comparisons), then
// `part` climbs from there (a joined part is heavier than most, so it climbs little).
template <typename Sum>
void SiftFromRoot(std::vector<Part<Sum>>& parts, const Part<Sum>& part) {
  const std::size_t size = parts.size();
  std::size_t hole = 0;
  for (;;) {
    const std::size_t first = kArity * hole + 1;
    if (first >= size) break;
    std::size_t child = first;
    if (first + kArity <= size) {
      const std::size_t a = Lighter(parts[first + 1], parts[first]) ? first + 1 : first;
      const std::size_t b = Lighter(parts[first + 3], parts[first + 2]) ? first + 3 : first + 2;
      child = Lighter(parts[b], parts[a]) ? b : a;
    } else {
      for (std::size_t c = first + 1; c < size; ++c)
        child = Lighter(parts[c], parts[child]) ? c : child;
    }
    parts[hole] = parts[child];
    hole = child;
  }
  SiftUp(parts, hole, part);
}

// `part` added to the heap `parts`.
template <typename Sum>
void HeapPush(std::vector<Part<Sum>>& parts, const Part<Sum>& part) {
  parts.push_back(part);
  SiftUp(parts, parts.size() - 1, part);
}

// The heap's lightest part, taken off it.
template <typename Sum>
Part<Sum> HeapPop(std::vector<Part<Sum>>& parts) {
  const Part<Sum> lightest = parts.front();
  const Part<Sum> last = parts.back();
  parts.pop_back();
  if (!parts.empty()) SiftFromRoot(parts, last);
  return lightest;
}

// A partial solution: its non-empty parts as a 4-ary min-heap by Lighter (the
// lightest at the root; ascending, which is a heap too, when `sorted`) and a copy of its
// heaviest part; the other k − parts.size() parts are empty (lighter than any non-empty
// part, whose count is >= 1). Lighter is a strict total order, so which heap of the
// parts a solution holds never changes what it pops.
template <typename Sum>
struct Solution {
  std::vector<Part<Sum>> parts;
  Part<Sum> heaviest;
  bool sorted = true;
};

template <typename Sum>
class Differencing {
 public:
  using Part = internal::Part<Sum>;
  using Solution = internal::Solution<Sum>;

  // `index`: the items ascending by (value, index), `value`: their values in that order.
  Differencing(std::span<const std::int32_t> index, std::span<const std::int64_t> value,
               std::int64_t num_parts)
      : k_(static_cast<std::size_t>(num_parts)),
        index_(index),
        value_(value),
        next_(index_.size(), -1) {}

  std::vector<std::vector<std::int64_t>> Run(PartSizes sizes, RecipeOrder order) {
    const std::size_t n = index_.size();
    std::vector<std::vector<std::int64_t>> parts(k_);
    std::vector<std::int32_t> counts;
    Solve(sizes, nullptr, &counts);
    for (std::size_t p = 0; p < k_; ++p) parts[p].reserve(static_cast<std::size_t>(counts[p]));
    if (order == RecipeOrder::kValue) {
      for (std::size_t p = 0; p < n; ++p) {
        parts[static_cast<std::size_t>(next_[p])].push_back(index_[p]);
      }
      return parts;
    }
    std::vector<std::int32_t> part_of(n);
    for (std::size_t p = 0; p < n; ++p) part_of[static_cast<std::size_t>(index_[p])] = next_[p];
    for (std::size_t i = 0; i < n; ++i) {
      parts[static_cast<std::size_t>(part_of[i])].push_back(static_cast<std::int64_t>(i));
    }
    return parts;
  }

  // The method run; then every position's part (0: the first in verl's order) is in
  // PartOfPosition(), and `sums` / `counts` (when given) hold the k parts' sums and
  // item counts in that order (0 for the empty parts, which come last).
  void Solve(PartSizes sizes, std::vector<RecipeSum>* sums, std::vector<std::int32_t>* counts) {
    const std::size_t n = index_.size();
    if (sums != nullptr) sums->assign(k_, 0);
    if (counts != nullptr) counts->assign(k_, 0);
    solutions_.reserve(sizes == PartSizes::kEqual ? n / k_ + 1 : n);
    if (sizes == PartSizes::kEqual) {
      // Cut into chunks of k from the lightest end; a chunk is then ascending by
      // Lighter, a heap.
      for (std::size_t offset = 0; offset < n; offset += k_) {
        Solution chunk;
        chunk.parts.reserve(std::min(k_, n - offset));
        for (std::size_t p = offset; p < std::min(n, offset + k_); ++p)
          chunk.parts.push_back(Item(p));
        chunk.heaviest = chunk.parts.back();
        Push(std::move(chunk));
      }
    } else {
      // The single items wait outside the heap, in the order they would leave it:
      // merged with the heap's top at every pop, they need neither a heap entry nor a
      // solution of their own until they meet. That order is by (value, index)
      // descending, the positions from the last: a single's spread is its value (0 for
      // every one when k = 1), then its heaviest part (value, 1, index) decides.
      singles_left_ = n;
    }
    while (heap_.size() + singles_left_ > 1) {
      // A single item popped first and a solution second (the common step once the
      // parts fill): the item joins the solution in place, which stays in its slot.
      if (SinglePopsNext()) {
        const Part single = Item(singles_left_ - 1);
        --singles_left_;
        const bool single_second = SinglePopsNext();
        ++singles_left_;
        if (!single_second && solutions_[heap_.top().id].parts.size() > 1) {
          --singles_left_;
          const std::size_t id = heap_.top().id;
          heap_.pop();
          JoinSingle(single, solutions_[id]);
          heap_.push(EntryOf(id));
          continue;
        }
      }
      // The first popped becomes the combination; a single item popped second is
      // combined from a scratch solution.
      const std::size_t first = PopSolution();
      Solution* second = nullptr;
      std::size_t second_id = 0;
      if (SinglePopsNext()) {
        const Part part = Item(--singles_left_);
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
      // While the combination would pop first again and the next single item second
      // (every step of kAny once one solution holds the rest: the item joins its
      // lightest part), the two are combined here, without the heap.
      while (singles_left_ > 0) {
        const Entry mine = EntryOf(first);
        const Entry next = NextSingleEntry();
        if (!PopsLater()(next, mine)) break;
        if (!heap_.empty() &&
            (!PopsLater()(heap_.top(), mine) || !PopsLater()(heap_.top(), next))) {
          break;
        }
        AbsorbSingle(solutions_[first], Item(--singles_left_));
      }
      heap_.push(EntryOf(first));
    }
    if (heap_.empty() && singles_left_ > 0) heap_.push(EntryOf(PopSolution()));
    if (heap_.empty()) return;
    Solution& last = solutions_[heap_.top().id];
    SortAscending(last);
    const std::size_t size = last.parts.size();
    // Every position's part (heaviest first), written over its link once read, the
    // lists walked interleaved (independent loads instead of one chain of cache
    // misses).
    std::vector<std::pair<std::int32_t, std::int32_t>> walks;  // (position, part)
    walks.reserve(size);
    for (std::size_t p = 0; p < size; ++p) {
      const Part& part = last.parts[size - 1 - p];
      walks.emplace_back(part.head_pos, static_cast<std::int32_t>(p));
      if (sums != nullptr) (*sums)[p] = part.sum;
      if (counts != nullptr) (*counts)[p] = part.count;
    }
    while (!walks.empty()) {
      for (std::size_t w = 0; w < walks.size();) {
        auto& [position, part] = walks[w];
        if (position < 0) {
          walks[w] = walks.back();
          walks.pop_back();
          continue;
        }
        std::int32_t& link = next_[static_cast<std::size_t>(position)];
        position = link;
        link = part;
        ++w;
      }
    }
    (void)n;
  }

  std::vector<std::int32_t>& PartOfPosition() { return next_; }

 private:
  // verl pops the partial solution of largest spread first; ties: the one whose
  // heaviest part is heavier. A strict total order (no two share an item). The heap
  // holds each solution's key beside its index (a solution changes only while out of
  // the heap), so comparisons read no solution.
  struct Entry {
    Sum spread;
    Part heaviest;
    std::size_t id;
  };
  struct PopsLater {
    bool operator()(const Entry& x, const Entry& y) const {
      if (x.spread != y.spread) return x.spread < y.spread;
      return Lighter(x.heaviest, y.heaviest);
    }
  };

  // The item at position p alone in a part.
  Part Item(std::size_t p) const {
    const auto position = static_cast<std::int32_t>(p);
    return Part{value_[p], 1, index_[p], position, position};
  }

  // The heap entry the next single item would have as a solution of its own.
  Entry NextSingleEntry() const {
    const Part part = Item(singles_left_ - 1);
    return Entry{k_ == 1 ? Sum{0} : part.sum, part, 0};
  }

  // Whether the next single item leaves before the heap's top (or the heap is empty).
  bool SinglePopsNext() const {
    if (singles_left_ == 0) return false;
    return heap_.empty() || PopsLater()(heap_.top(), NextSingleEntry());
  }

  // The next partial solution in verl's order, off the heap or a single item made one.
  std::size_t PopSolution() {
    if (SinglePopsNext()) {
      const Part part = Item(--singles_left_);
      solutions_.push_back(Solution{{part}, part, true});
      return solutions_.size() - 1;
    }
    const std::size_t id = heap_.top().id;
    heap_.pop();
    return id;
  }

  Sum Spread(const Solution& s) const {
    return s.heaviest.sum - (s.parts.size() == k_ ? s.parts.front().sum : Sum{0});
  }

  static void SortAscending(Solution& s) {
    if (!s.sorted) std::sort(s.parts.begin(), s.parts.end(), Lighter<Sum>);
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
    next_[static_cast<std::size_t>(a.tail_pos)] = b.head_pos;
    a.tail_pos = b.tail_pos;
    a.sum += b.sum;
    a.count += b.count;
  }

  static void PushPart(std::vector<Part>& parts, const Part& part, Part& heaviest) {
    HeapPush(parts, part);
    if (Lighter(heaviest, part)) heaviest = part;
  }

  // The heap `parts` with its lightest part (the root) replaced by `part`: one sift
  // instead of a pop and a push. Any heap of the same parts pops the same (Lighter is a
  // strict total order).
  static void ReplaceLightest(std::vector<Part>& parts, const Part& part, Part& heaviest) {
    SiftFromRoot(parts, part);
    if (Lighter(heaviest, part)) heaviest = part;
  }

  // The m lightest parts of the solution `s`, lightest first, each changed by
  // join(t, part) in place, and the result a heap again with `heaviest` its heaviest
  // part: for m = 1 one sift down; for m at least half the parts a sort, the joined
  // ones in it, and a sort again (ascending is a heap too, and the next combination
  // needs no sort); else m pops and m pushes.
  template <typename Join>
  void JoinLightest(Solution& s, std::size_t m, Join join, Part& heaviest) {
    if (m == 0) return;
    std::vector<Part>& parts = s.parts;
    if (m == 1) {
      Part part = parts.front();
      join(0, part);
      ReplaceLightest(parts, part, heaviest);
      s.sorted = false;
    } else if (2 * m >= parts.size()) {
      SortAscending(s);
      for (std::size_t t = 0; t < m; ++t) join(t, parts[t]);
      std::sort(parts.begin(), parts.end(), Lighter<Sum>);
      heaviest = parts.back();
      s.sorted = true;
    } else {
      popped_.clear();
      for (std::size_t t = 0; t < m; ++t) popped_.push_back(HeapPop(parts));
      for (std::size_t t = 0; t < m; ++t) {
        join(t, popped_[t]);
        PushPart(parts, popped_[t], heaviest);
      }
      s.sorted = false;
    }
  }

  // Combine() of the solution a (popped first) with the single item `single`: with a
  // full the item joins a's lightest part (listed after it), else it fills one of a's
  // empty parts.
  void AbsorbSingle(Solution& a, const Part& single) {
    Part heaviest = a.heaviest;
    if (a.parts.size() == k_) {
      JoinLightest(
          a, 1, [&](std::size_t, Part& part) { Splice(part, single); }, heaviest);
    } else {
      PushPart(a.parts, single, heaviest);
    }
    a.heaviest = heaviest;
    a.sorted = false;
  }

  // Combine() of the single item `single` (popped first) with the solution b of at
  // least two parts, left in b: with b full the item joins b's lightest part (listed
  // first in it), else it fills one of b's empty parts.
  void JoinSingle(const Part& single, Solution& b) {
    Part heaviest = b.heaviest;
    if (b.parts.size() == k_) {
      JoinLightest(
          b, 1,
          [&](std::size_t, Part& part) {
            Part joined = single;
            Splice(joined, part);
            part = joined;
          },
          heaviest);
    } else {
      PushPart(b.parts, single, heaviest);
    }
    b.heaviest = heaviest;
    b.sorted = false;
  }

  // verl's combination: a's j-th heaviest part with b's j-th lightest, counting the
  // empty parts as the lightest (a's i-th part, heaviest first, with b's (k − 1 − i)-th);
  // the result in a. Equivalently a's j-th lightest with b's j-th heaviest: the pairs of
  // two non-empty parts are j in [k − |a|, |b|), m = |a| + |b| − k of them; below them
  // b's heaviest parts meet empty parts of a, above them a's heaviest meet empty parts
  // of b and stay. Only the smaller solution is sorted, and only the m parts of the
  // larger one that change are touched (JoinLightest): O(s log s + s log k) with s the
  // smaller solution's size, O(log k) when one of them is a single item (the common
  // step), where a sort of all k parts per step made the method quadratic. A joined
  // part lists a's items first.
  void Combine(Solution& a, Solution& b) {
    const std::size_t na = a.parts.size();
    const std::size_t nb = b.parts.size();
    const std::size_t m = na + nb > k_ ? na + nb - k_ : 0;
    const std::size_t empty_a = k_ - na;
    if (nb <= na) {
      SortAscending(b);  // b's j-th heaviest is b.parts[nb − 1 − j]
      // a's m lightest, lightest first: the t-th meets b's (k − |a| + t)-th heaviest.
      Part heaviest = a.heaviest;
      JoinLightest(
          a, m, [&](std::size_t t, Part& part) { Splice(part, b.parts[nb - 1 - (empty_a + t)]); },
          heaviest);
      // b's heaviest parts that meet empty parts of a.
      for (std::size_t j = 0; j < std::min(nb, empty_a); ++j) {
        PushPart(a.parts, b.parts[nb - 1 - j], heaviest);
        a.sorted = false;
      }
      a.heaviest = heaviest;
    } else {
      SortAscending(a);  // a's j-th lightest non-empty part is a.parts[j − (k − |a|)]
      // b's m lightest, lightest first: the t-th is b's (|b| − 1 − t)-th heaviest and
      // meets a's part m − 1 − t (ascending), which comes first in the joined part.
      Part heaviest = b.heaviest;
      JoinLightest(
          b, m,
          [&](std::size_t t, Part& part) {
            Part joined = a.parts[m - 1 - t];
            Splice(joined, part);
            part = joined;
          },
          heaviest);
      // a's heaviest parts that meet empty parts of b.
      for (std::size_t u = m; u < na; ++u) {
        PushPart(b.parts, a.parts[u], heaviest);
        b.sorted = false;
      }
      a.parts.swap(b.parts);
      a.heaviest = heaviest;
      a.sorted = b.sorted;
    }
  }

  std::size_t k_;
  std::span<const std::int32_t> index_;  // by position: the input index
  std::span<const std::int64_t> value_;  // by position: the value
  std::vector<std::int32_t> next_;  // by position: the next position of its part, -1 at the end
  std::vector<Solution> solutions_;
  std::vector<Part> popped_;
  std::size_t singles_left_ = 0;  // kAny: positions [0, singles_left_) not yet popped
  Solution scratch_;
  std::priority_queue<Entry, std::vector<Entry>, PopsLater> heap_;
};

template <typename Sum>
std::vector<std::vector<std::int64_t>> RunDifferencing(std::span<const std::int64_t> values,
                                                       std::span<const std::int32_t> ascending,
                                                       std::int64_t num_parts, PartSizes sizes,
                                                       RecipeOrder order) {
  std::vector<std::int32_t> index(ascending.begin(), ascending.end());
  std::vector<std::int64_t> value(index.size());
  for (std::size_t p = 0; p < index.size(); ++p) {
    value[p] = values[static_cast<std::size_t>(index[p])];
  }
  return Differencing<Sum>(index, value, num_parts).Run(sizes, order);
}

template <typename Sum>
RecipePartition SolveDifferencing(std::span<const std::int64_t> sorted_values,
                                  std::span<const std::int32_t> ascending, std::int64_t num_parts,
                                  PartSizes sizes) {
  Differencing<Sum> differencing(ascending, sorted_values, num_parts);
  RecipePartition result;
  differencing.Solve(sizes, &result.sums, &result.counts);
  result.part_of_position = std::move(differencing.PartOfPosition());
  return result;
}

}  // namespace

RecipePartition RecipeKarmarkarKarpPositions(std::span<const std::int64_t> sorted_values,
                                             std::span<const std::int32_t> ascending,
                                             std::int64_t num_parts, PartSizes sizes) {
  std::int64_t total = 0;
  bool fits = true;
  for (const std::int64_t v : sorted_values) {
    fits = fits && !__builtin_add_overflow(total, v, &total);
  }
  return fits ? SolveDifferencing<std::int64_t>(sorted_values, ascending, num_parts, sizes)
              : SolveDifferencing<RecipeSum>(sorted_values, ascending, num_parts, sizes);
}

std::vector<std::int32_t> RecipeAscending(std::span<const std::int64_t> values,
                                          std::vector<std::int64_t>* sorted) {
  std::vector<std::int64_t> local_sorted;
  std::vector<std::int64_t>& sorted_values = sorted != nullptr ? *sorted : local_sorted;
  std::vector<std::int32_t> order = HeaviestFirst(values, &sorted_values);
  return RecipeAscendingFrom(std::move(order), sorted_values);
}

std::vector<std::int32_t> RecipeAscendingFrom(std::vector<std::int32_t> order,
                                              std::vector<std::int64_t>& sorted_values) {
  // The radix order (value descending, index ascending) reversed, with each run of
  // equal values reversed back.
  std::reverse(order.begin(), order.end());
  std::reverse(sorted_values.begin(), sorted_values.end());
  const std::size_t n = order.size();
  for (std::size_t run = 0; run < n;) {
    std::size_t end = run + 1;
    while (end < n && sorted_values[end] == sorted_values[run]) ++end;
    std::reverse(order.begin() + static_cast<std::ptrdiff_t>(run),
                 order.begin() + static_cast<std::ptrdiff_t>(end));
    run = end;
  }
  return order;
}

std::vector<std::vector<std::int64_t>> RecipeKarmarkarKarpSorted(
    std::span<const std::int64_t> values, std::span<const std::int32_t> ascending,
    std::int64_t num_parts, PartSizes sizes, RecipeOrder order) {
  // Sums in int64 when the total fits (exact either way, and faster).
  std::int64_t total = 0;
  bool fits = true;
  for (const std::int64_t v : values) fits = fits && !__builtin_add_overflow(total, v, &total);
  return fits ? RunDifferencing<std::int64_t>(values, ascending, num_parts, sizes, order)
              : RunDifferencing<RecipeSum>(values, ascending, num_parts, sizes, order);
}

std::vector<std::vector<std::int64_t>> RecipeKarmarkarKarp(std::span<const std::int64_t> values,
                                                           std::int64_t num_parts, PartSizes sizes,
                                                           RecipeOrder order) {
  return RecipeKarmarkarKarpSorted(values, RecipeAscending(values), num_parts, sizes, order);
}

}  // namespace rlsched::balance::internal
