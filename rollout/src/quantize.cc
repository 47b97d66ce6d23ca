// fp8 e4m3 block quantisation (quantize.h).
//
// Per block row (128 rows) the columns go in strips of kStripBlocks blocks, small enough
// to stay in the core's L2 cache between the two passes over them: the first keeps the
// largest magnitude of each column (the magnitudes' bits, which order as the values do,
// NaNs above infinities) and reduces them to the block maxima and scales; the second
// writes the codes row by row, a block's segment at a time.
//
// The codes of a block whose scale is a normal float32 of at least 2^-116 come from the
// hot loop: y = x / scale in hardware float32 division, then e4m3's rounding on y's
// bits, branch-free, which GCC vectorises. Such a scale is at least amax / 448 rounded,
// so |y| <= 448 (1 + 2^-23) and the codes need no saturation. Flush-to-zero and
// denormals-are-zero cannot change a code there: a subnormal x gives |y| < 2^-126 /
// 2^-116 = 2^-10, code 0 with x's sign either way, and a subnormal y is code 0 with its
// sign, as a flushed one is. For |y| < 2^-6 the code is the number of 2^-9 in y rounded
// to nearest even, which the float32 sum y + 2^14 computes in one rounding (its ulp is
// 2^-9); a subnormal y read as 0 changes nothing. Other blocks (scale 0 after an
// underflow, subnormal, below 2^-116, infinite or NaN) take DivideF32() and E4m3Code()
// per element, exact in any mode; so do the scales.

#include "rlsched/rollout/quantize.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "rlsched/common/check.h"
#include "rlsched/common/error.h"

