// Uses the installed rlsched::balance and rlsched::scheduler (and rlsched::wire when
// installed); exits non-zero if the partition, a small simulation or a solved request
// is wrong.

#include <cstdint>
#include <cstdio>
#include <vector>

#include "rlsched/balance/partition.h"
#include "rlsched/scheduler/simulator.h"
#ifdef RLSCHED_CONSUMER_WIRE
#include "rlsched/wire/solve.h"
#endif

int main() {
  const std::vector<std::int64_t> lengths = {4096, 512, 700, 3000, 2048, 128, 900, 1500};
  rlsched::balance::PartitionOptions options;
  options.num_parts = 3;
  const rlsched::balance::Partition p = rlsched::balance::PartitionItems(lengths, options);

  int failures = 0;
  auto check = [&failures](bool ok, const char* what) {
    if (!ok) {
      std::fprintf(stderr, "consumer: FAILED: %s\n", what);
      ++failures;
    }
  };
  check(p.num_parts() == 3, "three parts");
  std::vector<int> seen(lengths.size(), 0);
  std::int64_t max_load = 0;
  for (std::int64_t part = 0; part < p.num_parts(); ++part) {
    std::int64_t load = 0;
    for (const std::int64_t item : p.part(part)) {
      if (item < 0 || item >= static_cast<std::int64_t>(lengths.size())) {
        check(false, "index in range");
        continue;
      }
      ++seen[static_cast<std::size_t>(item)];
      load += lengths[static_cast<std::size_t>(item)];
    }
    check(load == p.loads[static_cast<std::size_t>(part)], "load is the sum of the part");
    if (load > max_load) max_load = load;
  }
  for (const int count : seen) check(count == 1, "every item in exactly one part");
  check(p.max_load == max_load, "max_load");
  // max(4096, ceil(12884 / 3)) = 4295.
  check(p.lower_bound == 4295, "lower bound");
  check(rlsched::balance::LowerBound(lengths, 3, false) == 4295, "LowerBound()");
  check(p.max_load >= p.lower_bound, "max load >= lower bound");
  // The orchestrator in the simulator: 2 engines, 2 prompts × 2 samples, 3 steps.
  rlsched::scheduler::SimulatorConfig sim = rlsched::scheduler::DefaultSimulatorConfig();
  sim.engines = 2;
  sim.step.num_ranks = 2;
  sim.steps = 3;
  sim.orchestrator.prompts_per_step = 2;
  sim.orchestrator.samples_per_prompt = 2;
  const rlsched::scheduler::SimulationReport report = rlsched::scheduler::Simulate(sim);
  check(report.counters.steps_finished == 3, "three steps simulated");
  check(report.counters.trained == 3 * 2 * 2, "every batch trained");
  std::printf("consumer: max load %lld, lower bound %lld, gap %.4f\n",
              static_cast<long long>(p.max_load), static_cast<long long>(p.lower_bound), p.gap);
#ifdef RLSCHED_CONSUMER_WIRE
  // A Request solved in process, as the daemon would.
  rlsched::v1::Request request;
  request.set_id("c");
  for (const std::int64_t length : lengths) request.mutable_balance()->add_lengths(length);
  request.mutable_balance()->set_num_parts(3);
  const rlsched::v1::Reply reply = rlsched::wire::Solve(request);
  check(reply.id() == "c" && reply.has_balance(), "wire::Solve answers the balance request");
  check(reply.balance().parts_size() == 3, "three parts from wire::Solve");
#endif
  return failures == 0 ? 0 : 1;
}
