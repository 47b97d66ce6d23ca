// `rlsched run` and `rlsched replay` (run_command.h).

#include "run_command.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
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
#include "flag_errors.h"
#include "format.h"
#include "rlsched/common/error.h"
#include "rlsched/scheduler/runtime.h"
#include "rlsched/v1/runtime.pb.h"
#include "rlsched/wire/json.h"
#include "rlsched/wire/orchestrator_convert.h"
#include "rlsched/wire/reshard_convert.h"
#include "rlsched/wire/simulate_convert.h"
#include "run_report.h"
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

// The weight layout of --model, --train and --infer (with `engines` replicas), planned
// here so that a layout the planner refuses stops the run before it starts (the plan is
// the runtime's for the full membership: the layout is planned once); nullopt without
// those options.
std::optional<scheduler::WeightSyncLayout> WeightLayout(const RunArgs& args, std::int64_t engines,
                                                        std::optional<v1::ReshardRequest>& logged) {
  const ReshardArgs& w = args.weights;
  if (w.model.empty() && w.train.empty() && w.infer.empty()) return std::nullopt;
  if (w.model.empty() || w.train.empty() || w.infer.empty()) {
    Fail((w.model.empty()   ? "--model"
          : w.train.empty() ? "--train"
                            : "--infer"),
         fmt::format("required with {}", w.model.empty() ? "--train and --infer" : "--model"));
  }
  v1::ReshardRequest request = MakeReshardRequest(w, ReadModelConfig(w.model));
  if (request.infer().replicas() != 0 && request.infer().replicas() != engines) {
    Fail("--infer", fmt::format("replicas={} differs from the run's engines ({}): each engine is "
                                "one replica (leave replicas out)",
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
    // In the run's terms: the option that set the field, then the field ("--train
    // (train.pp): ...").
    throw ToFlagError(e, WeightLayoutFlags(args.weights.model));
  }
  return layout;
}

// Where workers attach and how they prove who they are; the config and its steps.
void AddRunInputOptions(CLI::App& command, RunArgs& args) {
  command
      .add_option("--config", args.config,
                  "The run config: a JSON rlsched.v1.SimulatorConfig (the same file "
                  "`simulate --config` reads; default: simulate's defaults)")
      ->type_name("FILE");
  command
      .add_option("--listen", args.listen,
                  "Where workers attach: unix:PATH or HOST:PORT (default: a Unix socket "
                  "in the temporary directory)")
      ->type_name("ADDRESS");
  command
      .add_option("--token-file", args.token_file,
                  "The shared token workers present (required unless every worker is "
                  "emulated; then a random one)")
      ->type_name("FILE");
  command
      .add_option("--tls-cert", args.tls_cert,
                  "Serve workers over TLS with this PEM certificate chain (with --tls-key; "
                  "workers trust it through RLSCHED_TLS_CA, emulated ones are told)")
      ->type_name("FILE");
  command
      .add_option("--tls-key", args.tls_key,
                  "The PEM private key of --tls-cert (readable by the run only)")
      ->type_name("FILE");
  AddBoundedOption(command, "--steps", args.steps, "Train steps to run (the config's `steps`).",
                   IntegerRange{1, wire::kMaxSimulationSteps}, "the config's steps");
}

// The emulated workers the run starts, when it starts, and its clock.
void AddEmulationOptions(CLI::App& command, RunArgs& args) {
  AddBoundedOption(command, "--emulated-engines", args.emulated_engines,
                   "Start this many emulated engines as child processes.",
                   IntegerRange{0, kMaxEmulatedEngines}, "0");
  command.add_flag("--emulated-trainer", args.emulated_trainer,
                   "Start an emulated trainer as a child process");
  AddBoundedOption(command, "--wait-for-engines", args.wait_for_engines,
                   "Send the first prompts once this many engines are attached (and the "
                   "trainer, with --emulated-trainer), so that the first step and the first "
                   "weight sync see the whole fleet rather than the engine that started "
                   "first; at most --timeout.",
                   IntegerRange{0, kMaxEmulatedEngines},
                   "--emulated-engines (0 without them: at once)");
  AddBoundedOption(command, "--time-scale", args.time_scale,
                   "Wall seconds per run second, told to the workers: emulated ones run that "
                   "much faster; the report's times are run seconds.",
                   RealRange{kMinTimeScale, kMaxTimeScale},
                   "0.005 with emulated workers (a run second lasting 5 ms), else 1");
}

// The event log, the resume from it, and what the run writes besides.
void AddRecordOptions(CLI::App& command, RunArgs& args, const RunArgs& defaults) {
  command
      .add_option("--event-log", args.event_log,
                  "Write every event and command (delimited rlsched.v1.EventLogRecord) "
                  "for `rlsched replay`")
      ->type_name("FILE");
  command.add_flag("--event-log-fsync", args.event_log_fsync,
                   "Sync the event log to the disk after each write (against a power loss, "
                   "not only the scheduler's death; a disk flush per event)");
  command
      .add_option("--resume", args.resume,
                  "Continue the run this event log recorded (a scheduler killed mid-run), "
                  "appending to it; give the flags it was started with (checked against "
                  "it), with --listen and --token-file: its workers reattach there")
      ->type_name("FILE");
  AddBoundedOption(command, "--reattach-window", args.reattach_seconds,
                   "With --resume: wall seconds the logged run's workers have to reattach; "
                   "then the engines still missing are taken as lost and missing emulated "
                   "workers start afresh. Emulated workers wait as long for a scheduler that "
                   "went away.",
                   RealRange{0, kMaxHeartbeatTimeoutSeconds},
                   fmt::format("{:g}", defaults.reattach_seconds));
  command
      .add_option("--emulated-reports", args.emulated_reports,
                  "Each emulated worker writes what it counted there (engine-N.json: samples "
                  "finished; trainer.json: the samples it trained)")
      ->type_name("PATH");
  command.add_option("--trace", args.trace, "Write the run's Chrome/Perfetto trace JSON")
      ->type_name("FILE");
  command.add_flag("--json", args.json, "Print a rlsched.v1.RunReport as JSON at the end");
}

// The deadlines: the workers' (silence, Hello, progress), the door's, the run's.
void AddDeadlineOptions(CLI::App& command, RunArgs& args, const RunArgs& defaults) {
  const RealRange seconds{0, kMaxHeartbeatTimeoutSeconds};
  AddBoundedOption(command, "--heartbeat-timeout", args.heartbeat_timeout_seconds,
                   "Wall seconds of silence after which a worker is dropped; 0: never.", seconds,
                   fmt::format("{:g}", defaults.heartbeat_timeout_seconds));
  AddBoundedOption(command, "--hello-timeout", args.hello_timeout_seconds,
                   "Wall seconds a new stream has to say Hello before it is closed; 0: never.",
                   seconds, fmt::format("{:g}", defaults.hello_timeout_seconds));
  AddBoundedOption(command, "--stuck-timeout", args.stuck_timeout_seconds,
                   "Wall seconds an engine may run requests without generating a token (by "
                   "the counter its heartbeats carry) before it is dropped as stuck, its "
                   "samples re-queued; 0: never.",
                   seconds, "10 x --heartbeat-timeout");
  AddBoundedOption(command, "--max-waiting", args.max_waiting_streams,
                   "Streams that may wait for their Hello at once; one more is turned away "
                   "(the worker SDK retries); 0: no cap.",
                   IntegerRange{0, kMaxWaitingStreams},
                   fmt::format("{}", defaults.max_waiting_streams));
  AddBoundedOption(command, "--timeout", args.timeout_seconds,
                   "Give up after this many wall seconds (exit status 1).",
                   RealRange{0, kMaxTimeoutSeconds, /*min_open=*/true},
                   fmt::format("{:g}", defaults.timeout_seconds));
}

// The weight layout: `reshard`'s options (its parsers check the values), and where the
// transfer group meets.
void AddRunWeightOptions(CLI::App& command, RunArgs& args) {
  ReshardArgs& w = args.weights;
  command
      .add_option("--model", w.model,
                  "The model's Hugging Face config.json, or its model folder (which holds "
                  "config.json), as `reshard --model`: with --train and --infer, every "
                  "SyncWeights names the engine's part of the weight-sync plan, sent to it "
                  "over the stream (the trainer gets the senders' part; default: no weight "
                  "layout)")
      ->type_name("FILE|DIR");
  command
      .add_option("--train", w.train,
                  "The trainer's layout, as `reshard --train` (tp=8,pp=2,dp=4; keys tp, pp, "
                  "vpp, ep, etp, cp, dp, first-stage-layers, last-stage-layers)")
      ->type_name("K=V,...");
  command
      .add_option("--infer", w.infer,
                  "One engine's layout, as `reshard --infer` (tp=N, ep); the replicas are the "
                  "run's engines, one plan per membership (the engines attached)")
      ->type_name("K=V,...");
  AddReshardPlacementOptions(command, w);
  command
      .add_option("--weight-sync-backend", args.weight_sync_backend,
                  "The weight-sync transfer group's collective backend (default gloo)")
      ->type_name("gloo|nccl")
      ->check(CLI::IsMember({"gloo", "nccl"}).description(""));
  command
      .add_option("--weight-sync-address", args.weight_sync_address,
                  "Where the weight-sync transfer group meets, HOST:PORT (told to the workers; "
                  "default: not given, the workers agree on their own)")
      ->type_name("HOST:PORT");
}

}  // namespace

CLI::App* AddRunCommand(CLI::App& app, RunArgs& args) {
  const RunArgs defaults;
  CLI::App* command = app.add_subcommand(
      "run",
      "Run live: the orchestrator, the step planner and the weight-sync plan driving engine "
      "and trainer workers attached over gRPC (or emulated ones it starts)");
  AddRunInputOptions(*command, args);
  AddEmulationOptions(*command, args);
  AddRecordOptions(*command, args, defaults);
  AddDeadlineOptions(*command, args, defaults);
  AddRunWeightOptions(*command, args);
  return command;
}

namespace {

// What --resume needs besides the logged run's flags: the address the workers reattach
// to, and the token they present.
void CheckResumeFlags(const RunArgs& args) {
  if (args.listen.empty()) {
    Fail("--resume", "needs --listen, the address the workers of the logged run reattach to");
  }
  if (args.token_file.empty()) {
    Fail("--resume", "needs --token-file, the token the workers of the logged run present");
  }
  std::error_code ignored;
  if (!args.event_log.empty() && std::filesystem::weakly_canonical(args.event_log, ignored) !=
                                     std::filesystem::weakly_canonical(args.resume, ignored)) {
    Fail("--event-log",
         "a resumed run appends to its --resume log " + args.resume + ", got " + args.event_log);
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

// The config, as `simulate --config` reads it, with --steps.
scheduler::SimulatorConfig ReadRunConfig(const RunArgs& args) {
  v1::SimulatorConfig config_message;
  if (!args.config.empty()) {
    ParseJsonFile("--config", args.config, ReadWholeFile("--config", args.config, kMaxRunFileBytes),
                  config_message);
  }
  if (args.steps) config_message.set_steps(*args.steps);
  try {
    return wire::ToSimulatorConfig(config_message);
  } catch (const std::invalid_argument& e) {
    Fail(fmt::format("--config {}", args.config.empty() ? "(default)" : args.config), e.what());
  }
}

// --weight-sync-address as host and port (empty and 0 when not given).
std::pair<std::string, int> WeightSyncAddress(const RunArgs& args, bool has_layout) {
  const std::string& address = args.weight_sync_address;
  if (address.empty()) return {"", 0};
  const std::size_t colon = address.rfind(':');
  std::int64_t port = -1;
  if (colon != std::string::npos && colon > 0) {
    const std::string digits = address.substr(colon + 1);
    if (!digits.empty() && digits.size() <= 5 &&
        digits.find_first_not_of("0123456789") == std::string::npos) {
      port = std::stoll(digits);
    }
  }
  if (port < 1 || port > 65535) {
    Fail("--weight-sync-address",
         fmt::format("must be HOST:PORT with a port in [1, 65535], got '{}'", address));
  }
  if (!has_layout) {
    Fail("--weight-sync-address", "needs the weight layout (--model, --train, --infer)");
  }
  return {address.substr(0, colon), static_cast<int>(port)};
}

// The workers' token: --token-file's, or a random one when every worker is emulated.
std::string WorkerToken(const RunArgs& args) {
  if (!args.token_file.empty()) {
    std::string token = Trimmed(ReadWholeFile("--token-file", args.token_file, kMaxRunFileBytes));
    if (token.empty()) Fail("--token-file " + args.token_file, "empty");
    return token;
  }
  if (args.emulated_engines > 0 && args.emulated_trainer) return RandomToken();
  Fail("--token-file",
       "required when workers attach from outside (without --emulated-engines and "
       "--emulated-trainer)");
}

// --tls-cert and --tls-key's PEM texts (both empty without TLS).
std::pair<std::string, std::string> ReadTls(const RunArgs& args) {
  if (args.tls_cert.empty() != args.tls_key.empty()) {
    Fail(args.tls_cert.empty() ? "--tls-cert" : "--tls-key",
         args.tls_cert.empty() ? "required with --tls-key" : "required with --tls-cert");
  }
  if (args.tls_cert.empty()) return {};
  std::string cert = ReadWholeFile("--tls-cert", args.tls_cert, kMaxRunFileBytes);
  std::string key = ReadWholeFile("--tls-key", args.tls_key, kMaxRunFileBytes);
  // gRPC takes any text and fails at start-up with a message of its own; say which file is
  // not PEM first.
  if (cert.find("-----BEGIN CERTIFICATE-----") == std::string::npos) {
    Fail("--tls-cert " + args.tls_cert, "not a PEM certificate");
  }
  if (key.find("PRIVATE KEY-----") == std::string::npos) {
    Fail("--tls-key " + args.tls_key, "not a PEM private key");
  }
  return {std::move(cert), std::move(key)};
}

// What the flags make of a run before it starts: read and checked, nothing started.
struct RunSetup {
  scheduler::SimulatorConfig config;
  std::optional<v1::ReshardRequest> layout_request;
  std::optional<scheduler::WeightSyncLayout> weight_layout;
  std::string listen;
  double scale = 1;
  WorkerServerOptions server;
};

RunSetup PrepareRun(const RunArgs& args) {
  RunSetup setup;
  setup.config = ReadRunConfig(args);
  setup.weight_layout =
      WeightLayout(args, args.emulated_engines > 0 ? args.emulated_engines : setup.config.engines,
                   setup.layout_request);
  const auto [host, port] = WeightSyncAddress(args, setup.weight_layout.has_value());
  std::string token = WorkerToken(args);
  auto [cert, key] = ReadTls(args);
  setup.listen =
      args.listen.empty() ? fmt::format("unix:/tmp/rlsched-run-{}.sock", getpid()) : args.listen;
  setup.scale =
      args.time_scale.value_or(args.emulated_engines > 0 || args.emulated_trainer ? 0.005 : 1.0);
  setup.server =
      WorkerServerOptions{.listen = setup.listen,
                          .token = std::move(token),
                          .tls_cert_pem = std::move(cert),
                          .tls_key_pem = std::move(key),
                          .heartbeat_timeout_seconds = args.heartbeat_timeout_seconds,
                          .hello_timeout_seconds = args.hello_timeout_seconds,
                          .max_waiting_streams = args.max_waiting_streams,
                          .stuck_timeout_seconds = args.stuck_timeout_seconds.value_or(std::min(
                              10 * args.heartbeat_timeout_seconds, kMaxHeartbeatTimeoutSeconds)),
                          .weight_sync_backend = args.weight_sync_backend,
                          .weight_sync_address = host,
                          .weight_sync_port = port};
  *setup.server.welcome.mutable_config() = wire::ToSimulatorConfigMessage(setup.config);
  setup.server.welcome.set_time_scale(setup.scale);
  // Heartbeats: ten per timeout, at most one a second and at least every 50 ms.
  setup.server.welcome.set_heartbeat_seconds(
      args.heartbeat_timeout_seconds > 0
          ? std::clamp(args.heartbeat_timeout_seconds / 10.0, 0.05, 1.0)
          : 1.0);
  return setup;
}

// The event log: the resumed run's (read into `resumed`, checked against the flags), a
// new one, or none.
std::optional<EventLogFile> OpenEventLog(const RunArgs& args, const RunSetup& setup,
                                         std::optional<ResumedRun>& resumed) {
  if (!args.resume.empty()) {
    CheckResumeFlags(args);
    resumed = ReadResumedRun(args.resume, wire::ToSimulatorConfigMessage(setup.config),
                             setup.layout_request);
    spdlog::info("run: resuming {}: {} events up to run second {:.3f}{}", args.resume,
                 resumed->resume.events.size(), resumed->last_time,
                 resumed->torn_bytes > 0
                     ? fmt::format(" (a torn last record of {} bytes cut off)", resumed->torn_bytes)
                     : "");
    return EventLogFile::Continue(args.resume, resumed->whole_bytes, args.event_log_fsync);
  }
  if (args.event_log.empty()) return std::nullopt;
  return EventLogFile::Create(
      args.event_log,
      wire::EventLogHeader(setup.config, setup.layout_request ? &*setup.layout_request : nullptr),
      args.event_log_fsync);
}

void PrintStep(const scheduler::StepProgress& p) {
  const scheduler::Metrics& m = p.metrics;
  std::cerr << fmt::format(
      "step {:>4}  t {:>9.1f} s  samples/s {:>8.2f}  staleness max {}  trainer idle {}  engine "
      "idle {}  restarts {}\n",
      p.step, p.time, m.samples_per_second, m.max_staleness, FormatPercent(m.trainer_idle_ratio),
      FormatPercent(m.mean_engine_idle_ratio), p.counters.restarts);
}

// Posts the prompts the counters say are due (a step finished, groups filtered).
void TopUp(DataLoader& loader, scheduler::Runtime& runtime, const scheduler::Counters& c) {
  if (auto prompts = loader.TopUp(c.steps_finished, c.filtered_groups)) {
    runtime.Post(std::move(*prompts));
  }
}

// The runtime's options: the config's policy, the layout, the event log, the refusals told
// to their senders, and at each step its line and the data loader's refill.
scheduler::RuntimeOptions MakeRuntimeOptions(const RunArgs& args, const RunSetup& setup,
                                             std::optional<EventLogFile>& log,
                                             std::optional<ResumedRun>& resumed,
                                             WorkerServer& server, DataLoader& loader,
                                             scheduler::Runtime*& runtime) {
  scheduler::RuntimeOptions options;
  options.orchestrator = wire::RunOrchestratorOptions(setup.config);
  options.step = setup.config.step;
  options.weight_sync = setup.weight_layout;
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
  options.on_step = [&loader, &runtime](const scheduler::StepProgress& p) {
    PrintStep(p);
    if (runtime != nullptr) TopUp(loader, *runtime, p.counters);
  };
  return options;
}

// Waits for the steps (or --timeout, or a stop signal), refilling the data loader and
// watching the emulated workers: one that exits before the end ends the run with its
// status. True when the steps finished.
bool AwaitSteps(const RunArgs& args, const ScaledClock& clock, WorkerServer& server,
                scheduler::Runtime& runtime, DataLoader& loader,
                std::optional<EmulatedWorkers>& emulated) {
  bool done = false;
  try {
    const double give_up = clock.wall() + args.timeout_seconds;
    while (!done && clock.wall() < give_up && g_stop_signal.load() == 0) {
      done = runtime.WaitUntilDone(std::chrono::milliseconds(200));
      if (!done) TopUp(loader, runtime, runtime.counters());  // groups filtered mid-step
      if (!done && emulated) emulated->Reap();
    }
  } catch (const std::exception& e) {
    server.Shutdown(std::string("failed: ") + e.what(), std::chrono::milliseconds(1000));
    runtime.Stop();
    throw;
  }
  return done;
}

// Prints the report (or the summary) and returns the exit status: 0 when the steps
// finished, 128 + the signal when stopped by one, 1 at --timeout.
int Finish(const RunArgs& args, const scheduler::RuntimeStatus& status, const RunOutcome& outcome,
           int stop_signal) {
  if (args.json) {
    std::cout << wire::ToJson(ToRunReport(status, outcome)) << '\n';
  } else {
    std::cout << RunSummary(status, outcome);
  }
  FlushOutput(std::cout);
  if (stop_signal != 0) {
    std::cerr << fmt::format("rlsched run: {} before the run finished\n", outcome.ending);
    return 128 + stop_signal;
  }
  if (!outcome.done) {
    std::cerr << fmt::format("rlsched run: the run did not finish within --timeout {} s\n",
                             args.timeout_seconds);
    return 1;
  }
  return 0;
}

// Starts the workers a new run emulates and waits for them (a resumed run's: for those
// that reattach).
void StartWorkers(const RunArgs& args, WorkerServer& server, scheduler::Runtime& runtime,
                  const ScaledClock& clock, bool resumed,
                  std::optional<EmulatedWorkers>& emulated) {
  if (resumed) return AwaitReattach(args, server, runtime, clock, emulated);
  if (emulated) {
    for (std::int64_t e = 0; e < args.emulated_engines; ++e) emulated->StartEngine(e);
    if (args.emulated_trainer) emulated->StartTrainer();
  }
  AwaitStart(args, server, clock, emulated);
}

}  // namespace

int RunRunCommand(const RunArgs& args) {
  const RunSetup setup = PrepareRun(args);
  std::optional<ResumedRun> resumed;
  std::optional<EventLogFile> log = OpenEventLog(args, setup, resumed);
  ScaledClock clock(setup.scale, resumed ? resumed->last_time : 0.0);
  WorkerServer server(setup.server);
  DataLoader loader(setup.config, resumed ? resumed->prompts_posted : 0);
  scheduler::Runtime* runtime_ptr = nullptr;
  scheduler::Runtime runtime(
      MakeRuntimeOptions(args, setup, log, resumed, server, loader, runtime_ptr), server, server,
      clock);
  runtime_ptr = &runtime;
  server.Start(runtime);
  const bool unix_socket = setup.listen.starts_with("unix:");
  const RemoveSocketOnExit remove_socket{unix_socket ? setup.listen.substr(5) : ""};
  CatchStopSignals();
  spdlog::info("run: listening on {}{}", setup.listen,
               unix_socket ? "" : fmt::format(" (port {})", server.port()));

  std::optional<EmulatedWorkers> emulated;
  if (args.emulated_engines > 0 || args.emulated_trainer) {
    // Emulated workers trust the run's own certificate (self-signed, or its chain).
    emulated.emplace(
        WorkerEnvironment(
            setup.server.token,
            args.tls_cert.empty() ? "" : std::filesystem::absolute(args.tls_cert).string()),
        unix_socket ? setup.listen : fmt::format("localhost:{}", server.port()),
        setup.config.engine.max_concurrent, args.reattach_seconds, args.emulated_reports);
  }
  StartWorkers(args, server, runtime, clock, resumed.has_value(), emulated);
  // The first prompts; a resumed run's due ones its log lost (a refill after a logged
  // step's end, the scheduler killed before it was logged).
  if (g_stop_signal.load() == 0) TopUp(loader, runtime, runtime.counters());
  const bool done = AwaitSteps(args, clock, server, runtime, loader, emulated);

  const int stop_signal = done ? 0 : g_stop_signal.load();
  RunOutcome outcome{.done = done, .wall_seconds = clock.wall(), .time_scale = setup.scale};
  outcome.ending = done          ? "done"
                   : stop_signal ? fmt::format("stopped by {}", SignalName(stop_signal))
                                 : "stopped (timeout)";
  if (stop_signal != 0) spdlog::warn("run: {}: ending the run", SignalName(stop_signal));
  runtime.Stop();  // no more events; what they caused is sent
  server.Shutdown(outcome.ending, std::chrono::milliseconds(2000));
  outcome.workers_refused = server.refused();
  outcome.ignored_events = server.ignored_events();
  outcome.stuck_engines = server.stuck_engines();
  emulated.reset();
  if (log) log->Flush();
  if (!args.trace.empty()) {
    WriteWholeFile("--trace", args.trace, runtime.TraceJson());
  }
  return Finish(args, runtime.Status(), outcome, stop_signal);
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
    Fail(args.log, fmt::format("cannot open: {}", std::strerror(errno)));
  }
  wire::EventLog log;
  try {
    log = wire::ReadEventLog(in);
  } catch (const std::invalid_argument& e) {
    Fail(args.log, e.what());
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
