// Greedy LPT: items by weight descending onto the lightest part that may take one.

#include <algorithm>
#include <utility>
#include <vector>

#include "internal.h"
#include "rlsched/balance/partition.h"

namespace rlsched::balance {

namespace internal {

namespace {

// The open parts, lightest first (ties: lowest index): a binary min-heap of keys
// load · 2^32 + part whose top is replaced in place (one sift instead of a pop and a
// push). Every part is in it at most once, so the order is total and the top is the
// same as any heap's.
class OpenParts {
 public:
  explicit OpenParts(std::int64_t parts) {
    heap_.reserve(static_cast<std::size_t>(parts));
    // Loads 0 in ascending part order: already a heap.
    for (std::int64_t p = 0; p < parts; ++p) heap_.push_back(static_cast<Key>(p));
  }

  std::int64_t TopLoad() const { return static_cast<std::int64_t>(heap_.front() >> 32); }
  std::int32_t TopPart() const {
    return static_cast<std::int32_t>(static_cast<std::uint32_t>(heap_.front()));
  }

  // The top part's load becomes `load`.
  void ReplaceTop(std::int64_t load) {
    heap_.front() = static_cast<Key>(load) << 32 | (heap_.front() & 0xffff'ffffu);
    SiftDown();
  }

  void PopTop() {
    heap_.front() = heap_.back();
    heap_.pop_back();
    if (!heap_.empty()) SiftDown();
  }

 private:
  __extension__ typedef unsigned __int128 Key;

  void SiftDown() {
    const std::size_t size = heap_.size();
    const Key entry = heap_.front();
    std::size_t i = 0;
    while (true) {
      std::size_t child = 2 * i + 1;
      if (child >= size) break;
      if (child + 1 < size) child += heap_[child + 1] < heap_[child] ? 1 : 0;
      if (!(heap_[child] < entry)) break;
      heap_[i] = heap_[child];
      i = child;
    }
    heap_[i] = entry;
  }

  std::vector<Key> heap_;
};

}  // namespace

Assignment GreedyLptSorted(std::span<const std::int64_t> weights,
                           std::span<const std::int32_t> order, std::int64_t num_parts,
                           PartSizes sizes) {
  const bool equal_size = sizes == PartSizes::kEqual;
  const std::int64_t n = static_cast<std::int64_t>(weights.size());

  // Only as many parts as items can receive one, so n < k never touches the rest.
  OpenParts open(std::min(num_parts, std::max<std::int64_t>(n, 1)));

  // Equal size: every part takes `floor` items, and `extra` of them one more.
  const std::int64_t floor = n / num_parts;
  const std::int64_t extra = n % num_parts;
  std::int64_t extra_used = 0;
  std::vector<std::int64_t> counts(static_cast<std::size_t>(num_parts), 0);

  Assignment assignment(weights.size(), 0);
  for (const std::int32_t item : order) {
    // In equal-size mode a part at `floor` closes once every extra slot is taken.
    while (equal_size && counts[static_cast<std::size_t>(open.TopPart())] == floor &&
           extra_used == extra) {
      open.PopTop();
    }
    const std::int64_t load = open.TopLoad();
    const std::int32_t part = open.TopPart();
    assignment[static_cast<std::size_t>(item)] = part;
    const std::int64_t count = ++counts[static_cast<std::size_t>(part)];
    if (equal_size && count == floor + 1) {
      ++extra_used;
      open.PopTop();  // full
      continue;
    }
    open.ReplaceTop(load + weights[static_cast<std::size_t>(item)]);
  }
  return assignment;
}

}  // namespace internal

Assignment GreedyLpt(std::span<const std::int64_t> weights, std::int64_t num_parts,
                     PartSizes sizes) {
  internal::CheckNumParts(num_parts);
  internal::CheckWeights(weights, "weights");
  return internal::GreedyLptSorted(weights, internal::HeaviestFirst(weights), num_parts, sizes);
}

}  // namespace rlsched::balance
