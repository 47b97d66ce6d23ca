#include "simulate_command.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <system_error>
#include <utility>

#include "command_common.h"
#include "flag_errors.h"
#include "format.h"
#include "lengths_reader.h"
#include "rlsched/balance/partition.h"
#include "rlsched/common/error.h"
#include "rlsched/wire/json.h"
#include "rlsched/wire/simulate_convert.h"
#include "serve.h"
#include "simulate_calibrate.h"

namespace rlsched::app {

using namespace ::rlsched::wire;       // NOLINT: the conversions the commands call
using namespace ::rlsched::scheduler;  // NOLINT: the simulator's defaults and speeds
namespace {

constexpr std::string_view kLogNormalPrefix = "lognormal:";
// The simulator's bounds (scheduler/src/simulator.cc and orchestrator.cc validate
// them; the flags state and check the same ranges).
constexpr double kMaxSeconds = 1e9;                             // any time constant
constexpr std::int64_t kMaxConcurrent = std::int64_t{1} << 20;  // engine.max_concurrent
constexpr std::int64_t kMaxStaleness = 1'000'000;               // orchestrator.max_staleness
constexpr double kMaxOversample = 100.0;                        // orchestrator.oversample
constexpr double kMaxStalenessFraction = 1e6;                   // orchestrator.staleness_fraction
constexpr std::int64_t kMaxSamplesPerStep = 10'000'000;         // ceil((1 + r)·P)·G
constexpr std::int64_t kMaxGroupSize = std::int64_t{1} << 20;   // samples_per_prompt
constexpr std::int64_t kMaxGpusPerUnit = 4096;                  // gpus_per_engine, _trainer_rank
constexpr double kMaxMu = 100.0;                                // lengths.mu in [-100, 100]
constexpr double kMaxSigma = 20.0;                              // lengths.sigma in [0, 20]
constexpr double kMaxSingleTokensPerSecond = 1e12;              // decode_speed
// The largest --config file read: the daemon's default cap on a request.
constexpr std::int64_t kMaxInputFileBytes = kDefaultMaxMessageBytes;

// The flag that sets a field of the config (path relative to the SimulatorConfig).
std::vector<FlagField> FlagFields(const SimulateArgs& args) {
  return {
      {"--mode", "orchestrator.mode", args.mode.has_value()},
      {"--max-staleness", "orchestrator.max_staleness", args.max_staleness.has_value()},
      {"--partial-rollout", "orchestrator.partial_rollout", args.partial_rollout.has_value()},
      {"--pause-mode", "orchestrator.pause_mode", args.pause_mode.has_value()},
      {"--staleness-policy", "orchestrator.staleness_policy", args.staleness_policy.has_value()},
      {"--staleness-fraction", "orchestrator.staleness_fraction",
       args.staleness_fraction.has_value()},
      {"--train-calls-per-sync", "orchestrator.train_calls_per_sync",
       args.train_calls_per_sync.has_value()},
      {"--colocated", "orchestrator.colocated", args.colocated},
      {"--oversample", "orchestrator.oversample", args.oversample.has_value()},
      {"--prompts-per-step", "orchestrator.prompts_per_step", args.prompts_per_step.has_value()},
      {"--samples-per-prompt", "orchestrator.samples_per_prompt",
       args.samples_per_prompt.has_value()},
      {"--filter-all-equal", "orchestrator.filter_all_equal", args.filter_all_equal},
      {"--dispatch", "orchestrator.longest_first", !args.dispatch.empty()},
      {"--engine-split", "orchestrator.even_split", !args.engine_split.empty()},
      {"--max-generating-groups", "orchestrator.max_generating_groups",
       args.max_generating_groups.has_value()},
      {"--warmup-steps", "orchestrator.warmup_steps", args.warmup_steps.has_value()},
      {"--engines", "engines", args.engines.has_value()},
      {"--engine-concurrency", "engine.max_concurrent", args.engine_concurrency.has_value()},
      {"--engine-kv-cache-tokens", "engine.kv_cache_tokens",
       args.engine_kv_cache_tokens.has_value()},
      {"--trainer-scaling-exponent", "trainer_scaling_exponent",
       args.trainer_scaling_exponent.has_value()},
      {"--trainer-reference-ranks", "trainer_reference_ranks",
       args.trainer_reference_ranks.has_value()},
      {"--trainer-offload-seconds", "trainer_offload_seconds",
       args.trainer_offload_seconds.has_value()},
      {"--engine-tokens-per-second", "decode_speed", !args.engine_tokens_per_second.empty()},
      {"--gpus-per-engine", "gpus_per_engine", args.gpus_per_engine.has_value()},
      {"--trainer-ranks", "trainer_ranks", args.trainer_ranks.has_value()},
      {"--gpus-per-trainer-rank", "gpus_per_trainer_rank", args.gpus_per_trainer_rank.has_value()},
      {"--train-seconds-per-step", "train_seconds_per_step",
       args.train_seconds_per_step.has_value()},
      {"--train-call-overhead-seconds", "train_call_overhead_seconds",
       args.train_call_overhead_seconds.has_value()},
      {"--steps", "steps", args.steps.has_value()},
      {"--lengths", "lengths.lengths", !args.lengths.empty()},
      {"--length-dist", "lengths.mu", !args.length_dist.empty()},
      {"--length-dist", "lengths.sigma", !args.length_dist.empty()},
      {"--length-dist", "lengths.max_tokens", !args.length_dist.empty()},
      {"--all-equal-rate", "all_equal_rate", args.all_equal_rate.has_value()},
      {"--seed", "seed", args.seed.has_value()},
      {"--weight-sync-seconds", "weight_sync_seconds", args.weight_sync_seconds.has_value()},
      {"--release-seconds", "release_seconds", args.release_seconds.has_value()},
      {"--resume-seconds", "resume_seconds", args.resume_seconds.has_value()},
      {"--mtbf", "engine_mtbf_seconds", args.mtbf.has_value()},
      {"--max-events", "max_events", args.max_events.has_value()},
      {.flag = "--trace-run", .path = "trace_run", .name_field = false},
  };
}

std::string FormatRate(double value) { return fmt::format("{:.2f}", value); }

std::string DescribePartial(const v1::OrchestratorOptions& o) {
  if (!o.partial_rollout()) return "no partial rollout (engines drain, then sync)";
  return o.pause_mode() == v1::PAUSE_MODE_ABORT
             ? "partial rollout (abort at a sync, resubmit after it)"
             : "partial rollout (interrupt and resume at a sync)";
}

std::string DescribeMode(const v1::SimulatorConfig& config) {
  const v1::OrchestratorOptions& o = config.orchestrator();
  switch (o.mode()) {
    case v1::ORCHESTRATOR_MODE_SYNC:
      if (o.colocated()) {
        return fmt::format(
            "sync, colocated (engines and trainer take turns on the same GPUs; per engine: "
            "release {}, resume {} before its weight sync)",
            FormatDuration(config.release_seconds()), FormatDuration(config.resume_seconds()));
      }
      return "sync";
    case v1::ORCHESTRATOR_MODE_ONE_STEP_OFF:
      return "one_step_off (staleness <= 1, weights synced between batches)";
    case v1::ORCHESTRATOR_MODE_ASYNC:
      if (o.staleness_policy() == v1::STALENESS_POLICY_FRACTION) {
        return fmt::format(
            "async, staleness fraction α {:g} (generation at most {} batch{} ahead), {}, fraction "
            "policy (at most (1 + α)·P groups started per policy version, every generated token "
            "kept)",
            o.staleness_fraction(), o.max_staleness(), o.max_staleness() == 1 ? "" : "es",
            DescribePartial(o));
      }
      return fmt::format(
          "async, max staleness {}, {}, {}", o.max_staleness(), DescribePartial(o),
          o.staleness_policy() == v1::STALENESS_POLICY_STRICT
              ? "strict policy (tokens staler than s are discarded and generated again)"
              : "admission policy (every generated token kept)");
    default:
      return "?";
  }
}

std::string DescribeLengths(const v1::LengthDistribution& lengths) {
  std::string text;
  if (lengths.lengths_size() > 0) {
    text = fmt::format("response lengths drawn from {} given lengths", lengths.lengths_size());
  } else {
    text = fmt::format("response lengths lognormal (μ {}, σ {}), at most {} tokens", lengths.mu(),
                       lengths.sigma(), lengths.max_tokens());
  }
  text += fmt::format(
      "; prompts {}–{} tokens; correlation ρ {} across a prompt's samples and "
      "epochs",
      lengths.min_prompt_tokens(), lengths.max_prompt_tokens(), lengths.length_correlation());
  return text;
}

void Line(std::ostream& out, std::string_view label, const std::string& value) {
  out << fmt::format("{:<17}{}\n", label, value);
}

// Colocated, the engines and the trainer ranks take turns on the same GPUs: counted once.
std::string DescribeGpus(const v1::SimulatorConfig& config) {
  const std::int64_t engines = config.engines() * config.gpus_per_engine();
  const std::int64_t trainer = config.trainer_ranks() * config.gpus_per_trainer_rank();
  const std::string parts =
      fmt::format("{} engines × {}{}{} trainer ranks × {}", config.engines(),
                  config.gpus_per_engine(), config.orchestrator().colocated() ? " and " : " + ",
                  config.trainer_ranks(), config.gpus_per_trainer_rank());
  if (!config.orchestrator().colocated()) return fmt::format("{} = {}", engines + trainer, parts);
  return fmt::format("{} shared by {} (colocated: they take turns)", std::max(engines, trainer),
                     parts);
}

// The workload and the models of `run`, and the trainer's mean seconds per step it
// measured; the mode too unless `with_mode` is false (--compare).
void PrintConfig(const v1::SimulationRun& run, bool with_mode, std::ostream& out) {
  const v1::SimulatorConfig& config = run.config();
  const v1::OrchestratorOptions& o = config.orchestrator();
  if (with_mode) Line(out, "mode", DescribeMode(config));
  std::string engines =
      fmt::format("{} × {} concurrent samples", config.engines(), config.engine().max_concurrent());
  if (config.gpus_per_engine() > 1)
    engines += fmt::format(" on {} GPUs each", config.gpus_per_engine());
  if (config.engine().kv_cache_tokens() > 0) {
    engines += fmt::format(" (KV cache of {} tokens; {} preemptions)",
                           config.engine().kv_cache_tokens(), run.report().preemptions());
  }
  engines += fmt::format("; decode {:.4g} tokens/s alone, {:.4g} tokens/s at full concurrency",
                         config.decode_speed().single_tokens_per_second(),
                         config.decode_speed().full_tokens_per_second());
  engines +=
      fmt::format("; weight sync {} per engine", FormatDuration(config.weight_sync_seconds()));
  if (config.engine_mtbf_seconds() > 0) {
    engines += fmt::format("; failures: MTBF {}, rejoin after {}",
                           FormatDuration(config.engine_mtbf_seconds()),
                           FormatDuration(config.rejoin_seconds()));
  }
  Line(out, "engines", engines);
  const v1::StepPlanOptions& step = config.step();
  std::string trainer = fmt::format("{} ranks", config.trainer_ranks());
  if (config.gpus_per_trainer_rank() > 1) {
    trainer += fmt::format(" on {} GPUs each", config.gpus_per_trainer_rank());
  }
  trainer += fmt::format("; mean {} per step", FormatDuration(run.report().mean_train_seconds()));
  std::vector<std::string> inside;
  if (config.train_call_overhead_seconds() > 0) {
    inside.push_back(fmt::format("{} per call is fixed (train_call_overhead_seconds)",
                                 FormatDuration(config.train_call_overhead_seconds())));
  }
  if (config.trainer_offload_seconds() > 0) {
    inside.push_back(fmt::format("{} the offload (trainer_offload_seconds)",
                                 FormatDuration(config.trainer_offload_seconds())));
  }
  if (!inside.empty()) trainer += fmt::format(", of which {}", fmt::join(inside, " and "));
  if (config.trainer_reference_ranks() > 0 && config.trainer_scaling_exponent() != 1) {
    trainer += fmt::format("; scaling as ranks^-{:g} from {} ranks",
                           config.trainer_scaling_exponent(), config.trainer_reference_ranks());
  }
  trainer += fmt::format(
      "; micro-batches of at most {} tokens, {} pipeline stage{}; {:g} s per "
      "cost unit",
      step.max_tokens_per_micro_batch(), step.pipeline_stages(),
      step.pipeline_stages() == 1 ? "" : "s", config.seconds_per_cost_unit());
  Line(out, "trainer", trainer);
  Line(out, "GPUs", DescribeGpus(config));
  std::string batch =
      fmt::format("{} prompts × {} samples", o.prompts_per_step(), o.samples_per_prompt());
  if (o.oversample() > 0) batch += fmt::format(", over-sampling {}", FormatPercent(o.oversample()));
  if (o.train_calls_per_sync() > 1) {
    batch += fmt::format(", streamed: {} trainer calls of {} prompts per weight sync",
                         o.train_calls_per_sync(), o.prompts_per_step() / o.train_calls_per_sync());
  }
  batch +=
      fmt::format("; {} steps; dataset of {} prompts", config.steps(), config.dataset_prompts());
  Line(out, "batch", batch);
  Line(out, "lengths", DescribeLengths(config.lengths()));
  std::string rewards =
      fmt::format("all equal in {} of groups", FormatPercent(config.all_equal_rate()));
  if (o.filter_all_equal()) rewards += "; such groups are filtered (dynamic sampling)";
  Line(out, "rewards", rewards);
  Line(out, "seed", fmt::format("{}", config.seed()));
}

// Staleness k: trained samples whose oldest token is k versions old, and trained
// response tokens that are.
void PrintStaleness(const v1::OrchestratorMetrics& metrics, std::ostream& out) {
  std::int64_t samples = 0;
  std::int64_t tokens = 0;
  for (const std::int64_t count : metrics.staleness_histogram()) samples += count;
  for (const std::int64_t count : metrics.token_staleness_histogram()) tokens += count;
  const int rows =
      std::max(metrics.staleness_histogram_size(), metrics.token_staleness_histogram_size());
  auto at = [](const auto& histogram, int k) {
    return k < histogram.size() ? histogram.Get(k) : std::int64_t{0};
  };
  std::size_t width = 7;
  for (int k = 0; k < rows; ++k) {
    width = std::max({width, Digits(at(metrics.staleness_histogram(), k)),
                      Digits(at(metrics.token_staleness_histogram(), k))});
  }
  auto share = [](std::int64_t part, std::int64_t whole) {
    return FormatPercent(whole > 0 ? static_cast<double>(part) / static_cast<double>(whole) : 0.0);
  };
  out << fmt::format("{:>9}  {:>{}}  {:>6}  {:>{}}  {:>6}\n", "staleness", "samples", width,
                     "share", "tokens", width, "share");
  for (int k = 0; k < rows; ++k) {
    const std::int64_t s = at(metrics.staleness_histogram(), k);
    const std::int64_t t = at(metrics.token_staleness_histogram(), k);
    out << fmt::format("{:>9}  {:>{}}  {:>6}  {:>{}}  {:>6}\n", k, s, width, share(s, samples), t,
                       width, share(t, tokens));
  }
  if (rows == 0) out << "(no sample trained)\n";
}

std::string DescribeIdeal(const v1::SimulationReport& report) {
  return fmt::format("{} samples/s = min(engine capacity {}, trainer capacity {})",
                     FormatRate(report.ideal_samples_per_second()),
                     FormatRate(report.engine_capacity_samples_per_second()),
                     FormatRate(report.trainer_capacity_samples_per_second()));
}

double Ratio(double a, double b) { return b > 0.0 ? a / b : 0.0; }

// The per-step figures: the engines' own generation, the trainer's, and in sync mode the
// switch between them (they add up to the step).
std::string DescribeElapsed(const v1::SimulationRun& run) {
  const v1::OrchestratorMetrics& metrics = run.report().metrics();
  std::string text = fmt::format(
      "{} (virtual) for {} steps; per step {}: generation {} (the engines'), training {}",
      FormatDuration(metrics.elapsed_seconds()), run.report().counters().steps_finished(),
      FormatDuration(metrics.seconds_per_step()),
      FormatDuration(metrics.generation_seconds_per_step()),
      FormatDuration(metrics.train_seconds_per_step()));
  if (run.config().orchestrator().mode() == v1::ORCHESTRATOR_MODE_SYNC) {
    text += fmt::format(", switch {} ({})", FormatDuration(metrics.switch_seconds_per_step()),
                        run.config().orchestrator().colocated() ? "release, resume and weight sync"
                                                                : "weight sync");
  }
  return text;
}

std::string DescribeSteady(const v1::SimulationRun& run) {
  const v1::OrchestratorMetrics& metrics = run.report().metrics();
  const std::int64_t warmup = run.config().orchestrator().warmup_steps();
  if (metrics.steady_seconds_per_step() <= 0) {
    return fmt::format("no step past the {} warm-up step{} (--warmup-steps)", warmup,
                       warmup == 1 ? "" : "s");
  }
  return fmt::format("{} per step after {} warm-up step{} (--warmup-steps)",
                     FormatDuration(metrics.steady_seconds_per_step()), warmup,
                     warmup == 1 ? "" : "s");
}

void PrintRunSummary(const v1::SimulationRun& run, std::ostream& out) {
  const v1::SimulationReport& report = run.report();
  const v1::OrchestratorMetrics& metrics = report.metrics();
  const v1::OrchestratorCounters& counters = report.counters();
  PrintConfig(run, /*with_mode=*/true, out);
  out << '\n';
  Line(out, "throughput",
       fmt::format("{} samples/s, {:.0f} tokens/s", FormatRate(metrics.samples_per_second()),
                   metrics.tokens_per_second()));
  Line(out, "ideal bound",
       fmt::format(
           "{}; reached {}", DescribeIdeal(report),
           FormatPercent(Ratio(metrics.samples_per_second(), report.ideal_samples_per_second()))));
  Line(out, "elapsed", DescribeElapsed(run));
  Line(out, "steady state", DescribeSteady(run));
  Line(out, "trainer idle",
       fmt::format("{}; per step {} of {} waiting for a batch",
                   FormatPercent(metrics.trainer_idle_ratio()),
                   FormatDuration(metrics.trainer_wait_seconds_per_step()),
                   FormatDuration(metrics.seconds_per_step())));
  std::string engine_idle = FormatPercent(metrics.mean_engine_idle_ratio());
  if (metrics.engine_idle_ratio_size() > 0) {
    const auto [min, max] =
        std::minmax_element(metrics.engine_idle_ratio().begin(), metrics.engine_idle_ratio().end());
    engine_idle += fmt::format(" mean (min {}, max {} over {} engines)", FormatPercent(*min),
                               FormatPercent(*max), metrics.engine_idle_ratio_size());
  }
  Line(out, "engine idle", engine_idle);
  Line(out, "weight syncs",
       fmt::format("{} (per engine), {} each, {} in all", metrics.weight_syncs(),
                   FormatDuration(metrics.seconds_per_weight_sync()),
                   FormatDuration(metrics.weight_sync_seconds())));
  Line(out, "partial rollout",
       fmt::format("{} of trained samples ({} samples with tokens of more than one version)",
                   FormatPercent(metrics.partial_rollout_ratio()), counters.partial_samples()) +
           (counters.resubmitted() > 0
                ? fmt::format("; {} aborted samples resubmitted (pause mode abort)",
                              counters.resubmitted())
                : std::string()));
  Line(out, "restarts",
       fmt::format("{} samples regenerated, {} tokens discarded ({} samples and {} tokens for "
                   "staleness, the rest by {} engine failures)",
                   counters.restarts(), counters.discarded_tokens(), counters.stale_restarts(),
                   counters.stale_discarded_tokens(), counters.engine_failures()));
  Line(out, "samples",
       fmt::format("admitted {} = trained {} + filtered {} + buffered {} + queued {} + in "
                   "flight {}",
                   counters.admitted(), counters.trained(), counters.filtered(),
                   counters.buffered(), counters.queued(), counters.in_flight()));
  Line(out, "groups",
       fmt::format("admitted {}, trained {}, filtered {}", counters.admitted_groups(),
                   counters.trained_groups(), counters.filtered_groups()));
  Line(out, "events", fmt::format("{}", report.events()));
  out << '\n';
  PrintStaleness(metrics, out);
}

void PrintComparison(const v1::SimulateReply& reply, std::ostream& out) {
  // The config and the ideal bound are the sync run's (colocated_sync, when it runs,
  // has other engine and rank counts: its own note below).
  const v1::SimulationRun* colocated = nullptr;
  const v1::SimulationRun* sync = &reply.runs(0);
  for (const v1::SimulationRun& run : reply.runs()) {
    if (run.name() == kColocatedRunName) colocated = &run;
    if (run.name() == "sync") sync = &run;
  }
  PrintConfig(*sync, /*with_mode=*/false, out);
  Line(out, "ideal bound", DescribeIdeal(sync->report()));
  out << '\n';
  const double sync_rate = sync->report().metrics().samples_per_second();
  const std::vector<std::string> header = {
      "run",        "mode",         "staleness",   "partial",       "samples/s",     "× sync",
      "% of ideal", "trainer idle", "engine idle", "max staleness", "partial ratio", "restarts"};
  std::vector<std::vector<std::string>> rows;
  for (const v1::SimulationRun& run : reply.runs()) {
    const v1::OrchestratorOptions& o = run.config().orchestrator();
    const v1::SimulationReport& report = run.report();
    const v1::OrchestratorMetrics& metrics = report.metrics();
    const bool async = o.mode() == v1::ORCHESTRATOR_MODE_ASYNC;
    std::string mode = "?";
    if (o.mode() == v1::ORCHESTRATOR_MODE_SYNC) mode = o.colocated() ? "sync, colocated" : "sync";
    if (o.mode() == v1::ORCHESTRATOR_MODE_ONE_STEP_OFF) mode = "one_step_off";
    if (async) mode = "async";
    const std::int64_t bound = o.mode() == v1::ORCHESTRATOR_MODE_SYNC           ? 0
                               : o.mode() == v1::ORCHESTRATOR_MODE_ONE_STEP_OFF ? 1
                                                                                : o.max_staleness();
    rows.push_back({
        run.name(),
        mode,
        fmt::format("{}", bound),
        async ? (!o.partial_rollout()                     ? "no"
                 : o.pause_mode() == v1::PAUSE_MODE_ABORT ? "abort"
                                                          : "yes")
              : "-",
        FormatRate(metrics.samples_per_second()),
        fmt::format("{:.2f}", Ratio(metrics.samples_per_second(), sync_rate)),
        FormatPercent(Ratio(metrics.samples_per_second(), report.ideal_samples_per_second())),
        FormatPercent(metrics.trainer_idle_ratio()),
        FormatPercent(metrics.mean_engine_idle_ratio()),
        fmt::format("{}", metrics.max_staleness()),
        FormatPercent(metrics.partial_rollout_ratio()),
        fmt::format("{}", report.counters().restarts()),
    });
  }
  // Display widths: "×" is one column but two bytes.
  const auto width = [](const std::string& text) {
    std::size_t columns = 0;
    for (const char c : text) columns += (static_cast<unsigned char>(c) & 0xC0) != 0x80 ? 1 : 0;
    return columns;
  };
  std::vector<std::size_t> widths(header.size());
  for (std::size_t c = 0; c < header.size(); ++c) widths[c] = width(header[c]);
  for (const auto& row : rows) {
    for (std::size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], width(row[c]));
  }
  const auto print_row = [&](const std::vector<std::string>& row) {
    std::string line;
    for (std::size_t c = 0; c < row.size(); ++c) {
      const std::string pad(widths[c] - width(row[c]), ' ');
      if (c > 0) line += "  ";
      line += c < 2 ? row[c] + pad : pad + row[c];  // names left, numbers right
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out << line << '\n';
  };
  print_row(header);
  for (const auto& row : rows) print_row(row);
  const v1::SimulatorConfig& base = sync->config();
  const std::int64_t gpus =
      base.engines() * base.gpus_per_engine() + base.trainer_ranks() * base.gpus_per_trainer_rank();
  if (colocated != nullptr) {
    const v1::SimulatorConfig& c = colocated->config();
    out << fmt::format(
        "\n{}: sync on the same {} GPUs, engines and trainer taking turns: {} engines and {} "
        "trainer ranks; per engine release {}, resume {}.\n",
        kColocatedRunName, gpus, c.engines(), c.trainer_ranks(),
        FormatDuration(c.release_seconds()), FormatDuration(c.resume_seconds()));
  } else {
    out << fmt::format(
        "\nnote: no {} run: the {} GPUs ({} engines × {} + {} trainer ranks × {}) do not divide "
        "into engines of {} GPU{} and trainer ranks of {} GPU{}.\n",
        kColocatedRunName, gpus, base.engines(), base.gpus_per_engine(), base.trainer_ranks(),
        base.gpus_per_trainer_rank(), base.gpus_per_engine(),
        base.gpus_per_engine() == 1 ? "" : "s", base.gpus_per_trainer_rank(),
        base.gpus_per_trainer_rank() == 1 ? "" : "s");
  }
  out << "\npartial ratio: trained samples with tokens of more than one policy version (a\n"
         "generation interrupted by a weight sync and resumed); it stays small when batches\n"
         "close before the trainer produces new weights. restarts: samples whose tokens were\n"
         "discarded and generated again (failed engines, or the strict staleness policy).\n"
         "max staleness: of any trained sample's oldest token; under the admission policy\n"
         "(the async default) every token is kept, so a long sample may exceed s.\n";
}

// The comparison runs' names, "a, b, c".
std::string ComparisonRunNames() {
  std::string names;
  for (const ComparisonRun& run : ComparisonRuns()) {
    names += fmt::format("{}{}", names.empty() ? "" : ", ", run.name);
  }
  return names;
}

std::string SimulateFooter(const SimulatorConfig& defaults) {
  const OrchestratorPolicy& d = defaults.orchestrator;
  return fmt::format(
      "Defaults: {} engines of {} concurrent samples, {} trainer ranks, {} prompts × {} samples, "
      "{} steps, heavy-tailed lengths, sync mode; --config FILE sets any field of the "
      "rlsched.v1.SimulatorConfig (orchestrator.proto) in protobuf's JSON mapping, unset fields "
      "keep "
      "the defaults, and flags given explicitly override the file.\n"
      "--max-staleness, --partial-rollout, --staleness-policy and --staleness-fraction are "
      "async mode's (in the file too: orchestrator.max_staleness, …): without a mode they "
      "select async (--staleness-fraction with the fraction policy); sync (staleness 0) and "
      "one_step_off (staleness 1) never interrupt a generation and refuse other values. "
      "--colocated is sync's: it selects sync and refuses the other modes. --compare sets "
      "the mode, staleness, policy and partial rollout of each run and refuses them.\n"
      "--engine-tokens-per-second and --train-seconds-per-step give the speeds in the units "
      "users measure; they override the file's engine.decode_base_seconds, "
      "engine.decode_per_sequence_seconds and seconds_per_cost_unit.\n"
      "--lengths FILE: integers separated by whitespace, or a CSV with a header: the "
      "response_tokens column when there is one, else the length or tokens column (prompt "
      "lengths keep the config's range).\n"
      "--compare runs {} (colocated sync on the same GPUs, when they divide into engines of "
      "--gpus-per-engine and ranks of --gpus-per-trainer-rank), then {} on the same workload "
      "and seed; --trace then writes the trace of --trace-run (default {}).\n"
      "Output: a summary, or with --json the rlsched.v1.SimulateReply in protobuf's JSON "
      "mapping (proto field names; int64 values are strings; no trace).",
      defaults.engines, defaults.engine.max_concurrent, defaults.step.num_ranks, d.prompts_per_step,
      d.samples_per_prompt, defaults.steps, kColocatedRunName, ComparisonRunNames(),
      kDefaultTraceRun);
}

// The options --compare sets for each of its runs (it refuses them).
struct ModeOptions {
  CLI::Option* mode;
  CLI::Option* staleness;
  CLI::Option* partial;
  CLI::Option* no_partial;
};

// The mode and its staleness policy, partial rollout and pause mode.
ModeOptions AddModeOptions(CLI::App& command, SimulateArgs& args, const OrchestratorPolicy& d) {
  ModeOptions options{};
  options.mode =
      command
          .add_option("--mode", args.mode,
                      fmt::format("Orchestrator mode (default: {}; async when --max-staleness or "
                                  "--partial-rollout is given, or --staleness-policy or "
                                  "--staleness-fraction; sync with --colocated)",
                                  ModeName(d.mode)))
          ->type_name("sync|one_step_off|async")
          ->check(CLI::IsMember({"sync", "one_step_off", "async"}).description(""));
  options.staleness =
      AddBoundedOption(command, "--max-staleness", args.max_staleness,
                       "Staleness bound s of async mode, in policy versions (train steps); "
                       "implies --mode async; 0 behaves as sync.",
                       IntegerRange{0, kMaxStaleness}, fmt::format("{}", d.max_staleness))
          ->type_name("S");
  options.partial = command.add_flag_function(
      "--partial-rollout", [&args](std::int64_t count) { args.partial_rollout = count > 0; },
      fmt::format("Async mode: interrupt generations at a weight sync and resume them under the "
                  "new weights; implies --mode async (default: {} in async mode)",
                  d.partial_rollout ? "on" : "off"));
  options.no_partial = command.add_flag_function(
      "--no-partial-rollout", [&args](std::int64_t) { args.partial_rollout = false; },
      "Async mode without partial rollout: engines drain, then sync (= --partial-rollout=false); "
      "implies --mode async");
  options.no_partial->excludes(options.partial);
  command
      .add_option("--pause-mode", args.pause_mode,
                  "Async mode with partial rollout: what a weight sync does with an engine's "
                  "running samples: keep (default: paused on the engine, resumed there) or "
                  "abort (aborted with their tokens reported, then dispatched to the same "
                  "engine again from them; for engines that cannot hold a request across a "
                  "weight update); "
                  "implies --mode async")
      ->type_name("keep|abort")
      ->check(CLI::IsMember({"keep", "abort"}).description(""));
  command
      .add_option(
          "--staleness-policy", args.staleness_policy,
          "Async mode: admission (default: generation at most s batches ahead, every token "
          "kept; the per-token staleness is reported), fraction (verl's staleness_threshold, "
          "see --staleness-fraction) or strict (tokens staler than s are discarded and "
          "generated again); implies --mode async")
      ->type_name("admission|fraction|strict")
      ->check(CLI::IsMember({"admission", "fraction", "strict"}).description(""));
  AddBoundedOption(command, "--staleness-fraction", args.staleness_fraction,
                   "Async mode's fraction policy α, a real number (verl's staleness_threshold): "
                   "at most (1 + α)·P groups start per policy version, so at most ⌈α·P⌉ groups "
                   "of a batch carry older tokens, and generation runs at most ⌈α⌉ batches "
                   "ahead; nothing is discarded. Implies --mode async --staleness-policy "
                   "fraction; not with --max-staleness.",
                   RealRange{0.0, kMaxStalenessFraction}, fmt::format("{:g}", d.staleness_fraction))
      ->type_name("A");
  return options;
}

// Streaming, colocation and over-sampling: how batches reach the trainer.
void AddBatchOptions(CLI::App& command, SimulateArgs& args, const SimulatorConfig& defaults) {
  const OrchestratorPolicy& d = defaults.orchestrator;
  command
      .add_option("--train-calls-per-sync", args.train_calls_per_sync,
                  fmt::format("Streaming (verl's trigger_parameter_sync_step): trainer calls per "
                              "weight sync K, a divisor of --prompts-per-step; each call trains "
                              "P/K prompts as soon as they are complete, the engines get new "
                              "weights after the K-th. {}",
                              RangeHelp(IntegerRangeText(1, kInt64Max) +
                                            ", a divisor of --prompts-per-step",
                                        fmt::format("{}", d.train_calls_per_sync))))
      ->type_name("K")
      ->check(IntegerIn(1, kInt64Max));
  command.add_flag(
      "--colocated", args.colocated,
      fmt::format("Sync mode with engines and trainer taking turns on the same GPUs: a closed "
                  "batch releases the engines, the trainer runs, the engines resume with the "
                  "new weights; implies --mode sync (default: {})",
                  d.colocated ? "on" : "off"));
  AddBoundedOption(command, "--release-seconds", args.release_seconds,
                   "Colocated: seconds an engine takes to free its GPU memory for the trainer; "
                   "needs --colocated or --compare.",
                   RealRange{0.0, kMaxSeconds}, fmt::format("{:g}", defaults.release_seconds))
      ->type_name("SECONDS");
  AddBoundedOption(command, "--resume-seconds", args.resume_seconds,
                   "Colocated: seconds an engine takes to take its GPU memory back, before "
                   "loading the new weights; needs --colocated or --compare.",
                   RealRange{0.0, kMaxSeconds}, fmt::format("{:g}", defaults.resume_seconds))
      ->type_name("SECONDS");
  AddBoundedOption(command, "--oversample", args.oversample,
                   "Over-sampling r, a fraction of P: admit up to ceil((1 + r)·P) prompts per "
                   "batch.",
                   RealRange{0.0, kMaxOversample}, fmt::format("{:g}", d.oversample))
      ->type_name("R");
}

// The engines and the trainer: how many, on how many GPUs, how fast.
void AddClusterOptions(CLI::App& command, SimulateArgs& args, const SimulatorConfig& defaults) {
  AddBoundedOption(command, "--engines", args.engines, "Inference engines (field engines).",
                   IntegerRange{1, kMaxSimulationEngines}, fmt::format("{}", defaults.engines))
      ->type_name("N");
  AddBoundedOption(command, "--engine-concurrency", args.engine_concurrency,
                   "Samples an engine runs at once (field engine.max_concurrent).",
                   IntegerRange{1, kMaxConcurrent},
                   fmt::format("{}", defaults.engine.max_concurrent))
      ->type_name("N");
  const DecodeSpeed speed = DecodeSpeedOf(defaults.engine);
  command
      .add_option("--engine-tokens-per-second", args.engine_tokens_per_second,
                  fmt::format("Decode speed of one engine in tokens per second: one sample "
                              "alone (SINGLE, a number in (0, {:.0f}]), and --engine-concurrency "
                              "samples together (FULL, all of them, in [SINGLE, concurrency × "
                              "SINGLE]); sets the engine model's decode time (field "
                              "decode_speed; default: {:.4g},{:.4g})",
                              kMaxSingleTokensPerSecond, speed.single_tokens_per_second,
                              speed.full_tokens_per_second))
      ->type_name("SINGLE,FULL");
  AddBoundedOption(command, "--gpus-per-engine", args.gpus_per_engine,
                   "GPUs behind one engine (its tensor-parallel size), for --compare's "
                   "colocated_sync run on the same GPUs.",
                   IntegerRange{1, kMaxGpusPerUnit}, fmt::format("{}", defaults.gpus_per_engine))
      ->type_name("N");
  AddBoundedOption(command, "--trainer-ranks", args.trainer_ranks,
                   "Data-parallel ranks of the trainer (its data-parallel size; field "
                   "trainer_ranks).",
                   IntegerRange{1, kMaxSimulationTrainerRanks},
                   fmt::format("{}", defaults.step.num_ranks))
      ->type_name("N");
  AddBoundedOption(command, "--gpus-per-trainer-rank", args.gpus_per_trainer_rank,
                   "GPUs behind one trainer rank, for --compare's colocated_sync run on the same "
                   "GPUs.",
                   IntegerRange{1, kMaxGpusPerUnit},
                   fmt::format("{}", defaults.gpus_per_trainer_rank))
      ->type_name("N");
  AddBoundedOption(command, "--train-seconds-per-step", args.train_seconds_per_step,
                   "The trainer's mean seconds per step on this workload (all its calls, "
                   "overheads included; above the calls' overheads); sets the seconds per cost "
                   "unit.",
                   RealRange{0.0, kMaxSeconds, /*min_open=*/true},
                   fmt::format("unset, {:g} s per cost unit (the summary prints the mean seconds "
                               "per step)",
                               defaults.seconds_per_cost_unit))
      ->type_name("SECONDS");
  AddBoundedOption(command, "--train-call-overhead-seconds", args.train_call_overhead_seconds,
                   "Seconds added to every trainer call (reward, advantages, the optimizer "
                   "step).",
                   RealRange{0.0, kMaxSeconds},
                   fmt::format("{:g}", defaults.train_call_overhead_seconds))
      ->type_name("SECONDS");
}

// What bounds the engines' concurrency beside the count, and how the trainer scales.
void AddScalingOptions(CLI::App& command, SimulateArgs& args, const SimulatorConfig& defaults) {
  AddBoundedOption(command, "--engine-kv-cache-tokens", args.engine_kv_cache_tokens,
                   "An engine's KV cache in tokens, 0 for no bound: a dispatched sample starts "
                   "once the running contexts and its own fit; when the next decode step would "
                   "not fit, the newest sample is preempted (vLLM's recompute) (field "
                   "engine.kv_cache_tokens).",
                   IntegerRange{0, std::int64_t{1} << 40},
                   fmt::format("{}", defaults.engine.kv_cache_tokens))
      ->type_name("TOKENS");
  AddBoundedOption(command, "--trainer-scaling-exponent", args.trainer_scaling_exponent,
                   "The trainer's step time scales as ranks^-EXPONENT around "
                   "--trainer-reference-ranks: 1 is linear; measured runs show less (field "
                   "trainer_scaling_exponent).",
                   RealRange{0.0, 2.0, /*min_open=*/true},
                   fmt::format("{:g}", defaults.trainer_scaling_exponent))
      ->type_name("EXPONENT");
  AddBoundedOption(command, "--trainer-reference-ranks", args.trainer_reference_ranks,
                   "The trainer ranks its speed (--train-seconds-per-step, the cost unit) was "
                   "measured at, 0 for --trainer-ranks (field trainer_reference_ranks).",
                   IntegerRange{0, balance::kMaxParts},
                   fmt::format("{}", defaults.trainer_reference_ranks))
      ->type_name("RANKS");
  AddBoundedOption(command, "--trainer-offload-seconds", args.trainer_offload_seconds,
                   "Seconds per step the trainer spends offloading and reloading parameters and "
                   "optimizer state (colocated FSDP runs), apart from its compute (field "
                   "trainer_offload_seconds).",
                   RealRange{0.0, kMaxSeconds},
                   fmt::format("{:g}", defaults.trainer_offload_seconds))
      ->type_name("SECONDS");
}

// The batch's shape, the steps and the response lengths.
void AddWorkloadOptions(CLI::App& command, SimulateArgs& args, const SimulatorConfig& defaults) {
  const OrchestratorPolicy& d = defaults.orchestrator;
  AddBoundedOption(command, "--prompts-per-step", args.prompts_per_step,
                   fmt::format("Prompts per train step P (verl's train_batch_size); "
                               "ceil((1 + r)·P)·G must stay <= {}.",
                               kMaxSamplesPerStep),
                   IntegerRange{1, kMaxSamplesPerStep}, fmt::format("{}", d.prompts_per_step))
      ->type_name("P");
  AddBoundedOption(command, "--samples-per-prompt", args.samples_per_prompt,
                   "Samples per prompt G, a GRPO group (verl's rollout.n).",
                   IntegerRange{1, kMaxGroupSize}, fmt::format("{}", d.samples_per_prompt))
      ->type_name("G");
  AddBoundedOption(command, "--steps", args.steps, "Train steps to simulate.",
                   IntegerRange{1, kMaxSimulationSteps}, fmt::format("{}", defaults.steps))
      ->type_name("N");
  CLI::Option* lengths =
      command
          .add_option("--lengths", args.lengths, "Draw response lengths from this file (see below)")
          ->type_name("FILE");
  command
      .add_option("--length-dist", args.length_dist,
                  fmt::format("Lognormal response lengths in tokens, exp(N(MU, SIGMA)) clipped to "
                              "[1, MAX]; MU a number in [{:g}, {:g}], SIGMA in [0, {:g}], MAX an "
                              "integer in [1, {}] (default: lognormal:{:g},{:g},{})",
                              -kMaxMu, kMaxMu, kMaxSigma, balance::kMaxLength, defaults.lengths.mu,
                              defaults.lengths.sigma, defaults.lengths.max_tokens))
      ->type_name("lognormal:MU,SIGMA,MAX")
      ->excludes(lengths);
}

// Dynamic sampling, dispatch order and admission.
void AddSamplingOptions(CLI::App& command, SimulateArgs& args, const SimulatorConfig& defaults) {
  AddBoundedOption(command, "--all-equal-rate", args.all_equal_rate,
                   "Probability that a group's rewards are all equal.", RealRange{0.0, 1.0},
                   fmt::format("{:g}", defaults.all_equal_rate))
      ->type_name("X");
  command.add_flag("--filter-all-equal", args.filter_all_equal,
                   "Dynamic sampling: drop groups whose rewards are all equal and sample more "
                   "(needs --all-equal-rate > 0)");
  command
      .add_option("--dispatch", args.dispatch,
                  fmt::format("Order of the queued samples: longest-first (by predicted length) "
                              "or arrival (first in first out, as the peers' rollout loops) "
                              "(default: {})",
                              defaults.orchestrator.longest_first ? "longest-first" : "arrival"))
      ->type_name("longest-first|arrival")
      ->check(CLI::IsMember({"longest-first", "arrival"}));
  command
      .add_option("--engine-split", args.engine_split,
                  fmt::format("Which engine takes a queued sample: load (the least predicted "
                              "outstanding work) or even (its group's home engine, group id "
                              "mod engines: each batch split evenly, as frameworks that chunk "
                              "it over their servers) (default: {})",
                              defaults.orchestrator.even_split ? "even" : "load"))
      ->type_name("load|even")
      ->check(CLI::IsMember({"load", "even"}));
  AddBoundedOption(command, "--max-generating-groups", args.max_generating_groups,
                   "Groups generating at once at most, 0 for no limit: a group holds its place "
                   "from its first sample's dispatch until all its samples are complete (verl's "
                   "fully-async rollouter: 16 prompts per server).",
                   IntegerRange{0, kMaxSamplesPerStep},
                   fmt::format("{}", defaults.orchestrator.max_generating_groups))
      ->type_name("N");
  AddBoundedOption(command, "--warmup-steps", args.warmup_steps,
                   "Steps the steady-state step time leaves out (the first, unoverlapped ones); "
                   "reporting only.",
                   IntegerRange{0, 1'000'000},
                   fmt::format("{}", defaults.orchestrator.warmup_steps))
      ->type_name("N");
}

// The seed, the weight loads, the failures and the work budget.
void AddRunModelOptions(CLI::App& command, SimulateArgs& args, const SimulatorConfig& defaults) {
  command
      .add_option(
          "--seed", args.seed,
          fmt::format("Seed of the workload and the failures. {}",
                      RangeHelp(std::string(kUnsigned64Range), fmt::format("{}", defaults.seed))))
      ->type_name("N")
      ->check(Unsigned64());
  AddBoundedOption(command, "--weight-sync-seconds", args.weight_sync_seconds,
                   "Seconds to load new weights on one engine.", RealRange{0.0, kMaxSeconds},
                   fmt::format("{:g}", defaults.weight_sync_seconds))
      ->type_name("SECONDS");
  AddBoundedOption(command, "--mtbf", args.mtbf,
                   "Mean seconds between failures of an engine (field engine_mtbf_seconds); 0: "
                   "never; a replacement joins after the config's rejoin_seconds.",
                   RealRange{0.0, kMaxSeconds}, fmt::format("{:g}", defaults.engine_mtbf_seconds))
      ->type_name("SECONDS");
  AddBoundedOption(command, "--max-events", args.max_events,
                   "The work budget: a run whose estimated sample attempts (steps × prompts × "
                   "samples, times the restarts failures cause) exceed it is refused before it "
                   "starts, and one that needs more events stops (about 10^5 to 10^6 events a "
                   "second).",
                   IntegerRange{1, kInt64Max}, fmt::format("{}", defaults.max_events))
      ->type_name("N");
}

// --compare (which sets the mode options itself), the trace and the JSON output.
void AddOutputOptions(CLI::App& command, SimulateArgs& args, const ModeOptions& modes) {
  CLI::Option* compare = command.add_flag(
      "--compare", args.compare,
      fmt::format("Run {} (when the GPUs divide), {} on the same workload and print one table",
                  kColocatedRunName, ComparisonRunNames()));
  compare->excludes(modes.mode)
      ->excludes(modes.staleness)
      ->excludes(modes.partial)
      ->excludes(modes.no_partial);
  CLI::Option* trace =
      command.add_option("--trace", args.trace, "Write the Chrome trace JSON (Perfetto) to FILE")
          ->type_name("FILE");
  command
      .add_option(
          "--trace-run", args.trace_run,
          fmt::format("With --compare and --trace: the run traced (default {})", kDefaultTraceRun))
      ->type_name("NAME")
      ->needs(compare)
      ->needs(trace);
  command.add_flag("--json", args.json,
                   "Print the SimulateReply (with --calibrate the CalibrationReport) as one line "
                   "of JSON");
  CLI::Option* calibrate =
      command
          .add_option("--calibrate", args.calibrate,
                      "Fit the engines' fixed decode-step time, the trainer's cost unit and the "
                      "switch to a measured sync run: FILE is a rlsched.v1.MeasuredRun as JSON "
                      "(generation_seconds, train_seconds per step; optional switch_seconds, "
                      "offload_seconds, other_trainer_ranks with other_train_seconds); the "
                      "cluster and workload are the config of the other flags. Prints each "
                      "figure's fit and the fitted config")
          ->type_name("FILE")
          ->excludes(compare)
          ->excludes(trace);
  command.add_option("--config-out", args.config_out, "With --calibrate: write the fitted config")
      ->type_name("FILE")
      ->needs(calibrate);
}

}  // namespace

CLI::App* AddSimulateCommand(CLI::App& app, SimulateArgs& args) {
  CLI::App* command = app.add_subcommand(
      "simulate",
      "Simulate RL post-training in virtual time: the orchestrator drives modelled inference "
      "engines and a modelled trainer; prints throughput against the ideal bound, idle "
      "ratios, staleness and partial rollouts");
  command->fallthrough();
  const SimulatorConfig defaults = DefaultSimulatorConfig();
  command->footer(SimulateFooter(defaults));
  command
      ->add_option("--config", args.config,
                   "The SimulatorConfig as JSON, in protobuf's JSON mapping: field names in "
                   "snake_case (as --json prints them) or lowerCamelCase, enum values by name "
                   "(ORCHESTRATOR_MODE_ASYNC) or number, int64 values as numbers or strings; "
                   "a run's config from --json, fed back, is the same run")
      ->type_name("FILE");
  const ModeOptions modes = AddModeOptions(*command, args, defaults.orchestrator);
  AddBatchOptions(*command, args, defaults);
  AddClusterOptions(*command, args, defaults);
  AddScalingOptions(*command, args, defaults);
  AddWorkloadOptions(*command, args, defaults);
  AddSamplingOptions(*command, args, defaults);
  AddRunModelOptions(*command, args, defaults);
  AddOutputOptions(*command, args, modes);
  return command;
}

v1::DecodeSpeed ParseEngineTokensPerSecond(std::string_view text) {
  const auto fail = [text]() {
    Fail("--engine-tokens-per-second",
         fmt::format("must be SINGLE,FULL (decode tokens per second of one engine: one sample "
                     "alone, a number in (0, {:.0f}], and at full concurrency, > 0), got '{}'",
                     kMaxSingleTokensPerSecond, text));
  };
  const std::size_t comma = text.find(',');
  if (comma == std::string_view::npos) fail();
  double values[2] = {0.0, 0.0};
  const std::string_view parts[2] = {text.substr(0, comma), text.substr(comma + 1)};
  for (int i = 0; i < 2; ++i) {
    const std::string_view part = parts[i];
    const auto [ptr, ec] = std::from_chars(part.data(), part.data() + part.size(), values[i]);
    if (part.empty() || ptr != part.data() + part.size() || ec != std::errc() ||
        !std::isfinite(values[i]) || !(values[i] > 0.0) ||
        (i == 0 && values[i] > kMaxSingleTokensPerSecond)) {
      fail();
    }
  }
  v1::DecodeSpeed speed;
  speed.set_single_tokens_per_second(values[0]);
  speed.set_full_tokens_per_second(values[1]);
  return speed;
}

v1::LengthDistribution ParseLengthDist(std::string_view text) {
  const auto fail = [text]() -> void {
    Fail("--length-dist",
         fmt::format("must be lognormal:MU,SIGMA,MAX (MU a number in [{:g}, {:g}], SIGMA a number "
                     "in [0, {:g}], MAX an integer in [1, {}]), got '{}'",
                     -kMaxMu, kMaxMu, kMaxSigma, balance::kMaxLength, text));
  };
  if (!text.starts_with(kLogNormalPrefix)) fail();
  std::string_view rest = text.substr(kLogNormalPrefix.size());
  std::vector<std::string_view> parts;
  while (true) {
    const std::size_t comma = rest.find(',');
    parts.push_back(rest.substr(0, comma));
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  if (parts.size() != 3) fail();
  double mu = 0.0;
  double sigma = 0.0;
  std::int64_t max = 0;
  const auto parse_real = [&fail](std::string_view part, double& value) {
    const auto [ptr, ec] = std::from_chars(part.data(), part.data() + part.size(), value);
    if (part.empty() || ptr != part.data() + part.size() || ec != std::errc() ||
        !std::isfinite(value)) {
      fail();
    }
  };
  parse_real(parts[0], mu);
  parse_real(parts[1], sigma);
  const auto [ptr, ec] = std::from_chars(parts[2].data(), parts[2].data() + parts[2].size(), max);
  if (parts[2].empty() || ptr != parts[2].data() + parts[2].size() || ec != std::errc() ||
      mu < -kMaxMu || mu > kMaxMu || sigma < 0.0 || sigma > kMaxSigma || max < 1 ||
      max > balance::kMaxLength) {
    fail();
  }
  v1::LengthDistribution dist;
  dist.set_mu(mu);
  dist.set_sigma(sigma);
  dist.set_max_tokens(max);
  return dist;
}

std::vector<std::int64_t> ParseResponseLengths(std::string_view text) {
  std::istringstream in{std::string(text)};
  return ReadResponseLengths(in);
}

std::vector<std::int64_t> ReadResponseLengths(std::istream& in) {
  LengthsInput input = ReadLengths(in, kMaxSimulationLengths, LengthColumn::kResponse);
  for (std::size_t i = 0; i < input.lengths.size(); ++i) {
    if (input.lengths[i] < 1) {
      Fail("", fmt::format("length {} (entry {}) must be >= 1", input.lengths[i], i + 1));
    }
  }
  return std::move(input.lengths);
}

namespace {

// The mode --mode names.
v1::OrchestratorMode ModeFlag(const std::string& mode) {
  if (mode == "sync") return v1::ORCHESTRATOR_MODE_SYNC;
  if (mode == "one_step_off") return v1::ORCHESTRATOR_MODE_ONE_STEP_OFF;
  if (mode == "async") return v1::ORCHESTRATOR_MODE_ASYNC;
  Fail("--mode", fmt::format("must be sync, one_step_off or async, got '{}'", mode));
}

// The flags of the orchestrator's mode and staleness into `o`.
void SetModeFlags(const SimulateArgs& args, v1::OrchestratorOptions& o) {
  if (args.mode) o.set_mode(ModeFlag(*args.mode));
  if (args.max_staleness) o.set_max_staleness(*args.max_staleness);
  if (args.partial_rollout) o.set_partial_rollout(*args.partial_rollout);
  if (args.pause_mode) {
    o.set_pause_mode(*args.pause_mode == "abort" ? v1::PAUSE_MODE_ABORT : v1::PAUSE_MODE_KEEP);
  }
  if (args.staleness_policy) {
    const std::string& policy = *args.staleness_policy;
    if (policy == "admission") {
      o.set_staleness_policy(v1::STALENESS_POLICY_ADMISSION);
    } else if (policy == "fraction") {
      o.set_staleness_policy(v1::STALENESS_POLICY_FRACTION);
    } else if (policy == "strict") {
      o.set_staleness_policy(v1::STALENESS_POLICY_STRICT);
    } else {
      Fail("--staleness-policy",
           fmt::format("must be admission, fraction or strict, got '{}'", policy));
    }
  }
  if (args.staleness_fraction) {
    if (args.max_staleness) {
      Fail("--max-staleness",
           "does not apply with --staleness-fraction (the fraction policy's α bounds the "
           "staleness: generation runs at most ⌈α⌉ batches ahead); give one of them");
    }
    o.set_staleness_fraction(*args.staleness_fraction);
  }
}

// A --config file's mode fields that a --mode other than the file's replaces (it runs
// with its own defaults), and the colocation (with its release and resume) with a mode
// other than sync: so a config printed by --json or --calibrate predicts the other
// modes. (--compare refuses a file's mode fields instead.)
void DropFileModes(const SimulateArgs& args, v1::SimulatorConfig& config) {
  v1::OrchestratorOptions& o = *config.mutable_orchestrator();
  const bool other_mode = args.mode && o.mode() != v1::ORCHESTRATOR_MODE_UNSPECIFIED &&
                          o.mode() != ModeFlag(*args.mode);
  if (other_mode) {
    o.clear_mode();
    o.clear_max_staleness();
    o.clear_partial_rollout();
    o.clear_staleness_policy();
    o.clear_staleness_fraction();
    o.clear_pause_mode();
  }
  if (args.mode && *args.mode != "sync") {
    o.clear_colocated();
    config.clear_release_seconds();
    config.clear_resume_seconds();
  }
}

// The flags of the batches (streaming, colocation, sampling, dispatch) into `o`.
void SetBatchFlags(const SimulateArgs& args, v1::OrchestratorOptions& o) {
  if (args.train_calls_per_sync) o.set_train_calls_per_sync(*args.train_calls_per_sync);
  if (args.colocated) o.set_colocated(true);
  if (args.oversample) o.set_oversample(*args.oversample);
  if (args.prompts_per_step) o.set_prompts_per_step(*args.prompts_per_step);
  if (args.samples_per_prompt) o.set_samples_per_prompt(*args.samples_per_prompt);
  if (args.filter_all_equal) o.set_filter_all_equal(true);
  if (!args.dispatch.empty()) o.set_longest_first(args.dispatch == "longest-first");
  if (!args.engine_split.empty()) o.set_even_split(args.engine_split == "even");
  if (args.max_generating_groups) o.set_max_generating_groups(*args.max_generating_groups);
  if (args.warmup_steps) o.set_warmup_steps(*args.warmup_steps);
}

// The flags of the cluster (engines, trainer, their speeds) into `config`.
void SetClusterFlags(const SimulateArgs& args, v1::SimulatorConfig& config) {
  if (args.engines) config.set_engines(*args.engines);
  if (args.engine_concurrency)
    config.mutable_engine()->set_max_concurrent(*args.engine_concurrency);
  if (args.engine_kv_cache_tokens) {
    config.mutable_engine()->set_kv_cache_tokens(*args.engine_kv_cache_tokens);
  }
  if (args.trainer_scaling_exponent) {
    config.set_trainer_scaling_exponent(*args.trainer_scaling_exponent);
  }
  if (args.trainer_reference_ranks) {
    config.set_trainer_reference_ranks(*args.trainer_reference_ranks);
  }
  if (args.trainer_offload_seconds) {
    config.set_trainer_offload_seconds(*args.trainer_offload_seconds);
  }
  if (!args.engine_tokens_per_second.empty()) {
    // The speed replaces the file's decode times.
    *config.mutable_decode_speed() = ParseEngineTokensPerSecond(args.engine_tokens_per_second);
    config.mutable_engine()->clear_decode_base_seconds();
    config.mutable_engine()->clear_decode_per_sequence_seconds();
  }
  if (args.gpus_per_engine) config.set_gpus_per_engine(*args.gpus_per_engine);
  if (args.trainer_ranks) config.set_trainer_ranks(*args.trainer_ranks);
  if (args.gpus_per_trainer_rank) config.set_gpus_per_trainer_rank(*args.gpus_per_trainer_rank);
  if (args.train_seconds_per_step) {
    // The step time replaces the file's cost unit.
    config.set_train_seconds_per_step(*args.train_seconds_per_step);
    config.clear_seconds_per_cost_unit();
  }
  if (args.train_call_overhead_seconds) {
    config.set_train_call_overhead_seconds(*args.train_call_overhead_seconds);
  }
}

// The flags of the steps and the lengths (a distribution, or the lengths read) into
// `config`.
void SetWorkloadFlags(const SimulateArgs& args, const std::vector<std::int64_t>& response_lengths,
                      v1::SimulatorConfig& config) {
  if (args.steps) config.set_steps(*args.steps);
  if (!args.length_dist.empty()) {
    const v1::LengthDistribution dist = ParseLengthDist(args.length_dist);
    v1::LengthDistribution& lengths = *config.mutable_lengths();
    lengths.set_mu(dist.mu());
    lengths.set_sigma(dist.sigma());
    lengths.set_max_tokens(dist.max_tokens());
    lengths.clear_lengths();
  }
  if (!response_lengths.empty()) {
    v1::LengthDistribution& lengths = *config.mutable_lengths();
    lengths.clear_lengths();
    lengths.mutable_lengths()->Add(response_lengths.begin(), response_lengths.end());
  }
}

// The other flags of the run model (rewards, seed, loads, failures, the work budget).
void SetRunModelFlags(const SimulateArgs& args, v1::SimulatorConfig& config) {
  if (args.all_equal_rate) config.set_all_equal_rate(*args.all_equal_rate);
  if (args.seed) config.set_seed(*args.seed);
  if (args.weight_sync_seconds) config.set_weight_sync_seconds(*args.weight_sync_seconds);
  if (args.release_seconds) config.set_release_seconds(*args.release_seconds);
  if (args.resume_seconds) config.set_resume_seconds(*args.resume_seconds);
  if (args.mtbf) config.set_engine_mtbf_seconds(*args.mtbf);
  if (args.max_events) config.set_max_events(*args.max_events);
  if (!args.trace.empty()) config.set_trace(true);
}

// --calibrate: a config error named by the flag or the --config file that set it.
void Calibrate(const SimulateArgs& args, const v1::SimulatorConfig& config, std::ostream& out) {
  try {
    RunCalibration({.measured = args.calibrate, .config_out = args.config_out, .json = args.json},
                   config, out);
  } catch (const FieldError& e) {
    if (e.field().starts_with("--calibrate")) throw;
    throw ToFlagError(e, FlagFields(args),
                      FlagScope{.within = "config.",
                                .file = args.config.empty() ? "" : "--config " + args.config});
  }
}

}  // namespace

v1::SimulateRequest MakeSimulateRequest(const SimulateArgs& args, std::string_view config_json,
                                        const std::vector<std::int64_t>& response_lengths) {
  v1::SimulateRequest request;
  v1::SimulatorConfig& config = *request.mutable_config();
  if (!config_json.empty()) ParseJsonFile("--config", args.config, config_json, config);
  DropFileModes(args, config);
  SetModeFlags(args, *config.mutable_orchestrator());
  SetBatchFlags(args, *config.mutable_orchestrator());
  SetClusterFlags(args, config);
  SetWorkloadFlags(args, response_lengths, config);
  SetRunModelFlags(args, config);
  request.set_compare(args.compare);
  if (!args.trace_run.empty()) {
    if (!args.compare) Fail("--trace-run", "needs --compare");
    if (args.trace.empty()) Fail("--trace-run", "needs --trace");
    request.set_trace_run(args.trace_run);
  }
  return request;
}

void RunSimulateCommand(const SimulateArgs& args, std::ostream& out) {
  const std::string config_json = args.config.empty()
                                      ? std::string()
                                      : ReadWholeFile("--config", args.config, kMaxInputFileBytes);
  std::vector<std::int64_t> response_lengths;
  if (!args.lengths.empty()) {
    std::ifstream file = OpenFile("--lengths", args.lengths);
    try {
      response_lengths = ReadResponseLengths(file);
    } catch (const std::invalid_argument& e) {
      Fail(fmt::format("--lengths {}", args.lengths), e.what());
    }
    spdlog::info("read {} response lengths from {}", response_lengths.size(), args.lengths);
  }
  const v1::SimulateRequest request = MakeSimulateRequest(args, config_json, response_lengths);
  if (!args.calibrate.empty()) {
    Calibrate(args, request.config(), out);
    return;
  }

  const auto start = std::chrono::steady_clock::now();
  v1::SimulateReply reply;
  try {
    reply = SolveSimulate(request);
  } catch (const FieldError& e) {
    // In the command's terms: the flag that set the field (paths within the request's
    // config), or the --config file, and the field.
    throw ToFlagError(e, FlagFields(args),
                      FlagScope{.within = "config.",
                                .file = args.config.empty() ? "" : "--config " + args.config});
  }
  const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
  spdlog::info("simulated {} run{} in {:.3f} s", reply.runs_size(),
               reply.runs_size() == 1 ? "" : "s", elapsed.count());

  if (!args.trace.empty()) {
    for (v1::SimulationRun& run : *reply.mutable_runs()) {
      if (run.report().trace_json().empty()) continue;
      WriteWholeFile("--trace", args.trace, run.report().trace_json());
      spdlog::info("wrote the trace of {} to {}", run.name(), args.trace);
    }
  }
  for (v1::SimulationRun& run : *reply.mutable_runs()) run.mutable_report()->clear_trace_json();

  if (args.json) {
    out << ToJson(reply) << '\n';
  } else if (args.compare) {
    PrintComparison(reply, out);
  } else {
    PrintRunSummary(reply.runs(0), out);
  }
  FlushOutput(out);
}

}  // namespace rlsched::app
