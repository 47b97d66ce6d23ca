// QuantizeBlock128 (rollout/quantize.h) on one core: GB/s of input (bytes/s in Google
// Benchmark's counters) for bf16, f16 and f32 weights of a few shapes, Gaussian values
// (every block on the hot loop; the loops QuantizeBlock128 chooses, the widest the CPU
// runs of AVX-512 and AVX2, and bf16 with each instruction set's: baseline, AVX2,
// AVX-512, skipped where the CPU lacks it), and bf16 with a quarter of the blocks tiny
// (their scales below 2^-116: the exact per-element path).
//
//   build/benchmarks/quantize_bench [--benchmark_filter=bf16]
//
// benchmarks/executor_bench.py measures the Python entry point (the native module's
// quantize_block128 against the torch path) on a 2048 x 1024 bf16 tensor.

#include <benchmark/benchmark.h>

#include <bit>
#include <cstdint>
#include <random>
#include <vector>

#include "rlsched/rollout/quantize.h"

namespace {

using rlsched::rollout::ElementType;
using rlsched::rollout::Fp8Blocks;
using rlsched::rollout::QuantizeBlock128;

// Gaussian weights (sigma 0.02, as initialised linear layers) stored in `type`, as raw
// bits of the storage width; `tiny_every` > 0: every that many 128-column blocks of each
// block row scaled by 2^-120.
std::vector<std::uint32_t> Weights(std::int64_t rows, std::int64_t cols, ElementType type,
                                   int tiny_every) {
  std::mt19937_64 rng(42);
  std::normal_distribution<float> gauss(0.0f, 0.02f);
  std::vector<std::uint32_t> bits(static_cast<std::size_t>(rows * cols));
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) {
      float v = gauss(rng);
      if (tiny_every > 0 && (c / 128) % tiny_every == 0) v *= 0x1p-120f;
      const std::uint32_t f = std::bit_cast<std::uint32_t>(v);
      std::uint32_t stored = f;
      if (type == ElementType::kBf16) stored = f >> 16;
      if (type == ElementType::kF16) {  // |v| < 2: normal halves, truncated
        const std::uint32_t exponent = (f >> 23) & 0xFF;
        stored = ((f >> 16) & 0x8000u) |
                 (exponent < 113 ? 0u : ((exponent - 112) << 10) | ((f >> 13) & 0x3FFu));
      }
      bits[static_cast<std::size_t>(r * cols + c)] = stored;
    }
  }
  return bits;
}

using rlsched::rollout::internal::QuantizeIsa;

// `isa`: that instruction set's loops; kInUse: those QuantizeBlock128 chooses.
constexpr int kInUse = -1;

void Quantize(benchmark::State& state, ElementType type, int tiny_every, int isa) {
  if (isa != kInUse &&
      !rlsched::rollout::internal::QuantizeIsaAvailable(static_cast<QuantizeIsa>(isa))) {
    state.SkipWithError("this CPU lacks the instruction set");
    return;
  }
  const std::int64_t rows = state.range(0), cols = state.range(1);
  const std::vector<std::uint32_t> bits = Weights(rows, cols, type, tiny_every);
  std::vector<float> f32;
  std::vector<std::uint16_t> f16;
  const void* x = nullptr;
  if (type == ElementType::kF32) {
    for (const std::uint32_t b : bits) f32.push_back(std::bit_cast<float>(b));
    x = f32.data();
  } else {
    f16.assign(bits.begin(), bits.end());
    x = f16.data();
  }
  std::vector<std::uint8_t> codes(bits.size());
  std::vector<float> scales(static_cast<std::size_t>(Fp8Blocks(rows) * Fp8Blocks(cols)));
  for (auto _ : state) {
    if (isa != kInUse) {
      rlsched::rollout::internal::QuantizeBlock128With(static_cast<QuantizeIsa>(isa), x, type, 1,
                                                       rows, cols, codes.data(), scales.data());
    } else {
      QuantizeBlock128(x, type, 1, rows, cols, codes.data(), scales.data());
    }
    benchmark::DoNotOptimize(codes.data());
    benchmark::DoNotOptimize(scales.data());
    benchmark::ClobberMemory();
  }
  const std::int64_t bytes = rows * cols * (type == ElementType::kF32 ? 4 : 2);
  state.SetBytesProcessed(state.iterations() * bytes);
}

void Shapes(benchmark::internal::Benchmark* b) {
  b->Args({2048, 1024})->Args({4096, 4096})->Args({1000, 3000})->Unit(benchmark::kMillisecond);
}

BENCHMARK_CAPTURE(Quantize, bf16, ElementType::kBf16, 0, kInUse)->Apply(Shapes);
BENCHMARK_CAPTURE(Quantize, f16, ElementType::kF16, 0, kInUse)->Apply(Shapes);
BENCHMARK_CAPTURE(Quantize, f32, ElementType::kF32, 0, kInUse)->Apply(Shapes);
BENCHMARK_CAPTURE(Quantize, bf16_baseline_isa, ElementType::kBf16, 0,
                  static_cast<int>(QuantizeIsa::kBaseline))
    ->Apply(Shapes);
BENCHMARK_CAPTURE(Quantize, bf16_avx2, ElementType::kBf16, 0, static_cast<int>(QuantizeIsa::kAvx2))
    ->Apply(Shapes);
BENCHMARK_CAPTURE(Quantize, bf16_avx512, ElementType::kBf16, 0,
                  static_cast<int>(QuantizeIsa::kAvx512))
    ->Apply(Shapes);
BENCHMARK_CAPTURE(Quantize, bf16_quarter_tiny_blocks, ElementType::kBf16, 4, kInUse)
    ->Args({2048, 1024})
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
