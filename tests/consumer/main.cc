// Uses the installed rlsched::balance; exits non-zero if the partition is wrong.

#include <cstdint>
#include <cstdio>
#include <vector>

#include "rlsched/balance/partition.h"

int main() {
  const std::vector<std::int64_t> lengths = {4096, 512, 700, 3000, 2048, 128, 900, 1500};
  rlsched::balance::PartitionOptions options;
  options.num_parts = 3;
  const rlsched::balance::Partition p = rlsched::balance::PartitionItems(lengths, options);

  int failures = 0;
  auto check = [&failures](bool ok, const char* what) {
    if (!ok) {
      std::fprintf(stderr, "consumer: FAILED: %s\n", what);
      ++failures;
    }
  };
  check(p.num_parts() == 3, "three parts");
  std::vector<int> seen(lengths.size(), 0);
  std::int64_t max_load = 0;
  for (std::int64_t part = 0; part < p.num_parts(); ++part) {
    std::int64_t load = 0;
    for (const std::int64_t item : p.part(part)) {
      if (item < 0 || item >= static_cast<std::int64_t>(lengths.size())) {
        check(false, "index in range");
        continue;
      }
      ++seen[static_cast<std::size_t>(item)];
      load += lengths[static_cast<std::size_t>(item)];
    }
    check(load == p.loads[static_cast<std::size_t>(part)], "load is the sum of the part");
    if (load > max_load) max_load = load;
  }
  for (const int count : seen) check(count == 1, "every item in exactly one part");
  check(p.max_load == max_load, "max_load");
  // max(4096, ceil(12884 / 3)) = 4295.
  check(p.lower_bound == 4295, "lower bound");
  check(rlsched::balance::LowerBound(lengths, 3, false) == 4295, "LowerBound()");
  check(p.max_load >= p.lower_bound, "max load >= lower bound");
  std::printf("consumer: max load %lld, lower bound %lld, gap %.4f\n",
              static_cast<long long>(p.max_load), static_cast<long long>(p.lower_bound), p.gap);
  return failures == 0 ? 0 : 1;
}
