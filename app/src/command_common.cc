#include "command_common.h"

#include <fmt/format.h>
#include <google/protobuf/util/json_util.h>
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

#include "format.h"
#include "rlsched/balance/partition.h"
#include "rlsched/common/error.h"
#include "rlsched/wire/reshard_convert.h"
#include "rlsched/workload/workload.h"

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
    Fail(name, e.what());
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(fmt::format("{}: {}", name, e.what()));
  }
}

LengthsInput ReadFile(const std::string& path) {
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    Fail(path, "is a directory");
  }
  std::ifstream file(path);
  if (!file) {
    Fail(path, fmt::format("cannot open: {}", std::strerror(errno)));
  }
  return ReadNamed(file, path);
}

}  // namespace

std::string IntegerRangeText(std::int64_t min, std::int64_t max) {
  return max == kInt64Max ? fmt::format("integer >= {}", min)
                          : fmt::format("integer in [{}, {}]", min, max);
}

std::string RealRangeText(double min, double max, bool min_open) {
  if (std::isinf(max)) return fmt::format("number {} {}", min_open ? ">" : ">=", min);
  return fmt::format("number in {}{}, {}]", min_open ? "(" : "[", min, max);
}

std::string RangeHelp(const std::string& range, std::string_view default_text) {
  if (default_text.empty()) return fmt::format("Range: {}.", range);
  return fmt::format("Range: {}; default: {}.", range, default_text);
}

CLI::Validator Unsigned64() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        std::uint64_t value = 0;
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, value);
        if (text.empty() || ptr != end || ec != std::errc()) {
          return fmt::format("must be an {}, got '{}'", kUnsigned64Range, text);
        }
        return std::string();
      },
      "");
}

CLI::Validator RealIn(double min, double max, bool min_open) {
  const std::string bound = RealRangeText(min, max, min_open);
  return CLI::Validator(
      [min, max, min_open, bound](std::string& text) -> std::string {
        double value = 0.0;
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, value);
        if (text.empty() || ptr != end || ec != std::errc() || !std::isfinite(value) ||
            value < min || (min_open && value == min) || value > max) {
          return fmt::format("must be a {}, got '{}'", bound, text);
        }
        return std::string();
      },
      "");
}

CLI::Validator IntegerIn(std::int64_t min, std::int64_t max) {
  const std::string bound = IntegerRangeText(min, max);
  return CLI::Validator(
      [min, max, bound](std::string& text) -> std::string {
        std::int64_t value = 0;
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, value);
        if (text.empty() || ptr != end || ec != std::errc() || value < min || value > max) {
          return fmt::format("must be an {}, got '{}'", bound, text);
        }
        return std::string();
      },
      "");
}

void AddInputOptions(CLI::App& command, InputArgs& args, std::string_view verb) {
  CLI::Option* file =
      command
          .add_option("FILE", args.file,
                      "File with the sequence lengths in tokens (see below); '-' or none: stdin")
          ->type_name("");
  CLI::Option* example = command.add_flag(
      "--example", args.example,
      fmt::format("{} a built-in GRPO batch instead of a file: {} prompts × {} samples, "
                  "heavy-tailed lengths ({} sequences)",
                  verb, kExamplePrompts, kExampleSamples, kExamplePrompts * kExampleSamples));
  example->excludes(file);
  command
      .add_option("--seed", args.seed,
                  fmt::format("Seed of the --example batch. {}",
                              RangeHelp(std::string(kUnsigned64Range), "1")))
      ->type_name("N")
      ->check(Unsigned64())
      ->needs(example);
}

