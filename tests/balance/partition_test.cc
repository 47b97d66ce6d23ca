#include "rlsched/balance/partition.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "test_util.h"

namespace rlsched::balance {
namespace {

using testing::ErrorOf;
using testing::ExpectValidPartition;
using ::testing::HasSubstr;

PartitionOptions PartOptions(std::int64_t k, bool equal_size = false) {
  PartitionOptions options;
  options.num_parts = k;
  options.equal_size = equal_size;
  return options;
}

TEST(PartitionTest, TwoWayReachesTheKnownOptimum) {
  // Plain differencing gives 16 / 14 here; the optimum {8, 7} / {6, 5, 4} is 15 / 15.
  const std::vector<std::int64_t> w = {8, 7, 6, 5, 4};
  EXPECT_EQ(testing::MaxLoadOf(w, 2, KarmarkarKarp(w, 2, false)), 16);
  const Partition p = PartitionItems(w, PartOptions(2));
  ExpectValidPartition(w, 2, false, p);
  EXPECT_EQ(p.max_load, 15);
  EXPECT_EQ(p.min_load, 15);
  EXPECT_TRUE(p.proven_optimal);
  EXPECT_EQ(p.gap, 0.0);
}

TEST(PartitionTest, ThreeWayPerfectSplit) {
  // 1..9 sums to 45: three parts of 15 exist ({9,6}, {8,7}, {5,4,3,2,1} among others).
  const std::vector<std::int64_t> w = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  const Partition p = PartitionItems(w, PartOptions(3));
  ExpectValidPartition(w, 3, false, p);
  EXPECT_EQ(p.max_load, 15);
  EXPECT_TRUE(p.proven_optimal);
}

TEST(PartitionTest, EqualSizeKnownOptimum) {
  // Pairs into 2 parts of 2 items: {10, 1} and {6, 5} is optimal at 11.
  const std::vector<std::int64_t> w = {10, 6, 5, 1};
  const Partition p = PartitionItems(w, PartOptions(2, true));
  ExpectValidPartition(w, 2, true, p);
  EXPECT_EQ(p.max_load, 11);
  EXPECT_EQ(p.lower_bound, 11);
}

TEST(PartitionTest, EqualSizeUnevenCounts) {
  const std::vector<std::int64_t> w = {9, 1, 8, 2, 7, 3, 6, 4, 5, 5};
  const Partition p = PartitionItems(w, PartOptions(4, true));
  ExpectValidPartition(w, 4, true, p);
  std::vector<std::int64_t> sizes;
  for (std::int64_t part = 0; part < 4; ++part) sizes.push_back(p.part(part).size());
  std::sort(sizes.begin(), sizes.end());
  EXPECT_EQ(sizes, (std::vector<std::int64_t>{2, 2, 3, 3}));
}

TEST(PartitionTest, FewerItemsThanParts) {
  const std::vector<std::int64_t> w = {5, 3, 9};
  for (const bool equal_size : {false, true}) {
    const Partition p = PartitionItems(w, PartOptions(5, equal_size));
    ExpectValidPartition(w, 5, equal_size, p);
    EXPECT_EQ(p.max_load, 9);
    EXPECT_EQ(p.min_load, 0);
    EXPECT_TRUE(p.proven_optimal);
  }
}

TEST(PartitionTest, EmptyInputGivesEmptyParts) {
  const std::vector<std::int64_t> w;
  const Partition p = PartitionItems(w, PartOptions(3));
  ExpectValidPartition(w, 3, false, p);
  EXPECT_EQ(p.max_load, 0);
  EXPECT_EQ(p.lower_bound, 0);
  EXPECT_EQ(p.gap, 0.0);
}

TEST(PartitionTest, SinglePartTakesEverything) {
  const std::vector<std::int64_t> w = {4, 0, 7, 1};
  const Partition p = PartitionItems(w, PartOptions(1, true));
  ExpectValidPartition(w, 1, true, p);
  EXPECT_EQ(p.max_load, 12);
  EXPECT_TRUE(p.proven_optimal);
}

TEST(PartitionTest, ZeroWeightsArePlaced) {
  const std::vector<std::int64_t> w = {0, 0, 0, 5, 0, 5};
  for (const bool equal_size : {false, true}) {
    const Partition p = PartitionItems(w, PartOptions(2, equal_size));
    ExpectValidPartition(w, 2, equal_size, p);
    EXPECT_EQ(p.max_load, 5);
  }
}

TEST(PartitionTest, GreedyAlgorithmOption) {
  const std::vector<std::int64_t> w = {8, 7, 6, 5, 4};
  PartitionOptions options = PartOptions(2);
  options.algorithm = Algorithm::kGreedy;
  options.refine.enabled = false;
  options.exact.max_nodes = 0;
  const Partition p = PartitionItems(w, options);
  ExpectValidPartition(w, 2, false, p);
  // LPT: 8 | 7 | 6 -> 7+6=13 vs 8 | 5 -> 8+5=13 | 4 -> 17.
  EXPECT_EQ(p.max_load, 17);
  EXPECT_EQ(p.refine_steps, 0);
}

TEST(PartitionTest, LowerBounds) {
  const std::vector<std::int64_t> w = {10, 1, 1, 1, 1, 1, 1, 1};
  EXPECT_EQ(LowerBound(w, 2, false), 10);  // the largest item
  EXPECT_EQ(LowerBound(w, 8, false), 10);
  EXPECT_EQ(LowerBound(w, 2, true), 13);  // 10 + the 3 smallest
  const std::vector<std::int64_t> v = {3, 3, 3, 2};
  EXPECT_EQ(LowerBound(v, 2, false), 6);  // ceil(11 / 2)
  EXPECT_EQ(LowerBound(v, 4, false), 3);
  EXPECT_EQ(LowerBound(std::vector<std::int64_t>{7}, 2, false), 7);
}

TEST(PartitionTest, ContiguousSplitRuns) {
  EXPECT_EQ(ContiguousSplit(7, 3), (Assignment{0, 0, 0, 1, 1, 2, 2}));
  EXPECT_EQ(ContiguousSplit(2, 4), (Assignment{0, 1}));
  EXPECT_EQ(ContiguousSplit(0, 4), Assignment{});
}

TEST(PartitionTest, BadInputNamesTheField) {
  const std::vector<std::int64_t> w = {1, 2, 3};
  EXPECT_THAT(ErrorOf([&] { PartitionItems(w, PartOptions(0)); }), HasSubstr("num_parts"));
  EXPECT_THAT(ErrorOf([&] { PartitionItems(w, PartOptions(kMaxParts + 1)); }),
              HasSubstr("num_parts: must be in [1, 1048576]"));
  const std::vector<std::int64_t> negative = {1, -2, 3};
  EXPECT_THAT(ErrorOf([&] { PartitionItems(negative, PartOptions(2)); }), HasSubstr("weights[1]"));
  const std::vector<std::int64_t> huge = {INT64_MAX / 2, INT64_MAX / 2, 10};
  EXPECT_THAT(ErrorOf([&] { PartitionItems(huge, PartOptions(2)); }), HasSubstr("overflows"));
  EXPECT_THAT(ErrorOf([&] { KarmarkarKarp(negative, 2, false); }), HasSubstr("weights[1]"));
  EXPECT_THAT(ErrorOf([&] { GreedyLpt(w, -1, false); }), HasSubstr("num_parts"));
  EXPECT_THAT(ErrorOf([&] { ContiguousSplit(-1, 2); }), HasSubstr("num_items"));
  Assignment bad = {0, 5, 1};
  EXPECT_THAT(ErrorOf([&] { MakePartition(w, 2, false, bad); }), HasSubstr("assignment[1]"));
  Assignment short_assignment = {0};
  EXPECT_THAT(ErrorOf([&] { MakePartition(w, 2, false, short_assignment); }),
              HasSubstr("assignment"));
}

TEST(PartitionTest, LargeWeightsNearTheOverflowLimit) {
  const std::int64_t big = INT64_MAX / 4;
  const std::vector<std::int64_t> w = {big, big, big, big - 7};
  const Partition p = PartitionItems(w, PartOptions(2));
  ExpectValidPartition(w, 2, false, p);
  EXPECT_EQ(p.max_load, 2 * big);
}

TEST(RefineTest, BudgetOfZeroChangesNothing) {
  const std::vector<std::int64_t> w = {8, 7, 6, 5, 4};
  Assignment a = KarmarkarKarp(w, 2, false);
  const Assignment before = a;
  RefineOptions options;
  options.max_iterations = 0;
  EXPECT_EQ(Refine(w, 2, false, options, 0, a), 0);
  EXPECT_EQ(a, before);
  options.max_iterations = 100;
  options.enabled = false;
  EXPECT_EQ(Refine(w, 2, false, options, 0, a), 0);
  EXPECT_EQ(a, before);
}

TEST(RefineTest, StopsAtTheInjectedClock) {
  // Contiguous split of a ramp: many improving steps are available.
  std::vector<std::int64_t> w;
  for (int i = 1; i <= 64; ++i) w.push_back(i * i);
  Assignment unbounded = ContiguousSplit(64, 4);
  Assignment timed = unbounded;
  RefineOptions options;
  const std::int64_t all_steps = Refine(w, 4, false, options, 0, unbounded);
  ASSERT_GT(all_steps, 3);
  std::int64_t ticks = 0;
  options.time_limit = std::chrono::nanoseconds(3);
  options.now = [&ticks] { return std::chrono::nanoseconds(ticks++); };
  EXPECT_EQ(Refine(w, 4, false, options, 0, timed), 3);
}

TEST(RefineTest, ClockRequiredForATimeLimit) {
  const std::vector<std::int64_t> w = {1, 2};
  Assignment a = {0, 0};
  RefineOptions options;
  options.time_limit = std::chrono::milliseconds(1);
  EXPECT_THAT(ErrorOf([&] { Refine(w, 2, false, options, 0, a); }), HasSubstr("refine.now"));
  options.time_limit = {};
  options.max_iterations = -1;
  EXPECT_THAT(ErrorOf([&] { Refine(w, 2, false, options, 0, a); }),
              HasSubstr("refine.max_iterations"));
}

TEST(RefineTest, StopsAtTheLowerBound) {
  const std::vector<std::int64_t> w = {8, 7, 6, 5, 4};
  Assignment a = {0, 0, 0, 0, 1};
  const std::int64_t steps = Refine(w, 2, false, RefineOptions{}, 15, a);
  EXPECT_GT(steps, 0);
  EXPECT_EQ(testing::MaxLoadOf(w, 2, a), 15);
}

TEST(RefineTest, KeepsCountsInEqualSizeMode) {
  std::vector<std::int64_t> w;
  for (int i = 0; i < 30; ++i) w.push_back((i * 37) % 101 + 1);
  Assignment a = ContiguousSplit(30, 4);  // sizes 8, 8, 7, 7
  Refine(w, 4, true, RefineOptions{}, 0, a);
  ExpectValidPartition(w, 4, true, MakePartition(w, 4, true, a));
}

}  // namespace
}  // namespace rlsched::balance
