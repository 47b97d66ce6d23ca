// The lower bound on a step's time (step_bound.h): the closed form over the ranks'
// cost and the micro-batch count, and with a pipeline the combined relaxation over
// every rank's cost, largest sequence and count.

#include "step_bound.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <queue>
#include <utility>
#include <vector>

namespace rlsched::balance::internal {
namespace {

// The relaxation behind the combined bound, for p > 1. For a count m, let
// T' = T − (m + p − 1)·o and h_r the cost of rank r's heaviest micro-batch, at least
// max(C_r / m, L_r) (rank r's cost and largest sequence). A plan with step time <= T
// has C_r + (p − 1)·h_r <= T' on every rank, so R·T' >= C + (p − 1)·Σ_r h_r and
// Σ_r h_r >= max(C / m, ∫ k(x) dx) with k(x) = #{r : h_r > x}. With
// I(x) = ∫_x^∞ k = Σ_{h_r > x} (h_r − x): the ranks with h_r > x hold every sequence
// above x (cost B_x) and cost at most Σ (T' − (p − 1)·h_r) = k·T' − (p − 1)·(k·x + I(x)),
// each at most T'·m / (m + p − 1) (as h_r >= C_r / m); every other rank costs at most
// m·x. Hence, k being an integer <= R:
//   k·(T' − (p − 1)·x)           >= B_x + (p − 1)·I(x)   (B_x may be 0),
//   k·T'·m / (m + p − 1)         >= B_x,   and k >= 1 when B_x > 0,
//   k·(T' − (p − 1)·x − m·x)     >= C + (p − 1)·I(x) − R·m·x,
//   k·(T'·m / (m + p − 1) − m·x) >= C − R·m·x.
// Units: a rank assignment moves sequences, or whole groups (keep_groups). The ranks
// with h_r > x then hold every unit whose largest sequence is above x, so B_x counts
// those units whole; and the rank holding a unit of cost c and largest sequence a has
// T' >= c + (p − 1)·max(a, c / m). With equal counts (every rank floor(U / R) or
// ceil(U / R) of the U units) the k ranks hold the N_x units above x and at least
// k·floor(U / R) − N_x others, no cheaper than the cheapest units (S_j: the j
// cheapest): B_x + S_{k·floor(U/R) − N_x} replaces B_x in the first two inequalities,
// and k >= N_x / ceil(U / R). As k(x) never falls as x falls, neither does its estimate.
// Feasible() integrates a lower estimate of k from the top down on a grid (on each
// interval [x0, x1): B, N and I at x1, the capacities at x0, so each estimate holds on
// the whole interval); T' fails when some k must exceed R or the sum exceeds R·T'.
// With m = ∞ (passed as 0) the C terms vanish: what is left bounds through every
// rank's largest sequence alone, R·T' >= C + (p − 1)·Σ_r L_r.
// Ranges of counts: the relaxation at count b also holds for every count m <= b
// (max(C_r / m, L_r) only falls as m grows), and T − (m + p − 1)·o <= T − (a + p − 1)·o
// for m >= a; so MinBudget(b) + (a + p − 1)·o bounds every plan with m in [a, b].
// O(n log n) to build, O(grid + R) per feasibility test (grid <= 128 + 128 + 32).
class CombinedRelaxation {
 public:
  // The units a rank assignment moves (sequences, or whole groups) by their cost and
  // their largest sequence's cost; with PartSizes::kEqual every rank holds floor(U / R) or
  // ceil(U / R) of the U units.
  CombinedRelaxation(const UnitCosts& units, std::int64_t num_ranks, std::int64_t stages,
                     PartSizes unit_counts)
      : r_(static_cast<double>(num_ranks)), p1_(static_cast<double>(stages - 1)) {
    const std::size_t n = units.cost.size();
    // Units by largest sequence, descending.
    std::vector<std::size_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(),
              [&](std::size_t a, std::size_t b) { return units.largest[a] > units.largest[b]; });
    std::vector<double> prefix(n + 1, 0.0);  // prefix[i]: the i units of largest sequences
    for (std::size_t i = 0; i < n; ++i) {
      const double c = static_cast<double>(units.cost[order[i]]);
      const double a = static_cast<double>(units.largest[order[i]]);
      prefix[i + 1] = prefix[i] + c;
      largest_ = std::max(largest_, a);
      unit_cost_ = std::max(unit_cost_, c);
      unit_floor_ = std::max(unit_floor_, c + p1_ * a);
    }
    total_ = prefix.back();
    const auto u = static_cast<std::int64_t>(n);
    if (unit_counts == PartSizes::kEqual && u >= num_ranks) {
      min_units_ = static_cast<double>(u / num_ranks);
      max_units_ = static_cast<double>(CeilDiv(u, num_ranks));
      std::vector<std::int64_t> ascending(units.cost.begin(), units.cost.end());
      std::sort(ascending.begin(), ascending.end());
      smallest_.assign(n + 1, 0.0);
      for (std::size_t i = 0; i < n; ++i) {
        smallest_[i + 1] = smallest_[i] + static_cast<double>(ascending[i]);
      }
    }
    // Grid on [0, largest]: uniform points, plus the largest distinct largest-sequence
    // costs (where B jumps most, relative to its size), so B is exact there.
    xs_.push_back(0.0);
    for (int j = 1; j <= kUniform; ++j) xs_.push_back(largest_ * j / kUniform);
    int distinct = 0;
    for (std::size_t i = 0; i < n && distinct < kTop; ++i) {
      if (i == 0 || units.largest[order[i]] != units.largest[order[i - 1]]) {
        xs_.push_back(static_cast<double>(units.largest[order[i]]));
        ++distinct;
      }
    }
    std::sort(xs_.begin(), xs_.end());
    xs_.erase(std::unique(xs_.begin(), xs_.end()), xs_.end());
    // above_[i], count_[i]: the cost and number of the units whose largest sequence is
    // >= xs_[i] (above every x < xs_[i]).
    above_.resize(xs_.size());
    count_.resize(xs_.size());
    for (std::size_t i = 0; i < xs_.size(); ++i) {
      const auto it = std::partition_point(order.begin(), order.end(), [&](std::size_t v) {
        return static_cast<double>(units.largest[v]) >= xs_[i];
      });
      const auto k = static_cast<std::size_t>(it - order.begin());
      above_[i] = prefix[k];
      count_[i] = static_cast<double>(k);
    }
  }

