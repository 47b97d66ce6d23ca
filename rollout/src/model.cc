// Hugging Face config.json -> ModelConfig, and the model's full tensors.

#include "rlsched/rollout/model.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <utility>

#include "rlsched/common/error.h"

namespace rlsched::rollout {
namespace {

using Json = nlohmann::json;

constexpr std::int64_t kMaxDim = std::int64_t{1} << 31;

[[noreturn]] void Fail(const std::string& field, const std::string& what) {
  rlsched::Fail("config." + field, what);
}

// An integer field; `fallback` when absent (or null), an error when absent and
// fallback < 0.
std::int64_t Int(const Json& j, const char* field, std::int64_t fallback = -1) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) {
    if (fallback < 0) Fail(field, "is required");
    return fallback;
  }
  if (!it->is_number_integer()) Fail(field, "must be an integer");
  const std::int64_t v = it->get<std::int64_t>();
  if (v < 0 || v >= kMaxDim) Fail(field, "must be in [0, 2^31), got " + std::to_string(v));
  return v;
}

bool Bool(const Json& j, const char* field, bool fallback) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) Fail(field, "must be true or false");
  return it->get<bool>();
}

Family FamilyOf(const Json& j) {
  static const std::pair<const char*, Family> kTypes[] = {
      {"llama", Family::kLlama},
      {"qwen2", Family::kQwen2},
      {"qwen3", Family::kQwen3},
      {"qwen3_moe", Family::kQwen3Moe},
      {"deepseek_v3", Family::kDeepseekV3},
  };
  static const std::pair<const char*, Family> kArchitectures[] = {
      {"LlamaForCausalLM", Family::kLlama},           {"Qwen2ForCausalLM", Family::kQwen2},
      {"Qwen3ForCausalLM", Family::kQwen3},           {"Qwen3MoeForCausalLM", Family::kQwen3Moe},
      {"DeepseekV3ForCausalLM", Family::kDeepseekV3},
  };
  if (auto it = j.find("model_type"); it != j.end() && it->is_string()) {
    for (const auto& [name, family] : kTypes) {
      if (*it == name) return family;
    }
    Fail("model_type", "unsupported \"" + it->get<std::string>() +
                           "\" (llama, qwen2, qwen3, qwen3_moe, deepseek_v3)");
  }
  if (auto it = j.find("architectures"); it != j.end() && it->is_array() && !it->empty()) {
    for (const auto& [name, family] : kArchitectures) {
      if ((*it)[0] == name) return family;
    }
    Fail("architectures", "unsupported " + (*it)[0].dump());
  }
  Fail("model_type", "is required (or architectures)");
}

void CheckPositive(const char* field, std::int64_t v) {
  if (v <= 0 || v >= kMaxDim) Fail(field, "must be in [1, 2^31), got " + std::to_string(v));
}

std::string Layer(std::int64_t i) { return "model.layers." + std::to_string(i) + "."; }

}  // namespace

std::string_view FamilyName(Family family) {
  switch (family) {
    case Family::kLlama:
      return "llama";
    case Family::kQwen2:
      return "qwen2";
    case Family::kQwen3:
      return "qwen3";
    case Family::kQwen3Moe:
      return "qwen3_moe";
    case Family::kDeepseekV3:
      return "deepseek_v3";
  }
  return "unknown";
}

bool ModelConfig::IsMoeLayer(std::int64_t layer) const {
  return is_moe() && !std::binary_search(dense_layers.begin(), dense_layers.end(), layer);
}

