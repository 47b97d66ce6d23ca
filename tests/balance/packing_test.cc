// The packing pieces of the micro-batch planner on seeded random instances: the repair
// under the cap, first-fit decreasing and the filling of empty bins give, item for item,
// the answers of the plain O(n·m) scans they replaced (transcribed below), and keep every
// invariant: each item in exactly one bin, token and cost totals preserved, the cap kept
// where they report success. And PlanStep() refuses a micro-batch count forced beyond
// kMaxForcedMicroBatches, naming the option, the bound and the estimate, before it
// allocates.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "internal.h"
#include "micro_batch_internal.h"
#include "recipe_partition.h"
#include "rlsched/balance/plan_step.h"
#include "rlsched/common/error.h"
#include "rlsched/workload/workload.h"

namespace rlsched::balance {
namespace {

using internal::RankItems;
using ::testing::HasSubstr;

// --- The scans as they were (balance/src/micro_batch.cc at commit 17302f7). ---

struct Loads {
  std::vector<std::int64_t> tokens, costs, counts;
};

Loads LoadsOf(const RankItems& items, std::int64_t m, const Assignment& a) {
  Loads loads{std::vector<std::int64_t>(static_cast<std::size_t>(m), 0),
              std::vector<std::int64_t>(static_cast<std::size_t>(m), 0),
              std::vector<std::int64_t>(static_cast<std::size_t>(m), 0)};
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto b = static_cast<std::size_t>(a[i]);
    loads.tokens[b] += items.tokens[i];
    loads.costs[b] += items.costs[i];
    ++loads.counts[b];
  }
  return loads;
}

bool ReferenceRepair(const RankItems& items, std::int64_t m, std::int64_t cap, Assignment& a) {
  Loads loads = LoadsOf(items, m, a);
  std::vector<std::int32_t> by_tokens(items.tokens.size());
  std::iota(by_tokens.begin(), by_tokens.end(), 0);
  std::stable_sort(by_tokens.begin(), by_tokens.end(), [&](std::int32_t x, std::int32_t y) {
    return items.tokens[static_cast<std::size_t>(x)] > items.tokens[static_cast<std::size_t>(y)];
  });
  for (const std::int32_t i : by_tokens) {
    const auto from = static_cast<std::size_t>(a[static_cast<std::size_t>(i)]);
    if (loads.tokens[from] <= cap) continue;
    const std::int64_t t = items.tokens[static_cast<std::size_t>(i)];
    std::int64_t best = -1;
    for (std::int64_t b = 0; b < m; ++b) {
      const auto to = static_cast<std::size_t>(b);
      if (to == from || loads.tokens[to] + t > cap) continue;
      if (best < 0 || loads.costs[to] < loads.costs[static_cast<std::size_t>(best)]) best = b;
    }
    if (best < 0) continue;
    const auto to = static_cast<std::size_t>(best);
    a[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(best);
    loads.tokens[from] -= t;
    loads.tokens[to] += t;
    loads.costs[from] -= items.costs[static_cast<std::size_t>(i)];
    loads.costs[to] += items.costs[static_cast<std::size_t>(i)];
  }
  return std::all_of(loads.tokens.begin(), loads.tokens.end(),
                     [cap](std::int64_t x) { return x <= cap; });
}

std::optional<Assignment> ReferenceFirstFit(const RankItems& items, std::int64_t m,
                                            std::int64_t cap) {
  std::vector<std::int64_t> room(static_cast<std::size_t>(m), cap);
  Assignment a(items.tokens.size(), 0);
  std::vector<std::int32_t> order(items.tokens.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::int32_t x, std::int32_t y) {
    return items.tokens[static_cast<std::size_t>(x)] > items.tokens[static_cast<std::size_t>(y)];
  });
  for (const std::int32_t i : order) {
    const std::int64_t t = items.tokens[static_cast<std::size_t>(i)];
    const auto it = std::find_if(room.begin(), room.end(), [t](std::int64_t r) { return r >= t; });
    if (it == room.end()) return std::nullopt;
    *it -= t;
    a[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(it - room.begin());
  }
  return a;
}

void ReferenceFillEmptyBins(const RankItems& items, std::int64_t m, Assignment& a) {
  if (static_cast<std::int64_t>(a.size()) < m) return;
  Loads loads = LoadsOf(items, m, a);
  for (std::int64_t b = 0; b < m; ++b) {
    if (loads.counts[static_cast<std::size_t>(b)] > 0) continue;
    const auto donor = static_cast<std::int32_t>(
        std::max_element(loads.counts.begin(), loads.counts.end()) - loads.counts.begin());
    std::int64_t pick = -1;
    for (std::size_t i = 0; i < a.size(); ++i) {
      if (a[i] != donor) continue;
      if (pick < 0 || items.tokens[i] < items.tokens[static_cast<std::size_t>(pick)]) {
        pick = static_cast<std::int64_t>(i);
      }
    }
    a[static_cast<std::size_t>(pick)] = static_cast<std::int32_t>(b);
    --loads.counts[static_cast<std::size_t>(donor)];
    ++loads.counts[static_cast<std::size_t>(b)];
  }
}

// --- Instances. ---

struct PackingInstance {
  RankItems items;
  std::int64_t m = 1;
  std::int64_t cap = 1;
  Assignment start;  // some assignment into m bins, often over the cap
};

PackingInstance MakePackingInstance(std::uint64_t seed) {
  workload::Rng rng(seed * 2654435761ULL + 1);
  PackingInstance inst;
  const std::int64_t n = rng.UniformInt(0, 400);
  const bool few_values = rng.UniformInt(0, 2) == 0;  // ties everywhere
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t t = few_values ? 16 * rng.UniformInt(1, 4) : rng.UniformInt(1, 5000);
    inst.items.tokens.push_back(t);
    inst.items.costs.push_back(rng.UniformInt(0, 2) == 0 ? t : t + t * t / 1000);
    inst.items.global.push_back(i);
    inst.items.total_tokens += t;
    inst.items.total_cost += inst.items.costs.back();
  }
  const std::int64_t largest =
      n == 0 ? 1 : *std::max_element(inst.items.tokens.begin(), inst.items.tokens.end());
  inst.m = rng.UniformInt(1, 60);
  // From tight (most bins over the cap) to loose.
  const std::int64_t per_bin = inst.items.total_tokens / inst.m + 1;
  inst.cap = std::max(largest, per_bin * rng.UniformInt(80, 160) / 100);
  const std::int64_t skew = rng.UniformInt(0, 2);
  for (std::int64_t i = 0; i < n; ++i) {
    std::int64_t b = rng.UniformInt(0, inst.m - 1);
    if (skew == 1) b = std::min(b, rng.UniformInt(0, inst.m - 1));  // crowded low bins
    if (skew == 2) b = std::min<std::int64_t>(b, 2);                // few bins used, many empty
    inst.start.push_back(static_cast<std::int32_t>(b));
  }
  return inst;
}

void ExpectValid(const PackingInstance& inst, const Assignment& a, bool cap_kept,
                 const std::string& what) {
  ASSERT_EQ(a.size(), inst.items.tokens.size()) << what;
  for (const std::int32_t b : a) {
    ASSERT_GE(b, 0) << what;
    ASSERT_LT(b, inst.m) << what;
  }
  const Loads loads = LoadsOf(inst.items, inst.m, a);
  EXPECT_EQ(std::accumulate(loads.tokens.begin(), loads.tokens.end(), std::int64_t{0}),
            inst.items.total_tokens)
      << what;
  EXPECT_EQ(std::accumulate(loads.costs.begin(), loads.costs.end(), std::int64_t{0}),
            inst.items.total_cost)
      << what;
  EXPECT_EQ(std::accumulate(loads.counts.begin(), loads.counts.end(), std::int64_t{0}),
            static_cast<std::int64_t>(a.size()))
      << what;
  if (cap_kept) {
    for (const std::int64_t t : loads.tokens) EXPECT_LE(t, inst.cap) << what;
  }
}

TEST(PackingTest, RepairIsTheScanItReplaced) {
  int repaired = 0;
  for (std::uint64_t seed = 1; seed <= 1500; ++seed) {
    const PackingInstance inst = MakePackingInstance(seed);
    const std::string what = "seed " + std::to_string(seed);
    Assignment got = inst.start;
    Assignment want = inst.start;
    const bool ok = internal::Repair(inst.items, inst.m, inst.cap, got);
    ASSERT_EQ(ok, ReferenceRepair(inst.items, inst.m, inst.cap, want)) << what;
    ASSERT_EQ(got, want) << what;
    ExpectValid(inst, got, ok, what);
    repaired += ok && got != inst.start ? 1 : 0;
  }
  EXPECT_GT(repaired, 100);  // the instances exercise it
}

// Pack's greedy on tokens is the library's LPT (pop and push per item) made with one
// sift down per item: the same assignment, ties (equal loads) included; under a cap,
// that assignment exactly when it keeps the cap.
TEST(PackingTest, LptOnTokensIsTheGreedy) {
  int differs_from_round_robin = 0;
  int within = 0;
  int over = 0;
  constexpr std::int64_t kNoCap = std::numeric_limits<std::int64_t>::max();
  for (std::uint64_t seed = 1; seed <= 1500; ++seed) {
    const PackingInstance inst = MakePackingInstance(seed);
    const std::string what = "seed " + std::to_string(seed);
    const std::vector<std::int32_t> by_tokens = internal::HeaviestFirst(inst.items.tokens);
    const Assignment got = *internal::LptOnTokens(inst.items, inst.m, by_tokens, kNoCap);
    ASSERT_EQ(got, internal::GreedyLptSorted(inst.items.tokens, by_tokens, inst.m, PartSizes::kAny))
        << what;
    std::vector<std::int64_t> loads(static_cast<std::size_t>(inst.m), 0);
    for (std::size_t i = 0; i < got.size(); ++i) {
      loads[static_cast<std::size_t>(got[i])] += inst.items.tokens[i];
    }
    const bool keeps = *std::max_element(loads.begin(), loads.end()) <= inst.cap;
    const auto capped = internal::LptOnTokens(inst.items, inst.m, by_tokens, inst.cap);
    ASSERT_EQ(capped.has_value(), keeps) << what;
    if (capped) {
      ASSERT_EQ(*capped, got) << what;
    }
    ++(keeps ? within : over);
    for (std::size_t s = 0; s < by_tokens.size(); ++s) {
      if (got[static_cast<std::size_t>(by_tokens[s])] !=
          static_cast<std::int32_t>(static_cast<std::int64_t>(s) % inst.m)) {
        ++differs_from_round_robin;  // the heap's order mattered
        break;
      }
    }
  }
  EXPECT_GT(differs_from_round_robin, 100);
  EXPECT_GT(within, 100);
  EXPECT_GT(over, 100);
}

// The fewest bins of `cap` that hold `tokens`, by exhaustive search (few items).
std::int64_t FewestBins(const std::vector<std::int64_t>& tokens, std::int64_t cap) {
  std::vector<std::int64_t> loads;
  std::int64_t best = static_cast<std::int64_t>(tokens.size());
  std::function<void(std::size_t)> place = [&](std::size_t i) {
    if (static_cast<std::int64_t>(loads.size()) >= best) return;
    if (i == tokens.size()) {
      best = static_cast<std::int64_t>(loads.size());
      return;
    }
    for (std::size_t b = 0; b < loads.size(); ++b) {  // (place() may grow `loads`)
      if (loads[b] + tokens[i] > cap) continue;
      loads[b] += tokens[i];
      place(i + 1);
      loads[b] -= tokens[i];
    }
    loads.push_back(tokens[i]);
    place(i + 1);
    loads.pop_back();
  };
  place(0);
  return best;
}

std::int64_t BoundOf(const std::vector<std::int64_t>& tokens, std::int64_t cap) {
  return internal::BinsLowerBound(tokens, internal::HeaviestFirst(tokens), cap);
}

// Martello and Toth's L2: above the tokens' bound where big items leave room no small
// item fills, and never above a packing's count (the fewest, found exhaustively on small
// instances; first-fit decreasing's on larger ones).
TEST(PackingTest, BinsLowerBoundIsABoundAndBeatsTheTokens) {
  EXPECT_EQ(BoundOf({}, 10), 0);
  EXPECT_EQ(BoundOf({6, 6, 6}, 10), 3);        // tokens alone: 2
  EXPECT_EQ(BoundOf({6, 6, 5, 5}, 10), 3);     // 6 + 5 > 10: tokens alone 3 too
  EXPECT_EQ(BoundOf({7, 7, 4, 4, 4}, 10), 4);  // the 4s fit beside no 7: 2 + ceil(12 / 10)
  EXPECT_EQ(BoundOf({12, 3}, 10), 2);          // above the cap: a bin of its own
  int above_tokens = 0;
  for (std::uint64_t seed = 1; seed <= 3000; ++seed) {
    workload::Rng rng(seed * 7919 + 3);
    const std::int64_t cap = rng.UniformInt(10, 100);
    const bool small = seed % 3 != 0;
    const std::int64_t n = small ? rng.UniformInt(1, 9) : rng.UniformInt(10, 300);
    std::vector<std::int64_t> tokens;
    for (std::int64_t i = 0; i < n; ++i) tokens.push_back(rng.UniformInt(0, cap));
    const std::int64_t bound = BoundOf(tokens, cap);
    const std::int64_t total = std::accumulate(tokens.begin(), tokens.end(), std::int64_t{0});
    ASSERT_GE(bound, (total + cap - 1) / cap) << seed;
    above_tokens += bound > (total + cap - 1) / cap ? 1 : 0;
    if (small) {
      ASSERT_LE(bound, FewestBins(tokens, cap)) << seed;
      continue;
    }
    internal::RankItems items;
    items.tokens = tokens;
    items.costs = tokens;
    const auto ffd = internal::FirstFitDecreasing(items, n, cap);
    ASSERT_TRUE(ffd.has_value());
    ASSERT_LE(bound, *std::max_element(ffd->begin(), ffd->end()) + 1) << seed;
  }
  EXPECT_GT(above_tokens, 300);
}

TEST(PackingTest, FirstFitDecreasingIsTheScanItReplaced) {
  int packed = 0;
  for (std::uint64_t seed = 1; seed <= 1500; ++seed) {
    const PackingInstance inst = MakePackingInstance(seed);
    const std::string what = "seed " + std::to_string(seed);
    const auto got = internal::FirstFitDecreasing(inst.items, inst.m, inst.cap);
    const auto want = ReferenceFirstFit(inst.items, inst.m, inst.cap);
    ASSERT_EQ(got.has_value(), want.has_value()) << what;
    if (!got) continue;
    ASSERT_EQ(*got, *want) << what;
    ExpectValid(inst, *got, true, what);
    ++packed;
  }
  EXPECT_GT(packed, 100);
}

TEST(PackingTest, FillEmptyBinsIsTheScanItReplaced) {
  int filled = 0;
  for (std::uint64_t seed = 1; seed <= 1500; ++seed) {
    const PackingInstance inst = MakePackingInstance(seed);
    const std::string what = "seed " + std::to_string(seed);
    Assignment got = inst.start;
    Assignment want = inst.start;
    internal::FillEmptyBins(inst.items, inst.m, got);
    ReferenceFillEmptyBins(inst.items, inst.m, want);
    ASSERT_EQ(got, want) << what;
    ExpectValid(inst, got, false, what);
    if (static_cast<std::int64_t>(got.size()) >= inst.m) {
      const Loads loads = LoadsOf(inst.items, inst.m, got);
      for (const std::int64_t c : loads.counts) EXPECT_GE(c, 1) << what;
    }
    filled += got != inst.start ? 1 : 0;
  }
  EXPECT_GT(filled, 100);
}

// Pack() on the same instances: under the cap whenever it answers, every item once.
TEST(PackingTest, PackKeepsTheInvariants) {
  for (std::uint64_t seed = 1; seed <= 600; ++seed) {
    const PackingInstance inst = MakePackingInstance(seed);
    const auto packing =
        internal::Pack(inst.items, inst.m, inst.cap, RefineOptions{}, std::nullopt);
    if (!packing) continue;
    ExpectValid(inst, *packing, true, "seed " + std::to_string(seed));
  }
}

// PackGoal::kWithinCap packs exactly the instances the balanced Pack() packs (the
// same constructions, stopped at the first that fits), under the cap, every item once,
// no bin empty when there are at least as many items as bins; with `extra` too.
TEST(PackingTest, PackWithinCapPacksWhatTheBalancedPackPacks) {
  int packed = 0;
  int differs = 0;
  for (std::uint64_t seed = 1; seed <= 600; ++seed) {
    const PackingInstance inst = MakePackingInstance(seed);
    const std::string what = "seed " + std::to_string(seed);
    const auto balanced =
        internal::Pack(inst.items, inst.m, inst.cap, RefineOptions{}, std::nullopt);
    const auto within = internal::Pack(inst.items, inst.m, inst.cap, RefineOptions{}, std::nullopt,
                                       internal::PackGoal::kWithinCap);
    ASSERT_EQ(within.has_value(), balanced.has_value()) << what;
    if (!within) continue;
    ExpectValid(inst, *within, true, what);
    if (static_cast<std::int64_t>(within->size()) >= inst.m) {
      for (const std::int64_t c : LoadsOf(inst.items, inst.m, *within).counts) {
        EXPECT_GE(c, 1) << what;
      }
    }
    // A valid packing handed in as `extra` is kept (empty bins filled).
    const auto again = internal::Pack(inst.items, inst.m, inst.cap, RefineOptions{}, *balanced,
                                      internal::PackGoal::kWithinCap);
    ASSERT_TRUE(again.has_value()) << what;
    ExpectValid(inst, *again, true, what);
    ++packed;
    differs += *within != *balanced ? 1 : 0;
  }
  EXPECT_GT(packed, 100);
  EXPECT_GT(differs, 10);  // the goals do differ
}

// FindFeasible() against the upward search it replaced (the smallest count from
// `from`, in steps of the multiple, that Pack() packs): the same count, unless Pack()
// packs none of the counts between that one and FindFeasible()'s (the search comes down
// from first-fit's count while counts pack); its packing is under the cap with every
// item once; both goals, multiples 1 and 2.
TEST(PackingTest, FindFeasibleIsTheSmallestCountWhereCountsPackDownward) {
  int searched = 0;
  int same = 0;
  for (std::uint64_t seed = 1; seed <= 1500; ++seed) {
    PackingInstance inst = MakePackingInstance(seed);
    if (inst.items.tokens.empty()) continue;
    MicroBatchOptions options;
    options.max_tokens_per_micro_batch = inst.cap;
    options.micro_batches_multiple_of = seed % 3 == 0 ? 2 : 1;
    options.pipeline_stages = seed % 2 == 0 ? 1 : 2;  // kWithinCap, kBalanced
    const std::int64_t q = options.micro_batches_multiple_of;
    const std::int64_t from = internal::SmallestCount(inst.items.total_tokens, options);
    auto packs = [&](std::int64_t m) {
      return internal::Pack(inst.items, m, inst.cap, options.refine, std::nullopt,
                            internal::PackGoalFor(options))
          .has_value();
    };
    std::int64_t want = from;
    while (!packs(want)) want += q;
    const std::string what = "seed " + std::to_string(seed);
    const internal::RankSearch got = internal::FindFeasible(inst.items, from, options);
    ASSERT_TRUE(got.packing.has_value()) << what;
    ASSERT_GE(got.feasible_count, want) << what;
    ASSERT_EQ((got.feasible_count - from) % q, 0) << what;
    inst.m = got.feasible_count;
    ExpectValid(inst, *got.packing, true, what);
    if (got.feasible_count > want) {
      bool gap = false;  // a count between them that nothing packs
      for (std::int64_t m = want + q; m < got.feasible_count; m += q) gap = gap || !packs(m);
      ASSERT_TRUE(gap) << what << ": " << want << " packs, FindFeasible gave "
                       << got.feasible_count;
    }
    ++searched;
    same += got.feasible_count == want ? 1 : 0;
  }
  EXPECT_GT(searched, 1000);
  EXPECT_GT(same, searched * 99 / 100);
}

// With one pipeline stage a rank is packed for the cap alone: the plan keeps every
// invariant (each sequence once, the cap, no empty micro-batch, the bound below the
// time), and its time is the ranks' cost plus m overheads, as with any packing at that
// count.
TEST(PackingTest, LargeRanksAtOnePipelineStageArePackedForTheCap) {
  workload::Rng rng(7);
  std::vector<std::int64_t> lengths(3000);
  for (std::int64_t& length : lengths) {
    length =
        std::min<std::int64_t>(8192, static_cast<std::int64_t>(std::exp(6.0 + rng.Normal())) + 1);
  }
  StepOptions options;
  options.num_ranks = 2;
  options.micro_batch.max_tokens_per_micro_batch = 8192;
  options.micro_batch.overhead = 100;
  const PlannedStep step = PlanStep(lengths, {}, options);
  const StepPlan& plan = step.plan;
  EXPECT_EQ(plan.cap_violations, 0);
  EXPECT_EQ(plan.empty_micro_batches, 0);
  EXPECT_LE(plan.lower_bound, plan.predicted_step_time);
  std::vector<int> seen(lengths.size(), 0);
  std::int64_t slowest = 0;
  for (const RankPlan& rank : plan.ranks) {
    ASSERT_EQ(static_cast<std::int64_t>(rank.micro_batches.size()), plan.num_micro_batches);
    std::int64_t cost = 0;
    for (const MicroBatch& b : rank.micro_batches) {
      EXPECT_LE(b.tokens, 8192);
      EXPECT_FALSE(b.indices.empty());
      cost += b.cost;
      for (const std::int64_t i : b.indices) ++seen[static_cast<std::size_t>(i)];
    }
    EXPECT_EQ(rank.time, cost + plan.num_micro_batches * 100);
    slowest = std::max(slowest, rank.time);
  }
  EXPECT_EQ(plan.predicted_step_time, slowest);
  EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));
  // The plan that kept every candidate: the same (pruning changes nothing).
  const PlannedStep all = internal::PlanStep(lengths, {}, options, internal::Pruning::kNone);
  EXPECT_EQ(all.plan.predicted_step_time, plan.predicted_step_time);
  EXPECT_EQ(all.plan.num_micro_batches, plan.num_micro_batches);
}

