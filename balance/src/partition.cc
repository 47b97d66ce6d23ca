#include "rlsched/balance/partition.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "internal.h"
#include "rlsched/balance/exact.h"
#include "rlsched/common/check.h"
#include "rlsched/common/error.h"

namespace rlsched::balance {
namespace internal {

void CheckNumParts(std::int64_t num_parts) { CheckInRange("num_parts", num_parts, 1, kMaxParts); }

std::int64_t CheckedAdd(std::int64_t a, std::int64_t b, std::string_view field) {
  std::int64_t sum = 0;
  if (__builtin_add_overflow(a, b, &sum)) {
    rlsched::Fail(std::string(field), "the total overflows int64");
  }
  return sum;
}

std::int64_t CheckedMul(std::int64_t a, std::int64_t b, std::string_view field) {
  std::int64_t product = 0;
  if (__builtin_mul_overflow(a, b, &product)) {
    rlsched::Fail(std::string(field), "the total overflows int64");
  }
  return product;
}

std::int64_t CheckWeights(std::span<const std::int64_t> weights, std::string_view field) {
  if (static_cast<std::int64_t>(weights.size()) > kMaxItems) {
    rlsched::Fail(std::string(field), "at most " + std::to_string(kMaxItems) + " entries, got " +
                                          std::to_string(weights.size()));
  }
  // One pass without branches; the failing entry found again, in order, on failure.
  std::int64_t sum = 0;
  bool bad = false;
  for (const std::int64_t w : weights) {
    bad |= w < 0;
    bad |= __builtin_add_overflow(sum, w, &sum);
  }
  if (!bad) return sum;
  sum = 0;
  for (std::size_t i = 0; i < weights.size(); ++i) {
    CheckAtLeast({field, i}, weights[i], 0);
    sum = CheckedAdd(sum, weights[i], field);
  }
  return sum;
}

void CheckAssignment(std::span<const std::int32_t> assignment, std::size_t num_items,
                     std::int64_t num_parts) {
  if (assignment.size() != num_items) {
    rlsched::Fail("assignment", "must have one entry per item (" + std::to_string(num_items) +
                                    "), got " + std::to_string(assignment.size()));
  }
  for (std::size_t i = 0; i < assignment.size(); ++i) {
    CheckBelow({"assignment", i}, assignment[i], 0, num_parts);
  }
}

void CheckPartitionOptions(const PartitionOptions& options) {
  CheckAtLeast("exact.max_nodes", options.exact.max_nodes, 0);
  if (options.exact.time_limit.count() > 0 && !options.exact.now) {
    rlsched::Fail("exact.now", "a clock is required with exact.time_limit");
  }
}

}  // namespace internal

std::int64_t LowerBound(std::span<const std::int64_t> weights, std::int64_t num_parts,
                        PartSizes sizes) {
  internal::CheckNumParts(num_parts);
  const std::int64_t sum = internal::CheckWeights(weights, "weights");
  if (weights.empty()) return 0;
  const std::int64_t largest = *std::max_element(weights.begin(), weights.end());
  std::int64_t bound = std::max(largest, sum / num_parts + (sum % num_parts != 0 ? 1 : 0));
  const std::int64_t per_part = static_cast<std::int64_t>(weights.size()) / num_parts;
  if (sizes == PartSizes::kEqual && per_part >= 2) {
    // The part holding the largest item also holds at least per_part - 1 others.
    std::vector<std::int64_t> copy(weights.begin(), weights.end());
    const auto nth = copy.begin() + (per_part - 1);
    std::nth_element(copy.begin(), nth, copy.end());
    std::int64_t smallest = 0;
    for (auto it = copy.begin(); it != nth; ++it) smallest += *it;
    bound = std::max(bound, largest + smallest);
  }
  return bound;
}

Assignment ContiguousSplit(std::int64_t num_items, std::int64_t num_parts) {
  internal::CheckNumParts(num_parts);
  CheckInRange("num_items", num_items, 0, kMaxItems);
  const std::int64_t floor = num_items / num_parts;
  const std::int64_t extra = num_items % num_parts;
  Assignment assignment(static_cast<std::size_t>(num_items));
  std::int64_t item = 0;
  for (std::int64_t part = 0; part < num_parts && item < num_items; ++part) {
    const std::int64_t size = floor + (part < extra ? 1 : 0);
    for (std::int64_t i = 0; i < size; ++i) {
      assignment[static_cast<std::size_t>(item++)] = static_cast<std::int32_t>(part);
    }
  }
  return assignment;
}

Partition MakePartition(std::span<const std::int64_t> weights, std::int64_t num_parts,
                        PartSizes sizes, const Assignment& assignment) {
  internal::CheckNumParts(num_parts);
  internal::CheckAssignment(assignment, weights.size(), num_parts);
  return internal::MakePartitionBounded(weights, num_parts, assignment,
                                        LowerBound(weights, num_parts, sizes));
}

namespace internal {

std::int64_t LowerBoundSorted(std::span<const std::int64_t> sorted, std::int64_t num_parts,
                              PartSizes sizes) {
  const std::int64_t sum = CheckWeights(sorted, "weights");
  if (sorted.empty()) return 0;
  const std::int64_t largest = sorted.front();
  std::int64_t bound = std::max(largest, sum / num_parts + (sum % num_parts != 0 ? 1 : 0));
  const std::int64_t per_part = static_cast<std::int64_t>(sorted.size()) / num_parts;
  if (sizes == PartSizes::kEqual && per_part >= 2) {
    // The part holding the largest item also holds at least per_part - 1 others.
    std::int64_t smallest = 0;
    for (std::int64_t i = 1; i < per_part; ++i) smallest += sorted[sorted.size() - i];
    bound = std::max(bound, largest + smallest);
  }
  return bound;
}

Partition MakePartitionBounded(std::span<const std::int64_t> weights, std::int64_t num_parts,
                               const Assignment& assignment, std::int64_t lower_bound) {
  Partition result;
  result.lower_bound = lower_bound;
  const std::size_t k = static_cast<std::size_t>(num_parts);
  result.offsets.assign(k + 1, 0);
  result.loads.assign(k, 0);
  for (std::size_t i = 0; i < assignment.size(); ++i) {
    const std::size_t part = static_cast<std::size_t>(assignment[i]);
    ++result.offsets[part + 1];
    result.loads[part] += weights[i];  // cannot overflow: the total was checked
  }
  for (std::size_t p = 0; p < k; ++p) result.offsets[p + 1] += result.offsets[p];
  result.indices.resize(assignment.size());
  std::vector<std::int64_t> cursor(result.offsets.begin(), result.offsets.end() - 1);
  for (std::size_t i = 0; i < assignment.size(); ++i) {
    result.indices[static_cast<std::size_t>(cursor[static_cast<std::size_t>(assignment[i])]++)] =
        static_cast<std::int64_t>(i);
  }
  const auto [min_it, max_it] = std::minmax_element(result.loads.begin(), result.loads.end());
  result.min_load = *min_it;
  result.max_load = *max_it;
  result.gap =
      result.lower_bound > 0
          ? static_cast<double>(result.max_load) / static_cast<double>(result.lower_bound) - 1.0
          : 0.0;
  result.proven_optimal = result.max_load == result.lower_bound;
  return result;
}

}  // namespace internal

namespace {

std::int64_t MaxLoad(std::span<const std::int64_t> weights, std::int64_t num_parts,
                     const Assignment& assignment) {
  std::vector<std::int64_t> loads(static_cast<std::size_t>(num_parts), 0);
  for (std::size_t i = 0; i < assignment.size(); ++i) {
    loads[static_cast<std::size_t>(assignment[i])] += weights[i];
  }
  return *std::max_element(loads.begin(), loads.end());
}

}  // namespace

Partition PartitionItems(std::span<const std::int64_t> weights, const PartitionOptions& options) {
  internal::CheckNumParts(options.num_parts);
  internal::CheckWeights(weights, "weights");
  internal::CheckPartitionOptions(options);
  std::vector<std::int64_t> sorted;
  const std::vector<std::int32_t> order = internal::HeaviestFirst(weights, &sorted);
  return internal::PartitionSorted(weights, order, sorted, options);
}

namespace internal {

SortedAssignment AssignSorted(std::span<const std::int64_t> weights,
                              std::span<const std::int32_t> order,
                              std::span<const std::int64_t> sorted,
                              const PartitionOptions& options) {
  const std::int64_t k = options.num_parts;
  const PartSizes sizes = PartSizesFor(options.equal_size);
  const std::int64_t bound = sorted.size() == weights.size() ? LowerBoundSorted(sorted, k, sizes)
                                                             : LowerBound(weights, k, sizes);
  SortedAssignment result;
  result.lower_bound = bound;
  Assignment& assignment = result.assignment;
  if (options.algorithm == Algorithm::kGreedy) {
    assignment = GreedyLptSorted(weights, order, k, sizes);
  } else {
    assignment = KarmarkarKarpSorted(weights, order, k, sizes, sorted);
    // LPT as the fallback, unless KK already meets the bound.
    const std::int64_t kk_max = MaxLoad(weights, k, assignment);
    if (kk_max > bound) {
      Assignment lpt = GreedyLptSorted(weights, order, k, sizes);
      if (MaxLoad(weights, k, lpt) < kk_max) assignment = std::move(lpt);
    }
  }
  result.refine_steps = Refine(weights, k, sizes, options.refine, bound, assignment);
  // Small instances: the exact search improves the answer and may prove it optimal.
  if (options.exact.max_nodes > 0 && static_cast<std::int64_t>(weights.size()) <= kExactMaxItems &&
      k <= kExactMaxParts && MaxLoad(weights, k, assignment) > bound) {
    ExactResult exact = ExactSearch(weights, k, sizes, assignment, options.exact);
    assignment = std::move(exact.assignment);
    result.proven_optimal = exact.proven_optimal;
    result.exact_nodes = exact.nodes;
  }
  return result;
}

Partition PartitionSorted(std::span<const std::int64_t> weights,
                          std::span<const std::int32_t> order, std::span<const std::int64_t> sorted,
                          const PartitionOptions& options) {
  const SortedAssignment assigned = AssignSorted(weights, order, sorted, options);
  Partition result =
      MakePartitionBounded(weights, options.num_parts, assigned.assignment, assigned.lower_bound);
  result.refine_steps = assigned.refine_steps;
  result.exact_nodes = assigned.exact_nodes;
  result.proven_optimal = result.proven_optimal || assigned.proven_optimal;
  return result;
}

}  // namespace internal

}  // namespace rlsched::balance
