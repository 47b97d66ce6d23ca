// rlsched/wire/solve.h — the wire library: an rlsched.v1.Request solved in process.
//
// Overview
//   rlsched::wire converts between the rlsched.v1 protobuf messages (proto/) and the
//   C++ libraries (balance, rollout, scheduler), and answers a whole Request: what the
//   daemon `rlsched serve` does for each frame, without the daemon, for an embedder
//   that already speaks rlsched.v1. No CLI11, spdlog or threads: the conversions
//   (balance_convert.h, reshard_convert.h, simulate_convert.h) and Solve().
//
// Example
//   rlsched::v1::Request request;
//   request.set_id("a");
//   request.mutable_balance()->add_lengths(4096);  // ...
//   request.mutable_balance()->set_num_parts(8);
//   rlsched::v1::Reply reply = rlsched::wire::Solve(request);  // reply.balance()
//
// Thread-safety: every function is pure and safe to call concurrently.

#ifndef RLSCHED_WIRE_SOLVE_H_
#define RLSCHED_WIRE_SOLVE_H_

#include <functional>
#include <string_view>

#include "rlsched/v1/service.pb.h"

namespace rlsched::wire {

// The version a Pong reports ("0.1.0").
std::string_view ServeVersion();

// A reply with `id` and an error. Pure.
v1::Reply ErrorReply(std::string_view id, v1::ErrorCode code, std::string_view message,
                     std::string_view field = {});

// Answers one request: a BalanceReply (SolveBalance()), a PlanStepReply
// (SolvePlanStep()), a ReshardPlan (SolveReshard()), a SimulateReply
// (SolveSimulate()), a Pong, or an Error — INVALID_ARGUMENT for
// an invalid request (field = the request kind + "." + FieldError::field(), e.g.
// "balance.lengths[3]", or just the kind when no one field is at fault), EMPTY_REQUEST when no kind
// is set, INTERNAL for any other exception. The reply echoes request.id().
// DEADLINE_EXCEEDED when `should_stop` stopped the solve (it is asked between the
// simulator's events; the other kinds are bounded by their size limits instead).
// Deterministic. Throws only std::bad_alloc, when even the error reply cannot be
// built. Complexity: that of the solve.
v1::Reply Solve(const v1::Request& request, const std::function<bool()>& should_stop = {});

// The request kind's field name in Request ("balance", "plan_step", …; "none"). Pure.
std::string_view RequestKindName(v1::Request::KindCase kind);

}  // namespace rlsched::wire

#endif  // RLSCHED_WIRE_SOLVE_H_
