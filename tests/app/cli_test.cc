// Runs the built `rlsched` program over pipes, as a user or a script would.

#include <gmock/gmock.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "lengths_reader.h"
#include "rlsched/balance/cost_model.h"
#include "rlsched/wire/balance_convert.h"
#include "subprocess.h"

namespace rlsched::app {
namespace {

using namespace ::rlsched::wire;  // NOLINT: the conversions

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::StartsWith;

// The one-line JSON reply in `out`.
template <typename Reply = v1::BalanceReply>
Reply ParseOneLineReply(const std::string& out) {
  Reply reply;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << "not one line:\n" << out;
  const auto status = google::protobuf::util::JsonStringToMessage(out, &reply);
  EXPECT_TRUE(status.ok()) << status.ToString() << "\n" << out;
  return reply;
}

void ExpectPartition(const v1::BalanceReply& reply, std::int64_t n, std::int64_t k) {
  ASSERT_EQ(reply.parts_size(), k);
  std::vector<int> seen(static_cast<std::size_t>(n), 0);
  for (const v1::Part& part : reply.parts()) {
    EXPECT_TRUE(std::is_sorted(part.indices().begin(), part.indices().end()));
    for (const std::int64_t index : part.indices()) {
      ASSERT_GE(index, 0);
      ASSERT_LT(index, n);
      ++seen[static_cast<std::size_t>(index)];
    }
  }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), n);
}

// Every index in [0, n) in exactly one micro-batch, none above `cap`, `k` ranks with
// the same count.
void ExpectStepPlan(const v1::PlanStepReply& reply, std::int64_t n, std::int64_t k,
                    std::int64_t cap) {
  ASSERT_EQ(reply.ranks_size(), k);
  std::vector<int> seen(static_cast<std::size_t>(n), 0);
  for (const v1::RankPlan& rank : reply.ranks()) {
    EXPECT_EQ(rank.micro_batches_size(), reply.micro_batches());
    for (const v1::MicroBatch& batch : rank.micro_batches()) {
      EXPECT_LE(batch.tokens(), cap);
      EXPECT_TRUE(std::is_sorted(batch.indices().begin(), batch.indices().end()));
      for (const std::int64_t index : batch.indices()) {
        ASSERT_GE(index, 0);
        ASSERT_LT(index, n);
        ++seen[static_cast<std::size_t>(index)];
      }
    }
  }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), n);
}

std::string TestData(const std::string& name) {
  return (std::filesystem::path(RLSCHED_TEST_DATA_DIR) / name).string();
}

TEST(CliTest, Version) {
  const ProcessResult r = RunProgram({"--version"});
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out, "rlsched " RLSCHED_VERSION "\n");
  EXPECT_THAT(r.err, IsEmpty());
}

TEST(CliTest, Help) {
  const ProcessResult r = RunProgram({"--help"});
  EXPECT_EQ(r.status, 0);
  EXPECT_THAT(r.out, HasSubstr("balance"));
  EXPECT_THAT(r.out, HasSubstr("plan-step"));
  const ProcessResult balance = RunProgram({"balance", "--help"});
  EXPECT_EQ(balance.status, 0);
  EXPECT_THAT(balance.out, HasSubstr("--ranks,--parts K"));
  EXPECT_THAT(balance.out, HasSubstr("Range: integer in [1, 1048576]; default: 8."));
  EXPECT_THAT(balance.out, HasSubstr("--num-attention-heads,--num-heads"));
  // Defaults in words, not CLI11's bracketed values.
  EXPECT_THAT(balance.out, Not(HasSubstr("[kk]")));
  EXPECT_THAT(balance.out, HasSubstr("Llama-3.1-8B"));
  const ProcessResult plan_step = RunProgram({"plan-step", "--help"});
  EXPECT_EQ(plan_step.status, 0);
  for (const char* option : {"--ranks",
                             "--max-token-len,--max-tokens,--max-tokens-per-micro-batch TOKENS",
                             "--min-micro-batches",
                             "--micro-batches-multiple-of,--multiple-of",
                             "--pad-to-multiple-of,--pad-to",
                             "--pipeline-model-parallel-size,--pipeline-stages,--pp",
                             "Range: integer in [1, 65536]; default: 1.",
                             "--overhead",
                             "--order",
                             "--equal-size",
                             "--keep-groups",
                             "--refine-iterations",
                             "--micro-batches",
                             "--json",
                             "--example",
                             "--seed",
                             "--cost",
                             "--hidden-size",
                             "--linear",
                             "Llama-3.1-8B"}) {
    EXPECT_THAT(plan_step.out, HasSubstr(option));
  }
}

