// tests/autodiff/portable_cases.h: one-node graphs of every pipetrain-domain op
// (core/pipetrain_ops.h), a few attribute cases each, with random inputs. Shared by the
// structural test of lower_to_standard (portable_test.cc) and the tool that writes the cases for
// the onnxruntime oracle (portable_cases_main.cc, tests/oracle/portable_ops.py).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "core/ir.h"

namespace pt {

struct PortableCase {
  std::string name;  // "conv_grad_input.depthwise"
  std::string op;    // op type in the pipetrain domain
  std::map<std::string, AttrValue> attrs;
  // Fed at run time, in order; an empty name marks an omitted optional input.
  std::vector<std::pair<std::string, Tensor>> inputs;
  // Node outputs in order; an undefined dtype marks an omitted optional output.
  std::vector<std::pair<std::string, TensorType>> outputs;
};

std::vector<PortableCase> portable_cases();

// The case's node in a graph of its own: every present input a graph input, every present output
// a graph output; opsets {"": 17, "pipetrain": 1}.
Graph case_graph(const PortableCase& c);

}  // namespace pt
