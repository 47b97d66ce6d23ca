// Karmarkar-Karp (largest differencing method) for k parts, with sparse tuples.
//
// A tuple is a partial solution: up to k non-empty parts ("slots"), each with a load
// and a first item; the slot's other items are found through the log of joins (a
// join of two slots records that the second's first item goes with the first's). The
// missing slots are empty parts of load 0, lighter than every slot. Loads are
// absolute (never normalised), so a tuple's spread is max - min when all k slots are
// used, else max - 0.
//
// A slot is one integer key, load · 2^h + first item: slots order by load, then by
// first item (a total order: lists are disjoint), with one integer comparison. The key
// is 64 bits wide when the weights' total fits beside the first items' h bits (h = 32
// for HeaviestFirstSlots' layout, else the bits of n − 1), else 128 bits with h = 32.

// Combining A and B pairs A's j-th heaviest part with B's j-th lightest. In ascending
// order (lightest first) with m = max(0, |A| + |B| - k):
//   - A[0, m) meets B's slots in reverse: A[j] + B[m - 1 - j] (the overlap);
//   - A[m, |A|) and B[m, |B|) pair with empty parts and stay as they are;
// so the result is the merge of three sorted runs, O(k) after sorting the overlap.
//
// A tuple keeps its slots as a sorted run plus a binary min-heap of the slots added
// since the run was last rebuilt (see Tuple). Adding one item — the common step, and
// the only one while the largest items are spread out — costs O(log k): into a full
// tuple it joins the lightest slot (the lighter of the run's front and the heap's
// root) and the joined slot goes into the heap; into a non-full one it opens a new
// slot, which goes into the run when its place there is near the front or at the back
// (the items come heaviest first, so it usually is), else into the heap. A combination
// of tuples of comparable sizes sorts only the heaps and merges them into the runs
// (O(r log r + k) for r added slots, where sorting all k slots after each addition made
// tuples of k = 1024 slots cost more than the sort of the whole input); between a
// large and a small tuple, only the m lightest of each leave and the small one's slots
// join the large one's heap (O(s log k) for s slots).
//
// The order of waiting units is kept by a radix heap (WaitingTuples), which the
// monotone spreads of largest differencing allow; runs of equal spreads, common in
// token counts, cost O(1) a unit there.
//
// Time, n items and k parts: the radix order (HeaviestFirst; HeaviestFirstSlots when
// the key is 64 bits wide, whose last pass writes the single items' slots), then
// O(n log k) for the single additions plus the combinations' sorts and merges; the
// measured ratio to std::sort of the weights is in benchmarks/kk_vs_sort.cc. Memory:
// O(n) (the tuples hold at most n slots between them; the join log at most n - 1
// pairs of items).

#include <algorithm>
#include <bit>
#include <cassert>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <queue>
#include <type_traits>
#include <vector>

#include "internal.h"
#include "order.h"
#include "rlsched/balance/partition.h"

namespace rlsched::balance {
namespace {

__extension__ typedef unsigned __int128 WideKey;

// A unit waiting to be combined: either a single item or a tuple in the pool.
struct Unit {
  std::int64_t spread;
  std::int64_t seq;    // tie-break: smaller first
  std::int32_t tuple;  // index into the pool, or -1 for the single item order[seq]
};

struct SmallerSpread {
  bool operator()(const Unit& a, const Unit& b) const {
    return a.spread != b.spread ? a.spread < b.spread : a.seq > b.seq;
  }
};

// The tuples waiting to be combined, besides the one just made (the carry), in
// kAny mode: a max-queue by (spread, −seq) in which every unit pushed has a spread no
// greater than the last one popped. That holds: the units other than the carry (the
// single items and this queue) leave in descending order, and the carry joins the queue
// only after two of them left before it. So a radix heap serves: bucket b > 0 holds
// the spreads whose highest bit differing from `last_` (the last spread popped) is bit
// b − 1, bucket 0 those equal to it; a bucket's spreads all exceed those of higher
// buckets. Units are pushed in seq order and a bucket is only ever filled while empty
// or appended to, so every bucket is in seq order: bucket 0 is a FIFO queue (ties of
// spread leave oldest first, as the order wants), and a run of equal spreads costs
// O(1) a unit where a binary heap paid O(log size). Every other bucket keeps the
// position of its greatest unit (the oldest of equals), updated as units are appended,
// so the top is found without scanning a bucket. A unit moves to a lower bucket at
// most 64 times.
class WaitingTuples {
 public:
  // The buckets' storage is the thread's from the last run, when no other run of the
  // thread holds it (their capacity kept: a run then reallocates none of its buckets).
  WaitingTuples() {
    Spare& spare = ThreadSpare();
    if (!spare.in_use) {
      spare.in_use = true;
      for (int b = 0; b < 64; ++b) buckets_[b].swap(spare.buckets[b]);
      owns_spare_ = true;
    }
  }

