// `rlsched simulate` run over pipes (the table, --json, --trace, --config, --compare,
// bad options), and the daemon's `simulate` request, in-process and over pipes.

#include <gmock/gmock.h>
#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "rlsched/v1/orchestrator.pb.h"
#include "rlsched/wire/simulate_convert.h"
#include "serve.h"
#include "serve_test_util.h"
#include "subprocess.h"

namespace rlsched::app {
namespace {

using namespace ::rlsched::wire;  // NOLINT: the conversions

using ::google::protobuf::util::MessageDifferencer;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::StartsWith;
using namespace ::rlsched::wire::testing;  // NOLINT: the test helpers

// A small, fast workload: 4 engines, 8 prompts × 4 samples, 3 steps (or `steps`).
std::vector<std::string> Small(std::vector<std::string> args, const char* steps = "3") {
  args.insert(args.begin(), "simulate");
  for (const char* arg : {"--engines", "4", "--engine-concurrency", "16", "--trainer-ranks", "4",
                          "--prompts-per-step", "8", "--samples-per-prompt", "4", "--steps", steps,
                          "--length-dist", "lognormal:6,1,2048"}) {
    args.emplace_back(arg);
  }
  return args;
}

v1::SimulateReply ParseSimulateReply(const std::string& out) {
  v1::SimulateReply reply;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << "not one line:\n" << out;
  const auto status = google::protobuf::util::JsonStringToMessage(out, &reply);
  EXPECT_TRUE(status.ok()) << status.ToString() << "\n" << out;
  return reply;
}

TEST(SimulateCliTest, Help) {
  const ProcessResult r = RunProgram({"simulate", "--help"});
  EXPECT_EQ(r.status, 0);
  for (const char* option : {"--mode",
                             "--max-staleness",
                             "--partial-rollout",
                             "--no-partial-rollout",
                             "--pause-mode",
                             "--oversample",
                             "--engines",
                             "--engine-concurrency",
                             "--trainer-ranks",
                             "--prompts-per-step",
                             "--samples-per-prompt",
                             "--steps",
                             "--lengths",
                             "--length-dist",
                             "--all-equal-rate",
                             "--filter-all-equal",
                             "--seed",
                             "--weight-sync-seconds",
                             "--mtbf",
                             "--config",
                             "--json",
                             "--trace",
                             "--trace-run",
                             "--compare",
                             "--staleness-policy",
                             "admission|fraction|strict",
                             "--staleness-fraction",
                             "--train-calls-per-sync",
                             "--colocated",
                             "--release-seconds",
                             "--resume-seconds",
                             "--train-call-overhead-seconds",
                             "--engine-tokens-per-second",
                             "--train-seconds-per-step",
                             "--gpus-per-engine",
                             "--gpus-per-trainer-rank",
                             "colocated_sync",
                             "response_tokens"}) {
    EXPECT_THAT(r.out, HasSubstr(option));
  }
  EXPECT_THAT(RunProgram({"--help"}).out, HasSubstr("simulate"));

  // The defaults as values, the same as the behaviour (--mode async turns partial
  // rollout on: AsyncOptionsImplyTheMode), not as C++ names or CLI11's "{false}" of
  // the negated flag.
  for (const char* text :
       {"Orchestrator mode (default: sync; async when --max-staleness or --partial-rollout",
        "Staleness bound s of async mode, in policy versions (train steps); implies --mode "
        "async; 0 behaves as sync. Range: integer in [0, 1000000]; default: 1.",
        "implies --mode async (default: on in async mode)",
        "Inference engines (field engines). Range: integer in [1, 100000]; default: 64.",
        "Samples an engine runs at once (field engine.max_concurrent). Range: integer in [1, "
        "1048576]; default: 256.",
        "Data-parallel ranks of the trainer (its data-parallel size; field trainer_ranks). "
        "Range: integer in [1, 1048576]; default: 64.",
        "Range: integer in [1, 10000000]; default: 512.",
        "Samples per prompt G, a GRPO group (verl's rollout.n). Range: integer in [1, 1048576]; "
        "default: 8.",
        "Train steps to simulate. Range: integer in [1, 100000]; default: 10.",
        "(default: lognormal:6.67,1.15,16384)", "all equal. Range: number in [0, 1]; default: 0.",
        "(needs --all-equal-rate > 0)",
        "Seed of the workload and the failures. Range: integer in [0, 18446744073709551615]; "
        "default: 1.",
        "Seconds to load new weights on one engine. Range: number in [0, 1000000000]; default: 1.",
        "Defaults: 64 engines of 256 concurrent samples",
        // The newer options: their units and real defaults.
        "not with --max-staleness. Range: number in [0, 1000000]; default: 0.",
        "after the K-th. Range: integer >= 1, a divisor of --prompts-per-step; default: 1.",
        "implies --mode sync (default: off)",
        "free its GPU memory for the trainer; needs --colocated or --compare. Range: number in "
        "[0, 1000000000]; default: 0.",
        "before loading the new weights; needs --colocated or --compare. Range: number in [0, "
        "1000000000]; default: 0.",
        "the optimizer step). Range: number in [0, 1000000000]; default: 0.",
        "Decode speed of one engine in tokens per second: one sample alone (SINGLE, a number in "
        "(0, 1000000000000]), and --engine-concurrency samples together",
        "default: 49.75,5614)", "default: unset, 0.00381 s per cost unit",
        "Range: number in (0, 1000000000]",
        "tensor-parallel size), for --compare's colocated_sync run on the same GPUs. Range: "
        "integer in [1, 4096]; default: 1.",
        "GPUs behind one trainer rank, for --compare's colocated_sync run on the same GPUs. "
        "Range: integer in [1, 4096]; default: 1."}) {
    EXPECT_THAT(r.out, HasSubstr(text));
  }
  EXPECT_THAT(r.out, Not(HasSubstr("{false}")));
  EXPECT_THAT(r.out, Not(HasSubstr("DefaultSimulatorConfig")));
}

// The first line of the summary.
std::string ModeLine(const ProcessResult& r) {
  const std::vector<std::string> lines = Lines(r.out);
  return lines.empty() ? std::string() : lines.front();
}

TEST(SimulateCliTest, AsyncOptionsImplyTheMode) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--max-staleness", "2"},
       "mode             async, max staleness 2, partial rollout (interrupt and resume at a "
       "sync)"},
      {{"--partial-rollout"}, "mode             async, max staleness 1, partial rollout ("},
      {{"--no-partial-rollout"},
       "mode             async, max staleness 1, no partial rollout (engines drain, then sync)"},
      {{"--partial-rollout=false", "--max-staleness", "0"},
       "mode             async, max staleness 0, no partial rollout"},
      // Partial rollout is on by default in async, as --help says.
      {{"--mode", "async"}, "mode             async, max staleness 1, partial rollout ("},
      // A mode's own values are true statements, not ignored options.
      {{"--mode", "sync", "--max-staleness", "0", "--no-partial-rollout"}, "mode             sync"},
      {{"--mode", "one_step_off", "--max-staleness", "1", "--partial-rollout=false"},
       "mode             one_step_off (staleness <= 1"},
      {{"--pause-mode", "abort"},
       "mode             async, max staleness 1, partial rollout (abort at a sync, resubmit "
       "after it)"},
      {{"--pause-mode", "keep", "--mode", "async"},
       "mode             async, max staleness 1, partial rollout (interrupt and resume"},
  };
  for (const auto& [args, line] : cases) {
    const ProcessResult r = RunProgram(Small(args));
    ASSERT_EQ(r.status, 0) << args[0] << "\n" << r.err;
    EXPECT_THAT(ModeLine(r), StartsWith(line)) << args[0];
  }
}

