// Internal: one rank's room (budget minus bytes) in each bucket of a plan, one
// direction, for the planner's first fit.
//
// The rooms are stored flat, one value per bucket, in blocks of one cache line
// (kBlock buckets); a max-tree over the blocks' largest rooms finds the next block
// with room. FirstFit() reads at most two blocks and O(log blocks) tree nodes;
// Take() rewrites one block's maximum and the tree nodes it changes (it stops at the
// first one it leaves as it was). Buckets past the stored ones are empty (all room).
//
// T holds a room: std::int32_t when the budget is below 2^31 (half the memory of
// std::int64_t), else std::int64_t. Memory: sizeof(T) per bucket up to the last one
// the rank takes bytes in, plus about 2 · sizeof(T) per block.

#ifndef RLSCHED_ROLLOUT_SRC_BUCKET_ROOMS_H_
#define RLSCHED_ROLLOUT_SRC_BUCKET_ROOMS_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace rlsched::rollout::internal {

template <class T>
class BucketRooms {
 public:
  static constexpr std::size_t kBlock = 64 / sizeof(T);  // buckets per block

  // budget in [1, the largest T].
  explicit BucketRooms(std::int64_t budget) : budget_(static_cast<T>(budget)) {}

  // The first bucket >= b with room for `bytes` (in [0, budget]).
  std::int64_t FirstFit(std::int64_t b, std::int64_t bytes) const {
    const std::size_t stored = room_.size();
    if (b < 0 || static_cast<std::size_t>(b) >= stored) return b;
    const T need = static_cast<T>(bytes);
    const auto first = static_cast<std::size_t>(b);
    const std::size_t block = first / kBlock;
    for (std::size_t i = first; i < (block + 1) * kBlock; ++i) {
      if (room_[i] >= need) return static_cast<std::int64_t>(i);
    }
    const std::size_t next = NextBlock(block + 1, need);
    if (next * kBlock >= stored) return static_cast<std::int64_t>(stored);
    for (std::size_t i = next * kBlock;; ++i) {
      if (room_[i] >= need) return static_cast<std::int64_t>(i);
    }
  }

  // Puts `bytes` in bucket b (which has room for them).
  void Take(std::int64_t b, std::int64_t bytes) {
    const auto i = static_cast<std::size_t>(b);
    if (i >= room_.size()) Grow(i + 1);
    room_[i] = static_cast<T>(room_[i] - static_cast<T>(bytes));
    const std::size_t block = i / kBlock;
    const T* r = room_.data() + block * kBlock;
    T most = r[0];
    for (std::size_t k = 1; k < kBlock; ++k) most = std::max(most, r[k]);
    std::size_t node = block + leaves_;
    if (tree_[node] == most) return;
    tree_[node] = most;
    for (node >>= 1; node >= 1; node >>= 1) {
      const T up = std::max(tree_[2 * node], tree_[2 * node + 1]);
      if (tree_[node] == up) return;
      tree_[node] = up;
    }
  }

  // Buckets stored (a multiple of kBlock; those past them are empty).
  std::size_t stored() const { return room_.size(); }

 private:
  // The first block >= k whose largest room is at least `need`: a block past the
  // tree's leaves when none of them is.
  std::size_t NextBlock(std::size_t k, T need) const {
    if (k >= leaves_) return k;
    std::size_t i = k + leaves_;
    if (tree_[i] >= need) return k;
    // Up until a right sibling holds room, then down to its leftmost leaf with room.
    for (;;) {
      if (i == 1) return leaves_;
      if ((i & 1) == 0 && tree_[i + 1] >= need) {
        ++i;
        break;
      }
      i >>= 1;
    }
    while (i < leaves_) {
      i *= 2;
      if (tree_[i] < need) ++i;
    }
    return i - leaves_;
  }

  // Stores buckets up to `buckets` (rounded up to whole blocks), empty.
  void Grow(std::size_t buckets) {
    const std::size_t blocks = (buckets + kBlock - 1) / kBlock;
    room_.resize(blocks * kBlock, budget_);
    if (blocks <= leaves_) return;
    std::size_t leaves = std::max<std::size_t>(leaves_, 1);
    while (leaves < blocks) leaves *= 2;
    std::vector<T> tree(2 * leaves, budget_);
    if (leaves_ > 0) {
      std::copy(tree_.begin() + static_cast<std::ptrdiff_t>(leaves_), tree_.end(),
                tree.begin() + static_cast<std::ptrdiff_t>(leaves));
    }
    for (std::size_t i = leaves - 1; i >= 1; --i) tree[i] = std::max(tree[2 * i], tree[2 * i + 1]);
    tree_ = std::move(tree);
    leaves_ = leaves;
  }

  T budget_;
  std::vector<T> room_;  // per bucket stored
  std::size_t leaves_ = 0;
  std::vector<T> tree_;  // 1-based over the blocks' largest rooms: node i has children 2i, 2i + 1
};

}  // namespace rlsched::rollout::internal

#endif  // RLSCHED_ROLLOUT_SRC_BUCKET_ROOMS_H_
