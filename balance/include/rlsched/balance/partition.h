// rlsched/balance/partition.h — k-way number partitioning of integer weights.
//
// Overview
//   Splits n non-negative integer weights into k parts so that the heaviest part is
//   as light as possible (multiway number partitioning, makespan objective). Used to
//   spread the sequences of a training batch across data-parallel ranks.
//
//   Algorithms:
//   - Karmarkar-Karp, the largest differencing method (LDM), generalised to k parts.
//     A partial solution is a tuple of k part sums; the two tuples with the largest
//     spread (max - min) are combined by pairing the heaviest part of one with the
//     lightest of the other. Tuples are stored sparsely (only non-empty parts), and
//     item lists are spliced in O(1), so memory is O(n + k).
//     In equal-size mode the items are sorted and cut into chunks of k consecutive
//     items (one item per part), so every part ends with floor(n/k) or ceil(n/k).
//   - Greedy LPT: largest item first onto the lightest part that may still take an
//     item. A baseline, and a fallback: `PartitionItems()` keeps it when it beats KK.
//   - Refinement: a local search that moves one item, or swaps two, between the
//     heaviest part and another part whenever that lowers the heavier of the two.
//     Each step strictly lowers the sum of squared loads, so it never makes the
//     result worse and always terminates; the count constraint is kept.
//   - Exact search (exact.h), on small instances only (n <= kExactMaxItems = 64 and
//     k <= kExactMaxParts = 16) when the refined answer is above the lower bound: a
//     branch and bound under a node budget (PartitionOptions::exact) that improves
//     the answer and usually proves it optimal.
//
//   Every result carries its loads, the lower bound, the gap to it, and whether it
//   is proven optimal (at the bound, or the exact search explored every branch).
//
// Example
//   std::vector<std::int64_t> lengths = {4096, 512, 700, 3000, 2048, 128};
//   rlsched::balance::PartitionOptions options;
//   options.num_parts = 2;
//   rlsched::balance::Partition p = rlsched::balance::PartitionItems(lengths, options);
//   for (std::int64_t part = 0; part < p.num_parts(); ++part) {
//     for (std::int64_t item : p.part(part)) { /* item goes to rank `part` */ }
//   }
//   // p.max_load, p.lower_bound, p.gap, p.proven_optimal
//
// Thread-safety: every function here is pure (no shared state); concurrent calls are
// safe. Determinism: the same input gives the same output; ties are broken by index
// (unless a wall-clock budget, off by default, cuts the refinement or the search).

#ifndef RLSCHED_BALANCE_PARTITION_H_
#define RLSCHED_BALANCE_PARTITION_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace rlsched::balance {

// Limits on any input (also enforced by the wire contract).
inline constexpr std::int64_t kMaxParts = std::int64_t{1} << 20;
inline constexpr std::int64_t kMaxItems = 100'000'000;
inline constexpr std::int64_t kMaxLength = std::int64_t{1} << 31;

enum class Algorithm {
  kKarmarkarKarp,  // largest differencing method (+ LPT fallback)
  kGreedy,         // longest processing time first
};

// A monotonic clock supplied by the caller; the library reads no clock itself.
using NowFn = std::function<std::chrono::nanoseconds()>;

struct RefineOptions {
  // Off: the constructive algorithm's answer is returned as it is.
  bool enabled = true;
  // Maximum number of improving steps (moves or swaps). Counted, so deterministic.
  std::int64_t max_iterations = 100'000;
  // Optional wall-clock budget; only used when > 0, and then `now` must be set.
  // A result cut by the clock may differ between runs; the iteration budget does not.
  std::chrono::nanoseconds time_limit{0};
  NowFn now;
};

