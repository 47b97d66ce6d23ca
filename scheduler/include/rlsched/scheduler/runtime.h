// rlsched/scheduler/runtime.h — the live runtime: the orchestrator's decision core, the
// step planner and the resharding planner joined on a oneTBB flow graph, driving real
// engines and a real trainer through small backend interfaces.
//
// Overview
//   Runtime owns a tbb::flow::graph:
//
//     Post(event) ─▶ core ─┬─ engine commands ─▶ weight sync ─▶ engines (EngineBackend)
//       (any thread)  │    ├─ StartTrain ─▶ step planner ─▶ trainer (TrainerBackend)
//                     │    └─ observations ─▶ sink (progress, trace)
//
//   - core: one serial node that owns the Orchestrator. It stamps each event with the
//     injected clock (never earlier than the previous event: the core needs
//     non-decreasing times), handles it, hands both to the journal (the event log) and
//     sends the commands on. An event the core
//     refuses (an unknown sample, a step that was not started…) is counted in
//     RuntimeStatus::rejected_events, logged and handed to on_reject (a live run tells
//     the worker that sent it); the state is unchanged and the run goes on.
//   - weight sync: a serial node on the engines' path. For SyncWeights it attaches
//     the engine's part of its membership's resharding plan (EngineTransfers): the
//     core node passes on, with each SyncWeights, the engines joined and not left or
//     failed at that point (in the core's order, so deterministic); a membership
//     unlike the previous sync's starts a new epoch, planned by rollout::PlanReshard
//     with one replica per member (plans cached by the number of replicas), member k
//     being replica k. The engine gets the transfers whose destination ranks belong
//     to its replica. Engine commands keep the core's order end to end. The plans
//     are made off this path: the full membership's once, before the run (Validate,
//     or WeightSyncLayout::plan), and when the membership changes (the core node) the
//     plans of its size and of one engine fewer and one more start on threads of
//     their own, so that a sync usually finds its plan made; a plan depends only on
//     the number of replicas, so where and when it is made changes no command.
//     An engine lost (EngineFailed, EngineLeft) while syncs are under way breaks their
//     transfer group: every engine still loading, and every one whose last SyncWeights
//     named the newest version still loading, gets its last sync again with replan set
//     (SyncWeights::replan), by the membership without the lost engine (a new epoch),
//     after the core's commands for the event; they are the runtime's, not the core's
//     (not in the journal, the log or a replay). RuntimeStatus::weight_sync lists the
//     epochs and their syncs.
//   - step planner: a parallel node that calls balance::PlanStep on a closed batch's
//     lengths, so StartTrain reaches the trainer with its plan (which sample to which
//     rank and micro-batch) without holding up the core.
//   - sink: a serial node that reports each finished step and records the
//     Chrome/Perfetto trace. (The event log is written in the core node: `journal`.)
//
//   What the engines say of their work. A generation report may carry the engine's
//   account of the versions its tokens were generated under (EngineSpans, see
//   orchestrator.h): the core checks it (an account no engine could give, e.g. a
//   version it never held, refuses the report like any protocol error: counted in
//   rejected_events and logged naming the field; the engine must report again) and
//   records it in place of its own inference, counting the reports where the two
//   differ (Counters::version_corrections, logged). A finish may carry the engine's
//   RequestTelemetry, summed in RuntimeStatus::requests; heartbeats' load
//   (ReportLoad) is summed per engine in RuntimeStatus::engine_load.
//
//   Backends are interfaces: an in-process engine or trainer (tests, emulation) or a
//   remote worker connection. They are called from the graph's threads, one command at
//   a time per backend, and may call Post() from inside (an engine that answers at
//   once). An EngineBackend that throws is taken as that engine failing (EngineFailed
//   is posted); a TrainerBackend that throws ends the run with that error (Wait* throw
//   it).
//
// Example
//   RuntimeOptions options;
//   options.orchestrator = {{.mode = Mode::kAsync, .max_staleness = 1,
//                            .prompts_per_step = 64, .samples_per_prompt = 8}};
//   options.orchestrator.num_steps = 10;
//   options.step = balance::StepOptions{.num_ranks = 8};
//   SteadyClock clock;
//   Runtime runtime(options, my_engines, my_trainer, clock);
//   runtime.Post(EngineJoined{.engine = 0, .max_concurrent = 256});
//   runtime.Post(PromptsAvailable{.prompts = {...}});
//   runtime.WaitUntilDone(std::chrono::minutes(10));
//
// Thread-safety: Post(), Status(), TraceJson() and the Wait* functions may be called
// from any thread. Deterministic: the same events in the same order, stamped with the
// same times, give the same commands in the same order (to each backend).

