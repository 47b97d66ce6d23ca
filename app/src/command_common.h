// command_common.h — what the program's commands share: input, cost-model options,
// option validators and table formatting.
//
// Overview
//   `rlsched balance` and `rlsched plan-step` read the same input (a file or stdin,
//   parsed by lengths_reader.h, or the built-in example GRPO batch) and take the same
//   cost-model options (--cost, the model shape, the coefficients) and refinement
//   budget. This file adds those options to a command, turns them into the wire
//   contract's rlsched.v1.CostModel, reads the input, and formats the parts of the
//   tables both commands print, so that the commands cannot drift apart.
//
// Example
//   InputArgs input_args;
//   CostArgs cost_args;
//   CLI::App* command = app.add_subcommand("plan-step", "Plan a training step");
//   AddInputOptions(*command, input_args, "Plan");
//   AddCostOptions(*command, cost_args);
//   app.parse(argc, argv);
//   const LengthsInput input = ReadInput(input_args, std::cin);
//   *request.mutable_cost() = MakeCostModel(cost_args);
//
// Thread-safety: ReadInput() logs; everything else is pure.

#ifndef RLSCHED_APP_COMMAND_COMMON_H_
#define RLSCHED_APP_COMMAND_COMMON_H_

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <istream>
#include <limits>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>

#include "lengths_reader.h"
#include "rlsched/balance/cost_model.h"
#include "rlsched/v1/balance.pb.h"

namespace google::protobuf {
class Message;
}