TEST(SimulateCliTest, AsyncOptionsOfSyncAndOneStepOffAreRefused) {
  const TempDir dir;
  const std::string sync_file =
      dir.Write("sync.json", R"({"orchestrator": {"mode": "ORCHESTRATOR_MODE_SYNC"}})");
  const std::string staleness_file =
      dir.Write("staleness.json", R"({"orchestrator": {"max_staleness": 2}})");
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--mode", "sync", "--max-staleness", "2"},
       "--max-staleness (orchestrator.max_staleness): applies to mode async only (mode sync has "
       "staleness 0), got 2"},
      {{"--mode", "one_step_off", "--max-staleness", "2"},
       "--max-staleness (orchestrator.max_staleness): applies to mode async only (mode "
       "one_step_off has staleness 1), got 2"},
      {{"--mode", "sync", "--partial-rollout"},
       "--partial-rollout (orchestrator.partial_rollout): applies to mode async only (mode sync "
       "never interrupts a generation"},
      {{"--mode", "one_step_off", "--partial-rollout"},
       "--partial-rollout (orchestrator.partial_rollout): applies to mode async only (mode "
       "one_step_off never interrupts a generation"},
      {{"--mode", "sync", "--pause-mode", "abort"},
       "--pause-mode (orchestrator.pause_mode): applies to mode async with partial rollout only "
       "(mode sync never interrupts a generation), got PAUSE_MODE_ABORT"},
      {{"--no-partial-rollout", "--pause-mode", "abort"},
       "--pause-mode (orchestrator.pause_mode): applies with partial_rollout only"},
      // The file and the flags combined: the file's mode, the flag's staleness…
      {{"--config", sync_file, "--max-staleness", "1"},
       "--max-staleness (orchestrator.max_staleness): applies to mode async only (mode sync has "
       "staleness 0), got 1"},
      // … and the flag's mode, the file's staleness.
      {{"--config", staleness_file, "--mode", "sync"},
       "--config " + staleness_file +
           ": orchestrator.max_staleness: applies to mode async only (mode sync has staleness 0), "
           "got 2"},
  };
  for (const auto& [args, text] : cases) {
    const ProcessResult r = RunProgram(Small(args));
    EXPECT_EQ(r.status, 2) << args[0] << " " << args[1] << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr(text)) << args[0] << " " << args[1];
    EXPECT_THAT(r.out, IsEmpty()) << args[0] << " " << args[1];
  }

  // The file alone selects async with its staleness.
  const ProcessResult implied = RunProgram(Small({"--config", staleness_file}));
  ASSERT_EQ(implied.status, 0) << implied.err;
  EXPECT_THAT(ModeLine(implied), StartsWith("mode             async, max staleness 2, partial"));
}

// --staleness-policy is async's: it implies async, names itself in the mode line, and
// sync refuses admission; strict keeps the bound, admission discards nothing for it.
TEST(SimulateCliTest, StalenessPolicy) {
  const ProcessResult refused =
      RunProgram(Small({"--mode", "sync", "--staleness-policy", "admission"}));
  EXPECT_EQ(refused.status, 2);
  EXPECT_THAT(refused.err, HasSubstr("--staleness-policy (orchestrator.staleness_policy): applies "
                                     "to mode async only (mode sync keeps every token within "
                                     "its staleness: strict), got STALENESS_POLICY_ADMISSION"));
  for (const std::string policy : {"admission", "strict"}) {
    const ProcessResult r = RunProgram(Small({"--staleness-policy", policy, "--json"}));
    ASSERT_EQ(r.status, 0) << r.err;
    v1::SimulateReply reply;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(r.out, &reply).ok()) << r.out;
    const v1::OrchestratorOptions& o = reply.runs(0).config().orchestrator();
    EXPECT_EQ(o.mode(), v1::ORCHESTRATOR_MODE_ASYNC);
    const v1::SimulationReport& report = reply.runs(0).report();
    if (policy == "strict") {
      EXPECT_EQ(o.staleness_policy(), v1::STALENESS_POLICY_STRICT);
      EXPECT_LE(report.metrics().max_staleness(), o.max_staleness());
    } else {
      EXPECT_EQ(o.staleness_policy(), v1::STALENESS_POLICY_ADMISSION);
      EXPECT_EQ(report.counters().stale_discarded_tokens(), 0);
    }
    const ProcessResult table = RunProgram(Small({"--staleness-policy", policy}));
    EXPECT_THAT(ModeLine(table), HasSubstr(policy + " policy"));
    EXPECT_THAT(table.out, ::testing::ContainsRegex("staleness +samples +share +tokens +share"));
  }
}

