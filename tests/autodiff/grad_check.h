// tests/autodiff/grad_check.h: finite-difference checks of gradient rules on small graphs.
//
// A case is a forward Graph built with GraphMaker. check_gradients() builds its F, B and W graphs
// (no loss: B receives a fixed random gradient R per output), runs them on the CPU backend, and
// compares every input and parameter gradient with central differences of
//   f(x) = sum over outputs of <R, Y(x)>
// computed with the forward kernels in float32 and summed in double.
//
// Tolerance: with step h, central differences err by about h^2/6 |f'''| (truncation) plus
// u |f| / h (rounding, u = 6e-8 for float32 results summed in double). With h = 1e-2 and O(1)
// values both stay below ~2e-4; a gradient passes when |fd - g| <= 2e-3 (1 + |g|), ten times that.
// Inputs of kinked ops (Relu, Clip, MaxPool) are drawn at least 2h away from every kink.
#pragma once

#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "autodiff/backward.h"
#include "core/ir.h"

namespace pt::test {

using Filler = std::function<float(std::mt19937&)>;

// Uniform in [lo, hi], skipping (-gap, gap) when gap > 0.
Filler uniform(float lo, float hi, float gap = 0);

class GraphMaker {
 public:
  GraphMaker();
  ValueId input(const std::string& name, const std::vector<int64_t>& shape, Filler fill = {});
  ValueId int_input(const std::string& name, const std::vector<int64_t>& shape,
                    std::vector<int64_t> data);
  ValueId param(const std::string& name, const std::vector<int64_t>& shape, Filler fill = {});
  ValueId ints(const std::vector<int64_t>& data);      // constant int64 [n]
  ValueId floats(const std::vector<int64_t>& shape, const std::vector<float>& data);  // constant
  ValueId bools(const std::vector<int64_t>& shape, const std::vector<bool>& data);    // constant
  ValueId op(const std::string& op, std::vector<ValueId> inputs, const std::vector<int64_t>& shape,
             std::map<std::string, AttrValue> attrs = {}, const std::string& domain = "");
  std::vector<ValueId> op_n(const std::string& op, std::vector<ValueId> inputs,
                            const std::vector<TensorType>& outs,
                            std::map<std::string, AttrValue> attrs = {});
  void output(ValueId v) { g.outputs.push_back(v); }

  Graph g;
  std::map<std::string, Tensor> feeds;  // data of every graph input
  std::mt19937 rng{1234};

 private:
  int counter_ = 0;
};

struct CheckResult {
  int checked = 0;        // gradient elements compared
  double worst = 0;       // largest |fd - g| / (1 + |g|)
  std::string worst_at;   // "grad.x[3]"
};

// Runs the check; fails the current test (gtest) on a mismatch and returns the tally.
CheckResult check_gradients(GraphMaker& m, const std::string& loss_output = "");

}  // namespace pt::test
