// benchmarks/big_instance.cc — wall time and peak memory of PartitionItems on big inputs.
//
// Usage
//   big_instance               every mode below, each in its own child process (fork),
//                              so each mode's peak RSS is its own
//   big_instance 1m [CALLS]    n = 1,000,000, k = 1024, any size     (default 3 calls)
//   big_instance 1m-equal [CALLS]
//                              n = 1,000,000, k = 1024, equal-size   (default 3 calls)
//   big_instance 16k [CALLS]   n = 16,384, k = 128, any size         (default 200 calls)
//
// Overview
//   Each mode generates workload::HeavyTailedLengths(n, seed 1), then calls
//   balance::PartitionItems() with default options (KK + LPT fallback + refinement)
//   CALLS times (16k: after one untimed warm-up call), and prints the wall time per
//   call (mean, min, max) and, right after those calls, the process's peak resident
//   set size (getrusage(RUSAGE_SELF).ru_maxrss) together with the peak before the first
//   call (the input alone). Run a mode in a fresh process (as the default does) so that
//   the peak reflects that mode only. Then, for diagnosis, it times the pieces alone
//   (KarmarkarKarp, GreedyLpt, Refine of the KK answer, MakePartition) and checks the
//   targets of issue 2: 1M/1024 under 1 s and 300 MB; 16k/128 under 5 ms.
//   Single-threaded: the library uses one core.

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "rlsched/balance/partition.h"
#include "rlsched/workload/workload.h"

