// rlsched/rollout/verify.h — an executable check of a weight-resharding plan.
//
// Overview
//   The planner (plan.h) derives its transfers from the Piece lists of layout.h. This
//   module checks them against an independent model of the two frameworks, written
//   with tensor operations and never from those Piece lists:
//
//   - FullTensorValues() gives every full Hugging Face tensor (model.h, HfTensors())
//     deterministic content: element i of tensor k holds a 64-bit mix hash of (k, i)
//     truncated to 16 bits (bf16-sized), never 0 and never kMegatronPadValue.
//   - ReferenceMegatronShards() builds one trainer rank's local tensors from the full
//     tensors the way Megatron-core (TE layer specs) lays them out: per-group fused
//     QKV, [gate_r; up_r] fc1, row-parallel linear_proj/linear_fc2, vocabulary padded
//     to a multiple of 128·tp (padding rows hold kMegatronPadValue), layers over
//     pp·vpp chunks, experts contiguous per EP rank and split by etp.
//   - ReferenceVllmShards() builds one engine TP rank's tensors the way vLLM's weight
//     loaders fill them: [Q_r; K_r; V_r] with KV heads replicated when tp > kv heads,
//     [gate_r; up_r], vocabulary padded to a multiple of 64 (padding rows zero),
//     FusedMoE w13/w2 (whole experts with expert parallelism), DeepSeek MLA.
//   - VerifyPlan() fills every trainer rank with its reference shards, allocates every
//     engine rank's tensors (zero), executes the plan's transfers element by element,
//     counts the writes of every destination element and compares the result with the
//     reference vLLM shards. It also checks each transfer (ranks, names, slice bounds,
//     element counts, no read of padding) and the plan's byte totals.
//
//   Names. Megatron: `embedding.word_embeddings.weight`, `decoder.layers.{global
//   layer}.…` (TE names: `self_attention.linear_qkv.{weight,bias,layer_norm_weight}`,
//   `self_attention.{q,k}_layernorm.weight`, `self_attention.linear_proj.weight`,
//   `mlp.linear_fc1.{weight,layer_norm_weight}`, `mlp.linear_fc2.weight`; MoE layers
//   `pre_mlp_layernorm.weight`, `mlp.router.{weight,expert_bias}`,
//   `mlp.experts.local_experts.{global expert}.linear_fc{1,2}.weight`,
//   `mlp.shared_experts.linear_fc{1,2}.weight`; MLA `input_layernorm.weight`,
//   `self_attention.linear_q_down_proj.weight` (or `linear_q_proj.weight` without q
//   LoRA), `linear_q_up_proj.{weight,layer_norm_weight}`,
//   `linear_kv_down_proj.weight`, `linear_kv_up_proj.{weight,layer_norm_weight}`),
//   `decoder.final_layernorm.weight`, `output_layer.weight` (on the last stage; with
//   tied embeddings only when the last model chunk is not the first, as a copy of the
//   embedding). vLLM: the names of vllm/model_executor/models/{llama,qwen2,qwen3,
//   qwen3_moe,deepseek_v2}.py after load_weights' stacking (`qkv_proj`,
//   `gate_up_proj`, `experts.w13_weight`, `experts.w2_weight`, `fused_qkv_a_proj`).
//
//   Scope: meant for tests on small models. VerifyPlan() holds every trainer shard
//   (once per distinct (pp, tp, ep, etp) coordinate), every engine rank's tensors, the
//   reference engine shards, the full tensors and a write counter per destination
//   element: roughly (2.5·replicas + 2 + distinct trainer coordinates / tp) times the
//   model's size in bf16. It refuses (std::invalid_argument "model") to allocate more
//   than kMaxVerifyElements elements in all; keep models at a few million parameters.
//
// Example
//   ReshardOptions o;
//   o.train = {.tp = 2, .pp = 2, .dp = 2};
//   o.infer = {.tp = 4, .replicas = 2};
//   ReshardPlan plan = PlanReshard(model, o);
//   VerifyResult r = VerifyPlan(model, o, plan);
//   if (!r.ok) for (const std::string& p : r.problems) std::cerr << p << "\n";
//
// Thread-safety: every function is pure (no shared state); concurrent calls are safe.
// Errors: std::invalid_argument naming the field for a layout the reference cannot
// build (e.g. "train.tp" when tp does not divide the KV heads); std::logic_error when
// HfTensors() disagrees with the shapes the model's fields imply.

