// reshard_command.h — `rlsched reshard`: plan the weight transfer from the trainer's
// layout to the inference engines' layout.
//
// Overview
//   Reads a Hugging Face config.json (--model), builds a rlsched.v1.ReshardRequest
//   from the trainer layout (--train tp=8,pp=2,dp=4), the engine layout
//   (--infer tp=4,replicas=16), the placement (--colocated) and the topology options,
//   and plans it with the functions the daemon uses (reshard_convert.h). Prints a
//   summary: the model (family, parameters, bytes), both layouts, the bytes received,
//   copied locally and moved, the transfers, the buckets, the busiest link, and the
//   plan's estimated time against its lower bound and against the naive method. With
//   --json the summary ReshardPlan (no transfers) on one line instead; --plan-out
//   FILE writes the whole ReshardPlan, transfers included, as JSON, or for a FILE
//   ending in .binpb the binary plan file of reshard.proto (an index, then each GPU's
//   transfers; reshard_convert.h reads it back), both streamed; --verify executes
//   the plan on reference data (rollout::VerifyPlan(); small models only) and fails
//   (std::runtime_error, exit status 1) if it is wrong.
//
// Example
//   CLI::App app;
//   rlsched::app::ReshardArgs args;
//   CLI::App* reshard = rlsched::app::AddReshardCommand(app, args);
//   app.parse(argc, argv);
//   if (reshard->parsed()) rlsched::app::RunReshardCommand(args, std::cout, std::cerr);
//
// Thread-safety: RunReshardCommand() touches no global state besides logging.

#ifndef RLSCHED_APP_RESHARD_COMMAND_H_
#define RLSCHED_APP_RESHARD_COMMAND_H_

#include <CLI/CLI.hpp>
#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>

#include "rlsched/v1/reshard.pb.h"

namespace rlsched::app {

// The options of `rlsched reshard`.
struct ReshardArgs {
  std::string model;  // --model: the config.json file or its model folder (required)
  std::string train;  // --train: key=value list (required)
  std::string infer;  // --infer: key=value list (required)
  bool round_robin_experts = false;
  bool colocated = false;
  std::int64_t gpus_per_node = 8;
  double intra_node_gb_per_s = 400.0;
  double inter_node_gb_per_s = 50.0;
  std::int64_t bucket_mb = 512;       // MiB
  std::string target_dtype = "bf16";  // --target-dtype: "bf16" or "fp8"
  std::string plan_out;               // empty: no plan file; *.binpb: binary, else JSON
  bool verify = false;
  bool json = false;
};

// Adds the `reshard` subcommand to `app`, writing into `args` (which must outlive
// the parse). Returns the subcommand.
CLI::App* AddReshardCommand(CLI::App& app, ReshardArgs& args);

// The options `reshard` and `run` share, as `reshard` states them (help, "Range:" and
// default, checks): --round-robin-experts, --colocated, --gpus-per-node,
// --intra-node-gb-per-s, --inter-node-gb-per-s, --bucket-mib (alias --bucket-mb) and
// --target-dtype, written into `args`.
void AddReshardPlacementOptions(CLI::App& command, ReshardArgs& args);

// The trainer layout of a --train value: comma-separated key=value pairs with keys
// tp, pp, vpp, ep, etp, cp, dp (each at most once, an integer in [1, 65536]; unset
// keys are 1) and first-stage-layers, last-stage-layers (Megatron-core's uneven
// pipeline split, TrainLayout.first_stage_layers / last_stage_layers; an integer in
// [1, 2^31 - 1]; unset: not set). Throws std::invalid_argument naming the option and the key for an
// unknown key, a missing or non-integer value, a value out of range, a duplicate key
// or an empty entry, e.g. "--train: unknown key 'tq' (keys: tp, pp, ...)".
v1::TrainLayout ParseTrainOption(std::string_view text);

// The engine layout of an --infer value: tp=N and replicas=N (integers, tp in
// [1, 65536], replicas in [1, 2^20]; unset: 1), and `ep` without a value for expert
// parallelism (EP = TP). Errors as ParseTrainOption(), naming --infer.
v1::InferLayout ParseInferOption(std::string_view text);

// The request `args` ask for, with `model_config_json` (the --model file's text).
// Throws std::invalid_argument naming the option for bad --train / --infer values
// and for --round-robin-experts without ep in --infer. The other values are checked
// by SolveReshard().
v1::ReshardRequest MakeReshardRequest(const ReshardArgs& args, std::string model_config_json);

// Runs the command: reads --model, plans, writes the summary (or the JSON line) to
// `out`, the plan file when asked, and with --verify the verification's result (to
// `out` after the summary; to `err` with --json, so that `out` stays one JSON line).
// Throws std::invalid_argument for bad input or options (the message names the
// option or the field; --verify on a model too large for the verifier),
// std::runtime_error when the plan fails verification or writing fails.
void RunReshardCommand(const ReshardArgs& args, std::ostream& out, std::ostream& err);

}  // namespace rlsched::app

#endif  // RLSCHED_APP_RESHARD_COMMAND_H_
