// The simulator's wire contract: proto config <-> SimulatorConfig (defaults, round
// trips, errors naming the proto field), the --lengths and --length-dist parsers and
// the request the command builds, and SolveSimulate() on a small workload.

#include "simulate_convert.h"

#include <gmock/gmock.h>
#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "simulate_command.h"

namespace rlsched::scheduler {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using ::testing::AllOf;
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
std::string ErrorOf(const v1::SimulatorConfig& message) {
  try {
    ToSimulatorConfig(message);
  } catch (const std::invalid_argument& e) {
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
  config.steps = 3;
  config.engines = 5;
  config.engine.max_concurrent = 17;
  config.engine.prefill_tokens_per_second = 12345.5;
  config.engine.decode_base_seconds = 0.03;
  config.engine.decode_per_sequence_seconds = 1e-4;
  config.engine.decode_per_context_token_seconds = 1e-8;
  config.trainer_ranks = 6;
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
  EXPECT_THAT(ErrorOf(message), StartsWith("engines:"));

  message = v1::SimulatorConfig();
  message.set_steps(0);
  EXPECT_THAT(ErrorOf(message), StartsWith("steps:"));

  message = v1::SimulatorConfig();
  message.set_steps(kMaxSimulationSteps + 1);
  EXPECT_THAT(ErrorOf(message), StartsWith("steps: must be in [1, 100000]"));

  message = v1::SimulatorConfig();
  message.set_engines(kMaxSimulationEngines + 1);
  EXPECT_THAT(ErrorOf(message), StartsWith("engines:"));

  message = v1::SimulatorConfig();
  message.mutable_orchestrator()->set_prompts_per_step(1'000'000);
  message.set_steps(1000);
  EXPECT_THAT(ErrorOf(message), AllOf(StartsWith("steps:"), HasSubstr("at most 1e+07")));

  message = v1::SimulatorConfig();
  message.mutable_orchestrator()->set_mode(static_cast<v1::OrchestratorMode>(99));
  EXPECT_THAT(ErrorOf(message), StartsWith("orchestrator.mode: unknown value 99"));

  message = v1::SimulatorConfig();
  message.mutable_step()->set_max_tokens_per_micro_batch(0);
  EXPECT_THAT(ErrorOf(message), StartsWith("step.max_tokens_per_micro_batch: must be >= 1"));

  message = v1::SimulatorConfig();
  message.mutable_step()->set_max_tokens_per_micro_batch(1000);
  EXPECT_THAT(ErrorOf(message), AllOf(StartsWith("step.max_tokens_per_micro_batch: must be >= "
                                                 "the longest sequence"),
                                      HasSubstr("got 1000")));

  message = v1::SimulatorConfig();
  message.mutable_step()->set_pipeline_stages(-1);
  EXPECT_THAT(ErrorOf(message), StartsWith("step.pipeline_stages:"));

  message = v1::SimulatorConfig();
  message.mutable_step()->mutable_cost()->set_kind(v1::COST_KIND_ATTENTION);
  EXPECT_THAT(ErrorOf(message), StartsWith("step.cost:"));

  message = v1::SimulatorConfig();
  message.mutable_lengths()->add_lengths(5);
  message.mutable_lengths()->add_lengths(0);
  EXPECT_THAT(ErrorOf(message), StartsWith("lengths.lengths[1]: must be in [1, 2147483648]"));
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
  EXPECT_EQ(ErrorOf(with(v1::ORCHESTRATOR_MODE_SYNC, 2, std::nullopt)),
            "orchestrator.max_staleness: applies to mode async only (mode sync has staleness 0), "
            "got 2");
  EXPECT_EQ(ErrorOf(with(v1::ORCHESTRATOR_MODE_SYNC, 1, std::nullopt)),
            "orchestrator.max_staleness: applies to mode async only (mode sync has staleness 0), "
            "got 1");
  EXPECT_EQ(ErrorOf(with(v1::ORCHESTRATOR_MODE_ONE_STEP_OFF, 0, std::nullopt)),
            "orchestrator.max_staleness: applies to mode async only (mode one_step_off has "
            "staleness 1), got 0");
  EXPECT_EQ(ErrorOf(with(v1::ORCHESTRATOR_MODE_SYNC, std::nullopt, true)),
            "orchestrator.partial_rollout: applies to mode async only (mode sync never "
            "interrupts a generation: engines take new weights between batches), got true");
  EXPECT_THAT(ErrorOf(with(v1::ORCHESTRATOR_MODE_ONE_STEP_OFF, 1, true)),
              StartsWith("orchestrator.partial_rollout: applies to mode async only (mode "
                         "one_step_off never interrupts"));
  // The mode's own values are accepted.
  EXPECT_EQ(ErrorOf(with(v1::ORCHESTRATOR_MODE_SYNC, 0, false)), "");
  EXPECT_EQ(ErrorOf(with(v1::ORCHESTRATOR_MODE_ONE_STEP_OFF, 1, false)), "");
  EXPECT_EQ(ErrorOf(with(v1::ORCHESTRATOR_MODE_ASYNC, 5, true)), "");

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
    EXPECT_EQ(ErrorOf(message), "") << ModeName(mode);
    EXPECT_EQ(ToSimulatorConfig(message).orchestrator.mode, mode);
  }
}

TEST(SimulateConvertTest, FilterNeedsAllEqualGroups) {
  v1::SimulatorConfig message;
  message.mutable_orchestrator()->set_filter_all_equal(true);
  EXPECT_THAT(ErrorOf(message),
              StartsWith("orchestrator.filter_all_equal: must be false with all_equal_rate 0"));
  message.set_all_equal_rate(0.2);
  EXPECT_EQ(ErrorOf(message), "");
}

// --- Parsers and the command's request ------------------------------------------------

TEST(SimulateConvertTest, ParseLengthDist) {
  const v1::LengthDistribution dist = ParseLengthDist("lognormal:6.5,1.2,8192");
  EXPECT_EQ(dist.mu(), 6.5);
  EXPECT_EQ(dist.sigma(), 1.2);
  EXPECT_EQ(dist.max_tokens(), 8192);
  for (const char* bad : {"", "lognormal:", "lognormal:1,2", "lognormal:1,2,3,4", "normal:1,2,3",
                          "lognormal:1,-1,100", "lognormal:1,1,0", "lognormal:x,1,100",
                          "lognormal:1,1,1.5", "lognormal:nan,1,100"}) {
    try {
      ParseLengthDist(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_THAT(e.what(), StartsWith("--length-dist: must be lognormal:MU,SIGMA,MAX")) << bad;
    }
  }
}

TEST(SimulateConvertTest, ParseResponseLengths) {
  EXPECT_THAT(ParseResponseLengths("5 7\n9\n"), ElementsAre(5, 7, 9));
  // A CSV with response_tokens: that column alone, not prompt + response.
  EXPECT_THAT(ParseResponseLengths("group,prompt_tokens,response_tokens\n0,72,170\n0,72,193\n"),
              ElementsAre(170, 193));
  EXPECT_THAT(ParseResponseLengths("\xEF\xBB\xBF\"Response_Tokens\",\"length\"\n11,1\n12,2\n"),
              ElementsAre(11, 12));
  // Otherwise the reader's length column.
  EXPECT_THAT(ParseResponseLengths("length,group\n300,0\n400,1\n"), ElementsAre(300, 400));
  EXPECT_THROW(ParseResponseLengths("5 0 7"), std::invalid_argument);
  EXPECT_THROW(ParseResponseLengths(""), std::invalid_argument);
  try {
    ParseResponseLengths("prompt_tokens,response_tokens\n1,2\n3,x\n");
    ADD_FAILURE() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), StartsWith("line 3:"));
  }
}

