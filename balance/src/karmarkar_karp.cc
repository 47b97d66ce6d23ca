// Karmarkar-Karp (largest differencing method) for k parts, with sparse tuples.
//
// A tuple is a partial solution: up to k non-empty parts ("slots"), each with a load
// and a linked list of items (through `next_`), sorted heaviest first; the missing
// slots are empty parts of load 0. Loads are absolute (never normalised), so a
// tuple's spread is front - back when all k slots are used, else front - 0.
// Combining A and B pairs A's i-th heaviest slot with B's i-th lightest:
//   out[i] = A[i] + B[k-1-i].
// When |A| + |B| <= k no two slots meet and `out` is the sorted union. Otherwise the
// result has three sorted runs: A[0, k-|B|) alone, the overlap A[i] + B[k-1-i] for
// i in [k-|B|, |A|) (sorted here), and B[0, k-|A|) alone — merged in O(k).

#include <algorithm>
#include <cassert>
#include <queue>
#include <vector>

#include "internal.h"
#include "rlsched/balance/partition.h"

namespace rlsched::balance {
namespace {

struct Slot {
  std::int64_t load;
  std::int32_t head;  // first item of the slot's list
  std::int32_t tail;  // last item
};

// Order inside a tuple: heavier first, then by first item (deterministic).
bool Heavier(const Slot& a, const Slot& b) {
  return a.load != b.load ? a.load > b.load : a.head < b.head;
}

// A unit waiting to be combined: either a single item or a tuple in the pool.
struct Unit {
  std::int64_t spread;
  std::int64_t seq;    // tie-break: smaller first
  std::int32_t tuple;  // index into the pool, or -1 for the single item `seq`
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

  Slot Single(std::int32_t item) const {
    return Slot{weights_[static_cast<std::size_t>(item)], item, item};
  }

  std::int64_t Spread(const std::vector<Slot>& tuple) const {
    return tuple.front().load - (tuple.size() == k_ ? tuple.back().load : 0);
  }

  std::int32_t NewTuple(std::vector<Slot> slots) {
    if (!free_.empty()) {
      const std::int32_t id = free_.back();
      free_.pop_back();
      pool_[static_cast<std::size_t>(id)] = std::move(slots);
      return id;
    }
    pool_.push_back(std::move(slots));
    return static_cast<std::int32_t>(pool_.size() - 1);
  }

  void FreeTuple(std::int32_t id) {
    std::vector<Slot>().swap(pool_[static_cast<std::size_t>(id)]);
    free_.push_back(id);
  }

  std::vector<Slot>& Tuple(std::int32_t id) { return pool_[static_cast<std::size_t>(id)]; }

  // Concatenates b's items after a's.
  Slot Join(const Slot& a, const Slot& b) {
    next_[static_cast<std::size_t>(a.tail)] = b.head;
    return Slot{a.load + b.load, a.head, b.tail};
  }

  // Combines the single slot `s` into `a` in place.
  void AddSingle(std::vector<Slot>& a, Slot s) {
    if (a.size() == k_) {
      s = Join(a.back(), s);
      a.pop_back();
    }
    a.insert(std::upper_bound(a.begin(), a.end(), s, Heavier), s);
  }

  // Combines `b` into `a` in place (see the file comment).
  void Combine(std::vector<Slot>& a, const std::vector<Slot>& b) {
    const std::size_t na = a.size();
    const std::size_t nb = b.size();
    if (nb == 1) return AddSingle(a, b.front());
    if (na == 1) {
      Slot s = a.front();
      a = b;
      return AddSingle(a, s);
    }
    scratch_.clear();
    if (na + nb <= k_) {
      std::merge(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(scratch_), Heavier);
      a.assign(scratch_.begin(), scratch_.end());
      return;
    }
    overlap_.clear();
    for (std::size_t i = k_ - nb; i < na; ++i) overlap_.push_back(Join(a[i], b[k_ - 1 - i]));
    std::sort(overlap_.begin(), overlap_.end(), Heavier);
    const auto a_alone = a.begin() + static_cast<std::ptrdiff_t>(k_ - nb);
    const auto b_alone = b.begin() + static_cast<std::ptrdiff_t>(k_ - na);
    std::merge(a.begin(), a_alone, b.begin(), b_alone, std::back_inserter(scratch_), Heavier);
    a.clear();
    std::merge(scratch_.begin(), scratch_.end(), overlap_.begin(), overlap_.end(),
               std::back_inserter(a), Heavier);
    assert(a.size() == k_);
  }

