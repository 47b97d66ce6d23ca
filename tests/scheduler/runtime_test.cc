// The live runtime (runtime.h) with in-process engines and trainer: under a manual
// clock (one event at a time, deterministic), and in real time with a driver thread
// posting while the graph runs.

#include "rlsched/scheduler/runtime.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <queue>
#include <set>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "rlsched/rollout/model.h"

namespace rlsched::scheduler {
namespace {

// Emulated engines and trainer. Every sample decodes one token per `seconds_per_token`
// from its dispatch (or resume), its length a fixed function of its id; a weight sync
// takes `sync_seconds`, a trainer call `train_seconds`. Answers are queued as events due
// at a time; a driver posts them in time order.
class Cluster final : public EngineBackend, public TrainerBackend {
 public:
  struct Timing {
    double seconds_per_token = 1e-3;
    double sync_seconds = 0.5;
    double release_seconds = 0.2;
    double train_seconds = 3.0;
    // An engine paused by an interrupting sync reports a GenerationProgressed per sample
    // (an older worker) instead of one GenerationPaused.
    bool per_sample_progress = false;
    // Engines report their account of their tokens' versions (the version of each
    // Dispatch and Resume, switching at the paused count) and each finish's telemetry.
    bool accounts = false;
  };
  Cluster(const Clock& clock, Timing timing) : clock_(clock), timing_(timing) {}

  static std::int64_t LengthOf(std::int64_t sample) {
    // Heavy-ish tail: most samples short, one in 16 long.
    const std::uint64_t h = static_cast<std::uint64_t>(sample) * 0x9E3779B97F4A7C15ULL;
    const std::int64_t base = 20 + static_cast<std::int64_t>((h >> 33) % 400);
    return (h >> 60) == 0 ? base * 8 : base;
  }

  void Execute(const Command& command, const EngineTransfers* transfers) override {
    std::lock_guard lock(mutex_);
    const double now = clock_.Now();
    if (const auto* dispatch = std::get_if<Dispatch>(&command)) {
      if (fail_dispatch_engine_ == dispatch->engine) {
        // The connection is gone, and the engine's generations with it.
        fail_dispatch_engine_ = -1;
        std::erase_if(running_, [engine = dispatch->engine](const auto& entry) {
          return entry.second.engine == engine;
        });
        throw std::runtime_error("connection reset");
      }
      for (const SampleWork& work : dispatch->samples) {
        Start(dispatch->engine, dispatch->version, work.sample, work.resume_from, now, false);
        ++dispatched_;
      }
    } else if (const auto* abort = std::get_if<Abort>(&command)) {
      for (const std::int64_t s : abort->samples) running_.erase(s);
    } else if (const auto* sync = std::get_if<SyncWeights>(&command)) {
      ++syncs_;
      if (transfers != nullptr) sync_transfers_.push_back({*sync, *transfers});
      if (sync->replan) return;  // loading it still (WeightsLoaded due) or holding it
      if (sync->interrupt) {
        GenerationPaused paused{.engine = sync->engine, .version = sync->version};
        for (auto& [sample, run] : running_) {
          if (run.engine != sync->engine || run.paused) continue;
          const auto decoded =
              static_cast<std::int64_t>((now - run.start) / timing_.seconds_per_token);
          run.tokens = std::min(run.resume_from + decoded, LengthOf(sample));
          run.paused = true;
          run.paused_at = now;
          ++run.interruptions;
          ++run.epoch;
          EngineSpans spans = Account(run, run.tokens);
          if (timing_.per_sample_progress) {
            Due(now, sync->engine,
                GenerationProgressed{
                    .sample = sample, .tokens = run.tokens, .spans = std::move(spans)});
          } else {
            paused.samples.push_back(
                {.sample = sample, .tokens = run.tokens, .spans = std::move(spans)});
          }
        }
        if (!timing_.per_sample_progress) Due(now, sync->engine, std::move(paused));
      }
      if (fail_sync_ == std::make_pair(sync->engine, sync->version)) {
        // Lost half-way through the transfer, and its generations with it.
        std::erase_if(running_, [engine = sync->engine](const auto& entry) {
          return entry.second.engine == engine;
        });
        Due(now + timing_.sync_seconds / 2, sync->engine, EngineFailed{.engine = sync->engine});
        return;
      }
      Due(now + timing_.sync_seconds, sync->engine,
          WeightsLoaded{.engine = sync->engine, .version = sync->version});
    } else if (const auto* resume = std::get_if<Resume>(&command)) {
      for (const std::int64_t s : resume->samples) {
        const Run run = running_.at(s);
        Start(resume->engine, resume->version, s, run.tokens, now, true);
      }
    } else if (const auto* release = std::get_if<Release>(&command)) {
      Due(now + timing_.release_seconds, release->engine,
          EngineReleased{.engine = release->engine});
    }
  }

  void Train(const StartTrain& call) override {
    std::lock_guard lock(mutex_);
    if (fail_training_) throw std::runtime_error("out of memory");
    for (const std::int64_t s : call.samples) trained_.push_back(s);
    calls_.push_back(call);
    Due(clock_.Now() + timing_.train_seconds, kTrainer,
        TrainStepFinished{.step = call.step, .call = call.call});
  }

  // The earliest due event (ties: the worker's id, then the order they were queued, so
  // that the order in which the graph's parallel nodes hand different workers their
  // commands does not change the run), skipping finishes of runs
  // that were interrupted, aborted or restarted since.
  std::optional<std::pair<double, Event>> PopDue() {
    std::lock_guard lock(mutex_);
    while (!due_.empty()) {
      Pending next = due_.top();
      due_.pop();
      if (next.sample >= 0) {
        const auto it = running_.find(next.sample);
        if (it == running_.end() || it->second.epoch != next.epoch || it->second.paused) continue;
        ++finishes_;
        generated_tokens_ += LengthOf(next.sample) - it->second.from;
        interruptions_ += it->second.interruptions;
        running_.erase(it);
      }
      return std::make_pair(next.time, next.event);
    }
    return std::nullopt;
  }
  std::optional<double> NextDueTime() {
    std::lock_guard lock(mutex_);
    if (due_.empty()) return std::nullopt;
    return due_.top().time;
  }

