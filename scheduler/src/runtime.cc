// The live runtime (runtime.h): the decision core, the step planner and the weight-sync
// plan on a oneTBB flow graph.

#include "rlsched/scheduler/runtime.h"

#include <oneapi/tbb/flow_graph.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <shared_mutex>
#include <stdexcept>
#include <system_error>
#include <tuple>
#include <type_traits>
#include <utility>

#include "rlsched/common/check.h"
#include "rlsched/common/error.h"

namespace rlsched::scheduler {

// ---- Clocks. ----

SteadyClock::SteadyClock() : start_(std::chrono::steady_clock::now()) {}

double SteadyClock::Now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

double ManualClock::Now() const {
  std::lock_guard lock(mutex_);
  return now_;
}

void ManualClock::Set(double time) {
  std::lock_guard lock(mutex_);
  if (!(time >= now_)) FailBound("time", ">= the clock's now (" + NumberText(now_) + ")", time);
  now_ = time;
}

void ManualClock::Advance(double seconds) {
  std::lock_guard lock(mutex_);
  CheckRealAtLeast("seconds", seconds, 0);
  now_ += seconds;
}

std::optional<std::int64_t> EngineOf(const Event& event) {
  return std::visit(
      [](const auto& e) -> std::optional<std::int64_t> {
        if constexpr (requires { e.engine; }) {
          if (e.engine != kAnyEngine) return e.engine;
        }
        return std::nullopt;
      },
      event);
}

std::int64_t EngineOf(const Command& command) {
  return std::visit(
      [](const auto& c) -> std::int64_t {
        if constexpr (requires { c.engine; }) {
          return c.engine;
        } else {
          return -1;
        }
      },
      command);
}

// ---- Options. ----

namespace {

// Validate(), returning the weight-sync layout's plan at full membership (null without
// a layout): the layout's own, or the one Validate made.
std::shared_ptr<const rollout::ReshardPlan> ValidatedWeightSyncPlan(const RuntimeOptions& options) {
  if (options.orchestrator.planner) {
    Fail("orchestrator.planner", "must be empty: the runtime plans each trainer call (step)");
  }
  try {
    Validate(options.orchestrator);
  } catch (const FieldError& e) {
    throw e.Within("orchestrator");
  }
  if (options.step) {
    try {
      const std::int64_t one[] = {1};
      const std::int64_t group[] = {0};
      (void)balance::PlanStep(one, group, *options.step);
    } catch (const FieldError& e) {
      throw e.Within("step");
    }
  }
  if (options.weight_sync) {
    const WeightSyncLayout& layout = *options.weight_sync;
    try {
      rollout::Validate(layout.model);
    } catch (const FieldError& e) {
      throw e.Within("weight_sync.model");
    }
    try {
      rollout::Validate(layout.model, layout.reshard.train);
    } catch (const FieldError& e) {
      throw e.Within("weight_sync.reshard");
    }
    try {
      rollout::Validate(layout.model, layout.reshard.infer);
      if (layout.plan == nullptr) {
        return std::make_shared<const rollout::ReshardPlan>(
            rollout::PlanReshard(layout.model, layout.reshard));
      }
    } catch (const FieldError& e) {
      throw e.Within("weight_sync.reshard");
    }
    const std::int64_t trainer_ranks = layout.reshard.train.world_size();
    const std::int64_t engine_ranks = layout.reshard.infer.tp * layout.reshard.infer.replicas;
    if (layout.plan->trainer_ranks != trainer_ranks || layout.plan->engine_ranks != engine_ranks) {
      Fail("weight_sync.plan", "made for " + std::to_string(layout.plan->trainer_ranks) +
                                   " trainer and " + std::to_string(layout.plan->engine_ranks) +
                                   " engine GPUs, the layout has " + std::to_string(trainer_ranks) +
                                   " and " + std::to_string(engine_ranks));
    }
    return layout.plan;
  }
  return nullptr;
}

}  // namespace

void Validate(const RuntimeOptions& options) { (void)ValidatedWeightSyncPlan(options); }

rollout::ReshardOptions WeightSyncOptions(const WeightSyncLayout& layout, std::int64_t replicas) {
  CheckAtLeast("replicas", replicas, 1);
  rollout::ReshardOptions options = layout.reshard;
  options.infer.replicas = replicas;
  return options;
}

std::vector<EngineTransfers> SplitWeightSync(const WeightSyncLayout& layout,
                                             std::shared_ptr<const rollout::ReshardPlan> plan,
                                             std::vector<std::int64_t> members,
                                             std::int64_t epoch) {
  if (members.empty()) Fail("members", "must not be empty");
  for (std::size_t k = 1; k < members.size(); ++k) {
    if (members[k] <= members[k - 1]) Fail("members", "must be ascending and distinct");
  }
  if (plan == nullptr) Fail("plan", "must be set");
  const auto replicas = static_cast<std::int64_t>(members.size());
  const rollout::ReshardOptions options = WeightSyncOptions(layout, replicas);
  const std::int64_t trainer_ranks = options.train.world_size();
  const std::int64_t engine_ranks = options.infer.tp * replicas;
  if (plan->trainer_ranks != trainer_ranks || plan->engine_ranks != engine_ranks) {
    Fail("plan", "made for " + std::to_string(plan->trainer_ranks) + " trainer and " +
                     std::to_string(plan->engine_ranks) + " engine GPUs, the membership has " +
                     std::to_string(trainer_ranks) + " and " + std::to_string(engine_ranks));
  }
  const std::int64_t world_size = options.topology.colocated ? std::max(trainer_ranks, engine_ranks)
                                                             : trainer_ranks + engine_ranks;
  auto shared_members = std::make_shared<const std::vector<std::int64_t>>(std::move(members));
  std::vector<EngineTransfers> parts(static_cast<std::size_t>(replicas));
  // The replica of each engine GPU (engine ranks are consecutive per replica).
  std::vector<std::int64_t> replica_of_rank(static_cast<std::size_t>(world_size), -1);
  for (std::int64_t r = 0; r < replicas; ++r) {
    EngineTransfers& part = parts[static_cast<std::size_t>(r)];
    part.plan = plan;
    part.epoch = epoch;
    part.members = shared_members;
    part.replica = r;
    part.rank_offset = rollout::EngineRank(options, r, 0);
    part.ranks = options.infer.tp;
    part.world_size = world_size;
    for (std::int64_t t = 0; t < options.infer.tp; ++t) {
      replica_of_rank[static_cast<std::size_t>(rollout::EngineRank(options, r, t))] = r;
    }
  }
  for (std::size_t i = 0; i < plan->transfers.size(); ++i) {
    const rollout::Transfer& transfer = plan->transfers[i];
    std::int64_t last_replica = -1;
    for (const std::int64_t rank : transfer.dst_ranks) {  // ascending: replicas ascend
      if (rank < 0 || rank >= world_size) Fail("plan", "a destination outside the world");
      const std::int64_t r = replica_of_rank[static_cast<std::size_t>(rank)];
      if (r < 0) continue;
      EngineTransfers& part = parts[static_cast<std::size_t>(r)];
      if (r != last_replica) part.transfers.push_back(static_cast<std::int64_t>(i));
      part.bytes += transfer.bytes;
      last_replica = r;
    }
  }
  return parts;
}

namespace {

// What the core hands the sink after each event.
struct Observation {
  Event event;  // stamped
  std::vector<Command> commands;
  std::optional<StepProgress> progress;
  bool rejected = false;
};

using WallTime = std::chrono::steady_clock::time_point;

// An event as posted, with the wall time of its Post().
struct Posted {
  Event event;
  WallTime posted;
};

// An engine command with its part of the weight-sync plan, and its event's Post() time.
// A SyncWeights carries the membership the core node saw (with a weight-sync layout).
struct EngineWork {
  Command command;
  std::shared_ptr<const EngineTransfers> transfers;
  WallTime posted;
  std::shared_ptr<const std::vector<std::int64_t>> members;
};

// The weight-sync plans by number of replicas, each made once, on a thread of its own
// (std::async), and shared: Prepare() starts one ahead (the core node, when the
// membership changes), Get() waits for it (the weight-sync node). A plan depends only
// on the number of replicas, so which thread makes it, and when, changes no command.
// Thread-safe; the destructor waits for the plans still being made.
class WeightSyncPlans {
 public:
  using Plan = std::shared_ptr<const rollout::ReshardPlan>;

