// The long sequences packed onto few ranks: see rank_packer.h.

#include "rank_packer.h"

#include <algorithm>
#include <numeric>
#include <tuple>
#include <utility>
#include <vector>

namespace rlsched::balance::internal {

RankPacker::RankPacker(const Units& units, std::int64_t num_ranks, std::int64_t stages,
                       std::int64_t m, PartSizes unit_counts)
    : units_(units),
      n_(units.cost.size()),
      num_ranks_(static_cast<std::size_t>(num_ranks)),
      p1_(static_cast<double>(stages - 1)),
      m_(m),
      md_(static_cast<double>(m)),
      equal_counts_(unit_counts == PartSizes::kEqual),
      order_(n_),
      room_(num_ranks_),
      rank_of_(n_),
      cost_(num_ranks_),
      high_(num_ranks_),
      tail_(num_ranks_),
      held_(num_ranks_),
      quota_(equal_counts_ ? n_ / num_ranks_ : 0),
      extra_(equal_counts_ ? n_ % num_ranks_ : 0),
      members_(num_ranks_) {
  std::iota(order_.begin(), order_.end(), 0);
  std::stable_sort(order_.begin(), order_.end(), [&](std::size_t a, std::size_t b) {
    return std::tie(units_.largest[b], units_.cost[b]) <
           std::tie(units_.largest[a], units_.cost[a]);
  });
  singles_ = std::all_of(units_.members.begin(), units_.members.end(),
                         [](const auto& members) { return members.size() == 1; });
  if (equal_counts_) {
    by_cost_.resize(n_);
    std::iota(by_cost_.begin(), by_cost_.end(), 0);
    std::stable_sort(by_cost_.begin(), by_cost_.end(),
                     [&](std::size_t a, std::size_t b) { return units_.cost[a] < units_.cost[b]; });
    taken_.resize(n_);
    position_.resize(n_);
  }
}

bool RankPacker::Full(std::size_t r) const {
  const std::size_t held_r = held_[r].size();
  return equal_counts_ && (held_r > quota_ || (held_r == quota_ && extra_used_ == extra_));
}

double RankPacker::Spare(std::size_t r, double t) const {
  double free = std::min(t - p1_ * high_[r], t * md_ / (md_ + p1_)) - cost_[r];
  // At k·m sequences the next one, c, makes the heaviest at least tail + c.
  const std::int64_t n_r = static_cast<std::int64_t>(held_[r].size());
  if (singles_ && n_r > 0 && n_r % m_ == 0) {
    free = std::min(free, (t - cost_[r] - p1_ * tail_[r]) / (1 + p1_));
  }
  return free;
}

double RankPacker::Room(std::size_t r, double t) const {
  if (Full(r)) return -1.0;
  double free = Spare(r, t);
  if (reserve_ > 0.0 && held_[r].size() + 1 < quota_) {
    free -= static_cast<double>(quota_ - held_[r].size() - 1) * reserve_;
  }
  return free;
}

void RankPacker::Open(std::size_t r) {
  members_[r].clear();
  cost_[r] = 0.0;
  held_[r].clear();
  high_[r] = 0.0;
}

void RankPacker::Add(std::size_t r, std::size_t u) {
  const double c = static_cast<double>(units_.cost[u]);
  cost_[r] += c;
  held_[r].push_back(c);
  high_[r] = std::max(high_[r], static_cast<double>(units_.largest[u]));
  const std::int64_t n_r = static_cast<std::int64_t>(held_[r].size());
  if (singles_ && n_r > 1 && n_r % m_ == 1) high_[r] = std::max(high_[r], tail_[r] + c);
  if (singles_ && n_r % m_ == 0) {  // the last n_r / m sequences
    tail_[r] = 0.0;
    for (std::int64_t j = n_r - n_r / m_; j < n_r; ++j) tail_[r] += held_[r][j];
  }
  if (equal_counts_ && held_[r].size() == quota_ + 1 && ++extra_used_ == extra_) {
    for (std::size_t s = 0; s < num_ranks_; ++s) {  // ranks at the quota are now full
      if (room_.Get(s) >= 0.0 && Full(s)) room_.Set(s, -1.0);
    }
  }
  rank_of_[u] = r;
  if (equal_counts_) members_[r].push_back(u);
}

std::size_t RankPacker::PlaceLong(double t, std::size_t end) {
  room_.Fill(-1.0);
  extra_used_ = 0;
  std::size_t opened = 0;
  for (std::size_t j = 0; j < end; ++j) {
    const std::size_t u = order_[j];
    const double c = static_cast<double>(units_.cost[u]);
    std::size_t r = room_.FirstAtLeast(c);
    if (r == MaxSegmentTree::kNone) {
      if (opened == num_ranks_) return num_ranks_ + 1;
      r = opened++;
      Open(r);
      high_[r] = static_cast<double>(units_.largest[u]);
      if (Room(r, t) < c) return num_ranks_ + 1;
    }
    Add(r, u);
    room_.Set(r, Room(r, t));
  }
  return opened;
}

bool RankPacker::FitsAny(double t) {
  room_.Fill(-1.0);
  const double short_below = t / (md_ + p1_);
  reserve_ = 0.0;
  std::size_t opened = 0;
  for (const std::size_t u : order_) {
    const double c = static_cast<double>(units_.cost[u]);
    if (singles_ && static_cast<double>(units_.largest[u]) < short_below) {
      // Short units: onto the rank with the most room (worst fit), every rank open.
      for (; opened < num_ranks_; ++opened) {
        Open(opened);
        room_.Set(opened, Room(opened, t));
      }
      const std::size_t r = room_.ArgMax();
      if (room_.Get(r) < c) return false;
      Add(r, u);
      room_.Set(r, Room(r, t));
      continue;
    }
    std::size_t r = room_.FirstAtLeast(c);
    if (r == MaxSegmentTree::kNone) {
      if (opened == num_ranks_) return false;
      r = opened++;
      Open(r);
      high_[r] = static_cast<double>(units_.largest[u]);
      if (Room(r, t) < c) return false;
    }
    Add(r, u);
    room_.Set(r, Room(r, t));
  }
  return true;
}

void RankPacker::Mark(std::size_t u, bool take) {
  taken_[u] = take ? 1 : 0;
  free_.Add(position_[u], take ? -1 : 1);
}

std::size_t RankPacker::Costliest(double cap) const {
  const std::size_t below =
      static_cast<std::size_t>(std::upper_bound(pool_.begin(), pool_.end(), cap,
                                                [&](double v, std::size_t u) {
                                                  return v < static_cast<double>(units_.cost[u]);
                                                }) -
                               pool_.begin());
  const std::int64_t k = free_.PrefixSum(below);  // free units in the first `below`
  if (k == 0) return pool_.size();
  return free_.FirstReaching(k);  // the k-th free unit
}

void RankPacker::Rebuild(std::size_t r, std::vector<std::size_t> list) {
  std::stable_sort(list.begin(), list.end(),
                   [&](std::size_t a, std::size_t b) { return units_.cost[a] > units_.cost[b]; });
  if (held_[r].size() > quota_) --extra_used_;
  Open(r);
  for (const std::size_t u : list) Add(r, u);
}

bool RankPacker::IsShort(std::size_t u) const {
  return static_cast<double>(units_.largest[u]) < short_below_;
}

bool RankPacker::FitsEqual(double t) {
  short_below_ = t / (md_ + p1_);
  const std::size_t end =
      static_cast<std::size_t>(std::partition_point(order_.begin(), order_.end(),
                                                    [&](std::size_t u) { return !IsShort(u); }) -
                               order_.begin());
  const std::optional<std::size_t> opened = ChooseFillers(t, end);
  if (!opened || !PlaceFillers(t, *opened)) return false;
  UpgradeFillers(t, *opened);
  return PlaceShort(t, end, *opened);
}

std::optional<std::size_t> RankPacker::ChooseFillers(double t, std::size_t end) {
  // The reserve is the fillers' mean cost (a few rounds, as the slots depend on it).
  std::size_t opened = 0;
  reserve_ = 0.0;
  for (int round = 0; round < 4; ++round) {
    opened = PlaceLong(t, end);
    if (opened > num_ranks_) return std::nullopt;
    std::size_t slots = 0;
    for (std::size_t r = 0; r < opened; ++r) slots += quota_ - std::min(quota_, held_[r].size());
    fillers_.clear();
    double sum = 0.0;
    for (std::size_t j = 0; j < n_ && fillers_.size() < slots; ++j) {
      const std::size_t u = by_cost_[j];
      if (!IsShort(u)) continue;
      fillers_.push_back(u);
      sum += static_cast<double>(units_.cost[u]);
    }
    if (fillers_.size() < slots) return std::nullopt;
    const double mean = slots == 0 ? 0.0 : sum / static_cast<double>(slots);
    if (mean <= reserve_ * (1.0 + 1e-3) + 1e-9) break;
    reserve_ = mean;
  }
  reserve_ = 0.0;
  return opened;
}

bool RankPacker::PlaceFillers(double t, std::size_t opened) {
  for (std::size_t r = 0; r < opened; ++r) {
    room_.Set(r, held_[r].size() < quota_ ? Room(r, t) : -1.0);
  }
  for (std::size_t j = fillers_.size(); j-- > 0;) {
    const std::size_t u = fillers_[j];
    const std::size_t r = room_.ArgMax();
    if (room_.Get(r) < static_cast<double>(units_.cost[u])) return false;
    Add(r, u);
    room_.Set(r, held_[r].size() < quota_ ? Room(r, t) : -1.0);
  }
  return true;
}

void RankPacker::UpgradeFillers(double t, std::size_t opened) {
  // A rank's fillers, cheapest first, each swapped for the costliest short unit not
  // placed yet that still fits (a Fenwick tree over the short units by cost finds it),
  // taking cost off the other ranks.
  for (const std::size_t u : pool_) taken_[u] = 0;
  pool_.clear();
  for (const std::size_t u : by_cost_) {
    if (IsShort(u)) {
      position_[u] = pool_.size();
      pool_.push_back(u);
    }
  }
  free_.Assign(pool_.size(), 1);
  for (const std::size_t u : fillers_) Mark(u, true);
  for (std::size_t r = 0; r < opened; ++r) {
    double budget = Spare(r, t);
    if (budget <= 0.0) continue;
    const std::vector<std::size_t> before = members_[r];
    bool changed = false;
    // members_[r]: its long units, then its fillers, most costly first.
    for (std::size_t j = members_[r].size(); j-- > 0 && budget > 0.0;) {
      const std::size_t f = members_[r][j];
      if (!IsShort(f)) break;
      const double c = static_cast<double>(units_.cost[f]);
      const std::size_t pos = Costliest(c + budget);
      if (pos == pool_.size() || static_cast<double>(units_.cost[pool_[pos]]) <= c) continue;
      const std::size_t g = pool_[pos];
      Mark(g, true);
      Mark(f, false);
      members_[r][j] = g;
      budget -= static_cast<double>(units_.cost[g]) - c;
      changed = true;
    }
    if (!changed) continue;
    const std::vector<std::size_t> upgraded = members_[r];
    Rebuild(r, upgraded);
    if (Spare(r, t) < 0.0) {  // the micro-batch sharing grew: undo
      // Only the short units are in the pool (the rank's long units are not, and
      // marking them would corrupt the counts of free short units).
      for (const std::size_t u : upgraded) {
        if (IsShort(u)) Mark(u, false);
      }
      for (const std::size_t u : before) {
        if (IsShort(u)) Mark(u, true);
      }
      Rebuild(r, before);
    }
  }
}

bool RankPacker::PlaceShort(double t, std::size_t end, std::size_t opened) {
  for (std::size_t r = 0; r < num_ranks_; ++r) {
    if (r >= opened) Open(r);
    room_.Set(r, Room(r, t));
  }
  for (std::size_t j = end; j < n_; ++j) {
    const std::size_t u = order_[j];
    if (taken_[u]) continue;
    const std::size_t r = room_.ArgMax();
    if (room_.Get(r) < static_cast<double>(units_.cost[u])) return false;
    Add(r, u);
    room_.Set(r, Room(r, t));
  }
  return true;
}

std::vector<std::vector<std::int64_t>> RankPacker::Pack(double lo, double hi) {
  // The budget is usually just above lo: bracket it from there.
  for (double top = std::min(hi, lo * 1.0625);; top = std::min(hi, top * 1.25)) {
    if (Fits(top)) {
      hi = top;
      break;
    }
    if (top >= hi) return {};
    lo = top;
  }
  for (int iteration = 0; iteration < 40 && hi - lo > 1e-3 * hi; ++iteration) {
    const double mid = (lo + hi) / 2;
    (Fits(mid) ? hi : lo) = mid;
  }
  Fits(hi);
  std::vector<std::vector<std::int64_t>> ranks(num_ranks_);
  for (std::size_t u = 0; u < n_; ++u) {
    for (const std::int64_t i : units_.members[u]) ranks[rank_of_[u]].push_back(i);
  }
  for (auto& rank : ranks) std::sort(rank.begin(), rank.end());
  return ranks;
}

std::vector<std::vector<std::int64_t>> PackedRanks(const Units& units, std::int64_t num_ranks,
                                                   std::int64_t stages, std::int64_t m, double lo,
                                                   double hi, PartSizes unit_counts) {
  return RankPacker(units, num_ranks, stages, m, unit_counts).Pack(lo, hi);
}

}  // namespace rlsched::balance::internal