#ifndef RLSCHED_ROLLOUT_VERIFY_H_
#define RLSCHED_ROLLOUT_VERIFY_H_

#include <cstdint>
#include <initializer_list>
#include <map>
#include <string>
#include <vector>

#include "rlsched/rollout/layout.h"
#include "rlsched/rollout/model.h"
#include "rlsched/rollout/plan.h"

namespace rlsched::rollout {

// The content of Megatron's vocabulary padding rows in the reference shards.
inline constexpr std::uint16_t kMegatronPadValue = 0xDEAD;

// VerifyPlan() allocates at most this many 16-bit elements (plus one counter byte
// per destination element): 2^28 elements, 512 MiB.
inline constexpr std::int64_t kMaxVerifyElements = std::int64_t{1} << 28;

// At most this many problems are described in VerifyResult::problems.
inline constexpr std::size_t kMaxProblems = 20;

// A dense row-major tensor of 16-bit elements (bf16-sized; the bits are opaque).
// `padding_rows` trailing indices of dim 0 are padding (vocabulary padding); the
// reference builders set it, the operations below keep it only where stated.
struct Tensor {
  std::vector<std::int64_t> shape;
  std::vector<std::uint16_t> data;
  std::int64_t padding_rows = 0;

  // A tensor of `shape` (every dim >= 0) with every element `value`. O(elements).
  static Tensor Filled(std::vector<std::int64_t> shape, std::uint16_t value);

  std::int64_t dims() const { return static_cast<std::int64_t>(shape.size()); }
  std::int64_t Elements() const { return static_cast<std::int64_t>(data.size()); }
  // Elements per index of dim 0 (the product of dims 1..), 1 for a vector.
  std::int64_t RowElements() const;
  // The first padding index of dim 0.
  std::int64_t PaddingBegin() const { return shape.empty() ? 0 : shape[0] - padding_rows; }
  // The element at `index` (one entry per dim); throws std::out_of_range.
  std::uint16_t at(std::initializer_list<std::int64_t> index) const;

