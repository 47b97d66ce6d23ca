// The planner's per-rank bucket rooms (rollout/src/bucket_rooms.h) against a plain
// array of rooms scanned bucket by bucket.

#include "bucket_rooms.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace rlsched::rollout::internal {
namespace {

// The reference: every bucket's room, scanned from b.
class PlainRooms {
 public:
  explicit PlainRooms(std::int64_t budget) : budget_(budget) {}
  std::int64_t FirstFit(std::int64_t b, std::int64_t bytes) const {
    for (; b < static_cast<std::int64_t>(room_.size()); ++b) {
      if (room_[b] >= bytes) return b;
    }
    return b;
  }
  void Take(std::int64_t b, std::int64_t bytes) {
    if (b >= static_cast<std::int64_t>(room_.size())) room_.resize(b + 1, budget_);
    room_[b] -= bytes;
  }

 private:
  std::int64_t budget_;
  std::vector<std::int64_t> room_;
};

// Seeded first fits with a mix of sizes (many equal, some the whole budget, some
// tiny), from b = 0 and from random starts, sometimes into a far bucket (a jump past
// the stored ones): every answer equals the reference's.
template <class T>
void SameAsPlainScan(std::int64_t budget, std::uint64_t seed, int operations) {
  std::mt19937_64 rng(seed);
  auto pick = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  BucketRooms<T> rooms(budget);
  PlainRooms plain(budget);
  std::int64_t last = 0;  // the last bucket taken
  for (int n = 0; n < operations; ++n) {
    std::int64_t bytes = 0;
    switch (pick(0, 4)) {
      case 0:
        bytes = budget;
        break;
      case 1:
        bytes = pick(0, 3);
        break;
      case 2:
        bytes = budget / 3;
        break;
      default:
        bytes = pick(1, budget);
    }
    const std::int64_t from = pick(0, 3) == 0 ? pick(0, last + 100) : 0;
    const std::int64_t fit = plain.FirstFit(from, bytes);
    const std::string what = "seed " + std::to_string(seed) + " operation " + std::to_string(n) +
                             ": " + std::to_string(bytes) + " bytes from bucket " +
                             std::to_string(from);
    ASSERT_EQ(rooms.FirstFit(from, bytes), fit) << what;
    std::int64_t into = fit;
    if (pick(0, 50) == 0) into = plain.FirstFit(fit + pick(1, 3000), bytes);  // a far bucket
    rooms.Take(into, bytes);
    plain.Take(into, bytes);
    last = std::max(last, into);
    ASSERT_GE(static_cast<std::int64_t>(rooms.stored()), last + 1) << what;
  }
  // Every bucket once more, with every size class.
  for (std::int64_t b = 0; b <= last + 1; ++b) {
    for (const std::int64_t bytes : {std::int64_t{0}, std::int64_t{1}, budget / 2, budget}) {
      ASSERT_EQ(rooms.FirstFit(b, bytes), plain.FirstFit(b, bytes))
          << "seed " << seed << ": bucket " << b << ", " << bytes << " bytes";
    }
  }
}

TEST(BucketRoomsTest, SameAsPlainScan32) {
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    SameAsPlainScan<std::int32_t>(seed % 2 == 0 ? 1000 : std::numeric_limits<std::int32_t>::max(),
                                  seed, 3000);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(BucketRoomsTest, SameAsPlainScan64) {
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    SameAsPlainScan<std::int64_t>(seed % 2 == 0 ? std::int64_t{1} << 40 : 7, seed, 3000);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(BucketRoomsTest, EmptyBucketsPastTheStoredOnes) {
  BucketRooms<std::int32_t> rooms(100);
  EXPECT_EQ(rooms.FirstFit(0, 100), 0);
  EXPECT_EQ(rooms.FirstFit(12345, 100), 12345);
  rooms.Take(0, 100);
  EXPECT_EQ(rooms.FirstFit(0, 1), 1);
  EXPECT_EQ(rooms.FirstFit(0, 0), 0);  // a full bucket still has room for nothing
  for (std::int64_t b = 1; b < 40; ++b) rooms.Take(b, 99);
  EXPECT_EQ(rooms.FirstFit(0, 1), 1);
  EXPECT_EQ(rooms.FirstFit(0, 2), 40);
  rooms.Take(39, 1);
  EXPECT_EQ(rooms.FirstFit(0, 1), 1);
  EXPECT_EQ(rooms.FirstFit(39, 1), 40);
}

}  // namespace
}  // namespace rlsched::rollout::internal
