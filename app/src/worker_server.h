// worker_server.h — the gRPC server of a live run (`rlsched run`): engines and the
// trainer attach with Scheduler.Attach (proto/rlsched/v1/runtime.proto), and the
// runtime's commands go to them.
//
// Overview
//   A worker opens the Attach stream and says Hello (role, engine id, max_concurrent,
//   the version it holds, the run's token). A wrong or missing token, a second
//   connection for an attached engine id or a second trainer is refused (Goodbye with
//   the reason, UNAUTHENTICATED or ALREADY_EXISTS) and logged. An engine's Hello is
//   posted as EngineAttached, with the samples it says it holds (a new engine joins; the
//   same id attaching again after a failure rejoins; an engine a resumed scheduler
//   knows is kept when it holds what the scheduler thinks);
//   then each event it sends is posted to the runtime, after checking that it speaks
//   for itself (engine-scoped events carry its own id; a trainer sends
//   TrainStepFinished and GroupFiltered only). A dropped stream, or no message for
//   longer than the heartbeat timeout (the stream is cancelled), is EngineFailed for
//   an engine; for the trainer the run waits: the unfinished trainer call is sent
//   again when a trainer attaches, and nothing generated is lost. An engine's
//   heartbeats carry its load (requests running and waiting), handed to the runtime
//   (Runtime::ReportLoad) for the run's report.
//
//   Requests. Scheduler.Call answers the daemon's requests (wire::Solve, as `rlsched
//   serve` does) on the same server, for a caller presenting the run's token in the
//   metadata key "rlsched-token" (UNAUTHENTICATED otherwise, counted in refused() and
//   logged); a cancelled call or one past its deadline stops a simulation.
//
//   Weight syncs. A SyncWeights that comes with the engine's part of a weight-sync plan
//   (scheduler::EngineTransfers) names the plan's id (SyncWeights.plan_id); the part
//   itself (a WeightSyncPlan: the transfer group, the membership, the engine's ranks,
//   each rank's ReshardRankPart as the binary plan file has it, its transfers and
//   bytes) goes before it, once per plan id and connection. A plan's id is its epoch
//   (the membership's number) and a digest of its plan (the summary and every
//   transfer), its membership and its group. When a sync first uses a plan, the trainer
//   is sent its part (the senders': every trainer rank's ReshardRankPart); a trainer
//   that attaches is sent the current one. The parts are built straight from the plan
//   into the messages that carry them (wire::ReshardRankParts, equal to the binary plan
//   file's): the trainer's once per plan, an engine's once per plan and connection; no
//   plan file is written or read. At info level the log gives each plan's cost (id,
//   index and the trainer's part, in ms), at debug each engine part's.
//
// Thread-safety: the gRPC handlers run on the server's threads, Execute() and Train()
// on the runtime's; a connection's writes are serialised.

#ifndef RLSCHED_APP_WORKER_SERVER_H_
#define RLSCHED_APP_WORKER_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "rlsched/scheduler/runtime.h"
#include "rlsched/v1/runtime.grpc.pb.h"
#include "rlsched/v1/runtime.pb.h"

