#include "rlsched/common/check.h"

#include <limits>
#include <string>

#include "rlsched/common/error.h"

namespace rlsched {
namespace {

// "<bound>" or "<bound> <note>".
std::string WithNote(std::string bound, std::string_view note) {
  if (!note.empty()) (bound += ' ') += note;
  return bound;
}

}  // namespace

std::string Field::Path() const {
  std::string path(name_);
  if (index_) path += "[" + std::to_string(*index_) + "]";
  path += suffix_;
  return path;
}

std::string Limit::Text() const { return name.empty() ? NumberText(value) : std::string(name); }

std::int64_t ZeroMeansOne(const Field& field, std::int64_t value, std::int64_t max) {
  if (max == std::numeric_limits<std::int64_t>::max()) {
    CheckAtLeast(field, value, 0, "(0 means 1)");
  } else {
    CheckInRange(field, value, 0, max, "(0 means 1)");
  }
  return value == 0 ? 1 : value;
}

namespace internal {

void FailInt(const Field& field, std::string_view op, const Limit& limit, std::int64_t value,
             std::string_view note) {
  FailBound(field.Path(), WithNote(std::string(op) + limit.Text(), note), value);
}

void FailInRange(const Field& field, const Limit& lo, const Limit& hi, char close,
                 std::int64_t value, std::string_view note) {
  FailBound(field.Path(), WithNote("in [" + lo.Text() + ", " + hi.Text() + close, note), value);
}

void FailRelation(const Field& field, std::string_view relation, std::string_view what,
                  std::int64_t n, std::int64_t value) {
  Fail(field.Path(), "must " + std::string(relation) + " " + std::string(what) + " (" +
                         NumberText(n) + "), got " + NumberText(value));
}

void FailReal(const Field& field, std::string_view prefix, std::string_view op, double limit,
              double value) {
  std::string bound(prefix);
  if (!op.empty()) bound += std::string(op) + NumberText(limit);
  FailBound(field.Path(), bound, value);
}

void FailRealRange(const Field& field, std::string_view prefix, double lo, End lo_end, double hi,
                   End hi_end, double value, std::string_view note) {
  const std::string range = std::string(prefix) + "in " + (lo_end == End::kClosed ? "[" : "(") +
                            NumberText(lo) + ", " + NumberText(hi) +
                            (hi_end == End::kClosed ? "]" : ")");
  FailBound(field.Path(), WithNote(range, note), value);
}

}  // namespace internal
}  // namespace rlsched