ModelConfig ParseHfConfig(std::string_view json_text) {
  Json j = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) rlsched::Fail("config", "not valid JSON");
  if (!j.is_object()) rlsched::Fail("config", "must be a JSON object");

  ModelConfig m;
  m.family = FamilyOf(j);
  m.hidden_size = Int(j, "hidden_size");
  m.intermediate_size = Int(j, "intermediate_size");
  m.num_layers = Int(j, "num_hidden_layers");
  m.num_heads = Int(j, "num_attention_heads");
  m.num_kv_heads = Int(j, "num_key_value_heads", m.num_heads);
  m.vocab_size = Int(j, "vocab_size");
  m.tie_word_embeddings = Bool(j, "tie_word_embeddings", false);
  if (m.num_heads <= 0) Fail("num_attention_heads", "must be positive");
  m.head_dim = Int(j, "head_dim", m.hidden_size / m.num_heads);
  switch (m.family) {
    case Family::kLlama:
      m.qkv_bias = Bool(j, "attention_bias", false);
      break;
    case Family::kQwen2:
      m.qkv_bias = true;  // always on in Qwen2 (no config field)
      break;
    case Family::kQwen3:
    case Family::kQwen3Moe:
      m.qkv_bias = Bool(j, "attention_bias", false);
      m.qk_norm = true;
      break;
    case Family::kDeepseekV3:
      break;
  }
  if (m.family == Family::kQwen3Moe) {
    m.num_experts = Int(j, "num_experts");
    m.moe_intermediate_size = Int(j, "moe_intermediate_size");
    const std::int64_t step = Int(j, "decoder_sparse_step", 1);
    CheckPositive("decoder_sparse_step", step);
    std::vector<std::int64_t> mlp_only;
    if (auto it = j.find("mlp_only_layers"); it != j.end() && !it->is_null()) {
      if (!it->is_array()) Fail("mlp_only_layers", "must be a list of layer indices");
      for (const Json& v : *it) {
        if (!v.is_number_integer()) Fail("mlp_only_layers", "must be a list of layer indices");
        mlp_only.push_back(v.get<std::int64_t>());
      }
    }
    for (std::int64_t i = 0; i < m.num_layers; ++i) {
      const bool listed = std::find(mlp_only.begin(), mlp_only.end(), i) != mlp_only.end();
      if (listed || (i + 1) % step != 0) m.dense_layers.push_back(i);
    }
  }
  if (m.family == Family::kDeepseekV3) {
    m.num_experts = Int(j, "n_routed_experts");
    m.moe_intermediate_size = Int(j, "moe_intermediate_size");
    m.num_shared_experts = Int(j, "n_shared_experts", 0);
    const std::int64_t first_dense = Int(j, "first_k_dense_replace", 0);
    const std::int64_t freq = Int(j, "moe_layer_freq", 1);
    CheckPositive("moe_layer_freq", freq);
    for (std::int64_t i = 0; i < m.num_layers; ++i) {
      if (i < first_dense || i % freq != 0) m.dense_layers.push_back(i);
    }
    auto topk = j.find("topk_method");
    m.router_bias = topk == j.end() || (topk->is_string() && *topk == "noaux_tc");
    m.q_lora_rank = Int(j, "q_lora_rank", 0);
    m.kv_lora_rank = Int(j, "kv_lora_rank");
    m.qk_nope_head_dim = Int(j, "qk_nope_head_dim");
    m.qk_rope_head_dim = Int(j, "qk_rope_head_dim");
    m.v_head_dim = Int(j, "v_head_dim");
    m.head_dim = m.qk_nope_head_dim + m.qk_rope_head_dim;
  }
  if (auto it = j.find("torch_dtype"); it != j.end() && it->is_string()) {
    const std::string dtype = it->get<std::string>();
    if (dtype == "float32") {
      m.dtype_bytes = 4;
    } else if (dtype != "bfloat16" && dtype != "float16") {
      Fail("torch_dtype", "unsupported \"" + dtype + "\" (bfloat16, float16, float32)");
    }
  }
  Validate(m);
  return m;
}

void Validate(const ModelConfig& m) {
  CheckPositive("hidden_size", m.hidden_size);
  CheckPositive("intermediate_size", m.intermediate_size);
  CheckPositive("num_hidden_layers", m.num_layers);
  CheckPositive("num_attention_heads", m.num_heads);
  CheckPositive("num_key_value_heads", m.num_kv_heads);
  CheckPositive("head_dim", m.head_dim);
  CheckPositive("vocab_size", m.vocab_size);
  if (m.num_heads % m.num_kv_heads != 0) {
    Fail("num_key_value_heads", "must divide num_attention_heads (" + std::to_string(m.num_heads) +
                                    "), got " + std::to_string(m.num_kv_heads));
  }
  if (m.is_moe()) {
    CheckPositive("moe_intermediate_size", m.moe_intermediate_size);
    if (m.num_experts >= kMaxDim) Fail("num_experts", "must be below 2^31");
  }
  if (m.is_mla()) {
    CheckPositive("qk_nope_head_dim", m.qk_nope_head_dim);
    CheckPositive("qk_rope_head_dim", m.qk_rope_head_dim);
    CheckPositive("v_head_dim", m.v_head_dim);
  }
  if (m.dtype_bytes != 2 && m.dtype_bytes != 4) Fail("torch_dtype", "must be 2 or 4 bytes");
  if (!std::is_sorted(m.dense_layers.begin(), m.dense_layers.end())) {
    Fail("dense_layers", "must be ascending");
  }
}