namespace rlsched::app {

struct WorkerServerOptions {
  std::string listen;  // "unix:PATH" or "HOST:PORT" (port 0: any free port)
  std::string token;   // the shared token every worker presents
  // TLS: the server's certificate chain and private key (PEM); both empty: plaintext.
  std::string tls_cert_pem;
  std::string tls_key_pem;
  double heartbeat_timeout_seconds = 10;
  // A stream that has not said Hello within this many seconds is closed (0: never):
  // each holds two server threads until then.
  double hello_timeout_seconds = 10;
  // At most this many streams wait for their Hello at once (0: no cap); one more is
  // turned away (RESOURCE_EXHAUSTED, counted in refused(); the worker SDK retries).
  std::int64_t max_waiting_streams = 64;
  // An engine with requests running whose generated-token counter (Heartbeat.
  // generated_tokens) has not moved for this many seconds is stuck: told Goodbye, then
  // dropped (EngineFailed: its samples go back to the queue). 0: never; engines that do
  // not send the counter are not judged.
  double stuck_timeout_seconds = 100;
  v1::Welcome welcome;  // what every worker is told (the run's config, the time scale)
  // The weight-sync plans' transfer group (TransferGroup): its backend, and where it
  // meets (empty and 0: not given).
  std::string weight_sync_backend = "gloo";
  std::string weight_sync_address;
  int weight_sync_port = 0;
};

// Why an engine's Hello cannot join a run whose newest weights are version `latest`
// (the core's bounds on EngineAttached: engine id, concurrency, version, the samples it
// holds), or nullopt.
std::optional<std::string> CheckEngineHello(const v1::Hello& hello, std::int64_t latest);

class WorkerServer final : public v1::Scheduler::Service,
                           public scheduler::EngineBackend,
                           public scheduler::TrainerBackend {
 public:
  explicit WorkerServer(WorkerServerOptions options);
  ~WorkerServer() override;

  // Starts listening; workers' events go to `runtime`. Throws std::runtime_error when
  // the address cannot be bound (naming it).
  void Start(scheduler::Runtime& runtime);
  // Says Goodbye(reason) to every worker and stops (waiting up to `grace` for their
  // streams to close). Idempotent.
  void Shutdown(const std::string& reason, std::chrono::milliseconds grace);
  int port() const { return port_; }  // the bound TCP port (0 for a Unix socket)

  std::int64_t engines_attached() const;
  std::vector<std::int64_t> attached_engines() const;  // ascending
  // Posts EngineFailed for `engine` unless it is attached (checked and posted under the
  // lock an attach takes, so that no attach slips between); whether it posted.
  // Thread-safe.
  bool FailUnlessAttached(std::int64_t engine);
  bool trainer_attached() const;
  std::int64_t refused() const { return refused_.load(); }
  // Events refused before the core (malformed, or not the worker's to send), each told
  // to its worker (Refused).
  std::int64_t ignored_events() const { return ignored_events_.load(); }
  std::int64_t stuck_engines() const { return stuck_engines_.load(); }  // dropped as stuck
  // Tells the worker that sent `event` that the core refused it, and why (the runtime's
  // on_reject). Thread-safe.
  void Rejected(const scheduler::Event& event, const std::string& why);
  std::int64_t waiting_streams() const;  // connected, no Hello yet

  grpc::Status Attach(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::SchedulerMessage, v1::WorkerMessage>* stream) override;
  grpc::Status Call(grpc::ServerContext* context, const v1::Request* request,
                    v1::Reply* reply) override;
  void Execute(const scheduler::Command& command,
               const scheduler::EngineTransfers* transfers) override;
  void Train(const scheduler::StartTrain& call) override;

 private:
  struct Connection;
  bool Send(Connection& connection, const v1::SchedulerMessage& message);
  // Queues the Welcome: before the connection is registered, so before any command.
  void SendWelcome(Connection& connection);
  grpc::Status Refuse(Connection& connection, grpc::StatusCode code, const std::string& why);
  void Watch();
  void Heartbeat(Connection& connection, const v1::Heartbeat& heartbeat);
  // The pending trainer call to send an attaching trainer: none when its Hello says it
  // is training it, or finished it (then its finish is posted). mutex_ held.
  std::optional<scheduler::StartTrain> CallToResend(const v1::Hello& hello);
  // Attach's steps. The door: the stream waits for its Hello (watched for the deadline),
  // or is turned away when the door is full (a status then).
  std::optional<grpc::Status> EnterDoor(const std::shared_ptr<Connection>& connection);
  // The Hello checked and the worker registered; a status when refused. `resend`: the
  // trainer call a returning trainer gets again.
  std::optional<grpc::Status> Admit(const std::shared_ptr<Connection>& connection,
                                    const v1::Hello& hello,
                                    std::optional<scheduler::StartTrain>& resend);
  // The core told of an engine (EngineAttached); a trainer sent the plan and its call.
  void Announce(Connection& connection, const v1::Hello& hello,
                const std::optional<scheduler::StartTrain>& resend);
  // After the stream closed: a lost engine failed, the worker unregistered.
  void Detach(const std::shared_ptr<Connection>& connection, grpc::ServerContext* context);
  // Whether the attached trainer said (Hello.call) it has had `call`. mutex_ held.
  bool TrainerHas(const scheduler::StartTrain& call) const;
  // Posts the finish the trainer said it made of its call. mutex_ held.
  void FinishedBeforeAttach();
  // Checks an event, binds it to its sender and posts it (or tells the worker why not).
  void Receive(Connection& connection, const v1::OrchestratorEvent& message);
  static std::optional<std::string> Forbidden(const Connection& connection,
                                              const scheduler::Event& event);
  void TellRefused(Connection& connection, const v1::OrchestratorEvent& event,
                   const std::string& why);
  // Drops the streams silent past their deadline (mutex_ held; `now` in NowMillis()).
  void DropSilent(std::int64_t now);
  // Tells, then drops, the engines stuck past their deadline (mutex_ held).
  void DropStuck(std::int64_t now);
  // The plan of `transfers` (built and sent to the trainer when it is a new one) and
  // the engine's WeightSyncPlan when `connection` has not had it; the plan's id. The
  // plan mutex held.
  std::string PreparePlan(const scheduler::EngineTransfers& transfers, Connection& connection);
  // Fills `part` (empty) with the WeightSyncPlan of `ranks` GPUs from `rank_offset` of
  // the current plan, each GPU's ReshardRankPart built in place, without the worker's
  // fields (replica, transfers, bytes). The plan mutex held.
  void PlanPart(std::int64_t rank_offset, std::int64_t ranks, v1::WeightSyncPlan& part);

  WorkerServerOptions options_;
  scheduler::Runtime* runtime_ = nullptr;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;

  mutable std::mutex mutex_;  // guards the maps and the pending call
  std::map<std::int64_t, std::shared_ptr<Connection>> engines_;
  std::shared_ptr<Connection> trainer_;
  std::map<Connection*, std::shared_ptr<Connection>> all_;
  std::map<Connection*, std::shared_ptr<Connection>> waiting_;  // no Hello yet
  std::optional<scheduler::StartTrain> pending_call_;           // sent, not yet finished
  std::optional<v1::TrainCall> trainer_said_;                   // the attached trainer's Hello.call
  std::atomic<std::int64_t> refused_{0};
  std::atomic<std::int64_t> ignored_events_{0};
  std::atomic<std::int64_t> stuck_engines_{0};
  bool shut_down_ = false;

  std::condition_variable watch_cv_;
  std::thread watcher_;

  // The current weight-sync plan (the engine node's thread, and a trainer's attach).
  std::mutex plan_mutex_;
  struct CurrentPlan;
  std::unique_ptr<CurrentPlan> plan_;
};

}  // namespace rlsched::app

#endif  // RLSCHED_APP_WORKER_SERVER_H_
