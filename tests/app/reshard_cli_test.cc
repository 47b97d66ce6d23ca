// `rlsched reshard` run over pipes, and reshard requests to `rlsched serve`.

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "reshard_command.h"
#include "rlsched/wire/json.h"
#include "rlsched/wire/reshard_convert.h"
#include "serve.h"
#include "serve_test_util.h"
#include "subprocess.h"

namespace rlsched::app {
namespace {

using namespace ::rlsched::wire;  // NOLINT: the conversions

using ::google::protobuf::util::MessageDifferencer;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::StartsWith;
using namespace ::rlsched::wire::testing;  // NOLINT: the test helpers

// A small Qwen3-MoE (8 experts, one dense layer).
constexpr char kTinyMoeConfig[] = R"({"model_type": "qwen3_moe", "hidden_size": 32,
  "intermediate_size": 48, "moe_intermediate_size": 16, "num_hidden_layers": 4,
  "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 4, "num_experts": 8,
  "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": [1],
  "vocab_size": 300})";

std::string SharedConfig(const std::string& name) {
  return (std::filesystem::path(RLSCHED_TEST_CONFIG_DIR) / name).string();
}

// A temporary directory, removed at the end of the test.

v1::ReshardPlan ParsePlan(const std::string& json) {
  v1::ReshardPlan plan;
  const auto status = google::protobuf::util::JsonStringToMessage(json, &plan);
  EXPECT_TRUE(status.ok()) << status.ToString() << "\n" << json.substr(0, 1000);
  return plan;
}

// The request the command builds for `args`, with the model file's text.
v1::ReshardRequest RequestFor(const std::vector<std::string>& args_list, const std::string& text) {
  CLI::App app;
  ReshardArgs args;
  AddReshardCommand(app, args);
  std::vector<std::string> argv = {"reshard"};
  argv.insert(argv.end(), args_list.begin(), args_list.end());
  std::reverse(argv.begin(), argv.end());  // CLI11 takes them last first
  app.parse(argv);
  return MakeReshardRequest(args, text);
}

TEST(ReshardCliTest, Help) {
  const ProcessResult r = RunProgram({"reshard", "--help"});
  EXPECT_EQ(r.status, 0);
  for (const char* option :
       {"--model", "--train", "--infer", "--round-robin-experts", "--colocated", "--gpus-per-node",
        "--intra-node-gb-per-s", "--inter-node-gb-per-s", "--bucket-mib,--bucket-mb",
        "--target-dtype", "bf16|fp8_block128", "in MiB (2^20 bytes", "in GB/s (10^9 bytes",
        "--plan-out", "--verify", "--json", "vpp", "replicas"}) {
    EXPECT_THAT(r.out, HasSubstr(option));
  }
  EXPECT_THAT(RunProgram({"--help"}).out, HasSubstr("reshard"));
}

