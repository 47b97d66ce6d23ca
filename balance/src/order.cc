#include <algorithm>
#include <bit>
#include <numeric>
#include <vector>

#include "internal.h"

namespace rlsched::balance::internal {

std::vector<std::int32_t> HeaviestFirst(std::span<const std::int64_t> weights,
                                        std::vector<std::int64_t>* sorted) {
  const std::size_t n = weights.size();
  std::vector<std::int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  if (n < 512) {  // a comparison sort wins below the cost of the digit counters
    std::sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
      const std::int64_t wa = weights[static_cast<std::size_t>(a)];
      const std::int64_t wb = weights[static_cast<std::size_t>(b)];
      return wa != wb ? wa > wb : a < b;
    });
    if (sorted != nullptr) {
      sorted->resize(n);
      for (std::size_t s = 0; s < n; ++s) {
        (*sorted)[s] = weights[static_cast<std::size_t>(order[s])];
      }
    }
    return order;
  }
  // Ascending keys max - w give descending weights; each pass is stable, so equal
  // weights keep their index order.
  const std::uint64_t max =
      static_cast<std::uint64_t>(*std::max_element(weights.begin(), weights.end()));
  std::vector<std::uint64_t> keys(n);
  for (std::size_t i = 0; i < n; ++i) keys[i] = max - static_cast<std::uint64_t>(weights[i]);
  constexpr int kDigitBits = 11;
  constexpr std::size_t kBuckets = std::size_t{1} << kDigitBits;
  const int bits = std::max(1, static_cast<int>(std::bit_width(max)));
  std::vector<std::uint64_t> key_tmp(n);
  std::vector<std::int32_t> order_tmp(n);
  std::vector<std::size_t> counts(kBuckets);
  for (int shift = 0; shift < bits; shift += kDigitBits) {
    std::fill(counts.begin(), counts.end(), 0);
    for (const std::uint64_t key : keys) ++counts[(key >> shift) & (kBuckets - 1)];
    std::size_t total = 0;
    for (std::size_t& count : counts) {
      const std::size_t c = count;
      count = total;
      total += c;
    }
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t slot = counts[(keys[i] >> shift) & (kBuckets - 1)]++;
      key_tmp[slot] = keys[i];
      order_tmp[slot] = order[i];
    }
    keys.swap(key_tmp);
    order.swap(order_tmp);
  }
  if (sorted != nullptr) {
    sorted->resize(n);
    for (std::size_t s = 0; s < n; ++s) {
      (*sorted)[s] = static_cast<std::int64_t>(max - keys[s]);
    }
  }
  return order;
}

}  // namespace rlsched::balance::internal
