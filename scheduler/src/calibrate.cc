#include "rlsched/scheduler/calibrate.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <utility>

#include "rlsched/common/check.h"
#include "rlsched/common/error.h"

namespace rlsched::scheduler {
namespace {

constexpr double kMaxSeconds = 1e9;
// The generation fit stops when the bracket is this narrow, relative.
constexpr double kTolerance = 1e-5;
constexpr int kMaxBisections = 60;

void CheckMeasured(const SimulatorConfig& config, const MeasuredRun& m) {
  if (config.orchestrator.mode != Mode::kSync) {
    Fail("orchestrator.mode", "must be sync: calibration fits a measured sync run");
  }
  CheckReal("measured.generation_seconds", m.generation_seconds, 0, End::kOpen, kMaxSeconds);
  CheckReal("measured.train_seconds", m.train_seconds, 0, End::kOpen, kMaxSeconds);
  if (m.switch_seconds) {
    CheckReal("measured.switch_seconds", *m.switch_seconds, 0, End::kClosed, kMaxSeconds);
  }
  if (m.offload_seconds) {
    CheckReal("measured.offload_seconds", *m.offload_seconds, 0, End::kClosed, kMaxSeconds);
    if (!(*m.offload_seconds < m.train_seconds)) {
      FailBound("measured.offload_seconds", "< train_seconds (a part of it)", *m.offload_seconds);
    }
  }
  if (m.other_trainer_ranks.has_value() != m.other_train_seconds.has_value()) {
    Fail(m.other_trainer_ranks ? "measured.other_train_seconds" : "measured.other_trainer_ranks",
         "is needed with the other: a second trainer size is its ranks and its train_seconds");
  }
  if (m.other_trainer_ranks) {
    CheckInRange("measured.other_trainer_ranks", *m.other_trainer_ranks, 1, balance::kMaxParts);
    if (*m.other_trainer_ranks == config.step.num_ranks) {
      FailBound("measured.other_trainer_ranks",
                "another size than trainer_ranks (" + std::to_string(config.step.num_ranks) + ")",
                *m.other_trainer_ranks);
    }
    CheckReal("measured.other_train_seconds", *m.other_train_seconds, 0, End::kOpen, kMaxSeconds);
  }
}

// x with f(x) = target for an affine f, from its values at x0 and x1; at least 0.
double SolveAffine(const std::function<double(double)>& f, double x0, double x1, double target) {
  const double f0 = f(x0);
  const double f1 = f(x1);
  if (!(std::abs(f1 - f0) > 0)) return x0;
  return std::max(0.0, x0 + (target - f0) * (x1 - x0) / (f1 - f0));
}

// The trainer's compute per step: its time less the fixed parts.
double Compute(const SimulatorConfig& config, double train_seconds) {
  return train_seconds -
         static_cast<double>(config.orchestrator.train_calls_per_sync) *
             config.train_call_overhead_seconds -
         config.trainer_offload_seconds;
}

void FitTrainer(SimulatorConfig& config, const MeasuredRun& m, CalibrationResult& result) {
  if (m.offload_seconds) {
    config.trainer_offload_seconds = *m.offload_seconds;
    result.fitted.push_back("trainer_offload_seconds");
  }
  if (m.other_trainer_ranks) {
    const double t = Compute(config, m.train_seconds);
    const double other = Compute(config, *m.other_train_seconds);
    const double ranks = static_cast<double>(config.step.num_ranks);
    const double exponent =
        std::log(other / t) / std::log(ranks / static_cast<double>(*m.other_trainer_ranks));
    if (!(t > 0 && other > 0 && exponent > 0 && exponent <= 2)) {
      result.warnings.push_back(
          "other_train_seconds: no trainer_scaling_exponent in (0, 2] reaches it (the two sizes "
          "give " +
          NumberText(exponent) + "); the exponent stays " +
          NumberText(config.trainer_scaling_exponent));
    } else {
      config.trainer_scaling_exponent = exponent;
      config.trainer_reference_ranks = config.step.num_ranks;
      result.fitted.push_back("trainer_scaling_exponent");
      result.fitted.push_back("trainer_reference_ranks");
    }
  }
  const double guess = CostUnitForStepSeconds(config, m.train_seconds);
  config.seconds_per_cost_unit = SolveAffine(
      [&](double unit) {
        SimulatorConfig probe = config;
        probe.seconds_per_cost_unit = unit;
        return Simulate(probe).metrics.train_seconds_per_step;
      },
      guess, 2 * guess, m.train_seconds);
  if (!(config.seconds_per_cost_unit > 0)) config.seconds_per_cost_unit = guess;
  result.fitted.push_back("seconds_per_cost_unit");
}

void FitSwitch(SimulatorConfig& config, double measured, CalibrationResult& result) {
  const auto simulated = [&](double seconds) {
    SimulatorConfig probe = config;
    if (probe.orchestrator.colocated) {
      probe.release_seconds = probe.resume_seconds = seconds;
    } else {
      probe.weight_sync_seconds = seconds;
    }
    return Simulate(probe).metrics.switch_seconds_per_step;
  };
  const double x = SolveAffine(simulated, 0, std::max(1.0, measured), measured);
  if (config.orchestrator.colocated) {
    config.release_seconds = config.resume_seconds = x;
    result.fitted.push_back("release_seconds");
    result.fitted.push_back("resume_seconds");
  } else {
    config.weight_sync_seconds = x;
    result.fitted.push_back("weight_sync_seconds");
  }
}

double SimulatedGeneration(const SimulatorConfig& config, double decode_base) {
  SimulatorConfig probe = config;
  probe.engine.decode_base_seconds = decode_base;
  return Simulate(probe).metrics.generation_seconds_per_step;
}

void FitEngines(SimulatorConfig& config, double measured, CalibrationResult& result) {
  result.fitted.push_back("engine.decode_base_seconds");
  const double floor = SimulatedGeneration(config, 0);
  if (floor >= measured) {
    config.engine.decode_base_seconds = 0;
    result.warnings.push_back(
        "generation_seconds: no engine.decode_base_seconds reaches it: with 0 the engines "
        "generate in " +
        NumberText(floor) +
        " s per step; the given per-sequence and per-context costs, "
        "prefill speed or response lengths are slower than the measured run");
    return;
  }
  double lo = 0;
  double hi = std::max(config.engine.decode_base_seconds, 1e-3);
  while (SimulatedGeneration(config, hi) < measured) {
    lo = hi;
    hi *= 4;
    if (hi > 1e3) {
      config.engine.decode_base_seconds = hi;
      result.warnings.push_back(
          "generation_seconds: no engine.decode_base_seconds up to 1000 s reaches it");
      return;
    }
  }
  for (int i = 0; i < kMaxBisections && hi - lo > kTolerance * hi; ++i) {
    const double mid = (lo + hi) / 2;
    (SimulatedGeneration(config, mid) < measured ? lo : hi) = mid;
  }
  config.engine.decode_base_seconds = (lo + hi) / 2;
}

CalibratedFigure Figure(std::string name, std::string parameter, double measured,
                        double simulated) {
  return {.name = std::move(name),
          .parameter = std::move(parameter),
          .measured = measured,
          .simulated = simulated,
          .residual = measured > 0 ? (simulated - measured) / measured : 0.0};
}

}  // namespace

CalibrationResult Calibrate(const SimulatorConfig& config, const MeasuredRun& measured) {
  Validate(config);
  CheckMeasured(config, measured);
  CalibrationResult result;
  result.config = config;
  result.config.trace = false;
  FitTrainer(result.config, measured, result);
  if (measured.switch_seconds) FitSwitch(result.config, *measured.switch_seconds, result);
  FitEngines(result.config, measured.generation_seconds, result);
  const Metrics fitted = Simulate(result.config).metrics;
  result.figures.push_back(Figure("generation_seconds", "engine.decode_base_seconds",
                                  measured.generation_seconds, fitted.generation_seconds_per_step));
  result.figures.push_back(Figure("train_seconds", "seconds_per_cost_unit", measured.train_seconds,
                                  fitted.train_seconds_per_step));
  if (measured.switch_seconds) {
    result.figures.push_back(Figure("switch_seconds",
                                    result.config.orchestrator.colocated
                                        ? "release_seconds, resume_seconds"
                                        : "weight_sync_seconds",
                                    *measured.switch_seconds, fitted.switch_seconds_per_step));
  }
  result.config.trace = config.trace;
  return result;
}

}  // namespace rlsched::scheduler
