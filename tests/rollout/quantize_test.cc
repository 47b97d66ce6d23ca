// QuantizeBlock128(), E4m3Code() and DivideF32() against a reference written here from
// the definition: the block scale as amax / 448 in float32 division, the codes the
// nearest of e4m3's 127 non-negative values by exhaustive search (ties to the even code,
// 448 past it), on hand cases and on seeded random shapes and values of every binade;
// and the same bytes with flush-to-zero and denormals-are-zero set (x86).

#include "rlsched/rollout/quantize.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "rlsched/common/error.h"

#if defined(__SSE2__)
#include <xmmintrin.h>
#endif

namespace rlsched::rollout {
namespace {

// e4m3's non-negative finite values, in code order (0x00 .. 0x7E).
std::array<double, 127> E4m3Values() {
  std::array<double, 127> values{};
  for (int code = 0; code < 127; ++code) {
    const int exponent = code >> 3, mantissa = code & 7;
    values[static_cast<std::size_t>(code)] =
        exponent == 0 ? std::ldexp(mantissa, -9) : std::ldexp(8 + mantissa, exponent - 10);
  }
  return values;
}

// The e4m3 code of y by exhaustive search: the nearest value (ties to the even code),
// 448 for anything beyond it, the sign bit from y's sign (also for -0).
std::uint8_t ReferenceCode(float y) {
  static const std::array<double, 127> values = E4m3Values();
  const double magnitude = std::fabs(static_cast<double>(y));
  int best = 126;
  if (magnitude < 448.0) {
    double best_distance = std::numeric_limits<double>::infinity();
    for (int code = 0; code < 127; ++code) {
      const double distance = std::fabs(magnitude - values[static_cast<std::size_t>(code)]);
      if (distance < best_distance || (distance == best_distance && code % 2 == 0)) {
        best = code;
        best_distance = distance;
      }
    }
  }
  return static_cast<std::uint8_t>(best | (std::signbit(y) ? 0x80 : 0));
}

std::uint32_t Bits(float f) { return std::bit_cast<std::uint32_t>(f); }
float Float(std::uint32_t bits) { return std::bit_cast<float>(bits); }

// The element types as stored, and their values.
float Decode(ElementType type, std::uint32_t stored) {
  switch (type) {
    case ElementType::kBf16:
      return Float(stored << 16);
    case ElementType::kF32:
      return Float(stored);
    case ElementType::kF16: {
      const bool negative = (stored & 0x8000u) != 0;
      const int exponent = static_cast<int>((stored >> 10) & 0x1F);
      const int mantissa = static_cast<int>(stored & 0x3FF);
      double v = exponent == 0    ? std::ldexp(mantissa, -24)
                 : exponent == 31 ? (mantissa == 0 ? std::numeric_limits<double>::infinity()
                                                   : std::numeric_limits<double>::quiet_NaN())
                                  : std::ldexp(1024 + mantissa, exponent - 25);
      return static_cast<float>(negative ? -v : v);
    }
  }
  return 0.0f;
}

// v stored in `type`, rounded toward zero (v finite; f16: below 65520 in magnitude).
std::uint32_t Encode(ElementType type, double v) {
  if (type == ElementType::kF32) return Bits(static_cast<float>(v));
  if (type == ElementType::kBf16) return Bits(static_cast<float>(v)) >> 16;
  const std::uint32_t sign = std::signbit(v) ? 0x8000u : 0u;
  const double a = std::fabs(v);
  if (a < std::ldexp(1.0, -14)) return sign | static_cast<std::uint32_t>(std::ldexp(a, 24));
  int e = 0;
  const double m = std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1)
  const auto mantissa = static_cast<std::uint32_t>(std::ldexp(m, 11)) - 1024u;
  return sign | (static_cast<std::uint32_t>(e - 1 + 15) << 10) | mantissa;
}

struct Quantized {
  std::vector<std::uint8_t> codes;
  std::vector<float> scales;
};

// The definition, in plain float32 arithmetic (under the default floating-point mode).
Quantized Reference(ElementType type, const std::vector<std::uint32_t>& x, std::int64_t matrices,
                    std::int64_t rows, std::int64_t cols) {
  const std::int64_t rb = (rows + 127) / 128, cb = (cols + 127) / 128;
  Quantized q{std::vector<std::uint8_t>(x.size()),
              std::vector<float>(static_cast<std::size_t>(matrices * rb * cb))};
  for (std::int64_t m = 0; m < matrices; ++m) {
    for (std::int64_t i = 0; i < rb; ++i) {
      for (std::int64_t j = 0; j < cb; ++j) {
        auto at = [&](std::int64_t r, std::int64_t c) {
          return static_cast<std::size_t>((m * rows + r) * cols + c);
        };
        const std::int64_t r1 = std::min(rows, i * 128 + 128), c1 = std::min(cols, j * 128 + 128);
        float amax = 0.0f;
        for (std::int64_t r = i * 128; r < r1; ++r) {
          for (std::int64_t c = j * 128; c < c1; ++c) {
            amax = std::max(amax, std::fabs(Decode(type, x[at(r, c)])));
          }
        }
        const float scale = amax == 0.0f ? 1.0f : amax / 448.0f;
        q.scales[static_cast<std::size_t>((m * rb + i) * cb + j)] = scale;
        for (std::int64_t r = i * 128; r < r1; ++r) {
          for (std::int64_t c = j * 128; c < c1; ++c) {
            q.codes[at(r, c)] = ReferenceCode(Decode(type, x[at(r, c)]) / scale);
          }
        }
      }
    }
  }
  return q;
}

// The instruction sets whose loops this build and CPU can run (the baseline always).
std::vector<internal::QuantizeIsa> AvailableIsas() {
  std::vector<internal::QuantizeIsa> isas;
  for (const internal::QuantizeIsa isa :
       {internal::QuantizeIsa::kBaseline, internal::QuantizeIsa::kAvx2,
        internal::QuantizeIsa::kAvx512}) {
    if (internal::QuantizeIsaAvailable(isa)) isas.push_back(isa);
  }
  return isas;
}

const char* IsaName(internal::QuantizeIsa isa) {
  switch (isa) {
    case internal::QuantizeIsa::kBaseline:
      return "baseline";
    case internal::QuantizeIsa::kAvx2:
      return "avx2";
    case internal::QuantizeIsa::kAvx512:
      return "avx512";
  }
  return "?";
}

// x (stored values, one per element) through QuantizeBlock128 (with `isa`'s loops, else
// those it chooses for this CPU).
Quantized Quantise(ElementType type, const std::vector<std::uint32_t>& x, std::int64_t matrices,
                   std::int64_t rows, std::int64_t cols,
                   std::optional<internal::QuantizeIsa> isa = std::nullopt) {
  const std::int64_t rb = (rows + 127) / 128, cb = (cols + 127) / 128;
  Quantized q{std::vector<std::uint8_t>(x.size(), 0xAB),
              std::vector<float>(static_cast<std::size_t>(matrices * rb * cb), -7.0f)};
  const auto run = [&isa](const void* in, ElementType t, std::int64_t m, std::int64_t r,
                          std::int64_t c, std::uint8_t* codes, float* scales) {
    if (isa.has_value()) {
      internal::QuantizeBlock128With(*isa, in, t, m, r, c, codes, scales);
    } else {
      QuantizeBlock128(in, t, m, r, c, codes, scales);
    }
  };
  if (type == ElementType::kF32) {
    std::vector<float> f(x.size());
    std::transform(x.begin(), x.end(), f.begin(), Float);
    run(f.data(), type, matrices, rows, cols, q.codes.data(), q.scales.data());
  } else {
    std::vector<std::uint16_t> h(x.begin(), x.end());
    run(h.data(), type, matrices, rows, cols, q.codes.data(), q.scales.data());
  }
  return q;
}

std::vector<std::uint32_t> ScaleBits(const std::vector<float>& scales) {
  std::vector<std::uint32_t> bits(scales.size());
  std::transform(scales.begin(), scales.end(), bits.begin(), Bits);
  return bits;
}

// The first element where two code arrays differ, for messages.
std::string FirstDifference(const std::vector<std::uint8_t>& a, const std::vector<std::uint8_t>& b,
                            const std::vector<std::uint32_t>& x) {
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (a[i] != b[i]) {
      std::ostringstream text;
      text << "element " << i << " (stored 0x" << std::hex << x[i] << "): 0x" << int{a[i]}
           << " vs 0x" << int{b[i]};
      return text.str();
    }
  }
  return "sizes " + std::to_string(a.size()) + " vs " + std::to_string(b.size());
}

