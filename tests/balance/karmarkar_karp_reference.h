// The Karmarkar-Karp of rlsched before issue 11's rewrite (balance/src/karmarkar_karp.cc
// at commit 17302f7), kept verbatim as the reference the faster one must match item for
// item: same input, same assignment. Test-only.

#ifndef RLSCHED_TESTS_BALANCE_KARMARKAR_KARP_REFERENCE_H_
#define RLSCHED_TESTS_BALANCE_KARMARKAR_KARP_REFERENCE_H_

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <numeric>
#include <optional>
#include <queue>
#include <span>
#include <vector>

#include "rlsched/balance/partition.h"

namespace rlsched::balance::testing::reference_kk {

struct Slot {
  std::int64_t load;
  std::int32_t head;  // first item of the slot's list
  std::int32_t tail;  // last item
};

// Order of slots: lighter first, then by first item (a total order: lists are disjoint).
inline bool Lighter(const Slot& a, const Slot& b) {
  return a.load != b.load ? a.load < b.load : a.head < b.head;
}
// std's heap functions keep the comparator's greatest at the root: invert for a min-heap.
inline bool Heavier(const Slot& a, const Slot& b) { return Lighter(b, a); }

struct Tuple {
  std::vector<Slot> slots;  // a min-heap; ascending when `sorted`
  std::int64_t max_load = 0;
  bool sorted = true;
};

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

class Differencer {
 public:
  Differencer(std::span<const std::int64_t> weights, std::span<const std::int32_t> order,
              std::int64_t num_parts)
      : weights_(weights),
        order_(order),
        k_(static_cast<std::size_t>(num_parts)),
        next_(weights.size(), -1) {}

  Assignment RunUnconstrained() {
    const std::int64_t n = static_cast<std::int64_t>(order_.size());
    if (n == 0) return {};
    // Three sources of units, each by spread: the sorted single items (spread =
    // weight, seq = position), the tuple just combined (`carry`, usually the next to
    // be taken: this saves a heap round trip per step), and a heap of the other tuples.
    std::priority_queue<Unit, std::vector<Unit>, SmallerSpread> heap;
    std::optional<Unit> carry;
    std::int64_t next_single = 0;
    std::int64_t next_seq = n;
    auto pop = [&]() -> Unit {
      Unit best{-1, 0, -1};
      int source = -1;
      auto consider = [&](const Unit& unit, int from) {
        if (source < 0 || SmallerSpread()(best, unit)) {
          best = unit;
          source = from;
        }
      };
      if (next_single < n) {
        consider(Unit{Weight(order_[static_cast<std::size_t>(next_single)]), next_single, -1}, 0);
      }
      if (carry) consider(*carry, 1);
      if (!heap.empty()) consider(heap.top(), 2);
      if (source == 0) ++next_single;
      if (source == 1) carry.reset();
      // Source 2 implies a non-empty heap; testing it again quiets a g++ 12
      // -Warray-bounds false positive.
      if (source == 2 && !heap.empty()) heap.pop();
      return best;
    };
    if (n == 1) return Extract(NewTuple({SingleOf(pop())}));
    while (true) {
      Unit x = pop();
      Unit y = pop();
      if (x.tuple < 0) std::swap(x, y);
      std::int32_t id = x.tuple;
      if (id < 0) {
        id = NewTuple({SingleOf(x)});
        AddSingle(pool_[static_cast<std::size_t>(id)], SingleOf(y));
      } else if (y.tuple < 0) {
        AddSingle(pool_[static_cast<std::size_t>(id)], SingleOf(y));
      } else {
        Combine(pool_[static_cast<std::size_t>(id)], pool_[static_cast<std::size_t>(y.tuple)]);
        FreeTuple(y.tuple);
      }
      if (next_single == n && heap.empty() && !carry) return Extract(id);
      if (carry) heap.push(*carry);
      carry = Unit{Spread(pool_[static_cast<std::size_t>(id)]), next_seq++, id};
    }
  }

  Assignment RunEqualSize() {
    const std::size_t n = order_.size();
    if (n == 0) return {};
    // Chunks of k consecutive sorted items: one item per part, so every part ends
    // with one item from each full chunk and at most one from the last chunk.
    std::priority_queue<Unit, std::vector<Unit>, SmallerSpread> heap;
    std::int64_t next_seq = 0;
    for (std::size_t start = 0; start < n; start += k_) {
      const std::size_t end = std::min(n, start + k_);
      std::vector<Slot> chunk;
      chunk.reserve(end - start);
      for (std::size_t i = end; i-- > start;) chunk.push_back(Single(order_[i]));
      const std::int32_t id = NewTuple(std::move(chunk));
      heap.push(Unit{Spread(pool_[static_cast<std::size_t>(id)]), next_seq++, id});
    }
    while (heap.size() > 1) {
      const Unit x = heap.top();
      heap.pop();
      const Unit y = heap.top();
      heap.pop();
      Combine(pool_[static_cast<std::size_t>(x.tuple)], pool_[static_cast<std::size_t>(y.tuple)]);
      FreeTuple(y.tuple);
      heap.push(Unit{Spread(pool_[static_cast<std::size_t>(x.tuple)]), next_seq++, x.tuple});
    }
    return Extract(heap.top().tuple);
  }