#ifndef RLSCHED_SCHEDULER_RUNTIME_H_
#define RLSCHED_SCHEDULER_RUNTIME_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "rlsched/balance/plan_step.h"
#include "rlsched/rollout/model.h"
#include "rlsched/rollout/plan.h"
#include "rlsched/scheduler/orchestrator.h"

namespace rlsched::scheduler {

// Seconds since some start, non-decreasing. Now() may be called from any thread.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual double Now() const = 0;
};

// Wall time: std::chrono::steady_clock, seconds since construction.
class SteadyClock final : public Clock {
 public:
  SteadyClock();
  double Now() const override;

 private:
  std::chrono::steady_clock::time_point start_;
};

// A clock a test (or a replay) sets by hand. Thread-safe.
class ManualClock final : public Clock {
 public:
  explicit ManualClock(double start = 0) : now_(start) {}
  double Now() const override;
  // Throws std::invalid_argument naming `time` when it is earlier than Now().
  void Set(double time);
  void Advance(double seconds);  // seconds >= 0

 private:
  mutable std::mutex mutex_;
  double now_;
};

// The trainer → engine weight layout, for the weight-sync plan.
struct WeightSyncLayout {
  rollout::ModelConfig model;
  // The train layout and one engine replica's layout. `infer.replicas` is the run's
  // engines at full membership (what Validate plans); each sync is planned for the
  // membership it sees (WeightSyncOptions).
  rollout::ReshardOptions reshard;
  // rollout::PlanReshard(model, reshard) when the caller has made it (`rlsched run`
  // plans it to refuse a bad layout before the run starts): Validate then checks its
  // GPU counts instead of planning again, and the runtime uses it for a membership of
  // infer.replicas engines. Null: Validate plans it (and the runtime keeps that plan).
  std::shared_ptr<const rollout::ReshardPlan> plan;
};

// An engine's part of a weight sync: its membership's plan and the transfers its
// replica's ranks receive. A membership is the engines joined (and not left or failed)
// when the core gave the SyncWeights, ascending: engine members[k] is replica k of a
// plan made for members.size() replicas, its GPUs (ranks of the transfer group)
// rank_offset .. rank_offset + ranks - 1.
struct EngineTransfers {
  std::shared_ptr<const rollout::ReshardPlan> plan;  // the membership's, shared by its engines
  // The membership's number: 0 for the first one a sync saw, one more at each change
  // (an engine that leaves and joins again makes new epochs even when the set repeats).
  std::int64_t epoch = 0;
  std::shared_ptr<const std::vector<std::int64_t>> members;
  std::int64_t replica = 0;             // the engine's index in *members
  std::int64_t rank_offset = 0;         // rollout::EngineRank(replica, 0) of the plan's options
  std::int64_t ranks = 0;               // infer.tp
  std::int64_t world_size = 0;          // the plan's GPUs: trainer + engine (colocated: the larger)
  std::vector<std::int64_t> transfers;  // indices into plan->transfers, ascending
  std::int64_t bytes = 0;               // received by the replica's ranks, summed
};

// `layout.reshard` with infer.replicas = `replicas` (a membership's size, >= 1).
rollout::ReshardOptions WeightSyncOptions(const WeightSyncLayout& layout, std::int64_t replicas);

// Every member's part of the weight sync of `members` (engine ids, ascending, distinct,
// not empty), in the order of `members`: `plan` must be rollout::PlanReshard(
// layout.model, WeightSyncOptions(layout, members.size())) (shared by the parts).
// Throws std::invalid_argument naming `members` or `plan` when they do not fit.
// O(transfers × receivers).
std::vector<EngineTransfers> SplitWeightSync(const WeightSyncLayout& layout,
                                             std::shared_ptr<const rollout::ReshardPlan> plan,
                                             std::vector<std::int64_t> members, std::int64_t epoch);

