// The common recipe's Karmarkar-Karp, as verl runs it: see recipe_partition.h.

#include "recipe_partition.h"

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <queue>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "internal.h"

namespace rlsched::balance::internal {
namespace {

// A part's (sum, count, first item) as one unsigned number, when the sum is an int64:
// sum · 2^64 + count · 2^32 + first item, ordered as Lighter orders the parts.
__extension__ typedef unsigned __int128 PartKey;

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

// verl pops the partial solution of largest spread first; ties: the one whose heaviest
// part is heavier. A strict total order (no two share an item). For the heap entries of
// both differencing methods (a `spread` and a `heaviest` part).
struct PopsLater {
  template <typename Entry>
  bool operator()(const Entry& x, const Entry& y) const {
    if (x.spread != y.spread) return x.spread < y.spread;
    return Lighter(x.heaviest, y.heaviest);
  }
};

// The final solution's parts (heaviest first, from `parts` ascending): each position's
// part written over its link in `next` once read, the lists walked interleaved
// (independent loads instead of one chain of cache misses); the parts' sums and counts
// when asked.
template <typename PartType>
void WritePartOfPosition(std::span<const PartType> parts, std::vector<std::int32_t>& next,
                         std::vector<RecipeSum>* sums, std::vector<std::int32_t>* counts) {
  const std::size_t size = parts.size();
  std::vector<std::pair<std::int32_t, std::int32_t>> walks;  // (position, part)
  walks.reserve(size);
  for (std::size_t p = 0; p < size; ++p) {
    const PartType& part = parts[size - 1 - p];
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
      std::int32_t& link = next[static_cast<std::size_t>(position)];
      position = link;
      link = part;
      ++w;
    }
  }
}

template <typename Sum>
class Differencing {
 public:
  using Part = internal::Part<Sum>;
  using Solution = internal::Solution<Sum>;

  // `index`: the items ascending by (value, index), `value`: their values in that order.
  // `fast`: the absorption of single items by a tournament tree (int64 sums, at least
  // kTreeFrom parts) in place of the heap of parts, the same steps.
  Differencing(std::span<const std::int32_t> index, std::span<const std::int64_t> value,
               std::int64_t num_parts, bool fast = false)
      : k_(static_cast<std::size_t>(num_parts)),
        index_(index),
        value_(value),
        next_(index_.size(), -1),
        fast_(fast) {}

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
      if constexpr (std::is_same_v<Sum, std::int64_t>) {
        if (fast_ && heap_.empty() && k_ >= kTreeFrom) AbsorbSinglesByTree(solutions_[first]);
      }
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
    WritePartOfPosition(std::span<const Part>(last.parts), next_, sums, counts);
    (void)n;
  }

  std::vector<std::int32_t>& PartOfPosition() { return next_; }

 private:
  // The heap holds each solution's key (PopsLater's) beside its index (a solution
  // changes only while out of the heap), so comparisons read no solution.
  struct Entry {
    Sum spread;
    Part heaviest;
    std::size_t id;
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

  // AbsorbSinglesByTree() serves solutions of at least this many parts (below it the
  // heap's few levels cost less than building the tree).
  static constexpr std::size_t kTreeFrom = 64;

  // A part's PartKey.
  static PartKey KeyOf(const Part& part) requires std::is_same_v<Sum, std::int64_t> {
    return PartKey{static_cast<std::uint64_t>(part.sum)} << 64 |
           (std::uint64_t{static_cast<std::uint32_t>(part.count)} << 32 |
            static_cast<std::uint32_t>(part.head));
  }