TEST(CliTest, ExampleTable) {
  const ProcessResult r = RunProgram({"balance", "--example"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.err, IsEmpty());
  const std::vector<std::string> lines = Lines(r.out);
  ASSERT_GE(lines.size(), 3u);
  EXPECT_THAT(lines[0], HasSubstr("1024 sequences in 128 groups"));
  EXPECT_THAT(lines[0], HasSubstr("k = 8 parts"));
  EXPECT_THAT(lines[1], HasSubstr("cost model: tokens"));
  EXPECT_THAT(lines[2], HasSubstr("Karmarkar-Karp"));
  int part_rows = 0;
  for (const std::string& line : lines) {
    if (line.starts_with("   ") && line.find_first_not_of(' ') != std::string::npos &&
        std::isdigit(static_cast<unsigned char>(line[line.find_first_not_of(' ')]))) {
      ++part_rows;
    }
  }
  EXPECT_EQ(part_rows, 8) << r.out;
  EXPECT_THAT(r.out, HasSubstr("\nlower bound "));
  EXPECT_THAT(r.out, HasSubstr("\ngap "));
  EXPECT_THAT(r.out, HasSubstr("\nproven optimal "));
  EXPECT_THAT(r.out, HasSubstr("\nnaive contiguous split: max cost "));
}

TEST(CliTest, ExampleMatchesSeed) {
  const ProcessResult a = RunProgram({"balance", "--example", "--json"});
  const ProcessResult b = RunProgram({"balance", "--example", "--json", "--seed", "1"});
  const ProcessResult c = RunProgram({"balance", "--example", "--json", "--seed", "2"});
  ASSERT_EQ(a.status, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(a.out, c.out);
}

TEST(CliTest, ManyPartsAreElided) {
  const ProcessResult r = RunProgram({"balance", "--example", "--parts", "100"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("… (36 more parts)"));
}

// Small inputs list which sequence went where; the example (1,024 sequences) does not.
// A proven optimum above the bound says so.
TEST(CliTest, SmallInputsShowTheAssignment) {
  std::string input;
  for (int length = 100; length <= 1000; length += 100) input += std::to_string(length) + "\n";
  const ProcessResult r = RunProgram({"balance", "--parts", "3"}, input);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("part  items  tokens  cost  sequences\n"));
  // Every index 0..9 once across the three rows (KK: 3 6 7 | 2 5 8 | 0 1 4 9).
  EXPECT_THAT(r.out, HasSubstr("   0      3    1900  1900  3 6 7\n"));
  EXPECT_THAT(r.out, HasSubstr("   1      3    1800  1800  2 5 8\n"));
  EXPECT_THAT(r.out, HasSubstr("   2      4    1800  1800  0 1 4 9\n"));
  EXPECT_THAT(r.out, HasSubstr("proven optimal  yes: optimal; the lower bound is 3.60% below it"));
  const ProcessResult example = RunProgram({"balance", "--example"});
  ASSERT_EQ(example.status, 0) << example.err;
  EXPECT_THAT(example.out, Not(HasSubstr("sequences\n")));
}

TEST(CliTest, ExampleAttentionUsesTheDefaultShape) {
  const ProcessResult r = RunProgram({"balance", "--example", "--cost", "attention"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(Lines(r.out).at(1), HasSubstr("Llama-3.1-8B"));
}

TEST(CliTest, JsonFromStdinIsTheSolveBalanceReply) {
  const std::string input = "100\n200 300\n\n400 5000\n";
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"balance", "--json", "--parts", "2"},
        std::vector<std::string>{"balance", "-", "--json", "--parts", "2"}}) {
    const ProcessResult r = RunProgram(args, input);
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_THAT(r.err, IsEmpty());
    v1::BalanceRequest request;
    for (const std::int64_t length : ParseLengths(input).lengths) request.add_lengths(length);
    request.set_num_parts(2);
    request.mutable_cost()->set_kind(v1::COST_KIND_TOKENS);
    request.set_algorithm(v1::ALGORITHM_KARMARKAR_KARP);
    EXPECT_EQ(r.out, ToJson(SolveBalance(request)) + "\n");
    ExpectPartition(ParseOneLineReply(r.out), 5, 2);
  }
}

TEST(CliTest, OptionsReachTheRequest) {
  const std::string input = "5\n9\n1\n7\n3\n8\n2\n";
  const ProcessResult r =
      RunProgram({"balance", "--json", "--parts", "3", "--equal-size", "--algorithm", "lpt",
                  "--refine-iterations", "0", "--quadratic", "0.5", "--constant", "2"},
                 input);
  ASSERT_EQ(r.status, 0) << r.err;
  v1::BalanceRequest request;
  for (const std::int64_t length : ParseLengths(input).lengths) request.add_lengths(length);
  request.set_num_parts(3);
  request.set_equal_size(true);
  request.set_algorithm(v1::ALGORITHM_GREEDY);
  request.set_refine_iterations(0);
  request.mutable_cost()->set_kind(v1::COST_KIND_ATTENTION);
  request.mutable_cost()->mutable_coefficients()->set_linear(1.0);
  request.mutable_cost()->mutable_coefficients()->set_quadratic(0.5);
  request.mutable_cost()->mutable_coefficients()->set_constant(2.0);
  EXPECT_EQ(r.out, ToJson(SolveBalance(request)) + "\n");
}

TEST(CliTest, LogsGoToStderrOnly) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--log-level", "debug", "balance", "--json"},
        std::vector<std::string>{"balance", "--json", "--log-level", "info"}}) {
    const ProcessResult r = RunProgram(args, "1 2 3 4 5 6\n");
    ASSERT_EQ(r.status, 0) << r.err;
    ExpectPartition(ParseOneLineReply(r.out), 6, 8);
    EXPECT_THAT(r.err, HasSubstr("balanced 6 sequences"));
  }
}