TEST(ReshardCliTest, SummaryOfLlama70B) {
  const std::string config = SharedConfig("llama-3.1-70b.json");
  const std::vector<std::string> options = {
      "--model", config, "--train", "tp=8,pp=2,dp=4", "--infer", "tp=4,replicas=16", "--colocated"};
  std::vector<std::string> args = {"reshard"};
  args.insert(args.end(), options.begin(), options.end());
  const ProcessResult r = RunProgram(args);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.err, IsEmpty());
  EXPECT_THAT(r.out, HasSubstr("(llama): 70.55 B parameters, 141.11 GB"));
  EXPECT_THAT(r.out, HasSubstr("80 layers"));
  EXPECT_THAT(r.out, HasSubstr("\ntrainer        64 GPUs: tp 8, pp 2, dp 4\n"));
  EXPECT_THAT(r.out, HasSubstr("\nengines        64 GPUs: 16 replicas × tp 4, on the trainer's "
                               "GPUs (colocated)\n"));
  for (const char* label : {"\nreceived       ", "\nlocal copies   ", "\nmoved          ",
                            "\ntransfers      ", "\nbuckets        ", "\nbusiest link   GPU ",
                            "\nestimate       ", "\nlower bound    ", "\nnaive          "}) {
    EXPECT_THAT(r.out, HasSubstr(label));
  }
  EXPECT_THAT(r.out, HasSubstr("(estimate / lower bound = "));
  EXPECT_THAT(r.out, HasSubstr("naive / estimate = "));

  // --json prints the summary plan: the daemon's answer to the same request.
  std::ifstream file(config);
  std::stringstream text;
  text << file.rdbuf();
  const v1::ReshardPlan expected = SolveReshard(RequestFor(options, text.str()));
  args.push_back("--json");
  const ProcessResult json = RunProgram(args);
  ASSERT_EQ(json.status, 0) << json.err;
  EXPECT_EQ(std::count(json.out.begin(), json.out.end(), '\n'), 1);
  const v1::ReshardPlan plan = ParsePlan(json.out);
  EXPECT_TRUE(MessageDifferencer::Equals(plan, expected)) << plan.ShortDebugString();
  EXPECT_EQ(plan.transfers_size(), 0);
  EXPECT_GT(plan.num_transfers(), 0);
  EXPECT_EQ(plan.trainer_ranks(), 64);
  EXPECT_EQ(plan.engine_ranks(), 64);
  EXPECT_GT(plan.bytes_local(), 0);
  EXPECT_THAT(r.out, HasSubstr(fmt::format("\ntransfers      {}\n", plan.num_transfers())));
  EXPECT_THAT(r.out, HasSubstr(fmt::format("\nbuckets        {}\n", plan.num_buckets())));
}

TEST(ReshardCliTest, PlanOutWritesTheTransfers) {
  const TempDir dir;
  const std::string config = dir.Write("config.json", kTinyLlamaConfig);
  const std::string out = dir / "plan.json";
  const std::vector<std::string> options = {"--model",        config,    "--train",
                                            "tp=2,pp=2,dp=2", "--infer", "tp=4,replicas=2",
                                            "--bucket-mb",    "1"};
  std::vector<std::string> args = {"reshard", "--plan-out", out, "--json"};
  args.insert(args.end(), options.begin(), options.end());
  const ProcessResult r = RunProgram(args);
  ASSERT_EQ(r.status, 0) << r.err;
  const v1::ReshardPlan summary = ParsePlan(r.out);
  EXPECT_EQ(summary.transfers_size(), 0);

  const std::string written = ReadFile(out);
  ASSERT_FALSE(written.empty());
  EXPECT_EQ(written.back(), '\n');
  const v1::ReshardPlan plan = ParsePlan(written);
  EXPECT_EQ(plan.transfers_size(), plan.num_transfers());
  EXPECT_GT(plan.transfers_size(), 0);
  v1::ReshardRequest request = RequestFor(options, kTinyLlamaConfig);
  request.set_include_transfers(true);
  EXPECT_TRUE(MessageDifferencer::Equals(plan, SolveReshard(request)));
  v1::ReshardPlan stripped = plan;
  stripped.clear_transfers();
  EXPECT_TRUE(MessageDifferencer::Equals(stripped, summary));
  // Byte for byte the printer's text of the whole message.
  EXPECT_EQ(written, ToJson(SolveReshard(request)) + "\n");
  // Proto field names, enums by name.
  EXPECT_THAT(written, HasSubstr("\"src_param\":\""));
  EXPECT_THAT(written, HasSubstr("\"dst_slice\":[{\"begin\":"));
  EXPECT_THAT(written, HasSubstr("\"kind\":\"LINK_KIND_"));
}

