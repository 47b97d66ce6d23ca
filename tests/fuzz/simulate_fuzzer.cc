// simulate_fuzzer.cc — libFuzzer target over the simulate request as the daemon
// solves it, deadline included: the input is a serialized rlsched.v1.SimulateRequest,
// answered by wire::Solve() with a stop check that fires kDeadline after the start (what
// `rlsched serve --request-timeout` does). Unlike serve_fuzzer, which leaves expensive
// simulations unsolved, every request is solved here: the work budget
// (CheckWorkBudget), the daemon's limits and the deadline must end each one quickly.
//
// Checked beyond the sanitizers and libFuzzer's -rss_limit_mb / -timeout: the reply is
// a SimulateReply, or an INVALID_ARGUMENT error naming a field under "simulate.", or
// DEADLINE_EXCEEDED (never INTERNAL); every run conserves its samples (admitted =
// trained + filtered + buffered + queued + in flight) and finished its steps.
//
// Run: see tests/fuzz/CMakeLists.txt.

#include <google/protobuf/stubs/logging.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "rlsched/wire/solve.h"

namespace {

constexpr std::chrono::milliseconds kDeadline{2000};

[[noreturn]] void Die(const char* what, const std::string& detail) {
  std::fprintf(stderr, "simulate_fuzzer: %s\n%s\n", what, detail.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const bool quiet = [] {
    google::protobuf::SetLogHandler(nullptr);
    return true;
  }();
  (void)quiet;
  rlsched::v1::Request request;
  request.set_id("f");
  if (!request.mutable_simulate()->ParseFromArray(data, static_cast<int>(size))) return 0;
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  const rlsched::v1::Reply reply =
      rlsched::wire::Solve(request, [&] { return std::chrono::steady_clock::now() >= deadline; });
  if (reply.id() != "f") Die("the reply lost the id", reply.DebugString());
  if (reply.has_error()) {
    const rlsched::v1::Error& error = reply.error();
    if (error.code() == rlsched::v1::ERROR_CODE_DEADLINE_EXCEEDED) return 0;
    if (error.code() != rlsched::v1::ERROR_CODE_INVALID_ARGUMENT ||
        !error.field().starts_with("simulate")) {
      Die("an error that is not a field's", request.DebugString() + reply.DebugString());
    }
    return 0;
  }
  if (!reply.has_simulate() || reply.simulate().runs_size() == 0) {
    Die("no simulation run", reply.DebugString());
  }
  for (const auto& run : reply.simulate().runs()) {
    const auto& c = run.report().counters();
    if (c.admitted() != c.trained() + c.filtered() + c.buffered() + c.queued() + c.in_flight()) {
      Die("samples not conserved", run.DebugString());
    }
    if (c.steps_finished() != run.config().steps()) Die("steps not finished", run.DebugString());
  }
  return 0;
}
