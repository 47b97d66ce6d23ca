#include "balance_command.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <span>
#include <stdexcept>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "balance_convert.h"
#include "rlsched/balance/balance.h"
#include "rlsched/balance/partition.h"
#include "rlsched/balance/synthetic.h"

namespace rlsched::scheduler {
namespace {

constexpr std::int64_t kMaxTableRows = 64;
constexpr std::int64_t kInt64Max = std::numeric_limits<std::int64_t>::max();

// An integer option in [min, max]; the error reads
// "--opt: must be an integer in [min, max], got 'x'".
CLI::Validator IntegerIn(std::int64_t min, std::int64_t max) {
  const std::string bound =
      max == kInt64Max ? fmt::format(">= {}", min) : fmt::format("in [{}, {}]", min, max);
  return CLI::Validator(
      [min, max, bound](std::string& text) -> std::string {
        std::int64_t value = 0;
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, value);
        if (text.empty() || ptr != end || ec != std::errc() || value < min || value > max) {
          return fmt::format("must be an integer {}, got '{}'", bound, text);
        }
        return std::string();
      },
      "");
}

// An unsigned 64-bit integer (no sign).
CLI::Validator Unsigned64() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        std::uint64_t value = 0;
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, value);
        if (text.empty() || ptr != end || ec != std::errc()) {
          return fmt::format("must be an integer in [0, 2^64), got '{}'", text);
        }
        return std::string();
      },
      "");
}

// A finite real number >= 0.
CLI::Validator NonNegativeReal() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        double value = 0.0;
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, value);
        if (text.empty() || ptr != end || ec != std::errc() || !std::isfinite(value) ||
            value < 0.0) {
          return fmt::format("must be a finite number >= 0, got '{}'", text);
        }
        return std::string();
      },
      "");
}

bool HasShapeOptions(const BalanceArgs& args) {
  return args.hidden_size || args.num_layers || args.ffn_hidden_size || args.num_heads ||
         args.num_kv_heads || args.vocab_size || args.plain_mlp || args.per_sequence;
}

bool HasCoefficientOptions(const BalanceArgs& args) {
  return args.linear || args.quadratic || args.constant;
}

bool UsesAttention(const BalanceArgs& args) {
  return args.cost == "attention" ||
         (args.cost.empty() && (HasShapeOptions(args) || HasCoefficientOptions(args)));
}

LengthsInput ReadNamed(std::istream& in, std::string_view name) {
  try {
    return ReadLengths(in);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(fmt::format("{}: {}", name, e.what()));
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(fmt::format("{}: {}", name, e.what()));
  }
}

LengthsInput ReadFile(const std::string& path) {
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    throw std::invalid_argument(fmt::format("{}: is a directory", path));
  }
  std::ifstream file(path);
  if (!file) {
    throw std::invalid_argument(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  }
  return ReadNamed(file, path);
}

std::string FormatPercent(double fraction) {
  const double percent = fraction * 100.0;
  if (percent == 0.0) return "0%";
  if (std::fabs(percent) >= 0.01) return fmt::format("{:.2f}%", percent);
  return fmt::format("{:.2g}%", percent);
}

std::string FormatRatio(double ratio) {
  return ratio >= 100.0 ? fmt::format("{:.0f}×", ratio) : fmt::format("{:.1f}×", ratio);
}

std::size_t Digits(std::int64_t value) { return fmt::formatted_size("{}", value); }

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

