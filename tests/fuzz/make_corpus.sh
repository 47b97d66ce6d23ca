#!/usr/bin/env bash
# Writes the seed corpus of serve_fuzzer into tests/fuzz/corpus/: byte streams as
# `rlsched serve` reads them (varint length-delimited rlsched.v1.Request messages),
# encoded from text format by protoc. Usage: tests/fuzz/make_corpus.sh
set -euo pipefail
cd "$(dirname "$0")"
out=corpus
mkdir -p "$out"

# The varint of $1 as bytes on stdout.
varint() {
  local n=$1
  while [ "$n" -ge 128 ]; do
    printf "\\x$(printf %02x $(((n & 127) | 128)))"
    n=$((n >> 7))
  done
  printf "\\x$(printf %02x "$n")"
}

# One frame: the text-format Request $1, encoded and length-prefixed.
frame() {
  local body
  body=$(mktemp)
  protoc --proto_path=../../proto --encode=rlsched.v1.Request rlsched/v1/service.proto \
    <<<"$1" >"$body"
  varint "$(stat -c %s "$body")"
  cat "$body"
  rm -f "$body"
}

ping='id: "p" ping {}'
balance='id: "b" balance { lengths: [4096, 512, 700, 3000, 2048, 128, 9000, 33] num_parts: 3 }'
balance_equal='id: "be" balance { lengths: [5, 9, 1, 7, 3, 8] groups: [0, 0, 1, 1, 2, 2]
  num_parts: 3 equal_size: true keep_groups: true algorithm: ALGORITHM_GREEDY refine_iterations: 5 }'
balance_model='id: "bm" balance { lengths: [100, 2000, 30000, 400] num_parts: 2
  cost { kind: COST_KIND_ATTENTION model { hidden_size: 4096 num_layers: 32
  ffn_hidden_size: 14336 num_attention_heads: 32 num_kv_heads: 8 vocab_size: 128256 }
  per_sequence: 10 } }'
balance_coefficients='id: "bc" balance { lengths: [100, 2000, 30000, 400, 5] num_parts: 2
  cost { kind: COST_KIND_ATTENTION coefficients { linear: 1 quadratic: 0.001 constant: 3 } } }'
plan_step='id: "s" plan_step { lengths: [100, 200, 300, 400, 500, 600, 700, 800] num_ranks: 2
  max_tokens_per_micro_batch: 1000 min_micro_batches: 2 micro_batches_multiple_of: 2
  pad_to_multiple_of: 8 pipeline_stages: 2 overhead: 10 order: MICRO_BATCH_ORDER_HEAVIEST_FIRST
  refine_iterations: 50 }'
plan_step_groups='id: "sg" plan_step { lengths: [7, 7, 7, 7, 7, 7, 7, 7] groups: [0, 0, 1, 1, 2, 2, 3, 3]
  equal_size: true keep_groups: true num_ranks: 2 max_tokens_per_micro_batch: 8
  cost { kind: COST_KIND_ATTENTION coefficients { linear: 1 quadratic: 0.5 } } }'
invalid='id: "x" balance { lengths: [1, 2] num_parts: 0 }'
reshard='id: "r" reshard {
  model_config_json: "{\"model_type\": \"qwen3_moe\", \"hidden_size\": 32, "
    "\"intermediate_size\": 48, \"moe_intermediate_size\": 16, \"num_hidden_layers\": 4, "
    "\"num_attention_heads\": 8, \"num_key_value_heads\": 4, \"head_dim\": 4, "
    "\"num_experts\": 8, \"mlp_only_layers\": [1], \"vocab_size\": 300}"
  train { tp: 2 pp: 2 ep: 2 dp: 2 } infer { tp: 4 replicas: 2 expert_parallel: true
  expert_placement: EXPERT_PLACEMENT_ROUND_ROBIN } topology { gpus_per_node: 4
  inter_node_gb_per_s: 25 } bucket_bytes: 4096 include_transfers: true }'
empty='id: "e"'

frame "$ping" >"$out/ping"
frame "$balance" >"$out/balance"
frame "$balance_equal" >"$out/balance_equal_groups"
frame "$balance_model" >"$out/balance_model"
frame "$balance_coefficients" >"$out/balance_coefficients"
frame "$plan_step" >"$out/plan_step"
frame "$plan_step_groups" >"$out/plan_step_groups"
frame "$invalid" >"$out/invalid"
frame "$reshard" >"$out/reshard"
# compare gives each run its mode, staleness, policy and partial rollout (the config
# leaves them unset), and runs colocated sync on the same GPUs first (2 engines of 2
# GPUs + 2 ranks of 1 GPU: 3 engines and 6 ranks), streamed in 2 calls per sync.
simulate='id: "s" simulate { config {
  orchestrator { prompts_per_step: 4 samples_per_prompt: 4 oversample: 0.5
                 filter_all_equal: true train_calls_per_sync: 2 }
  steps: 3 engines: 2 trainer_ranks: 2 gpus_per_engine: 2 gpus_per_trainer_rank: 1
  release_seconds: 0.5 resume_seconds: 1.5 max_events: 5000 all_equal_rate: 0.2
  engine_mtbf_seconds: 200 } compare: true }'
frame "$simulate" >"$out/simulate"
simulate_async='id: "a" simulate { config {
  orchestrator { mode: ORCHESTRATOR_MODE_ASYNC max_staleness: 1 prompts_per_step: 4
                 samples_per_prompt: 4 oversample: 0.25
                 staleness_policy: STALENESS_POLICY_STRICT }
  steps: 3 engines: 2 trainer_ranks: 2 max_events: 5000 engine_mtbf_seconds: 200 } }'
frame "$simulate_async" >"$out/simulate_async"
# The fraction policy (staleness_fraction alone selects async), streaming, and the
# speeds in users' units (tokens/s, seconds per step).
simulate_fraction='id: "f" simulate { config {
  orchestrator { staleness_fraction: 1.5 prompts_per_step: 4 samples_per_prompt: 4
                 train_calls_per_sync: 2 }
  steps: 3 engines: 2 trainer_ranks: 2 max_events: 5000 train_call_overhead_seconds: 0.5
  decode_speed { single_tokens_per_second: 40 full_tokens_per_second: 2000 }
  train_seconds_per_step: 30 engine_mtbf_seconds: 300 } }'
frame "$simulate_fraction" >"$out/simulate_fraction"
# Colocated sync: engines released for the trainer, resumed with the new weights.
simulate_colocated='id: "c" simulate { config {
  orchestrator { colocated: true prompts_per_step: 4 samples_per_prompt: 2 }
  steps: 3 engines: 2 trainer_ranks: 2 max_events: 5000 release_seconds: 2
  resume_seconds: 3 } }'
frame "$simulate_colocated" >"$out/simulate_colocated"
frame "$empty" >"$out/empty"
{
  frame "$ping"
  frame "$balance"
  frame "$invalid"
  frame "$plan_step"
  frame "$empty"
  frame "$balance_equal"
} >"$out/mixed"
# A well-framed payload that is not a Request, then a ping.
{
  printf '\x04\xff\xff\xff\xff'
  frame "$ping"
} >"$out/malformed_then_ping"
# A stream cut inside its second frame.
{
  frame "$ping"
  frame "$plan_step" | head -c 20
} >"$out/truncated"
ls -l "$out" >&2
