// The worker server of `rlsched run` (worker_server.h) over a real Unix socket, with
// workers written here against the generated gRPC stub: each engine's part of the
// weight-sync plan arrives as the in-process runtime computes it (EngineTransfers),
// once per plan, again when the membership changes; the trainer gets the senders'
// part when a plan is first used and when it attaches. Every part equals the binary plan
// file's part of its rank (the server builds them without a file).

#include "worker_server.h"

#include <google/protobuf/util/message_differencer.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "rlsched/rollout/model.h"
#include "rlsched/v1/runtime.grpc.pb.h"
#include "rlsched/wire/reshard_convert.h"
#include "rlsched/wire/solve.h"

namespace rlsched::app {
namespace {

using scheduler::EngineTransfers;
using std::chrono::milliseconds;

scheduler::WeightSyncLayout Layout() {
  return scheduler::WeightSyncLayout{
      .model = rollout::ParseHfConfig(
          R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 96,
              "num_hidden_layers": 4, "num_attention_heads": 16, "num_key_value_heads": 4,
              "vocab_size": 1000, "tie_word_embeddings": false})"),
      .reshard = {.train = {.tp = 2, .pp = 2, .dp = 1},
                  .infer = {.tp = 2, .replicas = 2},
                  .bucket_bytes = 64 << 10}};
}

scheduler::RuntimeOptions Options() {
  scheduler::RuntimeOptions options;
  options.orchestrator = {{.mode = scheduler::Mode::kAsync,
                           .max_staleness = 1,
                           .partial_rollout = true,
                           .prompts_per_step = 4,
                           .samples_per_prompt = 2}};
  options.orchestrator.num_steps = 2;
  options.weight_sync = Layout();
  return options;
}

// The in-process twin: records each SyncWeights' part as the runtime attaches it.
class Recorder final : public scheduler::EngineBackend, public scheduler::TrainerBackend {
 public:
  void Execute(const scheduler::Command& command, const EngineTransfers* transfers) override {
    std::lock_guard lock(mutex_);
    if (std::holds_alternative<scheduler::SyncWeights>(command) && transfers != nullptr) {
      parts_.push_back(*transfers);
    }
  }
  void Train(const scheduler::StartTrain&) override {}
  std::vector<EngineTransfers> parts() {
    std::lock_guard lock(mutex_);
    return parts_;
  }

 private:
  std::mutex mutex_;
  std::vector<EngineTransfers> parts_;
};

// A worker on the socket: sends Hello, collects what the scheduler says.
class Worker {
 public:
  Worker(const std::string& address, v1::Hello hello)
      : stub_(v1::Scheduler::NewStub(
            grpc::CreateChannel(address, grpc::InsecureChannelCredentials()))) {
    stream_ = stub_->Attach(&context_);
    v1::WorkerMessage first;
    *first.mutable_hello() = std::move(hello);
    stream_->Write(first);
    reader_ = std::thread([this] {
      v1::SchedulerMessage message;
      while (stream_->Read(&message)) {
        std::lock_guard lock(mutex_);
        inbox_.push_back(message);
        cv_.notify_all();
      }
      std::lock_guard lock(mutex_);
      ended_ = true;
      cv_.notify_all();
    });
  }
  ~Worker() { Close(); }
  void Close() {
    if (closed_) return;
    closed_ = true;
    context_.TryCancel();
    reader_.join();
    (void)stream_->Finish();
  }
  // The next message (waits up to 20 s); nullopt when none came.
  std::optional<v1::SchedulerMessage> Next() {
    std::unique_lock lock(mutex_);
    cv_.wait_for(lock, std::chrono::seconds(20), [this] { return !inbox_.empty() || ended_; });
    if (inbox_.empty()) return std::nullopt;
    v1::SchedulerMessage message = std::move(inbox_.front());
    inbox_.pop_front();
    return message;
  }
  void Send(const v1::WorkerMessage& message) { stream_->Write(message); }
  void Report(const v1::OrchestratorEvent& event) {
    v1::WorkerMessage message;
    *message.mutable_event() = event;
    Send(message);
  }
  // Nothing more arrives within `wait`.
  bool Quiet(milliseconds wait) {
    std::unique_lock lock(mutex_);
    return !cv_.wait_for(lock, wait, [this] { return !inbox_.empty(); });
  }

