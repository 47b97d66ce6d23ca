// benchmarks/compare_gaps.cc — how far above the lower bound each partitioner lands.
//
// Usage
//   compare_gaps [DATA_DIR]
//   DATA_DIR holds rollout_lengths_amc23_llama3b.csv (default: the repository's
//   tests/data, fixed at configure time by RLSCHED_BENCHMARK_DATA_DIR). The
//   real-data scenario is skipped, with a note, when the file is missing.
//
// Overview
//   Runs the same inputs through four partitioners:
//     contiguous split   balance::ContiguousSplit (what a framework does unbalanced);
//     LPT                balance::GreedyLpt;
//     KK                 balance::KarmarkarKarp (plain, no fallback, no refinement);
//     KK + refinement    balance::PartitionItems with default options (KK, the LPT
//                        fallback, refinement, and the compressed Partition);
//   and prints per scenario the median and worst gap = max_load / LowerBound - 1, the
//   number of instances solved to the bound, and the mean wall time per call
//   (steady_clock around the call alone). Scenarios:
//     (a)  100 heavy-tailed batches (seeds 1..100), n = 16384, k = 128, any size;
//     (a') the same batches, equal-size (128 items per part);
//     (b)  equal-size, 4 items per part: n = 512, k = 128, seeds 1..100;
//     (c)  equal-size, 16 items per part: n = 2048, k = 128, seeds 1..100;
//     (d)  the real trace (length = prompt_tokens + response_tokens), k = 8 and 64,
//          any size and equal-size;
//     (e)  scenario (a) with the attention cost model of the default ModelShape.
//   Every result is also checked (each item in exactly one part, loads add up, the
//   count constraint, the reported bound and gap, KK + refinement never worse than
//   LPT or plain KK); any violation is printed and makes the exit status 1. The
//   targets of issue 2 are checked at the end.

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <functional>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "rlsched/balance/cost_model.h"
#include "rlsched/balance/partition.h"
#include "rlsched/workload/workload.h"

#ifndef RLSCHED_BENCHMARK_DATA_DIR
#define RLSCHED_BENCHMARK_DATA_DIR "tests/data"
#endif

namespace {

namespace balance = rlsched::balance;
namespace workload = rlsched::workload;
using Clock = std::chrono::steady_clock;

constexpr int kNumSeeds = 100;
constexpr const char* kRealDataFile = "rollout_lengths_amc23_llama3b.csv";
// A single instance is timed over this many calls.
constexpr int kRealDataRepeats = 50;
// At most this many problems are printed per scenario and method.
constexpr std::size_t kMaxProblemsShown = 5;

enum class Method { kContiguous, kLpt, kKarmarkarKarp, kRefined };
constexpr Method kMethods[] = {Method::kContiguous, Method::kLpt, Method::kKarmarkarKarp,
                               Method::kRefined};
constexpr int kNumMethods = 4;

const char* MethodName(Method method) {
  switch (method) {
    case Method::kContiguous:
      return "contiguous split";
    case Method::kLpt:
      return "LPT";
    case Method::kKarmarkarKarp:
      return "KK";
    case Method::kRefined:
      return "KK + refinement";
  }
  return "?";
}

struct Scenario {
  std::string label;  // "(a)"
  std::string title;
  std::vector<std::vector<std::int64_t>> instances;  // the weights of each instance
  std::int64_t num_parts = 1;
  bool equal_size = false;
  int repeats = 1;  // timed calls per instance
};

struct MethodStats {
  std::vector<double> gaps;  // one per instance
  double seconds = 0.0;      // over all timed calls
  std::int64_t calls = 0;
  int optimal = 0;  // instances with max_load == lower bound
  std::vector<std::string> problems;