  // The absorption loop's condition, PopsLater()(NextSingleEntry(), EntryOf(a)) for k >= 2
  // and a solution a whose lightest and heaviest parts have the keys given (0 for the
  // lightest when a part is empty): the next single's spread is its value, a's is its
  // heaviest part's sum less its lightest's. Precondition: singles_left_ > 0.
  bool NextHolds(PartKey lightest,
                 PartKey heaviest) const requires std::is_same_v<Sum, std::int64_t> {
    const std::size_t p = singles_left_ - 1;
    const auto value = static_cast<std::uint64_t>(value_[p]);
    const auto spread =
        static_cast<std::uint64_t>(heaviest >> 64) - static_cast<std::uint64_t>(lightest >> 64);
    if (value != spread) return value < spread;
    const PartKey item =
        PartKey{value} << 64 | (std::uint64_t{1} << 32 | static_cast<std::uint32_t>(index_[p]));
    return item < heaviest;
  }

  // The absorption loop of Solve() (the solution `a`, popped first, meets the next
  // single item, popped second, while the heap of solutions is empty: the item fills
  // an empty part or joins the lightest), run on a tournament tree of a's k parts
  // instead of its heap, until the loop's condition fails or no single is left; then
  // a's parts are written back, ascending. The same parts: an empty part is a leaf of
  // key 0, lighter than every non-empty part (count >= 1) as in Differencing, and the
  // lightest leaf is the part the item meets (Lighter is a strict total order on the
  // non-empty parts; the empty ones are alike). A step replays one leaf-to-root path,
  // whose nodes do not depend on the comparisons (the heap's sift reads the children
  // its last comparison chose), O(log k).
  void AbsorbSinglesByTree(Solution& a) requires std::is_same_v<Sum, std::int64_t> {
    if (singles_left_ == 0 || a.parts.empty()) return;
    if (!NextHolds(a.parts.size() == k_ ? KeyOf(a.parts.front()) : PartKey{0}, KeyOf(a.heaviest)))
      return;
    // 64-bit keys when a's heaviest sum fits beside a count and a first item (the
    // common case), else 128-bit ones. The loop runs while the item is below a's spread
    // (or equal to it), so the part it joins stays no heavier than a's heaviest: that
    // sum stays the largest, and every sum fits when it does.
    const NarrowKeys narrow(index_.size());
    if (narrow.Fits(static_cast<std::uint64_t>(a.heaviest.sum))) {
      RunTree(a, narrow, narrow_keys_, narrow_win_keys_);
    } else {
      RunTree(a, WideKeys{}, tree_keys_, win_keys_);
    }
  }

  // The parts' keys as PartKey.
  struct WideKeys {
    using Key = PartKey;
    Key Encode(std::uint64_t sum, std::uint32_t count, std::uint32_t head) const {
      return Key{sum} << 64 | (std::uint64_t{count} << 32 | head);
    }
    std::uint64_t SumOf(Key key) const { return static_cast<std::uint64_t>(key >> 64); }
    std::uint32_t CountOf(Key key) const {
      return static_cast<std::uint32_t>(static_cast<std::uint64_t>(key) >> 32);
    }
    std::uint32_t HeadOf(Key key) const { return static_cast<std::uint32_t>(key); }
    static Key Widen(std::uint64_t mask) { return Key{mask} << 64 | mask; }
  };

  // The parts' keys in one 64-bit word, sum · 2^(c + h) + count · 2^h + first item, for
  // n items (counts up to n: c bits, first items below n: h bits), ordered as
  // Lighter orders the parts, when the sum is below 2^(64 − c − h).
  struct NarrowKeys {
    using Key = std::uint64_t;
    explicit NarrowKeys(std::size_t n)
        : head_bits(std::bit_width(n > 0 ? n - 1 : 0)),
          sum_shift(std::bit_width(n > 0 ? n - 1 : 0) + std::bit_width(n)) {}
    Key Encode(std::uint64_t sum, std::uint32_t count, std::uint32_t head) const {
      return sum << sum_shift | std::uint64_t{count} << head_bits | head;
    }
    std::uint64_t SumOf(Key key) const { return key >> sum_shift; }
    std::uint32_t CountOf(Key key) const {
      return static_cast<std::uint32_t>((key >> head_bits) &
                                        ((std::uint64_t{1} << (sum_shift - head_bits)) - 1));
    }
    std::uint32_t HeadOf(Key key) const {
      return static_cast<std::uint32_t>(key & ((std::uint64_t{1} << head_bits) - 1));
    }
    bool Fits(std::uint64_t sum) const { return sum_shift < 64 && (sum >> (64 - sum_shift)) == 0; }
    static Key Widen(std::uint64_t mask) { return mask; }
    int head_bits;
    int sum_shift;
  };

