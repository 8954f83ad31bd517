// The Python module of multibranch's CPU kernels (built by multibranch/cpu_kernels.py).

#include <torch/extension.h>

#include <vector>

torch::Tensor history_attention(const torch::Tensor& q, const std::vector<torch::Tensor>& keys,
                                const std::vector<torch::Tensor>& values, const torch::Tensor& ancestors,
                                int64_t heads, double scale);
torch::Tensor memory_attention(const torch::Tensor& q, const torch::Tensor& keys, const torch::Tensor& values,
                               const torch::Tensor& padding, int64_t heads, double scale);
torch::Tensor row_logsumexp(const torch::Tensor& x);
std::vector<torch::Tensor> top_candidates(const torch::Tensor& values, const torch::Tensor& scores, int64_t n,
                                          int64_t block);
torch::Tensor add_layer_norm(const torch::Tensor& x, const torch::Tensor& y, const torch::Tensor& weight,
                             const torch::Tensor& bias, double eps);
torch::Tensor dropout_apply(const torch::Tensor& x, const torch::Tensor& seed, int64_t threshold, double scale);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("history_attention", &history_attention, "one query per row over its own history (ancestor table)");
  m.def("memory_attention", &memory_attention, "one query per row over a memory row shared by `groups` rows");
  m.def("row_logsumexp", &row_logsumexp, "per row, log(sum(exp(x))) of [rows, V] (-inf entries allowed)");
  m.def("add_layer_norm", &add_layer_norm, "LayerNorm(x + y) in one pass per row");
  m.def("dropout_apply", &dropout_apply, "x * scale where the seed's counter-based stream keeps an element, else 0");
  m.def("top_candidates", &top_candidates, "per sentence, the n best hypothesis score + token value");
}
