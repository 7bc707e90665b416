// exec/cpu/softmax.cc: Softmax and LogSoftmax with their gradients (SoftmaxGrad, LogSoftmaxGrad;
// core/pipetrain_ops.h has their math). Along the last axis they run as row loops of their own,
// which also apply the element-wise nodes fused into them (exec/cpu/row_chain.h): Softmax a
// prologue chain (an attention's scale and mask), SoftmaxGrad an epilogue chain (the mask's Where
// and the scale on the way back), each link with the float operation its own kernel computes.
// Along any other axis they run on oneDNN's softmax_v2, unfused.
#include <omp.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "exec/cpu/cpu_kernels.h"
#include "exec/cpu/dnnl_kernel.h"
#include "exec/cpu/dnnl_util.h"
#include "exec/cpu/lane_math.h"
#include "exec/cpu/parallel.h"
#include "exec/cpu/row_chain.h"
#include "exec/cpu/vector_clones.h"

namespace pt::cpu {
namespace {

constexpr int64_t kParallelMin = 1 << 15;  // elements below which the rows stay on one thread

// exp(x), 0 below the smallest normal float's log (exp_poly clamps there instead).
inline float exp_or_zero(float x) { return x < -87.33f ? 0.f : exp_poly(x); }

// Rows [r0, r1) of n elements: y = softmax(x') (Log: log-softmax), x' the row after the prologue
// links (run()'s inputs hold their operands): e^(x' - max) times the reciprocal of its sum (Log:
// x' - max - log of that sum). Max and sums by lanes folded by halves (lane_math.h row_max,
// row_sum, in isa's 16-lane type): in a fixed order, cheap on rows of 64.
template <bool Log>
void softmax_rows(VectorIsa isa, const float* x, float* y, int64_t r0, int64_t r1, int64_t n,
                  std::span<const RowLink> links, std::span<const Buffer> inputs) {
  if (!links.empty()) {
    apply_links(links, inputs, r0, r1, n, x + r0 * n, y + r0 * n);
    x = y;
  }
  on_vector_isa(isa, [&](auto on) __attribute__((always_inline)) {
    using L = typename decltype(on)::Lanes;
    for (int64_t r = r0; r < r1; ++r) {
      const float* src = x + r * n;
      float* dst = y + r * n;
      const float m = row_max<L>(src, n);
#pragma omp simd
      for (int64_t k = 0; k < n; ++k) dst[k] = exp_or_zero(src[k] - m);
      const float sum = row_sum<L>(dst, n);
      if (Log) {
        const float log_sum = std::log(sum);
#pragma omp simd
        for (int64_t k = 0; k < n; ++k) dst[k] = (src[k] - m) - log_sum;
      } else {
        const float inv = 1.f / sum;
#pragma omp simd
        for (int64_t k = 0; k < n; ++k) dst[k] *= inv;
      }
    }
  });
}

// Rows [r0, r1) of n elements: dx = y * (dy - sum(dy * y)) (Log: dy - exp(y) * sum(dy)), the
// sums as in softmax_rows; with epilogue links, the rows go to `rows` ((r1 - r0) n floats) and
// the links write dx from there, so that a link's operand may be dx itself (a gradient summed
// into its accumulator in place).
template <bool Log>
void softmax_grad_rows(VectorIsa isa, const float* dy, const float* y, float* dx, int64_t r0, int64_t r1, int64_t n,
                       std::span<const RowLink> links, std::span<const Buffer> inputs, float* rows) {
  on_vector_isa(isa, [&](auto on) __attribute__((always_inline)) {
    using L = typename decltype(on)::Lanes;
    for (int64_t r = r0; r < r1; ++r) {
      const float* d = dy + r * n;
      const float* p = y + r * n;
      float* g = links.empty() ? dx + r * n : rows + (r - r0) * n;
      if (Log) {
        const float s = row_sum<L>(d, n);
#pragma omp simd
        for (int64_t k = 0; k < n; ++k) g[k] = d[k] - exp_poly(p[k]) * s;
      } else {
        const float s = row_dot<L>(d, p, n);
#pragma omp simd
        for (int64_t k = 0; k < n; ++k) g[k] = p[k] * (d[k] - s);
      }
    }
  });
  if (!links.empty()) apply_links(links, inputs, r0, r1, n, rows, dx + r0 * n);
}

// Rows per block of for_row_blocks: about kVectorBlock elements.
int64_t rows_per_block(int64_t n) { return std::max<int64_t>(1, kVectorBlock / std::max<int64_t>(n, 1)); }

// fn(r0, r1) over blocks of rows_per_block(n) rows, in parallel when the tensor is large; each row
// is done whole by one thread, so its bits do not depend on the count.
template <class Fn>
void for_row_blocks(int64_t rows, int64_t n, int threads, Fn fn) {
  const int64_t block = rows_per_block(n);
  const int64_t blocks = (rows + block - 1) / block;
  parallel_for(blocks, threads, rows * n >= kParallelMin,
               [&](int64_t b) { fn(b * block, std::min(rows, (b + 1) * block)); });
}

// Softmax or LogSoftmax along the last axis, with its prologue links: input 0 is the tensor the
// chain starts from (the node's own input without one).
class SoftmaxRows final : public Kernel {
 public:
  SoftmaxRows(int64_t rows, int64_t n, bool log, std::vector<RowLink> links, int threads)
      : rows_(rows), n_(n), log_(log), links_(std::move(links)), threads_(threads), isa_(vector_isa()) {}
  void run(std::span<const Buffer> in, std::span<const Buffer> out, void*) override {
    const float* x = in[0].as<const float>();
    float* y = out[0].as<float>();
    for_row_blocks(rows_, n_, threads_, [&](int64_t r0, int64_t r1) {
      if (log_) softmax_rows<true>(isa_, x, y, r0, r1, n_, links_, in);
      else softmax_rows<false>(isa_, x, y, r0, r1, n_, links_, in);
    });
  }

