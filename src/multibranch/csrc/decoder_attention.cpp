// Fused CPU attention for one decoder step (one new query per hypothesis), fp32.
//
// history_attention: a hypothesis' query attends over the keys/values of its own history. Step s's keys
//   and values stay where that step wrote them (keys[s], one row per hypothesis alive then); row r reads
//   step s at row ancestors[r, s]. Beam search reorders only the small ancestor table, never the caches.
// memory_attention: cross-attention where `groups` consecutive query rows (a sentence's hypotheses) share
//   one memory row; padded memory positions are skipped.
//
// Layouts: a row holds all heads side by side, [heads * head_dim] with unit stride inside a row; rows may
// be strided (views into a fused projection's output). Outputs are new contiguous [rows, heads * head_dim].
// Built by multibranch/cpu_kernels.py with -O3 -ffast-math (vectorised exp); masked positions
// are skipped rather than set to -inf, so no infinity ever enters the arithmetic.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace {

inline float dot(const float* a, const float* b, int64_t n) {
  float acc = 0.f;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

inline void add_scaled(float alpha, const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// In place: x[0..n) -> softmax(x); n >= 1.
inline void softmax(float* x, int64_t n) {
  float top = x[0];
  for (int64_t i = 1; i < n; ++i) top = std::max(top, x[i]);
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - top);
    sum += x[i];
  }
  const float inv = 1.f / sum;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void check_rows(const torch::Tensor& t, const char* name, int64_t width) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == torch::kFloat, name, " must be a float32 CPU tensor");
  TORCH_CHECK(t.dim() == 2 && t.size(1) == width && t.stride(1) == 1, name, " must be [rows, ", width,
              "] with unit stride inside a row, got ", t.sizes(), " strides ", t.strides());
}

}  // namespace

// q [R, H*D]; keys[s], values[s] [R_s, H*D]; ancestors [R, L] int64 with L == keys.size().
torch::Tensor history_attention(const torch::Tensor& q, const std::vector<torch::Tensor>& keys,
                                const std::vector<torch::Tensor>& values, const torch::Tensor& ancestors,
                                int64_t heads, double scale) {
  const int64_t rows = q.size(0), width = q.size(1), steps = static_cast<int64_t>(keys.size());
  TORCH_CHECK(heads > 0 && width % heads == 0, "width ", width, " is not a multiple of heads ", heads);
  const int64_t head_dim = width / heads;
  check_rows(q, "q", width);
  TORCH_CHECK(steps > 0 && values.size() == keys.size(), "need as many value steps as key steps (at least one)");
  TORCH_CHECK(ancestors.scalar_type() == torch::kLong && ancestors.is_contiguous() && ancestors.dim() == 2 &&
                  ancestors.size(0) == rows && ancestors.size(1) == steps,
              "ancestors must be a contiguous int64 [", rows, ", ", steps, "] tensor, got ", ancestors.sizes());
  std::vector<const float*> key_ptr(steps), value_ptr(steps);
  std::vector<int64_t> key_stride(steps), value_stride(steps), step_rows(steps);
  for (int64_t s = 0; s < steps; ++s) {
    check_rows(keys[s], "keys[s]", width);
    check_rows(values[s], "values[s]", width);
    TORCH_CHECK(values[s].size(0) == keys[s].size(0), "keys and values of step ", s, " differ in rows");
    key_ptr[s] = keys[s].data_ptr<float>();
    value_ptr[s] = values[s].data_ptr<float>();
    key_stride[s] = keys[s].stride(0);
    value_stride[s] = values[s].stride(0);
    step_rows[s] = keys[s].size(0);
  }
  const int64_t* anc = ancestors.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t s = 0; s < steps; ++s)
      TORCH_CHECK(anc[r * steps + s] >= 0 && anc[r * steps + s] < step_rows[s], "ancestors[", r, ", ", s,
                  "] = ", anc[r * steps + s], " is not a row of step ", s, " (", step_rows[s], " rows)");

  auto out = torch::zeros({rows, width}, q.options());
  const float* q_ptr = q.data_ptr<float>();
  float* out_ptr = out.data_ptr<float>();
  const int64_t q_stride = q.stride(0);
  const float scale_f = static_cast<float>(scale);
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(heads * steps);  // [H, L]
    for (int64_t r = begin; r < end; ++r) {
      const float* query = q_ptr + r * q_stride;
      const int64_t* row_anc = anc + r * steps;
      for (int64_t s = 0; s < steps; ++s) {
        const float* key = key_ptr[s] + row_anc[s] * key_stride[s];
        for (int64_t h = 0; h < heads; ++h)
          scores[h * steps + s] = dot(query + h * head_dim, key + h * head_dim, head_dim) * scale_f;
      }
      for (int64_t h = 0; h < heads; ++h) softmax(scores.data() + h * steps, steps);
      float* result = out_ptr + r * width;
      for (int64_t s = 0; s < steps; ++s) {
        const float* value = value_ptr[s] + row_anc[s] * value_stride[s];
        for (int64_t h = 0; h < heads; ++h)
          add_scaled(scores[h * steps + s], value + h * head_dim, result + h * head_dim, head_dim);
      }
    }
  });
  return out;
}