TEST(CliTest, SharedGrpoRolloutsKeepGroups) {
  const std::string path = TestData("rollout_lengths_amc23_llama3b.csv");
  ASSERT_TRUE(std::filesystem::exists(path)) << path << " is missing (tests/data)";
  const ProcessResult table =
      RunProgram({"balance", path, "--parts", "8", "--keep-groups", "--equal-size"});
  ASSERT_EQ(table.status, 0) << table.err;
  EXPECT_THAT(Lines(table.out).at(0), HasSubstr("2000 sequences in 40 groups"));

  const ProcessResult r =
      RunProgram({"balance", path, "--parts", "8", "--keep-groups", "--equal-size", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  const v1::BalanceReply reply = ParseOneLineReply(r.out);
  ExpectPartition(reply, 2000, 8);
  // The file lists each group's 50 samples together: index / 50 is the group.
  for (const v1::Part& part : reply.parts()) {
    std::set<std::int64_t> groups;
    for (const std::int64_t index : part.indices()) groups.insert(index / 50);
    EXPECT_EQ(groups.size(), 5u);
    EXPECT_EQ(part.indices_size(), 250);
  }
}

TEST(CliTest, SharedReasoningLengths) {
  const std::string path = TestData("reasoning_lengths_intellect3_math.csv");
  ASSERT_TRUE(std::filesystem::exists(path)) << path << " is missing (tests/data)";
  const ProcessResult table = RunProgram({"balance", path, "--parts", "4", "--cost", "attention"});
  ASSERT_EQ(table.status, 0) << table.err;
  EXPECT_THAT(Lines(table.out).at(0), HasSubstr("42 sequences,"));
  const ProcessResult r = RunProgram({"balance", "--parts", "4", "--json", path});
  ASSERT_EQ(r.status, 0) << r.err;
  ExpectPartition(ParseOneLineReply(r.out), 42, 4);
}

TEST(CliTest, PlanStepExampleTable) {
  const ProcessResult r = RunProgram({"plan-step", "--example", "--max-tokens", "32768"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.err, IsEmpty());
  const std::vector<std::string> lines = Lines(r.out);
  ASSERT_GE(lines.size(), 4u);
  EXPECT_THAT(lines[0], HasSubstr("1024 sequences in 128 groups"));
  EXPECT_THAT(lines[0], HasSubstr("R = 8 ranks"));
  EXPECT_THAT(lines[1], HasSubstr("at most 32768 tokens each"));
  EXPECT_THAT(lines[2],
              HasSubstr("p = 1 pipeline stage, overhead " +
                        std::to_string(balance::CostModel::Tokens().micro_batch_overhead()) +
                        " per micro-batch (the default, estimated from the model shape)"));
  EXPECT_THAT(lines[3], HasSubstr("cost model: tokens"));
  EXPECT_THAT(lines.at(5), StartsWith("rank  sequences  tokens"));
  int rank_rows = 0;
  for (const std::string& line : lines) {
    if (line.starts_with("   ") && line.find_first_not_of(' ') != std::string::npos &&
        std::isdigit(static_cast<unsigned char>(line[line.find_first_not_of(' ')]))) {
      ++rank_rows;
    }
  }
  EXPECT_EQ(rank_rows, 8) << r.out;
  EXPECT_THAT(r.out, HasSubstr("\nmicro-batches   "));
  EXPECT_THAT(r.out, HasSubstr("\nstep time       "));
  EXPECT_THAT(r.out, HasSubstr("\nlower bound     "));
  EXPECT_THAT(r.out, HasSubstr("\ngap             "));
  EXPECT_THAT(r.out, HasSubstr("\nbaseline ("));
  EXPECT_THAT(r.out, HasSubstr("\ncap violations  "));
  EXPECT_THAT(r.out, HasSubstr("\nours: "));
}

TEST(CliTest, PlanStepExampleIsBalanceExample) {
  for (const char* seed : {"1", "7"}) {
    const ProcessResult step =
        RunProgram({"plan-step", "--example", "--seed", seed, "--max-tokens", "65536", "--json"});
    const ProcessResult balance = RunProgram({"balance", "--example", "--seed", seed, "--json"});
    ASSERT_EQ(step.status, 0) << step.err;
    ASSERT_EQ(balance.status, 0) << balance.err;
    const auto reply = ParseOneLineReply<v1::PlanStepReply>(step.out);
    ExpectStepPlan(reply, 1024, 8, 65536);
    std::int64_t step_tokens = 0;
    for (const v1::RankPlan& rank : reply.ranks()) step_tokens += rank.tokens();
    std::int64_t balance_tokens = 0;
    const v1::BalanceReply parts = ParseOneLineReply(balance.out);
    for (const v1::Part& part : parts.parts()) balance_tokens += part.tokens();
    EXPECT_EQ(step_tokens, balance_tokens);
  }
}

// One name per concept: the older spellings are aliases of the same options.
TEST(CliTest, AliasesAreTheSameOptions) {
  const ProcessResult canonical = RunProgram(
      {"plan-step", "--example", "--json", "--ranks", "4", "--max-token-len", "32768",
       "--pipeline-model-parallel-size", "2", "--micro-batches-multiple-of", "2",
       "--pad-to-multiple-of", "8", "--num-attention-heads", "32", "--cost", "attention"});
  ASSERT_EQ(canonical.status, 0) << canonical.err;
  const ProcessResult aliases =
      RunProgram({"plan-step", "--example", "--json", "--ranks", "4", "--max-tokens", "32768",
                  "--pipeline-stages", "2", "--multiple-of", "2", "--pad-to", "8", "--num-heads",
                  "32", "--cost", "attention"});
  const ProcessResult field_names = RunProgram(
      {"plan-step", "--example", "--json", "--ranks", "4", "--max-tokens-per-micro-batch", "32768",
       "--pp", "2", "--multiple-of", "2", "--pad-to", "8", "--cost", "attention"});
  EXPECT_EQ(aliases.out, canonical.out);
  EXPECT_EQ(field_names.out, canonical.out);

  const ProcessResult ranks = RunProgram({"balance", "--example", "--json", "--ranks", "5"});
  const ProcessResult parts = RunProgram({"balance", "--example", "--json", "--parts", "5"});
  ASSERT_EQ(ranks.status, 0) << ranks.err;
  EXPECT_EQ(parts.out, ranks.out);
  EXPECT_THAT(ranks.out, Not(HasSubstr("\"parts\":[]")));

  // An error quotes the canonical name, whichever spelling was typed.
  const ProcessResult bad = RunProgram({"plan-step", "--max-tokens", "0"}, "1\n");
  EXPECT_EQ(bad.status, 2);
  EXPECT_THAT(bad.err, StartsWith("error: --max-token-len: must be an integer >= 1, got '0'\n"));
  EXPECT_THAT(bad.err, HasSubstr("run 'rlsched plan-step --help' for usage"));
  // So does an error the planner raises after parsing.
  const ProcessResult planner = RunProgram({"plan-step", "--max-token-len", "8"}, "3\n9\n");
  EXPECT_EQ(planner.status, 2);
  EXPECT_THAT(planner.err, HasSubstr("exceeds --max-token-len = 8\nrun 'rlsched plan-step --help' "
                                     "for usage\n"));
}

TEST(CliTest, PlanStepManyRanksAreElided) {
  const ProcessResult r =
      RunProgram({"plan-step", "--example", "--ranks", "100", "--max-tokens", "32768"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("… (36 more ranks)"));
}

TEST(CliTest, PlanStepErrorsNameTheFlag) {
  // A forced micro-batch count above kMaxForcedMicroBatches, refused before planning.
  ProcessResult r = RunProgram(
      {"plan-step", "--example", "--multiple-of", "1048576", "--max-tokens", "32768", "--json"});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err,
              HasSubstr("error: --micro-batches-multiple-of (micro_batches_multiple_of): must be"));
  EXPECT_THAT(r.err, HasSubstr("8 × 1048576 = 8388608 micro-batches"));
  r = RunProgram(
      {"plan-step", "--example", "--min-micro-batches", "1000000", "--max-tokens", "32768"});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("error: --min-micro-batches (min_micro_batches): must be"));
}

TEST(CliTest, PlanStepListsMicroBatches) {
  const std::string input = "100\n200\n300\n400\n500\n600\n";
  const ProcessResult r =
      RunProgram({"plan-step", "--ranks", "2", "--max-tokens", "700", "--micro-batches"}, input);
  ASSERT_EQ(r.status, 0) << r.err;
  const std::vector<std::string> lines = Lines(r.out);
  const auto header = std::find_if(lines.begin(), lines.end(), [](const std::string& line) {
    return line.starts_with("rank  micro-batch  sequences  tokens  cost");
  });
  ASSERT_NE(header, lines.end()) << r.out;
  // 2100 tokens, at most 700 per micro-batch: 2 micro-batches per rank at least.
  int rows = 0;
  for (auto it = header + 1; it != lines.end() && !it->empty(); ++it) ++rows;
  const ProcessResult json =
      RunProgram({"plan-step", "--ranks", "2", "--max-tokens", "700", "--json"}, input);
  ASSERT_EQ(json.status, 0) << json.err;
  const auto reply = ParseOneLineReply<v1::PlanStepReply>(json.out);
  ExpectStepPlan(reply, 6, 2, 700);
  EXPECT_GE(reply.micro_batches(), 2);
  EXPECT_EQ(rows, 2 * reply.micro_batches()) << r.out;
}

TEST(CliTest, PlanStepJsonFromStdinIsTheSolvePlanStepReply) {
  const std::string input = "100\n200 300\n\n400 5000\n";
  const ProcessResult r = RunProgram(
      {"plan-step",           "--json", "--ranks",       "2",    "--max-tokens", "6000",
       "--min-micro-batches", "3",      "--multiple-of", "2",    "--pad-to",     "8",
       "--pipeline-stages",   "2",      "--overhead",    "10",   "--order",      "heaviest-first",
       "--refine-iterations", "5",      "--quadratic",   "0.001"},
      input);
  ASSERT_EQ(r.status, 0) << r.err;
  // 5 sequences cannot fill 2 ranks × 4 micro-batches: the plan says so, and a warning.
  EXPECT_THAT(r.err, HasSubstr("[warning] the plan has 3 empty micro-batches and 0 empty ranks"));
  v1::PlanStepRequest request;
  for (const std::int64_t length : ParseLengths(input).lengths) request.add_lengths(length);
  request.set_num_ranks(2);
  request.set_max_tokens_per_micro_batch(6000);
  request.set_count_tolerance(0.01);
  request.set_min_micro_batches(3);
  request.set_micro_batches_multiple_of(2);
  request.set_pad_to_multiple_of(8);
  request.set_pipeline_stages(2);
  request.set_overhead(10);
  request.set_order(v1::MICRO_BATCH_ORDER_HEAVIEST_FIRST);
  request.set_refine_iterations(5);
  request.mutable_cost()->set_kind(v1::COST_KIND_ATTENTION);
  request.mutable_cost()->mutable_coefficients()->set_linear(1.0);
  request.mutable_cost()->mutable_coefficients()->set_quadratic(0.001);
  EXPECT_EQ(r.out, ToJson(SolvePlanStep(request)) + "\n");
  const auto reply = ParseOneLineReply<v1::PlanStepReply>(r.out);
  ExpectStepPlan(reply, 5, 2, 6000);
  EXPECT_EQ(reply.micro_batches(), 4);

  // The defaults: 8 ranks, pipeline order, tokens.
  const ProcessResult defaults = RunProgram({"plan-step", "--max-tokens", "6000", "--json"}, input);
  ASSERT_EQ(defaults.status, 0) << defaults.err;
  v1::PlanStepRequest plain;
  for (const std::int64_t length : ParseLengths(input).lengths) plain.add_lengths(length);
  plain.set_num_ranks(8);
  plain.set_max_tokens_per_micro_batch(6000);
  plain.set_min_micro_batches(1);
  plain.set_micro_batches_multiple_of(1);
  plain.set_pad_to_multiple_of(1);
  plain.set_pipeline_stages(1);
  plain.set_order(v1::MICRO_BATCH_ORDER_PIPELINE);
  plain.mutable_cost()->set_kind(v1::COST_KIND_TOKENS);
  EXPECT_EQ(defaults.out, ToJson(SolvePlanStep(plain)) + "\n");
}

// 8 sequences of 7 tokens under a cap of 8: the usual pipeline makes 7 micro-batches,
// one of 14 tokens; ours keeps the cap with 8.
TEST(CliTest, PlanStepKnownBaselineFailure) {
  const std::string input = "7 7 7 7 7 7 7 7\n";
  const ProcessResult json =
      RunProgram({"plan-step", "--ranks", "1", "--max-tokens", "8", "--json"}, input);
  ASSERT_EQ(json.status, 0) << json.err;
  const auto reply = ParseOneLineReply<v1::PlanStepReply>(json.out);
  ExpectStepPlan(reply, 8, 1, 8);
  EXPECT_EQ(reply.micro_batches(), 8);
  EXPECT_EQ(reply.baseline().micro_batches(), 7);
  EXPECT_EQ(reply.baseline().cap_violations(), 1);

  const ProcessResult table = RunProgram({"plan-step", "--ranks", "1", "--max-tokens", "8"}, input);
  ASSERT_EQ(table.status, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr("\nmicro-batches   8 per rank\n"));
  EXPECT_THAT(table.out, HasSubstr("\nmicro-batches   7 per rank\n"));
  EXPECT_THAT(table.out,
              HasSubstr("cap violations  1 micro-batch over the cap — a possible out-of-memory"));
}

TEST(CliTest, PlanStepSharedGrpoRolloutsKeepGroups) {
  const std::string path = TestData("rollout_lengths_amc23_llama3b.csv");
  ASSERT_TRUE(std::filesystem::exists(path)) << path << " is missing (tests/data)";
  const std::vector<std::string> args = {
      "plan-step",    path,   "--ranks",           "8", "--keep-groups", "--equal-size",
      "--max-tokens", "8192", "--pipeline-stages", "2", "--overhead",    "500"};
  const ProcessResult table = RunProgram(args);
  ASSERT_EQ(table.status, 0) << table.err;
  EXPECT_THAT(Lines(table.out).at(0), HasSubstr("2000 sequences in 40 groups"));
  EXPECT_THAT(Lines(table.out).at(0), HasSubstr("groups kept together"));

  std::vector<std::string> json_args = args;
  json_args.push_back("--json");
  const ProcessResult r = RunProgram(json_args);
  ASSERT_EQ(r.status, 0) << r.err;
  const auto reply = ParseOneLineReply<v1::PlanStepReply>(r.out);
  ExpectStepPlan(reply, 2000, 8, 8192);
  // The file lists each group's 50 samples together: index / 50 is the group.
  for (const v1::RankPlan& rank : reply.ranks()) {
    std::set<std::int64_t> groups;
    std::int64_t sequences = 0;
    for (const v1::MicroBatch& batch : rank.micro_batches()) {
      for (const std::int64_t index : batch.indices()) groups.insert(index / 50);
      sequences += batch.indices_size();
    }
    EXPECT_EQ(groups.size(), 5u);
    EXPECT_EQ(sequences, 250);
  }
}

struct BadCase {
  std::vector<std::string> args;
  std::string input;
  std::string message;  // in stderr
};

TEST(CliTest, BadInputExitsWithStatusTwo) {
  const std::vector<BadCase> cases = {
      {{"balance"}, "1\n2\nabc\n", "stdin: line 3: 'abc' is not an integer"},
      {{"balance"}, "", "stdin: no lengths"},
      {{"balance", "--json"}, "5\n-3\n", "line 2: length -3 must be in [0, 2147483648]"},
      {{"balance"}, "1\n99999999999\n", "must be in [0, 2147483648]"},
      {{"balance"}, "group,prompt_tokens\n1,2\n", "the header has no length column"},
      {{"balance"}, "length,group\n1\n", "line 2: expected 2 fields"},
      {{"balance", "--parts", "0"}, "1\n", "--ranks: must be an integer in [1, 1048576], got '0'"},
      {{"balance", "--parts", "x"}, "1\n", "--ranks: must be an integer in [1, 1048576], got 'x'"},
      {{"balance", "/nonexistent/lengths.txt"}, "", "/nonexistent/lengths.txt: cannot open"},
      {{"balance", "/"}, "", "/: is a directory"},
      {{"balance", "--frobnicate"}, "1\n", "frobnicate"},
      {{}, "", "a command is required: balance, plan-step"},
      {{"frobnicate"}, "", "frobnicate"},
      {{"--log-level", "loud", "balance"}, "1\n", "--log-level"},
      {{"balance", "--cost", "flops"}, "1\n", "--cost"},
      {{"balance", "--algorithm", "magic"}, "1\n", "--algorithm"},
      {{"balance", "--cost", "tokens", "--hidden-size", "4096"}, "1\n", "--cost"},
      {{"balance", "--hidden-size", "4096", "--linear", "2"},
       "1\n",
       "--linear, --quadratic, --constant: cannot be combined with model shape options"},
      {{"balance", "--quadratic", "-1"}, "1\n", "--quadratic: must be a number >= 0"},
      {{"balance", "--num-heads", "3"},
       "1\n",
       "--num-attention-heads: must divide the hidden size (4096)"},
      {{"balance", "--num-heads", "16", "--num-kv-heads", "3"}, "1\n", "--num-kv-heads"},
      {{"balance", "--num-layers", "0"}, "1\n", "--num-layers: must be an integer >= 1, got '0'"},
      {{"balance", "--linear", "0"}, "1\n", "cost.coefficients: linear + quadratic must be > 0"},
      {{"balance", "--keep-groups"}, "1\n2\n", "--keep-groups: the input has no group column"},
      {{"balance", "--parts", "2", "--constant", "4611686018427387904"}, "1\n", "error: "},
      {{"balance", "--refine-iterations", "-1"}, "1\n", "--refine-iterations"},
      {{"balance", "--seed", "3"}, "1\n", "--seed"},
      {{"balance", "--example", "--seed", "-1"},
       "",
       "--seed: must be an integer in [0, 18446744073709551615]"},
      {{"balance", "--parts", "3", "--parts", "4"}, "1\n", "--ranks: At Most 1 required"},
      {{"balance", "--ranks", "3", "--parts", "4"}, "1\n", "--ranks: At Most 1 required"},
      {{"balance", "-", "extra"}, "1\n", "extra"},
      {{"balance", "--example", "file.txt"}, "", "excludes"},
      {{"plan-step"}, "1\n", "--max-token-len is required"},
      {{"plan-step", "--max-tokens", "0"},
       "1\n",
       "--max-token-len: must be an integer >= 1, got '0'"},
      {{"plan-step", "--max-tokens", "8"},
       "3\n9\n",
       "lengths[1]: sequence of 9 tokens (padded) "
       "exceeds --max-token-len = 8"},
      {{"plan-step", "--max-tokens", "6", "--pad-to", "4"},
       "5\n",
       "lengths[0]: sequence of 8 tokens (padded) exceeds --max-token-len = 6"},
      {{"plan-step", "--max-tokens", "8"}, "", "stdin: no lengths"},
      {{"plan-step", "--max-tokens", "8"}, "1\nx\n", "stdin: line 2: 'x' is not an integer"},
      {{"plan-step", "--max-tokens", "8", "/nonexistent/lengths.txt"},
       "",
       "/nonexistent/lengths.txt: cannot open"},
      {{"plan-step", "--max-tokens", "8", "--ranks", "0"},
       "1\n",
       "--ranks: must be an integer in [1, 1048576], got '0'"},
      {{"plan-step", "--max-tokens", "8", "--min-micro-batches", "0"},
       "1\n",
       "--min-micro-batches"},
      {{"plan-step", "--max-tokens", "8", "--multiple-of", "1048577"},
       "1\n",
       "--micro-batches-multiple-of: must be an integer in [1, 1048576], got '1048577'"},
      {{"plan-step", "--max-tokens", "8", "--pad-to", "-8"}, "1\n", "--pad-to"},
      {{"plan-step", "--max-tokens", "8", "--pipeline-stages", "0"},
       "1\n",
       "--pipeline-model-parallel-size: must be an integer in [1, 65536], got '0'"},
      {{"plan-step", "--max-tokens", "8", "--pp", "65537"},
       "1\n",
       "--pipeline-model-parallel-size: must be an integer in [1, 65536], got '65537'"},
      {{"plan-step", "--max-tokens", "8", "--overhead", "-1"},
       "1\n",
       "--overhead: must be an integer >= 0, got '-1'"},
      {{"plan-step", "--max-tokens", "8", "--overhead", "9223372036854775807"},
       "1\n2\n",
       "overflows int64"},
      {{"plan-step", "--max-tokens", "8", "--order", "lightest-first"}, "1\n", "--order"},
      {{"plan-step", "--max-tokens", "8", "--keep-groups"},
       "1\n2\n",
       "--keep-groups: the input has no group column"},
      {{"plan-step", "--max-tokens", "8", "--cost", "tokens", "--num-layers", "2"},
       "1\n",
       "--cost"},
      {{"plan-step", "--max-tokens", "8", "--linear", "0"},
       "1\n",
       "cost.coefficients: linear + quadratic must be > 0"},
      {{"plan-step", "--max-tokens", "8", "--seed", "3"}, "1\n", "--seed"},
      {{"plan-step", "--max-tokens", "8", "--example", "file.txt"}, "", "excludes"},
      {{"plan-step", "--max-tokens", "8", "--parts", "2"}, "1\n", "--parts"},
  };
  int hints = 0;
  for (const BadCase& c : cases) {
    std::string command;
    for (const std::string& arg : c.args) command += " " + arg;
    SCOPED_TRACE("rlsched" + command);
    const ProcessResult r = RunProgram(c.args, c.input);
    EXPECT_EQ(r.status, 2) << r.err;
    EXPECT_THAT(r.out, IsEmpty());
    EXPECT_THAT(r.err, StartsWith("error: "));
    EXPECT_THAT(r.err, HasSubstr(c.message));
    // A command line that does not parse: the hint names the subcommand's own --help
    // when there is one.
    if (r.err.find("for usage") != std::string::npos) {
      std::string named;
      for (const std::string& arg : c.args) {
        if (arg == "balance" || arg == "plan-step") {
          named = arg + " ";
          break;
        }
      }
      EXPECT_THAT(r.err, HasSubstr("run 'rlsched " + named + "--help' for usage"));
      ++hints;
    }
  }
  EXPECT_GE(hints, 10);
}

}  // namespace
}  // namespace rlsched::app
