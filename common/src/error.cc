#include "rlsched/common/error.h"

#include <charconv>
#include <cmath>
#include <system_error>
#include <utility>

namespace rlsched {
namespace {

std::string WhatOf(const std::string& field, const std::string& requirement) {
  if (field.empty()) return requirement;
  return field + ": " + requirement;
}

std::string BoundRequirement(const std::string& bound, const std::string& value) {
  return "must be " + bound + ", got " + value;
}

}  // namespace

FieldError::FieldError(std::string field, std::string requirement, std::string bound,
                       std::string value)
    : std::invalid_argument(WhatOf(field, requirement)),
      field_(std::move(field)),
      requirement_(std::move(requirement)),
      bound_(std::move(bound)),
      value_(std::move(value)) {}

FieldError::FieldError(std::string field, std::string requirement)
    : FieldError(std::move(field), std::move(requirement), {}, {}) {}

FieldError::FieldError(std::string field, std::string bound, std::string value)
    : FieldError(std::move(field), BoundRequirement(bound, value), bound, value) {}

FieldError FieldError::Within(std::string_view parent) const {
  std::string path(parent);
  if (!path.empty() && !field_.empty() && field_.front() != '[') path += '.';
  path += field_;
  return Renamed(std::move(path));
}

FieldError FieldError::Renamed(std::string field) const {
  return FieldError(std::move(field), requirement_, bound_, value_);
}

void Fail(std::string_view field, std::string_view requirement) {
  throw FieldError(std::string(field), std::string(requirement));
}

void FailBound(std::string_view field, std::string_view bound, std::string_view value) {
  throw FieldError(std::string(field), std::string(bound), std::string(value));
}

std::string NumberText(std::int64_t value) { return std::to_string(value); }
std::string NumberText(std::uint64_t value) { return std::to_string(value); }

std::string NumberText(double value) {
  char buffer[32];
  // Whole numbers below 10^16 in full ("1000000", not "1e+06"), as bounds are written.
  const bool whole = std::abs(value) < 1e16 && value == std::trunc(value);
  const auto [end, ec] =
      whole ? std::to_chars(buffer, buffer + sizeof buffer, value, std::chars_format::fixed)
            : std::to_chars(buffer, buffer + sizeof buffer, value);
  if (ec != std::errc()) return "?";
  return std::string(buffer, end);
}

namespace internal {

void FailCheck(const char* condition, const char* file, int line) {
  throw std::logic_error(std::string("rlsched internal error at ") + file + ":" +
                         std::to_string(line) + ": " + condition);
}

}  // namespace internal
}  // namespace rlsched
