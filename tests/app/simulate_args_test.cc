// The simulate command's flags and their parsers (app/src/simulate_command.h), on the
// way to a SimulateRequest.

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

#include "rlsched/wire/simulate_convert.h"
#include "simulate_command.h"

namespace rlsched::app {
namespace {

using namespace ::rlsched::wire;  // NOLINT: the conversions

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(SimulateArgsTest, ParseLengthDist) {
  const v1::LengthDistribution dist = ParseLengthDist("lognormal:6.5,1.2,8192");
  EXPECT_EQ(dist.mu(), 6.5);
  EXPECT_EQ(dist.sigma(), 1.2);
  EXPECT_EQ(dist.max_tokens(), 8192);
  // The bounds themselves: MU in [-100, 100], SIGMA in [0, 20], MAX in [1, 2^31].
  for (const char* edge : {"lognormal:-100,0,1", "lognormal:100,20,2147483648"}) {
    EXPECT_NO_THROW(ParseLengthDist(edge)) << edge;
  }
  try {
    ParseLengthDist("lognormal:101,1,100");
    ADD_FAILURE() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("MU a number in [-100, 100], SIGMA a number in [0, 20], MAX "
                                    "an integer in [1, 2147483648]"));
  }
  for (const char* bad : {"", "lognormal:", "lognormal:1,2", "lognormal:1,2,3,4", "normal:1,2,3",
                          "lognormal:1,-1,100", "lognormal:1,1,0", "lognormal:x,1,100",
                          "lognormal:1,1,1.5", "lognormal:nan,1,100",
                          // Just outside the simulator's bounds, which the message states.
                          "lognormal:100.000001,1,100", "lognormal:-100.000001,1,100",
                          "lognormal:1,20.000001,100", "lognormal:1,1,2147483649"}) {
    try {
      ParseLengthDist(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_THAT(e.what(), StartsWith("--length-dist: must be lognormal:MU,SIGMA,MAX")) << bad;
    }
  }
}

TEST(SimulateArgsTest, ParseResponseLengths) {
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

TEST(SimulateArgsTest, FlagsOverrideTheConfigFile) {
  SimulateArgs args;
  args.config = "c.json";
  args.engines = 7;
  args.partial_rollout = false;
  args.length_dist = "lognormal:5,1,1000";
  args.max_generating_groups = 16;
  const v1::SimulateRequest request =
      MakeSimulateRequest(args,
                          R"({"engines": 3, "steps": 4, "orchestrator": {"partial_rollout": true},
          "lengths": {"lengths": [1, 2, 3], "mu": 1}})",
                          {});
  EXPECT_EQ(request.config().engines(), 7);
  EXPECT_EQ(request.config().steps(), 4);
  EXPECT_FALSE(request.config().orchestrator().partial_rollout());
  EXPECT_TRUE(request.config().orchestrator().has_partial_rollout());
  EXPECT_EQ(request.config().orchestrator().max_generating_groups(), 16);
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

TEST(SimulateArgsTest, ParseEngineTokensPerSecond) {
  const v1::DecodeSpeed speed = ParseEngineTokensPerSecond("40,500.5");
  EXPECT_EQ(speed.single_tokens_per_second(), 40.0);
  EXPECT_EQ(speed.full_tokens_per_second(), 500.5);
  // SINGLE's upper bound, the simulator's, is accepted.
  EXPECT_EQ(ParseEngineTokensPerSecond("1e12,1e12").single_tokens_per_second(), 1e12);
  for (const char* bad : {"", "40", "40,", ",500", "40,500,6", "0,500", "-1,500", "x,500", "40,inf",
                          "40,nan", "1000000000000.001,2e12"}) {
    try {
      ParseEngineTokensPerSecond(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_THAT(e.what(), StartsWith("--engine-tokens-per-second: must be SINGLE,FULL")) << bad;
    }
  }

  // The flag replaces the file's decode times, --train-seconds-per-step its cost unit.
  SimulateArgs args;
  args.config = "c.json";
  args.engine_tokens_per_second = "40,500";
  args.train_seconds_per_step = 12;
  args.staleness_fraction = 0.5;
  args.train_calls_per_sync = 2;
  args.release_seconds = 1;
  args.resume_seconds = 2;
  args.train_call_overhead_seconds = 0.5;
  args.gpus_per_engine = 2;
  args.gpus_per_trainer_rank = 4;
  const v1::SimulateRequest request = MakeSimulateRequest(
      args,
      R"({"engine": {"decode_base_seconds": 0.1, "decode_per_sequence_seconds": 0.01},
          "seconds_per_cost_unit": 0.5})",
      {});
  const v1::SimulatorConfig& config = request.config();
  EXPECT_FALSE(config.engine().has_decode_base_seconds());
  EXPECT_FALSE(config.engine().has_decode_per_sequence_seconds());
  EXPECT_EQ(config.decode_speed().single_tokens_per_second(), 40.0);
  EXPECT_FALSE(config.has_seconds_per_cost_unit());
  EXPECT_EQ(config.train_seconds_per_step(), 12.0);
  EXPECT_EQ(config.orchestrator().staleness_fraction(), 0.5);
  EXPECT_FALSE(config.orchestrator().has_max_staleness());
  EXPECT_EQ(config.orchestrator().train_calls_per_sync(), 2);
  EXPECT_EQ(config.release_seconds(), 1.0);
  EXPECT_EQ(config.resume_seconds(), 2.0);
  EXPECT_EQ(config.train_call_overhead_seconds(), 0.5);
  EXPECT_EQ(config.gpus_per_engine(), 2);
  EXPECT_EQ(config.gpus_per_trainer_rank(), 4);

  args = SimulateArgs();
  args.colocated = true;
  args.staleness_policy = "fraction";
  const v1::SimulateRequest colocated = MakeSimulateRequest(args, "", {});
  EXPECT_TRUE(colocated.config().orchestrator().colocated());
  EXPECT_EQ(colocated.config().orchestrator().staleness_policy(), v1::STALENESS_POLICY_FRACTION);

  args = SimulateArgs();
  args.staleness_fraction = 0.5;
  args.max_staleness = 1;
  try {
    MakeSimulateRequest(args, "", {});
    ADD_FAILURE() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), StartsWith("--max-staleness: does not apply with --staleness-fraction"));
  }
}

}  // namespace
}  // namespace rlsched::app
