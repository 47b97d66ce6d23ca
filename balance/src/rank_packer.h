// The long sequences packed onto few ranks (private header), a candidate rank
// assignment of the step planner (plan_step.cc) for pipelines.
//
// With a pipeline, a rank pays (p − 1) times its heaviest micro-batch, which holds
// its largest sequence: spreading the longest sequences one per rank makes every rank
// pay for one. RankPacker packs instead: units by largest sequence, longest first, each
// long unit into the first rank that still has room (first fit), where a rank led by a
// sequence of cost a has room for cost up to min(T − (p − 1)·a, T·m / (m + p − 1)),
// less once its sequences must share micro-batches (see `high_` in rank_packer.cc).
// Short units (largest sequence below T / (m + p − 1), which would not be their rank's
// heaviest micro-batch) then go to the rank with the most room (worst fit): spread out,
// they share micro-batches least. With equal counts (every rank floor(U / R) units, or
// one more; groups are then long or short units too) the ranks holding long units must
// also take their quota of others: their room for long units keeps a reserve per slot
// still to fill (the mean cost of the cheapest short units that would fill them), they
// are filled with those cheapest units (worst fit), then each swaps its fillers,
// cheapest first, for the costliest free short unit that still fits its room (using it
// up takes cost off the other ranks); the other short units go worst fit to every rank
// with a slot left. T is the smallest budget (bisection, to 1e-3) in [lo, hi] that
// fits every unit on the ranks.
//
// A max segment tree over the ranks' room finds the first rank with room for a unit,
// and the rank with the most, in O(log ranks); a Fenwick tree over the short units by
// cost finds the costliest free one under a budget in O(log units).

#ifndef RLSCHED_BALANCE_SRC_RANK_PACKER_H_
#define RLSCHED_BALANCE_SRC_RANK_PACKER_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "fenwick_tree.h"
#include "micro_batch_internal.h"
#include "rlsched/balance/partition.h"
#include "segment_tree.h"

namespace rlsched::balance::internal {

class RankPacker {
 public:
  // `units` (kept by reference: it must outlive the packer) onto `num_ranks` ranks
  // for a pipeline of `stages` stages and m micro-batches per rank; with
  // PartSizes::kEqual every rank holds floor(U / R) or ceil(U / R) of the U units.
  // Preconditions: num_ranks >= 1, stages >= 1, m >= 1.
  RankPacker(const Units& units, std::int64_t num_ranks, std::int64_t stages, std::int64_t m,
             PartSizes unit_counts);

  // Each rank's sequences (ascending) packed at the smallest budget T in [lo, hi]
  // (bisection to 1e-3) that fits every unit (see the file comment); empty when even
  // `hi` does not. O(units · (log units + log ranks) · log((hi − lo) / (1e-3·hi))).
  std::vector<std::vector<std::int64_t>> Pack(double lo, double hi);

 private:
  // Does every unit fit at budget t? Leaves the packing in rank_of_.
  bool Fits(double t) { return equal_counts_ ? FitsEqual(t) : FitsAny(t); }
  bool FitsAny(double t);
  bool FitsEqual(double t);
  // FitsEqual's steps. The long units placed and the fillers chosen (the cheapest short
  // units, one per slot the long ranks leave); the ranks opened, or nullopt when they do
  // not fit.
  std::optional<std::size_t> ChooseFillers(double t, std::size_t end);
  // The fillers, most costly first, worst fit onto the long ranks short of the quota.
  bool PlaceFillers(double t, std::size_t opened);
  // Room left on a long rank: its fillers swapped for costlier short units that fit.
  void UpgradeFillers(double t, std::size_t opened);
  // The other short units (of order_ from `end`) worst fit onto every rank.
  bool PlaceShort(double t, std::size_t end, std::size_t opened);

  // Long units first fit (the first `end` of order_); returns the ranks opened, or
  // num_ranks + 1 when some unit fits nowhere.
  std::size_t PlaceLong(double t, std::size_t end);

  // Rank r holds its quota (equal counts only).
  bool Full(std::size_t r) const;
  // The cost rank r can still take at budget t.
  double Spare(std::size_t r, double t) const;
  // Spare(), less the reserve; -1 when full.
  double Room(std::size_t r, double t) const;
  // Rank r starts empty.
  void Open(std::size_t r);
  // Adds unit u to rank r (without updating the tree of room).
  void Add(std::size_t r, std::size_t u);

  // Equal counts: short unit u is placed (take) or free again, in the Fenwick tree.
  void Mark(std::size_t u, bool take);
  // The position in pool_ of the costliest free unit at or below `cap`, or
  // pool_.size() when none.
  std::size_t Costliest(double cap) const;
  // Rank r holds `list` again, most costly first.
  void Rebuild(std::size_t r, std::vector<std::size_t> list);
  bool IsShort(std::size_t u) const;

  const Units& units_;
  const std::size_t n_;  // units
  const std::size_t num_ranks_;
  const double p1_;  // p − 1
  const std::int64_t m_;
  const double md_;  // m
  const bool equal_counts_;
  // Units by largest sequence, then cost, descending (ties: index).
  std::vector<std::size_t> order_;
  // The ranks' room; unopened ranks have room -1 until opened.
  MaxSegmentTree room_;
  std::vector<std::size_t> rank_of_;  // by unit
  // Every unit is one sequence: the heaviest micro-batch is then also counted per
  // sequence (see high_).
  bool singles_ = false;
  // Per rank: cost, sequences (in the order added: descending), and the heaviest
  // micro-batch at least: its largest sequence and, at k·m + 1 sequences, the k + 1
  // last added together (k + 1 of the k·m + 1 largest share a micro-batch). Counted
  // per sequence only when every unit is one sequence.
  std::vector<double> cost_, high_, tail_;
  std::vector<std::vector<double>> held_;
  // Equal counts: `quota_` units per rank, `extra_` ranks one more (`extra_used_` so
  // far); a rank that holds long units keeps `reserve_` per slot it must still fill.
  std::size_t quota_ = 0;
  std::size_t extra_ = 0;
  std::size_t extra_used_ = 0;
  double reserve_ = 0.0;
  // By rank, its units in the order added (equal counts only).
  std::vector<std::vector<std::size_t>> members_;
  // Equal counts. The cheapest units first (ties: index), for the fillers.
  std::vector<std::size_t> by_cost_;
  std::vector<char> taken_;            // by unit: placed as a filler
  std::vector<std::size_t> pool_;      // the short units, cheapest first
  std::vector<std::size_t> position_;  // by unit: its place in the pool
  FenwickTree free_;                   // by place in the pool: 1 while not placed
  std::vector<std::size_t> fillers_;
  double short_below_ = 0.0;  // FitsEqual()'s threshold of short units
};

// RankPacker(units, num_ranks, stages, m, unit_counts).Pack(lo, hi).
std::vector<std::vector<std::int64_t>> PackedRanks(const Units& units, std::int64_t num_ranks,
                                                   std::int64_t stages, std::int64_t m, double lo,
                                                   double hi, PartSizes unit_counts);

}  // namespace rlsched::balance::internal

#endif  // RLSCHED_BALANCE_SRC_RANK_PACKER_H_