void ExpectSameItems(const RankItems& got, const RankItems& want, const std::string& what) {
  EXPECT_EQ(got.tokens, want.tokens) << what;
  EXPECT_EQ(got.costs, want.costs) << what;
  EXPECT_EQ(got.global, want.global) << what;
  EXPECT_EQ(got.total_tokens, want.total_tokens) << what;
  EXPECT_EQ(got.total_unpadded, want.total_unpadded) << what;
  EXPECT_EQ(got.total_cost, want.total_cost) << what;
}

// GatherRanks() gathers what Gather() gathers rank by rank: ascending ranks (one pass
// over the batch), ranks out of order, an index in two ranks, sequences in no rank.
TEST(PackingTest, GatherRanksIsGatherOfEachRank) {
  workload::Rng rng(11);
  std::vector<std::int64_t> lengths(500);
  for (std::int64_t& length : lengths) length = rng.UniformInt(1, 3000);
  MicroBatchOptions mb;
  mb.max_tokens_per_micro_batch = 4096;
  mb.pad_to_multiple_of = 64;
  const internal::Padded padded = internal::Pad(lengths, mb);
  for (int shape = 0; shape < 4; ++shape) {
    std::vector<std::vector<std::int64_t>> ranks(7);
    for (std::int64_t i = 0; i < static_cast<std::int64_t>(lengths.size()); ++i) {
      if (shape == 3 && i % 5 == 0) continue;  // in no rank
      ranks[static_cast<std::size_t>(rng.UniformInt(0, 6))].push_back(i);
    }
    if (shape == 1) std::reverse(ranks[2].begin(), ranks[2].end());  // out of order
    if (shape == 2) ranks[4].push_back(ranks[0].front());            // in two ranks
    const std::vector<RankItems> got = internal::GatherRanks(padded, ranks);
    ASSERT_EQ(got.size(), ranks.size());
    for (std::size_t r = 0; r < ranks.size(); ++r) {
      ExpectSameItems(got[r], internal::Gather(padded, ranks[r]),
                      "shape " + std::to_string(shape) + " rank " + std::to_string(r));
    }
  }
}

