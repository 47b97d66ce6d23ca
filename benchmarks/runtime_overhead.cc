// benchmarks/runtime_overhead.cc — the live runtime's own overhead: `rlsched run` driven
// by instantly answering workers over gRPC.
//
// Usage
//   runtime_overhead [--engines N] [--concurrency C] [--steps S] [--prompts P]
//                    [--samples G] [--mode sync|one_step_off|async] [--program PATH]
//                    [--pause batched|per_sample] [--event-log-rounds N]
//   (defaults: 8 engines × 64 samples, 200 steps of 64 prompts × 8 samples, async s = 1
//   with partial rollout; PATH = the rlsched built beside this program; batched)
//
// Overview
//   Starts `rlsched run --listen unix:… --token-file … --json` as a child process (the
//   program users run: the runtime's flow graph, the decision core, the step planner,
//   the gRPC worker server) and attaches N engine workers and one trainer, each a thread
//   of this program with its own gRPC channel and Attach stream. An engine reports every
//   sample of a Dispatch finished (a deterministic length in [64, 2111] tokens and a
//   0/1 reward), WeightsLoaded for a SyncWeights at once, EngineReleased for a Release;
//   the trainer reports TrainStepFinished for each StartTrain at once.
//   Two runs: saturated (every sample reported finished as soon as it is read: the
//   run's pace is the scheduler's own), then paced (a sample reported finished
//   T·[0.25, 1.75) after its Dispatch, by a hash of its id, T = engines·concurrency /
//   20,000 s, so that the workers offer up to 20,000 finishes per second, one by one; a
//   weight sync that interrupts pauses the samples not yet reported and the engine
//   reports their progress in one GenerationPaused (--pause per_sample: a
//   GenerationProgressed per sample, as older workers do), and a Resume restarts them). Per run:
//   the events the runtime handled per wall second (the RunReport: events / wall seconds from the
//   prompts to the last step) and the event-to-command latency in the scheduler (the RunReport's
//   command_latency: from an event's arrival off its stream to the hand-off of each command it
//   caused to a worker's stream, a StartTrain's step plan included). Saturated, the latency is the
//   queue's (Little's law: engines·concurrency outstanding events / the rate); paced,
//   it is the scheduler's.
//   The targets: saturated >= 20,000 events/s; paced p99 latency < 5 ms.
//   The exit status is 1 when the run does not finish or a worker sees a protocol error.

#include <fcntl.h>
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <mutex>
#include <queue>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "rlsched/v1/runtime.grpc.pb.h"

extern char** environ;

namespace {

namespace v1 = rlsched::v1;
using Clock = std::chrono::steady_clock;

struct Options {
  std::int64_t engines = 8;
  std::int64_t concurrency = 64;
  std::int64_t steps = 200;
  std::int64_t prompts = 64;
  std::int64_t samples = 8;
  std::string mode = "async";
  std::string program = RLSCHED_PROGRAM;
  bool per_sample_pause = false;  // --pause per_sample
  // --event-log-rounds N: N saturated runs each without the event log, with it, and with
  // it synced (--event-log-fsync), interleaved; their medians compared. 0: off.
  std::int64_t event_log_rounds = 0;
};

// How a run keeps its event log.
enum class EventLog { kNone, kWritten, kSynced };

// What one worker counted.
struct WorkerStats {
  std::int64_t events = 0;
  std::int64_t commands = 0;
  std::string error;
};

// One worker's session: Hello, then commands in, events out, until Goodbye. An engine
// reports a dispatched sample finished `think` after it reads the Dispatch (at once when
// zero; else a second thread writes the reports when due).
class Worker {
 public:
  Worker(const std::string& address, const std::string& token, v1::WorkerRole role,
         std::int64_t engine, std::int64_t max_concurrent, Clock::duration think,
         bool per_sample_pause = false)
      : stub_(v1::Scheduler::NewStub(
            grpc::CreateChannel(address, grpc::InsecureChannelCredentials()))),
        token_(token),
        role_(role),
        engine_(engine),
        max_concurrent_(max_concurrent),
        think_(think),
        per_sample_pause_(per_sample_pause) {}

