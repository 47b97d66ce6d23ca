// The whole wire: one rlsched.v1.Request solved into its rlsched.v1.Reply (see
// rlsched/wire/solve.h).

#include "rlsched/wire/solve.h"

#include <fmt/format.h>

#include <exception>
#include <stdexcept>
#include <string>

#include "rlsched/common/error.h"
#include "rlsched/wire/balance_convert.h"
#include "rlsched/wire/reshard_convert.h"
#include "rlsched/wire/simulate_convert.h"

#ifndef RLSCHED_VERSION
#error "RLSCHED_VERSION must be defined by the build"
#endif

namespace rlsched::wire {
namespace {

std::string EmptyRequestMessage(const v1::Request& request) {
  std::string message =
      "the request sets none of balance, plan_step, ping, reshard, simulate, calibrate";
  if (!request.GetReflection()->GetUnknownFields(request).empty()) {
    message += " (it has fields this daemon does not know: a newer client?)";
  }
  return message;
}

}  // namespace

std::string_view RequestKindName(v1::Request::KindCase kind) {
  switch (kind) {
    case v1::Request::kBalance:
      return "balance";
    case v1::Request::kPlanStep:
      return "plan_step";
    case v1::Request::kPing:
      return "ping";
    case v1::Request::kReshard:
      return "reshard";
    case v1::Request::kSimulate:
      return "simulate";
    case v1::Request::kCalibrate:
      return "calibrate";
    case v1::Request::KIND_NOT_SET:
      break;
  }
  return "none";
}

std::string_view ServeVersion() { return RLSCHED_VERSION; }

v1::Reply ErrorReply(std::string_view id, v1::ErrorCode code, std::string_view message,
                     std::string_view field) {
  v1::Reply reply;
  reply.set_id(std::string(id));
  v1::Error* error = reply.mutable_error();
  error->set_code(code);
  error->set_message(std::string(message));
  error->set_field(std::string(field));
  return reply;
}

v1::Reply Solve(const v1::Request& request, const std::function<bool()>& should_stop) {
  const std::string_view kind = RequestKindName(request.kind_case());
  try {
    v1::Reply reply;
    reply.set_id(request.id());
    switch (request.kind_case()) {
      case v1::Request::kBalance:
        *reply.mutable_balance() = SolveBalance(request.balance());
        break;
      case v1::Request::kPlanStep:
        *reply.mutable_plan_step() = SolvePlanStep(request.plan_step());
        break;
      case v1::Request::kPing:
        reply.mutable_pong()->set_version(std::string(ServeVersion()));
        break;
      case v1::Request::kReshard:
        *reply.mutable_reshard() = SolveReshard(request.reshard());
        break;
      case v1::Request::kSimulate:
        *reply.mutable_simulate() = SolveSimulate(request.simulate(), should_stop);
        break;
      case v1::Request::kCalibrate:
        *reply.mutable_calibrate() = SolveCalibrate(request.calibrate(), should_stop);
        break;
      case v1::Request::KIND_NOT_SET:
        return ErrorReply(request.id(), v1::ERROR_CODE_EMPTY_REQUEST, EmptyRequestMessage(request));
    }
    return reply;
  } catch (const FieldError& e) {
    return ErrorReply(request.id(), v1::ERROR_CODE_INVALID_ARGUMENT, e.what(),
                      e.Within(kind).field());
  } catch (const std::invalid_argument& e) {
    return ErrorReply(request.id(), v1::ERROR_CODE_INVALID_ARGUMENT, e.what(), kind);
  } catch (const Stopped& e) {
    return ErrorReply(request.id(), v1::ERROR_CODE_DEADLINE_EXCEEDED,
                      fmt::format("{}: {}", kind, e.what()));
  } catch (const std::exception& e) {
    return ErrorReply(request.id(), v1::ERROR_CODE_INTERNAL,
                      fmt::format("internal error in {}: {}", kind, e.what()));
  } catch (...) {
    return ErrorReply(request.id(), v1::ERROR_CODE_INTERNAL,
                      fmt::format("internal error in {}: unknown exception", kind));
  }
}

}  // namespace rlsched::wire