  void FailNextDispatchTo(std::int64_t engine) {
    std::lock_guard lock(mutex_);
    fail_dispatch_engine_ = engine;
  }
  void FailTraining() {
    std::lock_guard lock(mutex_);
    fail_training_ = true;
  }
  // The engine fails half-way through its sync to `version`.
  void FailDuringSync(std::int64_t engine, std::int64_t version) {
    std::lock_guard lock(mutex_);
    fail_sync_ = {engine, version};
  }

  std::vector<std::int64_t> trained() {
    std::lock_guard lock(mutex_);
    return trained_;
  }
  std::vector<StartTrain> calls() {
    std::lock_guard lock(mutex_);
    return calls_;
  }
  struct SyncRecord {
    SyncWeights sync;
    EngineTransfers part;
  };
  std::vector<SyncRecord> sync_transfers() {
    std::lock_guard lock(mutex_);
    return sync_transfers_;
  }
  std::int64_t syncs() {
    std::lock_guard lock(mutex_);
    return syncs_;
  }
  // Of the finishes the driver took (PopDue): their count, the response tokens they
  // generated since their dispatch, and their interruptions.
  std::int64_t finishes() {
    std::lock_guard lock(mutex_);
    return finishes_;
  }
  std::int64_t generated_tokens() {
    std::lock_guard lock(mutex_);
    return generated_tokens_;
  }
  std::int64_t interruptions() {
    std::lock_guard lock(mutex_);
    return interruptions_;
  }

 private:
  struct Run {
    std::int64_t engine = 0;
    double start = 0;
    std::int64_t resume_from = 0;
    std::int64_t tokens = 0;
    bool paused = false;
    std::int64_t epoch = 0;
    // The engine's account since the dispatch (Timing::accounts).
    std::vector<VersionSpan> spans;
    std::int64_t from = 0;
    double dispatched = 0;
    double paused_at = 0;
    double paused_seconds = 0;
    std::int64_t interruptions = 0;
  };

  EngineSpans Account(const Run& run, std::int64_t tokens) const {
    if (!timing_.accounts || tokens <= run.from) return {};
    EngineSpans out;
    for (const VersionSpan& span : run.spans) {
      if (span.first_token < tokens) out.push_back(span);
    }
    return out;
  }
  struct Pending {
    double time = 0;
    std::int64_t worker = 0;  // the engine, or kTrainer
    std::int64_t seq = 0;
    Event event;
    std::int64_t sample = -1;  // a GenerationFinished's sample
    std::int64_t epoch = 0;
    bool operator<(const Pending& other) const {  // the priority queue's top is the earliest
      if (time != other.time) return time > other.time;
      return worker != other.worker ? worker > other.worker : seq > other.seq;
    }
  };

  // A dispatch (resumed false) or a resume of `sample` under `version`.
  void Start(std::int64_t engine, std::int64_t version, std::int64_t sample,
             std::int64_t resume_from, double now, bool resumed) {
    Run& run = running_[sample];
    const std::int64_t epoch = run.epoch + 1;
    Run next{.engine = engine,
             .start = now,
             .resume_from = resume_from,
             .tokens = resume_from,
             .epoch = epoch};
    if (resumed) {
      next.spans = std::move(run.spans);
      next.from = run.from;
      next.dispatched = run.dispatched;
      next.paused_seconds = run.paused_seconds + (now - run.paused_at);
      next.interruptions = run.interruptions;
      while (!next.spans.empty() && next.spans.back().first_token >= resume_from) {
        next.spans.pop_back();
      }
      if (next.spans.empty() || next.spans.back().version != version) {
        next.spans.push_back({.version = version, .first_token = resume_from});
      }
    } else {
      next.spans = {{.version = version, .first_token = resume_from}};
      next.from = resume_from;
      next.dispatched = now;
    }
    run = std::move(next);
    const std::int64_t length = LengthOf(sample);
    const double finish =
        now + static_cast<double>(std::max<std::int64_t>(length - resume_from, 0)) *
                  timing_.seconds_per_token;
    const double reward = (sample % 3 == 0) ? 1.0 : 0.0;
    GenerationFinished finished{.sample = sample, .tokens = length, .reward = reward};
    if (timing_.accounts) {
      finished.spans = Account(run, length);
      finished.telemetry = RequestTelemetry{.generated_tokens = length - run.from,
                                            .interruptions = run.interruptions,
                                            .first_token_seconds = timing_.seconds_per_token,
                                            .seconds = finish - run.dispatched,
                                            .paused_seconds = run.paused_seconds};
    }
    due_.push(Pending{.time = finish,
                      .worker = engine,
                      .seq = seq_++,
                      .event = std::move(finished),
                      .sample = sample,
                      .epoch = epoch});
  }
  void Due(double time, std::int64_t worker, Event event) {
    due_.push(Pending{.time = time, .worker = worker, .seq = seq_++, .event = std::move(event)});
  }
  static constexpr std::int64_t kTrainer = -1;

