// benchmarks/partial_rollout.cc — partial rollout against draining on a peer's published
// configuration, under the admission and the strict staleness policies.
//
// Usage
//   partial_rollout [--steps N] [--seed S] [--seeds K] [--train-seconds T]
//   Defaults: 10 steps, seed 1, one seed, a trainer step of about 117 s.
//
// Overview
//   The configuration of verl's fully-async recipe (Qwen2.5-Math-7B, 512 prompts × 16
//   samples, responses up to 28,672 tokens, 64 rollout GPUs beside 64 training GPUs):
//   16 engines × 256 concurrent samples, lognormal response lengths with a mean of
//   about 2,000 tokens and σ = 0.9, clipped at 28,672, correlated 0.8 across a prompt's
//   samples, a weight sync of 0.5 s, and a trainer whose step takes about 117 s
//   (seconds_per_cost_unit is scaled from one sync run so that the mean train step
//   is --train-seconds). The 64 rollout GPUs are 16 engines of TP 4: the simulator's
//   default one-GPU 7-8B constants with every time divided by 4.
//   Rows: sync and one_step_off for reference, then async s = 1 and s = 2 with partial
//   rollout and with draining, under each policy. Per row: samples/s, its share of
//   the ideal bound (min(engine, trainer capacity)), trainer idle, restarts, the tokens
//   discarded per token trained and as a share of the tokens generated, the largest
//   sample staleness, and the share of trained tokens older than s.
//   Every row is checked (conservation; strict: staleness <= s; admission: no token
//   discarded); a violation makes the exit status 1. The targets of the partial-rollout
//   issue are printed at the end (PASS/FAIL; not part of the exit status; with --seeds K
//   the table is printed for each of the seeds S .. S + K - 1 and the targets are
//   judged on the means over them, each seed's pair listed): async s = 1
//   with partial rollout at least as fast as draining and at >= 90% of the ideal bound
//   under admission (0 tokens discarded; with over-sampling r = 0.25 for the 90%: at
//   s = 1 a batch without it waits for its longest group), and under strict at most 1%
//   of the generated tokens discarded. Then pause mode abort (the paused samples
//   aborted and dispatched to their engine again) against keep (resumed in place),
//   row for row: the same cost, both prefill prompt and partial tokens again.

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "rlsched/scheduler/orchestrator.h"
#include "rlsched/scheduler/simulator.h"

