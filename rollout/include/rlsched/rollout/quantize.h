// rlsched/rollout/quantize.h — fp8 e4m3 quantisation of weights in 128 x 128 blocks.
//
// Overview
//   An engine's linear weights in fp8 (the planner's TargetDtype::kFp8Block128) are
//   e4m3 codes ("fn": no infinities, largest finite value 448) with one float32 scale
//   per 128 x 128 block of each matrix's last two dims, counted from the origin (edge
//   blocks partial). QuantizeBlock128() computes them in one pass for the block maxima
//   and one pass for the codes, a strip of a block row at a time, with the bytes of
//   python/rlsched/executor.py's quantize_block128 (the torch path), so that every rank
//   gets the same bytes whichever path quantised:
//
//   - scale = amax / 448 (IEEE float32 division, round to nearest even), amax the
//     largest |x| of the block as a float32; 1 for an all-zero block; a block holding a
//     NaN has the scale torch's amax gives it, the quiet NaN 0x7FC00000.
//   - code = E4m3Code(bits of float32(x) / scale), the division in IEEE float32.
//
//   On x86-64 the loops run 16 lanes wide on CPUs with AVX-512 (F, BW, VL), else 8 with
//   AVX2 (chosen at run time; the library is built for the baseline instruction set),
//   with the same bytes. (Measured on AMD EPYC: AVX-512 1.45-1.53x AVX2 for bf16. Some
//   Intel server cores, Skylake-SP and Cascade Lake, lower their clock for a while after
//   512-bit instructions; not measured there.)
//
//   The results do not depend on the floating-point environment's flush-to-zero or
//   denormals-are-zero modes (the hot loop is used only where they cannot change a
//   code; the other blocks, and the scales, take an exact path that never hands a
//   subnormal to the hardware). Rounding mode: round to nearest, as everywhere.
//   NaN codes follow the hardware's float32 division as torch does (x86: the first
//   operand's NaN, the default NaN negative for inf / inf and 0 / 0).
//
// Example
//   std::vector<std::uint16_t> w(rows * cols);  // bf16 bits, [rows, cols]
//   std::vector<std::uint8_t> codes(w.size());
//   std::vector<float> scales(Fp8Blocks(rows) * Fp8Blocks(cols));
//   QuantizeBlock128(w.data(), ElementType::kBf16, 1, rows, cols, codes.data(), scales.data());
//
// Thread-safety: pure functions; concurrent calls on disjoint outputs are safe.
// Errors: FieldError ("matrices", "rows", "cols", "x", "codes", "scales", "type") for
// negative sizes, rows or cols above 2^63 - 128 (their block counts would overflow), a
// size whose element count overflows, a null pointer with elements to write, or an
// ElementType value that is none of the enumerators.

#ifndef RLSCHED_ROLLOUT_QUANTIZE_H_
#define RLSCHED_ROLLOUT_QUANTIZE_H_

#include <cstdint>

namespace rlsched::rollout {

// The input's element type: bf16 and f16 as their 16-bit patterns, f32 as float.
enum class ElementType { kBf16, kF16, kF32 };

// The block edge.
inline constexpr std::int64_t kFp8Block = 128;

// Blocks along a dim of n elements: ceil(n / 128).
constexpr std::int64_t Fp8Blocks(std::int64_t n) { return (n + kFp8Block - 1) / kFp8Block; }

// Quantises x, `matrices` contiguous row-major [rows, cols] matrices of `type`, into
// codes (uint8, matrices x rows x cols, the same layout) and scales (float32,
// [matrices, Fp8Blocks(rows), Fp8Blocks(cols)], row-major), as the overview says.
void QuantizeBlock128(const void* x, ElementType type, std::int64_t matrices, std::int64_t rows,
                      std::int64_t cols, std::uint8_t* codes, float* scales);

// The e4m3 code of the float32 with bits `f32_bits` (executor.e4m3_bits for one value):
// for |y| >= 2^-6 float32's mantissa rounded to 3 bits, to nearest even, saturated at
// 0x7E (448); below, the nearest multiple of 2^-9 (ties to even); the sign as bit 7, also
// for -0 and negative values that round to 0. Non-finite values give what that formula's
// int32 arithmetic gives: 0x7E for an infinity and most NaNs (and 0x40 for NaNs whose
// payload carries past bit 31), with the sign bit.
std::uint8_t E4m3Code(std::uint32_t f32_bits);

// The bits of float32(x) / float32(s) (IEEE division, round to nearest even, subnormals
// kept), from the operands' bits, whatever the flush-to-zero and denormals-are-zero
// modes. NaN results are the hardware's (as for float division on this machine).
std::uint32_t DivideF32(std::uint32_t x_bits, std::uint32_t s_bits);

namespace internal {

// The instruction sets QuantizeBlock128's loops are compiled for: the baseline (x86-64:
// SSE2; the only one elsewhere), AVX2 (8 lanes) and AVX-512 F + BW + VL (16 lanes).
enum class QuantizeIsa { kBaseline, kAvx2, kAvx512 };

// Whether this build and this CPU can run `isa`'s loops.
bool QuantizeIsaAvailable(QuantizeIsa isa);

// The loops QuantizeBlock128 runs here: the widest available.
QuantizeIsa QuantizeIsaInUse();

// QuantizeBlock128 with `isa`'s loops, for the tests and benchmarks that compare them
// (FieldError on "isa" when this build or CPU cannot run them).
void QuantizeBlock128With(QuantizeIsa isa, const void* x, ElementType type, std::int64_t matrices,
                          std::int64_t rows, std::int64_t cols, std::uint8_t* codes, float* scales);

}  // namespace internal

}  // namespace rlsched::rollout

#endif  // RLSCHED_ROLLOUT_QUANTIZE_H_
