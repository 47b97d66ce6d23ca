// The pieces PlanStep() uses to sort the batch once for the balancer and the common
// recipe (balance/src/internal.h, recipe_partition.h, micro_batch_internal.h): each is
// checked against the public function it stands for, on random seeded instances.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "internal.h"
#include "micro_batch_internal.h"
#include "recipe_partition.h"
#include "rlsched/balance/balance.h"
#include "rlsched/balance/plan_step.h"
#include "rlsched/common/error.h"
#include "rlsched/workload/workload.h"

namespace rlsched::balance {
namespace {

// n values: heavy-tailed lengths (many ties), or uniform in [0, hi] (hi up to 2^40, so
// both radix widths and the comparison sort of small inputs are met).
std::vector<std::int64_t> RandomValues(workload::Rng& rng, std::size_t n) {
  std::vector<std::int64_t> values(n);
  const std::int64_t shape = rng.UniformInt(0, 3);
  const std::int64_t hi = std::int64_t{1} << rng.UniformInt(1, 40);
  for (std::int64_t& v : values) {
    if (shape == 0) {
      v = std::min<std::int64_t>(32768, static_cast<std::int64_t>(std::exp(6.0 + rng.Normal())));
    } else if (shape == 1) {
      v = rng.UniformInt(0, 3);  // mostly ties
    } else {
      v = rng.UniformInt(0, hi);
    }
  }
  return values;
}

std::size_t RandomSize(workload::Rng& rng) {
  switch (rng.UniformInt(0, 3)) {
    case 0:
      return static_cast<std::size_t>(rng.UniformInt(0, 8));
    case 1:
      return static_cast<std::size_t>(rng.UniformInt(9, 80));
    case 2:
      return static_cast<std::size_t>(rng.UniformInt(81, 600));
    default:
      return static_cast<std::size_t>(rng.UniformInt(601, 6000));
  }
}

// Every item in exactly one part, the loads the sums of the parts' weights, and with
// equal sizes floor(n/k) or ceil(n/k) items a part.
void ExpectSortedPartitionValid(std::span<const std::int64_t> weights, const Partition& p,
                                bool equal_size, const std::string& where) {
  const std::size_t n = weights.size();
  std::vector<int> seen(n, 0);
  std::int64_t total = 0;
  for (std::int64_t part = 0; part < p.num_parts(); ++part) {
    std::int64_t load = 0;
    for (const std::int64_t i : p.part(part)) {
      ASSERT_GE(i, 0) << where;
      ASSERT_LT(i, static_cast<std::int64_t>(n)) << where;
      ++seen[static_cast<std::size_t>(i)];
      load += weights[static_cast<std::size_t>(i)];
    }
    EXPECT_EQ(load, p.loads[static_cast<std::size_t>(part)]) << where;
    total += load;
    if (equal_size) {
      const auto size = static_cast<std::int64_t>(p.part(part).size());
      const auto floor = static_cast<std::int64_t>(n) / p.num_parts();
      EXPECT_TRUE(size == floor || size == floor + 1) << where << " part " << part;
    }
  }
  EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; })) << where;
  EXPECT_EQ(total, std::accumulate(weights.begin(), weights.end(), std::int64_t{0})) << where;
}

void ExpectSamePartition(const Partition& got, const Partition& want, const std::string& where) {
  EXPECT_EQ(got.offsets, want.offsets) << where;
  EXPECT_EQ(got.indices, want.indices) << where;
  EXPECT_EQ(got.loads, want.loads) << where;
  EXPECT_EQ(got.lower_bound, want.lower_bound) << where;
  EXPECT_EQ(got.max_load, want.max_load) << where;
  EXPECT_EQ(got.min_load, want.min_load) << where;
  EXPECT_EQ(got.refine_steps, want.refine_steps) << where;
  EXPECT_EQ(got.exact_nodes, want.exact_nodes) << where;
  EXPECT_EQ(got.proven_optimal, want.proven_optimal) << where;
}