  ~WaitingTuples() {
    if (!owns_spare_) return;
    Spare& spare = ThreadSpare();
    for (int b = 0; b < 64; ++b) {
      buckets_[b].clear();
      if (buckets_[b].capacity() <= kKeptUnits) buckets_[b].swap(spare.buckets[b]);
    }
    spare.in_use = false;
  }

  WaitingTuples(const WaitingTuples&) = delete;
  WaitingTuples& operator=(const WaitingTuples&) = delete;

  bool empty() const { return size_ == 0; }

  void Push(const Unit& unit) {
    assert(unit.spread <= last_);
    Append(BucketOf(unit.spread), unit);
    ++size_;
  }

  // The greatest unit. Precondition: !empty().
  const Unit& Top() const {
    if (head_ < buckets_[0].size()) return buckets_[0][head_];
    // The lowest non-empty bucket holds the greatest spreads.
    const int b = std::countr_zero(nonempty_ & ~std::uint64_t{1});
    return buckets_[b][greatest_[b]];
  }

  // Removes Top(). Precondition: !empty().
  void Pop() {
    if (head_ == buckets_[0].size()) {
      // Bucket 0 is empty: the top's spread becomes `last_`, and its bucket moves down
      // (into empty buckets, in order), the top and its equals into bucket 0.
      const int top = std::countr_zero(nonempty_ & ~std::uint64_t{1});
      std::vector<Unit>& bucket = buckets_[top];
      last_ = bucket[greatest_[top]].spread;
      nonempty_ &= ~(std::uint64_t{1} << top);
      for (const Unit& unit : bucket) Append(BucketOf(unit.spread), unit);
      bucket.clear();
    }
    --size_;
    if (++head_ == buckets_[0].size()) {
      buckets_[0].clear();
      head_ = 0;
      nonempty_ &= ~std::uint64_t{1};
    }
  }

 private:
  // A bucket's storage kept for the thread's next run up to this many units.
  static constexpr std::size_t kKeptUnits = std::size_t{1} << 16;

  struct Spare {
    std::vector<Unit> buckets[64];
    bool in_use = false;
  };
  static Spare& ThreadSpare() {
    thread_local Spare spare;
    return spare;
  }

  int BucketOf(std::int64_t spread) const {
    return std::bit_width(static_cast<std::uint64_t>(last_ ^ spread));
  }

  void Append(int b, const Unit& unit) {
    std::vector<Unit>& bucket = buckets_[b];
    if (bucket.empty()) {
      greatest_[b] = 0;
    } else if (unit.spread > bucket[greatest_[b]].spread) {
      greatest_[b] = bucket.size();
    }
    bucket.push_back(unit);
    nonempty_ |= std::uint64_t{1} << b;
  }

