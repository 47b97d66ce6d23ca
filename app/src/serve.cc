#include "serve.h"

#include <fmt/format.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/util/json_util.h>
#include <spdlog/spdlog.h>
#include <tbb/global_control.h>
#include <tbb/info.h>
#include <tbb/parallel_pipeline.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <exception>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <utility>

#include "rlsched/common/check.h"
#include "rlsched/common/error.h"
#include "rlsched/wire/json.h"
#include "rlsched/wire/solve.h"

namespace rlsched::app {

using namespace ::rlsched::wire;  // NOLINT: the conversions the commands call

using wire::ErrorReply;
using wire::RequestKindName;
using wire::Solve;
using wire::ToJson;
namespace {

using Frame = RequestReader::Frame;

constexpr int kMaxVarintBytes = 10;
constexpr int kMaxThreads = 1024;

bool IsBlank(std::string_view line) {
  return line.find_first_not_of(" \t\r\f\v") == std::string_view::npos;
}

// What one SAX pass over a JSON line finds: the top-level string "id" of a JSON object
// ("" when the line is not JSON; for a line nested too deep, the id seen before the
// limit), and whether the line nests deeper than kMaxJsonDepth. It stops at the first error or at
// the depth limit, so it takes O(line) time and O(kMaxJsonDepth) memory whatever the line.
class JsonScan : public nlohmann::json_sax<nlohmann::json> {
 public:
  std::string id;
  bool too_deep = false;

