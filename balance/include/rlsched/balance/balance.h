// rlsched/balance/balance.h — balance a batch of sequences across ranks.
//
// Overview
//   The entry point a trainer calls: sequence lengths (and, for GRPO, the group of
//   each sequence) in, one part per data-parallel rank out. Lengths are turned into
//   costs by a CostModel, then partitioned by PartitionItems(). With keep_groups all
//   sequences of a group land in the same part: the group is the unit, its cost the
//   sum of its members' costs, and in equal-size mode the parts hold equal numbers
//   of groups (not of sequences).
//
// Example
//   rlsched::balance::BalanceOptions options;
//   options.partition.num_parts = 8;
//   options.partition.equal_size = true;
//   options.cost = rlsched::balance::CostModel::Attention(rlsched::balance::ModelShape{});
//   rlsched::balance::BalanceResult r = rlsched::balance::Balance(lengths, {}, options);
//   // r.partition.part(rank) are the sequence indices of `rank`, ascending;
//   // r.partition.loads are costs, r.tokens the token counts.
//
// Thread-safety: pure; concurrent calls are safe.

#ifndef RLSCHED_BALANCE_BALANCE_H_
#define RLSCHED_BALANCE_BALANCE_H_

#include <cstdint>
#include <span>
#include <vector>

#include "rlsched/balance/cost_model.h"
#include "rlsched/balance/partition.h"

namespace rlsched::balance {

struct BalanceOptions {
  PartitionOptions partition;
  CostModel cost = CostModel::Tokens();
  // Keep every group in one part. Requires `groups`.
  bool keep_groups = false;
};

struct BalanceResult {
  // Indices are sequence indices; loads, max_load, min_load, lower_bound and gap are
  // in cost units. With keep_groups the bound is over groups.
  Partition partition;
  std::vector<std::int64_t> tokens;  // per part, the sum of its sequences' lengths
};

// Preconditions (else std::invalid_argument naming the field and the bound):
//   lengths.size() <= kMaxItems, 0 <= each length <= kMaxLength; groups empty or of
//   the same size as lengths, each group id >= 0; keep_groups needs groups; the
//   options as for PartitionItems(); total cost and tokens fit in int64.
// Complexity: O(n log n) plus PartitionItems() on n sequences (or on the groups).
BalanceResult Balance(std::span<const std::int64_t> lengths, std::span<const std::int64_t> groups,
                      const BalanceOptions& options);

// The same figures for an assignment made elsewhere (e.g. ContiguousSplit), with the
// bound of the sequences (not of groups). Preconditions as Balance(), and assignment
// entries in [0, num_parts).
BalanceResult Evaluate(std::span<const std::int64_t> lengths, const BalanceOptions& options,
                       const Assignment& assignment);

}  // namespace rlsched::balance

#endif  // RLSCHED_BALANCE_BALANCE_H_
