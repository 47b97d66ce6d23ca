// The reference shards and the plan executor of verify.h. Written from the frameworks'
// rules, independently of layout.cc: shards are cut from full tensors with the tensor
// operations below, never from Piece lists.

#include "rlsched/rollout/verify.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "rlsched/common/check.h"
#include "rlsched/common/error.h"

namespace rlsched::rollout {
namespace {

std::int64_t Product(const std::vector<std::int64_t>& dims, std::size_t from) {
  std::int64_t p = 1;
  for (std::size_t i = from; i < dims.size(); ++i) p *= dims[i];
  return p;
}

std::int64_t RoundUp(std::int64_t value, std::int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

std::string ShapeString(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string SliceString(const std::vector<Range>& slice) {
  std::string s = "[";
  for (std::size_t i = 0; i < slice.size(); ++i) {
    s += (i ? ", " : "") + std::to_string(slice[i].begin) + ":" + std::to_string(slice[i].end);
  }
  return s + "]";
}

std::uint64_t Mix(std::uint64_t x) {  // the splitmix64 finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The full tensors by name, their values built on first use.
class FullSource {
 public:
  explicit FullSource(const ModelConfig& model) : model_(model), tensors_(HfTensors(model)) {
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      index_.emplace(tensors_[i].name, static_cast<std::int32_t>(i));
    }
  }

  // The full tensor `name`, checked to be [rows, cols] (cols 0: a vector [rows]).
  const Tensor& Get(const std::string& name, std::int64_t rows, std::int64_t cols) {
    auto it = index_.find(name);
    if (it == index_.end()) throw std::logic_error("HfTensors(): no tensor " + name);
    const FullTensor& t = tensors_[static_cast<std::size_t>(it->second)];
    const bool vector = cols == 0;
    if (t.rows != rows || (vector ? !t.is_vector : (t.is_vector || t.cols != cols))) {
      throw std::logic_error("HfTensors(): " + name + " is [" + std::to_string(t.rows) + ", " +
                             std::to_string(t.cols) + "], expected [" + std::to_string(rows) +
                             ", " + std::to_string(vector ? 1 : cols) + "]");
    }
    auto [cached, inserted] = values_.try_emplace(it->second);
    if (inserted) cached->second = FullTensorValues(model_, it->second, t);
    return cached->second;
  }

 private:
  const ModelConfig& model_;
  std::vector<FullTensor> tensors_;
  std::unordered_map<std::string, std::int32_t> index_;
  std::map<std::int32_t, Tensor> values_;
};

std::string HfLayer(std::int64_t layer) { return "model.layers." + std::to_string(layer) + "."; }

// Rows [part·n/parts, (part+1)·n/parts) of dim 0; n % parts == 0 is checked by callers.
Tensor RowPart(const Tensor& t, std::int64_t part, std::int64_t parts) {
  const std::int64_t n = t.shape[0] / parts;
  return Rows(t, part * n, (part + 1) * n);
}

Tensor ColPart(const Tensor& t, std::int64_t part, std::int64_t parts) {
  const std::int64_t n = t.shape.back() / parts;
  return Cols(t, part * n, (part + 1) * n);
}

// [gate_part; up_part] of a SwiGLU MLP split `parts` ways (Megatron fc1, vLLM gate_up).
Tensor GateUpPart(const Tensor& gate, const Tensor& up, std::int64_t part, std::int64_t parts) {
  return ConcatRows({RowPart(gate, part, parts), RowPart(up, part, parts)});
}

bool HasDenseLayer(const ModelConfig& m) {
  for (std::int64_t l = 0; l < m.num_layers; ++l) {
    if (!m.IsMoeLayer(l)) return true;
  }
  return false;
}

std::int64_t SharedFfn(const ModelConfig& m) {
  return m.num_shared_experts * m.moe_intermediate_size;
}

std::int64_t QHeadDim(const ModelConfig& m) { return m.qk_nope_head_dim + m.qk_rope_head_dim; }

// ---------------------------------------------------------------------------------
// Megatron-core.

struct MegatronCoords {
  std::int64_t pp = 0, tp = 0, ep = 0, etp = 0;
  auto operator<=>(const MegatronCoords&) const = default;
};

void CheckTrain(const ModelConfig& m, const TrainLayout& t) {
  for (auto [field, v] : {std::pair<const char*, std::int64_t>{"train.tp", t.tp},
                          {"train.pp", t.pp},
                          {"train.vpp", t.vpp},
                          {"train.ep", t.ep},
                          {"train.etp", t.etp},
                          {"train.cp", t.cp},
                          {"train.dp", t.dp}}) {
    CheckAtLeast(field, v, 1);
  }
  CheckDivides("train.tp", t.tp, "the attention heads", m.num_heads);
  if (!m.is_mla()) CheckDivides("train.tp", t.tp, "the KV heads", m.num_kv_heads);
  if (HasDenseLayer(m)) CheckDivides("train.tp", t.tp, "intermediate_size", m.intermediate_size);
  if (m.is_moe()) {
    CheckDivides("train.ep", t.ep, "the experts", m.num_experts);
    CheckDivides("train.etp", t.etp, "moe_intermediate_size", m.moe_intermediate_size);
    CheckDivides("train.ep", t.ep * t.etp, "tp·cp·dp (as etp·ep)", t.tp * t.cp * t.dp);
    if (m.num_shared_experts > 0) {
      CheckDivides("train.tp", t.tp, "the shared experts' FFN", SharedFfn(m));
    }
  }
  const std::int64_t chunks = t.pp * t.vpp;
  const bool uneven = t.first_stage_layers || t.last_stage_layers;
  if (t.layers_per_chunk.empty() && !uneven) {
    // get_num_layers_to_build(): num_layers % pp == 0, then (num_layers / pp) % vp == 0.
    if (m.num_layers % t.pp != 0) Fail("train.pp", "pp does not divide the layers");
    if (m.num_layers / t.pp % t.vpp != 0) {
      Fail("train.vpp", "vpp does not divide the layers per stage");
    }
  } else if (uneven) {
    // TransformerConfig's "Uneven PP" checks.
    const char* field =
        t.first_stage_layers ? "train.first_stage_layers" : "train.last_stage_layers";
    if (!t.layers_per_chunk.empty()) Fail(field, "excludes layers_per_chunk");
    if (t.pp == 1) Fail(field, "needs pipeline parallelism");
    std::int64_t layers = m.num_layers, stages = t.pp;
    for (const auto& [name, n] : {std::pair{"train.first_stage_layers", t.first_stage_layers},
                                  std::pair{"train.last_stage_layers", t.last_stage_layers}}) {
      if (!n) continue;
      if (*n <= 0) Fail(name, "must be larger than 0");
      if (*n % t.vpp != 0) Fail(name, "vpp does not divide it");
      layers -= *n;
      stages -= 1;
    }
    if ((layers != 0) != (stages != 0)) {
      Fail(field, std::to_string(layers) + " middle layers for " + std::to_string(stages) +
                      " middle stages");
    }
    if (stages > 0 && (layers < 0 || layers % stages != 0)) {
      Fail(field, "the middle stages do not divide the middle layers");
    }
    if (stages > 0 && layers / stages % t.vpp != 0) {
      Fail(field, "vpp does not divide the layers per middle stage");
    }
  } else {
    if (static_cast<std::int64_t>(t.layers_per_chunk.size()) != chunks) {
      Fail("train.layers_per_chunk", "must have pp·vpp entries");
    }
    std::int64_t sum = 0;
    for (std::int64_t n : t.layers_per_chunk) {
      if (n < 0) Fail("train.layers_per_chunk", "entries must be >= 0");
      sum += n;
    }
    if (sum != m.num_layers) Fail("train.layers_per_chunk", "must sum to the layers");
  }
}

// The layers [begin, end) (global indices) of pipeline stage `pp_rank`'s virtual
// stage `vp`, as Megatron-core's get_num_layers_to_build() (the count) and
// get_transformer_layer_offset() (the first layer) compute them.
std::pair<std::int64_t, std::int64_t> MegatronChunk(const ModelConfig& m, const TrainLayout& t,
                                                    std::int64_t pp_rank, std::int64_t vp) {
  const std::int64_t pp = t.pp, vpp = t.vpp;
  const bool is_first = pp_rank == 0, is_last = pp_rank == pp - 1;
  std::int64_t count = 0, offset = 0;
  if (t.first_stage_layers || t.last_stage_layers) {
    const std::int64_t first = t.first_stage_layers.value_or(0);
    const std::int64_t last = t.last_stage_layers.value_or(0);
    const std::int64_t middle_stages =
        pp - (t.first_stage_layers ? 1 : 0) - (t.last_stage_layers ? 1 : 0);
    const std::int64_t middle_layers = m.num_layers - first - last;
    std::int64_t per_rank = middle_stages > 0 ? middle_layers / middle_stages : 0;
    if (is_first && t.first_stage_layers) per_rank = first;
    if (is_last && t.last_stage_layers) per_rank = last;
    count = per_rank / vpp;
    // Offset: one "round" of every stage's chunk per virtual stage.
    const std::int64_t first_chunk = first / vpp, last_chunk = last / vpp;
    const std::int64_t middle_chunks = middle_layers / vpp;
    const std::int64_t round = first_chunk + middle_chunks + last_chunk;
    const std::int64_t middle_rank = t.first_stage_layers ? pp_rank - 1 : pp_rank;
    offset = is_first ? vp * round
                      : vp * round + first_chunk +
                            middle_rank * (middle_stages > 0 ? middle_chunks / middle_stages : 0);
  } else {
    const std::int64_t per_rank = m.num_layers / pp;
    count = per_rank / vpp;
    offset = vp * (m.num_layers / vpp) + pp_rank * count;
  }
  return {offset, offset + count};
}

// Layers of each model chunk, [begin, end) in global layer indices, chunk v·pp + r.
std::vector<std::pair<std::int64_t, std::int64_t>> ChunkLayers(const ModelConfig& m,
                                                               const TrainLayout& t) {
  const std::int64_t chunks = t.pp * t.vpp;
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  if (t.layers_per_chunk.empty()) {
    for (std::int64_t c = 0; c < chunks; ++c)
      out.push_back(MegatronChunk(m, t, c % t.pp, c / t.pp));
    return out;
  }
  std::int64_t begin = 0;
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::int64_t n = t.layers_per_chunk[static_cast<std::size_t>(c)];
    out.emplace_back(begin, begin + n);
    begin += n;
  }
  return out;
}

// The vocabulary table padded to Megatron's multiple of 128·tp, rows of rank `tp_rank`.
Tensor MegatronVocabShard(const Tensor& full, std::int64_t tp, std::int64_t tp_rank) {
  const std::int64_t padded = RoundUp(full.shape[0], 128 * tp);
  return RowPart(PadRows(full, padded, kMegatronPadValue), tp_rank, tp);
}

void MegatronAttention(const ModelConfig& m, FullSource& src, std::int64_t layer, std::int64_t tp,
                       std::int64_t r, ShardMap& out) {
  const std::string hf = HfLayer(layer) + "self_attn.";
  const std::string mg = "decoder.layers." + std::to_string(layer) + ".";
  const std::string sa = mg + "self_attention.";
  const std::int64_t h = m.hidden_size;
  if (m.is_mla()) {
    const std::int64_t qd = QHeadDim(m);
    out[mg + "input_layernorm.weight"] = src.Get(HfLayer(layer) + "input_layernorm.weight", h, 0);
    if (m.q_lora_rank > 0) {
      out[sa + "linear_q_down_proj.weight"] = src.Get(hf + "q_a_proj.weight", m.q_lora_rank, h);
      out[sa + "linear_q_up_proj.layer_norm_weight"] =
          src.Get(hf + "q_a_layernorm.weight", m.q_lora_rank, 0);
      out[sa + "linear_q_up_proj.weight"] =
          RowPart(src.Get(hf + "q_b_proj.weight", m.num_heads * qd, m.q_lora_rank), r, tp);
    } else {
      out[sa + "linear_q_proj.weight"] =
          RowPart(src.Get(hf + "q_proj.weight", m.num_heads * qd, h), r, tp);
    }
    out[sa + "linear_kv_down_proj.weight"] =
        src.Get(hf + "kv_a_proj_with_mqa.weight", m.kv_lora_rank + m.qk_rope_head_dim, h);
    out[sa + "linear_kv_up_proj.layer_norm_weight"] =
        src.Get(hf + "kv_a_layernorm.weight", m.kv_lora_rank, 0);
    out[sa + "linear_kv_up_proj.weight"] =
        RowPart(src.Get(hf + "kv_b_proj.weight", m.num_heads * (m.qk_nope_head_dim + m.v_head_dim),
                        m.kv_lora_rank),
                r, tp);
    out[sa + "linear_proj.weight"] =
        ColPart(src.Get(hf + "o_proj.weight", h, m.num_heads * m.v_head_dim), r, tp);
    return;
  }
  const std::int64_t d = m.head_dim;
  const std::int64_t groups = m.num_kv_heads;
  const std::int64_t q_per_group = m.num_heads / groups;
  out[sa + "linear_qkv.layer_norm_weight"] =
      src.Get(HfLayer(layer) + "input_layernorm.weight", h, 0);
  // The fused tensor: per query group, its q heads, then its k head, then its v head.
  auto fused = [&](const Tensor& q, const Tensor& k, const Tensor& v) {
    std::vector<Tensor> parts;
    for (std::int64_t g = 0; g < groups; ++g) {
      parts.push_back(Rows(q, g * q_per_group * d, (g + 1) * q_per_group * d));
      parts.push_back(Rows(k, g * d, (g + 1) * d));
      parts.push_back(Rows(v, g * d, (g + 1) * d));
    }
    return RowPart(ConcatRows(parts), r, tp);  // tp divides the groups: whole groups
  };
  const std::int64_t qr = m.num_heads * d, kvr = groups * d;
  out[sa + "linear_qkv.weight"] =
      fused(src.Get(hf + "q_proj.weight", qr, h), src.Get(hf + "k_proj.weight", kvr, h),
            src.Get(hf + "v_proj.weight", kvr, h));
  if (m.qkv_bias) {
    out[sa + "linear_qkv.bias"] =
        fused(src.Get(hf + "q_proj.bias", qr, 0), src.Get(hf + "k_proj.bias", kvr, 0),
              src.Get(hf + "v_proj.bias", kvr, 0));
  }
  if (m.qk_norm) {
    out[sa + "q_layernorm.weight"] = src.Get(hf + "q_norm.weight", d, 0);
    out[sa + "k_layernorm.weight"] = src.Get(hf + "k_norm.weight", d, 0);
  }
  out[sa + "linear_proj.weight"] = ColPart(src.Get(hf + "o_proj.weight", h, qr), r, tp);
}

// The dense parts of one MLP block (norm, dense MLP or router + shared experts).
void MegatronMlpDense(const ModelConfig& m, FullSource& src, std::int64_t layer, std::int64_t tp,
                      std::int64_t r, ShardMap& out) {
  const std::string hf = HfLayer(layer);
  const std::string mg = "decoder.layers." + std::to_string(layer) + ".";
  const std::int64_t h = m.hidden_size;
  const Tensor& norm = src.Get(hf + "post_attention_layernorm.weight", h, 0);
  if (!m.IsMoeLayer(layer)) {
    const std::int64_t f = m.intermediate_size;
    out[mg + "mlp.linear_fc1.layer_norm_weight"] = norm;
    out[mg + "mlp.linear_fc1.weight"] = GateUpPart(src.Get(hf + "mlp.gate_proj.weight", f, h),
                                                   src.Get(hf + "mlp.up_proj.weight", f, h), r, tp);
    out[mg + "mlp.linear_fc2.weight"] = ColPart(src.Get(hf + "mlp.down_proj.weight", h, f), r, tp);
    return;
  }
  out[mg + "pre_mlp_layernorm.weight"] = norm;
  out[mg + "mlp.router.weight"] = src.Get(hf + "mlp.gate.weight", m.num_experts, h);
  if (m.router_bias) {
    out[mg + "mlp.router.expert_bias"] =
        src.Get(hf + "mlp.gate.e_score_correction_bias", m.num_experts, 0);
  }
  if (m.num_shared_experts > 0) {
    const std::int64_t f = SharedFfn(m);
    const std::string s = hf + "mlp.shared_experts.";
    out[mg + "mlp.shared_experts.linear_fc1.weight"] = GateUpPart(
        src.Get(s + "gate_proj.weight", f, h), src.Get(s + "up_proj.weight", f, h), r, tp);
    out[mg + "mlp.shared_experts.linear_fc2.weight"] =
        ColPart(src.Get(s + "down_proj.weight", h, f), r, tp);
  }
}

void MegatronExperts(const ModelConfig& m, FullSource& src, std::int64_t layer,
                     const TrainLayout& t, std::int64_t ep_rank, std::int64_t etp_rank,
                     ShardMap& out) {
  const std::int64_t h = m.hidden_size, f = m.moe_intermediate_size;
  const std::int64_t local = m.num_experts / t.ep;
  for (std::int64_t e = ep_rank * local; e < (ep_rank + 1) * local; ++e) {
    const std::string hf = HfLayer(layer) + "mlp.experts." + std::to_string(e) + ".";
    const std::string mg = "decoder.layers." + std::to_string(layer) +
                           ".mlp.experts.local_experts." + std::to_string(e) + ".";
    out[mg + "linear_fc1.weight"] =
        GateUpPart(src.Get(hf + "gate_proj.weight", f, h), src.Get(hf + "up_proj.weight", f, h),
                   etp_rank, t.etp);
    out[mg + "linear_fc2.weight"] =
        ColPart(src.Get(hf + "down_proj.weight", h, f), etp_rank, t.etp);
  }
}

ShardMap MegatronAt(const ModelConfig& m, const TrainLayout& t, FullSource& src,
                    const MegatronCoords& c) {
  ShardMap out;
  const std::int64_t h = m.hidden_size;
  const auto chunks = ChunkLayers(m, t);
  const std::int64_t last_chunk = t.pp * t.vpp - 1;
  for (std::int64_t v = 0; v < t.vpp; ++v) {
    const std::int64_t chunk = v * t.pp + c.pp;
    if (chunk == 0) {
      out["embedding.word_embeddings.weight"] =
          MegatronVocabShard(src.Get("model.embed_tokens.weight", m.vocab_size, h), t.tp, c.tp);
    }
    const auto [begin, end] = chunks[static_cast<std::size_t>(chunk)];
    for (std::int64_t layer = begin; layer < end; ++layer) {
      MegatronAttention(m, src, layer, t.tp, c.tp, out);
      MegatronMlpDense(m, src, layer, t.tp, c.tp, out);
      if (m.IsMoeLayer(layer)) MegatronExperts(m, src, layer, t, c.ep, c.etp, out);
    }
    if (chunk == last_chunk) {
      out["decoder.final_layernorm.weight"] = src.Get("model.norm.weight", h, 0);
      // Tied: the first chunk's embedding is the output layer when both are one module;
      // otherwise the last stage allocates its own copy, kept equal to the embedding.
      if (!m.tie_word_embeddings) {
        out["output_layer.weight"] =
            MegatronVocabShard(src.Get("lm_head.weight", m.vocab_size, h), t.tp, c.tp);
      } else if (last_chunk != 0) {
        out["output_layer.weight"] =
            MegatronVocabShard(src.Get("model.embed_tokens.weight", m.vocab_size, h), t.tp, c.tp);
      }
    }
  }
  return out;
}

MegatronCoords CoordsOf(const TrainLayout& t, std::int64_t rank) {
  const std::int64_t per_stage = t.tp * t.cp * t.dp;
  const std::int64_t in_stage = rank % per_stage;
  MegatronCoords c;
  c.pp = rank / per_stage;
  c.tp = in_stage % t.tp;
  c.etp = in_stage % t.etp;
  c.ep = (in_stage / t.etp) % t.ep;
  return c;
}

// ---------------------------------------------------------------------------------
// vLLM.

void CheckInfer(const ModelConfig& m, const InferLayout& in) {
  CheckAtLeast("infer.tp", in.tp, 1);
  CheckDivides("infer.tp", in.tp, "the attention heads", m.num_heads);
  if (!m.is_mla() && m.num_kv_heads % in.tp != 0 && in.tp % m.num_kv_heads != 0) {
    Fail("infer.tp",
         "must divide or be a multiple of the KV heads (" + std::to_string(m.num_kv_heads) + ")");
  }
  if (HasDenseLayer(m)) CheckDivides("infer.tp", in.tp, "intermediate_size", m.intermediate_size);
  CheckDivides("infer.tp", in.tp, "the 64-padded vocabulary", RoundUp(m.vocab_size, 64));
  if (m.is_moe()) {
    if (!in.expert_parallel) {
      CheckDivides("infer.tp", in.tp, "moe_intermediate_size", m.moe_intermediate_size);
    }
    if (m.num_shared_experts > 0) {
      CheckDivides("infer.tp", in.tp, "the shared experts' FFN", SharedFfn(m));
    }
  }
}

// The global experts on engine rank r, ascending, and the expert TP (size, rank).
struct EngineExperts {
  std::vector<std::int64_t> experts;
  std::int64_t tp = 1, rank = 0;
};

EngineExperts ExpertsOf(const ModelConfig& m, const InferLayout& in, std::int64_t r) {
  EngineExperts out;
  if (!in.expert_parallel || in.tp == 1) {
    for (std::int64_t e = 0; e < m.num_experts; ++e) out.experts.push_back(e);
    out.tp = in.tp;
    out.rank = r;
    return out;
  }
  if (in.round_robin_experts) {
    for (std::int64_t e = r; e < m.num_experts; e += in.tp) out.experts.push_back(e);
  } else {
    const std::int64_t base = m.num_experts / in.tp, rem = m.num_experts % in.tp;
    const std::int64_t start = r * base + std::min(r, rem);
    const std::int64_t count = base + (r < rem ? 1 : 0);
    for (std::int64_t e = start; e < start + count; ++e) out.experts.push_back(e);
  }
  return out;
}

Tensor VllmVocabShard(const Tensor& full, std::int64_t tp, std::int64_t r) {
  return RowPart(PadRows(full, RoundUp(full.shape[0], 64), 0), r, tp);
}

void VllmLayer(const ModelConfig& m, const InferLayout& in, FullSource& src, std::int64_t layer,
               std::int64_t r, ShardMap& out) {
  const std::string p = HfLayer(layer);
  const std::string a = p + "self_attn.";
  const std::int64_t h = m.hidden_size, tp = in.tp;
  out[p + "input_layernorm.weight"] = src.Get(p + "input_layernorm.weight", h, 0);
  out[p + "post_attention_layernorm.weight"] = src.Get(p + "post_attention_layernorm.weight", h, 0);
  if (m.is_mla()) {
    const std::int64_t qd = QHeadDim(m);
    const Tensor& kv_a =
        src.Get(a + "kv_a_proj_with_mqa.weight", m.kv_lora_rank + m.qk_rope_head_dim, h);
    if (m.q_lora_rank > 0) {
      out[a + "fused_qkv_a_proj.weight"] =
          ConcatRows({src.Get(a + "q_a_proj.weight", m.q_lora_rank, h), kv_a});
      out[a + "q_a_layernorm.weight"] = src.Get(a + "q_a_layernorm.weight", m.q_lora_rank, 0);
      out[a + "q_b_proj.weight"] =
          RowPart(src.Get(a + "q_b_proj.weight", m.num_heads * qd, m.q_lora_rank), r, tp);
    } else {
      out[a + "q_proj.weight"] = RowPart(src.Get(a + "q_proj.weight", m.num_heads * qd, h), r, tp);
      out[a + "kv_a_proj_with_mqa.weight"] = kv_a;
    }
    out[a + "kv_a_layernorm.weight"] = src.Get(a + "kv_a_layernorm.weight", m.kv_lora_rank, 0);
    out[a + "kv_b_proj.weight"] =
        RowPart(src.Get(a + "kv_b_proj.weight", m.num_heads * (m.qk_nope_head_dim + m.v_head_dim),
                        m.kv_lora_rank),
                r, tp);
    out[a + "o_proj.weight"] =
        ColPart(src.Get(a + "o_proj.weight", h, m.num_heads * m.v_head_dim), r, tp);
  } else {
    const std::int64_t d = m.head_dim, kvh = m.num_kv_heads;
    // KV heads of rank r: r / (tp / kvh) when replicated, else a contiguous block.
    const std::int64_t kv_first = tp >= kvh ? r / (tp / kvh) : r * (kvh / tp);
    const std::int64_t kv_count = tp >= kvh ? 1 : kvh / tp;
    auto qkv = [&](const Tensor& q, const Tensor& k, const Tensor& v) {
      return ConcatRows({RowPart(q, r, tp), Rows(k, kv_first * d, (kv_first + kv_count) * d),
                         Rows(v, kv_first * d, (kv_first + kv_count) * d)});
    };
    const std::int64_t qr = m.num_heads * d, kvr = kvh * d;
    out[a + "qkv_proj.weight"] =
        qkv(src.Get(a + "q_proj.weight", qr, h), src.Get(a + "k_proj.weight", kvr, h),
            src.Get(a + "v_proj.weight", kvr, h));
    if (m.qkv_bias) {
      out[a + "qkv_proj.bias"] =
          qkv(src.Get(a + "q_proj.bias", qr, 0), src.Get(a + "k_proj.bias", kvr, 0),
              src.Get(a + "v_proj.bias", kvr, 0));
    }
    if (m.qk_norm) {
      out[a + "q_norm.weight"] = src.Get(a + "q_norm.weight", d, 0);
      out[a + "k_norm.weight"] = src.Get(a + "k_norm.weight", d, 0);
    }
    out[a + "o_proj.weight"] = ColPart(src.Get(a + "o_proj.weight", h, qr), r, tp);
  }
  const std::string mlp = p + "mlp.";
  if (!m.IsMoeLayer(layer)) {
    const std::int64_t f = m.intermediate_size;
    out[mlp + "gate_up_proj.weight"] = GateUpPart(src.Get(mlp + "gate_proj.weight", f, h),
                                                  src.Get(mlp + "up_proj.weight", f, h), r, tp);
    out[mlp + "down_proj.weight"] = ColPart(src.Get(mlp + "down_proj.weight", h, f), r, tp);
    return;
  }
  out[mlp + "gate.weight"] = src.Get(mlp + "gate.weight", m.num_experts, h);
  if (m.router_bias) {
    out[mlp + "gate.e_score_correction_bias"] =
        src.Get(mlp + "gate.e_score_correction_bias", m.num_experts, 0);
  }
  const EngineExperts ex = ExpertsOf(m, in, r);
  const std::int64_t f = m.moe_intermediate_size;
  std::vector<Tensor> w13, w2;
  for (std::int64_t e : ex.experts) {
    const std::string hf = mlp + "experts." + std::to_string(e) + ".";
    w13.push_back(GateUpPart(src.Get(hf + "gate_proj.weight", f, h),
                             src.Get(hf + "up_proj.weight", f, h), ex.rank, ex.tp));
    w2.push_back(ColPart(src.Get(hf + "down_proj.weight", h, f), ex.rank, ex.tp));
  }
  const std::int64_t fl = f / ex.tp;
  out[mlp + "experts.w13_weight"] = w13.empty() ? Tensor::Filled({0, 2 * fl, h}, 0) : Stack(w13);
  out[mlp + "experts.w2_weight"] = w2.empty() ? Tensor::Filled({0, h, fl}, 0) : Stack(w2);
  if (m.num_shared_experts > 0) {
    const std::int64_t fs = SharedFfn(m);
    const std::string s = mlp + "shared_experts.";
    out[s + "gate_up_proj.weight"] = GateUpPart(src.Get(s + "gate_proj.weight", fs, h),
                                                src.Get(s + "up_proj.weight", fs, h), r, tp);
    out[s + "down_proj.weight"] = ColPart(src.Get(s + "down_proj.weight", h, fs), r, tp);
  }
}

ShardMap VllmAt(const ModelConfig& m, const InferLayout& in, FullSource& src, std::int64_t r) {
  ShardMap out;
  const std::int64_t h = m.hidden_size;
  out["model.embed_tokens.weight"] =
      VllmVocabShard(src.Get("model.embed_tokens.weight", m.vocab_size, h), in.tp, r);
  for (std::int64_t layer = 0; layer < m.num_layers; ++layer) VllmLayer(m, in, src, layer, r, out);
  out["model.norm.weight"] = src.Get("model.norm.weight", h, 0);
  if (!m.tie_word_embeddings) {
    out["lm_head.weight"] = VllmVocabShard(src.Get("lm_head.weight", m.vocab_size, h), in.tp, r);
  }
  return out;
}

// ---------------------------------------------------------------------------------
// The plan executor.

// Calls fn(linear offset) for every element of `slice` of a row-major `shape`, in
// row-major order. Preconditions: the slice is inside the shape.
template <typename Fn>
void ForEachOffset(const std::vector<std::int64_t>& shape, const std::vector<Range>& slice,
                   Fn&& fn) {
  const std::size_t d = shape.size();
  for (const Range& r : slice) {
    if (r.end <= r.begin) return;
  }
  if (d == 0) {
    fn(std::int64_t{0});
    return;
  }
  std::vector<std::int64_t> stride(d, 1);
  for (std::size_t i = d - 1; i > 0; --i) stride[i - 1] = stride[i] * shape[i];
  std::vector<std::int64_t> idx(d);
  for (std::size_t i = 0; i < d; ++i) idx[i] = slice[i].begin;
  while (true) {
    std::int64_t base = 0;
    for (std::size_t i = 0; i + 1 < d; ++i) base += idx[i] * stride[i];
    for (std::int64_t c = slice[d - 1].begin; c < slice[d - 1].end; ++c) fn(base + c);
    std::size_t i = d - 1;
    while (true) {
      if (i == 0) return;
      --i;
      if (++idx[i] < slice[i].end) break;
      idx[i] = slice[i].begin;
    }
  }
}

std::int64_t SliceElements(const std::vector<Range>& slice) {
  std::int64_t n = 1;
  for (const Range& r : slice) n *= std::max<std::int64_t>(0, r.end - r.begin);
  return n;
}

// Empty when `slice` fits `shape`, else the reason.
std::string SliceError(const std::vector<std::int64_t>& shape, const std::vector<Range>& slice) {
  if (slice.size() != shape.size()) {
    return "slice " + SliceString(slice) + " has " + std::to_string(slice.size()) +
           " dims, tensor " + ShapeString(shape);
  }
  for (std::size_t i = 0; i < slice.size(); ++i) {
    if (slice[i].begin < 0 || slice[i].begin > slice[i].end || slice[i].end > shape[i]) {
      return "slice " + SliceString(slice) + " outside tensor " + ShapeString(shape);
    }
  }
  return {};
}

// Bytes per element of a parameter: the model's dtype; fp32 for the MoE router's
// expert bias (Megatron's expert_bias buffer, vLLM's e_score_correction_bias).
std::int64_t ElementBytes(const ModelConfig& m, const std::string& name) {
  auto ends_with = [&](std::string_view suffix) {
    return name.size() >= suffix.size() &&
           name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  if (ends_with("e_score_correction_bias") || ends_with("expert_bias")) return 4;
  return m.dtype_bytes;
}

class Reporter {
 public:
  explicit Reporter(VerifyResult& r) : r_(r) {}
  void Add(std::string what) {
    if (r_.problems.size() < kMaxProblems) r_.problems.push_back(std::move(what));
  }

 private:
  VerifyResult& r_;
};

struct EngineBuffer {
  std::int64_t tp_rank = 0;
  ShardMap tensors;
  std::map<std::string, std::vector<std::uint8_t>> writes;
};

}  // namespace

// ---------------------------------------------------------------------------------
// Tensor.

Tensor Tensor::Filled(std::vector<std::int64_t> shape, std::uint16_t value) {
  for (std::int64_t d : shape) {
    if (d < 0) rlsched::Fail("shape", "dims must be >= 0, got " + ShapeString(shape));
  }
  Tensor t;
  t.data.assign(static_cast<std::size_t>(Product(shape, 0)), value);
  t.shape = std::move(shape);
  return t;
}

std::int64_t Tensor::RowElements() const { return Product(shape, 1); }

std::uint16_t Tensor::at(std::initializer_list<std::int64_t> index) const {
  if (index.size() != shape.size()) throw std::out_of_range("Tensor::at: wrong number of dims");
  std::int64_t offset = 0;
  std::size_t i = 0;
  for (std::int64_t x : index) {
    if (x < 0 || x >= shape[i]) throw std::out_of_range("Tensor::at: index out of range");
    offset = offset * shape[i] + x;
    ++i;
  }
  return data[static_cast<std::size_t>(offset)];
}

Tensor Rows(const Tensor& t, std::int64_t begin, std::int64_t end) {
  if (t.shape.empty() || begin < 0 || begin > end || end > t.shape[0]) {
    throw std::out_of_range("Rows: [" + std::to_string(begin) + ", " + std::to_string(end) +
                            ") of " + ShapeString(t.shape));
  }
  const std::int64_t row = t.RowElements();
  Tensor out;
  out.shape = t.shape;
  out.shape[0] = end - begin;
  out.data.assign(t.data.begin() + begin * row, t.data.begin() + end * row);
  out.padding_rows = std::max<std::int64_t>(0, end - std::max(begin, t.PaddingBegin()));
  return out;
}

Tensor Cols(const Tensor& t, std::int64_t begin, std::int64_t end) {
  if (t.shape.size() < 2 || begin < 0 || begin > end || end > t.shape.back()) {
    throw std::out_of_range("Cols: [" + std::to_string(begin) + ", " + std::to_string(end) +
                            ") of " + ShapeString(t.shape));
  }
  const std::int64_t cols = t.shape.back();
  const std::int64_t outer = cols == 0 ? 0 : t.Elements() / cols;
  Tensor out;
  out.shape = t.shape;
  out.shape.back() = end - begin;
  out.padding_rows = t.padding_rows;
  out.data.reserve(static_cast<std::size_t>(outer * (end - begin)));
  for (std::int64_t o = 0; o < outer; ++o) {
    auto first = t.data.begin() + o * cols;
    out.data.insert(out.data.end(), first + begin, first + end);
  }
  return out;
}

Tensor ConcatRows(const std::vector<Tensor>& parts) {
  if (parts.empty()) rlsched::Fail("ConcatRows", "no parts");
  Tensor out;
  out.shape = parts[0].shape;
  if (out.shape.empty()) rlsched::Fail("ConcatRows", "scalar parts");
  out.shape[0] = 0;
  for (const Tensor& p : parts) {
    if (p.shape.size() != out.shape.size() ||
        !std::equal(p.shape.begin() + 1, p.shape.end(), out.shape.begin() + 1)) {
      rlsched::Fail("ConcatRows",
                    "" + ShapeString(p.shape) + " does not match " + ShapeString(parts[0].shape));
    }
    out.shape[0] += p.shape[0];
    out.data.insert(out.data.end(), p.data.begin(), p.data.end());
  }
  return out;
}

Tensor Stack(const std::vector<Tensor>& parts) {
  if (parts.empty()) rlsched::Fail("Stack", "no parts");
  Tensor out;
  out.shape = parts[0].shape;
  out.shape.insert(out.shape.begin(), static_cast<std::int64_t>(parts.size()));
  for (const Tensor& p : parts) {
    if (p.shape != parts[0].shape) {
      rlsched::Fail("Stack",
                    "" + ShapeString(p.shape) + " does not match " + ShapeString(parts[0].shape));
    }
    out.data.insert(out.data.end(), p.data.begin(), p.data.end());
  }
  return out;
}

Tensor Reshape(const Tensor& t, std::vector<std::int64_t> shape) {
  if (Product(shape, 0) != t.Elements()) {
    rlsched::Fail("Reshape", "" + ShapeString(t.shape) + " to " + ShapeString(shape));
  }
  Tensor out;
  out.shape = std::move(shape);
  out.data = t.data;
  return out;
}

Tensor PadRows(const Tensor& t, std::int64_t rows, std::uint16_t value) {
  if (t.shape.empty() || rows < t.shape[0]) {
    rlsched::Fail("PadRows", "" + std::to_string(rows) + " rows for " + ShapeString(t.shape));
  }
  Tensor out = t;
  out.padding_rows = t.padding_rows + rows - t.shape[0];
  out.shape[0] = rows;
  out.data.resize(static_cast<std::size_t>(rows * t.RowElements()), value);
  return out;
}

std::uint16_t ElementValue(std::int32_t tensor_index, std::int64_t element) {
  const std::uint64_t h =
      Mix(Mix(static_cast<std::uint64_t>(static_cast<std::uint32_t>(tensor_index)) + 1) ^
          static_cast<std::uint64_t>(element));
  auto v = static_cast<std::uint16_t>(h >> 48);
  if (v == 0 || v == kMegatronPadValue) v = static_cast<std::uint16_t>(h >> 8) | 1;
  if (v == kMegatronPadValue) v = 1;
  return v;
}

Tensor FullTensorValues(const ModelConfig& /*model*/, std::int32_t tensor_index,
                        const FullTensor& tensor) {
  Tensor t;
  t.shape = tensor.is_vector ? std::vector<std::int64_t>{tensor.rows}
                             : std::vector<std::int64_t>{tensor.rows, tensor.cols};
  t.data.resize(static_cast<std::size_t>(tensor.rows * (tensor.is_vector ? 1 : tensor.cols)));
  for (std::size_t i = 0; i < t.data.size(); ++i) {
    t.data[i] = ElementValue(tensor_index, static_cast<std::int64_t>(i));
  }
  return t;
}

ShardMap ReferenceMegatronShards(const ModelConfig& model, const TrainLayout& train,
                                 std::int64_t rank) {
  CheckTrain(model, train);
  CheckBelow("rank", rank, 0, train.world_size());
  FullSource src(model);
  return MegatronAt(model, train, src, CoordsOf(train, rank));
}

ShardMap ReferenceVllmShards(const ModelConfig& model, const InferLayout& infer,
                             std::int64_t tp_rank) {
  CheckInfer(model, infer);
  CheckBelow("tp_rank", tp_rank, 0, infer.tp);
  FullSource src(model);
  return VllmAt(model, infer, src, tp_rank);
}

// ---------------------------------------------------------------------------------
// VerifyPlan(), one check at a time.

namespace {

// What VerifyPlan() builds and accumulates: the reference shards of every rank, the
// engine buffers the transfers write into, and the plan's totals as executed.
struct Verification {
  Verification(const ModelConfig& m, const ReshardOptions& o, const ReshardPlan& p, VerifyResult& r)
      : model(m), options(o), plan(p), result(r), report(r) {}

  const ModelConfig& model;
  const ReshardOptions& options;
  const ReshardPlan& plan;
  VerifyResult& result;
  Reporter report;
  std::int64_t allocated = 0;  // elements held, against kMaxVerifyElements

  std::map<MegatronCoords, ShardMap> by_coords;  // one reference per distinct coordinate
  std::vector<const ShardMap*> trainer;          // per trainer rank
  std::vector<ShardMap> engine_ref;              // per engine TP rank
  std::map<std::int64_t, EngineBuffer> engines;  // per engine GPU

  std::int64_t bytes_received = 0, bytes_local = 0, bytes_moved = 0;
  std::int64_t last_bucket = 0;
  // Per bucket: bytes out of each rank (non-local transfers) and into each rank (all).
  std::map<std::pair<std::int64_t, std::int64_t>, std::int64_t> sent, received;
};

// Throws std::invalid_argument before anything is built for layouts the reference
// cannot build and for models whose engine tensors alone (every element once per
// replica) exceed kMaxVerifyElements.
void RefuseUnverifiable(const ModelConfig& model, const ReshardOptions& options) {
  CheckTrain(model, options.train);
  CheckInfer(model, options.infer);
  CheckAtLeast("infer.replicas", options.infer.replicas, 1);
  std::int64_t parameters = 0;
  for (const FullTensor& t : HfTensors(model)) parameters += t.Elements();
  if (parameters > kMaxVerifyElements / (options.infer.replicas + 2)) {
    Fail("model", "too large for VerifyPlan (" + std::to_string(parameters) +
                      " parameters; at most about " +
                      std::to_string(kMaxVerifyElements / (options.infer.replicas + 2)) + ")");
  }
}

// Counts `shards` `factor` times against kMaxVerifyElements; throws beyond it.
void Account(Verification& v, const ShardMap& shards, std::int64_t factor) {
  for (const auto& [name, t] : shards) v.allocated += t.Elements() * factor;
  if (v.allocated > kMaxVerifyElements) {
    Fail("model", "too large for VerifyPlan (more than " + std::to_string(kMaxVerifyElements) +
                      " elements across ranks)");
  }
}

// Trainer ranks: one reference per distinct coordinate.
void BuildTrainerReferences(Verification& v, FullSource& src) {
  const std::int64_t trainers = v.options.train.world_size();
  v.trainer.assign(static_cast<std::size_t>(trainers), nullptr);
  for (std::int64_t rank = 0; rank < trainers; ++rank) {
    const MegatronCoords c = CoordsOf(v.options.train, rank);
    auto it = v.by_coords.find(c);
    if (it == v.by_coords.end()) {
      it = v.by_coords.emplace(c, MegatronAt(v.model, v.options.train, src, c)).first;
      Account(v, it->second, 1);
    }
    v.trainer[static_cast<std::size_t>(rank)] = &it->second;
  }
}

// Engine ranks: references per TP rank, a zeroed buffer per (replica, TP rank), and
// EngineRank() against the numbering plan.h documents.
void BuildEngineBuffers(Verification& v, FullSource& src) {
  const InferLayout& infer = v.options.infer;
  const std::int64_t trainers = v.options.train.world_size();
  for (std::int64_t r = 0; r < infer.tp; ++r) {
    v.engine_ref.push_back(VllmAt(v.model, infer, src, r));
    Account(v, v.engine_ref.back(), 1);
  }
  for (std::int64_t replica = 0; replica < infer.replicas; ++replica) {
    for (std::int64_t r = 0; r < infer.tp; ++r) {
      const std::int64_t gid =
          (v.options.topology.colocated ? 0 : trainers) + replica * infer.tp + r;
      if (EngineRank(v.options, replica, r) != gid) {
        ++v.result.bookkeeping_errors;
        v.report.Add("EngineRank(replica " + std::to_string(replica) + ", tp_rank " +
                     std::to_string(r) +
                     ") = " + std::to_string(EngineRank(v.options, replica, r)) +
                     ", plan.h documents " + std::to_string(gid));
      }
      EngineBuffer& b = v.engines[gid];
      b.tp_rank = r;
      for (const auto& [name, t] : v.engine_ref[static_cast<std::size_t>(r)]) {
        Tensor zero = Tensor::Filled(t.shape, 0);
        zero.padding_rows = t.padding_rows;
        b.tensors.emplace(name, std::move(zero));
        b.writes.emplace(name, std::vector<std::uint8_t>(t.data.size(), 0));
      }
      Account(v, v.engine_ref[static_cast<std::size_t>(r)], 2);
    }
  }
}

// A plan-level count that must equal what the verifier derived.
void CheckCount(Verification& v, const char* what, std::int64_t got, std::int64_t want) {
  if (got != want) {
    ++v.result.bookkeeping_errors;
    v.report.Add(std::string("plan.") + what + " = " + std::to_string(got) + ", expected " +
                 std::to_string(want));
  }
}

void CheckRankCounts(Verification& v) {
  CheckCount(v, "trainer_ranks", v.plan.trainer_ranks, v.options.train.world_size());
  CheckCount(v, "engine_ranks", v.plan.engine_ranks, v.options.infer.replicas * v.options.infer.tp);
}

// A fault of transfer `where` ("transfer N: ").
void Bad(Verification& v, const std::string& where, const std::string& why) {
  ++v.result.bad_transfers;
  v.report.Add(where + why);
}

// Adds the transfer to the byte totals and the per-bucket loads, and checks that
// buckets are in range and never decrease.
void TallyTransfer(Verification& v, const Transfer& t, const std::string& where) {
  v.bytes_received += t.bytes * static_cast<std::int64_t>(t.dst_ranks.size());
  (t.local() ? v.bytes_local : v.bytes_moved) += t.bytes;
  if (t.bucket < 0 || t.bucket >= v.plan.num_buckets || t.bucket < v.last_bucket) {
    ++v.result.bookkeeping_errors;
    v.report.Add(where + "bucket " + std::to_string(t.bucket) + " out of order or range");
  }
  v.last_bucket = std::max(v.last_bucket, t.bucket);
  if (!t.local()) v.sent[{t.bucket, t.src_rank}] += t.bytes;
  for (std::int64_t d : t.dst_ranks) v.received[{t.bucket, d}] += t.bytes;
}

// The source tensor the transfer reads, or nullptr (and the fault reported) for an
// unknown rank or name or a slice that does not fit.
const Tensor* FindSource(Verification& v, const Transfer& t, const std::string& where) {
  if (t.src_rank < 0 || t.src_rank >= v.options.train.world_size()) {
    Bad(v, where, "source rank " + std::to_string(t.src_rank) + " is not a trainer rank");
    return nullptr;
  }
  const auto num_params = static_cast<std::int64_t>(v.plan.param_names.size());
  if (t.src_param < 0 || t.src_param >= num_params || t.dst_param < 0 ||
      t.dst_param >= num_params) {
    Bad(v, where, "param index out of range");
    return nullptr;
  }
  const std::string& src_name = v.plan.param_names[static_cast<std::size_t>(t.src_param)];
  const ShardMap& src_shards = *v.trainer[static_cast<std::size_t>(t.src_rank)];
  auto src_it = src_shards.find(src_name);
  if (src_it == src_shards.end()) {
    Bad(v, where, "trainer rank " + std::to_string(t.src_rank) + " has no " + src_name);
    return nullptr;
  }
  const Tensor& source = src_it->second;
  if (std::string e = SliceError(source.shape, t.src_slice); !e.empty()) {
    Bad(v, where, "source " + src_name + " on rank " + std::to_string(t.src_rank) + ": " + e);
    return nullptr;
  }
  return &source;
}

// A read of the source's padding rows is counted and reported (the transfer is
// still executed).
void CheckPaddingRead(Verification& v, const Transfer& t, const Tensor& source,
                      std::int64_t elements, const std::string& where) {
  if (!t.src_slice.empty() && t.src_slice[0].end > source.PaddingBegin() &&
      t.src_slice[0].begin < t.src_slice[0].end && elements > 0) {
    const std::string& src_name = v.plan.param_names[static_cast<std::size_t>(t.src_param)];
    const std::int64_t rows =
        t.src_slice[0].end - std::max(t.src_slice[0].begin, source.PaddingBegin());
    v.result.padding_read_elements += elements / (t.src_slice[0].end - t.src_slice[0].begin) * rows;
    Bad(v, where,
        "source " + src_name + " on rank " + std::to_string(t.src_rank) + " slice " +
            SliceString(t.src_slice) + " reads padding rows from " +
            std::to_string(source.PaddingBegin()));
  }
}

// fp8 target: vLLM's linear weights are quantised, by the sender only when the
// destination slice covers whole 128 x 128 blocks (fp8 bytes + fp32 scales); the
// transfer's bytes must match.
void CheckQuantizeAndBytes(Verification& v, const Transfer& t, std::int64_t elements,
                           const std::string& where) {
  const std::string& dst_name = v.plan.param_names[static_cast<std::size_t>(t.dst_param)];
  const bool quantised = v.options.target_dtype == TargetDtype::kFp8Block128 &&
                         (dst_name.ends_with("_proj.weight") || dst_name.ends_with(".w13_weight") ||
                          dst_name.ends_with(".w2_weight"));
  std::int64_t expected_bytes = elements * ElementBytes(v.model, dst_name);
  if (!quantised && t.quantize != Quantize::kNone)
    Bad(v, where, dst_name + " must not be quantised");
  if (quantised && t.quantize == Quantize::kNone) Bad(v, where, dst_name + " must be quantised");
  if (quantised && t.quantize == Quantize::kAtSender && t.dst_slice.size() >= 2) {
    const std::size_t d = t.dst_slice.size();
    const Range rows = t.dst_slice[d - 2], cols = t.dst_slice[d - 1];
    if (rows.begin % 128 != 0 || cols.begin % 128 != 0) {
      Bad(v, where,
          "quantised by the sender but " + dst_name + " slice " + SliceString(t.dst_slice) +
              " does not start on a 128 x 128 block");
    }
    const std::int64_t blocks =
        (rows.end - rows.begin + 127) / 128 * ((cols.end - cols.begin + 127) / 128);
    expected_bytes = elements + 4 * blocks;
  }
  if (t.bytes != expected_bytes) {
    Bad(v, where,
        "bytes " + std::to_string(t.bytes) + " for " + std::to_string(elements) + " elements of " +
            dst_name);
  }
}

void CheckDestinationRanks(Verification& v, const Transfer& t, const std::string& where) {
  if (t.dst_ranks.empty()) Bad(v, where, "no destination ranks");
  if (!std::is_sorted(t.dst_ranks.begin(), t.dst_ranks.end()) ||
      std::adjacent_find(t.dst_ranks.begin(), t.dst_ranks.end()) != t.dst_ranks.end()) {
    Bad(v, where, "destination ranks not strictly ascending");
  }
}

// Copies the source slice into every destination's tensor, counting the writes of
// each element (and those of padding rows).
void ExecuteTransfer(Verification& v, const Transfer& t, const Tensor& source,
                     std::int64_t elements, const std::string& where) {
  const std::string& dst_name = v.plan.param_names[static_cast<std::size_t>(t.dst_param)];
  std::vector<std::uint16_t> values;
  values.reserve(static_cast<std::size_t>(elements));
  ForEachOffset(source.shape, t.src_slice, [&](std::int64_t off) {
    values.push_back(source.data[static_cast<std::size_t>(off)]);
  });
  for (std::int64_t d : t.dst_ranks) {
    auto eng = v.engines.find(d);
    if (eng == v.engines.end()) {
      Bad(v, where, "destination " + std::to_string(d) + " is not an engine rank");
      continue;
    }
    EngineBuffer& buf = eng->second;
    auto dst_it = buf.tensors.find(dst_name);
    if (dst_it == buf.tensors.end()) {
      Bad(v, where,
          "engine rank " + std::to_string(d) + " (tp " + std::to_string(buf.tp_rank) + ") has no " +
              dst_name);
      continue;
    }
    Tensor& dest = dst_it->second;
    if (std::string e = SliceError(dest.shape, t.dst_slice); !e.empty()) {
      Bad(v, where, "destination " + dst_name + " on rank " + std::to_string(d) + ": " + e);
      continue;
    }
    if (SliceElements(t.dst_slice) != elements) {
      Bad(v, where,
          "source " + SliceString(t.src_slice) + " and destination " + SliceString(t.dst_slice) +
              " differ in elements");
      continue;
    }
    std::vector<std::uint8_t>& writes = buf.writes[dst_name];
    const std::int64_t row = dest.RowElements();
    const std::int64_t pad_from = dest.PaddingBegin() * row;
    std::size_t k = 0;
    ForEachOffset(dest.shape, t.dst_slice, [&](std::int64_t off) {
      const auto o = static_cast<std::size_t>(off);
      dest.data[o] = values[k++];
      if (writes[o] < 255) ++writes[o];
      if (off >= pad_from) ++v.result.padding_written_elements;
      ++v.result.elements_written;
    });
  }
}

// One transfer: its bookkeeping, its checks, then its execution (unless it cannot be
// executed: unknown source, slice out of bounds).
void VerifyTransfer(Verification& v, std::size_t ti) {
  const Transfer& t = v.plan.transfers[ti];
  ++v.result.transfers;
  const std::string where = "transfer " + std::to_string(ti) + ": ";
  TallyTransfer(v, t, where);
  const Tensor* source = FindSource(v, t, where);
  if (source == nullptr) return;
  const std::int64_t elements = SliceElements(t.src_slice);
  CheckPaddingRead(v, t, *source, elements, where);
  CheckQuantizeAndBytes(v, t, elements, where);
  CheckDestinationRanks(v, t, where);
  ExecuteTransfer(v, t, *source, elements, where);
}

// The plan's byte totals against the executed transfers'.
void CheckByteTotals(Verification& v) {
  CheckCount(v, "bytes_received", v.plan.bytes_received, v.bytes_received);
  CheckCount(v, "bytes_local", v.plan.bytes_local, v.bytes_local);
  CheckCount(v, "bytes_moved", v.plan.bytes_moved, v.bytes_moved);
}

// No rank sends, or receives, more than options.bucket_bytes in one bucket.
void CheckBucketBudget(Verification& v) {
  for (const auto* loads : {&v.sent, &v.received}) {
    for (const auto& [key, bytes] : *loads) {
      if (bytes > v.options.bucket_bytes) {
        ++v.result.bookkeeping_errors;
        v.report.Add("bucket " + std::to_string(key.first) + ": rank " +
                     std::to_string(key.second) + (loads == &v.sent ? " sends " : " receives ") +
                     std::to_string(bytes) + " bytes > bucket_bytes");
      }
    }
  }
}

// "i, j, k": the multi-index of row-major offset `offset` in `shape`.
std::string IndexString(const std::vector<std::int64_t>& shape, std::int64_t offset) {
  std::string index;
  std::int64_t rest = offset;
  for (std::size_t dd = shape.size(); dd-- > 0;) {
    const std::int64_t dim = std::max<std::int64_t>(1, shape[dd]);
    index = std::to_string(rest % dim) + (index.empty() ? "" : ", ") + index;
    rest /= dim;
  }
  return index;
}

// Every engine tensor against its reference: unwritten, written twice, wrong value;
// the first problem element of each tensor is described.
void CompareWithReferences(Verification& v) {
  for (const auto& [gid, buf] : v.engines) {
    const ShardMap& ref = v.engine_ref[static_cast<std::size_t>(buf.tp_rank)];
    for (const auto& [name, dest] : buf.tensors) {
      const Tensor& want = ref.at(name);
      const std::vector<std::uint8_t>& writes = buf.writes.at(name);
      const std::int64_t pad_from = dest.PaddingBegin() * dest.RowElements();
      std::int64_t first_bad = -1;
      std::string kind;
      for (std::size_t i = 0; i < dest.data.size(); ++i) {
        const auto off = static_cast<std::int64_t>(i);
        std::string k;
        if (writes[i] == 0) {
          if (off < pad_from) {
            ++v.result.unwritten_elements;
            k = "never written";
          }
        } else {
          if (writes[i] > 1) {
            ++v.result.double_written_elements;
            k = "written " + std::to_string(writes[i]) + " times";
          }
          if (dest.data[i] != want.data[i]) {
            ++v.result.mismatched_elements;
            k = "wrong value";
          }
        }
        if (!k.empty() && first_bad < 0) {
          first_bad = off;
          kind = k;
        }
      }
      if (first_bad >= 0) {
        v.report.Add(name + " on engine rank " + std::to_string(gid) + " (tp " +
                     std::to_string(buf.tp_rank) + ") at [" + IndexString(dest.shape, first_bad) +
                     "]: " + kind);
      }
    }
  }
}

// The padding-write summary and the verdict.
void Conclude(Verification& v) {
  VerifyResult& result = v.result;
  if (result.padding_written_elements > 0) {
    v.report.Add(std::to_string(result.padding_written_elements) +
                 " destination padding elements written");
  }
  result.ok = result.mismatched_elements == 0 && result.double_written_elements == 0 &&
              result.unwritten_elements == 0 && result.padding_written_elements == 0 &&
              result.padding_read_elements == 0 && result.bad_transfers == 0 &&
              result.bookkeeping_errors == 0;
}

}  // namespace

VerifyResult VerifyPlan(const ModelConfig& model, const ReshardOptions& options,
                        const ReshardPlan& plan) {
  RefuseUnverifiable(model, options);
  VerifyResult result;
  Verification v(model, options, plan, result);
  FullSource src(model);
  BuildTrainerReferences(v, src);
  BuildEngineBuffers(v, src);
  CheckRankCounts(v);
  for (std::size_t ti = 0; ti < plan.transfers.size(); ++ti) VerifyTransfer(v, ti);
  CheckByteTotals(v);
  CheckBucketBudget(v);
  CompareWithReferences(v);
  Conclude(v);
  return result;
}

}  // namespace rlsched::rollout
