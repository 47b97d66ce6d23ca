// The simulator's wire contract: proto config <-> SimulatorConfig (defaults, round
// trips, errors naming the proto field), the --lengths and --length-dist parsers and
// the request the command builds, and SolveSimulate() on a small workload.

#include "rlsched/wire/simulate_convert.h"

#include <gmock/gmock.h>
#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "rlsched/common/error.h"

namespace rlsched::wire {
namespace {

using namespace ::rlsched::scheduler;  // NOLINT: the types converted

using ::google::protobuf::util::MessageDifferencer;
using ::testing::AllOf;
using ::testing::DoubleNear;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// `config` and `expected` as messages (every field set) are equal.
void ExpectSameConfig(const SimulatorConfig& config, const SimulatorConfig& expected) {
  const v1::SimulatorConfig a = ToSimulatorConfigMessage(config);
  const v1::SimulatorConfig b = ToSimulatorConfigMessage(expected);
  EXPECT_TRUE(MessageDifferencer::Equals(a, b)) << a.ShortDebugString() << "\nexpected\n"
                                                << b.ShortDebugString();
}

// The error message ToSimulatorConfig() throws for `message`, or "" if none.
std::string SimulateErrorOf(const v1::SimulatorConfig& message) {
  try {
    ToSimulatorConfig(message);
  } catch (const rlsched::FieldError& e) {
    return e.what();
  }
  return "";
}

// A small, fast workload: 4 engines, 8 prompts × 4 samples, 3 steps.
v1::SimulatorConfig SmallConfig() {
  v1::SimulatorConfig config;
  config.set_engines(4);
  config.mutable_engine()->set_max_concurrent(16);
  config.set_trainer_ranks(4);
  config.set_steps(3);
  config.set_dataset_prompts(64);
  config.mutable_orchestrator()->set_prompts_per_step(8);
  config.mutable_orchestrator()->set_samples_per_prompt(4);
  config.mutable_lengths()->set_max_tokens(2048);
  return config;
}

// --- ToSimulatorConfig / ToSimulatorConfigMessage -------------------------------------

TEST(SimulateConvertTest, EmptyConfigIsTheDefault) {
  ExpectSameConfig(ToSimulatorConfig(v1::SimulatorConfig()), DefaultSimulatorConfig());
  // Also field by field, for what the message form might not show.
  const SimulatorConfig config = ToSimulatorConfig(v1::SimulatorConfig());
  const SimulatorConfig defaults = DefaultSimulatorConfig();
  EXPECT_EQ(config.orchestrator.mode, defaults.orchestrator.mode);
  EXPECT_EQ(config.step.num_ranks, defaults.step.num_ranks);
  EXPECT_EQ(config.step.micro_batch.max_tokens_per_micro_batch,
            defaults.step.micro_batch.max_tokens_per_micro_batch);
  EXPECT_EQ(config.seconds_per_cost_unit, defaults.seconds_per_cost_unit);
  EXPECT_EQ(config.lengths.lengths, defaults.lengths.lengths);
  EXPECT_EQ(config.seed, defaults.seed);
}

TEST(SimulateConvertTest, DefaultMessageHasEveryFieldSet) {
  const v1::SimulatorConfig message = ToSimulatorConfigMessage(DefaultSimulatorConfig());
  EXPECT_TRUE(message.has_steps());
  EXPECT_TRUE(message.has_engines());
  EXPECT_TRUE(message.has_seed());
  EXPECT_TRUE(message.orchestrator().has_max_staleness());
  EXPECT_NE(message.orchestrator().mode(), v1::ORCHESTRATOR_MODE_UNSPECIFIED);
  EXPECT_TRUE(message.engine().has_max_concurrent());
  EXPECT_TRUE(message.step().has_max_tokens_per_micro_batch());
  EXPECT_TRUE(message.step().has_cost());
  EXPECT_TRUE(message.lengths().has_mu());
}

TEST(SimulateConvertTest, RoundTripOfEveryField) {
  SimulatorConfig config = DefaultSimulatorConfig();
  config.orchestrator.mode = Mode::kAsync;
  config.orchestrator.max_staleness = 2;
  config.orchestrator.partial_rollout = false;
  config.orchestrator.oversample = 0.25;
  config.orchestrator.prompts_per_step = 8;
  config.orchestrator.samples_per_prompt = 4;
  config.orchestrator.keep_partial_on_failure = true;
  config.orchestrator.length_quantile = 0.75;
  config.orchestrator.initial_prediction = 333;
  config.orchestrator.longest_first = false;
  config.orchestrator.max_generating_groups = 5;
  config.steps = 3;
  config.engines = 5;
  config.engine.max_concurrent = 17;
  config.engine.prefill_tokens_per_second = 12345.5;
  config.engine.decode_base_seconds = 0.03;
  config.engine.decode_per_sequence_seconds = 1e-4;
  config.engine.decode_per_context_token_seconds = 1e-8;
  config.step.num_ranks = 6;
  config.step.equal_size = true;
  config.step.keep_groups = true;
  config.step.micro_batch.max_tokens_per_micro_batch = 40000;
  config.step.micro_batch.min_micro_batches = 2;
  config.step.micro_batch.micro_batches_multiple_of = 2;
  config.step.micro_batch.pad_to_multiple_of = 8;
  config.step.micro_batch.pipeline_stages = 2;
  config.step.micro_batch.overhead = 100;
  config.step.micro_batch.order = balance::MicroBatchOrder::kHeaviestFirst;
  config.step.micro_batch.cost = balance::CostModel::Attention(1.0, 0.001, 5.0);
  config.step.micro_batch.refine.max_iterations = 77;
  config.seconds_per_cost_unit = 2e-6;
  config.weight_sync_seconds = 2.5;
  config.dataset_prompts = 100;
  config.lengths.lengths = {10, 200, 3000};
  config.lengths.min_prompt_tokens = 50;
  config.lengths.max_prompt_tokens = 60;
  config.lengths.length_correlation = 0.5;
  config.all_equal_rate = 0.1;
  config.filter_all_equal = true;
  config.engine_mtbf_seconds = 1000;
  config.rejoin_seconds = 5;
  config.seed = 42;
  config.trace = true;

  const v1::SimulatorConfig message = ToSimulatorConfigMessage(config);
  EXPECT_EQ(message.orchestrator().mode(), v1::ORCHESTRATOR_MODE_ASYNC);
  EXPECT_TRUE(message.orchestrator().filter_all_equal());
  EXPECT_EQ(message.step().cost().kind(), v1::COST_KIND_ATTENTION);
  EXPECT_EQ(message.step().order(), v1::MICRO_BATCH_ORDER_HEAVIEST_FIRST);
  EXPECT_THAT(message.lengths().lengths(), ElementsAre(10, 200, 3000));

  const SimulatorConfig back = ToSimulatorConfig(message);
  ExpectSameConfig(back, config);
  EXPECT_EQ(back.orchestrator.mode, Mode::kAsync);
  EXPECT_EQ(back.orchestrator.max_staleness, 2);
  EXPECT_FALSE(back.orchestrator.partial_rollout);
  EXPECT_TRUE(back.filter_all_equal);
  EXPECT_FALSE(back.orchestrator.longest_first);
  EXPECT_EQ(back.orchestrator.max_generating_groups, 5);
  EXPECT_EQ(back.step.micro_batch.cost.quadratic(), 0.001);
  EXPECT_EQ(back.step.micro_batch.refine.max_iterations, 77);
  EXPECT_TRUE(back.step.keep_groups);
  EXPECT_EQ(back.lengths.lengths, config.lengths.lengths);
  EXPECT_EQ(back.seed, 42u);
  EXPECT_TRUE(back.trace);

  // Through JSON, as --config and the daemon's --format=json read it.
  std::string json;
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(message, &json).ok());
  v1::SimulatorConfig parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &parsed).ok());
  ExpectSameConfig(ToSimulatorConfig(parsed), config);
}

