// rlsched/scheduler/orchestrator.h — the rollout/train orchestrator's decision core.
//
// Overview
//   Generation (inference engines) and training (one trainer over many ranks)
//   alternate. The Orchestrator decides what runs where and when: it is a pure,
//   deterministic state machine, fed events (with their times, in seconds) and
//   answering with commands. It has no clock, thread or I/O; a driver — the
//   simulator (simulator.h) or a real runtime — executes the commands and reports
//   what happened as events. The same events in the same order give the same
//   commands.
//
//   Work. A batch (one train step) is P prompts × G samples: P complete GRPO groups.
//   Prompts arrive through PromptsAvailable; each admitted prompt becomes a group of
//   G samples, each generated on some engine. Sample s of group g has id g·G + s.
//
//   Versions and staleness. Version v is the policy after v train steps; step t
//   trains with version t and produces version t + 1. A sample's tokens come from one
//   or more versions (a partial rollout resumes under newer weights); its staleness
//   when trained at step t is t − (the oldest version of any of its tokens). A group
//   may go into batch t only if every sample's staleness at t is <= s:
//     sync          s = 0; generation waits for the newest weights.
//     one_step_off  s = 1; one batch generates at a time, while the previous trains;
//                   engines take new weights only between batches.
//     async         s = max_staleness; batches are admitted continuously, up to s
//                   steps ahead of the trainer (s = 0 behaves as sync).
//   Admission. A group is admitted for a target batch b on an engine holding version
//   v only if b − v <= s, and batch b admits at most ceil((1 + r)·P) live groups
//   (r = oversample; filtered groups free their place, so dynamic sampling refills).
//   Batch b closes when P complete groups exist (oldest first, then by group id);
//   complete or running groups left over carry on to batch b + 1 and are never
//   dropped. What happens to their tokens is the staleness policy's choice:
//     admission  (async's default, the peers' rule) every generated token is kept:
//                generation runs at most s batches ahead of the trainer and a group
//                starts only on weights at most s versions behind the batch it was
//                admitted for, but a long sample resumed across weight syncs may
//                train with tokens older than s (the off-policy correction reads
//                the version spans; Metrics::token_staleness_histogram shows the
//                tail). Nothing is thrown away for staleness.
//     fraction   verl's staleness_threshold α (a real number): generation may start
//                at most (1 + α)·quota groups per version, counting the groups left
//                over from older versions, so (without over-sampling) at most ⌈α·P⌉
//                groups of a batch carry tokens older than the batch's version.
//                Nothing is thrown away for staleness; an integer α is the admission
//                policy with s = α. Generation runs ⌈α⌉ batches ahead at most, the
//                last of them with ⌈(α − ⌈α⌉ + 1)·quota⌉ places.
//     strict     every trained token is at most s versions old: a leftover whose
//                tokens would become too stale is discarded and generated again
//                (counted as a restart). Without over-sampling a batch waits for a
//                running group that the next batch could no longer take instead, and
//                an engine running one of its samples takes no younger work until it
//                finishes (the oldest are never slowed down for younger ones). sync
//                and one_step_off are always strict.
//
//   Streaming. With train_calls_per_sync = k > 1 (verl's trigger_parameter_sync_step),
//   a batch of P groups trains in k calls of P/k groups, each closed and started as
//   soon as P/k complete groups exist; the engines get new weights only after the
//   k-th call (version t + 1 exists when call k − 1 of step t finishes).
//
//   Colocated (sync only). Engines and trainer share the GPUs and alternate: once a
//   batch is closed (all its calls), every idle engine gets Release (free the GPU
//   memory: KV cache, weights); the trainer starts when all are released; when the
//   step ends, released engines get SyncWeights (wake up and load the new version).
//
//   Weight sync. When step t finishes, version t + 1 exists. With partial rollout,
//   every engine gets SyncWeights with interrupt = true: the driver stops its
//   generations, reports their progress (one GenerationPaused once the engine is paused
//   and idle, or a GenerationProgressed per sample), loads the weights and reports
//   WeightsLoaded; the core then sends Resume, and the samples continue under the new
//   version (their version spans record this). That is pause_mode kKeep; with kAbort
//   (for engines that cannot hold a request across a weight update) the engine aborts
//   them instead and reports their partial tokens the same way, and after
//   WeightsLoaded the core dispatches them to it again (Dispatch, resume_from = their
//   tokens) in place of the Resume; an engine lost before that hands them back to the
//   queue with their tokens (whatever keep_partial_on_failure says: they were
//   returned). Either way the engine prefills prompt and partial tokens again under
//   the new weights. Without partial rollout an
//   engine takes no new work once a newer version exists, drains, then syncs. In
//   one_step_off and sync, engines sync only when idle.
//
//   Dispatch. Queued samples go out in order of target batch, then predicted
//   remaining length (longest first; unless longest_first is false), then id, each to an engine
//   with a free slot whose version admits it: the engine with the least predicted outstanding work
//   (the balancer's LPT rule; ties: lowest engine id). One event gives an engine at
//   most its fair share of the queue (count and predicted work over the engines
//   alive), so engines that become ready one event after another (weights loaded
//   together) share a wave. The length predictor uses the prompt's earlier lengths
//   (mean), else a running quantile of all finished lengths. With even_split a group's
//   samples go only to its home engine (group id mod the engines alive, by id), which
//   takes them in the same order as its slots free up: no engine takes another's work.
//
//   Faults. A failed engine's in-flight samples go back to the queue; their partial
//   tokens are kept (resumed elsewhere) or discarded per `keep_partial_on_failure`.
//   An engine that leaves hands its samples back with their progress kept.
//
//   Conservation (in samples, checked by CheckInvariants() and counted in Counters):
//     admitted = trained + filtered + buffered + queued + in_flight,
//   where buffered = complete samples not yet trained. Nothing is lost or trained
//   twice.
//
// Example
//   OrchestratorOptions options;
//   options.mode = Mode::kAsync;
//   options.max_staleness = 1;
//   options.prompts_per_step = 512;
//   options.samples_per_prompt = 8;
//   Orchestrator core(options);
//   std::vector<Command> commands;
//   core.Handle(EngineJoined{.time = 0, .engine = 0, .max_concurrent = 256}, commands);
//   core.Handle(PromptsAvailable{.time = 0, .prompts = {...}}, commands);
//   // execute `commands`, report what happens as further events
//
// Thread-safety: an Orchestrator is not thread-safe; drive it from one thread (or
// serialise calls). Complexity: Handle() is O(log n + log engines) per sample it
// touches (plus the engines skipped at their fair share), O(engines) on a train step's
// end, n = samples alive; the core handles about 1M events/s (benchmarks/core_events).