  // A part's key as `codec` makes it.
  template <typename Codec>
  static typename Codec::Key CodecKey(const Codec& codec, const Part& part) {
    return codec.Encode(static_cast<std::uint64_t>(part.sum),
                        static_cast<std::uint32_t>(part.count),
                        static_cast<std::uint32_t>(part.head));
  }

  // RunTree()'s tournament over a's parts (leaves 0 … k − 1: a's parts, then the empty
  // ones, key 0; k … size − 1 padding, the greatest key): tree_keys[node] for node in
  // [1, size) holds the loser of its match; the winner and its leaf, and the size.
  template <typename Codec>
  std::tuple<std::size_t, typename Codec::Key, std::int32_t> BuildTree(
      const Solution& a, const Codec& codec, std::vector<typename Codec::Key>& tree_keys,
      std::vector<typename Codec::Key>& win_keys) {
    using Key = typename Codec::Key;
    std::size_t size = 1;
    while (size < k_) size *= 2;
    constexpr Key kPadding = ~Key{0};
    tree_keys.assign(2 * size, kPadding);
    tree_leaves_.resize(2 * size);
    heads_.assign(k_, -1);
    tails_.assign(k_, -1);
    for (std::size_t j = 0; j < a.parts.size(); ++j) {
      tree_keys[size + j] = CodecKey(codec, a.parts[j]);
      heads_[j] = a.parts[j].head_pos;
      tails_[j] = a.parts[j].tail_pos;
    }
    for (std::size_t j = a.parts.size(); j < k_; ++j) tree_keys[size + j] = 0;
    for (std::size_t j = 0; j < size; ++j) tree_leaves_[size + j] = static_cast<std::uint32_t>(j);
    // Winners bottom-up, losers kept.
    win_keys.assign(2 * size, kPadding);
    win_leaves_.assign(2 * size, 0);
    for (std::size_t j = size; j < 2 * size; ++j) {
      win_keys[j] = tree_keys[j];
      win_leaves_[j] = tree_leaves_[j];
    }
    for (std::size_t node = size - 1; node >= 1; --node) {
      const std::size_t l = 2 * node;
      const std::size_t r = l + 1;
      const bool left_wins = win_keys[l] < win_keys[r];
      const std::size_t w = left_wins ? l : r;
      const std::size_t loser = left_wins ? r : l;
      win_keys[node] = win_keys[w];
      win_leaves_[node] = win_leaves_[w];
      tree_keys[node] = win_keys[loser];
      tree_leaves_[node] = win_leaves_[loser];
    }
    Key winner = win_keys[1];
    auto winner_leaf = static_cast<std::int32_t>(win_leaves_[1]);
    return {size, winner, winner_leaf};
  }

  // a's parts back from RunTree()'s tournament: every leaf's key is the winner's or one
  // node's.
  template <typename Codec>
  void PartsFromTree(Solution& a, const Codec& codec, const std::vector<typename Codec::Key>& keys,
                     std::size_t size, typename Codec::Key winner, std::int32_t winner_leaf) {
    using Key = typename Codec::Key;
    a.parts.clear();
    auto keep = [&](Key key, std::uint32_t leaf) {
      if (leaf < k_ && codec.CountOf(key) != 0) {
        a.parts.push_back(
            Part{static_cast<Sum>(codec.SumOf(key)), static_cast<std::int32_t>(codec.CountOf(key)),
                 static_cast<std::int32_t>(codec.HeadOf(key)), heads_[leaf], tails_[leaf]});
      }
    };
    keep(winner, static_cast<std::uint32_t>(winner_leaf));
    for (std::size_t node = 1; node < size; ++node) keep(keys[node], tree_leaves_[node]);
    std::sort(a.parts.begin(), a.parts.end(),
              [](const Part& x, const Part& y) { return Lighter(x, y); });
    a.sorted = true;
    a.heaviest = a.parts.back();
  }

