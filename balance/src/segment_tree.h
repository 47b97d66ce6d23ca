// A max segment tree over a fixed number of double values (private header): point
// updates, the first value at least a threshold, and the leftmost maximum, each in
// O(log n). The step planner's rank packer (rank_packer.h) keeps every rank's room in
// one, to find the first rank with room for a unit and the rank with the most room.

#ifndef RLSCHED_BALANCE_SRC_SEGMENT_TREE_H_
#define RLSCHED_BALANCE_SRC_SEGMENT_TREE_H_

#include <algorithm>
#include <cstddef>
#include <limits>
#include <vector>

namespace rlsched::balance::internal {

class MaxSegmentTree {
 public:
  // What FirstAtLeast() returns when no value qualifies.
  static constexpr std::size_t kNone = std::numeric_limits<std::size_t>::max();

  // `size` values, all `value`. The leaves are padded to a power of two; the padding
  // holds −∞, so it is never found.
  explicit MaxSegmentTree(std::size_t size, double value = 0.0) : size_(size) {
    while (leaves_ < size_) leaves_ *= 2;
    tree_.resize(2 * leaves_);
    Fill(value);
  }

  std::size_t size() const { return size_; }

  // Every value becomes `value`. O(n).
  void Fill(double value) {
    std::fill(tree_.begin() + static_cast<std::ptrdiff_t>(leaves_),
              tree_.begin() + static_cast<std::ptrdiff_t>(leaves_ + size_), value);
    std::fill(tree_.begin() + static_cast<std::ptrdiff_t>(leaves_ + size_), tree_.end(),
              -std::numeric_limits<double>::infinity());
    for (std::size_t i = leaves_; i-- > 1;) tree_[i] = std::max(tree_[2 * i], tree_[2 * i + 1]);
  }

  // Value i becomes `value`. Precondition: i < size(). O(log n).
  void Set(std::size_t i, double value) {
    std::size_t node = leaves_ + i;
    tree_[node] = value;
    for (node /= 2; node >= 1; node /= 2) {
      tree_[node] = std::max(tree_[2 * node], tree_[2 * node + 1]);
    }
  }

  // Value i. Precondition: i < size(). O(1).
  double Get(std::size_t i) const { return tree_[leaves_ + i]; }

  // The largest value (−∞ when empty). O(1).
  double Max() const { return tree_[1]; }

  // The smallest index whose value is >= `need`, or kNone. O(log n).
  std::size_t FirstAtLeast(double need) const {
    if (tree_[1] < need) return kNone;
    std::size_t node = 1;
    while (node < leaves_) node = tree_[2 * node] >= need ? 2 * node : 2 * node + 1;
    const std::size_t i = node - leaves_;
    return i < size_ ? i : kNone;  // padding only for need = −∞
  }

  // The index of the largest value, the smallest such index on ties. Precondition:
  // size() >= 1. O(log n).
  std::size_t ArgMax() const {
    std::size_t node = 1;
    while (node < leaves_) node = tree_[2 * node] >= tree_[2 * node + 1] ? 2 * node : 2 * node + 1;
    return node - leaves_;
  }

 private:
  std::size_t size_;
  std::size_t leaves_ = 1;
  std::vector<double> tree_;  // tree_[1] the root, node i's children 2i and 2i + 1
};

}  // namespace rlsched::balance::internal

#endif  // RLSCHED_BALANCE_SRC_SEGMENT_TREE_H_
