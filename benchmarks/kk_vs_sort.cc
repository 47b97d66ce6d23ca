// benchmarks/kk_vs_sort.cc — Karmarkar-Karp's time as a multiple of std::sort's (issue 11).
//
// Overview
//   For every n in {4096, 16384, 65536, 262144, 1048576} and k in {64, 256, 1024} with
//   k < n, on workload::HeavyTailedLengths(n, seed 1), times in the same run:
//     kk    balance::KarmarkarKarp(weights, k, PartSizes::kAny) (the input checks, the
//           radix order and the differencing; no fallback, no refinement);
//     kk=   the same with PartSizes::kEqual;
//     sort  std::sort of a copy of the weights (the copy is made outside the timer);
//   and prints the ratios kk / sort and kk= / sort. The three are interleaved, `repeats`
//   times each, and each keeps its fastest run (the least disturbed by other work on a
//   shared machine). Each run is timed twice: by the thread's CPU time
//   (CLOCK_THREAD_CPUTIME_ID: the work done, without the time the thread waited for a
//   core) and by the wall clock; the ratios are printed for both (cpu, then wall). The
//   last column is an FNV-1a digest of the kAny assignment, so two builds can be
//   checked to give the same partitions.
//
//   The target of issue 11: kk / sort <= 3 for every case, by CPU time (by the wall
//   clock with --wall). The exit status is 1 when a case misses it (0 with --no-check).
//
// Usage
//   kk_vs_sort [--repeats N] [--no-check] [--wall]   # N defaults to 7; about 10 s in Release

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "rlsched/balance/partition.h"
#include "rlsched/workload/workload.h"

namespace {

namespace balance = rlsched::balance;
namespace workload = rlsched::workload;

using Clock = std::chrono::steady_clock;

constexpr double kTargetRatio = 3.0;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

double ThreadCpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// The fastest of several runs, by CPU time and by wall time (each its own minimum).
struct Best {
  double cpu = std::numeric_limits<double>::infinity();
  double wall = std::numeric_limits<double>::infinity();
};

// Times `run` once into `best`.
template <typename Run>
void Time(Best& best, Run&& run) {
  const auto wall_start = Clock::now();
  const double cpu_start = ThreadCpuSeconds();
  run();
  const double cpu = ThreadCpuSeconds() - cpu_start;
  const double wall = Seconds(Clock::now() - wall_start);
  best.cpu = std::min(best.cpu, cpu);
  best.wall = std::min(best.wall, wall);
}

std::uint64_t Digest(const balance::Assignment& assignment) {
  std::uint64_t h = 1469598103934665603ULL;
  for (const std::int32_t part : assignment) {
    h ^= static_cast<std::uint32_t>(part);
    h *= 1099511628211ULL;
  }
  return h;
}

}  // namespace

int main(int argc, char** argv) {
  int repeats = 7;
  bool check = true;
  bool wall_target = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--repeats") == 0 && i + 1 < argc) {
      repeats = std::max(1, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--no-check") == 0) {
      check = false;
    } else if (std::strcmp(argv[i], "--wall") == 0) {
      wall_target = true;
    } else {
      std::fprintf(stderr, "usage: kk_vs_sort [--repeats N] [--no-check] [--wall]\n");
      return 2;
    }
  }
  std::printf("%9s %6s %10s %10s %10s %8s %8s %9s %9s  %s\n", "n", "k", "sort ms", "kk ms",
              "kk= ms", "kk/sort", "kk=/sort", "wall kk/", "wall kk=/", "digest");
  bool missed = false;
  double worst = 0.0;
  for (const std::int64_t n : {4096, 16384, 65536, 262144, 1048576}) {
    const std::vector<std::int64_t> weights = workload::HeavyTailedLengths(n, 1);
    std::vector<std::int64_t> copy(weights.size());
    for (const std::int64_t k : {64, 256, 1024}) {
      if (k >= n) continue;
      Best sort;
      Best kk;
      Best kk_equal;
      balance::Assignment assignment;
      for (int r = 0; r < repeats; ++r) {
        std::copy(weights.begin(), weights.end(), copy.begin());
        Time(sort, [&] { std::sort(copy.begin(), copy.end()); });
        Time(kk,
             [&] { assignment = balance::KarmarkarKarp(weights, k, balance::PartSizes::kAny); });
        balance::Assignment equal;
        Time(kk_equal,
             [&] { equal = balance::KarmarkarKarp(weights, k, balance::PartSizes::kEqual); });
        if (equal.size() != weights.size()) return 3;
      }
      const double ratio = kk.cpu / sort.cpu;
      const double wall_ratio = kk.wall / sort.wall;
      const double target_ratio = wall_target ? wall_ratio : ratio;
      worst = std::max(worst, target_ratio);
      const bool miss = target_ratio > kTargetRatio;
      missed = missed || miss;
      std::printf("%9lld %6lld %10.3f %10.3f %10.3f %8.2f %8.2f %9.2f %9.2f  %016llx%s\n",
                  static_cast<long long>(n), static_cast<long long>(k), sort.cpu * 1e3,
                  kk.cpu * 1e3, kk_equal.cpu * 1e3, ratio, kk_equal.cpu / sort.cpu, wall_ratio,
                  kk_equal.wall / sort.wall, static_cast<unsigned long long>(Digest(assignment)),
                  miss ? "  > target" : "");
    }
  }
  std::printf("worst kk/sort (%s): %.2f (target <= %.1f)\n", wall_target ? "wall" : "cpu", worst,
              kTargetRatio);
  return check && missed ? 1 : 0;
}