 private:
  int64_t rows_, n_;
  bool log_;
  std::vector<RowLink> links_;
  int threads_;
  VectorIsa isa_;
};

// SoftmaxGrad or LogSoftmaxGrad along the last axis, with its epilogue links. oneDNN 2.6 has no
// JIT softmax backward below AVX-512, and its reference one took 4% of a transformer's step.
class SoftmaxGradRows final : public Kernel {
 public:
  SoftmaxGradRows(int64_t rows, int64_t n, bool log, std::vector<RowLink> links, int threads)
      : rows_(rows), n_(n), log_(log), links_(std::move(links)), threads_(threads), isa_(vector_isa()) {}
  void run(std::span<const Buffer> in, std::span<const Buffer> out, void* scratch) override {
    const float* dy = in[0].as<const float>();
    const float* y = in[1].as<const float>();
    float* dx = out[0].as<float>();
    auto* rows = static_cast<float*>(scratch);
    const int64_t block = rows_per_block(n_) * n_;
    for_row_blocks(rows_, n_, threads_, [&](int64_t r0, int64_t r1) {
      // No scratch without links (scratch_bytes() is 0, so `rows` is null and is not offset).
      float* mine = links_.empty() ? nullptr : rows + omp_get_thread_num() * block;
      if (log_) softmax_grad_rows<true>(isa_, dy, y, dx, r0, r1, n_, links_, in, mine);
      else softmax_grad_rows<false>(isa_, dy, y, dx, r0, r1, n_, links_, in, mine);
    });
  }
  // A block of rows per thread where the links apply.
  size_t scratch_bytes() const override {
    return links_.empty() ? 0 : static_cast<size_t>(threads_ * rows_per_block(n_) * n_) * sizeof(float);
  }