  std::int64_t last_ = std::numeric_limits<std::int64_t>::max();
  std::vector<Unit> buckets_[64];
  std::size_t greatest_[64] = {};  // the position of each bucket's greatest unit
  std::size_t head_ = 0;           // bucket 0's first unit not yet popped
  std::uint64_t nonempty_ = 0;
  std::size_t size_ = 0;
  bool owns_spare_ = false;
};

// One join of two slots: `item` (the first item of one) goes to the part of `with`
// (the other's first item).
struct Link {
  std::int32_t item;
  std::int32_t with;
};

// `Key`: std::uint64_t or WideKey (see the file comment).
template <typename Key>
class Differencer {
 public:
  // `sorted[s]` is the weight of item order[s]; a slot's first item takes `head_bits`
  // bits (at least those of n − 1; the loads must fit in the rest).
  Differencer(std::span<const std::int64_t> sorted, std::span<const std::int32_t> order,
              std::int64_t num_parts, int head_bits)
      : sorted_(sorted),
        order_(order),
        n_(order.size()),
        k_(static_cast<std::size_t>(num_parts)),
        head_bits_(head_bits),
        head_mask_((Key{1} << head_bits) - 1) {
    joins_.reset(new Link[n_ > 0 ? n_ - 1 : 0]);
  }

  // `singles[s]` is the slot of the s-th heaviest item (internal::HeaviestFirstSlots).
  Differencer(std::span<const std::uint64_t> singles,
              std::int64_t num_parts) requires std::is_same_v<Key, std::uint64_t>
      : singles_(singles), n_(singles.size()), k_(static_cast<std::size_t>(num_parts)) {
    joins_.reset(new Link[n_ > 0 ? n_ - 1 : 0]);
  }

  Assignment RunUnconstrained() {
    const std::int64_t n = static_cast<std::int64_t>(n_);
    if (n == 0) return {};
    // Three sources of units, each by spread: the sorted single items (spread =
    // weight, seq = position), the tuple just combined (`carry`, usually the next to
    // be taken: this saves a queue round trip per step), and the other tuples.
    WaitingTuples heap;
    Unit carry{0, 0, -1};
    bool has_carry = false;
    std::int64_t next_single = 0;
    std::int64_t next_seq = n;
    // The greatest of the three sources' fronts, by (spread, −seq), removed from its source.
    auto pop = [&]() -> Unit {
      Unit best{-1, 0, -1};
      int source = -1;
      if (next_single < n) {
        best = Unit{Load(Single(static_cast<std::size_t>(next_single))), next_single, -1};
        source = 0;
      }
      if (has_carry && (source < 0 || SmallerSpread()(best, carry))) {
        best = carry;
        source = 1;
      }
      if (!heap.empty() && (source < 0 || SmallerSpread()(best, heap.Top()))) {
        best = heap.Top();
        source = 2;
      }
      if (source == 0) {
        ++next_single;
      } else if (source == 1) {
        has_carry = false;
      } else {
        heap.Pop();
      }
      return best;
    };
    if (n == 1) return Extract(NewTuple(SingleOf(pop())));
    while (true) {
      Unit x = pop();
      Unit y = pop();
      if (x.tuple < 0) std::swap(x, y);
      std::int32_t id = x.tuple;
      if (id < 0) {
        id = NewTuple(SingleOf(x));
        AddSingle(pool_[static_cast<std::size_t>(id)], SingleOf(y));
      } else if (y.tuple < 0) {
        AddSingle(pool_[static_cast<std::size_t>(id)], SingleOf(y));
      } else {
        Combine(pool_[static_cast<std::size_t>(id)], pool_[static_cast<std::size_t>(y.tuple)]);
        FreeTuple(y.tuple);
      }
      if (next_single == n && heap.empty() && !has_carry) return Extract(id);
      if (has_carry) heap.Push(carry);
      carry = Unit{Spread(pool_[static_cast<std::size_t>(id)]), next_seq++, id};
      has_carry = true;
    }
  }

