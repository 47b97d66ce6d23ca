#include "rlsched/rollout/layout.h"

#include <gtest/gtest.h>

#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "rlsched/common/error.h"
#include "rlsched/rollout/model.h"
#include "test_models.h"

namespace rlsched::rollout {
namespace {

using testing::ReadConfig;

std::int64_t Parameters(const ModelConfig& m) {
  std::int64_t n = 0;
  for (const FullTensor& t : HfTensors(m)) n += t.Elements();
  return n;
}

const LocalParam& Find(const std::vector<LocalParam>& params, const std::string& name) {
  for (const LocalParam& p : params) {
    if (p.name == name) return p;
  }
  throw std::runtime_error("no param " + name);
}

std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const rlsched::FieldError& e) {
    return e.what();
  }
  return "";
}

TEST(ModelTest, SharedConfigsHaveTheirPublishedSizes) {
  const ModelConfig llama = ParseHfConfig(ReadConfig("llama-3.1-70b.json"));
  EXPECT_EQ(llama.family, Family::kLlama);
  EXPECT_EQ(llama.head_dim, 128);
  EXPECT_NEAR(Parameters(llama) / 1e9, 70.55, 0.05);

  const ModelConfig qwen = ParseHfConfig(ReadConfig("qwen3-235b-a22b.json"));
  EXPECT_EQ(qwen.family, Family::kQwen3Moe);
  EXPECT_TRUE(qwen.dense_layers.empty());
  EXPECT_TRUE(qwen.qk_norm);
  EXPECT_NEAR(Parameters(qwen) / 1e9, 235.1, 0.5);

  const ModelConfig ds = ParseHfConfig(ReadConfig("deepseek-v3.json"));
  EXPECT_EQ(ds.family, Family::kDeepseekV3);
  EXPECT_TRUE(ds.is_mla());
  EXPECT_EQ(ds.first_dense_layers, 3);
  EXPECT_TRUE(ds.dense_layers.empty());
  EXPECT_EQ(ds.NumMoeLayers(), 58);
  EXPECT_FALSE(ds.IsMoeLayer(2));
  EXPECT_TRUE(ds.IsMoeLayer(3));
  EXPECT_EQ(ds.num_shared_experts, 1);
  // 671B without the multi-token-prediction layer.
  EXPECT_NEAR(Parameters(ds) / 1e9, 671.0, 1.0);
}

TEST(ModelTest, BadConfigsNameTheField) {
  EXPECT_NE(ErrorOf([] { ParseHfConfig("{"); }).find("JSON"), std::string::npos);
  EXPECT_NE(ErrorOf([] { ParseHfConfig(R"({"model_type": "gpt2"})"); }).find("model_type"),
            std::string::npos);
  EXPECT_NE(ErrorOf([] {
              ParseHfConfig(R"({"model_type": "llama", "hidden_size": 64,
                "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 10})");
            }).find("intermediate_size"),
            std::string::npos);
  EXPECT_NE(ErrorOf([] {
              ParseHfConfig(R"({"model_type": "llama", "hidden_size": -3,
                "intermediate_size": 8, "num_hidden_layers": 2, "num_attention_heads": 4,
                "vocab_size": 10})");
            }).find("hidden_size"),
            std::string::npos);
  EXPECT_NE(ErrorOf([] {
              ParseHfConfig(R"({"model_type": "llama", "hidden_size": 64,
                "intermediate_size": 8, "num_hidden_layers": 2, "num_attention_heads": 6,
                "num_key_value_heads": 4, "vocab_size": 10})");
            }).find("num_key_value_heads"),
            std::string::npos);
}

TEST(ModelTest, EveryFamilyParses) {
  for (const auto& [name, m] : testing::SmallModels()) {
    EXPECT_EQ(FamilyName(m.family), name);
    EXPECT_FALSE(HfTensors(m).empty());
  }
}