  // AbsorbSinglesByTree()'s loop on the keys `codec` makes (NextHolds() of a holds, and
  // a's heaviest sum fits the keys).
  template <typename Codec>
  void RunTree(Solution& a, const Codec& codec, std::vector<typename Codec::Key>& tree_keys,
               std::vector<typename Codec::Key>& win_keys) {
    using Key = typename Codec::Key;
    // NextHolds() on these keys.
    auto next_holds = [&](Key lightest, Key heaviest) {
      const std::size_t p = singles_left_ - 1;
      const auto value = static_cast<std::uint64_t>(value_[p]);
      const std::uint64_t spread = codec.SumOf(heaviest) - codec.SumOf(lightest);
      if (value != spread) return value < spread;
      return codec.Encode(value, 1, static_cast<std::uint32_t>(index_[p])) < heaviest;
    };
    auto [size, winner, winner_leaf] = BuildTree(a, codec, tree_keys, win_keys);
    Key heaviest = CodecKey(codec, a.heaviest);
    Key* const keys = tree_keys.data();
    std::uint32_t* const leaves = tree_leaves_.data();
    do {
      const std::size_t p = --singles_left_;
      const auto value = static_cast<std::uint64_t>(value_[p]);
      const auto position = static_cast<std::int32_t>(p);
      const auto w = static_cast<std::size_t>(winner_leaf);
      Key joined;
      if (codec.CountOf(winner) == 0) {  // an empty part: the item alone
        joined = codec.Encode(value, 1, static_cast<std::uint32_t>(index_[p]));
        heads_[w] = position;
      } else {  // Splice(): the item after the part's items
        joined = codec.Encode(codec.SumOf(winner) + value, codec.CountOf(winner) + 1,
                              codec.HeadOf(winner));
        next_[static_cast<std::size_t>(tails_[w])] = position;
      }
      tails_[w] = position;
      heaviest = std::max(heaviest, joined);
      // Replay the path: at each node the lesser key goes on up, the greater stays
      // (exchanged through masks: which one stays is a coin toss for a branch).
      Key up = joined;
      auto up_leaf = static_cast<std::uint32_t>(winner_leaf);
      for (std::size_t node = (size + w) >> 1; node > 0; node >>= 1) {
        const Key stay = keys[node];
        const std::uint64_t mask = 0 - static_cast<std::uint64_t>(stay < up);
        const Key exchange = (stay ^ up) & Codec::Widen(mask);
        keys[node] = stay ^ exchange;
        up ^= exchange;
        const std::uint32_t leaf_exchange =
            (leaves[node] ^ up_leaf) & static_cast<std::uint32_t>(mask);
        leaves[node] ^= leaf_exchange;
        up_leaf ^= leaf_exchange;
      }
      winner = up;
      winner_leaf = static_cast<std::int32_t>(up_leaf);
    } while (singles_left_ > 0 && next_holds(winner, heaviest));
    PartsFromTree(a, codec, tree_keys, size, winner, winner_leaf);
  }

