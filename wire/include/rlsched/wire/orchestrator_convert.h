// orchestrator_convert.h — the decision core's events and commands on the wire, and the
// event log of a live run.
//
// Overview
//   Events (scheduler::Event) travel as rlsched.v1.OrchestratorEvent and commands
//   (scheduler::Command) as rlsched.v1.OrchestratorCommand (orchestrator.proto): the worker
//   protocol (worker.proto) carries them, and the event log stores them.
//   ToEvent(ToEventMessage(e)) == e; a command's step plan goes out as a PlanStepReply
//   (ToPlanStepReply, balance_convert.h), and commands are only sent, never read back.
//
//   The event log (`rlsched run --event-log FILE`) is a sequence of EventLogRecord
//   messages, each preceded by its size as a varint (protobuf's delimited format):
//   first a header with the run's config (and its weight layout, when it has one), then
//   every event the core received (stamped with its time) followed by the commands the
//   core answered with (StartTrain without its plan, which the runtime adds later). A
//   resumed run (`rlsched run --resume`) appends to the same log. Replay() feeds the events to a
//   fresh core and compares its commands with the logged ones: a live run is deterministic given
//   its events.
//
// Thread-safety: the functions are pure.

#ifndef RLSCHED_WIRE_ORCHESTRATOR_CONVERT_H_
#define RLSCHED_WIRE_ORCHESTRATOR_CONVERT_H_

#include <cstdint>
#include <istream>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "rlsched/scheduler/orchestrator.h"
#include "rlsched/scheduler/simulator.h"
#include "rlsched/v1/orchestrator.pb.h"
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

// The first records of a run's event log: the header (the run's config, as
// ToSimulatorConfigMessage()), then the weight layout when `layout` is given. O(size).
std::string EventLogHeader(const scheduler::SimulatorConfig& config,
                           const v1::ReshardRequest* layout);
// Appends to `out` the records of an event and of the commands the core gave for it, in
// the delimited format (StartTrain without its plan). O(size).
void AppendEventRecords(const scheduler::Event& event, std::span<const scheduler::Command> commands,
                        std::string& out);

struct EventLog {
  v1::SimulatorConfig header;  // as logged
  scheduler::SimulatorConfig config;
  std::optional<v1::ReshardRequest> weight_layout;
  // In order: each event, then the commands it gave.
  std::vector<v1::EventLogRecord> records;
  // The bytes up to the end of the last whole record, and those of a record cut short
  // after it (a log whose writer died mid-write; read with torn_tail).
  std::int64_t whole_bytes = 0;
  std::int64_t torn_bytes = 0;
};

// Reads a whole log. Throws FieldError naming the record ("record 12: …") on a
// malformed record, a missing header or (unless `torn_tail`) a last record cut short;
// with `torn_tail` such a record is left out and counted in torn_bytes. O(size).
EventLog ReadEventLog(std::istream& in, bool torn_tail = false);

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