  // `layout->plan`, when set, is the plan for layout->reshard.infer.replicas.
  explicit WeightSyncPlans(const std::optional<WeightSyncLayout>& layout) : layout_(layout) {
    if (layout_ && layout_->plan != nullptr) {
      std::promise<Plan> made;
      made.set_value(layout_->plan);
      plans_.emplace(layout_->reshard.infer.replicas, made.get_future().share());
    }
  }

  // Starts the plan for `replicas` (>= 1) unless it is started. A plan that cannot be
  // started here (no thread) is made by Get().
  void Prepare(std::int64_t replicas) {
    try {
      (void)Start(replicas);
    } catch (const std::system_error&) {
    }
  }

  // The plan for `replicas` (>= 1): started now when it was not, then waited for.
  // Throws what the planner threw.
  Plan Get(std::int64_t replicas) { return Start(replicas).get(); }

 private:
  std::shared_future<Plan> Start(std::int64_t replicas) {
    std::lock_guard lock(mutex_);
    auto it = plans_.find(replicas);
    if (it == plans_.end()) {
      auto plan = [model = layout_->model, options = WeightSyncOptions(*layout_, replicas)] {
        return std::make_shared<const rollout::ReshardPlan>(rollout::PlanReshard(model, options));
      };
      it = plans_.emplace(replicas, std::async(std::launch::async, std::move(plan)).share()).first;
    }
    return it->second;
  }