  const Clock& clock_;
  Timing timing_;
  std::mutex mutex_;
  std::priority_queue<Pending> due_;
  std::int64_t seq_ = 0;
  std::map<std::int64_t, Run> running_;
  std::vector<std::int64_t> trained_;
  std::vector<StartTrain> calls_;
  std::vector<SyncRecord> sync_transfers_;
  std::int64_t dispatched_ = 0;
  std::int64_t syncs_ = 0;
  std::int64_t finishes_ = 0;
  std::int64_t generated_tokens_ = 0;
  std::int64_t interruptions_ = 0;
  std::int64_t fail_dispatch_engine_ = -1;
  std::pair<std::int64_t, std::int64_t> fail_sync_ = {-1, -1};
  bool fail_training_ = false;
};

std::vector<Prompt> Prompts(std::int64_t count) {
  std::vector<Prompt> prompts;
  for (std::int64_t i = 0; i < count; ++i)
    prompts.push_back({.id = i, .prompt_tokens = 50 + i % 70});
  return prompts;
}

RuntimeOptions AsyncOptions(std::int64_t steps) {
  RuntimeOptions options;
  options.orchestrator = {{.mode = Mode::kAsync,
                           .max_staleness = 1,
                           .partial_rollout = true,
                           .prompts_per_step = 8,
                           .samples_per_prompt = 4}};
  options.orchestrator.num_steps = steps;
  options.step = balance::StepOptions{.num_ranks = 4};
  options.step->micro_batch.max_tokens_per_micro_batch = 8192;
  options.check_invariants = true;
  return options;
}

// Runs under the manual clock: posts the joins and the prompts at time 0, then the
// cluster's answers one at a time in time order, waiting for the graph to be idle after
// each. Returns the number of events posted.
std::int64_t Drive(Runtime& runtime, Cluster& cluster, ManualClock& clock, std::int64_t engines,
                   std::int64_t prompts, std::int64_t max_events = 200000) {
  for (std::int64_t e = 0; e < engines; ++e) {
    runtime.Post(EngineJoined{.engine = e, .max_concurrent = 8});
  }
  runtime.Post(PromptsAvailable{.prompts = Prompts(prompts)});
  runtime.WaitIdle();
  std::int64_t posted = 0;
  while (!runtime.Status().done && posted < max_events) {
    const auto next = cluster.PopDue();
    if (!next) break;
    clock.Set(std::max(clock.Now(), next->first));
    runtime.Post(next->second);
    runtime.WaitIdle();
    ++posted;
  }
  return posted;
}

// Every sample trained at most once, and the trainer's own count equals the core's.
void ExpectTrainedOnce(Cluster& cluster, const RuntimeStatus& status) {
  const std::vector<std::int64_t> trained = cluster.trained();
  const std::set<std::int64_t> unique(trained.begin(), trained.end());
  EXPECT_EQ(unique.size(), trained.size());
  EXPECT_EQ(static_cast<std::int64_t>(trained.size()), status.counters.trained);
  const Counters& c = status.counters;
  EXPECT_EQ(c.admitted, c.trained + c.filtered + c.buffered + c.queued + c.in_flight);
}

TEST(RuntimeTest, SyncRunTrainsEveryStepWithItsPlan) {
  ManualClock clock;
  Cluster cluster(clock, {});
  RuntimeOptions options = AsyncOptions(3);
  options.orchestrator.mode = Mode::kSync;
  std::int64_t commands = 0;  // the core node's thread; read after WaitIdle
  options.journal = [&commands](const Event&, std::span<const Command> given) {
    commands += static_cast<std::int64_t>(given.size());
  };
  Runtime runtime(options, cluster, cluster, clock);
  Drive(runtime, cluster, clock, 4, 64);
  const RuntimeStatus status = runtime.Status();
  ASSERT_TRUE(status.done);
  // Every command handed to a backend has its event-to-command latency counted.
  EXPECT_EQ(status.command_latency.count, commands);
  EXPECT_GT(status.command_latency.max_seconds, 0);
  EXPECT_LE(status.command_latency.p50_seconds, status.command_latency.p99_seconds);
  EXPECT_LE(status.command_latency.p99_seconds, status.command_latency.max_seconds);
  EXPECT_EQ(status.counters.steps_finished, 3);
  EXPECT_EQ(status.rejected_events, 0);
  ExpectTrainedOnce(cluster, status);
  EXPECT_EQ(status.counters.trained, 3 * 8 * 4);
  for (const StartTrain& call : cluster.calls()) {
    ASSERT_TRUE(call.plan.has_value());
    // The plan places every sample of the call exactly once.
    std::vector<int> seen(call.samples.size(), 0);
    for (const balance::RankPlan& rank : call.plan->plan.ranks) {
      for (const balance::MicroBatch& batch : rank.micro_batches) {
        for (const std::int64_t i : batch.indices) ++seen.at(static_cast<std::size_t>(i));
      }
    }
    for (const int count : seen) EXPECT_EQ(count, 1);
    EXPECT_EQ(call.plan->plan.ranks.size(), 4u);
    EXPECT_EQ(call.plan->plan.empty_micro_batches, 0);
  }
  EXPECT_TRUE(runtime.WaitUntilDone(std::chrono::milliseconds(0)));
}

// Strict: every trained token at most s = 1 versions old. Admission (async's default):
// no token thrown away, a resumed sample may be older.
TEST(RuntimeTest, AsyncPartialRolloutKeepsEachPolicysBoundAndConservation) {
  for (const StalenessPolicy policy : {StalenessPolicy::kStrict, StalenessPolicy::kAdmission}) {
    SCOPED_TRACE(policy == StalenessPolicy::kStrict ? "strict" : "admission");
    ManualClock clock;
    Cluster cluster(clock, {});
    std::vector<StepProgress> progress;
    RuntimeOptions options = AsyncOptions(6);
    options.orchestrator.staleness_policy = policy;
    options.on_step = [&](const StepProgress& p) { progress.push_back(p); };
    Runtime runtime(options, cluster, cluster, clock);
    Drive(runtime, cluster, clock, 6, 256);
    const RuntimeStatus status = runtime.Status();
    ASSERT_TRUE(status.done) << status.last_rejection;
    EXPECT_EQ(status.rejected_events, 0) << status.last_rejection;
    ExpectTrainedOnce(cluster, status);
    EXPECT_GT(status.counters.partial_samples, 0);  // samples resumed across a sync
    if (policy == StalenessPolicy::kStrict) {
      EXPECT_LE(status.metrics.max_staleness, 1);
    } else {
      EXPECT_EQ(status.counters.discarded_tokens, 0);
    }
    ASSERT_EQ(progress.size(), 6u);
    for (std::size_t i = 0; i < progress.size(); ++i) {
      EXPECT_EQ(progress[i].step, static_cast<std::int64_t>(i));
      EXPECT_EQ(progress[i].counters.steps_finished, static_cast<std::int64_t>(i) + 1);
    }
  }
}

// The commands a run gives, as text, to compare runs.
std::string DescribeCommand(const Command& command) {
  std::ostringstream out;
  std::visit(
      [&out](const auto& c) {
        using T = std::decay_t<decltype(c)>;
        if constexpr (std::is_same_v<T, Dispatch>) {
          out << "dispatch " << c.engine << " v" << c.version;
          for (const SampleWork& w : c.samples) out << ' ' << w.sample << '+' << w.resume_from;
        } else if constexpr (std::is_same_v<T, Abort>) {
          out << "abort " << c.engine;
          for (const std::int64_t s : c.samples) out << ' ' << s;
        } else if constexpr (std::is_same_v<T, SyncWeights>) {
          out << "sync " << c.engine << " v" << c.version << (c.interrupt ? " interrupt" : "");
        } else if constexpr (std::is_same_v<T, Resume>) {
          out << "resume " << c.engine << " v" << c.version;
          for (const std::int64_t s : c.samples) out << ' ' << s;
        } else if constexpr (std::is_same_v<T, Release>) {
          out << "release " << c.engine;
        } else {
          out << "train " << c.step << '.' << c.call;
          for (const std::int64_t s : c.samples) out << ' ' << s;
        }
      },
      command);
  return out.str();
}

TEST(RuntimeTest, SameEventsGiveSameCommandsAndTheLogReplays) {
  std::vector<std::string> first;
  std::vector<std::string> second;
  std::vector<Event> log;
  for (int run = 0; run < 2; ++run) {
    ManualClock clock;
    Cluster cluster(clock, {});
    RuntimeOptions options = AsyncOptions(4);
    std::vector<std::string>& out = run == 0 ? first : second;
    options.journal = [&out, &log, run](const Event& e, std::span<const Command> given) {
      for (const Command& c : given) out.push_back(DescribeCommand(c));
      if (run == 0) log.push_back(e);
    };
    Runtime runtime(options, cluster, cluster, clock);
    Drive(runtime, cluster, clock, 5, 128);
    runtime.Stop();
  }
  ASSERT_FALSE(first.empty());
  EXPECT_EQ(first, second);

  // A fresh core fed the logged (stamped) events gives the same commands.
  OrchestratorOptions core_options = AsyncOptions(4).orchestrator;
  Orchestrator core(core_options);
  std::vector<std::string> replayed;
  for (const Event& event : log) {
    std::vector<Command> commands;
    core.Handle(event, commands);
    for (const Command& c : commands) replayed.push_back(DescribeCommand(c));
  }
  EXPECT_EQ(replayed, first);
}

// Engines that report a pause in one GenerationPaused and engines that report each
// sample (older workers) give the same run; the pause reports replace every
// GenerationProgressed, and the logged run replays.
TEST(RuntimeTest, APauseReportGivesTheSameRunAsPerSampleReports) {
  std::vector<std::string> commands[2];
  std::int64_t paused_events[2] = {0, 0};
  std::int64_t progress_events[2] = {0, 0};
  std::int64_t events[2] = {0, 0};
  std::vector<Event> log;
  for (int run = 0; run < 2; ++run) {
    ManualClock clock;
    // Samples of 0.4 to 27 s against a 3 s step: the syncs interrupt many of them.
    Cluster cluster(clock, {.seconds_per_token = 0.01, .per_sample_progress = run == 1});
    RuntimeOptions options = AsyncOptions(6);
    options.journal = [&, run](const Event& e, std::span<const Command> given) {
      for (const Command& c : given) commands[run].push_back(DescribeCommand(c));
      paused_events[run] += std::holds_alternative<GenerationPaused>(e) ? 1 : 0;
      progress_events[run] += std::holds_alternative<GenerationProgressed>(e) ? 1 : 0;
      if (run == 0) log.push_back(e);
    };
    Runtime runtime(options, cluster, cluster, clock);
    Drive(runtime, cluster, clock, 5, 128);
    const RuntimeStatus status = runtime.Status();
    ASSERT_TRUE(status.done) << status.last_rejection;
    EXPECT_EQ(status.rejected_events, 0) << status.last_rejection;
    EXPECT_GT(status.counters.partial_samples, 0);
    ExpectTrainedOnce(cluster, status);
    events[run] = status.events;
    runtime.Stop();
  }
  ASSERT_FALSE(commands[0].empty());
  EXPECT_EQ(commands[0], commands[1]);
  EXPECT_GE(paused_events[0], 10);
  EXPECT_EQ(progress_events[0], 0);
  EXPECT_EQ(paused_events[1], 0);
  EXPECT_GT(progress_events[1], paused_events[0]);  // a report of several samples
  EXPECT_EQ(events[1] - events[0], progress_events[1] - paused_events[0]);

  Orchestrator core(AsyncOptions(6).orchestrator);
  std::vector<std::string> replayed;
  for (const Event& event : log) {
    std::vector<Command> out;
    core.Handle(event, out);
    for (const Command& c : out) replayed.push_back(DescribeCommand(c));
  }
  EXPECT_EQ(replayed, commands[0]);
}

// A run resumed from its journal (RuntimeResume): the core rebuilt from the logged
// events holds what the first life's did, and the trainer call the log left under way
// goes to the trainer again; the replayed events' commands do not go out.
TEST(RuntimeTest, AResumedRunRebuildsTheCoreAndSendsTheUnfinishedCallAgain) {
  std::int64_t open_calls = 0;  // cuts with a trainer call under way
  for (const std::int64_t cut : {40, 90, 150, 151, 152}) {
    ManualClock clock;
    Cluster first(clock, {});
    RuntimeOptions options = AsyncOptions(6);
    std::vector<Event> log;
    std::optional<StartTrain> open_call;
    options.journal = [&](const Event& e, std::span<const Command> given) {
      log.push_back(e);
      if (const auto* f = std::get_if<TrainStepFinished>(&e);
          f && open_call && open_call->step == f->step && open_call->call == f->call) {
        open_call.reset();
      }
      for (const Command& c : given) {
        if (const auto* start = std::get_if<StartTrain>(&c)) open_call = *start;
      }
    };
    RuntimeStatus before;
    {
      Runtime runtime(options, first, first, clock);
      Drive(runtime, first, clock, 3, 64, cut);
      runtime.Stop();
      before = runtime.Status();
    }
    ASSERT_FALSE(before.done) << "cut " << cut;
    ManualClock later(clock.Now());
    Cluster second(later, {});
    RuntimeOptions resumed = AsyncOptions(6);
    resumed.resume = RuntimeResume{.events = log};
    std::int64_t journaled = 0;
    resumed.journal = [&](const Event&, std::span<const Command>) { ++journaled; };
    Runtime runtime(resumed, second, second, later);
    runtime.WaitIdle();
    const RuntimeStatus after = runtime.Status();
    EXPECT_EQ(journaled, 0);  // the logged events are not logged again
    EXPECT_EQ(after.events + after.rejected_events, before.events + before.rejected_events);
    EXPECT_EQ(after.counters.admitted, before.counters.admitted);
    EXPECT_EQ(after.counters.trained, before.counters.trained);
    EXPECT_EQ(after.counters.in_flight, before.counters.in_flight);
    EXPECT_EQ(after.counters.queued, before.counters.queued);
    EXPECT_EQ(after.counters.steps_started, before.counters.steps_started);
    EXPECT_EQ(after.engines, (std::vector<std::int64_t>{0, 1, 2}));
    const std::vector<StartTrain> calls = second.calls();
    ASSERT_EQ(calls.size(), open_call ? 1u : 0u) << "cut " << cut;
    if (open_call) {
      ++open_calls;
      EXPECT_EQ(calls[0].step, open_call->step);
      EXPECT_EQ(calls[0].call, open_call->call);
      EXPECT_EQ(calls[0].samples, open_call->samples);
      EXPECT_TRUE(calls[0].plan.has_value());  // planned as any call
    }
  }
  EXPECT_GT(open_calls, 0);
}

TEST(RuntimeTest, RefusedEventsAreCountedAndTheRunGoesOn) {
  ManualClock clock;
  Cluster cluster(clock, {});
  Runtime runtime(AsyncOptions(2), cluster, cluster, clock);
  runtime.Post(GenerationFinished{.sample = 123456, .tokens = 5});  // never dispatched
  runtime.Post(TrainStepFinished{.step = 7});                       // never started
  runtime.WaitIdle();
  Drive(runtime, cluster, clock, 3, 64);
  const RuntimeStatus status = runtime.Status();
  EXPECT_TRUE(status.done);
  EXPECT_EQ(status.rejected_events, 2);
  EXPECT_NE(status.last_rejection.find("step"), std::string::npos) << status.last_rejection;
  ExpectTrainedOnce(cluster, status);
}

// Engines that report their tokens' versions and their requests' telemetry: the same
// run as engines that do not (their accounts match the core's inference: no
// correction), every report's account checked, and the telemetry summed as the engines
// counted it.
TEST(RuntimeTest, EnginesAccountsOfVersionsAndTelemetryAreRecorded) {
  std::vector<std::string> commands[2];
  RuntimeStatus statuses[2];
  std::int64_t finishes = 0;
  std::int64_t generated = 0;
  std::int64_t interruptions = 0;
  for (int run = 0; run < 2; ++run) {
    ManualClock clock;
    Cluster cluster(clock, {.seconds_per_token = 0.01, .accounts = run == 1});
    RuntimeOptions options = AsyncOptions(6);
    options.journal = [&commands, run](const Event&, std::span<const Command> given) {
      for (const Command& c : given) commands[run].push_back(DescribeCommand(c));
    };
    Runtime runtime(options, cluster, cluster, clock);
    Drive(runtime, cluster, clock, 5, 128);
    runtime.Stop();
    statuses[run] = runtime.Status();
    ASSERT_TRUE(statuses[run].done);
    EXPECT_EQ(statuses[run].rejected_events, 0) << statuses[run].last_rejection;
    if (run == 1) {
      finishes = cluster.finishes();
      generated = cluster.generated_tokens();
      interruptions = cluster.interruptions();
    }
  }
  ASSERT_FALSE(commands[0].empty());
  EXPECT_EQ(commands[1], commands[0]);
  EXPECT_EQ(statuses[0].counters.version_reports, 0);
  EXPECT_EQ(statuses[0].requests.requests, 0);
  const RuntimeStatus& status = statuses[1];
  EXPECT_GE(status.counters.version_reports, finishes);  // every finish, and the pauses'
  EXPECT_EQ(status.counters.version_corrections, 0);
  EXPECT_GT(status.counters.partial_samples, 0);  // accounts across weight syncs
  EXPECT_EQ(status.metrics.token_staleness_histogram,
            statuses[0].metrics.token_staleness_histogram);
  const RequestSummary& r = status.requests;
  EXPECT_EQ(r.requests, finishes);
  EXPECT_EQ(r.generated_tokens, generated);
  EXPECT_EQ(r.interruptions, interruptions);
  EXPECT_GT(r.interruptions, 0);
  EXPECT_EQ(r.preemptions, 0);
  EXPECT_EQ(r.invalid, 0);
  EXPECT_GT(r.paused_seconds, 0);
  EXPECT_GT(r.mean_seconds, 0);
  EXPECT_LE(r.p50_seconds, r.p99_seconds);
  EXPECT_LE(r.p99_seconds, r.max_seconds);
  EXPECT_LE(r.mean_seconds, r.max_seconds);
  // Every request's first token came 0.01 s after its dispatch (the histogram's bucket
  // edge is within 4.4% above).
  EXPECT_NEAR(r.mean_first_token_seconds, 0.01, 1e-9);
  EXPECT_GE(r.p99_first_token_seconds, 0.01 * (1 - 1e-9));
  EXPECT_LE(r.p99_first_token_seconds, 0.01 * 1.044);
}

// An account no engine could give is a protocol error: the report is refused (named,
// counted, the state unchanged) and the engine's corrected report is taken. A finish's
// bad telemetry is left out of the sums, the finish itself handled.
TEST(RuntimeTest, AnImpossibleVersionAccountIsRefusedAndBadTelemetryLeftOut) {
  ManualClock clock;
  Cluster cluster(clock, {});
  Runtime runtime(AsyncOptions(2), cluster, cluster, clock);
  runtime.Post(EngineJoined{.engine = 0, .max_concurrent = 4, .version = 0});
  runtime.Post(PromptsAvailable{.prompts = Prompts(8)});
  runtime.WaitIdle();
  ASSERT_EQ(runtime.Status().counters.in_flight, 4);
  // Sample 0 runs on engine 0 (version 0): version 3 does not exist yet.
  runtime.Post(
      GenerationFinished{.sample = 0, .tokens = 7, .spans = {{.version = 3, .first_token = 0}}});
  runtime.WaitIdle();
  RuntimeStatus status = runtime.Status();
  EXPECT_EQ(status.rejected_events, 1);
  EXPECT_NE(status.last_rejection.find("spans[0].version"), std::string::npos)
      << status.last_rejection;
  EXPECT_EQ(status.counters.in_flight, 4);
  EXPECT_EQ(status.counters.version_reports, 0);
  runtime.Post(
      GenerationFinished{.sample = 0,
                         .tokens = 7,
                         .spans = {{.version = 0, .first_token = 0}},
                         .telemetry = RequestTelemetry{.generated_tokens = 7, .seconds = -1}});
  runtime.Post(GenerationFinished{
      .sample = 1,
      .tokens = 9,
      .telemetry = RequestTelemetry{.generated_tokens = 9, .preemptions = 2, .seconds = 0.5}});
  runtime.WaitIdle();
  status = runtime.Status();
  EXPECT_EQ(status.rejected_events, 1) << status.last_rejection;
  EXPECT_EQ(status.counters.buffered + status.counters.trained, 2);
  EXPECT_EQ(status.counters.version_reports, 1);
  EXPECT_EQ(status.requests.invalid, 1);
  EXPECT_EQ(status.requests.requests, 1);
  EXPECT_EQ(status.requests.generated_tokens, 9);
  EXPECT_EQ(status.requests.preemptions, 2);
  EXPECT_DOUBLE_EQ(status.requests.mean_seconds, 0.5);
  EXPECT_EQ(status.requests.mean_first_token_seconds, 0);  // none measured it
}

// Heartbeats' load, summed per engine; a negative count is refused naming it.
TEST(RuntimeTest, HeartbeatsLoadIsSummedPerEngine) {
  ManualClock clock;
  Cluster cluster(clock, {});
  Runtime runtime(AsyncOptions(1), cluster, cluster, clock);
  runtime.ReportLoad(3, 5, 1);
  runtime.ReportLoad(1, 2, 0);
  runtime.ReportLoad(3, 1, 4);
  runtime.ReportLoad(3, 0, 0);
  const auto refused = [&](std::int64_t engine, std::int64_t running, std::int64_t waiting,
                           const std::string& field) {
    try {
      runtime.ReportLoad(engine, running, waiting);
      ADD_FAILURE() << field << ": accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()).rfind(field, 0), 0u) << e.what();
    }
  };
  refused(3, -1, 0, "running");
  refused(3, 0, -2, "waiting");
  refused(-1, 0, 0, "engine");
  const std::vector<EngineLoad> load = runtime.Status().engine_load;
  ASSERT_EQ(load.size(), 2u);
  EXPECT_EQ(load[0].engine, 1);
  EXPECT_EQ(load[0].heartbeats, 1);
  EXPECT_EQ(load[0].running, 2);
  EXPECT_EQ(load[0].max_running, 2);
  EXPECT_DOUBLE_EQ(load[0].mean_running, 2);
  EXPECT_EQ(load[1].engine, 3);
  EXPECT_EQ(load[1].heartbeats, 3);
  EXPECT_EQ(load[1].running, 0);  // the last report's
  EXPECT_EQ(load[1].waiting, 0);
  EXPECT_EQ(load[1].max_running, 5);
  EXPECT_EQ(load[1].max_waiting, 4);
  EXPECT_DOUBLE_EQ(load[1].mean_running, 2);
  EXPECT_DOUBLE_EQ(load[1].mean_waiting, 5.0 / 3);
}

TEST(RuntimeTest, AnEngineThatCannotTakeACommandFailsAndItsSamplesFinishElsewhere) {
  ManualClock clock;
  Cluster cluster(clock, {});
  cluster.FailNextDispatchTo(2);
  Runtime runtime(AsyncOptions(3), cluster, cluster, clock);
  Drive(runtime, cluster, clock, 4, 128);
  const RuntimeStatus status = runtime.Status();
  EXPECT_EQ(status.engine_failures_posted, 1);
  EXPECT_EQ(status.counters.engine_failures, 1);
  EXPECT_TRUE(status.done);
  ExpectTrainedOnce(cluster, status);
}

TEST(RuntimeTest, ATrainerErrorEndsTheRun) {
  ManualClock clock;
  Cluster cluster(clock, {});
  cluster.FailTraining();
  Runtime runtime(AsyncOptions(3), cluster, cluster, clock);
  Drive(runtime, cluster, clock, 2, 64, 2000);
  EXPECT_THROW(
      {
        try {
          runtime.WaitUntilDone(std::chrono::milliseconds(0));
        } catch (const std::runtime_error& e) {
          EXPECT_NE(std::string(e.what()).find("out of memory"), std::string::npos) << e.what();
          throw;
        }
      },
      std::runtime_error);
}

WeightSyncLayout TinyLayout(std::int64_t replicas) {
  return WeightSyncLayout{
      .model = rollout::ParseHfConfig(
          R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 96,
              "num_hidden_layers": 4, "num_attention_heads": 16, "num_key_value_heads": 4,
              "vocab_size": 1000, "tie_word_embeddings": false})"),
      .reshard = {.train = {.tp = 2, .pp = 2, .dp = 1}, .infer = {.tp = 2, .replicas = replicas}}};
}

// Each sync's part is its engine's replica's share of its membership's plan, checked
// against the plan itself: the transfers reaching the replica's ranks, their bytes
// once per rank reached; the parts of one epoch share one plan and membership.
// Returns the records by epoch.
std::map<std::int64_t, std::vector<Cluster::SyncRecord>> ExpectPartsOfTheirPlans(
    const std::vector<Cluster::SyncRecord>& records) {
  std::map<std::int64_t, std::vector<Cluster::SyncRecord>> by_epoch;
  std::map<std::size_t, const rollout::ReshardPlan*> plan_of_size;
  std::int64_t last_epoch = 0;
  for (const Cluster::SyncRecord& record : records) {
    const EngineTransfers& part = record.part;
    EXPECT_GE(part.epoch, last_epoch);  // epochs only go forward
    last_epoch = part.epoch;
    if (part.members == nullptr || part.plan == nullptr) {
      ADD_FAILURE() << "a part without its membership or plan";
      continue;
    }
    const std::vector<std::int64_t>& members = *part.members;
    EXPECT_TRUE(std::is_sorted(members.begin(), members.end()));
    if (part.replica < 0 || part.replica >= static_cast<std::int64_t>(members.size())) {
      ADD_FAILURE() << "replica " << part.replica << " outside its membership";
      continue;
    }
    EXPECT_EQ(members[static_cast<std::size_t>(part.replica)], record.sync.engine);
    const rollout::ReshardPlan& plan = *part.plan;
    EXPECT_EQ(plan.options.infer.replicas, static_cast<std::int64_t>(members.size()));
    EXPECT_EQ(plan.engine_ranks, plan.options.infer.tp * static_cast<std::int64_t>(members.size()));
    EXPECT_EQ(part.ranks, plan.options.infer.tp);
    EXPECT_EQ(part.rank_offset, plan.trainer_ranks + part.replica * part.ranks);  // separate GPUs
    EXPECT_EQ(part.world_size, plan.trainer_ranks + plan.engine_ranks);
    const auto [known, fresh] = plan_of_size.try_emplace(members.size(), &plan);
    EXPECT_EQ(known->second, &plan) << "one plan per number of replicas";
    std::vector<std::int64_t> expected;
    std::int64_t bytes = 0;
    for (std::size_t i = 0; i < plan.transfers.size(); ++i) {
      std::int64_t reached = 0;
      for (const std::int64_t rank : plan.transfers[i].dst_ranks) {
        reached += rank >= part.rank_offset && rank < part.rank_offset + part.ranks;
      }
      if (reached > 0) expected.push_back(static_cast<std::int64_t>(i));
      bytes += reached * plan.transfers[i].bytes;
    }
    EXPECT_EQ(part.transfers, expected);
    EXPECT_EQ(part.bytes, bytes);
    EXPECT_FALSE(part.transfers.empty());
    std::vector<Cluster::SyncRecord>& same = by_epoch[part.epoch];
    if (!same.empty()) {
      EXPECT_EQ(same.front().part.plan.get(), &plan);
      EXPECT_EQ(*same.front().part.members, members);
    }
    same.push_back(record);
  }
  return by_epoch;
}

TEST(RuntimeTest, EachEngineGetsItsReplicasTransfersOfItsMembershipsPlan) {
  ManualClock clock;
  Cluster cluster(clock, {});
  RuntimeOptions options = AsyncOptions(6);
  options.weight_sync = TinyLayout(3);
  Runtime runtime(options, cluster, cluster, clock);
  Drive(runtime, cluster, clock, 6, 64);
  ASSERT_TRUE(runtime.Status().done);
  const std::vector<Cluster::SyncRecord> records = cluster.sync_transfers();
  ASSERT_EQ(static_cast<std::int64_t>(records.size()), cluster.syncs());
  const auto by_epoch = ExpectPartsOfTheirPlans(records);
  // Each join syncs the engine at once: memberships {0}, {0, 1}, ..., then all six.
  ASSERT_EQ(by_epoch.size(), 6u);
  for (const auto& [epoch, same] : by_epoch) {
    EXPECT_EQ(same.front().part.members->size(), static_cast<std::size_t>(epoch + 1));
  }
  // The last membership: every engine synced in it, each replica's part once per sync,
  // the replicas' bytes summing to the plan's.
  const std::vector<Cluster::SyncRecord>& last = by_epoch.at(5);
  std::map<std::int64_t, std::int64_t> bytes_of_replica;
  for (const Cluster::SyncRecord& record : last) {
    bytes_of_replica[record.part.replica] = record.part.bytes;
  }
  ASSERT_EQ(bytes_of_replica.size(), 6u);
  std::int64_t total = 0;
  for (const auto& [replica, bytes] : bytes_of_replica) total += bytes;
  EXPECT_EQ(total, last.front().part.plan->bytes_received);
  EXPECT_GT(last.size(), 6u);  // the train steps' syncs
}

TEST(RuntimeTest, ALostEngineStartsANewMembershipWithoutIt) {
  ManualClock clock;
  Cluster cluster(clock, {});
  cluster.FailNextDispatchTo(2);
  RuntimeOptions options = AsyncOptions(3);
  options.weight_sync = TinyLayout(4);
  Runtime runtime(options, cluster, cluster, clock);
  Drive(runtime, cluster, clock, 4, 128);
  ASSERT_TRUE(runtime.Status().done);
  EXPECT_EQ(runtime.Status().counters.engine_failures, 1);
  const auto by_epoch = ExpectPartsOfTheirPlans(cluster.sync_transfers());
  // Joins: {0}, {0,1}, {0,1,2}, {0,1,2,3}; then engine 2's loss: {0,1,3}.
  ASSERT_EQ(by_epoch.size(), 5u);
  const std::vector<Cluster::SyncRecord>& after = by_epoch.at(4);
  EXPECT_EQ(*after.front().part.members, (std::vector<std::int64_t>{0, 1, 3}));
  std::set<std::int64_t> engines;
  for (const Cluster::SyncRecord& record : after) {
    engines.insert(record.sync.engine);
    if (record.sync.engine == 3) {
      EXPECT_EQ(record.part.replica, 2);
    }
  }
  EXPECT_EQ(engines, (std::set<std::int64_t>{0, 1, 3}));
  // The same three-replica plan as the join of engine 2 used (cached by size).
  EXPECT_EQ(after.front().part.plan.get(), by_epoch.at(2).front().part.plan.get());
  // SplitWeightSync, as a user would call it, gives the same parts.
  const std::vector<EngineTransfers> parts =
      SplitWeightSync(TinyLayout(4), after.front().part.plan, {0, 1, 3}, 4);
  for (const Cluster::SyncRecord& record : after) {
    const EngineTransfers& mine = parts.at(static_cast<std::size_t>(record.part.replica));
    EXPECT_EQ(mine.transfers, record.part.transfers);
    EXPECT_EQ(mine.bytes, record.part.bytes);
    EXPECT_EQ(mine.rank_offset, record.part.rank_offset);
  }
  EXPECT_THROW(SplitWeightSync(TinyLayout(4), after.front().part.plan, {0, 1}, 4),
               std::invalid_argument);  // a plan for three replicas, two members
  EXPECT_THROW(SplitWeightSync(TinyLayout(4), after.front().part.plan, {1, 0, 3}, 4),
               std::invalid_argument);
}

// An engine lost half-way through a sync: the engines of that sync get it again
// (replan) by the membership without it, those still loading and those done alike; the
// run goes on, and the replans stay out of the core's command stream.
TEST(RuntimeTest, AnEngineLostDuringASyncGetsTheOthersTheSyncAgainByANewPlan) {
  ManualClock clock;
  Cluster cluster(clock, {});
  cluster.FailDuringSync(2, 2);
  RuntimeOptions options = AsyncOptions(4);
  options.weight_sync = TinyLayout(4);
  std::int64_t core_replans = 0;
  options.journal = [&](const Event&, std::span<const Command> given) {
    for (const Command& command : given) {
      if (const auto* sync = std::get_if<SyncWeights>(&command)) core_replans += sync->replan;
    }
  };
  Runtime runtime(options, cluster, cluster, clock);
  Drive(runtime, cluster, clock, 4, 128);
  const RuntimeStatus status = runtime.Status();
  ASSERT_TRUE(status.done);
  ExpectTrainedOnce(cluster, status);
  EXPECT_EQ(status.counters.engine_failures, 1);
  EXPECT_EQ(status.rejected_events, 0) << status.last_rejection;
  EXPECT_EQ(core_replans, 0);
  const std::vector<Cluster::SyncRecord> records = cluster.sync_transfers();
  const auto by_epoch = ExpectPartsOfTheirPlans(records);
  // Version 2's sync went to engines 0, 1, 2 and 3 (partial rollout interrupts them all
  // at once); engine 2 was lost during it: 0, 1 and 3 get it again by {0, 1, 3}.
  std::vector<Cluster::SyncRecord> replans;
  for (const Cluster::SyncRecord& record : records) {
    if (record.sync.replan) replans.push_back(record);
  }
  ASSERT_EQ(replans.size(), 3u);
  EXPECT_EQ(status.weight_sync_replans, 3);
  std::set<std::int64_t> engines;
  for (const Cluster::SyncRecord& record : replans) {
    engines.insert(record.sync.engine);
    EXPECT_EQ(record.sync.version, 2);
    EXPECT_FALSE(record.sync.interrupt);
    EXPECT_EQ(*record.part.members, (std::vector<std::int64_t>{0, 1, 3}));
  }
  EXPECT_EQ(engines, (std::set<std::int64_t>{0, 1, 3}));
  // The replans opened the new epoch; the next syncs use it.
  const std::int64_t epoch = replans.front().part.epoch;
  EXPECT_EQ(by_epoch.rbegin()->first, epoch);
  EXPECT_GT(by_epoch.at(epoch).size(), replans.size());
  // The status lists each epoch once, in order, with its syncs.
  ASSERT_EQ(status.weight_sync.size(), by_epoch.size());
  std::int64_t syncs = 0;
  for (std::size_t i = 0; i < status.weight_sync.size(); ++i) {
    const WeightSyncEpoch& e = status.weight_sync[i];
    const auto& same = by_epoch.at(e.epoch);
    EXPECT_EQ(e.members, *same.front().part.members);
    EXPECT_EQ(e.syncs, static_cast<std::int64_t>(same.size()));
    EXPECT_EQ(e.bytes, same.front().part.plan->bytes_received);
    EXPECT_EQ(e.transfers, static_cast<std::int64_t>(same.front().part.plan->transfers.size()));
    syncs += e.syncs;
  }
  EXPECT_EQ(syncs, static_cast<std::int64_t>(records.size()));
}

TEST(RuntimeTest, AWeightLayoutThePlannerRefusesIsRefusedNamingTheField) {
  ManualClock clock;
  Cluster cluster(clock, {});
  RuntimeOptions options = AsyncOptions(2);
  options.weight_sync = TinyLayout(2);
  options.weight_sync->reshard.train.pp = 3;  // 4 layers over 3 stages
  try {
    Runtime runtime(options, cluster, cluster, clock);
    FAIL() << "accepted pp = 3 for 4 layers";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("weight_sync.reshard.train.pp"), std::string::npos)
        << e.what();
  }
}

