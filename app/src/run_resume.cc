// run_resume.cc — see run_resume.h.

#include "run_resume.h"

#include <fmt/format.h>
#include <google/protobuf/util/message_differencer.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <variant>

#include "rlsched/common/error.h"

namespace rlsched::app {
namespace {

// The events of the log, and what the data loader posted.
void TakeRecords(const wire::EventLog& log, ResumedRun& run) {
  for (const v1::EventLogRecord& record : log.records) {
    if (record.has_command()) continue;
    scheduler::Event event = wire::ToEvent(record.event());
    run.last_time =
        std::max(run.last_time, std::visit([](const auto& e) { return e.time; }, event));
    if (const auto* p = std::get_if<scheduler::PromptsAvailable>(&event)) {
      run.prompts_posted += static_cast<std::int64_t>(p->prompts.size());
    }
    run.resume.events.push_back(std::move(event));
  }
}

}  // namespace

std::optional<std::string> FirstDifference(const google::protobuf::Message& logged,
                                           const google::protobuf::Message& given) {
  std::string report;
  google::protobuf::util::MessageDifferencer differencer;
  differencer.ReportDifferencesToString(&report);
  if (differencer.Compare(logged, given)) return std::nullopt;
  const std::size_t end = report.find('\n');
  return report.substr(0, end);
}

ResumedRun ReadResumedRun(const std::string& path, const v1::SimulatorConfig& config,
                          const std::optional<v1::ReshardRequest>& layout) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    Fail(fmt::format("--resume {}", path), fmt::format("cannot open: {}", std::strerror(errno)));
  }
  wire::EventLog log;
  try {
    log = wire::ReadEventLog(in, /*torn_tail=*/true);
  } catch (const std::invalid_argument& e) {
    Fail(fmt::format("--resume {}", path), e.what());
  }
  if (const std::optional<std::string> d = FirstDifference(log.header, config)) {
    Fail(fmt::format("--resume {}", path),
         fmt::format("the flags make another config than the logged run's ({}); give the flags it "
                     "was started with",
                     *d));
  }
  if (log.weight_layout.has_value() != layout.has_value()) {
    Fail(fmt::format("--resume {}", path),
         fmt::format("the logged run {} a weight layout (--model, --train, --infer); the flags {}",
                     log.weight_layout ? "has" : "has no", layout ? "give one" : "give none"));
  }
  if (layout) {
    if (const std::optional<std::string> d = FirstDifference(*log.weight_layout, *layout)) {
      Fail(fmt::format("--resume {}", path),
           fmt::format("the flags make another weight layout than the logged run's ({})", *d));
    }
  }
  ResumedRun run{.whole_bytes = log.whole_bytes, .torn_bytes = log.torn_bytes};
  TakeRecords(log, run);
  return run;
}

}  // namespace rlsched::app