  bool null() override { return Value(); }
  bool boolean(bool) override { return Value(); }
  bool number_integer(number_integer_t) override { return Value(); }
  bool number_unsigned(number_unsigned_t) override { return Value(); }
  bool number_float(number_float_t, const string_t&) override { return Value(); }
  bool string(string_t& value) override {
    if (depth_ == 1 && key_is_id_) id = value;
    return Value();
  }
  bool binary(binary_t&) override { return Value(); }
  bool start_object(std::size_t) override { return Open(); }
  bool key(string_t& key) override {
    key_is_id_ = depth_ == 1 && key == "id";
    return true;
  }
  bool end_object() override { return Close(); }
  bool start_array(std::size_t) override { return Open(); }
  bool end_array() override { return Close(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    id.clear();  // not JSON: no id
    return false;
  }

 private:
  bool Value() {
    key_is_id_ = false;
    return true;
  }
  bool Open() {
    key_is_id_ = false;
    if (++depth_ > kMaxJsonDepth) {
      too_deep = true;
      return false;
    }
    return true;
  }
  bool Close() {
    --depth_;
    return true;
  }
  int depth_ = 0;
  bool key_is_id_ = false;
};

JsonScan ScanJson(std::string_view json) {
  JsonScan scan;
  nlohmann::json::sax_parse(json.begin(), json.end(), &scan, nlohmann::json::input_format_t::json,
                            /*strict=*/true);
  return scan;
}

// One request on its way through the pipeline.
struct Job {
  std::int64_t sequence = 0;  // 0-based position in the stream
  std::string payload;
  Answer answer;
  std::optional<ServeOutcome> stop;  // serving stops after this job's reply
  double solve_ms = 0.0;
};

std::string_view DescribeOutcome(ServeOutcome outcome) {
  switch (outcome) {
    case ServeOutcome::kEndOfInput:
      return "end of input";
    case ServeOutcome::kBadFrame:
      return "stopped at a bad frame";
    case ServeOutcome::kOutputFailed:
      return "stopped: the output failed";
    case ServeOutcome::kInternalError:
      return "stopped: out of memory";
  }
  return "?";
}

// The INTERNAL reply framed, or "" if even that fails (out of memory).
std::string InternalErrorFrame(std::string_view what, WireFormat format) {
  try {
    return EncodeReply(ErrorReply("", v1::ERROR_CODE_INTERNAL, what), format);
  } catch (...) {
    return std::string();
  }
}

}  // namespace

DecodedRequest DecodeRequest(std::string_view payload, WireFormat format) {
  DecodedRequest decoded;
  if (format == WireFormat::kDelimited) {
    // The reader caps a frame at kMaxMessageBytesLimit, which fits an int.
    if (payload.size() > static_cast<std::size_t>(kMaxMessageBytesLimit) ||
        !decoded.request.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
      decoded.request.Clear();
      decoded.error =
          ErrorReply("", v1::ERROR_CODE_MALFORMED_REQUEST,
                     fmt::format("a frame of {} bytes does not parse as a rlsched.v1.Request",
                                 payload.size()));
    }
    return decoded;
  }
  // One linear pass first: protobuf's parser takes time and stack that grow faster
  // than the line with nesting, and a request nests a few levels only.
  const JsonScan scan = ScanJson(payload);
  if (scan.too_deep) {
    decoded.error = ErrorReply(
        scan.id, v1::ERROR_CODE_INVALID_JSON,
        fmt::format("not a JSON rlsched.v1.Request: nested deeper than {} levels", kMaxJsonDepth));
    return decoded;
  }
  const auto status = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(payload.data(), payload.size()), &decoded.request);
  if (!status.ok()) {
    decoded.request.Clear();
    decoded.error =
        ErrorReply(scan.id, v1::ERROR_CODE_INVALID_JSON,
                   fmt::format("not a JSON rlsched.v1.Request: {}", std::string(status.message())));
  }
  return decoded;
}

std::string EncodeReply(const v1::Reply& reply, WireFormat format) {
  if (format == WireFormat::kJson) return ToJson(reply) + '\n';
  using google::protobuf::io::CodedOutputStream;
  const std::size_t size = reply.ByteSizeLong();
  if (size > static_cast<std::size_t>(kMaxMessageBytesLimit)) {
    throw std::runtime_error(fmt::format("the reply has {} bytes, above protobuf's limit", size));
  }
  const auto size32 = static_cast<std::uint32_t>(size);
  std::string frame(CodedOutputStream::VarintSize32(size32) + size, '\0');
  auto* out = reinterpret_cast<std::uint8_t*>(frame.data());
  out = CodedOutputStream::WriteVarint32ToArray(size32, out);
  reply.SerializeWithCachedSizesToArray(out);
  return frame;
}

Answer AnswerPayload(std::string_view payload, WireFormat format,
                     const std::function<bool()>& should_stop) {
  DecodedRequest decoded = DecodeRequest(payload, format);
  const v1::Reply reply =
      decoded.error ? std::move(*decoded.error) : Solve(decoded.request, should_stop);
  Answer answer;
  answer.id = reply.id();
  answer.kind = decoded.request.kind_case();
  answer.error_code = reply.has_error() ? reply.error().code() : v1::ERROR_CODE_UNSPECIFIED;
  try {
    answer.frame = EncodeReply(reply, format);
  } catch (const std::bad_alloc&) {
    throw;
  } catch (const std::exception& e) {
    answer.error_code = v1::ERROR_CODE_INTERNAL;
    answer.frame = EncodeReply(
        ErrorReply(reply.id(), v1::ERROR_CODE_INTERNAL,
                   fmt::format("internal error: cannot encode the reply: {}", e.what())),
        format);
  }
  return answer;
}

RequestReader::RequestReader(google::protobuf::io::ZeroCopyInputStream& input, WireFormat format,
                             std::int64_t max_message_bytes)
    : input_(input), format_(format), max_message_bytes_(max_message_bytes) {}

bool RequestReader::Fill() {
  while (chunk_size_ == 0) {
    if (ended_) return false;
    const void* data = nullptr;
    int size = 0;
    if (!input_.Next(&data, &size)) {
      ended_ = true;
      return false;
    }
    chunk_ = static_cast<const char*>(data);
    chunk_size_ = size;
  }
  return true;
}

RequestReader::Frame RequestReader::Fail(std::string error) {
  Frame frame;
  frame.kind = Frame::Kind::kBadFrame;
  frame.error = std::move(error);
  final_ = frame;
  return frame;
}

RequestReader::Frame RequestReader::Next() {
  if (final_) return *final_;
  return format_ == WireFormat::kDelimited ? NextDelimited() : NextLine();
}

RequestReader::Frame RequestReader::NextDelimited() {
  // The size: base-128 varint, least significant group first, at most 64 bits.
  std::uint64_t size = 0;
  for (int i = 0;; ++i) {
    if (!Fill()) {
      if (i == 0) {
        final_ = Frame{};
        return *final_;
      }
      return Fail(fmt::format("the stream ends inside a length prefix, after frame {}", frames_));
    }
    const auto byte = static_cast<unsigned char>(*chunk_);
    ++chunk_;
    --chunk_size_;
    if (i == kMaxVarintBytes - 1 && byte > 1) {
      return Fail(
          fmt::format("malformed length prefix after frame {}: more than 64 bits", frames_));
    }
    size |= static_cast<std::uint64_t>(byte & 0x7f) << (7 * i);
    if ((byte & 0x80) == 0) break;
  }
  if (size > static_cast<std::uint64_t>(max_message_bytes_)) {
    return Fail(fmt::format("length prefix of {} bytes after frame {} exceeds the cap of {} bytes",
                            size, frames_, max_message_bytes_));
  }
  Frame frame;
  frame.kind = Frame::Kind::kPayload;
  while (frame.payload.size() < size) {
    if (!Fill()) {
      return Fail(fmt::format("the stream ends inside frame {}: {} of {} bytes", frames_ + 1,
                              frame.payload.size(), size));
    }
    const std::int64_t take =
        std::min<std::int64_t>(chunk_size_, static_cast<std::int64_t>(size - frame.payload.size()));
    frame.payload.append(chunk_, static_cast<std::size_t>(take));
    chunk_ += take;
    chunk_size_ -= take;
  }
  ++frames_;
  return frame;
}

RequestReader::Frame RequestReader::NextLine() {
  Frame frame;
  frame.kind = Frame::Kind::kPayload;
  std::string& line = frame.payload;
  while (true) {
    if (!Fill()) {
      if (IsBlank(line)) {
        final_ = Frame{};
        return *final_;
      }
      break;  // a last line without '\n'
    }
    const void* newline = std::memchr(chunk_, '\n', static_cast<std::size_t>(chunk_size_));
    const std::int64_t take =
        newline == nullptr ? chunk_size_ : static_cast<const char*>(newline) - chunk_;
    if (static_cast<std::int64_t>(line.size()) + take > max_message_bytes_) {
      return Fail(
          fmt::format("line {} exceeds the cap of {} bytes", lines_ + 1, max_message_bytes_));
    }
    line.append(chunk_, static_cast<std::size_t>(take));
    chunk_ += take;
    chunk_size_ -= take;
    if (newline == nullptr) continue;
    ++chunk_;  // the '\n'
    --chunk_size_;
    ++lines_;
    if (!IsBlank(line)) break;
    line.clear();
  }
  ++frames_;
  return frame;
}

namespace {

void CheckServeOptions(const ServeOptions& options) {
  CheckInRange("threads", options.threads, 0, kMaxThreads);
  CheckRealInRange("request_timeout_seconds", options.request_timeout_seconds, 0, End::kClosed,
                   kMaxRequestTimeoutSeconds, End::kClosed);
  CheckInRange("max_message_bytes", options.max_message_bytes, 1, kMaxMessageBytesLimit);
}

// One serving of a stream: the pipeline's three stages and what they share. Read and
// Write are serial (oneTBB runs each in order, one call at a time); Solve runs in
// parallel and reads only `stopping_`.
class ServeSession {
 public:
  ServeSession(const ServeOptions& options, google::protobuf::io::ZeroCopyInputStream& input,
               ReplySink& output)
      : options_(options),
        format_(options.format),
        reader_(input, options.format, options.max_message_bytes),
        output_(output) {}