namespace rlsched::rollout {
namespace {

constexpr std::uint32_t kF32Magnitude = 0x7FFFFFFFu;
constexpr std::uint32_t kF32Sign = 0x80000000u;
constexpr std::uint32_t kF32ExponentMask = 0x7F800000u;
constexpr std::uint32_t kF32Infinity = 0x7F800000u;
constexpr std::uint32_t kF32One = 0x3F800000u;
constexpr std::uint32_t kF32Fp8Max = 0x43E00000u;  // 448
// torch's amax of a block holding a NaN (whatever the NaN's sign and payload).
constexpr std::uint32_t kAmaxNaN = 0x7FC00000u;
// The hot loop's least scale: 2^-116.
constexpr std::uint32_t kHotScaleMin = 0x05800000u;
// e4m3's least normal value, 2^-6: below it the codes count multiples of 2^-9.
constexpr std::int32_t kE4m3MinNormal = 0x3C800000;
// 2^14, whose float32 ulp is 2^-9; y + 2^14 for y in [0, 2^-6) is 2^14 + code x 2^-9.
constexpr float kSubnormalGrid = 16384.0f;
constexpr std::int32_t kSubnormalGridBits = 0x46800000;
// Rebias float32's exponent (127) to e4m3's (7), in units of e4m3's 3 mantissa bits.
constexpr std::int32_t kRebias = 120 << 3;

// Column blocks per strip: 512 columns, 128 KiB of bf16 (256 KiB of f32) per block row.
constexpr std::int64_t kStripBlocks = 4;
constexpr std::int64_t kStripColumns = kStripBlocks * kFp8Block;

// The element types: how an element is stored, its magnitude (as an integer of the
// storage's width that orders as the magnitude does) and its float32 bits.
struct Bf16 {
  using Storage = std::uint16_t;
  using Magnitude = std::int16_t;
  static std::uint32_t Bits(Storage h) { return std::uint32_t{h} << 16; }
  static Magnitude Mag(Storage h) { return static_cast<Magnitude>(h & 0x7FFF); }
  static std::uint32_t MagBits(Magnitude m) { return Bits(static_cast<Storage>(m)); }
};

struct F16 {
  using Storage = std::uint16_t;
  using Magnitude = std::int16_t;
  // IEEE half to float32, on the bits: subnormal halves through an exact integer to
  // float conversion and a product of normal floats (no subnormal operand or result);
  // NaNs quiet, as torch converts them.
  static std::uint32_t Bits(Storage h) {
    const std::uint32_t sign = (std::uint32_t{h} & 0x8000u) << 16;
    const std::uint32_t exponent = (std::uint32_t{h} >> 10) & 0x1Fu;
    const std::uint32_t mantissa = std::uint32_t{h} & 0x3FFu;
    const std::uint32_t normal = ((exponent + 112u) << 23) | (mantissa << 13);
    const std::uint32_t quiet = (0u - static_cast<std::uint32_t>(mantissa != 0)) & 0x400000u;
    const std::uint32_t special = kF32Infinity | (mantissa << 13) | quiet;
    const std::uint32_t subnormal = std::bit_cast<std::uint32_t>(
        static_cast<float>(static_cast<std::int32_t>(mantissa)) * 0x1p-24f);
    // Selected with masks: branch-free, so that the loops that call it vectorise.
    const std::uint32_t is_zero = 0u - static_cast<std::uint32_t>(exponent == 0);
    const std::uint32_t is_special = 0u - static_cast<std::uint32_t>(exponent == 31);
    return sign | (subnormal & is_zero) | (special & is_special) |
           (normal & ~(is_zero | is_special));
  }
  static Magnitude Mag(Storage h) { return static_cast<Magnitude>(h & 0x7FFF); }
  static std::uint32_t MagBits(Magnitude m) { return Bits(static_cast<Storage>(m)); }
};

struct F32 {
  using Storage = float;
  using Magnitude = std::int32_t;
  static std::uint32_t Bits(Storage f) { return std::bit_cast<std::uint32_t>(f); }
  static Magnitude Mag(Storage f) {
    return static_cast<Magnitude>(std::bit_cast<std::uint32_t>(f) & kF32Magnitude);
  }
  static std::uint32_t MagBits(Magnitude m) { return static_cast<std::uint32_t>(m); }
};

// The float32 with bits `bits` as a double, exactly; subnormals through an integer, so
// that no subnormal reaches the hardware.
double ExactDouble(std::uint32_t bits) {
  if ((bits & kF32ExponentMask) == 0) {
    const double magnitude = static_cast<double>(bits & 0x7FFFFFu) * 0x1p-149;
    return (bits & kF32Sign) != 0 ? -magnitude : magnitude;
  }
  return static_cast<double>(std::bit_cast<float>(bits));
}

// A double (a quotient of two float32 values: 0, at least 2^-277 in magnitude, infinite
// or NaN) rounded to float32, to nearest even; results below 2^-126 on the integers.
std::uint32_t RoundToF32(double q) {
  const double magnitude = std::fabs(q);
  if (!(magnitude < 0x1p-126)) return std::bit_cast<std::uint32_t>(static_cast<float>(q));
  // A multiple of 2^-149: magnitude x 2^149 (exact, below 2^23) rounded to an integer
  // by the sum with 2^52 (ulp 1), to nearest even; 2^23 is 2^-126's bits.
  const double units = (magnitude * 0x1p149 + 0x1p52) - 0x1p52;
  return (std::signbit(q) ? kF32Sign : 0u) | static_cast<std::uint32_t>(units);
}

// The scale of a block whose largest magnitude has float32 bits `amax`.
std::uint32_t ScaleBits(std::uint32_t amax) {
  if (amax > kF32Infinity) return kAmaxNaN;
  if (amax == 0) return kF32One;
  return DivideF32(amax, kF32Fp8Max);
}

bool Hot(std::uint32_t scale) { return scale >= kHotScaleMin && scale < kF32Infinity; }

// The codes of n elements of a block whose scale is Hot().
// Inlined into each instruction set's copy of the loops below.
#define RLSCHED_QUANTIZE_INLINE [[gnu::always_inline]] inline

template <class T>
RLSCHED_QUANTIZE_INLINE void HotCodes(const typename T::Storage* __restrict x, std::int64_t n,
                                      float scale, std::uint8_t* __restrict out) {
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint32_t y =
        std::bit_cast<std::uint32_t>(std::bit_cast<float>(T::Bits(x[i])) / scale);
    const std::int32_t a = static_cast<std::int32_t>(y & kF32Magnitude);
    // |y| <= 448 (1 + 2^-23): no carry past 0x7E, no wrap.
    const std::int32_t normal = ((a + 0x7FFFF + ((a >> 20) & 1)) >> 20) - kRebias;
    const std::int32_t sub =
        std::bit_cast<std::int32_t>(std::bit_cast<float>(a) + kSubnormalGrid) - kSubnormalGridBits;
    const std::int32_t below = -static_cast<std::int32_t>(a < kE4m3MinNormal);  // all ones
    const std::int32_t code = (sub & below) | (normal & ~below);
    out[i] = static_cast<std::uint8_t>(static_cast<std::uint32_t>(code) | ((y >> 24) & 0x80u));
  }
}

// The codes of n elements of any block, exactly, one at a time.
template <class T>
void ExactCodes(const typename T::Storage* x, std::int64_t n, std::uint32_t scale,
                std::uint8_t* out) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = E4m3Code(DivideF32(T::Bits(x[i]), scale));
}

