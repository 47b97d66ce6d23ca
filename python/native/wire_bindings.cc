// rlsched._native's rlsched.v1 part (wire_bindings.h): the decision core driven from
// Python, and Solve() in process.
//
// Overview
//   Messages cross the boundary serialized (bytes), so the Python side works with its own
//   protobuf classes (rlsched.v1.orchestrator_pb2) and every conversion is the wire library's:
//   a config is a rlsched.v1.SimulatorConfig (binary or its JSON mapping, parsed as
//   `rlsched run --config` parses it) made into the core's options by
//   wire::ToSimulatorConfig() and wire::RunOrchestratorOptions(); an event is a
//   rlsched.v1.OrchestratorEvent read by wire::ToEvent(); each command goes back as a
//   rlsched.v1.OrchestratorCommand written by wire::ToCommandMessage(); the counters
//   and metrics as the simulation report's messages (wire::ToSimulationReportMessage()).
//   The GIL is released while messages are parsed, the core decides and the commands are
//   written. Bad input raises ValueError with a `field` attribute: the config's field
//   path ("orchestrator.prompts_per_step"), or the event's ("engine_joined.engine",
//   "events[3].generation_finished.sample" in a batch).
//
// Thread-safety: an Orchestrator object is not thread-safe (as the core): drive it from
// one thread, or serialise the calls; a call made while another thread's is running
// raises RuntimeError instead of racing. solve() is pure.
#include "wire_bindings.h"

#include <google/protobuf/util/json_util.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "rlsched/balance/plan_step.h"
#include "rlsched/common/check.h"
#include "rlsched/common/error.h"
#include "rlsched/scheduler/orchestrator.h"
#include "rlsched/scheduler/simulator.h"
#include "rlsched/v1/orchestrator.pb.h"
#include "rlsched/v1/runtime.pb.h"
#include "rlsched/v1/service.pb.h"
#include "rlsched/wire/orchestrator_convert.h"
#include "rlsched/wire/simulate_convert.h"
#include "rlsched/wire/solve.h"

namespace py = pybind11;

namespace rlsched::python {
namespace {

namespace s = rlsched::scheduler;
namespace v1 = rlsched::v1;

// A ValueError with a `field` attribute (as the module's translator raises).
[[noreturn]] void RaiseValueError(const std::string& message, const std::string& field) {
  py::object error = py::reinterpret_borrow<py::object>(PyExc_ValueError)(message);
  error.attr("field") = field;
  PyErr_SetObject(PyExc_ValueError, error.ptr());
  throw py::error_already_set();
}

// The event's kind as orchestrator.proto names it ("engine_joined"), or "event".
std::string KindName(const v1::OrchestratorEvent& message) {
  if (message.kind_case() == v1::OrchestratorEvent::KIND_NOT_SET) return "event";
  const auto* field = message.GetDescriptor()->FindFieldByNumber(message.kind_case());
  return field != nullptr ? field->name() : "event";
}

double TimeOf(const s::Event& event) {
  return std::visit([](const auto& e) { return e.time; }, event);
}

class Orchestrator {
 public:
  // Each call holds the object: a second thread's call meanwhile raises RuntimeError
  // instead of racing (the core is not thread-safe).
  class Busy {
   public:
    explicit Busy(std::mutex& mutex) : lock_(mutex, std::try_to_lock) {
      if (!lock_.owns_lock()) {
        throw std::runtime_error(
            "Orchestrator: called from two threads at once (it is not thread-safe; serialise "
            "the calls)");
      }
    }

   private:
    std::unique_lock<std::mutex> lock_;
  };

  // `config`: a serialized rlsched.v1.SimulatorConfig, or its JSON text when `json`.
  Orchestrator(const std::string& config_bytes, bool json, bool plan) {
    v1::SimulatorConfig message;
    if (json) {
      const auto status = google::protobuf::util::JsonStringToMessage(config_bytes, &message);
      if (!status.ok()) {
        rlsched::Fail("config",
                      "not a JSON rlsched.v1.SimulatorConfig: " + std::string(status.message()));
      }
    } else if (!message.ParseFromString(config_bytes)) {
      rlsched::Fail("config", "not a serialized rlsched.v1.SimulatorConfig");
    }
    config_ = wire::ToSimulatorConfig(message);
    s::OrchestratorOptions options = wire::RunOrchestratorOptions(config_);
    if (plan) {
      // As the simulator plans: PlanStep() with the config's step options.
      options.planner = [step = config_.step](std::span<const std::int64_t> lengths,
                                              std::span<const std::int64_t> groups) {
        return balance::PlanStep(lengths, groups, step);
      };
    }
    core_.emplace(std::move(options));
  }

  // One serialized event; its commands, serialized.
  std::vector<py::bytes> Handle(const std::string& event) {
    const Busy busy(mutex_);
    std::vector<std::string> commands;
    std::optional<FieldError> error;
    {
      const py::gil_scoped_release release;
      error = Apply(event, commands);
    }
    if (error) RaiseValueError(error->what(), error->field());
    return ToBytes(commands);
  }

