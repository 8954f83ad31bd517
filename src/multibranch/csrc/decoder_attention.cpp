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
#include <type_traits>
#include <vector>

namespace {

// Kernels are templates on the head width: a known width (HeadDim > 0) lets the compiler unroll the head's
// dot products and updates into whole vector registers; HeadDim == 0 reads it at run time.
template <int64_t HeadDim>
inline float dot(const float* a, const float* b, int64_t runtime_dim) {
  const int64_t n = HeadDim > 0 ? HeadDim : runtime_dim;
  float acc = 0.f;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

template <int64_t HeadDim>
inline void add_scaled(float alpha, const float* x, float* y, int64_t runtime_dim) {
  const int64_t n = HeadDim > 0 ? HeadDim : runtime_dim;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// Ask for the `width` floats at p (a row about to be read) to be brought into the cache.
inline void prefetch_row(const float* p, int64_t width) {
  for (int64_t i = 0; i < width; i += 16) __builtin_prefetch(p + i);
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

// Calls f(std::integral_constant<int64_t, D>) with D = head_dim for the common widths, else D = 0.
template <typename F>
void with_head_dim(int64_t head_dim, F&& f) {
  switch (head_dim) {
    case 32: f(std::integral_constant<int64_t, 32>{}); break;
    case 64: f(std::integral_constant<int64_t, 64>{}); break;
    case 128: f(std::integral_constant<int64_t, 128>{}); break;
    default: f(std::integral_constant<int64_t, 0>{});
  }
}

struct History {
  std::vector<const float*> key, value;
  std::vector<int64_t> key_stride, value_stride;
};

template <int64_t HeadDim>
void history_rows(int64_t begin, int64_t end, const float* q_ptr, int64_t q_stride, const History& past,
                  const int64_t* anc, int64_t steps, int64_t heads, int64_t head_dim, float scale, float* out_ptr) {
  const int64_t width = heads * head_dim;
  std::vector<float> scores(heads * steps);  // [H, L]
  for (int64_t r = begin; r < end; ++r) {
    const float* query = q_ptr + r * q_stride;
    const int64_t* row_anc = anc + r * steps;
    for (int64_t s = 0; s < steps; ++s) {
      if (s + 2 < steps) {  // the rows two steps ahead: their addresses come from the table, not a pattern
        prefetch_row(past.key[s + 2] + row_anc[s + 2] * past.key_stride[s + 2], width);
        prefetch_row(past.value[s + 2] + row_anc[s + 2] * past.value_stride[s + 2], width);
      }
      const float* key = past.key[s] + row_anc[s] * past.key_stride[s];
      for (int64_t h = 0; h < heads; ++h)
        scores[h * steps + s] = dot<HeadDim>(query + h * head_dim, key + h * head_dim, head_dim) * scale;
    }
    for (int64_t h = 0; h < heads; ++h) softmax(scores.data() + h * steps, steps);
    float* result = out_ptr + r * width;
    std::fill(result, result + width, 0.f);
    for (int64_t s = 0; s < steps; ++s) {
      const float* value = past.value[s] + row_anc[s] * past.value_stride[s];
      for (int64_t h = 0; h < heads; ++h)
        add_scaled<HeadDim>(scores[h * steps + s], value + h * head_dim, result + h * head_dim, head_dim);
    }
  }
}

template <int64_t HeadDim>
void memory_rows(int64_t begin, int64_t end, const float* q_ptr, int64_t q_stride, const float* k_ptr,
                 int64_t k_row, int64_t k_pos, const float* v_ptr, int64_t v_row, int64_t v_pos,
                 const bool* pad_ptr, int64_t length, int64_t groups, int64_t heads, int64_t head_dim, float scale,
                 float* out_ptr) {
  const int64_t width = heads * head_dim;
  std::vector<int64_t> positions;
  std::vector<float> scores;  // [groups, H, n]
  for (int64_t m = begin; m < end; ++m) {
    positions.clear();
    for (int64_t s = 0; s < length; ++s)
      if (pad_ptr == nullptr || !pad_ptr[m * length + s]) positions.push_back(s);
    const int64_t n = static_cast<int64_t>(positions.size());
    float* first_result = out_ptr + m * groups * width;
    std::fill(first_result, first_result + groups * width, 0.f);
    if (n == 0) continue;  // nothing to attend to: zeros
    scores.resize(groups * heads * n);
    for (int64_t j = 0; j < n; ++j) {
      const float* key = k_ptr + m * k_row + positions[j] * k_pos;
      for (int64_t g = 0; g < groups; ++g) {
        const float* query = q_ptr + (m * groups + g) * q_stride;
        for (int64_t h = 0; h < heads; ++h)
          scores[(g * heads + h) * n + j] = dot<HeadDim>(query + h * head_dim, key + h * head_dim, head_dim) * scale;
      }
    }
    for (int64_t gh = 0; gh < groups * heads; ++gh) softmax(scores.data() + gh * n, n);
    for (int64_t j = 0; j < n; ++j) {
      const float* value = v_ptr + m * v_row + positions[j] * v_pos;
      for (int64_t g = 0; g < groups; ++g) {
        float* result = first_result + g * width;
        for (int64_t h = 0; h < heads; ++h)
          add_scaled<HeadDim>(scores[(g * heads + h) * n + j], value + h * head_dim, result + h * head_dim,
                              head_dim);
      }
    }
  }
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
  History past;
  std::vector<int64_t> step_rows(steps);
  for (int64_t s = 0; s < steps; ++s) {
    check_rows(keys[s], "keys[s]", width);
    check_rows(values[s], "values[s]", width);
    TORCH_CHECK(values[s].size(0) == keys[s].size(0), "keys and values of step ", s, " differ in rows");
    past.key.push_back(keys[s].data_ptr<float>());
    past.value.push_back(values[s].data_ptr<float>());
    past.key_stride.push_back(keys[s].stride(0));
    past.value_stride.push_back(values[s].stride(0));
    step_rows[s] = keys[s].size(0);
  }
  const int64_t* anc = ancestors.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t s = 0; s < steps; ++s)
      TORCH_CHECK(anc[r * steps + s] >= 0 && anc[r * steps + s] < step_rows[s], "ancestors[", r, ", ", s,
                  "] = ", anc[r * steps + s], " is not a row of step ", s, " (", step_rows[s], " rows)");

  auto out = torch::empty({rows, width}, q.options());
  const float* q_ptr = q.data_ptr<float>();
  float* out_ptr = out.data_ptr<float>();
  const int64_t q_stride = q.stride(0);
  const float scale_f = static_cast<float>(scale);
  with_head_dim(head_dim, [&](auto dim) {
    at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
      history_rows<decltype(dim)::value>(begin, end, q_ptr, q_stride, past, anc, steps, heads, head_dim, scale_f,
                                         out_ptr);
    });
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
  auto out = torch::empty({rows, width}, q.options());
  const float* q_ptr = q.data_ptr<float>();
  const float* k_ptr = keys.data_ptr<float>();
  const float* v_ptr = values.data_ptr<float>();
  const bool* pad_ptr = masked ? padding.data_ptr<bool>() : nullptr;
  float* out_ptr = out.data_ptr<float>();
  const float scale_f = static_cast<float>(scale);
  with_head_dim(head_dim, [&](auto dim) {
    at::parallel_for(0, memories, 1, [&](int64_t begin, int64_t end) {
      memory_rows<decltype(dim)::value>(begin, end, q_ptr, q.stride(0), k_ptr, keys.stride(0), keys.stride(1), v_ptr,
                                        values.stride(0), values.stride(1), pad_ptr, length, groups, heads, head_dim,
                                        scale_f, out_ptr);
    });
  });
  return out;
}
