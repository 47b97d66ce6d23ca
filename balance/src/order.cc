#include "order.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <memory>
#include <numeric>
#include <vector>

#include "internal.h"

namespace rlsched::balance::internal {
namespace {

// Below this many items a comparison sort wins over the cost of the digit counters.
constexpr std::size_t kComparisonSortBelow = 512;

// From this many items the narrow radix sort (digits of at most kSmallDigitBits, fewer
// counters) beats a comparison sort, whose branches mispredict on unordered weights.
constexpr std::size_t kSmallRadixFrom = 48;

// The widest digit of a pass (2^11 counters: they stay in the L1 cache).
constexpr int kMaxDigitBits = 11;

// The widest digit of a pass below kComparisonSortBelow items.
constexpr int kSmallDigitBits = 8;

// Weights spanning less than 2^32: words (max − weight) · 2^32 + index sorted as plain
// integers (no indirection), the order of the comparison below.
std::vector<std::int32_t> PackedSort(std::span<const std::int64_t> weights, std::int64_t max,
                                     std::vector<std::int64_t>* sorted) {
  const std::size_t n = weights.size();
  std::vector<std::uint64_t> words(n);
  for (std::size_t i = 0; i < n; ++i) {
    words[i] = static_cast<std::uint64_t>(max - weights[i]) << 32 | i;
  }
  std::sort(words.begin(), words.end());
  std::vector<std::int32_t> order(n);
  for (std::size_t s = 0; s < n; ++s) {
    order[s] = static_cast<std::int32_t>(static_cast<std::uint32_t>(words[s]));
  }
  if (sorted != nullptr) {
    sorted->resize(n);
    for (std::size_t s = 0; s < n; ++s) {
      (*sorted)[s] = max - static_cast<std::int64_t>(words[s] >> 32);
    }
  }
  return order;
}

std::vector<std::int32_t> ComparisonSort(std::span<const std::int64_t> weights,
                                         std::vector<std::int64_t>* sorted) {
  const std::size_t n = weights.size();
  if (n > 1) {
    const auto [min, max] = std::minmax_element(weights.begin(), weights.end());
    const std::uint64_t range = static_cast<std::uint64_t>(*max) - static_cast<std::uint64_t>(*min);
    if (range >> 32 == 0) return PackedSort(weights, *max, sorted);
  }
  std::vector<std::int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
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

// The weights span less than 2^32 (max − min < 2^32): each item is one 64-bit word,
// key · 2^32 + index with key = max − weight, sorted by its key bits alone. Ascending
// keys give descending weights; each pass is stable and the words start in index
// order, so equal weights keep their index order. The digits of all passes are
// counted in one read of the weights; the first pass reads the weights, and the last
// hands each word to `place(s, word)` for its sorted position s instead of storing it.
template <typename Place>
void NarrowRadixSort(std::span<const std::int64_t> weights, std::int64_t max, std::uint64_t range,
                     Place&& place) {
  const std::size_t n = weights.size();
  const int widest = n < kComparisonSortBelow ? kSmallDigitBits : kMaxDigitBits;
  const int bits = std::max(1, static_cast<int>(std::bit_width(range)));
  const int passes = (bits + widest - 1) / widest;
  const int digit_bits = (bits + passes - 1) / passes;  // balanced digits: fewer counters
  const std::size_t buckets = std::size_t{1} << digit_bits;
  const std::uint64_t mask = buckets - 1;
  std::vector<std::uint32_t> counts(static_cast<std::size_t>(passes) * buckets, 0);
  for (const std::int64_t w : weights) {
    const std::uint64_t key = static_cast<std::uint64_t>(max - w);
    for (int p = 0; p < passes; ++p) {
      ++counts[static_cast<std::size_t>(p) * buckets + ((key >> (p * digit_bits)) & mask)];
    }
  }
  for (int p = 0; p < passes; ++p) {
    std::uint32_t total = 0;
    for (std::size_t d = 0; d < buckets; ++d) {
      std::uint32_t& count = counts[static_cast<std::size_t>(p) * buckets + d];
      const std::uint32_t c = count;
      count = total;
      total += c;
    }
  }
  if (passes == 1) {
    std::uint32_t* const next = counts.data();
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint64_t key = static_cast<std::uint64_t>(max - weights[i]);
      place(next[key & mask]++, key << 32 | i);
    }
    return;
  }
  // Uninitialised: every word is written before it is read.
  std::unique_ptr<std::uint64_t[]> words(new std::uint64_t[n]);
  std::unique_ptr<std::uint64_t[]> spare(passes > 2 ? new std::uint64_t[n] : nullptr);
  {
    std::uint32_t* const next = counts.data();
    std::uint64_t* const out = words.get();
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint64_t key = static_cast<std::uint64_t>(max - weights[i]);
      out[next[key & mask]++] = key << 32 | i;
    }
  }
  for (int p = 1; p + 1 < passes; ++p) {
    std::uint32_t* const next = counts.data() + static_cast<std::size_t>(p) * buckets;
    const int shift = 32 + p * digit_bits;
    const std::uint64_t* const in = words.get();
    std::uint64_t* const out = spare.get();
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint64_t word = in[i];
      out[next[(word >> shift) & mask]++] = word;
    }
    words.swap(spare);
  }
  std::uint32_t* const next = counts.data() + static_cast<std::size_t>(passes - 1) * buckets;
  const int shift = 32 + (passes - 1) * digit_bits;
  const std::uint64_t* const in = words.get();
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t word = in[i];
    place(next[(word >> shift) & mask]++, word);
  }
}