  Assignment RunEqualSize() {
    const std::size_t n = n_;
    if (n == 0) return {};
    // Chunks of k consecutive sorted items: one item per part, so every part ends
    // with one item from each full chunk and at most one from the last chunk. A chunk
    // is listed lightest weight first, ties by index descending; the combinations
    // below read their tuples in that listed order (merging, as if ascending), which
    // the assignments depend on.
    std::priority_queue<Unit, std::vector<Unit>, SmallerSpread> heap;
    std::int64_t next_seq = 0;
    for (std::size_t start = 0; start < n; start += k_) {
      const std::size_t end = std::min(n, start + k_);
      const std::int32_t id = AllocateTuple();
      Tuple& t = pool_[static_cast<std::size_t>(id)];
      t.base.reserve(end - start);
      for (std::size_t s = end; s-- > start;) t.base.push_back(Single(s));
      t.max_slot = t.base.back();
      heap.push(Unit{Spread(t), next_seq++, id});
    }
    while (heap.size() > 1) {
      const Unit x = heap.top();
      heap.pop();
      const Unit y = heap.top();
      heap.pop();
      CombineListed(pool_[static_cast<std::size_t>(x.tuple)],
                    pool_[static_cast<std::size_t>(y.tuple)]);
      FreeTuple(y.tuple);
      heap.push(Unit{Spread(pool_[static_cast<std::size_t>(x.tuple)]), next_seq++, x.tuple});
    }
    return Extract(heap.top().tuple);
  }

 private:
  // A tuple's slots in two parts: `base`, ascending from position `lo` (its lighter
  // slots leave from the front), and `recent`, a binary min-heap of the slots added
  // since `base` was last rebuilt. A step then touches only the slots it changes: the
  // lightest is the lighter of two fronts, a new slot goes into the heap, and the
  // heap is sorted and merged into `base` only when a combination would otherwise pop
  // most of it. (The equal-size mode lists its tuples in `base` alone, lo = 0.)
  struct Tuple {
    std::vector<Key> base;
    std::size_t lo = 0;
    std::vector<Key> recent;
    Key max_slot = 0;  // the heaviest slot, when the tuple is not empty

    std::size_t size() const { return base.size() - lo + recent.size(); }
  };

  std::int64_t Load(Key slot) const { return static_cast<std::int64_t>(slot >> head_bits_); }
  std::int32_t Head(Key slot) const { return static_cast<std::int32_t>(slot & head_mask_); }

  // A combination rebuilds and merges whole tuples unless one has more than this many
  // times the other's slots; then only the m lightest of each leave their heaps.
  static constexpr std::size_t kLopsided = 8;

  // A freed tuple keeps its slots' storage for the next one up to this many slots
  // (most tuples are small; a few large ones give theirs back, so memory stays O(n + k)).
  static constexpr std::size_t kKeptCapacity = 64;

  // A new slot goes into a tuple's sorted run when at most this many of its slots are
  // lighter (else into its heap); see InsertIntoBase.
  static constexpr std::size_t kNearFront = 8;

  // SortSlots sorts this many 64-bit slots or more by radix.
  static constexpr std::size_t kRadixSortFrom = 128;

  // The single item at sorted position `s`.
  Key Single(std::size_t s) const {
    if constexpr (std::is_same_v<Key, std::uint64_t>) {
      if (!singles_.empty()) return singles_[s];
    }
    return static_cast<Key>(sorted_[s]) << head_bits_ |
           static_cast<Key>(static_cast<std::uint32_t>(order_[s]));
  }
  Key SingleOf(const Unit& unit) const { return Single(static_cast<std::size_t>(unit.seq)); }

  // The lightest slot. Precondition: t.size() > 0.
  static Key Lightest(const Tuple& t) {
    if (t.recent.empty()) return t.base[t.lo];
    if (t.lo == t.base.size()) return t.recent.front();
    return std::min(t.base[t.lo], t.recent.front());
  }