TEST(LayoutTest, MegatronQkvInterleavesWholeGroups) {
  const ModelConfig m = testing::SmallModels()[0].second;  // 16 heads, 4 groups, head_dim 4
  const auto params = MegatronShards(m, TrainLayout{.tp = 2}, /*rank=*/1);
  const LocalParam& qkv = Find(params, "decoder.layers.0.self_attention.linear_qkv.weight");
  EXPECT_EQ(qkv.shape, (std::vector<std::int64_t>{2 * (4 + 2) * 4, 64}));
  ASSERT_EQ(qkv.pieces.size(), 6u);
  // Groups 2 and 3: [q heads 8..11; k 2; v 2], [q heads 12..15; k 3; v 3].
  const std::int64_t expected[6][3] = {{32, 48, 0},  {8, 12, 16},  {8, 12, 20},
                                       {48, 64, 24}, {12, 16, 40}, {12, 16, 44}};
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(qkv.pieces[i].row_begin, expected[i][0]) << i;
    EXPECT_EQ(qkv.pieces[i].row_end, expected[i][1]) << i;
    EXPECT_EQ(qkv.pieces[i].offset, (std::vector<std::int64_t>{expected[i][2], 0})) << i;
  }
}

TEST(LayoutTest, VllmReplicatesKvHeadsBeyondTheirCount) {
  const ModelConfig m = testing::SmallModels()[1].second;  // qwen2: 8 heads, 4 kv, head_dim 4
  const auto params = VllmShards(m, InferLayout{.tp = 8}, /*tp_rank=*/5);
  for (const char* kind : {"weight", "bias"}) {
    const LocalParam& qkv = Find(params, std::string("model.layers.2.self_attn.qkv_proj.") + kind);
    ASSERT_EQ(qkv.pieces.size(), 3u);
    EXPECT_EQ(qkv.shape[0], (1 + 2) * 4);
    EXPECT_EQ(qkv.pieces[0].row_begin, 5 * 4);  // q head 5
    EXPECT_EQ(qkv.pieces[1].row_begin, 2 * 4);  // kv head 5 / (8 / 4) = 2
    EXPECT_EQ(qkv.pieces[2].row_begin, 2 * 4);
    EXPECT_EQ(qkv.pieces[2].offset[0], 8);
  }
}

TEST(LayoutTest, VocabularyPaddingIsNeverAPiece) {
  const ModelConfig m = testing::SmallModels()[0].second;  // vocab 1000
  // vLLM pads to 1024: 128 rows per rank on tp = 8, the last rank holds 104 real ones.
  const auto last = VllmShards(m, InferLayout{.tp = 8}, 7);
  const LocalParam& embed = Find(last, "model.embed_tokens.weight");
  EXPECT_EQ(embed.shape, (std::vector<std::int64_t>{128, 64}));
  ASSERT_EQ(embed.pieces.size(), 1u);
  EXPECT_EQ(embed.pieces[0].row_begin, 896);
  EXPECT_EQ(embed.pieces[0].row_end, 1000);
  // Megatron pads to a multiple of 128 * tp = 512: 1024 rows, 256 per rank on tp = 4.
  EXPECT_EQ(MegatronPaddedVocab(1000, 4), 1024);
  const auto rank3 = MegatronShards(m, TrainLayout{.tp = 4}, 3);
  const LocalParam& out = Find(rank3, "output_layer.weight");
  EXPECT_EQ(out.shape[0], 256);
  EXPECT_EQ(out.pieces[0].row_end - out.pieces[0].row_begin, 1000 - 768);
}

TEST(LayoutTest, TiedEmbeddingsHaveACopyOnTheLastStage) {
  const ModelConfig m = testing::SmallModels()[1].second;  // qwen2, tied
  EXPECT_THROW(Find(MegatronShards(m, TrainLayout{.pp = 1}, 0), "output_layer.weight"),
               std::runtime_error);
  const auto last = MegatronShards(m, TrainLayout{.pp = 3}, 2);
  EXPECT_EQ(Find(last, "output_layer.weight").pieces[0].tensor,
            Find(MegatronShards(m, TrainLayout{.pp = 3}, 0), "embedding.word_embeddings.weight")
                .pieces[0]
                .tensor);
  for (const LocalParam& p : VllmShards(m, InferLayout{.tp = 2}, 0))
    EXPECT_NE(p.name, "lm_head.weight");
}