std::vector<FullTensor> HfTensors(const ModelConfig& m) {
  std::vector<FullTensor> out;
  const std::int64_t h = m.hidden_size;
  auto matrix = [&](std::string name, std::int64_t rows, std::int64_t cols) {
    out.push_back({std::move(name), rows, cols, false, m.dtype_bytes});
  };
  auto vector = [&](std::string name, std::int64_t rows, std::int64_t bytes) {
    out.push_back({std::move(name), rows, 1, true, bytes});
  };
  auto mlp = [&](const std::string& prefix, std::int64_t ffn) {
    matrix(prefix + "gate_proj.weight", ffn, h);
    matrix(prefix + "up_proj.weight", ffn, h);
    matrix(prefix + "down_proj.weight", h, ffn);
  };

  matrix("model.embed_tokens.weight", m.vocab_size, h);
  for (std::int64_t i = 0; i < m.num_layers; ++i) {
    const std::string l = Layer(i);
    vector(l + "input_layernorm.weight", h, m.dtype_bytes);
    const std::string a = l + "self_attn.";
    if (m.is_mla()) {
      const std::int64_t qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
      if (m.q_lora_rank > 0) {
        matrix(a + "q_a_proj.weight", m.q_lora_rank, h);
        vector(a + "q_a_layernorm.weight", m.q_lora_rank, m.dtype_bytes);
        matrix(a + "q_b_proj.weight", m.num_heads * qk, m.q_lora_rank);
      } else {
        matrix(a + "q_proj.weight", m.num_heads * qk, h);
      }
      matrix(a + "kv_a_proj_with_mqa.weight", m.kv_lora_rank + m.qk_rope_head_dim, h);
      vector(a + "kv_a_layernorm.weight", m.kv_lora_rank, m.dtype_bytes);
      matrix(a + "kv_b_proj.weight", m.num_heads * (m.qk_nope_head_dim + m.v_head_dim),
             m.kv_lora_rank);
      matrix(a + "o_proj.weight", h, m.num_heads * m.v_head_dim);
    } else {
      const std::int64_t q = m.num_heads * m.head_dim;
      const std::int64_t kv = m.num_kv_heads * m.head_dim;
      matrix(a + "q_proj.weight", q, h);
      matrix(a + "k_proj.weight", kv, h);
      matrix(a + "v_proj.weight", kv, h);
      if (m.qkv_bias) {
        vector(a + "q_proj.bias", q, m.dtype_bytes);
        vector(a + "k_proj.bias", kv, m.dtype_bytes);
        vector(a + "v_proj.bias", kv, m.dtype_bytes);
      }
      if (m.qk_norm) {
        vector(a + "q_norm.weight", m.head_dim, m.dtype_bytes);
        vector(a + "k_norm.weight", m.head_dim, m.dtype_bytes);
      }
      matrix(a + "o_proj.weight", h, q);
    }
    vector(l + "post_attention_layernorm.weight", h, m.dtype_bytes);
    if (m.IsMoeLayer(i)) {
      matrix(l + "mlp.gate.weight", m.num_experts, h);
      if (m.router_bias) vector(l + "mlp.gate.e_score_correction_bias", m.num_experts, 4);
      for (std::int64_t e = 0; e < m.num_experts; ++e) {
        mlp(l + "mlp.experts." + std::to_string(e) + ".", m.moe_intermediate_size);
      }
      if (m.num_shared_experts > 0) {
        mlp(l + "mlp.shared_experts.", m.num_shared_experts * m.moe_intermediate_size);
      }
    } else {
      mlp(l + "mlp.", m.intermediate_size);
    }
  }
  vector("model.norm.weight", h, m.dtype_bytes);
  if (!m.tie_word_embeddings) matrix("lm_head.weight", m.vocab_size, h);
  return out;
}

}  // namespace rlsched::rollout
