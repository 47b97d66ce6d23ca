// benchmarks/exact_search.cc — how often the exact search proves optimality, and at
// what cost, on small heavy-tailed instances.
//
// Usage
//   exact_search [SEEDS] [TIME_LIMIT_MS]
//   SEEDS instances per row (default 100, seeds 1..SEEDS), TIME_LIMIT_MS the search's
//   wall-clock budget per instance (default 100).
//
// Overview
//   For n in {10, 20, 30, 40} × k in {2, 4, 8} × equal-size off/on, runs
//   balance::ExactSearch on workload::HeavyTailedLengths(n, seed) from the KK + refinement
//   answer (PartitionItems with the exact search off), with no node limit and the time
//   limit above (a steady_clock NowFn), and prints per row: the fraction proven
//   optimal, the median and max nodes and wall time of the search, and the gap of
//   KK + refinement to the search's answer (its max load / the search's - 1; over
//   the proven instances this is the gap to the optimum). Every answer is checked
//   (each item in one part, the counts in equal-size mode, max load recomputed,
//   never worse than the incumbent, never below the lower bound); a violation is
//   printed and the exit status is 1. The last line compares with the target of
//   issue 3 (most instances with n <= 40 and k <= 8 proven within 100 ms).

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "rlsched/balance/exact.h"
#include "rlsched/balance/partition.h"
#include "rlsched/workload/workload.h"

