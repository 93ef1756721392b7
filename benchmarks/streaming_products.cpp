// A prototype product for decode steps on CPU, to measure how far the packed oneDNN kernel is from the memory
// system's limit (benchmarks/decode_products_limit.py --streaming); not used by the engine.
//
// y[M, N] = x[M, K] W^T for a few rows M and a weight read once from memory: the weight is packed into panels of
// LANES output columns, [N / LANES][K][LANES], so a product walks it strictly in order, and each panel step
// prefetches PREFETCH steps ahead; x is transposed once so the M values of one k sit together. Each panel keeps
// MBLOCK rows' accumulators in registers (GCC vector types; -march=native picks the instructions).
#include <torch/extension.h>

#include <algorithm>
#include <cstring>

typedef float lanes_t __attribute__((vector_size(LANES * 4)));

torch::Tensor pack(torch::Tensor weight) {
  const int64_t n = weight.size(0), k = weight.size(1), panels = (n + LANES - 1) / LANES;
  auto out = torch::zeros({panels, k, LANES}, weight.options());
  auto src = weight.contiguous();
  const float* s = src.data_ptr<float>();
  float* d = out.data_ptr<float>();
  for (int64_t p = 0; p < panels; ++p)
    for (int64_t j = 0; j < LANES && p * LANES + j < n; ++j)
      for (int64_t i = 0; i < k; ++i) d[(p * k + i) * LANES + j] = s[(p * LANES + j) * k + i];
  return out;
}

template <int ROWS>
static void panel_rows(const float* xt, int64_t m, int64_t row, const float* panel, int64_t k, float* y,
                       int64_t n, int64_t columns) {
  lanes_t acc[ROWS];
  for (int r = 0; r < ROWS; ++r) acc[r] = lanes_t{};
  for (int64_t i = 0; i < k; ++i) {
    lanes_t w;
    std::memcpy(&w, panel + i * LANES, sizeof w);
    __builtin_prefetch(panel + (i + PREFETCH) * LANES);
    const float* x = xt + i * m + row;
#pragma GCC unroll 16
    for (int r = 0; r < ROWS; ++r) acc[r] += x[r] * w;
  }
  for (int r = 0; r < ROWS; ++r) std::memcpy(y + (row + r) * n, &acc[r], columns * 4);
}

torch::Tensor linear(torch::Tensor x, torch::Tensor packed, int64_t n) {
  const int64_t m = x.size(0), k = x.size(1);
  auto xt = x.t().contiguous();
  auto y = torch::empty({m, n}, x.options());
  const float* xp = xt.data_ptr<float>();
  const float* wp = packed.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  for (int64_t p = 0; p < packed.size(0); ++p) {
    const float* panel = wp + p * k * LANES;
    const int64_t columns = std::min<int64_t>(LANES, n - p * LANES);
    int64_t row = 0;
    for (; row + MBLOCK <= m; row += MBLOCK) panel_rows<MBLOCK>(xp, m, row, panel, k, yp + p * LANES, n, columns);
    for (; row < m; ++row) panel_rows<1>(xp, m, row, panel, k, yp + p * LANES, n, columns);
  }
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("pack", &pack);
  module.def("linear", &linear);
}
