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

// Measured figures up to ~115 days a step: the fitted fields stay within their bounds.
constexpr double kMaxMeasuredSeconds = 1e7;
// The generation fit stops when the bracket is this narrow, relative; its search for an
// upper end stops at kMaxDecodeBase seconds a decode step.
constexpr double kTolerance = 1e-5;
constexpr int kMaxBisections = 60;
constexpr double kMaxDecodeBase = 1e3;
// A fitted figure further off than this, relative, is warned about.
constexpr double kWarnResidual = 0.01;

// The trainer's fixed time per step: its calls' overhead and the offload.
double FixedTrainSeconds(const SimulatorConfig& config, double offload) {
  return static_cast<double>(config.orchestrator.train_calls_per_sync) *
             config.train_call_overhead_seconds +
         offload;
}

void CheckSeconds(const char* field, double value, End lo_end) {
  CheckReal(field, value, 0, lo_end, kMaxMeasuredSeconds);
}

void CheckMeasured(const SimulatorConfig& config, const MeasuredRun& m) {
  if (config.orchestrator.mode != Mode::kSync) {
    Fail("orchestrator.mode", "must be sync: calibration fits a measured sync run");
  }
  if (config.steps <= config.orchestrator.warmup_steps) {
    FailBound("steps",
              "> orchestrator.warmup_steps (" + NumberText(config.orchestrator.warmup_steps) +
                  "): calibration compares the steps after the warm-up",
              config.steps);
  }
  CheckSeconds("measured.generation_seconds", m.generation_seconds, End::kOpen);
  CheckSeconds("measured.train_seconds", m.train_seconds, End::kOpen);
  if (m.switch_seconds) CheckSeconds("measured.switch_seconds", *m.switch_seconds, End::kClosed);
  if (m.offload_seconds) CheckSeconds("measured.offload_seconds", *m.offload_seconds, End::kClosed);
  const double fixed = FixedTrainSeconds(config, m.offload_seconds.value_or(0));
  const std::string above =
      "> the trainer's fixed time per step (train_calls_per_sync × "
      "train_call_overhead_seconds + offload_seconds = " +
      NumberText(fixed) + ")";
  if (!(m.train_seconds > fixed)) FailBound("measured.train_seconds", above, m.train_seconds);
  if (m.other_trainer_ranks.has_value() != m.other_train_seconds.has_value()) {
    Fail(m.other_trainer_ranks ? "measured.other_train_seconds" : "measured.other_trainer_ranks",
         "is needed with the other: a second trainer size is its ranks and its train_seconds");
  }
  if (!m.other_trainer_ranks) return;
  CheckInRange("measured.other_trainer_ranks", *m.other_trainer_ranks, 1, balance::kMaxParts);
  if (*m.other_trainer_ranks == config.step.num_ranks) {
    FailBound("measured.other_trainer_ranks",
              "another size than trainer_ranks (" + std::to_string(config.step.num_ranks) + ")",
              *m.other_trainer_ranks);
  }
  CheckSeconds("measured.other_train_seconds", *m.other_train_seconds, End::kOpen);
  if (!(*m.other_train_seconds > fixed)) {
    FailBound("measured.other_train_seconds", above, *m.other_train_seconds);
  }
}

// x >= 0 with f(x) = target for an affine f, from its values at x0 and x1.
double SolveAffine(const std::function<double(double)>& f, double x0, double x1, double target) {
  const double f0 = f(x0);
  const double f1 = f(x1);
  if (!(std::abs(f1 - f0) > 0)) return x0;
  return std::max(0.0, x0 + (target - f0) * (x1 - x0) / (f1 - f0));
}

double Residual(double simulated, double measured) {
  return measured > 0 ? (simulated - measured) / measured : 0.0;
}

// The fit in its steps, each simulating the config with one field changed.
class Fitter {
 public:
  Fitter(const SimulatorConfig& config, const StopCheck& should_stop)
      : config_(config), should_stop_(should_stop) {
    config_.trace = false;
  }

  Metrics Run(const SimulatorConfig& config) const {
    return Simulate(config, should_stop_).metrics;
  }

  void Trainer(const MeasuredRun& m) {
    if (m.offload_seconds) {
      config_.trainer_offload_seconds = *m.offload_seconds;
      Fitted("trainer_offload_seconds");
    }
    if (m.other_trainer_ranks) ScalingExponent(*m.other_trainer_ranks, *m.other_train_seconds, m);
    const double guess = CostUnitForStepSeconds(config_, m.train_seconds);
    const double unit = SolveAffine(
        [&](double x) {
          return Run(With(&SimulatorConfig::seconds_per_cost_unit, x)).train_seconds_per_step;
        },
        guess, 2 * guess, m.train_seconds);
    config_.seconds_per_cost_unit = unit > 0 ? unit : guess;
    Fitted("seconds_per_cost_unit");
  }

  // Colocated: release = resume, or the weight sync when even none of them is short
  // enough; else the weight sync.
  void Switch(double measured) {
    const auto weight_sync = [&](double x) {
      return Run(With(&SimulatorConfig::weight_sync_seconds, x)).switch_seconds_per_step;
    };
    if (config_.orchestrator.colocated) {
      const auto release_resume = [&](double x) {
        SimulatorConfig probe = config_;
        probe.release_seconds = probe.resume_seconds = x;
        return Run(probe).switch_seconds_per_step;
      };
      if (release_resume(0) <= measured) {
        config_.release_seconds = config_.resume_seconds =
            SolveAffine(release_resume, 0, std::max(1.0, measured), measured);
        Fitted("release_seconds");
        Fitted("resume_seconds");
        return;
      }
      config_.release_seconds = config_.resume_seconds = 0;
    }
    config_.weight_sync_seconds = SolveAffine(weight_sync, 0, std::max(1.0, measured), measured);
    Fitted("weight_sync_seconds");
  }

