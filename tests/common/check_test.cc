#include "rlsched/common/check.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>

#include "rlsched/common/error.h"

namespace rlsched {
namespace {

// The message a check throws, or "" when it passes.
template <class F>
std::string ErrorOf(F&& check) {
  try {
    check();
  } catch (const FieldError& e) {
    return e.what();
  }
  return "";
}

TEST(CheckTest, EachIntegerBoundHasOneWording) {
  EXPECT_EQ(ErrorOf([] { CheckAtLeast("n", 0, 1); }), "n: must be >= 1, got 0");
  EXPECT_EQ(ErrorOf([] { CheckAtMost("n", 9, 8); }), "n: must be <= 8, got 9");
  EXPECT_EQ(ErrorOf([] { CheckInRange("n", -1, 0, 65536); }), "n: must be in [0, 65536], got -1");
  EXPECT_EQ(ErrorOf([] { CheckBetween("n", 0, 1, 5); }), "n: must be >= 1, got 0");
  EXPECT_EQ(ErrorOf([] { CheckBetween("n", 6, 1, 5); }), "n: must be <= 5, got 6");
  EXPECT_EQ(ErrorOf([] { CheckBelow("rank", 4, 0, 4); }), "rank: must be in [0, 4), got 4");
  EXPECT_EQ(ErrorOf([] { CheckDivides("tp", 3, "heads", 32); }),
            "tp: must divide heads (32), got 3");
  EXPECT_EQ(ErrorOf([] { CheckMultipleOf("first", 3, "vpp", 2); }),
            "first: must be a multiple of vpp (2), got 3");
}

TEST(CheckTest, NamedLimitsNotesAndIndexedFields) {
  const std::int64_t big = std::int64_t{1} << 31;
  EXPECT_EQ(ErrorOf([&] {
              CheckAtMost({"lengths", 3}, big + 1, {big, "2^31"});
            }),
            "lengths[3]: must be <= 2^31, got 2147483649");
  EXPECT_EQ(ErrorOf([] { CheckInRange("tp", -1, 0, 65536, "(0 means 1)"); }),
            "tp: must be in [0, 65536] (0 means 1), got -1");
  EXPECT_EQ(ErrorOf([] {
              CheckBelow({"transfers", 2, ".src_param"}, 7, 0, 7);
            }),
            "transfers[2].src_param: must be in [0, 7), got 7");
  EXPECT_EQ(ErrorOf([] { ZeroMeansOne("pp", -1, std::numeric_limits<std::int64_t>::max()); }),
            "pp: must be >= 0 (0 means 1), got -1");
  EXPECT_EQ(ZeroMeansOne("pp", 0, 8), 1);
  EXPECT_EQ(ZeroMeansOne("pp", 8, 8), 8);
}

TEST(CheckTest, RealBoundsFailOnNanAndInfinities) {
  const double nan = std::nan("");
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(ErrorOf([&] { CheckFinite("t", inf); }), "t: must be finite, got inf");
  EXPECT_EQ(ErrorOf([] { CheckRealAtLeast("s", 0.0, 0.0, End::kOpen); }), "s: must be > 0, got 0");
  EXPECT_EQ(ErrorOf([&] { CheckRealAtLeast("s", nan, 0.0); }), "s: must be >= 0, got nan");
  EXPECT_EQ(ErrorOf([] { CheckRealAtMost("s", 2e9, 1e9); }),
            "s: must be <= 1000000000, got 2000000000");
  EXPECT_EQ(ErrorOf([&] { CheckReal("s", nan, 0, End::kClosed, 1); }),
            "s: must be finite, got nan");
  EXPECT_EQ(ErrorOf([] { CheckRealInRange("q", 0.0, 0, End::kOpen, 1, End::kClosed); }),
            "q: must be in (0, 1], got 0");
  EXPECT_EQ(ErrorOf([] { CheckRealInRange("c", 1.5, 0, End::kClosed, 1, End::kClosed); }),
            "c: must be in [0, 1], got 1.5");
  EXPECT_EQ(ErrorOf([&] { CheckFiniteAtLeast("c", inf, 0.0); }),
            "c: must be finite and >= 0, got inf");
  EXPECT_EQ(ErrorOf([] {
              CheckFiniteInRange("b", -1, 0, End::kClosed, 1e6, End::kClosed, "GB/s (0 means 50)");
            }),
            "b: must be finite and in [0, 1000000] GB/s (0 means 50), got -1");
}

// On random values and ranges, every check passes exactly when the value meets its bound,
// and then returns the value.
TEST(CheckTest, PassesExactlyInsideTheRange) {
  std::mt19937_64 rng(20261206);
  std::uniform_int_distribution<std::int64_t> small(-20, 20);
  for (int trial = 0; trial < 4000; ++trial) {
    const std::int64_t v = small(rng), a = small(rng), b = small(rng);
    const std::int64_t lo = std::min(a, b), hi = std::max(a, b);
    EXPECT_EQ(ErrorOf([&] { EXPECT_EQ(CheckAtLeast("f", v, lo), v); }).empty(), v >= lo);
    EXPECT_EQ(ErrorOf([&] { EXPECT_EQ(CheckAtMost("f", v, hi), v); }).empty(), v <= hi);
    EXPECT_EQ(ErrorOf([&] { CheckInRange("f", v, lo, hi); }).empty(), lo <= v && v <= hi);
    EXPECT_EQ(ErrorOf([&] { CheckBetween("f", v, lo, hi); }).empty(), lo <= v && v <= hi);
    EXPECT_EQ(ErrorOf([&] { CheckBelow("f", v, lo, hi); }).empty(), lo <= v && v < hi);
    EXPECT_EQ(ErrorOf([&] { CheckDivides("f", v, "n", a); }).empty(), v >= 1 && a % v == 0);
    EXPECT_EQ(ErrorOf([&] { CheckMultipleOf("f", v, "n", b); }).empty(), b >= 1 && v % b == 0);
    const double x = static_cast<double>(v) / 4;
    const double l = static_cast<double>(lo) / 4, h = static_cast<double>(hi) / 4;
    const End le = trial % 2 == 0 ? End::kClosed : End::kOpen;
    const End he = trial % 3 == 0 ? End::kClosed : End::kOpen;
    const bool above = le == End::kClosed ? x >= l : x > l;
    const bool under = he == End::kClosed ? x <= h : x < h;
    EXPECT_EQ(ErrorOf([&] { CheckRealInRange("f", x, l, le, h, he); }).empty(), above && under);
    EXPECT_EQ(ErrorOf([&] { CheckFiniteInRange("f", x, l, le, h, he); }).empty(), above && under);
    EXPECT_EQ(ErrorOf([&] { CheckFiniteAtLeast("f", x, l, le); }).empty(), above);
    EXPECT_EQ(ErrorOf([&] { CheckReal("f", x, l, le, h); }).empty(), above && x <= h);
  }
}

TEST(CheckTest, TheErrorCarriesFieldBoundAndValue) {
  try {
    CheckInRange({"lengths", 3}, -1, 0, {std::int64_t{1} << 31, "2^31"});
    FAIL() << "no error";
  } catch (const FieldError& e) {
    EXPECT_EQ(e.field(), "lengths[3]");
    EXPECT_EQ(e.bound(), "in [0, 2^31]");
    EXPECT_EQ(e.value(), "-1");
  }
}

}  // namespace
}  // namespace rlsched
