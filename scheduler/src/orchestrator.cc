// The orchestrator's decision core (see rlsched/scheduler/orchestrator.h).
//
// State layout: samples and groups live in vectors indexed by id (ids are dense and
// never reused); ordered sets give every choice a deterministic order:
//   queue         queued samples by (target batch, − predicted remaining, id);
//   by_version    samples by the oldest version of their tokens (lazily: an entry
//                 whose sample has moved on is skipped), so that the samples about to
//                 break the staleness bound are found without a scan;
//   complete      complete live groups by (oldest version, id): the next batch's
//                 candidates, oldest first;
//   live_by_target  live groups per target batch (admission quotas, carry-over);
//   ready         engines taking work by (outstanding predicted tokens, id).

#include "rlsched/scheduler/orchestrator.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <limits>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "rlsched/common/check.h"
#include "rlsched/common/error.h"

namespace rlsched::scheduler {
namespace {

constexpr std::int64_t kMaxGroupSize = 1 << 20;
constexpr std::int64_t kMaxPrompts = 100'000'000;
constexpr std::int64_t kMaxTokens = std::int64_t{1} << 40;
// Colocated: what Release frees, and what the sync that wakes the engine takes back, in
// this order (the weights' memory before the load, the KV cache after).
const std::vector<MemoryTag> kReleasedMemory = {MemoryTag::kWeights, MemoryTag::kKvCache};

[[noreturn]] void Invalid(const std::string& field, const std::string& bound,
                          const std::string& got) {
  rlsched::FailBound(field, bound, got);
}

std::string Str(std::int64_t v) { return std::to_string(v); }
std::string Str(double v) { return std::to_string(v); }

enum class SampleState { kQueued, kInFlight, kComplete, kClosed, kTrained, kFiltered };
enum class GroupState { kLive, kClosed, kTrained, kFiltered };

struct Sample {
  SampleState state = SampleState::kQueued;
  std::int64_t engine = -1;        // while in flight
  std::int64_t slot = -1;          // its index in the engine's in_flight
  std::int64_t tokens = 0;         // response tokens generated (kept)
  std::int64_t oldest = -1;        // oldest version of its tokens; -1: none yet
  std::int64_t remaining = 0;      // predicted remaining tokens, as keyed in the queue / engine
  std::int64_t predicted = 0;      // predicted total response tokens
  bool interrupted = false;        // paused by SyncWeights{interrupt}
  bool progress_reported = false;  // a progress report since the interruption
  double reward = 0;
  std::vector<VersionSpan> spans;
  // Its last Dispatch: the tokens it resumed from and the engine's version then (the
  // bounds of the engine's account of its tokens' versions, EngineSpans).
  std::int64_t dispatched_from = 0;
  std::int64_t dispatched_version = 0;
  // Its first dispatch (-1: not yet) and its last finish: the step's generation window.
  double first_dispatch = -1;
  double finished = 0;
};

struct Group {
  std::int64_t prompt = 0;
  std::int64_t prompt_tokens = 0;
  std::int64_t target = 0;        // the batch it is meant for
  std::int64_t admitted_for = 0;  // the batch it was admitted for
  std::int64_t complete = 0;
  std::int64_t oldest = -1;  // min over its samples' oldest (>= 0 ones); -1: none
  GroupState state = GroupState::kLive;
  std::int64_t indexed_oldest = -1;  // its key in State::unfinished; -1: not there
  bool generating = false;  // a sample dispatched, not all complete (max_generating_groups)
};

struct Engine {
  std::int64_t id = 0;
  bool alive = false;
  std::int64_t max_concurrent = 1;
  std::int64_t version = -1;
  std::int64_t syncing_to = -1;  // the version being loaded; -1: none
  bool releasing = false;        // colocated: Release sent, EngineReleased not yet
  bool released = false;         // colocated: asleep until the next SyncWeights
  bool pausing = false;          // SyncWeights{interrupt} sent, GenerationPaused not yet
  double sync_started = 0;
  std::vector<std::int64_t> in_flight;           // samples, including interrupted ones (any order)
  std::multiset<std::int64_t> in_flight_oldest;  // their oldest versions (wait_for_oldest)
  std::int64_t outstanding = 0;                  // predicted remaining tokens in flight
  // Accounting for the idle ratio.
  double alive_since = 0;
  double alive_total = 0;  // closed alive intervals
  double busy_total = 0;   // closed busy intervals
  bool busy = false;
  double busy_since = 0;
  // Its key in State::ready while it takes work; -1: not there.
  std::int64_t ready_outstanding = -1;
  std::int64_t ready_version = -1;
  std::int64_t pass_count = 0;  // samples given in the current dispatch pass
  std::int64_t pass_work = 0;   // and their predicted tokens
};

// The per-step times of Metrics, summed as steps finish. O(1) memory.
class StepTimes {
 public:
  void StartStep() {
    first_dispatch_ = std::numeric_limits<double>::infinity();
    last_finish_ = -first_dispatch_;
    training_ = 0;
  }
  void AddSample(double first_dispatch, double finished) {
    first_dispatch_ = std::min(first_dispatch_, first_dispatch);
    last_finish_ = std::max(last_finish_, finished);
  }
  void AddTraining(double seconds) { training_ += seconds; }
  // Step `step` (0-based) finished at `now`; the run started at `start`.
  void FinishStep(double now, double start, std::int64_t step, bool sync,
                  std::int64_t warmup_steps) {
    const double generation = std::max(0.0, last_finish_ - first_dispatch_);
    const double step_seconds = now - (step == 0 ? start : last_step_end_);
    const double switching = sync ? std::max(0.0, step_seconds - generation - training_) : 0.0;
    all_.Add(generation, training_, switching);
    if (step >= warmup_steps) steady_.Add(generation, training_, switching);
    if (step == 0 && warmup_steps == 0) warmup_end_ = start;
    if (step + 1 == warmup_steps) warmup_end_ = now;
    last_step_end_ = now;
  }
  // Means over the steps past the warm-up, or over all when none is.
  void Fill(std::int64_t steps, std::int64_t warmup_steps, Metrics& m) const {
    const Sums& sums = steps > warmup_steps ? steady_ : all_;
    m.generation_seconds_per_step = sums.generation / sums.steps;
    m.train_seconds_per_step = sums.training / sums.steps;
    m.switch_seconds_per_step = sums.switching / sums.steps;
    if (steps > warmup_steps) {
      m.steady_seconds_per_step =
          (last_step_end_ - warmup_end_) / static_cast<double>(steps - warmup_steps);
    }
  }

 private:
  struct Sums {
    void Add(double g, double t, double s) {
      generation += g;
      training += t;
      switching += s;
      steps += 1;
    }
    double generation = 0, training = 0, switching = 0, steps = 0;
  };
  double first_dispatch_ = 0, last_finish_ = 0, training_ = 0;  // the step in training
  Sums all_, steady_;                                           // over finished steps
  double warmup_end_ = 0, last_step_end_ = 0;
};

struct ClosedBatch {  // one trainer call's groups
  std::int64_t step = 0;
  std::int64_t call = 0;
  std::vector<std::int64_t> groups;
};

// Running quantile of finished response lengths over log-spaced buckets (16 per
// octave), refreshed after every ~1% more lengths so that a query is O(1).
class LengthHistogram {
 public:
  void Add(std::int64_t tokens) {
    const std::size_t b = Bucket(tokens);
    if (b >= counts_.size()) counts_.resize(b + 1, 0);
    ++counts_[b];
    ++total_;
  }
  std::int64_t total() const { return total_; }
  std::int64_t Quantile(double q) {
    if (total_ != refreshed_at_ && (total_ - refreshed_at_) * 100 >= refreshed_at_) {
      const double want = q * static_cast<double>(total_);
      std::int64_t seen = 0;
      std::size_t b = 0;
      for (; b < counts_.size(); ++b) {
        seen += counts_[b];
        if (static_cast<double>(seen) >= want) break;
      }
      cached_ = Upper(std::min(b, counts_.size() - 1));
      refreshed_at_ = total_;
    }
    return cached_;
  }

