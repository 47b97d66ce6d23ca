// Seeded random instances: every item placed once, loads add up, counts and bounds
// hold, KK + refinement never worse than LPT or than plain KK, same input → same output.
// The `Thorough` suite repeats the sweep over thousands of instances (CTest label
// `thorough`).

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "rlsched/balance/balance.h"
#include "rlsched/balance/partition.h"
#include "rlsched/workload/workload.h"
#include "test_util.h"

namespace rlsched::balance {
namespace {

using testing::ExpectValidPartition;
using testing::MaxLoadOf;

struct PropertyInstance {
  std::string kind;
  std::vector<std::int64_t> weights;
  std::int64_t k;
  bool equal_size;
};

// One random instance of a family picked by `seed`.
PropertyInstance MakePropertyInstance(std::uint64_t seed) {
  workload::Rng rng(seed * 7919 + 17);
  PropertyInstance inst;
  inst.equal_size = rng.UniformInt(0, 1) == 1;
  const std::int64_t family = rng.UniformInt(0, 8);
  std::int64_t k = rng.UniformInt(1, 40);
  std::int64_t n = rng.UniformInt(0, 400);
  switch (family) {
    case 0:
      inst.kind = "uniform";
      for (std::int64_t i = 0; i < n; ++i) inst.weights.push_back(rng.UniformInt(0, 1000));
      break;
    case 1:
      inst.kind = "heavy-tailed";
      inst.weights = workload::HeavyTailedLengths(n, seed);
      break;
    case 2:
      inst.kind = "all-equal";
      inst.weights.assign(static_cast<std::size_t>(n), rng.UniformInt(0, 5000));
      break;
    case 3:
      inst.kind = "one-giant";
      inst.weights = workload::HeavyTailedLengths(n, seed);
      inst.weights.push_back(1'000'000);
      break;
    case 4:
      inst.kind = "n<k";
      k = rng.UniformInt(2, 60);
      inst.weights = workload::HeavyTailedLengths(rng.UniformInt(0, k - 1), seed);
      break;
    case 5:
      inst.kind = "n=k";
      inst.weights = workload::HeavyTailedLengths(k, seed);
      break;
    case 6:
      inst.kind = "n=k+1";
      inst.weights = workload::HeavyTailedLengths(k + 1, seed);
      break;
    case 7:
      inst.kind = "equal-size n%k!=0";
      k = rng.UniformInt(2, 40);
      inst.equal_size = true;
      inst.weights =
          workload::HeavyTailedLengths(k * rng.UniformInt(1, 8) + rng.UniformInt(1, k - 1), seed);
      break;
    default:
      inst.kind = "few distinct values";
      for (std::int64_t i = 0; i < n; ++i) inst.weights.push_back(rng.UniformInt(1, 3) * 100);
      break;
  }
  inst.k = k;
  return inst;
}

void CheckInstance(const PropertyInstance& inst) {
  SCOPED_TRACE(inst.kind + " n=" + std::to_string(inst.weights.size()) +
               " k=" + std::to_string(inst.k) + " equal_size=" + std::to_string(inst.equal_size));
  const auto& w = inst.weights;
  PartitionOptions options;
  options.num_parts = inst.k;
  options.equal_size = inst.equal_size;

  const Partition best = PartitionItems(w, options);
  ExpectValidPartition(w, inst.k, inst.equal_size, best);

  const Assignment kk = KarmarkarKarp(w, inst.k, inst.equal_size);
  const Assignment lpt = GreedyLpt(w, inst.k, inst.equal_size);
  ExpectValidPartition(w, inst.k, inst.equal_size, MakePartition(w, inst.k, inst.equal_size, kk));
  ExpectValidPartition(w, inst.k, inst.equal_size, MakePartition(w, inst.k, inst.equal_size, lpt));
  if (!w.empty()) {
    EXPECT_LE(best.max_load, MaxLoadOf(w, inst.k, kk)) << "worse than plain KK";
    EXPECT_LE(best.max_load, MaxLoadOf(w, inst.k, lpt)) << "worse than LPT";
  }

  // Refinement alone never raises the max load of what it starts from.
  Assignment refined = ContiguousSplit(static_cast<std::int64_t>(w.size()), inst.k);
  const std::int64_t before = w.empty() ? 0 : MaxLoadOf(w, inst.k, refined);
  Refine(w, inst.k, inst.equal_size, RefineOptions{}, 0, refined);
  const Partition after = MakePartition(w, inst.k, inst.equal_size, refined);
  ExpectValidPartition(w, inst.k, inst.equal_size, after);
  EXPECT_LE(after.max_load, before);

  // Deterministic.
  const Partition again = PartitionItems(w, options);
  EXPECT_EQ(again.indices, best.indices);
  EXPECT_EQ(again.offsets, best.offsets);
}

void Sweep(std::uint64_t first, std::uint64_t count) {
  for (std::uint64_t seed = first; seed < first + count; ++seed) {
    CheckInstance(MakePropertyInstance(seed));
    if (::testing::Test::HasFailure()) {
      ADD_FAILURE() << "first failing seed " << seed;
      return;
    }
  }
}

TEST(PropertyTest, RandomInstances) { Sweep(1, 400); }
TEST(PropertyTest, ThoroughRandomInstances) { Sweep(1000, 20000); }

// GRPO batches with keep_groups: groups whole, every sequence once, counts of groups.
void GroupSweep(std::uint64_t first, std::uint64_t count) {
  for (std::uint64_t seed = first; seed < first + count; ++seed) {
    workload::Rng rng(seed);
    const workload::SyntheticBatch batch =
        workload::GrpoBatch(rng.UniformInt(0, 60), rng.UniformInt(1, 16), seed);
    BalanceOptions options;
    options.partition.num_parts = rng.UniformInt(1, 24);
    options.partition.equal_size = rng.UniformInt(0, 1) == 1;
    options.keep_groups = true;
    const BalanceResult r = Balance(batch.lengths, batch.groups, options);
    const std::int64_t k = options.partition.num_parts;
    const std::int64_t num_groups = batch.groups.empty() ? 0 : batch.groups.back() + 1;
    std::vector<std::int64_t> part_of_group(static_cast<std::size_t>(num_groups), -1);
    std::vector<int> seen(batch.lengths.size(), 0);
    for (std::int64_t p = 0; p < k; ++p) {
      std::int64_t groups_here = 0;
      for (const std::int64_t i : r.partition.part(p)) {
        ++seen[static_cast<std::size_t>(i)];
        auto& owner =
            part_of_group[static_cast<std::size_t>(batch.groups[static_cast<std::size_t>(i)])];
        if (owner == -1) {
          owner = p;
          ++groups_here;
        }
        ASSERT_EQ(owner, p) << "seed " << seed << ": a group is split";
      }
      if (options.partition.equal_size) {
        EXPECT_GE(groups_here, num_groups / k) << "seed " << seed;
        EXPECT_LE(groups_here, num_groups / k + 1) << "seed " << seed;
      }
    }
    for (const int s : seen) ASSERT_EQ(s, 1) << "seed " << seed;
    EXPECT_GE(r.partition.max_load, r.partition.lower_bound);
  }
}

TEST(PropertyTest, GroupsKeptWhole) { GroupSweep(1, 200); }
TEST(PropertyTest, ThoroughGroupsKeptWhole) { GroupSweep(5000, 3000); }

// The lower bound never exceeds the true optimum (exhaustive search on tiny inputs).
std::int64_t Optimum(const std::vector<std::int64_t>& w, std::int64_t k, bool equal_size) {
  const std::int64_t n = static_cast<std::int64_t>(w.size());
  std::int64_t best = INT64_MAX;
  std::vector<std::int64_t> loads(static_cast<std::size_t>(k)), counts(static_cast<std::size_t>(k));
  const std::int64_t cap = n / k + (n % k != 0 ? 1 : 0);
  std::function<void(std::int64_t)> go = [&](std::int64_t i) {
    if (i == n) {
      if (equal_size) {
        for (const std::int64_t c : counts) {
          if (c < n / k) return;
        }
      }
      best = std::min(best, *std::max_element(loads.begin(), loads.end()));
      return;
    }
    for (std::size_t p = 0; p < loads.size(); ++p) {
      if (equal_size && counts[p] == cap) continue;
      loads[p] += w[static_cast<std::size_t>(i)];
      ++counts[p];
      go(i + 1);
      loads[p] -= w[static_cast<std::size_t>(i)];
      --counts[p];
    }
  };
  go(0);
  return best;
}

TEST(PropertyTest, LowerBoundNeverExceedsTheOptimum) {
  workload::Rng rng(42);
  for (int trial = 0; trial < 300; ++trial) {
    const std::int64_t n = rng.UniformInt(1, 8);
    const std::int64_t k = rng.UniformInt(1, 3);
    const bool equal_size = rng.UniformInt(0, 1) == 1;
    std::vector<std::int64_t> w;
    for (std::int64_t i = 0; i < n; ++i) w.push_back(rng.UniformInt(0, 50));
    const std::int64_t optimum = Optimum(w, k, equal_size);
    EXPECT_LE(LowerBound(w, k, equal_size), optimum) << "trial " << trial;
    PartitionOptions options;
    options.num_parts = k;
    options.equal_size = equal_size;
    const Partition p = PartitionItems(w, options);
    EXPECT_GE(p.max_load, optimum);
    if (p.proven_optimal) {
      EXPECT_EQ(p.max_load, optimum);
    }
  }
}

}  // namespace
}  // namespace rlsched::balance