constexpr ElementType kTypes[] = {ElementType::kBf16, ElementType::kF16, ElementType::kF32};

const char* Name(ElementType type) {
  return type == ElementType::kBf16 ? "bf16" : type == ElementType::kF16 ? "f16" : "f32";
}

// ---------------------------------------------------------------------------------
// E4m3Code and DivideF32.

TEST(E4m3CodeTest, HandCases) {
  EXPECT_EQ(E4m3Code(Bits(448.0f)), 0x7E);
  EXPECT_EQ(E4m3Code(Bits(-448.0f)), 0xFE);
  for (float past : {448.0f + 0.03125f, 449.0f, 456.0f, 464.0f, 500.0f, 1e30f}) {
    EXPECT_EQ(E4m3Code(Bits(past)), 0x7E) << past;  // saturated
    EXPECT_EQ(E4m3Code(Bits(-past)), 0xFE) << past;
  }
  EXPECT_EQ(E4m3Code(Bits(1.0f)), 0x38);
  EXPECT_EQ(E4m3Code(Bits(-1.0f)), 0xB8);
  EXPECT_EQ(E4m3Code(Bits(1.0625f)), 0x38);  // tie between 0x38 and 0x39: even
  EXPECT_EQ(E4m3Code(Bits(1.1875f)), 0x3A);  // tie between 0x39 and 0x3A: even
  EXPECT_EQ(E4m3Code(Bits(std::nextafter(1.0625f, 2.0f))), 0x39);
  EXPECT_EQ(E4m3Code(Bits(std::ldexp(1.0f, -9))), 0x01);    // the least subnormal
  EXPECT_EQ(E4m3Code(Bits(std::ldexp(1.0f, -10))), 0x00);   // its half: to even, 0
  EXPECT_EQ(E4m3Code(Bits(std::ldexp(-1.0f, -10))), 0x80);  // the sign kept
  EXPECT_EQ(E4m3Code(Bits(std::ldexp(3.0f, -10))), 0x02);   // tie between 1 and 2 x 2^-9
  EXPECT_EQ(E4m3Code(Bits(std::ldexp(1.0f, -6))), 0x08);    // the least normal
  EXPECT_EQ(E4m3Code(Bits(std::ldexp(15.0f, -10))), 0x08);  // tie between 7 and 8 x 2^-9
  EXPECT_EQ(E4m3Code(Bits(0.0f)), 0x00);
  EXPECT_EQ(E4m3Code(Bits(-0.0f)), 0x80);
  EXPECT_EQ(E4m3Code(0x00000001u), 0x00);  // float32 subnormals
  EXPECT_EQ(E4m3Code(0x80000001u), 0x80);
  // Non-finite values as executor.e4m3_bits's int32 arithmetic gives them.
  EXPECT_EQ(E4m3Code(0x7F800000u), 0x7E);
  EXPECT_EQ(E4m3Code(0xFF800000u), 0xFE);
  EXPECT_EQ(E4m3Code(0x7FC00000u), 0x7E);
  EXPECT_EQ(E4m3Code(0xFFC00000u), 0xFE);
  EXPECT_EQ(E4m3Code(0x7FFFFFFFu), 0x40);  // the sum wraps past 2^31
  EXPECT_EQ(E4m3Code(0xFFFFFFFFu), 0xC0);
}

