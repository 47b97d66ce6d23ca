#include "serve_command.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/stubs/logging.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string_view>

#include "command_common.h"
#include "rlsched/common/error.h"

namespace rlsched::app {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitBadFrame = 2;
constexpr int kReadBlockBytes = 1 << 16;
constexpr std::string_view kDelimitedFormat = "delimited";
constexpr std::string_view kJsonFormat = "json";

// Reads a file descriptor. While it waits for input it also watches `watched_output`
// (a pipe's or socket's write end reports POLLERR/POLLHUP once its reader is gone), so
// that a daemon whose output is closed stops instead of waiting for input forever.
class FdInput : public google::protobuf::io::CopyingInputStream {
 public:
  FdInput(int fd, int watched_output) : fd_(fd), watched_output_(watched_output) {}

  int Read(void* buffer, int size) override {
    while (true) {
      pollfd fds[2] = {{fd_, POLLIN, 0}, {watched_output_, 0, 0}};
      if (::poll(fds, 2, -1) < 0) {
        if (errno == EINTR) continue;
        return Failed(fmt::format("poll: {}", std::strerror(errno)));
      }
      if ((fds[1].revents & (POLLERR | POLLHUP | POLLNVAL)) != 0) {
        output_closed_ = true;
        return Failed("the output is closed");
      }
      if (fds[0].revents == 0) continue;
      const ssize_t n = ::read(fd_, buffer, static_cast<std::size_t>(size));
      if (n >= 0) return static_cast<int>(n);
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return Failed(fmt::format("read: {}", std::strerror(errno)));
    }
  }

  // Why reading stopped early; empty when the input ended (or has not).
  const std::string& error() const { return error_; }
  bool output_closed() const { return output_closed_; }

 private:
  int Failed(std::string error) {
    error_ = std::move(error);
    return -1;
  }

  int fd_;
  int watched_output_;
  std::string error_;
  bool output_closed_ = false;
};

// Writes replies to a file descriptor; write(2) flushes them.
class FdSink : public ReplySink {
 public:
  explicit FdSink(int fd) : fd_(fd) {}