TEST(SimulateConvertTest, FlagsOverrideTheConfigFile) {
  SimulateArgs args;
  args.config = "c.json";
  args.engines = 7;
  args.partial_rollout = false;
  args.length_dist = "lognormal:5,1,1000";
  const v1::SimulateRequest request =
      MakeSimulateRequest(args,
                          R"({"engines": 3, "steps": 4, "orchestrator": {"partial_rollout": true},
          "lengths": {"lengths": [1, 2, 3], "mu": 1}})",
                          {});
  EXPECT_EQ(request.config().engines(), 7);
  EXPECT_EQ(request.config().steps(), 4);
  EXPECT_FALSE(request.config().orchestrator().partial_rollout());
  EXPECT_TRUE(request.config().orchestrator().has_partial_rollout());
  EXPECT_EQ(request.config().lengths().mu(), 5.0);
  EXPECT_EQ(request.config().lengths().lengths_size(), 0);
  EXPECT_FALSE(request.config().has_trace());
  EXPECT_FALSE(request.compare());

  args = SimulateArgs();
  args.trace = "t.json";
  args.compare = true;
  args.trace_run = "sync";
  const v1::SimulateRequest traced = MakeSimulateRequest(args, "", {4, 5});
  EXPECT_TRUE(traced.config().trace());
  EXPECT_TRUE(traced.compare());
  EXPECT_EQ(traced.trace_run(), "sync");
  EXPECT_THAT(traced.config().lengths().lengths(), ElementsAre(4, 5));
  EXPECT_FALSE(traced.config().has_engines());

  args = SimulateArgs();
  args.compare = true;
  args.trace_run = "sync";
  try {
    MakeSimulateRequest(args, "", {});
    ADD_FAILURE() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "--trace-run: needs --trace");
  }

  args = SimulateArgs();
  args.config = "c.json";
  try {
    MakeSimulateRequest(args, R"({"engines": 3, "bogus": 1})", {});
    ADD_FAILURE() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), StartsWith("--config c.json: not a JSON rlsched.v1.SimulatorConfig"));
  }
}

