#include "command_common.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <stdexcept>
#include <system_error>
#include <utility>
#include <vector>

#include "rlsched/balance/partition.h"
#include "rlsched/common/workload.h"

namespace rlsched::app {
namespace {

bool HasShapeOptions(const CostArgs& args) {
  return args.hidden_size || args.num_layers || args.ffn_hidden_size || args.num_heads ||
         args.num_kv_heads || args.vocab_size || args.plain_mlp || args.per_sequence;
}

bool HasCoefficientOptions(const CostArgs& args) {
  return args.linear || args.quadratic || args.constant;
}

bool UsesAttention(const CostArgs& args) {
  return args.kind == "attention" ||
         (args.kind.empty() && (HasShapeOptions(args) || HasCoefficientOptions(args)));
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

}  // namespace

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

CLI::Validator RealIn(double min, double max) {
  const std::string bound =
      std::isinf(max) ? fmt::format(">= {}", min) : fmt::format("in [{}, {}]", min, max);
  return CLI::Validator(
      [min, max, bound](std::string& text) -> std::string {
        double value = 0.0;
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, value);
        if (text.empty() || ptr != end || ec != std::errc() || !std::isfinite(value) ||
            value < min || value > max) {
          return fmt::format("must be a finite number {}, got '{}'", bound, text);
        }
        return std::string();
      },
      "");
}

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

void AddInputOptions(CLI::App& command, InputArgs& args, std::string_view verb) {
  CLI::Option* file =
      command.add_option("FILE", args.file, "File with the sequence lengths; '-' or none: stdin")
          ->type_name("");
  CLI::Option* example = command.add_flag(
      "--example", args.example,
      fmt::format("{} a built-in GRPO batch instead of a file: {} prompts × {} samples, "
                  "heavy-tailed lengths ({} sequences)",
                  verb, kExamplePrompts, kExampleSamples, kExamplePrompts * kExampleSamples));
  example->excludes(file);
  command.add_option("--seed", args.seed, "Seed of the --example batch")
      ->type_name("N")
      ->check(Unsigned64())
      ->needs(example)
      ->capture_default_str();
}

void AddCostOptions(CLI::App& command, CostArgs& args) {
  const balance::ModelShape shape;
  command
      .add_option(
          "--cost", args.kind,
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

  // Shape and coefficients exclude each other; MakeCostModel() says so.
  const std::string shape_group =
      "Model shape (attention cost; unset values are Llama-3.1-8B's; not with coefficients)";
  command.add_option("--hidden-size", args.hidden_size, "Hidden size")
      ->type_name("N")
      ->check(IntegerIn(1, kInt64Max))
      ->group(shape_group);
  command.add_option("--num-layers", args.num_layers, "Number of transformer layers")
      ->type_name("N")
      ->check(IntegerIn(1, kInt64Max))
      ->group(shape_group);
  command.add_option("--ffn-hidden-size", args.ffn_hidden_size, "FFN (intermediate) size")
      ->type_name("N")
      ->check(IntegerIn(1, kInt64Max))
      ->group(shape_group);
  command.add_option("--num-heads", args.num_heads, "Attention heads; divides the hidden size")
      ->type_name("N")
      ->check(IntegerIn(1, kInt64Max))
      ->group(shape_group);
  command
      .add_option("--num-kv-heads", args.num_kv_heads,
                  "Key/value heads; divides the heads (0: as many as heads)")
      ->type_name("N")
      ->check(IntegerIn(0, kInt64Max))
      ->group(shape_group);
  command.add_option("--vocab-size", args.vocab_size, "Vocabulary size")
      ->type_name("N")
      ->check(IntegerIn(1, kInt64Max))
      ->group(shape_group);
  command.add_flag("--plain-mlp", args.plain_mlp, "Two-matrix MLP instead of a gated one")
      ->group(shape_group);
  command
      .add_option("--per-sequence", args.per_sequence,
                  "Extra cost per sequence, in units of one token's linear work")
      ->type_name("X")
      ->check(RealIn(0.0, std::numeric_limits<double>::infinity()))
      ->group(shape_group);

  const std::string coefficient_group = "Coefficients (attention cost; not with a model shape)";
  command.add_option("--linear", args.linear, "Cost per token (default 1)")
      ->type_name("X")
      ->check(RealIn(0.0, std::numeric_limits<double>::infinity()))
      ->group(coefficient_group);
  command.add_option("--quadratic", args.quadratic, "Cost per squared token (default 0)")
      ->type_name("X")
      ->check(RealIn(0.0, std::numeric_limits<double>::infinity()))
      ->group(coefficient_group);
  command.add_option("--constant", args.constant, "Cost per sequence (default 0)")
      ->type_name("X")
      ->check(RealIn(0.0, std::numeric_limits<double>::infinity()))
      ->group(coefficient_group);
}

void AddRefineOption(CLI::App& command, std::optional<std::int64_t>& refine_iterations) {
  command
      .add_option("--refine-iterations", refine_iterations,
                  fmt::format("Local-search budget in improving steps; 0 disables it "
                              "(default {})",
                              balance::RefineOptions{}.max_iterations))
      ->type_name("N")
      ->check(IntegerIn(0, kInt64Max));
}

LengthsInput ReadInput(const InputArgs& args, std::istream& in) {
  LengthsInput input;
  if (args.example) {
    workload::SyntheticBatch batch =
        workload::GrpoBatch(kExamplePrompts, kExampleSamples, args.seed);
    input.lengths = std::move(batch.lengths);
    input.groups = std::move(batch.groups);
  } else if (args.file == "-") {
    input = ReadNamed(in, "stdin");
  } else {
    input = ReadFile(args.file);
  }
  spdlog::info("read {} lengths{}", input.lengths.size(),
               input.groups.empty() ? "" : " with groups");
  return input;
}

void CheckKeepGroups(bool keep_groups, const LengthsInput& input) {
  if (keep_groups && input.groups.empty()) {
    throw std::invalid_argument("--keep-groups: the input has no group column");
  }
}

v1::CostModel MakeCostModel(const CostArgs& args) {
  const bool has_shape = HasShapeOptions(args);
  const bool has_coefficients = HasCoefficientOptions(args);
  if (args.kind == "tokens" && (has_shape || has_coefficients)) {
    throw std::invalid_argument(
        "--cost: model shape and coefficient options need --cost attention, got tokens");
  }
  if (has_shape && has_coefficients) {
    throw std::invalid_argument(
        "--linear, --quadratic, --constant: cannot be combined with model shape options");
  }
  if (!args.kind.empty() && args.kind != "tokens" && args.kind != "attention") {
    throw std::invalid_argument(
        fmt::format("--cost: must be tokens or attention, got '{}'", args.kind));
  }

  v1::CostModel cost;
  if (!UsesAttention(args)) {
    cost.set_kind(v1::COST_KIND_TOKENS);
    return cost;
  }
  cost.set_kind(v1::COST_KIND_ATTENTION);
  if (has_coefficients) {
    v1::CostCoefficients* coefficients = cost.mutable_coefficients();
    coefficients->set_linear(args.linear.value_or(1.0));
    coefficients->set_quadratic(args.quadratic.value_or(0.0));
    coefficients->set_constant(args.constant.value_or(0.0));
    return cost;
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
  v1::ModelShape* model = cost.mutable_model();
  model->set_hidden_size(hidden_size);
  model->set_num_layers(args.num_layers.value_or(defaults.num_layers));
  model->set_ffn_hidden_size(args.ffn_hidden_size.value_or(defaults.ffn_hidden_size));
  model->set_num_attention_heads(num_heads);
  model->set_num_kv_heads(num_kv_heads);
  model->set_vocab_size(args.vocab_size.value_or(defaults.vocab_size));
  model->set_plain_mlp(args.plain_mlp || !defaults.gated_mlp);
  cost.set_per_sequence(args.per_sequence.value_or(0.0));
  return cost;
}

std::string DescribeBatch(const InputArgs& args,
                          const google::protobuf::RepeatedField<std::int64_t>& lengths,
                          const google::protobuf::RepeatedField<std::int64_t>& groups) {
  std::string text;
  if (args.example) {
    text = fmt::format("example GRPO batch ({} prompts × {} samples, seed {}): ", kExamplePrompts,
                       kExampleSamples, args.seed);
  }
  text += fmt::format("{} sequences", lengths.size());
  if (!groups.empty()) {
    std::vector<std::int64_t> sorted(groups.begin(), groups.end());
    std::sort(sorted.begin(), sorted.end());
    const auto distinct = std::unique(sorted.begin(), sorted.end()) - sorted.begin();
    text += fmt::format(" in {} groups", distinct);
  }
  std::int64_t total_tokens = 0;
  for (const std::int64_t length : lengths) total_tokens += length;
  text += fmt::format(", {} tokens", total_tokens);
  return text;
}

std::string DescribeCost(const CostArgs& args, const balance::CostModel& cost) {
  std::string text = cost.Describe();
  if (cost.kind() == balance::CostModel::Kind::kAttention && !HasCoefficientOptions(args)) {
    text += HasShapeOptions(args) ? " from the model shape"
                                  : " from the default model shape (Llama-3.1-8B)";
  }
  return text;
}

std::string FormatPercent(double fraction) {
  const double percent = fraction * 100.0;
  if (percent == 0.0) return "0%";
  if (std::fabs(percent) >= 0.01) return fmt::format("{:.2f}%", percent);
  return fmt::format("{:.2g}%", percent);
}

std::size_t Digits(std::int64_t value) { return fmt::formatted_size("{}", value); }

void FlushOutput(std::ostream& out) {
  out.flush();
  if (!out) throw std::runtime_error("cannot write the output");
}

}  // namespace rlsched::app
