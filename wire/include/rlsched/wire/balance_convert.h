// balance_convert.h — the sequence balancer and the step planner behind their wire
// contract.
//
// Overview
//   Turns a rlsched.v1.BalanceRequest into balance::BalanceOptions (validating every
//   field against the limits written in balance.proto), runs balance::Balance() and
//   fills a rlsched.v1.BalanceReply; likewise a rlsched.v1.PlanStepRequest into
//   balance::StepOptions, balance::PlanStep() and a rlsched.v1.PlanStepReply. The
//   commands (`rlsched balance`, `rlsched plan-step`) and the daemon (`rlsched serve`)
//   all answer through SolveBalance() and SolvePlanStep(), so they cannot disagree.
//   Both requests share the checks of their common fields (lengths, groups,
//   keep_groups, cost, refine_iterations). Nothing here does I/O or logging.
//
// Example
//   rlsched::v1::BalanceRequest request;
//   request.add_lengths(4096);
//   request.add_lengths(512);
//   request.set_num_parts(2);
//   rlsched::v1::BalanceReply reply = rlsched::wire::SolveBalance(request);
//   std::string json = rlsched::wire::ToJson(reply);
//
//   rlsched::v1::PlanStepRequest step;
//   step.mutable_lengths()->Add(lengths.begin(), lengths.end());
//   step.set_num_ranks(64);
//   step.set_max_tokens_per_micro_batch(32768);
//   rlsched::v1::PlanStepReply plan = rlsched::wire::SolvePlanStep(step);
//
// Thread-safety: every function is pure; concurrent calls are safe.

#ifndef RLSCHED_WIRE_BALANCE_CONVERT_H_
#define RLSCHED_WIRE_BALANCE_CONVERT_H_

#include <google/protobuf/message.h>

#include <ostream>
#include <string>

#include "rlsched/balance/balance.h"
#include "rlsched/balance/plan_step.h"
#include "rlsched/v1/balance.pb.h"
#include "rlsched/wire/json.h"

namespace rlsched::wire {

// The options a request asks for. Throws std::invalid_argument whose message starts
// with the proto field's path and states the bound, e.g.
// "num_parts: must be in [1, 1048576], got 0". Checks: num_parts in [1, 1048576];
// at most 100,000,000 lengths, each in [0, 2^31]; groups empty or one id >= 0 per
// length; keep_groups needs groups; known enum values; for COST_KIND_ATTENTION
// exactly one of cost.model (fields >= 1, num_kv_heads >= 0 with 0 meaning
// num_attention_heads, heads dividing hidden_size, KV heads dividing heads) and
// cost.coefficients (finite, >= 0, linear + quadratic > 0), cost.per_sequence finite
// and >= 0 and only with a model; model and coefficients only with attention;
// refine_iterations >= 0 (0 disables refinement). O(n).
balance::BalanceOptions ToBalanceOptions(const v1::BalanceRequest& request);

// Validates `request` (as ToBalanceOptions()), balances it and returns the reply:
// num_parts parts with ascending indices, each part's tokens and cost, and max_cost,
// min_cost, lower_bound, gap and proven_optimal in cost units. Throws
// std::invalid_argument for bad input, including a total that overflows int64.
// Deterministic. Complexity: that of balance::Balance().
v1::BalanceReply SolveBalance(const v1::BalanceRequest& request);

// The options a step request asks for. Throws std::invalid_argument as
// ToBalanceOptions(), e.g. "max_tokens_per_micro_batch: must be >= 1, got 0". Checks:
// num_ranks in [1, 1048576]; max_tokens_per_micro_batch >= 1; min_micro_batches,
// micro_batches_multiple_of and pipeline_stages in [0, 1048576] and
// pad_to_multiple_of >= 0 (0 means 1 for all four); overhead >= 0; a known order;
// and lengths, groups, keep_groups, cost and refine_iterations as ToBalanceOptions().
// Sequences longer than the cap are found by SolvePlanStep(). O(n).
balance::StepOptions ToStepOptions(const v1::PlanStepRequest& request);

// Validates `request` (as ToStepOptions()), plans the step and returns the reply:
// num_ranks ranks, each with its micro-batches in execution order (ascending indices,
// padded tokens, cost), its tokens, cost and predicted time; the micro-batch count
// (the same on every rank), the predicted step time, its lower bound, and the
// baseline pipeline's step time, cap violations and micro-batch count. Throws
// std::invalid_argument for bad input: the ToStepOptions() checks, a (padded)
// sequence above the cap ("lengths[i]: sequence of T tokens (padded) exceeds
// max_tokens_per_micro_batch = C"), or totals and times that overflow int64.
// Deterministic. Complexity: that of balance::PlanStep().
v1::PlanStepReply SolvePlanStep(const v1::PlanStepRequest& request);

// A step plan (and its baseline's figures) as SolvePlanStep() answers it. O(plan).
v1::PlanStepReply ToPlanStepReply(const balance::PlannedStep& step);

// Writes ToJson(reply) to `out`, byte for byte, one part at a time: the memory of the
// largest part's text instead of the whole reply's (1,000,000 indices in 1,024 parts:
// a few MB instead of a few hundred). Throws std::runtime_error as ToJson does.
// O(reply size).
void WriteJson(const v1::BalanceReply& reply, std::ostream& out);

// Writes ToJson(reply) to `out`, byte for byte, rank by rank: the ranks and their
// micro-batches are printed here (about 0.3 µs per micro-batch instead of protobuf's
// ~15 µs; 3 sequences forced into 2^20 micro-batches: 1.1 s and 220 MB for the whole
// `plan-step --json`, 18.9 s and 1.9 GB through ToJson), the other fields by ToJson,
// and the text goes out in pieces of 64 KB instead of one string of the whole reply
// (~60 bytes per empty micro-batch). A proto layout this writer does not know (a field
// added to RankPlan or MicroBatch, or a printer that formats a probe rank differently)
// falls back to ToJson(reply). Throws std::runtime_error as ToJson does. O(reply size).
void WriteJson(const v1::PlanStepReply& reply, std::ostream& out);

}  // namespace rlsched::wire

#endif  // RLSCHED_WIRE_BALANCE_CONVERT_H_
