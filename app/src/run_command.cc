// `rlsched run` and `rlsched replay` (run_command.h).

#include "run_command.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <google/protobuf/util/json_util.h>
#include <signal.h>
#include <spawn.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

#include "command_common.h"
#include "data_loader.h"
#include "event_log_file.h"
#include "rlsched/common/error.h"
#include "rlsched/scheduler/runtime.h"
#include "rlsched/v1/runtime.pb.h"
#include "rlsched/wire/balance_convert.h"
#include "rlsched/wire/orchestrator_convert.h"
#include "rlsched/wire/reshard_convert.h"
#include "rlsched/wire/simulate_convert.h"
#include "run_resume.h"
#include "serve.h"
#include "worker_server.h"

extern char** environ;

namespace rlsched::app {

namespace {

// The largest --config or --token-file read: the daemon's default cap on a request.
constexpr std::int64_t kMaxRunFileBytes = kDefaultMaxMessageBytes;
// The options' bounds (their help states them).
constexpr std::int64_t kMaxEmulatedEngines = 4096;
constexpr double kMinTimeScale = 1e-6;
constexpr double kMaxTimeScale = 1e6;
constexpr double kMaxHeartbeatTimeoutSeconds = 86400;
constexpr std::int64_t kMaxWaitingStreams = 100000;
constexpr double kMaxTimeoutSeconds = 1e7;

// The run's clock: wall seconds / time_scale (emulated workers run that much faster).
// A resumed run's clock starts at the log's last event time.
class ScaledClock final : public scheduler::Clock {
 public:
  ScaledClock(double scale, double start) : scale_(scale), start_(start) {}
  double Now() const override { return start_ + wall_.Now() / scale_; }
  double wall() const { return wall_.Now(); }

