// plan_step_command.h — `rlsched plan-step`: plan a whole training step.
//
// Overview
//   Reads the global batch's lengths (as `rlsched balance` does, command_common.h),
//   builds a rlsched.v1.PlanStepRequest from the options and answers it with
//   SolvePlanStep() — the same path as the daemon: sequences to data-parallel ranks,
//   and each rank's sequences into micro-batches under a hard token cap, the same
//   count on every rank. Prints a readable table (per rank: sequences, tokens, cost,
//   micro-batches, largest micro-batch, predicted time; with --micro-batches each
//   micro-batch too; then the step time, its lower bound and gap, and the baseline
//   pipeline frameworks use today with its cap violations), or with --json the
//   PlanStepReply on one line.
//
// Example
//   CLI::App app;
//   rlsched::app::PlanStepArgs args;
//   CLI::App* plan_step = rlsched::app::AddPlanStepCommand(app, args);
//   app.parse(argc, argv);
//   if (plan_step->parsed()) rlsched::app::RunPlanStepCommand(args, std::cin, std::cout);
//
// Thread-safety: RunPlanStepCommand() touches no global state besides logging.

#ifndef RLSCHED_APP_PLAN_STEP_COMMAND_H_
#define RLSCHED_APP_PLAN_STEP_COMMAND_H_

#include <CLI/CLI.hpp>
#include <cstdint>
#include <istream>
#include <optional>
#include <ostream>
#include <string>

#include "command_common.h"
#include "lengths_reader.h"
#include "rlsched/v1/balance.pb.h"

namespace rlsched::app {

// The options of `rlsched plan-step`. Unset optionals were not given.
struct PlanStepArgs {
  InputArgs input;  // FILE, --example, --seed
  std::int64_t ranks = 8;
  std::int64_t max_tokens = 0;  // required
  std::int64_t min_micro_batches = 1;
  std::int64_t multiple_of = 1;
  std::int64_t pad_to = 1;
  std::int64_t pipeline_stages = 1;
  std::optional<std::int64_t> overhead;  // unset: the cost model's estimate
  double count_tolerance = 0.01;
  std::string order = "pipeline";  // "pipeline" or "heaviest-first"
  std::string oversize = "raise";  // "raise" or "alone"
  bool equal_size = false;
  bool keep_groups = false;
  CostArgs cost;  // --cost, the model shape, the coefficients
  std::optional<std::int64_t> refine_iterations;
  bool micro_batches = false;  // also list every micro-batch
  bool json = false;
};

// Adds the `plan-step` subcommand to `app`, writing into `args` (which must outlive
// the parse). Returns the subcommand.
CLI::App* AddPlanStepCommand(CLI::App& app, PlanStepArgs& args);

// The request for `input` under `args`. Throws std::invalid_argument naming the
// option for contradictory options (e.g. --cost tokens with a model shape,
// --keep-groups without groups). Values are validated later, by SolvePlanStep().
v1::PlanStepRequest MakePlanStepRequest(const PlanStepArgs& args, const LengthsInput& input);

// Runs the command: reads the lengths (args.input.file, or `in` when it is "-"; or
// the example), plans the step, and writes the table or the JSON reply to `out`.
// Throws std::invalid_argument for bad input or options (the message names the file
// and line, the field, or the sequence above the cap), std::runtime_error for
// failures that are not the user's.
void RunPlanStepCommand(const PlanStepArgs& args, std::istream& in, std::ostream& out);

}  // namespace rlsched::app

#endif  // RLSCHED_APP_PLAN_STEP_COMMAND_H_