// The engine a command is for; -1 for StartTrain (the trainer's). O(1).
std::int64_t EngineOf(const Command& command);
// The engine an event names (EngineJoined, EngineLeft, EngineFailed, WeightsLoaded,
// EngineReleased, GenerationPaused; GenerationProgressed, GenerationFinished and
// GroupFiltered unless kAnyEngine); nullopt for the others. O(1).
std::optional<std::int64_t> EngineOf(const Event& event);

class EngineBackend {
 public:
  virtual ~EngineBackend() = default;
  // One command for an engine: Dispatch, Abort, SyncWeights, Resume or Release, in the
  // core's order. For SyncWeights, `transfers` is the engine's part of its membership's
  // plan when a weight-sync layout is configured, else null.
  virtual void Execute(const Command& command, const EngineTransfers* transfers) = 0;
};

class TrainerBackend {
 public:
  virtual ~TrainerBackend() = default;
  // A trainer call; `call.plan` is set when RuntimeOptions::step is.
  virtual void Train(const StartTrain& call) = 0;
};

// Reported when a step's last trainer call has finished.
struct StepProgress {
  std::int64_t step = 0;  // the step that finished
  double time = 0;        // its TrainStepFinished's stamped time
  Counters counters;
  Metrics metrics;  // over [first event, time]
};

// A run resumed from its event log (`rlsched run --resume`).
struct RuntimeResume {
  // The logged events, stamped, in order: handed to the core before any other, their
  // commands dropped (they were sent before; the workers reattach and say what they
  // hold, EngineAttached). Refused ones are refused again, as in the run. The trainer
  // call they leave under way (the core's last StartTrain without its finish) goes to
  // the trainer again, planned as any call: a trainer that already has it says so when
  // it attaches (TrainerBackend's to sort out).
  std::vector<Event> events;
};

struct RuntimeOptions {
  // The decision core's policy and hooks. Its planner must be empty: the runtime plans
  // every trainer call in its own node (`step`).
  OrchestratorOptions orchestrator;
  std::optional<balance::StepOptions> step;     // plan each StartTrain with PlanStep
  std::optional<WeightSyncLayout> weight_sync;  // attach each engine's transfers
  bool check_invariants = false;                // Orchestrator::CheckInvariants() per event
  bool trace = false;                           // record the Chrome trace (TraceJson())
  // The event log: every event the core received, stamped, with the commands it gave,
  // in the core's order, called in the core node before any of those commands leaves it
  // (so a log written here holds every command a worker may have seen). A refused
  // event is passed too, with no commands (replay refuses it the same way). The
  // runtime's own commands (replans) are not passed. A journal that throws fails the
  // run (Wait* rethrow it): its commands do not leave.
  std::function<void(const Event&, std::span<const Command>)> journal;
  std::function<void(const StepProgress&)> on_step;
  // Every event the core refused, with the reason (the core node's thread, after the
  // journal has it): a live run tells the worker that sent it.
  std::function<void(const Event&, const std::string& why)> on_reject;
  std::optional<RuntimeResume> resume;  // continue a logged run (see RuntimeResume)
};

// Throws std::invalid_argument naming the field (orchestrator.*, step.*,
// weight_sync.*, "orchestrator.planner" when set). A weight-sync layout without its
// plan is planned once (rollout::PlanReshard at its infer.replicas), so that a layout
// the planner refuses is refused here ("weight_sync.reshard.train.pp: ..."); one with
// its plan has the plan's GPU counts checked ("weight_sync.plan: ...").
void Validate(const RuntimeOptions& options);

// Quantiles of a latency, in seconds (from a histogram: each figure is its bucket's upper
// edge, within 4.4% above the exact value).
struct LatencySummary {
  std::int64_t count = 0;
  double p50_seconds = 0;
  double p99_seconds = 0;
  double max_seconds = 0;
};