// Budget of the exact search (ExactSearch() in exact.h).
struct ExactOptions {
  // Maximum number of nodes (an item placed in a part); 0 disables the search.
  // Counted, so deterministic. On instances within kExactMaxItems × kExactMaxParts
  // the default costs at most ~30 ms (measured on adversarial inputs, -O2, a slow
  // machine) and well under 1 ms on most heavy-tailed ones; it proves 99.7% of
  // heavy-tailed instances with n <= 40, k <= 8 optimal.
  std::int64_t max_nodes = 500'000;
  // Optional wall-clock budget; only used when > 0, and then `now` must be set.
  // A result cut by the clock may differ between runs; the node budget does not.
  std::chrono::nanoseconds time_limit{0};
  NowFn now;
};

// PartitionItems() runs the exact search only on instances this small (and only
// when the refined answer is above the lower bound): beyond them a search within the
// default budget rarely ends proven, and KK + refinement is already within a small
// fraction of a percent of the bound.
inline constexpr std::int64_t kExactMaxItems = 64;
inline constexpr std::int64_t kExactMaxParts = 16;

struct PartitionOptions {
  std::int64_t num_parts = 1;  // k, in [1, kMaxParts]
  // Every part holds floor(n/k) or ceil(n/k) items (exactly n/k when k divides n).
  bool equal_size = false;
  Algorithm algorithm = Algorithm::kKarmarkarKarp;
  RefineOptions refine;
  // Run on the refined answer when n <= kExactMaxItems and k <= kExactMaxParts.
  ExactOptions exact;
};

// The part of each item: assignment[i] in [0, k).
using Assignment = std::vector<std::int32_t>;

// How many items a part may hold: any number, or floor(n/k) or ceil(n/k) (equal
// size, as PartitionOptions::equal_size). The functions below take it; each also has
// an overload taking `bool equal_size` (true for kEqual).
enum class PartSizes { kAny, kEqual };

constexpr PartSizes PartSizesFor(bool equal_size) {
  return equal_size ? PartSizes::kEqual : PartSizes::kAny;
}

// A partition in compressed form: part p holds indices[offsets[p] .. offsets[p+1]),
// ascending. Memory O(n + k).
struct Partition {
  std::vector<std::int64_t> offsets;  // k + 1 entries
  std::vector<std::int64_t> indices;  // n entries
  std::vector<std::int64_t> loads;    // k entries: the sum of the part's weights
  std::int64_t max_load = 0;
  std::int64_t min_load = 0;
  std::int64_t lower_bound = 0;  // no partition can have a smaller max_load
  double gap = 0.0;              // max_load / lower_bound - 1 (0 when the bound is 0)
  // No partition has a smaller max_load: max_load == lower_bound, or (from
  // PartitionItems()) the exact search explored every branch.
  bool proven_optimal = false;
  std::int64_t refine_steps = 0;  // improving steps the refinement made
  std::int64_t exact_nodes = 0;   // nodes the exact search explored (0: not run)

  std::int64_t num_parts() const { return static_cast<std::int64_t>(loads.size()); }
  std::span<const std::int64_t> part(std::int64_t p) const {
    return std::span<const std::int64_t>(indices).subspan(
        static_cast<std::size_t>(offsets[static_cast<std::size_t>(p)]),
        static_cast<std::size_t>(offsets[static_cast<std::size_t>(p) + 1] -
                                 offsets[static_cast<std::size_t>(p)]));
  }
};

// Partitions `weights` into options.num_parts parts with the chosen algorithm, then
// refines. With kKarmarkarKarp the LPT answer is also computed and kept if better, so
// the result is never worse than LPT's. Then, when n <= kExactMaxItems,
// k <= kExactMaxParts, exact.max_nodes > 0 and the max load is above the lower bound,
// ExactSearch() improves the answer within options.exact and sets proven_optimal
// when it explored every branch (even when max_load > lower_bound).
// Preconditions (else std::invalid_argument naming the field and the bound):
//   1 <= num_parts <= kMaxParts; weights.size() <= kMaxItems; every weight >= 0;
//   the sum of the weights fits in int64; refine.max_iterations >= 0,
//   exact.max_nodes >= 0, and a clock with either time limit. n < k is allowed (some
//   parts stay empty; in equal-size mode every part then holds 0 or 1 item).
// Complexity: O(n log n + n log k) for typical inputs (KK tuples that fill all k parts
//   cost O(k log k) per merge); refinement O(steps · (n/k) ) typical; the exact
//   search O(nodes · (n + k)) on small instances. Memory O(n + k).
Partition PartitionItems(std::span<const std::int64_t> weights, const PartitionOptions& options);

