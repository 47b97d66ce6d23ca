// Checks shared by the balancer's tests.

#ifndef RLSCHED_TESTS_BALANCE_TEST_UTIL_H_
#define RLSCHED_TESTS_BALANCE_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "rlsched/balance/partition.h"
#include "rlsched/common/error.h"

namespace rlsched::balance::testing {

// A real length data set of tests/data: lengths (prompt + response tokens) and, when
// the file has a group column, groups.
struct LengthData {
  std::vector<std::int64_t> lengths;
  std::vector<std::int64_t> groups;
};

// Reads tests/data/<name> (a CSV with prompt_tokens and response_tokens columns and
// optionally group). Throws std::runtime_error when the file is missing or malformed:
// a missing data set fails the test, it never skips it.
inline LengthData ReadLengthData(const std::string& name) {
  const std::string path = std::string(RLSCHED_TEST_DATA_DIR) + "/" + name;
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::string line;
  std::getline(in, line);
  std::vector<std::string> header;
  for (std::stringstream columns(line); std::getline(columns, line, ',');) header.push_back(line);
  auto column = [&](const std::string& want) {
    const auto it = std::find(header.begin(), header.end(), want);
    return it == header.end() ? -1 : static_cast<int>(it - header.begin());
  };
  const int prompt = column("prompt_tokens");
  const int response = column("response_tokens");
  const int group = column("group");
  if (prompt < 0 || response < 0) throw std::runtime_error(path + ": no token columns");
  LengthData data;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::vector<std::int64_t> values;
    for (std::stringstream fields(line); std::getline(fields, line, ',');) {
      values.push_back(std::stoll(line));
    }
    if (static_cast<int>(values.size()) != static_cast<int>(header.size())) {
      throw std::runtime_error(path + ": a row with " + std::to_string(values.size()) + " fields");
    }
    data.lengths.push_back(values[static_cast<std::size_t>(prompt)] +
                           values[static_cast<std::size_t>(response)]);
    if (group >= 0) data.groups.push_back(values[static_cast<std::size_t>(group)]);
  }
  return data;
}

// Every index in exactly one part, parts ascending, loads and bound consistent.
inline void ExpectValidPartition(std::span<const std::int64_t> weights, std::int64_t k,
                                 bool equal_size, const Partition& p) {
  const std::int64_t n = static_cast<std::int64_t>(weights.size());
  ASSERT_EQ(p.num_parts(), k);
  ASSERT_EQ(static_cast<std::int64_t>(p.offsets.size()), k + 1);
  ASSERT_EQ(p.offsets.front(), 0);
  ASSERT_EQ(p.offsets.back(), n);
  ASSERT_EQ(static_cast<std::int64_t>(p.indices.size()), n);
  std::vector<int> seen(static_cast<std::size_t>(n), 0);
  std::int64_t total = 0, max_load = 0, min_load = INT64_MAX;
  for (std::int64_t part = 0; part < k; ++part) {
    ASSERT_LE(p.offsets[static_cast<std::size_t>(part)],
              p.offsets[static_cast<std::size_t>(part) + 1]);
    const auto items = p.part(part);
    ASSERT_TRUE(std::is_sorted(items.begin(), items.end()));
    ASSERT_TRUE(std::adjacent_find(items.begin(), items.end()) == items.end());
    std::int64_t load = 0;
    for (const std::int64_t i : items) {
      ASSERT_GE(i, 0);
      ASSERT_LT(i, n);
      ++seen[static_cast<std::size_t>(i)];
      load += weights[static_cast<std::size_t>(i)];
    }
    EXPECT_EQ(load, p.loads[static_cast<std::size_t>(part)]);
    if (equal_size) {
      const std::int64_t size = static_cast<std::int64_t>(items.size());
      EXPECT_GE(size, n / k) << "part " << part;
      EXPECT_LE(size, n / k + (n % k != 0 ? 1 : 0)) << "part " << part;
    }
    total += load;
    max_load = std::max(max_load, load);
    min_load = std::min(min_load, load);
  }
  for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(seen[static_cast<std::size_t>(i)], 1) << i;
  std::int64_t sum = 0;
  for (const std::int64_t w : weights) sum += w;
  EXPECT_EQ(total, sum);
  EXPECT_EQ(p.max_load, max_load);
  EXPECT_EQ(p.min_load, min_load);
  EXPECT_EQ(p.lower_bound, LowerBound(weights, k, equal_size));
  EXPECT_GE(p.max_load, p.lower_bound);
  // At the bound it is optimal; above it, only the exact search can prove it.
  if (p.max_load == p.lower_bound) {
    EXPECT_TRUE(p.proven_optimal);
  }
}

// The message of the rlsched::FieldError that f() throws, or "no error" (any other
// exception fails the test: invalid input raises FieldError).
template <typename F>
std::string ErrorOf(F&& f) {
  try {
    f();
  } catch (const rlsched::FieldError& e) {
    return e.what();
  }
  return "no error";
}

inline std::int64_t MaxLoadOf(std::span<const std::int64_t> weights, std::int64_t k,
                              const Assignment& assignment) {
  std::vector<std::int64_t> loads(static_cast<std::size_t>(k), 0);
  for (std::size_t i = 0; i < assignment.size(); ++i) {
    loads[static_cast<std::size_t>(assignment[i])] += weights[i];
  }
  return *std::max_element(loads.begin(), loads.end());
}

}  // namespace rlsched::balance::testing

#endif  // RLSCHED_TESTS_BALANCE_TEST_UTIL_H_
