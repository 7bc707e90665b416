// exec/cpu/linalg.cc: MatMul and Gemm on oneDNN's matmul primitive (the small products of
// inference programs excepted: small_product.cc). Shapes, strides and the primitive are fixed when
// the kernel is made (a DnnlKernel); run() points the memories at the step's buffers and
// executes.
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <array>
#include <cstring>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "exec/cpu/cpu_kernels.h"
#include "exec/cpu/dnnl_kernel.h"
#include "exec/cpu/dnnl_util.h"

namespace pt::cpu {
namespace {

using Dims = std::vector<int64_t>;

bool any_zero(const Dims& d) {
  return std::any_of(d.begin(), d.end(), [](int64_t x) { return x <= 0; });
}

// What a matmul kernel computes: Y = alpha * (A @ B) + bias, or Y = alpha * (A @ B) + beta * Y
// once Gemm's C has been broadcast into Y (c_rows x c_cols, a dim of 1 broadcast).
struct MatmulPlan {
  memory::desc a, b, y;   // as the primitive reads and writes them
  // Gemm's A where the input holds it transposed (read in place by brgemm, else copied
  // row-major: make_kernel): the input's rows and columns; {0, 0}: stored as `a`
  std::array<int64_t, 2> a_stored{};
  memory::desc bias;      // {1, N} when Gemm's C or the Add epilogue's bias is the primitive's bias
  size_t bias_input = 2;  // its index in run()'s inputs
  bool bias_epilogue = false;  // the bias is the Add epilogue's (KernelSpec::epilogue)
  // The Add epilogue's other operand, of Y's shape, summed into Y: run()'s input `sum_input`
  // (after the node's own), copied into Y unless it is Y's memory already; -1: none
  int sum_input = -1;
  float alpha = 1.f;
  float beta = 0.f;       // scale of the sum post-op; 0: no C copied into Y
  int64_t m = 0, n = 0;             // Y's shape, for broadcasting C
  int64_t c_rows = 0, c_cols = 0;  // C's shape aligned to [rows, cols] when beta != 0
};

// Y[m, n] = C[m or 0, n or 0]: Gemm's C broadcast to (M, N) before the sum post-op.
void broadcast_c(const MatmulPlan& plan, const float* c, float* y) {
  const int64_t m = plan.m, n = plan.n;
  const int64_t sm = plan.c_rows == 1 ? 0 : plan.c_cols;
  const int64_t sn = plan.c_cols == 1 ? 0 : 1;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) y[i * n + j] = c[i * sm + j * sn];
}

// A (rows, cols) matrix stored row-major, or its transpose stored row-major when `trans`.
memory::desc matrix_desc(int64_t rows, int64_t cols, bool trans) {
  return memory::desc({rows, cols}, memory::data_type::f32,
                      trans ? memory::dims{1, rows} : memory::dims{cols, 1});
}

// Y = A @ B (+ C) on oneDNN matmul (DnnlKernel). Inputs: A, B, optional C (Gemm); output Y.
// The prologue copies an A stored transposed row-major where no brgemm kernel reads it in place
// (matrix_transpose into scratch: 2.5-3.5x faster than oneDNN 2.6's reorder on a 1024 x 512
// weight gradient's X) and broadcasts C; then the product.
std::unique_ptr<Kernel> make_kernel(const MatmulPlan& plan, const KernelSpec& s) {
  return build_or_null(s, [&]() -> std::unique_ptr<Kernel> {
    auto k = std::make_unique<DnnlKernel>(*s.cpu);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (plan.alpha != 1.f) attr.set_output_scales(0, {plan.alpha});
    dnnl::post_ops ops;  // C or the Add epilogue's tensor summed into Y, then the epilogue
    if (plan.beta != 0.f) ops.append_sum(plan.beta);
    if (plan.sum_input >= 0) ops.append_sum(1.f);
    if (!plan.bias_epilogue && plan.sum_input < 0 && !append_epilogue(s, ops)) return nullptr;
    attr.set_post_ops(ops);
    const auto describe = [&](const memory::desc& a) {
      const dnnl::matmul::desc d = plan.bias.is_zero() ? dnnl::matmul::desc(a, plan.b, plan.y)
                                                       : dnnl::matmul::desc(a, plan.b, plan.bias, plan.y);
      return dnnl::matmul::primitive_desc(d, attr, k->engine());
    };
    // An A stored transposed is read in place where a brgemm kernel takes it (it packs A's
    // blocks itself), and otherwise copied row-major first (a_stored).
    std::optional<dnnl::matmul::primitive_desc> in_place;
    if (plan.a_stored[0] != 0) {
      try {
        in_place = describe(matrix_desc(plan.m, plan.a_stored[0], true));
      } catch (const dnnl::error&) {
        // no implementation reads it in place: copied
      }
      if (in_place && !implementation_is(*in_place, "brg")) in_place.reset();
    }
    const bool copy = plan.a_stored[0] != 0 && !in_place;
    const dnnl::matmul::primitive_desc pd = in_place ? *in_place : describe(plan.a);
    const memory::desc a_desc = pd.src_desc();
    // The brgemm kernels add the bias, and then the summed tensor, to the finished fp32 sum, as
    // the Add kernel would (checked bit for bit: StageProgram.ProductsAddTheirBiasAsTheAddWould,
    // .ProductsAddATensorAsTheAddWould); other implementations leave the Add on its own.
    if ((plan.bias_epilogue || plan.sum_input >= 0) && !implementation_is(pd, "brg")) return nullptr;
    Place a{Place::kInput, 0};  // A as the primitive reads it: in place, or its copy
    std::function<void(const float*, float*)> copy_a;
    if (copy) {
      a = k->reserve(static_cast<size_t>(plan.a_stored[0] * plan.a_stored[1]) * sizeof(float));
      copy_a = matrix_transpose(plan.a_stored[0], plan.a_stored[1], s.cpu->threads);
    }
    if (copy_a || plan.beta != 0.f || plan.sum_input >= 0)
      k->set_prologue([plan, copy_a, a](std::span<const Buffer> in, std::span<const Buffer> out,
                                        std::byte* scratch) {
        if (copy_a) copy_a(in[0].as<const float>(), reinterpret_cast<float*>(scratch + a.at));
        if (plan.beta != 0.f) broadcast_c(plan, in[2].as<const float>(), out[0].as<float>());
        if (plan.sum_input >= 0) {
          const Buffer& d = in[static_cast<size_t>(plan.sum_input)];
          if (d.data != out[0].data)
            std::memcpy(out[0].data, d.data, static_cast<size_t>(out[0].numel()) * sizeof(float));
        }
      });
    Args args = {{DNNL_ARG_SRC, a_desc, a},
                 {DNNL_ARG_WEIGHTS, plan.b, Place{Place::kInput, 1}},
                 {DNNL_ARG_DST, plan.y, Place{Place::kOutput, 0}}};
    if (!plan.bias.is_zero()) args.emplace_back(DNNL_ARG_BIAS, plan.bias, Place{Place::kInput, plan.bias_input});
    k->add_step(dnnl::matmul(pd), pd.scratchpad_desc(), args);
    return k;
  });
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

// An A stored transposed (a weight gradient X^T @ dY, contracted over the rows of both):
// oneDNN 2.6's brgemm kernels read it in place, packing its blocks as they go, and Gemm lets
// them (make_kernel). Where oneDNN picks another implementation for it (on the AMD Zen 4 of
// earlier sessions, an AVX2 sgemm at half the rate of the other layouts), Gemm copies A
// row-major first (matrix_transpose) and reads B as it is stored. Either way a fixed rule on the
// shapes and the machine, so a node computes the same bits on every run, stage and schedule.
// (Zen 4, one thread, m x k x n: 1024 x 1024 x 256 with A read in place at 35 GFLOP/s, copied
// 74 to 83. On an AVX-512 Xeon, forward_bench of the one Gemm at 2 threads, the copy against
// brgemm in place: 2048 x 1024 x 512 9.1-10.5 -> 8.2-9.3 ms, 1024 x 1024 x 256 3.35 -> 2.8.
// Copying B transposed as well, which the primitive reads up to 6% faster, costs more than it
// saves: 512 x 1024 x 2048 took 34-37 ms so against 28-30 without, 256 x 1024 x 1024 9-12 ms
// against 7.5-9.5.)
// Gemm (gemm_geometry): a row bias with alpha = beta = 1 (torch's Linear) goes to the
// primitive's bias; any other C is copied into Y and summed with scale beta.
std::optional<MatmulPlan> plan_gemm(const KernelSpec& s) {
  if (any_zero(s.inputs[0].shape) || any_zero(s.inputs[1].shape)) return std::nullopt;
  const auto g = gemm_geometry(s);
  if (!g) return std::nullopt;
  MatmulPlan p;
  p.a = matrix_desc(g->m, g->k, false);
  p.b = matrix_desc(g->k, g->n, g->trans_b);
  if (g->trans_a) p.a_stored = {g->k, g->m};  // A^T stored: k rows of m, copied to m rows of k
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

// A product's Add epilogue as the primitive's bias: Y (M, N) + a float vector of N (any leading
// dims of 1), Y's rows folded into M (plan_matmul). The bias is run()'s input after the node's
// own (take_add has checked the Add). Not where a Gemm has a bias of its own.
bool take_bias(const KernelSpec& s, MatmulPlan& plan) {
  const KernelSpec& e = *s.epilogue;
  if (plan.y.dims().size() != 2 || e.inputs[1].dtype != DType::kFloat32 || !plan.bias.is_zero())
    return false;
  const std::vector<int64_t>& b = e.inputs[1].shape;
  const int64_t n = plan.y.dims()[1];
  if (b.empty() || b.back() != n || b.size() > s.outputs[0].shape.size() ||
      std::any_of(b.begin(), b.end() - 1, [](int64_t d) { return d != 1; }))
    return false;
  plan.bias = plain_desc(DType::kFloat32, {1, n});
  plan.bias_input = s.inputs.size();
  plan.bias_epilogue = true;
  return true;
}

// An Add epilogue whose other operand has Y's shape and dtype, summed into Y by the primitive
// (a weight gradient added to its accumulator, W's `grad_acc + g`). It is run()'s input after the
// node's own (take_add has checked the Add).
bool take_sum(const KernelSpec& s, MatmulPlan& plan) {
  if (!(s.epilogue->inputs[1] == s.outputs[0])) return false;
  plan.sum_input = static_cast<int>(s.inputs.size());
  return true;
}

// The Add epilogue a product takes, if any: a tensor of its own shape or a row bias, where the
// Add writes the product's type and the product is unscaled with no C of its own (the bias or the
// sum would follow it). Any other epilogue is append_epilogue's.
bool take_add(const KernelSpec& s, MatmulPlan& plan) {
  if (!s.epilogue || s.epilogue->node.op_type != "Add") return true;
  const KernelSpec& e = *s.epilogue;
  if (!e.node.domain.empty() || e.inputs.size() != 2 || !(e.outputs[0] == s.outputs[0]) || plan.alpha != 1.f ||
      plan.beta != 0.f)
    return false;
  return take_sum(s, plan) || take_bias(s, plan);
}

}  // namespace

std::unique_ptr<Kernel> make_matmul(const KernelSpec& s) {
  if (s.inputs.size() != 2 || s.outputs.size() != 1 || !float_io(s)) return nullptr;
  if (auto small = make_small_product(s)) return small;
  auto plan = plan_matmul(s.inputs[0].shape, s.inputs[1].shape, s.outputs[0].shape);
  return plan && take_add(s, *plan) ? make_kernel(*plan, s) : nullptr;
}

std::unique_ptr<Kernel> make_gemm(const KernelSpec& s) {
  if (s.inputs.size() < 2 || s.outputs.size() != 1 || !float_io(s)) return nullptr;
  if (auto small = make_small_product(s)) return small;
  auto plan = plan_gemm(s);
  return plan && take_add(s, *plan) ? make_kernel(*plan, s) : nullptr;
}

}  // namespace pt::cpu