  WorkerStats Run() {
    grpc::ClientContext context;
    context.set_wait_for_ready(true);
    // A run that never listens (it failed at start-up) ends the benchmark, not hangs it.
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(660));
    stream_ = stub_->Attach(&context);
    v1::WorkerMessage hello;
    hello.mutable_hello()->set_role(role_);
    hello.mutable_hello()->set_engine(engine_);
    hello.mutable_hello()->set_max_concurrent(max_concurrent_);
    hello.mutable_hello()->set_version(-1);
    hello.mutable_hello()->set_token(token_);
    hello.mutable_hello()->set_name("runtime_overhead");
    if (!stream_->Write(hello)) {
      stats_.error = "the hello was not sent";
      return stats_;
    }
    std::thread writer;
    if (think_ > Clock::duration::zero()) writer = std::thread([this] { WriteWhenDue(); });
    v1::SchedulerMessage in;
    while (stream_->Read(&in)) {
      if (in.has_goodbye()) break;
      if (in.has_command()) Answer(in.command());
    }
    if (writer.joinable()) {
      {
        std::lock_guard lock(mutex_);
        stop_ = true;
      }
      due_cv_.notify_all();
      writer.join();
    }
    stream_->WritesDone();
    const grpc::Status status = stream_->Finish();
    if (!status.ok() && status.error_code() != grpc::StatusCode::CANCELLED) {
      stats_.error = "the stream ended with " + status.error_message();
    }
    return stats_;
  }

 private:
  void Answer(const v1::OrchestratorCommand& command) {
    ++stats_.commands;
    v1::WorkerMessage out;
    switch (command.kind_case()) {
      case v1::OrchestratorCommand::kDispatch:
        for (const v1::SampleWork& work : command.dispatch().samples()) Finish(work.sample());
        break;
      case v1::OrchestratorCommand::kResume:
        for (const std::int64_t sample : command.resume().samples()) Finish(sample);
        break;
      case v1::OrchestratorCommand::kSyncWeights: {
        if (command.sync_weights().interrupt()) Pause(command.sync_weights().version());
        v1::WeightsLoaded* loaded = out.mutable_event()->mutable_weights_loaded();
        loaded->set_engine(engine_);
        loaded->set_version(command.sync_weights().version());
        Send(out);
        break;
      }
      case v1::OrchestratorCommand::kRelease:
        out.mutable_event()->mutable_engine_released()->set_engine(engine_);
        Send(out);
        break;
      case v1::OrchestratorCommand::kStartTrain: {
        v1::TrainStepFinished* finished = out.mutable_event()->mutable_train_step_finished();
        finished->set_step(command.start_train().step());
        finished->set_call(command.start_train().call());
        Send(out);
        break;
      }
      default:  // Abort: the samples are finished or about to be; the core ignores them
        break;
    }
  }

  static std::int64_t LengthOf(std::int64_t sample) { return 64 + (sample * 7919) % 2048; }

  // Reports `sample` finished: at once without a think time, else when due.
  void Finish(std::int64_t sample) {
    if (think_ == Clock::duration::zero()) {
      Send(FinishedMessage(sample));
      return;
    }
    // A sample takes think × [0.25, 1.75), by a hash of its id: samples finish one by one,
    // not a Dispatch's worth at once.
    const double spread = 0.25 + 1.5 * static_cast<double>((sample * 2654435761u) % 1024) / 1024;
    const auto when = Clock::now() + std::chrono::duration_cast<Clock::duration>(think_ * spread);
    std::lock_guard lock(mutex_);
    due_.push({when, sample});
    due_cv_.notify_one();
  }

  static v1::WorkerMessage FinishedMessage(std::int64_t sample) {
    v1::WorkerMessage out;
    v1::GenerationFinished* finished = out.mutable_event()->mutable_generation_finished();
    finished->set_sample(sample);
    finished->set_tokens(LengthOf(sample));
    finished->set_reward(static_cast<double>(sample % 2));
    return out;
  }

  // A weight sync that interrupts: every sample not yet reported stops halfway, and the
  // engine, now idle, reports their progress in one GenerationPaused (or one
  // GenerationProgressed each with --pause per_sample); a Resume restarts their think
  // time. Holds the writer (write_mutex_, then mutex_: the writer thread's order) so
  // that no finish of a paused sample is written after its progress.
  void Pause(std::int64_t version) {
    const std::lock_guard write(write_mutex_);
    std::vector<std::int64_t> paused;
    {
      const std::lock_guard lock(mutex_);
      for (; !due_.empty(); due_.pop()) paused.push_back(due_.top().second);
    }
    if (per_sample_pause_) {
      for (const std::int64_t sample : paused) {
        v1::WorkerMessage out;
        v1::GenerationProgressed* progressed = out.mutable_event()->mutable_generation_progressed();
        progressed->set_sample(sample);
        progressed->set_tokens(LengthOf(sample) / 2);
        WriteLocked(out);
      }
      return;
    }
    v1::WorkerMessage out;
    v1::GenerationPaused* report = out.mutable_event()->mutable_generation_paused();
    report->set_engine(engine_);
    report->set_version(version);
    report->mutable_samples()->Reserve(static_cast<int>(paused.size()));
    for (const std::int64_t sample : paused) {
      v1::SampleProgress* progress = report->add_samples();
      progress->set_sample(sample);
      progress->set_tokens(LengthOf(sample) / 2);
    }
    WriteLocked(out);
  }