  Assignment Extract(const std::vector<Slot>& tuple) const {
    Assignment assignment(weights_.size(), 0);
    for (std::size_t part = 0; part < tuple.size(); ++part) {
      for (std::int32_t item = tuple[part].head; item != -1;
           item = next_[static_cast<std::size_t>(item)]) {
        assignment[static_cast<std::size_t>(item)] = static_cast<std::int32_t>(part);
      }
    }
    return assignment;
  }

  Assignment RunUnconstrained() {
    const std::span<const std::int32_t> order = order_;
    const std::int64_t n = static_cast<std::int64_t>(order.size());
    // Two sources of units, both ordered by spread: the sorted single items
    // (spread = weight, seq = position) and a heap of combined tuples (seq >= n).
    std::priority_queue<Unit, std::vector<Unit>, SmallerSpread> heap;
    std::int64_t next_single = 0;
    std::int64_t next_seq = n;
    auto pop = [&]() -> Unit {
      if (next_single < n) {
        const Unit single{weights_[static_cast<std::size_t>(order[next_single])], next_single, -1};
        if (heap.empty() || SmallerSpread()(heap.top(), single)) {
          ++next_single;
          return single;
        }
      }
      Unit top = heap.top();
      heap.pop();
      return top;
    };
    auto slots_of = [&](const Unit& u) -> std::vector<Slot> {
      return {Single(order[static_cast<std::size_t>(u.seq)])};
    };
    while ((n - next_single) + static_cast<std::int64_t>(heap.size()) > 1) {
      Unit x = pop();
      Unit y = pop();
      if (x.tuple < 0 && y.tuple >= 0) std::swap(x, y);
      std::int32_t id;
      if (x.tuple < 0) {  // two single items
        id = NewTuple(slots_of(x));
        AddSingle(Tuple(id), slots_of(y).front());
      } else if (y.tuple < 0) {
        id = x.tuple;
        AddSingle(Tuple(id), Single(order[static_cast<std::size_t>(y.seq)]));
      } else {
        id = x.tuple;
        Combine(Tuple(id), Tuple(y.tuple));
        FreeTuple(y.tuple);
      }
      heap.push(Unit{Spread(Tuple(id)), next_seq++, id});
    }
    if (n == 0) return {};
    if (heap.empty()) return Extract(slots_of(pop()));
    return Extract(Tuple(heap.top().tuple));
  }

  Assignment RunEqualSize() {
    const std::span<const std::int32_t> order = order_;
    const std::size_t n = order.size();
    if (n == 0) return {};
    // Chunks of k consecutive sorted items: one item per part, so every part ends
    // with one item from each full chunk and at most one from the last chunk.
    std::priority_queue<Unit, std::vector<Unit>, SmallerSpread> heap;
    std::int64_t next_seq = 0;
    for (std::size_t start = 0; start < n; start += k_) {
      std::vector<Slot> chunk;
      chunk.reserve(std::min(k_, n - start));
      for (std::size_t i = start; i < std::min(n, start + k_); ++i) {
        chunk.push_back(Single(order[i]));
      }
      const std::int32_t id = NewTuple(std::move(chunk));
      heap.push(Unit{Spread(Tuple(id)), next_seq++, id});
    }
    while (heap.size() > 1) {
      const Unit x = heap.top();
      heap.pop();
      const Unit y = heap.top();
      heap.pop();
      Combine(Tuple(x.tuple), Tuple(y.tuple));
      FreeTuple(y.tuple);
      heap.push(Unit{Spread(Tuple(x.tuple)), next_seq++, x.tuple});
    }
    return Extract(Tuple(heap.top().tuple));
  }

 private:
  std::span<const std::int64_t> weights_;
  std::span<const std::int32_t> order_;  // heaviest first
  std::size_t k_;
  std::vector<std::int32_t> next_;
  std::vector<std::vector<Slot>> pool_;
  std::vector<std::int32_t> free_;
  std::vector<Slot> scratch_;
  std::vector<Slot> overlap_;
};

}  // namespace

namespace internal {

Assignment KarmarkarKarpSorted(std::span<const std::int64_t> weights,
                               std::span<const std::int32_t> order, std::int64_t num_parts,
                               bool equal_size) {
  Differencer differencer(weights, order, num_parts);
  return equal_size ? differencer.RunEqualSize() : differencer.RunUnconstrained();
}

}  // namespace internal

Assignment KarmarkarKarp(std::span<const std::int64_t> weights, std::int64_t num_parts,
                         bool equal_size) {
  internal::CheckNumParts(num_parts);
  internal::CheckWeights(weights, "weights");
  return internal::KarmarkarKarpSorted(weights, internal::HeaviestFirst(weights), num_parts,
                                       equal_size);
}

}  // namespace rlsched::balance
