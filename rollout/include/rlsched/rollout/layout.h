// rlsched/rollout/layout.h — where every slice of every full tensor lives, on the
// trainer (Megatron-core) and on the inference engines (vLLM).
//
// Overview
//   A rank's local parameter (a Megatron shard such as
//   `decoder.layers.3.self_attention.linear_qkv.weight` on TP rank 1, or a vLLM
//   shard such as `model.layers.3.self_attn.qkv_proj.weight` on engine TP rank 0)
//   is described as a list of Pieces: rectangles of the model's full tensors
//   (model.h, HfTensors()) and where each lands in the local tensor. Rows or columns
//   of the local tensor covered by no piece are padding (vocabulary padding).
//
//   Megatron-core (trainer):
//   - rank order for dense parameters: tp fastest, then cp, dp, pp; for experts
//     (MoE parallel folding): etp fastest, then ep, then expert-dp, then pp;
//   - fused `linear_qkv`: per query group [q heads of the group; k; v], TP splits
//     whole groups; `linear_fc1` holds [gate_r; up_r] per TP rank; `linear_proj`
//     and `linear_fc2` split the input dim; vocabulary padded to a multiple of
//     128·TP and split by rows; layers spread over pp·vpp model chunks (chunk
//     v·pp + r on stage r): evenly (pp·vpp must divide the layers), or with the
//     first / last stage's layer count given (Megatron's uneven pipeline split, the
//     other layers even over the other stages), or per chunk (layers_per_chunk);
//   - experts contiguous per EP rank (global expert ids in names), split by etp.
//   vLLM (engines):
//   - `qkv_proj` holds [Q_r; K_r; V_r], KV heads replicated when TP > kv heads;
//     `gate_up_proj` [gate_r; up_r]; `o_proj`/`down_proj` split the input dim;
//     `embed_tokens`/`lm_head` padded to a multiple of 64 and split by rows;
//   - MoE `w13_weight` [local experts, 2·I/tp, hidden] and `w2_weight`
//     [local experts, hidden, I/tp]; with expert parallelism (EP = TP) whole
//     experts, contiguous per rank (or round-robin);
//   - DeepSeek: `fused_qkv_a_proj` (q_a_proj; kv_a_proj_with_mqa), `q_b_proj`,
//     `kv_b_proj` split by heads, layernorms replicated.
//
//   Names are canonical: Megatron's with the global layer index and the global expert
//   id (as in its distributed checkpoints), vLLM's after its loader's stacking. A live
//   Megatron module names layers by their index in the model chunk and experts by
//   their local index (`local_experts.{j}`, or `linear_fc1.weight{j}` with grouped
//   GEMM); an integration translates.
//
// Example
//   TrainLayout train{.tp = 2, .pp = 2, .dp = 2};
//   for (const LocalParam& p : MegatronShards(model, train, /*rank=*/3)) { ... }
//
// Thread-safety: pure functions. Errors: std::invalid_argument naming the field.

#ifndef RLSCHED_ROLLOUT_LAYOUT_H_
#define RLSCHED_ROLLOUT_LAYOUT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "rlsched/rollout/model.h"

