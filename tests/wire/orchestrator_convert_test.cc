// Events and commands on the wire, and the event log: written, read back and replayed.

#include "rlsched/wire/orchestrator_convert.h"

#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "rlsched/common/error.h"

namespace rlsched::wire {
namespace {

namespace s = scheduler;

std::vector<s::Event> OneOfEach() {
  return {s::PromptsAvailable{.time = 1, .prompts = {{.id = 3, .prompt_tokens = 7}, {.id = 4}}},
          s::EngineJoined{.time = 2, .engine = 5, .max_concurrent = 9, .version = -1},
          s::EngineLeft{.time = 3, .engine = 5},
          s::EngineFailed{.time = 4, .engine = 6},
          s::GenerationProgressed{
              .time = 5, .sample = 11, .tokens = 12, .spans = {{.version = 1, .first_token = 2}}},
          s::GenerationFinished{
              .time = 6,
              .sample = 11,
              .tokens = 13,
              .reward = 0.5,
              .spans = {{.version = 1, .first_token = 2}, {.version = 3, .first_token = 9}},
              .telemetry = s::RequestTelemetry{.generated_tokens = 11,
                                               .preemptions = 1,
                                               .interruptions = 2,
                                               .first_token_seconds = 0.25,
                                               .seconds = 4.5,
                                               .paused_seconds = 1.5}},
          s::GroupFiltered{.time = 7, .group = 2},
          s::TrainStepFinished{.time = 8, .step = 1, .call = 1},
          s::WeightsLoaded{.time = 9, .engine = 5, .version = 2},
          s::EngineReleased{.time = 10, .engine = 5},
          s::GenerationPaused{
              .time = 11,
              .engine = 5,
              .version = 3,
              .samples = {{.sample = 14, .tokens = 15, .spans = {{.version = 2, .first_token = 4}}},
                          {.sample = 12}}},
          s::GenerationPaused{.time = 12, .engine = 6, .version = 4}};
}

TEST(OrchestratorConvertTest, EveryEventKindRoundTrips) {
  for (const s::Event& event : OneOfEach()) {
    const v1::OrchestratorEvent message = ToEventMessage(event);
    const s::Event back = ToEvent(message);
    ASSERT_EQ(back.index(), event.index());
    EXPECT_EQ(ToEventMessage(back).SerializeAsString(), message.SerializeAsString());
  }
  const s::Event paused = ToEvent(ToEventMessage(OneOfEach()[10]));
  const auto& p = std::get<s::GenerationPaused>(paused);
  EXPECT_EQ(p.time, 11);
  EXPECT_EQ(p.engine, 5);
  EXPECT_EQ(p.version, 3);
  ASSERT_EQ(p.samples.size(), 2u);
  EXPECT_EQ(p.samples[0].sample, 14);
  EXPECT_EQ(p.samples[0].tokens, 15);
  EXPECT_EQ(p.samples[1].sample, 12);
  EXPECT_EQ(p.samples[1].tokens, 0);
  ASSERT_EQ(p.samples[0].spans.size(), 1u);
  EXPECT_EQ(p.samples[0].spans[0].version, 2);
  EXPECT_EQ(p.samples[0].spans[0].first_token, 4);
  EXPECT_TRUE(p.samples[1].spans.empty());
  const auto finished = std::get<s::GenerationFinished>(ToEvent(ToEventMessage(OneOfEach()[5])));
  ASSERT_EQ(finished.spans.size(), 2u);
  EXPECT_EQ(finished.spans[1].version, 3);
  EXPECT_EQ(finished.spans[1].first_token, 9);
  ASSERT_TRUE(finished.telemetry.has_value());
  EXPECT_EQ(finished.telemetry->generated_tokens, 11);
  EXPECT_EQ(finished.telemetry->preemptions, 1);
  EXPECT_EQ(finished.telemetry->interruptions, 2);
  EXPECT_EQ(finished.telemetry->first_token_seconds, 0.25);
  EXPECT_EQ(finished.telemetry->seconds, 4.5);
  EXPECT_EQ(finished.telemetry->paused_seconds, 1.5);
  // A finish without telemetry has none after the round trip (not a zero one).
  EXPECT_FALSE(std::get<s::GenerationFinished>(
                   ToEvent(ToEventMessage(s::GenerationFinished{.sample = 1, .tokens = 2})))
                   .telemetry.has_value());
  EXPECT_TRUE(ToEventMessage(OneOfEach()[11]).has_generation_paused());
  EXPECT_THROW(ToEvent(v1::OrchestratorEvent{}), FieldError);
}

TEST(OrchestratorConvertTest, CommandsCarryEveryField) {
  const v1::OrchestratorCommand dispatch =
      ToCommandMessage(s::Dispatch{.engine = 1,
                                   .version = 2,
                                   .samples = {{.sample = 3,
                                                .group = 4,
                                                .prompt = 5,
                                                .prompt_tokens = 6,
                                                .resume_from = 7,
                                                .predicted_tokens = 8}}});
  ASSERT_TRUE(dispatch.has_dispatch());
  EXPECT_EQ(dispatch.dispatch().samples(0).resume_from(), 7);
  EXPECT_EQ(dispatch.dispatch().samples(0).predicted_tokens(), 8);
  s::StartTrain start{
      .step = 2, .call = 1, .version = 2, .groups = {0}, .samples = {0, 1}, .lengths = {10, 20}};
  const std::int64_t groups[] = {0, 0};
  balance::StepOptions step{.num_ranks = 2};
  step.micro_batch.max_tokens_per_micro_batch = 64;
  start.plan = balance::PlanStep(start.lengths, groups, step);
  const v1::OrchestratorCommand train = ToCommandMessage(start);
  ASSERT_TRUE(train.has_start_train());
  EXPECT_EQ(train.start_train().call(), 1);
  EXPECT_EQ(train.start_train().plan().ranks_size(), 2);
  EXPECT_EQ(train.start_train().plan().sequences(), 2);
  EXPECT_TRUE(ToCommandMessage(s::SyncWeights{.engine = 1, .version = 3, .interrupt = true})
                  .sync_weights()
                  .interrupt());
  // The pause mode of an interrupting sync, stated; none without an interrupt.
  EXPECT_EQ(ToCommandMessage(s::SyncWeights{.engine = 1, .version = 3, .interrupt = true})
                .sync_weights()
                .pause(),
            v1::PAUSE_MODE_KEEP);
  EXPECT_EQ(ToCommandMessage(
                s::SyncWeights{
                    .engine = 1, .version = 3, .interrupt = true, .pause = s::PauseMode::kAbort})
                .sync_weights()
                .pause(),
            v1::PAUSE_MODE_ABORT);
  EXPECT_EQ(ToCommandMessage(s::SyncWeights{.engine = 1, .version = 3}).sync_weights().pause(),
            v1::PAUSE_MODE_UNSPECIFIED);
  // The runtime's replan.
  EXPECT_TRUE(ToCommandMessage(s::SyncWeights{.engine = 1, .version = 3, .replan = true})
                  .sync_weights()
                  .replan());
  EXPECT_FALSE(ToCommandMessage(s::SyncWeights{.engine = 1, .version = 3}).sync_weights().replan());
  // Colocated memory by tag.
  const v1::OrchestratorCommand release = ToCommandMessage(
      s::Release{.engine = 2, .tags = {s::MemoryTag::kWeights, s::MemoryTag::kKvCache}});
  EXPECT_EQ(release.release().engine(), 2);
  ASSERT_EQ(release.release().tags_size(), 2);
  EXPECT_EQ(release.release().tags(0), v1::MEMORY_TAG_WEIGHTS);
  EXPECT_EQ(release.release().tags(1), v1::MEMORY_TAG_KV_CACHE);
  const v1::OrchestratorCommand wake = ToCommandMessage(s::SyncWeights{
      .engine = 2, .version = 4, .resume = {s::MemoryTag::kWeights, s::MemoryTag::kKvCache}});
  ASSERT_EQ(wake.sync_weights().resume_size(), 2);
  EXPECT_EQ(wake.sync_weights().resume(0), v1::MEMORY_TAG_WEIGHTS);
  EXPECT_EQ(wake.sync_weights().resume(1), v1::MEMORY_TAG_KV_CACHE);
}

// A short sync run of the core, logged as the runtime logs it.
std::string LoggedRun(s::SimulatorConfig config) {
  std::string out = EventLogHeader(config, nullptr);
  s::Orchestrator core(RunOrchestratorOptions(config));
  double time = 0;
  std::vector<s::Event> pending = {s::EngineJoined{.engine = 0, .max_concurrent = 4},
                                   s::EngineJoined{.engine = 1, .max_concurrent = 4},
                                   s::PromptsAvailable{.prompts = {{.id = 0, .prompt_tokens = 5},
                                                                   {.id = 1, .prompt_tokens = 6},
                                                                   {.id = 2, .prompt_tokens = 7},
                                                                   {.id = 3, .prompt_tokens = 8}}}};
  for (std::size_t i = 0; i < pending.size() && i < 500; ++i) {
    s::Event event = pending[i];
    std::visit([&](auto& e) { e.time = time; }, event);
    time += 1;
    std::vector<s::Command> commands;
    core.Handle(event, commands);
    AppendEventRecords(event, commands, out);
    for (const s::Command& command : commands) {
      if (const auto* d = std::get_if<s::Dispatch>(&command)) {
        for (const s::SampleWork& w : d->samples) {
          pending.push_back(s::GenerationFinished{.sample = w.sample,
                                                  .tokens = 10 + w.sample,
                                                  .reward = static_cast<double>(w.sample % 2)});
        }
      } else if (const auto* t = std::get_if<s::StartTrain>(&command)) {
        pending.push_back(s::TrainStepFinished{.step = t->step, .call = t->call});
      } else if (const auto* w = std::get_if<s::SyncWeights>(&command)) {
        pending.push_back(s::WeightsLoaded{.engine = w->engine, .version = w->version});
      }
    }
  }
  return out;
}

s::SimulatorConfig SmallLoggedConfig() {
  s::SimulatorConfig config = s::DefaultSimulatorConfig();
  config.orchestrator.prompts_per_step = 2;
  config.orchestrator.samples_per_prompt = 2;
  config.steps = 2;
  return config;
}

TEST(OrchestratorConvertTest, TheEventLogReplaysToTheSameCommands) {
  const std::string bytes = LoggedRun(SmallLoggedConfig());
  std::istringstream in(bytes);
  const EventLog log = ReadEventLog(in);
  EXPECT_EQ(log.config.steps, 2);
  const ReplayResult result = Replay(log);
  EXPECT_GT(result.events, 10);
  EXPECT_GT(result.commands, 5);
  EXPECT_FALSE(result.first_difference.has_value()) << result.logged << " vs " << result.replayed;
  EXPECT_EQ(result.rejected_events, 0);

  // Another config (here: a different number of steps) gives other commands.
  EventLog changed = log;
  changed.config.orchestrator.samples_per_prompt = 1;
  changed.config.orchestrator.prompts_per_step = 4;
  const ReplayResult other = Replay(changed);
  ASSERT_TRUE(other.first_difference.has_value());
  EXPECT_NE(other.logged, other.replayed);
}

// An async run with partial rollout whose engines report each pause in one
// GenerationPaused, logged as the runtime logs it: the log replays to the same commands.
TEST(OrchestratorConvertTest, ALogWithPauseReportsReplays) {
  s::SimulatorConfig config = s::DefaultSimulatorConfig();
  config.orchestrator.mode = s::Mode::kAsync;
  config.orchestrator.max_staleness = 1;
  config.orchestrator.partial_rollout = true;
  config.orchestrator.prompts_per_step = 1;
  config.orchestrator.samples_per_prompt = 2;
  config.steps = 3;
  std::string out = EventLogHeader(config, nullptr);
  s::Orchestrator core(RunOrchestratorOptions(config));
  std::map<std::int64_t, std::set<std::int64_t>> running;  // engine -> samples in flight
  std::deque<s::Event> pending = {s::EngineJoined{.engine = 0, .max_concurrent = 2},
                                  s::EngineJoined{.engine = 1, .max_concurrent = 2}};
  for (std::int64_t i = 0; i < 6; ++i) {
    std::get<s::PromptsAvailable>(pending.emplace_back(s::PromptsAvailable{}))
        .prompts.push_back({.id = i, .prompt_tokens = 5});
  }
  double time = 0;
  std::int64_t pauses = 0;
  std::int64_t paused_samples = 0;
  for (int i = 0; i < 1000 && !core.done(); ++i) {
    if (pending.empty()) {  // the lowest running sample finishes
      for (auto& [engine, samples] : running) {
        if (samples.empty()) continue;
        const std::int64_t x = *samples.begin();
        samples.erase(samples.begin());
        pending.push_back(s::GenerationFinished{
            .sample = x, .tokens = 20 + x, .reward = static_cast<double>(x % 2)});
        break;
      }
    }
    ASSERT_FALSE(pending.empty()) << "stuck";
    s::Event event = pending.front();
    pending.pop_front();
    std::visit([&](auto& e) { e.time = time; }, event);
    time += 0.5;
    std::vector<s::Command> commands;
    core.Handle(event, commands);
    AppendEventRecords(event, commands, out);
    for (const s::Command& command : commands) {
      if (const auto* d = std::get_if<s::Dispatch>(&command)) {
        for (const s::SampleWork& w : d->samples) running[d->engine].insert(w.sample);
      } else if (const auto* a = std::get_if<s::Abort>(&command)) {
        for (const std::int64_t x : a->samples) running[a->engine].erase(x);
      } else if (const auto* t = std::get_if<s::StartTrain>(&command)) {
        pending.push_back(s::TrainStepFinished{.step = t->step, .call = t->call});
      } else if (const auto* w = std::get_if<s::SyncWeights>(&command)) {
        if (w->interrupt) {
          s::GenerationPaused paused{.engine = w->engine, .version = w->version};
          for (const std::int64_t x : running[w->engine]) {
            paused.samples.push_back({.sample = x, .tokens = 3});
          }
          ++pauses;
          paused_samples += static_cast<std::int64_t>(paused.samples.size());
          pending.push_back(paused);
        }
        pending.push_back(s::WeightsLoaded{.engine = w->engine, .version = w->version});
      }
    }
  }
  ASSERT_TRUE(core.done());
  EXPECT_GE(pauses, 2);
  EXPECT_GE(paused_samples, 2);
  EXPECT_GT(core.counters().partial_samples, 0);
  std::istringstream in(out);
  const ReplayResult result = Replay(ReadEventLog(in));
  EXPECT_FALSE(result.first_difference.has_value()) << result.logged << " vs " << result.replayed;
  EXPECT_EQ(result.rejected_events, 0);
  EXPECT_GT(result.commands, 10);
}

// A log whose writer died mid-record: read with torn_tail, the whole records are kept
// and the cut one counted; the weight layout record comes back as written.
TEST(OrchestratorConvertTest, ATornTailIsLeftOutWhenAskedAndTheLayoutReadBack) {
  v1::ReshardRequest layout;
  layout.set_model_config_json(R"({"model_type": "llama"})");
  layout.mutable_train()->set_tp(2);
  const s::SimulatorConfig config = SmallLoggedConfig();
  std::string bytes = EventLogHeader(config, &layout);
  const std::string body = LoggedRun(config).substr(EventLogHeader(config, nullptr).size());
  bytes += body;
  std::istringstream whole(bytes);
  const EventLog log = ReadEventLog(whole);
  ASSERT_TRUE(log.weight_layout.has_value());
  EXPECT_EQ(log.weight_layout->train().tp(), 2);
  EXPECT_EQ(log.whole_bytes, static_cast<std::int64_t>(bytes.size()));
  EXPECT_EQ(log.torn_bytes, 0);
  for (const std::size_t cut : {std::size_t{1}, std::size_t{3}, body.size() / 2}) {
    std::istringstream in(bytes.substr(0, bytes.size() - cut));
    EXPECT_THROW((void)ReadEventLog(in), FieldError);
    std::istringstream again(bytes.substr(0, bytes.size() - cut));
    const EventLog torn = ReadEventLog(again, /*torn_tail=*/true);
    EXPECT_GT(torn.torn_bytes, 0);
    EXPECT_EQ(torn.whole_bytes + torn.torn_bytes, static_cast<std::int64_t>(bytes.size() - cut));
    EXPECT_LT(torn.records.size(), log.records.size());
    // What is kept is a prefix of the records, byte for byte.
    for (std::size_t i = 0; i < torn.records.size(); ++i) {
      EXPECT_EQ(torn.records[i].SerializeAsString(), log.records[i].SerializeAsString());
    }
  }
}

TEST(OrchestratorConvertTest, ABrokenLogIsRefusedWithTheRecordNamed) {
  const std::string bytes = LoggedRun(SmallLoggedConfig());
  {
    std::istringstream in(bytes.substr(0, bytes.size() - 3));
    try {
      (void)ReadEventLog(in);
      FAIL() << "a truncated log was read";
    } catch (const FieldError& e) {
      EXPECT_NE(std::string(e.what()).find("record "), std::string::npos) << e.what();
    }
  }
  {
    std::istringstream in("");
    EXPECT_THROW((void)ReadEventLog(in), FieldError);
  }
  {
    // An event where the header belongs.
    std::ostringstream out;
    v1::EventLogRecord record;
    *record.mutable_event() = ToEventMessage(s::EngineLeft{});
    const std::string body = record.SerializeAsString();
    out << static_cast<char>(body.size()) << body;
    std::istringstream in(out.str());
    try {
      (void)ReadEventLog(in);
      FAIL() << "a log without a header was read";
    } catch (const FieldError& e) {
      EXPECT_NE(std::string(e.what()).find("record 0"), std::string::npos) << e.what();
    }
  }
}

// A stream buffer over a string that cannot seek (a pipe's).
class PipeBuffer : public std::streambuf {
 public:
  explicit PipeBuffer(std::string bytes) : bytes_(std::move(bytes)) {
    setg(bytes_.data(), bytes_.data(), bytes_.data() + bytes_.size());
  }