 private:
  static std::size_t Bucket(std::int64_t tokens) {
    if (tokens <= 1) return 0;
    return static_cast<std::size_t>(std::ceil(std::log2(static_cast<double>(tokens)) * 16.0));
  }
  static std::int64_t Upper(std::size_t bucket) {
    return std::max<std::int64_t>(1, std::llround(std::exp2(static_cast<double>(bucket) / 16.0)));
  }
  std::vector<std::int64_t> counts_;
  std::int64_t total_ = 0;
  std::int64_t refreshed_at_ = 0;
  std::int64_t cached_ = 1;
};

using QueueKey = std::tuple<std::int64_t, std::int64_t, std::int64_t>;  // target, −rem, id

}  // namespace

bool KeepUnlessAllEqual(std::span<const double> rewards) {
  for (const double r : rewards) {
    if (r != rewards.front()) return true;
  }
  return false;
}

std::int64_t EffectiveStaleness(const OrchestratorPolicy& options) {
  switch (options.mode) {
    case Mode::kSync:
      return 0;
    case Mode::kOneStepOff:
      return 1;
    case Mode::kAsync:
      if (options.staleness_policy == StalenessPolicy::kFraction) {
        return static_cast<std::int64_t>(std::ceil(options.staleness_fraction - 1e-9));
      }
      return options.max_staleness;
  }
  return 0;
}

void Validate(const OrchestratorOptions& o) {
  CheckInRange("max_staleness", o.max_staleness, 0, 1'000'000);
  CheckRealInRange("oversample", o.oversample, 0, End::kClosed, 100, End::kClosed);
  CheckInRange("prompts_per_step", o.prompts_per_step, 1, kMaxPrompts);
  CheckInRange("samples_per_prompt", o.samples_per_prompt, 1, kMaxGroupSize);
  if (o.prompts_per_step * o.samples_per_prompt > kMaxPrompts) {
    Invalid("samples_per_prompt",
            "<= " + Str(kMaxPrompts / o.prompts_per_step) + " (at most " + Str(kMaxPrompts) +
                " samples per step with prompts_per_step = " + Str(o.prompts_per_step) + ")",
            Str(o.samples_per_prompt));
  }
  CheckAtLeast("num_steps", o.num_steps, 0);
  CheckRealInRange("staleness_fraction", o.staleness_fraction, 0, End::kClosed, 1e6, End::kClosed);
  if (o.staleness_fraction != 0 &&
      (o.mode != Mode::kAsync || o.staleness_policy != StalenessPolicy::kFraction)) {
    Invalid("staleness_fraction", "0 unless mode is async with staleness_policy fraction",
            Str(o.staleness_fraction));
  }
  if (o.train_calls_per_sync < 1 || o.train_calls_per_sync > o.prompts_per_step ||
      o.prompts_per_step % o.train_calls_per_sync != 0) {
    Invalid("train_calls_per_sync",
            "a divisor of prompts_per_step = " + Str(o.prompts_per_step) + " (each call trains " +
                "prompts_per_step / train_calls_per_sync groups)",
            Str(o.train_calls_per_sync));
  }
  if (o.colocated && o.mode != Mode::kSync) {
    Invalid("colocated", "false unless mode is sync (engines and trainer alternate)", "true");
  }
  if (o.pause_mode != PauseMode::kKeep && (o.mode != Mode::kAsync || !o.partial_rollout)) {
    Invalid("pause_mode", "keep unless mode is async with partial_rollout (nothing is interrupted)",
            "abort");
  }
  CheckAtLeast("max_generating_groups", o.max_generating_groups, 0);
  CheckInRange("warmup_steps", o.warmup_steps, 0, 1'000'000);
  CheckRealInRange("length_quantile", o.length_quantile, 0, End::kOpen, 1, End::kClosed);
  CheckInRange("initial_prediction", o.initial_prediction, 1, kMaxTokens);
  CheckInRange("max_response_tokens", o.max_response_tokens, 0, kMaxTokens);
}

struct Orchestrator::State {
  OrchestratorOptions options;
  std::int64_t P = 1, G = 1, s = 0, quota = 1;
  // The places of the furthest batch generation may run ahead to (fraction: a share
  // of quota; else quota).
  std::int64_t last_quota = 1;
  std::int64_t k = 1;         // trainer calls per step (streaming)
  std::int64_t per_call = 1;  // groups per call, P / k
  bool boundary_sync = true;  // sync / one_step_off: engines sync when out of work
  bool one_batch_at_a_time = false;
  bool strict = true;  // every trained token within s (else: the admission policy)
  // Async strict without over-sampling: a batch waits for a running group whose tokens
  // it would otherwise make too stale, instead of closing with younger groups and
  // discarding it (the oldest are never preempted for younger ones).
  bool wait_for_oldest = false;

  bool started = false;
  double first_time = 0;
  double now = 0;

  std::deque<Prompt> prompts;
  std::vector<Sample> samples;
  std::vector<Group> groups;
  std::map<std::int64_t, Engine> engines;

  std::set<QueueKey> queue;
  // max_generating_groups: the queued samples of generating groups (also in `queue`),
  // and the number of generating groups.
  std::set<QueueKey> generating_queue;
  std::int64_t generating_groups = 0;
  std::map<std::int64_t, std::vector<std::int64_t>> by_version;
  std::set<std::pair<std::int64_t, std::int64_t>> complete;  // complete live groups
  // Live groups not complete, with tokens, by (oldest version, id) (wait_for_oldest).
  std::set<std::pair<std::int64_t, std::int64_t>> unfinished;
  std::map<std::int64_t, std::set<std::int64_t>> live_by_target;
  // Engines taking work by (outstanding predicted tokens, id): the dispatch choice in
  // O(log engines). Engines behind the newest version, not syncing, and idle unless
  // syncs interrupt: the ones MaybeSync may act on.
  std::set<std::tuple<std::int64_t, std::int64_t, Engine*>> ready;
  std::map<std::int64_t, std::int64_t> ready_versions;  // version -> engines in `ready`
  std::set<std::int64_t> behind;
  std::int64_t alive_engines = 0;
  std::int64_t queued_work = 0;  // predicted remaining tokens of the queued samples

  std::int64_t t_next = 0;     // the next batch to close
  std::int64_t next_call = 0;  // its next call to close, in [0, k)
  std::deque<ClosedBatch> closed;
  bool training = false;
  std::int64_t training_call = 0;  // the call of the running step
  double train_started = 0;
  double train_busy = 0;
  std::int64_t latest = 0;  // newest version (= steps finished)

  std::unordered_map<std::int64_t, std::pair<std::int64_t, std::int64_t>> history;  // sum, n
  LengthHistogram lengths;

  Counters counters;
  std::vector<std::int64_t> staleness;
  std::vector<std::int64_t> token_staleness;
  std::vector<TrainedSample> last_batch;
  std::int64_t weight_syncs = 0;
  double weight_sync_seconds = 0;
  StepTimes step_times;

  // Commands of the current Handle() call; dispatches coalesce per engine.
  std::vector<Command>* out = nullptr;
  std::vector<Dispatch> dispatches;

  // ---- helpers ----

  bool IsJoined(std::int64_t id) const {
    const auto it = engines.find(id);
    return it != engines.end() && it->second.alive;
  }
  Engine* FindEngine(std::int64_t id) {
    auto it = engines.find(id);
    return it == engines.end() || !it->second.alive ? nullptr : &it->second;
  }
  Group& GroupOf(std::int64_t sample) { return groups[static_cast<std::size_t>(sample / G)]; }
  Sample& At(std::int64_t sample) { return samples[static_cast<std::size_t>(sample)]; }
  const Sample& At(std::int64_t sample) const { return samples[static_cast<std::size_t>(sample)]; }

  // Brings the engine's busy accounting and its place in `ready` and `behind` up to
  // date; called after every change of its samples, version, sync or liveness.
  void Update(Engine& e) {
    const bool busy = e.alive && (!e.in_flight.empty() || e.syncing_to >= 0 || e.releasing);
    if (busy != e.busy) {
      if (busy) {
        e.busy_since = now;
      } else {
        e.busy_total += now - e.busy_since;
      }
      e.busy = busy;
    }
    if (e.ready_outstanding >= 0) {
      ready.erase({e.ready_outstanding, e.id, &e});
      if (--ready_versions[e.ready_version] == 0) ready_versions.erase(e.ready_version);
    }
    e.ready_outstanding = -1;
    if (Accepting(e)) {
      e.ready_outstanding = e.outstanding;
      e.ready_version = e.version;
      ready.emplace(e.outstanding, e.id, &e);
      ++ready_versions[e.version];
    }
    // Only an interrupting sync acts on a busy engine.
    const bool interrupts = !boundary_sync && options.partial_rollout;
    if (e.alive && e.syncing_to < 0 && !e.releasing && e.version < latest &&
        (interrupts || e.in_flight.empty())) {
      behind.insert(e.id);
    } else {
      behind.erase(e.id);
    }
  }

  std::int64_t Predict(std::int64_t prompt) {
    auto it = history.find(prompt);
    if (it != history.end() && it->second.second > 0) {
      return std::max<std::int64_t>(1, it->second.first / it->second.second);
    }
    if (lengths.total() > 0) return lengths.Quantile(options.length_quantile);
    return options.initial_prediction;
  }

  // A queued sample's key: its target batch, then (longest first) its predicted
  // remaining tokens, then its id.
  QueueKey KeyOf(std::int64_t id) {
    return {GroupOf(id).target, options.longest_first ? -At(id).remaining : 0, id};
  }

  void Enqueue(std::int64_t id) {
    Sample& x = At(id);
    x.state = SampleState::kQueued;
    x.engine = -1;
    x.remaining = std::max<std::int64_t>(1, x.predicted - x.tokens);
    queue.insert(KeyOf(id));
    if (GroupOf(id).generating) generating_queue.insert(KeyOf(id));
    ++counters.queued;
    queued_work += x.remaining;
  }
  void Dequeue(std::int64_t id) {
    Sample& x = At(id);
    queue.erase(KeyOf(id));
    generating_queue.erase(KeyOf(id));
    --counters.queued;
    queued_work -= x.remaining;
  }

  void RefreshGroupOldest(std::int64_t g) {
    Group& group = groups[static_cast<std::size_t>(g)];
    std::int64_t oldest = -1;
    for (std::int64_t j = 0; j < G; ++j) {
      const std::int64_t o = At(g * G + j).oldest;
      if (o >= 0 && (oldest < 0 || o < oldest)) oldest = o;
    }
    group.oldest = oldest;
    Reindex(g);
  }

