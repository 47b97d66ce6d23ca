// flag_errors.h — one way from a library's FieldError to the flag the user typed.
//
// Overview
//   A library names the field of its request or options that broke a requirement
//   ("train.pp", "num_ranks", "config.orchestrator.max_staleness"). Each command keeps a
//   table from field paths to the flags that set them, and ToFlagError() renames the
//   error by it: "--train (train.pp): must divide ...". The error's requirement, bound
//   and value are carried as they are; no message is parsed for its field.

#ifndef RLSCHED_APP_FLAG_ERRORS_H_
#define RLSCHED_APP_FLAG_ERRORS_H_

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "rlsched/common/error.h"

namespace rlsched::app {

// A flag and the request fields it sets: `path` and every field under it ("train" holds
// "train.tp" and "train.layers[2]").
struct FlagField {
  std::string flag;        // "--train", "--model config.json"
  std::string path;        // "train", "num_ranks"
  bool given = true;       // false: not typed (the field came from a file or a default)
  bool name_field = true;  // "--flag (field): ..."; false: "--flag: ..."
};

// Whether `path` is `prefix` or a field under it (after a '.' or a '[').
bool IsUnder(std::string_view path, std::string_view prefix);

// Where a command's flags set fields: `within` the request (the prefix stripped from a
// field before it is matched and named, "config." for `simulate`), and the file the
// fields without a flag came from ("--config run.json"; empty: none).
struct FlagScope {
  std::string_view within;
  std::string file;
};

// `e` in the command's terms: named by the first given flag whose path holds its field
// ("--train (train.pp): ..."); a field within the scope that no flag holds is named by the
// file ("--config run.json: orchestrator.mode: ...") or as it is in the scope
// ("orchestrator.mode: ..."); any other error as it is. O(flags).
FieldError ToFlagError(const FieldError& e, std::span<const FlagField> flags,
                       const FlagScope& scope = {});

// The weight layout's flags, shared by `reshard` and `run`: --model FILE (the model
// config's fields, and the request's model_config_json), --train, --infer,
// --bucket-mib, the topology flags and --target-dtype.
std::vector<FlagField> WeightLayoutFlags(const std::string& model_file);

}  // namespace rlsched::app

#endif  // RLSCHED_APP_FLAG_ERRORS_H_
