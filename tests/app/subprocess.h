// subprocess.h — runs the built `rlsched` program over pipes, as a user, a script or
// a client library would, with a time limit so that a hung program fails the test
// instead of hanging it.
//
// Example
//   ProcessResult r = RunProgram({"balance", "--json"}, "1 2 3\n");
//   EXPECT_EQ(r.status, 0) << r.err;
//
//   Subprocess daemon({"serve"});
//   daemon.Write(frame);
//   std::string reply;
//   daemon.ReadSome(&reply, std::chrono::seconds(10));
//   daemon.CloseStdin();
//   ProcessResult rest = daemon.Communicate("", std::chrono::seconds(10));

#ifndef RLSCHED_TESTS_SCHEDULER_SUBPROCESS_H_
#define RLSCHED_TESTS_SCHEDULER_SUBPROCESS_H_

#include <stdlib.h>
#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace rlsched::app {

struct ProcessResult {
  int status = -1;         // exit status, or 128 + signal number
  bool timed_out = false;  // killed (SIGKILL) after the time limit
  std::string out;
  std::string err;
};

inline constexpr std::chrono::milliseconds kDefaultTimeLimit{60'000};

// The built program (RLSCHED_PROGRAM) started with `args`, its stdin, stdout and
// stderr connected to pipes. SIGPIPE is ignored in the test process.
class Subprocess {
 public:
  explicit Subprocess(const std::vector<std::string>& args);
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;
  // Kills (SIGKILL) and reaps the program if it is still running.
  ~Subprocess();

  // Writes all of `bytes` to the program's stdin; false if the pipe broke.
  bool Write(std::string_view bytes);
  // Appends what the program writes to stdout to `out` until `out` holds at least
  // `size` bytes; false on end of stdout or after `time_limit`.
  bool ReadAtLeast(std::size_t size, std::string* out, std::chrono::milliseconds time_limit);
  void CloseStdin();
  void CloseStdout();

  // Writes `input` to stdin (then closes it), collects stdout and stderr until both
  // end, and waits for the exit; kills the program after `time_limit`. Once only.
  ProcessResult Communicate(std::string_view input, std::chrono::milliseconds time_limit);
  // As Communicate() but leaves stdin as it is (open, unless closed before).
  ProcessResult Wait(std::chrono::milliseconds time_limit);

 private:
  ProcessResult Collect(std::string_view input, bool feed_stdin,
                        std::chrono::milliseconds time_limit);

  pid_t pid_ = -1;
  int in_ = -1;
  int out_ = -1;
  int err_ = -1;
};

// Runs the program with `args`, feeding `input` on stdin and collecting stdout and
// stderr until it exits; kills it after `time_limit` (the result says timed_out).
ProcessResult RunProgram(const std::vector<std::string>& args, std::string_view input = "",
                         std::chrono::milliseconds time_limit = kDefaultTimeLimit);

// A temporary directory, removed with its files when destroyed.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "rlsched-test-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data()) != nullptr ? pattern : "";
  }
  ~TempDir() {
    std::error_code ignored;
    if (!path_.empty()) std::filesystem::remove_all(path_, ignored);
  }
  // Writes `text` to file `name` in the directory; returns its path.
  std::string Write(const std::string& name, const std::string& text) const {
    const std::string path = *this / name;
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// The bytes of file `path` (empty if it cannot be read).
inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The lines of `text` (program output), without their '\n'.
inline std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

}  // namespace rlsched::app

#endif  // RLSCHED_TESTS_SCHEDULER_SUBPROCESS_H_