 private:
  grpc::ClientContext context_;
  std::unique_ptr<v1::Scheduler::Stub> stub_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::WorkerMessage, v1::SchedulerMessage>> stream_;
  std::thread reader_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<v1::SchedulerMessage> inbox_;
  bool ended_ = false;
  bool closed_ = false;
};

v1::Hello EngineHello(std::int64_t engine) {
  v1::Hello hello;
  hello.set_role(v1::WORKER_ROLE_ENGINE);
  hello.set_engine(engine);
  hello.set_max_concurrent(4);
  hello.set_version(-1);  // nothing loaded: synced at once
  hello.set_token("t0ken");
  return hello;
}

v1::Hello TrainerHello() {
  v1::Hello hello;
  hello.set_role(v1::WORKER_ROLE_TRAINER);
  hello.set_token("t0ken");
  return hello;
}

v1::SchedulerMessage Expect(Worker& worker, v1::SchedulerMessage::KindCase kind) {
  std::optional<v1::SchedulerMessage> message = worker.Next();
  if (!message) {
    ADD_FAILURE() << "no message of kind " << kind;
    return {};
  }
  EXPECT_EQ(message->kind_case(), kind) << message->DebugString();
  return *message;
}

// The parts of the binary plan file of `plan`, by rank.
v1::ReshardRankPart FilePart(const rollout::ReshardPlan& plan, std::int64_t rank) {
  std::stringstream file;
  wire::WriteReshardPlanBinary(plan, file);
  return wire::ReadReshardRankPart(file, wire::ReadReshardPlanIndex(file), rank);
}

// `message` is the engine's part `expected` as the in-process runtime gave it.
void ExpectEnginePart(const v1::WeightSyncPlan& message, const EngineTransfers& expected) {
  EXPECT_EQ(message.epoch(), expected.epoch);
  EXPECT_TRUE(message.plan_id().starts_with(std::to_string(expected.epoch) + "-"))
      << message.plan_id();
  EXPECT_EQ(message.group().name(), "rlsched-weights-" + message.plan_id());
  EXPECT_EQ(message.group().backend(), "gloo");
  EXPECT_EQ(message.group().world_size(), expected.world_size);
  EXPECT_EQ(std::vector<std::int64_t>(message.members().begin(), message.members().end()),
            *expected.members);
  EXPECT_EQ(message.replica(), expected.replica);
  EXPECT_EQ(message.rank_offset(), expected.rank_offset);
  EXPECT_EQ(message.ranks(), expected.ranks);
  EXPECT_EQ(std::vector<std::int64_t>(message.transfers().begin(), message.transfers().end()),
            expected.transfers);
  EXPECT_EQ(message.bytes(), expected.bytes);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(
      message.summary(), wire::ToReshardPlanMessage(*expected.plan, false)));
  ASSERT_EQ(message.parts_size(), expected.ranks);
  // Each rank's part is the plan file's, and together they reach exactly the transfers
  // and bytes stated.
  std::set<std::int64_t> reached;
  std::int64_t bytes = 0;
  for (int i = 0; i < message.parts_size(); ++i) {
    const std::int64_t rank = expected.rank_offset + i;
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(message.parts(i),
                                                                   FilePart(*expected.plan, rank)))
        << "rank " << rank;
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(
        message.parts(i), wire::ToReshardRankPart(*expected.plan, rank)))
        << "rank " << rank;
    const std::vector<v1::Transfer> transfers = wire::RankPartTransfers(message.parts(i));
    for (int k = 0; k < message.parts(i).transfers_size(); ++k) {
      const auto& dst = transfers[static_cast<std::size_t>(k)].dst_ranks();
      if (std::find(dst.begin(), dst.end(), rank) != dst.end()) {
        reached.insert(message.parts(i).transfers(k).index());
        bytes += message.parts(i).transfers(k).bytes();
      }
    }
  }
  EXPECT_EQ(std::vector<std::int64_t>(reached.begin(), reached.end()), expected.transfers);
  EXPECT_EQ(bytes, expected.bytes);
}