std::int32_t IndexOf(std::uint64_t word) {
  return static_cast<std::int32_t>(static_cast<std::uint32_t>(word));
}

// Any weights: 64-bit keys max − weight and the indices in arrays of their own.
std::vector<std::int32_t> WideRadixSort(std::span<const std::int64_t> weights,
                                        std::vector<std::int64_t>* sorted) {
  const std::size_t n = weights.size();
  std::vector<std::int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  const std::uint64_t max =
      static_cast<std::uint64_t>(*std::max_element(weights.begin(), weights.end()));
  std::vector<std::uint64_t> keys(n);
  for (std::size_t i = 0; i < n; ++i) keys[i] = max - static_cast<std::uint64_t>(weights[i]);
  constexpr std::size_t kBuckets = std::size_t{1} << kMaxDigitBits;
  const int bits = std::max(1, static_cast<int>(std::bit_width(max)));
  std::vector<std::uint64_t> key_tmp(n);
  std::vector<std::int32_t> order_tmp(n);
  std::vector<std::size_t> counts(kBuckets);
  for (int shift = 0; shift < bits; shift += kMaxDigitBits) {
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

}  // namespace

std::vector<std::int32_t> HeaviestFirst(std::span<const std::int64_t> weights,
                                        std::vector<std::int64_t>* sorted) {
  if (weights.size() < kSmallRadixFrom) return ComparisonSort(weights, sorted);
  const auto [min, max] = std::minmax_element(weights.begin(), weights.end());
  const std::uint64_t range = static_cast<std::uint64_t>(*max) - static_cast<std::uint64_t>(*min);
  if (range >> 32 != 0) {
    return weights.size() < kComparisonSortBelow ? ComparisonSort(weights, sorted)
                                                 : WideRadixSort(weights, sorted);
  }
  const std::int64_t top = *max;
  std::vector<std::int32_t> order(weights.size());
  if (sorted == nullptr) {
    NarrowRadixSort(weights, top, range,
                    [&](std::size_t s, std::uint64_t word) { order[s] = IndexOf(word); });
  } else {
    sorted->resize(weights.size());
    std::int64_t* const out = sorted->data();
    NarrowRadixSort(weights, top, range, [&](std::size_t s, std::uint64_t word) {
      order[s] = IndexOf(word);
      out[s] = top - static_cast<std::int64_t>(word >> 32);
    });
  }
  return order;
}

std::unique_ptr<std::uint64_t[]> HeaviestFirstSlots(std::span<const std::int64_t> weights) {
  const std::size_t n = weights.size();
  std::unique_ptr<std::uint64_t[]> slots(new std::uint64_t[n]);
  if (n == 0) return slots;
  const auto [min, max] = std::minmax_element(weights.begin(), weights.end());
  const std::int64_t top = *max;
  if (n < kComparisonSortBelow) {
    // Ascending (max − weight) · 2^32 + index, then turned into slots.
    for (std::size_t i = 0; i < n; ++i) {
      slots[i] = static_cast<std::uint64_t>(top - weights[i]) << 32 | i;
    }
    std::sort(slots.get(), slots.get() + n);
    for (std::size_t s = 0; s < n; ++s) {
      slots[s] =
          (static_cast<std::uint64_t>(top) - (slots[s] >> 32)) << 32 | (slots[s] & 0xffff'ffffu);
    }
    return slots;
  }
  std::uint64_t* const out = slots.get();
  NarrowRadixSort(
      weights, top, static_cast<std::uint64_t>(top - *min), [&](std::size_t s, std::uint64_t word) {
        out[s] = (static_cast<std::uint64_t>(top) - (word >> 32)) << 32 | (word & 0xffff'ffffu);
      });
  return slots;
}

}  // namespace rlsched::balance::internal