  const std::optional<WeightSyncLayout> layout_;
  std::mutex mutex_;
  std::map<std::int64_t, std::shared_future<Plan>> plans_;
};

// A trainer call and its event's Post() time.
struct TrainWork {
  StartTrain call;
  WallTime posted;
};

// Latencies in log-spaced buckets, 16 per octave from 1 µs (memory O(1) for any run).
// Thread-safe.
class LatencyHistogram {
 public:
  void Add(std::chrono::steady_clock::duration latency) {
    AddSeconds(std::chrono::duration<double>(latency).count());
  }
  void AddSeconds(double seconds) {
    const double micros = seconds * 1e6;
    const double x = micros <= 1 ? 0 : std::ceil(kPerOctave * std::log2(micros));
    const auto bucket = static_cast<std::size_t>(std::min(x, static_cast<double>(kBuckets - 1)));
    std::lock_guard lock(mutex_);
    ++counts_[bucket];
    ++count_;
    max_seconds_ = std::max(max_seconds_, micros * 1e-6);
  }
  LatencySummary Summary() const {
    std::lock_guard lock(mutex_);
    LatencySummary s{.count = count_, .max_seconds = max_seconds_};
    s.p50_seconds = std::min(Quantile(0.5), max_seconds_);
    s.p99_seconds = std::min(Quantile(0.99), max_seconds_);
    return s;
  }

 private:
  static constexpr double kPerOctave = 16;
  static constexpr std::size_t kBuckets = 16 * 40;  // up to 2^40 µs
  double Quantile(double q) const {  // the upper edge of the bucket holding rank ceil(q·n)
    if (count_ == 0) return 0;
    const auto rank = std::max<std::int64_t>(
        1, static_cast<std::int64_t>(std::ceil(q * static_cast<double>(count_))));
    std::int64_t seen = 0;
    for (std::size_t i = 0; i < kBuckets; ++i) {
      seen += counts_[i];
      if (seen >= rank) return std::exp2(static_cast<double>(i) / kPerOctave) * 1e-6;
    }
    return max_seconds_;
  }
  mutable std::mutex mutex_;
  std::array<std::int64_t, kBuckets> counts_{};
  std::int64_t count_ = 0;
  double max_seconds_ = 0;
};

double EventTime(const Event& event) {
  return std::visit([](const auto& e) { return e.time; }, event);
}

void SetEventTime(Event& event, double time) {
  std::visit([time](auto& e) { e.time = time; }, event);
}

const char* EventName(const Event& event) {
  static constexpr const char* kNames[] = {
      "PromptsAvailable",     "EngineJoined",       "EngineLeft",       "EngineFailed",
      "GenerationProgressed", "GenerationFinished", "GroupFiltered",    "TrainStepFinished",
      "WeightsLoaded",        "EngineReleased",     "GenerationPaused", "EngineAttached"};
  static_assert(std::size(kNames) == std::variant_size_v<Event>);
  return kNames[event.index()];
}

// The Chrome trace: one process, the trainer as thread 0, engine e as thread e + 1.
class RunTrace {
 public:
  void Instant(double time, std::int64_t engine, const char* name) {
    events_.push_back({{"name", name},
                       {"ph", "i"},
                       {"s", "t"},
                       {"ts", Micros(time)},
                       {"pid", 0},
                       {"tid", engine + 1}});
  }
  void Span(double begin, double end, std::int64_t engine, std::string name) {
    events_.push_back({{"name", std::move(name)},
                       {"ph", "X"},
                       {"ts", Micros(begin)},
                       {"dur", Micros(end) - Micros(begin)},
                       {"pid", 0},
                       {"tid", engine + 1}});
  }
  void ThreadName(std::int64_t engine, const std::string& name) {
    events_.push_back({{"name", "thread_name"},
                       {"ph", "M"},
                       {"pid", 0},
                       {"tid", engine + 1},
                       {"args", {{"name", name}}}});
  }
  std::string Json() const {
    return nlohmann::json{{"traceEvents", events_}, {"displayTimeUnit", "ms"}}.dump();
  }

 private:
  static std::int64_t Micros(double seconds) { return static_cast<std::int64_t>(seconds * 1e6); }
  nlohmann::json::array_t events_;
};

}  // namespace

struct Runtime::Impl {
  using CoreNode =
      tbb::flow::multifunction_node<Posted, std::tuple<EngineWork, TrainWork, Observation>>;
  using WeightSyncNode = tbb::flow::function_node<EngineWork, EngineWork>;
  using EngineNode = tbb::flow::function_node<EngineWork, tbb::flow::continue_msg>;
  using PlanNode = tbb::flow::function_node<TrainWork, TrainWork>;
  using TrainerNode = tbb::flow::function_node<TrainWork, tbb::flow::continue_msg>;
  using SinkNode = tbb::flow::function_node<Observation, tbb::flow::continue_msg>;