  // Serialized events in order; the commands of each. Stops at the first refused
  // event: ValueError naming "events[i]." + its field, with the attributes `handled`
  // (i) and `commands` (those of events[:i], which stay applied).
  py::list HandleMany(const std::vector<std::string>& events) {
    const Busy busy(mutex_);
    std::vector<std::vector<std::string>> commands(events.size());
    std::optional<FieldError> error;
    std::size_t handled = 0;
    {
      const py::gil_scoped_release release;
      for (; handled < events.size(); ++handled) {
        error = Apply(events[handled], commands[handled]);
        if (error) break;
      }
    }
    py::list out;
    for (std::size_t i = 0; i < handled; ++i) out.append(ToBytes(commands[i]));
    if (error) {
      const FieldError within = error->Within("events[" + std::to_string(handled) + "]");
      py::object value_error = py::reinterpret_borrow<py::object>(PyExc_ValueError)(within.what());
      value_error.attr("field") = within.field();
      value_error.attr("handled") = handled;
      value_error.attr("commands") = out;
      PyErr_SetObject(PyExc_ValueError, value_error.ptr());
      throw py::error_already_set();
    }
    return out;
  }

  py::bytes Counters() const {
    const Busy busy(mutex_);
    return py::bytes(Report(last_time_).counters().SerializeAsString());
  }

  py::bytes Metrics(std::optional<double> now) const {
    const Busy busy(mutex_);
    return py::bytes(Report(Now(now)).metrics().SerializeAsString());
  }

  // A rlsched.v1.RunReport: metrics and counters up to `now`, events handled and
  // refused, done (the figures `rlsched run --json` prints; no wall-clock fields).
  py::bytes RunReport(std::optional<double> now) const {
    const Busy busy(mutex_);
    v1::SimulationReport report = Report(Now(now));
    v1::RunReport message;
    *message.mutable_metrics() = std::move(*report.mutable_metrics());
    *message.mutable_counters() = std::move(*report.mutable_counters());
    message.set_events(events_);
    message.set_rejected_events(rejected_);
    message.set_done(core_->done());
    message.set_time_scale(1);
    return py::bytes(message.SerializeAsString());
  }

  // The config as run, every field set (wire::ToSimulatorConfigMessage()).
  py::bytes Config() const {
    return py::bytes(wire::ToSimulatorConfigMessage(config_).SerializeAsString());
  }

  // The last StartTrain's samples: (sample, response_tokens, [(version, first_token)]).
  py::list LastBatch() const {
    const Busy busy(mutex_);
    py::list out;
    for (const s::TrainedSample& sample : core_->last_batch()) {
      py::list spans;
      for (const s::VersionSpan& span : sample.spans) {
        spans.append(py::make_tuple(span.version, span.first_token));
      }
      out.append(py::make_tuple(sample.sample, sample.response_tokens, std::move(spans)));
    }
    return out;
  }

  // Throws std::logic_error (RuntimeError) naming the first broken invariant.
  void CheckInvariants() const {
    const Busy busy(mutex_);
    const py::gil_scoped_release release;
    core_->CheckInvariants();
  }

  const s::SimulatorConfig& simulator_config() const { return config_; }
  std::int64_t latest_version() const {
    const Busy busy(mutex_);
    return core_->latest_version();
  }
  bool done() const {
    const Busy busy(mutex_);
    return core_->done();
  }
  std::int64_t events() const {
    const Busy busy(mutex_);
    return events_;
  }
  std::int64_t rejected_events() const {
    const Busy busy(mutex_);
    return rejected_;
  }
  std::optional<double> last_time() const {
    const Busy busy(mutex_);
    return events_ > 0 ? std::optional<double>(last_time_) : std::nullopt;
  }

 private:
  // Parses and handles one event; the error (the core unchanged) or nothing. Called
  // without the GIL.
  std::optional<FieldError> Apply(const std::string& bytes, std::vector<std::string>& out) {
    v1::OrchestratorEvent message;
    if (!message.ParseFromString(bytes)) {
      ++rejected_;
      return FieldError("event", "not a serialized rlsched.v1.OrchestratorEvent");
    }
    try {
      const s::Event event = wire::ToEvent(message);
      commands_.clear();
      core_->Handle(event, commands_);
      ++events_;
      last_time_ = TimeOf(event);
    } catch (const FieldError& e) {
      ++rejected_;
      return e.Within(KindName(message));
    } catch (const std::invalid_argument& e) {
      ++rejected_;
      return FieldError(KindName(message), e.what());
    }
    out.reserve(out.size() + commands_.size());
    for (const s::Command& command : commands_) {
      out.push_back(wire::ToCommandMessage(command).SerializeAsString());
    }
    return std::nullopt;
  }

  static std::vector<py::bytes> ToBytes(const std::vector<std::string>& commands) {
    std::vector<py::bytes> out;
    out.reserve(commands.size());
    for (const std::string& command : commands) out.emplace_back(command);
    return out;
  }

  double Now(std::optional<double> now) const {
    if (!now) return last_time_;
    if (!(*now >= last_time_)) {
      rlsched::FailBound("now", ">= the last event's time " + NumberText(last_time_), *now);
    }
    return *now;
  }