  // Brings the group's place in `unfinished` up to date; called after every change of
  // its oldest version, completion or state.
  void Reindex(std::int64_t g) {
    if (!wait_for_oldest) return;
    Group& group = groups[static_cast<std::size_t>(g)];
    if (group.indexed_oldest >= 0) unfinished.erase({group.indexed_oldest, g});
    group.indexed_oldest = -1;
    if (group.state == GroupState::kLive && group.complete < G && group.oldest >= 0) {
      group.indexed_oldest = group.oldest;
      unfinished.emplace(group.oldest, g);
    }
  }

  // Sets a sample's oldest version, keeping the indexes that hold it: its engine's
  // in_flight_oldest (`on`: the engine it runs on, if any), by_version and its group's.
  void SetOldest(std::int64_t id, std::int64_t oldest, Engine* on) {
    Sample& x = At(id);
    if (oldest == x.oldest) return;
    if (on != nullptr && wait_for_oldest) {
      on->in_flight_oldest.erase(on->in_flight_oldest.find(x.oldest));
      on->in_flight_oldest.insert(oldest);
    }
    x.oldest = oldest;
    if (strict && oldest >= 0) by_version[oldest].push_back(id);
    RefreshGroupOldest(id / G);
  }

  // The oldest version of the sample's spans (-1: none).
  std::int64_t OldestOfSpans(const Sample& x) const {
    std::int64_t oldest = -1;
    for (const VersionSpan& span : x.spans) {
      if (oldest < 0 || span.version < oldest) oldest = span.version;
    }
    return oldest;
  }

  // Drops the sample's last span when no token was generated in it (it was paused or
  // requeued before its first token under that version): no token carries that
  // version, so neither its staleness nor its partial count may. Keeps one span.
  void DropEmptyLastSpan(std::int64_t id, Engine* on) {
    Sample& x = At(id);
    if (x.spans.size() > 1 && x.spans.back().first_token == x.tokens) {
      x.spans.pop_back();
      SetOldest(id, OldestOfSpans(x), on);
    }
  }

  // The sample's next tokens come from `version` (a dispatch, or a resume after a
  // weight sync): a span starts at its next token, replacing a last span left empty.
  void BeginSpan(std::int64_t id, std::int64_t version, Engine* on) {
    Sample& x = At(id);
    if (!x.spans.empty() && x.spans.back().first_token == x.tokens) x.spans.pop_back();
    if (x.spans.empty() || x.spans.back().version != version) {
      x.spans.push_back(VersionSpan{.version = version, .first_token = x.tokens});
    }
    SetOldest(id, OldestOfSpans(x), on);
  }

  // Checks an engine's account of the versions of a sample's tokens (EngineSpans) in a
  // report of `tokens` tokens; `field` prefixes the names ("" or "samples[i]."). O(spans).
  void CheckEngineSpans(const std::string& field, const Sample& x, const EngineSpans& spans,
                        std::int64_t tokens) const {
    if (spans.empty()) return;
    const Engine& e = engines.at(x.engine);
    const std::int64_t newest = std::max(e.version, e.syncing_to);
    if (tokens <= x.dispatched_from) {
      Invalid(field + "spans",
              "empty: no token was generated since the dispatch (resume_from " +
                  Str(x.dispatched_from) + ")",
              Str(std::int64_t(spans.size())) + " spans");
    }
    for (std::size_t i = 0; i < spans.size(); ++i) {
      const std::string at = field + "spans[" + std::to_string(i) + "]";
      const VersionSpan& span = spans[i];
      if (i == 0 && span.first_token != x.dispatched_from) {
        Invalid(at + ".first_token", "the Dispatch's resume_from, " + Str(x.dispatched_from),
                Str(span.first_token));
      }
      if (i > 0 && !(span.first_token > spans[i - 1].first_token && span.first_token < tokens)) {
        Invalid(at + ".first_token",
                "in (" + Str(spans[i - 1].first_token) + ", " + Str(tokens) +
                    "): after the previous span's first token, before the reported tokens",
                Str(span.first_token));
      }
      const std::int64_t lowest = i == 0 ? x.dispatched_version : spans[i - 1].version + 1;
      if (span.version < lowest || span.version > newest) {
        Invalid(at + ".version",
                "in [" + Str(lowest) + ", " + Str(newest) +
                    "]: " + (i == 0 ? "from the Dispatch's version" : "above the previous span's") +
                    " to the engine's newest (engine " + Str(x.engine) + ")",
                Str(span.version));
      }
    }
  }

  // Records an engine's account (checked by CheckEngineSpans; `tokens` already set) in
  // place of the core's inference for the tokens since the dispatch, counting whether
  // they differ. `on`: the engine the sample is in flight on (its index), or null.
  void ApplyEngineSpans(std::int64_t id, const EngineSpans& spans, Engine* on) {
    if (spans.empty()) return;
    Sample& x = At(id);
    const std::int64_t from = x.dispatched_from;
    std::vector<VersionSpan> kept;      // the core's spans before `from`
    std::vector<VersionSpan> inferred;  // and over [from, tokens)
    for (std::size_t i = 0; i < x.spans.size(); ++i) {
      const VersionSpan& span = x.spans[i];
      const std::int64_t end = i + 1 < x.spans.size() ? x.spans[i + 1].first_token : x.tokens;
      if (span.first_token < from) {
        kept.push_back(span);
      }
      if (end > from && span.first_token < x.tokens && end > span.first_token) {
        inferred.push_back(
            {.version = span.version, .first_token = std::max(span.first_token, from)});
      }
    }
    ++counters.version_reports;
    const bool same = inferred.size() == spans.size() &&
                      std::equal(spans.begin(), spans.end(), inferred.begin(),
                                 [](const VersionSpan& a, const VersionSpan& b) {
                                   return a.version == b.version && a.first_token == b.first_token;
                                 });
    if (!same) ++counters.version_corrections;
    for (const VersionSpan& span : spans) {
      if (!kept.empty() && kept.back().version == span.version) continue;
      kept.push_back(span);
    }
    // The next tokens come from the version of the last dispatch or resume (an empty
    // span until then), unless the engine says it already generates with a newer one.
    const std::int64_t open = x.spans.empty() ? -1 : x.spans.back().version;
    if (open > kept.back().version) kept.push_back({.version = open, .first_token = x.tokens});
    x.spans = std::move(kept);
    SetOldest(id, OldestOfSpans(x), on);
  }

  // Strict: whether a live sample's tokens are too old for the next batch. An engine's
  // account can make a sample older than the core inferred (tokens of a version it
  // thought the sample had none of, e.g. paused before its first token); such a sample
  // is generated again, as the strict policy does with any leftover too old.
  bool TooStale(const Sample& x) const { return strict && x.oldest >= 0 && x.oldest < t_next - s; }
  void CountStaleRestart(const Sample& x) {
    ++counters.stale_restarts;
    counters.stale_discarded_tokens += x.tokens;
  }

  // Discards a sample's tokens (they would break the bound, or their engine failed).
  void DiscardTokens(std::int64_t id) {
    Sample& x = At(id);
    counters.discarded_tokens += x.tokens;
    x.tokens = 0;
    x.oldest = -1;
    x.spans.clear();
    RefreshGroupOldest(id / G);
  }

  // Takes an in-flight sample off its engine (the caller sends Abort when needed).
  void Unplace(std::int64_t id) {
    Sample& x = At(id);
    Engine& e = engines.at(x.engine);
    const std::int64_t last = e.in_flight.back();
    e.in_flight[static_cast<std::size_t>(x.slot)] = last;
    At(last).slot = x.slot;
    e.in_flight.pop_back();
    x.slot = -1;
    e.outstanding -= x.remaining;
    if (wait_for_oldest) e.in_flight_oldest.erase(e.in_flight_oldest.find(x.oldest));
    x.interrupted = false;
    x.progress_reported = false;
    --counters.in_flight;
    Update(e);
  }

  // pause_mode kAbort: a paused sample whose tokens its engine reported and handed back
  // (the engine forgot it; the core dispatches it again after WeightsLoaded).
  bool Returned(const Sample& x) const {
    return options.pause_mode == PauseMode::kAbort && x.interrupted && x.progress_reported;
  }

  void SendAbort(std::int64_t engine, std::int64_t id) {
    if (!out->empty()) {
      if (auto* last = std::get_if<Abort>(&out->back()); last && last->engine == engine) {
        last->samples.push_back(id);
        return;
      }
    }
    out->push_back(Abort{.engine = engine, .samples = {id}});
  }

  // Takes a live sample out of wherever it is (an engine, the queue, the complete
  // ones); the caller gives it its next state. Group bookkeeping is the caller's.
  void Withdraw(std::int64_t id) {
    Sample& x = At(id);
    switch (x.state) {
      case SampleState::kInFlight:
        if (!Returned(x)) SendAbort(x.engine, id);  // a returned one is off its engine
        Unplace(id);
        break;
      case SampleState::kQueued:
        Dequeue(id);
        break;
      case SampleState::kComplete:
        --counters.buffered;
        break;
      default:
        RLSCHED_CHECK(!"a withdrawn sample is live");
    }
  }

  // Regenerates a sample from scratch: its tokens are too old for any future batch.
  void Restart(std::int64_t id) {
    Group& group = GroupOf(id);
    if (At(id).state == SampleState::kComplete) {
      if (group.complete == G) complete.erase({group.oldest, id / G});
      --group.complete;
      Reindex(id / G);
    }
    Withdraw(id);
    ++counters.restarts;
    DiscardTokens(id);
    Enqueue(id);
  }

  // ---- admission ----