TEST(SimulateConvertTest, OnlyTheSetFieldsChange) {
  v1::SimulatorConfig message;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(
                  R"({"engines": 3, "orchestrator": {"mode": "ORCHESTRATOR_MODE_ASYNC",
                      "partial_rollout": false}, "step": {"pipeline_stages": 2},
                      "lengths": {"sigma": 0.5}})",
                  &message)
                  .ok());
  SimulatorConfig expected = DefaultSimulatorConfig();
  expected.engines = 3;
  expected.orchestrator.mode = Mode::kAsync;
  expected.orchestrator.partial_rollout = false;
  expected.step.micro_batch.pipeline_stages = 2;
  expected.lengths.sigma = 0.5;
  ExpectSameConfig(ToSimulatorConfig(message), expected);
}

TEST(SimulateConvertTest, ExplicitZeroAndFalseAreSet) {
  // proto3 optional: an explicit default value is not "unset".
  v1::SimulatorConfig message;
  message.mutable_orchestrator()->set_mode(v1::ORCHESTRATOR_MODE_ASYNC);
  message.mutable_orchestrator()->set_max_staleness(0);
  message.mutable_orchestrator()->set_partial_rollout(false);
  message.set_weight_sync_seconds(0);
  const SimulatorConfig config = ToSimulatorConfig(message);
  EXPECT_EQ(config.orchestrator.max_staleness, 0);
  EXPECT_FALSE(config.orchestrator.partial_rollout);
  EXPECT_EQ(config.weight_sync_seconds, 0.0);
}

TEST(SimulateConvertTest, ErrorsNameTheProtoField) {
  v1::SimulatorConfig message;
  message.set_engines(0);
  EXPECT_THAT(SimulateErrorOf(message), StartsWith("engines:"));

  message = v1::SimulatorConfig();
  message.set_steps(0);
  EXPECT_THAT(SimulateErrorOf(message), StartsWith("steps:"));

  message = v1::SimulatorConfig();
  message.set_steps(kMaxSimulationSteps + 1);
  EXPECT_THAT(SimulateErrorOf(message), StartsWith("steps: must be in [1, 100000]"));

  message = v1::SimulatorConfig();
  message.set_engines(kMaxSimulationEngines + 1);
  EXPECT_THAT(SimulateErrorOf(message), StartsWith("engines:"));

  message = v1::SimulatorConfig();
  message.mutable_orchestrator()->set_prompts_per_step(1'000'000);
  message.set_steps(1000);
  EXPECT_THAT(SimulateErrorOf(message), AllOf(StartsWith("steps:"), HasSubstr("at most 1e+07")));

  message = v1::SimulatorConfig();
  message.mutable_orchestrator()->set_mode(static_cast<v1::OrchestratorMode>(99));
  EXPECT_THAT(SimulateErrorOf(message), StartsWith("orchestrator.mode: unknown value 99"));

  message = v1::SimulatorConfig();
  message.mutable_step()->set_max_tokens_per_micro_batch(0);
  EXPECT_THAT(SimulateErrorOf(message),
              StartsWith("step.max_tokens_per_micro_batch: must be >= 1"));

  message = v1::SimulatorConfig();
  message.mutable_step()->set_max_tokens_per_micro_batch(1000);
  EXPECT_THAT(SimulateErrorOf(message),
              AllOf(StartsWith("step.max_tokens_per_micro_batch: must be >= "
                               "the longest sequence"),
                    HasSubstr("got 1000")));

  message = v1::SimulatorConfig();
  message.mutable_step()->set_pipeline_stages(-1);
  EXPECT_THAT(SimulateErrorOf(message), StartsWith("step.pipeline_stages:"));

  message = v1::SimulatorConfig();
  message.mutable_step()->mutable_cost()->set_kind(v1::COST_KIND_ATTENTION);
  EXPECT_THAT(SimulateErrorOf(message), StartsWith("step.cost:"));

  message = v1::SimulatorConfig();
  message.mutable_lengths()->add_lengths(5);
  message.mutable_lengths()->add_lengths(0);
  EXPECT_THAT(SimulateErrorOf(message),
              StartsWith("lengths.lengths[1]: must be in [1, 2147483648]"));
}

TEST(SimulateConvertTest, AsyncFieldsWithoutAModeSelectAsync) {
  v1::SimulatorConfig message;
  message.mutable_orchestrator()->set_max_staleness(2);
  SimulatorConfig config = ToSimulatorConfig(message);
  EXPECT_EQ(config.orchestrator.mode, Mode::kAsync);
  EXPECT_EQ(config.orchestrator.max_staleness, 2);
  EXPECT_TRUE(config.orchestrator.partial_rollout);  // async's default

  message = v1::SimulatorConfig();
  message.mutable_orchestrator()->set_partial_rollout(false);
  config = ToSimulatorConfig(message);
  EXPECT_EQ(config.orchestrator.mode, Mode::kAsync);
  EXPECT_FALSE(config.orchestrator.partial_rollout);

  message = v1::SimulatorConfig();
  message.mutable_orchestrator()->set_partial_rollout(true);
  EXPECT_EQ(ToSimulatorConfig(message).orchestrator.mode, Mode::kAsync);

  // Neither: the default mode.
  message = v1::SimulatorConfig();
  message.mutable_orchestrator()->set_oversample(0.5);
  EXPECT_EQ(ToSimulatorConfig(message).orchestrator.mode, Mode::kSync);
}

