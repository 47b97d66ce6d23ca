// simulate_convert.h — the rollout/train simulator behind its wire contract.
//
// Overview
//   Turns a rlsched.v1.SimulatorConfig (orchestrator.proto) into a
//   scheduler::SimulatorConfig: it starts from DefaultSimulatorConfig() and overwrites
//   only the fields the message sets (proto3 `optional` scalars, non-empty lists,
//   present sub-messages, enums other than *_UNSPECIFIED), so that a JSON config can
//   say only what it changes; an empty message is the default config. The result is
//   validated (scheduler::Validate() and the daemon's limits below). The report goes
//   back as a rlsched.v1.SimulationReport. SolveSimulate() answers a SimulateRequest:
//   one run, or the comparison set on the same workload and seed: colocated sync on
//   the same GPUs (kColocatedRunName, ColocatedBaseline(); only when the GPUs divide)
//   and then ComparisonRuns().
//   The command (`rlsched simulate`) and the daemon (`rlsched serve`) both answer
//   through SolveSimulate(), so they cannot disagree.
//
//   The mode and async's own fields. orchestrator.max_staleness and
//   orchestrator.partial_rollout belong to ORCHESTRATOR_MODE_ASYNC (partial rollout
//   defaults to true there): setting either without a mode selects async; with
//   SYNC or ONE_STEP_OFF they may only state that mode's fixed values (staleness 0
//   or 1, partial_rollout false), anything else is an error naming the field
//   ("orchestrator.max_staleness: applies to mode async only (mode sync has
//   staleness 0), got 2"). So a field is never accepted and ignored, and a config
//   message (ToSimulatorConfigMessage(), which writes those values) reads back.
//   The same for the other mode fields: staleness_policy selects async (sync and
//   one_step_off accept STRICT only); staleness_fraction selects async with the
//   FRACTION policy (anything else accepts 0 only), and under FRACTION max_staleness
//   may only state ceil(staleness_fraction); colocated = true selects sync (ASYNC and
//   ONE_STEP_OFF refuse it, and async's fields then state sync's values or are
//   refused, "… (colocated selects mode sync, which has staleness 0) …");
//   pause_mode selects async as well (sync and one_step_off accept KEEP only) and
//   ABORT needs partial rollout.
//   With compare the comparison set gives each run its mode fields, so the config
//   must leave mode, max_staleness, partial_rollout, staleness_policy,
//   staleness_fraction and colocated unset ("config.orchestrator.mode: compare gives
//   each run its own …"); its pause_mode applies to the runs with partial rollout;
//   trace_run needs compare and config.trace.
//   release_seconds and resume_seconds apply to colocated runs only: SolveSimulate()
//   refuses them (non-zero) for a single run that is not colocated, and for a
//   comparison whose colocated_sync run does not run.
//
//   Speeds in users' units. decode_speed (tokens/s alone and at full concurrency)
//   sets engine.decode_base_seconds and decode_per_sequence_seconds (SetDecodeSpeed
//   for the config's max_concurrent); with either of those fields set it may only
//   state the speed they give (relative tolerance 1e-9), so that a run's config,
//   which states both, reads back. train_seconds_per_step sets seconds_per_cost_unit
//   (CostUnitForStepSeconds on the otherwise converted config) and refuses
//   seconds_per_cost_unit beside it.
//
//   Errors are std::invalid_argument whose message starts with the message's field
//   path (relative to the SimulatorConfig for ToSimulatorConfig(), to the
//   SimulateRequest for SolveSimulate()) and states the bound, e.g.
//   "engines: must be in [1, 1048576], got 0",
//   "config.step.max_tokens_per_micro_batch: must be >= 1, got 0". The simulator's
//   own messages name the C++ fields; those whose path differs on the wire
//   (step.micro_batch.X, step.num_ranks, filter_all_equal, the orchestrator's fields)
//   are rewritten to the proto paths (step.X, trainer_ranks,
//   orchestrator.filter_all_equal, orchestrator.X).
//
// Example
//   rlsched::v1::SimulateRequest request;
//   request.mutable_config()->set_engines(8);
//   request.mutable_config()->mutable_orchestrator()->set_mode(
//       rlsched::v1::ORCHESTRATOR_MODE_ASYNC);
//   rlsched::v1::SimulateReply reply = rlsched::wire::SolveSimulate(request);
//   // reply.runs(0).report().metrics().samples_per_second()
//
// Thread-safety: every function is pure; concurrent calls are safe.

#ifndef RLSCHED_WIRE_SIMULATE_CONVERT_H_
#define RLSCHED_WIRE_SIMULATE_CONVERT_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "rlsched/scheduler/calibrate.h"
#include "rlsched/scheduler/orchestrator.h"
#include "rlsched/scheduler/simulator.h"
#include "rlsched/v1/orchestrator.pb.h"