TEST(SimulateCliTest, OptionsThatWouldBeIgnoredAreRefused) {
  const TempDir dir;
  const std::string async_file = dir.Write(
      "async.json", R"({"orchestrator": {"mode": "ORCHESTRATOR_MODE_ASYNC", "max_staleness": 1}})");
  const std::string trace = dir / "trace.json";
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      // --compare sets the mode, staleness and partial rollout of each run.
      {{"--compare", "--max-staleness", "2"}, "--max-staleness"},
      {{"--compare", "--partial-rollout"}, "--partial-rollout"},
      {{"--compare", "--no-partial-rollout"}, "--no-partial-rollout"},
      {{"--compare", "--config", async_file},
       "--config " + async_file + ": orchestrator.mode: compare gives each run its own"},
      // --trace-run picks the run whose trace --trace writes.
      {{"--compare", "--trace-run", "sync"}, "--trace-run requires --trace"},
      {{"--trace", trace, "--trace-run", "sync"}, "--trace-run requires --compare"},
      // The filter has nothing to drop when no group's rewards are all equal.
      {{"--filter-all-equal"},
       "--filter-all-equal (orchestrator.filter_all_equal): must be false with all_equal_rate 0"},
      {{"--partial-rollout", "--no-partial-rollout"}, "--no-partial-rollout"},
  };
  for (const auto& [args, text] : cases) {
    const ProcessResult r = RunProgram(Small(args));
    EXPECT_EQ(r.status, 2) << args[0] << " " << args[1] << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr(text)) << args[0] << " " << args[1];
    EXPECT_THAT(r.out, IsEmpty()) << args[0] << " " << args[1];
  }
  EXPECT_FALSE(std::filesystem::exists(trace));

  const ProcessResult filtered =
      RunProgram(Small({"--filter-all-equal", "--all-equal-rate", "0.3", "--json"}));
  ASSERT_EQ(filtered.status, 0) << filtered.err;
  EXPECT_GT(ParseSimulateReply(filtered.out).runs(0).report().counters().filtered(), 0);
}

TEST(SimulateCliTest, Table) {
  const ProcessResult r = RunProgram(Small({"--mode", "async", "--max-staleness", "1"}));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.err, IsEmpty());
  for (const char* text :
       {"async, max staleness 1, partial rollout", "4 × 16 concurrent",
        "8 prompts × 4 samples; 3 steps", "throughput", "samples/s", "ideal bound",
        "min(engine capacity", "trainer idle", "engine idle", "staleness  samples"}) {
    EXPECT_THAT(r.out, HasSubstr(text));
  }
  EXPECT_THAT(r.out, HasSubstr("trained 96"));
}

TEST(SimulateCliTest, JsonParsesBack) {
  const ProcessResult r = RunProgram(
      Small({"--json", "--seed", "7", "--no-partial-rollout", "--mode", "async", "--mtbf", "0"}));
  ASSERT_EQ(r.status, 0) << r.err;
  const v1::SimulateReply reply = ParseSimulateReply(r.out);
  ASSERT_EQ(reply.runs_size(), 1);
  const v1::SimulationRun& run = reply.runs(0);
  EXPECT_EQ(run.name(), "simulation");
  EXPECT_EQ(run.config().engines(), 4);
  EXPECT_EQ(run.config().seed(), 7u);
  EXPECT_EQ(run.config().orchestrator().mode(), v1::ORCHESTRATOR_MODE_ASYNC);
  EXPECT_FALSE(run.config().orchestrator().partial_rollout());
  EXPECT_EQ(run.report().counters().trained(), 96);
  EXPECT_TRUE(run.report().trace_json().empty());
  // Proto field names, default-valued fields printed.
  EXPECT_THAT(r.out, HasSubstr("\"samples_per_second\""));
  EXPECT_THAT(r.out, HasSubstr("\"trace_json\":\"\""));

  // The same config and seed give the same report.
  const ProcessResult again = RunProgram(
      Small({"--json", "--seed", "7", "--no-partial-rollout", "--mode", "async", "--mtbf", "0"}));
  EXPECT_EQ(again.out, r.out);

  // --partial-rollout[=BOOL] selects async (AsyncOptionsImplyTheMode).
  const ProcessResult on = RunProgram(Small({"--json", "--partial-rollout=true"}));
  ASSERT_EQ(on.status, 0) << on.err;
  const v1::OrchestratorOptions on_options =
      ParseSimulateReply(on.out).runs(0).config().orchestrator();
  EXPECT_EQ(on_options.mode(), v1::ORCHESTRATOR_MODE_ASYNC);
  EXPECT_TRUE(on_options.partial_rollout());
  const ProcessResult off = RunProgram(Small({"--json", "--partial-rollout=false"}));
  ASSERT_EQ(off.status, 0) << off.err;
  const v1::OrchestratorOptions off_options =
      ParseSimulateReply(off.out).runs(0).config().orchestrator();
  EXPECT_EQ(off_options.mode(), v1::ORCHESTRATOR_MODE_ASYNC);
  EXPECT_FALSE(off_options.partial_rollout());

  // A sync run's config states what sync runs with: staleness 0, no partial rollout.
  const ProcessResult sync = RunProgram(Small({"--json"}));
  ASSERT_EQ(sync.status, 0) << sync.err;
  const v1::OrchestratorOptions sync_options =
      ParseSimulateReply(sync.out).runs(0).config().orchestrator();
  EXPECT_EQ(sync_options.mode(), v1::ORCHESTRATOR_MODE_SYNC);
  EXPECT_EQ(sync_options.max_staleness(), 0);
  EXPECT_FALSE(sync_options.partial_rollout());
}

