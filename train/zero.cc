#include "train/zero.h"

#include <algorithm>
#include <cstddef>

namespace pt {

std::vector<int> zero_shards(const std::vector<OptimizerParam>& params, int replicas) {
  int64_t total = 0, before = 0;
  for (const OptimizerParam& p : params) total += p.value->type.bytes();
  std::vector<int> shard;
  for (const OptimizerParam& p : params) {
    const int64_t mid = 2 * before + p.value->type.bytes();  // twice the tensor's middle byte
    shard.push_back(total ? static_cast<int>(std::min<int64_t>(replicas - 1, mid * replicas / (2 * total))) : 0);
    before += p.value->type.bytes();
  }
  return shard;
}

void reduce_scatter_gradients(const std::vector<OptimizerParam>& params, const std::vector<int>& shard_of,
                              const std::vector<ParameterSites>& sites, std::map<std::string, Tensor>& grads,
                              const TrainRanks& ranks) {
  std::map<std::string, std::vector<std::string>> copies;
  for (const ParameterSites& site : sites) copies[site.parameter] = site.copies;
  std::vector<size_t> counts(static_cast<size_t>(ranks.replicas()), 0);
  std::vector<Tensor*> order;
  for (size_t i = 0; i < params.size(); ++i) {
    std::vector<std::string> names = {params[i].name};
    if (copies.count(names[0])) names.insert(names.end(), copies[names[0]].begin(), copies[names[0]].end());
    for (const std::string& n : names) {
      auto it = grads.find(n);
      if (it == grads.end()) continue;  // no gradient reaches it: the same on every replica
      order.push_back(&it->second);
      counts[static_cast<size_t>(shard_of[i])] += static_cast<size_t>(it->second.type.numel());
    }
  }
  std::vector<float> packed;
  for (const Tensor* g : order) packed.insert(packed.end(), g->as<float>(), g->as<float>() + g->type.numel());
  ranks.sum_shard_in_replica_order(packed.data(), counts);
  size_t at = 0;
  for (Tensor* g : order) {
    std::copy_n(packed.data() + at, g->type.numel(), g->as<float>());
    at += static_cast<size_t>(g->type.numel());
  }
}

double sharded_squared_norm(const std::vector<OptimizerParam>& params, const std::vector<int>& shard_of,
                            const std::map<std::string, Tensor>& grads, const TrainRanks& ranks) {
  std::vector<bool> mine;
  for (int k : shard_of) mine.push_back(k == ranks.replica());
  std::vector<double> terms = Optimizer::squares(params, grads, mine);
  ranks.sum(terms, Over::kPosition);  // each term from its shard's replica, zeros elsewhere: exact
  return Optimizer::sum_in_order(terms);
}

void gather_parameter_shards(const std::vector<OptimizerParam>& params, const std::vector<int>& shard_of,
                             const TrainRanks& ranks) {
  std::vector<size_t> bytes(static_cast<size_t>(ranks.replicas()), 0);
  std::vector<std::byte> packed;
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& t = *params[i].value;
    bytes[static_cast<size_t>(shard_of[i])] += t.data.size();
    packed.insert(packed.end(), t.data.begin(), t.data.end());
  }
  ranks.gather_shards(packed.data(), bytes);
  size_t at = 0;
  for (const OptimizerParam& p : params) {
    std::copy_n(packed.data() + at, p.value->data.size(), p.value->data.data());
    at += p.value->data.size();
  }
}

}  // namespace pt
