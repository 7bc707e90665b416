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

// Numpy matmul (matmul_geometry) as oneDNN sees it: with a 2-D B, A's batch dims fold into its
// rows ((B, S, K) x (K, N) -> (B*S, K) x (K, N)); otherwise the aligned ranks, batch dims of 1
// broadcast.
std::optional<MatmulPlan> plan_matmul(const Dims& a0, const Dims& b0, const Dims& y0) {
  if (any_zero(a0) || any_zero(b0)) return std::nullopt;
  const auto g = matmul_geometry(a0, b0, y0);
  if (!g || g->rank() > DNNL_MAX_NDIMS) return std::nullopt;
  const size_t r = g->rank();
  MatmulPlan p;
  if (b0.size() <= 2 && r > 2) {
    const int64_t rows = product(g->a, 0, r - 1);
    p.a = plain_desc(DType::kFloat32, {rows, g->k});
    p.b = plain_desc(DType::kFloat32, {g->k, g->n});
    p.y = plain_desc(DType::kFloat32, {rows, g->n});
    return p;
  }
  Dims y = g->batch;
  y.push_back(g->m);
  y.push_back(g->n);
  p.a = plain_desc(DType::kFloat32, g->a);
  p.b = plain_desc(DType::kFloat32, g->b);
  p.y = plain_desc(DType::kFloat32, y);
  return p;
}

// A (rows, cols) matrix stored row-major, or its transpose stored row-major when `trans`.
memory::desc matrix_desc(int64_t rows, int64_t cols, bool trans) {
  return memory::desc({rows, cols}, memory::data_type::f32,
                      trans ? memory::dims{1, rows} : memory::dims{cols, 1});
}

// Gemm (gemm_geometry): a row bias with alpha = beta = 1 (torch's Linear) goes to the
// primitive's bias; any other C is copied into Y and summed with scale beta.
std::optional<MatmulPlan> plan_gemm(const KernelSpec& s) {
  if (any_zero(s.inputs[0].shape) || any_zero(s.inputs[1].shape)) return std::nullopt;
  const auto g = gemm_geometry(s);
  if (!g) return std::nullopt;
  MatmulPlan p;
  p.a = matrix_desc(g->m, g->k, g->trans_a);
  p.b = matrix_desc(g->k, g->n, g->trans_b);
  p.y = plain_desc(DType::kFloat32, {g->m, g->n});
  p.m = g->m;
  p.n = g->n;
  p.alpha = g->alpha;
  if (g->beta == 0.f) return p;
  if (g->row_bias()) {
    p.bias = plain_desc(DType::kFloat32, {1, g->n});
    return p;
  }
  p.beta = g->beta;
  p.c_rows = g->c_rows;
  p.c_cols = g->c_cols;
  return p;
}

}  // namespace

std::unique_ptr<Kernel> make_matmul(const KernelSpec& s) {
  if (s.inputs.size() != 2 || s.outputs.size() != 1 || !float_io(s)) return nullptr;
  const auto plan = plan_matmul(s.inputs[0].shape, s.inputs[1].shape, s.outputs[0].shape);
  return plan ? make_kernel(*plan, s) : nullptr;
}

std::unique_ptr<Kernel> make_gemm(const KernelSpec& s) {
  if (s.inputs.size() < 2 || s.outputs.size() != 1 || !float_io(s)) return nullptr;
  const auto plan = plan_gemm(s);
  return plan ? make_kernel(*plan, s) : nullptr;
}

}  // namespace pt::cpu
