#include "lengths_reader.h"

#include <fmt/format.h>

#include <charconv>
#include <cstddef>
#include <iterator>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>

#include "rlsched/balance/partition.h"
#include "rlsched/common/error.h"

namespace rlsched::app {
namespace {

constexpr std::string_view kByteOrderMark = "\xEF\xBB\xBF";

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f';
}

bool IsLetter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

std::string_view Trim(std::string_view s) {
  while (!s.empty() && IsSpace(s.front())) s.remove_prefix(1);
  while (!s.empty() && IsSpace(s.back())) s.remove_suffix(1);
  return s;
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

// At most kMaxEchoBytes of the input, for an error message ("…" marks a cut).
constexpr std::size_t kMaxEchoBytes = 80;
std::string Echo(std::string_view input) {
  if (input.size() <= kMaxEchoBytes) return std::string(input);
  return std::string(input.substr(0, kMaxEchoBytes)) + "…";
}

// A CSV header: some field (split at commas and whitespace, an opening quote aside)
// starts with a letter. "0x10" and "1e3" start with digits: numbers gone wrong, not
// names, so they are reported as not integers.
bool LooksLikeHeader(std::string_view line) {
  bool field_start = true;
  for (const char c : line) {
    if (c == ',' || IsSpace(c)) {
      field_start = true;
    } else if (field_start && c == '"') {
      continue;
    } else {
      if (field_start && IsLetter(c)) return true;
      field_start = false;
    }
  }
  return false;
}

[[noreturn]] void FailAt(std::int64_t line, std::string_view what) {
  Fail(fmt::format("line {}", line), what);
}

// std::getline() that stops at kMaxLineBytes: the next line of `in` (without its
// '\n') into `line`; false when nothing is left. Throws naming line `number` when the
// line is longer, having read at most kMaxLineBytes + 1 of its bytes.
bool ReadLine(std::istream& in, std::string& line, std::int64_t number) {
  line.clear();
  const std::istream::sentry sentry(in, /*noskipws=*/true);
  if (!sentry) return false;
  std::streambuf& buffer = *in.rdbuf();
  for (bool extracted = false;; extracted = true) {
    const int c = buffer.sbumpc();
    if (c == std::char_traits<char>::eof()) {
      in.setstate(extracted ? std::ios::eofbit : std::ios::eofbit | std::ios::failbit);
      return extracted;
    }
    if (c == '\n') return true;
    if (std::ssize(line) == kMaxLineBytes) {
      FailAt(number, fmt::format("longer than {} bytes", kMaxLineBytes));
    }
    line.push_back(static_cast<char>(c));
  }
}

// The integer spelled by all of `token`, or nullopt; `overflow` is set when it is an
// integer too large for int64.
std::optional<std::int64_t> ParseInteger(std::string_view token, bool& overflow) {
  overflow = false;
  std::int64_t value = 0;
  const char* end = token.data() + token.size();
  const auto [ptr, ec] = std::from_chars(token.data(), end, value);
  if (ptr != end || token.empty()) return std::nullopt;
  if (ec == std::errc::result_out_of_range) {
    overflow = true;
    return std::nullopt;
  }
  if (ec != std::errc()) return std::nullopt;
  return value;
}

// Collects lengths and enforces the count and value bounds.
class Collector {
 public:
  explicit Collector(std::int64_t max_lengths) : max_lengths_(max_lengths) {}

  void AddLength(std::int64_t line, std::int64_t length, std::string_view what) {
    if (length < 0 || length > balance::kMaxLength) {
      FailAt(line, fmt::format("{} {} must be in [0, {}]", what, length, balance::kMaxLength));
    }
    if (static_cast<std::int64_t>(input_.lengths.size()) >= max_lengths_) {
      FailAt(line, fmt::format("more than {} lengths", max_lengths_));
    }
    input_.lengths.push_back(length);
  }
  void AddGroup(std::int64_t line, std::int64_t group) {
    if (group < 0) FailAt(line, fmt::format("group {} must be >= 0", group));
    input_.groups.push_back(group);
  }
  LengthsInput Finish() {
    if (input_.lengths.empty()) Fail("", "no lengths");
    return std::move(input_);
  }

 private:
  std::int64_t max_lengths_;
  LengthsInput input_;
};

// A plain line: integers separated by whitespace.
void ParsePlainLine(std::int64_t line_number, std::string_view line, Collector& collector) {
  std::size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && IsSpace(line[i])) ++i;
    std::size_t j = i;
    while (j < line.size() && !IsSpace(line[j])) ++j;
    if (j == i) break;
    const std::string_view token = line.substr(i, j - i);
    bool overflow = false;
    const std::optional<std::int64_t> value = ParseInteger(token, overflow);
    if (overflow) {
      FailAt(line_number,
             fmt::format("length {} must be in [0, {}]", Echo(token), balance::kMaxLength));
    }
    if (!value) FailAt(line_number, fmt::format("'{}' is not an integer", Echo(token)));
    collector.AddLength(line_number, *value, "length");
    i = j;
  }
}

