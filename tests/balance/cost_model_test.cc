#include "rlsched/balance/cost_model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "test_util.h"

namespace rlsched::balance {
namespace {

using testing::ErrorOf;
using ::testing::HasSubstr;

TEST(CostModelTest, TokensIsTheLength) {
  const CostModel tokens = CostModel::Tokens();
  EXPECT_EQ(tokens.kind(), CostModel::Kind::kTokens);
  EXPECT_EQ(tokens.Cost(0), 0);
  EXPECT_EQ(tokens.Cost(12345), 12345);
  EXPECT_EQ(tokens.Cost(std::int64_t{1} << 31), std::int64_t{1} << 31);
  EXPECT_EQ(tokens.Describe(), "tokens");
}

TEST(CostModelTest, AttentionFromALlama7BShape) {
  // Llama-2-7B: h=4096, 32 layers, FFN 11008, 32 heads (no GQA), vocab 32000.
  const CostModel model = CostModel::Attention(ModelShape{.hidden_size = 4096,
                                                          .num_layers = 32,
                                                          .ffn_hidden_size = 11008,
                                                          .num_attention_heads = 32,
                                                          .num_kv_heads = 32,
                                                          .vocab_size = 32000});
  EXPECT_EQ(model.linear(), 1.0);
  // Per token 3·(32·(2·4096·12288 + 2·4096² + 6·4096·11008) + 2·4096·32000) FLOPs,
  // per L² 3·32·2·4096: a ratio of about 50,400.
  EXPECT_NEAR(1.0 / model.quadratic(), 50'400, 100);
  EXPECT_EQ(model.Cost(1000), 1000 + 20);  // 1000²/50,400 ≈ 19.8
  // Quadratic growth: 32k tokens cost far more than 32 × 1k tokens.
  EXPECT_GT(model.Cost(32768), 32 * model.Cost(1024) + 15'000);
}

TEST(CostModelTest, GroupedQueryAttentionAndPlainMlpChangeTheLinearPart) {
  ModelShape gqa;
  ModelShape mha = gqa;
  mha.num_kv_heads = mha.num_attention_heads;
  // More KV projection work per token with MHA: the quadratic share is smaller.
  EXPECT_LT(CostModel::Attention(mha).quadratic(), CostModel::Attention(gqa).quadratic());
  ModelShape plain = gqa;
  plain.gated_mlp = false;
  EXPECT_GT(CostModel::Attention(plain).quadratic(), CostModel::Attention(gqa).quadratic());
}

TEST(CostModelTest, DirectCoefficients) {
  const CostModel model = CostModel::Attention(2.0, 0.5, 7.0);
  EXPECT_EQ(model.Cost(10), 2 * 10 + 50 + 7);
  EXPECT_EQ(model.Costs(std::vector<std::int64_t>{0, 2}), (std::vector<std::int64_t>{7, 13}));
  EXPECT_THAT(model.Describe(), HasSubstr("attention"));
}

TEST(CostModelTest, PerSequenceConstant) {
  const CostModel model = CostModel::Attention(ModelShape{}, 64.0);
  EXPECT_EQ(model.Cost(0), 64);
}

TEST(CostModelTest, BadInputNamesTheField) {
  EXPECT_THAT(ErrorOf([] { CostModel::Attention(-1.0, 0.0, 0.0); }),
              HasSubstr("coefficients.linear"));
  EXPECT_THAT(ErrorOf([] { CostModel::Attention(1.0, NAN, 0.0); }),
              HasSubstr("coefficients.quadratic"));
  EXPECT_THAT(ErrorOf([] { CostModel::Attention(0.0, 0.0, 1.0); }),
              HasSubstr("linear + quadratic"));
  ModelShape shape;
  shape.num_layers = 0;
  EXPECT_THAT(ErrorOf([&] { CostModel::Attention(shape); }), HasSubstr("model.num_layers"));
  shape = ModelShape{};
  shape.num_attention_heads = 7;
  EXPECT_THAT(ErrorOf([&] { CostModel::Attention(shape); }),
              HasSubstr("model.num_attention_heads"));
  shape = ModelShape{};
  shape.num_kv_heads = 5;
  EXPECT_THAT(ErrorOf([&] { CostModel::Attention(shape); }), HasSubstr("model.num_kv_heads"));
  EXPECT_THAT(ErrorOf([] { CostModel::Attention(ModelShape{}, -1.0); }), HasSubstr("per_sequence"));
  EXPECT_THAT(ErrorOf([] { CostModel::Tokens().Cost(-1); }), HasSubstr("lengths"));
  EXPECT_THAT(ErrorOf([] {
                CostModel::Tokens().Costs(std::vector<std::int64_t>{1, -4});
              }),
              HasSubstr("lengths[1]"));
}

TEST(CostModelTest, OverflowIsAnError) {
  // 2^31 squared is 2^62: with a quadratic coefficient of 4 the cost exceeds 2^62.
  const CostModel model = CostModel::Attention(1.0, 4.0, 0.0);
  EXPECT_THAT(ErrorOf([&] { model.Cost(std::int64_t{1} << 31); }), HasSubstr("exceeds 2^62"));
}

TEST(CostModelTest, TenMillionSequencesOfAMillionTokensFit) {
  const CostModel model = CostModel::Attention(ModelShape{});
  const std::int64_t one = model.Cost(1'000'000);
  EXPECT_LT(static_cast<double>(one) * 1e7, 9.2e18);
}

}  // namespace
}  // namespace rlsched::balance