  double largest() const { return largest_; }
  double total() const { return total_; }

  // Every T' below the returned value is infeasible for count m (0: unbounded).
  // Bisection to 1e-4. O(log(1e4) · grid).
  double MinBudget(double m) const {
    if (total_ <= 0.0) return 0.0;
    // Infeasible below: the rank with the largest unit, the mean rank.
    double lo = std::max(Floor(m), total_ / r_) * (1.0 - 1e-9);
    if (m > 0) lo = std::max(lo, total_ / r_ * (1.0 + p1_ / m) * (1.0 - 1e-9));
    double hi = lo * 1.25;
    for (int doubling = 0; doubling < 64 && !Feasible(hi, m); ++doubling) {
      lo = hi;
      hi *= 2.0;
    }
    for (int iteration = 0; iteration < 64 && hi - lo > 1e-4 * hi; ++iteration) {
      const double mid = (lo + hi) / 2;
      (Feasible(mid, m) ? hi : lo) = mid;
    }
    return lo * (1.0 - 1e-9);  // below the threshold despite rounding
  }

 private:
  static constexpr int kUniform = 128;
  static constexpr int kTop = 128;
  static constexpr int kExtension = 32;  // intervals above the largest cost (C terms)

  // The rank holding a unit of cost c and largest sequence a needs at least
  // c + (p − 1)·max(a, c / m).
  double Floor(double m) const {
    return std::max(unit_floor_, m > 0 ? unit_cost_ * (1.0 + p1_ / m) : 0.0);
  }

  // The cost of the j cheapest units (0 for j <= 0).
  double Smallest(double j) const {
    if (j <= 0.0 || smallest_.empty()) return 0.0;
    return smallest_[std::min(static_cast<std::size_t>(j), smallest_.size() - 1)];
  }

