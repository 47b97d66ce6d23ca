#include "rlsched/workload/workload.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace rlsched::workload {
namespace {

TEST(WorkloadTest, SameSeedSameBatch) {
  EXPECT_EQ(HeavyTailedLengths(1000, 7), HeavyTailedLengths(1000, 7));
  EXPECT_NE(HeavyTailedLengths(1000, 7), HeavyTailedLengths(1000, 8));
}

TEST(WorkloadTest, HeavyTailedShape) {
  std::vector<std::int64_t> lengths = HeavyTailedLengths(100'000, 1);
  for (const std::int64_t l : lengths) {
    ASSERT_GE(l, 101);
    ASSERT_LE(l, 500 + 16384);
  }
  std::sort(lengths.begin(), lengths.end());
  // Prompt ~ U[100, 500] (mean 300) + response with p50 ≈ 790 and p90 ≈ 3,430.
  const double p50 = static_cast<double>(lengths[50'000]);
  const double p90 = static_cast<double>(lengths[90'000]);
  EXPECT_NEAR(p50, 1100, 80);
  EXPECT_NEAR(p90, 3750, 250);
  EXPECT_GT(lengths.back(), 16384);  // the clipped tail is reached
}

TEST(WorkloadTest, GrpoBatchGroups) {
  const SyntheticBatch batch = GrpoBatch(16, 8, 3);
  ASSERT_EQ(batch.lengths.size(), 128u);
  ASSERT_EQ(batch.groups.size(), 128u);
  for (std::size_t i = 0; i < batch.groups.size(); ++i) {
    EXPECT_EQ(batch.groups[i], static_cast<std::int64_t>(i / 8));
  }
}

TEST(WorkloadTest, UniformIntCoversTheRange) {
  Rng rng(5);
  std::vector<int> hits(5, 0);
  for (int i = 0; i < 5000; ++i) ++hits[static_cast<std::size_t>(rng.UniformInt(10, 14) - 10)];
  for (const int h : hits) EXPECT_GT(h, 800);
  EXPECT_EQ(Rng(9).UniformInt(3, 3), 3);
}

}  // namespace
}  // namespace rlsched::workload
