// benchmarks/serve_throughput.cc — `rlsched serve` over pipes vs the same solves
// in-process, on the same number of threads.
//
// Usage
//   serve_throughput [--threads T] [--requests R] [--rounds N] [--program PATH]
//   (defaults: T = 2, R = 400, N = 10, PATH = the rlsched built beside this program)
//
// Overview
//   R balance requests, request i = workload::HeavyTailedLengths(4096, seed i + 1) into k = 32
//   equal-size parts (default cost and refinement), built and serialized before any
//   timing. After a warm-up round, each round times:
//     in-process  tbb::parallel_for over SolveBalance() in a task arena of T threads
//                 (the replies kept in memory, not serialized);
//     serve       `rlsched serve --threads T` as a subprocess, started (and answering
//                 a ping) before the round: a writer thread writes the R framed
//                 requests into its stdin while the reader (this thread) reads the
//                 replies from its stdout, parses each, checks that it is the next one
//                 in request order and that its bytes are those of the in-process
//                 answer; the round ends when the last reply is checked.
//   and prints requests/s for both per round, then the medians, their ratio (serve /
//   in-process; the target of issue 4 is >= 70%) and the daemon's mean latency per
//   request in a one-at-a-time conversation (ping and one balance request).
//   The exit status is 1 when a reply is wrong or out of order.

#include <fcntl.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <signal.h>
#include <sys/wait.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "rlsched/workload/workload.h"
#include "rlsched/v1/service.pb.h"
#include "rlsched/wire/balance_convert.h"

namespace {

namespace balance = rlsched::balance;
namespace workload = rlsched::workload;
namespace v1 = rlsched::v1;
using Clock = std::chrono::steady_clock;

constexpr std::int64_t kItems = 4096;
constexpr std::int64_t kParts = 32;
constexpr double kTargetRatio = 0.70;

struct Args {
  int threads = 2;
  int requests = 400;
  int rounds = 10;
  std::string program = RLSCHED_PROGRAM;
};

int ParsePositive(std::string_view option, const char* text) {
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || value < 1 || value > 1'000'000) {
    throw std::invalid_argument(std::string(option) + ": must be a positive integer, got '" + text +
                                "'");
  }
  return static_cast<int>(value);
}

Args ParseArgs(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string_view option = argv[i];
    if (i + 1 >= argc) throw std::invalid_argument(std::string(option) + ": needs a value");
    const char* value = argv[++i];
    if (option == "--threads") {
      args.threads = ParsePositive(option, value);
    } else if (option == "--requests") {
      args.requests = ParsePositive(option, value);
    } else if (option == "--rounds") {
      args.rounds = ParsePositive(option, value);
    } else if (option == "--program") {
      args.program = value;
    } else {
      throw std::invalid_argument("unknown option " + std::string(option));
    }
  }
  return args;
}

std::string Framed(const google::protobuf::MessageLite& message) {
  using google::protobuf::io::CodedOutputStream;
  const auto size = static_cast<std::uint32_t>(message.ByteSizeLong());
  std::string frame(CodedOutputStream::VarintSize32(size) + size, '\0');
  auto* out = reinterpret_cast<std::uint8_t*>(frame.data());
  out = CodedOutputStream::WriteVarint32ToArray(size, out);
  message.SerializeWithCachedSizesToArray(out);
  return frame;
}

// `rlsched serve` with pipes to its stdin and stdout; stderr is ours.
class Daemon {
 public:
  Daemon(const std::string& program, int threads) {
    int in_pipe[2];
    int out_pipe[2];
    if (::pipe2(in_pipe, O_CLOEXEC) != 0 || ::pipe2(out_pipe, O_CLOEXEC) != 0) {
      throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
    }
    std::string threads_text = std::to_string(threads);
    std::vector<std::string> arguments = {program, "serve", "--threads", threads_text};
    std::vector<char*> argv;
    for (std::string& argument : arguments) argv.push_back(argument.data());
    argv.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
    if (pid_ == 0) {
      ::dup2(in_pipe[0], STDIN_FILENO);
      ::dup2(out_pipe[1], STDOUT_FILENO);
      ::execv(argv[0], argv.data());
      std::fprintf(stderr, "cannot run %s: %s\n", argv[0], std::strerror(errno));
      ::_exit(127);
    }
    ::close(in_pipe[0]);
    ::close(out_pipe[1]);
    in_ = in_pipe[1];
    out_ = out_pipe[0];
  }
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;
  ~Daemon() {
    if (in_ >= 0) ::close(in_);
    if (out_ >= 0) ::close(out_);
    if (pid_ > 0) {
      int status = 0;
      ::waitpid(pid_, &status, 0);
    }
  }

