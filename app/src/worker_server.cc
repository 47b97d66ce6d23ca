// The gRPC server of a live run (worker_server.h).

#include "worker_server.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <deque>
#include <stdexcept>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "rlsched/common/check.h"
#include "rlsched/common/error.h"
#include "rlsched/wire/orchestrator_convert.h"
#include "rlsched/wire/reshard_convert.h"
#include "rlsched/wire/solve.h"

namespace rlsched::app {

namespace {

std::int64_t NowMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A 64-bit digest: strings byte by byte (FNV-1a), integers a word at a time.
class Digest {
 public:
  void Add(std::string_view bytes) {
    Add(static_cast<std::int64_t>(bytes.size()));
    for (const char c : bytes) {
      hash_ = (hash_ ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
    }
  }
  void Add(std::int64_t value) {
    hash_ = (hash_ ^ static_cast<std::uint64_t>(value)) * 0x9e3779b97f4a7c15ull;
    hash_ ^= hash_ >> 31;
  }
  std::uint64_t value() const { return hash_; }

 private:
  std::uint64_t hash_ = 0xcbf29ce484222325ull;
};

// Adds every field of `plan` that its binary plan file holds: the summary (as
// serialised), the parameter names and every transfer. O(transfers).
void AddPlan(Digest& digest, const rollout::ReshardPlan& plan, const v1::ReshardPlan& summary) {
  digest.Add(summary.SerializeAsString());
  digest.Add(static_cast<std::int64_t>(plan.param_names.size()));
  for (const std::string& name : plan.param_names) digest.Add(name);
  digest.Add(static_cast<std::int64_t>(plan.transfers.size()));
  const auto add_slice = [&](const std::vector<rollout::Range>& slice) {
    digest.Add(static_cast<std::int64_t>(slice.size()));
    for (const rollout::Range& r : slice) {
      digest.Add(r.begin);
      digest.Add(r.end);
    }
  };
  for (const rollout::Transfer& t : plan.transfers) {
    digest.Add(t.bucket);
    digest.Add(t.src_rank);
    digest.Add(t.src_param);
    add_slice(t.src_slice);
    digest.Add(static_cast<std::int64_t>(t.dst_ranks.size()));
    for (const std::int64_t d : t.dst_ranks) digest.Add(d);
    digest.Add(t.dst_param);
    add_slice(t.dst_slice);
    digest.Add(t.bytes);
    digest.Add(static_cast<std::int64_t>(t.quantize));
  }
}

double MillisSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace

// The weight-sync plan the last SyncWeights used: its parts are built straight into
// the messages that carry them (no plan file is written or read), the trainer's when the
// plan is new, an engine's when its connection first needs it.
struct WorkerServer::CurrentPlan {
  std::int64_t epoch = -1;
  std::shared_ptr<const rollout::ReshardPlan> plan;
  std::shared_ptr<const rollout::ReshardPlan> indexed;  // the one `parts` reads (equal)
  std::string id;
  std::vector<std::int64_t> members;
  v1::TransferGroup group;
  v1::ReshardPlan summary;                        // without the transfers
  std::unique_ptr<wire::ReshardRankParts> parts;  // of *indexed
  v1::SchedulerMessage trainer;                   // its WeightSyncPlan
  double build_ms = 0;                            // spent on this plan's id, index and parts so far
};

// One worker's stream. Messages to it go through an outbox that the connection's own
// writer thread drains, so that a command's sender (a node of the runtime's graph)
// never waits for the network.
struct WorkerServer::Connection {
  grpc::ServerContext* context = nullptr;
  grpc::ServerReaderWriter<v1::SchedulerMessage, v1::WorkerMessage>* stream = nullptr;
  v1::WorkerRole role = v1::WORKER_ROLE_UNSPECIFIED;
  std::int64_t engine = -1;
  std::atomic<std::int64_t> last_seen_ms{0};
  std::atomic<bool> left{false};
  std::string peer;
  std::string plan_id;  // the last WeightSyncPlan sent (guarded by the plan mutex)