  void Admit() {
    if (Done()) return;
    std::int64_t hi = latest + s;
    if (one_batch_at_a_time) hi = std::min(hi, t_next);
    if (options.num_steps > 0) hi = std::min(hi, options.num_steps - 1);
    for (std::int64_t b = t_next; b <= hi && !prompts.empty(); ++b) {
      auto& live = live_by_target[b];
      std::int64_t places = b == latest + s ? last_quota : quota;
      if (b == t_next) places -= next_call * per_call;  // streaming: its calls closed so far
      while (static_cast<std::int64_t>(live.size()) < places && !prompts.empty()) {
        const Prompt prompt = prompts.front();
        prompts.pop_front();
        const std::int64_t g = static_cast<std::int64_t>(groups.size());
        groups.push_back(Group{.prompt = prompt.id,
                               .prompt_tokens = prompt.prompt_tokens,
                               .target = b,
                               .admitted_for = b});
        live.insert(g);
        const std::int64_t predicted = Predict(prompt.id);
        for (std::int64_t j = 0; j < G; ++j) {
          samples.push_back(Sample{.predicted = predicted});
          Enqueue(g * G + j);
        }
        counters.admitted += G;
        ++counters.admitted_groups;
      }
    }
  }

  // ---- dispatch ----

  bool Accepting(const Engine& e) const {
    if (!e.alive || e.syncing_to >= 0 || e.version < 0 || e.releasing || e.released) return false;
    if (static_cast<std::int64_t>(e.in_flight.size()) >= e.max_concurrent) return false;
    // Draining for newer weights (async without partial rollout).
    if (!boundary_sync && e.version < latest) return false;
    // Strict: the oldest are never slowed down for younger ones. An engine running a
    // sample that the next batch waits for takes no new work until it finishes.
    if (wait_for_oldest && !e.in_flight_oldest.empty() &&
        *e.in_flight_oldest.begin() <= t_next - s) {
      return false;
    }
    return true;
  }

  // Sends queued samples to engines (see the file comment of the header). One call
  // gives an engine at most a fair share of the queue, ceil(queued / engines alive)
  // samples and about that share of the predicted work, so that when engines become
  // ready one event at a time (weights loaded together), the first ones do not take
  // everything. O(log n + log engines) per sample, plus the engines skipped.
  void DispatchQueued() {
    if (Done() || queue.empty() || ready.empty()) return;
    if (options.even_split) return DispatchToHomes();
    const std::int64_t share =
        (static_cast<std::int64_t>(queue.size()) + alive_engines - 1) / alive_engines;
    const std::int64_t work_share = (queued_work + alive_engines - 1) / alive_engines;
    const std::int64_t cap = options.max_generating_groups;
    while (!queue.empty()) {
      const bool full = cap > 0 && generating_groups >= cap;
      if (full && generating_queue.empty()) break;
      const QueueKey key = full ? *generating_queue.begin() : *queue.begin();
      // The engine's version must keep the sample within the bound at its target.
      const std::int64_t need = std::get<0>(key) - s;
      if (ready_versions.empty() || ready_versions.rbegin()->first < need) break;
      Engine* best = nullptr;
      for (const auto& [outstanding, eid, e] : ready) {
        if (e->version >= need && e->pass_count < share && e->pass_work < work_share) {
          best = e;
          break;
        }
      }
      if (best == nullptr) break;  // later samples need the same or newer versions
      ++best->pass_count;
      best->pass_work += At(std::get<2>(key)).remaining;
      Assign(key, *best);
    }
    for (const Dispatch& d : dispatches) {
      Engine& e = engines.at(d.engine);
      e.pass_count = 0;
      e.pass_work = 0;
    }
  }

  // even_split: each queued sample, in queue order, to its group's home engine when
  // that engine takes work at the sample's version; the others wait for theirs. Stops
  // when no engine takes work. O(scanned + dispatched · log n) per call, where scanned
  // is the queue, or at the generating-groups cap the generating groups' samples.
  void DispatchToHomes() {
    std::vector<Engine*> homes;
    for (auto& [id, e] : engines) {
      if (e.alive) homes.push_back(&e);
    }
    const std::int64_t cap = options.max_generating_groups;
    // At the cap only the generating groups' samples may go: scan those alone.
    const std::set<QueueKey>& scanned =
        cap > 0 && generating_groups >= cap ? generating_queue : queue;
    for (auto it = scanned.begin(); it != scanned.end() && !ready.empty();) {
      const QueueKey key = *it++;  // (Assign erases `key` only)
      const std::int64_t id = std::get<2>(key);
      if (cap > 0 && generating_groups >= cap && !GroupOf(id).generating) continue;
      Engine& home = *homes[static_cast<std::size_t>(id / G) % homes.size()];
      if (home.ready_outstanding < 0 || home.version < std::get<0>(key) - s) continue;
      Assign(key, home);
    }
  }

  // The queued sample of `key` to engine `e`, in this call's Dispatch to it.
  void Assign(const QueueKey& key, Engine& e) {
    const std::int64_t id = std::get<2>(key);
    Sample& x = At(id);
    queued_work -= x.remaining;
    queue.erase(key);
    generating_queue.erase(key);
    --counters.queued;
    x.state = SampleState::kInFlight;
    if (x.first_dispatch < 0) x.first_dispatch = now;
    if (options.max_generating_groups > 0) StartGenerating(id / G);
    x.engine = e.id;
    BeginSpan(id, e.version, nullptr);  // kept tokens may be newer than the engine
    x.slot = static_cast<std::int64_t>(e.in_flight.size());
    e.in_flight.push_back(id);
    if (wait_for_oldest) e.in_flight_oldest.insert(x.oldest);
    e.outstanding += x.remaining;
    ++counters.in_flight;
    Update(e);
    auto d = std::find_if(dispatches.rbegin(), dispatches.rend(),
                          [&](const Dispatch& c) { return c.engine == e.id; });
    if (d == dispatches.rend()) {
      dispatches.push_back(Dispatch{.engine = e.id, .version = e.version});
      d = dispatches.rbegin();
    }
    d->samples.push_back(DispatchWork(id, e.version));
  }

  // Sample `id` as a Dispatch to an engine holding `version` carries it, from its tokens
  // so far; the engine's account of it starts there.
  SampleWork DispatchWork(std::int64_t id, std::int64_t version) {
    Sample& x = At(id);
    x.dispatched_from = x.tokens;
    x.dispatched_version = version;
    const Group& group = GroupOf(id);
    return SampleWork{.sample = id,
                      .group = id / G,
                      .prompt = group.prompt,
                      .prompt_tokens = group.prompt_tokens,
                      .resume_from = x.tokens,
                      .predicted_tokens = x.predicted};
  }

  // max_generating_groups: group g holds a place from its first dispatch; its other
  // queued samples go to generating_queue. O(G log n) once per group start.
  void StartGenerating(std::int64_t g) {
    Group& group = groups[static_cast<std::size_t>(g)];
    if (group.generating) return;
    group.generating = true;
    ++generating_groups;
    for (std::int64_t j = 0; j < G; ++j) {
      if (At(g * G + j).state == SampleState::kQueued) generating_queue.insert(KeyOf(g * G + j));
    }
  }
  void StopGenerating(std::int64_t g) {
    Group& group = groups[static_cast<std::size_t>(g)];
    if (!group.generating) return;
    group.generating = false;
    --generating_groups;
  }

  // ---- weight sync ----

  void MaybeSync(std::int64_t id, Engine& e) {
    if (!e.alive || e.syncing_to >= 0 || e.releasing || e.version >= latest) return;
    const bool idle = e.in_flight.empty();
    bool interrupt = false;
    if (!boundary_sync && options.partial_rollout) {
      interrupt = !idle;
    } else if (!idle) {
      return;  // drains first
    } else if (boundary_sync && e.version >= 0 && !queue.empty() &&
               std::get<0>(*queue.begin()) - s <= e.version) {
      return;  // work left for its weights
    }
    if (interrupt) {
      for (const std::int64_t sample : e.in_flight) {
        Sample& x = At(sample);
        x.interrupted = true;
        x.progress_reported = false;
      }
    }
    e.syncing_to = latest;
    e.pausing = interrupt;
    e.sync_started = now;
    Update(e);
    SyncWeights sync{.engine = id,
                     .version = latest,
                     .interrupt = interrupt,
                     .pause = interrupt ? options.pause_mode : PauseMode::kKeep};
    if (e.released) sync.resume = kReleasedMemory;
    out->push_back(std::move(sync));
  }

  // ---- batches and training ----

  bool Done() const { return options.num_steps > 0 && t_next >= options.num_steps; }

  // Moves a live group to another target batch; its queued samples go back under the
  // new target's key.
  void Retarget(std::int64_t g, std::int64_t target) {
    Group& group = groups[static_cast<std::size_t>(g)];
    live_by_target[group.target].erase(g);
    std::vector<std::int64_t> queued;
    for (std::int64_t j = 0; j < G; ++j) {
      if (At(g * G + j).state == SampleState::kQueued) {
        Dequeue(g * G + j);
        queued.push_back(g * G + j);
      }
    }
    group.target = target;
    for (const std::int64_t id : queued) Enqueue(id);
    live_by_target[target].insert(g);
  }