template <class T>
RLSCHED_QUANTIZE_INLINE void QuantizeLoops(const typename T::Storage* x, std::int64_t matrices,
                                           std::int64_t rows, std::int64_t cols,
                                           std::uint8_t* codes, float* scales) {
  using Magnitude = typename T::Magnitude;
  const std::int64_t row_blocks = Fp8Blocks(rows);
  const std::int64_t col_blocks = Fp8Blocks(cols);
  alignas(64) Magnitude column_max[kStripColumns];
  std::uint32_t strip_scales[kStripBlocks];
  for (std::int64_t m = 0; m < matrices; ++m) {
    for (std::int64_t rb = 0; rb < row_blocks; ++rb) {
      const std::int64_t r0 = rb * kFp8Block;
      const std::int64_t r1 = std::min(r0 + kFp8Block, rows);
      float* block_scales = scales + (m * row_blocks + rb) * col_blocks;
      for (std::int64_t c0 = 0; c0 < cols; c0 += kStripColumns) {
        const std::int64_t width = std::min(kStripColumns, cols - c0);
        const std::int64_t blocks = Fp8Blocks(width);
        // Pass 1: the strip's column maxima, then its blocks' maxima and scales.
        std::fill(column_max, column_max + width, Magnitude{0});
        for (std::int64_t r = r0; r < r1; ++r) {
          const typename T::Storage* row = x + (m * rows + r) * cols + c0;
          for (std::int64_t c = 0; c < width; ++c) {
            column_max[c] = std::max(column_max[c], T::Mag(row[c]));
          }
        }
        for (std::int64_t j = 0; j < blocks; ++j) {
          const Magnitude* first = column_max + j * kFp8Block;
          const Magnitude amax =
              *std::max_element(first, first + std::min(kFp8Block, width - j * kFp8Block));
          strip_scales[j] = ScaleBits(T::MagBits(amax));
          block_scales[c0 / kFp8Block + j] = std::bit_cast<float>(strip_scales[j]);
        }
        // Pass 2: the codes.
        for (std::int64_t r = r0; r < r1; ++r) {
          const std::int64_t offset = (m * rows + r) * cols + c0;
          for (std::int64_t j = 0; j < blocks; ++j) {
            const std::int64_t begin = j * kFp8Block;
            const std::int64_t n = std::min(kFp8Block, width - begin);
            const float scale = std::bit_cast<float>(strip_scales[j]);
            if (Hot(strip_scales[j]) && n == kFp8Block) {  // a constant trip count
              HotCodes<T>(x + offset + begin, kFp8Block, scale, codes + offset + begin);
            } else if (Hot(strip_scales[j])) {
              HotCodes<T>(x + offset + begin, n, scale, codes + offset + begin);
            } else {
              ExactCodes<T>(x + offset + begin, n, strip_scales[j], codes + offset + begin);
            }
          }
        }
      }
    }
  }
}

// The loops for the baseline instruction set (x86-64: SSE2), and on x86-64 for AVX2 (8
// lanes) and AVX-512 (16 lanes), chosen at run time: the binary runs on any x86-64, and
// the same IEEE operations give the same bytes in each.
#if defined(__x86_64__) && defined(__GNUC__)
#define RLSCHED_QUANTIZE_X86 1
template <class T>
[[gnu::target("avx2")]] void QuantizeAvx2(const typename T::Storage* x, std::int64_t matrices,
                                          std::int64_t rows, std::int64_t cols, std::uint8_t* codes,
                                          float* scales) {
  QuantizeLoops<T>(x, matrices, rows, cols, codes, scales);
}

// GCC keeps to 256-bit vectors unless told to prefer 512 (clang's attribute does not
// take the option).
#if defined(__clang__)
#define RLSCHED_QUANTIZE_AVX512_TARGET "avx512f,avx512bw,avx512vl"
#else
#define RLSCHED_QUANTIZE_AVX512_TARGET "avx512f,avx512bw,avx512vl,prefer-vector-width=512"
#endif
template <class T>
[[gnu::target(RLSCHED_QUANTIZE_AVX512_TARGET)]] void QuantizeAvx512(
    const typename T::Storage* x, std::int64_t matrices, std::int64_t rows, std::int64_t cols,
    std::uint8_t* codes, float* scales) {
  QuantizeLoops<T>(x, matrices, rows, cols, codes, scales);
}
#endif

template <class T>
void Quantize(const void* x, internal::QuantizeIsa isa, std::int64_t matrices, std::int64_t rows,
              std::int64_t cols, std::uint8_t* codes, float* scales) {
  const auto* in = static_cast<const typename T::Storage*>(x);
  switch (isa) {
#ifdef RLSCHED_QUANTIZE_X86
    case internal::QuantizeIsa::kAvx512:
      QuantizeAvx512<T>(in, matrices, rows, cols, codes, scales);
      return;
    case internal::QuantizeIsa::kAvx2:
      QuantizeAvx2<T>(in, matrices, rows, cols, codes, scales);
      return;
#endif
    default:
      QuantizeLoops<T>(in, matrices, rows, cols, codes, scales);
      return;
  }
}

