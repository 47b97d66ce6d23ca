// run_command.h — `rlsched run`: a live run, the runtime (rlsched/scheduler/runtime.h)
// driving engine and trainer workers attached over gRPC (worker_server.h); and
// `rlsched replay`: a run's event log fed to a fresh decision core.
//
// Overview
//   run reads a run config (a JSON rlsched.v1.SimulatorConfig: the fields that mean the
//   same thing in a simulation and a run, so one config can be simulated and run),
//   listens on --listen, and waits for workers; with --emulated-engines N and
//   --emulated-trainer it starts emulated workers as child processes (Python,
//   python/rlsched/worker/emulated.py: real processes on real sockets) whose time runs
//   --time-scale times faster. The data loader is the program: prompts 0, 1, 2, … of
//   the config's dataset (cycled), with the config's prompt lengths, posted ahead of
//   the trainer. A line per finished step goes to stderr; --json prints a
//   rlsched.v1.RunReport at the end. --event-log writes every event and command
//   (wire/orchestrator_convert.h, event_log_file.h), which `rlsched replay` checks;
//   --resume LOG continues the run a killed scheduler recorded there (run_resume.h):
//   its workers reattach (emulated ones run detached from the scheduler and wait for
//   it), and those that do not within --reattach-window are taken as lost.
//
//   The weight layout: with --model (a Hugging Face config.json or its model
//   folder, read as `reshard` reads it: ReadModelConfig), --train and --infer
//   (the values and topology options `rlsched reshard` takes; --infer's replicas, when
//   given, must be the run's engines), the runtime plans each weight sync for its
//   membership (scheduler::WeightSyncLayout) and each engine receives its part of the
//   plan with its SyncWeights, the trainer the senders' part (worker_server.h), in a
//   transfer group of --weight-sync-backend (gloo, nccl) meeting at
//   --weight-sync-address. A layout the planner refuses is refused before the run
//   starts, naming the option and the field ("--train (train.pp): ...").

#ifndef RLSCHED_APP_RUN_COMMAND_H_
#define RLSCHED_APP_RUN_COMMAND_H_

#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>

#include "reshard_command.h"

namespace rlsched::app {

struct RunArgs {
  std::string config;      // run.json; empty: the default config
  std::string listen;      // empty: a Unix socket in the temporary directory
  std::string token_file;  // empty: a random token (emulated workers only)
  std::string tls_cert;    // PEM certificate chain; with tls_key, workers attach over TLS
  std::string tls_key;     // PEM private key
  std::optional<std::int64_t> steps;
  std::int64_t emulated_engines = 0;
  bool emulated_trainer = false;
  // Engines attached before the first prompts go out; unset: the emulated engines (0
  // without them: at once).
  std::optional<std::int64_t> wait_for_engines;
  std::optional<double> time_scale;  // unset: 0.005 with emulated workers, else 1
  std::string event_log;
  bool event_log_fsync = false;  // fdatasync after each write of the event log
  std::string resume;            // continue the run this event log recorded (appended to)
  double reattach_seconds = 30;  // a resumed run: how long the workers have to reattach
  std::string emulated_reports;  // a folder: each emulated worker writes what it counted
  std::string trace;
  bool json = false;
  double heartbeat_timeout_seconds = 10;
  double hello_timeout_seconds = 10;
  std::int64_t max_waiting_streams = 64;  // streams waiting for their Hello at once; 0: no cap
  std::optional<double> stuck_timeout_seconds;  // unset: 10 x heartbeat_timeout_seconds
  double timeout_seconds = 600;
  // The weight layout, as `rlsched reshard` takes it (--model, --train, --infer and the
  // topology options; replicas: the run's engines): with it every SyncWeights names
  // the engine's part of its membership's weight-sync plan, sent over the stream.
  ReshardArgs weights;
  std::string weight_sync_backend = "gloo";  // the transfer group's backend
  std::string weight_sync_address;           // HOST:PORT where the group meets; empty: not given
};

CLI::App* AddRunCommand(CLI::App& app, RunArgs& args);
// Returns the exit status: 0 when the run finished its steps.
int RunRunCommand(const RunArgs& args);

struct ReplayArgs {
  std::string log;
};
CLI::App* AddReplayCommand(CLI::App& app, ReplayArgs& args);
// 0 when the replayed commands equal the logged ones, 1 when they differ.
int RunReplayCommand(const ReplayArgs& args);

}  // namespace rlsched::app

#endif  // RLSCHED_APP_RUN_COMMAND_H_