  // Closes the next trainer calls (P / k complete groups each, oldest first); after the
  // k-th call of batch t, batch t + 1 is next.
  void CloseBatches() {
    while (!Done() && static_cast<std::int64_t>(complete.size()) >= per_call) {
      // A running group whose oldest tokens the next batch could not take: this batch
      // waits for it rather than leave it to be discarded.
      if (wait_for_oldest && !unfinished.empty() && unfinished.begin()->first <= t_next - s) {
        break;
      }
      ClosedBatch batch{.step = t_next, .call = next_call, .groups = {}};
      for (std::int64_t i = 0; i < per_call; ++i) {
        const std::int64_t g = complete.begin()->second;
        complete.erase(complete.begin());
        Group& group = groups[static_cast<std::size_t>(g)];
        live_by_target[group.target].erase(g);
        // A group meant for a later batch closes into this one: the youngest group
        // meant for this one takes its place there, as it would when carried over, so
        // that the later batch's places are not freed (streaming closes in parts).
        if (group.target > t_next) {
          auto& here = live_by_target[t_next];
          if (!here.empty()) Retarget(*here.rbegin(), group.target);
        }
        group.state = GroupState::kClosed;
        Reindex(g);
        for (std::int64_t j = 0; j < G; ++j) {
          Sample& x = At(g * G + j);
          x.state = SampleState::kClosed;
        }
        batch.groups.push_back(g);
      }
      std::sort(batch.groups.begin(), batch.groups.end());
      closed.push_back(std::move(batch));
      if (++next_call < k) continue;
      next_call = 0;
      ++t_next;
      if (wait_for_oldest) {  // the samples the next batch waits for have changed
        for (auto& [id, engine] : engines) Update(engine);
      }
      // Groups meant for earlier batches carry over to the next one.
      while (!live_by_target.empty() && live_by_target.begin()->first < t_next) {
        const std::set<std::int64_t> carried = live_by_target.begin()->second;
        for (const std::int64_t g : carried) Retarget(g, t_next);
        live_by_target.erase(live_by_target.begin());
      }
      // Strict: tokens too old for the next batch are discarded, so the bound is never
      // exceeded (by_version is kept only then).
      while (!by_version.empty() && by_version.begin()->first < t_next - s) {
        auto node = by_version.extract(by_version.begin());
        for (const std::int64_t id : node.mapped()) {
          const Sample& x = At(id);
          const bool live = x.state == SampleState::kQueued || x.state == SampleState::kInFlight ||
                            x.state == SampleState::kComplete;
          if (live && x.oldest == node.key()) {
            CountStaleRestart(x);
            Restart(id);
          }
        }
      }
    }
  }

  // Starts the oldest closed batch when the trainer is free. The planner runs before
  // any state changes: if it throws, the batch stays closed and is tried again.
  void StartTraining() {
    if (training || closed.empty()) return;
    const ClosedBatch& batch = closed.front();
    if (options.colocated && !ReleaseEngines(batch.step)) return;
    StartTrain start{
        .step = batch.step, .call = batch.call, .version = batch.step, .groups = batch.groups};
    std::vector<std::int64_t> group_ids;
    for (const std::int64_t g : batch.groups) {
      for (std::int64_t j = 0; j < G; ++j) {
        start.samples.push_back(g * G + j);
        start.lengths.push_back(groups[static_cast<std::size_t>(g)].prompt_tokens +
                                At(g * G + j).tokens);
        group_ids.push_back(g);
      }
    }
    if (options.planner) start.plan = options.planner(start.lengths, group_ids);
    closed.pop_front();  // `batch` dangles from here on
    if (start.call == 0) step_times.StartStep();
    last_batch.clear();
    for (const std::int64_t g : start.groups) {
      Group& group = groups[static_cast<std::size_t>(g)];
      group.state = GroupState::kTrained;
      for (std::int64_t j = 0; j < G; ++j) {
        const std::int64_t id = g * G + j;
        Sample& x = At(id);
        x.state = SampleState::kTrained;
        step_times.AddSample(x.first_dispatch, x.finished);
        const std::int64_t age = start.step - x.oldest;
        // Strict: every token within s. Admission: the first tokens on weights at most s
        // behind the batch the group was admitted for.
        RLSCHED_CHECK(age >= 0 && (strict ? age <= s : x.oldest >= group.admitted_for - s));
        if (static_cast<std::size_t>(age) >= staleness.size()) staleness.resize(age + 1, 0);
        ++staleness[static_cast<std::size_t>(age)];
        for (std::size_t i = 0; i < x.spans.size(); ++i) {
          const std::int64_t end = i + 1 < x.spans.size() ? x.spans[i + 1].first_token : x.tokens;
          const std::int64_t token_age = start.step - x.spans[i].version;
          if (static_cast<std::size_t>(token_age) >= token_staleness.size()) {
            token_staleness.resize(static_cast<std::size_t>(token_age) + 1, 0);
          }
          token_staleness[static_cast<std::size_t>(token_age)] += end - x.spans[i].first_token;
        }
        bool partial = false;
        for (const VersionSpan& span : x.spans) partial |= span.version != x.spans[0].version;
        counters.partial_samples += partial ? 1 : 0;
        counters.trained_tokens += group.prompt_tokens + x.tokens;
        last_batch.push_back(
            TrainedSample{.sample = id, .response_tokens = x.tokens, .spans = std::move(x.spans)});
        x.spans = {};
      }
    }
    counters.trained += per_call * G;
    counters.buffered -= per_call * G;
    counters.trained_groups += per_call;
    if (start.call == 0) ++counters.steps_started;
    training = true;
    training_call = start.call;
    train_started = now;
    out->push_back(std::move(start));
  }

  // Colocated: the trainer may start step `step` once the whole batch is closed and
  // every engine alive has released its memory; sends Release to the idle engines that
  // have not. True when all are released.
  bool ReleaseEngines(std::int64_t step) {
    if (step >= t_next) return false;  // calls of the batch still generating
    bool all = true;
    for (auto& [id, e] : engines) {
      if (!e.alive || e.released) continue;
      all = false;
      if (e.releasing || !e.in_flight.empty() || e.syncing_to >= 0) continue;
      e.releasing = true;
      Update(e);
      out->push_back(Release{.engine = id, .tags = kReleasedMemory});
    }
    return all;
  }

  // One round of decisions after an event.
  void Decide() {
    CloseBatches();
    StartTraining();
    Admit();
    if (!behind.empty()) {
      const std::vector<std::int64_t> ids(behind.begin(), behind.end());
      for (const std::int64_t id : ids) MaybeSync(id, engines.at(id));
    }
    DispatchQueued();
    std::sort(dispatches.begin(), dispatches.end(),
              [](const Dispatch& a, const Dispatch& b) { return a.engine < b.engine; });
    for (Dispatch& d : dispatches) out->push_back(std::move(d));
    dispatches.clear();
  }

  // ---- group completion ----

  void FilterGroup(std::int64_t g) {
    Group& group = groups[static_cast<std::size_t>(g)];
    if (group.complete == G) complete.erase({group.oldest, g});
    live_by_target[group.target].erase(g);
    StopGenerating(g);
    group.state = GroupState::kFiltered;
    Reindex(g);
    for (std::int64_t j = 0; j < G; ++j) {
      const std::int64_t id = g * G + j;
      Withdraw(id);
      Sample& x = At(id);
      x.state = SampleState::kFiltered;
      x.spans = {};
    }
    counters.filtered += G;
    ++counters.filtered_groups;
  }

  void OnGroupComplete(std::int64_t g) {
    Group& group = groups[static_cast<std::size_t>(g)];
    if (options.filter) {
      std::vector<double> rewards;
      rewards.reserve(static_cast<std::size_t>(G));
      for (std::int64_t j = 0; j < G; ++j) rewards.push_back(At(g * G + j).reward);
      if (!options.filter(rewards)) {
        FilterGroup(g);
        return;
      }
    }
    complete.emplace(group.oldest, g);
  }

  // ---- events ----

  void CheckTime(double time) {
    CheckFinite("time", time);
    if (started && time < now) Invalid("time", ">= the last event's time " + Str(now), Str(time));
  }
  void Advance(double time) {
    if (!started) {
      started = true;
      first_time = time;
    }
    now = time;
  }

  std::int64_t CheckSampleInFlight(std::int64_t sample) {
    if (sample < 0 || sample >= static_cast<std::int64_t>(samples.size())) {
      Invalid("sample", "an admitted sample id in [0, " + Str(std::int64_t(samples.size())) + ")",
              Str(sample));
    }
    if (At(sample).state != SampleState::kInFlight) {
      Invalid("sample", "in flight", Str(sample) + " (not in flight)");
    }
    return sample;
  }

  void On(const PromptsAvailable& e) {
    CheckTime(e.time);
    for (const Prompt& p : e.prompts) {
      CheckInRange("prompts.prompt_tokens", p.prompt_tokens, 0, kMaxTokens);
    }
    if (static_cast<std::int64_t>(prompts.size() + e.prompts.size()) > kMaxPrompts) {
      Invalid("prompts", "at most " + Str(kMaxPrompts) + " waiting",
              Str(std::int64_t(prompts.size() + e.prompts.size())));
    }
    Advance(e.time);
    prompts.insert(prompts.end(), e.prompts.begin(), e.prompts.end());
  }

  // EngineJoined's and EngineAttached's bounds: the id's, then (for EngineJoined) that it
  // is not joined, then the concurrency's and the version's.
  void CheckJoining(std::int64_t id, std::int64_t max_concurrent, std::int64_t version,
                    bool must_be_new) const {
    CheckInRange("engine", id, 0, kMaxEngineId);
    if (must_be_new && IsJoined(id)) Invalid("engine", "not joined", Str(id));
    CheckInRange("max_concurrent", max_concurrent, 1, kMaxConcurrent);
    CheckInRange("version", version, -1, latest);
  }

