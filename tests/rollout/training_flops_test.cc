#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "rlsched/common/error.h"
#include "rlsched/rollout/model.h"
#include "test_models.h"

namespace rlsched::rollout {
namespace {

using testing::ReadConfig;

// The published configs counted by hand, term by term (forward, 2 FLOPs a
// multiply-add), then times 3 for forward + backward.

TEST(TrainingFlopsTest, Llama31_8BByHand) {
  const TrainingFlops flops = TrainingFlopsOf(ParseHfConfig(ReadConfig("llama-3.1-8b.json")));
  // h 4096, 32 heads of 128, 8 KV heads, FFN 14336 (gated), 32 layers, vocab 128256.
  const double q = 2.0 * 4096 * 4096, kv = 2.0 * 2 * 4096 * 1024, o = 2.0 * 4096 * 4096;
  const double mlp = 2.0 * 3 * 4096 * 14336;
  const double head = 2.0 * 4096 * 128256;
  EXPECT_EQ(flops.per_token, 3.0 * (32 * (q + kv + o + mlp) + head));
  EXPECT_EQ(flops.per_token, 45'027'950'592.0);
  // Per layer, QKᵀ and AV over half the square: 32 heads × (128 + 128).
  EXPECT_EQ(flops.per_squared_token, 3.0 * 32 * (32 * 256));
  // 8.03B parameters: the embedding and the LM head untied.
  EXPECT_NEAR(flops.parameters, 8.03e9, 0.01e9);
}

TEST(TrainingFlopsTest, Qwen3_30B_A3BByHand) {
  const TrainingFlops flops = TrainingFlopsOf(ParseHfConfig(ReadConfig("qwen3-30b-a3b.json")));
  // h 2048, 32 heads of head_dim 128 (32 × 128 = 4096 != h), 4 KV heads; 48 layers, all
  // with 128 experts of width 768, 8 routed per token; vocab 151936.
  const double q = 2.0 * 2048 * 4096, kv = 2.0 * 2 * 2048 * 512, o = 2.0 * 4096 * 2048;
  const double experts = 2.0 * 3 * 2048 * 768 * 8, router = 2.0 * 2048 * 128;
  const double head = 2.0 * 2048 * 151936;
  EXPECT_EQ(flops.per_token, 3.0 * (48 * (q + kv + o + experts + router) + head));
  EXPECT_EQ(flops.per_token, 18'249'940'992.0);
  EXPECT_EQ(flops.per_squared_token, 3.0 * 48 * (32 * 256));
  EXPECT_NEAR(flops.parameters, 30.5e9, 0.1e9);  // all 128 experts
}

TEST(TrainingFlopsTest, DeepseekV3ByHand) {
  const TrainingFlops flops = TrainingFlopsOf(ParseHfConfig(ReadConfig("deepseek-v3.json")));
  // MLA: h 7168, 128 heads; q LoRA 1536, kv LoRA 512, nope 128, rope 64, v 128.
  const double q = 2.0 * 7168 * 1536 + 2.0 * 1536 * 128 * (128 + 64);
  const double kv = 2.0 * 7168 * (512 + 64) + 2.0 * 512 * 128 * (128 + 128);
  const double o = 2.0 * 128 * 128 * 7168;
  const double attention = q + kv + o;
  // 3 dense layers (FFN 18432), 58 MoE layers: 8 of 256 routed + 1 shared, width 2048.
  const double dense = 2.0 * 3 * 7168 * 18432;
  const double moe = 2.0 * 3 * 7168 * 2048 * (8 + 1) + 2.0 * 7168 * 256;
  const double head = 2.0 * 7168 * 129280;
  EXPECT_EQ(flops.per_token, 3.0 * (3 * (attention + dense) + 58 * (attention + moe) + head));
  EXPECT_EQ(flops.per_token, 219'747'581'952.0);
  EXPECT_EQ(flops.per_squared_token, 3.0 * 61 * 128 * (192 + 128));
  EXPECT_NEAR(flops.parameters, 671e9, 1e9);  // without the MTP layer
}

TEST(TrainingFlopsTest, TiedEmbeddingsChangeOnlyTheParameters) {
  ModelConfig m = ParseHfConfig(ReadConfig("llama-3.1-8b.json"));
  const TrainingFlops untied = TrainingFlopsOf(m);
  m.tie_word_embeddings = true;
  const TrainingFlops tied = TrainingFlopsOf(m);
  EXPECT_EQ(tied.per_token, untied.per_token);
  EXPECT_EQ(tied.per_squared_token, untied.per_squared_token);
  EXPECT_EQ(untied.parameters - tied.parameters, 4096.0 * 128256);
}

TEST(TrainingFlopsTest, AnMoeModelNeedsItsExpertsPerToken) {
  ModelConfig m = ParseHfConfig(ReadConfig("qwen3-30b-a3b.json"));
  m.experts_per_token = 0;
  try {
    TrainingFlopsOf(m);
    FAIL() << "no error";
  } catch (const FieldError& e) {
    EXPECT_EQ(e.field(), "config.num_experts_per_tok");
  }
  m.experts_per_token = 129;
  try {
    Validate(m);
    FAIL() << "no error";
  } catch (const FieldError& e) {
    EXPECT_EQ(e.field(), "config.num_experts_per_tok");
    EXPECT_NE(std::string(e.what()).find("num_experts = 128"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace rlsched::rollout