  Impl(RuntimeOptions runtime_options, EngineBackend& engine_backend,
       TrainerBackend& trainer_backend, const Clock& run_clock)
      : options(std::move(runtime_options)),
        engines(engine_backend),
        trainer(trainer_backend),
        clock(run_clock),
        core(options.orchestrator),
        core_node(graph, tbb::flow::serial,
                  [this](const Posted& posted, CoreNode::output_ports_type& ports) {
                    HandleEvent(posted, ports);
                  }),
        weight_sync_node(graph, tbb::flow::serial,
                         [this](EngineWork work) { return AttachTransfers(std::move(work)); }),
        engine_node(graph, tbb::flow::serial,
                    [this](const EngineWork& work) {
                      SendToEngine(work);
                      return tbb::flow::continue_msg();
                    }),
        plan_node(graph, tbb::flow::unlimited,
                  [this](TrainWork work) { return PlanCall(std::move(work)); }),
        trainer_node(graph, tbb::flow::serial,
                     [this](const TrainWork& work) {
                       SendToTrainer(work);
                       return tbb::flow::continue_msg();
                     }),
        sink_node(graph, tbb::flow::serial, [this](const Observation& observation) {
          Observe(observation);
          return tbb::flow::continue_msg();
        }) {
    tbb::flow::make_edge(tbb::flow::output_port<0>(core_node), weight_sync_node);
    tbb::flow::make_edge(weight_sync_node, engine_node);
    tbb::flow::make_edge(tbb::flow::output_port<1>(core_node), plan_node);
    tbb::flow::make_edge(plan_node, trainer_node);
    tbb::flow::make_edge(tbb::flow::output_port<2>(core_node), sink_node);
    if (options.resume) Replay(*options.resume);
  }

  // ---- The core node. ----

  void HandleEvent(const Posted& posted, CoreNode::output_ports_type& ports) {
    Event event = posted.event;
    std::vector<Command> commands;
    std::vector<Command> replans;  // the runtime's, after the core's (see NoteSyncs)
    Observation observation;
    std::string rejection;
    bool observe = false;
    {
      std::lock_guard lock(mutex);
      const double time = std::max(clock.Now(), last_time);
      SetEventTime(event, time);
      try {
        const std::int64_t corrections = core.counters().version_corrections;
        const std::vector<Event> seen = AsMembership(event);
        core.Handle(event, commands);
        last_time = time;
        ++events;
        if (options.check_invariants) core.CheckInvariants();
        if (core.counters().version_corrections != corrections) NoteCorrection(event);
        if (options.weight_sync) {
          for (const Event& e : seen) {
            NoteSyncs(e, commands, replans);
            NoteMembership(e);
          }
        }
        if (const auto* finished = std::get_if<GenerationFinished>(&event)) {
          if (finished->telemetry) AddTelemetry(finished->sample, *finished->telemetry);
        }
      } catch (const std::invalid_argument& e) {
        ++rejected_events;
        last_rejection = e.what();
        commands.clear();
        spdlog::warn("runtime: event {} refused: {}", EventName(event), e.what());
        observation.rejected = true;
        rejection = e.what();
      }
      if (options.journal && !Journal(event, commands)) {
        commands.clear();
        replans.clear();
      }
      const auto* finished = std::get_if<TrainStepFinished>(&event);
      if (finished != nullptr && !observation.rejected &&
          core.counters().steps_finished == finished->step + 1 &&
          finished->call + 1 == options.orchestrator.train_calls_per_sync) {
        observation.progress = StepProgress{.step = finished->step,
                                            .time = time,
                                            .counters = core.counters(),
                                            .metrics = core.metrics(time)};
      }
      if (core.done()) done_cv.notify_all();
      observe = options.trace || (options.on_step && observation.progress);
      if (observe) {
        observation.event = event;
        if (options.trace) observation.commands = commands;
      }
    }
    if (observation.rejected && options.on_reject) options.on_reject(event, rejection);
    // Replans go after the core's commands and stay out of the observation (the event
    // log and replay hold the core's own commands).
    for (Command& command : replans) commands.push_back(std::move(command));
    for (Command& command : commands) {
      if (auto* start = std::get_if<StartTrain>(&command)) {
        std::get<1>(ports).try_put(TrainWork{.call = std::move(*start), .posted = posted.posted});
      } else {
        const bool sync = std::holds_alternative<SyncWeights>(command);
        std::get<0>(ports).try_put(EngineWork{.command = std::move(command),
                                              .posted = posted.posted,
                                              .members = sync ? members : nullptr});
      }
    }
    if (observe) std::get<2>(ports).try_put(std::move(observation));
  }

  std::vector<WeightSyncEpoch> Epochs() const {
    std::lock_guard lock(epochs_mutex);
    return epochs;
  }