  void Write(std::string_view bytes) {
    while (!bytes.empty()) {
      const ssize_t n = ::write(in_, bytes.data(), bytes.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw std::runtime_error(std::string("write: ") + std::strerror(errno));
      bytes.remove_prefix(static_cast<std::size_t>(n));
    }
  }

  // The next reply (varint size, then the message), parsed; `bytes` gets its
  // serialization when given.
  v1::Reply Read(std::string* bytes = nullptr) {
    std::uint64_t size = 0;
    for (int shift = 0;; shift += 7) {
      const auto byte = static_cast<unsigned char>(Take(1)[0]);
      size |= static_cast<std::uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) break;
      if (shift > 56) throw std::runtime_error("malformed reply size");
    }
    v1::Reply reply;
    const std::string_view message = Take(static_cast<std::size_t>(size));
    if (!reply.ParseFromArray(message.data(), static_cast<int>(message.size()))) {
      throw std::runtime_error("a reply does not parse");
    }
    if (bytes != nullptr) bytes->assign(message);
    return reply;
  }

  // Closes stdin and returns the exit status.
  int Finish() {
    ::close(in_);
    in_ = -1;
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  // The next `size` bytes of stdout (valid until the next call).
  std::string_view Take(std::size_t size) {
    buffer_.erase(0, taken_);
    taken_ = 0;
    while (buffer_.size() < size) {
      char chunk[1 << 16];
      const ssize_t n = ::read(out_, chunk, sizeof chunk);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) throw std::runtime_error("the daemon's stdout ended");
      buffer_.append(chunk, static_cast<std::size_t>(n));
    }
    taken_ = size;
    return std::string_view(buffer_).substr(0, size);
  }

  pid_t pid_ = -1;
  int in_ = -1;
  int out_ = -1;
  std::string buffer_;
  std::size_t taken_ = 0;
};

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

