// The baseline PlanStep reports (PlanBaseline): the common recipe as verl runs it
// (balance/src/step_baseline.cc, recipe_partition.h), against hand-derived plans and a
// plain transcription of verl's method, and its micro-batches over the cap counted
// independently.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "recipe_partition.h"
#include "rlsched/balance/plan_step.h"
#include "rlsched/workload/workload.h"

namespace rlsched::balance {
namespace {

using internal::RecipeSum;
using IndexParts = std::vector<std::vector<std::int64_t>>;

// A rank's micro-batches as their sequence indices, in execution order.
IndexParts MicroBatchesOf(const RankPlan& rank) {
  IndexParts parts;
  for (const MicroBatch& b : rank.micro_batches) parts.push_back(b.indices);
  return parts;
}

// ---- A plain transcription of verl's method (verl/utils/seqlen_balancing.py):
// every partial solution holds all k parts (empty ones too) as lists of
// (index, value) pairs, compared as Python compares them; the heap is a linear scan.
// O(n² k) and more: for small inputs only.

struct RefPart {
  RecipeSum sum = 0;
  std::vector<std::pair<std::int64_t, std::int64_t>> items;  // (index, value), in order added
};

// Python's Set.__lt__: sum, then item count, then the item lists.
bool RefLess(const RefPart& a, const RefPart& b) {
  if (a.sum != b.sum) return a.sum < b.sum;
  if (a.items.size() != b.items.size()) return a.items.size() < b.items.size();
  return a.items < b.items;
}

using RefSolution = std::vector<RefPart>;  // k parts, heaviest first

void SortHeaviestFirst(RefSolution& s) {
  std::stable_sort(s.begin(), s.end(),
                   [](const RefPart& a, const RefPart& b) { return RefLess(b, a); });
}

RecipeSum Spread(const RefSolution& s) { return s.front().sum - s.back().sum; }

// Python's State.__lt__ (heapq pops the least): the larger spread, then the heavier
// heaviest part.
bool PopsFirst(const RefSolution& a, const RefSolution& b) {
  if (Spread(a) != Spread(b)) return Spread(a) > Spread(b);
  return RefLess(b.front(), a.front());
}

IndexParts ReferenceKarmarkarKarp(const std::vector<std::int64_t>& values, std::size_t k,
                                  bool equal) {
  std::vector<std::pair<std::int64_t, std::int64_t>> sorted;  // (value, index)
  for (std::size_t i = 0; i < values.size(); ++i) {
    sorted.emplace_back(values[i], static_cast<std::int64_t>(i));
  }
  std::sort(sorted.begin(), sorted.end());
  std::vector<RefSolution> heap;
  const std::size_t chunk = equal ? k : 1;
  for (std::size_t offset = 0; offset < sorted.size(); offset += chunk) {
    RefSolution s(k);
    for (std::size_t j = 0; j < chunk && offset + j < sorted.size(); ++j) {
      const auto [value, index] = sorted[offset + j];
      s[j].sum = value;
      s[j].items.emplace_back(index, value);
    }
    SortHeaviestFirst(s);
    heap.push_back(std::move(s));
  }
  auto pop = [&] {
    auto it = std::min_element(heap.begin(), heap.end(), PopsFirst);
    RefSolution s = std::move(*it);
    heap.erase(it);
    return s;
  };
  while (heap.size() > 1) {
    RefSolution a = pop();
    RefSolution b = pop();
    for (std::size_t i = 0; i < k; ++i) {
      const RefPart& other = b[k - 1 - i];
      a[i].sum += other.sum;
      a[i].items.insert(a[i].items.end(), other.items.begin(), other.items.end());
    }
    SortHeaviestFirst(a);
    heap.push_back(std::move(a));
  }
  IndexParts parts(k);
  if (heap.empty()) return parts;
  for (std::size_t p = 0; p < k; ++p) {
    for (const auto& item : heap.front()[p].items) parts[p].push_back(item.first);
    std::sort(parts[p].begin(), parts[p].end());
  }
  return parts;
}

struct RefPlan {
  std::int64_t count = 0;
  std::vector<IndexParts> ranks;  // per rank, its micro-batches' sequence indices
};

// verl's _balance_batch and rearrange_micro_batches on `lengths` (the count from the
// unpadded lengths, as verl's attention-mask sums).
RefPlan ReferenceRecipe(const std::vector<std::int64_t>& lengths, const StepOptions& options) {
  const MicroBatchOptions& mb = options.micro_batch;
  std::vector<std::int64_t> workload;
  for (const std::int64_t l : lengths) workload.push_back(24576 * l + l * l);
  IndexParts ranks =
      ReferenceKarmarkarKarp(workload, static_cast<std::size_t>(options.num_ranks), true);
  RefPlan plan;
  for (std::vector<std::int64_t>& rank : ranks) {
    std::sort(rank.begin(), rank.end(), [&](std::int64_t a, std::int64_t b) {
      return std::pair{workload[static_cast<std::size_t>(a)], a} <
             std::pair{workload[static_cast<std::size_t>(b)], b};
    });
    std::vector<std::int64_t> ordered;  // partition[::2] + partition[1::2][::-1]
    for (std::size_t j = 0; j < rank.size(); j += 2) ordered.push_back(rank[j]);
    std::vector<std::int64_t> odd;
    for (std::size_t j = 1; j < rank.size(); j += 2) odd.push_back(rank[j]);
    ordered.insert(ordered.end(), odd.rbegin(), odd.rend());
    rank = ordered;
    std::int64_t tokens = 0;
    for (const std::int64_t i : rank) tokens += lengths[static_cast<std::size_t>(i)];
    const std::int64_t ceil =
        (tokens + mb.max_tokens_per_micro_batch - 1) / mb.max_tokens_per_micro_batch;
    plan.count = std::max(
        {plan.count, mb.min_micro_batches, std::min(static_cast<std::int64_t>(rank.size()), ceil)});
  }
  const std::int64_t q = mb.micro_batches_multiple_of;
  plan.count = (plan.count + q - 1) / q * q;
  for (const std::vector<std::int64_t>& rank : ranks) {
    std::vector<std::int64_t> local;
    for (const std::int64_t i : rank) local.push_back(workload[static_cast<std::size_t>(i)]);
    IndexParts parts = ReferenceKarmarkarKarp(local, static_cast<std::size_t>(plan.count), false);
    auto key = [&](const std::vector<std::int64_t>& part) {
      RecipeSum sum = 0;
      for (const std::int64_t j : part) sum += local[static_cast<std::size_t>(j)];
      return std::pair{sum, part.empty() ? std::int64_t{0} : part.front()};
    };
    std::stable_sort(parts.begin(), parts.end(),
                     [&](const auto& a, const auto& b) { return key(a) > key(b); });
    IndexParts ordered;  // parts[::2][::-1] + parts[1::2]
    for (std::size_t j = 0; j < parts.size(); j += 2) ordered.push_back(parts[j]);
    std::reverse(ordered.begin(), ordered.end());
    for (std::size_t j = 1; j < parts.size(); j += 2) ordered.push_back(parts[j]);
    IndexParts global;
    for (const auto& part : ordered) {
      std::vector<std::int64_t> indices;
      for (const std::int64_t j : part) indices.push_back(rank[static_cast<std::size_t>(j)]);
      std::sort(indices.begin(), indices.end());
      global.push_back(indices);
    }
    plan.ranks.push_back(global);
  }
  return plan;
}

// The micro-batches over the cap, counted from the plan's sequences and the lengths.
std::int64_t OverCap(const std::vector<std::int64_t>& lengths, const StepOptions& options,
                     const StepPlan& plan) {
  const MicroBatchOptions& mb = options.micro_batch;
  std::int64_t over = 0;
  for (const RankPlan& rank : plan.ranks) {
    for (const MicroBatch& b : rank.micro_batches) {
      std::int64_t tokens = 0;
      for (const std::int64_t i : b.indices) {
        const std::int64_t l = lengths[static_cast<std::size_t>(i)];
        tokens += (l + mb.pad_to_multiple_of - 1) / mb.pad_to_multiple_of * mb.pad_to_multiple_of;
      }
      over += tokens > mb.max_tokens_per_micro_batch ? 1 : 0;
    }
  }
  return over;
}

// ---- Hand cases, derived step by step from verl's code.

// 8 sequences of 7 tokens, one rank, cap 8. All workloads are equal (w = 24576·7 + 49).
// Count: min(8, ceil(56 / 8)) = 7. Karmarkar-Karp into 7 (positions in the rank's
// order): every single-item solution has spread w, ties go to the heavier heaviest
// part, i.e. the larger position, so 7, 6, …, 1 are combined one by one into
// {7}{6}{5}{4}{3}{2}{1} (spread 0); then {0} (spread w) pops first and its part takes
// the lightest, {1}: {0,1}{7}{6}{5}{4}{3}{2}. Sorted by (workload, first) descending that
// is unchanged; even positions reversed then odd ones: {2}{4}{6}{0,1}{7}{5}{3}. The
// rank's order is its sequences by (workload, index), even positions then odd ones
// reversed: 0 2 4 6 7 5 3 1, so positions → sequences give
// {4}{7}{3}{0,2}{1}{5}{6}: one micro-batch of 14 tokens over the cap of 8.
TEST(StepBaselineTest, HandCaseOneRank) {
  const std::vector<std::int64_t> lengths(8, 7);
  StepOptions options;
  options.micro_batch.max_tokens_per_micro_batch = 8;
  options.micro_batch.overhead = 0;
  const StepPlan plan = PlanBaseline(lengths, options);
  EXPECT_EQ(plan.num_micro_batches, 7);
  ASSERT_EQ(plan.ranks.size(), 1u);
  EXPECT_EQ(MicroBatchesOf(plan.ranks[0]), (IndexParts{{4}, {7}, {3}, {0, 2}, {1}, {5}, {6}}));
  EXPECT_EQ(plan.cap_violations, 1);
  EXPECT_EQ(plan.predicted_step_time, 56);  // tokens cost, no overhead, p = 1
  EXPECT_EQ(plan.empty_micro_batches, 0);
}

// Lengths 10 1 1 1 9 3 on two ranks, cap 12. Workloads w(L) = 24576·L + L²; sorted
// ascending (w, index): 1 2 3 5 4 0, cut into chunks of two: {2}{1} (spread 0),
// {5}{3} (w(3) − w(1) = 49160), {0}{4} (w(10) − w(9) = 24595). {5}{3} and {0}{4} pop
// first: {5,4}{3,0} (295002 vs 270437), then with {2}{1}: {5,4,1}{3,0,2}. Rank 0 holds
// 1 4 5 (13 tokens: ceil(13 / 12) = 2), rank 1 0 2 3 (12 tokens: 1); the count is the
// max, 2. Rank 0's order by (w, index) is 1 5 4, evens then odds reversed 1 4 5; its
// Karmarkar-Karp on w(1) w(9) w(3) into 2: {position 1} and {positions 0, 2} = {4} and
// {1, 5}. Rank 1's order 2 3 0 → 2 0 3; w(1) w(10) w(1): {position 1} = {0}, and
// positions 0 and 2 = {2, 3}. Heavier first, then evens reversed and odds: as is.
TEST(StepBaselineTest, HandCaseTwoRanksTheCountIsTheMax) {
  const std::vector<std::int64_t> lengths = {10, 1, 1, 1, 9, 3};
  StepOptions options;
  options.num_ranks = 2;
  options.micro_batch.max_tokens_per_micro_batch = 12;
  options.micro_batch.overhead = 0;
  const StepPlan plan = PlanBaseline(lengths, options);
  EXPECT_EQ(plan.num_micro_batches, 2);
  ASSERT_EQ(plan.ranks.size(), 2u);
  EXPECT_EQ(MicroBatchesOf(plan.ranks[0]), (IndexParts{{4}, {1, 5}}));
  EXPECT_EQ(MicroBatchesOf(plan.ranks[1]), (IndexParts{{0}, {2, 3}}));
  EXPECT_EQ(plan.cap_violations, 0);
  EXPECT_EQ(plan.predicted_step_time, 13);
  // The multiple rounds the max up: 4 micro-batches, rank 1 (3 sequences) gets an
  // empty one (verl would assert there).
  options.micro_batch.micro_batches_multiple_of = 4;
  const StepPlan four = PlanBaseline(lengths, options);
  EXPECT_EQ(four.num_micro_batches, 4);
  EXPECT_EQ(four.empty_micro_batches, 2);
}

// RecipeKarmarkarKarp is the transcription's partition, any size and equal size; with
// RecipeOrder::kValue the same parts, each by (value, index) ascending.
void ExpectTheTranscriptionsPartition(const std::vector<std::int64_t>& values, std::size_t k) {
  for (const bool equal : {false, true}) {
    const PartSizes sizes = equal ? PartSizes::kEqual : PartSizes::kAny;
    const IndexParts reference = ReferenceKarmarkarKarp(values, k, equal);
    EXPECT_EQ(internal::RecipeKarmarkarKarp(values, static_cast<std::int64_t>(k), sizes), reference)
        << (equal ? "equal" : "any");
    IndexParts by_value = reference;
    for (std::vector<std::int64_t>& part : by_value) {
      std::sort(part.begin(), part.end(), [&](std::int64_t a, std::int64_t b) {
        return std::pair(values[static_cast<std::size_t>(a)], a) <
               std::pair(values[static_cast<std::size_t>(b)], b);
      });
    }
    EXPECT_EQ(internal::RecipeKarmarkarKarp(values, static_cast<std::int64_t>(k), sizes,
                                            internal::RecipeOrder::kValue),
              by_value)
        << (equal ? "equal" : "any") << ", by value";
  }
}

// The same partition as the plain transcription on hand-checkable inputs.
TEST(StepBaselineTest, RecipeKarmarkarKarpHandCases) {
  // Equal size, 2 parts: chunks {2}{1}, {5}{3}, {0}{4} as in the hand case above.
  std::vector<std::int64_t> w;
  for (const std::int64_t l : {10, 1, 1, 1, 9, 3}) w.push_back(internal::RecipeWorkload(l));
  EXPECT_EQ(internal::RecipeKarmarkarKarp(w, 2, PartSizes::kEqual),
            (IndexParts{{1, 4, 5}, {0, 2, 3}}));
  // More parts than items: the empty parts last.
  EXPECT_EQ(internal::RecipeKarmarkarKarp(std::vector<std::int64_t>{5, 9}, 4, PartSizes::kAny),
            (IndexParts{{1}, {0}, {}, {}}));
  EXPECT_EQ(internal::RecipeKarmarkarKarp(std::vector<std::int64_t>{}, 2, PartSizes::kEqual),
            (IndexParts{{}, {}}));
  EXPECT_EQ(internal::RecipeWorkload(1000), 24576 * 1000 + 1000 * 1000);
}

// Seeded inputs with many ties, zeros and huge values (sums beyond int64): the same
// partition as the plain transcription, both modes, any n and k.
TEST(StepBaselineTest, RecipeKarmarkarKarpMatchesTheTranscription) {
  for (std::uint64_t seed = 1; seed <= 400; ++seed) {
    workload::Rng rng(seed * 40503 + 9);
    const auto n = static_cast<std::size_t>(rng.UniformInt(0, 30));
    const auto k = static_cast<std::size_t>(rng.UniformInt(1, 9));
    const int kind = static_cast<int>(rng.UniformInt(0, 2));
    std::vector<std::int64_t> values;
    for (std::size_t i = 0; i < n; ++i) {
      values.push_back(kind == 0   ? rng.UniformInt(0, 4)
                       : kind == 1 ? rng.UniformInt(0, 1'000'000)
                                   : rng.UniformInt(std::int64_t{1} << 61, std::int64_t{1} << 62));
    }
    SCOPED_TRACE("seed " + std::to_string(seed));
    ExpectTheTranscriptionsPartition(values, k);
    if (::testing::Test::HasFailure()) return;
  }
}

// `n` seeded values of one of the first `kinds` kinds, drawn from `rng`: 0–3 (ties and
// zeros), verl's workloads of heavy-tailed lengths, 0–10^6, and values of 2^60–2^62
// (sums beyond int64).
std::vector<std::int64_t> SeededValues(workload::Rng& rng, std::size_t n, std::uint64_t seed,
                                       int kinds) {
  const int kind = static_cast<int>(rng.UniformInt(0, kinds - 1));
  std::vector<std::int64_t> values;
  if (kind == 0) {
    for (std::size_t i = 0; i < n; ++i) values.push_back(rng.UniformInt(0, 3));
  } else if (kind == 1) {
    values = workload::HeavyTailedLengths(static_cast<std::int64_t>(n), seed);
    for (std::int64_t& v : values) v = internal::RecipeWorkload(v);
  } else if (kind == 2) {
    for (std::size_t i = 0; i < n; ++i) values.push_back(rng.UniformInt(0, 1'000'000));
  } else {
    for (std::size_t i = 0; i < n; ++i) {
      values.push_back(rng.UniformInt(std::int64_t{1} << 60, std::int64_t{1} << 62));
    }
  }
  return values;
}

// Larger seeded inputs, where solutions of many parts meet single items and each other
// (the combination that pops only the parts that change): the transcription's partition.
TEST(StepBaselineTest, RecipeKarmarkarKarpMatchesTheTranscriptionOnLargerInputs) {
  for (std::uint64_t seed = 1; seed <= 120; ++seed) {
    workload::Rng rng(seed * 7841 + 11);
    const auto n = static_cast<std::size_t>(rng.UniformInt(0, 600));
    const auto k = static_cast<std::size_t>(rng.UniformInt(1, 80));
    const std::vector<std::int64_t> values = SeededValues(rng, n, seed, /*kinds=*/3);
    SCOPED_TRACE("seed " + std::to_string(seed));
    ExpectTheTranscriptionsPartition(values, k);
    if (::testing::Test::HasFailure()) return;
  }
}

// RecipeKarmarkarKarpPositions (the partition by position in the ascending order, which
// the baseline reads) on seeded inputs of up to 5,000 items and 700 parts (ties, zeros,
// heavy tails, sums beyond int64): every position in one part, the parts' counts and
// sums those of their items, and the same parts in the same order as
// RecipeKarmarkarKarp (the transcription's partition, tested above), both modes.
TEST(StepBaselineTest, RecipeKarmarkarKarpPositionsIsTheSamePartition) {
  for (std::uint64_t seed = 1; seed <= 160; ++seed) {
    workload::Rng rng(seed * 104729 + 3);
    const auto n = static_cast<std::size_t>(rng.UniformInt(0, 5000));
    const auto k = static_cast<std::size_t>(rng.UniformInt(1, 700));
    const std::vector<std::int64_t> values = SeededValues(rng, n, seed, /*kinds=*/4);
    SCOPED_TRACE("seed " + std::to_string(seed) + ", n " + std::to_string(n) + ", k " +
                 std::to_string(k));
    std::vector<std::int64_t> sorted;
    const std::vector<std::int32_t> ascending = internal::RecipeAscending(values, &sorted);
    ASSERT_EQ(sorted.size(), n);
    for (std::size_t p = 0; p < n; ++p) {
      ASSERT_EQ(sorted[p], values[static_cast<std::size_t>(ascending[p])]);
    }
    for (const PartSizes sizes : {PartSizes::kAny, PartSizes::kEqual}) {
      const internal::RecipePartition partition = internal::RecipeKarmarkarKarpPositions(
          sorted, ascending, static_cast<std::int64_t>(k), sizes);
      ASSERT_EQ(partition.part_of_position.size(), n);
      ASSERT_EQ(partition.sums.size(), k);
      ASSERT_EQ(partition.counts.size(), k);
      IndexParts parts(k);
      std::vector<RecipeSum> sums(k, 0);
      for (std::size_t p = 0; p < n; ++p) {
        const std::int32_t part = partition.part_of_position[p];
        ASSERT_GE(part, 0);
        ASSERT_LT(part, static_cast<std::int32_t>(k));
        parts[static_cast<std::size_t>(part)].push_back(ascending[p]);
        sums[static_cast<std::size_t>(part)] += sorted[p];
      }
      for (std::size_t part = 0; part < k; ++part) {
        EXPECT_EQ(partition.counts[part], static_cast<std::int32_t>(parts[part].size()));
        EXPECT_TRUE(partition.sums[part] == sums[part]) << "part " << part;
      }
      EXPECT_EQ(parts, internal::RecipeKarmarkarKarp(values, static_cast<std::int64_t>(k), sizes,
                                                     internal::RecipeOrder::kValue))
          << (sizes == PartSizes::kEqual ? "equal" : "any");
    }
    if (::testing::Test::HasFailure()) return;
  }
}

// Seeded steps (any rank count, padding, minimum and multiple; sequence counts that
// verl would refuse included): PlanBaseline is the transcription's plan, in the same
// order, with its micro-batches over the cap counted, timed with our cost model.
TEST(StepBaselineTest, MatchesTheTranscriptionOnRandomSteps) {
  for (std::uint64_t seed = 1; seed <= 300; ++seed) {
    workload::Rng rng(seed * 1299709 + 5);
    const workload::SyntheticBatch batch =
        workload::GrpoBatch(rng.UniformInt(0, 24), rng.UniformInt(1, 8), seed);
    std::vector<std::int64_t> lengths = batch.lengths;
    if (rng.UniformInt(0, 3) == 0) {
      for (std::int64_t& l : lengths) l = l % 7 * 500;  // ties and zeros
    }
    StepOptions options;
    options.num_ranks = rng.UniformInt(1, 9);
    options.equal_size = rng.UniformInt(0, 1) == 1;  // the recipe ignores it
    MicroBatchOptions& mb = options.micro_batch;
    std::int64_t longest = 1;
    mb.pad_to_multiple_of = rng.UniformInt(0, 2) == 0 ? rng.UniformInt(2, 64) : 1;
    for (const std::int64_t l : lengths) {
      longest = std::max(
          longest, (l + mb.pad_to_multiple_of - 1) / mb.pad_to_multiple_of * mb.pad_to_multiple_of);
    }
    mb.max_tokens_per_micro_batch = longest + rng.UniformInt(0, 2 * longest);
    mb.min_micro_batches = rng.UniformInt(1, 3);
    mb.micro_batches_multiple_of = rng.UniformInt(1, 3);
    mb.pipeline_stages = rng.UniformInt(1, 4);
    mb.overhead = rng.UniformInt(0, 1) == 0 ? 0 : rng.UniformInt(1, 3000);
    if (rng.UniformInt(0, 1) == 1) mb.cost = CostModel::Attention(ModelShape{});
    SCOPED_TRACE("seed " + std::to_string(seed));

    const StepPlan plan = PlanBaseline(lengths, options);
    const RefPlan expected = ReferenceRecipe(lengths, options);
    EXPECT_EQ(plan.num_micro_batches, expected.count);
    ASSERT_EQ(plan.ranks.size(), expected.ranks.size());
    std::int64_t slowest = 0;
    for (std::size_t r = 0; r < plan.ranks.size(); ++r) {
      EXPECT_EQ(MicroBatchesOf(plan.ranks[r]), expected.ranks[r]) << "rank " << r;
      // Timed with our cost model: Σ (cost + o) + (p − 1)·max (cost + o).
      std::int64_t sum = 0, max = 0;
      for (const MicroBatch& b : plan.ranks[r].micro_batches) {
        std::int64_t cost = 0;
        for (const std::int64_t i : b.indices) {
          const std::int64_t l = lengths[static_cast<std::size_t>(i)];
          cost += mb.cost.Cost((l + mb.pad_to_multiple_of - 1) / mb.pad_to_multiple_of *
                               mb.pad_to_multiple_of);
        }
        EXPECT_EQ(b.cost, cost);
        sum += cost + *mb.overhead;
        max = std::max(max, cost + *mb.overhead);
      }
      EXPECT_EQ(plan.ranks[r].time, sum + (mb.pipeline_stages - 1) * max);
      slowest = std::max(slowest, plan.ranks[r].time);
    }
    EXPECT_EQ(plan.predicted_step_time, slowest);
    EXPECT_EQ(plan.cap_violations, OverCap(lengths, options, plan));
    // PlanStep reports the same baseline: its figures, without its ranks.
    const StepPlan reported = PlanStep(lengths, batch.groups, options).baseline;
    EXPECT_EQ(reported.predicted_step_time, plan.predicted_step_time);
    EXPECT_EQ(reported.cap_violations, plan.cap_violations);
    EXPECT_EQ(reported.num_micro_batches, plan.num_micro_batches);
    EXPECT_EQ(reported.empty_micro_batches, plan.empty_micro_batches);
    EXPECT_EQ(reported.empty_ranks, plan.empty_ranks);
    EXPECT_EQ(reported.sequences, plan.sequences);
    EXPECT_EQ(reported.tokens, plan.tokens);
    EXPECT_EQ(reported.unpadded_tokens, plan.unpadded_tokens);
    EXPECT_EQ(reported.overhead, plan.overhead);
    EXPECT_TRUE(reported.ranks.empty());
    if (::testing::Test::HasFailure()) return;
  }
}

// 4,096 heavy-tailed sequences (workload::GrpoBatch(512, 8, 1)) on 16 ranks under a cap of
// 32,768: every rank holds about 450,000 tokens, so the recipe's count is
// ceil(tokens / cap) = 14, about 32,300 tokens a micro-batch, and balancing the
// workload key does not keep every micro-batch under the cap. The count is > 0 and is
// the number of micro-batches whose sequences add up to more than the cap, and the
// transcription's.
TEST(StepBaselineTest, OverCapOnAHeavyTailedBatch) {
  const workload::SyntheticBatch batch = workload::GrpoBatch(512, 8, 1);
  StepOptions options;
  options.num_ranks = 16;
  options.micro_batch.max_tokens_per_micro_batch = 32768;
  options.micro_batch.cost = CostModel::Attention(ModelShape{});
  const PlannedStep step = PlanStep(batch.lengths, batch.groups, options);
  EXPECT_EQ(step.baseline.num_micro_batches, 14);
  EXPECT_GT(step.baseline.cap_violations, 0);
  // Counted on the recipe's micro-batches (PlanBaseline(): PlanStep() reports the figures).
  EXPECT_EQ(step.baseline.cap_violations,
            OverCap(batch.lengths, options, PlanBaseline(batch.lengths, options)));
  const RefPlan expected = ReferenceRecipe(batch.lengths, options);
  std::int64_t over = 0;
  for (const IndexParts& rank : expected.ranks) {
    for (const auto& part : rank) {
      std::int64_t tokens = 0;
      for (const std::int64_t i : part) tokens += batch.lengths[static_cast<std::size_t>(i)];
      over += tokens > 32768 ? 1 : 0;
    }
  }
  EXPECT_EQ(step.baseline.cap_violations, over);
  // Ours keeps the cap.
  EXPECT_EQ(step.plan.cap_violations, 0);
  EXPECT_EQ(OverCap(batch.lengths, options, step.plan), 0);
}

}  // namespace
}  // namespace rlsched::balance
