// Events and commands on the wire, and the event log: written, read back and replayed.

#include "rlsched/wire/orchestrator_convert.h"

#include <gtest/gtest.h>

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
          s::GenerationProgressed{.time = 5, .sample = 11, .tokens = 12},
          s::GenerationFinished{.time = 6, .sample = 11, .tokens = 13, .reward = 0.5},
          s::GroupFiltered{.time = 7, .group = 2},
          s::TrainStepFinished{.time = 8, .step = 1, .call = 1},
          s::WeightsLoaded{.time = 9, .engine = 5, .version = 2},
          s::EngineReleased{.time = 10, .engine = 5}};
}

TEST(OrchestratorConvertTest, EveryEventKindRoundTrips) {
  for (const s::Event& event : OneOfEach()) {
    const v1::OrchestratorEvent message = ToEventMessage(event);
    const s::Event back = ToEvent(message);
    ASSERT_EQ(back.index(), event.index());
    EXPECT_EQ(ToEventMessage(back).SerializeAsString(), message.SerializeAsString());
  }
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
}

// A short sync run of the core, logged as the runtime logs it.
std::string LoggedRun(s::SimulatorConfig config) {
  std::ostringstream out;
  EventLogWriter writer(out, config);
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
    writer.Append(event);
    for (const s::Command& command : commands) {
      writer.Append(command);
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
  writer.Flush();
  return out.str();
}

s::SimulatorConfig SmallConfig() {
  s::SimulatorConfig config = s::DefaultSimulatorConfig();
  config.orchestrator.prompts_per_step = 2;
  config.orchestrator.samples_per_prompt = 2;
  config.steps = 2;
  return config;
}

TEST(OrchestratorConvertTest, TheEventLogReplaysToTheSameCommands) {
  const std::string bytes = LoggedRun(SmallConfig());
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

TEST(OrchestratorConvertTest, ABrokenLogIsRefusedWithTheRecordNamed) {
  const std::string bytes = LoggedRun(SmallConfig());
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

}  // namespace
}  // namespace rlsched::wire
