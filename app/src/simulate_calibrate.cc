#include "simulate_calibrate.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>

#include "command_common.h"
#include "format.h"
#include "rlsched/common/error.h"
#include "rlsched/wire/json.h"
#include "rlsched/wire/simulate_convert.h"

namespace rlsched::app {
namespace {

constexpr std::int64_t kMaxMeasuredBytes = 1 << 20;

v1::MeasuredRun ReadMeasured(const std::string& path) {
  v1::MeasuredRun measured;
  ParseJsonFile("--calibrate", path, ReadWholeFile("--calibrate", path, kMaxMeasuredBytes),
                measured);
  return measured;
}

std::string Signed(double ratio) {
  return fmt::format("{}{:.2f}%", ratio >= 0 ? "+" : "", 100.0 * ratio);
}

void PrintReport(const v1::CalibrationReport& report, const std::string& config_out,
                 std::ostream& out) {
  const v1::SimulatorConfig& c = report.config();
  out << fmt::format("calibrated       a sync run{}: fitted {}; the rest as given\n",
                     c.orchestrator().colocated() ? " (colocated)" : "",
                     fmt::join(report.fitted(), ", "));
  out << fmt::format("{:<20}{:>12}{:>12}{:>11}   {}\n", "figure (per step)", "measured",
                     "simulated", "residual", "fitted");
  for (const v1::CalibratedFigure& f : report.figures()) {
    out << fmt::format("{:<20}{:>12}{:>12}{:>11}   {}\n", f.name(), FormatDuration(f.measured()),
                       FormatDuration(f.simulated()), Signed(f.residual()), f.parameter());
  }
  out << fmt::format(
      "fitted values    engine.decode_base_seconds {:.6g}, seconds_per_cost_unit {:.6g}, "
      "weight_sync_seconds {:.6g}, release_seconds {:.6g}, resume_seconds {:.6g}, "
      "trainer_offload_seconds {:.6g}, trainer_scaling_exponent {:.6g} (reference {} ranks)\n",
      c.engine().decode_base_seconds(), c.seconds_per_cost_unit(), c.weight_sync_seconds(),
      c.release_seconds(), c.resume_seconds(), c.trainer_offload_seconds(),
      c.trainer_scaling_exponent(), c.trainer_reference_ranks());
  for (const std::string& warning : report.warnings())
    out << "warning          " << warning << '\n';
  if (config_out.empty()) {
    out << "config           (for --config)\n" << wire::ToJson(c) << '\n';
  } else {
    out << fmt::format("config           written to {} (for --config)\n", config_out);
  }
}

}  // namespace

void RunCalibration(const CalibrateArgs& args, const v1::SimulatorConfig& config,
                    std::ostream& out) {
  v1::CalibrateRequest request;
  *request.mutable_config() = config;
  *request.mutable_measured() = ReadMeasured(args.measured);
  v1::CalibrationReport report;
  try {
    report = wire::SolveCalibrate(request);
  } catch (const FieldError& e) {
    if (e.field().starts_with("measured.")) {
      throw e.Renamed(fmt::format("--calibrate {}: {}", args.measured, e.field().substr(9)));
    }
    throw;
  }
  if (!args.config_out.empty()) {
    WriteWholeFile("--config-out", args.config_out, wire::ToJson(report.config()) + "\n");
  }
  if (args.json) {
    out << wire::ToJson(report) << '\n';
  } else {
    PrintReport(report, args.config_out, out);
  }
}

}  // namespace rlsched::app
