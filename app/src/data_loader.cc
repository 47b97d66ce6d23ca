#include "data_loader.h"

#include <cmath>

#include "rlsched/scheduler/orchestrator.h"

namespace rlsched::app {

DataLoader::DataLoader(const scheduler::SimulatorConfig& config, std::int64_t posted)
    : config_(config),
      per_batch_(static_cast<std::int64_t>(
          std::ceil((1.0 + config.orchestrator.oversample) *
                    static_cast<double>(config.orchestrator.prompts_per_step)))),
      ahead_((scheduler::EffectiveStaleness(config.orchestrator) + 3) * per_batch_),
      posted_(posted) {}

std::optional<scheduler::PromptsAvailable> DataLoader::TopUp(std::int64_t steps_finished,
                                                             std::int64_t filtered_groups) {
  std::lock_guard lock(mutex_);
  const std::int64_t due = ahead_ + steps_finished * per_batch_ + filtered_groups;
  if (due <= posted_) return std::nullopt;
  scheduler::PromptsAvailable event;
  event.prompts.reserve(static_cast<std::size_t>(due - posted_));
  for (; posted_ < due; ++posted_) {
    const std::int64_t id = posted_ % config_.dataset_prompts;
    event.prompts.push_back(
        {.id = id, .prompt_tokens = scheduler::WorkloadPromptTokens(config_, id)});
  }
  return event;
}

std::int64_t DataLoader::posted() const {
  std::lock_guard lock(mutex_);
  return posted_;
}

}  // namespace rlsched::app