TEST(E4m3CodeTest, MatchesTheNearestValueOnEveryValueMidpointAndRandomFloats) {
  std::vector<float> ys;
  const std::array<double, 127> values = E4m3Values();
  for (std::size_t i = 0; i < values.size(); ++i) {
    ys.push_back(static_cast<float>(values[i]));
    if (i + 1 < values.size()) {
      const auto mid = static_cast<float>((values[i] + values[i + 1]) / 2);
      ys.insert(ys.end(), {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)});
    }
  }
  std::mt19937_64 rng(20261201);
  std::uniform_int_distribution<std::uint32_t> finite(0, 0x7F7FFFFFu);
  std::uniform_real_distribution<double> binade(-160.0, 12.0);
  for (int i = 0; i < 300000; ++i) {
    ys.push_back(Float(finite(rng)));
    ys.push_back(static_cast<float>(std::exp2(binade(rng))));
  }
  for (const float y : ys) {
    ASSERT_EQ(E4m3Code(Bits(y)), ReferenceCode(y)) << y;
    ASSERT_EQ(E4m3Code(Bits(-y)), ReferenceCode(-y)) << -y;
  }
}

// Float32 bit patterns of every class: normal, subnormal, zero, infinite, NaN.
std::uint32_t RandomF32(std::mt19937_64& rng) {
  std::uniform_int_distribution<int> kind(0, 9);
  std::uniform_int_distribution<std::uint32_t> any;
  const std::uint32_t sign = any(rng) & 0x80000000u;
  switch (kind(rng)) {
    case 0:
      return sign | (any(rng) & 0x7FFFFFu);  // subnormal or zero
    case 1:
      return sign | (0x7F800000u + (any(rng) & 0x7FFFFFu));  // inf or NaN
    case 2:
      return sign | (0x00800000u + (any(rng) % 0x08000000u));  // just above subnormal
    default:
      return any(rng);
  }
}

TEST(DivideF32Test, MatchesTheHardwareDivision) {
  std::mt19937_64 rng(20261202);
  for (int i = 0; i < 2000000; ++i) {
    const std::uint32_t x = RandomF32(rng), s = RandomF32(rng);
    ASSERT_EQ(DivideF32(x, s), Bits(Float(x) / Float(s))) << std::hex << x << " / " << s;
  }
  // Quotients at float32's subnormal grid's midpoints and the least normal's edge.
  for (std::uint32_t m = 1; m < 5000; ++m) {
    for (const float s : {2.0f, 4.0f, 448.0f, 3.0f}) {
      const std::uint32_t x = m * 1234567u % 0x01000000u;
      ASSERT_EQ(DivideF32(x, Bits(s)), Bits(Float(x) / s)) << std::hex << x << " / " << s;
    }
  }
}

// ---------------------------------------------------------------------------------
// QuantizeBlock128: hand cases.