TEST(SimulateConvertTest, AsyncFieldsOfSyncAndOneStepOff) {
  const auto with = [](v1::OrchestratorMode mode, std::optional<std::int64_t> staleness,
                       std::optional<bool> partial) {
    v1::SimulatorConfig message;
    message.mutable_orchestrator()->set_mode(mode);
    if (staleness) message.mutable_orchestrator()->set_max_staleness(*staleness);
    if (partial) message.mutable_orchestrator()->set_partial_rollout(*partial);
    return message;
  };
  EXPECT_EQ(SimulateErrorOf(with(v1::ORCHESTRATOR_MODE_SYNC, 2, std::nullopt)),
            "orchestrator.max_staleness: applies to mode async only (mode sync has staleness 0), "
            "got 2");
  EXPECT_EQ(SimulateErrorOf(with(v1::ORCHESTRATOR_MODE_SYNC, 1, std::nullopt)),
            "orchestrator.max_staleness: applies to mode async only (mode sync has staleness 0), "
            "got 1");
  EXPECT_EQ(SimulateErrorOf(with(v1::ORCHESTRATOR_MODE_ONE_STEP_OFF, 0, std::nullopt)),
            "orchestrator.max_staleness: applies to mode async only (mode one_step_off has "
            "staleness 1), got 0");
  EXPECT_EQ(SimulateErrorOf(with(v1::ORCHESTRATOR_MODE_SYNC, std::nullopt, true)),
            "orchestrator.partial_rollout: applies to mode async only (mode sync never "
            "interrupts a generation: engines take new weights between batches), got true");
  EXPECT_THAT(SimulateErrorOf(with(v1::ORCHESTRATOR_MODE_ONE_STEP_OFF, 1, true)),
              StartsWith("orchestrator.partial_rollout: applies to mode async only (mode "
                         "one_step_off never interrupts"));
  // The mode's own values are accepted.
  EXPECT_EQ(SimulateErrorOf(with(v1::ORCHESTRATOR_MODE_SYNC, 0, false)), "");
  EXPECT_EQ(SimulateErrorOf(with(v1::ORCHESTRATOR_MODE_ONE_STEP_OFF, 1, false)), "");
  EXPECT_EQ(SimulateErrorOf(with(v1::ORCHESTRATOR_MODE_ASYNC, 5, true)), "");

  // The message of a config states those values, so that it reads back.
  for (const Mode mode : {Mode::kSync, Mode::kOneStepOff, Mode::kAsync}) {
    SimulatorConfig config = DefaultSimulatorConfig();
    config.orchestrator.mode = mode;
    config.orchestrator.max_staleness = 3;
    config.orchestrator.partial_rollout = true;
    const v1::SimulatorConfig message = ToSimulatorConfigMessage(config);
    EXPECT_EQ(message.orchestrator().max_staleness(), mode == Mode::kSync         ? 0
                                                      : mode == Mode::kOneStepOff ? 1
                                                                                  : 3)
        << ModeName(mode);
    EXPECT_EQ(message.orchestrator().partial_rollout(), mode == Mode::kAsync) << ModeName(mode);
    EXPECT_EQ(SimulateErrorOf(message), "") << ModeName(mode);
    EXPECT_EQ(ToSimulatorConfig(message).orchestrator.mode, mode);
  }
}

// pause_mode: async with partial rollout only; it selects async; it reads back; with
// compare it applies to the runs with partial rollout.
TEST(SimulateConvertTest, PauseModeBelongsToPartialRollout) {
  v1::SimulatorConfig message;
  message.mutable_orchestrator()->set_pause_mode(v1::PAUSE_MODE_ABORT);
  SimulatorConfig config = ToSimulatorConfig(message);
  EXPECT_EQ(config.orchestrator.mode, Mode::kAsync);  // selected
  EXPECT_TRUE(config.orchestrator.partial_rollout);
  EXPECT_EQ(config.orchestrator.pause_mode, PauseMode::kAbort);
  const v1::SimulatorConfig back = ToSimulatorConfigMessage(config);
  EXPECT_EQ(back.orchestrator().pause_mode(), v1::PAUSE_MODE_ABORT);
  EXPECT_EQ(ToSimulatorConfig(back).orchestrator.pause_mode, PauseMode::kAbort);
  // Unset and KEEP are the default; every config's message states it.
  EXPECT_EQ(ToSimulatorConfig(v1::SimulatorConfig()).orchestrator.pause_mode, PauseMode::kKeep);
  EXPECT_EQ(ToSimulatorConfigMessage(DefaultSimulatorConfig()).orchestrator().pause_mode(),
            v1::PAUSE_MODE_KEEP);

  message.mutable_orchestrator()->set_mode(v1::ORCHESTRATOR_MODE_SYNC);
  EXPECT_EQ(SimulateErrorOf(message),
            "orchestrator.pause_mode: applies to mode async with partial rollout only (mode sync "
            "never interrupts a generation), got PAUSE_MODE_ABORT");
  message.mutable_orchestrator()->set_pause_mode(v1::PAUSE_MODE_KEEP);
  EXPECT_EQ(SimulateErrorOf(message), "");
  message.mutable_orchestrator()->set_mode(v1::ORCHESTRATOR_MODE_ASYNC);
  message.mutable_orchestrator()->set_partial_rollout(false);
  message.mutable_orchestrator()->set_pause_mode(v1::PAUSE_MODE_ABORT);
  EXPECT_THAT(SimulateErrorOf(message),
              StartsWith("orchestrator.pause_mode: applies with partial_rollout only"));
  message.mutable_orchestrator()->set_pause_mode(static_cast<v1::PauseMode>(7));
  EXPECT_EQ(SimulateErrorOf(message), "orchestrator.pause_mode: unknown value 7");

  // Compare: the runs with partial rollout abort, the others keep (nothing to pause).
  v1::SimulateRequest request;
  *request.mutable_config() = SmallConfig();
  request.mutable_config()->mutable_orchestrator()->set_pause_mode(v1::PAUSE_MODE_ABORT);
  request.set_compare(true);
  const v1::SimulateReply reply = SolveSimulate(request);
  std::int64_t aborting = 0;
  std::int64_t resubmitted = 0;
  for (const v1::SimulationRun& run : reply.runs()) {
    const v1::OrchestratorOptions& o = run.config().orchestrator();
    EXPECT_EQ(o.pause_mode(), o.partial_rollout() ? v1::PAUSE_MODE_ABORT : v1::PAUSE_MODE_KEEP)
        << run.name();
    if (o.partial_rollout()) {
      ++aborting;
      resubmitted += run.report().counters().resubmitted();
    } else {
      EXPECT_EQ(run.report().counters().resubmitted(), 0) << run.name();
    }
  }
  EXPECT_GE(aborting, 2);
  EXPECT_GT(resubmitted, 0);
}

TEST(SimulateConvertTest, FilterNeedsAllEqualGroups) {
  v1::SimulatorConfig message;
  message.mutable_orchestrator()->set_filter_all_equal(true);
  EXPECT_THAT(SimulateErrorOf(message),
              StartsWith("orchestrator.filter_all_equal: must be false with all_equal_rate 0"));
  message.set_all_equal_rate(0.2);
  EXPECT_EQ(SimulateErrorOf(message), "");
}

// --- Parsers and the command's request ------------------------------------------------

TEST(SimulateConvertTest, ComparisonRuns) {
  std::vector<std::string> names;
  for (const ComparisonRun& run : ComparisonRuns()) names.emplace_back(run.name);
  EXPECT_THAT(names, ElementsAre("sync", "one_step_off", "async_s1_partial", "async_s1",
                                 "async_s2_partial", "async_s2"));
  EXPECT_EQ(ModeName(Mode::kOneStepOff), "one_step_off");
  EXPECT_EQ(ToModeMessage(Mode::kAsync), v1::ORCHESTRATOR_MODE_ASYNC);
}