void ExpectTrainerPart(const v1::WeightSyncPlan& message, const EngineTransfers& any) {
  EXPECT_EQ(message.epoch(), any.epoch);
  EXPECT_EQ(message.replica(), -1);
  EXPECT_EQ(message.rank_offset(), 0);
  EXPECT_EQ(message.ranks(), any.plan->trainer_ranks);
  EXPECT_EQ(message.transfers_size(), static_cast<int>(any.plan->transfers.size()));
  std::int64_t sent = 0;
  std::set<std::int64_t> senders_hold;
  for (int i = 0; i < message.parts_size(); ++i) {
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(message.parts(i),
                                                                   FilePart(*any.plan, i)));
    for (const v1::RankTransfer& t : message.parts(i).transfers()) {
      if (t.src_rank() == i) {
        EXPECT_TRUE(senders_hold.insert(t.index()).second);
        sent += t.bytes();
      }
    }
  }
  EXPECT_EQ(static_cast<std::size_t>(senders_hold.size()), any.plan->transfers.size());
  EXPECT_EQ(message.bytes(), sent);
}

class WorkerServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("rlsched-worker-server-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
    address_ = "unix:" + (dir_ / "run.sock").string();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
  std::string address_;
};

TEST_F(WorkerServerTest, EnginesGetTheirPartOncePerPlanAndANewOneWhenTheMembershipChanges) {
  // The in-process twin, fed the same joins in the same order.
  scheduler::ManualClock twin_clock;
  Recorder recorder;
  scheduler::Runtime twin(Options(), recorder, recorder, twin_clock);
  twin.Post(scheduler::EngineJoined{.engine = 0, .max_concurrent = 4});
  twin.Post(scheduler::EngineJoined{.engine = 1, .max_concurrent = 4});
  twin.WaitIdle();
  const std::vector<EngineTransfers> parts = recorder.parts();
  ASSERT_EQ(parts.size(), 2u);  // engine 0 in {0}, engine 1 in {0, 1}

  scheduler::ManualClock clock;
  WorkerServer server({.listen = address_, .token = "t0ken", .heartbeat_timeout_seconds = 0});
  scheduler::Runtime runtime(Options(), server, server, clock);
  server.Start(runtime);

  auto trainer = std::make_unique<Worker>(address_, TrainerHello());
  Expect(*trainer, v1::SchedulerMessage::kWelcome);
  ASSERT_TRUE(trainer->Quiet(milliseconds(200)));  // no plan before a sync uses one

  // Engine 0 joins: membership {0}, epoch 0.
  Worker engine0(address_, EngineHello(0));
  Expect(engine0, v1::SchedulerMessage::kWelcome);
  const v1::WeightSyncPlan plan0 =
      Expect(engine0, v1::SchedulerMessage::kWeightSyncPlan).weight_sync_plan();
  ExpectEnginePart(plan0, parts[0]);
  v1::SchedulerMessage sync = Expect(engine0, v1::SchedulerMessage::kCommand);
  ASSERT_TRUE(sync.command().has_sync_weights());
  EXPECT_EQ(sync.command().sync_weights().plan_id(), plan0.plan_id());
  const v1::WeightSyncPlan trainer0 =
      Expect(*trainer, v1::SchedulerMessage::kWeightSyncPlan).weight_sync_plan();
  EXPECT_EQ(trainer0.plan_id(), plan0.plan_id());
  ExpectTrainerPart(trainer0, parts[0]);

  // Engine 1 joins: membership {0, 1}, epoch 1, a new plan and group.
  Worker engine1(address_, EngineHello(1));
  Expect(engine1, v1::SchedulerMessage::kWelcome);
  const v1::WeightSyncPlan plan1 =
      Expect(engine1, v1::SchedulerMessage::kWeightSyncPlan).weight_sync_plan();
  ExpectEnginePart(plan1, parts[1]);
  EXPECT_NE(plan1.plan_id(), plan0.plan_id());
  EXPECT_NE(plan1.group().name(), plan0.group().name());
  sync = Expect(engine1, v1::SchedulerMessage::kCommand);
  EXPECT_EQ(sync.command().sync_weights().plan_id(), plan1.plan_id());
  const v1::WeightSyncPlan trainer1 =
      Expect(*trainer, v1::SchedulerMessage::kWeightSyncPlan).weight_sync_plan();
  EXPECT_EQ(trainer1.plan_id(), plan1.plan_id());
  ExpectTrainerPart(trainer1, parts[1]);
  EXPECT_TRUE(engine0.Quiet(milliseconds(200)));  // engine 0 is not synced by a join

  // A later sync of engine 1 by the same plan names its id only.
  const std::vector<EngineTransfers> members01 =
      scheduler::SplitWeightSync(Layout(), parts[1].plan, {0, 1}, 1);
  server.Execute(scheduler::SyncWeights{.engine = 1, .version = 1}, &members01[1]);
  sync = Expect(engine1, v1::SchedulerMessage::kCommand);
  EXPECT_EQ(sync.command().sync_weights().plan_id(), plan1.plan_id());
  EXPECT_EQ(sync.command().sync_weights().version(), 1);
  // Engine 0's next sync is by the new membership's plan: its part comes first.
  server.Execute(scheduler::SyncWeights{.engine = 0, .version = 1}, &members01[0]);
  const v1::WeightSyncPlan plan01 =
      Expect(engine0, v1::SchedulerMessage::kWeightSyncPlan).weight_sync_plan();
  EXPECT_EQ(plan01.plan_id(), plan1.plan_id());
  ExpectEnginePart(plan01, members01[0]);
  sync = Expect(engine0, v1::SchedulerMessage::kCommand);
  EXPECT_EQ(sync.command().sync_weights().plan_id(), plan1.plan_id());
  server.Execute(scheduler::SyncWeights{.engine = 0, .version = 2}, &members01[0]);
  EXPECT_EQ(Expect(engine0, v1::SchedulerMessage::kCommand).command().sync_weights().plan_id(),
            plan1.plan_id());
  EXPECT_TRUE(trainer->Quiet(milliseconds(200)));  // it has this plan already
  // The same plan made again (another object, equal, of the same epoch): the same id,
  // no part sent again; the first object may go.
  {
    auto again = std::make_shared<const rollout::ReshardPlan>(*parts[1].plan);
    const std::vector<EngineTransfers> same =
        scheduler::SplitWeightSync(Layout(), again, {0, 1}, 1);
    server.Execute(scheduler::SyncWeights{.engine = 1, .version = 2}, &same[1]);
    sync = Expect(engine1, v1::SchedulerMessage::kCommand);
    EXPECT_EQ(sync.command().sync_weights().plan_id(), plan1.plan_id());
    EXPECT_TRUE(trainer->Quiet(milliseconds(200)));
  }

  // Engine 1 leaves (its stream drops): the runtime's next sync of engine 0 is by the
  // membership {0}, a new epoch.
  engine1.Close();
  for (int i = 0; i < 200 && server.engines_attached() != 1; ++i) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  ASSERT_EQ(server.engines_attached(), 1);
  runtime.WaitIdle();
  const std::vector<EngineTransfers> members0 =
      scheduler::SplitWeightSync(Layout(), parts[0].plan, {0}, 2);
  server.Execute(scheduler::SyncWeights{.engine = 0, .version = 3}, &members0[0]);
  const v1::WeightSyncPlan plan2 =
      Expect(engine0, v1::SchedulerMessage::kWeightSyncPlan).weight_sync_plan();
  ExpectEnginePart(plan2, members0[0]);
  EXPECT_EQ(Expect(engine0, v1::SchedulerMessage::kCommand).command().sync_weights().plan_id(),
            plan2.plan_id());
  // Same engines and plan as epoch 0, but a new epoch: a new id and group.
  EXPECT_NE(plan2.plan_id(), plan0.plan_id());
  EXPECT_EQ(plan2.plan_id().substr(plan2.plan_id().find('-')),
            plan0.plan_id().substr(plan0.plan_id().find('-')));
  const v1::WeightSyncPlan trainer2 =
      Expect(*trainer, v1::SchedulerMessage::kWeightSyncPlan).weight_sync_plan();
  EXPECT_EQ(trainer2.plan_id(), plan2.plan_id());

  // A trainer that attaches again gets the current plan after its Welcome.
  trainer->Close();
  trainer.reset();
  for (int i = 0; i < 200 && server.trainer_attached(); ++i) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  Worker trainer_again(address_, TrainerHello());
  Expect(trainer_again, v1::SchedulerMessage::kWelcome);
  const v1::WeightSyncPlan current =
      Expect(trainer_again, v1::SchedulerMessage::kWeightSyncPlan).weight_sync_plan();
  EXPECT_EQ(current.plan_id(), plan2.plan_id());
  ExpectTrainerPart(current, members0[0]);

  runtime.Stop();
  server.Shutdown("done", milliseconds(500));
}