namespace {

// The model shape of the attention cost (unset values are Llama-3.1-8B's).
void AddCostShapeOptions(CLI::App& command, CostArgs& args) {
  const balance::ModelShape shape;
  // Shape and coefficients exclude each other; MakeCostModel() says so. The names are
  // Megatron-core's and Hugging Face's (--num-heads is the short alias).
  const std::string shape_group =
      "Model shape (attention cost; unset values are Llama-3.1-8B's; not with coefficients; "
      "fields cost.model.*)";
  const std::string positive = IntegerRangeText(1, kInt64Max);
  AddBoundedOption(command, "--hidden-size", args.hidden_size, "Hidden size.",
                   IntegerRange{1, kInt64Max}, fmt::format("{}", shape.hidden_size))
      ->type_name("N")
      ->group(shape_group);
  AddBoundedOption(command, "--num-layers", args.num_layers, "Number of transformer layers.",
                   IntegerRange{1, kInt64Max}, fmt::format("{}", shape.num_layers))
      ->type_name("N")
      ->group(shape_group);
  AddBoundedOption(command, "--ffn-hidden-size", args.ffn_hidden_size, "FFN (intermediate) size.",
                   IntegerRange{1, kInt64Max}, fmt::format("{}", shape.ffn_hidden_size))
      ->type_name("N")
      ->group(shape_group);
  AddBoundedOption(command, "--num-attention-heads,--num-heads", args.num_heads,
                   "Attention heads; divides the hidden size.", IntegerRange{1, kInt64Max},
                   fmt::format("{}", shape.num_attention_heads))
      ->type_name("N")
      ->group(shape_group);
  AddBoundedOption(command, "--num-kv-heads", args.num_kv_heads,
                   "Key/value heads (Megatron's query groups); divides the heads; 0: as "
                   "many as heads.",
                   IntegerRange{0, kInt64Max}, fmt::format("{}", shape.num_kv_heads))
      ->type_name("N")
      ->group(shape_group);
  AddBoundedOption(command, "--vocab-size", args.vocab_size, "Vocabulary size.",
                   IntegerRange{1, kInt64Max}, fmt::format("{}", shape.vocab_size))
      ->type_name("N")
      ->group(shape_group);
  command
      .add_flag("--plain-mlp", args.plain_mlp,
                "Two-matrix MLP instead of a gated one (default: gated, as Llama's)")
      ->group(shape_group);
  const std::string non_negative = RealRangeText(0.0, std::numeric_limits<double>::infinity());
  AddBoundedOption(command, "--per-sequence", args.per_sequence,
                   "Extra cost per sequence, in cost units (one token's linear work); "
                   "a sequence's cost must stay below 2^62.",
                   RealRange{0.0, std::numeric_limits<double>::infinity()}, "0")
      ->type_name("X")
      ->group(shape_group);
}

// The attention cost's coefficients (not with a model shape).
void AddCostCoefficientOptions(CLI::App& command, CostArgs& args) {
  const std::string non_negative = RealRangeText(0.0, std::numeric_limits<double>::infinity());
  const std::string coefficient_group =
      "Coefficients (attention cost; not with a model shape; fields cost.coefficients.*; "
      "linear + quadratic must be > 0, and a sequence's cost below 2^62)";
  AddBoundedOption(command, "--linear", args.linear, "Cost units per token.",
                   RealRange{0.0, std::numeric_limits<double>::infinity()}, "1")
      ->type_name("X")
      ->group(coefficient_group);
  AddBoundedOption(command, "--quadratic", args.quadratic, "Cost units per squared token.",
                   RealRange{0.0, std::numeric_limits<double>::infinity()}, "0")
      ->type_name("X")
      ->group(coefficient_group);
  AddBoundedOption(command, "--constant", args.constant, "Cost units per sequence.",
                   RealRange{0.0, std::numeric_limits<double>::infinity()}, "0")
      ->type_name("X")
      ->group(coefficient_group);
}

}  // namespace

void AddCostOptions(CLI::App& command, CostArgs& args) {
  const balance::ModelShape shape;
  command
      .add_option(
          "--cost", args.kind,
          fmt::format("Cost of a sequence of L tokens, in cost units: tokens (= L) or attention "
                      "(linear·L + quadratic·L² + constant, in units of one token's linear "
                      "work). Attention takes its coefficients from the model shape options "
                      "below, or from the coefficient options; with neither, from a "
                      "Llama-3.1-8B shape (hidden {}, {} layers, FFN {}, {} heads, {} KV heads, "
                      "vocab {}). Default: tokens, or attention when a shape or coefficient "
                      "option is given (field cost.kind)",
                      shape.hidden_size, shape.num_layers, shape.ffn_hidden_size,
                      shape.num_attention_heads, shape.num_kv_heads, shape.vocab_size))
      ->type_name("tokens|attention")
      ->check(CLI::IsMember({"tokens", "attention"}).description(""));
  command
      .add_option("--model", args.model,
                  "The model's Hugging Face config.json, or its folder: the attention cost of "
                  "its architecture (GQA, head_dim, MoE experts per token, MLA, dense layers; "
                  "Llama, Qwen2/2.5, Qwen3, Qwen3-MoE, DeepSeek-V3); not with the shape or "
                  "coefficient options (field cost.model_config_json)")
      ->type_name("FILE|DIR");
  AddCostShapeOptions(command, args);
  AddCostCoefficientOptions(command, args);
}

void AddRefineOption(CLI::App& command, std::optional<std::int64_t>& refine_iterations) {
  AddBoundedOption(command, "--refine-iterations", refine_iterations,
                   "Local-search budget in improving steps; 0 disables it.",
                   IntegerRange{0, kInt64Max},
                   fmt::format("{}", balance::RefineOptions{}.max_iterations))
      ->type_name("N");
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
    Fail("--keep-groups", "the input has no group column");
  }
}