  friend bool operator==(const Tensor&, const Tensor&) = default;
};

// Indices [begin, end) of dim 0 (any rank >= 1); keeps the padding rows that fall in
// the range. Throws std::out_of_range. O(output).
Tensor Rows(const Tensor& t, std::int64_t begin, std::int64_t end);
// Indices [begin, end) of the last dim (rank >= 2); keeps padding_rows. O(output).
Tensor Cols(const Tensor& t, std::int64_t begin, std::int64_t end);
// Concatenation along dim 0; all parts have the same dims 1.. (throws
// std::invalid_argument otherwise) and at least one part is given. Padding is dropped.
Tensor ConcatRows(const std::vector<Tensor>& parts);
// Stacks equal-shaped parts along a new leading dim: [parts.size(), shape...].
Tensor Stack(const std::vector<Tensor>& parts);
// The same elements under another shape with the same element count.
Tensor Reshape(const Tensor& t, std::vector<std::int64_t> shape);
// Appends rows of `value` along dim 0 up to `rows` in all and marks them padding.
Tensor PadRows(const Tensor& t, std::int64_t rows, std::uint16_t value);

// The deterministic content of element `element` of full tensor `tensor_index`:
// a 64-bit mix hash truncated to 16 bits, remapped away from 0 and kMegatronPadValue.
std::uint16_t ElementValue(std::int32_t tensor_index, std::int64_t element);

// Full tensor `tensor` (HfTensors(model)[tensor_index]) filled with ElementValue():
// shape [rows, cols], or [rows] for a vector. O(elements). `model` is unused today
// (kept so that content may depend on the model later).
Tensor FullTensorValues(const ModelConfig& model, std::int32_t tensor_index,
                        const FullTensor& tensor);

// Local tensors by name.
using ShardMap = std::map<std::string, Tensor>;

// The local parameters of global trainer rank `rank` (all its model chunks), built
// from the full tensors with Megatron-core's rules (see the overview). Dense rank
// order: tp fastest, then cp, dp, pp; expert order: etp fastest, then ep, expert-dp,
// pp. Preconditions (else std::invalid_argument naming the field): every size >= 1;
// 0 <= rank < world_size(); tp divides the heads, the KV heads (without MLA) and the
// dense / shared-expert FFN sizes; etp divides the expert FFN size; ep divides the
// experts; etp·ep divides tp·cp·dp; the layers split as Megatron-core allows: pp·vpp
// divides them, or first_stage_layers / last_stage_layers as its uneven split (each
// a positive multiple of vpp, pp >= 2, the other stages' layers a positive multiple
// of their count × vpp; chunk offsets as get_transformer_layer_offset()), or
// layers_per_chunk has pp·vpp non-negative entries summing to the layers.
// Complexity: O(model elements) (the full tensors of the rank's layers are built).
ShardMap ReferenceMegatronShards(const ModelConfig& model, const TrainLayout& train,
                                 std::int64_t rank);

// The parameters of engine TP rank `tp_rank` (the same in every replica), built from
// the full tensors with vLLM's weight-loader rules (see the overview). With
// infer.expert_parallel the experts are whole: rank r holds a contiguous block (the
// first E % tp ranks one more, as determine_expert_map's "linear" strategy), or with
// round_robin_experts the experts r, r + tp, ...; local experts in ascending global id.
// Preconditions (else std::invalid_argument naming the field): tp >= 1,
// 0 <= tp_rank < tp; tp divides the heads, the dense / shared-expert FFN sizes and the
// 64-padded vocabulary; without MLA tp divides or is a multiple of the KV heads;
// without expert parallelism tp divides the expert FFN size.
// Complexity: O(model elements).
ShardMap ReferenceVllmShards(const ModelConfig& model, const InferLayout& infer,
                             std::int64_t tp_rank);

struct VerifyResult {
  bool ok = false;                            // no problem of any kind below
  std::int64_t transfers = 0;                 // transfers examined
  std::int64_t elements_written = 0;          // destination element writes, all ranks
  std::int64_t mismatched_elements = 0;       // written, final value != reference
  std::int64_t double_written_elements = 0;   // written two times or more
  std::int64_t unwritten_elements = 0;        // non-padding, never written
  std::int64_t padding_written_elements = 0;  // destination padding rows written
  std::int64_t padding_read_elements = 0;     // source padding rows read
  // Transfers with a fault: unknown rank or name, a slice with the wrong number of
  // dims or out of bounds, element counts that differ, destination ranks not strictly
  // ascending, wrong bytes, a read of source padding (still executed).
  std::int64_t bad_transfers = 0;
  // Plan-level inconsistencies: byte totals, rank counts, bucket numbers and order,
  // a rank over the bucket budget, EngineRank() not as documented in plan.h.
  std::int64_t bookkeeping_errors = 0;
  std::vector<std::string> problems;  // the first kMaxProblems, readable
};

// Executes `plan` on reference data and checks it (see the overview). Bucket budget:
// per bucket, the bytes each rank sends (once per non-local transfer) and receives
// (per transfer it is a destination of, local copies included) must not exceed
// options.bucket_bytes. A transfer's bytes must be its element count times
// model.dtype_bytes (4 for the router's expert bias, fp32 on both sides). Byte
// totals: bytes_received sums bytes x destinations, bytes_local the local copies,
// bytes_moved the other transfers (one per broadcast).
// Preconditions: as ReferenceMegatronShards() and ReferenceVllmShards() for
// options.train / options.infer; infer.replicas >= 1. Throws std::invalid_argument
// ("model") beyond kMaxVerifyElements.
// Complexity: O(trainer shards + replicas · engine shards + elements moved).
VerifyResult VerifyPlan(const ModelConfig& model, const ReshardOptions& options,
                        const ReshardPlan& plan);

}  // namespace rlsched::rollout

#endif  // RLSCHED_ROLLOUT_VERIFY_H_