  // The syncs under way (with a weight-sync layout), after an accepted event and its
  // commands; a lost engine's group is rebuilt for them (added to `replans`). The mutex
  // held.
  void NoteSyncs(const Event& event, const std::vector<Command>& commands,
                 std::vector<Command>& replans) {
    std::int64_t gone = -1;
    if (const auto* e = std::get_if<EngineLeft>(&event)) gone = e->engine;
    if (const auto* e = std::get_if<EngineFailed>(&event)) gone = e->engine;
    if (const auto* e = std::get_if<WeightsLoaded>(&event)) loading.erase(e->engine);
    if (gone >= 0) {
      last_sync.erase(gone);
      // The engines syncing when it went were in a transfer group with it: each one
      // still loading gets its sync again by the membership without it, and so does each
      // one that already holds the newest version under way (the new group's members).
      loading.erase(gone);
      if (!loading.empty()) {
        std::int64_t version = -1;
        for (const std::int64_t engine : loading) {
          version = std::max(version, last_sync.at(engine).version);
        }
        for (const auto& [engine, sync] : last_sync) {
          if (sync.version != version && !loading.contains(engine)) continue;
          replans.push_back(SyncWeights{.engine = engine, .version = sync.version, .replan = true});
          ++replans_sent;
        }
        spdlog::info(
            "runtime: engine {} lost during the weight sync of version {}: {} engines get "
            "their sync again by a plan without it",
            gone, version, replans.size());
      }
    }
    for (const Command& command : commands) {
      if (const auto* sync = std::get_if<SyncWeights>(&command)) {
        last_sync[sync->engine] = *sync;
        loading.insert(sync->engine);
      }
    }
  }

  // The membership after an accepted event (with a weight-sync layout). The mutex held.
  // The event as the weight-sync bookkeeping sees it (before the core handles it): an
  // EngineAttached is nothing (kept), EngineJoined (new) or EngineLeft then EngineJoined
  // (reset). The mutex held.
  std::vector<Event> AsMembership(const Event& event) const {
    const auto* attached = std::get_if<EngineAttached>(&event);
    if (attached == nullptr) return {event};
    if (core.KeepsEngine(*attached)) return {};
    const std::vector<std::int64_t> alive = core.engines();
    const EngineJoined joined{.engine = attached->engine,
                              .max_concurrent = attached->max_concurrent,
                              .version = attached->version};
    if (!std::binary_search(alive.begin(), alive.end(), attached->engine)) return {joined};
    return {EngineLeft{.engine = attached->engine}, joined};
  }

  // A resumed run: the logged events go to the core (their commands were sent before the
  // crash), then the trainer call the log left unfinished goes to the trainer again.
  void Replay(const RuntimeResume& resume) {
    std::optional<StartTrain> call;
    {
      std::lock_guard lock(mutex);
      std::vector<Command> commands;
      std::vector<Command> replans;
      for (const Event& event : resume.events) {
        commands.clear();
        try {
          const std::vector<Event> seen = AsMembership(event);
          core.Handle(event, commands);
          NoteCall(event, commands, call);
          if (options.weight_sync) {
            for (const Event& e : seen) {
              NoteSyncs(e, commands, replans);
              NoteMembership(e);
            }
          }
          ++events;
        } catch (const std::invalid_argument&) {
          ++rejected_events;  // as in the run (it refused the same)
        }
        last_time = std::max(last_time, EventTime(event));
      }
    }
    if (call)
      plan_node.try_put(TrainWork{.call = *call, .posted = std::chrono::steady_clock::now()});
  }

  // The trainer call under way after an accepted event: the core's last StartTrain, until
  // its TrainStepFinished.
  static void NoteCall(const Event& event, const std::vector<Command>& commands,
                       std::optional<StartTrain>& call) {
    if (const auto* f = std::get_if<TrainStepFinished>(&event)) {
      if (call && call->step == f->step && call->call == f->call) call.reset();
    }
    for (const Command& command : commands) {
      if (const auto* start = std::get_if<StartTrain>(&command)) call = *start;
    }
  }

  void NoteMembership(const Event& event) {
    std::int64_t joined = -1;
    std::int64_t gone = -1;
    if (const auto* e = std::get_if<EngineJoined>(&event)) joined = e->engine;
    if (const auto* e = std::get_if<EngineLeft>(&event)) gone = e->engine;
    if (const auto* e = std::get_if<EngineFailed>(&event)) gone = e->engine;
    if (joined < 0 && gone < 0) return;
    std::vector<std::int64_t> next = members ? *members : std::vector<std::int64_t>{};
    if (joined >= 0) next.insert(std::upper_bound(next.begin(), next.end(), joined), joined);
    if (gone >= 0) std::erase(next, gone);
    members = std::make_shared<const std::vector<std::int64_t>>(std::move(next));
    // The plans a sync may need next, started off the engines' path: this membership's
    // size (its syncs), one engine fewer (a loss) and one more (a join, up to the full
    // membership, whose plan Validate made).
    const auto size = static_cast<std::int64_t>(members->size());
    if (size >= 1) plans.Prepare(size);
    if (size >= 2) plans.Prepare(size - 1);
    if (size + 1 <= options.weight_sync->reshard.infer.replicas) plans.Prepare(size + 1);
  }

  // The engine's account of a sample's token versions differed from the core's
  // inference (the engine's was recorded). The mutex held.
  void NoteCorrection(const Event& event) {
    const std::int64_t corrections = core.counters().version_corrections;
    if (corrections <= kLoggedCorrections) {
      spdlog::warn(
          "runtime: {}: an engine's account of its tokens' versions differs from the core's "
          "inference (from its pause reports); the engine's is recorded{}",
          EventName(event),
          corrections == kLoggedCorrections ? " (further differences are only counted)" : "");
    }
  }
  static constexpr std::int64_t kLoggedCorrections = 10;

