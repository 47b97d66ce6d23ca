// The common recipe's balancing, as verl runs it (private header): its workload key
// and its Karmarkar-Karp, for PlanBaseline() (step_baseline.cc).
//
// Source: verl, verl/utils/seqlen_balancing.py (calculate_workload, karmarkar_karp,
// get_seqlen_balanced_partitions), read at commit
// b178a3cd56f58b2d502255daba591e92833930a7. This is a re-implementation of the same
// method with the same order and ties, not a copy: rlsched's own Karmarkar-Karp
// (karmarkar_karp.cc) breaks ties differently and cuts equal-size chunks from the
// heaviest end, so it gives other partitions on the same keys.

#ifndef RLSCHED_BALANCE_SRC_RECIPE_PARTITION_H_
#define RLSCHED_BALANCE_SRC_RECIPE_PARTITION_H_

#include <cstdint>
#include <span>
#include <vector>

#include "rlsched/balance/partition.h"

namespace rlsched::balance::internal {

// An exact sum of workloads (n of them, each below 2^63).
__extension__ typedef __int128 RecipeSum;

// verl's per-sequence workload, 24576·L + L² (its estimate of a 7B model's FLOPs,
// hidden size 4096, up to a factor). Precondition: 0 <= length <= kMaxLength (then
// it fits in int64).
inline std::int64_t RecipeWorkload(std::int64_t length) { return 24576 * length + length * length; }

// How RecipeKarmarkarKarp() lists a part's items: by index ascending, or by (value,
// index) ascending.
enum class RecipeOrder { kIndex, kValue };

// verl's Karmarkar-Karp into `num_parts` parts, returned in its order (a part's
// items as `order` says, the parts as its final partial solution sorts them: by sum,
// then item count, then first item, descending; empty parts last).
//
// The method: every item starts as a partial solution of k part sums (kAny: the item
// alone in one part; kEqual: the items sorted ascending by (value, index) and cut
// into chunks of k consecutive items, one item per part, from the lightest end). The
// two partial solutions of largest spread (heaviest − lightest part; ties: the one
// whose heaviest part is greater, by (sum, item count, first item)) are popped and
// combined, the i-th heaviest part of the first with the i-th lightest of the second,
// until one is left.
//
// Where verl asserts: with kEqual and n not a multiple of k, the last (heaviest)
// chunk holds the n mod k items left (verl requires k to divide n); fewer items than
// parts, or an empty part, are allowed (verl asserts n >= k and no empty part). Sums
// are exact (64-bit when the total fits, else 128-bit). Precondition: values >= 0,
// num_parts >= 1, at most kMaxItems values.
// O(merges · s log s), s the parts a partial solution fills: O(n log k) with kEqual,
// O(n · min(n, k) · log k) at worst with kAny.
std::vector<std::vector<std::int64_t>> RecipeKarmarkarKarp(std::span<const std::int64_t> values,
                                                           std::int64_t num_parts, PartSizes sizes,
                                                           RecipeOrder order = RecipeOrder::kIndex);

// The items ascending by (value, index) (a radix sort, O(n · passes)); with `sorted`,
// also the values in that order.
std::vector<std::int32_t> RecipeAscending(std::span<const std::int64_t> values,
                                          std::vector<std::int64_t>* sorted = nullptr);

// RecipeAscending() given HeaviestFirst(values) (`order`) and the values in that
// order (`sorted_values`, turned into the values in the ascending order). O(n).
std::vector<std::int32_t> RecipeAscendingFrom(std::vector<std::int32_t> order,
                                              std::vector<std::int64_t>& sorted_values);

// RecipeKarmarkarKarp()'s partition by position in the ascending order, for callers
// that read the items in that order (no gather at random places): the part of every
// position (0 the first part in verl's order), and the parts' sums and item counts in
// that order (the empty parts last, with 0).
struct RecipePartition {
  std::vector<std::int32_t> part_of_position;
  std::vector<RecipeSum> sums;
  std::vector<std::int32_t> counts;
};

// How RecipeKarmarkarKarpPositions() runs the method: kGeneral, one implementation of
// both modes (the one RecipeKarmarkarKarp() runs); kFast, the same steps with less
// work where a mode allows it (equal sizes: the chunks read from the input, flat
// blocks of parts, one sort per combination). Both give the same partition; kGeneral
// is what the tests hold kFast to.
enum class RecipeMethod { kFast, kGeneral };

// The partition of the items whose values, ascending by (value, index), are
// `sorted_values` and whose indices in that order are `ascending` (neither checked).
// Preconditions as RecipeKarmarkarKarp().
RecipePartition RecipeKarmarkarKarpPositions(std::span<const std::int64_t> sorted_values,
                                             std::span<const std::int32_t> ascending,
                                             std::int64_t num_parts, PartSizes sizes,
                                             RecipeMethod method = RecipeMethod::kFast);

// RecipeKarmarkarKarp() given RecipeAscending(values) (or the same order found
// another way), which it does not check.
std::vector<std::vector<std::int64_t>> RecipeKarmarkarKarpSorted(
    std::span<const std::int64_t> values, std::span<const std::int32_t> ascending,
    std::int64_t num_parts, PartSizes sizes, RecipeOrder order);

}  // namespace rlsched::balance::internal

#endif  // RLSCHED_BALANCE_SRC_RECIPE_PARTITION_H_
