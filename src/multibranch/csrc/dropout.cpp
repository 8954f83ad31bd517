// Element-wise dropout in one pass on the CPU (modules/dropout.py), forward and backward alike: element i of a
// call is kept when lane i % 4 (bits 16 (i % 4) to 16 (i % 4) + 15) of the SplitMix64 output for word i / 4 of the
// call's seed, read as a signed 16-bit integer, is at least threshold - 32768 (so with probability
// 1 - threshold / 65536), and kept elements are scaled by `scale`. The stream is a function of (seed, i) only, so the mask is
// never stored: the backward recomputes it from the seed, and any split of the work over threads gives the same
// mask. modules/dropout.py computes the same stream with PyTorch operations where the kernels are not built.

#include <torch/extension.h>

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <cstdint>

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the stream's lanes are read as little-endian 16-bit words");

namespace {

constexpr uint64_t kGamma = 0x9E3779B97F4A7C15ULL;  // SplitMix64's increment (2^64 / golden ratio)
constexpr int64_t kBlock = 1024;  // words per block: 8 KiB of stream, in the L1 cache

// SplitMix64's output for the `word`-th step after `seed` (Steele, Lea and Flood 2014).
inline uint64_t splitmix64(uint64_t seed, uint64_t word) {
  uint64_t z = seed + (word + 1) * kGamma;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

}  // namespace

// x contiguous on the CPU (float32, float64, bfloat16 or float16), seed a one-element int64 CPU tensor (read here,
// so that the caller never reads it on the host) -> out of x's shape: x * scale where kept, else 0.
torch::Tensor dropout_apply(const torch::Tensor& x, const torch::Tensor& seed, int64_t threshold, double scale) {
  TORCH_CHECK(x.device().is_cpu() && x.is_contiguous(), "x must be a contiguous CPU tensor");
  TORCH_CHECK(seed.device().is_cpu() && seed.scalar_type() == torch::kLong && seed.numel() == 1,
              "seed must be a one-element int64 CPU tensor");
  TORCH_CHECK(threshold >= 0 && threshold <= 65536, "threshold must be in [0, 65536], got ", threshold);
  auto out = torch::empty_like(x);
  const int64_t n = x.numel();
  const int64_t words = (n + 3) / 4;
  const uint64_t useed = static_cast<uint64_t>(*seed.data_ptr<int64_t>());
  const int32_t limit = static_cast<int32_t>(threshold) - 32768;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "dropout_apply", [&] {
    using opmath_t = at::opmath_type<scalar_t>;  // what `x * scale` computes in: float for the 16-bit types
    const scalar_t* in = x.data_ptr<scalar_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    const opmath_t s = static_cast<opmath_t>(scale);
    // blocks of kBlock words: their outputs first (a loop the compiler vectorises), then the elements, reading
    // the outputs as signed 16-bit lanes (little-endian: lane k of word w is lane 4 w + k)
    at::parallel_for(0, words, kBlock, [&](int64_t begin, int64_t end) {
      alignas(64) uint64_t bits[kBlock];
      const int16_t* lanes = reinterpret_cast<const int16_t*>(bits);
      for (int64_t block = begin; block < end; block += kBlock) {
        const int64_t count = end - block < kBlock ? end - block : kBlock;
        _Pragma("omp simd")
        for (int64_t w = 0; w < count; ++w) bits[w] = splitmix64(useed, static_cast<uint64_t>(block + w));
        const int64_t first = 4 * block;
        const int64_t last = first + 4 * count < n ? first + 4 * count : n;
        const scalar_t* src = in + first;
        scalar_t* dst = o + first;
        _Pragma("omp simd")
        for (int64_t i = 0; i < last - first; ++i) {
          const opmath_t kept = static_cast<opmath_t>(src[i]) * s;
          dst[i] = lanes[i] >= limit ? static_cast<scalar_t>(kept) : static_cast<scalar_t>(0);
        }
      }
    });
  });
  return out;
}
