// The discrete-event simulator (see rlsched/scheduler/simulator.h).
//
// Structure
//   A Simulation owns the Orchestrator, the modelled engines and trainer, and a
//   priority queue of future happenings ordered by (time, sequence number), so that
//   ties resolve in insertion order and a run is deterministic. Popping one happening
//   turns it into core events; every event goes through Handle() and its commands are
//   executed at once, at the same virtual time. Events that a command causes at that
//   same instant (GenerationProgressed after an interrupting SyncWeights) wait in a
//   FIFO and are handled next; future consequences (a finish, a loaded engine, a
//   finished train step) go into the queue.
//
// Engine model (per engine, continuous batching)
//   All running samples gain one token per decode step, so an engine keeps a token
//   clock (decode steps done); a sample started at clock c with r tokens to go
//   finishes when the clock reaches c + r. A min-heap of those finish clocks gives the
//   next finish in O(log n); removed samples are deleted lazily (their heap entry no
//   longer matches the sample's serial number). With n running samples and Σ context
//   S, the next m decode steps take, in closed form,
//       (m − f)·A + B·m(m − 1)/2,   A = base + a·n + b·S,  B = b·n,
//   (S grows by n per step; f is the fraction of the current step already done), so
//   advancing an engine to "now" costs O(1) plus the square root that inverts it.
//   A change at a time that is not a step boundary (a dispatch caused by another
//   engine, an abort) keeps the current step's progress pro rata (f): the time is never
//   lost or double-counted; the new samples gain their first token at the end of the
//   step in progress after their prefill. Prefill and weight loading stall decoding:
//   `ready` is the time before which the engine does not decode.
//   An interrupting SyncWeights that comes during a decode step takes effect at the
//   step's end, as on a GPU engine, which does not cut a forward pass short: the step's
//   tokens are kept and the samples it completes finish; then the engine pauses (the
//   progress reports, or GenerationPaused) and loads. The pause is one more target
//   clock beside the finishes: the tick that reaches it carries it out.
//   A sample resumed after an interrupt (Resume) or dispatched with resume_from > 0
//   re-prefills its prompt and the tokens it already has (the KV cache is gone).
//
// Complexity: O(log n) per sample start and finish (heap, ordered sets, hash maps),
// O(samples on the engine) per interrupting sync (each must be reported), plus the
// core's own costs and the planner's at each step.

#include "rlsched/scheduler/simulator.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <limits>
#include <numbers>
#include <optional>
#include <queue>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "rlsched/balance/cost_model.h"
#include "rlsched/balance/partition.h"
#include "rlsched/balance/plan_step.h"
#include "rlsched/common/check.h"
#include "rlsched/common/error.h"
#include "rlsched/workload/workload.h"

namespace rlsched::scheduler {
namespace {

// ---- Bounds (Validate). They keep one simulation's memory and time bounded. ----
constexpr std::int64_t kMaxSteps = 1'000'000;
constexpr std::int64_t kMaxEngines = 100'000;
constexpr std::int64_t kMaxGpusPerUnit = 4096;
constexpr std::int64_t kMaxSimulatedConcurrent = std::int64_t{1} << 20;
constexpr std::int64_t kMaxSamplesPerStep = 10'000'000;  // ceil((1 + r)·P)·G
constexpr std::int64_t kMaxDatasetPrompts = 100'000'000;
constexpr std::int64_t kMaxLengthsList = 10'000'000;
constexpr std::int64_t kMaxTokens = std::int64_t{1} << 31;
constexpr double kMaxSeconds = 1e9;  // any time constant (about 30 years)

// Samples drawn to estimate E[L] and E[L²] of a lognormal length distribution.
constexpr std::int64_t kMomentSamples = 100'000;

// Tags that keep the hashed random streams apart.
enum Tag : std::uint64_t {
  kTagPromptTokens = 1,
  kTagPromptLength = 2,
  kTagSampleLength = 3,
  kTagReward = 4,
  kTagFailure = 5,
  kTagMoments = 6,
};

// The factor on a step's compute time from the trainer's scaling (SimulatorConfig).
double TrainerScale(const SimulatorConfig& config) {
  if (config.trainer_reference_ranks == 0) return 1.0;
  return std::pow(static_cast<double>(config.step.num_ranks) /
                      static_cast<double>(config.trainer_reference_ranks),
                  1.0 - config.trainer_scaling_exponent);
}

std::string Num(double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.9g", value);
  return buffer;
}

// A 64-bit hash of a few values: chained SplitMix64 outputs. Seeds the per-item
// random streams, so a draw depends only on its key, not on the order of events.
std::uint64_t Hash(std::uint64_t seed, std::uint64_t tag, std::uint64_t a, std::uint64_t b = 0,
                   std::uint64_t c = 0) {
  std::uint64_t h = workload::Rng(seed).Next();
  for (const std::uint64_t v : {tag, a, b, c}) h = workload::Rng(h ^ v).Next();
  return h;
}

// Φ, the standard normal distribution function.
double NormalCdf(double z) { return 0.5 * std::erfc(-z / std::numbers::sqrt2); }

std::int64_t LiveGroupsPerBatch(const OrchestratorPolicy& options) {
  return static_cast<std::int64_t>(
      std::ceil((1.0 + options.oversample) * static_cast<double>(options.prompts_per_step)));
}

// The orchestrator options the simulation runs with: the planner, filter and step
// count come from the simulator's config.
OrchestratorOptions CoreOptions(const SimulatorConfig& config) {
  OrchestratorOptions options{config.orchestrator};
  options.num_steps = config.steps;
  if (config.filter_all_equal) options.filter = KeepUnlessAllEqual;
  options.planner = [step = config.step](std::span<const std::int64_t> lengths,
                                         std::span<const std::int64_t> groups) {
    return balance::PlanStep(lengths, groups, step);
  };
  return options;
}

// ---- The workload: prompt tokens, response lengths and rewards, each a pure
// function of its key and the seed. ----
class Workload {
 public:
  explicit Workload(const SimulatorConfig& config)
      : seed_(config.seed),
        lengths_(config.lengths),
        samples_per_prompt_(config.orchestrator.samples_per_prompt),
        all_equal_rate_(config.all_equal_rate) {
    std::sort(lengths_.lengths.begin(), lengths_.lengths.end());
  }

  // Uniform in [min_prompt_tokens, max_prompt_tokens], fixed per prompt id.
  std::int64_t PromptTokens(std::int64_t prompt) const {
    return PromptTokensOf(seed_, lengths_, prompt);
  }
  static std::int64_t PromptTokensOf(std::uint64_t seed, const LengthDistribution& lengths,
                                     std::int64_t prompt) {
    workload::Rng rng(Hash(seed, kTagPromptTokens, static_cast<std::uint64_t>(prompt)));
    return rng.UniformInt(lengths.min_prompt_tokens, lengths.max_prompt_tokens);
  }

  // The response length of sample `index` of the `epoch`-th group of `prompt`: the
  // distribution's quantile at Φ(ρ·z_prompt + √(1 − ρ²)·z_sample). O(1).
  std::int64_t ResponseLength(std::int64_t prompt, std::int64_t epoch, std::int64_t index) const {
    const double z_prompt =
        workload::Rng(Hash(seed_, kTagPromptLength, static_cast<std::uint64_t>(prompt))).Normal();
    const double z_sample =
        workload::Rng(Hash(seed_, kTagSampleLength, static_cast<std::uint64_t>(prompt),
                           static_cast<std::uint64_t>(epoch), static_cast<std::uint64_t>(index)))
            .Normal();
    const double rho = lengths_.length_correlation;
    const double z = rho * z_prompt + std::sqrt(std::max(0.0, 1.0 - rho * rho)) * z_sample;
    return Quantile(z);
  }

  // The length at standard-normal quantile z.
  std::int64_t Quantile(double z) const {
    if (lengths_.lengths.empty()) {
      const double value = std::exp(std::min(lengths_.mu + lengths_.sigma * z, 40.0));
      return std::clamp<std::int64_t>(std::llround(std::min(value, 1e12)), 1, lengths_.max_tokens);
    }
    const auto n = static_cast<double>(lengths_.lengths.size());
    const auto index =
        static_cast<std::size_t>(std::clamp(std::floor(NormalCdf(z) * n), 0.0, n - 1.0));
    return lengths_.lengths[index];
  }

  // E[L] and E[L²] of the response length: exact over a list, else from
  // kMomentSamples seeded draws. O(list size or kMomentSamples).
  std::pair<double, double> Moments() const {
    double sum = 0;
    double sum_sq = 0;
    std::int64_t count = 0;
    if (!lengths_.lengths.empty()) {
      for (const std::int64_t length : lengths_.lengths) {
        sum += static_cast<double>(length);
        sum_sq += static_cast<double>(length) * static_cast<double>(length);
      }
      count = static_cast<std::int64_t>(lengths_.lengths.size());
    } else {
      workload::Rng rng(Hash(seed_, kTagMoments, 0));
      for (; count < kMomentSamples; ++count) {
        const auto length = static_cast<double>(Quantile(rng.Normal()));
        sum += length;
        sum_sq += length * length;
      }
    }
    return {sum / static_cast<double>(count), sum_sq / static_cast<double>(count)};
  }

  double MeanPromptTokens() const {
    return 0.5 * static_cast<double>(lengths_.min_prompt_tokens + lengths_.max_prompt_tokens);
  }