TEST(SimulateConvertTest, SolveSimulateErrorsNameTheRequestField) {
  v1::SimulateRequest request;
  request.mutable_config()->set_engines(0);
  EXPECT_THROW(
      {
        try {
          SolveSimulate(request);
        } catch (const rlsched::FieldError& e) {
          EXPECT_THAT(e.what(), StartsWith("config.engines:"));
          throw;
        }
      },
      std::invalid_argument);

  request = v1::SimulateRequest();
  *request.mutable_config() = SmallConfig();
  request.set_compare(true);
  request.set_trace_run("async_s3");
  try {
    SolveSimulate(request);
    ADD_FAILURE() << "accepted";
  } catch (const rlsched::FieldError& e) {
    EXPECT_THAT(e.what(), StartsWith("trace_run: must be one of sync, one_step_off"));
  }
  request.set_compare(false);
  request.set_trace_run("sync");
  EXPECT_THROW(SolveSimulate(request), std::invalid_argument);

  // A trace_run with no trace to keep.
  request.set_compare(true);
  try {
    SolveSimulate(request);
    ADD_FAILURE() << "accepted";
  } catch (const rlsched::FieldError& e) {
    EXPECT_STREQ(e.what(),
                 "trace_run: applies only with config.trace (it names the run whose trace is "
                 "kept), got 'sync'");
  }
  request.mutable_config()->set_trace(true);
  request.mutable_config()->set_steps(1);
  EXPECT_EQ(SolveSimulate(request).runs_size(), 7);  // colocated_sync and the six

  // compare gives each run its mode, staleness and partial rollout: the config may not.
  const auto compare_error = [](const v1::OrchestratorOptions& orchestrator) -> std::string {
    v1::SimulateRequest compare;
    *compare.mutable_config() = SmallConfig();
    compare.mutable_config()->mutable_orchestrator()->MergeFrom(orchestrator);
    compare.set_compare(true);
    try {
      SolveSimulate(compare);
    } catch (const rlsched::FieldError& e) {
      return e.what();
    }
    return "";
  };
  v1::OrchestratorOptions o;
  o.set_mode(v1::ORCHESTRATOR_MODE_ASYNC);
  EXPECT_EQ(compare_error(o),
            "config.orchestrator.mode: compare gives each run its own (colocated sync, sync, "
            "one_step_off, async s = 1 and 2 with and without partial rollout, under the "
            "admission policy); leave it unset, got ORCHESTRATOR_MODE_ASYNC");
  o = v1::OrchestratorOptions();
  o.set_max_staleness(1);
  EXPECT_THAT(compare_error(o), StartsWith("config.orchestrator.max_staleness: compare gives"));
  o = v1::OrchestratorOptions();
  o.set_partial_rollout(false);
  EXPECT_THAT(compare_error(o), StartsWith("config.orchestrator.partial_rollout: compare gives"));
  // … nor its policy, fraction or colocation (colocated_sync is a run of its own).
  o = v1::OrchestratorOptions();
  o.set_staleness_policy(v1::STALENESS_POLICY_STRICT);
  EXPECT_EQ(compare_error(o),
            "config.orchestrator.staleness_policy: compare gives each run its own (colocated "
            "sync, sync, one_step_off, async s = 1 and 2 with and without partial rollout, under "
            "the admission policy); leave it unset, got STALENESS_POLICY_STRICT");
  o = v1::OrchestratorOptions();
  o.set_staleness_fraction(0.5);
  EXPECT_THAT(compare_error(o),
              AllOf(StartsWith("config.orchestrator.staleness_fraction: compare gives"),
                    HasSubstr("got 0.5")));
  o = v1::OrchestratorOptions();
  o.set_colocated(false);
  EXPECT_THAT(compare_error(o), AllOf(StartsWith("config.orchestrator.colocated: compare gives"),
                                      HasSubstr("got false")));
  // train_calls_per_sync is the workload's: every run streams.
  o = v1::OrchestratorOptions();
  o.set_train_calls_per_sync(2);
  EXPECT_EQ(compare_error(o), "");
}

TEST(SimulateConvertTest, SolveSimulateOneRun) {
  v1::SimulateRequest request;
  *request.mutable_config() = SmallConfig();
  const v1::SimulateReply reply = SolveSimulate(request);
  ASSERT_EQ(reply.runs_size(), 1);
  const v1::SimulationRun& run = reply.runs(0);
  EXPECT_EQ(run.name(), kSingleRunName);
  EXPECT_EQ(run.config().engines(), 4);
  EXPECT_TRUE(run.config().has_seed());
  const v1::SimulationReport& report = run.report();
  EXPECT_EQ(report.counters().steps_finished(), 3);
  EXPECT_EQ(report.counters().trained(), 3 * 8 * 4);
  const auto& histogram = report.metrics().staleness_histogram();
  EXPECT_EQ(std::accumulate(histogram.begin(), histogram.end(), std::int64_t{0}),
            report.counters().trained());
  EXPECT_EQ(report.metrics().max_staleness(), 0);  // the default mode is sync
  // … and its config says so.
  EXPECT_EQ(run.config().orchestrator().mode(), v1::ORCHESTRATOR_MODE_SYNC);
  EXPECT_EQ(run.config().orchestrator().max_staleness(), 0);
  EXPECT_FALSE(run.config().orchestrator().partial_rollout());
  EXPECT_GT(report.metrics().samples_per_second(), 0.0);
  EXPECT_GT(report.ideal_samples_per_second(), 0.0);
  EXPECT_TRUE(report.trace_json().empty());

  request.mutable_config()->set_trace(true);
  const v1::SimulateReply traced = SolveSimulate(request);
  EXPECT_THAT(traced.runs(0).report().trace_json(), HasSubstr("traceEvents"));
}

TEST(SimulateConvertTest, SolveSimulateCompare) {
  v1::SimulateRequest request;
  *request.mutable_config() = SmallConfig();
  request.mutable_config()->set_trace(true);
  request.set_compare(true);
  const v1::SimulateReply reply = SolveSimulate(request);
  // colocated_sync first (8 GPUs: 4 engines and 4 ranks of one GPU each), then the six.
  ASSERT_EQ(reply.runs_size(), 7);
  const v1::SimulationRun& colocated = reply.runs(0);
  EXPECT_EQ(colocated.name(), kColocatedRunName);
  EXPECT_EQ(colocated.config().orchestrator().mode(), v1::ORCHESTRATOR_MODE_SYNC);
  EXPECT_TRUE(colocated.config().orchestrator().colocated());
  EXPECT_EQ(colocated.config().engines(), 8);
  EXPECT_EQ(colocated.config().trainer_ranks(), 8);
  EXPECT_EQ(colocated.report().metrics().max_staleness(), 0);
  EXPECT_EQ(colocated.report().counters().steps_finished(), 3);
  EXPECT_TRUE(colocated.report().trace_json().empty());
  const std::int64_t bounds[] = {0, 1, 1, 1, 2, 2};
  for (int i = 0; i < reply.runs_size() - 1; ++i) {
    const v1::SimulationRun& run = reply.runs(i + 1);
    const ComparisonRun& expected = ComparisonRuns()[static_cast<std::size_t>(i)];
    EXPECT_EQ(run.name(), expected.name);
    EXPECT_EQ(run.config().orchestrator().mode(), ToModeMessage(expected.mode));
    EXPECT_EQ(run.config().orchestrator().partial_rollout(), expected.partial_rollout);
    EXPECT_EQ(run.config().orchestrator().max_staleness(), expected.max_staleness);
    EXPECT_EQ(run.config().engines(), 4);  // the same workload
    EXPECT_FALSE(run.config().orchestrator().colocated());
    EXPECT_EQ(run.config().seed(), reply.runs(0).config().seed());
    EXPECT_LE(run.report().metrics().max_staleness(), bounds[i]) << run.name();
    EXPECT_EQ(run.report().counters().steps_finished(), 3) << run.name();
    // Only the default trace run keeps its trace.
    EXPECT_EQ(run.report().trace_json().empty(), run.name() != kDefaultTraceRun) << run.name();
  }
}