TEST(QuantizeBlock128Test, HandCasesInEveryElementType) {
  for (const ElementType type : kTypes) {
    SCOPED_TRACE(Name(type));
    // Two matrices of 130 x 260 (partial edge blocks: 2 x 3 scales each), zero but for:
    const std::int64_t rows = 130, cols = 260;
    std::vector<std::uint32_t> x(2 * rows * cols, Encode(type, 0.0));
    auto set = [&](std::int64_t m, std::int64_t r, std::int64_t c, double v) {
      x[static_cast<std::size_t>((m * rows + r) * cols + c)] = Encode(type, v);
    };
    // Block (0, 0, 0): amax 448, scale 1: codes as E4m3Code of the values.
    set(0, 0, 0, 448.0);
    set(0, 1, 1, -1.0);
    set(0, 2, 2, 1.0625);  // ties to even: 0x38
    set(0, 3, 3, 1.1875);  // 0x3A
    set(0, 4, 4, std::ldexp(1.0, -9));
    set(0, 5, 5, std::ldexp(1.0, -10));
    set(0, 6, 6, -std::ldexp(1.0, -10));
    set(0, 7, 7, std::ldexp(3.0, -10));
    x[static_cast<std::size_t>(8 * cols + 8)] = type == ElementType::kF32 ? 0x80000000u : 0x8000u;
    // Block (0, 1, 2) (rows 128-129, cols 256-259): amax 3, scale 3 / 448.
    set(0, 129, 259, -3.0);
    // Block (1, 0, 1): amax 896, scale 2.
    set(1, 5, 130, 896.0);
    set(1, 6, 131, 2.125);  // 1.0625 after the division: 0x38
    // Block (1, 1, 0): amax 2^-4, scale 2^-4 / 448; -2^-4 the largest magnitude.
    set(1, 128, 0, -0.0625);
    set(1, 129, 127, 0.03125);
    const Quantized q = Quantise(type, x, 2, rows, cols);
    ASSERT_EQ(q.scales.size(), 12u);
    for (const internal::QuantizeIsa isa : AvailableIsas()) {
      const Quantized other = Quantise(type, x, 2, rows, cols, isa);
      EXPECT_EQ(q.codes, other.codes) << IsaName(isa);
      EXPECT_EQ(ScaleBits(q.scales), ScaleBits(other.scales)) << IsaName(isa);
    }
    auto code = [&](std::int64_t m, std::int64_t r, std::int64_t c) {
      return q.codes[static_cast<std::size_t>((m * rows + r) * cols + c)];
    };
    auto scale = [&](std::int64_t m, std::int64_t i, std::int64_t j) {
      return q.scales[static_cast<std::size_t>((m * 2 + i) * 3 + j)];
    };
    EXPECT_EQ(scale(0, 0, 0), 1.0f);
    EXPECT_EQ(code(0, 0, 0), 0x7E);
    EXPECT_EQ(code(0, 1, 1), 0xB8);
    EXPECT_EQ(code(0, 2, 2), 0x38);
    EXPECT_EQ(code(0, 3, 3), 0x3A);
    EXPECT_EQ(code(0, 4, 4), 0x01);
    EXPECT_EQ(code(0, 5, 5), 0x00);
    EXPECT_EQ(code(0, 6, 6), 0x80);
    EXPECT_EQ(code(0, 7, 7), 0x02);
    EXPECT_EQ(code(0, 8, 8), 0x80);  // -0
    EXPECT_EQ(scale(0, 1, 2), 3.0f / 448.0f);
    EXPECT_EQ(code(0, 129, 259), 0xFE);  // -448
    EXPECT_EQ(scale(1, 0, 1), 2.0f);
    EXPECT_EQ(code(1, 5, 130), 0x7E);
    EXPECT_EQ(code(1, 6, 131), 0x38);
    EXPECT_EQ(scale(1, 1, 0), 0.0625f / 448.0f);
    EXPECT_EQ(code(1, 128, 0), 0xFE);
    EXPECT_EQ(code(1, 129, 127), ReferenceCode(0.03125f / (0.0625f / 448.0f)));
    // The all-zero blocks: scale 1, codes 0 (but the -0).
    int ones = 0;
    for (const float s : q.scales) ones += s == 1.0f ? 1 : 0;
    EXPECT_EQ(ones, 12 - 4 + 1);  // all but four blocks; block (0, 0, 0) too
    int nonzero = 0;
    for (const std::uint8_t c : q.codes) nonzero += c != 0 ? 1 : 0;
    EXPECT_EQ(nonzero, 13);
    const Quantized want = Reference(type, x, 2, rows, cols);
    EXPECT_EQ(q.codes, want.codes) << FirstDifference(q.codes, want.codes, x);
    EXPECT_EQ(ScaleBits(q.scales), ScaleBits(want.scales));
  }
}

