// Tests of the discrete-event simulator (rlsched/scheduler/simulator.h): validation,
// determinism, hand-computed timelines, the modes' throughput order, conservation,
// the staleness bound and failures. Every simulation checks the core's invariants
// after every event (check_invariants), except the default-sized calibration run.

#include "rlsched/scheduler/simulator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "rlsched/balance/cost_model.h"
#include "rlsched/common/error.h"
#include "rlsched/scheduler/orchestrator.h"
#include "rlsched/workload/workload.h"
#include "small_config.h"

namespace rlsched::scheduler {
namespace {

// A small heavy-tailed workload: 4 engines × 16 concurrent, 16 prompts × 4 samples,
// 8 trainer ranks, responses lognormal clipped at 2,048 tokens.
// 1 engine, P = 1, G = 2, every response 10 tokens, prompts 100 tokens, 1 s per decode
// step, (almost) free prefill, instantaneous weight sync; the trainer's cost is tokens
// (220 per step) at 1/22 s each: 10 s.
SimulatorConfig TinyConfig() {
  SimulatorConfig config;
  config.orchestrator.mode = Mode::kSync;
  config.orchestrator.prompts_per_step = 1;
  config.orchestrator.samples_per_prompt = 2;
  config.steps = 3;
  config.engines = 1;
  config.engine.max_concurrent = 2;
  config.engine.prefill_tokens_per_second = 1e12;
  config.engine.decode_base_seconds = 1.0;
  config.engine.decode_per_sequence_seconds = 0;
  config.engine.decode_per_context_token_seconds = 0;
  config.step.num_ranks = 1;
  config.step.micro_batch.max_tokens_per_micro_batch = 1024;
  config.step.micro_batch.cost = balance::CostModel::Tokens();
  config.step.micro_batch.overhead = 0;  // the timelines below are computed by hand
  config.seconds_per_cost_unit = 1.0 / 22.0;
  config.weight_sync_seconds = 0;
  config.dataset_prompts = 4;
  config.lengths.lengths = {10};
  config.lengths.length_correlation = 1.0;
  config.lengths.min_prompt_tokens = 100;
  config.lengths.max_prompt_tokens = 100;
  config.check_invariants = true;
  return config;
}

void ExpectConserved(const SimulationReport& report) {
  const Counters& c = report.counters;
  EXPECT_EQ(c.admitted, c.trained + c.filtered + c.buffered + c.queued + c.in_flight);
}

std::string ValidateMessage(const SimulatorConfig& config) {
  try {
    Validate(config);
  } catch (const rlsched::FieldError& e) {
    return e.what();
  }
  return "(no error)";
}

// The workload draws, whose values python/rlsched/worker/emulated.py reproduces bit for
// bit (tests/python/test_run.py checks the same values there).
TEST(SimulatorWorkload, DrawsArePureFunctionsOfTheirKeys) {
  SimulatorConfig config;
  config.seed = 7;
  config.lengths.mu = 5.5;
  config.lengths.sigma = 1.0;
  config.lengths.max_tokens = 4096;
  config.lengths.length_correlation = 0.8;
  const std::vector<std::int64_t> expected = {170, 170, 35, 234, 69};
  const std::int64_t keys[][3] = {{0, 0, 0}, {0, 0, 1}, {3, 0, 2}, {5, 1, 3}, {123456, 2, 0}};
  for (std::size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(WorkloadResponseLength(config, keys[i][0], keys[i][1], keys[i][2]), expected[i]);
  }
  config.seed = 42;
  config.lengths.lengths = {900, 5, 70, 3000, 12};
  config.lengths.length_correlation = 0.3;
  const std::vector<std::int64_t> from_list = {3000, 900, 900, 12};
  const std::int64_t list_keys[][3] = {{0, 0, 0}, {1, 0, 1}, {2, 3, 2}, {9, 1, 3}};
  for (std::size_t i = 0; i < from_list.size(); ++i) {
    EXPECT_EQ(WorkloadResponseLength(config, list_keys[i][0], list_keys[i][1], list_keys[i][2]),
              from_list[i]);
  }
  config.seed = 11;
  config.all_equal_rate = 0.3;
  config.orchestrator.samples_per_prompt = 4;
  const std::vector<std::vector<double>> rewards = {
      {1, 0, 0, 1}, {1, 1, 1, 0}, {1, 0, 1, 0}, {0, 0, 0, 0}, {0, 1, 1, 0}};
  for (std::int64_t g = 0; g < 5; ++g) {
    EXPECT_EQ(WorkloadGroupRewards(config, g), rewards[static_cast<std::size_t>(g)]) << g;
  }
  // Prompt tokens: in range, fixed per prompt id, not all equal.
  std::vector<std::int64_t> tokens;
  for (std::int64_t prompt = 0; prompt < 64; ++prompt) {
    tokens.push_back(WorkloadPromptTokens(config, prompt));
    EXPECT_EQ(WorkloadPromptTokens(config, prompt), tokens.back());
    EXPECT_GE(tokens.back(), config.lengths.min_prompt_tokens);
    EXPECT_LE(tokens.back(), config.lengths.max_prompt_tokens);
  }
  EXPECT_NE(*std::min_element(tokens.begin(), tokens.end()),
            *std::max_element(tokens.begin(), tokens.end()));
}

TEST(SimulatorValidate, DefaultsAreValid) {
  EXPECT_NO_THROW(Validate(DefaultSimulatorConfig()));
  EXPECT_NO_THROW(Validate(TinyConfig()));
}

TEST(SimulatorValidate, NamesTheField) {
  struct Case {
    const char* field;
    void (*mutate)(SimulatorConfig&);
  };
  const Case cases[] = {
      {"steps: must be >= 1, got 0", [](SimulatorConfig& c) { c.steps = 0; }},
      {"engine.kv_cache_tokens: must be >= 0, got -1",
       [](SimulatorConfig& c) { c.engine.kv_cache_tokens = -1; }},
      {"trainer_scaling_exponent: must be > 0, got 0",
       [](SimulatorConfig& c) { c.trainer_scaling_exponent = 0; }},
      {"trainer_scaling_exponent: must be <= 2, got 2.5",
       [](SimulatorConfig& c) { c.trainer_scaling_exponent = 2.5; }},
      {"trainer_reference_ranks: must be >= 0, got -1",
       [](SimulatorConfig& c) { c.trainer_reference_ranks = -1; }},
      {"trainer_offload_seconds: must be finite, got nan",
       [](SimulatorConfig& c) { c.trainer_offload_seconds = std::nan(""); }},
      {"engines: must be <= 100000", [](SimulatorConfig& c) { c.engines = 100'001; }},
      {"engine.max_concurrent: must be >= 1, got 0",
       [](SimulatorConfig& c) { c.engine.max_concurrent = 0; }},
      {"engine.prefill_tokens_per_second: must be > 0",
       [](SimulatorConfig& c) { c.engine.prefill_tokens_per_second = 0; }},
      {"engine.decode_per_context_token_seconds: must be >= 0",
       [](SimulatorConfig& c) { c.engine.decode_per_context_token_seconds = -1; }},
      {"engine.decode_base_seconds",
       [](SimulatorConfig& c) {
         c.engine.decode_base_seconds = 0;
         c.engine.decode_per_sequence_seconds = 0;
       }},
      {"step.num_ranks: must be >= 1", [](SimulatorConfig& c) { c.step.num_ranks = 0; }},
      {"seconds_per_cost_unit: must be > 0",
       [](SimulatorConfig& c) { c.seconds_per_cost_unit = 0; }},
      {"weight_sync_seconds: must be finite",
       [](SimulatorConfig& c) { c.weight_sync_seconds = 1.0 / 0.0; }},
      {"dataset_prompts: must be >= 1", [](SimulatorConfig& c) { c.dataset_prompts = 0; }},
      {"lengths.sigma: must be >= 0", [](SimulatorConfig& c) { c.lengths.sigma = -1; }},
      {"lengths.lengths[1]: must be >= 1",
       [](SimulatorConfig& c) {
         c.lengths.lengths = {5, 0};
       }},
      {"lengths.max_prompt_tokens: must be >= 100",
       [](SimulatorConfig& c) { c.lengths.max_prompt_tokens = 50; }},
      {"lengths.length_correlation: must be <= 1",
       [](SimulatorConfig& c) { c.lengths.length_correlation = 1.5; }},
      {"all_equal_rate: must be >= 0", [](SimulatorConfig& c) { c.all_equal_rate = -0.1; }},
      {"all_equal_rate: must be < 1 with filter_all_equal",
       [](SimulatorConfig& c) {
         c.filter_all_equal = true;
         c.all_equal_rate = 1;
       }},
      {"orchestrator.samples_per_prompt: must be >= 2 with filter_all_equal",
       [](SimulatorConfig& c) {
         c.filter_all_equal = true;
         c.orchestrator.samples_per_prompt = 1;
       }},
      {"engine_mtbf_seconds: must be >= 0", [](SimulatorConfig& c) { c.engine_mtbf_seconds = -5; }},
      {"rejoin_seconds: must be >= 0", [](SimulatorConfig& c) { c.rejoin_seconds = -1; }},
      {"orchestrator.prompts_per_step",
       [](SimulatorConfig& c) { c.orchestrator.prompts_per_step = 0; }},
      {"orchestrator.max_staleness", [](SimulatorConfig& c) { c.orchestrator.max_staleness = -1; }},
      {"orchestrator.prompts_per_step: ceil((1 + oversample)",
       [](SimulatorConfig& c) {
         c.orchestrator.prompts_per_step = 5'000'000;
         c.orchestrator.samples_per_prompt = 8;
       }},
      {"step.micro_batch.max_tokens_per_micro_batch: must be >= the longest sequence",
       [](SimulatorConfig& c) { c.step.micro_batch.max_tokens_per_micro_batch = 8192; }},
      {"step.", [](SimulatorConfig& c) { c.step.micro_batch.min_micro_batches = 0; }},
      {"orchestrator.max_response_tokens: must be 0 or >= the workload's longest response "
       "(16384), got 16383",
       [](SimulatorConfig& c) { c.orchestrator.max_response_tokens = 16383; }},
  };
  for (const Case& test : cases) {
    SimulatorConfig config = DefaultSimulatorConfig();
    test.mutate(config);
    const std::string message = ValidateMessage(config);
    EXPECT_NE(message.find(test.field), std::string::npos)
        << "expected '" << test.field << "' in: " << message;
    EXPECT_THROW(Simulate(config), std::invalid_argument) << test.field;
  }
}

// The timeline of TinyConfig is exactly computable: each step generates for 10 s
// (10 decode steps of 1 s) and trains for 10 s; the weight sync takes no time.
TEST(SimulatorScenario, TinySyncTimeline) {
  SimulatorConfig config = TinyConfig();
  config.trace = true;
  const SimulationReport report = Simulate(config);
  constexpr double kEps = 1e-6;  // the prefill at 1e12 tokens/s
  EXPECT_NEAR(report.metrics.elapsed_seconds, 60.0, kEps);
  EXPECT_NEAR(report.mean_generation_seconds, 10.0, kEps);
  EXPECT_NEAR(report.mean_train_seconds, 10.0, kEps);
  EXPECT_NEAR(report.metrics.samples_per_second, 6.0 / 60.0, kEps);
  EXPECT_NEAR(report.metrics.trainer_idle_ratio, 0.5, kEps);
  EXPECT_NEAR(report.metrics.mean_engine_idle_ratio, 0.5, kEps);
  EXPECT_EQ(report.counters.trained, 6);
  EXPECT_EQ(report.counters.trained_tokens, 6 * 110);
  EXPECT_EQ(report.counters.steps_finished, 3);
  EXPECT_EQ(report.metrics.max_staleness, 0);
  // Engine: 2 samples in parallel, 10 steps of 1 s each → 0.2 samples/s; trainer:
  // 2 samples per 10 s.
  EXPECT_NEAR(report.engine_capacity_samples_per_second, 0.2, kEps);
  EXPECT_NEAR(report.trainer_capacity_samples_per_second, 0.2, kEps);
  EXPECT_NEAR(report.ideal_samples_per_second, 0.2, kEps);
  ExpectConserved(report);
  // The trace: the train steps at [10, 20], [30, 40], [50, 60] s on the trainer.
  const std::string& trace = report.trace_json;
  EXPECT_NE(trace.find("\"traceEvents\""), std::string::npos);
  EXPECT_NE(trace.find("\"name\":\"engine 0\""), std::string::npos);
  EXPECT_NE(trace.find("\"name\":\"trainer\""), std::string::npos);
  EXPECT_NE(trace.find("\"name\":\"step 0\",\"ph\":\"X\",\"pid\":2,\"tid\":0,\"ts\":10000000.000,"
                       "\"dur\":10000000.000"),
            std::string::npos)
      << trace;
  // (ts rounded to the microsecond's thousandths: the prefill adds ~1e-10 s per step.)
  EXPECT_NE(trace.find("\"name\":\"step 2\",\"ph\":\"X\",\"pid\":2,\"tid\":0,\"ts\":5000000"),
            std::string::npos);
  EXPECT_NE(trace.find("\"name\":\"generate\",\"ph\":\"X\",\"pid\":1,\"tid\":0,\"ts\":0.000,"),
            std::string::npos);
}

// Context growth in closed form: with b = 0.01 s per context token, two samples of
// 100 prompt + up to 10 generated tokens: Σ_{k=0}^{9} (1 + 0.01·(200 + 2k)) = 30.9 s.
TEST(SimulatorScenario, DecodeStepsSumInClosedForm) {
  SimulatorConfig config = TinyConfig();
  config.engine.decode_per_context_token_seconds = 0.01;
  config.engine.decode_per_sequence_seconds = 0.25;  // + 10 steps × 2 × 0.25 = 5 s
  const SimulationReport report = Simulate(config);
  EXPECT_NEAR(report.mean_generation_seconds, 35.9, 1e-6);
  EXPECT_NEAR(report.metrics.elapsed_seconds, 3 * (35.9 + 10.0), 1e-6);
  ExpectConserved(report);
}

// A weight sync is on the critical path in sync mode: 3 steps, 2 syncs of 2 s.
TEST(SimulatorScenario, SyncTimeIsOnTheCriticalPath) {
  SimulatorConfig config = TinyConfig();
  config.weight_sync_seconds = 2.0;
  config.trace = true;
  const SimulationReport report = Simulate(config);
  EXPECT_NEAR(report.metrics.elapsed_seconds, 64.0, 1e-6);
  EXPECT_EQ(report.metrics.weight_syncs, 2);
  EXPECT_NEAR(report.metrics.weight_sync_seconds, 4.0, 1e-6);
  // Step 0 trains over [10, 20] s, the engine loads version 1 over [20, 22] s.
  EXPECT_NE(report.trace_json.find(
                "\"name\":\"sync v1\",\"ph\":\"X\",\"pid\":1,\"tid\":0,\"ts\":20000000.000,"
                "\"dur\":2000000.000"),
            std::string::npos)
      << report.trace_json;
}

// TinyConfig in async with staleness 1 and partial rollout (syncs interrupt), traced,
// the trainer `train_seconds` a step and a sync `sync_seconds`.
SimulatorConfig TinyInterrupting(double train_seconds, double sync_seconds) {
  SimulatorConfig config = TinyConfig();
  config.orchestrator.mode = Mode::kAsync;
  config.orchestrator.max_staleness = 1;
  config.orchestrator.partial_rollout = true;
  config.seconds_per_cost_unit = train_seconds / 220.0;
  config.weight_sync_seconds = sync_seconds;
  config.trace = true;
  return config;
}

// An interrupting sync in the middle of a decode step takes effect at the step's end,
// keeping its tokens. Async, staleness 1, partial rollout, the trainer 10.5 s a step,
// a sync 2 s. Group 0 decodes over [0, 10] s and trains over [10, 20.5]; group 1
// decodes over [10, 20] and trains over [20.5, 31]; the idle engine loads version 1
// over [20.5, 22.5], then decodes group 2 from 22.5. Version 2 comes at 31 s, half-way
// through group 2's ninth step: the engine pauses at 31.5 with 9 tokens per sample,
// loads over [31.5, 33.5], decodes the last token over [33.5, 34.5]; step 2 trains
// over [34.5, 45]. (Were the step in progress dropped, the engine would pause at 31
// with 8 tokens and step 2 would start at 35.)
TEST(SimulatorScenario, InterruptWaitsForTheStepInProgress) {
  const SimulationReport report = Simulate(TinyInterrupting(10.5, 2.0));
  const std::string& trace = report.trace_json;
  EXPECT_NE(trace.find("\"name\":\"sync v2\",\"ph\":\"X\",\"pid\":1,\"tid\":0,"
                       "\"ts\":31500000.000,\"dur\":2000000.000"),
            std::string::npos)
      << trace;
  EXPECT_NE(trace.find("\"name\":\"step 2\",\"ph\":\"X\",\"pid\":2,\"tid\":0,\"ts\":34500000"),
            std::string::npos)
      << trace;
  EXPECT_NEAR(report.metrics.elapsed_seconds, 45.0, 1e-6);
  EXPECT_EQ(report.metrics.weight_syncs, 2);
  // Group 2's samples hold tokens of versions 1 and 2.
  EXPECT_EQ(report.counters.partial_samples, 2);
  EXPECT_EQ(report.counters.discarded_tokens, 0);
  EXPECT_EQ(report.counters.trained, 6);
  ExpectConserved(report);
}

// A sync at the very time a decode step completes samples, handled before their finish
// (a tie in time): they finish first, then the others pause. Async, staleness 1, partial
// rollout, the trainer 13.75 s a step, a sync of 3.75 - 2^-10 s, a prefill of 2^-11 s
// per sample (every time exact in binary). Version 2 comes at 37.5 + 2^-10 s (two
// prefills), when group 2's samples reach their last token: they finish and step 2
// starts then (were they paused, they would finish only after the load, and step 2
// would start at 41.25).
TEST(SimulatorScenario, InterruptAtAFinishLetsTheSamplesFinish) {
  SimulatorConfig config = TinyInterrupting(13.75, 3.75 - 1.0 / 1024);
  config.engine.prefill_tokens_per_second = 204800;  // 100 tokens in 2^-11 s
  const SimulationReport report = Simulate(config);
  EXPECT_NE(report.trace_json.find(
                "\"name\":\"step 2\",\"ph\":\"X\",\"pid\":2,\"tid\":0,\"ts\":37500976.562"),
            std::string::npos)
      << report.trace_json;
  EXPECT_EQ(report.counters.trained, 6);
  ExpectConserved(report);
}

TEST(SimulatorDeterminism, SameSeedSameReportAndTrace) {
  SimulatorConfig config = SmallConfig();
  config.orchestrator.mode = Mode::kAsync;
  config.orchestrator.max_staleness = 1;
  config.orchestrator.oversample = 0.25;
  config.filter_all_equal = true;
  config.all_equal_rate = 0.2;
  config.trace = true;
  const SimulationReport a = Simulate(config);
  const SimulationReport b = Simulate(config);
  EXPECT_EQ(a.trace_json, b.trace_json);
  EXPECT_FALSE(a.trace_json.empty());
  EXPECT_EQ(a.events, b.events);
  EXPECT_EQ(a.metrics.elapsed_seconds, b.metrics.elapsed_seconds);
  EXPECT_EQ(a.metrics.engine_idle_ratio, b.metrics.engine_idle_ratio);
  EXPECT_EQ(a.metrics.staleness_histogram, b.metrics.staleness_histogram);
  EXPECT_EQ(a.counters.trained_tokens, b.counters.trained_tokens);
  EXPECT_EQ(a.counters.filtered, b.counters.filtered);
  EXPECT_EQ(a.mean_generation_seconds, b.mean_generation_seconds);
  EXPECT_EQ(a.ideal_samples_per_second, b.ideal_samples_per_second);

  config.seed = 2;
  const SimulationReport c = Simulate(config);
  EXPECT_NE(a.trace_json, c.trace_json);
}

// Async with s = 1 and partial rollout overlaps generation and training: at least the
// sync throughput, and (the admission policy, the default) no token is thrown away.
TEST(SimulatorModes, AsyncBeatsSync) {
  SimulatorConfig config = SmallConfig();
  const SimulationReport sync = Simulate(config);
  config.orchestrator.mode = Mode::kAsync;
  config.orchestrator.max_staleness = 1;
  config.orchestrator.partial_rollout = true;
  const SimulationReport async = Simulate(config);
  EXPECT_GE(async.metrics.samples_per_second, sync.metrics.samples_per_second);
  EXPECT_LT(async.metrics.trainer_idle_ratio, sync.metrics.trainer_idle_ratio);
  EXPECT_EQ(sync.metrics.max_staleness, 0);
  EXPECT_EQ(async.counters.stale_discarded_tokens, 0);
  EXPECT_EQ(async.counters.discarded_tokens, 0);
  EXPECT_LE(async.metrics.samples_per_second, async.ideal_samples_per_second * (1 + 1e-9));
}

struct ModeCase {
  Mode mode;
  std::int64_t staleness;
  bool partial;
  StalenessPolicy policy = StalenessPolicy::kStrict;
};

const ModeCase kModes[] = {
    {Mode::kSync, 0, false},
    {Mode::kOneStepOff, 1, false},
    {Mode::kAsync, 0, true},
    {Mode::kAsync, 1, false},
    {Mode::kAsync, 1, true},
    {Mode::kAsync, 2, false},
    {Mode::kAsync, 2, true},
    {Mode::kAsync, 0, true, StalenessPolicy::kAdmission},
    {Mode::kAsync, 1, false, StalenessPolicy::kAdmission},
    {Mode::kAsync, 1, true, StalenessPolicy::kAdmission},
    {Mode::kAsync, 2, true, StalenessPolicy::kAdmission},
};

std::int64_t Bound(const ModeCase& m) {
  return m.mode == Mode::kSync ? 0 : m.mode == Mode::kOneStepOff ? 1 : m.staleness;
}

// Every mode, with over-sampling and dynamic sampling: all steps train P·G samples,
// conservation holds at the end; under the strict policy no sample is staler than the
// bound, under admission no token is discarded (the core checks its own bound on every
// trained sample).
TEST(SimulatorModes, ConservationAndStalenessInEveryMode) {
  for (const ModeCase& m : kModes) {
    SimulatorConfig config = SmallConfig();
    config.orchestrator.mode = m.mode;
    config.orchestrator.max_staleness = m.staleness;
    config.orchestrator.partial_rollout = m.partial;
    config.orchestrator.staleness_policy = m.policy;
    config.orchestrator.oversample = 0.5;
    config.filter_all_equal = true;
    config.all_equal_rate = 0.3;
    SCOPED_TRACE(testing::Message()
                 << "mode " << static_cast<int>(m.mode) << " s " << m.staleness << " partial "
                 << m.partial << " policy " << static_cast<int>(m.policy));
    const SimulationReport report = Simulate(config);
    ExpectConserved(report);
    EXPECT_EQ(report.counters.steps_finished, config.steps);
    EXPECT_EQ(report.counters.trained, config.steps * 16 * 4);
    EXPECT_GT(report.counters.filtered, 0);
    if (m.mode != Mode::kAsync || m.policy == StalenessPolicy::kStrict) {
      EXPECT_LE(report.metrics.max_staleness, Bound(m));
      EXPECT_LE(static_cast<std::int64_t>(report.metrics.staleness_histogram.size()), Bound(m) + 1);
    } else {
      EXPECT_EQ(report.counters.stale_restarts, 0);
      EXPECT_EQ(report.counters.stale_discarded_tokens, 0);
    }
    std::int64_t histogram_total = 0;
    for (const std::int64_t count : report.metrics.staleness_histogram) histogram_total += count;
    EXPECT_EQ(histogram_total, report.counters.trained);
  }
}

// Partial rollout interrupts and resumes: some trained samples span two versions.
TEST(SimulatorModes, PartialRolloutResumesSamples) {
  SimulatorConfig config = SmallConfig();
  config.orchestrator.mode = Mode::kAsync;
  config.orchestrator.max_staleness = 2;
  config.orchestrator.partial_rollout = true;
  config.orchestrator.oversample = 0.5;
  config.steps = 8;
  const SimulationReport report = Simulate(config);
  EXPECT_GT(report.counters.partial_samples, 0);
  EXPECT_GT(report.metrics.partial_rollout_ratio, 0);
  EXPECT_EQ(report.counters.stale_discarded_tokens, 0);  // admission keeps every token
  ExpectConserved(report);
}

// Pause mode abort: the paused samples are dispatched to their engine again with their
// tokens (no Resume; a Resume of an aborted sample would fail the run), at the same
// cost as keeping them (prefilled again either way).
TEST(SimulatorModes, AbortPauseResubmitsSamples) {
  SimulatorConfig config = SmallConfig();
  config.orchestrator.mode = Mode::kAsync;
  config.orchestrator.max_staleness = 2;
  config.orchestrator.partial_rollout = true;
  config.orchestrator.pause_mode = PauseMode::kAbort;
  config.orchestrator.oversample = 0.5;
  config.steps = 8;
  config.check_invariants = true;
  const SimulationReport report = Simulate(config);
  EXPECT_GT(report.counters.resubmitted, 0);
  EXPECT_GT(report.counters.partial_samples, 0);
  EXPECT_EQ(report.counters.discarded_tokens, 0);  // resubmitted with their tokens
  EXPECT_EQ(report.counters.trained, config.steps * 16 * 4);
  ExpectConserved(report);
  config.orchestrator.pause_mode = PauseMode::kKeep;
  const SimulationReport kept = Simulate(config);
  EXPECT_EQ(kept.counters.resubmitted, 0);
  EXPECT_DOUBLE_EQ(report.metrics.samples_per_second, kept.metrics.samples_per_second);
  EXPECT_EQ(report.counters.partial_samples, kept.counters.partial_samples);
}

// Engines fail (mean time between failures ~ a few steps) and replacements join: every
// mode still finishes its steps and conserves its samples.
TEST(SimulatorBudget, EstimateFromTheWorkload) {
  SimulatorConfig config = SmallConfig();
  const double samples = static_cast<double>(config.steps * 16 * 4);
  EXPECT_EQ(EstimatedSampleAttempts(config), samples);  // no failures: one attempt each
  // Failures: more attempts as they get frequent; keeping partial work needs fewer.
  double previous = samples;
  for (const double mtbf : {1e6, 1e4, 1e3, 300.0, 100.0}) {
    config.engine_mtbf_seconds = mtbf;
    config.orchestrator.keep_partial_on_failure = false;
    const double restart = EstimatedSampleAttempts(config);
    config.orchestrator.keep_partial_on_failure = true;
    const double keep = EstimatedSampleAttempts(config);
    EXPECT_GT(restart, previous) << mtbf;
    EXPECT_GE(restart, keep) << mtbf;
    EXPECT_GT(keep, samples) << mtbf;
    previous = restart;
  }
  // A list of lengths: E[exp(L·t/m)] by hand.
  config.lengths.lengths = {100, 300};
  config.engine_mtbf_seconds = 50;
  config.orchestrator.keep_partial_on_failure = false;
  const double t = config.engine.decode_base_seconds + config.engine.decode_per_sequence_seconds;
  EXPECT_NEAR(EstimatedSampleAttempts(config),
              samples * (std::exp(100 * t / 50) + std::exp(300 * t / 50)) / 2, 1e-6 * samples);
}

TEST(SimulatorBudget, RefusesBeforeRunning) {
  SimulatorConfig config = SmallConfig();
  config.engine_mtbf_seconds = 1e-9;  // every engine fails at once, forever
  try {
    (void)Simulate(config);
    ADD_FAILURE() << "no error";
  } catch (const FieldError& e) {
    EXPECT_EQ(e.field(), "engine_mtbf_seconds");
    EXPECT_NE(std::string(e.what()).find("max_events"), std::string::npos) << e.what();
  }
  config = SmallConfig();
  config.max_events = 10;
  try {
    (void)Simulate(config);
    ADD_FAILURE() << "no error";
  } catch (const FieldError& e) {
    EXPECT_EQ(e.field(), "max_events");
  }
  // Within the budget it runs; the budget is the estimate, not a guess.
  config.max_events = static_cast<std::int64_t>(EstimatedSampleAttempts(config)) * 4;
  EXPECT_EQ(Simulate(config).counters.steps_finished, config.steps);
}

TEST(SimulatorBudget, StopCheckIsAskedBetweenEvents) {
  SimulatorConfig config = SmallConfig();
  config.check_invariants = false;
  config.steps = 20;
  config.orchestrator.prompts_per_step = 64;  // 20 × 64 × 4 samples: several checks
  std::int64_t asked = 0;
  const SimulationReport report = Simulate(config, [&] {
    ++asked;
    return false;
  });
  EXPECT_EQ(asked, report.events / kStopCheckEvents);
  asked = 0;
  EXPECT_THROW(Simulate(config,
                        [&] {
                          ++asked;
                          return asked == 2;
                        }),
               Stopped);
  EXPECT_EQ(asked, 2);
}

TEST(SimulatorFaults, FailuresFinishAndConserve) {
  for (const ModeCase& m : kModes) {
    for (const bool keep : {false, true}) {
      SimulatorConfig config = SmallConfig();
      config.orchestrator.mode = m.mode;
      config.orchestrator.max_staleness = m.staleness;
      config.orchestrator.partial_rollout = m.partial;
      config.orchestrator.staleness_policy = m.policy;
      config.orchestrator.keep_partial_on_failure = keep;
      config.engine_mtbf_seconds = 150;
      config.rejoin_seconds = 10;
      SCOPED_TRACE(testing::Message() << "mode " << static_cast<int>(m.mode) << " s " << m.staleness
                                      << " partial " << m.partial << " keep " << keep);
      const SimulationReport report = Simulate(config);
      ExpectConserved(report);
      EXPECT_EQ(report.counters.steps_finished, config.steps);
      if (m.mode != Mode::kAsync || m.policy == StalenessPolicy::kStrict) {
        EXPECT_LE(report.metrics.max_staleness, Bound(m));
      } else {
        EXPECT_EQ(report.counters.stale_discarded_tokens, 0);
      }
      // Engines failed, and each replacement took its failed engine's slot.
      EXPECT_GT(report.counters.engine_failures, 0);
      EXPECT_EQ(report.metrics.engines.size(), 4U);
    }
  }
}

// A random small configuration: any mode, staleness, over-sampling, dynamic sampling,
// failures, list or lognormal lengths, tiny engines (so slots are scarce).
SimulatorConfig RandomConfig(std::uint64_t seed) {
  workload::Rng rng(seed * 7919);
  SimulatorConfig c = DefaultSimulatorConfig();
  const std::int64_t mode = rng.UniformInt(0, 2);
  c.orchestrator.mode = mode == 0 ? Mode::kSync : mode == 1 ? Mode::kOneStepOff : Mode::kAsync;
  c.orchestrator.max_staleness = rng.UniformInt(0, 3);
  c.orchestrator.partial_rollout = rng.UniformInt(0, 1) == 1;
  c.orchestrator.staleness_policy =
      rng.UniformInt(0, 1) == 1 ? StalenessPolicy::kStrict : StalenessPolicy::kAdmission;
  c.orchestrator.oversample = 0.25 * static_cast<double>(rng.UniformInt(0, 4));
  c.orchestrator.prompts_per_step = rng.UniformInt(1, 12);
  c.orchestrator.samples_per_prompt = rng.UniformInt(1, 6);
  c.orchestrator.keep_partial_on_failure = rng.UniformInt(0, 1) == 1;
  c.steps = rng.UniformInt(1, 8);
  c.engines = rng.UniformInt(1, 6);
  c.engine.max_concurrent = rng.UniformInt(1, 12);
  c.step.num_ranks = rng.UniformInt(1, 4);
  c.lengths.mu = 4.0;
  c.lengths.max_tokens = 1024;
  if (rng.UniformInt(0, 3) == 0) c.lengths.lengths = {1, 5, 50, 300};
  c.lengths.length_correlation = rng.UniformReal();
  c.dataset_prompts = rng.UniformInt(1, 50);
  c.weight_sync_seconds = 0.5 * static_cast<double>(rng.UniformInt(0, 2));
  c.seconds_per_cost_unit = 1e-3 * static_cast<double>(rng.UniformInt(1, 20));
  if (c.orchestrator.samples_per_prompt >= 2 && rng.UniformInt(0, 1) == 1) {
    c.filter_all_equal = true;
    c.all_equal_rate = 0.4;
  }
  if (rng.UniformInt(0, 2) == 0) {
    c.engine_mtbf_seconds = 5 + 50 * rng.UniformReal();
    c.rejoin_seconds = static_cast<double>(rng.UniformInt(0, 10));
  }
  // The fraction policy, streaming and colocated mode.
  if (c.orchestrator.mode == Mode::kAsync && rng.UniformInt(0, 2) == 0) {
    c.orchestrator.staleness_policy = StalenessPolicy::kFraction;
    c.orchestrator.staleness_fraction = 0.25 * static_cast<double>(rng.UniformInt(0, 6));
  }
  if (rng.UniformInt(0, 2) == 0) {
    c.orchestrator.train_calls_per_sync = c.orchestrator.prompts_per_step;
    c.train_call_overhead_seconds = 0.1;
  }
  if (c.orchestrator.mode == Mode::kSync && rng.UniformInt(0, 1) == 0) {
    c.orchestrator.colocated = true;
    c.release_seconds = static_cast<double>(rng.UniformInt(0, 2));
    c.resume_seconds = static_cast<double>(rng.UniformInt(0, 2));
  }
  if (c.orchestrator.mode == Mode::kAsync && c.orchestrator.partial_rollout &&
      rng.UniformInt(0, 1) == 0) {
    c.orchestrator.pause_mode = PauseMode::kAbort;
  }
  c.check_invariants = true;
  c.seed = seed;
  return c;
}

// A KV cache that holds a few samples' contexts (so that engines wait and preempt), and
// the trainer's scaling and offload.
SimulatorConfig WithKvCacheAndScaling(SimulatorConfig c, std::uint64_t seed) {
  workload::Rng rng(seed * 104729);
  c.engine.kv_cache_tokens = rng.UniformInt(1, 8) * 400;
  c.trainer_scaling_exponent = 0.25 * static_cast<double>(rng.UniformInt(1, 8));
  c.trainer_reference_ranks = rng.UniformInt(0, 4);
  c.trainer_offload_seconds = 0.5 * static_cast<double>(rng.UniformInt(0, 2));
  return c;
}

void CheckRandomConfigs(std::uint64_t first, std::uint64_t count, bool kv_cache = false) {
  for (std::uint64_t seed = first; seed < first + count; ++seed) {
    const SimulatorConfig config =
        kv_cache ? WithKvCacheAndScaling(RandomConfig(seed), seed) : RandomConfig(seed);
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    SimulationReport report;
    ASSERT_NO_THROW(report = Simulate(config));
    ExpectConserved(report);
    EXPECT_EQ(report.counters.steps_finished, config.steps);
    EXPECT_EQ(report.counters.trained, config.steps * config.orchestrator.prompts_per_step *
                                           config.orchestrator.samples_per_prompt);
    const std::int64_t bound = EffectiveStaleness(config.orchestrator);
    if (config.orchestrator.mode != Mode::kAsync ||
        config.orchestrator.staleness_policy == StalenessPolicy::kStrict) {
      EXPECT_LE(report.metrics.max_staleness, bound);
    } else {
      EXPECT_EQ(report.counters.stale_discarded_tokens, 0);
    }
  }
}

// Random small configurations (every feature at once, the core's invariants checked
// after every event): each run finishes, conserves and keeps the bound.
TEST(SimulatorProperty, RandomConfigsFinishConserveAndKeepTheBound) { CheckRandomConfigs(1, 60); }

// Seeds (found by a search of 30,000) where the core aborts every running sample of an
// engine whose interrupting sync waits for the step in progress (the pause then comes
// at once, with no step to wait for), and one where that engine fails while it waits.
TEST(SimulatorProperty, AbortOfEverySampleWhileAPauseWaits) {
  CheckRandomConfigs(1454, 1);
  CheckRandomConfigs(12737, 1);
  CheckRandomConfigs(2340, 1);  // an engine fails while its pause waits
}

TEST(SimulatorThorough, RandomConfigs) { CheckRandomConfigs(1000, 800); }

// The same with a small KV cache (samples wait and are preempted; interrupts pause the
// waiting ones) and the trainer's scaling and offload.
TEST(SimulatorProperty, RandomConfigsWithAKvCache) { CheckRandomConfigs(1, 60, true); }
TEST(SimulatorThorough, RandomConfigsWithAKvCache) { CheckRandomConfigs(1000, 400, true); }

// A KV cache that holds every running context changes nothing; a small one makes the
// engines wait and preempt, and generation slower; the bound on the engines' capacity
// falls with it.
TEST(SimulatorKvCache, BoundsConcurrency) {
  SimulatorConfig config = SmallConfig();
  const SimulationReport unbounded = Simulate(config);
  config.engine.kv_cache_tokens = std::int64_t{1} << 40;
  const SimulationReport large = Simulate(config);
  EXPECT_EQ(large.metrics.elapsed_seconds, unbounded.metrics.elapsed_seconds);
  EXPECT_EQ(large.preemptions, 0);
  config.engine.kv_cache_tokens = 3000;
  const SimulationReport small = Simulate(config);
  ExpectConserved(small);
  EXPECT_EQ(small.counters.trained, unbounded.counters.trained);
  // Sync trains the same samples, each with every token it was drawn with.
  EXPECT_EQ(small.counters.trained_tokens, unbounded.counters.trained_tokens);
  EXPECT_GT(small.preemptions, 0);
  EXPECT_GT(small.metrics.generation_seconds_per_step,
            1.2 * unbounded.metrics.generation_seconds_per_step);
  EXPECT_LT(small.engine_capacity_samples_per_second, unbounded.engine_capacity_samples_per_second);
}

// Seeded sync runs: whatever the KV cache (samples waiting, preempted and prefilled
// again), every trained sample has all the tokens it was drawn with.
TEST(SimulatorKvCache, PreemptedSamplesKeepTheirLengths) {
  std::int64_t preemptions = 0;
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    SimulatorConfig config = RandomConfig(seed);
    config.orchestrator =
        OrchestratorPolicy{.prompts_per_step = config.orchestrator.prompts_per_step,
                           .samples_per_prompt = config.orchestrator.samples_per_prompt};
    config.filter_all_equal = false;
    config.engine_mtbf_seconds = 0;
    const SimulationReport unbounded = Simulate(config);
    config.engine.kv_cache_tokens = 300 + 100 * static_cast<std::int64_t>(seed % 7);
    const SimulationReport small = Simulate(config);
    ExpectConserved(small);
    EXPECT_EQ(small.counters.trained_tokens, unbounded.counters.trained_tokens);
    preemptions += small.preemptions;
  }
  EXPECT_GT(preemptions, 40);
}

// The trainer's compute time scales by (ranks / reference)^(1 − exponent); the offload
// adds its seconds once per step; CostUnitForStepSeconds takes both into account, its
// seconds measured at the reference ranks.
TEST(SimulatorTrainer, ScalingAndOffload) {
  SimulatorConfig config = SmallConfig();
  const double linear = Simulate(config).mean_train_seconds;
  config.trainer_scaling_exponent = 0.5;
  config.trainer_reference_ranks = 2;  // 8 ranks: 4^0.5 = 2x the linear time
  EXPECT_NEAR(Simulate(config).mean_train_seconds, 2 * linear, 1e-9 * linear);
  config.trainer_offload_seconds = 7;
  EXPECT_NEAR(Simulate(config).mean_train_seconds, 2 * linear + 7, 1e-9 * linear);
  config.seconds_per_cost_unit = CostUnitForStepSeconds(config, 40);  // at 2 ranks
  // At 8 ranks: the offload and (40 − 7) · (2/8)^0.5 of compute (within the probe
  // batches' 15%).
  EXPECT_NEAR(Simulate(config).mean_train_seconds, 7 + 33 * 0.5, 3);
  config.trainer_reference_ranks = 8;
  config.seconds_per_cost_unit = CostUnitForStepSeconds(config, 40);
  EXPECT_NEAR(Simulate(config).mean_train_seconds, 40, 6);
  // The colocated baseline keeps the measured reference: with 12 ranks instead of 8 the
  // step takes (8/12)^0.5 of the time (plus the offload).
  config.orchestrator.mode = Mode::kSync;
  config.trainer_reference_ranks = 0;
  config.trainer_offload_seconds = 0;
  const std::optional<SimulatorConfig> baseline = ColocatedBaseline(config);
  ASSERT_TRUE(baseline.has_value());
  EXPECT_EQ(baseline->trainer_reference_ranks, config.step.num_ranks);
}

// Colocated sync is sync with the switches added: the same decisions, each step later
// by release_seconds (before training) and resume_seconds (before the next generation;
// none after the last step).
TEST(SimulatorColocated, AddsTheSwitchTimesToSync) {
  SimulatorConfig config = SmallConfig();
  config.orchestrator.mode = Mode::kSync;
  const SimulationReport sync = Simulate(config);
  config.orchestrator.colocated = true;
  config.release_seconds = 2;
  config.resume_seconds = 3;
  const SimulationReport colocated = Simulate(config);
  ExpectConserved(colocated);
  EXPECT_EQ(colocated.counters.trained, sync.counters.trained);
  const double steps = static_cast<double>(config.steps);
  EXPECT_NEAR(colocated.metrics.elapsed_seconds - sync.metrics.elapsed_seconds,
              2 * steps + 3 * (steps - 1), 1e-6);
  // The engines are idle while the trainer runs: at least the training share.
  EXPECT_GE(colocated.metrics.mean_engine_idle_ratio,
            1 - colocated.metrics.trainer_idle_ratio - 1e-9);
  // The ideal bound of alternating sides is below either side's capacity.
  EXPECT_LT(colocated.ideal_samples_per_second,
            std::min(colocated.engine_capacity_samples_per_second,
                     colocated.trainer_capacity_samples_per_second));
}

TEST(SimulatorColocated, BaselineTakesAllTheGpus) {
  SimulatorConfig config = SmallConfig();
  config.orchestrator.mode = Mode::kAsync;
  config.gpus_per_engine = 2;  // 4 engines × 2 + 8 ranks × 1 = 16 GPUs
  const std::optional<SimulatorConfig> baseline = ColocatedBaseline(config);
  ASSERT_TRUE(baseline.has_value());
  EXPECT_EQ(baseline->engines, 8);
  EXPECT_EQ(baseline->step.num_ranks, 16);
  EXPECT_EQ(baseline->orchestrator.mode, Mode::kSync);
  EXPECT_TRUE(baseline->orchestrator.colocated);
  ExpectConserved(Simulate(*baseline));
  config.gpus_per_engine = 3;  // 20 GPUs: not a whole number of engines
  EXPECT_FALSE(ColocatedBaseline(config).has_value());
}

// Streaming: k calls per step, the same samples trained; the trainer starts on the
// first P/k complete groups, so it waits less than with whole batches.
TEST(SimulatorStreaming, TrainsInCallsAndWaitsLess) {
  SimulatorConfig config = SmallConfig();
  config.orchestrator.mode = Mode::kAsync;
  config.orchestrator.staleness_policy = StalenessPolicy::kFraction;
  config.orchestrator.staleness_fraction = 0;  // on-policy: overlap only within a step
  const SimulationReport whole = Simulate(config);
  config.orchestrator.train_calls_per_sync = 4;
  const SimulationReport streamed = Simulate(config);
  ExpectConserved(streamed);
  EXPECT_EQ(streamed.counters.trained, whole.counters.trained);
  EXPECT_EQ(streamed.counters.steps_finished, config.steps);
  EXPECT_EQ(streamed.metrics.max_staleness, 0);  // α = 0: every token on-policy
  EXPECT_LT(streamed.metrics.trainer_wait_seconds_per_step,
            whole.metrics.trainer_wait_seconds_per_step);
  EXPECT_LT(streamed.metrics.elapsed_seconds, whole.metrics.elapsed_seconds);
}

TEST(SimulatorUnits, DecodeSpeedRoundTrips) {
  EngineModel model;
  model.max_concurrent = 256;
  SetDecodeSpeed(model, {.single_tokens_per_second = 50, .full_tokens_per_second = 6400});
  const DecodeSpeed speed = DecodeSpeedOf(model);
  EXPECT_NEAR(speed.single_tokens_per_second, 50, 1e-9);
  EXPECT_NEAR(speed.full_tokens_per_second, 6400, 1e-6);
  EXPECT_NEAR(model.decode_base_seconds + model.decode_per_sequence_seconds, 1.0 / 50, 1e-12);
  auto message = [&](DecodeSpeed s) {
    try {
      SetDecodeSpeed(model, s);
    } catch (const rlsched::FieldError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(message({.single_tokens_per_second = 0, .full_tokens_per_second = 1})
                .rfind("single_tokens_per_second:", 0),
            0U);
  // Slower together than alone, or faster than 256 samples alone each.
  EXPECT_EQ(message({.single_tokens_per_second = 50, .full_tokens_per_second = 40})
                .rfind("full_tokens_per_second:", 0),
            0U);
  EXPECT_EQ(message({.single_tokens_per_second = 50, .full_tokens_per_second = 50 * 257})
                .rfind("full_tokens_per_second:", 0),
            0U);
}

// The trainer's unit cost from its seconds per step: a run's mean step is that long
// (within 15%: the probe batches are not the run's batches).
TEST(SimulatorUnits, TrainSecondsPerStepSetsTheUnitCost) {
  for (const std::int64_t calls : {1, 4}) {
    SimulatorConfig config = SmallConfig();
    config.orchestrator.train_calls_per_sync = calls;
    config.train_call_overhead_seconds = 0.5;
    config.seconds_per_cost_unit = CostUnitForStepSeconds(config, 40);
    const SimulationReport report = Simulate(config);
    EXPECT_NEAR(report.mean_train_seconds, 40, 6) << calls << " calls";
  }
  SimulatorConfig config = SmallConfig();
  config.train_call_overhead_seconds = 10;
  EXPECT_THROW(CostUnitForStepSeconds(config, 10), std::invalid_argument);
}

// The default constants are calibrated: in sync mode a step's mean generation time is
// its mean train time (within 0.8–1.25). All 10 default steps: the first epoch's steps
// (2,048 prompts = 4 steps) generate faster than the later ones, as the per-prompt
// length history changes the dispatch only from the second epoch on. Default-sized
// (4,096 samples per step), so without the O(n) invariant check; the other seeds check
// that the constant is not tuned to seed 1 alone.
TEST(SimulatorCalibration, DefaultSyncGenerationMatchesTraining) {
  for (const std::uint64_t seed : {1, 2}) {
    SimulatorConfig config = DefaultSimulatorConfig();
    config.seed = seed;
    const SimulationReport report = Simulate(config);
    const double ratio = report.mean_generation_seconds / report.mean_train_seconds;
    EXPECT_GE(ratio, 0.8) << "seed " << seed;
    EXPECT_LE(ratio, 1.25) << "seed " << seed;
    ExpectConserved(report);
  }
}

}  // namespace
}  // namespace rlsched::scheduler