TEST(LayoutTest, StagesAndVirtualChunks) {
  ModelConfig m = testing::SmallModels()[0].second;  // 4 layers
  EXPECT_EQ(StageLayers(m, TrainLayout{.pp = 2, .vpp = 2}, 0), (std::vector<std::int64_t>{0, 2}));
  EXPECT_EQ(StageLayers(m, TrainLayout{.pp = 2, .vpp = 2}, 1), (std::vector<std::int64_t>{1, 3}));
  EXPECT_EQ(StageLayers(m, TrainLayout{.pp = 4}, 2), (std::vector<std::int64_t>{2}));
  EXPECT_EQ(StageLayers(m, TrainLayout{.pp = 2, .layers_per_chunk = {1, 3}}, 1),
            (std::vector<std::int64_t>{1, 2, 3}));
  // 4 layers over 3 stages: Megatron-core refuses it unless the split is explicit.
  EXPECT_THROW(StageLayers(m, TrainLayout{.pp = 3}, 0), std::invalid_argument);
  TrainLayout uneven{.pp = 3};
  uneven.first_stage_layers = 2;
  EXPECT_EQ(StageLayers(m, uneven, 0), (std::vector<std::int64_t>{0, 1}));
  EXPECT_EQ(StageLayers(m, uneven, 1), (std::vector<std::int64_t>{2}));
  EXPECT_EQ(StageLayers(m, uneven, 2), (std::vector<std::int64_t>{3}));
}

// The issue's case: 28 layers over pp 3 used to be split 10/9/9 silently.
TEST(LayoutTest, AnUnevenSplitIsRefusedByDefault) {
  ModelConfig m = testing::SmallModels()[0].second;
  m.num_layers = 28;
  EXPECT_EQ(ErrorOf([&] { Validate(m, TrainLayout{.tp = 2, .pp = 3}); }),
            "train.pp: num_hidden_layers (28) must be divisible by pp·vpp (3), or set "
            "first_stage_layers / last_stage_layers for an uneven split");
  // pp divides the layers, pp·vpp does not (14 layers per stage in 3 chunks).
  EXPECT_EQ(ErrorOf([&] { Validate(m, TrainLayout{.pp = 2, .vpp = 3}); }),
            "train.vpp: num_hidden_layers (28) must be divisible by pp·vpp (6), or set "
            "first_stage_layers / last_stage_layers for an uneven split");
  // More stages than layers is the same rule.
  EXPECT_EQ(ErrorOf([&] { Validate(m, TrainLayout{.pp = 56}); }).rfind("train.pp: ", 0), 0u);
  EXPECT_THROW(MegatronShards(m, TrainLayout{.pp = 3}, 0), std::invalid_argument);
  EXPECT_THROW(LayersPerChunk(m, TrainLayout{.pp = 3}), std::invalid_argument);
  // Even splits pass.
  Validate(m, TrainLayout{.pp = 4});
  Validate(m, TrainLayout{.pp = 2, .vpp = 7});
  EXPECT_EQ(LayersPerChunk(m, TrainLayout{.pp = 2, .vpp = 2}),
            (std::vector<std::int64_t>{7, 7, 7, 7}));
}

TrainLayout Uneven(TrainLayout t, std::optional<std::int64_t> first,
                   std::optional<std::int64_t> last) {
  t.first_stage_layers = first;
  t.last_stage_layers = last;
  return t;
}

std::vector<std::int64_t> Iota(std::int64_t begin, std::int64_t end) {
  std::vector<std::int64_t> v;
  for (std::int64_t i = begin; i < end; ++i) v.push_back(i);
  return v;
}