// A run without a weight layout, its server started on `address` (token "t0ken").
struct RunWithoutLayout {
  static scheduler::RuntimeOptions WithoutLayout() {
    scheduler::RuntimeOptions options = Options();
    options.weight_sync.reset();
    return options;
  }
  // As `rlsched run` wires them: the core's refusals are told to their senders.
  static scheduler::RuntimeOptions TellingRefusals(WorkerServer& server) {
    scheduler::RuntimeOptions options = WithoutLayout();
    options.on_reject = [&server](const scheduler::Event& event, const std::string& why) {
      server.Rejected(event, why);
    };
    return options;
  }
  explicit RunWithoutLayout(const std::string& address)
      : server({.listen = address, .token = "t0ken", .heartbeat_timeout_seconds = 0}),
        runtime(TellingRefusals(server), server, server, clock) {
    server.Start(runtime);
  }
  ~RunWithoutLayout() {
    runtime.Stop();
    server.Shutdown("done", milliseconds(500));
  }
  scheduler::ManualClock clock;
  WorkerServer server;
  scheduler::Runtime runtime;
};

TEST_F(WorkerServerTest, WithoutAWeightLayoutSyncsNameNoPlan) {
  RunWithoutLayout run(address_);
  Worker engine(address_, EngineHello(0));
  Expect(engine, v1::SchedulerMessage::kWelcome);
  const v1::SchedulerMessage sync = Expect(engine, v1::SchedulerMessage::kCommand);
  ASSERT_TRUE(sync.command().has_sync_weights());
  EXPECT_EQ(sync.command().sync_weights().plan_id(), "");
}

