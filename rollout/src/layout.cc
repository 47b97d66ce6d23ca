// Megatron-core and vLLM shards as pieces of the full (Hugging Face) tensors.

#include "rlsched/rollout/layout.h"

#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "layout_internal.h"
#include "rlsched/common/check.h"
#include "rlsched/common/error.h"

namespace rlsched::rollout {
namespace {

// Whether some layer has a dense MLP of intermediate_size.
bool HasDenseMlp(const ModelConfig& m) { return !m.is_moe() || m.NumMoeLayers() < m.num_layers; }

}  // namespace

namespace internal {
namespace {

std::string L(std::int64_t layer) { return "model.layers." + std::to_string(layer) + "."; }
std::string ML(std::int64_t layer) { return "decoder.layers." + std::to_string(layer) + "."; }

// Builds one LocalParam piece by piece.
class ParamBuilder {
 public:
  ParamBuilder(const TensorIndex& index, std::vector<LocalParam>& out, std::string name,
               std::vector<std::int64_t> shape)
      : index_(index), out_(out) {
    out_.push_back({std::move(name), std::move(shape), {}});
  }
  // Room for `pieces` pieces in all.
  ParamBuilder& Reserve(std::size_t pieces) {
    out_.back().pieces.reserve(pieces);
    return *this;
  }
  // Rows [r0, r1) (all columns) of full tensor `t` at local (leading..., row, 0).
  ParamBuilder& Rows(std::int32_t t, std::int64_t r0, std::int64_t r1,
                     std::vector<std::int64_t> offset) {
    if (r1 <= r0) return *this;
    out_.back().pieces.push_back({t, r0, r1, 0, index_.tensors()[t].cols, std::move(offset)});
    return *this;
  }
  ParamBuilder& Rows(const std::string& name, std::int64_t r0, std::int64_t r1,
                     std::vector<std::int64_t> offset) {
    return Rows(index_[name], r0, r1, std::move(offset));
  }
  // Columns [c0, c1) (all rows) of full tensor `t` at local (leading..., 0, 0).
  ParamBuilder& Cols(std::int32_t t, std::int64_t c0, std::int64_t c1,
                     std::vector<std::int64_t> offset) {
    out_.back().pieces.push_back({t, 0, index_.tensors()[t].rows, c0, c1, std::move(offset)});
    return *this;
  }
  ParamBuilder& Cols(const std::string& name, std::int64_t c0, std::int64_t c1,
                     std::vector<std::int64_t> offset) {
    return Cols(index_[name], c0, c1, std::move(offset));
  }
  // The whole tensor `name`, replicated.
  ParamBuilder& Whole(const std::string& name) {
    const std::int32_t t = index_[name];
    const FullTensor& f = index_.tensors()[t];
    std::vector<std::int64_t> offset(out_.back().shape.size(), 0);
    out_.back().pieces.push_back({t, 0, f.rows, 0, f.cols, std::move(offset)});
    return *this;
  }

