// Inputs that would take without bound: every one is answered or refused at once,
// with a FieldError naming the config key or the option, the bound and the count.

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "rlsched/common/error.h"
#include "rlsched/rollout/layout.h"
#include "rlsched/rollout/model.h"
#include "rlsched/rollout/plan.h"
#include "test_models.h"

namespace rlsched::rollout {
namespace {

using testing::ReadConfig;

// `text` with the value of "key": ... replaced by `value` (the key must be present).
std::string WithKey(std::string text, const std::string& key, const std::string& value) {
  const std::string quoted = "\"" + key + "\":";
  const std::size_t at = text.find(quoted);
  EXPECT_NE(at, std::string::npos) << key;
  if (at == std::string::npos) return text;
  std::size_t begin = at + quoted.size();
  while (text[begin] == ' ') ++begin;
  std::size_t end = begin;
  if (text[end] == '[') {
    end = text.find(']', begin) + 1;
  } else {
    while (end < text.size() && text[end] != ',' && text[end] != '}') ++end;
  }
  return text.replace(begin, end - begin, value);
}

// How long an input below may take: a guard against what these inputs once did (minutes
// to hours, or gigabytes then bad_alloc), not a speed test. The linear paths take
// milliseconds in a release build and about 2 s under ASan on a loaded 2-core machine.
constexpr double kGuardSeconds = 10.0;

// The FieldError `run` throws, within `seconds`.
FieldError ErrorWithin(double seconds, const std::function<void()>& run) {
  const auto start = std::chrono::steady_clock::now();
  try {
    run();
  } catch (const FieldError& e) {
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    EXPECT_LT(took.count(), seconds) << e.what();
    return e;
  }
  ADD_FAILURE() << "no FieldError";
  return FieldError("", "");
}

constexpr char kTinyLlama[] = R"({"model_type": "llama", "hidden_size": 8,
  "intermediate_size": 16, "num_hidden_layers": 1000000, "num_attention_heads": 2,
  "num_key_value_heads": 1, "vocab_size": 64})";

TEST(LimitsTest, DeepseekWithTwoToTheThirtyOneLayersIsRefusedWhileParsing) {
  // 608 bytes that used to fill 2^30 dense-layer entries (8 GB) before any check.
  std::string text = ReadConfig("deepseek-v3.json");
  text = WithKey(text, "num_hidden_layers", "2147483647");
  text = WithKey(text, "moe_layer_freq", "2");
  const FieldError e = ErrorWithin(kGuardSeconds, [&] { ParseHfConfig(text); });
  EXPECT_EQ(e.field(), "config.num_hidden_layers");
  EXPECT_NE(e.bound().find("at most 131072 tensors"), std::string::npos) << e.what();
  EXPECT_NE(e.value().find("2147483647"), std::string::npos) << e.what();
}

TEST(LimitsTest, Qwen3MoeWithASparseStepAndTwoToTheThirtyOneLayersIsRefused) {
  std::string text = ReadConfig("qwen3-235b-a22b.json");
  text = WithKey(text, "num_hidden_layers", "2147483647");
  text = WithKey(text, "decoder_sparse_step", "2");
  const FieldError e = ErrorWithin(kGuardSeconds, [&] { ParseHfConfig(text); });
  EXPECT_EQ(e.field(), "config.num_hidden_layers");
  EXPECT_NE(e.bound().find("131072"), std::string::npos) << e.what();
}

TEST(LimitsTest, ALongMlpOnlyLayersListIsReadInLinearTime) {
  // 200,000 entries: a layers × list loop took hours; sorted once, it takes ms.
  std::string list = "[";
  for (int i = 0; i < 200000; ++i) list += (i ? "," : "") + std::to_string(i % 94);
  list += "]";
  const std::string text = WithKey(ReadConfig("qwen3-235b-a22b.json"), "mlp_only_layers", list);
  const auto start = std::chrono::steady_clock::now();
  const ModelConfig m = ParseHfConfig(text);
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  EXPECT_LT(took.count(), kGuardSeconds);
  EXPECT_EQ(m.dense_layers.size(), 94u);  // distinct, ascending
  EXPECT_EQ(m.NumMoeLayers(), 0);

  // With as many layers as entries, the model is refused for its tensors, at once.
  std::string layers = WithKey(text, "num_hidden_layers", "200000");
  std::string wide = "[";
  for (int i = 0; i < 200000; ++i) wide += (i ? "," : "") + std::to_string(199999 - i);
  wide += "]";
  layers = WithKey(layers, "mlp_only_layers", wide);
  const FieldError e = ErrorWithin(kGuardSeconds, [&] { ParseHfConfig(layers); });
  EXPECT_EQ(e.field(), "config.num_hidden_layers");

  // An entry outside the layers names its index.
  const FieldError out = ErrorWithin(
      kGuardSeconds, [&] { ParseHfConfig(WithKey(text, "mlp_only_layers", "[3, 94]")); });
  EXPECT_EQ(out.field(), "config.mlp_only_layers[1]");
  EXPECT_EQ(out.bound(), "in [0, num_hidden_layers = 94)");
  EXPECT_EQ(out.value(), "94");
  const FieldError huge = ErrorWithin(kGuardSeconds, [&] {
    ParseHfConfig(WithKey(text, "mlp_only_layers", "[18446744073709551615]"));
  });
  EXPECT_EQ(huge.field(), "config.mlp_only_layers[0]");
  EXPECT_EQ(huge.value(), "18446744073709551615");
}

