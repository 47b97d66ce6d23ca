#include "rlsched/balance/balance.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "internal.h"
#include "rlsched/common/check.h"
#include "rlsched/common/error.h"

namespace rlsched::balance {
namespace {

void CheckLengths(std::span<const std::int64_t> lengths) {
  internal::CheckWeights(lengths, "lengths");
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    CheckAtMost({"lengths", i}, lengths[i], {kMaxLength, "2^31"});
  }
}

// Throws unless `groups` is empty or one id >= 0 per length, and not empty when
// `options` keep groups (of a non-empty batch).
void CheckGroups(std::span<const std::int64_t> groups, std::size_t num_lengths,
                 const BalanceOptions& options) {
  if (options.keep_groups && groups.empty() && num_lengths > 0) {
    rlsched::Fail("groups", "keep_groups requires one group id per length");
  }
  if (!groups.empty() && groups.size() != num_lengths) {
    rlsched::Fail("groups", "must be empty or have one id per length (" +
                                std::to_string(num_lengths) + "), got " +
                                std::to_string(groups.size()));
  }
  for (std::size_t i = 0; i < groups.size(); ++i) CheckAtLeast({"groups", i}, groups[i], 0);
}

std::vector<std::int64_t> PartTokens(std::span<const std::int64_t> lengths,
                                     const Partition& partition) {
  std::vector<std::int64_t> tokens(static_cast<std::size_t>(partition.num_parts()), 0);
  for (std::int64_t p = 0; p < partition.num_parts(); ++p) {
    for (const std::int64_t i : partition.part(p)) {
      tokens[static_cast<std::size_t>(p)] += lengths[static_cast<std::size_t>(i)];
    }
  }
  return tokens;
}

}  // namespace

namespace internal {

Partition BalancedPartition(std::span<const std::int64_t> lengths,
                            std::span<const std::int64_t> costs,
                            std::span<const std::int64_t> groups, const BalanceOptions& options,
                            std::span<const std::int32_t> order,
                            std::span<const std::int64_t> sorted) {
  CheckGroups(groups, lengths.size(), options);
  internal::CheckNumParts(options.partition.num_parts);
  if (!options.keep_groups) {
    CheckPartitionOptions(options.partition);
    return internal::PartitionSorted(costs, order, sorted, options.partition);
  }
  // Units are the groups, numbered by ascending group id.
  std::vector<std::int32_t> by_group(lengths.size());
  std::iota(by_group.begin(), by_group.end(), 0);
  std::stable_sort(by_group.begin(), by_group.end(), [&](std::int32_t a, std::int32_t b) {
    return groups[static_cast<std::size_t>(a)] < groups[static_cast<std::size_t>(b)];
  });
  std::vector<std::int32_t> unit_of(lengths.size());
  std::vector<std::int64_t> unit_costs;
  for (std::size_t j = 0; j < by_group.size(); ++j) {
    const std::size_t i = static_cast<std::size_t>(by_group[j]);
    if (j == 0 || groups[i] != groups[static_cast<std::size_t>(by_group[j - 1])]) {
      unit_costs.push_back(0);
    }
    unit_costs.back() += costs[i];  // cannot overflow: the total was checked
    unit_of[i] = static_cast<std::int32_t>(unit_costs.size() - 1);
  }
  const Partition units = PartitionItems(unit_costs, options.partition);
  Assignment unit_part(unit_costs.size());
  for (std::int64_t p = 0; p < units.num_parts(); ++p) {
    for (const std::int64_t u : units.part(p)) {
      unit_part[static_cast<std::size_t>(u)] = static_cast<std::int32_t>(p);
    }
  }
  Assignment assignment(lengths.size());
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    assignment[i] = unit_part[static_cast<std::size_t>(unit_of[i])];
  }
  Partition partition =
      MakePartition(costs, options.partition.num_parts, PartSizes::kAny, assignment);
  // The groups' bound is the stronger one (and the only valid one in equal-size
  // mode, where counts are of groups).
  partition.lower_bound = units.lower_bound;
  partition.gap = units.gap;
  partition.proven_optimal = units.proven_optimal;
  partition.refine_steps = units.refine_steps;
  return partition;
}

Assignment BalancedAssignment(std::span<const std::int64_t> lengths,
                              std::span<const std::int64_t> costs,
                              std::span<const std::int64_t> groups, const BalanceOptions& options,
                              std::span<const std::int32_t> order,
                              std::span<const std::int64_t> sorted) {
  CheckGroups(groups, lengths.size(), options);
  internal::CheckNumParts(options.partition.num_parts);
  internal::CheckPartitionOptions(options.partition);
  return internal::AssignSorted(costs, order, sorted, options.partition).assignment;
}

}  // namespace internal

BalanceResult Balance(std::span<const std::int64_t> lengths, std::span<const std::int64_t> groups,
                      const BalanceOptions& options) {
  CheckLengths(lengths);
  CheckGroups(groups, lengths.size(), options);
  internal::CheckNumParts(options.partition.num_parts);
  const std::vector<std::int64_t> costs = options.cost.Costs(lengths);
  internal::CheckWeights(costs, "cost");

  BalanceResult result;
  if (!options.keep_groups) {
    result.partition = PartitionItems(costs, options.partition);
  } else {
    result.partition = internal::BalancedPartition(lengths, costs, groups, options, {}, {});
  }
  result.tokens = PartTokens(lengths, result.partition);
  return result;
}

BalanceResult Evaluate(std::span<const std::int64_t> lengths, const BalanceOptions& options,
                       const Assignment& assignment) {
  CheckLengths(lengths);
  const std::vector<std::int64_t> costs = options.cost.Costs(lengths);
  internal::CheckWeights(costs, "cost");
  BalanceResult result;
  result.partition = MakePartition(costs, options.partition.num_parts,
                                   PartSizesFor(options.partition.equal_size), assignment);
  result.tokens = PartTokens(lengths, result.partition);
  return result;
}

}  // namespace rlsched::balance
