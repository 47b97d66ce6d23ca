// rlsched/balance/cost_model.h — what a sequence costs to train on.
//
// Overview
//   Step time is not token count: attention is quadratic in the sequence length.
//   A cost model maps a sequence length L to an integer cost
//
//       cost(L) = round(linear · L + quadratic · L² + constant)
//
//   in a relative unit. For the model-derived attention cost the unit is the linear
//   work of one token (linear = 1), so costs stay small: 10M sequences of 1M tokens
//   sum to well under 2^63.
//
//   Derivation from a decoder-only transformer (forward + backward = 3 × forward
//   FLOPs; h = hidden size, l = layers, f = FFN size, d = h / heads, g = KV heads,
//   V = vocab):
//     per token, per layer: QKV 2·h·(h + 2·g·d) + output 2·h·h
//                           + MLP 2·m·h·f (m = 3 with a gated MLP, else 2)
//     per token, once:      LM head 2·h·V
//     per sequence, per layer, causal attention (QKᵀ and AV, half the square):
//                           2·h·L²
//   so a = 3·(l·(QKV + output + MLP) + 2·h·V) FLOPs per token, b = 3·l·2·h per L²,
//   and the model gives linear = 1, quadratic = b / a (for a 7B Llama shape,
//   quadratic ≈ 1 / 50,400: attention equals the linear work at L ≈ 50k).
//
// Example
//   auto model = rlsched::balance::CostModel::Attention(
//       {.hidden_size = 4096, .num_layers = 32, .ffn_hidden_size = 14336,
//        .num_attention_heads = 32, .num_kv_heads = 8, .vocab_size = 128256});
//   std::int64_t c = model.Cost(8192);
//
// Thread-safety: a CostModel is an immutable value; Cost() is safe to call
// concurrently.

#ifndef RLSCHED_BALANCE_COST_MODEL_H_
#define RLSCHED_BALANCE_COST_MODEL_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace rlsched::balance {

// The shape of a decoder-only transformer. All fields must be >= 1 and heads must
// divide hidden_size; num_kv_heads must divide num_attention_heads.
struct ModelShape {
  std::int64_t hidden_size = 4096;
  std::int64_t num_layers = 32;
  std::int64_t ffn_hidden_size = 14336;
  std::int64_t num_attention_heads = 32;
  std::int64_t num_kv_heads = 8;
  std::int64_t vocab_size = 128256;
  bool gated_mlp = true;  // SwiGLU (Llama, Qwen): three FFN matrices instead of two
};

class CostModel {
 public:
  enum class Kind { kTokens, kAttention };

  // cost(L) = L.
  static CostModel Tokens();
  // linear = 1, quadratic from the shape (see the file comment); constant is a
  // per-sequence cost in token units (e.g. a kernel launch), >= 0.
  // Throws std::invalid_argument naming the bad field.
  static CostModel Attention(const ModelShape& shape, double constant = 0.0);
  // Coefficients given directly: finite, >= 0, linear + quadratic > 0.
  static CostModel Attention(double linear, double quadratic, double constant);

  Kind kind() const { return kind_; }
  double linear() const { return linear_; }
  double quadratic() const { return quadratic_; }
  double constant() const { return constant_; }

  // The cost of one sequence. Preconditions: 0 <= length <= 2^31 (else
  // std::invalid_argument naming `lengths`). Throws std::invalid_argument when the
  // cost exceeds 2^62. O(1).
  std::int64_t Cost(std::int64_t length) const;
  // Cost() of each length; throws as Cost() does, naming the index. O(n).
  std::vector<std::int64_t> Costs(std::span<const std::int64_t> lengths) const;

  // "tokens" or "attention(linear=…, quadratic=…, constant=…)".
  std::string Describe() const;

 private:
  CostModel(Kind kind, double linear, double quadratic, double constant)
      : kind_(kind), linear_(linear), quadratic_(quadratic), constant_(constant) {}

  Kind kind_;
  double linear_;
  double quadratic_;
  double constant_;
};

}  // namespace rlsched::balance

#endif  // RLSCHED_BALANCE_COST_MODEL_H_
