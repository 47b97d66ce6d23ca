#include "balance_command.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <span>
#include <stdexcept>

#include "format.h"
#include "rlsched/balance/balance.h"
#include "rlsched/balance/partition.h"
#include "rlsched/common/error.h"
#include "rlsched/wire/balance_convert.h"

namespace rlsched::app {

using namespace ::rlsched::wire;  // NOLINT: the conversions the commands call
namespace {

std::string DescribeAlgorithm(const BalanceArgs& args) {
  std::string text = args.algorithm == "lpt" ? "greedy LPT" : "Karmarkar-Karp";
  const std::int64_t steps =
      args.refine_iterations.value_or(balance::RefineOptions{}.max_iterations);
  if (steps == 0) {
    text += " (no refinement)";
  } else {
    text += fmt::format(" + refinement (up to {} steps)", steps);
  }
  return text;
}

// The naive contiguous split's figures, as a framework that does not balance gets them.
balance::BalanceResult EvaluateContiguous(const v1::BalanceRequest& request,
                                          balance::BalanceOptions options) {
  options.keep_groups = false;  // the contiguous split ignores groups; bound over sequences
  const std::span<const std::int64_t> lengths(request.lengths().data(),
                                              static_cast<std::size_t>(request.lengths_size()));
  const balance::Assignment assignment =
      balance::ContiguousSplit(request.lengths_size(), request.num_parts());
  return balance::Evaluate(lengths, options, assignment);
}

std::string Compare(const BalanceArgs& args, const v1::BalanceReply& reply,
                    const balance::Partition& naive) {
  std::string max_change;
  if (naive.max_load > 0 && reply.max_cost() != naive.max_load) {
    const double change =
        1.0 - static_cast<double>(reply.max_cost()) / static_cast<double>(naive.max_load);
    max_change = fmt::format("max cost {} {}", FormatPercent(std::fabs(change)),
                             change > 0 ? "lower" : "higher");
  } else {
    max_change = "same max cost";
  }
  if (args.keep_groups) return fmt::format("balanced (groups kept together): {}", max_change);
  if (naive.gap == 0.0) return "the contiguous split already reaches the lower bound";
  if (reply.gap() == 0.0) return fmt::format("balanced reaches the lower bound, {}", max_change);
  return fmt::format("balanced is {} lower imbalance, {}", FormatRatio(naive.gap / reply.gap()),
                     max_change);
}

void PrintBalanceTable(const BalanceArgs& args, const v1::BalanceRequest& request,
                       const v1::BalanceReply& reply, std::ostream& out) {
  const balance::BalanceOptions options = ToBalanceOptions(request);
  const balance::BalanceResult naive = EvaluateContiguous(request, options);

  std::string header = DescribeBatch(args.input, request.lengths(), request.groups());
  header += fmt::format(", k = {} parts", request.num_parts());
  if (request.equal_size()) header += ", equal size";
  if (request.keep_groups()) header += ", groups kept together";
  header += fmt::format("\ncost model: {}\nalgorithm: {}", DescribeCost(args.cost, options.cost),
                        DescribeAlgorithm(args));
  out << header << "\n\n";

  std::size_t part_width = std::max<std::size_t>(4, Digits(request.num_parts() - 1));
  std::size_t items_width = 5;
  std::size_t tokens_width = 6;
  std::size_t cost_width = 4;
  for (const v1::Part& part : reply.parts()) {
    items_width = std::max(items_width, Digits(part.indices_size()));
    tokens_width = std::max(tokens_width, Digits(part.tokens()));
    cost_width = std::max(cost_width, Digits(part.cost()));
  }
  // Small inputs: which sequence went where (indices into the input, 0-based).
  const bool assignment = request.lengths_size() <= kMaxAssignmentItems;
  out << fmt::format("{:>{}}  {:>{}}  {:>{}}  {:>{}}{}\n", "part", part_width, "items", items_width,
                     "tokens", tokens_width, "cost", cost_width, assignment ? "  sequences" : "");
  const std::int64_t rows = std::min<std::int64_t>(reply.parts_size(), kMaxTableRows);
  for (std::int64_t p = 0; p < rows; ++p) {
    const v1::Part& part = reply.parts(static_cast<int>(p));
    std::string sequences;
    if (assignment) sequences = fmt::format("  {}", fmt::join(part.indices(), " "));
    out << fmt::format("{:>{}}  {:>{}}  {:>{}}  {:>{}}{}\n", p, part_width, part.indices_size(),
                       items_width, part.tokens(), tokens_width, part.cost(), cost_width,
                       sequences);
  }
  if (reply.parts_size() > rows)
    out << fmt::format("… ({} more parts)\n", reply.parts_size() - rows);

  out << '\n';
  out << fmt::format("{:<16}{}\n", "max cost", reply.max_cost());
  out << fmt::format("{:<16}{}\n", "min cost", reply.min_cost());
  out << fmt::format("{:<16}{}\n", "lower bound", reply.lower_bound());
  out << fmt::format("{:<16}{} (max cost / lower bound - 1)\n", "gap", FormatPercent(reply.gap()));
  std::string optimal = reply.proven_optimal() ? "yes" : "no";
  if (reply.proven_optimal() && reply.gap() > 0) {
    // The exact search proved it: the bound (which whole groups or equal counts make
    // loose) is below the optimum.
    optimal =
        fmt::format("yes: optimal; the lower bound is {} below it", FormatPercent(reply.gap()));
  }
  out << fmt::format("{:<16}{}\n", "proven optimal", optimal);
  out << fmt::format("naive contiguous split: max cost {}, gap {} — {}\n", naive.partition.max_load,
                     FormatPercent(naive.partition.gap), Compare(args, reply, naive.partition));
}

}  // namespace

CLI::App* AddBalanceCommand(CLI::App& app, BalanceArgs& args) {
  CLI::App* command = app.add_subcommand(
      "balance",
      "Split a batch of sequences across K parts (data-parallel ranks) so that the heaviest "
      "part is as light as possible");
  command->fallthrough();
  command->footer(fmt::format(
      "{}\nOutput: a table, or with --json the rlsched.v1.BalanceReply in protobuf's JSON "
      "mapping (proto field names; int64 values are strings).\n"
      "Fields of rlsched.v1.BalanceRequest (the daemon's names): "
      "--ranks num_parts, --equal-size equal_size, --keep-groups keep_groups, --algorithm "
      "algorithm (kk KARMARKAR_KARP, lpt GREEDY), --refine-iterations refine_iterations, the "
      "cost options cost.*; the lengths and the group column lengths, groups.",
      kInputHelp));

  AddBoundedOption(*command, "--ranks,--parts", args.parts,
                   "Number of parts K: the data-parallel ranks (verl's and Megatron's "
                   "data-parallel size).",
                   IntegerRange{1, balance::kMaxParts}, fmt::format("{}", BalanceArgs{}.parts))
      ->type_name("K");
  command->add_flag("--equal-size", args.equal_size,
                    "Every part holds floor(n/K) or ceil(n/K) sequences (groups with "
                    "--keep-groups)");
  command->add_flag("--keep-groups", args.keep_groups,
                    "All sequences of a group (the CSV's group column) go to one part");
  command
      ->add_option("--algorithm", args.algorithm,
                   fmt::format("kk: Karmarkar-Karp (keeps greedy LPT's answer when better); lpt: "
                               "greedy longest first (default: {})",
                               BalanceArgs{}.algorithm))
      ->type_name("kk|lpt")
      ->check(CLI::IsMember({"kk", "lpt"}).description(""));
  AddRefineOption(*command, args.refine_iterations);
  command->add_flag("--json", args.json, "Print the BalanceReply as one line of JSON");
  AddInputOptions(*command, args.input, "Balance");
  AddCostOptions(*command, args.cost);
  return command;
}

v1::BalanceRequest MakeBalanceRequest(const BalanceArgs& args, const LengthsInput& input) {
  CheckKeepGroups(args.keep_groups, input);
  if (args.algorithm != "kk" && args.algorithm != "lpt") {
    Fail("--algorithm", fmt::format("must be kk or lpt, got '{}'", args.algorithm));
  }

  v1::BalanceRequest request;
  *request.mutable_cost() = MakeCostModel(args.cost);
  request.mutable_lengths()->Add(input.lengths.begin(), input.lengths.end());
  request.mutable_groups()->Add(input.groups.begin(), input.groups.end());
  request.set_num_parts(args.parts);
  request.set_equal_size(args.equal_size);
  request.set_keep_groups(args.keep_groups);
  request.set_algorithm(args.algorithm == "lpt" ? v1::ALGORITHM_GREEDY
                                                : v1::ALGORITHM_KARMARKAR_KARP);
  if (args.refine_iterations) request.set_refine_iterations(*args.refine_iterations);
  return request;
}

void RunBalanceCommand(const BalanceArgs& args, std::istream& in, std::ostream& out) {
  const LengthsInput input = ReadInput(args.input, in);
  const v1::BalanceRequest request = MakeBalanceRequest(args, input);
  const auto start = std::chrono::steady_clock::now();
  const v1::BalanceReply reply = SolveBalance(request);
  const std::chrono::duration<double, std::milli> elapsed =
      std::chrono::steady_clock::now() - start;
  spdlog::info("balanced {} sequences into {} parts in {:.3f} ms (max cost {}, gap {})",
               request.lengths_size(), request.num_parts(), elapsed.count(), reply.max_cost(),
               reply.gap());

  if (args.json) {
    WriteJson(reply, out);  // streamed, part by part
    out << '\n';
  } else {
    PrintBalanceTable(args, request, reply, out);
  }
  FlushOutput(out);
}

}  // namespace rlsched::app
