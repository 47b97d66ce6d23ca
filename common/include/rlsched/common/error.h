// The errors every rlsched library raises.
//
// A caller's input that breaks a documented requirement raises FieldError: a
// std::invalid_argument that carries the path of the offending field ("lengths[3]",
// "cost.model.hidden_size", "train.tp") and, when the requirement is a bound, the bound
// and the value that broke it. Its what() is "<field>: <requirement>", the text the CLI
// prints; the daemon copies field() into its Error reply (rlsched.v1.Error.field), so
// nobody parses a message to find the field. A broken internal invariant (a bug in
// rlsched, never the caller's input) raises std::logic_error through RLSCHED_CHECK().

#ifndef RLSCHED_COMMON_ERROR_H_
#define RLSCHED_COMMON_ERROR_H_

#include <concepts>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace rlsched {

class FieldError : public std::invalid_argument {
 public:
  // what() = "<field>: <requirement>"; field may be empty (then what() = requirement).
  FieldError(std::string field, std::string requirement);
  // A bound: requirement = "must be <bound>, got <value>" (bound e.g. ">= 1",
  // "in [1, 1048576]", "<= 2^31").
  FieldError(std::string field, std::string bound, std::string value);

  // The path of the offending field, relative to the options or message the function
  // that raised it takes ("num_parts", "model.hidden_size"); empty when no one field is at
  // fault.
  const std::string& field() const noexcept { return field_; }
  // The message after "<field>: ".
  const std::string& requirement() const noexcept { return requirement_; }
  // For a bound: the bound and the value that broke it; empty otherwise.
  const std::string& bound() const noexcept { return bound_; }
  const std::string& value() const noexcept { return value_; }

  // The same error with its field under `parent` ("cost" + "model.hidden_size" ->
  // "cost.model.hidden_size"; "lengths" + "[3]" -> "lengths[3]"): how a caller that
  // passed the field inside a larger request reports it in the request's terms.
  FieldError Within(std::string_view parent) const;
  // The same error with another field path (a CLI flag, a renamed wire field).
  FieldError Renamed(std::string field) const;

 private:
  FieldError(std::string field, std::string requirement, std::string bound, std::string value);

  std::string field_;
  std::string requirement_;
  std::string bound_;
  std::string value_;
};

// A long computation stopped because its caller's stop check said so (e.g. a daemon's
// per-request deadline); not the caller's input and not a bug.
class Stopped : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Throws FieldError(field, requirement).
[[noreturn]] void Fail(std::string_view field, std::string_view requirement);

// Throws FieldError(field, bound, value): "<field>: must be <bound>, got <value>".
[[noreturn]] void FailBound(std::string_view field, std::string_view bound, std::string_view value);
template <class T>
requires std::integral<T> || std::floating_point<T>
[[noreturn]] void FailBound(std::string_view field, std::string_view bound, T value);

// The text FailBound() prints for a number: integers, and whole reals below 10^16, in full
// ("1000000"); other reals in the shortest form that reads back to the same double
// ("0.25", "1e+300", "inf", "nan").
std::string NumberText(std::int64_t value);
std::string NumberText(std::uint64_t value);
std::string NumberText(double value);

namespace internal {
[[noreturn]] void FailCheck(const char* condition, const char* file, int line);
}  // namespace internal

}  // namespace rlsched

template <class T>
requires std::integral<T> || std::floating_point<T>
[[noreturn]] void rlsched::FailBound(std::string_view field, std::string_view bound, T value) {
  if constexpr (std::floating_point<T>) {
    FailBound(field, bound, std::string_view(NumberText(static_cast<double>(value))));
  } else if constexpr (std::signed_integral<T>) {
    FailBound(field, bound, std::string_view(NumberText(static_cast<std::int64_t>(value))));
  } else {
    FailBound(field, bound, std::string_view(NumberText(static_cast<std::uint64_t>(value))));
  }
}

// An internal invariant: throws std::logic_error("rlsched internal error at
// <file>:<line>: <condition>") when `condition` is false. Cheap checks only; for a bug,
// never for the caller's input (that is Fail()).
#define RLSCHED_CHECK(condition)                                      \
  do {                                                                \
    if (!(condition)) {                                               \
      ::rlsched::internal::FailCheck(#condition, __FILE__, __LINE__); \
    }                                                                 \
  } while (false)

#endif  // RLSCHED_COMMON_ERROR_H_
