// A small simulation for the scheduler's tests: 4 engines of 16, 8 trainer ranks,
// 16 prompts × 4 samples, 6 steps, lengths of mean ~245 tokens.

#ifndef RLSCHED_TESTS_SCHEDULER_SMALL_CONFIG_H_
#define RLSCHED_TESTS_SCHEDULER_SMALL_CONFIG_H_

#include "rlsched/scheduler/simulator.h"

namespace rlsched::scheduler {

inline SimulatorConfig SmallConfig() {
  SimulatorConfig config = DefaultSimulatorConfig();
  config.orchestrator.prompts_per_step = 16;
  config.orchestrator.samples_per_prompt = 4;
  config.steps = 6;
  config.engines = 4;
  config.engine.max_concurrent = 16;
  config.step.num_ranks = 8;
  config.lengths.mu = 5.5;
  config.lengths.max_tokens = 2048;
  config.dataset_prompts = 64;
  config.weight_sync_seconds = 0.5;
  // About the sync generation time of a step, for a balanced workload.
  config.seconds_per_cost_unit = 4e-3;
  config.check_invariants = true;
  return config;
}

}  // namespace rlsched::scheduler

#endif  // RLSCHED_TESTS_SCHEDULER_SMALL_CONFIG_H_