  void On(const EngineJoined& e) {
    CheckTime(e.time);
    CheckJoining(e.engine, e.max_concurrent, e.version, /*must_be_new=*/true);
    Advance(e.time);
    Join(e);
  }

  // The samples an attaching engine holds, ascending (refused: negative, repeated, more
  // than it runs at once).
  static std::vector<std::int64_t> HeldSamples(const EngineAttached& e) {
    if (static_cast<std::int64_t>(e.samples.size()) > e.max_concurrent) {
      Invalid("samples", "at most max_concurrent (" + Str(e.max_concurrent) + ") samples",
              Str(std::int64_t(e.samples.size())));
    }
    std::vector<std::pair<std::int64_t, std::size_t>> held;
    for (std::size_t i = 0; i < e.samples.size(); ++i) {
      CheckAtLeast({"samples", i}, e.samples[i], 0);
      held.emplace_back(e.samples[i], i);
    }
    std::sort(held.begin(), held.end());
    std::vector<std::int64_t> out;
    for (std::size_t i = 0; i < held.size(); ++i) {
      if (i > 0 && held[i].first == held[i - 1].first) {
        Invalid("samples[" + std::to_string(held[i].second) + "]", "each sample once",
                Str(held[i].first));
      }
      out.push_back(held[i].first);
    }
    return out;
  }

  // Whether the engine is kept as it is: nullopt when not; else the samples the core
  // has on it that it does not hold (finished while no scheduler heard, or a dispatch it
  // never got), ascending.
  std::optional<std::vector<std::int64_t>> Kept(const EngineAttached& e,
                                                const std::vector<std::int64_t>& held) const {
    const auto it = engines.find(e.engine);
    if (it == engines.end() || !it->second.alive) return std::nullopt;
    const Engine& engine = it->second;
    if (engine.max_concurrent != e.max_concurrent || engine.version != e.version ||
        engine.syncing_to >= 0 || engine.pausing ||
        (engine.releasing || engine.released) != e.released) {
      return std::nullopt;
    }
    std::vector<std::int64_t> mine = engine.in_flight;
    std::sort(mine.begin(), mine.end());
    if (!std::includes(mine.begin(), mine.end(), held.begin(), held.end()) ||
        std::any_of(mine.begin(), mine.end(),
                    [this](std::int64_t sample) { return At(sample).interrupted; })) {
      return std::nullopt;
    }
    std::vector<std::int64_t> missing;
    std::set_difference(mine.begin(), mine.end(), held.begin(), held.end(),
                        std::back_inserter(missing));
    return missing;
  }

  void On(const EngineAttached& e) {
    CheckTime(e.time);
    CheckJoining(e.engine, e.max_concurrent, e.version, /*must_be_new=*/false);
    std::vector<std::int64_t> held = HeldSamples(e);
    if (std::optional<std::vector<std::int64_t>> missing = Kept(e, held)) {
      Advance(e.time);
      TakeBack(e.engine, std::move(*missing));
      Engine& engine = engines.at(e.engine);
      if (engine.releasing) {  // its EngineReleased went to a scheduler that died
        engine.releasing = false;
        engine.released = true;
        Update(engine);
      }
      return;
    }
    Advance(e.time);
    // What it holds, and what the core gave it since its Hello was made (those commands
    // reach the new stream): both go back, so both are aborted there.
    if (const Engine* known = FindEngine(e.engine)) {
      held.insert(held.end(), known->in_flight.begin(), known->in_flight.end());
      std::sort(held.begin(), held.end());
      held.erase(std::unique(held.begin(), held.end()), held.end());
      RemoveEngine(e.engine, true);
    }
    if (!held.empty()) out->push_back(Abort{.engine = e.engine, .samples = std::move(held)});
    Join(EngineJoined{.time = e.time,
                      .engine = e.engine,
                      .max_concurrent = e.max_concurrent,
                      .version = e.version});
  }

  void Join(const EngineJoined& e) {
    Engine& engine = engines[e.engine];
    engine.id = e.engine;
    engine.alive = true;
    ++alive_engines;
    engine.max_concurrent = e.max_concurrent;
    engine.version = e.version;
    engine.syncing_to = -1;
    engine.pausing = false;
    engine.releasing = false;
    engine.released = false;
    engine.alive_since = now;
    engine.busy = false;
    if (e.version < 0) {  // nothing loaded: always synced first
      engine.syncing_to = latest;
      engine.sync_started = now;
      Update(engine);
      out->push_back(SyncWeights{.engine = e.engine, .version = latest, .interrupt = false});
    }
    Update(engine);
  }

  // A kept engine's samples that it does not hold: back to the queue with the progress
  // the core knows, and aborted there (a dispatch still on its way is dropped).
  void TakeBack(std::int64_t id, std::vector<std::int64_t> missing) {
    if (missing.empty()) return;
    for (const std::int64_t sample : missing) {
      Unplace(sample);
      Enqueue(sample);
    }
    Update(engines.at(id));
    out->push_back(Abort{.engine = id, .samples = std::move(missing)});
  }

  void RemoveEngine(std::int64_t id, bool keep_progress) {
    Engine& e = engines.at(id);
    std::vector<std::int64_t> lost = e.in_flight;
    std::sort(lost.begin(), lost.end());
    for (const std::int64_t sample : lost) {
      const bool returned = Returned(At(sample));  // its tokens handed back: kept
      Unplace(sample);
      if (!keep_progress && !returned) {
        ++counters.restarts;
        DiscardTokens(sample);
      }
      Enqueue(sample);
    }
    e.pausing = false;
    if (e.syncing_to >= 0 || e.releasing || e.released) {
      e.syncing_to = -1;
      e.releasing = false;
      e.released = false;
      Update(e);
    }
    e.alive_total += now - e.alive_since;
    e.alive = false;
    --alive_engines;
    Update(e);
  }

  void On(const EngineLeft& e) {
    CheckTime(e.time);
    if (FindEngine(e.engine) == nullptr) Invalid("engine", "a joined engine", Str(e.engine));
    Advance(e.time);
    RemoveEngine(e.engine, true);
  }

  void On(const EngineFailed& e) {
    CheckTime(e.time);
    if (FindEngine(e.engine) == nullptr) Invalid("engine", "a joined engine", Str(e.engine));
    Advance(e.time);
    ++counters.engine_failures;
    RemoveEngine(e.engine, options.keep_partial_on_failure);
  }

  // A report's response tokens: at least the last reported, at most the cap.
  void CheckTokens(const std::string& field, const Sample& x, std::int64_t tokens) const {
    const std::int64_t cap =
        options.max_response_tokens > 0 ? options.max_response_tokens : kMaxTokens;
    CheckInRange(field, tokens, x.tokens, cap);
  }

  // A sample's report from `engine` (kAnyEngine: vouched for by the driver): the
  // sample must be in flight there.
  void CheckReporter(std::int64_t sample, std::int64_t engine) const {
    if (engine == kAnyEngine) return;
    const Sample& x = At(sample);
    if (x.engine != engine) {
      Invalid("sample", "a sample in flight on the reporting engine " + Str(engine),
              Str(sample) + " (in flight on engine " + Str(x.engine) + ")");
    }
  }

  // An engine's GroupFiltered: the group runs there alone (see GroupFiltered).
  void CheckGroupReporter(std::int64_t g, std::int64_t engine) const {
    if (engine == kAnyEngine) return;
    bool here = false;
    for (std::int64_t j = 0; j < G; ++j) {
      const Sample& x = At(g * G + j);
      if (x.state != SampleState::kInFlight) continue;
      if (x.engine != engine) {
        Invalid(
            "group", "a group running on the reporting engine " + Str(engine) + " alone",
            Str(g) + " (sample " + Str(g * G + j) + " in flight on engine " + Str(x.engine) + ")");
      }
      here = true;
    }
    if (!here) {
      Invalid("group", "a group running on the reporting engine " + Str(engine) + " alone",
              Str(g) + " (none of its samples in flight there)");
    }
  }

  void On(const GenerationProgressed& e) {
    CheckTime(e.time);
    const std::int64_t id = CheckSampleInFlight(e.sample);
    CheckReporter(id, e.engine);
    Sample& x = At(id);
    CheckTokens("tokens", x, e.tokens);
    CheckEngineSpans("", x, e.spans, e.tokens);
    Advance(e.time);
    x.tokens = e.tokens;
    if (x.interrupted) x.progress_reported = true;
    ApplyEngineSpans(id, e.spans, &engines.at(x.engine));
    if (TooStale(x)) {
      CountStaleRestart(x);
      Restart(id);  // aborted on its engine
    }
  }

