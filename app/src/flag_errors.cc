#include "flag_errors.h"

#include <fmt/format.h>

namespace rlsched::app {

bool IsUnder(std::string_view path, std::string_view prefix) {
  if (!path.starts_with(prefix)) return false;
  const std::string_view tail = path.substr(prefix.size());
  return tail.empty() || tail.front() == '.' || tail.front() == '[';
}

FieldError ToFlagError(const FieldError& e, std::span<const FlagField> flags,
                       const FlagScope& scope) {
  const bool within = !scope.within.empty() && e.field().starts_with(scope.within);
  const FieldError in_scope = within ? e.Renamed(e.field().substr(scope.within.size())) : e;
  for (const FlagField& flag : flags) {
    if (!flag.given || !IsUnder(in_scope.field(), flag.path)) continue;
    return in_scope.Renamed(flag.name_field ? fmt::format("{} ({})", flag.flag, in_scope.field())
                                            : flag.flag);
  }
  if (!within) return e;
  if (scope.file.empty()) return in_scope;
  return FieldError(scope.file, in_scope.what());
}

std::vector<FlagField> WeightLayoutFlags(const std::string& model_file) {
  const std::string model = "--model " + model_file;
  return {
      {.flag = model, .path = "model_config_json", .name_field = false},
      {.flag = model, .path = "config"},
      {.flag = model, .path = "model"},
      {.flag = "--train", .path = "train"},
      {.flag = "--infer", .path = "infer"},
      {.flag = "--bucket-mib", .path = "bucket_bytes"},
      {.flag = "--gpus-per-node", .path = "topology.gpus_per_node"},
      {.flag = "--intra-node-gb-per-s", .path = "topology.intra_node_gb_per_s"},
      {.flag = "--inter-node-gb-per-s", .path = "topology.inter_node_gb_per_s"},
      {.flag = "--colocated", .path = "topology.colocated"},
      {.flag = "--target-dtype", .path = "target_dtype"},
  };
}

}  // namespace rlsched::app
