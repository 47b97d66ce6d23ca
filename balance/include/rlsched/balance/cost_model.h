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
//   Per micro-batch: a trainer pays for every micro-batch it runs, whatever its
//   tokens (see MicroBatchOverheadTokens below); CostModel::micro_batch_overhead()
//   is that cost in the model's unit, the step planner's default `overhead`.
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

// A transformer's training work, however its architecture gives it: forward + backward
// FLOPs of one token's linear work (projections, MLP or experts, LM head), of one
// squared token of a sequence (causal attention), and the parameters every micro-batch
// streams. WorkOf(ModelShape) derives it for a dense shape; rlsched::rollout's
// TrainingWork() from a Hugging Face config (GQA, MoE, MLA, tied embeddings).
struct TransformerWork {
  double flops_per_token = 0.0;          // > 0, finite
  double flops_per_squared_token = 0.0;  // >= 0, finite
  double parameters = 0.0;               // >= 0, finite
  std::int64_t num_layers = 1;           // >= 1 (kernel launches per micro-batch)
};

// The work of a dense shape (see the file comment). Throws FieldError naming the bad
// shape field. O(1).
TransformerWork WorkOf(const ModelShape& shape);

// What one micro-batch costs a trainer beyond its tokens, for the estimate below.
// The defaults are an H100-class GPU (989 TFLOP/s dense bf16 at 40% utilisation,
// 3.35 TB/s of HBM) running a Megatron-style training loop.
struct MicroBatchOverheadModel {
  double flops_per_second = 400e12;          // achieved training FLOP/s of one GPU, > 0
  double memory_bytes_per_second = 3.35e12;  // HBM bandwidth, > 0
  double bytes_per_parameter = 2.0;          // bf16 weights, >= 0
  double kernels_per_layer = 40.0;           // forward + backward launches per layer, >= 0
  double kernel_latency_seconds = 5e-6;      // launch and tail of one kernel, >= 0
  double framework_seconds = 2e-3;           // per micro-batch: data, loss, p2p set-up, >= 0
};

// The fixed cost of one micro-batch (forward + backward) in tokens of linear work
// (the attention cost model's unit), for a model of this shape at TP = 1:
//
//   overhead = F · (3 · β · N / B  +  K · l · τ  +  φ) / a
//
// with F the achieved FLOP/s, a the FLOPs of one token (the cost model's linear work,
// 6·N plus the LM head), N the matrix parameters (l layers of QKV, output and MLP,
// plus the LM head), β bytes per parameter, B the memory bandwidth (the weights are
// streamed once forward and twice backward by every micro-batch, however short), K
// kernels per layer of latency τ, and φ the framework's own per-micro-batch time.
// The weight term is about F / B (≈ 120 tokens) for any dense model; the launch and
// framework terms dominate small models. Llama-3.1-8B's shape (ModelShape{}) gives
// about 190 tokens, a 0.5B model about 1,000, a 70B model about 140.
// Throws std::invalid_argument naming the bad field (shape or model). O(1).
double MicroBatchOverheadTokens(const ModelShape& shape, const MicroBatchOverheadModel& model = {});
// The same for any transformer's work (N = work.parameters, a = work.flops_per_token).
double MicroBatchOverheadTokens(const TransformerWork& work,
                                const MicroBatchOverheadModel& model = {});

class CostModel {
 public:
  enum class Kind { kTokens, kAttention };

  // cost(L) = L. Its micro-batch overhead is MicroBatchOverheadTokens(ModelShape{}).
  static CostModel Tokens();
  // linear = 1, quadratic from the shape (see the file comment); constant is a
  // per-sequence cost in token units (e.g. a kernel launch), >= 0.
  // Throws std::invalid_argument naming the bad field. Its micro-batch overhead is
  // MicroBatchOverheadTokens(shape).
  static CostModel Attention(const ModelShape& shape, double constant = 0.0);
  // linear = 1, quadratic = flops_per_squared_token / flops_per_token; the overhead
  // MicroBatchOverheadTokens(work). Throws FieldError naming the bad field ("work.…").
  static CostModel Attention(const TransformerWork& work, double constant = 0.0);
  // Coefficients given directly: finite, >= 0, linear + quadratic > 0. Its micro-batch
  // overhead is linear · MicroBatchOverheadTokens(ModelShape{}) (a token costs `linear`).
  static CostModel Attention(double linear, double quadratic, double constant);

  Kind kind() const { return kind_; }
  double linear() const { return linear_; }
  double quadratic() const { return quadratic_; }
  double constant() const { return constant_; }
  // The cost of one micro-batch launch in this model's unit (see the file comment),
  // rounded; the step planner's default per-micro-batch overhead.
  std::int64_t micro_batch_overhead() const { return micro_batch_overhead_; }

  // The cost of one sequence. Preconditions: 0 <= length <= 2^31 (else
  // std::invalid_argument naming `lengths`). Throws std::invalid_argument when the
  // cost exceeds 2^62. O(1).
  std::int64_t Cost(std::int64_t length) const;
  // Cost() of each length; throws as Cost() does, naming the index. O(n).
  std::vector<std::int64_t> Costs(std::span<const std::int64_t> lengths) const;

  // "tokens" or "attention(linear=…, quadratic=…, constant=…)".
  std::string Describe() const;

 private:
  CostModel(Kind kind, double linear, double quadratic, double constant,
            std::int64_t micro_batch_overhead)
      : kind_(kind),
        linear_(linear),
        quadratic_(quadratic),
        constant_(constant),
        micro_batch_overhead_(micro_batch_overhead) {}

  Kind kind_;
  double linear_;
  double quadratic_;
  double constant_;
  std::int64_t micro_batch_overhead_;
};

}  // namespace rlsched::balance

#endif  // RLSCHED_BALANCE_COST_MODEL_H_
