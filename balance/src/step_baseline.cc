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
#include <limits>
#include <numeric>
#include <span>
#include <utility>
#include <vector>

#include "micro_batch_internal.h"
#include "recipe_partition.h"
#include "rlsched/balance/plan_step.h"
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

// One sequence of a rank, by its position in the recipe's order.
struct Sequence {
  std::int64_t index;
  std::int64_t tokens;
  std::int64_t unpadded_tokens;
  std::int64_t cost;
};

}  // namespace

StepPlan RecipePlan(const Padded& padded, const StepOptions& options, RecipeDetail detail) {
  // The sequences by (workload, index) ascending. The workload grows strictly with the
  // length (lengths >= 0), so that is the order by (length, index): sorted on the
  // lengths (a narrower key, fewer radix passes), which come back in that order, so
  // nothing below reads the batch at random places.
  std::vector<std::int64_t> sorted_length;
  const std::vector<std::int32_t> ascending = RecipeAscending(padded.lengths, &sorted_length);
  return RecipePlan(padded, options, ascending, sorted_length, detail);
}

namespace {

// The batch split to ranks as the recipe splits it: every rank's sequences (index, when
// the micro-batches are listed, and length) gathered by (workload, index), and the
// micro-batch count every rank runs.
struct RecipeSplit {
  std::vector<std::size_t> offsets;       // rank r: [offsets[r], offsets[r + 1])
  std::vector<std::int32_t> rank_index;   // empty unless the micro-batches are listed
  std::vector<std::int64_t> rank_length;  // unpadded
  std::int64_t count = 0;
};

RecipeSplit SplitAsRecipe(const Padded& padded, const StepOptions& options,
                          std::span<const std::int32_t> ascending,
                          std::span<const std::int64_t> sorted_length, bool lists) {
  const MicroBatchOptions& mb = options.micro_batch;
  const std::size_t n = padded.lengths.size();
  std::vector<std::int64_t> sorted_workload(n);
  for (std::size_t p = 0; p < n; ++p) sorted_workload[p] = RecipeWorkload(sorted_length[p]);
  // Sequences to ranks. A rank's positions in that order, ascending, are its sequences
  // by (workload, index): verl sorts a rank's sequences so (stably, from index order)
  // before it reorders them.
  const auto num_ranks = static_cast<std::size_t>(options.num_ranks);
  const RecipePartition split = RecipeKarmarkarKarpPositions(sorted_workload, ascending,
                                                             options.num_ranks, PartSizes::kEqual);
  RecipeSplit out;
  out.offsets.assign(num_ranks + 1, 0);
  for (std::size_t r = 0; r < num_ranks; ++r) {
    out.offsets[r + 1] = out.offsets[r] + static_cast<std::size_t>(split.counts[r]);
  }
  // Every rank's sequences, gathered in one pass in that order (a write stream per rank
  // instead of a read at a random place per sequence), in the workloads' storage.
  out.rank_index.resize(lists ? n : 0);
  out.rank_length = std::move(sorted_workload);
  std::vector<std::int64_t> rank_tokens(num_ranks, 0);  // the lengths, unpadded, as verl counts
  std::vector<std::size_t> cursor(out.offsets.begin(), out.offsets.end() - 1);
  for (std::size_t p = 0; p < n; ++p) {
    const auto r = static_cast<std::size_t>(split.part_of_position[p]);
    const std::size_t at = cursor[r]++;
    if (lists) out.rank_index[at] = ascending[p];
    out.rank_length[at] = sorted_length[p];
    rank_tokens[r] += sorted_length[p];
  }
  for (std::size_t r = 0; r < num_ranks; ++r) {
    const std::int64_t wanted = std::min(static_cast<std::int64_t>(split.counts[r]),
                                         CeilDiv(rank_tokens[r], mb.max_tokens_per_micro_batch));
    out.count = std::max(out.count, std::max(mb.min_micro_batches, wanted));
  }
  out.count = RoundUp(out.count, mb.micro_batches_multiple_of);
  return out;
}

// One rank at a time into the recipe's micro-batches (the buffers reused from rank to
// rank): its order, its split, and either its figures or its micro-batches' lists.
class RecipeRank {
 public:
  RecipeRank(const MicroBatchOptions& mb, std::int64_t count, bool lists)
      : mb_(mb),
        count_(count),
        num_batches_(static_cast<std::size_t>(count)),
        lists_(lists),
        // No padding and a token's cost is the token (Pad()'s fast case): a sequence's
        // tokens and cost are its length.
        plain_(mb.pad_to_multiple_of == 1 && mb.cost.kind() == CostModel::Kind::kTokens),
        by_key_(num_batches_),
        slot_of_(num_batches_) {}

