// benchmarks/sim_compare.cc — the orchestrator's modes compared in the simulator on one
// workload, and the targets of issue 6.
//
// Usage
//   sim_compare [--steps N] [--seed S] [--oversample R] [--check 0|1] [--trace PREFIX]
//   Defaults: DefaultSimulatorConfig() (64 engines × 256 concurrent, 64 trainer ranks,
//   512 prompts × 8 samples, heavy-tailed lengths), 10 steps, seed 1, oversample 0.
//   --check 1 checks the core's invariants after every event (slow).
//   --trace writes PREFIX<row>.json (Chrome trace) for every row.
//
// Overview
//   Runs the same workload (same seed, same dataset) in sync, one_step_off, and async
//   (the strict staleness policy) with s = 1 and s = 2, each with and without partial rollout (the
//   option only matters in async), and prints per row: throughput (samples/s), its ratio to sync
//   and to the ideal bound (min(engine, trainer capacity)), trainer idle, mean engine
//   idle, max staleness, partial-rollout ratio, the mean generation and train time of a
//   step, the weight syncs, the events fed to the core and the wall time of the
//   simulation. Every row is checked: conservation (admitted = trained + filtered +
//   buffered + queued + in_flight) and the staleness bound (max staleness <= s); a
//   violation makes the exit status 1. Issue 6's targets are checked at the end and
//   print PASS/FAIL (they do not change the exit status):
//     async s = 1 + partial rollout >= 1.8× sync throughput and >= 90% of the ideal
//     bound, trainer idle < 10%; the staleness bound never exceeded (every row).

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "rlsched/scheduler/orchestrator.h"
#include "rlsched/scheduler/simulator.h"

namespace {

namespace sched = rlsched::scheduler;
using Clock = std::chrono::steady_clock;

constexpr double kSpeedupTarget = 1.8;
constexpr double kIdealTarget = 0.9;
constexpr double kTrainerIdleTarget = 0.1;

struct Row {
  std::string label;
  sched::Mode mode;
  std::int64_t staleness;  // the bound the row must respect
  bool partial;
};

struct Result {
  sched::SimulationReport report;
  double wall_seconds = 0;
};

void Usage() {
  std::fprintf(stderr,
               "usage: sim_compare [--steps N] [--seed S] [--oversample R] [--check 0|1] "
               "[--trace PREFIX]\n");
}

int Main(int argc, char** argv) {
  sched::SimulatorConfig base = sched::DefaultSimulatorConfig();
  std::string trace_prefix;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (i + 1 >= argc) {
      Usage();
      return 2;
    }
    const char* value = argv[++i];
    if (arg == "--steps") {
      base.steps = std::strtoll(value, nullptr, 10);
    } else if (arg == "--seed") {
      base.seed = std::strtoull(value, nullptr, 10);
    } else if (arg == "--oversample") {
      base.orchestrator.oversample = std::strtod(value, nullptr);
    } else if (arg == "--check") {
      base.check_invariants = std::strtol(value, nullptr, 10) != 0;
    } else if (arg == "--trace") {
      trace_prefix = value;
    } else {
      Usage();
      return 2;
    }
  }
  base.trace = !trace_prefix.empty();

  const std::vector<Row> rows = {
      {"sync", sched::Mode::kSync, 0, false},
      {"one_step_off", sched::Mode::kOneStepOff, 1, false},
      {"async s=1", sched::Mode::kAsync, 1, false},
      {"async s=1 +partial", sched::Mode::kAsync, 1, true},
      {"async s=2", sched::Mode::kAsync, 2, false},
      {"async s=2 +partial", sched::Mode::kAsync, 2, true},
  };

  std::printf(
      "workload: %lld engines x %lld concurrent, %lld trainer ranks, %lld prompts x %lld "
      "samples, %lld steps, oversample %.2f, seed %llu\n",
      static_cast<long long>(base.engines), static_cast<long long>(base.engine.max_concurrent),
      static_cast<long long>(base.step.num_ranks),
      static_cast<long long>(base.orchestrator.prompts_per_step),
      static_cast<long long>(base.orchestrator.samples_per_prompt),
      static_cast<long long>(base.steps), base.orchestrator.oversample,
      static_cast<unsigned long long>(base.seed));
  std::printf(
      "lengths: lognormal(mu=%.2f, sigma=%.2f) clipped to %lld, prompts uniform [%lld, %lld], "
      "correlation %.2f\n\n",
      base.lengths.mu, base.lengths.sigma, static_cast<long long>(base.lengths.max_tokens),
      static_cast<long long>(base.lengths.min_prompt_tokens),
      static_cast<long long>(base.lengths.max_prompt_tokens), base.lengths.length_correlation);