// RecipeAscendingFrom() of HeaviestFirst()'s order is RecipeAscending(): the same order
// and the same sorted values.
TEST(SharedSortTest, RecipeAscendingFromIsRecipeAscending) {
  workload::Rng rng(191);
  for (int trial = 0; trial < 300; ++trial) {
    const std::vector<std::int64_t> values = RandomValues(rng, RandomSize(rng));
    std::vector<std::int64_t> want_sorted;
    const std::vector<std::int32_t> want = internal::RecipeAscending(values, &want_sorted);
    std::vector<std::int64_t> sorted;
    std::vector<std::int32_t> order = internal::HeaviestFirst(values, &sorted);
    const std::vector<std::int32_t> got = internal::RecipeAscendingFrom(std::move(order), sorted);
    ASSERT_EQ(got, want) << "trial " << trial;
    ASSERT_EQ(sorted, want_sorted) << "trial " << trial;
    // Ascending by (value, index), each item once.
    for (std::size_t p = 1; p < got.size(); ++p) {
      const auto a = static_cast<std::size_t>(got[p - 1]);
      const auto b = static_cast<std::size_t>(got[p]);
      ASSERT_TRUE(values[a] < values[b] || (values[a] == values[b] && a < b)) << "trial " << trial;
    }
  }
}

// PartitionSorted() (and AssignSorted(), which it wraps) on HeaviestFirst()'s order is
// PartitionItems(), field for field, with both algorithms and both size modes (the
// exact search included on small instances).
TEST(SharedSortTest, PartitionSortedIsPartitionItems) {
  workload::Rng rng(192);
  for (int trial = 0; trial < 400; ++trial) {
    const std::vector<std::int64_t> weights = RandomValues(rng, RandomSize(rng));
    PartitionOptions options;
    options.num_parts = rng.UniformInt(1, 17);
    options.equal_size = rng.UniformInt(0, 1) == 1;
    options.algorithm = rng.UniformInt(0, 3) == 0 ? Algorithm::kGreedy : Algorithm::kKarmarkarKarp;
    const std::string where = "trial " + std::to_string(trial);
    const Partition want = PartitionItems(weights, options);
    std::vector<std::int64_t> sorted;
    const std::vector<std::int32_t> order = internal::HeaviestFirst(weights, &sorted);
    const Partition got = internal::PartitionSorted(weights, order, sorted, options);
    ExpectSamePartition(got, want, where);
    ExpectSortedPartitionValid(weights, got, options.equal_size, where);
    const internal::SortedAssignment assigned =
        internal::AssignSorted(weights, order, sorted, options);
    for (std::int64_t part = 0; part < want.num_parts(); ++part) {
      for (const std::int64_t i : want.part(part)) {
        ASSERT_EQ(assigned.assignment[static_cast<std::size_t>(i)], part) << where;
      }
    }
  }
}

// BalancedPartition() and BalancedAssignment() of Pad()'s tokens and costs are
// Balance()'s partition of the padded lengths, with and without whole groups, with the
// tokens' and the attention cost model.
TEST(SharedSortTest, BalancedPartitionIsBalance) {
  workload::Rng rng(193);
  for (int trial = 0; trial < 300; ++trial) {
    const std::size_t n = RandomSize(rng);
    std::vector<std::int64_t> lengths(n);
    for (std::int64_t& l : lengths) {
      l = std::min<std::int64_t>(30000, static_cast<std::int64_t>(std::exp(6.0 + rng.Normal())));
    }
    std::vector<std::int64_t> groups(n);
    const std::int64_t group_size = rng.UniformInt(1, 8);
    for (std::size_t i = 0; i < n; ++i) groups[i] = static_cast<std::int64_t>(i) / group_size;
    MicroBatchOptions mb;
    mb.max_tokens_per_micro_batch = 32768;
    mb.pad_to_multiple_of = rng.UniformInt(0, 1) == 0 ? 1 : 64;
    if (rng.UniformInt(0, 1) == 1) mb.cost = CostModel::Attention(1.0, 1e-4, 3.0);
    const internal::Padded padded = internal::Pad(lengths, internal::Resolved(mb));
    BalanceOptions options;
    options.partition.num_parts = rng.UniformInt(1, 12);
    options.partition.equal_size = rng.UniformInt(0, 1) == 1;
    options.cost = mb.cost;
    options.keep_groups = rng.UniformInt(0, 2) == 0;
    const std::string where = "trial " + std::to_string(trial);
    const Partition want = Balance(padded.tokens, groups, options).partition;
    std::vector<std::int64_t> sorted;
    const std::vector<std::int32_t> order = internal::HeaviestFirst(padded.costs, &sorted);
    const Partition got =
        options.keep_groups
            ? internal::BalancedPartition(padded.tokens, padded.costs, groups, options, {}, {})
            : internal::BalancedPartition(padded.tokens, padded.costs, groups, options, order,
                                          sorted);
    ExpectSamePartition(got, want, where);
    ExpectSortedPartitionValid(padded.costs, got,
                               options.partition.equal_size && !options.keep_groups, where);
    if (!options.keep_groups) {
      const Assignment assignment =
          internal::BalancedAssignment(padded.tokens, padded.costs, groups, options, order, sorted);
      ASSERT_EQ(assignment.size(), n) << where;
      for (std::int64_t part = 0; part < want.num_parts(); ++part) {
        for (const std::int64_t i : want.part(part)) {
          ASSERT_EQ(assignment[static_cast<std::size_t>(i)], part) << where;
        }
      }
    }
  }
}