// --plan-out FILE.binpb: the binary plan file; each GPU reads its own transfers.
TEST(ReshardCliTest, PlanOutBinpbWritesEachGpusPart) {
  const TempDir dir;
  const std::string config = dir.Write("config.json", kTinyMoeConfig);
  const std::string out = dir / "plan.binpb";
  const std::vector<std::string> options = {"--model",
                                            config,
                                            "--train",
                                            "tp=2,pp=2,ep=2,dp=2",
                                            "--infer",
                                            "tp=2,replicas=3",
                                            "--colocated",
                                            "--gpus-per-node",
                                            "4",
                                            "--bucket-mb",
                                            "1"};
  std::vector<std::string> args = {"reshard", "--plan-out", out, "--json"};
  args.insert(args.end(), options.begin(), options.end());
  const ProcessResult r = RunProgram(args);
  ASSERT_EQ(r.status, 0) << r.err;
  const v1::ReshardPlan summary = ParsePlan(r.out);

  std::ifstream file(out, std::ios::binary);
  ASSERT_TRUE(file);
  const v1::ReshardPlanIndex index = ReadReshardPlanIndex(file);
  EXPECT_TRUE(MessageDifferencer::Equals(index.summary(), summary));
  v1::ReshardRequest request = RequestFor(options, kTinyMoeConfig);
  request.set_include_transfers(true);
  const v1::ReshardPlan plan = SolveReshard(request);
  ASSERT_GT(plan.transfers_size(), 0);
  int with_transfers = 0;
  for (std::int64_t rank = 0; rank < plan.trainer_ranks(); ++rank) {
    SCOPED_TRACE(rank);
    const std::vector<v1::Transfer> got = RankPartTransfers(ReadReshardRankPart(file, index, rank));
    std::vector<v1::Transfer> want;
    for (const v1::Transfer& t : plan.transfers()) {
      if (t.src_rank() == rank ||
          std::find(t.dst_ranks().begin(), t.dst_ranks().end(), rank) != t.dst_ranks().end()) {
        want.push_back(t);
      }
    }
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(MessageDifferencer::Equals(got[i], want[i])) << got[i].ShortDebugString();
    }
    with_transfers += got.empty() ? 0 : 1;
  }
  EXPECT_GT(with_transfers, 1);
  // Not JSON: the first bytes are the index's size varint.
  EXPECT_NE(ReadFile(out).front(), '{');
}

TEST(ReshardCliTest, VerifyPassesOnTinyModels) {
  const TempDir dir;
  const std::string llama = dir.Write("llama.json", kTinyLlamaConfig);
  const std::string moe = dir.Write("moe.json", kTinyMoeConfig);
  std::vector<std::vector<std::string>> cases = {
      {"--model", llama, "--train", "tp=2,pp=2,dp=2", "--infer", "tp=4,replicas=2"},
      {"--model", llama, "--train", "tp=4,pp=2", "--infer", "tp=8,replicas=1", "--colocated",
       "--gpus-per-node", "4"},
      {"--model", moe, "--train", "tp=2,pp=2,ep=4,cp=2", "--infer", "tp=4,replicas=2,ep",
       "--round-robin-experts", "--bucket-mb", "1"},
  };
  const std::string wide =
      dir.Write("wide.json",
                R"({"model_type": "qwen3_moe", "hidden_size": 256, "intermediate_size": 512,
          "moe_intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 8,
          "num_key_value_heads": 4, "head_dim": 32, "num_experts": 8, "vocab_size": 300})");
  cases.push_back({"--model", wide, "--train", "tp=2,ep=2,dp=2", "--infer", "tp=2,replicas=2",
                   "--target-dtype", "fp8"});
  for (const auto& options : cases) {
    std::vector<std::string> args = {"reshard", "--verify"};
    args.insert(args.end(), options.begin(), options.end());
    SCOPED_TRACE(::testing::PrintToString(args));
    const ProcessResult r = RunProgram(args);
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_THAT(r.err, IsEmpty());
    EXPECT_THAT(r.out, HasSubstr("\nverify: ok ("));
  }
  // With --json the result goes to stderr; stdout stays one line of JSON.
  const ProcessResult json = RunProgram(
      {"reshard", "--verify", "--json", "--model", llama, "--train", "dp=2", "--infer", "tp=2"});
  ASSERT_EQ(json.status, 0) << json.err;
  EXPECT_EQ(std::count(json.out.begin(), json.out.end(), '\n'), 1);
  EXPECT_THAT(json.err, StartsWith("verify: ok ("));
}