  std::vector<Result> results;
  int status = 0;
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const Row& row = rows[r];
    sched::SimulatorConfig config = base;
    config.orchestrator.mode = row.mode;
    config.orchestrator.max_staleness = row.staleness;
    // Issue 6's rows: every trained token within s (the strict policy);
    // benchmarks/partial_rollout compares the policies.
    config.orchestrator.staleness_policy = sched::StalenessPolicy::kStrict;
    config.orchestrator.partial_rollout = row.partial;
    const auto start = Clock::now();
    Result result;
    try {
      result.report = sched::Simulate(config);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "sim_compare: %s: %s\n", row.label.c_str(), e.what());
      return 1;
    }
    result.wall_seconds = std::chrono::duration<double>(Clock::now() - start).count();
    const sched::Counters& c = result.report.counters;
    if (c.admitted != c.trained + c.filtered + c.buffered + c.queued + c.in_flight) {
      std::printf("VIOLATION %s: conservation broken (admitted %lld)\n", row.label.c_str(),
                  static_cast<long long>(c.admitted));
      status = 1;
    }
    if (result.report.metrics.max_staleness > row.staleness) {
      std::printf("VIOLATION %s: max staleness %lld > %lld\n", row.label.c_str(),
                  static_cast<long long>(result.report.metrics.max_staleness),
                  static_cast<long long>(row.staleness));
      status = 1;
    }
    if (!trace_prefix.empty()) {
      const std::string path = trace_prefix + std::to_string(r) + ".json";
      std::ofstream(path) << result.report.trace_json;
    }
    results.push_back(std::move(result));
  }

  const double sync = results[0].report.metrics.samples_per_second;
  std::printf("%-20s %9s %7s %7s %8s %8s %5s %7s %8s %8s %6s %8s %8s\n", "mode", "samples/s",
              "x sync", "%ideal", "tr.idle", "eng.idle", "stale", "partial", "gen s", "train s",
              "syncs", "events", "wall s");
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const sched::SimulationReport& report = results[r].report;
    const sched::Metrics& m = report.metrics;
    std::printf(
        "%-20s %9.3f %7.3f %6.1f%% %7.1f%% %7.1f%% %5lld %6.1f%% %8.1f %8.1f %6lld %8lld %8.3f\n",
        rows[r].label.c_str(), m.samples_per_second, m.samples_per_second / sync,
        100.0 * m.samples_per_second / report.ideal_samples_per_second,
        100.0 * m.trainer_idle_ratio, 100.0 * m.mean_engine_idle_ratio,
        static_cast<long long>(m.max_staleness), 100.0 * m.partial_rollout_ratio,
        report.mean_generation_seconds, report.mean_train_seconds,
        static_cast<long long>(m.weight_syncs), static_cast<long long>(report.events),
        results[r].wall_seconds);
  }
  const sched::SimulationReport& first = results[0].report;
  std::printf(
      "\nideal bound (sync row): engine capacity %.2f samples/s, trainer capacity %.2f "
      "samples/s -> %.2f\n",
      first.engine_capacity_samples_per_second, first.trainer_capacity_samples_per_second,
      first.ideal_samples_per_second);
  std::printf("calibration (sync): mean generation %.2f s / mean train %.2f s = %.3f\n",
              first.mean_generation_seconds, first.mean_train_seconds,
              first.mean_generation_seconds / first.mean_train_seconds);

  // Issue 6's targets, on "async s=1 +partial" (row 3).
  const sched::SimulationReport& target = results[3].report;
  const double speedup = target.metrics.samples_per_second / sync;
  const double of_ideal = target.metrics.samples_per_second / target.ideal_samples_per_second;
  bool bound_kept = true;
  for (std::size_t r = 0; r < rows.size(); ++r) {
    bound_kept = bound_kept && results[r].report.metrics.max_staleness <= rows[r].staleness;
  }
  auto check = [](const char* what, bool ok, double value, const char* bound) {
    std::printf("%-4s %-48s %.4f (%s)\n", ok ? "PASS" : "FAIL", what, value, bound);
  };
  std::printf("\nissue 6 targets (async s=1 + partial rollout):\n");
  check("throughput / sync", speedup >= kSpeedupTarget, speedup, ">= 1.8");
  check("throughput / ideal bound", of_ideal >= kIdealTarget, of_ideal, ">= 0.9");
  check("trainer idle ratio", target.metrics.trainer_idle_ratio < kTrainerIdleTarget,
        target.metrics.trainer_idle_ratio, "< 0.1");
  std::printf("%-4s %-48s\n", bound_kept ? "PASS" : "FAIL",
              "staleness bound never exceeded (every row)");
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sim_compare: %s\n", e.what());
    return 1;
  }
}