TEST(LimitsTest, ATinyModelWithAMillionLayersIsRefusedWhileParsing) {
  const FieldError e = ErrorWithin(kGuardSeconds, [] { ParseHfConfig(kTinyLlama); });
  EXPECT_EQ(e.field(), "config.num_hidden_layers");
  EXPECT_NE(e.bound().find("at most 131072 tensors (kMaxFullTensors"), std::string::npos)
      << e.what();
  EXPECT_EQ(e.value(), "1000000, which makes 9000003 tensors");
}

TEST(LimitsTest, TooManyRoutedExpertsNameTheExpertsKey) {
  std::string text = ReadConfig("deepseek-v3.json");
  text = WithKey(text, "n_routed_experts", "2000000");
  const FieldError e = ErrorWithin(kGuardSeconds, [&] { ParseHfConfig(text); });
  EXPECT_EQ(e.field(), "config.n_routed_experts");
}

TEST(LimitsTest, AModelAboveTheByteLimitIsRefused) {
  std::string text = ReadConfig("llama-3.1-70b.json");
  text = WithKey(text, "vocab_size", "2000000000");
  const FieldError e = ErrorWithin(kGuardSeconds, [&] { ParseHfConfig(text); });
  EXPECT_EQ(e.field(), "config");
  EXPECT_NE(e.bound().find("2^42"), std::string::npos) << e.what();
}

TEST(LimitsTest, HfTensorsRefusesAModelBuiltInCodeAboveTheLimit) {
  ModelConfig m = testing::SmallModels()[0].second;
  m.num_layers = std::int64_t{1} << 30;
  const FieldError e = ErrorWithin(kGuardSeconds, [&] { HfTensors(m); });
  EXPECT_EQ(e.field(), "config.num_hidden_layers");
}

TEST(LimitsTest, APlanAboveTheTransferLimitIsRefusedBeforePlanning) {
  // 10,000 layers pass the tensor limit (90,003 tensors); to 128 colocated replicas
  // the plan would be about 11.5 million transfers.
  std::string text = WithKey(kTinyLlama, "num_hidden_layers", "10000");
  const ModelConfig m = ParseHfConfig(text);
  ReshardOptions o;
  o.train = {.tp = 1, .dp = 128};
  o.infer = {.tp = 1, .replicas = 128};
  o.topology.colocated = true;
  const FieldError e = ErrorWithin(kGuardSeconds, [&] { PlanReshard(m, o); });
  EXPECT_EQ(e.field(), "infer.replicas");
  EXPECT_NE(e.bound().find("at most 8388608 transfers (kMaxPlanTransfers"), std::string::npos)
      << e.what();
  EXPECT_NE(e.value().find("128, which makes about "), std::string::npos) << e.what();
  EXPECT_GT(EstimateTransfers(m, o).transfers, static_cast<double>(kMaxPlanTransfers));

  // One replica, one GPU: about 90,000 transfers, planned.
  o.train = {};
  o.infer = {};
  o.topology.colocated = false;
  EXPECT_LT(EstimateTransfers(m, o).transfers, static_cast<double>(kMaxPlanTransfers));
}

TEST(LimitsTest, ATinyBucketForALargeModelNamesTheBucket) {
  const ModelConfig m = ParseHfConfig(ReadConfig("llama-3.1-70b.json"));
  ReshardOptions o;
  o.train = {.tp = 8, .pp = 2, .dp = 4};
  o.infer = {.tp = 8, .replicas = 2};
  o.bucket_bytes = 60000;  // above the widest row (down_proj: 57,344 bytes)
  const FieldError e = ErrorWithin(kGuardSeconds, [&] { PlanReshard(m, o); });
  EXPECT_EQ(e.field(), "bucket_bytes");
  EXPECT_NE(e.value().find("60000, which makes about "), std::string::npos) << e.what();
}