TEST(SimulateCliTest, TraceFile) {
  const TempDir dir;
  const std::string path = dir / "trace.json";
  const ProcessResult r = RunProgram(Small({"--trace", path, "--json"}));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(ReadFile(path), HasSubstr("traceEvents"));
  EXPECT_TRUE(ParseSimulateReply(r.out).runs(0).report().trace_json().empty());

  const ProcessResult bad = RunProgram(Small({"--trace", dir / "missing/trace.json"}));
  EXPECT_EQ(bad.status, 2);
  EXPECT_THAT(bad.err, HasSubstr("--trace"));
}

TEST(SimulateCliTest, ConfigFile) {
  const TempDir dir;
  const std::string config = dir.Write("config.json", R"({
    "engines": 4, "steps": 5, "trainer_ranks": 4, "dataset_prompts": 64,
    "engine": {"max_concurrent": 16},
    "orchestrator": {"mode": "ORCHESTRATOR_MODE_ONE_STEP_OFF", "prompts_per_step": 8,
                     "samples_per_prompt": 4},
    "lengths": {"max_tokens": 2048}
  })");
  const ProcessResult r = RunProgram({"simulate", "--config", config, "--steps", "2", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  const v1::SimulationRun run = ParseSimulateReply(r.out).runs(0);
  EXPECT_EQ(run.config().steps(), 2);  // the flag overrides the file
  EXPECT_EQ(run.config().engines(), 4);
  EXPECT_EQ(run.config().orchestrator().mode(), v1::ORCHESTRATOR_MODE_ONE_STEP_OFF);
  EXPECT_EQ(run.report().counters().trained(), 2 * 8 * 4);

  const std::string invalid = dir.Write("invalid.json", R"({"engines": 0})");
  const ProcessResult bad = RunProgram({"simulate", "--config", invalid});
  EXPECT_EQ(bad.status, 2);
  EXPECT_THAT(bad.err, HasSubstr("--config " + invalid + ": engines:"));
  EXPECT_THAT(bad.out, IsEmpty());

  const std::string unknown = dir.Write("unknown.json", R"({"engine_count": 4})");
  const ProcessResult not_config = RunProgram({"simulate", "--config", unknown});
  EXPECT_EQ(not_config.status, 2);
  EXPECT_THAT(not_config.err, HasSubstr("not a JSON rlsched.v1.SimulatorConfig"));

  const ProcessResult missing = RunProgram({"simulate", "--config", dir / "none.json"});
  EXPECT_EQ(missing.status, 2);
  EXPECT_THAT(missing.err, HasSubstr("--config"));
}

TEST(SimulateCliTest, LengthsFile) {
  const TempDir dir;
  const std::string csv = dir.Write("lengths.csv",
                                    "group,prompt_tokens,response_tokens\n0,72,170\n0,72,1930\n"
                                    "1,80,40\n1,80,600\n");
  const ProcessResult r =
      RunProgram({"simulate", "--engines", "4", "--prompts-per-step", "8", "--samples-per-prompt",
                  "4", "--steps", "2", "--lengths", csv, "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  const v1::SimulationRun run = ParseSimulateReply(r.out).runs(0);
  EXPECT_THAT(run.config().lengths().lengths(), ::testing::ElementsAre(170, 1930, 40, 600));

  const std::string zero = dir.Write("zero.txt", "5 0 7\n");
  const ProcessResult bad = RunProgram({"simulate", "--lengths", zero});
  EXPECT_EQ(bad.status, 2);
  EXPECT_THAT(bad.err, HasSubstr("--lengths " + zero + ": length 0"));

  const ProcessResult both =
      RunProgram({"simulate", "--lengths", zero, "--length-dist", "lognormal:6,1,100"});
  EXPECT_EQ(both.status, 2);
}

TEST(SimulateCliTest, CompareTable) {
  const ProcessResult r = RunProgram(Small({"--compare"}));
  ASSERT_EQ(r.status, 0) << r.err;
  const std::vector<std::string> lines = Lines(r.out);
  const auto header = std::find_if(
      lines.begin(), lines.end(), [](const std::string& line) { return line.starts_with("run "); });
  ASSERT_NE(header, lines.end()) << r.out;
  for (const char* column :
       {"mode", "staleness", "partial", "samples/s", "× sync", "% of ideal", "trainer idle",
        "engine idle", "max staleness", "partial ratio", "restarts"}) {
    EXPECT_THAT(*header, HasSubstr(column));
  }
  // colocated_sync first (the 8 GPUs divide), then the six.
  ASSERT_GE(lines.end() - header, 8);
  const char* names[] = {"colocated_sync ",   "sync ",     "one_step_off ",
                         "async_s1_partial ", "async_s1 ", "async_s2_partial ",
                         "async_s2 "};
  for (int i = 0; i < 7; ++i) EXPECT_THAT(header[1 + i], StartsWith(names[i]));
  EXPECT_THAT(header[1], HasSubstr("sync, colocated"));
  EXPECT_THAT(header[2], HasSubstr("1.00"));  // sync × sync
  EXPECT_THAT(r.out, HasSubstr("ideal bound"));
  EXPECT_THAT(r.out, HasSubstr("colocated_sync: sync on the same 8 GPUs, engines and trainer "
                               "taking turns: 8 engines and 8 trainer ranks"));
  EXPECT_THAT(r.out, Not(HasSubstr("note: no colocated_sync run")));
  EXPECT_THAT(header[4], HasSubstr(" yes "));  // async_s1_partial keeps its paused samples

  // --pause-mode applies to the runs with partial rollout.
  const ProcessResult aborting = RunProgram(Small({"--compare", "--pause-mode", "abort"}));
  ASSERT_EQ(aborting.status, 0) << aborting.err;
  const std::vector<std::string> abort_lines = Lines(aborting.out);
  const auto abort_header =
      std::find_if(abort_lines.begin(), abort_lines.end(),
                   [](const std::string& line) { return line.starts_with("run "); });
  ASSERT_GE(abort_lines.end() - abort_header, 8) << aborting.out;
  EXPECT_THAT(abort_header[4], HasSubstr(" abort "));  // async_s1_partial
  EXPECT_THAT(abort_header[5], HasSubstr(" no "));     // async_s1
  EXPECT_THAT(abort_header[6], HasSubstr(" abort "));  // async_s2_partial

  // GPUs that do not divide: the six runs and one note.
  const ProcessResult odd = RunProgram(Small({"--compare", "--gpus-per-engine", "3"}));
  ASSERT_EQ(odd.status, 0) << odd.err;
  const std::vector<std::string> odd_lines = Lines(odd.out);
  const auto odd_header = std::find_if(odd_lines.begin(), odd_lines.end(),
                                       [](const auto& line) { return line.starts_with("run "); });
  ASSERT_GE(odd_lines.end() - odd_header, 7) << odd.out;
  EXPECT_THAT(odd_header[1], StartsWith("sync "));
  for (const std::string& line : odd_lines) EXPECT_THAT(line, Not(StartsWith("colocated_sync")));
  EXPECT_THAT(odd.out, HasSubstr("note: no colocated_sync run: the 16 GPUs (4 engines × 3 + 4 "
                                 "trainer ranks × 1) do not divide into engines of 3 GPUs and "
                                 "trainer ranks of 1 GPU."));
  EXPECT_EQ(std::count(odd.out.begin(), odd.out.end(), '\n') + 1,
            std::count(r.out.begin(), r.out.end(), '\n'))
      << "one row fewer, one note line in place of the colocated_sync line";

  const TempDir dir;
  const std::string path = dir / "trace.json";
  const ProcessResult traced =
      RunProgram(Small({"--compare", "--json", "--trace", path, "--trace-run", "one_step_off"}));
  ASSERT_EQ(traced.status, 0) << traced.err;
  EXPECT_EQ(ParseSimulateReply(traced.out).runs_size(), 7);
  EXPECT_THAT(ReadFile(path), HasSubstr("traceEvents"));
}

TEST(SimulateCliTest, BadOptionsExitTwo) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"simulate", "--engines", "0"}, "--engines"},
      {{"simulate", "--steps", "0"}, "--steps"},
      {{"simulate", "--steps", "1000000"}, "--steps"},
      {{"simulate", "--mode", "fast"}, "--mode"},
      {{"simulate", "--max-staleness", "-1"}, "--max-staleness"},
      {{"simulate", "--oversample", "-0.5"}, "--oversample"},
      {{"simulate", "--all-equal-rate", "1.5"}, "--all-equal-rate"},
      {{"simulate", "--mtbf", "nan"}, "--mtbf"},
      {{"simulate", "--length-dist", "lognormal:6,1"}, "--length-dist"},
      {{"simulate", "--trace-run", "sync"}, "--trace-run"},
      {{"simulate", "--compare", "--mode", "sync"}, "--mode"},
      {{"simulate", "--compare", "--trace", "t.json", "--trace-run", "async_s9"},
       "--trace-run: must be one of sync, one_step_off"},
      {{"simulate", "--prompts-per-step", "1000000", "--steps", "100"}, "at most 1e+07"},
      {{"simulate", "--unknown"}, "--unknown"},
  };
  for (const auto& [args, text] : cases) {
    const ProcessResult r = RunProgram(args);
    EXPECT_EQ(r.status, 2) << args[1] << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr(text)) << args[1];
    EXPECT_THAT(r.out, IsEmpty()) << args[1];
  }
}

