// The Fenwick tree of the rank packer (balance/src/fenwick_tree.h).

#include "fenwick_tree.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "rlsched/workload/workload.h"

namespace rlsched::balance::internal {
namespace {

TEST(FenwickTreeTest, HandCases) {
  FenwickTree tree(5, 1);  // 1 1 1 1 1
  EXPECT_EQ(tree.size(), 5u);
  for (std::size_t count = 0; count <= 5; ++count) {
    EXPECT_EQ(tree.PrefixSum(count), static_cast<std::int64_t>(count));
  }
  for (std::int64_t k = 1; k <= 5; ++k) {
    EXPECT_EQ(tree.FirstReaching(k), static_cast<std::size_t>(k - 1));  // the k-th one
  }
  EXPECT_EQ(tree.FirstReaching(6), 5u);  // beyond the total
  tree.Add(1, -1);                       // 1 0 1 1 1
  tree.Add(3, -1);                       // 1 0 1 0 1
  EXPECT_EQ(tree.PrefixSum(2), 1);
  EXPECT_EQ(tree.PrefixSum(4), 2);
  EXPECT_EQ(tree.PrefixSum(5), 3);
  EXPECT_EQ(tree.FirstReaching(1), 0u);
  EXPECT_EQ(tree.FirstReaching(2), 2u);
  EXPECT_EQ(tree.FirstReaching(3), 4u);
  EXPECT_EQ(tree.FirstReaching(4), 5u);
  tree.Add(4, 5);  // 1 0 1 0 6
  EXPECT_EQ(tree.PrefixSum(5), 8);
  EXPECT_EQ(tree.FirstReaching(3), 4u);
  EXPECT_EQ(tree.FirstReaching(8), 4u);
  EXPECT_EQ(tree.FirstReaching(9), 5u);
  tree.Assign(3, 2);  // 2 2 2
  EXPECT_EQ(tree.PrefixSum(3), 6);
  EXPECT_EQ(tree.FirstReaching(3), 1u);
}

TEST(FenwickTreeTest, EmptyAndOne) {
  const FenwickTree none;
  EXPECT_EQ(none.size(), 0u);
  EXPECT_EQ(none.PrefixSum(0), 0);
  EXPECT_EQ(none.FirstReaching(1), 0u);  // size(): nothing reaches 1
  FenwickTree one(1, 0);
  EXPECT_EQ(one.FirstReaching(1), 1u);
  one.Add(0, 1);
  EXPECT_EQ(one.FirstReaching(1), 0u);
  EXPECT_EQ(one.PrefixSum(1), 1);
}

// Seeded random non-negative values (0/1 counts, as the rank packer keeps, or small
// integers) on sizes up to 100, checked against a plain array after every update.
TEST(FenwickTreeTest, AgreesWithAnArray) {
  for (std::uint64_t seed = 1; seed <= 300; ++seed) {
    workload::Rng rng(seed * 7727 + 3);
    const auto size = static_cast<std::size_t>(rng.UniformInt(0, 100));
    const bool counts = rng.UniformInt(0, 1) == 0;
    const std::int64_t initial = counts ? rng.UniformInt(0, 1) : rng.UniformInt(0, 4);
    FenwickTree tree(size, initial);
    std::vector<std::int64_t> naive(size, initial);
    for (int step = 0; step < 150; ++step) {
      SCOPED_TRACE("seed " + std::to_string(seed) + " step " + std::to_string(step));
      if (size > 0) {
        const auto i =
            static_cast<std::size_t>(rng.UniformInt(0, static_cast<std::int64_t>(size) - 1));
        const std::int64_t target = counts ? 1 - naive[i] : rng.UniformInt(0, 6);
        tree.Add(i, target - naive[i]);
        naive[i] = target;
      }
      std::int64_t sum = 0;
      for (std::size_t count = 0; count <= size; ++count) {
        ASSERT_EQ(tree.PrefixSum(count), sum) << "count " << count;
        if (count < size) sum += naive[count];
      }
      for (std::int64_t k = 1; k <= sum + 1; ++k) {
        std::size_t first = size;
        std::int64_t prefix = 0;
        for (std::size_t p = 0; p < size; ++p) {
          prefix += naive[p];
          if (prefix >= k) {
            first = p;
            break;
          }
        }
        ASSERT_EQ(tree.FirstReaching(k), first) << "k " << k;
      }
    }
  }
}

}  // namespace
}  // namespace rlsched::balance::internal
