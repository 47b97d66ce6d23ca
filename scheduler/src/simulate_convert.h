// simulate_convert.h — the rollout/train simulator behind its wire contract.
//
// Overview
//   Turns a rlsched.v1.SimulatorConfig (rollout.proto) into a
//   scheduler::SimulatorConfig: it starts from DefaultSimulatorConfig() and overwrites
//   only the fields the message sets (proto3 `optional` scalars, non-empty lists,
//   present sub-messages, enums other than *_UNSPECIFIED), so that a JSON config can
//   say only what it changes; an empty message is the default config. The result is
//   validated (scheduler::Validate() and the daemon's limits below). The report goes
//   back as a rlsched.v1.SimulationReport. SolveSimulate() answers a SimulateRequest:
//   one run, or the comparison set (ComparisonRuns()) on the same workload and seed.
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
//   With compare the comparison set gives each run these three fields, so the
//   config must leave them unset ("config.orchestrator.mode: compare gives each run
//   its own …"); trace_run needs compare and config.trace.
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
//   rlsched::v1::SimulateReply reply = rlsched::scheduler::SolveSimulate(request);
//   // reply.runs(0).report().metrics().samples_per_second()
//
// Thread-safety: every function is pure; concurrent calls are safe.

#ifndef RLSCHED_SCHEDULER_SIMULATE_CONVERT_H_
#define RLSCHED_SCHEDULER_SIMULATE_CONVERT_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "rlsched/scheduler/orchestrator.h"
#include "rlsched/scheduler/simulator.h"
#include "rlsched/v1/rollout.pb.h"

namespace rlsched::scheduler {

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

// One run of the comparison set: the base config with these orchestrator options.
struct ComparisonRun {
  std::string_view name;  // "sync", "one_step_off", "async_s1_partial", …
  Mode mode = Mode::kSync;
  std::int64_t max_staleness = 0;
  bool partial_rollout = false;
};

// sync; one_step_off; async s = 1 with and without partial rollout; async s = 2 with
// and without partial rollout — in that order.
std::span<const ComparisonRun> ComparisonRuns();

// The config a message asks for (see the file comment): DefaultSimulatorConfig() with
// the set fields overwritten, validated. Throws std::invalid_argument naming the field
// (path relative to the SimulatorConfig). O(lengths).
SimulatorConfig ToSimulatorConfig(const v1::SimulatorConfig& config);

// `config` as a message with every field set (a filter is not representable beyond
// filter_all_equal; the planner comes from `step`). The cost model is written as
// coefficients (or tokens); max_staleness and partial_rollout as the mode runs them
// (sync: 0 and false, one_step_off: 1 and false). ToSimulatorConfig(
// ToSimulatorConfigMessage(c)) gives c back (those two fields of sync and
// one_step_off, which the simulation ignores, as stated here). O(lengths).
v1::SimulatorConfig ToSimulatorConfigMessage(const SimulatorConfig& config);

// The report as a message; trace_json only when `include_trace`.
v1::SimulationReport ToSimulationReportMessage(const SimulationReport& report, bool include_trace);

// The orchestrator mode as the wire enum, and as text ("sync", "one_step_off",
// "async").
v1::OrchestratorMode ToModeMessage(Mode mode);
std::string_view ModeName(Mode mode);

// Validates `request` and runs the simulation(s): one run named kSingleRunName, or
// with `compare` the ComparisonRuns() on the same config (which must leave mode,
// max_staleness and partial_rollout unset), the trace kept only for trace_run
// (default kDefaultTraceRun; trace_run needs config.trace) when config.trace. Each
// run carries its config (every field set) and its report. Throws
// std::invalid_argument naming the field ("config.engines: …", "trace_run: …").
// Deterministic. Complexity: that of the simulations.
v1::SimulateReply SolveSimulate(const v1::SimulateRequest& request);

}  // namespace rlsched::scheduler

#endif  // RLSCHED_SCHEDULER_SIMULATE_CONVERT_H_