// --- SolveSimulate --------------------------------------------------------------------

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
        } catch (const std::invalid_argument& e) {
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
  } catch (const std::invalid_argument& e) {
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
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(),
                 "trace_run: applies only with config.trace (it names the run whose trace is "
                 "kept), got 'sync'");
  }
  request.mutable_config()->set_trace(true);
  request.mutable_config()->set_steps(1);
  EXPECT_EQ(SolveSimulate(request).runs_size(), 6);

  // compare gives each run its mode, staleness and partial rollout: the config may not.
  const auto compare_error = [](const v1::OrchestratorOptions& orchestrator) -> std::string {
    v1::SimulateRequest compare;
    *compare.mutable_config() = SmallConfig();
    compare.mutable_config()->mutable_orchestrator()->MergeFrom(orchestrator);
    compare.set_compare(true);
    try {
      SolveSimulate(compare);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  };
  v1::OrchestratorOptions o;
  o.set_mode(v1::ORCHESTRATOR_MODE_ASYNC);
  EXPECT_EQ(compare_error(o),
            "config.orchestrator.mode: compare gives each run its own (sync, one_step_off, async "
            "s = 1 and 2 with and without partial rollout); leave it unset, got "
            "ORCHESTRATOR_MODE_ASYNC");
  o = v1::OrchestratorOptions();
  o.set_max_staleness(1);
  EXPECT_THAT(compare_error(o), StartsWith("config.orchestrator.max_staleness: compare gives"));
  o = v1::OrchestratorOptions();
  o.set_partial_rollout(false);
  EXPECT_THAT(compare_error(o), StartsWith("config.orchestrator.partial_rollout: compare gives"));
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
  ASSERT_EQ(reply.runs_size(), 6);
  const std::int64_t bounds[] = {0, 1, 1, 1, 2, 2};
  for (int i = 0; i < reply.runs_size(); ++i) {
    const v1::SimulationRun& run = reply.runs(i);
    const ComparisonRun& expected = ComparisonRuns()[static_cast<std::size_t>(i)];
    EXPECT_EQ(run.name(), expected.name);
    EXPECT_EQ(run.config().orchestrator().mode(), ToModeMessage(expected.mode));
    EXPECT_EQ(run.config().orchestrator().partial_rollout(), expected.partial_rollout);
    EXPECT_EQ(run.config().orchestrator().max_staleness(), expected.max_staleness);
    EXPECT_EQ(run.config().engines(), 4);  // the same workload
    EXPECT_EQ(run.config().seed(), reply.runs(0).config().seed());
    EXPECT_LE(run.report().metrics().max_staleness(), bounds[i]) << run.name();
    EXPECT_EQ(run.report().counters().steps_finished(), 3) << run.name();
    // Only the default trace run keeps its trace.
    EXPECT_EQ(run.report().trace_json().empty(), run.name() != kDefaultTraceRun) << run.name();
  }
}

}  // namespace
}  // namespace rlsched::scheduler
