// benchmarks/partition_benchmark.cc — Google Benchmark of the k-way partitioners.
//
// Overview
//   Times the three ways to split a batch of heavy-tailed sequence lengths
//   (workload::HeavyTailedLengths(n, seed 1), generated once per n outside the timed loop):
//     BM_KarmarkarKarp     balance::KarmarkarKarp() alone (no fallback, no refinement);
//     BM_GreedyLpt         balance::GreedyLpt() alone;
//     BM_PartitionRefined  balance::PartitionItems() with default options: KK, the LPT
//                          fallback, refinement, and the compressed Partition.
//   for n in {1000, 16384, 1000000} x k in {8, 128, 1024} x equal_size in {0, 1}.
//
//   Counters:
//     gap            max_load / LowerBound - 1 of the result (Google Benchmark prints
//                    small values with SI prefixes: 12.3m = 0.0123, 45u = 4.5e-5);
//     items_per_second
//                    n × iterations / time;
//     refine_steps   (BM_PartitionRefined only) the refinement's improving steps.
//
// Usage
//   partition_benchmark                                  # everything, a few minutes
//   partition_benchmark --benchmark_filter='/n:16384/k:128/'
//   partition_benchmark --benchmark_format=json          # exact counter values

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "rlsched/balance/partition.h"
#include "rlsched/workload/workload.h"

namespace {

namespace balance = rlsched::balance;
namespace workload = rlsched::workload;

constexpr std::uint64_t kSeed = 1;

// The lengths of the n-item batch, generated on first use and kept for the process.
// Google Benchmark runs the benchmarks one after another on one thread.
const std::vector<std::int64_t>& Lengths(std::int64_t n) {
  static std::map<std::int64_t, std::vector<std::int64_t>> cache;
  auto it = cache.find(n);
  if (it == cache.end()) it = cache.emplace(n, workload::HeavyTailedLengths(n, kSeed)).first;
  return it->second;
}

std::int64_t MaxLoad(std::span<const std::int64_t> weights, std::int64_t num_parts,
                     const balance::Assignment& assignment) {
  std::vector<std::int64_t> loads(static_cast<std::size_t>(num_parts), 0);
  for (std::size_t i = 0; i < weights.size(); ++i) {
    loads[static_cast<std::size_t>(assignment[i])] += weights[i];
  }
  return loads.empty() ? 0 : *std::max_element(loads.begin(), loads.end());
}

double Gap(std::int64_t max_load, std::int64_t lower_bound) {
  if (lower_bound == 0) return 0.0;
  return static_cast<double>(max_load) / static_cast<double>(lower_bound) - 1.0;
}

struct Case {
  std::int64_t n;
  std::int64_t num_parts;
  bool equal_size;
};

Case CaseOf(const benchmark::State& state) {
  return {state.range(0), state.range(1), state.range(2) != 0};
}

void SetCommonCounters(benchmark::State& state, const Case& c, std::int64_t max_load,
                       std::int64_t lower_bound) {
  state.SetItemsProcessed(state.iterations() * c.n);
  state.counters["gap"] = Gap(max_load, lower_bound);
}

// A constructive algorithm alone: KarmarkarKarp or GreedyLpt.
template <balance::Assignment (*kAlgorithm)(std::span<const std::int64_t>, std::int64_t, bool)>
void BM_Constructive(benchmark::State& state) {
  const Case c = CaseOf(state);
  const std::vector<std::int64_t>& weights = Lengths(c.n);
  const std::int64_t lower_bound = balance::LowerBound(weights, c.num_parts, c.equal_size);
  balance::Assignment assignment;
  for (auto _ : state) {
    assignment = kAlgorithm(weights, c.num_parts, c.equal_size);
    benchmark::DoNotOptimize(assignment.data());
    benchmark::ClobberMemory();
  }
  SetCommonCounters(state, c, MaxLoad(weights, c.num_parts, assignment), lower_bound);
}

void BM_KarmarkarKarp(benchmark::State& state) { BM_Constructive<&balance::KarmarkarKarp>(state); }

void BM_GreedyLpt(benchmark::State& state) { BM_Constructive<&balance::GreedyLpt>(state); }

void BM_PartitionRefined(benchmark::State& state) {
  const Case c = CaseOf(state);
  const std::vector<std::int64_t>& weights = Lengths(c.n);
  const std::int64_t lower_bound = balance::LowerBound(weights, c.num_parts, c.equal_size);
  balance::PartitionOptions options;
  options.num_parts = c.num_parts;
  options.equal_size = c.equal_size;
  balance::Partition partition;
  for (auto _ : state) {
    partition = balance::PartitionItems(weights, options);
    benchmark::DoNotOptimize(partition.indices.data());
    benchmark::ClobberMemory();
  }
  SetCommonCounters(state, c, partition.max_load, lower_bound);
  state.counters["refine_steps"] = static_cast<double>(partition.refine_steps);
}

void Cases(benchmark::internal::Benchmark* b) {
  b->ArgNames({"n", "k", "equal"});
  for (std::int64_t n : {1'000, 16'384, 1'000'000}) {
    for (std::int64_t k : {8, 128, 1024}) {
      for (std::int64_t equal_size : {0, 1}) b->Args({n, k, equal_size});
    }
  }
}

// 0.2 s per case: the small cases run hundreds of iterations; a 1M case stops after
// the first iteration or two (each takes about 0.1-1 s).
constexpr double kMinTimeSeconds = 0.2;

BENCHMARK(BM_KarmarkarKarp)->Apply(Cases)->Unit(benchmark::kMillisecond)->MinTime(kMinTimeSeconds);
BENCHMARK(BM_GreedyLpt)->Apply(Cases)->Unit(benchmark::kMillisecond)->MinTime(kMinTimeSeconds);
BENCHMARK(BM_PartitionRefined)
    ->Apply(Cases)
    ->Unit(benchmark::kMillisecond)
    ->MinTime(kMinTimeSeconds);

}  // namespace
