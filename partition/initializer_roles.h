// partition/initializer_roles.h: which of a model's initializers training updates (what `inspect`
// lists). In: an imported graph. Out: every floating-point initializer (Value::is_parameter) in
// the graph's order, then the buffers import set aside (Graph::buffers), each trained or not.
#pragma once

#include <string>
#include <vector>

#include "core/ir.h"

namespace pt {

// trained: a gradient reaches it from an output (gradient_reaches, partition/cost_model.h).
// Otherwise a buffer, `why` saying which kind: a BatchNormalization's running statistic, one
// read only where no gradient flows (a mask), or import's reason for a buffer it set aside.
struct InitializerRole {
  std::string name;
  bool trained = true;
  std::string why;
};
std::vector<InitializerRole> initializer_roles(const Graph& g);

}  // namespace pt
