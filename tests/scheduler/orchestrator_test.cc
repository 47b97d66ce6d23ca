// Tests of the orchestrator's decision core: hand-computed scenarios, event
// validation, and property tests over random event interleavings (engines joining,
// leaving and failing, filters, interrupts), checking conservation and the staleness
// bound after every event and that the same seed gives the same command stream.

#include "rlsched/scheduler/orchestrator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "rlsched/common/error.h"
#include "rlsched/workload/workload.h"

namespace rlsched::scheduler {
namespace {

std::vector<Prompt> MakePrompts(std::int64_t first, std::int64_t n) {
  std::vector<Prompt> prompts;
  for (std::int64_t i = 0; i < n; ++i)
    prompts.push_back(Prompt{.id = first + i, .prompt_tokens = 10});
  return prompts;
}

template <typename T>
std::vector<T> All(const std::vector<Command>& commands) {
  std::vector<T> found;
  for (const Command& c : commands) {
    if (const T* x = std::get_if<T>(&c)) found.push_back(*x);
  }
  return found;
}

// One text line per event, for failure messages.
std::string DescribeEvent(const Event& event) {
  std::ostringstream s;
  std::visit(
      [&](const auto& e) {
        using T = std::decay_t<decltype(e)>;
        s << "t=" << e.time << " ";
        if constexpr (std::is_same_v<T, PromptsAvailable>) {
          s << "prompts " << e.prompts.size();
        } else if constexpr (std::is_same_v<T, EngineJoined>) {
          s << "joined e" << e.engine << " v" << e.version << " cap " << e.max_concurrent;
        } else if constexpr (std::is_same_v<T, EngineLeft>) {
          s << "left e" << e.engine;
        } else if constexpr (std::is_same_v<T, EngineFailed>) {
          s << "failed e" << e.engine;
        } else if constexpr (std::is_same_v<T, GenerationProgressed>) {
          s << "progress " << e.sample << " " << e.tokens;
        } else if constexpr (std::is_same_v<T, GenerationFinished>) {
          s << "finished " << e.sample << " " << e.tokens << " reward " << e.reward;
        } else if constexpr (std::is_same_v<T, GroupFiltered>) {
          s << "filtered group " << e.group;
        } else if constexpr (std::is_same_v<T, TrainStepFinished>) {
          s << "step done " << e.step << "." << e.call;
        } else if constexpr (std::is_same_v<T, WeightsLoaded>) {
          s << "loaded e" << e.engine << " v" << e.version;
        } else if constexpr (std::is_same_v<T, GenerationPaused>) {
          s << "paused e" << e.engine << " v" << e.version;
          for (const SampleProgress& p : e.samples) s << " " << p.sample << "/" << p.tokens;
        } else {
          s << "released e" << e.engine;
        }
      },
      event);
  return s.str();
}

// The last lines of a log, for failure messages.
std::string Tail(const std::vector<std::string>& log, std::size_t lines = 80) {
  std::string text;
  for (std::size_t i = log.size() > lines ? log.size() - lines : 0; i < log.size(); ++i) {
    text += log[i] + "\n";
  }
  return text;
}

// One text line per command, for comparing command streams.
std::string Describe(const Command& command) {
  std::ostringstream s;
  std::visit(
      [&](const auto& c) {
        using T = std::decay_t<decltype(c)>;
        if constexpr (std::is_same_v<T, Dispatch>) {
          s << "dispatch e" << c.engine << " v" << c.version;
          for (const SampleWork& w : c.samples) {
            s << " " << w.sample << "/" << w.resume_from << "/" << w.predicted_tokens;
          }
        } else if constexpr (std::is_same_v<T, Abort>) {
          s << "abort e" << c.engine;
          for (const auto x : c.samples) s << " " << x;
        } else if constexpr (std::is_same_v<T, SyncWeights>) {
          s << "sync e" << c.engine << " v" << c.version << (c.interrupt ? " interrupt" : "");
        } else if constexpr (std::is_same_v<T, Resume>) {
          s << "resume e" << c.engine << " v" << c.version;
          for (const auto x : c.samples) s << " " << x;
        } else if constexpr (std::is_same_v<T, Release>) {
          s << "release e" << c.engine;
        } else {
          s << "train " << c.step;
          if (c.call > 0) s << "." << c.call;
          for (const auto x : c.samples) s << " " << x;
        }
      },
      command);
  return s.str();
}

TEST(OrchestratorTest, SyncModeTimeline) {
  // One engine of 4 slots, P = 1 prompt × G = 2 samples, 2 steps.
  OrchestratorOptions options{
      {.mode = Mode::kSync, .prompts_per_step = 1, .samples_per_prompt = 2}};
  options.num_steps = 2;
  Orchestrator core(options);
  std::vector<Command> out;
  core.Handle(EngineJoined{.time = 0, .engine = 0, .max_concurrent = 4, .version = 0}, out);
  EXPECT_TRUE(out.empty());
  core.Handle(PromptsAvailable{.time = 0, .prompts = MakePrompts(100, 3)}, out);
  ASSERT_EQ(out.size(), 1u);
  auto d = std::get<Dispatch>(out[0]);
  EXPECT_EQ(d.engine, 0);
  EXPECT_EQ(d.version, 0);
  ASSERT_EQ(d.samples.size(), 2u);  // only batch 0's group: s = 0
  EXPECT_EQ(d.samples[0].sample, 0);
  EXPECT_EQ(d.samples[0].prompt, 100);
  EXPECT_EQ(d.samples[1].sample, 1);
  out.clear();
  core.Handle(GenerationFinished{.time = 3, .sample = 1, .tokens = 30, .reward = 1}, out);
  EXPECT_TRUE(out.empty());
  core.Handle(GenerationFinished{.time = 5, .sample = 0, .tokens = 50, .reward = 0}, out);
  ASSERT_EQ(out.size(), 1u);
  auto t = std::get<StartTrain>(out[0]);
  EXPECT_EQ(t.step, 0);
  EXPECT_EQ(t.groups, std::vector<std::int64_t>{0});
  EXPECT_EQ(t.samples, (std::vector<std::int64_t>{0, 1}));
  EXPECT_EQ(t.lengths, (std::vector<std::int64_t>{60, 40}));
  out.clear();
  core.Handle(TrainStepFinished{.time = 9, .step = 0}, out);
  ASSERT_EQ(out.size(), 1u);  // the idle engine syncs to version 1 first
  EXPECT_EQ(Describe(out[0]), "sync e0 v1");
  out.clear();
  core.Handle(WeightsLoaded{.time = 10, .engine = 0, .version = 1}, out);
  ASSERT_EQ(out.size(), 1u);
  d = std::get<Dispatch>(out[0]);
  EXPECT_EQ(d.version, 1);
  ASSERT_EQ(d.samples.size(), 2u);
  EXPECT_EQ(d.samples[0].prompt, 101);
  // The length predictor has seen 30 and 50: the median of the finished lengths.
  EXPECT_GE(d.samples[0].predicted_tokens, 30);
  EXPECT_LE(d.samples[0].predicted_tokens, 52);
  out.clear();
  core.Handle(GenerationFinished{.time = 12, .sample = 2, .tokens = 7, .reward = 0}, out);
  core.Handle(GenerationFinished{.time = 14, .sample = 3, .tokens = 8, .reward = 1}, out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(std::get<StartTrain>(out[0]).step, 1);
  out.clear();
  core.Handle(TrainStepFinished{.time = 20, .step = 1}, out);
  EXPECT_TRUE(core.done());
  core.CheckInvariants();

  const Metrics m = core.metrics(20);
  EXPECT_DOUBLE_EQ(m.elapsed_seconds, 20);
  EXPECT_DOUBLE_EQ(m.samples_per_second, 4.0 / 20);
  EXPECT_DOUBLE_EQ(m.trainer_idle_ratio, 1.0 - (4.0 + 6.0) / 20);  // trained [5,9], [14,20]
  // Engine busy [0,5] generating, [9,10] syncing, [10,14] generating.
  ASSERT_EQ(m.engine_idle_ratio.size(), 1u);
  EXPECT_DOUBLE_EQ(m.engine_idle_ratio[0], 1.0 - 10.0 / 20);
  EXPECT_EQ(m.weight_syncs, 1);
  EXPECT_DOUBLE_EQ(m.weight_sync_seconds, 1);
  EXPECT_DOUBLE_EQ(m.seconds_per_weight_sync, 1);
  // Two steps finished in 20 s; the trainer waited 20 − 4 − 6 = 10 s for batches.
  EXPECT_DOUBLE_EQ(m.seconds_per_step, 10);
  EXPECT_DOUBLE_EQ(m.trainer_wait_seconds_per_step, 5);
  // After the warm-up step (the default 1), step 1: the engines generated in [10, 14],
  // the trainer trained 6 s, and the step took 11 s, 1 s of it the weight sync (the
  // switch).
  EXPECT_DOUBLE_EQ(m.generation_seconds_per_step, 4);
  EXPECT_DOUBLE_EQ(m.train_seconds_per_step, 6);
  EXPECT_DOUBLE_EQ(m.switch_seconds_per_step, 1);
  EXPECT_DOUBLE_EQ(m.steady_seconds_per_step, 11);
  EXPECT_EQ(m.staleness_histogram, std::vector<std::int64_t>{4});
  EXPECT_EQ(core.counters().trained, 4);
  EXPECT_EQ(core.counters().trained_tokens, 60 + 40 + 17 + 18);
}

TEST(OrchestratorTest, OversampledLeftoversRestartInSyncMode) {
  // r = 1: two groups for one place; the slower group's tokens are from version 0,
  // too old for batch 1 at s = 0, so it is aborted and generated again.
  Orchestrator core(OrchestratorOptions{
      {.mode = Mode::kSync, .oversample = 1.0, .prompts_per_step = 1, .samples_per_prompt = 1}});
  std::vector<Command> out;
  core.Handle(EngineJoined{.time = 0, .engine = 0, .max_concurrent = 2, .version = 0}, out);
  core.Handle(PromptsAvailable{.time = 0, .prompts = MakePrompts(0, 4)}, out);
  ASSERT_EQ(All<Dispatch>(out).at(0).samples.size(), 2u);
  out.clear();
  core.Handle(GenerationProgressed{.time = 1, .sample = 1, .tokens = 5}, out);
  core.Handle(GenerationFinished{.time = 2, .sample = 0, .tokens = 9, .reward = 0}, out);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(Describe(out[0]), "abort e0 1");
  EXPECT_EQ(Describe(out[1]), "train 0 0");
  EXPECT_EQ(core.counters().restarts, 1);
  EXPECT_EQ(core.counters().discarded_tokens, 5);
  EXPECT_EQ(core.counters().queued, 1);  // waits for version 1
  core.CheckInvariants();
}

TEST(OrchestratorTest, PartialRolloutRecordsVersionSpans) {
  Orchestrator core(OrchestratorOptions{{.mode = Mode::kAsync,
                                         .max_staleness = 1,
                                         .partial_rollout = true,
                                         .prompts_per_step = 1,
                                         .samples_per_prompt = 1}});
  std::vector<Command> out;
  core.Handle(EngineJoined{.time = 0, .engine = 0, .max_concurrent = 2, .version = 0}, out);
  core.Handle(PromptsAvailable{.time = 0, .prompts = MakePrompts(0, 10)}, out);
  // s = 1: batches 0 and 1 may both start under version 0.
  ASSERT_EQ(All<Dispatch>(out).at(0).samples.size(), 2u);
  out.clear();
  core.Handle(GenerationFinished{.time = 1, .sample = 0, .tokens = 4, .reward = 0}, out);
  EXPECT_EQ(Describe(out.at(0)), "train 0 0");
  out.clear();
  core.Handle(TrainStepFinished{.time = 2, .step = 0}, out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(Describe(out[0]), "sync e0 v1 interrupt");
  out.clear();
  core.Handle(GenerationProgressed{.time = 2.5, .sample = 1, .tokens = 6}, out);
  core.Handle(WeightsLoaded{.time = 3, .engine = 0, .version = 1}, out);
  ASSERT_GE(out.size(), 1u);
  EXPECT_EQ(Describe(out[0]), "resume e0 v1 1");
  out.clear();
  core.Handle(GenerationFinished{.time = 4, .sample = 1, .tokens = 10, .reward = 0}, out);
  const auto trains = All<StartTrain>(out);
  ASSERT_EQ(trains.size(), 1u);
  EXPECT_EQ(trains[0].step, 1);
  ASSERT_EQ(core.last_batch().size(), 1u);
  const TrainedSample& x = core.last_batch()[0];
  EXPECT_EQ(x.response_tokens, 10);
  ASSERT_EQ(x.spans.size(), 2u);
  EXPECT_EQ(x.spans[0].version, 0);
  EXPECT_EQ(x.spans[0].first_token, 0);
  EXPECT_EQ(x.spans[1].version, 1);
  EXPECT_EQ(x.spans[1].first_token, 6);
  EXPECT_EQ(core.counters().partial_samples, 1);
  EXPECT_EQ(core.metrics(4).staleness_histogram, (std::vector<std::int64_t>{1, 1}));
  core.CheckInvariants();
}

// Async s = 1 with partial rollout and pause mode abort, P prompts of one sample.
OrchestratorOptions AbortingOptions(std::int64_t prompts_per_step) {
  return OrchestratorOptions{{.mode = Mode::kAsync,
                              .max_staleness = 1,
                              .partial_rollout = true,
                              .pause_mode = PauseMode::kAbort,
                              .prompts_per_step = prompts_per_step,
                              .samples_per_prompt = 1}};
}

// Pause mode abort, one sample per step: engine 0 runs samples 0 and 1, 0 finishes and
// trains, and step 0's end syncs engine 0 (its SyncWeights in `out`).
Orchestrator AbortingAtTheFirstSync(std::vector<Command>& out) {
  Orchestrator core(AbortingOptions(1));
  core.Handle(EngineJoined{.time = 0, .engine = 0, .max_concurrent = 2, .version = 0}, out);
  core.Handle(PromptsAvailable{.time = 0, .prompts = MakePrompts(0, 10)}, out);
  core.Handle(GenerationFinished{.time = 1, .sample = 0, .tokens = 4, .reward = 0}, out);
  out.clear();
  core.Handle(TrainStepFinished{.time = 2, .step = 0}, out);
  return core;
}

// Pause mode abort: the interrupting sync says so; the engine forgets the paused
// sample once it reported it, and after WeightsLoaded the core dispatches it to the same
// engine again from its tokens (no Resume), even with another engine free.
TEST(OrchestratorTest, AbortPauseResubmitsPausedSamplesToTheirEngine) {
  std::vector<Command> out;
  Orchestrator core = AbortingAtTheFirstSync(out);
  const auto syncs = All<SyncWeights>(out);
  ASSERT_EQ(syncs.size(), 1u);
  EXPECT_TRUE(syncs[0].interrupt);
  EXPECT_EQ(syncs[0].pause, PauseMode::kAbort);
  out.clear();
  core.Handle(GenerationPaused{.time = 2.5,
                               .engine = 0,
                               .version = 1,
                               .samples = {SampleProgress{.sample = 1, .tokens = 6}}},
              out);
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(core.counters().in_flight, 1);  // still engine 0's, to be resubmitted
  core.CheckInvariants();
  // A second engine, already on version 1, gets new work (batch 2), not sample 1.
  core.Handle(EngineJoined{.time = 2.6, .engine = 1, .max_concurrent = 1, .version = 1}, out);
  ASSERT_EQ(All<Dispatch>(out).size(), 1u);
  EXPECT_EQ(Describe(All<Dispatch>(out)[0]).rfind("dispatch e1 v1 2/0/", 0), 0u)
      << Describe(All<Dispatch>(out)[0]);
  out.clear();
  core.Handle(WeightsLoaded{.time = 3, .engine = 0, .version = 1}, out);
  EXPECT_TRUE(All<Resume>(out).empty());
  ASSERT_EQ(All<Dispatch>(out).size(), 1u);
  EXPECT_EQ(Describe(All<Dispatch>(out)[0]).rfind("dispatch e0 v1 1/6/", 0), 0u)
      << Describe(All<Dispatch>(out)[0]);
  EXPECT_EQ(core.counters().resubmitted, 1);
  out.clear();
  core.Handle(GenerationFinished{.time = 4, .sample = 1, .tokens = 10, .reward = 0}, out);
  ASSERT_EQ(All<StartTrain>(out).size(), 1u);
  ASSERT_EQ(core.last_batch().size(), 1u);
  const TrainedSample& x = core.last_batch()[0];
  ASSERT_EQ(x.spans.size(), 2u);
  EXPECT_EQ(x.spans[0].version, 0);
  EXPECT_EQ(x.spans[1].version, 1);
  EXPECT_EQ(x.spans[1].first_token, 6);
  EXPECT_EQ(core.counters().partial_samples, 1);
  EXPECT_EQ(core.counters().discarded_tokens, 0);
  core.CheckInvariants();
}

// Pause mode abort with one GenerationProgressed per paused sample: the same
// resubmission at WeightsLoaded; a filtered group's sample already reported gets no
// Abort (its engine forgot it).
TEST(OrchestratorTest, AbortPauseWithPerSampleReportsResubmitsAtWeightsLoaded) {
  Orchestrator core(AbortingOptions(2));
  std::vector<Command> out;
  core.Handle(EngineJoined{.time = 0, .engine = 0, .max_concurrent = 4, .version = 0}, out);
  core.Handle(PromptsAvailable{.time = 0, .prompts = MakePrompts(0, 10)}, out);
  ASSERT_EQ(All<Dispatch>(out).at(0).samples.size(), 4u);  // batches 0 and 1 (s = 1)
  out.clear();
  core.Handle(GenerationFinished{.time = 1, .sample = 0, .tokens = 4, .reward = 0}, out);
  core.Handle(GenerationFinished{.time = 1, .sample = 1, .tokens = 4, .reward = 0}, out);
  out.clear();
  core.Handle(TrainStepFinished{.time = 2, .step = 0}, out);
  ASSERT_EQ(All<SyncWeights>(out).size(), 1u);
  out.clear();
  // In flight: 2 and 3 (batch 1), reported one by one.
  core.Handle(GenerationProgressed{.time = 2.5, .sample = 2, .tokens = 6}, out);
  core.Handle(GenerationProgressed{.time = 2.5, .sample = 3, .tokens = 3}, out);
  core.Handle(GroupFiltered{.time = 2.6, .group = 3}, out);
  EXPECT_TRUE(All<Abort>(out).empty());
  out.clear();
  core.Handle(WeightsLoaded{.time = 3, .engine = 0, .version = 1}, out);
  EXPECT_TRUE(All<Resume>(out).empty());
  EXPECT_EQ(core.counters().resubmitted, 1);
  ASSERT_FALSE(All<Dispatch>(out).empty());
  const Dispatch d = All<Dispatch>(out)[0];
  EXPECT_EQ(d.engine, 0);
  EXPECT_EQ(d.version, 1);
  ASSERT_FALSE(d.samples.empty());
  EXPECT_EQ(d.samples[0].sample, 2);
  EXPECT_EQ(d.samples[0].resume_from, 6);
  core.CheckInvariants();
}

// Pause mode abort: an engine lost after it returned its paused samples' tokens and
// before it loaded hands them to the queue with their tokens (returned, so kept even
// without keep_partial_on_failure), for any engine.
TEST(OrchestratorTest, AbortPauseTokensSurviveTheEnginesLoss) {
  std::vector<Command> out;
  Orchestrator core = AbortingAtTheFirstSync(out);
  core.Handle(GenerationPaused{.time = 2.5,
                               .engine = 0,
                               .version = 1,
                               .samples = {SampleProgress{.sample = 1, .tokens = 6}}},
              out);
  out.clear();
  core.Handle(EngineFailed{.time = 2.7, .engine = 0}, out);
  EXPECT_EQ(core.counters().discarded_tokens, 0);
  EXPECT_EQ(core.counters().restarts, 0);
  core.Handle(EngineJoined{.time = 2.8, .engine = 1, .max_concurrent = 1, .version = 1}, out);
  ASSERT_EQ(All<Dispatch>(out).size(), 1u);
  EXPECT_EQ(Describe(All<Dispatch>(out)[0]).rfind("dispatch e1 v1 1/6/", 0), 0u)
      << Describe(All<Dispatch>(out)[0]);
  core.CheckInvariants();
}

// An engine's account of its tokens' versions: checked against what the engine can have
// held (a refused report names the field and changes nothing), recorded in place of the
// core's inference where it differs (counted), and joined to the tokens a sample kept
// from another engine.
TEST(OrchestratorTest, EngineAccountsOfVersionsAreCheckedAndRecorded) {
  Orchestrator core(OrchestratorOptions{{.mode = Mode::kAsync,
                                         .max_staleness = 1,
                                         .partial_rollout = true,
                                         .prompts_per_step = 1,
                                         .samples_per_prompt = 1}});
  std::vector<Command> out;
  core.Handle(EngineJoined{.time = 0, .engine = 0, .max_concurrent = 2, .version = 0}, out);
  core.Handle(PromptsAvailable{.time = 0, .prompts = MakePrompts(0, 10)}, out);
  out.clear();
  core.Handle(GenerationFinished{.time = 1,
                                 .sample = 0,
                                 .tokens = 4,
                                 .reward = 0,
                                 .spans = {{.version = 0, .first_token = 0}}},
              out);
  EXPECT_EQ(core.counters().version_reports, 1);
  EXPECT_EQ(core.counters().version_corrections, 0);
  out.clear();
  core.Handle(TrainStepFinished{.time = 2, .step = 0}, out);
  ASSERT_EQ(Describe(out.at(0)), "sync e0 v1 interrupt");
  out.clear();
  // Accounts no engine could give: each refused, naming the field, the state unchanged.
  const auto refused = [&](EngineSpans spans, std::int64_t tokens, const std::string& field) {
    SCOPED_TRACE(field);
    const std::string before = std::to_string(core.counters().version_reports);
    try {
      core.Handle(GenerationPaused{.time = 2.5,
                                   .engine = 0,
                                   .version = 1,
                                   .samples = {{.sample = 1, .tokens = tokens, .spans = spans}}},
                  out);
      ADD_FAILURE() << "accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
    EXPECT_EQ(std::to_string(core.counters().version_reports), before);
    EXPECT_TRUE(out.empty());
  };
  refused({{.version = 2, .first_token = 0}}, 6, "samples[0].spans[0].version");  // never held
  refused({{.version = 0, .first_token = 1}}, 6, "samples[0].spans[0].first_token");
  refused({{.version = 0, .first_token = 0}, {.version = 0, .first_token = 3}}, 6,
          "samples[0].spans[1].version");  // not ascending
  refused({{.version = 0, .first_token = 0}, {.version = 1, .first_token = 6}}, 6,
          "samples[0].spans[1].first_token");                          // a span without a token
  refused({{.version = 0, .first_token = 0}}, 0, "samples[0].spans");  // no token at all
  EXPECT_THROW(
      core.Handle(
          GenerationProgressed{
              .time = 2.5, .sample = 1, .tokens = 6, .spans = {{.version = -1, .first_token = 0}}},
          out),
      std::invalid_argument);
  core.CheckInvariants();
  // The honest pause report: as the core infers it.
  core.Handle(
      GenerationPaused{
          .time = 2.5,
          .engine = 0,
          .version = 1,
          .samples = {{.sample = 1, .tokens = 6, .spans = {{.version = 0, .first_token = 0}}}}},
      out);
  EXPECT_EQ(core.counters().version_reports, 2);
  EXPECT_EQ(core.counters().version_corrections, 0);
  core.Handle(WeightsLoaded{.time = 3, .engine = 0, .version = 1}, out);
  ASSERT_EQ(Describe(out.at(0)), "resume e0 v1 1");
  out.clear();
  // The engine says it switched to version 1 at token 8, not 6: recorded, counted.
  core.Handle(GenerationFinished{.time = 4,
                                 .sample = 1,
                                 .tokens = 10,
                                 .reward = 0,
                                 .spans = {{.version = 0, .first_token = 0},
                                           {.version = 1, .first_token = 8}}},
              out);
  EXPECT_EQ(core.counters().version_reports, 3);
  EXPECT_EQ(core.counters().version_corrections, 1);
  ASSERT_EQ(All<StartTrain>(out).size(), 1u);
  const TrainedSample& x = core.last_batch().at(0);
  ASSERT_EQ(x.spans.size(), 2u);
  EXPECT_EQ(x.spans[1].version, 1);
  EXPECT_EQ(x.spans[1].first_token, 8);
  // Step 0 trained 4 tokens of version 0; step 1: 8 of version 0 (age 1), 2 of version 1.
  EXPECT_EQ(core.metrics(4).token_staleness_histogram, (std::vector<std::int64_t>{6, 8}));
  core.CheckInvariants();

  // A sample resumed on another engine: that engine's account starts at resume_from,
  // joined to the versions of the tokens kept.
  Orchestrator moved(OrchestratorOptions{
      {.mode = Mode::kAsync, .max_staleness = 1, .prompts_per_step = 1, .samples_per_prompt = 1}});
  out.clear();
  moved.Handle(EngineJoined{.time = 0, .engine = 0, .max_concurrent = 1, .version = 0}, out);
  moved.Handle(PromptsAvailable{.time = 0, .prompts = MakePrompts(0, 2)}, out);
  moved.Handle(
      GenerationProgressed{
          .time = 1, .sample = 0, .tokens = 5, .spans = {{.version = 0, .first_token = 0}}},
      out);
  moved.Handle(EngineLeft{.time = 2, .engine = 0}, out);
  out.clear();
  moved.Handle(EngineJoined{.time = 3, .engine = 1, .max_concurrent = 1, .version = 0}, out);
  ASSERT_EQ(All<Dispatch>(out).at(0).samples.at(0).resume_from, 5);
  EXPECT_THROW(
      moved.Handle(
          GenerationFinished{
              .time = 4, .sample = 0, .tokens = 9, .spans = {{.version = 0, .first_token = 0}}},
          out),
      std::invalid_argument);
  moved.Handle(
      GenerationFinished{
          .time = 4, .sample = 0, .tokens = 9, .spans = {{.version = 0, .first_token = 5}}},
      out);
  EXPECT_EQ(moved.counters().version_reports, 2);
  EXPECT_EQ(moved.counters().version_corrections, 0);
  ASSERT_EQ(moved.last_batch().size(), 1u);
  ASSERT_EQ(moved.last_batch()[0].spans.size(), 1u);
  EXPECT_EQ(moved.last_batch()[0].spans[0].first_token, 0);
  moved.CheckInvariants();
}

// Strict: an engine's account can make a sample older than the core inferred (it was
// paused before its first token, so the core dropped the version it was dispatched
// under, but the engine says it generated its first tokens with it). A leftover that the
// account makes too old for the next batch is generated again, as the strict policy
// does with any leftover too old.
TEST(OrchestratorTest, AnAccountTooOldForTheStrictBoundRestartsTheSample) {
  Orchestrator core(OrchestratorOptions{{.mode = Mode::kAsync,
                                         .max_staleness = 1,
                                         .staleness_policy = StalenessPolicy::kStrict,
                                         .partial_rollout = true,
                                         .prompts_per_step = 1,
                                         .samples_per_prompt = 1}});
  std::vector<Command> out;
  core.Handle(EngineJoined{.time = 0, .engine = 0, .max_concurrent = 1, .version = 0}, out);
  core.Handle(EngineJoined{.time = 0, .engine = 1, .max_concurrent = 1, .version = 0}, out);
  core.Handle(PromptsAvailable{.time = 0, .prompts = MakePrompts(0, 10)}, out);
  out.clear();
  core.Handle(GenerationFinished{.time = 1, .sample = 0, .tokens = 4}, out);
  core.Handle(TrainStepFinished{.time = 2, .step = 0}, out);
  out.clear();
  // Engine 0 was idle; engine 1 paused sample 1 before its first token (so the core
  // drops version 0 from it).
  core.Handle(
      GenerationPaused{
          .time = 2.5, .engine = 1, .version = 1, .samples = {{.sample = 1, .tokens = 0}}},
      out);
  core.Handle(WeightsLoaded{.time = 3, .engine = 0, .version = 1}, out);
  core.Handle(WeightsLoaded{.time = 3, .engine = 1, .version = 1}, out);
  ASSERT_EQ(out.size(), 2u);
  ASSERT_EQ(Describe(out[0]), "dispatch e0 v1 2/0/4");
  ASSERT_EQ(Describe(out[1]), "resume e1 v1 1");
  out.clear();
  // Sample 2 (batch 2, version 1) finishes first and closes batch 1: sample 1 is left
  // over for batch 2, its tokens of version 1 as far as the core knows.
  core.Handle(GenerationFinished{.time = 4, .sample = 2, .tokens = 5}, out);
  ASSERT_EQ(All<StartTrain>(out).size(), 1u);
  ASSERT_EQ(All<StartTrain>(out)[0].samples, (std::vector<std::int64_t>{2}));
  out.clear();
  core.CheckInvariants();
  // The engine says its first 2 tokens were of version 0: too old for batch 2 (s = 1).
  core.Handle(GenerationFinished{.time = 5,
                                 .sample = 1,
                                 .tokens = 10,
                                 .spans = {{.version = 0, .first_token = 0},
                                           {.version = 1, .first_token = 2}}},
              out);
  const Counters& c = core.counters();
  EXPECT_EQ(c.version_reports, 1);
  EXPECT_EQ(c.version_corrections, 1);
  EXPECT_EQ(c.stale_restarts, 1);
  EXPECT_EQ(c.stale_discarded_tokens, 10);
  EXPECT_EQ(c.restarts, 1);
  EXPECT_EQ(c.buffered, 0);
  bool redispatched = false;
  for (const Dispatch& d : All<Dispatch>(out)) {
    for (const SampleWork& w : d.samples) redispatched |= w.sample == 1 && w.resume_from == 0;
  }
  EXPECT_TRUE(redispatched);
  core.CheckInvariants();
}

// A sample paused before its first token has no token of the version it was
// dispatched under: it carries one span, of the version it resumed under, is not a
// partial sample and is as fresh as that version. One that finishes right after its
// resume has no token of the new version: one span, of the old one.
TEST(OrchestratorTest, AVersionWithoutATokenLeavesNoSpan) {
  for (const std::int64_t paused_at : {0, 6}) {
    SCOPED_TRACE("paused at token " + std::to_string(paused_at));
    Orchestrator core(OrchestratorOptions{{.mode = Mode::kAsync,
                                           .max_staleness = 1,
                                           .staleness_policy = StalenessPolicy::kStrict,
                                           .partial_rollout = true,
                                           .prompts_per_step = 1,
                                           .samples_per_prompt = 1}});
    std::vector<Command> out;
    core.Handle(EngineJoined{.time = 0, .engine = 0, .max_concurrent = 2, .version = 0}, out);
    core.Handle(PromptsAvailable{.time = 0, .prompts = MakePrompts(0, 10)}, out);
    core.Handle(GenerationFinished{.time = 1, .sample = 0, .tokens = 4, .reward = 0}, out);
    out.clear();
    core.Handle(TrainStepFinished{.time = 2, .step = 0}, out);
    ASSERT_EQ(Describe(out.at(0)), "sync e0 v1 interrupt");
    out.clear();
    core.Handle(GenerationPaused{.time = 2.5,
                                 .engine = 0,
                                 .version = 1,
                                 .samples = {{.sample = 1, .tokens = paused_at}}},
                out);
    core.Handle(WeightsLoaded{.time = 3, .engine = 0, .version = 1}, out);
    ASSERT_EQ(Describe(out.at(0)), "resume e0 v1 1");
    out.clear();
    core.CheckInvariants();
    const std::int64_t total = paused_at == 0 ? 10 : paused_at;  // 6: no token after resume
    core.Handle(GenerationFinished{.time = 4, .sample = 1, .tokens = total, .reward = 0}, out);
    ASSERT_EQ(All<StartTrain>(out).size(), 1u);
    const TrainedSample& x = core.last_batch().at(0);
    ASSERT_EQ(x.spans.size(), 1u);
    EXPECT_EQ(x.spans[0].version, paused_at == 0 ? 1 : 0);
    EXPECT_EQ(x.spans[0].first_token, 0);
    EXPECT_EQ(core.counters().partial_samples, 0);
    EXPECT_EQ(core.counters().restarts, 0);
    const Metrics m = core.metrics(4);
    // Sample 0 at age 0; sample 1 at age 0 (all its tokens of version 1) or 1.
    const std::vector<std::int64_t> by_sample =
        paused_at == 0 ? std::vector<std::int64_t>{2} : std::vector<std::int64_t>{1, 1};
    const std::vector<std::int64_t> by_token = paused_at == 0
                                                   ? std::vector<std::int64_t>{4 + 10}
                                                   : std::vector<std::int64_t>{4, paused_at};
    EXPECT_EQ(m.staleness_histogram, by_sample);
    EXPECT_EQ(m.token_staleness_histogram, by_token);
    core.CheckInvariants();
  }
}

// A long sample admitted for batch 1 under version 0 is overtaken by a short one
// admitted for batch 2 under version 1. At s = 1 its version-0 tokens could not go
// into batch 2: the strict policy makes batch 1 wait for it and gives its engine no
// younger work meanwhile (no token discarded, staleness 1); the admission policy closes batch 1
// with the short one and keeps the long sample's tokens: it trains at step 2 with tokens of
// versions 0, 1 and 2.
void RunOvertakenSample(StalenessPolicy policy) {
  Orchestrator core(OrchestratorOptions{{.mode = Mode::kAsync,
                                         .max_staleness = 1,
                                         .staleness_policy = policy,
                                         .partial_rollout = true,
                                         .prompts_per_step = 1,
                                         .samples_per_prompt = 1}});
  std::vector<Command> out;
  core.Handle(EngineJoined{.time = 0, .engine = 0, .max_concurrent = 4, .version = 0}, out);
  core.Handle(PromptsAvailable{.time = 0, .prompts = MakePrompts(0, 3)}, out);
  ASSERT_EQ(Describe(out.at(0)), "dispatch e0 v0 0/0/1024 1/0/1024");  // batches 0 and 1
  out.clear();
  core.Handle(GenerationFinished{.time = 1, .sample = 0, .tokens = 4, .reward = 0}, out);
  ASSERT_EQ(Describe(out.at(0)), "train 0 0");
  out.clear();
  core.Handle(TrainStepFinished{.time = 2, .step = 0}, out);
  ASSERT_EQ(Describe(out.at(0)), "sync e0 v1 interrupt");
  core.Handle(GenerationProgressed{.time = 2, .sample = 1, .tokens = 5}, out);
  out.clear();
  core.Handle(WeightsLoaded{.time = 3, .engine = 0, .version = 1}, out);
  if (policy == StalenessPolicy::kStrict) {
    // Batch 1 waits for sample 1 (its version-0 tokens could not go into batch 2), so
    // its engine takes no younger work until it finishes: nothing slows it down, and
    // nothing is discarded.
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(Describe(out[0]), "resume e0 v1 1");
    out.clear();
    core.Handle(GenerationProgressed{.time = 4, .sample = 1, .tokens = 7}, out);
    core.Handle(GenerationFinished{.time = 5, .sample = 1, .tokens = 8, .reward = 0}, out);
    ASSERT_EQ(out.size(), 2u);
    EXPECT_EQ(Describe(out[0]), "train 1 1");
    EXPECT_EQ(std::get<Dispatch>(out[1]).samples.at(0).sample, 2);  // batch 2, version 1
    out.clear();
    core.Handle(GenerationFinished{.time = 6, .sample = 2, .tokens = 3, .reward = 0}, out);
    EXPECT_TRUE(out.empty());  // batch 2 closed; the trainer is busy
    core.Handle(TrainStepFinished{.time = 7, .step = 1}, out);
    ASSERT_EQ(Describe(out.at(0)), "train 2 2");
    EXPECT_EQ(core.counters().restarts, 0);
    EXPECT_EQ(core.counters().stale_discarded_tokens, 0);
    EXPECT_EQ(core.metrics(7).max_staleness, 1);
    core.CheckInvariants();
    return;
  }
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(Describe(out[0]), "resume e0 v1 1");
  EXPECT_EQ(std::get<Dispatch>(out[1]).samples.at(0).sample, 2);  // batch 2, version 1
  out.clear();
  core.Handle(GenerationFinished{.time = 4, .sample = 2, .tokens = 3, .reward = 0}, out);
  core.CheckInvariants();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(Describe(out[0]), "train 1 2");
  out.clear();
  core.Handle(TrainStepFinished{.time = 5, .step = 1}, out);
  ASSERT_EQ(Describe(out.at(0)), "sync e0 v2 interrupt");
  core.Handle(GenerationProgressed{.time = 5, .sample = 1, .tokens = 9}, out);
  core.Handle(WeightsLoaded{.time = 6, .engine = 0, .version = 2}, out);
  out.clear();
  core.Handle(GenerationFinished{.time = 7, .sample = 1, .tokens = 12, .reward = 0}, out);
  ASSERT_EQ(Describe(out.at(0)), "train 2 1");
  const TrainedSample& x = core.last_batch().at(0);
  ASSERT_EQ(x.spans.size(), 3u);
  EXPECT_EQ(x.spans[1].first_token, 5);
  EXPECT_EQ(x.spans[2].first_token, 9);
  const Counters& c = core.counters();
  EXPECT_EQ(c.restarts, 0);
  EXPECT_EQ(c.discarded_tokens, 0);
  EXPECT_EQ(c.stale_restarts, 0);
  const Metrics m = core.metrics(7);
  // Samples by their oldest token: 0 and 2 at age 0, 1 at age 2 (over s = 1).
  EXPECT_EQ(m.staleness_histogram, (std::vector<std::int64_t>{2, 0, 1}));
  EXPECT_EQ(m.max_staleness, 2);
  // Tokens: 4 + 3 fresh, and sample 1's 3 of version 2, 4 of version 1, 5 of version 0.
  EXPECT_EQ(m.token_staleness_histogram, (std::vector<std::int64_t>{4 + 3 + 3, 4, 5}));
  core.CheckInvariants();
}

TEST(OrchestratorTest, StrictPolicyWaitsForAnOvertakenSample) {
  RunOvertakenSample(StalenessPolicy::kStrict);
}

TEST(OrchestratorTest, AdmissionPolicyKeepsAnOvertakenSamplesTokens) {
  RunOvertakenSample(StalenessPolicy::kAdmission);
}

TEST(OrchestratorTest, FilterRefillsTheBatch) {
  OrchestratorOptions options{
      {.mode = Mode::kSync, .prompts_per_step = 1, .samples_per_prompt = 2}};
  options.filter = KeepUnlessAllEqual;
  Orchestrator core(options);
  std::vector<Command> out;
  core.Handle(EngineJoined{.time = 0, .engine = 0, .max_concurrent = 8, .version = 0}, out);
  core.Handle(PromptsAvailable{.time = 0, .prompts = MakePrompts(0, 5)}, out);
  out.clear();
  core.Handle(GenerationFinished{.time = 1, .sample = 0, .tokens = 3, .reward = 1}, out);
  core.Handle(GenerationFinished{.time = 2, .sample = 1, .tokens = 3, .reward = 1}, out);
  // All equal: filtered; a new group replaces it.
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(Describe(out[0]), "dispatch e0 v0 2/0/3 3/0/3");
  EXPECT_EQ(core.counters().filtered_groups, 1);
  core.CheckInvariants();
  out.clear();
  core.Handle(GroupFiltered{.time = 3, .group = 1}, out);  // an external judgement
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(Describe(out[0]), "abort e0 2 3");
  EXPECT_EQ(std::get<Dispatch>(out[1]).samples.size(), 2u);
  EXPECT_THROW(core.Handle(GroupFiltered{.time = 4, .group = 1}, out), std::invalid_argument);
  core.CheckInvariants();
}

TEST(OrchestratorTest, FailedEngineRequeuesItsWork) {
  Orchestrator core(OrchestratorOptions{{.mode = Mode::kAsync,
                                         .max_staleness = 2,
                                         .prompts_per_step = 1,
                                         .samples_per_prompt = 2,
                                         .keep_partial_on_failure = false}});
  std::vector<Command> out;
  core.Handle(EngineJoined{.time = 0, .engine = 3, .max_concurrent = 2, .version = 0}, out);
  core.Handle(PromptsAvailable{.time = 0, .prompts = MakePrompts(0, 1)}, out);
  core.Handle(GenerationProgressed{.time = 1, .sample = 0, .tokens = 5}, out);
  out.clear();
  core.Handle(EngineFailed{.time = 2, .engine = 3}, out);
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(core.counters().queued, 2);
  EXPECT_EQ(core.counters().discarded_tokens, 5);
  core.Handle(EngineJoined{.time = 3, .engine = 4, .max_concurrent = 2}, out);
  EXPECT_EQ(Describe(out.at(0)), "sync e4 v0");  // no weights yet
  out.clear();
  core.Handle(WeightsLoaded{.time = 4, .engine = 4, .version = 0}, out);
  EXPECT_EQ(Describe(out.at(0)), "dispatch e4 v0 0/0/1024 1/0/1024");
  core.CheckInvariants();
}

TEST(OrchestratorTest, InvalidEventsNameTheFieldAndChangeNothing) {
  Orchestrator core(OrchestratorOptions{{.prompts_per_step = 1, .samples_per_prompt = 1}});
  std::vector<Command> out;
  core.Handle(EngineJoined{.time = 5, .engine = 0, .max_concurrent = 1, .version = 0}, out);
  auto expect_error = [&](const Event& e, const std::string& field) {
    try {
      core.Handle(e, out);
      ADD_FAILURE() << "no error for " << field;
    } catch (const std::invalid_argument& error) {
      EXPECT_EQ(std::string(error.what()).rfind(field + ":", 0), 0u) << error.what();
    }
    core.CheckInvariants();
  };
  expect_error(PromptsAvailable{.time = 4}, "time");
  expect_error(EngineJoined{.time = 5, .engine = 0, .max_concurrent = 1}, "engine");
  expect_error(EngineJoined{.time = 5, .engine = -1, .max_concurrent = 1}, "engine");
  expect_error(EngineJoined{.time = 5, .engine = 1, .max_concurrent = 0}, "max_concurrent");
  expect_error(EngineJoined{.time = 5, .engine = 1, .max_concurrent = 1, .version = 3}, "version");
  expect_error(EngineLeft{.time = 5, .engine = 7}, "engine");
  expect_error(GenerationFinished{.time = 5, .sample = 0, .tokens = 1}, "sample");
  expect_error(TrainStepFinished{.time = 5, .step = 0}, "step");
  expect_error(WeightsLoaded{.time = 5, .engine = 0, .version = 0}, "version");
  expect_error(PromptsAvailable{.time = 5, .prompts = {Prompt{.id = 1, .prompt_tokens = -1}}},
               "prompts.prompt_tokens");
  core.Handle(PromptsAvailable{.time = 5, .prompts = MakePrompts(0, 1)}, out);
  expect_error(GenerationFinished{.time = 6, .sample = 0, .tokens = -1}, "tokens");
  expect_error(GroupFiltered{.time = 6, .group = 9}, "group");
  EXPECT_EQ(core.counters().in_flight, 1);
}

// A report that names its engine is taken only for samples in flight there: an engine
// cannot finish, advance or filter another engine's work (nor a report go past the
// response cap); each refusal names the field and changes nothing.
TEST(OrchestratorTest, ReportsAreBoundToTheEngineRunningTheSample) {
  Orchestrator core(OrchestratorOptions{{.mode = Mode::kAsync,
                                         .prompts_per_step = 2,
                                         .samples_per_prompt = 2,
                                         .max_response_tokens = 100}});
  std::vector<Command> out;
  core.Handle(EngineJoined{.time = 0, .engine = 0, .max_concurrent = 2, .version = 0}, out);
  core.Handle(EngineJoined{.time = 0, .engine = 1, .max_concurrent = 2, .version = 0}, out);
  core.Handle(PromptsAvailable{.time = 0, .prompts = MakePrompts(0, 2)}, out);
  std::map<std::int64_t, std::int64_t> on;  // sample -> engine
  for (const Dispatch& d : All<Dispatch>(out)) {
    for (const SampleWork& w : d.samples) on[w.sample] = d.engine;
  }
  ASSERT_EQ(on.size(), 4u);
  const std::int64_t sample = on.begin()->first;
  const std::int64_t owner = on.begin()->second;
  const std::int64_t other = 1 - owner;
  const auto refused = [&](const Event& e, const std::string& field) {
    try {
      core.Handle(e, out);
      ADD_FAILURE() << "accepted: " << DescribeEvent(e);
    } catch (const std::invalid_argument& error) {
      EXPECT_EQ(std::string(error.what()).rfind(field + ":", 0), 0u) << error.what();
    }
    core.CheckInvariants();
  };
  refused(GenerationFinished{.time = 1, .sample = sample, .tokens = 1, .engine = other}, "sample");
  refused(GenerationProgressed{.time = 1, .sample = sample, .tokens = 1, .engine = other},
          "sample");
  refused(GenerationProgressed{.time = 1, .sample = sample, .tokens = 101, .engine = owner},
          "tokens");
  refused(GenerationFinished{.time = 1, .sample = sample, .tokens = 101}, "tokens");
  // Group 0's two samples: on one engine each, or both on one.
  const bool split = on.at(0) != on.at(1);
  refused(GroupFiltered{.time = 1, .group = 0, .engine = split ? on.at(0) : 1 - on.at(0)}, "group");
  EXPECT_EQ(core.counters().in_flight, 4);
  EXPECT_EQ(core.counters().filtered, 0);

  out.clear();
  core.Handle(GenerationFinished{.time = 2, .sample = sample, .tokens = 100, .engine = owner}, out);
  EXPECT_EQ(core.counters().buffered, 1);
  // The other sample of its group, still running, may be filtered by its own engine
  // when nothing of the group runs elsewhere; or by the trainer (kAnyEngine).
  const std::int64_t mate = sample ^ 1;
  core.Handle(GroupFiltered{.time = 3, .group = sample / 2, .engine = on.at(mate)}, out);
  EXPECT_EQ(core.counters().filtered_groups, 1);
  core.CheckInvariants();
}

// An engine attaching with what it holds: kept as it is when the core's view matches;
// otherwise what it holds is aborted first and it starts afresh (its samples back to the
// queue); a new engine joins (what it holds aborted). Bad lists are refused by field.
TEST(OrchestratorTest, AnAttachingEngineIsKeptWhenItHoldsWhatTheCoreThinks) {
  Orchestrator core(
      OrchestratorOptions{{.mode = Mode::kAsync, .prompts_per_step = 2, .samples_per_prompt = 2}});
  std::vector<Command> out;
  core.Handle(EngineJoined{.time = 0, .engine = 0, .max_concurrent = 4, .version = 0}, out);
  core.Handle(PromptsAvailable{.time = 0, .prompts = MakePrompts(0, 2)}, out);
  std::vector<std::int64_t> held;
  for (const Dispatch& d : All<Dispatch>(out)) {
    for (const SampleWork& w : d.samples) held.push_back(w.sample);
  }
  ASSERT_EQ(held.size(), 4u);
  const EngineAttached same{.time = 1,
                            .engine = 0,
                            .max_concurrent = 4,
                            .version = 0,
                            .samples = {held.rbegin(), held.rend()}};
  EXPECT_TRUE(core.KeepsEngine(same));
  out.clear();
  core.Handle(same, out);
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(core.counters().in_flight, 4);

  // It lacks one (finished while no scheduler heard, or a dispatch it never got): kept,
  // that one aborted there and handed out again; the three it holds stay on it.
  EngineAttached fewer = same;
  const std::int64_t lacked = fewer.samples.back();
  fewer.samples.pop_back();
  EXPECT_TRUE(core.KeepsEngine(fewer));
  core.Handle(fewer, out);
  ASSERT_FALSE(out.empty());
  ASSERT_TRUE(std::holds_alternative<Abort>(out.front())) << Describe(out.front());
  EXPECT_EQ(std::get<Abort>(out.front()).samples, std::vector<std::int64_t>{lacked});
  ASSERT_EQ(All<Dispatch>(out).size(), 1u);
  ASSERT_EQ(All<Dispatch>(out)[0].samples.size(), 1u);
  EXPECT_EQ(All<Dispatch>(out)[0].samples[0].sample, lacked);
  EXPECT_EQ(core.counters().in_flight, 4);
  EXPECT_EQ(core.counters().restarts, 0);
  EXPECT_EQ(core.engines(), (std::vector<std::int64_t>{0}));
  core.CheckInvariants();
  out.clear();

  // It holds one the core did not give it: reset. Abort first, then the four again.
  EngineAttached other = same;
  other.samples.back() = 1000;
  EXPECT_FALSE(core.KeepsEngine(other));
  core.Handle(other, out);
  ASSERT_FALSE(out.empty());
  ASSERT_TRUE(std::holds_alternative<Abort>(out.front())) << Describe(out.front());
  EXPECT_EQ(std::get<Abort>(out.front()).samples.size(), 5u);  // held, and in flight on it
  EXPECT_EQ(All<Dispatch>(out).size(), 1u);
  EXPECT_EQ(core.counters().in_flight, 4);
  EXPECT_EQ(core.engines(), (std::vector<std::int64_t>{0}));

  // A new engine holding a sample it should not: aborted, then it joins.
  out.clear();
  core.Handle(
      EngineAttached{
          .time = 2, .engine = 7, .max_concurrent = 2, .version = 0, .samples = {held[0]}},
      out);
  ASSERT_FALSE(out.empty());
  EXPECT_EQ(Describe(out.front()), "abort e7 " + std::to_string(held[0]));
  EXPECT_EQ(core.engines(), (std::vector<std::int64_t>{0, 7}));
  core.CheckInvariants();

  const auto refused = [&](const EngineAttached& e, const std::string& field) {
    try {
      core.Handle(e, out);
      ADD_FAILURE() << "accepted";
    } catch (const std::invalid_argument& error) {
      EXPECT_EQ(std::string(error.what()).rfind(field + ":", 0), 0u) << error.what();
    }
  };
  refused({.time = 3, .engine = 9, .max_concurrent = 2, .version = 0, .samples = {1, 1}},
          "samples[1]");
  refused({.time = 3, .engine = 9, .max_concurrent = 1, .version = 0, .samples = {1, 2}},
          "samples");
  refused({.time = 3, .engine = 9, .max_concurrent = 2, .version = 0, .samples = {-1}},
          "samples[0]");
  refused({.time = 3, .engine = 9, .max_concurrent = 2, .version = 5}, "version");
  core.CheckInvariants();
}

// An engine out of step (its pause report refused or lost) that reports WeightsLoaded:
// the paused samples it did not report are aborted there and given out again with the
// progress last reported, instead of the engine staying in the sync (a hung run).
TEST(OrchestratorTest, WeightsLoadedWithoutThePauseReportTakesThePausedSamplesBack) {
  Orchestrator core(OrchestratorOptions{{.mode = Mode::kAsync,
                                         .max_staleness = 1,
                                         .partial_rollout = true,
                                         .prompts_per_step = 1,
                                         .samples_per_prompt = 2}});
  std::vector<Command> out;
  core.Handle(EngineJoined{.time = 0, .engine = 0, .max_concurrent = 2, .version = 0}, out);
  core.Handle(PromptsAvailable{.time = 0, .prompts = MakePrompts(0, 2)}, out);
  core.Handle(GenerationProgressed{.time = 0.5, .sample = 1, .tokens = 3}, out);
  core.Handle(GenerationFinished{.time = 1, .sample = 0, .tokens = 4, .reward = 0}, out);
  out.clear();
  core.Handle(GenerationFinished{.time = 1.5, .sample = 1, .tokens = 5, .reward = 0}, out);
  core.Handle(TrainStepFinished{.time = 2, .step = 0}, out);
  out.clear();
  // Group 1 (samples 2, 3) runs on engine 0 when the sync interrupts it.
  ASSERT_EQ(core.counters().in_flight, 2);
  core.Handle(WeightsLoaded{.time = 3, .engine = 0, .version = 1}, out);
  ASSERT_FALSE(out.empty());
  EXPECT_EQ(Describe(out.front()), "abort e0 2 3");
  EXPECT_EQ(core.counters().unreported_pauses, 2);
  EXPECT_EQ(All<Dispatch>(out).size(), 1u);  // given out again, to the engine now ready
  EXPECT_EQ(core.counters().in_flight, 2);
  core.CheckInvariants();
}

// An engine paused for an interrupting sync reports all its samples in one event; a
// report that does not match the pause is refused, naming the field, and changes nothing.
TEST(OrchestratorTest, PauseReportCoversEveryPausedSampleOnce) {
  Orchestrator core(OrchestratorOptions{{.mode = Mode::kAsync,
                                         .max_staleness = 1,
                                         .partial_rollout = true,
                                         .prompts_per_step = 1,
                                         .samples_per_prompt = 2}});
  std::vector<Command> out;
  core.Handle(EngineJoined{.time = 0, .engine = 0, .max_concurrent = 2, .version = 0}, out);
  core.Handle(EngineJoined{.time = 0, .engine = 1, .max_concurrent = 2, .version = 0}, out);
  core.Handle(PromptsAvailable{.time = 0, .prompts = MakePrompts(0, 10)}, out);
  // Batches 0 and 1 (groups 0 and 1) start; LPT alternates the engines.
  ASSERT_EQ(All<Dispatch>(out).size(), 2u);
  EXPECT_EQ(Describe(out.at(0)), "dispatch e0 v0 0/0/1024 2/0/1024");
  EXPECT_EQ(Describe(out.at(1)), "dispatch e1 v0 1/0/1024 3/0/1024");
  out.clear();
  core.Handle(GenerationFinished{.time = 1, .sample = 0, .tokens = 4, .reward = 0}, out);
  core.Handle(GenerationFinished{.time = 1, .sample = 1, .tokens = 5, .reward = 1}, out);
  ASSERT_EQ(All<StartTrain>(out).size(), 1u);
  out.clear();
  core.Handle(TrainStepFinished{.time = 2, .step = 0}, out);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(Describe(out[0]), "sync e0 v1 interrupt");
  EXPECT_EQ(Describe(out[1]), "sync e1 v1 interrupt");
  out.clear();
  // A third engine with no weights is synced without an interrupt: it has no pause.
  core.Handle(EngineJoined{.time = 2, .engine = 2, .max_concurrent = 1, .version = -1}, out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(Describe(out[0]), "sync e2 v1");
  out.clear();

  auto expect_error = [&](const GenerationPaused& e, const std::string& field) {
    try {
      core.Handle(e, out);
      ADD_FAILURE() << "no error for " << field << ": " << DescribeEvent(e);
    } catch (const std::invalid_argument& error) {
      EXPECT_EQ(std::string(error.what()).rfind(field + ":", 0), 0u) << error.what();
    }
    EXPECT_TRUE(out.empty());
    core.CheckInvariants();
  };
  auto paused = [](double time, std::int64_t engine, std::int64_t version,
                   std::vector<SampleProgress> samples) {
    return GenerationPaused{
        .time = time, .engine = engine, .version = version, .samples = std::move(samples)};
  };
  expect_error(paused(1, 0, 1, {{.sample = 2, .tokens = 7}}), "time");
  expect_error(paused(3, 7, 1, {}), "engine");                             // not joined
  expect_error(paused(3, 2, 1, {}), "engine");                             // not pausing
  expect_error(paused(3, 0, 0, {{.sample = 2, .tokens = 7}}), "version");  // not the sync's
  expect_error(paused(3, 0, 1, {{.sample = 99, .tokens = 7}}), "samples[0].sample");  // unknown
  expect_error(paused(3, 0, 1, {{.sample = 3, .tokens = 7}}), "samples[0].sample");   // engine 1's
  expect_error(paused(3, 0, 1, {{.sample = 0, .tokens = 7}}), "samples[0].sample");   // trained
  expect_error(paused(3, 0, 1, {{.sample = 2, .tokens = 7}, {.sample = 2, .tokens = 8}}),
               "samples[1].sample");  // twice
  expect_error(paused(3, 0, 1, {{.sample = 2, .tokens = -1}}), "samples[0].tokens");
  expect_error(paused(3, 0, 1, {}), "samples");  // sample 2 left out
  // Nothing of the refused reports was applied: sample 2's report is taken now.
  core.Handle(paused(3, 0, 1, {{.sample = 2, .tokens = 7}}), out);
  EXPECT_TRUE(out.empty());
  expect_error(paused(3, 0, 1, {{.sample = 2, .tokens = 7}}), "engine");  // reported already
  // Engine 1 reports the old way, one GenerationProgressed per sample.
  core.Handle(GenerationProgressed{.time = 3, .sample = 3, .tokens = 2}, out);
  core.Handle(WeightsLoaded{.time = 4, .engine = 0, .version = 1}, out);
  core.Handle(WeightsLoaded{.time = 4, .engine = 1, .version = 1}, out);
  const std::vector<Resume> resumed = All<Resume>(out);
  ASSERT_EQ(resumed.size(), 2u);
  EXPECT_EQ(Describe(resumed[0]), "resume e0 v1 2");
  EXPECT_EQ(Describe(resumed[1]), "resume e1 v1 3");
  out.clear();
  expect_error(paused(4, 0, 1, {}), "engine");  // the sync is over
  core.Handle(GenerationFinished{.time = 5, .sample = 2, .tokens = 10, .reward = 0}, out);
  core.Handle(GenerationFinished{.time = 5, .sample = 3, .tokens = 10, .reward = 1}, out);
  ASSERT_EQ(All<StartTrain>(out).size(), 1u);
  ASSERT_EQ(core.last_batch().size(), 2u);
  const TrainedSample& x = core.last_batch()[0];
  EXPECT_EQ(x.sample, 2);
  ASSERT_EQ(x.spans.size(), 2u);
  EXPECT_EQ(x.spans[1].version, 1);
  EXPECT_EQ(x.spans[1].first_token, 7);
  EXPECT_EQ(core.last_batch()[1].spans.at(1).first_token, 2);
  core.CheckInvariants();
}

TEST(OrchestratorTest, FractionAdmitsAShareOfTheNextBatch) {
  // α = 0.5, P = 4, G = 1: batch 0's four groups and ceil(0.5·4) = 2 of batch 1 start
  // on version 0; the admission policy at s = 1 would start all eight.
  auto admitted = [](StalenessPolicy policy, double alpha) {
    Orchestrator core(OrchestratorOptions{{.mode = Mode::kAsync,
                                           .max_staleness = 1,
                                           .staleness_policy = policy,
                                           .staleness_fraction = alpha,
                                           .prompts_per_step = 4,
                                           .samples_per_prompt = 1}});
    std::vector<Command> out;
    core.Handle(EngineJoined{.time = 0, .engine = 0, .max_concurrent = 64, .version = 0}, out);
    core.Handle(PromptsAvailable{.time = 0, .prompts = MakePrompts(0, 20)}, out);
    return core.counters().admitted_groups;
  };
  EXPECT_EQ(admitted(StalenessPolicy::kFraction, 0.5), 6);
  EXPECT_EQ(admitted(StalenessPolicy::kFraction, 0.1), 5);
  EXPECT_EQ(admitted(StalenessPolicy::kFraction, 0), 4);  // on-policy streaming
  EXPECT_EQ(admitted(StalenessPolicy::kFraction, 1), 8);  // = admission at s = 1
  EXPECT_EQ(admitted(StalenessPolicy::kFraction, 1.25), 9);
  EXPECT_EQ(admitted(StalenessPolicy::kAdmission, 0), 8);
  EXPECT_EQ(EffectiveStaleness({.mode = Mode::kAsync,
                                .staleness_policy = StalenessPolicy::kFraction,
                                .staleness_fraction = 1.25}),
            2);
}

TEST(OrchestratorTest, FractionBoundsTheStaleGroupsOfABatch) {
  // α = 0.5, P = 2, G = 1, one engine of 8 slots: groups 0, 1 (batch 0) and 2 (half of
  // batch 1) start on version 0. Group 2 trains in batch 1 with version-0 tokens: one
  // stale group = ⌈0.5·2⌉; the rest of batch 1 starts on version 1.
  Orchestrator core(OrchestratorOptions{{.mode = Mode::kAsync,
                                         .staleness_policy = StalenessPolicy::kFraction,
                                         .staleness_fraction = 0.5,
                                         .partial_rollout = false,
                                         .prompts_per_step = 2,
                                         .samples_per_prompt = 1}});
  std::vector<Command> out;
  core.Handle(EngineJoined{.time = 0, .engine = 0, .max_concurrent = 8, .version = 0}, out);
  core.Handle(PromptsAvailable{.time = 0, .prompts = MakePrompts(0, 10)}, out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(std::get<Dispatch>(out[0]).samples.size(), 3u);
  out.clear();
  for (std::int64_t x = 0; x < 3; ++x) {
    core.Handle(GenerationFinished{.time = 1, .sample = x, .tokens = 10}, out);
  }
  ASSERT_EQ(All<StartTrain>(out).size(), 1u);
  out.clear();
  core.Handle(TrainStepFinished{.time = 2, .step = 0}, out);
  EXPECT_EQ(Describe(out.at(0)), "sync e0 v1");
  out.clear();
  core.Handle(WeightsLoaded{.time = 3, .engine = 0, .version = 1}, out);
  // Batch 1's other place and batch 2's share: groups 3 and 4, on version 1.
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(Describe(out[0]).substr(0, 15), "dispatch e0 v1 ");
  EXPECT_EQ(std::get<Dispatch>(out[0]).samples.size(), 2u);
  out.clear();
  core.Handle(GenerationFinished{.time = 4, .sample = 3, .tokens = 10}, out);
  const auto trains = All<StartTrain>(out);
  ASSERT_EQ(trains.size(), 1u);
  EXPECT_EQ(trains[0].groups, (std::vector<std::int64_t>{2, 3}));
  ASSERT_EQ(core.last_batch().size(), 2u);
  EXPECT_EQ(core.last_batch()[0].spans.at(0).version, 0);  // the stale one
  EXPECT_EQ(core.last_batch()[1].spans.at(0).version, 1);
  core.CheckInvariants();
}

TEST(OrchestratorTest, StreamingTrainsInCallsAndSyncsAfterTheLast) {
  // P = 2 in k = 2 calls of one group: call 0 starts as soon as one group is complete;
  // version 1 exists only when call 1 has finished.
  Orchestrator core(OrchestratorOptions{{.mode = Mode::kAsync,
                                         .max_staleness = 1,
                                         .prompts_per_step = 2,
                                         .samples_per_prompt = 1,
                                         .train_calls_per_sync = 2}});
  std::vector<Command> out;
  core.Handle(EngineJoined{.time = 0, .engine = 0, .max_concurrent = 8, .version = 0}, out);
  core.Handle(PromptsAvailable{.time = 0, .prompts = MakePrompts(0, 10)}, out);
  out.clear();
  core.Handle(GenerationFinished{.time = 1, .sample = 1, .tokens = 10}, out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(Describe(out[0]), "train 0 1");
  out.clear();
  core.Handle(TrainStepFinished{.time = 2, .step = 0, .call = 0}, out);
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(core.latest_version(), 0);
  core.Handle(GenerationFinished{.time = 3, .sample = 0, .tokens = 10}, out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(Describe(out[0]), "train 0.1 0");
  out.clear();
  EXPECT_EQ(core.counters().steps_started, 1);
  try {
    core.Handle(TrainStepFinished{.time = 4, .step = 0, .call = 0}, out);
    ADD_FAILURE() << "the wrong call was accepted";
  } catch (const rlsched::FieldError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("call:", 0), 0u) << e.what();
  }
  core.Handle(TrainStepFinished{.time = 4, .step = 0, .call = 1}, out);
  EXPECT_EQ(core.latest_version(), 1);
  EXPECT_EQ(core.counters().steps_finished, 1);
  EXPECT_EQ(Describe(out.at(0)), "sync e0 v1 interrupt");
  core.CheckInvariants();
}

// A resumed colocated run: an engine whose EngineReleased went to a scheduler that died
// attaches saying it released: kept, its release done, and the trainer starts. One that
// says it did not, while the core has it released, is reset.
TEST(OrchestratorTest, AnAttachingEngineSaysItReleased) {
  Orchestrator core(OrchestratorOptions{
      {.mode = Mode::kSync, .prompts_per_step = 1, .samples_per_prompt = 2, .colocated = true}});
  std::vector<Command> out;
  core.Handle(EngineJoined{.time = 0, .engine = 0, .max_concurrent = 1, .version = 0}, out);
  core.Handle(EngineJoined{.time = 0, .engine = 1, .max_concurrent = 1, .version = 0}, out);
  core.Handle(PromptsAvailable{.time = 0, .prompts = MakePrompts(0, 4)}, out);
  core.Handle(GenerationFinished{.time = 1, .sample = 0, .tokens = 10}, out);
  core.Handle(GenerationFinished{.time = 2, .sample = 1, .tokens = 10}, out);
  core.Handle(EngineReleased{.time = 3, .engine = 1}, out);
  out.clear();
  const EngineAttached released{
      .time = 4, .engine = 0, .max_concurrent = 1, .version = 0, .released = true};
  EXPECT_TRUE(core.KeepsEngine(released));
  EXPECT_FALSE(core.KeepsEngine(EngineAttached{
      .time = 4, .engine = 0, .max_concurrent = 1, .version = 0, .released = false}));
  core.Handle(released, out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(Describe(out[0]), "train 0 0 1");
  out.clear();
  // Engine 1 restarted and lost its release: reset (it joins again, not released).
  const EngineAttached fresh{.time = 5, .engine = 1, .max_concurrent = 1, .version = 0};
  EXPECT_FALSE(core.KeepsEngine(fresh));
  core.Handle(fresh, out);
  EXPECT_EQ(core.engines(), (std::vector<std::int64_t>{0, 1}));
  core.CheckInvariants();
}

TEST(OrchestratorTest, ColocatedReleasesTheEnginesBeforeTraining) {
  // Sync, colocated, two engines: the batch closes, both engines get Release; the
  // trainer starts when both are released; after the step both are woken by a sync.
  Orchestrator core(OrchestratorOptions{
      {.mode = Mode::kSync, .prompts_per_step = 1, .samples_per_prompt = 2, .colocated = true}});
  std::vector<Command> out;
  core.Handle(EngineJoined{.time = 0, .engine = 0, .max_concurrent = 1, .version = 0}, out);
  core.Handle(EngineJoined{.time = 0, .engine = 1, .max_concurrent = 1, .version = 0}, out);
  core.Handle(PromptsAvailable{.time = 0, .prompts = MakePrompts(0, 4)}, out);
  out.clear();
  core.Handle(GenerationFinished{.time = 1, .sample = 0, .tokens = 10}, out);
  EXPECT_TRUE(out.empty());
  core.Handle(GenerationFinished{.time = 2, .sample = 1, .tokens = 10}, out);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(Describe(out[0]), "release e0");
  EXPECT_EQ(Describe(out[1]), "release e1");
  const std::vector<MemoryTag> both = {MemoryTag::kWeights, MemoryTag::kKvCache};
  for (const Release& release : All<Release>(out)) EXPECT_EQ(release.tags, both);
  out.clear();
  core.Handle(EngineReleased{.time = 3, .engine = 1}, out);
  EXPECT_TRUE(out.empty());
  core.Handle(EngineReleased{.time = 4, .engine = 0}, out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(Describe(out[0]), "train 0 0 1");
  out.clear();
  try {
    core.Handle(EngineReleased{.time = 4, .engine = 0}, out);
    ADD_FAILURE() << "a second EngineReleased was accepted";
  } catch (const rlsched::FieldError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("engine:", 0), 0u) << e.what();
  }
  core.Handle(TrainStepFinished{.time = 10, .step = 0}, out);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(Describe(out[0]), "sync e0 v1");
  EXPECT_EQ(Describe(out[1]), "sync e1 v1");
  // Woken up: weights' memory back before the load, the KV cache after.
  for (const SyncWeights& sync : All<SyncWeights>(out)) EXPECT_EQ(sync.resume, both);
  out.clear();
  core.Handle(WeightsLoaded{.time = 11, .engine = 0, .version = 1}, out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(Describe(out[0]).substr(0, 15), "dispatch e0 v1 ");
  core.CheckInvariants();
  const Metrics m = core.metrics(11);
  // Engine 1: busy generating [0, 2], releasing [2, 3], loading [10, 11].
  EXPECT_DOUBLE_EQ(m.engine_idle_ratio[1], 1.0 - 4.0 / 11);
}

TEST(OrchestratorTest, LongestFirstOrArrivalOrder) {
  // Sync, one slot, P = 2 prompts (ids 0 and 1) seen twice. In step 0 prompt 0's sample
  // takes 10 tokens and prompt 1's 100; in step 1 the longest-first dispatch starts
  // prompt 1's sample (id 3) first, arrival order prompt 0's (id 2).
  for (const bool longest_first : {true, false}) {
    Orchestrator core(OrchestratorOptions{{.mode = Mode::kSync,
                                           .prompts_per_step = 2,
                                           .samples_per_prompt = 1,
                                           .longest_first = longest_first}});
    std::vector<Command> out;
    core.Handle(EngineJoined{.time = 0, .engine = 0, .max_concurrent = 1, .version = 0}, out);
    std::vector<Prompt> prompts = MakePrompts(0, 2);
    const std::vector<Prompt> again = MakePrompts(0, 2);
    prompts.insert(prompts.end(), again.begin(), again.end());
    core.Handle(PromptsAvailable{.time = 0, .prompts = prompts}, out);
    core.Handle(GenerationFinished{.time = 1, .sample = 0, .tokens = 10}, out);
    core.Handle(GenerationFinished{.time = 2, .sample = 1, .tokens = 100}, out);
    core.Handle(TrainStepFinished{.time = 3, .step = 0}, out);
    out.clear();
    core.Handle(WeightsLoaded{.time = 4, .engine = 0, .version = 1}, out);
    ASSERT_EQ(out.size(), 1u);
    const Dispatch d = std::get<Dispatch>(out[0]);
    ASSERT_EQ(d.samples.size(), 1u);
    EXPECT_EQ(d.samples[0].sample, longest_first ? 3 : 2);
    EXPECT_EQ(d.samples[0].predicted_tokens, longest_first ? 100 : 10);
    core.CheckInvariants();
  }
}

TEST(OrchestratorTest, EvenSplitKeepsEachGroupOnItsHomeEngine) {
  // Sync, P = 4 prompts of G = 2, engines 0 and 1 of 2 slots: groups 0 and 2 are
  // engine 0's, 1 and 3 engine 1's. When engine 1 frees its slots it takes group 3,
  // not the older group 2 waiting for engine 0. (The load rule deals the samples
  // alternately: 0 and 2 to engine 0, 1 and 3 to engine 1.)
  Orchestrator core(OrchestratorOptions{{.mode = Mode::kSync,
                                         .prompts_per_step = 4,
                                         .samples_per_prompt = 2,
                                         .longest_first = false,
                                         .even_split = true}});
  std::vector<Command> out;
  core.Handle(EngineJoined{.time = 0, .engine = 0, .max_concurrent = 2, .version = 0}, out);
  core.Handle(EngineJoined{.time = 0, .engine = 1, .max_concurrent = 2, .version = 0}, out);
  core.Handle(PromptsAvailable{.time = 0, .prompts = MakePrompts(0, 4)}, out);
  auto on = [](const std::vector<Command>& commands, std::int64_t engine) {
    std::vector<std::int64_t> samples;
    for (const Dispatch& d : All<Dispatch>(commands)) {
      if (d.engine != engine) continue;
      for (const SampleWork& w : d.samples) samples.push_back(w.sample);
    }
    return samples;
  };
  EXPECT_EQ(on(out, 0), (std::vector<std::int64_t>{0, 1}));
  EXPECT_EQ(on(out, 1), (std::vector<std::int64_t>{2, 3}));
  out.clear();
  core.Handle(GenerationFinished{.time = 1, .sample = 2, .tokens = 5, .engine = 1}, out);
  core.Handle(GenerationFinished{.time = 1, .sample = 3, .tokens = 5, .engine = 1}, out);
  EXPECT_EQ(on(out, 1), (std::vector<std::int64_t>{6, 7}));
  EXPECT_TRUE(on(out, 0).empty());
  out.clear();
  core.Handle(GenerationFinished{.time = 2, .sample = 0, .tokens = 5, .engine = 0}, out);
  EXPECT_EQ(on(out, 0), (std::vector<std::int64_t>{4}));
  core.CheckInvariants();
}

TEST(OrchestratorTest, EvenSplitKeepsTheGeneratingGroupsCap) {
  // One group generating at a time, groups 0 and 1 homed on engines 0 and 1: group 1
  // starts on engine 1 only when group 0 is complete, though engine 1 is idle.
  Orchestrator core(OrchestratorOptions{{.mode = Mode::kSync,
                                         .prompts_per_step = 2,
                                         .samples_per_prompt = 2,
                                         .longest_first = false,
                                         .even_split = true,
                                         .max_generating_groups = 1}});
  std::vector<Command> out;
  core.Handle(EngineJoined{.time = 0, .engine = 0, .max_concurrent = 4, .version = 0}, out);
  core.Handle(EngineJoined{.time = 0, .engine = 1, .max_concurrent = 4, .version = 0}, out);
  core.Handle(PromptsAvailable{.time = 0, .prompts = MakePrompts(0, 2)}, out);
  std::vector<Dispatch> sent = All<Dispatch>(out);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].engine, 0);
  EXPECT_EQ(sent[0].samples.size(), 2u);
  out.clear();
  core.Handle(GenerationFinished{.time = 1, .sample = 0, .tokens = 5, .engine = 0}, out);
  EXPECT_TRUE(All<Dispatch>(out).empty());
  core.Handle(GenerationFinished{.time = 2, .sample = 1, .tokens = 5, .engine = 0}, out);
  sent = All<Dispatch>(out);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].engine, 1);
  ASSERT_EQ(sent[0].samples.size(), 2u);
  EXPECT_EQ(sent[0].samples[0].sample, 2);
  core.CheckInvariants();
}

TEST(OrchestratorTest, EvenSplitRehomesWhenAnEngineFails) {
  // Engine 1 fails: its group goes back to the queue and, one engine alive, home is
  // engine 0 for every group.
  Orchestrator core(OrchestratorOptions{
      {.mode = Mode::kSync, .prompts_per_step = 2, .samples_per_prompt = 1, .even_split = true}});
  std::vector<Command> out;
  core.Handle(EngineJoined{.time = 0, .engine = 0, .max_concurrent = 2, .version = 0}, out);
  core.Handle(EngineJoined{.time = 0, .engine = 1, .max_concurrent = 2, .version = 0}, out);
  core.Handle(PromptsAvailable{.time = 0, .prompts = MakePrompts(0, 2)}, out);
  out.clear();
  core.Handle(EngineFailed{.time = 1, .engine = 1}, out);
  const std::vector<Dispatch> again = All<Dispatch>(out);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].engine, 0);
  ASSERT_EQ(again[0].samples.size(), 1u);
  EXPECT_EQ(again[0].samples[0].sample, 1);
  core.CheckInvariants();
}

TEST(OrchestratorTest, GeneratingGroupsAreCapped) {
  // Sync, P = 3 prompts of G = 2 samples, one engine of 8 slots, at most 2 groups
  // generating: groups 0 and 1 start; group 2 starts when group 0 is complete, not
  // when one of its samples is.
  Orchestrator core(OrchestratorOptions{{.mode = Mode::kSync,
                                         .prompts_per_step = 3,
                                         .samples_per_prompt = 2,
                                         .longest_first = false,
                                         .max_generating_groups = 2}});
  std::vector<Command> out;
  core.Handle(EngineJoined{.time = 0, .engine = 0, .max_concurrent = 8, .version = 0}, out);
  core.Handle(PromptsAvailable{.time = 0, .prompts = MakePrompts(0, 3)}, out);
  auto dispatched = [](const std::vector<Command>& commands) {
    std::vector<std::int64_t> samples;
    for (const Dispatch& d : All<Dispatch>(commands)) {
      for (const SampleWork& w : d.samples) samples.push_back(w.sample);
    }
    return samples;
  };
  EXPECT_EQ(dispatched(out), (std::vector<std::int64_t>{0, 1, 2, 3}));
  out.clear();
  core.Handle(GenerationFinished{.time = 1, .sample = 0, .tokens = 5}, out);
  EXPECT_TRUE(dispatched(out).empty());
  core.Handle(GenerationFinished{.time = 2, .sample = 1, .tokens = 5}, out);
  EXPECT_EQ(dispatched(out), (std::vector<std::int64_t>{4, 5}));
  core.CheckInvariants();
}

TEST(OrchestratorTest, NewModeOptionsAreValidated) {
  auto expect_error = [](OrchestratorPolicy policy, const std::string& field) {
    try {
      Orchestrator core(OrchestratorOptions{policy});
      ADD_FAILURE() << "no error for " << field;
    } catch (const std::invalid_argument& error) {
      EXPECT_EQ(std::string(error.what()).rfind(field + ":", 0), 0u) << error.what();
    }
  };
  expect_error({.mode = Mode::kAsync,
                .staleness_policy = StalenessPolicy::kFraction,
                .staleness_fraction = -0.1},
               "staleness_fraction");
  expect_error({.mode = Mode::kAsync, .staleness_fraction = 0.5}, "staleness_fraction");
  expect_error({.prompts_per_step = 4, .train_calls_per_sync = 3}, "train_calls_per_sync");
  expect_error({.prompts_per_step = 4, .train_calls_per_sync = 0}, "train_calls_per_sync");
  expect_error({.mode = Mode::kAsync, .colocated = true}, "colocated");
  expect_error({.mode = Mode::kOneStepOff, .colocated = true}, "colocated");
}

TEST(OrchestratorTest, OptionsAreValidated) {
  auto expect_error = [](OrchestratorOptions o, const std::string& field) {
    try {
      Orchestrator core(std::move(o));
      ADD_FAILURE() << "no error for " << field;
    } catch (const std::invalid_argument& error) {
      EXPECT_EQ(std::string(error.what()).rfind(field + ":", 0), 0u) << error.what();
    }
  };
  auto policy_error = [&](OrchestratorPolicy policy, const std::string& field) {
    expect_error(OrchestratorOptions{policy}, field);
  };
  policy_error({.max_staleness = -1}, "max_staleness");
  policy_error({.oversample = -0.5}, "oversample");
  policy_error({.prompts_per_step = 0}, "prompts_per_step");
  policy_error({.samples_per_prompt = 0}, "samples_per_prompt");
  OrchestratorOptions negative_steps;
  negative_steps.num_steps = -1;
  expect_error(negative_steps, "num_steps");
  policy_error({.length_quantile = 0}, "length_quantile");
  policy_error({.initial_prediction = 0}, "initial_prediction");
  policy_error({.max_response_tokens = -1}, "max_response_tokens");
  policy_error({.max_generating_groups = -1}, "max_generating_groups");
  policy_error({.warmup_steps = -1}, "warmup_steps");
  policy_error({.warmup_steps = 1'000'001}, "warmup_steps");
  // Pause mode abort needs something to pause: async with partial rollout.
  policy_error({.mode = Mode::kSync, .pause_mode = PauseMode::kAbort}, "pause_mode");
  policy_error({.mode = Mode::kOneStepOff, .pause_mode = PauseMode::kAbort}, "pause_mode");
  policy_error({.mode = Mode::kAsync, .partial_rollout = false, .pause_mode = PauseMode::kAbort},
               "pause_mode");
  Orchestrator ok(OrchestratorOptions{{.mode = Mode::kAsync, .pause_mode = PauseMode::kAbort}});
}

// ---- A random world that executes the commands and reports random events. ----

struct WorldOptions {
  std::uint64_t seed = 1;
  Mode mode = Mode::kAsync;
  std::int64_t staleness = 1;
  StalenessPolicy policy = StalenessPolicy::kAdmission;
  bool partial = true;
  double oversample = 0.5;
  bool faults = true;
  int events = 600;
  double fraction = 0;     // α with StalenessPolicy::kFraction
  bool streaming = false;  // train_calls_per_sync = prompts_per_step
  bool colocated = false;  // Mode::kSync only
  std::int64_t max_generating_groups = 0;
  // How an engine paused by an interrupting sync reports its samples: one
  // GenerationProgressed per step (spread over the run), all of them at once as
  // GenerationProgressed events, or at once as one GenerationPaused (the last two draw
  // the same numbers and must give the same commands).
  enum class Pause { kSpread, kEachAtOnce, kBatched };
  Pause pause = Pause::kSpread;
  // What an interrupting sync does with the paused samples (async with partial rollout;
  // kKeep elsewhere): with kAbort the engine forgets each once it reported it.
  PauseMode pause_mode = PauseMode::kKeep;
  // The engines' account of their tokens' versions (EngineSpans) in their reports:
  // none, honest (the version of each Dispatch and Resume, switching at the token the
  // pause reported: the core's own inference), or late (each switch 0 to 3 tokens after
  // the pause's count, as an engine that generated a few more tokens before committing).
  enum class Accounts { kNone, kHonest, kLate };
  Accounts accounts = Accounts::kNone;
};

struct World {
  struct EngineState {
    std::int64_t max_concurrent = 1;
    bool syncing = false;
    bool releasing = false;
    bool released = false;
    bool interrupted = false;
    bool aborting = false;  // interrupted with pause kAbort
    std::int64_t sync_version = 0;
    std::map<std::int64_t, std::int64_t> running;  // sample -> tokens so far
    std::set<std::int64_t> unreported;             // interrupted, progress not reported
    // The engine's account of each running sample (WorldOptions::accounts).
    std::map<std::int64_t, std::vector<VersionSpan>> spans;
    std::map<std::int64_t, std::int64_t> from;  // its Dispatch's resume_from
  };
  explicit World(const WorldOptions& o)
      : options(o), rng(o.seed), core_options(CoreOptions(o, rng)), core(core_options) {}

  static OrchestratorOptions CoreOptions(const WorldOptions& o, workload::Rng& rng) {
    OrchestratorOptions core{{.mode = o.mode,
                              .max_staleness = o.staleness,
                              .staleness_policy = o.policy,
                              .partial_rollout = o.partial,
                              .oversample = o.oversample,
                              .prompts_per_step = rng.UniformInt(1, 3),
                              .samples_per_prompt = rng.UniformInt(1, 3),
                              .keep_partial_on_failure = rng.UniformInt(0, 1) == 1}};
    if (o.policy == StalenessPolicy::kFraction) core.staleness_fraction = o.fraction;
    core.longest_first = rng.UniformInt(0, 3) != 0;
    core.even_split = o.seed % 4 == 1;  // (not drawn: the worlds' draws stay as they were)
    if (o.streaming) core.train_calls_per_sync = core.prompts_per_step;
    core.colocated = o.colocated;
    core.max_generating_groups = o.max_generating_groups;
    if (o.mode == Mode::kAsync && o.partial) core.pause_mode = o.pause_mode;
    // Dynamic sampling where a group can have unequal rewards.
    if (core.samples_per_prompt > 1) core.filter = KeepUnlessAllEqual;
    return core;
  }

  void Apply(const std::vector<Command>& commands) {
    for (const Command& c : commands) {
      log.push_back(Describe(c));
      command_log.push_back(log.back());
      if (const auto* d = std::get_if<Dispatch>(&c)) {
        EngineState& e = engines.at(d->engine);
        ASSERT_FALSE(e.syncing);
        for (const SampleWork& w : d->samples) {
          // Even split: from the queue, a group goes only to its home engine among those
          // alive (an aborted pause's samples go back to their own engine instead).
          if (core_options.even_split && core_options.pause_mode == PauseMode::kKeep) {
            const auto home = std::next(engines.begin(), w.group % std::ssize(engines));
            ASSERT_EQ(home->first, d->engine) << "group " << w.group;
          }
          ASSERT_FALSE(e.running.contains(w.sample));
          e.running[w.sample] = w.resume_from;
          e.spans[w.sample] = {{.version = d->version, .first_token = w.resume_from}};
          e.from[w.sample] = w.resume_from;
          live_groups.insert(w.group);
        }
        ASSERT_LE(static_cast<std::int64_t>(e.running.size()), e.max_concurrent);
        if (options.max_generating_groups > 0) {  // running samples' groups generate
          std::set<std::int64_t> generating;
          for (const auto& [id, engine] : engines) {
            for (const auto& [x, tokens] : engine.running) {
              generating.insert(x / core_options.samples_per_prompt);
            }
          }
          ASSERT_LE(static_cast<std::int64_t>(generating.size()), options.max_generating_groups);
        }
      } else if (const auto* a = std::get_if<Abort>(&c)) {
        EngineState& e = engines.at(a->engine);
        for (const auto x : a->samples) {
          ASSERT_EQ(e.running.erase(x), 1u);
          e.unreported.erase(x);
          e.spans.erase(x);
          e.from.erase(x);
        }
      } else if (const auto* s = std::get_if<SyncWeights>(&c)) {
        EngineState& e = engines.at(s->engine);
        ASSERT_FALSE(e.syncing);
        ASSERT_FALSE(e.releasing);
        e.released = false;
        ASSERT_TRUE(s->interrupt || e.running.empty());
        ASSERT_EQ(s->pause, s->interrupt ? core_options.pause_mode : PauseMode::kKeep);
        e.syncing = true;
        e.interrupted = s->interrupt;
        e.aborting = s->interrupt && s->pause == PauseMode::kAbort;
        e.sync_version = s->version;
        for (const auto& [x, tokens] : e.running) e.unreported.insert(x);
      } else if (const auto* r = std::get_if<Resume>(&c)) {
        EngineState& e = engines.at(r->engine);
        for (const auto x : r->samples) {
          ASSERT_TRUE(e.running.contains(x));
          const std::int64_t at =
              e.running[x] +
              (options.accounts == WorldOptions::Accounts::kLate ? rng.UniformInt(0, 3) : 0);
          std::vector<VersionSpan>& spans = e.spans[x];
          while (!spans.empty() && spans.back().first_token >= at) spans.pop_back();
          if (spans.empty() || spans.back().version != r->version) {
            spans.push_back({.version = r->version, .first_token = at});
          }
        }
        e.interrupted = false;
      } else if (const auto* release = std::get_if<Release>(&c)) {
        EngineState& e = engines.at(release->engine);
        ASSERT_TRUE(options.colocated);
        ASSERT_TRUE(e.running.empty());
        ASSERT_FALSE(e.syncing || e.releasing || e.released);
        e.releasing = true;
      } else if (const auto* t = std::get_if<StartTrain>(&c)) {
        ASSERT_FALSE(training);
        training = true;
        if (t->call == 0) stale_groups = 0;
        step = t->step;
        call = t->call;
        if (options.colocated) {  // the trainer has the GPUs to itself
          for (const auto& [id, e] : engines) {
            ASSERT_TRUE(e.released || e.syncing) << "engine " << id << " not released";
            ASSERT_TRUE(e.running.empty());
          }
        }
        for (const auto x : t->samples) ASSERT_TRUE(trained.insert(x).second) << "trained twice";
        const std::int64_t group_size =
            static_cast<std::int64_t>(t->samples.size() / t->groups.size());
        std::set<std::int64_t> stale;
        for (const TrainedSample& x : core.last_batch()) {
          std::int64_t oldest = x.spans.empty() ? t->version : x.spans[0].version;
          for (const VersionSpan& span : x.spans) oldest = std::min(oldest, span.version);
          // Spans start at token 0 and each holds a token (one alone may be empty, for
          // an empty response), of distinct consecutive versions.
          ASSERT_FALSE(x.spans.empty());
          ASSERT_EQ(x.spans[0].first_token, 0);
          for (std::size_t i = 0; i < x.spans.size(); ++i) {
            const std::int64_t end =
                i + 1 < x.spans.size() ? x.spans[i + 1].first_token : x.response_tokens;
            if (x.spans.size() > 1) {
              ASSERT_LT(x.spans[i].first_token, end) << "an empty span\n" << Tail(log);
            }
            if (i > 0) {
              ASSERT_NE(x.spans[i].version, x.spans[i - 1].version);
            }
          }
          if (strict()) {
            ASSERT_LE(t->version - oldest, staleness_bound());
          }
          if (oldest < t->version) stale.insert(x.sample / group_size);
          trained_tokens += x.response_tokens;
        }
        // Fraction α < 1: the groups with tokens older than the step's version are at
        // most the over-sampled places plus ⌈α·quota⌉ (⌈α·P⌉ without over-sampling).
        stale_groups += static_cast<std::int64_t>(stale.size());
        if (options.mode == Mode::kAsync && options.policy == StalenessPolicy::kFraction &&
            options.fraction < 1) {
          const auto p = static_cast<double>(core_options.prompts_per_step);
          const auto quota =
              static_cast<std::int64_t>(std::ceil((1 + options.oversample) * p - 1e-9));
          const auto last = static_cast<std::int64_t>(
              std::ceil(options.fraction * static_cast<double>(quota) - 1e-9));
          ASSERT_LE(stale_groups, quota - core_options.prompts_per_step + last)
              << "step " << t->step << ", P " << core_options.prompts_per_step << ", G "
              << group_size << "\n"
              << Tail(log);
        }
        max_stale_groups = std::max(max_stale_groups, stale_groups);
        for (const auto g : t->groups) live_groups.erase(g);
      }
    }
  }

  bool strict() const {
    return options.mode != Mode::kAsync || options.policy == StalenessPolicy::kStrict;
  }

  // The engine's account of sample x's versions in a report of `tokens` tokens.
  EngineSpans Account(const EngineState& e, std::int64_t x, std::int64_t tokens) const {
    if (options.accounts == WorldOptions::Accounts::kNone) return {};
    const auto it = e.spans.find(x);
    if (it == e.spans.end() || tokens <= e.from.at(x)) return {};
    EngineSpans out;
    for (const VersionSpan& span : it->second) {
      if (span.first_token < tokens) out.push_back(span);
    }
    return out;
  }

  std::int64_t staleness_bound() const { return EffectiveStaleness(core_options); }

  // Pause mode kAbort: the engine forgets a paused sample once it reported it.
  void Forget(EngineState& e, std::int64_t x) {
    if (!e.aborting) return;
    e.running.erase(x);
    e.spans.erase(x);
    e.from.erase(x);
    ++forgotten;
  }

  void Feed(const Event& e) {
    log.push_back(DescribeEvent(e));
    std::vector<Command> out;
    core.Handle(e, out);
    Apply(out);
    core.CheckInvariants();
  }

  // A random event that the state allows.
  void Step() {
    time += static_cast<double>(rng.UniformInt(0, 3));
    const std::int64_t roll = rng.UniformInt(0, 99);
    // Engines that are loading report their interrupted samples, then finish loading;
    // releasing ones report it.
    for (auto& [id, e] : engines) {
      if (e.releasing && rng.UniformInt(0, 2) == 0) {
        e.releasing = false;
        e.released = true;
        Feed(EngineReleased{.time = time, .engine = id});
        return;
      }
      if (!e.syncing || rng.UniformInt(0, 2) != 0) continue;
      if (options.pause != WorldOptions::Pause::kSpread && e.interrupted && !e.unreported.empty()) {
        std::vector<SampleProgress> report;
        for (const std::int64_t x : e.unreported) {
          e.running[x] += rng.UniformInt(0, 5);
          report.push_back(
              {.sample = x, .tokens = e.running[x], .spans = Account(e, x, e.running[x])});
        }
        for (std::size_t i = report.size(); i > 1; --i) {  // any order
          std::swap(report[i - 1], report[static_cast<std::size_t>(
                                       rng.UniformInt(0, static_cast<std::int64_t>(i) - 1))]);
        }
        e.unreported.clear();
        for (const SampleProgress& p : report) Forget(e, p.sample);
        ++pauses;
        paused_samples += static_cast<std::int64_t>(report.size());
        if (options.pause == WorldOptions::Pause::kBatched) {
          Feed(GenerationPaused{
              .time = time, .engine = id, .version = e.sync_version, .samples = report});
        } else {
          for (const SampleProgress& p : report) {
            Feed(GenerationProgressed{
                .time = time, .sample = p.sample, .tokens = p.tokens, .spans = p.spans});
          }
        }
      } else if (!e.unreported.empty()) {
        const std::int64_t x = *e.unreported.begin();
        e.unreported.erase(e.unreported.begin());
        e.running[x] += rng.UniformInt(0, 5);
        const std::int64_t tokens = e.running[x];
        EngineSpans spans = Account(e, x, tokens);
        Forget(e, x);
        Feed(GenerationProgressed{
            .time = time, .sample = x, .tokens = tokens, .spans = std::move(spans)});
      } else {
        e.syncing = false;
        Feed(WeightsLoaded{.time = time, .engine = id, .version = e.sync_version});
      }
      return;
    }
    if (roll < 5 || prompts_fed < 4) {
      Feed(PromptsAvailable{.time = time, .prompts = MakePrompts(prompts_fed, 4)});
      prompts_fed += 4;
    } else if (roll < 10 && training) {
      training = false;
      Feed(TrainStepFinished{.time = time, .step = step, .call = call});
    } else if (roll < 13 && options.faults && !engines.empty()) {
      auto it = std::next(engines.begin(), rng.UniformInt(0, std::int64_t(engines.size()) - 1));
      const std::int64_t id = it->first;
      engines.erase(it);
      if (rng.UniformInt(0, 1) == 0) {
        Feed(EngineFailed{.time = time, .engine = id});
      } else {
        Feed(EngineLeft{.time = time, .engine = id});
      }
    } else if (roll < 16 && (engines.size() < 3 || options.faults)) {
      if (engines.size() >= 6) return;
      const std::int64_t id = next_engine++;
      const std::int64_t cap = rng.UniformInt(1, 4);
      engines[id] = EngineState{.max_concurrent = cap};
      const std::int64_t version = rng.UniformInt(0, 1) == 0 ? -1 : core.latest_version();
      Feed(EngineJoined{.time = time, .engine = id, .max_concurrent = cap, .version = version});
    } else if (roll < 18 && !live_groups.empty()) {
      const std::int64_t g =
          *std::next(live_groups.begin(), rng.UniformInt(0, std::int64_t(live_groups.size()) - 1));
      live_groups.erase(g);
      std::vector<Command> out;
      try {
        core.Handle(GroupFiltered{.time = time, .group = g}, out);
      } catch (const std::invalid_argument&) {
        return;  // already filtered by the reward filter
      }
      Apply(out);
      core.CheckInvariants();
    } else {
      // A running (not interrupted) sample progresses or finishes.
      std::vector<std::pair<std::int64_t, std::int64_t>> candidates;
      for (const auto& [id, e] : engines) {
        if (e.syncing) continue;
        for (const auto& [x, tokens] : e.running) candidates.emplace_back(id, x);
      }
      if (candidates.empty()) return;
      const auto [id, x] = candidates[static_cast<std::size_t>(
          rng.UniformInt(0, std::int64_t(candidates.size()) - 1))];
      EngineState& e = engines.at(id);
      const std::int64_t tokens = e.running[x] + rng.UniformInt(0, 20);
      if (rng.UniformInt(0, 3) == 0) {
        e.running[x] = tokens;
        Feed(GenerationProgressed{
            .time = time, .sample = x, .tokens = tokens, .spans = Account(e, x, tokens)});
      } else {
        EngineSpans spans = Account(e, x, tokens);
        e.running.erase(x);
        e.spans.erase(x);
        e.from.erase(x);
        Feed(GenerationFinished{.time = time,
                                .sample = x,
                                .tokens = tokens,
                                .reward = static_cast<double>(rng.UniformInt(0, 2)),
                                .spans = std::move(spans)});
      }
    }
  }

  WorldOptions options;
  workload::Rng rng;
  OrchestratorOptions core_options;
  Orchestrator core;
  std::map<std::int64_t, EngineState> engines;
  std::set<std::int64_t> live_groups;
  std::set<std::int64_t> trained;
  std::vector<std::string> log;
  std::vector<std::string> command_log;
  std::int64_t pauses = 0;          // pause reports (WorldOptions::pause at once)
  std::int64_t paused_samples = 0;  // the samples they reported
  std::int64_t forgotten = 0;       // paused samples aborted on their engine (kAbort)
  std::int64_t next_engine = 0;
  std::int64_t prompts_fed = 0;
  std::int64_t step = 0;
  std::int64_t call = 0;
  std::int64_t stale_groups = 0;      // of the step training, over its calls
  std::int64_t max_stale_groups = 0;  // over the run
  std::int64_t trained_tokens = 0;    // response tokens of the trained samples
  bool training = false;
  double time = 0;
};

std::vector<std::string> RunWorld(const WorldOptions& options, Counters* counters = nullptr,
                                  std::int64_t* max_stale_groups = nullptr) {
  World world(options);
  for (int i = 0; i < options.events && !::testing::Test::HasFatalFailure(); ++i) world.Step();
  const Metrics m = world.core.metrics(world.time);
  if (world.strict()) {
    EXPECT_LE(m.max_staleness, world.staleness_bound());
  }
  // Every trained response token is counted once, by its own version.
  std::int64_t tokens = 0;
  for (const std::int64_t t : m.token_staleness_histogram) tokens += t;
  EXPECT_EQ(tokens, world.trained_tokens);
  const Counters& c = world.core.counters();
  if (!world.strict()) {
    EXPECT_EQ(c.stale_restarts, 0);
    EXPECT_EQ(c.stale_discarded_tokens, 0);
    if (!options.faults) {
      EXPECT_EQ(c.discarded_tokens, 0) << "a token discarded under admission";
    }
  }
  if (counters != nullptr) *counters = world.core.counters();
  if (max_stale_groups != nullptr) *max_stale_groups = world.max_stale_groups;
  return world.log;
}

void RunSeeds(std::uint64_t first, std::uint64_t count) {
  const Mode modes[] = {Mode::kSync, Mode::kOneStepOff, Mode::kAsync};
  // The runs must exercise what they check: training, restarts, partial rollouts,
  // filters and discarded tokens all happen somewhere.
  Counters total;
  std::int64_t admission_steps = 0;
  std::int64_t fraction_steps = 0;
  std::int64_t fraction_stale_groups = 0;
  std::int64_t colocated_steps = 0;
  std::int64_t streaming_steps = 0;
  for (std::uint64_t seed = first; seed < first + count; ++seed) {
    const StalenessPolicy policies[] = {StalenessPolicy::kAdmission, StalenessPolicy::kStrict,
                                        StalenessPolicy::kFraction};
    const double fractions[] = {0.5, 0, 0.25, 1.5};
    WorldOptions o{
        .seed = seed,
        .mode = modes[seed % 3],
        .staleness = static_cast<std::int64_t>(seed / 3 % 3),
        .policy = policies[(seed / 18) % 3],
        .partial = (seed / 9) % 2 == 0,
        .oversample = static_cast<double>(seed % 4) * 0.5,
        .faults = seed % 5 != 0,
        .fraction = fractions[(seed / 54) % 4],
        .streaming = seed % 7 < 2,
        .colocated = seed % 3 == 0 && (seed / 6) % 2 == 0,
        .max_generating_groups = seed % 11 < 3 ? static_cast<std::int64_t>(seed % 3) + 1 : 0,
        .pause = seed % 13 < 4 ? WorldOptions::Pause::kBatched : WorldOptions::Pause::kSpread,
        .pause_mode = (seed / 4) % 2 == 0 ? PauseMode::kKeep : PauseMode::kAbort};
    if (o.mode != Mode::kAsync) o.policy = StalenessPolicy::kAdmission;
    SCOPED_TRACE("seed " + std::to_string(seed));
    Counters c;
    std::int64_t stale_groups = 0;
    RunWorld(o, &c, &stale_groups);
    if (::testing::Test::HasFatalFailure()) return;
    total.steps_started += c.steps_started;
    total.restarts += c.restarts;
    total.partial_samples += c.partial_samples;
    total.resubmitted += c.resubmitted;
    total.filtered_groups += c.filtered_groups;
    total.discarded_tokens += c.discarded_tokens;
    if (o.mode == Mode::kAsync && o.policy == StalenessPolicy::kAdmission) {
      admission_steps += c.steps_started;
    }
    if (o.mode == Mode::kAsync && o.policy == StalenessPolicy::kFraction) {
      fraction_steps += c.steps_started;
      // The bound is reached, not vacuous: batches with stale groups do occur.
      if (o.fraction > 0 && o.fraction < 1) fraction_stale_groups += stale_groups;
    }
    if (o.colocated) colocated_steps += c.steps_started;
    if (o.streaming) streaming_steps += c.steps_started;
    total.stale_restarts += c.stale_restarts;
  }
  const std::int64_t n = static_cast<std::int64_t>(count);
  EXPECT_GE(total.steps_started, 5 * n);
  EXPECT_GE(total.restarts, n);
  EXPECT_GE(total.partial_samples, n / 4);
  EXPECT_GE(total.resubmitted, n / 10);  // pause mode abort resubmits paused samples
  EXPECT_GE(total.filtered_groups, n);
  EXPECT_GE(total.discarded_tokens, n);
  // Both policies run and train; the strict one throws stale tokens away somewhere.
  EXPECT_GE(admission_steps, n / 2);
  EXPECT_GE(fraction_steps, n / 4);
  EXPECT_GE(fraction_stale_groups, n / 20);
  EXPECT_GE(colocated_steps, n / 8);
  EXPECT_GE(streaming_steps, n / 4);
  EXPECT_GE(total.stale_restarts, n / 10);
  std::printf("%lld seeds: %lld steps, %lld restarts, %lld partial samples, %lld filtered groups\n",
              static_cast<long long>(n), static_cast<long long>(total.steps_started),
              static_cast<long long>(total.restarts), static_cast<long long>(total.partial_samples),
              static_cast<long long>(total.filtered_groups));
}

TEST(OrchestratorPropertyTest, RandomInterleavingsKeepTheInvariants) { RunSeeds(1, 300); }

TEST(OrchestratorPropertyTest, ThoroughRandomInterleavings) { RunSeeds(1000, 3000); }

// The state a run leaves, as text: counters, figures, the last batch.
std::string DescribeState(World& world) {
  std::ostringstream s;
  const Counters& c = world.core.counters();
  s << c.admitted << " " << c.trained << " " << c.filtered << " " << c.buffered << " " << c.queued
    << " " << c.in_flight << " " << c.admitted_groups << " " << c.trained_groups << " "
    << c.filtered_groups << " " << c.restarts << " " << c.discarded_tokens << " "
    << c.stale_restarts << " " << c.stale_discarded_tokens << " " << c.partial_samples << " "
    << c.trained_tokens << " " << c.steps_started << " " << c.steps_finished << " "
    << c.engine_failures << " v" << world.core.latest_version() << "\n";
  const Metrics m = world.core.metrics(world.time);
  s << m.elapsed_seconds << " " << m.trainer_idle_ratio << " " << m.weight_syncs << " "
    << m.weight_sync_seconds << " " << m.mean_engine_idle_ratio;
  for (const double r : m.engine_idle_ratio) s << " " << r;
  for (const std::int64_t k : m.staleness_histogram) s << " s" << k;
  for (const std::int64_t k : m.token_staleness_histogram) s << " t" << k;
  s << "\n";
  for (const TrainedSample& x : world.core.last_batch()) {
    s << x.sample << ":" << x.response_tokens;
    for (const VersionSpan& span : x.spans) s << " v" << span.version << "@" << span.first_token;
    s << "\n";
  }
  return s.str();
}

// One GenerationPaused gives the same commands and state as the same progress sent as
// one GenerationProgressed per sample, at the same time and in the same order, on random
// runs of every mode and policy.
void RunPauseReportSeeds(std::uint64_t seeds) {
  const Mode modes[] = {Mode::kSync, Mode::kOneStepOff, Mode::kAsync};
  const StalenessPolicy policies[] = {StalenessPolicy::kAdmission, StalenessPolicy::kStrict,
                                      StalenessPolicy::kFraction};
  std::int64_t pauses = 0;
  std::int64_t paused_samples = 0;
  std::int64_t seeds_with_multi_sample_pauses = 0;
  for (std::uint64_t seed = 1; seed <= seeds; ++seed) {
    WorldOptions o{.seed = seed,
                   .mode = modes[seed % 3 == 0 ? 2 : seed % 3],  // mostly async: it interrupts
                   .staleness = static_cast<std::int64_t>(seed / 3 % 3),
                   .policy = policies[(seed / 9) % 3],
                   .partial = seed % 5 != 0,
                   .oversample = static_cast<double>(seed % 4) * 0.5,
                   .faults = seed % 4 != 0,
                   .events = 500,
                   .fraction = 0.5,
                   .streaming = seed % 7 < 2,
                   .max_generating_groups = seed % 11 < 3 ? 2 : 0};
    if (o.mode != Mode::kAsync) o.policy = StalenessPolicy::kAdmission;
    SCOPED_TRACE("seed " + std::to_string(seed));
    o.pause = WorldOptions::Pause::kEachAtOnce;
    World each(o);
    o.pause = WorldOptions::Pause::kBatched;
    World batched(o);
    for (int i = 0; i < o.events && !::testing::Test::HasFatalFailure(); ++i) {
      each.Step();
      batched.Step();
    }
    if (::testing::Test::HasFatalFailure()) return;
    ASSERT_EQ(batched.pauses, each.pauses);
    ASSERT_EQ(batched.command_log, each.command_log) << Tail(batched.log) << "\n---\n"
                                                     << Tail(each.log);
    ASSERT_EQ(DescribeState(batched), DescribeState(each));
    pauses += batched.pauses;
    paused_samples += batched.paused_samples;
    seeds_with_multi_sample_pauses += batched.paused_samples > batched.pauses ? 1 : 0;
  }
  // Not vacuous: pauses happen (at least 2 a seed), many with several samples.
  EXPECT_GE(pauses, static_cast<std::int64_t>(2 * seeds));
  EXPECT_GE(paused_samples, pauses + pauses / 2);
  EXPECT_GE(seeds_with_multi_sample_pauses, static_cast<std::int64_t>(seeds / 5));
  std::printf("%lld pause reports of %lld samples (%lld seeds with reports of several)\n",
              static_cast<long long>(pauses), static_cast<long long>(paused_samples),
              static_cast<long long>(seeds_with_multi_sample_pauses));
}

TEST(OrchestratorPropertyTest, PauseReportEqualsPerSampleReports) { RunPauseReportSeeds(300); }
TEST(OrchestratorPropertyTest, ThoroughPauseReportEqualsPerSampleReports) {
  RunPauseReportSeeds(1500);
}

// Engines that report the versions of their tokens as the core infers them (the version
// of each Dispatch and Resume, switching where the pause reported) change nothing: the
// same commands and state as engines that report none, on random runs of every mode,
// policy and pause report; no report refused, no correction counted.
TEST(OrchestratorPropertyTest, HonestEngineAccountsChangeNothing) {
  const Mode modes[] = {Mode::kSync, Mode::kOneStepOff, Mode::kAsync};
  const StalenessPolicy policies[] = {StalenessPolicy::kAdmission, StalenessPolicy::kStrict,
                                      StalenessPolicy::kFraction};
  const WorldOptions::Pause pauses[] = {WorldOptions::Pause::kSpread,
                                        WorldOptions::Pause::kEachAtOnce,
                                        WorldOptions::Pause::kBatched};
  std::int64_t reports = 0;
  std::int64_t partial = 0;
  for (std::uint64_t seed = 1; seed <= 300; ++seed) {
    WorldOptions o{.seed = seed,
                   .mode = modes[seed % 3 == 0 ? 2 : seed % 3],
                   .staleness = static_cast<std::int64_t>(seed / 3 % 3),
                   .policy = policies[(seed / 9) % 3],
                   .partial = seed % 5 != 0,
                   .oversample = static_cast<double>(seed % 4) * 0.5,
                   .faults = seed % 4 != 0,
                   .events = 500,
                   .fraction = 0.5,
                   .streaming = seed % 7 < 2,
                   .pause = pauses[(seed / 27) % 3]};
    if (o.mode != Mode::kAsync) o.policy = StalenessPolicy::kAdmission;
    SCOPED_TRACE("seed " + std::to_string(seed));
    World none(o);
    o.accounts = WorldOptions::Accounts::kHonest;
    World honest(o);
    for (int i = 0; i < o.events && !::testing::Test::HasFatalFailure(); ++i) {
      none.Step();
      honest.Step();
    }
    if (::testing::Test::HasFatalFailure()) return;
    ASSERT_EQ(honest.command_log, none.command_log) << Tail(honest.log);
    ASSERT_EQ(DescribeState(honest), DescribeState(none));
    EXPECT_EQ(honest.core.counters().version_corrections, 0) << Tail(honest.log);
    EXPECT_EQ(none.core.counters().version_reports, 0);
    reports += honest.core.counters().version_reports;
    partial += honest.core.counters().partial_samples;
  }
  // Not vacuous: the accounts are checked on many reports, across weight syncs.
  EXPECT_GE(reports, 20000);
  EXPECT_GE(partial, 100);
}

// Engines whose accounts put each version switch 0 to 3 tokens after their pause
// reports: every account is taken (none refused) and recorded, the differences are
// counted, and the trained spans, the strict staleness bound and the token count hold
// (RunWorld's and World::Apply's checks).
TEST(OrchestratorPropertyTest, LateEngineAccountsAreRecordedWithinTheBounds) {
  const StalenessPolicy policies[] = {StalenessPolicy::kAdmission, StalenessPolicy::kStrict};
  std::int64_t corrections = 0;
  for (std::uint64_t seed = 1; seed <= 200; ++seed) {
    const WorldOptions o{
        .seed = seed,
        .mode = Mode::kAsync,
        .staleness = static_cast<std::int64_t>(seed % 3),
        .policy = policies[(seed / 3) % 2],
        .oversample = static_cast<double>(seed % 2) * 0.5,
        .faults = seed % 4 != 0,
        .events = 500,
        .pause = (seed / 6) % 2 == 0 ? WorldOptions::Pause::kBatched : WorldOptions::Pause::kSpread,
        .accounts = WorldOptions::Accounts::kLate};
    SCOPED_TRACE("seed " + std::to_string(seed));
    Counters c;
    RunWorld(o, &c);
    if (::testing::Test::HasFatalFailure()) return;
    EXPECT_LE(c.version_corrections, c.version_reports);
    corrections += c.version_corrections;
  }
  EXPECT_GE(corrections, 200);
}

TEST(OrchestratorPropertyTest, SameSeedSameCommands) {
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    const WorldOptions o{.seed = seed, .mode = Mode::kAsync, .staleness = 2, .events = 400};
    EXPECT_EQ(RunWorld(o), RunWorld(o));
  }
}

TEST(OrchestratorPropertyTest, WorkProgresses) {
  // Without faults every mode keeps training, with at most one group generating too.
  for (const std::int64_t cap : {0, 1}) {
    for (const Mode mode : {Mode::kSync, Mode::kOneStepOff, Mode::kAsync}) {
      World world(WorldOptions{
          .seed = 7, .mode = mode, .faults = false, .events = 2000, .max_generating_groups = cap});
      for (int i = 0; i < 2000; ++i) world.Step();
      const Counters& c = world.core.counters();
      EXPECT_GE(c.steps_started, 5)
          << static_cast<int>(mode) << " admitted " << c.admitted << " queued " << c.queued
          << " in flight " << c.in_flight << " buffered " << c.buffered << " engines "
          << world.engines.size() << " log " << world.log.size();
    }
  }
}

}  // namespace
}  // namespace rlsched::scheduler