// PlanStep()'s baseline has PlanBaseline()'s figures (every field but the ranks, which
// it leaves empty), and the recipe run on PlanStep()'s shared sort, with its
// micro-batches, is PlanBaseline(), micro-batch for micro-batch.
TEST(PackingTest, ThePlannedStepsBaselineIsPlanBaseline) {
  workload::Rng rng(5);
  std::vector<std::int64_t> lengths(20000);
  for (std::int64_t& length : lengths) {
    length =
        std::min<std::int64_t>(16384, static_cast<std::int64_t>(std::exp(6.5 + rng.Normal())) + 1);
  }
  StepOptions options;
  options.num_ranks = 8;
  options.micro_batch.max_tokens_per_micro_batch = 16384;
  options.micro_batch.pipeline_stages = 2;
  const PlannedStep step = PlanStep(lengths, {}, options);
  const StepPlan baseline = PlanBaseline(lengths, options);
  EXPECT_EQ(step.baseline.predicted_step_time, baseline.predicted_step_time);
  EXPECT_EQ(step.baseline.num_micro_batches, baseline.num_micro_batches);
  EXPECT_EQ(step.baseline.cap_violations, baseline.cap_violations);
  EXPECT_EQ(step.baseline.empty_micro_batches, baseline.empty_micro_batches);
  EXPECT_EQ(step.baseline.empty_ranks, baseline.empty_ranks);
  EXPECT_EQ(step.baseline.lower_bound, baseline.lower_bound);
  EXPECT_EQ(step.baseline.sequences, baseline.sequences);
  EXPECT_EQ(step.baseline.tokens, baseline.tokens);
  EXPECT_EQ(step.baseline.unpadded_tokens, baseline.unpadded_tokens);
  EXPECT_EQ(step.baseline.overhead, baseline.overhead);
  EXPECT_TRUE(step.baseline.ranks.empty());

  StepOptions resolved = options;
  resolved.micro_batch = internal::Resolved(options.micro_batch);
  const internal::Padded padded = internal::Pad(lengths, resolved.micro_batch);
  std::vector<std::int64_t> sorted;
  std::vector<std::int32_t> order = internal::HeaviestFirst(padded.costs, &sorted);
  const std::vector<std::int32_t> ascending =
      internal::RecipeAscendingFrom(std::move(order), sorted);
  const StepPlan shared = internal::RecipePlan(padded, resolved, ascending, sorted);
  EXPECT_EQ(shared.predicted_step_time, baseline.predicted_step_time);
  ASSERT_EQ(shared.ranks.size(), baseline.ranks.size());
  for (std::size_t r = 0; r < baseline.ranks.size(); ++r) {
    const auto& got = shared.ranks[r].micro_batches;
    const auto& want = baseline.ranks[r].micro_batches;
    ASSERT_EQ(got.size(), want.size()) << "rank " << r;
    for (std::size_t b = 0; b < want.size(); ++b) {
      EXPECT_EQ(got[b].indices, want[b].indices) << "rank " << r << " micro-batch " << b;
    }
  }
}

