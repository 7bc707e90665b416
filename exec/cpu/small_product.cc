// exec/cpu/small_product.cc: Y = A @ B (+ bias), then a Relu or Clip, for products too small for
// oneDNN's matmul to pay its call (a classifier head, the sample MLP at batch 8: 8 x 64 x 128 took
// 2.4 us on oneDNN, where its multiply-adds take under 0.3). Inference programs only, where B is
// a constant laid out once when the kernel is made (KernelSpec::constants_fixed): B as (K, N)
// row-major, N padded to whole blocks of zeros. Four output rows are made a block of columns at a
// time (as wide as the CPU's registers hold: one copy per ISA), the sums kept in registers over
// K, the bias added to the finished sums (as the Add would), on one thread.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "exec/cpu/cpu_kernels.h"
#include "exec/cpu/dnnl_kernel.h"
#include "exec/cpu/vector_clones.h"

namespace pt::cpu {
namespace {

constexpr int64_t kPadding = 64;               // B's columns are padded to a multiple of this
constexpr int64_t kSmallMacs = int64_t{1} << 18;  // multiply-adds up to which a product is small

// v = V's floats from p, at any alignment.
template <class V>
[[gnu::always_inline]] inline void load(V& v, const float* p) { std::memcpy(&v, p, sizeof v); }

// Rows [i, i + R) of Y (m x n) = A (m x k) @ B (k x padded n), plus bias (n, or none), clamped to
// [lo, hi]: per block of kCols columns, R x kCols sums in registers of type V (GCC's vector
// extension) over k, each B row loaded once for the R rows. Each sum runs over k in order, so
// the blocking leaves every bit where it is.
template <class V, int64_t kCols, int R>
[[gnu::always_inline]] inline void product_rows(const float* a, const float* b, const float* bias, float* y,
                                                int64_t i, int64_t k, int64_t n, int64_t padded, float lo,
                                                float hi) {
  constexpr int64_t kLanes = sizeof(V) / sizeof(float), kVectors = kCols / kLanes;
  for (int64_t j0 = 0; j0 < n; j0 += kCols) {
    V acc[R][kVectors] = {};
    for (int64_t p = 0; p < k; ++p) {
      const float* row = b + p * padded + j0;
      V bv[kVectors];
      for (int64_t v = 0; v < kVectors; ++v) load(bv[v], row + kLanes * v);
      for (int r = 0; r < R; ++r) {
        const float av = a[(i + r) * k + p];
        for (int64_t v = 0; v < kVectors; ++v) acc[r][v] += av * bv[v];
      }
    }
    const int64_t w = std::min(kCols, n - j0);
    for (int r = 0; r < R; ++r) {
      float sums[kCols];
      std::memcpy(sums, acc[r], sizeof sums);
      for (int64_t j = 0; j < w; ++j)
        y[(i + r) * n + j0 + j] = std::min(std::max(sums[j] + (bias ? bias[j0 + j] : 0.f), lo), hi);
    }
  }
}

// All m rows: four at a time, then one at a time.
template <class V, int64_t kCols>
[[gnu::always_inline]] inline void all_rows(const float* a, const float* b, const float* bias, float* y, int64_t m,
                                            int64_t k, int64_t n, int64_t padded, float lo, float hi) {
  int64_t i = 0;
  for (; i + 4 <= m; i += 4) product_rows<V, kCols, 4>(a, b, bias, y, i, k, n, padded, lo, hi);
  for (; i < m; ++i) product_rows<V, kCols, 1>(a, b, bias, y, i, k, n, padded, lo, hi);
}

// One copy per ISA, each with a register block its registers hold: 4 rows x kCols sums plus a
// row of B. AVX-512 (32 zmm): 4 x 64 columns in 16 registers of 16 floats. AVX2 (16 ymm): 4 x 16
// in 8 registers of 8 (4 x 64 in 64-byte vectors there spilled every sum, 27x slower than
// AVX-512 on one machine). Baseline SSE2: 4 x 8 in 8 registers of 4. (vector_clones.h's
// target_clones gives every clone the same code; here the code differs by clone.)
typedef float V16 __attribute__((vector_size(64)));
typedef float V8 __attribute__((vector_size(32)));
typedef float V4 __attribute__((vector_size(16)));
using ProductFn = void (*)(const float*, const float*, const float*, float*, int64_t, int64_t, int64_t, int64_t, float,
                           float);

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
[[gnu::target("arch=x86-64-v4")]] void rows_avx512(const float* a, const float* b, const float* bias, float* y,
                                                   int64_t m, int64_t k, int64_t n, int64_t padded, float lo, float hi) {
  all_rows<V16, 64>(a, b, bias, y, m, k, n, padded, lo, hi);
}
[[gnu::target("arch=x86-64-v3")]] void rows_avx2(const float* a, const float* b, const float* bias, float* y,
                                                 int64_t m, int64_t k, int64_t n, int64_t padded, float lo, float hi) {
  all_rows<V8, 16>(a, b, bias, y, m, k, n, padded, lo, hi);
}
#endif
void rows_baseline(const float* a, const float* b, const float* bias, float* y, int64_t m, int64_t k, int64_t n,
                   int64_t padded, float lo, float hi) {
  all_rows<V4, 8>(a, b, bias, y, m, k, n, padded, lo, hi);
}

// The copy vector_isa() picks: the widest this CPU runs, or a narrower one where PT_MAX_CPU_ISA
// says (the isa_avx2 tests run the AVX2 copy on an AVX-512 machine, as ONEDNN_MAX_CPU_ISA caps
// oneDNN's).
ProductFn product_for_this_cpu() {
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
  switch (vector_isa()) {
    case VectorIsa::kAvx512: return rows_avx512;
    case VectorIsa::kAvx2: return rows_avx2;
    case VectorIsa::kBaseline: break;
  }
#endif
  return rows_baseline;
}

class SmallProduct final : public Kernel {
 public:
  SmallProduct(int64_t m, int64_t k, int64_t n, std::vector<float> b, std::vector<float> bias, int bias_input,
               float lo, float hi)
      : m_(m), k_(k), n_(n), b_(std::move(b)), bias_(std::move(bias)), bias_input_(bias_input), lo_(lo), hi_(hi),
        product_(product_for_this_cpu()) {}
  void run(std::span<const Buffer> in, std::span<const Buffer> out, void*) override {
    const float* bias = !bias_.empty() ? bias_.data()
                        : bias_input_ >= 0 ? in[static_cast<size_t>(bias_input_)].as<const float>()
                                           : nullptr;
    const int64_t padded = static_cast<int64_t>(b_.size()) / k_;
    product_(in[0].as<const float>(), b_.data(), bias, out[0].as<float>(), m_, k_, n_, padded, lo_, hi_);
  }