int Run(const Args& args) {
  ::signal(SIGPIPE, SIG_IGN);
  std::printf(
      "serve throughput: %d requests of n = %lld heavy-tailed lengths, k = %lld, "
      "equal-size; T = %d threads; %d rounds\n",
      args.requests, static_cast<long long>(kItems), static_cast<long long>(kParts), args.threads,
      args.rounds);

  std::vector<v1::Request> requests(static_cast<std::size_t>(args.requests));
  std::string stream;
  for (int i = 0; i < args.requests; ++i) {
    v1::Request& request = requests[static_cast<std::size_t>(i)];
    request.set_id(std::to_string(i));
    const std::vector<std::int64_t> lengths =
        workload::HeavyTailedLengths(kItems, static_cast<std::uint64_t>(i) + 1);
    v1::BalanceRequest* balance_request = request.mutable_balance();
    balance_request->mutable_lengths()->Add(lengths.begin(), lengths.end());
    balance_request->set_num_parts(kParts);
    balance_request->set_equal_size(true);
    stream += Framed(request);
  }
  std::printf("request stream: %zu bytes (%.1f KB per request)\n\n", stream.size(),
              static_cast<double>(stream.size()) / 1e3 / args.requests);

  // In-process: SolveBalance() on every request, the replies kept (not serialized).
  std::vector<v1::BalanceReply> solved(requests.size());
  tbb::task_arena arena(args.threads);
  auto solve_all = [&] {
    arena.execute([&] {
      tbb::parallel_for(tbb::blocked_range<std::size_t>(0, requests.size(), 1),
                        [&](const tbb::blocked_range<std::size_t>& range) {
                          for (std::size_t i = range.begin(); i != range.end(); ++i) {
                            solved[i] = rlsched::wire::SolveBalance(requests[i].balance());
                          }
                        });
    });
  };
  solve_all();  // warm-up; then the answers every served reply must equal
  std::vector<std::string> expected(requests.size());
  for (std::size_t i = 0; i < requests.size(); ++i) {
    v1::Reply reply;
    reply.set_id(requests[i].id());
    *reply.mutable_balance() = solved[i];
    expected[i] = reply.SerializeAsString();
  }

  Daemon daemon(args.program, args.threads);
  v1::Request ping;
  ping.set_id("ping");
  ping.mutable_ping();
  daemon.Write(Framed(ping));
  if (daemon.Read().id() != "ping") throw std::runtime_error("no pong");

  int failures = 0;
  std::vector<double> in_process_rates;
  std::vector<double> serve_rates;
  std::printf("%-6s %18s %18s %8s\n", "round", "in-process req/s", "serve req/s", "ratio");
  for (int round = 0; round <= args.rounds; ++round) {  // round 0: warm-up, not counted
    const auto start = Clock::now();
    solve_all();
    const double in_process = std::chrono::duration<double>(Clock::now() - start).count();

    const auto serve_start = Clock::now();
    std::thread writer([&] { daemon.Write(stream); });
    std::string bytes;
    for (std::size_t i = 0; i < requests.size(); ++i) {
      const v1::Reply reply = daemon.Read(&bytes);
      if (reply.id() != requests[i].id()) {
        std::printf("FAIL: reply %zu has id '%s', expected '%s'\n", i, reply.id().c_str(),
                    requests[i].id().c_str());
        ++failures;
      } else if (bytes != expected[i]) {
        std::printf("FAIL: reply %zu differs from the in-process answer\n", i);
        ++failures;
      }
    }
    const double served = std::chrono::duration<double>(Clock::now() - serve_start).count();
    writer.join();
    if (round == 0) continue;
    const double n = static_cast<double>(requests.size());
    in_process_rates.push_back(n / in_process);
    serve_rates.push_back(n / served);
    std::printf("%-6d %18.1f %18.1f %7.1f%%\n", round, n / in_process, n / served,
                100.0 * in_process / served);
  }

  // One request at a time: what a client waiting for each reply sees.
  constexpr int kConversation = 50;
  const std::string one_balance = Framed(requests.front());
  double ping_seconds = 0.0;
  double balance_seconds = 0.0;
  for (int i = 0; i < kConversation; ++i) {
    auto t0 = Clock::now();
    daemon.Write(Framed(ping));
    daemon.Read();
    auto t1 = Clock::now();
    daemon.Write(one_balance);
    daemon.Read();
    auto t2 = Clock::now();
    ping_seconds += std::chrono::duration<double>(t1 - t0).count();
    balance_seconds += std::chrono::duration<double>(t2 - t1).count();
  }
  const int status = daemon.Finish();
  if (status != 0) {
    std::printf("FAIL: the daemon exited with status %d\n", status);
    ++failures;
  }

  const double in_process = Median(in_process_rates);
  const double served = Median(serve_rates);
  const double ratio = served / in_process;
  std::printf("%-6s %18.1f %18.1f %7.1f%%\n", "median", in_process, served, 100.0 * ratio);
  std::printf("\none request at a time (%d each): ping %.3f ms, balance %.3f ms round trip\n",
              kConversation, 1e3 * ping_seconds / kConversation,
              1e3 * balance_seconds / kConversation);
  std::printf("\nreplies in request order and equal to the in-process answers: %s\n",
              failures == 0 ? "yes" : "NO");
  std::printf("target (issue 4): serve >= %.0f%% of in-process on %d threads: %s (%.1f%%)\n",
              100.0 * kTargetRatio, args.threads, ratio >= kTargetRatio ? "PASS" : "FAIL",
              100.0 * ratio);
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Run(ParseArgs(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "serve_throughput: %s\n", e.what());
    return 2;
  }
}