// Megatron-core's uneven pipeline split, asked for with first-stage-layers /
// last-stage-layers: in the request, in the summary, and verified byte for byte.
TEST(ReshardCliTest, FirstAndLastStageLayers) {
  const TempDir dir;
  const std::string llama = dir.Write("llama.json", kTinyLlamaConfig);  // 4 layers
  const std::vector<std::string> even = {"--model",   llama,     "--train",
                                         "tp=2,pp=2", "--infer", "tp=2"};
  EXPECT_FALSE(RequestFor(even, kTinyLlamaConfig).train().has_first_stage_layers());
  EXPECT_FALSE(RequestFor(even, kTinyLlamaConfig).train().has_last_stage_layers());
  const std::vector<std::string> options = {
      "--model", llama,
      "--train", "tp=2,pp=3,first-stage-layers=1,last-stage-layers=1",
      "--infer", "tp=2,replicas=2"};
  const v1::ReshardRequest request = RequestFor(options, kTinyLlamaConfig);
  ASSERT_TRUE(request.train().has_first_stage_layers());
  EXPECT_EQ(request.train().first_stage_layers(), 1);
  ASSERT_TRUE(request.train().has_last_stage_layers());
  EXPECT_EQ(request.train().last_stage_layers(), 1);
  EXPECT_EQ(request.train().pp(), 3);
  const v1::TrainLayout last_only = ParseTrainOption("pp=3,last-stage-layers=2");
  EXPECT_FALSE(last_only.has_first_stage_layers());
  EXPECT_EQ(last_only.last_stage_layers(), 2);

  std::vector<std::string> args = {"reshard", "--verify"};
  args.insert(args.end(), options.begin(), options.end());
  const ProcessResult r = RunProgram(args);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.err, IsEmpty());
  EXPECT_THAT(r.out, HasSubstr("\ntrainer        6 GPUs: tp 2, pp 3, first stage 1 layer, last "
                               "stage 1 layer\n"));
  EXPECT_THAT(r.out, HasSubstr("\nverify: ok ("));

  // With virtual stages: 8 layers, pp 3, vpp 2, 2 | 4 | 2.
  const std::string eight =
      dir.Write("eight.json", R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 96,
        "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 4,
        "vocab_size": 1000, "tie_word_embeddings": false})");
  const ProcessResult virt =
      RunProgram({"reshard", "--verify", "--json", "--model", eight, "--train",
                  "pp=3,vpp=2,first-stage-layers=2,last-stage-layers=2", "--infer", "tp=4"});
  ASSERT_EQ(virt.status, 0) << virt.err;
  EXPECT_THAT(virt.err, StartsWith("verify: ok ("));
  EXPECT_EQ(ParsePlan(virt.out).trainer_ranks(), 3);
  // Without them the same stages are refused.
  const ProcessResult refused =
      RunProgram({"reshard", "--model", eight, "--train", "pp=3,vpp=2", "--infer", "tp=4"});
  EXPECT_EQ(refused.status, 2);
  EXPECT_THAT(refused.out, IsEmpty());
  EXPECT_EQ(
      refused.err,
      "error: --train (train.pp): num_hidden_layers (8) must be divisible by pp·vpp (6), or set "
      "first_stage_layers / last_stage_layers for an uneven split\nrun 'rlsched reshard --help' "
      "for usage\n");
}

TEST(ReshardCliTest, VerifyRefusesALargeModel) {
  const ProcessResult r =
      RunProgram({"reshard", "--verify", "--model", SharedConfig("llama-3.1-70b.json"), "--train",
                  "tp=8,pp=2,dp=4", "--infer", "tp=4,replicas=16"});
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_THAT(r.out, IsEmpty());
  EXPECT_THAT(r.err, StartsWith("error: --verify: the model has 70553706496 parameters"));
}

struct BadReshardCase {
  std::vector<std::string> args;  // after "reshard"
  std::string message;            // in stderr
};