TEST(QuantizeBlock128Test, ScalesThatAreNotNormalFloats) {
  // f32 and bf16 blocks whose scale underflows to 0, is subnormal (values past 448 after
  // the division: saturated), or is a normal float below 2^-116 (subnormal inputs whose
  // codes are not 0); an infinite value (scale inf); a NaN (scale 0x7FC00000, as torch's
  // amax gives it). Each in its own 128 x 128 block of one 128 x 896 matrix.
  for (const ElementType type : {ElementType::kF32, ElementType::kBf16}) {
    SCOPED_TRACE(Name(type));
    const bool f32 = type == ElementType::kF32;
    const std::int64_t rows = 128, cols = 7 * 128;
    std::vector<std::uint32_t> x(static_cast<std::size_t>(rows * cols), 0u);
    auto set = [&](std::int64_t block, std::int64_t r, std::int64_t c, std::uint32_t f32_bits) {
      x[static_cast<std::size_t>(r * cols + block * 128 + c)] = f32 ? f32_bits : f32_bits >> 16;
    };
    // Block 0: amax 2^-133 (a subnormal float32, bf16's least): 2^-133 / 448 = 2^-141 /
    // 1.75 rounds to the subnormal 146 x 2^-149; 2^-133 / scale is past 448.
    set(0, 0, 0, Bits(std::ldexp(1.0f, -133)));
    set(0, 1, 1, Bits(-std::ldexp(1.0f, -134)));
    set(0, 2, 2, Bits(std::ldexp(1.0f, -140)));
    // Block 1 (f32): amax 2^-149, amax / 448 underflows to 0: x / 0 is inf, 0 / 0 NaN.
    // (bf16's least magnitude, 2^-133, has a subnormal scale, as block 0.)
    set(1, 0, 0, f32 ? 1u : 0x00010000u);
    set(1, 3, 3, 0x80000000u);
    // Block 2: amax 2^-110 (scale 2^-110 / 448, normal, below 2^-116): a subnormal input
    // 2^-127 gives 2^-127 / scale = 448 x 2^-17: not code 0.
    set(2, 0, 0, Bits(std::ldexp(1.0f, -110)));
    set(2, 1, 1, Bits(std::ldexp(1.0f, -127)));
    set(2, 2, 2, Bits(-std::ldexp(3.0f, -128)));
    // Block 3: an infinity (scale inf).
    set(3, 0, 0, 0x7F800000u);
    set(3, 1, 1, 0xFF800000u);
    set(3, 2, 2, Bits(1.0f));
    // Block 4: NaNs of both signs among ordinary values.
    set(4, 0, 0, 0x7FC00000u);
    set(4, 1, 1, 0xFFC10000u);
    set(4, 2, 2, Bits(-5.0f));
    // Block 5: amax 2^-116 x 448 (scale 2^-116, the hot loop's least) with subnormals.
    set(5, 0, 0, Bits(std::ldexp(448.0f, -116)));
    set(5, 1, 1, Bits(std::ldexp(1.0f, -127)));
    // Block 6: ordinary values.
    set(6, 0, 0, Bits(7.0f));
    set(6, 1, 1, Bits(-0.5f));
    const Quantized q = Quantise(type, x, 1, rows, cols);
    const std::vector<std::uint32_t> s = ScaleBits(q.scales);
    auto code = [&](std::int64_t block, std::int64_t r, std::int64_t c) {
      return q.codes[static_cast<std::size_t>(r * cols + block * 128 + c)];
    };
    auto stored = [&](std::int64_t block, std::int64_t r, std::int64_t c) {
      return Bits(Decode(type, x[static_cast<std::size_t>(r * cols + block * 128 + c)]));
    };
    // The hardware's quotient, in this (default) mode.
    auto hardware = [](std::uint32_t xb, std::uint32_t sb) {
      return E4m3Code(Bits(Float(xb) / Float(sb)));
    };
    EXPECT_GT(s[0], 0u);
    EXPECT_LT(s[0], 0x00800000u);  // subnormal
    EXPECT_EQ(code(0, 0, 0), 0x7E);
    // (bf16 holds -2^-134 and 2^-140 as -0 and 0.)
    EXPECT_EQ(code(0, 1, 1), hardware(stored(0, 1, 1), s[0]));
    EXPECT_EQ(code(0, 1, 1), f32 ? 0xF6 : 0x80);
    EXPECT_EQ(code(0, 2, 2), ReferenceCode(Float(stored(0, 2, 2)) / Float(s[0])));
    EXPECT_EQ(s[1], f32 ? 0u : s[0]);
    EXPECT_EQ(code(1, 0, 0), 0x7E);                                    // inf, or 448
    EXPECT_EQ(code(1, 3, 3), f32 ? hardware(0x80000000u, 0u) : 0x80);  // NaN: x86 0xFE
    EXPECT_EQ(code(1, 5, 5), f32 ? hardware(0u, 0u) : 0x00);
    EXPECT_EQ(s[2], Bits(std::ldexp(1.0f, -110) / 448.0f));
    EXPECT_NE(code(2, 1, 1), 0);
    EXPECT_EQ(code(2, 1, 1), ReferenceCode(std::ldexp(1.0f, -127) / Float(s[2])));
    EXPECT_EQ(code(2, 2, 2), ReferenceCode(-std::ldexp(3.0f, -128) / Float(s[2])));
    EXPECT_EQ(s[3], 0x7F800000u);
    EXPECT_EQ(code(3, 0, 0), hardware(0x7F800000u, s[3]));  // inf / inf: NaN
    EXPECT_EQ(code(3, 1, 1), hardware(0xFF800000u, s[3]));
    EXPECT_EQ(code(3, 2, 2), 0x00);
    EXPECT_EQ(code(3, 3, 3), 0x00);
    EXPECT_EQ(s[4], 0x7FC00000u);
    EXPECT_EQ(code(4, 0, 0), 0x7E);
    EXPECT_EQ(code(4, 1, 1), 0xFE);  // the NaN's own sign
    EXPECT_EQ(code(4, 2, 2), 0x7E);  // x / NaN: the scale's NaN
    EXPECT_EQ(code(4, 3, 3), 0x7E);
    EXPECT_EQ(s[5], Bits(std::ldexp(1.0f, -116)));
    EXPECT_EQ(code(5, 0, 0), 0x7E);
    EXPECT_EQ(code(5, 1, 1), 0x00);
    EXPECT_EQ(s[6], Bits(7.0f / 448.0f));
    EXPECT_EQ(code(6, 0, 0), 0x7E);
    EXPECT_EQ(code(6, 1, 1), ReferenceCode(-0.5f / (7.0f / 448.0f)));
    // Everything but the NaN and inf blocks (codes set by the hardware's NaNs) as the
    // reference gives it.
    const Quantized want = Reference(type, x, 1, rows, cols);
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t c = 0; c < cols; ++c) {
        const std::int64_t block = c / 128;
        if (block == 3 || block == 4 || (block == 1 && f32)) continue;
        const auto i = static_cast<std::size_t>(r * cols + c);
        ASSERT_EQ(q.codes[i], want.codes[i]) << r << ", " << c;
      }
    }
    // Every instruction set's loops give these bytes (the in-use ones were checked).
    for (const internal::QuantizeIsa isa : AvailableIsas()) {
      const Quantized other = Quantise(type, x, 1, rows, cols, isa);
      EXPECT_EQ(other.codes, q.codes) << IsaName(isa);
      EXPECT_EQ(ScaleBits(other.scales), s) << IsaName(isa);
    }
  }
}