  bool Feasible(double t, double m) const {
    if (t < Floor(m)) return false;
    const double cap = m > 0 ? t * m / (m + p1_) : t;  // a rank's cost at most
    const double eps = 1e-9 * total_;
    double integral = 0.0;  // lower estimate of I(x1)
    double previous = 0.0;  // k on the interval above: k(x) only grows as x falls
    bool ok = true;
    // One interval [x0, x1) with B_x >= b on it, held by `count` units.
    auto interval = [&](double x0, double x1, double b, double count) {
      double k = 0.0;
      const double need0 = b + p1_ * integral;
      const double room0 = t - p1_ * x0;
      if (need0 > 0.0) {
        if (room0 <= 0.0) return false;
        k = need0 / room0;
      }
      if (b > 0.0) k = std::max({k, 1.0, b / cap});
      if (m > 0) {
        const double need = total_ + p1_ * integral - r_ * m * x1;
        if (need > eps) {
          const double room = t - (p1_ + m) * x0;
          if (room <= 0.0) return false;
          k = std::max(k, need / room);
        }
        const double need2 = total_ - r_ * m * x1;
        if (need2 > eps) {
          const double room = cap - m * x0;
          if (room <= 0.0) return false;
          k = std::max(k, need2 / room);
        }
      }
      double whole = std::max(previous, std::ceil(k - 1e-9 * std::max(1.0, k)));
      if (min_units_ > 0.0 && count > 0.0) {
        // Equal counts: the k ranks hold the `count` units and at least
        // k·min − count others, no cheaper than the cheapest ones; and at most max each.
        whole = std::max(whole, std::ceil(count / max_units_ - 1e-9));
        auto holds = [&](double w) {
          const double others = Smallest(w * min_units_ - count);
          return w * room0 + eps >= need0 + others && w * cap + eps >= b + others;
        };
        while (whole <= r_ && !holds(whole)) whole += 1.0;
      }
      if (whole > r_) return false;
      previous = whole;
      integral += whole * (x1 - x0);
      return true;
    };
    // Above the largest cost only the C terms count: up to C / (R·m).
    if (m > 0) {
      const double top = total_ / (r_ * m);
      if (top > largest_) {
        const double step = (top - largest_) / kExtension;
        for (int j = kExtension; j >= 1 && ok; --j) {
          ok = interval(largest_ + step * (j - 1), largest_ + step * j, 0.0, 0.0);
        }
      }
    }
    for (std::size_t i = xs_.size() - 1; i >= 1 && ok; --i) {
      ok = interval(xs_[i - 1], xs_[i], above_[i], count_[i]);
    }
    if (!ok) return false;
    const double sum_m = std::max(m > 0 ? total_ / m : 0.0, integral);
    return r_ * t >= total_ + p1_ * sum_m;
  }

  double r_;
  double p1_;
  double total_ = 0.0;
  double largest_ = 0.0;          // the largest sequence
  double unit_cost_ = 0.0;        // the costliest unit
  double unit_floor_ = 0.0;       // max over units of cost + (p − 1)·largest sequence
  double min_units_ = 0.0;        // units per rank at least (0: counts not equal)
  double max_units_ = 0.0;        // and at most
  std::vector<double> smallest_;  // smallest_[j]: the j cheapest units
  std::vector<double> xs_;
  std::vector<double> above_;
  std::vector<double> count_;
};

// The combined bound (see CombinedRelaxation) minimised over the admissible counts
// m in [first, last] (multiples of q; last = 0: unbounded): a range [a, b] of counts (b = 0: all
// from a on) is worth max(MinBudget(b), the closed form of StepLowerBound at b) + (a+p−1)·o, which
// bounds every count in it. Best first: the range of least worth is split (one new MinBudget each)
// until it is a single count or the evaluations run out; its worth then bounds every plan, since
// the ranges cover every admissible count. With o = 0 every range containing the last count is
// worth the same, so that is the bound. Returns the bound and the count of that single range (with
// o = 0, the last count; 0: none), a hint for the planner. O(kMaxEvaluations · MinBudget).
std::pair<long double, std::int64_t> CombinedBound(const UnitCosts& units, PartSizes unit_counts,
                                                   long double heaviest, std::int64_t first,
                                                   std::int64_t last, const StepOptions& options) {
  constexpr int kMaxEvaluations = 40;
  const MicroBatchOptions& mb = options.micro_batch;
  const CombinedRelaxation relax(units, options.num_ranks, mb.pipeline_stages, unit_counts);
  if (relax.total() <= 0.0) return {0.0L, 0};
  const long double p = static_cast<long double>(mb.pipeline_stages);
  const long double o = static_cast<long double>(Overhead(mb));
  const std::int64_t q = mb.micro_batches_multiple_of;
  const long double floor_term = p * static_cast<long double>(relax.largest());
  std::vector<std::pair<std::int64_t, double>> budgets;  // MinBudget by count
  auto budget = [&](std::int64_t b) {
    for (const auto& [count, t] : budgets) {
      if (count == b) return t;
    }
    budgets.emplace_back(b, relax.MinBudget(static_cast<double>(b)));
    return budgets.back().second;
  };
  auto worth = [&](std::int64_t a, std::int64_t b) {
    const long double closed =
        b > 0 ? std::max(heaviest + heaviest * (p - 1.0L) / static_cast<long double>(b), floor_term)
              : std::max(heaviest, floor_term);
    return std::max(static_cast<long double>(budget(b)), closed) +
           (static_cast<long double>(a) + p - 1.0L) * o;
  };
  struct Range {
    long double worth;
    std::int64_t a, b;
    bool operator>(const Range& other) const { return worth > other.worth; }
  };
  std::priority_queue<Range, std::vector<Range>, std::greater<>> ranges;
  ranges.push({worth(first, last), first, last});
  if (o == 0) return {ranges.top().worth, last};
  while (true) {
    const Range range = ranges.top();
    if (range.a == range.b) return {range.worth, range.a};
    if (static_cast<int>(budgets.size()) >= kMaxEvaluations) return {range.worth, 0};
    ranges.pop();
    const std::int64_t mid = range.b == 0 ? std::max(range.a, RoundUp(2 * range.a, q))
                                          : range.a + q * ((range.b - range.a) / q / 2);
    ranges.push({std::max(range.worth, worth(range.a, mid)), range.a, mid});
    ranges.push({std::max(range.worth, worth(mid + q, range.b)), mid + q, range.b});
  }
}

}  // namespace