// A Hugging Face model folder: its config.json.
TEST(ReshardCliTest, ModelFolderReadsItsConfig) {
  const TempDir dir;
  dir.Write("config.json", kTinyLlamaConfig);
  const std::string file = dir.Write("llama.json", kTinyLlamaConfig);
  const std::vector<std::string> rest = {"--train", "tp=2,pp=2", "--infer", "tp=4", "--json"};
  std::vector<std::string> from_folder = {"reshard", "--model", dir / ""};
  std::vector<std::string> from_file = {"reshard", "--model", file};
  from_folder.insert(from_folder.end(), rest.begin(), rest.end());
  from_file.insert(from_file.end(), rest.begin(), rest.end());
  const ProcessResult a = RunProgram(from_folder);
  const ProcessResult b = RunProgram(from_file);
  ASSERT_EQ(a.status, 0) << a.err;
  ASSERT_EQ(b.status, 0) << b.err;
  EXPECT_EQ(a.out, b.out);
}

TEST(ReshardCliTest, BadOptionsExitTwoNamingTheOption) {
  const TempDir dir;
  const std::string llama = dir.Write("llama.json", kTinyLlamaConfig);
  const std::string garbage = dir.Write("garbage.json", "{\"model_type\": ");
  const std::string big = dir.Write("big.json", std::string((1 << 20) + 1, ' '));
  // Issue 19: inputs that used to run out of memory or time, refused at once.
  const std::string tiny_million =
      dir.Write("tiny-million.json",
                R"({"model_type": "llama", "hidden_size": 8, "intermediate_size": 16,
        "num_hidden_layers": 1000000, "num_attention_heads": 2, "num_key_value_heads": 1,
        "vocab_size": 64})");
  const std::string tiny_100k =
      dir.Write("tiny-100k.json",
                R"({"model_type": "llama", "hidden_size": 8, "intermediate_size": 16,
        "num_hidden_layers": 10000, "num_attention_heads": 2, "num_key_value_heads": 1,
        "vocab_size": 64})");
  std::string deepseek_text;
  {
    std::ifstream in(SharedConfig("deepseek-v3.json"));
    std::stringstream s;
    s << in.rdbuf();
    deepseek_text = s.str();
    for (const auto& [key, value] : {std::pair<std::string, std::string>{"num_hidden_layers", "61"},
                                     {"moe_layer_freq", "1"}}) {
      const std::string from = "\"" + key + "\": " + value;
      const std::size_t at = deepseek_text.find(from);
      ASSERT_NE(at, std::string::npos) << from;
      deepseek_text.replace(at, from.size(),
                            "\"" + key + "\": " + (value == "61" ? "2147483647" : "2"));
    }
  }
  const std::string deepseek_huge = dir.Write("deepseek-huge.json", deepseek_text);
  const std::vector<std::string> base = {"--model", llama, "--train", "tp=2", "--infer", "tp=2"};
  auto with = [&](std::vector<std::string> changes) {
    // `changes` replaces the option of the same name in `base`, or is appended.
    std::vector<std::string> args = base;
    for (std::size_t i = 0; i < changes.size(); ++i) {
      const auto it = std::find(args.begin(), args.end(), changes[i]);
      if (it != args.end() && i + 1 < changes.size() && changes[i].starts_with("--") &&
          !changes[i + 1].starts_with("--")) {
        *(it + 1) = changes[i + 1];
        ++i;
      } else {
        args.push_back(changes[i]);
      }
    }
    return args;
  };
  const std::vector<BadReshardCase> cases = {
      {with({"--train", "tp=2,foo=1"}),
       "--train: unknown key 'foo' (keys: tp, pp, vpp, ep, etp, cp, dp, first-stage-layers, "
       "last-stage-layers)"},
      {with({"--train", "pp=2,first-stage-layers=0"}),
       "--train: first-stage-layers must be an integer in [1, 2147483647], got '0'"},
      {with({"--train", "pp=2,last-stage-layers=x"}),
       "--train: last-stage-layers must be an integer in [1, 2147483647], got 'x'"},
      {with({"--train", "pp=2,last-stage-layers"}), "--train: last-stage-layers needs a value"},
      {with({"--train", "first-stage-layers=1,first-stage-layers=2"}),
       "--train: duplicate key 'first-stage-layers'"},
      {with({"--train", "first-stage-layers=1,first_stage_layers=2"}),
       "--train: duplicate key 'first-stage-layers'"},
      {with({"--train", "tp=x"}), "--train: tp must be an integer in [1, 65536], got 'x'"},
      {with({"--train", "tp=2,dp=0"}), "--train: dp must be an integer in [1, 65536], got '0'"},
      // Just above the bounds the help states.
      {with({"--train", "dp=65537"}), "--train: dp must be an integer in [1, 65536], got '65537'"},
      {with({"--train", "pp=2,last_stage_layers=2147483648"}),
       "--train: last-stage-layers must be an integer in [1, 2147483647], got '2147483648'"},
      {with({"--infer", "replicas=1048577"}),
       "--infer: replicas must be an integer in [1, 1048576], got '1048577'"},
      {with({"--train", "tp=2,tp=4"}), "--train: duplicate key 'tp'"},
      {with({"--train", "tp"}), "--train: tp needs a value"},
      {with({"--train", "tp=2,,dp=2"}), "--train: empty entry"},
      {with({"--train", "=2"}), "--train: entry '=2' has no key"},
      {with({"--infer", "tp=2,replicas=0"}), "--infer: replicas must be an integer in [1, "},
      {with({"--infer", "tp=2,pp=2"}), "--infer: unknown key 'pp' (keys: tp, replicas, ep)"},
      {with({"--infer", "tp=2,ep=2"}), "--infer: ep takes no value"},
      {with({"--infer", "tp=2,ep,ep"}), "--infer: duplicate key 'ep'"},
      {with({"--round-robin-experts"}), "--round-robin-experts: needs ep in --infer"},
      {with({"--gpus-per-node", "0"}), "--gpus-per-node"},
      {with({"--bucket-mb", "0"}), "--bucket-mib: must be an integer in [1, 1048576], got '0'"},
      {with({"--bucket-mib", "1048577"}), "--bucket-mib: must be an integer in [1, 1048576]"},
      {with({"--target-dtype", "fp4"}), "--target-dtype"},
      {with({"--intra-node-gb-per-s", "-1"}), "--intra-node-gb-per-s"},
      {with({"--intra-node-gb-per-s", "0"}),
       "--intra-node-gb-per-s: must be a number in (0, 1000000], got '0'"},
      {with({"--inter-node-gb-per-s", "nan"}), "--inter-node-gb-per-s"},
      {with({"--model", dir / "missing.json"}), "--model: " + (dir / "missing.json")},
      {with({"--model", garbage}), "--model " + garbage + ": config: not valid JSON"},
      {with({"--model", big}), "--model: " + big + ": larger than 1048576 bytes"},
      {with({"--model", dir / ""}), "a folder without config.json"},
      {{"--train", "tp=2", "--infer", "tp=2"}, "--model"},
      {{"--model", llama, "--infer", "tp=2"}, "--train"},
      {{"--model", llama, "--train", "tp=2"}, "--infer"},
      // The planner's checks name the flag, then the request's field.
      {with({"--train", "tp=3"}), "--train (train.tp): "},
      {with({"--train", "tp=2,pp=3"}),
       "error: --train (train.pp): num_hidden_layers (4) must be divisible by pp·vpp (3), or set "
       "first_stage_layers / last_stage_layers for an uneven split\n"},
      {with({"--train", "pp=3,first-stage-layers=1"}),
       "error: --train (train.first_stage_layers): the remaining 3 layers (num_hidden_layers (4) "
       "minus "
       "first_stage_layers (1)) must be divisible by the other stages × vpp (2 × 1)"},
      {with({"--train", "pp=4,first-stage-layers=2,last-stage-layers=1"}),
       "error: --train (train.first_stage_layers): first_stage_layers + last_stage_layers (2 + 1 = "
       "3) must "
       "be at most num_hidden_layers (4) - 2"},
      {with({"--train", "pp=2,vpp=2,last-stage-layers=1"}),
       "error: --train (train.last_stage_layers): must be a multiple of vpp (2), got 1"},
      {with({"--infer", "tp=4,replicas=2", "--colocated"}),
       "--infer (infer.replicas): colocated engines"},
      {with({"--plan-out", dir / "no-such-dir/plan.json"}), "--plan-out: "},
      {with({"--model", tiny_million}),
       "error: --model " + tiny_million +
           ": config.num_hidden_layers: must be such that the model has at most 131072 tensors "
           "(kMaxFullTensors: 1000000 layers), got 1000000, which makes 9000003 tensors\n"},
      {with({"--model", deepseek_huge}),
       "error: --model " + deepseek_huge +
           ": config.num_hidden_layers: must be such that the model has at most 131072 tensors"},
      {{"--model", tiny_100k, "--train", "dp=128", "--infer", "replicas=128", "--colocated"},
       "error: --infer (infer.replicas): must be such that the plan has at most 8388608 transfers "
       "(kMaxPlanTransfers, by EstimateTransfers()), got 128, which makes about "},
  };
  for (const BadReshardCase& c : cases) {
    std::vector<std::string> args = {"reshard"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    SCOPED_TRACE(::testing::PrintToString(args));
    const ProcessResult r = RunProgram(args);
    EXPECT_EQ(r.status, 2);
    EXPECT_THAT(r.out, IsEmpty());
    EXPECT_THAT(r.err, HasSubstr(c.message));
  }
}