TEST(QuantizeBlock128Test, EmptyAndBadSizes) {
  std::uint8_t codes[1] = {9};
  float scales[1] = {9.0f};
  const float x[1] = {1.0f};
  QuantizeBlock128(x, ElementType::kF32, 0, 5, 5, codes, scales);
  QuantizeBlock128(x, ElementType::kF32, 3, 0, 5, codes, scales);
  QuantizeBlock128(nullptr, ElementType::kF32, 3, 5, 0, nullptr, nullptr);
  EXPECT_EQ(codes[0], 9);
  EXPECT_EQ(scales[0], 9.0f);
  QuantizeBlock128(x, ElementType::kF32, 1, 1, 1, codes, scales);
  EXPECT_EQ(codes[0], 0x7E);
  EXPECT_EQ(scales[0], 1.0f / 448.0f);
  auto field = [&](auto run) {
    try {
      run();
    } catch (const FieldError& e) {
      return e.field();
    }
    return std::string("none");
  };
  EXPECT_EQ(field([&] { QuantizeBlock128(x, ElementType::kF32, -1, 1, 1, codes, scales); }),
            "matrices");
  EXPECT_EQ(field([&] { QuantizeBlock128(x, ElementType::kF32, 1, -1, 1, codes, scales); }),
            "rows");
  EXPECT_EQ(field([&] { QuantizeBlock128(x, ElementType::kF32, 1, 1, -2, codes, scales); }),
            "cols");
  EXPECT_EQ(field([&] {
              QuantizeBlock128(x, ElementType::kF32, 1 << 30, 1 << 30, 1 << 30, codes, scales);
            }),
            "matrices");
  // Element counts that fit, block counts ceil(n / 128) that would not.
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  for (const std::int64_t n : {kMax, kMax - 126}) {
    EXPECT_EQ(field([&] { QuantizeBlock128(x, ElementType::kF32, 1, n, 1, codes, scales); }),
              "rows");
    EXPECT_EQ(field([&] { QuantizeBlock128(x, ElementType::kF32, 1, 1, n, codes, scales); }),
              "cols");
  }
  EXPECT_EQ(field([&] { QuantizeBlock128(nullptr, ElementType::kF32, 1, 1, 1, codes, scales); }),
            "x");
  EXPECT_EQ(
      field([&] { QuantizeBlock128(x, static_cast<ElementType>(7), 1, 1, 1, codes, scales); }),
      "type");
  EXPECT_EQ(field([&] { QuantizeBlock128(x, ElementType::kF32, 1, 1, 1, nullptr, scales); }),
            "codes");
  EXPECT_EQ(field([&] { QuantizeBlock128(x, ElementType::kF32, 1, 1, 1, codes, nullptr); }),
            "scales");
}

// ---------------------------------------------------------------------------------
// QuantizeBlock128: seeded random shapes and values.