namespace {

namespace balance = rlsched::balance;
namespace workload = rlsched::workload;
using Clock = std::chrono::steady_clock;

constexpr std::uint64_t kSeed = 1;

struct Mode {
  std::string_view name;
  std::int64_t n;
  std::int64_t num_parts;
  bool equal_size;
  int default_calls;
  bool warm_up;
  double time_target_seconds;  // the mean time per call must be below this
  double memory_target_bytes;  // 0: no memory target
};

constexpr Mode kModes[] = {
    {"1m", 1'000'000, 1024, false, 3, false, 1.0, 300e6},
    {"1m-equal", 1'000'000, 1024, true, 3, false, 1.0, 300e6},
    {"16k", 16'384, 128, false, 200, true, 5e-3, 0.0},
};

double Seconds(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string FormatSeconds(double seconds) {
  char buffer[32];
  if (seconds < 1e-3) {
    std::snprintf(buffer, sizeof(buffer), "%.1f us", seconds * 1e6);
  } else if (seconds < 1.0) {
    std::snprintf(buffer, sizeof(buffer), "%.3f ms", seconds * 1e3);
  } else {
    std::snprintf(buffer, sizeof(buffer), "%.3f s", seconds);
  }
  return buffer;
}

// The peak resident set size of this process so far, in bytes (Linux reports KiB).
double PeakRssBytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) * 1024.0;
}

std::string FormatBytes(double bytes) {
  char buffer[48];
  std::snprintf(buffer, sizeof(buffer), "%.1f MB (%.0f KiB)", bytes / 1e6, bytes / 1024.0);
  return buffer;
}

// Calls `fn` `calls` times and returns the wall time of each call.
template <typename Fn>
std::vector<double> TimeCalls(int calls, Fn&& fn) {
  std::vector<double> seconds;
  for (int i = 0; i < calls; ++i) {
    const Clock::time_point start = Clock::now();
    fn();
    seconds.push_back(Seconds(start));
  }
  return seconds;
}

double Mean(const std::vector<double>& values) {
  double sum = 0.0;
  for (double v : values) sum += v;
  return values.empty() ? 0.0 : sum / static_cast<double>(values.size());
}

int RunMode(const Mode& mode, int calls) {
  std::printf("== %s: PartitionItems, n=%lld, k=%lld, %s, heavy-tailed seed %llu, %d call(s)\n",
              std::string(mode.name).c_str(), static_cast<long long>(mode.n),
              static_cast<long long>(mode.num_parts), mode.equal_size ? "equal-size" : "any size",
              static_cast<unsigned long long>(kSeed), calls);
  const std::vector<std::int64_t> weights = workload::HeavyTailedLengths(mode.n, kSeed);
  const double rss_input = PeakRssBytes();

  balance::PartitionOptions options;
  options.num_parts = mode.num_parts;
  options.equal_size = mode.equal_size;
  balance::Partition partition;
  if (mode.warm_up) partition = balance::PartitionItems(weights, options);
  const std::vector<double> seconds =
      TimeCalls(calls, [&] { partition = balance::PartitionItems(weights, options); });
  const double rss_peak = PeakRssBytes();

  const double mean = Mean(seconds);
  std::printf("   time per call: mean %s, min %s, max %s\n", FormatSeconds(mean).c_str(),
              FormatSeconds(*std::min_element(seconds.begin(), seconds.end())).c_str(),
              FormatSeconds(*std::max_element(seconds.begin(), seconds.end())).c_str());
  std::printf("   peak RSS: %s after the calls; %s with the input alone\n",
              FormatBytes(rss_peak).c_str(), FormatBytes(rss_input).c_str());
  std::printf(
      "   result: max_load %lld, min_load %lld, lower bound %lld, gap %.3g%s, "
      "refine steps %lld\n",
      static_cast<long long>(partition.max_load), static_cast<long long>(partition.min_load),
      static_cast<long long>(partition.lower_bound), partition.gap,
      partition.proven_optimal ? " (optimal)" : "", static_cast<long long>(partition.refine_steps));

  // The pieces alone (after the peak was taken), a call each for 1M, a few for 16k.
  const int piece_calls = std::max(1, calls / 10);
  balance::Assignment kk;
  balance::Assignment lpt;
  const double kk_seconds = Mean(TimeCalls(
      piece_calls, [&] { kk = balance::KarmarkarKarp(weights, mode.num_parts, mode.equal_size); }));
  const double lpt_seconds = Mean(TimeCalls(
      piece_calls, [&] { lpt = balance::GreedyLpt(weights, mode.num_parts, mode.equal_size); }));
  const std::int64_t lower_bound = balance::LowerBound(weights, mode.num_parts, mode.equal_size);
  std::int64_t steps = 0;
  const double refine_seconds = Mean(TimeCalls(piece_calls, [&] {
    balance::Assignment copy = kk;
    steps = balance::Refine(weights, mode.num_parts, mode.equal_size, balance::RefineOptions{},
                            lower_bound, copy);
  }));
  balance::Partition kk_partition;
  const double make_seconds = Mean(TimeCalls(piece_calls, [&] {
    kk_partition = balance::MakePartition(weights, mode.num_parts, mode.equal_size, kk);
  }));
  const balance::Partition lpt_partition =
      balance::MakePartition(weights, mode.num_parts, mode.equal_size, lpt);
  std::printf(
      "   pieces: KarmarkarKarp %s (gap %.3g), GreedyLpt %s (gap %.3g),\n"
      "           Refine of the KK answer %s (%lld steps, includes copying it), "
      "MakePartition %s\n",
      FormatSeconds(kk_seconds).c_str(), kk_partition.gap, FormatSeconds(lpt_seconds).c_str(),
      lpt_partition.gap, FormatSeconds(refine_seconds).c_str(), static_cast<long long>(steps),
      FormatSeconds(make_seconds).c_str());

  const bool time_met = mean < mode.time_target_seconds;
  std::printf("   target: mean time < %s: %s\n", FormatSeconds(mode.time_target_seconds).c_str(),
              time_met ? "met" : "NOT MET");
  if (mode.memory_target_bytes > 0) {
    const bool memory_met = rss_peak < mode.memory_target_bytes;
    std::printf("   target: peak RSS < %.0f MB: %s\n", mode.memory_target_bytes / 1e6,
                memory_met ? "met" : "NOT MET");
  }
  std::printf("\n");
  return 0;
}

int RunModeGuarded(const Mode& mode, int calls) {
  try {
    return RunMode(mode, calls);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "big_instance %s: %s\n", std::string(mode.name).c_str(), e.what());
    return 1;
  }
}

// Runs every mode in a child process of its own; returns non-zero if one failed.
int RunAll() {
  int status_all = 0;
  for (const Mode& mode : kModes) {
    std::fflush(stdout);
    std::fflush(stderr);
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("fork");
      return 1;
    }
    if (pid == 0) {
      const int code = RunModeGuarded(mode, mode.default_calls);
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(code);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::fprintf(stderr, "big_instance: mode %s failed\n", std::string(mode.name).c_str());
      status_all = 1;
    }
  }
  return status_all;
}

int Usage(const char* program) {
  std::fprintf(stderr, "usage: %s [1m|1m-equal|16k [CALLS]]\n", program);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 1) return RunAll();
  if (argc > 3) return Usage(argv[0]);
  for (const Mode& mode : kModes) {
    if (mode.name != argv[1]) continue;
    int calls = mode.default_calls;
    if (argc == 3) {
      calls = std::atoi(argv[2]);
      if (calls < 1) return Usage(argv[0]);
    }
    return RunModeGuarded(mode, calls);
  }
  return Usage(argv[0]);
}
