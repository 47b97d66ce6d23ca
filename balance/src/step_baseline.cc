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

// Even positions reversed, then odd positions: [… a4 a2 a0 a1 a3 a5 …].
template <typename T>
std::vector<T> EvensReversedThenOdds(const std::vector<T>& v) {
  std::vector<T> out;
  for (std::size_t j = (v.size() + 1) / 2 * 2; j >= 2; j -= 2) out.push_back(v[j - 2]);
  for (std::size_t j = 1; j < v.size(); j += 2) out.push_back(v[j]);
  return out;
}

// Even positions, then odd positions reversed ([a0 a2 a4 … a5 a3 a1]) of `size`
// items: the position in the input of output position j.
std::size_t EvensThenOddsReversedSource(std::size_t size, std::size_t j) {
  const std::size_t evens = (size + 1) / 2;
  return j < evens ? 2 * j : 2 * (size - 1 - j) + 1;
}

// One sequence of a rank, by its position in the recipe's order.
struct Sequence {
  std::int64_t index;
  std::int64_t tokens;
  std::int64_t unpadded_tokens;
  std::int64_t cost;
};

}  // namespace

StepPlan RecipePlan(const Padded& padded, const StepOptions& options) {
  const MicroBatchOptions& mb = options.micro_batch;
  const std::int64_t cap = mb.max_tokens_per_micro_batch;
  const std::span<const std::int64_t> lengths = padded.lengths;
  std::vector<std::int64_t> workload(lengths.size());
  for (std::size_t i = 0; i < lengths.size(); ++i) workload[i] = RecipeWorkload(lengths[i]);

  // Sequences to ranks, each rank's by (workload, index) ascending: verl sorts a rank's
  // sequences so (stably, from index order) before it reorders them.
  const std::vector<std::vector<std::int64_t>> ranks =
      RecipeKarmarkarKarp(workload, options.num_ranks, PartSizes::kEqual, RecipeOrder::kValue);
  std::int64_t count = 0;
  for (const std::vector<std::int64_t>& rank : ranks) {
    std::int64_t tokens = 0;  // the lengths, unpadded, as verl counts them
    for (const std::int64_t i : rank) tokens += lengths[static_cast<std::size_t>(i)];
    const std::int64_t wanted =
        std::min(static_cast<std::int64_t>(rank.size()), CeilDiv(tokens, cap));
    count = std::max(count, std::max(mb.min_micro_batches, wanted));
  }
  count = RoundUp(count, mb.micro_batches_multiple_of);

  StepPlan plan;
  plan.num_micro_batches = count;
  std::vector<Sequence> sequences;  // by position in the rank's order
  std::vector<std::int64_t> local;  // their workloads
  std::vector<std::int64_t> sorted_workload;
  std::vector<std::int32_t> ascending;
  for (const std::vector<std::int64_t>& rank : ranks) {
    // The rank in the recipe's order: by (workload, index), then the even positions
    // followed by the odd ones reversed. Gathered once, in that order, from the length
    // alone (one read at a random place instead of four): its padding, cost and
    // workload follow from it as Pad() and RecipeWorkload() make them.
    const std::size_t size = rank.size();
    sequences.resize(size);
    local.resize(size);
    sorted_workload.resize(size);
    // The lengths first, in a loop of independent loads (many cache misses in flight).
    for (std::size_t j = 0; j < size; ++j) {
      const auto i = static_cast<std::size_t>(rank[EvensThenOddsReversedSource(size, j)]);
      sequences[j].index = static_cast<std::int64_t>(i);
      sequences[j].unpadded_tokens = lengths[i];
    }
    for (std::size_t j = 0; j < size; ++j) {
      Sequence& q = sequences[j];
      q.tokens = RoundUp(q.unpadded_tokens, mb.pad_to_multiple_of);
      q.cost = mb.cost.Cost(q.tokens);
      local[j] = RecipeWorkload(q.unpadded_tokens);
      sorted_workload[EvensThenOddsReversedSource(size, j)] = local[j];
    }
    // Those positions by (workload, position) ascending, from the (workload, index)
    // order: in a run of equal workloads, the even ones come first in the recipe's order
    // (ascending), then the odd ones (descending).
    ascending.clear();
    for (std::size_t run = 0; run < size;) {
      std::size_t end = run + 1;
      while (end < size && sorted_workload[end] == sorted_workload[run]) ++end;
      for (std::size_t s = run + run % 2; s < end; s += 2) {
        ascending.push_back(static_cast<std::int32_t>(s / 2));
      }
      for (std::size_t s = end; s-- > run;) {
        if (s % 2 == 1) ascending.push_back(static_cast<std::int32_t>(size - 1 - (s - 1) / 2));
      }
      run = end;
    }
    std::vector<std::vector<std::int64_t>> parts =
        RecipeKarmarkarKarpSorted(local, ascending, count, PartSizes::kAny, RecipeOrder::kIndex);
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
    RankPlan rank_plan;
    rank_plan.micro_batches.reserve(parts.size());
    for (const std::size_t p : EvensReversedThenOdds(by_key)) {
      MicroBatch batch;
      batch.indices.reserve(parts[p].size());
      for (const std::int64_t j : parts[p]) {
        const Sequence& q = sequences[static_cast<std::size_t>(j)];
        batch.indices.push_back(q.index);
        batch.tokens += q.tokens;
        batch.unpadded_tokens += q.unpadded_tokens;
        batch.cost += q.cost;
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
