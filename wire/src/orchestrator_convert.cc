// The decision core's events and commands on the wire, and the event log
// (orchestrator_convert.h).

#include "rlsched/wire/orchestrator_convert.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl.h>

#include <iterator>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "rlsched/common/error.h"
#include "rlsched/wire/balance_convert.h"
#include "rlsched/wire/simulate_convert.h"

namespace rlsched::wire {

namespace s = scheduler;

namespace {

v1::MemoryTag ToMemoryTagMessage(s::MemoryTag tag) {
  return tag == s::MemoryTag::kWeights ? v1::MEMORY_TAG_WEIGHTS : v1::MEMORY_TAG_KV_CACHE;
}

void AddSpans(const s::EngineSpans& spans,
              google::protobuf::RepeatedPtrField<v1::VersionSpan>& out) {
  out.Reserve(static_cast<int>(spans.size()));
  for (const s::VersionSpan& span : spans) {
    v1::VersionSpan* x = out.Add();
    x->set_version(span.version);
    x->set_first_token(span.first_token);
  }
}

s::EngineSpans SpansOf(const google::protobuf::RepeatedPtrField<v1::VersionSpan>& spans) {
  s::EngineSpans out;
  out.reserve(static_cast<std::size_t>(spans.size()));
  for (const v1::VersionSpan& span : spans) {
    out.push_back({.version = span.version(), .first_token = span.first_token()});
  }
  return out;
}

}  // namespace

v1::OrchestratorEvent ToEventMessage(const s::Event& event) {
  v1::OrchestratorEvent m;
  std::visit(
      [&m](const auto& e) {
        using T = std::decay_t<decltype(e)>;
        if constexpr (std::is_same_v<T, s::PromptsAvailable>) {
          v1::PromptsAvailable* x = m.mutable_prompts_available();
          x->set_time(e.time);
          x->mutable_prompts()->Reserve(static_cast<int>(e.prompts.size()));
          for (const s::Prompt& p : e.prompts) {
            v1::Prompt* prompt = x->add_prompts();
            prompt->set_id(p.id);
            prompt->set_prompt_tokens(p.prompt_tokens);
          }
        } else if constexpr (std::is_same_v<T, s::EngineJoined>) {
          v1::EngineJoined* x = m.mutable_engine_joined();
          x->set_time(e.time);
          x->set_engine(e.engine);
          x->set_max_concurrent(e.max_concurrent);
          x->set_version(e.version);
        } else if constexpr (std::is_same_v<T, s::EngineLeft>) {
          m.mutable_engine_left()->set_time(e.time);
          m.mutable_engine_left()->set_engine(e.engine);
        } else if constexpr (std::is_same_v<T, s::EngineFailed>) {
          m.mutable_engine_failed()->set_time(e.time);
          m.mutable_engine_failed()->set_engine(e.engine);
        } else if constexpr (std::is_same_v<T, s::EngineAttached>) {
          v1::EngineAttached* x = m.mutable_engine_attached();
          x->set_time(e.time);
          x->set_engine(e.engine);
          x->set_max_concurrent(e.max_concurrent);
          x->set_version(e.version);
          x->mutable_samples()->Add(e.samples.begin(), e.samples.end());
          x->set_released(e.released);
        } else if constexpr (std::is_same_v<T, s::GenerationProgressed>) {
          v1::GenerationProgressed* x = m.mutable_generation_progressed();
          x->set_time(e.time);
          x->set_sample(e.sample);
          x->set_tokens(e.tokens);
          AddSpans(e.spans, *x->mutable_spans());
          if (e.engine != s::kAnyEngine) x->set_engine(e.engine);
        } else if constexpr (std::is_same_v<T, s::GenerationFinished>) {
          v1::GenerationFinished* x = m.mutable_generation_finished();
          x->set_time(e.time);
          x->set_sample(e.sample);
          x->set_tokens(e.tokens);
          x->set_reward(e.reward);
          AddSpans(e.spans, *x->mutable_spans());
          if (e.telemetry) {
            v1::RequestTelemetry* t = x->mutable_telemetry();
            t->set_generated_tokens(e.telemetry->generated_tokens);
            t->set_preemptions(e.telemetry->preemptions);
            t->set_interruptions(e.telemetry->interruptions);
            t->set_first_token_seconds(e.telemetry->first_token_seconds);
            t->set_seconds(e.telemetry->seconds);
            t->set_paused_seconds(e.telemetry->paused_seconds);
          }
          if (e.engine != s::kAnyEngine) x->set_engine(e.engine);
        } else if constexpr (std::is_same_v<T, s::GroupFiltered>) {
          m.mutable_group_filtered()->set_time(e.time);
          m.mutable_group_filtered()->set_group(e.group);
          if (e.engine != s::kAnyEngine) m.mutable_group_filtered()->set_engine(e.engine);
        } else if constexpr (std::is_same_v<T, s::TrainStepFinished>) {
          v1::TrainStepFinished* x = m.mutable_train_step_finished();
          x->set_time(e.time);
          x->set_step(e.step);
          x->set_call(e.call);
        } else if constexpr (std::is_same_v<T, s::WeightsLoaded>) {
          v1::WeightsLoaded* x = m.mutable_weights_loaded();
          x->set_time(e.time);
          x->set_engine(e.engine);
          x->set_version(e.version);
        } else if constexpr (std::is_same_v<T, s::GenerationPaused>) {
          v1::GenerationPaused* x = m.mutable_generation_paused();
          x->set_time(e.time);
          x->set_engine(e.engine);
          x->set_version(e.version);
          x->mutable_samples()->Reserve(static_cast<int>(e.samples.size()));
          for (const s::SampleProgress& p : e.samples) {
            v1::SampleProgress* progress = x->add_samples();
            progress->set_sample(p.sample);
            progress->set_tokens(p.tokens);
            AddSpans(p.spans, *progress->mutable_spans());
          }
        } else {
          static_assert(std::is_same_v<T, s::EngineReleased>);
          m.mutable_engine_released()->set_time(e.time);
          m.mutable_engine_released()->set_engine(e.engine);
        }
      },
      event);
  return m;
}

s::Event ToEvent(const v1::OrchestratorEvent& m) {
  switch (m.kind_case()) {
    case v1::OrchestratorEvent::kPromptsAvailable: {
      s::PromptsAvailable e{.time = m.prompts_available().time()};
      e.prompts.reserve(static_cast<std::size_t>(m.prompts_available().prompts_size()));
      for (const v1::Prompt& p : m.prompts_available().prompts()) {
        e.prompts.push_back({.id = p.id(), .prompt_tokens = p.prompt_tokens()});
      }
      return e;
    }
    case v1::OrchestratorEvent::kEngineJoined: {
      const v1::EngineJoined& x = m.engine_joined();
      return s::EngineJoined{.time = x.time(),
                             .engine = x.engine(),
                             .max_concurrent = x.max_concurrent(),
                             .version = x.version()};
    }
    case v1::OrchestratorEvent::kEngineLeft:
      return s::EngineLeft{.time = m.engine_left().time(), .engine = m.engine_left().engine()};
    case v1::OrchestratorEvent::kEngineAttached: {
      const v1::EngineAttached& x = m.engine_attached();
      return s::EngineAttached{.time = x.time(),
                               .engine = x.engine(),
                               .max_concurrent = x.max_concurrent(),
                               .version = x.version(),
                               .samples = {x.samples().begin(), x.samples().end()},
                               .released = x.released()};
    }
    case v1::OrchestratorEvent::kEngineFailed:
      return s::EngineFailed{.time = m.engine_failed().time(),
                             .engine = m.engine_failed().engine()};
    case v1::OrchestratorEvent::kGenerationProgressed: {
      const v1::GenerationProgressed& x = m.generation_progressed();
      return s::GenerationProgressed{.time = x.time(),
                                     .sample = x.sample(),
                                     .tokens = x.tokens(),
                                     .spans = SpansOf(x.spans()),
                                     .engine = x.has_engine() ? x.engine() : s::kAnyEngine};
    }
    case v1::OrchestratorEvent::kGenerationFinished: {
      const v1::GenerationFinished& x = m.generation_finished();
      s::GenerationFinished e{.time = x.time(),
                              .sample = x.sample(),
                              .tokens = x.tokens(),
                              .reward = x.reward(),
                              .spans = SpansOf(x.spans()),
                              .engine = x.has_engine() ? x.engine() : s::kAnyEngine};
      if (x.has_telemetry()) {
        const v1::RequestTelemetry& t = x.telemetry();
        e.telemetry = s::RequestTelemetry{.generated_tokens = t.generated_tokens(),
                                          .preemptions = t.preemptions(),
                                          .interruptions = t.interruptions(),
                                          .first_token_seconds = t.first_token_seconds(),
                                          .seconds = t.seconds(),
                                          .paused_seconds = t.paused_seconds()};
      }
      return e;
    }
    case v1::OrchestratorEvent::kGroupFiltered:
      return s::GroupFiltered{
          .time = m.group_filtered().time(),
          .group = m.group_filtered().group(),
          .engine = m.group_filtered().has_engine() ? m.group_filtered().engine() : s::kAnyEngine};
    case v1::OrchestratorEvent::kTrainStepFinished: {
      const v1::TrainStepFinished& x = m.train_step_finished();
      return s::TrainStepFinished{.time = x.time(), .step = x.step(), .call = x.call()};
    }
    case v1::OrchestratorEvent::kWeightsLoaded: {
      const v1::WeightsLoaded& x = m.weights_loaded();
      return s::WeightsLoaded{.time = x.time(), .engine = x.engine(), .version = x.version()};
    }
    case v1::OrchestratorEvent::kEngineReleased:
      return s::EngineReleased{.time = m.engine_released().time(),
                               .engine = m.engine_released().engine()};
    case v1::OrchestratorEvent::kGenerationPaused: {
      const v1::GenerationPaused& x = m.generation_paused();
      s::GenerationPaused e{.time = x.time(), .engine = x.engine(), .version = x.version()};
      e.samples.reserve(static_cast<std::size_t>(x.samples_size()));
      for (const v1::SampleProgress& p : x.samples()) {
        e.samples.push_back(
            {.sample = p.sample(), .tokens = p.tokens(), .spans = SpansOf(p.spans())});
      }
      return e;
    }
    case v1::OrchestratorEvent::KIND_NOT_SET:
      break;
  }
  Fail("kind",
       "must be set (one of prompts_available, engine_joined, …, engine_released, "
       "generation_paused)");
}

v1::OrchestratorCommand ToCommandMessage(const s::Command& command) {
  v1::OrchestratorCommand m;
  std::visit(
      [&m](const auto& c) {
        using T = std::decay_t<decltype(c)>;
        if constexpr (std::is_same_v<T, s::Dispatch>) {
          v1::Dispatch* x = m.mutable_dispatch();
          x->set_engine(c.engine);
          x->set_version(c.version);
          for (const s::SampleWork& w : c.samples) {
            v1::SampleWork* work = x->add_samples();
            work->set_sample(w.sample);
            work->set_group(w.group);
            work->set_prompt(w.prompt);
            work->set_prompt_tokens(w.prompt_tokens);
            work->set_resume_from(w.resume_from);
            work->set_predicted_tokens(w.predicted_tokens);
          }
        } else if constexpr (std::is_same_v<T, s::Abort>) {
          m.mutable_abort()->set_engine(c.engine);
          m.mutable_abort()->mutable_samples()->Add(c.samples.begin(), c.samples.end());
        } else if constexpr (std::is_same_v<T, s::SyncWeights>) {
          v1::SyncWeights* x = m.mutable_sync_weights();
          x->set_engine(c.engine);
          x->set_version(c.version);
          x->set_interrupt(c.interrupt);
          x->set_replan(c.replan);
          for (const s::MemoryTag tag : c.resume) x->add_resume(ToMemoryTagMessage(tag));
          if (c.interrupt) {
            x->set_pause(c.pause == s::PauseMode::kAbort ? v1::PAUSE_MODE_ABORT
                                                         : v1::PAUSE_MODE_KEEP);
          }
        } else if constexpr (std::is_same_v<T, s::Resume>) {
          v1::Resume* x = m.mutable_resume();
          x->set_engine(c.engine);
          x->set_version(c.version);
          x->mutable_samples()->Add(c.samples.begin(), c.samples.end());
        } else if constexpr (std::is_same_v<T, s::Release>) {
          m.mutable_release()->set_engine(c.engine);
          for (const s::MemoryTag tag : c.tags) {
            m.mutable_release()->add_tags(ToMemoryTagMessage(tag));
          }
        } else {
          static_assert(std::is_same_v<T, s::StartTrain>);
          v1::StartTrain* x = m.mutable_start_train();
          x->set_step(c.step);
          x->set_call(c.call);
          x->set_version(c.version);
          x->mutable_groups()->Add(c.groups.begin(), c.groups.end());
          x->mutable_samples()->Add(c.samples.begin(), c.samples.end());
          x->mutable_lengths()->Add(c.lengths.begin(), c.lengths.end());
          if (c.plan) *x->mutable_plan() = ToPlanStepReply(*c.plan);
        }
      },
      command);
  return m;
}

s::OrchestratorOptions RunOrchestratorOptions(const s::SimulatorConfig& config) {
  s::OrchestratorOptions options{config.orchestrator};
  options.num_steps = config.steps;
  if (config.filter_all_equal) options.filter = s::KeepUnlessAllEqual;
  return options;
}

// ---- The event log. ----

namespace {

void AppendRecord(const v1::EventLogRecord& record, std::string& out) {
  const std::size_t size = record.ByteSizeLong();
  char prefix[10];
  std::uint8_t* const end = google::protobuf::io::CodedOutputStream::WriteVarint64ToArray(
      size, reinterpret_cast<std::uint8_t*>(prefix));
  out.append(prefix, reinterpret_cast<char*>(end));
  const std::size_t at = out.size();
  out.resize(at + size);
  record.SerializeWithCachedSizesToArray(reinterpret_cast<std::uint8_t*>(out.data() + at));
}

// The record at the front of `raw` (`index` for errors) with its size in bytes, read
// through a CodedInputStream of its own (so that no limit applies to the whole log);
// no record when it is cut short: its size prefix, or fewer of the `left` bytes than it
// says.
struct NextRecord {
  std::optional<v1::EventLogRecord> record;
  std::int64_t bytes = 0;
};

NextRecord ReadRecord(google::protobuf::io::ZeroCopyInputStream& raw, std::int64_t left,
                      std::int64_t index) {
  google::protobuf::io::CodedInputStream in(&raw);
  std::uint64_t size = 0;
  if (!in.ReadVarint64(&size)) return {};
  const std::int64_t prefix = in.CurrentPosition();
  if (size > static_cast<std::uint64_t>(left - prefix)) return {};
  if (size > static_cast<std::uint64_t>(std::numeric_limits<int>::max())) {
    Fail("record " + std::to_string(index), "larger than 2 GiB");
  }
  v1::EventLogRecord record;
  const auto limit = in.PushLimit(static_cast<int>(size));
  if (!record.ParseFromCodedStream(&in) || !in.ConsumedEntireMessage()) {
    Fail("record " + std::to_string(index), "not an EventLogRecord");
  }
  in.PopLimit(limit);
  return {std::move(record), prefix + static_cast<std::int64_t>(size)};
}

// The bytes from `in`'s position to its end (it is left where it was); -1 when the
// stream cannot seek.
std::int64_t BytesLeft(std::istream& in) {
  const std::istream::pos_type here = in.tellg();
  if (here == std::istream::pos_type(-1) || !in.seekg(0, std::ios::end)) return -1;
  const std::istream::pos_type end = in.tellg();
  in.seekg(here);
  return end == std::istream::pos_type(-1) ? -1 : static_cast<std::int64_t>(end - here);
}

void ReadHeader(const v1::EventLogRecord& record, EventLog& log) {
  if (!record.has_header()) Fail("record 0", "must be the header (the run's config)");
  log.header = record.header();
  try {
    log.config = ToSimulatorConfig(record.header());
  } catch (const FieldError& e) {
    throw e.Within("record 0.header");
  }
}

}  // namespace

std::string EventLogHeader(const s::SimulatorConfig& config, const v1::ReshardRequest* layout) {
  std::string out;
  v1::EventLogRecord header;
  *header.mutable_header() = ToSimulatorConfigMessage(config);
  AppendRecord(header, out);
  if (layout != nullptr) {
    v1::EventLogRecord record;
    *record.mutable_weight_layout() = *layout;
    AppendRecord(record, out);
  }
  return out;
}

void AppendEventRecords(const s::Event& event, std::span<const s::Command> commands,
                        std::string& out) {
  v1::EventLogRecord record;
  *record.mutable_event() = ToEventMessage(event);
  AppendRecord(record, out);
  for (const s::Command& command : commands) {
    *record.mutable_command() = ToCommandMessage(command);
    AppendRecord(record, out);
  }
}

EventLog ReadEventLog(std::istream& in, bool torn_tail) {
  const std::int64_t total = BytesLeft(in);
  if (total < 0) {  // a pipe: read whole, then from memory
    std::istringstream copy(std::string(std::istreambuf_iterator<char>(in), {}));
    return ReadEventLog(copy, torn_tail);
  }
  google::protobuf::io::IstreamInputStream raw(&in);
  EventLog log;
  for (std::int64_t index = 0; log.whole_bytes < total; ++index) {
    NextRecord next = ReadRecord(raw, total - log.whole_bytes, index);
    if (!next.record) {
      if (!torn_tail) Fail("record " + std::to_string(index), "truncated");
      log.torn_bytes = total - log.whole_bytes;
      break;
    }
    log.whole_bytes += next.bytes;
    if (index == 0) {
      ReadHeader(*next.record, log);
      continue;
    }
    const std::string name = "record " + std::to_string(index);
    switch (next.record->kind_case()) {
      case v1::EventLogRecord::kHeader:
        Fail(name, "a second header");
      case v1::EventLogRecord::kWeightLayout:
        if (index != 1) Fail(name, "the weight layout comes right after the header");
        log.weight_layout = std::move(*next.record->mutable_weight_layout());
        continue;
      case v1::EventLogRecord::KIND_NOT_SET:
        Fail(name, "kind: must be set");
      default:
        log.records.push_back(std::move(*next.record));
    }
  }
  if (log.whole_bytes == 0) Fail("record 0", "missing: the log is empty");
  return log;
}

ReplayResult Replay(const EventLog& log) {
  s::Orchestrator core(RunOrchestratorOptions(log.config));
  ReplayResult result;
  std::vector<v1::OrchestratorCommand> replayed;
  std::vector<const v1::OrchestratorCommand*> logged;
  for (std::size_t i = 0; i < log.records.size(); ++i) {
    const v1::EventLogRecord& record = log.records[i];
    if (record.has_command()) {
      logged.push_back(&record.command());
      continue;
    }
    s::Event event;
    try {
      event = ToEvent(record.event());
    } catch (const FieldError& e) {
      throw e.Within("record " + std::to_string(i + 1) + ".event");
    }
    ++result.events;
    std::vector<s::Command> commands;
    try {
      core.Handle(event, commands);
    } catch (const std::invalid_argument&) {
      ++result.rejected_events;
    }
    for (const s::Command& command : commands) replayed.push_back(ToCommandMessage(command));
  }
  result.commands = static_cast<std::int64_t>(replayed.size());
  const std::size_t n = std::max(replayed.size(), logged.size());
  for (std::size_t i = 0; i < n; ++i) {
    const std::string a = i < logged.size() ? logged[i]->ShortDebugString() : "none";
    const std::string b = i < replayed.size() ? replayed[i].ShortDebugString() : "none";
    if (a != b) {
      result.first_difference = static_cast<std::int64_t>(i);
      result.logged = a;
      result.replayed = b;
      break;
    }
  }
  return result;
}

}  // namespace rlsched::wire
