// KarmarkarKarp() gives, item for item, the assignment of the implementation it
// replaced (karmarkar_karp_reference.h) on seeded random instances of every shape: ties
// everywhere, zeros, n < k, n a few times k, and big heavy-tailed batches; and every
// result is a valid assignment with the loads adding up.

#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "internal.h"
#include "karmarkar_karp_reference.h"
#include "order.h"
#include "rlsched/balance/partition.h"
#include "rlsched/workload/workload.h"

namespace rlsched::balance {
namespace {

struct KkInstance {
  std::string kind;
  std::vector<std::int64_t> weights;
  std::int64_t k = 1;
};

KkInstance MakeKkInstance(std::uint64_t seed, std::int64_t max_n) {
  workload::Rng rng(seed * 104729 + 3);
  KkInstance inst;
  const std::int64_t n = rng.UniformInt(0, max_n);
  inst.k = rng.UniformInt(0, 3) == 0 ? rng.UniformInt(1, 8) : rng.UniformInt(1, 1200);
  switch (rng.UniformInt(0, 5)) {
    case 0:
      inst.kind = "heavy-tailed";
      inst.weights = workload::HeavyTailedLengths(n, seed);
      break;
    case 1:
      inst.kind = "few values";  // ties between items, slots and tuples
      for (std::int64_t i = 0; i < n; ++i) inst.weights.push_back(rng.UniformInt(0, 3) * 64);
      break;
    case 2:
      inst.kind = "all equal";
      inst.weights.assign(static_cast<std::size_t>(n), rng.UniformInt(0, 9));
      break;
    case 3:
      inst.kind = "uniform";
      for (std::int64_t i = 0; i < n; ++i) inst.weights.push_back(rng.UniformInt(0, 1'000'000));
      break;
    case 4:
      inst.kind = "wide";  // large weights: many radix digits
      for (std::int64_t i = 0; i < n; ++i) {
        inst.weights.push_back(rng.UniformInt(0, std::int64_t{1} << 40));
      }
      break;
    default:
      inst.kind = "n around k";
      inst.k = rng.UniformInt(1, 300);
      inst.weights = workload::HeavyTailedLengths(rng.UniformInt(0, 3 * inst.k), seed);
      break;
  }
  return inst;
}

void ExpectSameAsReference(const KkInstance& inst, const std::string& label) {
  for (const PartSizes sizes : {PartSizes::kAny, PartSizes::kEqual}) {
    const Assignment got = KarmarkarKarp(inst.weights, inst.k, sizes);
    const Assignment want = testing::reference_kk::KarmarkarKarp(inst.weights, inst.k, sizes);
    ASSERT_EQ(got.size(), inst.weights.size()) << label;
    std::vector<std::int64_t> loads(static_cast<std::size_t>(inst.k), 0);
    std::int64_t total = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      ASSERT_GE(got[i], 0) << label;
      ASSERT_LT(got[i], inst.k) << label;
      loads[static_cast<std::size_t>(got[i])] += inst.weights[i];
      total += inst.weights[i];
    }
    std::int64_t sum = 0;
    for (const std::int64_t l : loads) sum += l;
    EXPECT_EQ(sum, total) << label;
    ASSERT_EQ(got, want) << label << (sizes == PartSizes::kEqual ? " equal size" : " any size");
  }
}

TEST(KarmarkarKarpTest, SameAsTheReferenceOnSmallInstances) {
  for (std::uint64_t seed = 1; seed <= 600; ++seed) {
    const KkInstance inst = MakeKkInstance(seed, 600);
    ExpectSameAsReference(inst, inst.kind + " seed " + std::to_string(seed) + " n " +
                                    std::to_string(inst.weights.size()) + " k " +
                                    std::to_string(inst.k));
  }
}

TEST(KarmarkarKarpTest, SameAsTheReferenceOnMediumInstances) {
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    const KkInstance inst = MakeKkInstance(seed + 5000, 20'000);
    ExpectSameAsReference(inst, inst.kind + " seed " + std::to_string(seed + 5000) + " n " +
                                    std::to_string(inst.weights.size()) + " k " +
                                    std::to_string(inst.k));
  }
}

TEST(KarmarkarKarpTest, SameAsTheReferenceOnTheBenchmarkSizes) {
  for (const std::int64_t n : {4096, 65536}) {
    const std::vector<std::int64_t> weights = workload::HeavyTailedLengths(n, 1);
    for (const std::int64_t k : {64, 256, 1024}) {
      ExpectSameAsReference({"heavy-tailed", weights, k},
                            "n " + std::to_string(n) + " k " + std::to_string(k));
    }
  }
}

// Slots are 64-bit keys when the weights add up to less than 2^32, else 128-bit ones:
// totals on both sides of 2^32, with loads close to it in single parts (few parts, one
// item holding nearly all of it, or all of it among zeros).
TEST(KarmarkarKarpTest, SameAsTheReferenceAroundTheKeyWidth) {
  constexpr std::int64_t kWide = std::int64_t{1} << 32;
  workload::Rng rng(77);
  for (const std::int64_t total : {kWide - 2, kWide - 1, kWide, kWide + 1}) {
    for (const std::int64_t n : {1, 2, 7, 300, 2000}) {
      for (const std::int64_t k : {1, 2, 3, 64}) {
        std::vector<std::int64_t> weights;
        std::int64_t sum = 0;
        for (std::int64_t i = 0; i + 1 < n; ++i) {
          weights.push_back(rng.UniformInt(0, 3 * (total / n) / 2));
          sum += weights.back();
        }
        weights.push_back(total - sum);  // a large last item when n is small
        ExpectSameAsReference({"total " + std::to_string(total), weights, k},
                              "total " + std::to_string(total) + " n " + std::to_string(n) + " k " +
                                  std::to_string(k));
      }
    }
  }
}

// Above 2^32 the slots stay 64-bit while the total fits beside the items' index bits
// (h = the bits of n − 1, so 2^(64 − h)), then 128-bit: totals on both sides of that.
TEST(KarmarkarKarpTest, SameAsTheReferenceAroundTheNarrowHeadWidth) {
  workload::Rng rng(78);
  for (const std::int64_t n : {2, 7, 300, 2000}) {
    const int head_bits = std::bit_width(static_cast<std::uint64_t>(n));
    const std::int64_t edge = std::int64_t{1} << (64 - head_bits - 1) << 1;
    for (const std::int64_t total : {edge / 4, edge - 2, edge - 1, edge, edge + 1}) {
      for (const std::int64_t k : {1, 2, 3, 64}) {
        std::vector<std::int64_t> weights;
        std::int64_t sum = 0;
        for (std::int64_t i = 0; i + 1 < n; ++i) {
          weights.push_back(rng.UniformInt(0, total / n));
          sum += weights.back();
        }
        weights.push_back(total - sum);
        ExpectSameAsReference({"total " + std::to_string(total), weights, k},
                              "total " + std::to_string(total) + " n " + std::to_string(n) + " k " +
                                  std::to_string(k));
      }
    }
  }
}

// Small tuples meeting ones over 8 times their size (where only the m lightest slots
// of each leave their heaps): weights spread over six orders of magnitude give
// hundreds of such meetings at k = 256 and 1024; few distinct values give a few, among
// long runs of equal spreads.
TEST(KarmarkarKarpTest, SameAsTheReferenceWhenSmallTuplesMeetLargeOnes) {
  for (const std::int64_t k : {64, 256, 1024}) {
    workload::Rng rng(static_cast<std::uint64_t>(k));
    const std::int64_t n = 20 * k + 5;
    std::vector<std::int64_t> spread_out;
    std::vector<std::int64_t> few_values;
    for (std::int64_t i = 0; i < n; ++i) {
      spread_out.push_back(rng.UniformInt(1, 1 << 20) * rng.UniformInt(1, 1 << 10));
      few_values.push_back(rng.UniformInt(0, 3) * 64);
    }
    ExpectSameAsReference({"spread out", spread_out, k}, "spread out k " + std::to_string(k));
    ExpectSameAsReference({"few values", few_values, k}, "few values k " + std::to_string(k));
  }
}

// HeaviestFirst (the radix order) against a stable comparison sort, on each of its
// paths: the comparison sort (n < 512), one, two and three narrow passes (weights
// spanning up to 11, 22 and 32 bits, offset or not), and 64-bit keys (a span of 2^32
// or more); with ties, and with the sorted weights asked for or not.
TEST(HeaviestFirstTest, SameAsAStableComparisonSort) {
  struct Case {
    std::int64_t n;
    std::int64_t lo;
    std::int64_t hi;
  };
  const Case cases[] = {
      {300, 0, 1000},
      {5000, 0, 0},
      {5000, 0, 7},
      {5000, 100, (1 << 11) + 99},
      {5000, 0, (1 << 11)},
      {5000, 0, 1 << 16},
      {5000, 1'000'000'000'000, 1'000'000'000'000 + (1 << 22) - 1},
      {5000, 0, 1 << 22},
      {5000, 0, (std::int64_t{1} << 32) - 1},
      {5000, 7, (std::int64_t{1} << 32) + 6},
      {5000, 0, std::int64_t{1} << 32},
      {5000, 0, std::int64_t{1} << 40},
      {5000, 0, std::numeric_limits<std::int64_t>::max() / 8000},
  };
  workload::Rng rng(17);
  for (const Case& c : cases) {
    std::vector<std::int64_t> weights;
    for (std::int64_t i = 0; i < c.n; ++i) {
      // Every fourth weight repeats an earlier one: ties by index.
      weights.push_back(i % 4 == 3 ? weights[static_cast<std::size_t>(rng.UniformInt(0, i - 1))]
                                   : rng.UniformInt(c.lo, c.hi));
    }
    weights[0] = c.lo;  // the whole span
    weights[1] = c.hi;
    const std::string where = "n " + std::to_string(c.n) + " in [" + std::to_string(c.lo) + ", " +
                              std::to_string(c.hi) + "]";
    const std::vector<std::int32_t> expected = testing::reference_kk::HeaviestFirst(weights);
    std::vector<std::int64_t> sorted;
    EXPECT_EQ(internal::HeaviestFirst(weights, &sorted), expected) << where;
    ASSERT_EQ(sorted.size(), expected.size()) << where;
    for (std::size_t s = 0; s < expected.size(); ++s) {
      ASSERT_EQ(sorted[s], weights[static_cast<std::size_t>(expected[s])]) << where << " at " << s;
    }
    EXPECT_EQ(internal::HeaviestFirst(weights), expected) << where;
  }
}

// HeaviestFirstSlots: weight · 2^32 + index in HeaviestFirst's order, through the
// comparison sort (n < 512) and the radix sort's one, two and three passes.
TEST(HeaviestFirstTest, SlotsInTheSameOrder) {
  workload::Rng rng(23);
  for (const std::int64_t n : {0, 1, 300, 5000}) {
    for (const std::int64_t hi : {std::int64_t{0}, std::int64_t{9}, std::int64_t{1} << 11,
                                  std::int64_t{1} << 20, (std::int64_t{1} << 32) - 1}) {
      std::vector<std::int64_t> weights;
      for (std::int64_t i = 0; i < n; ++i) {
        weights.push_back(i % 3 == 2 ? weights[static_cast<std::size_t>(rng.UniformInt(0, i - 1))]
                                     : rng.UniformInt(0, hi));
      }
      const std::vector<std::int32_t> order = testing::reference_kk::HeaviestFirst(weights);
      const std::unique_ptr<std::uint64_t[]> slots = internal::HeaviestFirstSlots(weights);
      for (std::size_t s = 0; s < order.size(); ++s) {
        const auto i = static_cast<std::size_t>(order[s]);
        ASSERT_EQ(slots[s], static_cast<std::uint64_t>(weights[i]) << 32 | i)
            << "n " << n << " up to " << hi << " at " << s;
      }
    }
  }
}

TEST(KarmarkarKarpThoroughTest, SameAsTheReferenceOnManyInstances) {
  for (std::uint64_t seed = 1; seed <= 4000; ++seed) {
    const KkInstance inst = MakeKkInstance(seed + 100'000, 3000);
    ExpectSameAsReference(inst, inst.kind + " seed " + std::to_string(seed + 100'000));
  }
}

}  // namespace
}  // namespace rlsched::balance
