// The items heaviest first as Karmarkar-Karp's 64-bit slots (private header; the order
// alone is internal::HeaviestFirst, internal.h).

#ifndef RLSCHED_BALANCE_SRC_ORDER_H_
#define RLSCHED_BALANCE_SRC_ORDER_H_

#include <cstdint>
#include <memory>
#include <span>

namespace rlsched::balance::internal {

// slots[s] = weights[i] · 2^32 + i for the item i at position s of HeaviestFirst(weights)
// (weight descending, ties by index ascending): one array of 8 bytes an item where the
// order and the sorted weights take 12, written by the radix sort's last pass.
// Precondition: every weight in [0, 2^32) and weights.size() < 2^32.
std::unique_ptr<std::uint64_t[]> HeaviestFirstSlots(std::span<const std::int64_t> weights);

}  // namespace rlsched::balance::internal

#endif  // RLSCHED_BALANCE_SRC_ORDER_H_