std::string DescribeCost(const BalanceArgs& args, const balance::CostModel& cost) {
  std::string text = cost.Describe();
  if (cost.kind() == balance::CostModel::Kind::kAttention && !HasCoefficientOptions(args)) {
    text += HasShapeOptions(args) ? " from the model shape"
                                  : " from the default model shape (Llama-3.1-8B)";
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

void PrintTable(const BalanceArgs& args, const v1::BalanceRequest& request,
                const v1::BalanceReply& reply, std::ostream& out) {
  const balance::BalanceOptions options = ToBalanceOptions(request);
  const balance::BalanceResult naive = EvaluateContiguous(request, options);

  std::int64_t total_tokens = 0;
  for (const std::int64_t length : request.lengths()) total_tokens += length;
  std::string header;
  if (args.example) {
    header = fmt::format("example GRPO batch ({} prompts × {} samples, seed {}): ", kExamplePrompts,
                         kExampleSamples, args.seed);
  }
  header += fmt::format("{} sequences", request.lengths_size());
  if (request.groups_size() > 0) {
    std::vector<std::int64_t> groups(request.groups().begin(), request.groups().end());
    std::sort(groups.begin(), groups.end());
    const auto distinct = std::unique(groups.begin(), groups.end()) - groups.begin();
    header += fmt::format(" in {} groups", distinct);
  }
  header += fmt::format(", {} tokens, k = {} parts", total_tokens, request.num_parts());
  if (request.equal_size()) header += ", equal size";
  if (request.keep_groups()) header += ", groups kept together";
  header += fmt::format("\ncost model: {}\nalgorithm: {}", DescribeCost(args, options.cost),
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
  out << fmt::format("{:>{}}  {:>{}}  {:>{}}  {:>{}}\n", "part", part_width, "items", items_width,
                     "tokens", tokens_width, "cost", cost_width);
  const std::int64_t rows = std::min<std::int64_t>(reply.parts_size(), kMaxTableRows);
  for (std::int64_t p = 0; p < rows; ++p) {
    const v1::Part& part = reply.parts(static_cast<int>(p));
    out << fmt::format("{:>{}}  {:>{}}  {:>{}}  {:>{}}\n", p, part_width, part.indices_size(),
                       items_width, part.tokens(), tokens_width, part.cost(), cost_width);
  }
  if (reply.parts_size() > rows)
    out << fmt::format("… ({} more parts)\n", reply.parts_size() - rows);

  out << '\n';
  out << fmt::format("{:<16}{}\n", "max cost", reply.max_cost());
  out << fmt::format("{:<16}{}\n", "min cost", reply.min_cost());
  out << fmt::format("{:<16}{}\n", "lower bound", reply.lower_bound());
  out << fmt::format("{:<16}{} (max cost / lower bound - 1)\n", "gap", FormatPercent(reply.gap()));
  out << fmt::format("{:<16}{}\n", "proven optimal", reply.proven_optimal() ? "yes" : "no");
  out << fmt::format("naive contiguous split: max cost {}, gap {} — {}\n", naive.partition.max_load,
                     FormatPercent(naive.partition.gap), Compare(args, reply, naive.partition));
}

}  // namespace

CLI::App* AddBalanceCommand(CLI::App& app, BalanceArgs& args) {
  const balance::ModelShape shape;
  CLI::App* command = app.add_subcommand(
      "balance",
      "Split a batch of sequences across K parts (data-parallel ranks) so that the heaviest "
      "part is as light as possible");
  command->fallthrough();
  command->footer(
      "Input: integers separated by whitespace (one per line or several), or a CSV whose "
      "header names the columns: prompt_tokens + response_tokens (summed), or length, or "
      "tokens; and optionally group.\n"
      "Output: a table, or with --json the rlsched.v1.BalanceReply in protobuf's JSON "
      "mapping (proto field names; int64 values are strings).");

  CLI::Option* file =
      command->add_option("FILE", args.file, "File with the sequence lengths; '-' or none: stdin")
          ->type_name("");

  command->add_option("--parts", args.parts, "Number of parts K (data-parallel ranks)")
      ->type_name("K")
      ->check(IntegerIn(1, balance::kMaxParts))
      ->capture_default_str();
  command->add_flag("--equal-size", args.equal_size,
                    "Every part holds floor(n/K) or ceil(n/K) sequences (groups with "
                    "--keep-groups)");
  command->add_flag("--keep-groups", args.keep_groups,
                    "All sequences of a group (the CSV's group column) go to one part");
  command
      ->add_option(
          "--cost", args.cost,
          fmt::format("Cost of a sequence of L tokens: tokens (= L) or attention "
                      "(linear·L + quadratic·L² + constant). Attention takes its coefficients "
                      "from the model shape options below, or from the coefficient options; "
                      "with neither, from a Llama-3.1-8B shape (hidden {}, {} layers, FFN {}, "
                      "{} heads, {} KV heads, vocab {}). Default: tokens, or attention when a "
                      "shape or coefficient option is given",
                      shape.hidden_size, shape.num_layers, shape.ffn_hidden_size,
                      shape.num_attention_heads, shape.num_kv_heads, shape.vocab_size))
      ->type_name("tokens|attention")
      ->check(CLI::IsMember({"tokens", "attention"}).description(""));
  command
      ->add_option("--algorithm", args.algorithm,
                   "kk: Karmarkar-Karp (keeps greedy LPT's answer when better); lpt: greedy "
                   "longest first")
      ->type_name("kk|lpt")
      ->check(CLI::IsMember({"kk", "lpt"}).description(""))
      ->capture_default_str();
  command
      ->add_option("--refine-iterations", args.refine_iterations,
                   fmt::format("Local-search budget in improving steps; 0 disables it "
                               "(default {})",
                               balance::RefineOptions{}.max_iterations))
      ->type_name("N")
      ->check(IntegerIn(0, kInt64Max));
  command->add_flag("--json", args.json, "Print the BalanceReply as one line of JSON");
  CLI::Option* example = command->add_flag(
      "--example", args.example,
      fmt::format("Balance a built-in GRPO batch instead of a file: {} prompts × {} samples, "
                  "heavy-tailed lengths ({} sequences)",
                  kExamplePrompts, kExampleSamples, kExamplePrompts * kExampleSamples));
  example->excludes(file);
  command->add_option("--seed", args.seed, "Seed of the --example batch")
      ->type_name("N")
      ->check(Unsigned64())
      ->needs(example)
      ->capture_default_str();

  // Shape and coefficients exclude each other; MakeBalanceRequest() says so.
  const std::string shape_group =
      "Model shape (attention cost; unset values are Llama-3.1-8B's; not with coefficients)";
  command->add_option("--hidden-size", args.hidden_size, "Hidden size")
      ->type_name("N")
      ->check(IntegerIn(1, kInt64Max))
      ->group(shape_group);
  command->add_option("--num-layers", args.num_layers, "Number of transformer layers")
      ->type_name("N")
      ->check(IntegerIn(1, kInt64Max))
      ->group(shape_group);
  command->add_option("--ffn-hidden-size", args.ffn_hidden_size, "FFN (intermediate) size")
      ->type_name("N")
      ->check(IntegerIn(1, kInt64Max))
      ->group(shape_group);
  command->add_option("--num-heads", args.num_heads, "Attention heads; divides the hidden size")
      ->type_name("N")
      ->check(IntegerIn(1, kInt64Max))
      ->group(shape_group);
  command
      ->add_option("--num-kv-heads", args.num_kv_heads,
                   "Key/value heads; divides the heads (0: as many as heads)")
      ->type_name("N")
      ->check(IntegerIn(0, kInt64Max))
      ->group(shape_group);
  command->add_option("--vocab-size", args.vocab_size, "Vocabulary size")
      ->type_name("N")
      ->check(IntegerIn(1, kInt64Max))
      ->group(shape_group);
  command->add_flag("--plain-mlp", args.plain_mlp, "Two-matrix MLP instead of a gated one")
      ->group(shape_group);
  command
      ->add_option("--per-sequence", args.per_sequence,
                   "Extra cost per sequence, in units of one token's linear work")
      ->type_name("X")
      ->check(NonNegativeReal())
      ->group(shape_group);

  const std::string coefficient_group = "Coefficients (attention cost; not with a model shape)";
  command->add_option("--linear", args.linear, "Cost per token (default 1)")
      ->type_name("X")
      ->check(NonNegativeReal())
      ->group(coefficient_group);
  command->add_option("--quadratic", args.quadratic, "Cost per squared token (default 0)")
      ->type_name("X")
      ->check(NonNegativeReal())
      ->group(coefficient_group);
  command->add_option("--constant", args.constant, "Cost per sequence (default 0)")
      ->type_name("X")
      ->check(NonNegativeReal())
      ->group(coefficient_group);
  return command;
}

v1::BalanceRequest MakeBalanceRequest(const BalanceArgs& args, const LengthsInput& input) {
  const bool has_shape = HasShapeOptions(args);
  const bool has_coefficients = HasCoefficientOptions(args);
  if (args.cost == "tokens" && (has_shape || has_coefficients)) {
    throw std::invalid_argument(
        "--cost: model shape and coefficient options need --cost attention, got tokens");
  }
  if (has_shape && has_coefficients) {
    throw std::invalid_argument(
        "--linear, --quadratic, --constant: cannot be combined with model shape options");
  }
  if (args.keep_groups && input.groups.empty()) {
    throw std::invalid_argument("--keep-groups: the input has no group column");
  }
  if (args.algorithm != "kk" && args.algorithm != "lpt") {
    throw std::invalid_argument(
        fmt::format("--algorithm: must be kk or lpt, got '{}'", args.algorithm));
  }
  if (!args.cost.empty() && args.cost != "tokens" && args.cost != "attention") {
    throw std::invalid_argument(
        fmt::format("--cost: must be tokens or attention, got '{}'", args.cost));
  }

  v1::BalanceRequest request;
  request.mutable_lengths()->Add(input.lengths.begin(), input.lengths.end());
  request.mutable_groups()->Add(input.groups.begin(), input.groups.end());
  request.set_num_parts(args.parts);
  request.set_equal_size(args.equal_size);
  request.set_keep_groups(args.keep_groups);
  request.set_algorithm(args.algorithm == "lpt" ? v1::ALGORITHM_GREEDY
                                                : v1::ALGORITHM_KARMARKAR_KARP);
  if (args.refine_iterations) request.set_refine_iterations(*args.refine_iterations);

  v1::CostModel* cost = request.mutable_cost();
  if (!UsesAttention(args)) {
    cost->set_kind(v1::COST_KIND_TOKENS);
    return request;
  }
  cost->set_kind(v1::COST_KIND_ATTENTION);
  if (has_coefficients) {
    v1::CostCoefficients* coefficients = cost->mutable_coefficients();
    coefficients->set_linear(args.linear.value_or(1.0));
    coefficients->set_quadratic(args.quadratic.value_or(0.0));
    coefficients->set_constant(args.constant.value_or(0.0));
    return request;
  }
  const balance::ModelShape defaults;
  const std::int64_t hidden_size = args.hidden_size.value_or(defaults.hidden_size);
  const std::int64_t num_heads = args.num_heads.value_or(defaults.num_attention_heads);
  const std::int64_t num_kv_heads = args.num_kv_heads.value_or(defaults.num_kv_heads);
  if (hidden_size % num_heads != 0) {
    throw std::invalid_argument(fmt::format("--num-heads: must divide the hidden size ({}), got {}",
                                            hidden_size, num_heads));
  }
  if (num_kv_heads != 0 && num_heads % num_kv_heads != 0) {
    throw std::invalid_argument(fmt::format(
        "--num-kv-heads: must divide the number of heads ({}), got {}", num_heads, num_kv_heads));
  }
  v1::ModelShape* model = cost->mutable_model();
  model->set_hidden_size(hidden_size);
  model->set_num_layers(args.num_layers.value_or(defaults.num_layers));
  model->set_ffn_hidden_size(args.ffn_hidden_size.value_or(defaults.ffn_hidden_size));
  model->set_num_attention_heads(num_heads);
  model->set_num_kv_heads(num_kv_heads);
  model->set_vocab_size(args.vocab_size.value_or(defaults.vocab_size));
  model->set_plain_mlp(args.plain_mlp || !defaults.gated_mlp);
  cost->set_per_sequence(args.per_sequence.value_or(0.0));
  return request;
}

void RunBalanceCommand(const BalanceArgs& args, std::istream& in, std::ostream& out) {
  LengthsInput input;
  if (args.example) {
    balance::SyntheticBatch batch = balance::GrpoBatch(kExamplePrompts, kExampleSamples, args.seed);
    input.lengths = std::move(batch.lengths);
    input.groups = std::move(batch.groups);
  } else if (args.file == "-") {
    input = ReadNamed(in, "stdin");
  } else {
    input = ReadFile(args.file);
  }
  spdlog::info("read {} lengths{}", input.lengths.size(),
               input.groups.empty() ? "" : " with groups");

  const v1::BalanceRequest request = MakeBalanceRequest(args, input);
  const auto start = std::chrono::steady_clock::now();
  const v1::BalanceReply reply = SolveBalance(request);
  const std::chrono::duration<double, std::milli> elapsed =
      std::chrono::steady_clock::now() - start;
  spdlog::info("balanced {} sequences into {} parts in {:.3f} ms (max cost {}, gap {})",
               request.lengths_size(), request.num_parts(), elapsed.count(), reply.max_cost(),
               reply.gap());

  if (args.json) {
    out << ToJson(reply) << '\n';
  } else {
    PrintTable(args, request, reply, out);
  }
  out.flush();
  if (!out) throw std::runtime_error("cannot write the output");
}

}  // namespace rlsched::scheduler