namespace {

namespace balance = rlsched::balance;
namespace workload = rlsched::workload;
using Clock = std::chrono::steady_clock;

constexpr std::int64_t kSizes[] = {10, 20, 30, 40};
constexpr std::int64_t kParts[] = {2, 4, 8};

struct Row {
  std::int64_t n = 0;
  std::int64_t k = 0;
  bool equal_size = false;
  int proven = 0;
  int incumbent_optimal = 0;  // KK + refinement already optimal (proven instances)
  std::vector<double> nodes;
  std::vector<double> millis;
  std::vector<double> gaps;  // KK + refinement vs the search's answer
};

double Median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const std::size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

double Max(const std::vector<double>& values) {
  return values.empty() ? 0.0 : *std::max_element(values.begin(), values.end());
}

// The max load of `assignment`, or -1 when it is not a valid answer.
std::int64_t CheckedMaxLoad(const std::vector<std::int64_t>& weights, std::int64_t k,
                            bool equal_size, const balance::Assignment& assignment) {
  if (assignment.size() != weights.size()) return -1;
  std::vector<std::int64_t> loads(static_cast<std::size_t>(k), 0);
  std::vector<std::int64_t> counts(static_cast<std::size_t>(k), 0);
  for (std::size_t i = 0; i < weights.size(); ++i) {
    if (assignment[i] < 0 || assignment[i] >= k) return -1;
    loads[static_cast<std::size_t>(assignment[i])] += weights[i];
    ++counts[static_cast<std::size_t>(assignment[i])];
  }
  if (equal_size) {
    const std::int64_t n = static_cast<std::int64_t>(weights.size());
    for (const std::int64_t c : counts) {
      if (c < n / k || c > n / k + (n % k != 0 ? 1 : 0)) return -1;
    }
  }
  return *std::max_element(loads.begin(), loads.end());
}

balance::Assignment ToAssignment(const balance::Partition& p, std::size_t n) {
  balance::Assignment assignment(n, 0);
  for (std::int64_t part = 0; part < p.num_parts(); ++part) {
    for (const std::int64_t i : p.part(part)) {
      assignment[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(part);
    }
  }
  return assignment;
}

// Runs one row; returns the number of violations found.
int RunRow(Row& row, int seeds, std::chrono::milliseconds time_limit) {
  int violations = 0;
  balance::ExactOptions options;
  options.max_nodes = INT64_MAX;
  options.time_limit = time_limit;
  options.now = [] { return std::chrono::nanoseconds(Clock::now().time_since_epoch()); };
  for (int seed = 1; seed <= seeds; ++seed) {
    const std::vector<std::int64_t> weights =
        workload::HeavyTailedLengths(row.n, static_cast<std::uint64_t>(seed));
    balance::PartitionOptions partition;
    partition.num_parts = row.k;
    partition.equal_size = row.equal_size;
    partition.exact.max_nodes = 0;  // KK + LPT fallback + refinement only
    const balance::Partition start = balance::PartitionItems(weights, partition);
    const balance::Assignment incumbent = ToAssignment(start, weights.size());

    const auto begin = Clock::now();
    const balance::ExactResult r =
        balance::ExactSearch(weights, row.k, row.equal_size, incumbent, options);
    const double millis = std::chrono::duration<double, std::milli>(Clock::now() - begin).count();

    const std::int64_t max_load = CheckedMaxLoad(weights, row.k, row.equal_size, r.assignment);
    const std::int64_t bound = balance::LowerBound(weights, row.k, row.equal_size);
    std::string problem;
    if (max_load < 0) {
      problem = "invalid assignment";
    } else if (max_load != r.max_load) {
      problem = "max_load reported " + std::to_string(r.max_load) + ", actual " +
                std::to_string(max_load);
    } else if (max_load > start.max_load) {
      problem = "worse than the incumbent";
    } else if (max_load < bound || r.lower_bound < bound || r.lower_bound > max_load) {
      problem = "inconsistent with the lower bound";
    } else if (r.proven_optimal != (r.lower_bound == max_load)) {
      problem = "proven_optimal disagrees with lower_bound";
    }
    if (!problem.empty()) {
      std::printf("VIOLATION n=%lld k=%lld %s seed %d: %s\n", static_cast<long long>(row.n),
                  static_cast<long long>(row.k), row.equal_size ? "equal-size" : "any size", seed,
                  problem.c_str());
      ++violations;
      continue;
    }
    row.proven += r.proven_optimal ? 1 : 0;
    row.incumbent_optimal += r.proven_optimal && !r.improved ? 1 : 0;
    row.nodes.push_back(static_cast<double>(r.nodes));
    row.millis.push_back(millis);
    row.gaps.push_back(static_cast<double>(start.max_load) / static_cast<double>(max_load) - 1.0);
  }
  return violations;
}

int Main(int argc, char** argv) {
  const int seeds = argc > 1 ? std::atoi(argv[1]) : 100;
  const int limit_ms = argc > 2 ? std::atoi(argv[2]) : 100;
  if (seeds < 1 || limit_ms < 1) {
    std::fprintf(stderr, "usage: exact_search [SEEDS >= 1] [TIME_LIMIT_MS >= 1]\n");
    return 2;
  }
  std::printf(
      "Exact search on workload::HeavyTailedLengths(n, seed), seeds 1..%d, from KK + refinement,\n"
      "no node limit, %d ms time limit (steady_clock). gap = KK+refine max load / search's "
      "- 1.\n\n",
      seeds, limit_ms);
  std::printf("%3s %2s %-10s %8s %8s %10s %10s %10s %10s %10s %10s\n", "n", "k", "mode", "proven",
              "KK opt", "med nodes", "max nodes", "med ms", "max ms", "med gap", "max gap");
  int violations = 0;
  int proven = 0;
  int total = 0;
  for (const bool equal_size : {false, true}) {
    for (const std::int64_t n : kSizes) {
      for (const std::int64_t k : kParts) {
        Row row;
        row.n = n;
        row.k = k;
        row.equal_size = equal_size;
        violations += RunRow(row, seeds, std::chrono::milliseconds(limit_ms));
        const int count = static_cast<int>(row.nodes.size());
        proven += row.proven;
        total += count;
        std::printf(
            "%3lld %2lld %-10s %7.1f%% %7.1f%% %10.0f %10.0f %10.3f %10.3f %9.4f%% %9.4f%%\n",
            static_cast<long long>(n), static_cast<long long>(k), equal_size ? "equal" : "any",
            100.0 * row.proven / std::max(count, 1),
            100.0 * row.incumbent_optimal / std::max(count, 1), Median(row.nodes), Max(row.nodes),
            Median(row.millis), Max(row.millis), 100.0 * Median(row.gaps), 100.0 * Max(row.gaps));
      }
    }
  }
  std::printf("\nproven optimal within %d ms: %d of %d instances (%.2f%%)\n", limit_ms, proven,
              total, 100.0 * proven / std::max(total, 1));
  std::printf("target (issue 3): most instances with n <= 40, k <= 8 proven within 100 ms: %s\n",
              limit_ms <= 100 && 2 * proven > total ? "met" : "NOT met");
  if (violations > 0) {
    std::printf("%d violations\n", violations);
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "exact_search: %s\n", e.what());
    return 1;
  }
}
