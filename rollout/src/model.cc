// Hugging Face config.json -> ModelConfig, and the model's full tensors.

#include "rlsched/rollout/model.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <utility>

#include "layout_internal.h"
#include "rlsched/common/check.h"
#include "rlsched/common/error.h"

namespace rlsched::rollout {
namespace {

using Json = nlohmann::json;

constexpr std::int64_t kMaxDim = std::int64_t{1} << 31;

[[noreturn]] void FailConfig(const std::string& field, const std::string& what) {
  rlsched::Fail("config." + field, what);
}

// An integer field; `fallback` when absent (or null), an error when absent and
// fallback < 0.
std::int64_t Int(const Json& j, const char* field, std::int64_t fallback = -1) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) {
    if (fallback < 0) FailConfig(field, "is required");
    return fallback;
  }
  if (!it->is_number_integer()) FailConfig(field, "must be an integer");
  if (it->is_number_unsigned() && it->get<std::uint64_t>() >= std::uint64_t{1} << 63) {
    rlsched::FailBound("config." + std::string(field), "in [0, 2^31)", it->get<std::uint64_t>());
  }
  return CheckBelow("config." + std::string(field), it->get<std::int64_t>(), 0, {kMaxDim, "2^31"});
}

bool Bool(const Json& j, const char* field, bool fallback) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) FailConfig(field, "must be true or false");
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
    FailConfig("model_type", "unsupported \"" + it->get<std::string>() +
                                 "\" (llama, qwen2, qwen3, qwen3_moe, deepseek_v3)");
  }
  if (auto it = j.find("architectures"); it != j.end() && it->is_array() && !it->empty()) {
    for (const auto& [name, family] : kArchitectures) {
      if ((*it)[0] == name) return family;
    }
    FailConfig("architectures", "unsupported " + (*it)[0].dump());
  }
  FailConfig("model_type", "is required (or architectures)");
}

void CheckPositive(const char* field, std::int64_t v) {
  CheckBelow("config." + std::string(field), v, 1, {kMaxDim, "2^31"});
}

// The number of i in [0, n) with i % step == phase (0 <= phase < step).
std::int64_t CountInPhase(std::int64_t n, std::int64_t step, std::int64_t phase) {
  return n > phase ? (n - phase - 1) / step + 1 : 0;
}

// Whether `layer` has routed experts by the step rules alone (not the list).
bool MoeByRule(const ModelConfig& m, std::int64_t layer) {
  return layer >= m.first_dense_layers && layer % m.moe_layer_step == m.moe_layer_phase;
}

// The config key that sets the routed experts' count, for errors.
const char* ExpertsKey(const ModelConfig& m) {
  return m.family == Family::kDeepseekV3 ? "n_routed_experts" : "num_experts";
}

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
  return is_moe() && MoeByRule(*this, layer) &&
         !std::binary_search(dense_layers.begin(), dense_layers.end(), layer);
}

std::int64_t ModelConfig::NumMoeLayers() const {
  if (!is_moe() || moe_layer_step < 1 || moe_layer_phase < 0 || moe_layer_phase >= moe_layer_step) {
    return 0;
  }
  const std::int64_t first = std::clamp<std::int64_t>(first_dense_layers, 0, num_layers);
  std::int64_t n = CountInPhase(num_layers, moe_layer_step, moe_layer_phase) -
                   CountInPhase(first, moe_layer_step, moe_layer_phase);
  for (std::size_t i = 0; i < dense_layers.size(); ++i) {
    const std::int64_t layer = dense_layers[i];
    const bool repeated = i > 0 && dense_layers[i - 1] == layer;
    if (!repeated && layer >= 0 && layer < num_layers && MoeByRule(*this, layer)) --n;
  }
  return n;
}

ModelSize SizeOf(const ModelConfig& m) {
  ModelSize size;
  const auto d = [](std::int64_t v) { return static_cast<double>(v); };
  auto add = [&](double count, double rows, double cols, double element_bytes) {
    size.tensors += count;
    size.bytes += count * rows * cols * element_bytes;
  };
  add(1.0, d(m.vocab_size), d(m.hidden_size), d(m.dtype_bytes));  // the embedding
  const double moe_layers = d(m.NumMoeLayers());
  const double dense_layers = d(m.num_layers) - moe_layers;
  for (const bool moe : {false, true}) {
    const double layers = moe ? moe_layers : dense_layers;
    if (layers <= 0.0) continue;
    internal::LayerTensors(m, 0, moe, /*experts_once=*/true, [&](const internal::TensorShape& t) {
      add(layers * d(t.count), d(t.rows), d(t.cols), d(t.element_bytes));
    });
  }
  add(1.0, d(m.hidden_size), 1.0, d(m.dtype_bytes));  // the final norm
  if (!m.tie_word_embeddings) add(1.0, d(m.vocab_size), d(m.hidden_size), d(m.dtype_bytes));
  return size;
}