  std::size_t k_;
  std::span<const std::int32_t> index_;  // by position: the input index
  std::span<const std::int64_t> value_;  // by position: the value
  std::vector<std::int32_t> next_;  // by position: the next position of its part, -1 at the end
  std::vector<Solution> solutions_;
  bool fast_ = false;
  std::vector<PartKey> tree_keys_, win_keys_;  // AbsorbSinglesByTree()'s
  std::vector<std::uint64_t> narrow_keys_, narrow_win_keys_;
  std::vector<std::uint32_t> tree_leaves_, win_leaves_;
  std::vector<std::int32_t> heads_, tails_;
  std::vector<Part> popped_;
  std::size_t singles_left_ = 0;  // kAny: positions [0, singles_left_) not yet popped
  Solution scratch_;
  std::priority_queue<Entry, std::vector<Entry>, PopsLater> heap_;
};

// verl's method with equal part sizes (PartSizes::kEqual), the same steps as
// Differencing's for that mode in less memory: every partial solution is a chunk of k
// consecutive positions (whose parts, the single items, are read from the input, not
// stored) or a combination, kept in a block of k parts ascending by Lighter (a free
// block reused, so that the n parts of the chunks are never all allocated at once);
// a combination joins the pairs and sorts its parts once, on 64-bit keys when the sums
// allow. At 4M items into 64 parts: about 100 MB less than Differencing, the same CPU
// time, and no page faults for the chunks' storage (about a third less wall time).
template <typename Sum>
class EqualDifferencing {
 public:
  using Part = internal::Part<Sum>;

  // As Differencing's.
  EqualDifferencing(std::span<const std::int32_t> index, std::span<const std::int64_t> value,
                    std::int64_t num_parts)
      : k_(static_cast<std::size_t>(num_parts)),
        index_(index),
        value_(value),
        next_(index_.size(), -1) {}

  // As Differencing::Solve with PartSizes::kEqual.
  void Solve(std::vector<RecipeSum>* sums, std::vector<std::int32_t>* counts) {
    const std::size_t n = index_.size();
    if (sums != nullptr) sums->assign(k_, 0);
    if (counts != nullptr) counts->assign(k_, 0);
    if (n == 0) return;
    const std::size_t chunks = (n + k_ - 1) / k_;
    std::vector<Entry> heap;
    heap.reserve(chunks);
    for (std::size_t c = 0; c < chunks; ++c) {
      const std::size_t first = c * k_;
      const std::size_t last = std::min(n, first + k_) - 1;
      const Part heaviest = Item(last);
      const Sum lightest = last - first + 1 == k_ ? Sum{value_[first]} : Sum{0};
      heap.push_back(Entry{heaviest.sum - lightest, heaviest, -1 - static_cast<std::int64_t>(c)});
    }
    // Any heap of the entries pops the same (PopsLater is a strict total order).
    std::make_heap(heap.begin(), heap.end(), PopsLater());
    while (heap.size() > 1) {
      std::pop_heap(heap.begin(), heap.end(), PopsLater());
      const Entry first = heap.back();
      heap.pop_back();
      // The second popped is the top now; the combination takes its place (one sift
      // instead of a pop and a push).
      const Entry combined = Combine(first.id, heap.front().id);
      ReplaceTop(heap, combined);
      // The next two to pop are the top and its greater child: their parts fetched
      // while this one sifts.
      Prefetch(heap.front().id);
      if (heap.size() > 2) {
        Prefetch(PopsLater()(heap[1], heap[2]) ? heap[2].id : heap[1].id);
      } else if (heap.size() == 2) {
        Prefetch(heap[1].id);
      }
    }
    const std::span<const Part> last = PartsOf(heap.front().id, chunk_a_);
    WritePartOfPosition(last, next_, sums, counts);
  }

  std::vector<std::int32_t>& PartOfPosition() { return next_; }

 private:
  // A solution waiting: its spread and heaviest part (PopsLater's key) and where its
  // parts are: block `id` when id >= 0, else chunk −1 − id.
  struct Entry {
    Sum spread;
    Part heaviest;
    std::int64_t id;
  };

  Part Item(std::size_t p) const {
    const auto position = static_cast<std::int32_t>(p);
    return Part{value_[p], 1, index_[p], position, position};
  }

  // The max-heap `heap` (by PopsLater) with its top replaced by `entry`.
  static void ReplaceTop(std::vector<Entry>& heap, const Entry& entry) {
    const std::size_t size = heap.size();
    std::size_t hole = 0;
    for (;;) {
      std::size_t child = 2 * hole + 1;
      if (child >= size) break;
      if (child + 1 < size && PopsLater()(heap[child], heap[child + 1])) ++child;
      if (!PopsLater()(entry, heap[child])) break;
      heap[hole] = heap[child];
      hole = child;
    }
    heap[hole] = entry;
  }

