// balance_command.h — `rlsched balance`: balance a batch of sequence lengths.
//
// Overview
//   Reads lengths (lengths_reader.h) from a file or stdin, or takes the built-in
//   example batch, builds a rlsched.v1.BalanceRequest from the options and answers
//   it with SolveBalance() — the same path as the daemon. The input and cost-model
//   options are those of `rlsched plan-step` (command_common.h). Prints a readable table
//   (per part: items, tokens, cost; then max/min cost, lower bound, gap, proven
//   optimality, and the naive contiguous split for comparison), or with --json the
//   BalanceReply on one line.
//
// Example
//   CLI::App app;
//   rlsched::app::BalanceArgs args;
//   CLI::App* balance = rlsched::app::AddBalanceCommand(app, args);
//   app.parse(argc, argv);
//   if (balance->parsed()) rlsched::app::RunBalanceCommand(args, std::cin, std::cout);
//
// Thread-safety: RunBalanceCommand() touches no global state besides logging.

#ifndef RLSCHED_APP_BALANCE_COMMAND_H_
#define RLSCHED_APP_BALANCE_COMMAND_H_

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

// The options of `rlsched balance`. Unset optionals were not given.
struct BalanceArgs {
  InputArgs input;  // FILE, --example, --seed
  std::int64_t parts = 8;
  bool equal_size = false;
  bool keep_groups = false;
  CostArgs cost;                 // --cost, the model shape, the coefficients
  std::string algorithm = "kk";  // "kk" or "lpt"
  std::optional<std::int64_t> refine_iterations;
  bool json = false;
};

// Adds the `balance` subcommand to `app`, writing into `args` (which must outlive
// the parse). Returns the subcommand.
CLI::App* AddBalanceCommand(CLI::App& app, BalanceArgs& args);

// The request for `input` under `args`. Throws std::invalid_argument naming the
// option for contradictory options (e.g. --cost tokens with a model shape,
// --keep-groups without groups). Values are validated later, by SolveBalance().
v1::BalanceRequest MakeBalanceRequest(const BalanceArgs& args, const LengthsInput& input);

// Runs the command: reads the lengths (args.input.file, or `in` when it is "-"; or
// the example), solves, and writes the table or the JSON reply to `out`. Throws
// std::invalid_argument for bad input or options (the message names the file and
// line, or the field), std::runtime_error for failures that are not the user's.
void RunBalanceCommand(const BalanceArgs& args, std::istream& in, std::ostream& out);

}  // namespace rlsched::app

#endif  // RLSCHED_APP_BALANCE_COMMAND_H_
