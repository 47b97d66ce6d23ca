// rlsched/balance/exact.h — an anytime exact search for small partitioning instances.
//
// Overview
//   ExactSearch() minimises the max part load of a k-way partition (optionally with
//   equal-size parts: every part holds floor(n/k) or ceil(n/k) items) by branch and
//   bound, starting from a given answer (the incumbent, e.g. Karmarkar-Karp's refined
//   answer) and only ever replacing it by a strictly better one. It stops when
//     - it finds an answer whose max load equals a lower bound (proven optimal),
//     - it has explored every branch (proven optimal: nothing better exists),
//     - or it runs out of budget: a node budget (deterministic) and an optional
//       time budget read from an injected clock (not proven; still never worse than
//       the incumbent).
//
//   Two complete searches take turns on one node budget (a node: an item placed in
//   a part), in rounds whose share doubles each time (the first resumes where it
//   stopped, the second restarts from the best answer so far):
//
//   1. The complete greedy tree. Items are taken heaviest first and each is tried in
//      every part, lightest part first (the first dive is the greedy answer). Parts
//      with the same load (and, in equal-size mode, the same count) are
//      interchangeable, so only one of them is tried. A branch is cut when the part's
//      load plus the item reaches the best max load so far; in equal-size mode when a
//      part can no longer reach floor(n/k) items below it, or has no slot left; and
//      when the remaining items cannot fit under the best: each part has
//      best - 1 - load of room, wasted when below the smallest remaining item (and,
//      in equal-size mode, capped by the heaviest items it still has slots for).
//      When the rest fits into the lightest part without raising the max load, the
//      branch is completed at once. Strong when n/k is large or n is small.
//   2. Bin completion under a capacity C = best - 1. Parts are filled one at a time:
//      a part takes the heaviest item left, then each set of the other items left
//      that keeps it within C and does not waste more than what is left of the total
//      room k·C - sum. Without equal sizes only maximal sets are tried (a set to
//      which another item left still fits is dominated). A packing found lowers C
//      and the search restarts; one that ends without a packing proves the best
//      optimal. Strong with a few items per part, where the greedy tree struggles to
//      find a packing at the bound (n = 40, k = 8: thousands of nodes, not millions).
//
//   The bound that stops the search early is LowerBound() raised by the pigeonhole
//   bounds: of the m·k + 1 heaviest items some part holds m + 1, so the max load is
//   at least the sum of the m + 1 lightest of them (m = 1, 2, ...).
//
//   On 100 heavy-tailed instances per n in {10, 20, 30, 40}, k in {2, 4, 8}, both
//   modes, 99.96% are proven optimal within 100 ms (benchmarks/exact_search.cc).
//
// Example
//   std::vector<std::int64_t> weights = {8, 7, 6, 5, 4};
//   rlsched::balance::Assignment start =
//       rlsched::balance::KarmarkarKarp(weights, 2, /*equal_size=*/false);  // 16 / 14
//   rlsched::balance::ExactOptions options;  // a node budget, no clock
//   rlsched::balance::ExactResult r =
//       rlsched::balance::ExactSearch(weights, 2, /*equal_size=*/false, start, options);
//   // r.max_load == 15, r.proven_optimal, r.assignment[i] is the part of item i.
//
// PartitionItems() runs this search on its answer when the instance is small
// (n <= kExactMaxItems, k <= kExactMaxParts) and PartitionOptions::exact allows it;
// ExactOptions is declared in partition.h for that reason.
//
// Thread-safety: pure (the clock, if any, is the caller's); concurrent calls are safe
// as long as the injected clocks are. Determinism: with no time limit the same input
// gives the same output (ties are broken by index); a result cut by the clock may
// differ between runs.

#ifndef RLSCHED_BALANCE_EXACT_H_
#define RLSCHED_BALANCE_EXACT_H_

#include <cstdint>
#include <span>

#include "rlsched/balance/partition.h"

namespace rlsched::balance {

struct ExactResult {
  // The best assignment found: assignment[i] in [0, k). Never worse than the
  // incumbent; the incumbent itself when nothing better was found.
  Assignment assignment;
  std::int64_t max_load = 0;
  // A bound on the optimum's max load: max_load when proven_optimal, else the root
  // bound of the search (>= LowerBound()).
  std::int64_t lower_bound = 0;
  // No partition (with the same equal_size constraint) has a smaller max load: the
  // answer reached `lower_bound`, or the search explored every branch.
  bool proven_optimal = false;
  // Nodes explored (items tried in a part). At most options.max_nodes.
  std::int64_t nodes = 0;
  // The search found an answer strictly better than the incumbent.
  bool improved = false;
};

// Searches for a partition of `weights` into num_parts parts with a smaller max load
// than `incumbent`'s, as described in the file comment. An empty `incumbent` stands
// for greedy LPT's answer (GreedyLpt()).
// Preconditions (else std::invalid_argument naming the field and the bound):
//   as PartitionItems() (1 <= num_parts <= kMaxParts, weights.size() <= kMaxItems,
//   weights >= 0, sum fits in int64); `incumbent` empty or one entry per weight in
//   [0, num_parts), and with equal_size every part holding floor(n/k) or ceil(n/k)
//   items; options.max_nodes >= 0 (0: no search, the incumbent is returned, proven
//   only when it meets the bound); when options.time_limit > 0, options.now set.
// Complexity: O(n log n) to sort, then O(n + k) per node, over at most
//   options.max_nodes nodes (the search is exponential in n in the worst case: the
//   budget is what bounds it). Memory O(n + k), and O(k·n) for phase 2, which runs
//   only when n <= 1,024 (it recurses once per item and part).
// The clock is read once at the start and then every 4,096 nodes.
ExactResult ExactSearch(std::span<const std::int64_t> weights, std::int64_t num_parts,
                        PartSizes sizes, const Assignment& incumbent, const ExactOptions& options);

// The same with `equal_size` for PartSizesFor(equal_size).
inline ExactResult ExactSearch(std::span<const std::int64_t> weights, std::int64_t num_parts,
                               bool equal_size, const Assignment& incumbent,
                               const ExactOptions& options) {
  return ExactSearch(weights, num_parts, PartSizesFor(equal_size), incumbent, options);
}

}  // namespace rlsched::balance

#endif  // RLSCHED_BALANCE_EXACT_H_
