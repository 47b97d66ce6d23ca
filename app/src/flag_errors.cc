#include "flag_errors.h"

#include <fmt/format.h>

namespace rlsched::app {

bool IsUnder(std::string_view path, std::string_view prefix) {
  if (!path.starts_with(prefix)) return false;
  const std::string_view tail = path.substr(prefix.size());
  return tail.empty() || tail.front() == '.' || tail.front() == '[';
}

std::optional<FieldError> ToFlagError(const FieldError& e, std::span<const FlagField> flags) {
  for (const FlagField& flag : flags) {
    if (!flag.given || !IsUnder(e.field(), flag.path)) continue;
    return e.Renamed(flag.name_field ? fmt::format("{} ({})", flag.flag, e.field()) : flag.flag);
  }
  return std::nullopt;
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