// Random weights: per 128 x 128 block a magnitude 2^k (k over the type's range, down to
// blocks whose scale is below 2^-116 for f32 and bf16), the block's first element 448
// x 2^k (the amax: the scale is 2^k and the division exact), Gaussian values times 2^k,
// e4m3 midpoints times 2^k (ties after the division), values just below the amax,
// zeros, -0, values subnormal in the type, all-zero blocks.
std::vector<std::uint32_t> RandomWeights(std::mt19937_64& rng, ElementType type,
                                         std::int64_t matrices, std::int64_t rows,
                                         std::int64_t cols) {
  const int lo = type == ElementType::kF16 ? -24 : -140;
  const int hi = type == ElementType::kF16 ? 6 : 100;
  const double tiny = std::ldexp(1.0, type == ElementType::kF16 ? -14 : -126);
  const std::array<double, 127> values = E4m3Values();
  std::uniform_int_distribution<int> exponent(lo, hi);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::normal_distribution<double> gauss(0.0, 30.0);
  std::uniform_int_distribution<std::size_t> mid(0, values.size() - 2);
  const std::int64_t rb = (rows + 127) / 128, cb = (cols + 127) / 128;
  std::vector<int> block_exponent(static_cast<std::size_t>(matrices * rb * cb));
  std::vector<bool> block_zero(block_exponent.size());
  for (std::size_t b = 0; b < block_exponent.size(); ++b) {
    block_exponent[b] = exponent(rng);
    block_zero[b] = unit(rng) < 0.08;
  }
  std::vector<std::uint32_t> x(static_cast<std::size_t>(matrices * rows * cols));
  for (std::int64_t m = 0; m < matrices; ++m) {
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t c = 0; c < cols; ++c) {
        const auto b = static_cast<std::size_t>((m * rb + r / 128) * cb + c / 128);
        const double scale = std::ldexp(1.0, block_exponent[b]);
        const double sign = unit(rng) < 0.5 ? -1.0 : 1.0;
        const double pick = unit(rng);
        double v = gauss(rng) * scale;
        if (block_zero[b]) {
          v = pick < 0.1 ? -0.0 : 0.0;
        } else if (r % 128 == 0 && c % 128 == 0) {
          v = 448.0 * scale;
        } else if (pick < 0.25) {
          const std::size_t k = mid(rng);
          v = sign * (values[k] + values[k + 1]) / 2 * scale;
        } else if (pick < 0.3) {
          v = 0.0;
        } else if (pick < 0.33) {
          v = -0.0;
        } else if (pick < 0.38) {
          v = sign * 448.0 * scale * (1 - std::ldexp(1.0, -8));
        } else if (pick < 0.43) {
          v = sign * tiny * unit(rng);
        } else if (pick < 0.5) {
          v = sign * values[mid(rng)] * scale;
        }
        // Clamp to the type's range (f16: 448 x 2^6 < 65504).
        x[static_cast<std::size_t>((m * rows + r) * cols + c)] = Encode(type, v);
      }
    }
  }
  return x;
}

struct Shape {
  std::int64_t matrices, rows, cols;
};

std::vector<Shape> RandomShapes(std::mt19937_64& rng, int n) {
  std::vector<Shape> shapes = {{1, 1, 1},     {1, 128, 128}, {1, 7, 300},  {2, 130, 260},
                               {1, 384, 129}, {3, 129, 700}, {4, 64, 200}, {1, 256, 1030}};
  std::uniform_int_distribution<std::int64_t> matrices(1, 3), size(1, 420);
  for (int i = 0; i < n; ++i) shapes.push_back({matrices(rng), size(rng), size(rng)});
  return shapes;
}

// QuantizeBlock128 runs the widest loops available; the others stay callable for the
// tests, and one this CPU cannot run is refused by name.
TEST(QuantizeBlock128Test, ChoosesTheWidestInstructionSetAvailable) {
  const std::vector<internal::QuantizeIsa> isas = AvailableIsas();
  ASSERT_FALSE(isas.empty());
  EXPECT_EQ(isas.front(), internal::QuantizeIsa::kBaseline);
  EXPECT_EQ(internal::QuantizeIsaInUse(), isas.back()) << IsaName(isas.back());
  std::printf("quantize_test: loops available:");
  for (const internal::QuantizeIsa isa : isas) std::printf(" %s", IsaName(isa));
  std::printf("\n");
  const std::uint16_t x[1] = {0x3F80};  // bf16 1.0
  std::uint8_t codes[1] = {0};
  float scales[1] = {0};
  EXPECT_FALSE(internal::QuantizeIsaAvailable(static_cast<internal::QuantizeIsa>(99)));
  for (const internal::QuantizeIsa isa :
       {internal::QuantizeIsa::kAvx2, internal::QuantizeIsa::kAvx512,
        static_cast<internal::QuantizeIsa>(99)}) {
    if (internal::QuantizeIsaAvailable(isa)) continue;
    try {
      internal::QuantizeBlock128With(isa, x, ElementType::kBf16, 1, 1, 1, codes, scales);
      ADD_FAILURE() << IsaName(isa) << " ran on a CPU without it";
    } catch (const FieldError& e) {
      EXPECT_EQ(e.field(), "isa");
    }
  }
}