TEST(RuntimeTest, OptionsAreValidatedWithTheFieldNamed) {
  ManualClock clock;
  Cluster cluster(clock, {});
  RuntimeOptions options = AsyncOptions(2);
  options.orchestrator.prompts_per_step = 0;
  try {
    Runtime runtime(options, cluster, cluster, clock);
    FAIL() << "accepted prompts_per_step = 0";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("orchestrator.prompts_per_step"), std::string::npos)
        << e.what();
  }
  options = AsyncOptions(2);
  options.orchestrator.planner = [](auto, auto) { return balance::PlannedStep{}; };
  EXPECT_THROW(Runtime(options, cluster, cluster, clock), std::invalid_argument);
  options = AsyncOptions(2);
  options.step->micro_batch.max_tokens_per_micro_batch = 0;
  try {
    Runtime runtime(options, cluster, cluster, clock);
    FAIL() << "accepted a zero cap";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("step."), std::string::npos) << e.what();
  }
}

TEST(RuntimeTest, ManualClockRefusesGoingBack) {
  ManualClock clock(5);
  EXPECT_THROW(clock.Set(4), std::invalid_argument);
  EXPECT_THROW(clock.Advance(-1), std::invalid_argument);
  clock.Advance(2);
  EXPECT_EQ(clock.Now(), 7);
}