  // Sums a finish's telemetry. The mutex held.
  void AddTelemetry(std::int64_t sample, const RequestTelemetry& t) {
    const std::pair<const char*, double> figures[] = {
        {"generated_tokens", static_cast<double>(t.generated_tokens)},
        {"preemptions", static_cast<double>(t.preemptions)},
        {"interruptions", static_cast<double>(t.interruptions)},
        {"first_token_seconds", t.first_token_seconds},
        {"seconds", t.seconds},
        {"paused_seconds", t.paused_seconds}};
    for (const auto& [name, value] : figures) {
      if (!(value >= 0) || !std::isfinite(value)) {
        ++requests.invalid;
        spdlog::warn("runtime: sample {}'s telemetry left out: {} must be >= 0 and finite, got {}",
                     sample, name, value);
        return;
      }
    }
    ++requests.requests;
    requests.generated_tokens += t.generated_tokens;
    requests.preemptions += t.preemptions;
    requests.interruptions += t.interruptions;
    requests.paused_seconds += t.paused_seconds;
    request_seconds_total += t.seconds;
    request_seconds.AddSeconds(t.seconds);
    if (t.first_token_seconds > 0) {
      first_token_total += t.first_token_seconds;
      first_token_seconds.AddSeconds(t.first_token_seconds);
    }
  }

  RequestSummary Requests() const {  // the mutex held
    RequestSummary r = requests;
    const LatencySummary seconds = request_seconds.Summary();
    const LatencySummary first = first_token_seconds.Summary();
    if (r.requests > 0) r.mean_seconds = request_seconds_total / static_cast<double>(r.requests);
    r.p50_seconds = seconds.p50_seconds;
    r.p99_seconds = seconds.p99_seconds;
    r.max_seconds = seconds.max_seconds;
    if (first.count > 0) {
      r.mean_first_token_seconds = first_token_total / static_cast<double>(first.count);
    }
    r.p99_first_token_seconds = first.p99_seconds;
    return r;
  }

  void ReportLoad(std::int64_t engine, std::int64_t running, std::int64_t waiting) {
    CheckAtLeast("engine", engine, 0);
    CheckAtLeast("running", running, 0);
    CheckAtLeast("waiting", waiting, 0);
    std::lock_guard lock(load_mutex);
    LoadSums& sums = load[engine];
    EngineLoad& l = sums.load;
    l.engine = engine;
    ++l.heartbeats;
    l.running = running;
    l.waiting = waiting;
    l.max_running = std::max(l.max_running, running);
    l.max_waiting = std::max(l.max_waiting, waiting);
    sums.running += static_cast<double>(running);
    sums.waiting += static_cast<double>(waiting);
  }

  std::vector<EngineLoad> Loads() const {
    std::lock_guard lock(load_mutex);
    std::vector<EngineLoad> out;
    out.reserve(load.size());
    for (const auto& [engine, sums] : load) {
      EngineLoad l = sums.load;
      l.mean_running = sums.running / static_cast<double>(l.heartbeats);
      l.mean_waiting = sums.waiting / static_cast<double>(l.heartbeats);
      out.push_back(l);
    }
    return out;
  }

  // ---- The engines' path. ----

  EngineWork AttachTransfers(EngineWork work) {
    const auto* sync = std::get_if<SyncWeights>(&work.command);
    if (sync == nullptr || !options.weight_sync) return work;
    try {
      if (work.members == nullptr || work.members->empty()) {
        throw std::logic_error("no membership for a SyncWeights");
      }
      if (sync_members == nullptr || *sync_members != *work.members) {
        const std::int64_t epoch = sync_members == nullptr ? 0 : sync_epoch + 1;
        const auto replicas = static_cast<std::int64_t>(work.members->size());
        const WallTime start = std::chrono::steady_clock::now();
        const std::shared_ptr<const rollout::ReshardPlan> plan = plans.Get(replicas);
        const WallTime planned = std::chrono::steady_clock::now();
        std::vector<EngineTransfers> parts =
            SplitWeightSync(*options.weight_sync, plan, *work.members, epoch);
        const auto ms = [](WallTime from, WallTime to) {
          return std::chrono::duration<double, std::milli>(to - from).count();
        };
        spdlog::info(
            "runtime: weight-sync epoch {} ({} engines): waited {:.2f} ms for the plan, split "
            "it in {:.2f} ms",
            epoch, replicas, ms(start, planned), ms(planned, std::chrono::steady_clock::now()));
        member_transfers.clear();
        for (EngineTransfers& part : parts) {
          member_transfers.push_back(std::make_shared<const EngineTransfers>(std::move(part)));
        }
        sync_members = work.members;
        sync_epoch = epoch;
        std::lock_guard lock(epochs_mutex);
        epochs.push_back(
            WeightSyncEpoch{.epoch = epoch,
                            .members = *work.members,
                            .transfers = static_cast<std::int64_t>(plan->transfers.size()),
                            .buckets = plan->num_buckets,
                            .bytes = plan->bytes_received});
      }
      const auto it = std::lower_bound(sync_members->begin(), sync_members->end(), sync->engine);
      if (it == sync_members->end() || *it != sync->engine) {
        throw std::logic_error("engine " + std::to_string(sync->engine) +
                               " is not in its sync's membership");
      }
      work.transfers = member_transfers[static_cast<std::size_t>(it - sync_members->begin())];
      std::lock_guard lock(epochs_mutex);
      ++epochs.back().syncs;
    } catch (const std::exception& e) {
      Fatal(std::string("weight sync plan: ") + e.what());
    }
    return work;
  }

