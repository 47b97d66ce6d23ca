// benchmarks/core_events.cc — the orchestrator's decision core alone, fed a stream
// of trajectory events (issue 6: 1M events in under 2 s, step planning excluded).
//
// A minimal world drives the core: 64 engines × 256 concurrent samples, batches of
// 512 prompts × 8 samples. The world finishes the oldest running sample of the next
// engine in turn (round robin), trains a closed batch at once (no planner), answers
// interrupts with a progress report per sample, then loads the weights. Rewards
// alternate so that dynamic sampling keeps every group. Each iteration feeds
// 1,000,000 events; the counters report events/s and the time per 1M events.
//
// Usage: core_events [--benchmark_filter=...]   (Google Benchmark flags)

#include <benchmark/benchmark.h>

#include <cstdint>
#include <deque>
#include <map>
#include <vector>

#include "rlsched/scheduler/orchestrator.h"

namespace {

using namespace rlsched::scheduler;

struct FastWorld {
  explicit FastWorld(Mode mode, std::int64_t staleness, bool partial)
      : core(Options(mode, staleness, partial)) {}

  static OrchestratorOptions Options(Mode mode, std::int64_t staleness, bool partial) {
    OrchestratorOptions options{{.mode = mode,
                                 .max_staleness = staleness,
                                 .partial_rollout = partial,
                                 .oversample = 0.25,
                                 .prompts_per_step = 512,
                                 .samples_per_prompt = 8}};
    options.filter = KeepUnlessAllEqual;
    return options;
  }

  void Feed(const Event& event) {
    out.clear();
    core.Handle(event, out);
    ++events;
    for (Command& c : out) {
      if (auto* d = std::get_if<Dispatch>(&c)) {
        auto& running = engines[d->engine];
        for (const SampleWork& w : d->samples) running.push_back({w.sample, w.resume_from});
      } else if (auto* a = std::get_if<Abort>(&c)) {
        auto& running = engines[a->engine];
        for (const std::int64_t x : a->samples) {
          for (auto it = running.begin(); it != running.end(); ++it) {
            if (it->first == x) {
              running.erase(it);
              break;
            }
          }
        }
      } else if (auto* s = std::get_if<SyncWeights>(&c)) {
        syncs.push_back(*s);
      } else if (std::get_if<StartTrain>(&c) != nullptr) {
        pending_train = std::get<StartTrain>(c).step;
      }
    }
  }

  // One round: the pending syncs and train step, then one finish per engine.
  void Round() {
    while (!syncs.empty()) {
      const SyncWeights s = syncs.front();
      syncs.pop_front();
      if (s.interrupt) {
        for (auto& [x, tokens] : engines[s.engine]) {
          tokens += 1;
          Feed(GenerationProgressed{.time = time, .sample = x, .tokens = tokens});
        }
      }
      Feed(WeightsLoaded{.time = time, .engine = s.engine, .version = s.version});
    }
    if (pending_train >= 0) {
      const std::int64_t step = pending_train;
      pending_train = -1;
      Feed(TrainStepFinished{.time = time, .step = step});
      std::vector<Prompt> prompts;
      for (int i = 0; i < 512; ++i)
        prompts.push_back({.id = next_prompt++ % 4096, .prompt_tokens = 300});
      Feed(PromptsAvailable{.time = time, .prompts = prompts});
    }
    for (auto& [id, running] : engines) {
      if (running.empty()) continue;
      const auto [x, tokens] = running.front();
      running.pop_front();
      time += 0.001;
      Feed(GenerationFinished{.time = time,
                              .sample = x,
                              .tokens = tokens + 100 + (x * 7919) % 4000,
                              .reward = static_cast<double>(x % 2)});
    }
  }

  Orchestrator core;
  std::map<std::int64_t, std::deque<std::pair<std::int64_t, std::int64_t>>> engines;
  std::deque<SyncWeights> syncs;
  std::vector<Command> out;
  std::int64_t pending_train = -1;
  std::int64_t next_prompt = 0;
  std::int64_t events = 0;
  double time = 0;
};

void RunEvents(benchmark::State& state, Mode mode, std::int64_t staleness, bool partial) {
  constexpr std::int64_t kEvents = 1'000'000;
  std::int64_t total = 0, steps = 0;
  for (auto _ : state) {
    FastWorld world(mode, staleness, partial);
    for (int e = 0; e < 64; ++e) {
      world.Feed(EngineJoined{.time = 0, .engine = e, .max_concurrent = 256, .version = 0});
    }
    std::vector<Prompt> prompts;
    for (int i = 0; i < 4096; ++i)
      prompts.push_back({.id = world.next_prompt++, .prompt_tokens = 300});
    world.Feed(PromptsAvailable{.time = 0, .prompts = prompts});
    while (world.events < kEvents) world.Round();
    total += world.events;
    steps += world.core.counters().steps_finished;
    benchmark::DoNotOptimize(world.core.counters());
  }
  state.counters["events_per_s"] =
      benchmark::Counter(static_cast<double>(total), benchmark::Counter::kIsRate);
  state.counters["steps"] = static_cast<double>(steps) / static_cast<double>(state.iterations());
}

void BM_CoreEventsSync(benchmark::State& state) { RunEvents(state, Mode::kSync, 0, false); }
void BM_CoreEventsOneStepOff(benchmark::State& state) {
  RunEvents(state, Mode::kOneStepOff, 1, false);
}
void BM_CoreEventsAsyncPartial(benchmark::State& state) { RunEvents(state, Mode::kAsync, 2, true); }

BENCHMARK(BM_CoreEventsSync)->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK(BM_CoreEventsOneStepOff)->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK(BM_CoreEventsAsyncPartial)->Unit(benchmark::kMillisecond)->Iterations(3);

}  // namespace

BENCHMARK_MAIN();
