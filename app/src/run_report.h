// run_report.h — what `rlsched run` prints at its end: the rlsched.v1.RunReport (--json)
// or a one-line summary.
//
// Overview
//   The runtime's status (counters, metrics, telemetry, loads, weight-sync epochs) and
//   the worker server's counts (refused workers, events refused before the core, engines
//   dropped as stuck), with how the run ended.

#ifndef RLSCHED_APP_RUN_REPORT_H_
#define RLSCHED_APP_RUN_REPORT_H_

#include <cstdint>
#include <string>

#include "rlsched/scheduler/runtime.h"
#include "rlsched/v1/runtime.pb.h"

namespace rlsched::app {

// How the run ended, and what the worker server counted.
struct RunOutcome {
  bool done = false;        // the steps finished
  std::string ending;       // "done", "stopped by SIGTERM", "stopped (timeout)"
  double wall_seconds = 0;  // since the start
  double time_scale = 1;    // wall seconds per run second
  std::int64_t workers_refused = 0;
  std::int64_t ignored_events = 0;  // refused by the server, before the core
  std::int64_t stuck_engines = 0;
};

// The RunReport of a run. O(engines + epochs).
v1::RunReport ToRunReport(const scheduler::RuntimeStatus& status, const RunOutcome& outcome);

// The one-line summary `rlsched run` prints without --json (with its newline).
std::string RunSummary(const scheduler::RuntimeStatus& status, const RunOutcome& outcome);

}  // namespace rlsched::app

#endif  // RLSCHED_APP_RUN_REPORT_H_