StepBound StepLowerBound(const Padded& padded, std::int64_t max_unit_cost, const UnitCosts& units,
                         PartSizes unit_counts, Empties empties, const StepOptions& options) {
  const MicroBatchOptions& mb = options.micro_batch;
  const std::int64_t total_cost = padded.total_cost;
  const std::int64_t total_tokens = padded.total_tokens;
  const std::int64_t max_item = padded.max_cost;
  const long double r = static_cast<long double>(options.num_ranks);
  const long double heaviest =
      std::max(static_cast<long double>(total_cost) / r, static_cast<long double>(max_unit_cost));
  const long double p = static_cast<long double>(mb.pipeline_stages);
  const long double o = static_cast<long double>(Overhead(mb));
  const long double spread = heaviest * (p - 1.0L);  // f(m) = max(heaviest + spread/m, p·max)
  const long double floor_term = p * static_cast<long double>(max_item);
  auto f = [&](long double m) {
    return std::max(heaviest + spread / m, floor_term) + m * o + (p - 1.0L) * o;
  };
  const std::int64_t first = SmallestCount(CeilDiv(total_tokens, options.num_ranks), mb);
  const std::int64_t fillable =
      RoundDown(static_cast<std::int64_t>(padded.costs.size()) / options.num_ranks,
                mb.micro_batches_multiple_of);
  const std::int64_t last = empties == Empties::kNone && fillable >= first ? fillable : 0;
  const long double q = static_cast<long double>(mb.micro_batches_multiple_of);
  long double best_m = std::numeric_limits<long double>::infinity();
  if (o > 0) best_m = std::sqrt(spread / o);
  if (floor_term > heaviest && spread > 0)
    best_m = std::min(best_m, spread / (floor_term - heaviest));
  if (last > 0) best_m = std::min(best_m, static_cast<long double>(last));
  long double value;
  if (std::isinf(best_m)) {
    value = heaviest + (p - 1.0L) * o;  // the infimum as m grows
  } else {
    const long double steps = std::max(0.0L, std::floor((best_m - first) / q));
    const long double m1 = first + steps * q;
    value =
        last > 0 && m1 + q > static_cast<long double>(last) ? f(m1) : std::min(f(m1), f(m1 + q));
    if (spread == 0) value = f(static_cast<long double>(first));
  }
  // With a pipeline, every rank's cost, largest sequence and count together.
  std::int64_t count = 0;
  if (mb.pipeline_stages > 1) {
    const auto [combined, combined_count] =
        CombinedBound(units, unit_counts, heaviest, first, last, options);
    value = std::max(value, combined);
    count = combined_count;
  }
  const long double limit = static_cast<long double>(std::numeric_limits<std::int64_t>::max());
  return {value >= limit ? std::numeric_limits<std::int64_t>::max()
                         : static_cast<std::int64_t>(std::floor(value)),
          count};
}

// The bound of plans that may split groups (the baseline's), equal sequence counts
// when asked.
std::int64_t UngroupedBound(const Padded& padded, PartSizes sequence_counts, Empties empties,
                            const StepOptions& options) {
  return StepLowerBound(padded, 0, {padded.costs, padded.costs}, sequence_counts, empties, options)
      .value;
}

}  // namespace rlsched::balance::internal
