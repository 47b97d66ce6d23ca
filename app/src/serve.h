// serve.h — the daemon behind `rlsched serve`: requests in, replies out.
//
// Overview
//   The daemon reads rlsched.v1.Request messages from a byte stream and writes one
//   rlsched.v1.Reply per request, in request order, each echoing the request's id.
//   Two wire formats (proto/rlsched/v1/service.proto, README "The daemon"):
//     - kDelimited: each message preceded by its size as a base-128 varint (the
//       standard delimited format of the protobuf libraries);
//     - kJson: one JSON object per line, in protobuf's JSON mapping (proto field
//       names, default-valued fields printed).
//
//   The path of one request is split into pure steps so that the daemon, the tests
//   and the fuzzer (tests/fuzz/serve_fuzzer.cc) all run the same code:
//     RequestReader::Next()  the next frame's bytes (or the end, or a bad frame);
//     DecodeRequest()        those bytes as a Request, or the error reply;
//     Solve()        the Request solved (SolveBalance, SolvePlanStep,
//                            SolveReshard, SolveSimulate, a Pong), or the error
//                            reply; never throws
//                            for bad input;
//     EncodeReply()          the Reply framed for the wire.
//   Serve() runs them in a oneTBB parallel_pipeline: serial in-order read → parallel
//   decode, solve and encode → serial in-order write, with at most 2 × threads
//   requests in flight, and writes each reply as soon as it and those before it are
//   ready (the client waits for it).
//
//   Errors, and how serving goes on:
//     a field out of bounds        INVALID_ARGUMENT, field = "balance.<path>",
//                                  "plan_step.<path>", "reshard.<path>" or
//                                  "simulate.<path>" (e.g. "reshard.train.tp",
//                                  "simulate.config.engines");
//                                  serving continues;
//     no request kind set          EMPTY_REQUEST; serving continues;
//     frame bytes not a Request    MALFORMED_REQUEST (id ""); serving continues;
//     a JSON line not a Request    INVALID_JSON (the id when the line is a JSON object
//                                  with a string "id", else ""); serving continues;
//     a failure on a valid request INTERNAL; serving continues;
//     a request past its deadline  DEADLINE_EXCEEDED (ServeOptions::request_timeout_seconds,
//                                  checked between a simulation's events); serving
//                                  continues;
//     a length prefix above the cap, a malformed prefix, the stream ending inside
//     a frame, a JSON line above the cap
//                                  BAD_FRAME (id ""), then Serve() returns kBadFrame:
//                                  the rest of the stream cannot be trusted.
//
// Example
//   google::protobuf::io::ArrayInputStream input(bytes.data(), bytes.size());
//   StringReplySink output;
//   ServeOptions options;
//   options.threads = 2;
//   ServeOutcome outcome = Serve(options, input, output);  // output.bytes(): the replies
//
//   v1::Request request;
//   request.set_id("a");
//   request.mutable_ping();
//   v1::Reply reply = wire::Solve(request);  // reply.pong().version() == "0.1.0"
//
// Thread-safety: everything but RequestReader and Serve() is pure and safe to call
// concurrently. A RequestReader reads its stream from one thread at a time. Serve()
// logs (spdlog, which the program sends to stderr) and uses its own task arena; asked
// for more threads than the hardware has, it raises oneTBB's process-wide
// max_allowed_parallelism while it runs.

#ifndef RLSCHED_APP_SERVE_H_
#define RLSCHED_APP_SERVE_H_

#include <google/protobuf/io/zero_copy_stream.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include "rlsched/v1/service.pb.h"
#include "rlsched/wire/solve.h"

namespace rlsched::app {

// How requests and replies are framed.
enum class WireFormat {
  kDelimited,  // varint size, then the message's bytes
  kJson,       // one JSON object per line
};

// The deepest nesting of objects and arrays a JSON line may have (a Request nests
// fewer than 10 levels); a deeper line is INVALID_JSON after one linear scan.
inline constexpr int kMaxJsonDepth = 64;

// The default cap on one frame (the varint size, or a JSON line without its '\n').
inline constexpr std::int64_t kDefaultMaxMessageBytes = std::int64_t{64} << 20;
// The largest cap: protobuf's limit on one message (2 GiB - 1).
inline constexpr std::int64_t kMaxMessageBytesLimit = std::numeric_limits<std::int32_t>::max();

// A frame's bytes decoded: `request`, or the `error` reply to send instead.
struct DecodedRequest {
  v1::Request request;
  std::optional<v1::Reply> error;  // MALFORMED_REQUEST or INVALID_JSON
};

// Parses one frame's payload (a serialized Request, or one JSON line) in `format`.
// A payload that is not a Request gives error = MALFORMED_REQUEST (kDelimited, id "")
// or INVALID_JSON (kJson; the id when the line is a JSON object with a string "id").
// Pure; O(payload size).
DecodedRequest DecodeRequest(std::string_view payload, WireFormat format);

// `reply` framed in `format`: varint size + bytes, or one JSON line ending in '\n'.
// Throws std::runtime_error if protobuf refuses to print the JSON. Pure.
std::string EncodeReply(const v1::Reply& reply, WireFormat format);

// The answer to one frame, and what the daemon logs about it.
struct Answer {
  std::string frame;                                       // the reply, framed by EncodeReply()
  std::string id;                                          // the reply's id
  v1::Request::KindCase kind = v1::Request::KIND_NOT_SET;  // of the request, when decoded
  v1::ErrorCode error_code = v1::ERROR_CODE_UNSPECIFIED;   // UNSPECIFIED: not an error
};

// DecodeRequest(), Solve() (unless decoding failed; with `should_stop`) and
// EncodeReply(): the framed reply to one payload. An encoding failure gives an INTERNAL
// reply. Throws only std::bad_alloc. Deterministic unless `should_stop` stops it.
Answer AnswerPayload(std::string_view payload, WireFormat format,
                     const std::function<bool()>& should_stop = {});

// Splits a byte stream into frames. Memory: O(max_message_bytes) at most, allocated
// only as bytes arrive — a hostile size prefix allocates nothing.
class RequestReader {
 public:
  // What Next() found.
  struct Frame {
    enum class Kind {
      kPayload,   // `payload` holds one frame (for kJson: one non-blank line)
      kEnd,       // the stream ended cleanly, at a frame boundary
      kBadFrame,  // the stream cannot be read further; `error` says why
    };
    Kind kind = Kind::kEnd;
    std::string payload;
    std::string error;
  };

