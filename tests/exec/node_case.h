// tests/exec/node_case.h: runs one of ONNX's backend node tests
// (/usr/share/libonnx-testdata/data/node/<case>/) on one CPU kernel and compares its outputs with
// the reference outputs stored beside it. Shared by the kernel tests of every op family.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "exec/kernel.h"

namespace pt::testing {

constexpr const char* kNodeTestRoot = "/usr/share/libonnx-testdata/data/node";
// The folder of node cases to run: $PT_NODE_TEST_ROOT (e.g. the newer cases that
// tests/oracle/make_node_cases.py writes from the onnx package) or kNodeTestRoot.
std::string node_test_root();

struct NodeCaseResult {
  enum Kind { kPassed, kFailed, kSkipped } kind = kSkipped;
  std::string message;  // why it failed or was skipped
};

// Loads the case, makes the inputs an op reads at compile time (shapes, axes, pads) constant,
// raises an unchanged op's opset to the supported range, imports it, builds the kernel with
// `factory` (2 threads) and runs it. Outputs must match within |a-b| <= 1e-6 + 1e-4*|b|
// (exactly for integers and bools).
NodeCaseResult run_node_case(const std::string& case_name, KernelFactory factory);

// Case directory names beginning with `prefix` ("test_matmul"), sorted.
std::vector<std::string> node_cases(const std::string& prefix);

// One conformance case and the kernel factory that runs it.
struct NodeCase {
  std::string name;
  KernelFactory factory;
};
void PrintTo(const NodeCase& c, std::ostream* os);

// The single-node cases of one op: `prefix` itself or `prefix_...` (so "test_neg" leaves out
// "test_negative_log_likelihood_loss" and "test_cast" leaves out "test_castlike_..."), less the
// `_expanded` forms (graphs of other ops) and names containing any of `excluded`.
std::vector<NodeCase> op_cases(const std::string& prefix, KernelFactory factory,
                               const std::vector<std::string>& excluded = {});

// How many of `cases` pass: each suite asserts a floor per op, so skips cannot make it pass.
int count_passed(const std::vector<NodeCase>& cases);

// n values of scale * sin(0.37 i): smooth, signed, without repeats (hand-made kernel inputs).
std::vector<float> wave(int64_t n, float scale);

// Every element within 1e-4 + 1e-4 |want| (float kernels against double references); a gtest
// assertion failure names the first element off.
void expect_near_all(const std::vector<float>& have, const std::vector<float>& want);

}  // namespace pt::testing