  bool Write(std::string_view bytes) override {
    while (!bytes.empty()) {
      const ssize_t n = ::write(fd_, bytes.data(), bytes.size());
      if (n >= 0) {
        bytes.remove_prefix(static_cast<std::size_t>(n));
        continue;
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {  // a non-blocking output: wait
        pollfd fd = {fd_, POLLOUT, 0};
        ::poll(&fd, 1, -1);
        continue;
      }
      spdlog::error("write: {}", std::strerror(errno));
      return false;
    }
    return true;
  }

 private:
  int fd_;
};

// A file descriptor opened for the daemon, closed on exit; or a standard stream.
class OpenedFd {
 public:
  OpenedFd(const std::string& path, int standard_fd, int flags, std::string_view option)
      : fd_(standard_fd) {
    if (path == "-") return;
    fd_ = ::open(path.c_str(), flags | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      Fail(option, fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
    }
    owned_ = true;
  }
  OpenedFd(const OpenedFd&) = delete;
  OpenedFd& operator=(const OpenedFd&) = delete;
  ~OpenedFd() {
    if (owned_) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
  bool owned_ = false;
};

// Protobuf's own messages (e.g. invalid UTF-8 in a string field) go to spdlog.
void LogProtobufMessage(google::protobuf::LogLevel level, const char* filename, int line,
                        const std::string& message) {
  const spdlog::level::level_enum spd_level =
      level >= google::protobuf::LOGLEVEL_ERROR     ? spdlog::level::warn
      : level == google::protobuf::LOGLEVEL_WARNING ? spdlog::level::info
                                                    : spdlog::level::debug;
  spdlog::log(spd_level, "protobuf {}:{}: {}", filename, line, message);
}

}  // namespace

namespace {

// The request kinds the daemon answers, from the Request message's oneof.
std::string RequestKinds() {
  const google::protobuf::OneofDescriptor* kind =
      v1::Request::descriptor()->FindOneofByName("kind");
  std::string kinds;
  for (int i = 0; i < kind->field_count(); ++i) {
    kinds += (i == 0 ? "" : ", ") + kind->field(i)->name();
  }
  return kinds;
}

}  // namespace

CLI::App* AddServeCommand(CLI::App& app, ServeArgs& args) {
  CLI::App* command = app.add_subcommand(
      "serve", fmt::format("Run the daemon ({}): read rlsched.v1.Request messages, write one "
                           "rlsched.v1.Reply per request, in request order",
                           RequestKinds()));
  command->fallthrough();
  command->footer(
      "Wire format: each message preceded by its size as a varint (protobuf's delimited format), "
      "or with --format=json one JSON object per line in protobuf's JSON mapping.\n"
      "A bad request gets an error reply naming the field and serving goes on. A bad frame (a "
      "size above --max-message-bytes, a malformed size, a stream ending inside a frame) gets a "
      "BAD_FRAME reply with id \"\" and exit status 2. A request still running after "
      "--request-timeout gets a DEADLINE_EXCEEDED reply and serving goes on. EOF: exit status 0 "
      "once every reply is written. A closed output: exit status 1. Logs go to stderr.");
  const ServeArgs defaults;
  command
      ->add_option("--input", args.input,
                   "Read requests from PATH (a file or a named pipe; '-': stdin) (default: -)")
      ->type_name("PATH");
  command
      ->add_option("--output", args.output,
                   "Write replies to PATH (a file or a named pipe; '-': stdout) (default: -)")
      ->type_name("PATH");
  command
      ->add_option("--format", args.format,
                   fmt::format("delimited: varint length-delimited protobuf; json: one JSON object "
                               "per line (default: {})",
                               defaults.format))
      ->type_name("delimited|json")
      ->check(
          CLI::IsMember({std::string(kDelimitedFormat), std::string(kJsonFormat)}).description(""));
  AddBoundedOption(*command, "--threads", args.threads, "Worker threads solving requests.",
                   IntegerRange{1, 1024}, "the hardware's concurrency")
      ->type_name("N");
  AddBoundedOption(*command, "--max-message-bytes", args.max_message_bytes,
                   fmt::format("Largest accepted request frame, in bytes (a JSON line without its "
                               "newline; {} = 64 MiB).",
                               kDefaultMaxMessageBytes),
                   IntegerRange{1, kMaxMessageBytesLimit},
                   fmt::format("{}", defaults.max_message_bytes))
      ->type_name("BYTES");
  AddBoundedOption(*command, "--request-timeout", args.request_timeout_seconds,
                   "Seconds a request may run before it is stopped with a "
                   "DEADLINE_EXCEEDED reply; 0: no limit. Checked between a "
                   "simulation's events; the other requests are bounded by their size "
                   "limits.",
                   RealRange{0.0, kMaxRequestTimeoutSeconds},
                   fmt::format("{:g}", defaults.request_timeout_seconds))
      ->type_name("SECONDS");
  return command;
}

int RunServeCommand(const ServeArgs& args) {
  ::signal(SIGPIPE, SIG_IGN);  // a closed output shows as EPIPE from write()
  google::protobuf::SetLogHandler(&LogProtobufMessage);

  ServeOptions options;
  if (args.format != kDelimitedFormat && args.format != kJsonFormat) {
    Fail("--format", fmt::format("must be delimited or json, got '{}'", args.format));
  }
  options.format = args.format == kJsonFormat ? WireFormat::kJson : WireFormat::kDelimited;
  options.threads = static_cast<int>(args.threads.value_or(0));
  options.max_message_bytes = args.max_message_bytes;
  options.request_timeout_seconds = args.request_timeout_seconds;

  const OpenedFd input_fd(args.input, STDIN_FILENO, O_RDONLY, "--input");
  const OpenedFd output_fd(args.output, STDOUT_FILENO, O_WRONLY | O_CREAT | O_TRUNC, "--output");
  FdInput reader(input_fd.get(), output_fd.get());
  google::protobuf::io::CopyingInputStreamAdaptor input(&reader, kReadBlockBytes);
  FdSink output(output_fd.get());

  const ServeOutcome outcome = Serve(options, input, output);
  switch (outcome) {
    case ServeOutcome::kEndOfInput:
      if (!reader.error().empty()) {
        if (reader.output_closed()) {
          spdlog::error("stopping: the output is closed");
        } else {
          spdlog::error("stopping: cannot read the input: {}", reader.error());
        }
        return kExitFailure;
      }
      return kExitOk;
    case ServeOutcome::kBadFrame:
      return kExitBadFrame;
    case ServeOutcome::kOutputFailed:
    case ServeOutcome::kInternalError:
      return kExitFailure;
  }
  return kExitFailure;
}

}  // namespace rlsched::app
