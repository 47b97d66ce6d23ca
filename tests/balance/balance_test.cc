#include "rlsched/balance/balance.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "rlsched/workload/workload.h"
#include "test_util.h"

namespace rlsched::balance {
namespace {

using testing::ErrorOf;
using ::testing::HasSubstr;

BalanceOptions Options(std::int64_t k) {
  BalanceOptions options;
  options.partition.num_parts = k;
  return options;
}

TEST(BalanceTest, TokensAndCostsPerPart) {
  const std::vector<std::int64_t> lengths = workload::HeavyTailedLengths(300, 2);
  BalanceOptions options = Options(8);
  options.cost = CostModel::Attention(ModelShape{});
  const BalanceResult r = Balance(lengths, {}, options);
  const std::vector<std::int64_t> costs = options.cost.Costs(lengths);
  testing::ExpectValidPartition(costs, 8, false, r.partition);
  std::int64_t total = 0;
  for (std::int64_t p = 0; p < 8; ++p) {
    std::int64_t tokens = 0;
    for (const std::int64_t i : r.partition.part(p)) tokens += lengths[static_cast<std::size_t>(i)];
    EXPECT_EQ(r.tokens[static_cast<std::size_t>(p)], tokens);
    total += tokens;
  }
  std::int64_t sum = 0;
  for (const std::int64_t l : lengths) sum += l;
  EXPECT_EQ(total, sum);
}

TEST(BalanceTest, GroupsStayWholeAndEqualSizeCountsGroups) {
  const workload::SyntheticBatch batch = workload::GrpoBatch(40, 5, 4);
  BalanceOptions options = Options(8);
  options.keep_groups = true;
  options.partition.equal_size = true;
  const BalanceResult r = Balance(batch.lengths, batch.groups, options);
  std::map<std::int64_t, std::int64_t> part_of_group;
  for (std::int64_t p = 0; p < 8; ++p) {
    std::set<std::int64_t> groups;
    for (const std::int64_t i : r.partition.part(p)) {
      const std::int64_t g = batch.groups[static_cast<std::size_t>(i)];
      groups.insert(g);
      const auto [it, inserted] = part_of_group.emplace(g, p);
      EXPECT_EQ(it->second, p) << "group " << g << " split";
    }
    EXPECT_EQ(groups.size(), 5u);  // 40 groups / 8 parts
    EXPECT_EQ(r.partition.part(p).size(), 25u);
  }
  EXPECT_EQ(part_of_group.size(), 40u);
  EXPECT_GE(r.partition.max_load, r.partition.lower_bound);
}

TEST(BalanceTest, ArbitraryGroupIds) {
  const std::vector<std::int64_t> lengths = {10, 20, 30, 40, 50, 60};
  const std::vector<std::int64_t> groups = {900, 7, 900, 7, 123456789, 0};
  BalanceOptions options = Options(3);
  options.keep_groups = true;
  const BalanceResult r = Balance(lengths, groups, options);
  // Groups: {0,2}=40, {1,3}=60, {4}=50, {5}=60 -> best 60 | 60 | 50 + 40.
  EXPECT_EQ(r.partition.lower_bound, 70);
  EXPECT_EQ(r.partition.max_load, 90);
  for (std::int64_t p = 0; p < 3; ++p) {
    std::set<std::int64_t> g;
    for (const std::int64_t i : r.partition.part(p)) g.insert(groups[static_cast<std::size_t>(i)]);
    for (const std::int64_t id : {900, 7}) {
      if (g.count(id)) {
        std::int64_t members = 0;
        for (const std::int64_t i : r.partition.part(p)) {
          members += groups[static_cast<std::size_t>(i)] == id;
        }
        EXPECT_EQ(members, 2);
      }
    }
  }
}

TEST(BalanceTest, GroupsIgnoredWithoutKeepGroups) {
  const std::vector<std::int64_t> lengths = {10, 10, 10, 10};
  const std::vector<std::int64_t> groups = {0, 0, 0, 0};
  const BalanceResult r = Balance(lengths, groups, Options(2));
  EXPECT_EQ(r.partition.max_load, 20);
}

TEST(BalanceTest, EvaluateTheNaiveSplit) {
  const std::vector<std::int64_t> lengths = {100, 1, 1, 1, 100, 1};
  const BalanceResult naive = Evaluate(lengths, Options(2), ContiguousSplit(6, 2));
  EXPECT_EQ(naive.partition.max_load, 102);
  EXPECT_EQ(naive.tokens, (std::vector<std::int64_t>{102, 102}));
  const BalanceResult balanced = Balance(lengths, {}, Options(2));
  EXPECT_EQ(balanced.partition.max_load, 102);
  const std::vector<std::int64_t> skewed = {100, 100, 1, 1, 1, 1};
  EXPECT_EQ(Evaluate(skewed, Options(2), ContiguousSplit(6, 2)).partition.max_load, 201);
  EXPECT_EQ(Balance(skewed, {}, Options(2)).partition.max_load, 102);
}

TEST(BalanceTest, BadInputNamesTheField) {
  const std::vector<std::int64_t> lengths = {1, 2, 3};
  EXPECT_THAT(ErrorOf([&] { Balance(lengths, {}, Options(0)); }), HasSubstr("num_parts"));
  const std::vector<std::int64_t> negative = {1, -2};
  EXPECT_THAT(ErrorOf([&] { Balance(negative, {}, Options(2)); }), HasSubstr("lengths[1]"));
  const std::vector<std::int64_t> too_long = {1, (std::int64_t{1} << 31) + 1};
  EXPECT_THAT(ErrorOf([&] { Balance(too_long, {}, Options(2)); }), HasSubstr("lengths[1]"));
  const std::vector<std::int64_t> two_groups = {0, 1};
  EXPECT_THAT(ErrorOf([&] { Balance(lengths, two_groups, Options(2)); }), HasSubstr("groups"));
  const std::vector<std::int64_t> bad_group = {0, -1, 0};
  EXPECT_THAT(ErrorOf([&] { Balance(lengths, bad_group, Options(2)); }), HasSubstr("groups[1]"));
  BalanceOptions keep = Options(2);
  keep.keep_groups = true;
  EXPECT_THAT(ErrorOf([&] { Balance(lengths, {}, keep); }), HasSubstr("keep_groups"));
  BalanceOptions overflow = Options(2);
  overflow.cost = CostModel::Attention(0.0, 0.5, 0.0);  // 2^61 per sequence
  const std::vector<std::int64_t> big(8, std::int64_t{1} << 31);
  EXPECT_THAT(ErrorOf([&] { Balance(big, {}, overflow); }), HasSubstr("overflows"));
}

}  // namespace
}  // namespace rlsched::balance