 private:
  scheduler::SteadyClock wall_;
  double scale_;
  double start_;
};

// SIGTERM and SIGINT end a run gracefully (the report written, Goodbye to every worker,
// the event log flushed, the socket removed); a second one ends it at once.
std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "set from a signal handler");

void OnStopSignal(int signal) { g_stop_signal.store(signal); }

std::string SignalName(int signal) {
  return signal == SIGTERM  ? "SIGTERM"
         : signal == SIGINT ? "SIGINT"
                            : fmt::format("signal {}", signal);
}

void CatchStopSignals() {
  struct sigaction action = {};
  action.sa_handler = OnStopSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESETHAND;  // the second signal: the default action
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
}

// Removes the run's Unix socket file when the run ends, however it ends.
struct RemoveSocketOnExit {
  std::string path;  // empty: a TCP address
  ~RemoveSocketOnExit() {
    std::error_code ignored;
    if (!path.empty()) std::filesystem::remove(path, ignored);
  }
};

// A child process (an emulated worker), killed and reaped on destruction.
class Child {
 public:
  Child(const std::vector<std::string>& argv, const std::vector<std::string>& env) {
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    std::vector<char*> envp;
    for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    // In a session of its own: it outlives a scheduler killed hard (and reattaches to the
    // resumed one); a terminal's Ctrl-C reaches the scheduler, which ends it gracefully.
    // Its standard output is not the run's (which carries --json): /dev/null.
    posix_spawnattr_t attributes;
    posix_spawnattr_init(&attributes);
    posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSID);
    posix_spawn_file_actions_t files;
    posix_spawn_file_actions_init(&files);
    posix_spawn_file_actions_addopen(&files, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
    const int error = posix_spawn(&pid_, args[0], &files, &attributes, args.data(), envp.data());
    posix_spawn_file_actions_destroy(&files);
    posix_spawnattr_destroy(&attributes);
    if (error != 0) {
      throw std::runtime_error(fmt::format("cannot start {}: {}", argv[0], std::strerror(error)));
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  // Whether the child has exited (reaped; its status in `status`).
  bool Exited(int& status) {
    if (pid_ <= 0) return true;
    if (waitpid(pid_, &status, WNOHANG) != pid_) return false;
    pid_ = -1;
    return true;
  }
  ~Child() {
    if (pid_ <= 0) return;
    // Workers leave on Goodbye; give them a moment, then stop them.
    for (int i = 0; i < 50; ++i) {
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }

 private:
  pid_t pid_ = -1;
};

// The emulated workers the run starts (python/rlsched/worker/emulated.py), detached:
// they wait for a scheduler that went away (--reattach-seconds) and reattach to it.
class EmulatedWorkers {
 public:
  EmulatedWorkers(std::vector<std::string> env, std::string address, std::int64_t max_concurrent,
                  double reattach_seconds, std::string reports)
      : env_(std::move(env)),
        address_(std::move(address)),
        max_concurrent_(max_concurrent),
        reattach_seconds_(reattach_seconds),
        reports_(std::move(reports)) {}
  void StartEngine(std::int64_t engine) {
    Start(fmt::format("engine {}", engine), {"--role", "engine", "--engine", std::to_string(engine),
                                             "--max-concurrent", std::to_string(max_concurrent_)});
  }
  void StartTrainer() { Start("trainer", {"--role", "trainer"}); }
  // Throws when one has exited, naming it and its status (at start-up: a worker that
  // cannot start is the run's error).
  void CheckStarted() {
    for (std::size_t i = 0; i < children_.size(); ++i) {
      int status = 0;
      if (children_[i]->Exited(status)) {
        throw std::runtime_error(
            fmt::format("the emulated worker (--role {}) exited at start-up (status {})", names_[i],
                        WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status)));
      }
    }
  }
  // Reaps those that exited since (logged: a lost worker is the runtime's to handle).
  void Reap() {
    for (std::size_t i = 0; i < children_.size(); ++i) {
      int status = 0;
      if (!reaped_[i] && children_[i]->Exited(status)) {
        reaped_[i] = true;
        spdlog::warn("run: the emulated worker ({}) exited (status {})", names_[i],
                     WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
      }
    }
  }

 private:
  void Start(std::string name, std::vector<std::string> extra) {
    std::vector<std::string> argv = {RLSCHED_WORKER_PYTHON,
                                     "-m",
                                     "rlsched.worker.emulated",
                                     "--address",
                                     address_,
                                     "--reattach-seconds",
                                     fmt::format("{:g}", reattach_seconds_)};
    argv.insert(argv.end(), extra.begin(), extra.end());
    if (!reports_.empty()) {  // engine-3.json, trainer.json
      std::string file = name;
      std::replace(file.begin(), file.end(), ' ', '-');
      argv.insert(argv.end(), {"--report", (std::filesystem::path(reports_) / (file + ".json"))});
    }
    children_.push_back(std::make_unique<Child>(argv, env_));
    names_.push_back(std::move(name));
    reaped_.push_back(false);
  }
  std::vector<std::string> env_;
  std::string address_;
  std::int64_t max_concurrent_;
  double reattach_seconds_;
  std::string reports_;
  std::vector<std::unique_ptr<Child>> children_;
  std::vector<std::string> names_;
  std::vector<bool> reaped_;
};

std::string RandomToken() {
  std::random_device device;
  std::string token;
  for (int i = 0; i < 4; ++i) token += fmt::format("{:08x}", device());
  return token;
}

std::string Trimmed(std::string text) {
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return {};
  const auto last = text.find_last_not_of(" \t\r\n");
  return text.substr(first, last - first + 1);
}

// The environment for the emulated workers: ours, the token, the certificate to trust
// (RLSCHED_TLS_CA, with TLS), and the Python path of the package and its generated
// modules (this build's, before the caller's).
std::vector<std::string> WorkerEnvironment(const std::string& token, const std::string& tls_ca) {
  std::vector<std::string> env;
  std::string python_path = RLSCHED_PYTHON_DIRS;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view entry(*e);
    if (entry.starts_with("PYTHONPATH=")) {
      python_path += ":" + std::string(entry.substr(11));
    } else if (!entry.starts_with("RLSCHED_WORKER_TOKEN=") &&
               !entry.starts_with("RLSCHED_TLS_CA=")) {
      env.emplace_back(entry);
    }
  }
  env.push_back("PYTHONPATH=" + python_path);
  env.push_back("RLSCHED_WORKER_TOKEN=" + token);
  if (!tls_ca.empty()) env.push_back("RLSCHED_TLS_CA=" + tls_ca);
  return env;
}

std::string Percent(double fraction) { return fmt::format("{:.1f}%", 100.0 * fraction); }

// A weight-layout error in the run's terms: the option that set the field, then the
// field ("--train (train.pp): ..."). `field` is the field's path in a ReshardRequest.
[[noreturn]] void FailWeightLayout(const RunArgs& args, const FieldError& e) {
  const std::string& field = e.field();
  auto under = [&](std::string_view prefix) {
    return field == prefix || (field.starts_with(prefix) && field.size() > prefix.size() &&
                               (field[prefix.size()] == '.' || field[prefix.size()] == '['));
  };
  std::string option;
  if (under("train")) option = "--train";
  if (under("infer")) option = "--infer";
  if (under("bucket_bytes")) option = "--bucket-mib";
  if (under("topology.gpus_per_node")) option = "--gpus-per-node";
  if (under("topology.intra_node_gb_per_s")) option = "--intra-node-gb-per-s";
  if (under("topology.inter_node_gb_per_s")) option = "--inter-node-gb-per-s";
  if (under("topology.colocated")) option = "--colocated";
  if (under("target_dtype")) option = "--target-dtype";
  if (under("model_config_json") || under("config") || under("model")) {
    option = "--model " + args.weights.model;
  }
  if (option.empty()) throw e;
  throw e.Renamed(fmt::format("{} ({})", option, field));
}

// The weight layout of --model, --train and --infer (with `engines` replicas), planned
// here so that a layout the planner refuses stops the run before it starts (the plan is
// the runtime's for the full membership: the layout is planned once); nullopt without
// those options.
std::optional<scheduler::WeightSyncLayout> WeightLayout(const RunArgs& args, std::int64_t engines,
                                                        std::optional<v1::ReshardRequest>& logged) {
  const ReshardArgs& w = args.weights;
  if (w.model.empty() && w.train.empty() && w.infer.empty()) return std::nullopt;
  if (w.model.empty() || w.train.empty() || w.infer.empty()) {
    throw std::invalid_argument(fmt::format("{}: required with {}",
                                            w.model.empty()   ? "--model"
                                            : w.train.empty() ? "--train"
                                                              : "--infer",
                                            w.model.empty() ? "--train and --infer" : "--model"));
  }
  v1::ReshardRequest request = MakeReshardRequest(w, ReadModelConfig(w.model));
  if (request.infer().replicas() != 0 && request.infer().replicas() != engines) {
    throw std::invalid_argument(fmt::format(
        "--infer: replicas={} differs from the run's engines ({}): each engine is one replica "
        "(leave replicas out)",
        request.infer().replicas(), engines));
  }
  request.mutable_infer()->set_replicas(engines);
  logged = request;
  scheduler::WeightSyncLayout layout;
  try {
    layout.model = wire::ToModelConfig(request);
    layout.reshard = wire::ToReshardOptions(request);
    // The full membership's plan, kept: the runtime starts with it (Validate checks its
    // GPU counts instead of planning again).
    layout.plan = std::make_shared<const rollout::ReshardPlan>(
        rollout::PlanReshard(layout.model, layout.reshard));
  } catch (const FieldError& e) {
    FailWeightLayout(args, e);
  } catch (const std::invalid_argument& e) {
    // ToModelConfig's "model_config_json: config...." and ToReshardOptions' "train.tp: ...".
    const std::string_view text = e.what();
    const std::size_t colon = text.find(": ");
    if (colon == std::string_view::npos) throw;
    FailWeightLayout(
        args, FieldError(std::string(text.substr(0, colon)), std::string(text.substr(colon + 2))));
  }
  return layout;
}

}  // namespace

CLI::App* AddRunCommand(CLI::App& app, RunArgs& args) {
  const RunArgs defaults;
  CLI::App* command = app.add_subcommand(
      "run",
      "Run live: the orchestrator, the step planner and the weight-sync plan driving engine "
      "and trainer workers attached over gRPC (or emulated ones it starts)");
  command
      ->add_option("--config", args.config,
                   "The run config: a JSON rlsched.v1.SimulatorConfig (the same file "
                   "`simulate --config` reads; default: simulate's defaults)")
      ->type_name("FILE");
  command
      ->add_option("--listen", args.listen,
                   "Where workers attach: unix:PATH or HOST:PORT (default: a Unix socket "
                   "in the temporary directory)")
      ->type_name("ADDRESS");
  command
      ->add_option("--token-file", args.token_file,
                   "The shared token workers present (required unless every worker is "
                   "emulated; then a random one)")
      ->type_name("FILE");
  command
      ->add_option("--tls-cert", args.tls_cert,
                   "Serve workers over TLS with this PEM certificate chain (with --tls-key; "
                   "workers trust it through RLSCHED_TLS_CA, emulated ones are told)")
      ->type_name("FILE");
  command
      ->add_option("--tls-key", args.tls_key,
                   "The PEM private key of --tls-cert (readable by the run only)")
      ->type_name("FILE");
  command
      ->add_option("--steps", args.steps,
                   fmt::format("Train steps to run (the config's `steps`). {}",
                               RangeHelp(IntegerRangeText(1, wire::kMaxSimulationSteps),
                                         "the config's steps")))
      ->check(IntegerIn(1, wire::kMaxSimulationSteps));
  command
      ->add_option("--emulated-engines", args.emulated_engines,
                   fmt::format("Start this many emulated engines as child processes. {}",
                               RangeHelp(IntegerRangeText(0, kMaxEmulatedEngines), "0")))
      ->check(IntegerIn(0, kMaxEmulatedEngines));
  command->add_flag("--emulated-trainer", args.emulated_trainer,
                    "Start an emulated trainer as a child process");
  command
      ->add_option(
          "--wait-for-engines", args.wait_for_engines,
          fmt::format("Send the first prompts once this many engines are attached (and the "
                      "trainer, with --emulated-trainer), so that the first step and the first "
                      "weight sync see the whole fleet rather than the engine that started "
                      "first; at most --timeout. {}",
                      RangeHelp(IntegerRangeText(0, kMaxEmulatedEngines),
                                "--emulated-engines (0 without them: at once)")))
      ->check(IntegerIn(0, kMaxEmulatedEngines));
  command
      ->add_option("--time-scale", args.time_scale,
                   fmt::format("Wall seconds per run second, told to the workers: emulated ones "
                               "run that much faster; the report's times are run seconds. {}",
                               RangeHelp(RealRangeText(kMinTimeScale, kMaxTimeScale),
                                         "0.005 with emulated workers (a run second lasting 5 "
                                         "ms), else 1")))
      ->check(RealIn(kMinTimeScale, kMaxTimeScale));
  command
      ->add_option("--event-log", args.event_log,
                   "Write every event and command (delimited rlsched.v1.EventLogRecord) "
                   "for `rlsched replay`")
      ->type_name("FILE");
  command->add_flag("--event-log-fsync", args.event_log_fsync,
                    "Sync the event log to the disk after each write (against a power loss, "
                    "not only the scheduler's death; a disk flush per event)");
  command
      ->add_option("--resume", args.resume,
                   "Continue the run this event log recorded (a scheduler killed mid-run), "
                   "appending to it; give the flags it was started with (checked against "
                   "it), with --listen and --token-file: its workers reattach there")
      ->type_name("FILE");
  command
      ->add_option("--reattach-window", args.reattach_seconds,
                   fmt::format("With --resume: wall seconds the logged run's workers have to "
                               "reattach; then the engines still missing are taken as lost and "
                               "missing emulated workers start afresh. Emulated workers wait as "
                               "long for a scheduler that went away. {}",
                               RangeHelp(RealRangeText(0, kMaxHeartbeatTimeoutSeconds),
                                         fmt::format("{:g}", defaults.reattach_seconds))))
      ->check(RealIn(0, kMaxHeartbeatTimeoutSeconds));
  command
      ->add_option("--emulated-reports", args.emulated_reports,
                   "Each emulated worker writes what it counted there (engine-N.json: samples "
                   "finished; trainer.json: the samples it trained)")
      ->type_name("PATH");
  command->add_option("--trace", args.trace, "Write the run's Chrome/Perfetto trace JSON")
      ->type_name("FILE");
  command->add_flag("--json", args.json, "Print a rlsched.v1.RunReport as JSON at the end");
  // A worker's deadline in wall seconds, 0: none.
  auto deadline = [&](const char* flag, double& value, const char* what, double fallback) {
    command
        ->add_option(flag, value,
                     fmt::format("{} {}", what,
                                 RangeHelp(RealRangeText(0, kMaxHeartbeatTimeoutSeconds),
                                           fmt::format("{:g}", fallback))))
        ->check(RealIn(0, kMaxHeartbeatTimeoutSeconds));
  };
  deadline("--heartbeat-timeout", args.heartbeat_timeout_seconds,
           "Wall seconds of silence after which a worker is dropped; 0: never.",
           defaults.heartbeat_timeout_seconds);
  deadline("--hello-timeout", args.hello_timeout_seconds,
           "Wall seconds a new stream has to say Hello before it is closed; 0: never.",
           defaults.hello_timeout_seconds);
  command
      ->add_option("--stuck-timeout", args.stuck_timeout_seconds,
                   fmt::format("Wall seconds an engine may run requests without generating a "
                               "token (by the counter its heartbeats carry) before it is dropped "
                               "as stuck, its samples re-queued; 0: never. {}",
                               RangeHelp(RealRangeText(0, kMaxHeartbeatTimeoutSeconds),
                                         "10 x --heartbeat-timeout")))
      ->check(RealIn(0, kMaxHeartbeatTimeoutSeconds));
  command
      ->add_option("--max-waiting", args.max_waiting_streams,
                   fmt::format("Streams that may wait for their Hello at once; one more is "
                               "turned away (the worker SDK retries); 0: no cap. {}",
                               RangeHelp(IntegerRangeText(0, kMaxWaitingStreams),
                                         fmt::format("{}", defaults.max_waiting_streams))))
      ->check(IntegerIn(0, kMaxWaitingStreams));
  command
      ->add_option("--timeout", args.timeout_seconds,
                   fmt::format("Give up after this many wall seconds (exit status 1). {}",
                               RangeHelp(RealRangeText(0, kMaxTimeoutSeconds, /*min_open=*/true),
                                         fmt::format("{:g}", defaults.timeout_seconds))))
      ->check(RealIn(0, kMaxTimeoutSeconds, /*min_open=*/true));
  // The weight layout: `reshard`'s options (its parsers check the values).
  ReshardArgs& w = args.weights;
  command
      ->add_option("--model", w.model,
                   "The model's Hugging Face config.json, or its model folder (which holds "
                   "config.json), as `reshard --model`: with --train and --infer, every "
                   "SyncWeights names the engine's part of the weight-sync plan, sent to it "
                   "over the stream (the trainer gets the senders' part; default: no weight "
                   "layout)")
      ->type_name("FILE|DIR");
  command
      ->add_option("--train", w.train,
                   "The trainer's layout, as `reshard --train` (tp=8,pp=2,dp=4; keys tp, pp, "
                   "vpp, ep, etp, cp, dp, first-stage-layers, last-stage-layers)")
      ->type_name("K=V,...");
  command
      ->add_option("--infer", w.infer,
                   "One engine's layout, as `reshard --infer` (tp=N, ep); the replicas are the "
                   "run's engines, one plan per membership (the engines attached)")
      ->type_name("K=V,...");
  AddReshardPlacementOptions(*command, w);
  command
      ->add_option("--weight-sync-backend", args.weight_sync_backend,
                   "The weight-sync transfer group's collective backend (default gloo)")
      ->type_name("gloo|nccl")
      ->check(CLI::IsMember({"gloo", "nccl"}).description(""));
  command
      ->add_option("--weight-sync-address", args.weight_sync_address,
                   "Where the weight-sync transfer group meets, HOST:PORT (told to the workers; "
                   "default: not given, the workers agree on their own)")
      ->type_name("HOST:PORT");
  return command;
}

// What --resume needs besides the logged run's flags: the address the workers reattach
// to, and the token they present.
void CheckResumeFlags(const RunArgs& args) {
  if (args.listen.empty()) {
    throw std::invalid_argument(
        "--resume: needs --listen, the address the workers of the logged run reattach to");
  }
  if (args.token_file.empty()) {
    throw std::invalid_argument(
        "--resume: needs --token-file, the token the workers of the logged run present");
  }
  std::error_code ignored;
  if (!args.event_log.empty() && std::filesystem::weakly_canonical(args.event_log, ignored) !=
                                     std::filesystem::weakly_canonical(args.resume, ignored)) {
    throw std::invalid_argument("--event-log: a resumed run appends to its --resume log " +
                                args.resume + ", got " + args.event_log);
  }
}

// A resumed run: the engines the core knows and a trainer have --reattach-window seconds
// to attach again. Then the known engines still missing are taken as failed (their
// samples go back to the queue) and the emulated workers still missing start afresh.
void AwaitReattach(const RunArgs& args, WorkerServer& server, scheduler::Runtime& runtime,
                   const ScaledClock& clock, std::optional<EmulatedWorkers>& emulated) {
  // The engines the core knows, and the emulated ones (the log may have lost their join).
  std::vector<std::int64_t> known = runtime.Status().engines;
  std::vector<std::int64_t> expected = known;
  for (std::int64_t e = 0; e < (emulated ? args.emulated_engines : 0); ++e) expected.push_back(e);
  std::sort(expected.begin(), expected.end());
  expected.erase(std::unique(expected.begin(), expected.end()), expected.end());
  const auto missing = [&](const std::vector<std::int64_t>& ids) {
    const std::vector<std::int64_t> attached = server.attached_engines();
    std::vector<std::int64_t> out;
    std::set_difference(ids.begin(), ids.end(), attached.begin(), attached.end(),
                        std::back_inserter(out));
    return out;
  };
  const double since = clock.wall();
  const double until = since + args.reattach_seconds;
  while ((!missing(expected).empty() || !server.trainer_attached()) && clock.wall() < until &&
         g_stop_signal.load() == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (missing(expected).empty() && server.trainer_attached()) {
    spdlog::info("run: the logged run's workers are back after {:.3f} s", clock.wall() - since);
  }
  if (g_stop_signal.load() != 0) return;
  for (const std::int64_t engine : missing(known)) {
    if (server.FailUnlessAttached(engine)) {
      spdlog::warn(
          "run: engine {} did not reattach within {:g} s; its samples go back to the "
          "queue",
          engine, args.reattach_seconds);
    }
  }
  if (!emulated) return;
  std::vector<std::int64_t> all(static_cast<std::size_t>(args.emulated_engines));
  std::iota(all.begin(), all.end(), 0);
  for (const std::int64_t engine : missing(all)) emulated->StartEngine(engine);
  if (args.emulated_trainer && !server.trainer_attached()) emulated->StartTrainer();
}

// A new run starts when --wait-for-engines engines (and an emulated trainer) are attached:
// the workers' start-up is not the run's time, and the first step's dispatch and weight
// sync see the whole fleet. Emulated workers get 60 s, workers from outside --timeout.
void AwaitStart(const RunArgs& args, const WorkerServer& server, const ScaledClock& clock,
                std::optional<EmulatedWorkers>& emulated) {
  const std::int64_t engines = args.wait_for_engines.value_or(args.emulated_engines);
  const bool trainer = emulated && args.emulated_trainer;
  const double limit = emulated ? std::min(args.timeout_seconds, 60.0) : args.timeout_seconds;
  const double since = clock.wall();
  while ((server.engines_attached() < engines || (trainer && !server.trainer_attached())) &&
         g_stop_signal.load() == 0) {
    if (emulated) emulated->CheckStarted();
    if (clock.wall() > since + limit) {
      throw std::runtime_error(fmt::format(
          "--wait-for-engines: {} engines{} did not attach within {:g} s ({} did)", engines,
          trainer ? " and the trainer" : "", limit, server.engines_attached()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (engines > 0) {
    spdlog::info("run: {} engines attached after {:.3f} s: the first prompts go out",
                 server.engines_attached(), clock.wall() - since);
  }
}

int RunRunCommand(const RunArgs& args) {
  // The config, as `simulate --config` reads it.
  v1::SimulatorConfig config_message;
  if (!args.config.empty()) {
    const std::string text = ReadWholeFile("--config", args.config, kMaxRunFileBytes);
    const auto status = google::protobuf::util::JsonStringToMessage(text, &config_message);
    if (!status.ok()) {
      throw std::invalid_argument(
          fmt::format("--config {}: not a JSON rlsched.v1.SimulatorConfig: {}", args.config,
                      std::string(status.message())));
    }
  }
  if (args.steps) config_message.set_steps(*args.steps);
  scheduler::SimulatorConfig config;
  try {
    config = wire::ToSimulatorConfig(config_message);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(
        fmt::format("--config {}: {}", args.config.empty() ? "(default)" : args.config, e.what()));
  }
  std::optional<v1::ReshardRequest> layout_request;
  const std::optional<scheduler::WeightSyncLayout> weight_layout = WeightLayout(
      args, args.emulated_engines > 0 ? args.emulated_engines : config.engines, layout_request);
  std::string weight_sync_host;
  int weight_sync_port = 0;
  if (!args.weight_sync_address.empty()) {
    const std::size_t colon = args.weight_sync_address.rfind(':');
    std::int64_t port = -1;
    if (colon != std::string::npos && colon > 0) {
      const std::string digits = args.weight_sync_address.substr(colon + 1);
      if (!digits.empty() && digits.size() <= 5 &&
          digits.find_first_not_of("0123456789") == std::string::npos) {
        port = std::stoll(digits);
      }
    }
    if (port < 1 || port > 65535) {
      throw std::invalid_argument(fmt::format(
          "--weight-sync-address: must be HOST:PORT with a port in [1, 65535], got '{}'",
          args.weight_sync_address));
    }
    weight_sync_host = args.weight_sync_address.substr(0, colon);
    weight_sync_port = static_cast<int>(port);
  }
  if (!weight_layout && (!args.weight_sync_address.empty())) {
    throw std::invalid_argument(
        "--weight-sync-address: needs the weight layout (--model, --train, --infer)");
  }
  const bool all_emulated = args.emulated_engines > 0 && args.emulated_trainer;
  std::string token;
  if (!args.token_file.empty()) {
    token = Trimmed(ReadWholeFile("--token-file", args.token_file, kMaxRunFileBytes));
    if (token.empty()) throw std::invalid_argument("--token-file " + args.token_file + ": empty");
  } else if (all_emulated) {
    token = RandomToken();
  } else {
    throw std::invalid_argument(
        "--token-file: required when workers attach from outside (without --emulated-engines "
        "and --emulated-trainer)");
  }
  if (args.tls_cert.empty() != args.tls_key.empty()) {
    throw std::invalid_argument(args.tls_cert.empty() ? "--tls-cert: required with --tls-key"
                                                      : "--tls-key: required with --tls-cert");
  }
  std::string tls_cert;
  std::string tls_key;
  if (!args.tls_cert.empty()) {
    tls_cert = ReadWholeFile("--tls-cert", args.tls_cert, kMaxRunFileBytes);
    tls_key = ReadWholeFile("--tls-key", args.tls_key, kMaxRunFileBytes);
    // gRPC takes any text and fails at start-up with a message of its own; say which
    // file is not PEM first.
    if (tls_cert.find("-----BEGIN CERTIFICATE-----") == std::string::npos) {
      throw std::invalid_argument("--tls-cert " + args.tls_cert + ": not a PEM certificate");
    }
    if (tls_key.find("PRIVATE KEY-----") == std::string::npos) {
      throw std::invalid_argument("--tls-key " + args.tls_key + ": not a PEM private key");
    }
  }
  const std::string listen =
      args.listen.empty() ? fmt::format("unix:/tmp/rlsched-run-{}.sock", getpid()) : args.listen;
  const double scale =
      args.time_scale.value_or(args.emulated_engines > 0 || args.emulated_trainer ? 0.005 : 1.0);
  // The event log: a new one, or the resumed run's (checked against the flags).
  std::optional<ResumedRun> resumed;
  std::optional<EventLogFile> log;
  if (!args.resume.empty()) {
    CheckResumeFlags(args);
    resumed = ReadResumedRun(args.resume, wire::ToSimulatorConfigMessage(config), layout_request);
    log.emplace(EventLogFile::Continue(args.resume, resumed->whole_bytes, args.event_log_fsync));
    spdlog::info("run: resuming {}: {} events up to run second {:.3f}{}", args.resume,
                 resumed->resume.events.size(), resumed->last_time,
                 resumed->torn_bytes > 0
                     ? fmt::format(" (a torn last record of {} bytes cut off)", resumed->torn_bytes)
                     : "");
  } else if (!args.event_log.empty()) {
    log.emplace(EventLogFile::Create(
        args.event_log, wire::EventLogHeader(config, layout_request ? &*layout_request : nullptr),
        args.event_log_fsync));
  }
  ScaledClock clock(scale, resumed ? resumed->last_time : 0.0);

  WorkerServerOptions server_options{
      .listen = listen,
      .token = token,
      .tls_cert_pem = tls_cert,
      .tls_key_pem = tls_key,
      .heartbeat_timeout_seconds = args.heartbeat_timeout_seconds,
      .hello_timeout_seconds = args.hello_timeout_seconds,
      .max_waiting_streams = args.max_waiting_streams,
      .stuck_timeout_seconds = args.stuck_timeout_seconds.value_or(
          std::min(10 * args.heartbeat_timeout_seconds, kMaxHeartbeatTimeoutSeconds)),
      .weight_sync_backend = args.weight_sync_backend,
      .weight_sync_address = weight_sync_host,
      .weight_sync_port = weight_sync_port};
  *server_options.welcome.mutable_config() = wire::ToSimulatorConfigMessage(config);
  server_options.welcome.set_time_scale(scale);
  // Heartbeats: ten per timeout, at most one a second and at least every 50 ms.
  server_options.welcome.set_heartbeat_seconds(
      args.heartbeat_timeout_seconds > 0
          ? std::clamp(args.heartbeat_timeout_seconds / 10.0, 0.05, 1.0)
          : 1.0);
  WorkerServer server(server_options);

  DataLoader loader(config, resumed ? resumed->prompts_posted : 0);
  scheduler::Runtime* runtime_ptr = nullptr;
  // Posts the prompts the counters say are due (a step finished, groups filtered).
  const auto top_up = [&loader](scheduler::Runtime& runtime, const scheduler::Counters& c) {
    if (auto prompts = loader.TopUp(c.steps_finished, c.filtered_groups)) {
      runtime.Post(std::move(*prompts));
    }
  };

  scheduler::RuntimeOptions options;
  options.orchestrator = wire::RunOrchestratorOptions(config);
  options.step = config.step;
  options.weight_sync = weight_layout;
  options.trace = !args.trace.empty();
  if (log) {
    options.journal = [&log](const scheduler::Event& event,
                             std::span<const scheduler::Command> commands) {
      log->Append(event, commands);
    };
  }
  if (resumed) options.resume = std::move(resumed->resume);
  options.on_reject = [&server](const scheduler::Event& event, const std::string& why) {
    server.Rejected(event, why);
  };
  options.on_step = [&](const scheduler::StepProgress& p) {
    const scheduler::Metrics& m = p.metrics;
    std::cerr << fmt::format(
        "step {:>4}  t {:>9.1f} s  samples/s {:>8.2f}  staleness max {}  trainer idle {}  engine "
        "idle {}  restarts {}\n",
        p.step, p.time, m.samples_per_second, m.max_staleness, Percent(m.trainer_idle_ratio),
        Percent(m.mean_engine_idle_ratio), p.counters.restarts);
    if (runtime_ptr != nullptr) top_up(*runtime_ptr, p.counters);
  };

  scheduler::Runtime runtime(std::move(options), server, server, clock);
  runtime_ptr = &runtime;
  server.Start(runtime);
  const bool unix_socket = listen.starts_with("unix:");
  const RemoveSocketOnExit remove_socket{unix_socket ? listen.substr(5) : ""};
  CatchStopSignals();
  spdlog::info("run: listening on {}{}", listen,
               unix_socket ? "" : fmt::format(" (port {})", server.port()));

  std::optional<EmulatedWorkers> emulated;
  if (args.emulated_engines > 0 || args.emulated_trainer) {
    // Emulated workers trust the run's own certificate (self-signed, or its chain).
    emulated.emplace(
        WorkerEnvironment(
            token, args.tls_cert.empty() ? "" : std::filesystem::absolute(args.tls_cert).string()),
        unix_socket ? listen : fmt::format("localhost:{}", server.port()),
        config.engine.max_concurrent, args.reattach_seconds, args.emulated_reports);
  }
  if (resumed) {
    AwaitReattach(args, server, runtime, clock, emulated);
  } else {
    if (emulated) {
      for (std::int64_t e = 0; e < args.emulated_engines; ++e) emulated->StartEngine(e);
      if (args.emulated_trainer) emulated->StartTrainer();
    }
    AwaitStart(args, server, clock, emulated);
  }
  // The first prompts; a resumed run's due ones its log lost (a refill after a logged
  // step's end, the scheduler killed before it was logged).
  if (g_stop_signal.load() == 0) top_up(runtime, runtime.counters());

  // Wait for the steps, watching the emulated workers: one that exits before the end
  // ends the run with its status.
  bool done = false;
  try {
    const double give_up = clock.wall() + args.timeout_seconds;
    while (!done && clock.wall() < give_up && g_stop_signal.load() == 0) {
      done = runtime.WaitUntilDone(std::chrono::milliseconds(200));
      if (!done) top_up(runtime, runtime.counters());  // groups filtered mid-step
      if (!done && emulated) emulated->Reap();
    }
  } catch (const std::exception& e) {
    server.Shutdown(std::string("failed: ") + e.what(), std::chrono::milliseconds(1000));
    runtime.Stop();
    throw;
  }
  const double wall = clock.wall();
  const int stop_signal = done ? 0 : g_stop_signal.load();
  const std::string ending = done          ? "done"
                             : stop_signal ? fmt::format("stopped by {}", SignalName(stop_signal))
                                           : "stopped (timeout)";
  if (stop_signal != 0) spdlog::warn("run: {}: ending the run", SignalName(stop_signal));
  runtime.Stop();  // no more events; what they caused is sent
  server.Shutdown(done ? "done" : ending, std::chrono::milliseconds(2000));
  emulated.reset();
  if (log) log->Flush();
  if (!args.trace.empty()) {
    std::ofstream trace(args.trace, std::ios::binary | std::ios::trunc);
    trace << runtime.TraceJson();
    if (!trace) throw std::runtime_error("--trace " + args.trace + ": cannot write");
  }

  const scheduler::RuntimeStatus status = runtime.Status();
  if (args.json) {
    scheduler::SimulationReport as_report;
    as_report.metrics = status.metrics;
    as_report.counters = status.counters;
    const v1::SimulationReport converted = wire::ToSimulationReportMessage(as_report, false);
    v1::RunReport report;
    *report.mutable_metrics() = converted.metrics();
    *report.mutable_counters() = converted.counters();
    report.set_events(status.events);
    report.set_rejected_events(status.rejected_events);
    report.set_workers_refused(server.refused());
    report.set_ignored_events(server.ignored_events());
    report.set_stuck_engines(server.stuck_engines());
    report.set_wall_seconds(wall);
    report.set_time_scale(scale);
    report.set_done(done);
    report.set_command_latency_count(status.command_latency.count);
    report.set_command_latency_p50_seconds(status.command_latency.p50_seconds);
    report.set_command_latency_p99_seconds(status.command_latency.p99_seconds);
    report.set_command_latency_max_seconds(status.command_latency.max_seconds);
    const scheduler::RequestSummary& r = status.requests;
    v1::RequestTelemetrySummary* requests = report.mutable_requests();
    requests->set_requests(r.requests);
    requests->set_generated_tokens(r.generated_tokens);
    requests->set_preemptions(r.preemptions);
    requests->set_interruptions(r.interruptions);
    requests->set_mean_seconds(r.mean_seconds);
    requests->set_p50_seconds(r.p50_seconds);
    requests->set_p99_seconds(r.p99_seconds);
    requests->set_max_seconds(r.max_seconds);
    requests->set_mean_first_token_seconds(r.mean_first_token_seconds);
    requests->set_p99_first_token_seconds(r.p99_first_token_seconds);
    requests->set_paused_seconds(r.paused_seconds);
    for (const scheduler::EngineLoad& l : status.engine_load) {
      v1::EngineLoad* load = report.add_engine_load();
      load->set_engine(l.engine);
      load->set_heartbeats(l.heartbeats);
      load->set_running(l.running);
      load->set_waiting(l.waiting);
      load->set_max_running(l.max_running);
      load->set_max_waiting(l.max_waiting);
      load->set_mean_running(l.mean_running);
      load->set_mean_waiting(l.mean_waiting);
    }
    for (const scheduler::WeightSyncEpoch& e : status.weight_sync) {
      v1::WeightSyncEpoch* epoch = report.add_weight_sync();
      epoch->set_epoch(e.epoch);
      epoch->mutable_members()->Add(e.members.begin(), e.members.end());
      epoch->set_transfers(e.transfers);
      epoch->set_buckets(e.buckets);
      epoch->set_bytes(e.bytes);
      epoch->set_syncs(e.syncs);
    }
    report.set_weight_sync_replans(status.weight_sync_replans);
    std::cout << wire::ToJson(report) << '\n';
  } else {
    std::cout << fmt::format(
        "run {}: {} steps, {} samples trained in {:.1f} s ({:.1f} s of wall time), {:.2f} "
        "samples/s, staleness max {}, events {} (refused {}, {} before the core), engines' "
        "version accounts {} "
        "({} differing from the core's), requests with telemetry {} (mean {:.2f} s)\n",
        ending, status.counters.steps_finished, status.counters.trained,
        status.metrics.elapsed_seconds, wall, status.metrics.samples_per_second,
        status.metrics.max_staleness, status.events, status.rejected_events,
        server.ignored_events(), status.counters.version_reports,
        status.counters.version_corrections, status.requests.requests,
        status.requests.mean_seconds);
  }
  FlushOutput(std::cout);
  if (stop_signal != 0) {
    std::cerr << fmt::format("rlsched run: {} before the run finished\n", ending);
    return 128 + stop_signal;
  }
  if (!done) {
    std::cerr << fmt::format("rlsched run: the run did not finish within --timeout {} s\n",
                             args.timeout_seconds);
    return 1;
  }
  return 0;
}

CLI::App* AddReplayCommand(CLI::App& app, ReplayArgs& args) {
  CLI::App* command = app.add_subcommand(
      "replay",
      "Feed a run's event log (run --event-log) to a fresh decision core and check "
      "that the same commands come out");
  command->add_option("log", args.log, "The event log")->required()->type_name("FILE");
  return command;
}

int RunReplayCommand(const ReplayArgs& args) {
  std::ifstream in(args.log, std::ios::binary);
  if (!in) {
    throw std::invalid_argument(fmt::format("{}: cannot open: {}", args.log, std::strerror(errno)));
  }
  wire::EventLog log;
  try {
    log = wire::ReadEventLog(in);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(fmt::format("{}: {}", args.log, e.what()));
  }
  const wire::ReplayResult result = wire::Replay(log);
  if (result.first_difference) {
    std::cout << fmt::format(
        "replay: {} events, the commands differ at command {}:\n  logged:   {}\n  replayed: {}\n",
        result.events, *result.first_difference, result.logged, result.replayed);
    return 1;
  }
  std::cout << fmt::format(
      "replay: {} events, {} commands, identical ({} events refused, as in the run)\n",
      result.events, result.commands, result.rejected_events);
  return 0;
}

}  // namespace rlsched::app