namespace rlsched::rollout {

// A rectangle [row_begin, row_end) x [col_begin, col_end) of full tensor `tensor`
// (an index into HfTensors(); a vector has columns [0, 1)), stored in a local tensor
// of rank D at `offset` (D entries): element (r, c) of the full tensor is at local
// index offset with offset[D-2] += r - row_begin and offset[D-1] += c - col_begin
// (for a vector: offset[D-1] += r - row_begin). Leading local dims stay fixed.
struct Piece {
  std::int32_t tensor = 0;
  std::int64_t row_begin = 0, row_end = 0;
  std::int64_t col_begin = 0, col_end = 1;
  std::vector<std::int64_t> offset;
  std::int64_t Elements() const { return (row_end - row_begin) * (col_end - col_begin); }
};

// One local parameter of one rank: its name, local shape and content.
struct LocalParam {
  std::string name;
  std::vector<std::int64_t> shape;
  std::vector<Piece> pieces;
  // On engine shards: a linear layer's weight (the matrices an fp8 target quantises
  // in 128 x 128 blocks; not embeddings, lm_head, the router, norms or biases).
  bool linear = false;
};

// The trainer's parallel layout (Megatron-core).
struct TrainLayout {
  std::int64_t tp = 1;
  std::int64_t pp = 1;
  std::int64_t vpp = 1;  // virtual pipeline chunks per stage
  std::int64_t ep = 1;
  std::int64_t etp = 1;  // expert tensor parallel
  std::int64_t cp = 1;
  std::int64_t dp = 1;
  // Optional layers per model chunk (pp·vpp entries, chunk v·pp + r on stage r);
  // empty: the split below.
  std::vector<std::int64_t> layers_per_chunk;
  // Megatron-core's uneven pipeline split (num_layers_in_first_pipeline_stage,
  // num_layers_in_last_pipeline_stage): the layers of the first / last stage, all its
  // vpp chunks together (a positive multiple of vpp; each chunk holds 1/vpp of them).
  // The other layers are split evenly over the other stages' chunks, at least one
  // layer each. Neither set (nor layers_per_chunk): every chunk holds
  // num_hidden_layers / (pp·vpp), which must divide evenly. Needs pp >= 2; not with
  // layers_per_chunk.
  std::optional<std::int64_t> first_stage_layers;
  std::optional<std::int64_t> last_stage_layers;
  std::int64_t world_size() const { return tp * cp * dp * pp; }
};

// A trainer rank's coordinates in both rank orders.
struct TrainCoord {
  std::int64_t tp = 0, cp = 0, dp = 0, pp = 0;  // dense order: tp, cp, dp, pp
  std::int64_t etp = 0, ep = 0, edp = 0;        // expert order: etp, ep, edp, pp
};

// The inference layout (vLLM), per engine replica.
struct InferLayout {
  std::int64_t tp = 1;
  std::int64_t replicas = 1;
  bool expert_parallel = false;      // EP = TP: whole experts per rank
  bool round_robin_experts = false;  // with expert_parallel: expert e on rank e % tp
};

// Throws std::invalid_argument naming the field when the layout does not fit the
// model (e.g. "train.tp": num_kv_heads % tp != 0; "train.ep": experts % ep != 0;
// "train.ep": tp·cp·dp % (etp·ep) != 0; "train.pp": layers % (pp·vpp) != 0 without
// first_stage_layers / last_stage_layers; "infer.tp": heads % tp != 0).
void Validate(const ModelConfig& model, const TrainLayout& train);
void Validate(const ModelConfig& model, const InferLayout& infer);

TrainCoord MegatronCoord(const TrainLayout& train, std::int64_t rank);
// The layers of each model chunk (pp·vpp entries; chunk v·pp + r is virtual stage v
// of pipeline stage r, the chunks' layers consecutive in chunk order). Throws
// std::invalid_argument naming the field when the split does not fit the model (the
// pipeline checks of Validate()). O(pp·vpp).
std::vector<std::int64_t> LayersPerChunk(const ModelConfig& model, const TrainLayout& train);
// Global layer indices held by pipeline stage `pp_rank` (all its chunks), ascending.
// Throws as LayersPerChunk().
std::vector<std::int64_t> StageLayers(const ModelConfig& model, const TrainLayout& train,
                                      std::int64_t pp_rank);

// Megatron's padded vocabulary: vocab rounded up to a multiple of 128 * tp.
std::int64_t MegatronPaddedVocab(std::int64_t vocab, std::int64_t tp);
// vLLM's padded vocabulary: vocab rounded up to a multiple of 64.
std::int64_t VllmPaddedVocab(std::int64_t vocab);

// Dense parameters of stage `pp_rank`, TP rank `tp_rank` (the same on every cp and
// dp rank), and expert parameters of stage `pp_rank`, EP rank `ep_rank`, expert-TP
// rank `etp_rank` (the same on every expert-dp rank). Names use global layer
// indices and global expert ids. Preconditions: Validate(model, train) passed.
std::vector<LocalParam> MegatronDenseShards(const ModelConfig& model, const TrainLayout& train,
                                            std::int64_t pp_rank, std::int64_t tp_rank);
std::vector<LocalParam> MegatronExpertShards(const ModelConfig& model, const TrainLayout& train,
                                             std::int64_t pp_rank, std::int64_t ep_rank,
                                             std::int64_t etp_rank);
// Both, for global trainer rank `rank`.
std::vector<LocalParam> MegatronShards(const ModelConfig& model, const TrainLayout& train,
                                       std::int64_t rank);

// The parameters of engine TP rank `tp_rank` (the same in every replica).
// Preconditions: Validate(model, infer) passed.
std::vector<LocalParam> VllmShards(const ModelConfig& model, const InferLayout& infer,
                                   std::int64_t tp_rank);

}  // namespace rlsched::rollout

#endif  // RLSCHED_ROLLOUT_LAYOUT_H_