#ifndef RLSCHED_SCHEDULER_ORCHESTRATOR_H_
#define RLSCHED_SCHEDULER_ORCHESTRATOR_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <variant>
#include <vector>

#include "rlsched/balance/plan_step.h"

namespace rlsched::scheduler {

enum class Mode { kSync, kOneStepOff, kAsync };

// How async mode bounds staleness (see the file comment). sync and one_step_off are
// strict whatever this says.
enum class StalenessPolicy { kAdmission, kFraction, kStrict };

// Colocated: the kinds of GPU memory an engine frees for the trainer and takes back,
// by the names engines give them (the `tags` of SGLang's memory release and resume).
enum class MemoryTag { kWeights, kKvCache };

// What an interrupting weight sync (partial rollout) does with the engine's samples.
enum class PauseMode {
  kKeep,   // they wait on the engine and continue there under the new weights (Resume)
  kAbort,  // the engine aborts them, reporting their tokens; then they go to it again
};

// ---- Events (driver → core). Times are seconds, non-decreasing across events. ----

// A run of a sample's response tokens generated under one policy version.
struct VersionSpan {
  std::int64_t version = 0;
  std::int64_t first_token = 0;  // response token index where the span starts
};

// The engine's account of the versions of the tokens it generated for a sample: the
// version it had committed when it generated each. It covers [resume_from, tokens) of
// the sample's Dispatch to this engine: spans in order, the first at resume_from, each
// holding at least one token, versions ascending, each a version the engine held while
// the sample ran on it (from the Dispatch's version to its newest, the one it is
// loading included). Empty: no account (the core infers the versions from the pause
// reports). An account breaking these rules refuses the report, naming
// `spans[i].version` / `.first_token` or `spans` and the bound. Within them the
// engine's account is recorded (the trainer's spans, the staleness figures) and
// compared with the core's inference: Counters::version_corrections counts the
// reports where they differ.
using EngineSpans = std::vector<VersionSpan>;

struct Prompt {
  std::int64_t id = 0;             // the dataset's prompt id (repeats across epochs)
  std::int64_t prompt_tokens = 0;  // >= 0
};
// New prompts for the queue (a data loader's next prompts). Used in arrival order.
struct PromptsAvailable {
  double time = 0;
  std::vector<Prompt> prompts;
};
// The largest engine id and per-engine concurrency EngineJoined takes.
inline constexpr std::int64_t kMaxEngineId = std::int64_t{1} << 40;
inline constexpr std::int64_t kMaxConcurrent = std::int64_t{1} << 30;
struct EngineJoined {
  double time = 0;
  std::int64_t engine = 0;          // in [0, kMaxEngineId], not currently joined
  std::int64_t max_concurrent = 1;  // samples in flight at once, in [1, kMaxConcurrent]
  // Weights it holds, at most the newest version (= steps finished); -1: none (the
  // core syncs it).
  std::int64_t version = -1;
};
// An engine attaching to a live run, with what it holds (its weights, and the samples it
// was given and has not finished or had aborted). Not joined: EngineJoined, after an
// Abort of what it holds. Joined (a scheduler resumed from its log): kept when
// KeepsEngine (the same version and concurrency, no sync or pause under way, released as
// the core has it — released or releasing — and every sample it holds in flight on it), with the
// core's samples on it that it does not hold (finished while no scheduler heard, or a dispatch it
// never got) back in the queue with their reported progress and in an Abort; otherwise EngineLeft
// (its samples back to the queue with their reported progress), Abort of what it holds and of what
// the core had in flight on it (commands sent after its Hello reach the new stream), then
// EngineJoined.
// Refused as EngineJoined is, or naming samples[i] (negative, repeated) or samples (more
// than max_concurrent).
struct EngineAttached {
  double time = 0;
  std::int64_t engine = 0;
  std::int64_t max_concurrent = 1;
  std::int64_t version = -1;
  std::vector<std::int64_t> samples;
  // Colocated: it carried out a Release (its GPU memory is the trainer's) and has not
  // loaded weights since. Kept only when the core has it released or releasing (then the
  // release is done).
  bool released = false;
};
struct EngineLeft {  // graceful: its samples come back with their progress
  double time = 0;
  std::int64_t engine = 0;
};
struct EngineFailed {  // its samples come back; progress kept per option
  double time = 0;
  std::int64_t engine = 0;
};
// The engine a sample's report comes from (GenerationProgressed, GenerationFinished,
// GroupFiltered): a report naming an engine is refused ("sample", or "group") unless
// the sample is in flight on that engine. kAnyEngine: the driver vouches for it (an
// in-process driver); a live run's worker server names the stream's engine in every
// report, so that no engine can speak for another's samples.
inline constexpr std::int64_t kAnyEngine = -1;

// A sample's total generated tokens so far (at least the last reported, at most
// max_response_tokens). Required after SyncWeights{interrupt = true}, for every sample
// then in flight on the engine, unless the engine reports them all in one
// GenerationPaused.
struct GenerationProgressed {
  double time = 0;
  std::int64_t sample = 0;
  std::int64_t tokens = 0;
  EngineSpans spans;                 // the engine's account of its tokens' versions; empty: none
  std::int64_t engine = kAnyEngine;  // the reporting engine (see kAnyEngine)
};
struct SampleProgress {
  std::int64_t sample = 0;
  std::int64_t tokens = 0;  // response tokens so far, >= the last reported
  EngineSpans spans;        // the engine's account of its tokens' versions; empty: none
};
// The engine paused for SyncWeights{version, interrupt = true} and is idle: every
// sample it paused (those still in flight on it), each once, with its progress. The
// same state and commands as a GenerationProgressed per sample at `time`, in this
// order; one report per interrupting sync (then WeightsLoaded). Refused, naming
// engine, version or samples[i].sample / .tokens, for an engine not pausing (or already
// reported), another version, a sample not paused on it, a duplicate, tokens below the
// last reported, or a paused sample left out ("samples").
struct GenerationPaused {
  double time = 0;
  std::int64_t engine = 0;
  std::int64_t version = 0;  // the SyncWeights command's
  std::vector<SampleProgress> samples;
};
// What an engine measured of one request (a sample's run on it, Dispatch to finish),
// in run seconds; zero: not measured. The core ignores it; the runtime sums it
// (RuntimeStatus::requests).
struct RequestTelemetry {
  std::int64_t generated_tokens = 0;  // tokens − resume_from
  std::int64_t preemptions = 0;       // by the engine's own scheduler (KV cache evicted)
  std::int64_t interruptions = 0;     // paused for an interrupting weight sync
  double first_token_seconds = 0;     // Dispatch to the first new token
  double seconds = 0;                 // Dispatch to finish, pauses included
  double paused_seconds = 0;          // of those, paused for weight syncs
};
struct GenerationFinished {
  double time = 0;
  std::int64_t sample = 0;
  // Total response tokens, >= the progress reported, <= max_response_tokens.
  std::int64_t tokens = 0;
  double reward = 0;
  EngineSpans spans;  // the engine's account of its tokens' versions; empty: none
  std::optional<RequestTelemetry> telemetry;
  std::int64_t engine = kAnyEngine;  // the reporting engine (see kAnyEngine)
};
// An external judgement (e.g. a verifier) dropping a whole group. From an engine
// (engine >= 0) only while the group runs there alone: at least one of its samples in
// flight on that engine and none on another (else refused, naming "group").
struct GroupFiltered {
  double time = 0;
  std::int64_t group = 0;
  std::int64_t engine = kAnyEngine;  // kAnyEngine: the trainer's or the driver's judgement
};
// The trainer call started last has finished (with streaming, a step is several calls).
struct TrainStepFinished {
  double time = 0;
  std::int64_t step = 0;  // the step started last
  std::int64_t call = 0;  // and its call, in [0, train_calls_per_sync)
};
// Colocated: the engine has freed its GPU memory after Release.
struct EngineReleased {
  double time = 0;
  std::int64_t engine = 0;
};
// After an interrupting sync, the samples paused on the engine that no pause report
// covered (a report refused or lost: the engine is out of step) are aborted on it (Abort,
// before the Resume) and go back to the queue with the progress last reported
// (Counters::unreported_pauses), rather than refusing WeightsLoaded and leaving the engine
// in the sync.
struct WeightsLoaded {
  double time = 0;
  std::int64_t engine = 0;
  std::int64_t version = 0;  // the version of the SyncWeights command
};

using Event =
    std::variant<PromptsAvailable, EngineJoined, EngineLeft, EngineFailed, GenerationProgressed,
                 GenerationFinished, GroupFiltered, TrainStepFinished, WeightsLoaded,
                 EngineReleased, GenerationPaused, EngineAttached>;

// ---- Commands (core → driver). ----

struct SampleWork {
  std::int64_t sample = 0;
  std::int64_t group = 0;
  std::int64_t prompt = 0;            // Prompt::id
  std::int64_t prompt_tokens = 0;     // Prompt::prompt_tokens
  std::int64_t resume_from = 0;       // tokens already generated (kept from earlier runs)
  std::int64_t predicted_tokens = 0;  // predicted total response tokens
};
// Start (or continue, resume_from > 0) these samples on the engine, under its
// current version.
struct Dispatch {
  std::int64_t engine = 0;
  std::int64_t version = 0;
  std::vector<SampleWork> samples;
};
// Stop these samples on the engine and forget them (their tokens are discarded).
struct Abort {
  std::int64_t engine = 0;
  std::vector<std::int64_t> samples;
};
// Load `version` on the engine; with interrupt, pause its generations first and
// report their progress (GenerationPaused, or GenerationProgressed per sample), then
// WeightsLoaded. With interrupt and pause kAbort the engine then forgets the paused
// samples instead of holding them for Resume (the core dispatches them to it again).
struct SyncWeights {
  std::int64_t engine = 0;
  std::int64_t version = 0;
  bool interrupt = false;
  PauseMode pause = PauseMode::kKeep;  // with interrupt
  // A released engine's memory to take back, in this order: its weights' memory before
  // loading the new weights into it, its KV cache after. Empty: not released.
  std::vector<MemoryTag> resume;
  // Never set by the core; the runtime's (runtime.h): an engine was lost during the sync
  // of `version`, and the transfer group is rebuilt without it. The engine joins the new
  // group; still loading `version`, it loads it by the new plan (one WeightsLoaded, as
  // the sync's); holding it, it reports nothing. It never pauses.
  bool replan = false;
};
// Continue the interrupted samples under the engine's new version.
struct Resume {
  std::int64_t engine = 0;
  std::int64_t version = 0;
  std::vector<std::int64_t> samples;
};
// Colocated: free the (idle) engine's GPU memory of these kinds for the trainer, then
// report EngineReleased. The next SyncWeights wakes it up (SyncWeights::resume).
struct Release {
  std::int64_t engine = 0;
  std::vector<MemoryTag> tags;  // weights and KV cache
};
struct StartTrain {
  std::int64_t step = 0;
  std::int64_t call = 0;              // in [0, train_calls_per_sync): streaming's k-th call
  std::int64_t version = 0;           // == step
  std::vector<std::int64_t> groups;   // P / train_calls_per_sync groups, ascending
  std::vector<std::int64_t> samples;  // their samples (G each), ascending
  std::vector<std::int64_t> lengths;  // prompt + response tokens of each sample
  // The balancer's whole-step plan of `lengths` (when a planner is set).
  std::optional<balance::PlannedStep> plan;
};

using Command = std::variant<Dispatch, Abort, SyncWeights, Resume, StartTrain, Release>;

// ---- Options. ----

// Decides whether a complete group is kept for training (true) or filtered.
using GroupFilter = std::function<bool(std::span<const double> rewards)>;
// The built-in filter of dynamic sampling: drop groups whose rewards are all equal.
bool KeepUnlessAllEqual(std::span<const double> rewards);

// Plans the training step of a closed batch (lengths: prompt + response tokens).
using StepPlanner = std::function<balance::PlannedStep(std::span<const std::int64_t> lengths,
                                                       std::span<const std::int64_t> groups)>;

// The orchestrator's policy: the values that decide what it does. A simulation's
// config carries this part (SimulatorConfig::orchestrator); the embedder's hooks are in
// OrchestratorOptions.
struct OrchestratorPolicy {
  Mode mode = Mode::kSync;
  std::int64_t max_staleness = 1;                                  // s for kAsync, >= 0
  StalenessPolicy staleness_policy = StalenessPolicy::kAdmission;  // kAsync only
  // α for kFraction (where max_staleness is unused), in [0, 1000000].
  double staleness_fraction = 0;
  bool partial_rollout = true;  // kAsync only: interrupt and resume at a sync
  // kAsync with partial_rollout only (else kKeep): where interrupted samples continue.
  PauseMode pause_mode = PauseMode::kKeep;
  double oversample = 0;                // r >= 0: admit up to ceil((1 + r)·P) per batch
  std::int64_t prompts_per_step = 1;    // P >= 1
  std::int64_t samples_per_prompt = 1;  // G >= 1
  // Streaming: trainer calls per weight sync, k >= 1, dividing prompts_per_step.
  std::int64_t train_calls_per_sync = 1;
  bool colocated = false;  // kSync only: engines and trainer alternate on the same GPUs
  bool keep_partial_on_failure = false;
  // Dispatch queued samples longest predicted first (within a target batch); false:
  // in admission order, first in first out, as the peers' rollout loops do.
  bool longest_first = true;
  // Each group's samples only to its home engine, the (g mod E)-th of the E engines
  // alive (by id), in queue order as its slots free up (frameworks that chunk each
  // batch over their servers); false: to the least loaded engine.
  bool even_split = false;
  // At most this many groups generating at once, >= 0 (0: no limit): a group holds its
  // place from the dispatch of its first sample until all its samples are complete
  // (verl's fully-async rollouter runs at most 16 prompts per inference server, each
  // with all its samples). Queued samples of generating groups go first when full.
  std::int64_t max_generating_groups = 0;
  // The length predictor's fallback quantile of the finished lengths, in (0, 1].
  double length_quantile = 0.5;
  // Response tokens predicted before any sample has finished, >= 1.
  std::int64_t initial_prediction = 1024;
  // The engines' generation cap (vLLM's max_tokens, a framework's response length),
  // >= 0 (0: no cap below 2^40): a progress or finish report of more response tokens
  // is refused, naming "tokens".
  std::int64_t max_response_tokens = 0;
  // Reporting only (decides nothing): the first steps Metrics::steady_seconds_per_step
  // leaves out, in [0, 1000000], as the peers leave out their unoverlapped first steps.
  std::int64_t warmup_steps = 1;
};

// The policy and the embedder's hooks. Written with the policy's designated
// initializers in inner braces: OrchestratorOptions{{.mode = Mode::kAsync, ...}}.
struct OrchestratorOptions : OrchestratorPolicy {
  std::int64_t num_steps = 0;  // stop admitting after this many batches; 0: no end
  GroupFilter filter;          // empty: keep every group
  StepPlanner planner;         // empty: StartTrain carries no plan
};

// Throws std::invalid_argument naming the field and its bound.
void Validate(const OrchestratorOptions& options);

// The staleness bound the mode runs with, in versions: sync 0, one_step_off 1, async
// max_staleness (fraction: ⌈α⌉, the batches generation may run ahead). O(1).
std::int64_t EffectiveStaleness(const OrchestratorPolicy& options);

// ---- State the driver and the reports read. ----

struct Counters {  // in samples unless named *_groups
  std::int64_t admitted = 0;
  std::int64_t trained = 0;
  std::int64_t filtered = 0;
  std::int64_t buffered = 0;   // complete, not yet trained
  std::int64_t queued = 0;     // waiting for an engine
  std::int64_t in_flight = 0;  // dispatched (running, interrupted or being resumed)
  std::int64_t admitted_groups = 0;
  std::int64_t trained_groups = 0;
  std::int64_t filtered_groups = 0;
  std::int64_t restarts = 0;          // samples whose tokens were discarded, generated again
  std::int64_t discarded_tokens = 0;  // tokens thrown away by restarts and failures
  // Of those, the ones the strict policy threw away for staleness (0 under admission).
  std::int64_t stale_restarts = 0;
  std::int64_t stale_discarded_tokens = 0;
  std::int64_t partial_samples = 0;  // trained samples with tokens of > 1 version
  // Paused samples an interrupting sync with pause_mode kAbort had aborted, dispatched
  // again to their engine (resume_from = their tokens) once it loaded the weights.
  std::int64_t resubmitted = 0;
  std::int64_t trained_tokens = 0;  // prompt + response tokens of trained samples
  std::int64_t steps_started = 0;
  std::int64_t steps_finished = 0;
  std::int64_t engine_failures = 0;  // EngineFailed events
  // Generation reports carrying an engine's account of its tokens' versions (EngineSpans),
  // and those whose account differed from the core's inference (the engine's recorded).
  std::int64_t version_reports = 0;
  std::int64_t version_corrections = 0;
  // Paused samples an engine's WeightsLoaded came without a report of, taken back.
  std::int64_t unreported_pauses = 0;
};

// A trained sample, as the trainer receives it (kept for the last started step).
struct TrainedSample {
  std::int64_t sample = 0;
  std::int64_t response_tokens = 0;
  std::vector<VersionSpan> spans;  // ascending first_token, in generation order
};

// Time-based figures over [first event, now].
struct Metrics {
  double elapsed_seconds = 0;
  double samples_per_second = 0;  // trained samples / elapsed
  double tokens_per_second = 0;   // trained prompt + response tokens / elapsed
  double trainer_idle_ratio = 0;  // time not training / elapsed
  // Per engine ever joined (ascending id): time alive with nothing in flight and no
  // weights loading / time alive. And their mean.
  std::vector<std::int64_t> engines;
  std::vector<double> engine_idle_ratio;
  double mean_engine_idle_ratio = 0;
  double partial_rollout_ratio = 0;  // trained samples with tokens of > 1 version / trained
  std::int64_t weight_syncs = 0;     // completed SyncWeights (per engine)
  // Their total time, command to WeightsLoaded: an interrupted engine's wait for the
  // decode step in progress included, then the load.
  double weight_sync_seconds = 0;
  double seconds_per_weight_sync = 0;  // their mean: the time one sync takes an engine
  // Per finished train step, as the peers report them: elapsed / steps, and the time
  // the trainer waited for a batch (verl's timing_s/gen in async mode).
  double seconds_per_step = 0;
  double trainer_wait_seconds_per_step = 0;
  // Per finished step, means over the steps after warmup_steps (over all of them when
  // none is past the warm-up): the engines' own generation time (the
  // first dispatch of the step's samples to the finish of its last one: no wait for
  // the trainer, no release), the trainer's time on the step (its calls), and in mode
  // kSync the switch between them (step time − generation − training, at least 0: weight
  // sync, release and resume on the critical path; 0 in the overlapping modes). A sync
  // step of one trainer call is their sum; streamed (train_calls_per_sync > 1), its first
  // calls train while the rest generates.
  double generation_seconds_per_step = 0;
  double train_seconds_per_step = 0;
  double switch_seconds_per_step = 0;
  // The step time after warmup_steps: (finish of the last step − finish of step
  // warmup_steps − 1) / (steps − warmup_steps); 0 until a step past the warm-up finished.
  double steady_seconds_per_step = 0;
  std::vector<std::int64_t> staleness_histogram;  // [k] = trained samples of staleness k
  std::int64_t max_staleness = 0;                 // the largest k with samples
  // [k] = trained response tokens generated k versions before the step that trained
  // them (what an off-policy correction must cover).
  std::vector<std::int64_t> token_staleness_histogram;
};

class Orchestrator {
 public:
  // Throws std::invalid_argument on invalid options (see Validate).
  explicit Orchestrator(OrchestratorOptions options);
  ~Orchestrator();
  Orchestrator(Orchestrator&&) noexcept;
  Orchestrator& operator=(Orchestrator&&) noexcept;

  // Applies one event and appends the resulting commands to `out`. Throws
  // std::invalid_argument (naming the field) on an event that contradicts the state
  // (an unknown engine or sample, time going backwards, a step that was not started…);
  // the state is then unchanged.
  void Handle(const Event& event, std::vector<Command>& out);

  const Counters& counters() const;
  // The figures up to `now` (>= the last event's time). O(engines).
  Metrics metrics(double now) const;
  // The samples of the last StartTrain, with their version spans.
  const std::vector<TrainedSample>& last_batch() const;
  // The policy version the trainer will produce next (= steps finished).
  std::int64_t latest_version() const;
  // The engines joined (not left or failed), ascending. O(engines).
  std::vector<std::int64_t> engines() const;
  // Whether `attached` would keep its engine as it is (see EngineAttached). O(k log k)
  // for k samples.
  bool KeepsEngine(const EngineAttached& attached) const;
  bool done() const;  // num_steps > 0 and that many steps finished

  // Checks conservation and the staleness bound over the whole state; throws
  // std::logic_error describing the first broken invariant. O(n).
  void CheckInvariants() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace rlsched::scheduler

#endif  // RLSCHED_SCHEDULER_ORCHESTRATOR_H_