  void SendToEngine(const EngineWork& work) {
    try {
      engines.Execute(work.command, work.transfers.get());
      command_latency.Add(std::chrono::steady_clock::now() - work.posted);
    } catch (const std::exception& e) {
      const std::int64_t engine = EngineOf(work.command);
      spdlog::error("runtime: engine {} failed to take a command: {}", engine, e.what());
      if (engine >= 0) {
        {
          std::lock_guard lock(mutex);
          ++engine_failures_posted;
        }
        Post(EngineFailed{.engine = engine});
      }
    }
  }

  // ---- The trainer's path. ----

  TrainWork PlanCall(TrainWork work) {
    if (!options.step) return work;
    StartTrain& call = work.call;
    try {
      const std::int64_t G = options.orchestrator.samples_per_prompt;
      std::vector<std::int64_t> group_of(call.samples.size());
      for (std::size_t i = 0; i < call.samples.size(); ++i) group_of[i] = call.samples[i] / G;
      call.plan = balance::PlanStep(call.lengths, group_of, *options.step);
    } catch (const std::exception& e) {
      Fatal(std::string("step plan: ") + e.what());
    }
    return work;
  }

  void SendToTrainer(const TrainWork& work) {
    if (failed()) return;
    try {
      trainer.Train(work.call);
      command_latency.Add(std::chrono::steady_clock::now() - work.posted);
    } catch (const std::exception& e) {
      Fatal(std::string("trainer: ") + e.what());
    }
  }

  // ---- The sink. ----

  void Observe(const Observation& observation) {
    if (observation.progress && options.on_step) options.on_step(*observation.progress);
    if (options.trace) Record(observation);
  }

  void Record(const Observation& observation) {
    std::lock_guard lock(trace_mutex);
    const double time = EventTime(observation.event);
    const std::int64_t engine = EngineOf(observation.event).value_or(-1);
    trace.Instant(time, engine, observation.rejected ? "rejected" : EventName(observation.event));
    if (const auto* joined = std::get_if<EngineJoined>(&observation.event)) {
      if (named_engines.insert(joined->engine).second) {
        trace.ThreadName(joined->engine, "engine " + std::to_string(joined->engine));
      }
    }
    if (!trainer_named) {
      trace.ThreadName(-1, "trainer");
      trainer_named = true;
    }
    if (observation.rejected) return;
    if (const auto* finished = std::get_if<TrainStepFinished>(&observation.event)) {
      if (train_started) {
        trace.Span(
            *train_started, time, -1,
            "step " + std::to_string(finished->step) + " call " + std::to_string(finished->call));
        train_started.reset();
      }
    }
    if (const auto* loaded = std::get_if<WeightsLoaded>(&observation.event)) {
      const auto it = sync_started.find(loaded->engine);
      if (it != sync_started.end()) {
        trace.Span(it->second, time, loaded->engine, "sync v" + std::to_string(loaded->version));
        sync_started.erase(it);
      }
    }
    for (const Command& command : observation.commands) {
      if (std::holds_alternative<StartTrain>(command)) train_started = time;
      if (const auto* sync = std::get_if<SyncWeights>(&command)) sync_started[sync->engine] = time;
    }
  }

  // ---- Errors and waiting. ----

  // Hands an event and its commands to the journal before any command leaves; false
  // (the run failed, nothing leaves) when the journal cannot take them. The mutex held.
  bool Journal(const Event& event, const std::vector<Command>& commands) {
    try {
      options.journal(event, commands);
      return true;
    } catch (const std::exception& e) {
      spdlog::error("runtime: the journal failed: {}", e.what());
      if (fatal_error.empty()) fatal_error = std::string("journal: ") + e.what();
      done_cv.notify_all();
      return false;
    }
  }

  void Fatal(const std::string& message) {
    spdlog::error("runtime: {}", message);
    std::lock_guard lock(mutex);
    if (fatal_error.empty()) fatal_error = message;
    done_cv.notify_all();
  }

  bool failed() {
    std::lock_guard lock(mutex);
    return !fatal_error.empty();
  }

  // The check and the put under one shared lock, so that Stop() sees every put that got
  // past the check (its wait covers their tasks) and none comes after it.
  bool Post(Event event) {
    std::shared_lock lock(post_mutex);
    if (stopped) return false;
    core_node.try_put(
        Posted{.event = std::move(event), .posted = std::chrono::steady_clock::now()});
    return true;
  }

  void Stop() {
    {
      std::unique_lock lock(post_mutex);
      stopped = true;
    }
    graph.wait_for_all();
  }