// Scheduler.Call answers the daemon's requests on the run's socket, as `rlsched serve`
// does (wire::Solve), for a caller with the run's token; without it: UNAUTHENTICATED.
TEST_F(WorkerServerTest, CallAnswersTheDaemonsRequestsForACallerWithTheToken) {
  RunWithoutLayout run(address_);
  const auto stub =
      v1::Scheduler::NewStub(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  const auto call = [&](const v1::Request& request, const std::string& token, v1::Reply& reply) {
    grpc::ClientContext context;
    if (!token.empty()) context.AddMetadata("rlsched-token", token);
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    return stub->Call(&context, request, &reply);
  };
  v1::Request request;
  request.set_id("b1");
  v1::BalanceRequest* balance = request.mutable_balance();
  for (const std::int64_t length : {900, 30, 500, 470, 200, 220, 640, 10}) {
    balance->add_lengths(length);
  }
  balance->set_num_parts(3);
  v1::Reply reply;
  const grpc::Status status = call(request, "t0ken", reply);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(reply, wire::Solve(request)))
      << reply.DebugString();
  EXPECT_EQ(reply.id(), "b1");
  EXPECT_EQ(reply.balance().parts_size(), 3);
  // A bad request: the daemon's error reply, naming the field.
  balance->set_num_parts(0);
  ASSERT_TRUE(call(request, "t0ken", reply).ok());
  ASSERT_TRUE(reply.has_error()) << reply.DebugString();
  EXPECT_EQ(reply.error().code(), v1::ERROR_CODE_INVALID_ARGUMENT);
  EXPECT_EQ(reply.error().field(), "balance.num_parts");
  // No token, a wrong one: refused and counted.
  EXPECT_EQ(call(request, "", reply).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(call(request, "t0ken2", reply).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(run.server.refused(), 2);
}

// A Hello the core would refuse (an id, a concurrency or a version out of its bounds)
// is refused at the door with a Goodbye saying why, and counted; before, it was
// welcomed, the core refused the engine, and it stayed attached and idle.
TEST_F(WorkerServerTest, HellosTheCoreCannotUseAreRefusedAndCounted) {
  RunWithoutLayout run(address_);
  const std::vector<std::pair<v1::Hello, std::string>> cases = [] {
    std::vector<std::pair<v1::Hello, std::string>> out;
    v1::Hello hello = EngineHello(std::int64_t{1} << 62);
    out.emplace_back(hello, "hello.engine: must be in [0, 1099511627776]");
    hello = EngineHello(1);
    hello.set_max_concurrent(std::int64_t{1} << 62);
    out.emplace_back(hello, "hello.max_concurrent: must be in [1, 1073741824]");
    hello = EngineHello(2);
    hello.set_version(1000);
    out.emplace_back(hello, "hello.version: must be in [-1, 0], got 1000");
    hello = EngineHello(3);
    hello.set_max_concurrent(0);
    out.emplace_back(hello, "hello.max_concurrent: must be in [1, 1073741824], got 0");
    hello = EngineHello(4);  // max_concurrent 4
    for (const std::int64_t sample : {1, 2, 3, 4, 5}) hello.add_samples(sample);
    out.emplace_back(hello, "hello.samples: at most max_concurrent (4), got 5");
    hello = EngineHello(5);
    for (const std::int64_t sample : {7, 3, 7}) hello.add_samples(sample);
    out.emplace_back(hello, "hello.samples: each sample once, got 7 twice");
    hello = EngineHello(6);
    hello.add_samples(-2);
    out.emplace_back(hello, "hello.samples: each >= 0, got -2");
    return out;
  }();
  for (const auto& [hello, why] : cases) {
    Worker intruder(address_, hello);
    const v1::SchedulerMessage goodbye = Expect(intruder, v1::SchedulerMessage::kGoodbye);
    EXPECT_NE(goodbye.goodbye().reason().find(why), std::string::npos)
        << goodbye.goodbye().reason();
  }
  EXPECT_EQ(run.server.refused(), static_cast<std::int64_t>(cases.size()));
  EXPECT_EQ(run.server.engines_attached(), 0);
  // A good engine still joins.
  Worker engine(address_, EngineHello(0));
  Expect(engine, v1::SchedulerMessage::kWelcome);
}

// An engine loads the version its first SyncWeights names and reports it.
void LoadFirstSync(Worker& engine, std::int64_t id) {
  Expect(engine, v1::SchedulerMessage::kWelcome);
  const v1::SchedulerMessage sync = Expect(engine, v1::SchedulerMessage::kCommand);
  ASSERT_TRUE(sync.command().has_sync_weights()) << sync.DebugString();
  v1::OrchestratorEvent loaded;
  loaded.mutable_weights_loaded()->set_engine(id);
  loaded.mutable_weights_loaded()->set_version(sync.command().sync_weights().version());
  engine.Report(loaded);
}

std::string RefusalReason(Worker& worker) {
  return Expect(worker, v1::SchedulerMessage::kRefused).refused().reason();
}

// No engine speaks for another's samples: the server binds every report to the stream's
// engine (whatever engine it writes), the core takes it only for samples in flight
// there, and the sender is told why (Refused), as it is for events not its own to send.
// Before, an engine's finish of another engine's sample was trained.
TEST_F(WorkerServerTest, AnEngineCannotReportForAnotherEnginesSamples) {
  RunWithoutLayout run(address_);
  Worker honest(address_, EngineHello(0));
  LoadFirstSync(honest, 0);
  run.runtime.WaitIdle();
  run.runtime.Post(scheduler::PromptsAvailable{
      .prompts = {{.id = 0, .prompt_tokens = 10}, {.id = 1, .prompt_tokens = 10}}});
  const v1::SchedulerMessage dispatch = Expect(honest, v1::SchedulerMessage::kCommand);
  ASSERT_TRUE(dispatch.command().has_dispatch()) << dispatch.DebugString();
  const std::int64_t victim = dispatch.command().dispatch().samples(0).sample();

  Worker rogue(address_, EngineHello(1));
  LoadFirstSync(rogue, 1);
  v1::OrchestratorEvent finish;
  finish.mutable_generation_finished()->set_sample(victim);
  finish.mutable_generation_finished()->set_tokens(1);
  rogue.Report(finish);
  EXPECT_EQ(RefusalReason(rogue),
            "sample: must be a sample in flight on the reporting engine 1, got " +
                std::to_string(victim) + " (in flight on engine 0)");
  finish.mutable_generation_finished()->set_engine(0);  // a forged id changes nothing
  rogue.Report(finish);
  EXPECT_NE(RefusalReason(rogue).find("(in flight on engine 0)"), std::string::npos);
  v1::OrchestratorEvent progress;
  progress.mutable_generation_progressed()->set_sample(victim);
  progress.mutable_generation_progressed()->set_tokens(100000);
  rogue.Report(progress);
  EXPECT_NE(RefusalReason(rogue).find("sample: must be a sample in flight on the reporting"),
            std::string::npos);
  v1::OrchestratorEvent filter;
  filter.mutable_group_filtered()->set_group(victim / 2);
  rogue.Report(filter);
  EXPECT_NE(RefusalReason(rogue).find("group: must be a group running on the reporting engine 1"),
            std::string::npos);
  v1::OrchestratorEvent step;
  step.mutable_train_step_finished()->set_step(0);
  rogue.Report(step);
  EXPECT_NE(RefusalReason(rogue).find("event: an engine reports its own"), std::string::npos);
  EXPECT_EQ(run.server.ignored_events(), 1);

  // The sample's own engine finishes it: taken, nothing told.
  finish.mutable_generation_finished()->clear_engine();
  finish.mutable_generation_finished()->set_tokens(7);
  honest.Report(finish);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (run.runtime.Status().counters.buffered == 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  run.runtime.WaitIdle();
  const scheduler::RuntimeStatus status = run.runtime.Status();
  EXPECT_EQ(status.rejected_events, 4);
  EXPECT_EQ(status.counters.buffered, 1);
  EXPECT_TRUE(honest.Quiet(milliseconds(200)));
}

TEST(CheckEngineHelloTest, TheBoundsAreTheCoresInclusive) {
  v1::Hello hello = EngineHello(scheduler::kMaxEngineId);
  hello.set_max_concurrent(scheduler::kMaxConcurrent);
  hello.set_version(5);
  EXPECT_EQ(CheckEngineHello(hello, 5), std::nullopt);
  EXPECT_NE(CheckEngineHello(hello, 4), std::nullopt);
  hello.set_version(-2);
  EXPECT_NE(CheckEngineHello(hello, 5), std::nullopt);
}

// A stream that never says Hello: what it reads until the server ends it.
class SilentStream {
 public:
  explicit SilentStream(const std::string& address)
      : stub_(v1::Scheduler::NewStub(
            grpc::CreateChannel(address, grpc::InsecureChannelCredentials()))),
        stream_(stub_->Attach(&context_)) {}
  ~SilentStream() {
    context_.TryCancel();
    (void)stream_->Finish();
  }
  // The server's next message, or nullopt when the stream ended without one.
  std::optional<v1::SchedulerMessage> Read() {
    v1::SchedulerMessage message;
    if (!stream_->Read(&message)) return std::nullopt;
    return message;
  }

 private:
  grpc::ClientContext context_;
  std::unique_ptr<v1::Scheduler::Stub> stub_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::WorkerMessage, v1::SchedulerMessage>> stream_;
};

struct RunWithDoor {
  explicit RunWithDoor(const std::string& address, double hello_timeout_seconds = 0.5)
      : server({.listen = address,
                .token = "t0ken",
                .heartbeat_timeout_seconds = 0,
                .hello_timeout_seconds = hello_timeout_seconds}),
        runtime(RunWithoutLayout::WithoutLayout(), server, server, clock) {
    server.Start(runtime);
  }
  ~RunWithDoor() {
    runtime.Stop();
    server.Shutdown("done", milliseconds(500));
  }
  scheduler::ManualClock clock;
  WorkerServer server;
  scheduler::Runtime runtime;
};

// A stream that never says Hello is closed after hello_timeout_seconds, and counted;
// before, each held two server threads for the whole run.
TEST_F(WorkerServerTest, SilentStreamsAreClosedAtTheirDeadline) {
  RunWithDoor run(address_);
  SilentStream first(address_);
  SilentStream second(address_);
  EXPECT_EQ(first.Read(), std::nullopt);  // closed, without a message
  EXPECT_EQ(second.Read(), std::nullopt);
  EXPECT_EQ(run.server.refused(), 2);
  EXPECT_EQ(run.server.waiting_streams(), 0);
  // An engine that says Hello joins.
  Worker engine(address_, EngineHello(0));
  Expect(engine, v1::SchedulerMessage::kWelcome);
}

// The threads of this process (/proc/self/status).
std::int64_t Threads() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.starts_with("Threads:")) return std::stoll(line.substr(8));
  }
  return -1;
}

