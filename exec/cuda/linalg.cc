// exec/cuda/linalg.cc: MatMul and Gemm on cuBLAS. Row-major Y = A @ B is column-major
// Y^T = B^T @ A^T, so every call passes B first. MatMul is one strided-batched GEMM (a batch
// stride of 0 broadcasts an operand), or one GEMM per batch when the batch dims broadcast
// partially; Gemm with a row bias (torch's Linear) runs on cublasLt with the bias epilogue, any
// other C is broadcast into Y and added with beta. Precision::kBf16 and kFp16 run the products on
// 16-bit copies of the operands (HalfCopies below) with fp32 accumulation.
#include <algorithm>
#include <array>
#include <limits>
#include <optional>
#include <vector>

#include "exec/cuda/cublas_api.h"
#include "exec/cuda/cuda_check.h"
#include "exec/cuda/cuda_kernels.h"
#include "exec/cuda/cudnn_util.h"
#include "exec/cuda/launch.h"
#include "exec/cuda/plan.h"

namespace pt::cuda {
namespace {

// In bf16 and fp16 modes the GEMM operands are rounded by the backend into 16-bit copies in the
// kernel's scratch, and cuBLAS multiplies those with fp32 accumulation: the products see exactly
// bf16 or fp16 inputs. (cuBLAS's CUBLAS_COMPUTE_32F_FAST_16BF and _FAST_16F on fp32 operands,
// which this backend used before, left the inputs unrounded on an H200: a permission, not a
// rounding.) Elements of our A (input 0) and B (input 1); none in fp32 mode.
struct HalfCopies {
  bool bf16 = true;
  int64_t a = 0, b = 0;
  size_t a_at = 0, b_at = 0;
  bool on() const { return a > 0; }
  cudaDataType_t type() const { return !on() ? CUDA_R_32F : bf16 ? CUDA_R_16BF : CUDA_R_16F; }
};

HalfCopies half_copies(const KernelSpec& s, const CudaContext& ctx, ScratchLayout& layout) {
  HalfCopies h;
  if (!half_products(ctx.precision)) return h;
  h.bf16 = ctx.precision == Precision::kBf16;
  h.a = s.inputs[0].numel(), h.b = s.inputs[1].numel();
  h.a_at = layout.reserve(sizeof(uint16_t) * static_cast<size_t>(h.a));
  h.b_at = layout.reserve(sizeof(uint16_t) * static_cast<size_t>(h.b));
  return h;
}

// The operands as the GEMM reads them (our A and B): fp32 as they are, or their 16-bit copies.
struct Operands {
  const void* a;
  const void* b;
  cudaDataType_t type;
};
Operands operands(const HalfCopies& h, Args in, void* scratch, cudaStream_t stream) {
  if (!h.on()) return {in[0].data, in[1].data, h.type()};
  std::byte* base = ScratchLayout::base(scratch);
  launch_to_half(in[0].as<const float>(), base + h.a_at, h.a, h.bf16, stream);
  launch_to_half(in[1].as<const float>(), base + h.b_at, h.b, h.bf16, stream);
  return {base + h.a_at, base + h.b_at, h.type()};
}

// One column-major GEMM call (cuBLAS's view): C (m x n) = alpha * op(A) op(B) + beta * C,
// repeated over `batch` matrices `stride_*` elements apart, plus extra (A, B, C) element
// offsets for the partially broadcast case (one call per entry).
struct GemmCall {
  cublasOperation_t op_a = CUBLAS_OP_N, op_b = CUBLAS_OP_N;
  int m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  long long stride_a = 0, stride_b = 0, stride_c = 0;
  int batch = 1;
  std::vector<std::array<int64_t, 3>> offsets;  // empty: one strided-batched call
};

// cuBLAS's A and B are our B and A (column-major view), both of `type`; C is fp32.
void gemm(const CudaContext& ctx, const GemmCall& g, float alpha, float beta, const Operands& ours, float* c) {
  const void *a = ours.b, *b = ours.a;
  if (g.offsets.empty()) {
    PT_CUBLAS_CHECK(cublas_api().cublasGemmStridedBatchedEx(
        ctx.cublas, g.op_a, g.op_b, g.m, g.n, g.k, &alpha, a, ours.type, g.lda, g.stride_a, b, ours.type, g.ldb,
        g.stride_b, &beta, c, CUDA_R_32F, g.ldc, g.stride_c, g.batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return;
  }
  const size_t esize = ours.type == CUDA_R_32F ? sizeof(float) : sizeof(uint16_t);
  const auto at = [esize](const void* p, int64_t offset) {
    return static_cast<const void*>(static_cast<const std::byte*>(p) + offset * static_cast<int64_t>(esize));
  };
  for (const auto& [oa, ob, oc] : g.offsets)
    PT_CUBLAS_CHECK(cublas_api().cublasGemmEx(ctx.cublas, g.op_a, g.op_b, g.m, g.n, g.k, &alpha, at(a, oa), ours.type,
                                              g.lda, at(b, ob), ours.type, g.ldb, &beta, c + oc, CUDA_R_32F, g.ldc,
                                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

bool fits_int(int64_t v) { return v > 0 && v <= std::numeric_limits<int>::max(); }

// Numpy matmul (matmul_geometry, as the CPU's): a 2-D B folds A's batch dims into its rows,
// otherwise batch dims broadcast.
std::optional<GemmCall> plan_matmul(const Dims& a0, const Dims& b0, const Dims& y0) {
  const auto geometry = matmul_geometry(a0, b0, y0);
  if (!geometry) return std::nullopt;
  const Dims &a = geometry->a, &b = geometry->b, &batch = geometry->batch;
  const int64_t m = geometry->m, n = geometry->n, k = geometry->k;
  const size_t r = geometry->rank();

  GemmCall g;
  const int64_t rows = b0.size() <= 2 ? product(a, 0, r - 1) : m;  // A's batch folded into rows
  if (!fits_int(rows) || !fits_int(n) || !fits_int(k)) return std::nullopt;
  g.m = static_cast<int>(n);
  g.n = static_cast<int>(rows);
  g.k = static_cast<int>(k);
  g.lda = static_cast<int>(n);  // cuBLAS's A is our B (k x n row-major)
  g.ldb = static_cast<int>(k);  // cuBLAS's B is our A (rows x k row-major)
  g.ldc = static_cast<int>(n);
  if (b0.size() <= 2) return g;

  const int64_t count = product(batch, 0, batch.size());
  if (!fits_int(count)) return std::nullopt;
  g.batch = static_cast<int>(count);
  g.stride_c = m * n;
  const bool a_full = Dims(a.begin(), a.end() - 2) == batch;
  const bool b_full = Dims(b.begin(), b.end() - 2) == batch;
  const bool a_none = product(a, 0, r - 2) == 1, b_none = product(b, 0, r - 2) == 1;
  if ((a_full || a_none) && (b_full || b_none)) {
    g.stride_a = b_full ? k * n : 0;
    g.stride_b = a_full ? m * k : 0;
    return g;
  }
  // Partial broadcast: one call per batch index, offsets computed now.
  const Dims a_strides = strides_of(Dims(a.begin(), a.end() - 2));
  const Dims b_strides = strides_of(Dims(b.begin(), b.end() - 2));
  for (int64_t i = 0; i < count; ++i) {
    int64_t rest = i, oa = 0, ob = 0;
    for (size_t d = batch.size(); d-- > 0;) {
      const int64_t idx = rest % batch[d];
      rest /= batch[d];
      if (a[d] != 1) oa += idx * a_strides[d];
      if (b[d] != 1) ob += idx * b_strides[d];
    }
    g.offsets.push_back({ob * k * n, oa * m * k, i * m * n});
  }
  return g;
}

// ---- Gemm on cublasLt with the bias epilogue ----

// Y = A' @ B' + bias (alpha = beta = 1, bias of N): one cublasLt matmul whose epilogue adds the
// bias; the algorithm is chosen now, its workspace is the kernel's scratch.
class LtBiasGemm final : public Kernel {
 public:
  static constexpr size_t kWorkspace = 4 << 20;

  LtBiasGemm(const CudaContext& ctx, const GemmCall& g, const KernelSpec& s) : ctx_(ctx) {
    const CublasApi& blas = cublas_api();
    half_ = half_copies(s, ctx, layout_);
    const cudaDataType_t ab = half_.type();
    PT_CUBLAS_CHECK(blas.cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    set(CUBLASLT_MATMUL_DESC_TRANSA, g.op_a);
    set(CUBLASLT_MATMUL_DESC_TRANSB, g.op_b);
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    set(CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue);
    const bool ta = g.op_a != CUBLAS_OP_N, tb = g.op_b != CUBLAS_OP_N;
    PT_CUBLAS_CHECK(blas.cublasLtMatrixLayoutCreate(&a_, ab, ta ? g.k : g.m, ta ? g.m : g.k, g.lda));
    PT_CUBLAS_CHECK(blas.cublasLtMatrixLayoutCreate(&b_, ab, tb ? g.n : g.k, tb ? g.k : g.n, g.ldb));
    PT_CUBLAS_CHECK(blas.cublasLtMatrixLayoutCreate(&c_, CUDA_R_32F, g.m, g.n, g.ldc));
    cublasLtMatmulPreference_t pref;
    PT_CUBLAS_CHECK(blas.cublasLtMatmulPreferenceCreate(&pref));
    const size_t ws = kWorkspace;
    PT_CUBLAS_CHECK(blas.cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    // Buffers are at least 64-byte aligned (arena offsets and the allocator's blocks).
    const uint32_t align = 64;
    for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      PT_CUBLAS_CHECK(blas.cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof align));
    int found = 0;
    cublasLtMatmulHeuristicResult_t result{};
    const cublasStatus_t st =
        blas.cublasLtMatmulAlgoGetHeuristic(ctx.cublas_lt, desc_, a_, b_, c_, c_, pref, 1, &result, &found);
    PT_CUBLAS_CHECK(blas.cublasLtMatmulPreferenceDestroy(pref));
    ok_ = st == CUBLAS_STATUS_SUCCESS && found > 0;
    if (ok_) {
      algo_ = result.algo;
      workspace_ = result.workspaceSize;
      workspace_at_ = layout_.reserve(workspace_);
    }
  }
  ~LtBiasGemm() override {
    cublas_api().cublasLtMatrixLayoutDestroy(a_);
    cublas_api().cublasLtMatrixLayoutDestroy(b_);
    cublas_api().cublasLtMatrixLayoutDestroy(c_);
    cublas_api().cublasLtMatmulDescDestroy(desc_);
  }
  bool ok() const { return ok_; }
  size_t scratch_bytes() const override { return layout_.bytes(); }

  // in: A, B, bias; out: Y.
  void run(std::span<const Buffer> in, std::span<const Buffer> out, void* scratch) override {
    const void* bias = in[2].data;
    set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
    const float one = 1.f, zero = 0.f;
    const Operands ours = operands(half_, in, scratch, ctx_.stream);
    void* ws = workspace_ ? ScratchLayout::base(scratch) + workspace_at_ : nullptr;
    PT_CUBLAS_CHECK(cublas_api().cublasLtMatmul(ctx_.cublas_lt, desc_, &one, ours.b, a_, ours.a, b_, &zero,
                                                out[0].data, c_, out[0].data, c_, &algo_, ws, workspace_,
                                                ctx_.stream));
  }

 private:
  template <class T>
  void set(cublasLtMatmulDescAttributes_t attr, const T& v) {
    PT_CUBLAS_CHECK(cublas_api().cublasLtMatmulDescSetAttribute(desc_, attr, &v, sizeof v));
  }

  const CudaContext& ctx_;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, c_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
  ScratchLayout layout_;
  HalfCopies half_;
  size_t workspace_ = 0, workspace_at_ = 0;
  bool ok_ = false;
};

}  // namespace

std::unique_ptr<Kernel> make_matmul(const KernelSpec& s, CudaContext& ctx) {
  if (s.inputs.size() != 2 || s.outputs.size() != 1 || !has_io(s, 2) || !float_io(s))
    return nullptr;
  const auto g = plan_matmul(s.inputs[0].shape, s.inputs[1].shape, s.outputs[0].shape);
  if (!g) return nullptr;
  const CudaContext* c = &ctx;
  ScratchLayout layout;
  const HalfCopies h = half_copies(s, ctx, layout);
  return fn_kernel(
      [c, g = *g, h](Args in, Args out, void* scratch) {
        gemm(*c, g, 1.f, 0.f, operands(h, in, scratch, c->stream), out[0].as<float>());
      },
      layout.bytes());
}

// Gemm: Y = alpha * A' @ B' + beta * C, A' = transA ? A^T : A (M, K), B' likewise (K, N), C
// unidirectionally broadcast to (M, N).
std::unique_ptr<Kernel> make_gemm(const KernelSpec& s, CudaContext& ctx) {
  if (s.inputs.size() < 2 || s.outputs.size() != 1 || !has_io(s, 2) || !float_io(s))
    return nullptr;
  const auto gg = gemm_geometry(s);
  if (!gg) return nullptr;
  const int64_t m = gg->m, n = gg->n, k = gg->k;
  if (!fits_int(m) || !fits_int(n) || !fits_int(k)) return nullptr;
  GemmCall g;
  g.op_a = gg->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLAS's A is our B'
  g.op_b = gg->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  g.m = static_cast<int>(n);
  g.n = static_cast<int>(m);
  g.k = static_cast<int>(k);
  g.lda = static_cast<int>(s.inputs[1].shape[1]);  // row length of B as stored
  g.ldb = static_cast<int>(s.inputs[0].shape[1]);
  g.ldc = static_cast<int>(n);
  const float alpha = gg->alpha, beta = gg->beta;
  const CudaContext* c = &ctx;
  ScratchLayout layout;
  const HalfCopies h = half_copies(s, ctx, layout);
  if (beta == 0.f)
    return fn_kernel(
        [c, g, alpha, h](Args in, Args out, void* scratch) {
          gemm(*c, g, alpha, 0.f, operands(h, in, scratch, c->stream), out[0].as<float>());
        },
        layout.bytes());

  if (gg->row_bias()) {
    auto lt = std::make_unique<LtBiasGemm>(ctx, g, s);
    if (lt->ok()) return lt;
  }
  const int64_t rows = gg->c_rows, cols = gg->c_cols;
  return fn_kernel(
      [c, g, alpha, beta, m, n, rows, cols, h](Args in, Args out, void* scratch) {
        launch_broadcast_matrix(m, n, rows, cols, in[2].as<const float>(), out[0].as<float>(), c->stream);
        gemm(*c, g, alpha, beta, operands(h, in, scratch, c->stream), out[0].as<float>());
      },
      layout.bytes());
}

}  // namespace pt::cuda