  void Engines(double measured) {
    Fitted("engine.decode_base_seconds");
    const double floor = Generation(0);
    if (floor >= measured) {
      config_.engine.decode_base_seconds = 0;
      Warn(
          "generation_seconds: no engine.decode_base_seconds reaches it: with 0 the engines "
          "generate in " +
          NumberText(floor) +
          " s per step; the given per-sequence and per-context costs, prefill speed or "
          "response lengths are slower than the measured run");
      return;
    }
    double lo = 0;
    double hi = std::max(config_.engine.decode_base_seconds, 1e-3);
    while (Generation(hi) < measured) {
      lo = hi;
      if (hi >= kMaxDecodeBase) {
        config_.engine.decode_base_seconds = kMaxDecodeBase;
        Warn("generation_seconds: no engine.decode_base_seconds up to 1000 s reaches it");
        return;
      }
      hi = std::min(4 * hi, kMaxDecodeBase);
    }
    for (int i = 0; i < kMaxBisections && hi - lo > kTolerance * hi; ++i) {
      const double mid = (lo + hi) / 2;
      (Generation(mid) < measured ? lo : hi) = mid;
    }
    config_.engine.decode_base_seconds = (lo + hi) / 2;
  }

  // The fitted config against each measured figure; a warning for one far off.
  CalibrationResult Result(const MeasuredRun& m) {
    const Metrics fitted = Run(config_);
    Figure("generation_seconds", "engine.decode_base_seconds", m.generation_seconds,
           fitted.generation_seconds_per_step);
    Figure("train_seconds", "seconds_per_cost_unit", m.train_seconds,
           fitted.train_seconds_per_step);
    if (m.switch_seconds) {
      Figure(
          "switch_seconds",
          config_.release_seconds > 0 ? "release_seconds, resume_seconds" : "weight_sync_seconds",
          *m.switch_seconds, fitted.switch_seconds_per_step);
    }
    if (m.other_trainer_ranks) {
      SimulatorConfig other = config_;
      other.step.num_ranks = *m.other_trainer_ranks;
      Figure("other_train_seconds", "trainer_scaling_exponent", *m.other_train_seconds,
             Run(other).train_seconds_per_step);
    }
    result_.config = config_;
    return std::move(result_);
  }

 private:
  SimulatorConfig With(double SimulatorConfig::*field, double value) const {
    SimulatorConfig probe = config_;
    probe.*field = value;
    return probe;
  }

  double Generation(double decode_base) const {
    SimulatorConfig probe = config_;
    probe.engine.decode_base_seconds = decode_base;
    return Run(probe).generation_seconds_per_step;
  }

  // t_other / t = (ranks / other_ranks)^exponent on the trainer's compute.
  void ScalingExponent(std::int64_t other_ranks, double other_seconds, const MeasuredRun& m) {
    const double fixed = FixedTrainSeconds(config_, m.offload_seconds.value_or(0));
    const double exponent =
        std::log((other_seconds - fixed) / (m.train_seconds - fixed)) /
        std::log(static_cast<double>(config_.step.num_ranks) / static_cast<double>(other_ranks));
    if (!(exponent > 0 && exponent <= 2)) {
      Warn(
          "other_train_seconds: no trainer_scaling_exponent in (0, 2] reaches it (the two "
          "sizes give " +
          NumberText(exponent) + "); the exponent stays " +
          NumberText(config_.trainer_scaling_exponent));
      return;
    }
    config_.trainer_scaling_exponent = exponent;
    config_.trainer_reference_ranks = config_.step.num_ranks;
    Fitted("trainer_scaling_exponent");
    Fitted("trainer_reference_ranks");
  }

  void Figure(std::string name, std::string parameter, double measured, double simulated) {
    const double residual = Residual(simulated, measured);
    if (std::abs(residual) > kWarnResidual && !WarnedAbout(name)) {
      Warn(name + ": the fitted " + parameter + " leaves it " + NumberText(100 * residual) +
           "% off (simulated " + NumberText(simulated) + " s, measured " + NumberText(measured) +
           " s)");
    }
    result_.figures.push_back({.name = std::move(name),
                               .parameter = std::move(parameter),
                               .measured = measured,
                               .simulated = simulated,
                               .residual = residual});
  }

  bool WarnedAbout(const std::string& name) const {
    return std::any_of(result_.warnings.begin(), result_.warnings.end(),
                       [&](const std::string& w) { return w.starts_with(name + ":"); });
  }

  void Fitted(std::string field) { result_.fitted.push_back(std::move(field)); }
  void Warn(std::string warning) { result_.warnings.push_back(std::move(warning)); }

  SimulatorConfig config_;
  const StopCheck& should_stop_;
  CalibrationResult result_;
};

}  // namespace

CalibrationResult Calibrate(const SimulatorConfig& config, const MeasuredRun& measured,
                            const StopCheck& should_stop) {
  Validate(config);
  CheckMeasured(config, measured);
  Fitter fitter(config, should_stop);
  fitter.Trainer(measured);
  if (measured.switch_seconds) fitter.Switch(*measured.switch_seconds);
  fitter.Engines(measured.generation_seconds);
  CalibrationResult result = fitter.Result(measured);
  result.config.trace = config.trace;
  return result;
}

}  // namespace rlsched::scheduler