// --- The fraction policy, streaming, colocation and the speeds in users' units -------

TEST(SimulateConvertTest, RoundTripOfTheFractionPolicyAndStreaming) {
  SimulatorConfig config = DefaultSimulatorConfig();
  config.orchestrator.mode = Mode::kAsync;
  config.orchestrator.staleness_policy = StalenessPolicy::kFraction;
  config.orchestrator.staleness_fraction = 1.5;
  config.orchestrator.partial_rollout = false;
  config.orchestrator.prompts_per_step = 8;
  config.orchestrator.samples_per_prompt = 4;
  config.orchestrator.train_calls_per_sync = 4;
  config.engine.max_concurrent = 16;
  config.engine.decode_base_seconds = 0.025;
  config.engine.decode_per_sequence_seconds = 2e-3;
  config.train_call_overhead_seconds = 0.75;
  config.gpus_per_engine = 2;
  config.gpus_per_trainer_rank = 3;

  const v1::SimulatorConfig message = ToSimulatorConfigMessage(config);
  const v1::OrchestratorOptions& o = message.orchestrator();
  EXPECT_EQ(o.mode(), v1::ORCHESTRATOR_MODE_ASYNC);
  EXPECT_EQ(o.staleness_policy(), v1::STALENESS_POLICY_FRACTION);
  EXPECT_EQ(o.staleness_fraction(), 1.5);
  EXPECT_EQ(o.max_staleness(), 2);  // ceil(α): the batches generation runs ahead
  EXPECT_EQ(o.train_calls_per_sync(), 4);
  EXPECT_TRUE(o.has_colocated());
  EXPECT_FALSE(o.colocated());
  EXPECT_EQ(message.train_call_overhead_seconds(), 0.75);
  EXPECT_EQ(message.gpus_per_engine(), 2);
  EXPECT_EQ(message.gpus_per_trainer_rank(), 3);
  EXPECT_TRUE(message.has_release_seconds());
  EXPECT_FALSE(message.has_train_seconds_per_step());  // seconds_per_cost_unit states it
  // The decode speed in tokens/s: 1 / (0.025 + 0.002) alone, 16 / (0.025 + 0.032) full.
  EXPECT_NEAR(message.decode_speed().single_tokens_per_second(), 1 / 0.027, 1e-9);
  EXPECT_NEAR(message.decode_speed().full_tokens_per_second(), 16 / 0.057, 1e-9);

  const SimulatorConfig back = ToSimulatorConfig(message);
  ExpectSameConfig(back, config);
  EXPECT_EQ(back.orchestrator.staleness_policy, StalenessPolicy::kFraction);
  EXPECT_EQ(back.orchestrator.staleness_fraction, 1.5);
  EXPECT_EQ(back.orchestrator.train_calls_per_sync, 4);
  EXPECT_EQ(back.train_call_overhead_seconds, 0.75);
  EXPECT_EQ(back.gpus_per_engine, 2);
  EXPECT_EQ(back.gpus_per_trainer_rank, 3);
  EXPECT_EQ(back.engine.decode_base_seconds, 0.025);
  EXPECT_EQ(back.engine.decode_per_sequence_seconds, 2e-3);

  std::string json;
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(message, &json).ok());
  EXPECT_THAT(json, HasSubstr("STALENESS_POLICY_FRACTION"));
  v1::SimulatorConfig parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &parsed).ok());
  ExpectSameConfig(ToSimulatorConfig(parsed), config);
}

TEST(SimulateConvertTest, RoundTripOfColocation) {
  SimulatorConfig config = DefaultSimulatorConfig();
  config.orchestrator.mode = Mode::kSync;
  config.orchestrator.colocated = true;
  config.release_seconds = 2.5;
  config.resume_seconds = 4;
  const v1::SimulatorConfig message = ToSimulatorConfigMessage(config);
  EXPECT_EQ(message.orchestrator().mode(), v1::ORCHESTRATOR_MODE_SYNC);
  EXPECT_TRUE(message.orchestrator().colocated());
  EXPECT_EQ(message.orchestrator().staleness_policy(), v1::STALENESS_POLICY_STRICT);
  EXPECT_EQ(message.orchestrator().staleness_fraction(), 0.0);
  EXPECT_EQ(message.release_seconds(), 2.5);
  EXPECT_EQ(message.resume_seconds(), 4.0);
  const SimulatorConfig back = ToSimulatorConfig(message);
  ExpectSameConfig(back, config);
  EXPECT_TRUE(back.orchestrator.colocated);
  EXPECT_EQ(back.release_seconds, 2.5);
  EXPECT_EQ(back.resume_seconds, 4.0);

  // A run that is not colocated releases nothing: its message says 0, as it ran.
  config.orchestrator.colocated = false;
  const v1::SimulatorConfig separate = ToSimulatorConfigMessage(config);
  EXPECT_FALSE(separate.orchestrator().colocated());
  EXPECT_EQ(separate.release_seconds(), 0.0);
  EXPECT_EQ(separate.resume_seconds(), 0.0);
  EXPECT_EQ(SimulateErrorOf(separate), "");
}