  // The rewards of a group: with probability all_equal_rate all equal (0 or 1),
  // else independent 0/1 with one flipped when they came out all equal. O(G).
  std::vector<double> GroupRewards(std::int64_t group) const {
    workload::Rng rng(Hash(seed_, kTagReward, static_cast<std::uint64_t>(group)));
    const auto g = static_cast<std::size_t>(samples_per_prompt_);
    std::vector<double> rewards(g);
    if (rng.UniformReal() < all_equal_rate_) {
      const double value = static_cast<double>(rng.Next() & 1U);
      std::fill(rewards.begin(), rewards.end(), value);
      return rewards;
    }
    for (double& reward : rewards) reward = static_cast<double>(rng.Next() & 1U);
    const bool all_equal =
        std::all_of(rewards.begin(), rewards.end(), [&](double r) { return r == rewards.front(); });
    if (all_equal && g > 1) {
      const auto flip = static_cast<std::size_t>(rng.UniformInt(0, samples_per_prompt_ - 1));
      rewards[flip] = 1.0 - rewards[flip];
    }
    return rewards;
  }

 private:
  std::uint64_t seed_;
  LengthDistribution lengths_;  // `lengths` sorted
  std::int64_t samples_per_prompt_;
  double all_equal_rate_;
};

// ---- The timeline (Chrome trace JSON). ----
class Trace {
 public:
  explicit Trace(bool enabled) : enabled_(enabled) {}
  bool enabled() const { return enabled_; }

  // A complete ("X") slice; merged with the thread's previous slice when that one has
  // the same name and ends where this one starts.
  void Slice(int pid, std::int64_t tid, const std::string& name, double start, double end) {
    if (!enabled_ || !(end > start)) return;
    const std::uint64_t key = Key(pid, tid);
    auto it = last_.find(key);
    if (it != last_.end()) {
      SliceRecord& previous = slices_[it->second];
      if (previous.name == name && previous.end == start) {
        previous.end = end;
        return;
      }
    }
    last_[key] = slices_.size();
    slices_.push_back({pid, tid, name, start, end});
  }
  void Instant(int pid, std::int64_t tid, const std::string& name, double time) {
    if (enabled_) instants_.push_back({pid, tid, name, time, time});
  }
  void Thread(int pid, std::int64_t tid, const std::string& name) {
    if (enabled_) threads_.push_back({pid, tid, name, 0, 0});
  }

  std::string Json() const {
    if (!enabled_) return {};
    std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
    bool first = true;
    auto next = [&] {
      if (!first) out += ",\n";
      first = false;
    };
    const std::pair<int, const char*> processes[] = {{1, "engines"}, {2, "trainer"}};
    for (const auto& [pid, name] : processes) {
      next();
      out += "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + std::to_string(pid) +
             ",\"tid\":0,\"args\":{\"name\":\"" + name + "\"}}";
    }
    for (const SliceRecord& t : threads_) {
      next();
      out += "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" + std::to_string(t.pid) +
             ",\"tid\":" + std::to_string(t.tid) + ",\"args\":{\"name\":\"" + t.name + "\"}}";
    }
    char buffer[96];
    for (const SliceRecord& s : slices_) {
      next();
      std::snprintf(buffer, sizeof buffer, "\"ts\":%.3f,\"dur\":%.3f}", s.start * 1e6,
                    (s.end - s.start) * 1e6);
      out += "{\"name\":\"" + s.name + "\",\"ph\":\"X\",\"pid\":" + std::to_string(s.pid) +
             ",\"tid\":" + std::to_string(s.tid) + "," + buffer;
    }
    for (const SliceRecord& s : instants_) {
      next();
      std::snprintf(buffer, sizeof buffer, "\"ts\":%.3f}", s.start * 1e6);
      out += "{\"name\":\"" + s.name +
             "\",\"ph\":\"i\",\"s\":\"t\",\"pid\":" + std::to_string(s.pid) +
             ",\"tid\":" + std::to_string(s.tid) + "," + buffer;
    }
    out += "\n]}\n";
    return out;
  }

 private:
  struct SliceRecord {
    int pid;
    std::int64_t tid;
    std::string name;
    double start;
    double end;
  };
  static std::uint64_t Key(int pid, std::int64_t tid) {
    return (static_cast<std::uint64_t>(pid) << 56) ^ static_cast<std::uint64_t>(tid);
  }

  bool enabled_;
  std::vector<SliceRecord> slices_;
  std::vector<SliceRecord> instants_;
  std::vector<SliceRecord> threads_;
  std::unordered_map<std::uint64_t, std::size_t> last_;  // lookups only; never iterated
};

// ---- The simulation. ----
class Simulation {
 public:
  Simulation(const SimulatorConfig& config, const StopCheck& should_stop)
      : config_(config),
        should_stop_(should_stop),
        core_(CoreOptions(config)),
        workload_(config),
        trace_(config.trace),
        staleness_ahead_(std::min<std::int64_t>(EffectiveStaleness(config.orchestrator), 4)),
        epochs_seen_(static_cast<std::size_t>(config.dataset_prompts), 0) {}

  SimulationReport Run();

 private:
  enum class Kind { kTick, kLoaded, kTrainDone, kFail, kJoin, kReleased };
  struct Happening {
    double time;
    std::int64_t seq;
    Kind kind;
    std::int64_t engine;  // kTrainDone: the call
    std::int64_t a;       // kTick: the engine's tick version; kLoaded: version; kTrainDone: step
    std::int64_t incarnation = 0;  // kLoaded, kReleased: of the engine's slot when pushed
    bool operator>(const Happening& other) const {
      return time != other.time ? time > other.time : seq > other.seq;
    }
  };

  struct FinishEntry {
    std::int64_t clock;
    std::int64_t sample;
    std::int64_t serial;
    bool operator>(const FinishEntry& other) const {
      return clock != other.clock ? clock > other.clock : sample > other.sample;
    }
  };

  enum class Activity { kIdle, kGenerate, kLoad };

  struct Engine {
    std::int64_t id = 0;
    // The engines that held this slot before (a replacement takes a failed engine's
    // slot and id, so that memory stays O(engines) however often engines fail).
    std::int64_t incarnation = 0;
    bool alive = true;
    std::int64_t version = 0;
    // Decode state.
    std::int64_t clock = 0;    // decode steps done
    std::int64_t running = 0;  // n
    std::int64_t context = 0;  // S: Σ prompt + generated over running samples
    double fraction = 0;       // of the step in progress, in [0, 1)
    double time = 0;           // advanced up to here
    double ready = 0;          // no decoding before (prefill, weight loading)
    std::int64_t tick_version = 0;
    std::priority_queue<FinishEntry, std::vector<FinishEntry>, std::greater<>> finishes;
    std::set<std::int64_t> running_ids;  // ordered: progress reports by ascending id
    std::set<std::int64_t> paused_ids;
    // Dispatched, waiting for room in the KV cache (EngineModel::kv_cache_tokens), in
    // arrival order.
    std::deque<std::int64_t> waiting_ids;
    std::deque<std::int64_t> loading;  // versions of the SyncWeights not yet loaded
    // An interrupting SyncWeights that came during a decode step: it takes effect when
    // the engine's clock reaches pause_clock (the end of that step), or when no sample
    // is left running.
    std::optional<SyncWeights> pause;
    std::int64_t pause_clock = 0;
    bool released = false;  // colocated: memory freed for the trainer
    bool dirty = false;
    // Timeline.
    Activity activity = Activity::kIdle;
    std::string activity_name;
    double since = 0;
  };

  struct Live {  // a sample on an engine
    std::int64_t engine = 0;
    std::int64_t serial = 0;
    std::int64_t start_clock = 0;
    std::int64_t base = 0;  // tokens generated when it (re)started
    std::int64_t length = 0;
    std::int64_t prompt_tokens = 0;
    bool paused = false;
    bool waiting = false;        // for room in the KV cache
    std::int64_t generated = 0;  // when paused
  };

  // Happenings.
  void Push(double time, Kind kind, std::int64_t engine, std::int64_t a = 0,
            std::int64_t incarnation = 0) {
    queue_.push({time, next_seq_++, kind, engine, a, incarnation});
  }
  // A new engine in slot `slot` (a failed engine's, or a new one when -1).
  void JoinEngine(double now, std::int64_t version, std::int64_t slot);
  void OnTick(Engine& engine, double now);
  // Run()'s steps: one happening (false: a stale one, skipped), an engine's failure, the
  // error of a run with nothing left to happen, and the report at its end.
  bool Handle(const Happening& h);
  void FailEngine(Engine& engine);
  [[noreturn]] void Stalled() const;
  SimulationReport Report(double end);

  // Core events and commands.
  void Deliver(Event event) { pending_.push_back(std::move(event)); }
  void Settle(double now);
  void Drain(double now);
  void Execute(const Command& command, double now);
  void ExecuteDispatch(const Dispatch& dispatch, double now);
  void ExecuteAbort(const Abort& abort, double now);
  void ExecuteSync(const SyncWeights& sync, double now);
  void PauseAndLoad(Engine& engine, const SyncWeights& sync, double now);
  // The core never sends an engine work or another sync while its pause waits.
  void FailIfPausing(const Engine& engine, const char* what, double now) const;
  void ExecuteResume(const Resume& resume, double now);
  void ExecuteTrain(const StartTrain& train, double now);
  void ExecuteRelease(const Release& release, double now);

  // Engine model.
  Engine& EngineAt(std::int64_t id, const char* what);
  double StepTime(const Engine& engine) const;  // A for the current state
  double StepsTime(const Engine& engine, std::int64_t m) const;
  void Advance(Engine& engine, double now);
  bool CleanTop(Engine& engine);
  std::int64_t NextTarget(Engine& engine);
  void StartSample(Engine& engine, std::int64_t sample, Live live, double now);
  std::int64_t FullClock(const Engine& engine) const;
  bool Fits(const Engine& engine, const Live& live) const;
  void Preempt(Engine& engine);
  void AdmitWaiting(Engine& engine, double now);
  void RunSample(Engine& engine, std::int64_t sample, Live live, double now);
  std::int64_t StopSample(Engine& engine, std::int64_t sample);
  void Reschedule(Engine& engine, double now);
  void MarkDirty(Engine& engine) {
    if (!engine.dirty) dirty_.push_back(engine.id);
    engine.dirty = true;
  }
  void UpdateActivity(Engine& engine, double now);

