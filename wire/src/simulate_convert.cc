#include "rlsched/wire/simulate_convert.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "rlsched/balance/partition.h"
#include "rlsched/common/check.h"
#include "rlsched/common/error.h"
#include "rlsched/v1/balance.pb.h"
#include "rlsched/wire/balance_convert.h"
#include "rlsched/wire/solve.h"

namespace rlsched::wire {

using namespace ::rlsched::scheduler;  // NOLINT: the types converted
namespace {

constexpr std::array<ComparisonRun, 6> kComparisonRuns = {{
    {"sync", Mode::kSync, 0, false},
    {"one_step_off", Mode::kOneStepOff, 1, false},
    {"async_s1_partial", Mode::kAsync, 1, true},
    {"async_s1", Mode::kAsync, 1, false},
    {"async_s2_partial", Mode::kAsync, 2, true},
    {"async_s2", Mode::kAsync, 2, false},
}};

// The OrchestratorPolicy fields: a message of the simulator's Validate() that starts
// with one of these (without "orchestrator.") is about them.
constexpr std::array<std::string_view, 20> kOrchestratorFields = {
    "mode",
    "max_staleness",
    "partial_rollout",
    "staleness_policy",
    "staleness_fraction",
    "train_calls_per_sync",
    "colocated",
    "oversample",
    "prompts_per_step",
    "samples_per_prompt",
    "num_steps",
    "keep_partial_on_failure",
    "length_quantile",
    "initial_prediction",
    "longest_first",
    "even_split",
    "max_generating_groups",
    "max_response_tokens",
    "warmup_steps",
    "filter",
};

// Whether `path` is `prefix` or starts with it followed by '.' or '['.
bool HasPathPrefix(std::string_view path, std::string_view prefix) {
  if (!path.starts_with(prefix)) return false;
  const std::string_view tail = path.substr(prefix.size());
  return tail.empty() || tail.front() == '.' || tail.front() == '[';
}

// `e` with its field path rewritten from the C++ config's names to the wire's (see the
// file comment of simulate_convert.h).
FieldError ToWire(const FieldError& e) {
  const std::string_view path = e.field();
  constexpr std::string_view kMicroBatch = "step.micro_batch";
  if (HasPathPrefix(path, kMicroBatch)) {
    // step.micro_batch.X -> step.X
    return e.Renamed(fmt::format("step{}", path.substr(kMicroBatch.size())));
  }
  constexpr std::string_view kNumRanks = "step.num_ranks";
  if (HasPathPrefix(path, kNumRanks)) {
    return e.Renamed(fmt::format("trainer_ranks{}", path.substr(kNumRanks.size())));
  }
  if (HasPathPrefix(path, "filter_all_equal")) return e.Within("orchestrator");
  for (const std::string_view field : kOrchestratorFields) {
    if (HasPathPrefix(path, field)) return e.Within("orchestrator");
  }
  return e;
}

Mode ToMode(v1::OrchestratorMode mode, Mode fallback) {
  switch (mode) {
    case v1::ORCHESTRATOR_MODE_UNSPECIFIED:
      return fallback;
    case v1::ORCHESTRATOR_MODE_SYNC:
      return Mode::kSync;
    case v1::ORCHESTRATOR_MODE_ONE_STEP_OFF:
      return Mode::kOneStepOff;
    case v1::ORCHESTRATOR_MODE_ASYNC:
      return Mode::kAsync;
    default:
      Fail("orchestrator.mode", fmt::format("unknown value {}", static_cast<int>(mode)));
  }
}

StalenessPolicy ToPolicy(v1::StalenessPolicy policy) {
  switch (policy) {
    case v1::STALENESS_POLICY_UNSPECIFIED:
    case v1::STALENESS_POLICY_ADMISSION:
      return StalenessPolicy::kAdmission;
    case v1::STALENESS_POLICY_FRACTION:
      return StalenessPolicy::kFraction;
    case v1::STALENESS_POLICY_STRICT:
      return StalenessPolicy::kStrict;
    default:
      Fail("orchestrator.staleness_policy",
           fmt::format("unknown value {}", static_cast<int>(policy)));
  }
}

PauseMode ToPauseMode(v1::PauseMode mode) {
  switch (mode) {
    case v1::PAUSE_MODE_UNSPECIFIED:
    case v1::PAUSE_MODE_KEEP:
      return PauseMode::kKeep;
    case v1::PAUSE_MODE_ABORT:
      return PauseMode::kAbort;
    default:
      Fail("orchestrator.pause_mode", fmt::format("unknown value {}", static_cast<int>(mode)));
  }
}

// The mode and its own fields (see the file comment of simulate_convert.h):
// max_staleness, partial_rollout, staleness_policy or staleness_fraction without a
// mode select async, colocated selects sync; with another mode they may only state
// that mode's fixed values.
void ApplyMode(const v1::OrchestratorOptions& in, OrchestratorPolicy& out) {
  const bool has_policy = in.staleness_policy() != v1::STALENESS_POLICY_UNSPECIFIED;
  const bool async_fields = in.has_max_staleness() || in.has_partial_rollout() || has_policy ||
                            in.has_staleness_fraction() ||
                            in.pause_mode() != v1::PAUSE_MODE_UNSPECIFIED;
  const bool colocated = in.has_colocated() && in.colocated();
  const bool mode_given = in.mode() != v1::ORCHESTRATOR_MODE_UNSPECIFIED;
  out.mode = ToMode(in.mode(), colocated ? Mode::kSync : async_fields ? Mode::kAsync : out.mode);
  if (colocated && out.mode != Mode::kSync) {
    Fail("orchestrator.colocated",
         fmt::format("applies to mode sync only (engines and trainer take turns on the same "
                     "GPUs; mode {} overlaps generation and training), got true",
                     ModeName(out.mode)));
  }
  const double fraction = in.staleness_fraction();
  if (in.has_staleness_fraction()) {
    CheckRealInRange("orchestrator.staleness_fraction", in.staleness_fraction(), 0, End::kClosed,
                     1e6, End::kClosed);
  }
  if (out.mode != Mode::kAsync) {
    // "mode sync", or when colocated chose it over async's fields, why sync.
    const std::string mode = !mode_given && colocated && async_fields
                                 ? std::string("colocated selects mode sync, which")
                                 : fmt::format("mode {}", ModeName(out.mode));
    const std::int64_t staleness = EffectiveStaleness(out);
    if (in.has_max_staleness() && in.max_staleness() != staleness) {
      Fail("orchestrator.max_staleness",
           fmt::format("applies to mode async only ({} has staleness {}), got {}", mode, staleness,
                       in.max_staleness()));
    }
    if (in.has_partial_rollout() && in.partial_rollout()) {
      Fail("orchestrator.partial_rollout",
           fmt::format("applies to mode async only ({} never interrupts a generation: "
                       "engines take new weights between batches), got true",
                       mode));
    }
    if (in.pause_mode() == v1::PAUSE_MODE_ABORT) {
      Fail("orchestrator.pause_mode",
           fmt::format("applies to mode async with partial rollout only ({} never interrupts a "
                       "generation), got PAUSE_MODE_ABORT",
                       mode));
    }
    if (has_policy && in.staleness_policy() != v1::STALENESS_POLICY_STRICT) {
      Fail("orchestrator.staleness_policy",
           fmt::format("applies to mode async only ({} keeps every token within its "
                       "staleness: strict), got {}",
                       mode, v1::StalenessPolicy_Name(in.staleness_policy())));
    }
    if (fraction != 0) {
      Fail("orchestrator.staleness_fraction",
           fmt::format("applies to mode async with the fraction policy only ({} has staleness "
                       "{}), got {}",
                       mode, staleness, fraction));
    }
  } else {
    // The policy: given, or FRACTION when staleness_fraction is set without one.
    if (has_policy) {
      out.staleness_policy = ToPolicy(in.staleness_policy());
    } else if (in.has_staleness_fraction()) {
      out.staleness_policy = StalenessPolicy::kFraction;
    }
    if (out.staleness_policy != StalenessPolicy::kFraction && fraction != 0) {
      Fail("orchestrator.staleness_fraction",
           fmt::format("applies to the fraction policy only (the {} policy bounds staleness by "
                       "max_staleness), got {}",
                       out.staleness_policy == StalenessPolicy::kStrict ? "strict" : "admission",
                       fraction));
    }
    if (out.staleness_policy == StalenessPolicy::kFraction) {
      out.staleness_fraction = fraction;
      const std::int64_t ahead = EffectiveStaleness(out);
      if (in.has_max_staleness() && in.max_staleness() != ahead) {
        Fail("orchestrator.max_staleness",
             fmt::format("does not apply to the fraction policy (staleness_fraction {} bounds "
                         "staleness: generation runs ceil({}) = {} batches ahead at most), got {}",
                         fraction, fraction, ahead, in.max_staleness()));
      }
    }
  }
  if (in.has_max_staleness()) out.max_staleness = in.max_staleness();
  if (in.has_partial_rollout()) out.partial_rollout = in.partial_rollout();
  if (in.pause_mode() != v1::PAUSE_MODE_UNSPECIFIED) out.pause_mode = ToPauseMode(in.pause_mode());
  if (out.mode == Mode::kAsync && !out.partial_rollout && out.pause_mode == PauseMode::kAbort) {
    Fail("orchestrator.pause_mode",
         "applies with partial_rollout only (without it engines drain before a weight sync: "
         "nothing is paused), got PAUSE_MODE_ABORT");
  }
  if (in.has_colocated()) out.colocated = in.colocated();
}

void ApplyOrchestrator(const v1::OrchestratorOptions& in, SimulatorConfig& config) {
  OrchestratorPolicy& out = config.orchestrator;
  ApplyMode(in, out);
  if (in.has_oversample()) out.oversample = in.oversample();
  if (in.has_prompts_per_step()) out.prompts_per_step = in.prompts_per_step();
  if (in.has_samples_per_prompt()) out.samples_per_prompt = in.samples_per_prompt();
  if (in.has_keep_partial_on_failure()) out.keep_partial_on_failure = in.keep_partial_on_failure();
  if (in.has_filter_all_equal()) config.filter_all_equal = in.filter_all_equal();
  if (in.has_length_quantile()) out.length_quantile = in.length_quantile();
  if (in.has_initial_prediction()) out.initial_prediction = in.initial_prediction();
  if (in.has_longest_first()) out.longest_first = in.longest_first();
  if (in.has_even_split()) out.even_split = in.even_split();
  if (in.has_max_generating_groups()) out.max_generating_groups = in.max_generating_groups();
  if (in.has_warmup_steps()) out.warmup_steps = in.warmup_steps();
  if (in.has_max_response_tokens()) out.max_response_tokens = in.max_response_tokens();
  if (in.has_num_steps()) {
    Fail("num_steps", "does not apply to a simulation, which runs `steps` train steps");
  }
  if (in.has_train_calls_per_sync()) out.train_calls_per_sync = in.train_calls_per_sync();
}

void ApplyEngine(const v1::EngineModel& in, EngineModel& out) {
  if (in.has_max_concurrent()) out.max_concurrent = in.max_concurrent();
  if (in.has_prefill_tokens_per_second()) {
    out.prefill_tokens_per_second = in.prefill_tokens_per_second();
  }
  if (in.has_decode_base_seconds()) out.decode_base_seconds = in.decode_base_seconds();
  if (in.has_decode_per_sequence_seconds()) {
    out.decode_per_sequence_seconds = in.decode_per_sequence_seconds();
  }
  if (in.has_decode_per_context_token_seconds()) {
    out.decode_per_context_token_seconds = in.decode_per_context_token_seconds();
  }
  if (in.has_kv_cache_tokens()) out.kv_cache_tokens = in.kv_cache_tokens();
}

// The decode speed in tokens/s (see the file comment of simulate_convert.h), after the
// engine's own fields.
void ApplyDecodeSpeed(const v1::SimulatorConfig& message, EngineModel& engine) {
  if (!message.has_decode_speed()) return;
  const DecodeSpeed speed{
      .single_tokens_per_second = message.decode_speed().single_tokens_per_second(),
      .full_tokens_per_second = message.decode_speed().full_tokens_per_second()};
  EngineModel model = engine;
  try {
    SetDecodeSpeed(model, speed);
  } catch (const FieldError& e) {
    if (HasPathPrefix(e.field(), "engine")) throw;
    throw e.Within("decode_speed");
  }
  const v1::EngineModel& fields = message.engine();
  if (fields.has_decode_base_seconds() || fields.has_decode_per_sequence_seconds()) {
    // Both given: the speed may only state what the fields give.
    const DecodeSpeed given = DecodeSpeedOf(engine);
    const auto same = [](double a, double b) { return std::abs(a - b) <= 1e-9 * std::abs(b); };
    if (!same(speed.single_tokens_per_second, given.single_tokens_per_second) ||
        !same(speed.full_tokens_per_second, given.full_tokens_per_second)) {
      Fail("decode_speed",
           fmt::format("contradicts engine.decode_base_seconds and "
                       "engine.decode_per_sequence_seconds, which give {:.9g} tokens/s alone and "
                       "{:.9g} at full concurrency (max_concurrent {}); set the speed or those "
                       "fields, not both, got {:.9g} and {:.9g}",
                       given.single_tokens_per_second, given.full_tokens_per_second,
                       engine.max_concurrent, speed.single_tokens_per_second,
                       speed.full_tokens_per_second));
    }
    return;
  }
  engine = model;
}

void ApplyLengths(const v1::LengthDistribution& in, LengthDistribution& out) {
  if (in.has_mu()) out.mu = in.mu();
  if (in.has_sigma()) out.sigma = in.sigma();
  if (in.has_max_tokens()) out.max_tokens = in.max_tokens();
  if (in.lengths_size() > 0) {
    if (in.lengths_size() > kMaxSimulationLengths) {
      Fail("lengths.lengths",
           fmt::format("at most {} entries, got {}", kMaxSimulationLengths, in.lengths_size()));
    }
    for (int i = 0; i < in.lengths_size(); ++i) {
      CheckInRange({"lengths.lengths", std::size_t(i)}, in.lengths(i), 1, balance::kMaxLength);
    }
    out.lengths.assign(in.lengths().begin(), in.lengths().end());
  }
  if (in.has_min_prompt_tokens()) out.min_prompt_tokens = in.min_prompt_tokens();
  if (in.has_max_prompt_tokens()) out.max_prompt_tokens = in.max_prompt_tokens();
  if (in.has_length_correlation()) out.length_correlation = in.length_correlation();
}

bool SetsAnything(const v1::StepPlanOptions& step) {
  return step.has_equal_size() || step.has_keep_groups() || step.has_max_tokens_per_micro_batch() ||
         step.has_min_micro_batches() || step.has_micro_batches_multiple_of() ||
         step.has_pad_to_multiple_of() || step.has_pipeline_stages() || step.has_overhead() ||
         step.has_cost() || step.order() != v1::MICRO_BATCH_ORDER_UNSPECIFIED ||
         step.has_refine_iterations();
}

v1::CostModel ToCostMessage(const balance::CostModel& cost) {
  v1::CostModel message;
  if (cost.kind() == balance::CostModel::Kind::kTokens) {
    message.set_kind(v1::COST_KIND_TOKENS);
    return message;
  }
  message.set_kind(v1::COST_KIND_ATTENTION);
  v1::CostCoefficients* coefficients = message.mutable_coefficients();
  coefficients->set_linear(cost.linear());
  coefficients->set_quadratic(cost.quadratic());
  coefficients->set_constant(cost.constant());
  return message;
}

v1::MicroBatchOrder ToOrderMessage(balance::MicroBatchOrder order) {
  return order == balance::MicroBatchOrder::kHeaviestFirst ? v1::MICRO_BATCH_ORDER_HEAVIEST_FIRST
                                                           : v1::MICRO_BATCH_ORDER_PIPELINE;
}

// `options` as the option fields of a PlanStepRequest.
v1::PlanStepRequest ToPlanStepRequest(const balance::StepOptions& options) {
  const balance::MicroBatchOptions& micro_batch = options.micro_batch;
  v1::PlanStepRequest request;
  request.set_equal_size(options.equal_size);
  request.set_keep_groups(options.keep_groups);
  request.set_max_tokens_per_micro_batch(micro_batch.max_tokens_per_micro_batch);
  request.set_min_micro_batches(micro_batch.min_micro_batches);
  request.set_micro_batches_multiple_of(micro_batch.micro_batches_multiple_of);
  request.set_pad_to_multiple_of(micro_batch.pad_to_multiple_of);
  request.set_pipeline_stages(micro_batch.pipeline_stages);
  if (micro_batch.overhead) request.set_overhead(*micro_batch.overhead);
  *request.mutable_cost() = ToCostMessage(micro_batch.cost);
  request.set_order(ToOrderMessage(micro_batch.order));
  request.set_refine_iterations(micro_batch.refine.enabled ? micro_batch.refine.max_iterations : 0);
  return request;
}

// The step options: the base's with the set fields overwritten, checked as a
// PlanStepRequest's (balance_convert.h), errors prefixed with "step.".
void ApplyStep(const v1::StepPlanOptions& in, balance::StepOptions& out) {
  if (!SetsAnything(in)) return;  // the default, untouched
  v1::PlanStepRequest request = ToPlanStepRequest(out);
  if (in.has_equal_size()) request.set_equal_size(in.equal_size());
  // keep_groups needs groups in a PlanStepRequest; the simulator always has them.
  const bool keep_groups = in.has_keep_groups() ? in.keep_groups() : out.keep_groups;
  request.set_keep_groups(false);
  if (in.has_max_tokens_per_micro_batch()) {
    request.set_max_tokens_per_micro_batch(in.max_tokens_per_micro_batch());
  }
  if (in.has_min_micro_batches()) request.set_min_micro_batches(in.min_micro_batches());
  if (in.has_micro_batches_multiple_of()) {
    request.set_micro_batches_multiple_of(in.micro_batches_multiple_of());
  }
  if (in.has_pad_to_multiple_of()) request.set_pad_to_multiple_of(in.pad_to_multiple_of());
  if (in.has_pipeline_stages()) request.set_pipeline_stages(in.pipeline_stages());
  if (in.has_overhead()) request.set_overhead(in.overhead());
  if (in.has_cost()) *request.mutable_cost() = in.cost();
  if (in.order() != v1::MICRO_BATCH_ORDER_UNSPECIFIED) request.set_order(in.order());
  if (in.has_refine_iterations()) request.set_refine_iterations(in.refine_iterations());
  request.set_num_ranks(1);  // the simulator plans over trainer_ranks
  balance::StepOptions options;
  try {
    options = ToStepOptions(request);
  } catch (const FieldError& e) {
    throw e.Within("step");
  }
  options.num_ranks = out.num_ranks;
  options.keep_groups = keep_groups;
  out = std::move(options);
}

// The daemon's limits (simulate_convert.h).
void CheckLimits(const SimulatorConfig& config) {
  CheckInRange("steps", config.steps, 1, kMaxSimulationSteps);
  CheckInRange("engines", config.engines, 1, kMaxSimulationEngines);
  CheckInRange("trainer_ranks", config.step.num_ranks, 1, kMaxSimulationTrainerRanks);
  const OrchestratorPolicy& o = config.orchestrator;
  const double samples = static_cast<double>(config.steps) *
                         static_cast<double>(o.prompts_per_step) *
                         static_cast<double>(o.samples_per_prompt) * (1.0 + o.oversample);
  if (!(samples <= kMaxSimulatedSamples)) {
    Fail("steps", fmt::format("steps · prompts_per_step · samples_per_prompt · (1 + oversample) "
                              "must be at most {:g} samples, got {:g} ({} · {} · {} · {})",
                              kMaxSimulatedSamples, samples, config.steps, o.prompts_per_step,
                              o.samples_per_prompt, 1.0 + o.oversample));
  }
}

void FillCounters(const Counters& in, v1::OrchestratorCounters& out) {
  out.set_admitted(in.admitted);
  out.set_trained(in.trained);
  out.set_filtered(in.filtered);
  out.set_buffered(in.buffered);
  out.set_queued(in.queued);
  out.set_in_flight(in.in_flight);
  out.set_admitted_groups(in.admitted_groups);
  out.set_trained_groups(in.trained_groups);
  out.set_filtered_groups(in.filtered_groups);
  out.set_restarts(in.restarts);
  out.set_discarded_tokens(in.discarded_tokens);
  out.set_partial_samples(in.partial_samples);
  out.set_resubmitted(in.resubmitted);
  out.set_trained_tokens(in.trained_tokens);
  out.set_steps_started(in.steps_started);
  out.set_steps_finished(in.steps_finished);
  out.set_stale_restarts(in.stale_restarts);
  out.set_stale_discarded_tokens(in.stale_discarded_tokens);
  out.set_engine_failures(in.engine_failures);
  out.set_version_reports(in.version_reports);
  out.set_version_corrections(in.version_corrections);
  out.set_unreported_pauses(in.unreported_pauses);
}

void FillMetrics(const Metrics& in, v1::OrchestratorMetrics& out) {
  out.set_elapsed_seconds(in.elapsed_seconds);
  out.set_samples_per_second(in.samples_per_second);
  out.set_tokens_per_second(in.tokens_per_second);
  out.set_trainer_idle_ratio(in.trainer_idle_ratio);
  out.mutable_engines()->Add(in.engines.begin(), in.engines.end());
  out.mutable_engine_idle_ratio()->Add(in.engine_idle_ratio.begin(), in.engine_idle_ratio.end());
  out.set_mean_engine_idle_ratio(in.mean_engine_idle_ratio);
  out.set_partial_rollout_ratio(in.partial_rollout_ratio);
  out.set_weight_syncs(in.weight_syncs);
  out.set_weight_sync_seconds(in.weight_sync_seconds);
  out.mutable_staleness_histogram()->Add(in.staleness_histogram.begin(),
                                         in.staleness_histogram.end());
  out.set_max_staleness(in.max_staleness);
  out.mutable_token_staleness_histogram()->Add(in.token_staleness_histogram.begin(),
                                               in.token_staleness_histogram.end());
  out.set_seconds_per_weight_sync(in.seconds_per_weight_sync);
  out.set_seconds_per_step(in.seconds_per_step);
  out.set_trainer_wait_seconds_per_step(in.trainer_wait_seconds_per_step);
  out.set_generation_seconds_per_step(in.generation_seconds_per_step);
  out.set_train_seconds_per_step(in.train_seconds_per_step);
  out.set_switch_seconds_per_step(in.switch_seconds_per_step);
  out.set_steady_seconds_per_step(in.steady_seconds_per_step);
}

// With compare: the comparison set gives each run its mode fields, so the config must
// not (errors relative to the SimulateRequest).
void CheckNoModeFields(const v1::OrchestratorOptions& o) {
  constexpr std::string_view kWhy =
      "compare gives each run its own (colocated sync, sync, one_step_off, async s = 1 and 2 "
      "with and without partial rollout, under the admission policy); leave it unset";
  if (o.mode() != v1::ORCHESTRATOR_MODE_UNSPECIFIED) {
    const std::string& name = v1::OrchestratorMode_Name(o.mode());
    Fail("config.orchestrator.mode",
         fmt::format("{}, got {}", kWhy,
                     name.empty() ? std::to_string(static_cast<int>(o.mode())) : name));
  }
  if (o.has_max_staleness()) {
    Fail("config.orchestrator.max_staleness", fmt::format("{}, got {}", kWhy, o.max_staleness()));
  }
  if (o.has_partial_rollout()) {
    Fail("config.orchestrator.partial_rollout",
         fmt::format("{}, got {}", kWhy, o.partial_rollout()));
  }
  if (o.staleness_policy() != v1::STALENESS_POLICY_UNSPECIFIED) {
    const std::string& name = v1::StalenessPolicy_Name(o.staleness_policy());
    Fail("config.orchestrator.staleness_policy",
         fmt::format("{}, got {}", kWhy,
                     name.empty() ? std::to_string(static_cast<int>(o.staleness_policy())) : name));
  }
  if (o.has_staleness_fraction()) {
    Fail("config.orchestrator.staleness_fraction",
         fmt::format("{}, got {}", kWhy, o.staleness_fraction()));
  }
  if (o.has_colocated()) {
    Fail("config.orchestrator.colocated", fmt::format("{}, got {}", kWhy, o.colocated()));
  }
}

// The GPUs of `config` as text: "12 GPUs (4 engines × 2 + 4 trainer ranks × 1)".
std::string DescribeGpus(const SimulatorConfig& config) {
  return fmt::format("{} GPUs ({} engines × {} + {} trainer ranks × {})",
                     config.engines * config.gpus_per_engine +
                         config.step.num_ranks * config.gpus_per_trainer_rank,
                     config.engines, config.gpus_per_engine, config.step.num_ranks,
                     config.gpus_per_trainer_rank);
}

// release_seconds and resume_seconds, when no run is colocated (`why`: why not).
void CheckNoColocatedFields(const SimulatorConfig& config, std::string_view why) {
  if (config.release_seconds != 0) {
    Fail("config.release_seconds",
         fmt::format("applies only to colocated runs ({}), got {}", why, config.release_seconds));
  }
  if (config.resume_seconds != 0) {
    Fail("config.resume_seconds",
         fmt::format("applies only to colocated runs ({}), got {}", why, config.resume_seconds));
  }
}

// One simulation; its errors (e.g. the event budget) name the config field.
v1::SimulationRun RunOne(std::string_view name, const SimulatorConfig& config, bool keep_trace,
                         const StopCheck& should_stop) {
  SimulationReport report;
  try {
    report = Simulate(config, should_stop);
  } catch (const FieldError& e) {
    throw e.Within("config");
  }
  v1::SimulationRun run;
  run.set_name(std::string(name));
  *run.mutable_config() = ToSimulatorConfigMessage(config);
  *run.mutable_report() = ToSimulationReportMessage(report, keep_trace);
  return run;
}

}  // namespace

std::span<const ComparisonRun> ComparisonRuns() { return kComparisonRuns; }

v1::OrchestratorMode ToModeMessage(Mode mode) {
  switch (mode) {
    case Mode::kSync:
      return v1::ORCHESTRATOR_MODE_SYNC;
    case Mode::kOneStepOff:
      return v1::ORCHESTRATOR_MODE_ONE_STEP_OFF;
    case Mode::kAsync:
      return v1::ORCHESTRATOR_MODE_ASYNC;
  }
  return v1::ORCHESTRATOR_MODE_UNSPECIFIED;
}

std::string_view ModeName(Mode mode) {
  switch (mode) {
    case Mode::kSync:
      return "sync";
    case Mode::kOneStepOff:
      return "one_step_off";
    case Mode::kAsync:
      return "async";
  }
  return "?";
}

SimulatorConfig ToSimulatorConfig(const v1::SimulatorConfig& message) {
  SimulatorConfig config = DefaultSimulatorConfig();
  ApplyOrchestrator(message.orchestrator(), config);
  if (message.has_steps()) config.steps = message.steps();
  if (message.has_engines()) config.engines = message.engines();
  ApplyEngine(message.engine(), config.engine);
  ApplyDecodeSpeed(message, config.engine);
  if (message.has_trainer_ranks()) config.step.num_ranks = message.trainer_ranks();
  if (message.has_gpus_per_engine()) config.gpus_per_engine = message.gpus_per_engine();
  if (message.has_gpus_per_trainer_rank()) {
    config.gpus_per_trainer_rank = message.gpus_per_trainer_rank();
  }
  ApplyStep(message.step(), config.step);
  if (message.has_seconds_per_cost_unit()) {
    if (message.has_train_seconds_per_step()) {
      Fail("train_seconds_per_step",
           fmt::format("sets seconds_per_cost_unit, so not both (seconds_per_cost_unit {}), got {}",
                       message.seconds_per_cost_unit(), message.train_seconds_per_step()));
    }
    config.seconds_per_cost_unit = message.seconds_per_cost_unit();
  }
  if (message.has_train_call_overhead_seconds()) {
    config.train_call_overhead_seconds = message.train_call_overhead_seconds();
  }
  if (message.has_release_seconds()) config.release_seconds = message.release_seconds();
  if (message.has_trainer_scaling_exponent()) {
    config.trainer_scaling_exponent = message.trainer_scaling_exponent();
  }
  if (message.has_trainer_reference_ranks()) {
    config.trainer_reference_ranks = message.trainer_reference_ranks();
  }
  if (message.has_trainer_offload_seconds()) {
    config.trainer_offload_seconds = message.trainer_offload_seconds();
  }
  if (message.has_resume_seconds()) config.resume_seconds = message.resume_seconds();
  if (message.has_weight_sync_seconds()) config.weight_sync_seconds = message.weight_sync_seconds();
  if (message.has_dataset_prompts()) config.dataset_prompts = message.dataset_prompts();
  ApplyLengths(message.lengths(), config.lengths);
  if (message.has_all_equal_rate()) config.all_equal_rate = message.all_equal_rate();
  if (message.has_engine_mtbf_seconds()) config.engine_mtbf_seconds = message.engine_mtbf_seconds();
  if (message.has_rejoin_seconds()) config.rejoin_seconds = message.rejoin_seconds();
  if (message.has_seed()) config.seed = message.seed();
  if (message.has_trace()) config.trace = message.trace();
  if (message.has_max_events()) config.max_events = message.max_events();
  try {
    Validate(config);
  } catch (const FieldError& e) {
    throw ToWire(e);
  }
  CheckLimits(config);
  try {
    CheckWorkBudget(config);
  } catch (const FieldError& e) {
    throw ToWire(e);
  }
  if (message.has_train_seconds_per_step()) {
    // The trainer's speed in seconds per step, on the otherwise converted config.
    const double seconds = message.train_seconds_per_step();
    try {
      config.seconds_per_cost_unit = CostUnitForStepSeconds(config, seconds);
    } catch (const FieldError& e) {
      if (e.field() == "seconds") throw e.Renamed("train_seconds_per_step");
      throw ToWire(e);
    }
    try {
      Validate(config);
    } catch (const std::invalid_argument& e) {
      Fail("train_seconds_per_step", fmt::format("gives {} (got {})", e.what(), seconds));
    }
  }
  return config;
}

v1::SimulatorConfig ToSimulatorConfigMessage(const SimulatorConfig& config) {
  v1::SimulatorConfig message;
  const OrchestratorPolicy& o = config.orchestrator;
  v1::OrchestratorOptions* orchestrator = message.mutable_orchestrator();
  orchestrator->set_mode(ToModeMessage(o.mode));
  // The values the mode runs with (sync and one_step_off ignore the C++ fields).
  orchestrator->set_max_staleness(EffectiveStaleness(o));
  orchestrator->set_partial_rollout(o.mode == Mode::kAsync && o.partial_rollout);
  orchestrator->set_pause_mode(o.mode == Mode::kAsync && o.partial_rollout &&
                                       o.pause_mode == PauseMode::kAbort
                                   ? v1::PAUSE_MODE_ABORT
                                   : v1::PAUSE_MODE_KEEP);
  const bool async = o.mode == Mode::kAsync;
  const bool fraction = async && o.staleness_policy == StalenessPolicy::kFraction;
  orchestrator->set_staleness_policy(!async || o.staleness_policy == StalenessPolicy::kStrict
                                         ? v1::STALENESS_POLICY_STRICT
                                     : fraction ? v1::STALENESS_POLICY_FRACTION
                                                : v1::STALENESS_POLICY_ADMISSION);
  orchestrator->set_staleness_fraction(fraction ? o.staleness_fraction : 0.0);
  orchestrator->set_train_calls_per_sync(o.train_calls_per_sync);
  orchestrator->set_colocated(o.mode == Mode::kSync && o.colocated);
  orchestrator->set_oversample(o.oversample);
  orchestrator->set_prompts_per_step(o.prompts_per_step);
  orchestrator->set_samples_per_prompt(o.samples_per_prompt);
  orchestrator->set_keep_partial_on_failure(o.keep_partial_on_failure);
  orchestrator->set_filter_all_equal(config.filter_all_equal);
  orchestrator->set_length_quantile(o.length_quantile);
  orchestrator->set_initial_prediction(o.initial_prediction);
  orchestrator->set_longest_first(o.longest_first);
  orchestrator->set_even_split(o.even_split);
  orchestrator->set_max_generating_groups(o.max_generating_groups);
  orchestrator->set_warmup_steps(o.warmup_steps);
  orchestrator->set_max_response_tokens(o.max_response_tokens);

  message.set_steps(config.steps);
  message.set_engines(config.engines);
  v1::EngineModel* engine = message.mutable_engine();
  engine->set_max_concurrent(config.engine.max_concurrent);
  engine->set_prefill_tokens_per_second(config.engine.prefill_tokens_per_second);
  engine->set_decode_base_seconds(config.engine.decode_base_seconds);
  engine->set_decode_per_sequence_seconds(config.engine.decode_per_sequence_seconds);
  engine->set_decode_per_context_token_seconds(config.engine.decode_per_context_token_seconds);
  engine->set_kv_cache_tokens(config.engine.kv_cache_tokens);
  const DecodeSpeed speed = DecodeSpeedOf(config.engine);
  message.mutable_decode_speed()->set_single_tokens_per_second(speed.single_tokens_per_second);
  message.mutable_decode_speed()->set_full_tokens_per_second(speed.full_tokens_per_second);
  message.set_trainer_ranks(config.step.num_ranks);
  message.set_gpus_per_engine(config.gpus_per_engine);
  message.set_gpus_per_trainer_rank(config.gpus_per_trainer_rank);

  const v1::PlanStepRequest step_request = ToPlanStepRequest(config.step);
  v1::StepPlanOptions* step = message.mutable_step();
  step->set_equal_size(step_request.equal_size());
  step->set_keep_groups(step_request.keep_groups());
  step->set_max_tokens_per_micro_batch(step_request.max_tokens_per_micro_batch());
  step->set_min_micro_batches(step_request.min_micro_batches());
  step->set_micro_batches_multiple_of(step_request.micro_batches_multiple_of());
  step->set_pad_to_multiple_of(step_request.pad_to_multiple_of());
  step->set_pipeline_stages(step_request.pipeline_stages());
  if (step_request.has_overhead()) step->set_overhead(step_request.overhead());
  *step->mutable_cost() = step_request.cost();
  step->set_order(step_request.order());
  step->set_refine_iterations(step_request.refine_iterations());

  message.set_seconds_per_cost_unit(config.seconds_per_cost_unit);
  message.set_train_call_overhead_seconds(config.train_call_overhead_seconds);
  message.set_trainer_scaling_exponent(config.trainer_scaling_exponent);
  message.set_trainer_reference_ranks(config.trainer_reference_ranks);
  message.set_trainer_offload_seconds(config.trainer_offload_seconds);
  message.set_weight_sync_seconds(config.weight_sync_seconds);
  // As the run runs them: only a colocated engine releases its GPUs.
  const bool colocated = o.mode == Mode::kSync && o.colocated;
  message.set_release_seconds(colocated ? config.release_seconds : 0.0);
  message.set_resume_seconds(colocated ? config.resume_seconds : 0.0);
  message.set_dataset_prompts(config.dataset_prompts);
  v1::LengthDistribution* lengths = message.mutable_lengths();
  lengths->set_mu(config.lengths.mu);
  lengths->set_sigma(config.lengths.sigma);
  lengths->set_max_tokens(config.lengths.max_tokens);
  lengths->mutable_lengths()->Add(config.lengths.lengths.begin(), config.lengths.lengths.end());
  lengths->set_min_prompt_tokens(config.lengths.min_prompt_tokens);
  lengths->set_max_prompt_tokens(config.lengths.max_prompt_tokens);
  lengths->set_length_correlation(config.lengths.length_correlation);
  message.set_all_equal_rate(config.all_equal_rate);
  message.set_engine_mtbf_seconds(config.engine_mtbf_seconds);
  message.set_rejoin_seconds(config.rejoin_seconds);
  message.set_seed(config.seed);
  message.set_trace(config.trace);
  message.set_max_events(config.max_events);
  return message;
}

v1::SimulationReport ToSimulationReportMessage(const SimulationReport& report, bool include_trace) {
  v1::SimulationReport message;
  FillMetrics(report.metrics, *message.mutable_metrics());
  FillCounters(report.counters, *message.mutable_counters());
  message.set_engine_capacity_samples_per_second(report.engine_capacity_samples_per_second);
  message.set_trainer_capacity_samples_per_second(report.trainer_capacity_samples_per_second);
  message.set_ideal_samples_per_second(report.ideal_samples_per_second);
  message.set_mean_generation_seconds(report.mean_generation_seconds);
  message.set_mean_train_seconds(report.mean_train_seconds);
  message.set_events(report.events);
  message.set_preemptions(report.preemptions);
  if (include_trace) message.set_trace_json(report.trace_json);
  return message;
}

v1::SimulateReply SolveSimulate(const v1::SimulateRequest& request, const StopCheck& should_stop) {
  if (request.compare()) CheckNoModeFields(request.config().orchestrator());
  SimulatorConfig config;
  try {
    config = ToSimulatorConfig(request.config());
  } catch (const FieldError& e) {
    throw e.Within("config");
  }
  v1::SimulateReply reply;
  if (!request.compare()) {
    if (!request.trace_run().empty()) {
      Fail("trace_run", fmt::format("applies only with compare, got '{}'", request.trace_run()));
    }
    if (!config.orchestrator.colocated) {
      CheckNoColocatedFields(config,
                             "orchestrator.colocated, or compare's colocated_sync run; this run "
                             "is not colocated");
    }
    *reply.add_runs() = RunOne(kSingleRunName, config, config.trace, should_stop);
    return reply;
  }

  // Colocated sync on the same GPUs, when they divide.
  const std::optional<SimulatorConfig> colocated = ColocatedBaseline(config);
  if (colocated) {
    try {
      Validate(*colocated);
      CheckLimits(*colocated);
    } catch (const FieldError& e) {
      const FieldError wire = ToWire(e);
      const std::string path = wire.field().empty() ? "gpus_per_engine" : wire.field();
      const std::string& rest = wire.requirement();
      Fail(fmt::format("config.{}", path),
           fmt::format("in compare's {} run (colocated sync on the {}: {} engines and {} trainer "
                       "ranks): {}",
                       kColocatedRunName, DescribeGpus(config), colocated->engines,
                       colocated->step.num_ranks, rest));
    }
  } else {
    CheckNoColocatedFields(
        config, fmt::format("compare's {} run, which does not run: the {} do not divide into "
                            "engines of {} and trainer ranks of {}",
                            kColocatedRunName, DescribeGpus(config), config.gpus_per_engine,
                            config.gpus_per_trainer_rank));
  }

  const std::string_view trace_run =
      request.trace_run().empty() ? kDefaultTraceRun : std::string_view(request.trace_run());
  bool known = trace_run == kColocatedRunName;
  std::string names;
  for (const ComparisonRun& run : kComparisonRuns) {
    known = known || run.name == trace_run;
    names += run.name;
    names += ", ";
  }
  names += kColocatedRunName;
  if (!known) Fail("trace_run", fmt::format("must be one of {}, got '{}'", names, trace_run));
  if (!request.trace_run().empty() && !config.trace) {
    Fail("trace_run", fmt::format("applies only with config.trace (it names the run whose trace "
                                  "is kept), got '{}'",
                                  request.trace_run()));
  }
  if (trace_run == kColocatedRunName && !colocated) {
    Fail("trace_run",
         fmt::format("{} does not run: the {} do not divide into engines of {} and trainer ranks "
                     "of {}, got '{}'",
                     kColocatedRunName, DescribeGpus(config), config.gpus_per_engine,
                     config.gpus_per_trainer_rank, trace_run));
  }

  if (colocated) {
    SimulatorConfig variant = *colocated;
    variant.trace = config.trace && trace_run == kColocatedRunName;
    *reply.add_runs() = RunOne(kColocatedRunName, variant, variant.trace, should_stop);
  }
  for (const ComparisonRun& run : kComparisonRuns) {
    SimulatorConfig variant = config;
    variant.orchestrator.mode = run.mode;
    variant.orchestrator.max_staleness = run.max_staleness;
    variant.orchestrator.partial_rollout = run.partial_rollout;
    // The config's pause mode, where the run pauses (partial rollout).
    if (!run.partial_rollout) variant.orchestrator.pause_mode = PauseMode::kKeep;
    variant.trace = config.trace && run.name == trace_run;
    *reply.add_runs() = RunOne(run.name, variant, variant.trace, should_stop);
  }
  return reply;
}

v1::CalibrationReport SolveCalibrate(const v1::CalibrateRequest& request,
                                     const scheduler::StopCheck& should_stop) {
  const v1::MeasuredRun& measured = request.measured();
  scheduler::MeasuredRun run{.generation_seconds = measured.generation_seconds(),
                             .train_seconds = measured.train_seconds()};
  if (measured.has_switch_seconds()) run.switch_seconds = measured.switch_seconds();
  if (measured.has_offload_seconds()) run.offload_seconds = measured.offload_seconds();
  if (measured.has_other_trainer_ranks()) run.other_trainer_ranks = measured.other_trainer_ranks();
  if (measured.has_other_train_seconds()) run.other_train_seconds = measured.other_train_seconds();
  SimulatorConfig config;
  try {
    config = ToSimulatorConfig(request.config());
  } catch (const FieldError& e) {
    throw e.Within("config");
  }
  scheduler::CalibrationResult result;
  try {
    result = scheduler::Calibrate(config, run, should_stop);
  } catch (const FieldError& e) {
    if (e.field().starts_with("measured.")) throw;
    throw e.Within("config");
  }
  v1::CalibrationReport report;
  *report.mutable_config() = ToSimulatorConfigMessage(result.config);
  for (const scheduler::CalibratedFigure& f : result.figures) {
    v1::CalibratedFigure* figure = report.add_figures();
    figure->set_name(f.name);
    figure->set_parameter(f.parameter);
    figure->set_measured(f.measured);
    figure->set_simulated(f.simulated);
    figure->set_residual(f.residual);
  }
  report.mutable_fitted()->Add(result.fitted.begin(), result.fitted.end());
  report.mutable_warnings()->Add(result.warnings.begin(), result.warnings.end());
  return report;
}

}  // namespace rlsched::wire