TEST(SimulateConvertTest, ModeFieldsSelectTheMode) {
  // staleness_fraction without a policy or mode: async with the fraction policy.
  v1::SimulatorConfig message;
  message.mutable_orchestrator()->set_staleness_fraction(0.5);
  SimulatorConfig config = ToSimulatorConfig(message);
  EXPECT_EQ(config.orchestrator.mode, Mode::kAsync);
  EXPECT_EQ(config.orchestrator.staleness_policy, StalenessPolicy::kFraction);
  EXPECT_EQ(config.orchestrator.staleness_fraction, 0.5);
  EXPECT_TRUE(config.orchestrator.partial_rollout);

  // With mode async too.
  message.mutable_orchestrator()->set_mode(v1::ORCHESTRATOR_MODE_ASYNC);
  EXPECT_EQ(ToSimulatorConfig(message).orchestrator.staleness_policy, StalenessPolicy::kFraction);

  // The FRACTION policy alone: async, α = 0 (the default).
  message = v1::SimulatorConfig();
  message.mutable_orchestrator()->set_staleness_policy(v1::STALENESS_POLICY_FRACTION);
  config = ToSimulatorConfig(message);
  EXPECT_EQ(config.orchestrator.mode, Mode::kAsync);
  EXPECT_EQ(config.orchestrator.staleness_policy, StalenessPolicy::kFraction);
  EXPECT_EQ(config.orchestrator.staleness_fraction, 0.0);

  // max_staleness may state ceil(α) under FRACTION.
  message = v1::SimulatorConfig();
  message.mutable_orchestrator()->set_staleness_fraction(1.25);
  message.mutable_orchestrator()->set_max_staleness(2);
  EXPECT_EQ(SimulateErrorOf(message), "");

  // colocated selects sync, and async's fields may then state sync's values.
  message = v1::SimulatorConfig();
  message.mutable_orchestrator()->set_colocated(true);
  config = ToSimulatorConfig(message);
  EXPECT_EQ(config.orchestrator.mode, Mode::kSync);
  EXPECT_TRUE(config.orchestrator.colocated);
  message.mutable_orchestrator()->set_max_staleness(0);
  message.mutable_orchestrator()->set_partial_rollout(false);
  message.mutable_orchestrator()->set_staleness_fraction(0);
  message.mutable_orchestrator()->set_staleness_policy(v1::STALENESS_POLICY_STRICT);
  config = ToSimulatorConfig(message);
  EXPECT_EQ(config.orchestrator.mode, Mode::kSync);
  EXPECT_TRUE(config.orchestrator.colocated);

  // colocated = false states nothing; streaming applies to every mode.
  for (const v1::OrchestratorMode mode :
       {v1::ORCHESTRATOR_MODE_SYNC, v1::ORCHESTRATOR_MODE_ONE_STEP_OFF,
        v1::ORCHESTRATOR_MODE_ASYNC}) {
    message = v1::SimulatorConfig();
    message.mutable_orchestrator()->set_mode(mode);
    message.mutable_orchestrator()->set_colocated(false);
    message.mutable_orchestrator()->set_train_calls_per_sync(4);
    config = ToSimulatorConfig(message);
    EXPECT_FALSE(config.orchestrator.colocated);
    EXPECT_EQ(config.orchestrator.train_calls_per_sync, 4);
  }
}

TEST(SimulateConvertTest, FieldsThatDoNotApplyAreRefused) {
  const auto orchestrator = [](const std::function<void(v1::OrchestratorOptions&)>& set) {
    v1::SimulatorConfig message;
    set(*message.mutable_orchestrator());
    return SimulateErrorOf(message);
  };
  EXPECT_EQ(orchestrator([](auto& o) {
              o.set_mode(v1::ORCHESTRATOR_MODE_SYNC);
              o.set_staleness_fraction(0.5);
            }),
            "orchestrator.staleness_fraction: applies to mode async with the fraction policy only "
            "(mode sync has staleness 0), got 0.5");
  EXPECT_EQ(orchestrator([](auto& o) {
              o.set_mode(v1::ORCHESTRATOR_MODE_ONE_STEP_OFF);
              o.set_staleness_fraction(2);
            }),
            "orchestrator.staleness_fraction: applies to mode async with the fraction policy only "
            "(mode one_step_off has staleness 1), got 2");
  EXPECT_EQ(orchestrator([](auto& o) {
              o.set_mode(v1::ORCHESTRATOR_MODE_SYNC);
              o.set_staleness_fraction(0);  // sync's own value
            }),
            "");
  EXPECT_EQ(orchestrator([](auto& o) {
              o.set_staleness_policy(v1::STALENESS_POLICY_STRICT);
              o.set_staleness_fraction(0.5);
            }),
            "orchestrator.staleness_fraction: applies to the fraction policy only (the strict "
            "policy bounds staleness by max_staleness), got 0.5");
  EXPECT_EQ(orchestrator([](auto& o) {
              o.set_staleness_policy(v1::STALENESS_POLICY_ADMISSION);
              o.set_staleness_fraction(1);
            }),
            "orchestrator.staleness_fraction: applies to the fraction policy only (the admission "
            "policy bounds staleness by max_staleness), got 1");
  EXPECT_EQ(orchestrator([](auto& o) {
              o.set_mode(v1::ORCHESTRATOR_MODE_SYNC);
              o.set_staleness_policy(v1::STALENESS_POLICY_FRACTION);
            }),
            "orchestrator.staleness_policy: applies to mode async only (mode sync keeps every "
            "token within its staleness: strict), got STALENESS_POLICY_FRACTION");
  EXPECT_EQ(orchestrator([](auto& o) {
              o.set_staleness_fraction(1.5);
              o.set_max_staleness(1);
            }),
            "orchestrator.max_staleness: does not apply to the fraction policy "
            "(staleness_fraction 1.5 bounds staleness: generation runs ceil(1.5) = 2 batches "
            "ahead at most), got 1");
  EXPECT_EQ(orchestrator([](auto& o) { o.set_staleness_fraction(-1); }),
            "orchestrator.staleness_fraction: must be in [0, 1000000], got -1");
  EXPECT_THAT(orchestrator([](auto& o) { o.set_staleness_fraction(std::nan("")); }),
              StartsWith("orchestrator.staleness_fraction: must be in [0, 1000000]"));
  EXPECT_EQ(orchestrator([](auto& o) {
              o.set_mode(v1::ORCHESTRATOR_MODE_ASYNC);
              o.set_colocated(true);
            }),
            "orchestrator.colocated: applies to mode sync only (engines and trainer take turns "
            "on the same GPUs; mode async overlaps generation and training), got true");
  EXPECT_THAT(orchestrator([](auto& o) {
                o.set_mode(v1::ORCHESTRATOR_MODE_ONE_STEP_OFF);
                o.set_colocated(true);
              }),
              StartsWith("orchestrator.colocated: applies to mode sync only"));
  EXPECT_EQ(orchestrator([](auto& o) {
              o.set_colocated(true);
              o.set_max_staleness(2);
            }),
            "orchestrator.max_staleness: applies to mode async only (colocated selects mode sync, "
            "which has staleness 0), got 2");
  EXPECT_THAT(orchestrator([](auto& o) {
                o.set_colocated(true);
                o.set_staleness_fraction(0.5);
              }),
              StartsWith("orchestrator.staleness_fraction: applies to mode async with the "
                         "fraction policy only (colocated selects mode sync"));
  EXPECT_THAT(orchestrator([](auto& o) {
                o.set_colocated(true);
                o.set_partial_rollout(true);
              }),
              StartsWith("orchestrator.partial_rollout: applies to mode async only (colocated "
                         "selects mode sync"));
  EXPECT_THAT(orchestrator([](auto& o) {
                o.set_prompts_per_step(8);
                o.set_train_calls_per_sync(3);
              }),
              StartsWith("orchestrator.train_calls_per_sync: must be a divisor of "
                         "prompts_per_step = 8"));

  // The simulator's own fields.
  const auto with = [](const std::function<void(v1::SimulatorConfig&)>& set) {
    v1::SimulatorConfig message = SmallConfig();
    set(message);
    return SimulateErrorOf(message);
  };
  EXPECT_THAT(with([](auto& m) { m.set_gpus_per_engine(0); }), StartsWith("gpus_per_engine:"));
  EXPECT_THAT(with([](auto& m) { m.set_gpus_per_trainer_rank(5000); }),
              StartsWith("gpus_per_trainer_rank:"));
  EXPECT_THAT(with([](auto& m) { m.set_train_call_overhead_seconds(-1); }),
              StartsWith("train_call_overhead_seconds:"));
  EXPECT_THAT(with([](auto& m) { m.set_release_seconds(-1); }), StartsWith("release_seconds:"));
  EXPECT_THAT(with([](auto& m) { m.set_resume_seconds(std::nan("")); }),
              StartsWith("resume_seconds:"));
  // decode_speed: its bounds, and not against the engine's decode times.
  EXPECT_THAT(with([](auto& m) {
                m.mutable_decode_speed()->set_single_tokens_per_second(0);
                m.mutable_decode_speed()->set_full_tokens_per_second(100);
              }),
              StartsWith("decode_speed.single_tokens_per_second:"));
  EXPECT_THAT(
      with([](auto& m) {  // 16 concurrent samples: at most 16 × 40 together
        m.mutable_decode_speed()->set_single_tokens_per_second(40);
        m.mutable_decode_speed()->set_full_tokens_per_second(1000);
      }),
      AllOf(StartsWith("decode_speed.full_tokens_per_second: must be in"), HasSubstr("[40, 640]")));
  EXPECT_THAT(with([](auto& m) {
                m.mutable_decode_speed()->set_single_tokens_per_second(40);
                m.mutable_decode_speed()->set_full_tokens_per_second(500);
                m.mutable_engine()->set_decode_base_seconds(0.01);
              }),
              AllOf(StartsWith("decode_speed: contradicts engine.decode_base_seconds"),
                    HasSubstr("got 40 and 500")));
  EXPECT_THAT(with([](auto& m) {
                m.mutable_decode_speed()->set_single_tokens_per_second(40);
                m.mutable_decode_speed()->set_full_tokens_per_second(500);
                m.mutable_engine()->set_decode_per_sequence_seconds(0);
              }),
              StartsWith("decode_speed: contradicts"));
  // train_seconds_per_step: above the calls' overheads, not with seconds_per_cost_unit.
  EXPECT_THAT(with([](auto& m) {
                m.set_train_seconds_per_step(10);
                m.set_seconds_per_cost_unit(1e-3);
              }),
              StartsWith("train_seconds_per_step: sets seconds_per_cost_unit, so not both"));
  EXPECT_THAT(with([](auto& m) { m.set_train_seconds_per_step(0); }),
              StartsWith("train_seconds_per_step: the trainer's seconds per step must be in (0,"));
  EXPECT_THAT(with([](auto& m) {
                m.set_train_seconds_per_step(3);
                m.set_train_call_overhead_seconds(1);
                m.mutable_orchestrator()->set_train_calls_per_sync(4);
              }),
              AllOf(StartsWith("train_seconds_per_step: the trainer's seconds per step must be "
                               "in (4,"),
                    HasSubstr("got 3")));
}