StepOptions ForcedStep(std::int64_t ranks, std::int64_t min, std::int64_t multiple) {
  StepOptions options;
  options.num_ranks = ranks;
  options.micro_batch.max_tokens_per_micro_batch = 4096;
  options.micro_batch.min_micro_batches = min;
  options.micro_batch.micro_batches_multiple_of = multiple;
  return options;
}

FieldError RefusalOf(const StepOptions& options) {
  const std::vector<std::int64_t> lengths = {100, 200, 300};
  try {
    PlanStep(lengths, {}, options);
  } catch (const FieldError& e) {
    return e;
  }
  ADD_FAILURE() << "no FieldError";
  return FieldError("", "");
}

TEST(PackingTest, AForcedCountAboveTheLimitIsRefusedBeforeAllocating) {
  const auto start = std::chrono::steady_clock::now();
  // The request: 3 sequences, 8 ranks, a multiple of 2^20.
  FieldError e = RefusalOf(ForcedStep(8, 1, std::int64_t{1} << 20));
  EXPECT_EQ(e.field(), "micro_batches_multiple_of");
  EXPECT_THAT(e.bound(), HasSubstr("<= 1048576"));
  EXPECT_THAT(e.value(), HasSubstr("1048576"));
  EXPECT_THAT(e.value(), HasSubstr("8 × 1048576 = 8388608 micro-batches"));
  EXPECT_THAT(std::string(e.what()), HasSubstr("micro_batches_multiple_of: must be"));
  // The minimum drives it.
  e = RefusalOf(ForcedStep(64, 70'000, 1));
  EXPECT_EQ(e.field(), "min_micro_batches");
  EXPECT_THAT(e.value(), HasSubstr("64 × 70000 = 4480000"));
  // Both: the minimum rounded up to the multiple (3 × 2^18 → 2^20 per rank).
  e = RefusalOf(ForcedStep(8, 3 * (1 << 18), 1 << 20));
  EXPECT_EQ(e.field(), "micro_batches_multiple_of");
  e = RefusalOf(ForcedStep(8, 1 << 20, 1 << 19));
  EXPECT_EQ(e.field(), "min_micro_batches");
  EXPECT_THAT(e.value(), HasSubstr("8 × 1048576 = 8388608"));
  // Just above the limit: 4,097 per rank on 256 ranks, 1,025 on 1,024, 2^20 + 1 on one.
  e = RefusalOf(ForcedStep(256, 4097, 1));
  EXPECT_EQ(e.field(), "min_micro_batches");
  EXPECT_THAT(e.value(), HasSubstr("256 × 4097 = 1048832"));
  e = RefusalOf(ForcedStep(1024, 1, 1025));
  EXPECT_EQ(e.field(), "micro_batches_multiple_of");
  EXPECT_THAT(e.value(), HasSubstr("1024 × 1025 = 1049600"));
  e = RefusalOf(ForcedStep(1, (1 << 20) + 1, 1));
  EXPECT_EQ(e.field(), "min_micro_batches");
  // PlanBaseline checks the same options.
  EXPECT_THROW(PlanBaseline(std::vector<std::int64_t>{1, 2}, ForcedStep(8, 1, 1 << 20)),
               FieldError);
  // Refused at once: nothing of the size of the plan was built.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
}

TEST(PackingTest, AForcedCountAtTheLimitIsPlannedWithEmptyMicroBatchesCounted) {
  // 2^20 micro-batches for 3 sequences on one rank: allowed (the limit), linear in the
  // count, the empty ones counted.
  const std::vector<std::int64_t> lengths = {100, 200, 300};
  StepOptions options = ForcedStep(1, 1, 1 << 20);
  const PlannedStep step = PlanStep(lengths, {}, options);
  EXPECT_EQ(step.plan.num_micro_batches, 1 << 20);
  EXPECT_EQ(step.plan.empty_micro_batches, (1 << 20) - 3);
  EXPECT_EQ(step.plan.sequences, 3);
  EXPECT_EQ(step.plan.cap_violations, 0);
}

}  // namespace
}  // namespace rlsched::balance
