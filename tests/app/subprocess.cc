#include "subprocess.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <tuple>

namespace rlsched::app {
namespace {

using Clock = std::chrono::steady_clock;

void CloseFd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// Milliseconds left until `deadline`, at least 0.
int MillisecondsLeft(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::max<std::int64_t>(0, left.count()));
}

int DecodeStatus(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

Subprocess::Subprocess(const std::vector<std::string>& args) {
  ::signal(SIGPIPE, SIG_IGN);  // the program may exit without reading its stdin
  int in_pipe[2];
  int out_pipe[2];
  int err_pipe[2];
  if (::pipe2(in_pipe, O_CLOEXEC) != 0 || ::pipe2(out_pipe, O_CLOEXEC) != 0 ||
      ::pipe2(err_pipe, O_CLOEXEC) != 0) {
    ADD_FAILURE() << "pipe: " << std::strerror(errno);
    return;
  }
  std::vector<std::string> argv_strings = {RLSCHED_PROGRAM};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& arg : argv_strings) argv.push_back(arg.data());
  argv.push_back(nullptr);

  pid_ = ::fork();
  if (pid_ < 0) {
    ADD_FAILURE() << "fork: " << std::strerror(errno);
    return;
  }
  if (pid_ == 0) {
    ::dup2(in_pipe[0], STDIN_FILENO);  // dup2 clears O_CLOEXEC on the copies
    ::dup2(out_pipe[1], STDOUT_FILENO);
    ::dup2(err_pipe[1], STDERR_FILENO);
    ::signal(SIGPIPE, SIG_DFL);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(in_pipe[0]);
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  in_ = in_pipe[1];
  out_ = out_pipe[0];
  err_ = err_pipe[0];
}

Subprocess::~Subprocess() {
  CloseFd(in_);
  CloseFd(out_);
  CloseFd(err_);
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
  }
}

bool Subprocess::Write(std::string_view bytes) {
  while (!bytes.empty() && in_ >= 0) {
    const ssize_t n = ::write(in_, bytes.data(), bytes.size());
    if (n > 0) {
      bytes.remove_prefix(static_cast<std::size_t>(n));
    } else if (errno != EINTR) {
      return false;
    }
  }
  return bytes.empty();
}

bool Subprocess::ReadAtLeast(std::size_t size, std::string* out,
                             std::chrono::milliseconds time_limit) {
  const Clock::time_point deadline = Clock::now() + time_limit;
  while (out->size() < size) {
    if (out_ < 0) return false;
    pollfd fd = {out_, POLLIN, 0};
    const int ready = ::poll(&fd, 1, MillisecondsLeft(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return false;
    char buffer[65536];
    const ssize_t n = ::read(out_, buffer, sizeof buffer);
    if (n > 0) {
      out->append(buffer, static_cast<std::size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      return false;
    }
  }
  return true;
}

void Subprocess::CloseStdin() { CloseFd(in_); }

void Subprocess::CloseStdout() { CloseFd(out_); }

ProcessResult Subprocess::Communicate(std::string_view input,
                                      std::chrono::milliseconds time_limit) {
  return Collect(input, true, time_limit);
}

ProcessResult Subprocess::Wait(std::chrono::milliseconds time_limit) {
  return Collect("", false, time_limit);
}

ProcessResult Subprocess::Collect(std::string_view input, bool feed_stdin,
                                  std::chrono::milliseconds time_limit) {
  ProcessResult result;
  if (pid_ <= 0) return result;
  const Clock::time_point deadline = Clock::now() + time_limit;
  int in = feed_stdin ? in_ : -1;  // the stdin this call writes and closes
  if (in >= 0) ::fcntl(in, F_SETFL, ::fcntl(in, F_GETFL) | O_NONBLOCK);
  std::size_t written = 0;
  if (feed_stdin && input.empty()) {
    CloseStdin();
    in = -1;
  }
  while (in >= 0 || out_ >= 0 || err_ >= 0) {
    const int wait = MillisecondsLeft(deadline);
    if (wait == 0) {
      result.timed_out = true;
      break;
    }
    pollfd fds[3] = {{in, POLLOUT, 0}, {out_, POLLIN, 0}, {err_, POLLIN, 0}};
    const int ready = ::poll(fds, 3, wait);
    if (ready < 0) {
      if (errno == EINTR) continue;
      ADD_FAILURE() << "poll: " << std::strerror(errno);
      break;
    }
    if (in >= 0 && fds[0].revents != 0) {
      const ssize_t n = ::write(in, input.data() + written, input.size() - written);
      if (n > 0) written += static_cast<std::size_t>(n);
      if ((n < 0 && errno != EAGAIN && errno != EINTR) || written == input.size()) {
        CloseStdin();
        in = -1;
      }
    }
    for (const auto& [index, fd, sink] :
         {std::tuple{1, &out_, &result.out}, std::tuple{2, &err_, &result.err}}) {
      if (*fd < 0 || fds[index].revents == 0) continue;
      char buffer[65536];
      const ssize_t n = ::read(*fd, buffer, sizeof buffer);
      if (n > 0) {
        sink->append(buffer, static_cast<std::size_t>(n));
      } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        CloseFd(*fd);
      }
    }
  }
  // Its stdout and stderr are closed: the program has exited or is about to; wait
  // for it, up to the deadline.
  int status = 0;
  while (!result.timed_out) {
    const pid_t done = ::waitpid(pid_, &status, WNOHANG);
    if (done == pid_) {
      result.status = DecodeStatus(status);
      pid_ = -1;
      break;
    }
    if (done < 0 && errno != EINTR) break;
    if (MillisecondsLeft(deadline) == 0) {
      result.timed_out = true;
      break;
    }
    ::usleep(1000);
  }
  CloseFd(in_);
  CloseFd(out_);
  CloseFd(err_);
  if (result.timed_out) {
    ::kill(pid_, SIGKILL);
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    result.status = DecodeStatus(status);
    pid_ = -1;
  }
  return result;
}

ProcessResult RunProgram(const std::vector<std::string>& args, std::string_view input,
                         std::chrono::milliseconds time_limit) {
  Subprocess program(args);
  ProcessResult result = program.Communicate(input, time_limit);
  if (result.timed_out) {
    ADD_FAILURE() << "the program did not exit within " << time_limit.count() << " ms";
  }
  return result;
}

}  // namespace rlsched::app