 private:
  const TensorIndex& index_;
  std::vector<LocalParam>& out_;
};

// A replicated parameter holding the whole tensor `hf` under `name`.
void Replicated(const TensorIndex& index, std::vector<LocalParam>& out, std::string name,
                const std::string& hf) {
  const FullTensor& f = index.tensors()[index[hf]];
  std::vector<std::int64_t> shape =
      f.is_vector ? std::vector<std::int64_t>{f.rows} : std::vector<std::int64_t>{f.rows, f.cols};
  ParamBuilder(index, out, std::move(name), std::move(shape)).Whole(hf);
}

// A vocabulary-parallel table: rows [rank·per, (rank+1)·per) of a table padded to
// per·size rows, the real rows below `vocab`.
void VocabRows(const TensorIndex& index, std::vector<LocalParam>& out, std::string name,
               const std::string& hf, std::int64_t padded, std::int64_t size, std::int64_t rank,
               std::int64_t hidden) {
  const std::int64_t per = padded / size;
  const std::int64_t vocab = index.tensors()[index[hf]].rows;
  const std::int64_t r0 = std::min(rank * per, vocab);
  const std::int64_t r1 = std::min((rank + 1) * per, vocab);
  ParamBuilder(index, out, std::move(name), {per, hidden}).Rows(hf, r0, r1, {0, 0});
}

// [gate_r; up_r] of an MLP with intermediate size `ffn` split `size` ways, at the
// given leading index (experts) or none.
void GateUp(ParamBuilder& b, std::int32_t gate, std::int64_t ffn, std::int64_t size,
            std::int64_t rank, const std::vector<std::int64_t>& lead) {
  const std::int64_t per = ffn / size;
  auto at = [&](std::int64_t row) {
    std::vector<std::int64_t> o;
    o.reserve(lead.size() + 2);
    o.assign(lead.begin(), lead.end());
    o.push_back(row);
    o.push_back(0);
    return o;
  };
  b.Rows(gate, rank * per, (rank + 1) * per, at(0));
  b.Rows(gate + 1, rank * per, (rank + 1) * per, at(per));  // up_proj follows gate_proj
}

}  // namespace

TensorIndex::TensorIndex(const ModelConfig& model) : tensors_(HfTensors(model)) {
  index_.reserve(tensors_.size());
  for (std::size_t i = 0; i < tensors_.size(); ++i) {
    index_.emplace(tensors_[i].name, static_cast<std::int32_t>(i));
  }
  for (std::int64_t layer = 0; layer < model.num_layers; ++layer) {
    auto it = index_.find(L(layer) + "mlp.experts.0.gate_proj.weight");
    expert_base_.push_back(it == index_.end() ? -1 : it->second);
  }
}

std::int32_t TensorIndex::operator[](const std::string& name) const {
  auto it = index_.find(name);
  RLSCHED_CHECK(it != index_.end());  // a known tensor name
  return it->second;
}

namespace {

// What a layout's shards are built from: the model, its tensors, the list being built,
// the tensor-parallel size and rank, the hidden size.
struct ShardContext {
  const ModelConfig& m;
  const TensorIndex& index;
  std::vector<LocalParam>& out;
  std::int64_t tp, t, h;

