// exec/cpu/linalg.cc: MatMul and Gemm on oneDNN's matmul primitive. Shapes, strides and the
// primitive are fixed when the kernel is made; run() points the memories at the step's buffers
// and executes.
#include <omp.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "exec/cpu/cpu_kernels.h"
#include "exec/cpu/dnnl_util.h"

namespace pt::cpu {
namespace {

using Dims = std::vector<int64_t>;
using dnnl::memory;


// One oneDNN primitive and the memories it reads and writes. The memories carry no data until
// bind() points them at a step's buffers, so executing allocates nothing.
class PrimitiveCall {
 public:
  explicit PrimitiveCall(dnnl::primitive p) : prim_(std::move(p)) {}
  // Adds argument `arg` (DNNL_ARG_*) laid out as md; returns its slot for bind().
  int add(int arg, const memory::desc& md, const dnnl::engine& eng) {
    mems_.emplace_back(md, eng, static_cast<void*>(DNNL_MEMORY_NONE));
    args_.push_back({arg, mems_.back().get()});
    return static_cast<int>(mems_.size()) - 1;
  }
  void bind(int slot, const void* data) const {
    mems_[static_cast<size_t>(slot)].set_data_handle(const_cast<void*>(data));
  }
  void execute(dnnl::stream& s) const {
    const dnnl_status_t st = dnnl_primitive_execute(prim_.get(), s.get(),
                                                    static_cast<int>(args_.size()), args_.data());
    PT_CHECK(st == dnnl_success, "oneDNN matmul failed with status " + std::to_string(st));
  }

 private:
  dnnl::primitive prim_;
  std::vector<memory> mems_;
  std::vector<dnnl_exec_arg_t> args_;
};

// The scratchpad oneDNN asks for, 64-byte aligned inside the program's scratch block.
void* aligned(void* scratch) {
  const auto p = reinterpret_cast<uintptr_t>(scratch);
  return reinterpret_cast<void*>((p + kScratchAlign - 1) / kScratchAlign * kScratchAlign);
}

bool all_float(const KernelSpec& s) {
  for (size_t i = 0; i < s.inputs.size(); ++i)
    if (s.has_input(i) && s.inputs[i].dtype != DType::kFloat32) return false;
  return !s.outputs.empty() && s.outputs[0].dtype == DType::kFloat32;
}

bool any_zero(const Dims& d) {
  return std::any_of(d.begin(), d.end(), [](int64_t x) { return x <= 0; });
}


// What a matmul kernel computes: Y = alpha * (A @ B) + bias, or Y = alpha * (A @ B) + beta * Y
// once Gemm's C has been broadcast into Y (c_rows x c_cols, a dim of 1 broadcast).
struct MatmulPlan {
  memory::desc a, b, y;
  memory::desc bias;      // {1, N} when C is used as the primitive's bias, else zero
  float alpha = 1.f;
  float beta = 0.f;       // scale of the sum post-op; 0: no C copied into Y
  int64_t m = 0, n = 0;             // Y's shape, for broadcasting C
  int64_t c_rows = 0, c_cols = 0;  // C's shape aligned to [rows, cols] when beta != 0
};

// Y = A @ B (+ C) on oneDNN matmul. Inputs: A, B, optional C (Gemm); output Y.
class MatmulKernel final : public Kernel {
 public:
  MatmulKernel(const MatmulPlan& plan, CpuContext& ctx)
      : plan_(plan),
        stream_(*ctx.stream),
        threads_(ctx.threads),
        call_(make_primitive(plan, *ctx.engine)) {
    a_ = call_.add(DNNL_ARG_SRC, plan.a, *ctx.engine);
    b_ = call_.add(DNNL_ARG_WEIGHTS, plan.b, *ctx.engine);
    y_ = call_.add(DNNL_ARG_DST, plan.y, *ctx.engine);
    if (!plan.bias.is_zero()) bias_ = call_.add(DNNL_ARG_BIAS, plan.bias, *ctx.engine);
    if (scratchpad_.get_size() > 0)
      scratch_ = call_.add(DNNL_ARG_SCRATCHPAD, scratchpad_, *ctx.engine);
  }