  static Key PopLightest(Tuple& t) {
    if (t.recent.empty() || (t.lo < t.base.size() && t.base[t.lo] < t.recent.front())) {
      return t.base[t.lo++];
    }
    std::pop_heap(t.recent.begin(), t.recent.end(), std::greater<Key>());
    const Key slot = t.recent.back();
    t.recent.pop_back();
    return slot;
  }

  static void PushRecent(Tuple& t, Key slot) {
    t.recent.push_back(slot);
    std::push_heap(t.recent.begin(), t.recent.end(), std::greater<Key>());
  }

  std::int64_t Spread(const Tuple& t) const {
    return Load(t.max_slot) - (t.size() == k_ ? Load(Lightest(t)) : 0);
  }

  // An empty tuple from the free list (its storage reused) or a new one.
  std::int32_t AllocateTuple() {
    if (!free_.empty()) {
      const std::int32_t id = free_.back();
      free_.pop_back();
      return id;
    }
    pool_.emplace_back();
    return static_cast<std::int32_t>(pool_.size() - 1);
  }

  std::int32_t NewTuple(Key slot) {
    const std::int32_t id = AllocateTuple();
    Tuple& t = pool_[static_cast<std::size_t>(id)];
    t.base.push_back(slot);
    t.max_slot = slot;
    return id;
  }

  static void Release(std::vector<Key>& slots) {
    if (slots.capacity() > kKeptCapacity) {
      std::vector<Key>().swap(slots);
    } else {
      slots.clear();
    }
  }

  void FreeTuple(std::int32_t id) {
    Tuple& t = pool_[static_cast<std::size_t>(id)];
    Release(t.base);
    Release(t.recent);
    t.lo = 0;
    t.max_slot = 0;
    free_.push_back(id);
  }

  // The union of two slots: both loads, a's first item. The join is logged (b's first
  // item goes where a's goes); Extract replays the log backwards.
  Key Join(Key a, Key b) {
    const std::int32_t head_b = Head(b);
    joins_[num_joins_++] = Link{head_b, Head(a)};
    return a + (b - static_cast<Key>(static_cast<std::uint32_t>(head_b)));
  }

  void AddSingle(Tuple& t, Key s) {
    if (t.size() == k_) {  // joins the lightest part
      const Key joined = Join(PopLightest(t), s);
      PushRecent(t, joined);
      t.max_slot = std::max(t.max_slot, joined);
      return;
    }
    // Opens a new part: the items come heaviest first, so the new slot is usually
    // among the lightest few (or, in a run of equal weights, the heaviest) of `base`.
    if (!InsertIntoBase(t, s)) PushRecent(t, s);
    t.max_slot = std::max(t.max_slot, s);
  }

  // Inserts `slot` into t.base when its place is within kNearFront slots of the front
  // or at the back; false (t unchanged) otherwise. Room at the front is made by moving
  // the run to the back of twice its size (amortised O(1) a slot).
  static bool InsertIntoBase(Tuple& t, Key slot) {
    if (t.lo == t.base.size() || slot > t.base.back()) {
      t.base.push_back(slot);
      return true;
    }
    const std::size_t limit = std::min(t.base.size(), t.lo + kNearFront);
    std::size_t at = t.lo;  // the first slot heavier than `slot`
    while (at < limit && t.base[at] < slot) ++at;
    if (at == limit) return false;
    if (t.lo == 0) {
      const std::size_t size = t.base.size();
      const std::size_t room = std::max<std::size_t>(size, 4);
      t.base.resize(size + room);
      std::copy_backward(t.base.begin(), t.base.begin() + static_cast<std::ptrdiff_t>(size),
                         t.base.end());
      t.lo = room;
      at += room;
    }
    Key* const base = t.base.data();
    std::copy(base + t.lo, base + at, base + t.lo - 1);
    base[at - 1] = slot;
    --t.lo;
    return true;
  }