// --- The fraction policy, streaming, colocation, speeds in users' units -----------------

// The line of the summary starting with `label`.
std::string LineOf(const ProcessResult& r, std::string_view label) {
  for (const std::string& line : Lines(r.out)) {
    if (line.starts_with(label)) return line;
  }
  return "";
}

TEST(SimulateCliTest, StalenessFractionAndStreaming) {
  const ProcessResult r =
      RunProgram(Small({"--staleness-fraction", "0.5", "--train-calls-per-sync", "2", "--json"}));
  ASSERT_EQ(r.status, 0) << r.err;
  const v1::SimulationRun run = ParseSimulateReply(r.out).runs(0);
  const v1::OrchestratorOptions& o = run.config().orchestrator();
  EXPECT_EQ(o.mode(), v1::ORCHESTRATOR_MODE_ASYNC);  // implied
  EXPECT_EQ(o.staleness_policy(), v1::STALENESS_POLICY_FRACTION);
  EXPECT_EQ(o.staleness_fraction(), 0.5);
  EXPECT_EQ(o.max_staleness(), 1);
  EXPECT_EQ(o.train_calls_per_sync(), 2);
  EXPECT_EQ(run.report().counters().trained(), 96);
  EXPECT_EQ(run.report().counters().stale_restarts(), 0);

  const ProcessResult table =
      RunProgram(Small({"--staleness-fraction", "1.5", "--train-calls-per-sync", "4"}));
  ASSERT_EQ(table.status, 0) << table.err;
  EXPECT_THAT(ModeLine(table), StartsWith("mode             async, staleness fraction α 1.5 "
                                          "(generation at most 2 batches ahead), partial rollout"));
  EXPECT_THAT(ModeLine(table), HasSubstr("fraction policy"));
  EXPECT_THAT(LineOf(table, "batch"),
              HasSubstr("8 prompts × 4 samples, streamed: 4 trainer calls of 2 prompts per "
                        "weight sync; 3 steps"));
  // k = 1 says nothing of streaming.
  EXPECT_THAT(LineOf(RunProgram(Small({})), "batch"), Not(HasSubstr("streamed")));

  // --staleness-policy fraction alone: α = 0.
  const ProcessResult policy = RunProgram(Small({"--staleness-policy", "fraction", "--json"}));
  ASSERT_EQ(policy.status, 0) << policy.err;
  const v1::OrchestratorOptions p = ParseSimulateReply(policy.out).runs(0).config().orchestrator();
  EXPECT_EQ(p.staleness_policy(), v1::STALENESS_POLICY_FRACTION);
  EXPECT_EQ(p.staleness_fraction(), 0.0);
}