// Splits a CSV line into trimmed fields; double quotes group text with commas, and
// "" inside quotes is a literal quote.
std::vector<std::string> SplitCsv(std::int64_t line_number, std::string_view line) {
  std::vector<std::string> fields;
  std::string field;
  bool in_quotes = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (in_quotes) {
      if (c != '"') {
        field += c;
      } else if (i + 1 < line.size() && line[i + 1] == '"') {
        field += '"';
        ++i;
      } else {
        in_quotes = false;
      }
    } else if (c == '"') {
      in_quotes = true;
    } else if (c == ',') {
      fields.emplace_back(Trim(field));
      field.clear();
    } else {
      field += c;
    }
  }
  if (in_quotes) FailAt(line_number, "unterminated quoted field");
  fields.emplace_back(Trim(field));
  return fields;
}

// The columns of a CSV header that the reader uses.
struct CsvLayout {
  std::size_t num_fields = 0;
  std::vector<std::size_t> length_columns;  // summed
  std::vector<std::string> length_names;
  std::optional<std::size_t> group_column;
};

CsvLayout ParseHeader(std::int64_t line_number, std::string_view line, LengthColumn column) {
  const std::vector<std::string> names = SplitCsv(line_number, line);
  auto find = [&](std::string_view name) -> std::optional<std::size_t> {
    std::optional<std::size_t> found;
    for (std::size_t i = 0; i < names.size(); ++i) {
      if (Lower(names[i]) != name) continue;
      if (found) FailAt(line_number, fmt::format("duplicate column '{}'", Echo(name)));
      found = i;
    }
    return found;
  };
  CsvLayout layout;
  layout.num_fields = names.size();
  const std::optional<std::size_t> prompt = find("prompt_tokens");
  const std::optional<std::size_t> response = find("response_tokens");
  const std::optional<std::size_t> length = find("length");
  const std::optional<std::size_t> tokens = find("tokens");
  if (column == LengthColumn::kResponse && response) {
    layout.length_columns = {*response};
    layout.length_names = {"response_tokens"};
  } else if (prompt && response) {
    layout.length_columns = {*prompt, *response};
    layout.length_names = {"prompt_tokens", "response_tokens"};
  } else if (length) {
    layout.length_columns = {*length};
    layout.length_names = {"length"};
  } else if (tokens) {
    layout.length_columns = {*tokens};
    layout.length_names = {"tokens"};
  } else {
    FailAt(line_number,
           "the header has no length column: need 'prompt_tokens' and 'response_tokens', "
           "'length' or 'tokens'");
  }
  layout.group_column = find("group");
  return layout;
}

std::int64_t ParseCell(std::int64_t line_number, const std::string& cell, std::string_view column,
                       bool& overflow) {
  const std::optional<std::int64_t> value = ParseInteger(cell, overflow);
  if (overflow) return 0;
  if (!value) {
    FailAt(line_number, fmt::format("column '{}': '{}' is not an integer", column, Echo(cell)));
  }
  return *value;
}

void ParseCsvRow(std::int64_t line_number, std::string_view line, const CsvLayout& layout,
                 Collector& collector) {
  const std::vector<std::string> fields = SplitCsv(line_number, line);
  if (fields.size() != layout.num_fields) {
    FailAt(line_number, fmt::format("expected {} fields (as in the header), got {}",
                                    layout.num_fields, fields.size()));
  }
  std::int64_t length = 0;
  for (std::size_t c = 0; c < layout.length_columns.size(); ++c) {
    const std::string_view name = layout.length_names[c];
    bool overflow = false;
    const std::int64_t value =
        ParseCell(line_number, fields[layout.length_columns[c]], name, overflow);
    if (overflow || value < 0 || value > balance::kMaxLength) {
      FailAt(line_number, fmt::format("{} {} must be in [0, {}]", name,
                                      Echo(fields[layout.length_columns[c]]), balance::kMaxLength));
    }
    length += value;  // at most 2 * 2^31: no overflow
  }
  const std::string what =
      layout.length_columns.size() == 1 ? "length" : "length (prompt_tokens + response_tokens)";
  collector.AddLength(line_number, length, what);
  if (layout.group_column) {
    bool overflow = false;
    const std::int64_t group =
        ParseCell(line_number, fields[*layout.group_column], "group", overflow);
    if (overflow) {
      FailAt(line_number,
             fmt::format("group {} does not fit in int64", Echo(fields[*layout.group_column])));
    }
    collector.AddGroup(line_number, group);
  }
}

}  // namespace

LengthsInput ReadLengths(std::istream& in, std::int64_t max_lengths, LengthColumn column) {
  Collector collector(max_lengths);
  std::optional<CsvLayout> csv;
  bool seen_content = false;
  std::string line;
  for (std::int64_t line_number = 1; ReadLine(in, line, line_number); ++line_number) {
    std::string_view view = line;
    if (line_number == 1 && view.starts_with(kByteOrderMark)) {
      view.remove_prefix(kByteOrderMark.size());
    }
    if (Trim(view).empty()) continue;
    if (!seen_content) {
      seen_content = true;
      if (LooksLikeHeader(view)) {
        csv = ParseHeader(line_number, view, column);
        continue;
      }
    }
    if (csv) {
      ParseCsvRow(line_number, view, *csv, collector);
    } else {
      ParsePlainLine(line_number, view, collector);
    }
  }
  if (in.bad()) throw std::runtime_error("error while reading the lengths");
  return collector.Finish();
}

LengthsInput ParseLengths(std::string_view text, std::int64_t max_lengths, LengthColumn column) {
  std::istringstream in{std::string(text)};
  return ReadLengths(in, max_lengths, column);
}

}  // namespace rlsched::app
