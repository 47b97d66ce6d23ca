#include "rlsched/wire/json.h"

#include <fmt/format.h>
#include <google/protobuf/util/json_util.h>

#include <stdexcept>

namespace rlsched::wire {

std::string ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions print_options;
  print_options.preserve_proto_field_names = true;
  print_options.always_print_primitive_fields = true;
  std::string json;
  const auto status = google::protobuf::util::MessageToJsonString(message, &json, print_options);
  if (!status.ok()) {
    throw std::runtime_error(
        fmt::format("cannot print {} as JSON: {}", message.GetTypeName(), status.ToString()));
  }
  return json;
}

}  // namespace rlsched::wire