  v1::SimulationReport Report(double now) const {
    s::SimulationReport report;
    report.metrics = core_->metrics(now);
    report.counters = core_->counters();
    report.events = events_;
    return wire::ToSimulationReportMessage(report, /*include_trace=*/false);
  }

  mutable std::mutex mutex_;
  s::SimulatorConfig config_;
  std::optional<s::Orchestrator> core_;
  std::vector<s::Command> commands_;
  std::int64_t events_ = 0;
  std::int64_t rejected_ = 0;
  double last_time_ = 0;
};

// A serialized rlsched.v1.Request answered as the daemon answers it (wire::Solve()).
py::bytes Solve(const std::string& request_bytes) {
  std::string reply;
  {
    const py::gil_scoped_release release;
    v1::Request request;
    if (!request.ParseFromString(request_bytes)) {
      reply = wire::ErrorReply("", v1::ERROR_CODE_INVALID_ARGUMENT,
                               "request: not a serialized rlsched.v1.Request", "request")
                  .SerializeAsString();
    } else {
      reply = wire::Solve(request).SerializeAsString();
    }
  }
  return py::bytes(reply);
}

// The core's own time for these events: `repeats` runs of a fresh core (the config's
// options, as Orchestrator builds them) over the events, converted before the clock
// starts; seconds per run, timed in C++ around Handle() alone. The reference of
// benchmarks/python_orchestrator.py.
std::vector<double> TimeReplay(const std::string& config, bool json,
                               const std::vector<std::string>& events, std::int64_t repeats) {
  rlsched::CheckAtLeast("repeats", repeats, 1);
  const Orchestrator probe(config, json, false);  // parses and validates the config
  const s::OrchestratorOptions options = wire::RunOrchestratorOptions(probe.simulator_config());
  std::vector<s::Event> parsed;
  parsed.reserve(events.size());
  for (std::size_t i = 0; i < events.size(); ++i) {
    v1::OrchestratorEvent event;
    if (!event.ParseFromString(events[i])) {
      rlsched::Fail("events[" + std::to_string(i) + "]",
                    "not a serialized rlsched.v1.OrchestratorEvent");
    }
    parsed.push_back(wire::ToEvent(event));
  }
  std::vector<double> seconds;
  const py::gil_scoped_release release;
  std::vector<s::Command> commands;
  for (std::int64_t r = 0; r < repeats; ++r) {
    s::Orchestrator core(options);
    const auto start = std::chrono::steady_clock::now();
    for (const s::Event& event : parsed) {
      commands.clear();
      core.Handle(event, commands);
    }
    const auto stop = std::chrono::steady_clock::now();
    seconds.push_back(std::chrono::duration<double>(stop - start).count());
  }
  return seconds;
}

}  // namespace

void RegisterWire(py::module_& m) {
  m.attr("HAS_WIRE") = true;
  m.def("_time_replay", &TimeReplay, py::arg("config"), py::arg("json"), py::arg("events"),
        py::arg("repeats") = 1,
        "Seconds of each of `repeats` runs of a fresh core over the serialized events, timed "
        "in C++ around Handle() alone (for the benchmark).");
  m.def("solve", &Solve, py::arg("request"),
        "wire::Solve(): a serialized rlsched.v1.Request answered in process as `rlsched "
        "serve` answers it; the serialized rlsched.v1.Reply (errors as Error replies).");
  py::class_<Orchestrator>(m, "Orchestrator",
                           "The decision core (rlsched/scheduler/orchestrator.h) over "
                           "serialized rlsched.v1 messages; see rlsched.Orchestrator.")
      .def(py::init<const std::string&, bool, bool>(), py::arg("config"), py::arg("json") = false,
           py::arg("plan") = false)
      .def("handle", &Orchestrator::Handle, py::arg("event"),
           "A serialized OrchestratorEvent; the serialized OrchestratorCommands it gave.")
      .def("handle_many", &Orchestrator::HandleMany, py::arg("events"),
           "Serialized events in order; a list of each one's commands (serialized).")
      .def("counters", &Orchestrator::Counters, "A serialized OrchestratorCounters.")
      .def("metrics", &Orchestrator::Metrics, py::arg("now") = py::none(),
           "A serialized OrchestratorMetrics up to `now` (default: the last event's time).")
      .def("report", &Orchestrator::RunReport, py::arg("now") = py::none(),
           "A serialized RunReport (metrics, counters, events, rejected_events, done).")
      .def("config", &Orchestrator::Config, "The serialized SimulatorConfig as run.")
      .def("last_batch", &Orchestrator::LastBatch,
           "The last StartTrain's samples: (sample, response_tokens, [(version, first_token)]).")
      .def("check_invariants", &Orchestrator::CheckInvariants,
           "Raises RuntimeError naming the first broken invariant.")
      .def_property_readonly("latest_version", &Orchestrator::latest_version)
      .def_property_readonly("done", &Orchestrator::done)
      .def_property_readonly("events", &Orchestrator::events)
      .def_property_readonly("rejected_events", &Orchestrator::rejected_events)
      .def_property_readonly("last_time", &Orchestrator::last_time);
}

}  // namespace rlsched::python
