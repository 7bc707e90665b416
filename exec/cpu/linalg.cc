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
    PT_CHECK(st == dnnl_success, "oneDNN primitive failed with status " + std::to_string(st));
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
  memory::desc a, b, y;   // as the primitive reads and writes them
  // A and B as the inputs hold them, where the primitive reads a copy laid out as `a` or `b`
  // (gemm_relayout); zero: read in place
  memory::desc a_stored, b_stored;
  memory::desc bias;      // {1, N} when C is used as the primitive's bias, else zero
  float alpha = 1.f;
  float beta = 0.f;       // scale of the sum post-op; 0: no C copied into Y
  int64_t m = 0, n = 0;             // Y's shape, for broadcasting C
  int64_t c_rows = 0, c_cols = 0;  // C's shape aligned to [rows, cols] when beta != 0
};

// A copy of one matmul operand into the kernel's scratch in the layout the primitive reads
// (a oneDNN reorder), made before each product.
class OperandCopy {
 public:
  OperandCopy(const memory::desc& from, const memory::desc& to, const dnnl::engine& eng,
              size_t offset)
      : call_(dnnl::reorder(dnnl::reorder::primitive_desc(eng, from, eng, to))), offset_(offset) {
    from_ = call_.add(DNNL_ARG_FROM, from, eng);
    to_ = call_.add(DNNL_ARG_TO, to, eng);
  }
  // Copies `data` to its place in `scratch` (aligned) and returns that place.
  const void* run(const void* data, std::byte* scratch, dnnl::stream& s) const {
    std::byte* copy = scratch + offset_;
    call_.bind(from_, data);
    call_.bind(to_, copy);
    call_.execute(s);
    return copy;
  }

 private:
  PrimitiveCall call_;
  size_t offset_;
  int from_ = -1, to_ = -1;
};

// Y = A @ B (+ C) on oneDNN matmul. Inputs: A, B, optional C (Gemm); output Y. Scratch holds the
// operand copies (MatmulPlan::a_stored, b_stored), then oneDNN's scratchpad.
class MatmulKernel final : public Kernel {
 public:
  MatmulKernel(const MatmulPlan& plan, CpuContext& ctx)
      : plan_(plan),
        stream_(*ctx.stream),
        threads_(ctx.threads),
        call_(make_primitive(plan, *ctx.engine)) {
    const dnnl::engine& eng = *ctx.engine;
    a_ = call_.add(DNNL_ARG_SRC, plan.a, eng);
    b_ = call_.add(DNNL_ARG_WEIGHTS, plan.b, eng);
    y_ = call_.add(DNNL_ARG_DST, plan.y, eng);
    if (!plan.bias.is_zero()) bias_ = call_.add(DNNL_ARG_BIAS, plan.bias, eng);
    if (!plan.a_stored.is_zero()) {
      copy_a_.emplace(plan.a_stored, plan.a, eng, copies_bytes_);
      copies_bytes_ += round_up(plan.a.get_size());
    }
    if (!plan.b_stored.is_zero()) {
      copy_b_.emplace(plan.b_stored, plan.b, eng, copies_bytes_);
      copies_bytes_ += round_up(plan.b.get_size());
    }
    if (scratchpad_.get_size() > 0)
      scratch_ = call_.add(DNNL_ARG_SCRATCHPAD, scratchpad_, eng);
  }

  size_t scratch_bytes() const override {
    const size_t total = copies_bytes_ + scratchpad_.get_size();
    return total > 0 ? total + kScratchAlign : 0;
  }

  void run(std::span<const Buffer> in, std::span<const Buffer> out, void* scratch) override {
    if (plan_.beta != 0.f) broadcast_c(in[2].as<const float>(), out[0].as<float>());
    auto* base = static_cast<std::byte*>(aligned(scratch));
    const ThreadScope threads(threads_);
    call_.bind(a_, copy_a_ ? copy_a_->run(in[0].data, base, stream_) : in[0].data);
    call_.bind(b_, copy_b_ ? copy_b_->run(in[1].data, base, stream_) : in[1].data);
    call_.bind(y_, out[0].data);
    if (bias_ >= 0) call_.bind(bias_, in[2].data);
    if (scratch_ >= 0) call_.bind(scratch_, base + copies_bytes_);
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
  std::optional<OperandCopy> copy_a_, copy_b_;
  size_t copies_bytes_ = 0;  // scratch taken by the operand copies, ahead of the scratchpad
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

// The layouts in which the primitive reads Gemm's A and B, stored transposed or not: oneDNN
// 2.6's AVX2 sgemm runs an A stored transposed (a weight gradient X^T @ dY, contracted over the
// rows of both) at half the rate of the other layouts, so such an A is copied row-major first;
// and when the product is wider than tall it also reads B transposed, the layout it runs at
// full rate at every shape measured. A fixed rule on the shapes, so a node computes the same
// bits on every run, stage and schedule. (Single thread, m x n x k in GFLOP/s, A stored
// transposed: 1024 x 256 x 1024 at 35 -> 74 to 83 with A copied; 256 x 1024 x 1024 at 32 ->
// 67 to 77 with both copied.)
struct GemmLayout {
  bool copy_a = false, copy_b = false;
};
GemmLayout gemm_relayout(int64_t m, int64_t n, bool trans_a, bool trans_b) {
  if (!trans_a) return {};
  return {true, !trans_b && m < n};
}

// Gemm (gemm_geometry): a row bias with alpha = beta = 1 (torch's Linear) goes to the
// primitive's bias; any other C is copied into Y and summed with scale beta.
std::optional<MatmulPlan> plan_gemm(const KernelSpec& s) {
  if (any_zero(s.inputs[0].shape) || any_zero(s.inputs[1].shape)) return std::nullopt;
  const auto g = gemm_geometry(s);
  if (!g) return std::nullopt;
  MatmulPlan p;
  const GemmLayout layout = gemm_relayout(g->m, g->n, g->trans_a, g->trans_b);
  p.a = matrix_desc(g->m, g->k, g->trans_a && !layout.copy_a);
  p.b = matrix_desc(g->k, g->n, g->trans_b || layout.copy_b);
  if (layout.copy_a) p.a_stored = matrix_desc(g->m, g->k, g->trans_a);
  if (layout.copy_b) p.b_stored = matrix_desc(g->k, g->n, g->trans_b);
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