// q [R, H*D]; keys, values [b, S, H*D] (unit stride inside a position); padding [b, S] bool (true = padded)
// or an empty tensor; R = b * groups.
torch::Tensor memory_attention(const torch::Tensor& q, const torch::Tensor& keys, const torch::Tensor& values,
                               const torch::Tensor& padding, int64_t heads, double scale) {
  const int64_t rows = q.size(0), width = q.size(1);
  TORCH_CHECK(heads > 0 && width % heads == 0, "width ", width, " is not a multiple of heads ", heads);
  const int64_t head_dim = width / heads;
  check_rows(q, "q", width);
  for (const auto* t : {&keys, &values}) {
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == torch::kFloat && t->dim() == 3 && t->size(2) == width &&
                    t->stride(2) == 1,
                "keys and values must be float32 CPU [b, S, ", width, "] with unit stride inside a position");
  }
  TORCH_CHECK(keys.size(0) == values.size(0) && keys.size(1) == values.size(1), "keys and values differ in shape");
  const int64_t memories = keys.size(0), length = keys.size(1);
  TORCH_CHECK(memories > 0 && rows % memories == 0, rows, " query rows cannot share ", memories, " memory rows");
  const int64_t groups = rows / memories;
  const bool masked = padding.defined() && padding.numel() > 0;
  if (masked) {
    TORCH_CHECK(padding.scalar_type() == torch::kBool && padding.is_contiguous() && padding.dim() == 2 &&
                    padding.size(0) == memories && padding.size(1) == length,
                "padding must be a contiguous bool [", memories, ", ", length, "] tensor");
  }
  auto out = torch::zeros({rows, width}, q.options());
  const float* q_ptr = q.data_ptr<float>();
  const float* k_ptr = keys.data_ptr<float>();
  const float* v_ptr = values.data_ptr<float>();
  const bool* pad_ptr = masked ? padding.data_ptr<bool>() : nullptr;
  float* out_ptr = out.data_ptr<float>();
  const int64_t q_stride = q.stride(0), k_row = keys.stride(0), k_pos = keys.stride(1);
  const int64_t v_row = values.stride(0), v_pos = values.stride(1);
  const float scale_f = static_cast<float>(scale);
  at::parallel_for(0, memories, 1, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> positions;
    std::vector<float> scores;  // [groups, H, n]
    for (int64_t m = begin; m < end; ++m) {
      positions.clear();
      for (int64_t s = 0; s < length; ++s)
        if (!masked || !pad_ptr[m * length + s]) positions.push_back(s);
      const int64_t n = static_cast<int64_t>(positions.size());
      if (n == 0) continue;  // nothing to attend to: zeros
      scores.resize(groups * heads * n);
      for (int64_t j = 0; j < n; ++j) {
        const float* key = k_ptr + m * k_row + positions[j] * k_pos;
        for (int64_t g = 0; g < groups; ++g) {
          const float* query = q_ptr + (m * groups + g) * q_stride;
          for (int64_t h = 0; h < heads; ++h)
            scores[(g * heads + h) * n + j] = dot(query + h * head_dim, key + h * head_dim, head_dim) * scale_f;
        }
      }
      for (int64_t gh = 0; gh < groups * heads; ++gh) softmax(scores.data() + gh * n, n);
      for (int64_t j = 0; j < n; ++j) {
        const float* value = v_ptr + m * v_row + positions[j] * v_pos;
        for (int64_t g = 0; g < groups; ++g) {
          float* result = out_ptr + (m * groups + g) * width;
          for (int64_t h = 0; h < heads; ++h)
            add_scaled(scores[(g * heads + h) * n + j], value + h * head_dim, result + h * head_dim, head_dim);
        }
      }
    }
  });
  return out;
}
