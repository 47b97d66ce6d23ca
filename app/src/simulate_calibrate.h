// `rlsched simulate --calibrate FILE`: the simulator calibrated to a measured sync run
// (rlsched/scheduler/calibrate.h). FILE is a rlsched.v1.MeasuredRun in protobuf's JSON
// mapping (generation_seconds, train_seconds, and optionally switch_seconds,
// offload_seconds, other_trainer_ranks with other_train_seconds); the cluster and the
// workload are the config the other flags and --config describe. Prints the fitted
// fields, each figure measured against simulated with its residual, the warnings, and
// the fitted config (to --config-out FILE, else after the table); with --json the
// CalibrationReport.

#ifndef RLSCHED_APP_SIMULATE_CALIBRATE_H_
#define RLSCHED_APP_SIMULATE_CALIBRATE_H_

#include <ostream>
#include <string>

#include "rlsched/v1/orchestrator.pb.h"

namespace rlsched::app {

struct CalibrateArgs {
  std::string measured;    // --calibrate FILE
  std::string config_out;  // --config-out FILE; empty: printed
  bool json = false;
};

// Reads the measured run, calibrates `config`, prints. Throws FieldError naming the
// flag or the field (measured.train_seconds in FILE, a config field) on bad input.
void RunCalibration(const CalibrateArgs& args, const v1::SimulatorConfig& config,
                    std::ostream& out);

}  // namespace rlsched::app

#endif  // RLSCHED_APP_SIMULATE_CALIBRATE_H_