 private:
  std::string bytes_;
};

// The log is read record by record from the stream's position, seekable or not; the
// same records either way, and a torn tail counted.
TEST(OrchestratorConvertTest, TheLogIsReadFromAnyStreamRecordByRecord) {
  const std::string bytes = LoggedRun(SmallLoggedConfig());
  std::istringstream file(bytes);
  const EventLog whole = ReadEventLog(file);
  PipeBuffer pipe_buffer(bytes);
  std::istream pipe(&pipe_buffer);
  const EventLog piped = ReadEventLog(pipe);
  ASSERT_EQ(piped.records.size(), whole.records.size());
  for (std::size_t i = 0; i < whole.records.size(); ++i) {
    EXPECT_EQ(piped.records[i].SerializeAsString(), whole.records[i].SerializeAsString()) << i;
  }
  EXPECT_EQ(whole.whole_bytes, static_cast<std::int64_t>(bytes.size()));
  // From the stream's position: a prefix skipped first.
  std::istringstream prefixed("junk" + bytes);
  prefixed.seekg(4);
  EXPECT_EQ(ReadEventLog(prefixed).records.size(), whole.records.size());
  // A torn tail: every whole record, the rest counted.
  std::istringstream torn(bytes.substr(0, bytes.size() - 3));
  const EventLog cut = ReadEventLog(torn, /*torn_tail=*/true);
  EXPECT_EQ(cut.records.size(), whole.records.size() - 1);
  EXPECT_EQ(cut.whole_bytes + cut.torn_bytes, static_cast<std::int64_t>(bytes.size()) - 3);
  EXPECT_GT(cut.torn_bytes, 0);
}

}  // namespace
}  // namespace rlsched::wire