  std::mutex outbox_mutex;  // guards the three below
  std::condition_variable outbox_cv;
  std::deque<v1::SchedulerMessage> outbox;
  bool closed = false;  // no message is taken any more (the handler is returning)
  std::thread writer;
  // When the write under way started (NowMillis()), 0 when none is: a peer that stops
  // reading blocks it, which the watcher takes as a loss.
  std::atomic<std::int64_t> write_started_ms{0};
  // Liveness (an engine sending Heartbeat.generated_tokens): its counter, when it last
  // moved or the engine last ran nothing (0: not judged), when it was told it is stuck.
  std::atomic<std::int64_t> tokens{-1};
  std::atomic<std::int64_t> progress_ms{0};
  std::atomic<std::int64_t> stuck_ms{0};

  // Queues `message`; false when the connection is closed.
  bool Send(v1::SchedulerMessage message) {
    {
      std::lock_guard lock(outbox_mutex);
      if (closed) return false;
      outbox.push_back(std::move(message));
    }
    outbox_cv.notify_one();
    return true;
  }
  // The writer thread: writes the outbox in order until closed and empty. A failed
  // write cancels the stream (its reader then ends the session).
  void Write() {
    std::unique_lock lock(outbox_mutex);
    while (true) {
      outbox_cv.wait(lock, [this] { return closed || !outbox.empty(); });
      if (outbox.empty()) return;  // closed
      v1::SchedulerMessage message = std::move(outbox.front());
      outbox.pop_front();
      lock.unlock();
      write_started_ms = NowMillis();
      const bool written = stream->Write(message);
      write_started_ms = 0;
      lock.lock();
      if (!written) {
        outbox.clear();
        closed = true;
        context->TryCancel();
        return;
      }
    }
  }
  // Takes no more messages, writes those queued, and waits for the writer.
  void Close() {
    {
      std::lock_guard lock(outbox_mutex);
      closed = true;
    }
    outbox_cv.notify_one();
    if (writer.joinable()) writer.join();
  }
};

WorkerServer::WorkerServer(WorkerServerOptions options) : options_(std::move(options)) {}

WorkerServer::~WorkerServer() { Shutdown("the scheduler stopped", std::chrono::milliseconds(500)); }

void WorkerServer::Start(scheduler::Runtime& runtime) {
  runtime_ = &runtime;
  grpc::ServerBuilder builder;
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
  if (!options_.tls_cert_pem.empty() || !options_.tls_key_pem.empty()) {
    grpc::SslServerCredentialsOptions tls;
    tls.pem_key_cert_pairs.push_back({options_.tls_key_pem, options_.tls_cert_pem});
    credentials = grpc::SslServerCredentials(tls);
  }
  builder.AddListeningPort(options_.listen, credentials, &port_);
  builder.RegisterService(this);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr) {
    throw std::runtime_error("--listen: cannot listen on " + options_.listen);
  }
  watcher_ = std::thread([this] { Watch(); });
}

void WorkerServer::Shutdown(const std::string& reason, std::chrono::milliseconds grace) {
  std::vector<std::shared_ptr<Connection>> connections;
  {
    std::lock_guard lock(mutex_);
    if (shut_down_) return;
    shut_down_ = true;
    for (const auto& [key, connection] : all_) connections.push_back(connection);
  }
  watch_cv_.notify_all();
  if (watcher_.joinable()) watcher_.join();
  v1::SchedulerMessage goodbye;
  goodbye.mutable_goodbye()->set_reason(reason);
  for (const auto& connection : connections) Send(*connection, goodbye);
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + grace);
}

std::int64_t WorkerServer::engines_attached() const {
  std::lock_guard lock(mutex_);
  return static_cast<std::int64_t>(engines_.size());
}

bool WorkerServer::FailUnlessAttached(std::int64_t engine) {
  std::lock_guard lock(mutex_);  // an attach of it is posted before or after, not between
  if (engines_.contains(engine)) return false;
  runtime_->Post(scheduler::EngineFailed{.engine = engine});
  return true;
}

std::vector<std::int64_t> WorkerServer::attached_engines() const {
  std::lock_guard lock(mutex_);
  std::vector<std::int64_t> ids;
  for (const auto& [id, connection] : engines_) ids.push_back(id);
  return ids;
}

std::int64_t WorkerServer::waiting_streams() const {
  std::lock_guard lock(mutex_);
  return static_cast<std::int64_t>(waiting_.size());
}

bool WorkerServer::trainer_attached() const {
  std::lock_guard lock(mutex_);
  return trainer_ != nullptr;
}

bool WorkerServer::Send(Connection& connection, const v1::SchedulerMessage& message) {
  return connection.Send(message);
}

void WorkerServer::SendWelcome(Connection& connection) {
  v1::SchedulerMessage welcome;
  *welcome.mutable_welcome() = options_.welcome;
  Send(connection, welcome);
}

grpc::Status WorkerServer::Refuse(Connection& connection, grpc::StatusCode code,
                                  const std::string& why) {
  ++refused_;
  spdlog::warn("run: refused worker {}: {}", connection.peer, why);
  v1::SchedulerMessage goodbye;
  goodbye.mutable_goodbye()->set_reason("refused: " + why);
  Send(connection, goodbye);
  return grpc::Status(code, why);
}

std::optional<std::string> CheckEngineHello(const v1::Hello& hello, std::int64_t latest) {
  try {
    CheckInRange("hello.engine", hello.engine(), 0, scheduler::kMaxEngineId);
    CheckInRange("hello.max_concurrent", hello.max_concurrent(), 1, scheduler::kMaxConcurrent);
    CheckInRange("hello.version", hello.version(), -1, latest);
  } catch (const FieldError& e) {
    if (e.field() != "hello.version") return e.what();
    return std::string(e.what()) + " (the newest weights are version " + std::to_string(latest) +
           ")";
  }
  if (hello.samples_size() > hello.max_concurrent()) {
    return "hello.samples: at most max_concurrent (" + std::to_string(hello.max_concurrent()) +
           "), got " + std::to_string(hello.samples_size());
  }
  std::vector<std::int64_t> held(hello.samples().begin(), hello.samples().end());
  std::sort(held.begin(), held.end());
  if (!held.empty() && held.front() < 0) {
    return "hello.samples: each >= 0, got " + std::to_string(held.front());
  }
  const auto repeated = std::adjacent_find(held.begin(), held.end());
  if (repeated != held.end()) {
    return "hello.samples: each sample once, got " + std::to_string(*repeated) + " twice";
  }
  return std::nullopt;
}

grpc::Status WorkerServer::Call(grpc::ServerContext* context, const v1::Request* request,
                                v1::Reply* reply) {
  const auto& metadata = context->client_metadata();
  const auto token = metadata.find("rlsched-token");
  if (token == metadata.end() ||
      std::string_view(token->second.data(), token->second.size()) != options_.token) {
    ++refused_;
    spdlog::warn("run: refused a call from {}: wrong or missing token", context->peer());
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "wrong or missing token");
  }
  *reply = wire::Solve(*request, [context] { return context->IsCancelled(); });
  return grpc::Status::OK;
}