  // Reads `input` (not owned; it must outlive the reader). Precondition:
  // 1 <= max_message_bytes <= kMaxMessageBytesLimit.
  RequestReader(google::protobuf::io::ZeroCopyInputStream& input, WireFormat format,
                std::int64_t max_message_bytes);

  // The next frame. kDelimited: a varint size (at most 10 bytes) and that many bytes;
  // kBadFrame for a size above max_message_bytes (checked before any allocation), a
  // malformed size, or the stream ending inside a frame. kJson: the next line that is
  // not blank (a last line without '\n' counts); kBadFrame for a line longer than
  // max_message_bytes. After kEnd or kBadFrame, returns the same again. Blocks while
  // the stream does; a stream that fails reads as one that ends.
  Frame Next();

  // Frames returned so far (kPayload only).
  std::int64_t frames() const { return frames_; }

 private:
  bool Fill();  // makes data available in the chunk; false at the end of the stream
  Frame NextDelimited();
  Frame NextLine();
  Frame Fail(std::string error);

  google::protobuf::io::ZeroCopyInputStream& input_;
  WireFormat format_;
  std::int64_t max_message_bytes_;
  const char* chunk_ = nullptr;  // unread bytes of the stream's current buffer
  std::int64_t chunk_size_ = 0;
  bool ended_ = false;
  std::optional<Frame> final_;  // the kEnd or kBadFrame returned, repeated
  std::int64_t frames_ = 0;
  std::int64_t lines_ = 0;  // kJson: the lines read, blank ones included
};

// Where Serve() writes framed replies.
class ReplySink {
 public:
  virtual ~ReplySink() = default;
  // Writes all of `bytes` and flushes them; false if that failed (the peer closed
  // the stream). Called from one thread at a time.
  virtual bool Write(std::string_view bytes) = 0;
};

// A ReplySink into a string, for tests.
class StringReplySink : public ReplySink {
 public:
  bool Write(std::string_view bytes) override {
    bytes_.append(bytes);
    return true;
  }
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

// A request's deadline: 60 s from the start of its solve by default; at most a day.
inline constexpr double kDefaultRequestTimeoutSeconds = 60;
inline constexpr double kMaxRequestTimeoutSeconds = 86400;

struct ServeOptions {
  WireFormat format = WireFormat::kDelimited;
  // Seconds a request may run (from the start of its solve) before it is stopped with
  // a DEADLINE_EXCEEDED reply, in [0, kMaxRequestTimeoutSeconds]; 0: no limit.
  double request_timeout_seconds = kDefaultRequestTimeoutSeconds;
  int threads = 0;  // worker threads, >= 1; 0: the hardware's concurrency
  std::int64_t max_message_bytes = kDefaultMaxMessageBytes;  // in [1, kMaxMessageBytesLimit]
};

// Why Serve() returned.
enum class ServeOutcome {
  kEndOfInput,     // every request answered; the input ended
  kBadFrame,       // a BAD_FRAME reply was written and serving stopped
  kOutputFailed,   // a write failed; replies after it were dropped
  kInternalError,  // out of memory reading a frame or writing a reply; serving stopped
};

// Answers every request of `input` on `output` (see the file comment) until the input
// ends, a frame is bad or a write fails. Throws std::invalid_argument for options out
// of bounds. No exception escapes a pipeline stage: in the solve stage each becomes an
// INTERNAL reply; in the read and write stages (out of memory) a kInternalError stop.
// Replies are written in request order, one Write() each.
ServeOutcome Serve(const ServeOptions& options, google::protobuf::io::ZeroCopyInputStream& input,
                   ReplySink& output);

}  // namespace rlsched::app

#endif  // RLSCHED_APP_SERVE_H_
