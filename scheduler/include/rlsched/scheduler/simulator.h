// rlsched/scheduler/simulator.h — a discrete-event simulator of RL post-training that
// drives the Orchestrator (orchestrator.h) in virtual time.
//
// Overview
//   Simulate() runs the orchestrator's commands against modelled engines and a
//   modelled trainer, feeding back the events they cause, until `steps` train steps
//   have finished. Everything is virtual time (seconds): a run of hours takes well
//   under a second of wall time per step.
//
//   Engine model: continuous batching. An engine runs up to `max_concurrent` samples
//   at once; a decode step produces one token for every running sample and takes
//       decode_base + decode_per_sequence · running + decode_per_context_token · Σ context
//   (context = prompt + tokens generated so far); a newly started sample first costs
//   prompt_tokens / prefill_tokens_per_second. Steps between two events are summed in
//   closed form, so the cost is per sample and event, not per token.
//   Trainer model: a trainer call (a step, or with streaming one of its
//   train_calls_per_sync calls) takes the whole-step plan's predicted step time ×
//   seconds_per_cost_unit (the plan of its prompt + response lengths over
//   `step.num_ranks` ranks) + train_call_overhead_seconds. Weight sync: a fixed time
//   per engine. Colocated: an engine's Release takes release_seconds and its next
//   sync resume_seconds more. An interrupting sync (partial rollout) that comes during a
//   decode step takes effect at the step's end, as on a GPU engine: the step's tokens
//   are kept, the samples it completes finish, then the others pause and the load
//   starts.
//   Speeds in the units users measure: SetDecodeSpeed() sets the engine model from
//   decode tokens/s (one sample alone, and max_concurrent together), and
//   CostUnitForStepSeconds() the trainer's unit cost from its seconds per step.
//   Workload: a dataset of `dataset_prompts` prompts, cycled in order (epochs).
//   Response lengths are heavy-tailed by default (rlsched/workload/workload.h: lognormal
//   μ = 6.67, σ = 1.15, at most 16,384; prompts uniform in [100, 500]) or drawn from a list of
//   lengths; a sample's length is the distribution's quantile at Φ(ρ·z_prompt + √(1 −
//   ρ²)·z_sample), so lengths keep their distribution and correlate (ρ = length_correlation) across
//   a prompt's samples and epochs. A group's rewards are all equal with probability
//   `all_equal_rate`, else random.
//
//   Defaults: 64 engines of 256 concurrent samples, 64 trainer ranks, 512 prompts × 8
//   samples; the constants are chosen so that in sync mode the mean generation time
//   of a step equals its training time (see DefaultSimulatorConfig()).
//
// Thread-safety: pure; concurrent calls with distinct arguments are safe.
// Deterministic: the same config (seed included) gives the same report and trace.

#ifndef RLSCHED_SCHEDULER_SIMULATOR_H_
#define RLSCHED_SCHEDULER_SIMULATOR_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "rlsched/balance/plan_step.h"
#include "rlsched/scheduler/orchestrator.h"
#include "rlsched/workload/workload.h"