// The errors Balance() gives for bad groups and options, BalancedPartition() and
// BalancedAssignment() give too (the same field and message).
TEST(SharedSortTest, BalancedPartitionRefusesAsBalance) {
  const std::vector<std::int64_t> lengths = {5, 7, 9};
  const std::vector<std::int64_t> costs = lengths;
  std::vector<std::int64_t> sorted;
  const std::vector<std::int32_t> order = internal::HeaviestFirst(costs, &sorted);
  auto message = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const FieldError& e) {
      return e.what();
    }
    return "no error";
  };
  struct Case {
    std::vector<std::int64_t> groups;
    BalanceOptions options;
  };
  std::vector<Case> cases;
  cases.push_back({{0, 1}, {}});      // groups of the wrong size
  cases.push_back({{0, -1, 2}, {}});  // a negative group
  cases.push_back({{}, {}});          // keep_groups without groups
  cases.back().options.keep_groups = true;
  cases.push_back({{}, {}});  // num_parts out of range
  cases.back().options.partition.num_parts = 0;
  cases.push_back({{}, {}});  // a bad exact budget
  cases.back().options.partition.exact.max_nodes = -1;
  for (std::size_t c = 0; c < cases.size(); ++c) {
    const Case& bad = cases[c];
    const std::string want = message([&] { Balance(lengths, bad.groups, bad.options); });
    ASSERT_NE(want, "no error") << "case " << c;
    EXPECT_EQ(message([&] {
                internal::BalancedPartition(lengths, costs, bad.groups, bad.options, order, sorted);
              }),
              want)
        << "case " << c;
    if (!bad.options.keep_groups) {
      EXPECT_EQ(message([&] {
                  internal::BalancedAssignment(lengths, costs, bad.groups, bad.options, order,
                                               sorted);
                }),
                want)
          << "case " << c;
    }
  }
}

