// orchestrator_convert.h — the decision core's events and commands on the wire, and the
// event log of a live run.
//
// Overview
//   Events (scheduler::Event) travel as rlsched.v1.OrchestratorEvent and commands
//   (scheduler::Command) as rlsched.v1.OrchestratorCommand (rollout.proto): the worker
//   protocol (worker.proto) carries them, and the event log stores them.
//   ToEvent(ToEventMessage(e)) == e; a command's step plan goes out as a PlanStepReply
//   (ToPlanStepReply, balance_convert.h), and commands are only sent, never read back.
//
//   The event log (`rlsched run --event-log FILE`) is a sequence of EventLogRecord
//   messages, each preceded by its size as a varint (protobuf's delimited format):
//   first a header with the run's config, then every event the core received (stamped
//   with its time) followed by the commands the core answered with (StartTrain without
//   its plan, which the runtime adds later). Replay() feeds the events to a fresh core
//   and compares its commands with the logged ones: a live run is deterministic given
//   its events.
//
// Thread-safety: the functions are pure; an EventLogWriter is not thread-safe.

#ifndef RLSCHED_WIRE_ORCHESTRATOR_CONVERT_H_
#define RLSCHED_WIRE_ORCHESTRATOR_CONVERT_H_

#include <cstdint>
#include <istream>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "rlsched/scheduler/orchestrator.h"
#include "rlsched/scheduler/simulator.h"
#include "rlsched/v1/rollout.pb.h"
#include "rlsched/v1/runtime.pb.h"

namespace rlsched::wire {

v1::OrchestratorEvent ToEventMessage(const scheduler::Event& event);
// Throws FieldError naming the field ("kind: must be set", "prompts_available.prompts[3]…"
// is left to the core, which checks ids and counts when it handles the event). O(size).
scheduler::Event ToEvent(const v1::OrchestratorEvent& message);
v1::OrchestratorCommand ToCommandMessage(const scheduler::Command& command);

// The decision core's options for a live run of `config` (a run.json): its
// orchestrator policy, num_steps = steps, and KeepUnlessAllEqual when
// filter_all_equal. No planner (the runtime plans each call). O(1).
scheduler::OrchestratorOptions RunOrchestratorOptions(const scheduler::SimulatorConfig& config);

// Appends records to a stream in the delimited format. Throws std::runtime_error when
// the stream fails.
class EventLogWriter {
 public:
  // Writes the header (the run's config, as ToSimulatorConfigMessage()).
  EventLogWriter(std::ostream& out, const scheduler::SimulatorConfig& config);
  void Append(const scheduler::Event& event);
  void Append(const scheduler::Command& command);
  void Flush();

 private:
  void Write(const v1::EventLogRecord& record);
  std::ostream& out_;
};

struct EventLog {
  scheduler::SimulatorConfig config;
  // In order: each event, then the commands it gave.
  std::vector<v1::EventLogRecord> records;
};

// Reads a whole log. Throws FieldError naming the record ("record 12: …") on a
// truncated or malformed record or a missing header. O(size).
EventLog ReadEventLog(std::istream& in);

struct ReplayResult {
  std::int64_t events = 0;
  std::int64_t commands = 0;
  // The first command that differs: its index among the commands, and both sides as
  // text (the logged one, the replayed one; "none" when one side ended).
  std::optional<std::int64_t> first_difference;
  std::string logged;
  std::string replayed;
  std::int64_t rejected_events = 0;  // refused by the replaying core (as in the run)
};

// Feeds the log's events to a fresh core (RunOrchestratorOptions(log.config)) and
// compares its commands with the logged ones (StartTrain without its plan).
// O(events + commands) plus the core's work.
ReplayResult Replay(const EventLog& log);

}  // namespace rlsched::wire

#endif  // RLSCHED_WIRE_ORCHESTRATOR_CONVERT_H_