TEST(SimulateConvertTest, DecodeSpeedSetsTheEngineModel) {
  v1::SimulatorConfig message = SmallConfig();  // 16 concurrent samples
  message.mutable_decode_speed()->set_single_tokens_per_second(40);
  message.mutable_decode_speed()->set_full_tokens_per_second(500);
  EngineModel expected = ToSimulatorConfig(SmallConfig()).engine;
  SetDecodeSpeed(expected, {.single_tokens_per_second = 40, .full_tokens_per_second = 500});
  const SimulatorConfig config = ToSimulatorConfig(message);
  EXPECT_EQ(config.engine.decode_base_seconds, expected.decode_base_seconds);
  EXPECT_EQ(config.engine.decode_per_sequence_seconds, expected.decode_per_sequence_seconds);
  EXPECT_NE(config.engine.decode_base_seconds, DefaultSimulatorConfig().engine.decode_base_seconds);
  EXPECT_EQ(config.engine.max_concurrent, 16);

  // The run's config states the engine's fields and the speed, and reads back.
  v1::SimulateRequest request;
  *request.mutable_config() = message;
  const v1::SimulationRun run = SolveSimulate(request).runs(0);
  EXPECT_EQ(run.config().engine().decode_base_seconds(), expected.decode_base_seconds);
  EXPECT_EQ(run.config().engine().decode_per_sequence_seconds(),
            expected.decode_per_sequence_seconds);
  EXPECT_THAT(run.config().decode_speed().single_tokens_per_second(), DoubleNear(40, 1e-9));
  EXPECT_THAT(run.config().decode_speed().full_tokens_per_second(), DoubleNear(500, 1e-9));
  EXPECT_EQ(SimulateErrorOf(run.config()), "");

  // A slower engine generates slower.
  v1::SimulateRequest slower = request;
  slower.mutable_config()->mutable_decode_speed()->set_single_tokens_per_second(20);
  slower.mutable_config()->mutable_decode_speed()->set_full_tokens_per_second(250);
  EXPECT_GT(SolveSimulate(slower).runs(0).report().mean_generation_seconds(),
            1.5 * run.report().mean_generation_seconds());
}

TEST(SimulateConvertTest, TrainSecondsPerStepSetsTheCostUnit) {
  // Sync, no over-sampling: the batches trained are the calibration's.
  for (const double seconds : {10.0, 40.0}) {
    v1::SimulatorConfig message = SmallConfig();
    message.set_steps(4);
    message.set_train_seconds_per_step(seconds);
    const SimulatorConfig config = ToSimulatorConfig(message);
    EXPECT_EQ(config.seconds_per_cost_unit,
              CostUnitForStepSeconds(ToSimulatorConfig(SmallConfig()), seconds));
    v1::SimulateRequest request;
    *request.mutable_config() = message;
    const v1::SimulationRun run = SolveSimulate(request).runs(0);
    EXPECT_THAT(run.report().mean_train_seconds(), DoubleNear(seconds, 0.15 * seconds));
    EXPECT_FALSE(run.config().has_train_seconds_per_step());
    EXPECT_EQ(run.config().seconds_per_cost_unit(), config.seconds_per_cost_unit);
  }
  // With streaming and a per-call overhead the step (all calls) still takes that long.
  v1::SimulatorConfig message = SmallConfig();
  message.set_steps(4);
  message.set_train_seconds_per_step(30);
  message.set_train_call_overhead_seconds(2);
  message.mutable_orchestrator()->set_train_calls_per_sync(2);
  v1::SimulateRequest request;
  *request.mutable_config() = message;
  const v1::SimulationRun run = SolveSimulate(request).runs(0);
  EXPECT_THAT(run.report().mean_train_seconds(), DoubleNear(30, 0.15 * 30));
  EXPECT_EQ(run.config().orchestrator().train_calls_per_sync(), 2);
  EXPECT_EQ(run.report().counters().steps_finished(), 4);
}