namespace rlsched::scheduler {

struct EngineModel {
  std::int64_t max_concurrent = 256;            // >= 1
  double prefill_tokens_per_second = 2e4;       // > 0
  double decode_base_seconds = 0.02;            // >= 0
  double decode_per_sequence_seconds = 0;       // >= 0
  double decode_per_context_token_seconds = 0;  // >= 0
  // The KV cache in tokens, >= 0 (0: no bound): a dispatched sample starts decoding
  // once the running samples' contexts plus its own fit with room for a step (vLLM
  // admits by free KV blocks); until then it waits on the engine. When the next decode
  // step would not fit, the newest running sample is preempted (vLLM's recompute: it
  // waits again, first in line, its tokens kept and prefilled again when it restarts).
  std::int64_t kv_cache_tokens = 0;
};

struct LengthDistribution {
  // Lognormal response lengths (when `lengths` is empty): exp(N(mu, sigma)), rounded,
  // clipped to [1, max_tokens].
  double mu = workload::kResponseMu;
  double sigma = workload::kResponseSigma;
  std::int64_t max_tokens = workload::kMaxResponseTokens;
  // Otherwise response lengths are drawn from this list (each >= 1).
  std::vector<std::int64_t> lengths;
  std::int64_t min_prompt_tokens = workload::kMinPromptTokens;
  std::int64_t max_prompt_tokens = workload::kMaxPromptTokens;
  double length_correlation = 0.8;  // ρ in [0, 1]
};

struct SimulatorConfig {
  // Mode, staleness, oversample, P, G, … The simulation adds the hooks: num_steps =
  // steps, the planner (PlanStep with `step`) and, with filter_all_equal, the filter.
  OrchestratorPolicy orchestrator;
  std::int64_t steps = 10;    // train steps to run, >= 1
  std::int64_t engines = 64;  // >= 1
  EngineModel engine;
  // GPUs behind one engine (its tensor-parallel size) and one trainer rank, >= 1 (for
  // ColocatedBaseline; the models' speeds are per engine and per rank).
  std::int64_t gpus_per_engine = 1;
  std::int64_t gpus_per_trainer_rank = 1;
  // The trainer's step plan: its data-parallel ranks (step.num_ranks, the proto's
  // trainer_ranks), cap, pipeline depth, cost model…
  balance::StepOptions step = {.num_ranks = 64};
  double seconds_per_cost_unit = 0;  // > 0
  // Added to every trainer call (reward, advantages, the optimizer step…), >= 0.
  double train_call_overhead_seconds = 0;
  // The trainer's scaling with its ranks: a step's compute time is the plan's (the
  // slowest rank's cost, which falls as 1 / ranks) × seconds_per_cost_unit ×
  // (step.num_ranks / trainer_reference_ranks)^(1 − trainer_scaling_exponent), so
  // that the step time scales as ranks^−exponent around the reference: 1 (default)
  // is linear, a smaller one what measured runs show (communication, fixed work).
  // Exponent in (0, 2]; reference ranks >= 0, 0 meaning step.num_ranks (no change).
  double trainer_scaling_exponent = 1;
  std::int64_t trainer_reference_ranks = 0;
  // Once per step, the trainer's offload and reload of parameters and optimizer state
  // to the CPU (what colocated FSDP runs do to make room for the engines), >= 0.
  double trainer_offload_seconds = 0;
  double weight_sync_seconds = 1.0;  // per engine, >= 0
  // Colocated (orchestrator.colocated): an engine's time to free its GPU memory for
  // the trainer (Release), and to take it back before loading the new weights (added
  // to weight_sync_seconds), each >= 0.
  double release_seconds = 0;
  double resume_seconds = 0;
  std::int64_t dataset_prompts = 2048;  // >= 1
  LengthDistribution lengths;
  double all_equal_rate = 0;  // in [0, 1]; with a filter, such groups are dropped
  // Use KeepUnlessAllEqual as the group filter; needs 0 < all_equal_rate < 1 (at 0 it
  // would drop nothing) and samples_per_prompt >= 2.
  bool filter_all_equal = false;
  // Faults: each engine fails after an exponential time with this mean (0: never)
  // and a replacement joins `rejoin_seconds` later.
  double engine_mtbf_seconds = 0;
  double rejoin_seconds = 30;
  std::uint64_t seed = 1;
  bool trace = false;  // record the timeline (SimulationReport::trace_json)
  // Call Orchestrator::CheckInvariants() after every event (O(n) each; for tests).
  bool check_invariants = false;
  // The work budget, >= 1: Simulate() refuses a run whose EstimatedSampleAttempts()
  // exceed it (CheckWorkBudget), and a run that needs more events than this stops with a FieldError
  // naming `max_events`. The default runs about 2,000 steps of 512 × 8 samples and
  // takes at most about a minute (10^5 to 10^6 events a second).
  std::int64_t max_events = 10'000'000;
};

// The defaults described in the file comment.
SimulatorConfig DefaultSimulatorConfig();

// Throws std::invalid_argument naming the field and its bound.
void Validate(const SimulatorConfig& config);

// Refuses, with a FieldError, a valid config whose EstimatedSampleAttempts() exceed
// its max_events: naming engine_mtbf_seconds when failures make it so, else
// max_events. Simulate() calls it after Validate(). O(EstimatedSampleAttempts).
void CheckWorkBudget(const SimulatorConfig& config);

// The sample attempts (dispatches) the run needs at least, in expectation, before it
// starts: steps · P · G samples, each attempted E[a(L)] times over the response
// lengths L. A sample runs at least d = L · (decode_base + decode_per_sequence) seconds
// (alone on its engine, prefill and context cost aside); under failures of mean time m
// (engine_mtbf_seconds) it survives an attempt with probability exp(−d/m), so a(L) =
// exp(d/m) when a failure discards its tokens, 1 + d/m with keep_partial_on_failure;
// without failures a(L) = 1. Each attempt is at least one event. +inf when it
// overflows. O(1) for lognormal lengths, O(list) for a list. Precondition:
// Validate(config) passes.
double EstimatedSampleAttempts(const SimulatorConfig& config);

// An engine's decode speed in tokens per second, context cost aside: one sample
// running alone, and max_concurrent samples running together.
struct DecodeSpeed {
  double single_tokens_per_second = 0;
  double full_tokens_per_second = 0;
};

// Sets decode_base_seconds and decode_per_sequence_seconds so that the model decodes
// at `speed` (its max_concurrent and context cost unchanged): 1 / single = base +
// per_sequence, max_concurrent / full = base + per_sequence · max_concurrent. Throws
// std::invalid_argument naming the field unless single > 0 and single <= full <=
// max_concurrent · single (more samples never decode slower in total, nor faster
// than alone each). O(1).
void SetDecodeSpeed(EngineModel& model, const DecodeSpeed& speed);

// The model's decode speed, context cost aside (the inverse of SetDecodeSpeed). O(1).
DecodeSpeed DecodeSpeedOf(const EngineModel& model);

// The seconds_per_cost_unit with which a trainer step (all its calls, overheads and
// the offload included) takes `seconds` on average on the config's workload at
// trainer_reference_ranks (when set, else step.num_ranks): the mean planned cost of
// kCalibrationBatches batches drawn from the length distribution (seeded by
// config.seed). Throws std::invalid_argument naming `seconds` when it is not above
// the calls' overheads, or the config's field when the config is invalid.
// O(kCalibrationBatches · PlanStep of P·G sequences).
inline constexpr int kCalibrationBatches = 4;
double CostUnitForStepSeconds(const SimulatorConfig& config, double seconds);

// The simulated workload, each draw a pure function of config.seed, config.lengths and
// its key (chained SplitMix64 seeds, Box-Muller normals): what a live run's data loader
// and emulated engines draw too (app/src/run_command.cc, python/rlsched/worker/
// emulated.py), so that one config simulated and run sees the same prompts and lengths.
// The prompt tokens of prompt id `prompt`: uniform in [min_prompt_tokens,
// max_prompt_tokens]. O(1).
std::int64_t WorkloadPromptTokens(const SimulatorConfig& config, std::int64_t prompt);
// The response length of sample `index` of the `epoch`-th group of `prompt` (the
// simulation numbers a prompt's groups in the order they start; a run whose groups of
// one prompt start in order, epoch = group / dataset_prompts): the distribution's
// quantile at Φ(ρ·z_prompt + √(1 − ρ²)·z_sample). O(1), or O(n log n) for a list of n
// lengths (sorted first).
std::int64_t WorkloadResponseLength(const SimulatorConfig& config, std::int64_t prompt,
                                    std::int64_t epoch, std::int64_t index);
// The rewards of group `group`'s samples: with probability all_equal_rate all equal (0
// or 1), else independent 0/1 with one flipped when they came out all equal. O(G).
std::vector<double> WorkloadGroupRewards(const SimulatorConfig& config, std::int64_t group);

// Colocated sync on the GPUs of `config` (engines × gpus_per_engine plus
// step.num_ranks × gpus_per_trainer_rank): as many engines and trainer ranks as those
// GPUs hold, the same per-engine and per-rank speeds, mode sync with colocated set.
// std::nullopt when the GPUs do not divide evenly. O(1).
std::optional<SimulatorConfig> ColocatedBaseline(const SimulatorConfig& config);

struct SimulationReport {
  Metrics metrics;
  Counters counters;
  // The ideal bound: min(engine capacity, trainer capacity) in samples/s, each side
  // as if it never idled. Engine capacity: all engines full, with the distribution's
  // mean response and the mean context of a running sample; trainer capacity: P·G
  // samples per mean step time.
  double engine_capacity_samples_per_second = 0;
  double trainer_capacity_samples_per_second = 0;
  double ideal_samples_per_second = 0;
  double mean_generation_seconds = 0;  // per step: dispatch of its first sample to close
  double mean_train_seconds = 0;
  std::int64_t events = 0;  // events fed to the orchestrator
  // Samples an engine preempted for a full KV cache (EngineModel::kv_cache_tokens).
  std::int64_t preemptions = 0;
  std::string trace_json;  // Chrome trace JSON when config.trace, else empty
};

// Asked between events (once every kStopCheckEvents): true stops the run. A caller
// bounds the wall time of a run with it (the daemon's deadline) while the simulator
// itself reads no clock. Empty: never stop.
using StopCheck = std::function<bool()>;
inline constexpr std::int64_t kStopCheckEvents = 1024;

// Runs the simulation. Throws std::invalid_argument on an invalid config or one above
// its work budget (CheckWorkBudget), rlsched::Stopped when `should_stop` says so.
SimulationReport Simulate(const SimulatorConfig& config, const StopCheck& should_stop = {});

}  // namespace rlsched::scheduler

#endif  // RLSCHED_SCHEDULER_SIMULATOR_H_