  // Sorts `slots` ascending: std::sort below kRadixSortFrom slots (and for 128-bit keys),
  // else a least-significant-digit radix sort by bytes that skips the bytes all the
  // slots share (most of a load's, some of a first item's), all bytes counted in one
  // read.
  void SortSlots(std::vector<Key>& slots) {
    const std::size_t m = slots.size();
    if constexpr (std::is_same_v<Key, std::uint64_t>) {
      if (m >= kRadixSortFrom) {
        std::uint64_t all_and = ~std::uint64_t{0};
        std::uint64_t all_or = 0;
        std::uint32_t counts[8][256] = {};
        for (const std::uint64_t slot : slots) {
          all_and &= slot;
          all_or |= slot;
          for (int d = 0; d < 8; ++d) ++counts[d][(slot >> (8 * d)) & 0xff];
        }
        const std::uint64_t varying = all_and ^ all_or;
        spare_.resize(m);
        std::uint64_t* in = slots.data();
        std::uint64_t* out = spare_.data();
        for (int d = 0; d < 8; ++d) {
          if (((varying >> (8 * d)) & 0xff) == 0) continue;
          std::uint32_t* const next = counts[d];
          std::uint32_t total = 0;
          for (int b = 0; b < 256; ++b) {
            const std::uint32_t c = next[b];
            next[b] = total;
            total += c;
          }
          for (std::size_t i = 0; i < m; ++i) out[next[(in[i] >> (8 * d)) & 0xff]++] = in[i];
          std::swap(in, out);
        }
        if (in != slots.data()) std::copy(in, in + m, slots.data());
        return;
      }
    }
    std::sort(slots.begin(), slots.end());
  }

  // Sorts `recent` into `base`: all of t ascending in base, lo = 0.
  void Rebuild(Tuple& t) {
    if (t.recent.empty()) return;
    SortSlots(t.recent);
    if (t.lo == t.base.size()) {
      t.base.swap(t.recent);
      t.lo = 0;
    } else {
      MergeIntoBase(t, t.recent.data(), t.recent.size());
    }
    t.recent.clear();
  }

  // Merges the ascending slots [from, from + r) into t's run: all of the run ascending
  // in base, lo = 0. In place, from the back (no buffer changes hands, so none is
  // reallocated).
  static void MergeIntoBase(Tuple& t, const Key* from, std::size_t r) {
    const std::size_t nb = t.base.size() - t.lo;
    if (t.lo > 0) {
      std::copy(t.base.begin() + static_cast<std::ptrdiff_t>(t.lo), t.base.end(), t.base.begin());
    }
    t.base.resize(nb + r);
    t.lo = 0;
    Key* const base = t.base.data();
    std::size_t i = nb;
    std::size_t out = nb + r;
    while (r > 0) {
      if (i > 0 && base[i - 1] > from[r - 1]) {
        base[--out] = base[--i];
      } else {
        base[--out] = from[--r];
      }
    }
  }

  // Before `pops` slots leave t lightest first: rebuilds `base` when that costs less
  // than popping the heap (about pops · 2 log r comparisons against r log r + |base|).
  void Prepare(Tuple& t, std::size_t pops) {
    const std::size_t r = t.recent.size();
    if (r == 0) return;
    const auto log_r = static_cast<std::size_t>(std::bit_width(r));
    if (r * log_r + (t.base.size() - t.lo) < 2 * std::min(pops, r) * log_r) Rebuild(t);
  }

