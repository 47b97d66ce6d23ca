// The range checks every rlsched library and the native module apply to a caller's input.
//
// Each check returns the value when it meets its bound and otherwise throws FieldError
// (error.h) naming the field, the bound and the value: "<field>: must be <bound>, got
// <value>". Every bound has one wording, written here once:
//
//   integers   CheckAtLeast        ">= lo"
//              CheckAtMost         "<= hi"
//              CheckInRange        "in [lo, hi]"
//              CheckBetween        ">= lo" or "<= hi"     (the end the value breaks)
//              CheckBelow          "in [lo, end)"         (an index, a half-open range)
//              CheckDivides        "must divide <what> (<n>), got <value>"
//              CheckMultipleOf     "must be a multiple of <what> (<n>), got <value>"
//   reals      CheckFinite         "finite"
//              CheckRealAtLeast    ">= lo" or "> lo"      (NaN fails)
//              CheckRealAtMost     "<= hi"                (NaN fails)
//              CheckRealInRange    "in [lo, hi]", "in (lo, hi]", ... (NaN and infinities fail)
//              CheckReal           "finite", then ">= lo" or "> lo", then "<= hi"
//              CheckFiniteAtLeast  "finite and >= lo" or "finite and > lo"
//              CheckFiniteInRange  "finite and in [lo, hi]"
//
// CheckAtLeast and the in-range checks take an optional note, written after the bound:
// "(0 means 1)", "GB/s (0 means 400)".
//
// A bound is a number or, where the number hides what it is, a name ("2^31",
// "num_hidden_layers = 32"): Limit. A field is a name or a name with an index
// ("lengths[3]", "transfers[3].src_param"): Field, formatted only when a check fails, so
// the checks cost a comparison in a loop over a caller's list.
//
// Thread-safe (no state). Complexity O(1), plus the message's size on failure.