  // The rank of `lengths` (and `indices`, when listed), by (workload, index), into
  // micro-batches: its figures added to `plan`, or its RankPlan appended.
  void Plan(std::span<const std::int32_t> indices, std::span<const std::int64_t> lengths,
            StepPlan& plan) {
    Order(indices, lengths);
    // rank_workload_ is its workloads in rank_ascending_'s order.
    const RecipePartition parts =
        RecipeKarmarkarKarpPositions(rank_workload_, rank_ascending_, count_, PartSizes::kAny);
    if (lists_) {
      plan.ranks.push_back(MicroBatches(parts, plan));
      const RankPlan& rank = plan.ranks.back();
      plan.predicted_step_time = std::max(plan.predicted_step_time, rank.time);
    } else {
      AddFigures(lengths, parts, plan);
    }
  }

 private:
  // The rank in the recipe's order: by (workload, index), then the even positions
  // followed by the odd ones reversed; its padding, cost and workload follow from the
  // length as Pad() and RecipeWorkload() make them.
  void Order(std::span<const std::int32_t> indices, std::span<const std::int64_t> lengths) {
    const std::size_t size = lengths.size();
    rank_workload_.resize(size);
    if (!lists_) {
      for (std::size_t s = 0; s < size; ++s) rank_workload_[s] = RecipeWorkload(lengths[s]);
    }
    sequences_.resize(lists_ ? size : 0);
    for (std::size_t s = 0; s < (lists_ ? size : 0); ++s) {
      // Source position s goes to s / 2 (even) or size − 1 − (s − 1) / 2 (odd).
      Sequence& q = sequences_[s % 2 == 0 ? s / 2 : size - 1 - (s - 1) / 2];
      q.index = indices[s];
      q.unpadded_tokens = lengths[s];
      q.tokens = plain_ ? q.unpadded_tokens : RoundUp(q.unpadded_tokens, mb_.pad_to_multiple_of);
      q.cost = plain_ ? q.tokens : mb_.cost.Cost(q.tokens);
      rank_workload_[s] = RecipeWorkload(q.unpadded_tokens);
    }
    // Those positions by (workload, position) ascending, from the (workload, index)
    // order: in a run of equal workloads, the even ones come first in the recipe's order
    // (ascending), then the odd ones (descending).
    rank_ascending_.clear();
    for (std::size_t run = 0; run < size;) {
      std::size_t end = run + 1;
      while (end < size && rank_workload_[end] == rank_workload_[run]) ++end;
      for (std::size_t s = run + run % 2; s < end; s += 2) {
        rank_ascending_.push_back(static_cast<std::int32_t>(s / 2));
      }
      for (std::size_t s = end; s-- > run;) {
        if (s % 2 == 1) {
          rank_ascending_.push_back(static_cast<std::int32_t>(size - 1 - (s - 1) / 2));
        }
      }
      run = end;
    }
  }

  // The figures: each micro-batch's tokens and cost from its sequences' lengths. The t-th
  // position of rank_ascending has the t-th workload, so the t-th length (equal
  // workloads, equal lengths).
  void AddFigures(std::span<const std::int64_t> lengths, const RecipePartition& parts,
                  StepPlan& plan) {
    const std::int64_t cap = mb_.max_tokens_per_micro_batch;
    batch_tokens_.assign(num_batches_, 0);
    batch_costs_.assign(num_batches_, 0);
    for (std::size_t t = 0; t < lengths.size(); ++t) {
      const auto p = static_cast<std::size_t>(parts.part_of_position[t]);
      const std::int64_t tokens = plain_ ? lengths[t] : RoundUp(lengths[t], mb_.pad_to_multiple_of);
      batch_tokens_[p] += tokens;
      batch_costs_[p] += plain_ ? tokens : mb_.cost.Cost(tokens);
    }
    for (std::size_t p = 0; p < num_batches_; ++p) {
      plan.cap_violations += batch_tokens_[p] > cap ? 1 : 0;
      plan.empty_micro_batches += parts.counts[p] == 0 ? 1 : 0;
    }
    plan.empty_ranks += lengths.empty() ? 1 : 0;
    plan.predicted_step_time = std::max(plan.predicted_step_time, RankTime(batch_costs_, mb_));
  }