namespace rlsched::wire {

using scheduler::Mode;
using scheduler::SimulationReport;
using scheduler::SimulatorConfig;

// The daemon's limits on one simulation (beyond the simulator's own bounds), so that
// a request cannot ask for work that would not finish: at most this many steps,
inline constexpr std::int64_t kMaxSimulationSteps = 100'000;
// engines,
inline constexpr std::int64_t kMaxSimulationEngines = 100'000;
// trainer ranks,
inline constexpr std::int64_t kMaxSimulationTrainerRanks = std::int64_t{1} << 20;
// samples simulated (steps · prompts_per_step · samples_per_prompt · (1 + oversample);
// the core keeps ~100 bytes per sample admitted, so about 1 GB at the limit),
inline constexpr double kMaxSimulatedSamples = 1e7;
// and response lengths in LengthDistribution.lengths.
inline constexpr std::int64_t kMaxSimulationLengths = 10'000'000;

// The name of a single run in a SimulateReply.
inline constexpr std::string_view kSingleRunName = "simulation";
// The comparison run whose trace is kept by default.
inline constexpr std::string_view kDefaultTraceRun = "async_s1_partial";
// The comparison's first run: colocated sync on the same GPUs (ColocatedBaseline()),
// when they divide.
inline constexpr std::string_view kColocatedRunName = "colocated_sync";

// One run of the comparison set: the base config with these orchestrator options.
struct ComparisonRun {
  std::string_view name;  // "sync", "one_step_off", "async_s1_partial", …
  Mode mode = Mode::kSync;
  std::int64_t max_staleness = 0;
  bool partial_rollout = false;
};

// sync; one_step_off; async s = 1 with and without partial rollout; async s = 2 with
// and without partial rollout — in that order (after kColocatedRunName, which is not
// one of these: it changes the engines and trainer ranks too).
std::span<const ComparisonRun> ComparisonRuns();

// The config a message asks for (see the file comment): DefaultSimulatorConfig() with
// the set fields overwritten, validated. Throws std::invalid_argument naming the field
// (path relative to the SimulatorConfig). O(lengths).
SimulatorConfig ToSimulatorConfig(const v1::SimulatorConfig& config);

// `config` as a message with every field set (a filter is not representable beyond
// filter_all_equal; the planner comes from `step`). The cost model is written as
// coefficients (or tokens); max_staleness, partial_rollout, staleness_policy and
// staleness_fraction as the mode runs them (sync: 0, false, STRICT, 0; one_step_off:
// 1, false, STRICT, 0; async: FRACTION's max_staleness is ceil(staleness_fraction),
// other policies' staleness_fraction 0); release_seconds and resume_seconds as 0
// unless colocated; decode_speed = DecodeSpeedOf(engine) beside the engine's fields;
// train_seconds_per_step unset (seconds_per_cost_unit states it).
// ToSimulatorConfig(ToSimulatorConfigMessage(c)) gives c back (those fields, which
// the simulation ignores, as stated here). O(lengths).
v1::SimulatorConfig ToSimulatorConfigMessage(const SimulatorConfig& config);

// The report as a message; trace_json only when `include_trace`.
v1::SimulationReport ToSimulationReportMessage(const SimulationReport& report, bool include_trace);

// The orchestrator mode as the wire enum, and as text ("sync", "one_step_off",
// "async").
v1::OrchestratorMode ToModeMessage(Mode mode);
std::string_view ModeName(Mode mode);

// Validates `request` and runs the simulation(s): one run named kSingleRunName, or
// with `compare` kColocatedRunName on ColocatedBaseline(config) when that has a value,
// then the ComparisonRuns() on the same config (which must leave the mode fields
// unset, see the file comment), the trace kept only for trace_run (default
// kDefaultTraceRun; trace_run needs config.trace) when config.trace. Each run carries
// its config (every field set) and its report. Throws std::invalid_argument naming
// the field ("config.engines: …", "trace_run: …").
// Deterministic. Complexity: that of the simulations. `should_stop` is handed to each
// simulation (Simulate()): rlsched::Stopped when it says so.
v1::SimulateReply SolveSimulate(const v1::SimulateRequest& request,
                                const scheduler::StopCheck& should_stop = {});

// Calibrates the request's config (a sync run's cluster and workload, as
// ToSimulatorConfig reads it) to its measured run (scheduler::Calibrate()): the fitted
// config with every field set (ToSimulatorConfigMessage), each figure's fit, the fitted
// fields and the warnings. Throws std::invalid_argument naming the field relative to
// the request ("config.engines: …", "measured.train_seconds: …"). Deterministic; about
// 45 simulations.
v1::CalibrationReport SolveCalibrate(const v1::CalibrateRequest& request,
                                     const scheduler::StopCheck& should_stop = {});

}  // namespace rlsched::wire

#endif  // RLSCHED_WIRE_SIMULATE_CONVERT_H_
