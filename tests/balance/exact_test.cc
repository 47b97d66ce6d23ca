// The exact search: agreement with brute force on every small instance, never worse
// than its incumbent, proven only when optimal, budgets (nodes, injected clock)
// respected, bad input rejected, and its use inside PartitionItems(). The `Thorough`
// suite repeats the comparisons over thousands of instances (CTest label `thorough`).

#include "rlsched/balance/exact.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "rlsched/balance/partition.h"
#include "rlsched/workload/workload.h"
#include "test_util.h"

namespace rlsched::balance {
namespace {

using testing::ErrorOf;
using testing::ExpectValidPartition;
using ::testing::HasSubstr;
using testing::MaxLoadOf;

// The optimum by enumeration: item i goes to one of the parts used so far or to the
// next unused one (parts are interchangeable), every assignment is visited.
std::int64_t BruteForce(const std::vector<std::int64_t>& w, std::int64_t k, bool equal_size) {
  const std::int64_t n = static_cast<std::int64_t>(w.size());
  const std::int64_t low = n / k;
  const std::int64_t high = low + (n % k != 0 ? 1 : 0);
  std::vector<std::int64_t> loads(static_cast<std::size_t>(k), 0);
  std::vector<std::int64_t> counts(static_cast<std::size_t>(k), 0);
  std::int64_t best = INT64_MAX;
  auto go = [&](auto&& self, std::int64_t i, std::int64_t used) -> void {
    if (i == n) {
      if (equal_size) {
        for (const std::int64_t c : counts) {
          if (c < low) return;
        }
      }
      best = std::min(best, *std::max_element(loads.begin(), loads.end()));
      return;
    }
    for (std::int64_t p = 0; p < std::min(k, used + 1); ++p) {
      const std::size_t q = static_cast<std::size_t>(p);
      if (equal_size && counts[q] == high) continue;
      loads[q] += w[static_cast<std::size_t>(i)];
      ++counts[q];
      self(self, i + 1, std::max(used, p + 1));
      loads[q] -= w[static_cast<std::size_t>(i)];
      --counts[q];
    }
  };
  go(go, 0, 0);
  return best;
}

// Every entry in [0, k) and, with equal_size, floor(n/k) or ceil(n/k) items per part.
void ExpectValidAssignment(const Assignment& a, std::size_t n, std::int64_t k, bool equal_size) {
  ASSERT_EQ(a.size(), n);
  std::vector<std::int64_t> counts(static_cast<std::size_t>(k), 0);
  for (const std::int32_t p : a) {
    ASSERT_GE(p, 0);
    ASSERT_LT(p, k);
    ++counts[static_cast<std::size_t>(p)];
  }
  if (!equal_size) return;
  const std::int64_t low = static_cast<std::int64_t>(n) / k;
  for (const std::int64_t c : counts) {
    EXPECT_GE(c, low);
    EXPECT_LE(c, low + (static_cast<std::int64_t>(n) % k != 0 ? 1 : 0));
  }
}

struct Instance {
  std::vector<std::int64_t> weights;
  std::int64_t k = 1;
  bool equal_size = false;
};

// A small random instance: n in [0, max_n], k in [1, max_k], weights from one of
// several families (small values with many ties and zeros, wide values, heavy-tailed).
Instance SmallInstance(std::uint64_t seed, std::int64_t max_n, std::int64_t max_k) {
  workload::Rng rng(seed * 6151 + 3);
  Instance inst;
  inst.k = rng.UniformInt(1, max_k);
  inst.equal_size = rng.UniformInt(0, 1) == 1;
  const std::int64_t n = rng.UniformInt(0, max_n);
  switch (rng.UniformInt(0, 3)) {
    case 0:  // ties and zeros
      for (std::int64_t i = 0; i < n; ++i) inst.weights.push_back(rng.UniformInt(0, 6));
      break;
    case 1:
      for (std::int64_t i = 0; i < n; ++i) inst.weights.push_back(rng.UniformInt(1, 100));
      break;
    case 2:
      for (std::int64_t i = 0; i < n; ++i) {
        inst.weights.push_back(rng.UniformInt(1, 1'000'000'000'000));
      }
      break;
    default:
      inst.weights = workload::HeavyTailedLengths(n, seed);
      break;
  }
  return inst;
}

// A valid incumbent of one of several kinds (empty = LPT inside the search).
Assignment SomeIncumbent(const Instance& inst, std::uint64_t seed) {
  const std::int64_t n = static_cast<std::int64_t>(inst.weights.size());
  switch (seed % 4) {
    case 0:
      return {};
    case 1:
      return KarmarkarKarp(inst.weights, inst.k, inst.equal_size);
    case 2:
      return ContiguousSplit(n, inst.k);  // valid in both modes
    default: {
      // Everything in part 0, or the contiguous split shuffled in equal-size mode.
      Assignment a =
          inst.equal_size ? ContiguousSplit(n, inst.k) : Assignment(static_cast<std::size_t>(n), 0);
      workload::Rng rng(seed);
      for (std::size_t i = a.size(); i > 1; --i) {
        std::swap(a[i - 1], a[static_cast<std::size_t>(rng.UniformInt(0, i - 1))]);
      }
      return a;
    }
  }
}

// What a sweep exercised.
struct Coverage {
  int instances = 0;
  int improved = 0;
  int proven_above_bound = 0;  // proven optimal with max_load > LowerBound()
  int searched = 0;            // nodes > 0
};

// Runs the search on `inst` from `incumbent` and checks it against brute force.
void CheckAgainstBruteForce(const Instance& inst, const Assignment& incumbent,
                            const ExactOptions& options, bool expect_proven, Coverage& coverage) {
  const auto& w = inst.weights;
  const ExactResult r = ExactSearch(w, inst.k, inst.equal_size, incumbent, options);
  ExpectValidAssignment(r.assignment, w.size(), inst.k, inst.equal_size);
  EXPECT_EQ(r.max_load, MaxLoadOf(w, inst.k, r.assignment));
  const Assignment start = incumbent.empty() ? GreedyLpt(w, inst.k, inst.equal_size) : incumbent;
  const std::int64_t start_max = MaxLoadOf(w, inst.k, start);
  EXPECT_LE(r.max_load, start_max);
  EXPECT_EQ(r.improved, r.max_load < start_max);
  if (!r.improved) {
    EXPECT_EQ(r.assignment, start);
  }
  EXPECT_LE(r.nodes, options.max_nodes);
  const std::int64_t optimum = BruteForce(w, inst.k, inst.equal_size);
  EXPECT_GE(r.max_load, optimum);
  EXPECT_GE(r.lower_bound, LowerBound(w, inst.k, inst.equal_size));
  EXPECT_LE(r.lower_bound, optimum);
  if (r.proven_optimal) {
    EXPECT_EQ(r.max_load, optimum);
    EXPECT_EQ(r.lower_bound, r.max_load);
  }
  if (expect_proven) {
    EXPECT_TRUE(r.proven_optimal);
  }
  ++coverage.instances;
  coverage.improved += r.improved ? 1 : 0;
  coverage.searched += r.nodes > 0 ? 1 : 0;
  if (r.proven_optimal && r.max_load > LowerBound(w, inst.k, inst.equal_size)) {
    ++coverage.proven_above_bound;
  }
}

TEST(ExactSearchTest, ImprovesKarmarkarKarpToTheKnownOptimum) {
  // Plain differencing gives 16 / 14; the optimum {8, 7} / {6, 5, 4} is 15 / 15.
  const std::vector<std::int64_t> w = {8, 7, 6, 5, 4};
  const Assignment kk = KarmarkarKarp(w, 2, false);
  ASSERT_EQ(MaxLoadOf(w, 2, kk), 16);
  const ExactResult r = ExactSearch(w, 2, false, kk, ExactOptions{});
  EXPECT_EQ(r.max_load, 15);
  EXPECT_EQ(MaxLoadOf(w, 2, r.assignment), 15);
  EXPECT_TRUE(r.proven_optimal);
  EXPECT_TRUE(r.improved);
  EXPECT_EQ(r.lower_bound, 15);
  EXPECT_GT(r.nodes, 0);
}

TEST(ExactSearchTest, ProvesAnOptimumAboveEveryBound) {
  // Sum 38 over 3 parts: the bounds give 13 (ceil(38 / 3), and 7 + 6 for the two
  // of the four heaviest that share a part), but the optimum is 15 ({9, 6} twice).
  const std::vector<std::int64_t> w = {6, 7, 6, 1, 9, 9};
  ASSERT_EQ(BruteForce(w, 3, false), 15);
  ASSERT_EQ(LowerBound(w, 3, false), 13);
  const ExactResult r = ExactSearch(w, 3, false, ContiguousSplit(6, 3), ExactOptions{});
  EXPECT_EQ(r.max_load, 15);
  EXPECT_TRUE(r.proven_optimal);
  EXPECT_EQ(r.lower_bound, 15);

  // PartitionItems() reports it proven although it is above the lower bound.
  PartitionOptions options;
  options.num_parts = 3;
  const Partition p = PartitionItems(w, options);
  ExpectValidPartition(w, 3, false, p);
  EXPECT_EQ(p.max_load, 15);
  EXPECT_EQ(p.lower_bound, 13);
  EXPECT_TRUE(p.proven_optimal);
}

TEST(ExactSearchTest, PigeonholeBoundProvesWithoutSearching) {
  // Three items of 7 in two parts: two share a part, so 14 is optimal, although
  // LowerBound() says 11.
  const std::vector<std::int64_t> w = {7, 7, 7};
  const ExactResult r = ExactSearch(w, 2, false, Assignment{0, 0, 1}, ExactOptions{});
  EXPECT_EQ(r.max_load, 14);
  EXPECT_TRUE(r.proven_optimal);
  EXPECT_EQ(r.nodes, 0);
  EXPECT_FALSE(r.improved);
}

TEST(ExactSearchTest, EqualSizeKnownOptimum) {
  // Without counts {10} / {6, 5, 1} is 12 / 12; with two items per part the optimum
  // is {10, 1} / {6, 5} = 11 / 11, and a start of {10, 6} / {5, 1} is 16.
  const std::vector<std::int64_t> w = {10, 6, 5, 1};
  const ExactResult r = ExactSearch(w, 2, true, Assignment{0, 0, 1, 1}, ExactOptions{});
  EXPECT_EQ(r.max_load, 11);
  EXPECT_TRUE(r.proven_optimal);
  ExpectValidAssignment(r.assignment, w.size(), 2, true);
}

TEST(ExactSearchTest, TrivialInstances) {
  for (const bool equal_size : {false, true}) {
    // No items.
    ExactResult r = ExactSearch(std::vector<std::int64_t>{}, 3, equal_size, {}, ExactOptions{});
    EXPECT_TRUE(r.assignment.empty());
    EXPECT_EQ(r.max_load, 0);
    EXPECT_TRUE(r.proven_optimal);
    // One part.
    const std::vector<std::int64_t> w = {4, 9, 1};
    r = ExactSearch(w, 1, equal_size, {}, ExactOptions{});
    EXPECT_EQ(r.max_load, 14);
    EXPECT_TRUE(r.proven_optimal);
    // More parts than items: one item per part at most.
    r = ExactSearch(w, 5, equal_size, equal_size ? Assignment{} : Assignment{0, 0, 0},
                    ExactOptions{});
    EXPECT_EQ(r.max_load, 9);
    EXPECT_TRUE(r.proven_optimal);
    ExpectValidAssignment(r.assignment, w.size(), 5, equal_size);
    // Only zeros.
    const std::vector<std::int64_t> zeros(7, 0);
    r = ExactSearch(zeros, 3, equal_size, {}, ExactOptions{});
    EXPECT_EQ(r.max_load, 0);
    EXPECT_TRUE(r.proven_optimal);
    ExpectValidAssignment(r.assignment, zeros.size(), 3, equal_size);
  }
}

TEST(ExactSearchTest, ZerosAndTiesInEqualSizeMode) {
  // Zeros still count as items: 3 parts of 3 items.
  const std::vector<std::int64_t> w = {5, 5, 5, 0, 0, 0, 0, 0, 4};
  const ExactResult r = ExactSearch(w, 3, true, ContiguousSplit(9, 3), ExactOptions{});
  EXPECT_EQ(r.max_load, BruteForce(w, 3, true));
  EXPECT_TRUE(r.proven_optimal);
  ExpectValidAssignment(r.assignment, w.size(), 3, true);
}

TEST(ExactSearchTest, AgreesWithBruteForce) {
  // n <= 10, k <= 3, both modes, every kind of incumbent; the default budget always
  // suffices at this size.
  Coverage coverage;
  for (std::uint64_t seed = 1; seed <= 1000; ++seed) {
    const Instance inst = SmallInstance(seed, 10, 3);
    SCOPED_TRACE("seed " + std::to_string(seed) + " n=" + std::to_string(inst.weights.size()) +
                 " k=" + std::to_string(inst.k) + " equal_size=" + std::to_string(inst.equal_size));
    CheckAgainstBruteForce(inst, SomeIncumbent(inst, seed), ExactOptions{}, true, coverage);
    if (HasFatalFailure()) return;
  }
  // Many of them are not trivial: the search ran, improved, proved an optimum that
  // no bound shows.
  EXPECT_GT(coverage.searched, 250);
  EXPECT_GT(coverage.improved, 200);
  EXPECT_GT(coverage.proven_above_bound, 100);
}

TEST(ExactSearchTest, TinyBudgetsNeverHurtAndNeverLie) {
  // With budgets too small to finish, the answer is never worse than the incumbent
  // and is reported proven only when it is optimal.
  int stopped = 0;
  Coverage coverage;
  for (std::uint64_t seed = 1; seed <= 300; ++seed) {
    const Instance inst = SmallInstance(seed + 10'000, 10, 4);
    SCOPED_TRACE("seed " + std::to_string(seed));
    for (const std::int64_t budget : {1, 3, 20, 200}) {
      ExactOptions options;
      options.max_nodes = budget;
      const Assignment incumbent = SomeIncumbent(inst, seed);
      CheckAgainstBruteForce(inst, incumbent, options, false, coverage);
      if (!ExactSearch(inst.weights, inst.k, inst.equal_size, incumbent, options).proven_optimal) {
        ++stopped;
      }
    }
    if (HasFatalFailure()) return;
  }
  EXPECT_GT(stopped, 0);  // the budgets did cut some searches short
}

// 40 wide random weights in 4 parts: no partition meets the bound, and none is
// proven optimal in a few thousand nodes.
std::vector<std::int64_t> HardWeights() {
  workload::Rng rng(77);
  std::vector<std::int64_t> w;
  for (int i = 0; i < 40; ++i) w.push_back(rng.UniformInt(1, 1'000'000'000'000));
  return w;
}

TEST(ExactSearchTest, NodeBudgetStopsTheSearch) {
  const std::vector<std::int64_t> w = HardWeights();
  const Assignment kk = KarmarkarKarp(w, 4, false);
  for (const std::int64_t budget : {1, 10, 1000, 5000}) {
    ExactOptions options;
    options.max_nodes = budget;
    const ExactResult r = ExactSearch(w, 4, false, kk, options);
    EXPECT_EQ(r.nodes, budget);
    EXPECT_FALSE(r.proven_optimal);
    EXPECT_LE(r.max_load, MaxLoadOf(w, 4, kk));
    EXPECT_GE(r.lower_bound, LowerBound(w, 4, false));
    EXPECT_LT(r.lower_bound, r.max_load);
  }
}

TEST(ExactSearchTest, ZeroBudgetReturnsTheIncumbent) {
  const std::vector<std::int64_t> w = {8, 7, 6, 5, 4};
  const Assignment kk = KarmarkarKarp(w, 2, false);
  ExactOptions options;
  options.max_nodes = 0;
  const ExactResult r = ExactSearch(w, 2, false, kk, options);
  EXPECT_EQ(r.assignment, kk);
  EXPECT_EQ(r.max_load, 16);
  EXPECT_EQ(r.nodes, 0);
  EXPECT_FALSE(r.proven_optimal);
  EXPECT_FALSE(r.improved);
}

TEST(ExactSearchTest, DeterministicUnderTheNodeBudget) {
  const std::vector<std::int64_t> w = HardWeights();
  ExactOptions options;
  options.max_nodes = 50'000;
  for (const bool equal_size : {false, true}) {
    const ExactResult a = ExactSearch(w, 4, equal_size, {}, options);
    const ExactResult b = ExactSearch(w, 4, equal_size, {}, options);
    EXPECT_EQ(a.assignment, b.assignment);
    EXPECT_EQ(a.max_load, b.max_load);
    EXPECT_EQ(a.nodes, b.nodes);
  }
}

TEST(ExactSearchTest, StopsAtTheInjectedClock) {
  // A fake clock that advances 1 ms per reading: a 10 ms limit stops the search
  // after about 10 readings, and the clock is read once per 4,096 nodes.
  const std::vector<std::int64_t> w = HardWeights();
  std::int64_t readings = 0;
  ExactOptions options;
  options.max_nodes = INT64_MAX;
  options.time_limit = std::chrono::milliseconds(10);
  options.now = [&readings] {
    return std::chrono::nanoseconds(std::chrono::milliseconds(readings++));
  };
  const ExactResult r = ExactSearch(w, 4, false, {}, options);
  EXPECT_FALSE(r.proven_optimal);
  EXPECT_EQ(readings, 11);  // the start, then one every 4,096 nodes
  EXPECT_EQ(r.nodes, 10 * 4096);
  EXPECT_LE(r.max_load, MaxLoadOf(w, 4, GreedyLpt(w, 4, false)));
}

TEST(ExactSearchTest, ClockIsNotReadWithoutATimeLimit) {
  const std::vector<std::int64_t> w = HardWeights();
  ExactOptions options;
  options.max_nodes = 10'000;
  options.now = [] {
    ADD_FAILURE() << "the clock was read";
    return std::chrono::nanoseconds(0);
  };
  EXPECT_EQ(ExactSearch(w, 4, false, {}, options).nodes, 10'000);
}

TEST(ExactSearchTest, BadInputIsRejected) {
  const std::vector<std::int64_t> w = {3, 1, 2, 2};
  const ExactOptions ok;
  EXPECT_THAT(ErrorOf([&] { ExactSearch(w, 0, false, {}, ok); }), HasSubstr("num_parts"));
  EXPECT_THAT(ErrorOf([&] { ExactSearch(w, kMaxParts + 1, false, {}, ok); }),
              HasSubstr("num_parts"));
  EXPECT_THAT(ErrorOf([&] {
                ExactSearch(std::vector<std::int64_t>{1, -1}, 2, false, {}, ok);
              }),
              HasSubstr("weights[1]: must be >= 0"));
  EXPECT_THAT(ErrorOf([&] {
                ExactSearch(std::vector<std::int64_t>{INT64_MAX, 1}, 2, false, {}, ok);
              }),
              HasSubstr("overflows"));
  EXPECT_THAT(ErrorOf([&] {
                ExactSearch(w, 2, false, Assignment{0, 1}, ok);
              }),
              HasSubstr("incumbent: must be empty or have one entry per item (4), got 2"));
  EXPECT_THAT(ErrorOf([&] {
                ExactSearch(w, 2, false, Assignment{0, 1, 2, 0}, ok);
              }),
              HasSubstr("incumbent[2]: must be in [0, 2), got 2"));
  EXPECT_THAT(ErrorOf([&] {
                ExactSearch(w, 2, true, Assignment{0, 0, 0, 1}, ok);
              }),
              HasSubstr("incumbent: part 0 holds 3 items; equal_size needs 2"));
  EXPECT_EQ(ErrorOf([&] { ExactSearch(w, 2, false, Assignment{0, 0, 0, 1}, ok); }), "no error");
  ExactOptions options;
  options.max_nodes = -1;
  EXPECT_THAT(ErrorOf([&] { ExactSearch(w, 2, false, {}, options); }),
              HasSubstr("exact.max_nodes: must be >= 0, got -1"));
  options = ExactOptions{};
  options.time_limit = std::chrono::milliseconds(5);
  EXPECT_THAT(ErrorOf([&] { ExactSearch(w, 2, false, {}, options); }), HasSubstr("exact.now"));
  // The same checks through PartitionItems(), even when the search would not run.
  PartitionOptions partition;
  partition.num_parts = 2;
  partition.exact.max_nodes = -5;
  EXPECT_THAT(ErrorOf([&] { PartitionItems(w, partition); }), HasSubstr("exact.max_nodes"));
  partition.exact = ExactOptions{};
  partition.exact.time_limit = std::chrono::seconds(1);
  EXPECT_THAT(ErrorOf([&] { PartitionItems(w, partition); }), HasSubstr("exact.now"));
}

TEST(ExactSearchTest, PartitionItemsProvesSmallInstancesOptimal) {
  for (std::uint64_t seed = 1; seed <= 300; ++seed) {
    const Instance inst = SmallInstance(seed + 20'000, 10, 3);
    SCOPED_TRACE("seed " + std::to_string(seed));
    PartitionOptions options;
    options.num_parts = inst.k;
    options.equal_size = inst.equal_size;
    const Partition p = PartitionItems(inst.weights, options);
    ExpectValidPartition(inst.weights, inst.k, inst.equal_size, p);
    EXPECT_TRUE(p.proven_optimal);
    EXPECT_EQ(p.max_load, BruteForce(inst.weights, inst.k, inst.equal_size));
    if (HasFatalFailure()) return;
  }
}

TEST(ExactSearchTest, PartitionItemsRunsTheSearchOnlyWhenSmallAndEnabled) {
  // Wide random weights: KK + refinement stays above the bound, so the search runs
  // whenever it is allowed to.
  workload::Rng rng(5);
  std::vector<std::int64_t> w;
  for (std::int64_t i = 0; i < kExactMaxItems + 1; ++i) {
    w.push_back(rng.UniformInt(1, 1'000'000'000'000));
  }
  PartitionOptions options;
  options.num_parts = 3;
  options.exact.max_nodes = 1000;
  const std::vector<std::int64_t> small(w.begin(), w.begin() + kExactMaxItems);
  EXPECT_GT(PartitionItems(small, options).exact_nodes, 0);
  EXPECT_EQ(PartitionItems(w, options).exact_nodes, 0);  // too many items
  options.num_parts = kExactMaxParts + 1;
  EXPECT_EQ(PartitionItems(small, options).exact_nodes, 0);  // too many parts
  options.num_parts = 3;
  options.exact.max_nodes = 0;
  const Partition off = PartitionItems(small, options);
  EXPECT_EQ(off.exact_nodes, 0);
  options.exact.max_nodes = 1000;
  const Partition on = PartitionItems(small, options);
  EXPECT_LE(on.max_load, off.max_load);
}

// A heavy-tailed instance of n in [10, 40] and k in [2, 8]; the answers found from
// two different incumbents must agree whenever both are proven.
void CrossCheck(std::uint64_t seed) {
  workload::Rng rng(seed);
  const std::int64_t n = rng.UniformInt(10, 40);
  const std::int64_t k = rng.UniformInt(2, 8);
  const bool equal_size = rng.UniformInt(0, 1) == 1;
  const std::vector<std::int64_t> w = workload::HeavyTailedLengths(n, seed);
  ExactOptions options;
  options.max_nodes = 200'000;
  const ExactResult from_kk =
      ExactSearch(w, k, equal_size, KarmarkarKarp(w, k, equal_size), options);
  const ExactResult from_lpt = ExactSearch(w, k, equal_size, {}, options);
  for (const ExactResult* r : {&from_kk, &from_lpt}) {
    ExpectValidAssignment(r->assignment, w.size(), k, equal_size);
    EXPECT_EQ(r->max_load, MaxLoadOf(w, k, r->assignment));
    EXPECT_GE(r->max_load, r->lower_bound);
  }
  if (from_kk.proven_optimal && from_lpt.proven_optimal) {
    EXPECT_EQ(from_kk.max_load, from_lpt.max_load);
  }
  // A proven answer is a bound for the other run's answer.
  if (from_kk.proven_optimal) {
    EXPECT_GE(from_lpt.max_load, from_kk.max_load);
  }
  if (from_lpt.proven_optimal) {
    EXPECT_GE(from_kk.max_load, from_lpt.max_load);
  }
}

TEST(ExactSearchTest, MediumInstancesAreConsistent) {
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    CrossCheck(seed);
  }
}

TEST(ExactSearchTest, ThoroughAgreesWithBruteForce) {
  Coverage coverage;
  for (std::uint64_t seed = 1; seed <= 20'000; ++seed) {
    const Instance inst = SmallInstance(seed + 100'000, 11, 4);
    SCOPED_TRACE("seed " + std::to_string(seed));
    CheckAgainstBruteForce(inst, SomeIncumbent(inst, seed), ExactOptions{}, true, coverage);
    if (HasFatalFailure()) return;
  }
  std::printf("%d instances: %d improved, %d searched, %d proven above the bound\n",
              coverage.instances, coverage.improved, coverage.searched,
              coverage.proven_above_bound);
}

TEST(ExactSearchTest, ThoroughMediumInstancesAreConsistent) {
  for (std::uint64_t seed = 1000; seed < 1300; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    CrossCheck(seed);
  }
}

}  // namespace
}  // namespace rlsched::balance
