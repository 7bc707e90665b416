// exec/cpu/scan.cc: CumSum (see cpu_kernels.h) for float32, float64 and int64: the input viewed as
// [outer, n, inner] around the summed axis, each of the outer x inner lines summed in order.
//   Y[o, k, i] = sum of X[o, j, i] over j <= k (j < k when exclusive; j >= k, j > k when reverse)
#include <optional>

#include "exec/cpu/cpu_kernels.h"
#include "exec/cpu/parallel.h"
#include "exec/kernel_geometry.h"

namespace pt::cpu {
namespace {

template <class T>
class CumSumKernel final : public Kernel {
 public:
  CumSumKernel(const ScanGeometry& g, int threads)
      : outer_(g.outer), n_(g.n), inner_(g.inner), exclusive_(g.exclusive), reverse_(g.reverse),
        threads_(threads) {}

  void run(std::span<const Buffer> in, std::span<const Buffer> out, void*) override {
    const T* x = in[0].as<const T>();
    T* y = out[0].as<T>();
    parallel_for(outer_ * inner_, threads_, outer_ * inner_ >= 64, [&](int64_t line) {
      const int64_t base = (line / inner_) * n_ * inner_ + line % inner_;
      T sum = 0;
      for (int64_t step = 0; step < n_; ++step) {
        const int64_t at = base + (reverse_ ? n_ - 1 - step : step) * inner_;
        const T v = x[at];
        if (exclusive_) y[at] = sum;
        sum += v;
        if (!exclusive_) y[at] = sum;
      }
    });
  }

 private:
  int64_t outer_, n_, inner_;
  bool exclusive_, reverse_;
  int threads_;
};

}  // namespace

std::unique_ptr<Kernel> make_cumsum(const KernelSpec& s) {
  const std::optional<ScanGeometry> g = scan_geometry(s);
  if (!g) return nullptr;
  switch (s.inputs[0].dtype) {
    case DType::kFloat32: return std::make_unique<CumSumKernel<float>>(*g, s.cpu->threads);
    case DType::kFloat64: return std::make_unique<CumSumKernel<double>>(*g, s.cpu->threads);
    case DType::kInt64: return std::make_unique<CumSumKernel<int64_t>>(*g, s.cpu->threads);
    default: return nullptr;
  }
}

}  // namespace pt::cpu