 private:
  int64_t m_, k_, n_;
  std::vector<float> b_, bias_;
  int bias_input_;
  float lo_, hi_;
  ProductFn product_;
};

// B (k x n, or n x k when trans) as (k, n rounded up to kPadding: whole blocks of every copy)
// row-major, zeros past n.
std::vector<float> pack_b(const float* b, int64_t k, int64_t n, bool trans) {
  const int64_t padded = (n + kPadding - 1) / kPadding * kPadding;
  std::vector<float> out(static_cast<size_t>(k * padded), 0.f);
  for (int64_t p = 0; p < k; ++p)
    for (int64_t j = 0; j < n; ++j) out[static_cast<size_t>(p * padded + j)] = trans ? b[j * k + p] : b[p * n + j];
  return out;
}

}  // namespace

std::unique_ptr<Kernel> make_small_product(const KernelSpec& s) {
  const Tensor* b = s.constant(1);
  if (!s.constants_fixed || !b || s.inputs.size() < 2 || s.outputs.size() != 1 || !float_io(s)) return nullptr;
  const bool gemm = s.node.op_type == "Gemm";
  int64_t m = 0, k = 0, n = 0;
  bool trans_b = false;
  std::vector<float> bias;
  if (gemm) {
    const auto g = gemm_geometry(s);
    if (!g || g->trans_a || g->alpha != 1.f || (g->beta != 0.f && !(g->row_bias() && s.constant(2)))) return nullptr;
    m = g->m, k = g->k, n = g->n, trans_b = g->trans_b;
    if (g->beta != 0.f) bias.assign(s.constant(2)->as<float>(), s.constant(2)->as<float>() + n);
  } else {
    const Dims& a = s.inputs[0].shape;
    const Dims& w = s.inputs[1].shape;
    if (s.inputs.size() != 2 || a.size() < 2 || w.size() != 2 || a.back() != w[0]) return nullptr;
    k = w[0], n = w[1], m = s.inputs[0].numel() / k;
  }
  if (m * k * n > kSmallMacs) return nullptr;
  // The epilogue: a Relu or Clip (dnnl_activation's), or, on a MatMul, an Add of a row bias.
  float lo = -std::numeric_limits<float>::infinity(), hi = std::numeric_limits<float>::infinity();
  int bias_input = -1;
  if (const KernelSpec* e = s.epilogue) {
    if (e->epilogue || e->through != 0) return nullptr;
    if (const auto op = dnnl_activation(*e)) {
      lo = op->alg == dnnl::algorithm::eltwise_relu ? 0.f : op->alpha;
      hi = op->alg == dnnl::algorithm::eltwise_relu ? hi : op->beta;
    } else if (!gemm && e->node.op_type == "Add" && e->node.domain.empty() && e->inputs.size() == 2 &&
               e->inputs[1].dtype == DType::kFloat32 && e->inputs[1].numel() == n && e->inputs[1].shape.back() == n &&
               e->outputs[0] == s.outputs[0]) {
      bias_input = static_cast<int>(s.inputs.size());
    } else {
      return nullptr;
    }
  }
  return std::make_unique<SmallProduct>(m, k, n, pack_b(b->as<float>(), k, n, trans_b), std::move(bias), bias_input,
                                        lo, hi);
}

}  // namespace pt::cpu