TEST(SimulateCliTest, Colocated) {
  const ProcessResult r = RunProgram(
      Small({"--colocated", "--release-seconds", "1.5", "--resume-seconds", "2", "--json"}));
  ASSERT_EQ(r.status, 0) << r.err;
  const v1::SimulationRun run = ParseSimulateReply(r.out).runs(0);
  EXPECT_EQ(run.config().orchestrator().mode(), v1::ORCHESTRATOR_MODE_SYNC);  // implied
  EXPECT_TRUE(run.config().orchestrator().colocated());
  EXPECT_EQ(run.config().release_seconds(), 1.5);
  EXPECT_EQ(run.config().resume_seconds(), 2.0);
  EXPECT_EQ(run.report().counters().trained(), 96);
  EXPECT_EQ(run.report().metrics().max_staleness(), 0);

  const ProcessResult table = RunProgram(
      Small({"--colocated", "--release-seconds", "1.5", "--mode", "sync", "--max-staleness", "0"}));
  ASSERT_EQ(table.status, 0) << table.err;
  EXPECT_THAT(ModeLine(table),
              StartsWith("mode             sync, colocated (engines and trainer take turns on the "
                         "same GPUs; per engine: release 1.50 s, resume 0 s"));
}

TEST(SimulateCliTest, SpeedsInUsersUnits) {
  const ProcessResult r =
      RunProgram(Small({"--engine-tokens-per-second", "40,500", "--train-seconds-per-step", "20",
                        "--train-call-overhead-seconds", "0.5", "--gpus-per-engine", "2",
                        "--gpus-per-trainer-rank", "4", "--json"},
                       "4"));
  ASSERT_EQ(r.status, 0) << r.err;
  const v1::SimulationRun run = ParseSimulateReply(r.out).runs(0);
  EXPECT_NEAR(run.config().decode_speed().single_tokens_per_second(), 40, 1e-9);
  EXPECT_NEAR(run.config().decode_speed().full_tokens_per_second(), 500, 1e-9);
  EXPECT_NEAR(run.config().engine().decode_base_seconds() +
                  run.config().engine().decode_per_sequence_seconds(),
              1.0 / 40, 1e-12);
  EXPECT_FALSE(run.config().has_train_seconds_per_step());
  EXPECT_NEAR(run.report().mean_train_seconds(), 20, 0.15 * 20);
  EXPECT_EQ(run.config().train_call_overhead_seconds(), 0.5);
  EXPECT_EQ(run.config().gpus_per_engine(), 2);
  EXPECT_EQ(run.config().gpus_per_trainer_rank(), 4);

  const ProcessResult table =
      RunProgram(Small({"--engine-tokens-per-second", "40,500", "--train-seconds-per-step", "20",
                        "--train-call-overhead-seconds", "0.5", "--gpus-per-engine", "2",
                        "--gpus-per-trainer-rank", "4"},
                       "4"));
  ASSERT_EQ(table.status, 0) << table.err;
  EXPECT_THAT(LineOf(table, "engines"),
              HasSubstr("4 × 16 concurrent samples on 2 GPUs each; decode 40 tokens/s alone, 500 "
                        "tokens/s at full concurrency"));
  EXPECT_THAT(
      LineOf(table, "trainer"),
      AllOf(::testing::ContainsRegex("4 ranks on 4 GPUs each; mean (1[7-9]|2[0-3])\\.[0-9]+ "
                                     "s per step"),
            HasSubstr(", of which 0.5 s per call is fixed (train_call_overhead_seconds)")));
  EXPECT_THAT(LineOf(table, "GPUs"), HasSubstr("24 = 4 engines × 2 + 4 trainer ranks × 4"));

  // The flags replace the file's decode times and cost unit.
  const TempDir dir;
  const std::string config = dir.Write(
      "speeds.json", R"({"engine": {"decode_base_seconds": 0.5}, "seconds_per_cost_unit": 1})");
  const ProcessResult file =
      RunProgram(Small({"--config", config, "--engine-tokens-per-second", "40,500",
                        "--train-seconds-per-step", "20", "--json"}));
  ASSERT_EQ(file.status, 0) << file.err;
  EXPECT_NEAR(
      ParseSimulateReply(file.out).runs(0).config().decode_speed().single_tokens_per_second(), 40,
      1e-9);

  // A run's config reads back as --config, speeds and all.
  const std::string again = dir.Write("again.json", [&] {
    std::string json;
    EXPECT_TRUE(google::protobuf::util::MessageToJsonString(run.config(), &json).ok());
    return json;
  }());
  const ProcessResult replay = RunProgram({"simulate", "--config", again, "--json"});
  ASSERT_EQ(replay.status, 0) << replay.err;
  EXPECT_TRUE(MessageDifferencer::Equals(ParseSimulateReply(replay.out).runs(0), run));
}

