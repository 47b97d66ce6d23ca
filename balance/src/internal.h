// Pieces shared by the balancer's sources (private header): input checks and the
// constructive algorithms on pre-sorted items.

#ifndef RLSCHED_BALANCE_SRC_INTERNAL_H_
#define RLSCHED_BALANCE_SRC_INTERNAL_H_

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "rlsched/balance/balance.h"
#include "rlsched/balance/partition.h"

namespace rlsched::balance::internal {

// Throws std::invalid_argument unless 1 <= num_parts <= kMaxParts.
void CheckNumParts(std::int64_t num_parts);

// Throws std::invalid_argument unless weights.size() <= kMaxItems, every weight >= 0
// and the sum fits in int64. `field` names the input in messages. Returns the sum.
std::int64_t CheckWeights(std::span<const std::int64_t> weights, std::string_view field);

// Throws std::invalid_argument unless assignment.size() == num_items and every entry
// is in [0, num_parts).
void CheckAssignment(std::span<const std::int32_t> assignment, std::size_t num_items,
                     std::int64_t num_parts);

// a + b, throwing std::invalid_argument naming `field` on int64 overflow.
std::int64_t CheckedAdd(std::int64_t a, std::int64_t b, std::string_view field);
// a * b, likewise.
std::int64_t CheckedMul(std::int64_t a, std::int64_t b, std::string_view field);

// Item indices by weight descending, ties by index ascending. An LSD radix sort: when
// the weights span less than 2^32, one 64-bit word per item and balanced digits of at
// most 11 bits (passes by the span); else 64-bit keys, 11-bit digits. O(n · passes).
// Precondition: weights validated by CheckWeights. With `sorted`, also the weights in
// that order (sorted[s] = weights[order[s]]), which the radix sort has at hand.
std::vector<std::int32_t> HeaviestFirst(std::span<const std::int64_t> weights,
                                        std::vector<std::int64_t>* sorted = nullptr);

// KarmarkarKarp() and GreedyLpt() without input checks, on `order` = HeaviestFirst().
// `sorted_weights`, when given (of order's size), are the weights in that order; else
// KarmarkarKarpSorted gathers them (its hot loop reads them in order, not at random).
// `total`, when known (>= 0), is the weights' sum (CheckWeights returns it); else
// KarmarkarKarpSorted adds them up.
Assignment KarmarkarKarpSorted(std::span<const std::int64_t> weights,
                               std::span<const std::int32_t> order, std::int64_t num_parts,
                               PartSizes sizes, std::span<const std::int64_t> sorted_weights = {},
                               std::int64_t total = -1);
Assignment GreedyLptSorted(std::span<const std::int64_t> weights,
                           std::span<const std::int32_t> order, std::int64_t num_parts,
                           PartSizes sizes);

// Throws std::invalid_argument naming the field unless options.exact is usable
// (max_nodes >= 0, a clock with a time limit): PartitionItems()'s check of its options
// beside num_parts.
void CheckPartitionOptions(const PartitionOptions& options);

// PartitionItems() without input checks, on `order` = HeaviestFirst(weights) and
// `sorted` the weights in that order (as HeaviestFirst() gives them): the same
// partition. For callers that sorted the weights already.
Partition PartitionSorted(std::span<const std::int64_t> weights,
                          std::span<const std::int32_t> order, std::span<const std::int64_t> sorted,
                          const PartitionOptions& options);

// PartitionSorted()'s assignment before its Partition is made, with what the
// refinement and the exact search report.
struct SortedAssignment {
  Assignment assignment;
  std::int64_t lower_bound = 0;  // LowerBound() of the weights
  std::int64_t refine_steps = 0;
  std::int64_t exact_nodes = 0;
  bool proven_optimal = false;  // by the exact search
};

// LowerBound() from the weights sorted descending (checked by CheckWeights): the same
// bound without a selection over a copy. O(n).
std::int64_t LowerBoundSorted(std::span<const std::int64_t> sorted, std::int64_t num_parts,
                              PartSizes sizes);

// MakePartition() without input checks, given the weights' LowerBound().
Partition MakePartitionBounded(std::span<const std::int64_t> weights, std::int64_t num_parts,
                               const Assignment& assignment, std::int64_t lower_bound);
SortedAssignment AssignSorted(std::span<const std::int64_t> weights,
                              std::span<const std::int32_t> order,
                              std::span<const std::int64_t> sorted,
                              const PartitionOptions& options);

// Balance()'s partition of `lengths` (each in [0, kMaxLength], as Pad() checks them),
// given their costs under options.cost (`costs`, checked by CheckWeights()) and, when
// options.keep_groups is off, those costs' HeaviestFirst() order and sorted values:
// the same partition (and the same errors for bad groups or options), without the
// lengths checked, the costs computed and sorted again, nor the parts' tokens.
Partition BalancedPartition(std::span<const std::int64_t> lengths,
                            std::span<const std::int64_t> costs,
                            std::span<const std::int64_t> groups, const BalanceOptions& options,
                            std::span<const std::int32_t> order,
                            std::span<const std::int64_t> sorted);

// BalancedPartition() without groups kept (options.keep_groups off): the part of
// every sequence, for callers that need no Partition.
Assignment BalancedAssignment(std::span<const std::int64_t> lengths,
                              std::span<const std::int64_t> costs,
                              std::span<const std::int64_t> groups, const BalanceOptions& options,
                              std::span<const std::int32_t> order,
                              std::span<const std::int64_t> sorted);

// Refine() without input checks, and optionally with a second dimension: `sizes`
// (one per item, or empty for none) whose per-part sum a step never takes above
// `capacity` (nor above the part's current sum when that is already over).
// `part_sizes` is the count constraint (Refine()'s `sizes`).
std::int64_t RefineWithCapacity(std::span<const std::int64_t> weights,
                                std::span<const std::int64_t> sizes, std::int64_t capacity,
                                std::int64_t num_parts, PartSizes part_sizes,
                                const RefineOptions& options, std::int64_t lower_bound,
                                Assignment& assignment);

}  // namespace rlsched::balance::internal

#endif  // RLSCHED_BALANCE_SRC_INTERNAL_H_
