// exec/cpu/scan.cc: CumSum (see cpu_kernels.h) for float32, float64 and int64: the input viewed as
// [outer, n, inner] around the summed axis, each of the outer x inner lines summed in order.
//   Y[o, k, i] = sum of X[o, j, i] over j <= k (j < k when exclusive; j >= k, j > k when reverse)
#include <optional>

#include "exec/cpu/cpu_kernels.h"
#include "exec/kernel_geometry.h"

namespace pt::cpu {
namespace {

template <class T>
class CumSumKernel final : public Kernel {
 public:
  CumSumKernel(int64_t outer, int64_t n, int64_t inner, bool exclusive, bool reverse, int threads)
      : outer_(outer), n_(n), inner_(inner), exclusive_(exclusive), reverse_(reverse), threads_(threads) {}

  void run(std::span<const Buffer> in, std::span<const Buffer> out, void*) override {
    const T* x = in[0].as<const T>();
    T* y = out[0].as<T>();
#pragma omp parallel for num_threads(threads_) if (outer_ * inner_ >= 64)
    for (int64_t line = 0; line < outer_ * inner_; ++line) {
      const int64_t base = (line / inner_) * n_ * inner_ + line % inner_;
      T sum = 0;
      for (int64_t step = 0; step < n_; ++step) {
        const int64_t at = base + (reverse_ ? n_ - 1 - step : step) * inner_;
        const T v = x[at];
        if (exclusive_) y[at] = sum;
        sum += v;
        if (!exclusive_) y[at] = sum;
      }
    }
  }

 private:
  int64_t outer_, n_, inner_;
  bool exclusive_, reverse_;
  int threads_;
};

}  // namespace

std::unique_ptr<Kernel> make_cumsum(const KernelSpec& s) {
  if (s.inputs.size() != 2 || s.outputs.size() != 1 || !(s.outputs[0] == s.inputs[0])) return nullptr;
  const std::optional<Dims> axis = constant_ints(s, 1);
  const Dims& shape = s.inputs[0].shape;
  const int64_t rank = static_cast<int64_t>(shape.size());
  if (!axis || axis->size() != 1 || (*axis)[0] < -rank || (*axis)[0] >= rank) return nullptr;
  const int64_t a = (*axis)[0] < 0 ? (*axis)[0] + rank : (*axis)[0];
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < a; ++d) outer *= shape[static_cast<size_t>(d)];
  for (int64_t d = a + 1; d < rank; ++d) inner *= shape[static_cast<size_t>(d)];
  const int64_t n = shape[static_cast<size_t>(a)];
  const bool exclusive = s.node.attr_int("exclusive", 0) != 0, reverse = s.node.attr_int("reverse", 0) != 0;
  if (s.inputs[0].dtype == DType::kFloat32)
    return std::make_unique<CumSumKernel<float>>(outer, n, inner, exclusive, reverse, s.cpu->threads);
  if (s.inputs[0].dtype == DType::kFloat64)
    return std::make_unique<CumSumKernel<double>>(outer, n, inner, exclusive, reverse, s.cpu->threads);
  if (s.inputs[0].dtype == DType::kInt64)
    return std::make_unique<CumSumKernel<int64_t>>(outer, n, inner, exclusive, reverse, s.cpu->threads);
  return nullptr;
}

}  // namespace pt::cpu
