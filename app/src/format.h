// format.h — how the program prints durations, ratios, percentages, counts and bytes.
//
// One rule each, for every command's summary:
//   FormatDuration  0 s, 120 s (>= 100 s: no decimals), 1.50 s, 0.25 s, 1.25e-05 s
//   FormatRatio     1.23×, 340× (>= 100: no decimals); n/a when not finite or negative
//   FormatPercent   3.60% (two decimals), 0% for zero, 0.0012% (two digits) below 0.01%
//   FormatCount     999, 1.23 M, 4.56 B
//   FormatBytes     1.23 GB (1234567890 bytes)

#ifndef RLSCHED_APP_FORMAT_H_
#define RLSCHED_APP_FORMAT_H_

#include <cstdint>
#include <string>

namespace rlsched::app {

std::string FormatDuration(double seconds);
std::string FormatRatio(double ratio);
std::string FormatPercent(double fraction);  // of a fraction: 0.036 -> "3.60%"
std::string FormatCount(double count);
std::string FormatBytes(std::int64_t bytes);

}  // namespace rlsched::app

#endif  // RLSCHED_APP_FORMAT_H_
