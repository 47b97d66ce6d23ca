// The max segment tree of the rank packer (balance/src/segment_tree.h).

#include "segment_tree.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "rlsched/workload/workload.h"

namespace rlsched::balance::internal {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(MaxSegmentTreeTest, HandCases) {
  MaxSegmentTree tree(5, -1.0);  // padded to 8 leaves
  EXPECT_EQ(tree.size(), 5u);
  EXPECT_EQ(tree.Max(), -1.0);
  EXPECT_EQ(tree.ArgMax(), 0u);  // ties: the smallest index
  EXPECT_EQ(tree.FirstAtLeast(0.0), MaxSegmentTree::kNone);
  EXPECT_EQ(tree.FirstAtLeast(-1.0), 0u);
  tree.Set(3, 7.0);
  tree.Set(1, 2.5);
  tree.Set(4, 7.0);
  EXPECT_EQ(tree.Get(3), 7.0);
  EXPECT_EQ(tree.Get(2), -1.0);
  EXPECT_EQ(tree.Max(), 7.0);
  EXPECT_EQ(tree.ArgMax(), 3u);  // 7 at 3 and 4: the first
  EXPECT_EQ(tree.FirstAtLeast(2.0), 1u);
  EXPECT_EQ(tree.FirstAtLeast(2.5), 1u);
  EXPECT_EQ(tree.FirstAtLeast(2.6), 3u);
  EXPECT_EQ(tree.FirstAtLeast(7.0), 3u);
  EXPECT_EQ(tree.FirstAtLeast(7.5), MaxSegmentTree::kNone);
  tree.Set(3, -3.0);
  EXPECT_EQ(tree.ArgMax(), 4u);
  EXPECT_EQ(tree.FirstAtLeast(3.0), 4u);
  // Below every value the padding (−∞) is still never found; all values lowered below
  // the padding's neighbours keep the answers on real indices.
  tree.Fill(-5.0);
  EXPECT_EQ(tree.Max(), -5.0);
  EXPECT_EQ(tree.ArgMax(), 0u);
  EXPECT_EQ(tree.FirstAtLeast(-kInf), 0u);
  tree.Set(4, -4.0);
  EXPECT_EQ(tree.ArgMax(), 4u);
  EXPECT_EQ(tree.FirstAtLeast(-4.5), 4u);
}

TEST(MaxSegmentTreeTest, OneAndNone) {
  MaxSegmentTree one(1);
  EXPECT_EQ(one.Max(), 0.0);
  EXPECT_EQ(one.ArgMax(), 0u);
  EXPECT_EQ(one.FirstAtLeast(0.0), 0u);
  EXPECT_EQ(one.FirstAtLeast(0.5), MaxSegmentTree::kNone);
  one.Set(0, 3.0);
  EXPECT_EQ(one.FirstAtLeast(3.0), 0u);
  const MaxSegmentTree none(0);
  EXPECT_EQ(none.size(), 0u);
  EXPECT_EQ(none.Max(), -kInf);
  EXPECT_EQ(none.FirstAtLeast(0.0), MaxSegmentTree::kNone);
  EXPECT_EQ(none.FirstAtLeast(-kInf), MaxSegmentTree::kNone);
}

// Seeded random updates on every size up to 70 (powers of two and not), values from a
// small set so ties are frequent, checked against a plain array after every step.
TEST(MaxSegmentTreeTest, AgreesWithAnArray) {
  for (std::uint64_t seed = 1; seed <= 300; ++seed) {
    workload::Rng rng(seed * 6151 + 17);
    const auto size = static_cast<std::size_t>(rng.UniformInt(1, 70));
    const double initial = static_cast<double>(rng.UniformInt(-3, 3));
    MaxSegmentTree tree(size, initial);
    std::vector<double> naive(size, initial);
    auto value = [&] {
      return rng.UniformInt(0, 9) == 0 ? -kInf : static_cast<double>(rng.UniformInt(-8, 8)) / 2;
    };
    for (int step = 0; step < 200; ++step) {
      SCOPED_TRACE("seed " + std::to_string(seed) + " step " + std::to_string(step));
      if (rng.UniformInt(0, 49) == 0) {
        const double v = value();
        tree.Fill(v);
        naive.assign(size, v);
      } else {
        const auto i =
            static_cast<std::size_t>(rng.UniformInt(0, static_cast<std::int64_t>(size) - 1));
        const double v = value();
        tree.Set(i, v);
        naive[i] = v;
      }
      std::size_t arg_max = 0;
      for (std::size_t i = 0; i < size; ++i) {
        ASSERT_EQ(tree.Get(i), naive[i]);
        if (naive[i] > naive[arg_max]) arg_max = i;
      }
      ASSERT_EQ(tree.Max(), naive[arg_max]);
      ASSERT_EQ(tree.ArgMax(), arg_max);
      for (const double need : {-kInf, -4.0, -0.5, 0.0, 0.5, 1.0, 2.0, 3.5, 4.0, 4.5}) {
        std::size_t first = MaxSegmentTree::kNone;
        for (std::size_t i = 0; i < size && first == MaxSegmentTree::kNone; ++i) {
          if (naive[i] >= need) first = i;
        }
        ASSERT_EQ(tree.FirstAtLeast(need), first) << "need " << need;
      }
    }
  }
}

}  // namespace
}  // namespace rlsched::balance::internal