  double MeanSeconds() const { return calls == 0 ? 0.0 : seconds / static_cast<double>(calls); }
};

struct ScenarioReport {
  MethodStats methods[kNumMethods];
  int refined_worse_than_lpt = 0;
  int refined_worse_than_kk = 0;
  double mean_refine_steps = 0.0;
};

double Gap(std::int64_t max_load, std::int64_t lower_bound) {
  if (lower_bound == 0) return 0.0;
  return static_cast<double>(max_load) / static_cast<double>(lower_bound) - 1.0;
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const std::size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

double Worst(const std::vector<double>& values) {
  return values.empty() ? 0.0 : *std::max_element(values.begin(), values.end());
}

std::string FormatGap(double gap) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.4f%%", 100.0 * gap);
  return buffer;
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

bool CountsBalanced(std::int64_t count, std::int64_t n, std::int64_t num_parts) {
  const std::int64_t low = n / num_parts;
  const std::int64_t high = low + (n % num_parts == 0 ? 0 : 1);
  return count >= low && count <= high;
}

// Checks an assignment and computes its max load. Returns a problem, or "".
std::string CheckAssignment(std::span<const std::int64_t> weights, std::int64_t num_parts,
                            bool check_counts, const balance::Assignment& assignment,
                            std::int64_t& max_load) {
  if (assignment.size() != weights.size()) {
    return "assignment has " + std::to_string(assignment.size()) + " entries for " +
           std::to_string(weights.size()) + " items";
  }
  std::vector<std::int64_t> loads(static_cast<std::size_t>(num_parts), 0);
  std::vector<std::int64_t> counts(static_cast<std::size_t>(num_parts), 0);
  for (std::size_t i = 0; i < weights.size(); ++i) {
    const std::int32_t part = assignment[i];
    if (part < 0 || part >= num_parts) {
      return "item " + std::to_string(i) + " in part " + std::to_string(part);
    }
    loads[static_cast<std::size_t>(part)] += weights[i];
    ++counts[static_cast<std::size_t>(part)];
  }
  if (check_counts) {
    const auto n = static_cast<std::int64_t>(weights.size());
    for (std::int64_t p = 0; p < num_parts; ++p) {
      if (!CountsBalanced(counts[static_cast<std::size_t>(p)], n, num_parts)) {
        return "part " + std::to_string(p) + " holds " +
               std::to_string(counts[static_cast<std::size_t>(p)]) +
               " items (n=" + std::to_string(n) + ", k=" + std::to_string(num_parts) + ")";
      }
    }
  }
  max_load = loads.empty() ? 0 : *std::max_element(loads.begin(), loads.end());
  return "";
}

// Checks every field of a Partition against the weights. Returns a problem, or "".
std::string CheckPartition(std::span<const std::int64_t> weights, std::int64_t num_parts,
                           bool equal_size, std::int64_t lower_bound,
                           const balance::Partition& partition) {
  const auto n = static_cast<std::int64_t>(weights.size());
  const auto k = static_cast<std::size_t>(num_parts);
  if (partition.num_parts() != num_parts || partition.offsets.size() != k + 1 ||
      static_cast<std::int64_t>(partition.indices.size()) != n || partition.offsets[0] != 0 ||
      partition.offsets[k] != n) {
    return "malformed partition: " + std::to_string(partition.loads.size()) + " loads, " +
           std::to_string(partition.offsets.size()) + " offsets, " +
           std::to_string(partition.indices.size()) + " indices";
  }
  std::vector<bool> seen(static_cast<std::size_t>(n), false);
  std::int64_t max_load = 0;
  std::int64_t min_load = 0;
  for (std::int64_t p = 0; p < num_parts; ++p) {
    const std::int64_t begin = partition.offsets[static_cast<std::size_t>(p)];
    const std::int64_t end = partition.offsets[static_cast<std::size_t>(p) + 1];
    if (begin > end) return "offsets decrease at part " + std::to_string(p);
    if (equal_size && !CountsBalanced(end - begin, n, num_parts)) {
      return "part " + std::to_string(p) + " holds " + std::to_string(end - begin) + " items";
    }
    std::int64_t load = 0;
    std::int64_t previous = -1;
    for (std::int64_t index : partition.part(p)) {
      if (index < 0 || index >= n) return "index " + std::to_string(index) + " out of range";
      if (index <= previous) return "part " + std::to_string(p) + " not ascending";
      if (seen[static_cast<std::size_t>(index)]) {
        return "item " + std::to_string(index) + " in two parts";
      }
      seen[static_cast<std::size_t>(index)] = true;
      previous = index;
      load += weights[static_cast<std::size_t>(index)];
    }
    if (load != partition.loads[static_cast<std::size_t>(p)]) {
      return "part " + std::to_string(p) + " load " +
             std::to_string(partition.loads[static_cast<std::size_t>(p)]) + ", items sum to " +
             std::to_string(load);
    }
    max_load = p == 0 ? load : std::max(max_load, load);
    min_load = p == 0 ? load : std::min(min_load, load);
  }
  if (partition.max_load != max_load || partition.min_load != min_load) {
    return "max/min load reported " + std::to_string(partition.max_load) + "/" +
           std::to_string(partition.min_load) + ", actual " + std::to_string(max_load) + "/" +
           std::to_string(min_load);
  }
  if (partition.lower_bound != lower_bound) {
    return "lower bound reported " + std::to_string(partition.lower_bound) +
           ", LowerBound() says " + std::to_string(lower_bound);
  }
  if (std::abs(partition.gap - Gap(max_load, lower_bound)) > 1e-12) {
    return "gap reported " + std::to_string(partition.gap) + ", actual " +
           std::to_string(Gap(max_load, lower_bound));
  }
  if (max_load == lower_bound && !partition.proven_optimal) {
    return "proven_optimal is wrong";  // above the bound only the exact search can prove
  }
  return "";
}

// Runs `method` on one instance `repeats` times (the first call untimed when
// repeats > 1, as a warm-up) and records its gap. Returns the max load, or nullopt.
std::optional<std::int64_t> RunMethod(Method method, std::span<const std::int64_t> weights,
                                      const Scenario& scenario, std::int64_t lower_bound,
                                      std::size_t instance, MethodStats& stats,
                                      std::int64_t& refine_steps) {
  const std::int64_t k = scenario.num_parts;
  const bool eq = scenario.equal_size;
  const int repeats = scenario.repeats;
  // With several calls per instance the first is an untimed warm-up.
  const int timed_calls = repeats == 1 ? 1 : repeats - 1;
  double seconds = 0.0;
  auto time_calls = [&](auto&& fn) {
    if (repeats > 1) fn();
    const Clock::time_point start = Clock::now();
    auto result = fn();
    for (int r = 1; r < timed_calls; ++r) result = fn();
    seconds += std::chrono::duration<double>(Clock::now() - start).count();
    return result;
  };

  std::string problem;
  std::int64_t max_load = 0;
  try {
    if (method == Method::kRefined) {
      balance::PartitionOptions options;
      options.num_parts = k;
      options.equal_size = eq;
      const balance::Partition partition =
          time_calls([&] { return balance::PartitionItems(weights, options); });
      problem = CheckPartition(weights, k, eq, lower_bound, partition);
      max_load = partition.max_load;
      refine_steps = partition.refine_steps;
    } else {
      const balance::Assignment assignment = time_calls([&] {
        switch (method) {
          case Method::kContiguous:
            return balance::ContiguousSplit(static_cast<std::int64_t>(weights.size()), k);
          case Method::kLpt:
            return balance::GreedyLpt(weights, k, eq);
          default:
            return balance::KarmarkarKarp(weights, k, eq);
        }
      });
      const bool check_counts = eq || method == Method::kContiguous;
      problem = CheckAssignment(weights, k, check_counts, assignment, max_load);
    }
  } catch (const std::exception& e) {
    problem = std::string("threw: ") + e.what();
  }
  stats.seconds += seconds;
  stats.calls += timed_calls;
  if (!problem.empty()) {
    stats.problems.push_back("instance " + std::to_string(instance) + ": " + problem);
    return std::nullopt;
  }
  stats.gaps.push_back(Gap(max_load, lower_bound));
  if (max_load == lower_bound) ++stats.optimal;
  return max_load;
}

ScenarioReport RunScenario(const Scenario& scenario) {
  ScenarioReport report;
  std::int64_t total_refine_steps = 0;
  for (std::size_t i = 0; i < scenario.instances.size(); ++i) {
    const std::vector<std::int64_t>& weights = scenario.instances[i];
    const std::int64_t lower_bound =
        balance::LowerBound(weights, scenario.num_parts, scenario.equal_size);
    std::optional<std::int64_t> max_loads[kNumMethods];
    for (int m = 0; m < kNumMethods; ++m) {
      std::int64_t refine_steps = 0;
      max_loads[m] = RunMethod(kMethods[m], weights, scenario, lower_bound, i, report.methods[m],
                               refine_steps);
      total_refine_steps += refine_steps;
    }
    const auto& refined = max_loads[static_cast<int>(Method::kRefined)];
    const auto& lpt = max_loads[static_cast<int>(Method::kLpt)];
    const auto& kk = max_loads[static_cast<int>(Method::kKarmarkarKarp)];
    if (refined && lpt && *refined > *lpt) ++report.refined_worse_than_lpt;
    if (refined && kk && *refined > *kk) ++report.refined_worse_than_kk;
  }
  if (!scenario.instances.empty()) {
    report.mean_refine_steps =
        static_cast<double>(total_refine_steps) / static_cast<double>(scenario.instances.size());
  }
  return report;
}

// Prints the table; returns false when a check failed.
bool PrintReport(const Scenario& scenario, const ScenarioReport& report) {
  std::printf("%s %s\n", scenario.label.c_str(), scenario.title.c_str());
  std::printf("    %-18s %12s %12s %10s %16s\n", "method", "median gap", "worst gap", "at bound",
              "mean time/call");
  bool ok = true;
  for (int m = 0; m < kNumMethods; ++m) {
    const MethodStats& stats = report.methods[m];
    std::printf("    %-18s %12s %12s %6d/%-3zu %16s\n", MethodName(kMethods[m]),
                FormatGap(Median(stats.gaps)).c_str(), FormatGap(Worst(stats.gaps)).c_str(),
                stats.optimal, scenario.instances.size(),
                FormatSeconds(stats.MeanSeconds()).c_str());
  }
  const double lpt_seconds = report.methods[static_cast<int>(Method::kLpt)].MeanSeconds();
  const double refined_seconds = report.methods[static_cast<int>(Method::kRefined)].MeanSeconds();
  std::printf("    time KK + refinement / LPT: %.2fx; mean refinement steps: %.1f\n",
              lpt_seconds > 0 ? refined_seconds / lpt_seconds : 0.0, report.mean_refine_steps);
  for (int m = 0; m < kNumMethods; ++m) {
    const MethodStats& stats = report.methods[m];
    if (stats.problems.empty()) continue;
    ok = false;
    std::printf("    CHECK FAILED: %s: %zu problem(s)\n", MethodName(kMethods[m]),
                stats.problems.size());
    for (std::size_t i = 0; i < stats.problems.size() && i < kMaxProblemsShown; ++i) {
      std::printf("      %s\n", stats.problems[i].c_str());
    }
  }
  if (report.refined_worse_than_lpt > 0 || report.refined_worse_than_kk > 0) {
    ok = false;
    std::printf(
        "    CHECK FAILED: KK + refinement worse than LPT in %d, than KK in %d instance(s)\n",
        report.refined_worse_than_lpt, report.refined_worse_than_kk);
  }
  std::printf("\n");
  return ok;
}

std::vector<std::vector<std::int64_t>> HeavyTailedBatches(std::int64_t n) {
  std::vector<std::vector<std::int64_t>> batches;
  for (int seed = 1; seed <= kNumSeeds; ++seed) {
    batches.push_back(workload::HeavyTailedLengths(n, static_cast<std::uint64_t>(seed)));
  }
  return batches;
}

std::string SeededTitle(std::int64_t n, std::int64_t k, bool equal_size, const char* cost) {
  std::string title = "heavy-tailed, n=" + std::to_string(n) + ", k=" + std::to_string(k) + ", ";
  if (equal_size) {
    title += "equal-size (" + std::to_string(n / k) + " items/part)";
  } else {
    title += "any size";
  }
  title += ", " + std::string(cost) + " cost, " + std::to_string(kNumSeeds) +
           " batches (seeds 1.." + std::to_string(kNumSeeds) + ")";
  return title;
}

std::int64_t ParseField(std::string_view field, const std::string& path, std::int64_t line) {
  while (!field.empty() && (field.back() == '\r' || field.back() == ' ')) field.remove_suffix(1);
  while (!field.empty() && field.front() == ' ') field.remove_prefix(1);
  std::int64_t value = 0;
  const auto [end, error] = std::from_chars(field.data(), field.data() + field.size(), value);
  if (error != std::errc() || end != field.data() + field.size()) {
    throw std::runtime_error(path + ":" + std::to_string(line) + ": not an integer: '" +
                             std::string(field) + "'");
  }
  return value;
}

std::vector<std::string_view> SplitCommas(std::string_view line) {
  std::vector<std::string_view> fields;
  while (true) {
    const std::size_t comma = line.find(',');
    fields.push_back(line.substr(0, comma));
    if (comma == std::string_view::npos) break;
    line.remove_prefix(comma + 1);
  }
  return fields;
}

// Reads a CSV with a header naming prompt_tokens and response_tokens; the length of a
// row is their sum. Returns nullopt when the file cannot be opened; throws when it is
// malformed.
std::optional<std::vector<std::int64_t>> ReadRolloutLengths(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::string line;
  if (!std::getline(in, line)) throw std::runtime_error(path + ": empty file");
  const std::vector<std::string_view> header = SplitCommas(line);
  std::size_t prompt_column = header.size();
  std::size_t response_column = header.size();
  for (std::size_t c = 0; c < header.size(); ++c) {
    std::string_view name = header[c];
    while (!name.empty() && (name.back() == '\r' || name.back() == ' ')) name.remove_suffix(1);
    if (name == "prompt_tokens") prompt_column = c;
    if (name == "response_tokens") response_column = c;
  }
  if (prompt_column == header.size() || response_column == header.size()) {
    throw std::runtime_error(path + ": header lacks prompt_tokens or response_tokens");
  }
  std::vector<std::int64_t> lengths;
  std::int64_t line_number = 1;
  while (std::getline(in, line)) {
    ++line_number;
    if (line.empty() || line == "\r") continue;
    const std::vector<std::string_view> fields = SplitCommas(line);
    if (fields.size() != header.size()) {
      throw std::runtime_error(path + ":" + std::to_string(line_number) + ": expected " +
                               std::to_string(header.size()) + " fields");
    }
    lengths.push_back(ParseField(fields[prompt_column], path, line_number) +
                      ParseField(fields[response_column], path, line_number));
  }
  return lengths;
}

struct TargetCheck {
  std::string what;
  double value;
  double bound;
  const char* relation;  // "<=" or "<"
  std::string (*format)(double);
};

int Main(int argc, char** argv) {
  if (argc > 2 ||
      (argc == 2 && (std::string_view(argv[1]) == "-h" || std::string_view(argv[1]) == "--help"))) {
    std::fprintf(stderr, "usage: %s [DATA_DIR]  (default %s)\n", argv[0],
                 RLSCHED_BENCHMARK_DATA_DIR);
    return 2;
  }
  const std::string data_dir = argc == 2 ? argv[1] : RLSCHED_BENCHMARK_DATA_DIR;

  std::printf(
      "Gap to the lower bound (gap = max_load / LowerBound - 1); times are wall\n"
      "time per call on this machine (steady_clock, single-threaded).\n\n");

  std::vector<Scenario> scenarios;
  const std::vector<std::vector<std::int64_t>> batches_a = HeavyTailedBatches(16384);
  scenarios.push_back({"(a)", SeededTitle(16384, 128, false, "tokens"), batches_a, 128, false});
  scenarios.push_back({"(a')", SeededTitle(16384, 128, true, "tokens"), batches_a, 128, true});
  scenarios.push_back(
      {"(b)", SeededTitle(512, 128, true, "tokens"), HeavyTailedBatches(512), 128, true});
  scenarios.push_back(
      {"(c)", SeededTitle(2048, 128, true, "tokens"), HeavyTailedBatches(2048), 128, true});

  const std::string data_path = data_dir + "/" + kRealDataFile;
  std::optional<std::vector<std::int64_t>> real = ReadRolloutLengths(data_path);
  if (real) {
    for (std::int64_t k : {8, 64}) {
      for (bool eq : {false, true}) {
        std::string title = std::string(kRealDataFile) + ", n=" + std::to_string(real->size()) +
                            ", k=" + std::to_string(k) + ", " + (eq ? "equal-size" : "any size") +
                            ", tokens cost, one instance (" + std::to_string(kRealDataRepeats - 1) +
                            " timed calls)";
        scenarios.push_back({"(d)", title, {*real}, k, eq, kRealDataRepeats});
      }
    }
  }

  const balance::CostModel attention = balance::CostModel::Attention(balance::ModelShape{});
  std::vector<std::vector<std::int64_t>> costs_e;
  for (const std::vector<std::int64_t>& lengths : batches_a) {
    costs_e.push_back(attention.Costs(lengths));
  }
  scenarios.push_back({"(e)",
                       SeededTitle(16384, 128, false, "attention") + "\n    " +
                           attention.Describe() + " (default ModelShape)",
                       std::move(costs_e), 128, false});

  bool ok = true;
  std::vector<ScenarioReport> reports;
  for (std::size_t s = 0; s < scenarios.size(); ++s) {
    if (scenarios[s].label == "(e)" && !real) {
      std::printf("(d) skipped: %s not found\n\n", data_path.c_str());
    }
    reports.push_back(RunScenario(scenarios[s]));
    ok = PrintReport(scenarios[s], reports.back()) && ok;
  }

  // The targets of issue 2, on KK + refinement.
  auto find = [&](const std::string& label) -> const ScenarioReport& {
    for (std::size_t s = 0; s < scenarios.size(); ++s) {
      if (scenarios[s].label == label) return reports[s];
    }
    std::terminate();
  };
  const int refined = static_cast<int>(Method::kRefined);
  const MethodStats& a = find("(a)").methods[refined];
  const MethodStats& b = find("(b)").methods[refined];
  const MethodStats& c = find("(c)").methods[refined];
  auto format_sci = [](double value) {
    char buffer[32];
    std::snprintf(buffer, sizeof(buffer), "%.3g", value);
    return std::string(buffer);
  };
  const TargetCheck checks[] = {
      {"(b) equal-size 4 items/part, median gap", Median(b.gaps), 0.005, "<=", FormatGap},
      {"(c) equal-size 16 items/part, median gap", Median(c.gaps), 0.005, "<=", FormatGap},
      {"(a) n=16384 k=128, worst gap", Worst(a.gaps), 1e-4, "<=", format_sci},
      {"(a) n=16384 k=128, mean time per call", a.MeanSeconds(), 5e-3, "<", FormatSeconds},
  };
  std::printf("Targets of issue 2 (KK + refinement):\n");
  for (const TargetCheck& check : checks) {
    const bool met = std::string_view(check.relation) == "<=" ? check.value <= check.bound
                                                              : check.value < check.bound;
    std::printf("    %-44s %12s  (target %s %s): %s\n", check.what.c_str(),
                check.format(check.value).c_str(), check.relation,
                check.format(check.bound).c_str(), met ? "met" : "NOT MET");
  }
  if (!ok) std::printf("\nSome checks FAILED (see above).\n");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "compare_gaps: %s\n", e.what());
    return 1;
  }
}