  // Checks the whole report first (the state is unchanged when it is refused), then
  // applies each sample's progress as GenerationProgressed would. O(k log k) for k
  // samples, plus O(in flight on the engine) to name a missing one.
  void On(const GenerationPaused& e) {
    CheckTime(e.time);
    Engine* engine = FindEngine(e.engine);
    if (engine == nullptr) Invalid("engine", "a joined engine", Str(e.engine));
    if (!engine->pausing) {
      Invalid("engine", "pausing for an interrupting SyncWeights, its pause not yet reported",
              Str(e.engine) + (engine->syncing_to < 0 ? " (not syncing)"
                                                      : " (not pausing, or already reported)"));
    }
    if (e.version != engine->syncing_to) {
      Invalid("version", "the version of the interrupting SyncWeights, " + Str(engine->syncing_to),
              Str(e.version));
    }
    std::vector<std::pair<std::int64_t, std::size_t>> listed;  // (sample, index)
    listed.reserve(e.samples.size());
    for (std::size_t i = 0; i < e.samples.size(); ++i) {
      const SampleProgress& p = e.samples[i];
      const auto field = [i] { return "samples[" + std::to_string(i) + "]"; };
      if (p.sample < 0 || p.sample >= static_cast<std::int64_t>(samples.size())) {
        Invalid(field() + ".sample",
                "an admitted sample id in [0, " + Str(std::int64_t(samples.size())) + ")",
                Str(p.sample));
      }
      const Sample& x = At(p.sample);
      if (x.state != SampleState::kInFlight || x.engine != e.engine || !x.interrupted) {
        Invalid(
            field() + ".sample", "a sample paused on engine " + Str(e.engine),
            Str(p.sample) + (x.state != SampleState::kInFlight ? " (not in flight)"
                             : x.engine != e.engine ? " (in flight on engine " + Str(x.engine) + ")"
                                                    : " (not interrupted)"));
      }
      CheckTokens(field() + ".tokens", x, p.tokens);
      CheckEngineSpans(field() + ".", x, p.spans, p.tokens);
      listed.emplace_back(p.sample, i);
    }
    std::sort(listed.begin(), listed.end());
    for (std::size_t i = 1; i < listed.size(); ++i) {
      if (listed[i].first == listed[i - 1].first) {
        const std::size_t later = std::max(listed[i].second, listed[i - 1].second);
        const std::size_t earlier = std::min(listed[i].second, listed[i - 1].second);
        Invalid("samples[" + std::to_string(later) + "].sample",
                "each sample once (also samples[" + std::to_string(earlier) + "])",
                Str(listed[i].first));
      }
    }
    std::int64_t paused = 0;
    std::int64_t missing = -1;
    for (const std::int64_t sample : engine->in_flight) {
      if (!At(sample).interrupted) continue;
      ++paused;
      if (!std::binary_search(listed.begin(), listed.end(), std::make_pair(sample, std::size_t{0}),
                              [](const auto& a, const auto& b) { return a.first < b.first; })) {
        if (missing < 0 || sample < missing) missing = sample;
      }
    }
    if (missing >= 0) {
      Invalid("samples",
              "every sample paused on engine " + Str(e.engine) + " (" + Str(paused) + "), sample " +
                  Str(missing) + " missing",
              Str(std::int64_t(e.samples.size())) + " samples");
    }
    Advance(e.time);
    for (const SampleProgress& p : e.samples) {
      Sample& x = At(p.sample);
      x.tokens = p.tokens;
      x.progress_reported = true;
      ApplyEngineSpans(p.sample, p.spans, engine);
      if (TooStale(x)) {
        CountStaleRestart(x);
        Restart(p.sample);  // aborted on its engine (not resumed)
      }
    }
    engine->pausing = false;
  }

  void On(const GenerationFinished& e) {
    CheckTime(e.time);
    Sample& x = At(CheckSampleInFlight(e.sample));
    CheckReporter(e.sample, e.engine);
    CheckTokens("tokens", x, e.tokens);
    CheckFinite("reward", e.reward);
    CheckEngineSpans("", x, e.spans, e.tokens);
    Advance(e.time);
    x.tokens = e.tokens;
    x.reward = e.reward;
    Unplace(e.sample);
    ApplyEngineSpans(e.sample, e.spans, nullptr);
    DropEmptyLastSpan(e.sample, nullptr);  // finished before a token of its last version
    if (TooStale(x)) {  // the engine's account: too old for any batch still to come
      CountStaleRestart(x);
      ++counters.restarts;
      DiscardTokens(e.sample);
      x.engine = -1;
      Enqueue(e.sample);
      return;
    }
    x.state = SampleState::kComplete;
    x.finished = now;
    x.engine = -1;
    ++counters.buffered;
    Group& group = GroupOf(e.sample);
    auto& h = history[group.prompt];
    h.first += e.tokens;
    ++h.second;
    lengths.Add(e.tokens);
    ++group.complete;
    Reindex(e.sample / G);
    if (group.complete == G) {
      StopGenerating(e.sample / G);
      OnGroupComplete(e.sample / G);
    }
  }

  void On(const GroupFiltered& e) {
    CheckTime(e.time);
    if (e.group < 0 || e.group >= static_cast<std::int64_t>(groups.size()) ||
        groups[static_cast<std::size_t>(e.group)].state != GroupState::kLive) {
      Invalid("group", "a live (admitted, not closed, trained or filtered) group", Str(e.group));
    }
    CheckGroupReporter(e.group, e.engine);
    Advance(e.time);
    FilterGroup(e.group);
  }

  void On(const TrainStepFinished& e) {
    CheckTime(e.time);
    if (!training || e.step != counters.steps_started - 1) {
      Invalid("step",
              training ? "the running step " + Str(counters.steps_started - 1)
                       : "a running step (none is running)",
              Str(e.step));
    }
    if (e.call != training_call) {
      Invalid("call", "the running call " + Str(training_call) + " of step " + Str(e.step),
              Str(e.call));
    }
    Advance(e.time);
    training = false;
    train_busy += now - train_started;
    step_times.AddTraining(now - train_started);
    if (e.call + 1 < k) return;  // streaming: the step's next call comes first
    step_times.FinishStep(now, started ? first_time : now, counters.steps_finished,
                          options.mode == Mode::kSync, options.warmup_steps);
    ++counters.steps_finished;
    latest = counters.steps_finished;
    for (auto& [id, engine] : engines) Update(engine);  // behind now; draining
  }

  void On(const EngineReleased& e) {
    CheckTime(e.time);
    Engine* engine = FindEngine(e.engine);
    if (engine == nullptr) Invalid("engine", "a joined engine", Str(e.engine));
    if (!engine->releasing) {
      Invalid("engine", "preceded by Release (engine " + Str(e.engine) + " is not releasing)",
              Str(e.engine));
    }
    Advance(e.time);
    engine->releasing = false;
    engine->released = true;
    Update(*engine);
  }