  // Serial, in order: the next frame, or the end. A bad frame becomes the last job.
  Job* Read(tbb::flow_control& control) {
    if (input_done_ || stopping_.load(std::memory_order_acquire)) {
      control.stop();
      return nullptr;
    }
    try {
      auto job = std::make_unique<Job>();
      job->sequence = sequence_++;
      if (TakeFrame(*job, reader_.Next())) return job.release();
      control.stop();
      return nullptr;
    } catch (const std::exception& e) {  // out of memory for a frame
      spdlog::error("cannot read request {}: {}; stopping", sequence_ - 1, e.what());
    } catch (...) {
      spdlog::error("cannot read request {}; stopping", sequence_ - 1);
    }
    read_failed_ = true;
    input_done_ = true;
    control.stop();
    return nullptr;
  }

  // Parallel: decode, solve, encode. Skipped once serving stops.
  Job* Solve(Job* job) const {
    if (job->stop || stopping_.load(std::memory_order_acquire)) return job;
    const auto solve_start = std::chrono::steady_clock::now();
    std::function<bool()> should_stop;
    if (options_.request_timeout_seconds > 0) {
      const auto deadline =
          solve_start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(options_.request_timeout_seconds));
      should_stop = [deadline] { return std::chrono::steady_clock::now() >= deadline; };
    }
    try {
      job->answer = AnswerPayload(job->payload, format_, should_stop);
    } catch (...) {  // std::bad_alloc: even the error reply failed
      job->answer.error_code = v1::ERROR_CODE_INTERNAL;
      job->answer.frame = InternalErrorFrame("internal error: out of memory", format_);
    }
    job->payload = std::string();
    job->solve_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - solve_start)
            .count();
    return job;
  }

  // Serial, in order: write and flush the reply.
  void Write(Job* raw) {
    const std::unique_ptr<Job> job(raw);
    if (outcome_ != ServeOutcome::kEndOfInput) return;  // stopped: drop the rest
    try {
      const Answer& answer = job->answer;
      if (answer.frame.empty()) {  // out of memory even for an error reply
        spdlog::error("cannot answer request {}: out of memory; stopping", job->sequence);
        return Stop(ServeOutcome::kInternalError);
      }
      if (!output_.Write(answer.frame)) {
        spdlog::error("cannot write the reply to request {}: the output is closed; stopping",
                      job->sequence);
        return Stop(ServeOutcome::kOutputFailed);
      }
      Count(*job);
      if (job->stop) Stop(*job->stop);
    } catch (...) {  // out of memory in the sink
      spdlog::error("cannot write the reply to request {}; stopping", job->sequence);
      Stop(ServeOutcome::kInternalError);
    }
  }