grpc::Status WorkerServer::Attach(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<v1::SchedulerMessage, v1::WorkerMessage>* stream) {
  auto connection = std::make_shared<Connection>();
  connection->context = context;
  connection->stream = stream;
  connection->peer = context->peer();
  connection->last_seen_ms = NowMillis();
  if (std::optional<grpc::Status> turned_away = EnterDoor(connection)) return *turned_away;
  connection->writer = std::thread([raw = connection.get()] { raw->Write(); });
  // The handler's stream lives until it returns: the writer stops first.
  struct CloseOnReturn {
    Connection* connection;
    ~CloseOnReturn() { connection->Close(); }
  } close_on_return{connection.get()};

  v1::WorkerMessage first;
  const bool read = stream->Read(&first);
  {
    std::lock_guard lock(mutex_);
    waiting_.erase(connection.get());
  }
  if (!read) return grpc::Status(grpc::StatusCode::CANCELLED, "no hello");
  if (!first.has_hello()) {
    return Refuse(*connection, grpc::StatusCode::INVALID_ARGUMENT,
                  "the first message must be hello");
  }
  std::optional<scheduler::StartTrain> resend;
  if (std::optional<grpc::Status> refused = Admit(connection, first.hello(), resend)) {
    return *refused;
  }
  Announce(*connection, first.hello(), resend);

  v1::WorkerMessage message;
  while (stream->Read(&message)) {
    connection->last_seen_ms = NowMillis();
    if (message.has_heartbeat()) {
      Heartbeat(*connection, message.heartbeat());
    } else if (message.has_event()) {
      Receive(*connection, message.event());
    }
  }
  Detach(connection, context);
  return grpc::Status::OK;
}