// The lower bound on the max load of any partition:
//   max(max weight, ceil(sum / k)), and with PartSizes::kEqual and c = floor(n/k) >= 1
//   also max weight + the sum of the c - 1 smallest other weights.
// Same preconditions as PartitionItems(). O(n) (a selection for the c - 1 smallest).
std::int64_t LowerBound(std::span<const std::int64_t> weights, std::int64_t num_parts,
                        PartSizes sizes);

// The constructive algorithms alone, without refinement or fallback.
// Same preconditions as PartitionItems(); complexity as stated there.
Assignment KarmarkarKarp(std::span<const std::int64_t> weights, std::int64_t num_parts,
                         PartSizes sizes);
Assignment GreedyLpt(std::span<const std::int64_t> weights, std::int64_t num_parts,
                     PartSizes sizes);

// What a framework does when it does not balance: part p takes the p-th contiguous
// run of floor(n/k) or ceil(n/k) items (the longer runs first).
Assignment ContiguousSplit(std::int64_t num_items, std::int64_t num_parts);

// Improves `assignment` in place by the local search described above; returns the
// number of improving steps. With PartSizes::kEqual every part's count stays within
// {floor(n/k), ceil(n/k)}; with kAny items move freely. Stops at options.max_iterations, at the
// time limit, when no improving step exists, or when the max load reaches `lower_bound` (pass 0 if
// unknown). Preconditions: as PartitionItems(), and `assignment` is a valid assignment for them.
std::int64_t Refine(std::span<const std::int64_t> weights, std::int64_t num_parts, PartSizes sizes,
                    const RefineOptions& options, std::int64_t lower_bound, Assignment& assignment);

// Builds the compressed form, loads, bound and gap of `assignment`; proven_optimal is
// max_load == lower_bound (it knows of no search), refine_steps and exact_nodes 0.
// Preconditions: as PartitionItems(); assignment.size() == weights.size(), entries in [0, k).
Partition MakePartition(std::span<const std::int64_t> weights, std::int64_t num_parts,
                        PartSizes sizes, const Assignment& assignment);

// The same with `equal_size` for PartSizesFor(equal_size).
inline std::int64_t LowerBound(std::span<const std::int64_t> weights, std::int64_t num_parts,
                               bool equal_size) {
  return LowerBound(weights, num_parts, PartSizesFor(equal_size));
}
inline Assignment KarmarkarKarp(std::span<const std::int64_t> weights, std::int64_t num_parts,
                                bool equal_size) {
  return KarmarkarKarp(weights, num_parts, PartSizesFor(equal_size));
}
inline Assignment GreedyLpt(std::span<const std::int64_t> weights, std::int64_t num_parts,
                            bool equal_size) {
  return GreedyLpt(weights, num_parts, PartSizesFor(equal_size));
}
inline std::int64_t Refine(std::span<const std::int64_t> weights, std::int64_t num_parts,
                           bool equal_size, const RefineOptions& options, std::int64_t lower_bound,
                           Assignment& assignment) {
  return Refine(weights, num_parts, PartSizesFor(equal_size), options, lower_bound, assignment);
}
inline Partition MakePartition(std::span<const std::int64_t> weights, std::int64_t num_parts,
                               bool equal_size, const Assignment& assignment) {
  return MakePartition(weights, num_parts, PartSizesFor(equal_size), assignment);
}

}  // namespace rlsched::balance

#endif  // RLSCHED_BALANCE_PARTITION_H_
