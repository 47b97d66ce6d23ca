// Pieces shared by the balancer's sources (private header): input checks and the
// constructive algorithms on pre-sorted items.

#ifndef RLSCHED_BALANCE_SRC_INTERNAL_H_
#define RLSCHED_BALANCE_SRC_INTERNAL_H_

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

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
