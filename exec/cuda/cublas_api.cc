#include "exec/cuda/cublas_api.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <atomic>
#include <mutex>
#include <string>

#include "core/error.h"

namespace pt::cuda {
namespace {

std::atomic<bool> loaded{false};

// The folder of the libcudart this process runs on ("" when the loader does not say): cuBLAS ships
// beside it in every CUDA toolkit and wheel layout.
std::string cudart_folder() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&cudaGetDeviceCount), &info) == 0 || !info.dli_fname) return "";
  const std::string path = info.dli_fname;
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash + 1);
}

void* open_library(const std::string& name) {
  const std::string beside = cudart_folder();
  if (!beside.empty())
    if (void* h = dlopen((beside + name).c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
  if (void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
  const char* why = dlerror();
  throw UserError("device: cuda", "cannot load " + name + " (" + (why ? why : "not found") + ")",
                  "install cuBLAS " + std::to_string(CUBLAS_VER_MAJOR) +
                      " beside libcudart, or put its folder on LD_LIBRARY_PATH");
}

CublasApi load() {
  // cuBLASLt first: cuBLAS needs it, and finds the copy already loaded.
  const std::string version = ".so." + std::to_string(CUBLAS_VER_MAJOR);
  void* lt = open_library("libcublasLt" + version);
  void* blas = open_library("libcublas" + version);
  CublasApi api;
  auto find = [&](const char* symbol) {
    void* f = dlsym(blas, symbol);
    if (!f) f = dlsym(lt, symbol);
    if (!f)
      throw UserError("device: cuda", std::string("cuBLAS ") + std::to_string(CUBLAS_VER_MAJOR) +
                                          " has no " + symbol,
                      "install the cuBLAS this build was compiled against (CUDA " +
                          std::to_string(CUBLAS_VER_MAJOR) + ")");
    return f;
  };
#define PT_CUBLAS_FIND(symbol, type) api.symbol = reinterpret_cast<decltype(api.symbol)>(find(#symbol));
  PT_CUBLAS_ENTRY_POINTS(PT_CUBLAS_FIND)
#undef PT_CUBLAS_FIND
  return api;
}

}  // namespace

const CublasApi& cublas_api() {
  static std::once_flag once;  // a throwing load leaves it unset: the next backend tries again
  static CublasApi api;
  std::call_once(once, [] {
    api = load();
    loaded.store(true, std::memory_order_release);
  });
  return api;
}

bool cublas_loaded() { return loaded.load(std::memory_order_acquire); }

}  // namespace pt::cuda