// The engines' per-request telemetry (GenerationFinished::telemetry) over the run, in
// run seconds (quantiles from a histogram, within 4.4% above the exact values).
struct RequestSummary {
  std::int64_t requests = 0;  // accepted finish reports carrying telemetry
  std::int64_t generated_tokens = 0;
  std::int64_t preemptions = 0;
  std::int64_t interruptions = 0;
  double mean_seconds = 0;  // Dispatch to finish
  double p50_seconds = 0;
  double p99_seconds = 0;
  double max_seconds = 0;
  double mean_first_token_seconds = 0;  // over the requests that measured it (> 0)
  double p99_first_token_seconds = 0;
  double paused_seconds = 0;  // summed
  // Telemetry left out for a negative or non-finite figure (logged, naming it); the
  // finish itself is handled.
  std::int64_t invalid = 0;
};

// An engine's load as its heartbeats report it (Runtime::ReportLoad).
struct EngineLoad {
  std::int64_t engine = 0;
  std::int64_t heartbeats = 0;
  std::int64_t running = 0;  // the last report's
  std::int64_t waiting = 0;
  std::int64_t max_running = 0;
  std::int64_t max_waiting = 0;
  double mean_running = 0;  // over its reports
  double mean_waiting = 0;
};

// One membership's weight-sync plan, as the runtime used it (with a weight-sync layout).
struct WeightSyncEpoch {
  std::int64_t epoch = 0;             // EngineTransfers::epoch
  std::vector<std::int64_t> members;  // ascending engine ids
  std::int64_t transfers = 0;         // the plan's
  std::int64_t buckets = 0;
  std::int64_t bytes = 0;  // received by the members' GPUs, summed
  std::int64_t syncs = 0;  // SyncWeights sent by it (replans included)
};

struct RuntimeStatus {
  Counters counters;
  Metrics metrics;                          // up to the clock's now
  std::int64_t events = 0;                  // handled by the core
  std::int64_t rejected_events = 0;         // refused by the core (state unchanged)
  std::string last_rejection;               // the last refusal's message
  std::int64_t engine_failures_posted = 0;  // by the runtime, for backends that threw
  bool done = false;                        // num_steps > 0 and that many steps finished
  // Event to command: from an event's Post() to the return of the backend's Execute()
  // or Train() for each command it caused (a StartTrain's step plan included), in wall
  // seconds of std::chrono::steady_clock whatever the injected clock.
  LatencySummary command_latency;
  RequestSummary requests;
  std::vector<EngineLoad> engine_load;  // ascending engine id, those that reported
  // Each membership planned, in epoch order, and the syncs sent again because an
  // engine was lost during them (SyncWeights::replan).
  std::vector<WeightSyncEpoch> weight_sync;
  std::int64_t weight_sync_replans = 0;
  std::vector<std::int64_t> engines;  // joined, not left or failed (the core's), ascending
};

class Runtime {
 public:
  // Throws std::invalid_argument on invalid options. The backends and the clock must
  // outlive the Runtime.
  Runtime(RuntimeOptions options, EngineBackend& engines, TrainerBackend& trainer,
          const Clock& clock);
  ~Runtime();  // Stop()
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // Hands an event to the core (its `time` is replaced by the clock's). Thread-safe,
  // returns at once; false (and the event dropped) after Stop().
  bool Post(Event event);
  // An engine's load from its heartbeat: requests running and waiting on it (waiting:
  // dispatched, not generating: queued in the engine or paused). Thread-safe; not an
  // event of the core (not logged). Throws std::invalid_argument naming `engine`,
  // `running` or `waiting` when negative.
  void ReportLoad(std::int64_t engine, std::int64_t running, std::int64_t waiting);
  // Waits until every event posted so far, and everything it caused, has been handled
  // (the graph is idle). Not while another thread keeps posting.
  void WaitIdle();
  // Waits until the core is done (num_steps finished): true; false on timeout.
  // Rethrows a trainer backend's error.
  bool WaitUntilDone(std::chrono::milliseconds timeout);
  // Refuses further events and waits for the graph to be idle. Idempotent.
  void Stop();

  RuntimeStatus Status() const;
  // The core's counters alone (Status() without the metrics and summaries: for polling).
  Counters counters() const;
  // The run's Chrome trace JSON (chrome://tracing, Perfetto) when options.trace: the
  // trainer's calls and the engines' weight syncs as spans, the events as instants.
  std::string TraceJson() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace rlsched::scheduler

#endif  // RLSCHED_SCHEDULER_RUNTIME_H_