  void Send(const v1::WorkerMessage& message) {
    const std::lock_guard lock(write_mutex_);
    WriteLocked(message);
  }
  void WriteLocked(const v1::WorkerMessage& message) {  // write_mutex_ held
    ++stats_.events;
    stream_->Write(message);
  }

  void WriteWhenDue() {
    std::unique_lock lock(mutex_);
    while (true) {
      if (due_.empty()) {
        if (stop_) return;
        due_cv_.wait(lock);
        continue;
      }
      const Clock::time_point when = due_.top().first;  // a copy: Finish may push meanwhile
      if (Clock::now() < when) {
        due_cv_.wait_until(lock, when);
        continue;
      }
      lock.unlock();
      const std::unique_lock write(write_mutex_);
      lock.lock();
      if (due_.empty() || Clock::now() < due_.top().first) continue;  // paused meanwhile
      const std::int64_t sample = due_.top().second;
      due_.pop();
      lock.unlock();
      WriteLocked(FinishedMessage(sample));
      lock.lock();
    }
  }

  std::unique_ptr<v1::Scheduler::Stub> stub_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::WorkerMessage, v1::SchedulerMessage>> stream_;
  std::string token_;
  v1::WorkerRole role_;
  std::int64_t engine_;
  std::int64_t max_concurrent_;
  Clock::duration think_;
  bool per_sample_pause_;
  WorkerStats stats_;
  std::mutex write_mutex_;  // one writer at a time; stats_.events
  std::mutex mutex_;        // due_, stop_
  std::condition_variable due_cv_;
  using Due = std::pair<Clock::time_point, std::int64_t>;  // (when, sample)
  std::priority_queue<Due, std::vector<Due>, std::greater<>> due_;
  bool stop_ = false;
};

// `rlsched run` with its stdout in a file; killed on destruction if still running.
class RunProcess {
 public:
  RunProcess(const std::vector<std::string>& argv, const std::string& stdout_path) {
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, stdout_path.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0600);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    const int rc = posix_spawn(&pid_, args[0], &actions, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) throw std::runtime_error(argv[0] + ": cannot start: " + std::strerror(rc));
  }
  ~RunProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  int Wait() {
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  pid_t pid_ = -1;
};

std::int64_t ParseCount(std::string_view flag, const char* text, std::int64_t max) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || v < 1 || v > max) {
    throw std::invalid_argument(std::string(flag) + ": must be an integer in [1, " +
                                std::to_string(max) + "], got '" + text + "'");
  }
  return v;
}

Options Parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (i + 1 >= argc) throw std::invalid_argument(std::string(flag) + ": needs a value");
    const char* value = argv[++i];
    if (flag == "--engines") {
      o.engines = ParseCount(flag, value, 256);
    } else if (flag == "--concurrency") {
      o.concurrency = ParseCount(flag, value, 4096);
    } else if (flag == "--steps") {
      o.steps = ParseCount(flag, value, 100000);
    } else if (flag == "--prompts") {
      o.prompts = ParseCount(flag, value, 100000);
    } else if (flag == "--samples") {
      o.samples = ParseCount(flag, value, 1024);
    } else if (flag == "--mode") {
      o.mode = value;
      if (o.mode != "sync" && o.mode != "one_step_off" && o.mode != "async") {
        throw std::invalid_argument("--mode: must be sync, one_step_off or async");
      }
    } else if (flag == "--event-log-rounds") {
      o.event_log_rounds = ParseCount(flag, value, 1000);
    } else if (flag == "--program") {
      o.program = value;
    } else if (flag == "--pause") {
      const std::string_view pause = value;
      if (pause != "batched" && pause != "per_sample") {
        throw std::invalid_argument("--pause: must be batched or per_sample, got " +
                                    std::string(pause));
      }
      o.per_sample_pause = pause == "per_sample";
    } else {
      throw std::invalid_argument("unknown option " + std::string(flag));
    }
  }
  return o;
}