 private:
  std::int64_t Weight(std::int32_t item) const { return weights_[static_cast<std::size_t>(item)]; }
  Slot Single(std::int32_t item) const { return Slot{Weight(item), item, item}; }
  Slot SingleOf(const Unit& unit) const {
    return Single(order_[static_cast<std::size_t>(unit.seq)]);
  }

  std::int64_t Spread(const Tuple& t) const {
    return t.max_load - (t.slots.size() == k_ ? t.slots.front().load : 0);
  }

  // `slots` ascending.
  std::int32_t NewTuple(std::vector<Slot> slots) {
    Tuple t{std::move(slots), 0, true};
    t.max_load = t.slots.back().load;
    if (!free_.empty()) {
      const std::int32_t id = free_.back();
      free_.pop_back();
      pool_[static_cast<std::size_t>(id)] = std::move(t);
      return id;
    }
    pool_.push_back(std::move(t));
    return static_cast<std::int32_t>(pool_.size() - 1);
  }

  void FreeTuple(std::int32_t id) {
    pool_[static_cast<std::size_t>(id)] = Tuple{};
    free_.push_back(id);
  }

  // Concatenates b's items after a's.
  Slot Join(const Slot& a, const Slot& b) {
    next_[static_cast<std::size_t>(a.tail)] = b.head;
    return Slot{a.load + b.load, a.head, b.tail};
  }

  void AddSingle(Tuple& t, const Slot& s) {
    auto& slots = t.slots;
    Slot added = s;
    if (slots.size() == k_) {  // joins the lightest part
      std::pop_heap(slots.begin(), slots.end(), Heavier);
      added = Join(slots.back(), s);
      slots.back() = added;
    } else {  // opens a new part
      slots.push_back(added);
    }
    t.sorted = false;
    std::push_heap(slots.begin(), slots.end(), Heavier);
    t.max_load = std::max(t.max_load, added.load);
  }

  void Sort(Tuple& t) {
    if (!t.sorted) std::sort(t.slots.begin(), t.slots.end(), Lighter);
    t.sorted = true;
  }

  // Combines `b` into `a` (see the file comment).
  void Combine(Tuple& a, Tuple& b) {
    Sort(a);
    Sort(b);
    const std::size_t na = a.slots.size();
    const std::size_t nb = b.slots.size();
    const std::size_t m = na + nb > k_ ? na + nb - k_ : 0;
    overlap_.clear();
    for (std::size_t j = 0; j < m; ++j) overlap_.push_back(Join(a.slots[j], b.slots[m - 1 - j]));
    std::sort(overlap_.begin(), overlap_.end(), Lighter);
    scratch_.clear();
    std::merge(a.slots.begin() + static_cast<std::ptrdiff_t>(m), a.slots.end(),
               b.slots.begin() + static_cast<std::ptrdiff_t>(m), b.slots.end(),
               std::back_inserter(scratch_), Lighter);
    a.slots.clear();
    std::merge(scratch_.begin(), scratch_.end(), overlap_.begin(), overlap_.end(),
               std::back_inserter(a.slots), Lighter);
    assert(a.slots.size() == std::min(k_, na + nb));
    a.max_load = a.slots.back().load;
  }

  // Part p is the p-th heaviest slot.
  Assignment Extract(std::int32_t id) {
    Tuple& t = pool_[static_cast<std::size_t>(id)];
    Sort(t);
    Assignment assignment(weights_.size(), 0);
    const std::size_t size = t.slots.size();
    for (std::size_t s = 0; s < size; ++s) {
      const std::int32_t part = static_cast<std::int32_t>(size - 1 - s);
      for (std::int32_t item = t.slots[s].head; item != -1;
           item = next_[static_cast<std::size_t>(item)]) {
        assignment[static_cast<std::size_t>(item)] = part;
      }
    }
    return assignment;
  }

  std::span<const std::int64_t> weights_;
  std::span<const std::int32_t> order_;  // heaviest first
  std::size_t k_;
  std::vector<std::int32_t> next_;
  std::vector<Tuple> pool_;
  std::vector<std::int32_t> free_;
  std::vector<Slot> scratch_;
  std::vector<Slot> overlap_;
};

// Item indices by weight descending, ties by index ascending.
inline std::vector<std::int32_t> HeaviestFirst(std::span<const std::int64_t> weights) {
  std::vector<std::int32_t> order(weights.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
    return weights[static_cast<std::size_t>(a)] > weights[static_cast<std::size_t>(b)];
  });
  return order;
}

inline Assignment KarmarkarKarp(std::span<const std::int64_t> weights, std::int64_t num_parts,
                                PartSizes sizes) {
  const std::vector<std::int32_t> order = HeaviestFirst(weights);
  Differencer differencer(weights, order, num_parts);
  return sizes == PartSizes::kEqual ? differencer.RunEqualSize() : differencer.RunUnconstrained();
}

}  // namespace rlsched::balance::testing::reference_kk

#endif  // RLSCHED_TESTS_BALANCE_KARMARKAR_KARP_REFERENCE_H_
