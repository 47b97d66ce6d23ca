#include "rlsched/common/error.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

namespace rlsched {
namespace {

TEST(FieldErrorTest, RequirementNamesTheField) {
  const FieldError e("num_parts", "must divide the batch");
  EXPECT_STREQ(e.what(), "num_parts: must divide the batch");
  EXPECT_EQ(e.field(), "num_parts");
  EXPECT_EQ(e.requirement(), "must divide the batch");
  EXPECT_EQ(e.bound(), "");
  EXPECT_EQ(e.value(), "");
}

TEST(FieldErrorTest, WithoutAFieldTheMessageIsTheRequirement) {
  const FieldError e("", "the total overflows int64");
  EXPECT_STREQ(e.what(), "the total overflows int64");
  EXPECT_EQ(e.field(), "");
}

TEST(FieldErrorTest, BoundAndValue) {
  const FieldError e("lengths[3]", "in [0, 2^31]", "-1");
  EXPECT_STREQ(e.what(), "lengths[3]: must be in [0, 2^31], got -1");
  EXPECT_EQ(e.bound(), "in [0, 2^31]");
  EXPECT_EQ(e.value(), "-1");
}

TEST(FieldErrorTest, IsAnInvalidArgument) {
  try {
    Fail("x", "must be set");
    FAIL() << "Fail() returned";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "x: must be set");
  }
}

TEST(FieldErrorTest, FailBoundFormatsNumbers) {
  auto message = [](auto value) {
    try {
      FailBound("f", ">= 1", value);
    } catch (const FieldError& e) {
      return e.value();
    }
    return std::string("no throw");
  };
  EXPECT_EQ(message(std::int64_t{-5}), "-5");
  EXPECT_EQ(message(0), "0");
  EXPECT_EQ(message(std::numeric_limits<std::uint64_t>::max()), "18446744073709551615");
  EXPECT_EQ(message(std::numeric_limits<std::int64_t>::min()), "-9223372036854775808");
  EXPECT_EQ(message(0.25), "0.25");
  EXPECT_EQ(message(1e300), "1e+300");
  EXPECT_EQ(message(std::numeric_limits<double>::infinity()), "inf");
  EXPECT_EQ(message(std::numeric_limits<double>::quiet_NaN()), "nan");
}

TEST(FieldErrorTest, WithinPutsTheFieldUnderItsParent) {
  const FieldError e("model.hidden_size", ">= 1", "0");
  const FieldError nested = e.Within("cost");
  EXPECT_EQ(nested.field(), "cost.model.hidden_size");
  EXPECT_STREQ(nested.what(), "cost.model.hidden_size: must be >= 1, got 0");
  EXPECT_EQ(nested.bound(), ">= 1");
  EXPECT_EQ(nested.value(), "0");
  EXPECT_EQ(FieldError("[3]", "must be >= 0").Within("lengths").field(), "lengths[3]");
  EXPECT_EQ(FieldError("", "overflows").Within("lengths").field(), "lengths");
  EXPECT_EQ(FieldError("x", "bad").Within("").field(), "x");
}

TEST(FieldErrorTest, Renamed) {
  const FieldError e =
      FieldError("max_tokens_per_micro_batch", ">= 1", "0").Renamed("--max-tokens");
  EXPECT_STREQ(e.what(), "--max-tokens: must be >= 1, got 0");
  EXPECT_EQ(e.requirement(), "must be >= 1, got 0");
}

TEST(CheckTest, PassesOrThrowsLogicError) {
  EXPECT_NO_THROW(RLSCHED_CHECK(1 + 1 == 2));
  try {
    RLSCHED_CHECK(1 + 1 == 3);
    FAIL() << "RLSCHED_CHECK passed a false condition";
  } catch (const std::invalid_argument&) {
    FAIL() << "an invariant is not the caller's error";
  } catch (const std::logic_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("rlsched internal error at "), std::string::npos) << what;
    EXPECT_NE(what.find("error_test.cc:"), std::string::npos) << what;
    EXPECT_NE(what.find("1 + 1 == 3"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace rlsched