std::optional<grpc::Status> WorkerServer::EnterDoor(const std::shared_ptr<Connection>& connection) {
  std::lock_guard lock(mutex_);
  const auto cap = static_cast<std::size_t>(options_.max_waiting_streams);
  if (cap > 0 && waiting_.size() >= cap) {
    ++refused_;
    spdlog::warn("run: turned away {}: {} streams have not said hello yet (--max-waiting)",
                 connection->peer, waiting_.size());
    return grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        fmt::format("{} streams have not said hello yet; try again later", waiting_.size()));
  }
  waiting_[connection.get()] = connection;
  return std::nullopt;
}

std::optional<grpc::Status> WorkerServer::Admit(const std::shared_ptr<Connection>& connection,
                                                const v1::Hello& hello,
                                                std::optional<scheduler::StartTrain>& resend) {
  if (hello.token() != options_.token) {
    return Refuse(*connection, grpc::StatusCode::UNAUTHENTICATED, "wrong or missing token");
  }
  connection->role = hello.role();
  if (!hello.name().empty()) connection->peer += " (" + hello.name() + ")";
  if (hello.role() == v1::WORKER_ROLE_ENGINE) {
    // Everything the core checks of EngineAttached, so that no engine is welcomed that
    // the core then refuses (attached, idle and never told). Read before mutex_: the
    // newest version only grows, so an engine within it now stays within it.
    if (const std::optional<std::string> why =
            CheckEngineHello(hello, runtime_->Status().counters.steps_finished)) {
      return Refuse(*connection, grpc::StatusCode::INVALID_ARGUMENT, *why);
    }
  }
  std::lock_guard lock(mutex_);
  if (shut_down_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the run is over");
  if (hello.role() == v1::WORKER_ROLE_ENGINE) {
    if (engines_.contains(hello.engine())) {
      return Refuse(*connection, grpc::StatusCode::ALREADY_EXISTS,
                    "engine " + std::to_string(hello.engine()) + " is already attached");
    }
    connection->engine = hello.engine();
    SendWelcome(*connection);  // queued before any command can be
    engines_[hello.engine()] = connection;
  } else if (hello.role() == v1::WORKER_ROLE_TRAINER) {
    if (trainer_ != nullptr) {
      return Refuse(*connection, grpc::StatusCode::ALREADY_EXISTS, "a trainer is already attached");
    }
    SendWelcome(*connection);
    trainer_ = connection;
    resend = CallToResend(hello);
  } else {
    return Refuse(*connection, grpc::StatusCode::INVALID_ARGUMENT,
                  "hello.role: must be engine or trainer");
  }
  all_[connection.get()] = connection;
  return std::nullopt;
}

void WorkerServer::Announce(Connection& connection, const v1::Hello& hello,
                            const std::optional<scheduler::StartTrain>& resend) {
  if (connection.role == v1::WORKER_ROLE_ENGINE) {
    spdlog::info("run: engine {} attached from {}", connection.engine, connection.peer);
    runtime_->Post(
        scheduler::EngineAttached{.engine = hello.engine(),
                                  .max_concurrent = hello.max_concurrent(),
                                  .version = hello.version(),
                                  .samples = {hello.samples().begin(), hello.samples().end()},
                                  .released = hello.released()});
    return;
  }
  spdlog::info("run: trainer attached from {}", connection.peer);
  {
    std::lock_guard plan_lock(plan_mutex_);
    if (plan_ != nullptr && connection.plan_id != plan_->id) {
      Send(connection, plan_->trainer);
      connection.plan_id = plan_->id;
    }
  }
  if (resend) {
    spdlog::info("run: sending trainer call {}.{} again", resend->step, resend->call);
    v1::SchedulerMessage message;
    *message.mutable_command() = wire::ToCommandMessage(*resend);
    Send(connection, message);
  }
}

void WorkerServer::Detach(const std::shared_ptr<Connection>& connection,
                          grpc::ServerContext* context) {
  // A lost engine's EngineFailed is posted while its id is still taken, so that the
  // EngineJoined of the same id attaching again comes after it.
  bool shut_down = false;
  {
    std::lock_guard lock(mutex_);
    shut_down = shut_down_;
  }
  if (!shut_down && connection->role == v1::WORKER_ROLE_ENGINE && !connection->left) {
    spdlog::warn("run: engine {} lost ({}); its samples go back to the queue", connection->engine,
                 context->IsCancelled() ? "silent, stuck or cancelled" : "stream closed");
    runtime_->Post(scheduler::EngineFailed{.engine = connection->engine});
  }
  {
    std::lock_guard lock(mutex_);
    all_.erase(connection.get());
    if (connection->role == v1::WORKER_ROLE_ENGINE) {
      engines_.erase(connection->engine);
    } else if (trainer_ == connection) {
      trainer_.reset();
      trainer_said_.reset();
    }
  }
  connection->Close();  // the queued messages are written (or the stream is cancelled)
  if (!shut_down && connection->role == v1::WORKER_ROLE_TRAINER) {
    spdlog::warn("run: the trainer is lost; the run waits until a trainer attaches");
  }
}

std::optional<scheduler::StartTrain> WorkerServer::CallToResend(const v1::Hello& hello) {
  trainer_said_.reset();
  if (hello.has_call()) trainer_said_ = hello.call();
  if (!pending_call_ || !TrainerHas(*pending_call_)) return pending_call_;  // sent (again)
  if (trainer_said_->finished()) FinishedBeforeAttach();
  return std::nullopt;  // finished, or still training it
}

bool WorkerServer::TrainerHas(const scheduler::StartTrain& call) const {
  return trainer_said_ && trainer_said_->step() == call.step && trainer_said_->call() == call.call;
}

void WorkerServer::FinishedBeforeAttach() {
  spdlog::info("run: the trainer finished call {}.{} before attaching", trainer_said_->step(),
               trainer_said_->call());
  runtime_->Post(
      scheduler::TrainStepFinished{.step = trainer_said_->step(), .call = trainer_said_->call()});
  pending_call_.reset();
  trainer_said_.reset();  // posted once
}

void WorkerServer::Heartbeat(Connection& connection, const v1::Heartbeat& heartbeat) {
  if (connection.role != v1::WORKER_ROLE_ENGINE) return;
  if (heartbeat.has_generated_tokens()) {
    if (heartbeat.running() <= 0 || heartbeat.generated_tokens() > connection.tokens.load()) {
      connection.progress_ms = NowMillis();  // moving, or nothing to move
    }
    connection.tokens = std::max(connection.tokens.load(), heartbeat.generated_tokens());
  }
  try {
    runtime_->ReportLoad(connection.engine, heartbeat.running(), heartbeat.waiting());
  } catch (const std::invalid_argument& e) {
    spdlog::warn("run: engine {} sent an invalid heartbeat: heartbeat.{}", connection.engine,
                 e.what());
  }
}

// Why `connection` may not send `event` (a trainer: TrainStepFinished and GroupFiltered;
// an engine: its own reports), or nullopt.
std::optional<std::string> WorkerServer::Forbidden(const Connection& connection,
                                                   const scheduler::Event& event) {
  const bool trainer_event = std::holds_alternative<scheduler::TrainStepFinished>(event);
  if (connection.role == v1::WORKER_ROLE_TRAINER) {
    if (trainer_event || std::holds_alternative<scheduler::GroupFiltered>(event)) {
      return std::nullopt;
    }
    return "event: the trainer sends train_step_finished and group_filtered only";
  }
  if (trainer_event || std::holds_alternative<scheduler::EngineJoined>(event) ||
      std::holds_alternative<scheduler::EngineAttached>(event) ||
      std::holds_alternative<scheduler::EngineFailed>(event) ||
      std::holds_alternative<scheduler::PromptsAvailable>(event)) {
    return "event: an engine reports its own generations, pauses, weights, release and leave "
           "only";
  }
  const std::optional<std::int64_t> engine = scheduler::EngineOf(event);
  if (engine && *engine != connection.engine) {
    return "engine: must be this stream's engine " + std::to_string(connection.engine) + ", got " +
           std::to_string(*engine);
  }
  return std::nullopt;
}

namespace {

// The event's reports speak for the stream's engine (a trainer's for none), whatever the
// worker wrote.
void BindToSender(scheduler::Event& event, std::int64_t engine) {
  std::visit(
      [engine](auto& e) {
        using T = std::decay_t<decltype(e)>;
        if constexpr (std::is_same_v<T, scheduler::GenerationProgressed> ||
                      std::is_same_v<T, scheduler::GenerationFinished> ||
                      std::is_same_v<T, scheduler::GroupFiltered>) {
          e.engine = engine;
        }
      },
      event);
}

}  // namespace

void WorkerServer::Receive(Connection& connection, const v1::OrchestratorEvent& message) {
  scheduler::Event event;
  try {
    event = wire::ToEvent(message);
  } catch (const std::invalid_argument& e) {
    TellRefused(connection, message, e.what());
    return;
  }
  BindToSender(
      event, connection.role == v1::WORKER_ROLE_ENGINE ? connection.engine : scheduler::kAnyEngine);
  if (const std::optional<std::string> why = Forbidden(connection, event)) {
    TellRefused(connection, message, *why);
    return;
  }
  if (connection.role == v1::WORKER_ROLE_TRAINER) {
    if (const auto* finished = std::get_if<scheduler::TrainStepFinished>(&event)) {
      std::lock_guard lock(mutex_);
      if (pending_call_ && pending_call_->step == finished->step &&
          pending_call_->call == finished->call) {
        pending_call_.reset();
      }
    }
  } else if (std::holds_alternative<scheduler::EngineLeft>(event)) {
    connection.left = true;
  }
  runtime_->Post(std::move(event));
}

void WorkerServer::TellRefused(Connection& connection, const v1::OrchestratorEvent& event,
                               const std::string& why) {
  ++ignored_events_;
  spdlog::warn("run: worker {} sent an event refused before the core: {}", connection.peer, why);
  v1::SchedulerMessage message;
  *message.mutable_refused()->mutable_event() = event;
  message.mutable_refused()->set_reason(why);
  Send(connection, message);
}

void WorkerServer::Rejected(const scheduler::Event& event, const std::string& why) {
  if (std::holds_alternative<scheduler::EngineFailed>(event) ||
      std::holds_alternative<scheduler::PromptsAvailable>(event)) {
    return;  // the server's and the data loader's own: no worker sent them
  }
  std::shared_ptr<Connection> sender;
  {
    std::lock_guard lock(mutex_);
    if (const std::optional<std::int64_t> engine = scheduler::EngineOf(event)) {
      const auto it = engines_.find(*engine);
      if (it != engines_.end()) sender = it->second;
    } else {
      sender = trainer_;
    }
  }
  if (sender == nullptr) return;  // gone since
  v1::SchedulerMessage message;
  *message.mutable_refused()->mutable_event() = wire::ToEventMessage(event);
  message.mutable_refused()->set_reason(why);
  Send(*sender, message);
}

void WorkerServer::PlanPart(std::int64_t rank_offset, std::int64_t ranks,
                            v1::WeightSyncPlan& part) {
  const auto start = std::chrono::steady_clock::now();
  part.set_plan_id(plan_->id);
  part.set_epoch(plan_->epoch);
  *part.mutable_group() = plan_->group;
  part.mutable_members()->Add(plan_->members.begin(), plan_->members.end());
  part.set_rank_offset(rank_offset);
  part.set_ranks(ranks);
  *part.mutable_summary() = plan_->summary;
  part.mutable_parts()->Reserve(static_cast<int>(ranks));
  for (std::int64_t rank = rank_offset; rank < rank_offset + ranks; ++rank) {
    plan_->parts->BuildPart(rank, *part.add_parts());
  }
  plan_->build_ms += MillisSince(start);
}

std::string WorkerServer::PreparePlan(const scheduler::EngineTransfers& transfers,
                                      Connection& connection) {
  if (plan_ == nullptr || plan_->epoch != transfers.epoch || plan_->plan != transfers.plan) {
    const auto start = std::chrono::steady_clock::now();
    v1::ReshardPlan summary = wire::ToReshardPlanMessage(*transfers.plan, false);
    Digest digest;
    AddPlan(digest, *transfers.plan, summary);
    for (const std::int64_t member : *transfers.members) digest.Add(member);
    digest.Add(options_.weight_sync_backend);
    digest.Add(options_.weight_sync_address);
    digest.Add(std::int64_t{options_.weight_sync_port});
    digest.Add(transfers.world_size);
    std::string id = fmt::format("{}-{:016x}", transfers.epoch, digest.value());
    if (plan_ != nullptr && plan_->id == id) {  // the same plan made again
      plan_->plan = transfers.plan;             // its parts are still those of `indexed`
      return PreparePlan(transfers, connection);
    }
    auto next = std::make_unique<CurrentPlan>();
    next->epoch = transfers.epoch;
    next->plan = transfers.plan;
    next->indexed = transfers.plan;
    next->members = *transfers.members;
    next->id = std::move(id);
    next->summary = std::move(summary);
    next->group.set_name("rlsched-weights-" + next->id);
    next->group.set_backend(options_.weight_sync_backend);
    next->group.set_world_size(transfers.world_size);
    next->group.set_address(options_.weight_sync_address);
    next->group.set_port(options_.weight_sync_port);
    next->parts = std::make_unique<wire::ReshardRankParts>(*transfers.plan);
    next->build_ms = MillisSince(start);
    plan_ = std::move(next);
    // The trainer's part: every trainer GPU's transfers; it sends each once.
    v1::WeightSyncPlan& trainer = *plan_->trainer.mutable_weight_sync_plan();
    PlanPart(0, transfers.plan->trainer_ranks, trainer);
    trainer.set_replica(-1);
    std::int64_t sent = 0;
    trainer.mutable_transfers()->Reserve(static_cast<int>(transfers.plan->transfers.size()));
    for (std::size_t i = 0; i < transfers.plan->transfers.size(); ++i) {
      trainer.add_transfers(static_cast<std::int64_t>(i));
      sent += transfers.plan->transfers[i].bytes;
    }
    trainer.set_bytes(sent);
    spdlog::info(
        "run: weight-sync plan {}: engines [{}], {} transfers in {} buckets, world of {}; id, "
        "index and the trainer's part in {:.2f} ms",
        plan_->id, fmt::join(plan_->members, ", "), transfers.plan->transfers.size(),
        transfers.plan->num_buckets, transfers.world_size, plan_->build_ms);
    std::shared_ptr<Connection> trainer_connection;
    {
      std::lock_guard lock(mutex_);
      trainer_connection = trainer_;
    }
    if (trainer_connection != nullptr && trainer_connection->plan_id != plan_->id) {
      Send(*trainer_connection, plan_->trainer);
      trainer_connection->plan_id = plan_->id;
    }
  }
  if (connection.plan_id != plan_->id) {
    const double before_ms = plan_->build_ms;
    v1::SchedulerMessage message;
    v1::WeightSyncPlan* part = message.mutable_weight_sync_plan();
    PlanPart(transfers.rank_offset, transfers.ranks, *part);
    part->set_replica(transfers.replica);
    part->mutable_transfers()->Add(transfers.transfers.begin(), transfers.transfers.end());
    part->set_bytes(transfers.bytes);
    connection.Send(std::move(message));  // a closed stream: its handler reports the loss
    connection.plan_id = plan_->id;
    spdlog::debug("run: weight-sync plan {}: engine {}'s part in {:.2f} ms ({:.2f} ms so far)",
                  plan_->id, connection.engine, plan_->build_ms - before_ms, plan_->build_ms);
  }
  return plan_->id;
}

void WorkerServer::Execute(const scheduler::Command& command,
                           const scheduler::EngineTransfers* transfers) {
  const std::int64_t engine = scheduler::EngineOf(command);
  std::shared_ptr<Connection> connection;
  {
    std::lock_guard lock(mutex_);
    if (shut_down_) return;  // the run is over: the workers have been told
    const auto it = engines_.find(engine);
    if (it != engines_.end()) connection = it->second;
  }
  if (connection == nullptr) {
    // Its stream is gone (its EngineFailed is posted by its handler), or a resumed run's
    // engine is not back yet (it says what it holds when it is, and the core reconciles:
    // EngineAttached; one that does not come back is failed after the window).
    spdlog::debug("run: engine {} not attached: a command dropped", engine);
    return;
  }
  v1::SchedulerMessage message;
  *message.mutable_command() = wire::ToCommandMessage(command);
  if (transfers != nullptr && transfers->plan != nullptr && transfers->members != nullptr &&
      message.command().has_sync_weights()) {
    std::lock_guard plan_lock(plan_mutex_);
    message.mutable_command()->mutable_sync_weights()->set_plan_id(
        PreparePlan(*transfers, *connection));
  }
  // A closed stream: its handler reports the engine lost (EngineFailed), once.
  if (!Send(*connection, message)) {
    spdlog::debug("run: engine {}: a command after its stream closed, dropped", engine);
  }
}

void WorkerServer::Train(const scheduler::StartTrain& call) {
  std::shared_ptr<Connection> connection;
  {
    std::lock_guard lock(mutex_);
    if (TrainerHas(call)) {  // a resumed run's call, which the attached trainer has had
      if (trainer_said_->finished()) {
        FinishedBeforeAttach();
      } else {
        pending_call_ = call;  // it is training it: not sent again
      }
      return;
    }
    pending_call_ = call;
    connection = trainer_;
  }
  if (connection == nullptr) {
    spdlog::warn("run: no trainer attached; call {}.{} waits for one", call.step, call.call);
    return;
  }
  v1::SchedulerMessage message;
  *message.mutable_command() = wire::ToCommandMessage(call);
  Send(*connection, message);  // when the stream is closed: sent again on attach
}

void WorkerServer::DropSilent(std::int64_t now) {
  const auto hello_ms = static_cast<std::int64_t>(options_.hello_timeout_seconds * 1000);
  if (hello_ms <= 0) return;
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    const std::shared_ptr<Connection>& connection = it->second;
    if (now - connection->last_seen_ms.load() <= hello_ms) {
      ++it;
      continue;
    }
    ++refused_;
    spdlog::warn("run: {} said no hello within {} s; closing it", connection->peer,
                 options_.hello_timeout_seconds);
    connection->context->TryCancel();
    it = waiting_.erase(it);  // once; its handler's erase then finds nothing
  }
}

