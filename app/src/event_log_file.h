// event_log_file.h — a live run's event log on disk (`rlsched run --event-log FILE`).
//
// Overview
//   The records (wire::EventLogHeader, wire::AppendEventRecords) go to the file with
//   write(2): each event with the commands it caused in one call, made in the runtime's
//   core node before those commands leave it (scheduler::RuntimeOptions::journal), so a
//   scheduler killed at any moment leaves a log holding every command a worker may have
//   seen. A sample's progress or finish that caused no command waits in memory for the
//   next write (nothing has left for it yet; if the scheduler dies first, the engine's
//   reattach accounts for it); every other event is written at once. With `fsync`, each write is
//   also synced to the disk (against a power loss, not only the process's death; it costs a disk
//   flush per event). A resumed run (`--resume`) opens the log it continues: a record its writer
//   was cut in the middle of is cut off first, then the records are appended.
//
// Thread-safety: not thread-safe; the runtime calls Append from its core node only.

#ifndef RLSCHED_APP_EVENT_LOG_FILE_H_
#define RLSCHED_APP_EVENT_LOG_FILE_H_

#include <cstdint>
#include <span>
#include <string>

#include "rlsched/scheduler/orchestrator.h"

namespace rlsched::app {

class EventLogFile {
 public:
  // Creates (truncating) `path` and writes `header` (wire::EventLogHeader). Throws
  // std::runtime_error naming the file when it cannot.
  static EventLogFile Create(const std::string& path, const std::string& header, bool fsync);
  // Opens `path` to append after its first `whole_bytes` (a torn record after them is
  // cut off). Throws std::runtime_error naming the file when it cannot.
  static EventLogFile Continue(const std::string& path, std::int64_t whole_bytes, bool fsync);

  EventLogFile(EventLogFile&& other) noexcept;
  EventLogFile& operator=(EventLogFile&&) = delete;
  EventLogFile(const EventLogFile&) = delete;
  ~EventLogFile();  // writes what waits (errors logged)

  // The event's records and its commands'; written at once when it caused commands.
  void Append(const scheduler::Event& event, std::span<const scheduler::Command> commands);
  // Writes what waits. Throws std::runtime_error on a failed write.
  void Flush();

 private:
  EventLogFile(std::string path, int fd, bool fsync);
  std::string path_;
  int fd_ = -1;
  bool fsync_ = false;
  std::string pending_;
};

}  // namespace rlsched::app

#endif  // RLSCHED_APP_EVENT_LOG_FILE_H_
