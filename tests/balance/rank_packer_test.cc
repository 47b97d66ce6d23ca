// The rank packer (balance/src/rank_packer.h): the long sequences packed onto few
// ranks, a candidate rank assignment of PlanStep.

#include "rank_packer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "micro_batch_internal.h"
#include "rlsched/workload/workload.h"

namespace rlsched::balance::internal {
namespace {

// Units of a seeded GRPO batch: one per sequence, or one per group.
Units MakeTestUnits(const workload::SyntheticBatch& batch, bool groups) {
  Units units;
  for (std::size_t i = 0; i < batch.lengths.size(); ++i) {
    const auto index = static_cast<std::int64_t>(i);
    if (!groups || i == 0 || batch.groups[i] != batch.groups[i - 1]) {
      units.members.emplace_back();
      units.cost.push_back(0);
      units.largest.push_back(0);
    }
    units.members.back().push_back(index);
    units.cost.back() += batch.lengths[i];
    units.largest.back() = std::max(units.largest.back(), batch.lengths[i]);
  }
  return units;
}

// Every sequence on exactly one rank, ranks ascending, and with equal counts every
// rank holding floor(U / R) or ceil(U / R) units, groups whole.
void ExpectValidRanks(const Units& units, std::int64_t num_ranks, PartSizes counts,
                      const std::vector<std::vector<std::int64_t>>& ranks) {
  ASSERT_EQ(static_cast<std::int64_t>(ranks.size()), num_ranks);
  std::int64_t sequences = 0;
  std::vector<std::int64_t> unit_of;
  for (std::size_t u = 0; u < units.members.size(); ++u) {
    for (const std::int64_t i : units.members[u]) {
      if (static_cast<std::size_t>(i) >= unit_of.size()) unit_of.resize(i + 1, -1);
      unit_of[static_cast<std::size_t>(i)] = static_cast<std::int64_t>(u);
      ++sequences;
    }
  }
  std::vector<int> seen(unit_of.size(), 0);
  std::vector<std::int64_t> rank_of_unit(units.members.size(), -1);
  const auto num_units = static_cast<std::int64_t>(units.members.size());
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    EXPECT_TRUE(std::is_sorted(ranks[r].begin(), ranks[r].end()));
    std::int64_t held = 0;
    for (const std::int64_t i : ranks[r]) {
      ++seen[static_cast<std::size_t>(i)];
      std::int64_t& rank =
          rank_of_unit[static_cast<std::size_t>(unit_of[static_cast<std::size_t>(i)])];
      if (rank < 0) {
        rank = static_cast<std::int64_t>(r);
        ++held;
      }
      EXPECT_EQ(rank, static_cast<std::int64_t>(r)) << "a unit split across ranks";
    }
    if (counts == PartSizes::kEqual) {
      EXPECT_GE(held, num_units / num_ranks) << "rank " << r;
      EXPECT_LE(held, (num_units + num_ranks - 1) / num_ranks) << "rank " << r;
    }
  }
  for (const int s : seen) EXPECT_EQ(s, 1) << "a sequence lost or doubled";
  EXPECT_EQ(sequences, static_cast<std::int64_t>(seen.size()));
}

// Seeded batches, sequences or groups, with and without equal counts, at every
// pipeline depth: a budget that fits everything on one rank always packs, the
// packing is valid and deterministic; a budget below the mean rank never packs.
TEST(RankPackerTest, PacksEveryUnitOnce) {
  for (std::uint64_t seed = 1; seed <= 400; ++seed) {
    workload::Rng rng(seed * 2654435761u + 11);
    const workload::SyntheticBatch batch =
        workload::GrpoBatch(rng.UniformInt(1, 40), rng.UniformInt(1, 8), seed);
    const bool groups = rng.UniformInt(0, 2) == 0;
    const Units units = MakeTestUnits(batch, groups);
    const std::int64_t num_ranks = rng.UniformInt(1, 16);
    const std::int64_t stages = rng.UniformInt(1, 8);
    const std::int64_t m = rng.UniformInt(1, 12);
    const PartSizes counts = rng.UniformInt(0, 1) == 0 ? PartSizes::kAny : PartSizes::kEqual;
    SCOPED_TRACE("seed " + std::to_string(seed));
    double total = 0.0;
    double largest = 0.0;
    for (std::size_t u = 0; u < units.cost.size(); ++u) {
      total += static_cast<double>(units.cost[u]);
      largest = std::max(largest, static_cast<double>(units.largest[u]));
    }
    const double mean = total / static_cast<double>(num_ranks);
    // Everything on one rank fits this budget (and any reserve for equal counts).
    const double loose =
        (total + static_cast<double>(stages) * largest) * static_cast<double>(stages + m) + 1.0;
    const auto packed = PackedRanks(units, num_ranks, stages, m, mean, loose, counts);
    ASSERT_FALSE(packed.empty());
    ExpectValidRanks(units, num_ranks, counts, packed);
    EXPECT_EQ(PackedRanks(units, num_ranks, stages, m, mean, loose, counts), packed);
    // No rank may take more than the budget's cost, so a budget below the mean fails.
    if (mean > 1.0) {
      EXPECT_TRUE(PackedRanks(units, num_ranks, stages, m, mean * 0.5, mean * 0.9, counts).empty());
    }
    // A budget in between: empty, or valid.
    const auto tighter = PackedRanks(units, num_ranks, stages, m, mean, mean * 1.02, counts);
    if (!tighter.empty()) ExpectValidRanks(units, num_ranks, counts, tighter);
    if (::testing::Test::HasFailure()) return;
  }
}

// The first-fit rule at a fixed budget T (lo = hi = T), p = 4, m = 4, three ranks,
// two long sequences of cost 100 (long: 100 >= T / (m + p − 1) = T / 7) and twelve of
// 10 (short). A rank led by a sequence of cost a takes cost up to
// min(T − 3a, 4T / 7): at T = 600 that is 300 >= 100 + 100, so both long sequences
// share rank 0 (first fit), whose room left (100) is below the empty ranks', so the
// short ones go to ranks 1 and 2 (worst fit). At T = 499 rank 0 has room for 199 only:
// the second long sequence opens rank 1.
TEST(RankPackerTest, FirstFitAtAFixedBudget) {
  Units units;
  for (std::int64_t i = 0; i < 14; ++i) {
    const std::int64_t cost = i < 2 ? 100 : 10;
    units.members.push_back({i});
    units.cost.push_back(cost);
    units.largest.push_back(cost);
  }
  const auto shared = PackedRanks(units, 3, 4, 4, 600.0, 600.0, PartSizes::kAny);
  ASSERT_EQ(shared.size(), 3u);
  EXPECT_EQ(shared[0], (std::vector<std::int64_t>{0, 1}));
  EXPECT_EQ(shared[1].size() + shared[2].size(), 12u);
  ExpectValidRanks(units, 3, PartSizes::kAny, shared);
  const auto apart = PackedRanks(units, 3, 4, 4, 499.0, 499.0, PartSizes::kAny);
  ASSERT_EQ(apart.size(), 3u);
  EXPECT_EQ(apart[0].front(), 0);
  EXPECT_EQ(apart[1].front(), 1);
  ExpectValidRanks(units, 3, PartSizes::kAny, apart);
  // Below what the two long sequences alone need on separate ranks (each rank
  // min(T − 300, 4T / 7) >= 100: T >= 400), nothing fits.
  EXPECT_TRUE(PackedRanks(units, 3, 4, 4, 399.0, 399.0, PartSizes::kAny).empty());
}

}  // namespace
}  // namespace rlsched::balance::internal
