// autodiff/parameter_sites.h: a parameter read by several nodes (a tie such as GPT-2's token
// embedding and LM head, or initializers an exporter merged) gets one copy per further reading
// node, sharing its data. Each reading site then accumulates its own gradient over the
// micro-batches, wherever the partition puts it, and the trainer adds the sites up in node order
// before the update (sum_sites), so the sum's association no longer depends on how the graph is
// cut: every stage count and schedule gives the one-stage run's bits. In: the training graph and
// the parameters to leave alone (frozen). Out: the graph rewired, and the groups it made.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/ir.h"

namespace pt {

struct ParameterSites {
  std::string parameter;            // the parameter, read by its first site
  std::vector<std::string> copies;  // "<parameter>@site<k>", read by site k = 1, 2, ... in node order
};

std::vector<ParameterSites> split_parameter_sites(Graph& g, const std::vector<std::string>& frozen);

// grads[parameter] = ((grads[parameter] + grads[copy 1]) + grads[copy 2]) ..., for each group.
void sum_sites(const std::vector<ParameterSites>& sites, std::map<std::string, Tensor>& grads);

}  // namespace pt