  // Asks for the memory of solution `id`'s parts (a block's parts, or a chunk's values
  // and indices) ahead of its combination.
  void Prefetch(std::int64_t id) const {
    if (id >= 0) {
      const char* from =
          reinterpret_cast<const char*>(blocks_.data() + static_cast<std::size_t>(id) * k_);
      const std::size_t bytes = sizes_[static_cast<std::size_t>(id)] * sizeof(Part);
      for (std::size_t b = 0; b < bytes; b += 64) __builtin_prefetch(from + b);
      return;
    }
    const std::size_t first = static_cast<std::size_t>(-1 - id) * k_;
    const std::size_t count = std::min(index_.size(), first + k_) - first;
    for (std::size_t b = 0; b < count * sizeof(std::int64_t); b += 64) {
      __builtin_prefetch(reinterpret_cast<const char*>(value_.data() + first) + b);
    }
    for (std::size_t b = 0; b < count * sizeof(std::int32_t); b += 64) {
      __builtin_prefetch(reinterpret_cast<const char*>(index_.data() + first) + b);
    }
  }

  // The parts of solution `id`, ascending: a block's, or a chunk's items written to
  // `scratch`.
  std::span<const Part> PartsOf(std::int64_t id, std::vector<Part>& scratch) {
    if (id >= 0) {
      const std::size_t b = static_cast<std::size_t>(id);
      return {blocks_.data() + b * k_, sizes_[b]};
    }
    const std::size_t first = static_cast<std::size_t>(-1 - id) * k_;
    const std::size_t last = std::min(index_.size(), first + k_);
    scratch.resize(last - first);
    for (std::size_t p = first; p < last; ++p) scratch[p - first] = Item(p);
    return scratch;
  }

  // b's items appended to a's (both non-empty).
  Part Joined(Part a, const Part& b) {
    next_[static_cast<std::size_t>(a.tail_pos)] = b.head_pos;
    a.tail_pos = b.tail_pos;
    a.sum += b.sum;
    a.count += b.count;
    return a;
  }

  std::size_t NewBlock() {
    if (!free_.empty()) {
      const std::size_t b = free_.back();
      free_.pop_back();
      return b;
    }
    sizes_.push_back(0);
    blocks_.resize(blocks_.size() + k_);
    return sizes_.size() - 1;
  }

  // Differencing::Combine of the solutions `first` (popped first) and `second`, as the
  // parts it leaves: a's j-th heaviest part with b's j-th lightest, the empty parts the
  // lightest. Written to a block (first's when it has one), sorted; returns its entry.
  Entry Combine(std::int64_t first, std::int64_t second) {
    const std::span<const Part> a = PartsOf(first, chunk_a_);
    const std::span<const Part> b = PartsOf(second, chunk_b_);
    const std::size_t na = a.size();
    const std::size_t nb = b.size();
    const std::size_t m = na + nb > k_ ? na + nb - k_ : 0;
    out_.clear();
    if (nb <= na) {
      const std::size_t empty_a = k_ - na;
      for (std::size_t t = 0; t < m; ++t) out_.push_back(Joined(a[t], b[nb - 1 - (empty_a + t)]));
      for (std::size_t j = 0; j < std::min(nb, empty_a); ++j) out_.push_back(b[nb - 1 - j]);
      for (std::size_t t = m; t < na; ++t) out_.push_back(a[t]);
    } else {
      for (std::size_t t = 0; t < m; ++t) out_.push_back(Joined(a[m - 1 - t], b[t]));
      for (std::size_t u = m; u < na; ++u) out_.push_back(a[u]);
      for (std::size_t t = m; t < nb; ++t) out_.push_back(b[t]);
    }
    std::size_t block = 0;
    if (first >= 0) {
      block = static_cast<std::size_t>(first);
    } else if (second >= 0) {
      block = static_cast<std::size_t>(second);
    } else {
      block = NewBlock();
    }
    if (second >= 0 && static_cast<std::size_t>(second) != block) {
      free_.push_back(static_cast<std::size_t>(second));
    }
    Part* const to = blocks_.data() + block * k_;
    SortInto(to);
    sizes_[block] = out_.size();
    const Part& heaviest = to[out_.size() - 1];
    const Sum lightest = out_.size() == k_ ? to[0].sum : Sum{0};
    return Entry{heaviest.sum - lightest, heaviest, static_cast<std::int64_t>(block)};
  }

