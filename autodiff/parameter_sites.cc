#include "autodiff/parameter_sites.h"

#include <algorithm>

#include "core/error.h"

namespace pt {

std::vector<ParameterSites> split_parameter_sites(Graph& g, const std::vector<std::string>& frozen) {
  g.rebuild_uses();
  std::vector<ParameterSites> out;
  const std::vector<ValueId> params = g.initializers;
  for (ValueId v : params) {
    const Value& p = g.value(v);
    if (!p.is_parameter() || std::count(frozen.begin(), frozen.end(), p.name)) continue;
    std::vector<int> readers = p.consumers;  // node indices
    std::sort(readers.begin(), readers.end());
    readers.erase(std::unique(readers.begin(), readers.end()), readers.end());
    if (readers.size() < 2) continue;
    ParameterSites s{p.name, {}};
    const std::shared_ptr<const Tensor> data = p.init;
    for (size_t k = 1; k < readers.size(); ++k) {
      const std::string name = s.parameter + "@site" + std::to_string(k);
      PT_CHECK(g.find(name) == kNoValue, "'" + name + "' already names a value");
      const ValueId copy = g.add_initializer(name, data);
      for (ValueId& in : g.nodes[static_cast<size_t>(readers[k])].inputs)
        if (in == v) in = copy;
      s.copies.push_back(name);
    }
    out.push_back(std::move(s));
  }
  g.rebuild_uses();
  return out;
}

void sum_sites(const std::vector<ParameterSites>& sites, std::map<std::string, Tensor>& grads) {
  for (const ParameterSites& s : sites) {
    auto total = grads.find(s.parameter);
    if (total == grads.end()) continue;  // no gradient reaches it
    PT_CHECK(total->second.type.dtype == DType::kFloat32, "'" + s.parameter + "' is not float32");
    float* sum = total->second.as<float>();
    const int64_t n = total->second.type.numel();
    for (const std::string& c : s.copies) {
      auto part = grads.find(c);
      if (part == grads.end()) continue;
      PT_CHECK(part->second.type == total->second.type, "'" + c + "' has another type than its parameter");
      const float* add = part->second.as<float>();
      for (int64_t i = 0; i < n; ++i) sum[i] += add[i];
    }
  }
}

}  // namespace pt
