// A Fenwick (binary indexed) tree over a fixed number of int64 values (private
// header): point updates and prefix sums in O(log n), and, for non-negative values,
// the position where the prefix sums reach a given total in O(log n). The step
// planner's rank packer (rank_packer.h) counts the short units not placed yet with
// one, to find the costliest free unit under a budget.

#ifndef RLSCHED_BALANCE_SRC_FENWICK_TREE_H_
#define RLSCHED_BALANCE_SRC_FENWICK_TREE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace rlsched::balance::internal {

class FenwickTree {
 public:
  // `size` values, all `value`. O(n).
  explicit FenwickTree(std::size_t size = 0, std::int64_t value = 0) { Assign(size, value); }

  std::size_t size() const { return size_; }

  // `size` values, all `value`. O(n).
  void Assign(std::size_t size, std::int64_t value) {
    size_ = size;
    top_bit_ = 0;
    for (std::size_t bit = 1; bit <= size_; bit *= 2) top_bit_ = bit;
    tree_.assign(size_ + 1, 0);
    for (std::size_t i = 1; i <= size_; ++i) {
      tree_[i] += value;
      const std::size_t parent = i + LowBit(i);
      if (parent <= size_) tree_[parent] += tree_[i];
    }
  }

  // Value `position` (0-based) grows by `delta`. Precondition: position < size().
  void Add(std::size_t position, std::int64_t delta) {
    for (std::size_t i = position + 1; i <= size_; i += LowBit(i)) tree_[i] += delta;
  }

  // The sum of the first `count` values. Precondition: count <= size().
  std::int64_t PrefixSum(std::size_t count) const {
    std::int64_t sum = 0;
    for (std::size_t i = count; i > 0; i -= LowBit(i)) sum += tree_[i];
    return sum;
  }

  // For non-negative values: the smallest position p with PrefixSum(p + 1) >= k, for
  // k >= 1; size() when the whole sum is below k. With 0/1 values: the position of the
  // k-th one.
  std::size_t FirstReaching(std::int64_t k) const {
    std::size_t position = 0;  // the last position whose prefix sum is below k
    for (std::size_t bit = top_bit_; bit > 0; bit /= 2) {
      if (position + bit <= size_ && tree_[position + bit] < k) {
        position += bit;
        k -= tree_[position];
      }
    }
    return position;
  }

 private:
  static std::size_t LowBit(std::size_t i) { return i & (~i + 1); }

  std::size_t size_ = 0;
  std::size_t top_bit_ = 0;         // the largest power of two <= size_ (0 when empty)
  std::vector<std::int64_t> tree_;  // 1-based: tree_[i] sums (i − LowBit(i), i]
};

}  // namespace rlsched::balance::internal

#endif  // RLSCHED_BALANCE_SRC_FENWICK_TREE_H_