TEST(SimulateCliTest, NewOptionsThatDoNotApplyAreRefused) {
  const TempDir dir;
  const std::string async_file =
      dir.Write("async.json", R"({"orchestrator": {"mode": "ORCHESTRATOR_MODE_ASYNC"}})");
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--staleness-fraction", "0.5", "--mode", "sync"},
       "--staleness-fraction (orchestrator.staleness_fraction): applies to mode async with the "
       "fraction policy only (mode sync has staleness 0), got 0.5"},
      {{"--staleness-fraction", "0.5", "--mode", "one_step_off"},
       "--staleness-fraction (orchestrator.staleness_fraction): applies to mode async with the "
       "fraction policy only (mode one_step_off has staleness 1), got 0.5"},
      {{"--staleness-fraction", "0.5", "--staleness-policy", "strict"},
       "--staleness-fraction (orchestrator.staleness_fraction): applies to the fraction policy "
       "only (the strict policy bounds staleness by max_staleness), got 0.5"},
      {{"--staleness-fraction", "0.5", "--staleness-policy", "admission"},
       "--staleness-fraction (orchestrator.staleness_fraction): applies to the fraction policy "
       "only (the admission policy bounds staleness by max_staleness), got 0.5"},
      {{"--staleness-fraction", "0.5", "--max-staleness", "1"},
       "--max-staleness: does not apply with --staleness-fraction"},
      {{"--staleness-policy", "fraction", "--max-staleness", "2"},
       "--max-staleness (orchestrator.max_staleness): does not apply to the fraction policy"},
      {{"--staleness-policy", "fraction", "--mode", "sync"},
       "--staleness-policy (orchestrator.staleness_policy): applies to mode async only (mode "
       "sync keeps every token within its staleness: strict), got STALENESS_POLICY_FRACTION"},
      {{"--staleness-fraction", "-1"}, "--staleness-fraction"},
      {{"--colocated", "--mode", "async"},
       "--colocated (orchestrator.colocated): applies to mode sync only (engines and trainer "
       "take turns on the same GPUs; mode async overlaps generation and training), got true"},
      {{"--colocated", "--mode", "one_step_off"},
       "--colocated (orchestrator.colocated): applies to mode sync only"},
      {{"--colocated", "--config", async_file},
       "--colocated (orchestrator.colocated): applies to mode sync only"},
      {{"--colocated", "--max-staleness", "2"},
       "--max-staleness (orchestrator.max_staleness): applies to mode async only (colocated "
       "selects mode sync, which has staleness 0), got 2"},
      {{"--colocated", "--partial-rollout"},
       "--partial-rollout (orchestrator.partial_rollout): applies to mode async only (colocated "
       "selects mode sync, which never interrupts"},
      {{"--colocated", "--staleness-fraction", "0.5"},
       "--staleness-fraction (orchestrator.staleness_fraction): applies to mode async with the "
       "fraction policy only (colocated selects mode sync"},
      {{"--colocated", "--staleness-policy", "admission"},
       "--staleness-policy (orchestrator.staleness_policy): applies to mode async only "
       "(colocated selects mode sync"},
      {{"--release-seconds", "2"},
       "--release-seconds (release_seconds): applies only to colocated runs"},
      {{"--resume-seconds", "2", "--mode", "async"},
       "--resume-seconds (resume_seconds): applies only to colocated runs"},
      {{"--compare", "--colocated"},
       "--colocated (orchestrator.colocated): compare gives each run its own"},
      {{"--compare", "--staleness-fraction", "1"},
       "--staleness-fraction (orchestrator.staleness_fraction): compare gives each run its own"},
      {{"--compare", "--staleness-policy", "strict"},
       "--staleness-policy (orchestrator.staleness_policy): compare gives each run its own"},
      {{"--compare", "--gpus-per-engine", "3", "--release-seconds", "1"},
       "--release-seconds (release_seconds): applies only to colocated runs (compare's "
       "colocated_sync run, which does not run: the 16 GPUs"},
      {{"--train-calls-per-sync", "3"},
       "--train-calls-per-sync (orchestrator.train_calls_per_sync): must be a divisor of "
       "prompts_per_step = 8"},
      {{"--train-calls-per-sync", "0"}, "--train-calls-per-sync"},
      {{"--engine-tokens-per-second", "40"}, "--engine-tokens-per-second: must be SINGLE,FULL"},
      {{"--engine-tokens-per-second", "40,1000"},
       "--engine-tokens-per-second (decode_speed.full_tokens_per_second): must be in"},
      {{"--train-seconds-per-step", "0"},
       "--train-seconds-per-step: must be a number in (0, 1000000000], got '0'"},
      {{"--train-seconds-per-step", "1", "--train-call-overhead-seconds", "1"},
       "--train-seconds-per-step (train_seconds_per_step): the trainer's seconds per step must "
       "be in (1,"},
      {{"--train-call-overhead-seconds", "-1"}, "--train-call-overhead-seconds"},
      {{"--gpus-per-engine", "0"}, "--gpus-per-engine"},
      {{"--gpus-per-trainer-rank", "5000"}, "--gpus-per-trainer-rank"},
  };
  for (const auto& [args, text] : cases) {
    const ProcessResult r = RunProgram(Small(args));
    EXPECT_EQ(r.status, 2) << args[0] << " " << args[1] << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr(text)) << args[0] << " " << args[1];
    EXPECT_THAT(r.out, IsEmpty()) << args[0] << " " << args[1];
  }
  // A mode's own values are statements, not ignored options.
  const ProcessResult own =
      RunProgram(Small({"--colocated", "--max-staleness", "0", "--no-partial-rollout",
                        "--staleness-policy", "strict"}));
  EXPECT_EQ(own.status, 0) << own.err;
  const ProcessResult zero =
      RunProgram(Small({"--colocated", "--staleness-fraction", "0", "--json"}));
  ASSERT_EQ(zero.status, 0) << zero.err;
  EXPECT_TRUE(ParseSimulateReply(zero.out).runs(0).config().orchestrator().colocated());
}

// --- The daemon's simulate request -----------------------------------------------------

v1::Request SimulateRequest(std::string id, bool compare = false) {
  v1::Request request;
  request.set_id(std::move(id));
  v1::SimulatorConfig* config = request.mutable_simulate()->mutable_config();
  config->set_engines(4);
  config->mutable_engine()->set_max_concurrent(16);
  config->set_trainer_ranks(4);
  config->set_steps(3);
  config->mutable_orchestrator()->set_prompts_per_step(8);
  config->mutable_orchestrator()->set_samples_per_prompt(4);
  config->mutable_lengths()->set_max_tokens(2048);
  request.mutable_simulate()->set_compare(compare);
  return request;
}

TEST(SimulateServeTest, HandleRequestIsSolveSimulate) {
  const v1::Request request = SimulateRequest("s");
  const v1::Reply reply = Solve(request);
  EXPECT_EQ(reply.id(), "s");
  ASSERT_TRUE(reply.has_simulate()) << reply.ShortDebugString();
  EXPECT_TRUE(MessageDifferencer::Equals(reply.simulate(), SolveSimulate(request.simulate())));
  ASSERT_EQ(reply.simulate().runs_size(), 1);
  EXPECT_TRUE(reply.simulate().runs(0).report().trace_json().empty());

  v1::Request traced = SimulateRequest("t");
  traced.mutable_simulate()->mutable_config()->set_trace(true);
  EXPECT_THAT(Solve(traced).simulate().runs(0).report().trace_json(), HasSubstr("traceEvents"));
}