// Pad() without padding and with the tokens' cost model (its fast case): tokens and
// costs are the lengths, and a length above the cap or 2^31 is refused naming it, as
// with padding.
TEST(SharedSortTest, PadWithoutPaddingKeepsTheLengths) {
  workload::Rng rng(194);
  MicroBatchOptions mb;
  mb.max_tokens_per_micro_batch = 4096;
  const MicroBatchOptions resolved = internal::Resolved(mb);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<std::int64_t> lengths(RandomSize(rng));
    for (std::int64_t& l : lengths) l = rng.UniformInt(0, 4096);
    internal::Padded padded = internal::Pad(lengths, resolved);
    const std::vector<std::int64_t> tokens(padded.tokens.begin(), padded.tokens.end());
    const std::vector<std::int64_t> costs(padded.costs.begin(), padded.costs.end());
    EXPECT_EQ(tokens, lengths);
    EXPECT_EQ(costs, lengths);
    EXPECT_EQ(padded.lengths.size(), lengths.size());
    // The lengths themselves, not a copy.
    EXPECT_EQ(padded.tokens.data(), lengths.data());
    EXPECT_EQ(padded.costs.data(), lengths.data());
    const std::int64_t sum = std::accumulate(lengths.begin(), lengths.end(), std::int64_t{0});
    EXPECT_EQ(padded.total_unpadded, sum);
    EXPECT_EQ(padded.total_tokens, sum);
    EXPECT_EQ(padded.total_cost, sum);
    EXPECT_EQ(padded.max_cost,
              lengths.empty() ? 0 : *std::max_element(lengths.begin(), lengths.end()));
    // A move keeps what the views see.
    const internal::Padded moved = std::move(padded);
    EXPECT_EQ(moved.tokens.data(), lengths.data());
  }
  auto message = [&](const std::vector<std::int64_t>& lengths, const MicroBatchOptions& o) {
    try {
      internal::Pad(lengths, o);
    } catch (const FieldError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  // The same refusals with padding to 1 and to 2 (even lengths pad to themselves).
  MicroBatchOptions padded_by_two = resolved;
  padded_by_two.pad_to_multiple_of = 2;
  const std::vector<std::int64_t> over_cap = {10, 4098, 5000};
  EXPECT_EQ(message(over_cap, resolved), message(over_cap, padded_by_two));
  EXPECT_NE(message(over_cap, resolved).find("lengths[1]"), std::string::npos);
  EXPECT_NE(message(over_cap, resolved).find("4098"), std::string::npos);
  MicroBatchOptions huge_cap = resolved;
  huge_cap.max_tokens_per_micro_batch = std::int64_t{1} << 40;
  MicroBatchOptions huge_cap_by_two = huge_cap;
  huge_cap_by_two.pad_to_multiple_of = 2;
  const std::vector<std::int64_t> over_max = {4, (std::int64_t{1} << 31) + 2};
  EXPECT_EQ(message(over_max, huge_cap), message(over_max, huge_cap_by_two));
  EXPECT_NE(message(over_max, huge_cap).find("lengths[1]"), std::string::npos);
  const std::vector<std::int64_t> negative = {4, -2};
  EXPECT_EQ(message(negative, resolved), message(negative, padded_by_two));
  EXPECT_NE(message(negative, resolved), "no error");
}

// Pad() with padding or the attention cost model: tokens and costs of their own (the
// lengths rounded up to the multiple, their costs under the model), and the totals
// and the largest cost the sums and the maximum of those, on random seeded batches.
TEST(SharedSortTest, PadWithPaddingTotalsItsTokensAndCosts) {
  workload::Rng rng(195);
  for (int trial = 0; trial < 100; ++trial) {
    MicroBatchOptions mb;
    mb.max_tokens_per_micro_batch = 8192;
    mb.pad_to_multiple_of = rng.UniformInt(1, 3) == 1 ? 1 : rng.UniformInt(2, 128);
    if (mb.pad_to_multiple_of == 1 || rng.UniformInt(0, 1) == 1) {
      mb.cost = CostModel::Attention(1.0, 1e-4, static_cast<double>(rng.UniformInt(0, 5)));
    }
    const MicroBatchOptions resolved = internal::Resolved(mb);
    std::vector<std::int64_t> lengths(RandomSize(rng));
    for (std::int64_t& l : lengths) l = rng.UniformInt(0, 8000);
    internal::Padded padded = internal::Pad(lengths, resolved);
    const std::string where = "trial " + std::to_string(trial);
    ASSERT_EQ(padded.tokens.size(), lengths.size()) << where;
    ASSERT_EQ(padded.costs.size(), lengths.size()) << where;
    std::int64_t tokens = 0;
    std::int64_t costs = 0;
    std::int64_t most = 0;
    for (std::size_t i = 0; i < lengths.size(); ++i) {
      const std::int64_t t =
          (lengths[i] + mb.pad_to_multiple_of - 1) / mb.pad_to_multiple_of * mb.pad_to_multiple_of;
      ASSERT_EQ(padded.tokens[i], t) << where << ", sequence " << i;
      ASSERT_EQ(padded.costs[i], mb.cost.Cost(t)) << where << ", sequence " << i;
      tokens += t;
      costs += padded.costs[i];
      most = std::max(most, padded.costs[i]);
    }
    EXPECT_EQ(padded.total_unpadded,
              std::accumulate(lengths.begin(), lengths.end(), std::int64_t{0}))
        << where;
    EXPECT_EQ(padded.total_tokens, tokens) << where;
    EXPECT_EQ(padded.total_cost, costs) << where;
    EXPECT_EQ(padded.max_cost, most) << where;
    // Storage of its own, which a move keeps.
    const std::int64_t* const data = padded.costs.data();
    const internal::Padded moved = std::move(padded);
    EXPECT_EQ(moved.costs.data(), data) << where;
    EXPECT_EQ(moved.total_cost, costs) << where;
  }
}

// FirstFitDecreasing() (which fills a bin with a run of equal items at once) is plain
// first fit: every item, heaviest first (ties: lowest index), into the lowest bin with
// room for it, scanned bin by bin; nullopt exactly when an item fits nowhere.
TEST(SharedSortTest, FirstFitDecreasingIsPlainFirstFit) {
  workload::Rng rng(195);
  for (int trial = 0; trial < 400; ++trial) {
    const std::size_t n = std::min<std::size_t>(RandomSize(rng), 1500);  // the scan is O(n·m)
    // Scaled in some trials to rooms near and above 2^31 (the tree's 32-bit and 64-bit
    // rooms: cap 2^31 and above takes the 64-bit one).
    const std::int64_t scale = rng.UniformInt(0, 2) == 0 ? std::int64_t{1} << 25 : 1;
    const std::int64_t cap = rng.UniformInt(1, 64) * scale;
    std::vector<std::int64_t> lengths(n);
    const std::int64_t top = rng.UniformInt(0, cap / scale) * scale;
    for (std::int64_t& l : lengths) {
      l = rng.UniformInt(0, 3) == 0 ? top : rng.UniformInt(0, top / scale) * scale;
    }
    MicroBatchOptions mb;
    mb.max_tokens_per_micro_batch = cap;
    const internal::Padded padded = internal::Pad(lengths, internal::Resolved(mb));
    std::vector<std::int64_t> all(n);
    std::iota(all.begin(), all.end(), 0);
    const internal::RankItems items = internal::Gather(padded, all);
    const std::int64_t total = items.total_tokens;
    const std::int64_t m = std::max<std::int64_t>(1, total / cap + rng.UniformInt(-1, 3));
    const std::string where = "trial " + std::to_string(trial);

    std::optional<Assignment> want = Assignment(n, 0);
    std::vector<std::int64_t> room(static_cast<std::size_t>(m), cap);
    for (const std::int32_t i : internal::HeaviestFirst(items.tokens)) {
      const std::int64_t t = items.tokens[static_cast<std::size_t>(i)];
      std::size_t b = 0;
      while (b < room.size() && room[b] < t) ++b;
      if (b == room.size()) {
        want.reset();
        break;
      }
      room[b] -= t;
      (*want)[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(b);
    }
    const std::optional<Assignment> got = internal::FirstFitDecreasing(items, m, cap);
    ASSERT_EQ(got.has_value(), want.has_value()) << where;
    if (!got) continue;
    ASSERT_EQ(*got, *want) << where;
    std::vector<std::int64_t> load(static_cast<std::size_t>(m), 0);
    for (std::size_t i = 0; i < n; ++i) {
      ASSERT_GE((*got)[i], 0) << where;
      ASSERT_LT((*got)[i], m) << where;
      load[static_cast<std::size_t>((*got)[i])] += items.tokens[i];
    }
    EXPECT_EQ(std::accumulate(load.begin(), load.end(), std::int64_t{0}), total) << where;
    EXPECT_LE(*std::max_element(load.begin(), load.end()), cap) << where;
  }
}

// GatherRanks() given every sequence's rank (as PlanStep() gives the balancer's) is
// Gather() of each rank: ascending ranks, sequences in no rank (-1), empty ranks.
TEST(SharedSortTest, GatherRanksGivenTheRanksIsGatherOfEachRank) {
  workload::Rng rng(196);
  for (int trial = 0; trial < 100; ++trial) {
    const std::size_t n = RandomSize(rng);
    std::vector<std::int64_t> lengths(n);
    for (std::int64_t& l : lengths) l = rng.UniformInt(0, 4000);
    MicroBatchOptions mb;
    mb.max_tokens_per_micro_batch = 4096;
    mb.pad_to_multiple_of = rng.UniformInt(0, 1) == 0 ? 1 : 32;
    const internal::Padded padded = internal::Pad(lengths, internal::Resolved(mb));
    const std::int64_t num_ranks = rng.UniformInt(1, 9);
    std::vector<std::vector<std::int64_t>> ranks(static_cast<std::size_t>(num_ranks));
    std::vector<std::int32_t> rank_of(n, -1);
    for (std::size_t i = 0; i < n; ++i) {
      if (rng.UniformInt(0, 9) == 0) continue;  // in no rank
      const auto r = static_cast<std::int32_t>(rng.UniformInt(0, num_ranks - 1));
      ranks[static_cast<std::size_t>(r)].push_back(static_cast<std::int64_t>(i));
      rank_of[i] = r;
    }
    const std::vector<internal::RankItems> got = internal::GatherRanks(padded, ranks, rank_of);
    ASSERT_EQ(got.size(), ranks.size());
    std::size_t placed = 0;
    for (std::size_t r = 0; r < ranks.size(); ++r) {
      const internal::RankItems want = internal::Gather(padded, ranks[r]);
      const std::string where = "trial " + std::to_string(trial) + " rank " + std::to_string(r);
      EXPECT_EQ(got[r].tokens, want.tokens) << where;
      EXPECT_EQ(got[r].costs, want.costs) << where;
      EXPECT_EQ(got[r].global, want.global) << where;
      EXPECT_EQ(got[r].total_tokens, want.total_tokens) << where;
      EXPECT_EQ(got[r].total_unpadded, want.total_unpadded) << where;
      EXPECT_EQ(got[r].total_cost, want.total_cost) << where;
      placed += got[r].global.size();
    }
    EXPECT_EQ(placed, static_cast<std::size_t>(std::count_if(
                          rank_of.begin(), rank_of.end(), [](std::int32_t r) { return r >= 0; })));
  }
}

}  // namespace
}  // namespace rlsched::balance
