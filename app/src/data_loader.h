// data_loader.h — the prompts `rlsched run` feeds the decision core.
//
// Overview
//   The dataset's prompts in order, cycled (prompt ids modulo the config's
//   dataset_prompts), kept ahead of the trainer: EffectiveStaleness + 3 batches at the
//   start, one more batch (prompts_per_step x (1 + oversample), rounded up) per finished
//   step, and one prompt per filtered group. The loader is a target, not a schedule:
//   TopUp() posts whatever the counters say is due and was not posted yet. So a refill
//   does not wait for a step's end (groups filtered mid-step are replaced at once: a
//   run that filters many groups is not starved), and a resumed run whose log lost a
//   refill (the scheduler died between a step's end and its refill) is topped up.
//
// Thread-safety
//   TopUp and posted may be called from any thread (the runtime's step callback and the
//   program's main loop).

#ifndef RLSCHED_APP_DATA_LOADER_H_
#define RLSCHED_APP_DATA_LOADER_H_

#include <cstdint>
#include <mutex>
#include <optional>

#include "rlsched/scheduler/simulator.h"

namespace rlsched::app {

class DataLoader {
 public:
  // `posted`: prompts already posted (a resumed run's logged ones; 0 for a new run).
  // `config` outlives the loader.
  DataLoader(const scheduler::SimulatorConfig& config, std::int64_t posted);

  // The prompts due after `steps_finished` steps and `filtered_groups` filtered groups
  // and not posted yet (they count as posted once returned), or nullopt. O(prompts).
  std::optional<scheduler::PromptsAvailable> TopUp(std::int64_t steps_finished,
                                                   std::int64_t filtered_groups);

  std::int64_t posted() const;

 private:
  const scheduler::SimulatorConfig& config_;
  std::int64_t per_batch_;
  std::int64_t ahead_;  // prompts kept ahead at the start
  mutable std::mutex mutex_;
  std::int64_t posted_;
};

}  // namespace rlsched::app

#endif  // RLSCHED_APP_DATA_LOADER_H_
