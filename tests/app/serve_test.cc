// The daemon's pure core (HandleRequest, DecodeRequest, EncodeReply, RequestReader)
// and Serve() in-process over in-memory streams.

#include "serve.h"

#include <gmock/gmock.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "rlsched/workload/workload.h"
#include "rlsched/wire/balance_convert.h"
#include "rlsched/wire/reshard_convert.h"
#include "serve_test_util.h"

namespace rlsched::app {
namespace {

using namespace ::rlsched::wire;  // NOLINT: the conversions

using ::google::protobuf::util::MessageDifferencer;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::StartsWith;
using namespace ::rlsched::wire::testing;  // NOLINT: the test helpers
using Kind = RequestReader::Frame::Kind;

// --- HandleRequest -------------------------------------------------------------------

TEST(HandleRequestTest, PingGetsTheVersion) {
  const v1::Reply reply = Solve(Ping("p-1"));
  EXPECT_EQ(reply.id(), "p-1");
  ASSERT_TRUE(reply.has_pong());
  EXPECT_EQ(reply.pong().version(), RLSCHED_VERSION);
  EXPECT_EQ(ServeVersion(), RLSCHED_VERSION);
}

TEST(HandleRequestTest, BalanceIsSolveBalance) {
  const v1::Request request = Balance("b", {4096, 512, 700, 3000, 2048, 128}, 2);
  const v1::Reply reply = Solve(request);
  EXPECT_EQ(reply.id(), "b");
  ASSERT_TRUE(reply.has_balance());
  EXPECT_TRUE(MessageDifferencer::Equals(reply.balance(), SolveBalance(request.balance())));
}

TEST(HandleRequestTest, PlanStepIsSolvePlanStep) {
  const v1::Request request = PlanStep("s", {100, 200, 300, 400, 500, 600}, 2, 700);
  const v1::Reply reply = Solve(request);
  EXPECT_EQ(reply.id(), "s");
  ASSERT_TRUE(reply.has_plan_step());
  EXPECT_TRUE(MessageDifferencer::Equals(reply.plan_step(), SolvePlanStep(request.plan_step())));
}

TEST(HandleRequestTest, ReshardIsSolveReshard) {
  const v1::Request request = Reshard("r", kTinyLlamaConfig, 2, 2, 2, 4, 2);
  const v1::Reply reply = Solve(request);
  EXPECT_EQ(reply.id(), "r");
  ASSERT_TRUE(reply.has_reshard());
  EXPECT_TRUE(MessageDifferencer::Equals(reply.reshard(), SolveReshard(request.reshard())));
  EXPECT_EQ(reply.reshard().transfers_size(), 0);
}

TEST(HandleRequestTest, EmptyRequest) {
  const v1::Reply reply = Solve(Empty("e"));
  EXPECT_EQ(reply.id(), "e");
  ASSERT_TRUE(reply.has_error());
  EXPECT_EQ(reply.error().code(), v1::ERROR_CODE_EMPTY_REQUEST);
  EXPECT_THAT(reply.error().message(), HasSubstr("none of balance, plan_step, ping, reshard"));
  EXPECT_THAT(reply.error().field(), IsEmpty());
}

TEST(HandleRequestTest, UnknownKindIsAnEmptyRequest) {
  // A newer client's request kind: field 99, a length-delimited empty message.
  std::string bytes;
  v1::Request known;
  known.set_id("new");
  known.SerializeToString(&bytes);
  bytes += std::string("\x9a\x06\x00", 3);  // tag (99 << 3) | 2, length 0
  v1::Request request;
  ASSERT_TRUE(request.ParseFromString(bytes));
  const v1::Reply reply = Solve(request);
  EXPECT_EQ(reply.id(), "new");
  EXPECT_EQ(reply.error().code(), v1::ERROR_CODE_EMPTY_REQUEST);
  EXPECT_THAT(reply.error().message(), HasSubstr("does not know"));
}

struct InvalidCase {
  v1::Request request;
  std::string field;
  std::string message;  // the start of the message
};

TEST(HandleRequestTest, InvalidArgumentNamesTheField) {
  std::vector<InvalidCase> cases;
  cases.push_back({Balance("a", {1, 2}, 0), "balance.num_parts", "num_parts: must be in [1, "});
  cases.push_back({Balance("b", {1, -2}, 2), "balance.lengths[1]", "lengths[1]: must be in [0, "});
  {
    v1::Request r = Balance("c", {1, 2, 3}, 2);
    r.mutable_balance()->add_groups(0);
    r.mutable_balance()->add_groups(1);
    cases.push_back({r, "balance.groups", "groups: must be empty or have one entry per length"});
  }
  {
    v1::Request r = Balance("d", {1, 2}, 2);
    r.mutable_balance()->set_keep_groups(true);
    cases.push_back({r, "balance.keep_groups", "keep_groups: requires groups"});
  }
  {
    v1::Request r = Balance("e", {1, 2}, 2);
    r.mutable_balance()->mutable_cost()->set_kind(v1::COST_KIND_ATTENTION);
    r.mutable_balance()->mutable_cost()->mutable_model()->set_hidden_size(0);
    cases.push_back({r, "balance.cost.model.hidden_size", "cost.model.hidden_size: must be >= 1"});
  }
  {
    v1::Request r = Balance("f", {1, 2}, 2);
    r.mutable_balance()->mutable_cost()->set_kind(static_cast<v1::CostKind>(99));
    cases.push_back({r, "balance.cost.kind", "cost.kind: unknown value 99"});
  }
  {
    v1::Request r = Balance("g", {1, 2}, 2);
    r.mutable_balance()->set_refine_iterations(-1);
    cases.push_back({r, "balance.refine_iterations", "refine_iterations: must be >= 0"});
  }
  cases.push_back({PlanStep("h", {3, 9}, 1, 8), "plan_step.lengths[1]",
                   "lengths[1]: sequence of 9 tokens (padded) exceeds"});
  cases.push_back({PlanStep("i", {3}, 1, 0), "plan_step.max_tokens_per_micro_batch",
                   "max_tokens_per_micro_batch: must be >= 1"});
  cases.push_back({PlanStep("j", {3}, 2000000, 8), "plan_step.num_ranks", "num_ranks: must be in"});
  {
    v1::Request r = PlanStep("k", {3}, 1, 8);
    r.mutable_plan_step()->set_min_micro_batches(-1);
    cases.push_back({r, "plan_step.min_micro_batches", "min_micro_batches: must be in [0, "});
  }
  cases.push_back({Reshard("l", kTinyLlamaConfig, -1, 1, 1, 1, 1), "reshard.train.tp",
                   "train.tp: must be in [0, 65536] (0 means 1), got -1"});
  cases.push_back(
      {Reshard("m", kTinyLlamaConfig, 3, 1, 1, 1, 1), "reshard.train.tp", "train.tp: "});
  cases.push_back({Reshard("n", "[]", 1, 1, 1, 1, 1), "reshard.model_config_json",
                   "model_config_json: config: must be a JSON object"});
  {
    v1::Request r = Reshard("o", kTinyLlamaConfig, 1, 1, 1, 1, 1);
    r.mutable_reshard()->mutable_topology()->set_gpus_per_node(-1);
    cases.push_back({r, "reshard.topology.gpus_per_node", "topology.gpus_per_node: must be in"});
  }
  for (const InvalidCase& c : cases) {
    SCOPED_TRACE(c.request.ShortDebugString());
    const v1::Reply reply = Solve(c.request);
    EXPECT_EQ(reply.id(), c.request.id());
    ASSERT_TRUE(reply.has_error());
    EXPECT_EQ(reply.error().code(), v1::ERROR_CODE_INVALID_ARGUMENT);
    EXPECT_EQ(reply.error().field(), c.field);
    EXPECT_THAT(reply.error().message(), StartsWith(c.message));
  }
}

TEST(HandleRequestTest, IsDeterministic) {
  v1::Request request;
  request.set_id("big");
  const auto lengths = workload::HeavyTailedLengths(2048, 7);
  request.mutable_balance()->mutable_lengths()->Add(lengths.begin(), lengths.end());
  request.mutable_balance()->set_num_parts(16);
  request.mutable_balance()->set_equal_size(true);
  EXPECT_EQ(Solve(request).SerializeAsString(), Solve(request).SerializeAsString());
}

TEST(ErrorReplyTest, Fields) {
  const v1::Reply reply = ErrorReply("x", v1::ERROR_CODE_BAD_FRAME, "why", "where");
  EXPECT_EQ(reply.id(), "x");
  EXPECT_EQ(reply.error().code(), v1::ERROR_CODE_BAD_FRAME);
  EXPECT_EQ(reply.error().message(), "why");
  EXPECT_EQ(reply.error().field(), "where");
}

// --- DecodeRequest, EncodeReply, AnswerPayload ------------------------------------------

TEST(DecodeRequestTest, Delimited) {
  const v1::Request request = Balance("d", {1, 2, 3}, 2);
  const DecodedRequest decoded = DecodeRequest(request.SerializeAsString(), WireFormat::kDelimited);
  EXPECT_FALSE(decoded.error);
  EXPECT_TRUE(MessageDifferencer::Equals(decoded.request, request));

  const DecodedRequest garbage = DecodeRequest("\xff\xff\xff", WireFormat::kDelimited);
  ASSERT_TRUE(garbage.error);
  EXPECT_EQ(garbage.error->id(), "");
  EXPECT_EQ(garbage.error->error().code(), v1::ERROR_CODE_MALFORMED_REQUEST);
  EXPECT_THAT(garbage.error->error().message(), HasSubstr("3 bytes"));

  const DecodedRequest empty = DecodeRequest("", WireFormat::kDelimited);
  EXPECT_FALSE(empty.error);
  EXPECT_EQ(empty.request.kind_case(), v1::Request::KIND_NOT_SET);
}

TEST(DecodeRequestTest, Json) {
  const DecodedRequest snake = DecodeRequest(
      R"({"id": "j", "balance": {"lengths": [1, "2", 3], "num_parts": 2, "equal_size": true}})",
      WireFormat::kJson);
  ASSERT_FALSE(snake.error) << snake.error->DebugString();
  EXPECT_EQ(snake.request.id(), "j");
  EXPECT_EQ(snake.request.balance().lengths_size(), 3);
  EXPECT_TRUE(snake.request.balance().equal_size());
  const DecodedRequest camel =
      DecodeRequest(R"({"id":"c","planStep":{"numRanks":"2"}})", WireFormat::kJson);
  ASSERT_FALSE(camel.error);
  EXPECT_EQ(camel.request.plan_step().num_ranks(), 2);

  for (const auto& [line, id] : std::vector<std::pair<std::string, std::string>>{
           {"not json", ""},
           {"[1, 2]", ""},
           {R"({"id": "x", "balance": {"num_parts": "many"}})", "x"},
           {R"({"id": "y", "frobnicate": {}})", "y"},
           {R"({"id": 7, "ping": {}, "extra": 1})", ""},
           {R"({"id": "z", "ping": {}})"
            "trailing",
            ""},
           // Nested deeper than kMaxJsonDepth: refused after one scan, with the id.
           {R"({"id": "d", "x": )" + std::string(100'000, '[') + std::string(100'000, ']') + "}",
            "d"},
           {std::string(kMaxJsonDepth + 1, '[') + std::string(kMaxJsonDepth + 1, ']'), ""},
       }) {
    SCOPED_TRACE(line);
    const DecodedRequest decoded = DecodeRequest(line, WireFormat::kJson);
    ASSERT_TRUE(decoded.error);
    EXPECT_EQ(decoded.error->id(), id);
    EXPECT_EQ(decoded.error->error().code(), v1::ERROR_CODE_INVALID_JSON);
    EXPECT_THAT(decoded.error->error().message(), StartsWith("not a JSON rlsched.v1.Request: "));
  }
  // At the limit the line is parsed (and is no Request: an unknown field).
  const DecodedRequest at_limit =
      DecodeRequest(R"({"id": "l", "x": )" + std::string(kMaxJsonDepth - 1, '[') +
                        std::string(kMaxJsonDepth - 1, ']') + "}",
                    WireFormat::kJson);
  ASSERT_TRUE(at_limit.error);
  EXPECT_EQ(at_limit.error->id(), "l");
  EXPECT_THAT(at_limit.error->error().message(), Not(HasSubstr("nested deeper")));
}

TEST(EncodeReplyTest, DelimitedAndJson) {
  const v1::Reply reply = Solve(Balance("r", {4, 5, 6}, 2));
  const std::string frame = EncodeReply(reply, WireFormat::kDelimited);
  EXPECT_EQ(frame, Framed(reply));
  const std::string line = EncodeReply(reply, WireFormat::kJson);
  EXPECT_EQ(line, ToJson(reply) + "\n");
  EXPECT_THAT(line, StartsWith(R"({"id":"r","balance":{"parts":)"));
  const auto parsed = ParseJsonReplies(line);
  ASSERT_TRUE(parsed);
  ASSERT_EQ(parsed->size(), 1u);
  EXPECT_TRUE(MessageDifferencer::Equals(parsed->front(), reply));
}

TEST(AnswerPayloadTest, SummarisesTheReply) {
  const Answer ok = AnswerPayload(Ping("p").SerializeAsString(), WireFormat::kDelimited);
  EXPECT_EQ(ok.id, "p");
  EXPECT_EQ(ok.kind, v1::Request::kPing);
  EXPECT_EQ(ok.error_code, v1::ERROR_CODE_UNSPECIFIED);
  EXPECT_EQ(ok.frame, Framed(Solve(Ping("p"))));
  const Answer bad = AnswerPayload(R"({"id":"q","balance":{}})", WireFormat::kJson);
  EXPECT_EQ(bad.id, "q");
  EXPECT_EQ(bad.kind, v1::Request::kBalance);
  EXPECT_EQ(bad.error_code, v1::ERROR_CODE_INVALID_ARGUMENT);
  EXPECT_THAT(bad.frame, HasSubstr(R"("field":"balance.num_parts")"));
}

// --- RequestReader -------------------------------------------------------------------

// Every frame of `bytes`, read in chunks of `block` bytes, then the final frame.
std::vector<RequestReader::Frame> ReadAll(const std::string& bytes, WireFormat format,
                                          std::int64_t cap = kDefaultMaxMessageBytes,
                                          int block = -1) {
  google::protobuf::io::ArrayInputStream stream(bytes.data(), static_cast<int>(bytes.size()),
                                                block);
  RequestReader reader(stream, format, cap);
  std::vector<RequestReader::Frame> frames;
  while (true) {
    frames.push_back(reader.Next());
    if (frames.back().kind != Kind::kPayload) break;
  }
  const RequestReader::Frame again = reader.Next();  // the final frame repeats
  EXPECT_EQ(again.kind, frames.back().kind);
  EXPECT_EQ(again.error, frames.back().error);
  EXPECT_EQ(reader.frames(), static_cast<std::int64_t>(frames.size()) - 1);
  return frames;
}

TEST(RequestReaderTest, DelimitedFramesInAnyChunking) {
  const std::vector<v1::Request> requests = MixedRequests();
  const std::string bytes = Framed(requests) + Framed(Empty(""));  // and an empty frame
  for (const int block : {1, 2, 3, 7, 64, -1}) {
    SCOPED_TRACE(block);
    const auto frames = ReadAll(bytes, WireFormat::kDelimited, kDefaultMaxMessageBytes, block);
    ASSERT_EQ(frames.size(), requests.size() + 2);
    for (std::size_t i = 0; i < requests.size(); ++i) {
      EXPECT_EQ(frames[i].kind, Kind::kPayload);
      EXPECT_EQ(frames[i].payload, requests[i].SerializeAsString());
    }
    EXPECT_EQ(frames[requests.size()].payload, "");
    EXPECT_EQ(frames.back().kind, Kind::kEnd);
  }
  EXPECT_EQ(ReadAll("", WireFormat::kDelimited).front().kind, Kind::kEnd);
}

TEST(RequestReaderTest, DelimitedBadFrames) {
  struct Case {
    std::string bytes;
    std::int64_t cap;
    std::size_t payloads;  // frames before the bad one
    std::string error;
  };
  const std::string ping = Framed(Ping("p"));
  const std::vector<Case> cases = {
      // 2^62, far above any cap: refused before allocating.
      {ping + std::string("\x80\x80\x80\x80\x80\x80\x80\x80\x40", 9), kDefaultMaxMessageBytes, 1,
       "length prefix of 4611686018427387904 bytes after frame 1 exceeds the cap of 67108864"},
      {ping + std::string("\x05", 1), 4, 0, "length prefix of"},  // the ping itself is > 4
      {ping + "\x0b"
              "abc",
       kDefaultMaxMessageBytes, 1, "the stream ends inside frame 2: 3 of 11"},
      {ping + "\x80", kDefaultMaxMessageBytes, 1, "the stream ends inside a length prefix"},
      {ping + std::string(10, '\xff') + "\x01", kDefaultMaxMessageBytes, 1,
       "malformed length prefix after frame 1: more than 64 bits"},
      {ping + std::string(9, '\xff') + "\x02", kDefaultMaxMessageBytes, 1,
       "malformed length prefix"},
      {ping.substr(0, ping.size() - 1), kDefaultMaxMessageBytes, 0, "ends inside frame 1"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.error);
    const auto frames = ReadAll(c.bytes, WireFormat::kDelimited, c.cap);
    ASSERT_EQ(frames.size(), c.payloads + 1);
    EXPECT_EQ(frames.back().kind, Kind::kBadFrame);
    EXPECT_THAT(frames.back().error, HasSubstr(c.error));
  }
  // 10 bytes, the last one 0x01: 2^63, still a valid varint; above the cap.
  const auto max = ReadAll(std::string(9, '\x80') + "\x01", WireFormat::kDelimited);
  EXPECT_THAT(max.back().error, HasSubstr("9223372036854775808 bytes"));
  // A frame of exactly the cap is accepted.
  const auto exact =
      ReadAll(ping, WireFormat::kDelimited, static_cast<std::int64_t>(ping.size() - 1));
  EXPECT_EQ(exact.front().kind, Kind::kPayload);
}

TEST(RequestReaderTest, JsonLines) {
  const std::string text = "\n{\"id\":\"a\"}\n  \r\n\n{\"id\":\"b\"}\r\n{\"id\":\"c\"}";
  for (const int block : {1, 5, -1}) {
    const auto frames = ReadAll(text, WireFormat::kJson, kDefaultMaxMessageBytes, block);
    ASSERT_EQ(frames.size(), 4u);
    EXPECT_EQ(frames[0].payload, "{\"id\":\"a\"}");
    EXPECT_EQ(frames[1].payload, "{\"id\":\"b\"}\r");
    EXPECT_EQ(frames[2].payload, "{\"id\":\"c\"}");  // the last line has no '\n'
    EXPECT_EQ(frames[3].kind, Kind::kEnd);
  }
  EXPECT_EQ(ReadAll("\n \n", WireFormat::kJson).front().kind, Kind::kEnd);

  const auto capped = ReadAll("12345\n123456\n", WireFormat::kJson, 5, 2);
  ASSERT_EQ(capped.size(), 2u);
  EXPECT_EQ(capped[0].payload, "12345");
  EXPECT_EQ(capped[1].kind, Kind::kBadFrame);
  EXPECT_THAT(capped[1].error, HasSubstr("line 2 exceeds the cap of 5 bytes"));
}

// --- Serve, in-process ----------------------------------------------------------------

// A sink that fails from the `fail_at`-th write on.
class FailingSink : public ReplySink {
 public:
  explicit FailingSink(int fail_at) : fail_at_(fail_at) {}
  bool Write(std::string_view bytes) override {
    if (writes_++ >= fail_at_) return false;
    bytes_.append(bytes);
    return true;
  }
  const std::string& bytes() const { return bytes_; }

 private:
  int fail_at_;
  int writes_ = 0;
  std::string bytes_;
};

ServeOutcome ServeString(const std::string& input, StringReplySink& sink, WireFormat format,
                         int threads, std::int64_t cap = kDefaultMaxMessageBytes) {
  google::protobuf::io::ArrayInputStream stream(input.data(), static_cast<int>(input.size()), 7);
  ServeOptions options;
  options.format = format;
  options.threads = threads;
  options.max_message_bytes = cap;
  return Serve(options, stream, sink);
}

TEST(ServeTest, RepliesInOrderOnAnyThreadCount) {
  // Many requests of varied cost, so that later ones can finish first.
  std::vector<v1::Request> requests = MixedRequests();
  for (int i = 0; i < 40; ++i) {
    v1::Request request;
    request.set_id("r" + std::to_string(i));
    const auto lengths = workload::HeavyTailedLengths(i % 3 == 0 ? 4096 : 16, 100 + i);
    request.mutable_balance()->mutable_lengths()->Add(lengths.begin(), lengths.end());
    request.mutable_balance()->set_num_parts(8);
    request.mutable_balance()->set_equal_size(i % 2 == 0);
    requests.push_back(request);
  }
  const std::vector<v1::Reply> expected = Expected(requests);
  for (const int threads : {1, 2, 4, 8}) {
    SCOPED_TRACE(threads);
    StringReplySink sink;
    EXPECT_EQ(ServeString(Framed(requests), sink, WireFormat::kDelimited, threads),
              ServeOutcome::kEndOfInput);
    const auto replies = ParseReplies(sink.bytes());
    ASSERT_TRUE(replies);
    ExpectReplies(*replies, expected);

    StringReplySink json_sink;
    EXPECT_EQ(ServeString(JsonLines(requests), json_sink, WireFormat::kJson, threads),
              ServeOutcome::kEndOfInput);
    const auto json_replies = ParseJsonReplies(json_sink.bytes());
    ASSERT_TRUE(json_replies);
    ExpectReplies(*json_replies, expected);
  }
}

TEST(ServeTest, DeadlineStopsASimulationAndServingGoesOn) {
  // A simulation of 10 steps × 4,096 samples (over 40,000 events), with a deadline that
  // has passed at its first stop check; the ping behind it is answered.
  v1::Request simulate;
  simulate.set_id("sim");
  simulate.mutable_simulate()->mutable_config()->set_steps(10);
  const std::string input = Framed(simulate) + Framed(Ping("after"));
  for (const double timeout : {1e-9, 0.0}) {
    SCOPED_TRACE(timeout);
    google::protobuf::io::ArrayInputStream stream(input.data(), static_cast<int>(input.size()));
    ServeOptions options;
    options.threads = 2;
    options.request_timeout_seconds = timeout;
    StringReplySink sink;
    EXPECT_EQ(Serve(options, stream, sink), ServeOutcome::kEndOfInput);
    const auto replies = ParseReplies(sink.bytes());
    ASSERT_TRUE(replies);
    ASSERT_EQ(replies->size(), 2u);
    EXPECT_EQ((*replies)[0].id(), "sim");
    if (timeout > 0) {
      EXPECT_EQ((*replies)[0].error().code(), v1::ERROR_CODE_DEADLINE_EXCEEDED);
      EXPECT_THAT((*replies)[0].error().message(), StartsWith("simulate: simulation stopped"));
    } else {  // 0: no deadline
      EXPECT_TRUE((*replies)[0].has_simulate()) << (*replies)[0].DebugString();
    }
    EXPECT_EQ((*replies)[1].id(), "after");
    EXPECT_TRUE((*replies)[1].has_pong());
  }
  ServeOptions bad;
  bad.request_timeout_seconds = -1;
  google::protobuf::io::ArrayInputStream empty(input.data(), 0);
  StringReplySink sink;
  EXPECT_THROW(Serve(bad, empty, sink), std::invalid_argument);
}

TEST(ServeTest, EmptyInput) {
  StringReplySink sink;
  EXPECT_EQ(ServeString("", sink, WireFormat::kDelimited, 2), ServeOutcome::kEndOfInput);
  EXPECT_THAT(sink.bytes(), IsEmpty());
  EXPECT_EQ(ServeString("\n\n", sink, WireFormat::kJson, 2), ServeOutcome::kEndOfInput);
  EXPECT_THAT(sink.bytes(), IsEmpty());
}

TEST(ServeTest, MalformedFrameAndInvalidJsonGoOn) {
  const std::string garbage = "\x03\xff\xff\xff";
  StringReplySink sink;
  EXPECT_EQ(
      ServeString(Framed(Ping("a")) + garbage + Framed(Ping("b")), sink, WireFormat::kDelimited, 2),
      ServeOutcome::kEndOfInput);
  const auto replies = ParseReplies(sink.bytes());
  ASSERT_TRUE(replies);
  ASSERT_EQ(replies->size(), 3u);
  EXPECT_EQ((*replies)[0].id(), "a");
  EXPECT_EQ((*replies)[1].error().code(), v1::ERROR_CODE_MALFORMED_REQUEST);
  EXPECT_EQ((*replies)[2].id(), "b");

  StringReplySink json_sink;
  EXPECT_EQ(ServeString("{\"id\":\"a\",\"ping\":{}}\n{oops\n{\"id\":\"b\",\"ping\":{}}\n",
                        json_sink, WireFormat::kJson, 2),
            ServeOutcome::kEndOfInput);
  const auto json_replies = ParseJsonReplies(json_sink.bytes());
  ASSERT_TRUE(json_replies);
  ASSERT_EQ(json_replies->size(), 3u);
  EXPECT_EQ((*json_replies)[1].error().code(), v1::ERROR_CODE_INVALID_JSON);
  EXPECT_EQ((*json_replies)[2].pong().version(), RLSCHED_VERSION);
}

TEST(ServeTest, BadFrameStopsAfterItsReply) {
  const std::vector<v1::Request> requests = MixedRequests();
  const std::string bytes = Framed(requests) + "\xff\xff\xff\x7f" + Framed(Ping("after"));
  for (const int threads : {1, 3}) {
    StringReplySink sink;
    EXPECT_EQ(ServeString(bytes, sink, WireFormat::kDelimited, threads, 1 << 20),
              ServeOutcome::kBadFrame);
    const auto replies = ParseReplies(sink.bytes());
    ASSERT_TRUE(replies);
    ASSERT_EQ(replies->size(), requests.size() + 1);
    std::vector<v1::Reply> head(replies->begin(), replies->end() - 1);
    ExpectReplies(head, Expected(requests));
    const v1::Reply& last = replies->back();
    EXPECT_EQ(last.id(), "");
    EXPECT_EQ(last.error().code(), v1::ERROR_CODE_BAD_FRAME);
    EXPECT_THAT(last.error().message(), HasSubstr("exceeds the cap of 1048576 bytes"));
  }
  StringReplySink json_sink;
  EXPECT_EQ(ServeString("{\"id\":\"a\",\"ping\":{}}\n" + std::string(100, ' ') + "x\n", json_sink,
                        WireFormat::kJson, 2, 64),
            ServeOutcome::kBadFrame);
  const auto json_replies = ParseJsonReplies(json_sink.bytes());
  ASSERT_TRUE(json_replies);
  ASSERT_EQ(json_replies->size(), 2u);
  EXPECT_EQ(json_replies->back().error().code(), v1::ERROR_CODE_BAD_FRAME);
}

TEST(ServeTest, FailedWriteStops) {
  std::vector<v1::Request> requests;
  for (int i = 0; i < 50; ++i) requests.push_back(Ping(std::to_string(i)));
  const std::string bytes = Framed(requests);
  for (const int threads : {1, 4}) {
    google::protobuf::io::ArrayInputStream stream(bytes.data(), static_cast<int>(bytes.size()));
    FailingSink sink(3);
    ServeOptions options;
    options.threads = threads;
    EXPECT_EQ(Serve(options, stream, sink), ServeOutcome::kOutputFailed);
    const auto replies = ParseReplies(sink.bytes());
    ASSERT_TRUE(replies);
    ASSERT_EQ(replies->size(), 3u);
    EXPECT_EQ((*replies)[2].id(), "2");
  }
}

TEST(ServeTest, OptionsAreChecked) {
  google::protobuf::io::ArrayInputStream stream("", 0);
  StringReplySink sink;
  ServeOptions options;
  options.threads = -1;
  EXPECT_THROW(Serve(options, stream, sink), std::invalid_argument);
  options.threads = 1;
  options.max_message_bytes = 0;
  EXPECT_THROW(Serve(options, stream, sink), std::invalid_argument);
  options.max_message_bytes = kMaxMessageBytesLimit + 1;
  EXPECT_THROW(Serve(options, stream, sink), std::invalid_argument);
}

}  // namespace
}  // namespace rlsched::app
