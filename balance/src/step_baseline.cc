// The common recipe (PlanBaseline), as verl runs it, scored with rlsched's cost
// model: the comparison PlanStep reports beside its own plan.
//
// Source: verl at commit b178a3cd56f58b2d502255daba591e92833930a7:
//   verl/trainer/ppo/ray_trainer.py, RayPPOTrainer._balance_batch: the batch split
//     across the data-parallel ranks by get_seqlen_balanced_partitions(workloads,
//     k = dp size, equal_size = True) on calculate_workload's key, then each rank's
//     sequences sorted ascending by (workload, index) and reordered as the even
//     positions followed by the odd ones reversed;
//   verl/utils/seqlen_balancing.py, rearrange_micro_batches (via
//     prepare_dynamic_batch in verl/workers/actor/dp_actor.py, or directly in
//     verl/workers/actor/megatron_actor.py): per rank
//     min(sequences, ceil(tokens / max_token_len)) micro-batches, at least
//     min_num_micro_batch, the max over the ranks (an all-reduce, same_micro_num_in_dp),
//     rounded up to a multiple of num_batches_divided_by; the rank's sequences split
//     by get_seqlen_balanced_partitions(workloads, count, equal_size = False); the
//     micro-batches sorted by (workload, first sequence) descending and reordered
//     (use_dynamic_bsz_balance) as the even positions reversed followed by the odd
//     ones. Nothing checks a micro-batch against max_token_len: one above it runs
//     (a possible out-of-memory).

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <span>
#include <utility>
#include <vector>

#include "micro_batch_internal.h"
#include "recipe_partition.h"
#include "rlsched/balance/micro_batch.h"
#include "step_bound.h"