  // out_ ascending by Lighter, written to `to`. With int64 sums below 2^(64 − b), b the
  // bits of a part's place in out_, on keys sum · 2^b + place (one 64-bit comparison),
  // then each run of equal sums sorted by Lighter; else by Lighter.
  void SortInto(Part* to) {
    const std::size_t size = out_.size();
    const int bits = std::bit_width(size);
    if constexpr (std::is_same_v<Sum, std::int64_t>) {
      Sum most = 0;
      for (const Part& part : out_) most = std::max(most, part.sum);
      if (bits < 32 && (static_cast<std::uint64_t>(most) >> (63 - bits)) == 0) {
        keys_.resize(size);
        for (std::size_t i = 0; i < size; ++i) {
          keys_[i] = static_cast<std::uint64_t>(out_[i].sum) << bits | i;
        }
        std::sort(keys_.begin(), keys_.end());
        const std::uint64_t place = (std::uint64_t{1} << bits) - 1;
        for (std::size_t i = 0; i < size; ++i) to[i] = out_[keys_[i] & place];
        for (std::size_t run = 0; run < size;) {
          std::size_t end = run + 1;
          while (end < size && to[end].sum == to[run].sum) ++end;
          if (end - run > 1)
            std::sort(to + run, to + end,
                      [](const Part& x, const Part& y) { return Lighter(x, y); });
          run = end;
        }
        return;
      }
    }
    std::sort(out_.begin(), out_.end(), [](const Part& x, const Part& y) { return Lighter(x, y); });
    std::copy(out_.begin(), out_.end(), to);
  }

  std::size_t k_;
  std::span<const std::int32_t> index_;  // by position: the input index
  std::span<const std::int64_t> value_;  // by position: the value
  std::vector<std::int32_t> next_;  // by position: the next position of its part, -1 at the end
  std::vector<Part> blocks_;        // block b: parts [b·k, b·k + sizes_[b]), ascending
  std::vector<std::size_t> sizes_;
  std::vector<std::size_t> free_;
  std::vector<Part> chunk_a_, chunk_b_, out_;
  std::vector<std::uint64_t> keys_;
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
                                  PartSizes sizes, RecipeMethod method) {
  RecipePartition result;
  if (sizes == PartSizes::kEqual && method == RecipeMethod::kFast) {
    EqualDifferencing<Sum> differencing(ascending, sorted_values, num_parts);
    differencing.Solve(&result.sums, &result.counts);
    result.part_of_position = std::move(differencing.PartOfPosition());
    return result;
  }
  Differencing<Sum> differencing(ascending, sorted_values, num_parts,
                                 method == RecipeMethod::kFast);
  differencing.Solve(sizes, &result.sums, &result.counts);
  result.part_of_position = std::move(differencing.PartOfPosition());
  return result;
}

}  // namespace

RecipePartition RecipeKarmarkarKarpPositions(std::span<const std::int64_t> sorted_values,
                                             std::span<const std::int32_t> ascending,
                                             std::int64_t num_parts, PartSizes sizes,
                                             RecipeMethod method) {
  std::int64_t total = 0;
  bool fits = true;
  for (const std::int64_t v : sorted_values) {
    fits = fits && !__builtin_add_overflow(total, v, &total);
  }
  return fits ? SolveDifferencing<std::int64_t>(sorted_values, ascending, num_parts, sizes, method)
              : SolveDifferencing<RecipeSum>(sorted_values, ascending, num_parts, sizes, method);
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