TEST(QuantizeBlock128Test, RandomShapesAndValuesMatchTheReference) {
  std::mt19937_64 rng(20261203);
  for (const ElementType type : kTypes) {
    for (const Shape& shape : RandomShapes(rng, 12)) {
      SCOPED_TRACE(std::string(Name(type)) + " " + std::to_string(shape.matrices) + "x" +
                   std::to_string(shape.rows) + "x" + std::to_string(shape.cols));
      const std::vector<std::uint32_t> x =
          RandomWeights(rng, type, shape.matrices, shape.rows, shape.cols);
      const Quantized want = Reference(type, x, shape.matrices, shape.rows, shape.cols);
      for (const internal::QuantizeIsa isa : AvailableIsas()) {
        const Quantized got = Quantise(type, x, shape.matrices, shape.rows, shape.cols, isa);
        ASSERT_EQ(ScaleBits(got.scales), ScaleBits(want.scales)) << IsaName(isa);
        ASSERT_EQ(got.codes, want.codes)
            << FirstDifference(got.codes, want.codes, x) << IsaName(isa);
      }
    }
  }
}

TEST(QuantizeBlock128Test, TheSameValuesInEveryTypeGiveTheSameBytes) {
  // Values exact in f16, bf16 and f32 (5 significant bits, exponents f16 holds).
  std::mt19937_64 rng(20261204);
  std::uniform_int_distribution<int> mantissa(16, 31), exponent(-18, 10), sign(0, 1);
  const std::int64_t rows = 200, cols = 333;
  std::vector<double> v(static_cast<std::size_t>(rows * cols));
  for (double& e : v) e = (sign(rng) ? -1 : 1) * std::ldexp(mantissa(rng), exponent(rng) - 4);
  std::vector<Quantized> results;
  for (const ElementType type : kTypes) {
    std::vector<std::uint32_t> x(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) {
      x[i] = Encode(type, v[i]);
      ASSERT_EQ(Decode(type, x[i]), static_cast<float>(v[i]));
    }
    for (const internal::QuantizeIsa isa : AvailableIsas()) {
      results.push_back(Quantise(type, x, 1, rows, cols, isa));
    }
  }
  for (const Quantized& r : results) {
    EXPECT_EQ(r.codes, results[0].codes);
    EXPECT_EQ(ScaleBits(r.scales), ScaleBits(results[0].scales));
  }
}

#if defined(__SSE2__)
// Sets flush-to-zero and denormals-are-zero (MXCSR) while alive.
class FlushDenormals {
 public:
  FlushDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040u); }
  ~FlushDenormals() { _mm_setcsr(saved_); }
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;

 private:
  unsigned saved_;
};

TEST(QuantizeBlock128Test, FlushToZeroAndDenormalsAreZeroChangeNothing) {
  std::mt19937_64 rng(20261205);
  for (const ElementType type : kTypes) {
    SCOPED_TRACE(Name(type));
    for (const Shape& shape : RandomShapes(rng, 4)) {
      std::vector<std::uint32_t> x =
          RandomWeights(rng, type, shape.matrices, shape.rows, shape.cols);
      // Also tiny blocks (scales subnormal, 0, or below 2^-116) of subnormal inputs.
      std::uniform_int_distribution<std::uint32_t> small(
          0, type == ElementType::kF32 ? 0x0600000u : 0x0600u);
      for (std::size_t i = 0; i < x.size(); i += 3) {
        const std::uint32_t sign = type == ElementType::kF32 ? 0x80000000u : 0x8000u;
        if (x.size() > 1000 && i > x.size() / 2) x[i] = small(rng) | (x[i] & sign);
      }
      const Quantized plain = Quantise(type, x, shape.matrices, shape.rows, shape.cols);
      for (const internal::QuantizeIsa isa : AvailableIsas()) {
        SCOPED_TRACE(IsaName(isa));
        Quantized flushed;
        {
          const FlushDenormals flush;
          volatile float least = std::ldexp(1.0f, -126);
          const float half = least * 0.5f;
          ASSERT_EQ(half, 0.0f);  // the mode is on
          flushed = Quantise(type, x, shape.matrices, shape.rows, shape.cols, isa);
        }
        ASSERT_EQ(ScaleBits(flushed.scales), ScaleBits(plain.scales));
        ASSERT_EQ(flushed.codes, plain.codes) << FirstDifference(flushed.codes, plain.codes, x);
      }
    }
  }
  std::mt19937_64 pairs(20261206);
  std::vector<std::uint32_t> xs, ss, quotients;
  for (int i = 0; i < 200000; ++i) {
    xs.push_back(RandomF32(pairs));
    ss.push_back(RandomF32(pairs));
    quotients.push_back(DivideF32(xs.back(), ss.back()));
  }
  const FlushDenormals flush;
  for (std::size_t i = 0; i < xs.size(); ++i) ASSERT_EQ(DivideF32(xs[i], ss[i]), quotients[i]);
}
#endif

}  // namespace
}  // namespace rlsched::rollout
