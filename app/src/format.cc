#include "format.h"

#include <fmt/format.h>

#include <cmath>

namespace rlsched::app {

std::string FormatDuration(double seconds) {
  if (seconds == 0.0) return "0 s";
  if (seconds >= 100.0) return fmt::format("{:.0f} s", seconds);
  if (seconds >= 1.0) return fmt::format("{:.2f} s", seconds);
  return fmt::format("{:.3g} s", seconds);
}

std::string FormatRatio(double ratio) {
  if (!std::isfinite(ratio) || ratio < 0.0) return "n/a";
  return ratio >= 100.0 ? fmt::format("{:.0f}×", ratio) : fmt::format("{:.2f}×", ratio);
}

std::string FormatPercent(double fraction) {
  const double percent = fraction * 100.0;
  if (percent == 0.0) return "0%";
  if (std::fabs(percent) >= 0.01) return fmt::format("{:.2f}%", percent);
  return fmt::format("{:.2g}%", percent);
}

std::string FormatCount(double count) {
  if (count >= 1e9) return fmt::format("{:.2f} B", count / 1e9);
  if (count >= 1e6) return fmt::format("{:.2f} M", count / 1e6);
  return fmt::format("{:.0f}", count);
}

std::string FormatBytes(std::int64_t bytes) {
  return fmt::format("{:.2f} GB ({} bytes)", static_cast<double>(bytes) / 1e9, bytes);
}

}  // namespace rlsched::app