  void On(const WeightsLoaded& e) {
    CheckTime(e.time);
    Engine* engine = FindEngine(e.engine);
    if (engine == nullptr) Invalid("engine", "a joined engine", Str(e.engine));
    if (engine->syncing_to < 0 || engine->syncing_to != e.version) {
      Invalid("version",
              engine->syncing_to < 0
                  ? "preceded by SyncWeights (engine " + Str(e.engine) + " is not syncing)"
                  : "the version being loaded, " + Str(engine->syncing_to),
              Str(e.version));
    }
    std::vector<std::int64_t> resumed;
    std::vector<std::int64_t> unreported;  // paused, no progress report: taken back
    std::vector<std::int64_t> in_flight = engine->in_flight;
    std::sort(in_flight.begin(), in_flight.end());
    for (const std::int64_t sample : in_flight) {
      const Sample& x = At(sample);
      if (x.interrupted) (x.progress_reported ? resumed : unreported).push_back(sample);
    }
    Advance(e.time);
    if (!unreported.empty()) {
      // An engine out of step with the core (its pause report refused, or lost): what it
      // did not report is aborted there and goes back to the queue, with the progress
      // last reported, instead of leaving the engine in the sync for ever.
      for (const std::int64_t sample : unreported) {
        Unplace(sample);
        Enqueue(sample);
      }
      counters.unreported_pauses += static_cast<std::int64_t>(unreported.size());
      out->push_back(Abort{.engine = e.engine, .samples = unreported});
    }
    engine->version = e.version;
    engine->syncing_to = -1;
    engine->pausing = false;
    engine->released = false;
    ++weight_syncs;
    weight_sync_seconds += now - engine->sync_started;
    Update(*engine);
    for (const std::int64_t sample : resumed) {
      Sample& x = At(sample);
      x.interrupted = false;
      x.progress_reported = false;
      BeginSpan(sample, e.version, engine);
    }
    if (options.pause_mode == PauseMode::kAbort && !resumed.empty()) {
      // The engine aborted them: each goes to it again from its tokens, before any
      // later command to it (as a Resume would).
      Dispatch d{.engine = e.engine, .version = e.version};
      for (const std::int64_t sample : resumed)
        d.samples.push_back(DispatchWork(sample, e.version));
      counters.resubmitted += static_cast<std::int64_t>(resumed.size());
      out->push_back(std::move(d));
    } else if (!resumed.empty()) {
      out->push_back(Resume{.engine = e.engine, .version = e.version, .samples = resumed});
    }
  }
};

Orchestrator::Orchestrator(OrchestratorOptions options) : state_(std::make_unique<State>()) {
  Validate(options);
  State& st = *state_;
  st.P = options.prompts_per_step;
  st.G = options.samples_per_prompt;
  switch (options.mode) {
    case Mode::kSync:
      st.s = 0;
      break;
    case Mode::kOneStepOff:
      st.s = 1;
      st.one_batch_at_a_time = true;
      break;
    case Mode::kAsync:
      st.s = EffectiveStaleness(options);
      st.boundary_sync = false;
      st.strict = options.staleness_policy == StalenessPolicy::kStrict;
      // Over-sampling closes batches without their slowest groups by design.
      st.wait_for_oldest = st.strict && st.s > 0 && options.oversample == 0;
      break;
  }
  st.quota = static_cast<std::int64_t>(
      std::ceil((1.0 + options.oversample) * static_cast<double>(st.P) - 1e-9));
  st.last_quota = st.quota;
  if (options.mode == Mode::kAsync && options.staleness_policy == StalenessPolicy::kFraction) {
    // α = 1.3: batches up to latest + 1 take quota, latest + 2 takes ⌈0.3·quota⌉.
    const double share = options.staleness_fraction - static_cast<double>(st.s - 1);
    if (st.s > 0 && share < 1 - 1e-9) {
      st.last_quota =
          static_cast<std::int64_t>(std::ceil(share * static_cast<double>(st.quota) - 1e-9));
    }
  }
  st.k = options.train_calls_per_sync;
  st.per_call = st.P / st.k;
  st.options = std::move(options);
}

Orchestrator::~Orchestrator() = default;
Orchestrator::Orchestrator(Orchestrator&&) noexcept = default;
Orchestrator& Orchestrator::operator=(Orchestrator&&) noexcept = default;

void Orchestrator::Handle(const Event& event, std::vector<Command>& out) {
  State& st = *state_;
  st.out = &out;
  std::size_t before = out.size();
  std::visit([&](const auto& e) { st.On(e); }, event);
  st.Decide();
  if (const auto* paused = std::get_if<GenerationPaused>(&event)) {
    // As many decision passes as the per-sample reports would give (one each), while
    // they give commands: a pass gives an engine at most its fair share of the queue.
    for (std::size_t pass = 1; pass < paused->samples.size() && out.size() > before; ++pass) {
      before = out.size();
      st.Decide();
    }
  }
  st.out = nullptr;
}

const Counters& Orchestrator::counters() const { return state_->counters; }
const std::vector<TrainedSample>& Orchestrator::last_batch() const { return state_->last_batch; }
std::int64_t Orchestrator::latest_version() const { return state_->latest; }
std::vector<std::int64_t> Orchestrator::engines() const {
  std::vector<std::int64_t> alive;
  for (const auto& [id, engine] : state_->engines) {
    if (engine.alive) alive.push_back(id);
  }
  return alive;
}
bool Orchestrator::KeepsEngine(const EngineAttached& attached) const {
  try {
    return state_->Kept(attached, State::HeldSamples(attached)).has_value();
  } catch (const std::invalid_argument&) {
    return false;
  }
}
bool Orchestrator::done() const {
  const State& st = *state_;
  return st.options.num_steps > 0 && st.counters.steps_finished >= st.options.num_steps;
}

Metrics Orchestrator::metrics(double now) const {
  const State& st = *state_;
  Metrics m;
  now = std::max(now, st.now);
  m.elapsed_seconds = st.started ? now - st.first_time : 0.0;
  const double elapsed = m.elapsed_seconds;
  if (elapsed > 0) {
    m.samples_per_second = static_cast<double>(st.counters.trained) / elapsed;
    m.tokens_per_second = static_cast<double>(st.counters.trained_tokens) / elapsed;
    const double busy = st.train_busy + (st.training ? now - st.train_started : 0.0);
    m.trainer_idle_ratio = std::clamp(1.0 - busy / elapsed, 0.0, 1.0);
  }
  double sum = 0;
  for (const auto& [id, e] : st.engines) {
    const double alive = e.alive_total + (e.alive ? now - e.alive_since : 0.0);
    const double busy = e.busy_total + (e.busy ? now - e.busy_since : 0.0);
    const double idle = alive > 0 ? std::clamp(1.0 - busy / alive, 0.0, 1.0) : 0.0;
    m.engines.push_back(id);
    m.engine_idle_ratio.push_back(idle);
    sum += idle;
  }
  if (!st.engines.empty()) m.mean_engine_idle_ratio = sum / static_cast<double>(st.engines.size());
  if (st.counters.trained > 0) {
    m.partial_rollout_ratio =
        static_cast<double>(st.counters.partial_samples) / static_cast<double>(st.counters.trained);
  }
  m.weight_syncs = st.weight_syncs;
  m.weight_sync_seconds = st.weight_sync_seconds;
  if (st.weight_syncs > 0) {
    m.seconds_per_weight_sync = st.weight_sync_seconds / static_cast<double>(st.weight_syncs);
  }
  if (st.counters.steps_finished > 0) {
    const double steps = static_cast<double>(st.counters.steps_finished);
    m.seconds_per_step = elapsed / steps;
    m.trainer_wait_seconds_per_step = elapsed * m.trainer_idle_ratio / steps;
    st.step_times.Fill(st.counters.steps_finished, st.options.warmup_steps, m);
  }
  m.staleness_histogram = st.staleness;
  m.token_staleness_histogram = st.token_staleness;
  for (std::size_t k = 0; k < st.staleness.size(); ++k) {
    if (st.staleness[k] > 0) m.max_staleness = static_cast<std::int64_t>(k);
  }
  return m;
}

void Orchestrator::CheckInvariants() const {
  const State& st = *state_;
  auto fail = [](const std::string& what) { throw std::logic_error("invariant: " + what); };
  const Counters& c = st.counters;
  if (c.admitted != c.trained + c.filtered + c.buffered + c.queued + c.in_flight) {
    fail("admitted " + Str(c.admitted) + " != trained " + Str(c.trained) + " + filtered " +
         Str(c.filtered) + " + buffered " + Str(c.buffered) + " + queued " + Str(c.queued) +
         " + in_flight " + Str(c.in_flight));
  }
  if (c.admitted != static_cast<std::int64_t>(st.samples.size())) fail("admitted != samples");
  std::int64_t counts[6] = {0, 0, 0, 0, 0, 0};
  for (std::size_t i = 0; i < st.samples.size(); ++i) {
    const Sample& x = st.samples[i];
    ++counts[static_cast<int>(x.state)];
    const bool live = x.state == SampleState::kQueued || x.state == SampleState::kInFlight ||
                      x.state == SampleState::kComplete;
    if (st.strict && live && x.oldest >= 0 && x.oldest < st.t_next - st.s) {
      fail("sample " + Str(std::int64_t(i)) + " too stale for batch " + Str(st.t_next));
    }
    if (x.state == SampleState::kInFlight) {
      auto it = st.engines.find(x.engine);
      if (it == st.engines.end() || !it->second.alive || x.slot < 0 ||
          x.slot >= static_cast<std::int64_t>(it->second.in_flight.size()) ||
          it->second.in_flight[static_cast<std::size_t>(x.slot)] != static_cast<std::int64_t>(i)) {
        fail("sample " + Str(std::int64_t(i)) + " in flight on no engine");
      }
    }
  }
  const std::int64_t closed = counts[static_cast<int>(SampleState::kClosed)];
  if (counts[static_cast<int>(SampleState::kQueued)] != c.queued ||
      counts[static_cast<int>(SampleState::kInFlight)] != c.in_flight ||
      counts[static_cast<int>(SampleState::kComplete)] + closed != c.buffered ||
      counts[static_cast<int>(SampleState::kTrained)] != c.trained ||
      counts[static_cast<int>(SampleState::kFiltered)] != c.filtered) {
    fail("sample states disagree with the counters");
  }
  if (static_cast<std::int64_t>(st.queue.size()) != c.queued) fail("queue size != queued");
  std::int64_t queued_work = 0;
  for (const auto& [target, neg_remaining, id] : st.queue)
    queued_work += st.samples[static_cast<std::size_t>(id)].remaining;
  if (queued_work != st.queued_work) fail("queued work");
  std::int64_t generating = 0;
  std::size_t generating_queued = 0;
  for (const Group& group : st.groups) generating += group.generating ? 1 : 0;
  for (const QueueKey& key : st.queue) {
    const bool in_generating = st.generating_queue.count(key) != 0;
    if (in_generating != st.groups[static_cast<std::size_t>(std::get<2>(key) / st.G)].generating) {
      fail("generating_queue disagrees with the groups generating");
    }
    generating_queued += in_generating ? 1 : 0;
  }
  if (generating != st.generating_groups || generating_queued != st.generating_queue.size()) {
    fail("generating groups miscounted");
  }
  if (st.options.max_generating_groups > 0 && generating > st.options.max_generating_groups) {
    fail("more groups generating than max_generating_groups");
  }
  std::int64_t in_flight = 0;
  for (const auto& [id, e] : st.engines) {
    if (!e.alive && !e.in_flight.empty()) fail("a removed engine holds samples");
    if (static_cast<std::int64_t>(e.in_flight.size()) > e.max_concurrent) {
      fail("engine " + Str(id) + " over max_concurrent");
    }
    in_flight += static_cast<std::int64_t>(e.in_flight.size());
  }
  if (in_flight != c.in_flight) fail("engines' samples != in_flight");
  for (std::size_t k = 0; k < st.staleness.size(); ++k) {
    if (st.strict && st.staleness[k] > 0 && static_cast<std::int64_t>(k) > st.s) {
      fail("staleness above s");
    }
  }
  if (st.options.colocated && st.training && c.in_flight != 0) {
    fail("colocated: samples in flight while the trainer runs");
  }
  if (!st.strict && (c.stale_restarts != 0 || c.stale_discarded_tokens != 0)) {
    fail("tokens discarded for staleness under the admission policy");
  }
  if (c.stale_restarts > c.restarts || c.stale_discarded_tokens > c.discarded_tokens) {
    fail("stale restarts above all restarts");
  }
  if (c.trained_groups * st.G != c.trained || c.filtered_groups * st.G != c.filtered) {
    fail("group counters");
  }
}

}  // namespace rlsched::scheduler
