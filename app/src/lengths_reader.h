// lengths_reader.h — sequence lengths from text.
//
// Overview
//   Reads the input of `rlsched balance`. Two formats, told apart by the first
//   non-empty line:
//   - Plain: integers separated by whitespace (one per line, or several per line).
//   - CSV with a header (the first non-empty line contains a letter): columns are
//     found by name. The length is `prompt_tokens + response_tokens` when both
//     columns exist, else the `length` column, else the `tokens` column; an optional
//     `group` column gives each sequence's group id. Other columns are ignored.
//     Fields may be double-quoted; names are matched case-insensitively.
//   With LengthColumn::kResponse a CSV's `response_tokens` column alone is the
//   length when it exists (the simulator's response lengths).
//   Blank lines are skipped; a UTF-8 byte order mark and '\r' line ends are accepted.
//
// Example
//   std::istringstream in("group,prompt_tokens,response_tokens\n0,72,170\n0,72,193\n");
//   rlsched::app::LengthsInput input = rlsched::app::ReadLengths(in);
//   // input.lengths == {242, 265}, input.groups == {0, 0}
//
// Thread-safety: pure apart from reading the given stream.

#ifndef RLSCHED_APP_LENGTHS_READER_H_
#define RLSCHED_APP_LENGTHS_READER_H_

#include <cstdint>
#include <istream>
#include <string_view>
#include <vector>

#include "rlsched/balance/partition.h"

namespace rlsched::app {

// Which CSV columns make the length.
enum class LengthColumn {
  kSequence,  // prompt_tokens + response_tokens, else length, else tokens
  kResponse,  // response_tokens when present, else as kSequence
};

struct LengthsInput {
  std::vector<std::int64_t> lengths;  // each in [0, 2^31]
  std::vector<std::int64_t> groups;   // empty, or one id >= 0 per length
};

// The longest line ReadLengths() reads, '\n' excluded: 16 MiB (over a million lengths
// on one line; a longer line is refused as soon as its bytes pass the bound).
inline constexpr std::int64_t kMaxLineBytes = std::int64_t{16} << 20;

// Parses `in` to its end (see the file comment). Throws std::invalid_argument naming
// the line (1-based) and the bound for: a line longer than kMaxLineBytes, a token that
// is not an integer, a CSV header without a length column, a row with the wrong number
// of fields, a negative length or group, a length above 2^31, more than 100,000,000
// lengths, and an input without any length ("no lengths"). `max_lengths` lowers the
// entry limit. Throws std::runtime_error if the stream fails. O(size of the input);
// memory O(lengths + kMaxLineBytes) whatever the input.
LengthsInput ReadLengths(std::istream& in, std::int64_t max_lengths = balance::kMaxItems,
                         LengthColumn column = LengthColumn::kSequence);

// ReadLengths() over a string.
LengthsInput ParseLengths(std::string_view text, std::int64_t max_lengths = balance::kMaxItems,
                          LengthColumn column = LengthColumn::kSequence);

}  // namespace rlsched::app

#endif  // RLSCHED_APP_LENGTHS_READER_H_