  // Combines `b` into `a` (see the file comment). Between a large and a small tuple,
  // the m lightest slots of each leave (ascending) and are joined in pairs, and the
  // small remainder and the joined slots go into the large remainder's heap, which
  // becomes a's: O(s log k) for a small tuple of s slots, where merging was O(k).
  void Combine(Tuple& a, Tuple& b) {
    const std::size_t na = a.size();
    const std::size_t nb = b.size();
    const std::size_t m = na + nb > k_ ? na + nb - k_ : 0;
    if (kLopsided * std::min(na, nb) >= std::max(na, nb)) {
      // Comparable sizes: both sorted, then three merges; with no overlap (m = 0), the
      // union, one merge of b's run into a's.
      Rebuild(a);
      Rebuild(b);
      if (m > 0) {
        CombineListed(a, b);
        return;
      }
      MergeIntoBase(a, b.base.data() + b.lo, nb);
      a.max_slot = std::max(a.max_slot, b.max_slot);
      b.base.clear();
      b.lo = 0;
      return;
    }
    if (m > 0) {
      Prepare(a, m);
      Prepare(b, m);
      low_a_.resize(m);
      low_b_.resize(m);
      for (std::size_t j = 0; j < m; ++j) low_a_[j] = PopLightest(a);
      for (std::size_t j = 0; j < m; ++j) low_b_[j] = PopLightest(b);
    }
    // The heaviest slot of a non-empty remainder is its tuple's heaviest.
    Key max_slot = 0;
    if (a.size() > 0) max_slot = a.max_slot;
    if (b.size() > 0) max_slot = std::max(max_slot, b.max_slot);
    Tuple& large = a.size() >= b.size() ? a : b;
    Tuple& small = a.size() >= b.size() ? b : a;
    std::vector<Key>& heap = large.recent;
    const std::size_t before = heap.size();
    for (std::size_t j = 0; j < m; ++j) {
      const Key joined = Join(low_a_[j], low_b_[m - 1 - j]);
      max_slot = std::max(max_slot, joined);
      heap.push_back(joined);
    }
    heap.insert(heap.end(), small.base.begin() + static_cast<std::ptrdiff_t>(small.lo),
                small.base.end());
    heap.insert(heap.end(), small.recent.begin(), small.recent.end());
    if (heap.size() - before > before) {
      std::make_heap(heap.begin(), heap.end(), std::greater<Key>());
    } else {
      for (std::size_t i = before + 1; i <= heap.size(); ++i) {
        std::push_heap(heap.begin(), heap.begin() + static_cast<std::ptrdiff_t>(i),
                       std::greater<Key>());
      }
    }
    small.base.clear();
    small.recent.clear();
    small.lo = 0;
    if (&large != &a) {
      a.base.swap(b.base);
      a.recent.swap(b.recent);
      std::swap(a.lo, b.lo);
    }
    a.max_slot = max_slot;
    assert(a.size() == std::min(k_, na + nb));
  }

  // The combination of two tuples listed in `base` alone (ascending in kAny mode; see
  // RunEqualSize for the other): a's j-th listed slot meets b's (m − 1 − j)-th, the
  // overlap is sorted, and the three runs are merged into a's `base`.
  void CombineListed(Tuple& a, Tuple& b) {
    const std::size_t na = a.size();
    const std::size_t nb = b.size();
    const std::size_t m = na + nb > k_ ? na + nb - k_ : 0;
    const Key* const first_a = a.base.data() + a.lo;
    const Key* const first_b = b.base.data() + b.lo;
    overlap_.resize(m);
    for (std::size_t j = 0; j < m; ++j) overlap_[j] = Join(first_a[j], first_b[m - 1 - j]);
    SortSlots(overlap_);
    scratch_.resize(na + nb - 2 * m);
    const auto rest =
        std::merge(first_a + m, first_a + na, first_b + m, first_b + nb, scratch_.begin());
    // a's slots are all read: the result goes over them (its storage only ever grows).
    a.base.resize(na + nb - m);
    a.lo = 0;
    std::merge(scratch_.begin(), rest, overlap_.begin(), overlap_.end(), a.base.begin());
    assert(a.base.size() == std::min(k_, na + nb));
    a.max_slot = a.base.back();
  }