void WorkerServer::DropStuck(std::int64_t now) {
  const auto stuck_ms = static_cast<std::int64_t>(options_.stuck_timeout_seconds * 1000);
  if (stuck_ms <= 0) return;
  for (const auto& [id, connection] : engines_) {
    const std::int64_t told = connection->stuck_ms.load();
    if (told != 0) {  // told; dropped once the Goodbye had time to go
      if (now - told > 200) connection->context->TryCancel();
      continue;
    }
    const std::int64_t progress = connection->progress_ms.load();
    if (progress == 0 || now - progress <= stuck_ms) continue;
    const std::string why =
        fmt::format("stuck: requests running and no token generated for {:g} s (its counter at {})",
                    options_.stuck_timeout_seconds, connection->tokens.load());
    spdlog::warn("run: engine {} {}; its samples go back to the queue", id, why);
    ++stuck_engines_;
    connection->stuck_ms = now;
    v1::SchedulerMessage goodbye;
    goodbye.mutable_goodbye()->set_reason(why);
    Send(*connection, goodbye);
  }
}

void WorkerServer::Watch() {
  const auto timeout_ms = static_cast<std::int64_t>(options_.heartbeat_timeout_seconds * 1000);
  std::unique_lock lock(mutex_);
  while (!shut_down_) {
    watch_cv_.wait_for(lock, std::chrono::milliseconds(200));
    if (shut_down_) continue;
    const std::int64_t now = NowMillis();
    DropSilent(now);
    DropStuck(now);
    if (timeout_ms <= 0) continue;
    for (const auto& [key, connection] : all_) {
      const std::int64_t writing = connection->write_started_ms.load();
      if (now - connection->last_seen_ms.load() > timeout_ms) {
        spdlog::warn("run: worker {} silent for over {} s; dropping it", connection->peer,
                     options_.heartbeat_timeout_seconds);
        connection->context->TryCancel();
        connection->last_seen_ms = now;  // once per timeout
      } else if (writing != 0 && now - writing > timeout_ms) {
        spdlog::warn("run: worker {} has not read for over {} s; dropping it", connection->peer,
                     options_.heartbeat_timeout_seconds);
        connection->context->TryCancel();
      }
    }
  }
}

}  // namespace rlsched::app