// `isa`: one this build and CPU can run.
void Run(const void* x, ElementType type, internal::QuantizeIsa isa, std::int64_t matrices,
         std::int64_t rows, std::int64_t cols, std::uint8_t* codes, float* scales) {
  CheckAtLeast("matrices", matrices, 0);
  CheckAtLeast("rows", rows, 0);
  CheckAtLeast("cols", cols, 0);
  if (matrices == 0 || rows == 0 || cols == 0) return;
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  // The block counts, ceil(n / 128), are computed as (n + 127) / 128.
  constexpr std::int64_t kMaxEdge = kMax - (kFp8Block - 1);
  CheckAtMost("rows", rows, {kMaxEdge, "2^63 - 128"});
  CheckAtMost("cols", cols, {kMaxEdge, "2^63 - 128"});
  if (rows > kMax / cols || matrices > kMax / (rows * cols)) {
    Fail("matrices", "matrices x rows x cols must fit in int64");
  }
  if (x == nullptr) Fail("x", "must not be null");
  if (codes == nullptr) Fail("codes", "must not be null");
  if (scales == nullptr) Fail("scales", "must not be null");
  switch (type) {
    case ElementType::kBf16:
      Quantize<Bf16>(x, isa, matrices, rows, cols, codes, scales);
      return;
    case ElementType::kF16:
      Quantize<F16>(x, isa, matrices, rows, cols, codes, scales);
      return;
    case ElementType::kF32:
      Quantize<F32>(x, isa, matrices, rows, cols, codes, scales);
      return;
  }
  Fail("type", "unknown element type");
}

}  // namespace

std::uint8_t E4m3Code(std::uint32_t f32_bits) {
  const std::uint32_t a = f32_bits & kF32Magnitude;
  // As executor.e4m3_bits's int32 arithmetic: for NaNs the sum may pass 2^31 and wrap
  // (modular conversion, arithmetic shift).
  std::int32_t normal = static_cast<std::int32_t>(a + 0x7FFFFu + ((a >> 20) & 1u)) >> 20;
  normal = std::min(normal - kRebias, 0x7E);
  const std::int32_t sub =
      std::bit_cast<std::int32_t>(std::bit_cast<float>(a) + kSubnormalGrid) - kSubnormalGridBits;
  const std::int32_t code = static_cast<std::int32_t>(a) < kE4m3MinNormal ? sub : normal;
  return static_cast<std::uint8_t>(static_cast<std::uint32_t>(code) | ((f32_bits >> 24) & 0x80u));
}

std::uint32_t DivideF32(std::uint32_t x_bits, std::uint32_t s_bits) {
  // Both operands exact in double, neither subnormal there; the quotient is 0, at least
  // 2^-277, infinite or NaN (no subnormal double either), and rounding it to float32
  // gives the float32 quotient (53 >= 2 x 24 + 2 bits: the double rounding is
  // innocuous, also on float32's subnormal grid).
  return RoundToF32(ExactDouble(x_bits) / ExactDouble(s_bits));
}

void QuantizeBlock128(const void* x, ElementType type, std::int64_t matrices, std::int64_t rows,
                      std::int64_t cols, std::uint8_t* codes, float* scales) {
  Run(x, type, internal::QuantizeIsaInUse(), matrices, rows, cols, codes, scales);
}

namespace internal {

bool QuantizeIsaAvailable(QuantizeIsa isa) {
#ifdef RLSCHED_QUANTIZE_X86
  // The CPU's features may be asked for before libgcc's own constructor has read them
  // (from another constructor): read them now (idempotent).
  __builtin_cpu_init();
#endif
  switch (isa) {
    case QuantizeIsa::kBaseline:
      return true;
#ifdef RLSCHED_QUANTIZE_X86
    case QuantizeIsa::kAvx2:
      return __builtin_cpu_supports("avx2");
    case QuantizeIsa::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl");
#endif
    default:
      return false;
  }
}

QuantizeIsa QuantizeIsaInUse() {
  static const QuantizeIsa isa = QuantizeIsaAvailable(QuantizeIsa::kAvx512) ? QuantizeIsa::kAvx512
                                 : QuantizeIsaAvailable(QuantizeIsa::kAvx2)
                                     ? QuantizeIsa::kAvx2
                                     : QuantizeIsa::kBaseline;
  return isa;
}

void QuantizeBlock128With(QuantizeIsa isa, const void* x, ElementType type, std::int64_t matrices,
                          std::int64_t rows, std::int64_t cols, std::uint8_t* codes,
                          float* scales) {
  if (!QuantizeIsaAvailable(isa)) {
    Fail("isa", "an instruction set this build and CPU can run (QuantizeIsaAvailable)");
  }
  Run(x, type, isa, matrices, rows, cols, codes, scales);
}

}  // namespace internal

}  // namespace rlsched::rollout