  size_t scratch_bytes() const override {
    return scratchpad_.get_size() > 0 ? scratchpad_.get_size() + kScratchAlign : 0;
  }

  void run(std::span<const Buffer> in, std::span<const Buffer> out, void* scratch) override {
    if (plan_.beta != 0.f) broadcast_c(in[2].as<const float>(), out[0].as<float>());
    call_.bind(a_, in[0].data);
    call_.bind(b_, in[1].data);
    call_.bind(y_, out[0].data);
    if (bias_ >= 0) call_.bind(bias_, in[2].data);
    if (scratch_ >= 0) call_.bind(scratch_, aligned(scratch));
    const ThreadScope threads(threads_);
    call_.execute(stream_);
  }

 private:
  dnnl::primitive make_primitive(const MatmulPlan& plan, const dnnl::engine& eng) {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (plan.alpha != 1.f) attr.set_output_scales(0, {plan.alpha});
    if (plan.beta != 0.f) {
      dnnl::post_ops ops;
      ops.append_sum(plan.beta);
      attr.set_post_ops(ops);
    }
    const dnnl::matmul::desc d = plan.bias.is_zero()
                                     ? dnnl::matmul::desc(plan.a, plan.b, plan.y)
                                     : dnnl::matmul::desc(plan.a, plan.b, plan.bias, plan.y);
    const dnnl::matmul::primitive_desc pd(d, attr, eng);
    scratchpad_ = pd.scratchpad_desc();
    return dnnl::matmul(pd);
  }

  // Y[m, n] = C[m or 0, n or 0]: Gemm's C broadcast to (M, N) before the sum post-op.
  void broadcast_c(const float* c, float* y) const {
    const int64_t m = plan_.m, n = plan_.n;
    const int64_t sm = plan_.c_rows == 1 ? 0 : plan_.c_cols;
    const int64_t sn = plan_.c_cols == 1 ? 0 : 1;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) y[i * n + j] = c[i * sm + j * sn];
  }