#ifndef RLSCHED_COMMON_CHECK_H_
#define RLSCHED_COMMON_CHECK_H_

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace rlsched {

// A field's path: "name", "name[index]" or "name[index]suffix" (suffix e.g. ".src_param").
class Field {
 public:
  Field(const char* name) : name_(name) {}         // NOLINT(google-explicit-constructor)
  Field(std::string_view name) : name_(name) {}    // NOLINT(google-explicit-constructor)
  Field(const std::string& name) : name_(name) {}  // NOLINT(google-explicit-constructor)
  Field(std::string_view name, std::size_t index, std::string_view suffix = {})
      : name_(name), index_(index), suffix_(suffix) {}

  std::string Path() const;

 private:
  std::string_view name_;
  std::optional<std::size_t> index_;
  std::string_view suffix_;
};

// An end of an integer range: its value, written as the number or as `name`.
struct Limit {
  constexpr Limit(std::int64_t v) : value(v) {}  // NOLINT(google-explicit-constructor)
  constexpr Limit(std::int64_t v, std::string_view n) : value(v), name(n) {}
  std::string Text() const;

  std::int64_t value;
  std::string_view name;
};

// Whether a real range includes its end.
enum class End { kClosed, kOpen };

namespace internal {
[[noreturn]] void FailInt(const Field& field, std::string_view op, const Limit& limit,
                          std::int64_t value, std::string_view note);
[[noreturn]] void FailInRange(const Field& field, const Limit& lo, const Limit& hi, char close,
                              std::int64_t value, std::string_view note);
[[noreturn]] void FailRelation(const Field& field, std::string_view relation, std::string_view what,
                               std::int64_t n, std::int64_t value);
[[noreturn]] void FailReal(const Field& field, std::string_view prefix, std::string_view op,
                           double limit, double value);
[[noreturn]] void FailRealRange(const Field& field, std::string_view prefix, double lo, End lo_end,
                                double hi, End hi_end, double value, std::string_view note);
inline bool Above(double value, double lo, End end) {
  return end == End::kClosed ? value >= lo : value > lo;
}
inline bool Under(double value, double hi, End end) {
  return end == End::kClosed ? value <= hi : value < hi;
}
}  // namespace internal

inline std::int64_t CheckAtLeast(const Field& field, std::int64_t value, Limit lo,
                                 std::string_view note = {}) {
  if (value < lo.value) [[unlikely]]
    internal::FailInt(field, ">= ", lo, value, note);
  return value;
}

inline std::int64_t CheckAtMost(const Field& field, std::int64_t value, Limit hi) {
  if (value > hi.value) [[unlikely]]
    internal::FailInt(field, "<= ", hi, value, {});
  return value;
}

inline std::int64_t CheckInRange(const Field& field, std::int64_t value, Limit lo, Limit hi,
                                 std::string_view note = {}) {
  if (value < lo.value || value > hi.value) [[unlikely]] {
    internal::FailInRange(field, lo, hi, ']', value, note);
  }
  return value;
}

inline std::int64_t CheckBetween(const Field& field, std::int64_t value, Limit lo, Limit hi) {
  CheckAtLeast(field, value, lo);
  return CheckAtMost(field, value, hi);
}

inline std::int64_t CheckBelow(const Field& field, std::int64_t value, Limit lo, Limit end,
                               std::string_view note = {}) {
  if (value < lo.value || value >= end.value) [[unlikely]] {
    internal::FailInRange(field, lo, end, ')', value, note);
  }
  return value;
}

// value >= 1 divides n, the value of the field or quantity `what`.
inline std::int64_t CheckDivides(const Field& field, std::int64_t value, std::string_view what,
                                 std::int64_t n) {
  if (value < 1 || n % value != 0) [[unlikely]] {
    internal::FailRelation(field, "divide", what, n, value);
  }
  return value;
}

// value is a multiple of n >= 1, the value of the field or quantity `what`.
inline std::int64_t CheckMultipleOf(const Field& field, std::int64_t value, std::string_view what,
                                    std::int64_t n) {
  if (n < 1 || value % n != 0) [[unlikely]] {
    internal::FailRelation(field, "be a multiple of", what, n, value);
  }
  return value;
}

// A count where 0 means 1 (the wire's and Python's unset): in [0, max], or >= 0 when max is
// int64's largest, with the note "(0 means 1)". Returns the count, 0 read as 1.
std::int64_t ZeroMeansOne(const Field& field, std::int64_t value, std::int64_t max);

inline double CheckFinite(const Field& field, double value) {
  if (!std::isfinite(value)) [[unlikely]]
    internal::FailReal(field, "finite", {}, 0, value);
  return value;
}

inline double CheckRealAtLeast(const Field& field, double value, double lo,
                               End end = End::kClosed) {
  if (!internal::Above(value, lo, end)) [[unlikely]] {
    internal::FailReal(field, {}, end == End::kClosed ? ">= " : "> ", lo, value);
  }
  return value;
}

inline double CheckRealAtMost(const Field& field, double value, double hi) {
  if (!internal::Under(value, hi, End::kClosed)) [[unlikely]] {
    internal::FailReal(field, {}, "<= ", hi, value);
  }
  return value;
}

inline double CheckReal(const Field& field, double value, double lo, End lo_end, double hi) {
  CheckFinite(field, value);
  CheckRealAtLeast(field, value, lo, lo_end);
  return CheckRealAtMost(field, value, hi);
}

inline double CheckRealInRange(const Field& field, double value, double lo, End lo_end, double hi,
                               End hi_end, std::string_view note = {}) {
  if (!internal::Above(value, lo, lo_end) || !internal::Under(value, hi, hi_end)) [[unlikely]] {
    internal::FailRealRange(field, {}, lo, lo_end, hi, hi_end, value, note);
  }
  return value;
}

inline double CheckFiniteAtLeast(const Field& field, double value, double lo,
                                 End end = End::kClosed) {
  if (!std::isfinite(value) || !internal::Above(value, lo, end)) [[unlikely]] {
    internal::FailReal(field, "finite and ", end == End::kClosed ? ">= " : "> ", lo, value);
  }
  return value;
}

inline double CheckFiniteInRange(const Field& field, double value, double lo, End lo_end, double hi,
                                 End hi_end, std::string_view note = {}) {
  if (!std::isfinite(value) || !internal::Above(value, lo, lo_end) ||
      !internal::Under(value, hi, hi_end)) [[unlikely]] {
    internal::FailRealRange(field, "finite and ", lo, lo_end, hi, hi_end, value, note);
  }
  return value;
}

}  // namespace rlsched

#endif  // RLSCHED_COMMON_CHECK_H_
