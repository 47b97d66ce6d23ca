#include "run_report.h"

#include <fmt/format.h>

#include "rlsched/wire/simulate_convert.h"

namespace rlsched::app {
namespace {

void AddRequests(const scheduler::RequestSummary& r, v1::RequestTelemetrySummary& requests) {
  requests.set_requests(r.requests);
  requests.set_generated_tokens(r.generated_tokens);
  requests.set_preemptions(r.preemptions);
  requests.set_interruptions(r.interruptions);
  requests.set_mean_seconds(r.mean_seconds);
  requests.set_p50_seconds(r.p50_seconds);
  requests.set_p99_seconds(r.p99_seconds);
  requests.set_max_seconds(r.max_seconds);
  requests.set_mean_first_token_seconds(r.mean_first_token_seconds);
  requests.set_p99_first_token_seconds(r.p99_first_token_seconds);
  requests.set_paused_seconds(r.paused_seconds);
}

void AddEngineLoad(const scheduler::EngineLoad& l, v1::EngineLoad& load) {
  load.set_engine(l.engine);
  load.set_heartbeats(l.heartbeats);
  load.set_running(l.running);
  load.set_waiting(l.waiting);
  load.set_max_running(l.max_running);
  load.set_max_waiting(l.max_waiting);
  load.set_mean_running(l.mean_running);
  load.set_mean_waiting(l.mean_waiting);
}

void AddEpoch(const scheduler::WeightSyncEpoch& e, v1::WeightSyncEpoch& epoch) {
  epoch.set_epoch(e.epoch);
  epoch.mutable_members()->Add(e.members.begin(), e.members.end());
  epoch.set_transfers(e.transfers);
  epoch.set_buckets(e.buckets);
  epoch.set_bytes(e.bytes);
  epoch.set_syncs(e.syncs);
}

}  // namespace

v1::RunReport ToRunReport(const scheduler::RuntimeStatus& status, const RunOutcome& outcome) {
  scheduler::SimulationReport as_report;
  as_report.metrics = status.metrics;
  as_report.counters = status.counters;
  const v1::SimulationReport converted = wire::ToSimulationReportMessage(as_report, false);
  v1::RunReport report;
  *report.mutable_metrics() = converted.metrics();
  *report.mutable_counters() = converted.counters();
  report.set_events(status.events);
  report.set_rejected_events(status.rejected_events);
  report.set_workers_refused(outcome.workers_refused);
  report.set_ignored_events(outcome.ignored_events);
  report.set_stuck_engines(outcome.stuck_engines);
  report.set_wall_seconds(outcome.wall_seconds);
  report.set_time_scale(outcome.time_scale);
  report.set_done(outcome.done);
  report.set_command_latency_count(status.command_latency.count);
  report.set_command_latency_p50_seconds(status.command_latency.p50_seconds);
  report.set_command_latency_p99_seconds(status.command_latency.p99_seconds);
  report.set_command_latency_max_seconds(status.command_latency.max_seconds);
  AddRequests(status.requests, *report.mutable_requests());
  for (const scheduler::EngineLoad& l : status.engine_load) {
    AddEngineLoad(l, *report.add_engine_load());
  }
  for (const scheduler::WeightSyncEpoch& e : status.weight_sync) {
    AddEpoch(e, *report.add_weight_sync());
  }
  report.set_weight_sync_replans(status.weight_sync_replans);
  return report;
}

std::string RunSummary(const scheduler::RuntimeStatus& status, const RunOutcome& outcome) {
  const scheduler::Metrics& m = status.metrics;
  return fmt::format(
      "run {}: {} steps, {} samples trained in {:.1f} s ({:.1f} s of wall time), {:.2f} "
      "samples/s, per step {:.2f} s (generation {:.2f} s, training {:.2f} s, trainer's wait "
      "{:.2f} s; steady state {:.2f} s), staleness max {}, events {} (refused {}, {} before "
      "the core), engines' version accounts {} ({} differing from the core's), requests with "
      "telemetry {} (mean {:.2f} s)\n",
      outcome.ending, status.counters.steps_finished, status.counters.trained, m.elapsed_seconds,
      outcome.wall_seconds, m.samples_per_second, m.seconds_per_step, m.generation_seconds_per_step,
      m.train_seconds_per_step, m.trainer_wait_seconds_per_step, m.steady_seconds_per_step,
      m.max_staleness, status.events, status.rejected_events, outcome.ignored_events,
      status.counters.version_reports, status.counters.version_corrections,
      status.requests.requests, status.requests.mean_seconds);
}

}  // namespace rlsched::app