namespace rlsched::balance {
namespace internal {
namespace {

// Even positions, then odd positions reversed: [a0 a2 a4 … a5 a3 a1].
template <typename T>
std::vector<T> EvensThenOddsReversed(const std::vector<T>& v) {
  std::vector<T> out;
  for (std::size_t j = 0; j < v.size(); j += 2) out.push_back(v[j]);
  for (std::size_t j = v.size() / 2 * 2; j-- > 0;) {
    if (j % 2 == 1) out.push_back(v[j]);
  }
  return out;
}

// Even positions reversed, then odd positions: [… a4 a2 a0 a1 a3 a5 …].
template <typename T>
std::vector<T> EvensReversedThenOdds(const std::vector<T>& v) {
  std::vector<T> out;
  for (std::size_t j = (v.size() + 1) / 2 * 2; j >= 2; j -= 2) out.push_back(v[j - 2]);
  for (std::size_t j = 1; j < v.size(); j += 2) out.push_back(v[j]);
  return out;
}

}  // namespace

StepPlan RecipePlan(const Padded& padded, const StepOptions& options) {
  const MicroBatchOptions& mb = options.micro_batch;
  const std::int64_t cap = mb.max_tokens_per_micro_batch;
  const std::span<const std::int64_t> lengths = padded.lengths;
  std::vector<std::int64_t> workload(lengths.size());
  for (std::size_t i = 0; i < lengths.size(); ++i) workload[i] = RecipeWorkload(lengths[i]);

  // Sequences to ranks, each rank's in the recipe's order.
  std::vector<std::vector<std::int64_t>> ranks =
      RecipeKarmarkarKarp(workload, options.num_ranks, PartSizes::kEqual);
  std::int64_t count = 0;
  for (std::vector<std::int64_t>& rank : ranks) {
    {  // by (workload, index), stably: `rank` is ascending
      std::vector<std::pair<std::int64_t, std::int64_t>> keyed(rank.size());
      for (std::size_t j = 0; j < rank.size(); ++j) {
        keyed[j] = {workload[static_cast<std::size_t>(rank[j])], rank[j]};
      }
      std::sort(keyed.begin(), keyed.end());
      for (std::size_t j = 0; j < rank.size(); ++j) rank[j] = keyed[j].second;
    }
    rank = EvensThenOddsReversed(rank);
    std::int64_t tokens = 0;  // the lengths, unpadded, as verl counts them
    for (const std::int64_t i : rank) tokens += lengths[static_cast<std::size_t>(i)];
    const std::int64_t wanted =
        std::min(static_cast<std::int64_t>(rank.size()), CeilDiv(tokens, cap));
    count = std::max(count, std::max(mb.min_micro_batches, wanted));
  }
  count = RoundUp(count, mb.micro_batches_multiple_of);

  StepPlan plan;
  plan.num_micro_batches = count;
  for (const std::vector<std::int64_t>& rank : ranks) {
    std::vector<std::int64_t> local(rank.size());  // by position in the rank's order
    for (std::size_t j = 0; j < rank.size(); ++j) {
      local[j] = workload[static_cast<std::size_t>(rank[j])];
    }
    std::vector<std::vector<std::int64_t>> parts =
        RecipeKarmarkarKarp(local, count, PartSizes::kAny);
    // By (sum, first item) descending, stably: each key computed once, the parts moved
    // once (sorting the parts themselves cost O(m log m) vector moves and key sums).
    std::vector<std::pair<RecipeSum, std::int64_t>> keys(parts.size());
    for (std::size_t p = 0; p < parts.size(); ++p) {
      RecipeSum sum = 0;
      for (const std::int64_t j : parts[p]) sum += local[static_cast<std::size_t>(j)];
      keys[p] = {sum, parts[p].empty() ? std::int64_t{0} : parts[p].front()};
    }
    std::vector<std::size_t> by_key(parts.size());
    std::iota(by_key.begin(), by_key.end(), std::size_t{0});
    std::stable_sort(by_key.begin(), by_key.end(),
                     [&](std::size_t a, std::size_t b) { return keys[a] > keys[b]; });
    {
      std::vector<std::vector<std::int64_t>> sorted;
      sorted.reserve(parts.size());
      for (const std::size_t p : by_key) sorted.push_back(std::move(parts[p]));
      parts = std::move(sorted);
    }
    parts = EvensReversedThenOdds(parts);
    RankPlan rank_plan;
    for (const std::vector<std::int64_t>& part : parts) {
      MicroBatch batch;
      for (const std::int64_t j : part) {
        const auto i = static_cast<std::size_t>(rank[static_cast<std::size_t>(j)]);
        batch.indices.push_back(static_cast<std::int64_t>(i));
        batch.tokens += padded.tokens[i];
        batch.unpadded_tokens += lengths[i];
        batch.cost += padded.costs[i];
      }
      std::sort(batch.indices.begin(), batch.indices.end());
      plan.cap_violations += batch.tokens > cap ? 1 : 0;
      rank_plan.sequences += static_cast<std::int64_t>(batch.indices.size());
      rank_plan.tokens += batch.tokens;
      rank_plan.unpadded_tokens += batch.unpadded_tokens;
      rank_plan.cost += batch.cost;
      rank_plan.micro_batches.push_back(std::move(batch));
    }
    rank_plan.time = RankTime(rank_plan.micro_batches, mb);
    plan.predicted_step_time = std::max(plan.predicted_step_time, rank_plan.time);
    plan.ranks.push_back(std::move(rank_plan));
  }
  plan.empty_micro_batches = EmptyMicroBatches(plan);
  return plan;
}

}  // namespace internal

StepPlan PlanBaseline(std::span<const std::int64_t> lengths, const StepOptions& unresolved) {
  internal::CheckStepOptions(unresolved);
  StepOptions options = unresolved;
  options.micro_batch = internal::Resolved(unresolved.micro_batch);
  const internal::Padded padded = internal::Pad(lengths, options.micro_batch);
  StepPlan plan = internal::RecipePlan(padded, options);
  plan.lower_bound = internal::UngroupedBound(
      padded, PartSizesFor(options.equal_size && !options.keep_groups),
      plan.empty_micro_batches > 0 ? internal::Empties::kAllowed : internal::Empties::kNone,
      options);
  internal::SetTotals(padded, options.micro_batch, plan);
  return plan;
}

}  // namespace rlsched::balance
