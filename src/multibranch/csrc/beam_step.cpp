// A beam-search step's scoring on the CPU, fp32: two passes over the [rows, V] logits in place of a
// log-softmax (read twice, written once) followed by a candidate search (read again, a dozen small ops).
//
// row_logsumexp: per row, log(sum(exp(x))): the log-softmax's normaliser (log-probabilities are x - lse):
//   the row's maximum, then a vectorised sum of exp(x - max) with ATen's Vectorized<float>::exp_u20 (the
//   fast exponential of PyTorch's own CPU softmax kernels; over a vocabulary the normaliser stays within
//   ~1e-6 of float64's, tests/inference/test_beam_step.py), 1.6x faster than log_softmax's exp here.
// top_candidates: per sentence, the n best (hypothesis score + token value) over its w hypotheses'
//   vocabularies, without forming the [w * V] sums, by the two-stage search of
//   multibranch/inference/candidates.py (whose docstring proves it exact): per hypothesis the maximum of
//   every block of `block` tokens; the n blocks with the best (block maximum + score); the n best sums among
//   those blocks' tokens and every hypothesis' last, partial block. Best first; equal sums by flat index
//   (hypothesis * V + token), lowest first.
//
// Compiled with -ffast-math (see cpu_kernels.py): masked values are -inf, so this file compares and adds
// them but never tests for infinity or uses infinite constants (which -ffast-math assumes absent).

#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace {

using Vec = at::vec::Vectorized<float>;

inline float max_of(const float* x, int64_t n) {
  return at::vec::reduce_all<float>([](Vec& a, Vec& b) { return at::vec::maximum(a, b); }, x, n);
}

// The n best (value, flat index) pairs seen so far, best first; `offer` is one comparison for most values.
class Best {
 public:
  explicit Best(int64_t n) : n_(n) { items_.reserve(n + 1); }
  void clear() { items_.clear(); }
  bool full() const { return static_cast<int64_t>(items_.size()) == n_; }
  float worst() const { return items_.back().first; }
  void offer(float value, int64_t index) {
    if (full() && !better(value, index, items_.back().first, items_.back().second)) return;
    auto at = std::find_if(items_.begin(), items_.end(),
                           [&](const std::pair<float, int64_t>& x) { return better(value, index, x.first, x.second); });
    items_.insert(at, {value, index});
    if (static_cast<int64_t>(items_.size()) > n_) items_.pop_back();
  }
  const std::vector<std::pair<float, int64_t>>& items() const { return items_; }

 private:
  static bool better(float v, int64_t i, float w, int64_t j) { return v > w || (v == w && i < j); }
  int64_t n_;
  std::vector<std::pair<float, int64_t>> items_;
};

}  // namespace

// x [rows, V] contiguous float32 (masked entries -inf) -> [rows].
torch::Tensor row_logsumexp(const torch::Tensor& x) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat && x.is_contiguous() && x.dim() == 2 &&
                  x.size(1) >= 1,
              "x must be a contiguous float32 CPU [rows, V >= 1] tensor, got ", x.sizes());
  const int64_t rows = x.size(0), vocab = x.size(1);
  auto out = torch::empty({rows}, x.options());
  const float* x_ptr = x.data_ptr<float>();
  float* out_ptr = out.data_ptr<float>();
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* row = x_ptr + r * vocab;
      const float top = max_of(row, vocab);
      if (top < -3.0e38f) {  // every entry masked: the normaliser is -inf as well
        out_ptr[r] = top;
        continue;
      }
      const Vec shift(top);
      const float sum = at::vec::map_reduce_all<float>([&](Vec v) { return (v - shift).exp_u20(); },
                                                       [](Vec& a, Vec& b) { return a + b; }, row, vocab);
      out_ptr[r] = top + std::log(sum);
    }
  });
  return out;
}

// values [b, w, V] contiguous float32, scores [b, w] contiguous float32 -> {sums [b, n], indices [b, n] int64}.
std::vector<torch::Tensor> top_candidates(const torch::Tensor& values, const torch::Tensor& scores, int64_t n,
                                          int64_t block) {
  TORCH_CHECK(values.device().is_cpu() && values.scalar_type() == torch::kFloat && values.is_contiguous() &&
                  values.dim() == 3,
              "values must be a contiguous float32 CPU [b, w, V] tensor, got ", values.sizes());
  const int64_t sentences = values.size(0), width = values.size(1), vocab = values.size(2);
  TORCH_CHECK(scores.device().is_cpu() && scores.scalar_type() == torch::kFloat && scores.is_contiguous() &&
                  scores.dim() == 2 && scores.size(0) == sentences && scores.size(1) == width,
              "scores must be a contiguous float32 CPU [", sentences, ", ", width, "] tensor, got ", scores.sizes());
  TORCH_CHECK(n >= 1 && n <= width * vocab, "n = ", n, " candidates out of ", width * vocab);
  TORCH_CHECK(block >= 1, "block must be >= 1");
  const int64_t blocks = vocab / block, body = blocks * block;
  const bool by_blocks = blocks * width >= 2 * n;  // else too few blocks to gain anything: every token
  auto sums = torch::empty({sentences, n}, values.options());
  auto indices = torch::empty({sentences, n}, values.options().dtype(torch::kLong));
  const float* value_ptr = values.data_ptr<float>();
  const float* score_ptr = scores.data_ptr<float>();
  float* sum_ptr = sums.data_ptr<float>();
  int64_t* index_ptr = indices.data_ptr<int64_t>();
  at::parallel_for(0, sentences, 1, [&](int64_t begin, int64_t end) {
    Best best_blocks(n), best(n);
    for (int64_t m = begin; m < end; ++m) {
      const float* v = value_ptr + m * width * vocab;
      const float* score = score_ptr + m * width;
      best.clear();
      auto offer_tokens = [&](int64_t hyp, int64_t first, int64_t last) {
        for (int64_t t = first; t < last; ++t) best.offer(v[hyp * vocab + t] + score[hyp], hyp * vocab + t);
      };
      if (by_blocks) {
        best_blocks.clear();
        for (int64_t h = 0; h < width; ++h)
          for (int64_t k = 0; k < blocks; ++k)
            best_blocks.offer(max_of(v + h * vocab + k * block, block) + score[h], h * blocks + k);
        for (const auto& kept : best_blocks.items())
          offer_tokens(kept.second / blocks, (kept.second % blocks) * block, (kept.second % blocks + 1) * block);
        for (int64_t h = 0; h < width; ++h) offer_tokens(h, body, vocab);  // the partial last blocks
      } else {
        for (int64_t h = 0; h < width; ++h) offer_tokens(h, 0, vocab);
      }
      const auto& kept = best.items();
      for (int64_t j = 0; j < n; ++j) {
        sum_ptr[m * n + j] = kept[j].first;
        index_ptr[m * n + j] = kept[j].second;
      }
    }
  });
  return {sums, indices};
}
