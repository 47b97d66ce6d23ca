// json.h — a message in protobuf's JSON mapping, as every command's --json and the
// daemon's JSON lines print it.

#ifndef RLSCHED_WIRE_JSON_H_
#define RLSCHED_WIRE_JSON_H_

#include <google/protobuf/message.h>

#include <string>

namespace rlsched::wire {

// `message` in protobuf's JSON mapping on one line: proto field names (snake_case),
// default-valued fields printed, enums by name (int64 values are JSON strings, as the
// mapping requires). Throws std::runtime_error if protobuf refuses to print it.
// O(message size).
std::string ToJson(const google::protobuf::Message& message);

}  // namespace rlsched::wire

#endif  // RLSCHED_WIRE_JSON_H_