  // Each part's place: by (sum, first item) descending, stably (an empty part's first
  // item counts as 0), then the even positions reversed followed by the odd ones.
  void PlaceParts(const RecipePartition& parts) {
    const std::size_t size = sequences_.size();
    part_of_.resize(size);
    first_.assign(num_batches_, std::numeric_limits<std::int64_t>::max());
    for (std::size_t t = 0; t < size; ++t) {
      const auto j = static_cast<std::size_t>(rank_ascending_[t]);
      const std::int32_t p = parts.part_of_position[t];
      part_of_[j] = p;
      std::int64_t& f = first_[static_cast<std::size_t>(p)];
      f = std::min(f, static_cast<std::int64_t>(j));
    }
    for (std::size_t p = 0; p < num_batches_; ++p) {
      if (parts.counts[p] == 0) first_[p] = 0;
    }
    std::iota(by_key_.begin(), by_key_.end(), std::size_t{0});
    std::stable_sort(by_key_.begin(), by_key_.end(), [&](std::size_t a, std::size_t b) {
      return std::pair(parts.sums[a], first_[a]) > std::pair(parts.sums[b], first_[b]);
    });
    const std::vector<std::size_t> order = EvensReversedThenOdds(by_key_);
    for (std::size_t slot = 0; slot < num_batches_; ++slot) slot_of_[order[slot]] = slot;
  }

  // The rank's micro-batches, each's sequences in the rank's order, then by index.
  RankPlan MicroBatches(const RecipePartition& parts, StepPlan& plan) {
    PlaceParts(parts);
    RankPlan rank_plan;
    rank_plan.micro_batches.resize(num_batches_);
    for (std::size_t p = 0; p < num_batches_; ++p) {
      rank_plan.micro_batches[slot_of_[p]].indices.reserve(
          static_cast<std::size_t>(parts.counts[p]));
    }
    for (std::size_t j = 0; j < sequences_.size(); ++j) {
      const Sequence& q = sequences_[j];
      MicroBatch& batch = rank_plan.micro_batches[slot_of_[static_cast<std::size_t>(part_of_[j])]];
      batch.indices.push_back(q.index);
      batch.tokens += q.tokens;
      batch.unpadded_tokens += q.unpadded_tokens;
      batch.cost += q.cost;
    }
    for (MicroBatch& batch : rank_plan.micro_batches) {
      std::sort(batch.indices.begin(), batch.indices.end());
      plan.cap_violations += batch.tokens > mb_.max_tokens_per_micro_batch ? 1 : 0;
      rank_plan.sequences += static_cast<std::int64_t>(batch.indices.size());
      rank_plan.tokens += batch.tokens;
      rank_plan.unpadded_tokens += batch.unpadded_tokens;
      rank_plan.cost += batch.cost;
    }
    rank_plan.time = RankTime(rank_plan.micro_batches, mb_);
    return rank_plan;
  }

  const MicroBatchOptions& mb_;
  const std::int64_t count_;
  const std::size_t num_batches_;
  const bool lists_;
  const bool plain_;
  std::vector<Sequence> sequences_;          // by position in the rank's order
  std::vector<std::int64_t> rank_workload_;  // by (workload, index) ascending
  std::vector<std::int32_t> rank_ascending_;
  std::vector<std::int32_t> part_of_;       // by position in the rank's order
  std::vector<std::int64_t> first_;         // by part: its first position in the rank's order
  std::vector<std::int64_t> batch_tokens_;  // by part, for the figures alone
  std::vector<std::int64_t> batch_costs_;
  std::vector<std::size_t> by_key_;
  std::vector<std::size_t> slot_of_;
};

}  // namespace

StepPlan RecipePlan(const Padded& padded, const StepOptions& options,
                    std::span<const std::int32_t> ascending,
                    std::span<const std::int64_t> sorted_length, RecipeDetail detail) {
  const bool lists = detail == RecipeDetail::kMicroBatches;
  const RecipeSplit split = SplitAsRecipe(padded, options, ascending, sorted_length, lists);
  StepPlan plan;
  plan.num_micro_batches = split.count;
  RecipeRank rank(options.micro_batch, split.count, lists);
  const std::span<const std::int64_t> lengths = split.rank_length;
  const std::span<const std::int32_t> indices = split.rank_index;
  for (std::size_t r = 0; r + 1 < split.offsets.size(); ++r) {
    const std::size_t begin = split.offsets[r];
    const std::size_t size = split.offsets[r + 1] - begin;
    rank.Plan(lists ? indices.subspan(begin, size) : std::span<const std::int32_t>{},
              lengths.subspan(begin, size), plan);
  }
  if (lists) plan.empty_micro_batches = EmptyMicroBatches(plan);
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