  MatmulPlan plan_;
  memory::desc scratchpad_;  // set by make_primitive while call_ is initialised
  dnnl::stream& stream_;
  int threads_;
  PrimitiveCall call_;
  int a_ = -1, b_ = -1, y_ = -1, bias_ = -1, scratch_ = -1;
};

std::unique_ptr<Kernel> make_kernel(const MatmulPlan& plan, const KernelSpec& s) {
  const ThreadScope threads(s.cpu->threads);
  try {
    return std::make_unique<MatmulKernel>(plan, *s.cpu);
  } catch (const dnnl::error&) {
    return nullptr;  // oneDNN has no implementation for this combination
  }
}

// Numpy matmul as oneDNN sees it. 1-D operands are promoted (A: (K) -> (1, K), B: (K) -> (K, 1));
// with a 2-D B, A's batch dims fold into its rows ((B, S, K) x (K, N) -> (B*S, K) x (K, N));
// otherwise ranks are aligned with leading 1s and batch dims of 1 broadcast.
std::optional<MatmulPlan> plan_matmul(const Dims& a0, const Dims& b0, const Dims& y0) {
  if (a0.empty() || b0.empty() || any_zero(a0) || any_zero(b0)) return std::nullopt;
  Dims a = a0.size() == 1 ? Dims{1, a0[0]} : a0;
  Dims b = b0.size() == 1 ? Dims{b0[0], 1} : b0;
  const int64_t k = a.back(), m = a[a.size() - 2], n = b.back();
  if (b[b.size() - 2] != k) return std::nullopt;
  // Numpy's result shape: broadcast batch dims, then M unless A was 1-D, N unless B was 1-D.
  const size_t r = std::max(a.size(), b.size());
  a.insert(a.begin(), r - a.size(), 1);
  b.insert(b.begin(), r - b.size(), 1);
  Dims batch;
  for (size_t i = 0; i + 2 < r; ++i) {
    if (a[i] != b[i] && a[i] != 1 && b[i] != 1) return std::nullopt;
    batch.push_back(std::max(a[i], b[i]));
  }
  Dims want = batch;
  if (a0.size() > 1) want.push_back(m);
  if (b0.size() > 1) want.push_back(n);
  if (want != y0 || r > DNNL_MAX_NDIMS) return std::nullopt;

  MatmulPlan p;
  if (b0.size() <= 2 && r > 2) {
    const int64_t rows = product(a, 0, r - 1);
    p.a = plain_desc(DType::kFloat32, {rows, k});
    p.b = plain_desc(DType::kFloat32, {k, n});
    p.y = plain_desc(DType::kFloat32, {rows, n});
    return p;
  }
  Dims y = batch;
  y.push_back(m);
  y.push_back(n);
  p.a = plain_desc(DType::kFloat32, a);
  p.b = plain_desc(DType::kFloat32, b);
  p.y = plain_desc(DType::kFloat32, y);
  return p;
}

// A (rows, cols) matrix stored row-major, or its transpose stored row-major when `trans`.
memory::desc matrix_desc(int64_t rows, int64_t cols, bool trans) {
  return memory::desc({rows, cols}, memory::data_type::f32,
                      trans ? memory::dims{1, rows} : memory::dims{cols, 1});
}

// Gemm: Y = alpha * A' @ B' + beta * C, A' = transA ? A^T : A (M, K), B' = transB ? B^T : B
// (K, N), C unidirectionally broadcast to (M, N). A row bias with alpha = beta = 1 (torch's
// Linear) goes to the primitive's bias; any other C is copied into Y and summed with scale beta.
std::optional<MatmulPlan> plan_gemm(const KernelSpec& s) {
  const Dims& a = s.inputs[0].shape;
  const Dims& b = s.inputs[1].shape;
  if (a.size() != 2 || b.size() != 2 || any_zero(a) || any_zero(b)) return std::nullopt;
  const bool ta = s.node.attr_int("transA", 0) != 0;
  const bool tb = s.node.attr_int("transB", 0) != 0;
  const int64_t m = ta ? a[1] : a[0], k = ta ? a[0] : a[1];
  const int64_t n = tb ? b[0] : b[1];
  if ((tb ? b[1] : b[0]) != k || s.outputs[0].shape != Dims{m, n}) return std::nullopt;

  MatmulPlan p;
  p.a = matrix_desc(m, k, ta);
  p.b = matrix_desc(k, n, tb);
  p.y = plain_desc(DType::kFloat32, {m, n});
  p.m = m;
  p.n = n;
  p.alpha = s.node.attr_float("alpha", 1.f);
  const float beta = s.node.attr_float("beta", 1.f);
  if (!s.has_input(2) || beta == 0.f) return p;

  const Dims& c = s.inputs[2].shape;
  if (c.size() > 2) return std::nullopt;
  const int64_t rows = c.size() == 2 ? c[0] : 1;
  const int64_t cols = c.empty() ? 1 : c.back();
  if ((rows != 1 && rows != m) || (cols != 1 && cols != n)) return std::nullopt;
  if (rows == 1 && cols == n && p.alpha == 1.f && beta == 1.f) {
    p.bias = plain_desc(DType::kFloat32, {1, n});
    return p;
  }
  p.beta = beta;
  p.c_rows = rows;
  p.c_cols = cols;
  return p;
}

}  // namespace

std::unique_ptr<Kernel> make_matmul(const KernelSpec& s) {
  if (s.inputs.size() != 2 || s.outputs.size() != 1 || !all_float(s)) return nullptr;
  const auto plan = plan_matmul(s.inputs[0].shape, s.inputs[1].shape, s.outputs[0].shape);
  return plan ? make_kernel(*plan, s) : nullptr;
}

std::unique_ptr<Kernel> make_gemm(const KernelSpec& s) {
  if (s.inputs.size() < 2 || s.outputs.size() != 1 || !all_float(s)) return nullptr;
  const auto plan = plan_gemm(s);
  return plan ? make_kernel(*plan, s) : nullptr;
}

}  // namespace pt::cpu