namespace {

namespace sched = rlsched::scheduler;
using Clock = std::chrono::steady_clock;

constexpr double kIdealTarget = 0.9;
constexpr double kStrictDiscardTarget = 0.01;

struct Row {
  std::string label;
  sched::Mode mode;
  std::int64_t staleness;
  bool partial;
  sched::StalenessPolicy policy;
  double oversample = 0;
  double fraction = 0;     // α of the fraction policy
  bool colocated = false;  // colocated sync on all 128 GPUs (ColocatedBaseline)
  // With partial rollout: paused samples resume on their engine, or are aborted and
  // dispatched to it again.
  sched::PauseMode pause = sched::PauseMode::kKeep;
};

struct Result {
  sched::SimulationReport report;
  double wall_seconds = 0;
  double discarded_per_trained = 0;  // discarded tokens / trained response tokens
  double discarded_share = 0;        // discarded / (trained response + discarded)
  double older_than_s = 0;           // trained response tokens older than s / all
};

sched::SimulatorConfig PeerConfig(std::int64_t steps, std::uint64_t seed) {
  sched::SimulatorConfig config = sched::DefaultSimulatorConfig();
  config.orchestrator.prompts_per_step = 512;
  config.orchestrator.samples_per_prompt = 16;
  config.steps = steps;
  // 64 rollout GPUs as 16 engines of TP 4: the default one-GPU engine's times divided
  // by 4 (weights and KV cache read over 4 GPUs' bandwidth, 4× the compute).
  config.engines = 16;
  config.gpus_per_engine = 4;
  config.engine.max_concurrent = 256;
  config.engine.decode_base_seconds /= 4;
  config.engine.decode_per_sequence_seconds /= 4;
  config.engine.decode_per_context_token_seconds /= 4;
  config.engine.prefill_tokens_per_second *= 4;
  config.step.num_ranks = 64;
  config.step.micro_batch.max_tokens_per_micro_batch = 32768;
  // Mean exp(mu + σ²/2) = 2,000 tokens with σ = 0.9.
  config.lengths.sigma = 0.9;
  config.lengths.mu = std::log(2000.0) - 0.9 * 0.9 / 2.0;
  config.lengths.max_tokens = 28672;
  config.lengths.length_correlation = 0.8;
  config.weight_sync_seconds = 0.5;
  config.dataset_prompts = 512 * 8;
  config.seed = seed;
  return config;
}

Result Run(sched::SimulatorConfig config, const Row& row) {
  if (row.colocated) config = sched::ColocatedBaseline(config).value();
  config.orchestrator.staleness_fraction = row.fraction;
  config.orchestrator.mode = row.mode;
  config.orchestrator.max_staleness = row.staleness;
  config.orchestrator.partial_rollout = row.partial;
  config.orchestrator.staleness_policy = row.policy;
  config.orchestrator.oversample = row.oversample;
  config.orchestrator.pause_mode = row.pause;
  const auto start = Clock::now();
  Result r;
  r.report = sched::Simulate(config);
  r.wall_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const sched::Metrics& m = r.report.metrics;
  std::int64_t trained_tokens = 0;
  std::int64_t old_tokens = 0;
  for (std::size_t k = 0; k < m.token_staleness_histogram.size(); ++k) {
    trained_tokens += m.token_staleness_histogram[k];
    if (static_cast<std::int64_t>(k) > row.staleness) old_tokens += m.token_staleness_histogram[k];
  }
  const double discarded = static_cast<double>(r.report.counters.discarded_tokens);
  if (trained_tokens > 0) {
    r.discarded_per_trained = discarded / static_cast<double>(trained_tokens);
    r.older_than_s = static_cast<double>(old_tokens) / static_cast<double>(trained_tokens);
  }
  if (trained_tokens + r.report.counters.discarded_tokens > 0) {
    r.discarded_share = discarded / (static_cast<double>(trained_tokens) + discarded);
  }
  return r;
}

// Problems with a row: conservation, and its policy's own promise.
std::string Check(const Row& row, const Result& r) {
  const sched::Counters& c = r.report.counters;
  if (c.admitted != c.trained + c.filtered + c.buffered + c.queued + c.in_flight) {
    return "conservation broken";
  }
  const bool strict =
      row.mode != sched::Mode::kAsync || row.policy == sched::StalenessPolicy::kStrict;
  const std::int64_t bound =
      sched::EffectiveStaleness(sched::OrchestratorOptions{{.mode = row.mode,
                                                            .max_staleness = row.staleness,
                                                            .staleness_policy = row.policy,
                                                            .staleness_fraction = row.fraction}});
  if (strict && r.report.metrics.max_staleness > bound) return "staleness above the bound";
  if (!strict && c.stale_discarded_tokens != 0) return "tokens discarded under admission";
  return "";
}

int Main(int argc, char** argv) {
  std::int64_t steps = 10;
  std::uint64_t seed = 1;
  std::int64_t seeds = 1;
  double train_seconds = 117.0;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--steps" && i + 1 < argc) {
      steps = std::atoll(argv[++i]);
    } else if (a == "--seed" && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--seeds" && i + 1 < argc) {
      seeds = std::atoll(argv[++i]);
    } else if (a == "--train-seconds" && i + 1 < argc) {
      train_seconds = std::atof(argv[++i]);
    } else {
      std::fprintf(stderr,
                   "usage: partial_rollout [--steps N] [--seed S] [--seeds K] [--train-seconds "
                   "T]\n");
      return 2;
    }
  }
  if (steps < 1 || seeds < 1 || seeds > 1000 || !(train_seconds > 0)) {
    std::fprintf(stderr,
                 "partial_rollout: --steps and --seeds (<= 1000) must be >= 1, "
                 "--train-seconds > 0\n");
    return 2;
  }
  using P = sched::StalenessPolicy;
  const std::vector<Row> rows = {
      {"sync", sched::Mode::kSync, 0, false, P::kStrict},
      {"one_step_off", sched::Mode::kOneStepOff, 1, false, P::kStrict},
      {"async s=1 partial, admission", sched::Mode::kAsync, 1, true, P::kAdmission},
      {"async s=1 drain, admission", sched::Mode::kAsync, 1, false, P::kAdmission},
      {"async s=1 partial, strict", sched::Mode::kAsync, 1, true, P::kStrict},
      {"async s=1 drain, strict", sched::Mode::kAsync, 1, false, P::kStrict},
      {"async s=2 partial, admission", sched::Mode::kAsync, 2, true, P::kAdmission},
      {"async s=2 drain, admission", sched::Mode::kAsync, 2, false, P::kAdmission},
      {"async s=2 partial, strict", sched::Mode::kAsync, 2, true, P::kStrict},
      {"async s=2 drain, strict", sched::Mode::kAsync, 2, false, P::kStrict},
      {"async s=1 partial, admission, r=0.25", sched::Mode::kAsync, 1, true, P::kAdmission, 0.25},
      {"async s=1 drain, admission, r=0.25", sched::Mode::kAsync, 1, false, P::kAdmission, 0.25},
      {"async s=1 partial, admission, r=0.5", sched::Mode::kAsync, 1, true, P::kAdmission, 0.5},
      {"async s=1 drain, admission, r=0.5", sched::Mode::kAsync, 1, false, P::kAdmission, 0.5},
      {"async s=1 partial, strict, r=0.5", sched::Mode::kAsync, 1, true, P::kStrict, 0.5},
      {"async fraction 0.5, partial", sched::Mode::kAsync, 1, true, P::kFraction, 0, 0.5},
      {"async fraction 0.5, drain", sched::Mode::kAsync, 1, false, P::kFraction, 0, 0.5},
      {"colocated sync, 128 GPUs", sched::Mode::kSync, 0, false, P::kAdmission, 0, 0, true},
      // Pause mode abort: the paused samples are aborted and dispatched to their engine again.
      {"async s=1 abort, admission", sched::Mode::kAsync, 1, true, P::kAdmission, 0, 0, false,
       sched::PauseMode::kAbort},
      {"async s=1 abort, strict", sched::Mode::kAsync, 1, true, P::kStrict, 0, 0, false,
       sched::PauseMode::kAbort},
      {"async s=2 abort, admission", sched::Mode::kAsync, 2, true, P::kAdmission, 0, 0, false,
       sched::PauseMode::kAbort},
      {"async s=1 abort, admission, r=0.25", sched::Mode::kAsync, 1, true, P::kAdmission, 0.25, 0,
       false, sched::PauseMode::kAbort},
  };
  std::vector<std::vector<Result>> runs;  // [seed][row]
  bool ok = true;
  for (std::int64_t k = 0; k < seeds; ++k) {
    const std::uint64_t this_seed = seed + static_cast<std::uint64_t>(k);
    sched::SimulatorConfig config = PeerConfig(steps, this_seed);
    // Calibrate: a sync run's mean train step at the default unit cost, scaled.
    {
      sched::SimulatorConfig probe = config;
      probe.orchestrator.mode = sched::Mode::kSync;
      probe.steps = 2;
      const sched::SimulationReport report = sched::Simulate(probe);
      config.seconds_per_cost_unit *= train_seconds / report.mean_train_seconds;
    }
    std::printf(
        "%sverl fully-async configuration: 16 engines x 256, 512 prompts x 16, lognormal lengths\n"
        "(mean ~2,000, sigma 0.9, max 28,672, correlation 0.8), weight sync 0.5 s, trainer step\n"
        "~%.0f s (seconds_per_cost_unit %.4g), %lld steps, seed %llu\n\n",
        k == 0 ? "" : "\n", train_seconds, config.seconds_per_cost_unit,
        static_cast<long long>(steps), static_cast<unsigned long long>(this_seed));
    std::printf("%-38s %9s %8s %8s %8s %9s %10s %9s %6s %9s %7s\n", "run", "samples/s", "of ideal",
                "tr idle", "eng idle", "restarts", "disc/train", "disc/gen", "max s", "tok > s",
                "wall s");
    std::vector<Result>& results = runs.emplace_back();
    for (const Row& row : rows) {
      results.push_back(Run(config, row));
      const Result& r = results.back();
      const sched::Metrics& m = r.report.metrics;
      std::printf("%-38s %9.2f %7.1f%% %7.1f%% %7.1f%% %9lld %10.3f %8.2f%% %6lld %8.2f%% %7.2f\n",
                  row.label.c_str(), m.samples_per_second,
                  100.0 * m.samples_per_second / r.report.ideal_samples_per_second,
                  100.0 * m.trainer_idle_ratio, 100.0 * m.mean_engine_idle_ratio,
                  static_cast<long long>(r.report.counters.restarts), r.discarded_per_trained,
                  100.0 * r.discarded_share, static_cast<long long>(m.max_staleness),
                  100.0 * r.older_than_s, r.wall_seconds);
      const std::string problem = Check(row, r);
      if (!problem.empty()) {
        ok = false;
        std::printf("  CHECK FAILED: %s\n", problem.c_str());
      }
    }
  }
  // Means over the seeds.
  const auto n = static_cast<double>(seeds);
  auto mean = [&](auto value) {
    double sum = 0;
    for (const std::vector<Result>& results : runs) sum += value(results);
    return sum / n;
  };
  auto rate = [&](std::size_t i) {
    return mean(
        [i](const std::vector<Result>& r) { return r[i].report.metrics.samples_per_second; });
  };
  auto ideal = [&](std::size_t i) {
    return mean([i](const std::vector<Result>& r) {
      return r[i].report.metrics.samples_per_second / r[i].report.ideal_samples_per_second;
    });
  };
  auto discarded = [&](std::size_t i) {
    std::int64_t sum = 0;
    for (const std::vector<Result>& results : runs)
      sum += results[i].report.counters.discarded_tokens;
    return sum;
  };
  auto discarded_share = [&](std::size_t i) {
    return mean([i](const std::vector<Result>& r) { return r[i].discarded_share; });
  };
  // Each seed's samples/s of rows a and b, when there is more than one seed.
  auto pairs_by_seed = [&](std::size_t a, std::size_t b) {
    if (seeds == 1) return;
    std::printf("    by seed:");
    for (std::int64_t k = 0; k < seeds; ++k) {
      const auto& r = runs[static_cast<std::size_t>(k)];
      std::printf(" %.2f/%.2f", r[a].report.metrics.samples_per_second,
                  r[b].report.metrics.samples_per_second);
    }
    std::printf("\n");
  };
  const auto verdict = [](bool met) { return met ? "PASS" : "FAIL"; };
  // Rows 10 and 11: admission with r = 0.25, the over-admission the peers use (verl's
  // staleness_threshold, slime's over-sampling) so that a batch does not wait for its
  // longest group.
  if (seeds == 1) {
    std::printf("\nTargets (async s = 1):\n");
  } else {
    std::printf(
        "\nTargets (async s = 1; samples/s: means over seeds %llu-%llu; tokens and "
        "samples: totals over them):\n",
        static_cast<unsigned long long>(seed),
        static_cast<unsigned long long>(seed + static_cast<std::uint64_t>(seeds) - 1));
  }
  std::printf("  admission, r=0: partial %.2f >= drain %.2f samples/s%39s\n", rate(2), rate(3),
              verdict(rate(2) >= rate(3)));
  pairs_by_seed(2, 3);
  std::printf("  admission, r=0.25: partial %.2f >= drain %.2f samples/s%36s\n", rate(10), rate(11),
              verdict(rate(10) >= rate(11)));
  pairs_by_seed(10, 11);
  std::printf("  admission, r=0.25: partial at %.1f%% of the ideal bound (>= 90%%)%27s\n",
              100 * ideal(10), verdict(ideal(10) >= kIdealTarget));
  std::printf("  admission: %lld tokens discarded, r=0 and 0.25 (0)%42s\n",
              static_cast<long long>(discarded(2) + discarded(10)),
              verdict(discarded(2) + discarded(10) == 0));
  std::printf("  strict: partial %.2f >= drain %.2f samples/s%46s\n", rate(4), rate(5),
              verdict(rate(4) >= rate(5)));
  pairs_by_seed(4, 5);
  std::printf("  strict: partial discards %.2f%% of the generated tokens (<= 1%%)%28s\n",
              100 * discarded_share(4), verdict(discarded_share(4) <= kStrictDiscardTarget));
  std::printf("  fraction 0.5: partial %.2f >= drain %.2f samples/s, %lld tokens discarded%22s\n",
              rate(15), rate(16), static_cast<long long>(discarded(15)),
              verdict(rate(15) >= rate(16) && discarded(15) == 0));
  pairs_by_seed(15, 16);
  std::printf("  async s=1 admission partial over colocated sync on all 128 GPUs: %.2fx\n",
              rate(2) / rate(17));
  // Rows 18-21: pause mode abort against keep (rows 2, 4, 6, 10), same workload.
  std::printf("\nPause mode abort (resubmitted to the engine) against keep (resumed in place):\n");
  const std::size_t pairs[][2] = {{18, 2}, {19, 4}, {20, 6}, {21, 10}};
  for (const auto& [abort_row, keep_row] : pairs) {
    std::int64_t resubmitted = 0;
    for (const std::vector<Result>& results : runs) {
      resubmitted += results[abort_row].report.counters.resubmitted;
    }
    std::printf("  %-36s %.2f vs %.2f samples/s (%.3fx), %lld samples resubmitted\n",
                rows[abort_row].label.c_str(), rate(abort_row), rate(keep_row),
                rate(abort_row) / rate(keep_row), static_cast<long long>(resubmitted));
  }
  if (!ok) std::printf("\nSome checks FAILED (see above).\n");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "partial_rollout: %s\n", e.what());
    return 1;
  }
}