std::string ReadModelConfig(const std::string& given) {
  std::error_code error;
  std::string path = given;
  if (std::filesystem::is_directory(given, error)) {
    path = (std::filesystem::path(given) / "config.json").string();
    if (!std::filesystem::is_regular_file(path, error)) {
      Fail("--model",
           fmt::format(
               "{}: a folder without config.json (give the model's folder or its config.json)",
               given));
    }
  }
  // "--model:" as the option: the messages read "--model: PATH: ...".
  return ReadWholeFile("--model:", path, wire::kMaxModelConfigBytes);
}

v1::CostModel MakeCostModel(const CostArgs& args) {
  const bool has_shape = HasShapeOptions(args);
  const bool has_coefficients = HasCoefficientOptions(args);
  if (args.model) {
    // --per-sequence goes with a config as with a shape; the other shape options not.
    CostArgs others = args;
    others.per_sequence.reset();
    if (HasShapeOptions(others) || has_coefficients) {
      throw FieldError("--model", "cannot be combined with model shape or coefficient options");
    }
    if (args.kind == "tokens") {
      throw FieldError("--model", "gives an attention cost, not with --cost tokens");
    }
    if (args.model->empty()) throw FieldError("--model", "a config.json or a model folder, got ''");
    v1::CostModel cost;
    cost.set_kind(v1::COST_KIND_ATTENTION);
    cost.set_model_config_json(ReadModelConfig(*args.model));
    if (cost.model_config_json().empty()) {
      throw FieldError("--model", *args.model + ": an empty file, not a config.json");
    }
    if (args.per_sequence) cost.set_per_sequence(*args.per_sequence);
    return cost;
  }
  if (args.kind == "tokens" && (has_shape || has_coefficients)) {
    Fail("--cost", "model shape and coefficient options need --cost attention, got tokens");
  }
  if (has_shape && has_coefficients) {
    Fail("--linear, --quadratic, --constant", "cannot be combined with model shape options");
  }
  if (!args.kind.empty() && args.kind != "tokens" && args.kind != "attention") {
    Fail("--cost", fmt::format("must be tokens or attention, got '{}'", args.kind));
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
    Fail("--num-attention-heads",
         fmt::format("must divide the hidden size ({}), got {}", hidden_size, num_heads));
  }
  if (num_kv_heads != 0 && num_heads % num_kv_heads != 0) {
    Fail("--num-kv-heads",
         fmt::format("must divide the number of heads ({}), got {}", num_heads, num_kv_heads));
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
  if (args.model) {
    text += " from " + *args.model;
  } else if (cost.kind() == balance::CostModel::Kind::kAttention && !HasCoefficientOptions(args)) {
    text += HasShapeOptions(args) ? " from the model shape"
                                  : " from the default model shape (Llama-3.1-8B)";
  }
  return text;
}

std::size_t Digits(std::int64_t value) { return fmt::formatted_size("{}", value); }

void FlushOutput(std::ostream& out) {
  out.flush();
  if (!out) throw std::runtime_error("cannot write the output");
}

std::ifstream OpenFile(std::string_view option, const std::string& path) {
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    Fail(fmt::format("{} {}", option, path), "is a directory");
  }
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    Fail(fmt::format("{} {}", option, path), fmt::format("cannot open: {}", std::strerror(errno)));
  }
  return file;
}

std::string ReadWholeFile(std::string_view option, const std::string& path,
                          std::int64_t max_bytes) {
  std::ifstream file = OpenFile(option, path);
  std::string text;
  char buffer[1 << 16];
  while (file.read(buffer, sizeof buffer) || file.gcount() > 0) {
    text.append(buffer, static_cast<std::size_t>(file.gcount()));
    if (static_cast<std::int64_t>(text.size()) > max_bytes) {
      Fail(fmt::format("{} {}", option, path), fmt::format("larger than {} bytes", max_bytes));
    }
  }
  if (file.bad()) throw std::runtime_error(fmt::format("{} {}: cannot read", option, path));
  return text;
}

void WriteWholeFile(std::string_view option, const std::string& path, std::string_view text) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (!file) {
    Fail(fmt::format("{} {}", option, path), fmt::format("cannot open: {}", std::strerror(errno)));
  }
  file << text;
  file.close();
  if (!file) throw std::runtime_error(fmt::format("{} {}: cannot write", option, path));
}

void ParseJsonFile(std::string_view option, const std::string& path, std::string_view text,
                   google::protobuf::Message& message) {
  const auto status = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(text.data(), text.size()), &message);
  if (!status.ok()) {
    Fail(fmt::format("{} {}", option, path),
         fmt::format("not a JSON {}: {}", message.GetDescriptor()->full_name(),
                     std::string(status.message())));
  }
}

}  // namespace rlsched::app
