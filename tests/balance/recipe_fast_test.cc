// The common recipe's figures alone (RecipeDetail::kFigures, PlanStep()'s baseline)
// against its plan with micro-batches (kMicroBatches, PlanBaseline()'s), and its
// Karmarkar-Karp run the fast way (RecipeMethod::kFast: the
// equal-size mode on flat blocks of parts, the absorption of single items on a
// tournament tree) against the general implementation it replaces
// (RecipeMethod::kGeneral), on random seeded instances: the same partition, sums and
// counts, position for position.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "micro_batch_internal.h"
#include "recipe_partition.h"
#include "rlsched/balance/plan_step.h"
#include "rlsched/balance/partition.h"
#include "rlsched/workload/workload.h"

namespace rlsched::balance {
namespace {

using internal::RecipeMethod;
using internal::RecipePartition;

// n values of one kind: verl's workloads of lognormal lengths (as the benchmark's,
// many ties), 0–3 (ties and zeros), uniform in [0, 2^40], or 2^60–2^62 (sums beyond
// int64, the 128-bit sums).
std::vector<std::int64_t> Values(workload::Rng& rng, std::size_t n, int kind) {
  std::vector<std::int64_t> values(n);
  for (std::int64_t& v : values) {
    if (kind == 0) {
      const auto length = std::min<std::int64_t>(
          32768, static_cast<std::int64_t>(std::exp(7.0 + rng.Normal())) + 1);
      v = internal::RecipeWorkload(length);
    } else if (kind == 1) {
      v = rng.UniformInt(0, 3);
    } else if (kind == 2) {
      v = rng.UniformInt(0, std::int64_t{1} << 40);
    } else {
      v = rng.UniformInt(std::int64_t{1} << 60, std::int64_t{1} << 62);
    }
  }
  return values;
}

// Both methods on `values` into k parts: the same partition by position, sums and
// counts.
void ExpectSame(const std::vector<std::int64_t>& values, std::int64_t k, PartSizes sizes,
                const std::string& where) {
  std::vector<std::int64_t> sorted;
  const std::vector<std::int32_t> ascending = internal::RecipeAscending(values, &sorted);
  const RecipePartition fast =
      internal::RecipeKarmarkarKarpPositions(sorted, ascending, k, sizes, RecipeMethod::kFast);
  const RecipePartition general =
      internal::RecipeKarmarkarKarpPositions(sorted, ascending, k, sizes, RecipeMethod::kGeneral);
  ASSERT_EQ(fast.part_of_position.size(), values.size()) << where;
  EXPECT_EQ(fast.part_of_position, general.part_of_position) << where;
  EXPECT_TRUE(fast.sums == general.sums) << where;
  EXPECT_EQ(fast.counts, general.counts) << where;
}

// The number of parts for n items: few, about n / 18 (the recipe's micro-batches of a
// rank), about n / 2, or more than n.
std::int64_t Parts(workload::Rng& rng, std::size_t n) {
  const auto items = static_cast<std::int64_t>(n);
  switch (rng.UniformInt(0, 3)) {
    case 0:
      return rng.UniformInt(1, 8);
    case 1:
      return std::max<std::int64_t>(1, items / 18 + rng.UniformInt(-3, 3));
    case 2:
      return std::max<std::int64_t>(1, items / 2 + rng.UniformInt(-3, 3));
    default:
      return items + rng.UniformInt(1, 100);
  }
}

std::size_t Size(workload::Rng& rng) {
  switch (rng.UniformInt(0, 2)) {
    case 0:
      return static_cast<std::size_t>(rng.UniformInt(0, 40));
    case 1:
      return static_cast<std::size_t>(rng.UniformInt(41, 2000));
    default:
      return static_cast<std::size_t>(rng.UniformInt(2001, 30000));
  }
}

TEST(RecipeFastTest, EqualSizesAsTheGeneralMethod) {
  for (std::uint64_t seed = 1; seed <= 240; ++seed) {
    workload::Rng rng(seed * 6151 + 17);
    const std::size_t n = Size(rng);
    const int kind = static_cast<int>(rng.UniformInt(0, 3));
    const std::int64_t k = Parts(rng, n);
    const std::vector<std::int64_t> values = Values(rng, n, kind);
    ExpectSame(values, k, PartSizes::kEqual,
               "seed " + std::to_string(seed) + ", n " + std::to_string(n) + ", k " +
                   std::to_string(k) + ", kind " + std::to_string(kind));
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(RecipeFastTest, AnySizesAsTheGeneralMethod) {
  for (std::uint64_t seed = 1; seed <= 240; ++seed) {
    workload::Rng rng(seed * 7919 + 29);
    const std::size_t n = Size(rng);
    const int kind = static_cast<int>(rng.UniformInt(0, 3));
    const std::int64_t k = Parts(rng, n);
    const std::vector<std::int64_t> values = Values(rng, n, kind);
    ExpectSame(values, k, PartSizes::kAny,
               "seed " + std::to_string(seed) + ", n " + std::to_string(n) + ", k " +
                   std::to_string(k) + ", kind " + std::to_string(kind));
    if (::testing::Test::HasFailure()) return;
  }
}

// A rank of the benchmark's shape (65,536 lognormal lengths into the recipe's 3,6xx
// micro-batches), and k around the tree's threshold (64) and its powers of two.
TEST(RecipeFastTest, AnySizesAtTheBenchmarksShapeAndAroundTheTreesSizes) {
  workload::Rng rng(97);
  ExpectSame(Values(rng, 65536, 0), 3631, PartSizes::kAny, "benchmark rank");
  for (const std::int64_t k : {63, 64, 65, 127, 128, 129, 1024, 1025}) {
    for (int kind = 0; kind < 4; ++kind) {
      const std::vector<std::int64_t> values = Values(rng, 20 * static_cast<std::size_t>(k), kind);
      ExpectSame(values, k, PartSizes::kAny,
                 "k " + std::to_string(k) + ", kind " + std::to_string(kind));
      ExpectSame(values, k, PartSizes::kEqual,
                 "equal, k " + std::to_string(k) + ", kind " + std::to_string(kind));
    }
  }
}

// A batch whose largest items are so large that single items pop before the solution
// of many parts again after it filled: the tree stops, the heap goes on, and later
// solutions meet it (both ways of leaving the tree's loop).
TEST(RecipeFastTest, AnySizesWhenTheAbsorptionStopsAndStartsAgain) {
  for (std::uint64_t seed = 1; seed <= 60; ++seed) {
    workload::Rng rng(seed * 104723 + 1);
    const auto k = rng.UniformInt(64, 400);
    std::vector<std::int64_t> values;
    const auto groups = rng.UniformInt(2, 6);
    for (std::int64_t g = 0; g < groups; ++g) {
      // A block of equal large items, then many small ones.
      const std::int64_t big = rng.UniformInt(1'000, 1'000'000);
      for (std::int64_t i = rng.UniformInt(1, 2 * k); i > 0; --i) values.push_back(big);
      for (std::int64_t i = rng.UniformInt(0, 20 * k); i > 0; --i)
        values.push_back(rng.UniformInt(0, 1'000));
    }
    ExpectSame(values, k, PartSizes::kAny, "seed " + std::to_string(seed));
    if (::testing::Test::HasFailure()) return;
  }
}

// The absorption's keys at their width's edge: 2,000 items (11 bits each for a count
// and a first item, so 64-bit keys hold sums below 2^42), the heaviest part just below
// 2^42 (64-bit keys) or at it (128-bit ones), many small items after it.
TEST(RecipeFastTest, AnySizesAtTheEdgeOfTheNarrowKeys) {
  for (const std::int64_t top : {(std::int64_t{1} << 42) - 1, std::int64_t{1} << 42}) {
    for (std::uint64_t seed = 1; seed <= 6; ++seed) {
      workload::Rng rng(seed * 31 + 5);
      std::vector<std::int64_t> values(2000);
      for (std::int64_t& v : values) v = rng.UniformInt(0, std::int64_t{1} << 30);
      values[static_cast<std::size_t>(rng.UniformInt(0, 1999))] = top;
      for (const std::int64_t k : {64, 100, 333}) {
        ExpectSame(values, k, PartSizes::kAny,
                   "top " + std::to_string(top) + ", seed " + std::to_string(seed) + ", k " +
                       std::to_string(k));
      }
    }
  }
}

// The recipe's figures alone (RecipeDetail::kFigures) are those of its plan with
// micro-batches (kMicroBatches): count, predicted time, cap violations, empty
// micro-batches and empty ranks, on seeded steps (any rank count, padding, cost model,
// minimum, multiple and pipeline; fewer sequences than ranks; up to 30,000 sequences),
// and the figures have no ranks.
TEST(RecipeFastTest, TheFiguresAreThoseOfThePlan) {
  for (std::uint64_t seed = 1; seed <= 150; ++seed) {
    workload::Rng rng(seed * 15485863 + 7);
    const std::size_t n = Size(rng);
    std::vector<std::int64_t> lengths(n);
    const bool ties = rng.UniformInt(0, 3) == 0;
    for (std::int64_t& l : lengths) {
      l = ties ? rng.UniformInt(0, 6) * 500
               : std::min<std::int64_t>(16384,
                                        static_cast<std::int64_t>(std::exp(6.5 + rng.Normal())));
    }
    StepOptions options;
    options.num_ranks = rng.UniformInt(1, 70);
    MicroBatchOptions& mb = options.micro_batch;
    mb.pad_to_multiple_of = rng.UniformInt(0, 2) == 0 ? rng.UniformInt(2, 64) : 1;
    mb.max_tokens_per_micro_batch = 16384 + 64 + rng.UniformInt(0, 40000);
    mb.min_micro_batches = rng.UniformInt(1, 3);
    mb.micro_batches_multiple_of = rng.UniformInt(1, 3);
    mb.pipeline_stages = rng.UniformInt(1, 4);
    mb.overhead = rng.UniformInt(0, 1) == 0 ? 0 : rng.UniformInt(1, 3000);
    if (rng.UniformInt(0, 1) == 1) mb.cost = CostModel::Attention(ModelShape{});
    StepOptions resolved = options;
    resolved.micro_batch = internal::Resolved(mb);
    const internal::Padded padded = internal::Pad(lengths, resolved.micro_batch);
    const StepPlan plan =
        internal::RecipePlan(padded, resolved, internal::RecipeDetail::kMicroBatches);
    const StepPlan figures =
        internal::RecipePlan(padded, resolved, internal::RecipeDetail::kFigures);
    const std::string where = "seed " + std::to_string(seed) + ", n " + std::to_string(n);
    EXPECT_EQ(figures.num_micro_batches, plan.num_micro_batches) << where;
    EXPECT_EQ(figures.predicted_step_time, plan.predicted_step_time) << where;
    EXPECT_EQ(figures.cap_violations, plan.cap_violations) << where;
    EXPECT_EQ(figures.empty_micro_batches, plan.empty_micro_batches) << where;
    std::int64_t empty_ranks = 0;
    for (const RankPlan& rank : plan.ranks) empty_ranks += rank.sequences == 0 ? 1 : 0;
    EXPECT_EQ(figures.empty_ranks, empty_ranks) << where;
    EXPECT_TRUE(figures.ranks.empty()) << where;
    if (::testing::Test::HasFailure()) return;
  }
}

}  // namespace
}  // namespace rlsched::balance
