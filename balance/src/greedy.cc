// Greedy LPT: items by weight descending onto the lightest part that may take one.

#include <algorithm>
#include <queue>
#include <utility>
#include <vector>

#include "internal.h"
#include "rlsched/balance/partition.h"

namespace rlsched::balance {

namespace internal {

Assignment GreedyLptSorted(std::span<const std::int64_t> weights,
                           std::span<const std::int32_t> order, std::int64_t num_parts,
                           PartSizes sizes) {
  const bool equal_size = sizes == PartSizes::kEqual;
  const std::int64_t n = static_cast<std::int64_t>(weights.size());

  // Lightest part first, then lowest index.
  using Entry = std::pair<std::int64_t, std::int32_t>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> open;
  // Only as many parts as items can receive one, so n < k never touches the rest.
  const std::int64_t used_parts = std::min(num_parts, std::max<std::int64_t>(n, 1));
  for (std::int32_t p = 0; p < used_parts; ++p) open.emplace(0, p);

  // Equal size: every part takes `floor` items, and `extra` of them one more.
  const std::int64_t floor = n / num_parts;
  const std::int64_t extra = n % num_parts;
  std::int64_t extra_used = 0;
  std::vector<std::int64_t> counts(static_cast<std::size_t>(num_parts), 0);

  Assignment assignment(weights.size(), 0);
  for (const std::int32_t item : order) {
    auto [load, part] = open.top();
    open.pop();
    // In equal-size mode a part at `floor` closes once every extra slot is taken.
    while (equal_size && counts[static_cast<std::size_t>(part)] == floor && extra_used == extra) {
      std::tie(load, part) = open.top();
      open.pop();
    }
    assignment[static_cast<std::size_t>(item)] = part;
    const std::int64_t count = ++counts[static_cast<std::size_t>(part)];
    if (equal_size && count == floor + 1) {
      ++extra_used;
      continue;  // full
    }
    open.emplace(load + weights[static_cast<std::size_t>(item)], part);
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
