// `rlsched serve` run over pipes: request sequences in both formats, a conversation
// one request at a time, every error case and its exit status, random and truncated
// byte streams (never a crash or a hang), a closed stdout, files and named pipes.

#include <gmock/gmock.h>
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "rlsched/workload/workload.h"
#include "serve.h"
#include "serve_test_util.h"
#include "subprocess.h"

namespace rlsched::app {
namespace {

using namespace ::rlsched::wire;  // NOLINT: the conversions

using ::google::protobuf::util::MessageDifferencer;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using namespace ::rlsched::wire::testing;  // NOLINT: the test helpers

constexpr std::chrono::milliseconds kStreamTimeLimit{10'000};

// A temporary directory, removed at the end of the test.

TEST(ServeCliTest, Help) {
  const ProcessResult r = RunProgram({"serve", "--help"});
  EXPECT_EQ(r.status, 0);
  for (const char* option : {"--input", "--output", "--format", "--threads", "--max-message-bytes",
                             "exit status 2", "stderr"}) {
    EXPECT_THAT(r.out, HasSubstr(option));
  }
  EXPECT_THAT(RunProgram({"--help"}).out, HasSubstr("serve"));
}

TEST(ServeCliTest, MixedRequestsDelimited) {
  const std::vector<v1::Request> requests = MixedRequests();
  for (const char* threads : {"1", "2"}) {
    const ProcessResult r = RunProgram({"serve", "--threads", threads}, Framed(requests));
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_THAT(r.err, IsEmpty());
    const auto replies = ParseReplies(r.out);
    ASSERT_TRUE(replies);
    ExpectReplies(*replies, Expected(requests));
    EXPECT_EQ((*replies)[0].pong().version(), RLSCHED_VERSION);
    EXPECT_EQ((*replies)[3].error().code(), v1::ERROR_CODE_INVALID_ARGUMENT);
    EXPECT_EQ((*replies)[3].error().field(), "balance.num_parts");
    EXPECT_EQ((*replies)[4].error().code(), v1::ERROR_CODE_EMPTY_REQUEST);
    EXPECT_EQ((*replies)[5].error().field(), "plan_step.lengths[1]");
  }
}

TEST(ServeCliTest, MixedRequestsJson) {
  const std::vector<v1::Request> requests = MixedRequests();
  // camelCase from protobuf's printer, then snake_case and junk written by hand.
  const std::string input = JsonLines(requests) +
                            "{\"id\": \"h\", \"balance\": {\"lengths\": [3, 1, 2], "
                            "\"num_parts\": 2, \"equal_size\": true}}\n"
                            "\n"
                            "{\"id\": \"i\", \"balance\": {\"num_parts\": \"x\"}}\n"
                            "not json at all\n"
                            "{\"id\": \"j\", \"ping\": {}}";  // no final newline
  const ProcessResult r = RunProgram({"serve", "--format", "json", "--threads", "2"}, input);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.err, IsEmpty());
  const auto replies = ParseJsonReplies(r.out);
  ASSERT_TRUE(replies) << r.out;
  ASSERT_EQ(replies->size(), requests.size() + 4);
  std::vector<v1::Reply> head(replies->begin(), replies->begin() + requests.size());
  ExpectReplies(head, Expected(requests));
  const std::size_t n = requests.size();
  EXPECT_EQ((*replies)[n].id(), "h");
  EXPECT_EQ((*replies)[n].balance().parts_size(), 2);
  EXPECT_EQ((*replies)[n + 1].id(), "i");
  EXPECT_EQ((*replies)[n + 1].error().code(), v1::ERROR_CODE_INVALID_JSON);
  EXPECT_EQ((*replies)[n + 2].id(), "");
  EXPECT_EQ((*replies)[n + 2].error().code(), v1::ERROR_CODE_INVALID_JSON);
  EXPECT_EQ((*replies)[n + 3].id(), "j");
  EXPECT_TRUE((*replies)[n + 3].has_pong());
  // Output in the proto field names, defaults printed.
  EXPECT_THAT(r.out, HasSubstr(R"({"id":"0","pong":{"version":")"));
  EXPECT_THAT(r.out, HasSubstr(R"("proven_optimal":)"));
  EXPECT_THAT(r.out, HasSubstr(R"("field":"balance.num_parts")"));
}

// A client sends one request and waits for its reply before sending the next: each
// reply must come while stdin stays open.
TEST(ServeCliTest, ConversationOneRequestAtATime) {
  for (const char* threads : {"1", "2", "4"}) {
    SCOPED_TRACE(threads);
    Subprocess daemon({"serve", "--threads", threads});
    std::string out;
    std::size_t expected_size = 0;
    for (int i = 0; i < 20; ++i) {
      const v1::Request request =
          i % 2 == 0 ? Ping(std::to_string(i)) : Balance(std::to_string(i), {5, 3, 2, 7}, 2);
      ASSERT_TRUE(daemon.Write(Framed(request)));
      expected_size += Framed(Solve(request)).size();
      ASSERT_TRUE(daemon.ReadAtLeast(expected_size, &out, kStreamTimeLimit))
          << "no reply to request " << i;
      EXPECT_EQ(out.size(), expected_size);
    }
    const auto replies = ParseReplies(out);
    ASSERT_TRUE(replies);
    ASSERT_EQ(replies->size(), 20u);
    for (int i = 0; i < 20; ++i) EXPECT_EQ((*replies)[i].id(), std::to_string(i));
    const ProcessResult r = daemon.Communicate("", kStreamTimeLimit);
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_THAT(r.out, IsEmpty());
  }
  Subprocess json({"serve", "--format=json"});
  std::string out;
  ASSERT_TRUE(json.Write("{\"id\":\"x\",\"ping\":{}}\n"));
  ASSERT_TRUE(json.ReadAtLeast(1, &out, kStreamTimeLimit));
  ASSERT_TRUE(json.ReadAtLeast(out.find('\n') == std::string::npos ? out.size() + 1 : 0, &out,
                               kStreamTimeLimit));
  EXPECT_THAT(out, HasSubstr(R"({"id":"x","pong":)"));
  EXPECT_EQ(json.Communicate("", kStreamTimeLimit).status, 0);
}

TEST(ServeCliTest, EmptyInputExitsZeroWithoutOutput) {
  for (const char* format : {"delimited", "json"}) {
    const ProcessResult r = RunProgram({"serve", "--format", format}, "", kStreamTimeLimit);
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_THAT(r.out, IsEmpty());
    EXPECT_THAT(r.err, IsEmpty());
  }
}

// The replies of `out`, the last of which must be BAD_FRAME with id "".
std::vector<v1::Reply> ExpectBadFrameEnd(const ProcessResult& r, const std::string& message) {
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr(message));
  const auto replies = ParseReplies(r.out);
  EXPECT_TRUE(replies);
  if (!replies || replies->empty()) {
    ADD_FAILURE() << "no reply";
    return {};
  }
  const v1::Reply& last = replies->back();
  EXPECT_EQ(last.id(), "");
  EXPECT_EQ(last.error().code(), v1::ERROR_CODE_BAD_FRAME);
  EXPECT_THAT(last.error().message(), HasSubstr(message));
  return *replies;
}

TEST(ServeCliTest, OversizedLengthPrefix) {
  // 100 MiB announced, above the default 64 MiB; nothing follows.
  std::string prefix;
  for (std::uint64_t size = 100u << 20; size >= 0x80; size >>= 7) {
    prefix += static_cast<char>((size & 0x7f) | 0x80);
  }
  prefix += static_cast<char>((100u << 20) >> 21);
  const std::string input = Framed(Ping("a")) + prefix + "more bytes";
  const auto replies = ExpectBadFrameEnd(RunProgram({"serve"}, input, kStreamTimeLimit),
                                         "length prefix of 104857600 bytes after frame 1 "
                                         "exceeds the cap of 67108864 bytes");
  ASSERT_EQ(replies.size(), 2u);
  EXPECT_EQ(replies[0].id(), "a");

  // The cap is configurable: a 25-byte request is too big for a cap of 16.
  const v1::Request big = Balance("big", {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14}, 2);
  ASSERT_GT(big.ByteSizeLong(), 16u);
  const auto capped =
      ExpectBadFrameEnd(RunProgram({"serve", "--max-message-bytes", "16"},
                                   Framed({Ping("a"), big, Ping("b")}), kStreamTimeLimit),
                        "exceeds the cap of 16 bytes");
  EXPECT_EQ(capped.size(), 2u);
}

TEST(ServeCliTest, TruncatedStream) {
  const std::string frame = Framed(Balance("t", {1, 2, 3}, 2));
  const auto replies =
      ExpectBadFrameEnd(RunProgram({"serve"}, Framed(Ping("a")) + frame.substr(0, frame.size() - 2),
                                   kStreamTimeLimit),
                        "the stream ends inside frame 2");
  ASSERT_EQ(replies.size(), 2u);
  EXPECT_EQ(replies[0].id(), "a");
  ExpectBadFrameEnd(RunProgram({"serve"}, Framed(Ping("a")) + "\x80\x80", kStreamTimeLimit),
                    "the stream ends inside a length prefix");
  ExpectBadFrameEnd(RunProgram({"serve"}, std::string(11, '\xff'), kStreamTimeLimit),
                    "malformed length prefix");
}

TEST(ServeCliTest, GarbageBytes) {
  // Text where protobuf is expected: 'h' (104) announces 104 bytes that never come.
  ExpectBadFrameEnd(RunProgram({"serve"}, "hello, daemon\n", kStreamTimeLimit),
                    "the stream ends inside frame 1");
  // A well-framed payload that is not a Request: MALFORMED_REQUEST, serving goes on.
  const ProcessResult r = RunProgram(
      {"serve"}, Framed(Ping("a")) + std::string("\x04\xff\xff\xff\xff", 5) + Framed(Ping("b")),
      kStreamTimeLimit);
  EXPECT_EQ(r.status, 0) << r.err;
  const auto replies = ParseReplies(r.out);
  ASSERT_TRUE(replies);
  ASSERT_EQ(replies->size(), 3u);
  EXPECT_EQ((*replies)[1].id(), "");
  EXPECT_EQ((*replies)[1].error().code(), v1::ERROR_CODE_MALFORMED_REQUEST);
  EXPECT_EQ((*replies)[2].id(), "b");
}

TEST(ServeCliTest, JsonLineAboveTheCap) {
  const ProcessResult r = RunProgram(
      {"serve", "--format", "json", "--max-message-bytes", "100"},
      "{\"id\":\"a\",\"ping\":{}}\n{\"id\":\"" + std::string(200, 'x') + "\"}\n", kStreamTimeLimit);
  EXPECT_EQ(r.status, 2) << r.err;
  const auto replies = ParseJsonReplies(r.out);
  ASSERT_TRUE(replies) << r.out;
  ASSERT_EQ(replies->size(), 2u);
  EXPECT_EQ((*replies)[0].id(), "a");
  EXPECT_EQ((*replies)[1].error().code(), v1::ERROR_CODE_BAD_FRAME);
  EXPECT_THAT((*replies)[1].error().message(), HasSubstr("line 2 exceeds the cap of 100 bytes"));
}

// The daemon on `input` must exit 0 or 2 within the time limit, without a signal,
// and write a whole number of replies, the last one BAD_FRAME exactly when it exits 2.
// Returns the replies.
std::vector<v1::Reply> ExpectSafeExit(const std::string& input) {
  const ProcessResult r = RunProgram({"serve", "--threads", "2"}, input, kStreamTimeLimit);
  EXPECT_FALSE(r.timed_out);
  EXPECT_TRUE(r.status == 0 || r.status == 2) << "status " << r.status << "\n" << r.err;
  const auto replies = ParseReplies(r.out);
  EXPECT_TRUE(replies) << "stdout is not a sequence of replies";
  if (!replies) return {};
  const bool bad_frame =
      !replies->empty() && replies->back().error().code() == v1::ERROR_CODE_BAD_FRAME;
  EXPECT_EQ(bad_frame, r.status == 2) << r.err;
  for (std::size_t i = 0; i + 1 < replies->size(); ++i) {
    EXPECT_NE((*replies)[i].error().code(), v1::ERROR_CODE_BAD_FRAME);
  }
  return *replies;
}

std::string RandomBytes(workload::Rng& rng, std::int64_t size) {
  std::string bytes;
  for (std::int64_t i = 0; i < size; ++i) bytes += static_cast<char>(rng.Next() & 0xff);
  return bytes;
}

TEST(ServeCliTest, RandomByteStreams) {
  workload::Rng rng(20240611);
  for (int stream = 0; stream < 200; ++stream) {
    std::string input;
    std::int64_t frames = -1;  // well-framed payloads, when every frame is whole
    switch (stream % 3) {
      case 0:  // anything
        input = RandomBytes(rng, rng.UniformInt(1, 48));
        break;
      case 1: {  // well-framed random payloads: one reply each, exit 0
        frames = rng.UniformInt(1, 4);
        for (std::int64_t f = 0; f < frames; ++f) {
          const std::int64_t size = rng.UniformInt(0, 24);
          input += static_cast<char>(size);
          input += RandomBytes(rng, size);
        }
        break;
      }
      case 2: {  // a valid stream with a few bytes overwritten
        input = Framed(MixedRequests());
        const std::int64_t flips = rng.UniformInt(1, 3);
        for (std::int64_t f = 0; f < flips; ++f) {
          input[static_cast<std::size_t>(
              rng.UniformInt(0, static_cast<std::int64_t>(input.size()) - 1))] =
              static_cast<char>(rng.Next() & 0xff);
        }
        break;
      }
    }
    SCOPED_TRACE(::testing::Message() << "stream " << stream << ", " << input.size() << " bytes");
    const std::vector<v1::Reply> replies = ExpectSafeExit(input);
    if (frames >= 0) {
      EXPECT_EQ(static_cast<std::int64_t>(replies.size()), frames);
    }
    if (::testing::Test::HasFailure()) return;
  }
}

// A valid stream cut at every byte: the replies to the whole frames, then BAD_FRAME
// unless the cut falls between frames.
TEST(ServeCliTest, TruncatedValidStreams) {
  const std::vector<v1::Request> requests = {Ping("0"), Balance("1", {4096, 512, 700}, 2),
                                             Empty("2"), PlanStep("3", {100, 200}, 1, 300)};
  const std::vector<v1::Reply> expected = Expected(requests);
  std::vector<std::size_t> boundaries = {0};
  std::string input;
  for (const v1::Request& request : requests) {
    input += Framed(request);
    boundaries.push_back(input.size());
  }
  std::size_t whole = 0;
  for (std::size_t cut = 0; cut <= input.size(); ++cut) {
    SCOPED_TRACE(::testing::Message() << "cut at " << cut << " of " << input.size());
    while (whole + 1 < boundaries.size() && boundaries[whole + 1] <= cut) ++whole;
    const bool at_boundary = boundaries[whole] == cut;
    const std::vector<v1::Reply> replies = ExpectSafeExit(input.substr(0, cut));
    ASSERT_EQ(replies.size(), whole + (at_boundary ? 0 : 1));
    ExpectReplies(std::vector<v1::Reply>(replies.begin(), replies.begin() + whole),
                  std::vector<v1::Reply>(expected.begin(), expected.begin() + whole));
    if (::testing::Test::HasFailure()) return;
  }
}

// The reader of stdout goes away: the daemon exits with status 1, no signal, whether
// its stdin is closed or still open.
TEST(ServeCliTest, ClosedStdout) {
  std::vector<v1::Request> requests;
  for (int i = 0; i < 200; ++i) requests.push_back(Balance(std::to_string(i), {5, 3, 2, 7}, 2));
  {
    Subprocess daemon({"serve", "--threads", "2"});
    daemon.CloseStdout();
    const ProcessResult r = daemon.Communicate(Framed(requests), kStreamTimeLimit);
    EXPECT_FALSE(r.timed_out);
    EXPECT_EQ(r.status, 1) << r.err;
    EXPECT_THAT(r.err, HasSubstr("the output is closed"));
  }
  {
    Subprocess daemon({"serve"});
    ASSERT_TRUE(daemon.Write(Framed(Ping("a"))));
    std::string out;
    ASSERT_TRUE(daemon.ReadAtLeast(1, &out, kStreamTimeLimit));
    daemon.CloseStdout();  // stdin stays open, no more requests
    const auto start = std::chrono::steady_clock::now();
    const ProcessResult r = daemon.Wait(kStreamTimeLimit);
    EXPECT_LT(std::chrono::steady_clock::now() - start, kStreamTimeLimit);
    EXPECT_FALSE(r.timed_out);
    EXPECT_EQ(r.status, 1) << r.err;
    EXPECT_THAT(r.err, HasSubstr("stopping: the output is closed"));
  }
}

TEST(ServeCliTest, FilesAndNamedPipes) {
  TempDir dir;
  const std::vector<v1::Request> requests = MixedRequests();
  { std::ofstream(dir / "requests.bin", std::ios::binary) << Framed(requests); }
  const ProcessResult r =
      RunProgram({"serve", "--input", dir / "requests.bin", "--output", dir / "replies.bin"}, "",
                 kStreamTimeLimit);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, IsEmpty());
  const auto replies = ParseReplies(ReadFile(dir / "replies.bin"));
  ASSERT_TRUE(replies);
  ExpectReplies(*replies, Expected(requests));

