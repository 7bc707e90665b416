// exec/cuda/linalg.cc: MatMul and Gemm on cuBLAS. Row-major Y = A @ B is column-major
// Y^T = B^T @ A^T, so every call passes B first. MatMul is one strided-batched GEMM (a batch
// stride of 0 broadcasts an operand), or one GEMM per batch when the batch dims broadcast
// partially; Gemm with a row bias (torch's Linear) runs on cublasLt with the bias epilogue, any
// other C is broadcast into Y and added with beta. Precision::kBf16 runs the products on bf16
// tensor cores with fp32 accumulation (CUBLAS_COMPUTE_32F_FAST_16BF).
#include <algorithm>
#include <array>
#include <limits>
#include <optional>
#include <vector>

#include "exec/cuda/cublas_api.h"
#include "exec/cuda/cuda_check.h"
#include "exec/cuda/cuda_kernels.h"
#include "exec/cuda/plan.h"

namespace pt::cuda {
namespace {

cublasComputeType_t compute_type(const CudaContext& ctx) {
  return ctx.precision == Precision::kBf16 ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F;
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

void gemm(const CudaContext& ctx, const GemmCall& g, float alpha, float beta, const float* a,
          const float* b, float* c) {
  const cublasComputeType_t ct = compute_type(ctx);
  if (g.offsets.empty()) {
    PT_CUBLAS_CHECK(cublas_api().cublasGemmStridedBatchedEx(
        ctx.cublas, g.op_a, g.op_b, g.m, g.n, g.k, &alpha, a, CUDA_R_32F, g.lda, g.stride_a, b,
        CUDA_R_32F, g.ldb, g.stride_b, &beta, c, CUDA_R_32F, g.ldc, g.stride_c, g.batch, ct,
        CUBLAS_GEMM_DEFAULT));
    return;
  }
  for (const auto& [oa, ob, oc] : g.offsets)
    PT_CUBLAS_CHECK(cublas_api().cublasGemmEx(ctx.cublas, g.op_a, g.op_b, g.m, g.n, g.k, &alpha, a + oa,
                                              CUDA_R_32F, g.lda, b + ob, CUDA_R_32F, g.ldb, &beta, c + oc,
                                              CUDA_R_32F, g.ldc, ct, CUBLAS_GEMM_DEFAULT));
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
  static constexpr size_t kAlign = 256;

  LtBiasGemm(const CudaContext& ctx, const GemmCall& g) : ctx_(ctx) {
    const CublasApi& blas = cublas_api();
    PT_CUBLAS_CHECK(blas.cublasLtMatmulDescCreate(&desc_, compute_type(ctx), CUDA_R_32F));
    set(CUBLASLT_MATMUL_DESC_TRANSA, g.op_a);
    set(CUBLASLT_MATMUL_DESC_TRANSB, g.op_b);
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    set(CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue);
    const bool ta = g.op_a != CUBLAS_OP_N, tb = g.op_b != CUBLAS_OP_N;
    PT_CUBLAS_CHECK(blas.cublasLtMatrixLayoutCreate(&a_, CUDA_R_32F, ta ? g.k : g.m, ta ? g.m : g.k, g.lda));
    PT_CUBLAS_CHECK(blas.cublasLtMatrixLayoutCreate(&b_, CUDA_R_32F, tb ? g.n : g.k, tb ? g.k : g.n, g.ldb));
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
    }
  }
  ~LtBiasGemm() override {
    cublas_api().cublasLtMatrixLayoutDestroy(a_);
    cublas_api().cublasLtMatrixLayoutDestroy(b_);
    cublas_api().cublasLtMatrixLayoutDestroy(c_);
    cublas_api().cublasLtMatmulDescDestroy(desc_);
  }
  bool ok() const { return ok_; }
  size_t scratch_bytes() const override { return workspace_ ? workspace_ + kAlign : 0; }

  // in: A, B, bias; out: Y.
  void run(std::span<const Buffer> in, std::span<const Buffer> out, void* scratch) override {
    const void* bias = in[2].data;
    set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
    const float one = 1.f, zero = 0.f;
    const auto p = reinterpret_cast<uintptr_t>(scratch);
    void* ws = workspace_ ? reinterpret_cast<void*>((p + kAlign - 1) / kAlign * kAlign) : nullptr;
    PT_CUBLAS_CHECK(cublas_api().cublasLtMatmul(ctx_.cublas_lt, desc_, &one, in[1].data, a_, in[0].data, b_,
                                                &zero, out[0].data, c_, out[0].data, c_, &algo_, ws,
                                                workspace_, ctx_.stream));
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
  size_t workspace_ = 0;
  bool ok_ = false;
};

}  // namespace

std::unique_ptr<Kernel> make_matmul(const KernelSpec& s, CudaContext& ctx) {
  if (s.inputs.size() != 2 || s.outputs.size() != 1 || !has_io(s, 2) || !float_io(s))
    return nullptr;
  const auto g = plan_matmul(s.inputs[0].shape, s.inputs[1].shape, s.outputs[0].shape);
  if (!g) return nullptr;
  const CudaContext* c = &ctx;
  return fn_kernel([c, g = *g](Args in, Args out, void*) {
    gemm(*c, g, 1.f, 0.f, in[1].as<const float>(), in[0].as<const float>(), out[0].as<float>());
  });
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
  if (beta == 0.f)
    return fn_kernel([c, g, alpha](Args in, Args out, void*) {
      gemm(*c, g, alpha, 0.f, in[1].as<const float>(), in[0].as<const float>(), out[0].as<float>());
    });

  if (gg->row_bias()) {
    auto lt = std::make_unique<LtBiasGemm>(ctx, g);
    if (lt->ok()) return lt;
  }
  const int64_t rows = gg->c_rows, cols = gg->c_cols;
  return fn_kernel([c, g, alpha, beta, m, n, rows, cols](Args in, Args out, void*) {
    launch_broadcast_matrix(m, n, rows, cols, in[2].as<const float>(), out[0].as<float>(),
                            c->stream);
    gemm(*c, g, alpha, beta, in[1].as<const float>(), in[0].as<const float>(), out[0].as<float>());
  });
}

}  // namespace pt::cuda