TEST(SimulateServeTest, InvalidConfigNamesTheField) {
  v1::Request request = SimulateRequest("bad");
  request.mutable_simulate()->mutable_config()->set_engines(0);
  const v1::Reply reply = Solve(request);
  EXPECT_EQ(reply.id(), "bad");
  ASSERT_TRUE(reply.has_error());
  EXPECT_EQ(reply.error().code(), v1::ERROR_CODE_INVALID_ARGUMENT);
  EXPECT_EQ(reply.error().field(), "simulate.config.engines");

  request = SimulateRequest("bad-step");
  request.mutable_simulate()->mutable_config()->mutable_step()->set_max_tokens_per_micro_batch(0);
  EXPECT_EQ(Solve(request).error().field(), "simulate.config.step.max_tokens_per_micro_batch");

  request = SimulateRequest("bad-run", /*compare=*/true);
  request.mutable_simulate()->set_trace_run("nope");
  EXPECT_EQ(Solve(request).error().field(), "simulate.trace_run");
}

TEST(SimulateServeTest, AsyncFieldsNameTheField) {
  v1::Request request = SimulateRequest("sync-staleness");
  v1::OrchestratorOptions* o = request.mutable_simulate()->mutable_config()->mutable_orchestrator();
  o->set_mode(v1::ORCHESTRATOR_MODE_SYNC);
  o->set_max_staleness(2);
  v1::Reply reply = Solve(request);
  ASSERT_TRUE(reply.has_error()) << reply.ShortDebugString();
  EXPECT_EQ(reply.error().field(), "simulate.config.orchestrator.max_staleness");
  EXPECT_THAT(reply.error().message(), HasSubstr("applies to mode async only"));

  request = SimulateRequest("compare-mode", /*compare=*/true);
  request.mutable_simulate()->mutable_config()->mutable_orchestrator()->set_mode(
      v1::ORCHESTRATOR_MODE_ASYNC);
  reply = Solve(request);
  ASSERT_TRUE(reply.has_error()) << reply.ShortDebugString();
  EXPECT_EQ(reply.error().field(), "simulate.config.orchestrator.mode");

  request = SimulateRequest("implied");
  request.mutable_simulate()->mutable_config()->mutable_orchestrator()->set_max_staleness(2);
  reply = Solve(request);
  ASSERT_TRUE(reply.has_simulate()) << reply.ShortDebugString();
  EXPECT_EQ(reply.simulate().runs(0).config().orchestrator().mode(), v1::ORCHESTRATOR_MODE_ASYNC);
  EXPECT_EQ(reply.simulate().runs(0).config().orchestrator().max_staleness(), 2);
}

TEST(SimulateServeTest, NewFieldsNameTheField) {
  v1::Request request = SimulateRequest("sync-fraction");
  v1::OrchestratorOptions* o = request.mutable_simulate()->mutable_config()->mutable_orchestrator();
  o->set_mode(v1::ORCHESTRATOR_MODE_SYNC);
  o->set_staleness_fraction(0.5);
  v1::Reply reply = Solve(request);
  ASSERT_TRUE(reply.has_error()) << reply.ShortDebugString();
  EXPECT_EQ(reply.error().code(), v1::ERROR_CODE_INVALID_ARGUMENT);
  EXPECT_EQ(reply.error().field(), "simulate.config.orchestrator.staleness_fraction");

  request = SimulateRequest("speed");
  request.mutable_simulate()
      ->mutable_config()
      ->mutable_decode_speed()
      ->set_single_tokens_per_second(0);
  EXPECT_EQ(Solve(request).error().field(),
            "simulate.config.decode_speed.single_tokens_per_second");

  request = SimulateRequest("release");
  request.mutable_simulate()->mutable_config()->set_release_seconds(1);
  EXPECT_EQ(Solve(request).error().field(), "simulate.config.release_seconds");

  request = SimulateRequest("compare-colocated", /*compare=*/true);
  request.mutable_simulate()->mutable_config()->mutable_orchestrator()->set_colocated(true);
  EXPECT_EQ(Solve(request).error().field(), "simulate.config.orchestrator.colocated");

  request = SimulateRequest("fraction");
  request.mutable_simulate()->mutable_config()->mutable_orchestrator()->set_staleness_fraction(0.5);
  request.mutable_simulate()->mutable_config()->mutable_orchestrator()->set_train_calls_per_sync(2);
  reply = Solve(request);
  ASSERT_TRUE(reply.has_simulate()) << reply.ShortDebugString();
  const v1::OrchestratorOptions& ran = reply.simulate().runs(0).config().orchestrator();
  EXPECT_EQ(ran.staleness_policy(), v1::STALENESS_POLICY_FRACTION);
  EXPECT_EQ(ran.train_calls_per_sync(), 2);
}

TEST(SimulateServeTest, OverPipes) {
  const std::vector<v1::Request> requests = {SimulateRequest("a"), Ping("b"),
                                             SimulateRequest("c", /*compare=*/true)};
  const ProcessResult r = RunProgram({"serve", "--threads", "2"}, Framed(requests));
  EXPECT_EQ(r.status, 0) << r.err;
  const auto replies = ParseReplies(r.out);
  ASSERT_TRUE(replies);
  ExpectReplies(*replies, Expected(requests));
  ASSERT_EQ(replies->size(), 3u);
  EXPECT_EQ((*replies)[2].simulate().runs_size(), 7);  // colocated_sync and the six

  const ProcessResult json = RunProgram({"serve", "--format=json"}, JsonLines({requests[0]}));
  EXPECT_EQ(json.status, 0) << json.err;
  const auto json_replies = ParseJsonReplies(json.out);
  ASSERT_TRUE(json_replies);
  ExpectReplies(*json_replies, Expected({requests[0]}));
  EXPECT_THAT(json.out, HasSubstr("\"ideal_samples_per_second\""));
}

}  // namespace
}  // namespace rlsched::app
