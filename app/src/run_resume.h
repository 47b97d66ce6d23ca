// run_resume.h — `rlsched run --resume LOG`: what a run continues from its event log.
//
// Overview
//   The log (its records written before the commands they caused left, see
//   event_log_file.h) holds the run's config and weight layout, then every event the
//   decision core received and the commands it gave. A resumed run is given the same
//   flags again: the config and layout they make must be the logged ones (the first
//   difference is refused, naming the field). The events go to a fresh core
//   (scheduler::RuntimeResume) and the run goes on from there: the clock at the last
//   event's time, the data loader after the prompts already posted, the trainer call
//   the log left unfinished sent again, the engines the core knows awaited (they
//   reattach and say what they hold), the log appended to.

#ifndef RLSCHED_APP_RUN_RESUME_H_
#define RLSCHED_APP_RUN_RESUME_H_

#include <cstdint>
#include <optional>
#include <string>

#include "rlsched/scheduler/runtime.h"
#include "rlsched/v1/reshard.pb.h"
#include "rlsched/v1/orchestrator.pb.h"
#include "rlsched/wire/orchestrator_convert.h"

namespace rlsched::app {

struct ResumedRun {
  scheduler::RuntimeResume resume;  // the events
  double last_time = 0;             // of the last event, run seconds
  std::int64_t prompts_posted = 0;  // over the logged PromptsAvailable events
  std::int64_t whole_bytes = 0;     // the log's whole records (a torn last one is cut off)
  std::int64_t torn_bytes = 0;
};

// Reads the log at `path` and checks that `config` and `layout` (what the flags of the
// resumed run make) are the logged ones. Throws std::invalid_argument naming --resume,
// the file and the first difference, or the record that cannot be read. O(log size).
ResumedRun ReadResumedRun(const std::string& path, const v1::SimulatorConfig& config,
                          const std::optional<v1::ReshardRequest>& layout);

// The first difference between two messages of one type ("orchestrator.max_staleness:
// 1 -> 2"), or nullopt when equal. O(size).
std::optional<std::string> FirstDifference(const google::protobuf::Message& logged,
                                           const google::protobuf::Message& given);

}  // namespace rlsched::app

#endif  // RLSCHED_APP_RUN_RESUME_H_