  // The parts of one layer, below (Megatron's: hl, ha the HF layer and attention
  // prefixes, ml, ma Megatron's; vLLM's: l, a its layer and attention prefixes).
  void MegatronMla(const std::string& hl, const std::string& ha, const std::string& ml,
                   const std::string& ma) const;
  void MegatronQkv(const std::string& hl, const std::string& ha, const std::string& ma) const;
  void MegatronMlp(std::int64_t layer, const std::string& hl, const std::string& ml) const;
  void VllmMla(const std::string& a) const;
  void VllmQkv(const std::string& a) const;
  void VllmExperts(const InferLayout& infer, std::int64_t layer, const std::string& l) const;
  void VllmMlp(const InferLayout& infer, std::int64_t layer, const std::string& l) const;
};

// Megatron's MLA attention of one layer (hl, ha: the HF layer and attention prefixes;
// ml, ma: Megatron's).
void ShardContext::MegatronMla(const std::string& hl, const std::string& ha, const std::string& ml,
                               const std::string& ma) const {
  const std::int64_t heads = m.num_heads / tp;
  const std::int64_t qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
  const std::int64_t kv = m.qk_nope_head_dim + m.v_head_dim;
  Replicated(index, out, ml + "input_layernorm.weight", hl + "input_layernorm.weight");
  if (m.q_lora_rank > 0) {
    Replicated(index, out, ma + "linear_q_down_proj.weight", ha + "q_a_proj.weight");
    Replicated(index, out, ma + "linear_q_up_proj.layer_norm_weight", ha + "q_a_layernorm.weight");
    ParamBuilder(index, out, ma + "linear_q_up_proj.weight", {heads * qk, m.q_lora_rank})
        .Rows(ha + "q_b_proj.weight", t * heads * qk, (t + 1) * heads * qk, {0, 0});
  } else {
    ParamBuilder(index, out, ma + "linear_q_proj.weight", {heads * qk, h})
        .Rows(ha + "q_proj.weight", t * heads * qk, (t + 1) * heads * qk, {0, 0});
  }
  Replicated(index, out, ma + "linear_kv_down_proj.weight", ha + "kv_a_proj_with_mqa.weight");
  Replicated(index, out, ma + "linear_kv_up_proj.layer_norm_weight", ha + "kv_a_layernorm.weight");
  ParamBuilder(index, out, ma + "linear_kv_up_proj.weight", {heads * kv, m.kv_lora_rank})
      .Rows(ha + "kv_b_proj.weight", t * heads * kv, (t + 1) * heads * kv, {0, 0});
  const std::int64_t o = heads * m.v_head_dim;
  ParamBuilder(index, out, ma + "linear_proj.weight", {h, o})
      .Cols(ha + "o_proj.weight", t * o, (t + 1) * o, {0, 0});
}

// Megatron's fused QKV attention of one layer: per query group [q heads of the group; k;
// v], whole groups per rank.
void ShardContext::MegatronQkv(const std::string& hl, const std::string& ha,
                               const std::string& ma) const {
  const std::int64_t d = m.head_dim;
  const std::int64_t groups = m.num_kv_heads / tp;
  const std::int64_t q_per_group = m.num_heads / m.num_kv_heads;
  const std::int64_t group_rows = (q_per_group + 2) * d;
  Replicated(index, out, ma + "linear_qkv.layer_norm_weight", hl + "input_layernorm.weight");
  for (const char* kind : {"weight", "bias"}) {
    const bool bias = kind[0] == 'b';
    if (bias && !m.qkv_bias) continue;
    std::vector<std::int64_t> shape{groups * group_rows};
    if (!bias) shape.push_back(h);
    ParamBuilder b(index, out, ma + "linear_qkv." + kind, std::move(shape));
    for (std::int64_t j = 0; j < groups; ++j) {
      const std::int64_t g = t * groups + j, base = j * group_rows;
      auto at = [&](std::int64_t row) {
        return bias ? std::vector<std::int64_t>{row} : std::vector<std::int64_t>{row, 0};
      };
      b.Rows(ha + "q_proj." + kind, g * q_per_group * d, (g + 1) * q_per_group * d, at(base));
      b.Rows(ha + "k_proj." + kind, g * d, (g + 1) * d, at(base + q_per_group * d));
      b.Rows(ha + "v_proj." + kind, g * d, (g + 1) * d, at(base + (q_per_group + 1) * d));
    }
  }
  if (m.qk_norm) {
    Replicated(index, out, ma + "q_layernorm.weight", ha + "q_norm.weight");
    Replicated(index, out, ma + "k_layernorm.weight", ha + "k_norm.weight");
  }
  const std::int64_t o = m.num_heads * d / tp;
  ParamBuilder(index, out, ma + "linear_proj.weight", {h, o})
      .Cols(ha + "o_proj.weight", t * o, (t + 1) * o, {0, 0});
}

// Megatron's MLP of one layer: the router and shared experts of a MoE layer (the
// experts are MegatronExpertShards'), or the dense MLP.
void ShardContext::MegatronMlp(std::int64_t layer, const std::string& hl,
                               const std::string& ml) const {
  const std::string norm = hl + "post_attention_layernorm.weight";
  auto dense_mlp = [&](const std::string& mprefix, const std::string& hprefix, std::int64_t ffn) {
    const std::int64_t per = ffn / tp;
    ParamBuilder fc1(index, out, mprefix + "linear_fc1.weight", {2 * per, h});
    GateUp(fc1, index[hprefix + "gate_proj.weight"], ffn, tp, t, {});
    ParamBuilder(index, out, mprefix + "linear_fc2.weight", {h, per})
        .Cols(hprefix + "down_proj.weight", t * per, (t + 1) * per, {0, 0});
  };
  if (m.IsMoeLayer(layer)) {
    Replicated(index, out, ml + "pre_mlp_layernorm.weight", norm);
    Replicated(index, out, ml + "mlp.router.weight", hl + "mlp.gate.weight");
    if (m.router_bias) {
      Replicated(index, out, ml + "mlp.router.expert_bias",
                 hl + "mlp.gate.e_score_correction_bias");
    }
    if (m.num_shared_experts > 0) {
      dense_mlp(ml + "mlp.shared_experts.", hl + "mlp.shared_experts.",
                m.num_shared_experts * m.moe_intermediate_size);
    }
  } else {
    Replicated(index, out, ml + "mlp.linear_fc1.layer_norm_weight", norm);
    dense_mlp(ml + "mlp.", hl + "mlp.", m.intermediate_size);
  }
}

}  // namespace

std::vector<LocalParam> MegatronDenseShards(const ModelConfig& m, const TensorIndex& index,
                                            const TrainLayout& train, std::int64_t pp_rank,
                                            std::int64_t tp_rank) {
  std::vector<LocalParam> out;
  const std::int64_t tp = train.tp, t = tp_rank, h = m.hidden_size;
  const bool first = pp_rank == 0, last = pp_rank == train.pp - 1;
  const std::int64_t vocab_padded = MegatronPaddedVocab(m.vocab_size, tp);
  if (first) {
    VocabRows(index, out, "embedding.word_embeddings.weight", "model.embed_tokens.weight",
              vocab_padded, tp, t, h);
  }
  for (std::int64_t layer : StageLayers(m, train, pp_rank)) {
    const std::string hl = L(layer), ha = hl + "self_attn.", ml = ML(layer),
                      ma = ml + "self_attention.";
    const ShardContext c{m, index, out, tp, t, h};
    if (m.is_mla()) {
      c.MegatronMla(hl, ha, ml, ma);
    } else {
      c.MegatronQkv(hl, ha, ma);
    }
    c.MegatronMlp(layer, hl, ml);
  }
  if (last) {
    Replicated(index, out, "decoder.final_layernorm.weight", "model.norm.weight");
    if (!m.tie_word_embeddings) {
      VocabRows(index, out, "output_layer.weight", "lm_head.weight", vocab_padded, tp, t, h);
    } else if (train.pp * train.vpp > 1) {
      // The last model chunk, when it is not the first, keeps its own copy of the
      // tied embedding.
      VocabRows(index, out, "output_layer.weight", "model.embed_tokens.weight", vocab_padded, tp, t,
                h);
    }
  }
  return out;
}

std::vector<LocalParam> MegatronExpertShards(const ModelConfig& m, const TensorIndex& index,
                                             const TrainLayout& train, std::int64_t pp_rank,
                                             std::int64_t ep_rank, std::int64_t etp_rank) {
  std::vector<LocalParam> out;
  if (!m.is_moe()) return out;
  const std::int64_t local = m.num_experts / train.ep;
  const std::int64_t per = m.moe_intermediate_size / train.etp, h = m.hidden_size;
  for (std::int64_t layer : StageLayers(m, train, pp_rank)) {
    if (!m.IsMoeLayer(layer)) continue;
    for (std::int64_t e = ep_rank * local; e < (ep_rank + 1) * local; ++e) {
      const std::string mp = ML(layer) + "mlp.experts.local_experts." + std::to_string(e) + ".";
      const std::int32_t gate = index.ExpertGate(layer, e);
      ParamBuilder fc1(index, out, mp + "linear_fc1.weight", {2 * per, h});
      GateUp(fc1, gate, m.moe_intermediate_size, train.etp, etp_rank, {});
      ParamBuilder(index, out, mp + "linear_fc2.weight", {h, per})
          .Cols(gate + 2, etp_rank * per, (etp_rank + 1) * per, {0, 0});
    }
  }
  return out;
}

namespace {

// vLLM's MLA attention of one layer (a: its attention prefix).
void ShardContext::VllmMla(const std::string& a) const {
  const std::int64_t heads = m.num_heads / tp;
  const std::int64_t qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
  const std::int64_t kv = m.qk_nope_head_dim + m.v_head_dim;
  const std::int64_t kv_a = m.kv_lora_rank + m.qk_rope_head_dim;
  if (m.q_lora_rank > 0) {
    ParamBuilder(index, out, a + "fused_qkv_a_proj.weight", {m.q_lora_rank + kv_a, h})
        .Rows(a + "q_a_proj.weight", 0, m.q_lora_rank, {0, 0})
        .Rows(a + "kv_a_proj_with_mqa.weight", 0, kv_a, {m.q_lora_rank, 0});
    Replicated(index, out, a + "q_a_layernorm.weight", a + "q_a_layernorm.weight");
    ParamBuilder(index, out, a + "q_b_proj.weight", {heads * qk, m.q_lora_rank})
        .Rows(a + "q_b_proj.weight", t * heads * qk, (t + 1) * heads * qk, {0, 0});
  } else {
    ParamBuilder(index, out, a + "q_proj.weight", {heads * qk, h})
        .Rows(a + "q_proj.weight", t * heads * qk, (t + 1) * heads * qk, {0, 0});
    Replicated(index, out, a + "kv_a_proj_with_mqa.weight", a + "kv_a_proj_with_mqa.weight");
  }
  Replicated(index, out, a + "kv_a_layernorm.weight", a + "kv_a_layernorm.weight");
  ParamBuilder(index, out, a + "kv_b_proj.weight", {heads * kv, m.kv_lora_rank})
      .Rows(a + "kv_b_proj.weight", t * heads * kv, (t + 1) * heads * kv, {0, 0});
  const std::int64_t o = heads * m.v_head_dim;
  ParamBuilder(index, out, a + "o_proj.weight", {h, o})
      .Cols(a + "o_proj.weight", t * o, (t + 1) * o, {0, 0});
}

// vLLM's fused QKV attention of one layer: [Q_r; K_r; V_r], the KV heads replicated when
// tp > num_kv_heads.
void ShardContext::VllmQkv(const std::string& a) const {
  const std::int64_t d = m.head_dim;
  const std::int64_t q_heads = m.num_heads / tp;
  const std::int64_t kv_heads = tp >= m.num_kv_heads ? 1 : m.num_kv_heads / tp;
  const std::int64_t kv_first = tp >= m.num_kv_heads ? t / (tp / m.num_kv_heads) : t * kv_heads;
  for (const char* kind : {"weight", "bias"}) {
    const bool bias = kind[0] == 'b';
    if (bias && !m.qkv_bias) continue;
    auto at = [&](std::int64_t row) {
      return bias ? std::vector<std::int64_t>{row} : std::vector<std::int64_t>{row, 0};
    };
    std::vector<std::int64_t> shape{(q_heads + 2 * kv_heads) * d};
    if (!bias) shape.push_back(h);
    ParamBuilder(index, out, a + "qkv_proj." + kind, std::move(shape))
        .Rows(a + "q_proj." + kind, t * q_heads * d, (t + 1) * q_heads * d, at(0))
        .Rows(a + "k_proj." + kind, kv_first * d, (kv_first + kv_heads) * d, at(q_heads * d))
        .Rows(a + "v_proj." + kind, kv_first * d, (kv_first + kv_heads) * d,
              at((q_heads + kv_heads) * d));
  }
  if (m.qk_norm) {
    Replicated(index, out, a + "q_norm.weight", a + "q_norm.weight");
    Replicated(index, out, a + "k_norm.weight", a + "k_norm.weight");
  }
  const std::int64_t o = q_heads * d;
  ParamBuilder(index, out, a + "o_proj.weight", {h, o})
      .Cols(a + "o_proj.weight", t * o, (t + 1) * o, {0, 0});
}

// vLLM's fused experts of a MoE layer (l: its prefix): whole experts per rank under
// expert parallelism, else every expert split by tp.
void ShardContext::VllmExperts(const InferLayout& infer, std::int64_t layer,
                               const std::string& l) const {
  std::vector<std::int64_t> experts;
  std::int64_t moe_tp = tp, moe_rank = t;
  if (infer.expert_parallel) {
    moe_tp = 1;
    moe_rank = 0;
    const std::int64_t base = m.num_experts / tp, rem = m.num_experts % tp;
    if (infer.round_robin_experts) {
      for (std::int64_t e = t; e < m.num_experts; e += tp) experts.push_back(e);
    } else {
      const std::int64_t start = t * base + std::min(t, rem);
      for (std::int64_t e = start; e < start + base + (t < rem ? 1 : 0); ++e) {
        experts.push_back(e);
      }
    }
  } else {
    for (std::int64_t e = 0; e < m.num_experts; ++e) experts.push_back(e);
  }
  const std::int64_t per = m.moe_intermediate_size / moe_tp;
  const std::int64_t n = static_cast<std::int64_t>(experts.size());
  ParamBuilder w13(index, out, l + "mlp.experts.w13_weight", {n, 2 * per, h});
  w13.Reserve(static_cast<std::size_t>(2 * n));
  for (std::int64_t j = 0; j < n; ++j) {
    GateUp(w13, index.ExpertGate(layer, experts[j]), m.moe_intermediate_size, moe_tp, moe_rank,
           {j});
  }
  ParamBuilder w2(index, out, l + "mlp.experts.w2_weight", {n, h, per});
  w2.Reserve(static_cast<std::size_t>(n));
  for (std::int64_t j = 0; j < n; ++j) {
    w2.Cols(index.ExpertGate(layer, experts[j]) + 2, moe_rank * per, (moe_rank + 1) * per,
            {j, 0, 0});
  }
}

// vLLM's MLP of one layer (l: its prefix): the router, experts and shared experts of a
// MoE layer, or the dense MLP.
void ShardContext::VllmMlp(const InferLayout& infer, std::int64_t layer,
                           const std::string& l) const {
  auto dense_mlp = [&](const std::string& prefix, std::int64_t ffn) {
    const std::int64_t per = ffn / tp;
    ParamBuilder gate_up(index, out, prefix + "gate_up_proj.weight", {2 * per, h});
    GateUp(gate_up, index[prefix + "gate_proj.weight"], ffn, tp, t, {});
    ParamBuilder(index, out, prefix + "down_proj.weight", {h, per})
        .Cols(prefix + "down_proj.weight", t * per, (t + 1) * per, {0, 0});
  };
  if (m.IsMoeLayer(layer)) {
    Replicated(index, out, l + "mlp.gate.weight", l + "mlp.gate.weight");
    if (m.router_bias) {
      Replicated(index, out, l + "mlp.gate.e_score_correction_bias",
                 l + "mlp.gate.e_score_correction_bias");
    }
    VllmExperts(infer, layer, l);
    if (m.num_shared_experts > 0) {
      dense_mlp(l + "mlp.shared_experts.", m.num_shared_experts * m.moe_intermediate_size);
    }
  } else {
    dense_mlp(l + "mlp.", m.intermediate_size);
  }
}

}  // namespace

std::vector<LocalParam> VllmShards(const ModelConfig& m, const TensorIndex& index,
                                   const InferLayout& infer, std::int64_t tp_rank) {
  std::vector<LocalParam> out;
  const std::int64_t tp = infer.tp, t = tp_rank, h = m.hidden_size;
  const std::int64_t vocab_padded = VllmPaddedVocab(m.vocab_size);
  VocabRows(index, out, "model.embed_tokens.weight", "model.embed_tokens.weight", vocab_padded, tp,
            t, h);
  for (std::int64_t layer = 0; layer < m.num_layers; ++layer) {
    const std::string l = L(layer), a = l + "self_attn.";
    Replicated(index, out, l + "input_layernorm.weight", l + "input_layernorm.weight");
    const ShardContext c{m, index, out, tp, t, h};
    if (m.is_mla()) {
      c.VllmMla(a);
    } else {
      c.VllmQkv(a);
    }
    Replicated(index, out, l + "post_attention_layernorm.weight",
               l + "post_attention_layernorm.weight");
    c.VllmMlp(infer, layer, l);
  }
  Replicated(index, out, "model.norm.weight", "model.norm.weight");
  if (!m.tie_word_embeddings) {
    VocabRows(index, out, "lm_head.weight", "lm_head.weight", vocab_padded, tp, t, h);
  }
  for (LocalParam& p : out) {
    const std::string_view n = p.name;
    p.linear =
        n.ends_with("_proj.weight") || n.ends_with(".w13_weight") || n.ends_with(".w2_weight");
  }
  return out;
}

}  // namespace internal

std::int64_t MegatronPaddedVocab(std::int64_t vocab, std::int64_t tp) {
  const std::int64_t multiple = 128 * tp;
  return (vocab + multiple - 1) / multiple * multiple;
}

std::int64_t VllmPaddedVocab(std::int64_t vocab) { return (vocab + 63) / 64 * 64; }

void Validate(const ModelConfig& m, const TrainLayout& train) {
  Validate(m);
  const std::pair<const char*, std::int64_t> sizes[] = {
      {"train.tp", train.tp}, {"train.pp", train.pp},   {"train.vpp", train.vpp},
      {"train.ep", train.ep}, {"train.etp", train.etp}, {"train.cp", train.cp},
      {"train.dp", train.dp}};
  for (const auto& [field, v] : sizes) {
    CheckInRange(field, v, 1, 65536);
  }
  // Step by step, so that the product cannot overflow.
  std::int64_t world = 1;
  for (const std::int64_t v : {train.tp, train.cp, train.dp, train.pp}) {
    world *= v;
    if (world > (std::int64_t{1} << 20)) Fail("train", "tp·cp·dp·pp must be at most 2^20");
  }
  if (train.pp * train.vpp > (std::int64_t{1} << 20)) {
    Fail("train.vpp", "pp·vpp must be at most 2^20");
  }
  CheckDivides("train.tp", train.tp, "num_attention_heads", m.num_heads);
  if (!m.is_mla()) CheckDivides("train.tp", train.tp, "num_key_value_heads", m.num_kv_heads);
  if (HasDenseMlp(m)) CheckDivides("train.tp", train.tp, "intermediate_size", m.intermediate_size);
  if (m.is_moe()) {
    CheckDivides("train.ep", train.ep, "num_experts", m.num_experts);
    CheckDivides("train.etp", train.etp, "moe_intermediate_size", m.moe_intermediate_size);
    if ((train.tp * train.cp * train.dp) % (train.etp * train.ep) != 0) {
      Fail("train.ep", "etp·ep must divide tp·cp·dp (MoE parallel folding)");
    }
    CheckDivides("train.tp", train.tp, "the shared experts' intermediate size",
                 m.num_shared_experts * m.moe_intermediate_size);
  } else if (train.ep != 1 || train.etp != 1) {
    Fail("train.ep", "must be 1 for a dense model");
  }
  LayersPerChunk(m, train);
}

void Validate(const ModelConfig& m, const InferLayout& infer) {
  Validate(m);
  CheckInRange("infer.tp", infer.tp, 1, 65536);
  if (infer.replicas < 1 || infer.replicas > (std::int64_t{1} << 20) ||
      infer.replicas * infer.tp > (std::int64_t{1} << 20)) {
    Fail("infer.replicas", "must be at least 1, with tp·replicas at most 2^20");
  }
  CheckDivides("infer.tp", infer.tp, "num_attention_heads", m.num_heads);
  if (!m.is_mla() && m.num_kv_heads % infer.tp != 0 && infer.tp % m.num_kv_heads != 0) {
    Fail("infer.tp", "must divide num_key_value_heads (" + std::to_string(m.num_kv_heads) +
                         ") or be a multiple of it");
  }
  if (HasDenseMlp(m)) CheckDivides("infer.tp", infer.tp, "intermediate_size", m.intermediate_size);
  CheckDivides("infer.tp", infer.tp, "the vocabulary padded to 64", VllmPaddedVocab(m.vocab_size));
  if (m.is_moe()) {
    if (!infer.expert_parallel) {
      CheckDivides("infer.tp", infer.tp, "moe_intermediate_size", m.moe_intermediate_size);
    }
    CheckDivides("infer.tp", infer.tp, "the shared experts' intermediate size",
                 m.num_shared_experts * m.moe_intermediate_size);
  }
  if (infer.round_robin_experts && !infer.expert_parallel) {
    Fail("infer.round_robin_experts", "needs expert_parallel");
  }
}

TrainCoord MegatronCoord(const TrainLayout& train, std::int64_t rank) {
  CheckBelow("rank", rank, 0, train.world_size());
  TrainCoord c;
  c.tp = rank % train.tp;
  c.cp = rank / train.tp % train.cp;
  c.dp = rank / (train.tp * train.cp) % train.dp;
  c.pp = rank / (train.tp * train.cp * train.dp);
  const std::int64_t in_stage = rank % (train.tp * train.cp * train.dp);
  c.etp = in_stage % train.etp;
  c.ep = in_stage / train.etp % train.ep;
  c.edp = in_stage / (train.etp * train.ep);
  return c;
}

std::vector<std::int64_t> LayersPerChunk(const ModelConfig& m, const TrainLayout& train) {
  const std::int64_t pp = train.pp, vpp = train.vpp, layers = m.num_layers;
  CheckInRange("train.pp", pp, 1, 65536);
  CheckInRange("train.vpp", vpp, 1, 65536);
  const std::int64_t chunks = pp * vpp;
  if (chunks > (std::int64_t{1} << 20)) Fail("train.vpp", "pp·vpp must be at most 2^20");
  const std::string n = "num_hidden_layers (" + std::to_string(layers) + ")";
  const auto& first = train.first_stage_layers;
  const auto& last = train.last_stage_layers;

  if (!train.layers_per_chunk.empty()) {
    if (first || last) {
      Fail(first ? "train.first_stage_layers" : "train.last_stage_layers",
           "cannot be combined with layers_per_chunk");
    }
    if (static_cast<std::int64_t>(train.layers_per_chunk.size()) != chunks) {
      Fail("train.layers_per_chunk", "needs pp·vpp = " + std::to_string(chunks) + " entries");
    }
    std::int64_t sum = 0;
    for (std::size_t i = 0; i < train.layers_per_chunk.size(); ++i) {
      sum += CheckInRange({"train.layers_per_chunk", i}, train.layers_per_chunk[i], 0, {layers, n});
    }
    if (sum != layers) Fail("train.layers_per_chunk", "must add up to " + n);
    return train.layers_per_chunk;
  }

  if (!first && !last) {
    // Megatron-core asserts num_layers % pp == 0, then (num_layers / pp) % vpp == 0.
    if (layers % chunks != 0) {
      Fail(layers % pp != 0 ? "train.pp" : "train.vpp",
           n + " must be divisible by pp·vpp (" + std::to_string(chunks) +
               "), or set first_stage_layers / last_stage_layers for an uneven split");
    }
    return std::vector<std::int64_t>(static_cast<std::size_t>(chunks), layers / chunks);
  }

  // Megatron-core's uneven pipeline split (TransformerConfig.__post_init__).
  const std::string blamed = first ? "train.first_stage_layers" : "train.last_stage_layers";
  if (pp < 2) Fail(blamed, "needs pp >= 2, got pp " + std::to_string(pp));
  for (const auto& [field, value] :
       {std::pair{"train.first_stage_layers", first}, std::pair{"train.last_stage_layers", last}}) {
    if (!value) continue;
    CheckInRange(field, *value, 1, {layers, n});
    CheckMultipleOf(field, *value, "vpp", vpp);
  }
  const std::int64_t others = pp - (first ? 1 : 0) - (last ? 1 : 0);
  const std::int64_t given = first.value_or(0) + last.value_or(0);
  const std::string what =
      first && last ? "first_stage_layers + last_stage_layers (" + std::to_string(*first) + " + " +
                          std::to_string(*last) + " = " + std::to_string(given) + ")"
      : first ? "first_stage_layers (" + std::to_string(*first) + ")"
              : "last_stage_layers (" + std::to_string(*last) + ")";
  const std::int64_t rest = layers - given;
  if (others == 0) {
    if (rest != 0) Fail(blamed, what + " must equal " + n + " with pp 2");
  } else {
    const std::int64_t need = others * vpp;  // one layer per chunk of the other stages
    if (rest < need) {
      Fail(blamed, what + " must be at most " + n + " - " + std::to_string(need) + ": the other " +
                       std::to_string(others) + " stage(s) need at least vpp (" +
                       std::to_string(vpp) + ") layers each");
    }
    if (rest % need != 0) {
      Fail(blamed, "the remaining " + std::to_string(rest) + " layers (" + n + " minus " + what +
                       ") must be divisible by the other stages × vpp (" + std::to_string(others) +
                       " × " + std::to_string(vpp) + ")");
    }
  }
  std::vector<std::int64_t> sizes;
  sizes.reserve(static_cast<std::size_t>(chunks));
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::int64_t r = c % pp;
    if (r == 0 && first) {
      sizes.push_back(*first / vpp);
    } else if (r == pp - 1 && last) {
      sizes.push_back(*last / vpp);
    } else {
      sizes.push_back(rest / (others * vpp));
    }
  }
  return sizes;
}