// One run of `rlsched run` with the workers attached.
struct RunResult {
  int status = 0;
  bool parsed = false;
  v1::RunReport report;
  std::int64_t worker_events = 0;
  double worker_seconds = 0;
  std::vector<std::string> errors;
};

RunResult RunOnce(const Options& o, Clock::duration think, EventLog log = EventLog::kNone) {
  char dir_template[] = "/tmp/rlsched-overhead-XXXXXX";
  if (::mkdtemp(dir_template) == nullptr) throw std::runtime_error("mkdtemp failed");
  const std::string dir = dir_template;
  const std::string socket = dir + "/run.sock";
  const std::string token = "overhead-token";
  {
    std::ofstream(dir + "/token") << token << '\n';
    const std::string mode = o.mode == "sync"           ? "ORCHESTRATOR_MODE_SYNC"
                             : o.mode == "one_step_off" ? "ORCHESTRATOR_MODE_ONE_STEP_OFF"
                                                        : "ORCHESTRATOR_MODE_ASYNC";
    std::ofstream(dir + "/run.json")
        << "{\"steps\": " << o.steps << ", \"engines\": " << o.engines
        << ", \"engine\": {\"max_concurrent\": " << o.concurrency << "}"
        << ", \"orchestrator\": {\"mode\": \"" << mode << "\""
        << (o.mode == "async" ? ", \"max_staleness\": 1, \"partial_rollout\": true" : "")
        << ", \"prompts_per_step\": " << o.prompts << ", \"samples_per_prompt\": " << o.samples
        << "}, \"dataset_prompts\": " << o.prompts * 4 << "}\n";
  }
  const std::string out_path = dir + "/report.json";
  RunResult result;
  {
    std::vector<std::string> argv = {
        o.program,        "run",          "--config",     dir + "/run.json",     "--listen",
        "unix:" + socket, "--token-file", dir + "/token", "--heartbeat-timeout", "0",
        "--timeout",      "600",          "--json"};
    if (log != EventLog::kNone) argv.insert(argv.end(), {"--event-log", dir + "/events.log"});
    if (log == EventLog::kSynced) argv.push_back("--event-log-fsync");
    RunProcess run(argv, out_path);
    // The workers connect once the socket is there (wait_for_ready covers the rest).
    for (int i = 0; i < 3000; ++i) {
      struct stat st {};
      if (::stat(socket.c_str(), &st) == 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    const std::string address = "unix:" + socket;
    std::vector<WorkerStats> stats(static_cast<std::size_t>(o.engines) + 1);
    std::vector<std::thread> threads;
    const Clock::time_point start = Clock::now();
    threads.emplace_back([&] {
      stats[0] =
          Worker(address, token, v1::WORKER_ROLE_TRAINER, 0, 1, Clock::duration::zero()).Run();
    });
    for (std::int64_t e = 0; e < o.engines; ++e) {
      threads.emplace_back([&, e] {
        stats[static_cast<std::size_t>(e) + 1] = Worker(address, token, v1::WORKER_ROLE_ENGINE, e,
                                                        o.concurrency, think, o.per_sample_pause)
                                                     .Run();
      });
    }
    for (std::thread& t : threads) t.join();
    result.worker_seconds = std::chrono::duration<double>(Clock::now() - start).count();
    result.status = run.Wait();
    for (std::size_t i = 0; i < stats.size(); ++i) {
      result.worker_events += stats[i].events;
      if (!stats[i].error.empty()) {
        result.errors.push_back("worker " + std::to_string(i) + ": " + stats[i].error);
      }
    }
  }
  std::ifstream report_file(out_path);
  std::stringstream text;
  text << report_file.rdbuf();
  const std::string json = text.str();
  result.parsed =
      !json.empty() && google::protobuf::util::JsonStringToMessage(json, &result.report).ok();
  std::remove((dir + "/run.json").c_str());
  std::remove((dir + "/token").c_str());
  std::remove(out_path.c_str());
  std::remove((dir + "/events.log").c_str());
  ::rmdir(dir.c_str());
  return result;
}

double EventsPerSecond(const RunResult& r) {
  return r.report.wall_seconds() > 0
             ? static_cast<double>(r.report.events()) / r.report.wall_seconds()
             : 0;
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n == 0 ? 0 : n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

// The event log's cost at the saturated rate: rounds of (none, written, synced), each
// kind's median; false when a run failed. Target: written >= 0.90 x none.
bool CompareEventLogs(const Options& o) {
  std::vector<double> rates[3];
  bool ok = true;
  for (std::int64_t round = 0; round < o.event_log_rounds; ++round) {
    for (const EventLog log : {EventLog::kNone, EventLog::kWritten, EventLog::kSynced}) {
      const RunResult r = RunOnce(o, Clock::duration::zero(), log);
      ok = ok && r.status == 0 && r.parsed && r.report.done() && r.errors.empty();
      rates[static_cast<int>(log)].push_back(EventsPerSecond(r));
    }
  }
  const double none = Median(rates[0]);
  const double written = Median(rates[1]);
  const double synced = Median(rates[2]);
  std::printf(
      "\nEvent log, saturated, medians of %lld interleaved runs each: none %.0f events/s, "
      "--event-log %.0f (%.3f x), --event-log-fsync %.0f (%.3f x); target written >= 0.90 x: "
      "%s\n",
      static_cast<long long>(o.event_log_rounds), none, written, none > 0 ? written / none : 0,
      synced, none > 0 ? synced / none : 0, written >= 0.9 * none ? "PASS" : "FAIL");
  return ok;
}

// Prints one run's figures; false when it failed.
bool Print(const char* title, const RunResult& r) {
  const v1::RunReport& report = r.report;
  const double events_per_second =
      report.wall_seconds() > 0 ? static_cast<double>(report.events()) / report.wall_seconds() : 0;
  std::printf("%s\n", title);
  std::printf(
      "  run: exit %d, done %s, %lld samples trained, %lld events (%lld refused) in %.3f s\n",
      r.status, report.done() ? "yes" : "no", static_cast<long long>(report.counters().trained()),
      static_cast<long long>(report.events()), static_cast<long long>(report.rejected_events()),
      report.wall_seconds());
  std::printf(
      "  events handled per second: %.0f (the workers sent %lld in %.3f s, start-up "
      "included)\n",
      events_per_second, static_cast<long long>(r.worker_events), r.worker_seconds);
  std::printf(
      "  event-to-command latency in the scheduler, ms: p50 %.3f, p99 %.3f, max %.3f "
      "(%lld commands)\n",
      1e3 * report.command_latency_p50_seconds(), 1e3 * report.command_latency_p99_seconds(),
      1e3 * report.command_latency_max_seconds(),
      static_cast<long long>(report.command_latency_count()));
  for (const std::string& error : r.errors) std::printf("  %s\n", error.c_str());
  const bool ok = r.status == 0 && r.parsed && report.done() && r.errors.empty();
  if (!ok)
    std::printf("  the run FAILED (exit %d, report %s)\n", r.status, r.parsed ? "read" : "missing");
  return ok;
}

int Main(int argc, char** argv) {
  const Options o = Parse(argc, argv);
  std::printf(
      "rlsched run, %s, %lld engines x %lld, %lld steps of %lld prompts x %lld samples, pause "
      "reported %s\n\n",
      o.mode.c_str(), static_cast<long long>(o.engines), static_cast<long long>(o.concurrency),
      static_cast<long long>(o.steps), static_cast<long long>(o.prompts),
      static_cast<long long>(o.samples), o.per_sample_pause ? "per sample" : "in one event");
  const RunResult saturated = RunOnce(o, Clock::duration::zero());
  bool ok = Print("Saturated (every sample reported finished at once):", saturated);
  // Paced: each sample takes outstanding / rate seconds, so that the engines offer
  // kPacedRate events per second (fewer when the scheduler is slower).
  constexpr double kPacedRate = 20000;
  const double outstanding = static_cast<double>(o.engines * o.concurrency);
  const auto think = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(outstanding / kPacedRate));
  const RunResult paced = RunOnce(o, think);
  char title[160];
  std::snprintf(title, sizeof title,
                "\nPaced at %.0f events/s (every sample reported finished %.1f ms after its "
                "dispatch):",
                kPacedRate, std::chrono::duration<double, std::milli>(think).count());
  ok = Print(title, paced) && ok;
  const double rate =
      saturated.report.wall_seconds() > 0
          ? static_cast<double>(saturated.report.events()) / saturated.report.wall_seconds()
          : 0;
  const double p99_ms = 1e3 * paced.report.command_latency_p99_seconds();
  std::printf("\nTargets: saturated >= 20,000 events/s: %.0f %s; paced p99 < 5 ms: %.3f ms %s\n",
              rate, rate >= 20000 ? "PASS" : "FAIL", p99_ms, p99_ms < 5.0 ? "PASS" : "FAIL");
  if (o.event_log_rounds > 0) ok = CompareEventLogs(o) && ok;
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "runtime_overhead: %s\n", e.what());
    return 2;
  }
}
