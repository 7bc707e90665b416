// tests/exec/cuda/kernel_cases.h: the one-node cases every CUDA kernel is compared on against
// the CPU kernel (cuda_kernels_test.cc), at least one per op the CUDA registry lists
// (exec/kernel_registry.h), covering the paths each factory takes (cuDNN or custom, strided
// batch or per-batch GEMM, constant or fed operands, omitted outputs). Inputs are generated from
// a fixed seed per case, so both backends see the same bytes.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/ir.h"
#include "tests/exec/one_node.h"

namespace pt::testing {

// One node input: generated data (fed at run time, or an initializer), or omitted.
struct CaseInput {
  TensorType type;
  enum Kind { kUniform, kInts, kValues } kind = kUniform;
  double lo = -1, hi = 1;       // kUniform: uniform in [lo, hi); kInts: integers in [lo, hi]
  std::vector<double> values;   // kValues: the elements
  bool constant = false;
  bool omitted = false;
};

struct KernelCase {
  std::string name;    // a unique test name: Op_What
  std::string op;
  std::string domain;  // "", "pipetrain" or "com.microsoft"
  std::vector<CaseInput> inputs;
  std::vector<TensorType> outputs;  // dtype kUndefined: omitted
  std::map<std::string, AttrValue> attrs;
  // Floats agree when |cuda - cpu| <= tol * (|cpu| + max |cpu| over the output); integers and
  // booleans exactly.
  double tol = 1e-4;

  // "Op" or "domain::Op", as the registries key it.
  std::string key() const { return domain.empty() ? op : domain + "::" + op; }
};

std::vector<KernelCase> kernel_cases();
// FusedAttention and its gradient for cuDNN's 16-bit path (CudaBackend in Precision::kBf16 or
// kFp16), each with its bf16 tolerance.
std::vector<KernelCase> half_attention_cases();

// The node, with its inputs, as a one-node graph (tests/exec/one_node.h; opset 17 for the ONNX
// domain), and the data fed to it (graph-input order).
OneNode build_case(const KernelCase& c, unsigned seed);

}  // namespace pt::testing