// Property: on random seeded MoE configs the layer rules count as a brute-force pass
// over the layers, and SizeOf() agrees with HfTensors().
TEST(LimitsTest, LayerRulesAndSizesMatchABruteForceCount) {
  std::mt19937_64 rng(19);
  for (int trial = 0; trial < 300; ++trial) {
    auto uniform = [&](std::int64_t lo, std::int64_t hi) {
      return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
    };
    const bool deepseek = trial % 2 == 0;
    const std::int64_t layers = uniform(1, 40);
    const std::int64_t step = uniform(1, 5);
    std::string text;
    if (deepseek) {
      text = R"({"model_type": "deepseek_v3", "hidden_size": 16, "intermediate_size": 32,
        "moe_intermediate_size": 8, "num_hidden_layers": )" +
             std::to_string(layers) + R"(, "num_attention_heads": 4, "n_shared_experts": )" +
             std::to_string(uniform(0, 2)) + R"(, "n_routed_experts": )" +
             std::to_string(uniform(1, 6)) + R"(, "first_k_dense_replace": )" +
             std::to_string(uniform(0, layers + 2)) + R"(, "moe_layer_freq": )" +
             std::to_string(step) + R"(, "q_lora_rank": 8, "kv_lora_rank": 8,
        "qk_nope_head_dim": 4, "qk_rope_head_dim": 2, "v_head_dim": 4, "vocab_size": 100})";
    } else {
      std::string list = "[";
      const std::int64_t listed = uniform(0, 8);
      for (std::int64_t i = 0; i < listed; ++i) {
        list += (i ? "," : "") + std::to_string(uniform(0, layers - 1));
      }
      list += "]";
      text = R"({"model_type": "qwen3_moe", "hidden_size": 16, "intermediate_size": 32,
        "moe_intermediate_size": 8, "num_hidden_layers": )" +
             std::to_string(layers) + R"(, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 4, "num_experts": )" +
             std::to_string(uniform(1, 6)) + R"(, "decoder_sparse_step": )" + std::to_string(step) +
             R"(, "mlp_only_layers": )" + list + R"(, "vocab_size": 100,
        "tie_word_embeddings": )" +
             (uniform(0, 1) ? "true" : "false") + "}";
    }
    SCOPED_TRACE(text);
    const ModelConfig m = ParseHfConfig(text);
    std::int64_t moe = 0;
    for (std::int64_t i = 0; i < layers; ++i) {
      // Transformers' own rules.
      bool sparse = false;
      if (deepseek) {
        sparse = i >= m.first_dense_layers && i % step == 0;
      } else {
        const bool listed =
            std::find(m.dense_layers.begin(), m.dense_layers.end(), i) != m.dense_layers.end();
        sparse = !listed && (i + 1) % step == 0;
      }
      EXPECT_EQ(m.IsMoeLayer(i), sparse) << "layer " << i;
      moe += sparse ? 1 : 0;
    }
    EXPECT_EQ(m.NumMoeLayers(), moe);
    const std::vector<FullTensor> tensors = HfTensors(m);
    double bytes = 0.0;
    for (const FullTensor& t : tensors) bytes += static_cast<double>(t.Bytes());
    const ModelSize size = SizeOf(m);
    EXPECT_EQ(size.tensors, static_cast<double>(tensors.size()));
    EXPECT_EQ(size.bytes, bytes);
  }
}

// Property: the estimate is an upper bound of the transfers planned, on random seeded
// layouts of the small models and bucket budgets.
TEST(LimitsTest, EstimateBoundsThePlannedTransfers) {
  std::mt19937_64 rng(1919);
  const auto models = testing::SmallModels();
  int planned = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const auto& [name, m] = models[static_cast<std::size_t>(trial) % models.size()];
    auto pick = [&](std::vector<std::int64_t> v) {
      return v[std::uniform_int_distribution<std::size_t>(0, v.size() - 1)(rng)];
    };
    ReshardOptions o;
    o.train.tp = pick({1, 2, 4});
    o.train.pp = pick({1, 2, 4});
    o.train.dp = pick({1, 2, 4});
    o.train.cp = pick({1, 2});
    if (m.is_moe()) {
      o.train.ep = pick({1, 2, 4});
      o.train.etp = pick({1, 2});
    }
    o.infer.tp = pick({1, 2, 4, 8});
    o.infer.replicas = pick({1, 2, 3, 8});
    o.infer.expert_parallel = m.is_moe() && pick({0, 1}) == 1;
    o.topology.colocated = pick({0, 1}) == 1;
    o.topology.gpus_per_node = pick({1, 2, 8});
    o.bucket_bytes = pick({256, 1024, 4096, std::int64_t{1} << 20});
    o.target_dtype = pick({0, 1}) == 1 ? TargetDtype::kFp8Block128 : TargetDtype::kBf16;
    ReshardPlan plan;
    try {
      plan = PlanReshard(m, o);
    } catch (const FieldError&) {
      continue;  // a layout that does not fit the model
    }
    ++planned;
    const TransferEstimate e = EstimateTransfers(m, o);
    EXPECT_LE(static_cast<double>(plan.transfers.size()), e.transfers)
        << name << " trial " << trial;
  }
  EXPECT_GT(planned, 40);
}

}  // namespace
}  // namespace rlsched::rollout