 private:
  int64_t rows_, n_;
  bool log_;
  std::vector<RowLink> links_;
  int threads_;
  VectorIsa isa_;
};

// The node's axis, normalised; -1 when out of range.
int64_t softmax_axis(const KernelSpec& s) {
  const int64_t rank = static_cast<int64_t>(s.inputs[0].shape.size());
  const int64_t axis = s.node.attr_int("axis", -1);
  return rank == 0 ? -1 : normalize_axis(axis, static_cast<size_t>(rank));
}

// A row kernel (SoftmaxRows or SoftmaxGradRows) along the last axis, with the links fused into it
// on its side (the prologue's for the forward, the epilogue's for the backward; their inputs
// follow the node's own); nullptr when a link is on the other side or is not one a row applies.
template <class Rows>
std::unique_ptr<Kernel> make_rows(const KernelSpec& s, bool log, bool prologue) {
  size_t next = s.inputs.size();
  auto after = epilogue_links(s, next);
  auto before = prologue_links(s, next);
  if (!after || !before || !(prologue ? *after : *before).empty()) return nullptr;
  const int64_t n = s.inputs[0].shape.back();
  return std::make_unique<Rows>(n > 0 ? s.inputs[0].numel() / n : 0, n, log,
                                std::move(prologue ? *before : *after), s.cpu->threads);
}

// Softmax (softmax_accurate) or LogSoftmax (softmax_log) along one axis of X (opset 13): the last
// axis as SoftmaxRows (a prologue chain, no epilogue), any other on oneDNN, unfused.
std::unique_ptr<Kernel> make_softmax_like(const KernelSpec& s, dnnl::algorithm alg) {
  if (s.inputs.size() != 1 || !single_output(s) || !float_only(s) || s.graph.opset() < 13 ||
      s.outputs[0] != s.inputs[0])
    return nullptr;
  const int64_t axis = softmax_axis(s);
  if (axis < 0) return nullptr;
  if (axis == static_cast<int64_t>(s.inputs[0].shape.size()) - 1)
    return make_rows<SoftmaxRows>(s, alg == dnnl::algorithm::softmax_log, true);
  if (s.prologue || s.epilogue) return nullptr;
  return build_or_null(s, [&]() -> std::unique_ptr<Kernel> {
    auto k = std::make_unique<DnnlKernel>(*s.cpu);
    const memory::desc x_md = plain_desc(s.inputs[0]);
    const dnnl::softmax_v2_forward::desc d(dnnl::prop_kind::forward_inference, alg, x_md, x_md,
                                           static_cast<int>(axis));
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    const dnnl::softmax_v2_forward::primitive_desc pd(d, attr, k->engine());
    k->add_step(dnnl::softmax_v2_forward(pd), pd.scratchpad_desc(),
                {{DNNL_ARG_SRC, x_md, {Place::kInput, 0}}, {DNNL_ARG_DST, x_md, {Place::kOutput, 0}}});
    return k;
  });
}

// SoftmaxGrad (softmax_accurate) or LogSoftmaxGrad (softmax_log) along `axis` (default -1):
// DIFF_DST = dY (input 0), DST = Y (input 1), one float32 shape. The last axis runs as
// SoftmaxGradRows (an epilogue chain, no prologue), any other on oneDNN's softmax_v2 backward.
std::unique_ptr<Kernel> make_softmax_grad_like(const KernelSpec& s, dnnl::algorithm alg) {
  if (s.inputs.size() != 2 || !s.has_input(0) || !s.has_input(1) || !single_output(s) || !float_only(s) ||
      !(s.inputs[1] == s.inputs[0]) || !(s.outputs[0] == s.inputs[0]))
    return nullptr;
  const int64_t axis = softmax_axis(s);
  if (axis < 0) return nullptr;
  if (axis == static_cast<int64_t>(s.inputs[0].shape.size()) - 1)
    return make_rows<SoftmaxGradRows>(s, alg == dnnl::algorithm::softmax_log, false);
  if (s.prologue || s.epilogue) return nullptr;
  return build_or_null(s, [&]() -> std::unique_ptr<Kernel> {
    auto k = std::make_unique<DnnlKernel>(*s.cpu);
    const memory::desc md = plain_desc(s.inputs[0]);
    const int ax = static_cast<int>(axis);
    const dnnl::softmax_v2_forward::primitive_desc hint(
        {dnnl::prop_kind::forward_training, alg, md, md, ax}, k->engine());
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    const dnnl::softmax_v2_backward::primitive_desc pd({alg, md, md, md, ax}, attr, k->engine(), hint);
    k->add_step(dnnl::softmax_v2_backward(pd), pd.scratchpad_desc(),
                {{DNNL_ARG_DIFF_DST, md, {Place::kInput, 0}},
                 {DNNL_ARG_DST, md, {Place::kInput, 1}},
                 {DNNL_ARG_DIFF_SRC, md, {Place::kOutput, 0}}});
    return k;
  });
}

}  // namespace

std::unique_ptr<Kernel> make_softmax(const KernelSpec& s) {
  return make_softmax_like(s, dnnl::algorithm::softmax_accurate);
}

std::unique_ptr<Kernel> make_log_softmax(const KernelSpec& s) {
  return make_softmax_like(s, dnnl::algorithm::softmax_log);
}

// SoftmaxGrad(dY, Y): dX = Y * (dY - sum_axis(dY * Y)).
std::unique_ptr<Kernel> make_softmax_grad(const KernelSpec& s) {
  return make_softmax_grad_like(s, dnnl::algorithm::softmax_accurate);
}

// LogSoftmaxGrad(dY, Y): dX = dY - exp(Y) * sum_axis(dY).
std::unique_ptr<Kernel> make_log_softmax_grad(const KernelSpec& s) {
  return make_softmax_grad_like(s, dnnl::algorithm::softmax_log);
}

}  // namespace pt::cpu