  std::int64_t EpochOf(std::int64_t group, std::int64_t prompt);
  [[noreturn]] void Fail(const std::string& message) const;
  void Log(std::string line);

  const SimulatorConfig& config_;
  const StopCheck& should_stop_;
  Orchestrator core_;
  Workload workload_;
  Trace trace_;
  std::int64_t staleness_ahead_;

  std::priority_queue<Happening, std::vector<Happening>, std::greater<>> queue_;
  std::int64_t next_seq_ = 0;
  std::int64_t joins_ = 0;        // engines that joined so far, replacements included
  std::int64_t preemptions_ = 0;  // samples preempted for a full KV cache
  std::deque<Event> pending_;
  std::vector<Engine> engines_;  // index = engine id
  std::vector<std::int64_t> dirty_;
  std::unordered_map<std::int64_t, Live> live_;
  std::int64_t next_serial_ = 0;

  // Prompts fed to the core (their count, for the next dataset index).
  std::int64_t fed_ = 0;
  // Epoch of each group: the how-many-th group of its prompt it is.
  std::vector<std::int64_t> epochs_seen_;
  std::unordered_map<std::int64_t, std::int64_t> group_epoch_;
  std::unordered_map<std::int64_t, std::vector<double>> rewards_;
  std::unordered_map<std::int64_t, double> first_dispatch_;

  bool trainer_busy_ = false;
  double train_start_ = 0;
  std::int64_t train_step_ = 0;
  double step_first_dispatch_ = 0;  // of the step training (its calls' earliest)
  double generation_seconds_ = 0;
  double train_seconds_ = 0;
  std::int64_t train_count_ = 0;
  std::int64_t events_ = 0;
  double now_ = 0;