  // A named pipe as input: the daemon waits for a writer, then for EOF.
  const std::string fifo = dir / "requests.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  Subprocess daemon({"serve", "--input", fifo});
  {
    std::ofstream writer(fifo, std::ios::binary);
    writer << Framed(requests);
  }
  const ProcessResult piped = daemon.Communicate("", kStreamTimeLimit);
  EXPECT_EQ(piped.status, 0) << piped.err;
  const auto piped_replies = ParseReplies(piped.out);
  ASSERT_TRUE(piped_replies);
  ExpectReplies(*piped_replies, Expected(requests));
}

TEST(ServeCliTest, BadOptions) {
  for (const auto& [args, message] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"serve", "--input", "/nonexistent/requests"},
            "--input: /nonexistent/requests: cannot open"},
           {{"serve", "--output", "/nonexistent/replies"},
            "--output: /nonexistent/replies: cannot open"},
           {{"serve", "--format", "xml"}, "--format"},
           {{"serve", "--threads", "0"}, "--threads"},
           {{"serve", "--max-message-bytes", "0"}, "--max-message-bytes"},
           {{"serve", "--max-message-bytes", "4294967296"}, "--max-message-bytes"},
       }) {
    const ProcessResult r = RunProgram(args, "", kStreamTimeLimit);
    EXPECT_EQ(r.status, 2) << r.err;
    EXPECT_THAT(r.out, IsEmpty());
    EXPECT_THAT(r.err, HasSubstr(message));
  }
}

TEST(ServeCliTest, LogsGoToStderr) {
  const ProcessResult r =
      RunProgram({"serve", "--log-level", "debug"}, Framed(MixedRequests()), kStreamTimeLimit);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(ParseReplies(r.out));
  EXPECT_THAT(r.err, HasSubstr("request 3 (id '3', balance): ERROR_CODE_INVALID_ARGUMENT"));
  EXPECT_THAT(r.err, HasSubstr("served 7 requests (3 errors)"));
}

}  // namespace
}  // namespace rlsched::app
