// exec/cuda/cublas_api.h: cuBLAS and cuBLASLt, loaded by the first CUDA backend of a process.
// Linked at build time they would be mapped by every process the binary starts, `device: cpu`
// included, and cuBLASLt alone costs about 151 MiB of relocated code and data there: a CPU rank of
// a CUDA build would carry it beside its own stages. So the backend reaches them through this
// table, filled by dlopen and dlsym (the cuBLAS major version this build compiled against, found
// where the process's libcudart came from, else on the usual library path).
//
// Call sites name the library's own function through the table, macros included:
// `cublas_api().cublasCreate(&h)` reaches cublasCreate_v2, as the header's macro says.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>

namespace pt::cuda {

// The C entry points of the two GEMMs: the header adds C++ overloads of both (a cudaDataType
// compute type), so decltype cannot name them.
using CublasGemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                        const void*, const void*, cudaDataType, int, const void*, cudaDataType,
                                        int, const void*, void*, cudaDataType, int, cublasComputeType_t,
                                        cublasGemmAlgo_t);
using CublasGemmStridedBatchedEx =
    cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                       const void*, cudaDataType, int, long long, const void*, cudaDataType, int, long long,
                       const void*, void*, cudaDataType, int, long long, int, cublasComputeType_t, cublasGemmAlgo_t);

// X(symbol, type) for every entry point the backend calls.
#define PT_CUBLAS_ENTRY_POINTS(X)                                                              \
  X(cublasCreate_v2, decltype(&::cublasCreate_v2))                                             \
  X(cublasDestroy_v2, decltype(&::cublasDestroy_v2))                                           \
  X(cublasSetStream_v2, decltype(&::cublasSetStream_v2))                                       \
  X(cublasSetMathMode, decltype(&::cublasSetMathMode))                                         \
  X(cublasGemmEx, CublasGemmEx)                                                                \
  X(cublasGemmStridedBatchedEx, CublasGemmStridedBatchedEx)                                    \
  X(cublasLtCreate, decltype(&::cublasLtCreate))                                               \
  X(cublasLtDestroy, decltype(&::cublasLtDestroy))                                             \
  X(cublasLtMatmul, decltype(&::cublasLtMatmul))                                               \
  X(cublasLtMatmulAlgoGetHeuristic, decltype(&::cublasLtMatmulAlgoGetHeuristic))               \
  X(cublasLtMatmulDescCreate, decltype(&::cublasLtMatmulDescCreate))                           \
  X(cublasLtMatmulDescDestroy, decltype(&::cublasLtMatmulDescDestroy))                         \
  X(cublasLtMatmulDescSetAttribute, decltype(&::cublasLtMatmulDescSetAttribute))               \
  X(cublasLtMatmulPreferenceCreate, decltype(&::cublasLtMatmulPreferenceCreate))               \
  X(cublasLtMatmulPreferenceDestroy, decltype(&::cublasLtMatmulPreferenceDestroy))             \
  X(cublasLtMatmulPreferenceSetAttribute, decltype(&::cublasLtMatmulPreferenceSetAttribute))   \
  X(cublasLtMatrixLayoutCreate, decltype(&::cublasLtMatrixLayoutCreate))                       \
  X(cublasLtMatrixLayoutDestroy, decltype(&::cublasLtMatrixLayoutDestroy))

struct CublasApi {
#define PT_CUBLAS_FIELD(symbol, type) type symbol = nullptr;
  PT_CUBLAS_ENTRY_POINTS(PT_CUBLAS_FIELD)
#undef PT_CUBLAS_FIELD
};

// The table, the libraries loaded on the first call (thread-safe). A library that does not load or
// lacks an entry point is a UserError naming the file and the loader's reason.
const CublasApi& cublas_api();

// Whether this process has loaded them (the tests' check that a CPU run does not).
bool cublas_loaded();

}  // namespace pt::cuda