// Streams waiting for their Hello are capped (max_waiting_streams, 64 by default): 300
// silent connections leave 64 waiting (two threads each) and the rest turned away at
// once, counted; before, each held two server threads for the whole run.
TEST_F(WorkerServerTest, SilentStreamsBeyondTheCapAreTurnedAway) {
  RunWithDoor run(address_, /*hello_timeout_seconds=*/60);
  const std::int64_t before = Threads();
  std::vector<std::unique_ptr<SilentStream>> streams;
  for (int i = 0; i < 300; ++i) streams.push_back(std::make_unique<SilentStream>(address_));
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (run.server.waiting_streams() + run.server.refused() < 300 &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_EQ(run.server.waiting_streams(), 64);
  EXPECT_EQ(run.server.refused(), 300 - 64);
  // Once the turned-away calls' handlers have returned (the server's pool lets idle
  // threads go), the 64 waiting hold two threads each.
  const auto settled = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (Threads() - before >= 150 && std::chrono::steady_clock::now() < settled) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  EXPECT_LT(Threads() - before, 150) << "threads before: " << before;
}

struct RunWithStuckTimeout {
  explicit RunWithStuckTimeout(const std::string& address)
      : server({.listen = address,
                .token = "t0ken",
                .heartbeat_timeout_seconds = 0,
                .stuck_timeout_seconds = 0.6}),
        runtime(RunWithoutLayout::WithoutLayout(), server, server, clock) {
    server.Start(runtime);
  }
  ~RunWithStuckTimeout() {
    runtime.Stop();
    server.Shutdown("done", milliseconds(500));
  }
  scheduler::ManualClock clock;
  WorkerServer server;
  scheduler::Runtime runtime;
};

v1::WorkerMessage Beat(std::int64_t running, std::optional<std::int64_t> tokens) {
  v1::WorkerMessage message;
  message.mutable_heartbeat()->set_running(running);
  if (tokens) message.mutable_heartbeat()->set_generated_tokens(*tokens);
  return message;
}

// An engine whose generated-token counter stays still while it runs requests is told it
// is stuck (Goodbye) and dropped: EngineFailed, its samples re-queued. Engines whose
// counter moves, or that run nothing, or that do not send it (older workers) are kept.
TEST_F(WorkerServerTest, AnEngineWhoseTokenCounterStaysStillIsDroppedAsStuck) {
  RunWithStuckTimeout run(address_);
  Worker stuck(address_, EngineHello(0));
  Worker busy(address_, EngineHello(1));
  Worker idle(address_, EngineHello(2));
  Worker older(address_, EngineHello(3));
  for (Worker* w : {&stuck, &busy, &idle, &older}) Expect(*w, v1::SchedulerMessage::kWelcome);
  std::optional<v1::SchedulerMessage> goodbye;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (std::int64_t tick = 0; std::chrono::steady_clock::now() < until; ++tick) {
    stuck.Send(Beat(3, 500));
    busy.Send(Beat(3, 500 + tick));
    idle.Send(Beat(0, 7));
    older.Send(Beat(3, std::nullopt));
    if (run.server.stuck_engines() > 0 && tick > 40) break;
    std::this_thread::sleep_for(milliseconds(50));
  }
  EXPECT_EQ(run.server.stuck_engines(), 1);
  for (std::optional<v1::SchedulerMessage> m = stuck.Next(); m; m = stuck.Next()) {
    if (m->has_goodbye()) goodbye = m;
  }
  ASSERT_TRUE(goodbye.has_value());
  EXPECT_TRUE(goodbye->goodbye().reason().starts_with(
      "stuck: requests running and no token generated for 0.6 s (its counter at 500)"))
      << goodbye->goodbye().reason();
  const auto settled = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (run.server.engines_attached() > 3 && std::chrono::steady_clock::now() < settled) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  run.runtime.WaitIdle();
  EXPECT_EQ(run.server.engines_attached(), 3);
  EXPECT_EQ(run.runtime.Status().counters.engine_failures, 1);
}

}  // namespace
}  // namespace rlsched::app