  // After the pipeline: how serving ended, logged with the counts.
  ServeOutcome Finish(std::chrono::steady_clock::time_point start) {
    if (read_failed_ && outcome_ == ServeOutcome::kEndOfInput) {
      outcome_ = ServeOutcome::kInternalError;
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    spdlog::info("served {} request{} ({} error{}) in {:.3f} s; {}", replies_,
                 replies_ == 1 ? "" : "s", errors_, errors_ == 1 ? "" : "s", seconds,
                 DescribeOutcome(outcome_));
    return outcome_;
  }

 private:
  // Fills `job` from `frame`; false at the end of the input.
  bool TakeFrame(Job& job, Frame frame) {
    switch (frame.kind) {
      case Frame::Kind::kPayload:
        job.payload = std::move(frame.payload);
        return true;
      case Frame::Kind::kEnd:
        input_done_ = true;
        return false;
      case Frame::Kind::kBadFrame:
        spdlog::error("bad frame: {}; replying BAD_FRAME and stopping", frame.error);
        job.answer.error_code = v1::ERROR_CODE_BAD_FRAME;
        job.answer.frame =
            EncodeReply(ErrorReply("", v1::ERROR_CODE_BAD_FRAME, frame.error), format_);
        job.stop = ServeOutcome::kBadFrame;
        input_done_ = true;
        return true;
    }
    return false;
  }

  void Count(const Job& job) {
    const Answer& answer = job.answer;
    ++replies_;
    if (answer.error_code != v1::ERROR_CODE_UNSPECIFIED) ++errors_;
    spdlog::debug("request {} (id '{}', {}): {} in {:.3f} ms", job.sequence, answer.id,
                  RequestKindName(answer.kind),
                  answer.error_code == v1::ERROR_CODE_UNSPECIFIED
                      ? std::string_view("ok")
                      : std::string_view(v1::ErrorCode_Name(answer.error_code)),
                  job.solve_ms);
  }

  void Stop(ServeOutcome outcome) {
    outcome_ = outcome;
    stopping_.store(true, std::memory_order_release);
  }

  const ServeOptions& options_;
  const WireFormat format_;
  RequestReader reader_;
  ReplySink& output_;
  // Read by the input stage, set by the output stage (the two may run concurrently).
  std::atomic<bool> stopping_{false};
  bool input_done_ = false;                           // the input stage's own
  bool read_failed_ = false;                          // the input stage's own
  std::int64_t sequence_ = 0;                         // the input stage's own
  ServeOutcome outcome_ = ServeOutcome::kEndOfInput;  // the output stage's own
  std::int64_t replies_ = 0;                          // the output stage's own
  std::int64_t errors_ = 0;                           // the output stage's own
};

}  // namespace

ServeOutcome Serve(const ServeOptions& options, google::protobuf::io::ZeroCopyInputStream& input,
                   ReplySink& output) {
  CheckServeOptions(options);
  const int threads = options.threads > 0 ? options.threads : tbb::info::default_concurrency();
  const auto tokens = static_cast<std::size_t>(2 * threads);
  spdlog::info("serving {} on {} thread{}, at most {} requests in flight, frames up to {} bytes",
               options.format == WireFormat::kJson ? "JSON lines" : "length-delimited protobuf",
               threads, threads == 1 ? "" : "s", tokens, options.max_message_bytes);
  ServeSession session(options, input, output);
  const auto start = std::chrono::steady_clock::now();
  // More threads than the hardware has: raise oneTBB's process-wide cap while serving.
  std::optional<tbb::global_control> parallelism;
  if (threads > tbb::info::default_concurrency()) {
    parallelism.emplace(tbb::global_control::max_allowed_parallelism,
                        static_cast<std::size_t>(threads));
  }
  tbb::task_arena arena(threads);
  arena.execute([&] {
    tbb::parallel_pipeline(
        tokens,
        tbb::make_filter<void, Job*>(
            tbb::filter_mode::serial_in_order,
            [&session](tbb::flow_control& control) { return session.Read(control); }) &
            tbb::make_filter<Job*, Job*>(tbb::filter_mode::parallel,
                                         [&session](Job* job) { return session.Solve(job); }) &
            tbb::make_filter<Job*, void>(tbb::filter_mode::serial_in_order,
                                         [&session](Job* job) { session.Write(job); }));
  });
  return session.Finish(start);
}

}  // namespace rlsched::app
