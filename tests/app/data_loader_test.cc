#include "data_loader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "rlsched/scheduler/orchestrator.h"

namespace rlsched::app {
namespace {

scheduler::SimulatorConfig Config(std::int64_t prompts_per_step, double oversample,
                                  std::int64_t max_staleness, std::int64_t dataset_prompts) {
  scheduler::SimulatorConfig config;
  config.orchestrator.mode = scheduler::Mode::kAsync;
  config.orchestrator.prompts_per_step = prompts_per_step;
  config.orchestrator.oversample = oversample;
  config.orchestrator.max_staleness = max_staleness;
  config.dataset_prompts = dataset_prompts;
  return config;
}

std::vector<std::int64_t> Ids(const std::optional<scheduler::PromptsAvailable>& event) {
  std::vector<std::int64_t> ids;
  if (event) {
    for (const auto& prompt : event->prompts) ids.push_back(prompt.id);
  }
  return ids;
}

TEST(DataLoaderTest, KeepsTheStalenessPlusThreeBatchesAheadAndABatchPerStep) {
  const auto config = Config(4, 0.5, 1, 10);  // a batch: ceil(1.5 x 4) = 6 prompts
  DataLoader loader(config, 0);
  const std::int64_t ahead = (scheduler::EffectiveStaleness(config.orchestrator) + 3) * 6;
  const auto first = Ids(loader.TopUp(0, 0));
  ASSERT_EQ(static_cast<std::int64_t>(first.size()), ahead);
  for (std::size_t i = 0; i < first.size(); ++i) EXPECT_EQ(first[i], std::int64_t(i) % 10);
  EXPECT_FALSE(loader.TopUp(0, 0));  // nothing due twice
  EXPECT_EQ(Ids(loader.TopUp(1, 0)).size(), 6u);
  EXPECT_EQ(Ids(loader.TopUp(1, 3)).size(), 3u);  // groups filtered mid-step: at once
  EXPECT_FALSE(loader.TopUp(1, 3));
  EXPECT_EQ(loader.posted(), ahead + 6 + 3);
  const auto next = loader.TopUp(2, 3);
  ASSERT_TRUE(next);
  for (const auto& prompt : next->prompts) {
    EXPECT_EQ(prompt.prompt_tokens, scheduler::WorkloadPromptTokens(config, prompt.id));
  }
}

TEST(DataLoaderTest, AResumedRunGetsTheRefillItsLogLost) {
  const auto config = Config(8, 0, 0, 1000);
  const std::int64_t ahead = (scheduler::EffectiveStaleness(config.orchestrator) + 3) * 8;
  // The log holds the first prompts and two steps' refills; the counters say three steps
  // finished and 2 groups filtered: the third refill and the filtered ones are due.
  DataLoader loader(config, ahead + 2 * 8);
  const auto ids = Ids(loader.TopUp(3, 2));
  ASSERT_EQ(ids.size(), 10u);
  EXPECT_EQ(ids.front(), ahead + 16);  // the dataset order goes on where the log ended
  // A log that holds all that is due: nothing more.
  DataLoader complete(config, ahead + 3 * 8 + 2);
  EXPECT_FALSE(complete.TopUp(3, 2));
}

// Property: however the counters' growth is split into calls, the prompts posted are the
// dataset in order, cycled, and as many as are due after the last call.
TEST(DataLoaderTest, PostsTheDatasetInOrderHoweverTheCallsFall) {
  std::mt19937_64 rng(20261206);
  for (int trial = 0; trial < 200; ++trial) {
    const auto config = Config(1 + std::int64_t(rng() % 16), double(rng() % 5) / 4,
                               std::int64_t(rng() % 3), 1 + std::int64_t(rng() % 50));
    const std::int64_t start = std::int64_t(rng() % 40);
    DataLoader loader(config, start);
    std::vector<std::int64_t> ids;
    std::int64_t steps = 0, filtered = 0;
    for (int call = 0; call < 30; ++call) {
      steps += std::int64_t(rng() % 3 == 0);
      filtered += std::int64_t(rng() % 4);
      const auto more = Ids(loader.TopUp(steps, filtered));
      ids.insert(ids.end(), more.begin(), more.end());
    }
    const std::int64_t per_batch = static_cast<std::int64_t>(
        std::ceil((1 + config.orchestrator.oversample) * config.orchestrator.prompts_per_step));
    const std::int64_t due = (scheduler::EffectiveStaleness(config.orchestrator) + 3) * per_batch +
                             steps * per_batch + filtered;
    ASSERT_EQ(loader.posted(), std::max(start, due)) << trial;
    ASSERT_EQ(static_cast<std::int64_t>(ids.size()), loader.posted() - start) << trial;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      ASSERT_EQ(ids[i], (start + std::int64_t(i)) % config.dataset_prompts) << trial;
    }
  }
}

}  // namespace
}  // namespace rlsched::app