std::vector<std::int64_t> StageLayers(const ModelConfig& m, const TrainLayout& train,
                                      std::int64_t pp_rank) {
  const std::vector<std::int64_t> sizes = LayersPerChunk(m, train);
  const std::int64_t chunks = static_cast<std::int64_t>(sizes.size());
  std::vector<std::int64_t> layers;
  std::int64_t start = 0;
  for (std::int64_t c = 0; c < chunks; ++c) {
    if (c % train.pp == pp_rank) {
      for (std::int64_t i = 0; i < sizes[c]; ++i) layers.push_back(start + i);
    }
    start += sizes[c];
  }
  return layers;
}

std::vector<LocalParam> MegatronDenseShards(const ModelConfig& model, const TrainLayout& train,
                                            std::int64_t pp_rank, std::int64_t tp_rank) {
  Validate(model, train);
  return internal::MegatronDenseShards(model, internal::TensorIndex(model), train, pp_rank,
                                       tp_rank);
}

std::vector<LocalParam> MegatronExpertShards(const ModelConfig& model, const TrainLayout& train,
                                             std::int64_t pp_rank, std::int64_t ep_rank,
                                             std::int64_t etp_rank) {
  Validate(model, train);
  return internal::MegatronExpertShards(model, internal::TensorIndex(model), train, pp_rank,
                                        ep_rank, etp_rank);
}

std::vector<LocalParam> MegatronShards(const ModelConfig& model, const TrainLayout& train,
                                       std::int64_t rank) {
  Validate(model, train);
  const TrainCoord c = MegatronCoord(train, rank);
  const internal::TensorIndex index(model);
  std::vector<LocalParam> out = internal::MegatronDenseShards(model, index, train, c.pp, c.tp);
  for (LocalParam& p : internal::MegatronExpertShards(model, index, train, c.pp, c.ep, c.etp)) {
    out.push_back(std::move(p));
  }
  return out;
}

std::vector<LocalParam> VllmShards(const ModelConfig& model, const InferLayout& infer,
                                   std::int64_t tp_rank) {
  Validate(model, infer);
  CheckBelow("tp_rank", tp_rank, 0, infer.tp);
  return internal::VllmShards(model, internal::TensorIndex(model), infer, tp_rank);
}

}  // namespace rlsched::rollout
