// Tests of verify.h: hand checks of the reference Megatron-core and vLLM shards on tiny
// models, the plan executor on a plan built by matching values (independent of
// layout.cc and plan.cc), corrupted plans, and the real planner's plans.

#include "rlsched/rollout/verify.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <numeric>
#include <set>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "rlsched/common/error.h"
#include "rlsched/rollout/layout.h"
#include "rlsched/rollout/model.h"
#include "rlsched/rollout/plan.h"

namespace rlsched::rollout {
namespace {

// Llama: hidden 8, 4 heads of dim 2 in 2 query groups, FFN 8, vocabulary 130, 2 layers.
ModelConfig TinyLlama() {
  ModelConfig m;
  m.family = Family::kLlama;
  m.hidden_size = 8;
  m.intermediate_size = 8;
  m.num_layers = 2;
  m.num_heads = 4;
  m.num_kv_heads = 2;
  m.head_dim = 2;
  m.vocab_size = 130;
  Validate(m);
  return m;
}

ModelConfig TinyQwen3Moe() {
  ModelConfig m;
  m.family = Family::kQwen3Moe;
  m.hidden_size = 8;
  m.intermediate_size = 8;
  m.num_layers = 3;
  m.num_heads = 4;
  m.num_kv_heads = 2;
  m.head_dim = 4;
  m.vocab_size = 100;
  m.qk_norm = true;
  m.num_experts = 4;
  m.moe_intermediate_size = 4;
  m.dense_layers = {1};
  Validate(m);
  return m;
}

ModelConfig TinyDeepseek() {
  ModelConfig m;
  m.family = Family::kDeepseekV3;
  m.hidden_size = 8;
  m.intermediate_size = 8;
  m.num_layers = 3;
  m.num_heads = 2;
  m.num_kv_heads = 2;
  m.vocab_size = 64;
  m.num_experts = 4;
  m.moe_intermediate_size = 4;
  m.num_shared_experts = 1;
  m.dense_layers = {0};
  m.router_bias = true;
  m.q_lora_rank = 4;
  m.kv_lora_rank = 4;
  m.qk_nope_head_dim = 2;
  m.qk_rope_head_dim = 2;
  m.v_head_dim = 2;
  m.head_dim = 4;
  Validate(m);
  return m;
}

// The sizes of a TrainLayout (designated initializers of TrainLayout itself would
// leave layers_per_chunk out, which -Wmissing-field-initializers reports).
struct Parallel {
  std::int64_t tp = 1, pp = 1, vpp = 1, ep = 1, etp = 1, cp = 1, dp = 1;
};

TrainLayout Train(const Parallel& p) {
  TrainLayout t;
  t.tp = p.tp;
  t.pp = p.pp;
  t.vpp = p.vpp;
  t.ep = p.ep;
  t.etp = p.etp;
  t.cp = p.cp;
  t.dp = p.dp;
  return t;
}

// The global layers of trainer rank `rank`'s reference shards.
std::set<std::int64_t> LayersOf(const ModelConfig& m, const TrainLayout& t, std::int64_t rank) {
  std::set<std::int64_t> layers;
  for (const auto& [name, tensor] : ReferenceMegatronShards(m, t, rank)) {
    if (name.rfind("decoder.layers.", 0) == 0) layers.insert(std::stoll(name.substr(15)));
  }
  return layers;
}

// The message of the std::invalid_argument `f` throws ("" if none).
std::string ErrorOrFailure(const std::function<void()>& f) {
  try {
    f();
  } catch (const rlsched::FieldError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no std::invalid_argument";
  return "";
}

// The values of full tensor `name`.
Tensor Full(const ModelConfig& m, const std::string& name) {
  const std::vector<FullTensor> all = HfTensors(m);
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (all[i].name == name) return FullTensorValues(m, static_cast<std::int32_t>(i), all[i]);
  }
  ADD_FAILURE() << "no full tensor " << name;
  return {};
}

// Rows of `t` (dim 0) listed as (tensor, row) pairs, concatenated.
Tensor RowsOf(const std::vector<std::pair<const Tensor*, std::int64_t>>& rows) {
  std::vector<Tensor> parts;
  for (const auto& [t, r] : rows) parts.push_back(Rows(*t, r, r + 1));
  return ConcatRows(parts);
}

const Tensor& Get(const ShardMap& shards, const std::string& name) {
  auto it = shards.find(name);
  if (it == shards.end()) {
    ADD_FAILURE() << "missing " << name;
    static const Tensor kEmpty;
    return kEmpty;
  }
  return it->second;
}

TEST(TensorTest, Operations) {
  Tensor t = Tensor::Filled({3, 4}, 0);
  std::iota(t.data.begin(), t.data.end(), 0);
  EXPECT_EQ(Rows(t, 1, 3).shape, (std::vector<std::int64_t>{2, 4}));
  EXPECT_EQ(Rows(t, 1, 3).at({0, 0}), 4);
  EXPECT_EQ(Cols(t, 1, 3).data, (std::vector<std::uint16_t>{1, 2, 5, 6, 9, 10}));
  EXPECT_EQ(ConcatRows({Rows(t, 2, 3), Rows(t, 0, 1)}).data,
            (std::vector<std::uint16_t>{8, 9, 10, 11, 0, 1, 2, 3}));
  const Tensor s = Stack({Rows(t, 0, 1), Rows(t, 2, 3)});
  EXPECT_EQ(s.shape, (std::vector<std::int64_t>{2, 1, 4}));
  EXPECT_EQ(s.at({1, 0, 3}), 11);
  EXPECT_EQ(Reshape(t, {12}).shape, (std::vector<std::int64_t>{12}));
  const Tensor p = PadRows(t, 5, 7);
  EXPECT_EQ(p.padding_rows, 2);
  EXPECT_EQ(p.at({4, 3}), 7);
  EXPECT_EQ(Rows(p, 2, 4).padding_rows, 1);
  EXPECT_EQ(Rows(p, 0, 3).padding_rows, 0);
  EXPECT_THROW(Rows(t, 2, 4), std::out_of_range);
  EXPECT_THROW(ConcatRows({t, Cols(t, 0, 1)}), std::invalid_argument);
}

TEST(TensorTest, ValuesAreDeterministicAndAvoidSentinels) {
  std::set<std::uint16_t> seen;
  for (std::int32_t k = 0; k < 4; ++k) {
    for (std::int64_t i = 0; i < 20000; ++i) {
      const std::uint16_t v = ElementValue(k, i);
      ASSERT_NE(v, 0);
      ASSERT_NE(v, kMegatronPadValue);
      EXPECT_EQ(v, ElementValue(k, i));
      seen.insert(v);
    }
  }
  EXPECT_GT(seen.size(), 44000u);  // 80000 uniform draws over 16 bits: ~46200 distinct
  // Neighbouring tensors differ element by element (almost everywhere).
  int same = 0;
  for (std::int64_t i = 0; i < 1000; ++i) same += ElementValue(3, i) == ElementValue(4, i);
  EXPECT_LT(same, 5);
}

// Megatron: per query group [q heads of the group; k; v], TP splits whole groups.
TEST(ReferenceMegatronTest, LinearQkvInterleavesPerGroup) {
  const ModelConfig m = TinyLlama();
  const Tensor q = Full(m, "model.layers.1.self_attn.q_proj.weight");  // [8, 8]
  const Tensor k = Full(m, "model.layers.1.self_attn.k_proj.weight");  // [4, 8]
  const Tensor v = Full(m, "model.layers.1.self_attn.v_proj.weight");
  const std::string name = "decoder.layers.1.self_attention.linear_qkv.weight";

  const ShardMap tp1 = ReferenceMegatronShards(m, Train({.tp = 1}), 0);
  EXPECT_EQ(Get(tp1, name), RowsOf({{&q, 0},
                                    {&q, 1},
                                    {&q, 2},
                                    {&q, 3},
                                    {&k, 0},
                                    {&k, 1},
                                    {&v, 0},
                                    {&v, 1},
                                    {&q, 4},
                                    {&q, 5},
                                    {&q, 6},
                                    {&q, 7},
                                    {&k, 2},
                                    {&k, 3},
                                    {&v, 2},
                                    {&v, 3}}));
  const TrainLayout tp2 = Train({.tp = 2});
  EXPECT_EQ(Get(ReferenceMegatronShards(m, tp2, 0), name),
            RowsOf({{&q, 0}, {&q, 1}, {&q, 2}, {&q, 3}, {&k, 0}, {&k, 1}, {&v, 0}, {&v, 1}}));
  EXPECT_EQ(Get(ReferenceMegatronShards(m, tp2, 1), name),
            RowsOf({{&q, 4}, {&q, 5}, {&q, 6}, {&q, 7}, {&k, 2}, {&k, 3}, {&v, 2}, {&v, 3}}));
  // tp must divide the query groups in Megatron.
  EXPECT_THROW(ReferenceMegatronShards(m, Train({.tp = 4}), 0), std::invalid_argument);
}

TEST(ReferenceVllmTest, QkvProjConcatenatesAndReplicatesKvHeads) {
  const ModelConfig m = TinyLlama();
  const Tensor q = Full(m, "model.layers.0.self_attn.q_proj.weight");
  const Tensor k = Full(m, "model.layers.0.self_attn.k_proj.weight");
  const Tensor v = Full(m, "model.layers.0.self_attn.v_proj.weight");
  const std::string name = "model.layers.0.self_attn.qkv_proj.weight";

  EXPECT_EQ(Get(ReferenceVllmShards(m, {.tp = 1}, 0), name), ConcatRows({q, k, v}));
  // tp 2: one query group per rank, [Q_r; K_r; V_r].
  EXPECT_EQ(Get(ReferenceVllmShards(m, {.tp = 2}, 1), name),
            RowsOf({{&q, 4}, {&q, 5}, {&q, 6}, {&q, 7}, {&k, 2}, {&k, 3}, {&v, 2}, {&v, 3}}));
  // tp 4 > 2 KV heads: rank r holds q head r and KV head r / 2.
  for (std::int64_t r = 0; r < 4; ++r) {
    const std::int64_t kv = r / 2;
    EXPECT_EQ(Get(ReferenceVllmShards(m, {.tp = 4}, r), name), RowsOf({{&q, 2 * r},
                                                                       {&q, 2 * r + 1},
                                                                       {&k, 2 * kv},
                                                                       {&k, 2 * kv + 1},
                                                                       {&v, 2 * kv},
                                                                       {&v, 2 * kv + 1}}))
        << "rank " << r;
  }
  EXPECT_THROW(ReferenceVllmShards(m, {.tp = 3}, 0), std::invalid_argument);
}

TEST(ReferenceTest, MlpAndProjections) {
  const ModelConfig m = TinyLlama();
  const Tensor gate = Full(m, "model.layers.0.mlp.gate_proj.weight");  // [8, 8]
  const Tensor up = Full(m, "model.layers.0.mlp.up_proj.weight");
  const Tensor down = Full(m, "model.layers.0.mlp.down_proj.weight");
  const Tensor o = Full(m, "model.layers.0.self_attn.o_proj.weight");
  const ShardMap mg = ReferenceMegatronShards(m, Train({.tp = 2}), 1);
  const ShardMap vl = ReferenceVllmShards(m, {.tp = 2}, 1);
  const Tensor fc1 = ConcatRows({Rows(gate, 4, 8), Rows(up, 4, 8)});
  EXPECT_EQ(Get(mg, "decoder.layers.0.mlp.linear_fc1.weight"), fc1);
  EXPECT_EQ(Get(vl, "model.layers.0.mlp.gate_up_proj.weight"), fc1);
  EXPECT_EQ(Get(mg, "decoder.layers.0.mlp.linear_fc2.weight"), Cols(down, 4, 8));
  EXPECT_EQ(Get(vl, "model.layers.0.mlp.down_proj.weight"), Cols(down, 4, 8));
  EXPECT_EQ(Get(mg, "decoder.layers.0.self_attention.linear_proj.weight"), Cols(o, 4, 8));
  EXPECT_EQ(Get(vl, "model.layers.0.self_attn.o_proj.weight"), Cols(o, 4, 8));
  // The fused layernorms.
  EXPECT_EQ(Get(mg, "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight"),
            Full(m, "model.layers.0.input_layernorm.weight"));
  EXPECT_EQ(Get(mg, "decoder.layers.0.mlp.linear_fc1.layer_norm_weight"),
            Full(m, "model.layers.0.post_attention_layernorm.weight"));
  EXPECT_EQ(Get(vl, "model.layers.0.post_attention_layernorm.weight"),
            Full(m, "model.layers.0.post_attention_layernorm.weight"));
}

TEST(ReferenceTest, VocabularyPadding) {
  const ModelConfig m = TinyLlama();  // vocabulary 130
  const Tensor emb = Full(m, "model.embed_tokens.weight");
  // Megatron tp 2: padded to 256, 128 rows per rank; rank 1 holds rows 128, 129.
  const Tensor mg =
      Get(ReferenceMegatronShards(m, Train({.tp = 2}), 1), "embedding.word_embeddings.weight");
  EXPECT_EQ(mg.shape, (std::vector<std::int64_t>{128, 8}));
  EXPECT_EQ(mg.padding_rows, 126);
  EXPECT_EQ(Rows(mg, 0, 2), Rows(emb, 128, 130));
  EXPECT_EQ(mg.at({2, 0}), kMegatronPadValue);
  EXPECT_EQ(mg.at({127, 7}), kMegatronPadValue);
  // vLLM tp 2: padded to 192, 96 rows per rank; rank 1 holds rows 96..129, then zeros.
  const Tensor vl = Get(ReferenceVllmShards(m, {.tp = 2}, 1), "model.embed_tokens.weight");
  EXPECT_EQ(vl.shape, (std::vector<std::int64_t>{96, 8}));
  EXPECT_EQ(vl.padding_rows, 62);
  EXPECT_EQ(Rows(vl, 0, 34), Rows(emb, 96, 130));
  EXPECT_EQ(vl.at({34, 0}), 0);
  EXPECT_EQ(Get(ReferenceVllmShards(m, {.tp = 2}, 1), "lm_head.weight").padding_rows, 62);
  // 192 rows split 4 ways (48 each), not 5 ways (vLLM requires an exact split).
  EXPECT_EQ(ReferenceVllmShards(m, {.tp = 4}, 3).at("model.embed_tokens.weight").padding_rows, 48);
}

TEST(ReferenceMegatronTest, LayersOverVirtualChunksAndRankOrder) {
  ModelConfig m = TinyLlama();
  m.num_layers = 8;
  // pp 2, vpp 2: chunks of 2 layers; chunk v·pp + r on stage r.
  const TrainLayout t = Train({.tp = 2, .pp = 2, .vpp = 2, .dp = 2});
  EXPECT_EQ(LayersOf(m, t, 0), (std::set<std::int64_t>{0, 1, 4, 5}));
  EXPECT_EQ(LayersOf(m, t, 3), (std::set<std::int64_t>{0, 1, 4, 5}));  // tp 1, dp 1
  EXPECT_EQ(LayersOf(m, t, 4), (std::set<std::int64_t>{2, 3, 6, 7}));  // stage 1
  const ShardMap first = ReferenceMegatronShards(m, t, 1);
  EXPECT_TRUE(first.contains("embedding.word_embeddings.weight"));
  EXPECT_FALSE(first.contains("output_layer.weight"));
  const ShardMap last = ReferenceMegatronShards(m, t, 7);
  EXPECT_TRUE(last.contains("decoder.final_layernorm.weight"));
  EXPECT_TRUE(last.contains("output_layer.weight"));
  // Rank 7 = tp 1, dp 1, pp 1: the same tensors as rank 5 (tp 1, dp 0).
  EXPECT_EQ(last, ReferenceMegatronShards(m, t, 5));
  EXPECT_NE(last, ReferenceMegatronShards(m, t, 6));
  // Explicit chunk sizes.
  const TrainLayout uneven{.pp = 2, .layers_per_chunk = {1, 7}};
  EXPECT_EQ(ReferenceMegatronShards(m, uneven, 0).size(), 1u + 6u);  // embedding + layer 0
}

// Megatron-core's uneven pipeline split: 6 layers are not divisible by pp·vpp = 4
// (refused), but the first stage may take 4 of them: its two chunks hold 2 layers,
// the last stage's chunks 1 (get_transformer_layer_offset: rounds of 2 + 1 layers).
TEST(ReferenceMegatronTest, FirstAndLastStageLayers) {
  ModelConfig m = TinyLlama();
  m.num_layers = 6;
  TrainLayout t = Train({.pp = 2, .vpp = 2});
  EXPECT_THROW(ReferenceMegatronShards(m, t, 0), std::invalid_argument);
  t.first_stage_layers = 4;
  EXPECT_EQ(LayersOf(m, t, 0), (std::set<std::int64_t>{0, 1, 3, 4}));
  EXPECT_EQ(LayersOf(m, t, 1), (std::set<std::int64_t>{2, 5}));
  t.first_stage_layers.reset();
  t.last_stage_layers = 4;
  EXPECT_EQ(LayersOf(m, t, 0), (std::set<std::int64_t>{0, 3}));
  EXPECT_EQ(LayersOf(m, t, 1), (std::set<std::int64_t>{1, 2, 4, 5}));
  // pp 4, both given: 1 | 2 | 2 | 1.
  t = Train({.pp = 4});
  t.first_stage_layers = 1;
  t.last_stage_layers = 1;
  EXPECT_EQ(LayersOf(m, t, 0), (std::set<std::int64_t>{0}));
  EXPECT_EQ(LayersOf(m, t, 2), (std::set<std::int64_t>{3, 4}));
  EXPECT_EQ(LayersOf(m, t, 3), (std::set<std::int64_t>{5}));
  // Refused as Megatron-core refuses them, naming the field.
  t.last_stage_layers = 2;  // 3 layers for 2 middle stages
  EXPECT_EQ(ErrorOrFailure([&] {
              ReferenceMegatronShards(m, t, 0);
            }).rfind("train.first_stage_layers: ", 0),
            0u);
  t.first_stage_layers.reset();
  t.last_stage_layers = 0;
  EXPECT_EQ(ErrorOrFailure([&] {
              ReferenceMegatronShards(m, t, 0);
            }).rfind("train.last_stage_layers: ", 0),
            0u);
}

// The verifier's model of Megatron-core (its offset formulas) and the layout's
// chunk sizes agree on every split of up to 9 layers: the same layers on every
// stage, and the same splits refused.
TEST(ReferenceMegatronTest, AgreesWithTheLayoutOnEverySplit) {
  ModelConfig m = TinyLlama();
  int accepted = 0, uneven = 0, refused = 0;
  for (std::int64_t layers = 1; layers <= 9; ++layers) {
    m.num_layers = layers;
    for (std::int64_t pp = 1; pp <= 4; ++pp) {
      for (std::int64_t vpp = 1; vpp <= 3; ++vpp) {
        for (std::int64_t first = -1; first <= layers + 1; ++first) {
          for (std::int64_t last = -1; last <= layers + 1; ++last) {
            TrainLayout t = Train({.pp = pp, .vpp = vpp});
            if (first >= 0) t.first_stage_layers = first;
            if (last >= 0) t.last_stage_layers = last;
            SCOPED_TRACE(::testing::Message() << "layers " << layers << " pp " << pp << " vpp "
                                              << vpp << " first " << first << " last " << last);
            bool fits = true;
            try {
              LayersPerChunk(m, t);
            } catch (const std::invalid_argument&) {
              fits = false;
            }
            if (!fits) {
              EXPECT_THROW(ReferenceMegatronShards(m, t, 0), std::invalid_argument);
              ++refused;
              continue;
            }
            std::set<std::int64_t> all;
            for (std::int64_t r = 0; r < pp; ++r) {
              const std::vector<std::int64_t> stage = StageLayers(m, t, r);
              const std::set<std::int64_t> reference = LayersOf(m, t, r);
              EXPECT_EQ(reference, std::set<std::int64_t>(stage.begin(), stage.end()))
                  << "stage " << r;
              all.insert(reference.begin(), reference.end());
            }
            EXPECT_EQ(static_cast<std::int64_t>(all.size()), layers);
            ++accepted;
            if ((first >= 0 || last >= 0) && layers % (pp * vpp) != 0) ++uneven;
          }
        }
      }
    }
  }
  EXPECT_GT(accepted, 300);  // 348, of which 176 uneven; 7284 refused
  EXPECT_GT(uneven, 150);
  EXPECT_GT(refused, 5000);
}

TEST(ReferenceTest, TiedEmbeddings) {
  ModelConfig m = TinyLlama();
  m.tie_word_embeddings = true;
  const ShardMap pp1 = ReferenceMegatronShards(m, {}, 0);
  EXPECT_FALSE(pp1.contains("output_layer.weight"));
  const TrainLayout pp2 = Train({.pp = 2});
  const ShardMap last = ReferenceMegatronShards(m, pp2, 1);
  ASSERT_TRUE(last.contains("output_layer.weight"));
  EXPECT_EQ(last.at("output_layer.weight"),
            ReferenceMegatronShards(m, pp2, 0).at("embedding.word_embeddings.weight"));
  EXPECT_FALSE(ReferenceVllmShards(m, {}, 0).contains("lm_head.weight"));
}

TEST(ReferenceTest, ExpertsAndRouter) {
  const ModelConfig m = TinyQwen3Moe();  // layers 0 and 2 MoE, 4 experts of FFN 4
  // tp 2, ep 2, etp 1, dp 1: rank 1 is expert rank (etp 0, ep 1): experts 2, 3.
  const TrainLayout t = Train({.tp = 2, .ep = 2});
  const ShardMap mg = ReferenceMegatronShards(m, t, 1);
  const std::string e3 = "decoder.layers.2.mlp.experts.local_experts.3.";
  const Tensor gate3 = Full(m, "model.layers.2.mlp.experts.3.gate_proj.weight");
  const Tensor up3 = Full(m, "model.layers.2.mlp.experts.3.up_proj.weight");
  const Tensor down3 = Full(m, "model.layers.2.mlp.experts.3.down_proj.weight");
  EXPECT_EQ(Get(mg, e3 + "linear_fc1.weight"), ConcatRows({gate3, up3}));
  EXPECT_EQ(Get(mg, e3 + "linear_fc2.weight"), down3);
  EXPECT_FALSE(mg.contains("decoder.layers.2.mlp.experts.local_experts.1.linear_fc1.weight"));
  EXPECT_EQ(Get(mg, "decoder.layers.2.mlp.router.weight"),
            Full(m, "model.layers.2.mlp.gate.weight"));
  EXPECT_TRUE(mg.contains("decoder.layers.2.pre_mlp_layernorm.weight"));
  EXPECT_TRUE(mg.contains("decoder.layers.1.mlp.linear_fc1.layer_norm_weight"));  // dense
  EXPECT_EQ(Get(mg, "decoder.layers.0.self_attention.q_layernorm.weight"),
            Full(m, "model.layers.0.self_attn.q_norm.weight"));
  // etp 2: each expert split in halves of its FFN.
  const ShardMap etp = ReferenceMegatronShards(m, Train({.tp = 2, .etp = 2}), 1);
  EXPECT_EQ(Get(etp, e3 + "linear_fc1.weight"), ConcatRows({Rows(gate3, 2, 4), Rows(up3, 2, 4)}));

  // vLLM without EP: every expert, FFN split by tp; [gate_r; up_r] per expert.
  const ShardMap v_tp = ReferenceVllmShards(m, {.tp = 2}, 1);
  const Tensor& w13 = Get(v_tp, "model.layers.2.mlp.experts.w13_weight");
  EXPECT_EQ(w13.shape, (std::vector<std::int64_t>{4, 4, 8}));
  EXPECT_EQ(Reshape(Rows(w13, 3, 4), {4, 8}), ConcatRows({Rows(gate3, 2, 4), Rows(up3, 2, 4)}));
  const Tensor& w2 = Get(v_tp, "model.layers.2.mlp.experts.w2_weight");
  EXPECT_EQ(w2.shape, (std::vector<std::int64_t>{4, 8, 2}));
  EXPECT_EQ(Reshape(Rows(w2, 3, 4), {8, 2}), Cols(down3, 2, 4));
  // With EP: whole experts, contiguous.
  const ShardMap v_ep = ReferenceVllmShards(m, {.tp = 2, .expert_parallel = true}, 1);
  const Tensor& w13_ep = Get(v_ep, "model.layers.2.mlp.experts.w13_weight");
  EXPECT_EQ(w13_ep.shape, (std::vector<std::int64_t>{2, 8, 8}));
  EXPECT_EQ(Reshape(Rows(w13_ep, 1, 2), {8, 8}), ConcatRows({gate3, up3}));
  // Round robin: rank 1 holds experts 1 and 3.
  const ShardMap v_rr =
      ReferenceVllmShards(m, {.tp = 2, .expert_parallel = true, .round_robin_experts = true}, 1);
  const Tensor& w2_rr = Get(v_rr, "model.layers.2.mlp.experts.w2_weight");
  EXPECT_EQ(Reshape(Rows(w2_rr, 0, 1), {8, 4}),
            Full(m, "model.layers.2.mlp.experts.1.down_proj.weight"));
  EXPECT_EQ(Reshape(Rows(w2_rr, 1, 2), {8, 4}), down3);
}

TEST(ReferenceVllmTest, UnevenExpertsGoToTheFirstRanks) {
  ModelConfig m = TinyQwen3Moe();
  m.num_experts = 5;
  const InferLayout in{.tp = 2, .expert_parallel = true};
  EXPECT_EQ(ReferenceVllmShards(m, in, 0).at("model.layers.0.mlp.experts.w2_weight").shape[0], 3);
  const ShardMap rank1 = ReferenceVllmShards(m, in, 1);
  const Tensor& w2 = rank1.at("model.layers.0.mlp.experts.w2_weight");
  ASSERT_EQ(w2.shape[0], 2);
  EXPECT_EQ(Reshape(Rows(w2, 0, 1), {8, 4}),
            Full(m, "model.layers.0.mlp.experts.3.down_proj.weight"));
}

TEST(ReferenceTest, DeepseekMla) {
  const ModelConfig m = TinyDeepseek();
  const std::string a = "model.layers.1.self_attn.";
  const ShardMap vl = ReferenceVllmShards(m, {.tp = 2}, 1);
  EXPECT_EQ(Get(vl, a + "fused_qkv_a_proj.weight"),
            ConcatRows({Full(m, a + "q_a_proj.weight"), Full(m, a + "kv_a_proj_with_mqa.weight")}));
  // Head 1 of 2: rows [4, 8) of q_b (nope 2 + rope 2) and of kv_b (k_nope 2 + v 2).
  EXPECT_EQ(Get(vl, a + "q_b_proj.weight"), Rows(Full(m, a + "q_b_proj.weight"), 4, 8));
  EXPECT_EQ(Get(vl, a + "kv_b_proj.weight"), Rows(Full(m, a + "kv_b_proj.weight"), 4, 8));
  EXPECT_EQ(Get(vl, a + "o_proj.weight"), Cols(Full(m, a + "o_proj.weight"), 2, 4));
  EXPECT_TRUE(vl.contains("model.layers.1.mlp.gate.e_score_correction_bias"));
  EXPECT_EQ(Get(vl, "model.layers.1.mlp.shared_experts.gate_up_proj.weight").shape,
            (std::vector<std::int64_t>{4, 8}));
  EXPECT_TRUE(vl.contains("model.layers.0.mlp.gate_up_proj.weight"));  // first dense layer

  const ShardMap mg = ReferenceMegatronShards(m, Train({.tp = 2, .ep = 2}), 1);
  const std::string s = "decoder.layers.1.self_attention.";
  EXPECT_EQ(Get(mg, s + "linear_q_up_proj.weight"), Get(vl, a + "q_b_proj.weight"));
  EXPECT_EQ(Get(mg, s + "linear_kv_up_proj.weight"), Get(vl, a + "kv_b_proj.weight"));
  EXPECT_EQ(Get(mg, s + "linear_q_up_proj.layer_norm_weight"), Full(m, a + "q_a_layernorm.weight"));
  EXPECT_EQ(Get(mg, s + "linear_kv_down_proj.weight"), Full(m, a + "kv_a_proj_with_mqa.weight"));
  EXPECT_TRUE(mg.contains("decoder.layers.1.input_layernorm.weight"));
  EXPECT_TRUE(mg.contains("decoder.layers.1.mlp.router.expert_bias"));
  EXPECT_TRUE(mg.contains("decoder.layers.1.mlp.shared_experts.linear_fc1.weight"));
  EXPECT_TRUE(mg.contains("decoder.layers.1.mlp.experts.local_experts.2.linear_fc1.weight"));
}

// ---------------------------------------------------------------------------------
// A plan built by matching values: every destination segment of `width` elements (along
// the last dim) is taken from a source segment with the same content. Independent of
// layout.cc and plan.cc.

std::int64_t ElementBytesOf(const ModelConfig& m, const std::string& name) {
  const bool fp32 = name.ends_with("e_score_correction_bias") || name.ends_with("expert_bias");
  return fp32 ? 4 : m.dtype_bytes;
}

std::vector<Range> SegmentSlice(const std::vector<std::int64_t>& shape, std::int64_t offset,
                                std::int64_t width) {
  std::vector<Range> slice(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    const std::int64_t i = offset % shape[d];
    offset /= shape[d];
    slice[d] = d + 1 == shape.size() ? Range{i, i + width} : Range{i, i + 1};
  }
  return slice;
}

ReshardPlan MatchingPlan(const ModelConfig& m, const ReshardOptions& o, std::int64_t width) {
  ReshardPlan plan;
  std::unordered_map<std::string, std::int32_t> ids;
  auto id = [&](const std::string& name) {
    auto [it, inserted] = ids.emplace(name, static_cast<std::int32_t>(plan.param_names.size()));
    if (inserted) plan.param_names.push_back(name);
    return it->second;
  };
  struct Source {
    std::int64_t rank;
    std::string name;
    std::vector<std::int64_t> shape;
    std::int64_t offset;
  };
  std::unordered_map<std::string, Source> by_content;
  auto key = [&](const std::vector<std::uint16_t>& data, std::int64_t offset) {
    return std::string(reinterpret_cast<const char*>(data.data() + offset),
                       static_cast<std::size_t>(width) * 2);
  };
  const std::int64_t trainers = o.train.world_size();
  for (std::int64_t rank = 0; rank < trainers; ++rank) {
    for (const auto& [name, t] : ReferenceMegatronShards(m, o.train, rank)) {
      EXPECT_EQ(t.shape.back() % width, 0) << name;
      const std::int64_t real = t.PaddingBegin() * t.RowElements();
      for (std::int64_t off = 0; off < real; off += width) {
        by_content.try_emplace(key(t.data, off), Source{rank, name, t.shape, off});
      }
    }
  }
  for (std::int64_t r = 0; r < o.infer.tp; ++r) {
    std::vector<std::int64_t> dst;
    for (std::int64_t rep = 0; rep < o.infer.replicas; ++rep) dst.push_back(EngineRank(o, rep, r));
    for (const auto& [name, t] : ReferenceVllmShards(m, o.infer, r)) {
      const std::int64_t real = t.PaddingBegin() * t.RowElements();
      for (std::int64_t off = 0; off < real; off += width) {
        auto it = by_content.find(key(t.data, off));
        if (it == by_content.end()) {
          ADD_FAILURE() << "no source for " << name << " offset " << off;
          continue;
        }
        Transfer x;
        x.src_rank = it->second.rank;
        x.src_param = id(it->second.name);
        x.src_slice = SegmentSlice(it->second.shape, it->second.offset, width);
        x.dst_ranks = dst;
        x.dst_param = id(name);
        x.dst_slice = SegmentSlice(t.shape, off, width);
        x.bytes = width * ElementBytesOf(m, name);
        plan.bytes_moved += x.bytes;
        plan.bytes_received += x.bytes * static_cast<std::int64_t>(dst.size());
        plan.transfers.push_back(std::move(x));
      }
    }
  }
  plan.num_buckets = 1;
  plan.trainer_ranks = trainers;
  plan.engine_ranks = o.infer.tp * o.infer.replicas;
  return plan;
}

ReshardOptions Options(Parallel train, InferLayout infer) {
  ReshardOptions o;
  o.train = Train(train);
  o.infer = infer;
  o.bucket_bytes = std::int64_t{1} << 30;
  return o;
}

TEST(VerifyPlanTest, MatchingPlansPass) {
  struct Case {
    ModelConfig model;
    ReshardOptions options;
  };
  ModelConfig tied = TinyLlama();
  tied.tie_word_embeddings = true;
  const std::vector<Case> cases = {
      {TinyLlama(), Options({.tp = 2, .pp = 2}, {.tp = 4, .replicas = 2})},
      {tied, Options({.tp = 1, .pp = 2, .dp = 2}, {.tp = 2})},
      {TinyQwen3Moe(), Options({.tp = 2, .ep = 2, .dp = 2}, {.tp = 2, .expert_parallel = true})},
      {TinyDeepseek(), Options({.tp = 2, .ep = 2, .etp = 2, .dp = 2}, {.tp = 2, .replicas = 2})},
  };
  for (const Case& c : cases) {
    const ReshardPlan plan = MatchingPlan(c.model, c.options, 2);
    const VerifyResult r = VerifyPlan(c.model, c.options, plan);
    EXPECT_TRUE(r.ok) << FamilyName(c.model.family) << ": "
                      << (r.problems.empty() ? "" : r.problems[0]);
    EXPECT_EQ(r.transfers, static_cast<std::int64_t>(plan.transfers.size()));
  }
}

TEST(VerifyPlanTest, CorruptedPlansFail) {
  const ModelConfig m = TinyLlama();
  const ReshardOptions o = Options({.tp = 2}, {.tp = 4, .replicas = 2});
  const ReshardPlan good = MatchingPlan(m, o, 2);
  ASSERT_TRUE(VerifyPlan(m, o, good).ok);

  {  // A transfer removed: its elements are never written on both replicas.
    ReshardPlan p = good;
    const Transfer x = p.transfers[5];
    p.transfers.erase(p.transfers.begin() + 5);
    p.bytes_moved -= x.bytes;
    p.bytes_received -= 2 * x.bytes;
    const VerifyResult r = VerifyPlan(m, o, p);
    EXPECT_FALSE(r.ok);
    EXPECT_EQ(r.unwritten_elements, 4);
    EXPECT_EQ(r.mismatched_elements, 0);
    EXPECT_EQ(r.bookkeeping_errors, 0);
    ASSERT_FALSE(r.problems.empty());
    EXPECT_NE(r.problems[0].find("never written"), std::string::npos) << r.problems[0];
  }
  {  // A source slice shifted by one column: wrong values.
    ReshardPlan p = good;
    for (Transfer& x : p.transfers) {
      if (p.param_names[x.src_param] == "decoder.layers.0.self_attention.linear_qkv.weight" &&
          x.src_slice.back().begin == 2) {
        x.src_slice.back().begin += 1;
        x.src_slice.back().end += 1;
        break;
      }
    }
    const VerifyResult r = VerifyPlan(m, o, p);
    EXPECT_FALSE(r.ok);
    EXPECT_EQ(r.mismatched_elements, 4);  // 2 elements on 2 replicas
    EXPECT_EQ(r.bad_transfers, 0);
  }
  {  // A destination slice shifted by one row: one row written twice, one never.
    ReshardPlan p = good;
    for (Transfer& x : p.transfers) {
      if (p.param_names[x.dst_param] == "model.layers.1.self_attn.o_proj.weight" &&
          x.dst_slice[0].begin == 3) {
        x.dst_slice[0] = {4, 5};
        break;
      }
    }
    const VerifyResult r = VerifyPlan(m, o, p);
    EXPECT_FALSE(r.ok);
    EXPECT_GT(r.double_written_elements, 0);
    EXPECT_GT(r.unwritten_elements, 0);
  }
  {  // A slice outside the source tensor.
    ReshardPlan p = good;
    p.transfers[0].src_slice.back() = {7, 9};
    const VerifyResult r = VerifyPlan(m, o, p);
    EXPECT_FALSE(r.ok);
    EXPECT_EQ(r.bad_transfers, 1);
  }
  {  // A read of Megatron's vocabulary padding (rank 1 holds rows 128, 129 then padding).
    ReshardPlan p = good;
    for (Transfer& x : p.transfers) {
      if (p.param_names[x.src_param] == "embedding.word_embeddings.weight" && x.src_rank == 1) {
        x.src_slice[0] = {5, 6};
        break;
      }
    }
    const VerifyResult r = VerifyPlan(m, o, p);
    EXPECT_FALSE(r.ok);
    EXPECT_EQ(r.padding_read_elements, 2);
  }
  {  // Wrong byte totals and an unknown engine rank.
    ReshardPlan p = good;
    p.bytes_moved += 2;
    p.transfers[1].dst_ranks.push_back(100);
    const VerifyResult r = VerifyPlan(m, o, p);
    EXPECT_FALSE(r.ok);
    EXPECT_GE(r.bookkeeping_errors, 2);  // bytes_moved, bytes_received
    EXPECT_EQ(r.bad_transfers, 1);
  }
}

// ---------------------------------------------------------------------------------
// The real planner.

TEST(VerifyPlanTest, PlannerPlansPass) {
  ModelConfig tied = TinyLlama();
  tied.tie_word_embeddings = true;
  ModelConfig qwen2 = TinyLlama();
  qwen2.family = Family::kQwen2;
  qwen2.qkv_bias = true;
  struct Case {
    std::string label;
    ModelConfig model;
    ReshardOptions options;
  };
  std::vector<Case> cases = {
      {"llama tp2 pp2 -> tp4 x2", TinyLlama(),
       Options({.tp = 2, .pp = 2}, {.tp = 4, .replicas = 2})},
      {"qwen2 tp2 dp2 -> tp1 x3", qwen2, Options({.tp = 2, .dp = 2}, {.tp = 1, .replicas = 3})},
      {"tied pp2 vpp1 -> tp2", tied, Options({.pp = 2, .dp = 2}, {.tp = 2})},
      {"qwen3-moe ep2 -> ep2", TinyQwen3Moe(),
       Options({.tp = 2, .ep = 2, .dp = 2}, {.tp = 2, .replicas = 2, .expert_parallel = true})},
      {"qwen3-moe etp2 -> round robin", TinyQwen3Moe(),
       Options({.tp = 2, .etp = 2, .dp = 1},
               {.tp = 2, .expert_parallel = true, .round_robin_experts = true})},
      {"deepseek tp2 ep2 pp3 -> tp2", TinyDeepseek(),
       Options({.tp = 2, .pp = 3, .ep = 2}, {.tp = 2, .replicas = 2})},
  };
  ReshardOptions colocated = Options({.tp = 2, .pp = 2, .dp = 2}, {.tp = 2, .replicas = 4});
  colocated.topology.colocated = true;
  colocated.topology.gpus_per_node = 4;
  cases.push_back({"llama colocated", TinyLlama(), colocated});
  ReshardOptions small_buckets = Options({.tp = 2, .pp = 2}, {.tp = 4, .replicas = 2});
  small_buckets.bucket_bytes = 256;
  cases.push_back({"llama small buckets", TinyLlama(), small_buckets});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.label);
    const ReshardPlan plan = PlanReshard(c.model, c.options);
    const VerifyResult r = VerifyPlan(c.model, c.options, plan);
    std::string problems;
    for (const std::string& p : r.problems) problems += "\n  " + p;
    EXPECT_TRUE(r.ok) << "mismatched " << r.mismatched_elements << ", double "
                      << r.double_written_elements << ", unwritten " << r.unwritten_elements
                      << ", bad transfers " << r.bad_transfers << ", bookkeeping "
                      << r.bookkeeping_errors << problems;
  }
}

}  // namespace
}  // namespace rlsched::rollout