  std::deque<std::string> log_;  // recent events and commands (check_invariants only)
};

[[noreturn]] void Simulation::Fail(const std::string& message) const {
  std::string text = message;
  if (!log_.empty()) {
    text += "\nrecent events and commands:";
    for (const std::string& line : log_) text += "\n  " + line;
  }
  throw std::logic_error(text);
}

void Simulation::Log(std::string line) {
  if (!config_.check_invariants) return;
  log_.push_back(std::move(line));
  if (log_.size() > 400) log_.pop_front();
}

std::string Describe(const Event& event) {
  return std::visit(
      [](const auto& e) -> std::string {
        using T = std::decay_t<decltype(e)>;
        const std::string t = "t=" + Num(e.time) + " ";
        if constexpr (std::is_same_v<T, PromptsAvailable>) {
          return t + "PromptsAvailable n=" + std::to_string(e.prompts.size());
        } else if constexpr (std::is_same_v<T, EngineJoined>) {
          return t + "EngineJoined engine=" + std::to_string(e.engine) +
                 " version=" + std::to_string(e.version);
        } else if constexpr (std::is_same_v<T, EngineAttached>) {
          return t + "EngineAttached engine=" + std::to_string(e.engine) +
                 " version=" + std::to_string(e.version) +
                 " samples=" + std::to_string(e.samples.size());
        } else if constexpr (std::is_same_v<T, EngineLeft>) {
          return t + "EngineLeft engine=" + std::to_string(e.engine);
        } else if constexpr (std::is_same_v<T, EngineFailed>) {
          return t + "EngineFailed engine=" + std::to_string(e.engine);
        } else if constexpr (std::is_same_v<T, GenerationProgressed>) {
          return t + "GenerationProgressed sample=" + std::to_string(e.sample) +
                 " tokens=" + std::to_string(e.tokens);
        } else if constexpr (std::is_same_v<T, GenerationFinished>) {
          return t + "GenerationFinished sample=" + std::to_string(e.sample) +
                 " tokens=" + std::to_string(e.tokens) + " reward=" + Num(e.reward);
        } else if constexpr (std::is_same_v<T, GroupFiltered>) {
          return t + "GroupFiltered group=" + std::to_string(e.group);
        } else if constexpr (std::is_same_v<T, TrainStepFinished>) {
          return t + "TrainStepFinished step=" + std::to_string(e.step) +
                 " call=" + std::to_string(e.call);
        } else if constexpr (std::is_same_v<T, EngineReleased>) {
          return t + "EngineReleased engine=" + std::to_string(e.engine);
        } else if constexpr (std::is_same_v<T, GenerationPaused>) {
          std::string text = t + "GenerationPaused engine=" + std::to_string(e.engine) +
                             " version=" + std::to_string(e.version) + " samples=";
          for (std::size_t i = 0; i < e.samples.size(); ++i) {
            text += (i == 0 ? "" : ",") + std::to_string(e.samples[i].sample) + "/" +
                    std::to_string(e.samples[i].tokens);
          }
          return text;
        } else {
          static_assert(std::is_same_v<T, WeightsLoaded>, "an event kind without a line");
          return t + "WeightsLoaded engine=" + std::to_string(e.engine) +
                 " version=" + std::to_string(e.version);
        }
      },
      event);
}

std::string Describe(const Command& command) {
  auto ids = [](const std::vector<std::int64_t>& v) {
    std::string s = "[";
    for (std::size_t i = 0; i < v.size() && i < 32; ++i) {
      if (i > 0) s += ',';
      s += std::to_string(v[i]);
    }
    if (v.size() > 32) s += ",…(" + std::to_string(v.size()) + ")";
    return s + "]";
  };
  return std::visit(
      [&](const auto& c) -> std::string {
        using T = std::decay_t<decltype(c)>;
        if constexpr (std::is_same_v<T, Dispatch>) {
          std::vector<std::int64_t> samples;
          for (const SampleWork& w : c.samples) samples.push_back(w.sample);
          return "  -> Dispatch engine=" + std::to_string(c.engine) +
                 " version=" + std::to_string(c.version) + " samples=" + ids(samples);
        } else if constexpr (std::is_same_v<T, Abort>) {
          return "  -> Abort engine=" + std::to_string(c.engine) + " samples=" + ids(c.samples);
        } else if constexpr (std::is_same_v<T, SyncWeights>) {
          return "  -> SyncWeights engine=" + std::to_string(c.engine) +
                 " version=" + std::to_string(c.version) +
                 " interrupt=" + (c.interrupt ? "1" : "0") +
                 (c.pause == PauseMode::kAbort ? " pause=abort" : "");
        } else if constexpr (std::is_same_v<T, Resume>) {
          return "  -> Resume engine=" + std::to_string(c.engine) +
                 " version=" + std::to_string(c.version) + " samples=" + ids(c.samples);
        } else if constexpr (std::is_same_v<T, Release>) {
          return "  -> Release engine=" + std::to_string(c.engine);
        } else {
          return "  -> StartTrain step=" + std::to_string(c.step) +
                 " call=" + std::to_string(c.call) + " groups=" + std::to_string(c.groups.size()) +
                 " samples=" + std::to_string(c.samples.size());
        }
      },
      command);
}

// ---- Engine model. ----

Simulation::Engine& Simulation::EngineAt(std::int64_t id, const char* what) {
  if (id < 0 || id >= static_cast<std::int64_t>(engines_.size()) ||
      !engines_[static_cast<std::size_t>(id)].alive) {
    Fail(std::string("core sent ") + what + " to engine " + std::to_string(id) +
         ", which is not alive, at t=" + Num(now_));
  }
  return engines_[static_cast<std::size_t>(id)];
}

double Simulation::StepTime(const Engine& engine) const {
  const EngineModel& m = config_.engine;
  return m.decode_base_seconds +
         m.decode_per_sequence_seconds * static_cast<double>(engine.running) +
         m.decode_per_context_token_seconds * static_cast<double>(engine.context);
}

// The time of the next m decode steps from the current state: (m − f)·A + B·m(m−1)/2.
double Simulation::StepsTime(const Engine& engine, std::int64_t m) const {
  if (m <= 0) return 0;
  const double a = StepTime(engine);
  const double b =
      config_.engine.decode_per_context_token_seconds * static_cast<double>(engine.running);
  const auto md = static_cast<double>(m);
  return (md - engine.fraction) * a + b * md * (md - 1.0) / 2.0;
}

// Pops lazily deleted entries; true when a valid next finish exists. Amortised
// O(log n) per entry ever pushed.
bool Simulation::CleanTop(Engine& engine) {
  while (!engine.finishes.empty()) {
    const FinishEntry& top = engine.finishes.top();
    auto it = live_.find(top.sample);
    if (it != live_.end() && it->second.engine == engine.id && !it->second.paused &&
        !it->second.waiting && it->second.serial == top.serial) {
      return true;
    }
    engine.finishes.pop();
  }
  return false;
}

// Decodes from engine.time to now in whole steps (closed form), keeping the step in
// progress pro rata; never passes the next finish clock, nor a pending pause's clock.
// O(1) amortised.
void Simulation::Advance(Engine& engine, double now) {
  if (!(now > engine.time)) return;
  const double start = std::max(engine.time, engine.ready);
  engine.time = now;
  if (engine.running == 0) {
    engine.fraction = 0;
    return;
  }
  if (!(now > start)) return;
  const double dt = now - start;
  std::int64_t limit = std::numeric_limits<std::int64_t>::max();
  if (CleanTop(engine)) limit = engine.finishes.top().clock - engine.clock;
  if (engine.pause.has_value()) limit = std::min(limit, engine.pause_clock - engine.clock);
  if (const std::int64_t full = FullClock(engine); full >= 0) {
    limit = std::min(limit, full - engine.clock);
  }
  // Largest m with StepsTime(m) <= dt: solve (B/2)m² + (A − B/2)m − f·A <= dt.
  const double a = StepTime(engine);
  const double b =
      config_.engine.decode_per_context_token_seconds * static_cast<double>(engine.running);
  double estimate;
  if (b > 0) {
    const double p = a - b / 2.0;
    estimate = (-p + std::sqrt(p * p + 2.0 * b * (dt + engine.fraction * a))) / b;
  } else {
    estimate = (dt + engine.fraction * a) / a;
  }
  auto m = static_cast<std::int64_t>(
      std::clamp(std::floor(estimate), 0.0,
                 static_cast<double>(std::min<std::int64_t>(limit, std::int64_t{1} << 52))));
  while (m > 0 && StepsTime(engine, m) > dt) --m;
  while (m < limit && StepsTime(engine, m + 1) <= dt) ++m;
  const double rest = dt - StepsTime(engine, m);
  if (m == 0) {
    engine.fraction = std::min(engine.fraction + rest / a, std::nextafter(1.0, 0.0));
    return;
  }
  engine.clock += m;
  engine.context += engine.running * m;
  if (m == limit) {
    engine.fraction = 0;  // at a finish: the tick at this time reports it
  } else {
    engine.fraction = std::clamp(rest / StepTime(engine), 0.0, std::nextafter(1.0, 0.0));
  }
}

// Starts the sample when the running samples' contexts and its own fit in the KV cache
// (or nothing runs); else it waits on the engine.
void Simulation::StartSample(Engine& engine, std::int64_t sample, Live live, double now) {
  if (engine.running > 0 && (!engine.waiting_ids.empty() || !Fits(engine, live))) {
    live.engine = engine.id;
    live.paused = false;
    live.waiting = true;
    live.serial = next_serial_++;  // no finish of an earlier start is its
    engine.waiting_ids.push_back(sample);
    live_[sample] = live;
    return;
  }
  RunSample(engine, sample, live, now);
}

// Whether the sample's context fits in the KV cache beside the running ones', with room
// for the next decode step of all.
bool Simulation::Fits(const Engine& engine, const Live& live) const {
  const std::int64_t kv = config_.engine.kv_cache_tokens;
  return kv == 0 || engine.context + live.prompt_tokens + live.base + engine.running + 1 <= kv;
}

// Starts waiting samples, oldest first, while they fit.
void Simulation::AdmitWaiting(Engine& engine, double now) {
  while (!engine.waiting_ids.empty()) {
    const std::int64_t sample = engine.waiting_ids.front();
    Live live = live_.at(sample);
    if (engine.running > 0 && !Fits(engine, live)) return;
    engine.waiting_ids.pop_front();
    live.waiting = false;
    RunSample(engine, sample, live, now);
  }
}

void Simulation::RunSample(Engine& engine, std::int64_t sample, Live live, double now) {
  const EngineModel& model = config_.engine;
  const std::int64_t prefill = live.prompt_tokens + live.base;
  engine.ready =
      std::max(engine.ready, now) + static_cast<double>(prefill) / model.prefill_tokens_per_second;
  live.engine = engine.id;
  live.serial = next_serial_++;
  live.start_clock = engine.clock;
  live.paused = false;
  engine.running += 1;
  engine.context += prefill;
  engine.finishes.push({live.start_clock + (live.length - live.base), sample, live.serial});
  engine.running_ids.insert(sample);
  live_[sample] = live;
}

// Removes a running or paused sample from the engine; returns its tokens so far.
std::int64_t Simulation::StopSample(Engine& engine, std::int64_t sample) {
  auto it = live_.find(sample);
  if (it == live_.end() || it->second.engine != engine.id) {
    Fail("sample " + std::to_string(sample) + " is not on engine " + std::to_string(engine.id) +
         (it == live_.end() ? std::string(" (on no engine)")
                            : " (on engine " + std::to_string(it->second.engine) + ")") +
         " at t=" + Num(now_));
  }
  Live& live = it->second;
  std::int64_t tokens;
  if (live.waiting) {
    tokens = live.base;
    engine.waiting_ids.erase(
        std::find(engine.waiting_ids.begin(), engine.waiting_ids.end(), sample));
  } else if (live.paused) {
    tokens = live.generated;
    engine.paused_ids.erase(sample);
  } else {
    tokens = live.base + (engine.clock - live.start_clock);
    engine.running -= 1;
    engine.context -= live.prompt_tokens + tokens;
    engine.running_ids.erase(sample);
    if (engine.running == 0) engine.fraction = 0;
  }
  live_.erase(it);
  return tokens;
}

// The clock of the engine's next finish, pending pause or full KV cache, whichever
// comes first; -1 when there is none.
std::int64_t Simulation::NextTarget(Engine& engine) {
  std::int64_t target = CleanTop(engine) ? engine.finishes.top().clock : -1;
  if (engine.pause.has_value() && (target < 0 || engine.pause_clock < target)) {
    target = engine.pause_clock;
  }
  if (const std::int64_t full = FullClock(engine); full >= 0 && (target < 0 || full < target)) {
    target = full;
  }
  return target;
}

// The clock after which the next decode step would not fit in the KV cache (the
// running contexts grow by one token each per step); -1 without a cache bound or with
// at most one sample running (one sample is never preempted).
std::int64_t Simulation::FullClock(const Engine& engine) const {
  const std::int64_t kv = config_.engine.kv_cache_tokens;
  if (kv == 0 || engine.running < 2) return -1;
  return engine.clock + std::max<std::int64_t>(0, (kv - engine.context) / engine.running);
}

// vLLM's recompute preemption: while the next step would overflow the KV cache, the
// newest running sample goes back to the front of the waiting queue, its tokens kept
// (re-prefilled when it starts again).
void Simulation::Preempt(Engine& engine) {
  const std::int64_t kv = config_.engine.kv_cache_tokens;
  while (kv > 0 && engine.running > 1 && engine.context + engine.running > kv) {
    std::int64_t newest = -1;
    for (const std::int64_t sample : engine.running_ids) {
      if (newest < 0 || live_.at(sample).serial > live_.at(newest).serial) newest = sample;
    }
    Live live = live_.at(newest);
    live.base = StopSample(engine, newest);
    live.waiting = true;
    live.serial = next_serial_++;  // its pending finish is stale
    engine.waiting_ids.push_front(newest);
    live_[newest] = live;
    ++preemptions_;
  }
}

void Simulation::Reschedule(Engine& engine, double now) {
  ++engine.tick_version;
  const std::int64_t target = NextTarget(engine);
  if (target < 0) return;
  const std::int64_t m = target - engine.clock;
  const double time = m <= 0 ? now : std::max(now, engine.ready) + StepsTime(engine, m);
  Push(time, Kind::kTick, engine.id, engine.tick_version);
}

void Simulation::UpdateActivity(Engine& engine, double now) {
  Activity activity = Activity::kIdle;
  std::string name;
  if (!engine.loading.empty()) {
    activity = Activity::kLoad;
    name = "sync v" + std::to_string(engine.loading.front());
  } else if (!engine.running_ids.empty() || !engine.paused_ids.empty() ||
             !engine.waiting_ids.empty()) {
    activity = Activity::kGenerate;
    name = "generate";
  }
  if (activity == engine.activity && name == engine.activity_name) return;
  if (engine.activity != Activity::kIdle) {
    trace_.Slice(1, engine.id, engine.activity_name, engine.since, now);
  }
  engine.activity = activity;
  engine.activity_name = std::move(name);
  engine.since = now;
}

void Simulation::JoinEngine(double now, std::int64_t version, std::int64_t slot) {
  const std::int64_t join = joins_++;
  Engine engine;
  engine.version = version;
  engine.time = now;
  engine.ready = now;
  engine.since = now;
  if (slot < 0) {
    engine.id = static_cast<std::int64_t>(engines_.size());
    engines_.push_back(std::move(engine));
    trace_.Thread(1, engines_.back().id, "engine " + std::to_string(engines_.back().id));
  } else {
    Engine& old = engines_[static_cast<std::size_t>(slot)];
    engine.id = slot;
    engine.incarnation = old.incarnation + 1;
    engine.tick_version = old.tick_version + 1;  // the old engine's ticks stay stale
    old = std::move(engine);
    trace_.Instant(1, slot, "joined", now);
  }
  const std::int64_t id = slot < 0 ? engines_.back().id : slot;
  Deliver(EngineJoined{.time = now,
                       .engine = id,
                       .max_concurrent = config_.engine.max_concurrent,
                       .version = version});
  if (config_.engine_mtbf_seconds > 0) {
    // Seeded by the join's number: each engine that ever joins draws its own time.
    workload::Rng rng(Hash(config_.seed, kTagFailure, static_cast<std::uint64_t>(join)));
    const double u = 1.0 - rng.UniformReal();  // (0, 1]
    Push(now - config_.engine_mtbf_seconds * std::log(u), Kind::kFail, id);
  }
}

// A finish: the engine reached the clock of its next finish; every sample finishing at
// that clock (ascending id) is reported. Each one leaves the engine only when its event
// is handed to the core, and the core's answer is executed before the next: a command
// may abort a sample that reached its end but was not yet reported (it is then dropped
// unreported, as a real engine would drop a request aborted before its result left).
void Simulation::OnTick(Engine& engine, double now) {
  Advance(engine, now);
  const std::int64_t target = NextTarget(engine);
  if (target < 0) return;
  if (engine.clock < target) {
    // The event was scheduled exactly at this clock; floating-point rounding in the
    // inversion may leave the last step a hair short of done.
    engine.context += engine.running * (target - engine.clock);
    engine.clock = target;
    engine.fraction = 0;
  }
  std::vector<FinishEntry> done;
  while (CleanTop(engine) && engine.finishes.top().clock <= engine.clock) {
    done.push_back(engine.finishes.top());
    engine.finishes.pop();
  }
  const std::int64_t g = config_.orchestrator.samples_per_prompt;
  for (const FinishEntry& entry : done) {
    auto it = live_.find(entry.sample);
    if (it == live_.end() || it->second.engine != engine.id || it->second.paused ||
        it->second.waiting || it->second.serial != entry.serial) {
      continue;  // aborted or interrupted by the core's answer to an earlier finish
    }
    const std::int64_t tokens = StopSample(engine, entry.sample);
    AdmitWaiting(engine, now);
    const std::int64_t group = entry.sample / g;
    auto rewards = rewards_.find(group);
    if (rewards == rewards_.end()) {
      rewards = rewards_.emplace(group, workload_.GroupRewards(group)).first;
    }
    const double reward = rewards->second[static_cast<std::size_t>(entry.sample - group * g)];
    Deliver(GenerationFinished{.time = now,
                               .sample = entry.sample,
                               .tokens = tokens,
                               .reward = reward,
                               .engine = engine.id});
    Drain(now);
  }
  if (engine.alive && engine.pause.has_value() && engine.clock >= engine.pause_clock) {
    PauseAndLoad(engine, *std::exchange(engine.pause, std::nullopt), now);
  }
  if (engine.alive) Preempt(engine);
  MarkDirty(engine);
}

// ---- Commands. ----

std::int64_t Simulation::EpochOf(std::int64_t group, std::int64_t prompt) {
  auto it = group_epoch_.find(group);
  if (it != group_epoch_.end()) return it->second;
  if (prompt < 0 || prompt >= config_.dataset_prompts) {
    Fail("core dispatched prompt " + std::to_string(prompt) +
         ", which was never fed, at t=" + Num(now_));
  }
  const std::int64_t epoch = epochs_seen_[static_cast<std::size_t>(prompt)]++;
  group_epoch_.emplace(group, epoch);
  return epoch;
}

void Simulation::ExecuteDispatch(const Dispatch& dispatch, double now) {
  Engine& engine = EngineAt(dispatch.engine, "Dispatch");
  Advance(engine, now);
  FailIfPausing(engine, "Dispatch", now);
  const std::int64_t g = config_.orchestrator.samples_per_prompt;
  for (const SampleWork& work : dispatch.samples) {
    if (live_.contains(work.sample)) {
      Fail("core dispatched sample " + std::to_string(work.sample) + " to engine " +
           std::to_string(engine.id) + " while it is on engine " +
           std::to_string(live_.at(work.sample).engine) + ", at t=" + Num(now));
    }
    if (work.sample / g != work.group) {
      Fail("core dispatched sample " + std::to_string(work.sample) + " as part of group " +
           std::to_string(work.group) + ", at t=" + Num(now));
    }
    const std::int64_t epoch = EpochOf(work.group, work.prompt);
    Live live;
    live.length = workload_.ResponseLength(work.prompt, epoch, work.sample - work.group * g);
    live.prompt_tokens = work.prompt_tokens;
    live.base = work.resume_from;
    if (work.resume_from < 0 || work.resume_from > live.length) {
      Fail("core dispatched sample " + std::to_string(work.sample) + " with resume_from " +
           std::to_string(work.resume_from) + " but its length is " + std::to_string(live.length) +
           ", at t=" + Num(now));
    }
    first_dispatch_.emplace(work.sample, now);
    StartSample(engine, work.sample, live, now);
  }
  const auto on_engine = static_cast<std::int64_t>(
      engine.running_ids.size() + engine.paused_ids.size() + engine.waiting_ids.size());
  if (on_engine > config_.engine.max_concurrent) {
    Fail("core put " + std::to_string(on_engine) + " samples on engine " +
         std::to_string(engine.id) + " (max_concurrent " +
         std::to_string(config_.engine.max_concurrent) + "), at t=" + Num(now));
  }
  MarkDirty(engine);
}

void Simulation::ExecuteAbort(const Abort& abort, double now) {
  Engine& engine = EngineAt(abort.engine, "Abort");
  Advance(engine, now);
  for (const std::int64_t sample : abort.samples) StopSample(engine, sample);
  AdmitWaiting(engine, now);
  if (engine.pause.has_value() && engine.running == 0) {
    // Nothing left running: the pause waits for no step.
    PauseAndLoad(engine, *std::exchange(engine.pause, std::nullopt), now);
  }
  MarkDirty(engine);
}

void Simulation::ExecuteSync(const SyncWeights& sync, double now) {
  Engine& engine = EngineAt(sync.engine, "SyncWeights");
  Advance(engine, now);
  FailIfPausing(engine, "SyncWeights", now);
  // Finishes reached at this very time whose tick has not yet run (a tie in time).
  const bool due = CleanTop(engine) && engine.finishes.top().clock <= engine.clock;
  if (sync.interrupt && engine.running > 0 && (engine.fraction > 0 || due)) {
    // A decode step is in progress: the pause waits for its end (its tokens are kept);
    // or the step that ended now completed samples: they finish, then the pause.
    engine.pause = sync;
    engine.pause_clock = engine.fraction > 0 ? engine.clock + 1 : engine.clock;
    MarkDirty(engine);
    return;
  }
  PauseAndLoad(engine, sync, now);
}

void Simulation::FailIfPausing(const Engine& engine, const char* what, double now) const {
  if (!engine.pause.has_value()) return;
  Fail(std::string("core sent ") + what + " to engine " + std::to_string(engine.id) +
       " while it pauses for SyncWeights version " + std::to_string(engine.pause->version) +
       ", at t=" + Num(now));
}

// Carries out a SyncWeights at a step boundary: with interrupt, every running sample
// pauses and reports its progress (ascending id); then the engine loads.
void Simulation::PauseAndLoad(Engine& engine, const SyncWeights& sync, double now) {
  if (sync.interrupt) {
    for (const std::int64_t sample : engine.waiting_ids) {  // paused before they started
      Live& live = live_.at(sample);
      live.generated = live.base;
      live.waiting = false;
      live.paused = true;
      engine.paused_ids.insert(sample);
    }
    engine.waiting_ids.clear();
    for (const std::int64_t sample : engine.running_ids) {
      Live& live = live_.at(sample);
      live.generated = live.base + (engine.clock - live.start_clock);
      live.paused = true;
      engine.paused_ids.insert(sample);
    }
    engine.running_ids.clear();
    engine.running = 0;
    engine.context = 0;
    engine.fraction = 0;
    engine.finishes = decltype(engine.finishes)();
    if (sync.pause == PauseMode::kAbort) {
      // Aborted: one report of every sample's tokens, then the engine forgets them (the
      // core's Dispatch after WeightsLoaded continues each from its tokens).
      GenerationPaused paused{.time = now, .engine = engine.id, .version = sync.version};
      for (const std::int64_t sample : engine.paused_ids) {
        paused.samples.push_back(
            SampleProgress{.sample = sample, .tokens = live_.at(sample).generated});
        live_.erase(sample);
      }
      engine.paused_ids.clear();
      Deliver(std::move(paused));
    } else {
      for (const std::int64_t sample : engine.paused_ids) {
        Deliver(GenerationProgressed{.time = now,
                                     .sample = sample,
                                     .tokens = live_.at(sample).generated,
                                     .engine = engine.id});
      }
    }
  }
  // Loading stalls decoding (without interrupt the core syncs idle engines, but a
  // busy one would simply pause). Loads queue one after another.
  engine.loading.push_back(sync.version);
  // Colocated: waking up (weights and KV cache back on the GPU) comes first.
  const double wake = engine.released ? config_.resume_seconds : 0.0;
  engine.released = false;
  engine.ready = std::max(engine.ready, now) + wake + config_.weight_sync_seconds;
  Push(engine.ready, Kind::kLoaded, engine.id, sync.version, engine.incarnation);
  MarkDirty(engine);
}

void Simulation::ExecuteResume(const Resume& resume, double now) {
  Engine& engine = EngineAt(resume.engine, "Resume");
  Advance(engine, now);
  FailIfPausing(engine, "Resume", now);
  for (const std::int64_t sample : resume.samples) {
    auto it = live_.find(sample);
    if (it == live_.end() || it->second.engine != engine.id || !it->second.paused) {
      Fail("core resumed sample " + std::to_string(sample) + ", which is not paused on engine " +
           std::to_string(engine.id) + ", at t=" + Num(now));
    }
    Live live = it->second;
    engine.paused_ids.erase(sample);
    live_.erase(it);
    live.base = live.generated;  // re-prefill prompt + generated tokens
    StartSample(engine, sample, live, now);
  }
  MarkDirty(engine);
}

void Simulation::ExecuteTrain(const StartTrain& train, double now) {
  if (trainer_busy_) {
    Fail("core started step " + std::to_string(train.step) + " while step " +
         std::to_string(train_step_) + " trains, at t=" + Num(now));
  }
  if (!train.plan.has_value()) {
    Fail("core started step " + std::to_string(train.step) + " without a plan, at t=" + Num(now));
  }
  const double seconds = static_cast<double>(train.plan->plan.predicted_step_time) *
                             config_.seconds_per_cost_unit * TrainerScale(config_) +
                         config_.train_call_overhead_seconds +
                         (train.call == 0 ? config_.trainer_offload_seconds : 0.0);
  if (train.call == 0) step_first_dispatch_ = now;
  for (const std::int64_t sample : train.samples) {
    auto it = first_dispatch_.find(sample);
    if (it != first_dispatch_.end()) {
      step_first_dispatch_ = std::min(step_first_dispatch_, it->second);
      first_dispatch_.erase(it);
    }
  }
  for (const std::int64_t group : train.groups) {
    group_epoch_.erase(group);
    rewards_.erase(group);
  }
  if (train.call + 1 == config_.orchestrator.train_calls_per_sync) {
    generation_seconds_ += now - step_first_dispatch_;
    train_count_ += 1;
  }
  train_seconds_ += seconds;
  trainer_busy_ = true;
  train_start_ = now;
  train_step_ = train.step;
  Push(now + seconds, Kind::kTrainDone, train.call, train.step);
}

void Simulation::ExecuteRelease(const Release& release, double now) {
  Engine& engine = EngineAt(release.engine, "Release");
  Advance(engine, now);
  if (!engine.running_ids.empty() || !engine.paused_ids.empty() || !engine.waiting_ids.empty() ||
      !engine.loading.empty()) {
    Fail("core released engine " + std::to_string(engine.id) + ", which is busy, at t=" + Num(now));
  }
  engine.released = true;
  trace_.Slice(1, engine.id, "release", now, now + config_.release_seconds);
  Push(now + config_.release_seconds, Kind::kReleased, engine.id, 0, engine.incarnation);
}

void Simulation::Execute(const Command& command, double now) {
  std::visit(
      [&](const auto& c) {
        using T = std::decay_t<decltype(c)>;
        if constexpr (std::is_same_v<T, Dispatch>) {
          ExecuteDispatch(c, now);
        } else if constexpr (std::is_same_v<T, Abort>) {
          ExecuteAbort(c, now);
        } else if constexpr (std::is_same_v<T, SyncWeights>) {
          ExecuteSync(c, now);
        } else if constexpr (std::is_same_v<T, Resume>) {
          ExecuteResume(c, now);
        } else if constexpr (std::is_same_v<T, Release>) {
          ExecuteRelease(c, now);
        } else {
          ExecuteTrain(c, now);
        }
      },
      command);
}

// Hands every pending event to the core, executing its commands at `now`.
void Simulation::Drain(double now) {
  std::vector<Command> commands;
  while (!pending_.empty()) {
    const Event event = std::move(pending_.front());
    pending_.pop_front();
    commands.clear();
    if (config_.check_invariants) Log(Describe(event));
    try {
      core_.Handle(event, commands);
    } catch (const std::exception& e) {
      Fail(std::string("core rejected ") + Describe(event) + ": " + e.what());
    }
    if (++events_ % kStopCheckEvents == 0 && should_stop_ && should_stop_()) {
      throw rlsched::Stopped("simulation stopped by its caller after " + std::to_string(events_) +
                             " events (t=" + Num(now_) + ", " +
                             std::to_string(core_.counters().steps_finished) + " steps)");
    }
    if (events_ > config_.max_events) {
      rlsched::Fail("max_events", "must be >= the events this simulation needs, got " +
                                      std::to_string(config_.max_events) +
                                      " (exceeded at t=" + Num(now_) + " after " +
                                      std::to_string(core_.counters().steps_finished) + " steps)");
    }
    if (config_.check_invariants) {
      for (const Command& command : commands) Log(Describe(command));
      try {
        core_.CheckInvariants();
      } catch (const std::exception& e) {
        Fail(std::string("invariant broken after ") + Describe(event) + ": " + e.what());
      }
    }
    for (const Command& command : commands) Execute(command, now);
  }
}

// Drains, keeps the core's prompt queue topped up, then reschedules the engines that
// changed. The top-up keeps at least ceil((1 + r)·P)·(min(s, 4) + 2) prompts queued
// (s: the mode's staleness), so admission is never starved for long.
void Simulation::Settle(double now) {
  Drain(now);
  const std::int64_t target = LiveGroupsPerBatch(config_.orchestrator) * (staleness_ahead_ + 2);
  for (int round = 0; round < 1'000'000; ++round) {
    const std::int64_t queued = fed_ - core_.counters().admitted_groups;
    if (queued >= target || core_.done()) break;
    PromptsAvailable available{.time = now, .prompts = {}};
    const std::int64_t count = 2 * target - queued;
    available.prompts.reserve(static_cast<std::size_t>(count));
    for (std::int64_t i = 0; i < count; ++i, ++fed_) {
      const std::int64_t id = fed_ % config_.dataset_prompts;
      available.prompts.push_back({.id = id, .prompt_tokens = workload_.PromptTokens(id)});
    }
    Deliver(std::move(available));
    Drain(now);
  }
  for (const std::int64_t id : dirty_) {
    Engine& engine = engines_[static_cast<std::size_t>(id)];
    engine.dirty = false;
    if (!engine.alive) continue;
    Advance(engine, now);
    Reschedule(engine, now);
    UpdateActivity(engine, now);
  }
  dirty_.clear();
}

SimulationReport Simulation::Run() {
  for (std::int64_t e = 0; e < config_.engines; ++e) JoinEngine(0.0, /*version=*/0, /*slot=*/-1);
  Settle(0.0);
  while (!core_.done()) {
    if (queue_.empty()) Stalled();
    const Happening h = queue_.top();
    queue_.pop();
    now_ = h.time;
    if (!Handle(h)) continue;  // stale
    Settle(now_);
  }
  const double end = now_;
  for (Engine& engine : engines_) {
    if (engine.alive) {
      engine.loading.clear();
      engine.running_ids.clear();
      engine.paused_ids.clear();
      engine.waiting_ids.clear();
      UpdateActivity(engine, end);
    }
  }
  return Report(end);
}

void Simulation::Stalled() const {
  const Counters& c = core_.counters();
  Fail("simulation stalled at t=" + Num(now_) + ": no event remains; steps finished " +
       std::to_string(c.steps_finished) + " of " + std::to_string(config_.steps) + ", admitted " +
       std::to_string(c.admitted) + ", queued " + std::to_string(c.queued) + ", in flight " +
       std::to_string(c.in_flight) + ", buffered " + std::to_string(c.buffered) + ", filtered " +
       std::to_string(c.filtered));
}

bool Simulation::Handle(const Happening& h) {
  switch (h.kind) {
    case Kind::kTick: {
      Engine& engine = engines_[static_cast<std::size_t>(h.engine)];
      if (!engine.alive || engine.tick_version != h.a) return false;
      OnTick(engine, now_);
      return true;
    }
    case Kind::kLoaded: {
      Engine& engine = engines_[static_cast<std::size_t>(h.engine)];
      if (!engine.alive || engine.incarnation != h.incarnation) return false;
      Advance(engine, now_);
      engine.loading.pop_front();
      engine.version = h.a;
      MarkDirty(engine);
      Deliver(WeightsLoaded{.time = now_, .engine = engine.id, .version = h.a});
      return true;
    }
    case Kind::kTrainDone:
      trainer_busy_ = false;
      trace_.Slice(
          2, 0,
          "step " + std::to_string(h.a) +
              (config_.orchestrator.train_calls_per_sync > 1 ? " call " + std::to_string(h.engine)
                                                             : std::string()),
          train_start_, now_);
      Deliver(TrainStepFinished{.time = now_, .step = h.a, .call = h.engine});
      return true;
    case Kind::kReleased: {
      Engine& engine = engines_[static_cast<std::size_t>(h.engine)];
      if (!engine.alive || engine.incarnation != h.incarnation) return false;
      Deliver(EngineReleased{.time = now_, .engine = engine.id});
      return true;
    }
    case Kind::kFail:
      FailEngine(engines_[static_cast<std::size_t>(h.engine)]);
      return true;
    case Kind::kJoin:
      // A replacement holds no weights: the core syncs it first.
      JoinEngine(now_, /*version=*/-1, /*slot=*/h.engine);
      return true;
  }
  return true;
}

void Simulation::FailEngine(Engine& engine) {
  Advance(engine, now_);
  for (const std::int64_t sample : engine.running_ids) live_.erase(sample);
  for (const std::int64_t sample : engine.paused_ids) live_.erase(sample);
  for (const std::int64_t sample : engine.waiting_ids) live_.erase(sample);
  engine.running_ids.clear();
  engine.paused_ids.clear();
  engine.waiting_ids.clear();
  engine.finishes = decltype(engine.finishes)();
  engine.running = 0;
  engine.loading.clear();
  UpdateActivity(engine, now_);
  engine.alive = false;
  trace_.Instant(1, engine.id, "failed", now_);
  Deliver(EngineFailed{.time = now_, .engine = engine.id});
  Push(now_ + config_.rejoin_seconds, Kind::kJoin, engine.id);
}

SimulationReport Simulation::Report(double end) {
  SimulationReport report;
  report.metrics = core_.metrics(end);
  report.counters = core_.counters();
  report.events = events_;
  report.preemptions = preemptions_;
  if (train_count_ > 0) {  // per step (all its calls)
    report.mean_generation_seconds = generation_seconds_ / static_cast<double>(train_count_);
    report.mean_train_seconds = train_seconds_ / static_cast<double>(train_count_);
  }
  // The ideal bound. Engines: every engine full (N = max_concurrent, or the mean
  // contexts the KV cache holds when fewer), a running sample's mean context = prompt +
  // E[L²] / (2·E[L]) (a sample seen at a random moment is length-biased and half done),
  // so N samples take E[L] decode steps plus their prefill.
  const auto [mean_length, mean_square] = workload_.Moments();
  const EngineModel& model = config_.engine;
  const double context = workload_.MeanPromptTokens() + mean_square / (2.0 * mean_length);
  auto n = static_cast<double>(model.max_concurrent);
  if (model.kv_cache_tokens > 0) {  // as many mean contexts as the cache holds
    n = std::clamp(std::floor(static_cast<double>(model.kv_cache_tokens) / context), 1.0, n);
  }
  const double step = model.decode_base_seconds + model.decode_per_sequence_seconds * n +
                      model.decode_per_context_token_seconds * n * context;
  const double per_engine_seconds =
      step * mean_length + n * workload_.MeanPromptTokens() / model.prefill_tokens_per_second;
  report.engine_capacity_samples_per_second =
      static_cast<double>(config_.engines) * n / per_engine_seconds;
  if (report.mean_train_seconds > 0) {
    report.trainer_capacity_samples_per_second =
        static_cast<double>(config_.orchestrator.prompts_per_step *
                            config_.orchestrator.samples_per_prompt) /
        report.mean_train_seconds;
  } else {
    report.trainer_capacity_samples_per_second = std::numeric_limits<double>::infinity();
  }
  report.ideal_samples_per_second = std::min(report.engine_capacity_samples_per_second,
                                             report.trainer_capacity_samples_per_second);
  if (config_.orchestrator.colocated) {  // the two alternate on the same GPUs
    report.ideal_samples_per_second = 1.0 / (1.0 / report.engine_capacity_samples_per_second +
                                             1.0 / report.trainer_capacity_samples_per_second);
  }
  report.trace_json = trace_.Json();
  return report;
}

}  // namespace

// Defaults: a 7-8B model (Llama-3.1-8B shape) served by vLLM, one GPU per engine.
// Engine constants, orders of magnitude (not measurements):
//   decode_base 0.02 s   a decode step at small batch: the weights (16 GB in bf16)
//                        read once per step at ~2-3 TB/s, plus scheduling/launch
//                        overheads → 10-25 ms inter-token latency;
//   per sequence 1e-4 s  sampling, per-request bookkeeping and the batch's compute
//                        (256 sequences add ~25 ms);
//   per context 3e-8 s   reading the KV cache: 128 KiB per token (32 layers × 8 KV
//                        heads × 128 × K,V × bf16) at ~4 TB/s;
//   prefill 2e4 tok/s    a compute-bound forward pass of ~16 GFLOP per token at a
//                        few hundred TFLOP/s effective.
// seconds_per_cost_unit is calibrated (by running this simulator, sync mode, the
// default workload, seed 1, 10 steps) so that the mean generation time of a sync step
// equals its mean training time; the sync step is bound by its longest responses
// (up to 16k tokens at ~20 ms each), so the trainer here is slower than a real
// 64-GPU trainer would be: the point is the balanced operating point the issue asks
// for. Cost units are the attention model's (the linear work of one token).
SimulatorConfig DefaultSimulatorConfig() {
  SimulatorConfig config;
  config.orchestrator.prompts_per_step = 512;
  config.orchestrator.samples_per_prompt = 8;
  config.steps = 10;
  config.engines = 64;
  config.engine.max_concurrent = 256;
  config.engine.prefill_tokens_per_second = 2e4;
  config.engine.decode_base_seconds = 0.02;
  config.engine.decode_per_sequence_seconds = 1e-4;
  config.engine.decode_per_context_token_seconds = 3e-8;
  config.step.num_ranks = 64;
  config.step.micro_batch.max_tokens_per_micro_batch = 32768;
  // p = 1: the trainer model needs no pipeline here; the plan's 1F1B formula applies
  // unchanged when a user sets pipeline stages.
  config.step.micro_batch.pipeline_stages = 1;
  config.step.micro_batch.cost = balance::CostModel::Attention(balance::ModelShape{});
  config.seconds_per_cost_unit = 3.81e-3;
  config.weight_sync_seconds = 1.0;
  config.dataset_prompts = 2048;
  return config;
}

namespace {

// The cluster and the costs: engines, trainer, their speeds, the budget.
void ValidateCluster(const SimulatorConfig& config) {
  CheckBetween("steps", config.steps, 1, kMaxSteps);
  CheckBetween("engines", config.engines, 1, kMaxEngines);
  const EngineModel& engine = config.engine;
  CheckBetween("engine.max_concurrent", engine.max_concurrent, 1, kMaxSimulatedConcurrent);
  CheckReal("engine.prefill_tokens_per_second", engine.prefill_tokens_per_second, 0, End::kOpen,
            1e15);
  CheckReal("engine.decode_base_seconds", engine.decode_base_seconds, 0, End::kClosed, kMaxSeconds);
  CheckReal("engine.decode_per_sequence_seconds", engine.decode_per_sequence_seconds, 0,
            End::kClosed, kMaxSeconds);
  CheckReal("engine.decode_per_context_token_seconds", engine.decode_per_context_token_seconds, 0,
            End::kClosed, kMaxSeconds);
  if (!(engine.decode_base_seconds + engine.decode_per_sequence_seconds > 0)) {
    rlsched::Fail("engine.decode_base_seconds",
                  "decode_base_seconds + decode_per_sequence_seconds must be "
                  "> 0 (a decode step must take time), got 0");
  }
  CheckBetween("step.num_ranks", config.step.num_ranks, 1, balance::kMaxParts);
  CheckBetween("gpus_per_engine", config.gpus_per_engine, 1, kMaxGpusPerUnit);
  CheckBetween("gpus_per_trainer_rank", config.gpus_per_trainer_rank, 1, kMaxGpusPerUnit);
  CheckReal("seconds_per_cost_unit", config.seconds_per_cost_unit, 0, End::kOpen, kMaxSeconds);
  CheckReal("weight_sync_seconds", config.weight_sync_seconds, 0, End::kClosed, kMaxSeconds);
  CheckReal("train_call_overhead_seconds", config.train_call_overhead_seconds, 0, End::kClosed,
            kMaxSeconds);
  CheckReal("release_seconds", config.release_seconds, 0, End::kClosed, kMaxSeconds);
  CheckReal("trainer_scaling_exponent", config.trainer_scaling_exponent, 0, End::kOpen, 2);
  CheckBetween("trainer_reference_ranks", config.trainer_reference_ranks, 0, balance::kMaxParts);
  CheckReal("trainer_offload_seconds", config.trainer_offload_seconds, 0, End::kClosed,
            kMaxSeconds);
  CheckBetween("engine.kv_cache_tokens", config.engine.kv_cache_tokens, 0,
               {std::int64_t{1} << 40, "2^40"});
  CheckReal("resume_seconds", config.resume_seconds, 0, End::kClosed, kMaxSeconds);
  CheckBetween("dataset_prompts", config.dataset_prompts, 1, kMaxDatasetPrompts);
  CheckBetween("max_events", config.max_events, 1, std::numeric_limits<std::int64_t>::max());
}

// The response and prompt lengths, and the rewards' draws; the longest response.
std::int64_t ValidateWorkload(const SimulatorConfig& config) {
  const LengthDistribution& lengths = config.lengths;
  std::int64_t longest = 0;
  if (lengths.lengths.empty()) {
    CheckReal("lengths.mu", lengths.mu, -100, End::kClosed, 100);
    CheckReal("lengths.sigma", lengths.sigma, 0, End::kClosed, 20);
    CheckBetween("lengths.max_tokens", lengths.max_tokens, 1, kMaxTokens);
    longest = lengths.max_tokens;
  } else {
    CheckBetween("lengths.lengths.size()", static_cast<std::int64_t>(lengths.lengths.size()), 1,
                 kMaxLengthsList);
    for (std::size_t i = 0; i < lengths.lengths.size(); ++i) {
      CheckBetween({"lengths.lengths", i}, lengths.lengths[i], 1, kMaxTokens);
      longest = std::max(longest, lengths.lengths[i]);
    }
  }
  CheckBetween("lengths.min_prompt_tokens", lengths.min_prompt_tokens, 0, kMaxTokens);
  CheckBetween("lengths.max_prompt_tokens", lengths.max_prompt_tokens, lengths.min_prompt_tokens,
               kMaxTokens);
  CheckReal("lengths.length_correlation", lengths.length_correlation, 0, End::kClosed, 1);
  CheckReal("all_equal_rate", config.all_equal_rate, 0, End::kClosed, 1);
  CheckReal("engine_mtbf_seconds", config.engine_mtbf_seconds, 0, End::kClosed, kMaxSeconds);
  CheckReal("rejoin_seconds", config.rejoin_seconds, 0, End::kClosed, kMaxSeconds);
  return longest;
}

// The orchestrator as the simulation runs it, against the workload's longest response.
void ValidateOrchestrator(const SimulatorConfig& config, std::int64_t longest) {
  try {
    Validate(CoreOptions(config));
  } catch (const rlsched::FieldError& e) {
    throw e.Within("orchestrator");
  }
  const OrchestratorPolicy& core = config.orchestrator;
  if (core.max_response_tokens > 0 && core.max_response_tokens < longest) {
    rlsched::FailBound("orchestrator.max_response_tokens",
                       "0 or >= the workload's longest response (" + std::to_string(longest) + ")",
                       std::to_string(core.max_response_tokens));
  }
  const double per_step =
      std::ceil((1.0 + core.oversample) * static_cast<double>(core.prompts_per_step)) *
      static_cast<double>(core.samples_per_prompt);
  if (!(per_step <= static_cast<double>(kMaxSamplesPerStep))) {
    rlsched::Fail("orchestrator.prompts_per_step",
                  "ceil((1 + oversample)·prompts_per_step)·"
                  "samples_per_prompt must be <= " +
                      std::to_string(kMaxSamplesPerStep) + ", got " + Num(per_step));
  }
  if (config.filter_all_equal) {
    if (core.samples_per_prompt < 2) {
      rlsched::Fail("orchestrator.samples_per_prompt",
                    "must be >= 2 with filter_all_equal (a group of one "
                    "is always all-equal and dropped), got " +
                        std::to_string(core.samples_per_prompt));
    }
    if (!(config.all_equal_rate < 1)) {
      rlsched::Fail("all_equal_rate",
                    "must be < 1 with filter_all_equal (every group would be dropped), "
                    "got " +
                        Num(config.all_equal_rate));
    }
    if (!(config.all_equal_rate > 0)) {
      rlsched::Fail("filter_all_equal",
                    "must be false with all_equal_rate 0 (no group's rewards are all "
                    "equal, so the filter would drop nothing), got true");
    }
  }
}

// The step options, by planning the longest possible sequence alone.
void ValidateStep(const SimulatorConfig& config, std::int64_t longest) {
  const LengthDistribution& lengths = config.lengths;
  const balance::StepOptions& step = config.step;
  const std::int64_t longest_sequence = lengths.max_prompt_tokens + longest;
  const std::int64_t cap = step.micro_batch.max_tokens_per_micro_batch;
  const std::int64_t pad = std::max<std::int64_t>(step.micro_batch.pad_to_multiple_of, 1);
  const std::int64_t padded = (longest_sequence + pad - 1) / pad * pad;
  if (cap >= 1 && padded > cap) {
    rlsched::Fail("step.micro_batch.max_tokens_per_micro_batch",
                  "must be >= the longest sequence, "
                  "lengths.max_prompt_tokens + the longest response (padded: " +
                      std::to_string(padded) + "), got " + std::to_string(cap));
  }
  try {
    const std::int64_t one[] = {std::max<std::int64_t>(longest_sequence, 1)};
    const std::int64_t group[] = {0};
    (void)balance::PlanStep(one, group, step);
  } catch (const rlsched::FieldError& e) {
    throw e.Within("step");
  }
}

}  // namespace

void Validate(const SimulatorConfig& config) {
  ValidateCluster(config);
  const std::int64_t longest = ValidateWorkload(config);
  ValidateOrchestrator(config, longest);
  ValidateStep(config, longest);
}

void CheckWorkBudget(const SimulatorConfig& config) {
  const double attempts = EstimatedSampleAttempts(config);
  if (!(attempts <= static_cast<double>(config.max_events))) {
    const double samples = static_cast<double>(config.steps) *
                           static_cast<double>(config.orchestrator.prompts_per_step) *
                           static_cast<double>(config.orchestrator.samples_per_prompt);
    if (config.engine_mtbf_seconds > 0 && samples <= static_cast<double>(config.max_events)) {
      rlsched::Fail(
          "engine_mtbf_seconds",
          "too short for this workload: engine failures every " + Num(config.engine_mtbf_seconds) +
              " s on average restart each sample about " + Num(attempts / samples) +
              " times (a response of L tokens runs at least L·" +
              Num(config.engine.decode_base_seconds + config.engine.decode_per_sequence_seconds) +
              " s), so the run needs about " + Num(attempts) +
              " sample attempts, above the work budget max_events = " +
              std::to_string(config.max_events) +
              "; raise engine_mtbf_seconds or max_events, or keep partial work on "
              "failure (orchestrator.keep_partial_on_failure)");
    }
    rlsched::Fail("max_events",
                  "must be >= the run's estimated sample attempts (steps · "
                  "prompts_per_step · samples_per_prompt = " +
                      Num(samples) + " samples, " + Num(attempts) + " attempts), got " +
                      std::to_string(config.max_events));
  }
}

double EstimatedSampleAttempts(const SimulatorConfig& config) {
  const OrchestratorPolicy& core = config.orchestrator;
  const double samples = static_cast<double>(config.steps) *
                         static_cast<double>(core.prompts_per_step) *
                         static_cast<double>(core.samples_per_prompt);
  const double mtbf = config.engine_mtbf_seconds;
  if (!(mtbf > 0)) return samples;
  const double seconds_per_token =
      config.engine.decode_base_seconds + config.engine.decode_per_sequence_seconds;
  auto attempts = [&](double tokens) {
    const double x = tokens * seconds_per_token / mtbf;
    return core.keep_partial_on_failure ? 1.0 + x : std::exp(x);
  };
  const LengthDistribution& lengths = config.lengths;
  double mean = 0;
  if (!lengths.lengths.empty()) {
    for (const std::int64_t length : lengths.lengths) mean += attempts(static_cast<double>(length));
    mean /= static_cast<double>(lengths.lengths.size());
  } else {
    // E over L = clip(round(exp(μ + σ·z)), 1, max_tokens), z ~ N(0, 1): the midpoint
    // rule on [−8, 8] (the mass outside is below 1e-15).
    constexpr int kPoints = 1600;
    constexpr double kWidth = 16.0 / kPoints;
    double weight = 0;
    for (int i = 0; i < kPoints; ++i) {
      const double z = -8.0 + (i + 0.5) * kWidth;
      const double w = std::exp(-0.5 * z * z);
      const double length = std::clamp(std::round(std::exp(lengths.mu + lengths.sigma * z)), 1.0,
                                       static_cast<double>(lengths.max_tokens));
      mean += w * attempts(length);
      weight += w;
    }
    mean /= weight;
  }
  return samples * mean;
}

void SetDecodeSpeed(EngineModel& model, const DecodeSpeed& speed) {
  CheckBetween("engine.max_concurrent", model.max_concurrent, 1, kMaxSimulatedConcurrent);
  CheckReal("single_tokens_per_second", speed.single_tokens_per_second, 0, End::kOpen, 1e12);
  const auto n = static_cast<double>(model.max_concurrent);
  const double single = speed.single_tokens_per_second;
  const double full = speed.full_tokens_per_second;
  if (!std::isfinite(full) || full < single * (1 - 1e-12) || full > n * single * (1 + 1e-12)) {
    rlsched::Fail("full_tokens_per_second",
                  "must be in [single_tokens_per_second, max_concurrent · "
                  "single_tokens_per_second] = [" +
                      Num(single) + ", " + Num(n * single) + "] (max_concurrent " +
                      std::to_string(model.max_concurrent) + "), got " + Num(full));
  }
  double per_sequence = 0;
  if (model.max_concurrent > 1) {
    per_sequence = std::max(0.0, (n / full - 1.0 / single) / (n - 1.0));
  }
  model.decode_per_sequence_seconds = per_sequence;
  model.decode_base_seconds = std::max(0.0, 1.0 / single - per_sequence);
}

DecodeSpeed DecodeSpeedOf(const EngineModel& model) {
  const auto n = static_cast<double>(model.max_concurrent);
  const double alone = model.decode_base_seconds + model.decode_per_sequence_seconds;
  const double together = model.decode_base_seconds + model.decode_per_sequence_seconds * n;
  return {.single_tokens_per_second = alone > 0 ? 1.0 / alone : 0.0,
          .full_tokens_per_second = together > 0 ? n / together : 0.0};
}

std::int64_t WorkloadPromptTokens(const SimulatorConfig& config, std::int64_t prompt) {
  return Workload::PromptTokensOf(config.seed, config.lengths, prompt);
}

std::int64_t WorkloadResponseLength(const SimulatorConfig& config, std::int64_t prompt,
                                    std::int64_t epoch, std::int64_t index) {
  return Workload(config).ResponseLength(prompt, epoch, index);
}

std::vector<double> WorkloadGroupRewards(const SimulatorConfig& config, std::int64_t group) {
  SimulatorConfig rewards_only;  // the rewards read neither the lengths nor the rest
  rewards_only.seed = config.seed;
  rewards_only.orchestrator.samples_per_prompt = config.orchestrator.samples_per_prompt;
  rewards_only.all_equal_rate = config.all_equal_rate;
  return Workload(rewards_only).GroupRewards(group);
}

double CostUnitForStepSeconds(const SimulatorConfig& config, double seconds) {
  SimulatorConfig probe = config;
  probe.seconds_per_cost_unit = 1;
  Validate(probe);
  // The seconds are the trainer's at its reference ranks (where its scale is 1).
  if (probe.trainer_reference_ranks > 0) probe.step.num_ranks = probe.trainer_reference_ranks;
  const OrchestratorPolicy& core = config.orchestrator;
  const std::int64_t calls = core.train_calls_per_sync;
  const double overheads = static_cast<double>(calls) * config.train_call_overhead_seconds +
                           config.trainer_offload_seconds;
  if (!std::isfinite(seconds) || !(seconds > overheads) || seconds > kMaxSeconds) {
    rlsched::Fail("seconds", "the trainer's seconds per step must be in (" + Num(overheads) + ", " +
                                 Num(kMaxSeconds) +
                                 "] (above the calls' overheads and the offload), got " +
                                 Num(seconds));
  }
  const Workload workload(config);
  const balance::StepOptions& step = probe.step;
  const std::int64_t per_call = core.prompts_per_step / calls;
  double cost = 0;
  std::int64_t group = 0;
  for (int b = 0; b < kCalibrationBatches; ++b) {
    for (std::int64_t c = 0; c < calls; ++c) {
      std::vector<std::int64_t> lengths;
      std::vector<std::int64_t> groups;
      for (std::int64_t i = 0; i < per_call; ++i, ++group) {
        const std::int64_t prompt = group % config.dataset_prompts;
        const std::int64_t epoch = group / config.dataset_prompts;
        const std::int64_t prompt_tokens = workload.PromptTokens(prompt);
        for (std::int64_t j = 0; j < core.samples_per_prompt; ++j) {
          lengths.push_back(prompt_tokens + workload.ResponseLength(prompt, epoch, j));
          groups.push_back(i);
        }
      }
      cost +=
          static_cast<double>(balance::PlanStep(lengths, groups, step).plan.predicted_step_time);
    }
  }
  cost /= kCalibrationBatches;
  return (seconds - overheads) / (cost * TrainerScale(probe));
}

std::optional<SimulatorConfig> ColocatedBaseline(const SimulatorConfig& config) {
  const std::int64_t gpus = config.engines * config.gpus_per_engine +
                            config.step.num_ranks * config.gpus_per_trainer_rank;
  if (gpus % config.gpus_per_engine != 0 || gpus % config.gpus_per_trainer_rank != 0) {
    return std::nullopt;
  }
  SimulatorConfig colocated = config;
  // The trainer's scaling stays measured from the config's ranks.
  if (colocated.trainer_reference_ranks == 0) {
    colocated.trainer_reference_ranks = config.step.num_ranks;
  }
  colocated.engines = gpus / config.gpus_per_engine;
  colocated.step.num_ranks = gpus / config.gpus_per_trainer_rank;
  OrchestratorPolicy& core = colocated.orchestrator;
  core.mode = Mode::kSync;
  core.colocated = true;
  core.staleness_policy = StalenessPolicy::kAdmission;
  core.staleness_fraction = 0;
  core.pause_mode = PauseMode::kKeep;  // sync pauses nothing
  return colocated;
}

SimulationReport Simulate(const SimulatorConfig& config, const StopCheck& should_stop) {
  Validate(config);
  CheckWorkBudget(config);
  Simulation simulation(config, should_stop);
  return simulation.Run();
}

}  // namespace rlsched::scheduler