// Reshard requests to the daemon: a plan, then an error naming the field, and serving
// goes on — in both wire formats.
TEST(ReshardServeTest, PlanThenErrorThenServingGoesOn) {
  v1::Request good = Reshard("plan", kTinyLlamaConfig, 2, 2, 2, 4, 2);
  good.mutable_reshard()->set_include_transfers(true);
  const v1::Request bad_tp = Reshard("bad-tp", kTinyLlamaConfig, -1, 1, 1, 1, 1);
  const v1::Request bad_model = Reshard("bad-model", "{", 1, 1, 1, 1, 1);
  const std::vector<v1::Request> requests = {good, bad_tp, bad_model, Ping("ping")};

  for (const bool json : {false, true}) {
    SCOPED_TRACE(json);
    std::vector<std::string> args = {"serve", "--threads", "2"};
    if (json) {
      args.push_back("--format");
      args.push_back("json");
    }
    const ProcessResult r = RunProgram(args, json ? JsonLines(requests) : Framed(requests));
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_THAT(r.err, IsEmpty());
    const auto replies = json ? ParseJsonReplies(r.out) : ParseReplies(r.out);
    ASSERT_TRUE(replies);
    ASSERT_EQ(replies->size(), 4u);

    const v1::Reply& plan = (*replies)[0];
    EXPECT_EQ(plan.id(), "plan");
    ASSERT_TRUE(plan.has_reshard()) << plan.ShortDebugString();
    EXPECT_TRUE(MessageDifferencer::Equals(plan.reshard(), SolveReshard(good.reshard())));
    EXPECT_GT(plan.reshard().transfers_size(), 0);

    const v1::Reply& tp = (*replies)[1];
    EXPECT_EQ(tp.id(), "bad-tp");
    EXPECT_EQ(tp.error().code(), v1::ERROR_CODE_INVALID_ARGUMENT);
    EXPECT_EQ(tp.error().field(), "reshard.train.tp");
    EXPECT_THAT(tp.error().message(), StartsWith("train.tp: must be in [0, 65536]"));

    const v1::Reply& model = (*replies)[2];
    EXPECT_EQ(model.id(), "bad-model");
    EXPECT_EQ(model.error().code(), v1::ERROR_CODE_INVALID_ARGUMENT);
    EXPECT_EQ(model.error().field(), "reshard.model_config_json");
    EXPECT_THAT(model.error().message(), StartsWith("model_config_json: config: not valid JSON"));

    EXPECT_EQ((*replies)[3].id(), "ping");
    EXPECT_TRUE((*replies)[3].has_pong());
  }
}

}  // namespace
}  // namespace rlsched::app
