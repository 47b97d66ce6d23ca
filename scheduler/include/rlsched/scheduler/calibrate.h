// Calibration: the simulator's engine and trainer parameters fitted to one measured
// synchronous run, so that the simulator can predict the runs a user has not made.
//
// What a user measures on a sync run, per step (what the frameworks log: verl's
// timing_s/gen, timing_s/old_log_prob + timing_s/update_actor, the rest of the step):
// the engines' generation time, the trainer's time, and the switch between them (the
// weight sync; colocated, also the engines' release and resume). With their cluster
// and workload in a SimulatorConfig (engines, GPUs, batch, response lengths), Calibrate()
// fits, in this order:
//   1. the trainer: trainer_offload_seconds as measured (when given, taken out of the
//      compute); trainer_scaling_exponent from a second trainer size (when given:
//      t2 / t1 = (n1 / n2)^exponent, trainer_reference_ranks the measured run's ranks);
//      seconds_per_cost_unit so that a step trains in the measured time
//      (CostUnitForStepSeconds);
//   2. the switch (when given): colocated, release_seconds = resume_seconds (the
//      weight sync instead when even none of them makes the switch short enough);
//      otherwise weight_sync_seconds;
//   3. the engines: engine.decode_base_seconds (the fixed time of a decode step: kernel
//      launches, all-reduce latency, sampling — what no spec sheet gives), by bisection on
//      the simulated generation time, which grows with it; the per-sequence and
//      per-context costs and the prefill speed stay as given.
// Then it simulates the fitted config and reports, per measured figure (the second
// trainer size's too), the simulated value and the residual, with a warning naming the
// figure when no value of its parameter reaches it (e.g. a generation time below what the
// engines take with a zero fixed step time) or its residual is above 1%. The figures are
// means over the steps after orchestrator.warmup_steps, as the measured ones are.
//
// Pure (no I/O, clocks or threads); deterministic. Complexity: about 45 simulations of
// the config (Simulate()'s cost each), each handed `should_stop`.

#ifndef RLSCHED_SCHEDULER_CALIBRATE_H_
#define RLSCHED_SCHEDULER_CALIBRATE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "rlsched/scheduler/simulator.h"

namespace rlsched::scheduler {

// A measured sync run, seconds per step (means over the steady steps).
struct MeasuredRun {
  double generation_seconds = 0;         // > 0: the engines' generation
  double train_seconds = 0;              // > 0: the trainer's time (every call, log-probs included)
  std::optional<double> switch_seconds;  // >= 0: step − generation − training
  std::optional<double> offload_seconds;  // >= 0, < train_seconds: part of train_seconds
  // A second trainer size (both or neither): its ranks (>= 1, not the config's) and
  // its train_seconds (> 0), for the scaling exponent.
  std::optional<std::int64_t> other_trainer_ranks;
  std::optional<double> other_train_seconds;
};

// One measured figure against the fitted simulation.
struct CalibratedFigure {
  std::string name;       // "generation_seconds", "train_seconds", "switch_seconds"
  std::string parameter;  // the field fitted to it
  double measured = 0;
  double simulated = 0;
  double residual = 0;  // (simulated − measured) / measured; 0 when measured is 0
};

struct CalibrationResult {
  SimulatorConfig config;  // the fitted config
  // generation, training, then the switch and the second size if given
  std::vector<CalibratedFigure> figures;
  std::vector<std::string> fitted;    // the fields Calibrate() set
  std::vector<std::string> warnings;  // each names the figure it is about
};

// Throws FieldError naming the field ("measured.train_seconds", "orchestrator.mode":
// the run must be sync, "steps": more than the warm-up, ...) on invalid input, as
// Validate(config) does; rlsched::Stopped when `should_stop` says so.
CalibrationResult Calibrate(const SimulatorConfig& config, const MeasuredRun& measured,
                            const StopCheck& should_stop = {});

}  // namespace rlsched::scheduler

#endif  // RLSCHED_SCHEDULER_CALIBRATE_H_