namespace rlsched::app {

// The built-in example: workload::GrpoBatch(kExamplePrompts, kExampleSamples, seed).
inline constexpr std::int64_t kExamplePrompts = 128;
inline constexpr std::int64_t kExampleSamples = 8;

// Tables list at most this many parts or ranks, then "… (N more …)".
inline constexpr std::int64_t kMaxTableRows = 64;
// Inputs of at most this many sequences list each part's sequences in the table.
inline constexpr std::int64_t kMaxAssignmentItems = 64;

inline constexpr std::int64_t kInt64Max = std::numeric_limits<std::int64_t>::max();

// The input formats, for a command's help footer.
inline constexpr std::string_view kInputHelp =
    "Input: integers separated by whitespace (one per line or several), or a CSV whose "
    "header names the columns: prompt_tokens + response_tokens (summed), or length, or "
    "tokens; and optionally group.";

// Where the lengths come from. Unset optionals were not given.
struct InputArgs {
  std::string file = "-";  // "-" = stdin
  bool example = false;    // the built-in example batch instead of a file
  std::uint64_t seed = 1;  // of the example batch
};

// The cost-model options. Unset optionals were not given.
struct CostArgs {
  // --model: a config.json or a model folder (not with shape/coefficients); unset: none.
  std::optional<std::string> model;
  std::string kind;  // --cost: "tokens", "attention", or empty: tokens unless shape/coefficients
  // Model shape; unset fields take balance::ModelShape{} (Llama-3.1-8B) values.
  std::optional<std::int64_t> hidden_size;
  std::optional<std::int64_t> num_layers;
  std::optional<std::int64_t> ffn_hidden_size;
  std::optional<std::int64_t> num_heads;
  std::optional<std::int64_t> num_kv_heads;
  std::optional<std::int64_t> vocab_size;
  bool plain_mlp = false;
  std::optional<double> per_sequence;
  // Coefficients; unset ones are linear 1, quadratic 0, constant 0.
  std::optional<double> linear;
  std::optional<double> quadratic;
  std::optional<double> constant;
};

// The range texts of the validators below, as the help and the errors state them:
// "integer in [1, 1048576]", "integer >= 0" (max == kInt64Max), "number in [0, 1]",
// "number in (0, 1000000]" (min_open), "number >= 0" (max infinite). Every numeric
// option's help says "Range: <text>", so that a test can read the range from --help
// and check the bounds against what the program accepts.
std::string IntegerRangeText(std::int64_t min, std::int64_t max);
std::string RealRangeText(double min, double max, bool min_open = false);

// "Range: <range>; default: <default>." for an option's help (no default when
// `default_text` is empty).
std::string RangeHelp(const std::string& range, std::string_view default_text = "");

// An integer option in [min, max] (max == kInt64Max: no upper bound); the error reads
// "--opt: must be an integer in [min, max], got 'x'".
CLI::Validator IntegerIn(std::int64_t min, std::int64_t max);

// A finite real number in [min, max] ((min, max] when `min_open`; max infinite: no
// upper bound); the error reads "--opt: must be a number in [min, max], got 'x'".
CLI::Validator RealIn(double min, double max, bool min_open = false);

// A numeric option's range, written once for its help and its check.
struct IntegerRange {
  std::int64_t min;
  std::int64_t max;  // kInt64Max: no upper bound
};
struct RealRange {
  double min;
  double max;  // infinite: no upper bound
  bool min_open = false;
};

// Adds a numeric option bounded by `range`: its help is `help` followed by
// "Range: <range>; default: <default_text>." (RangeHelp), and a value outside is refused
// (IntegerIn, RealIn). `value`: an integer or a real, or an optional one.
template <class T>
CLI::Option* AddBoundedOption(CLI::App& command, const std::string& flag, T& value,
                              std::string_view help, IntegerRange range,
                              std::string_view default_text = "") {
  return command
      .add_option(flag, value,
                  fmt::format("{} {}", help,
                              RangeHelp(IntegerRangeText(range.min, range.max), default_text)))
      ->check(IntegerIn(range.min, range.max));
}
template <class T>
CLI::Option* AddBoundedOption(CLI::App& command, const std::string& flag, T& value,
                              std::string_view help, RealRange range,
                              std::string_view default_text = "") {
  return command
      .add_option(
          flag, value,
          fmt::format("{} {}", help,
                      RangeHelp(RealRangeText(range.min, range.max, range.min_open), default_text)))
      ->check(RealIn(range.min, range.max, range.min_open));
}

// The range of Unsigned64(): [0, 2^64 - 1].
inline constexpr std::string_view kUnsigned64Range = "integer in [0, 18446744073709551615]";

// An unsigned 64-bit integer (no sign); the error reads
// "--opt: must be an integer in [0, 18446744073709551615], got 'x'".
CLI::Validator Unsigned64();

// Adds FILE, --example and --seed to `command`, writing into `args` (which must
// outlive the parse). `verb` starts the --example help, e.g. "Balance".
void AddInputOptions(CLI::App& command, InputArgs& args, std::string_view verb);

// Adds --cost, the model shape options and the coefficient options to `command`.
void AddCostOptions(CLI::App& command, CostArgs& args);

// Adds --refine-iterations N (>= 0; unset: the library's default budget).
void AddRefineOption(CLI::App& command, std::optional<std::int64_t>& refine_iterations);

// The lengths: the example batch, or args.file (`in` when it is "-"). Throws
// std::invalid_argument naming the file (or "stdin") and line for bad input,
// std::runtime_error when reading fails. Logs the count at info level.
LengthsInput ReadInput(const InputArgs& args, std::istream& in);

// Throws std::invalid_argument naming --keep-groups when it is set and `input` has
// no groups.
void CheckKeepGroups(bool keep_groups, const LengthsInput& input);

// The cost model the options ask for. Throws std::invalid_argument naming the option
// for contradictory options (--cost tokens with a model shape, a shape with
// coefficients) and for heads that do not divide; values are validated later, by the
// request's conversion.
v1::CostModel MakeCostModel(const CostArgs& args);

// "example GRPO batch (…): " when the example is used, then "N sequences[ in G
// groups], T tokens".
std::string DescribeBatch(const InputArgs& args,
                          const google::protobuf::RepeatedField<std::int64_t>& lengths,
                          const google::protobuf::RepeatedField<std::int64_t>& groups);

// The cost model in words, saying where attention's coefficients came from.
std::string DescribeCost(const CostArgs& args, const balance::CostModel& cost);

// A fraction as a percentage: "0%", "12.34%", or two significant digits below 0.01%.

// The number of characters of `value` in decimal.
std::size_t Digits(std::int64_t value);

// Flushes `out`; throws std::runtime_error if writing failed.
void FlushOutput(std::ostream& out);

// `path` opened for `option` (the flag that named it), or an error naming both.
std::ifstream OpenFile(std::string_view option, const std::string& path);
// The whole file `path`, at most `max_bytes`, for `option`'s errors.
std::string ReadWholeFile(std::string_view option, const std::string& path, std::int64_t max_bytes);
// Writes `text` to `path` (replaced), for `option`'s errors.
void WriteWholeFile(std::string_view option, const std::string& path, std::string_view text);
// `text`, the file `path` given to `option`, parsed into `message` from protobuf's JSON
// mapping; else an error naming the option, the file and the message's type.
void ParseJsonFile(std::string_view option, const std::string& path, std::string_view text,
                   google::protobuf::Message& message);

// The text of a --model value, as `reshard`, `run` and the cost options read it: a Hugging Face
// config.json, or a model folder holding one (its config.json is read), at most
// wire::kMaxModelConfigBytes. Throws std::invalid_argument naming --model and the path
// for a folder without config.json, a path that cannot be opened or a file too large,
// e.g. "--model: /models/x: a folder without config.json (...)";
// std::runtime_error when reading fails.
std::string ReadModelConfig(const std::string& given);

}  // namespace rlsched::app

#endif  // RLSCHED_APP_COMMAND_COMMON_H_