TrainingFlops TrainingFlopsOf(const ModelConfig& m) {
  const auto d = [](std::int64_t v) { return static_cast<double>(v); };
  const double h = d(m.hidden_size), heads = d(m.num_heads);
  double projections = 0.0, squared = 0.0;  // per layer, forward
  if (m.is_mla()) {
    const double qk = d(m.qk_nope_head_dim + m.qk_rope_head_dim), v = d(m.v_head_dim);
    projections = m.q_lora_rank > 0
                      ? 2.0 * h * d(m.q_lora_rank) + 2.0 * d(m.q_lora_rank) * heads * qk
                      : 2.0 * h * heads * qk;
    projections += 2.0 * h * d(m.kv_lora_rank + m.qk_rope_head_dim) +
                   2.0 * d(m.kv_lora_rank) * heads * (d(m.qk_nope_head_dim) + v) +
                   2.0 * heads * v * h;
    squared = heads * (qk + v);
  } else {
    const double hd = d(m.head_dim);
    projections = 2.0 * h * heads * hd + 4.0 * h * d(m.num_kv_heads) * hd + 2.0 * heads * hd * h;
    squared = heads * 2.0 * hd;
  }
  const double moe_layers = d(m.NumMoeLayers()), dense_layers = d(m.num_layers) - moe_layers;
  double moe_mlp = 0.0;
  if (m.is_moe() && moe_layers > 0.0) {
    if (m.experts_per_token < 1) {
      FailConfig("num_experts_per_tok",
                 "required for the cost of an MoE model (routed experts "
                 "per token)");
    }
    moe_mlp = 6.0 * h * d(m.moe_intermediate_size) * d(m.experts_per_token + m.num_shared_experts) +
              2.0 * h * d(m.num_experts);
  }
  const double dense_mlp = 6.0 * h * d(m.intermediate_size);
  const double forward = dense_layers * (projections + dense_mlp) +
                         moe_layers * (projections + moe_mlp) + 2.0 * h * d(m.vocab_size);
  TrainingFlops flops;
  flops.per_token = 3.0 * forward;
  flops.per_squared_token = 3.0 * d(m.num_layers) * squared;
  flops.parameters = SizeOf(m).bytes / d(m.dtype_bytes);
  return flops;
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
  if (m.num_heads <= 0) FailConfig("num_attention_heads", "must be positive");
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
    m.experts_per_token = Int(j, "num_experts_per_tok", 0);
    m.moe_intermediate_size = Int(j, "moe_intermediate_size");
    // Transformers: layer i is sparse when i is not in mlp_only_layers and
    // (i + 1) % decoder_sparse_step == 0.
    m.moe_layer_step = Int(j, "decoder_sparse_step", 1);
    CheckPositive("decoder_sparse_step", m.moe_layer_step);
    m.moe_layer_phase = m.moe_layer_step - 1;
    if (auto it = j.find("mlp_only_layers"); it != j.end() && !it->is_null()) {
      if (!it->is_array()) FailConfig("mlp_only_layers", "must be a list of layer indices");
      m.dense_layers.reserve(it->size());  // entries of the text: O(its size)
      for (std::size_t i = 0; i < it->size(); ++i) {
        const Json& v = (*it)[i];
        const auto field = [i] { return "config.mlp_only_layers[" + std::to_string(i) + "]"; };
        const auto layers = [&] { return "num_hidden_layers = " + std::to_string(m.num_layers); };
        if (!v.is_number_integer()) rlsched::Fail(field(), "must be a layer index (an integer)");
        if (v.is_number_unsigned() && v.get<std::uint64_t>() >= std::uint64_t{1} << 63) {
          rlsched::FailBound(field(), "in [0, " + layers() + ")", v.get<std::uint64_t>());
        }
        m.dense_layers.push_back(
            CheckBelow(field(), v.get<std::int64_t>(), 0, {m.num_layers, layers()}));
      }
      std::sort(m.dense_layers.begin(), m.dense_layers.end());
      m.dense_layers.erase(std::unique(m.dense_layers.begin(), m.dense_layers.end()),
                           m.dense_layers.end());
    }
  }
  if (m.family == Family::kDeepseekV3) {
    m.num_experts = Int(j, "n_routed_experts");
    m.experts_per_token = Int(j, "num_experts_per_tok", 0);
    m.moe_intermediate_size = Int(j, "moe_intermediate_size");
    m.num_shared_experts = Int(j, "n_shared_experts", 0);
    // Transformers: layer i is sparse when i >= first_k_dense_replace and
    // i % moe_layer_freq == 0.
    m.first_dense_layers = Int(j, "first_k_dense_replace", 0);
    m.moe_layer_step = Int(j, "moe_layer_freq", 1);
    CheckPositive("moe_layer_freq", m.moe_layer_step);
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
      FailConfig("torch_dtype", "unsupported \"" + dtype + "\" (bfloat16, float16, float32)");
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
  CheckDivides("config.num_key_value_heads", m.num_kv_heads, "num_attention_heads", m.num_heads);
  if (m.is_moe()) {
    CheckPositive("moe_intermediate_size", m.moe_intermediate_size);
    if (m.experts_per_token < 0 || m.experts_per_token > m.num_experts) {
      rlsched::FailBound("config.num_experts_per_tok",
                         "in [0, " + std::string(ExpertsKey(m)) + " = " +
                             std::to_string(m.num_experts) + "] (0: not given)",
                         m.experts_per_token);
    }
    if (m.num_experts >= kMaxDim) FailConfig(ExpertsKey(m), "must be below 2^31");
  }
  CheckBelow("config.first_k_dense_replace", m.first_dense_layers, 0, {kMaxDim, "2^31"});
  const char* step_key =
      m.family == Family::kDeepseekV3 ? "config.moe_layer_freq" : "config.decoder_sparse_step";
  CheckBelow(step_key, m.moe_layer_step, 1, {kMaxDim, "2^31"});
  if (m.moe_layer_phase < 0 || m.moe_layer_phase >= m.moe_layer_step) {
    rlsched::FailBound("config.moe_layer_phase",
                       "in [0, " + std::to_string(m.moe_layer_step) + ") (the layer step)",
                       m.moe_layer_phase);
  }
  if (m.is_mla()) {
    CheckPositive("qk_nope_head_dim", m.qk_nope_head_dim);
    CheckPositive("qk_rope_head_dim", m.qk_rope_head_dim);
    CheckPositive("v_head_dim", m.v_head_dim);
  }
  if (m.dtype_bytes != 2 && m.dtype_bytes != 4) FailConfig("torch_dtype", "must be 2 or 4 bytes");
  for (std::size_t i = 0; i < m.dense_layers.size(); ++i) {
    const std::int64_t layer = m.dense_layers[i];
    CheckBelow({"config.mlp_only_layers", i}, layer, 0,
               {m.num_layers, "num_hidden_layers = " + std::to_string(m.num_layers)});
    if (i > 0 && m.dense_layers[i - 1] >= layer) FailConfig("mlp_only_layers", "must be ascending");
  }
  // The size limits, before anything is built from the model.
  const ModelSize size = SizeOf(m);
  if (size.tensors > static_cast<double>(kMaxFullTensors)) {
    // Blame the layers when there are far more than any model has (a layer has at
    // least 9 tensors), else the routed experts when they make most of the tensors.
    const double expert_tensors =
        3.0 * static_cast<double>(m.num_experts) * static_cast<double>(m.NumMoeLayers());
    const bool experts = m.num_layers <= kMaxFullTensors / 64 && expert_tensors > size.tensors / 2;
    const std::string field =
        std::string("config.") + (experts ? ExpertsKey(m) : "num_hidden_layers");
    rlsched::FailBound(
        field,
        "such that the model has at most " + std::to_string(kMaxFullTensors) +
            " tensors (kMaxFullTensors: " + std::to_string(m.num_layers) + " layers" +
            (m.is_moe() ? ", " + std::to_string(m.NumMoeLayers()) + " of them with " +
                              std::to_string(m.num_experts) + " routed experts"
                        : std::string()) +
            ")",
        NumberText(static_cast<std::int64_t>(experts ? m.num_experts : m.num_layers)) +
            ", which makes " + NumberText(size.tensors) + " tensors");
  }
  if (size.bytes > kMaxModelBytes) {
    rlsched::FailBound("config", "a model of at most 2^42 bytes of tensors (kMaxModelBytes)",
                       "about " + NumberText(size.bytes) + " bytes");
  }
}

std::vector<FullTensor> HfTensors(const ModelConfig& m) {
  const ModelSize size = SizeOf(m);
  if (size.tensors > static_cast<double>(kMaxFullTensors)) {
    Validate(m);  // throws naming the key
    RLSCHED_CHECK(!"Validate() refuses a model above kMaxFullTensors");
  }
  std::vector<FullTensor> out;
  out.reserve(static_cast<std::size_t>(size.tensors));
  const std::int64_t h = m.hidden_size;
  out.push_back({"model.embed_tokens.weight", m.vocab_size, h, false, m.dtype_bytes});
  for (std::int64_t i = 0; i < m.num_layers; ++i) {
    internal::LayerTensors(
        m, i, m.IsMoeLayer(i), /*experts_once=*/false, [&](internal::TensorShape&& t) {
          out.push_back({std::move(t.name), t.rows, t.cols, t.is_vector, t.element_bytes});
        });
  }
  out.push_back({"model.norm.weight", h, 1, true, m.dtype_bytes});
  if (!m.tie_word_embeddings)
    out.push_back({"lm_head.weight", m.vocab_size, h, false, m.dtype_bytes});
  return out;
}

}  // namespace rlsched::rollout