// Real time: the cluster's answers are posted by a driver thread when they fall due
// (time-scaled), while the graph's threads run the core and the backends.
TEST(RuntimeTest, RealTimeRunWithAConcurrentDriver) {
  SteadyClock clock;
  Cluster cluster(clock, {.seconds_per_token = 2e-6,
                          .sync_seconds = 1e-3,
                          .release_seconds = 1e-3,
                          .train_seconds = 5e-3});
  RuntimeOptions options = AsyncOptions(5);
  options.orchestrator.staleness_policy = StalenessPolicy::kStrict;
  options.trace = true;
  Runtime runtime(options, cluster, cluster, clock);
  std::atomic<bool> stop{false};
  std::thread driver([&] {
    while (!stop.load()) {
      const std::optional<double> due = cluster.NextDueTime();
      if (!due || *due > clock.Now()) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        continue;
      }
      if (auto next = cluster.PopDue()) runtime.Post(next->second);
    }
  });
  for (std::int64_t e = 0; e < 6; ++e) runtime.Post(EngineJoined{.engine = e, .max_concurrent = 8});
  runtime.Post(PromptsAvailable{.prompts = Prompts(256)});
  const bool done = runtime.WaitUntilDone(std::chrono::seconds(120));
  stop.store(true);
  driver.join();
  runtime.Stop();
  ASSERT_TRUE(done);
  const RuntimeStatus status = runtime.Status();
  EXPECT_EQ(status.rejected_events, 0) << status.last_rejection;
  ExpectTrainedOnce(cluster, status);
  EXPECT_LE(status.metrics.max_staleness, 1);
  const std::string trace = runtime.TraceJson();
  EXPECT_NE(trace.find("\"traceEvents\""), std::string::npos);
  EXPECT_NE(trace.find("step 0 call 0"), std::string::npos);
  EXPECT_NE(trace.find("\"trainer\""), std::string::npos);
}

}  // namespace
}  // namespace rlsched::scheduler
