// serve_test_util.h — requests, framing and reply parsing shared by the daemon's tests.
// The framing here uses protobuf's own delimited-message functions, independently of
// the daemon's encoder.

#ifndef RLSCHED_TESTS_SCHEDULER_SERVE_TEST_UTIL_H_
#define RLSCHED_TESTS_SCHEDULER_SERVE_TEST_UTIL_H_

#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/util/delimited_message_util.h>
#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rlsched/v1/service.pb.h"
#include "rlsched/wire/solve.h"

namespace rlsched::wire::testing {

// `message` with its varint size in front.
inline std::string Framed(const google::protobuf::MessageLite& message) {
  std::string bytes;
  google::protobuf::io::StringOutputStream stream(&bytes);
  google::protobuf::util::SerializeDelimitedToZeroCopyStream(message, &stream);
  return bytes;
}

inline std::string Framed(const std::vector<v1::Request>& requests) {
  std::string bytes;
  for (const v1::Request& request : requests) bytes += Framed(request);
  return bytes;
}

// `requests` as JSON lines (protobuf's mapping, camelCase names: the parser accepts both).
inline std::string JsonLines(const std::vector<v1::Request>& requests) {
  std::string text;
  for (const v1::Request& request : requests) {
    std::string line;
    google::protobuf::util::MessageToJsonString(request, &line);
    text += line + "\n";
  }
  return text;
}

// The replies of a delimited stream; nullopt unless `bytes` is a whole number of them.
inline std::optional<std::vector<v1::Reply>> ParseReplies(std::string_view bytes) {
  google::protobuf::io::ArrayInputStream stream(bytes.data(), static_cast<int>(bytes.size()));
  std::vector<v1::Reply> replies;
  while (true) {
    v1::Reply reply;
    bool clean_eof = false;
    if (!google::protobuf::util::ParseDelimitedFromZeroCopyStream(&reply, &stream, &clean_eof)) {
      if (clean_eof) return replies;
      return std::nullopt;
    }
    replies.push_back(std::move(reply));
  }
}

// The replies of a JSON-lines stream; nullopt unless every line is one.
inline std::optional<std::vector<v1::Reply>> ParseJsonReplies(std::string_view text) {
  std::vector<v1::Reply> replies;
  while (!text.empty()) {
    const std::size_t end = text.find('\n');
    if (end == std::string_view::npos) return std::nullopt;  // every line ends in '\n'
    v1::Reply reply;
    const std::string line(text.substr(0, end));
    if (!google::protobuf::util::JsonStringToMessage(line, &reply).ok()) return std::nullopt;
    replies.push_back(std::move(reply));
    text.remove_prefix(end + 1);
  }
  return replies;
}

inline v1::Request Ping(std::string id) {
  v1::Request request;
  request.set_id(std::move(id));
  request.mutable_ping();
  return request;
}

inline v1::Request Balance(std::string id, std::initializer_list<std::int64_t> lengths,
                           std::int64_t parts, bool equal_size = false) {
  v1::Request request;
  request.set_id(std::move(id));
  v1::BalanceRequest* balance = request.mutable_balance();
  balance->mutable_lengths()->Add(lengths.begin(), lengths.end());
  balance->set_num_parts(parts);
  balance->set_equal_size(equal_size);
  return request;
}

inline v1::Request PlanStep(std::string id, std::initializer_list<std::int64_t> lengths,
                            std::int64_t ranks, std::int64_t cap) {
  v1::Request request;
  request.set_id(std::move(id));
  v1::PlanStepRequest* step = request.mutable_plan_step();
  step->mutable_lengths()->Add(lengths.begin(), lengths.end());
  step->set_num_ranks(ranks);
  step->set_max_tokens_per_micro_batch(cap);
  return request;
}

// A reshard request: `model_config_json` from trainer tp·pp·dp to engine tp × replicas.
inline v1::Request Reshard(std::string id, std::string model_config_json, std::int64_t train_tp,
                           std::int64_t train_pp, std::int64_t train_dp, std::int64_t infer_tp,
                           std::int64_t replicas) {
  v1::Request request;
  request.set_id(std::move(id));
  v1::ReshardRequest* reshard = request.mutable_reshard();
  reshard->set_model_config_json(std::move(model_config_json));
  reshard->mutable_train()->set_tp(train_tp);
  reshard->mutable_train()->set_pp(train_pp);
  reshard->mutable_train()->set_dp(train_dp);
  reshard->mutable_infer()->set_tp(infer_tp);
  reshard->mutable_infer()->set_replicas(replicas);
  return request;
}

// A small Llama config.json (4 layers, hidden 64, 16 heads in 4 KV groups).
inline constexpr char kTinyLlamaConfig[] =
    R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 96,
 "num_hidden_layers": 4, "num_attention_heads": 16, "num_key_value_heads": 4,
 "vocab_size": 1000, "tie_word_embeddings": false})";

inline v1::Request Empty(std::string id) {
  v1::Request request;
  request.set_id(std::move(id));
  return request;
}

// One request of each kind and outcome, ids "0".."6":
// ping, balance, plan_step, invalid balance (num_parts 0), empty, invalid plan_step
// (a sequence above the cap), balance with groups.
inline std::vector<v1::Request> MixedRequests() {
  std::vector<v1::Request> requests = {
      Ping("0"),
      Balance("1", {4096, 512, 700, 3000, 2048, 128}, 2),
      PlanStep("2", {100, 200, 300, 400, 500, 600}, 2, 700),
      Balance("3", {1, 2, 3}, 0),
      Empty("4"),
      PlanStep("5", {3, 9}, 1, 8),
      Balance("6", {5, 9, 1, 7, 3, 8}, 3, true),
  };
  for (const std::int64_t group : {0, 0, 1, 1, 2, 2}) {
    requests[6].mutable_balance()->add_groups(group);
  }
  requests[6].mutable_balance()->set_keep_groups(true);
  return requests;
}

// The replies Solve() gives, one by one.
inline std::vector<v1::Reply> Expected(const std::vector<v1::Request>& requests) {
  std::vector<v1::Reply> replies;
  for (const v1::Request& request : requests) replies.push_back(Solve(request));
  return replies;
}

// `actual` equals `expected`, message by message.
inline void ExpectReplies(const std::vector<v1::Reply>& actual,
                          const std::vector<v1::Reply>& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (std::size_t i = 0; i < actual.size(); ++i) {
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(actual[i], expected[i]))
        << i << ": " << actual[i].ShortDebugString() << "\nexpected "
        << expected[i].ShortDebugString();
  }
}

}  // namespace rlsched::wire::testing

#endif  // RLSCHED_TESTS_SCHEDULER_SERVE_TEST_UTIL_H_
