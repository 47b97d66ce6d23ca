#include "rlsched/workload/workload.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>
#include <string>

#include "rlsched/common/check.h"
#include "rlsched/common/error.h"

namespace rlsched::workload {
namespace {

std::int64_t Response(Rng& rng) {
  const double value = std::exp(kResponseMu + kResponseSigma * rng.Normal());
  return std::clamp<std::int64_t>(std::llround(std::min(value, 1e12)), 1, kMaxResponseTokens);
}

}  // namespace

std::uint64_t Rng::Next() {
  std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

std::int64_t Rng::UniformInt(std::int64_t lo, std::int64_t hi) {
  const std::uint64_t span = static_cast<std::uint64_t>(hi) - static_cast<std::uint64_t>(lo) + 1;
  if (span == 0) return static_cast<std::int64_t>(Next());  // the full 64-bit range
  // Rejection sampling keeps the draw exactly uniform.
  const std::uint64_t limit = ~std::uint64_t{0} - (~std::uint64_t{0} % span + 1) % span;
  std::uint64_t x = Next();
  while (x > limit) x = Next();
  return static_cast<std::int64_t>(static_cast<std::uint64_t>(lo) + x % span);
}

double Rng::UniformReal() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

double Rng::Normal() {
  const double u1 = 1.0 - UniformReal();  // (0, 1]
  const double u2 = UniformReal();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

std::vector<std::int64_t> HeavyTailedLengths(std::int64_t n, std::uint64_t seed) {
  CheckAtLeast("n", n, 0);
  Rng rng(seed);
  std::vector<std::int64_t> lengths(static_cast<std::size_t>(n));
  for (auto& length : lengths) {
    const std::int64_t prompt = rng.UniformInt(kMinPromptTokens, kMaxPromptTokens);
    length = prompt + Response(rng);
  }
  return lengths;
}

SyntheticBatch GrpoBatch(std::int64_t prompts, std::int64_t samples, std::uint64_t seed) {
  CheckAtLeast("prompts", prompts, 0);
  CheckAtLeast("samples", samples, 0);
  Rng rng(seed);
  SyntheticBatch batch;
  batch.lengths.reserve(static_cast<std::size_t>(prompts * samples));
  batch.groups.reserve(static_cast<std::size_t>(prompts * samples));
  for (std::int64_t p = 0; p < prompts; ++p) {
    const std::int64_t prompt = rng.UniformInt(kMinPromptTokens, kMaxPromptTokens);
    for (std::int64_t s = 0; s < samples; ++s) {
      batch.lengths.push_back(prompt + Response(rng));
      batch.groups.push_back(p);
    }
  }
  return batch;
}

}  // namespace rlsched::workload