  RuntimeOptions options;
  EngineBackend& engines;
  TrainerBackend& trainer;
  const Clock& clock;

  mutable std::mutex mutex;  // guards the core and the figures below
  Orchestrator core;
  double last_time = 0;
  std::int64_t events = 0;
  std::int64_t rejected_events = 0;
  std::string last_rejection;
  std::int64_t engine_failures_posted = 0;
  std::string fatal_error;
  std::condition_variable done_cv;
  std::shared_mutex post_mutex;      // Post() shared, Stop() exclusive
  bool stopped = false;              // guarded by post_mutex
  LatencyHistogram command_latency;  // the engine and trainer nodes
  // The engines' telemetry (the core node, under the mutex).
  RequestSummary requests;
  double request_seconds_total = 0;
  double first_token_total = 0;
  LatencyHistogram request_seconds;
  LatencyHistogram first_token_seconds;

  // The heartbeats' load per engine (any thread).
  struct LoadSums {
    EngineLoad load;
    double running = 0;
    double waiting = 0;
  };
  mutable std::mutex load_mutex;
  std::map<std::int64_t, LoadSums> load;

  // The engines joined and not gone, ascending (the core node, under the mutex; with a
  // weight-sync layout).
  std::shared_ptr<const std::vector<std::int64_t>> members;
  // Each engine's last SyncWeights, those not yet loaded, and the replans sent (the
  // core node).
  std::map<std::int64_t, SyncWeights> last_sync;
  std::set<std::int64_t> loading;
  std::int64_t replans_sent = 0;
  // The weight-sync plans by replicas (prepared by the core node, used by the
  // weight-sync node).
  WeightSyncPlans plans{options.weight_sync};
  // The weight-sync node's (its thread only): the last sync's membership, its epoch
  // and its members' parts.
  std::shared_ptr<const std::vector<std::int64_t>> sync_members;
  std::int64_t sync_epoch = 0;
  std::vector<std::shared_ptr<const EngineTransfers>> member_transfers;
  // Each epoch planned (the weight-sync node writes, Status() reads).
  mutable std::mutex epochs_mutex;
  std::vector<WeightSyncEpoch> epochs;

  // The sink's trace (its thread, and TraceJson()).
  mutable std::mutex trace_mutex;
  RunTrace trace;
  std::optional<double> train_started;
  std::map<std::int64_t, double> sync_started;
  std::set<std::int64_t> named_engines;
  bool trainer_named = false;

  // The graph last: its nodes go first, then the graph (after Stop() drained it).
  tbb::flow::graph graph;
  CoreNode core_node;
  WeightSyncNode weight_sync_node;
  EngineNode engine_node;
  PlanNode plan_node;
  TrainerNode trainer_node;
  SinkNode sink_node;
};

Runtime::Runtime(RuntimeOptions options, EngineBackend& engines, TrainerBackend& trainer,
                 const Clock& clock) {
  // The full membership's plan: the caller's, or the one Validate makes (kept, so that
  // the layout is planned once).
  std::shared_ptr<const rollout::ReshardPlan> plan = ValidatedWeightSyncPlan(options);
  if (options.weight_sync) options.weight_sync->plan = std::move(plan);
  impl_ = std::make_unique<Impl>(std::move(options), engines, trainer, clock);
}

Runtime::~Runtime() { Stop(); }

bool Runtime::Post(Event event) { return impl_->Post(std::move(event)); }

void Runtime::WaitIdle() { impl_->graph.wait_for_all(); }

bool Runtime::WaitUntilDone(std::chrono::milliseconds timeout) {
  std::unique_lock lock(impl_->mutex);
  const bool ended = impl_->done_cv.wait_for(
      lock, timeout, [this] { return impl_->core.done() || !impl_->fatal_error.empty(); });
  if (!impl_->fatal_error.empty()) throw std::runtime_error(impl_->fatal_error);
  return ended;
}

void Runtime::Stop() { impl_->Stop(); }

RuntimeStatus Runtime::Status() const {
  std::lock_guard lock(impl_->mutex);
  return RuntimeStatus{
      .counters = impl_->core.counters(),
      .metrics = impl_->core.metrics(std::max(impl_->clock.Now(), impl_->last_time)),
      .events = impl_->events,
      .rejected_events = impl_->rejected_events,
      .last_rejection = impl_->last_rejection,
      .engine_failures_posted = impl_->engine_failures_posted,
      .done = impl_->core.done(),
      .command_latency = impl_->command_latency.Summary(),
      .requests = impl_->Requests(),
      .engine_load = impl_->Loads(),
      .weight_sync = impl_->Epochs(),
      .weight_sync_replans = impl_->replans_sent,
      .engines = impl_->core.engines()};
}

Counters Runtime::counters() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->core.counters();
}

void Runtime::ReportLoad(std::int64_t engine, std::int64_t running, std::int64_t waiting) {
  impl_->ReportLoad(engine, running, waiting);
}

std::string Runtime::TraceJson() const {
  std::lock_guard lock(impl_->trace_mutex);
  return impl_->trace.Json();
}

}  // namespace rlsched::scheduler
