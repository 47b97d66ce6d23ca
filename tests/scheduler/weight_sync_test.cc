// The weight-sync planning of the live runtime (runtime.h), called as a user would:
// WeightSyncOptions() for a membership's size, rollout::PlanReshard() of those options,
// SplitWeightSync() into the members' parts, and the checks of Validate(RuntimeOptions)
// on the layout. Seeded random layouts of a small Llama and a small MoE, the planner
// deciding which fit.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "rlsched/common/error.h"
#include "rlsched/rollout/model.h"
#include "rlsched/rollout/plan.h"
#include "rlsched/scheduler/runtime.h"
#include "rlsched/workload/workload.h"
#include "tiny_configs.h"

namespace rlsched::scheduler {
namespace {

using tiny_configs::kTinyLlama;
using tiny_configs::kTinyMoe;

// A seeded random weight layout: any sizes, some of which the planner refuses.
WeightSyncLayout RandomLayout(workload::Rng& rng) {
  const bool moe = rng.UniformInt(0, 1) == 1;
  const auto pick = [&](std::initializer_list<std::int64_t> values) {
    return *(values.begin() + rng.UniformInt(0, static_cast<std::int64_t>(values.size()) - 1));
  };
  WeightSyncLayout layout;
  layout.model = rollout::ParseHfConfig(moe ? kTinyMoe : kTinyLlama);
  rollout::ReshardOptions& o = layout.reshard;
  o.train.tp = pick({1, 2, 4});
  o.train.pp = pick({1, 2, 3, 4});
  o.train.cp = pick({1, 1, 2});
  o.train.dp = pick({1, 2, 3});
  if (moe) o.train.ep = pick({1, 2, 4});
  o.infer.tp = pick({1, 2, 3, 4, 8});
  o.infer.replicas = rng.UniformInt(1, 4);
  o.infer.expert_parallel = moe && rng.UniformInt(0, 1) == 1;
  o.topology.colocated = rng.UniformInt(0, 1) == 1;
  o.topology.gpus_per_node = pick({2, 4, 8});
  o.bucket_bytes = pick({4096, 1 << 16, std::int64_t{512} << 20});
  return layout;
}

std::optional<rollout::ReshardPlan> TryPlan(const rollout::ModelConfig& model,
                                            const rollout::ReshardOptions& options) {
  try {
    return rollout::PlanReshard(model, options);
  } catch (const std::invalid_argument&) {
    return std::nullopt;
  }
}

// Valid runtime options but for the weight layout.
RuntimeOptions OptionsWith(WeightSyncLayout layout) {
  RuntimeOptions options;
  options.orchestrator = {{.mode = Mode::kAsync,
                           .max_staleness = 1,
                           .partial_rollout = true,
                           .prompts_per_step = 8,
                           .samples_per_prompt = 4}};
  options.orchestrator.num_steps = 2;
  options.weight_sync = std::move(layout);
  return options;
}

// The field of the FieldError `run` throws ("" and a failure when it throws none).
template <class F>
std::string FieldOf(F&& run) {
  try {
    run();
  } catch (const FieldError& e) {
    return e.field();
  }
  ADD_FAILURE() << "no FieldError";
  return "";
}

TEST(WeightSyncTest, OptionsForAMembershipChangeTheReplicasOnly) {
  workload::Rng rng(11);
  for (int i = 0; i < 50; ++i) {
    const WeightSyncLayout layout = RandomLayout(rng);
    const std::int64_t replicas = rng.UniformInt(1, 64);
    const rollout::ReshardOptions o = WeightSyncOptions(layout, replicas);
    EXPECT_EQ(o.infer.replicas, replicas);
    EXPECT_EQ(o.infer.tp, layout.reshard.infer.tp);
    EXPECT_EQ(o.infer.expert_parallel, layout.reshard.infer.expert_parallel);
    EXPECT_EQ(o.train.tp, layout.reshard.train.tp);
    EXPECT_EQ(o.train.pp, layout.reshard.train.pp);
    EXPECT_EQ(o.train.dp, layout.reshard.train.dp);
    EXPECT_EQ(o.train.cp, layout.reshard.train.cp);
    EXPECT_EQ(o.train.ep, layout.reshard.train.ep);
    EXPECT_EQ(o.topology.colocated, layout.reshard.topology.colocated);
    EXPECT_EQ(o.topology.gpus_per_node, layout.reshard.topology.gpus_per_node);
    EXPECT_EQ(o.bucket_bytes, layout.reshard.bucket_bytes);
  }
  workload::Rng one(1);
  const WeightSyncLayout layout = RandomLayout(one);
  for (const std::int64_t bad : {std::int64_t{0}, std::int64_t{-3}}) {
    try {
      (void)WeightSyncOptions(layout, bad);
      ADD_FAILURE() << "replicas " << bad << " accepted";
    } catch (const FieldError& e) {
      EXPECT_EQ(e.field(), "replicas");
      EXPECT_EQ(std::string(e.what()), "replicas: must be >= 1, got " + std::to_string(bad));
    }
  }
}

// For memberships of 1..5 engines (any ids), each member's part holds exactly the
// transfers its replica's GPUs receive: every receiving (transfer, GPU) pair goes to
// one member, whose bytes count it once; the members' bytes sum to the plan's.
TEST(WeightSyncTest, EveryReceivedTransferGoesToExactlyOneMembersPart) {
  workload::Rng rng(2026);
  int layouts = 0, memberships = 0, refused = 0;
  for (int trial = 0; trial < 300 && layouts < 40; ++trial) {
    const WeightSyncLayout layout = RandomLayout(rng);
    if (!TryPlan(layout.model, layout.reshard)) continue;
    ++layouts;
    for (std::int64_t n = 1; n <= 5; ++n) {
      SCOPED_TRACE(testing::Message() << "trial " << trial << ", " << n << " members");
      const rollout::ReshardOptions options = WeightSyncOptions(layout, n);
      std::optional<rollout::ReshardPlan> planned;
      try {
        planned = rollout::PlanReshard(layout.model, options);
      } catch (const FieldError& e) {
        // The one bound that depends on the membership's size: colocated engines on at
        // most the trainer's GPUs (so never for fewer members than the layout's).
        EXPECT_EQ(e.field(), "infer.replicas") << e.what();
        EXPECT_TRUE(options.topology.colocated);
        EXPECT_GT(options.infer.tp * n, options.train.world_size());
        EXPECT_GT(n, layout.reshard.infer.replicas);
        ++refused;
        continue;
      }
      const auto plan = std::make_shared<const rollout::ReshardPlan>(std::move(*planned));
      // Ascending, distinct engine ids with gaps.
      std::vector<std::int64_t> members;
      for (std::int64_t id = rng.UniformInt(0, 3); static_cast<std::int64_t>(members.size()) < n;
           id += rng.UniformInt(1, 4)) {
        members.push_back(id);
      }
      const std::int64_t epoch = rng.UniformInt(0, 100);
      const std::vector<EngineTransfers> parts = SplitWeightSync(layout, plan, members, epoch);
      ++memberships;
      ASSERT_EQ(static_cast<std::int64_t>(parts.size()), n);

      const std::int64_t trainer = options.train.world_size();
      const std::int64_t engines = options.infer.tp * n;
      const std::int64_t world =
          options.topology.colocated ? std::max(trainer, engines) : trainer + engines;
      // Which member each engine GPU belongs to, from the planner's numbering.
      std::map<std::int64_t, std::size_t> member_of_rank;
      for (std::size_t k = 0; k < parts.size(); ++k) {
        const EngineTransfers& part = parts[k];
        EXPECT_EQ(part.plan, plan);
        EXPECT_EQ(part.epoch, epoch);
        ASSERT_NE(part.members, nullptr);
        EXPECT_EQ(*part.members, members);
        EXPECT_EQ(part.members, parts.front().members);  // shared
        EXPECT_EQ(part.replica, static_cast<std::int64_t>(k));
        EXPECT_EQ(part.ranks, options.infer.tp);
        EXPECT_EQ(part.world_size, world);
        EXPECT_TRUE(std::is_sorted(part.transfers.begin(), part.transfers.end()));
        EXPECT_EQ(std::adjacent_find(part.transfers.begin(), part.transfers.end()),
                  part.transfers.end());
        for (std::int64_t t = 0; t < options.infer.tp; ++t) {
          const std::int64_t rank = rollout::EngineRank(options, part.replica, t);
          EXPECT_EQ(rank, part.rank_offset + t);  // a replica's GPUs are consecutive
          EXPECT_TRUE(member_of_rank.emplace(rank, k).second) << "GPU " << rank << " twice";
        }
      }
      // The parts the plan itself gives.
      std::vector<std::set<std::int64_t>> want_transfers(parts.size());
      std::vector<std::int64_t> want_bytes(parts.size(), 0);
      for (std::size_t i = 0; i < plan->transfers.size(); ++i) {
        const rollout::Transfer& transfer = plan->transfers[i];
        ASSERT_FALSE(transfer.dst_ranks.empty());
        for (const std::int64_t rank : transfer.dst_ranks) {
          const auto owner = member_of_rank.find(rank);
          ASSERT_NE(owner, member_of_rank.end())
              << "transfer " << i << " to GPU " << rank << ", no member's";
          want_transfers[owner->second].insert(static_cast<std::int64_t>(i));
          want_bytes[owner->second] += transfer.bytes;
        }
      }
      std::int64_t bytes = 0;
      std::set<std::int64_t> covered;
      for (std::size_t k = 0; k < parts.size(); ++k) {
        EXPECT_EQ(parts[k].transfers,
                  std::vector<std::int64_t>(want_transfers[k].begin(), want_transfers[k].end()))
            << "member " << k;
        EXPECT_EQ(parts[k].bytes, want_bytes[k]) << "member " << k;
        bytes += parts[k].bytes;
        covered.insert(parts[k].transfers.begin(), parts[k].transfers.end());
      }
      EXPECT_EQ(bytes, plan->bytes_received);
      EXPECT_EQ(covered.size(), plan->transfers.size());  // every transfer reaches a member
    }
  }
  EXPECT_GE(layouts, 40);
  EXPECT_EQ(memberships + refused, 5 * layouts);
  EXPECT_GE(memberships, 4 * layouts);
}

// Validate() refuses what the planner refuses, under weight_sync; it takes what the
// planner takes, and a plan made elsewhere only when made for the layout's GPUs.
TEST(WeightSyncTest, ValidateRefusesLayoutsThePlannerRefusesNamingTheField) {
  workload::Rng rng(7);
  int refused = 0, accepted = 0;
  for (int trial = 0; trial < 120; ++trial) {
    SCOPED_TRACE(trial);
    const WeightSyncLayout layout = RandomLayout(rng);
    const std::optional<rollout::ReshardPlan> plan = TryPlan(layout.model, layout.reshard);
    if (plan) {
      ++accepted;
      EXPECT_NO_THROW(Validate(OptionsWith(layout)));
      WeightSyncLayout with_plan = layout;
      with_plan.plan = std::make_shared<const rollout::ReshardPlan>(*plan);
      EXPECT_NO_THROW(Validate(OptionsWith(with_plan)));
      // A plan for one replica more (or, colocated, maybe one fewer) does not fit the
      // layout.
      std::optional<rollout::ReshardPlan> other =
          TryPlan(layout.model, WeightSyncOptions(layout, layout.reshard.infer.replicas + 1));
      if (!other && layout.reshard.infer.replicas > 1) {
        other = TryPlan(layout.model, WeightSyncOptions(layout, layout.reshard.infer.replicas - 1));
      }
      if (!other) continue;
      with_plan.plan = std::make_shared<const rollout::ReshardPlan>(*other);
      EXPECT_EQ(FieldOf([&] { Validate(OptionsWith(with_plan)); }), "weight_sync.plan");
      // SplitWeightSync with the wrong membership size names the plan.
      std::vector<std::int64_t> members;
      for (std::int64_t e = 0; e < layout.reshard.infer.replicas; ++e) members.push_back(e);
      EXPECT_EQ(FieldOf([&] { SplitWeightSync(layout, with_plan.plan, members, 0); }), "plan");
    } else {
      ++refused;
      const std::string field = FieldOf([&] { Validate(OptionsWith(layout)); });
      EXPECT_TRUE(field.starts_with("weight_sync.reshard.")) << field;
    }
  }
  EXPECT_GE(refused, 10);
  EXPECT_GE(accepted, 10);

  // Named cases.
  workload::Rng one(3);
  WeightSyncLayout layout = RandomLayout(one);
  layout.model = rollout::ParseHfConfig(kTinyLlama);
  layout.reshard.train = {.tp = 2, .pp = 2};
  layout.reshard.infer = {.tp = 2, .replicas = 2};
  EXPECT_NO_THROW(Validate(OptionsWith(layout)));
  WeightSyncLayout bad = layout;
  bad.reshard.train.pp = 3;  // 4 layers over 3 stages
  EXPECT_EQ(FieldOf([&] { Validate(OptionsWith(bad)); }), "weight_sync.reshard.train.pp");
  bad = layout;
  bad.reshard.infer.tp = 3;  // 16 heads over 3 ranks
  EXPECT_EQ(FieldOf([&] { Validate(OptionsWith(bad)); }), "weight_sync.reshard.infer.tp");
  bad = layout;
  bad.model.num_layers = 0;
  EXPECT_TRUE(FieldOf([&] { Validate(OptionsWith(bad)); }).starts_with("weight_sync.model"));

  const auto plan = std::make_shared<const rollout::ReshardPlan>(
      rollout::PlanReshard(layout.model, WeightSyncOptions(layout, 2)));
  EXPECT_EQ(SplitWeightSync(layout, plan, {4, 9}, 0).size(), 2u);
  EXPECT_EQ(FieldOf([&] { SplitWeightSync(layout, plan, {}, 0); }), "members");
  EXPECT_EQ(FieldOf([&] { SplitWeightSync(layout, plan, {9, 4}, 0); }), "members");
  EXPECT_EQ(FieldOf([&] { SplitWeightSync(layout, plan, {4, 4}, 0); }), "members");
  EXPECT_EQ(FieldOf([&] { SplitWeightSync(layout, nullptr, {4, 9}, 0); }), "plan");
  EXPECT_EQ(FieldOf([&] { SplitWeightSync(layout, plan, {4, 9, 11}, 0); }), "plan");
}

}  // namespace
}  // namespace rlsched::scheduler