std::vector<std::int64_t> Join(std::vector<std::int64_t> a, const std::vector<std::int64_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Megatron-core's num_layers_in_first/last_pipeline_stage, by hand.
TEST(LayoutTest, FirstAndLastStageLayers) {
  ModelConfig m = testing::SmallModels()[0].second;
  m.num_layers = 28;
  // pp 3: 10 | 10 | 8.
  const TrainLayout both = Uneven({.tp = 2, .pp = 3}, 10, 8);
  Validate(m, both);
  EXPECT_EQ(LayersPerChunk(m, both), (std::vector<std::int64_t>{10, 10, 8}));
  EXPECT_EQ(StageLayers(m, both, 0), Iota(0, 10));
  EXPECT_EQ(StageLayers(m, both, 1), Iota(10, 20));
  EXPECT_EQ(StageLayers(m, both, 2), Iota(20, 28));
  // Only the first stage given: the other 18 layers 9 | 9 (the old default's split,
  // now asked for).
  EXPECT_EQ(LayersPerChunk(m, Uneven({.pp = 3}, 10, std::nullopt)),
            (std::vector<std::int64_t>{10, 9, 9}));
  // Only the last: 24 layers over 3 stages, then 4.
  EXPECT_EQ(LayersPerChunk(m, Uneven({.pp = 4}, std::nullopt, 4)),
            (std::vector<std::int64_t>{8, 8, 8, 4}));
  // pp 2 with both: nothing in between.
  EXPECT_EQ(LayersPerChunk(m, Uneven({.pp = 2}, 27, 1)), (std::vector<std::int64_t>{27, 1}));
  // With virtual stages (get_transformer_layer_offset): pp 3, vpp 2, first 6, last 10.
  // Each round of chunks holds 3 (stage 0) + 6 (stage 1) + 5 (stage 2) = 14 layers.
  const TrainLayout virt = Uneven({.pp = 3, .vpp = 2}, 6, 10);
  EXPECT_EQ(LayersPerChunk(m, virt), (std::vector<std::int64_t>{3, 6, 5, 3, 6, 5}));
  EXPECT_EQ(StageLayers(m, virt, 0), Join(Iota(0, 3), Iota(14, 17)));
  EXPECT_EQ(StageLayers(m, virt, 1), Join(Iota(3, 9), Iota(17, 23)));
  EXPECT_EQ(StageLayers(m, virt, 2), Join(Iota(9, 14), Iota(23, 28)));
  // The shards follow: rank 2 (tp 0, stage 1) has layer 17, not layer 16; the
  // embedding on stage 0 only, the output layer on stage 2 only.
  const std::vector<LocalParam> stage1 = MegatronShards(m, both, 2);
  EXPECT_NO_THROW(Find(stage1, "decoder.layers.10.mlp.linear_fc2.weight"));
  EXPECT_NO_THROW(Find(stage1, "decoder.layers.19.self_attention.linear_qkv.weight"));
  EXPECT_THROW(Find(stage1, "decoder.layers.9.mlp.linear_fc2.weight"), std::runtime_error);
  EXPECT_THROW(Find(stage1, "decoder.layers.20.mlp.linear_fc2.weight"), std::runtime_error);
  const std::vector<LocalParam> virt1 = MegatronShards(m, virt, 1);
  EXPECT_NO_THROW(Find(virt1, "decoder.layers.17.mlp.linear_fc2.weight"));
  EXPECT_THROW(Find(virt1, "decoder.layers.16.mlp.linear_fc2.weight"), std::runtime_error);
  EXPECT_THROW(Find(virt1, "embedding.word_embeddings.weight"), std::runtime_error);
  EXPECT_NO_THROW(Find(MegatronShards(m, virt, 2), "output_layer.weight"));
}

TEST(LayoutTest, BadFirstAndLastStageLayersNameTheField) {
  ModelConfig m = testing::SmallModels()[0].second;
  m.num_layers = 28;
  const std::pair<TrainLayout, std::string> cases[] = {
      {Uneven({.pp = 3}, 0, std::nullopt),
       "train.first_stage_layers: must be in [1, num_hidden_layers (28)], got 0"},
      {Uneven({.pp = 3}, 10, -1),
       "train.last_stage_layers: must be in [1, num_hidden_layers (28)], got -1"},
      {Uneven({.pp = 3}, std::nullopt, 29),
       "train.last_stage_layers: must be in [1, num_hidden_layers (28)], got 29"},
      {Uneven({.pp = 3, .vpp = 2}, 3, 4),
       "train.first_stage_layers: must be a multiple of vpp (2), got 3"},
      {Uneven({.pp = 3, .vpp = 2}, 4, 5),
       "train.last_stage_layers: must be a multiple of vpp (2), got 5"},
      {Uneven({.pp = 1}, 28, std::nullopt), "train.first_stage_layers: needs pp >= 2, got pp 1"},
      {Uneven({.pp = 1}, std::nullopt, 28), "train.last_stage_layers: needs pp >= 2, got pp 1"},
      {Uneven({.pp = 2}, 10, 10),
       "train.first_stage_layers: first_stage_layers + last_stage_layers (10 + 10 = 20) must "
       "equal num_hidden_layers (28) with pp 2"},
      // The middle stage needs layers: first + last < layers when pp > 2.
      {Uneven({.pp = 3}, 14, 14),
       "train.first_stage_layers: first_stage_layers + last_stage_layers (14 + 14 = 28) must be "
       "at most num_hidden_layers (28) - 1: the other 1 stage(s) need at least vpp (1) layers "
       "each"},
      {Uneven({.pp = 2}, 28, std::nullopt),
       "train.first_stage_layers: first_stage_layers (28) must be at most num_hidden_layers (28) "
       "- 1: the other 1 stage(s) need at least vpp (1) layers each"},
      {Uneven({.pp = 3, .vpp = 2}, 16, 12),
       "train.first_stage_layers: first_stage_layers + last_stage_layers (16 + 12 = 28) must be "
       "at most num_hidden_layers (28) - 2: the other 1 stage(s) need at least vpp (2) layers "
       "each"},
      {Uneven({.pp = 4}, 10, 9),
       "train.first_stage_layers: the remaining 9 layers (num_hidden_layers (28) minus "
       "first_stage_layers + last_stage_layers (10 + 9 = 19)) must be divisible by the other "
       "stages × vpp (2 × 1)"},
      {Uneven({.pp = 3}, std::nullopt, 1),
       "train.last_stage_layers: the remaining 27 layers (num_hidden_layers (28) minus "
       "last_stage_layers (1)) must be divisible by the other stages × vpp (2 × 1)"},
      // Each middle stage's layers must split into its vpp chunks.
      {Uneven({.pp = 4, .vpp = 2}, 2, 4),
       "train.first_stage_layers: the remaining 22 layers (num_hidden_layers (28) minus "
       "first_stage_layers + last_stage_layers (2 + 4 = 6)) must be divisible by the other "
       "stages × vpp (2 × 2)"},
      {Uneven({.pp = 2, .layers_per_chunk = {14, 14}}, 14, std::nullopt),
       "train.first_stage_layers: cannot be combined with layers_per_chunk"},
  };
  for (const auto& c : cases) {
    const TrainLayout& train = c.first;  // not a structured binding: clang 14's lambdas
    EXPECT_EQ(ErrorOf([&] { Validate(m, train); }), c.second);
    EXPECT_EQ(ErrorOf([&] { StageLayers(m, train, 0); }), c.second);
  }
}

TEST(LayoutTest, RankOrders) {
  const TrainLayout t{.tp = 2, .pp = 2, .ep = 2, .dp = 2};
  const TrainCoord c = MegatronCoord(t, 5);  // stage 1, in-stage rank 1
  EXPECT_EQ(c.tp, 1);
  EXPECT_EQ(c.dp, 0);
  EXPECT_EQ(c.pp, 1);
  EXPECT_EQ(c.etp, 0);
  EXPECT_EQ(c.ep, 1);
  EXPECT_EQ(c.edp, 0);
  const TrainCoord d = MegatronCoord(t, 6);
  EXPECT_EQ(d.dp, 1);
  EXPECT_EQ(d.ep, 0);
  EXPECT_EQ(d.edp, 1);
}

TEST(LayoutTest, ExpertsAreContiguousOrRoundRobin) {
  const ModelConfig m = testing::SmallModels()[3].second;  // 8 experts, layer 1 dense
  const auto megatron = MegatronShards(m, TrainLayout{.tp = 2, .ep = 2}, 1);  // ep rank 1
  EXPECT_NO_THROW(Find(megatron, "decoder.layers.0.mlp.experts.local_experts.4.linear_fc1.weight"));
  EXPECT_THROW(Find(megatron, "decoder.layers.0.mlp.experts.local_experts.3.linear_fc1.weight"),
               std::runtime_error);
  EXPECT_THROW(Find(megatron, "decoder.layers.1.mlp.experts.local_experts.4.linear_fc1.weight"),
               std::runtime_error);
  const auto rr =
      VllmShards(m, InferLayout{.tp = 4, .expert_parallel = true, .round_robin_experts = true}, 1);
  const LocalParam& w2 = Find(rr, "model.layers.0.mlp.experts.w2_weight");
  EXPECT_EQ(w2.shape, (std::vector<std::int64_t>{2, 32, 16}));
  const auto& names = HfTensors(m);
  EXPECT_EQ(names[w2.pieces[1].tensor].name, "model.layers.0.mlp.experts.5.down_proj.weight");
  EXPECT_EQ(w2.pieces[1].offset, (std::vector<std::int64_t>{1, 0, 0}));
}

TEST(LayoutTest, LayoutsThatDoNotFitNameTheField) {
  const ModelConfig m = testing::SmallModels()[0].second;
  EXPECT_NE(ErrorOf([&] { Validate(m, TrainLayout{.tp = 8}); }).find("train.tp"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] { Validate(m, TrainLayout{.pp = 5}); }).find("train.pp"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] { Validate(m, TrainLayout{.ep = 2}); }).find("train.ep"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] { Validate(m, InferLayout{.tp = 3}); }).find("infer.tp"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] { Validate(m, InferLayout{.tp = 0}); }).find("infer.tp"),
            std::string::npos);
}

}  // namespace
}  // namespace rlsched::rollout
