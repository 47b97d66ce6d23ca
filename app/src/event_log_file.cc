// event_log_file.cc — see event_log_file.h.

#include "event_log_file.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <utility>
#include <variant>

#include "rlsched/wire/orchestrator_convert.h"

namespace rlsched::app {
namespace {

[[noreturn]] void Failed(const std::string& path, const char* what) {
  throw std::runtime_error("--event-log " + path + ": " + what + ": " + std::strerror(errno));
}

}  // namespace

EventLogFile::EventLogFile(std::string path, int fd, bool fsync)
    : path_(std::move(path)), fd_(fd), fsync_(fsync) {}

EventLogFile::EventLogFile(EventLogFile&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)),
      fsync_(other.fsync_),
      pending_(std::move(other.pending_)) {}

EventLogFile EventLogFile::Create(const std::string& path, const std::string& header, bool fsync) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) Failed(path, "cannot create");
  EventLogFile file(path, fd, fsync);
  file.pending_ = header;
  file.Flush();
  return file;
}

EventLogFile EventLogFile::Continue(const std::string& path, std::int64_t whole_bytes, bool fsync) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) Failed(path, "cannot open");
  EventLogFile file(path, fd, fsync);
  if (::ftruncate(fd, whole_bytes) != 0) Failed(path, "cannot cut off its torn record");
  if (::lseek(fd, 0, SEEK_END) < 0) Failed(path, "cannot seek to its end");
  return file;
}

EventLogFile::~EventLogFile() {
  if (fd_ < 0) return;
  try {
    Flush();
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
  }
  ::close(fd_);
}

void EventLogFile::Append(const scheduler::Event& event,
                          std::span<const scheduler::Command> commands) {
  wire::AppendEventRecords(event, commands, pending_);
  // Per-sample reports that caused nothing may wait; the rest (prompts, membership,
  // weights, steps) are rare and written at once.
  const bool sample_report = std::holds_alternative<scheduler::GenerationFinished>(event) ||
                             std::holds_alternative<scheduler::GenerationProgressed>(event);
  if (!commands.empty() || !sample_report) Flush();
}

void EventLogFile::Flush() {
  std::size_t written = 0;
  while (written < pending_.size()) {
    const ssize_t n = ::write(fd_, pending_.data() + written, pending_.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      pending_.erase(0, written);  // what went is not written again
      Failed(path_, "write failed");
    }
    written += static_cast<std::size_t>(n);
  }
  pending_.clear();
  if (fsync_ && ::fdatasync(fd_) != 0) Failed(path_, "fdatasync failed");
}

}  // namespace rlsched::app
