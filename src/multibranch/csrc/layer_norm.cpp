// A post-norm residual sublayer's LayerNorm(x + y) in one pass over each row, fp32 on the CPU (a decoding
// copy's `Residual`, models/layers/common.py): the sum is written once and normalised in place, instead of an
// add and a layer norm each reading and writing the rows. Mean and variance in fp32, two passes over the
// row (which stays in the L1 cache): equal to torch.layer_norm up to summation order.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>

// x, y [..., d] contiguous float32 of one shape; weight, bias [d] contiguous float32 -> LayerNorm(x + y).
torch::Tensor add_layer_norm(const torch::Tensor& x, const torch::Tensor& y, const torch::Tensor& weight,
                             const torch::Tensor& bias, double eps) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat && x.is_contiguous() && x.dim() >= 1,
              "x must be a contiguous float32 CPU tensor");
  TORCH_CHECK(y.device().is_cpu() && y.scalar_type() == torch::kFloat && y.is_contiguous() && y.sizes() == x.sizes(),
              "y must be a contiguous float32 CPU tensor of x's shape ", x.sizes(), ", got ", y.sizes());
  const int64_t width = x.size(-1);
  for (const auto* t : {&weight, &bias}) {
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == torch::kFloat && t->is_contiguous() && t->dim() == 1 &&
                    t->size(0) == width,
                "weight and bias must be contiguous float32 CPU [", width, "] tensors");
  }
  auto out = torch::empty_like(x);
  const int64_t rows = width > 0 ? x.numel() / width : 0;
  const float* x_ptr = x.data_ptr<float>();
  const float* y_ptr = y.data_ptr<float>();
  const float* w = weight.data_ptr<float>();
  const float* b = bias.data_ptr<float>();
  float* out_ptr = out.data_ptr<float>();
  const float eps_f = static_cast<float>(eps);
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x_ptr + r * width;
      const float* yr = y_ptr + r * width;
      float* o = out_ptr + r * width;
      float sum = 0.f;
#pragma omp simd reduction(+ : sum)
      for (int64_t i = 0; i < width; ++i) {
        o[i] = xr[i] + yr[i];
        sum += o[i];
      }
      const float mean = sum / static_cast<float>(width);
      float squares = 0.f;
#pragma omp simd reduction(+ : squares)
      for (int64_t i = 0; i < width; ++i) {
        const float centred = o[i] - mean;
        squares += centred * centred;
      }
      const float inv_std = 1.f / std::sqrt(squares / static_cast<float>(width) + eps_f);
#pragma omp simd
      for (int64_t i = 0; i < width; ++i) o[i] = (o[i] - mean) * inv_std * w[i] + b[i];
    }
  });
  return out;
}