TEST(SimulateConvertTest, SolveSimulateFractionAndStreaming) {
  v1::SimulateRequest request;
  *request.mutable_config() = SmallConfig();
  v1::OrchestratorOptions* o = request.mutable_config()->mutable_orchestrator();
  o->set_staleness_fraction(0.5);
  o->set_train_calls_per_sync(2);
  const v1::SimulationRun run = SolveSimulate(request).runs(0);
  EXPECT_EQ(run.config().orchestrator().mode(), v1::ORCHESTRATOR_MODE_ASYNC);
  EXPECT_EQ(run.config().orchestrator().staleness_policy(), v1::STALENESS_POLICY_FRACTION);
  EXPECT_EQ(run.config().orchestrator().staleness_fraction(), 0.5);
  EXPECT_EQ(run.config().orchestrator().max_staleness(), 1);
  EXPECT_EQ(run.config().orchestrator().train_calls_per_sync(), 2);
  const v1::OrchestratorCounters& c = run.report().counters();
  EXPECT_EQ(c.steps_finished(), 3);
  EXPECT_EQ(c.trained(), 3 * 8 * 4);
  EXPECT_EQ(c.stale_restarts(), 0);  // the fraction policy discards nothing
  EXPECT_LE(run.report().metrics().max_staleness(), 1);
  EXPECT_EQ(SimulateErrorOf(run.config()), "");
}

TEST(SimulateConvertTest, SolveSimulateColocated) {
  v1::SimulateRequest request;
  *request.mutable_config() = SmallConfig();
  request.mutable_config()->set_release_seconds(5);
  // release_seconds applies to colocated runs only.
  try {
    SolveSimulate(request);
    ADD_FAILURE() << "accepted";
  } catch (const rlsched::FieldError& e) {
    EXPECT_THAT(e.what(), StartsWith("config.release_seconds: applies only to colocated runs"));
  }
  request.mutable_config()->clear_release_seconds();
  request.mutable_config()->set_resume_seconds(5);
  EXPECT_THROW(SolveSimulate(request), std::invalid_argument);

  request.mutable_config()->mutable_orchestrator()->set_colocated(true);
  const v1::SimulationRun slow = SolveSimulate(request).runs(0);
  request.mutable_config()->set_resume_seconds(0);
  const v1::SimulationRun fast = SolveSimulate(request).runs(0);
  EXPECT_TRUE(slow.config().orchestrator().colocated());
  EXPECT_EQ(slow.config().orchestrator().mode(), v1::ORCHESTRATOR_MODE_SYNC);
  EXPECT_EQ(slow.config().resume_seconds(), 5.0);
  EXPECT_EQ(slow.report().counters().steps_finished(), 3);
  // The two weight syncs between the three steps each wait for the engines' resume.
  EXPECT_GE(slow.report().metrics().elapsed_seconds(),
            fast.report().metrics().elapsed_seconds() + 2 * 5 - 1e-9);
}

TEST(SimulateConvertTest, CompareRunsColocatedSyncWhenTheGpusDivide) {
  v1::SimulateRequest request;
  *request.mutable_config() = SmallConfig();
  request.mutable_config()->set_steps(2);
  // 4 engines × 2 + 4 ranks × 1 = 12 GPUs: 6 engines of 2 and 12 ranks of 1.
  request.mutable_config()->set_gpus_per_engine(2);
  request.mutable_config()->set_release_seconds(1.5);
  request.mutable_config()->set_trace(true);
  request.set_compare(true);
  request.set_trace_run(std::string(kColocatedRunName));
  v1::SimulateReply reply = SolveSimulate(request);
  ASSERT_EQ(reply.runs_size(), 7);
  const v1::SimulationRun& colocated = reply.runs(0);
  EXPECT_EQ(colocated.name(), kColocatedRunName);
  EXPECT_EQ(colocated.config().engines(), 6);
  EXPECT_EQ(colocated.config().trainer_ranks(), 12);
  EXPECT_EQ(colocated.config().gpus_per_engine(), 2);
  EXPECT_TRUE(colocated.config().orchestrator().colocated());
  EXPECT_EQ(colocated.config().release_seconds(), 1.5);
  EXPECT_THAT(colocated.report().trace_json(), HasSubstr("traceEvents"));
  for (int i = 1; i < reply.runs_size(); ++i) {
    EXPECT_EQ(reply.runs(i).name(), ComparisonRuns()[static_cast<std::size_t>(i - 1)].name);
    EXPECT_EQ(reply.runs(i).config().engines(), 4);
    EXPECT_EQ(reply.runs(i).config().release_seconds(), 0.0);  // not colocated
    EXPECT_TRUE(reply.runs(i).report().trace_json().empty());
  }

  // 4 engines × 3 + 4 ranks × 1 = 16 GPUs: not a whole number of engines of 3.
  request.mutable_config()->set_gpus_per_engine(3);
  try {
    SolveSimulate(request);
    ADD_FAILURE() << "accepted";
  } catch (const rlsched::FieldError& e) {
    EXPECT_THAT(e.what(), AllOf(StartsWith("config.release_seconds: applies only to colocated "
                                           "runs (compare's colocated_sync run, which does not "
                                           "run: the 16 GPUs"),
                                HasSubstr("got 1.5")));
  }
  request.mutable_config()->clear_release_seconds();
  try {
    SolveSimulate(request);
    ADD_FAILURE() << "accepted";
  } catch (const rlsched::FieldError& e) {
    EXPECT_THAT(e.what(), StartsWith("trace_run: colocated_sync does not run: the 16 GPUs"));
  }
  request.clear_trace_run();
  reply = SolveSimulate(request);
  ASSERT_EQ(reply.runs_size(), 6);
  for (int i = 0; i < reply.runs_size(); ++i) {
    EXPECT_EQ(reply.runs(i).name(), ComparisonRuns()[static_cast<std::size_t>(i)].name);
  }
  // gpus_per_trainer_rank counts too: 4 × 1 + 4 × 3 = 16 GPUs, not ranks of 3.
  request.mutable_config()->set_gpus_per_engine(1);
  request.mutable_config()->set_gpus_per_trainer_rank(3);
  EXPECT_EQ(SolveSimulate(request).runs_size(), 6);
  request.mutable_config()->set_gpus_per_trainer_rank(2);  // 12 GPUs: 12 engines, 6 ranks
  reply = SolveSimulate(request);
  ASSERT_EQ(reply.runs_size(), 7);
  EXPECT_EQ(reply.runs(0).config().engines(), 12);
  EXPECT_EQ(reply.runs(0).config().trainer_ranks(), 6);
}

TEST(SimulateConvertTest, CompareRefusesAColocatedRunBeyondTheLimits) {
  v1::SimulateRequest request;
  *request.mutable_config() = SmallConfig();
  request.mutable_config()->set_engines(kMaxSimulationEngines);
  request.mutable_config()->set_steps(1);
  request.set_compare(true);
  try {
    SolveSimulate(request);
    ADD_FAILURE() << "accepted";
  } catch (const rlsched::FieldError& e) {
    EXPECT_THAT(e.what(), AllOf(StartsWith("config.engines: in compare's colocated_sync run"),
                                HasSubstr("100004 engines")));
  }
}

}  // namespace
}  // namespace rlsched::wire
