#include "plan_step_command.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <stdexcept>
#include <string_view>
#include <utility>
#include <vector>

#include "flag_errors.h"
#include "format.h"
#include "rlsched/balance/partition.h"
#include "rlsched/common/error.h"
#include "rlsched/wire/balance_convert.h"

namespace rlsched::app {

using namespace ::rlsched::wire;  // NOLINT: the conversions the commands call
namespace {

constexpr std::string_view kPipelineOrder = "pipeline";
constexpr std::string_view kHeaviestFirstOrder = "heaviest-first";
constexpr std::string_view kOversizeRaise = "raise";
constexpr std::string_view kOversizeAlone = "alone";
// The most pipeline stages the step planner accepts (balance::internal's bound).
constexpr std::int64_t kMaxPipelineStages = 65536;

std::string DescribeMicroBatches(const v1::PlanStepRequest& request) {
  std::string text =
      fmt::format("micro-batches: at most {} tokens each", request.max_tokens_per_micro_batch());
  if (request.pad_to_multiple_of() > 1) {
    text += fmt::format(" (lengths padded to a multiple of {})", request.pad_to_multiple_of());
  }
  if (request.min_micro_batches() > 1) {
    text += fmt::format(", at least {} per rank", request.min_micro_batches());
  }
  if (request.micro_batches_multiple_of() > 1) {
    text += fmt::format(", a multiple of {}", request.micro_batches_multiple_of());
  }
  text += request.order() == v1::MICRO_BATCH_ORDER_HEAVIEST_FIRST
              ? ", heaviest first"
              : ", in pipeline order (light ones at both ends)";
  if (request.oversize() == v1::OVERSIZE_POLICY_ALONE) {
    text += "; a longer sequence alone in a micro-batch of its own";
  }
  return text;
}

std::string DescribeTime(const v1::PlanStepRequest& request, const v1::PlanStepReply& reply) {
  const std::int64_t stages = std::max<std::int64_t>(1, request.pipeline_stages());
  return fmt::format(
      "step time: p = {} pipeline stage{}, overhead {} per micro-batch{}; a rank's time is "
      "Σ t_i + (p − 1)·max t_i with t_i = cost_i + overhead",
      stages, stages == 1 ? "" : "s", reply.overhead(),
      request.has_overhead() ? "" : " (the default, estimated from the model shape)");
}

// "8", or "8 (3 empty)" when the rank has fewer sequences than micro-batches.
std::string CountMicroBatches(const v1::RankPlan& rank) {
  const auto empty = std::count_if(rank.micro_batches().begin(), rank.micro_batches().end(),
                                   [](const v1::MicroBatch& b) { return b.indices_size() == 0; });
  if (empty == 0) return fmt::format("{}", rank.micro_batches_size());
  return fmt::format("{} ({} empty)", rank.micro_batches_size(), empty);
}

std::int64_t LargestMicroBatch(const v1::RankPlan& rank) {
  std::int64_t tokens = 0;
  for (const v1::MicroBatch& batch : rank.micro_batches())
    tokens = std::max(tokens, batch.tokens());
  return tokens;
}

void PrintRanks(const v1::PlanStepReply& reply, std::ostream& out) {
  const std::int64_t rows = std::min<std::int64_t>(reply.ranks_size(), kMaxTableRows);
  std::vector<std::string> counts;
  std::size_t rank_width = std::max<std::size_t>(4, Digits(reply.ranks_size() - 1));
  std::size_t sequences_width = 9;
  std::size_t tokens_width = 6;
  std::size_t cost_width = 4;
  std::size_t count_width = 13;
  std::size_t largest_width = 13;
  std::size_t time_width = 4;
  for (std::int64_t r = 0; r < rows; ++r) {
    const v1::RankPlan& rank = reply.ranks(static_cast<int>(r));
    counts.push_back(CountMicroBatches(rank));
    sequences_width = std::max(sequences_width, Digits(rank.sequences()));
    tokens_width = std::max(tokens_width, Digits(rank.tokens()));
    cost_width = std::max(cost_width, Digits(rank.cost()));
    count_width = std::max(count_width, counts.back().size());
    largest_width = std::max(largest_width, Digits(LargestMicroBatch(rank)));
    time_width = std::max(time_width, Digits(rank.time()));
  }
  out << fmt::format("{:>{}}  {:>{}}  {:>{}}  {:>{}}  {:>{}}  {:>{}}  {:>{}}\n", "rank", rank_width,
                     "sequences", sequences_width, "tokens", tokens_width, "cost", cost_width,
                     "micro-batches", count_width, "max mb tokens", largest_width, "time",
                     time_width);
  for (std::int64_t r = 0; r < rows; ++r) {
    const v1::RankPlan& rank = reply.ranks(static_cast<int>(r));
    out << fmt::format("{:>{}}  {:>{}}  {:>{}}  {:>{}}  {:>{}}  {:>{}}  {:>{}}\n", r, rank_width,
                       rank.sequences(), sequences_width, rank.tokens(), tokens_width, rank.cost(),
                       cost_width, counts[static_cast<std::size_t>(r)], count_width,
                       LargestMicroBatch(rank), largest_width, rank.time(), time_width);
  }
  if (reply.ranks_size() > rows) {
    out << fmt::format("… ({} more ranks)\n", reply.ranks_size() - rows);
  }
}

// Every micro-batch of the listed ranks, in execution order.
void PrintMicroBatches(const v1::PlanStepReply& reply, std::ostream& out) {
  const std::int64_t rows = std::min<std::int64_t>(reply.ranks_size(), kMaxTableRows);
  std::size_t rank_width = std::max<std::size_t>(4, Digits(reply.ranks_size() - 1));
  std::size_t index_width = 11;
  std::size_t sequences_width = 9;
  std::size_t tokens_width = 6;
  std::size_t cost_width = 4;
  for (std::int64_t r = 0; r < rows; ++r) {
    const v1::RankPlan& rank = reply.ranks(static_cast<int>(r));
    index_width = std::max(index_width, Digits(rank.micro_batches_size() - 1));
    for (const v1::MicroBatch& batch : rank.micro_batches()) {
      sequences_width = std::max(sequences_width, Digits(batch.indices_size()));
      tokens_width = std::max(tokens_width, Digits(batch.tokens()));
      cost_width = std::max(cost_width, Digits(batch.cost()));
    }
  }
  out << fmt::format("{:>{}}  {:>{}}  {:>{}}  {:>{}}  {:>{}}\n", "rank", rank_width, "micro-batch",
                     index_width, "sequences", sequences_width, "tokens", tokens_width, "cost",
                     cost_width);
  for (std::int64_t r = 0; r < rows; ++r) {
    const v1::RankPlan& rank = reply.ranks(static_cast<int>(r));
    for (int j = 0; j < rank.micro_batches_size(); ++j) {
      const v1::MicroBatch& batch = rank.micro_batches(j);
      out << fmt::format("{:>{}}  {:>{}}  {:>{}}  {:>{}}  {:>{}}\n", r, rank_width, j, index_width,
                         batch.indices_size(), sequences_width, batch.tokens(), tokens_width,
                         batch.cost(), cost_width);
    }
  }
  if (reply.ranks_size() > rows) {
    out << fmt::format("… ({} more ranks)\n", reply.ranks_size() - rows);
  }
}

std::string DescribeViolations(std::int64_t violations) {
  if (violations == 0) return "none";
  return fmt::format("{} micro-batch{} over the cap — a possible out-of-memory", violations,
                     violations == 1 ? "" : "es");
}

// Our step time against the baseline's: one figure, the relative difference of the
// predicted step times.
std::string CompareWithBaseline(const v1::PlanStepRequest& request,
                                const v1::PlanStepReply& reply) {
  const std::int64_t ours = reply.predicted_step_time();
  const std::int64_t theirs = reply.baseline().predicted_step_time();
  // Micro-batches over the cap that hold a sequence above it (--oversize alone) are no
  // fault of the recipe's: every plan has them.
  const bool breaks_cap = reply.baseline().cap_violations() > reply.oversized();
  std::string text;
  if (ours == theirs) {
    text = "the same step time as the baseline";
  } else if (ours < theirs) {
    const double lower = 1.0 - static_cast<double>(ours) / static_cast<double>(theirs);
    text = fmt::format("step time {} lower than the baseline's", FormatPercent(lower));
  } else {
    const double higher = static_cast<double>(ours) / static_cast<double>(theirs) - 1.0;
    text = fmt::format("step time {} higher than the baseline's", FormatPercent(higher));
    if (!breaks_cap && request.keep_groups()) text += ", which splits groups";
  }
  if (breaks_cap) text += ", which breaks the cap and is not a valid plan";
  return text;
}

void PrintStepTable(const PlanStepArgs& args, const v1::PlanStepRequest& request,
                    const v1::PlanStepReply& reply, std::ostream& out) {
  const balance::StepOptions options = ToStepOptions(request);
  std::string header = DescribeBatch(args.input, request.lengths(), request.groups());
  header +=
      fmt::format(", R = {} rank{}", request.num_ranks(), request.num_ranks() == 1 ? "" : "s");
  if (request.equal_size()) header += ", equal size";
  if (request.keep_groups()) header += ", groups kept together";
  header +=
      fmt::format("\n{}\n{}\ncost model: {}", DescribeMicroBatches(request),
                  DescribeTime(request, reply), DescribeCost(args.cost, options.micro_batch.cost));
  out << header << "\n\n";

  PrintRanks(reply, out);
  if (args.micro_batches) {
    out << '\n';
    PrintMicroBatches(reply, out);
  }

  out << '\n';
  out << fmt::format("{:<16}{} per rank", "micro-batches", reply.micro_batches());
  if (reply.empty_micro_batches() > 0) {
    out << fmt::format(" ({} empty, forced by the input)", reply.empty_micro_batches());
  }
  out << '\n';
  if (reply.empty_ranks() > 0) {
    out << fmt::format("{:<16}{} (fewer sequences or groups than ranks)\n", "empty ranks",
                       reply.empty_ranks());
  }
  if (reply.oversized() > 0) {
    out << fmt::format("{:<16}{} sequences above the cap, each alone in a micro-batch\n",
                       "oversized", reply.oversized());
  }
  out << fmt::format(
      "{:<16}{} sequences, {} tokens ({} padded): a token-mean loss divides by "
      "the step's tokens, not a micro-batch's\n",
      "step totals", reply.sequences(), reply.unpadded_tokens(), reply.tokens());
  out << fmt::format("{:<16}{} (predicted)\n", "step time", reply.predicted_step_time());
  out << fmt::format("{:<16}{}\n", "lower bound", reply.lower_bound());
  const double gap = reply.lower_bound() > 0 ? static_cast<double>(reply.predicted_step_time()) /
                                                       static_cast<double>(reply.lower_bound()) -
                                                   1.0
                                             : 0.0;
  out << fmt::format("{:<16}{} (step time / lower bound - 1)\n", "gap", FormatPercent(gap));
  out << "\nbaseline (the common recipe, as verl runs it: Karmarkar-Karp on 24576·L + L² across "
         "ranks, then ceil(tokens / cap) micro-batches, the max over ranks; our cost model):\n";
  out << fmt::format("{:<16}{} per rank", "micro-batches", reply.baseline().micro_batches());
  if (reply.baseline().empty_micro_batches() > 0) {
    out << fmt::format(" ({} empty)", reply.baseline().empty_micro_batches());
  }
  out << '\n';
  out << fmt::format("{:<16}{}\n", "step time", reply.baseline().predicted_step_time());
  out << fmt::format("{:<16}{}\n", "cap violations",
                     DescribeViolations(reply.baseline().cap_violations()));
  out << fmt::format("ours: {}\n", CompareWithBaseline(request, reply));
}

}  // namespace

namespace {

std::string PlanStepFooter() {
  return fmt::format(
      "{}\nOutput: a table, or with --json the rlsched.v1.PlanStepReply in protobuf's JSON "
      "mapping (proto field names; int64 values are strings).\n"
      "Fields of rlsched.v1.PlanStepRequest (the daemon's names): --ranks num_ranks, "
      "--max-token-len max_tokens_per_micro_batch, --min-micro-batches min_micro_batches, "
      "--micro-batches-multiple-of micro_batches_multiple_of, --pad-to-multiple-of "
      "pad_to_multiple_of, --pipeline-model-parallel-size pipeline_stages, --overhead overhead, "
      "--count-tolerance count_tolerance, --order order (heaviest-first HEAVIEST_FIRST), "
      "--oversize oversize (alone OVERSIZE_POLICY_ALONE), --equal-size equal_size, --keep-groups "
      "keep_groups, --refine-iterations "
      "refine_iterations, the cost options cost.*.\n"
      "The plan is compared with the common recipe as verl runs it: Karmarkar-Karp across ranks on "
      "verl's workload key 24576·L + L², then per rank ceil(tokens / cap) micro-batches (the max "
      "over ranks) by Karmarkar-Karp on the same key — which can put a micro-batch over the cap; "
      "its step time is predicted with our cost model.",
      kInputHelp);
}

// The step's shape: the ranks, the cap's padding, the pipeline, the launch cost.
void AddStepShapeOptions(CLI::App& command, PlanStepArgs& args) {
  const PlanStepArgs defaults;
  AddBoundedOption(command, "--ranks", args.ranks,
                   "Number of data-parallel ranks R (verl's and Megatron's "
                   "data-parallel size).",
                   IntegerRange{1, balance::kMaxParts}, fmt::format("{}", defaults.ranks))
      ->type_name("R");
  AddBoundedOption(command, "--max-token-len,--max-tokens,--max-tokens-per-micro-batch",
                   args.max_tokens,
                   "Hard cap on the (padded) tokens of one micro-batch, in tokens "
                   "(verl's max_token_len per GPU, ppo_max_token_len_per_gpu with "
                   "use_dynamic_bsz); a longer sequence follows --oversize.",
                   IntegerRange{1, kInt64Max}, "none, required")
      ->type_name("TOKENS")
      ->required();
  AddBoundedOption(command, "--min-micro-batches", args.min_micro_batches,
                   fmt::format("At least N micro-batches per rank; R × the count must stay <= {}.",
                               balance::kMaxForcedMicroBatches),
                   IntegerRange{1, balance::kMaxParts},
                   fmt::format("{}", defaults.min_micro_batches))
      ->type_name("N");
  AddBoundedOption(
      command, "--micro-batches-multiple-of,--multiple-of", args.multiple_of,
      fmt::format("The micro-batch count is a multiple of N (e.g. the pipeline-parallel "
                  "size, as Megatron's interleaved schedule requires); R × the count "
                  "must stay <= {}.",
                  balance::kMaxForcedMicroBatches),
      IntegerRange{1, balance::kMaxParts}, fmt::format("{}", defaults.multiple_of))
      ->type_name("N");
  AddBoundedOption(command, "--pad-to-multiple-of,--pad-to", args.pad_to,
                   "Pad every length up to a multiple of N tokens (e.g. 2·CP·TP) before "
                   "it counts against the cap and the cost; the padded lengths' total must stay "
                   "below 2^63.",
                   IntegerRange{1, kInt64Max}, fmt::format("{}", defaults.pad_to))
      ->type_name("N");
  AddBoundedOption(command, "--pipeline-model-parallel-size,--pipeline-stages,--pp",
                   args.pipeline_stages,
                   "Pipeline-parallel stages p (Megatron's pipeline_model_parallel_size): "
                   "a rank's time is Σ t_i + (p − 1)·max t_i (1F1B), t_i = cost_i + "
                   "overhead.",
                   IntegerRange{1, kMaxPipelineStages}, fmt::format("{}", defaults.pipeline_stages))
      ->type_name("P");
  AddBoundedOption(
      command, "--overhead", args.overhead,
      "Cost of one micro-batch launch (forward + backward) in cost units "
      "(tokens of linear work); 0 makes micro-batches free; a rank's time with it must "
      "stay below 2^63.",
      IntegerRange{0, kInt64Max},
      "estimated from the model shape (streaming the weights, "
      "kernel launches, the framework's own work on an "
      "H100-class GPU): 190 for the default Llama-3.1-8B "
      "shape")
      ->type_name("X");
  AddBoundedOption(command, "--count-tolerance", args.count_tolerance,
                   "The micro-batch count is the smallest whose predicted step time is "
                   "within this fraction of the best count's.",
                   RealRange{0.0, 1.0}, fmt::format("{:g}", defaults.count_tolerance))
      ->type_name("F");
}

// How a rank's micro-batches are ordered, and what a sequence above the cap does.
void AddStepPolicyOptions(CLI::App& command, PlanStepArgs& args) {
  const PlanStepArgs defaults;
  command
      .add_option("--order", args.order,
                  fmt::format("Order of a rank's micro-batches: pipeline (light ones at both ends, "
                              "the heaviest in the middle) or heaviest-first (default: {})",
                              defaults.order))
      ->type_name("pipeline|heaviest-first")
      ->check(CLI::IsMember({std::string(kPipelineOrder), std::string(kHeaviestFirstOrder)})
                  .description(""));
  command
      .add_option("--oversize", args.oversize,
                  fmt::format("A sequence longer than the cap (padded): raise (an error naming "
                              "it, as verl does) or alone (a micro-batch of its own, as slime "
                              "does) (default: {})",
                              defaults.oversize))
      ->type_name("raise|alone")
      ->check(CLI::IsMember({std::string(kOversizeRaise), std::string(kOversizeAlone)})
                  .description(""));
}

}  // namespace

CLI::App* AddPlanStepCommand(CLI::App& app, PlanStepArgs& args) {
  CLI::App* command = app.add_subcommand(
      "plan-step",
      "Plan a whole training step: sequences to R data-parallel ranks, and each rank's into "
      "micro-batches under a hard token cap, the same count on every rank, minimising the "
      "predicted step time");
  command->fallthrough();
  command->footer(PlanStepFooter());
  AddStepShapeOptions(*command, args);
  AddStepPolicyOptions(*command, args);
  command->add_flag("--equal-size", args.equal_size,
                    "Every rank holds floor(n/R) or ceil(n/R) sequences (groups with "
                    "--keep-groups)");
  command->add_flag("--keep-groups", args.keep_groups,
                    "All sequences of a group (the CSV's group column) go to one rank");
  AddRefineOption(*command, args.refine_iterations);
  command->add_flag("--micro-batches", args.micro_batches,
                    "Also list every rank's micro-batches (sequences, tokens, cost)");
  command->add_flag("--json", args.json, "Print the PlanStepReply as one line of JSON");
  AddInputOptions(*command, args.input, "Plan");
  AddCostOptions(*command, args.cost);
  return command;
}

v1::PlanStepRequest MakePlanStepRequest(const PlanStepArgs& args, const LengthsInput& input) {
  CheckKeepGroups(args.keep_groups, input);
  if (args.order != kPipelineOrder && args.order != kHeaviestFirstOrder) {
    Fail("--order", fmt::format("must be pipeline or heaviest-first, got '{}'", args.order));
  }
  if (args.oversize != kOversizeRaise && args.oversize != kOversizeAlone) {
    throw FieldError("--oversize", fmt::format("must be raise or alone, got '{}'", args.oversize));
  }

  v1::PlanStepRequest request;
  *request.mutable_cost() = MakeCostModel(args.cost);
  request.mutable_lengths()->Add(input.lengths.begin(), input.lengths.end());
  request.mutable_groups()->Add(input.groups.begin(), input.groups.end());
  request.set_equal_size(args.equal_size);
  request.set_keep_groups(args.keep_groups);
  request.set_num_ranks(args.ranks);
  request.set_max_tokens_per_micro_batch(args.max_tokens);
  request.set_min_micro_batches(args.min_micro_batches);
  request.set_micro_batches_multiple_of(args.multiple_of);
  request.set_pad_to_multiple_of(args.pad_to);
  request.set_pipeline_stages(args.pipeline_stages);
  if (args.overhead) request.set_overhead(*args.overhead);
  request.set_count_tolerance(args.count_tolerance);
  request.set_order(args.order == kHeaviestFirstOrder ? v1::MICRO_BATCH_ORDER_HEAVIEST_FIRST
                                                      : v1::MICRO_BATCH_ORDER_PIPELINE);
  request.set_oversize(args.oversize == kOversizeAlone ? v1::OVERSIZE_POLICY_ALONE
                                                       : v1::OVERSIZE_POLICY_RAISE);
  if (args.refine_iterations) request.set_refine_iterations(*args.refine_iterations);
  return request;
}

namespace {

// The plan's fields and the flags that set them.
const FlagField kStepFlags[] = {
    {.flag = "--ranks", .path = "num_ranks"},
    {.flag = "--max-token-len", .path = "max_tokens_per_micro_batch"},
    {.flag = "--min-micro-batches", .path = "min_micro_batches"},
    {.flag = "--micro-batches-multiple-of", .path = "micro_batches_multiple_of"},
    {.flag = "--pad-to-multiple-of", .path = "pad_to_multiple_of"},
    {.flag = "--pipeline-model-parallel-size", .path = "pipeline_stages"},
    {.flag = "--overhead", .path = "overhead"},
    {.flag = "--count-tolerance", .path = "count_tolerance"},
    {.flag = "--refine-iterations", .path = "refine_iterations"},
    {.flag = "--oversize", .path = "oversize"},
};

// A sequence above the cap names the cap by the flag that set it.
FieldError NamingTheCapFlag(const FieldError& e) {
  constexpr std::string_view kCapField = "max_tokens_per_micro_batch";
  const std::size_t cap = e.requirement().find(kCapField);
  if (!e.field().starts_with("lengths") || cap == std::string::npos) return e;
  std::string requirement = e.requirement();
  requirement.replace(cap, kCapField.size(), "--max-token-len");
  return FieldError(e.field(), requirement);
}

}  // namespace

void RunPlanStepCommand(const PlanStepArgs& args, std::istream& in, std::ostream& out) {
  const LengthsInput input = ReadInput(args.input, in);
  const v1::PlanStepRequest request = MakePlanStepRequest(args, input);
  const auto start = std::chrono::steady_clock::now();
  const v1::PlanStepReply reply = [&] {
    try {
      return SolvePlanStep(request);
    } catch (const FieldError& e) {
      // In the command's terms: "--micro-batches-multiple-of (micro_batches_multiple_of): …".
      throw NamingTheCapFlag(ToFlagError(e, kStepFlags));
    }
  }();
  const std::chrono::duration<double, std::milli> elapsed =
      std::chrono::steady_clock::now() - start;
  spdlog::info(
      "planned {} sequences on {} ranks in {:.3f} ms ({} micro-batches per rank, step time {}, "
      "lower bound {}; baseline {}, {} over the cap)",
      request.lengths_size(), request.num_ranks(), elapsed.count(), reply.micro_batches(),
      reply.predicted_step_time(), reply.lower_bound(), reply.baseline().predicted_step_time(),
      reply.baseline().cap_violations());
  if (reply.empty_micro_batches() > 0 || reply.empty_ranks() > 0) {
    spdlog::warn(
        "the plan has {} empty micro-batches and {} empty ranks: the input forces them (fewer "
        "sequences or groups than ranks × the micro-batch count {}); a trainer must handle "
        "them",
        reply.empty_micro_batches(), reply.empty_ranks(), reply.micro_batches());
  }

  if (args.json) {
    WriteJson(reply, out);  // streamed, rank by rank
    out << '\n';
  } else {
    PrintStepTable(args, request, reply, out);
  }
  FlushOutput(out);
}

}  // namespace rlsched::app