  // Part p is the p-th heaviest slot (in the equal-size mode, the p-th from the end of
  // the listed order). A slot's first item goes to its part; then, in the reverse
  // order of the joins, every joined item goes where the item it joined went (which is
  // final by then: it was joined later, or never). The steps are independent loads,
  // not a chain of them.
  Assignment Extract(std::int32_t id) {
    Tuple& t = pool_[static_cast<std::size_t>(id)];
    Rebuild(t);
    Assignment assignment(n_, 0);
    const std::size_t size = t.size();
    for (std::size_t s = 0; s < size; ++s) {
      assignment[static_cast<std::size_t>(Head(t.base[t.lo + s]))] =
          static_cast<std::int32_t>(size - 1 - s);
    }
    for (std::size_t j = num_joins_; j-- > 0;) {
      assignment[static_cast<std::size_t>(joins_[j].item)] =
          assignment[static_cast<std::size_t>(joins_[j].with)];
    }
    return assignment;
  }

  // The items heaviest first: as slots, or as weights (sorted_[s] is the weight of order_[s]).
  std::span<const std::uint64_t> singles_;
  std::span<const std::int64_t> sorted_;
  std::span<const std::int32_t> order_;
  std::size_t n_;
  std::size_t k_;
  int head_bits_ = 32;  // a slot's first item: its low head_bits_ bits
  Key head_mask_ = 0xffff'ffffu;
  std::unique_ptr<Link[]> joins_;  // every join, in order (at most n − 1)
  std::size_t num_joins_ = 0;
  std::vector<Tuple> pool_;
  std::vector<std::int32_t> free_;
  std::vector<Key> scratch_;
  std::vector<Key> overlap_;
  std::vector<Key> spare_;  // SortSlots' buffer
  std::vector<Key> low_a_;
  std::vector<Key> low_b_;
};

}  // namespace

namespace internal {

Assignment KarmarkarKarpSorted(std::span<const std::int64_t> weights,
                               std::span<const std::int32_t> order, std::int64_t num_parts,
                               PartSizes sizes, std::span<const std::int64_t> sorted_weights,
                               std::int64_t total) {
  std::vector<std::int64_t> gathered;
  if (sorted_weights.size() != order.size()) {
    gathered.resize(order.size());
    for (std::size_t s = 0; s < order.size(); ++s) {
      gathered[s] = weights[static_cast<std::size_t>(order[s])];
    }
    sorted_weights = gathered;
  }
  // Every load is at most the total.
  if (total < 0) {
    total = 0;
    for (const std::int64_t w : sorted_weights) total += w;
  }
  // 64-bit slots when the first items' bits (those of n − 1) leave room for the total.
  const int head_bits = std::max(1, static_cast<int>(std::bit_width(order.size())));
  if (std::bit_width(static_cast<std::uint64_t>(total)) + head_bits <= 64) {
    Differencer<std::uint64_t> differencer(sorted_weights, order, num_parts, head_bits);
    return sizes == PartSizes::kEqual ? differencer.RunEqualSize() : differencer.RunUnconstrained();
  }
  Differencer<WideKey> differencer(sorted_weights, order, num_parts, 32);
  return sizes == PartSizes::kEqual ? differencer.RunEqualSize() : differencer.RunUnconstrained();
}

}  // namespace internal

Assignment KarmarkarKarp(std::span<const std::int64_t> weights, std::int64_t num_parts,
                         PartSizes sizes) {
  internal::CheckNumParts(num_parts);
  const std::int64_t total = internal::CheckWeights(weights, "weights");
  if (total < (std::int64_t{1} << 32)) {
    // Every weight is below 2^32: the radix sort writes the slots themselves.
    const std::unique_ptr<std::uint64_t[]> singles = internal::HeaviestFirstSlots(weights);
    Differencer<std::uint64_t> differencer(
        std::span<const std::uint64_t>(singles.get(), weights.size()), num_parts);
    return sizes == PartSizes::kEqual ? differencer.RunEqualSize() : differencer.RunUnconstrained();
  }
  std::vector<std::int64_t> sorted;
  const std::vector<std::int32_t> order = internal::HeaviestFirst(weights, &sorted);
  return internal::KarmarkarKarpSorted(weights, order, num_parts, sizes, sorted, total);
}

}  // namespace rlsched::balance
